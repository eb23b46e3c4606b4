"""On-policy distillation (update/distillation.py, run/teacher.py): the full form's loss and gradient equal
TRL's generalized_jsd_loss at its beta = 1; the token form's advantages equal a hand computation; a teacher
identical to the student gives zero KL and zero gradient; a tool's observation tokens stay out of the KL; a
run with a teacher trains (LoRA students too), resumes bit for bit, and refuses a changed teacher; each bad
input is one line before any step."""

import json
import re
import shutil

import pytest
import torch
from helpers import ROWS, tiny_model, tiny_policy, tiny_tokenizer, tiny_train_config, write_json

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, Trainer
from minigrpo.model import Adapters, add_adapters
from minigrpo.rollout import Rollout, collate
from minigrpo.run import Run, Trace, console_line, latest_checkpoint, load_state
from minigrpo.run import teacher as teacher_module
from minigrpo.run.driver import build_run
from minigrpo.run.teacher import weights_digest
from minigrpo.run.trace import MAX_TOKENS_SHOWN
from minigrpo.update import (
    ChunkedReverseKL,
    DistilledLogprobs,
    TeacherForward,
    full_vocabulary_reverse_kl,
    teacher_stats,
    token_logprobs,
)
from minigrpo.update.distillation import FullDistillation, TokenDistillation


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A student and a teacher of one tokenizer (different weights), and the teacher's directory."""
    root = tmp_path_factory.mktemp("distillation")
    student = tiny_policy(str(root / "student"), max_position_embeddings=96)
    teacher = root / "teacher"
    shutil.copytree(student, teacher)
    tokenizer = minigrpo.Tokenizer.from_directory(student)
    minigrpo.save_pretrained(
        tiny_model(seed=1, vocab_size=tokenizer.vocab_size, max_position_embeddings=96), tokenizer, teacher
    )
    return student, str(teacher), root


def make(student, output_dir, grpo, **train) -> Trainer:
    model, tokenizer = minigrpo.load_pretrained(student)
    task = Task(ROWS, [RewardSpec("test_count_x")])
    return Trainer(model, tokenizer, task, grpo, tiny_train_config(output_dir, **train), model_path=student)


def distilling(teacher, **options) -> GRPOConfig:
    return GRPOConfig(num_generations=4, max_completion_length=8, teacher_model=teacher, **options)


