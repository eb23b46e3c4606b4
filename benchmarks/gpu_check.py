"""Everything minigrpo does differently on a GPU, measured in one run of at most 8 minutes, on random
weights in the real shapes (no download): one report, printed as it goes, to paste into
benchmarks/README.md.

    python benchmarks/gpu_check.py             # one or two GPUs: the full report
    python benchmarks/gpu_check.py --quick     # each part at its smallest size
    python benchmarks/gpu_check.py --dry-run   # CPU, tiny shapes: every part runs (the suite's smoke test)

The parts:
  sampler   Qwen3-0.6B shape in bf16: minigrpo eager, minigrpo compile=True, transformers' generate (when
            installed), at batch 1 / 64 / 256, prompt 128, 512 new tokens: ms per decode step, tokens/s,
            and the step against its HBM floor (the weight and KV-cache bytes a step reads, over the copy
            bandwidth measured in the same run)
  update    the same shape: peak max_memory_allocated and tokens/s of forward + backward on
            16 x (128 + 512) tokens, the chunked LM head against full logits
  grpo      10 GRPO steps on random 0.6B-shape weights with a synthetic reward: seconds per stage, and the
            sampler-trainer mismatch (mismatch/*) with bf16 sampling against an fp32 update, and with both
            in bf16
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
from minigrpo.rollout import Rollout, collate
from minigrpo.sampler import Samples
from minigrpo.token_logprobs import full_vocabulary_logprobs, token_logprobs
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward

# Each part's sizes: the full report, --quick and --dry-run (CPU, tiny shapes).
SIZES = {
    "full": dict(
        shape="0.6b", batches=(1, 64, 256), prompt=128, new=512, update_rows=16, steps=10, grpo_new=256
    ),
    "quick": dict(shape="0.6b", batches=(1, 64), prompt=128, new=128, update_rows=4, steps=3, grpo_new=64),
    "dry-run": dict(shape="tiny", batches=(1, 4), prompt=8, new=8, update_rows=2, steps=2, grpo_new=8),
}
SAMPLING = dict(temperature=1.0, top_p=1.0, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each part at its smallest size")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes: checks that every part runs"
    )
    parser.add_argument("--parts", default="sampler,update,grpo,nccl", help="comma-separated parts to run")
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
    parts = {"sampler": sampler_part, "update": update_part, "grpo": grpo_part, "nccl": nccl_part}
    for name in args.parts.split(","):
        if name not in parts:
            sys.exit(f"gpu_check.py: unknown part {name!r}; known: {', '.join(parts)}")
        print(f"\n## {name}")
        seconds, _ = timed(device, lambda name=name: parts[name](device, sizes))
        print(f"({name}: {seconds:.0f} s)")
    print(f"\nwhole report: {time.perf_counter() - started:.0f} s")


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
        "| batch | path | first call s | ms / decode step | tokens/s | HBM floor ms / step | "
        "floor / measured |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    twin = _transformers_twin(model)
    paths = ["eager", "compile=True"] if device.type == "cuda" else ["eager"]
    if device.type != "cuda":  # inductor's CPU build alone would take longer than the whole dry run
        print("(compile=True is left out of the CPU dry run; tests/test_sampler.py holds it equal to eager)")
    if twin is not None:
        paths.append("transformers")
    for batch in sizes["batches"]:
        prompts = torch.randint(0, model.config.vocab_size, (batch, sizes["prompt"])).tolist()
        floor = decode_floor_seconds(model, batch, sizes["prompt"] + sizes["new"] // 2, bandwidth)
        for path in paths:
            # the first call pays compiling and capturing graphs, the allocator's growth, autotuning
            first, _ = timed(
                device, lambda path=path, prompts=prompts: sample(path, model, twin, prompts, sizes["new"])
            )
            seconds, _ = timed(
                device, lambda path=path, prompts=prompts: sample(path, model, twin, prompts, sizes["new"])
            )
            step = seconds / sizes["new"]
            print(
                f"| {batch} | {path} | {first:.1f} | {1e3 * step:.2f} | "
                f"{batch * sizes['new'] / seconds:,.0f} | {1e3 * floor:.2f} | {floor / step:.2f} |"
            )


def sample(path: str, model, twin, prompts: list[list[int]], new_tokens: int):
    """new_tokens for every prompt (no EOS stops a row early), by one of the sampler part's paths."""
    if path == "transformers":
        return hf_generate(twin, prompts, new_tokens, model.device)
    return minigrpo.generate(
        model, prompts, max_new_tokens=new_tokens, compile=path == "compile=True", **SAMPLING
    )


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


# -- update ---------------------------------------------------------------------------------------------
def update_part(device: torch.device, sizes: dict) -> None:
    torch.manual_seed(0)
    model = random_model(sizes["shape"], torch.float32).to(device).train()
    rows, prompt, new = sizes["update_rows"], sizes["prompt"], sizes["new"]
    rollouts = [
        Rollout(
            prompt_ids=torch.randint(0, model.config.vocab_size, (prompt,)).tolist(),
            completion_ids=torch.randint(0, model.config.vocab_size, (new,)).tolist(),
            finish_reason="length",
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(rows)
    ]
    batch = collate(rollouts, 0, device)
    print(f"forward + backward of {rows} x ({prompt} + {new}) tokens, fp32 weights, bf16 autocast on GPU")
    print("| LM head | peak allocated GiB | tokens/s |")
    print("|---|---:|---:|")
    paths = {"chunked (token_logprobs)": token_logprobs, "full logits": full_vocabulary_logprobs}
    for name, logprobs_of in paths.items():

        def step(logprobs_of=logprobs_of):
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
        print(f"| {name} | {peak:.2f} | {rows * (prompt + new) / seconds:,.0f} |")


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
            "| set-up | sample s | verify s | update s | step s | mismatch/logprob_abs_mean | "
            "mismatch/logprob_abs_max | mismatch/ratio_outside_0.9_1.1_frac |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, (dtype, sampling_dtype) in setups.items():
            stats = grpo_steps(device, sizes, tokenizer, dtype, sampling_dtype, os.path.join(scratch, "run"))
            print(
                f"| {name} | {stats['time/sample']:.2f} | {stats['time/verify']:.2f} | "
                f"{stats['time/update']:.2f} | {stats['time/step']:.2f} | "
                f"{stats['mismatch/logprob_abs_mean']:.2e} | {stats['mismatch/logprob_abs_max']:.2e} | "
                f"{stats['mismatch/ratio_outside_0.9_1.1_frac']:.4f} |"
            )


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


def grpo_steps(device, sizes, tokenizer, dtype, sampling_dtype, output_dir) -> dict:
    """Median per-step stats of `steps` GRPO steps (the first, which warms up, left out when there are
    more)."""
    model = random_model(sizes["shape"], dtype).to(device)
    rows = [
        {"prompt": " ".join(f"w{random.Random(i).randrange(2, 999)}" for _ in range(32))} for i in range(64)
    ]
    trainer = Trainer(
        model,
        tokenizer,
        Task(rows, [RewardSpec("gpu_check_even")]),
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
    return {key: sorted(s[key] for s in measured)[len(measured) // 2] for key in measured[0]}


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
    trainer.train()
    if dist.is_main:
        minigrpo.save_pretrained(model, tokenizer, os.path.join(spec["output_dir"], "final"))
    distributed.finish()


if __name__ == "__main__":
    main()
