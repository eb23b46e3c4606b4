"""Everything minigrpo does differently on a GPU, measured in one run of at most 8 minutes, on random
weights in the real shapes (no download): one report, printed as it goes, to paste into
benchmarks/README.md.

    python benchmarks/gpu_check.py             # one or two GPUs: the full report
    python benchmarks/gpu_check.py --quick     # each part at its smallest size
    python benchmarks/gpu_check.py --dry-run   # CPU, tiny shapes: every part runs (the suite's smoke test)

It ends with the targets of the GPU issues, each with its measured figure.

The parts:
  sampler   Qwen3-0.6B shape in bf16: minigrpo eager (compile=False), minigrpo's CUDA graphs (compile="auto",
            the default on a GPU), transformers' generate (when installed), at batch 1 / 64 / 256, prompt
            128, 512 new tokens: each path's first call and warm-up, ms per decode step, tokens/s, the step
            against its HBM floor (the weight and KV-cache bytes a step reads, over the copy bandwidth
            measured in the same run) and against transformers
  nanovllm  nano-vllm's bench.py shape: 256 prompts of 100-1024 random tokens, 100-1024 new tokens each
            (EOS ignored), temperature 0.6, seeded: output tokens/s, beside the figures nano-vllm publishes
  train_math  examples/train_math.py with every setting its default but --device: held-out accuracy
            before and after, seconds per step, the graphs' warm-up (time/warmup)
  update    the same shape: peak max_memory_allocated and tokens/s of forward + backward on
            16 x (128 + 512) tokens, the chunked LM head against full logits
  grpo      10 GRPO steps on random 0.6B-shape weights with a synthetic reward: seconds per stage, and the
            sampler-trainer mismatch (mismatch/*) with bf16 sampling against an fp32 update, and with both
            in bf16
  trl       the grpo part's job under TRL's GRPOTrainer (use_vllm=False, transformers' generate) and under
            minigrpo, each with its own defaults otherwise: seconds per step and per stage; skipped with a
            note where trl is not installed
  nccl      2 steps under torchrun on 2 GPUs (NCCL) against one process: the same weights, as the gloo test
            holds on CPU; skipped with a note on one GPU (--dry-run runs it on gloo)
On a machine without CUDA it stops at once with one line, unless --dry-run.
"""

import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
from common import SHAPES, random_model, transformers_twin

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, Trainer, distributed
from minigrpo.rollout import Rollout, Samples, collate
from minigrpo.run import Run
from minigrpo.update import full_vocabulary_logprobs, token_logprobs
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward

# Each part's sizes: the full report, --quick and --dry-run (CPU, tiny shapes).
SIZES = {
    "full": dict(
        shape="0.6b",
        batches=(1, 64, 256),
        prompt=128,
        new=512,
        update_rows=16,
        steps=10,
        grpo_new=256,
        nano_rows=256,
        nano_lengths=(100, 1024),
        train_math=[],
        trl_steps=3,
    ),
    "quick": dict(
        shape="0.6b",
        batches=(1, 64),
        prompt=128,
        new=128,
        update_rows=4,
        steps=3,
        grpo_new=64,
        nano_rows=64,
        nano_lengths=(100, 256),
        train_math=["--steps", "100"],
        trl_steps=2,
    ),
    "dry-run": dict(
        shape="tiny",
        batches=(1, 4),
        prompt=8,
        new=8,
        update_rows=2,
        steps=2,
        grpo_new=8,
        nano_rows=4,
        nano_lengths=(4, 12),
        train_math=["--steps", "2", "--eval_count", "8", "--batch_size", "16", "--micro_batch_size", "16"],
        trl_steps=1,
    ),
}
SAMPLING = dict(temperature=1.0, top_p=1.0, seed=0)
PATHS = {"eager": False, "graphs": "auto"}  # minigrpo's paths, by their compile= setting
NANO_VLLM = {"nano-vllm": 8961, "vLLM": 7484}  # output tok/s that nano-vllm publishes, on an A100-40GB
MEASURED = {}  # figures the targets table at the end reads: name -> value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each part at its smallest size")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes: checks that every part runs"
    )
    parser.add_argument(
        "--parts",
        default="sampler,nanovllm,grpo,train_math,update,trl,nccl",
        help="comma-separated parts to run",
    )
    parser.add_argument("--nccl-worker", help=argparse.SUPPRESS)  # one process of the nccl part
    args = parser.parse_args()
    if args.nccl_worker:
        return nccl_worker(json.loads(args.nccl_worker))
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit(
            f"gpu_check.py: torch {torch.__version__} sees no CUDA device here, so there is nothing to "
            "measure (run it on a GPU machine, or --dry-run to check every part on CPU)"
        )
    device = torch.device("cpu" if args.dry_run else "cuda")
    sizes = SIZES["dry-run" if args.dry_run else "quick" if args.quick else "full"]
    print(machine_line(device))
    started = time.perf_counter()
    parts = {
        "sampler": sampler_part,
        "nanovllm": nanovllm_part,
        "train_math": train_math_part,
        "update": update_part,
        "grpo": grpo_part,
        "trl": trl_part,
        "nccl": nccl_part,
    }
    for name in args.parts.split(","):
        if name not in parts:
            sys.exit(f"gpu_check.py: unknown part {name!r}; known: {', '.join(parts)}")
    for name in args.parts.split(","):
        print(f"\n## {name}")
        seconds, _ = timed(device, lambda name=name: parts[name](device, sizes))
        print(f"({name}: {seconds:.0f} s)")
    MEASURED["report_s"] = time.perf_counter() - started
    print(f"\nwhole report: {MEASURED['report_s']:.0f} s")
    print_targets()


