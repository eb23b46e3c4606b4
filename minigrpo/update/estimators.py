"""Stage 3 of the loop, advantages: the estimators besides GRPO's, one function each, chosen once.

In: one reward per completion, ordered group by group (G completions of prompt 0, then prompt 1,
...), and each completion's count of tokens in the loss (the whitening estimators weigh completions
by their tokens, as verl's masked_whiten does over a (B, T) batch); REINFORCE++ with a KL also reads
each completion's per-token KL. Out: one advantage per completion, float64 (N,), or, for REINFORCE++
with its KL in the rewards, one (T_i,) tensor per completion. It knows rewards, groups and token
counts, not text or the model. `estimator_for(grpo)` picks one when the trainer is built.

With r a completion's reward, a group's mean m and unbiased std s, eps = 1e-4 (advantages.EPS):

    grpo                           (r - m) / (s + eps), or the scale_rewards variants   advantages.py
    rloo                           r - mean of the other G - 1 = G / (G - 1) (r - m)     Ahmadian et al., 2024
    reinforce_plus_plus_baseline   r - m, then whitened over every loss token of the batch   Hu, 2025
    reinforce_plus_plus            the return of each token (gamma = 1: the reward, minus beta times
                                   the KL of this and the later tokens), whitened over the batch   Hu, 2025
    grpo_passk                     the group's best completion gets (r_max - r_second) / (s + eps)
                                   (scale_rewards="none": undivided); every other completion 0
                                   (verl's grpo_passk; arXiv 2503.19595)
    passk                          the analytic pass@k advantage (Chen et al., 2025, "Pass@k Training",
                                   arXiv 2508.10751), for 0/1 rewards, N = G, N_neg wrong, k = pass_k:
                                   R = 1 - C(N_neg, k) / C(N, k), s = sqrt(R (1 - R)),
                                   A_right = (1 - R) / s,
                                   A_wrong = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / s
    maxrl                          (r - m) / (m + eps)   (MaxRL, Tajwar et al., 2026, arXiv 2602.02710)

Whitening (verl's masked_whiten) over the batch's loss tokens, each completion's value repeated on
each of its tokens: x -> (x - mean) / sqrt(var + 1e-8), mean and the unbiased variance taken over
tokens. A group whose rewards are all equal gets 0 for every completion from every estimator except
the whitening ones, which centre over the batch, not the group (as in verl).

Departures, named: eps is 1e-4 (TRL's) where verl's grpo and grpo_passk add 1e-6; grpo_passk gives
the advantage to the first of tied best completions (verl's topk picks one; a tie gives 0 anyway);
REINFORCE++'s KL is k1 = log p_sampler - log p_ref of each sampled token, the sampler's log-probs
standing for verl's recomputed old log-probs (the same policy, equal up to rounding in float32), and
its discount gamma is 1 (verl's default) with no setting; maxrl and passk refuse rewards they were
not made for (negative ones; anything but 0 and 1) in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..config import GRPOConfig
from .advantages import EPS, group_advantages, zero_variance_groups

WHITEN_EPS = 1e-8  # added to the variance before the root, as verl's masked_whiten
# each estimator's advantage in words, for the trace (grpo's by its scale_rewards)
FORMULAS = {
    "grpo": "(reward - mean) / (std + eps)",
    "grpo/batch": "(reward - mean) / (the batch's std + eps)",
    "grpo/none": "reward - mean",
    "rloo": "reward - mean of the other G - 1 rewards",
    "reinforce_plus_plus": "reward (less beta * the KL from each token on), whitened over the batch's tokens",
    "reinforce_plus_plus_baseline": "reward - mean, whitened over the batch's tokens",
    "grpo_passk": "(best - second best) / (std + eps) for the best completion, 0 for the others",
    "passk": "the analytic pass@k advantage of a right or a wrong completion",
    "maxrl": "(reward - mean) / (mean + eps)",
}


def rloo(rewards: torch.Tensor, group_size: int, lengths=None) -> torch.Tensor:
    """(N,) leave-one-out advantages: r_i minus the mean of the other G - 1 rewards of its group."""
    G = group_size
    groups = rewards.double().view(-1, G)  # (N / G, G)
    others = (groups.sum(1, keepdim=True) - groups) / (G - 1)  # (N / G, G): each one's baseline
    return (groups - others).reshape(-1)  # (N,)


def reinforce_plus_plus_baseline(rewards: torch.Tensor, group_size: int, lengths) -> torch.Tensor:
    """(N,) REINFORCE++ with a baseline: the group mean subtracted, then whitened over the batch's tokens."""
    groups = rewards.double().view(-1, group_size)  # (N / G, G)
    centred = (groups - groups.mean(1, keepdim=True)).reshape(-1)  # (N,)
    return whiten_over_tokens(centred, lengths)


def reinforce_plus_plus(rewards: torch.Tensor, group_size: int, lengths) -> torch.Tensor:
    """(N,) REINFORCE++ without a KL: each token's return is its completion's reward (gamma 1), whitened
    over the batch's tokens; with a KL, `kl_shaped_returns`."""
    return whiten_over_tokens(rewards.double(), lengths)


def grpo_passk(rewards: torch.Tensor, group_size: int, lengths=None, scale: str = "group") -> torch.Tensor:
    """(N,) verl's pass@k advantage: in each group only the best completion gets r_max - r_second, divided
    by the group's std + eps (scale "group") or not ("none")."""
    groups = rewards.double().view(-1, group_size)  # (N / G, G)
    top = torch.topk(groups, 2, dim=1).values  # (N / G, 2): the best and second best rewards
    gap = top[:, 0] - top[:, 1]  # (N / G,)
    if scale == "group":
        gap = gap / (groups.std(dim=1) + EPS)
    advantages = torch.zeros_like(groups)  # (N / G, G)
    best = groups.argmax(dim=1)  # (N / G,): the first of tied best
    advantages[torch.arange(len(groups)), best] = gap
    return advantages.reshape(-1)  # (N,)


