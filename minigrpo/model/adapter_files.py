"""Before and after the loop, a model's LoRA adapters in PEFT's files, which PeftModel.from_pretrained
reads on transformers' Qwen3 and minigrpo reads back (whoever wrote them).

adapter_config.json: peft_type LORA, r, lora_alpha, lora_dropout, target_modules, use_rslora,
base_model_name_or_path, task_type CAUSAL_LM. adapter_model.safetensors: per adapted projection,
base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (r, in) and ...lora_B.weight
(out, r). In: a directory. Out: the Adapters it describes and their tensors loaded into a model (and
back to disk). Adapters that minigrpo cannot run (DoRA, per-layer ranks, biases, extra trained
modules, regex targets, adapters on some blocks or projections only) are refused with an AdapterError
naming the setting. The files are untrusted input: everything is checked before an adapter is
allocated (the rank against the projections' sizes, each tensor's name and shape from the file's
header, the values finite), and a tensor no adapted projection takes is refused by name. It knows
files and names, not training.
"""

from __future__ import annotations

import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..config import ALL_LINEAR, LORA_TARGETS, parse_lora_targets
from ..files import read_json_object, regular_file, write_json
from .lora import PARENTS, AdapterError, Adapters, adapter_shapes, adapter_state, add_adapters, check_rank

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model.model."  # PeftModel > Qwen3ForCausalLM > Qwen3Model > layers
# a target_modules entry: a projection's name, or its module's path in transformers' Qwen3
# (PEFT matches an entry against the end of each module's path)
MODULE_PATH = re.compile(
    r"(((base_model\.model\.)?model\.)?(layers\.\d+\.)?(self_attn|mlp)\.)?(" + "|".join(LORA_TARGETS) + ")"
)
# an adapter tensor's name in PEFT's file: its block, its projection (under its parent), A or B
TENSOR_NAME = re.compile(
    re.escape(PEFT_PREFIX) + r"layers\.\d+\.(?P<parent>self_attn|mlp)\.(?P<projection>\w+)\.lora_[AB]\.weight"
)
# PEFT settings minigrpo does not run, each with the value a file writes for "not used"
UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "modules_to_save": None,
    "layers_to_transform": None,  # adapters on these blocks alone
    "layers_pattern": None,
    "exclude_modules": None,  # targets left without adapters
    "rank_pattern": {},
    "alpha_pattern": {},
    "alora_invocation_tokens": None,  # activated LoRA: adapters on the tokens after these only
}
WRITTEN_UNUSED = ("use_dora", "fan_in_fan_out", "bias", "modules_to_save", "rank_pattern", "alpha_pattern")


def is_adapter_directory(directory: str) -> bool:
    """A PEFT adapter's directory: adapter_config.json without a model's config.json beside it (a
    directory with both is read as the full model it holds). Either name counts whatever it is (a
    named pipe too): reading it then says what is wrong with it."""
    adapter = os.path.exists(os.path.join(directory, ADAPTER_CONFIG))
    return adapter and not os.path.exists(os.path.join(directory, "config.json"))


def write_adapter(model, directory: str, base: str) -> None:
    """The model's adapters as PEFT's two files in an existing directory (not atomically: callers write
    into a temporary directory and rename it), naming `base` as their base ("": none)."""
    adapters = model.adapters
    tensors = {PEFT_PREFIX + name: t.detach().cpu().contiguous() for name, t in adapter_state(model).items()}
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    write_json(
        os.path.join(directory, ADAPTER_CONFIG),
        {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base or None,
            "r": adapters.rank,
            "lora_alpha": adapters.alpha,
            "lora_dropout": adapters.dropout,
            "target_modules": list(adapters.targets),
            "use_rslora": adapters.rslora,
            "init_lora_weights": True,
            "inference_mode": True,
            **{key: UNSUPPORTED[key] for key in WRITTEN_UNUSED},
        },
    )


def read_adapter_config(directory: str) -> tuple[Adapters, str | None]:
    """(the adapters adapter_config.json describes, its base_model_name_or_path)."""
    path = os.path.join(directory, ADAPTER_CONFIG)
    try:
        config = read_json_object(path, "a PEFT adapter's settings")
    except ValueError as error:
        raise AdapterError(str(error)) from None
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: peft_type {config['peft_type']!r} is not LORA, the one minigrpo runs")
    for key in UNSUPPORTED:
        value = config.get(key)
        if not _unused(key, value):
            raise AdapterError(
                f"{path}: {key} = {value!r} is not supported by minigrpo's adapters, which go on every "
                "targeted projection of every block"
            )
    targets = config.get("target_modules") or []
    if isinstance(targets, str) and targets not in (*LORA_TARGETS, ALL_LINEAR):
        raise AdapterError(f"{path}: target_modules {targets!r} is a pattern; minigrpo reads a list of names")
    if not isinstance(targets, (str, list)):
        raise AdapterError(f"{path}: target_modules must be a list of module names, got {targets!r:.80}")
    targets = [targets] if isinstance(targets, str) else [_projection(name, path) for name in targets]
    base = config.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise AdapterError(f"{path}: base_model_name_or_path must be a path or a Hub id, got {base!r:.80}")
    try:
        adapters = Adapters(
            rank=config.get("r", 8),
            alpha=config.get("lora_alpha", 8),
            targets=parse_lora_targets(sorted(set(targets))),
            dropout=config.get("lora_dropout", 0.0),
            rslora=bool(config.get("use_rslora", False)),
        )
    except (TypeError, ValueError) as error:  # a value of the wrong type: a string for a number, say
        raise AdapterError(f"{path}: {error}") from None
    return adapters, base


