"""The trainer: a step moves the weights only when there is signal, exact resume across processes,
crash-safe checkpoints (runs killed end to end: test_crash_safety.py), DAPO options, skipped
non-finite steps, and configuration errors."""

import os
import random
import statistics

import numpy as np
import pytest
import torch
from helpers import ROWS, tiny_train_config, x_or_vowel_share

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, Trainer
from minigrpo.run import Run, initial_evaluation, latest_checkpoint, load_state
from minigrpo.tasks import PromptStream
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward


def _constant(completions, **_):
    return [1.0 for _ in completions]


def _count_x_for_odd_answers(completions, answer, **_):
    """x_or_vowel_share where the gold answer is odd; 0.5 for the other prompts (flat groups)."""
    return [x if int(a) % 2 else 0.5 for x, a in zip(x_or_vowel_share(completions), answer)]


for _name, _fn in (
    ("test_constant", _constant),
    ("test_odd_only", _count_x_for_odd_answers),
):
    if _name not in REWARD_FUNCTIONS:
        register_reward(_name)(_fn)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


def make_trainer(checkpoint, tmp_path, reward="test_count_x", grpo=None, **train):
    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    grpo = grpo or GRPOConfig(num_generations=4, max_completion_length=12)
    config = tiny_train_config(tmp_path / "run", **{"max_steps": 1, "micro_batch_size": 3, **train})
    return Trainer(model, tokenizer, Task(ROWS, [RewardSpec(reward)]), grpo, config)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_step_with_signal_changes_the_weights(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path)
    before = weights(trainer.model)
    stats, examples = trainer.train_step()
    assert stats["groups/zero_variance_frac"] < 1 and stats["skipped"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert stats["clip/region_frac"] == 0.0 and abs(stats["ratio/mean"] - 1.0) < 1e-6  # mu = 1: ratio 1
    assert len(examples) == 2 and "test_count_x" in examples[0]["rewards"]


def test_a_step_with_all_advantages_zero_leaves_the_weights(checkpoint, tmp_path):
    trainer = make_trainer(checkpoint, tmp_path, reward="test_constant", weight_decay=0.0)
    before = weights(trainer.model)
    stats, _ = trainer.train_step()
    assert stats["groups/zero_variance_frac"] == 1.0 and stats["loss"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_beta_keeps_a_frozen_reference_and_logs_kl(checkpoint, tmp_path):
    grpo = GRPOConfig(num_generations=4, max_completion_length=12, beta=0.1, num_iterations=2)
    trainer = make_trainer(checkpoint, tmp_path, grpo=grpo)
    assert make_trainer(checkpoint, tmp_path).plan.reference is None  # beta = 0: no reference model at all
    reference = weights(trainer.plan.reference)
    stats, _ = trainer.train_step()
    assert stats["kl"] > 0  # the second pass moved away from the reference
    assert all(torch.equal(reference[k], v) for k, v in trainer.plan.reference.state_dict().items())
    assert not any(p.requires_grad for p in trainer.plan.reference.parameters())


def test_dynamic_sampling_trains_only_on_groups_with_signal(checkpoint, tmp_path):
    grpo = GRPOConfig(
        num_generations=4, max_completion_length=12, dynamic_sampling=True, max_sampling_rounds=3
    )
    trainer = make_trainer(checkpoint, tmp_path, reward="test_constant", grpo=grpo)
    stats, _ = trainer.train_step()
    assert stats["groups/sampled"] == 2 + 2 + 2  # three rounds, every group flat
    assert stats["groups/trained"] == 0 and stats["skipped"] == 1.0


class Sampled:
    """An observer of train_step (as trace.py's): the rollouts each step sampled, after stage 3."""

    def __init__(self):
        self.sampled = []

    def after_advantages(self, trainer, rollouts):
        self.sampled.append(rollouts)

    def after_update(self, trainer, stats):
        pass


class Recorder(Sampled):
    """Also the seed of every sampling call, and the rollouts of every update (stage 4's input)."""

    def __init__(self, trainer, monkeypatch):
        super().__init__()
        self.seeds, self.trained = [], []
        generate = minigrpo.run.trainer.generate
        monkeypatch.setattr(
            minigrpo.run.trainer,
            "generate",
            lambda *a, seed, **k: self.seeds.append(seed) or generate(*a, seed=seed, **k),
        )
        updater = trainer.updater
        trainer.updater = lambda rollouts, *rest: self.trained.append(rollouts) or updater(rollouts, *rest)


def test_dynamic_sampling_with_batch_scaling_divides_by_the_std_of_the_trained_groups(
    checkpoint, tmp_path, monkeypatch
):
    """scale_rewards="batch" with flat groups dropped: A = (r - mean of its group) / (std + 1e-4), the
    std (n - 1) over the rewards of the groups trained on, by plain statistics. Every sampling round
    of every step has a seed of its own."""
    grpo = GRPOConfig(
        num_generations=4,
        max_completion_length=6,
        dynamic_sampling=True,
        max_sampling_rounds=4,
        scale_rewards="batch",
    )
    trainer = make_trainer(checkpoint, tmp_path, reward="test_odd_only", grpo=grpo, micro_batch_size=8)
    recorder = Recorder(trainer, monkeypatch)
    stats, _ = trainer.train_step(recorder)
    # flat groups were sampled and dropped
    assert stats["groups/trained"] == 2 and stats["groups/sampled"] > 2
    (sampled,), (trained,) = recorder.sampled, recorder.trained
    rewards = [r.reward for r in trained]
    std = statistics.stdev(rewards)
    # the dropped groups would matter
    assert abs(std - statistics.stdev([r.reward for r in sampled])) > 0.1 * std
    for g in range(0, len(trained), 4):
        mean = statistics.fmean(rewards[g : g + 4])
        for r in trained[g : g + 4]:
            assert r.advantage == pytest.approx((r.reward - mean) / (std + 1e-4), rel=1e-5, abs=1e-6)
    # rounds past the first
    assert len(recorder.seeds) >= 2 and len(set(recorder.seeds)) == len(recorder.seeds)


def test_resume_restores_the_rng_states_it_saved_and_samples_the_straight_runs_batch(checkpoint, tmp_path):
    """Nothing in the loop draws from the global RNGs (its seeds come from seed and step), but the
    contract holds: a resumed process has torch's, NumPy's and Python's states as saved, whatever
    it drew before, and its next step samples the straight run's completions."""
    grpo = GRPOConfig(num_generations=4, max_completion_length=6)
    train = dict(
        max_steps=2,
        batch_size=8,
        micro_batch_size=8,
        learning_rate=1e-2,
        progress_bar=False,
        log_completions_every=0,
    )
    stopped = make_trainer(
        checkpoint, tmp_path, grpo=grpo, **train, stop_at_step=1, output_dir=str(tmp_path / "stopped")
    )
    Run(stopped).train()  # saves at step 1, its last
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    torch.manual_seed(1), random.seed(1), np.random.seed(1)  # what else the process drew since
    task = Task(ROWS, [RewardSpec("test_count_x")])
    resumed = minigrpo.run.driver.build_run(
        checkpoint, task, grpo, TrainConfig(**train, output_dir=str(tmp_path / "stopped"), resume=True)
    ).trainer
    assert (
        resumed.step == 1 and torch.equal(torch.get_rng_state(), saved[0]) and random.getstate() == saved[1]
    )
    numpy_state = np.random.get_state()
    assert (
        numpy_state[0] == saved[2][0]
        and np.array_equal(numpy_state[1], saved[2][1])
        and numpy_state[2:] == saved[2][2:]
    )
    straight = make_trainer(checkpoint, tmp_path, grpo=grpo, **train, output_dir=str(tmp_path / "straight"))
    straight.train_step()
    observers = [Sampled(), Sampled()]
    straight.train_step(observers[0])
    resumed.train_step(observers[1])
    (straight_batch,), (resumed_batch,) = (observer.sampled for observer in observers)
    assert [r.completion_ids for r in resumed_batch] == [r.completion_ids for r in straight_batch]
    assert [r.reward for r in resumed_batch] == [r.reward for r in straight_batch]


def test_a_non_finite_loss_skips_the_step_and_leaves_everything(checkpoint, tmp_path, monkeypatch):
    trainer = make_trainer(checkpoint, tmp_path, max_steps=2)
    trainer.train_step()  # the optimizer has state now
    before, optimizer_before = weights(trainer.model), trainer.optimizer.state_dict()
    real_loss = minigrpo.update.updater.objective_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        return loss * float("nan"), {**stats, "loss": float("nan")}

    monkeypatch.setattr(minigrpo.update.updater, "objective_loss", nan_loss)
    stats, _ = trainer.train_step()
    assert stats["skipped"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    after = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(optimizer_before["state"][i]["exp_avg"], after[i]["exp_avg"]) for i in after)


RUN = """
import sys
sys.path.insert(0, {tests!r})
import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig
from minigrpo.verifier import register_reward
import test_trainer  # registers the test rewards

task = Task(test_trainer.ROWS, [RewardSpec("test_count_x")])
grpo = GRPOConfig(num_generations=4, max_completion_length=10, num_iterations=2, beta=0.05)
config = TrainConfig(output_dir={out!r}, max_steps=4, stop_at_step={steps}, batch_size=8, micro_batch_size=3,
                     learning_rate=1e-2, warmup_steps=1, lr_schedule="cosine", resume={resume},
                     progress_bar=False, log_completions_every=0)
minigrpo.train({checkpoint!r}, task, grpo, config)
"""


def run_training(server, checkpoint, out, steps, resume):
    """RUN in a process of its own (forked by conftest's examples_server); the policy it saved last."""
    script = out.parent / f"{out.name}-{steps}-{resume}.py"
    script.write_text(
        RUN.format(
            tests=os.path.dirname(__file__), out=str(out), steps=steps, resume=resume, checkpoint=checkpoint
        )
    )
    code = server.run(str(script), [], str(out.parent), script.stem)
    assert code == 0, (out.parent / f"{script.stem}.err").read_text()[-3000:]
    return minigrpo.load_pretrained(latest_checkpoint(str(out)))[0]


def test_resume_is_exact(examples_server, checkpoint, tmp_path):
    straight = run_training(examples_server, checkpoint, tmp_path / "straight", 4, resume=False)
    # this process ends after step 2 of 4
    run_training(examples_server, checkpoint, tmp_path / "stopped", 2, resume=False)
    resumed = run_training(examples_server, checkpoint, tmp_path / "stopped", 4, resume=True)
    original = minigrpo.load_pretrained(checkpoint)[0].state_dict()
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    assert any(not torch.equal(v, original[k]) for k, v in straight.state_dict().items())
    state = load_state(latest_checkpoint(str(tmp_path / "stopped")))
    assert state["step"] == 4 and state["data"]["position"] == (4 * 2) % len(ROWS)
    steps = [line for line in open(tmp_path / "stopped" / "metrics.jsonl")]
    assert len(steps) == 4
    from transformers import AutoModelForCausalLM  # the oracle reads training checkpoints too

    twin = AutoModelForCausalLM.from_pretrained(latest_checkpoint(str(tmp_path / "stopped")))
    assert torch.equal(twin.model.embed_tokens.weight, resumed.embed_tokens.weight)


def test_saving_before_the_first_adamw_step_takes_no_step(checkpoint, tmp_path):
    """Only flat groups: the update is skipped, AdamW has no state, and saving must not create one
    (torch's state-dict helpers would, by a step with lr 0, shifting AdamW's bias correction)."""
    grpo = GRPOConfig(
        num_generations=4, max_completion_length=12, dynamic_sampling=True, max_sampling_rounds=1
    )
    trainer = make_trainer(checkpoint, tmp_path, reward="test_constant", grpo=grpo)
    stats, _ = trainer.train_step()
    assert stats["update/no_groups"] == 1.0
    state = minigrpo.run.checkpoint.trainer_state(trainer, wall_seconds=0.0)
    assert state["optimizer"] is None and not trainer.optimizer.state
    fresh = make_trainer(checkpoint, tmp_path, reward="test_constant", grpo=grpo)
    minigrpo.run.checkpoint.restore(fresh, state)
    assert fresh.step == 1 and not fresh.optimizer.state


def test_a_loaded_optimizer_state_keeps_its_moments_and_this_runs_adamw_settings(checkpoint, tmp_path):
    """The saved state is keyed by parameter names (ParallelModel.optimizer_state); on resume AdamW's
    moments come back, and betas, eps and weight decay are this run's, not the checkpoint's."""
    trainer = make_trainer(checkpoint, tmp_path, weight_decay=0.1, adam_epsilon=1e-7)
    trainer.train_step()
    saved = minigrpo.run.checkpoint.trainer_state(trainer, wall_seconds=0.0)
    assert all(isinstance(name, str) for name in saved["optimizer"]["state"])
    fresh = make_trainer(checkpoint, tmp_path)  # other AdamW settings
    minigrpo.run.checkpoint.restore(fresh, saved)
    for a, b in zip(trainer.optimizer.state.values(), fresh.optimizer.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert (
        fresh.optimizer.param_groups[0]["weight_decay"] == 0.0
        and fresh.optimizer.param_groups[0]["eps"] == 1e-8
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GRPOConfig(num_generations=1), "num_generations must be an integer >= 2"),
        (lambda: GRPOConfig(epsilon=0), "epsilon and epsilon_high must be > 0"),
        (lambda: GRPOConfig(epsilon_high=-0.1), "epsilon and epsilon_high must be > 0"),
        (lambda: GRPOConfig(loss_type="ppo"), "loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo"),
        (lambda: GRPOConfig(scale_rewards="std"), "scale_rewards must be one of group, batch, none"),
        (
            lambda: TrainConfig(batch_size=10).check_against(GRPOConfig(num_generations=4)),
            "batch_size=10 completions do not split into groups of num_generations=4",
        ),
        (lambda: TrainConfig(lr_schedule="linear"), "lr_schedule must be one of constant, cosine"),
        (lambda: TrainConfig(micro_batch_size=0), "micro_batch_size must be a positive integer"),
        (lambda: TrainConfig(micro_batch_tokens=-1), "micro_batch_tokens must be an integer >= 0"),
        # the continuations of Math-Shepherd's values are sampled without tools
        (
            lambda: GRPOConfig(advantage_type="process", process_rewards="monte_carlo", tools="calculator"),
            "process_rewards='monte_carlo' cannot be combined with tools",
        ),
        # settings that would do nothing
        (
            lambda: GRPOConfig(process_rewards="monte_carlo"),
            "values steps for process advantages, which advantage_type='outcome' never reads",
        ),
        (
            lambda: GRPOConfig(process_samples=8),
            "process_samples=8 is read only by process_rewards='monte_carlo'",
        ),
    ],
)
def test_bad_configuration_fails_with_a_clear_message(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_completions_beyond_the_context_fail_at_start(checkpoint, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"with max_new_tokens=90 \(max_completion_length\) that exceeds the model's context of 96",
    ):
        make_trainer(checkpoint, tmp_path, grpo=GRPOConfig(num_generations=4, max_completion_length=90))


def test_completions_that_exactly_fill_the_context_are_accepted(checkpoint, tmp_path):
    longest = max(map(len, make_trainer(checkpoint, tmp_path).prompt_ids))
    filled = make_trainer(
        checkpoint, tmp_path, grpo=GRPOConfig(num_generations=4, max_completion_length=96 - longest)
    )
    assert filled.grpo.max_completion_length + longest == filled.model.config.max_position_embeddings == 96
    with pytest.raises(
        ValueError, match=rf"has {longest} tokens; with max_new_tokens={97 - longest} .* context of 96"
    ):
        make_trainer(
            checkpoint, tmp_path, grpo=GRPOConfig(num_generations=4, max_completion_length=97 - longest)
        )


@pytest.mark.parametrize("observations", [False, True])
def test_micro_batches_accumulate_to_the_whole_batch(checkpoint, tmp_path, observations, monkeypatch):
    """The step's gradient, not its weights: Adam's first update is about lr * sign(g), which turns
    rounding-level gradient differences into lr-sized weight differences. With observations, tokens 2
    and 3 of every completion stand for a tool's answer: context for the forward pass, out of the loss
    and out of dapo's token count."""
    if observations:
        sample = Trainer._sample

        def with_observations(self, indices, round_):
            samples = sample(self, indices, round_)
            samples.generated = [[k not in (2, 3) for k in range(len(t))] for t in samples.tokens]
            return samples

        monkeypatch.setattr(Trainer, "_sample", with_observations)
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        grpo = GRPOConfig(num_generations=4, max_completion_length=12, loss_type=loss_type)
        trainers = [make_trainer(checkpoint, tmp_path, grpo=grpo, micro_batch_size=size) for size in (8, 3)]
        losses = []
        for trainer in trainers:
            trainer.optimizer.step = lambda: None  # keep the accumulated gradient to compare
            losses.append(trainer.train_step()[0]["loss"])
        assert losses[0] == pytest.approx(losses[1], abs=1e-7)
        whole, split = (dict(t.model.named_parameters()) for t in trainers)
        for name, p in whole.items():
            torch.testing.assert_close(p.grad, split[name].grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(
    "layout",
    [
        dict(micro_batch_tokens=40),
        dict(shared_prompt=True, micro_batch_size=4),
        dict(shared_prompt=True, micro_batch_tokens=40),
    ],
)
def test_token_budget_and_shared_prompt_steps_equal_one_whole_batch(
    checkpoint, tmp_path, loss_type, layout, monkeypatch
):
    """Micro-batches by a token budget over rollouts of similar length, or of whole groups whose
    prompt runs once, on completions of ragged lengths (many EOS ids): grpo, dr_grpo and dapo land
    on the weights of one batch of all the rollouts, with less padding. bnpo does not: it is a token
    mean per micro-batch, weighted by the micro-batch's share of the sequences, so with ragged
    lengths its step depends on the split. At ratio 1 (mu = 1) every token's loss is -A of its
    completion, so bnpo's loss is, by hand, -sum over micro-batches m of (rows of m / N) *
    (sum over m of A_i * length_i) / (tokens of m). adam_epsilon 1e-3 keeps the first step smooth
    in the gradient (with 1e-8 it is about lr * sign(g), which turns rounding-level gradient
    differences into lr-sized weight ones)."""
    grpo = GRPOConfig(num_generations=4, max_completion_length=12, loss_type=loss_type, temperature=0.7)
    whole = make_trainer(checkpoint, tmp_path, grpo=grpo, micro_batch_size=8, adam_epsilon=1e-3)
    split = make_trainer(
        checkpoint, tmp_path, grpo=grpo, adam_epsilon=1e-3, **{"micro_batch_size": 8, **layout}
    )
    for trainer in (whole, split):
        # a quarter of the vocabulary ends a completion
        trainer.eos_ids = tuple(range(5, trainer.model.config.vocab_size, 4))
    chunks = []
    cut = split.updater._micro_batches
    split.updater._micro_batches = lambda rollouts, generator=None: (
        chunks.append(cut(rollouts, generator)) or chunks[-1]
    )
    recorder = Recorder(split, monkeypatch)  # wraps the updater, whose micro-batches are cut above
    stats = [trainer.train_step()[0] for trainer in (whole, split)]
    (rollouts,), (micro_batches,) = recorder.trained, chunks
    assert len({len(r.completion_ids) for r in rollouts}) > 2 and len(micro_batches) > 1  # ragged, and split
    if loss_type == "bnpo":
        by_hand = [
            (len(m) / 8)
            * sum(rollouts[i].advantage * len(rollouts[i].completion_ids) for i in m)
            / sum(len(rollouts[i].completion_ids) for i in m)
            for m in micro_batches
        ]
        one_batch = sum(r.advantage * len(r.completion_ids) for r in rollouts) / sum(
            len(r.completion_ids) for r in rollouts
        )
        assert stats[1]["loss"] == pytest.approx(-sum(by_hand), abs=1e-6)
        assert stats[0]["loss"] == pytest.approx(-one_batch, abs=1e-6)
        assert abs(stats[1]["loss"] - stats[0]["loss"]) > 1e-3  # the split changes bnpo's step
        return
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], abs=1e-6)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-5)
    if not layout.get("shared_prompt"):
        assert 0 <= stats[1]["update/padding_frac"] <= stats[0]["update/padding_frac"]
    after = weights(split.model)
    for name, value in weights(whole.model).items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=1e-6, msg=name)


