"""Stages 3 and 4 of the loop with a teacher: on-policy distillation. The policy samples as always; a
frozen teacher that shares its tokenizer grades each sampled token, and the policy is pushed toward the
teacher by the per-token reverse KL on its own samples (Agarwal et al., 2024, GKD; Thinking Machines,
"On-Policy Distillation", 2025).

In: the teacher's log-probs of the sampled tokens and, for the full form, its last hidden states at each
completion position (`TeacherForward`: one forward per step, through the chunked LM head the update
uses); the verifier's advantages. Out: the advantages mixed (stage 3) and, for the full form, the reverse
KL's term in each micro-batch's loss (stage 4), with their stats. It knows tensors and rollouts, not
where the teacher comes from (run/teacher.py loads and checks it).

The two forms (`distillation_form`), with p the policy's distribution and q the teacher's, both at the
run's sampling temperature:

    token  completion token x_t's advantage D_t = -(log p(x_t) - log q(x_t)), a number like a reward
           (detached), discount 0, log p the sampler's own (tinker-cookbook's incorporate_kl_penalty with
           kl_discount_factor 0); then the run's own policy loss, its clip and aggregation. Over x_t ~ p,
           D_t averages -KL(p || q) at position t.
    full   the exact reverse KL at each completion position, KL_t = sum_v p(v) (log p(v) - log q(v)),
           differentiated directly and averaged over the step's completion tokens: TRL's
           generalized_jsd_loss (and DistillationTrainer) with its beta = 1 (TRL's beta picks the
           divergence, 0 forward KL, 1 reverse KL; it is not GRPO's KL weight), reduced as TRL's sum /
           num_items_in_batch. `ChunkedReverseKL` takes it a chunk of rows at a time from both models'
           hidden states and LM heads, recomputed in backward: never the (B, T, V) logits.

The mix with the verifier, c = distillation_coef (1: distillation alone; 0: RL alone, the teacher only
measured):

    token  A_t = c D_t + (1 - c) A_t^RL        (A^RL: the verifier's advantage, per completion or token)
    full   the verifier's advantages times (1 - c), and c times the mean KL added to the loss: a weighted
           sum of the two losses, as every policy term scales with a positive multiple of the advantages
           (but for Clip-Cov's choice of tokens, whose covariance bounds are absolute numbers).

Either way the run's KL to its reference (beta) and its entropy bonus keep their whole weight, and only
the policy's own tokens count: a tool's observation tokens are context, masked from the KL as from the
loss.

Departures, named: tinker adds its KL advantage to the verifier's (A + c D); here the two are weighted c
and 1 - c, so that c = 1 is distillation alone. The teacher's log-probs are at the sampling temperature,
as TRL's (tinker asks its teacher at temperature 1). The full form's teacher runs once per step and its
hidden states are kept for the update (TRL's DistillationTrainer runs the teacher in every micro-batch).
"""

from __future__ import annotations

import torch

from ..model import logit_dtype
from ..rollout import Rollout, loss_positions
from .logprobs import (
    LOGPROB_CHUNK_ROWS,
    HeadGradients,
    TokenLogprobs,
    completion_hidden_states,
    head_logprobs,
)

# Rows per chunk of the exact KL: it holds both models' logits of a chunk (and a temporary), so half the
# rows of the log-probs' chunk keep its buffers near that one chunk's size.
KL_CHUNK_ROWS = LOGPROB_CHUNK_ROWS // 2


# -- the teacher's forward and the policy's, with the exact reverse KL ------------------------------------
class TeacherForward(torch.nn.Module):
    """The teacher's forward as a module (the updater runs modules): its log-probs of the completion
    tokens (B, Tc) and its last hidden states at each completion position (B, Tc, H_teacher)."""

    def __init__(self, teacher):
        super().__init__()
        self.model = teacher

    def forward(
        self, input_ids, attention_mask, completion_start: int, temperature: float, group_size: int = 1
    ):
        hidden = completion_hidden_states(self.model, input_ids, attention_mask, completion_start, group_size)
        targets = input_ids[:, completion_start:]  # (B, Tc)
        logprobs, _ = head_logprobs(hidden, self.model.head_weight, targets, temperature)
        return logprobs, hidden


class DistilledLogprobs(TokenLogprobs):
    """The policy's `TokenLogprobs` and, given the teacher's hidden states (B, Tc, H_teacher), the exact
    reverse KL to the teacher at each completion position (B, Tc), from the same hidden states. The
    teacher's LM head is held as a plain tensor, not a parameter: nothing trains it."""

    def __init__(self, model, teacher_head: torch.Tensor):
        super().__init__(model)
        self.teacher_head = teacher_head.detach()  # (V, H_teacher)

    def forward(
        self,
        input_ids,
        attention_mask,
        completion_start: int,
        temperature: float,
        group_size: int = 1,
        teacher_hidden=None,
    ):
        hidden = completion_hidden_states(self.model, input_ids, attention_mask, completion_start, group_size)
        targets = input_ids[:, completion_start:]  # (B, Tc)
        logprobs, entropies = head_logprobs(hidden, self.model.head_weight, targets, temperature)
        if teacher_hidden is None:  # the old log-probs' pass (num_iterations > 1) reads no KL
            return logprobs.clone(), entropies
        B, Tc = targets.shape
        kl = ChunkedReverseKL.apply(
            hidden.reshape(B * Tc, -1),
            self.model.head_weight,
            teacher_hidden.reshape(B * Tc, -1),
            self.teacher_head,
            1.0 / (temperature or 1.0),
            KL_CHUNK_ROWS,
        )
        return logprobs.clone(), entropies, kl.view(B, Tc)


