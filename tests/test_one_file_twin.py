"""examples/grpo_in_one_file.py, the loop in one plain file, held equal to the library it is the twin of.

On the embedded checkpoint in fp64: the twin's Qwen3 forward gives minigrpo.Qwen3's logits (whole, and
token by token through its KV cache), and one twin step on fixed completions leaves every weight where
one `Trainer.train_step` on the same completions leaves it (fed through the `trainer._sample` seam, as
in test_train_step.py; the twin's own seam is its `sample_group`). Stages 2-4 run for real on both
sides: the verifier, the group advantages, the old and reference log-probs, the loss, the clip and
AdamW. The stages fixed completions skip are held equal too: greedy evaluation (minigrpo.evaluate),
the learning rate of every step (TrainConfig.learning_rate_at), the order problems are asked in
(PromptStream), the top-p nucleus and the token drawn at a given uniform number (next_token.py), and
three whole steps, sampling included, token for token. When either side changes what a stage computes,
these tests say so.
"""

import dataclasses
import importlib.util
import json
import os

import pytest
import torch
from helpers import tiny_train_config
from tokenizers import Tokenizer

import minigrpo
import minigrpo.rollout.next_token as next_token
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, Trainer
from minigrpo.rollout import Samples
from minigrpo.run import evaluate
from minigrpo.tasks import PromptStream, generate_problems, template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWIN_PATH = os.path.join(ROOT, "examples", "grpo_in_one_file.py")
TRAIN_MATH = os.path.join(ROOT, "examples", "train_math.py")


def load_script(path: str, name: str):
    """A script of examples/ as a module: its functions, not its __main__ block."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


twin = load_script(TWIN_PATH, "grpo_in_one_file")
G = 4
EOS = 0  # the embedded tokenizer's <|endoftext|>


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(os.path.join(twin.MODEL, "tokenizer.json"))


def test_the_forward_gives_the_library_logits():
    """Logits of random token ids, the whole sequence at once and through the KV cache (a prompt of 9
    tokens, then one token at a time), within 1e-10 of minigrpo.Qwen3's."""
    weights, config = twin.load_model(twin.MODEL, torch.float64)
    model, _ = minigrpo.load_pretrained(twin.MODEL, dtype=torch.float64)
    draws = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (3, 40), generator=draws)  # (B, T)
    with torch.no_grad():
        expected = model(ids)  # (B, T, V)
        whole = twin.forward(weights, config, ids)
        cache = [None] * config["num_hidden_layers"]
        pieces = [twin.forward(weights, config, ids[:, :9], cache)]
        pieces += [twin.forward(weights, config, ids[:, t : t + 1], cache) for t in range(9, ids.shape[1])]
    torch.testing.assert_close(whole, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, rtol=0, atol=1e-10)
    assert float(expected.std()) > 1.0  # logits of a trained model, not near-zero noise


# -- one step on fixed completions --------------------------------------------------------------------------
PROBLEMS = generate_problems("arithmetic", 2, "train", seed=0)  # 26+88*4 = 378, 78+31*5 = 233


def fixed_completions(tokenizer, problem) -> list[list[int]]:
    """G completions of `problem` in the embedded model's format: right, wrong, short and wrong, and right
    but cut at the length limit (no EOS); the second prompt's group in another order and mix."""
    wrong = problem.solution.replace(problem.answer, str(int(problem.answer) + 10))
    texts = [problem.solution, wrong, "9;####9", problem.solution]
    if problem is PROBLEMS[1]:
        texts = [wrong, problem.solution, wrong, "1+1=2;####2"]
    ids = [tokenizer.encode(text, add_special_tokens=False).ids + [EOS] for text in texts]
    if problem is PROBLEMS[0]:
        ids[3] = ids[3][:-1]  # truncated: no EOS, the verifier still reads its answer
    return ids


class FixedSampler:
    """Stands in for Trainer._sample (stage 1): fixed_completions of each prompt asked for, in order."""

    def __init__(self, tokenizer):
        self.tokenizer, self.asked = tokenizer, []

    def __call__(self, indices, round_):
        tokens = []
        for i in indices:
            self.asked.append(i)
            tokens += fixed_completions(self.tokenizer, PROBLEMS[i])
        reasons = ["stop" if t[-1] == EOS else "length" for t in tokens]
        return Samples(
            tokens=tokens,
            logprobs=[[0.0] * len(t) for t in tokens],
            finish_reasons=reasons,
            prompt_indices=[p for p in range(len(indices)) for _ in range(G)],
        )


