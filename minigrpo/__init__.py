"""minigrpo: a from-scratch, pure-PyTorch GRPO trainer for reinforcement learning from verifiable rewards."""

from .checkpoint import CheckpointError, load_pretrained, save_pretrained
from .qwen3 import ConfigError, KVCache, Qwen3, Qwen3Config
from .sampler import Samples, SamplingConfig, generate
from .tokenizer import Tokenizer

__all__ = [
    "CheckpointError",
    "ConfigError",
    "KVCache",
    "Qwen3",
    "Qwen3Config",
    "Samples",
    "SamplingConfig",
    "Tokenizer",
    "generate",
    "load_pretrained",
    "save_pretrained",
]
__version__ = "0.1.0"
