"""Stage 1's innermost part: the next token of every decoding row, from its logits (engine.py runs the loop).

In: (B, V) logits, the sampling settings, and each row's random key and next token's index. Out: (B,)
tokens and their log-probs under softmax(logits / temperature). It knows tensors, not the model or the
batch.
Random numbers come from a counter-based hash of (row key, token index, attempt), not a torch.Generator
(the sampler's departure from the usual recipe), all of a row's drawn at once when it starts. Top-k,
then top-p, as in transformers; on CPU top-p is drawn by rejection, exactly, instead of sorting the
whole vocabulary.
"""

from __future__ import annotations

import random

import torch

TRIES = 8  # draws per token that top-p by rejection may use before it sorts


# --- random numbers: a counter-based stream per row ----------------------------------------------
def row_keys(seed: int, rows: int, device) -> torch.Tensor:
    """(rows,) 32-bit keys, one per requested row, from the call's seed."""
    rng = random.Random(seed)
    return torch.tensor([rng.getrandbits(32) for _ in range(rows)], dtype=torch.long, device=device)


def draw_counters(max_new_tokens: int, attempt: int, device) -> torch.Tensor:
    """(1, N+1) counters of draw `attempt` for token indices 0 .. N, N = max_new_tokens (index N: the
    draws of done rows, unused)."""
    return torch.arange(max_new_tokens + 1, device=device)[None] * TRIES + attempt


def attempts(config, device) -> int:
    """Draws per token index a call may use: TRIES where top-p may be drawn by rejection (sampled on CPU
    with top_p < 1; a top-k as large as the vocabulary leaves it to top-p), else the one draw."""
    rejection = torch.device(device).type == "cpu" and config.top_p < 1 and config.temperature > 0
    return TRIES if rejection else 1


def all_draws(keys: torch.Tensor, max_new_tokens: int, attempts: int) -> torch.Tensor:
    """(B, N+1, attempts): every draw rows with `keys` (B,) may use, drawn at once: draw a of token index
    t is uniform(key, draw_counters(...)[t] + a), the numbers drawn one at a time before."""
    first = draw_counters(max_new_tokens, 0, keys.device).T  # (N+1, 1)
    counters = first + torch.arange(attempts, device=keys.device)  # (N+1, attempts)
    return uniform(keys[:, None, None], counters[None])  # (B, N+1, attempts)


def uniform(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Floats in (0, 1] with 24 bits (as torch.rand's float32), one per (key, counter) pair (broadcast):
    hash32(key ^ hash32(counter)), so a row's draw for a token depends on its key and the token's index
    alone."""
    h = hash32(keys ^ hash32(counters))
    return ((h >> 8) + 1).float() * 2.0**-24


def hash32(x: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' "lowbias32" integer hash, on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x, without leaving int64's range: c split into 16-bit halves."""
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (high + x * (c & 0xFFFF)) & 0xFFFFFFFF


# --- choosing a token ----------------------------------------------------------------------------
def sample(logits, config, noise, indices) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob under softmax(logits / temperature); (B,) each. config: the
    call's SamplingConfig (its temperature, top_k and top_p are read). noise (B, N+1, A): each row's
    draws for each token index (`all_draws`: A = `attempts`, more than one where top-p's rejection may
    draw again); indices (B,): the index of each row's next token in its completion."""
    if config.temperature == 0:
        token = logits.argmax(-1)  # (B,)
        return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits / config.temperature if config.temperature != 1 else logits  # (B, V)
    probs = scaled.softmax(-1)  # (B, V)
    u = noise[:, :, 0].gather(1, indices[:, None])  # (B, 1)
    more = lambda attempt, rows: noise[rows, indices[rows], attempt][:, None]  # noqa: E731  (b, 1)
    token = sample_filtered(scaled, probs, config.top_k, config.top_p, u, more)  # (B,)
    return token, probs.gather(-1, token[:, None]).squeeze(-1).log()  # a drawn token's probability is never 0


def sample_filtered(scaled, probs, top_k: int, top_p: float, u, more) -> torch.Tensor:
    """Draw from the top-k, then top-p filtered distribution. probs (B, V) = softmax(scaled); u (B, 1) a
    uniform draw per row; more(attempt, rows) further ones for those rows (top-p by rejection)."""
    if top_k and top_k < scaled.shape[-1]:
        values, indices = scaled.topk(top_k, dim=-1)  # (B, k) each, most likely first
        return draw_sorted(values.softmax(-1), indices, top_p, u)  # renormalised over the k tokens
    if top_p >= 1:
        return invert_cdf(probs.cumsum(-1), u).squeeze(-1)
    if probs.device.type == "cpu":
        token = nucleus_by_rejection(probs, top_p, u, more)
        if token is not None:
            return token
    return nucleus_by_sorting(probs, top_p, u)


def invert_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, 1) indices drawn by inverting each row's unnormalised cumulative weights (B, K) at u (B, 1):
    one uniform number per row, where torch.multinomial or exponential noise draw one per vocabulary
    entry (far dearer on CPU). Zero-weight entries are never drawn."""
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=cdf.shape[-1] - 1)


def nucleus_by_sorting(probs, top_p: float, u) -> torch.Tensor:
    """Top-p the textbook way: sort (B, V), keep the shortest prefix holding top_p of the mass, draw."""
    return draw_sorted(*probs.sort(dim=-1, descending=True), top_p, u)


def draw_sorted(weights, order, top_p: float, u) -> torch.Tensor:
    """(B,) draws from weights (B, K) sorted most likely first, of the tokens `order` (B, K), after top-p."""
    if top_p < 1:
        mass_before = weights.cumsum(-1) - weights  # (B, K)
        weights = weights.masked_fill(mass_before >= top_p, 0.0)  # the most likely token always stays
    return order.gather(-1, invert_cdf(weights.cumsum(-1), u)).squeeze(-1)


def nucleus_by_rejection(probs, top_p: float, u, more, tries: int = TRIES) -> torch.Tensor | None:
    """Top-p without sorting: draw from the full distribution until the draw lies in the nucleus.

    A token is in the nucleus when the tokens more likely than it hold less than top_p of the mass
    (ties at the boundary all kept); accepting only such draws samples the renormalised nucleus
    exactly, each with probability >= top_p. A try is one pass over the pending rows, checked on the
    host (free on CPU only, hence CPU only). None if a row missed `tries` times (chance <=
    (1 - top_p)^tries): the caller then sorts, which keeps every row exact.
    """
    cdf = probs.cumsum(-1)  # (B, V)
    token = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)  # (B,)
    pending = torch.arange(probs.shape[0], device=probs.device)  # (b,): rows without a token yet
    for attempt in range(tries):
        if attempt == 0:
            p = probs  # (b, V)
            draw = u  # (b, 1)
            candidate = invert_cdf(cdf, draw)  # (b, 1)
        else:
            p = probs[pending]  # (b, V)
            draw = more(attempt, pending)  # (b, 1)
            candidate = invert_cdf(cdf[pending], draw)  # (b, 1)
        mass_above = torch.where(p > p.gather(-1, candidate), p, 0.0).sum(-1)  # (b,)
        accepted = mass_above < top_p
        if attempt == 0 and accepted.all():  # the common case: every row's first draw is in its nucleus
            return candidate.squeeze(-1)
        token[pending[accepted]] = candidate.squeeze(-1)[accepted]
        pending = pending[~accepted]
        if len(pending) == 0:
            return token
    return None
