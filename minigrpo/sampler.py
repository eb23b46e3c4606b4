"""Stage 1 of the loop, rollout: G sampled completions per prompt, with the log-probs GRPO needs.

In: prompts as lists of token ids, and the sampling settings. Out: `Samples` (completion tokens,
the log-prob of each under the temperature-scaled full distribution, finish reasons, timings).
It knows token ids and the model, not text, rewards or training.

Where the speed comes from: one static KV cache sized once per call; each prompt prefilled once
and its cache copied into its G rows; the LM head applied to the last position only; a decode
step with no host synchronisation but a periodic "all finished?" check; on CPU, top-p by
rejection instead of a sort of the whole vocabulary (exact; see `nucleus_by_rejection`).
Finished rows are dropped from the batch (the KV cache compacted in place) once they are half of
it; with torch.compile they are masked instead, so that shapes never change. The slow reference,
full recompute per token, lives in the tests.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import torch

from .qwen3 import Qwen3

COMPILE_SLOT_MULTIPLE = 64  # compiled decode steps see cache lengths rounded up to this


@dataclass
class SamplingConfig:
    """How completions are drawn; checked once, before any work."""

    max_new_tokens: int = 256  # completion budget per sample; EOS counts
    temperature: float = 1.0  # logits are divided by this; 0 means greedy
    top_p: float = 1.0  # nucleus: keep the most likely tokens up to this probability mass, in (0, 1]
    top_k: int = 0  # keep only the k most likely tokens; 0 keeps all
    num_samples: int = 1  # completions per prompt (GRPO's group size G)
    eos_token_ids: tuple[int, ...] = ()  # any of these ends a completion (and is kept in it)
    seed: int | None = None  # the same seed gives the same tokens; None draws one from torch's global RNG
    compile: bool = False  # wrap the decode step in torch.compile
    check_every: int = 8  # decode steps between "all finished?" checks, the loop's only host sync
    compact: bool = True  # at a check, drop finished rows from the batch once they are half of it (eager only)

    def __post_init__(self):
        self.eos_token_ids = tuple(int(i) for i in self.eos_token_ids)
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {self.num_samples!r}")
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")


@dataclass
class Samples:
    """What one generate() call produced, ordered prompt by prompt (prompt 0's samples first)."""

    tokens: list[list[int]]  # completion ids per sample, EOS included when emitted
    logprobs: list[list[float]]  # per completion token: log softmax(logits / temperature); temperature 1 when greedy
    finish_reasons: list[str]  # "stop" (an EOS id was emitted) or "length" (max_new_tokens reached)
    prompt_indices: list[int]  # the prompt each sample continues
    prefill_seconds: float = 0.0  # prompt pass, including copying each prompt's cache into its G rows
    decode_seconds: float = 0.0  # every decode step, sampling included
    decode_steps: int = 0  # model calls after the prefill
    kv_cache_bytes: int = 0  # the one KV cache this call allocated

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


def generate(model: Qwen3, prompts: list[list[int]], **settings) -> Samples:
    """Sample `num_samples` completions for each prompt; settings are SamplingConfig's fields."""
    config = SamplingConfig(**settings)
    check_prompts(prompts, config, model.config.vocab_size, model.config.max_position_embeddings)
    device = model.device
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed if config.seed is not None else int(torch.randint(2**62, ()).item()))
    with torch.no_grad():
        return _generate(model, prompts, config, generator)


def check_prompts(prompts, config: SamplingConfig, vocab_size: int, context: int) -> None:
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if not all(isinstance(t, numbers.Integral) for t in prompt):
            raise ValueError(f"prompt {i} must be a list of token ids (ints); encode text with the tokenizer first")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
        if len(prompt) + config.max_new_tokens > context:
            raise ValueError(
                f"prompt {i} has {len(prompt)} tokens; with max_new_tokens={config.max_new_tokens} that exceeds "
                f"the model's context of {context} (max_position_embeddings)"
            )


