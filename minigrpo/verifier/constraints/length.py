"""Stage 2 of the loop, verify: length - 1.0 inside a band [low, high], falling linearly to 0.0 outside.

In: completions, a unit, the band (options, or per row the `min_length` / `max_length` columns) and, for unit
"tokens", the `completion_tokens` column the trainer supplies. Out: one float in [0, 1] per completion; a bad
unit or band is a ValueError. It knows strings and counts, not tensors or the tokenizer.

The value falls to 0.0 at `soft` units outside the band. Departure from DAPO's overlong shaping: both sides
are shaped, and the value is a reward in [0, 1], not a penalty in [-1, 0].
"""

from __future__ import annotations

import math

from .constraint_inputs import is_integer, is_number, shown

UNITS = ("words", "chars", "tokens")


def length_reward(length: float, low: float, high: float, soft: float) -> float:
    """1.0 inside [low, high], falling linearly to 0.0 at low - soft and at high + soft, 0.0 beyond."""
    distance = max(low - length, length - high, 0.0)
    return max(0.0, 1.0 - distance / soft)


def length_rewards(
    completions: list[str],
    unit: str = "words",
    low: float | None = None,
    high: float | None = None,
    soft: float | None = None,
    *,
    min_length: list | None = None,
    max_length: list | None = None,
    completion_tokens: list | None = None,
) -> list[float]:
    """length_reward per completion. The band is [low, high] (None: unbounded on that side), or per row
    the `min_length` / `max_length` columns where given (a None entry: the option). For unit "tokens",
    `completion_tokens` holds per completion its token ids or their count."""
    if unit not in UNITS:
        raise ValueError(f"length reward: unknown unit {shown(unit)}; use one of {', '.join(UNITS)}")
    if not (is_number(soft) and 0 < soft < math.inf):
        raise ValueError(
            "length reward: soft must be a number > 0 (the ramp's width outside [min, max]), "
            f"got {shown(soft)}"
        )
    if unit == "tokens" and completion_tokens is None:
        raise ValueError(
            "length reward: unit 'tokens' needs the completion_tokens column, which the trainer supplies"
        )
    lows = _per_row(min_length, low, len(completions))
    highs = _per_row(max_length, high, len(completions))
    tokens = completion_tokens if unit == "tokens" else [None] * len(completions)
    rewards = []
    for completion, row_low, row_high, row_tokens in zip(completions, lows, highs, tokens):
        band_low, band_high = _band(row_low, row_high)
        rewards.append(length_reward(_length(completion, unit, row_tokens), band_low, band_high, soft))
    return rewards


def _per_row(column: list | None, option, rows: int) -> list:
    """The column's value per row, the option where the column is absent or holds None."""
    return [option if value is None else value for value in (column or [None] * rows)]


def _band(low, high) -> tuple[float, float]:
    if low is None and high is None:
        raise ValueError(
            "length reward: give a min, a max or both (options, or min_length / max_length columns)"
        )
    for name, bound in (("min", low), ("max", high)):
        if bound is not None and not (is_number(bound) and 0 <= bound < math.inf):
            raise ValueError(f"length reward: {name} must be a number >= 0, got {shown(bound)}")
    low = low or 0
    high = math.inf if high is None else high
    if low > high:
        raise ValueError(f"length reward: min {low} > max {high}")
    return low, high


def _length(completion, unit: str, tokens) -> int:
    """The completion's length in `unit`; for tokens, `tokens` is its token ids or their count."""
    if unit == "tokens":
        if not (is_integer(tokens) or isinstance(tokens, (list, tuple))):
            raise ValueError(
                f"length reward: completion_tokens holds token id lists or counts, got {shown(tokens)}"
            )
        return tokens if is_integer(tokens) else len(tokens)
    if not isinstance(completion, str):
        return 0
    return len(completion) if unit == "chars" else len(completion.split())
