"""Stage 2 of the loop, verify: the Countdown game's check, where many answers are right.

In: a response, the numbers it was given and the target. Out: 1.0 when the response's final
answer is an expression that uses each given number exactly once and equals the target, else
0.0. Only integer literals and + - * / are evaluated (exactly, with fractions): nothing else of
the response is ever run.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from .extract import extract_answer

MAX_EXPRESSION_CHARS = 200  # longer final answers are not parsed
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def countdown_reward(response: str, numbers: list[int], target: int) -> float:
    expression = extract_answer(response)
    if expression is None or len(expression) > MAX_EXPRESSION_CHARS:
        return 0.0
    try:
        tree = ast.parse(expression, mode="eval")
        used = sorted(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant))
        return 1.0 if used == sorted(numbers) and _evaluate(tree.body) == target else 0.0
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
        return 0.0


def _evaluate(node) -> Fraction:
    """+ - * / on integer literals only, exactly: anything else is a ValueError."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only integers and + - * / are allowed")
