"""Every benchmark runs, at its smallest size, as a user would run it from a clean clone.

A benchmark that crashes is a bug; these tests only check that each one runs to the end and
prints its tables (the timings themselves are never asserted: they belong to benchmarks/README.md).
They run from an empty temporary directory, so nothing here can lean on ../shared.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import tiny_run

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
BENCHMARKS = os.path.join(ROOT, "benchmarks")

SMALLEST = {
    "bench_sampler.py": [
        "--shapes",
        "tiny",
        "--batches",
        "1,2",
        "--paths",
        "eager",
        "--new",
        "6",
        "--prompt",
        "8",
        "--rounds",
        "1",
        "--naive-tokens",
        "3",
        "--refill-rows",
        "2",
        "--compaction-batch",
        "2",
        "--tool-rows",
        "4",
        "--lora-shapes",
        "default",
        "--new-large",
        "4",
    ],
    "bench_forward.py": ["--shapes", "tiny", "--batch", "1", "--seq", "8", "--rounds", "1"],
    "bench_verifier.py": ["--limit", "5"],
    "bench_update.py": ["--smoke", "--case", "default", "--paths", "full,shared,trl"],
    "bench_trl.py": ["--smoke", "--seeds", "1", "--eval_at", "1"],
    "bench_lora.py": ["--smoke"],
    "bench_distillation.py": ["--smoke"],
    "count_ops.py": ["--rows", "2", "--steps", "2", "--prompt", "4"],
    "bench_objectives.py": ["--smoke", "--output", "objectives"],
    "walk_step.py": ["--json", "walk.json", "--", *tiny_run(steps=1, output_dir="walk")],
}
EXPECTED = {
    "bench_sampler.py": [
        "refill under a row budget",
        "mean length",
        "naive no-cache sampler",
        "tool calls",
        "LoRA rank 16",
    ],
    "bench_forward.py": ["forward+backward"],
    "bench_verifier.py": ["| all |", "median ms"],
    "bench_update.py": ["| full | 1 |", "| shared |", "| trl |"],
    "bench_lora.py": ["| lora + reference |", "| lora r16 |"],
    "bench_distillation.py": ["| none |", "| token |", "| full |", "the whole (B, Tc, V) fp32 logits"],
    "count_ops.py": ["| per layer |", "| outside the layers |"],
    "bench_objectives.py": ["| adaptive_entropy | 1 | 0 | yes |", "adaptive entropy bonus (target 0.2)"],
    "walk_step.py": ["one step of examples/train_math.py:", "| run/ |", "| update/ |"],
    "bench_trl.py": ["| minigrpo | 1 |", "| trl | 1 |", "| trl - minigrpo | mean |", "| trl / minigrpo |"],
}


# What the benchmarks import lazily, imported once by tool_runner.py and not again in each case: package
# (when installed) -> modules. transformers' Qwen3 (common.transformers_twin; 1-3 s with the scipy it pulls
# in) and TRL's GRPO trainer.
PRELOAD = {
    "transformers": ["transformers", "transformers.models.qwen3.modeling_qwen3"],
    "trl": ["trl", "trl.trainer.grpo_trainer"],
}

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
}

SUITE_ONLY = ["bench_sandbox.py"]  # runs only on a directory of cases: its smoke run below writes one
GPU_ONLY = ["gpu_check.py"]  # measures a GPU; its --dry-run runs every part on CPU at tiny shapes


def test_every_benchmark_has_a_smoke_run():
    scripts = sorted(f for f in os.listdir(BENCHMARKS) if f.endswith(".py") and f != "common.py")
    assert scripts == sorted([*SMALLEST, *SUITE_ONLY, *GPU_ONLY])


def write_peer_cases(peer) -> None:
    """One JSONL per source, as --peer reads them (the shared cases are not in a clean clone)."""
    peer.mkdir()

    def case(source, gold, pred, expected, kind):
        return {
            "source": source,
            "gold": gold,
            "pred": pred,
            "expected": expected,
            "kind": kind,
            "ref": "here",
        }

    rows = {
        "alpha.jsonl": [
            case("alpha", "1/2", "0.5", True, "extracted"),
            case("alpha", "3", "so \\boxed{4}", False, "response"),
        ],
        "beta.jsonl": [case("beta", "7", "The answer is 7.", True, "response")],
        "skipped.jsonl": [
            {"source": "beta", "gold": None, "pred": "A", "expected": None, "ref": "here", "why": "a letter"}
        ],
    }
    for name, cases in rows.items():
        (peer / name).write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")


def write_escape_suite(suite) -> None:
    """A tiny suite in rustbox-escape-tests' layout (the real one is not in a clean clone): a manifest and
    payloads/<language>/<file>; the Python ones run, the C one is only counted."""
    payloads = {
        "escaped.py": ('print("ESCAPED")\n', {"verdict": "RE"}),
        "blocked.py": ("import socket\nsocket.socket()\n", {"verdict_any": ["RE", "SIG"]}),
        "says_why.py": (
            'print("blocked here")\nraise SystemExit(1)\n',
            {"verdict": "RE", "stdout_contains": "here"},
        ),
        # a documented non-goal
        "read_etc_passwd.py": (
            "print(open('/etc/passwd').read())\n",
            {"verdict": "RE"},
        ),
    }
    (suite / "payloads" / "python").mkdir(parents=True)
    tests = []
    for name, (program, expect) in payloads.items():
        (suite / "payloads" / "python" / name).write_text(program)
        tests.append(
            {"name": name[:-3] + "_python", "file": f"python/{name}", "language": "python", "expect": expect}
        )
    tests.append(
        {"name": "fork_bomb_c", "file": "c/fork_bomb.c", "language": "c", "expect": {"verdict": "RE"}}
    )
    (suite / "manifest.json").write_text(json.dumps({"name": "tiny", "tests": tests}))


def background_work(tmp_path_factory) -> dict:
    """Every benchmark command line of this file but the sandbox's, run at once from an empty directory by
    tool_runner.py (one process pays the imports of torch, transformers and TRL; each run is a fork of
    it, as `python benchmarks/<script> <argv>` would run), beside the suite's other files (conftest's
    Background): name -> (exit status, stdout, stderr)."""
    tmp = tmp_path_factory.mktemp("benchmarks")
    write_peer_cases(tmp / "peer")
    # The longest first (its ranks start processes of their own), so that it never waits for a free slot
    # at the end while the other cases are done.
    commands = {"gpu dry run": ("gpu_check.py", ["--dry-run"])}
    commands.update({script: (script, argv) for script, argv in SMALLEST.items()})
    commands["peer"] = ("bench_verifier.py", ["--peer", str(tmp / "peer")])
    commands["hostile"] = ("bench_verifier.py", ["--hostile-batch", "4"])
    if not torch.cuda.is_available():  # asked for the GPU report where there is no GPU
        commands["gpu refused"] = ("gpu_check.py", [])
    jobs = [
        {"name": name, "script": os.path.join(BENCHMARKS, script), "argv": argv}
        for name, (script, argv) in commands.items()
    ]
    out = tmp / "out"
    out.mkdir()
    preload = [
        module
        for package, modules in PRELOAD.items()
        if importlib.util.find_spec(package)
        for module in modules
    ]
    runner = subprocess.run(
        [sys.executable, os.path.join(TESTS, "tool_runner.py"), str(out), *preload],
        input=json.dumps(jobs),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert runner.returncode == 0, runner.stderr[-3000:]
    statuses = json.loads(runner.stdout.strip().splitlines()[-1])
    return {
        name: (status, (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text())
        for name, status in statuses.items()
    }


@pytest.fixture(scope="module")
def runs(background):
    return background.result(__name__)


def stdout_of(runs, name: str) -> str:
    """The benchmark's stdout, after checking that it ran to the end."""
    status, stdout, stderr = runs[name]
    assert status == 0, stderr[-3000:]
    return stdout


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(runs, script):
    stdout = stdout_of(runs, script)
    for text in EXPECTED[script]:
        assert text in stdout, stdout[-3000:]


