"""Stage 2 of the loop, verify: the math-answer wing: whether a response's final answer equals the
gold one, bounded in time.

In: answers or responses, and gold answers, as strings. Out: True or False (`is_equivalent`), 1.0 or 0.0
(`math_reward`), a batch's `Scores` (`math_rewards`). The modules, in the order an answer flows:
normalize (one canonical spelling) -> parse (the grammar: atoms, then precedence; arithmetic and values
for its numbers and structures, costs for the work of each exact operation) -> equivalence
(closed_forms compares numbers and expressions with variables), wrapped by math_reward, whose checks run
in worker processes (worker_pool, running math_worker) so that each is bounded in time. Finding the
answer in a response is the verifier's shared `extract`. It knows strings and sympy, not rewards'
weights or the trainer.

The names that import sympy (~0.5 s) are read on first use: `answers_match`, `parse_math`,
`Unsupported`, the checked arithmetic and `bounded_work`.
"""

import importlib

from .math_reward import is_equivalent, math_reward, math_rewards, start_math_workers
from .normalize import canonical, normalize
from .worker_pool import TIME_LIMIT, VerifierError

# public name -> (module, its name there): these modules import sympy, so only on first use
ON_FIRST_USE = {
    "answers_match": ("equivalence", "answers_match"),
    "parse_math": ("parse", "parse"),
    "Unsupported": ("values", "Unsupported"),
    "checked_add": ("arithmetic", "add"),
    "checked_mul": ("arithmetic", "mul"),
    "checked_power": ("arithmetic", "power"),
    "checked_factorial": ("arithmetic", "factorial"),
    "checked_double_factorial": ("arithmetic", "double_factorial"),
    "bounded_work": ("costs", "bounded_work"),
    "checked_binomial": ("arithmetic", "binomial"),
}


def __getattr__(name: str):
    if name not in ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = ON_FIRST_USE[name]
    return getattr(importlib.import_module(f".{module}", __name__), attribute)


__all__ = [
    "TIME_LIMIT",
    "VerifierError",
    "canonical",
    "is_equivalent",
    "math_reward",
    "math_rewards",
    "normalize",
    "start_math_workers",
    # on first use
    "Unsupported",
    "answers_match",
    "bounded_work",
    "checked_add",
    "checked_binomial",
    "checked_double_factorial",
    "checked_factorial",
    "checked_mul",
    "checked_power",
    "parse_math",
]
