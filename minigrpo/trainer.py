"""The GRPO loop: the only module that combines the stages, numbered as in the README's diagram.

In: a policy (Qwen3 + tokenizer), a Task (prompts, gold columns, rewards), GRPOConfig and
TrainConfig. Out: the trained policy, output_dir/metrics.jsonl and checkpoints. It knows the order
of the stages, not how any stage works, nor how a run starts or resumes (run.py). One step,
`Trainer.train_step`:

  1. sample      P prompts x G completions (sampler.generate)             -> rollout buffer
  2. verify      decode, score every reward, weight and sum (verifier)    -> reward per completion
                 with process supervision, also each step's reward        -> step rewards
                 dynamic sampling (DAPO) repeats 1-2 on new prompts for the groups with no signal
  3. advantages  group-relative (advantages.py)                           -> advantage per completion
                 or, with process supervision, per token
  4. update      old / reference log-probs, then num_iterations passes, each over shuffled
                 micro-batches with gradient accumulation, gradient clipping and one AdamW step
                 (update.py)
  5. metrics     the step's stats for the logger; `Trainer.train` logs them and saves checkpoints

Dynamic sampling repeats stages 1-2 on new prompts while groups with no signal leave the batch
short, up to max_sampling_rounds. A group has no signal when its outcome rewards are all equal,
also under process supervision, whose step rewards might still differ. An observer (trace.py) sees
the rollouts after stage 3 and the update's stats after stage 4; `train_step` returns the stats with
the first completion of a few groups and their rewards.

Before any step, every row's inputs to every reward are checked (RewardSpec.check_inputs): a bad
row is named when the trainer is built, not at the step that samples it. An exception in `train`
leaves the last completed step checkpointed (in one process), not nothing.

With num_iterations = 1 the old log-probs are the current ones detached: the ratio is exactly 1,
the clipped surrogate reduces to the advantage, and since advantages are centred within each
group the loss reads about 0 with clip fraction 0 (its gradient is not 0). This matches TRL.

Departures from DeepSeekMath GRPO beyond loss.py's: every sampling seed, the data order and the
micro-batch shuffles derive from TrainConfig.seed and the step number, so a resumed run repeats
a straight one bit for bit on CPU; each of the num_iterations passes is one AdamW step over the
whole batch (the paper leaves the split open); the learning rate is scheduled per GRPO step
(warm-up, then constant or cosine over max_steps), set on the optimizer before each step.

Under torchrun (see distributed.py) every rank draws the same prompts and samples and scores its
own contiguous block of whole groups (stages 1-2). The rollouts are then gathered, so stage 3
(advantages, including scale_rewards="batch"; dynamic sampling's decisions) and every logged
metric see the whole batch, on every rank. In stage 4 each rank trains a block of the groups;
DistributedDataParallel, or FSDP2 with config.fsdp, averages the gradients, and the loss is
scaled by the world size because its shares are taken against the whole step's totals (dapo's
token count, grpo's sequence count): one process and several compute the same update. Only
the completions differ with the number of ranks, since each rank seeds its own sampling.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from dataclasses import replace

import torch

from . import checkpoint, distributed, files
from .advantages import group_advantages, process_advantages, zero_variance_groups
from .config import GRPOConfig, TrainConfig, as_dict
from .evaluate import Evaluation, evaluate, summarize
from .metrics import Clock, MetricsLogger, NullLogger
from .rollout import Rollout, completion_stats
from .sampler import Samples, check_prompts, generate
from .step_rewards import checked_step_rewards, monte_carlo_step_rewards, step_stats
from .tasks import PromptStream, Task
from .tools import ToolRunner, tool_stats
from .update import Updater
from .verifier import Rewards, compute_rewards, sandbox_stats


class Trainer:
    """GRPO on one task: `train_step` is one step of the README's diagram, `train` steps to the end
    of the run, logging each step and saving checkpoints (run.py builds or resumes a Trainer)."""

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
        if model.dtype == torch.float16:  # AdamW's eps (1e-8) is 0 in float16: a step divides by zero
            raise ValueError(
                "the policy's weights are float16, which AdamW cannot train (its eps of 1e-8 "
                "rounds to 0 and the first step turns most weights into NaN or inf); use "
                "bfloat16 or float32"
            )
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
        _check_rewards(task)  # every row, before anything runs: not at the step that samples a bad one
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.grpo = grpo
        self.config = config
        self.model_path = model_path  # where the run started: the reference model is reloaded from it
        room = model.config.max_position_embeddings - grpo.max_completion_length  # tokens a prompt may have
        prompts = [self._text(row["prompt"]) for row in task.rows]
        self.prompt_ids = tokenizer.encode_all(
            prompts, "task's prompts", model_path or "the policy", room, task.sources
        )
        self.check_context(self.prompt_ids, "task's prompts", task.sources)
        with self.tool_runner():  # at start, not at the first step: the tokenizer has the format's markers
            pass
        self.eos_ids = tuple(tokenizer.eos_token_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        # stage 1's own copy of the policy in another precision (sampling_dtype), as another engine's
        self.sampling_copy = _sampling_copy(model, grpo.sampling_dtype)
        self.reference = None  # a frozen copy of the starting policy, only when the KL needs one
        if grpo.beta > 0:
            self.reference = _frozen_copy(reference if reference is not None else model)
        self.updater = Updater(
            model, self.reference, grpo, config, self.dist, self._padding_rollout(), self.pad_id
        )
        self.policy = self.updater.policy  # sampling and checkpoints use it and the optimizer
        self.optimizer = self.updater.optimizer
        self.stream = PromptStream(len(task.rows), config.seed)
        self.step = 0
        self.updated_step = 0  # the step whose update the weights hold; None while an update runs
        model.gradient_checkpointing = config.gradient_checkpointing
        self.wall_seconds_before = 0.0  # the run's time in earlier processes, up to the checkpoint resumed
        self.started = time.monotonic()

    # -- the loop -------------------------------------------------------------------------------
    def train(self, on_step=None, observer=None, start_stats: dict | None = None) -> None:
        """Steps up to max_steps (or stop_at_step). on_step(trainer) may return extra stats to log
        with the step, e.g. a held-out evaluation every few steps. The first step is shown to
        `observer` if one is given. `start_stats` (the accuracy before training, say) are logged as
        step 0 when the run starts from step 0. An exception leaves the last completed step saved
        (`_save_after_failure`)."""
        if self.dist.is_main:  # rank 0 alone writes; the stats it logs are already reduced over ranks
            logger = MetricsLogger(
                self.config.output_dir,
                self.config.max_steps,
                self.step,
                self.config.progress_bar,
                self.config.report_to,
                start_stats,
            )
        else:
            logger = NullLogger()
        first_step = self.step
        saved = self.step  # the last step a checkpoint holds (or the start)
        self.updated_step = self.step
        save_every = self.config.save_every
        data = self.stream.state()
        try:
            last = min(self.config.max_steps, self.config.stop_at_step or self.config.max_steps)
            while self.step < last:
                data = self.stream.state()  # the prompt stream before this step: a failure goes back to it
                stats, examples = self.train_step(observer)
                observer = None
                if on_step is not None:
                    stats.update(on_step(self) or {})
                logger.log(self.step, stats)
                every = self.config.log_completions_every
                if every and self.step % every == 0:
                    logger.log_completions(self.step, examples)
                if save_every and self.step % save_every == 0:
                    self.save()
                    saved = self.step
            if self.step > first_step and (not save_every or self.step % save_every):
                self.save()  # the last step, unless it was just saved (or this process took none)
        except Exception as error:
            self._save_after_failure(error, saved, data)
            raise
        finally:
            logger.close()

    def _save_after_failure(self, error: Exception, saved: int, data: dict) -> None:
        """After an exception in `train`: a checkpoint of the last step whose update completed, so that a
        resume goes on from there, unless one holds it already. Not after a failure inside an update (its
        weights are neither step's, or NaN), nor a full disk, nor under torchrun, where the other ranks
        may not have failed and a save waits for all of them. A failure in stages 1-3 of a step leaves
        the weights of the step before: the step and the prompt stream (`data`) go back to it."""
        updated = self.updated_step
        if updated is None or updated == saved or isinstance(error, files.DiskFull):
            return
        if self.dist.world_size > 1:  # (a rank that saves alone would wait for the others for ever)
            return
        if updated < self.step:
            self.step = updated
            self.stream.load_state(data)
        self.save()

    def train_step(self, observer=None) -> tuple[dict[str, float], list[dict]]:
        """One step of the module docstring's stages: (stats to log, a few completions with rewards)."""
        self.step += 1
        self._set_learning_rate()
        clock = Clock()
        batch = StepRollouts(self.grpo, self.config.batch_size)
        for round_ in range(self.grpo.max_sampling_rounds if self.grpo.dynamic_sampling else 1):
            indices = self.stream.next(batch.missing_groups())  # the next prompts of the task
            mine = self.dist.block_of(indices)  # this rank's block of them (one process: all)
            with clock("sample"):
                rollouts, warmup = self.sample(mine, round_)  # 1. sample G completions per prompt
            if warmup:  # graphs captured in this step's sampling: logged by the steps that capture any
                clock.add("warmup", warmup)
            with clock("verify"):
                self.verify(rollouts, mine)  # 2. verify: every reward of the task
            batch.add(self.dist.gather_joined(rollouts))  # every rank's, in prompt order
            if batch.full():
                break
        self.advantages(batch.trained)  # 3. advantages, over the groups trained on
        if observer is not None:
            observer.rollouts(self, batch.sampled)
        self.updated_step = None  # until it ends, the weights are neither this step's nor the last's
        with clock("update"):
            update = self.update(batch.trained)  # 4. update: num_iterations AdamW steps
        self.updated_step = self.step
        if observer is not None:
            observer.updated(self, update)
        stats = self.metrics(batch, update, clock)  # 5. metrics
        return stats, self._examples(batch.sampled)

    # -- 1. sample ------------------------------------------------------------------------------
    def sample(self, indices: list[int], round_: int) -> tuple[list[Rollout], float]:
        """Stage 1 on this rank's prompts: G rollouts per prompt, group by group, each with the tool
        calls it made; and the seconds the sampler spent capturing graphs (Samples.warmup_seconds)."""
        samples = self._sample(indices, round_)
        expected = len(indices) * self.grpo.num_generations
        assert len(samples.tokens) == expected, f"{len(samples.tokens)} completions, {expected} expected"
        generated = samples.generated or [None] * expected
        calls = samples.tool_calls or [[] for _ in range(expected)]
        rollouts = []
        for i, (tokens, logprobs, reason, p) in enumerate(
            zip(samples.tokens, samples.logprobs, samples.finish_reasons, samples.prompt_indices)
        ):
            rollouts.append(
                Rollout(
                    prompt_ids=self.prompt_ids[indices[p]],
                    completion_ids=tokens,
                    finish_reason=reason,
                    generated=generated[i],
                    tool_calls=calls[i],
                    in_loss=not (self.grpo.mask_truncated_completions and reason == "length"),
                    sampler_logprobs=torch.tensor(logprobs, dtype=torch.float32),
                )
            )
        return rollouts, samples.warmup_seconds

    def _sample(self, indices: list[int], round_: int) -> Samples:
        """Stage 1 on this rank's prompts, with each completion's tool calls. Its seed depends on the rank:
        completions depend on how the prompts are cut across ranks (everything after sampling does not)."""
        rank = f"-rank{self.dist.rank}" if self.dist.rank else ""
        seed = random.Random(f"{self.config.seed}-{self.step}-{round_}{rank}").getrandbits(62)
        self.model.eval()
        with self.policy.gathered():  # FSDP2: every rank all-gathers the weights, then samples on its own
            if not indices:  # dynamic sampling may leave a rank nothing to sample this round
                return Samples(tokens=[], logprobs=[], finish_reasons=[], prompt_indices=[])
            prompts = [self.prompt_ids[i] for i in indices]
            with self.tool_runner() as tools:
                samples = generate(
                    self._sampling_model(),
                    prompts,
                    self.grpo.sampling_config(),
                    tools=tools,
                    eos_token_ids=self.eos_ids,
                    seed=seed,
                )
                if tools is not None:
                    samples.tool_calls = [tools.calls(r) for r in range(len(samples.tokens))]
            return samples

    def tool_runner(self):
        """A fresh ToolRunner for one sampling call (its requests are that call's rows), or a context of
        None when the run calls no tools."""
        if not self.grpo.tool_names:
            return contextlib.nullcontext()
        return ToolRunner(
            self.tokenizer, self.grpo.tool_format, self.grpo.tool_names, self.grpo.max_tool_calls
        )

    def _sampling_model(self):
        """The policy, or its sampling_dtype copy with the policy's current weights (cast as copied)."""
        if self.sampling_copy is None:
            return self.model
        with torch.no_grad():
            for copied, weight in zip(self.sampling_copy.parameters(), self.model.parameters(), strict=True):
                copied.copy_(weight)
        return self.sampling_copy

    # -- 2. verify ------------------------------------------------------------------------------
    def verify(self, rollouts: list[Rollout], indices: list[int]) -> None:
        """Stage 2 for the rollouts of these prompts: decode each completion and score it with every
        reward of the task, plus DAPO's overlong penalty."""
        for r in rollouts:
            r.text = self.tokenizer.decode_completion(r.completion_ids)
        if not rollouts:
            return
        rows = [self.task.rows[i] for i in indices]
        columns = self.task.columns(rows, self.grpo.num_generations)  # each row's values, once per completion
        # for a length reward in tokens
        columns["completion_tokens"] = [len(r.completion_ids) for r in rollouts]
        result = compute_rewards([r.text for r in rollouts], columns, self.task.rewards)
        components = dict(result.components)
        totals = list(result.total)
        if self.grpo.overlong_buffer:
            components["overlong"] = [_overlong_penalty(len(r.completion_ids), self.grpo) for r in rollouts]
            totals = [t + p for t, p in zip(totals, components["overlong"])]
        for i, r in enumerate(rollouts):
            r.rewards = {name: values[i] for name, values in components.items()}
            r.reward = totals[i]
            r.timed_out = result.timed_out[i]
        if self.grpo.advantage_type != "outcome":
            self.step_rewards(rollouts, indices, columns)

    def step_rewards(self, rollouts: list[Rollout], indices: list[int], columns: dict[str, list]) -> None:
        """Process supervision (step_rewards.py): each completion's arithmetic steps, checked against
        its prompt, as step rewards on the token where each step ends; or, with process_rewards
        "monte_carlo", their Math-Shepherd values."""
        texts = [self._text(self.task.rows[i]["prompt"]) for i in indices]  # each prompt once
        problems = [text for text in texts for _ in range(self.grpo.num_generations)]  # one per rollout
        checked_step_rewards(rollouts, problems, self.tokenizer)
        if self.grpo.process_rewards != "monte_carlo":
            return
        rank = f"-rank{self.dist.rank}" if self.dist.rank else ""
        self.model.eval()
        with self.policy.gathered():
            monte_carlo_step_rewards(
                self.model,
                self.tokenizer,
                rollouts,
                columns,
                self.task.rewards,
                replace(self.grpo.sampling_config(), eos_token_ids=self.eos_ids),
                self.grpo.process_samples,
                seed=f"{self.config.seed}-{self.step}-{indices[0]}{rank}",
            )

    # -- 3. advantages --------------------------------------------------------------------------
    def advantages(self, rollouts: list[Rollout]) -> None:
        """Stage 3: each rollout's advantage, relative to its group (a group of equal rewards: exactly 0);
        with process supervision, each token's, from the group's step rewards (plus the outcome's)."""
        if not rollouts:
            return
        G = self.grpo.num_generations
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)  # (N,)
        advantages = group_advantages(rewards, G, self.grpo.scale_rewards)  # (N,)
        for r, a in zip(rollouts, advantages.tolist()):
            r.advantage = a
        if self.grpo.advantage_type == "outcome":
            return
        per_token = process_advantages(
            [r.step_rewards for r in rollouts],
            [r.step_ends for r in rollouts],
            [len(r.completion_ids) for r in rollouts],
            G,
        )  # each (Tc,)
        for r, a in zip(rollouts, per_token):
            if self.grpo.advantage_type == "outcome+process":
                a = a + r.advantage
            r.token_advantages = a.float()

    # -- 4. update ------------------------------------------------------------------------------
    def update(self, rollouts: list[Rollout]) -> dict[str, float]:
        """Stage 4: old and reference log-probs, then num_iterations AdamW steps (update.py)."""
        return self.updater(rollouts, self.step)

    def _padding_rollout(self) -> Rollout:
        """A rollout that weighs nothing (no token in the loss, advantage 0), for a rank's empty
        micro-batch."""
        zeros = torch.zeros(1)  # (1,) sampler, old and reference log-probs, never read: the token is masked
        return Rollout(
            prompt_ids=self.prompt_ids[0][:1],
            completion_ids=[self.pad_id],
            finish_reason="length",
            in_loss=False,
            sampler_logprobs=zeros,
            old_logprobs=zeros,
            ref_logprobs=zeros,
        )

    # -- 5. metrics and checkpoints -------------------------------------------------------------
    def metrics(self, batch: StepRollouts, update: dict[str, float], clock: Clock) -> dict[str, float]:
        """Stage 5: the step's stats for the logger, over the whole batch, the same on every rank."""
        # the step waits for the slowest rank's sampling
        clock.seconds["sample"] = self.dist.max([clock.seconds["sample"]])[0]
        stats = reward_stats(batch.sampled)
        if self.grpo.advantage_type != "outcome":
            stats.update(step_stats(batch.sampled))
        if self.grpo.tool_names:
            stats.update(tool_stats(batch.sampled, self.grpo.tool_names))
        stats.update(self._sampling_stats(batch, clock))
        stats.update(sandbox_stats())  # tool calls' and code rewards' sandboxes, once any has run
        stats.update(update)
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        stats.update(clock.stats())
        return stats

    def _sampling_stats(self, batch: StepRollouts, clock: Clock) -> dict[str, float]:
        G = self.grpo.num_generations
        seconds = max(clock.seconds["sample"], 1e-9)
        sampled_groups = len(batch.sampled) // G
        return {
            "groups/zero_variance_frac": batch.flat_groups / max(sampled_groups, 1),
            "groups/trained": len(batch.trained) // G,
            "groups/sampled": sampled_groups,
            "sampling/samples_per_s": len(batch.sampled) / seconds,
            "sampling/tokens_per_s": sum(len(r.completion_ids) for r in batch.sampled) / seconds,
        }

    def save(self) -> str:
        """Write a checkpoint (rank 0) of the state every rank holds (whole weights and optimizer state
        gathered first under FSDP2); returns its directory on every rank. run.py resumes from it."""
        weights = self.policy.weights()
        state = self.state_dict()
        path = None
        if self.dist.is_main:
            path = checkpoint.save_checkpoint(
                self.config.output_dir,
                self.step,
                self.model,
                self.tokenizer,
                state,
                self.config.save_total_limit,
                weights=weights,
            )
        return self.dist.broadcast(path)  # no rank goes on before the checkpoint is complete

    def state_dict(self) -> dict:
        """Everything but the weights (run.STATE_KEYS, and wall_seconds), as run.restore reads it back;
        every rank must call it (it gathers)."""
        return {
            "step": self.step,
            "optimizer": self.policy.optimizer_state(self.optimizer),
            "data": self.stream.state(),
            "rng": self.dist.gather(checkpoint.rng_states()),  # one per rank
            "model_path": self.model_path,
            "configs": as_dict(self.grpo, self.config),
            # the run's running total: a resume adds on, a killed process too
            "wall_seconds": self.wall_seconds(),
        }

    # -- beside the loop ------------------------------------------------------------------------
    def evaluate(self, problems, template, rewards=None, **settings) -> Evaluation:
        """evaluate.evaluate on held-out problems, each rank taking a block of them; every rank gets
        the result over all of them. Greedy results do not depend on the number of ranks; sampled
        ones (temperature > 0) do, as each rank seeds its own block."""
        mine = self.dist.block_of(problems)
        self.model.eval()
        with self.policy.gathered():
            results = evaluate(self.model, self.tokenizer, mine, template, rewards, **settings).results
        return summarize(self.dist.gather_joined(results), settings.get("samples", 1), settings.get("ks", ()))

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

    def wall_seconds(self) -> float:
        """The run's wall time so far: this process's since the trainer was built, and that of the earlier
        processes up to the checkpoint it resumed from (a killed process's work past it is redone, and
        counted then)."""
        return self.wall_seconds_before + time.monotonic() - self.started

    def _text(self, prompt) -> str:
        return prompt if isinstance(prompt, str) else self.tokenizer.apply_chat_template(prompt)

    def _set_learning_rate(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learning_rate_at(self.step)

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


class StepRollouts:
    """One step's rollouts over its sampling rounds: every one sampled, and the groups trained on.

    Every group is trained on, unless dynamic sampling or drop_zero_variance_groups leave out the
    groups whose rewards are all equal (no signal); then each round samples prompts for the groups
    still missing, and the batch is full at batch_size / G groups."""

    def __init__(self, grpo: GRPOConfig, batch_size: int):
        self.group_size = grpo.num_generations  # G
        self.wanted_groups = batch_size // grpo.num_generations
        self.drop_flat = grpo.dynamic_sampling or grpo.drop_zero_variance_groups
        self.sampled: list[Rollout] = []  # every round's rollouts, group by group
        self.trained: list[Rollout] = []  # the groups stages 3 and 4 see
        self.flat_groups = 0  # sampled groups whose rewards are all equal

    def missing_groups(self) -> int:
        """Groups the batch still wants: the prompts to sample next."""
        return self.wanted_groups - len(self.trained) // self.group_size

    def full(self) -> bool:
        return len(self.trained) >= self.wanted_groups * self.group_size

    def add(self, rollouts: list[Rollout]) -> None:
        """A round's rollouts, scored (stage 2), group by group."""
        G = self.group_size
        rewards = torch.tensor([r.reward for r in rollouts])  # (N,)
        flat = zero_variance_groups(rewards, G).tolist()  # (N / G,)
        self.sampled += rollouts
        self.flat_groups += sum(flat)
        for g, is_flat in enumerate(flat):
            if not (self.drop_flat and is_flat):
                self.trained += rollouts[g * G : (g + 1) * G]


def _check_rewards(task: Task) -> None:
    """Each reward named once (its component is logged by name, its weights would add up), and every row's
    inputs to every reward (RewardSpec.check_inputs); a ValueError names the reward and the row."""
    names = [spec.name for spec in task.rewards]
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            raise ValueError(
                f"the reward {name!r} is named {names.count(name)} times: its weights would add up under "
                "one logged component; name it once, with the sum of its weights"
            )
    columns = task.columns(task.rows, 1)  # one value per row
    rows = [task.where(i) for i in range(len(task.rows))]
    for spec in task.rewards:
        spec.check_inputs(columns, rows)


def _frozen_copy(model):
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


def _sampling_copy(model, dtype: str | None):
    """A frozen copy of the policy in `dtype` for sampling, or None when that is the policy's own dtype."""
    if dtype is None or getattr(torch, dtype) == model.dtype:
        return None
    return _frozen_copy(model).to(getattr(torch, dtype))


def _overlong_penalty(length: int, grpo: GRPOConfig) -> float:
    """DAPO's soft overlong punishment: 0 up to L - buffer tokens, then down linearly to -penalty at L."""
    free = grpo.max_completion_length - grpo.overlong_buffer
    return -grpo.overlong_penalty * max(0, length - free) / grpo.overlong_buffer


def reward_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """The logger's reward and length stats over rollouts: reward/mean, reward/accuracy/mean, ..."""
    if not rollouts:
        return {}
    components = {}  # each reward's values, one per rollout
    for name in rollouts[0].rewards:
        components[name] = [r.rewards[name] for r in rollouts]
    timed_out = [r.timed_out for r in rollouts]
    rewards = Rewards([r.reward for r in rollouts], components, timed_out)
    return {**rewards.stats(), **completion_stats(rollouts)}
