"""Writes verifier_cases.jsonl, bench_verifier's default corpus, from the cases in tests/test_math_answers.py.

Every label is one that a passing test asserts, so minigrpo scores 100% here by construction: the
corpus gives a clean clone a benchmark that runs (latency, timeouts), not an accuracy claim. For
that, pass a larger corpus: `--corpus ../shared/data/verifier_corpus.jsonl`. The output is
deterministic; rerun this script after changing those tests, and tests/test_bench_verifier_corpus.py
checks the two agree.

    python benchmarks/data/make_verifier_cases.py [--out PATH]

Departures from the tests: `test_no_answer`'s non-string responses (None, 12) are left out, since a
corpus prediction is a string; and JSON reads HOSTILE's adjacent escapes `\\ud800\\udfff` back as one
astral character, so that case keeps its NULs and bidi overrides but not its unpaired surrogates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))

import test_math_answers as tv  # noqa: E402  (needs tests/ on the path)

OUT = os.path.join(HERE, "verifier_cases.jsonl")
SOURCE = "tests/test_math_answers.py::"


MAX_CHARS = 20_000  # longest hostile input kept in the corpus


def parametrized(test) -> list:
    """The argument values of a test's @pytest.mark.parametrize."""
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    return list(mark.args[1])


def cases() -> list[dict]:
    """(gold, pred, expected, category, source, bare) rows, in the order the tests list them."""
    rows = []
    for response, answer in parametrized(tv.test_extract_answer):
        rows.append((answer, response, True, "extraction", "test_extract_answer", False))
    for response in parametrized(tv.test_no_answer):
        if isinstance(response, str):  # asserted: math_reward(response, "3") == 0.0
            rows.append(("3", response, False, "no_answer", "test_no_answer", False))
    for written, canonical in parametrized(tv.test_normalize):
        rows.append((canonical, written, True, "normalization", "test_normalize", True))
    rows += [(gold, pred, True, "equal", "EQUAL", True) for pred, gold in tv.EQUAL]
    rows += [(gold, pred, False, "not_equal", "NOT_EQUAL", True) for pred, gold in tv.NOT_EQUAL]
    for pred in tv.HOSTILE:  # asserted by test_hostile_inputs_return_in_time, with these golds
        # the megabyte inputs stay in the tests; they would make this file megabytes
        if len(pred) > MAX_CHARS:
            continue
        rows.append(("1", pred, False, "adversarial", "HOSTILE", True))
        rows.append(("2", f"\\boxed{{{pred}}}", False, "adversarial", "HOSTILE", False))
    return [
        {
            "id": i,
            "gold": gold,
            "pred": pred,
            "expected": expected,
            "category": category,
            "source": SOURCE + source,
            **({"bare": True} if bare else {}),
        }
        for i, (gold, pred, expected, category, source, bare) in enumerate(rows)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=OUT, help="where to write the JSONL (default: next to this script)")
    args = parser.parse_args()
    rows = cases()
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")  # ASCII escapes: a lone surrogate has no UTF-8
    print(f"{len(rows)} cases -> {args.out}")


if __name__ == "__main__":
    main()
