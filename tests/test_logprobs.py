"""Stage 4's log-probs (update/logprobs.py): each completion token's log-prob and entropy from a
padded batch equal those of its row run alone, at the sampling temperature, and the chunked LM
head and the shared-prompt forward equal the full-vocabulary path, gradients included."""

import math

import pytest
import torch
from helpers import tiny_model

from minigrpo.rollout import Rollout, collate
from minigrpo.update import full_vocabulary_logprobs, token_logprobs


def close(actual, expected, atol=1e-6):
    return torch.allclose(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


# token_logprobs: prompts of 3 and 5 tokens, left padded to Lp = 5; completions of 4 and 2 tokens,
# right padded to Tc = 4. Padding uses id 0.
PROMPTS = [[5, 9, 2], [13, 4, 77, 31, 8]]
COMPLETIONS = [[64, 3, 3, 50], [90, 11]]


def padded_batch():
    ids = torch.tensor([[0, 0, 5, 9, 2, 64, 3, 3, 50], [13, 4, 77, 31, 8, 90, 11, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    return ids, mask  # (2, 5 + 4)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


def unpadded_logits(model, row):
    """(len(completion), V) logits predicting each completion token, from the row alone without padding."""
    prompt, completion = PROMPTS[row], COMPLETIONS[row]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion]))[0]  # (n, V)
    return logits[len(prompt) - 1 : -1]


def test_collate_pads_prompts_left_and_completions_right_as_token_logprobs_expects():
    """The update's batches come from rollout.collate: the hand-padded batch above, its masks included
    (a prompt's left padding is never attended), and the second row's completion masked past its end."""
    rollouts = [
        Rollout(prompt_ids=p, completion_ids=c, finish_reason="stop") for p, c in zip(PROMPTS, COMPLETIONS)
    ]
    rollouts[1].in_loss = False
    batch = collate(rollouts, pad_id=0, device="cpu")
    ids, mask = padded_batch()
    assert (
        torch.equal(batch.input_ids, ids)
        and torch.equal(batch.attention_mask, mask)
        and batch.completion_start == 5
    )
    assert batch.completion_mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]


def test_token_logprobs_equal_each_row_computed_alone(model):
    ids, mask = padded_batch()
    logprobs, entropies = token_logprobs(model, ids, mask, completion_start=5, temperature=0.7)
    assert logprobs.shape == entropies.shape == (2, 4)
    assert logprobs.requires_grad and entropies.requires_grad  # the entropy bonus differentiates both
    for row in range(2):
        n = len(COMPLETIONS[row])
        scaled = unpadded_logits(model, row) / 0.7  # (n, V)
        expected = scaled.log_softmax(-1).gather(-1, torch.tensor(COMPLETIONS[row])[:, None]).squeeze(-1)
        assert close(logprobs[row, :n].detach(), expected, atol=1e-5)


def test_token_logprobs_temperature_zero_means_one(model):
    ids, mask = padded_batch()
    greedy, greedy_entropies = token_logprobs(model, ids, mask, 5, temperature=0)
    plain, plain_entropies = token_logprobs(model, ids, mask, 5, temperature=1.0)
    assert torch.equal(greedy, plain) and torch.equal(greedy_entropies, plain_entropies)
    hotter, _ = token_logprobs(model, ids, mask, 5, temperature=0.7)
    assert not torch.allclose(greedy, hotter)


def test_entropies_are_those_of_the_sampling_distribution(model):
    ids, mask = padded_batch()
    _, entropies = token_logprobs(model, ids, mask, 5, temperature=0.7)
    assert (entropies >= 0).all() and (entropies <= math.log(97) + 1e-5).all()  # 0 <= H <= log V
    # Second completion token of row 0, by hand: p = softmax(z / T), H = -sum p log p.
    z = (unpadded_logits(model, 0)[1] / 0.7).double()
    p = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
    assert entropies[0, 1].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)


