"""Beside the loop: the objectives compared on one budget. A plan of variants (a name and the train_math.py
flags it sets) x seeds runs, each run in a process of its own, into one output directory; the table, the
fits and the curves are read back from the runs' files. In the order a comparison flows:

- `variants.py`: the default list, the user's variants, and their check before any run;
- `runner.py`: the plan, its manifest, the runs and their checks (eval_math.py), resumed where they stopped;
- `stats.py`: means with their 95% intervals over seeds, Welch's t-test;
- `fit.py`: ScaleRL's sigmoid of held-out accuracy against steps;
- `table.py`: each run's numbers and each variant's row (results.json, table.md);
- `report.py`: the curves and report.html.
"""

from .fit import SigmoidFit, fit_sigmoid, sigmoid
from .report import write_report
from .runner import Budget, Comparison, Plan, claim, processes, run_dir
from .stats import mean_interval, welch_p
from .table import results, write_results
from .variants import (
    BASELINE,
    DEFAULT_VARIANTS,
    Variant,
    baseline_of,
    check_variants,
    choose,
    parse_variant,
    read_variants_file,
)

__all__ = [
    "BASELINE",
    "Budget",
    "Comparison",
    "DEFAULT_VARIANTS",
    "Plan",
    "SigmoidFit",
    "Variant",
    "baseline_of",
    "check_variants",
    "choose",
    "claim",
    "fit_sigmoid",
    "mean_interval",
    "parse_variant",
    "processes",
    "read_variants_file",
    "results",
    "run_dir",
    "sigmoid",
    "welch_p",
    "write_report",
    "write_results",
]
