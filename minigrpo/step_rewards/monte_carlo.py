"""Stage 2 of the loop, process supervision: Monte-Carlo values (Math-Shepherd). A step's reward is
the mean outcome reward of continuations sampled from the end of that step.

In: the policy, scored rollouts with the steps `checked_step_rewards` found, the task's rows and
rewards, the sampler's settings. Out: each rollout's `StepRewards`, valued, with the continuations
they cost. It knows the sampler and the verifier's rewards, not how the trainer uses the values.
"""

from __future__ import annotations

import random
from dataclasses import replace

from ..config import SamplingConfig
from ..rollout import Rollout, generate
from ..verifier import compute_rewards
from .checked import StepRewards


def monte_carlo_step_rewards(
    model,
    tokenizer,
    rollouts: list[Rollout],
    checked: list[StepRewards],
    columns: dict[str, list],
    rewards: list,
    sampling: SamplingConfig,
    samples: int,
    seed: str,
) -> list[StepRewards]:
    """Each rollout's steps (`checked`, found by `checked_step_rewards`) valued instead by the mean
    outcome reward of `samples` continuations from the end of each step. `columns` hold each rollout's
    row (as compute_rewards reads them), `rewards` the task's RewardSpecs. Each counts the continuations
    its steps cost."""
    valued = [StepRewards(list(c.rewards), list(c.ends)) for c in checked]
    prefixes = []  # (rollout index, step index, completion tokens up to the step's end)
    for i, r in enumerate(rollouts):
        for j, end in enumerate(valued[i].ends):
            if end + 1 < len(r.completion_ids):
                prefixes.append((i, j, r.completion_ids[: end + 1]))
            else:  # the answer step ends the completion: its one continuation is the completion itself
                valued[i].rewards[j] = r.reward
    by_budget = {}  # new tokens each continuation may still write -> its prefixes
    for prefix in prefixes:
        budget = sampling.max_new_tokens - len(prefix[2])
        by_budget.setdefault(budget, []).append(prefix)
    for budget, group in sorted(by_budget.items()):
        prompts = [rollouts[i].prompt_ids + list(tokens) for i, _, tokens in group]
        config = replace(sampling, max_new_tokens=budget, num_samples=samples)
        drawn = generate(model, prompts, config, seed=random.Random(f"{seed}-{budget}").getrandbits(62))
        texts = [
            tokenizer.decode_completion(list(group[p][2]) + list(tokens))
            for tokens, p in zip(drawn.tokens, drawn.prompt_indices)
        ]
        rows = [group[p][0] for p in drawn.prompt_indices]  # the rollout each continuation extends
        extended = {name: [values[i] for i in rows] for name, values in columns.items()}
        if "completion_tokens" in extended:  # a length reward in tokens counts prefix and continuation
            extended["completion_tokens"] = [
                len(group[p][2]) + len(tokens) for tokens, p in zip(drawn.tokens, drawn.prompt_indices)
            ]
        scored = compute_rewards(texts, extended, rewards)
        totals = [0.0] * len(group)  # each prefix's summed continuation rewards
        for p, reward in zip(drawn.prompt_indices, scored.total):
            totals[p] += reward
        for (i, j, _), total in zip(group, totals):
            valued[i].rewards[j] = total / samples
            valued[i].continuations += samples
    return valued
