"""Stage 2 of the loop, verify: rewrite an extracted answer into one canonical spelling.

In: an answer string as the model or the dataset wrote it (LaTeX or plain text). Out: the same
answer with presentation stripped: delimiters, \\left/\\right, spacing commands, \\dfrac and
friends, \\text{} wrappers and unit words, degree and percent marks, currency, thousands
separators, a trailing period. Two answers spelled the same by `canonical` are the same answer;
anything else is for `parse` and `equivalence`. Pure string work, linear in the length of the answer.

Two spellings come out. `canonical` keeps every approximation, written `a \\approx b` however it came
(\\simeq, ≈), so that `equivalence` can check the rounding b against a: answers are compared in it.
`normalize` is the answer alone, each approximation standing for what it approximates
('x = 1/3 \\approx 0.33' -> 'x = 1/3', 'x \\approx 5' -> 'x = 5'): what groups equal answers, as a
majority vote does, unchecked.
"""

from __future__ import annotations

import re

# Words that name a unit rather than a quantity, dropped wherever they stand ("5 cm" -> "5").
# Single letters (m, g, s, h) are left out on purpose: they are far more often variables.
UNIT_WORDS = frozenset(
    """
    cm mm km meter meters metre metres centimeter centimeters kilometer kilometers inch inches
    ft foot feet yd yard yards mi mile miles unit units sq square cubic kg gram grams mg lb
    lbs pound pounds oz ounce ounces ml liter liters litre litres gal gallon gallons sec
    second seconds min minute minutes hr hrs hour hours day days week weeks month months year
    years mph kph dollar dollars cent cents usd euro euros percent pct deg degree degrees rad
    radian radians point points
    """.split()
)

_SPACING = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg|displaystyle|textstyle"
    r"|limits|nolimits|enspace|thinspace|negthinspace)(?![A-Za-z])|\\q?quad"
    r"|(?<!\\)\\[,:;! ]|~"
)
_FRAC_ALIASES = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_IGNORED_GROUPS = re.compile(r"\\(?:hspace|vspace|phantom|hphantom|vphantom|label|tag)\*?\{[^{}]*\}")
_TEXT_COMMANDS = re.compile(
    r"\\(?:text|textrm|textbf|textit|textnormal|texttt|mbox|mathrm|mathbf|mathit|mathsf|mathtt"
    r"|operatorname|boxed|fbox)\s*\{"
)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°|\^\{\\text\{o\}\}")
_PERCENT_AND_MONEY = re.compile(r"\\%|%|\\\$|\$")
# Thousands separators. The first group of a number written with them has 1-3 digits and does not
# start with 0: "0,500" is a list (or a decimal comma), never 500.
# 10{,}000, 10,\!000
_BRACED_THOUSANDS = re.compile(r"(?<![\d.])[1-9]\d{0,2}(?:\s*(?:\{\s*,\s*\}|,\\!)\s*\d{3})+(?!\d)")
_BRACE = re.compile(r"(?<!\\)[{}]")
_UNIT_POWER = re.compile(r"\s*\^\s*\{?\s*[23]\s*\}?")
_SIMPLE_SUBSCRIPT = re.compile(r"_\{\s*([A-Za-z0-9]+)\s*\}")
_SPACED_THOUSANDS = re.compile(r"(?<![\d.])[1-9]\d{0,2}(?: \d{3})+(?![\d.])")
_COMMA_THOUSANDS = re.compile(
    r"^(?P<pre>[^,()\[\]{}]*?)(?P<num>[1-9]\d{0,2}(?:,\d{3})+)(?P<post>(?:\.\d+)?[^,()\[\]{}]*)$"
)
_TRAILING_WORDS_REVERSED = re.compile(r"\s*(?:[A-Za-z]{2,}\s+)+")  # on the reversed string
_ENDS_IN_NUMBER = re.compile(r"[^A-Za-z]*\d")  # on the reversed string: a digit after the last letter
_APPROX = re.compile(r"\\approx(?![A-Za-z])|\\simeq(?![A-Za-z])|≈")
_SEPARATOR = re.compile(r"[,;]|\band\b|\bor\b")
_EQUALS = re.compile(r"(?<![<>!=\\])=(?![=<>])")
MATH_WORDS = frozenset("and or sin cos tan sec csc cot log ln exp sqrt pi infty".split())
_UNICODE = {
    "−": "-",
    "–": "-",
    "×": r"\times ",
    "·": r"\cdot ",
    "÷": "/",
    "√": r"\sqrt ",
    "π": r"\pi ",
    "∞": r"\infty ",
    "≤": r"\le ",
    "≥": r"\ge ",
    "≠": r"\ne ",
    "∪": r"\cup ",
    "∩": r"\cap ",
    "ℝ": r"\mathbb{R}",
    "∈": r"\in ",
    "±": r"\pm ",
    "∓": r"\mp ",
    "∅": r"\emptyset ",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))


