"""Stage 1 on a GPU: the sampler's decode step, replayed as CUDA graphs.

In: the model (a qwen3.Qwen3, through its decode, logits and new_cache), one token per batch row (B,),
the engine's KV cache (model/kv_cache.py) and the span of slots to read. Out: (B, V) fp32 logits, what
decode_modes.decode_step returns for the same inputs. It knows the model's decode step and the memory it
runs in; not sampling, requests, refills or the loop (engine.py).

Why: an eager decode step of a 28-layer model launches about a thousand small kernels, one Python call
each, so the GPU waits on the host. A CUDA graph records a step's launches once and replays them with
one call.

The design, the simplest that holds: graphs captured by hand (torch.cuda.CUDAGraph) from the eager
step's own kernels, one per (batch rows, span bucket), not torch.compile's graph trees. A graph then
costs one eager step and one capture (tens of milliseconds), where an inductor build costs tens of
seconds per shape; and the eager step stays the only code to read. A replay is right only if every
tensor the graph touches is where it was at capture, so:
  - the KV cache is this object's, kept from one generate() call to the next: a call decodes in its
    first rows (KVCache.head views), compaction moves rows to the front in place and refills copy into
    it, so a graph captured on one call's view replays on the next call's;
  - tokens go in through a (rows,) buffer and logits come out in a (rows, V) buffer, both this object's;
  - the weights are read where they lie (an optimizer step writes into them in place); a model whose
    weights moved (`.to()`, new tensors) gets a new GraphedDecoder, and its graphs, on its next call.
All graphs share one memory pool for their intermediates and are kept for this object's life: they are
replayed one at a time, so they may share it, and dropping one would free a pool the next capture still
names (the allocator's "use_count > 0" assertion, which the first version hit after compaction dropped
its graphs). A call that needs more rows or slots than the cache has drops everything and starts anew.

What it holds between calls: the cache (rows x slots, reported as the call's kv_cache_bytes), one logits
buffer and the pool; `release(model)` frees them.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import nn

_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its GraphedDecoder


def decoder_for(model: nn.Module, rows: int, slots: int) -> GraphedDecoder:
    """The model's decoder, with a cache of at least `rows` x `slots`: the one kept from an earlier
    call when the weights are where they were and the cache is large enough, else a new one (the old
    one's memory freed first)."""
    old = _decoders.get(model)
    if old is not None and old.weights == weight_addresses(model) and old.fits(rows, slots):
        return old
    if old is not None:  # too small, or the weights moved: its graphs read memory no longer the model's
        old.free()
        rows = max(rows, old.rows)
        slots = max(slots, old.slots)
    decoder = GraphedDecoder(model, rows, slots)
    _decoders[model] = decoder
    return decoder


def release(model: nn.Module) -> None:
    """Free the model's graphs, KV cache and buffers (the next graphed call captures anew)."""
    decoder = _decoders.pop(model, None)
    if decoder is not None:
        decoder.free()


def weight_addresses(model: nn.Module) -> tuple[int, ...]:
    """Where each parameter's data lies: the graphs read them there."""
    return tuple(p.data_ptr() for p in model.parameters())


class GraphedDecoder:
    """A model's decode graphs and the memory they run in (the module docstring says why it is shaped so)."""

    def __init__(self, model: nn.Module, rows: int, slots: int):
        self.weights = weight_addresses(model)
        self.rows = rows
        self.slots = slots
        self.cache = model.new_cache(rows, slots)  # (rows, kv_heads, slots, D) per layer
        self.tokens = torch.zeros(
            rows, dtype=torch.long, device=model.device
        )  # (rows,): a decode step's input
        precision = torch.float64 if model.dtype == torch.float64 else torch.float32  # as model.logits gives
        vocab = model.config.vocab_size
        self.logits = torch.zeros(rows, vocab, dtype=precision, device=model.device)  # (rows, V): its output
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch rows, span) -> graph
        self.pool = torch.cuda.graph_pool_handle()  # every graph's intermediates
        self.stream = torch.cuda.Stream(model.device)  # warm-up and capture run here, off the default stream
        self.capture_seconds = 0.0  # spent warming up and capturing, over this decoder's life

    def fits(self, rows: int, slots: int) -> bool:
        return rows <= self.rows and slots <= self.slots

    def cache_for(self, rows: int):
        """The first `rows` rows of the cache, for a new call (prefill sets every row's length)."""
        return self.cache.head(rows)

    def step(self, model: nn.Module, tokens: torch.Tensor, cache, span: int) -> torch.Tensor:
        """decode_modes.decode_step by replay: (B,) tokens -> (B, V) logits, the buffer the next step
        overwrites. `cache` must be a head view of this decoder's cache (cache_for, keep_rows)."""
        rows = tokens.shape[0]
        if cache.k[0].data_ptr() != self.cache.k[0].data_ptr() or cache.batch_size != rows:
            raise RuntimeError("GraphedDecoder.step needs the first rows of its own cache (cache_for)")
        self.tokens[:rows].copy_(tokens)
        graph = self.graphs.get((rows, span))
        if graph is None:
            graph = self.capture(model, cache, rows, span)
        graph.replay()
        return self.logits[:rows]

    def capture(self, model: nn.Module, cache, rows: int, span: int) -> torch.cuda.CUDAGraph:
        """Record the step of `rows` rows reading `span` slots. One eager run first, on the capture's
        stream (it makes the libraries' handles and workspaces there, outside the graph), with its one
        lasting effect undone: the lengths it advanced. The slot it wrote is the one the step writes."""
        start = time.perf_counter()
        self.stream.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(self.stream):
            self.run(model, cache, rows, span)
            cache.lengths.sub_(1)
        torch.cuda.current_stream(model.device).wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            self.run(model, cache, rows, span)
        self.graphs[(rows, span)] = graph
        torch.cuda.synchronize(model.device)
        self.capture_seconds += time.perf_counter() - start
        return graph

    def run(self, model: nn.Module, cache, rows: int, span: int) -> None:
        """The decode step itself, eager, from and into this decoder's buffers."""
        hidden = model.decode(self.tokens[:rows], cache, span)  # (rows, hidden)
        self.logits[:rows].copy_(model.logits(hidden))  # (rows, V)

    def free(self) -> None:
        self.graphs.clear()  # before the cache: no graph outlives the memory it reads
        self.cache = None
        self.tokens = None
        self.logits = None