def machine_line(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        return (
            f"{name} ({gib:.0f} GiB) x {torch.cuda.device_count()}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}"
        )
    return f"CPU dry run: torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    """(seconds, result) of fn(), the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def half(device: torch.device) -> torch.dtype:
    """The GPU's sampling precision; fp32 on CPU, where bf16 matmuls are slower."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# -- sampler --------------------------------------------------------------------------------------------
def sampler_part(device: torch.device, sizes: dict) -> None:
    model = random_model(sizes["shape"], half(device)).to(device)
    bandwidth = copy_bandwidth(device)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; prompt {sizes['prompt']}, {sizes['new']} new tokens")
    print(
        "| batch | path | first call s | warm-up s | ms / decode step | tokens/s | HBM floor ms / step | "
        "floor / measured | x transformers |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    twin = _transformers_twin(model)
    if device.type != "cuda":
        print("(the graphs path needs CUDA: the CPU dry run has eager alone; tests/test_cuda.py holds both)")
    for batch in sizes["batches"]:
        prompts = torch.randint(0, model.config.vocab_size, (batch, sizes["prompt"])).tolist()
        floor = decode_floor_seconds(model, batch, sizes["prompt"] + sizes["new"] // 2, bandwidth)
        sampler_rows(device, model, twin, prompts, sizes["new"], floor, batch == sizes["batches"][0])


def sampler_rows(device, model, twin, prompts, new: int, floor: float, first_batch: bool) -> None:
    """One batch's rows of the sampler table: transformers first (when installed; not at one row, where no
    target reads it), then minigrpo's paths, each with its speed against transformers. Eager's first call
    is timed apart at the first batch only: once its first call has run, later batches start warm."""
    batch, reference = len(prompts), None
    if twin is not None and (batch > 1 or device.type != "cuda"):
        # its first call is 8 tokens, to warm it up: a full one would cost as long as the measured one
        first, _ = timed(device, lambda: hf_generate(twin, prompts, 8, model.device))
        seconds, _ = timed(device, lambda: hf_generate(twin, prompts, new, model.device))
        reference = seconds / new
        print_sampler_row(batch, "transformers", f"{first:.1f} (8 tokens)", "", seconds / new, floor, None)
    for path in PATHS if device.type == "cuda" else ["eager"]:
        # the first call pays capturing graphs, the allocator's growth, the libraries' set-up
        first, samples = timed(device, lambda path=path: sample(path, model, prompts, new))
        twice = path != "eager" or first_batch
        seconds = timed(device, lambda path=path: sample(path, model, prompts, new))[0] if twice else first
        warmup = f"{samples.warmup_seconds:.1f}" if samples.compiled else ""
        step = seconds / new
        print_sampler_row(
            batch, path, f"{first:.1f}" if twice else "(one call)", warmup, step, floor, reference
        )
        MEASURED[f"{path}_b{batch}_ms"] = 1e3 * step
        MEASURED[f"{path}_b{batch}_floor_frac"] = floor / step
        MEASURED[f"{path}_b{batch}_first_s"], MEASURED[f"{path}_b{batch}_s"] = first, seconds
        if reference is not None:
            MEASURED[f"{path}_b{batch}_x_hf"] = reference / step


def print_sampler_row(batch: int, path: str, first: str, warmup: str, step: float, floor: float, reference):
    """step: seconds per new token of the whole call (prefill included), as the floor is per decode step."""
    against = f"{reference / step:.1f}" if reference is not None else ""
    print(
        f"| {batch} | {path} | {first} | {warmup} | {1e3 * step:.2f} | {batch / step:,.0f} | "
        f"{1e3 * floor:.2f} | {floor / step:.2f} | {against} |"
    )


def sample(path: str, model, prompts: list[list[int]], new_tokens):
    """new_tokens for every prompt (no EOS stops a row early) by one of minigrpo's paths."""
    return minigrpo.generate(model, prompts, max_new_tokens=new_tokens, compile=PATHS[path], **SAMPLING)


