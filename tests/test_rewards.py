"""The format reward and the reward registry: components kept apart, weights summed by hand."""

import pytest

from minigrpo.verifier import (
    REWARD_FUNCTIONS,
    FormatConfig,
    RewardSpec,
    compute_rewards,
    format_reward,
    register_reward,
)

GOOD = "<think>\n6 times 7 is 42.\n</think>\n\nThe answer is $\\boxed{42}$."


@pytest.mark.parametrize(
    "response, expected",
    [
        (GOOD, 1.0),
        ("  " + GOOD, 1.0),
        ("<think>ok</think>\\boxed{\\frac{1}{2}}", 1.0),
        ("The answer is $\\boxed{42}$.", 0.0),  # no thinking
        ("<think>\n</think>\\boxed{42}", 0.0),  # empty thinking
        ("<think>a</think><think>b</think>\\boxed{42}", 0.0),  # two blocks
        ("<think>a \\boxed{42}", 0.0),  # never closed
        ("Sure. <think>a</think>\\boxed{42}", 0.0),  # thinking not first
        ("<think>a</think>The answer is 42.", 0.0),  # no box
        ("<think>a</think>\\boxed{41} or \\boxed{42}", 0.0),  # two boxes
        ("<think>a</think>\\boxed{}", 0.0),  # empty box
        ("<think>a</think>\\boxed{42", 0.0),  # unterminated box
        ("<think>a \\boxed{41}</think>\\boxed{42}", 1.0),  # boxes while thinking are fine
        (None, 0.0),
    ],
)
def test_format_reward(response, expected):
    assert format_reward(response) == expected


def test_format_length_limits_and_prompt_opened_thinking():
    assert format_reward(GOOD, FormatConfig(max_chars=len(GOOD))) == 1.0
    assert format_reward(GOOD, FormatConfig(max_chars=len(GOOD) - 1)) == 0.0
    long_final = "<think>a</think>" + "words " * 300 + "\\boxed{1}"
    assert format_reward(long_final) == 0.0  # default: final part at most 1,000 characters
    assert format_reward(long_final, FormatConfig(max_answer_chars=0)) == 1.0
    opened = FormatConfig(thinking_opened_by_prompt=True)
    assert format_reward("6 times 7.\n</think>\n\\boxed{42}", opened) == 1.0
    assert format_reward(GOOD, opened) == 0.0  # a second <think> when the prompt opened one
    no_thinking = FormatConfig(require_thinking=False)
    assert format_reward("So \\boxed{42}.", no_thinking) == 1.0
    assert format_reward(GOOD, no_thinking) == 0.0
    with pytest.raises(ValueError, match="length limits"):
        FormatConfig(max_chars=-1)


def test_weighted_total_and_separate_components():
    completions = [GOOD, "The answer is \\boxed{42}.", "<think>x</think>\\boxed{41}", "no idea"]
    columns = {"answer": ["42", "42", "42", "42"]}
    rewards = compute_rewards(completions, columns, [RewardSpec("accuracy", 1.0), RewardSpec("format", 0.5)])
    assert rewards.components == {"accuracy": [1.0, 1.0, 0.0, 0.0], "format": [1.0, 0.0, 1.0, 0.0]}
    assert rewards.total == [1.5, 1.0, 0.5, 0.0]
    assert rewards.stats() == pytest.approx(
        {
            "reward/mean": 0.75,
            "reward/std": (5 / 12) ** 0.5,
            "reward/timeout_frac": 0.0,
            "reward/accuracy/mean": 0.5,
            "reward/accuracy/std": 1 / 3**0.5,
            "reward/format/mean": 0.5,
            "reward/format/std": 1 / 3**0.5,
        }
    )


def test_timeouts_are_counted_in_the_stats():
    """A hostile answer that runs until it is stopped scores 0 and counts in reward/timeout_frac; the trainer
    logs stats() unchanged. The time-out of any reward marks the completion once."""
    hostile = r"<think>x</think>\boxed{\sum_{k=1}^{10^{9}} \sin(k)}"
    completions = [GOOD, hostile, "<think>x</think>\boxed{41}", GOOD]
    specs = [RewardSpec("accuracy", 1.0), RewardSpec("format", 0.5)]
    rewards = compute_rewards(completions, {"answer": ["42"] * 4}, specs)
    assert rewards.components["accuracy"] == [1.0, 0.0, 0.0, 1.0]
    assert rewards.timed_out == [False, True, False, False]
    assert rewards.stats()["reward/timeout_frac"] == 0.25