# --- the chunked LM head against the full-vocabulary reference -----------------------------------
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
@pytest.mark.parametrize("chunk_rows", [1, 3, 1000])
@pytest.mark.parametrize("tied", [True, False])
def test_chunked_logprobs_equal_the_full_vocabulary_path_with_gradients(dtype, tolerance, chunk_rows, tied):
    """The padded row first: padding inside the batch, and a real token (of weight 2.0) as its last
    row, which a backward that skipped the last row would leave unset."""
    model = tiny_model(seed=2, tie_word_embeddings=tied).to(dtype)
    ids, mask = (t[[1, 0]] for t in padded_batch())
    # padded tokens weigh 0
    weights = torch.tensor([[1.5, -0.4, 0.0, 0.0], [0.3, -1.2, 0.7, 2.0]], dtype=dtype)
    results = []
    for path in ("chunked", "full"):
        model.zero_grad()
        if path == "chunked":
            logprobs, entropies = token_logprobs(model, ids, mask, 5, temperature=0.7, chunk_rows=chunk_rows)
        else:
            logprobs, entropies = full_vocabulary_logprobs(model, ids, mask, 5, temperature=0.7)
        (logprobs * weights).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((logprobs.detach(), entropies, grads))
    (lp, ent, grads), (lp_ref, ent_ref, grads_ref) = results
    assert (lp - lp_ref).abs().max() <= tolerance and (ent - ent_ref).abs().max() <= tolerance
    for name in grads_ref:
        scale = max(1.0, grads_ref[name].abs().max().item())
        assert (grads[name] - grads_ref[name]).abs().max() <= tolerance * scale, name


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
@pytest.mark.parametrize("chunk_rows", [1, 3, 1000])
def test_the_chunked_entropy_gradient_equals_the_full_vocabulary_one(dtype, tolerance, chunk_rows):
    """The entropy bonus differentiates the entropies: the chunked head's d H / d z, alone and beside the
    log-probs' gradient, equals autograd's through the full (B, Tc, V) softmax."""
    model = tiny_model(seed=3).to(dtype)
    ids, mask = padded_batch()
    logprob_weights = torch.tensor([[0.2, -0.4, 0.0, 0.0], [0.3, -1.2, 0.7, 2.0]], dtype=dtype)
    entropy_weights = torch.tensor([[1.0, 0.5, 0.0, 0.0], [-0.7, 0.3, 1.1, 0.4]], dtype=dtype)
    for with_logprobs in (False, True):
        results = []
        for path in ("chunked", "full"):
            model.zero_grad()
            if path == "chunked":
                logprobs, entropies = token_logprobs(
                    model, ids, mask, 5, temperature=0.7, chunk_rows=chunk_rows
                )
            else:
                logprobs, entropies = full_vocabulary_logprobs(model, ids, mask, 5, temperature=0.7)
            loss = (entropies * entropy_weights).sum()
            if with_logprobs:
                loss = loss + (logprobs * logprob_weights).sum()
            loss.backward()
            results.append({name: p.grad.clone() for name, p in model.named_parameters()})
        grads, grads_ref = results
        assert any(g.abs().max() > 0 for g in grads_ref.values())
        for name in grads_ref:
            scale = max(1.0, grads_ref[name].abs().max().item())
            assert (grads[name] - grads_ref[name]).abs().max() <= tolerance * scale, (name, with_logprobs)


def grouped_batch(G=3):
    """Two prompts (left-padded, of lengths 3 and 5) with G right-padded completions each, rows grouped."""
    prompts, completions = (
        [[5, 9, 2], [13, 4, 77, 31, 8]],
        [[64, 3], [50, 12, 7, 1], [96], [90, 11, 6], [2], [40, 41]],
    )
    rows = [(prompts[i // G], completions[i % 6]) for i in range(2 * G)]
    Lp, Tc = 5, max(len(c) for _, c in rows)
    ids, mask = (
        torch.zeros(len(rows), Lp + Tc, dtype=torch.long),
        torch.zeros(len(rows), Lp + Tc, dtype=torch.long),
    )
    for r, (p, c) in enumerate(rows):
        ids[r, Lp - len(p) : Lp], ids[r, Lp : Lp + len(c)] = torch.tensor(p), torch.tensor(c)
        mask[r, Lp - len(p) : Lp + len(c)] = 1
    return ids, mask, Lp


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_shared_prompt_forward_equals_the_plain_one_with_gradients(dtype, tolerance, checkpointing):
    model = tiny_model(seed=4).to(dtype).train()
    model.gradient_checkpointing = checkpointing
    ids, mask, Lp = grouped_batch(G=3)
    weights = torch.randn(
        ids.shape[0], ids.shape[1] - Lp, generator=torch.Generator().manual_seed(0), dtype=dtype
    )
    weights = weights * mask[:, Lp:]  # padded tokens weigh 0
    results = []
    for group_size in (1, 3):
        model.zero_grad()
        logprobs, entropies = token_logprobs(model, ids, mask, Lp, temperature=0.8, group_size=group_size)
        (logprobs * weights).sum().backward()
        results.append(
            (logprobs.detach(), entropies, {n: p.grad.clone() for n, p in model.named_parameters()})
        )
    (plain_lp, plain_h, plain_g), (shared_lp, shared_h, shared_g) = results
    real = mask[:, Lp:].bool()
    assert (shared_lp - plain_lp)[real].abs().max() <= tolerance
    assert (shared_h - plain_h)[real].abs().max() <= tolerance
    for name, grad in plain_g.items():
        assert (shared_g[name] - grad).abs().max() <= tolerance * max(1.0, grad.abs().max()), (
            name,
            (shared_g[name] - grad).abs().max(),
        )


def test_a_shared_prompt_batch_must_hold_whole_groups_of_one_prompt():
    model = tiny_model(seed=4)
    ids, mask, Lp = grouped_batch(G=3)
    with pytest.raises(ValueError, match="groups of 2 consecutive rows"):
        token_logprobs(model, ids, mask, Lp, temperature=1.0, group_size=2)  # rows 2 and 3 differ in prompt
    with pytest.raises(ValueError, match="groups of 4 consecutive rows"):
        token_logprobs(model, ids, mask, Lp, temperature=1.0, group_size=4)  # 6 rows
