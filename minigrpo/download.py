"""Fetch a Qwen3 checkpoint from the Hugging Face Hub into models/ (or any directory).

    python -m minigrpo.download Qwen/Qwen3-0.6B            # -> models/Qwen3-0.6B
    python -m minigrpo.download Qwen/Qwen3-0.6B --dir /data/qwen

Only the files a checkpoint needs are fetched (config, tokenizer, safetensors weights). The directory is
new, empty, or an earlier download, which the download completes or updates file by file; one that holds
anything else is refused (its files of a checkpoint's names would be written over). Every error is one
line, the repo id and the directory checked before the Hub is asked.
"""

import os
import sys

from huggingface_hub.utils import HFValidationError, validate_repo_id

from .flags import OneLineErrors
from .model import CHECKPOINT_FILES, CheckpointError, download, output_problem

PROG = "python -m minigrpo.download"
MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
# what a download writes: the files fetched, and huggingface_hub's record of them (.cache/huggingface)
DOWNLOADED = (*CHECKPOINT_FILES, ".cache")


def main(argv=None) -> int:
    parser = OneLineErrors(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("repo_id", help="Hub repo id, e.g. Qwen/Qwen3-0.6B")
    parser.add_argument(
        "--dir", help="target directory: new, empty or an earlier download (default: models/<name>)"
    )
    parser.add_argument("--revision", help="branch, tag or commit (default: main)")
    args = parser.parse_args(argv)
    try:
        validate_repo_id(args.repo_id)  # before it names the default directory ("Qwen/.." would be models/..)
    except HFValidationError:
        sys.exit(f"{PROG}: {args.repo_id!r} is not a Hugging Face repo id, such as Qwen/Qwen3-0.6B")
    if args.dir == "":  # "" would be read as the working directory
        sys.exit(f"{PROG}: --dir is empty: name a directory, or leave it out for models/<name>")
    target = args.dir or os.path.join(MODELS_DIR, args.repo_id.split("/")[-1])
    problem = output_problem(target, overwrite=True, also=DOWNLOADED)  # an earlier download is completed
    if problem:
        sys.exit(f"{PROG}: the target directory {target} {problem}")
    try:
        path = download(args.repo_id, local_dir=target, revision=args.revision)
    except CheckpointError as e:
        sys.exit(f"{PROG}: {e}")
    print(f"{args.repo_id} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
