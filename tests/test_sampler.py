"""The batched, cached sampler against the naive one, and its sampling rules on hand-set logits."""

import pytest
import torch
from helpers import TINY, fixed_logits_model, tiny_model
from reference_sampler import naive_generate, next_token_distribution

import minigrpo
import minigrpo.model.layers as layers
import minigrpo.rollout.next_token as next_token

PROMPTS = [[5, 9, 2, 77, 31, 8, 64], [13, 4], [90, 1, 1, 3, 45], [7]]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)  # greedy completions of this one vary (a tied random model repeats its input)


def test_greedy_with_packed_weights_equals_naive():
    """A model large enough for the oneDNN-packed products (the sampler's default on CPU)."""
    model = tiny_model(seed=3, hidden_size=256, intermediate_size=768, vocab_size=600, num_hidden_layers=1)
    prompts = [[5, 9, 2, 77, 31], [13, 4]]
    ours = minigrpo.generate(model, prompts, max_new_tokens=10, temperature=0, num_samples=2)
    naive, naive_logprobs = naive_generate(model, prompts, max_new_tokens=10, temperature=0, num_samples=2)
    assert ours.tokens == naive
    for a, b in zip(ours.logprobs, naive_logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)


def test_without_the_onednn_ops_sampling_gives_the_packed_tokens(monkeypatch):
    """The plain products (no oneDNN ops in this torch) sample what the packed ones do."""
    model = tiny_model(seed=3, hidden_size=256, intermediate_size=768, vocab_size=600, num_hidden_layers=1)
    prompts = [[5, 9, 2, 77, 31], [13, 4]]
    settings = dict(max_new_tokens=10, num_samples=2, seed=1, temperature=0.8, top_p=0.9)
    packed = minigrpo.generate(model, prompts, **settings)
    monkeypatch.setattr(layers, "onednn_available", lambda: False)
    assert layers.pack_for_decoding(model.layers[0].mlp.up_proj.weight, None, 4) is None
    plain = minigrpo.generate(model, prompts, **settings)
    assert plain.tokens == packed.tokens
    for a, b in zip(plain.logprobs, packed.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_greedy_batched_equals_one_at_a_time_and_naive(model):
    batched = minigrpo.generate(model, PROMPTS, max_new_tokens=12, temperature=0)
    alone = [minigrpo.generate(model, [p], max_new_tokens=12, temperature=0).tokens[0] for p in PROMPTS]
    naive, naive_logprobs = naive_generate(model, PROMPTS, max_new_tokens=12, temperature=0)
    assert batched.tokens == alone == naive
    for ours, reference in zip(batched.logprobs, naive_logprobs):
        assert torch.allclose(torch.tensor(ours), torch.tensor(reference), atol=1e-4)


@pytest.mark.parametrize(
    "settings", [dict(temperature=0.7, top_p=0.9), dict(temperature=1.3, top_k=5), dict(temperature=1.0)]
)
def test_logprobs_equal_a_full_forward_pass(model, settings):
    samples = minigrpo.generate(model, PROMPTS, max_new_tokens=9, num_samples=2, seed=3, **settings)
    for tokens, logprobs, index in zip(samples.tokens, samples.logprobs, samples.prompt_indices):
        sequence = torch.tensor([PROMPTS[index] + tokens])
        with torch.no_grad():
            scaled = model(sequence)[0, len(PROMPTS[index]) - 1 : -1] / settings["temperature"]  # (n, V)
        expected = scaled.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
        assert (torch.tensor(logprobs) - expected).abs().max() <= 1e-4


def test_num_samples_replication_equals_separate_prefills(model):
    """G rows copied from one prefill decode as G separate calls do."""
    G = 3
    greedy = minigrpo.generate(model, PROMPTS, max_new_tokens=6, temperature=0, num_samples=G)
    single = minigrpo.generate(model, PROMPTS, max_new_tokens=6, temperature=0)
    assert greedy.tokens == [t for t in single.tokens for _ in range(G)]
    for ours, alone in zip(greedy.logprobs, [lp for lp in single.logprobs for _ in range(G)]):
        assert torch.allclose(torch.tensor(ours), torch.tensor(alone), atol=1e-5)
    assert greedy.prompt_indices == [i for i in range(len(PROMPTS)) for _ in range(G)]


def test_fixed_seed_reproduces(model):
    settings = dict(max_new_tokens=10, temperature=1.0, top_p=0.95, num_samples=4)
    first = minigrpo.generate(model, PROMPTS, seed=7, **settings)
    again = minigrpo.generate(model, PROMPTS, seed=7, **settings)
    other = minigrpo.generate(model, PROMPTS, seed=8, **settings)
    assert first.tokens == again.tokens and first.logprobs == again.logprobs
    assert first.tokens != other.tokens
    assert len({tuple(t) for t in first.tokens[:4]}) > 1  # the G samples of a prompt differ


def test_eos_and_max_new_tokens_per_row(model):
    free = minigrpo.generate(model, PROMPTS, max_new_tokens=12, temperature=0)
    eos = free.tokens[0][3]  # a token row 0 emits at step 4 (maybe earlier too)
    stopped = minigrpo.generate(
        model, PROMPTS, max_new_tokens=12, temperature=0, eos_token_ids=[eos, 10_000 % TINY["vocab_size"]]
    )
    for row, tokens in enumerate(free.tokens):
        ends = [i for i, t in enumerate(tokens) if t in (eos, 10_000 % TINY["vocab_size"])]
        expected = tokens[: ends[0] + 1] if ends else tokens
        assert stopped.tokens[row] == expected
        assert stopped.finish_reasons[row] == ("stop" if ends else "length")
        assert len(stopped.logprobs[row]) == len(expected)
    assert stopped.finish_reasons[0] == "stop" and len(stopped.tokens[0]) <= 4
    assert all(len(t) == 12 for t in free.tokens) and set(free.finish_reasons) == {"length"}


def test_stops_early_when_every_row_is_done(model):
    first = minigrpo.generate(model, [PROMPTS[0]], max_new_tokens=1, temperature=0).tokens[0][0]
    samples = minigrpo.generate(
        model, [PROMPTS[0]], max_new_tokens=50, temperature=0, eos_token_ids=[first], check_every=1
    )
    assert samples.tokens == [[first]] and samples.decode_steps == 0


# --- sampling rules on a model whose logits are set by hand ----------------------------------------
LOGITS = torch.log(torch.tensor([0.30, 0.25, 0.15, 0.10, 0.08, 0.05, 0.04, 0.03]))  # probabilities, sorted


def draw(model, n_rows=64, steps=8, **settings):
    samples = minigrpo.generate(model, [[1]] * n_rows, max_new_tokens=steps, seed=0, **settings)
    return torch.tensor(samples.tokens).flatten()


def test_hand_set_logits_model_outputs_its_logits():
    model = fixed_logits_model(LOGITS)
    with torch.no_grad():
        out = model(torch.tensor([[3, 1, 4]]))
    assert torch.allclose(out, LOGITS.expand_as(out), rtol=1e-4, atol=1e-5)  # RMSNorm's eps is the only error


def test_top_k_never_leaves_the_k_most_likely():
    tokens = draw(fixed_logits_model(LOGITS), top_k=3)
    assert set(tokens.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("top_p, allowed", [(0.5, {0, 1}), (0.54, {0, 1}), (0.56, {0, 1, 2}), (0.01, {0})])
def test_top_p_never_leaves_the_nucleus(top_p, allowed):
    tokens = draw(fixed_logits_model(LOGITS), top_p=top_p)
    assert set(tokens.tolist()) == allowed


def test_top_k_then_top_p_renormalises_over_k():
    # top-2 renormalised: 0.545, 0.455; top_p 0.5 keeps only token 0
    tokens = draw(fixed_logits_model(LOGITS), top_k=2, top_p=0.5)
    assert set(tokens.tolist()) == {0}


@pytest.mark.parametrize("path", ["rejection", "sorting"])
def test_both_top_p_paths_sample_the_renormalised_nucleus(monkeypatch, path):
    if path == "sorting":  # what a GPU, or a row that misses the nucleus four times, goes through
        monkeypatch.setattr(next_token, "nucleus_by_rejection", lambda *args, **kwargs: None)
    tokens = draw(fixed_logits_model(LOGITS), n_rows=256, steps=16, top_p=0.75)
    assert set(tokens.tolist()) == {0, 1, 2, 3}  # 0.30 + 0.25 + 0.15 < 0.75 <= 0.80
    observed = torch.bincount(tokens, minlength=8).float() / tokens.numel()
    nucleus = LOGITS.exp()[:4] / LOGITS.exp()[:4].sum()
    assert (observed[:4] - nucleus).abs().max() < 0.03  # 4096 draws: 3 sigma is ~0.02


def test_rejection_gives_up_and_sorting_takes_over_when_draws_keep_missing():
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    rigged = torch.Generator().manual_seed(0)
    u = torch.rand(1, 1, generator=rigged)
    # top_p 0.01 keeps only token 0; with 0 tries allowed the rejection path must give up
    assert next_token.nucleus_by_rejection(probs, 0.01, u, lambda attempt, rows: u[rows], tries=0) is None
    assert next_token.nucleus_by_sorting(probs, 0.01, u).tolist() == [0]


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=2.0),
        dict(temperature=0.7, top_k=6, top_p=0.8),
        dict(temperature=1.5, top_p=0.9),
        dict(temperature=0.8, top_k=4),
    ],
)
def test_sampling_frequencies_follow_the_renormalised_softmax(settings):
    """8192 draws of the default path against the reference sampler's distribution (its own code:
    sort, renormalise), by a chi-square test at significance 0.001; tokens outside it never appear."""
    tokens = draw(fixed_logits_model(LOGITS), n_rows=512, steps=16, **settings)
    expected = next_token_distribution(
        LOGITS, settings["temperature"], settings.get("top_k", 0), settings.get("top_p", 1.0)
    )
    support = expected > 0
    observed = torch.bincount(tokens, minlength=8).double()
    assert observed[~support].sum() == 0
    counts, wanted = observed[support], expected[support].double() * tokens.numel()
    chi2 = ((counts - wanted) ** 2 / wanted).sum()
    # chi-square survival function
    p_value = torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2), chi2 / 2)
    assert p_value > 1e-3, f"chi2 {chi2:.1f} on {len(counts) - 1} degrees of freedom (p = {p_value:.2e})"