def _generate(model: Qwen3, prompts, config: SamplingConfig, generator: torch.Generator) -> Samples:
    G, N = config.num_samples, config.max_new_tokens
    ids, mask = left_pad(prompts, model.device)  # (P, Lp)
    slots = ids.shape[1] + N
    if config.compile:  # round up so that calls with other prompt lengths reuse the compiled step
        slots = -(-slots // COMPILE_SLOT_MULTIPLE) * COMPILE_SLOT_MULTIPLE
    cache = model.new_cache(len(prompts) * G, slots)

    start = time.perf_counter()
    logits = prefill(model, ids, mask, cache, G)  # (B, V)
    prefill_seconds = time.perf_counter() - start

    step = decode_step
    if config.compile:
        step = torch.compile(decode_step, dynamic=False)
    start = time.perf_counter()
    tokens, logprobs, lengths, steps = decode(model, step, logits, cache, ids.shape[1], config, generator)
    decode_seconds = time.perf_counter() - start
    return to_samples(tokens, logprobs, lengths, config, len(prompts), prefill_seconds, decode_seconds, steps, cache.nbytes)


def left_pad(prompts, device):
    """(P, Lp) token ids and attention mask, padded on the left so every prompt ends at the last column."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def prefill(model: Qwen3, ids, mask, cache, group_size: int) -> torch.Tensor:
    """Run each prompt once into the first row of its group, copy that row to the other G-1; (B, V) logits."""
    hidden = model.hidden_states(ids, mask, cache=cache.every_nth_row(group_size))  # (P, Lp, hidden)
    cache.fill_groups(group_size)
    logits = model.logits(hidden[:, -1])  # (P, V): the LM head on the last position only
    return logits.repeat_interleave(group_size, dim=0)  # (B, V)


def decode_step(model: Qwen3, tokens: torch.Tensor, cache, position) -> torch.Tensor:
    """One token per row (B, 1) through the model at cache slot `position`; (B, V) logits."""
    hidden = model.hidden_states(tokens, cache=cache, start_pos=position)  # (B, 1, hidden)
    return model.logits(hidden[:, -1])


def decode(model, step, logits, cache, prompt_len: int, config: SamplingConfig, generator):
    """Sample up to max_new_tokens per row; returns (B, N) tokens and log-probs, (B,) lengths, steps run."""
    B, N = logits.shape[0], config.max_new_tokens
    device = logits.device
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)  # (B, N)
    logprobs = torch.zeros(B, N, dtype=torch.float32, device=device)  # (B, N)
    lengths = torch.full((B,), N, dtype=torch.long, device=device)  # (B,): N until an EOS shortens it
    done = torch.zeros(B, dtype=torch.bool, device=device)  # (B,)
    rows = torch.arange(B, device=device)  # (b,): which sample each row of the running batch is
    eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=device)
    compact = config.compact and not config.compile
    # compiled steps take the position as a tensor so that one graph serves every step
    as_position = (lambda t: torch.tensor(t, device=device)) if config.compile else (lambda t: t)
    steps = 0
    for t in range(N):
        token, logprob = sample(logits, config, generator)  # (b,) each
        tokens[rows, t], logprobs[rows, t] = token, logprob
        finished_now = torch.isin(token, eos) & ~done[rows]  # (b,)
        lengths[rows] = torch.where(finished_now, t + 1, lengths[rows])
        done[rows] |= finished_now
        if t == N - 1:
            break
        if (t + 1) % config.check_every == 0:  # the loop's only host syncs
            running = ~done[rows]  # (b,)
            if not bool(running.any()):
                break
            if compact and int(running.sum()) <= len(rows) // 2:
                keep = running.nonzero().squeeze(1)  # (b',)
                rows, token, cache = rows[keep], token[keep], cache.keep_rows(keep)
        logits = step(model, token[:, None], cache, as_position(prompt_len + t))  # (b, V)
        steps += 1
    return tokens, logprobs, lengths, steps


def sample(logits: torch.Tensor, config: SamplingConfig, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob under softmax(logits / temperature); (B,) each."""
    if config.temperature == 0:
        token = logits.argmax(-1)  # (B,)
        return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits / config.temperature if config.temperature != 1 else logits  # (B, V)
    token = sample_filtered(scaled, config.top_k, config.top_p, generator)  # (B,)
    return token, scaled.gather(-1, token[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def sample_filtered(scaled, top_k: int, top_p: float, generator) -> torch.Tensor:
    """Draw from the top-k / nucleus-filtered distribution; top-p applies after top-k, as in transformers."""
    if top_k and top_k < scaled.shape[-1]:
        values, indices = scaled.topk(top_k, dim=-1)  # (B, k) each, most likely first
        probs = values.softmax(-1)  # (B, k), renormalised over the k tokens
        if top_p < 1:
            mass_before = probs.cumsum(-1) - probs  # (B, k)
            probs = probs.masked_fill(mass_before >= top_p, 0.0)  # the most likely token always stays
        return indices.gather(-1, draw(probs.cumsum(-1), generator)).squeeze(-1)
    probs = scaled.softmax(-1)  # (B, V)
    if top_p >= 1:
        return draw(probs.cumsum(-1), generator).squeeze(-1)
    if probs.device.type == "cpu":
        token = nucleus_by_rejection(probs, top_p, generator)
        if token is not None:
            return token
    return nucleus_by_sorting(probs, top_p, generator)


def draw(cdf: torch.Tensor, generator) -> torch.Tensor:
    """(B, 1) indices drawn by inverting each row's unnormalised cumulative weights (B, K).

    One uniform number per row: far cheaper on CPU than torch.multinomial or exponential noise,
    which both draw a random number per vocabulary entry. Zero-weight entries are never drawn.
    """
    u = 1.0 - torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device)  # (B, 1), in (0, 1]
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=cdf.shape[-1] - 1)


def nucleus_by_sorting(probs, top_p: float, generator) -> torch.Tensor:
    """Top-p the textbook way: sort (B, V), keep the shortest prefix holding top_p of the mass, draw."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V) each
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    kept = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return order.gather(-1, draw(kept.cumsum(-1), generator)).squeeze(-1)


def nucleus_by_rejection(probs, top_p: float, generator, tries: int = 8) -> torch.Tensor | None:
    """Top-p without sorting: draw from the full distribution until the draw lies in the nucleus.

    A token is in the nucleus when the tokens more likely than it hold less than top_p of the mass
    (tokens tied at the boundary are all kept). Accepting only such draws samples exactly from the
    renormalised nucleus; a draw is accepted with probability >= top_p. Each try is one pass over
    (B, V) instead of a sort, and checks all rows on the host: free on CPU, which is why only the
    CPU path uses it. None if some row missed `tries` times (chance <= (1 - top_p)^tries): the
    caller then sorts, which keeps every row exact.
    """
    cdf = probs.cumsum(-1)  # (B, V)
    token = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)  # (B,)
    pending = torch.ones_like(token, dtype=torch.bool)  # (B,)
    for _ in range(tries):
        candidate = draw(cdf, generator)  # (B, 1)
        mass_above = torch.where(probs > probs.gather(-1, candidate), probs, 0.0).sum(-1)  # (B,)
        accepted = pending & (mass_above < top_p)
        token = torch.where(accepted, candidate.squeeze(-1), token)
        pending &= ~accepted
        if not bool(pending.any()):
            return token
    return None


def to_samples(tokens, logprobs, lengths, config, num_prompts, prefill_s, decode_s, steps, cache_bytes) -> Samples:
    tokens, logprobs, lengths = tokens.tolist(), logprobs.tolist(), lengths.tolist()
    eos = set(config.eos_token_ids)
    out_tokens = [row[:n] for row, n in zip(tokens, lengths)]
    return Samples(
        tokens=out_tokens,
        logprobs=[row[:n] for row, n in zip(logprobs, lengths)],
        finish_reasons=["stop" if row and row[-1] in eos else "length" for row in out_tokens],
        prompt_indices=[i for i in range(num_prompts) for _ in range(config.num_samples)],
        prefill_seconds=prefill_s,
        decode_seconds=decode_s,
        decode_steps=steps,
        kv_cache_bytes=cache_bytes,
    )
