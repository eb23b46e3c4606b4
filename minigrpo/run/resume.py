"""Around the loop, a resume: the checkpoint a run goes on from, and the checks that it goes on as the run
it continues (the same starting model, the same adapters on the same base, the same teacher), with a
note for each setting it changed.

In: TrainConfig (output_dir, resume), the model a run names, a checkpoint's trainer_state.pt as
checkpoint.load_state reads it, and the plan of the trainer built to resume it (plan.py). Out: the
checkpoint's directory or None, a one-line ValueError for a resume that would train something else,
and the notes. It knows what a checkpoint records, not how a step runs; driver.py calls it before it
builds the Trainer, and after, against what the Trainer's plan decided.
"""

from __future__ import annotations

import os

from .. import distributed
from ..config import TrainConfig, parse_lora_targets
from . import checkpoint
from .plan import TrainingPlan

STATE_KEYS = checkpoint.STATE_KEYS  # what a resume reads: a checkpoint that lacks one is damaged


def resume_point(config: TrainConfig, model_path: str, dist: distributed.Dist) -> str | None:
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


def check_same_start(saved_model: str, model_path: str, resume_from: str, note) -> None:
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


def check_same_adapters(saved: dict, config: TrainConfig, resume_from: str) -> None:
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


def check_same_base(recorded: str | None, plan: TrainingPlan, resume_from: str) -> None:
    """A LoRA checkpoint's adapters continue on the base whose weights' sha256 it recorded: a base
    changed in place since (trained on, converted, another revision of a Hub id) would take them on
    silently. A checkpoint that records none (trained whole, or older) is not checked."""
    if recorded is not None and plan.base_sha256 != recorded:
        raise ValueError(
            f"{resume_from} trained adapters on {plan.base_path}, whose weights have changed "
            "since (their sha256 differs from the one the checkpoint records): put the base back as it "
            "was, or start a new output_dir"
        )


def check_same_teacher(
    recorded: str | None, plan: TrainingPlan, teacher_model: str, resume_from: str
) -> None:
    """A distilling run resumes with the teacher it was distilled from: the teacher is reloaded from
    teacher_model, never saved, so its weights' sha256 must be the one the checkpoint records. A run
    that had no teacher, or a resume without one, is a change of settings, said by changed_settings."""
    current = plan.teacher_sha256
    if recorded is not None and current is not None and current != recorded:
        raise ValueError(
            f"{resume_from} was distilled from a teacher whose weights have changed since: "
            f"{teacher_model} is not that teacher (the sha256 of its weights as loaded, in "
            "this run's dtype, differs from the one the checkpoint records); resume with the same teacher "
            "and dtype, or start a new output_dir"
        )


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
