"""The GRPO loss on hand-computed batches: aggregations, clipping, KL, masking, accumulation.

Log-probs are built as old_logprobs + log(ratio), so every ratio in a test is a number chosen by
hand (1.1, 0.5, ...). Because d ratio / d logprob = ratio, the gradient of an unclipped token's
-ratio * A with respect to its log-prob is again -ratio * A: the tables below serve for both.
"""

import math

import pytest
import torch

from minigrpo.update import grpo_loss, k3

ATOL = 1e-6


def policy(old, ratios):
    """Leaf log-probs (with grad) such that exp(logprobs - old) = ratios, elementwise."""
    return (old + torch.tensor(ratios).log()).detach().requires_grad_()


def close(actual, expected, atol=ATOL):
    return torch.allclose(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


# A batch of B = 3 completions, T = 4 columns, of lengths 4, 2 and 3 (right padded).
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -1.5, -4.0, -4.0], [-2.5, -0.1, -1.2, -4.0]])
# all inside [0.8, 1.2]: no clipping
RATIOS = [
    [1.1, 0.9, 1.0, 1.0],
    [1.1, 0.9, 1.0, 1.0],
    [1.1, 1.1, 0.9, 1.0],
]
ADV = torch.tensor([1.0, -0.5, 2.0])
# Per-token loss -ratio * A on the real tokens (0 on padding), which is also its gradient:
# all 9 tokens: sum -4.0 + 1.0 - 6.2 = -9.2
PER_TOKEN = [
    [-1.1, -0.9, -1.0, -1.0],  # A = 1:    sum -4.0, mean -4.0 / 4 = -1.0
    [0.55, 0.45, 0.0, 0.0],  #   A = -0.5: sum  1.0, mean  1.0 / 2 =  0.5
    [-2.2, -2.2, -1.8, 0.0],  #  A = 2:    sum -6.2, mean -6.2 / 3
]
# Weight of each token in the loss, per aggregation:
GRPO_WEIGHT = [[1 / 12] * 4, [1 / 6] * 2 + [0, 0], [1 / 9] * 3 + [0]]  # 1 / (tokens of its row * 3 rows)
TOKEN_WEIGHT = [[1 / 9] * 4, [1 / 9] * 2 + [0, 0], [1 / 9] * 3 + [0]]  # 1 / 9 tokens
DR_WEIGHT = [[1 / 12] * 4, [1 / 12] * 2 + [0, 0], [1 / 12] * 3 + [0]]  # 1 / (3 rows * T = 4)


@pytest.mark.parametrize(
    "loss_type, options, expected, weight",
    [
        ("grpo", {}, (-1.0 + 0.5 - 6.2 / 3) / 3, GRPO_WEIGHT),  # -0.855556
        ("bnpo", {}, -9.2 / 9, TOKEN_WEIGHT),  # -1.022222
        ("dr_grpo", {}, -9.2 / (3 * 4), DR_WEIGHT),  # -0.766667: divided by max length T, not tokens
        ("dapo", {}, -9.2 / 9, TOKEN_WEIGHT),  # one batch = the whole step: same as bnpo
        (
            "grpo",
            dict(num_sequences=6),
            (-1.0 + 0.5 - 6.2 / 3) / 6,
            [[w / 2 for w in r] for r in GRPO_WEIGHT],
        ),
        ("dr_grpo", dict(max_completion_length=8), -9.2 / (3 * 8), [[w / 2 for w in r] for r in DR_WEIGHT]),
        ("dapo", dict(num_tokens=20), -9.2 / 20, [[w * 9 / 20 for w in r] for r in TOKEN_WEIGHT]),
    ],
)
def test_each_loss_type_on_a_ragged_batch(loss_type, options, expected, weight):
    logprobs = policy(OLD, RATIOS)
    loss, stats = grpo_loss(logprobs, OLD, ADV, MASK, loss_type=loss_type, **options)
    assert loss.item() == pytest.approx(expected, abs=ATOL)
    assert stats["loss"] == pytest.approx(expected, abs=ATOL)
    assert stats["tokens"] == 9.0
    assert stats["clip/low_frac"] == stats["clip/high_frac"] == stats["clip/region_frac"] == 0.0
    assert stats["ratio/mean"] == pytest.approx(
        (1.1 + 0.9 + 1.0 + 1.0 + 1.1 + 0.9 + 1.1 + 1.1 + 0.9) / 9, abs=ATOL
    )
    loss.backward()
    expected_grad = [[g * w for g, w in zip(gs, ws)] for gs, ws in zip(PER_TOKEN, weight)]
    assert close(logprobs.grad, expected_grad)


