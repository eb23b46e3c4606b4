"""Each objective trains: the default job for a few steps under every estimator, loss and entropy control.

    python benchmarks/bench_objectives.py                    # 20 steps of every option, then the table
    python benchmarks/bench_objectives.py --options rloo,sapo --steps 50
    python benchmarks/bench_objectives.py --flags "--num_iterations 2"    # two passes: the clips act
    python benchmarks/bench_objectives.py --smoke            # one option, one small step (the suite)

Each option is `python examples/train_math.py` with the option's flags added, in a process of its own, as
a user runs it, into --output/<option>. The table is read back from each run's metrics.jsonl and
summary.json: steps logged, steps skipped, any value that is not finite, the objective the run named, the
held-out accuracy before and after, the mean reward of the first and last five steps, the clipped-token
share (the option's own, where it has one: dual-clip's, DPPO's truncated share, Clip-Cov's and KL-Cov's
selected share) and the entropy bonus's coefficient at the last step. A run that crashed, skipped a step
or logged a NaN is marked and the script exits 1. Run again into the same --output, it keeps the runs that
finished (their summary.json is there) and resumes an interrupted one from its last checkpoint. Twenty
steps show that an option trains, not what it learns.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "train_math.py")
# option -> the flags that choose it (the rest of the default job as it is)
OPTIONS = {
    "grpo": [],
    "rloo": ["--advantage_estimator", "rloo"],
    "reinforce_plus_plus": ["--advantage_estimator", "reinforce_plus_plus"],
    "reinforce_plus_plus_kl": ["--advantage_estimator", "reinforce_plus_plus", "--beta", "0.04"],
    "reinforce_plus_plus_baseline": ["--advantage_estimator", "reinforce_plus_plus_baseline"],
    "grpo_passk": ["--advantage_estimator", "grpo_passk"],
    "passk": ["--advantage_estimator", "passk", "--pass_k", "4"],
    "maxrl": ["--advantage_estimator", "maxrl"],
    "lite_ppo": ["--scale_rewards", "batch", "--loss_type", "dapo"],
    "dual_clip": ["--clip_ratio_c", "3"],
    "sapo": ["--loss_type", "sapo"],
    "gmpo": ["--loss_type", "gmpo", "--epsilon", "0.4"],
    "dppo_tv": ["--loss_type", "dppo_tv"],
    "dppo_kl": ["--loss_type", "dppo_kl", "--epsilon", "0.05"],
    "reinforce": ["--loss_type", "reinforce"],
    "entropy_bonus": ["--entropy_coef", "0.01"],
    "adaptive_entropy": ["--use_adaptive_entropy", "--entropy_target", "0.2"],
    "clip_cov": ["--covariance_control", "clip_cov"],
    "kl_cov": ["--covariance_control", "kl_cov"],
}
# the clipped-token share an option logs of its own, where it has one; the others: clip/region_frac
OWN_CLIP = {
    "dual_clip": "clip/dual_frac",
    "dppo_tv": "clip/truncated_frac",
    "dppo_kl": "clip/truncated_frac",
    "clip_cov": "cov/selected_frac",
    "kl_cov": "cov/selected_frac",
}
SMOKE_OPTIONS = "adaptive_entropy"
SMOKE_FLAGS = ["--batch_size", "16", "--train_count", "32", "--eval_count", "4"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma-separated names of OPTIONS")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--output", default="runs/bench_objectives", help="one folder per option under it")
    parser.add_argument("--flags", default="", help="train_math.py flags every run gets, before its option's")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_OPTIONS}, one small step")
    args = parser.parse_args()
    if args.smoke:
        args.options, args.steps = SMOKE_OPTIONS, 1
    names = args.options.split(",")
    unknown = [name for name in names if name not in OPTIONS]
    if unknown:
        parser.error(f"unknown option(s) {', '.join(unknown)}; choose from {', '.join(OPTIONS)}")
    return args, names


def run(name: str, steps: int, output: str, smoke: bool, common: list[str]) -> tuple[int, float, str]:
    """One option's training run in its own process: exit status, wall seconds, the last lines of stderr.
    A run an interrupted benchmark left is resumed from its last checkpoint (the trainer's exact resume)."""
    flags = ["--max_steps", str(steps), "--eval_every", str(steps), "--output_dir", output]
    if os.path.isdir(os.path.join(output, "checkpoints")):
        flags.append("--resume")
    command = [sys.executable, TRAIN, *flags, *common, *OPTIONS[name], *(SMOKE_FLAGS if smoke else [])]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return done.returncode, time.perf_counter() - start, done.stderr[-600:]


def read_run(name: str, output: str) -> dict:
    """What the table shows of one finished run, from its metrics.jsonl and summary.json."""
    with open(os.path.join(output, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    steps = [line for line in lines if "loss" in line]  # training steps; the others are evaluations
    values = [v for line in lines for v in line.values() if isinstance(v, float)]
    rewards = [line["reward/mean"] for line in steps]
    clip = OWN_CLIP.get(name, "clip/region_frac")
    return {
        "steps": len(steps),
        "skipped": sum(line["skipped"] for line in steps),
        "finite": all(math.isfinite(v) for v in values),
        "objective": summary["objective"],
        "accuracy": (summary["initial_accuracy"], summary["final_accuracy"]),
        "reward": (sum(rewards[:5]) / len(rewards[:5]), sum(rewards[-5:]) / len(rewards[-5:])),
        "clip": (clip, sum(line.get(clip, math.nan) for line in steps) / len(steps)),
        "coef": steps[-1].get("entropy/coef"),
        "step_s": sum(line["time/step"] for line in steps) / len(steps),
    }


def row(name: str, result: dict, wall: float) -> str:
    clip_name, clip = result["clip"]
    coef = "" if result["coef"] is None else f"{result['coef']:.4f}"
    accuracy = "{:.3f} -> {:.3f}".format(*result["accuracy"])
    reward = "{:.3f} -> {:.3f}".format(*result["reward"])
    cells = [
        name,
        str(result["steps"]),
        str(int(result["skipped"])),
        "yes" if result["finite"] else "NO",
        accuracy,
        reward,
        f"{clip:.4f} ({clip_name})",
        coef,
        f"{result['step_s']:.2f}",
        f"{wall:.0f}",
        f"`{result['objective']}`",
    ]
    return "| " + " | ".join(cells) + " |"


def main():
    args, names = parse_args()
    common = f" with {args.flags}" if args.flags else ""
    print(f"# {len(names)} options x {args.steps} steps of the default job{common}; {machine_line()}")
    header = [
        "option",
        "steps",
        "skipped",
        "finite",
        "held-out acc",
        "reward first5 -> last5",
        "clipped share (mean over steps)",
        "entropy coef at end",
        "s/step",
        "wall s",
        "objective (as the run names it)",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    failed = []
    for name in names:
        output = os.path.abspath(os.path.join(args.output, name))
        if os.path.exists(os.path.join(output, "summary.json")):  # finished before: read, not run again
            status, wall, stderr = (
                0,
                json.load(open(os.path.join(output, "summary.json")))["wall_seconds"],
                "",
            )
        else:
            status, wall, stderr = run(name, args.steps, output, args.smoke, shlex.split(args.flags))
        if status != 0:
            print(f"| {name} | crashed (exit {status}): {stderr.strip().splitlines()[-1:]} |")
            failed.append(name)
            continue
        result = read_run(name, output)
        print(row(name, result, wall), flush=True)
        if result["skipped"] or not result["finite"] or result["steps"] != args.steps:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
