"""Stage 2 of the loop, verify: named reward functions, weighted and summed.

In: the completions of one batch as strings, the task's columns for the same rows (a gold
`answer`, code `tests`, ...) and the reward specs a task names, e.g. accuracy 1.0 + format 0.1.
Out: `Rewards`, the weighted total per completion and every component kept apart for logging,
and which completions a reward failed closed on at its time limit (`math_rewards` says so).
A reward function has TRL's shape: `fn(completions, **columns) -> list[float]`, one float per
completion, and reads only the columns it names; its check refuses, before the run, a row it could
never score (`RewardSpec.check_inputs`). It knows strings, not tensors.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .answers import math_rewards
from .constraints import is_integer, json_rewards, length_rewards, shown, sql_rewards
from .countdown import countdown_reward
from .format import FormatConfig, format_reward
from .programs import check_tests, code_rewards

RewardFunction = Callable[..., list]

REWARD_FUNCTIONS: dict[str, RewardFunction] = {}
REWARD_CHECKS: dict[str, RewardFunction] = {}  # name -> its check of one row's inputs (register_reward)


def register_reward(name: str, check: RewardFunction | bool = False):
    """Decorator: make a reward function available to tasks under `name`. `check`, called as the function
    is but on one row and an empty completion (of 0 tokens), raises a ValueError on inputs the reward
    could never score; True: the function itself, for one that checks its inputs before it reads a
    completion and scores an empty one cheaply (no worker process, no sandbox)."""

    def register(fn: RewardFunction) -> RewardFunction:
        if name in REWARD_FUNCTIONS:
            raise ValueError(f"a reward called {name!r} is already registered")
        REWARD_FUNCTIONS[name] = fn
        if check:
            REWARD_CHECKS[name] = fn if check is True else check
        return fn

    return register


def _gold_is_text(completions: list[str], answer: list, **_) -> None:
    """The math verifier scores a gold answer that is not text as no answer: 0.0 for every completion."""
    if not isinstance(answer[0], str):
        raise ValueError(f"accuracy reward: the gold answer must be text, got {shown(answer[0])}")


@register_reward("accuracy", check=_gold_is_text)
def _accuracy(completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 where the final answer equals the gold `answer` column (math verifier), else 0.0."""
    return math_rewards(completions, answer)


@register_reward("format")
def _format(completions: list[str], format_config: FormatConfig | None = None, **_) -> list[float]:
    """1.0 where the response is well-formed (<think>, then one \\boxed{}), else 0.0."""
    return [format_reward(c, format_config) for c in completions]


def _tests_are_valid(completions: list[str], tests: list[list], **_) -> None:
    check_tests(tests[0])


@register_reward("code", check=_tests_are_valid)
def _code(completions: list[str], tests: list[list], **_) -> list[float]:
    """Fraction of the row's `tests` that the completion's last Python block passes, sandboxed."""
    return code_rewards(completions, tests)


def _numbers_and_target_are_integers(completions: list[str], numbers: list, answer: list, **_) -> None:
    if not (isinstance(numbers[0], list) and all(is_integer(n) for n in numbers[0])):
        raise ValueError(f"countdown reward: numbers must be a list of integers, got {shown(numbers[0])}")
    try:
        int(answer[0])
    except (TypeError, ValueError):
        raise ValueError(
            f"countdown reward: the target (answer) must be an integer, got {shown(answer[0])}"
        ) from None


@register_reward("countdown", check=_numbers_and_target_are_integers)
def _countdown(completions: list[str], numbers: list[list[int]], answer: list[str], **_) -> list[float]:
    """1.0 where the final expression uses exactly the row's `numbers` and equals its target `answer`."""
    return [countdown_reward(c, n, int(a)) for c, n, a in zip(completions, numbers, answer)]


@register_reward("json", check=True)
def _json(completions: list[str], schema=None, **_) -> list[float]:
    """1.0 where the completion's JSON parses and fits the `schema` (a column, one per row, or an option)."""
    return json_rewards(completions, schema)


@register_reward("length", check=True)
def _length(
    completions: list[str],
    unit: str = "words",
    min: float | None = None,
    max: float | None = None,
    soft: float | None = None,
    min_length: list | None = None,
    max_length: list | None = None,
    completion_tokens: list | None = None,
    **_,
) -> list[float]:
    """1.0 for a length in `unit` within [min, max] (or the row's min_length / max_length columns), falling
    linearly to 0.0 at `soft` units outside."""
    return length_rewards(
        completions,
        unit,
        min,
        max,
        soft,
        min_length=min_length,
        max_length=max_length,
        completion_tokens=completion_tokens,
    )