def test_row_streams_are_uniform_and_independent_of_the_batch():
    """The counter-based draws: uniform on (0, 1], and a row's numbers depend on its key alone."""
    keys = next_token.row_keys(seed=11, rows=4096, device="cpu")
    u = next_token.uniform(keys[:, None], next_token.draw_counters(15, 0, "cpu"))  # (4096, 16)
    assert u.min() > 0 and u.max() <= 1
    deciles = torch.bincount((u.flatten() * 10).long().clamp(max=9), minlength=10).double()
    chi2 = ((deciles - u.numel() / 10) ** 2 / (u.numel() / 10)).sum()
    assert torch.special.gammaincc(torch.tensor(4.5), chi2 / 2) > 1e-3
    assert torch.equal(next_token.uniform(keys[7:9, None], next_token.draw_counters(15, 0, "cpu")), u[7:9])
    assert torch.corrcoef(torch.stack([u[:, 0], u[:, 1]]))[0, 1].abs() < 0.05  # one row's consecutive steps


def test_no_two_draws_of_a_row_share_a_counter_across_steps_and_retries(monkeypatch):
    """A row's first draw at step s and each top-p retry there (attempts 1 .. TRIES - 1) are its own
    numbers: over 2 x TRIES steps no value comes twice, so no retry reuses a later step's draw or
    another retry's. A retry's draws depend on the row, not on which rows retry with it."""
    keys = next_token.row_keys(seed=5, rows=3, device="cpu")
    # past TRIES steps: a counter without a stride per step collides
    N, tries = 2 * next_token.TRIES, next_token.TRIES
    # (3, N+1, TRIES): the sampler's, drawn at once
    noise = next_token.all_draws(keys, N, tries)
    assert torch.equal(
        noise[:, :, 0], next_token.uniform(keys[:, None], next_token.draw_counters(N, 0, "cpu"))
    )
    retries = []  # per step, sample()'s source of further draws
    monkeypatch.setattr(
        next_token,
        "sample_filtered",
        lambda *args: retries.append(args[-1]) or torch.zeros(3, dtype=torch.long),
    )
    config = minigrpo.SamplingConfig(temperature=1.0, top_p=0.5)
    for step in range(N + 1):
        next_token.sample(torch.zeros(3, 5), config, noise, torch.full((3,), step))
    for row in range(3):
        draws = [float(noise[row, step, 0]) for step in range(N + 1)]
        for more in retries:
            draws += [float(more(attempt, torch.tensor([row]))) for attempt in range(1, tries)]
        assert len(draws) == (N + 1) * tries and len(set(draws)) == len(draws), row
    together = retries[3](2, torch.arange(3))  # (3, 1): rows 0-2 retrying at once
    assert torch.equal(together[1:], retries[3](2, torch.tensor([1, 2])))


