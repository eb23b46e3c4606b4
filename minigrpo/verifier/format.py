"""Stage 2 of the loop, verify: the format reward, scored apart from correctness.

In: a response string. Out: 1.0 when it has the shape a reasoning model is asked for, else 0.0:
one <think>...</think> block first, then a short final part with exactly one complete, non-empty
\\boxed{...}, all within the length limits. Logged as its own reward component, so that a run
shows separately whether the policy learned the format and whether it got answers right. It
knows tags and boxes, not whether the answer is correct.
"""

from __future__ import annotations

from dataclasses import dataclass

from .extract import BROKEN, top_level_boxes

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass
class FormatConfig:
    """What a well-formed response looks like."""

    require_thinking: bool = True  # a <think>...</think> block must come first
    thinking_opened_by_prompt: bool = False  # the prompt already ends in <think>: the response only closes it
    max_chars: int = 0  # longest acceptable response in characters; 0 means no limit
    max_answer_chars: int = 1_000  # longest acceptable final part (after </think>); 0 means no limit

    def __post_init__(self):
        if self.max_chars < 0 or self.max_answer_chars < 0:
            raise ValueError(
                f"length limits must be >= 0 (0 = no limit), got {self.max_chars}, {self.max_answer_chars}"
            )


def format_reward(response: str, config: FormatConfig | None = None) -> float:
    """1.0 for a well-formed response (see the module docstring), else 0.0; never raises."""
    config = config or FormatConfig()
    if not isinstance(response, str) or (config.max_chars and len(response) > config.max_chars):
        return 0.0
    final = _final_part(response, config)
    if final is None or (config.max_answer_chars and len(final) > config.max_answer_chars):
        return 0.0
    boxes = top_level_boxes(final)
    return 1.0 if len(boxes) == 1 and boxes[0].answer is not BROKEN else 0.0


def _final_part(response: str, config: FormatConfig) -> str | None:
    """What follows the thinking block, or None when the thinking block is missing or malformed."""
    if not config.require_thinking:
        return response if THINK_OPEN not in response and THINK_CLOSE not in response else None
    opens = response.count(THINK_OPEN)
    closes = response.count(THINK_CLOSE)
    if closes != 1 or opens != (0 if config.thinking_opened_by_prompt else 1):
        return None
    if not config.thinking_opened_by_prompt and not response.lstrip().startswith(THINK_OPEN):
        return None
    thinking, final = response.split(THINK_CLOSE)
    if not thinking.replace(THINK_OPEN, "").strip():
        return None  # an empty thinking block
    return final
