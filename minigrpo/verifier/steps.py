"""Stage 2 of the loop, verify: the arithmetic steps of a completion, each checked exactly.

In: a completion, the spans of it that its author did not write (a tool's output), and the problem text it
answers. Out: its `expression = number` steps in order, each with offsets, exact correctness (the left
side read by `step_expression`, over Fractions: nothing of the text is run), relevance (every number it
uses is the problem's or an earlier result) and a reward. It knows strings, not tokens: mapping a step's
character offsets to token positions, and tokens to who wrote them, is the caller's.
Departures from DeepSeekMath §4.1.3: step rewards come from this check, not from a learned process reward
model, and only arithmetic is judged: text that is not arithmetic is no step and earns nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .step_expression import (
    MAX_EXPRESSION_CHARS,
    Token,
    literal_value,
    operator_at,
    read_expression,
    skip_spaces,
    tokenize,
)

# a step's reward: correct and relevant, correct but using a number from nowhere, wrong (relevant or not)
STEP_REWARDS = {"correct": 1.0, "irrelevant": 0.0, "wrong": -1.0}
MAX_STEPS = 200  # steps of one completion past this many are not checked
MAX_SCAN_CHARS = 50_000  # only this much of a completion (and of a problem) is read


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
    tokens = tokenize(text)
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


_EXPRESSION_KINDS = frozenset({"num", "space", "frac", "op", "open", "close"})
_BOUNDARIES = frozenset(";,:<>[|\"'`\n\r")  # characters that may touch a step's left side
_GOES_ON = frozenset("^%_!\\")  # characters that, touching a claimed number, make it part of more


# -- one step ----------------------------------------------------------------------------------------
def _step_at(text: str, tokens: list[Token], eq: int, known: set[Fraction]) -> Step | None:
    right = _right_side(text, tokens, eq)
    left = _left_side(text, tokens, eq) if right is not None else None
    parser = read_expression(text, left) if left is not None else None
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


def _left_side(text: str, tokens: list[Token], eq: int) -> list[Token] | None:
    """The tokens (spaces dropped) of the expression just left of tokens[eq]; None when there is none."""
    first = eq
    while first > 0 and tokens[first - 1].kind in _EXPRESSION_KINDS:
        first -= 1
    before = tokens[first - 1] if first > 0 else None
    if before is not None and first < eq and tokens[first].kind != "space" and not _boundary(text, before):
        return None  # glued to a word or symbol: 3x+2=8, 2^3+1=9, f(2)=4
    first = skip_spaces(tokens, first)
    if before is not None and before.kind == "word" and operator_at(text, tokens, first) == "-":
        if first + 1 < eq and tokens[first + 1].kind == "space":
            return None  # "2x - 3*2 = 7": the minus subtracts from the words' expression
    left = [token for token in tokens[first:eq] if token.kind != "space"]
    return _drop_unmatched_openers(left) or None


def _boundary(text: str, token: Token) -> bool:
    return token.kind == "eq" or (token.kind == "other" and text[token.start] in _BOUNDARIES)


def _drop_unmatched_openers(left: list[Token]) -> list[Token]:
    """`(2+3=5` or `{3+4=7`: the opening brackets that nothing closes are prose, not the expression's."""
    unmatched = sum(1 if token.kind == "open" else -1 if token.kind == "close" else 0 for token in left)
    first = 0
    while unmatched > 0 and first < len(left) and left[first].kind == "open":
        first += 1
        unmatched -= 1
    return left[first:]


def _right_side(text: str, tokens: list[Token], eq: int) -> tuple[Fraction, int] | None:
    """The number written just right of tokens[eq] and the index of its last token; None when none is."""
    i = skip_spaces(tokens, eq + 1)
    sign = 1
    if operator_at(text, tokens, i) == "-":
        sign = -1
        i = skip_spaces(tokens, i + 1)
    number = _plain_number(text, tokens, i) or _latex_fraction(text, tokens, i)
    if number is None or _goes_on(text, tokens, number[1] + 1):
        return None
    return sign * number[0], number[1]


def _plain_number(text: str, tokens: list[Token], i: int) -> tuple[Fraction, int] | None:
    """An integer, decimal or p/q (no spaces) at tokens[i], and the index of its last token."""
    if i >= len(tokens) or tokens[i].kind != "num":
        return None
    value = literal_value(text, tokens[i])
    if value is None:
        return None
    if operator_at(text, tokens, i + 1) != "/" or i + 2 >= len(tokens) or tokens[i + 2].kind != "num":
        return value, i
    denominator = literal_value(text, tokens[i + 2])
    if not denominator:  # 3/0 is no number; a denominator past MAX_DIGITS gives no step either
        return None
    return value / denominator, i + 2


def _latex_fraction(text: str, tokens: list[Token], i: int) -> tuple[Fraction, int] | None:
    """\\frac{p}{q} of two literals at tokens[i], and the index of its last token."""
    if i >= len(tokens) or tokens[i].kind != "frac":
        return None
    parts = []
    for expected in ("{", "num", "}", "{", "num", "}"):
        i = skip_spaces(tokens, i + 1)
        if i >= len(tokens):
            return None
        if expected == "num":
            parts.append(literal_value(text, tokens[i]) if tokens[i].kind == "num" else None)
        elif text[tokens[i].start : tokens[i].end] != expected:
            return None
    numerator, denominator = parts
    if numerator is None or not denominator:
        return None
    return numerator / denominator, i


def _goes_on(text: str, tokens: list[Token], i: int) -> bool:
    """Whether what follows a claimed number (from tokens[i]) makes it part of more than a number."""
    if i >= len(tokens):
        return False
    glued = tokens[i]
    if glued.kind in ("word", "open", "frac") or (glued.kind == "other" and text[glued.start] in _GOES_ON):
        return True  # 6x, 12cm, 5(2), 5^2, 50%, 3!
    i = skip_spaces(tokens, i)
    if operator_at(text, tokens, i) is None:
        return False
    i = skip_spaces(tokens, i + 1)
    return i < len(tokens) and tokens[i].kind in ("num", "open", "frac")  # = 4 + 1, = 24 / 2


# -- the problem's numbers ------------------------------------------------------------------------------
def _problem_numbers(problem: str) -> set[Fraction]:
    """Magnitudes of the numbers of `problem`: each literal, each p/q and \\frac{p}{q}, p% also as p/100."""
    text = problem[:MAX_SCAN_CHARS]
    tokens = tokenize(text)
    known = set()
    for i, token in enumerate(tokens):
        if token.kind not in ("num", "frac"):
            continue
        fraction = _plain_number(text, tokens, i) or _latex_fraction(text, tokens, i)  # 3/4, \frac{3}{4}
        if fraction is not None:
            known.add(fraction[0])
        value = literal_value(text, token) if token.kind == "num" else None
        if value is not None:
            known.add(value)
            if i + 1 < len(tokens) and text[tokens[i + 1].start] == "%":
                known.add(value / 100)
    return known
