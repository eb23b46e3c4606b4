"""Off-policy corrections and the newer objectives of loss.py: sampler_correction (truncated and
masked importance weights, per token and per sequence), GSPO's sequence-level ratio, CISPO, and
the sampler-trainer mismatch they answer to. Every expectation is computed by hand, with plain
floats, from the formulas in loss.py's docstring."""

import math

import pytest
import torch
from helpers import tiny_model

from minigrpo import GRPOConfig
from minigrpo.config import SAMPLER_CORRECTIONS
from minigrpo.rollout import Rollout, collate, generate
from minigrpo.update import grpo_loss, sampler_mismatch, token_logprobs

MASK = [[1, 1, 1], [1, 1, 0]]  # the second completion is padded
OLD = [[-1.0, -2.0, -0.5], [-0.2, -1.5, -9.0]]
RATIOS = [[1.1, 0.7, 1.4], [0.95, 1.3, 5.0]]  # exp(logp - old); row 0 has two tokens outside [0.8, 1.2]
GAP = [[0.3, -0.9, 0.05], [1.2, 0.4, 7.0]]  # old - sampler, per token (the padded one is never read)
# Tokens (of 5) each mode changes at C = 2: r = exp(GAP) and R = exp(-0.55) = 0.58, exp(1.6) = 4.95.
CHANGED = {"token_truncate": 1, "token_mask": 2, "sequence_truncate": 2, "sequence_mask": 2}
ADV = [0.8, -1.2]
CAP = 2.0


def tensors(dtype=torch.float64):
    logprobs = (torch.tensor(OLD, dtype=dtype) + torch.tensor(RATIOS, dtype=dtype).log()).requires_grad_()
    old, mask = torch.tensor(OLD, dtype=dtype), torch.tensor(MASK, dtype=dtype)
    sampler = old - torch.tensor(GAP, dtype=dtype)
    return logprobs, old, torch.tensor(ADV, dtype=dtype), mask, sampler


def clipped_surrogate_slope(r, a, eps=0.2):
    """d/d logp of min(r a, clip(r) a) for one token, r = exp(logp - old): a r unless the clip cuts it."""
    cut = (r > 1 + eps and a > 0) or (r < 1 - eps and a < 0)
    return 0.0 if cut else a * r


def surrogate(r, a, eps=0.2):
    return min(r * a, min(max(r, 1 - eps), 1 + eps) * a)


def weight(mode, i, t):
    """The hand-computed correction weight of token t of row i."""
    tokens = [t for t in range(3) if MASK[i][t]]
    log_r = GAP[i][t] if mode.startswith("token") else sum(GAP[i][u] for u in tokens)
    if mode.endswith("truncate"):
        return min(math.exp(log_r), CAP)
    return 1.0 if 1 / CAP <= math.exp(log_r) <= CAP else 0.0


@pytest.mark.parametrize("mode", SAMPLER_CORRECTIONS)
def test_each_sampler_correction_against_hand_computed_loss_and_gradient(mode):
    logprobs, old, adv, mask, sampler = tensors()
    # loss_type grpo: token mean per row, then row mean
    loss, stats = grpo_loss(
        logprobs,
        old,
        adv,
        mask,
        sampler_logprobs=sampler,
        sampler_correction=mode,
        sampler_correction_cap=CAP,
    )
    loss.backward()
    expected, grad = 0.0, [[0.0] * 3 for _ in range(2)]
    for i in range(2):
        tokens = [t for t in range(3) if MASK[i][t]]
        for t in tokens:
            w = 1.0 if mode == "none" else weight(mode, i, t)
            expected += -w * surrogate(RATIOS[i][t], ADV[i]) / len(tokens) / 2
            grad[i][t] = -w * clipped_surrogate_slope(RATIOS[i][t], ADV[i]) / len(tokens) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, torch.tensor(grad, dtype=torch.float64), rtol=0, atol=1e-12)
    assert logprobs.grad[1, 2] == 0  # the padded token gets no gradient
    if mode != "none":
        kind = "masked" if mode.endswith("mask") else "truncated"
        assert stats[f"sampler_correction/{kind}_frac"] == pytest.approx(CHANGED[mode] / 5)


def test_the_corrections_weigh_what_the_formulas_say():
    assert [weight("token_truncate", 0, t) for t in range(3)] == pytest.approx(
        [math.exp(0.3), math.exp(-0.9), math.exp(0.05)]
    )
    assert weight("token_truncate", 1, 0) == 2.0  # exp(1.2) = 3.3 is cut at C
    assert [weight("token_mask", 0, t) for t in range(3)] == [1.0, 0.0, 1.0]  # exp(-0.9) = 0.41 < 1/2
    assert weight("sequence_truncate", 0, 1) == pytest.approx(math.exp(-0.55))  # the row's R on every token
    assert weight("sequence_truncate", 1, 0) == 2.0 and weight("sequence_mask", 1, 1) == 0.0  # R = 4.95
    assert weight("sequence_mask", 0, 1) == 1.0  # R = 0.58 is inside [1/2, 2]


