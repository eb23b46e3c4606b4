"""The policy: a Qwen3 dense decoder written by hand, with an optional static KV cache (kv_cache.py).

Token ids (B, T) go in; logits (B, T, vocab) or final hidden states (B, T, hidden) come out.
It knows tensors only: not text (tokenizer.py), not files on disk (weights.py), not sampling.
Numerically it is the same function as transformers' Qwen3ForCausalLM; the tests hold them equal.
Parameter names are Hugging Face's without the "model." prefix. q/k/v and gate/up stay separate
matrices: fused, they multiply slower on the project's CPUs (benchmarks/README.md). The
pieces that hold no cache (products, RMSNorm, rotary, masks) are in layers.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from .kv_cache import KVCache
from .layers import (
    Linear,
    RMSNorm,
    apply_rotary,
    logit_dtype,
    pack_for_decoding,
    real_positions,
    rotary_cos_sin,
    visibility_mask,
)


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
    num_key_value_heads: int | None = None  # key/value heads (fewer: grouped-query attention); None: same
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
    def from_dict(cls, d: dict) -> Qwen3Config:
        """Build from a parsed config.json: checks model_type, ignores keys it does not use."""
        if d.get("model_type") != "qwen3":
            raise ConfigError(f"model_type is {d.get('model_type')!r}, but minigrpo only runs 'qwen3' models")
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks required key(s): {', '.join(missing)}")
        if d.get("use_sliding_window"):
            raise ConfigError(
                "use_sliding_window=true is not supported (no released Qwen3 dense model uses it)"
            )
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


class SharedPrompt:
    """Training with the G completions of a prompt in G consecutive rows: the prompt runs once.

    Passed to the blocks as `shared` (attention's shared-prompt path), twice: while the prompts (P rows)
    run, each block keeps their keys and values, with their graph; then each block of the completions
    (P * G rows) attends to its prompt's keys and values followed by its own. Only those keys and values are
    copied per row; the prompt's projections, MLP and activations exist once, and autograd sums
    the G rows' gradients.
    """

    def __init__(self, group_size: int):
        self.group_size = group_size
        self.keys = {}  # layer -> (P, kv_heads, Lp, D)
        self.values = {}  # layer -> (P, kv_heads, Lp, D)
        self.completions = False  # False while the prompts run, True once the completions do

    def keys_and_values(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """What block `layer` attends to: the prompts' own k, v (kept), or for completions k, v
        (P * G, kv_heads, Tc, D) their prompt's followed by theirs, (P * G, kv_heads, Lp + Tc, D)."""
        if not self.completions:
            self.keys[layer] = k
            self.values[layer] = v
            return k, v
        return self._after_prompt(self.keys[layer], k), self._after_prompt(self.values[layer], v)

    def _after_prompt(self, prompt: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        P = prompt.shape[0]
        G = self.group_size
        grouped = own.view(P, G, *own.shape[1:])  # (P, G, kv_heads, Tc, D)
        return torch.cat((prompt[:, None].expand(-1, G, -1, -1, -1), grouped), dim=3).flatten(0, 1)


class Attention(nn.Module):
    """Grouped-query attention with Qwen3's per-head RMSNorm on queries and keys, then rotary."""

    def __init__(self, config: Qwen3Config, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_width = self.n_heads * self.head_dim
        kv_width = self.n_kv * self.head_dim
        self.q_proj = Linear(config.hidden_size, q_width, bias=config.attention_bias)
        self.k_proj = Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.v_proj = Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.o_proj = Linear(q_width, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x,
        cos,
        sin,
        mask,
        cache: KVCache | None = None,
        decoding: bool = False,
        shared: SharedPrompt | None = None,
    ):
        """x (B, T, hidden) through one of attention's four paths, chosen by what comes with it:
        - nothing: the batch attends to itself (training);
        - `shared`: the shared-prompt path (training), the prompts keeping their keys and values, then the
          completions attending to their prompt's and their own (SharedPrompt);
        - a `cache`: a prompt block, stored, then causal over itself (prefill);
        - a `cache` while `decoding`: one token per row, stored at its row's length, attending to the
          cache's first mask.shape[-1] slots.
        The first three differ only in where the keys and values come from, and attend with
        `attend_block`; the decode step attends with `attend_one_token`."""
        q, k, v = self.project(x, cos, sin)
        if decoding:
            return self.attend_one_token(q, k, v, mask, cache)
        if cache is not None:
            k, v = cache.write_prompt(self.layer, k, v)
        elif shared is not None:
            k, v = shared.keys_and_values(self.layer, k, v)
        return self.attend_block(q, k, v, mask)

    def project(self, x, cos, sin):
        """q (B, H, T, D), k and v (B, Hkv, T, D) of x (B, T, hidden): q and k normed, then rotated."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        q = self.q_norm(q).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        return q, k, v

    def attend_block(self, q, k, v, mask):
        """The block's T queries over keys and values k, v (B, Hkv, S, D): causal when mask is None (S = T),
        else where mask (B, 1, T, S) allows; (B, T, hidden)."""
        B, _, T, _ = q.shape
        gqa = self.n_kv != self.n_heads
        # y: (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))

    def attend_one_token(self, q, k, v, mask, cache: KVCache):
        """The decode step: one token per row, q (B, H, 1, D), its k, v stored at its row's length, over
        the cache's first mask.shape[-1] slots; (B, 1, hidden)."""
        B = q.shape[0]
        k, v = cache.write_token(self.layer, k, v, mask.shape[-1])  # (B, Hkv, span, D)
        # one query per row: the heads sharing a kv head become its queries (faster than enable_gqa)
        y = F.scaled_dot_product_attention(q.view(B, self.n_kv, -1, self.head_dim), k, v, attn_mask=mask)
        return self.o_proj(y.reshape(B, 1, -1))  # (B, Hkv, H/Hkv, D) holds the heads in order


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

    def forward(self, x, cos, sin, mask, cache=None, decoding=False, shared=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, decoding, shared)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3(nn.Module):
    """The full causal LM. `model(input_ids)` -> fp32 logits (B, T, vocab)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        # given a weight, nn.Embedding skips its own N(0, 1) init (on the meta device that init imports
        # torch._dynamo, seconds of start-up); _init_weights below or the checkpoint sets the values
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, False)
        )
        self.gradient_checkpointing = False  # recompute each block in backward to save activation memory
        self.packed_head = None  # the LM head packed for oneDNN, inside packed_for_decoding only
        self.adapters = None  # lora.Adapters once add_adapters has put adapters on the projections
        self.name_or_path = ""  # the directory or Hub id the weights were loaded from ("" if built here)
        if not any(p.is_meta for p in self.parameters()):
            self.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, attention_mask))

    def hidden_states(self, input_ids, attention_mask=None):
        """Final-normed hidden states (B, T, hidden) of a whole batch, without a cache (training).
        input_ids (B, T); attention_mask (B, T): 1 for real tokens, 0 for padding (left or right)."""
        if attention_mask is None:  # plain causal
            mask = None
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # (1, T)
        else:
            mask = visibility_mask(attention_mask.bool())  # (B, 1, T, T)
            positions = real_positions(attention_mask)  # (B, T)
        x = self.embed_tokens(input_ids)  # (B, T, hidden)
        return self.norm(self._blocks(x, self._rotary(positions), mask, checkpointed=self._checkpointing))

    def shared_prompt_hidden_states(self, input_ids, attention_mask, completion_start: int, group_size: int):
        """`hidden_states(input_ids, attention_mask)[:, completion_start - 1 : -1]`, (B, Tc, hidden), with
        each prompt run once for its `group_size` completions (SharedPrompt). input_ids, attention_mask
        (B, Lp + Tc): left-padded prompts, then right-padded completions, a group's rows consecutive."""
        B = input_ids.shape[0]
        Lp = completion_start
        G = group_size
        if B % G or not all(
            torch.equal(t[:, :Lp].view(B // G, G, Lp), t[::G, None, :Lp].expand(-1, G, -1))
            for t in (input_ids, attention_mask)
        ):
            raise ValueError(
                f"a shared-prompt batch needs groups of {G} consecutive rows with the same prompt"
            )
        prompt_ids = input_ids[::G, :Lp]  # (P, Lp)
        prompt_mask = attention_mask[::G, :Lp]  # (P, Lp)
        positions = real_positions(attention_mask)  # (B, Lp + Tc)
        shared = SharedPrompt(G)
        # The prompts are never checkpointed: the blocks keep their keys and values in `shared`.
        x = self._blocks(
            self.embed_tokens(prompt_ids),
            self._rotary(positions[::G, :Lp]),
            visibility_mask(prompt_mask.bool()),
            shared=shared,
        )
        last_prompt = self.norm(x[:, -1])  # (P, hidden): predicts each completion's first token
        shared.completions = True
        completion_rows = visibility_mask(attention_mask.bool())[:, :, Lp:]  # (B, 1, Tc, Lp + Tc)
        x = self._blocks(
            self.embed_tokens(input_ids[:, Lp:]),
            self._rotary(positions[:, Lp:]),
            completion_rows,
            shared=shared,
            checkpointed=self._checkpointing,
        )
        first = last_prompt.repeat_interleave(G, 0)[:, None]  # (B, 1, hidden)
        return torch.cat((first, self.norm(x[:, :-1])), dim=1)  # (B, Tc, hidden)

    @property
    def _checkpointing(self) -> bool:
        return self.gradient_checkpointing and self.training and torch.is_grad_enabled()

    def _rotary(self, positions: torch.Tensor):
        """cos, sin (B, 1, T, D) for positions (B, T), broadcast over the heads."""
        return rotary_cos_sin(positions[:, None], self.config.head_dim, self.config.rope_theta, self.dtype)

    def _blocks(
        self, x, rotary, mask, cache=None, decoding: bool = False, shared=None, checkpointed: bool = False
    ):
        """x through every block; a KV cache (prefill, or `decoding`) or a SharedPrompt picks attention's
        path (Attention.forward)."""
        for block in self.layers:
            if checkpointed:
                x = torch.utils.checkpoint.checkpoint(
                    block, x, *rotary, mask, cache, decoding, shared, use_reentrant=False
                )
            else:
                x = block(x, *rotary, mask, cache, decoding, shared)
        return x

    def prefill(self, input_ids: torch.Tensor, lengths: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Prompts (B, T), right-padded, `lengths` (B,) real tokens each, into an empty cache; the final
        hidden state at each prompt's last token, (B, hidden). Plain causal attention is exact: a real
        token never sees the padding after it, and decoded tokens overwrite the padded slots first."""
        B, T = input_ids.shape
        rotary = (cache.cos[:T], cache.sin[:T])  # (T, D) each: slot = position
        x = self._blocks(self.embed_tokens(input_ids), rotary, None, cache)  # (B, T, hidden)
        cache.lengths.copy_(lengths)
        return self.norm(x[torch.arange(B, device=x.device), lengths - 1])  # (B, hidden)

    def decode(self, tokens: torch.Tensor, cache: KVCache, span: int) -> torch.Tensor:
        """One token per row (B,) appended at slot cache.lengths[b]; final hidden states (B, hidden).
        Attention reads slots [0, span) (span > every row's length, the unwritten slots masked), so a
        caller may round span up to reuse one compiled graph for many steps."""
        positions = cache.lengths  # (B,): the slot, and the rotary position, of each new token
        rotary = cache.cos[positions][:, None, None], cache.sin[positions][:, None, None]  # (B, 1, 1, D) each
        visible = cache.slots[:span] <= positions[:, None]  # (B, span)
        # an additive mask made once per decode step (0 where visible, -inf elsewhere); a boolean one is
        # turned into this by every attention call, two kernels per layer
        mask = torch.where(visible, 0.0, float("-inf")).to(self.dtype)[:, None, None]  # (B, 1, 1, span)
        x = self._blocks(
            self.embed_tokens(tokens[:, None]), rotary, mask, cache, decoding=True
        )  # (B, 1, hidden)
        cache.lengths.add_(1)
        return self.norm(x[:, 0])  # (B, hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden states (..., hidden) -> logits (..., vocab) in fp32 (fp64 for an fp64 model)."""
        product = self.packed_head if self.packed_head is not None else self._head
        logits = product(hidden)
        return logits if logits.dtype == logit_dtype(self.dtype) else logits.to(logit_dtype(self.dtype))

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @contextlib.contextmanager
    def packed_for_decoding(self, batch_size: int):
        """Inside, the large weights multiply through copies packed for oneDNN at `batch_size` rows
        (layers.pack_for_decoding; the others, or all without oneDNN, through F.linear); an adapted
        projection multiplies by a merged copy of its weight (lora.py). The copies are made on entry
        and dropped on exit, so they always hold the current weights; training never sees them."""
        linears = [m for m in self.layers.modules() if isinstance(m, Linear)]  # the head is packed_head
        try:
            for m in linears:
                m.packed = m.decoding_product(batch_size)  # with adapters: merged (lora.py)
            self.packed_head = pack_for_decoding(self.head_weight, None, batch_size)
            yield
        finally:
            for m in linears:
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


def _init_weights(module: nn.Module):
    """transformers' initialisation: N(0, 0.02) weights, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
