"""Stage 4 of the loop, update: the entropy bonus's coefficient from one AdamW step to the next.

In: GRPOConfig's entropy settings; after each AdamW step, that step's mean token entropy (over every
rank's tokens). Out: the coefficient the next step's loss subtracts the mean entropy with
(loss.objective_loss's entropy_coef), and its state for checkpoints. It knows numbers, not tensors.

Fixed (entropy_coef alone): the same coefficient every step (TRL's entropy_coef, verl's entropy_coeff).
Adaptive (use_adaptive_entropy; Skywork-OR1, arXiv 2505.22312, as TRL implements it): after each step,
the coefficient grows by entropy_coef_delta while the step's entropy is at or below entropy_target
and shrinks by it otherwise, within [entropy_coef_min, entropy_coef_max]; a step applies the
coefficient only while the previous step's entropy was at or below the target (none before the first
measurement). Departure from TRL: a step skipped for a non-finite loss or gradient leaves the
coefficient as it was, as it leaves the weights and AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import GRPOConfig


@dataclass
class EntropyCoefficient:
    """The entropy bonus's coefficient, fixed or adaptive, and what it last measured."""

    coef: float  # the coefficient (adaptive: its current value, TRL's entropy_coef)
    adaptive: bool  # adapt it after each step
    target: float  # adaptive: the entropy at or below which the bonus acts and grows
    delta: float  # adaptive: the change per step
    low: float  # adaptive: the lower bound
    high: float  # adaptive: the upper bound
    last_entropy: float = math.inf  # the previous step's mean token entropy (none yet: inf)

    @classmethod
    def from_config(cls, grpo: GRPOConfig) -> EntropyCoefficient | None:
        """The run's coefficient, or None when its loss has no entropy bonus (chosen once)."""
        if not grpo.uses_entropy_bonus:
            return None
        return cls(
            coef=grpo.entropy_coef,
            adaptive=grpo.use_adaptive_entropy,
            target=grpo.entropy_target,
            delta=grpo.entropy_coef_delta,
            low=grpo.entropy_coef_min,
            high=grpo.entropy_coef_max,
        )

    def applied(self) -> float:
        """The coefficient this step's loss uses: fixed, or adaptive and gated by the last entropy."""
        if self.adaptive and not self.last_entropy <= self.target:
            return 0.0
        return self.coef

    def after_step(self, entropy: float) -> None:
        """A step's mean token entropy measured: adapt the coefficient for the next step."""
        if not self.adaptive:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = entropy

    def state(self) -> dict:
        """What a checkpoint keeps: the coefficient and the last entropy (a resume continues them)."""
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state(self, state: dict) -> None:
        self.coef = float(state["coef"])
        self.last_entropy = float(state["last_entropy"])
