"""Stage 2 of the loop, verify: find the final answer in a model's response.

In: the full response text. Out: the answer as written (a LaTeX or plain-text string), or None.
It knows text conventions (boxes, answer tags, GSM8K's ####, "the answer is"), not mathematics:
deciding whether two answers agree is `equivalence`'s job. Every step is a linear scan, so a
megabyte-long response costs milliseconds.

Where answers are looked for, most trusted first; the first kind present wins, and within a kind
the last occurrence counts ("the last final answer counts"):
  1. \\boxed{...} / \\boxed 7 / \\fbox{...}   an empty or unterminated last box is no answer; boxes
     that follow each other closely ("\\boxed{1} and \\boxed{2}") are one answer, "1, 2", unless
     the words between them correct the first ("Earlier \\boxed{1}, later \\boxed{2}": "2"); a
     "The final answer is ..." sentence after the last box overrides it
  2. <answer>...</answer>
  3. #### 72                                   GSM8K
  4. "The final answer is ...", "Answer: ...", "Final Answer: the largest n is 34"
  5. the last math span ($...$, $$...$$, \\(...\\), \\[...\\]) or the last plain number after it
If the response has a <think>...</think> block, the text after it is searched; the thinking is
searched only when nothing but white space follows it (a box while thinking, then "I am not
sure.", is no answer).

Answers in code (Python, JSON, SQL) come in ``` fences instead: `fenced_block` finds the last closed
block of a language, and says whether the response ends inside an open one (it was cut off).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

FENCE = re.compile(r"^[ \t]*```(.*)$", re.MULTILINE)  # only fence lines are visited: linear in the text
BROKEN = object()  # a marker was found but its answer is empty or unterminated: no answer
BOX_GAP = 60  # boxes at most this many characters apart, in one sentence, form one answer

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_ARGUMENT = re.compile(r"[^\s$\\{}]+")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_SENTENCE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*:?", re.IGNORECASE)
_FINAL_SENTENCE = re.compile(r"final answer\s*(?:is|:)\s*:?", re.IGNORECASE)
_MATH_SPAN = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|(?<!\\)\$(.+?)(?<!\\)\$", re.DOTALL
)
# _MATH_SPAN reads a span at one place; over a whole text `_math_spans` finds them in one pass, with
# the delimiters in the order tried at a place:
_SPAN_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_SPAN_OPENER = re.compile(r"(?<!\\)\$|\\[\[(]")
_SPAN_CLOSERS = {
    "$$": re.compile(r"(?<!\\)(?=\$\$)"),
    "$": re.compile(r"(?<!\\)\$"),
    "\\]": re.compile(r"\\\]"),
    "\\)": re.compile(r"\\\)"),
}
_SENTENCE_END = re.compile(r"\n|\.(?:\s|$)|[;!?](?:\s|$)|\s+(?:I hope|which|because|since)\b")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_SENTENCE_BREAK = re.compile(r"\n\s*\n|[.!?](?:\s|$)")
# between two boxes: the second replaces the first
_CORRECTION = re.compile(
    r"\b(?:later|actually|instead|rather|wait|correct(?:ion|ed)|on second thought|re-?check(?:ed|ing)?"
    r"|after checking)\b",
    re.IGNORECASE,
)
_HEDGE = re.compile(r"\b(?:or|maybe|perhaps|possibly)\b", re.IGNORECASE)  # ... unless the gap also hedges
# A plain number: 72, -3.5, 1,250, 3/4. It never starts at an inner group of a comma-grouped number
# (the "000" of ",000,0"): from every such group the regex walked the rest of the number again, which
# on 20,000 groups took seconds; the number is read from its first group or not at all.
_NUMBER = re.compile(
    r"(?<![\w.])(?!(?<=\d,)\d{3},\d)-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?!\d|[.,]\d)"
)


@dataclass
class Found:
    answer: object  # the answer string, or BROKEN
    start: int  # where its marker begins in the searched text
    end: int  # where it ends


def extract_answer(text: str) -> str | None:
    """The final answer of `text`, stripped, or None when there is none (or it is empty)."""
    if not isinstance(text, str):
        return None
    end_of_thinking = text.rfind("</think>")
    if end_of_thinking < 0:
        found = _find(text)
    else:  # what follows the thinking; the thinking itself only when nothing (but space) follows
        after = text[end_of_thinking + len("</think>") :]
        found = _find(after) if after.strip() else _find(text[:end_of_thinking])
    if found is None or found.answer is BROKEN:
        return None
    return found.answer


def _find(text: str) -> Found | None:
    """The answer in `text` by the order in the module docstring."""
    box = _last_boxes(text)
    if box is not None:
        final = _last_sentence(text, _FINAL_SENTENCE)
        return final if final is not None and final.start > box.end else box
    for finder in (_last_answer_tag, _last_gsm8k, _last_sentence):
        found = finder(text)
        if found is not None:
            return found
    span = _last_math_span(text)
    number = _last_number(text, after=span.end if span else 0)
    return number or span


def top_level_boxes(text: str) -> list[Found]:
    """Every box not nested in another, in order; an unterminated box ends the list (it holds the rest)."""
    boxes = []
    resume = 0
    for match in _BOX.finditer(text):
        if match.start() < resume:
            continue  # a box nested in the previous one: the outer box is the answer
        content, resume = _box_argument(text, match.end())
        boxes.append(Found(content, match.start(), resume))
        if content is BROKEN and resume >= len(text):
            break
    return boxes


def _last_boxes(text: str) -> Found | None:
    """The last top-level box, joined with the boxes just before it; BROKEN if it is empty or open."""
    boxes = top_level_boxes(text)
    if not boxes or boxes[-1].answer is BROKEN:
        return boxes[-1] if boxes else None
    first = len(boxes) - 1
    while (
        first > 0
        and boxes[first - 1].answer is not BROKEN
        and _close_together(text, boxes[first - 1], boxes[first])
    ):
        first -= 1
    joined = ", ".join(box.answer for box in boxes[first:])
    return Found(joined, boxes[first].start, boxes[-1].end)


def _close_together(text: str, a: Found, b: Found) -> bool:
    """Whether box a and the box b after it are parts of one answer: close, in one sentence, and not
    a correction of a by b ("Earlier \\boxed{1/3}, later \\boxed{2/3}") unless a hedge is in the gap too."""
    if b.start - a.end > BOX_GAP:
        return False
    gap = text[a.end : b.start]
    if _SENTENCE_BREAK.search(gap):
        return False
    return not _CORRECTION.search(gap) or bool(_HEDGE.search(gap))


def _box_argument(text: str, start: int):
    """(argument, index after it) for a box whose name ends at `start`."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _matching_brace(text, i)
        if end < 0:
            return BROKEN, len(text)
        return _nonempty(text[i + 1 : end]), end + 1
    match = _BARE_ARGUMENT.match(text, i)  # \boxed 7
    if match is None:
        return BROKEN, i
    return _nonempty(match.group()), match.end()


