"""examples/compare_objectives.py and minigrpo/compare/: a tiny plan (2 variants x 2 seeds, 2 steps of tiny
arithmetic) runs and writes the table, page and results; killed mid-run and restarted, it runs nothing twice
and ends with the same results (timings aside); ScaleRL's fit recovers known curves; the t intervals and
Welch's mark on made-up numbers; bad input stops in one line before any run. The runs are forked from a
server that paid the imports once (killed_run.Server): the straight and killed comparisons from one of their
own, as work beside the suite's other files, the rest from conftest's examples_server."""

import itertools
import json
import math
import os
import re
import shutil

import numpy as np
import pytest

from minigrpo.compare import (
    DEFAULT_VARIANTS,
    Budget,
    Comparison,
    Plan,
    Variant,
    baseline_of,
    choose,
    fit_sigmoid,
    mean_interval,
    parse_variant,
    processes,
    read_variants_file,
    results,
    sigmoid,
    welch_p,
    write_report,
    write_results,
)
from minigrpo.compare.stats import t_quantile
from minigrpo.compare.table import cell, fit_cells

TINY = ("--train_count", "20", "--num_generations", "2", "--batch_size", "4", "--micro_batch_size", "2")
TINY += ("--template", "tiny", "--save_every", "1")
PLAN = Plan(
    variants=(Variant("grpo", ()), Variant("dr_grpo", ("--loss_type", "dr_grpo", "--scale_rewards", "none"))),
    seeds=(0, 1),
    budget=Budget(steps=2, eval_every=1, eval_count=4, check_count=4),
    common=TINY,
)
KILL = "save 2: weights written, trainer state not"  # tests/killed_run.py: step 1's checkpoint is intact


def forked(server, log_dir, kill: dict | None = None):
    """A launcher for Comparison: each command forked from the server, its output appended where the runner
    wants it; `kill` ({"run": ..., "point": ...}) SIGKILLs that run's first training process there."""
    names = itertools.count()

    def launch(command: list[str], env: dict, stdout: str, stderr: str) -> int:
        name = f"process-{next(names)}"
        output = command[command.index("--output_dir") + 1] if "--output_dir" in command else ""
        point = None
        if kill and output.endswith(kill["run"]) and not kill.get("done"):
            point, kill["done"] = kill["point"], True
        code = server.run(command[1], command[2:], str(log_dir), name, point)
        for suffix, path in (("out", stdout), ("err", stderr)):
            with open(path, "a", encoding="utf-8") as f:
                f.write((log_dir / f"{name}.{suffix}").read_text())
        return code

    return launch


def finish(out: str, plan: Plan = PLAN) -> dict:
    found = results(out, plan, "grpo")
    write_results(out, found)
    write_report(out, found)
    return found


def background_work(tmp_path_factory) -> dict:
    """PLAN run straight, then its output with one run not yet started, that run SIGKILLed mid-way (step 1
    checkpointed, step 2's save cut short) and the comparison run twice more: run beside the suite's other
    files (conftest's Background), in processes forked from a server of its own. What the tests check."""
    from killed_run import Server

    server = Server()
    try:
        straight = str(tmp_path_factory.mktemp("straight") / "out")
        Comparison(PLAN, straight, jobs=1, launch=forked(server, tmp_path_factory.mktemp("logs"))).run()
        found = finish(straight)
        logs = tmp_path_factory.mktemp("killed_logs")
        out = str(tmp_path_factory.mktemp("killed") / "out")
        shutil.copytree(straight, out)
        shutil.rmtree(os.path.join(out, "dr_grpo", "seed-0"))
        os.remove(os.path.join(out, "processes.jsonl"))
        kill = {"run": os.path.join("dr_grpo", "seed-0"), "point": KILL}
        Comparison(PLAN, out, jobs=1, launch=forked(server, logs, kill), note=lambda _: None).run()
        killed = {
            "processes": processes(out),
            "saved": os.listdir(os.path.join(out, "dr_grpo", "seed-0", "checkpoints")),
            "results": finish(out),
        }
        Comparison(PLAN, out, jobs=1, launch=forked(server, logs)).run()
        resumed = {"processes": processes(out), "results": finish(out)}
        Comparison(PLAN, out, jobs=1, launch=forked(server, logs)).run()
        again = {"processes": processes(out)}
    finally:
        server.close()
    return {"straight": (straight, found), "killed": killed, "resumed": resumed, "again": again}


@pytest.fixture(scope="module")
def runs(background):
    return background.result(__name__)


@pytest.fixture(scope="module")
def straight(runs):
    return runs["straight"]


