"""Group-relative advantages on hand-computed rewards: group, batch and no scaling, flat groups, bad input."""

import math

import pytest
import torch

from minigrpo.update import EPS, group_advantages, zero_variance_groups

# Two prompts, G = 4 completions each, ordered group by group.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
# Each reward minus its own group's mean:
#   group 0: mean (1 + 0 + 0 + 1) / 4 = 0.5   ->  +0.5, -0.5, -0.5, +0.5
#   group 1: mean (1 + 1 + 1 + 0) / 4 = 0.75  ->  +0.25, +0.25, +0.25, -0.75
CENTRED = [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75]


def close(actual, expected):
    return torch.allclose(actual, torch.tensor(expected), rtol=0, atol=1e-6)


def test_group_scale_divides_by_each_groups_unbiased_std():
    # Unbiased std: sqrt(sum of squared deviations / (G - 1)).
    std0 = math.sqrt((0.5**2 + 0.5**2 + 0.5**2 + 0.5**2) / 3)  # sqrt(1 / 3) = 0.57735
    std1 = math.sqrt((0.25**2 + 0.25**2 + 0.25**2 + 0.75**2) / 3)  # sqrt(0.75 / 3) = 0.5
    expected = [c / (std0 + EPS) for c in CENTRED[:4]] + [c / (std1 + EPS) for c in CENTRED[4:]]
    # e.g. 0.5 / 0.57745 = 0.86588 and -0.75 / 0.5001 = -1.49970
    assert close(group_advantages(REWARDS, 4, "group"), expected)
    assert close(group_advantages(REWARDS, 4), expected)  # "group" is the default


def test_batch_scale_centres_by_group_but_divides_by_one_batch_std():
    # Batch mean 5 / 8 = 0.625: five 1s deviate by +0.375, three 0s by -0.625.
    batch_std = math.sqrt((5 * 0.375**2 + 3 * 0.625**2) / 7)  # sqrt(1.875 / 7) = 0.517549
    expected = [c / (batch_std + EPS) for c in CENTRED]
    assert close(group_advantages(REWARDS, 4, "batch"), expected)


def test_none_scale_only_centres_dr_grpo():
    assert close(group_advantages(REWARDS, 4, "none"), CENTRED)


def test_integer_rewards_are_taken_as_floats():
    out = group_advantages(torch.tensor([1, 0, 0, 1, 1, 1, 1, 0]), 4, "none")
    assert out.dtype == torch.float32 and close(out, CENTRED)


# Three groups of 3: flat, informative, flat. Three float32 0.9s have a mean 6e-8 off 0.9, so without
# the explicit zeroing the first group would get eps-sized noise: 6e-8 / (0 + EPS) = 6e-4.
FLAT_MIXED = torch.tensor([0.9, 0.9, 0.9, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0])


def test_zero_variance_groups_are_flagged():
    assert zero_variance_groups(FLAT_MIXED, 3).tolist() == [True, False, True]
    assert zero_variance_groups(REWARDS, 4).tolist() == [False, False]
    # only exactly equal is flat
    assert zero_variance_groups(torch.tensor([0.0, 1e-7]), 2).tolist() == [False]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_flat_groups_get_exactly_zero_under_every_scale(scale):
    out = group_advantages(FLAT_MIXED, 3, scale)
    assert torch.isfinite(out).all()
    assert out[:3].tolist() == [0.0, 0.0, 0.0] and out[6:].tolist() == [0.0, 0.0, 0.0]  # exact, not eps-sized
    # The middle group is untouched: mean 2 / 3, deviations +1/3, -2/3, +1/3.
    centred = [1 / 3, -2 / 3, 1 / 3]
    if scale == "group":
        std = math.sqrt(((1 / 3) ** 2 + (2 / 3) ** 2 + (1 / 3) ** 2) / 2)  # sqrt(1 / 3)
        centred = [c / (std + EPS) for c in centred]
    elif scale == "batch":
        values = [0.9, 0.9, 0.9, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0]
        mean = sum(values) / 9  # 10.7 / 9
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 8)
        centred = [c / (std + EPS) for c in centred]
    assert close(out[3:6], centred)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_an_all_flat_batch_is_all_zero_not_nan(scale):
    # With "batch" the batch std itself is 0 here: centred / (0 + EPS) must still come out 0.
    out = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2, scale)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "rewards, group_size, scale, message",
    [
        (torch.ones(4), 1, "group", "group_size must be at least 2"),
        (torch.ones(4), 0, "group", "group_size must be at least 2"),
        (torch.ones(5), 2, "group", "5 rewards do not split into groups of 2"),
        (torch.ones(2, 4), 4, "group", r"rewards must be a 1-D tensor .* got shape \(2, 4\)"),
        (torch.ones(4), 2, "std", "scale_rewards must be one of group, batch, none, got 'std'"),
        (torch.tensor([1.0, float("nan"), 0.0, 1.0]), 2, "group", "rewards must be finite"),
        (torch.tensor([1.0, float("inf"), 0.0, 1.0]), 2, "none", "rewards must be finite"),
    ],
)
def test_bad_input_is_refused_with_a_message(rewards, group_size, scale, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, group_size, scale)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_flat_group_that_floats_cannot_average_exactly_gets_exactly_zero(scale):
    """Three rewards of 0.9: their fp32 mean is not 0.9, so without the flat-group rule each advantage
    would be rounding noise (over the eps-sized std), not 0."""
    rewards = torch.tensor([0.9, 0.9, 0.9, 1.0, 0.0, 0.5])
    groups = rewards.float().view(-1, 3)
    assert not torch.equal(groups[0] - groups[0].mean(), torch.zeros(3))  # the premise
    assert torch.equal(group_advantages(rewards, 3, scale)[:3], torch.zeros(3))
