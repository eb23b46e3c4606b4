"""End of the loop, checkpoint: training state that a run resumes from exactly.

A checkpoint is `output_dir/checkpoints/step-000012/`: the policy in Hugging Face layout
(config.json, model.safetensors, tokenizer files: loadable by `load_pretrained` and by
transformers) plus trainer_state.pt (optimizer, step, data position, every RNG state, the
configs; the learning rate is a function of the step, so there is no scheduler to save). It is
written into a temporary sibling directory and renamed into place, so a crash while saving
leaves the earlier checkpoints as they were and never a partial one. Beside the checkpoints it keeps
output_dir/initial_eval.json, the starting policy's score that --resume reads back; `replaced_whole`
(`replace_json`) is its write-then-rename, also used for summary.json and trace.html.
In: a directory, a step, the model and a state dict. Out: files, and the state read back.
It knows files and state dicts, not how they are used.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import re
import shutil
import tempfile

import numpy as np
import torch
from safetensors import safe_open

from .tokenizer import read_json_object
from .weights import replace_dir, write_files

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
INITIAL_EVALUATION = "initial_eval.json"  # in output_dir: the starting policy's score, kept across resumes
_STEP_DIR = re.compile(r"step-(\d+)")


def save_checkpoint(output_dir: str, step: int, model, tokenizer, state: dict, keep: int, *, weights: dict | None = None) -> str:
    """Write checkpoint `step` atomically, keep the newest `keep`; returns its directory. `weights`:
    the model's whole state dict, when the model itself holds only a shard of it (FSDP2)."""
    parent = os.path.join(output_dir, CHECKPOINTS)
    os.makedirs(parent, exist_ok=True)
    final = os.path.join(parent, f"step-{step:06d}")
    tmp = tempfile.mkdtemp(prefix=".tmp-step-", dir=parent)
    try:
        write_files(model, tokenizer, tmp, weights=weights)
        torch.save(state, os.path.join(tmp, STATE_FILE))
        _fsync_tree(tmp)  # on disk before it is published: a power cut cannot leave a renamed, empty checkpoint
        replace_dir(tmp, final)  # the same step saved again: the old copy goes only once the new one is in place
        _fsync(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(parent, keep)
    remove_leftovers(output_dir)
    return final


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in output_dir, or None."""
    steps = _checkpoints(os.path.join(output_dir, CHECKPOINTS))
    return steps[-1][1] if steps else None


def latest_intact_checkpoint(output_dir: str, note=print) -> str | None:
    """The newest checkpoint whose files all read back (a crash or a full disk can damage one);
    each damaged one skipped on the way is named through `note`."""
    for _, directory in reversed(_checkpoints(os.path.join(output_dir, CHECKPOINTS))):
        damage = _damage(directory)
        if damage is None:
            return directory
        note(f"note: {directory} is damaged ({damage}); trying the checkpoint before it")
    return None


def _damage(directory: str) -> str | None:
    """Why the checkpoint in `directory` cannot be resumed from, or None: its state loads, its
    config parses, and every weights file has a complete header and all the bytes it declares."""
    try:
        load_state(directory)
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            if not isinstance(json.load(f), dict):
                return "config.json is not a JSON object"
        shards = [name for name in os.listdir(directory) if name.endswith(".safetensors")]
        if not shards:
            return "no .safetensors weights"
        for name in shards:
            with safe_open(os.path.join(directory, name), framework="pt"):
                pass  # safetensors checks the header and the file's length against it
    except Exception as error:  # a truncated pickle, zip or safetensors file, bad JSON, a missing file
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
    return None


def load_state(checkpoint: str) -> dict:
    """trainer_state.pt, loaded as data only (`weights_only=True`): a crafted file cannot run code."""
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint} is not a training checkpoint: it has no {STATE_FILE}")
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path} holds more than tensors and plain data (written by minigrpo before 0.2, or "
                         f"not by minigrpo), so it is not loaded: {str(error).splitlines()[0]}") from None


def read_initial_evaluation(output_dir: str) -> dict:
    """output_dir/initial_eval.json as written by `save_initial_evaluation`; {} when there is none, and a
    ValueError naming the file when it is not a JSON object."""
    path = os.path.join(output_dir, INITIAL_EVALUATION)
    if not os.path.exists(path):
        return {}
    try:
        return read_json_object(path, "the starting policy's score")
    except ValueError as error:
        raise ValueError(f"{error}; move it away to measure the start again") from None


def save_initial_evaluation(output_dir: str, record: dict) -> None:
    """Write output_dir/initial_eval.json whole or not at all (`replaced_whole`): --resume reads it."""
    replace_json(os.path.join(output_dir, INITIAL_EVALUATION), record)


def replace_json(path: str, data: dict) -> None:
    """`data` as JSON in `path`, replaced whole."""
    with replaced_whole(path) as f:
        json.dump(data, f, indent=1)


@contextlib.contextmanager
def replaced_whole(path: str):
    """A text file to write `path`'s new contents into: path.tmp, fsynced and renamed over `path` once
    the block ends, so that a kill mid-write leaves the old file or the new one, never one cut short.
    An error removes path.tmp; a kill leaves it, and the next write of `path` replaces it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def rng_states() -> dict:
    """This process's RNG states, as tensors and plain data (see load_state); for CUDA, its current
    GPU's (a process uses one, and asking for all of them would open a CUDA context on every GPU)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],  # 625 words of Mersenne Twister
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(int(x) for x in internal), gauss))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def _fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: str) -> None:
    for name in os.listdir(directory):
        _fsync(os.path.join(directory, name))
    _fsync(directory)


def _checkpoints(parent: str) -> list[tuple[int, str]]:
    """(step, directory) of every complete checkpoint, oldest first."""
    if not os.path.isdir(parent):
        return []
    found = []
    for name in os.listdir(parent):
        match = _STEP_DIR.fullmatch(name)
        if match and os.path.isfile(os.path.join(parent, name, STATE_FILE)):
            found.append((int(match.group(1)), os.path.join(parent, name)))
    return sorted(found)


def _prune(parent: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints."""
    for _, directory in _checkpoints(parent)[:-keep]:  # renamed first: a kill mid-delete leaves no half checkpoint
        doomed = os.path.join(parent, f".deleting-{os.path.basename(directory)}")
        os.rename(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(output_dir: str) -> None:
    """Delete what saves, replacements and prunes killed midway left in output_dir's checkpoints (none
    of it is a checkpoint). The next save does it too; a resume with no step left to take saves nothing."""
    parent = os.path.join(output_dir, CHECKPOINTS)
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        if name.startswith((".tmp-step-", ".step-", ".deleting-")):  # a save, replacement or prune that crashed midway
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
