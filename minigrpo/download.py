"""Fetch a Qwen3 checkpoint from the Hugging Face Hub into models/ (or any directory).

    python -m minigrpo.download Qwen/Qwen3-0.6B            # -> models/Qwen3-0.6B
    python -m minigrpo.download Qwen/Qwen3-0.6B --dir /data/qwen

Only the files a checkpoint needs are fetched (config, tokenizer, safetensors weights).
"""

import argparse
import os
import sys

from .model import CheckpointError, download

MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigrpo.download", description=__doc__.splitlines()[0])
    parser.add_argument("repo_id", help="Hub repo id, e.g. Qwen/Qwen3-0.6B")
    parser.add_argument("--dir", help="target directory (default: models/<name>)")
    parser.add_argument("--revision", help="branch, tag or commit (default: main)")
    args = parser.parse_args(argv)
    target = args.dir or os.path.join(MODELS_DIR, args.repo_id.split("/")[-1])
    try:
        path = download(args.repo_id, local_dir=target, revision=args.revision)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.repo_id} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
