"""Stage 2 of the loop, reward: verifiable rewards from strings, with no torch anywhere.

- math: `extract_answer` (final answer of a response), `is_equivalent` (two answers, bounded in
  time by worker processes), `math_reward` / `math_rewards` (a response against a gold answer);
- `format_reward`: <think>...</think>, then exactly one \\boxed{};
- `code_reward` / `code_rewards`: run generated Python against tests in a sandbox;
- `countdown_reward`: an expression that reaches a target with the given numbers;
- `steps.check_steps`: each `expression = number` step of a response, checked exactly (process rewards);
- constraints, registered as the rewards "json", "length" and "sql": `json_reward` (JSON that parses and fits
  a JSON-Schema subset), `length_reward` (a length within a soft band), `sql_reward` / `sql_rewards` (a query
  that returns the gold query's rows on a read-only SQLite database);
- `compute_rewards`: the named rewards a task asks for, weighted and summed.
The modules, in the order an answer flows: extract -> normalize -> parse (with atoms; arithmetic and values
for its numbers and structures) -> equivalence (closed_forms compares numbers and expressions with variables),
wrapped by bounded (worker processes running worker.py); format, code (sandbox, confine, cleanup), countdown,
the constraints json_schema, length and sql (constraint_inputs: what they read alike) and rewards beside them.
"""

from .bounded import TIME_LIMIT, VerifierError, is_equivalent, math_reward, math_rewards
from .code import SandboxConfig, code_reward, code_rewards, extract_code, run_tests, sandbox_stats
from .countdown import countdown_reward
from .extract import extract_answer
from .format import FormatConfig, format_reward
from .json_schema import json_reward
from .length import length_reward
from .rewards import REWARD_FUNCTIONS, Rewards, RewardSpec, compute_rewards, register_reward
from .sql import sql_reward, sql_rewards

__all__ = [
    "REWARD_FUNCTIONS",
    "TIME_LIMIT",
    "FormatConfig",
    "RewardSpec",
    "Rewards",
    "SandboxConfig",
    "VerifierError",
    "code_reward",
    "code_rewards",
    "compute_rewards",
    "countdown_reward",
    "extract_answer",
    "extract_code",
    "format_reward",
    "is_equivalent",
    "json_reward",
    "length_reward",
    "math_reward",
    "math_rewards",
    "register_reward",
    "run_tests",
    "sandbox_stats",
    "sql_reward",
    "sql_rewards",
]
