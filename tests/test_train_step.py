"""One whole trainer step against the same step assembled by hand, and the learning-rate schedule.

The other trainer tests compare the trainer with itself; here `Trainer.train_step` (stages 1-4 on
fixed completions) must land on the weights of a step written out from the formulas: each
rollout's log-probs from a plain `model(prompt + completion)` forward of that row alone, at the
temperature (so the trainer's padding, completion_start, shared prompts and micro-batches must be
invisible), the group-relative advantages, the clipped GRPO objective with its aggregation and KL,
gradient clipping and torch's AdamW at the scheduled learning rate. A flipped sign, a missing
temperature, a shifted completion, a skipped clip or weight decay each fail it.
"""

import copy
import dataclasses
import math
import random
import statistics

import pytest
import torch
from helpers import ROWS, tiny_model, tiny_tokenizer, tiny_train_config

from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, Trainer
from minigrpo.rollout import Samples
from minigrpo.verifier import REWARD_FUNCTIONS, register_reward

G, MAX_LEN = 4, 8
# Per prompt of the step (in sampling order): each completion's length and reward. A length of
# MAX_LEN is cut there ("length", no EOS); shorter ones end in EOS. The third group is flat. For
# these rewards the trainer's fp32 advantages are the exact formula's rounded to fp32 (asserted):
# for others they may differ in the last bit, which moves weights far past the tolerance below.
LENGTHS = [[3, 8, 5, 1], [8, 2, 6, 4], [5, 7, 8, 3]]
REWARDS = [[1.0, 0.0, 0.75, 0.0], [0.25, 1.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]
EPS = 1e-4  # added to the std of the rewards (advantages.py, as in TRL)


def _leading_digit(completions, **_):
    """A completion's first character, a digit d, is worth d / 4; no digit (the empty completion) 0."""
    return [int(c[0]) / 4 if c[:1].isdigit() else 0.0 for c in completions]


if "test_leading_digit" not in REWARD_FUNCTIONS:
    register_reward("test_leading_digit")(_leading_digit)


class FixedSampler:
    """Stands in for Trainer._sample (stage 1): completions of LENGTHS whose first token is the digit
    of their reward, then random tokens, no EOS inside; the same whatever the model. It records what
    it handed out, in order: (prompt ids, completion ids, reward, truncated)."""

    def __init__(self, trainer, observations: bool = False):
        self.trainer, self.rollouts = trainer, []
        # with observations, tokens 1 and 2 of a completion of 4 tokens or more stand for a tool's
        # observation (Samples.generated False there): context for the forward pass, not in the loss
        self.observations, self.generated = observations, []

    def __call__(self, indices, round_):
        tokenizer = self.trainer.tokenizer
        tokens, reasons = [], []
        for p, i in enumerate(indices):
            prompt = tokenizer.encode(ROWS[i]["prompt"])
            for j in range(G):
                rng = random.Random(f"{i}-{j}-{self.trainer.step}")
                length, reward, truncated = LENGTHS[p][j], REWARDS[p][j], LENGTHS[p][j] == MAX_LEN
                digit = tokenizer.token_to_id(str(int(reward * 4)))
                # 0-4: special tokens
                ids = [digit] + [rng.randrange(5, tokenizer.vocab_size) for _ in range(length - 1)]
                if not truncated:
                    # a completion of length 1 is EOS alone: empty, worth 0
                    ids[-1] = tokenizer.eos_token_ids[0]
                assert _leading_digit([tokenizer.decode_completion(ids)]) == [reward]
                tokens.append(ids)
                reasons.append("length" if truncated else "stop")
                self.rollouts.append((prompt, ids, reward, truncated))
                observed = {1, 2} if self.observations and length >= 4 else set()
                self.generated.append([t not in observed for t in range(length)])
        return Samples(
            tokens=tokens,
            logprobs=[[0.0] * len(t) for t in tokens],
            finish_reasons=reasons,
            prompt_indices=[p for p in range(len(indices)) for _ in range(G)],
            generated=self.generated[-len(tokens) :],
        )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(str(tmp_path_factory.mktemp("tokenizer")))


def tiny_policy_model(tokenizer) -> torch.nn.Module:
    return tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)


