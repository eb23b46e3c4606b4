"""Stage 1's memory: the static KV cache the sampler decodes in (rollout/: the engine and the graphs).

In: a model's shape (layers, kv heads, head width, rotary base), rows and slots. Out: per-layer key and
value tensors that the model's attention writes and reads (qwen3.py), with each row's length. It knows
tensors and rotary positions, not the model's weights, sampling or requests.
"""

from __future__ import annotations

import torch

from .layers import rotary_cos_sin


class KVCache:
    """Preallocated keys and values, one (B, kv_heads, max_len, head_dim) tensor each per layer, and per-row
    lengths.

    Row b holds `lengths[b]` tokens in slots 0 .. lengths[b]-1, so a token's slot is also its rotary
    position, and rows may differ in length; the next token of row b goes to slot lengths[b]. The
    rotary tables of every slot are made once, with the cache. One tensor per layer, not one for
    all: torch.compile copies a whole shared tensor to write one token into a slice of it.
    """

    def __init__(self, config, batch_size: int, max_len: int, *, dtype, device):
        """`config`: a Qwen3Config, read for num_hidden_layers, num_key_value_heads, head_dim, rope_theta."""
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.rows = torch.arange(
            batch_size, device=device
        )  # (B,): row indices, for writing one token per row
        self.slots = torch.arange(max_len, device=device)  # (max_len,)
        # cos, sin: (max_len, D) each
        self.cos, self.sin = rotary_cos_sin(self.slots, config.head_dim, config.rope_theta, dtype)

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

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

    def copy_rows(self, rows: torch.Tensor, source: KVCache, source_rows: torch.Tensor, length: int) -> None:
        """Rows `rows` of this cache become rows `source_rows` of `source` (slots [0, length) and lengths)."""
        for mine, theirs in zip(self.k + self.v, source.k + source.v):
            mine[rows, :, :length] = theirs[source_rows, :, :length]
        self.lengths[rows] = source.lengths[source_rows]

    def head(self, n: int) -> KVCache:
        """This cache's first n rows, as views: every write through them lands in this cache's memory
        (what a CUDA graph captured on one such view and replayed on another relies on)."""
        k = [t[:n] for t in self.k]
        v = [t[:n] for t in self.v]
        return self._sharing_tables(n, k, v, self.lengths[:n])

    def keep_rows(self, rows: torch.Tensor, length: int, *, fresh: bool = False) -> KVCache:
        """A cache of just `rows` (ascending indices), slots [0, length) copied: this one's first rows,
        moved to the front in place, or with `fresh` new tensors (a compiled graph writes in place
        only into whole tensors, not into views)."""
        n = len(rows)
        if not fresh:
            for t in self.k + self.v:
                t[:n, :, :length] = t[rows, :, :length]  # the right side is gathered first: overlap is safe
            self.lengths[:n] = self.lengths[rows]
            return self.head(n)
        k = [t[rows].clone() for t in self.k]
        v = [t[rows].clone() for t in self.v]
        return self._sharing_tables(n, k, v, self.lengths[rows].clone())

    def _sharing_tables(self, n: int, k: list, v: list, lengths: torch.Tensor) -> KVCache:
        """A cache of n rows holding k, v and lengths, with this one's slot and rotary tables."""
        view = object.__new__(KVCache)
        view.slots = self.slots
        view.cos = self.cos
        view.sin = self.sin
        view.rows = self.rows[:n]
        view.k = k
        view.v = v
        view.lengths = lengths
        return view
