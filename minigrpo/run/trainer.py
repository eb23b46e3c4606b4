"""The GRPO loop: the one module that combines the stages, numbered as in the README's diagram.

In: a policy (Qwen3 + tokenizer), a Task (prompts, gold columns, rewards), GRPOConfig and
TrainConfig. Out: the policy trained by one step at a time, and each step's stats. It knows the
order of the stages, not how any stage works, nor how a run starts, resumes, logs or saves (driver.py).
One step, `Trainer.train_step`:

  1. sample      P prompts x G completions (rollout/, generate)           -> rollout buffer
  2. verify      decode, score every reward, weight and sum (verifier/)   -> reward per completion
                 with process supervision, also each step's reward        -> step rewards
                 (step_rewards/)
                 dynamic sampling (DAPO) repeats 1-2 on new prompts for the groups with no signal
  3. advantages  group-relative (update/advantages.py), or another          -> advantage per completion
                 estimator (update/estimators.py); with process supervision,   or per token
                 or REINFORCE++'s KL in the rewards, per token
                 with a teacher (on-policy distillation), its log-probs of   -> teacher log-prob per token
                 every sampled token first (time/teacher), then its advantages or its hidden states
                 mixed in (update/distillation.py)
  4. update      old / reference log-probs, then num_iterations passes, each over shuffled
                 micro-batches with gradient accumulation, gradient clipping and one AdamW step
                 (update/updater.py)
  5. metrics     the step's stats for the logger (driver.py logs them and saves checkpoints)

The stages a run takes are chosen once, when the trainer is built, by plan.py's `plan_training`,
which returns what it decided (a `TrainingPlan`): whether tools run, which step rewards (none, the
checker's, Monte-Carlo values), which advantages (the estimator; per completion, per token, or both),
which stats, and what a teacher adds (update/distillation.py: nothing, the token form's advantages or
the full form's reverse KL in the loss; run/teacher.py loads it); `_bind_stages` turns the choices
that run on the trainer's state into its methods. What is trained is decided then too: every weight,
or LoRA adapters on a frozen base (model/lora.py), whose KL reference is the base with the adapters
off; a teacher is always a model of its own. The objective is the updater's, chosen when it is built
(update/loss.py's Objective). A stage returns what it computes; the trainer writes it into the
rollouts, in one place per stage.

Dynamic sampling repeats stages 1-2 on new prompts while groups with no signal leave the batch
short, up to max_sampling_rounds. A group has no signal when its outcome rewards are all equal,
also under process supervision, whose step rewards might still differ. An observer (trace.py) sees
the rollouts after stage 3 and the update's stats after stage 4; `train_step` returns the stats with
the first completion of a few groups and their rewards.

With num_iterations = 1 the old log-probs are the current ones detached: the ratio is exactly 1,
the clipped surrogate reduces to the advantage, and since advantages are centred within each
group the loss reads about 0 with clip fraction 0 (its gradient is not 0). This matches TRL.

Departures from DeepSeekMath GRPO beyond update/loss.py's: every sampling seed, the data order and the
micro-batch shuffles derive from TrainConfig.seed and the step number, so a resumed run repeats
a straight one bit for bit on CPU; each of the num_iterations passes is one AdamW step over the
whole batch (the paper leaves the split open); the learning rate is scheduled per GRPO step
(warm-up, then constant or cosine over max_steps), set on the optimizer before each step.

Under torchrun (see distributed.py) the stages meet the ranks where the step hands data from one to
the next, each place marked "ranks:" in this file (stage 4's gradient collectives are the updater's):
every rank draws the same prompts and samples and scores its own contiguous block of whole
groups (stages 1-2). The rollouts are then gathered, so stage 3 (advantages, including
scale_rewards="batch"; dynamic sampling's decisions) and every logged metric see the whole batch, on
every rank. Stage 4 is given this rank's block of the groups trained on and the whole step's totals;
DistributedDataParallel, or FSDP2 with config.fsdp, averages the gradients, and the loss is scaled
by the world size because its shares are taken against those totals (dapo's token count, grpo's
sequence count): one process and several compute the same update. Only the completions differ with
the number of ranks, since each rank seeds its own sampling. On one process each of these returns
its input, and nothing is gathered.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import replace

import torch

from .. import distributed
from ..config import GRPOConfig, TrainConfig, as_dict
from ..model import trainable_parameters
from ..rollout import (
    Rollout,
    Samples,
    StepRollouts,
    check_prompts,
    from_samples,
    generate,
    loss_positions,
    padding_rollout,
)
from ..step_rewards import StepRewards, checked_step_rewards, monte_carlo_step_rewards
from ..tasks import PromptStream, Task
from ..tools import declared_tools
from ..update import (
    SamplingCopy,
    Updater,
    kl_shaped_returns,
    step_totals,
    teacher_stats,
    token_advantages,
    zero_variance_groups,
)
from ..verifier import compute_rewards, sandbox_stats
from .metrics import Clock
from .plan import plan_training


class Trainer:
    """GRPO on one task: `train_step` is one step of the README's diagram (driver.py drives the steps)."""

    def __init__(
        self,
        model,
        tokenizer,
        task: Task,
        grpo: GRPOConfig,
        config: TrainConfig,
        *,
        model_path: str = "",
        reference=None,
        dist: distributed.Dist | None = None,
    ):
        self.dist = dist or distributed.current(model.device)  # one process, or this rank of a torchrun job
        config.check_against(grpo, self.dist.world_size)
        if self.dist.world_size > 1:  # (the digest reads every row: not for one process)
            self.dist.check_same(
                {
                    "configs": as_dict(grpo, config),
                    "model_path": model_path,
                    "dtype": str(model.dtype),
                    "device": model.device.type,
                    "task": distributed.digest(task.rows),
                    "rewards": repr(task.rewards),
                }
            )
        task.check_rewards()  # every row, before anything runs: not at the step that samples a bad one
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.grpo = grpo
        self.config = config
        self.model_path = model_path  # where the run started: the reference model is reloaded from it
        context = model.config.max_position_embeddings
        if grpo.max_completion_length >= context:
            raise ValueError(
                f"max_completion_length {grpo.max_completion_length} leaves no room for a prompt: the "
                f"model's context is {context} tokens"
            )
        _check_entropy_target(grpo, model.config.vocab_size)
        prompt_budget = context - grpo.max_completion_length  # tokens a prompt may have
        prompts = [self._text(row["prompt"]) for row in task.rows]
        self.prompt_ids = tokenizer.encode_all(
            prompts, "task's prompts", model_path or "the policy", prompt_budget, task.sources
        )
        self.check_context(self.prompt_ids, "task's prompts", task.sources)
        self.eos_ids = tuple(tokenizer.eos_token_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        # what trains, against what, and the stages a step takes: decided once (plan.py)
        self.plan = plan_training(
            model,
            tokenizer,
            grpo,
            config,
            start=reference if reference is not None else model,
            model_path=model_path,
            dist=self.dist,
            prompt_ids=self.prompt_ids,
            sources=task.sources,
        )
        self.trainable_parameters = trainable_parameters(model)
        # stage 1's own copy of the policy in another precision (sampling_dtype), as another engine's
        self.sampling_copy = SamplingCopy(model, grpo.sampling_dtype)
        self.updater = Updater(
            model,
            self.plan.reference_logprobs,
            grpo,
            config,
            self.dist,
            padding_rollout(self.prompt_ids[0][0], self.pad_id),
            self.pad_id,
            self.plan.teacher,
            self.plan.distillation,
        )
        self.policy = self.updater.policy  # sampling and checkpoints use it and the optimizer
        self.optimizer = self.updater.optimizer
        self.stream = PromptStream(len(task.rows), config.seed)
        self.step = 0
        self.updated_step = 0  # the step whose update the weights hold; None while an update runs
        self._bind_stages()

    def _bind_stages(self) -> None:
        """The plan's stages that run on this trainer's state, as its callables: train_step's callees test
        no feature switch."""
        self.step_rewards = {
            "none": _no_step_rewards,
            "checked": self._checked_steps,
            "monte_carlo": self._monte_carlo_steps,
        }[self.plan.step_rewards]
        self.token_advantages = {
            "outcome": _no_token_advantages,
            "process": functools.partial(_step_advantages, with_outcome=False),
            "outcome+process": functools.partial(_step_advantages, with_outcome=True),
            "kl_shaped_returns": self._kl_shaped_returns,
        }[self.plan.token_advantages]
        # before stage 3, the teacher's forward on the rollouts trained on; none without a teacher
        self.teach = self._teach if self.plan.teacher is not None else _no_teacher

    # -- one step -------------------------------------------------------------------------------
    def train_step(self, observer=None) -> tuple[dict[str, float], list[dict]]:
        """One step of the module docstring's stages: (stats to log, a few completions with rewards)."""
        self.step += 1
        self._set_learning_rate()
        clock = Clock()
        batch = StepRollouts(self.grpo.num_generations, self.config.batch_size, self.plan.drops_flat_groups)
        for round_ in range(self.plan.sampling_rounds):
            indices = self.stream.next(batch.missing_groups())  # the next prompts of the task
            # ranks: each samples and verifies its own block of them (one process: all)
            rank_prompts = self.dist.block_of(indices)
            with clock("sample"):
                rollouts, warmup = self.sample(rank_prompts, round_)  # 1. sample G completions per prompt
            if warmup:  # graphs captured in this step's sampling: logged by the steps that capture any
                clock.add("warmup", warmup)
            with clock("verify"):
                self.verify(rollouts, rank_prompts)  # 2. verify: every reward of the task
            # ranks: every rank's, in prompt order, as dynamic sampling, stage 3 (batch-wide scaling and
            # whitening) and the metrics read the whole batch
            rollouts = self.dist.gather_joined(rollouts)
            rewards = torch.tensor([r.reward for r in rollouts])  # (N,)
            # (N / G,) the groups whose rewards are all equal: no signal
            no_signal = zero_variance_groups(rewards, self.grpo.num_generations).tolist()
            batch.add(rollouts, no_signal)
            if batch.full():
                break
        taught = self.teach(batch.trained, clock)  # the teacher's log-probs (on-policy distillation)
        advantage_stats = self.advantages(batch.trained)  # 3. advantages, over the groups trained on
        if observer is not None:
            observer.after_advantages(self, batch.sampled)
        self.updated_step = None  # until it ends, the weights are neither this step's nor the last's
        # ranks: each trains an equal block of the groups trained on (not its own samples: dynamic
        # sampling drops flat groups), each loss a share of the whole step's totals
        rank_groups = self.dist.block_of(batch.trained, self.grpo.num_generations)
        totals = step_totals(batch.trained)
        with clock("update"):
            update = self.updater(rank_groups, self.step, totals)  # 4. update: num_iterations AdamW steps
        self.updated_step = self.step
        if observer is not None:
            observer.after_update(self, update)
        stats = self.metrics(batch, {**taught, **advantage_stats, **update}, clock)  # 5. metrics
        return stats, self._examples(batch.sampled)

    # -- 1. sample ------------------------------------------------------------------------------
    def sample(self, indices: list[int], round_: int) -> tuple[list[Rollout], float]:
        """Stage 1 on this rank's prompts: G rollouts per prompt, group by group, each with the tool
        calls it made; and the seconds the sampler spent capturing graphs (Samples.warmup_seconds)."""
        samples = self._sample(indices, round_)
        expected = len(indices) * self.grpo.num_generations
        assert len(samples.tokens) == expected, f"{len(samples.tokens)} completions, {expected} expected"
        prompt_ids = [self.prompt_ids[i] for i in indices]
        rollouts = from_samples(samples, prompt_ids, self.grpo.mask_truncated_completions)
        return rollouts, samples.warmup_seconds

    def _sample(self, indices: list[int], round_: int) -> Samples:
        """Stage 1 on this rank's prompts. Its seed depends on the rank: completions depend on how the
        prompts are cut across ranks (everything after sampling does not)."""
        rank = f"-rank{self.dist.rank}" if self.dist.rank else ""
        seed = random.Random(f"{self.config.seed}-{self.step}-{round_}{rank}").getrandbits(62)
        self.model.eval()
        # ranks: FSDP2's weights whole on each (an all-gather every rank joins), then each samples alone
        with self.policy.gathered():
            if not indices:  # dynamic sampling may leave a rank nothing to sample this round
                return Samples(tokens=[], logprobs=[], finish_reasons=[], prompt_indices=[])
            prompts = [self.prompt_ids[i] for i in indices]
            with self.plan.tool_runner() as tools:
                return generate(
                    self.sampling_copy.synced(),
                    prompts,
                    self.grpo.sampling_config(),
                    tools=tools,
                    eos_token_ids=self.eos_ids,
                    seed=seed,
                )

    # -- 2. verify ------------------------------------------------------------------------------
    def verify(self, rollouts: list[Rollout], indices: list[int]) -> None:
        """Stage 2 for the rollouts of these prompts: decode each completion and score it with every
        reward of the task (plus DAPO's overlong penalty), then its steps (process supervision)."""
        if not rollouts:
            return
        texts = [self.tokenizer.decode_completion(r.completion_ids) for r in rollouts]
        rows = [self.task.rows[i] for i in indices]
        columns = self.task.columns(rows, self.grpo.num_generations)  # each row's values, once per completion
        # for a length reward in tokens
        columns["completion_tokens"] = [len(r.completion_ids) for r in rollouts]
        scored = compute_rewards(texts, columns, self.task.rewards)
        components = dict(scored.components)
        totals = list(scored.total)
        if self.grpo.overlong_buffer:  # DAPO's soft overlong punishment, a reward of its own
            components["overlong"] = [_overlong_penalty(len(r.completion_ids), self.grpo) for r in rollouts]
            totals = [t + p for t, p in zip(totals, components["overlong"])]
        for i, r in enumerate(rollouts):  # stage 2's fields of each rollout
            r.text = texts[i]
            r.rewards = {name: values[i] for name, values in components.items()}
            r.reward = totals[i]
            r.timed_out = scored.timed_out[i]
        steps = self.step_rewards(rollouts, indices, columns)
        for r, step in zip(rollouts, steps):  # process supervision's fields (none without it)
            r.step_rewards = step.rewards
            r.step_ends = step.ends
            r.step_continuations = step.continuations

    def _checked_steps(self, rollouts: list[Rollout], indices: list[int], columns: dict) -> list[StepRewards]:
        """Each completion's arithmetic steps, checked against its prompt: step rewards on the token where
        each step ends (step_rewards/)."""
        texts = [self._text(self.task.rows[i]["prompt"]) for i in indices]  # each prompt once
        problems = [text for text in texts for _ in range(self.grpo.num_generations)]  # one per rollout
        return checked_step_rewards(rollouts, problems, self.tokenizer)

    def _monte_carlo_steps(
        self, rollouts: list[Rollout], indices: list[int], columns: dict
    ) -> list[StepRewards]:
        """The checker's steps, valued by Math-Shepherd's Monte-Carlo continuations instead."""
        checked = self._checked_steps(rollouts, indices, columns)
        rank = f"-rank{self.dist.rank}" if self.dist.rank else ""
        self.model.eval()
        with self.policy.gathered():  # ranks: as in stage 1, sampled on FSDP2's whole weights
            return monte_carlo_step_rewards(
                self.model,
                self.tokenizer,
                rollouts,
                checked,
                columns,
                self.task.rewards,
                replace(self.grpo.sampling_config(), eos_token_ids=self.eos_ids),
                self.grpo.process_samples,
                seed=f"{self.config.seed}-{self.step}-{indices[0]}{rank}",
            )

    # -- 3. advantages --------------------------------------------------------------------------
    def _teach(self, rollouts: list[Rollout], clock: Clock) -> dict[str, float]:
        """Before stage 3 with a teacher: its log-probs of every completion token, and its hidden states
        where the full form's update reads them; its stats (`distill/reverse_kl`)."""
        if not rollouts:
            return {}
        with clock("teacher"):
            outputs = self.updater.teacher_outputs(rollouts)  # each ((Tc,), (Tc, H_teacher))
        for r, (logprobs, hidden) in zip(rollouts, outputs):  # the teacher's fields of each rollout
            r.teacher_logprobs = logprobs
            r.teacher_hidden = hidden if self.plan.distillation.keeps_hidden else None
        return teacher_stats(rollouts)

    def advantages(self, rollouts: list[Rollout]) -> dict[str, float]:
        """Stage 3: each rollout's advantage by the run's estimator, relative to its group (GRPO: a group
        of equal rewards gets exactly 0); with process supervision, each token's, from the group's step
        rewards (plus the outcome's); REINFORCE++ with a KL, each token's return. Its stats (the KL
        folded into the rewards), or none."""
        if not rollouts:
            return {}
        G = self.grpo.num_generations
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)  # (N,)
        lengths = [r.loss_tokens for r in rollouts]  # (N,): the whitening estimators weigh by them
        outcome = self.plan.outcome_advantages(rewards, G, lengths).tolist()  # (N,)
        per_token, stats = self.token_advantages(rollouts, outcome, G)  # each (Tc,), or None
        # with a teacher: its advantages mixed in, or the verifier's scaled (as they were without one)
        outcome, per_token, distilled = self.plan.distillation.advantages(rollouts, outcome, per_token)
        stats = {**stats, **distilled}
        for r, advantage, tokens in zip(rollouts, outcome, per_token):  # stage 3's fields of each rollout
            r.advantage = advantage
            r.token_advantages = tokens
        return stats

    def _kl_shaped_returns(self, rollouts: list[Rollout], outcome: list[float], G: int):
        """REINFORCE++'s per-token advantages with the KL in the rewards: k1 = log p_sampler - log p_ref of
        each loss token (the reference's log-probs from the updater), the returns whitened over the batch
        (update/estimators.py), each placed on its completion's loss tokens (0 elsewhere); and the KL's
        token mean as the step's `kl`."""
        references = self.updater.reference_logprobs(rollouts)  # each (Tc,)
        kls = []  # each rollout's k1 on its loss tokens, (T_i,)
        for r, reference in zip(rollouts, references):
            kls.append((r.sampler_logprobs - reference)[loss_positions(r)])
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)  # (N,)
        returns = kl_shaped_returns(rewards, kls, self.grpo.beta)  # each (T_i,)
        per_token = []
        for r, values in zip(rollouts, returns):
            tokens = torch.zeros(len(r.completion_ids), dtype=torch.float32)  # (Tc,)
            tokens[loss_positions(r)] = values.float()
            per_token.append(tokens)
        all_kls = torch.cat(kls)
        return per_token, {"kl": float(all_kls.mean()) if all_kls.numel() else 0.0}

    # -- 5. metrics -----------------------------------------------------------------------------
    def metrics(self, batch: StepRollouts, update: dict[str, float], clock: Clock) -> dict[str, float]:
        """Stage 5: the step's stats for the logger, over the whole batch, the same on every rank."""
        # ranks: the step waits for the slowest rank's sampling
        clock.seconds["sample"] = self.dist.max([clock.seconds["sample"]])[0]
        stats = {}
        for rollout_stats in self.plan.rollout_stats:
            stats.update(rollout_stats(batch.sampled))
        stats.update(batch.stats(clock.seconds["sample"]))
        stats.update(sandbox_stats())  # tool calls' and code rewards' sandboxes, once any has run
        stats.update(update)
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        stats["training/trainable_parameters"] = float(self.trainable_parameters)  # the adapters' with LoRA
        stats.update(clock.stats())
        return stats

    def _examples(self, rollouts: list[Rollout], count: int = 2) -> list[dict]:
        """The first completion of the first `count` groups, with its prompt and rewards."""
        firsts = rollouts[: count * self.grpo.num_generations : self.grpo.num_generations]
        return [
            {
                "prompt": self.tokenizer.decode(r.prompt_ids),
                "completion": r.text,
                "rewards": {**r.rewards, "total": r.reward},
            }
            for r in firsts
        ]

    # -- beside the loop ------------------------------------------------------------------------
    def describe_objective(self) -> str:
        """One line naming what the run optimises: the estimator, the objective, the entropy bonus."""
        grpo = self.grpo
        parts = [f"advantage_estimator={grpo.advantage_estimator}", self.updater.objective.describe()]
        if grpo.scale_rewards != "group":
            parts.insert(1, f"scale_rewards={grpo.scale_rewards}")
        if grpo.advantage_type != "outcome":
            parts.insert(1, f"advantage_type={grpo.advantage_type}")
        if grpo.kl_in_reward:  # REINFORCE++'s KL is in its token rewards, not in the loss's beta
            parts.insert(1, f"kl_in_reward beta={grpo.beta:g}")
        if self.plan.teacher is not None:
            parts.append(f"{self.plan.distillation.describe()} teacher_model={grpo.teacher_model}")
        if grpo.use_adaptive_entropy:
            parts.append(f"adaptive entropy bonus (target {grpo.entropy_target:g})")
        elif grpo.entropy_coef:
            parts.append(f"entropy_coef={grpo.entropy_coef:g}")
        return " ".join(parts)

    def check_context(self, prompt_ids: list[list[int]], what: str, sources: list[str] | None = None) -> None:
        """Every prompt (the task's, or held-out ones) leaves room for max_completion_length new tokens;
        `sources` name them in an error ("data.jsonl, line 7")."""
        check_prompts(
            prompt_ids,
            self.grpo.sampling_config(),
            self.model.config.vocab_size,
            self.model.config.max_position_embeddings,
            what,
            sources,
        )

    def resume_at(self, step: int, optimizer_state: dict, stream_state: dict) -> None:
        """Go on from a checkpoint's step: its AdamW state (under this run's AdamW settings; the
        learning rate is set per step) and its place in the prompt stream."""
        self.go_back(step, stream_state)
        self.updated_step = step
        self.policy.load_optimizer_state(self.optimizer, optimizer_state)
        for group in self.optimizer.param_groups:
            group.update(
                betas=self.config.adam_betas,
                eps=self.config.adam_epsilon,
                weight_decay=self.config.weight_decay,
            )

    def go_back(self, step: int, stream_state: dict) -> None:
        """Back to the end of step `step`, the prompt stream at `stream_state`, after a failure in stages
        1-3 of the step after it (whose weights are still those of `step`)."""
        self.step = step
        self.stream.load_state(stream_state)

    def _text(self, prompt) -> str:
        """A row's prompt as text: a conversation (a list of messages, earlier assistant turns and tool
        calls included) rendered by the tokenizer's chat template, declaring the run's tools."""
        if isinstance(prompt, str):
            return prompt
        tools = declared_tools(self.tokenizer, self.grpo.tool_names)
        return self.tokenizer.apply_chat_template(prompt, tools=tools, **self.grpo.template_kwargs)

    def _set_learning_rate(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learning_rate_at(self.step)


def _no_teacher(rollouts: list[Rollout], clock: Clock) -> dict:
    """No teacher: no forward, no stats, no time/teacher."""
    return {}


def _no_step_rewards(rollouts: list[Rollout], indices: list[int], columns: dict) -> list[StepRewards]:
    """Outcome advantages alone read no step rewards: each rollout keeps none."""
    return [StepRewards() for _ in rollouts]


def _no_token_advantages(rollouts: list[Rollout], outcome: list[float], G: int) -> tuple[list[None], dict]:
    """Outcome advantages alone: no rollout gets per-token advantages (the update reads its one advantage)."""
    return [None] * len(rollouts), {}


def _step_advantages(rollouts: list[Rollout], outcome: list[float], G: int, with_outcome: bool):
    """Each rollout's per-token advantages, each (Tc,), from its group's step rewards; `with_outcome`
    adds the rollout's outcome advantage on every token (advantage_type "outcome+process")."""
    per_token = token_advantages(
        [r.step_rewards for r in rollouts],
        [r.step_ends for r in rollouts],
        [len(r.completion_ids) for r in rollouts],
        G,
        outcome if with_outcome else None,
    )
    return per_token, {}


def _check_entropy_target(grpo: GRPOConfig, vocab_size: int) -> None:
    """The adaptive entropy target lies below log V, the entropy of the uniform distribution: above it,
    the coefficient would grow every step whatever the policy did."""
    if grpo.use_adaptive_entropy and not grpo.entropy_target < math.log(vocab_size):
        raise ValueError(
            f"entropy_target must be in (0, log V) = (0, {math.log(vocab_size):.3f}) nats for this model's "
            f"vocabulary of {vocab_size} tokens, got {grpo.entropy_target}"
        )


def _overlong_penalty(length: int, grpo: GRPOConfig) -> float:
    """DAPO's soft overlong punishment: 0 up to L - buffer tokens, then down linearly to -penalty at L."""
    free = grpo.max_completion_length - grpo.overlong_buffer
    return -grpo.overlong_penalty * max(0, length - free) / grpo.overlong_buffer
