"""Step rewards for process supervision: the checker's verdicts land on the tokens where their steps
end (token_ends, one pass over the tokens, against every prefix decoded), only the policy's own tokens
hold steps (never a tool's output), and Math-Shepherd's Monte-Carlo values are the mean outcome reward
of N continuations from each step's end, with the budget each has left."""

import random

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

import minigrpo.step_rewards.monte_carlo as monte_carlo
from minigrpo.config import SamplingConfig
from minigrpo.rollout import Rollout, Samples
from minigrpo.run import evaluate, summarize
from minigrpo.step_rewards import (
    StepRewards,
    checked_step_rewards,
    monte_carlo_step_rewards,
    step_stats,
    token_ends,
)
from minigrpo.tasks import Problem, template
from minigrpo.update import process_advantages
from minigrpo.verifier import RewardSpec, check_steps
from minigrpo.verifier.step_expression import MAX_DEPTH, MAX_DIGITS


def written(rollouts: list[Rollout], steps: list[StepRewards]) -> list[Rollout]:
    """Stage 2's step values written into each rollout, as the trainer writes them."""
    for r, step in zip(rollouts, steps, strict=True):
        r.step_rewards = step.rewards
        r.step_ends = step.ends
        r.step_continuations = step.continuations
    return rollouts


def checked_of(rollouts: list[Rollout]) -> list[StepRewards]:
    """The checker's steps already written into each rollout, as monte_carlo_step_rewards takes them."""
    return [StepRewards(r.step_rewards, r.step_ends) for r in rollouts]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(str(tmp_path_factory.mktemp("tokenizer")))


def rollout(tokenizer, prompt: str, completion: str, reward: float = 0.0) -> Rollout:
    ids = tokenizer.encode(completion) + [tokenizer.eos_token_ids[0]]
    r = Rollout(prompt_ids=tokenizer.encode(prompt), completion_ids=ids, finish_reason="stop", reward=reward)
    r.text = tokenizer.decode_completion(ids)
    return r


def slow_token_ends(tokenizer, ids: list[int]) -> list[int]:
    """The reference for token_ends: every prefix decoded whole (quadratic in the completion's length)."""
    return [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]


class Counted:
    """A tokenizer that counts its decode calls and the tokens they decode."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0
        self.tokens = 0

    def decode(self, ids):
        self.calls += 1
        self.tokens += len(ids)
        return self.tokenizer.decode(ids)


def test_token_ends_equal_the_lengths_of_the_decoded_prefixes(tokenizer):
    """Texts with characters of 2 to 4 bytes that the tiny vocabulary splits across tokens, and token ids
    drawn at random (bytes that never make a character, special tokens): equal, and in one pass (two
    small decodes a token and the whole once, never every prefix)."""
    rng = random.Random(0)
    for _ in range(60):
        text = "".join(
            rng.choice("0123456789+*=; What is\\boxed{}é€😀中×÷−\n") for _ in range(rng.randint(1, 40))
        )
        drawn = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 40))]
        for ids in (tokenizer.encode(text) + [tokenizer.eos_token_ids[0]], drawn):
            counted = Counted(tokenizer)
            assert token_ends(counted, ids) == slow_token_ends(tokenizer, ids), ids
            assert counted.calls == 2 * len(ids) + 1, ids
    assert token_ends(tokenizer, []) == []


class SquareDecoder:
    """A decoder whose text is not its tokens' texts side by side: n tokens decode to n * n characters."""

    def decode(self, ids):
        return "x" * len(ids) ** 2


def test_token_ends_decode_every_prefix_when_the_windows_do_not_add_up():
    assert token_ends(SquareDecoder(), list(range(7))) == [1, 4, 9, 16, 25, 36, 49]


