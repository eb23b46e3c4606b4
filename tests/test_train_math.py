"""examples/train_math.py end to end, in seconds: the embedded default model on synthetic arithmetic
(with --trace and --resume), and the Qwen3 path (chat template, MATH-format JSONL) on a tiny random
Qwen3 with a Qwen-style chat tokenizer. Both run the real command line, in processes forked from
conftest's examples_server."""

import contextlib
import io
import json
import os
import runpy
import struct
import sys
from unittest import mock

import pytest
import torch
from helpers import tiny_policy, tiny_run

import minigrpo
from minigrpo.model import read_task
from minigrpo.run import evaluate, latest_checkpoint
from minigrpo.tasks import load_problems, template

SMALL = tiny_run(template=None, eval_count=4, eval_every=1)  # the template: the model's
# The embedded default (no --model) gets some arithmetic right in 32 tokens: its groups have signal.
MICRO = [*SMALL, "--max_completion_length", "32", "--template", "tiny"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # tiny_tokenizer has Qwen3's special tokens: the policy has the chat format
    return tiny_policy(str(tmp_path_factory.mktemp("qwen-style")), max_position_embeddings=256)


def train_math(server, log_dir, *args, succeed=True) -> tuple[int, str, str]:
    """`python examples/train_math.py *args` (forked by conftest's server, from the repository's root):
    its exit status, stdout and stderr (kept in log_dir)."""
    name = f"train_math-{len(list(log_dir.glob('*.out')))}"
    code = server.train_math(list(args), None, str(log_dir), name)
    out, err = ((log_dir / f"{name}.{stream}").read_text() for stream in ("out", "err"))
    assert code == 0 or not succeed, err[-3000:]
    return code, out, err


def test_micro_run_with_trace_then_resume(examples_server, tmp_path):
    out = str(tmp_path / "run")
    _, printed, _ = train_math(examples_server, tmp_path, "--output_dir", out, "--trace", *MICRO)
    for stage in ("[task -> prompt]", "[1 sample]", "[2 verify]", "[3 advantages]", "[4 update]", "[4 loss]"):
        assert stage in printed
    # the page (tests/test_trace.py)
    assert "class='tok'" in open(os.path.join(out, "trace.html"), encoding="utf-8").read()
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert (
        summary["steps"] == 2
        and 0 <= summary["initial_accuracy"] <= 1
        and 0 <= summary["final_accuracy"] <= 1
    )
    assert summary["wall_seconds"] > 0
    _, printed, _ = train_math(
        examples_server, tmp_path, "--output_dir", out, "--resume", *MICRO[:1], "3", *MICRO[2:]
    )
    assert "resuming from" in printed
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    # 0: before GRPO
    assert [s["step"] for s in steps] == [0, 1, 2, 3] and all("eval/accuracy" in s for s in steps)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["steps"] == 3
    # The resumed run trained and saved its step 3, and that checkpoint is the policy it measured last.
    latest = latest_checkpoint(out)
    assert latest.endswith("step-000003")
    model, tokenizer = minigrpo.load_pretrained(latest)
    before = minigrpo.load_pretrained(os.path.join(out, "checkpoints", "step-000002"))[0].state_dict()
    assert steps[3]["groups/zero_variance_frac"] < 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    held_out = load_problems("arithmetic", "test", count=4, seed=0)
    accuracy = evaluate(model, tokenizer, held_out, template("tiny"), max_new_tokens=32).pass_at_1
    assert accuracy == steps[3]["eval/accuracy"] == summary["final_accuracy"]
    # Other held-out problems on resume: the trained policy must not pass for the starting one.
    other = list(MICRO)
    other[other.index("--eval_count") + 1] = "3"
    code, _, err = train_math(
        examples_server, tmp_path, "--output_dir", out, "--resume", *other[:1], "4", *other[2:], succeed=False
    )
    assert code != 0 and "Traceback" not in err and err.count("\n") == 1, err
    assert (
        "accuracy before GRPO was measured on eval_data arithmetic, eval_count 4, "
        "not on eval_data arithmetic, eval_count 3" in err
    )
    assert json.load(open(os.path.join(out, "initial_eval.json")))["held_out"]["eval_count"] == 4  # untouched


def test_the_shipped_teacher_distils_into_the_embedded_default(examples_server, tmp_path):
    """The README's demo at its smallest: models/minigrpo-tiny-arith-grpo (the default run's last
    checkpoint) grades the embedded default's tokens, which it shares the tokenizer of."""
    out = str(tmp_path / "run")
    teacher = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
    teacher = os.path.join(teacher, "minigrpo-tiny-arith-grpo")
    _, printed, _ = train_math(
        examples_server, tmp_path, "--output_dir", out, "--teacher_model", teacher, *MICRO
    )
    assert "held-out greedy accuracy:" in printed and f"teacher_model={teacher}" in printed
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert all(s["distill/reverse_kl"] > 0 and s["time/teacher"] > 0 for s in steps[1:])
    assert json.load(open(os.path.join(out, "summary.json")))["steps"] == 2


def test_qwen_path_on_a_math_jsonl_file(examples_server, checkpoint, tmp_path):
    data = tmp_path / "math.jsonl"
    rows = [
        {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$."},
        {"problem": "Half of 3?", "answer": "\\frac{3}{2}"},
        {"problem": "What is $2^3$?", "answer": "8"},
        {"problem": "Solve $x+1=3$.", "answer": "x = 2"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = str(tmp_path / "qwen")
    train_math(
        examples_server,
        tmp_path,
        "--model",
        checkpoint,
        "--data",
        str(data),
        "--template",
        "chat",
        "--output_dir",
        out,
        "--rewards",
        "accuracy:1.0,format:0.1",
        *SMALL,
    )
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [s["step"] for s in steps] == [0, 1, 2] and "reward/format/mean" in steps[1]
    assert json.load(open(os.path.join(out, "summary.json")))["eval_problems"] == 4


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALC_MODEL = os.path.join(ROOT, "models", "minigrpo-tiny-calc")


def eval_math(*args) -> str:
    """`python examples/eval_math.py *args`, run in this process (its imports are paid): what it printed."""
    script = os.path.join(ROOT, "examples", "eval_math.py")
    printed = io.StringIO()
    with mock.patch.object(sys, "argv", [script, *args]), contextlib.redirect_stdout(printed):
        runpy.run_path(script, run_name="__main__")
    return printed.getvalue()


def test_the_calc_model_brings_its_task_and_its_checkpoints_keep_it(examples_server, tmp_path):
    """models/minigrpo-tiny-calc records its task (data, template, calculator, completion length, steps):
    train_math.py needs only --model (the other flags make the run small), calls the calculator and
    reports tool use before and after; every checkpoint carries the task, so eval_math.py needs only
    --model and --tools, and prints pass@1 on its last line."""
    out = str(tmp_path / "calc")
    small = ["--steps", "1", "--batch_size", "16", "--micro_batch_size", "16", "--eval_count", "8"]
    _, printed, _ = train_math(
        examples_server, tmp_path, "--model", CALC_MODEL, "--output_dir", out, "--trace", *small
    )
    summary = json.load(open(os.path.join(out, "summary.json")))
    args = summary["args"]
    assert (args["data"], args["tools"], args["tool_format"], args["max_completion_length"]) == (
        "calc",
        "calculator",
        "calc",
        64,
    )
    extras = ["tool_calls_per_completion", "accuracy_tools_off"]
    assert all(f"{when}_{name}" in summary for when in ("initial", "final") for name in extras)
    assert "held-out tool use before GRPO: " in printed and "held-out tool use after GRPO: " in printed
    assert "[1 tool]   calculator('" in printed  # the trace's group made calls
    step = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][1]
    assert step["tools/calls_per_completion"] > 0 and "tools/calculator/error_frac" in step
    # A resume with the tools off would compare accuracy with the calculator before GRPO against accuracy
    # without it after: refused in one line, before any step.
    code, _, err = train_math(
        examples_server,
        tmp_path,
        *(
            "--model",
            CALC_MODEL,
            "--output_dir",
            out,
            "--resume",
            "--tools",
            "none",
            *small[:1],
            "2",
            *small[2:],
        ),
        succeed=False,
    )
    assert code != 0 and "Traceback" not in err and err.count("\n") == 1, err
    assert (
        "measured on eval_data calc, eval_count 8, tools calculator, " in err
        and "not on eval_data calc, eval_count 8:" in err
    )
    checkpoint = latest_checkpoint(out)
    assert checkpoint.endswith("step-000001") and read_task(checkpoint) == read_task(CALC_MODEL)
    for tools in ("calculator", "none"):
        results = str(tmp_path / f"eval-{tools}.jsonl")
        last = eval_math("--model", checkpoint, "--tools", tools, "--count", "8", "--output", results)
        last = last.splitlines()[-1]
        assert last.startswith("calc (8 problems, 8 samples each, temperature 0.8): pass@1 "), last
        assert ("tool calls per completion" in last) == (tools == "calculator")


def test_a_bad_flag_value_is_one_clear_line(examples_server, checkpoint, tmp_path):
    code, _, err = train_math(
        examples_server,
        tmp_path,
        "--model",
        checkpoint,
        "--num_generations",
        "1",
        "--output_dir",
        str(tmp_path / "run"),
        succeed=False,
    )
    assert code != 0 and "Traceback" not in err
    assert "num_generations must be an integer >= 2" in err


def test_curves_are_plotted_from_metrics(tmp_path, monkeypatch):
    """Each panel plots its metric by step, or says it was not logged, in one 2000 x 320 PNG.
    matplotlib is in the test extra, so this runs wherever the suite does (it used to skip)."""
    import matplotlib.pyplot as plt

    from minigrpo.run.plots import PANELS, plot_curves

    # no "kl": beta 0 keeps no reference
    rows = [{"step": 0, "eval/accuracy": 0.25}] + [
        {
            "step": s,
            "reward/mean": s / 10,
            "completion/length_mean": 20 + s,
            "clip/region_frac": 0.0,
            "eval/accuracy": 0.5,
        }
        for s in range(1, 4)
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(row) for row in rows))
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure, to read what was drawn
    assert plot_curves(str(metrics), str(tmp_path / "curves.png"))
    png = (tmp_path / "curves.png").read_bytes()
    # IHDR: width, height
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (
        2000,
        320,
    )
    (figure,) = figures
    panels = {ax.get_title(): ax for ax in figure.axes}
    assert list(panels) == [title for _, title in PANELS]

    def curve(title):
        (line,) = panels[title].lines
        return list(line.get_xdata()), list(line.get_ydata())

    assert curve("reward") == ([1, 2, 3], [0.1, 0.2, 0.3])
    # from step 0, before GRPO
    assert curve("held-out accuracy (greedy)") == (
        [0, 1, 2, 3],
        [0.25, 0.5, 0.5, 0.5],
    )
    assert curve("completion length (tokens)") == ([1, 2, 3], [21, 22, 23])
    assert not panels["KL to reference"].lines
    assert [t.get_text() for t in panels["KL to reference"].texts] == ["not logged in this run"]
    monkeypatch.undo()
    plt.close(figure)
