"""The objectives menu beside its references: each estimator, loss and entropy control trains, is chosen
once, keeps gradient accumulation exact, resumes bit for bit, and refuses what it cannot do in one line.
Equality with verl's and TRL's own code: test_objectives_references.py."""

import itertools
import math

import pytest
import torch
from helpers import ROWS, VOWELS, tiny_train_config

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, Trainer
from minigrpo.rollout import Rollout
from minigrpo.run import Trace
from minigrpo.update import EntropyCoefficient, grpo_loss, objective_from, objective_loss
from minigrpo.update.estimators import estimator_for, kl_shaped_returns, passk, whiten_over_tokens
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward


def _has_vowel_x(completions, **_):
    """A 0/1 reward for pass@k: 1 if the completion holds an 'x' or an 'e'."""
    return [float("x" in text or "e" in text) for text in completions]


if "objectives_binary" not in REWARD_FUNCTIONS:
    register_reward("objectives_binary")(_has_vowel_x)

# Every new choice, as the GRPOConfig fields that select it (with num_iterations 2 the ratio moves from 1 in
# the second pass, so the clips, gates and masks act).
OPTIONS = {
    "rloo": dict(advantage_estimator="rloo"),
    "reinforce_plus_plus": dict(advantage_estimator="reinforce_plus_plus"),
    "reinforce_plus_plus_kl": dict(advantage_estimator="reinforce_plus_plus", beta=0.05),
    "reinforce_plus_plus_baseline": dict(advantage_estimator="reinforce_plus_plus_baseline"),
    "grpo_passk": dict(advantage_estimator="grpo_passk"),
    "passk": dict(advantage_estimator="passk", pass_k=2),
    "maxrl": dict(advantage_estimator="maxrl"),
    "lite_ppo": dict(scale_rewards="batch", loss_type="dapo"),
    "dual_clip": dict(clip_ratio_c=3.0),
    "sapo": dict(loss_type="sapo"),
    "gmpo": dict(loss_type="gmpo", epsilon=0.4),
    "dppo_tv": dict(loss_type="dppo_tv"),
    "dppo_kl": dict(loss_type="dppo_kl", epsilon=0.05),
    "reinforce": dict(loss_type="reinforce"),
    "entropy_bonus": dict(entropy_coef=0.01),
    "adaptive_entropy": dict(use_adaptive_entropy=True, entropy_target=5.0, entropy_coef=0.01),
    "clip_cov": dict(covariance_control="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=-5.0),
    "kl_cov": dict(covariance_control="kl_cov", kl_cov_ratio=0.05),
}
# the stats that name what an option did, beside the ones every step logs
OWN_STATS = {
    "reinforce_plus_plus_kl": ["kl"],
    "dual_clip": ["clip/dual_frac"],
    "dppo_tv": ["clip/truncated_frac"],
    "dppo_kl": ["clip/truncated_frac"],
    "entropy_bonus": ["entropy/coef", "entropy/coef_applied"],
    "adaptive_entropy": ["entropy/coef", "entropy/coef_applied"],
    "clip_cov": ["cov/selected_frac"],
    "kl_cov": ["cov/selected_frac"],
}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


def make_trainer(checkpoint, tmp_path, reward=VOWELS, train_settings=None, **settings):
    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    grpo = GRPOConfig(num_generations=4, max_completion_length=12, num_iterations=2, **settings)
    train = tiny_train_config(
        tmp_path / "run", **{"max_steps": 3, "micro_batch_size": 3, **(train_settings or {})}
    )
    return Trainer(model, tokenizer, Task(ROWS, [RewardSpec(reward)]), grpo, train)


@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_trains_and_is_named(checkpoint, tmp_path, option):
    reward = "objectives_binary" if option == "passk" else VOWELS
    trainer = make_trainer(checkpoint, tmp_path, reward, **OPTIONS[option])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    lines = []
    for step in range(3):
        stats, _ = trainer.train_step(Trace(write=lines.append) if step == 0 else None)
        assert stats["skipped"] == 0.0, option
        assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float)), option
        for name in OWN_STATS.get(option, []):
            assert name in stats, (option, name)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    named = trainer.describe_objective()
    for value in OPTIONS[option].values():
        if isinstance(value, str):
            assert value in named, (option, named)
    text = "\n".join(lines)
    assert trainer.updater.objective.describe() in text  # the trace's stage 4 names it
    if trainer.grpo.advantage_estimator != "grpo":
        assert f"advantage_estimator={trainer.grpo.advantage_estimator}" in text
    if trainer.grpo.kl_in_reward:  # the KL's weight is named though the loss has none
        assert "kl_in_reward beta=0.05" in named