def test_a_prompt_that_exactly_fills_the_context_is_sampled_and_one_token_more_is_refused():
    model = tiny_model(seed=3, max_position_embeddings=16)
    prompt = [5, 9, 2, 77, 31, 8]  # 6 tokens + 10 new = the context of 16
    filled = minigrpo.generate(model, [prompt], max_new_tokens=10, temperature=0)
    naive, _ = naive_generate(model, [prompt], max_new_tokens=10, temperature=0)
    assert filled.tokens == naive and len(filled.tokens[0]) == 10
    with pytest.raises(
        ValueError,
        match=r"prompt 0 has 7 tokens; with max_new_tokens=10 .* exceeds the model's context of 16",
    ):
        minigrpo.generate(model, [prompt + [64]], max_new_tokens=10, temperature=0)


# --- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts, settings, message",
    [
        ([], {}, "non-empty list"),
        ([[1, 2], []], {}, "prompt 1 is empty"),
        ([[1] * 30], dict(max_new_tokens=32768), "exceeds the model's context of 32768"),
        ([[1, 500]], {}, "outside \\[0, 97\\)"),
        (["What is 2+2?"], {}, "prompt 0 must be a list of token ids"),
        ([[1]], dict(temperature=-0.1), "temperature must be >= 0"),
        ([[1]], dict(top_p=0.0), "top_p must be in \\(0, 1\\]"),
        ([[1]], dict(top_p=1.5), "top_p must be in \\(0, 1\\]"),
        ([[1]], dict(top_k=-1), "top_k must be"),
        ([[1]], dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        ([[1]], dict(num_samples=0), "num_samples must be a positive integer"),
        ([[1]], dict(max_batch_rows=0), "max_batch_rows must be a positive integer"),
        ([[1]], dict(max_batch_rows=-2), "max_batch_rows must be a positive integer"),
        ([[1]], dict(max_batch_rows=2.5), "max_batch_rows must be a positive integer"),
        ([[1]], dict(compile=None), 'compile must be "auto" .*, True .* or False'),
        ([[1]], dict(compile="yes"), 'compile must be "auto"'),
        ([[1]], dict(compile=1), 'compile must be "auto"'),
    ],
)
def test_bad_input_is_a_clear_error(model, prompts, settings, message):
    with pytest.raises(ValueError, match=message):
        minigrpo.generate(model, prompts, **{"max_new_tokens": 4, **settings})


