"""Stage 4 of the loop, update: the policy-gradient term of each completion token, one function per
objective, each with its paper named and its formula in one place.

In: `Tokens`, what every term reads: the log-probs being trained (with grad), the old ones, the
log-ratio and ratio against the policy that sampled (per token, or GSPO's per sequence), the
advantages and the mask, all (B, T) with padding zeroed; and the objective's settings (`Clip`).
Out: a `Term`: the per-token loss (B, T) and the tokens whose gradient the clip, the gate or the
mask cut, below and above. loss.py chooses one of
these once (`Objective`) and adds what they share: aggregation, the KL, the sampler correction, the
entropy bonus. It knows tensors and these settings, not the model, rewards or micro-batches.

Per token t of completion i, with r its ratio, A its advantage, eps / eps_high the clip range:

    ppo_clip  -min(r A, clip(r, 1 - eps, 1 + eps_high) A)              PPO (Schulman et al., 2017)
              (grpo, bnpo, dr_grpo and dapo differ only in aggregation: loss.py)
    dual_clip for A < 0, also at most -c A: min(ppo_clip, -c A)        Ye et al., 2020 (clip_ratio_c)
    cispo     -sg(min(r, 1 + eps_high)) A log p                        MiniMax-M1, 2025
    sapo      -sigmoid(tau (r - 1)) 4 / tau A, tau by the sign of A    SAPO (Gao et al., 2025)
    gmpo      -A_i exp(mean over i's tokens of the sign-aware clipped log r)   GMPO (Zhao et al., 2025)
    dppo_tv   -A sg(min(r, c)) log p, masked where p moved more than eps (or eps_high) in probability
    dppo_kl   the same, masked by the binary KL between the old and new probability of the token
              DPPO (arXiv 2602.04879)
    reinforce -A log p: no ratio, no clip (REINFORCE with group-relative advantages, RGRA, arXiv
              2603.18756; nanochat's chat_rl)
    clip_cov  ppo_clip, with the gradient of a few high-covariance tokens cut
    kl_cov    -r A (no clip), plus k |log r| on the highest-covariance tokens
              both: Cui et al., 2025, "The Entropy Mechanism of RL for Reasoning Language Models"

Departures from the papers and from verl's code (verl 0.9.1's core_algos.py, which the tests hold
these equal to):
- verl clamps the log-ratio to [-20, 20] before exp in several losses; here it is not clamped (a
  log-ratio that large means the batch is far off-policy, which the clip or mask already handles).
- cispo has no lower bound on its weight, as in the paper; verl clamps it below at 1 - eps too.
- gmpo clips the log-ratio in [-eps, eps_high] (the paper's log-space range, e.g. eps = 0.4), reusing
  the PPO clip settings, as verl does.
- dppo's divergence thresholds are eps (below) and eps_high (above), as verl reads its clip_ratio;
  its truncation of the weight is clip_ratio_c, 20 unless set (verl's dppo default).
- clip_cov and kl_cov pick their tokens within the micro-batch, as verl does per micro-batch; clip_cov's
  random choice among candidates uses the step's own generator, not torch's global one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DPPO_TRUNCATION = 20.0  # dppo's cap on its detached importance weight when clip_ratio_c is unset (verl's)


@dataclass(frozen=True)
class Clip:
    """The clip settings every term reads: the ratio range, dual-clip's cap and the losses' own."""

    low: float  # epsilon: the ratio is clipped at 1 - low (gmpo: the log-ratio at -low; dppo: a threshold)
    high: float  # epsilon_high, resolved: the ratio is clipped at 1 + high
    dual: float | None = None  # clip_ratio_c: dual-clip's cap for negative advantages; dppo's truncation
    sapo_pos: float = 1.0  # sapo's gate temperature for A > 0
    sapo_neg: float = 1.05  # sapo's gate temperature for A <= 0


@dataclass
class Tokens:
    """What every term reads, (B, T) each, zero on padding (so nothing there can overflow)."""

    logprobs: torch.Tensor  # log p under the policy being trained, with grad
    old_logprobs: torch.Tensor  # log p_old under the policy that sampled the tokens
    log_ratio: torch.Tensor  # log p - log p_old, or GSPO's per-sequence mean of it on every token
    ratio: torch.Tensor  # exp(log_ratio)
    advantages: torch.Tensor  # A per token
    mask: torch.Tensor  # 1.0 on tokens in the loss


@dataclass
class Term:
    """One loss's policy-gradient term: per-token loss (B, T), and where its gradient was cut."""

    per_token: torch.Tensor  # (B, T), or (B, 1) per sequence (gmpo)
    low: torch.Tensor  # (B, T) bool: tokens cut below (a negative advantage whose ratio fell)
    high: torch.Tensor  # (B, T) bool: tokens cut above
    extra: dict[str, torch.Tensor] | None = None  # (B, T) bool masks of the term's own stats, by name


