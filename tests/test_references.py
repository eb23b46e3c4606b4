"""The reference harnesses load and call verl's and TRL's own code: small cases whose answer is known by hand.

These hold the harnesses (verl_reference.py, trl_reference.py) themselves; the tests comparing minigrpo's
objectives with the references live beside those objectives' other tests.
"""

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

# (B, T) = (4, 4): ragged, right-padded completions
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)


def test_verl_grpo_advantages_are_each_groups_z_scores_on_valid_tokens(verl_reference):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    mask = torch.cat([MASK, MASK[:2]])  # (6, 4)
    groups = [7, 7, 7, 3, 3, 3]
    grouped = rewards.view(2, 3)
    by_hand = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(
        6, 1
    ) * mask

    advantages, returns = verl_reference.advantages("grpo", rewards, mask, groups)

    torch.testing.assert_close(advantages, by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, advantages)
    centred, _ = verl_reference.advantages("grpo", rewards, mask, groups, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(centred, (grouped - grouped.mean(1, keepdim=True)).view(6, 1) * mask)


def test_verl_rloo_baseline_is_the_mean_of_the_others(verl_reference):
    rewards = torch.tensor([1.0, 0.0, 0.25, 2.0])
    others_mean = (rewards.view(2, 2).sum(1, keepdim=True) - rewards.view(2, 2)).view(
        4
    )  # G = 2: the other one

    advantages, _ = verl_reference.advantages("rloo", rewards, MASK, [0, 0, 1, 1])

    torch.testing.assert_close(advantages, (rewards - others_mean).view(4, 1) * MASK)


def test_verl_kl_in_reward_and_reinforce_plus_plus_returns(verl_reference):
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0])
    old_log_probs = -torch.rand(4, 4)
    ref_log_prob = -torch.rand(4, 4)

    token_rewards, _ = verl_reference.kl_in_reward(rewards, MASK, old_log_probs, ref_log_prob, kl_coef=0.5)
    _, returns = verl_reference.advantages(
        "reinforce_plus_plus", token_rewards, MASK, [0, 0, 1, 1], gamma=1.0
    )

    outcome = verl_reference.token_rewards(rewards, MASK)
    torch.testing.assert_close(token_rewards, outcome - 0.5 * (old_log_probs - ref_log_prob) * MASK)
    torch.testing.assert_close(returns, token_rewards.flip(-1).cumsum(-1).flip(-1) * MASK)


def test_verl_remax_subtracts_each_completions_baseline_from_its_returns(verl_reference):
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0])
    baselines = torch.tensor([0.5, 0.5, 1.0, 1.0])  # ReMax: the greedy completion's reward

    advantages, returns = verl_reference.advantages(
        "remax", rewards, MASK, [0, 0, 1, 1], reward_baselines=baselines
    )

    torch.testing.assert_close(returns, rewards.view(4, 1) * MASK)  # the outcome reward, on every valid token
    torch.testing.assert_close(advantages, (rewards - baselines).view(4, 1) * MASK)


def test_verl_vanilla_loss_inside_the_clip_is_the_plain_surrogate(verl_reference):
    old_log_prob = -torch.rand(4, 4) - 0.5
    log_prob = (old_log_prob + 0.1 * torch.rand(4, 4) - 0.05).requires_grad_()  # ratios in (0.95, 1.06)
    advantages = torch.randn(4, 1).expand(4, 4)

    loss, metrics = verl_reference.policy_loss("vanilla", old_log_prob, log_prob, advantages, MASK)
    surrogate = -(advantages * (log_prob - old_log_prob).exp() * MASK).sum() / MASK.sum()

    torch.testing.assert_close(loss, surrogate)
    grad, surrogate_grad = (torch.autograd.grad(value, log_prob)[0] for value in (loss, surrogate))
    torch.testing.assert_close(grad, surrogate_grad)
    assert metrics["actor/pg_clipfrac"] == 0.0
    per_sequence, _ = verl_reference.policy_loss(
        "vanilla", old_log_prob, log_prob, advantages, MASK, loss_agg_mode="seq-mean-token-mean"
    )
    per_token = -advantages * (log_prob - old_log_prob).exp()
    torch.testing.assert_close(per_sequence, ((per_token * MASK).sum(-1) / MASK.sum(-1)).mean())


