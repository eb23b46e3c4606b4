"""Start of the loop, task: a problem with a verifiable answer, as every source of problems makes it
(synthetic.py generates them, datasets.py reads them from JSONL files).

It knows text, not tokens, prompts or the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Problem:
    question: str  # the problem as a reader sees it, without any template around it
    answer: str  # the gold answer, as the verifier compares it ("185", "\\frac{5}{6}", "x = 5")
    solution: str = ""  # a worked solution ending in the answer (generated problems; for warm-up)
    extra: dict = field(default_factory=dict)  # more columns for the rewards (Countdown's "numbers")
    # "": made, not read
    source: str = field(default="", compare=False)  # where it was read, for errors ("data.jsonl, line 7")


def sources_of(problems: list[Problem]) -> list[str] | None:
    """Where each problem was read, for errors; None unless every one was read from a file."""
    return [p.source for p in problems] if all(p.source for p in problems) else None
