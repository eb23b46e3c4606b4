"""Stage 4 of the loop, update: the GRPO objective on a batch of completion tokens.

In: per-token log-probs of the completions under the policy being trained (with grad), under the
policy that sampled them ("old") and optionally under a frozen reference; one advantage per
completion, or one per token (process supervision); the completion mask. Out: `(loss, stats)`. It
knows tensors, not text, rewards or the model: logprobs.py computes the log-probs it is given.

Per completion token t of completion i, with A_i,t its advantage (A_i on every token of an outcome
advantage):

    ratio     = exp(logp - logp_old)
    surrogate = min(ratio * A_i,t, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A_i,t)
    k3        = exp(ref - logp) - (ref - logp) - 1        (unbiased KL estimate, >= 0 up to rounding)
    l_t       = -surrogate + beta * k3

and the loss aggregates l_t over the unmasked tokens by `loss_type`:

    grpo      mean over each sequence's tokens, then mean over sequences   (DeepSeekMath)
    bnpo      mean over all tokens of the batch
    dr_grpo   sum over tokens / (sequences * max_completion_length)        (Dr. GRPO)
    dapo      sum over tokens / tokens of the whole optimizer step         (DAPO)

Departures from DeepSeekMath GRPO: beta defaults to 0, not 0.04 (no reference model is kept
unless asked for, as in TRL and DAPO); the clip range may be asymmetric (epsilon_high: DAPO's
clip-higher); and the Dr. GRPO / DAPO aggregations above. Under gradient accumulation, pass the
whole step's `num_sequences` and `num_tokens`: each micro-batch's loss is then its exact share,
and for grpo, dr_grpo and dapo the micro-batch losses sum to the loss of the step's batch taken
at once. bnpo, a per-batch token mean by definition, takes each micro-batch's token mean weighted
by its share of the sequences: it equals the whole batch's only when every micro-batch's tokens
per completion are the batch's, so with ragged lengths its step depends on the split.

Extensions, each off by default:

    importance_sampling_level="sequence"   GSPO (Zheng et al., 2025): every token of completion i
        uses s_i = exp(mean over its tokens of (logp - logp_old)) as its ratio, the gradient
        flowing through that mean; clipped and aggregated as above. GSPO's paper clips at
        epsilon 3e-4 / epsilon_high 4e-4, far tighter than the token-level 0.2.
    loss_type="cispo"   CISPO (MiniMax-M1, 2025): l_t = -sg(min(ratio, 1 + epsilon_high)) * A_i * logp,
        aggregated as dapo. The ratio is a detached weight, not a clipped objective, so no
        token loses its gradient; no lower bound, as in the paper. epsilon_high defaults to 4.0
        for it (a weight capped at 5, ScaleRL's epsilon_max, Khatri et al., 2025); TRL's
        epsilon_high for cispo is that cap itself.
    sampler_correction   the tokens were drawn by the sampler, whose log-probs (`sampler_logprobs`)
        may differ slightly from the trainer's own "old" ones (other kernels, batch shapes, bf16).
        With r = exp(old - sampler) per token and R = exp(sum over the sequence of (old - sampler)),
        the policy-gradient term of each token is multiplied by a detached weight w (C = cap):
        token_truncate min(r, C) (truncated IS, Yao et al., 2025); token_mask 1 if 1/C <= r <= C
        else 0; sequence_truncate min(R, C); sequence_mask 1 if 1/C <= R <= C else 0 (masked IS,
        Liu et al., 2025). The KL term is not weighted; sampler == old makes every mode the identity.
`sampler_mismatch` measures that gap, whether or not a correction is on.
"""

from __future__ import annotations

import math

import torch

from ..config import check_objective

