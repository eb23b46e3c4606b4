"""Stage 1 of the loop, rollout: G sampled completions per prompt, with the log-probs GRPO needs.

In: prompts as lists of token ids, and the sampling settings. Out: `Samples` (completion tokens,
the log-prob of each under the temperature-scaled full distribution, finish reasons, timings).
It knows token ids and the model, not text, rewards or training.

A call decodes the P x G requested rows in one batch of at most `max_batch_rows` rows, over one
KV cache. Each distinct prompt is prefilled once and copied into its rows; every row has its own
length. At a check (every step on CPU, where it is a read of host memory; every 8 on a GPU) a
finished row is refilled with a waiting request; once nothing waits, finished rows are dropped
from the batch when they are half of it. The LM head runs on the last position only, attention
over the slots written so far; each row's next token is drawn by next_token.py.

Graphed decode (`compile`): one graph per (batch rows, span), spans from length buckets of 64, 128,
256, ... slots and batch rows from the call's first batch size and the powers of two below it
(compaction pads with finished rows, masked). On a GPU the graphs are CUDA graphs of the eager step
(decode_graphs.py), kept with their KV cache from one call to the next: a step of 28 layers is one
launch instead of about a thousand, and this is the default there (`compile="auto"`). On CPU they are
torch.compile graphs (`compile=True`), living for the process; eager is CPU's default, and the
reference path everywhere (`compile=False`). The slow reference, the whole sequence recomputed per
token, lives in the tests.

Tool calls (`tools`, a `ToolHook` such as tools.ToolRunner): a row that samples the hook's end
marker pauses; the hook runs the call while the other rows decode, and the row resumes with the
response's tokens (the observation) fed in as forced tokens, one per decode step, written to its cache
slots like sampled ones but never drawn: their log-probs are 0 and `generated` marks them False. They
count against max_new_tokens. A paused row is held like a finished one (its step's cache write undone)
and keeps its random stream, so its completion does not depend on when the call returned. With tools
the host checks every step.
Departure from the usual engines (verl's, vLLM's): observations are not prefilled as one chunk; feeding
them through the batched decode steps needs no second attention path, at one step per observation token.

Departure from the usual recipe (transformers, vLLM): no torch.Generator. A counter-based hash of
(row seed, step) makes a row's random numbers independent of the batch row it decodes in and of
what runs beside it, so refill and compaction move rows around without changing a single draw.
"""

from __future__ import annotations

import contextlib
import numbers
import time
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import decode_graphs
from .config import SamplingConfig
from .next_token import draw_counters, row_keys, sample, uniform
from .qwen3 import KVCache, Qwen3

SPAN_BUCKET = 64  # compiled steps read 64, 128, 256, ... cache slots
POLL_SECONDS = 0.001  # how often a batch with every row waiting on a tool call looks for answers
# On a GPU, attention runs through SDPA's flash kernel (prompts: causal, no mask) or its memory-efficient
# one (decode steps: a mask over each row's slots), never cuDNN's, which builds a plan for every new
# shape: eager decoding reads one more slot each step, so it paid that plan at every step of a first call.
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class Samples:
    """What one generate() call produced, ordered prompt by prompt (prompt 0's samples first)."""

    tokens: list[list[int]]  # completion ids per sample, EOS included when emitted
    logprobs: list[list[float]]  # per completion token: log softmax(logits / temperature), T = 1 when greedy;
    # 0 for observation tokens, which were not drawn
    finish_reasons: list[str]  # "stop" (EOS), "length" (max_new_tokens reached), "tool_limit"
    prompt_indices: list[int]  # the prompt each sample continues
    generated: list[list[bool]] | None = None  # per completion token: sampled (True) or a tool's observation
    tool_calls: list[list] | None = None  # per completion, its calls as the caller's tool runner has them
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
        return 1e3 * self.decode_seconds / max(self.decode_steps, 1)