def test_shared_prompt_batches_hold_whole_groups_and_count_a_prompt_once():
    from minigrpo.rollout import Rollout
    from minigrpo.update import group_batches, padding_fraction

    lengths = [(5, 3), (5, 9), (2, 1), (2, 2), (7, 4), (7, 4)]  # three groups of 2: (prompt, completion)
    # a group weighs its prompt plus G x its longest completion: 5 + 2 * 9 = 23, 2 + 2 * 2 = 6, 7 + 2 * 4 =
    # 15; two groups pad to the longer of each: the last two, 2 * (7 + 8) = 30, fit a budget of 30
    batches = group_batches(lengths, 2, max_rows=8, max_tokens=30)
    assert sorted(sorted(b) for b in batches) == [[0, 1], [2, 3, 4, 5]]
    assert len(group_batches(lengths, 2, max_rows=8, max_tokens=29)) == 3
    rollouts = [
        Rollout(prompt_ids=[1] * p, completion_ids=[2] * c, finish_reason="stop")
        for i, (p, c) in enumerate(lengths)
    ]
    # [0, 1]: prompt 5 once + completions 3 + 9 = 17 real of 5 + 2 * 9 = 23 computed
    assert padding_fraction(rollouts, [[0, 1]], group_size=2) == pytest.approx(1 - 17 / 23)
    assert group_batches(lengths, 2, max_rows=4) == [[0, 1, 2, 3], [4, 5]]


