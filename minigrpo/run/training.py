"""Around the loop, a run: a Trainer started fresh or resumed from its output_dir, driven step by step
to the end, each step logged, checkpoints saved on the save cadence, and the starting policy's score,
measured once per run.

In: a model (a directory or Hub id), a Task, the configs, and what output_dir holds from earlier
processes: checkpoints and initial_eval.json. Out: a `Run` (its Trainer at the step of the latest
intact checkpoint, or at step 0), metrics.jsonl, checkpoints, the run's wall time across processes.
It knows when to save and how a resume is checked; checkpoint.py reads and writes the files (the
format of trainer_state.pt included), and one step is trainer.py's.
"""

from __future__ import annotations

import os
import time

from .. import distributed, files
from ..config import GRPOConfig, TrainConfig, as_dict, parse_lora_targets
from ..model import load_pretrained, parse_device
from ..tasks import Task
from . import checkpoint
from .evaluation import Evaluation, evaluate, summarize
from .metrics import MetricsLogger, NullLogger
from .trainer import Trainer

STATE_KEYS = checkpoint.STATE_KEYS  # what a resume reads: a checkpoint that lacks one is damaged


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
    resume_from = _resume_point(config, model_path, dist)
    saved = None if resume_from is None else checkpoint.load_state(resume_from)
    if saved is not None:
        _check_same_start(saved["model_path"], model_path, resume_from, dist.print)
        _check_same_adapters(saved["configs"], config, resume_from)
    device = dist.device  # each rank's own GPU under torchrun
    model, tokenizer = load_pretrained(resume_from or model_path, dtype=dtype, device=device)
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
    if saved is None:
        return Run(trainer)
    _check_same_base(saved.get("base_sha256"), trainer, resume_from)
    _check_same_teacher(saved.get("teacher_sha256"), trainer, resume_from)
    for note in changed_settings(saved["configs"], as_dict(grpo, config)):
        dist.print(note)
    wall_seconds_before = checkpoint.restore(trainer, saved)
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
        saved = trainer.step  # the last step a checkpoint holds (or the start)
        save_every = config.save_every
        data = trainer.stream.state()
        try:
            last = min(config.max_steps, config.stop_at_step or config.max_steps)
            while trainer.step < last:
                data = trainer.stream.state()  # the prompt stream before this step: a failure goes back to it
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
                    saved = trainer.step
            if trainer.step > first_step and (not save_every or trainer.step % save_every):
                self.save()  # the last step, unless it was just saved (or this process took none)
        except Exception as error:
            self._save_after_failure(error, saved, data)
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
            )
        return trainer.dist.broadcast(path)  # no rank goes on before the checkpoint is complete

    def wall_seconds(self) -> float:
        """The run's wall time so far: this process's since the Run began, and that of the earlier
        processes up to the checkpoint it resumed from."""
        return self.wall_seconds_before + time.monotonic() - self.started

    def _save_after_failure(self, error: Exception, saved: int, data: dict) -> None:
        """After an exception in `train`: a checkpoint of the last step whose update completed, so that a
        resume goes on from there, unless one holds it already. Not after a failure inside an update (its
        weights are neither step's, or NaN), nor a full disk, nor under torchrun, where the other ranks
        may not have failed and a save waits for all of them. A failure in stages 1-3 of a step leaves
        the weights of the step before: the step and the prompt stream (`data`) go back to it."""
        trainer = self.trainer
        updated = trainer.updated_step
        if updated is None or updated == saved or isinstance(error, files.DiskFull):
            return
        if trainer.dist.world_size > 1:  # (a rank that saves alone would wait for the others for ever)
            return
        if updated < trainer.step:
            trainer.go_back(updated, data)
        self.save()


def evaluate_held_out(trainer: Trainer, problems, template, rewards=None, **settings) -> Evaluation:
    """evaluation.evaluate of the trainer's policy on held-out problems, each rank taking a block of them;
    every rank gets the result over all of them. Greedy results do not depend on the number of ranks;
    sampled ones (temperature > 0) do, as each rank seeds its own block."""
    mine = trainer.dist.block_of(problems)
    trainer.model.eval()
    with trainer.policy.gathered():
        results = evaluate(trainer.model, trainer.tokenizer, mine, template, rewards, **settings).results
    return summarize(trainer.dist.gather_joined(results), settings.get("samples", 1), settings.get("ks", ()))


def initial_evaluation(trainer: Trainer, measure, measured_on: dict) -> dict:
    """The starting policy's score, measured once per output_dir: a fresh run calls measure(), which
    returns held-out stats ({"eval/accuracy": ..., and others such as "held_out/step_accuracy"}), and
    keeps {"initial_accuracy", "initial_stats", "wall_seconds_before", "held_out": measured_on} in
    initial_eval.json; a resumed run reads it back (its policy is no longer the starting one). Every
    rank calls it (measure() is an evaluation they run together)."""
    config = trainer.config
    dist = trainer.dist
    saved = {}
    if config.resume and dist.is_main:
        saved = checkpoint.read_initial_evaluation(config.output_dir)
    saved = dist.broadcast(saved)  # every rank takes the same branch below
    if saved.get("held_out") == measured_on:
        return saved
    if trainer.step > 0:  # the starting policy is gone: measuring now would compare the run with itself
        was = _described(saved["held_out"]) if saved.get("held_out") else "problems not recorded"
        raise ValueError(
            f"this run's accuracy before GRPO was measured on {was}, not on "
            f"{_described(measured_on)}: resume with the same held-out problems and tools (or start "
            "a new output_dir), so that before and after measure the same thing"
        )
    stats = measure()
    initial = {
        "initial_accuracy": stats["eval/accuracy"],
        "initial_stats": stats,
        "wall_seconds_before": 0.0,
        "held_out": measured_on,
    }
    if dist.is_main:
        checkpoint.save_initial_evaluation(config.output_dir, initial)
    return initial