def test_a_tiny_plan_writes_the_table_page_and_results(straight):
    out, found = straight
    started = processes(out)
    assert [p["kind"] for p in started].count("train") == 4 and [p["kind"] for p in started].count(
        "check"
    ) == 5
    assert all(p["exit"] == 0 for p in started)
    for name in ("grpo", "dr_grpo"):
        row = found["rows"][name]
        assert row["seeds"] == 2 and not row["failed"]
        assert row["gain"]["low"] <= row["gain"]["mean"] <= row["gain"]["high"]
        assert row["check_gain"] is not None and row["seconds_per_step"] > 0
        assert row["entropy"] > 0 and row["length_wrong"] > 0 and 0 <= row["zero_variance_share"] <= 1
        for seed in ("0", "1"):
            run = found["runs"][name][seed]
            assert [step for step, _ in run["curves"]["held-out accuracy"]] == [0, 1, 2]
            summary = json.load(open(os.path.join(out, name, f"seed-{seed}", "summary.json")))
            assert run["gain"] == summary["gain"] and summary["seed"] == int(seed) and summary["steps"] == 2
    assert "gain_p" in found["rows"]["dr_grpo"] and "gain_p" not in found["rows"]["grpo"]
    table = open(os.path.join(out, "table.md"), encoding="utf-8").read()
    assert "| grpo |" in table and "| dr_grpo |" in table and "Welch" in table
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert "data:image/png;base64," in page and "<script" not in page and "http" not in page
    assert "--loss_type dr_grpo --scale_rewards none" in page
    assert json.load(open(os.path.join(out, "results.json")))["rows"] == json.loads(json.dumps(found["rows"]))


def without_timings(found: dict) -> dict:
    """results, with each run's and row's seconds per step left out (the only numbers a rerun changes)."""
    found = json.loads(json.dumps(found))
    for row in found["rows"].values():
        row.pop("seconds_per_step", None)
    for seeds in found["runs"].values():
        for run in seeds.values():
            run.pop("seconds_per_step", None)
    return found


def test_a_killed_comparison_restarted_runs_nothing_twice_and_ends_with_the_same_results(runs):
    """The straight comparison's output with one run not yet started: that run is SIGKILLed mid-way and
    named as failed while the comparison ends; run again, only it goes on, from its checkpoint, and the
    results are the straight comparison's; run a third time, nothing starts."""
    killed, resumed = runs["killed"], runs["resumed"]
    assert [(p["kind"], p["run"], p["exit"]) for p in killed["processes"]] == [
        ("train", "dr_grpo/seed-0", -9)
    ]
    assert (
        "step-000001" in killed["saved"] and "step-000002" not in killed["saved"]
    )  # step 2's save cut short
    interrupted = killed["results"]
    assert interrupted["rows"]["dr_grpo"]["failed"] == {"0": "exit -9: "}  # named, and the others kept
    assert interrupted["rows"]["dr_grpo"]["seeds"] == 1 and interrupted["rows"]["grpo"]["seeds"] == 2
    again = resumed["processes"][1:]
    assert [(p["kind"], p["run"], p["exit"]) for p in again] == [
        ("train", "dr_grpo/seed-0", 0),
        ("check", "dr_grpo/seed-0", 0),
    ]
    assert "--resume" in again[0]["command"]
    assert without_timings(resumed["results"]) == without_timings(runs["straight"][1])
    assert (
        runs["again"]["processes"] == resumed["processes"]
    )  # every run finished and checked: nothing starts


def test_a_failed_run_is_named_with_its_error_line(examples_server, tmp_path):
    plan = Plan((Variant("broken", ("--model", str(tmp_path / "no-such-model"))),), (0,), PLAN.budget, TINY)
    out = str(tmp_path / "out")
    Comparison(plan, out, jobs=1, launch=forked(examples_server, tmp_path), note=lambda _: None).run()
    failed = finish(out, plan)["rows"]["broken"]["failed"]["0"]
    assert failed.startswith("exit 1: train_math.py: ") and "no-such-model" in failed
    assert "broken seed 0: exit 1: train_math.py:" in open(os.path.join(out, "table.md")).read()


