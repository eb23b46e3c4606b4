"""The comparison's third stage: the numbers. In: the output directory a `Comparison` filled (each run's
summary.json, metrics.jsonl, check.json or failed.json, and the start model's check). Out: per run its
numbers and curves, per variant the mean over its seeds with 95% intervals (Student's t over the seeds),
ScaleRL's sigmoid fit of its mean held-out curve and each seed's asymptote, and a mark where its gain or
asymptote differs from the baseline's by Welch's t-test at 5%; as results.json and table.md. It reads
files, and starts nothing.
"""

from __future__ import annotations

import json
import os

from ..files import read_json_object, replace_json, replaced_whole
from .fit import fit_sigmoid
from .runner import Plan, check_settings, run_dir
from .stats import LEVEL, Interval, mean_interval, welch_p

TARGET_GAIN = 0.20  # "steps to +20 points": the first held-out evaluation this far above the start
LAST_STEPS = 5  # "at the end": the mean over the run's last this-many steps
CURVES = {  # metrics.jsonl key -> the curve's name in results.json and the report
    "eval/accuracy": "held-out accuracy",
    "completion/length_wrong_mean": "wrong-completion length",
    "entropy": "entropy",
    "clip/region_frac": "clipped-token share",
}
SIZE = 1 - LEVEL  # Welch's test's size


def read_run(folder: str, start_checks: dict[str, float]) -> dict:
    """One run's numbers: {"failed": error line} for a run that failed or has not finished, else its gain,
    check gain, steps to +20 points, s/step, end-of-run means and curves (`start_checks`: each start's check
    accuracy, by its check folder)."""
    summary_path = os.path.join(folder, "summary.json")
    if not os.path.exists(summary_path):
        failed = os.path.join(folder, "failed.json")
        if os.path.exists(failed):
            record = read_json_object(failed, "a failed run's record")
            return {"failed": f"exit {record['exit']}: {record['error']}"}
        return {"failed": "not run yet"}
    summary = read_json_object(summary_path, "a run's summary")
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    steps = [line for line in lines if "loss" in line]  # training steps; the others are evaluations
    held_out = [(line["step"], line["eval/accuracy"]) for line in lines if "eval/accuracy" in line]
    start = summary["initial_accuracy"]
    reached = [step for step, accuracy in held_out if accuracy - start >= TARGET_GAIN - 1e-9]
    own_fit = fit_sigmoid([step for step, _ in held_out], [accuracy for _, accuracy in held_out], start)
    return {
        "gain": summary["gain"],
        "check_gain": _check_gain(folder, summary["args"], start_checks),
        "steps_to_target": reached[0] if reached else None,
        "seconds_per_step": _mean([line["time/step"] for line in steps]),
        "length_right": _last_mean(steps, "completion/length_right_mean"),
        "length_wrong": _last_mean(steps, "completion/length_wrong_mean"),
        "entropy": _last_mean(steps, "entropy"),
        "clipped_share": _mean([line.get("clip/region_frac") for line in steps]),
        "zero_variance_share": _mean([line.get("groups/zero_variance_frac") for line in steps]),
        "initial_accuracy": start,
        "asymptote": own_fit.A if own_fit else None,  # ScaleRL's A of this seed's curve alone
        "curves": {
            name: [[line["step"], line[key]] for line in lines if key in line] for key, name in CURVES.items()
        },
    }


def _check_gain(folder: str, args: dict, start_checks: dict[str, float]) -> float | None:
    """The run's final checkpoint's check accuracy minus its start model's; None until both are measured."""
    done = os.path.join(folder, "check.json")
    start = start_checks.get(json.dumps(check_settings(args), sort_keys=True))
    if not os.path.exists(done) or start is None:
        return None
    return read_json_object(done, "a run's check")["accuracy"] - start


def _start_checks(out: str) -> dict[str, float]:
    """Each start model's check accuracy, by its settings (runner.check_settings) as sorted JSON."""
    found = {}
    folder = os.path.join(out, "start")
    for key in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        done = os.path.join(folder, key, "check.json")
        if os.path.exists(done):
            check = read_json_object(done, "a start model's check")
            found[json.dumps(check["settings"], sort_keys=True)] = check["accuracy"]
    return found