@register_reward("sql", check=True)
def _sql(
    completions: list[str], database: list[str], gold_sql: list[str], database_dir: str = ".", **_
) -> list[float]:
    """1.0 where the completion's query returns the rows of `gold_sql` on the row's SQLite `database`."""
    return sql_rewards(completions, database, gold_sql, database_dir)


@dataclass
class RewardSpec:
    """One reward a task uses."""

    name: str  # a key of REWARD_FUNCTIONS: "accuracy", "format", "code", "json", ... or one you registered
    weight: float = 1.0  # its factor in the total reward
    options: dict = field(default_factory=dict)  # extra keyword arguments for the function

    def __post_init__(self):
        if self.name not in REWARD_FUNCTIONS:
            raise ValueError(f"unknown reward {self.name!r}; known: {', '.join(sorted(REWARD_FUNCTIONS))}")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward {self.name!r} has a weight that is not a finite number: {self.weight}")

    def check_inputs(self, columns: dict[str, list], rows: list[str]) -> None:
        """Before the run: the task has the columns this reward needs, and each row's values (`columns`
        holds one per row; `rows` names them, "data.jsonl, line 7") and the options are ones it can score
        (its registered check). A ValueError names the reward, the first row at fault and the problem."""
        _require_columns(self, columns)
        check = REWARD_CHECKS.get(self.name)
        if check is None:
            return
        for i, row in enumerate(rows):
            inputs = {name: [values[i]] for name, values in columns.items()}
            try:
                check([""], **{"completion_tokens": [0], **inputs, **self.options})
            except ValueError as error:
                problem = str(error)
                if not problem.startswith(f"{self.name} reward: "):
                    problem = f"{self.name} reward: {problem}"
                raise ValueError(f"{row}: {problem}") from None


@dataclass
class Rewards:
    total: list[float]  # weighted sum per completion
    components: dict[str, list[float]]  # unweighted value per reward name, per completion
    timed_out: list[bool] = field(default_factory=list)  # per completion: a reward ran out of time (scored 0)

    def stats(self) -> dict[str, float]:
        """Flat, slash-named stats for the logger: reward/mean, reward/std, reward/timeout_frac,
        reward/accuracy/mean, ..."""
        out = {
            "reward/mean": _mean(self.total),
            "reward/std": _std(self.total),
            "reward/timeout_frac": _mean([float(t) for t in self.timed_out]),
        }
        for name, values in self.components.items():
            out[f"reward/{name}/mean"] = _mean(values)
            out[f"reward/{name}/std"] = _std(values)
        return out


def compute_rewards(completions: list[str], columns: dict[str, list], specs: list[RewardSpec]) -> Rewards:
    """Every spec's reward for every completion, and their weighted total."""
    for name, column in columns.items():
        if len(column) != len(completions):
            raise ValueError(f"column {name!r} has {len(column)} rows for {len(completions)} completions")
    total = [0.0] * len(completions)
    timed_out = [False] * len(completions)
    components = {}
    for spec in specs:
        values, ran_out = _call(spec, completions, columns)
        components[spec.name] = values
        total = [t + spec.weight * v for t, v in zip(total, values)]
        timed_out = [a or b for a, b in zip(timed_out, ran_out)]
    return Rewards(total, components, timed_out)


def _call(
    spec: RewardSpec, completions: list[str], columns: dict[str, list]
) -> tuple[list[float], list[bool]]:
    """The spec's reward per completion, and per completion whether it ran out of time."""
    fn = REWARD_FUNCTIONS[spec.name]
    _require_columns(spec, columns)
    values = fn(completions, **columns, **spec.options)
    if len(values) != len(completions) or not all(
        isinstance(v, (int, float)) and math.isfinite(v) for v in values
    ):
        raise ValueError(f"reward {spec.name!r} must return one finite float per completion")
    return [float(v) for v in values], _timed_out(values, len(completions))


def _timed_out(values, rows: int) -> list[bool]:
    """Which rows failed closed at a time limit, where the function says (`Scores.timed_out`); else none."""
    flags = getattr(values, "timed_out", None)
    return [bool(f) for f in flags] if flags is not None and len(flags) == rows else [False] * rows


def _require_columns(spec: RewardSpec, columns: dict[str, list]) -> None:
    missing = [
        p
        for p in _required_columns(REWARD_FUNCTIONS[spec.name])
        if p not in columns and p not in spec.options
    ]
    if missing:
        raise ValueError(
            f"reward {spec.name!r} needs the column(s) {', '.join(missing)}; "
            f"the task has {', '.join(sorted(columns)) or 'none'}"
        )


def _required_columns(fn: RewardFunction) -> list[str]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first is the completions
    return [
        p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _std(values: list[float]) -> float:
    """The unbiased (n - 1) standard deviation, as torch.std; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
