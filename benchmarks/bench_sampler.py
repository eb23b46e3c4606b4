"""Sampling throughput: minigrpo.generate (eager and compiled paths) beside transformers' generate.

    python benchmarks/bench_sampler.py                              # tiny and 0.6B shapes, batch 1, 8, 32
    python benchmarks/bench_sampler.py --shapes tiny --paths eager   # no compiling
    python benchmarks/bench_sampler.py --shapes "" --refill-rows 0 --compaction-batch 0 --tool-rows 0 \
        --packed-rows "" --naive-tokens 0                             # the LoRA table alone

Random weights, fp32, prompts of 64 tokens, EOS disabled, temperature 1.0, top_p 0.9; every
sampler holds the same weights in this process. "ms" is wall time of the whole call (prefill
included) divided by the new tokens, the median over `--rounds` rounds that run the samplers one
after the other. "eager" is `generate`'s default on CPU (compile="auto" or False); "compiled" is
compile=True after its graphs are built, and the compile time is reported apart. The roofline
floor of a decode step is max(weight bytes / copy bandwidth, 2 * params * batch / fp32 matmul
rate), both measured in this run; copy bandwidth counts bytes read plus bytes written.

Compile times are those of a cold start: the run uses a fresh inductor cache directory, unless
--warm-cache keeps torch's usual one (later runs then reuse its compiled kernels).

Then, with EOS on (1/64 of the vocabulary ends a completion, so lengths vary): refill under a row
budget (one call, `max_batch_rows` rows, rows = 4 x the budget) against the same prompts in
sequential chunks of the budget (each decodes until its longest row ends), as tokens per second
(the completions differ, their lengths follow the same distribution); and dropping finished rows
(compaction) against masking them.

Then tool calls (`--tool-rows`): models/minigrpo-tiny-calc on its own held-out problems at temperature
1, with the calculator and without it (the same prompts and seeds; without it a completion writes
on past its call unanswered). Tokens per second count every token, observations included; the
overhead per call is the time the calls add beyond what their tokens would cost at the tool-free
rate, over the number of calls.

Then LoRA (`--lora-rank`, adapters on all seven projections of every block, B drawn at random): ms
per new token of the model without adapters, with its adapters merged into a copy of each weight at
the call's start (`LoraLinear.MERGE_FOR_DECODING`, the sampler's way), and with the adapters as their
own small products beside the base's (the other way), eager path, median of `--rounds` rounds that
alternate the three, on `--lora-shapes`.

Last, the oneDNN-packed products against plain F.linear: ms per product for each shape's weights
that `layers.pack_for_decoding` packs, at `--packed-rows` rows, best of 3 x `--rounds` rounds that
alternate the two (one row included, which the sampler leaves plain).
"""

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

if "--warm-cache" not in sys.argv:  # before torch is imported: inductor reads it when it first compiles
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-sampler-inductor-")
    # the cold cache's compiled kernels go with the run
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import torch
import torch.nn.functional as F
from common import SHAPES, machine_line, random_model, transformers_twin

import minigrpo
import minigrpo.model.layers as layers
from minigrpo.config import LORA_TARGETS
from minigrpo.tasks import generate_problems, template
from minigrpo.tools import ToolRunner

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from reference_sampler import naive_generate  # noqa: E402  (the slow reference lives with the tests)

SETTINGS = dict(temperature=1.0, top_p=0.9)
CALC_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-calc")
PATHS = {"eager": False, "compiled": True}  # the compile= setting of each path


def prompts_for(batch, prompt_len, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt_len), generator=g).tolist()