def test_verl_vanilla_dual_clip_caps_a_negative_advantages_loss_at_clip_ratio_c(verl_reference):
    old_log_prob = torch.full((1, 2), -3.0)
    log_prob = torch.full((1, 2), -3.0 + torch.log(torch.tensor(5.0)).item(), requires_grad=True)  # ratio 5
    advantages = torch.full((1, 2), -1.0)

    loss, metrics = verl_reference.policy_loss(
        "vanilla", old_log_prob, log_prob, advantages, torch.ones(1, 2), clip_ratio_c=3.0
    )

    torch.testing.assert_close(loss, torch.tensor(3.0))  # -A * clip_ratio_c, not -A * ratio = 5
    assert metrics["actor/pg_clipfrac_lower"] == 1.0
    assert torch.autograd.grad(loss, log_prob)[0].abs().sum() == 0


def test_verl_settings_it_does_not_have_are_refused(verl_reference):
    with pytest.raises(TypeError, match="AlgoConfig has no field norm_adv_by_std"):
        verl_reference.advantages("grpo", torch.ones(2), torch.ones(2, 1), [0, 0], norm_adv_by_std=False)
    with pytest.raises(TypeError, match="clip_ratio_C"):
        verl_reference.policy_loss(
            "vanilla",
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            torch.ones(1, 1),
            clip_ratio_C=2,
        )


# clip_cov's covariances cov(A, log pi): positive for (0, 0), (0, 2), (1, 0), (1, 2), negative elsewhere
CLIP_COV_ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, -1.0], [1.0, 1.0, -1.0, -1.0]])
CLIP_COV_LOG_PROB = torch.tensor([[-0.5, -2.0, -2.1, -0.6], [-0.7, -1.9, -2.2, -0.4]])


def clip_cov_dropped_tokens(verl_reference, clip_cov_ratio, seed):
    """(n, 2): the tokens verl's clip_cov drops (zero gradient), drawn under torch's seed `seed`."""
    log_prob = CLIP_COV_LOG_PROB.clone().requires_grad_()
    torch.manual_seed(seed)
    loss, _ = verl_reference.policy_loss(
        "clip_cov",
        CLIP_COV_LOG_PROB,  # ratio 1: no ratio is clipped, the 4 positive covariances are candidates
        log_prob,
        CLIP_COV_ADVANTAGES,
        torch.ones(2, 4),
        clip_cov_ratio=clip_cov_ratio,
        clip_cov_lb=0.0,
        clip_cov_ub=100.0,
    )
    return torch.nonzero(torch.autograd.grad(loss, log_prob)[0] == 0)


def test_verl_clip_cov_is_deterministic_when_every_candidate_is_clipped(verl_reference):
    every_candidate = torch.tensor([[0, 0], [0, 2], [1, 0], [1, 2]])
    for seed in range(4):  # clip_num = int(0.5 * 8 tokens) = 4 = the candidates: the draw chooses nothing
        assert torch.equal(clip_cov_dropped_tokens(verl_reference, 0.5, seed), every_candidate)


def test_verl_clip_cov_draw_is_reproduced_by_seeding_and_the_same_randperm(verl_reference):
    candidates = clip_cov_dropped_tokens(
        verl_reference, 0.5, seed=0
    )  # row-major, as torch.nonzero lists them
    draws = set()
    for seed in range(8):  # clip_num = int(0.25 * 8 tokens) = 2 of the 4 candidates
        dropped = clip_cov_dropped_tokens(verl_reference, 0.25, seed)
        torch.manual_seed(seed)
        mine = candidates[torch.randperm(len(candidates))[:2]]
        assert sorted(map(tuple, dropped.tolist())) == sorted(map(tuple, mine.tolist()))
        draws.add(tuple(map(tuple, dropped.tolist())))
    assert len(draws) > 1  # the choice is random: a seed is what makes it reproducible