# Clipping, epsilon = 0.2. Row 0 has A = +1, row 1 A = -1, each with ratios 1.5 then 0.5; row 2 has
# A = -0.5 with ratios 0.6 and 1.3 (so that the A > 0 and A < 0 cases are not mirror images).
#   A = +1,   ratio 1.5: min(1.5, 1.2) * 1      = 1.2   clipped above: loss -1.2, no gradient
#   A = +1,   ratio 0.5: min(0.5, 0.8) * 1      = 0.5   not clipped:   loss -0.5, gradient -0.5
#   A = -1,   ratio 1.5: min(-1.5, -1.2)        = -1.5  not clipped:   loss  1.5, gradient  1.5
#   A = -1,   ratio 0.5: min(-0.5, -0.8)        = -0.8  clipped below: loss  0.8, no gradient
#   A = -0.5, ratio 0.6: min(-0.3, -0.4)        = -0.4  clipped below: loss  0.4, no gradient
#   A = -0.5, ratio 1.3: min(-0.65, -0.6)       = -0.65 not clipped:   loss 0.65, gradient 0.65
# bnpo over the 6 tokens divides all of these by 6.
CLIP_RATIOS = [[1.5, 0.5], [1.5, 0.5], [0.6, 1.3]]
CLIP_ADV = torch.tensor([1.0, -1.0, -0.5])


@pytest.mark.parametrize(
    "epsilon, epsilon_high, per_token, grad, low, high",
    [
        (
            0.2,
            None,
            [[-1.2, -0.5], [1.5, 0.8], [0.4, 0.65]],
            [[0.0, -0.5], [1.5, 0.0], [0.0, 0.65]],
            2 / 6,
            1 / 6,
        ),
        # clip-higher moves only the upper bound: 1.4 still clips ratio 1.5, at 1.4 ...
        (
            0.2,
            0.4,
            [[-1.4, -0.5], [1.5, 0.8], [0.4, 0.65]],
            [[0.0, -0.5], [1.5, 0.0], [0.0, 0.65]],
            2 / 6,
            1 / 6,
        ),
        # ... 1.6 lets it through, while the lower bound stays at 0.8
        (
            0.2,
            0.6,
            [[-1.5, -0.5], [1.5, 0.8], [0.4, 0.65]],
            [[-1.5, -0.5], [1.5, 0.0], [0.0, 0.65]],
            2 / 6,
            0.0,
        ),
        # a symmetric 0.6 also moves the lower bound to 0.4: nothing is clipped
        (
            0.6,
            None,
            [[-1.5, -0.5], [1.5, 0.5], [0.3, 0.65]],
            [[-1.5, -0.5], [1.5, 0.5], [0.3, 0.65]],
            0.0,
            0.0,
        ),
    ],
)
def test_clipping_on_both_sides(epsilon, epsilon_high, per_token, grad, low, high):
    old = torch.tensor([[-1.0, -2.0], [-0.3, -1.7], [-0.8, -2.2]])
    logprobs = policy(old, CLIP_RATIOS)
    loss, stats = grpo_loss(
        logprobs,
        old,
        CLIP_ADV,
        torch.ones(3, 2),
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        loss_type="bnpo",
    )
    assert loss.item() == pytest.approx(sum(map(sum, per_token)) / 6, abs=ATOL)
    loss.backward()
    expected = torch.tensor(grad) / 6
    clipped = expected == 0
    assert (logprobs.grad[clipped] == 0).all()  # exactly zero, not small
    assert close(logprobs.grad, expected)
    assert stats["clip/low_frac"] == pytest.approx(low, abs=ATOL)
    assert stats["clip/high_frac"] == pytest.approx(high, abs=ATOL)
    assert stats["clip/region_frac"] == pytest.approx(low + high, abs=ATOL)
    assert stats["ratio/mean"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5 + 0.6 + 1.3) / 6, abs=ATOL)


