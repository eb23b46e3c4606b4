"""Stage 2 of the loop, reward: the arithmetic steps of a completion, each checked exactly.

In: a completion, the spans of it that its author did not write (a tool's output), and the problem text it
answers. Out: its `expression = number` steps in order, each with offsets, exact correctness (a small
recursive-descent parser over Fractions: nothing of the text is run), relevance (every number it uses is
the problem's or an earlier result) and a reward. It knows strings, not tokens: mapping a step's character
offsets to token positions, and tokens to who wrote them, is the caller's.
Departures from DeepSeekMath §4.1.3: step rewards come from this check, not from a learned process reward
model, and only arithmetic is judged: text that is not arithmetic is no step and earns nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

# a step's reward: correct and relevant, correct but using a number from nowhere, wrong (relevant or not)
STEP_REWARDS = {"correct": 1.0, "irrelevant": 0.0, "wrong": -1.0}
MAX_STEPS = 200  # steps of one completion past this many are not checked
MAX_SCAN_CHARS = 50_000  # only this much of a completion (and of a problem) is read
MAX_EXPRESSION_CHARS = 300  # a longer left side is judged wrong without being evaluated
MAX_DIGITS = 50  # a longer number makes its expression wrong; a longer claimed result is no step
MAX_DEPTH = 20  # parentheses, braces and \frac nested deeper make a step wrong


@dataclass(frozen=True)
class Step:
    start: int  # offset in the completion of the step's first character
    end: int  # offset just past its last character (completion[start:end] is the step as written)
    expression: str  # the left side as written, e.g. "23*6" or "\\frac{3}{4} \\cdot 8"
    claimed: Fraction  # the number written after "="
    correct: bool  # the expression's exact value equals `claimed`
    relevant: bool  # every operand is a number of the problem or an earlier step's claimed result
    reward: float  # STEP_REWARDS: correct and relevant 1.0, correct but irrelevant 0.0, wrong -1.0


def check_steps(completion: str, problem: str, unwritten: Sequence[tuple[int, int]] = ()) -> list[Step]:
    """Every `expression = number` step of `completion`, in order, checked exactly.

    `unwritten`: (start, end) character spans of the completion that its author did not write (a tool's
    output). They read as line breaks: no step lies in one or runs across one, and their numbers are
    not known (a tool that prints numbers makes no step relevant).

    A step is an `=` with arithmetic on its left (numbers; + - * / and × ÷ − · \\cdot \\times \\div;
    parentheses, braces, \\frac{}{}; unary minus) and a number on its right (an integer, a decimal,
    `1,200`, `p/q` or \\frac{p}{q}, with a sign). Spaces, `$`, `**`, \\( \\) \\[ \\] \\left \\right are
    skipped. A left side that touches a word or symbol (`3x+2=8`, `2^3+1=9`) or has no operator
    (`x=5`, `185=185`) is no step, nor is a right side that goes on (`2+3=4+1`, `=12cm`, `=5^2`); in a chain
    the links that qualify are steps (`3x=14-5=9` gives `14-5=9`, `2+3=5=5` gives `2+3=5`). GSM8K's
    `48/2 = <<48/2=24>>24` is one step, the annotation: `<<` is no number. Two steps share text only when
    a chain's middle is a fraction (`1+2=6/2=3`). Relevance compares magnitudes (a sign is an operation),
    and a fraction p/q of two literals counts when its value or both p and q are known.
    """
    text = _blank(completion[:MAX_SCAN_CHARS], unwritten)
    # a step ending near a cut may have lost the rest of its number, or what shows that it goes on
    last_end = len(text) if len(completion) <= MAX_SCAN_CHARS else MAX_SCAN_CHARS - MAX_EXPRESSION_CHARS
    tokens = _tokenize(text)
    known = _problem_numbers(problem)
    steps = []
    for eq, token in enumerate(tokens):
        if token.kind != "eq":
            continue
        step = _step_at(text, tokens, eq, known)
        if step is None or step.end > last_end:
            continue
        steps.append(step)
        known.add(abs(step.claimed))
        if len(steps) == MAX_STEPS:
            break
    return steps


def _blank(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` with each span's characters replaced by line breaks: every offset stays where it was."""
    if not spans:
        return text
    characters = list(text)
    for start, end in spans:
        characters[start:end] = "\n" * len(characters[start:end])
    return "".join(characters)


