"""Every benchmark runs, at its smallest size, as a user would run it from a clean clone.

A benchmark that crashes is a bug; these tests only check that each one runs to the end and
prints its tables (the timings themselves are never asserted: they belong to benchmarks/README.md).
The subprocess runs from a temporary directory, so nothing here can lean on ../shared.
"""

import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")

SMALLEST = {
    "bench_sampler.py": ["--shapes", "tiny", "--batches", "1,2", "--paths", "eager", "--new", "6", "--prompt", "8",
                         "--rounds", "1", "--naive-tokens", "3", "--refill-rows", "2", "--compaction-batch", "2"],
    "bench_forward.py": ["--shapes", "tiny", "--batch", "1", "--seq", "8", "--rounds", "1"],
    "bench_verifier.py": ["--limit", "5"],
    "bench_update.py": ["--smoke", "--case", "default", "--paths", "full,shared,trl"],
    "bench_trl.py": ["--smoke", "--seeds", "1", "--eval_at", "1"],
}
EXPECTED = {
    "bench_sampler.py": ["refill under a row budget", "mean length", "naive no-cache sampler"],
    "bench_forward.py": ["forward+backward"],
    "bench_verifier.py": ["| all |", "median ms"],
    "bench_update.py": ["| full | 1 |", "| shared |", "| trl |"],
    "bench_trl.py": ["| minigrpo | 1 |", "| trl | 1 |", "| trl - minigrpo | mean |", "| trl / minigrpo |"],
}


SUITE_ONLY = ["bench_sandbox.py"]  # runs only on a directory of cases: its smoke run below writes one


def test_every_benchmark_has_a_smoke_run():
    scripts = sorted(f for f in os.listdir(BENCHMARKS) if f.startswith("bench_") and f.endswith(".py"))
    assert scripts == sorted([*SMALLEST, *SUITE_ONLY])


def run_benchmark(script: str, args: list, cwd) -> str:
    """The benchmark's stdout, after checking that it ran to the end."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(BENCHMARKS, ".."), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *args], cwd=cwd,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(script, tmp_path):
    stdout = run_benchmark(script, SMALLEST[script], tmp_path)
    for text in EXPECTED[script]:
        assert text in stdout, stdout[-3000:]


def test_bench_verifier_scores_a_directory_of_peer_cases(tmp_path):
    """--peer reads one JSONL per source (written here: the shared cases are not in a clean clone)."""
    peer = tmp_path / "peer"
    peer.mkdir()
    def case(source, gold, pred, expected, kind):
        return {"source": source, "gold": gold, "pred": pred, "expected": expected, "kind": kind, "ref": "here"}

    rows = {
        "alpha.jsonl": [case("alpha", "1/2", "0.5", True, "extracted"), case("alpha", "3", "so \\boxed{4}", False, "response")],
        "beta.jsonl": [case("beta", "7", "The answer is 7.", True, "response")],
        "skipped.jsonl": [{"source": "beta", "gold": None, "pred": "A", "expected": None, "ref": "here", "why": "a letter"}],
    }
    for name, cases in rows.items():
        (peer / name).write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    stdout = run_benchmark("bench_verifier.py", ["--peer", str(peer)], tmp_path)
    assert "3 cases" in stdout and "1 rows without a label" in stdout
    assert "| alpha | 2 | 100.0% | 0 | 0 |" in stdout and "| beta | 1 | 100.0% | 0 | 0 |" in stdout
    assert "| all | 3 | 100.0% | 0 | 0 |" in stdout


def test_bench_sandbox_scores_a_directory_of_escape_payloads(tmp_path):
    """A tiny suite in rustbox-escape-tests' layout (the real one is not in a clean clone): a manifest and
    payloads/<language>/<file>; the Python ones run, the C one is only counted."""
    payloads = {
        "escaped.py": ('print("ESCAPED")\n', {"verdict": "RE"}),
        "blocked.py": ("import socket\nsocket.socket()\n", {"verdict_any": ["RE", "SIG"]}),
        "says_why.py": ('print("blocked here")\nraise SystemExit(1)\n', {"verdict": "RE", "stdout_contains": "here"}),
        "read_etc_passwd.py": ("print(open('/etc/passwd').read())\n", {"verdict": "RE"}),  # a documented non-goal
    }
    (tmp_path / "payloads" / "python").mkdir(parents=True)
    tests = []
    for name, (program, expect) in payloads.items():
        (tmp_path / "payloads" / "python" / name).write_text(program)
        tests.append({"name": name[:-3] + "_python", "file": f"python/{name}", "language": "python", "expect": expect})
    tests.append({"name": "fork_bomb_c", "file": "c/fork_bomb.c", "language": "c", "expect": {"verdict": "RE"}})
    (tmp_path / "manifest.json").write_text(json.dumps({"name": "tiny", "tests": tests}))
    stdout = run_benchmark("bench_sandbox.py", ["--suite", str(tmp_path)], tmp_path)
    assert "4 Python payloads run, 1 in other languages not run" in stdout
    assert "| escaped_python | RE | AC | NO | **not a documented non-goal** |" in stdout
    assert "| blocked_python | any of RE,SIG | RE | yes |  |" in stdout and "| says_why_python | RE | RE | yes |  |" in stdout
    assert "| read_etc_passwd_python | RE | AC | NO | world-readable files are readable" in stdout
    assert "2 / 4 contained; of the 2 not contained, 1 are documented non-goals and 1 are not" in stdout


def test_bench_verifier_times_a_hostile_batch(tmp_path):
    """--hostile-batch: one math_rewards batch per share of hostile rows (4 rows: the 30% share has one)."""
    stdout = run_benchmark("bench_verifier.py", ["--hostile-batch", "4"], tmp_path)
    assert "| hostile share | hostile rows | seconds | benign rows right | reward/timeout_frac |" in stdout
    assert "| 0% | 0 |" in stdout and "| 30% | 1 |" in stdout and "3/3 | 0.250 |" in stdout
