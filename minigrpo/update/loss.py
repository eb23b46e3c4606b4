"""Stage 4 of the loop, update: the objective on a batch of completion tokens.

In: per-token log-probs of the completions under the policy being trained (with grad), under the
policy that sampled them ("old"), optionally under a frozen reference and as the sampler reported
them; one advantage per completion, or one per token (process supervision); the completion mask; the
entropies of the update's forward. Out: `(loss, stats)`. It knows tensors, not text, rewards or the
model: logprobs.py computes the log-probs it is given.

The objective is chosen once, when the updater is built: `objective_from(grpo)` turns GRPOConfig into
an `Objective`, a small record holding the policy term's function (policy_losses.py), how it is
aggregated, the clip, the KL, the sampler correction and the covariance control, each checked there;
`objective_loss` then computes one micro-batch's loss from it, testing no setting but the record's.
Per completion token t of completion i, with A_i,t its advantage (A_i on every token of an outcome
advantage) and term_t the policy term (policy_losses.py; PPO's clipped surrogate for grpo):

    k3        = exp(ref - logp) - (ref - logp) - 1        (unbiased KL estimate, >= 0 up to rounding)
    l_t       = term_t + beta * k3

and the loss aggregates l_t over the unmasked tokens by `loss_type`:

    grpo, sapo         mean over each sequence's tokens, then mean over sequences   (DeepSeekMath)
    bnpo               mean over all tokens of the batch
    dr_grpo            sum over tokens / (sequences * max_completion_length)        (Dr. GRPO)
    dapo, cispo,       sum over tokens / tokens of the whole optimizer step         (DAPO)
    dppo_*, reinforce
    gmpo               one term per sequence (its geometric-mean ratio), mean over sequences; its
                       KL term is aggregated as grpo's

then subtracts the entropy bonus, `entropy_coef` times the token mean of the entropies over the
step's tokens (TRL's entropy_coef; the coefficient may adapt between steps: entropy.py).

Departures from DeepSeekMath GRPO: beta defaults to 0, not 0.04 (no reference model is kept
unless asked for, as in TRL and DAPO); the clip range may be asymmetric (epsilon_high: DAPO's
clip-higher); and the aggregations above. Under gradient accumulation, pass the whole step's
`num_sequences` and `num_tokens`: each micro-batch's loss is then its exact share, and for grpo,
dr_grpo, dapo and the entropy bonus the micro-batch losses sum to the loss of the step's batch taken
at once. bnpo, a per-batch token mean by definition, takes each micro-batch's token mean weighted
by its share of the sequences: it equals the whole batch's only when every micro-batch's tokens
per completion are the batch's, so with ragged lengths its step depends on the split. TRL's entropy
bonus is each micro-batch's token mean divided by the accumulation steps, which is the step's token
mean only when the micro-batches hold equal tokens; here it is the step's token mean exactly.

Extensions, each off by default:

    importance_sampling_level="sequence"   GSPO (Zheng et al., 2025): every token of completion i
        uses s_i = exp(mean over its tokens of (logp - logp_old)) as its ratio, the gradient
        flowing through that mean; clipped and aggregated as above. GSPO's paper clips at
        epsilon 3e-4 / epsilon_high 4e-4, far tighter than the token-level 0.2.
    loss_type="cispo"   epsilon_high defaults to 4.0 for it (a weight capped at 5, ScaleRL's
        epsilon_max, Khatri et al., 2025); TRL's epsilon_high for cispo is that cap itself.
    clip_ratio_c        dual-clip (Ye et al., 2020) on the clipped-surrogate losses: see policy_losses.py.
    covariance_control  Clip-Cov or KL-Cov (Cui et al., 2025) on the clipped surrogate: policy_losses.py.
    sampler_correction   the tokens were drawn by the sampler, whose log-probs (`sampler_logprobs`)
        may differ slightly from the trainer's own "old" ones (other kernels, batch shapes, bf16).
        With r = exp(old - sampler) per token and R = exp(sum over the sequence of (old - sampler)),
        the policy-gradient term of each token is multiplied by a detached weight w (C = cap):
        token_truncate min(r, C) (truncated IS, Yao et al., 2025); token_mask 1 if 1/C <= r <= C
        else 0; sequence_truncate min(R, C); sequence_mask 1 if 1/C <= R <= C else 0 (masked IS,
        Liu et al., 2025). The KL term is not weighted; sampler == old makes every mode the identity.
        gmpo's one term per sequence takes the geometric mean of its tokens' weights, as verl does.
`sampler_mismatch` measures that gap, whether or not a correction is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..config import CLIPPED_SURROGATE_LOSSES, GRPOConfig
from . import policy_losses
from .policy_losses import Clip, Term, Tokens

CISPO_EPSILON_HIGH = 4.0  # cispo's default epsilon_high: the weight is capped at 5 (see the docstring)
# each loss_type's policy term (policy_losses.py) and aggregation
POLICY_TERMS = {
    "grpo": (policy_losses.ppo_clip, "grpo"),
    "bnpo": (policy_losses.ppo_clip, "bnpo"),
    "dr_grpo": (policy_losses.ppo_clip, "dr_grpo"),
    "dapo": (policy_losses.ppo_clip, "dapo"),
    "cispo": (policy_losses.cispo, "dapo"),
    "sapo": (policy_losses.sapo, "grpo"),
    "gmpo": (policy_losses.gmpo, "sequence"),
    "dppo_tv": (policy_losses.dppo_tv, "dapo"),
    "dppo_kl": (policy_losses.dppo_kl, "dapo"),
    "reinforce": (policy_losses.reinforce, "dapo"),
}


@dataclass(frozen=True)
class Covariance:
    """Clip-Cov or KL-Cov (policy_losses.py), with verl's settings."""

    kind: str  # clip_cov | kl_cov
    share: float  # clip_cov_ratio or kl_cov_ratio: the share of the micro-batch's tokens it may select
    bounds: tuple[float, float] = (
        1.0,
        5.0,
    )  # clip_cov: (clip_cov_lb, clip_cov_ub) of a candidate's covariance
    coef: float = 0.1  # kl_cov: ppo_kl_coef, the weight of |log r| on the selected tokens