def _resume_point(config: TrainConfig, model_path: str, dist: distributed.Dist) -> str | None:
    """The checkpoint to resume from (None: start from model_path); an earlier run's checkpoints without
    config.resume are refused, and what a killed save or prune left is removed."""
    latest = dist.broadcast(checkpoint.latest_checkpoint(config.output_dir))  # rank 0's view of output_dir
    if latest and not config.resume:
        raise ValueError(
            f"{config.output_dir} already holds checkpoints of an earlier run "
            f"(latest: {latest}); resume it (resume=True, --resume) or choose another output "
            "directory"
        )
    if not config.resume:
        return None
    if latest and not os.path.isdir(latest):
        raise ValueError(
            f"rank {dist.rank} cannot see {latest}, the checkpoint rank 0 resumes from: "
            "output_dir must be on a file system that every node sees"
        )
    if dist.is_main:  # a resume with no step left to take saves nothing, so clean up here
        checkpoint.remove_leftovers(config.output_dir)
    if not latest:
        dist.print(f"note: nothing to resume in {config.output_dir}; starting from {model_path}")
        return None
    intact = None  # the newest checkpoint that reads back; rank 0 checks, and says what it skips
    if dist.is_main:
        intact = checkpoint.latest_intact_checkpoint(config.output_dir, dist.print, STATE_KEYS)
    resume_from = dist.broadcast(intact)
    if resume_from is None:
        raise ValueError(
            f"every checkpoint in {config.output_dir} is damaged (see the notes above); nothing to resume"
        )
    return resume_from


def _check_same_start(saved_model: str, model_path: str, resume_from: str, note) -> None:
    """A resume names the model its run started from: the KL reference and the summary are that
    model's. A Trainer built from a model in memory (model_path "") recorded none: that is said, not
    refused."""
    if not saved_model:
        note(
            f"note: {resume_from} does not record the model its run started from; the KL reference is "
            f"{model_path}"
        )
        return
    both_directories = os.path.isdir(saved_model) and os.path.isdir(model_path)
    same_directory = both_directories and os.path.samefile(saved_model, model_path)
    if saved_model != model_path and not same_directory:
        raise ValueError(
            f"{resume_from} continues a run that started from {saved_model}, not "
            f"{model_path}: resume with that model (--model {saved_model}), whose KL reference "
            "and summary the run keeps, or start a new output_dir"
        )


LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_target_modules", "use_rslora")  # what an adapter is


def _check_same_adapters(saved: dict, config: TrainConfig, resume_from: str) -> None:
    """A resume trains the adapters its checkpoint holds (or every weight, as it did): a changed
    lora_rank, alpha, targets or scale would wrap other adapters over them, or drop them."""
    before = saved.get("TrainConfig", {})
    for name in LORA_SETTINGS:
        old = before.get(name, getattr(TrainConfig, name))  # a checkpoint older than LoRA: its default
        new = getattr(config, name)
        if name == "lora_target_modules":
            old, new = parse_lora_targets(old), parse_lora_targets(new)
        if old != new:
            raise ValueError(
                f"{resume_from} was trained with {name}={old!r}, and this run asks for {new!r}: resume "
                "with the checkpoint's LoRA settings, or start a new output_dir (a run can start from "
                "the checkpoint's adapters with --model)"
            )


def _check_same_base(recorded: str | None, trainer: Trainer, resume_from: str) -> None:
    """A LoRA checkpoint's adapters continue on the base whose weights' sha256 it recorded: a base
    changed in place since (trained on, converted, another revision of a Hub id) would take them on
    silently. A checkpoint that records none (trained whole, or older) is not checked."""
    if recorded is not None and trainer.base_sha256 != recorded:
        raise ValueError(
            f"{resume_from} trained adapters on {trainer.model.name_or_path}, whose weights have changed "
            "since (their sha256 differs from the one the checkpoint records): put the base back as it "
            "was, or start a new output_dir"
        )


def _check_same_teacher(recorded: str | None, trainer: Trainer, resume_from: str) -> None:
    """A distilling run resumes with the teacher it was distilled from: the teacher is reloaded from
    teacher_model, never saved, so its weights' sha256 must be the one the checkpoint records. A run
    that had no teacher, or a resume without one, is a change of settings, said by changed_settings."""
    current = trainer.teacher_sha256
    if recorded is not None and current is not None and current != recorded:
        raise ValueError(
            f"{resume_from} was distilled from a teacher whose weights have changed since: "
            f"{trainer.grpo.teacher_model} is not that teacher (the sha256 of its weights as loaded, in "
            "this run's dtype, differs from the one the checkpoint records); resume with the same teacher "
            "and dtype, or start a new output_dir"
        )


def _described(settings: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in settings.items())


def changed_settings(saved: dict, current: dict) -> list[str]:
    """What a resumed run changed from its checkpoint's settings (as_dict of both), a note each: allowed
    (a longer run, say) but never silent. Settings of the process rather than of the training are skipped."""
    ignored = {
        "resume",
        "stop_at_step",
        "progress_bar",
        "log_completions_every",
        "save_every",
        "output_dir",
        "report_to",
    }
    notes = []
    for section, values in current.items():
        for key, value in values.items():
            old = saved.get(section, {}).get(key, value)
            if (
                key not in ignored
                and old != value
                and not (isinstance(old, (list, tuple)) and tuple(old) == tuple(value))
            ):
                notes.append(
                    f"note: resuming with {section}.{key} = {value!r}; "
                    f"the checkpoint was trained with {old!r}"
                )
    return notes