def test_gpu_check_dry_run_runs_every_part_on_cpu(runs):
    stdout = stdout_of(runs, "gpu dry run")
    for part in (
        "## sampler",
        "## nanovllm",
        "## train_math",
        "## update",
        "## grpo",
        "## trl",
        "## nccl",
        "## targets",
    ):
        assert part in stdout, stdout[-3000:]
    assert "| chunked (token_logprobs) | on |" in stdout and "| bf16 sampling, fp32 update |" in stdout
    assert "| TRL GRPOTrainer |" in stdout and "| minigrpo |" in stdout
    assert "(gloo)" in stdout and ": equal (within 1% of the update)" in stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here: gpu_check.py would measure it")
def test_gpu_check_refuses_in_one_line_without_a_gpu(runs):
    status, stdout, stderr = runs["gpu refused"]
    assert status != 0 and stdout == ""
    assert stderr.strip().count("\n") == 0 and "sees no CUDA device here" in stderr


def test_bench_verifier_scores_a_directory_of_peer_cases(runs):
    stdout = stdout_of(runs, "peer")
    assert "3 cases" in stdout and "1 rows without a label" in stdout
    assert "| alpha | 2 | 100.0% | 0 | 0 |" in stdout and "| beta | 1 | 100.0% | 0 | 0 |" in stdout
    assert "| all | 3 | 100.0% | 0 | 0 |" in stdout


def test_bench_sandbox_scores_a_directory_of_escape_payloads(tmp_path):
    """Run here, not with the background work: its payloads run in the sandbox, which other files' tests
    check for leftovers."""
    write_escape_suite(tmp_path / "suite")
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "bench_sandbox.py"), "--suite", str(tmp_path / "suite")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stdout = result.stdout
    assert "4 Python payloads run, 1 in other languages not run" in stdout
    assert "| escaped_python | RE | AC | NO | **not a documented non-goal** |" in stdout
    assert (
        "| blocked_python | any of RE,SIG | RE | yes |  |" in stdout
        and "| says_why_python | RE | RE | yes |  |" in stdout
    )
    assert "| read_etc_passwd_python | RE | AC | NO | world-readable files are readable" in stdout
    assert "2 / 4 contained; of the 2 not contained, 1 are documented non-goals and 1 are not" in stdout


def test_bench_verifier_times_a_hostile_batch(runs):
    """--hostile-batch: one math_rewards batch per share of hostile rows (4 rows: the 30% share has one)."""
    stdout = stdout_of(runs, "hostile")
    assert "| hostile share | hostile rows | seconds | benign rows right | reward/timeout_frac |" in stdout
    assert "| 0% | 0 |" in stdout and "| 30% | 1 |" in stdout and "3/3 | 0.250 |" in stdout