def _mean(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _last_mean(steps: list[dict], key: str) -> float | None:
    return _mean([line.get(key) for line in steps[-LAST_STEPS:]])


def results(out: str, plan: Plan, baseline: str) -> dict:
    """Every run's numbers and every variant's row (results.json's content)."""
    start_checks = _start_checks(out)
    runs = {
        variant.name: {
            str(seed): read_run(run_dir(out, variant.name, seed), start_checks) for seed in plan.seeds
        }
        for variant in plan.variants
    }
    rows = {name: variant_row(seeds) for name, seeds in runs.items()}
    if baseline in rows:
        for name, row in rows.items():
            if name != baseline:
                for key in ("gain", "check_gain", "asymptote"):
                    row[f"{key}_p"] = welch_p(_values(runs[name], key), _values(runs[baseline], key))
    return {
        "plan": plan.record(),
        "baseline": baseline,
        "intervals": f"{LEVEL:.0%} interval of the seeds' mean (Student's t, seeds - 1 degrees of freedom)",
        "mark": f"* where Welch's t-test of the seeds' values against {baseline}'s gives p < {SIZE:.2f}",
        "rows": rows,
        "runs": runs,
    }


def _values(seeds: dict[str, dict], key: str) -> list[float]:
    return [run[key] for run in seeds.values() if run.get(key) is not None]


def variant_row(seeds: dict[str, dict]) -> dict:
    """A variant's row over its finished seeds: intervals for the gains and the seeds' asymptotes, means for
    the rest; the fit of its mean held-out curve; the failed seeds with their error lines."""
    finished = {seed: run for seed, run in seeds.items() if "failed" not in run}
    row = {
        "seeds": len(finished),
        "failed": {seed: run["failed"] for seed, run in seeds.items() if "failed" in run},
    }
    if not finished:
        return row
    for key in ("gain", "check_gain", "asymptote"):
        values = _values(finished, key)
        row[key] = _interval(mean_interval(values)) if values else None
    for key in (
        "seconds_per_step",
        "length_right",
        "length_wrong",
        "entropy",
        "clipped_share",
        "zero_variance_share",
    ):
        row[key] = _mean(_values(finished, key))
    reached = [run["steps_to_target"] for run in finished.values()]
    row["steps_to_target"] = _mean(reached) if None not in reached else None  # every seed got there, or "-"
    row["fit"] = _fit(list(finished.values()))
    return row


def _interval(interval: Interval) -> dict:
    return {"mean": interval.mean, "low": interval.low, "high": interval.high}


def _fit(runs: list[dict]) -> dict | None:
    """ScaleRL's sigmoid of the seeds' mean held-out accuracy at each evaluated step."""
    by_step = {}
    for run in runs:
        for step, accuracy in run["curves"]["held-out accuracy"]:
            by_step.setdefault(step, []).append(accuracy)
    steps = sorted(step for step, values in by_step.items() if len(values) == len(runs))
    means = [sum(by_step[step]) / len(runs) for step in steps]
    start = sum(run["initial_accuracy"] for run in runs) / len(runs)
    fitted = fit_sigmoid(steps, means, start)
    if fitted is None:
        return None
    return {"A": fitted.A, "B": fitted.B, "C_mid": fitted.C_mid, "rms": fitted.rms}


def write_results(out: str, found: dict) -> None:
    replace_json(os.path.join(out, "results.json"), found)
    with replaced_whole(os.path.join(out, "table.md")) as f:
        f.write(markdown(found))


COLUMNS = [  # (header, the row's key, format)
    ("held-out gain (pts, 95% CI)", "gain", "interval"),
    ("eval_math gain (pts, 95% CI)", "check_gain", "interval"),
    ("steps to +20 pts", "steps_to_target", "{:.0f}"),
    ("s/step", "seconds_per_step", "{:.2f}"),
    ("len right", "length_right", "{:.1f}"),
    ("len wrong", "length_wrong", "{:.1f}"),
    ("entropy at end", "entropy", "{:.3f}"),
    ("clipped share", "clipped_share", "{:.4f}"),
    ("no-signal groups", "zero_variance_share", "{:.2f}"),
    ("seeds", "seeds", "{}"),
]


FIT_FORMATS = (("A", "{:.3f}"), ("B", "{:.2f}"), ("C_mid", "{:.0f}"), ("rms", "{:.4f}"))
FIT_HEADERS = ("A (asymptote)", "B (efficiency)", "C_mid (steps)", "fit RMS", "A of each seed (95% CI)")


def fit_cells(row: dict) -> list[str]:
    """The fit's A, B, C_mid and RMS as the table shows them ("-" for no fit: fewer than 3 evaluations),
    then the interval of the seeds' own asymptotes with its mark."""
    fit = row.get("fit")
    return [form.format(fit[key]) if fit else "-" for key, form in FIT_FORMATS] + [
        cell(row, "asymptote", "level")
    ]


def cell(row: dict, key: str, form: str) -> str:
    """A row's value as the table shows it: an interval in points, with its mark against the baseline."""
    value = row.get(key)
    if value is None:
        return "-"
    if form not in ("interval", "level"):
        return form.format(value)
    mark = " *" if (row.get(f"{key}_p") is not None and row[f"{key}_p"] < SIZE) else ""
    if form == "level":  # an accuracy, not a gain in points
        return f"{value['mean']:.3f} [{value['low']:.3f}, {value['high']:.3f}]{mark}"
    return f"{100 * value['mean']:+.1f} [{100 * value['low']:+.1f}, {100 * value['high']:+.1f}]{mark}"


def markdown(found: dict) -> str:
    """table.md: the table, the fits, the failed runs, and what the intervals and the mark are."""
    lines = [
        "| variant | " + " | ".join(header for header, _, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, row in found["rows"].items():
        lines.append(f"| {name} | " + " | ".join(cell(row, key, form) for _, key, form in COLUMNS) + " |")
    lines += [
        "",
        "| variant | " + " | ".join(FIT_HEADERS) + " |",
        "|---|" + "---:|" * len(FIT_HEADERS),
    ]
    for name, row in found["rows"].items():
        lines.append(f"| {name} | " + " | ".join(fit_cells(row)) + " |")
    failed = [
        f"- {name} seed {seed}: {error}"
        for name, row in found["rows"].items()
        for seed, error in row["failed"].items()
    ]
    lines += [
        "",
        f"Intervals: {found['intervals']}. Mark: {found['mark']}.",
        "ScaleRL's fit: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) of the seeds' mean held-out accuracy "
        "against steps, R0 the accuracy at step 0; beside it, A fitted to each seed's curve alone, its "
        "interval and mark as above.",
    ]
    if failed:
        lines += ["", "Runs that failed or have not run:", *failed]
    return "\n".join(lines) + "\n"