def test_token_budget_batches_cover_every_rollout_within_the_budget():
    from minigrpo.update import token_budget_batches

    lengths = [(5, 3), (2, 12), (5, 12), (1, 1), (4, 7), (3, 3), (30, 40), (2, 2)]  # (prompt, completion)
    batches = token_budget_batches(
        lengths, max_rows=3, max_tokens=24, generator=torch.Generator().manual_seed(0)
    )
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * (max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b))
        assert len(b) <= 3 and (padded <= 24 or len(b) == 1)  # row 6 (70 tokens) alone: handled, not refused
    assert [6] in batches


def test_the_stage_functions_are_public():
    assert minigrpo.grpo_loss is minigrpo.update.loss.grpo_loss
    assert minigrpo.group_advantages is minigrpo.update.advantages.group_advantages
    assert minigrpo.train is minigrpo.run.driver.train


def test_a_new_run_never_overwrites_an_earlier_runs_checkpoints(checkpoint, tmp_path):
    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    minigrpo.run.checkpoint.save_checkpoint(
        str(tmp_path / "run"), 100, model, tokenizer, {"step": 100}, keep=2
    )
    config = TrainConfig(output_dir=str(tmp_path / "run"), max_steps=1, batch_size=8, progress_bar=False)
    with pytest.raises(ValueError, match="already holds checkpoints of an earlier run .* resume it"):
        minigrpo.run.driver.build_run(
            checkpoint,
            Task(ROWS, [RewardSpec("test_count_x")]),
            GRPOConfig(num_generations=4, max_completion_length=12),
            config,
        )