class ToolHook(Protocol):
    """What the engine needs of a tool runner (tools.ToolRunner is one). A request is one completion of
    the call (prompt r // G's sample r % G); its tokens so far, observations included, are passed in."""

    end_token_id: int  # a sampled token with this id ends a call: its row pauses
    max_tool_calls: int  # calls per completion; the end marker of one more ends it ("tool_limit")

    def start(self, request: int, completion: list[int]) -> None:
        """Run the call `completion` ends with, in the background."""

    def poll(self, request: int) -> list[int] | None:
        """The call's observation token ids once it is answered (or timed out); None while it runs."""


def generate(
    model: Qwen3,
    prompts: list[list[int]],
    config: SamplingConfig | None = None,
    tools: ToolHook | None = None,
    **settings,
) -> Samples:
    """Sample `num_samples` completions for each prompt; settings are SamplingConfig's fields (over
    `config`'s). With `tools`, a completion may call them (see the module docstring)."""
    config = replace(config, **settings) if config is not None else SamplingConfig(**settings)
    check_prompts(prompts, config, model.config.vocab_size, model.config.max_position_embeddings)
    seed = config.seed if config.seed is not None else int(torch.randint(2**62, ()).item())
    with torch.inference_mode():  # no autograd bookkeeping at all: faster eager steps than no_grad
        return Engine(model, prompts, config, seed, tools).run()


