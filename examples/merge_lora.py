"""Merge a LoRA adapter into its base: a full Hugging Face checkpoint whose weights are W + s B A.

    python examples/merge_lora.py runs/train_math/checkpoints/step-000600 runs/merged
    python examples/merge_lora.py my-adapter runs/merged --base Qwen/Qwen3-0.6B   # the base moved

The adapter is a PEFT adapter directory (adapter_config.json, adapter_model.safetensors; local or a
Hub id), as a LoRA run's checkpoints are; its base is the config's base_model_name_or_path unless
--base names another. The merge is computed in fp32 and cast to --dtype once. The result loads in
minigrpo and in transformers alone (no peft), with the adapter directory's tokenizer, and computes
the adapted model's logits. It is written whole or not at all, never over the adapter or its base.
"""

import os
import sys

import torch

import minigrpo
from minigrpo import files
from minigrpo.flags import OneLineErrors
from minigrpo.model import is_adapter_directory, load_adapter, merged, read_adapter_config, read_tokenizer

parser = OneLineErrors(description=__doc__.splitlines()[0])
parser.add_argument("adapter", help="a PEFT adapter directory (a LoRA run's checkpoint)")
parser.add_argument("output", help="the merged checkpoint's directory (replaced whole if it exists)")
parser.add_argument("--base", help="the base model, where the adapter's config names one that moved")
parser.add_argument(
    "--dtype", choices=["float32", "bfloat16", "float16"], help="the merged weights' dtype (default: float32)"
)
args = parser.parse_args()


def fail(message):
    sys.exit(f"merge_lora.py: {message}")


def same_directory(a: str, b: str | None) -> bool:
    return bool(b) and os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)


if os.path.isdir(args.adapter) and not is_adapter_directory(args.adapter):
    fail(
        f"{args.adapter} is not a LoRA adapter directory (it has no adapter_config.json, or is a full model)"
    )
try:
    base = args.base
    if base is None and os.path.isdir(args.adapter):
        base = read_adapter_config(args.adapter)[1]
    for source in (args.adapter, base):
        if same_directory(args.output, source):  # it would be replaced, and the adapter's base with it
            fail(f"the output directory {args.output} is {source}: write the merged model elsewhere")
    # merged in fp32 (or the base's precision), cast once at the end
    if args.base:  # the adapter's own files on the base named here
        model, tokenizer = minigrpo.load_pretrained(args.base, dtype="float32")
        load_adapter(model, args.adapter)
        tokenizer = read_tokenizer(args.adapter) or tokenizer
    else:
        model, tokenizer = minigrpo.load_pretrained(args.adapter, dtype="float32")
    if model.adapters is None:
        fail(f"{args.adapter} holds no LoRA adapters")
    whole = merged(model).to(getattr(torch, args.dtype or "float32"))
    minigrpo.save_pretrained(whole, tokenizer, args.output)
except (ValueError, files.DiskFull) as error:  # a CheckpointError or AdapterError naming the file at fault
    fail(error)
print(f"merged {model.adapters.rank}-rank adapters on {len(model.layers)} layers into {args.output}")
