"""Stage 2 of the loop, verify: arithmetic as a completion writes it, read into tokens and evaluated exactly.

In: text and the tokens of an expression. Out: tokens (`tokenize`), the operator or number a token stands
for, and the exact value of an expression's tokens as a Fraction (`read_expression`: a small
recursive-descent parser; nothing of the text is run). It knows arithmetic, not steps: which `=` makes a
step, and what the problem's numbers are, is `steps`'s.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

MAX_EXPRESSION_CHARS = 300  # a longer left side is judged wrong without being evaluated
MAX_DIGITS = 50  # a longer number makes its expression wrong; a longer claimed result is no step
MAX_DEPTH = 20  # parentheses, braces and \frac nested deeper make a step wrong


# -- tokens ---------------------------------------------------------------------------------------------
class Token(NamedTuple):
    kind: str  # num, space, frac, op, open, close, eq, word or other (one character)
    start: int
    end: int


_TOKEN = re.compile(
    # 1,200 only where no list reading is possible: not after "5," nor before ",7" or another digit
    r"(?P<num>(?<![0-9,.])[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?(?![0-9]|,[0-9])|[0-9]+(?:\.[0-9]+)?)"
    r"|(?P<space>[ \t\u00a0]+|\$|\*\*|\\[$,;:! ()\[\]]|\\(?:left|right|q?quad)(?![a-zA-Z]))"
    r"|(?P<frac>\\[dt]?frac(?![a-zA-Z]))"
    r"|(?P<op>[-+*/×÷−·⋅]|\\(?:cdot|times|div)(?![a-zA-Z]))"
    r"|(?P<open>[({])|(?P<close>[)}])"
    r"|(?P<eq>(?<![=<>!:])=(?![=>]))"  # not == <= >= != := =>
    r"|(?P<word>[^\W\d_]+|\\[a-zA-Z]+)"
    r"|(?P<other>.)",
    re.DOTALL,
)
_OPERATORS = {"+": "+", "-": "-", "−": "-", "*": "*", "×": "*", "·": "*", "⋅": "*", "\\cdot": "*"}
_OPERATORS |= {"\\times": "*", "/": "/", "÷": "/", "\\div": "/"}


def tokenize(text: str) -> list[Token]:
    return [Token(match.lastgroup, match.start(), match.end()) for match in _TOKEN.finditer(text)]


def operator_at(text: str, tokens: list[Token], i: int) -> str | None:
    """The operator tokens[i] stands for (+ - * /), or None when it is none (or past the end)."""
    if i >= len(tokens) or tokens[i].kind != "op":
        return None
    return _OPERATORS[text[tokens[i].start : tokens[i].end]]


def literal_value(text: str, token: Token) -> Fraction | None:
    """The value of a num token, or None past MAX_DIGITS digits."""
    written = text[token.start : token.end].replace(",", "")
    if len(written) - ("." in written) > MAX_DIGITS:
        return None
    return Fraction(written)


def skip_spaces(tokens: list[Token], i: int) -> int:
    while i < len(tokens) and tokens[i].kind == "space":
        i += 1
    return i


# -- the expression -------------------------------------------------------------------------------------
class _NotArithmetic(Exception):
    """The tokens are no arithmetic expression: there is no step here."""


class _TooDeep(Exception):
    """Nesting past MAX_DEPTH: the step is judged wrong unread."""


def read_expression(text: str, left: list[Token]) -> _Parser | None:
    """The parsed left side (its value None when undefined or past a limit); None when it is no arithmetic."""
    if not any(token.kind in ("op", "frac") for token in left):
        return None  # x = 5, 185 = 185: nothing is computed
    parser = _Parser(text, left)
    if left[-1].end - left[0].start > MAX_EXPRESSION_CHARS:
        return parser.unread()
    try:
        parser.parse()
    except _NotArithmetic:
        return None
    except _TooDeep:
        return _Parser(text, left).unread()
    return parser if parser.operators > 0 else None  # -5 = -5: a sign is no computation


class _Parser:
    """Recursive descent over a left side's tokens (spaces dropped), exact, with value None when undefined.

    expression := term (("+" | "-") term)*
    term       := signed (("*" | "/") signed)*
    signed     := "-"* atom
    atom       := number | "(" expression ")" | "{" expression "}" | \\frac group group
    group      := "{" expression "}"
    """

    def __init__(self, text: str, tokens: list[Token]):
        self.text = text
        self.tokens = tokens
        self.position = 0
        self.depth = 0
        self.value: Fraction | None = None
        self.literals: list[Fraction | None] = []  # each number as written, without its sign
        self.fraction_of: dict[int, Fraction] = {}  # a literal's index -> the value of the p/q it is part of
        self.operators = 0  # binary operators and \frac read

    def parse(self) -> None:
        self.value = self.expression()
        if self.position != len(self.tokens):
            raise _NotArithmetic

    def unread(self) -> _Parser:
        """Judged wrong without evaluation: only its literals are collected, for relevance."""
        self.literals = [literal_value(self.text, token) for token in self.tokens if token.kind == "num"]
        self.value = None
        return self

    def relevant(self, known: set[Fraction]) -> bool:
        return all(
            literal in known or self.fraction_of.get(index) in known
            for index, literal in enumerate(self.literals)
        )

    def expression(self) -> Fraction | None:
        value = self.term()
        while operator_at(self.text, self.tokens, self.position) in ("+", "-"):
            operator = self.take_operator()
            value = _combine(operator, value, self.term())
        return value

    def term(self) -> Fraction | None:
        value, literal = self.signed()  # literal: the index of the factor just read, when a bare literal
        while operator_at(self.text, self.tokens, self.position) in ("*", "/"):
            operator = self.take_operator()
            right, right_literal = self.signed()
            if operator == "/" and literal is not None and right_literal is not None:
                self.mark_fraction(literal, right_literal)  # 3/4: a fraction as written
            value = _combine(operator, value, right)
            literal = right_literal if operator == "*" else None
        return value

    def signed(self) -> tuple[Fraction | None, int | None]:
        negative = False
        while operator_at(self.text, self.tokens, self.position) == "-":
            self.position += 1
            negative = not negative
        value, literal = self.atom()
        return (-value if negative and value is not None else value), literal

    def atom(self) -> tuple[Fraction | None, int | None]:
        token = self.next()
        if token.kind == "num":
            self.literals.append(literal_value(self.text, token))
            return self.literals[-1], len(self.literals) - 1
        if token.kind == "frac":
            numerator, numerator_literal = self.group("{", "}")
            denominator, denominator_literal = self.group("{", "}")
            self.operators += 1
            if numerator_literal is not None and denominator_literal is not None:
                self.mark_fraction(numerator_literal, denominator_literal)
            return _combine("/", numerator, denominator), None
        if token.kind == "open":
            opener = self.text[token.start]
            self.position -= 1
            value, _ = self.group(opener, ")" if opener == "(" else "}")
            return value, None
        raise _NotArithmetic

    def group(self, opener: str, closer: str) -> tuple[Fraction | None, int | None]:
        """A bracketed expression, and its literal's index when it holds one bare literal."""
        if self.text[self.next().start] != opener:
            raise _NotArithmetic
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _TooDeep
        start = self.position
        value = self.expression()
        bare = self.position == start + 1 and self.tokens[start].kind == "num"
        if self.text[self.next().start] != closer:
            raise _NotArithmetic
        self.depth -= 1
        return value, len(self.literals) - 1 if bare else None

    def next(self) -> Token:
        if self.position >= len(self.tokens):
            raise _NotArithmetic
        self.position += 1
        return self.tokens[self.position - 1]

    def take_operator(self) -> str:
        operator = operator_at(self.text, self.tokens, self.position)
        self.position += 1
        self.operators += 1
        return operator

    def mark_fraction(self, numerator: int, denominator: int) -> None:
        value = _combine("/", self.literals[numerator], self.literals[denominator])
        if value is not None:
            self.fraction_of[numerator] = self.fraction_of[denominator] = value


def _combine(operator: str, left: Fraction | None, right: Fraction | None) -> Fraction | None:
    if left is None or right is None or (operator == "/" and right == 0):
        return None  # undefined: past a limit, or a division by zero
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    return left * right if operator == "*" else left / right