# Settings under which every part of a step shows in the weights: AdamW's eps about the size of the
# clipped gradient's entries (with the default 1e-8 the first step is lr * sign(gradient), blind to the
# gradient's scale), betas and weight decay off their defaults, a clip that bites, a temperature, and an
# epsilon small enough that mu = 2's second pass clips. The two sides agree to 2e-16; a slip on the twin's
# side moves some weight by 1e-5 or more (measured: no gradient clip 8e-5, no temperature 4e-5, grpo's
# aggregation for dapo's 1.3e-4, beta doubled 1e-4, epsilon 0.2 at mu = 2 2e-5).
SHARED = dict(num_generations=G, max_completion_length=32, temperature=0.7, epsilon=0.002)
OPTIMIZER = dict(
    learning_rate=1e-4, warmup_steps=3, max_steps=10, adam_epsilon=1e-4, weight_decay=0.1, max_grad_norm=0.05
)
CASES = {  # loss_type, beta, num_iterations
    "grpo": ("grpo", 0.0, 1),
    "dapo": ("dapo", 0.0, 1),
    "grpo-kl": ("grpo", 0.5, 1),
    "grpo-mu2": ("grpo", 0.0, 2),
    "dapo-kl-mu2": ("dapo", 0.5, 2),
}


def reference_weights() -> dict:
    """The KL's reference: the embedded model with every weight moved a little, as the starting policy is
    from the policy of a later step (were the two equal, the k3 term would have no gradient in pass 1)."""
    weights, _ = twin.load_model(twin.MODEL, torch.float64)
    noise = torch.Generator().manual_seed(1)
    return {
        name: w.detach() + 0.01 * torch.randn(w.shape, generator=noise, dtype=w.dtype)
        for name, w in weights.items()
    }


def library_step(tokenizer, tmp_path, loss_type, beta, mu, step):
    """The weights after Trainer.train_step number `step` on the fixed completions (fp64), under HF names."""
    model, library_tokenizer = minigrpo.load_pretrained(twin.MODEL, dtype=torch.float64)
    reference = None
    if beta > 0:
        reference, _ = minigrpo.load_pretrained(twin.MODEL, dtype=torch.float64)
        reference.load_state_dict({name.removeprefix("model."): w for name, w in reference_weights().items()})
    rows = [{"prompt": p.question + "\n", "answer": p.answer} for p in PROBLEMS]
    grpo = GRPOConfig(**SHARED, loss_type=loss_type, beta=beta, num_iterations=mu)
    optimizer = dict(OPTIMIZER, adam_betas=(0.8, 0.95))
    batch = dict(batch_size=len(PROBLEMS) * G, micro_batch_size=G)
    config = tiny_train_config(tmp_path / "run", **batch, lr_schedule="cosine", **optimizer)
    trainer = Trainer(
        model, library_tokenizer, Task(rows, [RewardSpec("accuracy")]), grpo, config, reference=reference
    )
    sampler = FixedSampler(tokenizer)
    trainer._sample = sampler  # the seam: stage 1 only
    trainer.step = step - 1  # as if resumed: the step's learning rate is on the cosine, past the warm-up
    stats, _ = trainer.train_step()
    weights = minigrpo.model.weights.to_hf_state_dict(model)
    return {name: w.detach() for name, w in weights.items()}, sampler.asked, stats


def twin_settings(loss_type, beta, mu, **settings):
    """The twin's Settings for a case: SHARED, AdamW's betas 0.8 and 0.95 (the library side's adam_betas),
    the case's loss, KL weight and num_iterations, and `settings`."""
    objective = dict(loss_type=loss_type, beta=beta, num_iterations=mu)
    return twin.Settings(**SHARED, adam_beta1=0.8, adam_beta2=0.95, **objective, **settings)


def twin_step(tokenizer, monkeypatch, loss_type, beta, mu, step, asked):
    """The weights after the twin's grpo_step number `step` on the same completions, the prompts in the
    library's order."""
    s = twin_settings(loss_type, beta, mu, **OPTIMIZER, prompts_per_step=len(asked))
    fixed = {tuple(twin.encode(tokenizer, p.question)): fixed_completions(tokenizer, p) for p in PROBLEMS}
    monkeypatch.setattr(twin, "sample_group", lambda weights, config, prompt, *_: fixed[tuple(prompt)])
    monkeypatch.setattr(twin, "completion_logprobs", stored_in_fp32(twin.completion_logprobs))
    weights, config = twin.load_model(twin.MODEL, torch.float64)
    reference = reference_weights() if beta > 0 else None
    optimizer = twin.make_optimizer(weights, s)
    batch = [PROBLEMS[i] for i in asked]
    prompts = [twin.encode(tokenizer, p.question) for p in batch]
    golds = [p.answer for p in batch]
    stats = twin.grpo_step(weights, config, reference, optimizer, tokenizer, prompts, golds, step, s)
    return {name: w.detach() for name, w in weights.items()}, stats


