"""Stage 4 of the loop, update: a step's rollouts in, num_iterations AdamW steps and their stats out.

In: this rank's block of the step's rollouts, with advantages (stage 3), and the whole step's
totals (`step_totals`), against which each loss share is taken. Per step: their old log-probs
(num_iterations > 1) and reference log-probs (beta > 0); with a teacher, before stage 3, the teacher's
outputs (`teacher_outputs`). Then each pass cuts them into micro-batches (by rows, by a budget
of padded tokens, or whole groups for the shared-prompt forward), takes the run's objective of each
(loss.py: chosen once, when the updater is built) with gradient accumulation, clips the gradient and
makes one AdamW step; the entropy bonus's coefficient (entropy.py) moves after each; a teacher's
exact reverse KL joins each micro-batch's loss (distillation.py's full form). A non-finite
loss or gradient skips the pass and leaves weights and AdamW state as they were; weights that are
not finite after a step stop the run (NonFiniteWeights), before anything saves them. It knows
rollouts, tensors and the configs, not text, rewards or where the rollouts came from. It meets the
ranks only where an AdamW step needs every rank: distributed.ParallelModel's gradient all-reduce,
padding micro-batches and global-norm clipping; and each pass's stats and weight check, reduced
over the ranks so that every rank takes the same skip and entropy decisions.
"""

from __future__ import annotations

import contextlib
import math
import random
import time

import torch

from .. import distributed
from ..config import GRPOConfig, TrainConfig
from ..rollout import (
    Rollout,
    collate,
    split_logprobs,
)
from .distillation import NoTeacher, TeacherForward
from .entropy import EntropyCoefficient
from .logprobs import TokenLogprobs
from .loss import objective_from, objective_loss, sampler_mismatch
from .micro_batching import group_batches, micro_batches, padding_fraction, token_budget_batches

# Stats of a micro-step that are shares of the step's totals (they add up over micro-batches and
# ranks); the others are token means, or maxima (names ending in _max).
SHARES = frozenset({"loss", "tokens", "mismatch/seq_logratio_mean", "distill/loss"})


def step_totals(rollouts: list[Rollout]) -> dict[str, int]:
    """The whole step's sequences and loss tokens: each micro-batch's loss, on every rank, is an exact
    share of them (grpo's sequence count, dapo's token count)."""
    return {"sequences": len(rollouts), "tokens": sum(r.loss_tokens for r in rollouts)}


class NonFiniteWeights(RuntimeError):
    """An AdamW step left NaN or inf in the weights; the message names the GRPO step."""