# -- the two forms' numbers ----------------------------------------------------------------------------
def test_the_full_forms_loss_and_gradient_equal_trls_reverse_kl(trl_reference):
    """FullDistillation's loss term over chunked hidden states, and the (B, T, V) path, equal TRL's
    generalized_jsd_loss at beta = 1 (its reverse KL) with labels -100 where the mask is 0; the gradients
    of the policy's hidden states and LM head too. The teacher is wider than the student."""
    trl_loss = trl_reference.generalized_jsd_loss()
    generator = torch.Generator().manual_seed(0)
    B, T, V, H, Ht = 3, 5, 11, 6, 9
    hidden = torch.randn(B * T, H, generator=generator, dtype=torch.float64, requires_grad=True)
    head = torch.randn(V, H, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher_hidden = torch.randn(B * T, Ht, generator=generator, dtype=torch.float64)
    teacher_head = torch.randn(V, Ht, generator=generator, dtype=torch.float64)
    mask = torch.ones(B, T)
    mask[0, 3:] = 0  # padding
    mask[2, 1] = 0  # a tool's observation
    temperature = 0.7

    kl = ChunkedReverseKL.apply(hidden, head, teacher_hidden, teacher_head, 1 / temperature, 4).view(B, T)
    ours, stats = FullDistillation(1.0, teacher_head).loss(
        torch.zeros((), dtype=torch.float64), {}, [kl], mask, int(mask.sum())
    )
    ours_grads = torch.autograd.grad(ours, (hidden, head))
    logits = (hidden @ head.T).view(B, T, V)
    teacher_logits = (teacher_hidden @ teacher_head.T).view(B, T, V)
    labels = torch.where(mask.bool(), 0, -100)
    theirs = trl_loss(logits, teacher_logits, labels=labels, beta=1.0, temperature=temperature)
    theirs_grads = torch.autograd.grad(theirs, (hidden, head))
    slow = full_vocabulary_reverse_kl(logits.detach(), teacher_logits, temperature)  # (B, T)

    assert abs(float(ours.detach()) - float(theirs.detach())) <= 1e-6 and float(theirs.detach()) > 0.1
    assert torch.allclose(kl.detach(), slow, atol=1e-12, rtol=0)
    for mine, reference in zip(ours_grads, theirs_grads):
        assert (mine - reference).abs().max() <= 1e-6
    assert stats["distill/reverse_kl_exact"] == pytest.approx(float(theirs.detach()), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_kl_takes_a_frozen_head_and_bfloat16_weights(dtype):
    """A LoRA student's head is frozen: only its hidden states get a gradient. In bf16 the logits and the
    KL are fp32, within bf16's rounding of the fp64 reference on the same values."""
    generator = torch.Generator().manual_seed(1)
    N, V, H = 7, 13, 8
    hidden = torch.randn(N, H, generator=generator).to(dtype).requires_grad_()
    head, teacher_hidden, teacher_head = (
        torch.randn(*shape, generator=generator).to(dtype) for shape in ((V, H), (N, H), (V, H))
    )
    kl = ChunkedReverseKL.apply(hidden, head, teacher_hidden, teacher_head, 1 / 0.7, 3)
    (grad,) = torch.autograd.grad(kl.sum(), hidden)
    exact = hidden.detach().double().requires_grad_()
    slow = full_vocabulary_reverse_kl(
        exact @ head.double().T, teacher_hidden.double() @ teacher_head.double().T, 0.7
    )
    (slow_grad,) = torch.autograd.grad(slow.sum(), exact)
    tolerance = 1e-5 if dtype == torch.float32 else 0.02
    assert kl.dtype == torch.float32 and grad.dtype == dtype
    assert (kl.double() - slow).abs().max() <= tolerance * slow.abs().max()
    assert (grad.double() - slow_grad).abs().max() <= tolerance * slow_grad.abs().max()


def test_the_policys_module_gives_the_reverse_kl_of_its_logits_at_the_temperature():
    """DistilledLogprobs' KL from the shared-prompt hidden states equals the (B, T, V) path on both
    models' plain logits, at the sampling temperature."""
    model, teacher = tiny_model(seed=3), tiny_model(seed=4)
    rollouts = [Rollout(prompt_ids=[3, 4, 5], completion_ids=[9, 10, 11], finish_reason="stop")] * 2
    batch = collate(rollouts, pad_id=0, device="cpu")
    inputs = (batch.input_ids, batch.attention_mask, batch.completion_start, 0.6, 2)
    with torch.no_grad():
        _, teacher_hidden = TeacherForward(teacher)(*inputs)
        _, _, kl = DistilledLogprobs(model, teacher.head_weight)(*inputs, teacher_hidden)
        positions = slice(batch.completion_start - 1, -1)  # those that predict the completion tokens
        logits = model.logits(model.hidden_states(batch.input_ids, batch.attention_mask)[:, positions])
        teacher_logits = teacher.logits(
            teacher.hidden_states(batch.input_ids, batch.attention_mask)[:, positions]
        )
    slow = full_vocabulary_reverse_kl(logits, teacher_logits, 0.6)  # (B, T)
    assert torch.allclose(kl, slow, atol=1e-6) and float(slow.min()) > 0
    assert torch.equal(
        full_vocabulary_reverse_kl(logits, teacher_logits, 0),
        full_vocabulary_reverse_kl(logits, teacher_logits, 1),
    )
    with torch.no_grad():  # greedy sampling (temperature 0) takes its log-probs at temperature 1
        greedy = DistilledLogprobs(model, teacher.head_weight)(*inputs[:3], 0, 2, teacher_hidden)[2]
    assert torch.allclose(greedy, full_vocabulary_reverse_kl(logits, teacher_logits, 1), atol=1e-6)


def test_the_full_forms_advantages_and_loss_share():
    """The verifier's advantages times 1 - c, per completion and per token; the KL term's share of the
    loss's magnitude, 0 when there is no loss at all."""
    full = FullDistillation(0.25, torch.zeros(1, 1))
    outcome, per_token, stats = full.advantages([], [2.0, -1.0], [None, torch.tensor([0.5, -0.5])])
    assert outcome == [1.5, -0.75] and per_token[0] is None and per_token[1].tolist() == [0.375, -0.375]
    assert stats == {}
    assert full.update_stats({"loss": 0.3, "distill/loss": 0.2})["distill/loss_share"] == pytest.approx(2 / 3)
    assert full.update_stats({"loss": 0.0, "distill/loss": 0.0})["distill/loss_share"] == 0.0


def test_the_token_forms_advantages_equal_a_hand_computation():
    """D_t = log q(x_t) - log p(x_t) on the policy's tokens, 0 on a tool's observation; mixed c D_t +
    (1 - c) A_t with the outcome advantage or the per-token one; the reverse KL estimate and the share."""
    first = Rollout(
        prompt_ids=[1],
        completion_ids=[5, 6, 7, 8],
        finish_reason="stop",
        generated=[True, False, True, True],  # token 1 is a tool's observation
        sampler_logprobs=torch.tensor([-1.0, 0.0, -0.5, -2.0]),
        teacher_logprobs=torch.tensor([-0.5, -3.0, -1.5, -2.0]),
    )
    second = Rollout(
        prompt_ids=[1],
        completion_ids=[5, 6],
        finish_reason="stop",
        sampler_logprobs=torch.tensor([-0.25, -1.0]),
        teacher_logprobs=torch.tensor([-1.25, -0.5]),
    )
    per_token = [None, torch.tensor([0.5, -0.5])]
    outcome, mixed, stats = TokenDistillation(0.25).advantages([first, second], [2.0, 0.0], per_token)
    # D = (0.5, 0, -1, 0) and (-1, 0.5); A^RL = (2, 2, 2, 2) and (0.5, -0.5)
    assert outcome == [2.0, 0.0]
    assert mixed[0].tolist() == [0.125 + 1.5, 1.5, -0.25 + 1.5, 1.5]
    assert mixed[1].tolist() == [-0.25 + 0.375, 0.125 - 0.375]
    # |c D| over the policy's tokens: 0.125 + 0.25 + 0.25 + 0.125; |(1 - c) A|: 1.5 * 3 + 0.375 * 2
    assert stats["distill/loss_share"] == pytest.approx(0.75 / (0.75 + 5.25))
    # log p - log q over the five policy tokens: -0.5, 1, 0, 1, -0.5
    assert teacher_stats([first, second])["distill/reverse_kl"] == pytest.approx(1.0 / 5)


def test_a_teacher_identical_to_the_student_gives_zero_kl_and_zero_gradient():
    """The same weights as teacher: the exact KL of every position is 0 and so is every gradient of the
    distillation term; the teacher's log-probs are the policy's, so the token form's advantages are 0."""
    model = tiny_model(seed=3)
    rollouts = [Rollout(prompt_ids=[3, 4, 5], completion_ids=[9, 10, 11, 12], finish_reason="stop")]
    rollouts.append(Rollout(prompt_ids=[3, 4, 5], completion_ids=[13, 14], finish_reason="stop"))
    batch = collate(rollouts, pad_id=0, device="cpu")
    inputs = (batch.input_ids, batch.attention_mask, batch.completion_start, 0.9, 2)
    with torch.no_grad():
        teacher_logprobs, teacher_hidden = TeacherForward(tiny_model(seed=3))(*inputs)
    student = DistilledLogprobs(model, tiny_model(seed=3).head_weight)
    logprobs, _, kl = student(*inputs, teacher_hidden)
    term, _ = FullDistillation(1.0, student.teacher_head).loss(
        torch.zeros(()), {}, [kl], batch.completion_mask, 6
    )
    term.backward()
    assert torch.equal(kl, torch.zeros_like(kl)) and float(term.detach()) == 0.0
    assert all(p.grad is None or torch.equal(p.grad, torch.zeros_like(p.grad)) for p in model.parameters())
    own, _ = token_logprobs(model, *inputs[:4], group_size=2)
    assert torch.equal(teacher_logprobs, own) and torch.equal(logprobs.detach(), own)


def test_a_tools_observation_tokens_stay_out_of_the_kl():
    """The full form averages the KL over the policy's tokens alone: whatever it is on a tool's
    observation, the loss term and the exact KL stat are those of the other tokens."""
    rollouts = [
        Rollout(prompt_ids=[1], completion_ids=[5, 6, 7], finish_reason="stop", generated=[True, False, True])
    ]
    mask = collate(rollouts, pad_id=0, device="cpu").completion_mask  # (1, 3)
    kl = torch.tensor([[0.5, 100.0, 1.5]])
    term, stats = FullDistillation(0.5, torch.zeros(1, 1)).loss(torch.zeros(()), {}, [kl], mask, 2)
    assert float(term) == pytest.approx(0.5 * (0.5 + 1.5) / 2) and stats["distill/reverse_kl_exact"] == 1.0
    # a step whose every completion is left out of the loss (truncated, masked): no term, no NaN
    term, stats = FullDistillation(0.5, torch.zeros(1, 1)).loss(torch.zeros(()), {}, [kl], mask * 0, 0)
    assert float(term) == 0.0 and stats["distill/reverse_kl_exact"] == 0.0
    rollouts[0].in_loss = False
    rollouts[0].sampler_logprobs, rollouts[0].teacher_logprobs = torch.zeros(3), torch.ones(3)
    assert teacher_stats(rollouts) == {"distill/reverse_kl": 0.0}


# -- a run with a teacher --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "form, options",
    [("token", dict(distillation_coef=0.5)), ("full", dict(distillation_coef=0.5, num_iterations=2))],
)
def test_a_run_with_a_teacher_trains_and_leaves_the_teacher_as_it_was(policies, tmp_path, form, options):
    student, teacher, _ = policies
    trainer = make(student, tmp_path, distilling(teacher, distillation_form=form, **options))
    before = {k: v.clone() for k, v in trainer.plan.teacher.state_dict().items()}
    stats, _ = trainer.train_step()
    assert stats["distill/reverse_kl"] > 0 and 0 < stats["distill/loss_share"] < 1
    assert stats["time/teacher"] > 0 and stats["skipped"] == 0.0
    assert f"rkl {stats['distill/reverse_kl']:.4f}" in console_line(1, stats)
    assert all(torch.equal(before[k], v) for k, v in trainer.plan.teacher.state_dict().items())
    assert (
        not any(p.requires_grad for p in trainer.plan.teacher.parameters())
        and not trainer.plan.teacher.training
    )
    assert f"distillation_form={form}" in trainer.describe_objective()
    if form == "full":  # the exact KL of the update, and its term in the loss
        assert stats["distill/reverse_kl_exact"] > 0 and stats["distill/loss"] > 0


def test_a_run_without_a_teacher_has_no_teacher_stage(policies, tmp_path):
    student, _, _ = policies
    trainer = make(student, tmp_path, GRPOConfig(num_generations=4, max_completion_length=8))
    stats, _ = trainer.train_step()
    assert trainer.plan.teacher is None and not [k for k in stats if "distill" in k or k == "time/teacher"]


def test_a_lora_student_trains_its_adapters_beside_a_teacher_and_keeps_its_base_as_kl_reference(
    policies, tmp_path
):
    student, teacher, _ = policies
    trainer = make(student, tmp_path, distilling(teacher, beta=0.1), lora_rank=2)
    stats, _ = trainer.train_step()
    assert trainer.plan.reference is None  # the KL's reference: the student's base, its adapters off
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in name for name in trainable)
    assert trainer.plan.teacher is not trainer.model and stats["distill/reverse_kl"] > 0 and "kl" in stats