def test_tokens_with_zero_advantage_are_never_counted_as_clipped():
    """Every ratio outside [0.8, 1.2]: the clip cuts the gradient of the A > 0 row's high ratios and
    of the A < 0 row's low ones; a token with A = 0 has no gradient to cut, whatever its ratio."""
    old = torch.zeros(3, 2)
    logprobs = policy(old, [[1.5, 1.5], [1.5, 0.5], [0.5, 0.5]])
    _, stats = grpo_loss(logprobs, old, torch.tensor([1.0, 0.0, -1.0]), torch.ones(3, 2), loss_type="bnpo")
    assert stats["clip/high_frac"] == pytest.approx(2 / 6, abs=ATOL)  # row 0's two tokens, not row 1's 1.5
    assert stats["clip/low_frac"] == pytest.approx(2 / 6, abs=ATOL)  # row 2's two tokens, not row 1's 0.5
    assert stats["clip/region_frac"] == pytest.approx(4 / 6, abs=ATOL)


def test_k3_is_zero_where_policy_and_reference_agree_and_positive_elsewhere():
    logprobs = torch.tensor([-0.1, -2.0, -5.0, -0.7, -12.0])
    assert k3(logprobs, logprobs.clone()).tolist() == [0.0] * 5  # exp(0) - 0 - 1, exactly
    d = torch.tensor([math.log(2), 0.5, -0.5, 3.0, -3.0])  # d = ref - logprobs
    kl = k3(logprobs, logprobs + d)
    assert (kl > 0).all()
    assert kl[0].item() == pytest.approx(2 - math.log(2) - 1, abs=ATOL)  # 0.306853
    assert kl[1].item() == pytest.approx(math.exp(0.5) - 0.5 - 1, abs=ATOL)  # 1.648721 - 1.5 = 0.148721
    assert kl[2].item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, abs=ATOL)  # 0.606531 - 0.5 = 0.106531


def test_beta_adds_beta_times_k3_per_token():
    # One sequence of 2 tokens, ratio 1, A = 1; the reference is log 2 above the policy on token 0.
    #   token 0: -1 + 0.1 * (exp(log 2) - log 2 - 1) = -1 + 0.1 * (1 - log 2)
    #   token 1: -1 + 0.1 * 0
    # Gradients: d(-ratio * A) = -1; d k3 / d logprobs = 1 - exp(d) = 1 - 2 = -1 on token 0, 0 on token 1.
    logprobs = torch.tensor([[-0.4, -1.3]], requires_grad=True)
    ref = logprobs.detach() + torch.tensor([[math.log(2), 0.0]])
    loss, stats = grpo_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs=ref, beta=0.1
    )
    assert loss.item() == pytest.approx((-1 + 0.1 * (1 - math.log(2)) - 1) / 2, abs=ATOL)  # -0.984657
    assert stats["kl"] == pytest.approx((1 - math.log(2)) / 2, abs=ATOL)
    loss.backward()
    assert close(logprobs.grad, [[(-1 + 0.1 * -1) / 2, -1 / 2]])  # -0.55, -0.5
    without, stats = grpo_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs=ref
    )
    # beta 0: the reference is ignored
    assert without.item() == pytest.approx(-1.0, abs=ATOL) and "kl" not in stats


def test_beta_without_a_reference_is_refused():
    with pytest.raises(ValueError, match="beta > 0 needs ref_logprobs"):
        grpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), beta=0.04)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_masked_tokens_get_neither_loss_nor_gradient(loss_type):
    pad = MASK == 0
    ref = OLD - 0.3
    clean = policy(OLD, RATIOS)
    # Garbage at the padding: log-probs of 100 (impossible), old 97 (ratio e^3 = 20), reference 90.
    garbage = clean.detach().masked_fill(pad, 100.0).requires_grad_()
    garbage_old, garbage_ref = OLD.masked_fill(pad, 97.0), ref.masked_fill(pad, 90.0)
    options = dict(beta=0.1, loss_type=loss_type)
    loss, stats = grpo_loss(clean, OLD, ADV, MASK, ref_logprobs=ref, **options)
    garbage_loss, garbage_stats = grpo_loss(
        garbage, garbage_old, ADV, MASK, ref_logprobs=garbage_ref, **options
    )
    assert torch.equal(loss, garbage_loss)
    assert stats == garbage_stats
    loss.backward()
    garbage_loss.backward()
    assert (garbage.grad[pad] == 0).all() and (clean.grad[pad] == 0).all()
    assert torch.equal(garbage.grad, clean.grad)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_masked_tokens_whose_ratio_overflows_change_nothing(advantage):
    # Padding holding logprobs 100 against old 0 (or old = -inf): exp(100) overflows float32 to inf.
    # The one real token has ratio 1, so the loss is -A and its gradient -A.
    logprobs = torch.tensor([[-1.0, 100.0]], requires_grad=True)
    loss, stats = grpo_loss(
        logprobs, torch.tensor([[-1.0, 0.0]]), torch.tensor([advantage]), torch.tensor([[1, 0]])
    )
    assert stats["ratio/mean"] == 1.0  # the padded log-ratio is zeroed before exp: no inf * 0
    assert loss.item() == -advantage
    loss.backward()
    assert logprobs.grad.tolist() == [[-advantage, 0.0]]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