class ChunkedReverseKL(torch.autograd.Function):
    """Each row's KL(p || q) over the vocabulary, p = softmax(scale * hidden @ weight.T) the policy's and
    q = softmax(scale * teacher_hidden @ teacher_weight.T) the teacher's, `chunk` rows at a time.

    forward(hidden (N, H), weight (V, H), teacher_hidden (N, Ht), teacher_weight (V, Ht), scale, chunk)
    -> kl (N,), logits in fp32 (fp64 for fp64 weights). Each chunk works in two (chunk, V) buffers and
    keeps nothing but its KLs; backward recomputes both log-softmaxes and forms the gradient of the
    policy's logits, d KL / d z = scale * p (log p - log q - KL), then the hidden states' and the head's
    as ChunkedLogprobs does. The teacher's inputs get no gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, teacher_weight, scale: float, chunk: int):
        dtype = _logit_dtype(weight, teacher_weight)
        kls = hidden.new_empty(hidden.shape[0], dtype=dtype)  # (N,)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            log_p, log_q = _log_softmaxes(
                hidden[rows], weight, teacher_hidden[rows], teacher_weight, scale, dtype
            )
            difference = log_q.neg_().add_(log_p)  # (c, V): log p - log q, in log q's buffer
            kls[rows] = difference.mul_(log_p.exp_()).sum(-1)  # (c,): p (log p - log q), in place
        ctx.save_for_backward(hidden, weight, teacher_hidden, teacher_weight, kls)
        ctx.scale = scale
        ctx.chunk = chunk
        return kls

    @staticmethod
    def backward(ctx, grad_kls):
        hidden, weight, teacher_hidden, teacher_weight, kls = ctx.saved_tensors
        dtype = _logit_dtype(weight, teacher_weight)
        gradients = HeadGradients(ctx, hidden, weight, dtype)
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            log_p, log_q = _log_softmaxes(
                hidden[rows], weight, teacher_hidden[rows], teacher_weight, ctx.scale, dtype
            )
            grad_z = log_q.neg_().add_(log_p).sub_(kls[rows, None])  # (c, V): log p - log q - KL
            grad_z.mul_(log_p.exp_()).mul_(grad_kls[rows, None].to(dtype) * ctx.scale)
            grad_z = grad_z.to(weight.dtype)
            del log_p
            gradients.add(rows, grad_z, hidden[rows])
            del grad_z  # before the next chunk's buffers are made
        return *gradients.result(), None, None, None, None


def _logit_dtype(weight, teacher_weight) -> torch.dtype:
    """Both models' logits in one dtype: fp32, or fp64 when either head is fp64."""
    return torch.promote_types(logit_dtype(weight.dtype), logit_dtype(teacher_weight.dtype))


def _log_softmaxes(hidden, weight, teacher_hidden, teacher_weight, scale: float, dtype):
    """(log p, log q), (c, V) each: the policy's and the teacher's scaled log-softmax of one chunk, one
    after the other, each in its logits' own buffer: at most three (c, V) buffers at once (both, and
    logsumexp's one temporary), where log_softmax beside the logits would hold four."""
    return _log_softmax(hidden, weight, scale, dtype), _log_softmax(
        teacher_hidden, teacher_weight, scale, dtype
    )


def _log_softmax(hidden, weight, scale: float, dtype):
    logits = torch.nn.functional.linear(hidden, weight).to(dtype).mul_(scale)  # (c, V)
    return logits.sub_(logits.logsumexp(-1, keepdim=True))  # (c, V), in place


def full_vocabulary_reverse_kl(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float):
    """The slow, obvious path `ChunkedReverseKL` is tested against: KL(p || q) (B, T) from the (B, T, V)
    logits of both, at `temperature`."""
    log_p = torch.log_softmax(logits / (temperature or 1.0), dim=-1)  # (B, T, V)
    log_q = torch.log_softmax(teacher_logits / (temperature or 1.0), dim=-1)  # (B, T, V)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


# -- what a teacher adds to a run, chosen once ---------------------------------------------------------
class NoTeacher:
    """A run without a teacher: every hook below leaves what it is given as it was."""

    keeps_hidden = False  # stage 3 keeps no teacher hidden states

    def advantages(self, rollouts: list[Rollout], outcome: list[float], per_token: list):
        return outcome, per_token, {}

    def policy_module(self, model) -> TokenLogprobs:
        return TokenLogprobs(model)

    def update_inputs(self, batch) -> tuple:
        return ()

    def loss(self, loss, stats: dict, outputs: list, mask, num_tokens: int):
        return loss, stats

    def update_stats(self, stats: dict) -> dict:
        return stats

    def describe(self) -> str:
        return ""