# what exists already, each beside the new options (DDP: tests/test_distributed.py's "menu" objective)
BESIDE = {
    "lora": (dict(lora_rank=4), {}),
    "sampler_correction": ({}, dict(sampler_correction="token_truncate", sampler_correction_cap=1.5)),
    "gspo": ({}, dict(importance_sampling_level="sequence")),
}


@pytest.mark.parametrize("beside", BESIDE)
@pytest.mark.parametrize(
    "option",
    # an estimator, REINFORCE++'s per-token returns, a new loss, one GSPO refuses, an entropy control, a
    # covariance control (the other options share these paths: test_each_option_trains_and_is_named)
    ["rloo", "reinforce_plus_plus_kl", "sapo", "dppo_kl", "adaptive_entropy", "clip_cov"],
)
def test_each_option_trains_beside_lora_the_sampler_correction_and_gspo(checkpoint, tmp_path, option, beside):
    """Two steps, none skipped, every stat finite; or, where the two do not combine, one line naming
    both settings before anything is built."""
    train_settings, grpo_settings = BESIDE[beside]
    try:
        GRPOConfig(**OPTIONS[option], **grpo_settings)
    except ValueError as error:
        assert beside == "gspo", error  # LoRA and the sampler correction combine with every option
        named = [key for key in OPTIONS[option] if key in str(error)] + [
            value for value in OPTIONS[option].values() if isinstance(value, str) and value in str(error)
        ]
        assert "importance_sampling_level" in str(error) and named, error
        return
    train_settings, grpo_settings = BESIDE[beside]
    trainer = make_trainer(
        checkpoint, tmp_path, train_settings=train_settings, **OPTIONS[option], **grpo_settings
    )
    base = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    for _ in range(2):
        stats, _ = trainer.train_step()
        assert stats["skipped"] == 0.0 and all(
            math.isfinite(v) for v in stats.values() if isinstance(v, float)
        )
    after = trainer.model.state_dict()
    if beside == "lora":  # the adapters moved, the base did not
        assert all(torch.equal(after[k], v) for k, v in base.items())
        assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in after.items() if "lora_B" in k)
    if beside == "sampler_correction":
        assert "sampler_correction/truncated_frac" in stats


