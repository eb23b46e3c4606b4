"""Stage 2 of the loop, verify: the programs wing: run generated Python against test cases in a
sandbox, and score it.

In: a completion (its program: `extract_code`) and its test cases (`check_tests` checks a user's list
once). Out: the fraction of tests passed (`code_reward`, `code_rewards`), or one `CaseResult` per test
(`run_cases`: the same sandbox for any program), and `sandbox_stats`. code.py admits and supervises
each run; code_cases.py reads the tests and judges the reports; the sandbox itself, its rule and its
threat model are sandbox/'s (its door). It knows strings and processes, not tensors or the tokenizer.
"""

from .code import code_reward, code_rewards, run_cases, run_tests, sandbox_stats
from .code_cases import check_tests, extract_code
from .sandbox import CaseResult, SandboxConfig

__all__ = [
    "CaseResult",
    "SandboxConfig",
    "check_tests",
    "code_reward",
    "code_rewards",
    "extract_code",
    "run_cases",
    "run_tests",
    "sandbox_stats",
]