def seconds(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def ours(model, prompts, new_tokens, path="eager", **extra):
    return minigrpo.generate(
        model, prompts, max_new_tokens=new_tokens, seed=0, compile=PATHS[path], **SETTINGS, **extra
    )


def transformers_generate(hf, prompts, new_tokens):
    ids = torch.tensor(prompts)
    return hf.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        top_k=0,
        **SETTINGS,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )


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
    new = args.new if shape == "tiny" else args.new_large
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.nbytes for p in model.parameters())
    warm = prompts_for(2, args.prompt, vocab)
    ours(model, warm, 4, "eager"), transformers_generate(hf, warm, 4)
    for batch in args.batches:
        prompts = prompts_for(batch, args.prompt, vocab, seed=batch)
        compile_s = None
        # the first call builds the graphs; a second, timed the same way, does not
        if "compiled" in args.paths:
            first, _ = seconds(lambda: ours(model, prompts, new, "compiled"))
            compile_s = first - seconds(lambda: ours(model, prompts, new, "compiled"))[0]
        times = {name: [] for name in ["transformers", *args.paths]}
        decode_ms = []
        for _ in range(args.rounds):
            times["transformers"].append(seconds(lambda: transformers_generate(hf, prompts, new))[0])
            for path in args.paths:
                t, samples = seconds(lambda: ours(model, prompts, new, path))
                assert all(len(x) == new for x in samples.tokens)
                times[path].append(t)
                if path == args.paths[0]:
                    decode_ms.append(samples.ms_per_step)
        ms = {name: 1e3 * statistics.median(ts) / new for name, ts in times.items()}
        floor_ms = 1e3 * max(weight_bytes / bandwidth, 2 * params * batch / flops)
        cells = " ".join(f"{ms[p]:9.1f} {ms['transformers'] / ms[p]:5.2f}x" for p in args.paths)
        decode = statistics.median(decode_ms)
        note = f"  compiling took {compile_s:.0f} s" if compile_s is not None else ""
        print(
            f"{shape:5} {batch:5} {ms['transformers']:9.1f} {cells} "
            f"{decode:9.1f} {floor_ms:8.1f} {decode / floor_ms:6.2f}{note}",
            flush=True,
        )
    if args.naive_tokens:
        naive_tokens = min(args.naive_tokens, new)
        t_naive, _ = seconds(
            lambda: naive_generate(
                model, prompts_for(1, args.prompt, vocab), max_new_tokens=naive_tokens, **SETTINGS
            )
        )
        print(
            f"{shape:5} naive no-cache sampler, batch 1, {naive_tokens} new tokens: "
            f"{1e3 * t_naive / naive_tokens:.1f} ms/step",
            flush=True,
        )
    return model


def bench_lora(shape, args):
    """ms per new token: no adapters, adapters merged for decoding, adapters as their own products."""
    from minigrpo.model import Adapters, adapter_state, add_adapters
    from minigrpo.model.lora import LoraLinear

    plain = random_model(shape)
    adapted = random_model(shape)
    add_adapters(adapted, Adapters(rank=args.lora_rank, alpha=32, targets=LORA_TARGETS), seed=0)
    with torch.no_grad():
        for name, p in adapter_state(adapted).items():
            if ".lora_B." in name:
                p.normal_(std=0.01)
    vocab = SHAPES[shape]["vocab_size"]
    new = args.new if shape == "tiny" else args.new_large

    def merged(prompts):
        LoraLinear.MERGE_FOR_DECODING = True
        return ours(adapted, prompts, new)

    def unmerged(prompts):
        LoraLinear.MERGE_FOR_DECODING = False
        try:
            return ours(adapted, prompts, new)
        finally:
            LoraLinear.MERGE_FOR_DECODING = True

    ways = {"none": lambda prompts: ours(plain, prompts, new), "merged": merged, "unmerged": unmerged}
    for batch in args.batches:
        prompts = prompts_for(batch, args.prompt, vocab, seed=batch)
        for way in ways.values():
            way(prompts_for(batch, 4, vocab))  # warm-up
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                times[name].append(seconds(lambda: way(prompts))[0])
        ms = {name: 1e3 * statistics.median(ts) / new for name, ts in times.items()}
        print(
            f"{shape:7} {batch:5} {ms['none']:9.2f} {ms['merged']:9.2f} {ms['unmerged']:9.2f} "
            f"{ms['unmerged'] / ms['merged']:8.2f}x {ms['merged'] / ms['none']:8.2f}x",
            flush=True,
        )


def bench_refill(model, shape, args):
    """Rows = 4 x max_batch_rows with varied lengths: one call under the budget against chunk after chunk."""
    vocab = SHAPES[shape]["vocab_size"]
    budget, new = args.refill_rows, args.new if shape == "tiny" else args.new_large
    prompts = prompts_for(4 * budget, args.prompt, vocab, seed=7)
    settings = dict(max_new_tokens=new, eos_token_ids=list(range(0, vocab, 64)), compile=False, **SETTINGS)
    rates = {"refill": [], "chunks": []}
    lengths = {"refill": [], "chunks": []}
    for round_ in range(args.rounds):
        t, out = seconds(
            lambda: minigrpo.generate(model, prompts, max_batch_rows=budget, seed=round_, **settings)
        )
        rates["refill"].append(out.num_tokens / t)
        lengths["refill"] += map(len, out.tokens)
        cache_mb = out.kv_cache_bytes / 1e6
        t, outs = seconds(
            lambda: [
                minigrpo.generate(model, prompts[i : i + budget], seed=100 * round_ + i, **settings)
                for i in range(0, len(prompts), budget)
            ]
        )
        rates["chunks"].append(sum(o.num_tokens for o in outs) / t)
        lengths["chunks"] += [len(x) for o in outs for x in o.tokens]
    a, b = statistics.median(rates["refill"]), statistics.median(rates["chunks"])
    mean = {k: sum(v) / len(v) for k, v in lengths.items()}
    print(
        f"{shape:5} {len(prompts):5} {budget:7} {a:12.0f} {b:12.0f} {a / b:6.2f}x   "
        f"mean length {mean['refill']:.0f} / {mean['chunks']:.0f}, "
        f"longest {max(lengths['refill'])} / {max(lengths['chunks'])}; KV cache {cache_mb:.1f} MB",
        flush=True,
    )