def stored_in_fp32(completion_logprobs):
    """The twin's completion_logprobs, but the old and reference log-probs (those taken without grad) rounded
    to fp32 as the library stores them (rollout.split_logprobs). Without it, they differ by ~1e-7 of a
    log-prob, which moves the weights of a mu = 2 or KL step by up to 5e-10 at these settings; with it,
    both sides agree to 2e-16."""

    def rounded(*args):
        logprobs, mask = completion_logprobs(*args)
        if not torch.is_grad_enabled():
            logprobs = logprobs.float().double()
        return logprobs, mask

    return rounded


@pytest.mark.parametrize("case", CASES)
def test_one_step_leaves_the_weights_of_a_library_step(tokenizer, tmp_path, monkeypatch, case):
    """Every weight within 1e-10 of the library's after one step (step 5 of 10: warm-up 3, then cosine)."""
    loss_type, beta, mu = CASES[case]
    before, _ = twin.load_model(twin.MODEL, torch.float64)
    expected, asked, library_stats = library_step(tokenizer, tmp_path, loss_type, beta, mu, step=5)
    got, stats = twin_step(tokenizer, monkeypatch, loss_type, beta, mu, 5, asked)
    assert sorted(got) == sorted(expected)
    moved = 0.0
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-10, msg=name)
        moved = max(moved, float((got[name] - before[name].detach()).abs().max()))
    assert moved > 1e-5  # the step is large against the tolerance
    assert stats["lr"] == pytest.approx(library_stats["lr"], rel=1e-12)
    assert stats["reward"] == pytest.approx(library_stats["reward/mean"]) == 3 / 8
    assert library_stats["grad_norm"] > 2 * OPTIMIZER["max_grad_norm"]  # the clip bites
    if mu > 1:
        assert library_stats["clip/region_frac"] > 0  # and so does the ratio's


def test_the_settings_are_the_default_jobs():
    """The twin's defaults are examples/train_math.py's (its DEFAULTS over GRPOConfig's and TrainConfig's),
    but for max_steps and output_dir; the 32 prompts per step are its batch_size of 256 / G."""
    train_math = load_script(TRAIN_MATH, "train_math")
    library = {**dataclasses.asdict(GRPOConfig()), **dataclasses.asdict(TrainConfig()), **train_math.DEFAULTS}
    library["adam_beta1"], library["adam_beta2"] = library.pop("adam_betas")
    mine = dataclasses.asdict(twin.Settings())
    own = {"output_dir", "max_steps", "prompts_per_step", "train_count", "eval_count"}
    assert {key: library[key] for key in mine.keys() - own} == {key: mine[key] for key in mine.keys() - own}
    assert mine["prompts_per_step"] * mine["num_generations"] == library["batch_size"]
    assert GRPOConfig().epsilon_high is None and GRPOConfig().scale_rewards == "group"  # what the twin does


def test_main_trains_and_saves_a_policy_the_library_loads(tmp_path):
    """A 1-step run of 2 prompts writes summary.json and final/, which minigrpo.load_pretrained reads back
    as the twin's trained weights."""
    out = tmp_path / "run"
    summary = twin.main(
        ["--output_dir", str(out), "--max_steps", "1", "--prompts_per_step", "2", "--eval_count", "2"]
    )
    written = json.loads((out / "summary.json").read_text())
    assert written["steps"] == 1 and set(written) >= {"initial_accuracy", "final_accuracy", "seconds"}
    assert written["final_accuracy"] == summary["final_accuracy"]
    model, tokenizer = minigrpo.load_pretrained(str(out / "final"))
    saved = minigrpo.model.weights.to_hf_state_dict(model)
    start, _ = twin.load_model(twin.MODEL, torch.float32)
    assert any(not torch.equal(saved[name], start[name].detach()) for name in saved)  # trained, not a copy
    assert tokenizer.eos_token_ids == (EOS,)
    assert sorted(os.listdir(tmp_path)) == ["run"] and sorted(os.listdir(out)) == ["final", "summary.json"]


