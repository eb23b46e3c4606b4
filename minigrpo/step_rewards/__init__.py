"""Stage 2 of the loop, process supervision: a reward for every step of a completion, on the token
where the step ends.

In: scored rollouts (stage 2 has decoded them and summed their outcome rewards), the text of each
one's problem, and for Monte-Carlo values the policy, the sampler's settings and the task's rewards.
Out: each rollout's `StepRewards` (its steps' rewards and ends; the trainer writes them into the
rollout), which stage 3 turns into per-token advantages
(update/advantages.py, `process_advantages`). Steps are the `expression = number` steps the verifier's checker
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

The folder, in that order: checked.py (the checker's steps and their token ends, `StepRewards`,
`step_stats`), monte_carlo.py (the continuations). Nothing outside it imports from inside: only the
names below.
"""

from .checked import StepRewards, checked_step_rewards, policy_steps, step_stats, token_ends
from .monte_carlo import monte_carlo_step_rewards

__all__ = [
    "StepRewards",
    "checked_step_rewards",
    "monte_carlo_step_rewards",
    "policy_steps",
    "step_stats",
    "token_ends",
]