@pytest.mark.parametrize("garbage", [math.nan, math.inf, -math.inf])
def test_advantages_on_padding_change_nothing_whatever_they_hold(loss_type, garbage):
    """NaN or inf advantages on masked tokens (per token), or on a row with no token in the loss (per
    completion): the loss, the stats and the gradient are those of zeros there."""
    pad = MASK == 0
    per_token = ADV.unsqueeze(1).expand(3, 4)  # (B, T): each row's advantage on every token
    with_a_dropped_row = MASK * torch.tensor([[1], [1], [0]])  # the third row in no token of the loss
    cases = [
        (MASK, per_token.masked_fill(pad, 0.0), per_token.masked_fill(pad, garbage)),
        (with_a_dropped_row, torch.tensor([1.0, -0.5, 0.0]), torch.tensor([1.0, -0.5, garbage])),
    ]
    for mask, clean, dirty in cases:
        results = []
        for advantages in (clean, dirty):
            logprobs = policy(OLD, RATIOS)
            loss, stats = grpo_loss(logprobs, OLD, advantages, mask, loss_type=loss_type)
            loss.backward()
            results.append((loss, stats, logprobs.grad))
        (loss, stats, grad), (dirty_loss, dirty_stats, dirty_grad) = results
        assert torch.isfinite(dirty_loss) and torch.equal(loss, dirty_loss)
        assert stats == dirty_stats
        assert torch.equal(grad, dirty_grad)


# Gradient accumulation: 4 sequences of lengths 4, 3, 1, 2 (10 tokens), as 2 micro-batches of 2
# (7 tokens, then 3). Ratios include clipped ones.
ACC_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
ACC_OLD = torch.tensor(
    [[-1.0, -2.0, -0.5, -3.0], [-0.2, -1.5, -0.9, -4.0], [-2.5, -4.0, -4.0, -4.0], [-0.6, -1.1, -4.0, -4.0]]
)
ACC_RATIOS = [[1.5, 0.5, 1.1, 0.95], [0.7, 1.3, 1.0, 1.0], [1.25, 1.0, 1.0, 1.0], [0.85, 1.05, 1.0, 1.0]]
ACC_ADV = torch.tensor([0.8, -1.2, 1.5, -0.4])
HALVES = (slice(0, 2), slice(2, 4))


def micro_batches(loss_type, **step):
    """Each micro-batch's loss, with gradients accumulated into one leaf, as a trainer would."""
    logprobs = policy(ACC_OLD, ACC_RATIOS)
    losses = []
    for rows in HALVES:
        loss, _ = grpo_loss(
            logprobs[rows], ACC_OLD[rows], ACC_ADV[rows], ACC_MASK[rows], loss_type=loss_type, **step
        )
        loss.backward()
        losses.append(loss.item())
    return losses, logprobs.grad


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_sum_to_the_full_batch(loss_type):
    logprobs = policy(ACC_OLD, ACC_RATIOS)
    full, _ = grpo_loss(logprobs, ACC_OLD, ACC_ADV, ACC_MASK, loss_type=loss_type)
    full.backward()
    # dr_grpo also needs the same max_completion_length in every micro-batch: here both have T = 4.
    losses, grad = micro_batches(loss_type, num_sequences=4, num_tokens=10)
    assert sum(losses) == pytest.approx(full.item(), abs=ATOL)
    assert close(grad, logprobs.grad)


def test_dapo_micro_batches_without_num_tokens_are_each_divided_by_their_own_tokens():
    (with0, with1), _ = micro_batches("dapo", num_tokens=10)
    (alone0, alone1), grad = micro_batches("dapo")
    assert alone0 == pytest.approx(with0 * 10 / 7, abs=ATOL)  # sum / 7 instead of sum / 10
    assert alone1 == pytest.approx(with1 * 10 / 3, abs=ATOL)  # sum / 3 instead of sum / 10
    assert abs((alone0 + alone1) - (with0 + with1)) > 0.1  # so the step's loss and gradient are wrong
    full = policy(ACC_OLD, ACC_RATIOS)
    grpo_loss(full, ACC_OLD, ACC_ADV, ACC_MASK, loss_type="dapo")[0].backward()
    assert not torch.allclose(grad, full.grad, atol=1e-3)


