"""Stage 2 of the loop, verify: the values an answer can have, once read by `parse`.

A scalar, vector or matrix is a sympy object; everything else is one of the small frozen
structures below, compared by `equivalence`. Nothing here computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy


class Unsupported(ValueError):
    """The answer cannot be read with certainty; it must not be judged correct."""


@dataclass(frozen=True)
class Tuple:
    items: tuple  # ordered elements
    brackets: str  # the opening and closing bracket: "()", "[]", "(]", "[)"


@dataclass(frozen=True)
class Set:
    items: tuple  # unordered: \{...\}, a bare list "1, 2", "a and b", the two values of a ± b


@dataclass(frozen=True)
class Interval:
    lo: object  # sympy expression, possibly -oo
    hi: object  # sympy expression, possibly oo
    left_closed: bool
    right_closed: bool


@dataclass(frozen=True)
class Union:
    parts: tuple  # intervals and sets joined by \cup


@dataclass(frozen=True)
class Relation:
    op: str  # one of "=", "!=", "<", "<=", ">", ">=", "in"
    lhs: object
    rhs: object


@dataclass(frozen=True)
class Approximation:
    value: object  # what is approximated: a number, or a name ("x \approx 5")
    roundings: tuple  # (number written after \approx, half a unit in its last digit), for each one


@dataclass(frozen=True)
class Text:
    words: str  # lower-cased words separated by single spaces


@dataclass
class Parsed:
    value: object
    decimals: dict = field(default_factory=dict)  # decimal literal's exact value -> (significant digits, ulp)


REAL_LINE = Interval(-sympy.oo, sympy.oo, False, False)
