"""The pieces of the Qwen3 decoder (qwen3.py) that hold no cache: the products (plain, or through
weights packed for oneDNN while sampling), RMSNorm, rotary embeddings and the padding mask.
Tensors in, tensors out: nothing here knows the model's config, its caches or the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits are kept in fp32 whatever the weights (bf16, fp16), or fp64 for an fp64 model."""
    return torch.promote_types(dtype, torch.float32)


PACK_MIN_ELEMENTS = 2**17  # smaller weights multiply as fast unpacked (benchmarks/README.md)
PACK_MIN_ROWS = 2  # at one row the plain product (a matrix-vector one) is the faster
Product = Callable[[torch.Tensor], torch.Tensor]


class Linear(nn.Linear):
    """nn.Linear, or through a packed copy of its weight while one is set (Qwen3.packed_for_decoding)."""

    packed: Product | None = None  # pack_for_decoding's product, set only while sampling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x)
        return F.linear(x, self.weight, self.bias)

    def decoding_product(self, batch_size: int) -> Product | None:
        """The product to sample with at `batch_size` rows: packed for oneDNN, or None for F.linear."""
        return pack_for_decoding(self.weight, self.bias, batch_size)


def pack_for_decoding(weight: torch.Tensor, bias: torch.Tensor | None, batch_size: int) -> Product | None:
    """x -> x @ weight.T (+ bias) through a copy of `weight` laid out once for oneDNN's product at
    `batch_size` rows, or None where the plain F.linear is the product: fewer than PACK_MIN_ROWS
    rows, a weight not fp32 on CPU, smaller than PACK_MIN_ELEMENTS or distributed (a DTensor), or
    a torch without the oneDNN ops. The copy holds the weight's values now: it is made per sampling
    call, never kept."""
    if batch_size < PACK_MIN_ROWS or weight.numel() < PACK_MIN_ELEMENTS:
        return None
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    if type(weight.detach()) is not torch.Tensor or not onednn_available():  # a DTensor, or no oneDNN ops
        return None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_size)
    out_features = weight.shape[0]

    def product(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
        return y.reshape(*x.shape[:-1], out_features)

    return product


def onednn_available() -> bool:
    """Whether this torch has the (private) oneDNN ops that pack_for_decoding calls."""
    ops = torch.ops.mkldnn
    linear_ops = hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")
    return torch.backends.mkldnn.is_available() and linear_ops


EXACT_DTYPES = (torch.float32, torch.float64)  # RMSNorm computes in these without a cast


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 (fp64 for fp64) and cast back before the weight, as Qwen3
    does. In fp32 or fp64 there is nothing to cast, and the weight is one product with the norm in
    F.rms_norm's own call (the same values: `rms_norm_reference`); in bf16 or fp16 the casts stay."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in EXACT_DTYPES and self.weight.dtype == x.dtype:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return rms_norm_reference(x, self.weight, self.eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm step by step: normed in fp32 (fp64 for fp64), cast back to x's dtype, times weight."""
    normed = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (*positions.shape, head_dim) for integer positions; angles in fp32.

    sin comes with the sign of the rotation folded in (-sin on the first half, +sin on the second),
    so that rotating is two products and a roll (`apply_rotary`).
    """
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / theta**exponents  # (head_dim/2,)
    angles = positions[..., None].float() * inv_freq  # (..., head_dim/2)
    cos = angles.cos()  # (..., head_dim/2)
    sin = angles.sin()  # (..., head_dim/2)
    # (..., head_dim) each
    return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+D/2}) of x (B, H, T, D): the textbook x * cos + cat(-x2, x1) * sin, with
    cat(x2, x1) a roll of x by D/2 and the minus sign in `signed_sin` (one op instead of three)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def visibility_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool for a padded batch without a cache: a query sees earlier real tokens, and
    always itself, so that padding queries get a finite (unused) output, not a softmax over nothing."""
    T = valid.shape[1]
    slots = torch.arange(T, device=valid.device)
    causal = slots[None, :] <= slots[:, None]  # (T, T)
    own = slots[None, :] == slots[:, None]  # (T, T)
    return ((causal & valid[:, None, :]) | own)[:, None]  # (B, 1, T, T)


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T): each token's index among its row's real tokens (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