def normalize(answer: str) -> str:
    """The answer alone: `canonical`, with each approximation replaced by what it approximates."""
    return _without_approximations(canonical(answer))


def canonical(answer: str) -> str:
    """The canonical spelling of one answer, approximations kept (see the module docstring)."""
    s = answer.strip()
    if "\\begin" not in s:
        s = re.sub(r"\\\\(?=[A-Za-z])", r"\\", s)  # a doubly escaped response: \\frac -> \frac
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group()], s)
    s = _strip_outer_delimiters(s)
    s = _BRACED_THOUSANDS.sub(_digits_only, s)
    s = _IGNORED_GROUPS.sub("", s)
    s = _DEGREES.sub(" ", s)
    s = _PERCENT_AND_MONEY.sub(" ", s)
    s = _SPACING.sub(" ", s)
    s = _FRAC_ALIASES.sub(r"\\frac", s)
    s = _APPROX.sub(r" \\approx ", s)
    s = _unwrap_text_commands(s, drop_units=True) or _unwrap_text_commands(s, drop_units=False)
    s = _join_thousands(s)
    s = _drop_unit_words(s)
    s = _SIMPLE_SUBSCRIPT.sub(r"_\1", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".,;: \\").strip()  # and a stray backslash: 185\\ -> 185
    return _final_link(s)


def _strip_outer_delimiters(s: str) -> str:
    for left, right in (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : -len(right)].strip()
    return s


def _unwrap_text_commands(s: str, drop_units: bool) -> str:
    """\\text{ cm} -> ' cm ', \\boxed{x} -> 'x': the command and its braces go, the content stays.

    One scan with a stack of the open commands, innermost last, rather than a recursion into each
    command's content: nesting 1,200 deep raised RecursionError, and rescanning each content for
    its closing brace made deep nesting quadratic. An unterminated command and all after it stay
    as written."""
    partner = _brace_partners(s)
    stack = [(len(s), [])]  # (index of the group's closing brace, its pieces so far): the whole string first
    i = 0
    for match in _TEXT_COMMANDS.finditer(s):
        i = _close_groups(s, stack, i, match.start(), drop_units)
        end = partner.get(match.end() - 1)
        if end is None:
            break
        stack[-1][1].append(s[i : match.start()])
        stack.append((end, []))
        i = match.end()
    i = _close_groups(s, stack, i, len(s), drop_units)
    stack[0][1].append(s[i:])
    return "".join(stack[0][1]).strip()


def _close_groups(s: str, stack: list, i: int, upto: int, drop_units: bool) -> int:
    """Close every open command that ends before `upto`, innermost first; the index after the last."""
    while len(stack) > 1 and stack[-1][0] < upto:
        end, pieces = stack.pop()
        content = ("".join(pieces) + s[i:end]).strip()
        i = end + 1
        if drop_units and _only_units(content):
            stack[-1][1].append(" ")
            power = _UNIT_POWER.match(s, i, stack[-1][0])  # \\text{ cm}^2, within the enclosing group
            i = power.end() if power else i
        else:
            stack[-1][1].append(" " + content + " ")
    return i


def _only_units(text: str) -> bool:
    """'cm', ' m', 'in^2', 'square feet': inside \\text{} even a single letter is a unit."""
    words = re.sub(r"\^\s*\{?[23]\}?|\.", " ", text).split()
    return bool(words) and all(
        w.lower() in UNIT_WORDS or (len(w) == 1 and w.isalpha()) or w == "in" for w in words
    )


