"""Shared by the benchmarks: model shapes, a transformers twin holding the same weights."""

import os

import torch

import minigrpo

SHAPES = {
    "tiny": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "default": dict(
        vocab_size=20,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,  # models/minigrpo-tiny-arith
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    ),
    "0.6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        rope_theta=1e6,
        max_position_embeddings=40960,
    ),
}


def random_model(shape: str, dtype=torch.float32, seed: int = 0) -> minigrpo.Qwen3:
    torch.manual_seed(seed)
    return minigrpo.Qwen3(minigrpo.Qwen3Config(**SHAPES[shape])).to(dtype).eval()


def transformers_twin(model: minigrpo.Qwen3):
    """transformers' Qwen3ForCausalLM with the same weights and dtype (benchmark-only dependency)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**model.config.to_dict())
    with torch.device("meta"):
        twin = Qwen3ForCausalLM(config)
    twin = twin.to_empty(device=model.device).to(model.dtype)
    # to_empty left its buffers blank
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config).to(model.device)
    state = minigrpo.model.weights.to_hf_state_dict(model)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    twin.load_state_dict(state, strict=True)
    twin.tie_weights()
    return twin.eval()


def machine_line() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = torch.get_num_threads()
    return f"torch {torch.__version__}, {threads} threads, {os.cpu_count()} cpus, load avg {load:.2f}"
