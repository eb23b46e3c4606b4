"""Step rewards for process supervision: the checker's verdicts land on the tokens where their steps
end (Tokenizer.token_at against a brute-force search), and Math-Shepherd's Monte-Carlo values are
the mean outcome reward of N continuations from each step's end, with the budget each has left."""

import random

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from minigrpo import step_rewards
from minigrpo.evaluate import evaluate, summarize
from minigrpo.rollout import Rollout
from minigrpo.sampler import Samples, SamplingConfig
from minigrpo.step_rewards import checked_step_rewards, monte_carlo_step_rewards, step_stats
from minigrpo.tasks import Problem
from minigrpo.tasks.prompts import template
from minigrpo.verifier import RewardSpec
from minigrpo.verifier.steps import check_steps


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(str(tmp_path_factory.mktemp("tokenizer")))


def test_token_at_is_the_first_token_whose_prefix_reaches_the_offset(tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        text = "".join(rng.choice("0123456789+*=; What is\\boxed{}") for _ in range(rng.randint(1, 40)))
        ids = tokenizer.encode(text)
        offsets = sorted(rng.randint(1, len(text)) for _ in range(4))
        brute = []
        for offset in offsets:
            brute.append(next(k for k in range(len(ids)) if len(tokenizer.decode(ids[: k + 1])) >= offset))
        assert tokenizer.token_at(ids, offsets) == brute


def rollout(tokenizer, prompt: str, completion: str, reward: float = 0.0) -> Rollout:
    ids = tokenizer.encode(completion) + [tokenizer.eos_token_ids[0]]
    r = Rollout(prompt_ids=tokenizer.encode(prompt), completion_ids=ids, finish_reason="stop", reward=reward)
    r.text = tokenizer.decode_completion(ids)
    return r


def test_checked_step_rewards_sit_on_the_last_token_of_each_step(tokenizer):
    r = rollout(tokenizer, "What is 12+30*2?", "30*2=60;12+60=73;####73")
    checked_step_rewards([r], ["What is 12+30*2?"], tokenizer)
    # 30*2=60 right and relevant; 12+60=73 wrong; then the answer step, worth the outcome reward (0)
    assert r.step_rewards == [1.0, -1.0, 0.0]
    for end, step in zip(r.step_ends, ["30*2=60", "30*2=60;12+60=73"]):
        assert tokenizer.decode(r.completion_ids[: end + 1]) == step  # up to the step's last character
    assert r.step_ends[-1] == len(r.completion_ids) - 1  # the answer step ends on the last token (EOS)


def test_a_completion_without_arithmetic_has_the_answer_step_alone(tokenizer):
    r = rollout(tokenizer, "What is 12+30?", "####42", reward=1.0)
    checked_step_rewards([r], ["What is 12+30?"], tokenizer)
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

    monkeypatch.setattr(step_rewards, "generate", fake_generate)
    prompt = "What is 12+30*2?"
    first = rollout(tokenizer, prompt, "30*2=60;12+60=72;####72", reward=1.0)
    second = rollout(tokenizer, prompt, "12+30=42", reward=0.0)  # its one step ends before EOS
    rollouts = [first, second]
    checked_step_rewards(rollouts, [prompt, prompt], tokenizer)
    columns = {"answer": ["1", "1"]}  # a continuation "####1" is right, "####0" wrong
    sampling = SamplingConfig(max_new_tokens=40, eos_token_ids=tuple(tokenizer.eos_token_ids))
    monte_carlo_step_rewards(None, tokenizer, rollouts, columns, [RewardSpec("accuracy")], sampling, 4, "s")

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


def test_a_step_that_ends_the_completion_is_worth_the_completions_own_reward(tokenizer, monkeypatch):
    monkeypatch.setattr(step_rewards, "generate", lambda *a, **k: pytest.fail("nothing to continue"))
    r = rollout(tokenizer, "What is 2+3?", "2+3=5", reward=1.0)
    r.completion_ids = r.completion_ids[:-1]  # cut at the budget: no EOS, the step ends the completion
    checked_step_rewards([r], ["What is 2+3?"], tokenizer)
    sampling = SamplingConfig(max_new_tokens=len(r.completion_ids))
    monte_carlo_step_rewards(
        None, tokenizer, [r], {"answer": ["5"]}, [RewardSpec("accuracy")], sampling, 4, "s"
    )
    assert r.step_rewards == [1.0, 1.0] and r.step_continuations == 0  # the step, then the answer


def test_monte_carlo_values_on_a_real_model_are_shares_and_repeat_with_the_seed(tokenizer):
    torch.manual_seed(0)
    model = tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=128).eval()
    prompt = "What is 12+30?"
    values = []
    for _ in range(2):
        r = rollout(tokenizer, prompt, "12+30=42;####42", reward=1.0)
        checked_step_rewards([r], [prompt], tokenizer)
        sampling = SamplingConfig(max_new_tokens=30, eos_token_ids=tuple(tokenizer.eos_token_ids))
        monte_carlo_step_rewards(
            model, tokenizer, [r], {"answer": ["42"]}, [RewardSpec("accuracy")], sampling, 5, "seed"
        )
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