def test_metrics_survive_a_line_cut_short_and_say_why_a_step_was_skipped(tmp_path):
    from minigrpo.run import MetricsLogger, console_line

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo'
    )
    logger = MetricsLogger(str(tmp_path), max_steps=5, start_step=2, progress_bar=False)
    logger.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    assert "no group with a reward signal" in console_line(3, {"skipped": 1.0, "update/no_groups": 1.0})
    assert "non-finite" in console_line(3, {"skipped": 1.0})


def test_a_step_measures_the_sampler_mismatch_and_fp32_reads_about_zero(checkpoint, tmp_path):
    """The sampler's log-probs travel on each Rollout; the update compares them with its own."""
    trainer = make_trainer(
        checkpoint, tmp_path, grpo=GRPOConfig(num_generations=4, max_completion_length=12, temperature=0.8)
    )
    stats, _ = trainer.train_step()
    assert stats["mismatch/logprob_abs_mean"] <= 1e-5 and stats["mismatch/logprob_abs_max"] <= 1e-4
    assert (
        stats["mismatch/ratio_outside_0.9_1.1_frac"] == 0.0
        and abs(stats["mismatch/seq_logratio_mean"]) <= 1e-4
    )


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_a_sampler_correction_leaves_an_fp32_step_as_it_was(checkpoint, tmp_path, mode):
    """With sampler and trainer ~1e-6 apart, every weight is ~1 (none masked): the same step."""
    steps = []
    for correction in ("none", mode):
        grpo = GRPOConfig(num_generations=4, max_completion_length=12, sampler_correction=correction)
        trainer = make_trainer(checkpoint, tmp_path, grpo=grpo, adam_epsilon=1e-3)
        steps.append((trainer.train_step()[0], weights(trainer.model)))
    (plain, before), (corrected, after) = steps
    kind = "masked" if mode.endswith("mask") else "truncated"
    assert corrected[f"sampler_correction/{kind}_frac"] == 0.0
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=1e-6, msg=name)


