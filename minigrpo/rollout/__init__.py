"""Stage 1 of the loop, rollout: prompts in, G sampled completions per prompt out, kept in the rollout
buffer that every later stage reads.

- `generate` (sampler.py): the stage's entry; `check_prompts` refuses prompts the context cannot hold;
- the decode loop (engine.py: `Engine`, `Samples`), with refill and compaction; its decode step run
  eager, compiled or as CUDA graphs (decode_modes.py, decode_graphs.py);
- each row's next token (next_token.py): temperature, top-k, top-p, counter-based random numbers;
- the loop's one hook (decode_hook.py), which tool calls use (tool_turns.py: a row pauses at a call and
  takes the answer as forced tokens);
- the rollout buffer (buffer.py): `Rollout`, made from `Samples` by `from_samples`; `StepRollouts`;
  collation into padded tensors (how the update cuts them into micro-batches is update/'s).
It knows token ids, not text: the tools' runner and the model come in as arguments. Nothing outside
this folder imports from inside it: only the names below.
"""

from .buffer import (
    Batch,
    Rollout,
    StepRollouts,
    collate,
    completion_stats,
    from_samples,
    loss_positions,
    padding_rollout,
    split_logprobs,
)
from .decode_graphs import release
from .engine import Engine, Samples
from .next_token import draw_counters, row_keys, uniform
from .sampler import check_prompts, generate

__all__ = [
    "Batch",
    "Engine",
    "Rollout",
    "Samples",
    "StepRollouts",
    "check_prompts",
    "collate",
    "completion_stats",
    "draw_counters",
    "from_samples",
    "generate",
    "loss_positions",
    "padding_rollout",
    "release",
    "row_keys",
    "split_logprobs",
    "uniform",
]
