"""The policy: a Qwen3 dense decoder written by hand, with an optional static KV cache.

Token ids (B, T) go in; logits (B, T, vocab) or final hidden states (B, T, hidden) come out.
It knows tensors only: not text (tokenizer.py), not files on disk (checkpoint.py), not sampling.
Numerically it is the same function as transformers' Qwen3ForCausalLM; the tests hold them equal.
Parameter names are Hugging Face's without the "model." prefix. q/k/v and gate/up stay separate
matrices: fusing them was measured slower on the project's CPUs (benchmarks/README.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


class ConfigError(ValueError):
    """A model configuration that minigrpo cannot build a Qwen3 from."""


@dataclass
class Qwen3Config:
    """Qwen3 hyper-parameters, named as in a Hugging Face config.json; defaults are transformers' own."""

    vocab_size: int  # rows of the token embedding (and of the LM head)
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # width of the SwiGLU MLP's inner layer
    num_hidden_layers: int  # number of decoder blocks
    num_attention_heads: int  # query heads per attention layer
    num_key_value_heads: int | None = None  # key/value heads (< query heads: grouped-query attention); None = same
    head_dim: int = 128  # width of one head; Qwen3 keeps 128 whatever hidden_size / heads is
    rms_norm_eps: float = 1e-6  # epsilon inside every RMSNorm
    rope_theta: float = 10000.0  # rotary base wavelength (Qwen3 checkpoints use 1e6)
    max_position_embeddings: int = 32768  # longest sequence (prompt + completion) the model is meant for
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    attention_bias: bool = False  # biases on q/k/v/o projections (False in every released Qwen3)

    REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for name in (*self.REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"Qwen3Config.{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ConfigError("rope_theta and rms_norm_eps must be positive")

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3Config":
        """Build from a parsed config.json: checks model_type, ignores keys it does not use."""
        if d.get("model_type") != "qwen3":
            raise ConfigError(f"model_type is {d.get('model_type')!r}, but minigrpo only runs 'qwen3' models")
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks required key(s): {', '.join(missing)}")
        if d.get("use_sliding_window"):
            raise ConfigError("use_sliding_window=true is not supported (no released Qwen3 dense model uses it)")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"rope type {rope_type!r} is not supported, only the default rotary embedding")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and d[k] is not None}
        # transformers >= 5 writes rope_theta inside rope_parameters; older files have it at the top level.
        if "rope_theta" in rope:
            known["rope_theta"] = rope["rope_theta"]
        return cls(**known)

    def to_dict(self) -> dict:
        """A config.json dict that transformers (old and new) reads back as the same model."""
        d = asdict(self)
        d.update(
            model_type="qwen3",
            architectures=["Qwen3ForCausalLM"],
            hidden_act="silu",
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            use_sliding_window=False,
        )
        return d