def test_verl_harness_leaves_no_stub_modules_behind(verl_reference, monkeypatch):
    def stubbed():
        packages = verl_reference.STUBBED_PACKAGES
        return {name: module for name, module in sys.modules.items() if name.split(".")[0] in packages}

    a_real_omegaconf = types.ModuleType("omegaconf")  # one of the stubbed names, there before: it comes back
    monkeypatch.setitem(sys.modules, "omegaconf", a_real_omegaconf)
    before = stubbed()
    fresh = verl_reference.load.__wrapped__()  # runs verl's files again, stubs in place meanwhile

    assert fresh.core_algos.get_policy_loss_fn("vanilla") is not None
    assert stubbed() == before
    assert sys.modules["omegaconf"] is a_real_omegaconf
    assert not any(name in sys.modules for name in ("verl", "verl.utils", "tensordict"))


def test_verl_wheel_named_but_missing_is_an_error_not_a_skip(monkeypatch, tmp_path):
    import verl_reference  # not the fixture: these hold while the wheel is missing

    monkeypatch.setenv(verl_reference.WHEEL_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(verl_reference.WrongWheel, match="MINIGRPO_VERL_WHEEL=.*missing.whl is not a file"):
        verl_reference.wheel_path()


def test_verl_wheel_unavailable_skips_saying_how_to_get_it(monkeypatch):
    import verl_reference  # not the fixture: these hold while the wheel is missing

    def unavailable():
        raise verl_reference.WheelUnavailable("offline")

    monkeypatch.setattr(verl_reference, "load", unavailable)
    with pytest.raises(pytest.skip.Exception, match="offline.*MINIGRPO_VERL_WHEEL.*pip download verl==0.9.1"):
        verl_reference.require()


def test_verl_wheel_is_read_where_the_variable_or_else_the_cache_says(verl_reference, monkeypatch, tmp_path):
    wheel = verl_reference.wheel_path()  # wherever this session found it
    monkeypatch.setenv(verl_reference.WHEEL_ENV, str(wheel))
    assert verl_reference.wheel_path() == wheel

    monkeypatch.delenv(verl_reference.WHEEL_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = tmp_path / "minigrpo" / "tests" / verl_reference.WHEEL_NAME
    cached.parent.mkdir(parents=True)
    shutil.copyfile(wheel, cached)
    monkeypatch.setattr(verl_reference, "_download", None)  # a fetch would fail: the cached file is read
    assert verl_reference.wheel_path() == cached


def fake_pip(wheel, commands, returncode=0, stderr=""):
    """subprocess as verl_reference sees it, its pip writing `wheel` into the -d folder when it succeeds."""

    def run(command, **_):
        commands.append(command)
        if returncode == 0:
            shutil.copyfile(wheel, Path(command[command.index("-d") + 1]) / wheel.name)
        return subprocess.CompletedProcess(command, returncode, "", stderr)

    return types.SimpleNamespace(run=run, TimeoutExpired=subprocess.TimeoutExpired)


def test_verl_wheel_pip_fetches_lands_whole_in_the_cache(verl_reference, monkeypatch, tmp_path):
    wheel = verl_reference.wheel_path()
    monkeypatch.delenv(verl_reference.WHEEL_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "minigrpo" / "tests").mkdir(parents=True)  # the cache's folder may be there already
    commands = []
    monkeypatch.setattr(verl_reference, "subprocess", fake_pip(wheel, commands))

    fetched = verl_reference.wheel_path()

    assert fetched == tmp_path / "minigrpo" / "tests" / verl_reference.WHEEL_NAME
    assert fetched.read_bytes() == wheel.read_bytes()
    assert [path.name for path in fetched.parent.iterdir()] == [verl_reference.WHEEL_NAME]  # no folder left
    assert commands[0][:4] == [sys.executable, "-m", "pip", "download"]
    assert "verl==0.9.1" in commands[0] and "--no-deps" in commands[0]


def test_verl_wheel_pip_cannot_fetch_says_why_and_leaves_nothing(monkeypatch, tmp_path):
    import verl_reference  # not the fixture: these hold while the wheel is missing

    monkeypatch.delenv(verl_reference.WHEEL_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stderr = "Looking in indexes: https://pypi.org/simple\nRetrying\nERROR: No matching distribution\n"
    failing = fake_pip(None, [], returncode=1, stderr=stderr)
    monkeypatch.setattr(verl_reference, "subprocess", failing)

    with pytest.raises(verl_reference.WheelUnavailable, match="pip download failed: ERROR: No matching"):
        verl_reference.wheel_path()
    assert list((tmp_path / "minigrpo" / "tests").iterdir()) == []


def test_verl_wheel_with_other_bytes_is_an_error_not_a_skip(monkeypatch, tmp_path):
    import verl_reference  # not the fixture: these hold while the wheel is missing

    other = tmp_path / verl_reference.WHEEL_NAME
    other.write_bytes(b"not verl")
    monkeypatch.setenv(verl_reference.WHEEL_ENV, str(other))
    with pytest.raises(verl_reference.WrongWheel, match="is not verl 0.9.1's wheel"):
        verl_reference.wheel_path()


def test_trl_grpo_loss_is_the_mean_of_each_completions_token_mean(trl_reference):
    old_log_prob = -torch.rand(4, 4) - 0.5
    log_prob = (old_log_prob + 0.1 * torch.rand(4, 4) - 0.05).requires_grad_()  # ratios inside the clip
    advantages = torch.randn(4)
    entropies = torch.rand(4, 4)

    loss, metrics = trl_reference.loss("grpo", log_prob, old_log_prob, advantages, MASK, entropies)
    per_token_loss = -(log_prob - old_log_prob).exp() * advantages.unsqueeze(1)
    by_hand = ((per_token_loss * MASK).sum(-1) / MASK.sum(-1)).mean()

    torch.testing.assert_close(loss, by_hand)
    grad, by_hand_grad = (torch.autograd.grad(value, log_prob)[0] for value in (loss, by_hand))
    torch.testing.assert_close(grad, by_hand_grad)
    assert metrics["clip_ratio/region_mean"] == 0.0
    assert "entropy_coef" not in metrics  # entropy_coef 0 and no adaptive control: no bonus at all
    torch.testing.assert_close(metrics["entropy"], ((entropies * MASK).sum() / MASK.sum()).item())


def test_trl_sapo_equals_verl_sapo_on_the_same_batch(trl_reference, verl_reference):
    old_log_prob = -torch.rand(4, 4) - 0.5
    log_prob = (old_log_prob + torch.randn(4, 4)).requires_grad_()  # ratios far outside any clip
    advantages = torch.tensor([1.0, -0.5, 0.0, 2.0])

    trl_loss, _ = trl_reference.loss("sapo", log_prob, old_log_prob, advantages, MASK, torch.zeros(4, 4))
    verl_loss, _ = verl_reference.policy_loss(
        "sapo", old_log_prob, log_prob, advantages.view(4, 1) * MASK, MASK
    )

    torch.testing.assert_close(trl_loss, verl_loss, rtol=0, atol=1e-6)
    trl_grad, verl_grad = (torch.autograd.grad(value, log_prob)[0] for value in (trl_loss, verl_loss))
    torch.testing.assert_close(trl_grad, verl_grad, rtol=0, atol=1e-6)


def no_advantage_micro_batch(entropies, mask):
    """A micro-batch whose policy term is zero: its loss is the entropy bonus alone."""
    log_prob = torch.zeros(mask.shape)
    return dict(
        per_token_logps=log_prob,
        old_per_token_logps=log_prob,
        advantages=torch.zeros(len(mask)),
        completion_mask=mask,
        entropies=entropies,
    )


def test_trl_adaptive_coefficient_rises_when_entropy_is_below_target_and_applies_a_step_later(trl_reference):
    low = no_advantage_micro_batch(torch.full((2, 3), 0.1), torch.ones(2, 3))  # entropy 0.1 < target 0.4
    high = no_advantage_micro_batch(torch.full((2, 3), 0.9), torch.ones(2, 3))  # entropy 0.9 > target
    driver = trl_reference.AdaptiveEntropy(
        gradient_accumulation_steps=2, entropy_coef=0.1, entropy_target=0.4, entropy_coef_delta=0.01
    )

    coefficients, losses = driver.run([[low, low], [low, low], [high, high], [low, low]])

    torch.testing.assert_close(coefficients, [0.11, 0.12, 0.11, 0.12])
    # coefficient applied (the previous step's, if its entropy was <= target) * token mean / 2 micro-batches
    expected = [0.0, -0.11 * 0.1 / 2, -0.12 * 0.9 / 2, 0.0]  # step 1: no entropy measured yet
    for step_losses, step_expected in zip(losses, expected, strict=True):
        torch.testing.assert_close([loss.item() for loss in step_losses], [step_expected] * 2)


def test_trl_adaptive_step_entropy_weighs_tokens_not_micro_batches(trl_reference):
    one_token = no_advantage_micro_batch(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0]]))
    three_tokens = no_advantage_micro_batch(torch.tensor([[0.1, 0.1, 0.1]]), torch.tensor([[1.0, 1.0, 1.0]]))
    driver = trl_reference.AdaptiveEntropy(gradient_accumulation_steps=2, entropy_target=0.4)

    driver.step([one_token, three_tokens])

    # (1.0 + 3 * 0.1) / 4 tokens = 0.325 <= 0.4, though the micro-batches' means average 0.55
    assert driver.last_step_entropy == pytest.approx(0.325)
    assert driver.entropy_coef == pytest.approx(0.005)  # GRPOConfig's entropy_coef 0.0 plus its delta 0.005