@pytest.mark.parametrize("lengths", [[10] * 4 + [2] * 4, [2] * 4 + [10] * 4])
def test_the_references_log_probs_come_back_in_the_rollouts_order(checkpoint, tmp_path, lengths):
    """REINFORCE++ with beta > 0 takes the reference's log-probs before stage 4. A token budget orders the
    micro-batches by length, and the log-probs must still come back in the rollouts' order (they came in
    the budget's: the default job crashed on the first step whose groups differed in length)."""
    trainer = make_trainer(
        checkpoint,
        tmp_path,
        train_settings=dict(micro_batch_tokens=64, micro_batch_size=8),
        advantage_estimator="reinforce_plus_plus",
        beta=0.05,
    )
    rollouts = [
        Rollout([1, 2, 3], [5 + (i + t) % 7 for t in range(n)], "length", sampler_logprobs=torch.zeros(n))
        for i, n in enumerate(lengths)
    ]
    got = trainer.updater.reference_logprobs(rollouts)
    assert [len(logprobs) for logprobs in got] == lengths
    for rollout, logprobs in zip(rollouts, got):  # each its own: the same as computed for its group alone
        group = rollouts[rollouts.index(rollout) // 4 * 4 :][:4]
        alone = trainer.updater.reference_logprobs(group)[group.index(rollout)]
        torch.testing.assert_close(logprobs, alone, rtol=0, atol=1e-6)


def test_a_run_without_an_entropy_bonus_has_no_coefficient_to_log_or_save(checkpoint, tmp_path):
    """The bonus is chosen once: without one there is no coefficient, no entropy/coef in the metrics (the
    default run's lines stay as they were) and nothing of it in a checkpoint."""
    trainer = make_trainer(checkpoint, tmp_path)
    stats, _ = trainer.train_step()
    assert trainer.updater.entropy is None and trainer.updater.entropy_state() is None
    assert not any(name.startswith("entropy/") for name in stats)


def test_the_objective_is_a_record_built_once_and_each_micro_batch_reads_it(
    checkpoint, tmp_path, monkeypatch
):
    """The updater builds its Objective when it is built; changing GRPOConfig afterwards changes nothing,
    and objective_from is not called on any step."""
    trainer = make_trainer(checkpoint, tmp_path, loss_type="sapo")
    built = trainer.updater.objective
    calls = []
    monkeypatch.setattr(minigrpo.update.loss, "objective_from", lambda grpo: calls.append(grpo))
    trainer.grpo.loss_type = "grpo"  # read nowhere after the build
    trainer.train_step()
    assert calls == [] and trainer.updater.objective is built and built.loss_type == "sapo"


# -- the estimators beside hand computations that are not their formulas ----------------------------------
def brute_force_passk_advantages(rewards: list[float], k: int) -> list[float]:
    """Pass@k training's advantages from first principles: each completion's reward in a k-subset is the
    subset's max; its advantage is the mean over the k-subsets holding it of (that max - the group's
    mean pass@k), over the std of pass@k across subsets (Chen et al., 2025, sec. 3)."""
    N = len(rewards)
    subsets = list(itertools.combinations(range(N), k))
    passes = [max(rewards[i] for i in s) for s in subsets]
    mean = sum(passes) / len(passes)
    std = math.sqrt(sum((p - mean) ** 2 for p in passes) / len(passes))
    if std == 0:
        return [0.0] * N
    out = []
    for i in range(N):
        holding = [p for s, p in zip(subsets, passes) if i in s]
        out.append((sum(holding) / len(holding) - mean) / std)
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 6])
@pytest.mark.parametrize(
    "rewards", [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 0], [0] * 6, [1] * 6, [1, 1, 1, 1, 1, 0]]
)
def test_the_analytic_passk_advantage_is_the_subsets_average(rewards, k):
    got = passk(torch.tensor(rewards, dtype=torch.float64), len(rewards), k=k).tolist()
    assert got == pytest.approx(brute_force_passk_advantages(rewards, k), abs=1e-12)


