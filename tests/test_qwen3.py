"""The hand-written decoder is the same function as transformers' Qwen3, with and without cache and
padding."""

import pytest
import torch
from helpers import CONFIGS, TINY, tiny_model

import minigrpo
import minigrpo.model.layers as layers

ATOL = 1e-4


def hf_twin(model: minigrpo.Qwen3):
    """transformers' Qwen3ForCausalLM holding the same weights (no disk involved). transformers is imported
    here, where it is used, so that collecting the suite (or running other files) does not import it."""
    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM(HFConfig(**model.config.to_dict())).eval()
    missing, unexpected = hf.load_state_dict(minigrpo.model.weights.to_hf_state_dict(model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return hf


def left_pad(prompts):
    """(B, T) ids and mask, each prompt ending at the last column (the layout of a training batch)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


PROMPTS = [[5, 9, 2, 77, 31, 8, 64], [13, 4], [90, 1, 1, 3, 45]]


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers(name):
    model = tiny_model(**CONFIGS[name])
    hf = hf_twin(model)
    ids = torch.randint(0, TINY["vocab_size"], (3, 13))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= ATOL


def test_left_padded_batch_equals_transformers_with_positions():
    model = tiny_model()
    hf = hf_twin(model)
    ids, mask = left_pad(PROMPTS)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() <= ATOL


@pytest.mark.parametrize("padding", ["left", "right"])
def test_padded_rows_equal_prompts_run_alone(padding):
    model = tiny_model()
    if padding == "left":
        ids, mask = left_pad(PROMPTS)
    else:
        ids, mask = (t.flip(-1) for t in left_pad([p[::-1] for p in PROMPTS]))
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        for row, prompt in enumerate(PROMPTS):
            alone = model(torch.tensor([prompt]))[0]
            assert (batched[row][mask[row].bool()] - alone).abs().max() <= ATOL


def test_cached_decoding_equals_full_forward():
    """Prefill right-padded prompts of different lengths, then one token per row per step: the same
    logits as one full pass over each row alone, for every span that covers the rows."""
    model = tiny_model(tie_word_embeddings=True)
    steps = torch.randint(0, TINY["vocab_size"], (3, 6))  # tokens appended one per step
    ids = torch.tensor([p + [0] * (7 - len(p)) for p in PROMPTS])  # (3, 7), right-padded
    lengths = torch.tensor([len(p) for p in PROMPTS])
    with torch.no_grad():
        cache = model.new_cache(batch_size=3, max_len=7 + 6 + 4)  # spare slots stay unused
        logits = [model.logits(model.prefill(ids, lengths, cache))]
        for t in range(steps.shape[1]):
            span = 7 + t + 1 if t % 2 else cache.max_len  # the exact bound, or the whole cache
            logits.append(model.logits(model.decode(steps[:, t], cache, span)))
        assert cache.lengths.tolist() == [len(p) + 6 for p in PROMPTS]
        for row, prompt in enumerate(PROMPTS):
            full = model(torch.tensor([prompt + steps[row].tolist()]))[0, len(prompt) - 1 :]  # (7, V)
            incremental = torch.stack([step[row] for step in logits])
            assert (incremental - full).abs().max() <= ATOL


def test_rows_at_different_lengths_share_a_decode_step():
    """A row refilled mid-way (copied in from a fresh prefill) decodes beside a longer row."""
    model = tiny_model()
    long, short = [3, 1, 4, 1, 5, 9, 2], [6, 5]
    with torch.no_grad():
        cache = model.new_cache(2, 12)
        model.prefill(torch.tensor([long, long]), torch.tensor([7, 7]), cache)
        fresh = model.new_cache(1, 2)
        model.prefill(torch.tensor([short]), torch.tensor([2]), fresh)
        cache.copy_rows(torch.tensor([1]), fresh, torch.tensor([0]), 2)
        out = model.logits(model.decode(torch.tensor([8, 7]), cache, span=8))
        assert (out[0] - model(torch.tensor([long + [8]]))[0, -1]).abs().max() <= ATOL
        assert (out[1] - model(torch.tensor([short + [7]]))[0, -1]).abs().max() <= ATOL


def test_cache_reports_its_size():
    model = tiny_model()
    cache = model.new_cache(batch_size=3, max_len=10)
    c = model.config
    per_tensor = c.num_hidden_layers * 3 * c.num_key_value_heads * 10 * c.head_dim * 4  # fp32 bytes
    assert cache.nbytes == 2 * per_tensor + 3 * 8  # keys, values and one int64 length per row


def test_bf16_runs_and_stays_close():
    model = tiny_model()
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    with torch.no_grad():
        ref = model(ids)
        low = model.to(torch.bfloat16)(ids)
    assert low.dtype == torch.float32  # logits are always returned in fp32
    scale = ref.abs().max()
    assert (low - ref).abs().max() <= 0.05 * scale
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    grads = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        model.gradient_checkpointing = checkpointing
        model(ids).logsumexp(-1).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_config_rejects_impossible_shapes():
    with pytest.raises(minigrpo.ConfigError, match="multiple of num_key_value_heads"):
        minigrpo.Qwen3Config(**{**TINY, "num_key_value_heads": 3})
    with pytest.raises(minigrpo.ConfigError, match="hidden_size must be a positive integer"):
        minigrpo.Qwen3Config(**{**TINY, "hidden_size": 0})
    with pytest.raises(minigrpo.ConfigError, match="head_dim must be even"):
        minigrpo.Qwen3Config(**{**TINY, "head_dim": 7})


def test_config_reads_both_rope_theta_spellings():
    base = {**TINY, "model_type": "qwen3"}
    base.pop("rope_theta")
    old = minigrpo.Qwen3Config.from_dict({**base, "rope_theta": 1e6, "rope_scaling": None, "unknown_key": 1})
    new = minigrpo.Qwen3Config.from_dict(
        {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    )
    assert old == new and old.rope_theta == 1e6
    assert minigrpo.Qwen3Config.from_dict(base).head_dim == TINY["head_dim"]


def test_packed_weights_give_the_plain_products():
    """Inside packed_for_decoding the large weights multiply through oneDNN: same logits within
    fp32 rounding, and outside it nothing of the packing is left."""
    # MLP and head >= 2**17 elements
    model = tiny_model(hidden_size=256, intermediate_size=768, vocab_size=600)
    ids = torch.randint(0, 600, (3, 9))
    with torch.inference_mode():
        plain = model(ids)
        with model.packed_for_decoding(batch_size=3):
            assert (
                model.layers[0].mlp.up_proj.packed is not None
                and model.layers[0].self_attn.k_proj.packed is None
            )
            packed = model(ids)
        assert model.layers[0].mlp.up_proj.packed is None and model.packed_head is None
        with model.packed_for_decoding(batch_size=1):  # one row: the plain products are the faster
            assert model.layers[0].mlp.up_proj.packed is None and model.packed_head is None
    assert (packed - plain).abs().max() <= ATOL


def test_without_the_onednn_ops_the_products_stay_plain(monkeypatch):
    """Where torch lacks the oneDNN ops, pack_for_decoding gives None and every product inside
    packed_for_decoding is F.linear: the very logits of outside it."""
    model = tiny_model(hidden_size=256, intermediate_size=768, vocab_size=600)
    ids = torch.randint(0, 600, (3, 9))
    monkeypatch.setattr(layers, "onednn_available", lambda: False)
    with torch.inference_mode():
        plain = model(ids)
        with model.packed_for_decoding(batch_size=3):
            assert all(m.packed is None for m in model.modules() if isinstance(m, layers.Linear))
            assert model.packed_head is None
            fallback = model(ids)
    assert torch.equal(fallback, plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_in_one_call_is_the_step_by_step_norm_bit_for_bit(dtype):
    """fp32/fp64: F.rms_norm with the weight, no casts; the same values and gradients as Qwen3's
    step-by-step norm (layers.rms_norm_reference), bit for bit."""
    from minigrpo.model.layers import RMSNorm, rms_norm_reference

    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.add_(torch.randn(64, dtype=dtype) * 0.1)
    x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
    grad = torch.randn(3, 5, 64, dtype=dtype)
    results = []
    for forward in (norm, lambda t: rms_norm_reference(t, norm.weight, norm.eps)):
        x.grad = norm.weight.grad = None
        y = forward(x)
        y.backward(grad)
        results.append((y.detach(), x.grad.clone(), norm.weight.grad.clone()))
    for fast, slow in zip(*results):
        assert torch.equal(fast, slow)
    half = norm.to(torch.bfloat16)  # bf16: the casts stay, as transformers makes them
    x16 = x.detach().to(torch.bfloat16)
    assert torch.equal(half(x16), rms_norm_reference(x16, half.weight, half.eps))