@dataclass(frozen=True)
class Objective:
    """What a run optimises, chosen once from its GRPOConfig (`objective_from`), checked there."""

    loss_type: str  # its name, as GRPOConfig.loss_type
    term: Callable[[Tokens, Clip], Term]  # the per-token policy term (policy_losses.py)
    aggregation: str  # grpo | bnpo | dr_grpo | dapo | sequence (the docstring's table)
    clip: Clip
    sequence_level: bool = False  # GSPO: one ratio per completion
    beta: float = 0.0  # weight of the k3 KL in the loss (0: none; REINFORCE++ folds it into the rewards)
    sampler_correction: str = "none"  # the sampler correction's mode
    sampler_correction_cap: float = 3.0
    covariance: Covariance | None = None  # Clip-Cov / KL-Cov, or none
    max_completion_length: int | None = None  # Dr. GRPO's constant (None: each micro-batch's T)

    def describe(self) -> str:
        """One line naming the objective, for the trace and the run's summary."""
        parts = [f"loss_type={self.loss_type}"]
        if self.sequence_level:
            parts.append("importance_sampling_level=sequence")
        parts.append(f"clip=({self.clip.low:g}, {self.clip.high:g})")
        if self.clip.dual is not None:
            parts.append(f"clip_ratio_c={self.clip.dual:g}")
        if self.covariance is not None:
            parts.append(self.covariance.kind)
        if self.beta:
            parts.append(f"beta={self.beta:g}")
        if self.sampler_correction != "none":
            parts.append(f"sampler_correction={self.sampler_correction}")
        return " ".join(parts)


