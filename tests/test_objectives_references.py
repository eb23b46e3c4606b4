"""Each estimator and loss of the objectives menu against the reference implementation's own code, on random
batches: verl 0.9.1's core_algos.py (tests/verl_reference.py, run from its wheel) and TRL 1.16's
GRPOTrainer._compute_loss (tests/trl_reference.py). Values and gradients agree to 1e-6.

The batches have ragged masks, groups whose rewards are all equal, G = 2 and G = 16, advantages of both
signs and ratios far outside the clip range (log-ratios up to +-3: inside verl's clamp of +-20, which
minigrpo does not apply). Where a reference applies a detail minigrpo does not, the test says so and
sets the reference so that the detail does not act, or sets minigrpo to the reference's value:
- verl's grpo and grpo_passk add 1e-6 to the std, minigrpo 1e-4 (TRL's): verl's functions are called
  with epsilon=1e-4.
- verl's cispo clips its weight below at 1 - clip_ratio_low too: compared with clip_ratio_low = 1
  (the bound 0, which a ratio never reaches); TRL's cispo caps at epsilon_high itself, minigrpo's at
  1 + epsilon_high.
- verl's seq-mean-token-mean (sapo, vanilla) leaves fully masked rows out of the count of sequences;
  minigrpo's grpo aggregation counts every row (as TRL's): the batches here have no empty row.
- verl's dppo truncates at config.get("clip_ratio_c", 20.0), which ActorConfig's field (3.0) answers;
  minigrpo's default is the function's 20: compared with the value set on both.
- verl's clip_cov draws its choice from torch's default generator: both are seeded alike and minigrpo
  is given no generator of its own, so it draws from the same.
"""

import numpy as np
import pytest
import torch

from minigrpo import GRPOConfig
from minigrpo.update import EntropyCoefficient, objective_from, objective_loss
from minigrpo.update.advantages import EPS
from minigrpo.update.estimators import estimator_for, kl_shaped_returns

ATOL = 1e-6