def test_the_estimators_the_config_chooses_for_passk_and_maxrl():
    """MaxRL by hand: (r - mean) / (mean + eps), a group of equal rewards 0 (none right, or all); pass@k
    through GRPOConfig reads its pass_k."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 0.5, 0.0])
    maxrl = estimator_for(GRPOConfig(num_generations=4, advantage_estimator="maxrl"))(rewards, 4, None)
    right, wrong = (1 - 0.25) / (0.25 + 1e-4), (0 - 0.25) / (0.25 + 1e-4)
    expected = [right, wrong, wrong, wrong] + [0.0] * 8 + [x / (0.5 + 1e-4) for x in (0.0, 0.5, 0.0, -0.5)]
    assert maxrl.tolist() == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match=r"advantage_estimator='maxrl' needs rewards >= 0 .*got -0.5"):
        estimator_for(GRPOConfig(num_generations=4, advantage_estimator="maxrl"))(-rewards / 2, 4, None)
    binary = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    config = GRPOConfig(num_generations=4, advantage_estimator="passk", pass_k=3)
    assert estimator_for(config)(binary, 4, None).tolist() == pytest.approx(
        brute_force_passk_advantages([1, 0, 0, 0], 3) + brute_force_passk_advantages([1, 1, 0, 0], 3),
        abs=1e-12,
    )


def test_whitening_with_fewer_than_two_tokens_gives_no_advantage():
    """One token in the whole batch has no spread to whiten by (verl refuses it): advantages 0, not NaN."""
    assert whiten_over_tokens(torch.tensor([1.0, 0.5], dtype=torch.float64), [1, 0]).tolist() == [0.0, 0.0]
    # two tokens are enough: mean 0.5, unbiased variance 0.5
    two = whiten_over_tokens(torch.tensor([1.0, 0.0], dtype=torch.float64), [1, 1])
    assert two.tolist() == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)])
    returns = kl_shaped_returns(torch.tensor([1.0, 0.0]), [torch.tensor([0.3]), torch.tensor([])], 0.1)
    assert [r.tolist() for r in returns] == [[0.0], []]


def test_passk_refuses_rewards_other_than_zero_and_one():
    with pytest.raises(ValueError, match=r"advantage_estimator='passk' needs rewards of 0 or 1 .*got 0.5"):
        passk(torch.tensor([1.0, 0.5, 0.0, 1.0]), 4, k=2)


def test_whitening_weighs_each_completion_by_its_tokens():
    """verl whitens a (B, T) batch over its valid tokens: a completion of 3 tokens counts 3 times."""
    values = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)  # the last far from the tokens' mean
    lengths = [3, 1, 0]
    tokens = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)  # the 4 valid tokens, repeated
    expected = (tokens - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8)
    got = whiten_over_tokens(values, lengths)
    assert got[0].item() == pytest.approx(expected[0].item()) and got[1].item() == pytest.approx(
        expected[3].item()
    )
    assert got[2].item() == 0.0  # no token in the loss: no advantage


@pytest.mark.parametrize("loss_type", ["dppo_tv", "dppo_kl"])
def test_dppo_truncates_its_importance_weight_at_20_unless_clip_ratio_c_says_otherwise(loss_type):
    """One kept token whose ratio is 20.5 (p 0.01 -> 0.205, a move inside the trust region): its detached
    weight is cut to verl's default 20, or to clip_ratio_c where that is set."""
    old = torch.tensor([[math.log(0.01)]], dtype=torch.float64)
    new = torch.tensor([[math.log(0.205)]], dtype=torch.float64)
    advantage, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1)
    settings = (
        dict(loss_type=loss_type, epsilon=0.25) if loss_type == "dppo_kl" else dict(loss_type=loss_type)
    )
    loss, stats = grpo_loss(new, old, advantage, mask, **settings)
    assert loss.item() == pytest.approx(-20.0 * math.log(0.205)) and stats["clip/truncated_frac"] == 1.0
    loss, stats = grpo_loss(new, old, advantage, mask, clip_ratio_c=25.0, **settings)
    assert loss.item() == pytest.approx(-20.5 * math.log(0.205)) and stats["clip/truncated_frac"] == 0.0


