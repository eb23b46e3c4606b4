"""A checkpoint written by the code before the package moved into stage folders resumes with today's
code: tests/fixtures/old_layout_run holds a run stopped after step 1 and what the old code computed at
step 2 of the straight run (make_old_layout_run.py says how it was made).

The fixture's numbers were computed on one machine's CPU kernels; another CPU (AVX2 against AVX-512,
another vendor's oneDNN paths) sums float32 in another order and differs in the last bits. So what is
exact on every machine is compared exactly: the checkpoint's files and the structure of its trainer
state, everything resume reads that is not a float computed by a kernel (step, data position, seed,
optimizer settings, configs), the metric names and the counts; and today's own step-1 checkpoint
resumes to today's straight run bit for bit, in the same test. The old run's floats are compared
with a tolerance that is far below what a wrong resume would move them by.
"""

import json
import os
import shutil
import zipfile

import pytest
import torch
from fixtures import make_old_layout_run as fixture

import minigrpo

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", fixture.FIXTURE)
CHECKPOINT = os.path.join("run", "checkpoints", "step-000001")
STATE = os.path.join(CHECKPOINT, "trainer_state.pt")
# The sampler's and the trainer's log-probs of the same tokens under the same weights differ by float32
# rounding alone: these stats measure that rounding, which changes with the kernels (and the threads).
ROUNDING_STATS = ("mismatch/",)
ROUNDING_ATOL = 1e-6  # the stats above are of order 1e-7
# Other floats (loss, kl, entropy, grad_norm, rewards) move in their 6th-7th digit between CPUs; a resume
# that read the wrong optimizer state, data position or RNG would move them in the 1st-3rd.
RTOL = 1e-4
# Weights: one step of AdamW at lr 1e-2 moves a weight by up to 1e-2; different kernels move them by ~2e-7.
WEIGHTS_ATOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The fixture resumed by today's code, today's own run of the same job stopped after step 1 and
    resumed, and today's straight run: (resumed_old, resumed_today, straight) trainers, run in one copy
    of the fixture (its model is recorded by the relative path "policy")."""
    root = tmp_path_factory.mktemp("old_checkpoint") / "fixture"
    shutil.copytree(FIXTURE, root)
    before = os.getcwd()
    os.chdir(root)
    try:
        resumed_old = minigrpo.train("policy", fixture.task(), *fixture.settings("run", resume=True))
        minigrpo.train("policy", fixture.task(), *fixture.settings("today", stop_at_step=1))
        shutil.copytree(os.path.join("today", "checkpoints"), "today_step1")
        resumed_today = minigrpo.train("policy", fixture.task(), *fixture.settings("today", resume=True))
        straight = minigrpo.train("policy", fixture.task(), *fixture.settings("straight"))
    finally:
        os.chdir(before)
    return root, resumed_old, resumed_today, straight


def test_trainer_state_names_no_module_of_the_package():
    """trainer_state.pt holds tensors and plain data only: no pickled class of minigrpo whose module path
    a move would break."""
    with zipfile.ZipFile(os.path.join(FIXTURE, STATE)) as archive:
        pickled = [archive.read(name) for name in archive.namelist() if name.endswith(".pkl")]
    assert pickled and not any(b"minigrpo" in data for data in pickled)


def test_todays_checkpoint_has_the_old_files_and_the_same_state_to_read(runs):
    root = runs[0]
    old = root / CHECKPOINT
    today = root / "today_step1" / "step-000001"
    assert sorted(os.listdir(old)) == sorted(os.listdir(today))
    old_state = torch.load(old / "trainer_state.pt", weights_only=True)
    today_state = torch.load(today / "trainer_state.pt", weights_only=True)
    # a key today's trainer writes that resume reads with a default when it is missing
    # a LoRA run's base pinned, a distilling run's teacher: None for a run trained whole without a teacher
    added_since = {"base_sha256", "teacher_sha256"}
    assert structure(old_state) == {k: v for k, v in structure(today_state).items() if k not in added_since}
    assert all(today_state[key] is None for key in added_since)
    # what resume reads that no kernel computes: exact on every machine
    assert old_state["step"] == today_state["step"] == 1
    assert old_state["data"] == today_state["data"]
    assert old_state["optimizer"]["param_groups"] == today_state["optimizer"]["param_groups"]
    for name, old_fields in old_state["configs"].items():
        today_fields = today_state["configs"][name]
        changed = {k for k in old_fields if old_fields[k] != today_fields.get(k)}
        assert changed <= {"output_dir", "resume"}, changed  # the two runs' own folders
    assert same(old_state["rng"], today_state["rng"])  # the generators' states after step 1


def test_a_checkpoint_from_before_the_stage_folders_resumes(runs, monkeypatch):
    root, resumed_old, _, straight = runs
    monkeypatch.chdir(root)
    expected = json.load(open("expected.json"))
    assert resumed_old.step == expected["step"] == 2
    metrics = fixture.last_metrics("run")
    logged_since = {  # since LoRA; since the comparison of objectives (a side with no completion is left out)
        "training/trainable_parameters",
        "completion/length_right_mean",
        "completion/length_wrong_mean",
    }
    assert {"training/trainable_parameters"} <= set(metrics) - set(expected["metrics"]) <= logged_since
    for name, value in expected["metrics"].items():
        if isinstance(value, float) and any(name.startswith(p) for p in ROUNDING_STATS):
            assert metrics[name] == pytest.approx(value, abs=ROUNDING_ATOL), name
        elif isinstance(value, float):
            assert metrics[name] == pytest.approx(value, rel=RTOL, abs=1e-12), name
        else:  # step, group counts: exact
            assert metrics[name] == value, name
    old_weights = resumed_old.model.state_dict()
    for name, value in straight.model.state_dict().items():
        assert torch.allclose(old_weights[name], value, rtol=0, atol=WEIGHTS_ATOL), name


def test_todays_own_checkpoint_resumes_to_the_straight_run_bit_for_bit(runs):
    _, _, resumed_today, straight = runs
    assert resumed_today.step == straight.step == 2
    assert fixture.digest(resumed_today.model) == fixture.digest(straight.model)


def structure(value):
    """The nested keys of a trainer state, with each tensor's shape and dtype in place of its values."""
    if isinstance(value, dict):
        return {key: structure(item) for key, item in value.items() if key not in ("configs", "wall_seconds")}
    if isinstance(value, (list, tuple)):
        return [structure(item) for item in value]
    if torch.is_tensor(value):
        return (tuple(value.shape), value.dtype)
    return type(value).__name__


def same(a, b) -> bool:
    """Nested values equal, tensors by value."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return a == b