def test_a_checkpoint_loads_as_data_only_and_a_crafted_one_runs_nothing(checkpoint, tmp_path):
    """trainer_state.pt holds tensors and plain data (RNG states included): it loads with
    weights_only=True, so a file that would run code when unpickled is refused instead."""
    trainer = make_trainer(checkpoint, tmp_path)
    trainer.train_step()
    saved = Run(trainer).save()
    state = torch.load(os.path.join(saved, minigrpo.run.checkpoint.STATE_FILE), weights_only=True)
    assert state["step"] == 1 and set(state["rng"][0]) >= {"python", "numpy", "torch"}
    draws = []
    for _ in range(2):
        minigrpo.run.checkpoint.set_rng_states(state["rng"][0])
        draws.append((random.random(), float(np.random.rand()), float(torch.rand(1))))
    assert draws[0] == draws[1], draws

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"step": 1, "payload": Payload()}, os.path.join(saved, minigrpo.run.checkpoint.STATE_FILE))
    with pytest.raises(ValueError, match="holds more than tensors and plain data"):
        minigrpo.run.checkpoint.load_state(saved)
    assert not (tmp_path / "pwned").exists()


def test_trimming_metrics_on_resume_never_truncates_the_file_in_place(tmp_path, monkeypatch):
    """A kill between writing the trimmed history and publishing it leaves the whole old file."""
    from minigrpo.run import MetricsLogger

    history = "".join(f'{{"step": {i}, "loss": 0.5}}\n' for i in range(1, 601))
    (tmp_path / "metrics.jsonl").write_text(history)

    def killed(*_):
        raise KeyboardInterrupt  # as a kill would, just before the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        MetricsLogger(str(tmp_path), max_steps=600, start_step=300, progress_bar=False)
    assert (tmp_path / "metrics.jsonl").read_text() == history
    assert os.listdir(tmp_path) == ["metrics.jsonl"]  # and no temporary file left behind
    monkeypatch.undo()
    MetricsLogger(str(tmp_path), max_steps=600, start_step=300, progress_bar=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == history[: history.index('{"step": 301')]


@pytest.mark.parametrize("damaged", ["model.safetensors", "trainer_state.pt", "config.json"])
def test_resume_falls_back_past_a_damaged_checkpoint_and_says_so(checkpoint, tmp_path, damaged):
    from minigrpo.run import latest_intact_checkpoint, save_checkpoint

    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    out = str(tmp_path / "run")
    for step in (1, 2):
        save_checkpoint(out, step, model, tokenizer, {"step": step}, keep=3)
    path = os.path.join(latest_checkpoint(out), damaged)
    with open(path, "r+b") as f:  # cut short, as a full disk or a crash mid-copy leaves it
        f.truncate(os.path.getsize(path) // 2)
    notes = []
    assert latest_intact_checkpoint(out, notes.append).endswith("step-000001")
    assert len(notes) == 1 and "step-000002 is damaged (" in notes[0]
    assert load_state(latest_intact_checkpoint(out, notes.append))["step"] == 1


def test_a_prune_killed_midway_leaves_no_half_checkpoint(checkpoint, tmp_path):
    from minigrpo.run import save_checkpoint

    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    out = tmp_path / "run"
    save_checkpoint(str(out), 1, model, tokenizer, {"step": 1}, keep=2)
    parent = out / "checkpoints"
    # where a kill during pruning leaves it
    os.rename(parent / "step-000001", parent / ".deleting-step-000001")
    assert latest_checkpoint(str(out)) is None
    save_checkpoint(str(out), 2, model, tokenizer, {"step": 2}, keep=2)
    assert sorted(os.listdir(parent)) == ["step-000002"]


def test_the_initial_evaluation_is_measured_once_and_kept_across_resumes(checkpoint, tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {"eval/accuracy": 0.25, "held_out/step_accuracy": 0.5}

    fresh = make_trainer(checkpoint, tmp_path)
    first = initial_evaluation(fresh, measure, {"eval_data": "a", "eval_count": 4})
    assert first == {
        "initial_accuracy": 0.25,
        "initial_stats": {"eval/accuracy": 0.25, "held_out/step_accuracy": 0.5},
        "wall_seconds_before": 0.0,
        "held_out": {"eval_data": "a", "eval_count": 4},
    }
    resumed = make_trainer(checkpoint, tmp_path, resume=True)
    resumed.step = 3  # the policy has trained: its score is read back, never measured again
    assert (
        initial_evaluation(resumed, measure, {"eval_data": "a", "eval_count": 4}) == first and len(calls) == 1
    )
    with pytest.raises(
        ValueError, match="measured on eval_data a, eval_count 4, not on eval_data a, eval_count 3"
    ):
        initial_evaluation(resumed, measure, {"eval_data": "a", "eval_count": 3})
    # not valid JSON: said, with the path
    (tmp_path / "run" / "initial_eval.json").write_text('{"initial_acc')
    with pytest.raises(ValueError, match="initial_eval.json is not valid JSON"):
        initial_evaluation(resumed, measure, {"eval_data": "a", "eval_count": 4})
    (tmp_path / "run" / "initial_eval.json").write_text("null")  # JSON, but not the object it must be
    with pytest.raises(ValueError, match="initial_eval.json holds null, not a JSON object"):
        initial_evaluation(resumed, measure, {"eval_data": "a", "eval_count": 4})
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "run"))


def test_sampling_dtype_samples_with_a_copy_that_follows_the_policy(checkpoint, tmp_path):
    """sampling_dtype="bfloat16" on an fp32 policy: stage 1 samples with a bf16 copy, refreshed from the
    policy before each sampling call (a step's update shows in the next step's copy), and the sampler-
    trainer mismatch now measures the two precisions; in the policy's own dtype it reads ~0."""
    own = make_trainer(
        checkpoint, tmp_path / "own", grpo=GRPOConfig(num_generations=4, max_completion_length=12)
    )
    assert own.sampling_copy.copy is None and own.sampling_copy.synced() is own.model
    assert own.train_step()[0]["mismatch/logprob_abs_max"] < 1e-5
    grpo = GRPOConfig(num_generations=4, max_completion_length=12, sampling_dtype="bfloat16")
    trainer = make_trainer(checkpoint, tmp_path / "bf16", grpo=grpo, max_steps=2)
    stats, _ = trainer.train_step()
    assert stats["mismatch/logprob_abs_mean"] > 1e-4  # bf16 arithmetic against the fp32 update
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    sampling = trainer.sampling_copy.synced()
    assert sampling is trainer.sampling_copy.copy and not any(p.requires_grad for p in sampling.parameters())
    for copied, weight in zip(sampling.parameters(), trainer.model.parameters(), strict=True):
        assert copied.dtype == torch.bfloat16 and torch.equal(copied, weight.to(torch.bfloat16))


def test_sampling_dtype_is_checked_and_refused_with_fsdp():
    with pytest.raises(ValueError, match="sampling_dtype must be one of float32, bfloat16, float16"):
        GRPOConfig(sampling_dtype="int8")
    with pytest.raises(ValueError, match="sampling_dtype cannot be combined with fsdp"):
        TrainConfig(fsdp=True).check_against(GRPOConfig(sampling_dtype="bfloat16"))


def reward_rows(column: str, good, bad) -> list[dict]:
    """ROWS with `column`: `bad` in row 3 (counted from 1, as errors name it), `good` in the others."""
    return [{**row, column: bad if i == 2 else good} for i, row in enumerate(ROWS)]


SHOP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "data")
# (rows, rewards, what the refusal says): each found as the trainer is built, not at the step sampling it
BAD_REWARD_INPUTS = {
    "json_schema": (
        reward_rows("schema", {"type": "object"}, {"type": "object", "patern": "x"}),
        [RewardSpec("json")],
        "row 3: json reward: unknown schema keyword 'patern' in schema",
    ),
    "length_bound": (
        reward_rows("max_length", 5, -1),
        [RewardSpec("length", options={"soft": 2})],
        "row 3: length reward: max must be a number >= 0, got -1",
    ),
    "length_option": (
        ROWS,
        [RewardSpec("length", options={"unit": "lines", "max": 5, "soft": 2})],
        "row 1: length reward: unknown unit 'lines'",
    ),
    "code_test": (
        reward_rows("tests", ["assert True"], ["assert ("]),
        [RewardSpec("code")],
        "row 3: code reward: test 0 is not valid Python",
    ),
    "sql_gold_query": (
        [
            {**row, "database": "shop.sqlite"}
            for row in reward_rows("gold_sql", "SELECT 1", "SELECT * FROM nowhere")
        ],
        [RewardSpec("sql", options={"database_dir": SHOP})],
        "row 3: sql reward: the gold query 'SELECT * FROM nowhere' fails",
    ),
    "sql_columns_missing": (
        ROWS,
        [RewardSpec("test_count_x"), RewardSpec("sql")],
        "reward 'sql' needs the column(s) database, gold_sql; the task has answer",
    ),
    "accuracy_gold_not_text": (
        reward_rows("answer", "3", 3),
        [RewardSpec("accuracy")],
        "row 3: accuracy reward: the gold answer must be text, got 3",
    ),
    "countdown_target": (
        [{**row, "numbers": [1, 2]} for row in reward_rows("answer", "3", "three")],
        [RewardSpec("countdown")],
        "row 3: countdown reward: the target (answer) must be an integer, got 'three'",
    ),
    "named_twice": (
        ROWS,
        [RewardSpec("test_count_x"), RewardSpec("test_count_x", 0.5)],
        "the reward 'test_count_x' is named 2 times",
    ),
}