def test_step_ends_are_found_in_one_pass_over_the_tokens(tokenizer):
    """200 steps of a long completion: the tokens decoded stay a few times the completion's length (a
    search of decoded prefixes per step decodes hundreds of times as many), and the ends are the first
    token whose decoded prefix reaches each step's end."""
    r = rollout(tokenizer, "What is 1+1?", "So 1+1=2; " * 200 + "####2")
    counted = Counted(tokenizer)
    written([r], checked_step_rewards([r], ["What is 1+1?"], counted))
    assert counted.tokens <= 10 * len(r.completion_ids)
    prefixes = slow_token_ends(tokenizer, r.completion_ids)
    ends = [step.end for step in check_steps(r.text, "What is 1+1?")]
    assert len(ends) == 200
    assert r.step_ends[:-1] == [next(k for k, n in enumerate(prefixes) if n >= end) for end in ends]


def tool_rollout(tokenizer, pieces: list[tuple[str, bool]], reward: float) -> Rollout:
    """A scripted completion: each piece's tokens, the policy's (True) or a tool's (False), then EOS."""
    ids = []
    generated = []
    for text, by_policy in pieces:
        tokens = tokenizer.encode(text)
        ids += tokens
        generated += [by_policy] * len(tokens)
    ids.append(tokenizer.eos_token_ids[0])
    generated.append(True)
    r = Rollout(tokenizer.encode("What is 2+3?"), ids, "stop", generated=generated, reward=reward)
    r.text = tokenizer.decode_completion(ids)
    return r


def test_steps_a_tool_printed_earn_nothing(tokenizer):
    """A python call that printed 40 right steps: the completion's step rewards, and so its first token's
    advantage, are those of the same tokens of the policy with a silent tool."""
    problem = "What is 2+3?"
    loud = tool_rollout(tokenizer, [("2+3=5; <run>", True), ("2+3=5;" * 40, False), ("####5", True)], 1.0)
    silent = tool_rollout(tokenizer, [("2+3=5; <run>", True), ("####5", True)], 1.0)
    wrong = tool_rollout(tokenizer, [("2+3=6; ####6", True)], 0.0)
    written([loud, silent, wrong], checked_step_rewards([loud, silent, wrong], [problem] * 3, tokenizer))
    assert loud.step_rewards == silent.step_rewards == [1.0, 1.0]
    assert loud.step_ends[0] == silent.step_ends[0]  # both on the 5 of 2+3=5
    first = []
    for r in (loud, silent):
        group = [r, wrong]
        advantages = process_advantages(
            [g.step_rewards for g in group],
            [g.step_ends for g in group],
            [len(g.completion_ids) for g in group],
            2,
        )
        first.append(float(advantages[0][0]))
    assert first[0] == first[1] > 0


def test_no_step_runs_into_a_tools_output_and_its_numbers_are_not_known(tokenizer):
    """7*6= written by the policy and 42 by the tool is no step; results the tool printed do not make the
    policy's steps relevant (printing them would buy every step's reward); the policy's own steps around
    an observation are read as if the observation were a line break."""
    pieces = [("7*6=", True), ("42; 1+6=7; 2+6=8\n", False), ("So 7+8=15", True), ("0", False)]
    r = tool_rollout(tokenizer, pieces + [(" and 2+3=5", True)], 0.0)
    written([r], checked_step_rewards([r], ["What is 2+3?"], tokenizer))
    assert r.step_rewards == [0.0, 1.0, 0.0]  # 7+8=15 (not 7+8=150) irrelevant; 2+3=5 right; the answer
    assert tokenizer.decode(r.completion_ids[: r.step_ends[1] + 1]).endswith("2+3=5")


def test_the_checker_counts_digits_not_the_decimal_point():
    (step,) = check_steps("1." + "0" * (MAX_DIGITS - 1) + "*2=2", "")  # MAX_DIGITS digits and a point
    assert step.correct


def test_the_checker_counts_depth_not_brackets():
    groups = MAX_DEPTH + 1  # each group is one deep: never deeper than MAX_DEPTH, however many
    (step,) = check_steps("+".join(["(1)"] * groups) + f"={groups}", "")
    assert step.correct