def test_bnpo_micro_batches_are_weighted_by_their_share_of_sequences():
    # Documented: bnpo is a per-batch token mean, scaled by batch / num_sequences = 2 / 4.
    (share0, share1), _ = micro_batches("bnpo", num_sequences=4)
    (alone0, alone1), _ = micro_batches("bnpo")
    assert share0 == pytest.approx(alone0 * 2 / 4, abs=ATOL) and share1 == pytest.approx(
        alone1 * 2 / 4, abs=ATOL
    )


@pytest.mark.parametrize(
    "loss_type, expected, grad_weight",
    [
        # Sequence means of -A: -1, +0.5, +0.5, whose mean is 0.
        ("grpo", 0.0, GRPO_WEIGHT),
        # Token level: -(1 * 4 - 0.5 * 2 - 0.5 * 3) = -1.5 over 9 tokens, or over 3 * 4 for dr_grpo.
        ("bnpo", -1.5 / 9, TOKEN_WEIGHT),
        ("dapo", -1.5 / 9, TOKEN_WEIGHT),
        ("dr_grpo", -1.5 / 12, DR_WEIGHT),
    ],
)
def test_first_iteration_ratio_is_exactly_one(loss_type, expected, grad_weight):
    # On the first pass over fresh samples (mu = 1) old_logprobs are the same numbers, detached:
    # the ratio is exactly 1, nothing is clipped, and the surrogate is just A_i on every token.
    # Advantages are centred within their group (here 1, -0.5, -0.5 sum to 0), so a per-sequence
    # mean like grpo's reads 0 (up to float error): the value says nothing at mu = 1, the gradient
    # -A_i / (tokens_i * B) per token is what trains. Token-level aggregations weight each A_i by
    # its sequence's length, so there the value is not 0.
    advantages = torch.tensor([1.0, -0.5, -0.5])
    logprobs = OLD.clone().requires_grad_()
    loss, stats = grpo_loss(logprobs, logprobs.detach(), advantages, MASK, loss_type=loss_type)
    assert loss.item() == pytest.approx(expected, abs=ATOL)
    assert stats["ratio/mean"] == 1.0
    assert stats["clip/low_frac"] == stats["clip/high_frac"] == 0.0
    loss.backward()
    minus_adv = [[-1.0] * 4, [0.5] * 4, [0.5] * 4]
    assert close(logprobs.grad, [[a * w for a, w in zip(ar, wr)] for ar, wr in zip(minus_adv, grad_weight)])


def good_inputs():
    return dict(
        logprobs=torch.zeros(3, 4),
        old_logprobs=torch.zeros(3, 4),
        advantages=torch.zeros(3),
        mask=torch.ones(3, 4),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(loss_type="ppo"),
            "loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, gmpo, dppo_tv, dppo_kl, "
            "reinforce, got 'ppo'",
        ),
        (dict(epsilon=0.0), "epsilon and epsilon_high must be > 0"),
        (dict(epsilon=-0.2), "epsilon and epsilon_high must be > 0"),
        (dict(epsilon_high=0.0), "epsilon and epsilon_high must be > 0"),
        (dict(beta=-0.1), "beta must be >= 0"),
        (dict(old_logprobs=torch.zeros(3, 3)), r"old_logprobs has shape \(3, 3\), logprobs \(3, 4\)"),
        (dict(mask=torch.ones(4, 3)), r"mask has shape \(4, 3\), logprobs \(3, 4\)"),
        (dict(ref_logprobs=torch.zeros(3, 5)), r"ref_logprobs has shape \(3, 5\), logprobs \(3, 4\)"),
        (
            dict(advantages=torch.zeros(3, 1)),
            r"advantages must have shape \(3,\), one per sequence, or \(3, 4\), one per token; got \(3, 1\)",
        ),
        (
            dict(advantages=torch.zeros(4)),
            r"advantages must have shape \(3,\), one per sequence, or .*; got \(4,\)",
        ),
    ],
)
def test_bad_arguments_are_refused_with_a_message(change, message):
    inputs = good_inputs()
    inputs.update(change)
    with pytest.raises(ValueError, match=message):
        grpo_loss(**inputs)
