"""Stages 3 and 4 of the loop, advantages and update: rewards in, the policy's new weights out.

- `group_advantages` (advantages.py): how much better each completion did than its group; per token
  with process rewards (`process_advantages`, `token_advantages`);
- `token_logprobs` (logprobs.py): the per-token log-probs and entropies of completions, through the
  chunked LM head; `TokenLogprobs` as a module, `BaseLogprobs` of a LoRA policy's base;
- `grpo_loss` (loss.py): the GRPO / DAPO / Dr. GRPO / GSPO / CISPO objectives, with their stats;
- `Updater` (updater.py): old and reference log-probs, micro-batches, num_iterations AdamW steps;
- `frozen_copy`, `SamplingCopy` (copies.py): the reference policy, frozen, and the sampler's copy in
  another precision.
It knows tensors, rollouts and the configs, not text or where the rewards came from. Nothing outside
this folder imports from inside it: only the names below.
"""

from .advantages import EPS, group_advantages, process_advantages, token_advantages, zero_variance_groups
from .copies import SamplingCopy, frozen_copy
from .logprobs import BaseLogprobs, TokenLogprobs, full_vocabulary_logprobs, token_logprobs
from .loss import grpo_loss, k3, sampler_mismatch
from .updater import NonFiniteWeights, Updater

__all__ = [
    "BaseLogprobs",
    "EPS",
    "NonFiniteWeights",
    "SamplingCopy",
    "TokenLogprobs",
    "Updater",
    "frozen_copy",
    "full_vocabulary_logprobs",
    "group_advantages",
    "grpo_loss",
    "k3",
    "process_advantages",
    "sampler_mismatch",
    "token_advantages",
    "token_logprobs",
    "zero_variance_groups",
]