@pytest.mark.parametrize("case", BAD_REWARD_INPUTS)
def test_every_rows_reward_inputs_are_checked_when_the_trainer_is_built(checkpoint, tmp_path, case):
    """A reward's inputs (its columns, each row's values, the spec's options) are checked on every row before
    anything runs: a bad schema in row k once raised out of Trainer.train at the step that sampled it."""
    rows, rewards, message = BAD_REWARD_INPUTS[case]
    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    config = TrainConfig(output_dir=str(tmp_path / "run"), max_steps=1, batch_size=8, progress_bar=False)
    with pytest.raises(ValueError) as refused:
        grpo = GRPOConfig(num_generations=4, max_completion_length=12)
        Trainer(model, tokenizer, Task(rows, rewards), grpo, config)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("fails_in, saved", [("verify", 1), ("on_step", 2), ("update", None)])
def test_an_exception_mid_run_leaves_the_last_completed_step_saved(checkpoint, tmp_path, fails_in, saved):
    """With save_every=0 an exception at step 2 once lost step 1. Now the last completed step is saved before
    the exception goes on: a failure in stage 1-3 leaves the weights of step 1 (saved as step 1, with the
    prompt stream where step 1 left it), one after the update those of step 2. A failure inside the
    update leaves weights of neither step (or NaN): nothing is saved."""
    trainer = make_trainer(checkpoint, tmp_path, max_steps=3)

    def fail_at_step_2(stage):
        def run(*args, **kwargs):
            if trainer.step == 2:
                raise RuntimeError(f"{fails_in} failed")
            return stage(*args, **kwargs)

        return run

    stages = {"verify": trainer.verify, "update": trainer.updater, "on_step": lambda trainer: {}}
    stages[fails_in] = fail_at_step_2(stages[fails_in])
    trainer.verify = stages["verify"]
    trainer.updater = stages["update"]
    with pytest.raises(RuntimeError, match=f"{fails_in} failed"):
        Run(trainer).train(stages["on_step"])
    latest = latest_checkpoint(trainer.config.output_dir)
    if saved is None:
        assert latest is None
        return
    assert latest is not None and latest.endswith(f"step-{saved:06d}"), latest
    state = load_state(latest)
    assert state["step"] == saved
    stream = PromptStream(len(ROWS), trainer.config.seed)  # where `saved` steps of 2 prompts leave it
    for _ in range(saved):
        stream.next(2)
    assert state["data"] == stream.state()  # a resume asks the prompts of the step after
    on_disk = minigrpo.load_pretrained(latest)[0].state_dict()
    assert all(torch.equal(on_disk[k], v) for k, v in trainer.model.state_dict().items())