def make_trainer(tokenizer, tmp_path, grpo: GRPOConfig, observations: bool = False, model=None, **train):
    """A trainer of `model` (by default tiny_policy_model in fp64) whose stage 1 is a FixedSampler."""
    model = model if model is not None else tiny_policy_model(tokenizer).double()
    # the learning rate these tests were written with: TrainConfig's default, not the builder's
    settings = {"max_steps": 10, "batch_size": len(LENGTHS) * G, "micro_batch_size": G, "learning_rate": 1e-6}
    config = tiny_train_config(tmp_path / "run", **{**settings, **train})
    trainer = Trainer(model, tokenizer, Task(ROWS, [RewardSpec("test_leading_digit")]), grpo, config)
    sampler = FixedSampler(trainer, observations)
    trainer._sample = sampler  # the seam: stage 1 only; stages 2-4 run as in training
    return trainer, sampler


# -- the step by hand -------------------------------------------------------------------------------
def scheduled_lr(config: TrainConfig, step: int) -> float:
    """The learning rate of GRPO step `step` (1, 2, ...): warm-up from 0 in warmup_steps + 1 equal
    rises, then constant, or a cosine from the peak at step warmup_steps + 1 to 0 at max_steps + 1."""
    if step <= config.warmup_steps:
        return config.learning_rate * step / (config.warmup_steps + 1)
    if config.lr_schedule == "constant":
        return config.learning_rate
    progress = (step - 1 - config.warmup_steps) / (config.max_steps - config.warmup_steps)
    return config.learning_rate * (1 + math.cos(math.pi * progress)) / 2


def advantages_by_hand(rewards, scale: str) -> list[float]:
    """A_i = (r_i - mean of its group) / (std + EPS) in plain Python: the unbiased std (n - 1) of the
    group, or of every reward of the step for "batch"; exactly 0 for a group whose rewards are all equal."""
    groups = [rewards[g : g + G] for g in range(0, len(rewards), G)]
    advantages = []
    for group in groups:
        mean, std = statistics.fmean(group), statistics.stdev(group if scale == "group" else rewards)
        flat = len(set(group)) == 1
        advantages += [0.0 if flat else (r - mean) / (std + EPS) for r in group]
    return advantages


def logprobs_by_hand(model, prompt, completion, temperature):
    """(Tc,): log softmax(logits / temperature) of each completion token, the row run alone (no padding)."""
    ids = torch.tensor([prompt + completion])  # (1, Lp + Tc)
    logits = model(ids)[0, len(prompt) - 1 : -1] / temperature  # (Tc, V): position t predicts token t + 1
    # (Tc,): log p of each completion token
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def loss_by_hand(logprobs, old, reference, advantages, masks, grpo: GRPOConfig):
    """The GRPO objective over every rollout of the step, per loss.py's docstring."""
    high = grpo.epsilon if grpo.epsilon_high is None else grpo.epsilon_high
    per_rollout, tokens = [], sum(float(m.sum()) for m in masks)
    for logp, logp_old, ref, advantage, mask in zip(logprobs, old, reference, advantages, masks):
        ratio = torch.exp(logp - logp_old)  # (Tc,)
        surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - grpo.epsilon, 1 + high) * advantage)
        per_token = -surrogate + grpo.beta * (torch.exp(ref - logp) - (ref - logp) - 1)  # (Tc,)
        per_rollout.append(
            (per_token * mask).sum() / (mask.sum().clamp(min=1) if grpo.loss_type == "grpo" else 1)
        )
    total = torch.stack(per_rollout).sum()
    if grpo.loss_type == "grpo":  # mean over each sequence's tokens, then over sequences
        return total / len(masks)
    if grpo.loss_type == "dr_grpo":  # over sequences x max_completion_length
        return total / (len(masks) * grpo.max_completion_length)
    assert grpo.loss_type == "dapo"  # over the step's tokens
    return total / tokens


