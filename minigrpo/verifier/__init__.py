"""Stage 2 of the loop, verify: verifiable rewards from strings, with no torch anywhere.

- math: `extract_answer` (final answer of a response), `is_equivalent` (two answers, bounded in
  time by worker processes), `math_reward` / `math_rewards` (a response against a gold answer);
  `start_math_workers` starts those workers ahead; `normalize` and `answers_match` are the in-process,
  unbounded steps beneath (`answers_match`, `parse_math` and `Unsupported` import sympy on first use);
- `format_reward`: <think>...</think>, then exactly one \\boxed{} (`top_level_boxes` finds them);
- `code_reward` / `code_rewards`: run generated Python against tests in a sandbox (`run_cases`: the same
  sandbox for any program, one `CaseResult` per test);
- `countdown_reward`: an expression that reaches a target with the given numbers;
- `check_steps`: each `expression = number` step of a response, checked exactly (process rewards);
- `checked_add`, `checked_mul`, `checked_power`, `checked_factorial`, `checked_double_factorial`,
  `checked_binomial`: exact arithmetic that refuses a result too large before computing it, and
  `bounded_work`, within which it also refuses an operation past a bound on the work of all of them
  (the calculator tool's; costs.py estimates each operation's work);
- constraints, registered as the rewards "json", "length" and "sql": `json_reward(s)` (JSON that parses and
  fits a JSON-Schema subset), `length_reward(s)` (a length within a soft band), `sql_reward(s)` (a query
  that returns the gold query's rows on a read-only SQLite database);
- `compute_rewards`: the named rewards a task asks for, weighted and summed; a batch reward may return
  `Scores`, which also says which rows failed closed at a time limit.
Three wings, each behind its own door, and at the top what they share:
- answers/: the math-answer pipeline (normalize -> parse -> equivalence, bounded in time by worker
  processes);
- programs/: code rewards, and programs/sandbox/, the Linux sandbox (standard library only; its door
  holds its threat model);
- constraints/: json, length and sql;
- here: this door; rewards (the named rewards, weighted and summed) and scores; extract (the final
  answer of a response), format, countdown, and steps (with step_expression) for process rewards.
Nothing outside this folder imports from inside it: only the names below.
"""

from . import answers as _answers
from .answers import (
    TIME_LIMIT,
    VerifierError,
    canonical,
    is_equivalent,
    math_reward,
    math_rewards,
    normalize,
    start_math_workers,
)
from .constraints import json_reward, json_rewards, length_reward, length_rewards, sql_reward, sql_rewards
from .countdown import countdown_reward
from .extract import extract_answer, top_level_boxes
from .format import FormatConfig, format_reward
from .programs import (
    CaseResult,
    SandboxConfig,
    code_reward,
    code_rewards,
    extract_code,
    run_cases,
    run_tests,
    sandbox_stats,
)
from .rewards import REWARD_FUNCTIONS, Rewards, RewardSpec, compute_rewards, register_reward
from .scores import Scores
from .steps import STEP_REWARDS, Step, check_steps


def __getattr__(name: str):
    """The math wing's names that import sympy (~0.5 s), on first use (answers.ON_FIRST_USE)."""
    if name not in _answers.ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_answers, name)


__all__ = [
    "REWARD_FUNCTIONS",
    "STEP_REWARDS",
    "TIME_LIMIT",
    "CaseResult",
    "FormatConfig",
    "RewardSpec",
    "Rewards",
    "SandboxConfig",
    "Scores",
    "Step",
    "Unsupported",
    "VerifierError",
    "answers_match",
    "bounded_work",
    "canonical",
    "check_steps",
    "checked_add",
    "checked_binomial",
    "checked_double_factorial",
    "checked_factorial",
    "checked_mul",
    "checked_power",
    "code_reward",
    "code_rewards",
    "compute_rewards",
    "countdown_reward",
    "extract_answer",
    "extract_code",
    "format_reward",
    "is_equivalent",
    "json_reward",
    "json_rewards",
    "length_reward",
    "length_rewards",
    "math_reward",
    "math_rewards",
    "normalize",
    "parse_math",
    "register_reward",
    "run_cases",
    "run_tests",
    "sandbox_stats",
    "sql_reward",
    "sql_rewards",
    "start_math_workers",
    "top_level_boxes",
]