class Updater:
    """The policy's optimizer step from rollouts; holds the policy (and reference) as every rank uses them."""

    def __init__(
        self,
        model,
        reference: TokenLogprobs | None,
        grpo: GRPOConfig,
        config: TrainConfig,
        dist: distributed.Dist,
        padding: Rollout,
        pad_id: int,
        teacher=None,
        distillation: NoTeacher | None = None,
    ):
        self.model = model
        self.grpo = grpo
        self.config = config
        self.objective = objective_from(grpo)  # what each micro-batch's loss computes, chosen once
        self.entropy = EntropyCoefficient.from_config(grpo)  # the entropy bonus's coefficient, or None
        # what a teacher adds to the advantages and the loss (on-policy distillation), chosen once
        self.distillation = distillation or NoTeacher()
        self.dist = dist
        self.pad_id = pad_id
        self.padding = padding  # what a rank with no rollouts left forwards, to join the collectives
        # The log-probs as modules: one process, or DDP copies, or FSDP2 shards (config.fsdp).
        self.policy = distributed.ParallelModel(
            self.distillation.policy_module(model),
            dist,
            shard=config.fsdp,
            blocks=model.layers,
            padding=padding,
            warm_up=lambda module: self._forward(module, [padding]),
        )
        self.reference = None
        if reference is not None:
            self.reference = distributed.ParallelModel(
                reference,
                dist,
                shard=config.fsdp,
                blocks=reference.model.layers,
                trainable=False,
                padding=padding,
            )
        self.teacher = None  # the teacher's forward (on-policy distillation), a frozen local module
        if teacher is not None:
            self.teacher = distributed.ParallelModel(
                TeacherForward(teacher), dist, shard=False, trainable=False
            )
        # every weight, or a LoRA run's adapters alone (the base is frozen: no gradient, no AdamW state)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable,
            lr=config.learning_rate,
            betas=config.adam_betas,
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )

    def __call__(self, rollouts: list[Rollout], step: int, totals: dict[str, int]) -> dict[str, float]:
        """num_iterations AdamW steps at GRPO step `step` on this rank's rollouts (one process: the
        whole batch), each loss a share of the whole step's `totals` (`step_totals`); stats averaged
        over tokens and passes, and over ranks."""
        if not totals["sequences"]:
            return {"skipped": 1.0, "update/no_groups": 1.0}
        self.model.train()
        if self.grpo.num_iterations > 1:
            for r, logprobs in self._logprobs(rollouts, self.policy):
                r.old_logprobs = logprobs  # (Tc,) a field of stage 4's own
        if self.objective.beta > 0:  # the KL in the loss (REINFORCE++ has it in its rewards instead)
            for r, logprobs in self._logprobs(rollouts, self.reference):
                r.ref_logprobs = logprobs  # (Tc,) a field of stage 4's own
        passes = []
        for k in range(self.grpo.num_iterations):
            passes.append(self._one_pass(rollouts, totals, f"{self.config.seed}-{step}-pass{k}"))
            self._check_finite_weights(step)
        names = []  # every stat of any pass, in the order they first appear
        for p in passes:
            names += [name for name in p if name not in names]
        out = {}  # each stat's mean over the passes (0 in a pass that lacks it)
        for name in names:
            out[name] = sum(p.get(name, 0.0) for p in passes) / len(passes)
        out["skipped"] = max(p["skipped"] for p in passes)  # 1 if any pass was skipped, not a mean
        return self.distillation.update_stats(out)

    def reference_logprobs(self, rollouts: list[Rollout]) -> list[torch.Tensor]:
        """Each rollout's completion log-probs under the KL's reference, (Tc,) each: for an advantage
        estimator that folds the KL into its rewards (REINFORCE++), before stage 4. Every rank computes
        them for every rollout it is given (the reference's collectives see the same passes). A token
        budget takes the rollouts in micro-batches of similar length: each is found again by identity."""
        computed = {id(rollout): logprobs for rollout, logprobs in self._logprobs(rollouts, self.reference)}
        return [computed[id(rollout)] for rollout in rollouts]

    def teacher_outputs(self, rollouts: list[Rollout]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each rollout's completion under the teacher, in micro-batches as the update's and without
        gradients: its log-probs (Tc,), fp32 on the CPU, and its last hidden states (Tc, H_teacher) on
        the device. One teacher forward per step, before stage 3 (on-policy distillation). Under torchrun
        every rank holds the teacher and runs it on every rollout, as `reference_logprobs` does: stage 3
        needs the whole batch's log-probs, and splitting the forward over the ranks would mean gathering
        the full form's hidden states, (N, Tc, H_teacher) floats, over the network."""
        computed = {}
        with torch.no_grad():
            for part in self.teacher.parts(rollouts, self._micro_batches(rollouts)):
                _, logprobs, hidden = self._forward(self.teacher, part)
                for r, row_logprobs, row_hidden in zip(part, split_logprobs(part, logprobs), hidden):
                    computed[id(r)] = (row_logprobs, row_hidden[: len(r.completion_ids)])
        return [computed[id(rollout)] for rollout in rollouts]

    def entropy_state(self) -> dict | None:
        """The entropy bonus's adaptive state, for checkpoints (None without a bonus)."""
        return None if self.entropy is None else self.entropy.state()

    def load_entropy_state(self, state: dict | None) -> None:
        """A checkpoint's entropy state read back (a checkpoint of a run without one has none)."""
        if self.entropy is not None and state is not None:
            self.entropy.load_state(state)

    def _one_pass(self, rollouts: list[Rollout], totals: dict, seed: str) -> dict[str, float]:
        """One AdamW step over every micro-batch of this rank's rollouts, gradients accumulated; its stats.
        `seed` (from TrainConfig.seed, the step and the pass) shuffles the micro-batches, and draws
        Clip-Cov's choices."""
        generator = torch.Generator().manual_seed(random.Random(seed).getrandbits(62))
        choices = torch.Generator().manual_seed(random.Random(f"{seed}-covariance").getrandbits(62))
        entropy_coef = 0.0 if self.entropy is None else self.entropy.applied()
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        chunks = self._micro_batches(rollouts, generator)
        parts = self.policy.parts(rollouts, chunks)  # ranks: padded to as many, as each joins every backward
        micro_stats = []
        for n, part in enumerate(parts):
            with self.policy.accumulating(last=n == len(parts) - 1):
                micro_stats.append(self._micro_step(part, totals, entropy_coef, choices))
        out = self._combine(micro_stats)  # ranks: over all their micro-batches, so each skips alike
        grad_norm = self.policy.clip_gradients(self.config.max_grad_norm)  # ranks: the norm over every shard
        skipped = not (math.isfinite(out["loss"]) and math.isfinite(grad_norm))
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)  # weights and AdamW state stay as they were
        else:
            self.optimizer.step()
        if self.entropy is not None:
            out.update(self._entropy_step(out, entropy_coef, skipped))
        tokens_per_s = out.pop("tokens") / max(time.perf_counter() - started, 1e-9)
        out["grad_norm"] = grad_norm
        out["skipped"] = float(skipped)
        out["training/tokens_per_s"] = tokens_per_s
        out["update/padding_frac"] = padding_fraction(rollouts, chunks, self._group_size)
        return out

    def _entropy_step(self, out: dict[str, float], applied: float, skipped: bool) -> dict[str, float]:
        """The entropy bonus's coefficient after this pass's AdamW step (adapted to its mean entropy,
        over every rank), and the one its loss used: their stats."""
        if not skipped:
            self.entropy.after_step(out["entropy"])
        return {"entropy/coef": self.entropy.coef, "entropy/coef_applied": applied}

    def _check_finite_weights(self, step: int) -> None:
        """Raise NonFiniteWeights if any weight, on any rank, is NaN or inf (a rank holds its shards under
        FSDP2). Per pass: one fused sum of the parameters' norms and one host sync. A NaN or inf weight
        makes the sum so; so can finite weights past ~1e19, whose squares overflow, hence the exact
        check of each tensor, only then. (A fused max-abs norm would need no second look, but costs
        more on CPU than the sum of 2-norms.)"""
        with torch.no_grad():
            norms = torch._foreach_norm([_local(p) for p in self.trainable])
            # ranks: a NaN in one rank's shard stops every rank, together
            suspect = self.dist.max([float(not torch.isfinite(torch.stack(norms).sum()))])[0]
        if not suspect:
            return
        bad = [
            name
            for name, p in self.model.named_parameters()
            if p.requires_grad and not torch.isfinite(_local(p)).all()
        ]
        if self.dist.max([float(len(bad))])[0]:  # every rank takes this branch (`suspect` is over all ranks)
            raise NonFiniteWeights(
                f"step {step}: the AdamW step left NaN or inf in the weights "
                f"({_tensor_names(bad)}), so the run stops without saving them (lower the learning "
                "rate, or train in float32)"
            )

    def _combine(self, micro_stats: list[dict]) -> dict[str, float]:
        """One pass's stats from its micro-batches' on every rank: shares of the step's totals add up,
        maxima (names ending in _max) take the largest, token means are weighted by tokens."""
        weighted = {"loss": 0.0, "tokens": 0.0}  # shares, and token means times their tokens
        peaks = {}
        for stats in micro_stats:
            for key, value in stats.items():
                if key.endswith("_max"):
                    peaks[key] = max(peaks.get(key, value), value)
                elif key in SHARES:
                    weighted[key] = weighted.get(key, 0.0) + value
                else:
                    weighted[key] = weighted.get(key, 0.0) + value * stats["tokens"]
        # ranks: each pass, not once a step, as the skip and the entropy coefficient read the whole batch's
        weighted = _over_ranks(weighted, self.dist.sum)
        peaks = _over_ranks(peaks, self.dist.max)
        tokens = max(weighted["tokens"], 1.0)
        out = {}
        for key, value in weighted.items():
            out[key] = value if key in SHARES else value / tokens
        out.update(peaks)
        return out

    def _micro_step(
        self, rollouts: list[Rollout], totals: dict, entropy_coef: float, choices: torch.Generator
    ) -> dict[str, float]:
        batch, logprobs, entropies, *distilled = self._forward(
            self.policy, rollouts, self.distillation.update_inputs
        )
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()  # mu = 1: ratio 1
        loss, stats = objective_loss(
            self.objective,
            logprobs,
            old,
            batch.advantages,
            batch.completion_mask,
            ref_logprobs=batch.ref_logprobs,
            sampler_logprobs=batch.sampler_logprobs,
            entropies=entropies,
            entropy_coef=entropy_coef,
            num_sequences=totals["sequences"],
            num_tokens=totals["tokens"],
            generator=choices,
        )
        # a teacher's exact reverse KL joins the loss (distillation_form="full"; otherwise as it was)
        loss, stats = self.distillation.loss(loss, stats, distilled, batch.completion_mask, totals["tokens"])
        # the sampler and this pass computed these tokens' log-probs under the same weights: ~0 apart in fp32
        if batch.sampler_logprobs is not None:
            mismatch = sampler_mismatch(
                old, batch.sampler_logprobs, batch.completion_mask, totals["sequences"]
            )
            stats.update(mismatch)
        # Every rank runs every backward, even of a non-finite loss, so that the gradient collectives
        # match; a non-finite loss or gradient on any rank then skips the step on all of them.
        # DDP and FSDP2 average gradients over ranks, while the loss shares above already add up over
        # every rank's micro-batches: scaling by the world size turns that average back into the sum.
        (loss * self.dist.world_size).backward()
        return stats

    def _logprobs(self, rollouts: list[Rollout], policy) -> list[tuple[Rollout, torch.Tensor]]:
        """Each rollout's completion log-probs under `policy`, without gradients, beside it: (Tc,) each."""
        pairs = []
        with torch.no_grad():
            for part in policy.parts(rollouts, self._micro_batches(rollouts)):
                pairs += zip(part, split_logprobs(part, self._forward(policy, part)[1]))
        return pairs

    def _forward(self, policy, rollouts: list[Rollout], inputs=lambda batch: ()):
        """(batch, log-probs (B, Tc), entropies (B, Tc), and what else the module returns) of these
        rollouts' completions at the sampling temperature; `inputs(batch)`: the module's further inputs
        (a teacher's hidden states)."""
        batch = collate(rollouts, self.pad_id, self.model.device)
        # the padding rollout shares its prompt with no other row
        rows_per_prompt = 1 if rollouts[0] is self.padding else self._group_size
        with self._autocast():
            outputs = policy(
                batch.input_ids,
                batch.attention_mask,
                batch.completion_start,
                self.grpo.temperature,
                rows_per_prompt,
                *inputs(batch),
            )
        return batch, *outputs

    def _micro_batches(
        self, rollouts: list[Rollout], generator: torch.Generator | None = None
    ) -> list[list[int]]:
        """Micro-batches of this rank's rollouts: by rows, or by a token budget over rollouts of similar
        length."""
        lengths = [(len(r.prompt_ids), len(r.completion_ids)) for r in rollouts]
        rows = self.config.micro_batch_size
        budget = self.config.micro_batch_tokens
        if self._group_size > 1:  # whole groups, for the shared-prompt forward
            return group_batches(lengths, self._group_size, rows, budget, generator)
        if budget:
            return token_budget_batches(lengths, rows, budget, generator)
        return micro_batches(len(rollouts), rows, generator)

    @property
    def _group_size(self) -> int:
        """Rows that share one prompt in the update's forward passes: G with shared_prompt, else 1.
        FSDP2 shards each block, and a block runs twice in a shared-prompt forward (prompts, then
        completions), which FSDP2's backward does not follow: sharded runs take the plain path."""
        shared = self.config.shared_prompt and not self.policy.sharded
        return self.grpo.num_generations if shared else 1

    def _autocast(self):
        if self.model.device.type != "cuda":
            return contextlib.nullcontext()  # CPU: fp32, as bf16 matmuls there are slower, not faster
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.config.bf16)


def _over_ranks(values: dict[str, float], reduce) -> dict[str, float]:
    """Each value reduced over the ranks (`reduce`: Dist.sum or Dist.max), the names in one order on
    every rank."""
    names = sorted(values)
    reduced = reduce([values[name] for name in names])
    return dict(zip(names, reduced))


def _local(param: torch.Tensor) -> torch.Tensor:
    """A parameter's tensor on this rank: its shard under FSDP2 (a DTensor), else itself."""
    return param.to_local() if hasattr(param, "to_local") else param


def _tensor_names(names: list[str], n: int = 3) -> str:
    """Up to n names and how many more; under FSDP2 this rank's shards may hold none of them."""
    if not names:
        return "in another rank's shard"
    return ", ".join(names[:n]) + (f" and {len(names) - n} more tensors" if len(names) > n else "")