# -- tokens ---------------------------------------------------------------------------------------------
class _Token(NamedTuple):
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
_EXPRESSION_KINDS = frozenset({"num", "space", "frac", "op", "open", "close"})
_BOUNDARIES = frozenset(";,:<>[|\"'`\n\r")  # characters that may touch a step's left side
_GOES_ON = frozenset("^%_!\\")  # characters that, touching a claimed number, make it part of more


def _tokenize(text: str) -> list[_Token]:
    return [_Token(match.lastgroup, match.start(), match.end()) for match in _TOKEN.finditer(text)]


def _operator(text: str, tokens: list[_Token], i: int) -> str | None:
    """The operator tokens[i] stands for (+ - * /), or None when it is none (or past the end)."""
    if i >= len(tokens) or tokens[i].kind != "op":
        return None
    return _OPERATORS[text[tokens[i].start : tokens[i].end]]


def _number(text: str, token: _Token) -> Fraction | None:
    """The value of a num token, or None past MAX_DIGITS digits."""
    written = text[token.start : token.end].replace(",", "")
    if len(written) - ("." in written) > MAX_DIGITS:
        return None
    return Fraction(written)


def _skip_spaces(tokens: list[_Token], i: int) -> int:
    while i < len(tokens) and tokens[i].kind == "space":
        i += 1
    return i


# -- one step ----------------------------------------------------------------------------------------
def _step_at(text: str, tokens: list[_Token], eq: int, known: set[Fraction]) -> Step | None:
    right = _right_side(text, tokens, eq)
    left = _left_side(text, tokens, eq) if right is not None else None
    parser = _read(text, left) if left is not None else None
    if parser is None:
        return None
    claimed, last = right
    correct = parser.value is not None and parser.value == claimed
    relevant = parser.relevant(known)
    if not correct:
        reward = STEP_REWARDS["wrong"]
    else:
        reward = STEP_REWARDS["correct"] if relevant else STEP_REWARDS["irrelevant"]
    expression = text[left[0].start : left[-1].end]
    return Step(left[0].start, tokens[last].end, expression, claimed, correct, relevant, reward)


def _left_side(text: str, tokens: list[_Token], eq: int) -> list[_Token] | None:
    """The tokens (spaces dropped) of the expression just left of tokens[eq]; None when there is none."""
    first = eq
    while first > 0 and tokens[first - 1].kind in _EXPRESSION_KINDS:
        first -= 1
    before = tokens[first - 1] if first > 0 else None
    if before is not None and first < eq and tokens[first].kind != "space" and not _boundary(text, before):
        return None  # glued to a word or symbol: 3x+2=8, 2^3+1=9, f(2)=4
    first = _skip_spaces(tokens, first)
    if before is not None and before.kind == "word" and _operator(text, tokens, first) == "-":
        if first + 1 < eq and tokens[first + 1].kind == "space":
            return None  # "2x - 3*2 = 7": the minus subtracts from the words' expression
    left = [token for token in tokens[first:eq] if token.kind != "space"]
    return _drop_unmatched_openers(left) or None


def _boundary(text: str, token: _Token) -> bool:
    return token.kind == "eq" or (token.kind == "other" and text[token.start] in _BOUNDARIES)


def _drop_unmatched_openers(left: list[_Token]) -> list[_Token]:
    """`(2+3=5` or `{3+4=7`: the opening brackets that nothing closes are prose, not the expression's."""
    unmatched = sum(1 if token.kind == "open" else -1 if token.kind == "close" else 0 for token in left)
    first = 0
    while unmatched > 0 and first < len(left) and left[first].kind == "open":
        first += 1
        unmatched -= 1
    return left[first:]


def _right_side(text: str, tokens: list[_Token], eq: int) -> tuple[Fraction, int] | None:
    """The number written just right of tokens[eq] and the index of its last token; None when none is."""
    i = _skip_spaces(tokens, eq + 1)
    sign = 1
    if _operator(text, tokens, i) == "-":
        sign = -1
        i = _skip_spaces(tokens, i + 1)
    number = _plain_number(text, tokens, i) or _latex_fraction(text, tokens, i)
    if number is None or _goes_on(text, tokens, number[1] + 1):
        return None
    return sign * number[0], number[1]


def _plain_number(text: str, tokens: list[_Token], i: int) -> tuple[Fraction, int] | None:
    """An integer, decimal or p/q (no spaces) at tokens[i], and the index of its last token."""
    if i >= len(tokens) or tokens[i].kind != "num":
        return None
    value = _number(text, tokens[i])
    if value is None:
        return None
    if _operator(text, tokens, i + 1) != "/" or i + 2 >= len(tokens) or tokens[i + 2].kind != "num":
        return value, i
    denominator = _number(text, tokens[i + 2])
    if not denominator:  # 3/0 is no number; a denominator past MAX_DIGITS gives no step either
        return None
    return value / denominator, i + 2