def _matching_brace(text: str, open_at: int) -> int:
    """Index of the '}' closing the '{' at `open_at`, or -1. Escaped braces \\{ \\} do not count."""
    depth = 0
    i = open_at
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _last_answer_tag(text: str) -> Found | None:
    start = text.rfind("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start)
    if end < 0:
        return Found(BROKEN, start, len(text))
    return Found(_nonempty(_strip_math_delimiters(text[start + len("<answer>") : end])), start, end)


def _last_gsm8k(text: str) -> Found | None:
    last = _last_match(_GSM8K, text)
    if last is None:
        return None
    return Found(_nonempty(_strip_math_delimiters(last.group(1)).rstrip(".")), last.start(), last.end())


def _last_sentence(text: str, pattern=_SENTENCE) -> Found | None:
    """What follows the last "answer is" / "Answer:", up to the end of that sentence."""
    last = _last_match(pattern, text)
    if last is None:
        return None
    rest = text[last.end() : last.end() + 2000].replace('\\"', '"')
    end = _SENTENCE_END.search(rest)
    sentence = (rest[: end.start()] if end else rest).strip(" \t\"'*")
    span = _MATH_SPAN.match(sentence)
    if span is not None and not sentence[span.end() :].strip(" \t\"'*.,"):
        sentence = _span_content(span)  # the whole sentence is one math span
    sentence = re.split(r"\bis\s", sentence)[-1]  # "the largest $n$ is 34" -> "34"
    numbers = _NUMBER.findall(sentence)
    if len(_PROSE_WORD.findall(sentence)) >= 2 and len(numbers) == 1:
        sentence = numbers[0]  # "Jane started 3 hours ago" -> "3": prose around one number
    return Found(_nonempty(_strip_math_delimiters(sentence)), last.start(), last.end() + len(sentence))


def _last_math_span(text: str) -> Found | None:
    last = None
    for last in _math_spans(text):  # noqa: B007  (the loop keeps the last span)
        pass
    return last


def _math_spans(text: str):
    """Each math span of `text`, left to right, as a regex search with lazy contents finds them
    ($$...$$, \\[...\\], \\(...\\), $...$; never overlapping). The closing delimiter is looked up
    among all closers found in one pass, not searched for from each opening: 100,000 unclosed '\\('
    cost a search each to the end of the text, quadratic (40 KB: 3.7 s)."""
    closers = {right: [m.start() for m in pattern.finditer(text)] for right, pattern in _SPAN_CLOSERS.items()}
    resume = 0
    for opening in _SPAN_OPENER.finditer(text):
        start = opening.start()
        if start < resume:
            continue  # inside the span just found
        for left, right in _SPAN_DELIMITERS:
            if text.startswith(left, start):
                at = closers[right]
                k = bisect.bisect_left(at, start + len(left) + 1)  # the content is not empty
                if k < len(at):
                    resume = at[k] + len(right)
                    yield Found(_nonempty(text[start + len(left) : at[k]]), start, resume)
                    break


def _last_number(text: str, after: int) -> Found | None:
    """The last plain number at or after `after` ("... is 72 clips.", "increases by 100%")."""
    last = _last_match(_NUMBER, text, after)
    return None if last is None else Found(last.group(), last.start(), last.end())


def _last_match(pattern: re.Pattern, text: str, pos: int = 0):
    last = None
    for last in pattern.finditer(text, pos):  # noqa: B007  (the loop keeps the last match)
        pass
    return last


def _span_content(match: re.Match) -> str:
    return next(group for group in match.groups() if group is not None)


def _strip_math_delimiters(s: str) -> str:
    """'$x$' -> 'x', '\\(x\\)' -> 'x'; stray '$' signs inside are dropped too."""
    s = s.strip()
    for left, right in (("\\[", "\\]"), ("\\(", "\\)")):
        if s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)]
    return re.sub(r"(?<!\\)\$", " ", s).strip()


def _nonempty(s: str):
    s = s.strip()
    return s if s else BROKEN


def fenced_block(text: str, languages: tuple[str, ...]) -> tuple[str | None, bool]:
    """(the body of the last closed ``` block whose language is one of `languages`, "" for a bare
    fence, or None; whether the text ends inside an open fence, as a completion cut off does)."""
    body_start = None
    language = ""
    last = None
    for fence in FENCE.finditer(text):
        info = fence.group(1).lstrip("`").strip()  # "````python" opens a fence too
        if body_start is None:
            if "`" not in info:  # "```x = 1```" on one line is inline code, not a fence
                body_start = fence.end() + 1
                language = (info.split() or [""])[0].lower()
        elif not info:  # a closing fence has no info string
            if language in languages:
                last = text[body_start : fence.start()]
            body_start = None
    return last, body_start is not None
