"""Operator calls per decode step on CPU: how many small calls a sampled token costs, inside the decoder's
layers and outside them (the sampler's random numbers, top-k/top-p, the cache's bookkeeping).

    python benchmarks/count_ops.py                           # tiny shape, 8 rows, top_p 0.95
    python benchmarks/count_ops.py --rows 1 --top_p 1.0 --show 20

The eager path (generate's default on CPU, the code the CUDA graphs capture) under torch.profiler.
Counted: top-level operator calls, aten's and oneDNN's (a call made inside another is that call's work),
leaving out views and metadata calls that launch no kernel (VIEWS). A decode step's count is the
difference between two calls that differ only in their number of new tokens, divided by the
difference, so that the prompt's prefill and the call's set-up cancel; "per layer" is the same
difference over the calls made inside the decoder's blocks, divided by the number of blocks. EOS is
off, so every row decodes every step.
"""

import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, machine_line, random_model  # noqa: E402

import minigrpo  # noqa: E402
from minigrpo.model.qwen3 import Block  # noqa: E402

# aten calls that make no kernel: views of a tensor, its metadata, a no-op contiguous
VIEWS = {
    "aten::view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::_unsafe_view",
    "aten::transpose",
    "aten::permute",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::select",
    "aten::slice",
    "aten::expand",
    "aten::expand_as",
    "aten::as_strided",
    "aten::t",
    "aten::detach",
    "aten::alias",
    "aten::flatten",
    "aten::unflatten",
    "aten::view_as",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::narrow",
    "aten::unbind",
    "aten::contiguous",
    "aten::lift_fresh",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::result_type",
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
}
OPERATORS = ("aten::", "mkldnn::")  # torch's operators, and oneDNN's packed products (layers.py)
LAYER = "count_ops.layer"  # the record_function label around each decoder block


def labelled_blocks():
    """Block.forward inside a record_function label, so that its calls can be told apart."""
    forward = Block.forward

    def labelled(self, *args, **kwargs):
        with record_function(LAYER):
            return forward(self, *args, **kwargs)

    Block.forward = labelled
    return forward


def counted(model, prompts, new_tokens: int, top_p: float) -> tuple[collections.Counter, collections.Counter]:
    """(calls outside the blocks, calls inside them) by name, of one generate call."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        minigrpo.generate(model, prompts, max_new_tokens=new_tokens, temperature=1.0, top_p=top_p, seed=0)
    outside, inside = collections.Counter(), collections.Counter()
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith(OPERATORS) or event.name in VIEWS:
            continue
        if parent is not None and parent.name.startswith(OPERATORS):
            continue  # part of its parent's work
        in_layer = False
        while parent is not None:
            in_layer = in_layer or parent.name == LAYER
            parent = parent.cpu_parent
        (inside if in_layer else outside)[event.name] += 1
    return outside, inside


def per_step(short: collections.Counter, long: collections.Counter, steps: int) -> dict[str, float]:
    names = set(short) | set(long)
    return {name: (long[name] - short[name]) / steps for name in names if long[name] != short[name]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--top_p", type=float, default=0.95)
    parser.add_argument("--steps", type=int, default=8, help="decode steps between the two calls")
    parser.add_argument("--show", type=int, default=12, help="the most frequent calls listed, each part")
    args = parser.parse_args()
    print(machine_line())
    torch.manual_seed(0)
    model = random_model(args.shape)
    layers = model.config.num_hidden_layers
    prompts = torch.randint(0, model.config.vocab_size, (args.rows, args.prompt)).tolist()
    labelled_blocks()
    counted(model, prompts, 2, args.top_p)  # warm-up
    short = counted(model, prompts, 2, args.top_p)
    long = counted(model, prompts, 2 + args.steps, args.top_p)
    outside = per_step(short[0], long[0], args.steps)
    inside = {name: n / layers for name, n in per_step(short[1], long[1], args.steps).items()}
    print(
        f"shape {args.shape} ({layers} layers), {args.rows} rows, top_p {args.top_p}, eager on CPU: "
        f"operator calls per decode step"
    )
    print("| part | calls per decode step |\n|---|---:|")
    print(f"| per layer | {sum(inside.values()):.1f} |")
    print(f"| outside the layers | {sum(outside.values()):.1f} |")
    print(f"| whole step | {sum(inside.values()) * layers + sum(outside.values()):.1f} |")
    for title, calls in (("per layer", inside), ("outside the layers", outside)):
        top = sorted(calls.items(), key=lambda item: -item[1])[: args.show]
        print(f"\n{title}: " + ", ".join(f"{name.split('::')[-1]} {n:g}" for name, n in top))


if __name__ == "__main__":
    main()