def ratios_inside_the_clip():
    """(old_log_prob, log_prob): (4, 4), log_prob a leaf with ratios in (0.95, 1.06)."""
    old_log_prob = -torch.rand(4, 4) - 0.5
    return old_log_prob, (old_log_prob + 0.1 * torch.rand(4, 4) - 0.05).requires_grad_()


def test_trl_loss_types_divide_the_masked_sum_as_trl_documents(trl_reference):
    old_log_prob, log_prob = ratios_inside_the_clip()
    advantages = torch.randn(4)
    per_token = -(log_prob - old_log_prob).exp() * advantages.unsqueeze(1)
    masked_sum = (per_token * MASK).sum()
    sequence_mean = ((per_token * MASK).sum(-1) / MASK.sum(-1)).mean()
    twenty = torch.tensor(20.0)
    cases = [
        ("grpo", {"gradient_accumulation_steps": 2}, sequence_mean / 2),
        ("bnpo", {}, masked_sum / MASK.sum()),
        ("dr_grpo", {"max_completion_length": 8}, masked_sum / (4 * 8)),
        ("dapo", {}, masked_sum / MASK.sum()),  # num_items_in_batch: this micro-batch's tokens
        ("dapo", {"num_items_in_batch": twenty}, masked_sum / 20),
        ("dapo", {"num_items_in_batch": twenty, "steps_per_generation": 2}, masked_sum / (20 / 2)),
    ]
    for loss_type, settings, by_hand in cases:
        loss, _ = trl_reference.loss(
            loss_type, log_prob, old_log_prob, advantages, MASK, torch.rand(4, 4), **settings
        )
        torch.testing.assert_close(loss, by_hand, msg=f"{loss_type} {settings}")