def test_reports_timings_and_cache_size(model):
    samples = minigrpo.generate(model, PROMPTS, max_new_tokens=5, num_samples=2, seed=0)
    c = model.config
    per_slot = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4  # keys and values, fp32
    decode_cache = len(PROMPTS) * 2 * ((max(map(len, PROMPTS)) + 5) * per_slot + 8)
    prefill_cache = len(PROMPTS) * (max(map(len, PROMPTS)) * per_slot + 8)  # each prompt once
    assert samples.batch_rows == 8 and samples.kv_cache_bytes == decode_cache + prefill_cache
    assert samples.decode_steps == 4 and samples.num_tokens == 40
    assert samples.prefill_seconds > 0 and samples.decode_seconds > 0 and samples.tokens_per_second > 0
    assert not samples.compiled  # on CPU eager unless the caller asks for compile=True


# rows end at varied steps
FINISHING = dict(prompts=[[i + 1, 2 * i + 3, 5, i * 7 % 97] for i in range(12)], eos=[56, 0, 17, 82])


def test_dropping_finished_rows_changes_no_token(model, monkeypatch):
    """With many EOS ids rows end at different steps; compacting the batch must not change any row."""
    prompts, eos = FINISHING["prompts"], FINISHING["eos"]
    compactions = []
    original = minigrpo.KVCache.keep_rows
    monkeypatch.setattr(
        minigrpo.KVCache,
        "keep_rows",
        lambda self, rows, n, **kw: compactions.append(len(rows)) or original(self, rows, n, **kw),
    )
    settings = dict(max_new_tokens=24, temperature=0, eos_token_ids=eos, check_every=2)
    compacted = minigrpo.generate(model, prompts, compact=True, **settings)
    masked = minigrpo.generate(model, prompts, compact=False, **settings)
    naive, naive_logprobs = naive_generate(model, prompts, **settings)
    assert compactions, "no row was dropped: the test needs rows that finish early"
    assert compacted.tokens == masked.tokens == naive
    assert compacted.finish_reasons == masked.finish_reasons
    for ours, reference in zip(compacted.logprobs, naive_logprobs):
        assert torch.allclose(torch.tensor(ours), torch.tensor(reference), atol=1e-4)
    assert len(set(map(len, compacted.tokens))) > 2  # lengths really differ