def objective_from(grpo: GRPOConfig) -> Objective:
    """The objective GRPOConfig asks for, built once (GRPOConfig checked every setting and combination)."""
    term, aggregation = POLICY_TERMS[grpo.loss_type]
    high = grpo.epsilon_high
    if high is None:
        high = CISPO_EPSILON_HIGH if grpo.loss_type == "cispo" else grpo.epsilon
    dual = grpo.clip_ratio_c if grpo.loss_type in CLIPPED_SURROGATE_LOSSES + ("dppo_tv", "dppo_kl") else None
    clip = Clip(grpo.epsilon, high, dual, grpo.sapo_temperature_pos, grpo.sapo_temperature_neg)
    covariance = None
    if grpo.covariance_control == "clip_cov":
        covariance = Covariance("clip_cov", grpo.clip_cov_ratio, (grpo.clip_cov_lb, grpo.clip_cov_ub))
    elif grpo.covariance_control == "kl_cov":
        covariance = Covariance("kl_cov", grpo.kl_cov_ratio, coef=grpo.ppo_kl_coef)
    return Objective(
        loss_type=grpo.loss_type,
        term=term,
        aggregation=aggregation,
        clip=clip,
        sequence_level=grpo.importance_sampling_level == "sequence",
        beta=0.0 if grpo.kl_in_reward else grpo.beta,
        sampler_correction=grpo.sampler_correction,
        sampler_correction_cap=grpo.sampler_correction_cap,
        covariance=covariance,
        max_completion_length=grpo.max_completion_length,
    )


def objective_loss(
    objective: Objective,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One (micro-)batch's loss under `objective` and its stats; shapes (B, T), advantages (B,) or (B, T).

    num_sequences / num_tokens: the whole optimizer step's (default: this batch's), for exact
    gradient accumulation. sampler_logprobs (B, T): what the sampler reported for the same tokens
    (the sampler correction). entropies (B, T): with grad when entropy_coef is not 0 (the bonus).
    generator: Clip-Cov's random choice among its candidates.
    """
    _check(logprobs, old_logprobs, advantages, mask, ref_logprobs, sampler_logprobs, entropies, objective)
    padding = mask == 0  # (B, T); zeroed before exp, so no value there can overflow into a NaN
    mask = mask.to(logprobs.dtype)  # (B, T)
    tokens = _tokens(objective, logprobs, old_logprobs, advantages, mask, padding)
    term = objective.term(tokens, objective.clip)
    term = _controlled(objective, term, tokens, generator)
    per_token = term.per_token  # (B, T), or (B, 1): one per sequence
    corrected = None
    if objective.sampler_correction != "none":
        weight, corrected = sampler_weights(
            old_logprobs,
            sampler_logprobs,
            padding,
            objective.sampler_correction,
            objective.sampler_correction_cap,
        )
        per_token = per_token * _per_term(weight, per_token, mask)
    kl = None
    if ref_logprobs is not None and objective.beta != 0.0:
        kl = k3(tokens.logprobs, ref_logprobs.masked_fill(padding, 0.0))  # (B, T)
    loss = _aggregated(objective, per_token, kl, mask, num_sequences, num_tokens)
    if entropy_coef != 0.0:  # the bonus: the step's token mean of the entropies, its share in this batch
        loss = loss - entropy_coef * _token_share((entropies * mask).sum(), mask, num_tokens)
    stats = _stats(loss, tokens, term, mask, kl, entropies)
    if corrected is not None:
        kind = "masked" if objective.sampler_correction.endswith("mask") else "truncated"
        stats[f"sampler_correction/{kind}_frac"] = float((corrected * mask).sum() / mask.sum().clamp(min=1))
    return loss, stats


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_completion_length: int | None = None,
    entropy_coef: float = 0.0,
    generator: torch.Generator | None = None,
    **settings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`objective_loss` of the objective that GRPOConfig fields `settings` describe (loss_type, beta,
    epsilon, ...; the rest at their defaults): for a reader or a test that wants one loss without a
    config. max_completion_length: Dr. GRPO's constant (default: T). The updater builds its
    Objective once instead."""
    objective = replace(objective_from(GRPOConfig(**settings)), max_completion_length=max_completion_length)
    return objective_loss(
        objective,
        logprobs,
        old_logprobs,
        advantages,
        mask,
        ref_logprobs=ref_logprobs,
        sampler_logprobs=sampler_logprobs,
        entropies=entropies,
        entropy_coef=entropy_coef,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
        generator=generator,
    )


