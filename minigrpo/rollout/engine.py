"""Stage 1 of the loop, rollout: the decode engine, the state machine behind sampler.generate.

In: the model, prompts as token-id lists, the sampling settings, a seed and an optional `DecodeHook`
(tool calls: tool_turns.py). Out: `Samples`. It keeps the KV cache (model/kv_cache.py) and two tables:
`Completions`, per request, the tokens and log-probs written so far; `BatchRows`, per batch row, what the
row decodes now. It knows token ids and tensors, not text, rewards or tools: the hook is the one place a
decode step is steered by anything but sampling.

How a call runs. The P x G requests (request r continues prompt r // G) decode in one batch of at most
`max_batch_rows` rows, over one KV cache. `Engine.start_rows` prefills each distinct prompt once and
copies it into its rows; every row has its own length. Then `Engine.decode_until_finished` repeats:
`Engine.choose` draws each row's next token (next_token.py) into its request's Completions row, and a
decode step runs every row's last token through the model, the LM head on that position only, attention
over the slots written so far (`Engine.span`, a bound the host knows without a sync).

Refill and compaction. At a check (`Engine.refill_or_drop`: every decode step on CPU, where it is a read
of host memory; every 8 on a GPU) a finished row is refilled with a waiting request; once nothing
waits, finished rows are dropped from the batch when they are half of it (`Engine.compact`). Until then
a finished row writes to the scratch column and its cache length steps back after each decode step: it
costs compute, not correctness. `BatchRows.select` is the one place rows are re-indexed; Completions are
indexed by request and never move. A row's random numbers are keyed by its request (next_token.py), so
refill and compaction move rows around without changing a single draw.

Graphed decode (`compile`): one graph per (batch rows, span), spans from length buckets of 64, 128,
256, ... slots and batch rows from the call's first batch size and the powers of two below it
(compaction pads with finished rows, masked). On a GPU the graphs are CUDA graphs of the eager decode
step (decode_graphs.py), kept with their KV cache from one call to the next: a decode step of 28 layers
is one launch instead of about a thousand, and this is the default there (`compile="auto"`). The graphs
read the cache and their own token and logits buffers, never the BatchRows: a step copies the rows' last
tokens in, and compaction moves the cache's rows to the front in place. On CPU they are torch.compile
graphs (`compile=True`), living for the process; eager is CPU's default, and the reference path
everywhere (`compile=False`). The slow reference, the whole sequence recomputed per token, lives in the
tests.

Tool calls (the hook, tool_turns.ToolTurns). A row that draws the hook's end marker pauses; the hook
runs the call while the other rows decode, and the row resumes with the response's tokens (the
observation) fed in as forced tokens, one per decode step, written to its cache slots like sampled ones
but never drawn (`Engine.write_steered_tokens`). A paused row is held like a finished one (its decode
step's cache write undone) and keeps its random stream. With a hook the host checks every decode step.
Departure from the usual engines (verl's, vLLM's): observations are not prefilled as one chunk; feeding
them through the batched decode steps needs no second attention path, at one decode step per
observation token.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel

from ..config import SamplingConfig
from . import decode_graphs
from .decode_hook import DecodeHook, Steering
from .decode_modes import (
    GPU_ATTENTION,
    batch_buckets,
    compiled_decode_step,
    decode_mode,
    decode_step,
    span_bucket,
)
from .next_token import all_draws, attempts, row_keys, sample

STOPPED = "tool_limit"  # the finish reason of a row its hook stopped (tools: one call past max_tool_calls)


@dataclass
class Samples:
    """What one generate() call produced, ordered prompt by prompt (prompt 0's samples first)."""

    tokens: list[list[int]]  # completion ids per sample, EOS included when emitted
    # per completion token: log softmax(logits / temperature), T = 1 when greedy; 0 for observation
    # tokens, which were not drawn
    logprobs: list[list[float]]
    finish_reasons: list[str]  # "stop" (EOS), "length" (max_new_tokens reached), "tool_limit"
    prompt_indices: list[int]  # the prompt each sample continues
    generated: list[list[bool]] | None = None  # per completion token: sampled (True) or a tool's observation
    tool_calls: list[list] | None = None  # per completion, its calls' records; None without tools
    prefill_seconds: float = 0.0  # prompt passes (the first and every refill), copies into the rows included
    decode_seconds: float = 0.0  # every decode step, sampling included
    decode_steps: int = 0  # model calls after the first prefill
    batch_rows: int = 0  # rows of the KV cache: min(requested rows, max_batch_rows)
    compiled: bool = False  # whether the decode steps ran as graphs (CUDA graphs, or torch.compile's on CPU)
    warmup_seconds: float = 0.0  # capturing CUDA graphs not yet captured (not in decode_seconds)
    kv_cache_bytes: int = 0  # the decode cache plus the largest prefill cache this call allocated

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.tokens))

    @property
    def tokens_per_second(self) -> float:
        total = self.prefill_seconds + self.decode_seconds
        return self.num_tokens / total if total > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        """Milliseconds per decode step."""
        return 1e3 * self.decode_seconds / max(self.decode_steps, 1)