def ppo_clip(t: Tokens, clip: Clip) -> Term:
    """The clipped surrogate of PPO, as GRPO uses it: the smaller of r A and clip(r) A, negated."""
    ratio = t.ratio
    adv = t.advantages
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip.low, 1 + clip.high) * adv)  # (B, T)
    low = (ratio < 1 - clip.low) & (adv < 0)
    high = (ratio > 1 + clip.high) & (adv > 0)
    return Term(per_token, low, high)


def dual_clip(term: Term, t: Tokens, cap: float) -> Term:
    """Dual-clip PPO (Ye et al., 2020): a negative advantage's loss is also at most -cap * A, so a huge
    ratio on a bad token cannot make its loss (and gradient) unbounded; the tokens it caps are logged."""
    adv = t.advantages
    bound = -adv * cap  # (B, T)
    capped = (adv < 0) & (term.per_token > bound)
    per_token = torch.where(adv < 0, torch.minimum(term.per_token, bound), term.per_token)  # (B, T)
    return Term(per_token, term.low, term.high, {"clip/dual_frac": capped})


def cispo(t: Tokens, clip: Clip) -> Term:
    """CISPO (MiniMax-M1): the ratio, capped at 1 + eps_high, is a detached weight of A log p, so no
    token loses its gradient; no lower bound, as in the paper."""
    weight = t.ratio.clamp(max=1 + clip.high).detach()  # (B, T)
    per_token = -weight * t.advantages * t.logprobs  # (B, T)
    return Term(per_token, _none(t), t.ratio > 1 + clip.high)


def sapo(t: Tokens, clip: Clip) -> Term:
    """SAPO (Soft Adaptive Policy Optimization): a smooth gate sigmoid(tau (r - 1)) 4 / tau in place of
    the hard clip, its slope 1 at r = 1 and fading away from it; tau_neg > tau_pos fades negative
    advantages' tokens faster (TRL's sapo_temperature_pos / _neg). Nothing is cut outright."""
    tau = torch.where(t.advantages > 0, clip.sapo_pos, clip.sapo_neg)  # (B, T)
    gate = torch.sigmoid(tau * (t.ratio - 1)) * 4 / tau  # (B, T)
    return Term(-gate * t.advantages, _none(t), _none(t))


def gmpo(t: Tokens, clip: Clip) -> Term:
    """GMPO (Geometric-Mean Policy Optimization): one ratio per completion, the geometric mean of its
    token ratios, each token's log-ratio first clipped to [-eps, eps_high] on the side its advantage's
    sign makes harmful (as PPO's min does); the completion's loss is -A_i times that ratio (B, 1).
    A_i is its tokens' mean advantage (one per completion with outcome advantages)."""
    adv = t.advantages
    sign = torch.sign(adv)  # (B, T)
    clamped = t.log_ratio.clamp(-clip.low, clip.high)  # (B, T)
    kept = sign * torch.minimum(sign * t.log_ratio, sign * clamped)  # (B, T)
    lengths = t.mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
    sequence_ratio = torch.exp((kept * t.mask).sum(1, keepdim=True) / lengths)  # (B, 1)
    sequence_adv = (adv * t.mask).sum(1, keepdim=True) / lengths  # (B, 1)
    clipped = t.log_ratio != clamped
    return Term(-sequence_adv * sequence_ratio, clipped & (adv < 0), clipped & (adv > 0))


def dppo_tv(t: Tokens, clip: Clip) -> Term:
    """DPPO, total-variation form: -A sg(min(r, c)) log p, kept only where the token's probability moved
    by at most eps_high up (A > 0) or eps down (A <= 0)."""
    moved = t.logprobs.exp() - t.old_logprobs.exp()  # (B, T): p - p_old
    kept = torch.where(t.advantages > 0, moved <= clip.high, moved >= -clip.low)  # (B, T)
    return _dppo(t, clip, kept)