def test_checked_step_rewards_sit_on_the_last_token_of_each_step(tokenizer):
    r = rollout(tokenizer, "What is 12+30*2?", "30*2=60;12+60=73;####73")
    written([r], checked_step_rewards([r], ["What is 12+30*2?"], tokenizer))
    # 30*2=60 right and relevant; 12+60=73 wrong; then the answer step, worth the outcome reward (0)
    assert r.step_rewards == [1.0, -1.0, 0.0]
    for end, step in zip(r.step_ends, ["30*2=60", "30*2=60;12+60=73"]):
        assert tokenizer.decode(r.completion_ids[: end + 1]) == step  # up to the step's last character
    assert r.step_ends[-1] == len(r.completion_ids) - 1  # the answer step ends on the last token (EOS)


def test_a_completion_without_arithmetic_has_the_answer_step_alone(tokenizer):
    r = rollout(tokenizer, "What is 12+30?", "####42", reward=1.0)
    written([r], checked_step_rewards([r], ["What is 12+30?"], tokenizer))
    assert (r.step_rewards, r.step_ends) == ([1.0], [len(r.completion_ids) - 1])


def test_monte_carlo_values_are_the_mean_outcome_of_continuations_from_each_step(tokenizer, monkeypatch):
    """The sampler stands in here: each continuation is "####d" with d the prefix's number of tokens
    mod 2 for its first sample and 1 for the others, so every step's value is known by hand."""
    calls = []

    def fake_generate(model, prompts, config, seed):
        calls.append((prompts, config.max_new_tokens, config.num_samples))
        tokens, indices = [], []
        for p, prompt in enumerate(prompts):
            for s in range(config.num_samples):
                digit = (len(prompt) % 2) if s == 0 else 1
                tokens.append(tokenizer.encode(f"####{digit}"))
                indices.append(p)
        return Samples(tokens=tokens, logprobs=[], finish_reasons=[], prompt_indices=indices)

    monkeypatch.setattr(monte_carlo, "generate", fake_generate)
    prompt = "What is 12+30*2?"
    first = rollout(tokenizer, prompt, "30*2=60;12+60=72;####72", reward=1.0)
    second = rollout(tokenizer, prompt, "12+30=42", reward=0.0)  # its one step ends before EOS
    rollouts = [first, second]
    written(rollouts, checked_step_rewards(rollouts, [prompt, prompt], tokenizer))
    columns = {"answer": ["1", "1"]}  # a continuation "####1" is right, "####0" wrong
    sampling = SamplingConfig(max_new_tokens=40, eos_token_ids=tuple(tokenizer.eos_token_ids))
    written(
        rollouts,
        monte_carlo_step_rewards(
            None,
            tokenizer,
            rollouts,
            checked_of(rollouts),
            columns,
            [RewardSpec("accuracy")],
            sampling,
            4,
            "s",
        ),
    )

    ends = first.step_ends + second.step_ends
    prompts_seen = [p for prompts, _, _ in calls for p in prompts]
    expected_prompts = [first.prompt_ids + first.completion_ids[: e + 1] for e in first.step_ends[:-1]]
    expected_prompts.append(second.prompt_ids + second.completion_ids[: second.step_ends[0] + 1])
    assert sorted(prompts_seen) == sorted(expected_prompts)
    for prompts, budget, samples in calls:  # each prefix keeps the completion's budget of 40 tokens
        assert samples == 4
        assert all(budget == 40 - (len(p) - len(first.prompt_ids)) for p in prompts)
    for r in rollouts:
        for j, end in enumerate(r.step_ends[:-1]):
            length = len(r.prompt_ids) + end + 1
            assert r.step_rewards[j] == ((length % 2) + 3) / 4, j
        assert r.step_rewards[-1] == r.reward  # the answer step: the completion is its own continuation
    assert [r.step_continuations for r in rollouts] == [8, 4]
    assert step_stats(rollouts)["process/continuations"] == 12
    assert len(ends) == 5  # two arithmetic steps and an answer, one arithmetic step and an answer