def batch(G, groups=4, T=7, seed=0, flat_groups=(1,), scale=2.0):
    """Rewards (N,) group by group (the groups in `flat_groups` all equal), a ragged mask (N, T) with every
    row holding a token, the group of each row, and each row's loss tokens."""
    g = torch.Generator().manual_seed(seed)
    N = G * groups
    rewards = (torch.rand(N, generator=g, dtype=torch.float64) * scale).round(decimals=1)
    for flat in flat_groups:
        rewards[flat * G : (flat + 1) * G] = 0.5
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()  # (N, T)
    index = [i // G for i in range(N)]
    return rewards, mask, index, lengths.tolist()


def verl_outcome(verl_reference, name, rewards, mask, index, **settings):
    """verl's per-completion advantage: its (N, T) advantages on each row's first token (all equal)."""
    advantages, _ = verl_reference.advantages(name, rewards, mask, index, **settings)
    return advantages[:, 0]


def ours(settings, rewards, G, lengths):
    return estimator_for(GRPOConfig(num_generations=G, **settings))(rewards, G, lengths)


@pytest.mark.parametrize("G", [2, 16])
@pytest.mark.parametrize("seed", [0, 1])
def test_rloo_and_the_reinforce_plus_plus_estimators_equal_verls(verl_reference, G, seed):
    rewards, mask, index, lengths = batch(G, seed=seed)
    for name in ("rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus"):
        got = ours(dict(advantage_estimator=name), rewards, G, lengths)
        expected = verl_outcome(verl_reference, name, rewards, mask, index, gamma=1.0)
        torch.testing.assert_close(got, expected.double(), rtol=0, atol=ATOL, msg=name)


@pytest.mark.parametrize("G", [2, 16])
@pytest.mark.parametrize("scale", ["group", "none"])
def test_grpo_and_grpo_passk_equal_verls_at_minigrpos_eps(verl_reference, G, scale):
    """verl adds 1e-6 to the std by default; its functions take the epsilon, so they get minigrpo's 1e-4."""
    rewards, mask, index, lengths = batch(G, seed=3)
    core = verl_reference.load().core_algos
    token_rewards = verl_reference.token_rewards(rewards, mask)
    config = verl_reference.algo_config(norm_adv_by_std_in_grpo=scale == "group")
    for name, function in (
        ("grpo", core.compute_grpo_outcome_advantage),
        ("grpo_passk", core.compute_grpo_passk_outcome_advantage),
    ):
        expected, _ = function(
            token_level_rewards=token_rewards,
            response_mask=mask,
            index=np.array(verl_reference.uids(index)),
            epsilon=EPS,
            norm_adv_by_std_in_grpo=scale == "group",
            config=config,
        )
        got = ours(dict(advantage_estimator=name, scale_rewards=scale), rewards, G, lengths)
        torch.testing.assert_close(got, expected[:, 0].double(), rtol=0, atol=ATOL, msg=name)


def test_reinforce_plus_plus_with_its_kl_in_the_rewards_equals_verls(verl_reference):
    """beta > 0: verl's apply_kl_penalty (kl = old - ref, on the valid tokens) then its returns, whitened."""
    G = 4
    rewards, mask, index, lengths = batch(G, seed=5)
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3  # (N, T): the sampler's log-probs
    ref = old + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3
    beta = 0.2
    token_rewards, _ = verl_reference.kl_in_reward(rewards, mask, old, ref, kl_coef=beta)
    expected, _ = verl_reference.advantages("reinforce_plus_plus", token_rewards, mask, index, gamma=1.0)
    kls = [(old[i] - ref[i])[: lengths[i]] for i in range(len(lengths))]  # each row's loss tokens
    got = kl_shaped_returns(rewards, kls, beta)
    for i, row in enumerate(got):
        torch.testing.assert_close(row, expected[i, : lengths[i]].double(), rtol=0, atol=ATOL)


# -- losses --------------------------------------------------------------------------------------------
def tokens(seed=0, B=6, T=7, spread=3.0):
    """Log-probs with grad, old log-probs, per-completion advantages of both signs, a ragged mask (no empty
    row), entropies with grad: log-ratios up to +-spread, far outside any clip range."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.05
    logprobs = (old + (torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 1) * spread).clamp(max=-1e-3)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    advantages[0] = 0.0  # a token with no signal
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    entropies = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    return logprobs.requires_grad_(), old, advantages, mask, entropies.requires_grad_()


def compare(ours_loss, reference_loss, leaves):
    """Equal values and equal gradients with respect to each leaf."""
    assert ours_loss.item() == pytest.approx(reference_loss.item(), abs=ATOL)
    mine = torch.autograd.grad(ours_loss, leaves, retain_graph=True, allow_unused=True)
    theirs = torch.autograd.grad(reference_loss, leaves, retain_graph=True, allow_unused=True)
    for a, b in zip(mine, theirs):
        a = torch.zeros_like(leaves[0]) if a is None else a
        b = torch.zeros_like(leaves[0]) if b is None else b
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def minigrpo_loss(settings, logprobs, old, advantages, mask, **kwargs):
    objective = objective_from(GRPOConfig(max_completion_length=mask.shape[1], **settings))
    return objective_loss(objective, logprobs, old, advantages, mask, **kwargs)


# loss_type -> verl's loss_agg_mode of the same aggregation (one micro-batch is the whole step)
AGGREGATION = {"dapo": "token-mean", "grpo": "seq-mean-token-mean"}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
@pytest.mark.parametrize("high", [None, 0.28])
def test_dual_clip_equals_verls_vanilla_loss(verl_reference, seed, loss_type, high):
    logprobs, old, advantages, mask, _ = tokens(seed)
    adv = advantages[:, None].expand_as(mask)
    settings = dict(loss_type=loss_type, clip_ratio_c=3.0, epsilon_high=high)
    loss, stats = minigrpo_loss(settings, logprobs, old, advantages, mask)
    reference, metrics = verl_reference.policy_loss(
        "vanilla",
        old,
        logprobs,
        adv,
        mask,
        AGGREGATION[loss_type],
        clip_ratio=0.2,
        clip_ratio_high=high if high is not None else 0.2,
        clip_ratio_c=3.0,
    )
    compare(loss, reference, [logprobs])
    assert stats["clip/dual_frac"] == pytest.approx(metrics["actor/pg_clipfrac_lower"], abs=ATOL)
    assert stats["clip/dual_frac"] > 0  # some negative advantage met a ratio above 3


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_equals_verls_geo_mean(verl_reference, seed):
    logprobs, old, advantages, mask, _ = tokens(seed)
    loss, _ = minigrpo_loss(dict(loss_type="gmpo", epsilon=0.4), logprobs, old, advantages, mask)
    reference, _ = verl_reference.policy_loss(
        "geo_mean",
        old,
        logprobs,
        advantages[:, None].expand_as(mask),
        mask,
        clip_ratio_low=0.4,
        clip_ratio_high=0.4,
    )
    compare(loss, reference, [logprobs])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("cap", [20.0, 2.0])
def test_dppo_equals_verls(verl_reference, seed, name, cap):
    logprobs, old, advantages, mask, _ = tokens(seed, spread=1.0)
    settings = dict(loss_type=name, epsilon=0.1, epsilon_high=0.15, clip_ratio_c=cap)
    loss, stats = minigrpo_loss(settings, logprobs, old, advantages, mask)
    reference, metrics = verl_reference.policy_loss(
        name,
        old,
        logprobs,
        advantages[:, None].expand_as(mask),
        mask,
        "token-mean",
        clip_ratio_low=0.1,
        clip_ratio_high=0.15,
        clip_ratio_c=cap,
    )
    compare(loss, reference, [logprobs])
    assert stats["clip/region_frac"] > 0  # some tokens moved past the thresholds and were masked


@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_equals_verls_and_trls(verl_reference, trl_reference, seed):
    logprobs, old, advantages, mask, entropies = tokens(seed)
    loss, _ = minigrpo_loss(dict(loss_type="cispo", epsilon_high=2.0), logprobs, old, advantages, mask)
    verl, _ = verl_reference.policy_loss(
        "cispo",
        old,
        logprobs,
        advantages[:, None].expand_as(mask),
        mask,
        "token-mean",
        clip_ratio_low=1.0,  # verl's lower bound at 0: it never acts, as minigrpo has none
        clip_ratio_high=2.0,
    )
    compare(loss, verl, [logprobs])
    trl, _ = trl_reference.loss("cispo", logprobs, old, advantages, mask, entropies, epsilon_high=3.0)
    compare(loss, trl, [logprobs])  # TRL's epsilon_high is the cap, 1 + minigrpo's


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sapo_equals_trls_and_verls(verl_reference, trl_reference, seed):
    logprobs, old, advantages, mask, entropies = tokens(seed, spread=2.0)
    settings = dict(loss_type="sapo", sapo_temperature_pos=1.2, sapo_temperature_neg=1.6)
    loss, _ = minigrpo_loss(settings, logprobs, old, advantages, mask)
    trl, _ = trl_reference.loss(
        "sapo", logprobs, old, advantages, mask, entropies, sapo_temperature_pos=1.2, sapo_temperature_neg=1.6
    )
    compare(loss, trl, [logprobs])
    verl, _ = verl_reference.policy_loss(
        "sapo", old, logprobs, advantages[:, None].expand_as(mask), mask, tau_pos=1.2, tau_neg=1.6
    )
    compare(loss, verl, [logprobs])


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_equals_verls_gpg_loss(verl_reference, seed):
    """-A log p, no ratio: verl's gpg policy loss (token-mean); minigrpo's reinforce (dapo's aggregation)."""
    logprobs, old, advantages, mask, _ = tokens(seed)
    loss, _ = minigrpo_loss(dict(loss_type="reinforce"), logprobs, old, advantages, mask)
    reference, _ = verl_reference.policy_loss("gpg", old, logprobs, advantages[:, None].expand_as(mask), mask)
    compare(loss, reference, [logprobs])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ratio", [0.05, 0.5])
def test_clip_cov_equals_verls(verl_reference, seed, ratio):
    """More candidates than the ratio clips at 0.05 (a random choice: both draw from torch's generator,
    seeded alike), every candidate at 0.5."""
    logprobs, old, advantages, mask, _ = tokens(seed, B=12, spread=0.3)
    settings = dict(
        loss_type="dapo",
        covariance_control="clip_cov",
        clip_cov_ratio=ratio,
        clip_cov_lb=0.0,
        clip_cov_ub=3.0,
    )
    torch.manual_seed(seed)
    loss, stats = minigrpo_loss(settings, logprobs, old, advantages, mask)
    torch.manual_seed(seed)
    reference, metrics = verl_reference.policy_loss(
        "clip_cov",
        old,
        logprobs,
        advantages[:, None].expand_as(mask),
        mask,
        "token-mean",
        clip_cov_ratio=ratio,
        clip_cov_lb=0.0,
        clip_cov_ub=3.0,
    )
    compare(loss, reference, [logprobs])
    assert stats["cov/selected_frac"] == pytest.approx(metrics["actor/pg_clipfrac"], abs=ATOL)
    assert stats["cov/selected_frac"] > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_kl_cov_equals_verls(verl_reference, seed, loss_type):
    logprobs, old, advantages, mask, _ = tokens(seed, B=12, spread=0.5)
    settings = dict(loss_type=loss_type, covariance_control="kl_cov", kl_cov_ratio=0.1, ppo_kl_coef=0.3)
    loss, stats = minigrpo_loss(settings, logprobs, old, advantages, mask)
    reference, _ = verl_reference.policy_loss(
        "kl_cov",
        old,
        logprobs,
        advantages[:, None].expand_as(mask),
        mask,
        AGGREGATION[loss_type],
        kl_cov_ratio=0.1,
        ppo_kl_coef=0.3,
    )
    compare(loss, reference, [logprobs])
    assert stats["cov/selected_frac"] == pytest.approx(int(mask.sum() * 0.1) / mask.sum().item(), abs=ATOL)


# -- the entropy bonus and its adaptive coefficient, against TRL ---------------------------------------------
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "sapo"])
def test_the_entropy_bonus_equals_trls(trl_reference, loss_type):
    logprobs, old, advantages, mask, entropies = tokens(4, spread=0.2)
    loss, _ = minigrpo_loss(
        dict(loss_type=loss_type), logprobs, old, advantages, mask, entropies=entropies, entropy_coef=0.3
    )
    reference, _ = trl_reference.loss(loss_type, logprobs, old, advantages, mask, entropies, entropy_coef=0.3)
    compare(loss, reference, [logprobs, entropies])