def test_a_resumed_run_reloads_its_teacher_and_repeats_the_straight_run(policies, tmp_path):
    """Stopped after step 1 and resumed: step 2 gives the straight run's weights bit for bit (the teacher
    is reloaded from teacher_model, never saved); a teacher changed since is refused in one line."""
    student, teacher, root = policies
    grpo = distilling(teacher, distillation_form="full")
    task = Task(ROWS, [RewardSpec("test_count_x")])
    straight = make(student, tmp_path / "straight", grpo)
    straight.train_step()
    straight.train_step()
    Run(make(student, tmp_path / "stopped", grpo, stop_at_step=1)).train()
    resumed = build_run(student, task, grpo, tiny_train_config(tmp_path / "stopped", resume=True)).trainer
    resumed.train_step()
    assert all(torch.equal(v, resumed.model.state_dict()[k]) for k, v in straight.model.state_dict().items())
    saved = load_state(latest_checkpoint(str(tmp_path / "stopped")))  # the teacher's weights named, not held
    assert saved["teacher_sha256"] == weights_digest(minigrpo.load_pretrained(teacher)[0])
    assert saved["teacher_sha256"] == resumed.plan.teacher_sha256
    changed = root / "changed-teacher"
    shutil.copytree(teacher, changed)
    tokenizer = minigrpo.Tokenizer.from_directory(teacher)
    minigrpo.save_pretrained(
        tiny_model(seed=2, vocab_size=tokenizer.vocab_size, max_position_embeddings=96), tokenizer, changed
    )
    with pytest.raises(ValueError, match="distilled from a teacher whose weights have changed") as error:
        build_run(
            student,
            task,
            replace_teacher(grpo, str(changed)),
            tiny_train_config(tmp_path / "stopped", resume=True),
        )
    assert "\n" not in str(error.value)


