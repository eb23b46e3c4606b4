"""Stage 3 of the loop, advantages: how much better each completion did than the rest of its group.

In: one reward per completion, ordered group by group (G completions of prompt 0, then prompt 1,
...), and for process supervision each completion's step rewards with the token each step ends on.
Out: one advantage per completion (outcome), or one per token (process), and which groups carry
no signal. It knows rewards, token positions and group sizes, not text or the model.

    A_i = (r_i - mean of its group) / (std + eps)

`scale` picks the std: "group" (DeepSeekMath GRPO: the group's own), "batch" (one std over the
whole batch, as in TRL's scale_rewards="batch"), or "none" (Dr. GRPO: no division, which the
Dr. GRPO paper shows biases the update towards easy and hard prompts less). The std is the
unbiased one (n - 1), as in TRL. A group whose rewards are all equal has advantage exactly 0
for every completion (no NaN, whatever the scale) and is flagged: it teaches nothing, and
dynamic sampling (DAPO) replaces such groups.

Process supervision (DeepSeekMath, section 4.1.3): completion i's steps j = 1..K_i end on tokens
index(j) and earn rewards r_i^j. Every step reward of the group is normalised by the mean and std
of all of them, and a token's advantage is the sum of the normalised rewards of the steps that end
at or after it:

    r~_i^j = (r_i^j - mean(R)) / (std(R) + eps)        R: every step reward of the group
    A_i,t  = sum over j with index(j) >= t of r~_i^j    (tokens after the last step: 0)

`advantage_type` "outcome+process" adds the outcome advantage to every token's. The paper's
process rewards come from a learned reward model; here they are verifiable (the verifier's step
checker, or Math-Shepherd's Monte-Carlo estimates), which the formula does not care about.
"""

from __future__ import annotations

import math

import torch

from ..config import check_scale

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


def process_advantages(
    step_rewards: list[list[float]],
    step_ends: list[list[int]],
    num_tokens: list[int],
    group_size: int,
) -> list[torch.Tensor]:
    """Per-token advantages of process supervision, one (num_tokens[i],) float64 tensor per completion.

    step_rewards[i] and step_ends[i]: completion i's step rewards and the 0-based index of each step's
    last token; completions ordered group by group. A group whose step rewards are all equal, or that
    has fewer than two, gets 0 everywhere.
    """
    _check_steps(step_rewards, step_ends, num_tokens, group_size)
    advantages = []
    for first in range(0, len(num_tokens), group_size):
        members = range(first, first + group_size)
        normalised = _normalised_group(
            [torch.tensor(step_rewards[i], dtype=torch.float64) for i in members]
        )  # each (K_i,)
        for i, rewards in zip(members, normalised):
            at_end = torch.zeros(
                num_tokens[i], dtype=torch.float64
            )  # (T_i,): each step's reward on its last token
            at_end.index_add_(0, torch.tensor(step_ends[i], dtype=torch.long), rewards)
            advantages.append(
                at_end.flip(0).cumsum(0).flip(0)
            )  # (T_i,): the sum over steps ending at or after t
    return advantages


def token_advantages(
    step_rewards: list[list[float]],
    step_ends: list[list[int]],
    num_tokens: list[int],
    group_size: int,
    outcome: list[float] | None = None,
) -> list[torch.Tensor]:
    """Each completion's per-token advantages as the update reads them, one (num_tokens[i],) float32
    tensor each: the process advantages, plus completion i's `outcome` advantage on every token when
    given (advantage_type "outcome+process"), added in float64 before the cast."""
    per_token = process_advantages(step_rewards, step_ends, num_tokens, group_size)  # each (Tc,) float64
    if outcome is not None:
        per_token = [a + o for a, o in zip(per_token, outcome, strict=True)]
    return [a.float() for a in per_token]


def _normalised_group(rewards: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each completion's step rewards minus the group's mean, over its std + EPS (all of them pooled)."""
    pooled = torch.cat(rewards)  # (K,): every step reward of the group
    if pooled.numel() < 2 or bool((pooled == pooled[0]).all()):
        return [torch.zeros_like(r) for r in rewards]
    mean = pooled.mean()
    std = pooled.std()  # unbiased, as group_advantages
    return [(r - mean) / (std + EPS) for r in rewards]


def _check_steps(step_rewards, step_ends, num_tokens, group_size: int) -> None:
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    if not len(step_rewards) == len(step_ends) == len(num_tokens):
        raise ValueError(
            f"one entry per completion: {len(step_rewards)} step_rewards, {len(step_ends)} step_ends, "
            f"{len(num_tokens)} num_tokens"
        )
    if len(num_tokens) % group_size:
        raise ValueError(f"{len(num_tokens)} completions do not split into groups of {group_size}")
    for i, (rewards, ends, length) in enumerate(zip(step_rewards, step_ends, num_tokens)):
        if len(rewards) != len(ends):
            raise ValueError(f"completion {i} has {len(rewards)} step rewards and {len(ends)} step ends")
        if any(not 0 <= end < length for end in ends):
            raise ValueError(f"completion {i}: a step ends outside its {length} tokens: {list(ends)}")
        if not all(math.isfinite(r) for r in rewards):
            raise ValueError(f"completion {i}: step rewards must be finite numbers")


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