@pytest.mark.parametrize("control", ["clip_cov", "kl_cov"])
def test_a_covariance_control_takes_at_least_one_token(control):
    """verl's max(int(share * tokens), 1): a share of 5% of 6 tokens is still one token, not none."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    new = old + 0.01 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    advantages, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 3)
    bounds = dict(clip_cov_lb=-100.0, clip_cov_ub=100.0) if control == "clip_cov" else {}
    share = dict(clip_cov_ratio=0.05) if control == "clip_cov" else dict(kl_cov_ratio=0.05)
    _, stats = grpo_loss(new, old, advantages, mask, covariance_control=control, **bounds, **share)
    assert stats["cov/selected_frac"] == pytest.approx(1 / 6)


# -- the loss: exact shares under accumulation, the entropy bonus ---------------------------------------
def ragged_batch(seed=0, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])[:B]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    old = -torch.rand(B, T, generator=g) * 3  # (B, T)
    logprobs = (old + torch.randn(B, T, generator=g) * 0.4).requires_grad_()
    advantages = torch.randn(B, generator=g)
    entropies = (torch.rand(B, T, generator=g) * 2).requires_grad_()
    return logprobs, old, advantages, mask, entropies


@pytest.mark.parametrize(
    "settings",
    [
        dict(loss_type="dapo", entropy=0.1),
        dict(loss_type="grpo", entropy=0.1),
        dict(loss_type="dppo_tv"),
        dict(loss_type="reinforce"),
        dict(loss_type="gmpo", epsilon=0.4),
        dict(loss_type="sapo"),
        dict(loss_type="cispo", entropy=0.3),
        dict(loss_type="grpo", clip_ratio_c=2.0),
    ],
)
def test_micro_batches_sum_to_the_whole_batch(settings):
    """With the step's totals passed, the micro-batches' losses and gradients add up to the whole batch's,
    the entropy bonus's too."""
    settings = dict(settings)
    coef = settings.pop("entropy", 0.0)
    objective = objective_from(GRPOConfig(max_completion_length=5, **settings))
    logprobs, old, advantages, mask, entropies = ragged_batch()
    totals = dict(num_sequences=6, num_tokens=int(mask.sum()))
    whole, _ = objective_loss(
        objective, logprobs, old, advantages, mask, entropies=entropies, entropy_coef=coef
    )
    whole.backward()
    grads = (logprobs.grad.clone(), entropies.grad.clone() if coef else None)
    logprobs.grad = None
    entropies.grad = None
    parts = 0.0
    for rows in ([0, 3], [1, 2, 4], [5]):
        part, _ = objective_loss(
            objective,
            logprobs[rows],
            old[rows],
            advantages[rows],
            mask[rows],
            entropies=entropies[rows],
            entropy_coef=coef,
            **totals,
        )
        part.backward()
        parts += part.item()
    assert parts == pytest.approx(whole.item(), abs=1e-6)
    assert torch.allclose(logprobs.grad, grads[0], atol=1e-6)
    if coef:
        assert torch.allclose(entropies.grad, grads[1], atol=1e-7)


def test_the_entropy_bonus_is_the_step_token_mean_of_the_entropies():
    logprobs, old, advantages, mask, entropies = ragged_batch()
    without, _ = grpo_loss(logprobs, old, advantages, mask, entropies=entropies)
    with_bonus, _ = grpo_loss(logprobs, old, advantages, mask, entropies=entropies, entropy_coef=0.25)
    token_mean = (entropies * mask).sum() / mask.sum()
    assert (without - with_bonus).item() == pytest.approx(0.25 * token_mean.item(), abs=1e-7)
    with_bonus.backward()
    assert torch.allclose(entropies.grad, -0.25 * mask / mask.sum())  # d loss / d H: -coef per token


def test_the_adaptive_coefficient_follows_the_entropy_within_its_bounds():
    control = EntropyCoefficient(coef=0.01, adaptive=True, target=1.0, delta=0.004, low=0.0, high=0.015)
    applied = []
    for entropy in (0.5, 0.5, 2.0, 0.2, 0.2, 0.2):
        applied.append(control.applied())
        control.after_step(entropy)
    # none before a measurement, then the coefficient of the step before, only while at or below the target
    assert applied == pytest.approx([0.0, 0.014, 0.015, 0.0, 0.015, 0.015])
    assert control.coef == pytest.approx(0.015)  # capped at the upper bound


def test_a_fixed_coefficient_stays_what_it_was_set_to():
    control = EntropyCoefficient(coef=0.01, adaptive=False, target=1.0, delta=0.004, low=0.0, high=0.015)
    for entropy in (0.5, 2.0):
        control.after_step(entropy)
        assert control.applied() == control.coef == 0.01


