"""On-policy distillation (update/distillation.py): the full form's loss and gradient equal TRL's
generalized_jsd_loss at its beta = 1; the token form's advantages equal a hand computation; a teacher
identical to the student gives zero KL and zero gradient; a tool's observation tokens stay out of the KL."""

import pytest
import torch
from helpers import tiny_model

from minigrpo.rollout import Rollout, collate
from minigrpo.update import (
    ChunkedReverseKL,
    DistilledLogprobs,
    TeacherForward,
    full_vocabulary_reverse_kl,
    teacher_stats,
    token_logprobs,
)
from minigrpo.update.distillation import FullDistillation, TokenDistillation


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
