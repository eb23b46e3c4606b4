"""The policy: a Qwen3 dense decoder written by hand, with an optional static KV cache.

Token ids (B, T) go in; logits (B, T, vocab) or final hidden states (B, T, hidden) come out.
It knows tensors only: not text (tokenizer.py), not files on disk (weights.py), not sampling.
Numerically it is the same function as transformers' Qwen3ForCausalLM; the tests hold them equal.
Parameter names are Hugging Face's without the "model." prefix. q/k/v and gate/up stay separate
matrices: fusing them was measured slower on the project's CPUs (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
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


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits are kept in fp32 whatever the weights (bf16, fp16), or fp64 for an fp64 model."""
    return torch.promote_types(dtype, torch.float32)


PACK_MIN_ELEMENTS = 2**17  # weights this large multiply faster through oneDNN when packed (sampling only)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x @ weight.T (+ bias) with the weight pre-packed for oneDNN (`Qwen3.packed_for_decoding`)."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], out_features)


class Linear(nn.Linear):
    """nn.Linear through `linear` above, or through a packed copy of the weight while one is set."""

    packed: torch.Tensor | None = None  # set only inside Qwen3.packed_for_decoding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias, self.out_features)
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 (fp64 for fp64) and cast back before the weight, as Qwen3 does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (*positions.shape, head_dim) for integer positions; angles in fp32.

    sin comes with the sign of the rotation folded in (-sin on the first half, +sin on the second),
    so that rotating is two products and a roll (`apply_rotary`).
    """
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / theta**exponents  # (head_dim/2,)
    angles = positions[..., None].float() * inv_freq  # (..., head_dim/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)  # (..., head_dim) each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+D/2}) of x (B, H, T, D) by the position angles.

    The textbook form is x * cos + cat(-x2, x1) * sin; rolling x by D/2 gives cat(x2, x1), and the
    minus sign lives in `signed_sin`: the same numbers with one op instead of three.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class KVCache:
    """Preallocated keys and values, one (B, kv_heads, max_len, head_dim) tensor each per layer, and per-row lengths.

    Row b holds `lengths[b]` tokens in slots 0 .. lengths[b]-1, with no padding between them, so a
    token's slot is also its rotary position. Rows may differ in length (prompts of other sizes, a
    row refilled with a new prompt mid-call); the next token of row b goes to slot lengths[b].
    The rotary tables of every slot are made once, with the cache. Shapes never change. (One tensor
    per layer, not one for all: torch.compile then writes a token in place, where a write into a
    slice of a larger tensor made it copy that whole tensor every step.)
    """

    def __init__(self, config: Qwen3Config, batch_size: int, max_len: int, *, dtype, device):
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.rows = torch.arange(batch_size, device=device)  # (B,): row indices, for writing one token per row
        self.slots = torch.arange(max_len, device=device)  # (max_len,)
        self.cos, self.sin = rotary_cos_sin(self.slots, config.head_dim, config.rope_theta, dtype)  # (max_len, D) each

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.k + self.v) + self.lengths.nbytes

    def write_prompt(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store a prompt block k, v (B, kv_heads, T, D) in slots 0 .. T-1; the block attends to itself."""
        T = k.shape[2]
        self.k[layer][:, :, :T] = k
        self.v[layer][:, :, :T] = v
        return k, v

    def write_token(self, layer: int, k: torch.Tensor, v: torch.Tensor, span: int):
        """Store one token per row, k, v (B, kv_heads, 1, D), at slot lengths[b]; return slots [0, span)
        of every row, (B, kv_heads, span, D), for attention."""
        self.k[layer][self.rows, :, self.lengths] = k[:, :, 0]  # index_put_: in place under torch.compile too
        self.v[layer][self.rows, :, self.lengths] = v[:, :, 0]
        return self.k[layer][:, :, :span], self.v[layer][:, :, :span]

    def copy_rows(self, rows: torch.Tensor, source: "KVCache", source_rows: torch.Tensor, length: int) -> None:
        """Rows `rows` of this cache become rows `source_rows` of `source` (slots [0, length) and lengths)."""
        for mine, theirs in zip(self.k + self.v, source.k + source.v):
            mine[rows, :, :length] = theirs[source_rows, :, :length]
        self.lengths[rows] = source.lengths[source_rows]

    def keep_rows(self, rows: torch.Tensor, length: int, *, fresh: bool = False) -> "KVCache":
        """A cache of just `rows` (ascending indices), slots [0, length) copied: this one's first rows,
        moved to the front in place, or with `fresh` new tensors (a compiled graph writes in place
        only into whole tensors, not into views)."""
        view = object.__new__(KVCache)
        view.slots, view.cos, view.sin = self.slots, self.cos, self.sin
        n = len(rows)
        view.rows = self.rows[:n]
        if fresh:
            view.k, view.v = [t[rows].clone() for t in self.k], [t[rows].clone() for t in self.v]
        else:
            for t in self.k + self.v:
                t[:n, :, :length] = t[rows, :, :length]
            view.k, view.v = [t[:n] for t in self.k], [t[:n] for t in self.v]
        view.lengths = self.lengths[rows].clone()
        return view