def test_the_coefficients_state_reads_back_what_the_next_step_applies():
    """A checkpoint keeps the coefficient and the last entropy: the gate of the step after a resume reads
    the entropy measured before it, not 'none yet'."""
    settings = dict(adaptive=True, target=1.0, delta=0.004, low=0.0, high=0.015)
    before = EntropyCoefficient(coef=0.01, **settings)
    before.after_step(0.5)  # at or below the target: the bonus acts on the next step
    resumed = EntropyCoefficient(coef=0.0, **settings)
    resumed.load_state(before.state())
    assert (resumed.coef, resumed.last_entropy, resumed.applied()) == (before.coef, 0.5, before.applied())


def test_an_adaptive_run_resumes_its_coefficient_bit_for_bit(checkpoint, tmp_path):
    settings = dict(use_adaptive_entropy=True, entropy_target=5.0, entropy_coef=0.02, entropy_coef_delta=0.01)
    straight = make_trainer(checkpoint, tmp_path / "a", **settings)
    for _ in range(3):
        last, _ = straight.train_step()
    resumed = None
    first = make_trainer(checkpoint, tmp_path / "b", **settings)
    first.train_step()
    first.train_step()
    state = minigrpo.run.checkpoint.trainer_state(first, 0.0)
    assert state["entropy_control"]["coef"] == first.updater.entropy.coef
    resumed = make_trainer(checkpoint, tmp_path / "c", **settings)
    resumed.model.load_state_dict(first.model.state_dict())
    minigrpo.run.checkpoint.restore(resumed, state)
    again, _ = resumed.train_step()
    assert (
        again["entropy/coef"] == last["entropy/coef"]
        and again["entropy/coef_applied"] == last["entropy/coef_applied"]
    )
    assert all(torch.equal(v, straight.model.state_dict()[k]) for k, v in resumed.model.state_dict().items())


# -- bad input: one line, before any step ------------------------------------------------------------
def test_a_setting_of_an_option_that_is_off_is_not_checked_against_others():
    """pass_k's default (4) is more than a group of 2, which only advantage_estimator='passk' reads."""
    assert GRPOConfig(num_generations=2).pass_k == 4
    with pytest.raises(ValueError, match="pass_k=4 is more than num_generations=2"):
        GRPOConfig(num_generations=2, advantage_estimator="passk")


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(advantage_estimator="ppo"), "advantage_estimator must be one of grpo, rloo, "),
        (dict(clip_ratio_c=1.0), r"clip_ratio_c must be > 1"),
        (dict(clip_ratio_c=3.0, loss_type="sapo"), r"clip_ratio_c=3.0 is read only with loss_type grpo, "),
        (dict(advantage_estimator="passk", pass_k=9), "pass_k=9 is more than num_generations=8"),
        (dict(pass_k=2), r"pass_k=2 is read only with advantage_estimator='passk'"),
        (dict(entropy_target=0.0, use_adaptive_entropy=True), r"entropy_target must be in \(0, log V\)"),
        (dict(entropy_target=0.5), "entropy_target=0.5 is read only with use_adaptive_entropy"),
        (dict(entropy_coef=-0.1), "entropy_coef must be >= 0"),
        (dict(covariance_control="clip_cov", loss_type="cispo"), "covariance_control='clip_cov' modifies"),
        (
            dict(loss_type="gmpo", importance_sampling_level="sequence"),
            "cannot be combined with loss_type='gmpo'",
        ),
        (dict(advantage_estimator="rloo", scale_rewards="none"), "scale_rewards='none' is read by"),
        (
            dict(advantage_estimator="rloo", advantage_type="process"),
            "is not read by advantage_type='process'",
        ),
        (dict(advantage_estimator="maxrl", overlong_buffer=4), "advantage_estimator='maxrl' divides"),
        (dict(sapo_temperature_neg=2.0), "sapo_temperature_neg=2.0 is read only with loss_type='sapo'"),
    ],
)
def test_bad_settings_are_refused_with_a_message(settings, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**settings)


def test_an_entropy_target_above_log_v_is_refused_before_any_step(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"entropy_target must be in \(0, log V\) = \(0, 5\.\d+\) nats"):
        make_trainer(checkpoint, tmp_path, use_adaptive_entropy=True, entropy_target=6.0)
