"""Crash safety end to end: examples/train_math.py SIGKILLed in the middle of a checkpoint save, a
prune, the metrics rewrite of a resume or its last summary leaves a newest checkpoint that loads
(its trainer state as data only), loses no logged step that checkpoint holds, and `--resume` then
ends exactly where a run that was never killed ends: the same files, weights, optimizer state,
metrics and summary. The kills are armed by tests/killed_run.py, outside the library."""

import json
import os
import re
import signal

import pytest
import torch
from helpers import VOWELS, tiny_policy, tiny_run
from safetensors.torch import load_file

import minigrpo
from minigrpo.run import CHECKPOINTS, STATE_FILE, latest_intact_checkpoint, load_state

ARGS = tiny_run(rewards=VOWELS, steps=3, eval_every=1)  # a checkpoint each step, 2 of them kept

# Each case: one killed run after another (the first fresh, the others --resume), each with what
# its kill leaves: the entries of the checkpoints directory with their number of files, and the
# steps in metrics.jsonl. A resume to the end follows.
CASES = [
    # an empty state file
    [("save 2: weights written, trainer state not", {".tmp-step-*": 6, "step-000001": 7}, [0, 1, 2])],
    [
        (
            "save 2: every file written and fsynced, not yet renamed into place",
            {".tmp-step-*": 7, "step-000001": 7},
            [0, 1, 2],
        )
    ],
    [
        (
            "save 2: renamed into place, its directory not fsynced",
            {"step-000001": 7, "step-000002": 7},
            [0, 1, 2],
        )
    ],
    [
        (
            "prune: step 1 renamed to .deleting-",
            {".deleting-step-000001": 7, "step-000002": 7, "step-000003": 7},
            [0, 1, 2, 3],
        )
    ],
    [
        (
            "prune: step 1 half deleted",
            {".deleting-step-000001": 4, "step-000002": 7, "step-000003": 7},
            [0, 1, 2, 3],
        )
    ],
    [
        (
            "save 2: every file written and fsynced, not yet renamed into place",
            {".tmp-step-*": 7, "step-000001": 7},
            [0, 1, 2],
        ),
        (
            "resume: trimmed metrics in a temporary file, not renamed over metrics.jsonl",
            {"step-000001": 7},
            [0, 1, 2],
        ),
    ],
    [("end: initial_eval.json being rewritten", {"step-000002": 7, "step-000003": 7}, [0, 1, 2, 3])],
]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_policy(str(tmp_path_factory.mktemp("policy")), max_position_embeddings=128)


@pytest.fixture(scope="module")
def straight(examples_server, policy, tmp_path_factory):
    """The run that is never killed."""
    tmp = tmp_path_factory.mktemp("straight")
    out = str(tmp / "run")
    assert (
        examples_server.train_math(
            ["--model", policy, "--output_dir", out, *ARGS], None, str(tmp), "straight"
        )
        == 0
    ), (tmp / "straight.err").read_text()[-3000:]
    return out


@pytest.mark.parametrize("kills", CASES, ids=lambda kills: kills[-1][0])
def test_a_killed_run_resumes_to_the_straight_runs_end(examples_server, policy, straight, tmp_path, kills):
    out = str(tmp_path / "run")
    args = ["--model", policy, "--output_dir", out, *ARGS]
    for run, (kill_point, left, steps) in enumerate(kills):
        code = examples_server.train_math(
            args + ["--resume"] * (run > 0), kill_point, str(tmp_path), f"killed-{run}"
        )
        assert code == -signal.SIGKILL, (
            f"{kill_point}: exit code {code}\n{(tmp_path / f'killed-{run}.err').read_text()[-3000:]}"
        )
        assert checkpoint_entries(out) == left, kill_point
        assert logged_steps(out) == steps, kill_point
        notes = []
        latest = latest_intact_checkpoint(out, notes.append)
        assert notes == [] and latest == os.path.join(
            out, CHECKPOINTS, max(n for n in left if n.startswith("step-"))
        )
        state = load_state(latest)
        assert state["step"] == int(latest[-6:]) and minigrpo.load_pretrained(latest)[0] is not None
        # no step it holds is lost
        assert history(out)[: state["step"] + 1] == history(straight)[: state["step"] + 1]
        states_load_as_data(out)
    assert examples_server.train_math(args + ["--resume"], None, str(tmp_path), "resumed") == 0, (
        tmp_path / "resumed.err"
    ).read_text()[-3000:]
    assert_same_end(out, straight)


def checkpoint_entries(out: str) -> dict[str, int]:
    """What is in out/checkpoints, each entry with its number of files (temporary names as .tmp-step-*)."""
    parent = os.path.join(out, CHECKPOINTS)
    return {
        re.sub(r"^\.tmp-step-.*", ".tmp-step-*", name): len(os.listdir(os.path.join(parent, name)))
        for name in os.listdir(parent)
    }


def logged_steps(out: str) -> list[int]:
    return [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))]


def history(out: str) -> list[dict]:
    """metrics.jsonl without what is measured in seconds (time/..., .../tokens_per_s)."""
    return [
        {k: v for k, v in json.loads(line).items() if not (k.startswith("time/") or k.endswith("_per_s"))}
        for line in open(os.path.join(out, "metrics.jsonl"))
    ]


def states_load_as_data(out: str) -> None:
    """Every checkpoint's trainer state loads with weights_only=True: tensors and plain data only."""
    parent = os.path.join(out, CHECKPOINTS)
    for name in os.listdir(parent):
        if name.startswith("step-"):
            torch.load(os.path.join(parent, name, STATE_FILE), weights_only=True)


def files(out: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, names in os.walk(out) for f in names)


def assert_same_end(out: str, straight: str) -> None:
    assert files(out) == files(straight)  # nothing left behind by the kills
    for name in os.listdir(os.path.join(straight, CHECKPOINTS)):
        ours, theirs = os.path.join(out, CHECKPOINTS, name), os.path.join(straight, CHECKPOINTS, name)
        weights, expected = (
            load_file(os.path.join(ours, "model.safetensors")),
            load_file(os.path.join(theirs, "model.safetensors")),
        )
        assert weights.keys() == expected.keys() and all(
            torch.equal(weights[k], expected[k]) for k in weights
        ), name
        state, expected = load_state(ours), load_state(theirs)
        # nothing in the loop draws from the global RNGs, and a new process seeds Python's anew
        for s in (
            state,
            expected,
        ):
            del s["rng"], s["configs"]["TrainConfig"]["output_dir"], s["configs"]["TrainConfig"]["resume"]
            s.pop("wall_seconds", None)  # measured, as summary.json's is
        assert_equal(state, expected, name)
    assert history(out) == history(straight)
    summary, expected = (json.load(open(os.path.join(d, "summary.json"))) for d in (out, straight))
    for s in (summary, expected):
        del s["wall_seconds"], s["args"]["resume"], s["args"]["output_dir"]
    assert summary == expected
    initial, expected = (json.load(open(os.path.join(d, "initial_eval.json"))) for d in (out, straight))
    assert (
        initial.pop("wall_seconds_before") > 0
        and expected.pop("wall_seconds_before") > 0
        and initial == expected
    )


def assert_equal(a, b, where: str) -> None:
    """Nested dicts, lists and tensors equal exactly."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where