def passk(rewards: torch.Tensor, group_size: int, lengths=None, *, k: int) -> torch.Tensor:
    """(N,) the analytic pass@k advantages of 0/1 rewards (the docstring's formulas), exact in float64."""
    values = set(rewards.tolist())
    if not values <= {0.0, 1.0}:
        odd = next(v for v in rewards.tolist() if v not in (0.0, 1.0))
        raise ValueError(
            f"advantage_estimator='passk' needs rewards of 0 or 1 (its pass@k counts right and wrong "
            f"completions), got {odd}"
        )
    N = group_size
    out = []
    for group in rewards.double().view(-1, N):
        wrong = int((group == 0).sum())
        mean = 1 - math.comb(wrong, k) / math.comb(N, k)  # the group's pass@k
        std = math.sqrt(mean * (1 - mean))
        if std == 0:  # every k-subset passes, or none does: no signal
            out.append(torch.zeros(N, dtype=torch.float64))
            continue
        right_advantage = (1 - mean) / std
        wrong_advantage = (1 - mean - math.comb(wrong - 1, k - 1) / math.comb(N - 1, k - 1)) / std
        advantages = torch.full((N,), wrong_advantage, dtype=torch.float64)  # (G,)
        advantages[group == 1] = right_advantage
        out.append(advantages)
    return torch.cat(out)  # (N,)


def maxrl(rewards: torch.Tensor, group_size: int, lengths=None) -> torch.Tensor:
    """(N,) MaxRL's advantages: (r - m) / (m + eps), the centred reward over the group's success rate, so a
    prompt solved once in G counts as much as an easy one (rewards must be >= 0)."""
    if bool((rewards < 0).any()):
        raise ValueError(
            "advantage_estimator='maxrl' needs rewards >= 0 (it divides by its group's mean reward), got "
            f"{float(rewards.min())}"
        )
    groups = rewards.double().view(-1, group_size)  # (N / G, G)
    mean = groups.mean(1, keepdim=True)  # (N / G, 1)
    advantages = (groups - mean) / (mean + EPS)  # (N / G, G)
    advantages[zero_variance_groups(rewards, group_size)] = 0.0  # exactly zero, as group_advantages
    return advantages.reshape(-1)  # (N,)


def whiten_over_tokens(values: torch.Tensor, lengths) -> torch.Tensor:
    """(N,) values, completion i's repeated on its lengths[i] loss tokens, whitened over all those tokens
    (verl's masked_whiten: token-weighted mean, unbiased token variance); 0 for a completion with none."""
    weights = torch.as_tensor(lengths, dtype=torch.float64)  # (N,)
    count = weights.sum()
    if count < 2:  # no spread to whiten by (verl refuses a batch of one token)
        return torch.zeros_like(values)
    mean = (values * weights).sum() / count
    variance = ((values - mean) ** 2 * weights).sum() / count * (count / (count - 1))  # unbiased
    return torch.where(weights > 0, (values - mean) * torch.rsqrt(variance + WHITEN_EPS), 0.0)  # (N,)


def kl_shaped_returns(rewards, token_kls: list[torch.Tensor], beta: float) -> list[torch.Tensor]:
    """REINFORCE++ with its KL in the rewards: token t of completion i earns -beta * kl_t, its last token
    also the reward r_i; its return is the sum from t to the end (gamma 1). Whitened over every token of
    the batch; one (T_i,) float64 tensor per completion (its loss tokens only)."""
    returns = []
    for reward, kl in zip(rewards.double().tolist(), token_kls, strict=True):
        earned = -beta * kl.double()  # (T_i,)
        if len(earned):
            earned[-1] += reward
        returns.append(earned.flip(0).cumsum(0).flip(0))  # (T_i,): the sum from each token on
    flat = torch.cat(returns)  # (sum T_i,)
    if flat.numel() < 2:
        return [torch.zeros_like(r) for r in returns]
    whitened = (flat - flat.mean()) * torch.rsqrt(flat.var() + WHITEN_EPS)  # unbiased, as verl
    return list(whitened.split([len(r) for r in returns]))


def formula(grpo: GRPOConfig) -> str:
    """The run's advantage in words (FORMULAS)."""
    name = grpo.advantage_estimator
    if name == "grpo" and grpo.scale_rewards != "group":
        name = f"grpo/{grpo.scale_rewards}"
    return FORMULAS[name]


def estimator_for(grpo: GRPOConfig) -> Callable[[torch.Tensor, int, list[int]], torch.Tensor]:
    """The run's outcome estimator, chosen once: a function of (rewards (N,), G, loss tokens per
    completion) to (N,) float64 advantages."""
    name = grpo.advantage_estimator
    if name == "grpo":
        return lambda rewards, G, lengths: group_advantages(rewards, G, grpo.scale_rewards).double()
    if name == "grpo_passk":
        return lambda rewards, G, lengths: grpo_passk(rewards, G, scale=grpo.scale_rewards)
    if name == "passk":
        return lambda rewards, G, lengths: passk(rewards, G, k=grpo.pass_k)
    return {
        "rloo": rloo,
        "reinforce_plus_plus": reinforce_plus_plus,
        "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
        "maxrl": maxrl,
    }[name]
