"""Stage 1's one meeting point with whatever steers decoding besides sampling (tool calls: tool_turns.py).

In: the engine (engine.Engine), the batch rows about to take a token and what they drew. Out: a
`Steering`, the hook's say over those rows. It knows tensors of batch rows, not tools, text or the model.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class Steering(NamedTuple):
    """A hook's say over the batch rows about to take a token; (b,) each, on the engine's device."""

    tokens: torch.Tensor  # the token a forced row takes instead of its draw (any value elsewhere)
    forced: torch.Tensor  # bool: takes tokens[row], not drawn (log-prob 0, generated False, no EOS)
    held: torch.Tensor  # bool: takes no token this decode step (paused); its column, token, stream stay
    stopped: torch.Tensor  # bool: ends after this token, whatever it is (finish reason STOPPED)


class DecodeHook(Protocol):
    """What may steer a decode step besides sampling: tool_turns.ToolTurns. The engine calls `steer` at
    one place, once for every token a batch of rows takes (Engine.choose); a row it holds is fed its last
    token again at the next decode step, into that token's own slot, so its logits stay the same."""

    calls: list[list]  # per request, the records of its calls (Samples.tool_calls)

    def steer(self, engine, which, drawn: torch.Tensor) -> Steering:
        """The steering of batch rows `which`, which drew `drawn` (b,). It reads the engine's rows
        (requests, finished, columns), its completions (tokens, budgets) and waiting, and writes none of
        them."""