def step_by_hand(
    model, rollouts, grpo: GRPOConfig, config: TrainConfig, lr: float, advantages=None, generated=None
) -> dict:
    """num_iterations AdamW steps of `model` on `rollouts`; the gradient norms, losses and advantages
    (stored in fp32, as a rollout batch holds them). `advantages`: one tensor of per-token advantages
    per rollout (process supervision) instead of the group-relative ones of the rewards. `generated`:
    per rollout, which tokens the policy wrote; the others (a tool's observation) have no loss."""
    prompts, completions, rewards, truncated = zip(*rollouts)
    if advantages is None:
        advantages = torch.tensor(
            advantages_by_hand(list(rewards), grpo.scale_rewards), dtype=torch.float32
        ).tolist()
    masks = [
        torch.full((len(c),), 0.0 if cut and grpo.mask_truncated_completions else 1.0, dtype=torch.float64)
        for c, cut in zip(completions, truncated)
    ]
    if generated is not None:
        masks = [mask * torch.tensor(mine, dtype=torch.float64) for mask, mine in zip(masks, generated)]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=lr,
        betas=config.adam_betas,
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
    )
    with torch.no_grad():  # the policy before the step: old (mu > 1) and reference log-probs, kept in fp32
        before = [
            logprobs_by_hand(model, p, c, grpo.temperature).float().double()
            for p, c in zip(prompts, completions)
        ]
    out = {"grad_norm": [], "loss": [], "advantages": advantages}
    for _ in range(grpo.num_iterations):
        optimizer.zero_grad()
        logprobs = [logprobs_by_hand(model, p, c, grpo.temperature) for p, c in zip(prompts, completions)]
        old = before if grpo.num_iterations > 1 else [lp.detach() for lp in logprobs]
        loss = loss_by_hand(logprobs, old, before, advantages, masks, grpo)
        loss.backward()
        out["grad_norm"].append(
            float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        )
        out["loss"].append(float(loss.detach()))
        optimizer.step()
    return out


# -- the tests --------------------------------------------------------------------------------------
CASES = {  # (the objective, the update's layout)
    "grpo-group-mu1": (GRPOConfig(loss_type="grpo", scale_rewards="group"), {}),
    "grpo-batch-mu2-kl": (
        GRPOConfig(loss_type="grpo", scale_rewards="batch", num_iterations=2, beta=0.5),
        {},
    ),
    "dapo-batch-mu2-masked": (
        GRPOConfig(
            loss_type="dapo",
            scale_rewards="batch",
            num_iterations=2,
            epsilon_high=0.28,
            mask_truncated_completions=True,
        ),
        {},
    ),
    # each row its own prompt, ragged
    "dr_grpo-group-mu2-padded": (
        GRPOConfig(loss_type="dr_grpo", scale_rewards="group", num_iterations=2),
        dict(shared_prompt=False, micro_batch_size=5),
    ),
}


@pytest.mark.parametrize("case", [*CASES, "grpo-group-mu1 with tools", "dapo-batch-mu2-masked with tools"])
def test_a_train_step_equals_the_step_by_hand(tokenizer, tmp_path, case):
    """In fp64, the two ways of computing (chunked LM head, shared prompts or padded rows, micro-
    batches there; one plain forward per rollout here) agree to rounding: every weight within
    2e-15 of the other. AdamW's first step is about lr * g / (|g| + eps), and adam_epsilon 1e-4 is
    about the size of the clipped gradient's entries, so the step depends on the gradient's scale
    (the clip) and not only on its signs. Tolerance 1e-12: 500x the rounding seen, and far below
    what the bugs this test is for do to the weights (in the first case: no clip 0.036, no weight
    decay 0.006, a flipped advantage 0.09)."""
    objective, layout = CASES[case.removesuffix(" with tools")]
    observations = case.endswith("with tools")  # some tokens are a tool's observation: no loss there
    grpo = dataclasses.replace(
        objective, num_generations=G, max_completion_length=MAX_LEN, temperature=0.7, epsilon=0.05
    )
    trainer, sampler = make_trainer(
        tokenizer,
        tmp_path,
        grpo,
        learning_rate=0.05,
        warmup_steps=3,
        lr_schedule="cosine",
        max_grad_norm=0.05,
        weight_decay=0.1,
        adam_betas=(0.8, 0.95),
        adam_epsilon=1e-4,
        observations=observations,
        **layout,
    )
    trainer.step = 4  # as if resumed after step 4: step 5 is on the cosine, past the warm-up
    by_hand = copy.deepcopy(trainer.model)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    observer = Rollouts()
    stats, _ = trainer.train_step(observer)
    generated = sampler.generated if observations else None
    lr = scheduled_lr(trainer.config, 5)
    expected = step_by_hand(by_hand, sampler.rollouts, grpo, trainer.config, lr, generated=generated)
    if observations:
        assert [r.generated for r in observer.seen] == sampler.generated
        assert any(not all(mine) for mine in sampler.generated)

    assert [r.advantage for r in observer.seen] == expected["advantages"]
    assert stats["lr"] == pytest.approx(scheduled_lr(trainer.config, 5), rel=1e-12)
    assert stats["grad_norm"] == pytest.approx(sum(expected["grad_norm"]) / grpo.num_iterations, rel=1e-9)
    assert stats["loss"] == pytest.approx(sum(expected["loss"]) / grpo.num_iterations, rel=1e-9, abs=1e-15)
    assert min(expected["grad_norm"]) > 2 * trainer.config.max_grad_norm  # the clip bites
    if grpo.num_iterations > 1:
        assert stats["clip/region_frac"] > 0  # and so does the ratio's
    hand = dict(by_hand.named_parameters())
    moved = 0.0
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, hand[name], rtol=0, atol=1e-12, msg=name)
        moved = max(moved, float((p.detach() - before[name]).abs().max()))
    assert moved > 1e-3  # the step is large against the tolerance


