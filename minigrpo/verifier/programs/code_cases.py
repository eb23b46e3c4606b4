"""Stage 2 of the loop, verify: a code reward's test cases, read from the spec, judged from a report.

In: a completion (`extract_code`: its program), a test list (`check_tests`: a user's mistake is a
ValueError) and, after the run, the sandbox's report on one case (`judge`). Out: the program, case dicts
and a `CaseResult`. It knows strings and reports, not processes: running the cases is `code.py`'s.
"""

from __future__ import annotations

from ..extract import fenced_block
from .sandbox import CaseResult, SandboxConfig

PYTHON_FENCES = ("python", "py", "python3", "")  # info strings of the fenced blocks extract_code takes


def extract_code(completion: str) -> str | None:
    """The body of the last fenced ```python / ```py / bare ``` block; None if there is none.

    A completion that ends inside an open fence was cut off: its final answer is missing, so None."""
    block, cut_off = fenced_block(completion, PYTHON_FENCES)
    return None if cut_off else block


def check_tests(tests, config: SandboxConfig | None = None) -> list[dict]:
    """Validate a test list (a user's mistake, so ValueError) and return it as case dicts."""
    config = config or SandboxConfig()
    if not isinstance(tests, (list, tuple)) or len(tests) == 0:
        raise ValueError(
            f"tests must be a non-empty list of test cases, got {type(tests).__name__} {tests!r:.80}"
        )
    return [_check_test(i, test, config) for i, test in enumerate(tests)]


def _check_test(i: int, test, config: SandboxConfig) -> dict:
    if isinstance(test, str):
        if not test.strip():
            raise ValueError(f"test {i} is an empty string: it would pass for any program")
        try:
            compile(test, f"<test {i}>", "exec")
        except (SyntaxError, ValueError) as error:
            raise ValueError(f"test {i} is not valid Python: {error}") from None
        return {"kind": "assert", "source": test}
    if isinstance(test, dict):
        if set(test) != {"input", "output"} or not all(isinstance(v, str) for v in test.values()):
            raise ValueError(
                f"test {i}: a stdin/stdout test is a dict with exactly the keys 'input' and 'output', "
                f"both str; got {test!r:.80}"
            )
        if len(test["output"].encode()) > config.max_output_bytes:
            raise ValueError(
                f"test {i}: the expected output is longer than max_output_bytes ({config.max_output_bytes})"
            )
        return {"kind": "stdio", "input": test["input"], "output": test["output"]}
    raise ValueError(
        f"test {i} must be a str of Python statements or a dict with 'input' and 'output', "
        f"not {type(test).__name__}"
    )


def output_lines(text: str) -> list[str]:
    """Output as compared: trailing whitespace of each line and trailing blank lines removed."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def judge(case: dict, report: dict) -> CaseResult:
    """Assert tests pass on the proof alone; stdin/stdout tests on a clean exit and the expected output."""
    if case["kind"] == "assert":
        passed = report["proof"]
    else:
        same = not report["stdout_overflow"] and output_lines(report["stdout"]) == output_lines(
            case["output"]
        )
        passed = report["exit_code"] == 0 and same
    return CaseResult(passed, report["timed_out"], report["exit_code"], report["stdout"], report["stderr"])
