"""End of the loop, checkpoint: training state that a run resumes from exactly.

A checkpoint is `output_dir/checkpoints/step-000012/`: the policy in Hugging Face layout
(config.json, model.safetensors, tokenizer files: loadable by `load_pretrained` and by
transformers; a LoRA run's, its adapters alone in PEFT's files, loadable by `load_pretrained` and by
peft on transformers) plus trainer_state.pt (optimizer, step, data position, every RNG state, the
configs, the entropy bonus's adaptive coefficient when the run has one, a LoRA run's sha256 of its
base's weights, a distilling run's sha256 of its teacher's weights, the teacher itself unsaved; the
learning rate is a function of the step, so there is no scheduler to save), and last checksums.json,
the sha256 of every other file. It is written into a temporary sibling directory
and renamed into place, so a crash while saving leaves the earlier checkpoints as they were and never
a partial one. A resume verifies the checksums (hashing reads every byte: seconds for a 0.6B model's
checkpoint, at each save and each resume) and skips a damaged checkpoint for the one before it. A
full disk is one DiskFull line naming the path and the free space, with nothing of the write left
behind. Beside the checkpoints it keeps output_dir/initial_eval.json, the starting policy's score
that --resume reads back; `replaced_whole` (`replace_json`) is its write-then-rename, also used for
summary.json and trace.html.
The format of trainer_state.pt is here alone (`trainer_state`, `restore`, STATE_KEYS).
In: a directory, a step, the model and the trainer. Out: files, and the state read back into a trainer.
It knows files and state dicts, not how the loop uses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import shutil
import tempfile

import numpy as np
import torch

from ..config import as_dict
from ..files import disk_full_named, fsync, fsync_tree, read_json_object, replace_dir, replace_json
from ..model import check_tensors, read_tokenizer, write_files

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
CHECKSUMS = "checksums.json"  # in each checkpoint, written last: {"sha256": {file name: hex digest}}
INITIAL_EVALUATION = "initial_eval.json"  # in output_dir: the starting policy's score, kept across resumes
_STEP_DIR = re.compile(r"step-(\d+)")
# What trainer_state.pt holds (`trainer_state`); a checkpoint that lacks one of these keys is damaged.
STATE_KEYS = ("step", "optimizer", "data", "rng", "model_path", "configs")


def save_checkpoint(
    output_dir: str,
    step: int,
    model,
    tokenizer,
    state: dict,
    keep: int,
    *,
    weights: dict | None = None,
    base: str | None = None,
) -> str:
    """Write checkpoint `step` atomically, keep the newest `keep`; returns its directory. `weights`:
    the model's whole state dict, when the model itself holds only a shard of it (FSDP2); `base`: the
    base an adapted model's adapters name (by default its name_or_path, weights.write_files)."""
    parent = os.path.join(output_dir, CHECKPOINTS)
    final = os.path.join(parent, f"step-{step:06d}")
    with disk_full_named(final):
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-step-", dir=parent)
        try:
            write_files(model, tokenizer, tmp, weights=weights, base=base)
            with open(os.path.join(tmp, STATE_FILE), "wb") as f:  # a Python file: a full disk raises ENOSPC
                torch.save(state, f)
            write_checksums(tmp)  # last: it covers every file above
            # on disk before it is published: a power cut cannot leave a renamed, empty checkpoint
            fsync_tree(tmp)
            # the same step saved again: the old copy goes only once the new one is in place
            replace_dir(tmp, final)
            fsync(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _prune(parent, keep)
    remove_leftovers(output_dir)
    return final


def write_checksums(directory: str) -> None:
    """CHECKSUMS in `directory`: the sha256 of every other file there."""
    names = sorted(name for name in os.listdir(directory) if name != CHECKSUMS)
    digests = {name: _sha256(os.path.join(directory, name)) for name in names}
    with open(os.path.join(directory, CHECKSUMS), "w", encoding="utf-8") as f:
        json.dump({"sha256": digests}, f, indent=1)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):  # 1 MiB at a time: a checkpoint need not fit in memory
            digest.update(block)
    return digest.hexdigest()


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in output_dir, or None."""
    steps = _checkpoints(os.path.join(output_dir, CHECKPOINTS))
    return steps[-1][1] if steps else None


def latest_intact_checkpoint(output_dir: str, note=print, required: tuple[str, ...] = ()) -> str | None:
    """The newest checkpoint whose files all read back and match their checksums (a crash, a full disk
    or a bad copy can damage one), its trainer state holding the `required` keys; each damaged one
    skipped on the way is named through `note`."""
    for _, directory in reversed(_checkpoints(os.path.join(output_dir, CHECKPOINTS))):
        damage = _damage(directory, required)
        if damage is None:
            if not os.path.exists(os.path.join(directory, CHECKSUMS)):
                note(
                    f"note: {directory} has no {CHECKSUMS} (saved by an older minigrpo): its files are read, "
                    "not verified"
                )
            return directory
        note(f"note: {directory} is damaged ({damage}); trying the checkpoint before it")
    return None


def _damage(directory: str, required: tuple[str, ...]) -> str | None:
    """Why the checkpoint in `directory` cannot be resumed from, or None: its state loads and holds the
    `required` keys, its config parses, every tensor it implies is in the weights files with its shape
    and all its bytes, its tokenizer (if any) loads, and every file matches its checksum."""
    try:
        state = load_state(directory)
        if not isinstance(state, dict):
            return f"{STATE_FILE} holds a {type(state).__name__}, not a dict"
        missing = [key for key in required if key not in state]
        if missing:
            return f"{STATE_FILE} lacks {', '.join(missing)}"
        check_tensors(directory)  # safetensors checks each header and the file's length against it
        read_tokenizer(directory)
        return _checksum_damage(directory)
    except Exception as error:  # a truncated pickle, zip or safetensors file, bad JSON, a missing file
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")


def _checksum_damage(directory: str) -> str | None:
    """The first file of `directory` that is missing or differs from its CHECKSUMS entry, said; None if
    all match, or if there is no CHECKSUMS (a checkpoint of an older minigrpo)."""
    path = os.path.join(directory, CHECKSUMS)
    if not os.path.exists(path):
        return None
    digests = read_json_object(path, "the checkpoint's checksums").get("sha256")
    if not isinstance(digests, dict):
        return f"{CHECKSUMS} has no sha256 mapping of file names to digests"
    for name, digest in digests.items():
        if not os.path.isfile(os.path.join(directory, name)):
            return f"{name} is missing"
        if _sha256(os.path.join(directory, name)) != digest:
            return f"{name} does not match its sha256 in {CHECKSUMS}: its bytes changed after the save"
    return None


def load_state(checkpoint: str) -> dict:
    """trainer_state.pt, loaded as data only (`weights_only=True`): a crafted file cannot run code."""
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint} is not a training checkpoint: it has no {STATE_FILE}")
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path} holds more than tensors and plain data (written by minigrpo before 0.2, or "
            f"not by minigrpo), so it is not loaded: {str(error).splitlines()[0]}"
        ) from None


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


def rng_states() -> dict:
    """This process's RNG states, as tensors and plain data (see load_state); for CUDA, its current
    GPU's (a process uses one, and asking for all of them would open a CUDA context on every GPU)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states = {
        # 625 words of Mersenne Twister
        "python": [
            version,
            torch.tensor(internal, dtype=torch.int64),
            gauss,
        ],
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
    np.random.set_state(
        (kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), position, has_gauss, cached)
    )
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
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
    """Delete all but the newest `keep` checkpoints."""
    # renamed first: a kill mid-delete leaves no half checkpoint
    for _, directory in _checkpoints(parent)[:-keep]:
        doomed = os.path.join(parent, f".deleting-{os.path.basename(directory)}")
        os.rename(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(output_dir: str) -> None:
    """Delete what saves, replacements and prunes killed midway left in output_dir's checkpoints (none
    of it is a checkpoint). The next save does it too; a resume with no step left to take saves nothing."""
    parent = os.path.join(output_dir, CHECKPOINTS)
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        # a save, replacement or prune that crashed midway
        if name.startswith((".tmp-step-", ".step-", ".deleting-")):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


# -- trainer_state.pt: everything but the weights ---------------------------------------------------
def trainer_state(trainer, wall_seconds: float) -> dict:
    """The trainer's state as trainer_state.pt holds it (STATE_KEYS, and the run's wall time so far: a
    resume adds on, a killed process too); every rank must call it (it gathers)."""
    state = {
        "step": trainer.step,
        "optimizer": trainer.policy.optimizer_state(trainer.optimizer),
        "data": trainer.stream.state(),
        "rng": trainer.dist.gather(rng_states()),  # one per rank
        "model_path": trainer.model_path,
        "base_sha256": trainer.plan.base_sha256,  # a LoRA run's base's weights (None: trained whole)
        "teacher_sha256": trainer.plan.teacher_sha256,  # the teacher's weights (None: no teacher)
        "configs": as_dict(trainer.grpo, trainer.config),
        "wall_seconds": wall_seconds,
    }
    entropy = trainer.updater.entropy_state()
    if entropy is not None:  # the entropy bonus's coefficient and last entropy (update/entropy.py)
        state["entropy_control"] = entropy
    return state


def restore(trainer, state: dict) -> float:
    """`trainer_state` read back into a trainer built afresh: its step, AdamW state and prompt stream
    (Trainer.resume_at), this rank's RNG states; returns the run's wall time up to the checkpoint (0 when
    the checkpoint has none)."""
    trainer.resume_at(state["step"], state["optimizer"], state["data"])
    trainer.updater.load_entropy_state(state.get("entropy_control"))
    rng = state["rng"]  # one per rank
    dist = trainer.dist
    if len(rng) == dist.world_size:
        set_rng_states(rng[dist.rank])
    else:  # nothing in the loop draws from them (its seeds derive from seed and step), so go on
        dist.print(
            f"note: the checkpoint holds RNG states of {len(rng)} ranks, this run has "
            f"{dist.world_size}: global RNGs start afresh"
        )
    return float(state.get("wall_seconds", 0.0))