def test_the_trainers_reward_stats_carry_the_timeout_frac():
    """The trainer logs its rollouts' reward stats: a rollout whose reward timed out counts there too."""
    from minigrpo.rollout import Rollout
    from minigrpo.run import reward_stats

    def rollout(reward: float, timed_out: bool) -> Rollout:
        return Rollout([1], [2], "stop", rewards={"accuracy": reward}, reward=reward, timed_out=timed_out)

    stats = reward_stats([rollout(1.0, False), rollout(0.0, True), rollout(0.0, False), rollout(1.0, False)])
    assert stats["reward/timeout_frac"] == 0.25 and stats["reward/accuracy/mean"] == 0.5


def test_the_trainers_reward_stats_carry_the_lengths_of_right_and_of_wrong_completions():
    """Right is the first reward above 0.5 (the held-out evaluation's rule), whatever the other rewards add;
    a side with no completion is left out."""
    from minigrpo.rollout import Rollout
    from minigrpo.run import reward_stats

    def rollout(length: int, accuracy: float, format_reward: float) -> Rollout:
        rewards = {"accuracy": accuracy, "format": format_reward}
        return Rollout([1], [2] * length, "stop", rewards=rewards, reward=accuracy + format_reward)

    stats = reward_stats(
        [rollout(3, 1.0, 0.0), rollout(5, 1.0, 1.0), rollout(10, 0.0, 1.0), rollout(7, 0.5, 1.0)]
    )
    assert stats["completion/length_right_mean"] == 4.0
    assert stats["completion/length_wrong_mean"] == 8.5
    assert stats["completion/length_mean"] == 6.25  # both sides, as before
    all_wrong = reward_stats([rollout(4, 0.0, 1.0), rollout(6, 0.0, 0.0)])
    assert (
        "completion/length_right_mean" not in all_wrong and all_wrong["completion/length_wrong_mean"] == 5.0
    )


def test_code_reward_through_the_registry():
    completion = "```python\ndef add(a, b):\n    return a + b\n```"
    tests = [["assert add(1, 2) == 3", "assert add(2, 2) == 5"]]
    rewards = compute_rewards([completion], {"tests": tests}, [RewardSpec("code", 2.0)])
    assert rewards.components["code"] == [0.5]
    assert rewards.total == [1.0]


def test_a_registered_reward_and_its_options():
    @register_reward("test_length_penalty")
    def length_penalty(completions, limit, **_):
        return [-1.0 if len(c) > limit else 0.0 for c in completions]

    try:
        spec = RewardSpec("test_length_penalty", 0.1, options={"limit": 5})
        rewards = compute_rewards(["short", "much longer"], {}, [spec])
        assert rewards.components["test_length_penalty"] == [0.0, -1.0]
        assert rewards.total == pytest.approx([0.0, -0.1])
        with pytest.raises(ValueError, match="already registered"):
            register_reward("test_length_penalty")(length_penalty)
    finally:
        del REWARD_FUNCTIONS["test_length_penalty"]


def test_registry_errors_name_the_problem():
    with pytest.raises(
        ValueError, match="unknown reward 'acuracy'; known: accuracy, code, countdown, format"
    ):
        RewardSpec("acuracy")
    with pytest.raises(ValueError, match="not a finite number"):
        RewardSpec("format", float("nan"))
    with pytest.raises(ValueError, match="needs the column\\(s\\) answer; the task has tests"):
        compute_rewards(["x"], {"tests": [[]]}, [RewardSpec("accuracy")])
    with pytest.raises(ValueError, match="column 'answer' has 1 rows for 2 completions"):
        compute_rewards(["x", "y"], {"answer": ["1"]}, [RewardSpec("accuracy")])

    @register_reward("test_broken")
    def broken(completions, **_):
        return [1.0]

    try:
        with pytest.raises(ValueError, match="'test_broken' must return one finite float per completion"):
            compute_rewards(["a", "b"], {}, [RewardSpec("test_broken")])
    finally:
        del REWARD_FUNCTIONS["test_broken"]