def _transformers_twin(model):
    try:
        return transformers_twin(model)
    except ImportError:
        print("(transformers is not installed: its generate is left out)")
        return None


def hf_generate(twin, prompts, new_tokens: int, device: torch.device):
    ids = torch.tensor(prompts, device=device)
    return twin.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        top_k=0,
        temperature=SAMPLING["temperature"],
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )


# -- nano-vllm's benchmark shape ---------------------------------------------------------------------------
def nanovllm_part(device: torch.device, sizes: dict) -> None:
    """nano-vllm's bench.py: random prompts and budgets (seeded), temperature 0.6, EOS ignored (no EOS ids),
    every sequence in one call; throughput = output tokens over the call's seconds, prefill included."""
    model = random_model(sizes["shape"], half(device)).to(device)
    rng = random.Random(0)
    low, high = sizes["nano_lengths"]
    vocab = min(10000, model.config.vocab_size)  # bench.py draws prompt ids below 10,000
    rows = sizes["nano_rows"]
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(low, high))] for _ in range(rows)]
    budgets = [rng.randint(low, high) for _ in range(rows)]
    settings = dict(max_new_tokens=budgets, temperature=0.6, seed=0)
    print(f"{len(prompts)} sequences, prompts of {low}-{high} tokens, {low}-{high} new tokens each")
    print("| path | first call s | warm-up s | seconds | output tokens | output tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    path = "graphs" if device.type == "cuda" else "eager"  # the GPU's default path
    run = lambda: minigrpo.generate(model, prompts, compile=PATHS[path], **settings)  # noqa: E731
    first, samples = timed(device, run)
    warmup = samples.warmup_seconds
    seconds, samples = timed(device, run)
    tokens = samples.num_tokens
    assert tokens == sum(budgets), "every sequence runs to its own budget"
    print(f"| {path} | {first:.1f} | {warmup:.1f} | {seconds:.1f} | {tokens:,} | {tokens / seconds:,.0f} |")
    MEASURED["nanovllm_tok_s"] = tokens / seconds
    published = ", ".join(f"{name} {rate:,}" for name, rate in NANO_VLLM.items())
    print(f"(published by nano-vllm for this shape, on an A100-40GB: {published} output tok/s)")


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read plus write)."""
    source = torch.ones(2**28 if device.type == "cuda" else 2**24, device=device)  # 1 GiB on a GPU
    target = torch.empty_like(source)
    best = min(timed(device, lambda: target.copy_(source))[0] for _ in range(5))
    return 2 * source.nbytes / best


def decode_floor_seconds(model, batch: int, context: int, bandwidth: float) -> float:
    """What one decode step must read at least, over the bandwidth: every weight once, and each row's
    keys and values over `context` positions (the mean context of the run)."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    element = next(model.parameters()).element_size()
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * element * batch * context
    return (weights + kv) / bandwidth