def test_trl_static_entropy_bonus_kl_term_tool_mask_and_entropy_quantile(trl_reference):
    log_prob = -torch.rand(4, 4) - 0.5  # old_per_token_logps None: ratio 1
    no_advantage = torch.zeros(4)
    entropies = torch.rand(4, 4)
    token_mean_entropy = (entropies * MASK).sum() / MASK.sum()

    bonus_only, metrics = trl_reference.loss(
        "grpo", log_prob, None, no_advantage, MASK, entropies, entropy_coef=0.1
    )
    torch.testing.assert_close(bonus_only, -0.1 * token_mean_entropy)
    assert metrics["entropy_coef"] == 0.1

    ref_log_prob = log_prob - 0.3 * torch.rand(4, 4)
    kl = (ref_log_prob - log_prob).exp() - (ref_log_prob - log_prob) - 1
    kl_only, _ = trl_reference.loss(
        "grpo", log_prob, None, no_advantage, MASK, entropies, beta=0.04, ref_per_token_logps=ref_log_prob
    )
    torch.testing.assert_close(kl_only, 0.04 * ((kl * MASK).sum(-1) / MASK.sum(-1)).mean())

    old_log_prob, log_prob = ratios_inside_the_clip()
    advantages = torch.randn(4)
    tool_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]]).expand(4, 4)
    with_tool_mask, _ = trl_reference.loss(
        "grpo", log_prob, old_log_prob, advantages, MASK, entropies, tool_mask=tool_mask
    )
    masked, _ = trl_reference.loss("grpo", log_prob, old_log_prob, advantages, MASK * tool_mask, entropies)
    torch.testing.assert_close(with_tool_mask, masked)

    top_token, _ = trl_reference.loss(
        "grpo", log_prob, old_log_prob, advantages, MASK, entropies, top_entropy_quantile=0.0
    )
    highest = (entropies * MASK == (entropies * MASK).max()).float()  # quantile 0: the top token alone
    per_token = -(log_prob - old_log_prob).exp() * advantages.unsqueeze(1)
    torch.testing.assert_close(top_token, ((per_token * highest * MASK).sum(-1) / MASK.sum(-1)).mean())