SKINNY_ROWS = 64  # at or below this many rows, CPU matmuls go through the transposed product


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), computed as (weight @ x.T).T when x has few rows on CPU.

    Same maths, another order of the loops: on the project's CPUs (MKL on AMD EPYC) the plain
    product with 2-64 rows, i.e. a decode step, ran 1.2-2.9x slower than the transposed one
    (benchmarks/README.md); from a few hundred rows on they are equal, so training is unaffected.
    """
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or rows > SKINNY_ROWS:
        return F.linear(x, weight, bias)
    if rows == 1:
        y = torch.mv(weight, x.reshape(-1))  # (out,): gemv, ~20% faster than a 1-row gemm here
    else:
        y = (weight @ x.reshape(rows, -1).t()).t()  # (rows, out), column-major
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """nn.Linear through `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and cast back before the weight, as Qwen3 does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (B, 1, T, head_dim) for integer positions (B, T); angles in fp32."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / theta**exponents  # (head_dim/2,)
    angles = positions[..., None].float() * inv_freq  # (B, T, head_dim/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+D/2}) of x (B, H, T, D) by the position angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache:
    """Preallocated keys and values of every layer, sized once: (layers, B, kv_heads, max_len, head_dim).

    `valid` (B, max_len) marks the slots holding a real token, so left padding and rows of
    different lengths share one set of slot indices. Shapes never change after creation.
    """

    def __init__(self, config: Qwen3Config, batch_size: int, max_len: int, *, dtype, device):
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.valid.nbytes

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int):
        """Store k, v (B, kv_heads, T, D) at `slots` (T,); return slots [0, length) as (B, kv_heads, length, D)."""
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]

    def every_nth_row(self, n: int) -> "KVCache":
        """A view of rows 0, n, 2n, ...: writes to it land in this cache (used to prefill each prompt once)."""
        return self._view(self.k[:, ::n], self.v[:, ::n], self.valid[::n])

    def keep_rows(self, rows: torch.Tensor) -> "KVCache":
        """Move `rows` (ascending indices) to the front, in place, and return a view of just those rows."""
        n = len(rows)
        for t in (self.k, self.v):
            for layer in range(t.shape[0]):  # a layer at a time: the temporary is one layer's rows, not a cache
                t[layer, :n] = t[layer, rows]
        self.valid[:n] = self.valid[rows]
        return self._view(self.k[:, :n], self.v[:, :n], self.valid[:n])

    @classmethod
    def _view(cls, k, v, valid) -> "KVCache":
        view = object.__new__(cls)
        view.k, view.v, view.valid = k, v, valid
        return view

    def fill_groups(self, n: int) -> None:
        """Copy row g*n into rows g*n+1 .. g*n+n-1 of every group g, in place."""
        L, B, H, S, D = self.k.shape
        for t in (self.k, self.v):
            groups = t.view(L, B // n, n, H, S, D)
            groups[:, :, 1:] = groups[:, :, :1]
        groups = self.valid.view(B // n, n, S)
        groups[:, 1:] = groups[:, :1]


def visibility_mask(valid: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, S) bool: a query at slot s sees key slots j <= s that hold real tokens.

    A query always sees its own slot, so that padding queries get a finite (unused) output
    instead of a softmax over nothing.
    """
    key_slots = torch.arange(valid.shape[1], device=valid.device)  # (S,)
    causal = key_slots[None, :] <= query_slots[:, None]  # (T, S)
    own = key_slots[None, :] == query_slots[:, None]  # (T, S)
    return ((causal & valid[:, None, :]) | own)[:, None]  # (B, 1, T, S)


class Attention(nn.Module):
    """Grouped-query attention with Qwen3's per-head RMSNorm on queries and keys, then rotary."""

    def __init__(self, config: Qwen3Config, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.q_proj = Linear(config.hidden_size, q_width, bias=config.attention_bias)
        self.k_proj = Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.v_proj = Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.o_proj = Linear(q_width, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache: KVCache | None, slots):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.write(self.layer, slots, k, v, mask.shape[-1])  # (B, Hkv, S, D), S as the mask
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.n_kv != self.n_heads
        )  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: Qwen3Config, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache, slots):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3(nn.Module):
    """The full causal LM. `model(input_ids)` -> fp32 logits (B, T, vocab)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, False)
        self.gradient_checkpointing = False  # recompute each block in backward to save activation memory
        if not any(p.is_meta for p in self.parameters()):
            self.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, start_pos=0) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, attention_mask, position_ids, cache, start_pos))

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None, cache=None, start_pos=0):
        """Final-normed hidden states (B, T, hidden).

        input_ids (B, T). attention_mask (B, T): 1 for real tokens, 0 for padding (left or right).
        position_ids (B, T): defaults to each token's index among its row's real tokens.
        cache: a KVCache; the T tokens are written to slots start_pos .. start_pos+T-1 and attend
        to every valid slot up to their own. With an int start_pos only the slots written so far
        are read; with a 0-dim tensor (for torch.compile: no recompiles) all max_len slots are,
        the unwritten ones masked out.
        """
        B, T = input_ids.shape
        slots = torch.arange(T, device=input_ids.device) + start_pos  # (T,)
        new_valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if cache is not None:
            cache.valid[:, slots] = new_valid
            length = cache.max_len if torch.is_tensor(start_pos) else start_pos + T
            valid = cache.valid[:, :length]  # (B, S)
        else:
            valid = new_valid  # (B, T)
        if position_ids is None:
            position_ids = (valid.cumsum(-1)[:, slots] - 1).clamp(min=0)  # (B, T)
        simple_causal = cache is None and attention_mask is None
        mask = None if simple_causal else visibility_mask(valid, slots)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, self.dtype)
        x = self.embed_tokens(input_ids)  # (B, T, hidden)
        for block in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, mask, cache, slots, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask, cache, slots)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden states (..., hidden) -> fp32 logits (..., vocab)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linear(hidden, weight).float()

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return KVCache(self.config, batch_size, max_len, dtype=self.dtype, device=self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device


def _init_weights(module: nn.Module, std: float = 0.02):
    """transformers' initialisation: N(0, 0.02) weights, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
