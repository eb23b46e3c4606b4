"""Math verifier on a labelled corpus: accuracy, false positives/negatives per category, latency.

Each case is scored one at a time through the public, time-bounded API (`math_reward` for a full
response, `is_equivalent` when `bare` says the prediction is already extracted), and its wall time
is measured around that call. With `--against math-verify` the `math-verify` package (a
benchmark-only dependency: pip install "math-verify[antlr4_13_2]") scores the same cases in the
same run. The default corpus, benchmarks/data/verifier_cases.jsonl, holds the cases of
tests/test_math_answers.py (remade by benchmarks/data/make_verifier_cases.py), so we score 100% there by
construction; `--corpus` takes any corpus in the same schema. With `--math500`, a second check
boxes each MATH-500 gold answer: it must match itself, and `\\boxed{123}` must match no gold but 123.
With `--peer DIR` the cases are other projects' grading tests instead, one JSONL per source in DIR
({"source", "gold", "pred", "expected", "kind", "ref"}; `kind` "extracted" is scored with
is_equivalent, "response" with math_reward; rows without a label, such as skipped.jsonl's, are left
out), and the table is per source. With `--hostile-batch ROWS` it times one `math_rewards` batch of
ROWS responses, benign ones from the corpus with a share of them (0%, 10%, 30%) replaced by a
hostile answer that no estimate refuses, and says how many benign rows were still scored right.

    python benchmarks/bench_verifier.py --limit 20        # smoke run on the shipped corpus
    python benchmarks/bench_verifier.py --corpus ../shared/data/verifier_corpus.jsonl \\
        --math500 ../shared/data/math500_test.jsonl --against math-verify
    python benchmarks/bench_verifier.py --peer ../shared/data/peer_verifier_cases --against math-verify
    python benchmarks/bench_verifier.py --hostile-batch 256     # a training batch under a hostile policy
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import minigrpo.verifier as verifier

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "data", "verifier_cases.jsonl")
HOSTILE_ANSWER = r"The answer is $\boxed{\sum_{k=1}^{10^{9}} \sin(k)}$."  # runs until it is cut off
HOSTILE_FRACTIONS = (0.0, 0.1, 0.3)  # shares of a --hostile-batch replaced by HOSTILE_ANSWER


def load_corpus(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def load_peer(directory: str) -> tuple[list[dict], int]:
    """The labelled cases of every *.jsonl in `directory`, as corpus cases whose category is their
    source; and how many rows had no label (skipped.jsonl lists the cases a conversion left out)."""
    cases, unlabelled = [], 0
    for name in sorted(f for f in os.listdir(directory) if f.endswith(".jsonl")):
        for line in open(os.path.join(directory, name), encoding="utf-8"):
            case = json.loads(line)
            if not (isinstance(case.get("expected"), bool) and case.get("kind") in ("extracted", "response")):
                unlabelled += 1
                continue
            cases.append({**case, "category": case["source"], "bare": case["kind"] == "extracted"})
    return cases, unlabelled


def outside_math500(cases, results) -> str:
    """Accuracy on the cases that are not reasoning-from-scratch's 1,500 MATH-500 rows (answers
    against themselves, boxed, and against \\boxed{123}), where a verifier's misses show."""
    rest = [
        (case, result) for case, result in zip(cases, results) if "test_math500_" not in case.get("ref", "")
    ]
    if not rest:
        return "no cases outside the MATH-500 rows"
    right = sum(said == case["expected"] for case, (said, _) in rest)
    return f"{100 * right / len(rest):.1f}% of the {len(rest)} cases outside the MATH-500 rows"


def ours(case) -> bool:
    if case.get("bare"):
        return verifier.is_equivalent(case["pred"], case["gold"])
    return verifier.math_reward(case["pred"], case["gold"]) == 1.0


def math_verify_scorer():
    """math-verify's documented use: parse the gold and the prediction, then verify(gold, pred)."""
    from math_verify import parse, verify

    def score(case) -> bool:
        gold = parse(f"${case['gold']}$")
        pred = parse(f"${case['pred']}$" if case.get("bare") else case["pred"])
        return bool(verify(gold, pred))

    return score


