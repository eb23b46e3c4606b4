"""Before and after the loop, the policy's weights in Hugging Face layout, as transformers and the Hub
keep them: loaded, checked and saved.

(Training checkpoints, which add the optimizer and the run's position to these files, are run/checkpoint.py.)

In: a local directory or a Hub repo id (hub.py finds its files; devices.py parses the device and
dtype). Out: a Qwen3 model and its Tokenizer (and back to disk), and what stops a tool from saving
into a directory. Weights move through safetensors only, never pickle. Every problem with the files
is raised as a CheckpointError that names the file or tensor at fault; a save never leaves a
half-written directory. It knows files, names and shapes, not training.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..files import (
    directory_beside,
    disk_full_named,
    remove_leftovers,
    replace_dir,
    write_json,
    write_probe,
)
from .adapter_files import (
    ADAPTER_CONFIG,
    check_adapter_files,
    is_adapter_directory,
    load_adapter,
    read_adapter_config,
    write_adapter,
)
from .devices import parse_device, parse_dtype
from .hub import INDEX_FILE, SINGLE_FILE, CheckpointError, present, read_json, resolve_checkpoint
from .qwen3 import ConfigError, Qwen3, Qwen3Config
from .tokenizer import Tokenizer

IGNORED = re.compile(r".*rotary_emb\.inv_freq$")  # tensors some checkpoints carry that hold nothing we need
# The files of a Hugging Face checkpoint, as save_pretrained writes them for a model without adapters: all
# that a tool's output directory may hold when the tool replaces it (output_problem).
SAVED_FILE = re.compile(
    r"(generation_)?config\.json|tokenizer(_config)?\.json|chat_template\.jinja"
    r"|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json"
)


# --- name mapping ---------------------------------------------------------------------------------
def hf_name(name: str) -> str:
    """Hugging Face name of our parameter: the same path under "model.", except the LM head."""
    return name if name.startswith("lm_head.") else "model." + name


def to_hf_state_dict(model: Qwen3, weights: dict | None = None) -> dict[str, torch.Tensor]:
    """Our parameters (or `weights`, a state dict of the model) under Hugging Face names."""
    return {
        hf_name(name): tensor for name, tensor in (model.state_dict() if weights is None else weights).items()
    }


# --- loading --------------------------------------------------------------------------------------
def load_pretrained(
    path_or_repo_id: str,
    *,
    dtype=None,
    device="cpu",
    revision: str | None = None,
    gradient_checkpointing: bool = False,
):
    """(model, tokenizer) from a local Hugging Face directory or a Hub repo id such as 'Qwen/Qwen3-0.6B'.

    dtype defaults to float32 on CPU and bfloat16 on GPU. tokenizer is None when the directory has
    no tokenizer.json. gradient_checkpointing: the model recomputes each block in backward while it
    trains (TrainConfig.gradient_checkpointing; the trainer checks that the two agree).
    """
    device = parse_device(device)
    dtype = parse_dtype(dtype, device)
    directory = resolve_checkpoint(path_or_repo_id, revision=revision)
    if is_adapter_directory(directory):
        return _load_adapted(directory, dtype, device, gradient_checkpointing)
    config = read_config(directory)
    tokenizer = read_tokenizer(directory)  # before the weights: a bad tokenizer file fails fast
    with torch.device("meta"):  # no memory, no random init: the weights come from the files
        model = Qwen3(config).to(dtype)
    model = model.to_empty(device=device)
    model.gradient_checkpointing = gradient_checkpointing
    _load_weights(model, directory)
    model.name_or_path = os.path.abspath(directory) if os.path.isdir(path_or_repo_id) else path_or_repo_id
    model.eval()
    return model, tokenizer


def _load_adapted(directory: str, dtype, device, gradient_checkpointing: bool):
    """(base model with the directory's PEFT adapters on it, tokenizer): the base is the adapter's
    base_model_name_or_path, the tokenizer the directory's own if it has one, else the base's."""
    _, base = read_adapter_config(directory)  # checked before the base is read
    if not base:
        raise CheckpointError(
            f"{directory}/{ADAPTER_CONFIG} names no base_model_name_or_path: minigrpo cannot tell which "
            "model its adapters go on"
        )
    if is_adapter_directory(base):
        raise CheckpointError(
            f"{directory}: its base {base} is itself an adapter directory; minigrpo does not stack adapters"
        )
    model, tokenizer = load_pretrained(
        base, dtype=dtype, device=device, gradient_checkpointing=gradient_checkpointing
    )
    load_adapter(model, directory)
    model.eval()
    return model, read_tokenizer(directory) or tokenizer


def read_config(directory: str) -> Qwen3Config:
    path = os.path.join(directory, "config.json")
    if not present(path):
        raise CheckpointError(f"{directory} has no config.json: not a Hugging Face checkpoint directory")
    settings = read_json(path, "the model's settings")
    try:
        return Qwen3Config.from_dict(settings)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from None


def read_tokenizer(directory: str) -> Tokenizer | None:
    """The directory's Tokenizer, None without a tokenizer.json, a CheckpointError for a bad one."""
    if not present(os.path.join(directory, "tokenizer.json")):
        return None
    try:
        return Tokenizer.from_directory(directory)
    except ValueError as e:  # names the file at fault
        raise CheckpointError(str(e)) from None


def weight_files(directory: str) -> dict[str, str]:
    """Map each tensor name to the safetensors file (full path) that holds it."""
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if present(index_path):
        weight_map = read_json(index_path, "a weight_map of tensor names to files").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path} has no weight_map of tensor names to files")
        return {name: os.path.join(directory, file) for name, file in weight_map.items()}
    if present(single_path):
        with _open_safetensors(single_path) as f:
            return {name: single_path for name in f.keys()}
    pickled = [f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth"))]
    hint = f" (found {pickled[0]}: minigrpo reads safetensors only, never pickle)" if pickled else ""
    raise CheckpointError(f"{directory} has no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def check_tensors(directory: str) -> None:
    """The weights files of `directory` hold every tensor its config.json implies, each of that shape and
    with all its bytes, read from the files' headers (no tensor data is read); a CheckpointError names the
    file or tensor that does not. An adapter directory's files are checked against its own config.
    """
    if is_adapter_directory(directory):
        check_adapter_files(directory)
        return
    with torch.device("meta"):  # shapes only: no memory
        expected = to_hf_state_dict(Qwen3(read_config(directory)))
    files = weight_files(directory)
    _check_names(expected, files, directory)
    handles = {}
    for name, param in expected.items():
        if files[name] not in handles:
            # checks the length against the header
            handles[files[name]] = _open_safetensors_listed(files[name])
        shape = tuple(handles[files[name]].get_slice(name).get_shape())
        if shape != tuple(param.shape):
            raise CheckpointError(_shape_error(name, directory, shape, param.shape))


def weights_sha256(path_or_repo_id: str) -> str:
    """The sha256 of a checkpoint's weights: each tensor's name, dtype, shape and bytes, in name order
    (the same however the files are sharded). It pins the base a LoRA run's adapters go on; it reads
    every byte (about a second a gigabyte)."""
    directory = resolve_checkpoint(path_or_repo_id)
    files = weight_files(directory)
    digest = hashlib.sha256()
    handles = {}
    for name in sorted(files):
        tensor = _read_tensor(handles, files[name], name)
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # its bytes, whatever its dtype
    return digest.hexdigest()


def _load_weights(model: Qwen3, directory: str) -> None:
    files = weight_files(directory)
    params = to_hf_state_dict(model)
    _check_names(params, files, directory)
    handles = {}
    for name, param in params.items():
        tensor = _read_tensor(handles, files[name], name)
        if tensor.shape != param.shape:
            raise CheckpointError(_shape_error(name, directory, tensor.shape, param.shape))
        with torch.no_grad():
            param.copy_(tensor)


def _check_names(params: dict, files: dict[str, str], directory: str) -> None:
    """The files hold every parameter's tensor and nothing else but ignorable extras."""
    unexpected = [n for n in files if n not in params and not IGNORED.match(n)]
    if "lm_head.weight" not in params:
        unexpected = [n for n in unexpected if n != "lm_head.weight"]  # a tied head saved anyway is a copy
    missing = [n for n in params if n not in files]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint in {directory} does not match its config.json: "
            + "; ".join(
                f"{label}: {_first_names(names)}"
                for label, names in (("missing", missing), ("unexpected", unexpected))
                if names
            )
        )


def _shape_error(name: str, directory: str, shape, expected) -> str:
    return f"tensor {name} in {directory} has shape {tuple(shape)}, but config.json implies {tuple(expected)}"


def _read_tensor(handles: dict, path: str, name: str) -> torch.Tensor:
    if path not in handles:
        handles[path] = _open_safetensors_listed(path)
    try:
        return handles[path].get_tensor(name)
    except Exception as e:
        raise CheckpointError(f"cannot read tensor {name} from {path}: {e}") from None


def _open_safetensors_listed(path: str):
    """_open_safetensors of a file the weight map names, which may not exist."""
    if not present(path):
        raise CheckpointError(f"weight file {path} (listed in {INDEX_FILE}) does not exist")
    return _open_safetensors(path)


def _open_safetensors(path: str):
    """safe_open(path), with a damaged file (truncated, empty, not safetensors) a CheckpointError naming
    it."""
    try:
        return safe_open(path, framework="pt")
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError for unreadable files)
        raise CheckpointError(
            f"{path} is not a readable safetensors file (truncated or damaged?): {e}"
        ) from None


