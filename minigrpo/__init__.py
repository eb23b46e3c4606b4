"""minigrpo: a from-scratch, pure-PyTorch GRPO trainer for reinforcement learning from verifiable rewards.

Names are imported on first use, so that `import minigrpo.verifier` (pure Python + sympy, also run
in the verifier's worker processes) never pays for importing torch.
"""

import importlib
import importlib.util

_EXPORTS = {
    "CheckpointError": "model",
    "load_pretrained": "model",
    "save_pretrained": "model",
    "ConfigError": "model",
    "KVCache": "model",
    "Qwen3": "model",
    "Qwen3Config": "model",
    "Samples": "rollout",
    "SamplingConfig": "config",
    "generate": "rollout",
    "Tokenizer": "model",
    "ToolRunner": "tools",
    "register_tool": "tools",
    "group_advantages": "update",
    "grpo_loss": "update",
    "GRPOConfig": "config",
    "TrainConfig": "config",
    "Task": "tasks",
    "Trainer": "run",
    "train": "run",
    "RewardSpec": "verifier",
    "extract_answer": "verifier",
    "is_equivalent": "verifier",
    "math_reward": "verifier",
    "math_rewards": "verifier",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _EXPORTS:
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: minigrpo.weights, ...
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'minigrpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
