"""Stage 1 of the loop, rollout: G sampled completions per prompt, with the log-probs GRPO needs.

In: prompts as lists of token ids, and the sampling settings. Out: `Samples` (completion tokens,
the log-prob of each under the temperature-scaled full distribution, finish reasons, timings).
It knows token ids and the model, not text, rewards or training. This module is the stage's entry:
`generate` checks the prompts and runs one `Engine` (engine.py, the decode state machine; its docstring
says how a call runs, how rows are refilled and compacted, and how decode steps run as graphs).

What a caller chooses (SamplingConfig): `max_batch_rows` bounds the rows decoding at once, and so the
KV cache; finished rows are refilled from the waiting ones, and dropped when half the batch (`compact`).
`compile` runs the decode steps as graphs: CUDA graphs on a GPU by default ("auto"), torch.compile's on
CPU with True (slow to build); False is the eager reference path everywhere.

Tool calls (`tools`, a `ToolHook` such as tools.ToolRunner): a completion that draws the tools' end
marker pauses while its call runs, then takes the response's tokens (the observation) as forced tokens:
their log-probs are 0 and `generated` marks them False, and they count against max_new_tokens. A
completion does not depend on when its call returned, and `Samples.tool_calls` holds each completion's
call records.

Departure from the usual recipe (transformers, vLLM): no torch.Generator. A counter-based hash of
(row seed, token index) makes a row's random numbers independent of the batch row it decodes in and of
what runs beside it: the same seed gives the same tokens whatever `max_batch_rows`, refill or
compaction do.
"""

from __future__ import annotations

import numbers
from dataclasses import replace

import torch
from torch import nn

from ..config import SamplingConfig
from .engine import Engine, Samples
from .tool_turns import ToolHook, ToolTurns


def generate(
    model: nn.Module,
    prompts: list[list[int]],
    config: SamplingConfig | None = None,
    tools: ToolHook | None = None,
    **settings,
) -> Samples:
    """Sample `num_samples` completions for each prompt; settings are SamplingConfig's fields (over
    `config`'s). With `tools`, a completion may call them (see the module docstring), and
    Samples.tool_calls holds the records of each completion's calls ([] for one that made none)."""
    config = replace(config, **settings) if config is not None else SamplingConfig(**settings)
    check_prompts(prompts, config, model.config.vocab_size, model.config.max_position_embeddings)
    seed = config.seed if config.seed is not None else int(torch.randint(2**62, ()).item())
    hook = ToolTurns(tools, len(prompts) * config.num_samples) if tools is not None else None
    with torch.inference_mode():  # no autograd bookkeeping at all: faster eager decode steps than no_grad
        return Engine(model, prompts, config, seed, hook).run()


def check_prompts(
    prompts,
    config: SamplingConfig,
    vocab_size: int,
    context: int,
    what: str = "",
    sources: list[str] | None = None,
) -> None:
    """Token-id lists the model can continue by max_new_tokens. A prompt too long is named by its source
    ("data.jsonl, line 7") when `sources` are given, else as a row of `what` counted from 1, as a file's
    rows are ("row 3 of the task's prompts"), else by its index in `prompts` ("prompt 2")."""
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if isinstance(config.max_new_tokens, list) and len(config.max_new_tokens) != len(prompts):
        raise ValueError(
            f"max_new_tokens has {len(config.max_new_tokens)} budgets for {len(prompts)} prompts: "
            "give one per prompt, or one integer for all"
        )
    for i, (prompt, budget) in enumerate(zip(prompts, config.budgets(len(prompts)))):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if not all(isinstance(t, numbers.Integral) for t in prompt):
            raise ValueError(
                f"prompt {i} must be a list of token ids (ints); encode text with the tokenizer first"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
        if len(prompt) + budget > context:
            if sources is not None:
                name = f"{sources[i]} ({what})" if what else sources[i]
            else:
                name = f"row {i + 1} of the {what}" if what else f"prompt {i}"
            raise ValueError(
                f"{name} has {len(prompt)} tokens; with max_new_tokens={budget} "
                f"(max_completion_length) that exceeds the model's context of {context} "
                "(max_position_embeddings)"
            )