def _tokens(objective: Objective, logprobs, old_logprobs, advantages, mask, padding) -> Tokens:
    """What every policy term reads, (B, T), zero on padding; GSPO's ratio is one per sequence."""
    log_ratio = (logprobs - old_logprobs).masked_fill(padding, 0.0)  # (B, T)
    if objective.sequence_level:  # GSPO: the length-normalised sequence ratio, on every token
        per_sequence = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
        log_ratio = per_sequence.expand_as(log_ratio)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.to(logprobs.dtype)  # (B, T), or (B,) for one advantage per completion
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)  # (B, 1)
    adv = adv.masked_fill(padding, 0.0)  # (B, T): nothing on padding, whatever the caller put there
    return Tokens(
        logprobs=logprobs.masked_fill(padding, 0.0),
        old_logprobs=old_logprobs.masked_fill(padding, 0.0),
        log_ratio=log_ratio,
        ratio=ratio,
        advantages=adv,
        mask=mask,
    )


def _controlled(objective: Objective, term: Term, tokens: Tokens, generator) -> Term:
    """The term with dual-clip and the covariance control applied, when the objective has them."""
    if objective.clip.dual is not None and objective.term is policy_losses.ppo_clip:
        term = policy_losses.dual_clip(term, tokens, objective.clip.dual)
    covariance = objective.covariance
    if covariance is not None and covariance.kind == "clip_cov":
        term = policy_losses.clip_cov(term, tokens, covariance.share, covariance.bounds, generator)
    elif covariance is not None:  # kl_cov replaces the clipped surrogate (verl's compute_policy_loss_kl_cov)
        term = policy_losses.kl_cov(tokens, covariance.share, covariance.coef)
    return term


