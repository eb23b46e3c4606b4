"""Start of the loop, task: problems with verifiable answers, and the prompts that ask them.

- `Problem`: a question, its gold answer, and (for generated problems) a worked solution;
- `synthetic`: seeded generators with disjoint train / test splits (arithmetic, fractions,
  linear equations, Countdown);
- `datasets`: GSM8K- and MATH-format JSONL files, local or fetched from the Hugging Face Hub;
- `prompts`: templates for base models and for chat models (Qwen3's chat format).
`load_problems(name_or_path, split)` picks among them; `to_task` turns problems and a template
into the trainer's `Task` (task.py: rows, reward specs, the order prompts are drawn in).
It knows text, not tokens or the model.
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


def to_task(problems: list[Problem], template, rewards, tokenizer=None):
    """The trainer's Task: each problem's question rendered by `template`, its answer and extra columns."""
    rows = [
        {"prompt": template.render(p.question, tokenizer), "answer": p.answer, **p.extra} for p in problems
    ]
    return Task(rows, rewards, sources_of(problems))


def sources_of(problems: list[Problem]) -> list[str] | None:
    """Where each problem was read, for errors; None unless every one was read from a file."""
    return [p.source for p in problems] if all(p.source for p in problems) else None


from .datasets import load_problems  # noqa: E402  (datasets imports Problem from this module)
from .task import PromptStream, Task  # noqa: E402

__all__ = ["Problem", "PromptStream", "Task", "load_problems", "sources_of", "to_task"]
