"""Beside stages 1 and 4: frozen copies of the policy. The KL's reference is the starting policy, frozen;
the sampler's copy (sampling_dtype) holds the policy's current weights in another precision, as another
engine's would. In: the policy. Out: the copies. It knows modules and dtypes, not what they compute.
"""

from __future__ import annotations

import copy

import torch


def frozen_copy(model):
    """A copy of `model` in eval mode that no gradient reaches."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


class SamplingCopy:
    """The model stage 1 samples with: the policy itself, or with `dtype` (a torch dtype's name) other
    than the policy's, a frozen copy in that dtype whose weights are the policy's, cast, at each call."""

    def __init__(self, policy, dtype: str | None):
        self.policy = policy
        self.copy = None  # None: the policy samples itself
        if dtype is not None and getattr(torch, dtype) != policy.dtype:
            self.copy = frozen_copy(policy).to(getattr(torch, dtype))

    def synced(self):
        """The policy, or its copy holding the policy's current weights (cast as copied)."""
        if self.copy is None:
            return self.policy
        with torch.no_grad():
            for copied, weight in zip(self.copy.parameters(), self.policy.parameters(), strict=True):
                if weight.requires_grad:  # a frozen weight (LoRA's base) is as it was copied
                    copied.copy_(weight)
        return self.copy
