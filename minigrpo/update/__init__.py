"""Stages 3 and 4 of the loop, advantages and update: rewards in, the policy's new weights out.

- `group_advantages` (advantages.py): how much better each completion did than its group; per token
  with process rewards (`process_advantages`, `token_advantages`);
- `estimator_for` (estimators.py): the advantage estimators besides GRPO's (RLOO, REINFORCE++, pass@k,
  MaxRL), one chosen per run; `kl_shaped_returns`, REINFORCE++'s per-token returns with the KL;
- `token_logprobs` (logprobs.py): the per-token log-probs and entropies of completions, through the
  chunked LM head; `TokenLogprobs` as a module, `BaseLogprobs` of a LoRA policy's base;
- `objective_from`, `objective_loss` (loss.py): the objective, chosen once (`Objective`), and a
  micro-batch's loss under it, with its stats; its policy terms (policy_losses.py: GRPO's clip,
  dual-clip, CISPO, SAPO, GMPO, DPPO, REINFORCE, Clip-Cov, KL-Cov); `grpo_loss`, the same from
  keyword settings; `EntropyCoefficient` (entropy.py), the entropy bonus's fixed or adaptive weight;
- `Updater` (updater.py): old and reference log-probs, micro-batches, num_iterations AdamW steps on
  one rank's rollouts; `step_totals`, the whole step's counts that each loss is a share of;
- `distillation_for` (distillation.py): what a teacher adds (on-policy distillation), chosen once: the
  token form's advantages or the full form's exact reverse KL (`ChunkedReverseKL`), and their stats;
- `frozen_copy`, `SamplingCopy` (copies.py): the reference policy, frozen, and the sampler's copy in
  another precision.
It knows tensors, rollouts and the configs, not text or where the rewards came from. Nothing outside
this folder imports from inside it: only the names below.
"""

from .advantages import EPS, group_advantages, process_advantages, token_advantages, zero_variance_groups
from .copies import SamplingCopy, frozen_copy
from .distillation import (
    ChunkedReverseKL,
    DistilledLogprobs,
    TeacherForward,
    distillation_for,
    full_vocabulary_reverse_kl,
    teacher_stats,
    token_distillation_advantages,
)
from .entropy import EntropyCoefficient
from .estimators import estimator_for, formula, kl_shaped_returns
from .logprobs import (
    LOGPROB_CHUNK_ROWS,
    BaseLogprobs,
    TokenLogprobs,
    full_vocabulary_logprobs,
    token_logprobs,
)
from .loss import Objective, grpo_loss, k3, objective_from, objective_loss, sampler_mismatch
from .micro_batching import group_batches, micro_batches, padding_fraction, token_budget_batches
from .updater import NonFiniteWeights, Updater, step_totals

__all__ = [
    "BaseLogprobs",
    "ChunkedReverseKL",
    "DistilledLogprobs",
    "EPS",
    "EntropyCoefficient",
    "LOGPROB_CHUNK_ROWS",
    "NonFiniteWeights",
    "Objective",
    "SamplingCopy",
    "TeacherForward",
    "TokenLogprobs",
    "Updater",
    "distillation_for",
    "estimator_for",
    "formula",
    "frozen_copy",
    "full_vocabulary_logprobs",
    "full_vocabulary_reverse_kl",
    "group_advantages",
    "group_batches",
    "grpo_loss",
    "k3",
    "kl_shaped_returns",
    "micro_batches",
    "objective_from",
    "objective_loss",
    "padding_fraction",
    "process_advantages",
    "sampler_mismatch",
    "step_totals",
    "teacher_stats",
    "token_advantages",
    "token_budget_batches",
    "token_distillation_advantages",
    "token_logprobs",
    "zero_variance_groups",
]
