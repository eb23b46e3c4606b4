"""Start of the loop, task -> prompt: what is asked, what the rewards check it against, in what order.

In: rows (dicts) with a "prompt" (text ready for the tokenizer, or chat messages) and the columns
the task's rewards read ("answer" for accuracy, "tests" for code). Out: batches of rows in a
seeded order that goes through every row once per epoch; the position in that order is part of
a checkpoint, so a resumed run asks the same questions a straight run would. It knows rows,
not tokens or the model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .problem import Problem, sources_of

if TYPE_CHECKING:  # a task names its rewards; scoring them is the verifier's stage, to the right
    from ..verifier import RewardSpec


@dataclass
class Task:
    """A dataset of prompts and the rewards that score completions of them."""

    rows: list[dict]  # each: "prompt" (str or chat messages) plus the columns its rewards read
    rewards: list[RewardSpec]  # e.g. [RewardSpec("accuracy", 1.0), RewardSpec("format", 0.1)]
    sources: list[str] | None = None  # each row's origin, for errors ("data.jsonl, line 7"); None: "row 1"

    def __post_init__(self):
        if not self.rows:
            raise ValueError("a task needs at least one row")
        if not self.rewards:
            raise ValueError("a task needs at least one reward, e.g. RewardSpec('accuracy')")
        if self.sources is not None and len(self.sources) != len(self.rows):
            raise ValueError(
                f"a task of {len(self.rows)} rows has {len(self.sources)} sources; give one per row, or None"
            )
        for i, row in enumerate(self.rows):
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), (str, list)):
                raise ValueError(f"{self.where(i)} needs a 'prompt': a string, or a list of chat messages")
        columns = set(self.rows[0])
        for i, row in enumerate(self.rows):
            if set(row) != columns:
                first = f"{self.where(0)} has {sorted(columns)}"
                raise ValueError(f"{self.where(i)} has columns {sorted(row)}, {first}")

    def check_rewards(self) -> None:
        """Each reward named once (its component is logged by name, its weights would add up), and every
        row's inputs to every reward (RewardSpec.check_inputs); a ValueError names the reward and the row."""
        names = [spec.name for spec in self.rewards]
        for name in dict.fromkeys(names):
            if names.count(name) > 1:
                raise ValueError(
                    f"the reward {name!r} is named {names.count(name)} times: its weights would add up "
                    "under one logged component; name it once, with the sum of its weights"
                )
        columns = self.columns(self.rows, 1)  # one value per row
        rows = [self.where(i) for i in range(len(self.rows))]
        for spec in self.rewards:
            spec.check_inputs(columns, rows)

    def where(self, i: int) -> str:
        """Row i (from 0) as an error names it: its source, or "row i+1" (rows counted from 1, as in a
        file)."""
        return self.sources[i] if self.sources is not None else f"row {i + 1}"

    def columns(self, rows: list[dict], repeat: int) -> dict[str, list]:
        """Each non-prompt column of `rows`, every value repeated `repeat` times (once per completion)."""
        return {key: [row[key] for row in rows for _ in range(repeat)] for key in rows[0] if key != "prompt"}


class PromptStream:
    """Rows in a seeded order, epoch after epoch; `state` / `load_state` for exact resume."""

    def __init__(self, num_rows: int, seed: int):
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0  # rows of this epoch already drawn
        self.order = self._order()

    def next(self, count: int) -> list[int]:
        """The indices of the next `count` rows."""
        indices = []
        while len(indices) < count:
            if self.position == self.num_rows:
                self.epoch += 1
                self.position = 0
                self.order = self._order()
            indices.append(self.order[self.position])
            self.position += 1
        return indices

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_rows": self.num_rows}

    def load_state(self, state: dict) -> None:
        if (state["seed"], state["num_rows"]) != (self.seed, self.num_rows):
            raise ValueError(
                f"the checkpoint was written for {state['num_rows']} rows with seed {state['seed']}, "
                f"this run has {self.num_rows} rows with seed {self.seed}: resuming would ask other questions"
            )
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.order = self._order()

    def _order(self) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order


def to_task(problems: list[Problem], template, rewards, tokenizer=None, tools=None, template_kwargs=None):
    """The trainer's Task: each problem's question rendered by `template` (a chat one declaring `tools`,
    with `template_kwargs`), its answer and extra columns."""
    kwargs = template_kwargs or {}
    rows = [
        {"prompt": template.render(p.question, tokenizer, tools, **kwargs), "answer": p.answer, **p.extra}
        for p in problems
    ]
    return Task(rows, rewards, sources_of(problems))
