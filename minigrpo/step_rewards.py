"""Stage 2 of the loop, process supervision: a reward for every step of a completion, on the token
where the step ends.

In: scored rollouts (stage 2 has decoded them and summed their outcome rewards), the text of each
one's problem, and for Monte-Carlo values the policy, the sampler's settings and the task's rewards.
Out: each rollout's `StepRewards` (its steps' rewards and ends; the trainer writes them into the
rollout), which stage 3 turns into per-token advantages
(advantages.process_advantages). Steps are the `expression = number` steps the verifier's checker
finds (verifier/steps.py) in what the policy wrote, and then its final answer: the last step of every
completion runs to its last token and is worth the completion's outcome reward (a completion with no
arithmetic step has that one step). A tool's output (the rollout's observation tokens) holds no step,
and its numbers make no step relevant: the policy earns nothing for what a tool printed.

Two sources of a step's reward:

    steps         the checker's verdict: +1 right and relevant, 0 right but using no number of the
                  problem or of an earlier step, -1 wrong (verifier/steps.py, STEP_REWARDS)
    monte_carlo   Math-Shepherd (Wang et al., 2024): from the prompt and the completion up to the
                  step's last token, the sampler draws N continuations; the step's value is their
                  mean outcome reward (for a 0/1 reward, the share that reach a right answer: the
                  paper's soft estimate). It needs no checker verdict, only the steps' ends, and
                  costs N continuations per step (process/continuations, per step of training).

The answer as a step: DeepSeekMath's reward model scores every step, the last one (which states the
answer) included. The checker judges arithmetic, not answers, so without the answer step nothing
would reward the tokens after the last arithmetic step, and the policy learns to stop after one right
step and write any answer (measured: held-out accuracy falls to 0 within 100 steps of the default
job). With it, "process" still trains the answer, and Monte-Carlo values stay consistent: the last
prefix is the whole completion, whose value is its own outcome.

Departure from Math-Shepherd: its values label data for training a reward model; here they are the
step rewards of the GRPO step itself, as DeepSeekMath's process supervision uses a reward model's.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field, replace

from .config import SamplingConfig
from .rollout import Rollout
from .sampler import generate
from .verifier import check_steps, compute_rewards

# tokens decoded before each one in token_ends: a character's bytes before its last token are at most 3
# (UTF-8 spells one in at most 4), so they lie in at most 3 tokens
CONTEXT_TOKENS = 3


@dataclass
class StepRewards:
    """One completion's steps, as stage 2 returns them for the rollout's step fields."""

    rewards: list[float] = field(default_factory=list)  # each step's reward, the answer step last
    ends: list[int] = field(default_factory=list)  # the index of each step's last completion token
    continuations: int = 0  # Monte-Carlo values: continuations sampled for its steps (their cost)


def checked_step_rewards(rollouts: list[Rollout], problems: list[str], tokenizer) -> list[StepRewards]:
    """Each rollout's steps in the text the policy wrote, checked against its problem's text: the
    checker's step rewards, on the token where each step ends, then the answer step (the outcome
    reward, on the last token)."""
    out = []
    for r, problem in zip(rollouts, problems, strict=True):
        ends = token_ends(tokenizer, list(r.completion_ids))  # (Tc,) characters spelled through each token
        steps = check_steps(r.text, problem, unwritten=_observation_spans(ends, r.generated))
        rewards = [step.reward for step in steps]
        # each step on its last character's token: the first whose decoded prefix reaches the step's end
        step_ends = [bisect.bisect_left(ends, step.end) for step in steps]
        rewards.append(r.reward)  # the answer step (a step cut at the budget may share its token)
        step_ends.append(len(r.completion_ids) - 1)
        out.append(StepRewards(rewards, step_ends))
    return out


def token_ends(tokenizer, ids: list[int]) -> list[int]:
    """len(tokenizer.decode(ids[: k + 1])) for each token k, in one pass: a token adds the characters it
    adds to the CONTEXT_TOKENS tokens before it (a character split across tokens shows on its first,
    as a replacement character, as in the decoded prefix). Where those do not add up to the whole text
    (a decoder that cleans up across tokens), every prefix is decoded, slowly but exactly."""
    ends = []  # (T,)
    spelled = 0
    for k in range(len(ids)):
        context = ids[max(0, k - CONTEXT_TOKENS) : k]
        spelled += len(tokenizer.decode(context + [ids[k]])) - len(tokenizer.decode(context))
        ends.append(spelled)
    if ends and ends[-1] != len(tokenizer.decode(ids)):
        return [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]
    return ends


def _observation_spans(ends: list[int], generated: list[bool] | None) -> list[tuple[int, int]]:
    """The character spans of the tokens a tool wrote (`generated` False), given each token's end."""
    if generated is None:
        return []
    starts = [0] + ends[:-1]
    return [(start, end) for start, end, own in zip(starts, ends, generated, strict=True) if not own]


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


def step_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """The logger's process-supervision stats over a step's rollouts: steps per completion, their mean
    reward, and the continuations Monte-Carlo values sampled."""
    steps = sum(len(r.step_rewards) for r in rollouts)
    return {
        "process/steps_per_completion": steps / max(len(rollouts), 1),
        "process/step_reward_mean": sum(sum(r.step_rewards) for r in rollouts) / max(steps, 1),
        "process/continuations": float(sum(r.step_continuations for r in rollouts)),
    }