def dppo_kl(t: Tokens, clip: Clip) -> Term:
    """DPPO, binary-KL form: as dppo_tv, but kept where KL(Bernoulli(p_old) || Bernoulli(p)) of the token
    is at most eps_high (A > 0) or eps (A <= 0), or where p moved the other way."""
    p = t.logprobs.exp()  # (B, T)
    p_old = t.old_logprobs.exp()  # (B, T)
    # KL(Bernoulli(p_old) || Bernoulli(p)): the token against every other token together
    binary_kl = p_old * (t.old_logprobs - t.logprobs) + (1 - p_old) * torch.log(
        (1 - p_old + 1e-8) / (1 - p + 1e-8)
    )  # (B, T)
    up = (binary_kl <= clip.high) | (p <= p_old)
    down = (binary_kl <= clip.low) | (p >= p_old)
    kept = torch.where(t.advantages > 0, up, down)  # (B, T)
    return _dppo(t, clip, kept)


def _dppo(t: Tokens, clip: Clip, kept) -> Term:
    """DPPO's loss on the `kept` tokens: -A sg(min(r, c)) log p."""
    cap = clip.dual if clip.dual is not None else DPPO_TRUNCATION
    weight = t.ratio.clamp(max=cap).detach()  # (B, T): truncated importance sampling, no gradient
    per_token = -t.advantages * weight * t.logprobs * kept.detach().to(t.logprobs.dtype)  # (B, T)
    adv = t.advantages
    truncated = kept & (t.ratio > cap)
    return Term(per_token, ~kept & (adv < 0), ~kept & (adv > 0), {"clip/truncated_frac": truncated})


def reinforce(t: Tokens, clip: Clip) -> Term:
    """REINFORCE with the group-relative advantages: -A log p, no ratio and no clip (RGRA; nanochat).
    On-policy (num_iterations 1) its gradient is the ratio's at r = 1, which is GRPO's."""
    return Term(-t.advantages * t.logprobs, _none(t), _none(t))


def clip_cov(term: Term, t: Tokens, share: float, bounds: tuple[float, float], generator) -> Term:
    """Clip-Cov: among the tokens the clip left alone, those whose centred advantage times centred
    log-prob lies in (lower, upper) are candidates; `ratio` of the micro-batch's tokens (at least one),
    drawn at random among them, lose their gradient (their loss term is multiplied by 0)."""
    real = t.mask > 0  # (B, T)
    covariance = _covariance(t)  # (B, T)
    unclipped = real & ~(term.low | term.high)  # ppo_clip's low and high: where clip(r) A < r A
    lower, upper = bounds
    candidates = torch.nonzero(unclipped & (covariance > lower) & (covariance < upper))  # (K, 2)
    wanted = max(int(share * float(t.mask.sum())), 1)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:wanted]]  # (<= wanted, 2)
    cut = torch.zeros_like(real)
    cut[chosen[:, 0], chosen[:, 1]] = True
    per_token = term.per_token * (~cut).to(term.per_token.dtype)  # (B, T)
    return Term(per_token, term.low, term.high, {"cov/selected_frac": cut})


def kl_cov(t: Tokens, share: float, coef: float) -> Term:
    """KL-Cov: the unclipped surrogate -r A on every token, plus coef * |log r| on the `share` of the
    micro-batch's tokens (at least one) with the largest centred advantage times centred log-prob."""
    real = t.mask > 0  # (B, T)
    flat = _covariance(t).masked_fill(~real, -math.inf).reshape(-1)  # (B * T,)
    count = max(1, int(int(real.sum()) * share))
    chosen = torch.zeros_like(flat, dtype=torch.bool)
    chosen[torch.topk(flat, count).indices] = True
    chosen = chosen.view_as(real) & real  # (B, T)
    penalty = coef * t.log_ratio.abs() * chosen.to(t.ratio.dtype)  # (B, T)
    per_token = -t.ratio * t.advantages + penalty  # (B, T)
    return Term(per_token, _none(t), _none(t), {"cov/selected_frac": chosen})


def _covariance(t: Tokens) -> torch.Tensor:
    """(B, T): each token's centred advantage times its centred log-prob, centred over the micro-batch's
    tokens in the loss; no gradient (it only chooses tokens)."""
    logprobs = t.logprobs.detach()
    return (t.advantages - _masked_mean(t.advantages, t.mask)) * (logprobs - _masked_mean(logprobs, t.mask))


def _masked_mean(values, mask) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _none(t: Tokens) -> torch.Tensor:
    """(B, T) bool, all False: a term that cuts no token's gradient."""
    return torch.zeros_like(t.mask, dtype=torch.bool)
