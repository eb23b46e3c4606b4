"""Stage 4 of the loop, update: how a step's rollouts are cut into micro-batches, and what the cut pads.

In: the rollouts' (prompt, completion) lengths and the limits (rows, padded tokens, whole groups for the
shared-prompt forward). Out: micro-batches as lists of rollout indices, in a shuffled order when given a
generator, and the share of the computed tokens that is padding (`padding_fraction`, a stat). It knows
lengths and indices, not tensors' values or the model; updater.py is its one caller.
"""

from __future__ import annotations

import torch

from ..rollout import Rollout


def micro_batches(count: int, size: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """Indices 0..count-1 in chunks of `size`, shuffled when a generator is given."""
    order = list(range(count))
    if generator is not None:
        order = torch.randperm(count, generator=generator).tolist()
    return [order[i : i + size] for i in range(0, count, size)]


def token_budget_batches(
    lengths: list[tuple[int, int]], max_rows: int, max_tokens: int, generator: torch.Generator | None = None
) -> list[list[int]]:
    """Indices of rollouts with (prompt, completion) `lengths`, in micro-batches of similar length.

    A micro-batch pads to its longest prompt plus its longest completion; it takes rollouts, longest
    first, while rows x that padded length stays within `max_tokens` and rows within `max_rows`. A
    rollout longer than the budget on its own gets a micro-batch to itself (handled, not refused).
    The order of the micro-batches (and of rollouts of equal length) is shuffled by `generator`.
    """
    order = list(range(len(lengths)))
    if generator is not None:
        order = torch.randperm(len(lengths), generator=generator).tolist()
    order.sort(key=lambda i: -sum(lengths[i]))  # stable: equal lengths keep the shuffled order
    batches = []
    current = []  # the micro-batch being filled, padded to prompt_width + completion_width
    prompt_width = 0
    completion_width = 0
    for i in order:
        p, c = lengths[i]
        wider = (len(current) + 1) * (max(prompt_width, p) + max(completion_width, c))
        if current and (wider > max_tokens or len(current) == max_rows):
            batches.append(current)
            current = []
            prompt_width = 0
            completion_width = 0
        current.append(i)
        prompt_width = max(prompt_width, p)
        completion_width = max(completion_width, c)
    batches.append(current)
    if generator is not None:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def group_batches(
    lengths: list[tuple[int, int]],
    group_size: int,
    max_rows: int,
    max_tokens: int = 0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Micro-batches of whole groups, for the shared-prompt forward: rollouts g*G .. g*G+G-1 of
    (prompt, completion) `lengths` are group g, and stay together.

    By rows: max_rows // G groups each. By a token budget (max_tokens > 0): a group weighs its
    prompt once plus G times its longest completion, and `token_budget_batches` packs those.
    """
    G = group_size
    groups = []  # each group's (prompt, G x its longest completion)
    for g in range(0, len(lengths), G):
        longest = max(c for _, c in lengths[g : g + G])
        groups.append((lengths[g][0], G * longest))
    if max_tokens:
        batches = token_budget_batches(groups, max(1, max_rows // G), max_tokens, generator)
    else:
        batches = micro_batches(len(groups), max(1, max_rows // G), generator)
    rollout_batches = []  # each batch of groups as the indices of its rollouts
    for batch in batches:
        rows = []
        for g in batch:
            rows += range(g * G, (g + 1) * G)
        rollout_batches.append(rows)
    return rollout_batches


def padding_fraction(rollouts: list[Rollout], batches: list[list[int]], group_size: int = 1) -> float:
    """Share of the computed tokens of `batches` that are padding: each micro-batch computes its rows'
    prompts padded to the longest (once per group of `group_size` rows that share one) and their
    completions padded to the longest."""
    real = 0.0
    padded = 0.0
    for batch in batches:
        if batch:
            rows = [rollouts[i] for i in batch]
            real += sum(len(r.prompt_ids) / group_size + len(r.completion_ids) for r in rows)
            prompt_width = max(len(r.prompt_ids) for r in rows) / group_size
            completion_width = max(len(r.completion_ids) for r in rows)
            padded += len(rows) * (prompt_width + completion_width)
    return 1.0 - real / padded if padded else 0.0