CISPO_EPSILON_HIGH = 4.0  # cispo's default epsilon_high: the weight is capped at 5 (see the docstring)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    sampler_logprobs: torch.Tensor | None = None,
    sampler_correction: str = "none",
    sampler_correction_cap: float = 3.0,
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    entropies: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of one (micro-)batch and its stats; shapes (B, T), advantages (B,) or (B, T).

    num_sequences / num_tokens: the whole optimizer step's (default: this batch's), for exact
    gradient accumulation. max_completion_length: Dr. GRPO's constant (default: T).
    sampler_logprobs (B, T): what the sampler reported for the same tokens (sampler_correction).
    """
    check_objective(
        loss_type,
        epsilon,
        epsilon_high,
        beta,
        importance_sampling_level,
        sampler_correction,
        sampler_correction_cap,
    )
    _check(logprobs, old_logprobs, advantages, mask, ref_logprobs, beta, sampler_logprobs, sampler_correction)
    if epsilon_high is None:
        epsilon_high = CISPO_EPSILON_HIGH if loss_type == "cispo" else epsilon
    padding = mask == 0  # (B, T); zeroed before exp, so no value there can overflow into a NaN
    mask = mask.to(logprobs.dtype)  # (B, T)
    log_ratio = (logprobs - old_logprobs).masked_fill(padding, 0.0)  # (B, T)
    if importance_sampling_level == "sequence":  # GSPO: the length-normalised sequence ratio, on every token
        per_sequence = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
        log_ratio = per_sequence.expand_as(log_ratio)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.to(logprobs.dtype)  # (B, T), or (B,) for one advantage per completion
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)  # (B, 1)
    adv = adv.masked_fill(padding, 0.0)  # (B, T): nothing on padding, whatever the caller put there
    if loss_type == "cispo":  # the clipped ratio is a constant weight of A * logp
        capped = ratio.clamp(max=1 + epsilon_high).detach()  # (B, T)
        per_token = -capped * adv * logprobs.masked_fill(padding, 0.0)  # (B, T)
    else:
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv)  # (B, T)
    corrected = None
    if sampler_correction != "none":
        weight, corrected = sampler_weights(
            old_logprobs, sampler_logprobs, padding, sampler_correction, sampler_correction_cap
        )
        per_token = per_token * weight  # (B, T)
    kl = None
    if ref_logprobs is not None and beta != 0.0:
        kl = k3(logprobs.masked_fill(padding, 0.0), ref_logprobs.masked_fill(padding, 0.0))  # (B, T)
        per_token = per_token + beta * kl
    aggregation = "dapo" if loss_type == "cispo" else loss_type
    loss = _aggregate(per_token, mask, aggregation, max_completion_length, num_sequences, num_tokens)
    stats = _stats(loss, ratio, adv, mask, epsilon, epsilon_high, kl, entropies, cispo=loss_type == "cispo")
    if corrected is not None:
        kind = "masked" if sampler_correction.endswith("mask") else "truncated"
        stats[f"sampler_correction/{kind}_frac"] = float((corrected * mask).sum() / mask.sum().clamp(min=1))
    return loss, stats


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
    total_tokens = tokens_here if num_tokens is None else num_tokens  # dapo
    return masked_sum / max(float(total_tokens), 1.0)


def _stats(
    loss, ratio, adv, mask, epsilon, epsilon_high, kl, entropies, cispo: bool = False
) -> dict[str, float]:
    """Token means over unmasked tokens, as plain floats, named for the logger."""
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        if cispo:  # no lower bound; the weight is capped whatever the advantage's sign (the gradient is kept)
            low = torch.zeros_like(mask)
            high = (ratio > 1 + epsilon_high).to(mask.dtype)
        else:  # where the clip cuts the gradient
            low = ((ratio < 1 - epsilon) & (adv < 0)).to(mask.dtype)
            high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)

        def mean(x):
            return float((x * mask).sum() / count)

        stats = {
            "loss": float(loss),
            "clip/low_frac": mean(low),
            "clip/high_frac": mean(high),
            "clip/region_frac": mean(low + high),
            "ratio/mean": mean(ratio),
            "tokens": float(mask.sum()),
        }
        if kl is not None:
            stats["kl"] = mean(kl)
        if entropies is not None:
            stats["entropy"] = mean(entropies)
    return stats


def _check(
    logprobs, old_logprobs, advantages, mask, ref_logprobs, beta, sampler_logprobs, sampler_correction
) -> None:
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's log-probs)")
    if sampler_correction != "none" and sampler_logprobs is None:
        raise ValueError(
            f"sampler_correction={sampler_correction!r} needs sampler_logprobs (the sampler's "
            "log-probs of the tokens)"
        )
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("sampler_logprobs", sampler_logprobs),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must have shape ({shape[0]},), one per sequence, or {tuple(shape)}, one per "
            f"token; got {tuple(advantages.shape)}"
        )
