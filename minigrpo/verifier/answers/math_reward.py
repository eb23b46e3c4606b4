"""Stage 2 of the loop, verify: the math verifier's checks, each bounded in time.

In: (answer, gold) or (response, gold) strings. Out: whether two answers are equal (`is_equivalent`) or a
0/1 reward per pair (`math_reward`, `math_rewards`), never an exception about the answer: a check that runs
out of time, crashes or gets bad input is "not equal". The checks run in worker processes (`worker_pool`,
running `math_worker`); this module knows which job each check is, not how a worker computes it.
"""

from __future__ import annotations

from ..scores import Scores
from .worker_pool import default_workers, shared_pool


def start_math_workers(count: int | None = None) -> None:
    """Start `count` math workers ahead (default: one per CPU, up to 8) and wait until they are ready, for
    callers about to check from that many threads at once; not counted against any check's deadline."""
    shared_pool().reserve(count or default_workers())


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether two extracted answers are equal (see `equivalence`); False on time-out or bad input."""
    if not (isinstance(pred, str) and isinstance(gold, str)):
        return False
    return bool(shared_pool().run([("match", pred, gold)], failed=False)[0])


def math_reward(response: str, gold: str) -> float:
    """1.0 when the final answer of `response` equals `gold`, else 0.0 (no answer, time-out, bad input)."""
    return math_rewards([response], [gold], workers=1)[0]


def math_rewards(responses: list[str], golds: list[str], workers: int | None = None) -> Scores:
    """`math_reward` for many pairs at once, `workers` of them in flight (default: one per CPU, up to 8),
    within one budget for the batch (`batch_budget`); `.timed_out` says which failed closed at it."""
    if len(responses) != len(golds):
        raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
    jobs = [
        ("reward", r, g) if isinstance(r, str) and isinstance(g, str) else ("reward", "", "")
        for r, g in zip(responses, golds)
    ]
    if not jobs:
        return Scores([], [])
    results, timed_out = shared_pool().run_batch(jobs, failed=0.0, parallel=workers or default_workers())
    return Scores([float(x) for x in results], timed_out)