def bench_compaction(model, shape, batch, args):
    """EOS on: ~1/64 of the vocabulary ends a completion, so lengths spread over the new tokens."""
    vocab = SHAPES[shape]["vocab_size"]
    eos = list(range(0, vocab, 64))
    prompts = prompts_for(batch, args.prompt, vocab, seed=99)
    for compact in (True, False):
        t, samples = seconds(
            lambda: ours(model, prompts, args.new, "eager", eos_token_ids=eos, compact=compact)
        )
        lengths = [len(x) for x in samples.tokens]
        print(
            f"{shape:5} {batch:5} {'compact' if compact else 'mask':8} "
            f"{t:8.2f} s {samples.num_tokens / t:9.0f} tok/s  "
            f"lengths mean {sum(lengths) / len(lengths):.0f} max {max(lengths)}",
            flush=True,
        )


def bench_tools(args):
    """The tool case: one call with the calculator against the same rows without it."""
    model, tokenizer = minigrpo.load_pretrained(CALC_MODEL)
    problems = generate_problems("calc", args.tool_rows, "test", seed=0)
    prompts = [tokenizer.encode(template("tiny").render(p.question)) for p in problems]
    settings = dict(max_new_tokens=64, temperature=1.0, eos_token_ids=tokenizer.eos_token_ids)
    runs = {"tools": [], "none": []}  # per round: (seconds, tokens, calls, seconds rows waited for answers)
    for round_ in range(args.rounds):
        with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
            t, out = seconds(lambda: minigrpo.generate(model, prompts, tools=runner, seed=round_, **settings))
            calls = [call for r in range(len(prompts)) for call in runner.calls(r)]
        runs["tools"].append((t, out.num_tokens, len(calls), sum(call.seconds for call in calls)))
        t, out = seconds(lambda: minigrpo.generate(model, prompts, seed=round_, **settings))
        runs["none"].append((t, out.num_tokens, 0, 0.0))
    (t_with, n_with, calls, inside), (t_without, n_without, _, _) = (
        min(runs[k], key=lambda run: run[0] / run[1]) for k in ("tools", "none")
    )
    rate_with, rate_without = n_with / t_with, n_without / t_without
    overhead = (t_with - n_with / rate_without) / max(calls, 1)
    print(
        f"{len(prompts):5} {calls:6} {rate_with:12.0f} {rate_without:12.0f} {rate_with / rate_without:6.2f}x "
        f"{1e3 * overhead:10.2f} {1e3 * inside / max(calls, 1):9.3f}",
        flush=True,
    )


