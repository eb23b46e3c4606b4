"""The GRPO loop: the only module that combines the stages, numbered as in the README's diagram.

In: a policy (Qwen3 + tokenizer), a Task (prompts, gold columns, rewards), GRPOConfig and
TrainConfig. Out: the trained policy, output_dir/metrics.jsonl, output_dir/initial_eval.json
(`initial_evaluation`), checkpoints. It knows the order of the stages, not how any stage works. One step:

  1. sample      P prompts x G completions (sampler.generate)             -> rollout buffer
  2. verify      decode, score every reward, weight and sum (verifier)    -> reward per completion
  3. advantages  group-relative (advantages.py); dynamic sampling resamples groups with no signal
  4. update      old / reference log-probs, then num_iterations passes, each over shuffled
                 micro-batches with gradient accumulation, gradient clipping and one AdamW step (update.py)
  5. metrics and checkpoints

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

import copy
import os
import random
import time

import torch

from . import distributed
from . import checkpoint
from .advantages import group_advantages, zero_variance_groups
from .weights import load_pretrained, parse_device
from .config import GRPOConfig, TrainConfig, as_dict, changed_settings
from .evaluate import Evaluation, evaluate, summarize
from .metrics import Clock, MetricsLogger, NullLogger
from .rollout import Rollout, completion_stats
from .sampler import Samples, check_prompts, generate
from .tasks import PromptStream, Task
from .update import Updater
from .verifier import Rewards, compute_rewards

# The keys of Trainer.state_dict that a resume reads: a checkpoint whose trainer_state.pt lacks one is damaged.
STATE_KEYS = ("step", "optimizer", "data", "rng", "model_path", "configs")


class Trainer:
    def __init__(self, model, tokenizer, task: Task, grpo: GRPOConfig, config: TrainConfig, *,
                 model_path: str = "", reference=None, dist: distributed.Dist | None = None):
        if model.dtype == torch.float16:  # AdamW's eps (1e-8) is 0 in float16: a step divides by zero
            raise ValueError("the policy's weights are float16, which AdamW cannot train (its eps of 1e-8 rounds to 0 "
                             "and the first step turns most weights into NaN or inf); use bfloat16 or float32")
        self.dist = dist or distributed.current(model.device)  # one process, or this rank of a torchrun job
        config.check_against(grpo, self.dist.world_size)
        if self.dist.world_size > 1:  # (the digest reads every row: not for one process)
            self.dist.check_same({"configs": as_dict(grpo, config), "model_path": model_path, "dtype": str(model.dtype),
                                  "device": model.device.type, "task": distributed.digest(task.rows),
                                  "rewards": repr(task.rewards)})
        self.model, self.tokenizer, self.task, self.grpo, self.config = model, tokenizer, task, grpo, config
        self.model_path = model_path  # where the run started: the reference model is reloaded from it
        room = model.config.max_position_embeddings - grpo.max_completion_length  # tokens a prompt may have
        self.prompt_ids = tokenizer.encode_all([self._text(row["prompt"]) for row in task.rows], "task's prompts",
                                               model_path or "the policy", room, task.sources)
        self.check_context(self.prompt_ids, "task's prompts", task.sources)
        self.eos_ids = tuple(tokenizer.eos_token_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.reference = None  # a frozen copy of the starting policy, only when the KL needs one
        if grpo.beta > 0:
            self.reference = _frozen_copy(reference if reference is not None else model)
        self.updater = Updater(model, self.reference, grpo, config, self.dist, self._padding_rollout(), self.pad_id)
        self.policy, self.optimizer = self.updater.policy, self.updater.optimizer  # sampling and checkpoints use them
        self.stream = PromptStream(len(task.rows), config.seed)
        self.step = 0
        model.gradient_checkpointing = config.gradient_checkpointing
        self.wall_seconds_before = 0.0  # the run's time in earlier processes, up to the checkpoint resumed from
        self.started = time.monotonic()

    # -- the loop -------------------------------------------------------------------------------
    def train(self, on_step=None, observer=None, start_stats: dict | None = None) -> None:
        """Steps up to max_steps (or stop_at_step). on_step(trainer) may return extra stats to log
        with the step, e.g. a held-out evaluation every few steps. The first step is shown to
        `observer` if one is given. `start_stats` (the accuracy before training, say) are logged as
        step 0 when the run starts from step 0."""
        if self.dist.is_main:  # rank 0 alone writes; the stats it logs are already reduced over ranks
            logger = MetricsLogger(self.config.output_dir, self.config.max_steps, self.step, self.config.progress_bar,
                                   self.config.report_to, start_stats)
        else:
            logger = NullLogger()
        first_step = self.step
        try:
            last = min(self.config.max_steps, self.config.stop_at_step or self.config.max_steps)
            while self.step < last:
                stats, examples = self.train_step(observer)
                observer = None
                if on_step is not None:
                    stats.update(on_step(self) or {})
                logger.log(self.step, stats)
                every = self.config.log_completions_every
                if every and self.step % every == 0:
                    logger.log_completions(self.step, examples)
                if self.config.save_every and self.step % self.config.save_every == 0:
                    self.save()
            if self.step > first_step and (not self.config.save_every or self.step % self.config.save_every):
                self.save()  # the last step, unless it was just saved (or this process took none)
        finally:
            logger.close()

    def train_step(self, observer=None) -> tuple[dict[str, float], list[dict]]:
        """One GRPO step, its stages numbered as in the README's diagram; (stats for the logger, a few
        completions with their rewards). An observer (trace.py) sees the rollouts after stage 3 and
        the update's stats after stage 4."""
        self.step += 1
        self._set_learning_rate()
        clock = Clock()
        sampled, trained, stats = self.collect(clock)  # stages 1-3, in as many rounds as dynamic sampling needs
        if observer is not None:
            observer.rollouts(self, sampled)
        with clock("update"):
            update = self.update(trained)  # 4. update: old/reference log-probs, then num_iterations AdamW steps
        if observer is not None:
            observer.updated(self, update)
        return {**stats, **update, "lr": self.optimizer.param_groups[0]["lr"], **clock.stats()}, self._examples(sampled)

    # -- stages 1-3 -----------------------------------------------------------------------------
    def collect(self, clock) -> tuple[list[Rollout], list[Rollout], dict[str, float]]:
        """Stages 1-3 for the step's batch: (every rollout sampled, the ones to train on, their stats).

        Dynamic sampling (DAPO) wraps stages 1-2: it samples new prompts for the groups whose rewards
        were all equal, up to max_sampling_rounds rounds; without it one round is the batch."""
        G, wanted = self.grpo.num_generations, self.config.batch_size // self.grpo.num_generations
        drop_flat = self.grpo.dynamic_sampling or self.grpo.drop_zero_variance_groups
        sampled, trained, flat_groups = [], [], 0
        for round_ in range(self.grpo.max_sampling_rounds if self.grpo.dynamic_sampling else 1):
            more = wanted - len(trained) // G if self.grpo.dynamic_sampling else wanted
            new = self.sample_and_score(self.stream.next(more), round_, clock)  # stages 1-2
            flat = zero_variance_groups(torch.tensor([r.reward for r in new]), G).tolist()  # (groups,)
            sampled, flat_groups = sampled + new, flat_groups + sum(flat)
            trained += [r for g, is_flat in enumerate(flat) if not (drop_flat and is_flat) for r in new[g * G : (g + 1) * G]]
            if len(trained) >= wanted * G:
                break
        self.advantages(trained)  # 3. advantages, over the batch that is trained on
        clock.seconds["sample"] = self.dist.max([clock.seconds["sample"]])[0]  # the step waits for the slowest rank
        return sampled, trained, {**reward_stats(sampled), **self._sampling_stats(sampled, trained, flat_groups, clock)}

    def sample_and_score(self, indices: list[int], round_: int, clock) -> list[Rollout]:
        """Stages 1-2 for these prompts: each rank samples and scores its own block of them, then every
        rank gets the whole round in prompt order, so what follows sees what one process would."""
        mine = indices[self.dist.block(len(indices))]
        with clock("sample"):
            rollouts = self.sample(mine, round_)  # 1. sample G completions per prompt
        with clock("verify"):
            self.score(rollouts, [self.task.rows[i] for i in mine])  # 2. verify: every reward of the task
        return [r for part in self.dist.gather(rollouts) for r in part]

    def sample(self, indices: list[int], round_: int) -> list[Rollout]:
        """Stage 1 on this rank's prompts: G rollouts per prompt, group by group."""
        G, samples = self.grpo.num_generations, self._sample(indices, round_)
        assert len(samples.tokens) == len(indices) * G, f"{len(samples.tokens)} completions for {len(indices)} prompts x {G}"
        return [
            Rollout(
                prompt_ids=self.prompt_ids[indices[p]], completion_ids=tokens, finish_reason=reason,
                in_loss=not (self.grpo.mask_truncated_completions and reason == "length"),
                sampler_logprobs=torch.tensor(logprobs, dtype=torch.float32),
            )
            for tokens, logprobs, reason, p in zip(samples.tokens, samples.logprobs, samples.finish_reasons, samples.prompt_indices)
        ]

    def _sample(self, indices: list[int], round_: int) -> Samples:
        """Stage 1 on this rank's prompts. Its seed depends on the rank: completions depend on how the
        prompts are cut across ranks (everything after sampling does not)."""
        rank = f"-rank{self.dist.rank}" if self.dist.rank else ""
        seed = random.Random(f"{self.config.seed}-{self.step}-{round_}{rank}").getrandbits(62)
        self.model.eval()
        with self.policy.gathered():  # FSDP2: every rank all-gathers the weights, then samples on its own
            if not indices:  # dynamic sampling may leave a rank nothing to sample this round
                return Samples(tokens=[], logprobs=[], finish_reasons=[], prompt_indices=[])
            return generate(self.model, [self.prompt_ids[i] for i in indices], self.grpo.sampling_config(),
                            eos_token_ids=self.eos_ids, seed=seed)

    def score(self, rollouts: list[Rollout], rows: list[dict]) -> None:
        """Stage 2: decode each completion and score it with every reward of the task, plus DAPO's overlong penalty."""
        for r in rollouts:
            r.text = self.tokenizer.decode_completion(r.completion_ids)
        if not rollouts:
            return
        result = compute_rewards([r.text for r in rollouts], self.task.columns(rows, self.grpo.num_generations), self.task.rewards)
        components, totals = dict(result.components), list(result.total)
        if self.grpo.overlong_buffer:
            components["overlong"] = [_overlong_penalty(len(r.completion_ids), self.grpo) for r in rollouts]
            totals = [t + p for t, p in zip(totals, components["overlong"])]
        for i, r in enumerate(rollouts):
            r.rewards, r.reward = {name: values[i] for name, values in components.items()}, totals[i]
            r.timed_out = result.timed_out[i]

    def advantages(self, rollouts: list[Rollout]) -> None:
        """Stage 3: each rollout's advantage, relative to its group (groups of equal rewards get exactly 0)."""
        if not rollouts:
            return
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)  # (N,)
        advantages = group_advantages(rewards, self.grpo.num_generations, self.grpo.scale_rewards)  # (N,)
        for r, a in zip(rollouts, advantages.tolist()):
            r.advantage = a

    def _sampling_stats(self, sampled: list[Rollout], trained: list[Rollout], flat_groups: int, clock) -> dict[str, float]:
        G, seconds = self.grpo.num_generations, max(clock.seconds["sample"], 1e-9)
        return {
            "groups/zero_variance_frac": flat_groups / max(len(sampled) // G, 1),
            "groups/trained": len(trained) // G,
            "groups/sampled": len(sampled) // G,
            "sampling/samples_per_s": len(sampled) / seconds,
            "sampling/tokens_per_s": sum(len(r.completion_ids) for r in sampled) / seconds,
        }

    # -- stage 4 --------------------------------------------------------------------------------
    def update(self, rollouts: list[Rollout]) -> dict[str, float]:
        """Stage 4: old and reference log-probs, then num_iterations AdamW steps (update.py)."""
        return self.updater(rollouts, self.step)

    def _padding_rollout(self) -> Rollout:
        """A rollout that weighs nothing (no token in the loss, advantage 0), for a rank's empty micro-batch."""
        zeros = torch.zeros(1)  # (1,) sampler, old and reference log-probs, never read: the token is masked
        return Rollout(prompt_ids=self.prompt_ids[0][:1], completion_ids=[self.pad_id], finish_reason="length",
                       in_loss=False, sampler_logprobs=zeros, old_logprobs=zeros, ref_logprobs=zeros)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self) -> str:
        """Write a checkpoint (rank 0) of the state every rank holds (whole weights and optimizer state
        gathered first under FSDP2); returns its directory on every rank."""
        weights, state = self.policy.weights(), self.state_dict()
        path = None
        if self.dist.is_main:
            path = checkpoint.save_checkpoint(self.config.output_dir, self.step, self.model, self.tokenizer, state,
                                                  self.config.save_total_limit, weights=weights)
        return self.dist.broadcast(path)  # no rank goes on before the checkpoint is complete

    def state_dict(self) -> dict:
        """Everything but the weights (STATE_KEYS, and wall_seconds); every rank must call it (it gathers)."""
        return {
            "step": self.step,
            "optimizer": self.policy.optimizer_state(self.optimizer),
            "data": self.stream.state(),
            "rng": self.dist.gather(checkpoint.rng_states()),  # one per rank
            "model_path": self.model_path,
            "configs": as_dict(self.grpo, self.config),
            "wall_seconds": self.wall_seconds(),  # the run's running total: a resume adds on, a killed process too
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.wall_seconds_before = float(state.get("wall_seconds", 0.0))  # 0: a checkpoint that predates it
        self.policy.load_optimizer_state(self.optimizer, state["optimizer"])
        for group in self.optimizer.param_groups:  # this run's settings, not the checkpoint's (lr is set per step)
            group.update(betas=self.config.adam_betas, eps=self.config.adam_epsilon, weight_decay=self.config.weight_decay)
        self.stream.load_state(state["data"])
        rng = state["rng"]  # one per rank
        if len(rng) == self.dist.world_size:
            checkpoint.set_rng_states(rng[self.dist.rank])
        else:  # nothing in the loop draws from them (its seeds derive from seed and step), so go on
            self.dist.print(f"note: the checkpoint holds RNG states of {len(rng)} ranks, this run has "
                            f"{self.dist.world_size}: global RNGs start afresh")

    # -- evaluation -----------------------------------------------------------------------------
    def initial_evaluation(self, measure, measured_on: dict) -> dict:
        """The starting policy's score, measured once per output_dir: a fresh run calls measure() and keeps
        {"initial_accuracy", "wall_seconds_before", "held_out": measured_on} in initial_eval.json; a resumed
        run reads it back (its policy is no longer the starting one). Every rank calls it (measure() is an
        evaluation they run together)."""
        saved = checkpoint.read_initial_evaluation(self.config.output_dir) if self.config.resume and self.dist.is_main else {}
        saved = self.dist.broadcast(saved)  # every rank takes the same branch below
        if saved.get("held_out") == measured_on:
            return saved
        if self.step > 0:  # the starting policy is gone: measuring now would compare the run with itself
            was = _described(saved["held_out"]) if saved.get("held_out") else "problems not recorded"
            raise ValueError(f"this run's accuracy before GRPO was measured on {was}, not on {_described(measured_on)}: "
                             "resume with the same held-out problems (or start a new output_dir), so that before and after "
                             "count the same problems")
        initial = {"initial_accuracy": measure(), "wall_seconds_before": 0.0, "held_out": measured_on}
        if self.dist.is_main:
            checkpoint.save_initial_evaluation(self.config.output_dir, initial)
        return initial

    def evaluate(self, problems, template, rewards=None, **settings) -> Evaluation:
        """evaluate.evaluate on held-out problems, each rank taking a block of them; every rank gets
        the result over all of them. Greedy results do not depend on the number of ranks; sampled
        ones (temperature > 0) do, as each rank seeds its own block."""
        mine = problems[self.dist.block(len(problems))]
        self.model.eval()
        with self.policy.gathered():
            results = evaluate(self.model, self.tokenizer, mine, template, rewards, **settings).results
        return summarize(sum(self.dist.gather(results), []), settings.get("samples", 1), settings.get("ks", ()))

    # -- helpers --------------------------------------------------------------------------------
    def _text(self, prompt) -> str:
        return prompt if isinstance(prompt, str) else self.tokenizer.apply_chat_template(prompt)

    def check_context(self, prompt_ids: list[list[int]], what: str, sources: list[str] | None = None) -> None:
        """Every prompt (the task's, or held-out ones) leaves room for max_completion_length new tokens;
        `sources` name them in an error ("data.jsonl, line 7")."""
        check_prompts(prompt_ids, self.grpo.sampling_config(), self.model.config.vocab_size,
                      self.model.config.max_position_embeddings, what, sources)

    def wall_seconds(self) -> float:
        """The run's wall time so far: this process's since the trainer was built, and that of the earlier
        processes up to the checkpoint it resumed from (a killed process's work past it is redone, and
        counted then)."""
        return self.wall_seconds_before + time.monotonic() - self.started

    def _set_learning_rate(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learning_rate_at(self.step)

    def _examples(self, rollouts: list[Rollout], count: int = 2) -> list[dict]:
        """The first completion of the first `count` groups, with its prompt and rewards."""
        return [
            {"prompt": self.tokenizer.decode(r.prompt_ids), "completion": r.text, "rewards": {**r.rewards, "total": r.reward}}
            for r in rollouts[: count * self.grpo.num_generations : self.grpo.num_generations]
        ]


def train(model_path: str, task: Task, grpo: GRPOConfig | None = None, config: TrainConfig | None = None,
          *, device: str = "cpu", dtype=None, on_step=None) -> Trainer:
    """Load the policy from `model_path` (a directory or Hub id), or with config.resume from the latest
    checkpoint in config.output_dir, and run GRPO up to config.max_steps."""
    trainer = build_trainer(model_path, task, grpo, config, device=device, dtype=dtype)
    trainer.train(on_step)
    return trainer


def build_trainer(model_path: str, task: Task, grpo: GRPOConfig | None = None, config: TrainConfig | None = None,
                  *, device: str = "cpu", dtype=None) -> Trainer:
    """The Trainer `train` runs, restored from the latest intact checkpoint when config.resume is set (a
    resume that names another model_path than the run started from is refused). examples/train_math.py
    uses it to evaluate before training."""
    grpo, config = grpo or GRPOConfig(), config or TrainConfig()
    parse_device(device)  # an unknown device, or a GPU this machine lacks, is refused before anything starts
    dist = distributed.setup(device)  # under torchrun: join the process group, take this rank's device
    config.check_against(grpo, dist.world_size)
    resume_from = _resume_point(config, model_path, dist)
    saved = None if resume_from is None else checkpoint.load_state(resume_from)
    if saved is not None:
        _check_same_start(saved["model_path"], model_path, resume_from, dist.print)
    device = dist.device  # each rank's own GPU under torchrun
    model, tokenizer = load_pretrained(resume_from or model_path, dtype=dtype, device=device)
    if tokenizer is None:
        raise ValueError(f"{resume_from or model_path} has no tokenizer.json: the trainer needs one to decode completions")
    reference = None
    if resume_from is not None and grpo.beta > 0:  # the KL is to the model the run started from
        reference = load_pretrained(model_path, dtype=dtype, device=device)[0]
    trainer = Trainer(model, tokenizer, task, grpo, config, model_path=model_path, reference=reference, dist=dist)
    if saved is not None:
        for note in changed_settings(saved["configs"], as_dict(grpo, config)):
            dist.print(note)
        trainer.load_state_dict(saved)
        dist.print(f"resuming from {resume_from} (step {trainer.step})")
    return trainer


# -- helpers of build_trainer and the stages -------------------------------------------------
def _resume_point(config: TrainConfig, model_path: str, dist: distributed.Dist) -> str | None:
    """The checkpoint to resume from (None: start from model_path); an earlier run's checkpoints without
    config.resume are refused, and what a killed save or prune left is removed."""
    latest = dist.broadcast(checkpoint.latest_checkpoint(config.output_dir))  # rank 0's view of output_dir
    if latest and not config.resume:
        raise ValueError(f"{config.output_dir} already holds checkpoints of an earlier run (latest: {latest}); "
                         "resume it (resume=True, --resume) or choose another output directory")
    if not config.resume:
        return None
    if latest and not os.path.isdir(latest):
        raise ValueError(f"rank {dist.rank} cannot see {latest}, the checkpoint rank 0 resumes from: "
                         "output_dir must be on a file system that every node sees")
    if dist.is_main:  # a resume with no step left to take saves nothing, so clean up here
        checkpoint.remove_leftovers(config.output_dir)
    if not latest:
        dist.print(f"note: nothing to resume in {config.output_dir}; starting from {model_path}")
        return None
    # the newest checkpoint that reads back; rank 0 checks, and says what it skips
    intact = checkpoint.latest_intact_checkpoint(config.output_dir, dist.print, STATE_KEYS) if dist.is_main else None
    resume_from = dist.broadcast(intact)
    if resume_from is None:
        raise ValueError(f"every checkpoint in {config.output_dir} is damaged (see the notes above); nothing to resume")
    return resume_from


def _check_same_start(saved_model: str, model_path: str, resume_from: str, note) -> None:
    """A resume names the model its run started from: the KL reference and the summary are that model's.
    A Trainer built from a model in memory (model_path "") recorded none: that is said, not refused."""
    if not saved_model:
        note(f"note: {resume_from} does not record the model its run started from; the KL reference is {model_path}")
        return
    same_directory = os.path.isdir(saved_model) and os.path.isdir(model_path) and os.path.samefile(saved_model, model_path)
    if saved_model != model_path and not same_directory:
        raise ValueError(f"{resume_from} continues a run that started from {saved_model}, not {model_path}: resume "
                         f"with that model (--model {saved_model}), whose KL reference and summary the run keeps, "
                         "or start a new output_dir")


def _described(settings: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in settings.items())


def _frozen_copy(model):
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


def _overlong_penalty(length: int, grpo: GRPOConfig) -> float:
    """DAPO's soft overlong punishment: 0 up to L - buffer tokens, then down linearly to -penalty at L."""
    free = grpo.max_completion_length - grpo.overlong_buffer
    return -grpo.overlong_penalty * max(0, length - free) / grpo.overlong_buffer


def reward_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """The logger's reward and length stats over rollouts: reward/mean, reward/accuracy/mean, ..."""
    if not rollouts:
        return {}
    components = {name: [r.rewards[name] for r in rollouts] for name in rollouts[0].rewards}
    timed_out = [r.timed_out for r in rollouts]
    return {**Rewards([r.reward for r in rollouts], components, timed_out).stats(), **completion_stats(rollouts)}
