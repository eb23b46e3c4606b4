"""Tool calls inside the sampler: rows pause on a call's end marker and resume with the observation.

The hooks here work on token ids alone (tools.py turns text into calls; test_tools.py tests it), so each
rule of the engine is checked against the slow reference in reference_sampler.py.
"""

import json
import os

import pytest
import torch
from helpers import fixed_logits_model, tiny_model, tiny_train_config
from reference_sampler import naive_generate_with_tools

import minigrpo
from minigrpo import GRPOConfig, RewardSpec
from minigrpo.rollout import Rollout, collate
from minigrpo.run import latest_checkpoint
from minigrpo.tasks import generate_problems, template, to_task
from minigrpo.update import grpo_loss, token_logprobs
from minigrpo.verifier import register_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [[5, 9, 2, 77, 31, 8, 64], [13, 4], [90, 1, 1, 3, 45], [7]]
GREEDY_MARKER = 15  # common in this model's greedy completions
SAMPLED_MARKER = 76  # drawn a few times at temperature 1 with seed 1


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


class Hook:
    """Answers a call with one or two tokens computed from the completion so far; request r's answer
    arrives only after `delay * (r % 3)` polls that say it still runs, so rows resume at varied steps."""

    def __init__(self, marker: int, max_tool_calls: int = 3, delay: int = 0, observation=None):
        self.end_token_id, self.max_tool_calls, self.delay = marker, max_tool_calls, delay
        self.observation = observation or (
            lambda request, completion: [1 + sum(completion) % 40, 2][: 1 + request % 2]
        )
        self.pending = {}
        self.calls = []  # (request, completion length at the call)
        self.polls = 0

    def start(self, request, completion):
        assert completion[-1] == self.end_token_id and request not in self.pending
        self.pending[request] = [self.observation(request, completion), self.delay * (request % 3)]
        self.calls.append((request, len(completion)))

    def poll(self, request):
        self.polls += 1
        observation, wait = self.pending[request]
        if wait:
            self.pending[request][1] -= 1
            return None
        del self.pending[request]
        return observation


GREEDY = dict(max_new_tokens=30, temperature=0, num_samples=2)
SAMPLED = dict(max_new_tokens=30, temperature=1.0, num_samples=3, seed=1)


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_calls_under_refill_give_the_unbounded_calls_tokens(model, rows):
    """Budgets 1/3/5 refill and compact around paused rows; answers arriving late change nothing."""
    for marker, settings in ((GREEDY_MARKER, GREEDY), (SAMPLED_MARKER, SAMPLED)):
        unbounded_hook = Hook(marker)
        unbounded = minigrpo.generate(model, PROMPTS, tools=unbounded_hook, **settings)
        bounded_hook = Hook(marker, delay=2)
        bounded = minigrpo.generate(model, PROMPTS, tools=bounded_hook, max_batch_rows=rows, **settings)
        assert len(unbounded_hook.calls) >= 3, "the test needs rows that call"
        assert sorted(bounded_hook.calls) == sorted(unbounded_hook.calls)
        assert bounded.tokens == unbounded.tokens and bounded.generated == unbounded.generated
        assert bounded.finish_reasons == unbounded.finish_reasons
        for a, b in zip(bounded.logprobs, unbounded.logprobs):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


@pytest.mark.parametrize("limit", [0, 1])
def test_a_refilled_rows_first_token_can_make_a_call(limit):
    """A refilled row's first token comes from its prefill, not from a decode step: when it is the end
    marker, its call starts there too (or the row ends past the limit), so completions and calls do not
    depend on the row budget."""
    always = fixed_logits_model(torch.tensor([0.0] * 7 + [9.0]))  # greedy: token 7, the marker, every time
    runs = []
    for rows in (None, 1):
        hook = Hook(7, max_tool_calls=limit, observation=lambda request, completion: [3, 4])
        samples = minigrpo.generate(
            always,
            [[1], [2]],
            tools=hook,
            max_new_tokens=8,
            temperature=0,
            num_samples=2,
            max_batch_rows=rows,
        )
        runs.append((samples.tokens, samples.finish_reasons, sorted(hook.calls)))
    assert runs[0] == runs[1]
    tokens, reasons, calls = runs[0]
    assert tokens == [[7, 3, 4, 7][: 1 + 3 * limit]] * 4 and reasons == ["tool_limit"] * 4
    assert calls == [(request, 1) for request in range(4)][: 4 * limit]