def test_a_teacher_given_as_a_peft_adapter_directory_is_its_base_with_the_adapters(policies, tmp_path):
    """An adapter directory holds no base weights: the teacher is loaded as its base with the adapters on,
    and its digest is of both (a file hash of the directory alone would fail, or miss the base)."""
    student, _, root = policies
    adapted, tokenizer = minigrpo.load_pretrained(student)
    add_adapters(adapted, Adapters(rank=2, alpha=4, targets=("q_proj",)), seed=0)
    with torch.no_grad():
        adapted.layers[0].self_attn.q_proj.lora_B.weight.add_(0.5)  # adapters that change the base's outputs
    minigrpo.save_pretrained(adapted, tokenizer, str(root / "adapter-teacher"))
    trainer = make(student, tmp_path, distilling(str(root / "adapter-teacher")))
    assert trainer.plan.teacher.adapters is not None and trainer.plan.teacher_sha256 == weights_digest(
        adapted
    )
    assert trainer.plan.teacher_sha256 != weights_digest(minigrpo.load_pretrained(student)[0])
    assert trainer.train_step()[0]["distill/reverse_kl"] > 0


def replace_teacher(grpo: GRPOConfig, path: str) -> GRPOConfig:
    return GRPOConfig(**{**grpo.__dict__, "teacher_model": path})