def _unused(key: str, value) -> bool:
    """Whether PEFT reads this value of an UNSUPPORTED setting as the setting not used: absent, null,
    its written default, or empty (false, "", {}, []: PEFT tests these settings for truth), except
    layers_to_transform, which PEFT tests against None: 0 there means block 0 alone, and only null and
    [] mean every block."""
    if key == "layers_to_transform":
        return value is None or value == []
    return not value or value == UNSUPPORTED[key]


def _projection(name: str, path: str) -> str:
    """A target_modules entry as the projection it names: q_proj as is, or a module's path such as
    model.layers.3.self_attn.q_proj (PEFT writes those for all-linear); other modules are refused."""
    if not isinstance(name, str) or not MODULE_PATH.fullmatch(name):
        raise AdapterError(
            f"{path}: target_modules entry {name!r} is not a projection of a Qwen3 block (minigrpo adapts "
            f"{', '.join(LORA_TARGETS)})"
        )
    return name.rsplit(".", 1)[-1]


def load_adapter(model, directory: str, seed: int = 0) -> None:
    """Put the adapters that `directory` holds on `model` (a base without adapters). Everything is
    checked before the adapters are allocated, so that the model is left as it was if one thing does
    not fit: the rank against the projections, every tensor's name and shape against the file's
    header (a huge r is never allocated), and the tensors' values (NaN or inf); an AdapterError names
    the first that does not fit."""
    adapters, _ = read_adapter_config(directory)
    check_rank(model, adapters, f"{os.path.join(directory, ADAPTER_CONFIG)}: r")
    path = os.path.join(directory, ADAPTER_WEIGHTS)
    shapes = {PEFT_PREFIX + name: shape for name, shape in adapter_shapes(model, adapters).items()}
    with _open(path) as f:
        _check_names(
            f.keys(), shapes.keys(), path, f"{len(model.layers)} layers, targets {_targets(adapters)}"
        )
        for name, shape in shapes.items():
            found = tuple(f.get_slice(name).get_shape())
            if found != shape:
                raise AdapterError(
                    f"{path}: {name} has shape {found}, but this model's projection takes {shape} (an "
                    "adapter made for another base?)"
                )
        tensors = {name: _finite(f.get_tensor(name), name, path) for name in shapes}
    add_adapters(model, adapters, seed)
    with torch.no_grad():
        for name, param in adapter_state(model).items():
            param.copy_(tensors[PEFT_PREFIX + name])


def _check_names(names, expected, path: str, model: str) -> None:
    """The file holds a tensor for every name `expected` and nothing else: a surplus tensor (one that no
    adapted projection takes) is named, as is a missing one."""
    surplus = sorted(set(names) - set(expected))
    if surplus:
        raise AdapterError(
            f"{path} holds {_first(surplus)}, which no adapted projection of this model ({model}) takes: "
            "minigrpo loads an adapter whole or not at all"
        )
    missing = sorted(set(expected) - set(names))
    if missing:
        raise AdapterError(
            f"{path} lacks {_first(missing)} for this model ({model}): an adapter made for another base?"
        )


def _finite(tensor: torch.Tensor, name: str, path: str) -> torch.Tensor:
    if not torch.isfinite(tensor).all():
        raise AdapterError(
            f"{path}: {name} holds NaN or infinite values; an adapter must be finite (saved from a run "
            "that diverged?)"
        )
    return tensor


def _targets(adapters: Adapters) -> str:
    return ",".join(adapters.targets)


def _first(names: list[str], n: int = 3) -> str:
    """The first n names, and how many more."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def check_adapter_files(directory: str) -> None:
    """The adapter's config reads and its weights file holds nothing but an A and a B of rank r for
    adapted projections, read from the file's header alone; an AdapterError names what does not."""
    adapters, _ = read_adapter_config(directory)
    path = os.path.join(directory, ADAPTER_WEIGHTS)
    with _open(path) as f:
        if not list(f.keys()):
            raise AdapterError(f"{path} holds no adapter tensors")
        for name in f.keys():
            match = TENSOR_NAME.fullmatch(name)
            projection = match and match["projection"]
            if projection not in adapters.targets or PARENTS[projection] != match["parent"]:
                raise AdapterError(
                    f"{path} holds {name}, which is not the A or B of a projection its "
                    f"{ADAPTER_CONFIG} targets ({_targets(adapters)})"
                )
            shape = f.get_slice(name).get_shape()
            inner = shape[0] if ".lora_A." in name else shape[-1]
            if len(shape) != 2 or inner != adapters.rank:
                raise AdapterError(f"{path}: {name} has shape {tuple(shape)}, not rank {adapters.rank}")


def _open(path: str):
    """safe_open(path), with a missing, special (a named pipe) or damaged file an AdapterError naming it."""
    try:
        present = regular_file(path)
    except ValueError as error:
        raise AdapterError(str(error)) from None
    if not present:
        raise AdapterError(f"{path} does not exist: an adapter directory needs {ADAPTER_WEIGHTS}")
    try:
        return safe_open(path, framework="pt")
    except Exception as error:
        raise AdapterError(
            f"{path} is not a readable safetensors file (truncated or damaged?): {error}"
        ) from None