def test_greedy_calls_equal_the_reference(model):
    samples = minigrpo.generate(model, PROMPTS, tools=Hook(GREEDY_MARKER, max_tool_calls=2), **GREEDY)
    tokens, generated, reasons = naive_generate_with_tools(
        model, PROMPTS, Hook(GREEDY_MARKER, max_tool_calls=2), **GREEDY
    )
    assert samples.tokens == tokens and samples.generated == generated
    assert samples.finish_reasons == reasons
    assert "tool_limit" in reasons and not all(all(g) for g in generated)


def test_an_observation_follows_its_marker_unsampled(model):
    hook = Hook(SAMPLED_MARKER)
    samples = minigrpo.generate(model, PROMPTS, tools=hook, **SAMPLED)
    for request, length in hook.calls:
        tokens, generated = samples.tokens[request], samples.generated[request]
        observation = hook.observation(request, tokens[:length])
        assert tokens[length - 1] == SAMPLED_MARKER and generated[length - 1]
        end = min(length + len(observation), len(tokens))
        assert tokens[length:end] == observation[: end - length]
        assert not any(generated[length:end]) and all(
            lp == 0.0 for lp in samples.logprobs[request][length:end]
        )
        assert end == len(tokens) or generated[end]  # sampling resumes right after


def test_logprobs_of_sampled_tokens_equal_a_full_forward_over_the_interleaved_sequence(model):
    double = tiny_model(seed=3).double()
    settings = dict(SAMPLED, temperature=0.7)
    samples = minigrpo.generate(double, PROMPTS, tools=Hook(SAMPLED_MARKER, delay=1), **settings)
    observed = 0
    for tokens, logprobs, generated, p in zip(
        samples.tokens, samples.logprobs, samples.generated, samples.prompt_indices
    ):
        with torch.no_grad():
            logits = double(torch.tensor([PROMPTS[p] + tokens]))[0, len(PROMPTS[p]) - 1 : -1]  # (n, V)
        expected = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
        mask = torch.tensor(generated)
        got = torch.tensor(logprobs, dtype=torch.float64)
        assert (got[mask] - expected[mask]).abs().max() <= 1e-10
        observed += int((~mask).sum())
    assert observed > 0


def test_the_call_after_the_last_allowed_ends_the_completion(model):
    hook = Hook(GREEDY_MARKER, max_tool_calls=1)
    samples = minigrpo.generate(model, PROMPTS, tools=hook, **GREEDY)
    limited = [r for r, reason in enumerate(samples.finish_reasons) if reason == "tool_limit"]
    assert limited
    for r in limited:
        assert samples.tokens[r][-1] == GREEDY_MARKER and samples.generated[r][-1]
        assert sum(request == r for request, _ in hook.calls) == 1


def test_observations_count_against_the_budget_and_their_eos_ends_nothing(model):
    eos = 3
    long = Hook(SAMPLED_MARKER, observation=lambda request, completion: [eos] * 50)
    samples = minigrpo.generate(model, PROMPTS, tools=long, eos_token_ids=[eos], **SAMPLED)
    called = {request for request, _ in long.calls}
    assert called
    for r in called:
        assert len(samples.tokens[r]) == SAMPLED["max_new_tokens"] and samples.finish_reasons[r] == "length"
        assert eos in samples.tokens[r]


