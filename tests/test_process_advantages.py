"""Process-supervised advantages (DeepSeekMath 4.1.3): a hand-computed two-group example, the fast
path against a slow reference written from the paper's formula, and the loss with one advantage per
token: equal to one per completion when every token carries it, and exact under micro-batches."""

import math
import random

import pytest
import torch

from minigrpo.update import EPS, grpo_loss, process_advantages


def test_two_groups_by_hand():
    # Group 0 (G = 2): completion 0 has 6 tokens and steps ending on tokens 1 and 4 with rewards +1, -1;
    # completion 1 has 4 tokens and one step, ending on its last token (3), with reward +1.
    # Pooled step rewards 1, -1, 1: mean 1/3, unbiased std sqrt(((2/3)^2 + (4/3)^2 + (2/3)^2) / 2)
    # = sqrt(4/3) = 1.1547005.
    std0 = math.sqrt(4 / 3)
    up = (2 / 3) / (std0 + EPS)  # +0.5773003
    down = (-4 / 3) / (std0 + EPS)  # -1.1546005
    # Group 1: completion 2 (3 tokens) has no step; completion 3 (5 tokens) has steps ending on tokens
    # 2 and 4 with rewards 0 and 1. Pooled 0, 1: mean 0.5, std sqrt(0.5) = 0.7071068.
    half = 0.5 / (math.sqrt(0.5) + EPS)  # 0.7070068
    advantages = process_advantages(
        step_rewards=[[1.0, -1.0], [1.0], [], [0.0, 1.0]],
        step_ends=[[1, 4], [3], [], [2, 4]],
        num_tokens=[6, 4, 3, 5],
        group_size=2,
    )
    expected = [
        # a token's advantage: the normalised rewards of the steps that end at or after it
        [up + down, up + down, down, down, down, 0.0],  # token 5 is after the last step
        [up, up, up, up],
        [0.0, 0.0, 0.0],  # no step: nothing to credit
        [-half + half, -half + half, -half + half, half, half],
    ]
    assert [a.dtype for a in advantages] == [torch.float64] * 4
    for got, want in zip(advantages, expected):
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)
    assert up == pytest.approx(0.5773003, abs=1e-7) and down == pytest.approx(-1.1546005, abs=1e-7)


def test_flat_groups_and_groups_of_fewer_than_two_step_rewards_get_zero():
    advantages = process_advantages(
        step_rewards=[[1.0, 1.0], [1.0], [0.5], [], [], []],
        step_ends=[[0, 2], [1], [3], [], [], []],
        num_tokens=[3, 2, 4, 2, 1, 1],
        group_size=2,
    )
    # group 0: all equal; group 1: one step reward in all; group 2: none
    for a, n in zip(advantages, [3, 2, 4, 2, 1, 1]):
        assert torch.equal(a, torch.zeros(n, dtype=torch.float64))


def test_a_group_of_equal_step_rewards_that_floats_cannot_average_exactly_gets_exactly_zero():
    # the mean of these 0.1s is not 0.1 in float64: without the check for a flat group, each token would
    # get its rounding error over the (as tiny) std plus EPS, about 1e-13
    step_rewards = [[0.1, 0.1], [0.1]]
    pooled = torch.tensor([r for rewards in step_rewards for r in rewards], dtype=torch.float64)
    assert pooled.mean() != 0.1
    advantages = process_advantages(step_rewards, [[0, 2], [1]], [3, 2], 2)
    for a, n in zip(advantages, [3, 2]):
        assert torch.equal(a, torch.zeros(n, dtype=torch.float64))


def reference(step_rewards, step_ends, num_tokens, group_size):
    """DeepSeekMath 4.1.3 in plain Python: normalise every step reward of a group by the group's mean
    and (unbiased) std, then A_t = sum of the normalised r_j over the steps j with index(j) >= t."""
    out = []
    for first in range(0, len(num_tokens), group_size):
        members = list(range(first, first + group_size))
        pooled = [r for i in members for r in step_rewards[i]]
        if len(pooled) < 2 or all(r == pooled[0] for r in pooled):
            normalised = {i: [0.0] * len(step_rewards[i]) for i in members}
        else:
            mean = sum(pooled) / len(pooled)
            std = math.sqrt(sum((r - mean) ** 2 for r in pooled) / (len(pooled) - 1))
            normalised = {i: [(r - mean) / (std + EPS) for r in step_rewards[i]] for i in members}
        for i in members:
            tokens = []
            for t in range(num_tokens[i]):
                tokens.append(sum(r for r, end in zip(normalised[i], step_ends[i]) if end >= t))
            out.append(tokens)
    return out


