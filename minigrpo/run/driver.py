"""Around the loop, a run: a Trainer started fresh or resumed from its output_dir, driven step by step
to the end, each step logged, and checkpoints saved on the save cadence.

In: a model (a directory or Hub id), a Task, the configs, and the checkpoints output_dir holds from
earlier processes. Out: a `Run` (its Trainer at the step of the latest intact checkpoint, or at step
0), metrics.jsonl, checkpoints, the run's wall time across processes. It knows when to save; resume.py
says where a resume goes on from and checks it, checkpoint.py reads and writes the files (the format of
trainer_state.pt included), and one step is trainer.py's. The starting policy's score, measured once
per run, is evaluation.py's.
"""

from __future__ import annotations

import time

from .. import distributed, files
from ..config import GRPOConfig, TrainConfig, as_dict
from ..model import load_pretrained, parse_device
from ..tasks import Task
from . import checkpoint, resume
from .metrics import MetricsLogger, NullLogger
from .trainer import Trainer


def train(
    model_path: str,
    task: Task,
    grpo: GRPOConfig | None = None,
    config: TrainConfig | None = None,
    *,
    device: str = "cpu",
    dtype=None,
    on_step=None,
) -> Trainer:
    """Load the policy from `model_path` (a directory or Hub id), or with config.resume from the latest
    checkpoint in config.output_dir, and run GRPO up to config.max_steps."""
    run = build_run(model_path, task, grpo, config, device=device, dtype=dtype)
    run.train(on_step)
    return run.trainer


def build_run(
    model_path: str,
    task: Task,
    grpo: GRPOConfig | None = None,
    config: TrainConfig | None = None,
    *,
    device: str = "cpu",
    dtype=None,
) -> Run:
    """The Run `train` runs, its Trainer restored from the latest intact checkpoint when config.resume is
    set (a resume that names another model_path than the run started from is refused).
    examples/train_math.py uses it to evaluate before training."""
    grpo = grpo or GRPOConfig()
    config = config or TrainConfig()
    parse_device(device)  # an unknown device, or a GPU this machine lacks, is refused before all else
    dist = distributed.setup(device)  # under torchrun: join the process group, take this rank's device
    config.check_against(grpo, dist.world_size)
    resume_from = resume.resume_point(config, model_path, dist)
    state = None if resume_from is None else checkpoint.load_state(resume_from)
    if state is not None:
        resume.check_same_start(state["model_path"], model_path, resume_from, dist.print)
        resume.check_same_adapters(state["configs"], config, resume_from)
    device = dist.device  # each rank's own GPU under torchrun
    model, tokenizer = load_pretrained(
        resume_from or model_path,
        dtype=dtype,
        device=device,
        gradient_checkpointing=config.gradient_checkpointing,
    )
    if tokenizer is None:
        raise ValueError(
            f"{resume_from or model_path} has no tokenizer.json: the trainer needs one to decode completions"
        )
    reference = None
    if resume_from is not None and grpo.beta > 0:  # the KL is to the model the run started from
        reference = load_pretrained(model_path, dtype=dtype, device=device)[0]
    trainer = Trainer(
        model, tokenizer, task, grpo, config, model_path=model_path, reference=reference, dist=dist
    )
    if state is None:
        return Run(trainer)
    resume.check_same_base(state.get("base_sha256"), trainer.plan, resume_from)
    resume.check_same_teacher(state.get("teacher_sha256"), trainer.plan, grpo.teacher_model, resume_from)
    for note in resume.changed_settings(state["configs"], as_dict(grpo, config)):
        dist.print(note)
    wall_seconds_before = checkpoint.restore(trainer, state)
    dist.print(f"resuming from {resume_from} (step {trainer.step})")
    return Run(trainer, wall_seconds_before)


