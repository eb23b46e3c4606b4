"""Forward and forward+backward tokens/s of minigrpo's Qwen3 beside transformers' with the same weights.

    python benchmarks/bench_forward.py                       # tiny and 0.6B shapes, fp32, CPU
    python benchmarks/bench_forward.py --shapes tiny --batch 8 --seq 256

Random weights; both models run in this process on the same inputs. Each round times one call of each, back to
back in alternating order, and the printed ratio is the median over rounds of ours / transformers speed (>=
1.0 means minigrpo is no slower), so that machine drift cancels. The loss for the backward pass is a
cross-entropy on random targets over the full vocabulary, as a training step would compute.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from common import SHAPES, machine_line, random_model, transformers_twin


def logits_of(model, ids):
    out = model(ids)
    return out if torch.is_tensor(out) else out.logits


def forward(model, ids):
    with torch.no_grad():
        logits_of(model, ids)


def forward_backward(model, ids, targets):
    model.zero_grad(set_to_none=True)
    logits = logits_of(model, ids)
    F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()


def bench_shape(shape, batch, seq, rounds, dtype):
    ours = random_model(shape, dtype)
    theirs = transformers_twin(ours)
    vocab = SHAPES[shape]["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))
    passes = {
        "forward": lambda m: forward(m, ids),
        "forward+backward": lambda m: forward_backward(m, ids, targets),
    }
    rows = []
    for label, run in passes.items():
        run(ours), run(theirs)  # warm-up
        pairs = [paired_seconds(run, ours, theirs) for _ in range(rounds)]
        ours_s = statistics.median(p[0] for p in pairs)
        theirs_s = statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[1] / p[0] for p in pairs)  # per round, so that drift cancels
        rows.append((shape, label, batch * seq / ours_s, batch * seq / theirs_s, ratio))
    return rows


def paired_seconds(run, ours, theirs):
    """One timed call of each, back to back; the order alternates by coin-free parity of a counter."""
    paired_seconds.calls = getattr(paired_seconds, "calls", 0) + 1
    order = (ours, theirs) if paired_seconds.calls % 2 else (theirs, ours)
    seconds = {}
    for model in order:
        start = time.perf_counter()
        run(model)
        seconds[id(model)] = time.perf_counter() - start
    return seconds[id(ours)], seconds[id(theirs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,0.6b", help="comma-separated from: " + ", ".join(SHAPES))
    parser.add_argument(
        "--batch", type=int, default=None, help="sequences per pass (default: 8 tiny, 1 for 0.6b)"
    )
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds, each one call per model (default: 15 tiny, 5 for 0.6b)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    print(machine_line())
    print(
        f"{'shape':6} {'pass':17} {'batch x seq':>11} {'ours tok/s':>11} "
        f"{'transformers tok/s':>19} {'ratio':>6}"
    )
    for shape in args.shapes.split(","):
        batch, rounds = (
            args.batch or (8 if shape == "tiny" else 1),
            args.rounds or (15 if shape == "tiny" else 5),
        )
        for shape_, label, ours, theirs, ratio in bench_shape(
            shape, batch, args.seq, rounds, getattr(torch, args.dtype)
        ):
            print(
                f"{shape_:6} {label:17} {f'{batch} x {args.seq}':>11} "
                f"{ours:11.0f} {theirs:19.0f} {ratio:6.2f}",
                flush=True,
            )
    print(
        f"({args.dtype}; tok/s are medians over rounds; "
        "ratio = median over rounds of ours / transformers speed)"
    )


if __name__ == "__main__":
    main()