def test_sequence_level_ratio_is_gspo_against_hand_computed_numbers():
    logprobs, old, adv, mask, _ = tensors()
    loss, stats = grpo_loss(logprobs, old, adv, mask, importance_sampling_level="sequence", epsilon=0.2)
    loss.backward()
    expected, grad = 0.0, [[0.0] * 3 for _ in range(2)]
    for i in range(2):
        tokens = [t for t in range(3) if MASK[i][t]]
        # s_i, the geometric mean ratio
        s = math.exp(sum(math.log(RATIOS[i][t]) for t in tokens) / len(tokens))
        expected += -surrogate(s, ADV[i]) / 2  # every token of the row carries the same term: its mean is it
        for t in tokens:  # d s_i / d logp_t = s_i / |tokens|
            grad[i][t] = -clipped_surrogate_slope(s, ADV[i]) / len(tokens) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, torch.tensor(grad, dtype=torch.float64), rtol=0, atol=1e-12)
    assert stats["ratio/mean"] == pytest.approx(
        (
            3 * math.exp(sum(map(math.log, RATIOS[0])) / 3)
            + 2 * math.exp(sum(map(math.log, RATIOS[1][:2])) / 2)
        )
        / 5
    )


# cispo's default weight cap is 1 + 4.0
@pytest.mark.parametrize("epsilon_high, cap", [(None, 5.0), (0.2, 1.2)])
def test_cispo_against_hand_computed_loss_and_gradient(epsilon_high, cap):
    logprobs, old, adv, mask, _ = tensors()
    loss, _ = grpo_loss(logprobs, old, adv, mask, loss_type="cispo", epsilon_high=epsilon_high)
    loss.backward()
    tokens = [(i, t) for i in range(2) for t in range(3) if MASK[i][t]]
    logp = lambda i, t: OLD[i][t] + math.log(RATIOS[i][t])  # noqa: E731
    # dapo's token mean
    expected = sum(-min(RATIOS[i][t], cap) * ADV[i] * logp(i, t) for i, t in tokens) / len(tokens)
    grad = [
        [(-min(RATIOS[i][t], cap) * ADV[i] / len(tokens)) if MASK[i][t] else 0.0 for t in range(3)]
        for i in range(2)
    ]
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(logprobs.grad, torch.tensor(grad, dtype=torch.float64), rtol=0, atol=1e-12)


def test_cispo_counts_capped_weights_of_either_sign_and_no_lower_clip():
    logprobs, old, adv, mask, _ = tensors()
    _, stats = grpo_loss(logprobs, old, adv, mask, loss_type="cispo", epsilon_high=0.2)
    # ratios above 1.2 among the 5 tokens: 1.4 (A > 0) and 1.3 (A < 0); 0.7 < 0.8 is not clipped below
    assert stats["clip/high_frac"] == pytest.approx(2 / 5) and stats["clip/low_frac"] == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_every_correction_is_the_identity_when_the_sampler_agrees(loss_type, level):
    results = []
    for mode in SAMPLER_CORRECTIONS:
        logprobs, old, adv, mask, _ = tensors()
        loss, _ = grpo_loss(
            logprobs,
            old,
            adv,
            mask,
            loss_type=loss_type,
            importance_sampling_level=level,
            sampler_logprobs=old.clone(),
            sampler_correction=mode,
            beta=0.1,
            ref_logprobs=old - 0.3,
        )
        loss.backward()
        results.append((loss.item(), logprobs.grad))
    for loss, grad in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-12)
        torch.testing.assert_close(grad, results[0][1], rtol=0, atol=1e-12)


def test_the_kl_term_is_not_weighted():
    logprobs, old, adv, mask, sampler = tensors()
    plain, _ = grpo_loss(
        logprobs,
        old,
        adv,
        mask,
        sampler_logprobs=sampler,
        sampler_correction="token_mask",
        sampler_correction_cap=CAP,
    )
    with_kl, _ = grpo_loss(
        logprobs,
        old,
        adv,
        mask,
        sampler_logprobs=sampler,
        sampler_correction="token_mask",
        sampler_correction_cap=CAP,
        beta=0.5,
        ref_logprobs=old - 0.3,
    )
    kl = [[math.exp(-0.3 - math.log(r)) + 0.3 + math.log(r) - 1 for r in row] for row in RATIOS]  # k3 by hand
    by_rows = sum(sum(kl[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i]) for i in range(2)) / 2
    assert with_kl.item() - plain.item() == pytest.approx(0.5 * by_rows, abs=1e-12)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo"])