def test_the_learning_rate_follows_warm_up_then_the_schedule(tokenizer, tmp_path):
    """The lr of chosen steps of each schedule, as the step sets it on AdamW and logs it: the first,
    mid-warm-up, the last of the warm-up, the peak, mid-decay and the last. Each step is run as if
    resumed just before it (one group per step keeps them cheap)."""
    chosen = [1, 3, 5, 6, 8, 10]  # max_steps 10, warmup_steps 5
    grpo = GRPOConfig(num_generations=G, max_completion_length=MAX_LEN)
    for schedule in ("constant", "cosine"):
        trainer, _ = make_trainer(
            tokenizer, tmp_path, grpo, batch_size=G, learning_rate=1e-3, warmup_steps=5, lr_schedule=schedule
        )
        for step in chosen:
            trainer.step = step - 1
            stats, _ = trainer.train_step()
            assert stats["lr"] == trainer.optimizer.param_groups[0]["lr"]
            assert stats["lr"] == pytest.approx(scheduled_lr(trainer.config, step), rel=1e-12), (
                schedule,
                step,
            )
    # The formula's own values: the warm-up in sixths, then the peak and two points of the cosine.
    cosine = [1e-3 * (1 + math.cos(math.pi * progress)) / 2 for progress in (0, 2 / 5, 4 / 5)]
    assert [scheduled_lr(trainer.config, s) for s in chosen] == pytest.approx(
        [1e-3 * s / 6 for s in (1, 3, 5)] + cosine
    )


class Rollouts:
    """An observer of train_step (as trace.py's) that keeps the step's rollouts after stage 3."""

    def after_advantages(self, trainer, rollouts):
        self.seen = rollouts

    def after_update(self, trainer, stats):
        pass


def test_overlong_penalty_and_truncation_masking(tokenizer, tmp_path):
    """DAPO's soft overlong penalty on completions of every length from 1 to MAX_LEN = 8, with a
    buffer of 4 and a penalty of 0.5: nothing up to 4 tokens, then 0.125 more per token, 0.5 at 8;
    added to the task's reward. Completions cut at MAX_LEN are left out of the loss."""
    grpo = GRPOConfig(
        num_generations=G,
        max_completion_length=MAX_LEN,
        overlong_buffer=4,
        overlong_penalty=0.5,
        mask_truncated_completions=True,
    )
    trainer, sampler = make_trainer(tokenizer, tmp_path, grpo)
    observer = Rollouts()
    trainer.train_step(observer)
    penalty = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: -0.125, 6: -0.25, 7: -0.375, 8: -0.5}  # by length
    assert sorted({len(ids) for _, ids, _, _ in sampler.rollouts}) == sorted(penalty)
    for (_, ids, reward, truncated), r in zip(sampler.rollouts, observer.seen, strict=True):
        assert r.completion_ids == ids
        assert r.rewards == {"test_leading_digit": reward, "overlong": penalty[len(ids)]}
        assert r.reward == reward + penalty[len(ids)]
        assert (r.finish_reason, r.in_loss) == (("length", False) if truncated else ("stop", True))


