"""Sampling throughput: minigrpo.generate beside transformers' generate and the naive no-cache sampler.

    python benchmarks/bench_sampler.py                          # tiny and 0.6B shapes, batch 1, 8, 32
    python benchmarks/bench_sampler.py --shapes tiny --compile  # also time torch.compile'd decode steps

Random weights, fp32, prompts of 64 tokens, 128 new tokens with EOS disabled, temperature 1.0,
top_p 0.9; both models hold the same weights in this process. "ms/step" is wall time of the whole
call (prefill included) divided by the new tokens, for every sampler alike. The roofline floor of a
decode step is max(weight bytes / copy bandwidth, 2 * params * batch / fp32 matmul rate), both
measured in this run; copy bandwidth counts bytes read plus bytes written (the STREAM convention).
A last table compares dropping finished rows (compaction) with masking them, with EOS enabled.
"""

import argparse
import os
import sys
import time

import torch
from common import SHAPES, machine_line, random_model, transformers_twin

import minigrpo

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from reference_sampler import naive_generate  # noqa: E402  (the slow reference lives with the tests)

SETTINGS = dict(temperature=1.0, top_p=0.9)


def prompts_for(batch, prompt_len, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt_len), generator=g).tolist()


def seconds(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def ours(model, prompts, new_tokens, **extra):
    return minigrpo.generate(model, prompts, max_new_tokens=new_tokens, seed=0, **SETTINGS, **extra)


def transformers_generate(hf, prompts, new_tokens):
    ids = torch.tensor(prompts)
    return hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, **SETTINGS,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)


def copy_bandwidth() -> float:
    src = torch.ones(2**27)  # 512 MB
    dst = torch.empty_like(src)
    best = min(seconds(lambda: dst.copy_(src))[0] for _ in range(5))
    return 2 * src.nbytes / best


def matmul_rate() -> float:
    a = torch.randn(2048, 2048)
    a @ a
    best = min(seconds(lambda: a @ a)[0] for _ in range(5))
    return 2 * 2048**3 / best


def bench_shape(shape, args, bandwidth, flops):
    model = random_model(shape)
    hf = transformers_twin(model)
    vocab = SHAPES[shape]["vocab_size"]
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.nbytes for p in model.parameters())
    ours(model, prompts_for(2, args.prompt, vocab), 4), transformers_generate(hf, prompts_for(2, args.prompt, vocab), 4)  # warm-up
    for batch in args.batches:
        prompts = prompts_for(batch, args.prompt, vocab, seed=batch)
        t_hf, _ = seconds(lambda: transformers_generate(hf, prompts, args.new))
        t_ours, samples = seconds(lambda: ours(model, prompts, args.new))
        assert all(len(t) == args.new for t in samples.tokens)
        floor_ms = 1e3 * max(weight_bytes / bandwidth, 2 * params * batch / flops)
        row = dict(ours=1e3 * t_ours / args.new, hf=1e3 * t_hf / args.new, decode=samples.ms_per_step, floor=floor_ms)
        if args.compile:
            compile_s, _ = seconds(lambda: ours(model, prompts, args.new, compile=True))  # first call compiles
            row["compiled"] = 1e3 * seconds(lambda: ours(model, prompts, args.new, compile=True))[0] / args.new
            row["compile_s"] = compile_s
        report(shape, batch, row, args.new)
    naive_tokens = args.naive_tokens if shape != "tiny" else args.new
    t_naive, _ = seconds(lambda: naive_generate(model, prompts_for(1, args.prompt, vocab), max_new_tokens=naive_tokens, **SETTINGS))
    print(f"{shape:5} naive no-cache sampler, batch 1, {naive_tokens} new tokens: {1e3 * t_naive / naive_tokens:.1f} ms/step", flush=True)
    return model


def report(shape, batch, row, new):
    tok_s = lambda ms: batch * 1e3 / ms  # noqa: E731
    line = (f"{shape:5} {batch:5} {row['ours']:9.1f} {row['hf']:9.1f} {row['ours'] and row['hf'] / row['ours']:6.2f}x "
            f"{tok_s(row['ours']):9.0f} {tok_s(row['hf']):9.0f} {row['decode']:9.1f} {row['floor']:8.1f} {row['decode'] / row['floor']:6.2f}")
    if "compiled" in row:
        line += f" {row['compiled']:9.1f} ({row['compile_s']:.0f} s to compile)"
    print(line, flush=True)


def bench_compaction(model, shape, batch, args):
    """EOS on: ~1/64 of the vocabulary ends a completion, so lengths spread over the 128 tokens."""
    vocab = SHAPES[shape]["vocab_size"]
    eos = list(range(0, vocab, 64))
    prompts = prompts_for(batch, args.prompt, vocab, seed=99)
    for compact in (True, False):
        t, samples = seconds(lambda: ours(model, prompts, args.new, eos_token_ids=eos, compact=compact))
        lengths = [len(x) for x in samples.tokens]
        print(f"{shape:5} {batch:5} {'compact' if compact else 'mask':8} {t:8.2f} s {samples.num_tokens / t:9.0f} tok/s  "
              f"lengths mean {sum(lengths) / len(lengths):.0f} max {max(lengths)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,0.6b", help="comma-separated from: " + ", ".join(SHAPES))
    parser.add_argument("--batches", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new", type=int, default=128, help="new tokens per sample")
    parser.add_argument("--naive-tokens", type=int, default=16, help="new tokens for the naive sampler beyond the tiny shape")
    parser.add_argument("--compile", action="store_true", help="also time compile=True (minutes of compiling)")
    parser.add_argument("--compaction-batch", type=int, default=32, help="batch of the EOS compaction table (0: skip)")
    args = parser.parse_args()
    print(machine_line())
    bandwidth, flops = copy_bandwidth(), matmul_rate()
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s (measured now)")
    print(f"prompt {args.prompt}, {args.new} new tokens, temperature 1.0, top_p 0.9, EOS off; ms/step = call time / new tokens")
    header = f"{'shape':5} {'batch':>5} {'ours ms':>9} {'hf ms':>9} {'ratio':>7} {'ours t/s':>9} {'hf t/s':>9} {'decode ms':>9} {'floor ms':>8} {'/floor':>6}"
    print(header + (f" {'compiled':>9}" if args.compile else ""))
    models = {shape: bench_shape(shape, args, bandwidth, flops) for shape in args.shapes.split(",")}
    if args.compaction_batch:
        print(f"\nfinished rows, EOS on, batch {args.compaction_batch}: dropped from the batch (compact) or kept (mask)")
        for shape, model in models.items():
            bench_compaction(model, shape, args.compaction_batch, args)


if __name__ == "__main__":
    main()