def test_an_eos_inside_an_observation_with_budget_to_spare_ends_nothing():
    """Greedy on the marker (7): each call's observation is three EOS tokens, and the row samples on after
    each of them until its budget ends it."""
    always = fixed_logits_model(torch.tensor([0.0] * 7 + [9.0]))
    hook = Hook(7, max_tool_calls=5, observation=lambda request, completion: [3, 3, 3])
    samples = minigrpo.generate(
        always, [[1]], tools=hook, eos_token_ids=[3], max_new_tokens=10, temperature=0
    )
    assert samples.tokens == [[7, 3, 3, 3, 7, 3, 3, 3, 7, 3]] and samples.finish_reasons == ["length"]
    assert samples.generated == [[True, False, False, False] * 2 + [True, False]]


def test_an_empty_observation_resumes_a_row_whenever_it_arrives(model):
    """A call answered with no tokens: the row samples on from where it paused, so its completion is the
    same whether the answer came at once or polls later (it once sampled from a paused step's logits),
    and the same as the reference sampler's."""
    runs = []
    for delay in (0, 2):
        hook = Hook(GREEDY_MARKER, delay=delay, observation=lambda request, completion: [])
        runs.append(minigrpo.generate(model, PROMPTS, tools=hook, **GREEDY).tokens)
    reference = Hook(GREEDY_MARKER, observation=lambda request, completion: [])
    tokens, _, _ = naive_generate_with_tools(model, PROMPTS, reference, **GREEDY)
    assert runs[0] == runs[1] == tokens
    assert len(reference.calls) >= 3


def test_a_marker_inside_an_observation_starts_no_call():
    """An observation holding the end marker (7, then 4) is context: only the sampled markers call."""
    always = fixed_logits_model(torch.tensor([0.0] * 7 + [9.0]))
    hook = Hook(7, max_tool_calls=5, observation=lambda request, completion: [7, 4])
    samples = minigrpo.generate(always, [[1]], tools=hook, max_new_tokens=9, temperature=0)
    assert samples.tokens == [[7, 7, 4] * 3] and samples.finish_reasons == ["length"]
    assert hook.calls == [(0, 1), (0, 4), (0, 7)]


def test_late_answers_overlap_with_the_other_rows_decoding(model):
    """While a call runs the other rows decode on: waiting adds far fewer steps than it polls."""
    prompt_calls = minigrpo.generate(model, PROMPTS, tools=Hook(SAMPLED_MARKER), **SAMPLED)
    late_hook = Hook(SAMPLED_MARKER, delay=6)
    late = minigrpo.generate(model, PROMPTS, tools=late_hook, **SAMPLED)
    assert late.tokens == prompt_calls.tokens
    waits = sum(6 * (request % 3) for request, _ in late_hook.calls)
    assert waits > 12 and late.decode_steps - prompt_calls.decode_steps < waits


def test_a_thousand_calls_in_one_completion(model):
    """A model that writes nothing but end markers: 1,000 calls answered, the 1,001st ends it."""
    marker = 5
    always = fixed_logits_model(torch.tensor([0.0] * 5 + [9.0, 0.0, 0.0]), max_position_embeddings=2100)
    hook = Hook(marker, max_tool_calls=1000, observation=lambda request, completion: [])
    samples = minigrpo.generate(always, [[1]], tools=hook, max_new_tokens=2000, temperature=0)
    assert len(hook.calls) == 1000 and samples.finish_reasons == ["tool_limit"]
    assert len(samples.tokens[0]) == 1001 and all(samples.generated[0])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "cispo"])
