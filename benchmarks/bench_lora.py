"""LoRA against full fine-tuning: the memory of one update, and the time of a default step.

    python benchmarks/bench_lora.py                      # memory at the 0.6B shape, then speed
    python benchmarks/bench_lora.py --parts memory --rank 16
    python benchmarks/bench_lora.py --smoke              # the smallest sizes (the suite runs this)

Memory: the Qwen3-0.6B shape with random weights in fp32 on CPU, one update (stage 4 as the trainer
runs it: updater.Updater, one AdamW step) of one prompt of 64 tokens and 8 completions of 128, micro-
batches of 8 rows, in four set-ups: full fine-tuning; full + a frozen reference copy (beta 0.04); LoRA
on all linear projections; LoRA + reference (the base with its adapters off: no copy). Each runs in a
forked process of its own; "peak" is that process's peak resident memory (VmHWM) over the update,
the model and the rollouts included; the reference's log-probs and AdamW's state are part of it.
--gradient-checkpointing recomputes each block in backward (TrainConfig.gradient_checkpointing), so
that the activations, which LoRA does not shrink, no longer dominate.

Speed: examples/train_math.py (its default job) for --steps steps, full fine-tuning and LoRA in turn,
twice each (A B A B); the median over steps 2.. of metrics.jsonl's time/sample, time/update and
time/step of each set-up's runs.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_update import in_own_process, resident  # noqa: E402
from common import SHAPES, machine_line  # noqa: E402

from minigrpo import GRPOConfig, TrainConfig, distributed  # noqa: E402
from minigrpo.config import LORA_TARGETS  # noqa: E402
from minigrpo.model import Adapters, Qwen3, Qwen3Config, add_adapters, trainable_parameters  # noqa: E402
from minigrpo.rollout import Rollout, padding_rollout  # noqa: E402
from minigrpo.update import BaseLogprobs, TokenLogprobs, Updater, frozen_copy, step_totals  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUPS = {  # name: (LoRA, a KL reference)
    "full": (False, False),
    "full + reference": (False, True),
    "lora": (True, False),
    "lora + reference": (True, True),
}


def update_memory(setup: str, rank: int, smoke: bool, checkpointing: bool) -> dict:
    """One update of one setup in this (forked) process: peak resident bytes and trainable parameters."""
    lora, with_reference = SETUPS[setup]
    shape = dict(SHAPES["0.6b"])
    prompt_tokens, completion_tokens, rows = 64, 128, 8
    if smoke:
        shape.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        prompt_tokens, completion_tokens = 8, 16
    torch.manual_seed(0)
    model = Qwen3(Qwen3Config(**shape))  # (random weights: memory does not depend on their values)
    model.gradient_checkpointing = checkpointing  # as load_pretrained(gradient_checkpointing=...) builds it
    if lora:
        add_adapters(model, Adapters(rank=rank, alpha=32, targets=LORA_TARGETS), seed=0)
    reference = None
    if with_reference:  # as the trainer chooses it (run/plan.py, _reference)
        reference = BaseLogprobs(model) if lora else TokenLogprobs(frozen_copy(model))
    rng = random.Random(0)
    V = shape["vocab_size"]
    prompt = [rng.randrange(V) for _ in range(prompt_tokens)]
    rollouts = []
    for _ in range(rows):
        completion = [rng.randrange(V) for _ in range(completion_tokens)]
        rollout = Rollout(prompt_ids=prompt, completion_ids=completion, finish_reason="length")
        rollout.advantage = rng.uniform(-1, 1)
        rollouts.append(rollout)
    grpo = GRPOConfig(
        num_generations=rows, max_completion_length=completion_tokens, beta=0.04 * with_reference
    )
    config = TrainConfig(batch_size=rows, micro_batch_size=rows, learning_rate=1e-5)
    updater = Updater(
        model, reference, grpo, config, distributed.current(model.device), padding_rollout(prompt[0], 0), 0
    )
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak from here on
    before = resident()[0]
    stats = updater(rollouts, 1, step_totals(rollouts))  # one process: the whole step
    return {
        "peak": resident()[1],
        "before": before,
        "trainable": trainable_parameters(model),
        "skipped": stats["skipped"],
    }


def memory(args) -> None:
    print(
        f"\nmemory: the 0.6B shape{' (smoke: tiny)' if args.smoke else ''}, fp32, one update of "
        f"8 x (64 + 128) tokens, LoRA rank {args.rank} on all linear projections, gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'}"
    )
    print("| set-up | trainable parameters | resident before | peak | peak / full + reference |")
    print("|---|---|---|---|---|")
    results = {}
    for setup in SETUPS:
        done = in_own_process(update_memory, setup, args.rank, args.smoke, args.gradient_checkpointing)
        if "error" in done:
            sys.exit(f"bench_lora: {setup} failed:\n{done['error']}")
        results[setup] = done["result"]
    full_ref = results["full + reference"]["peak"]
    for setup, r in results.items():
        assert r["skipped"] == 0.0, f"{setup}: the update was skipped"
        print(
            f"| {setup} | {r['trainable']:,} | {r['before'] / 2**30:.2f} GiB | {r['peak'] / 2**30:.2f} GiB "
            f"| {r['peak'] / full_ref:.2f} |",
            flush=True,
        )


def train_math(out: str, steps: int, rank: int, lr: str | None, smoke: bool) -> dict:
    """examples/train_math.py for `steps` steps: the medians over steps 2.. of its per-step times."""
    command = [sys.executable, os.path.join(ROOT, "examples", "train_math.py"), "--output_dir", out]
    command += ["--stop_at_step", str(steps), "--no-progress_bar", "--eval_count", "2" if smoke else "20"]
    if smoke:
        command += ["--batch_size", "16", "--num_generations", "4", "--max_completion_length", "8"]
    if rank:
        command += ["--lora_rank", str(rank)]
    if lr:
        command += ["--learning_rate", lr]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"bench_lora: train_math.py failed:\n{result.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if '"time/step"' in line][1:]
    times = {key: statistics.median(line[key] for line in lines) for key in ("time/sample", "time/update")}
    times["time/step"] = statistics.median(line["time/step"] for line in lines)
    times["trainable"] = lines[-1]["training/trainable_parameters"]
    return times


def speed(args) -> None:
    print(
        f"\nthe default job (examples/train_math.py), {args.steps} steps per run, full fine-tuning and "
        f"LoRA rank {args.rank} in turn, twice each; median s over steps 2.. of both runs"
    )
    # (the smoke run: LoRA's run alone, once; the full run is the default job the suite runs elsewhere)
    setups = {f"lora r{args.rank}": (args.rank, args.lr)} if args.smoke else {"full": (0, None)}
    setups.update({f"lora r{args.rank}": (args.rank, args.lr)})
    runs = {name: [] for name in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 if args.smoke else 2):
            for name, (rank, lr) in setups.items():
                runs[name].append(train_math(f"{tmp}/{i}-{rank}", args.steps, rank, lr, args.smoke))
    print("| set-up | trainable parameters | time/sample | time/update | time/step |")
    print("|---|---|---|---|---|")
    for name, results in runs.items():
        cells = " | ".join(
            f"{statistics.median(r[key] for r in results):.4f} s"
            for key in ("time/sample", "time/update", "time/step")
        )
        print(f"| {name} | {int(results[0]['trainable']):,} | {cells} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="memory,speed", help="comma-separated from: memory, speed")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (all linear projections)")
    parser.add_argument("--lr", default="1e-3", help="the LoRA runs' learning rate (speed)")
    parser.add_argument("--steps", type=int, default=40, help="steps per train_math.py run (speed)")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="memory: recompute each block in backward"
    )
    parser.add_argument("--smoke", action="store_true", help="the smallest sizes: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps = 3
    print(machine_line())
    parts = args.parts.split(",")
    if "memory" in parts:
        memory(args)
    if "speed" in parts:
        speed(args)


if __name__ == "__main__":
    main()