# --- a row budget: finished rows refilled with waiting ones --------------------------------------
MIXED = [
    [5, 9, 2, 77, 31, 8, 64, 3, 3, 12, 40],
    [13, 4],
    [90, 1, 1, 3, 45],
    [7],
    [60, 61, 62, 63, 64, 65],
    [2, 2],
]


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_refill_under_a_row_budget_equals_the_unbounded_call(model, rows):
    settings = dict(max_new_tokens=16, temperature=0, num_samples=2, eos_token_ids=FINISHING["eos"])
    unbounded = minigrpo.generate(model, MIXED, **settings)
    bounded = minigrpo.generate(model, MIXED, max_batch_rows=rows, **settings)
    naive, _ = naive_generate(model, MIXED, **settings)
    assert bounded.tokens == unbounded.tokens == naive
    assert bounded.finish_reasons == unbounded.finish_reasons
    for a, b in zip(bounded.logprobs, unbounded.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert bounded.batch_rows == rows and bounded.kv_cache_bytes < unbounded.kv_cache_bytes
    # rows finish at different steps, so refills happen mid-way
    assert len(set(map(len, unbounded.tokens))) > 2


def test_each_row_keeps_its_seed_whatever_the_row_budget(model):
    """Sampled rows: a request's draws come from its own stream, so the budget changes no token."""
    settings = dict(
        max_new_tokens=16, temperature=1.0, top_p=0.9, num_samples=3, seed=5, eos_token_ids=FINISHING["eos"]
    )
    unbounded = minigrpo.generate(model, MIXED, **settings)
    for rows in (2, 7):
        bounded = minigrpo.generate(model, MIXED, max_batch_rows=rows, **settings)
        assert bounded.tokens == unbounded.tokens
    assert len({tuple(t) for t in unbounded.tokens[:3]}) > 1  # the G samples of a prompt still differ


def test_a_budget_per_prompt_cuts_each_prompts_samples_where_its_own_budget_ends(model):
    """max_new_tokens as a list: each prompt's samples stop at its own budget (no EOS here), and up to
    there they are the tokens of a call with one budget for all (a row's draws depend on its step alone)."""
    budgets = [3, 11, 1, 6, 9, 2]
    settings = dict(temperature=1.0, num_samples=2, seed=4)
    each = minigrpo.generate(model, MIXED, max_new_tokens=budgets, max_batch_rows=5, **settings)
    one = minigrpo.generate(model, MIXED, max_new_tokens=max(budgets), **settings)
    assert [len(t) for t in each.tokens] == [n for n in budgets for _ in range(2)]
    assert each.tokens == [t[: len(short)] for t, short in zip(one.tokens, each.tokens)]
    assert each.finish_reasons == ["length"] * len(each.tokens)
    for short, long in zip(each.logprobs, one.logprobs):
        assert torch.allclose(torch.tensor(short), torch.tensor(long[: len(short)]), atol=1e-5)


@pytest.mark.parametrize(
    "budgets, message",
    [([4, 4], "max_new_tokens has 2 budgets for 6 prompts"), ([4, 0, 4, 4, 4, 4], "max_new_tokens must be")],
)
def test_a_wrong_list_of_budgets_is_a_clear_error(model, budgets, message):
    with pytest.raises(ValueError, match=message):
        minigrpo.generate(model, MIXED, max_new_tokens=budgets)


def test_top_p_by_rejection_under_a_top_k_as_large_as_the_vocabulary_has_its_further_draws():
    """top_k >= the vocabulary filters nothing and leaves top-p to rejection on CPU: a call whose rows
    draw again (top_p 0.5 on a flat random model) must find those draws among the call's own."""
    model = tiny_model(seed=3)
    vocab = model.config.vocab_size
    settings = dict(max_new_tokens=12, num_samples=4, seed=0, top_p=0.5)
    wide = minigrpo.generate(model, [[1, 2, 3], [4, 5]], top_k=vocab + 5, **settings)
    assert wide.tokens == minigrpo.generate(model, [[1, 2, 3], [4, 5]], **settings).tokens
