"""Stage 2 of the loop, process supervision: the checker's step rewards. Each step the policy wrote,
checked exactly, rewarded on the token where it ends, then the answer step.

In: scored rollouts and the text of each one's problem. Out: each rollout's `StepRewards`; `step_stats`
summarises a step's rollouts for the logger. A tool's output holds no step (`_observation_spans`).
It knows token ids, text and the checker's verdicts, not the model.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..rollout import Rollout
from ..verifier import Step, check_steps

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
        steps = _written_steps(r.text, problem, ends, r.generated)
        rewards = [step.reward for step in steps]
        # each step on its last character's token: the first whose decoded prefix reaches the step's end
        step_ends = [bisect.bisect_left(ends, step.end) for step in steps]
        rewards.append(r.reward)  # the answer step (a step cut at the budget may share its token)
        step_ends.append(len(r.completion_ids) - 1)
        out.append(StepRewards(rewards, step_ends))
    return out


def policy_steps(
    tokenizer, ids: list[int], generated: list[bool] | None, text: str, problem: str
) -> list[Step]:
    """The arithmetic steps the policy wrote in a completion (`text`, decoded from `ids`): none inside a
    tool's output (the tokens `generated` marks False), as training credits them; the trace and
    held-out evaluation read steps through this too."""
    if generated is None or all(generated):
        return check_steps(text, problem)
    return _written_steps(text, problem, token_ends(tokenizer, list(ids)), generated)


def _written_steps(text: str, problem: str, ends: list[int], generated: list[bool] | None) -> list[Step]:
    return check_steps(text, problem, unwritten=_observation_spans(ends, generated))


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


def step_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """The logger's process-supervision stats over a step's rollouts: steps per completion, their mean
    reward, and the continuations Monte-Carlo values sampled."""
    steps = sum(len(r.step_rewards) for r in rollouts)
    return {
        "process/steps_per_completion": steps / max(len(rollouts), 1),
        "process/step_reward_mean": sum(sum(r.step_rewards) for r in rollouts) / max(steps, 1),
        "process/continuations": float(sum(r.step_continuations for r in rollouts)),
    }