# --- the engine's two tables ---------------------------------------------------------------------
@dataclass
class Completions:
    """Per request (R of them, request r continuing prompt r // G): what its completion holds so far and
    where it may end. Indexed by request id, never moved. Column `max_new` of the (R, max_new + 1)
    buffers is scratch: finished and held rows write there."""

    tokens: torch.Tensor  # (R, max_new + 1) long: the tokens written so far
    logprobs: torch.Tensor  # (R, max_new + 1): their log-probs (fp32, or fp64 for an fp64 model)
    generated: torch.Tensor  # (R, max_new + 1) bool: False where a token is a tool's observation
    budgets: torch.Tensor  # (R,) long: each request's max_new_tokens
    limits: torch.Tensor  # (R,) long: its budget, or the length its hook stopped it at
    stopped: torch.Tensor  # (R,) bool: its hook stopped it
    keys: torch.Tensor  # (R,) long: its random stream's key

    @classmethod
    def empty(cls, budgets: list[int], keys: torch.Tensor, precision: torch.dtype) -> Completions:
        R = len(budgets)
        W = max(budgets) + 1
        device = keys.device
        budget_tensor = torch.tensor(budgets, device=device)  # (R,)
        return cls(
            tokens=torch.zeros(R, W, dtype=torch.long, device=device),
            logprobs=torch.zeros(R, W, dtype=precision, device=device),
            generated=torch.ones(R, W, dtype=torch.bool, device=device),
            budgets=budget_tensor,
            limits=budget_tensor.clone(),
            stopped=torch.zeros(R, dtype=torch.bool, device=device),
            keys=keys,
        )


@dataclass
class BatchRows:
    """Per batch row (b of them, the requests decoding now): one entry per row in every field, so that
    `select` moves every field with its row. Rows are refilled in place (Engine.start_rows) and
    reordered only by `select` (Engine.compact)."""

    requests: torch.Tensor  # (b,) long: the request the row decodes
    columns: torch.Tensor  # (b,) long: the column of the Completions buffers its next token goes to
    finished: torch.Tensor  # (b,) bool: its request has ended; the row idles until refilled or dropped
    last_token: torch.Tensor  # (b,) long: its latest token, the next decode step's input
    noise: torch.Tensor  # (b, max_new + 1, A): its draws per column, A where top-p's rejection may redraw
    keys: torch.Tensor  # (b,) long: its request's random key
    # host: the row's length less the decode steps run so far (its length if it had been decoding since
    # step 0). Every decode step adds at most one slot to a row, so no row holds more than
    # decode_steps + max(lengths_at_step_zero) tokens: the slots a decode step must read, without a sync
    lengths_at_step_zero: list[int]

    @classmethod
    def empty(cls, rows: int, max_new: int, attempts: int, device) -> BatchRows:
        return cls(
            requests=torch.arange(rows, device=device),
            columns=torch.zeros(rows, dtype=torch.long, device=device),
            finished=torch.zeros(rows, dtype=torch.bool, device=device),
            last_token=torch.zeros(rows, dtype=torch.long, device=device),
            noise=torch.zeros(rows, max_new + 1, attempts, device=device),
            keys=torch.zeros(rows, dtype=torch.long, device=device),
            lengths_at_step_zero=[0] * rows,
        )

    def __len__(self) -> int:
        return len(self.lengths_at_step_zero)

    def select(self, order: torch.Tensor) -> BatchRows:
        """Rows `order` (b',) of every field, in that order: the one place rows are re-indexed."""
        host_order = order.tolist()
        picked = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                picked[field.name] = value[order]
            else:
                picked[field.name] = [value[i] for i in host_order]
        return BatchRows(**picked)