def test_bad_input_is_one_line(tmp_path, capsys):
    """A --output_dir that is a file, or a setting out of range, stops before any work with one line."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv, says in (
        (["--output_dir", str(blocker)], "cannot be written"),
        (["--loss_type", "bnpo"], "--loss_type must be grpo or dapo"),
        (["--beta", "-1"], "--beta must be"),
    ):
        with pytest.raises(SystemExit) as stopped:
            twin.main(argv)
        message = str(stopped.value.code)
        assert message.startswith("grpo_in_one_file.py: ") and says in message and "\n" not in message


# -- the stages the fixed completions skip ------------------------------------------------------------------
def test_greedy_evaluation_is_the_librarys(tokenizer, monkeypatch):
    """On 12 held-out problems in fp64, the twin's greedy_accuracy scores the completions
    minigrpo.run.evaluate.evaluate gives (temperature 0, the "tiny" template: question and newline), text for
    text, against the same gold answers, with the same verdicts and accuracy."""
    problems = generate_problems("arithmetic", 12, "test", seed=0)
    s = twin.Settings()
    scored = []  # what the twin hands its verifier and gets back: (completions, golds, rewards)
    math_rewards = twin.math_rewards

    def verifier(texts, golds):
        rewards = math_rewards(texts, golds)
        scored.append((texts, golds, rewards))
        return rewards

    monkeypatch.setattr(twin, "math_rewards", verifier)
    weights, config = twin.load_model(twin.MODEL, torch.float64)
    accuracy = twin.greedy_accuracy(weights, config, tokenizer, problems, s)
    model, library_tokenizer = minigrpo.load_pretrained(twin.MODEL, dtype=torch.float64)
    expected = evaluate(
        model, library_tokenizer, problems, template("tiny"), max_new_tokens=s.max_completion_length
    )
    [(texts, golds, rewards)] = scored
    assert texts == [result["completions"][0] for result in expected.results]
    assert golds == [result["answer"] for result in expected.results]
    assert [reward > 0.5 for reward in rewards] == [result["correct"][0] for result in expected.results]
    assert accuracy == expected.pass_at_1
    assert 0 < accuracy < 1  # right and wrong answers both: a verdict flipped would show


LEARNING_RATES = {  # warmup_steps, max_steps
    "no warm-up": (0, 6),
    "the tests' steps": (3, 10),
    "the default job's": (10, 350),
    "warm-up to the end": (4, 4),
}


@pytest.mark.parametrize("schedule", LEARNING_RATES)
def test_the_learning_rate_of_every_step_is_the_librarys(schedule):
    """Steps 1 to max_steps: the twin's learning_rate_at (linear warm-up, then cosine to 0) equals
    TrainConfig.learning_rate_at with lr_schedule="cosine", the twin's only schedule, exactly."""
    warmup, max_steps = LEARNING_RATES[schedule]
    s = twin.Settings(learning_rate=3e-4, warmup_steps=warmup, max_steps=max_steps)
    library = TrainConfig(learning_rate=3e-4, warmup_steps=warmup, max_steps=max_steps, lr_schedule="cosine")
    for step in range(1, max_steps + 1):
        assert twin.learning_rate_at(step, s) == library.learning_rate_at(step), f"step {step}"


def test_the_problems_come_in_the_librarys_order():
    """Which problems each step draws: 3 a step from 7 problems (an epoch ends mid-step), 8 steps (over
    three epochs), for two seeds: the twin's problem_order gives PromptStream's indices."""
    for seed in (0, 5):
        order = twin.problem_order(7, seed)
        stream = PromptStream(7, seed)
        for step in range(1, 9):
            assert [next(order) for _ in range(3)] == stream.next(3), f"seed {seed}, step {step}"


