"""generate(compile=True) on CPU gives eager's tokens and log-probs, across span buckets and compaction.

Inductor builds a C++ kernel per graph: seconds each on these CPUs with a warm cache, tens of seconds
with a cold one (a fresh machine). So the compiled run is this file's background work (conftest's
Background): a process of its own, started as the session starts, while the other files' tests run;
the eager run and the comparison happen here.
"""

import pytest
import torch
from helpers import in_a_process, tiny_model

import minigrpo

# 70 and 3 tokens: row 0 starts past slot 64 and crosses 128 late
PROMPTS = [list(range(1, 71)), [13, 4, 9]]


def the_model() -> minigrpo.Qwen3:
    """One layer: each compiled graph costs seconds of inductor work."""
    return tiny_model(seed=3, num_hidden_layers=1)


def decoding_settings(model: minigrpo.Qwen3) -> dict:
    """Greedy, with an EOS token that ends row 1 by step 21 and row 0 late or never."""
    free = minigrpo.generate(model, PROMPTS, max_new_tokens=76, temperature=0)
    late = lambda t: t not in free.tokens[0][:70]  # noqa: E731
    eos = next(t for t in free.tokens[1][5:21] if late(t) and t not in free.tokens[1][:5])
    return dict(max_new_tokens=76, temperature=0, eos_token_ids=[eos], check_every=4)


def compiled_run() -> dict:
    """In the background process: the compiled run's settings, tokens, log-probs and finish reasons, and
    each time its batch shrank ([rows kept, fresh cache])."""
    model = the_model()
    settings = decoding_settings(model)
    shrunk = []
    keep_rows = minigrpo.KVCache.keep_rows

    def counted_keep_rows(self, rows, n, fresh=False):
        shrunk.append((len(rows), fresh))
        return keep_rows(self, rows, n, fresh=fresh)

    minigrpo.KVCache.keep_rows = counted_keep_rows  # this process ends after the run
    samples = minigrpo.generate(model, PROMPTS, compile=True, **settings)
    return {
        "settings": settings,
        "tokens": samples.tokens,
        "logprobs": samples.logprobs,
        "finish_reasons": samples.finish_reasons,
        "shrunk": shrunk,
    }


def background_work(tmp_path_factory) -> dict:
    return in_a_process("test_compiled_decode", "compiled_run")


@pytest.fixture(scope="module")
def compiled(background) -> dict:
    return background.result(__name__)


def test_compiled_decode_crosses_span_buckets_and_compacts_like_eager(compiled):
    """Completions that cross 128 cache slots (from the 128-slot span bucket to the 256 one), and rows that
    finish early (the batch shrinks to a smaller compiled batch size): three graphs, (2 rows, 128 slots),
    (1, 128) and (1, 256), as row 0's prompt already fills more than 64 slots."""
    model = the_model()
    settings = decoding_settings(model)
    eager = minigrpo.generate(model, PROMPTS, **settings)
    assert compiled["settings"] == settings
    assert compiled["shrunk"] == [[1, True]]  # the batch went from 2 rows to 1 while compiled
    assert len(eager.tokens[1]) <= 21 and len(eager.tokens[0]) > 70
    assert len(PROMPTS[0]) + len(eager.tokens[1]) < 128 < len(PROMPTS[0]) + len(eager.tokens[0])
    assert compiled["tokens"] == eager.tokens and compiled["finish_reasons"] == eager.finish_reasons
    for a, b in zip(compiled["logprobs"], eager.logprobs):
        assert (torch.tensor(a) - torch.tensor(b)).abs().max() <= 1e-5