# -- bad input: one line, before any step ----------------------------------------------------------------
def test_bad_teachers_are_refused_in_one_line_before_any_step(policies, tmp_path, monkeypatch):
    student, teacher, root = policies
    other_vocabulary = tiny_policy(str(root / "other-vocabulary"), extra_specials=("<calc>",))
    other_template = root / "other-template"
    shutil.copytree(teacher, other_template)
    config = (other_template / "tokenizer_config.json").read_text()
    write_json(other_template / "tokenizer_config.json", {**json.loads(config), "chat_template": "{{ x }}"})
    other_rows = root / "other-rows"
    tokenizer = tiny_tokenizer(str(other_rows))
    minigrpo.save_pretrained(tiny_model(vocab_size=tokenizer.vocab_size + 3), tokenizer, other_rows)
    cases = [
        (str(root / "missing"), "token", f"teacher_model {root / 'missing'}: no such checkpoint directory"),
        (
            other_vocabulary,
            "token",
            "does not share the student's tokenizer: its token 5 is '<calc>', the student's '!'",
        ),
        (str(other_template), "full", "does not share the student's tokenizer: its chat template differs"),
        (str(other_rows), "full", f"has {tokenizer.vocab_size + 3} rows in its LM head (vocab_size)"),
    ]
    for path, form, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
            make(student, tmp_path, distilling(path, distillation_form=form))
        assert "\n" not in str(error.value)
    monkeypatch.setattr(teacher_module, "free_memory", lambda device: 1000)
    with pytest.raises(ValueError, match=r"needs at least 0\.00 GB on cpu .* but cpu has 0\.00 GB free"):
        make(student, tmp_path, distilling(teacher, distillation_form="full"))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(teacher_model="t", distillation_coef=1.5), "distillation_coef must be in [0, 1]"),
        (dict(distillation_coef=0.5), "distillation_coef=0.5 is read only with a teacher_model"),
        (dict(teacher_model="t", loss_type="gmpo"), "distillation_form='token' gives every token"),
        (dict(teacher_model="t", dynamic_sampling=True), "with distillation_coef=1 the rewards carry"),
    ],
)
def test_bad_distillation_settings_are_refused_by_the_config(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GRPOConfig(**options)


def test_the_trace_shows_the_teachers_log_prob_beside_the_policys(policies, tmp_path):
    """Each traced completion's tokens that the teacher and the policy rate farthest apart, with both
    log-probs as the rollouts hold them, on the console; every trained token's teacher log-prob in its
    numbers on the page."""
    student, teacher, _ = policies
    trainer = make(student, tmp_path, distilling(teacher))
    lines = []
    trace = Trace(write=lines.append, html_path=str(tmp_path / "trace.html"))
    trainer.train_step(trace)
    rows = [line for line in lines if "[3 teacher]" in line]
    assert len(rows) == 4
    for row, shown, r in zip(rows, trace.record["completions"], trace.group):
        cells = re.findall(r"(\d+):'(?:[^']*)' (-?\d+\.\d\d)/(-?\d+\.\d\d)", row)
        assert len(cells) == min(MAX_TOKENS_SHOWN, len(r.completion_ids))
        for position, policy, taught in cells:
            assert float(taught) == round(float(r.teacher_logprobs[int(position)]), 2)
            assert float(policy) == round(shown["tokens"][int(position)][1], 2)  # log p before the update
    page = (tmp_path / "trace.html").read_text()
    titles = [float(x) for x in re.findall(r"teacher log p (-?\d+\.\d+)'", page)]
    expected = [round(x, 6) for shown in trace.record["completions"] for x in shown["teacher_logprobs"]]
    assert titles == expected