def _first_names(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# --- saving ---------------------------------------------------------------------------------------
def output_problem(directory: str, overwrite: bool, also: tuple[str, ...] = ()) -> str | None:
    """What stops a tool from saving a checkpoint into `directory`, which save_pretrained replaces whole:
    the words that follow the directory's name in the tool's one-line error, or None.

    An existing `directory` is an empty directory, or a checkpoint (SAVED_FILE's files, and those `also`'s
    shell patterns match: the tool's own files beside them) that only `overwrite` lets the tool replace;
    anything else in it would be deleted. The nearest existing directory above it must take a new file
    (files.write_probe: os.access is not enough, root passes it in /proc and /sys). Nothing is made.
    """
    if os.path.lexists(directory) and not os.path.isdir(directory):
        return "is a file; it must be a directory (or not exist yet)"
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    others = [
        name
        for name in names
        if not SAVED_FILE.fullmatch(name) and not any(fnmatch.fnmatch(name, pattern) for pattern in also)
    ]
    if others:
        return f"holds {others[0]}, which no Hugging Face checkpoint holds: name a new or empty directory"
    if names and not overwrite:
        return "holds a checkpoint already: --overwrite replaces it whole"
    existing = os.path.dirname(os.path.abspath(directory))  # where the temporary directory is made
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"cannot be created: {existing} is a file"
    problem = write_probe(existing)
    return f"cannot be written: {problem}" if problem else None


def save_pretrained(
    model: Qwen3, tokenizer: Tokenizer | None, directory: str, *, max_shard_bytes: int = 4 * 2**30
) -> None:
    """Write model (and tokenizer) in Hugging Face layout, atomically.

    Everything is written to a temporary sibling directory which then replaces `directory`, so a
    crash mid-save leaves either the old checkpoint or the new one, never a mix. Replacing a checkpoint
    syncs the new one to disk before the old is deleted (files.replace_dir), so a power cut loses neither;
    a save into a new place syncs nothing (a power cut may leave its files empty). What a save here that
    was killed left beside `directory` (.NAME.tmp-*, .NAME.old-*) is deleted first. Files larger than
    max_shard_bytes are split into model-0000i-of-0000n.safetensors plus an index. A full disk is
    one DiskFull line naming `directory` and the space left, as a training checkpoint's is.
    """
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):  # replace_dir would delete it
        raise CheckpointError(f"{directory} is a file; a checkpoint is saved as a directory")
    with disk_full_named(directory):
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        remove_leftovers(directory)  # of a save here that was killed: its space is needed now
        with directory_beside(directory) as tmp:
            write_files(model, tokenizer, tmp, max_shard_bytes=max_shard_bytes)
            replace_dir(tmp, directory)


