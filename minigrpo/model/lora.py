"""The policy's low-rank adapters (LoRA, Hu et al. 2021): each targeted projection becomes
W x + s * B A x, the base W frozen, A (r, in) and B (out, r) trained, s the scale.

In: a Qwen3 and an Adapters description (rank, alpha, targets). Out: the same Qwen3 with LoraLinear
projections, whose adapters can be switched off (the base model, for the KL's reference), merged into
a copy of each weight (for sampling), or merged into a plain Qwen3 (for a full checkpoint). It knows
modules and tensors, not files (adapter_files.py writes PEFT's) nor the run that trains them.

As PEFT does: A starts Kaiming-uniform (a = sqrt(5), nn.Linear's own init), B at zero, so a fresh
adapter leaves the model exactly as it was; s = alpha / r, or rsLoRA's alpha / sqrt(r); the adapters
are kept in fp32 whatever the base's dtype (PEFT's autocast_adapter_dtype); lm_head and the
embedding are never adapted ("all-linear" means the seven projections of each block). Merging never
writes into W: the merged weight is a new tensor, so the base stays bit-identical over any number of
sampling calls (merging into W and subtracting after, as some trainers do, drifts a bf16 base). The
sampler merges only an fp32 (or fp64) W: merged into bf16, a young adapter's small updates round away.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LORA_TARGETS, parse_lora_targets
from .layers import Linear, Product, pack_for_decoding

# the block module each projection an adapter can go on sits in (config.LORA_TARGETS: PEFT's names)
PARENTS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


# the adapters compute in float32 (or fp64): a larger alpha, or scale, is inf there
FLOAT32_MAX = torch.finfo(torch.float32).max


class AdapterError(ValueError):
    """Adapters that cannot go on this model, or files that do not describe adapters minigrpo runs."""


@dataclass(frozen=True)
class Adapters:
    """What a set of adapters is: the same for the ones a run adds and the ones a PEFT file describes."""

    rank: int  # r: the inner width of B A
    alpha: float  # the scale's numerator
    targets: tuple[str, ...]  # the projections adapted in every block, PEFT's names, in LORA_TARGETS' order
    dropout: float = 0.0  # dropout on an adapter's input while training
    rslora: bool = False  # scale alpha / sqrt(r) (rsLoRA) instead of alpha / r

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise AdapterError(f"a LoRA rank must be a positive integer, got {self.rank!r}")
        alpha = self.alpha
        # (NaN and inf fail the comparison too)
        if isinstance(alpha, bool) or not (isinstance(alpha, (int, float)) and 0 < alpha <= FLOAT32_MAX):
            raise AdapterError(
                f"lora_alpha must be a number > 0 that float32 holds (at most {FLOAT32_MAX:.4g}: the "
                f"adapters compute in float32), got {self.alpha!r}"
            )
        if isinstance(self.dropout, bool) or not (
            isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1
        ):
            raise AdapterError(f"lora_dropout must be in [0, 1), got {self.dropout!r}")
        if (
            not isinstance(self.targets, tuple)
            or not self.targets
            or parse_lora_targets(self.targets) != self.targets
        ):
            raise AdapterError(f"LoRA targets must be some of {', '.join(LORA_TARGETS)}, got {self.targets}")

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


class LoraLinear(Linear):
    """A projection with an adapter: W x + s * B A dropout(x). W (and the bias) are the base's own
    parameters, frozen; A and B are `lora_A.weight` and `lora_B.weight`, PEFT's names."""

    # while sampling (Qwen3.packed_for_decoding): one product with a merged copy of W + s B A, not the
    # base's product plus the adapter's two small ones (the faster on CPU: benchmarks/README.md)
    MERGE_FOR_DECODING = True

    def __init__(self, base: Linear, adapters: Adapters, generator: torch.Generator | None = None):
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight = base.weight
        self.bias = base.bias
        self.scaling = adapters.scaling
        device = base.weight.device
        # fp32 whatever the base (PEFT's autocast_adapter_dtype): a bf16 adapter would round its updates
        dtype = torch.promote_types(base.weight.dtype, torch.float32)  # (fp64 for an fp64 base)
        self.lora_A = nn.Linear(
            base.in_features, adapters.rank, bias=False, device=device, dtype=dtype
        )  # (r, in)
        self.lora_B = nn.Linear(
            adapters.rank, base.out_features, bias=False, device=device, dtype=dtype
        )  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(adapters.dropout) if adapters.dropout else nn.Identity()
        self.adapting = True  # False: the base projection alone (adapters_off)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x)
        y = F.linear(x, self.weight, self.bias)
        if not self.adapting:
            return y
        return self.with_adapter(y, x)

    def with_adapter(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y + s * B A dropout(x), with y the base's product: (..., in) -> (..., r) -> (..., out), summed
        in the adapter's precision and rounded to y's dtype once (as PEFT does)."""
        inner = self.lora_A(self.dropout(x).to(self.lora_A.weight.dtype))  # (..., r)
        return (y + self.lora_B(inner) * self.scaling).to(y.dtype)  # (..., out)

    def merged_weight(self) -> torch.Tensor:
        """W + s B A, (out, in), a new tensor in W's dtype (summed in the adapter's): W is never written."""
        with torch.no_grad():
            delta = self.lora_B.weight @ self.lora_A.weight  # (out, in)
            return (self.weight.to(delta.dtype) + self.scaling * delta).to(self.weight.dtype)

    def decoding_product(self, batch_size: int) -> Product | None:
        """Merged where W is fp32 or fp64 (the merge rounds like the adapter's own sum); in bf16 or fp16
        the merge would round away every update smaller than half of W's last digit (most of a young
        adapter's), so there the adapter stays its own two products beside the base's."""
        if not self.MERGE_FOR_DECODING or self.weight.dtype not in (torch.float32, torch.float64):
            base = super().decoding_product(batch_size) or functools.partial(
                F.linear, weight=self.weight, bias=self.bias
            )
            return lambda x: self.with_adapter(base(x), x)
        merged = self.merged_weight()
        packed = pack_for_decoding(merged, self.bias, batch_size)
        return packed or functools.partial(F.linear, weight=merged, bias=self.bias)


def check_rank(model: nn.Module, adapters: Adapters, what: str = "the LoRA rank") -> None:
    """An AdapterError, before anything is allocated, for a rank above min(in, out) of a targeted
    projection: B A (out, in) can have no higher rank, so the extra width would only take memory. The
    narrowest target is named with its bound; `what` names where the rank came from (a flag, a file's r)."""
    block = model.layers[0]  # every block's projections have the same shapes
    projections = {name: getattr(getattr(block, PARENTS[name]), name) for name in adapters.targets}
    bounds = {name: min(p.in_features, p.out_features) for name, p in projections.items()}
    narrowest = min(bounds, key=bounds.get)
    if adapters.rank > bounds[narrowest]:
        projection = projections[narrowest]
        raise AdapterError(
            f"{what} = {adapters.rank} is above {bounds[narrowest]}, the most {narrowest} takes: B A has "
            f"at most the rank of the smaller side of the {projection.out_features} x "
            f"{projection.in_features} weight it adds to"
        )


def adapter_shapes(model: nn.Module, adapters: Adapters) -> dict[str, tuple[int, int]]:
    """The shape of each tensor add_adapters would put on `model`, by the name adapter_state gives it
    (layers.0.self_attn.q_proj.lora_A.weight, ...): A (r, in) and B (out, r). Nothing is allocated."""
    shapes = {}
    for i, block in enumerate(model.layers):
        for name in adapters.targets:
            projection = getattr(getattr(block, PARENTS[name]), name)
            path = f"layers.{i}.{PARENTS[name]}.{name}"
            shapes[f"{path}.lora_A.weight"] = (adapters.rank, projection.in_features)
            shapes[f"{path}.lora_B.weight"] = (projection.out_features, adapters.rank)
    return shapes


def add_adapters(model: nn.Module, adapters: Adapters, seed: int = 0) -> nn.Module:
    """Put fresh adapters (B = 0: the model computes what it did) on `adapters.targets` of every block,
    A drawn from `seed`; freeze everything else. Returns the model, changed in place."""
    if adapters_of(model) is not None:
        raise AdapterError(
            "the model already has LoRA adapters: continue them rather than wrap new ones over them"
        )
    check_rank(model, adapters)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    model.requires_grad_(False)
    for block in model.layers:
        for name in adapters.targets:
            parent = getattr(block, PARENTS[name])
            setattr(parent, name, LoraLinear(getattr(parent, name), adapters, generator))
    model.adapters = adapters
    return model


def set_dropout(model: nn.Module, dropout: float) -> None:
    """Train the model's adapters with this dropout on their inputs (a run's setting, not the file's)."""
    model.adapters = replace(model.adapters, dropout=dropout)
    for m in adapter_modules(model).values():
        m.dropout = nn.Dropout(dropout) if dropout else nn.Identity()


def adapters_of(model: nn.Module) -> Adapters | None:
    """The model's adapters' description, or None for a model trained whole."""
    return model.adapters


def adapter_modules(model: nn.Module) -> dict[str, LoraLinear]:
    """Each adapted projection by its parameter path (layers.0.self_attn.q_proj, ...)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors by parameter name (layers.0.self_attn.q_proj.lora_A.weight, ...)."""
    return {name: p for name, p in model.named_parameters() if ".lora_" in name}


def trainable_parameters(model: nn.Module) -> int:
    """Elements the optimizer trains: every weight, or the adapters alone."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@contextlib.contextmanager
def adapters_off(model: nn.Module):
    """Inside, every adapted projection computes its base alone: the model the adapters started from."""
    modules = adapter_modules(model).values()
    before = [m.adapting for m in modules]
    try:
        for m in modules:
            m.adapting = False
        yield model
    finally:
        for m, adapting in zip(modules, before):
            m.adapting = adapting


def merged(model: nn.Module) -> nn.Module:
    """A plain copy of the model (no adapters) whose weights are W + s B A: the adapted function as
    ordinary weights, for a full checkpoint or a frozen reference. The model is left as it was."""
    plain = copy.deepcopy(model)
    for name, m in adapter_modules(model).items():
        parent_name, _, attr = name.rpartition(".")
        linear = Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        linear.weight = nn.Parameter(m.merged_weight(), requires_grad=False)
        linear.bias = None if m.bias is None else nn.Parameter(m.bias.detach().clone(), requires_grad=False)
        setattr(plain.get_submodule(parent_name), attr, linear)
    plain.adapters = None
    plain.requires_grad_(True)
    return plain