def test_trl_settings_it_does_not_have_are_refused(trl_reference):
    with pytest.raises(TypeError, match="GRPOConfig has no field epsilon_hi"):
        trl_reference.loss(
            "grpo", torch.zeros(1, 1), None, torch.ones(1), torch.ones(1, 1), torch.ones(1, 1), epsilon_hi=1
        )


def test_trl_not_installed_or_another_version_skips_saying_how_to_get_it(monkeypatch, tmp_path):
    import trl_reference  # not the fixture: it would skip this very test if the check were wrong

    def importlib_finding(version, spec):
        """importlib as trl_reference sees it, finding `spec` for trl and reading `version` for it."""
        metadata = types.SimpleNamespace(version=lambda name: version)
        return types.SimpleNamespace(
            metadata=metadata, util=types.SimpleNamespace(find_spec=lambda name: spec)
        )

    package = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(trl_reference, "importlib", importlib_finding("1.16.0", package))
    assert trl_reference._trl_folder() == tmp_path
    monkeypatch.setattr(trl_reference, "importlib", importlib_finding("1.15.0", package))
    with pytest.raises(trl_reference.TrlUnavailable, match="trl 1.15.0 is installed"):
        trl_reference._trl_folder()
    monkeypatch.setattr(trl_reference, "importlib", importlib_finding("1.16.0", None))
    with pytest.raises(trl_reference.TrlUnavailable, match="trl is not installed"):
        trl_reference._trl_folder()

    def unavailable():
        raise trl_reference.TrlUnavailable("trl 1.15.0 is installed")

    monkeypatch.setattr(trl_reference, "load", unavailable)
    with pytest.raises(pytest.skip.Exception, match="trl 1.15.0 is installed.*pip install trl==1.16.0"):
        trl_reference.require()


def test_trl_metrics_are_each_micro_batchs_own(trl_reference):
    stand_in = trl_reference.trainer(gradient_accumulation_steps=2, use_adaptive_entropy=True)
    micro_batch = no_advantage_micro_batch(torch.full((1, 2), 0.1), torch.ones(1, 2))

    _, first = stand_in.micro_batch_loss(**micro_batch, sync_gradients=False)
    _, last = stand_in.micro_batch_loss(**micro_batch, sync_gradients=True)
    _, next_first = stand_in.micro_batch_loss(**micro_batch, sync_gradients=False)

    assert "entropy_coef" not in first and "entropy_coef" not in next_first  # logged at the step's end only
    assert last["entropy_coef"] == pytest.approx(0.005)


def test_trl_adaptive_driver_steps_an_optimizer_on_micro_batches_made_in_turn(trl_reference):
    entropy = torch.tensor(0.1, requires_grad=True)  # every token's, a parameter the optimizer moves
    optimizer = torch.optim.SGD([entropy], lr=1.0)

    def micro_batch():
        return no_advantage_micro_batch(entropy * torch.ones(2, 3), torch.ones(2, 3))

    driver = trl_reference.AdaptiveEntropy(
        gradient_accumulation_steps=2, entropy_coef=0.1, entropy_target=0.4, entropy_coef_delta=0.01
    )

    driver.step([micro_batch, micro_batch], optimizer)  # no coefficient applied yet
    assert entropy.item() == pytest.approx(0.1)
    driver.step([micro_batch, micro_batch], optimizer)  # 0.11: two losses -0.11 * entropy / 2
    assert entropy.item() == pytest.approx(0.1 + 0.11)
    assert entropy.grad is None  # zeroed after the step
    with pytest.raises(ValueError, match="1 micro-batches for gradient_accumulation_steps=2"):
        driver.step([micro_batch])