def _per_term(weight: torch.Tensor, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sampler correction's weight (B, T) in the term's shape: itself per token; per sequence (gmpo),
    the geometric mean of its tokens' weights, (B, 1), as verl weights geo_mean's sequences."""
    if per_token.shape == weight.shape:
        return weight
    lengths = mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
    return torch.exp((torch.log(weight + 1e-10) * mask).sum(1, keepdim=True) / lengths)  # (B, 1)


def _aggregated(objective: Objective, per_token, kl, mask, num_sequences, num_tokens) -> torch.Tensor:
    """The policy term and beta * KL aggregated by the objective's rule (the docstring's table)."""
    if objective.aggregation == "sequence":  # one term per sequence; the KL as grpo aggregates it
        loss = per_token.sum() / (mask.shape[0] if num_sequences is None else num_sequences)
        if kl is not None:
            kl_term = _aggregate(kl, mask, "grpo", None, num_sequences, num_tokens)
            loss = loss + objective.beta * kl_term
        return loss
    if kl is not None:
        per_token = per_token + objective.beta * kl
    return _aggregate(
        per_token, mask, objective.aggregation, objective.max_completion_length, num_sequences, num_tokens
    )


def sampler_weights(old_logprobs, sampler_logprobs, padding, mode: str, cap: float):
    """(weights, changed), both (B, T): the detached importance weight of the trained-on ("old")
    policy against the sampler's numbers, per token or per sequence, truncated at `cap` or masked
    outside [1/cap, cap]; and which tokens the truncation or the mask changed. In log space, so
    that a far-off sequence cannot overflow."""
    log_r = (old_logprobs - sampler_logprobs).detach().masked_fill(padding, 0.0)  # (B, T): log r
    if mode.startswith("sequence"):
        log_r = log_r.sum(1, keepdim=True).expand_as(log_r)  # (B, T): log R on every token
    limit = math.log(cap)
    if mode.endswith("truncate"):
        return torch.exp(log_r.clamp(max=limit)), log_r > limit
    inside = log_r.abs() <= limit
    return inside.to(old_logprobs.dtype), ~inside


def sampler_mismatch(
    old_logprobs, sampler_logprobs, mask, num_sequences: int | None = None
) -> dict[str, float]:
    """How far the sampler's log-probs of the sampled tokens are from the trainer's ("old") ones:
    token mean and max of |old - sampler|, the share of tokens whose exp(old - sampler) leaves
    [0.9, 1.1], and the per-sequence log-ratio sum(old - sampler), summed over this batch's
    sequences and divided by `num_sequences` (the step's: micro-batch shares then add up)."""
    with torch.no_grad():
        keep = mask.to(torch.bool)  # (B, T)
        d = (old_logprobs.double() - sampler_logprobs.double()).masked_fill(~keep, 0.0)  # (B, T)
        count = max(int(keep.sum()), 1)
        outside = (d > math.log(1.1)) | (d < math.log(0.9))  # exp(d) outside [0.9, 1.1]
        return {
            "mismatch/logprob_abs_mean": float(d.abs().sum() / count),
            "mismatch/logprob_abs_max": float(d.abs().max()) if keep.any() else 0.0,
            "mismatch/ratio_outside_0.9_1.1_frac": float((outside & keep).sum() / count),
            "mismatch/seq_logratio_mean": float(d.sum() / (num_sequences or d.shape[0])),
        }


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate exp(d) - d - 1, d = ref - logp: 0 where they agree."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def _aggregate(per_token, mask, loss_type, max_completion_length, num_sequences, num_tokens) -> torch.Tensor:
    batch = mask.shape[0]
    num_sequences = batch if num_sequences is None else num_sequences
    tokens_here = mask.sum()
    masked_sum = (per_token * mask).sum()
    if loss_type == "grpo":
        per_sequence = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,)
        return per_sequence.sum() / num_sequences
    if loss_type == "bnpo":
        return masked_sum / tokens_here.clamp(min=1) * (batch / num_sequences)
    if loss_type == "dr_grpo":
        length = mask.shape[1] if max_completion_length is None else max_completion_length
        return masked_sum / (num_sequences * length)
    return _token_share(masked_sum, mask, num_tokens)  # dapo


def _token_share(masked_sum, mask, num_tokens) -> torch.Tensor:
    """A sum over this batch's tokens divided by the step's tokens (default: this batch's)."""
    total_tokens = mask.sum() if num_tokens is None else num_tokens
    return masked_sum / max(float(total_tokens), 1.0)


def _stats(loss, tokens: Tokens, term: Term, mask, kl, entropies) -> dict[str, float]:
    """Token means over unmasked tokens, as plain floats, named for the logger."""
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        low = term.low.to(mask.dtype)
        high = term.high.to(mask.dtype)

        def mean(x):
            return float((x * mask).sum() / count)

        stats = {
            "loss": float(loss),
            "clip/low_frac": mean(low),
            "clip/high_frac": mean(high),
            "clip/region_frac": mean(low + high),
            "ratio/mean": mean(tokens.ratio),
            "tokens": float(mask.sum()),
        }
        for name, selected in (term.extra or {}).items():
            stats[name] = mean(selected.to(mask.dtype))
        if kl is not None:
            stats["kl"] = mean(kl)
        if entropies is not None:
            stats["entropy"] = mean(entropies)
    return stats


def _check(
    logprobs, old_logprobs, advantages, mask, ref_logprobs, sampler_logprobs, entropies, objective: Objective
) -> None:
    if objective.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's log-probs)")
    if objective.sampler_correction != "none" and sampler_logprobs is None:
        raise ValueError(
            f"sampler_correction={objective.sampler_correction!r} needs sampler_logprobs (the sampler's "
            "log-probs of the tokens)"
        )
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("sampler_logprobs", sampler_logprobs),
        ("entropies", entropies),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must have shape ({shape[0]},), one per sequence, or {tuple(shape)}, one per "
            f"token; got {tuple(advantages.shape)}"
        )