def ragged_groups(rng: random.Random, groups: int, group_size: int):
    step_rewards, step_ends, num_tokens = [], [], []
    for _ in range(groups * group_size):
        length = rng.randint(1, 30)
        steps = rng.choice([0, 1, 2, 5])
        ends = sorted(rng.randrange(length) for _ in range(steps))
        if steps and rng.random() < 0.5:
            ends[-1] = length - 1  # a step that ends on the last token
        step_rewards.append([rng.choice([-1.0, 0.0, 1.0, 0.25]) for _ in ends])
        step_ends.append(ends)
        num_tokens.append(length)
    return step_rewards, step_ends, num_tokens


@pytest.mark.parametrize("seed", range(5))
def test_the_fast_path_equals_the_papers_formula(seed):
    rng = random.Random(seed)
    group_size = rng.choice([2, 3, 4, 8])
    step_rewards, step_ends, num_tokens = ragged_groups(rng, 6, group_size)
    fast = process_advantages(step_rewards, step_ends, num_tokens, group_size)
    slow = reference(step_rewards, step_ends, num_tokens, group_size)
    assert len(fast) == len(slow) == len(num_tokens)
    for got, want, n in zip(fast, slow, num_tokens):
        assert got.shape == (n,)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "step_rewards, step_ends, num_tokens, group_size, message",
    [
        ([[1.0], [0.0]], [[0], [0]], [1, 1], 1, "group_size must be at least 2"),
        ([[1.0], [0.0]], [[0]], [1, 1], 2, "one entry per completion"),
        ([[1.0], [0.0], []], [[0], [0], []], [1, 1, 1], 2, "do not split into groups of 2"),
        ([[1.0, 2.0], [0.0]], [[0], [0]], [2, 1], 2, "completion 0 has 2 step rewards and 1 step ends"),
        ([[1.0], [0.0]], [[3], [0]], [3, 1], 2, "a step ends outside its 3 tokens"),
        ([[float("nan")], [0.0]], [[0], [0]], [1, 1], 2, "finite"),
    ],
)
def test_bad_input_is_refused_with_a_message(step_rewards, step_ends, num_tokens, group_size, message):
    with pytest.raises(ValueError, match=message):
        process_advantages(step_rewards, step_ends, num_tokens, group_size)


# -- the loss with one advantage per token ------------------------------------------------------------


def loss_inputs(seed: int = 0, B: int = 6, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    for row, length in enumerate([7, 3, 5, 1, 6, 4][:B]):
        mask[row, length:] = 0
    return logprobs, old, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
def test_a_per_token_advantage_equal_on_every_token_is_the_per_completion_one(loss_type):
    logprobs, old, mask = loss_inputs()
    per_completion = torch.tensor([1.0, -0.5, 0.25, 2.0, -1.0, 0.0], dtype=torch.float64)
    per_token = per_completion.unsqueeze(1).expand_as(mask).clone()
    per_token[mask == 0] = 123.0  # padding: whatever stands there is never read
    one, stats_one = grpo_loss(logprobs, old, per_completion, mask, loss_type=loss_type)
    (grad_one,) = torch.autograd.grad(one, logprobs)
    two, stats_two = grpo_loss(logprobs, old, per_token, mask, loss_type=loss_type)
    (grad_two,) = torch.autograd.grad(two, logprobs)
    torch.testing.assert_close(two, one, rtol=0, atol=1e-15)
    torch.testing.assert_close(grad_two, grad_one, rtol=0, atol=1e-15)
    assert stats_one == stats_two


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo"])
def test_per_token_advantages_stay_exact_under_gradient_accumulation(loss_type):
    logprobs, old, mask = loss_inputs(seed=1)
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    whole, _ = grpo_loss(logprobs, old, advantages, mask, loss_type=loss_type, max_completion_length=7)
    (grad_whole,) = torch.autograd.grad(whole, logprobs)
    totals = {"num_sequences": mask.shape[0], "num_tokens": int(mask.sum())}
    parts = 0.0
    for rows in ([0, 3], [1, 2, 5], [4]):
        part, _ = grpo_loss(
            logprobs[rows],
            old[rows],
            advantages[rows],
            mask[rows],
            loss_type=loss_type,
            max_completion_length=7,
            **totals,
        )
        parts = parts + part
    (grad_parts,) = torch.autograd.grad(parts, logprobs)
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(grad_parts, grad_whole, rtol=0, atol=1e-14)


def test_advantages_of_another_shape_are_refused():
    logprobs, old, mask = loss_inputs()
    with pytest.raises(ValueError, match=r"advantages must have shape \(6,\), one per sequence, or \(6, 7\)"):
        grpo_loss(logprobs, old, torch.zeros(6, 3), mask)
