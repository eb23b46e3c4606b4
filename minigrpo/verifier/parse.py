"""Stage 2 of the loop, reward: read a normalised answer into a mathematical value.

In: a string from `normalize.canonical`. Out: `Parsed(value, decimals)`, where the value is a sympy
expression or matrix, or one of the structures in `values` (Tuple, Set, Interval, Union, Relation,
Approximation, Text), and `decimals` records how precisely each decimal literal was written. Anything
this cannot read with certainty raises Unsupported: enumerations ("1, 2, \\ldots"), integrals,
derivatives, limits other than a constant's, unknown commands, anything but a written number after
\\approx, sizes past the caps below, in `atoms` or in `arithmetic`. The caller then treats the answer
as not understood, which never makes it correct. "3 or 5" and "3, 5" both read as a set of two
values, which never equals one value.

A hand-written recursive-descent parser rather than sympy's LaTeX parser: that one needs
antlr4 or lark (more dependencies), and it cannot check sizes before it computes. This file is
the tokenizer and the grammar, loosest binding first; `atoms` reads what sits at the bottom of
it (numbers, names, commands, brackets, matrices) and holds the tables of LaTeX it understands.
It knows notation, not equivalence: comparing two values is `equivalence`'s job.

Departures from Math-Verify (latex2sympy2_extended), where the notation has one school reading:
  - n!! is the double factorial, n (n - 2) (n - 4) ..., so 5!! = 15; Math-Verify reads each ! as a
    factorial, 5!! = (5!)! = 120!; three marks, n!!!, are refused (the triple factorial, or (n!!)!). A
    double factorial of a variable has no value at the sample points' fractions, so (2n)!! is never
    shown equal to 2^n n! (not equal: fail closed);
  - \\sqrt[n]{x} of a negative number x and an odd n is the real root, \\sqrt[3]{-8} = -2; Math-Verify
    takes sympy's principal root, 1 + i\\sqrt{3}, which a power (-8)^{1/3} still is here. A root of an
    expression with a variable keeps the principal branch (see `closed_forms`), as there.
"""

from __future__ import annotations

import re

import sympy

from .arithmetic import (
    PM,
    add,
    as_interval_or_set,
    contains_pm,
    div,
    double_factorial,
    factorial,
    make_set,
    mul,
    power,
)
from .atoms import _CONSTANTS, _FUNCTIONS, _HEDGES, MAX_ITEMS, _Atoms, written_precision
from .values import Approximation, Parsed, Relation, Text, Union, Unsupported

MAX_TOKENS = 20_000  # longer answers are not parsed (they can still match as identical strings)
MAX_NESTING = 40  # deepest bracket nesting parsed
_TOKEN = re.compile(
    r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![A-Za-z]))?)|(?P<cmd>\\[A-Za-z]+|\\[{}|])|(?P<word>[A-Za-z]+)"
    r"|(?P<op><=|>=|!=|=<|=>|\*\*|\\\\|[-+*/^_=<>(){}\[\],;|!'&:])|(?P<space>\s+)"
)
_RELATIONS = {
    "=": "=",
    "<": "<",
    ">": ">",
    "<=": "<=",
    ">=": ">=",
    "!=": "!=",
    "=<": "<=",
    "=>": ">=",
    r"\le": "<=",
    r"\leq": "<=",
    r"\leqslant": "<=",
    r"\ge": ">=",
    r"\geq": ">=",
    r"\geqslant": ">=",
    r"\lt": "<",
    r"\gt": ">",
    r"\ne": "!=",
    r"\neq": "!=",
    r"\in": "in",
}
_SEPARATORS = (",", ";", "and", "or")  # "3 or 5" is a list of two values: it never equals one value
_TEXT = re.compile(r"[A-Za-z][A-Za-z' -]*")


def parse(s: str) -> Parsed:
    """The value of a normalised answer; raises Unsupported when it cannot be read."""
    if _TEXT.fullmatch(s) and not _is_math_words(s):
        return Parsed(Text(" ".join(s.lower().replace("-", " ").split())))
    parser = _Parser(_tokenize(s))
    try:
        value = parser.answer()
    except Unsupported:
        raise
    except Exception as error:  # sympy refusing an operation (shapes, domains): not understood
        raise Unsupported(f"{type(error).__name__}: {error}") from None
    return Parsed(value, parser.decimals)


def _is_math_words(s: str) -> bool:
    """True when every word is a single letter or a function/constant name: 'x y', 'pi', 'sin x'."""
    words = s.replace("-", " ").split()
    return all(len(w) == 1 or w in _FUNCTIONS or w in _CONSTANTS or w == "sqrt" for w in words)


def _tokenize(s: str) -> list[tuple[str, str]]:
    tokens = []
    i = 0
    depth = 0
    deepest = 0
    while i < len(s):
        match = _TOKEN.match(s, i)
        if match is None:
            raise Unsupported(f"unexpected character {s[i]!r}")
        i = match.end()
        kind = match.lastgroup
        if kind == "space":
            continue
        text = match.group()
        depth += text in ("(", "[", "{", r"\{") or 0
        depth -= text in (")", "]", "}", r"\}") or 0
        deepest = max(deepest, depth)
        tokens.append((kind, text))
    if len(tokens) > MAX_TOKENS or deepest > MAX_NESTING:
        raise Unsupported("answer too long or too deeply nested")
    return tokens


