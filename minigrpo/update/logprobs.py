"""Stage 4 of the loop, update: the per-token log-probs its objective is taken of.

In: a model, completions collated after their prompts (rollout.collate) and the sampling
temperature. Out: each completion token's log-prob and the entropy of the distribution it was
drawn from, both (B, Tc), with gradients through both (the entropy's for the entropy bonus).
`token_logprobs` is the one place logits become log-probs, for the policy, old and reference passes
alike, always at the sampler's temperature (the ratio compares the same distributions);
`BaseLogprobs`, those of a LoRA policy's frozen base (its adapters off). The LM head runs a chunk of
rows at a time and recomputes it in backward (`ChunkedLogprobs`), so the (B, Tc, V) logits never exist;
`full_vocabulary_logprobs` is the plain path the tests hold it equal to. It knows the model's
hidden states and its LM head, not rewards, advantages or the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import adapters_off, logit_dtype

# Completion tokens per chunk of LM-head logits: one (512, V) fp32 chunk is 311 MB at V = 151,936.
# How the size was chosen: benchmarks/README.md, bench_update.py's vocab case.
LOGPROB_CHUNK_ROWS = 512


def token_logprobs(
    model,
    input_ids,
    attention_mask,
    completion_start: int,
    temperature: float,
    chunk_rows: int = LOGPROB_CHUNK_ROWS,
    group_size: int = 1,
):
    """(logprobs, entropies), both (B, Tc): each completion token's log-prob, and the entropy of the
    distribution it was drawn from, under softmax(logits / temperature); temperature 0 (greedy) means 1.

    input_ids, attention_mask (B, Lp + Tc): left-padded prompts then right-padded completions from
    column `completion_start` = Lp. The LM head runs `chunk_rows` tokens at a time (`ChunkedLogprobs`),
    never holding the (B, Tc, V) logits. With `group_size` G > 1, rows come in groups of G completions
    of one prompt, and each prompt runs once (Qwen3.shared_prompt_hidden_states).
    """
    predicting = completion_hidden_states(model, input_ids, attention_mask, completion_start, group_size)
    return head_logprobs(
        predicting, model.head_weight, input_ids[:, completion_start:], temperature, chunk_rows
    )


def completion_hidden_states(model, input_ids, attention_mask, completion_start: int, group_size: int = 1):
    """(B, Tc, hidden): the model's last hidden states at the positions that predict each completion token,
    the LM head's input. With `group_size` G > 1 each prompt of G rows runs once."""
    if group_size > 1:
        return model.shared_prompt_hidden_states(input_ids, attention_mask, completion_start, group_size)
    hidden = model.hidden_states(input_ids, attention_mask)  # (B, Lp + Tc, hidden)
    return hidden[:, completion_start - 1 : -1]  # the positions before each completion token


def head_logprobs(predicting, head_weight, targets, temperature: float, chunk_rows: int = LOGPROB_CHUNK_ROWS):
    """(logprobs, entropies), both (B, Tc), of `targets` (B, Tc) from the hidden states `predicting`
    (B, Tc, hidden) through the LM head `head_weight` (V, hidden), `chunk_rows` tokens at a time."""
    B, Tc = targets.shape
    scale = 1.0 / (temperature or 1.0)
    logprobs, entropies = ChunkedLogprobs.apply(
        predicting.reshape(B * Tc, -1), head_weight, targets.reshape(-1), scale, chunk_rows
    )
    return logprobs.view(B, Tc), entropies.view(B, Tc)


def full_vocabulary_logprobs(model, input_ids, attention_mask, completion_start: int, temperature: float):
    """The slow, obvious path `token_logprobs` is tested against: (B, Tc, V) logits, their log-softmax,
    a gather; the same outputs, holding every logit."""
    hidden = model.hidden_states(input_ids, attention_mask)  # (B, Lp + Tc, hidden)
    logits = model.logits(hidden[:, completion_start - 1 : -1]) / (temperature or 1.0)  # (B, Tc, V)
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, Tc, V)
    logprobs = logp_all.gather(-1, input_ids[:, completion_start:, None]).squeeze(-1)  # (B, Tc)
    return logprobs, -(logp_all.exp() * logp_all).sum(-1)


