"""A checkpoint written by the code before the package moved into stage folders resumes with today's
code, bit for bit: tests/fixtures/old_layout_run holds a run stopped after step 1 and what the old code
computed at step 2 of the straight run (make_old_layout_run.py says how it was made)."""

import json
import os
import shutil
import zipfile

from fixtures import make_old_layout_run as fixture

import minigrpo

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", fixture.FIXTURE)
STATE = os.path.join("run", "checkpoints", "step-000001", "trainer_state.pt")


def test_trainer_state_names_no_module_of_the_package():
    """trainer_state.pt holds tensors and plain data only: no pickled class of minigrpo whose module path
    a move would break."""
    with zipfile.ZipFile(os.path.join(FIXTURE, STATE)) as archive:
        pickled = [archive.read(name) for name in archive.namelist() if name.endswith(".pkl")]
    assert pickled and not any(b"minigrpo" in data for data in pickled)


def test_a_checkpoint_from_before_the_stage_folders_resumes_bit_for_bit(tmp_path, monkeypatch):
    shutil.copytree(FIXTURE, tmp_path / "fixture")
    monkeypatch.chdir(tmp_path / "fixture")  # the run recorded its model by the relative path "policy"
    grpo, config = fixture.settings("run", resume=True)
    trainer = minigrpo.train("policy", fixture.task(), grpo, config)
    expected = json.load(open("expected.json"))
    assert trainer.step == expected["step"]
    metrics = fixture.last_metrics("run")
    assert set(metrics) - set(expected["metrics"]) == {"training/trainable_parameters"}  # logged since LoRA
    assert {name: metrics[name] for name in expected["metrics"]} == expected["metrics"]
    assert fixture.digest(trainer.model) == expected["weights_sha256"]
