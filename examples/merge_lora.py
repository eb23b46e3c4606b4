"""Merge a LoRA adapter into its base: a full Hugging Face checkpoint whose weights are W + s B A.

    python examples/merge_lora.py runs/train_math/checkpoints/step-000600 runs/merged
    python examples/merge_lora.py my-adapter runs/merged --base Qwen/Qwen3-0.6B   # the base moved

The adapter is a PEFT adapter directory (adapter_config.json, adapter_model.safetensors), as a LoRA
run's checkpoints are; its base is the config's base_model_name_or_path unless --base names
another. The result loads in minigrpo and in transformers alone (no peft), with the adapter
directory's tokenizer, and computes the adapted model's logits. It is written whole or not at all.
"""

import argparse
import os
import sys

import minigrpo
from minigrpo.model import is_adapter_directory, load_adapter, merged, read_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("adapter", help="a PEFT adapter directory (a LoRA run's checkpoint)")
parser.add_argument("output", help="the merged checkpoint's directory (replaced whole if it exists)")
parser.add_argument("--base", help="the base model, where the adapter's config names one that moved")
parser.add_argument(
    "--dtype", choices=["float32", "bfloat16", "float16"], help="the merged weights' dtype (default: float32)"
)
args = parser.parse_args()


def fail(message):
    sys.exit(f"merge_lora.py: {message}")


if not os.path.isdir(args.adapter) or not is_adapter_directory(args.adapter):
    fail(f"{args.adapter} is not a LoRA adapter directory (it has no adapter_config.json)")
try:
    if args.base:  # the adapter's own files on the base named here
        model, tokenizer = minigrpo.load_pretrained(args.base, dtype=args.dtype)
        load_adapter(model, args.adapter)
        tokenizer = read_tokenizer(args.adapter) or tokenizer
    else:
        model, tokenizer = minigrpo.load_pretrained(args.adapter, dtype=args.dtype)
    minigrpo.save_pretrained(merged(model), tokenizer, args.output)
except ValueError as error:  # a CheckpointError or AdapterError naming the file at fault
    fail(error)
print(f"merged {model.adapters.rank}-rank adapters on {len(model.layers)} layers into {args.output}")
