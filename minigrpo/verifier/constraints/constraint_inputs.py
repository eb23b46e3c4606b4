"""Stage 2 of the loop, verify: what the constraint rewards (json, length, sql) read alike.

In: a completion's text, or a value from a row or an option. Out: the completion's answer text (its last
fenced block in a language, else all of it), whether a value is a JSON number or integer, and a value as an
error message shows it. It knows strings, not which reward asks, nor tensors.
"""

from __future__ import annotations

from ..extract import fenced_block


def answer_text(completion, languages: tuple[str, ...]) -> str:
    """The last fenced block in one of `languages`, else the whole completion; stripped."""
    if not isinstance(completion, str):
        return ""
    block, _ = fenced_block(completion, languages)
    return (completion if block is None else block).strip()


def shown(value) -> str:
    """A value for an error message: a scalar as written (cut at 80 characters), a container by its type
    (a schema's repr may be huge, or nested too deep for repr)."""
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__}"
    return f"{value!r:.80}"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