class SharedPrompt:
    """Training with the G completions of a prompt in G consecutive rows: the prompt runs once.

    Passed to the blocks as their cache, twice. While the prompts (P rows) run, each block's prompt
    keys and values are kept, with their graph. Then the completions (P * G rows) run, and each of
    their blocks attends to its prompt's keys and values followed by its own. The prompt's keys and
    values are copied into each row for attention (a (G, kv_heads, Lp, D) copy per prompt and
    layer); its projections, MLP and activations exist once, and autograd sums the G rows' gradients.
    """

    def __init__(self, group_size: int):
        self.group_size = group_size
        self.keys, self.values = {}, {}  # layer -> (P, kv_heads, Lp, D)
        self.completions = False  # False while the prompts run, True once the completions do

    def write_prompt(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """What the block attends to: the prompts' own k, v (kept), or, for completions k, v
        (P * G, kv_heads, Tc, D), their prompt's followed by theirs, (P * G, kv_heads, Lp + Tc, D)."""
        if not self.completions:
            self.keys[layer], self.values[layer] = k, v
            return k, v
        return self._after_prompt(self.keys[layer], k), self._after_prompt(self.values[layer], v)

    def _after_prompt(self, prompt: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        P, G = prompt.shape[0], self.group_size
        grouped = own.view(P, G, *own.shape[1:])  # (P, G, kv_heads, Tc, D)
        return torch.cat((prompt[:, None].expand(-1, G, -1, -1, -1), grouped), dim=3).flatten(0, 1)


def visibility_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool for a padded batch without a cache: a query sees earlier real tokens.

    A query always sees itself, so that padding queries get a finite (unused) output instead of a
    softmax over nothing.
    """
    T = valid.shape[1]
    slots = torch.arange(T, device=valid.device)
    causal = slots[None, :] <= slots[:, None]  # (T, T)
    own = slots[None, :] == slots[:, None]  # (T, T)
    return ((causal & valid[:, None, :]) | own)[:, None]  # (B, 1, T, T)


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

    def forward(self, x, cos, sin, mask, cache: KVCache | None = None, decoding: bool = False):
        """x (B, T, hidden). No cache: the batch attends to itself (training). A cache: a prompt block,
        stored, then causal over itself (prefill); or, decoding, one token per row, stored at its row's
        length, attending to the cache's first mask.shape[-1] slots."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None and not decoding:
            k, v = cache.write_prompt(self.layer, k, v)
        elif cache is not None:
            k, v = cache.write_token(self.layer, k, v, mask.shape[-1])  # (B, Hkv, span, D)
            # one query per row: the heads sharing a kv head become its queries (10-20% faster than enable_gqa)
            y = F.scaled_dot_product_attention(q.view(B, self.n_kv, -1, self.head_dim), k, v, attn_mask=mask)
            return self.o_proj(y.reshape(B, 1, -1))  # (B, Hkv, H/Hkv, D) holds the heads in order
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

    def forward(self, x, cos, sin, mask, cache=None, decoding=False):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, decoding)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3(nn.Module):
    """The full causal LM. `model(input_ids)` -> fp32 logits (B, T, vocab)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        # given a weight, nn.Embedding skips its own N(0, 1) init (on the meta device that alone imported
        # torch._dynamo, 1-3 s per process); _init_weights below or the checkpoint sets the values
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, False)
        self.gradient_checkpointing = False  # recompute each block in backward to save activation memory
        self.packed_head = None  # the LM head packed for oneDNN, inside packed_for_decoding only
        if not any(p.is_meta for p in self.parameters()):
            self.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, attention_mask, position_ids))

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None):
        """Final-normed hidden states (B, T, hidden) of a whole batch, without a cache (training).

        input_ids (B, T). attention_mask (B, T): 1 for real tokens, 0 for padding (left or right).
        position_ids (B, T): defaults to each token's index among its row's real tokens.
        """
        mask = None if attention_mask is None else visibility_mask(attention_mask.bool())  # None: plain causal
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # (1, T)
            else:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        cos, sin = rotary_cos_sin(position_ids[:, None], self.config.head_dim, self.config.rope_theta, self.dtype)
        x = self.embed_tokens(input_ids)  # (B, T, hidden)
        for block in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask)
        return self.norm(x)

    def shared_prompt_hidden_states(self, input_ids, attention_mask, completion_start: int, group_size: int):
        """The hidden states that predict each completion token, (B, Tc, hidden), as
        `hidden_states(input_ids, attention_mask)[:, completion_start - 1 : -1]` gives them, but with
        each prompt run once for its `group_size` completions (see SharedPrompt).

        input_ids, attention_mask (B, Lp + Tc): left-padded prompts, then right-padded completions,
        the rows of a group consecutive and with the same prompt.
        """
        B, Lp, G = input_ids.shape[0], completion_start, group_size
        if B % G or not all(torch.equal(t[:, :Lp].view(B // G, G, Lp), t[::G, None, :Lp].expand(-1, G, -1))
                            for t in (input_ids, attention_mask)):
            raise ValueError(f"a shared-prompt batch needs groups of {G} consecutive rows with the same prompt")
        prompt_ids, prompt_mask = input_ids[::G, :Lp], attention_mask[::G, :Lp]  # (P, Lp)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, Lp + Tc)
        shared = SharedPrompt(G)
        # The prompts are never checkpointed: the blocks keep their keys and values in `shared`.
        x = self._run_blocks(self.embed_tokens(prompt_ids), positions[::G, :Lp], visibility_mask(prompt_mask.bool()), shared)
        last_prompt = self.norm(x[:, -1])  # (P, hidden): predicts each completion's first token
        shared.completions = True
        completion_rows = visibility_mask(attention_mask.bool())[:, :, Lp:]  # (B, 1, Tc, Lp + Tc)
        x = self._run_blocks(self.embed_tokens(input_ids[:, Lp:]), positions[:, Lp:], completion_rows, shared,
                             checkpointed=self.gradient_checkpointing and self.training and torch.is_grad_enabled())
        first = last_prompt.repeat_interleave(G, 0)[:, None]  # (B, 1, hidden)
        return torch.cat((first, self.norm(x[:, :-1])), dim=1)  # (B, Tc, hidden)

    def _run_blocks(self, x, positions, mask, cache, checkpointed: bool = False):
        cos, sin = rotary_cos_sin(positions[:, None], self.config.head_dim, self.config.rope_theta, self.dtype)
        for block in self.layers:
            if checkpointed:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, mask, cache, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask, cache)
        return x

    def prefill(self, input_ids: torch.Tensor, lengths: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Prompts into an empty cache; the final hidden state at each prompt's last token, (B, hidden).

        input_ids (B, T): prompts padded on the right, `lengths` (B,) real tokens each. Causal
        attention alone is exact here: a real token never sees the padding that follows it, and the
        padded slots are overwritten by the first decoded tokens before anything reads them.
        """
        B, T = input_ids.shape
        cos, sin = cache.cos[:T], cache.sin[:T]  # (T, D): slot = position
        x = self.embed_tokens(input_ids)  # (B, T, hidden)
        for block in self.layers:
            x = block(x, cos, sin, None, cache)
        cache.lengths.copy_(lengths)
        return self.norm(x[torch.arange(B, device=x.device), lengths - 1])  # (B, hidden)

    def decode(self, tokens: torch.Tensor, cache: KVCache, span: int) -> torch.Tensor:
        """One token per row (B,) appended at slot cache.lengths[b]; final hidden states (B, hidden).

        Attention reads slots [0, span) of every row (span > every row's length; the unwritten slots
        are masked), so a caller may round span up to reuse one compiled graph for many steps.
        """
        B = tokens.shape[0]
        positions = cache.lengths  # (B,): the slot, and the rotary position, of each new token
        cos, sin = cache.cos[positions][:, None, None], cache.sin[positions][:, None, None]  # (B, 1, 1, D)
        mask = (cache.slots[:span] <= positions[:, None])[:, None, None]  # (B, 1, 1, span)
        x = self.embed_tokens(tokens[:, None])  # (B, 1, hidden)
        for block in self.layers:
            x = block(x, cos, sin, mask, cache, decoding=True)
        cache.lengths.add_(1)
        return self.norm(x[:, 0])  # (B, hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden states (..., hidden) -> logits (..., vocab) in fp32 (fp64 for an fp64 model)."""
        if self.packed_head is not None:
            return packed_linear(hidden, self.packed_head, None, self.config.vocab_size).float()
        return linear(hidden, self.head_weight).to(logit_dtype(self.dtype))

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @contextlib.contextmanager
    def packed_for_decoding(self, batch_size: int):
        """Inside, every weight of >= PACK_MIN_ELEMENTS multiplies through oneDNN with a packed copy.

        fp32 on CPU only. Measured here (benchmarks/README.md) against MKL's skinny products: 1.2-4x
        faster for 3072 x 1024 and larger at 1-256 rows, slower for the small matrices that stay
        unpacked. The copies (one more set of the large weights) are made on entry and dropped on
        exit, so they always hold the current weights; training never sees them.
        """
        packable = self.device.type == "cpu" and self.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        plain = lambda w: w.numel() >= PACK_MIN_ELEMENTS and type(w.detach()) is torch.Tensor  # noqa: E731  (not a DTensor)
        large = [m for m in self.modules() if isinstance(m, Linear) and plain(m.weight)]
        try:
            if packable:
                for m in large:
                    m.packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), batch_size)
                if plain(self.head_weight):
                    self.packed_head = torch.ops.mkldnn._reorder_linear_weight(self.head_weight.detach(), batch_size)
            yield
        finally:
            for m in large:
                m.packed = None
            self.packed_head = None

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
