"""The loop and what stands around it: the trainer's step, the run that drives it, and what it leaves
behind (metrics, checkpoints, evaluations, the trace, curves).

- `Trainer` (trainer.py): one GRPO step, the stages in order, chosen once when it is built (what
  trains, against what, and which stages: plan.py's `TrainingPlan`);
- `train`, `build_run`, `Run` (driver.py): a run started fresh or resumed, driven to its end,
  logged and saved; where a resume goes on from, and its checks (resume.py);
- checkpoints (checkpoint.py): `save_checkpoint`, `load_state`, the format of trainer_state.pt;
- `MetricsLogger` (metrics.py): metrics.jsonl, the console line, TensorBoard, wandb; `Clock`;
- `evaluate` (evaluation.py): held-out accuracy, pass@k, majority@k, steps' faithfulness; during a
  run, `evaluate_held_out` across its ranks and the starting policy's score (`initial_evaluation`);
- `Trace` (trace.py): one group's journey through every stage, as text and as trace.html;
- `plot_curves` (plots.py): curves from metrics.jsonl.
This is the one folder that combines the stages. Nothing outside it imports from inside it: only the
names below.
"""

from .checkpoint import (
    CHECKPOINTS,
    CHECKSUMS,
    STATE_FILE,
    STATE_KEYS,
    latest_checkpoint,
    latest_intact_checkpoint,
    load_state,
    save_checkpoint,
    save_initial_evaluation,
    write_checksums,
)
from .driver import Run, build_run, train
from .evaluation import Evaluation, evaluate, evaluate_held_out, initial_evaluation, pass_at_k, summarize
from .metrics import Clock, MetricsLogger, console_line, reward_stats
from .plots import plot_curves
from .trace import Trace, render_html
from .trainer import Trainer

__all__ = [
    "CHECKPOINTS",
    "CHECKSUMS",
    "STATE_FILE",
    "STATE_KEYS",
    "Clock",
    "Evaluation",
    "MetricsLogger",
    "Run",
    "Trace",
    "Trainer",
    "build_run",
    "console_line",
    "evaluate",
    "evaluate_held_out",
    "initial_evaluation",
    "latest_checkpoint",
    "latest_intact_checkpoint",
    "load_state",
    "pass_at_k",
    "plot_curves",
    "render_html",
    "reward_stats",
    "save_checkpoint",
    "save_initial_evaluation",
    "summarize",
    "train",
    "write_checksums",
]