class Run:
    """A Trainer's run: its steps up to max_steps (or stop_at_step), each logged, checkpoints on the save
    cadence and at the end, and the run's wall time, this process's and the earlier ones' up to the
    checkpoint it resumed from (a killed process's work past it is redone, and counted then)."""

    def __init__(self, trainer: Trainer, wall_seconds_before: float = 0.0):
        self.trainer = trainer
        self.wall_seconds_before = wall_seconds_before
        self.started = time.monotonic()

    def train(self, on_step=None, observer=None, start_stats: dict | None = None) -> None:
        """Steps up to max_steps (or stop_at_step). on_step(trainer) may return extra stats to log with
        the step, e.g. a held-out evaluation every few steps. The first step is shown to `observer` if one
        is given. `start_stats` (the accuracy before training, say) are logged as step 0 when the run
        starts from step 0. An exception leaves the last completed step saved (`_save_after_failure`)."""
        trainer = self.trainer
        config = trainer.config
        logger = NullLogger()
        if trainer.dist.is_main:  # rank 0 alone writes; the stats it logs are already reduced over ranks
            logger = MetricsLogger(
                config.output_dir,
                config.max_steps,
                trainer.step,
                config.progress_bar,
                config.report_to,
                start_stats,
            )
        first_step = trainer.step
        saved_step = trainer.step  # the last step a checkpoint holds (or the start)
        save_every = config.save_every
        stream_before = trainer.stream.state()
        try:
            last = min(config.max_steps, config.stop_at_step or config.max_steps)
            while trainer.step < last:
                stream_before = trainer.stream.state()  # a failure in this step goes back to it
                stats, examples = trainer.train_step(observer)
                observer = None
                if on_step is not None:
                    stats.update(on_step(trainer) or {})
                logger.log(trainer.step, stats)
                every = config.log_completions_every
                if every and trainer.step % every == 0:
                    logger.log_completions(trainer.step, examples)
                if save_every and trainer.step % save_every == 0:
                    self.save()
                    saved_step = trainer.step
            if trainer.step > first_step and (not save_every or trainer.step % save_every):
                self.save()  # the last step, unless it was just saved (or this process took none)
        except Exception as error:
            self._save_after_failure(error, saved_step, stream_before)
            raise
        finally:
            logger.close()

    def save(self) -> str:
        """Write a checkpoint (rank 0) of the state every rank holds (whole weights and optimizer state
        gathered first under FSDP2); returns its directory on every rank."""
        trainer = self.trainer
        weights = trainer.policy.weights()
        state = checkpoint.trainer_state(trainer, self.wall_seconds())
        path = None
        if trainer.dist.is_main:
            path = checkpoint.save_checkpoint(
                trainer.config.output_dir,
                trainer.step,
                trainer.model,
                trainer.tokenizer,
                state,
                trainer.config.save_total_limit,
                weights=weights,
                base=trainer.plan.base_path,
            )
        return trainer.dist.broadcast(path)  # no rank goes on before the checkpoint is complete

    def wall_seconds(self) -> float:
        """The run's wall time so far: this process's since the Run began, and that of the earlier
        processes up to the checkpoint it resumed from."""
        return self.wall_seconds_before + time.monotonic() - self.started

    def _save_after_failure(self, error: Exception, saved_step: int, stream_before: dict) -> None:
        """After an exception in `train`: a checkpoint of the last step whose update completed, so that a
        resume goes on from there, unless one holds it already. Not after a failure inside an update (its
        weights are neither step's, or NaN), nor a full disk, nor under torchrun, where the other ranks
        may not have failed and a save waits for all of them. A failure in stages 1-3 of a step leaves
        the weights of the step before: the step and the prompt stream (`stream_before`) go back to it."""
        trainer = self.trainer
        updated = trainer.updated_step
        if updated is None or updated == saved_step or isinstance(error, files.DiskFull):
            return
        if trainer.dist.world_size > 1:  # (a rank that saves alone would wait for the others for ever)
            return
        if updated < trainer.step:
            trainer.go_back(updated, stream_before)
        self.save()