# -- examples/train_math.py ---------------------------------------------------------------------------------
def train_math_part(device: torch.device, sizes: dict) -> None:
    """The README's first command on this device, each other setting its default (a shorter run in --quick
    and --dry-run), in a process of its own."""
    example = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_math.py"
    )
    with tempfile.TemporaryDirectory() as scratch:
        run = os.path.join(scratch, "run")
        argv = [sys.executable, example, "--device", device.type, "--output_dir", run, *sizes["train_math"]]
        print("python examples/train_math.py --device " + " ".join([device.type, *sizes["train_math"]]))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode:
            print(f"failed ({done.returncode}): {done.stderr[-2000:]}")
            return
        with open(os.path.join(run, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run, "metrics.jsonl")) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    steps = [s for s in steps if "time/step" in s]  # the evaluations have lines of their own
    seconds = sorted(s["time/step"] for s in steps)
    median = seconds[len(seconds) // 2]
    warmup = sum(s.get("time/warmup", 0.0) for s in steps)
    wall = summary["wall_seconds"] / summary["steps"]
    print(
        "| steps | held-out accuracy | gain | median s / step | wall s / step, evaluations in | warm-up s |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    print(
        f"| {summary['steps']} | {summary['initial_accuracy']:.3f} -> {summary['final_accuracy']:.3f} | "
        f"{100 * summary['gain']:+.1f} | {median:.3f} | {wall:.3f} | {warmup:.1f} |"
    )
    MEASURED["train_math_gain"], MEASURED["train_math_s"] = summary["gain"], median
    MEASURED["train_math_warmup_s"] = warmup


# -- update ---------------------------------------------------------------------------------------------
def update_part(device: torch.device, sizes: dict) -> None:
    """Forward and backward of the README recipe's micro-batch, chunked LM head against full logits, with
    and without gradient checkpointing, at 512 and 1024 new tokens (--quick and --dry-run: their own
    sizes and twice them): peak memory, tokens/s and model FLOP utilisation against a bf16 product
    measured here."""
    torch.manual_seed(0)
    model = random_model(sizes["shape"], torch.float32).to(device).train()
    rate = matmul_rate(device)
    rows, prompt = sizes["update_rows"], sizes["prompt"]
    precision = "bf16" if device.type == "cuda" else "fp32"
    print(
        f"forward + backward of {rows} rows, prompt {prompt}, fp32 weights, bf16 autocast on GPU; "
        f"a large {precision} product runs at {rate / 1e12:.1f} TFLOP/s here"
    )
    print("| new tokens | LM head | gradient checkpointing | peak allocated GiB | tokens/s | MFU |")
    print("|---:|---|---|---:|---:|---:|")
    paths = {"chunked (token_logprobs)": token_logprobs, "full logits": full_vocabulary_logprobs}
    for new in (sizes["new"], 2 * sizes["new"]):
        batch = random_batch(model, rows, prompt, new, device)
        for checkpointing in (False, True):
            model.gradient_checkpointing = checkpointing
            for name, logprobs_of in paths.items():
                seconds, peak = update_step_seconds(model, batch, logprobs_of, device)
                mfu = model_flops(model, rows, prompt + new) / seconds / rate
                tokens = rows * (prompt + new)
                print(
                    f"| {new} | {name} | {'on' if checkpointing else 'off'} | {peak:.2f} | "
                    f"{tokens / seconds:,.0f} | {mfu:.0%} |"
                )
                if new == sizes["new"]:  # the targets read the recipe's own shape
                    key = f"update_{'ckpt' if checkpointing else name.split()[0]}"
                    if not checkpointing or name.startswith("chunked"):
                        MEASURED[f"{key}_s"], MEASURED[f"{key}_gib"] = seconds, peak
                        MEASURED[f"{key}_mfu"] = mfu
    model.gradient_checkpointing = False


def random_batch(model, rows: int, prompt: int, new: int, device: torch.device):
    """A micro-batch of `rows` random prompts and completions, advantages +-1."""
    rollouts = [
        Rollout(
            prompt_ids=torch.randint(0, model.config.vocab_size, (prompt,)).tolist(),
            completion_ids=torch.randint(0, model.config.vocab_size, (new,)).tolist(),
            finish_reason="length",
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(rows)
    ]
    return collate(rollouts, 0, device)


def update_step_seconds(model, batch, logprobs_of, device: torch.device) -> tuple[float, float]:
    """Seconds of one forward and backward after a warm-up, and its peak allocated GiB (nan on CPU)."""

    def step():
        with _autocast(device):
            logprobs, _ = logprobs_of(
                model, batch.input_ids, batch.attention_mask, batch.completion_start, 1.0
            )
        (logprobs * batch.advantages).sum().backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, _ = timed(device, step)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return seconds, peak


def model_flops(model, rows: int, length: int) -> float:
    """A forward and backward's FLOPs: 6 per parameter per token (the tied head counted once, as the one
    product it is), plus causal attention's 6 x length^2 x heads x head_dim per layer and row."""
    c = model.config
    parameters = sum(p.numel() for p in model.parameters())
    attention = 6 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * length**2
    return rows * (6 * parameters * length + attention)


def matmul_rate(device: torch.device) -> float:
    """FLOP/s of a large product in the update's precision (bf16 on a GPU, fp32 on CPU), best of 5."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    best = min(timed(device, lambda: a @ b)[0] for _ in range(5))
    return 2 * n**3 / best


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


# -- a GRPO run -----------------------------------------------------------------------------------------
def grpo_part(device: torch.device, sizes: dict) -> None:
    """Random weights learn nothing worth a score: the point is each stage's time at the real shape, and
    how far bf16 sampling is from the update's log-probs."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = numbered_tokenizer(SHAPES[sizes["shape"]]["vocab_size"], scratch)
        setups = {
            "bf16 sampling, fp32 update": (torch.float32, "bfloat16"),
            "bf16 sampling, bf16 update": (torch.bfloat16, None),
        }
        print(f"{sizes['steps']} steps of 8 prompts x 8 completions of {sizes['grpo_new']} tokens")
        print(
            "| set-up | first step s | warm-up s | sample s | verify s | update s | step s | "
            "mismatch/logprob_abs_mean | mismatch/logprob_abs_max | mismatch/ratio_outside_0.9_1.1_frac |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for i, (name, (dtype, sampling_dtype)) in enumerate(setups.items()):
            output_dir = os.path.join(scratch, f"run{i}")
            first, stats = grpo_steps(device, sizes, tokenizer, dtype, sampling_dtype, output_dir)
            print(
                f"| {name} | {first['time/step']:.2f} | {first.get('time/warmup', 0.0):.2f} | "
                f"{stats['time/sample']:.2f} | {stats['time/verify']:.2f} | "
                f"{stats['time/update']:.2f} | {stats['time/step']:.2f} | "
                f"{stats['mismatch/logprob_abs_mean']:.2e} | {stats['mismatch/logprob_abs_max']:.2e} | "
                f"{stats['mismatch/ratio_outside_0.9_1.1_frac']:.4f} |"
            )
            if i == 0:
                MEASURED["grpo_sample_s"] = stats["time/sample"]
                MEASURED["grpo_update_s"] = stats["time/update"]
                MEASURED["grpo_warmup_s"] = first.get("time/warmup", 0.0)


def numbered_tokenizer(vocab_size: int, directory: str) -> minigrpo.Tokenizer:
    """A word-level tokenizer whose every id spells a word ("w17"), so that any sampled token decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|im_end|>": 0, "<|endoftext|>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    return minigrpo.Tokenizer.from_directory(directory)


def even_words(completions, **_):
    """A synthetic reward: the share of a completion's words whose number is even."""
    out = []
    for text in completions:
        words = text.split()
        out.append(sum(w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in words) / max(len(words), 1))
    return out


if "gpu_check_even" not in REWARD_FUNCTIONS:
    register_reward("gpu_check_even")(even_words)


def grpo_steps(device, sizes, tokenizer, dtype, sampling_dtype, output_dir) -> tuple[dict, dict]:
    """The first step's stats (it warms up), and the median per-step stats of `steps` GRPO steps (the
    first left out when there are more)."""
    model = random_model(sizes["shape"], dtype).to(device)
    trainer = Trainer(
        model,
        tokenizer,
        Task(job_rows(), [RewardSpec("gpu_check_even")]),
        GRPOConfig(
            num_generations=8,
            max_completion_length=sizes["grpo_new"],
            sampling_dtype=sampling_dtype,
        ),
        TrainConfig(
            output_dir=output_dir,
            max_steps=sizes["steps"],
            batch_size=64,
            micro_batch_size=64,
            micro_batch_tokens=16384,
            learning_rate=1e-6,
            progress_bar=False,
            log_completions_every=0,
        ),
    )
    steps = [trainer.train_step()[0] for _ in range(sizes["steps"])]
    measured = steps[1:] if len(steps) > 1 else steps
    # time/warmup is logged only by steps that captured graphs
    keys = {key for s in measured for key in s}
    return steps[0], {key: sorted(s.get(key, 0.0) for s in measured)[len(measured) // 2] for key in keys}


# -- TRL ------------------------------------------------------------------------------------------------
def trl_part(device: torch.device, sizes: dict) -> None:
    """The grpo part's job (random weights in its shape, 64 prompts, G = 8, 8 prompts a step, the synthetic
    reward) under TRL's GRPOTrainer and under minigrpo, fp32 weights with bf16 autocast on a GPU: the
    median seconds per stage of steps 2 .. trl_steps (the first warms up)."""
    try:
        import trl  # noqa: F401
        from datasets import Dataset  # noqa: F401
    except ImportError:
        print("skipped: trl and datasets are not installed here (pip install -e '.[bench]', or carry wheels)")
        return
    steps = sizes["trl_steps"]
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = numbered_tokenizer(SHAPES[sizes["shape"]]["vocab_size"], scratch)
        checkpoint = os.path.join(scratch, "policy")
        minigrpo.save_pretrained(random_model(sizes["shape"]), tokenizer, checkpoint)
        theirs = trl_steps(device, sizes, checkpoint, steps, os.path.join(scratch, "trl"))
        model = minigrpo.load_pretrained(checkpoint, device=device, dtype=torch.float32)[0]
        ours = minigrpo_steps(device, sizes, tokenizer, model, steps, os.path.join(scratch, "minigrpo"))
    print(
        f"{steps} steps of 8 prompts x 8 completions of up to {sizes['grpo_new']} tokens; median of steps 2.."
    )
    print("| trainer | sample s | verify s | update s | step s |")
    print("|---|---:|---:|---:|---:|")
    for name, stages in (("TRL GRPOTrainer", theirs), ("minigrpo", ours)):
        print(f"| {name} | " + " | ".join(f"{stages[stage]:.2f}" for stage in STAGES) + " |")
    print(f"(minigrpo's step: {theirs['step'] / ours['step']:.1f}x TRL's speed)")
    MEASURED["trl_x"] = theirs["step"] / ours["step"]


STAGES = ("sample", "verify", "update", "step")


def job_rows() -> list[dict]:
    """The grpo and trl parts' 64 prompts of 32 numbered words."""
    return [
        {"prompt": " ".join(f"w{random.Random(i).randrange(2, 999)}" for _ in range(32))} for i in range(64)
    ]


def trl_steps(device: torch.device, sizes: dict, checkpoint: str, steps: int, output_dir: str) -> dict:
    """Median seconds per stage of TRL's steps after the first (bench_trl.StageTimer's stages)."""
    import trl
    from bench_trl import StageTimer
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    config = trl.GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=sizes["grpo_new"],
        learning_rate=1e-6,
        beta=0.0,
        loss_type="grpo",
        temperature=1.0,
        use_vllm=False,
        gradient_checkpointing=False,
        use_cpu=device.type != "cuda",
        bf16=device.type == "cuda",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32),
        reward_funcs=lambda completions, **_: even_words(completions),
        args=config,
        train_dataset=Dataset.from_list(job_rows()),
        processing_class=AutoTokenizer.from_pretrained(checkpoint, padding_side="left"),
    )
    timer = StageTimer()
    trainer._generate = timer.timed("sample", trainer._generate)
    trainer._calculate_rewards = timer.timed("verify", trainer._calculate_rewards)

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timer.begin()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            timer.end()

    trainer.add_callback(Steps())
    trainer.remove_callback(PrinterCallback)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return {stage: median(timer.per_step[stage][1:] or timer.per_step[stage]) for stage in STAGES}


def minigrpo_steps(device, sizes, tokenizer, model, steps: int, output_dir: str) -> dict:
    """Median seconds per stage of minigrpo's steps after the first, with its own defaults otherwise."""
    trainer = Trainer(
        model,
        tokenizer,
        Task(job_rows(), [RewardSpec("gpu_check_even")]),
        GRPOConfig(num_generations=8, max_completion_length=sizes["grpo_new"]),
        TrainConfig(
            output_dir=output_dir,
            max_steps=steps,
            batch_size=64,
            learning_rate=1e-6,
            progress_bar=False,
            log_completions_every=0,
        ),
    )
    measured = [trainer.train_step()[0] for _ in range(steps)]
    measured = measured[1:] or measured  # the first warms up, when there are more
    return {stage: median([s[f"time/{stage}"] for s in measured]) for stage in STAGES}


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


# -- NCCL -----------------------------------------------------------------------------------------------
def nccl_part(device: torch.device, sizes: dict) -> None:
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        print(f"skipped: {torch.cuda.device_count()} GPU here; two ranks need two GPUs")
        return
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = os.path.join(scratch, "policy")
        minigrpo.save_pretrained(random_model("default"), numbered_tokenizer(20, scratch), checkpoint)
        spec = {"checkpoint": checkpoint, "device": device.type}
        one_spec = {**spec, "output_dir": os.path.join(scratch, "one")}
        two_spec = {**spec, "output_dir": os.path.join(scratch, "two")}
        if device.type == "cuda":
            one, two = run_worker(1, one_spec), run_worker(2, two_spec)
        else:  # --dry-run: the one process is this one (an interpreter start-up less), while torchrun starts
            two = run_worker_beside(2, two_spec, lambda: worker_here(one_spec))
            one = os.path.join(one_spec["output_dir"], "final")
        start = minigrpo.load_pretrained(checkpoint)[0].state_dict()
        a = minigrpo.load_pretrained(one)[0].state_dict()
        b = minigrpo.load_pretrained(two)[0].state_dict()
        moved = max(float((a[k] - start[k]).abs().max()) for k in a)
        apart = max(float((a[k] - b[k]).abs().max()) for k in a)
        backend = "nccl" if device.type == "cuda" else "gloo"
        verdict = "equal" if apart < 0.01 * moved else "NOT EQUAL"
        print(
            f"2 steps, one process against 2 ranks ({backend}): weights moved up to {moved:.2e}, the "
            f"two runs {apart:.2e} apart: {verdict} (within 1% of the update)"
        )


def run_worker(processes: int, spec: dict) -> str:
    """This script as the nccl part's worker: one plain process, or `processes` ranks under torchrun."""
    done = subprocess.run(
        worker_command(processes, spec), capture_output=True, text=True, env=worker_env(), timeout=600
    )
    return worker_result(done.returncode, done.stderr, processes, spec)


def run_worker_beside(processes: int, spec: dict, here) -> str:
    """run_worker, while here() runs in this process."""
    command = worker_command(processes, spec)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=worker_env()
    ) as run:
        try:
            here()
            _, stderr = run.communicate(timeout=600)
        finally:
            run.terminate()  # torchrun ends its ranks; nothing happens once it has exited
    return worker_result(run.returncode, stderr, processes, spec)


def worker_command(processes: int, spec: dict) -> list[str]:
    worker = [os.path.abspath(__file__), "--nccl-worker", json.dumps(spec)]
    if processes == 1:
        return [sys.executable, *worker]
    # torchrun's log directory inside the run's scratch directory: by default it leaves one in /tmp
    logs = os.path.join(os.path.dirname(spec["output_dir"]), "torchrun-logs")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--log-dir",
        logs,
        *worker,
    ]


def worker_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def worker_result(returncode: int, stderr: str, processes: int, spec: dict) -> str:
    """The directory of the weights the worker trained, or the end of this script if it failed."""
    if returncode:
        sys.exit(f"gpu_check.py: the {processes}-process nccl job failed:\n{stderr[-3000:]}")
    return os.path.join(spec["output_dir"], "final")


def worker_here(spec: dict) -> None:
    """The one-process run of --dry-run, in this process: nccl_worker with its sampler patch undone after,
    and its log lines kept out of the report (as a worker process's are)."""
    sample = Trainer._sample
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nccl_worker(spec)
    finally:
        Trainer._sample = sample


def fixed_sample(self, indices, round_):
    """Completions that depend on (prompt, sample, step) alone, never on how the ranks cut the prompts."""
    G, tokens = self.grpo.num_generations, []
    for i in indices:
        for j in range(G):
            rng = random.Random(f"{i}-{j}-{self.step}")
            tokens.append([rng.randrange(2, self.model.config.vocab_size) for _ in range(rng.randint(2, 10))])
    return Samples(
        tokens=tokens,
        logprobs=[[0.0] * len(t) for t in tokens],
        finish_reasons=["length"] * len(tokens),
        prompt_indices=[p for p in range(len(indices)) for _ in range(G)],
    )


def nccl_worker(spec: dict) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # the comparison is about the gradients' reduction
    dist = distributed.setup(spec["device"])
    model, tokenizer = minigrpo.load_pretrained(spec["checkpoint"], device=dist.device)
    rows = [{"prompt": f"w{2 + i} w{3 + i}"} for i in range(8)]
    Trainer._sample = fixed_sample
    trainer = Trainer(
        model,
        tokenizer,
        Task(rows, [RewardSpec("gpu_check_even")]),
        GRPOConfig(num_generations=4, max_completion_length=10),
        TrainConfig(
            output_dir=spec["output_dir"],
            max_steps=2,
            batch_size=16,
            micro_batch_size=4,
            learning_rate=1e-3,
            adam_epsilon=1e-6,
            progress_bar=False,
            log_completions_every=0,
        ),
        dist=dist,
    )
    Run(trainer).train()
    if dist.is_main:
        minigrpo.save_pretrained(model, tokenizer, os.path.join(spec["output_dir"], "final"))
    distributed.finish()


# -- the targets ----------------------------------------------------------------------------------------
TARGETS = [
    # (what, the MEASURED keys it reads, how a value reads, the test it must pass)
    ("graphs, batch 1: ms / decode step <= 1.2", ["graphs_b1_ms"], "{:.2f} ms", lambda v: v <= 1.2),
    ("graphs, batch 64: >= 5x transformers", ["graphs_b64_x_hf"], "{:.1f}x", lambda v: v >= 5),
    ("graphs, batch 64: >= 30% of the HBM floor", ["graphs_b64_floor_frac"], "{:.0%}", lambda v: v >= 0.3),
    ("graphs, batch 256: >= 5x transformers", ["graphs_b256_x_hf"], "{:.1f}x", lambda v: v >= 5),
    ("graphs, batch 256: >= 30% of the HBM floor", ["graphs_b256_floor_frac"], "{:.0%}", lambda v: v >= 0.3),
    (
        "eager, batch 1: first call <= 2x the second",
        ["eager_b1_first_s", "eager_b1_s"],
        "{:.2f}x",
        lambda v: v <= 2,
    ),
    ("nano-vllm's shape: >= 10,000 output tok/s", ["nanovllm_tok_s"], "{:,.0f} tok/s", lambda v: v >= 10000),
    (
        "grpo part: sampling no longer than the update",
        ["grpo_sample_s", "grpo_update_s"],
        "{:.2f}x",
        lambda v: v <= 1,
    ),
    ("train_math.py: gain >= +25 points", ["train_math_gain"], "{:+.1%}", lambda v: v >= 0.25),
    ("train_math.py: <= 0.1 s per step", ["train_math_s"], "{:.3f} s", lambda v: v <= 0.1),
    ("train_math.py: graphs' warm-up <= 60 s", ["train_math_warmup_s"], "{:.1f} s", lambda v: v <= 60),
    ("the whole report <= 8 minutes", ["report_s"], "{:.0f} s", lambda v: v <= 480),
    ("GRPO step >= 5x TRL's on the same GPU and job", ["trl_x"], "{:.1f}x", lambda v: v >= 5),
    # issue 36, the update: at 512 new tokens (the report's first update rows)
    (
        "update: chunked head >= 0.95x full logits' speed",
        ["update_full_s", "update_chunked_s"],
        "{:.2f}x",
        lambda v: v >= 0.95,
    ),
    (
        "update: chunked head <= 60% of full logits' peak",
        ["update_chunked_gib", "update_full_gib"],
        "{:.0%}",
        lambda v: v <= 0.6,
    ),
    ("update: model FLOP utilisation >= 35%", ["update_chunked_mfu"], "{:.0%}", lambda v: v >= 0.35),
    ("update: checkpointing fits 24 GiB", ["update_ckpt_gib"], "{:.1f} GiB", lambda v: v <= 24),
    (
        "update: checkpointing <= 1.35x the time",
        ["update_ckpt_s", "update_chunked_s"],
        "{:.2f}x",
        lambda v: v <= 1.35,
    ),
]


def print_targets() -> None:
    """Each target whose figures this run measured: the figure (a ratio of two where it names two)."""
    print("\n## targets\n| target | measured | met |\n|---|---:|---|")
    for what, keys, form, test in TARGETS:
        if not all(key in MEASURED for key in keys):
            continue
        value = MEASURED[keys[0]] if len(keys) == 1 else MEASURED[keys[0]] / MEASURED[keys[1]]
        print(f"| {what} | {form.format(value)} | {'yes' if test(value) else 'MISSED'} |")


if __name__ == "__main__":
    main()
