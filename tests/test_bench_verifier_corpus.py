"""bench_verifier's shipped corpus: remade exactly by its generator, well formed, and agreed with.

The labels come from tests/test_math_answers.py, which passes, so the verifier must agree with every
one; a disagreement means the corpus is stale (rerun benchmarks/data/make_verifier_cases.py).
"""

import json
import os
import subprocess
import sys

import minigrpo.verifier as verifier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "benchmarks", "data")
CORPUS = os.path.join(DATA, "verifier_cases.jsonl")
FIELDS = {"id", "gold", "pred", "expected", "category", "source"}


def load_cases() -> list[dict]:
    return [json.loads(line) for line in open(CORPUS, encoding="utf-8")]


def test_shipped_corpus_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "verifier_cases.jsonl"
    script = os.path.join(DATA, "make_verifier_cases.py")
    subprocess.run([sys.executable, script, "--out", str(out)], check=True, capture_output=True, timeout=60)
    with open(CORPUS, "rb") as shipped:
        assert out.read_bytes() == shipped.read(), (
            "stale corpus: rerun benchmarks/data/make_verifier_cases.py"
        )


def test_every_case_has_the_schema():
    cases = load_cases()
    assert [case["id"] for case in cases] == list(range(len(cases)))
    for case in cases:
        assert FIELDS <= set(case) <= FIELDS | {"bare"}, case["id"]
        assert isinstance(case["expected"], bool), case["id"]
        assert isinstance(case["gold"], str) and isinstance(case["pred"], str), case["id"]
        assert case["source"].startswith("tests/test_math_answers.py::"), case["id"]
        assert case.get("bare", True) is True, case["id"]  # written only when true, as in the shared corpus


def test_the_verifier_agrees_with_every_label():
    verifier.is_equivalent("1", "1")  # start the worker pool once
    wrong = []
    for case in load_cases():  # the benchmark's scoring, `ours`, one case at a time
        if case.get("bare"):
            said = verifier.is_equivalent(case["pred"], case["gold"])
        else:
            said = verifier.math_reward(case["pred"], case["gold"]) == 1.0
        if said != case["expected"]:
            wrong.append((case["id"], case["category"], case["gold"], case["pred"][:80]))
    assert not wrong, f"{len(wrong)} cases disagree: {wrong[:5]}"
