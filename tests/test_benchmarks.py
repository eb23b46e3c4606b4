"""Every benchmark runs, at its smallest size, as a user would run it from a clean clone.

A benchmark that crashes is a bug; these tests only check that each one runs to the end and
prints its tables (the timings themselves are never asserted: they belong to benchmarks/README.md).
The subprocess runs from a temporary directory, so nothing here can lean on ../shared.
"""

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")

SMALLEST = {
    "bench_sampler.py": ["--shapes", "tiny", "--batches", "1,2", "--paths", "default,eager", "--new", "6", "--prompt", "8",
                         "--rounds", "1", "--naive-tokens", "3", "--refill-rows", "2", "--compaction-batch", "2"],
    "bench_forward.py": ["--shapes", "tiny", "--batch", "1", "--seq", "8", "--rounds", "1"],
    "bench_verifier.py": ["--limit", "5"],
    "bench_update.py": ["--smoke", "--case", "default", "--paths", "full,shared,trl"],
    "bench_trl.py": ["--smoke"],
}
EXPECTED = {
    "bench_sampler.py": ["refill under a row budget", "mean length", "default ran eager"],
    "bench_forward.py": ["forward+backward"],
    "bench_verifier.py": ["| all |", "median ms"],
    "bench_update.py": ["| full | 1 |", "| shared |", "| trl |"],
    "bench_trl.py": ["| minigrpo |", "| trl / minigrpo |"],
}


def test_every_benchmark_has_a_smoke_run():
    scripts = sorted(f for f in os.listdir(BENCHMARKS) if f.startswith("bench_") and f.endswith(".py"))
    assert scripts == sorted(SMALLEST)


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(BENCHMARKS, ".."), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *SMALLEST[script]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for text in EXPECTED[script]:
        assert text in result.stdout, result.stdout[-3000:]
