"""End of the loop, metrics: what each step did, for people and for plots.

In: a flat dict of floats per step, named with slashes (reward/mean, clip/low_frac, time/sample);
now and then a few completions with their rewards. Out: one JSON line per step in
output_dir/metrics.jsonl, one console line, a tqdm progress bar, and with report_to the same
names as TensorBoard scalars or a wandb run (offline) in output_dir. It writes what it is handed,
unchanged, and knows nothing of how the numbers were made (but for `Clock`, which times the stages, and
`reward_stats`, which reads the rollouts' rewards as the verifier's `Rewards` summarises them).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from tqdm import tqdm

from ..config import check_report_to
from ..files import disk_full_named, replaced_whole
from ..rollout import Rollout, completion_stats
from ..verifier import Rewards

CONSOLE = [  # (key, label, format) of the console line, in order; missing keys are left out
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/accuracy/mean", "acc", "{:.3f}"),  # left out when it is the only reward (then it is `reward`)
    ("eval/accuracy", "held-out", "{:.3f}"),
    ("held_out/step_accuracy", "steps ok", "{:.3f}"),  # with checkable arithmetic steps only
    ("held_out/unfaithful_frac", "unfaithful", "{:.3f}"),
    ("groups/zero_variance_frac", "flat", "{:.2f}"),
    ("completion/length_mean", "len", "{:.0f}"),
    ("tools/calls_per_completion", "calls", "{:.2f}"),  # with tools only
    ("loss", "loss", "{:+.4f}"),
    ("kl", "kl", "{:.4f}"),
    ("distill/reverse_kl", "rkl", "{:.4f}"),  # with a teacher only: the reverse KL to it
    ("entropy", "ent", "{:.2f}"),
    ("clip/region_frac", "clip", "{:.3f}"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("lr", "lr", "{:.1e}"),
    ("time/step", "s", "{:.1f}"),
]


class MetricsLogger:
    def __init__(
        self,
        output_dir: str,
        max_steps: int,
        start_step: int,
        progress_bar: bool = True,
        report_to: str = "none",
        start_stats: dict | None = None,
    ):
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.jsonl")
        # step 0's line, written by this logger like every other
        first = start_stats if start_step == 0 else None
        # a resume rewrites what followed its checkpoint
        _drop_lines_after(self.path, start_step if first is None else -1)
        # unbuffered: _write leaves its whole line on file, or none
        self.file = open(self.path, "ab", buffering=0)
        self.bar = tqdm(
            total=max_steps, initial=start_step, unit="step", dynamic_ncols=True, disable=not progress_bar
        )
        check_report_to(report_to)
        self.reporter = (
            REPORTERS[report_to](output_dir, start_step if first is None else -1)
            if report_to != "none"
            else None
        )
        if first:
            self._write(0, first)

    def _write(self, step: int, stats: dict[str, float]) -> None:
        line = (json.dumps({"step": step, **stats}) + "\n").encode("utf-8")
        size = os.fstat(self.file.fileno()).st_size
        with disk_full_named(self.path):
            try:
                while line:
                    line = line[self.file.write(line) :]  # a write may take part of it
            except BaseException:
                os.truncate(self.path, size)  # no line cut short is left behind (shrinking needs no space)
                raise
        if self.reporter:
            self.reporter.log(step, stats)

    def log(self, step: int, stats: dict[str, float]) -> None:
        self._write(step, stats)
        self.bar.update(1)
        self.bar.write(console_line(step, stats))

    def log_completions(self, step: int, examples: list[dict]) -> None:
        for example in examples:
            rewards = ", ".join(f"{k} {v:.2f}" for k, v in example["rewards"].items())
            self.bar.write(
                f"--- step {step} | {rewards}\n{example['prompt'][-200:]}\n>>> {example['completion'][:600]}"
            )

    def close(self) -> None:
        self.bar.close()
        self.file.close()
        if self.reporter:
            self.reporter.close()


class TensorBoard:
    """Each step's stats as scalars of the same names, in output_dir's event files; a resumed run
    drops the events after its checkpoint, as metrics.jsonl drops those lines."""

    def __init__(self, output_dir: str, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(output_dir, purge_step=start_step + 1)

    def log(self, step: int, stats: dict[str, float]) -> None:
        for name, value in stats.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """Each step's stats logged to a wandb run in offline mode, in output_dir/wandb (`wandb sync` uploads
    it)."""

    def __init__(self, output_dir: str, start_step: int):
        import wandb

        self.run = wandb.init(project="minigrpo", dir=output_dir, mode="offline")

    def log(self, step: int, stats: dict[str, float]) -> None:
        self.run.log(stats, step=step)

    def close(self) -> None:
        self.run.finish()


REPORTERS = {"tensorboard": TensorBoard, "wandb": Wandb}


class Clock:
    """Seconds per stage of one step, for the logger: `with clock("sample"):` adds to time/sample."""

    def __init__(self):
        self.seconds = {"sample": 0.0, "verify": 0.0}
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        yield
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def add(self, stage: str, seconds: float) -> None:
        """Seconds spent inside another stage's (time/warmup: the sampler's graph captures)."""
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def stats(self) -> dict[str, float]:
        return {
            **{f"time/{k}": v for k, v in self.seconds.items()},
            "time/step": time.perf_counter() - self.started,
        }


class NullLogger:
    """What ranks other than 0 log: nothing (rank 0 logs stats already reduced over every rank)."""

    def log(self, step: int, stats: dict[str, float]) -> None:
        pass

    def log_completions(self, step: int, examples: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


def console_line(step: int, stats: dict[str, float]) -> str:
    parts = [f"step {step}"]
    components = [k for k in stats if k.startswith("reward/") and k.endswith("/mean") and k != "reward/mean"]
    only_accuracy = components == ["reward/accuracy/mean"]
    shown = [
        (k, label, fmt) for k, label, fmt in CONSOLE if k in stats and not (only_accuracy and label == "acc")
    ]
    parts += [f"{label} {fmt.format(stats[key])}" for key, label, fmt in shown]
    if stats.get("update/no_groups"):
        parts.append("SKIPPED (no group with a reward signal)")
    elif stats.get("skipped"):
        parts.append("SKIPPED (non-finite loss or gradient)")
    return " | ".join(parts)


def _drop_lines_after(path: str, step: int) -> None:
    """Keep the lines of steps <= `step`; a line that is not a step's record (cut short by a crash, or
    not a JSON object with an integer step) is named and dropped. The file is replaced whole
    (files.replaced_whole), never truncated in place: a kill at any moment leaves the old or the new
    one."""
    if os.path.exists(path + ".tmp"):  # the temporary file of a trim killed before its rename
        os.remove(path + ".tmp")
    if not os.path.exists(path):
        return
    kept = []
    total = 0
    with open(path, encoding="utf-8") as f:
        for total, line in enumerate(f, 1):
            logged = _step_of(line)
            if logged is None:
                print(f"note: {path} line {total} is not a step's record (cut short by a crash?); dropped")
            elif logged <= step:
                kept.append(line)
    if len(kept) < total:
        with replaced_whole(path) as f:
            f.writelines(kept)


def _step_of(line: str) -> int | None:
    """The step a metrics line records, or None for a line that is not a JSON object with an integer step."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def reward_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """The logger's reward and length stats over rollouts: reward/mean, reward/accuracy/mean, ..."""
    if not rollouts:
        return {}
    components = {}  # each reward's values, one per rollout
    for name in rollouts[0].rewards:
        components[name] = [r.rewards[name] for r in rollouts]
    timed_out = [r.timed_out for r in rollouts]
    rewards = Rewards([r.reward for r in rollouts], components, timed_out)
    return {**rewards.stats(), **completion_stats(rollouts), **right_and_wrong_lengths(rollouts)}


def right_and_wrong_lengths(rollouts: list[Rollout]) -> dict[str, float]:
    """The mean length of the right and of the wrong completions (Dr. GRPO's measure: GRPO's 1/|o| lets wrong
    answers grow). Right is the first reward (the task's: accuracy, countdown) above 0.5, as the held-out
    evaluation counts it; a side with no completion in the batch is left out, as is a run with no reward."""
    if not rollouts[0].rewards:
        return {}
    task_reward = next(iter(rollouts[0].rewards))
    right = [len(r.completion_ids) for r in rollouts if r.rewards[task_reward] > 0.5]
    wrong = [len(r.completion_ids) for r in rollouts if r.rewards[task_reward] <= 0.5]
    out = {}
    if right:
        out["completion/length_right_mean"] = sum(right) / len(right)
    if wrong:
        out["completion/length_wrong_mean"] = sum(wrong) / len(wrong)
    return out
