"""Stage 1's decode step and the ways it runs: eager, torch.compile'd (CPU), or as CUDA graphs (GPU).

In: the model, one token per batch row (B,), the KV cache and the span of slots to read. Out: (B, V)
logits. The engine (engine.py) picks the mode once per call; the graphs themselves are decode_graphs.py.
It knows the model's decode step and the shapes graphs are made for, not requests, sampling or the loop.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend

SPAN_BUCKET = 64  # compiled decode steps read 64, 128, 256, ... cache slots
# On a GPU, attention runs through SDPA's flash kernel (prompts: causal, no mask) or its memory-efficient
# one (decode steps: a mask over each row's slots), never cuDNN's, which builds a plan for every new
# shape: eager decoding reads one more slot each decode step, so it paid that plan at every decode step
# of a first call.
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_step(model: nn.Module, tokens: torch.Tensor, cache, span: int) -> torch.Tensor:
    """One token per row (B,) through the model, reading `span` cache slots; (B, V) logits."""
    return model.logits(model.decode(tokens, cache, span))


def decode_mode(compile: bool | str, device: torch.device) -> str:
    """How a call's decode steps run (SamplingConfig.compile): "cuda graphs" on a GPU unless compile is
    False, "inductor" (torch.compile) elsewhere when compile is True, else "eager"."""
    if compile is False:
        return "eager"
    if device.type == "cuda":
        return "cuda graphs"
    return "inductor" if compile is True else "eager"


_compiled_step = None


def compiled_decode_step():
    """The process's one torch.compile'd decode step: its graphs (one per shape) are reused by every call."""
    global _compiled_step
    if _compiled_step is None:
        # one graph per (batch rows, span) pair: a few dozen at most, above dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _compiled_step = torch.compile(decode_step, dynamic=False)
    return _compiled_step


def span_bucket(span: int, max_len: int) -> int:
    """The smallest of 64, 128, 256, ... slots holding `span`, at most the cache's max_len."""
    bucket = SPAN_BUCKET
    while bucket < span:
        bucket *= 2
    return min(bucket, max_len)


def batch_buckets(rows: int) -> list[int]:
    """Batch sizes compiled graphs may see: the first batch and the powers of two below it."""
    return sorted({rows} | {2**k for k in range(rows.bit_length()) if 2**k < rows})
