"""Stage 3 of the loop, advantages: how much better each completion did than the rest of its group.

In: one reward per completion, ordered group by group (G completions of prompt 0, then prompt 1,
...). Out: one advantage per completion, and which groups carry no signal. It knows rewards and
group sizes, not tokens, text or the model.

    A_i = (r_i - mean of its group) / (std + eps)

`scale` picks the std: "group" (DeepSeekMath GRPO: the group's own), "batch" (one std over the
whole batch, as in TRL's scale_rewards="batch"), or "none" (Dr. GRPO: no division, which the
Dr. GRPO paper shows biases the update towards easy and hard prompts less). The std is the
unbiased one (n - 1), as in TRL. A group whose rewards are all equal has advantage exactly 0
for every completion (no NaN, whatever the scale) and is flagged: it teaches nothing, and
dynamic sampling (DAPO) replaces such groups.
"""

from __future__ import annotations

import torch

SCALES = ("group", "batch", "none")
EPS = 1e-4  # added to the std, as in TRL


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """(N,) advantages for (N,) rewards ordered group by group, N a multiple of group_size."""
    _check(rewards, group_size, scale)
    groups = rewards.float().view(-1, group_size)  # (N / G, G)
    centred = groups - groups.mean(dim=1, keepdim=True)  # (N / G, G)
    if scale == "group":
        centred = centred / (groups.std(dim=1, keepdim=True) + EPS)
    elif scale == "batch":
        centred = centred / (rewards.float().std() + EPS)
    flat = zero_variance_groups(rewards, group_size)  # (N / G,)
    centred[flat] = 0.0  # exactly zero, not eps-sized noise
    return centred.reshape(-1)  # (N,)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N / G,) bool: True for each group whose rewards are all equal."""
    groups = rewards.view(-1, group_size)  # (N / G, G)
    return (groups == groups[:, :1]).all(dim=1)


def check_scale(scale: str) -> None:
    """The one check of scale_rewards, for group_advantages and GRPOConfig alike."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {scale!r}")


def _check(rewards: torch.Tensor, group_size: int, scale: str) -> None:
    check_scale(scale)
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor ordered group by group, got shape {tuple(rewards.shape)}"
        )
    if group_size < 2:
        raise ValueError(
            "group_size must be at least 2 (one completion has nothing to be compared with), "
            f"got {group_size}"
        )
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards must be finite numbers")