# -- process supervision ----------------------------------------------------------------------------
# Per prompt of the step, each completion's leading digit (its reward, digit / 4) and its arithmetic
# steps, written about the prompt "What is a + b?": "right" a+b=(a+b) is right and relevant (step
# reward 1), "wrong" a+b=(a+b+1) is wrong (-1), "idle" 7*7=49 is right but uses no number of the
# problem (0); then the answer step, worth the outcome reward (step_rewards.py). The third group's
# step rewards are all equal (every step right, every answer worth 1): it gets no process advantage.
PROCESS = [
    [(3, ["right"]), (1, ["wrong"]), (2, ["right", "idle"]), (0, [])],
    [(4, ["idle", "right"]), (2, ["right", "wrong"]), (1, []), (3, ["right"])],
    [(4, ["right"]), (4, ["right"]), (4, ["right"]), (4, ["right"])],
]
STEP_REWARD = {"right": 1.0, "wrong": -1.0, "idle": 0.0}
PROCESS_LEN = 40


class StepSampler:
    """Stands in for Trainer._sample with PROCESS's completions: "d; " then the steps, each followed by
    ";", then " ok" and EOS, every piece encoded on its own, so that the token each step ends on is
    known here without the trainer's search. Records (prompt ids, completion ids, reward, step rewards,
    step end tokens)."""

    def __init__(self, trainer, observations: bool = False):
        self.trainer, self.rollouts = trainer, []
        # with observations, tokens 1 and 2 of a completion of 4 tokens or more stand for a tool's
        # observation (Samples.generated False there): context for the forward pass, not in the loss
        self.observations, self.generated = observations, []

    def __call__(self, indices, round_):
        tokenizer = self.trainer.tokenizer
        tokens = []
        for p, i in enumerate(indices):
            a, b = i // 3, i % 3  # ROWS[i] asks "What is a + b?"
            written = {"right": f"{a}+{b}={a + b}", "wrong": f"{a}+{b}={a + b + 1}", "idle": "7*7=49"}
            for digit, steps in PROCESS[p]:
                ids = tokenizer.encode(f"{digit}; ")
                ends = []
                for kind in steps:
                    ids += tokenizer.encode(written[kind])
                    ends.append(len(ids) - 1)
                    ids += tokenizer.encode(";")
                ids += tokenizer.encode(" ok") + [tokenizer.eos_token_ids[0]]
                tokens.append(ids)
                # then the answer step: the outcome reward, on the last token
                rewards = [STEP_REWARD[kind] for kind in steps] + [digit / 4]
                ends.append(len(ids) - 1)
                self.rollouts.append((tokenizer.encode(ROWS[i]["prompt"]), ids, digit / 4, rewards, ends))
        return Samples(
            tokens=tokens,
            logprobs=[[0.0] * len(t) for t in tokens],
            finish_reasons=["stop"] * len(tokens),
            prompt_indices=[p for p in range(len(indices)) for _ in range(G)],
        )


