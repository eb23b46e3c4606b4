"""Before the loop: where a checkpoint's files are. A local directory as it is, or a Hugging Face Hub repo
id whose files (only those a checkpoint needs) are fetched into the Hugging Face cache; the directory
that holds its tokenizer (an adapter directory's base's, when PEFT wrote none beside the adapters).
In: a path or a repo id. Out: a local directory, or a CheckpointError naming what is missing. Every
reader of a checkpoint's files asks here whether one is there (`present`: a named pipe is refused,
never opened) and reads its JSON (`read_json`). It knows paths and the Hub, not what the files hold.
"""

from __future__ import annotations

import os
import re

from ..files import read_json_object, regular_file
from .adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_directory, read_adapter_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# the files a checkpoint needs, the only ones fetched from the Hub
CHECKPOINT_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "*.safetensors",
    INDEX_FILE,
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written; the message names the file or tensor."""


def resolve_checkpoint(path_or_repo_id: str, revision: str | None = None) -> str:
    """A local directory as is, or a Hub repo id downloaded (only the files we need) to the HF cache."""
    if os.path.isdir(path_or_repo_id):
        return path_or_repo_id
    if os.path.exists(path_or_repo_id):
        raise CheckpointError(
            f"{path_or_repo_id} is a file; a checkpoint is a directory with config.json and *.safetensors"
        )
    looks_local = os.path.isdir(path_or_repo_id.split("/")[0])  # "models/x" when ./models exists
    if looks_local or not re.fullmatch(r"[\w.-]+/[\w.-]+", path_or_repo_id):
        raise CheckpointError(f"no such checkpoint directory: {path_or_repo_id}")
    return download(path_or_repo_id, revision=revision)


def download(repo_id: str, local_dir: str | None = None, revision: str | None = None) -> str:
    """Fetch a checkpoint's files from the Hugging Face Hub; returns the local directory."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            repo_id, revision=revision, local_dir=local_dir, allow_patterns=CHECKPOINT_FILES
        )
    except Exception as e:  # offline, unknown repo, gated repo, network error: all end here
        raise CheckpointError(
            f"could not fetch {repo_id!r} from the Hugging Face Hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
            "Check the repo id and your network, or pass a local directory (see models/README.md)."
        ) from None


def tokenizer_directory(path_or_repo_id: str) -> str:
    """Where a checkpoint's tokenizer files are: its own directory, or for an adapter directory without
    them (PEFT writes none), its base's."""
    directory = resolve_checkpoint(path_or_repo_id)
    if not is_adapter_directory(directory) or present(os.path.join(directory, "tokenizer.json")):
        return directory
    _, base = read_adapter_config(directory)
    if not base:
        raise CheckpointError(f"{directory} has no tokenizer.json, and its adapter_config.json names no base")
    return resolve_checkpoint(base)


def present(path: str) -> bool:
    """Whether the file is there (files.regular_file): a named pipe or a directory in its place is a
    CheckpointError naming it, never opened (a pipe's read would wait for a writer for ever)."""
    try:
        return regular_file(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_json(path: str, holding: str) -> dict:
    try:
        return read_json_object(path, holding)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
