"""Tiny checkpoints and tokenizers built in temporary directories (tests never read ../shared), and a
directory's every file read back (`tree`), to show a refused command changed nothing."""

import json
import os
import subprocess
import sys

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import minigrpo
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

TINY = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=5000.0,
)

# Random tiny shapes covering what the decoder must get right.
CONFIGS = {
    "untied-gqa": dict(TINY),
    "tied-gqa": dict(TINY, tie_word_embeddings=True),
    "mha-headdim": dict(TINY, num_key_value_heads=4, head_dim=24),  # head_dim != hidden / heads
    "mqa-bias": dict(TINY, num_attention_heads=6, num_key_value_heads=1, head_dim=8, attention_bias=True),
}


def addition_rows(a: int = 4, b: int = 3) -> list[dict]:
    """A task's rows: "What is x + y?" for every x < a and y < b, with the sum as the answer."""
    return [{"prompt": f"What is {x} + {y}?", "answer": str(x + y)} for x in range(a) for y in range(b)]


ROWS = addition_rows()  # the trainer tests' task: 12 problems
VOWELS = "test_vowels"  # the tests' reward, registered once below


def vowel_share(completions, **_):
    """A reward a random policy earns unevenly, in [0, 1]: the share of a completion's characters that
    are vowels, so every step has signal and moves the weights."""
    return [sum(c.count(ch) for ch in "aeiou") / max(len(c), 1) for c in completions]


def x_or_vowel_share(completions, **_):
    """vowel_share with 'x' counted too: the trainer and distillation tests' reward, test_count_x."""
    return [sum(c.count(ch) for ch in "xaeiou") / max(len(c), 1) for c in completions]


for _name, _reward in ((VOWELS, vowel_share), ("test_count_x", x_or_vowel_share)):
    if _name not in REWARD_FUNCTIONS:
        register_reward(_name)(_reward)


def tiny_train_config(output_dir, /, **settings) -> minigrpo.TrainConfig:
    """The tests' TrainConfig: quiet (no bar, no completions printed), 2 steps of 8 completions in
    micro-batches of 4, a learning rate of 1e-2 so that a step visibly moves a tiny model; `settings`
    over it (an output_dir among them too)."""
    base = dict(max_steps=2, batch_size=8, micro_batch_size=4, learning_rate=1e-2)
    quiet = dict(progress_bar=False, log_completions_every=0)
    return minigrpo.TrainConfig(**{"output_dir": str(output_dir), **base, **quiet, **settings})


# The tiny run of examples/train_math.py: two steps of 2 prompts x 2 completions of at most 6 tokens,
# a checkpoint each step, 20 training and 2 held-out problems (seconds).
TINY_RUN = dict(
    steps=2,
    template="tiny",
    save_every=1,
    num_generations=2,
    batch_size=4,
    micro_batch_size=2,
    max_completion_length=6,
    train_count=20,
    eval_count=2,
)


def tiny_run(**flags) -> list[str]:
    """train_math.py's arguments for TINY_RUN with `flags` over it, --steps first (True: a bare flag such
    as --fsdp; None: the flag left out)."""
    args = []
    for name, value in {**TINY_RUN, **flags}.items():
        if value is not None:
            args += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    return args


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def tiny_model(seed=0, **overrides) -> minigrpo.Qwen3:
    torch.manual_seed(seed)
    model = minigrpo.Qwen3(minigrpo.Qwen3Config(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # non-trivial norms so that a wrong norm weight would show
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def fixed_logits_model(logits: torch.Tensor, **overrides) -> minigrpo.Qwen3:
    """A Qwen3 (TINY, with `overrides`) that outputs `logits` (V,) at every position whatever the input."""
    config = minigrpo.Qwen3Config(
        **{**TINY, **overrides, "vocab_size": logits.numel(), "tie_word_embeddings": False}
    )
    model = minigrpo.Qwen3(config).eval()
    C = config.hidden_size
    with torch.no_grad():
        for block in model.layers:  # blocks add nothing to the residual stream
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
        model.embed_tokens.weight.zero_()
        model.embed_tokens.weight[:, 0] = (
            1.0  # every token embeds to e_0; the final norm makes it sqrt(C) e_0
        )
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = logits / C**0.5
    return model


def tiny_tokenizer(directory: str, extra_specials: tuple[str, ...] = ()) -> minigrpo.Tokenizer:
    """A byte-level BPE trained on a few sentences, with Qwen3's special tokens (and `extra_specials`,
    such as tool-call markers), saved in `directory`."""
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS + list(extra_specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(
        ["What is 12 + 30? The answer is \\boxed{42}.", "user assistant system think"] * 20, trainer
    )
    os.makedirs(directory, exist_ok=True)
    backend.save(os.path.join(directory, "tokenizer.json"))
    write_json(
        os.path.join(directory, "tokenizer_config.json"),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    write_json(
        os.path.join(directory, "generation_config.json"),
        {"eos_token_id": [backend.token_to_id("<|im_end|>"), backend.token_to_id("<|endoftext|>")]},
    )
    return minigrpo.Tokenizer.from_directory(directory)


def tiny_policy(directory: str, extra_specials: tuple[str, ...] = (), **overrides) -> str:
    """A tiny Qwen3 (TINY, with `overrides`) and `tiny_tokenizer` (with `extra_specials`) saved together in
    `directory`, a checkpoint load_pretrained and train_math.py read; returns `directory`."""
    tokenizer = tiny_tokenizer(directory, extra_specials)
    minigrpo.save_pretrained(tiny_model(vocab_size=tokenizer.vocab_size, **overrides), tokenizer, directory)
    return directory


def tiny_policies(policies: list, **shared) -> list[str]:
    """tiny_policy(directory, extra_specials, **overrides, **shared) for each (directory, extra_specials,
    overrides) of `policies`, in this process: a fresh interpreter (in_a_process) starts once for all."""
    return [
        tiny_policy(directory, tuple(specials), **overrides, **shared)
        for directory, specials, overrides in policies
    ]


def tree(directory: str) -> dict[str, object]:
    """Every path under `directory`: a file's bytes, a symlink's target, "directory" for a directory."""
    found = {}
    for folder, folders, names in os.walk(directory):
        for name in folders + names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, directory)
            if os.path.islink(path):
                found[relative] = f"-> {os.readlink(path)}"
            elif os.path.isdir(path):
                found[relative] = "directory"
            else:
                with open(path, "rb") as f:
                    found[relative] = f.read()
    return found


def write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f)


def in_a_process(module: str, function: str, *args, **kwargs):
    """module.function(*args, **kwargs) run in a fresh interpreter (the checkout's minigrpo, this directory's
    modules on the path), with its arguments and what it returns passed as JSON: for background work
    (conftest), whose process-wide state (torch's random generator) the tests running meanwhile share."""
    call = (
        "import importlib, json, sys\n"
        "module, function, args, kwargs = sys.argv[1:]\n"
        "call = getattr(importlib.import_module(module), function)\n"
        "value = call(*json.loads(args), **json.loads(kwargs))\n"
        "print(json.dumps(value))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", call, module, function, json.dumps(args), json.dumps(kwargs)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS])},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