def process_advantages_by_hand(step_rewards, step_ends, lengths) -> list[torch.Tensor]:
    """DeepSeekMath 4.1.3 in plain Python: each step reward minus the mean of its group's, over their
    unbiased std + EPS (0 for a group of equal ones); a token's advantage is the sum of the normalised
    rewards of the steps that end at or after it."""
    out = []
    for g in range(0, len(lengths), G):
        pooled = [r for rewards in step_rewards[g : g + G] for r in rewards]
        flat = len(set(pooled)) <= 1
        mean = statistics.fmean(pooled)
        std = 0.0 if flat else statistics.stdev(pooled)
        for rewards, ends, length in zip(step_rewards[g : g + G], step_ends[g : g + G], lengths[g : g + G]):
            normalised = [0.0 if flat else (r - mean) / (std + EPS) for r in rewards]
            per_token = [sum(n for n, end in zip(normalised, ends) if end >= t) for t in range(length)]
            out.append(torch.tensor(per_token, dtype=torch.float64))
    return out


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_a_process_supervised_step_equals_the_step_by_hand(tokenizer, tmp_path, loss_type):
    """advantage_type="process": the trainer finds each completion's steps with the verifier's checker,
    maps them to the tokens they end on, and trains on per-token advantages; by hand, the step rewards
    and end tokens are known from how the completions were written, and the advantages come from the
    paper's formula. Every weight within 1e-12, as in the outcome cases above."""
    grpo = GRPOConfig(
        num_generations=G,
        max_completion_length=PROCESS_LEN,
        temperature=0.7,
        epsilon=0.05,
        loss_type=loss_type,
        num_iterations=2,
        advantage_type="process",
    )
    trainer, _ = make_trainer(
        tokenizer,
        tmp_path,
        grpo,
        learning_rate=0.05,
        max_grad_norm=0.05,
        adam_epsilon=1e-4,
    )
    sampler = StepSampler(trainer)
    trainer._sample = sampler
    by_hand = copy.deepcopy(trainer.model)
    observer = Rollouts()
    trainer.train_step(observer)

    prompts, completions, rewards, step_rewards, step_ends = zip(*sampler.rollouts)
    for r, want_rewards, want_ends in zip(observer.seen, step_rewards, step_ends, strict=True):
        assert (r.step_rewards, r.step_ends) == (want_rewards, want_ends)
    lengths = [len(c) for c in completions]
    advantages = [a.float().double() for a in process_advantages_by_hand(step_rewards, step_ends, lengths)]
    for r, a in zip(observer.seen, advantages):
        torch.testing.assert_close(r.token_advantages.double(), a, rtol=0, atol=0)
    # the first step's tokens carry its reward and the answer's; " ok" and EOS the answer's alone
    assert advantages[0][0] != advantages[0][-1] != 0
    assert all(float(a.abs().max()) == 0 for a in advantages[2 * G :])  # the flat group

    rollouts = [(p, c, reward, False) for p, c, reward in zip(prompts, completions, rewards)]
    expected = step_by_hand(by_hand, rollouts, grpo, trainer.config, trainer.config.learning_rate, advantages)
    hand = dict(by_hand.named_parameters())
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, hand[name], rtol=0, atol=1e-12, msg=name)
    assert min(expected["grad_norm"]) > 2 * trainer.config.max_grad_norm  # the clip bites


def test_outcome_plus_process_adds_the_outcome_advantage_to_every_token(tokenizer, tmp_path):
    grpo = GRPOConfig(num_generations=G, max_completion_length=PROCESS_LEN, advantage_type="outcome+process")
    trainer, _ = make_trainer(tokenizer, tmp_path, grpo)
    sampler = StepSampler(trainer)
    trainer._sample = sampler
    observer = Rollouts()
    trainer.train_step(observer)
    _, completions, rewards, step_rewards, step_ends = zip(*sampler.rollouts)
    process = process_advantages_by_hand(step_rewards, step_ends, [len(c) for c in completions])
    outcome = advantages_by_hand(list(rewards), "group")
    for r, p, o in zip(observer.seen, process, outcome, strict=True):
        assert r.advantage == pytest.approx(o, abs=1e-6)
        torch.testing.assert_close(r.token_advantages.double(), p + o, rtol=0, atol=1e-6)


def test_a_length_reward_in_tokens_reads_each_completions_token_count(tokenizer, tmp_path):
    """Stage 2 hands every reward a completion_tokens column: here the length reward's band of 2-5
    tokens with a ramp of 2 scores each of LENGTHS (EOS counted) by hand."""
    grpo = GRPOConfig(num_generations=G, max_completion_length=MAX_LEN)
    trainer, sampler = make_trainer(tokenizer, tmp_path, grpo)
    trainer.task = Task(ROWS, [RewardSpec("length", options=dict(unit="tokens", min=2, max=5, soft=2))])
    observer = Rollouts()
    trainer.train_step(observer)
    by_length = {1: 0.5, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 0.5, 7: 0.0, 8: 0.0}
    for (_, ids, _, _), r in zip(sampler.rollouts, observer.seen, strict=True):
        assert r.rewards == {"length": by_length[len(ids)]}