def test_observation_tokens_get_no_gradient_and_no_share_of_the_loss(loss_type):
    """Observation tokens are context: the loss's gradient on their log-probs is exactly 0, whatever
    their advantages, old, reference or sampler log-probs, while every token the policy wrote gets one;
    the entropy, KL and sampler-mismatch stats average over the policy's tokens only."""
    model = tiny_model(seed=1).double()
    generated = [[True, False, False, True, True], [True, True, False, True, False, False, True]]
    rollouts = [
        Rollout([5, 9, 2], [11, 12, 13, 14, 15], "stop", generated=generated[0], advantage=1.0),
        Rollout([7, 3], [21, 22, 23, 24, 25, 26, 27], "stop", generated=generated[1], advantage=-0.5),
    ]
    batch = collate(rollouts, 0, "cpu")
    mine = torch.zeros_like(batch.completion_mask, dtype=torch.bool)  # (B, Tc)
    for row, flags in enumerate(generated):
        mine[row, : len(flags)] = torch.tensor(flags)
    assert torch.equal(batch.completion_mask.bool(), mine)
    logprobs, entropies = token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.completion_start, 1.0
    )
    logprobs = logprobs.detach().requires_grad_()
    old = logprobs.detach() - 0.1
    noise = torch.randn(logprobs.shape, dtype=torch.float64) * (~mine)  # (B, Tc): only on observations
    losses = []
    for shift in (0.0, 1.0):  # values on observation tokens must not matter
        loss, stats = grpo_loss(
            logprobs,
            old + shift * noise,
            batch.advantages + shift * noise,
            batch.completion_mask,
            ref_logprobs=old + shift * noise,
            beta=0.1,
            loss_type=loss_type,
            sampler_logprobs=old + shift * noise,
            sampler_correction="token_truncate",
            entropies=entropies.detach() + shift * noise,
        )
        (gradient,) = torch.autograd.grad(loss, logprobs)
        assert torch.all(gradient[~mine] == 0) and torch.all(gradient[mine] != 0)
        losses.append((float(loss.detach()), stats))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-12)
    assert losses[0][1] == pytest.approx(losses[1][1], rel=1e-12)
    assert rollouts[0].loss_tokens == 3 and rollouts[1].loss_tokens == 4


@register_reward("test_calls")
def _calls(completions, **_):
    """A reward every group earns unevenly: the calculator's answers a completion got, over 2."""
    return [c.count("<out>") / 2 for c in completions]


def test_a_run_with_tool_calls_resumes_exactly(tmp_path):
    """models/minigrpo-tiny-calc calling its calculator: a run stopped after step 1 and resumed lands on
    the straight run's weights and metrics. A fresh runner per sampling call and calls answered from the
    completion alone leave nothing of a step's tools for the checkpoint to carry."""
    model = os.path.join(ROOT, "models", "minigrpo-tiny-calc")
    task = to_task(
        generate_problems("calc", 16, "train", seed=0), template("tiny"), [RewardSpec("test_calls")]
    )
    grpo = GRPOConfig(num_generations=4, max_completion_length=64, tools="calculator")

    def run(out, stop_at_step, resume=False):
        settings = dict(max_steps=3, micro_batch_size=8, learning_rate=1e-3)
        config = tiny_train_config(out, stop_at_step=stop_at_step, resume=resume, **settings)
        minigrpo.train(model, task, grpo, config)
        with open(out / "metrics.jsonl") as f:
            metrics = [json.loads(line) for line in f]
        return minigrpo.load_pretrained(latest_checkpoint(str(out)))[0].state_dict(), metrics

    straight, straight_metrics = run(tmp_path / "straight", 0)
    run(tmp_path / "stopped", 1)
    resumed, resumed_metrics = run(tmp_path / "stopped", 0, resume=True)
    assert all(torch.equal(value, resumed[name]) for name, value in straight.items())
    assert all(m["tools/calls_per_completion"] > 0 and m["grad_norm"] > 0 for m in straight_metrics)
    # what is measured, not computed: times, and the sampler's log-probs against the update's (rounding)
    measured = ("time/", "sampling/", "training/", "mismatch/", "tools/seconds", "tools/calculator/seconds")
    for a, b in zip(straight_metrics, resumed_metrics, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(measured)} == {
            k: v for k, v in b.items() if not k.startswith(measured)
        }