def _solutions(items: list) -> list:
    """'p=5, q=2; p=7, q=2' -> [{p=5, q=2}, {p=7, q=2}]: a list of assignments in which the same two
    or more names come round again, in the same order, is a list of solutions, one per round (read
    as one set it would merge them: {p=5, q=2, p=7}). Any other list is returned as it is."""
    names = [
        item.lhs
        if isinstance(item, Relation) and item.op == "=" and isinstance(item.lhs, sympy.Symbol)
        else None
        for item in items
    ]
    size = len(dict.fromkeys(names))
    if None in names or size < 2 or len(items) == size or names != names[:size] * (len(items) // size):
        return items
    return [make_set(items[i : i + size]) for i in range(0, len(items), size)]


class _Parser(_Atoms):
    """Recursive descent, loosest binding first: list, relation, approximation, ratio, union, sum, product,
    power, atom."""

    # -- grammar ------------------------------------------------------------------------------
    def answer(self):
        items = _solutions(self.sequence())
        if self.pos != len(self.tokens):
            raise Unsupported(f"unexpected {self.peek()[1]!r}")
        return items[0] if len(items) == 1 else make_set(items)

    def sequence(self) -> list:
        """Items separated by commas, semicolons, 'and' or 'or'; a ± item counts as its two values."""
        items = self.split_pm(self.relation())
        while self.at(*_SEPARATORS):
            self.next()
            items += self.split_pm(self.relation())
            if len(items) > MAX_ITEMS:
                raise Unsupported("too many items")
        return items

    def split_pm(self, value) -> list:
        if isinstance(value, (sympy.Basic,)) and value.has(PM):
            return [value.subs(PM, 1), value.subs(PM, -1)]
        if contains_pm(value):
            raise Unsupported("± inside a structure")
        return [value]

    def relation(self):
        left = self.approximation()
        chain = []
        while self.peek()[1] in _RELATIONS:
            op = _RELATIONS[self.next()[1]]
            right = self.approximation()
            chain.append(Relation(op, left, right))
            left = right
        if not chain:
            return left
        return chain[0] if len(chain) == 1 else make_set(chain)

    def approximation(self):
        """a \\approx 0.33: the value a, with each rounding written after it, for `equivalence` to check
        ('x = 1/3 \\approx 0.33' is x = (1/3, rounded to 0.33))."""
        value = self.ratio()
        roundings = []
        while self.at(r"\approx"):
            self.next()
            roundings.append(self.stated_rounding())
        return Approximation(value, tuple(roundings)) if roundings else value

    def stated_rounding(self) -> tuple:
        """A written number (a sign and one literal: 0.33, -3, 1.2e3) and half a unit in its last digit."""
        start = self.pos
        value = self.ratio()
        written = self.tokens[start : self.pos]
        if written and written[0][1] in ("-", "+"):
            written = written[1:]
        if len(written) != 1 or written[0][0] != "num":
            raise Unsupported("only a written number can follow \\approx")
        _, unit = written_precision(written[0][1])
        return value, unit / 2

    def ratio(self):
        """a : b, read as the number a / b."""
        value = self.union()
        while self.at(":"):
            self.next()
            value = div(value, self.union())
        return value

    def union(self):
        parts = [self.sum()]
        while self.at(r"\cup"):
            self.next()
            parts.append(self.sum())
        if len(parts) == 1:
            return parts[0]
        return Union(tuple(as_interval_or_set(p) for p in parts))

    def sum(self):
        value = self.term()
        while self.at("+", "-", r"\pm", r"\mp"):
            op = self.next()[1]
            sign = {"+": 1, "-": -1, r"\pm": PM, r"\mp": -PM}[op]
            value = add(value, mul(sign, self.term()))
        return value

    def term(self):
        value = self.unary()
        while True:
            if self.at("*", r"\cdot", r"\times"):
                self.next()
                value = mul(value, self.unary())
            elif self.at("/", r"\div"):
                self.next()
                value = div(value, self.unary())
            elif self.starts_atom():
                value = mul(value, self.power())
            else:
                return value

    def unary(self):
        if self.at("-", "+", r"\pm", r"\mp"):
            op = self.next()[1]
            sign = {"+": 1, "-": -1, r"\pm": PM, r"\mp": -PM}[op]
            return mul(sign, self.unary())
        return self.power()

    def power(self):
        base = self.postfix()
        if self.at("^", "**"):
            self.next()
            return power(base, self.exponent())
        return base

    def exponent(self):
        if self.at("-", "+"):
            sign = -1 if self.next()[1] == "-" else 1
            return mul(sign, self.exponent())
        if self.at("{"):
            return self.group()
        kind, text = self.peek()
        if kind == "num":
            self.next()
            return self.number(text)
        return self.power() if kind != "word" else self.letter()

    def postfix(self):
        value = self.atom()
        while self.at("!", "'"):
            if self.next()[1] == "'":
                raise Unsupported("derivative marks")
            if not self.at("!"):
                value = factorial(value)
                continue
            self.next()  # n!!: the double factorial (see the departures above)
            if self.at("!"):
                raise Unsupported("three factorial marks")
            value = double_factorial(value)
        return value

    def starts_atom(self) -> bool:
        kind, text = self.peek()
        if kind in ("num",):
            return True
        if kind == "word":
            return text not in _SEPARATORS and text not in _HEDGES
        if kind == "cmd":
            return text not in _RELATIONS and text not in (
                r"\cdot",
                r"\times",
                r"\div",
                r"\pm",
                r"\mp",
                r"\cup",
                r"\approx",
                r"\}",
                r"\end",
                r"\rfloor",
                r"\rceil",
                r"\rvert",
            )
        if text == "|":
            return self.abs_depth == 0
        return text in ("(", "{")