def test_the_adaptive_coefficient_and_each_micro_batchs_loss_equal_trls(trl_reference):
    """Five optimizer steps of two micro-batches each (equal token counts, where TRL's per-micro-batch token
    mean over the accumulation steps is the step's token mean), entropies crossing the target: the
    coefficient after each step, and every micro-batch's loss (bonus included), agree."""
    settings = dict(entropy_coef=0.05, entropy_target=1.0, entropy_coef_delta=0.02, entropy_coef_min=0.01)
    trl = trl_reference.AdaptiveEntropy(2, **settings)
    ours_coef = EntropyCoefficient(coef=0.05, adaptive=True, target=1.0, delta=0.02, low=0.01, high=1.0)
    objective = objective_from(GRPOConfig(loss_type="dapo", max_completion_length=4))
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 4, dtype=torch.float64)
    for level in (0.5, 0.7, 1.5, 0.2, 0.9):  # each step's entropies around this level
        micro = []
        for _ in range(2):
            old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
            micro.append(
                dict(
                    per_token_logps=(old + 0.1).requires_grad_(),
                    old_per_token_logps=old,
                    advantages=torch.randn(3, generator=g, dtype=torch.float64),
                    completion_mask=mask,
                    num_items_in_batch=torch.tensor(24.0),  # the step's tokens, as TRL counts them
                    entropies=(
                        level + 0.1 * torch.rand(3, 4, generator=g, dtype=torch.float64)
                    ).requires_grad_(),
                )
            )
        reference_losses = trl.step(micro)
        applied = ours_coef.applied()
        entropy_sum = 0.0
        for m, reference in zip(micro, reference_losses):
            loss, stats = objective_loss(
                objective,
                m["per_token_logps"],
                m["old_per_token_logps"],
                m["advantages"],
                m["completion_mask"],
                entropies=m["entropies"],
                entropy_coef=applied,
                num_sequences=6,
                num_tokens=24,
            )
            compare(loss, reference, [m["per_token_logps"], m["entropies"]])
            entropy_sum += stats["entropy"] * stats["tokens"]
        ours_coef.after_step(entropy_sum / 24)
        assert ours_coef.coef == pytest.approx(trl.entropy_coef, abs=1e-12)
        assert ours_coef.last_entropy == pytest.approx(trl.last_step_entropy, abs=1e-9)