class TokenDistillation(NoTeacher):
    """distillation_form='token': per-token advantages c D_t + (1 - c) A_t^RL (the module docstring)."""

    def __init__(self, coef: float):
        self.coef = coef

    def advantages(self, rollouts: list[Rollout], outcome: list[float], per_token: list):
        """Each rollout's mixed advantages (Tc,), and the distillation's share of their magnitude over
        the loss tokens (`distill/loss_share`: the loss is the policy loss of these advantages)."""
        c = self.coef
        mixed = []
        distilled = 0.0  # sum over loss tokens of |c D_t|
        verified = 0.0  # and of |(1 - c) A_t^RL|
        for r, advantage, tokens in zip(rollouts, outcome, per_token):
            rl = tokens if tokens is not None else torch.full((len(r.completion_ids),), float(advantage))
            distill = token_distillation_advantages(r)  # (Tc,)
            mixed.append(c * distill + (1 - c) * rl)  # (Tc,)
            positions = loss_positions(r)
            distilled += float((c * distill[positions]).abs().sum())
            verified += float(((1 - c) * rl[positions]).abs().sum())
        return outcome, mixed, {"distill/loss_share": _share(distilled, verified)}

    def describe(self) -> str:
        return f"distillation_form=token distillation_coef={self.coef:g}"


class FullDistillation(NoTeacher):
    """distillation_form='full': the verifier's advantages times (1 - c), and c times the step's mean
    exact reverse KL in the loss (the module docstring)."""

    keeps_hidden = True  # the update's KL reads the teacher's hidden states

    def __init__(self, coef: float, teacher_head: torch.Tensor):
        self.coef = coef
        self.teacher_head = teacher_head  # (V, H_teacher)

    def advantages(self, rollouts: list[Rollout], outcome: list[float], per_token: list):
        scaled = [(1 - self.coef) * a for a in outcome]
        scaled_tokens = [None if tokens is None else (1 - self.coef) * tokens for tokens in per_token]
        return scaled, scaled_tokens, {}

    def policy_module(self, model) -> DistilledLogprobs:
        return DistilledLogprobs(model, self.teacher_head)

    def update_inputs(self, batch) -> tuple:
        return (batch.teacher_hidden,)  # (B, Tc, H_teacher)

    def loss(self, loss, stats: dict, outputs: list, mask, num_tokens: int):
        """The micro-batch's loss plus c times its share of the step's mean KL over completion tokens;
        `distill/loss` that share (it adds up over micro-batches, as `loss` does)."""
        if not outputs:  # the padding rollout of a rank short of micro-batches: weighs nothing, adds nothing
            return loss, {**stats, "distill/loss": 0.0, "distill/reverse_kl_exact": 0.0}
        (kl,) = outputs  # (B, Tc); mask (B, Tc): 1 on the policy's own tokens
        term = self.coef * (kl * mask).sum() / max(float(num_tokens), 1.0)
        total = loss + term
        exact = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        return total, {
            **stats,
            "loss": float(total.detach()),
            "distill/loss": float(term.detach()),
            "distill/reverse_kl_exact": exact,
        }

    def update_stats(self, stats: dict) -> dict:
        """`distill/loss_share`: the KL term's share of the loss's magnitude. With num_iterations = 1 the
        policy term reads about 0 (its gradient does not), so the share reads about 1."""
        term = stats["distill/loss"]
        return {**stats, "distill/loss_share": _share(abs(term), abs(stats["loss"] - term))}

    def describe(self) -> str:
        return f"distillation_form=full distillation_coef={self.coef:g}"


def distillation_for(grpo, teacher) -> NoTeacher:
    """What the run's teacher adds, chosen once (GRPOConfig checked the settings): nothing without one."""
    if teacher is None:
        return NoTeacher()
    if grpo.distillation_form == "full":
        return FullDistillation(grpo.distillation_coef, teacher.head_weight)
    return TokenDistillation(grpo.distillation_coef)


def token_distillation_advantages(r: Rollout) -> torch.Tensor:
    """(Tc,) D_t = -(log p(x_t) - log q(x_t)) of each of the rollout's tokens (the sampler's log-prob and
    the teacher's); 0 on the tokens the loss does not see (a tool's observation)."""
    gap = r.teacher_logprobs - r.sampler_logprobs  # (Tc,)
    return torch.where(loss_positions(r), gap, torch.zeros_like(gap))


def teacher_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """`distill/reverse_kl`: the mean over the loss tokens of log p(x_t) - log q(x_t), the sampled
    token's estimate of the reverse KL (tinker's teacher_kl); the same in both forms."""
    gaps = [(r.sampler_logprobs - r.teacher_logprobs)[loss_positions(r)] for r in rollouts]
    flat = torch.cat(gaps) if gaps else torch.zeros(0)
    return {"distill/reverse_kl": float(flat.mean()) if flat.numel() else 0.0}


def _share(part: float, rest: float) -> float:
    return part / (part + rest) if part + rest > 0 else 0.0