def test_completions_that_fill_the_whole_context_leave_no_room_for_a_prompt(checkpoint, tmp_path):
    """max_completion_length equal to the context (96) is refused by name, as one past it is: no prompt
    fits in the 0 tokens it leaves."""
    for length in (96, 97):
        with pytest.raises(
            ValueError,
            match=rf"max_completion_length {length} leaves no room for a prompt: the model's context is 96",
        ):
            make_trainer(
                checkpoint, tmp_path, grpo=GRPOConfig(num_generations=4, max_completion_length=length)
            )


def test_gradient_checkpointing_is_the_model_s_own_as_it_was_built_and_the_trainer_only_checks_it(
    checkpoint, tmp_path
):
    """load_pretrained builds the model to recompute its blocks in backward (build_run passes
    TrainConfig.gradient_checkpointing); the trainer never switches it, and refuses a model built
    against its TrainConfig."""
    task = Task(ROWS, [RewardSpec("test_count_x")])
    grpo = GRPOConfig(num_generations=4, max_completion_length=12)
    config = TrainConfig(
        output_dir=str(tmp_path / "run"), batch_size=8, progress_bar=False, gradient_checkpointing=True
    )
    assert minigrpo.run.build_run(checkpoint, task, grpo, config).trainer.model.gradient_checkpointing
    model, tokenizer = minigrpo.load_pretrained(checkpoint)
    assert not model.gradient_checkpointing
    with pytest.raises(ValueError, match="gradient_checkpointing is True, but the policy was built with"):
        Trainer(model, tokenizer, task, grpo, config)
    assert not model.gradient_checkpointing
