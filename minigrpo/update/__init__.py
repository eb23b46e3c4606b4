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
- `Updater` (updater.py): old and reference log-probs, micro-batches, num_iterations AdamW steps;
- `frozen_copy`, `SamplingCopy` (copies.py): the reference policy, frozen, and the sampler's copy in
  another precision.
It knows tensors, rollouts and the configs, not text or where the rewards came from. Nothing outside
this folder imports from inside it: only the names below.
"""

from .advantages import EPS, group_advantages, process_advantages, token_advantages, zero_variance_groups
from .copies import SamplingCopy, frozen_copy
from .entropy import EntropyCoefficient
from .estimators import estimator_for, formula, kl_shaped_returns
from .logprobs import BaseLogprobs, TokenLogprobs, full_vocabulary_logprobs, token_logprobs
from .loss import Objective, grpo_loss, k3, objective_from, objective_loss, sampler_mismatch
from .updater import NonFiniteWeights, Updater

__all__ = [
    "BaseLogprobs",
    "EPS",
    "EntropyCoefficient",
    "Objective",
    "NonFiniteWeights",
    "SamplingCopy",
    "TokenLogprobs",
    "Updater",
    "estimator_for",
    "formula",
    "frozen_copy",
    "full_vocabulary_logprobs",
    "group_advantages",
    "grpo_loss",
    "k3",
    "kl_shaped_returns",
    "objective_from",
    "objective_loss",
    "process_advantages",
    "sampler_mismatch",
    "token_advantages",
    "token_logprobs",
    "zero_variance_groups",
]