def bench_packing(shape, rows_list, rounds):
    """Plain / packed ms per product (ratio > 1: packed faster) for the shape's large weights."""
    c = SHAPES[shape]
    sizes = [
        (c["intermediate_size"], c["hidden_size"]),
        (c["hidden_size"], c["intermediate_size"]),
        (c["vocab_size"], c["hidden_size"]),
    ]
    for out_features, in_features in sizes:
        w = torch.randn(out_features, in_features) * 0.02
        repeat = max(1, 2**24 // w.numel())
        cells = []
        for rows in rows_list:
            x = torch.randn(rows, in_features)
            packed = packed_product(w, rows)
            if packed is None:
                break
            plain_ms, packed_ms = best_ms([lambda: F.linear(x, w), lambda: packed(x)], rounds, repeat)
            cells.append(f"{rows}: {plain_ms:.3f} / {packed_ms:.3f} ({plain_ms / packed_ms:.2f}x)")
        if cells:
            print(f"{shape:5} {out_features:6} x {in_features:<5} " + " | ".join(cells), flush=True)


def packed_product(w, rows):
    """pack_for_decoding's product for `w` at `rows` rows, one row included (None: not packable)."""
    min_rows = layers.PACK_MIN_ROWS
    layers.PACK_MIN_ROWS = 1
    try:
        return layers.pack_for_decoding(w, None, rows)
    finally:
        layers.PACK_MIN_ROWS = min_rows


def best_ms(fns, rounds, repeat):
    """Each function's best ms per call over `rounds` rounds of `repeat` calls, alternating their order."""
    best = [float("inf")] * len(fns)
    with torch.inference_mode():
        for fn in fns:
            fn()
        for r in range(rounds):
            for i in range(len(fns)) if r % 2 == 0 else reversed(range(len(fns))):
                t, _ = seconds(lambda: [fns[i]() for _ in range(repeat)])
                best[i] = min(best[i], 1e3 * t / repeat)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default="tiny,0.6b", help="comma-separated from: " + ", ".join(SHAPES) + " (empty: none)"
    )
    parser.add_argument("--batches", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument(
        "--paths",
        default="eager,compiled",
        type=lambda s: s.split(","),
        help="comma-separated from: " + ", ".join(PATHS),
    )
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new", type=int, default=128, help="new tokens per sample, tiny shape")
    parser.add_argument("--new-large", type=int, default=32, help="new tokens per sample, other shapes")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds per batch (the median is printed)"
    )
    parser.add_argument(
        "--naive-tokens", type=int, default=16, help="new tokens for the naive sampler (0: skip it)"
    )
    parser.add_argument(
        "--refill-rows", type=int, default=8, help="max_batch_rows of the refill table (0: skip it)"
    )
    parser.add_argument(
        "--compaction-batch", type=int, default=32, help="batch of the compaction table, tiny shape (0: skip)"
    )
    parser.add_argument(
        "--tool-rows", type=int, default=256, help="rows of the tool-call table, tiny-calc model (0: skip it)"
    )
    parser.add_argument(
        "--lora-rank", type=int, default=16, help="rank of the LoRA table's adapters (0: skip it)"
    )
    parser.add_argument("--lora-shapes", default="default,0.6b", help="shapes of the LoRA table")
    parser.add_argument(
        "--packed-rows", default="1,8,32", help="rows of the packed-products table (empty: skip it)"
    )
    parser.add_argument(
        "--warm-cache", action="store_true", help="keep torch's inductor cache (compile times then reuse it)"
    )
    args = parser.parse_args()
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        sys.exit(f"bench_sampler: unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    print(machine_line())
    bandwidth, flops = copy_bandwidth(), matmul_rate()
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s (measured now)")
    print(
        f"prompt {args.prompt}, new tokens {args.new} (tiny) / {args.new_large} (others), "
        "temperature 1.0, top_p 0.9, "
        f"EOS off; ms = call time / new tokens, median of {args.rounds}; ratio = transformers ms / ours"
    )
    cells = " ".join(f"{p + ' ms':>9} {'ratio':>6}" for p in args.paths)
    print(f"{'shape':5} {'batch':>5} {'hf ms':>9} {cells} {'decode ms':>9} {'floor ms':>8} {'/floor':>6}")
    models = {shape: bench_shape(shape, args, bandwidth, flops) for shape in args.shapes.split(",") if shape}
    if args.refill_rows:
        print(
            "\nrefill under a row budget vs sequential chunks of it "
            f"(EOS on, eager steps, median of {args.rounds})"
        )
        print(f"{'shape':5} {'rows':>5} {'budget':>7} {'refill tok/s':>12} {'chunks tok/s':>12} {'ratio':>7}")
        for shape, model in models.items():
            bench_refill(model, shape, args)
    if args.compaction_batch and "tiny" in models:
        print(
            f"\nfinished rows, EOS on, batch {args.compaction_batch}: "
            "dropped from the batch (compact) or kept (mask)"
        )
        bench_compaction(models["tiny"], "tiny", args.compaction_batch, args)
    if args.tool_rows:
        print(
            f"\ntool calls: minigrpo-tiny-calc, temperature 1, the calculator against none, "
            f"best of {args.rounds}; ms/call = time beyond the tokens' cost without tools, per call; "
            f"wait ms = a call's start to its answer in the row"
        )
        print(
            f"{'rows':>5} {'calls':>6} {'tools tok/s':>12} {'none tok/s':>12} {'ratio':>7} "
            f"{'ms/call':>10} {'wait ms':>9}"
        )
        bench_tools(args)
    if args.lora_rank:
        print(
            f"\nLoRA rank {args.lora_rank} on all linear projections, eager: ms per new token without "
            f"adapters, merged, unmerged; median of {args.rounds}"
        )
        print(
            f"{'shape':7} {'batch':>5} {'none ms':>9} {'merged':>9} {'unmerged':>9} "
            f"{'unm/mrg':>9} {'mrg/none':>9}"
        )
        for shape in args.lora_shapes.split(","):
            bench_lora(shape, args)
    if args.packed_rows:
        print(
            f"\noneDNN-packed vs plain F.linear, ms per product: plain / packed, best of {3 * args.rounds}",
            flush=True,
        )
        for shape in models:
            bench_packing(shape, [int(r) for r in args.packed_rows.split(",")], 3 * args.rounds)


if __name__ == "__main__":
    main()
