"""Start of the loop, task: generated problems whose answers can be checked, at chosen difficulty.

In: a kind, a count, a split, a seed and a difficulty. Out: `Problem`s with a worked solution
in a compact format a tiny model can learn ("23*6=138;47+138=185;####185"). Train and test
problems never overlap: a problem's split is decided by a hash of its text, not by the order it
was drawn in. Kinds: arithmetic (multi-step integer expressions), fractions (answers such as
\\frac{5}{6} that exercise the verifier's equivalence), linear (ax + b = c), countdown (reach a
target with four numbers; scored by the verifier's `countdown` reward, since many answers are right),
calc (3-digit by 2-digit products in multi-step expressions, worked with some steps sent to the
calculator tool as `<calc>347*56</calc><out>19432</out>`: tools/runner.py's compact format).
"""

from __future__ import annotations

import hashlib
import operator
import random
from fractions import Fraction

from .problem import Problem

TEST_SHARE = 10  # one problem in this many (by hash of its text) belongs to the test split
SPLITS = ("train", "test")


def generate(
    kind: str, count: int, split: str = "train", seed: int = 0, difficulty: int = 1
) -> list[Problem]:
    """`count` distinct problems of `kind` from `split`, the same for the same arguments."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic task {kind!r}; known: {', '.join(KINDS)}")
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 1 <= difficulty <= 3:
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
    rng = random.Random(f"{kind}-{seed}-{difficulty}")
    problems = []
    seen = set()
    for _ in range(200 * count + 10_000):
        problem = KINDS[kind](rng, difficulty)
        if problem.question in seen or _split_of(problem.question) != split:
            continue
        seen.add(problem.question)
        problems.append(problem)
        if len(problems) == count:
            return problems
    raise ValueError(
        f"only {len(problems)} distinct {split} problems of {kind} at difficulty {difficulty}; "
        f"asked for {count}"
    )


def _split_of(question: str) -> str:
    digest = int(hashlib.sha1(question.encode()).hexdigest(), 16)
    return "test" if digest % TEST_SHARE == 0 else "train"


def arithmetic(rng: random.Random, difficulty: int) -> Problem:
    """difficulty 1: a + b * c (a, b two-digit, c in 2..9); 2: one more term; 3: two more, with '-'."""
    operands = [rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)]
    ops = ["+", "*"]
    question = _with_more_terms(rng, operands, ops, difficulty, (10, 99))
    steps, total = _ordered_steps(operands, ops)
    return Problem(question, str(total), ";".join(f"{e}={v}" for e, v in steps) + f";####{total}")


# calc: the share of a worked solution's steps sent to the calculator, the rest done in the head
CALC_SHARE = 0.3


def calc(rng: random.Random, difficulty: int) -> Problem:
    """a * b + c with a in 100..999, b in 10..99, c in 100..999 (difficulty 2: one more term, 3: two,
    with '-'), too large for a tiny model to multiply in its head. The worked solution sends each step
    to the calculator with probability CALC_SHARE, so a model that learns from it calls the tool
    sometimes, and is wrong often when it does not."""
    operands = [rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)]
    ops = ["*", "+"]
    question = _with_more_terms(rng, operands, ops, difficulty, (100, 999))
    steps, total = _ordered_steps(operands, ops)
    worked = [_calc_step(expression, value, rng) for expression, value in steps]
    return Problem(question, str(total), ";".join(worked) + f";####{total}")


def _with_more_terms(rng, operands: list[int], ops: list[str], difficulty: int, term: tuple[int, int]) -> str:
    """Add difficulty - 1 terms to the expression's `operands` and `ops` (a factor in 2..9 after '*', else a
    number in `term`), in place; the expression's text."""
    for _ in range(difficulty - 1):
        ops.append(rng.choice("+-*"))
        operands.append(rng.randint(2, 9) if ops[-1] == "*" else rng.randint(*term))
    return str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:]))


def _ordered_steps(operands: list[int], ops: list[str]) -> tuple[list[tuple[str, int]], int]:
    """Each step of the expression as (expression, value): products first, then sums and differences
    left to right; and the total."""
    values = [operands[0]]
    pending = []
    steps = []
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            steps.append((f"{values[-1]}*{x}", values[-1] * x))
            values[-1] *= x
        else:
            pending.append(op)
            values.append(x)
    total = values[0]
    for op, x in zip(pending, values[1:]):
        result = total + x if op == "+" else total - x
        steps.append((f"{total}{op}{x}", result))
        total = result
    return steps, total


def _calc_step(expression: str, value: int, rng: random.Random) -> str:
    """One worked step: a calculator call and its answer, or the head's `expression=value`."""
    if rng.random() < CALC_SHARE:
        return f"<calc>{expression}</calc><out>{value}</out>"
    return f"{expression}={value}"


def fractions(rng: random.Random, difficulty: int) -> Problem:
    """p/q + r/s (difficulty 2: or -, 3: or *), answered in lowest terms as \\frac{}{}."""
    p = rng.randint(1, 9)
    q = rng.randint(2, 9)
    r = rng.randint(1, 9)
    s = rng.randint(2, 9)
    op = rng.choice("+-*"[:difficulty])
    value = _OPERATIONS[op](Fraction(p, q), Fraction(r, s))
    question = f"{p}/{q}{op}{r}/{s}"
    return Problem(question, _latex(value), f"{question}={_plain(value)};####{_plain(value)}")


def linear(rng: random.Random, difficulty: int) -> Problem:
    """a x + b = c with an integer solution x; larger coefficients with difficulty."""
    x = rng.randint(-9 * difficulty, 9 * difficulty)
    a = rng.randint(2, 3 + 3 * difficulty)
    b = rng.randint(-20 * difficulty, 20 * difficulty)
    c = a * x + b
    question = f"{a}x{b:+d}={c}"
    solution = f"{a}x={c}{-b:+d}={c - b};x={c - b}/{a}={x};####{x}"
    return Problem(question, f"x = {x}", solution)


def countdown(rng: random.Random, difficulty: int) -> Problem:
    """Reach the target with + - * and each of 3 + difficulty // 2 numbers exactly once."""
    target = 0
    while target <= 0:  # a positive target, as in the Countdown game
        numbers = [rng.randint(1, 9 + 4 * difficulty) for _ in range(3 + difficulty // 2)]
        expression = str(numbers[0])
        target = numbers[0]
        for x in numbers[1:]:
            op = rng.choice("+-*")
            expression = f"({expression}{op}{x})"
            target = _OPERATIONS[op](target, x)
    shown = ",".join(map(str, numbers))
    return Problem(
        f"{shown}->{target}",
        str(target),
        f"{expression[1:-1]}={target};####{expression}",
        extra={"numbers": numbers},
    )


_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
KINDS = {
    "arithmetic": arithmetic,
    "fractions": fractions,
    "linear": linear,
    "countdown": countdown,
    "calc": calc,
}


def _latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _plain(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