# --- the decode loop -----------------------------------------------------------------------------
class Engine:
    """One generate() call: the requests' Completions, the BatchRows decoding now, the KV cache they
    decode in, and the requests still waiting for a row (the module docstring says how a call runs)."""

    def __init__(
        self, model: nn.Module, prompts, config: SamplingConfig, seed: int, hook: DecodeHook | None = None
    ):
        self.model = model
        self.prompts = [list(p) for p in prompts]
        self.config = config
        self.hook = hook
        self.group_size = config.num_samples
        self.num_requests = len(prompts) * self.group_size
        self.device = model.device
        budgets = [n for n in config.budgets(len(prompts)) for _ in range(self.group_size)]
        self.max_new = max(budgets)  # the longest completion budget: the Completions buffers' width - 1
        self.scratch = self.max_new  # the column past every budget
        self.eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=self.device)
        # fp32, or fp64 for a model in fp64 (a test's exact reference)
        precision = torch.float64 if model.dtype == torch.float64 else torch.float32
        keys = row_keys(seed, self.num_requests, self.device)  # (R,): one random stream per request
        self.completions = Completions.empty(budgets, keys, precision)
        self.check_every = config.check_every or (1 if self.device.type == "cpu" else 8)
        if hook is not None:
            self.check_every = 1  # the host sees every token: a call may end at any decode step
        self.prefill_seconds = 0.0
        self.decode_steps = 0
        self.prefill_cache_bytes = 0

    def run(self) -> Samples:
        rows = min(self.num_requests, self.config.max_batch_rows or self.num_requests)
        self.mode = decode_mode(self.config.compile, self.device)
        self.compiled = self.mode != "eager"
        self.allocate(rows)
        if self.mode == "cuda graphs":
            self.decode = self.graphs.step
        elif self.mode == "inductor":
            self.decode = compiled_decode_step()
        else:
            self.decode = decode_step
        packing = self.model.packed_for_decoding(rows) if self.mode == "eager" else contextlib.nullcontext()
        attention = sdpa_kernel(GPU_ATTENTION) if self.device.type == "cuda" else contextlib.nullcontext()
        captured = self.graphs.capture_seconds if self.graphs is not None else 0.0
        start = time.perf_counter()
        with packing, attention:
            self.prefill_seconds += time.perf_counter() - start  # packing the weights counts as prefill
            self.logits = self.start_rows(list(range(rows)), list(range(rows)))  # (b, V)
            first_prefill = self.prefill_seconds
            start = time.perf_counter()
            self.decode_until_finished()
            refill_seconds = self.prefill_seconds - first_prefill  # refills are prefill
            self.warmup_seconds = self.graphs.capture_seconds - captured if self.graphs is not None else 0.0
            decode_seconds = time.perf_counter() - start - refill_seconds - self.warmup_seconds
        return self.to_samples(decode_seconds)

    def allocate(self, rows: int) -> None:
        """The KV cache and the BatchRows of a batch of `rows` rows, all empty."""
        # a row never holds more than its prompt plus its budget - 1 tokens
        slots = max(len(p) + n for p, n in zip(self.prompts, self.config.budgets(len(self.prompts))))
        if self.compiled:  # the cache is a whole span bucket, so every span the loop asks for is a bucket
            slots = span_bucket(slots, 10**9)
        self.graphs = None  # the CUDA graphs and the cache they decode in, kept across calls
        if self.mode == "cuda graphs":
            self.graphs = decode_graphs.decoder_for(self.model, rows, slots)
            self.cache = self.graphs.cache_for(rows)
        else:
            self.cache = self.model.new_cache(rows, slots)
        self.batch_rows = rows
        self.cache_bytes = self.cache.nbytes
        self.batch_sizes = batch_buckets(rows)
        # requests not yet in the batch, next last
        self.waiting = list(range(self.num_requests - 1, rows - 1, -1))
        self.rows = BatchRows.empty(rows, self.max_new, attempts(self.config, self.device), self.device)

    def start_rows(self, slots: list[int], requests: list[int]) -> torch.Tensor:
        """Prefill `requests` into batch rows `slots`, each distinct prompt once and copied to its rows;
        (b', V) logits of their first tokens."""
        t = time.perf_counter()
        prompt_of = [r // self.group_size for r in requests]
        distinct = sorted(set(prompt_of))
        source = torch.tensor([distinct.index(p) for p in prompt_of], device=self.device)  # (b',)
        ids, lengths = right_pad([self.prompts[p] for p in distinct], self.device)  # (P', T), (P',)
        scratch = self.model.new_cache(len(distinct), ids.shape[1])
        self.prefill_cache_bytes = max(self.prefill_cache_bytes, scratch.nbytes)
        logits = self.model.logits(self.model.prefill(ids, lengths, scratch))[source]  # (b', V)
        where = torch.tensor(slots, device=self.device)  # (b',)
        request_ids = torch.tensor(requests, device=self.device)  # (b',)
        self.cache.copy_rows(where, scratch, source, ids.shape[1])
        rows = self.rows
        rows.requests[where] = request_ids
        rows.columns[where] = 0
        rows.finished[where] = False
        rows.keys[where] = self.completions.keys[request_ids]
        draws = all_draws(rows.keys[where], self.max_new, rows.noise.shape[2])  # (b', max_new + 1, A)
        rows.noise[where] = draws
        for slot, p in zip(slots, prompt_of):
            rows.lengths_at_step_zero[slot] = len(self.prompts[p]) - self.decode_steps
        self.prefill_seconds += time.perf_counter() - t
        return logits

    def decode_until_finished(self) -> None:
        """Take a token for every row, then run a decode step, until every request has finished."""
        while True:
            self.choose(self.logits)
            if (self.decode_steps + 1) % self.check_every == 0 and not self.refill_or_drop():
                return
            span = self.span()
            if self.compiled:
                span = span_bucket(span, self.cache.max_len)
            self.logits = self.decode(self.model, self.rows.last_token, self.cache, span)  # (b, V)
            self.cache.lengths -= self.rows.finished.long()  # finished rows stay where they are
            self.decode_steps += 1

    def choose(self, logits: torch.Tensor, which=slice(None)) -> None:
        """Draw the next token of the batch rows `which` (all by default) and write it; with a hook (tool
        calls), written as it steers: a row may take a forced token instead, or none (held), or stop."""
        requests = self.rows.requests[which]  # (b,)
        columns = self.rows.columns[which]  # (b,)
        # token, logprob: (b,) each
        token, logprob = sample(logits, self.config, self.rows.noise[which], columns)
        if self.hook is None:
            self.write_tokens(which, requests, columns, token, logprob)
        else:
            steering = self.hook.steer(self, which, token)  # the one place a hook meets the loop
            self.write_steered_tokens(which, requests, columns, token, logprob, steering)

    def write_tokens(self, which, requests, columns, token, logprob) -> None:
        """Store the rows' tokens at their columns and move the rows on. A row finishes at an EOS or at its
        budget's last column."""
        completions = self.completions
        completions.tokens[requests, columns] = token
        completions.logprobs[requests, columns] = logprob
        ends = torch.isin(token, self.eos)  # (b,)
        finished = self.rows.finished[which] | ends | (columns == completions.budgets[requests] - 1)  # (b,)
        self.rows.finished[which] = finished
        self.rows.last_token[which] = token
        self.rows.columns[which] = torch.where(finished, self.scratch, columns + 1)  # finished: to scratch

    def write_steered_tokens(self, which, requests, columns, drawn, logprob, steering: Steering) -> None:
        """`write_tokens` as the hook steers it. A forced token is stored with log-prob 0 and generated
        False, and its EOS ends nothing; a held row writes to the scratch column and stays as it was, and
        its cache length steps back one, so that the next decode step feeds its last token into that
        token's own slot; a stopped row finishes after its token."""
        completions = self.completions
        rows = self.rows
        forced = steering.forced
        held = steering.held
        token = torch.where(forced, steering.tokens, drawn)  # (b,)
        written = torch.where(held, self.scratch, columns)  # (b,)
        completions.tokens[requests, written] = token
        completions.logprobs[requests, written] = logprob.masked_fill(forced, 0.0)
        completions.generated[requests, written] = ~forced
        ends = torch.isin(token, self.eos) & ~(forced | held)  # (b,)
        last_column = written == completions.budgets[requests] - 1  # (b,)
        finished = rows.finished[which] | ends | last_column | steering.stopped  # (b,)
        next_columns = torch.where(finished, self.scratch, written + 1)  # (b,)
        # before the columns move on: `columns` may be a view of them
        completions.limits[requests] = torch.where(
            steering.stopped, columns + 1, completions.limits[requests]
        )
        completions.stopped[requests] |= steering.stopped
        rows.finished[which] = finished
        rows.last_token[which] = torch.where(held, rows.last_token[which], token)
        rows.columns[which] = torch.where(held, columns, next_columns)
        self.cache.lengths[which] -= held.long()

    def refill_or_drop(self) -> bool:
        """The check: refill finished rows with waiting requests, or, once none wait, drop them (when they
        are half the batch); False once every request has finished."""
        finished = self.rows.finished.nonzero().squeeze(1).tolist()
        if finished and self.waiting:
            refill = finished[: len(self.waiting)]
            requests = [self.waiting.pop() for _ in refill]
            logits = self.start_rows(refill, requests)
            # their first tokens, from the prefill
            self.choose(logits, torch.tensor(refill, device=self.device))
            return True
        running = len(self.rows) - len(finished)
        if running == 0:
            return False
        if self.config.compact and running <= len(self.rows) // 2:
            self.compact(running)
        return True

    def compact(self, running: int) -> None:
        """Move the running rows to the front and shrink the batch (to a batch bucket when compiled)."""
        size = running if not self.compiled else min(b for b in self.batch_sizes if b >= running)
        # running rows first, in order
        order = torch.argsort(self.rows.finished.to(torch.int8), stable=True)[:size]
        self.cache = self.cache.keep_rows(order, self.span(), fresh=self.mode == "inductor")
        self.rows = self.rows.select(order)

    def span(self) -> int:
        """Cache slots the next decode step reads: one more than the longest row will then hold (a
        host-side bound)."""
        return self.decode_steps + max(self.rows.lengths_at_step_zero) + 1

    def to_samples(self, decode_seconds: float) -> Samples:
        completions = self.completions
        # an observation's EOS (Qwen3's <|im_end|> before a tool response) does not end a completion
        budget_columns = slice(0, self.max_new)  # (R, max_new): the scratch column left out
        lengths = completion_lengths(
            completions.tokens[:, budget_columns],
            self.eos,
            completions.limits,
            completions.generated[:, budget_columns],
        )
        lengths = lengths.tolist()
        tokens = [row[:n] for row, n in zip(completions.tokens.tolist(), lengths)]
        generated = [row[:n] for row, n in zip(completions.generated.tolist(), lengths)]
        eos = set(self.config.eos_token_ids)
        finish_reasons = []
        for row, sampled, stopped in zip(tokens, generated, completions.stopped.tolist()):
            if row and row[-1] in eos and sampled[-1]:
                finish_reasons.append("stop")
            elif stopped:
                finish_reasons.append(STOPPED)
            else:
                finish_reasons.append("length")
        return Samples(
            tokens,
            [row[:n] for row, n in zip(completions.logprobs.tolist(), lengths)],
            finish_reasons=finish_reasons,
            prompt_indices=[r // self.group_size for r in range(self.num_requests)],
            generated=generated,
            tool_calls=self.hook.calls if self.hook is not None else None,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=decode_seconds,
            decode_steps=self.decode_steps,
            batch_rows=self.batch_rows,
            compiled=self.compiled,
            warmup_seconds=self.warmup_seconds,
            kv_cache_bytes=self.cache_bytes + self.prefill_cache_bytes,
        )


# --- prompts in, completions out -------------------------------------------------------------------
def right_pad(prompts, device):
    """(P, T) token ids, each prompt from column 0 and padded with 0 on the right, and (P,) lengths."""
    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(p, dtype=torch.long) for p in prompts], batch_first=True
    )  # (P, T)
    return ids.to(device), torch.tensor([len(p) for p in prompts], device=device)


def completion_lengths(
    tokens: torch.Tensor, eos: torch.Tensor, limit, generated: torch.Tensor | None = None
) -> torch.Tensor:
    """(R,) tokens up to and including each row's first sampled EOS (of those `generated`, (R, N), when
    given), at most `limit` (an int, or (R,) per row: a row's slots past its own are never written)."""
    hits = torch.isin(tokens, eos)  # (R, N)
    if generated is not None:
        hits &= generated
    first = hits.to(torch.int8).argmax(-1)  # (R,): first True, or 0 if none
    return torch.minimum(torch.where(hits.any(-1), first + 1, limit), torch.as_tensor(limit))