@pytest.mark.parametrize(
    "options",
    [dict(importance_sampling_level="sequence")]
    + [dict(sampler_correction=m, sampler_correction_cap=CAP) for m in SAMPLER_CORRECTIONS[1:]],
)
def test_every_option_is_exact_under_gradient_accumulation(loss_type, options):
    logprobs, old, adv, mask, sampler = tensors()
    full, _ = grpo_loss(logprobs, old, adv, mask, loss_type=loss_type, sampler_logprobs=sampler, **options)
    full.backward()
    whole = logprobs.grad.clone()
    logprobs.grad = None
    parts = 0.0
    for rows in (slice(0, 1), slice(1, 2)):
        loss, _ = grpo_loss(
            logprobs[rows],
            old[rows],
            adv[rows],
            mask[rows],
            loss_type=loss_type,
            sampler_logprobs=sampler[rows],
            num_sequences=2,
            num_tokens=5,
            max_completion_length=3,
            **options,
        )
        loss.backward()
        parts += loss.item()
    assert parts == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(logprobs.grad, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(sampler_correction="clip"), "sampler_correction must be one of none, token_truncate"),
        (dict(importance_sampling_level="group"), "importance_sampling_level must be one of token, sequence"),
        (
            dict(sampler_correction="token_mask", sampler_correction_cap=1.0),
            "sampler_correction_cap must be > 1",
        ),
        (dict(loss_type="ppo"), "loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo"),
    ],
)
def test_bad_objective_settings_are_clear_errors_in_the_loss_and_the_config(options, message):
    logprobs, old, adv, mask, sampler = tensors()
    with pytest.raises(ValueError, match=message):
        grpo_loss(logprobs, old, adv, mask, sampler_logprobs=sampler, **options)
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**options)


def test_a_correction_without_sampler_logprobs_is_a_clear_error():
    logprobs, old, adv, mask, _ = tensors()
    with pytest.raises(ValueError, match="sampler_correction='token_truncate' needs sampler_logprobs"):
        grpo_loss(logprobs, old, adv, mask, sampler_correction="token_truncate")


def sampled_rollouts(sampling_model, G=4):
    prompts = [[3, 17, 4, 9], [5, 60, 2], [8, 8, 31, 40, 12]]
    samples = generate(sampling_model, prompts, max_new_tokens=12, num_samples=G, temperature=0.9, seed=3)
    return [
        Rollout(
            prompt_ids=prompts[p],
            completion_ids=tokens,
            finish_reason=reason,
            sampler_logprobs=torch.tensor(logprobs),
        )
        for tokens, logprobs, reason, p in zip(
            samples.tokens, samples.logprobs, samples.finish_reasons, samples.prompt_indices
        )
    ]


@pytest.mark.parametrize(
    "sampler_dtype, low, high", [(torch.float32, 0.0, 1e-5), (torch.bfloat16, 1e-3, math.inf)]
)
def test_the_mismatch_reads_zero_with_fp32_sampling_and_not_with_bf16(sampler_dtype, low, high):
    """The same weights sample (in fp32 or bf16) and train (fp32): only the arithmetic differs.
    (bf16 on this random model: mean |gap| ~8e-4 and max ~1e-2, where logits are small; the
    numbers of the default model are in benchmarks/README.md.)"""
    model = tiny_model(seed=5)
    sampler = tiny_model(seed=5).to(sampler_dtype)
    rollouts = sampled_rollouts(sampler)
    batch = collate(rollouts, 0, "cpu")
    with torch.no_grad():
        old, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_start, 0.9)
    stats = sampler_mismatch(old, batch.sampler_logprobs, batch.completion_mask)
    assert low <= stats["mismatch/logprob_abs_max"] <= high
    assert low / 5 <= stats["mismatch/logprob_abs_mean"] <= stats["mismatch/logprob_abs_max"]
    if sampler_dtype == torch.float32:
        assert (
            stats["mismatch/ratio_outside_0.9_1.1_frac"] == 0.0
            and abs(stats["mismatch/seq_logratio_mean"]) <= 1e-4
        )


def test_mismatch_metrics_by_hand():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, 0.0]])
    sampler = old - torch.tensor([[0.05, -0.2, 0.0], [0.12, -0.1, 9.0]])  # the padded 9.0 is never read
    stats = sampler_mismatch(old, sampler, torch.tensor([[1, 1, 1], [1, 1, 0]]), num_sequences=4)
    assert stats["mismatch/logprob_abs_mean"] == pytest.approx((0.05 + 0.2 + 0.12 + 0.1) / 5)
    assert stats["mismatch/logprob_abs_max"] == pytest.approx(0.2)
    # exp(0.05) = 1.05 in; exp(-0.2) = 0.82 out; exp(0.12) = 1.13 out; exp(-0.1) = 0.905 in
    assert stats["mismatch/ratio_outside_0.9_1.1_frac"] == pytest.approx(2 / 5)
    # a share of 4 sequences
    assert stats["mismatch/seq_logratio_mean"] == pytest.approx(((0.05 - 0.2) + (0.12 - 0.1)) / 4)
