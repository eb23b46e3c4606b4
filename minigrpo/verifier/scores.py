"""Stage 2 of the loop, verify: `Scores`, the value a batch reward function returns.

A plain list of floats, one per row, that also says which rows failed closed at a time limit
(`timed_out`), for `compute_rewards` to count. It knows nothing of what was scored.
"""

from __future__ import annotations


class Scores(list):
    """Rewards, one per row, as a plain list; `timed_out[i]` says row i failed closed at its time limit."""

    def __init__(self, values, timed_out):
        super().__init__(values)
        self.timed_out = list(timed_out)