def compare(server, tmp_path, *args) -> tuple[int, str]:
    name = f"compare-{len(list(tmp_path.glob('*.err')))}"
    code = server.run("compare_objectives.py", list(args), str(tmp_path), name)
    return code, (tmp_path / f"{name}.err").read_text()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--only", "grpo,nope"], "unknown variant nope; the known ones: grpo, dr_grpo"),
        (
            ["--variant", "mine=--no_such_flag 1", "--only", "mine"],
            "variant mine (--no_such_flag 1): unrecognized",
        ),
        (
            ["--variant", "mine=--loss_type nope"],
            "variant mine (--loss_type nope): argument --loss_type: invalid",
        ),
        (
            ["--variant", "mine=--epsilon -1"],
            "variant mine (--epsilon -1): epsilon and epsilon_high must be > 0",
        ),
        (["--variant", "mine=--seed 3"], "variant mine sets --seed, which the plan sets for every run"),
        (["--steps", "0"], "the budget's steps must be a positive integer, got 0"),
        (["--quick", "--eval_every", "0"], "the budget's eval_every must be a positive integer, got 0"),
        (["--seeds", "0,0"], "--seeds must name one or more different seeds"),
        (["--flags", "--max_steps 5"], "the flags of every run set --max_steps, which the plan sets itself"),
    ],
)
def test_bad_input_is_one_line_before_any_run(examples_server, tmp_path, args, expected):
    code, err = compare(examples_server, tmp_path, "--output", str(tmp_path / "out"), *args)
    assert code == 1 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith("compare_objectives.py: ") and expected in err, err
    assert not os.path.exists(tmp_path / "out")


def test_an_output_holding_another_comparison_is_refused_before_any_run(straight, examples_server, tmp_path):
    out, _ = straight
    before = len(processes(out))
    code, err = compare(examples_server, tmp_path, "--output", out, "--only", "grpo", "--steps", "2")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "holds another comparison (its plan differs in: variants, seeds, budget, common)" in err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, err = compare(examples_server, tmp_path, "--output", str(tmp_path / "other"), "--steps", "2")
    assert code == 1 and "is not empty and holds no comparison" in err
    assert len(processes(out)) == before and os.listdir(tmp_path / "other") == ["notes.txt"]


def test_the_fit_recovers_known_curves():
    steps = np.arange(0, 601, 25)
    for A, B, middle, start in [(0.7, 1.8, 150.0, 0.375), (0.55, 0.9, 40.0, 0.2), (0.9, 3.0, 300.0, 0.1)]:
        exact = fit_sigmoid(steps, sigmoid(steps, A, B, middle, start), start)
        assert (exact.A, exact.B, exact.C_mid) == pytest.approx((A, B, middle), rel=1e-4)
        assert exact.rms < 1e-6 and exact.R0 == start
    noisy = sigmoid(steps, 0.7, 1.8, 150.0, 0.375) + np.random.default_rng(0).normal(0, 0.01, len(steps))
    fitted = fit_sigmoid(steps, noisy, 0.375)
    assert fitted.A == pytest.approx(0.7, abs=0.03) and fitted.B == pytest.approx(1.8, rel=0.25)
    assert fitted.C_mid == pytest.approx(150, rel=0.2) and 0.005 < fitted.rms < 0.015
    assert (
        fit_sigmoid([0, 10, 20], [0.3, 0.4, 0.5], 0.3) is None
    )  # two points past step 0: A, B, C_mid unknown
    # a curve still climbing at step 600, 0.375 -> 0.61, whose own sigmoid tends to 1.4: A is held at 1
    climbing = fit_sigmoid(steps, sigmoid(steps, 1.4, 1.0, 2000.0, 0.375), 0.375)
    assert climbing.A == 1.0 and climbing.rms < 0.005
    flat = fit_sigmoid(steps, [0.375] + [0.39, 0.392] * 12, 0.375)  # up at once, then flat: B held at 20
    assert flat.B == pytest.approx(20.0) and flat.A == pytest.approx(0.391, abs=1e-3)


def fake_run(folder, asymptote: float, start: float = 0.375) -> None:
    """A finished run's files as train_math.py writes them, its held-out curve ScaleRL's sigmoid to
    `asymptote` (B 1.5, midpoint 100 steps), evaluated every 50 of 400 steps."""
    os.makedirs(folder)
    steps = list(range(0, 401, 50))
    curve = sigmoid(steps, asymptote, 1.5, 100.0, start)
    args = {"model": "m", "data": "arithmetic", "difficulty": 1, "template": "tiny"}
    args["max_completion_length"] = 32
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"initial_accuracy": start, "gain": float(curve[-1] - start), "args": args}, f)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for step, accuracy in zip(steps, curve):
            if step:
                f.write(json.dumps({"step": step, "loss": 0.0, "time/step": 1.0}) + "\n")
            f.write(json.dumps({"step": step, "eval/accuracy": float(accuracy)}) + "\n")