def write_files(
    model: Qwen3,
    tokenizer: Tokenizer | None,
    directory: str,
    *,
    max_shard_bytes: int = 4 * 2**30,
    weights: dict | None = None,
    base: str | None = None,
) -> None:
    """The Hugging Face files of model (and tokenizer) written into an existing directory, not atomically.
    weights: the model's state dict, if not its own (a sharded model's, gathered). A model with LoRA
    adapters is written as its adapters alone, in PEFT's files, naming `base` as their base (by default
    the model's name_or_path, the files it was loaded from)."""
    if model.adapters is not None:
        write_adapter(model, directory, model.name_or_path if base is None else base)
    else:
        _write_weights(model, directory, max_shard_bytes, weights)
        write_json(
            os.path.join(directory, "config.json"),
            {**model.config.to_dict(), "dtype": str(model.dtype).removeprefix("torch.")},
        )
    if tokenizer is not None:
        tokenizer.save(directory)
        generation = {**tokenizer.generation_config, "eos_token_id": list(tokenizer.eos_token_ids)}
        if tokenizer.pad_token_id is not None:
            generation["pad_token_id"] = tokenizer.pad_token_id
        write_json(os.path.join(directory, "generation_config.json"), generation)


def _write_weights(model: Qwen3, directory: str, max_shard_bytes: int, weights: dict | None) -> None:
    tensors = {name: t.detach().cpu().contiguous() for name, t in to_hf_state_dict(model, weights).items()}
    shards = []
    current = {}
    size = 0
    for name, t in tensors.items():
        if current and size + t.nbytes > max_shard_bytes:
            shards.append(current)
            current = {}
            size = 0
        current[name] = t
        size = size + t.nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.nbytes for t in tensors.values())
    write_json(
        os.path.join(directory, INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map}
    )
