"""Merge a LoRA adapter into its base: a full Hugging Face checkpoint whose weights are W + s B A.

    python examples/merge_lora.py runs/train_math/checkpoints/step-000600 runs/merged
    python examples/merge_lora.py my-adapter runs/merged --base Qwen/Qwen3-0.6B   # the base moved
    python examples/merge_lora.py runs/train_math/checkpoints/step-000900 runs/merged --overwrite

The adapter is a PEFT adapter directory (adapter_config.json, adapter_model.safetensors; local or a
Hub id), as a LoRA run's checkpoints are; its base is the config's base_model_name_or_path unless
--base names another. The merge is computed in fp32 and cast to --dtype once. The result loads in
minigrpo and in transformers alone (no peft), with the adapter directory's tokenizer, and computes
the adapted model's logits.

The output is written whole or not at all: into a temporary directory beside it, then renamed into
place (what a killed merge left there, the next save there deletes). It is a new or an empty
directory, or, with --overwrite, a Hugging Face checkpoint (a model's files and nothing else: no
adapter, trainer state, log or folder), which is then replaced whole. It is
never the adapter or its base, a directory that holds either, or one inside either (compared by real
paths: symlinks followed). All of this, and that a file can be written there, is checked before the
base is read; a full disk is one line, with nothing of the merge left.
"""

import os
import sys

import torch

import minigrpo
from minigrpo import files
from minigrpo.flags import OneLineErrors
from minigrpo.model import (
    is_adapter_directory,
    load_adapter,
    merged,
    output_problem,
    read_adapter_config,
    read_tokenizer,
    resolve_checkpoint,
)

parser = OneLineErrors(description=__doc__.splitlines()[0])
parser.add_argument("adapter", help="a PEFT adapter directory (a LoRA run's checkpoint) or Hub id")
parser.add_argument("output", help="the merged checkpoint's directory: new or empty (or see --overwrite)")
parser.add_argument("--base", help="the base model, where the adapter's config names one that moved")
parser.add_argument(
    "--dtype", choices=["float32", "bfloat16", "float16"], help="the merged weights' dtype (default: float32)"
)
parser.add_argument(
    "--overwrite",
    action="store_true",
    help="replace the checkpoint already in output, whole (never a directory holding anything else)",
)
args = parser.parse_args()


def fail(message):
    sys.exit(f"merge_lora.py: {message}")


def check_apart(output: str, inputs: dict[str, str | None]) -> None:
    """The output is no input, holds none (replacing it would delete it) and lies inside none, by real
    paths. inputs: role -> path; a Hub id or None is no local path, with nothing to compare."""
    real_output = os.path.realpath(output)
    for role, source in inputs.items():
        if not source or not os.path.exists(source):
            continue
        real_source = os.path.realpath(source)
        common = os.path.commonpath([real_output, real_source])
        if real_output == real_source:
            fail(f"the output directory {output} is the {role} {source}: write the merged model elsewhere")
        if common == real_output:
            fail(
                f"the output directory {output} holds the {role} {source}, which replacing it would delete: "
                "write the merged model elsewhere"
            )
        if common == real_source:
            fail(
                f"the output directory {output} lies inside the {role} {source}: "
                "write the merged model elsewhere"
            )


if not args.output:  # "" would be read as the working directory
    fail("the output directory is empty: name one, such as runs/merged")
try:
    adapter = resolve_checkpoint(args.adapter)  # a Hub id: downloaded into the Hugging Face cache
    if not is_adapter_directory(adapter):
        fail(f"{args.adapter} is not a LoRA adapter directory (no adapter_config.json, or a full model's)")
    base = args.base or read_adapter_config(adapter)[1]
    check_apart(args.output, {"adapter": adapter, "base": base})
    problem = output_problem(args.output, args.overwrite)  # a non-checkpoint, /proc, under a file, ...
    if problem:
        fail(f"the output directory {args.output} {problem}")
    # merged in fp32, cast once at the end
    if args.base:  # the adapter's own files on the base named here
        model, tokenizer = minigrpo.load_pretrained(args.base, dtype="float32")
        load_adapter(model, adapter)
        tokenizer = read_tokenizer(adapter) or tokenizer
    else:
        model, tokenizer = minigrpo.load_pretrained(adapter, dtype="float32")
    whole = merged(model).to(getattr(torch, args.dtype or "float32"))
    minigrpo.save_pretrained(whole, tokenizer, args.output)
except (ValueError, files.DiskFull) as error:  # a CheckpointError or AdapterError naming the file at fault
    fail(error)
print(f"merged {model.adapters.rank}-rank adapters on {len(model.layers)} layers into {args.output}")