def run(cases, score):
    """(correct?, seconds) per case; an exception counts as 'not equal' and is counted."""
    results, errors = [], 0
    score(cases[0])  # start-up (worker processes, imports) is not part of any case
    for case in cases:
        start = time.perf_counter()
        try:
            said = score(case)
        except Exception:
            said, errors = False, errors + 1
        results.append((said, time.perf_counter() - start))
    return results, errors


def summary(cases, results) -> dict:
    table = collections.defaultdict(lambda: collections.Counter())
    for case, (said, _) in zip(cases, results):
        row = table[case["category"]]
        row["n"] += 1
        row["right"] += said == case["expected"]
        row["fp"] += said and not case["expected"]
        row["fn"] += case["expected"] and not said
    times = sorted(t for _, t in results)
    total = collections.Counter()
    for row in table.values():
        total.update(row)
    return {
        "categories": table,
        "total": total,
        "median_ms": 1e3 * statistics.median(times),
        "p99_ms": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "max_ms": 1e3 * times[-1],
    }


def print_tables(names, summaries) -> None:
    categories = sorted(summaries[0]["categories"], key=lambda c: -summaries[0]["categories"][c]["n"])
    header = "| category or source | n | " + " | ".join(f"{n} acc | {n} FP | {n} FN" for n in names) + " |"
    print(header)
    print("|" + "---|" * (2 + 3 * len(names)))
    for category in categories + ["all"]:
        rows = [s["total"] if category == "all" else s["categories"][category] for s in summaries]
        cells = " | ".join(f"{100 * r['right'] / r['n']:.1f}% | {r['fp']} | {r['fn']}" for r in rows)
        print(f"| {category} | {rows[0]['n']} | {cells} |")
    print()
    print("| verifier | median ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    for name, s in zip(names, summaries):
        print(f"| {name} | {s['median_ms']:.2f} | {s['p99_ms']:.1f} | {s['max_ms']:.0f} |")


def math500_check(path: str) -> None:
    golds = [json.loads(line)["answer"] for line in open(path, encoding="utf-8")]
    responses = [f"Working omitted.\n\nThe final answer is $\\boxed{{{g}}}$." for g in golds]
    start = time.perf_counter()
    self_match = verifier.math_rewards(responses, golds)
    wrong_123 = verifier.math_rewards(["So the answer is \\boxed{123}."] * len(golds), golds)
    seconds = time.perf_counter() - start
    false_123 = [g for g, r in zip(golds, wrong_123) if r == 1.0 and g.strip() != "123"]
    missed = [g for g, r in zip(golds, self_match) if r != 1.0]
    print(
        f"MATH-500 golds boxed in a response: {len(golds) - len(missed)}/{len(golds)} match themselves; "
        f"\\boxed{{123}} matches {len(false_123)} golds other than 123 ({seconds:.1f} s for both batches)"
    )
    for gold in missed[:10] + false_123[:10]:
        print("   ", repr(gold))


def as_response(case) -> str:
    """A corpus case as a full response: an extracted prediction is boxed (the space keeps a
    trailing backslash inside the box)."""
    return f"The answer is $\\boxed{{{case['pred']} }}$." if case.get("bare") else case["pred"]


def hostile_batch(cases, rows: int) -> None:
    """Time one math_rewards batch per share of hostile rows; the benign rows are corpus cases."""
    benign = [case for case in cases if case["category"] != "adversarial"]
    print("| hostile share | hostile rows | seconds | benign rows right | reward/timeout_frac |")
    print("|---|---|---|---|---|")
    for fraction in HOSTILE_FRACTIONS:
        # spread through the batch
        hostile = [int((i + 1) * fraction) > int(i * fraction) for i in range(rows)]
        picked = [benign[i % len(benign)] for i in range(rows)]
        responses = [HOSTILE_ANSWER if h else as_response(c) for h, c in zip(hostile, picked)]
        golds = ["2" if h else c["gold"] for h, c in zip(hostile, picked)]
        # started outside the timing
        verifier.start_math_workers()
        verifier.math_rewards(responses[:2], golds[:2])
        start = time.perf_counter()
        scores = verifier.math_rewards(responses, golds)
        seconds = time.perf_counter() - start
        right = sum((s == 1.0) == c["expected"] for s, c, h in zip(scores, picked, hostile) if not h)
        timed_out = getattr(scores, "timed_out", None)
        frac = "n/a" if timed_out is None else f"{sum(timed_out) / rows:.3f}"
        print(f"| {fraction:.0%} | {sum(hostile)} | {seconds:.2f} | {right}/{rows - sum(hostile)} | {frac} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=CORPUS, help="labelled JSONL (default: the shipped test cases)")
    parser.add_argument(
        "--peer",
        help="a directory of other projects' grading cases, one JSONL per source (instead of --corpus)",
    )
    parser.add_argument(
        "--math500", help="MATH-500 JSONL with an 'answer' per line; the self-match check needs it"
    )
    parser.add_argument("--limit", type=int, help="score only the first N cases (a quick smoke run)")
    parser.add_argument("--against", choices=["math-verify"], help="also run this verifier on the same cases")
    parser.add_argument(
        "--hostile-batch",
        type=int,
        metavar="ROWS",
        help="time one math_rewards batch of ROWS with 0%%, 10%%, 30%% hostile answers instead",
    )
    parser.add_argument("--show-misses", action="store_true", help="print every case we got wrong")
    args = parser.parse_args()
    for flag, path in (("--corpus", args.corpus), ("--math500", args.math500)):
        if path is not None and not os.path.isfile(path):
            sys.exit(f"bench_verifier: {flag}: no such file {path}")
    if args.peer is not None and not os.path.isdir(args.peer):
        sys.exit(f"bench_verifier: --peer: no such directory {args.peer}")
    if args.limit is not None and args.limit < 1:
        sys.exit(f"bench_verifier: --limit must be at least 1, got {args.limit}")
    if args.hostile_batch is not None and args.hostile_batch < 1:
        sys.exit(f"bench_verifier: --hostile-batch must be at least 1, got {args.hostile_batch}")

    if args.peer is None:
        source, (cases, unlabelled) = args.corpus, (load_corpus(args.corpus), 0)
    else:
        source, (cases, unlabelled) = args.peer, load_peer(args.peer)
    cases = cases[: args.limit]
    if not cases:
        sys.exit(f"bench_verifier: no labelled cases in {source}")
    load = os.getloadavg()[0]
    if args.hostile_batch is not None:
        print(
            f"{args.hostile_batch}-row batches, benign rows from {source}; "
            f"{os.cpu_count()} cpus, load avg {load:.2f}\n"
        )
        hostile_batch(cases, args.hostile_batch)
        return
    print(
        f"{len(cases)} cases from {source} ({unlabelled} rows without a label left out); "
        f"{os.cpu_count()} cpus, load avg {load:.2f}\n"
    )
    names, summaries = ["minigrpo"], []
    results, errors = run(cases, ours)
    summaries.append(summary(cases, results))
    all_results = [results]
    if args.show_misses:
        for case, (said, _) in zip(cases, results):
            if said != case["expected"]:
                print(
                    f"  miss [{case['category']}] expected {case['expected']}: "
                    f"gold {case['gold']!r} pred {case['pred'][-120:]!r}"
                )
    if args.against == "math-verify":
        import importlib.metadata

        names.append(f"math-verify {importlib.metadata.version('math-verify')}")
        mv_results, mv_errors = run(cases, math_verify_scorer())
        summaries.append(summary(cases, mv_results))
        all_results.append(mv_results)
        print(f"math-verify raised on {mv_errors} cases (counted as 'not equal')")
    print(f"minigrpo raised on {errors} cases\n")
    print_tables(names, summaries)
    print()
    if args.peer is not None:
        for name, scored in zip(names, all_results):
            print(f"{name}: {outside_math500(cases, scored)}")
        print()
    if args.math500 is None:
        print("MATH-500 self-match check skipped; run it with --math500 ../shared/data/math500_test.jsonl")
    else:
        math500_check(args.math500)


if __name__ == "__main__":
    main()