def test_a_length_reward_in_tokens_scores_each_continuation_with_its_prefix(tokenizer, monkeypatch):
    """A continuation stands for the whole completion it ends: prefix and continuation. The sampler stands
    in here, writing "####5" from every prefix; the reward, 1 - tokens / 1000, tells the length it saw."""
    continuation = tokenizer.encode("####5")

    def fake_generate(model, prompts, config, seed):
        indices = [p for p in range(len(prompts)) for _ in range(config.num_samples)]
        return Samples(
            tokens=[continuation] * len(indices), logprobs=[], finish_reasons=[], prompt_indices=indices
        )

    monkeypatch.setattr(monte_carlo, "generate", fake_generate)
    r = rollout(tokenizer, "What is 2+3?", "2+3=5; then 3+2=5; ####5", reward=1.0)
    written([r], checked_step_rewards([r], ["What is 2+3?"], tokenizer))
    length = RewardSpec("length", options={"unit": "tokens", "max": 0, "soft": 1000})
    columns = {"completion_tokens": [len(r.completion_ids)]}  # as the trainer gives it: the sampled one's
    sampling = SamplingConfig(max_new_tokens=40, eos_token_ids=tuple(tokenizer.eos_token_ids))
    written(
        [r],
        monte_carlo_step_rewards(None, tokenizer, [r], checked_of([r]), columns, [length], sampling, 2, "s"),
    )
    assert len(r.step_ends) == 3
    for value, end in zip(r.step_rewards[:-1], r.step_ends[:-1]):
        assert value == pytest.approx(1 - (end + 1 + len(continuation)) / 1000, abs=1e-12)


def test_a_step_that_ends_the_completion_is_worth_the_completions_own_reward(tokenizer, monkeypatch):
    monkeypatch.setattr(monte_carlo, "generate", lambda *a, **k: pytest.fail("nothing to continue"))
    r = rollout(tokenizer, "What is 2+3?", "2+3=5", reward=1.0)
    r.completion_ids = r.completion_ids[:-1]  # cut at the budget: no EOS, the step ends the completion
    written([r], checked_step_rewards([r], ["What is 2+3?"], tokenizer))
    sampling = SamplingConfig(max_new_tokens=len(r.completion_ids))
    valued = monte_carlo_step_rewards(
        None, tokenizer, [r], checked_of([r]), {"answer": ["5"]}, [RewardSpec("accuracy")], sampling, 4, "s"
    )
    written([r], valued)
    assert r.step_rewards == [1.0, 1.0] and r.step_continuations == 0  # the step, then the answer


def test_monte_carlo_values_on_a_real_model_are_shares_and_repeat_with_the_seed(tokenizer):
    torch.manual_seed(0)
    model = tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=128).eval()
    prompt = "What is 12+30?"
    values = []
    for _ in range(2):
        r = rollout(tokenizer, prompt, "12+30=42;####42", reward=1.0)
        written([r], checked_step_rewards([r], [prompt], tokenizer))
        sampling = SamplingConfig(max_new_tokens=30, eos_token_ids=tuple(tokenizer.eos_token_ids))
        valued = monte_carlo_step_rewards(
            model,
            tokenizer,
            [r],
            checked_of([r]),
            {"answer": ["42"]},
            [RewardSpec("accuracy")],
            sampling,
            5,
            "seed",
        )
        written([r], valued)
        values.append(r.step_rewards)
    assert values[0] == values[1]
    assert all(v in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0) for v in values[0])