def _latex_fraction(text: str, tokens: list[_Token], i: int) -> tuple[Fraction, int] | None:
    """\\frac{p}{q} of two literals at tokens[i], and the index of its last token."""
    if i >= len(tokens) or tokens[i].kind != "frac":
        return None
    parts = []
    for expected in ("{", "num", "}", "{", "num", "}"):
        i = _skip_spaces(tokens, i + 1)
        if i >= len(tokens):
            return None
        if expected == "num":
            parts.append(_number(text, tokens[i]) if tokens[i].kind == "num" else None)
        elif text[tokens[i].start : tokens[i].end] != expected:
            return None
    numerator, denominator = parts
    if numerator is None or not denominator:
        return None
    return numerator / denominator, i


def _goes_on(text: str, tokens: list[_Token], i: int) -> bool:
    """Whether what follows a claimed number (from tokens[i]) makes it part of more than a number."""
    if i >= len(tokens):
        return False
    glued = tokens[i]
    if glued.kind in ("word", "open", "frac") or (glued.kind == "other" and text[glued.start] in _GOES_ON):
        return True  # 6x, 12cm, 5(2), 5^2, 50%, 3!
    i = _skip_spaces(tokens, i)
    if _operator(text, tokens, i) is None:
        return False
    i = _skip_spaces(tokens, i + 1)
    return i < len(tokens) and tokens[i].kind in ("num", "open", "frac")  # = 4 + 1, = 24 / 2


# -- the expression -------------------------------------------------------------------------------------
class _NotArithmetic(Exception):
    """The tokens are no arithmetic expression: there is no step here."""


class _TooDeep(Exception):
    """Nesting past MAX_DEPTH: the step is judged wrong unread."""


def _read(text: str, left: list[_Token]) -> _Parser | None:
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

    def __init__(self, text: str, tokens: list[_Token]):
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
        self.literals = [_number(self.text, token) for token in self.tokens if token.kind == "num"]
        self.value = None
        return self

    def relevant(self, known: set[Fraction]) -> bool:
        return all(
            literal in known or self.fraction_of.get(index) in known
            for index, literal in enumerate(self.literals)
        )

    def expression(self) -> Fraction | None:
        value = self.term()
        while _operator(self.text, self.tokens, self.position) in ("+", "-"):
            operator = self.take_operator()
            value = _combine(operator, value, self.term())
        return value

    def term(self) -> Fraction | None:
        value, literal = self.signed()  # literal: the index of the factor just read, when a bare literal
        while _operator(self.text, self.tokens, self.position) in ("*", "/"):
            operator = self.take_operator()
            right, right_literal = self.signed()
            if operator == "/" and literal is not None and right_literal is not None:
                self.mark_fraction(literal, right_literal)  # 3/4: a fraction as written
            value = _combine(operator, value, right)
            literal = right_literal if operator == "*" else None
        return value

    def signed(self) -> tuple[Fraction | None, int | None]:
        negative = False
        while _operator(self.text, self.tokens, self.position) == "-":
            self.position += 1
            negative = not negative
        value, literal = self.atom()
        return (-value if negative and value is not None else value), literal

    def atom(self) -> tuple[Fraction | None, int | None]:
        token = self.next()
        if token.kind == "num":
            self.literals.append(_number(self.text, token))
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

    def next(self) -> _Token:
        if self.position >= len(self.tokens):
            raise _NotArithmetic
        self.position += 1
        return self.tokens[self.position - 1]

    def take_operator(self) -> str:
        operator = _operator(self.text, self.tokens, self.position)
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


# -- the problem's numbers ------------------------------------------------------------------------------
def _problem_numbers(problem: str) -> set[Fraction]:
    """Magnitudes of the numbers of `problem`: each literal, each p/q and \\frac{p}{q}, p% also as p/100."""
    text = problem[:MAX_SCAN_CHARS]
    tokens = _tokenize(text)
    known = set()
    for i, token in enumerate(tokens):
        if token.kind not in ("num", "frac"):
            continue
        fraction = _plain_number(text, tokens, i) or _latex_fraction(text, tokens, i)  # 3/4, \frac{3}{4}
        if fraction is not None:
            known.add(fraction[0])
        value = _number(text, token) if token.kind == "num" else None
        if value is not None:
            known.add(value)
            if i + 1 < len(tokens) and text[tokens[i + 1].start] == "%":
                known.add(value / 100)
    return known