# Logits (V,) with ties among the kept tokens, among the dropped ones and at the nucleus's edge, a peak, and
# top_p from near 0 to near 1.
NUCLEUS_LOGITS = {
    "spread": torch.randn(12, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 1.5,
    "ties": torch.tensor([2.0, 2.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0, -1.0, -3.0], dtype=torch.float64),
    "peak": torch.tensor([6.0, 0.0, 0.5, 0.0, 1.0, -2.0, 0.0, 3.0], dtype=torch.float64),
}
TOP_PS = (1e-6, 0.05, 0.3, 0.55, 0.6, 0.8, 0.95, 0.999)
GRID = torch.arange(1, 2**14 + 1, dtype=torch.float64) / 2**14  # (U,): uniform numbers in (0, 1], 2^-14 apart


def twin_kept(logits: torch.Tensor, top_p: float) -> set[int]:
    """The tokens the twin's next_tokens draws from softmax(logits (V,)) at some uniform number of GRID: its
    nucleus, where each token holds more than 2^-14 of it (as here)."""
    return set(twin.next_tokens(logits.expand(len(GRID), -1), 1.0, top_p, GRID).tolist())


def library_kept_by_sorting(probs: torch.Tensor, top_p: float) -> set[int]:
    """The tokens next_token.nucleus_by_sorting (a GPU's top-p, and CPU's fallback) draws from probs (V,)
    at some uniform number of GRID: its nucleus."""
    drawn = next_token.nucleus_by_sorting(probs.expand(len(GRID), -1), top_p, GRID[:, None])  # (U,)
    return set(drawn.tolist())


def library_kept_by_rejection(probs: torch.Tensor, top_p: float) -> set[int]:
    """The tokens next_token.nucleus_by_rejection (CPU's top-p) accepts: each token drawn once, at a
    uniform number in the middle of its step of the cumulative distribution."""
    cdf = probs.cumsum(-1)  # (V,)
    kept = set()
    for token in range(len(probs)):
        u = ((cdf[token] - probs[token] / 2) / cdf[-1]).reshape(1, 1)
        drawn = next_token.nucleus_by_rejection(probs[None], top_p, u, more=None, tries=1)
        if drawn is not None:
            assert drawn.tolist() == [token]  # the draw was the token asked about
            kept.add(token)
    return kept


@pytest.mark.parametrize("case", NUCLEUS_LOGITS)
def test_top_p_keeps_the_librarys_tokens(case, monkeypatch):
    """For each top_p, the twin's nucleus holds the tokens the library's sorting path keeps; its CPU path
    (by rejection) keeps those too, and besides them only the tokens tied with the least likely one (the
    library's two paths part there; the twin is the sorting one). And for every uniform number of the
    grid, at temperature 0.7 and top_p 1 too, the twin's next_tokens draws next_token.sample's token
    (its sorting path: rejection draws others from the same distribution)."""
    logits = NUCLEUS_LOGITS[case]
    probs = torch.softmax(logits, dim=-1)
    sizes = []
    for top_p in TOP_PS:
        kept = twin_kept(logits, top_p)
        assert kept == library_kept_by_sorting(probs, top_p), f"top_p {top_p}"
        sizes.append(len(kept))
        edge = {token for token in range(len(probs)) if probs[token] == probs[list(kept)].min()}
        assert library_kept_by_rejection(probs, top_p) == kept | edge, f"top_p {top_p}"
    assert min(sizes) == 1 and len(set(sizes)) >= 3, sizes  # the top_ps cut the nucleus in several places
    monkeypatch.setattr(next_token, "nucleus_by_rejection", lambda *args, **kwargs: None)  # sort instead
    rows = logits.expand(len(GRID), -1)  # (U, V)
    zeros = torch.zeros(len(GRID), dtype=torch.long)  # (U,): each row's step
    for top_p in TOP_PS + (1.0,):
        sampling = GRPOConfig(temperature=0.7, top_p=top_p).sampling_config()
        expected, _ = next_token.sample(rows, sampling, GRID[:, None, None], zeros)  # (U,)
        got = twin.next_tokens(rows, 0.7, top_p, GRID)
        assert torch.equal(got, expected), f"top_p {top_p}"


# -- three whole steps, sampling included -------------------------------------------------------------------
THREE = generate_problems("arithmetic", 3, "train", seed=1)  # 2 a step: the second epoch starts in step 2
STEPS = dict(OPTIMIZER, warmup_steps=1, max_steps=3)
RUNS = {  # loss_type, beta, num_iterations, top_p
    "grpo": ("grpo", 0.0, 1, 1.0),
    "dapo-kl-mu2-top_p": ("dapo", 0.5, 2, 0.9),
}


def library_steps(tmp_path, loss_type, beta, mu, top_p) -> list[tuple]:
    """Trainer.train_step 1, 2 and 3 on THREE (fp64, seed 7), each as (the indices of the prompts it asked,
    its sampled completions, the weights after it under HF names, its stats)."""
    model, library_tokenizer = minigrpo.load_pretrained(twin.MODEL, dtype=torch.float64)
    rows = [{"prompt": p.question + "\n", "answer": p.answer} for p in THREE]
    grpo = GRPOConfig(**SHARED, loss_type=loss_type, beta=beta, num_iterations=mu, top_p=top_p)
    batch = dict(batch_size=2 * G, micro_batch_size=G)
    config = tiny_train_config(
        tmp_path / "run", **batch, lr_schedule="cosine", seed=7, adam_betas=(0.8, 0.95), **STEPS
    )
    trainer = Trainer(model, library_tokenizer, Task(rows, [RewardSpec("accuracy")]), grpo, config)
    sample = trainer._sample
    sampled = []

    def recording(indices, round_):
        samples = sample(indices, round_)
        sampled.append((list(indices), samples.tokens))
        return samples

    trainer._sample = recording
    steps = []
    for _ in range(3):
        stats, _ = trainer.train_step()
        weights = {
            name: w.detach().clone() for name, w in minigrpo.model.weights.to_hf_state_dict(model).items()
        }
        steps.append((*sampled[-1], weights, stats))
    return steps


def twin_steps(tokenizer, monkeypatch, loss_type, beta, mu, top_p) -> list[tuple]:
    """The twin's train() for 3 steps on THREE (fp64, seed 7), each step as (its prompts' token ids, its
    sampled completions, the weights after it, its stats)."""
    s = twin_settings(loss_type, beta, mu, **STEPS, top_p=top_p, prompts_per_step=2, seed=7)
    sample_group = twin.sample_group
    grpo_step = twin.grpo_step
    sampled = []
    steps = []

    def recording_sample(*args):
        sampled.extend(sample_group(*args))
        return sampled[-G:]

    def recording_step(weights, config, reference, optimizer, tokenizer, prompts, golds, step, s):
        sampled.clear()
        stats = grpo_step(weights, config, reference, optimizer, tokenizer, prompts, golds, step, s)
        steps.append(
            (prompts, list(sampled), {name: w.detach().clone() for name, w in weights.items()}, stats)
        )
        return stats

    monkeypatch.setattr(twin, "sample_group", recording_sample)
    monkeypatch.setattr(twin, "grpo_step", recording_step)
    monkeypatch.setattr(twin, "completion_logprobs", stored_in_fp32(twin.completion_logprobs))
    weights, config = twin.load_model(twin.MODEL, torch.float64)
    twin.train(weights, config, tokenizer, THREE, s)
    return steps


@pytest.mark.parametrize("run", RUNS)
def test_three_steps_sample_and_train_as_the_library(tokenizer, tmp_path, monkeypatch, run):
    """Three whole steps (warm-up 1, then cosine), sampling included: after each, the twin asked the library's
    prompts, sampled the library's completions token for token (the same counter-based random numbers),
    got its rewards and learning rate, and holds every weight within 1e-10 of the library's. At top_p < 1
    the library draws by sorting, as on a GPU: on CPU it draws by rejection, other tokens from the same
    nucleus (test_top_p_keeps_the_librarys_tokens)."""
    loss_type, beta, mu, top_p = RUNS[run]
    monkeypatch.setattr(next_token, "nucleus_by_rejection", lambda *args, **kwargs: None)  # sort instead
    expected = library_steps(tmp_path, loss_type, beta, mu, top_p)
    got = twin_steps(tokenizer, monkeypatch, loss_type, beta, mu, top_p)
    before, _ = twin.load_model(twin.MODEL, torch.float64)
    assert sorted(got[0][2]) == sorted(expected[0][2])  # the same weights, by their Hugging Face names
    for step in range(1, 4):
        indices, tokens, weights, stats = expected[step - 1]
        prompts, completions, twin_weights, twin_stats = got[step - 1]
        assert prompts == [twin.encode(tokenizer, THREE[i].question) for i in indices], f"step {step}"
        assert completions == tokens, f"step {step}"
        for name in weights:
            gap = float((twin_weights[name] - weights[name]).abs().max())
            assert gap <= 1e-10, f"step {step}: {name} is {gap:.2g} off the library's"
        assert twin_stats["lr"] == stats["lr"] and twin_stats["reward"] == pytest.approx(stats["reward/mean"])
        moved = max(float((twin_weights[name] - before[name].detach()).abs().max()) for name in weights)
        assert moved > 1e-5, f"step {step}"  # each step is large against the tolerance
        before = twin_weights
        assert len({tuple(completion) for completion in tokens}) > len(indices)  # sampled, not one per prompt