def check_prompts(
    prompts,
    config: SamplingConfig,
    vocab_size: int,
    context: int,
    what: str = "",
    sources: list[str] | None = None,
) -> None:
    """Token-id lists the model can continue by max_new_tokens. A prompt too long is named by its source
    ("data.jsonl, line 7") when `sources` are given, else as a row of `what` counted from 1, as a file's
    rows are ("row 3 of the task's prompts"), else by its index in `prompts` ("prompt 2")."""
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if isinstance(config.max_new_tokens, list) and len(config.max_new_tokens) != len(prompts):
        raise ValueError(
            f"max_new_tokens has {len(config.max_new_tokens)} budgets for {len(prompts)} prompts: "
            "give one per prompt, or one integer for all"
        )
    for i, (prompt, budget) in enumerate(zip(prompts, config.budgets(len(prompts)))):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if not all(isinstance(t, numbers.Integral) for t in prompt):
            raise ValueError(
                f"prompt {i} must be a list of token ids (ints); encode text with the tokenizer first"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
        if len(prompt) + budget > context:
            if sources is not None:
                name = f"{sources[i]} ({what})" if what else sources[i]
            else:
                name = f"row {i + 1} of the {what}" if what else f"prompt {i}"
            raise ValueError(
                f"{name} has {len(prompt)} tokens; with max_new_tokens={budget} "
                f"(max_completion_length) that exceeds the model's context of {context} "
                "(max_position_embeddings)"
            )


# --- the decode loop -----------------------------------------------------------------------------
class Engine:
    """One generate() call. Requests are the P x G rows asked for (request r continues prompt r // G);
    the batch is the <= max_batch_rows of them decoding now, each batch row carrying its request id,
    its token count, whether it is done, its random stream and its next-token logits."""

    def __init__(
        self, model: Qwen3, prompts, config: SamplingConfig, seed: int, tools: ToolHook | None = None
    ):
        self.model, self.prompts, self.config = model, [list(p) for p in prompts], config
        self.G = config.num_samples
        self.requests = len(prompts) * self.G
        self.device = model.device
        budgets = [n for n in config.budgets(len(prompts)) for _ in range(self.G)]
        self.N = max(budgets)  # the longest completion budget: the width of the per-request buffers
        self.budgets = torch.tensor(budgets, device=self.device)  # (R,): each request's max_new_tokens
        self.eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=self.device)
        self.keys = row_keys(seed, self.requests, self.device)  # (R,): one random stream per request
        self.tokens = torch.zeros(self.requests, self.N + 1, dtype=torch.long, device=self.device)  # (R, N+1)
        # (R, N+1); column N: done rows' scratch
        # fp32, or fp64 for a model in fp64 (a test's exact reference)
        precision = torch.float64 if model.dtype == torch.float64 else torch.float32
        self.logprobs = torch.zeros(self.requests, self.N + 1, dtype=precision, device=self.device)
        self.check_every = config.check_every or (1 if self.device.type == "cpu" else 8)
        self.prefill_seconds, self.decode_steps, self.prefill_cache_bytes = 0.0, 0, 0
        # (R, N+1): False where a token is a tool's observation, not sampled
        self.generated = torch.ones(self.requests, self.N + 1, dtype=torch.bool, device=self.device)
        self.tools = ToolTurns(tools, self.requests) if tools is not None else None
        if self.tools is not None:
            self.check_every = 1  # the host sees every token: a call may end at any step

    def run(self) -> Samples:
        rows = min(self.requests, self.config.max_batch_rows or self.requests)
        self.mode = decode_mode(self.config.compile, self.device)
        self.compiled = self.mode != "eager"
        self.allocate(rows)
        if self.mode == "cuda graphs":
            self.step_fn = self.graphs.step
        else:
            self.step_fn = compiled_decode_step() if self.mode == "inductor" else decode_step
        packing = self.model.packed_for_decoding(rows) if self.mode == "eager" else contextlib.nullcontext()
        attention = sdpa_kernel(GPU_ATTENTION) if self.device.type == "cuda" else contextlib.nullcontext()
        captured = self.graphs.capture_seconds if self.graphs is not None else 0.0
        start = time.perf_counter()
        with packing, attention:
            self.prefill_seconds += time.perf_counter() - start  # packing the weights counts as prefill
            self.logits = self.start_rows(list(range(rows)), list(range(rows)))  # (b, V)
            first_prefill = self.prefill_seconds
            start = time.perf_counter()
            self.decode_loop()
            refill_seconds = self.prefill_seconds - first_prefill  # refills are prefill
            self.warmup_seconds = self.graphs.capture_seconds - captured if self.graphs is not None else 0.0
            decode_seconds = time.perf_counter() - start - refill_seconds - self.warmup_seconds
        return self.to_samples(decode_seconds)

    def allocate(self, rows: int) -> None:
        """The KV cache and the per-row state of a batch of `rows` rows, all empty."""
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
        self.batch_rows, self.cache_bytes = rows, self.cache.nbytes
        self.batch_sizes = batch_buckets(rows)
        # requests not yet in the batch, next last
        self.waiting = list(range(self.requests - 1, rows - 1, -1))
        self.rows = torch.arange(rows, device=self.device)  # (b,): the request each batch row decodes
        self.steps = torch.zeros(rows, dtype=torch.long, device=self.device)  # (b,): its next token's index
        self.done = torch.zeros(rows, dtype=torch.bool, device=self.device)  # (b,)
        self.held = torch.zeros(rows, dtype=torch.bool, device=self.device)  # (b,): paused on a tool call
        self.token = torch.zeros(rows, dtype=torch.long, device=self.device)  # (b,): its latest token
        self.noise = torch.zeros(rows, self.N + 1, device=self.device)  # (b, N+1): its first draw per step
        # (b,): its request's random key
        self.row_keys = torch.zeros(rows, dtype=torch.long, device=self.device)
        # host: each row's length minus the decode steps run so far; every step adds one to every row,
        # so the longest row then holds decode_steps + max(reach) tokens
        self.reach = [0] * rows
        if self.tools is not None:
            self.tools.allocate(rows)

    def start_rows(self, slots: list[int], requests: list[int]) -> torch.Tensor:
        """Prefill `requests` into batch rows `slots`, each distinct prompt once and copied to its rows;
        (b', V) logits of their first tokens."""
        t = time.perf_counter()
        prompt_of = [r // self.G for r in requests]
        distinct = sorted(set(prompt_of))
        source = torch.tensor([distinct.index(p) for p in prompt_of], device=self.device)  # (b',)
        ids, lengths = right_pad([self.prompts[p] for p in distinct], self.device)  # (P', T), (P',)
        scratch = self.model.new_cache(len(distinct), ids.shape[1])
        self.prefill_cache_bytes = max(self.prefill_cache_bytes, scratch.nbytes)
        logits = self.model.logits(self.model.prefill(ids, lengths, scratch))[source]  # (b', V)
        where, request_ids = (
            torch.tensor(slots, device=self.device),
            torch.tensor(requests, device=self.device),
        )
        self.cache.copy_rows(where, scratch, source, ids.shape[1])
        self.rows[where], self.steps[where], self.done[where] = request_ids, 0, False
        self.row_keys[where] = self.keys[request_ids]
        self.noise[where] = uniform(self.row_keys[where, None], draw_counters(self.N, 0, self.device))
        for slot, p in zip(slots, prompt_of):
            self.reach[slot] = len(self.prompts[p]) - self.decode_steps
        if self.tools is not None:
            self.tools.start_rows(slots)
        self.prefill_seconds += time.perf_counter() - t
        return logits

    def decode_loop(self) -> None:
        while True:
            self.choose(self.logits)
            if (self.decode_steps + 1) % self.check_every == 0 and not self.check():
                return
            span = self.span()
            if self.compiled:
                span = span_bucket(span, self.cache.max_len)
            # a paused row feeds its last token again, into that token's own slot: its logits stay the
            # ones after that token, which it samples from if its call answers with no observation
            self.cache.lengths -= self.held.long()
            self.logits = self.step_fn(self.model, self.token, self.cache, span)  # (b, V)
            self.cache.lengths -= self.done.long()  # done rows stay where they are
            self.decode_steps += 1

    def choose(self, logits: torch.Tensor, which=slice(None)) -> None:
        """Sample the next token of the batch rows `which` (all by default) and record it. With tools, a
        row answered by a call takes its observation's next token instead, and a row whose call still
        runs takes none: it is held, its step and stream untouched."""
        rows, steps = self.rows[which], self.steps[which]
        # token, logprob: (b,) each
        token, logprob = sample(logits, self.config, self.noise[which], steps, self.row_keys[which])
        if self.tools is None:
            self.record(which, rows, steps, token, logprob)
            return
        if not isinstance(which, slice):  # refilled rows: nothing to observe yet, but a first token may call
            self.record(which, rows, steps, token, logprob)
            self.tools.after_tokens(self, which.tolist(), token.tolist(), [False] * len(token))
            return
        done = self.done.tolist()
        requests = self.rows.tolist()
        # wait for an answer only when no finished row could take a waiting request instead
        self.tools.collect_answers(requests, done, wait=not (self.waiting and any(done)))
        observed, forced, held = self.tools.next_observed(done)  # (b,) each, on the host
        forced, self.held = forced.to(self.device), held.to(self.device)
        token = torch.where(forced, observed.to(self.device), token)
        self.record(which, rows, steps, token, logprob.masked_fill(forced, 0.0), forced, self.held)
        self.tools.after_tokens(self, list(range(len(requests))), token.tolist(), forced.tolist())

    def record(self, which, rows, steps, token, logprob, forced=None, held=None) -> None:
        """Store the rows' tokens at their steps. A row ends at a sampled EOS (an observation's does not
        end it) or at its last step; a held row writes to the scratch column and stays as it was."""
        if held is not None:
            steps = torch.where(held, self.N, steps)
        self.tokens[rows, steps], self.logprobs[rows, steps] = token, logprob
        ends = torch.isin(token, self.eos)
        if forced is not None:
            self.generated[rows, steps] = ~forced
            ends &= ~(forced | held)
        done = self.done[which] | ends | (steps == self.budgets[rows] - 1)
        next_steps = torch.where(done, self.N, steps + 1)  # done rows write to the scratch column
        if held is not None:
            token = torch.where(held, self.token[which], token)
            next_steps = torch.where(held, self.steps[which], next_steps)
        self.done[which], self.token[which], self.steps[which] = done, token, next_steps

    def check(self) -> bool:
        """Refill finished rows with waiting requests, or drop them; False once every request is done."""
        finished = self.done.nonzero().squeeze(1).tolist()
        if finished and self.waiting:
            refill = finished[: len(self.waiting)]
            requests = [self.waiting.pop() for _ in refill]
            logits = self.start_rows(refill, requests)
            # their first tokens, from the prefill
            self.choose(logits, torch.tensor(refill, device=self.device))
            return True
        running = len(self.reach) - len(finished)
        if running == 0:
            return False
        if self.config.compact and running <= len(self.reach) // 2:
            self.keep(running)
        return True

    def keep(self, running: int) -> None:
        """Move the running rows to the front and shrink the batch (to a batch bucket when compiled)."""
        size = running if not self.compiled else min(b for b in self.batch_sizes if b >= running)
        order = torch.argsort(self.done.to(torch.int8), stable=True)[:size]  # running rows first, in order
        self.cache = self.cache.keep_rows(order, self.span(), fresh=self.mode == "inductor")
        self.rows, self.steps, self.done = self.rows[order], self.steps[order], self.done[order]
        self.token, self.noise, self.held = self.token[order], self.noise[order], self.held[order]
        self.row_keys, self.reach = self.row_keys[order], [self.reach[i] for i in order.tolist()]
        if self.tools is not None:
            self.tools.keep(order.tolist())

    def span(self) -> int:
        """Cache slots the next step reads: one more than the longest row will then hold (host-side bound)."""
        return self.decode_steps + max(self.reach) + 1

    def to_samples(self, decode_seconds: float) -> Samples:
        # an observation's EOS (Qwen3's <|im_end|> before a tool response) does not end a completion
        lengths = completion_lengths(
            self.tokens[:, : self.N], self.eos, self.budgets, self.generated[:, : self.N]
        )
        lengths = lengths.tolist()
        if self.tools is not None:
            for request, length in self.tools.over_limit.items():
                lengths[request] = length
        tokens = [row[:n] for row, n in zip(self.tokens.tolist(), lengths)]
        generated = [row[:n] for row, n in zip(self.generated.tolist(), lengths)]
        eos = set(self.config.eos_token_ids)
        finish_reasons = [
            "stop" if row and row[-1] in eos and sampled[-1] else "length"
            for row, sampled in zip(tokens, generated)
        ]
        if self.tools is not None:
            for request in self.tools.over_limit:
                finish_reasons[request] = "tool_limit"
        return Samples(
            tokens,
            [row[:n] for row, n in zip(self.logprobs.tolist(), lengths)],
            finish_reasons=finish_reasons,
            prompt_indices=[r // self.G for r in range(self.requests)],
            generated=generated,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=decode_seconds,
            decode_steps=self.decode_steps,
            batch_rows=self.batch_rows,
            compiled=self.compiled,
            warmup_seconds=self.warmup_seconds,
            kv_cache_bytes=self.cache_bytes + self.prefill_cache_bytes,
        )


class ToolTurns:
    """The host's side of tool calls during one generate() call: per request, the calls made and where a
    completion ended over the limit; per batch row, whether its call is still running and the
    observation tokens it has yet to take."""

    def __init__(self, hook: ToolHook, requests: int):
        self.hook = hook
        self.calls = [0] * requests  # calls each request has made
        self.over_limit = {}  # request -> its length, ended by one call more than max_tool_calls
        self.running = []  # per batch row: its call has not answered yet
        self.queued = []  # per batch row: observation tokens still to feed, in order

    def allocate(self, rows: int) -> None:
        self.running, self.queued = [False] * rows, [[] for _ in range(rows)]

    def start_rows(self, slots: list[int]) -> None:
        for slot in slots:
            self.running[slot], self.queued[slot] = False, []

    def keep(self, order: list[int]) -> None:
        self.running = [self.running[i] for i in order]
        self.queued = [self.queued[i] for i in order]

    def collect_answers(self, requests: list[int], done: list[bool], wait: bool) -> None:
        """Queue the observations of the calls that have answered. When every unfinished row is waiting
        on a call and `wait`, wait here (a decode step would do nothing) until one answers."""
        while True:
            for row, request in enumerate(requests):
                if self.running[row]:
                    observation = self.hook.poll(request)
                    if observation is not None:
                        self.running[row], self.queued[row] = False, list(observation)
            waiting = [self.running[row] for row in range(len(done)) if not done[row]]
            if not wait or not waiting or not all(waiting):
                return
            time.sleep(POLL_SECONDS)

    def next_observed(self, done: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's next observation token (or 0), whether it takes one, whether it is held; (b,) each."""
        rows = len(done)
        tokens = torch.zeros(rows, dtype=torch.long)  # (b,)
        forced = torch.zeros(rows, dtype=torch.bool)  # (b,)
        for row in range(rows):
            if self.queued[row] and not done[row]:
                tokens[row], forced[row] = self.queued[row].pop(0), True
        held = torch.tensor([r and not d for r, d in zip(self.running, done)], dtype=torch.bool)  # (b,)
        return tokens, forced, held

    def after_tokens(self, engine: Engine, slots: list[int], tokens: list[int], forced: list[bool]) -> None:
        """The batch rows `slots` just took `tokens` (the whole batch after a decode step, or refilled
        rows after their prefill). Rows that sampled the end marker: start their call, or end them past
        the limit. A row that ended (EOS, length) drops what it had still to observe."""
        done, requests = engine.done.tolist(), engine.rows.tolist()
        for row, token, was_forced in zip(slots, tokens, forced):
            request = requests[row]
            if done[row]:
                self.queued[row] = []
                continue
            if token != self.hook.end_token_id or was_forced or self.running[row]:
                continue
            length = int(engine.steps[row])  # the marker was the row's token at index length - 1
            self.calls[request] += 1
            if self.calls[request] > self.hook.max_tool_calls:
                self.over_limit[request] = length
                engine.done[row], engine.steps[row] = True, engine.N
                continue
            self.hook.start(request, engine.tokens[request, :length].tolist())
            self.running[row] = True


def decode_step(model: Qwen3, tokens: torch.Tensor, cache: KVCache, span: int) -> torch.Tensor:
    """One token per row (B,) through the model, reading `span` cache slots; (B, V) logits."""
    return model.logits(model.decode(tokens, cache, span))


def decode_mode(compile: bool | str, device: torch.device) -> str:
    """How a call's decode steps run (SamplingConfig.compile): "cuda graphs" on a GPU unless compile is
    False, "inductor" (torch.compile) elsewhere when compile is True, else "eager"."""
    if compile is False:
        return "eager"
    if device.type == "cuda":
        return "cuda graphs"
    return "inductor" if compile is True else "eager"


_compiled_step = None


def compiled_decode_step():
    """The process's one torch.compile'd decode step: its graphs (one per shape) are reused by every call."""
    global _compiled_step
    if _compiled_step is None:
        # one graph per (batch rows, span) pair: a few dozen at most, above dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _compiled_step = torch.compile(decode_step, dynamic=False)
    return _compiled_step


def span_bucket(span: int, max_len: int) -> int:
    """The smallest of 64, 128, 256, ... slots holding `span`, at most the cache's max_len."""
    bucket = SPAN_BUCKET
    while bucket < span:
        bucket *= 2
    return min(bucket, max_len)


def batch_buckets(rows: int) -> list[int]:
    """Batch sizes compiled graphs may see: the first batch and the powers of two below it."""
    return sorted({rows} | {2**k for k in range(rows.bit_length()) if 2**k < rows})


def right_pad(prompts, device):
    """(P, T) token ids, each prompt from column 0 and padded with 0 on the right, and (P,) lengths."""
    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(p, dtype=torch.long) for p in prompts], batch_first=True
    )
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