class ChunkedLogprobs(torch.autograd.Function):
    """Log-probs of target tokens through the LM head, `chunk` rows at a time, with recompute.

    forward(hidden (N, H), weight (V, H), targets (N,), scale, chunk) -> logprobs (N,), entropies (N,)
    under softmax(scale * hidden @ weight.T), logits in fp32 (fp64 for fp64 weights). Per chunk it
    keeps only the log-normaliser; backward recomputes the chunk's logits, forms d logp / d z = scale *
    (onehot(target) - softmax), then the hidden states' and the head's gradients. Each chunk works in
    place in one (chunk, V) buffer: the peak is that buffer and the head's (V, H) gradient, not several
    (N, V) tensors. When the loss also reads the entropies (the entropy bonus), their gradient
    d H / d z = -scale * p (log p + H) joins in, with a second (chunk, V) buffer.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, chunk: int):
        N = hidden.shape[0]
        dtype = logit_dtype(weight.dtype)
        logprobs = hidden.new_empty(N, dtype=dtype)  # (N,)
        entropies = hidden.new_empty(N, dtype=dtype)  # (N,)
        normalisers = hidden.new_empty(N, dtype=dtype)  # (N,): each row's log sum exp
        for start in range(0, N, chunk):
            rows = slice(start, start + chunk)
            logprob, entropy, normaliser = _chunk_forward(hidden[rows], weight, targets[rows], scale, dtype)
            logprobs[rows] = logprob
            entropies[rows] = entropy
            normalisers[rows] = normaliser
        ctx.save_for_backward(hidden, weight, targets, normalisers, entropies)
        ctx.scale = scale
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)  # an output the loss does not read gets None, not zeros
        return logprobs, entropies

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropies):
        hidden, weight, targets, normalisers, entropies = ctx.saved_tensors
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(normalisers)
        dtype = logit_dtype(weight.dtype)
        gradients = HeadGradients(ctx, hidden, weight, dtype)
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            # grad_z: (c, V)
            grad_z = _chunk_grad_logits(
                hidden[rows], weight, targets[rows], normalisers[rows], grad_logprobs[rows], ctx.scale, dtype
            )
            if grad_entropies is not None:
                entropy_grad = _chunk_grad_entropy(
                    hidden[rows],
                    weight,
                    normalisers[rows],
                    entropies[rows],
                    grad_entropies[rows],
                    ctx.scale,
                    dtype,
                )
                grad_z = grad_z.add_(entropy_grad.to(grad_z.dtype))
                del entropy_grad
            gradients.add(rows, grad_z, hidden[rows])
            del grad_z  # before the next chunk's buffer is made
        return *gradients.result(), None, None, None


class HeadGradients:
    """The gradients a chunked LM head's backward fills a chunk at a time (ChunkedLogprobs, and
    distillation.py's ChunkedReverseKL): the hidden states' (N, H) when autograd asks for them, and the
    head's (V, H) when it is trained, summed in `dtype` (fp32, or fp64) and handed back in the head's."""

    def __init__(self, ctx, hidden: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype):
        self.head = weight  # (V, H)
        self.hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None  # (N, H)
        self.weight = None  # (V, H), in `dtype`
        if ctx.needs_input_grad[1]:
            self.weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device)

    def add(self, rows: slice, grad_z: torch.Tensor, hidden: torch.Tensor) -> None:
        """One chunk's share, from the gradient of its logits grad_z (c, V) and its hidden states (c, H)."""
        if self.hidden is not None:
            self.hidden[rows] = grad_z @ self.head  # (c, H)
        if self.weight is not None:
            add_head_gradient(self.weight, grad_z, hidden)

    def result(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the hidden states' gradient, the head's in its own dtype), None where none was asked for."""
        return self.hidden, None if self.weight is None else self.weight.to(self.head.dtype)


def add_head_gradient(grad_weight, grad_z, hidden) -> None:
    """grad_weight (V, H), fp32 or fp64, += grad_z.T @ hidden for one chunk's grad_z (c, V) and hidden (c, H):
    in place when the dtypes agree (no second (V, H) tensor); in bf16 / fp16, the chunk's product in
    their dtype, the sum in fp32."""
    if grad_weight.dtype == grad_z.dtype:
        grad_weight.addmm_(grad_z.t(), hidden)
    else:
        grad_weight += (grad_z.t() @ hidden).to(grad_weight.dtype)


def _chunk_forward(hidden, weight, targets, scale: float, dtype):
    """(logprobs, entropies, log-normalisers), (c,) each, of one chunk, in one (c, V) buffer.

    With z the scaled logits, m their row max and e = exp(z - m): logZ = m + log sum e, a target's
    log-prob is z_target - logZ (gathered before the buffer turns into e), and the entropy is
    logZ - sum softmax * z = log sum e - sum e log e / sum e.
    """
    z = F.linear(hidden, weight).to(dtype).mul_(scale)  # (c, V)
    target = z.gather(-1, targets[:, None]).squeeze(-1)  # (c,)
    top = z.amax(-1, keepdim=True)  # (c, 1)
    e = z.sub_(top).exp_()  # (c, V), in place
    total = e.sum(-1)  # (c,)
    normaliser = top.squeeze(-1) + total.log()  # (c,)
    # e log e in place (0 where e underflowed), summed per row
    entropy = total.log() - torch.special.xlogy(e, e, out=e).sum(-1) / total  # (c,)
    return target - normaliser, entropy, normaliser


def _chunk_grad_logits(hidden, weight, targets, normalisers, grad_logprobs, scale: float, dtype):
    """d loss / d (hidden @ weight.T) of one chunk, (c, V) in the weight's dtype: the logits
    recomputed, then in place scale * grad * (onehot(target) - softmax)."""
    grad_z = F.linear(hidden, weight).to(dtype).mul_(scale)  # (c, V): z
    grad_z.sub_(normalisers[:, None]).exp_().neg_()  # -softmax
    grad_z.scatter_add_(-1, targets[:, None], torch.ones_like(grad_z[:, :1]))  # onehot - softmax
    grad_z.mul_(grad_logprobs[:, None] * scale)
    return grad_z.to(weight.dtype)


def _chunk_grad_entropy(hidden, weight, normalisers, entropies, grad_entropies, scale: float, dtype):
    """d loss / d (hidden @ weight.T) through the entropies of one chunk, (c, V): the logits recomputed,
    then -scale * grad * p (log p + H), with log p = z - logZ; two (c, V) buffers."""
    log_p = F.linear(hidden, weight).to(dtype).mul_(scale).sub_(normalisers[:, None])  # (c, V)
    p = log_p.exp()  # (c, V)
    log_p.add_(entropies[:, None]).mul_(p).mul_(-scale * grad_entropies[:, None])  # (c, V), in place
    del p
    return log_p


class TokenLogprobs(torch.nn.Module):
    """`token_logprobs` of a model as a module's forward: DistributedDataParallel and FSDP2 hook a
    module's forward, and the update wraps this one (see distributed.py)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids, attention_mask, completion_start: int, temperature: float, group_size: int = 1
    ):
        logprobs, entropies = token_logprobs(
            self.model, input_ids, attention_mask, completion_start, temperature, group_size=group_size
        )
        return logprobs.clone(), entropies  # a copy, not a view of the chunked result: FSDP2 hooks outputs


class BaseLogprobs(TokenLogprobs):
    """`token_logprobs` of an adapted model with its LoRA adapters off: its frozen base, the KL's reference
    for adapters that started fresh, with no second copy of the model."""

    def forward(self, *args, **kwargs):
        with adapters_off(self.model):
            return super().forward(*args, **kwargs)