def test_faithfulness_counts_steps_and_right_answers_reached_through_a_bad_step():
    results = [
        {  # samples: right with two right steps; right through a wrong step; wrong
            "completions": ["", "", ""],
            "correct": [True, True, False],
            "steps": [[(True, True), (True, True)], [(True, True), (False, True)], [(False, True)]],
        },
        {  # right with an irrelevant step (1+1=2 on a problem without 1s); right with no step at all
            "completions": ["", "", ""],
            "correct": [True, True, False],
            "steps": [[(True, False)], [], []],
        },
    ]
    evaluation = summarize(results, samples=3)
    assert evaluation.step_accuracy == 4 / 6  # 4 of the 6 steps are right
    assert evaluation.unfaithful_frac == 2 / 4  # 2 of the 4 right answers passed a wrong or irrelevant step
    assert evaluation.stats() == {
        "eval/accuracy": 4 / 6,
        "held_out/step_accuracy": 4 / 6,
        "held_out/unfaithful_frac": 0.5,
    }
    no_steps = summarize([{"completions": [""], "correct": [True], "steps": [[]]}], samples=1)
    assert no_steps.step_accuracy is None and no_steps.stats() == {"eval/accuracy": 1.0}


def test_held_out_evaluation_checks_the_steps_of_each_completion(tokenizer):
    """evaluate() on a real (untrained) model: each completion's step marks are check_steps' verdicts."""
    torch.manual_seed(0)
    model = tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=128).eval()
    problems = [Problem("12+30*2", "72"), Problem("7*6", "42")]
    evaluation = evaluate(model, tokenizer, problems, template("tiny"), max_new_tokens=12)
    for result, problem in zip(evaluation.results, problems):
        (text,) = result["completions"]
        assert result["steps"] == [[(s.correct, s.relevant) for s in check_steps(text, problem.question)]]


def test_the_trace_and_held_out_evaluation_read_the_steps_training_credits(tokenizer):
    """A tool that printed 40 right steps: the trace shows, and held-out evaluation counts, the policy's
    one step and not the tool's, as checked_step_rewards credits them."""
    from minigrpo.run.evaluation import _step_marks
    from minigrpo.run.trace import _steps

    problem = "What is 2+3?"
    loud = tool_rollout(tokenizer, [("2+3=5; <run>", True), ("2+3=5;" * 40, False), ("####5", True)], 1.0)
    written([loud], checked_step_rewards([loud], [problem], tokenizer))
    assert len(loud.step_rewards) == 2  # the policy's step, then the answer
    shown = _steps(loud, problem, tokenizer)
    assert [step["text"] for step in shown] == ["2+3=5", "answer"]
    marks = _step_marks(tokenizer, loud.completion_ids, loud.generated, loud.text, problem)
    assert marks == [(True, True)]


def test_held_out_evaluation_leaves_out_the_steps_a_tool_printed(tokenizer, monkeypatch):
    """evaluate() with the sampler's token marks: a completion whose tool printed 40 right steps is
    marked with the policy's one step, as training credits it; its sibling without a tool keeps its own."""
    import minigrpo.run.evaluation as evaluation

    problem = "What is 2+3?"
    loud = tool_rollout(tokenizer, [("2+3=5; <run>", True), ("2+3=5;" * 40, False), ("####5", True)], 1.0)
    plain = tool_rollout(tokenizer, [("2+3=5; 1+4=5; ####5", True)], 1.0)
    scripted = Samples(
        tokens=[loud.completion_ids, plain.completion_ids],
        logprobs=[[0.0] * len(loud.completion_ids), [0.0] * len(plain.completion_ids)],
        finish_reasons=["stop", "stop"],
        prompt_indices=[0, 0],
        generated=[loud.generated, plain.generated],
        tool_calls=[[None], []],
    )
    monkeypatch.setattr(evaluation, "generate", lambda *args, **kwargs: scripted)
    (result,) = evaluate(None, tokenizer, [Problem(problem, "5")], template("tiny"), samples=2).results
    assert result["completions"] == [loud.text, plain.text]
    # the sibling's 1+4=5 is right and uses no number of the problem's: not relevant
    assert result["steps"] == [[(True, True)], [(True, True), (True, False)]]
    assert result["tool_calls"] == [1, 0]
