"""Around the loop, a run: a Trainer started fresh or resumed from its output_dir, and the starting
policy's score, measured once per run.

In: a model (a directory or Hub id), a Task, the configs, and what output_dir holds from earlier
processes: checkpoints (Trainer.save writes them) and initial_eval.json. Out: a Trainer at the
step of the latest intact checkpoint, or at step 0, and the accuracy before training. It knows
what a checkpoint's trainer_state.pt holds and how a resume checks it; checkpoint.py reads and
writes the files, and the loop itself is trainer.py's.
"""

from __future__ import annotations

import os

from . import checkpoint, distributed
from .config import GRPOConfig, TrainConfig, as_dict
from .tasks import Task
from .trainer import Trainer
from .weights import load_pretrained, parse_device

# The keys of Trainer.state_dict that a resume reads: a checkpoint whose trainer_state.pt lacks one
# is damaged.
STATE_KEYS = ("step", "optimizer", "data", "rng", "model_path", "configs")


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
    trainer = build_trainer(model_path, task, grpo, config, device=device, dtype=dtype)
    trainer.train(on_step)
    return trainer


def build_trainer(
    model_path: str,
    task: Task,
    grpo: GRPOConfig | None = None,
    config: TrainConfig | None = None,
    *,
    device: str = "cpu",
    dtype=None,
) -> Trainer:
    """The Trainer `train` runs, restored from the latest intact checkpoint when config.resume is set (a
    resume that names another model_path than the run started from is refused). examples/train_math.py
    uses it to evaluate before training."""
    grpo = grpo or GRPOConfig()
    config = config or TrainConfig()
    parse_device(device)  # an unknown device, or a GPU this machine lacks, is refused before all else
    dist = distributed.setup(device)  # under torchrun: join the process group, take this rank's device
    config.check_against(grpo, dist.world_size)
    resume_from = _resume_point(config, model_path, dist)
    saved = None if resume_from is None else checkpoint.load_state(resume_from)
    if saved is not None:
        _check_same_start(saved["model_path"], model_path, resume_from, dist.print)
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
    if saved is not None:
        for note in changed_settings(saved["configs"], as_dict(grpo, config)):
            dist.print(note)
        restore(trainer, saved)
        dist.print(f"resuming from {resume_from} (step {trainer.step})")
    return trainer


def restore(trainer: Trainer, state: dict) -> None:
    """Trainer.state_dict read back: the step, AdamW's state under this run's AdamW settings, the
    prompt stream's position and this rank's RNG states."""
    trainer.step = state["step"]
    trainer.wall_seconds_before = float(state.get("wall_seconds", 0.0))  # 0 when the checkpoint has none
    trainer.policy.load_optimizer_state(trainer.optimizer, state["optimizer"])
    config = trainer.config
    # this run's AdamW settings, not the checkpoint's (the learning rate is set per step)
    for group in trainer.optimizer.param_groups:
        group.update(betas=config.adam_betas, eps=config.adam_epsilon, weight_decay=config.weight_decay)
    trainer.stream.load_state(state["data"])
    rng = state["rng"]  # one per rank
    dist = trainer.dist
    if len(rng) == dist.world_size:
        checkpoint.set_rng_states(rng[dist.rank])
    else:  # nothing in the loop draws from them (its seeds derive from seed and step), so go on
        dist.print(
            f"note: the checkpoint holds RNG states of {len(rng)} ranks, this run has "
            f"{dist.world_size}: global RNGs start afresh"
        )


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