def test_each_seeds_asymptote_and_its_mark_against_the_baseline(tmp_path):
    """ScaleRL's A fitted to each seed's curve alone: its interval over the seeds, and Welch's mark where
    a variant's asymptotes lie apart from the baseline's (and none where they overlap)."""
    asymptotes = {"grpo": (0.60, 0.61, 0.62), "higher": (0.70, 0.71, 0.72), "same": (0.59, 0.62, 0.60)}
    for name, values in asymptotes.items():
        for seed, value in enumerate(values):
            fake_run(tmp_path / name / f"seed-{seed}", value)
    plan = Plan(tuple(Variant(name, ()) for name in asymptotes), (0, 1, 2), PLAN.budget, ())
    rows = results(str(tmp_path), plan, "grpo")["rows"]
    for name, values in asymptotes.items():
        assert rows[name]["asymptote"]["mean"] == pytest.approx(sum(values) / 3, abs=1e-6)
        assert rows[name]["fit"]["A"] == pytest.approx(sum(values) / 3, abs=1e-3)  # the mean curve's
    assert rows["higher"]["asymptote_p"] < 0.05 < rows["same"]["asymptote_p"]
    assert fit_cells(rows["higher"])[-1].endswith(" *") and not fit_cells(rows["same"])[-1].endswith("*")


def test_intervals_use_students_t_over_the_seeds():
    assert [t_quantile(0.95, df) for df in (1, 2, 4)] == pytest.approx([12.7062, 4.3027, 2.7764], abs=1e-4)
    interval = mean_interval([0.30, 0.32, 0.34])  # s = 0.02: half-width 4.3027 * 0.02 / sqrt(3)
    assert interval.mean == pytest.approx(0.32)
    assert interval.high - interval.mean == pytest.approx(4.3027 * 0.02 / math.sqrt(3), rel=1e-4)
    assert mean_interval([0.3]).low == mean_interval([0.3]).high == 0.3


def test_welchs_mark_on_made_up_numbers():
    apart = welch_p([0.30, 0.31, 0.29], [0.10, 0.12, 0.09])
    overlapping = welch_p([0.30, 0.20, 0.40], [0.29, 0.35, 0.25])
    # scipy.stats.ttest_ind([1, 2, 3], [4, 5, 7], equal_var=False).pvalue
    assert welch_p([1, 2, 3], [4, 5, 7]) == pytest.approx(0.0419145, rel=1e-5)
    assert apart < 0.05 < overlapping and welch_p([0.3], [0.1, 0.2]) is None
    gain = {"mean": 0.2, "low": 0.1, "high": 0.3}
    assert cell({"gain": gain, "gain_p": apart}, "gain", "interval") == "+20.0 [+10.0, +30.0] *"
    assert cell({"gain": gain, "gain_p": overlapping}, "gain", "interval") == "+20.0 [+10.0, +30.0]"
    assert cell({"gain": None}, "gain", "interval") == "-"
    asymptote = {"mean": 0.7, "low": 0.65, "high": 0.75}
    assert fit_cells(
        {
            "fit": {"A": 0.7, "B": 1.8, "C_mid": 150.0, "rms": 0.0123},
            "asymptote": asymptote,
            "asymptote_p": apart,
        }
    ) == ["0.700", "1.80", "150", "0.0123", "0.700 [0.650, 0.750] *"]
    assert fit_cells({"fit": None}) == ["-"] * 5


def test_variants_from_a_file_and_the_command_line(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"low_kl": "--beta 0.01", "token": ["--loss_type", "dapo"]}))
    assert read_variants_file(str(path)) == [
        Variant("low_kl", ("--beta", "0.01")),
        Variant("token", ("--loss_type", "dapo")),
    ]
    assert parse_variant("mine=--beta 0.01 --loss_type 'dapo'") == Variant(
        "mine", ("--beta", "0.01", "--loss_type", "dapo")
    )
    assert [v.name for v in choose([], [Variant("mine", ())])][-2:] == ["adaptive_entropy", "mine"]
    assert choose(["rloo", "grpo"], []) == [DEFAULT_VARIANTS[8], DEFAULT_VARIANTS[0]]
    assert baseline_of(choose(["rloo", "grpo"], [])) == "grpo"  # the marks are against GRPO where it runs
    assert baseline_of(choose(["dapo_overlong", "dapo"], [])) == "dapo_overlong"  # else the first
    bad = [
        (lambda: parse_variant("--beta 0.01"), 'must be NAME="--flag value ..."'),
        (lambda: parse_variant("a/b=--beta 1"), "the name 'a/b' must be letters, digits and _.+-"),
        (lambda: parse_variant("mine=beta 1"), "must start with a --flag, got 'beta'"),
        (lambda: choose([], [Variant("grpo", ())]), "variant 'grpo' is defined twice"),
        (lambda: choose(["grpo", "grpo"], []), "variant grpo is named twice"),
    ]
    (tmp_path / "list.json").write_text("[1, 2]")
    bad += [
        (lambda: read_variants_file(str(tmp_path / "list.json")), "must hold an object of variant names"),
        (lambda: read_variants_file(str(tmp_path / "none.json")), "cannot read the variants file"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