def _brace_partners(s: str) -> dict[int, int]:
    """Index of each '{' -> index of the '}' that closes it; braces after a backslash do not count."""
    partner = {}
    open_at = []
    for match in _BRACE.finditer(s):
        if match.group() == "{":
            open_at.append(match.start())
        elif open_at:
            partner[open_at.pop()] = match.start()
    return partner


def _join_thousands(s: str) -> str:
    """12{,}345 / 12 345 -> 12345 always; 12,345 -> 12345 only when no list or tuple could be meant."""
    s = _BRACED_THOUSANDS.sub(_digits_only, s)
    s = _SPACED_THOUSANDS.sub(_digits_only, s)
    match = _COMMA_THOUSANDS.match(s)
    if match and not re.search(r"\d\s*$", match.group("pre")):
        s = match.group("pre") + match.group("num").replace(",", "") + match.group("post")
    return s


def _digits_only(match: re.Match) -> str:
    return re.sub(r"\D", "", match.group())


def _drop_unit_words(s: str) -> str:
    """Remove unit words (and a '^2' or '^3' on them) when something other than words remains."""
    stripped = re.sub(
        r"(?<![A-Za-z\\])([A-Za-z]+)\.?(?:\s*\^\s*\{?[23]\}?)?(?![A-Za-z])",
        lambda m: " " if m.group(1).lower() in UNIT_WORDS else m.group(),
        s,
    )
    if not re.search(r"[0-9A-Za-z\\]", stripped):
        return s
    # words left after a number are a label too: "72 clips", "18 square feet"
    number, words = _split_trailing_words(stripped)
    if words and _ENDS_IN_NUMBER.match(number[::-1]) and not set(words) & MATH_WORDS:
        return number
    return stripped


def _split_trailing_words(s: str) -> tuple[str, list[str]]:
    """'3 big apples' -> ('3', ['big', 'apples']): the words of two or more letters that end `s`,
    each after white space. Matched on the reversed string from its start, where one regex pass is
    linear; a search from the end ('.*' then the words) backtracked quadratically on long numbers."""
    backwards = _TRAILING_WORDS_REVERSED.match(s[::-1])
    if backwards is None:
        return s, []
    return s[: len(s) - backwards.end()], backwards.group()[::-1].split()


def _final_link(s: str) -> str:
    """The last link of a chain: 'x = 5+5+1 = 11' -> 'x = 11', 'x = 2/6 = 1/3 \\approx 0.33' -> 'x = 1/3
    \\approx 0.33' (an approximation belongs to the link it follows)."""
    items = _split_top_level(s, _SEPARATOR)
    if len(items) > 1:
        links = [_final_link(item) for item in items]
        return s if links == items else ", ".join(links)
    links = _split_top_level(s, _EQUALS)
    if len(links) < 3:
        return s
    return (links[0] + " = " if _is_name(links[0]) else "") + links[-1]


def _without_approximations(s: str) -> str:
    """'x = 1/3 \\approx 0.33' -> 'x = 1/3', 'x \\approx 5' -> 'x = 5', in each item of a list; an item
    with nothing before its \\approx stays as it is (an answer is never emptied here)."""
    items = _split_top_level(s, _SEPARATOR)
    if len(items) > 1:
        answers = [_without_approximations(item) for item in items]
        return s if answers == items else ", ".join(answers)
    parts = _split_top_level(s, _APPROX)
    if len(parts) == 1 or not parts[0]:
        return s
    return parts[0] + " = " + parts[1] if _is_name(parts[0]) else parts[0]


def _is_name(s: str) -> bool:
    return bool(re.fullmatch(r"\\?[A-Za-z]+(?:_[A-Za-z0-9]+)?", s.strip()))


def _split_top_level(s: str, separator: re.Pattern) -> list[str]:
    """s split at the matches of `separator` that are outside all brackets."""
    parts = []
    depth = 0
    start = 0
    i = 0
    while i < len(s):
        c = s[i]
        depth += c in "([{"
        depth -= c in ")]}"
        match = separator.match(s, i) if depth == 0 else None
        if match and match.end() > i:
            parts.append(s[start:i].strip())
            start = i = match.end()
            continue
        i += 1
    parts.append(s[start:].strip())
    return parts
