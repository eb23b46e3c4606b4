"""Stage 4 of the loop, update: the GRPO objective on a batch of completion tokens.

In: per-token log-probs of the completions under the policy being trained (with grad), under the
policy that sampled them ("old") and optionally under a frozen reference; one advantage per
completion; the completion mask. Out: `(loss, stats)`. It knows tensors, not text or rewards.
`token_logprobs` is the one place logits become log-probs, for the policy, old and reference
passes alike, always at the sampler's temperature (the ratio compares the same distributions).

Per completion token t of completion i, with A_i its advantage:

    ratio     = exp(logp - logp_old)
    surrogate = min(ratio * A_i, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A_i)
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
and the micro-batch losses sum to the loss of the step's batch taken at once (bnpo, a per-batch
token mean by definition, is weighted by each micro-batch's share of the sequences).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def token_logprobs(model, input_ids, attention_mask, completion_start: int, temperature: float):
    """(logprobs, entropies), both (B, Tc): each completion token's log-prob, and the entropy of the
    distribution it was drawn from, under softmax(logits / temperature).

    input_ids, attention_mask (B, Lp + Tc): left-padded prompts then right-padded completions,
    the completions starting at column `completion_start` = Lp. Temperature 0 (greedy) means 1.
    """
    hidden = model.hidden_states(input_ids, attention_mask)  # (B, Lp + Tc, hidden)
    predicting = hidden[:, completion_start - 1 : -1]  # (B, Tc, hidden): the positions before each completion token
    logits = model.logits(predicting) / (temperature or 1.0)  # (B, Tc, V), fp32
    logp_all = F.log_softmax(logits, dim=-1)  # (B, Tc, V)
    targets = input_ids[:, completion_start:]  # (B, Tc)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, Tc)
    with torch.no_grad():
        entropies = -(logp_all.exp() * logp_all).sum(-1)  # (B, Tc)
    return logprobs, entropies


class TokenLogprobs(torch.nn.Module):
    """`token_logprobs` of a model as a module's forward: DistributedDataParallel and FSDP2 hook a
    module's forward, and the trainer wraps this one (see distributed.py)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, completion_start: int, temperature: float):
        logprobs, entropies = token_logprobs(self.model, input_ids, attention_mask, completion_start, temperature)
        return logprobs.clone(), entropies  # a copy, not a view of the gathered log-softmax: FSDP2 hooks outputs


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
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    entropies: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of one (micro-)batch and its stats; shapes (B, T) but advantages (B,).

    num_sequences / num_tokens: the whole optimizer step's (default: this batch's), for exact
    gradient accumulation. max_completion_length: Dr. GRPO's constant (default: T).
    """
    _check(logprobs, old_logprobs, advantages, mask, ref_logprobs, beta, epsilon, epsilon_high, loss_type)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    padding = mask == 0  # (B, T); zeroed before exp, so no value there can overflow into a NaN
    mask = mask.to(logprobs.dtype)  # (B, T)
    ratio = torch.exp((logprobs - old_logprobs).masked_fill(padding, 0.0))  # (B, T)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # (B, 1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv)  # (B, T)
    per_token = -surrogate  # (B, T)
    kl = None
    if ref_logprobs is not None and beta != 0.0:
        kl = k3(logprobs.masked_fill(padding, 0.0), ref_logprobs.masked_fill(padding, 0.0))  # (B, T)
        per_token = per_token + beta * kl
    loss = _aggregate(per_token, mask, loss_type, max_completion_length, num_sequences, num_tokens)
    return loss, _stats(loss, ratio, adv, mask, epsilon, epsilon_high, kl, entropies)


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


def _stats(loss, ratio, adv, mask, epsilon, epsilon_high, kl, entropies) -> dict[str, float]:
    """Token means over unmasked tokens, as plain floats, named for the logger."""
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        low = ((ratio < 1 - epsilon) & (adv < 0)).to(mask.dtype)  # clipped from below: the gradient is cut
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


def _check(logprobs, old_logprobs, advantages, mask, ref_logprobs, beta, epsilon, epsilon_high, loss_type) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if not epsilon > 0 or (epsilon_high is not None and not epsilon_high > 0):
        raise ValueError(f"epsilon and epsilon_high must be > 0, got {epsilon} and {epsilon_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's log-probs)")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask), ("ref_logprobs", ref_logprobs)):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(shape)}")
    if advantages.shape != shape[:1]:
        raise ValueError(f"advantages must have shape ({shape[0]},), one per sequence; got {tuple(advantages.shape)}")
