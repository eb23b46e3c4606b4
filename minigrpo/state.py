"""End of the loop, checkpoint: training state that a run resumes from exactly.

A checkpoint is `output_dir/checkpoints/step-000012/`: the policy in Hugging Face layout
(config.json, model.safetensors, tokenizer files: loadable by `load_pretrained` and by
transformers) plus trainer_state.pt (optimizer, scheduler, step, data position, every RNG
state, the configs). It is written into a temporary sibling directory and renamed into place,
so a crash while saving leaves the earlier checkpoints as they were and never a partial one.
It knows files and state dicts, not how they are used.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile

import numpy as np
import torch

from .checkpoint import replace_dir, write_files

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
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
        replace_dir(tmp, final)  # the same step saved again: the old copy goes only once the new one is in place
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(parent, keep)
    return final


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in output_dir, or None."""
    steps = _checkpoints(os.path.join(output_dir, CHECKPOINTS))
    return steps[-1][1] if steps else None


def load_state(checkpoint: str) -> dict:
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint} is not a training checkpoint: it has no {STATE_FILE}")
    return torch.load(path, weights_only=False)  # our own file: it holds Python RNG states and configs


def rng_states() -> dict:
    """This process's RNG states; for CUDA, its current GPU's (a process uses one, and asking for
    all of them would open a CUDA context on every GPU of the node)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):  # minigrpo 0.1 saved every GPU's
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)


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
    """Delete all but the newest `keep` checkpoints, and what crashed saves left behind."""
    for _, directory in _checkpoints(parent)[:-keep]:
        shutil.rmtree(directory, ignore_errors=True)
    for name in os.listdir(parent):
        if name.startswith((".tmp-step-", ".step-")):  # a save or a replacement that crashed midway
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
