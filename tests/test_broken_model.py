"""Training never saves a broken model (issue 22, section 2): float16 weights are refused, weights
that are not finite after a step stop the run unsaved, a resume names another --model as an error,
a damaged newest checkpoint (tokenizer, tensor shapes, bytes that fail their checksum, a trainer
state missing keys) is named and skipped, a full disk is one line with nothing partial left, and a
metrics line that is JSON but not a step's record is named and dropped."""

import errno
import json
import os
import re
import shutil

import pytest
import torch
from helpers import VOWELS, addition_rows, tiny_policy, tiny_run, tiny_train_config
from safetensors.torch import load_file, save_file

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig
from minigrpo.files import DiskFull, replace_json
from minigrpo.run import (
    CHECKPOINTS,
    CHECKSUMS,
    STATE_FILE,
    STATE_KEYS,
    MetricsLogger,
    build_run,
    latest_intact_checkpoint,
    save_checkpoint,
    write_checksums,
)
from minigrpo.update import NonFiniteWeights

ROWS = addition_rows(3, 2)
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_policy(str(tmp_path_factory.mktemp("policy")), max_position_embeddings=64)


@pytest.fixture(scope="module")
def other_policy(tmp_path_factory):
    return tiny_policy(str(tmp_path_factory.mktemp("other")), max_position_embeddings=64, rope_theta=1000.0)


def settings(out, **overrides) -> tuple[GRPOConfig, TrainConfig]:
    grpo = GRPOConfig(num_generations=2, max_completion_length=6)
    return grpo, tiny_train_config(
        out, **{"batch_size": 4, "save_every": 1, "save_total_limit": 3, **overrides}
    )


def task() -> Task:
    return Task(ROWS, [RewardSpec(VOWELS)])


@pytest.fixture(scope="module")
def trained(policy, tmp_path_factory):
    """A run of 2 steps that saved both: checkpoints step-000001 and step-000002."""
    out = tmp_path_factory.mktemp("trained") / "run"
    minigrpo.train(policy, task(), *settings(out))
    return str(out)


@pytest.fixture
def run(trained, tmp_path):
    """A copy of `trained` to damage."""
    return str(shutil.copytree(trained, tmp_path / "run"))


def newest(out: str, *name: str) -> str:
    return os.path.join(out, CHECKPOINTS, "step-000002", *name)


def resign(directory: str) -> None:
    """Checksums written again for the files as they are now: damage that was saved as it is."""
    os.remove(os.path.join(directory, CHECKSUMS))
    write_checksums(directory)


# -- 7: float16, and weights that are not finite after a step ---------------------------------
def test_float16_weights_are_refused_naming_bf16_or_fp32(policy, tmp_path):
    with pytest.raises(ValueError, match="float16, which AdamW cannot train .* use bfloat16 or float32"):
        build_run(policy, task(), *settings(tmp_path / "run"), dtype="float16")
    assert not os.path.exists(tmp_path / "run" / CHECKPOINTS)


def test_weights_that_are_not_finite_stop_the_run_before_any_save(run, policy, monkeypatch):
    """Resumed at step 2, step 3's AdamW step leaves a NaN: the run stops naming step 3; the checkpoints
    and metrics lines of steps 1 and 2 stay, and nothing of step 3 is saved or logged."""
    resumed = build_run(policy, task(), *settings(run, max_steps=3, resume=True))
    trainer = resumed.trainer
    real_step = trainer.optimizer.step

    def step_then_poison(*args, **kwargs):
        real_step(*args, **kwargs)
        with torch.no_grad():
            trainer.model.norm.weight[0] = float("nan")

    monkeypatch.setattr(trainer.optimizer, "step", step_then_poison)
    with pytest.raises(
        NonFiniteWeights, match=r"step 3: the AdamW step left NaN or inf in the weights \(norm\.weight\)"
    ):
        resumed.train()
    assert sorted(os.listdir(os.path.join(run, CHECKPOINTS))) == ["step-000001", "step-000002"]
    assert [json.loads(line)["step"] for line in open(os.path.join(run, "metrics.jsonl"))] == [1, 2]


def test_the_check_tells_huge_finite_weights_from_nan_and_inf(policy, tmp_path):
    """Its fused sum of norms overflows for finite weights of 1e30 (their squares do): not an error."""
    trainer = build_run(policy, task(), *settings(tmp_path / "run")).trainer
    with torch.no_grad():
        trainer.model.norm.weight.fill_(1e30)
    trainer.updater._check_finite_weights(step=5)
    for broken in (float("inf"), float("-inf"), float("nan")):
        with torch.no_grad():
            trainer.model.layers[1].mlp.up_proj.weight[0, 0] = broken
        with pytest.raises(NonFiniteWeights, match=r"step 5: .* \(layers\.1\.mlp\.up_proj\.weight\)"):
            trainer.updater._check_finite_weights(step=5)


def test_train_math_says_float16_and_broken_weights_in_one_line(examples_server, policy, tmp_path):
    """The command line: --dtype float16 is one line before any work; a step that breaks the weights
    is one line naming the step, exit 1, and no checkpoint of it."""
    run = tiny_run(rewards=VOWELS, micro_batch_size=4, train_count=6)
    args = ["--model", policy, *run, "--no-progress_bar"]
    fp16 = [*args, "--output_dir", str(tmp_path / "fp16"), "--dtype", "float16"]
    code = examples_server.train_math(fp16, None, str(tmp_path), "fp16")
    err = (tmp_path / "fp16.err").read_text()
    assert code == 1 and err.count("\n") == 1 and "use bfloat16 or float32" in err, err
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED.format(train_math=os.path.join(EXAMPLES, "train_math.py")))
    poisoned = [*args, "--output_dir", str(tmp_path / "nan")]
    code = examples_server.run(str(script), poisoned, str(tmp_path), "nan")
    err = (tmp_path / "nan.err").read_text()
    assert code == 1 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("train_math.py: step 2: the AdamW step left NaN or inf"), err
    assert sorted(os.listdir(tmp_path / "nan" / CHECKPOINTS)) == ["step-000001"]


POISONED = """
import os, runpy, sys, torch
real_step = torch.optim.AdamW.step
steps = []

def step_then_poison(self, *args, **kwargs):  # the second AdamW step leaves an inf in the weights
    real_step(self, *args, **kwargs)
    steps.append(1)
    if len(steps) == 2:
        with torch.no_grad():
            self.param_groups[0]["params"][0].view(-1)[0] = float("inf")

torch.optim.AdamW.step = step_then_poison
sys.argv[0] = {train_math!r}
sys.path[0] = os.path.dirname({train_math!r})
runpy.run_path({train_math!r}, run_name="__main__")
"""


# -- 8: a resume that names another model -------------------------------------------------------
def test_a_resume_from_another_model_is_refused(trained, policy, other_policy, tmp_path):
    out = shutil.copytree(trained, tmp_path / "run")
    with pytest.raises(
        ValueError, match=f"started from {policy}, not {other_policy}: resume with that model"
    ):
        build_run(other_policy, task(), *settings(out, max_steps=3, resume=True))
    # the same policy path, spelled another way
    same_model = build_run(policy + "/", task(), *settings(out, max_steps=3, resume=True)).trainer
    assert same_model.step == 2


# -- 9 and 11: a damaged newest checkpoint is named and skipped --------------------------------
def bad_tokenizer(directory):
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump({"model": {"type": "NoSuchModel"}}, f)
    resign(directory)


def deleted_tokenizer(directory):
    os.remove(os.path.join(directory, "tokenizer.json"))


def wrong_shape(directory):
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    resign(directory)


def zeroed_bytes(directory):
    path = os.path.join(directory, "model.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 4096)
        f.write(bytes(4096))  # the same length, the last tensors' bytes zeroed: only the checksum sees it


def state_missing_a_key(directory):
    path = os.path.join(directory, STATE_FILE)
    state = torch.load(path, weights_only=True)
    del state["optimizer"]
    torch.save(state, path)
    resign(directory)


DAMAGE = {  # how the newest checkpoint is damaged -> what the note must say
    bad_tokenizer: "tokenizer.json is not a tokenizer file the tokenizers library can read",
    deleted_tokenizer: "tokenizer.json is missing",
    wrong_shape: "tensor model.norm.weight in .* has shape \\(47,\\), but config.json implies \\(48,\\)",
    zeroed_bytes: f"model.safetensors does not match its sha256 in {CHECKSUMS}",
    state_missing_a_key: f"{STATE_FILE} lacks optimizer",
}


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda damage: damage.__name__)
def test_a_damaged_newest_checkpoint_is_named_and_the_resume_falls_back(run, policy, damage, capsys):
    damage(newest(run))
    notes = []
    previous = os.path.join(run, CHECKPOINTS, "step-000001")
    assert latest_intact_checkpoint(run, notes.append, STATE_KEYS) == previous
    assert len(notes) == 1 and notes[0].startswith(f"note: {newest(run)} is damaged ("), notes
    assert re.search(DAMAGE[damage], notes[0]), notes[0]
    capsys.readouterr()
    trainer = build_run(policy, task(), *settings(run, max_steps=3, resume=True)).trainer
    assert trainer.step == 1 and "is damaged" in capsys.readouterr().out


def test_a_checkpoint_without_a_tokenizer_or_checksums_is_named_not_the_model(run, policy):
    """A checkpoint of an older minigrpo (no checksums) that lost its tokenizer.json: the error names it."""
    for step in ("step-000001", "step-000002"):
        os.remove(os.path.join(run, CHECKPOINTS, step, CHECKSUMS))
    os.remove(newest(run, "tokenizer.json"))
    with pytest.raises(ValueError, match=f"{newest(run)} has no tokenizer.json"):
        build_run(policy, task(), *settings(run, max_steps=3, resume=True))


def test_a_metrics_line_that_is_json_but_not_a_record_is_named_and_dropped(tmp_path, capsys):
    lines = ['{"step": 1, "loss": 0.5}', "[1, 2]", '"text"', '{"step": "2"}', "7", '{"step": 2, "loss": 0.4}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    MetricsLogger(str(tmp_path), max_steps=5, start_step=1, progress_bar=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'
    notes = capsys.readouterr().out.splitlines()
    assert [note.split(" line ")[1].split(" ")[0] for note in notes] == ["2", "3", "4", "5"], notes


# -- 10: a full disk -----------------------------------------------------------------------------
def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_at_a_checkpoint_is_one_line_and_leaves_nothing(policy, tmp_path, monkeypatch):
    model, tokenizer = minigrpo.load_pretrained(policy)
    out = str(tmp_path / "run")
    save_checkpoint(out, 1, model, tokenizer, {"step": 1}, keep=3)
    monkeypatch.setattr(torch, "save", no_space)
    full = r"no space left on the device to write .*step-000002 \([\d.]+ (bytes|MiB|GiB) free there\)"
    with pytest.raises(DiskFull, match=full) as error:
        save_checkpoint(out, 2, model, tokenizer, {"step": 2}, keep=3)
    assert "\n" not in str(error.value) and error.value.__cause__ is None and error.value.__suppress_context__
    assert os.listdir(os.path.join(out, CHECKPOINTS)) == ["step-000001"]  # no temporary directory left


def test_a_full_disk_at_save_pretrained_is_one_line_and_keeps_the_directory_it_would_replace(
    policy, tmp_path, monkeypatch
):
    """save_pretrained (merge_lora.py's and pretrain_tiny.py's write) turns a full disk into the DiskFull line
    a training checkpoint's write gives, not safetensors' error; the directory it would replace is as it was,
    and no temporary directory is left."""
    model, tokenizer = minigrpo.load_pretrained(policy)
    out = tmp_path / "merged"
    minigrpo.save_pretrained(model, tokenizer, str(out))
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    monkeypatch.setattr(minigrpo.model.weights, "save_file", no_space)
    full = rf"no space left on the device to write {out} \([\d.]+ (bytes|MiB|GiB) free there\)"
    with pytest.raises(DiskFull, match=full) as error:
        minigrpo.save_pretrained(model, tokenizer, str(out))
    assert "\n" not in str(error.value) and error.value.__cause__ is None and error.value.__suppress_context__
    assert os.listdir(tmp_path) == ["merged"]
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_a_full_disk_at_a_whole_file_replacement_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "summary.json")
    replace_json(path, {"old": 1})
    monkeypatch.setattr(json, "dump", no_space)
    with pytest.raises(DiskFull, match="no space left on the device to write .*summary.json"):
        replace_json(path, {"new": 2})
    assert json.load(open(path)) == {"old": 1} and os.listdir(tmp_path) == ["summary.json"]


class HalfFullFile:
    """A metrics file whose disk fills up halfway through a line."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        self.file.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self):
        return self.file.fileno()

    def close(self):
        self.file.close()


def test_a_full_disk_at_a_metrics_line_is_one_line_and_leaves_no_line_cut_short(tmp_path):
    logger = MetricsLogger(str(tmp_path), max_steps=3, start_step=0, progress_bar=False)
    logger.log(1, {"loss": 0.5})
    logger.file = HalfFullFile(logger.file)
    with pytest.raises(DiskFull, match="no space left on the device to write .*metrics.jsonl"):
        logger.log(2, {"loss": 0.4})
    logger.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'


@pytest.mark.parametrize("overflows", ["weights", "trainer state", "json"])
def test_a_really_full_disk_is_one_line_and_leaves_nothing(policy, tiny_disk, overflows):
    """On a real full disk torch.save and safetensors raise errors of their own (torch's never says the
    disk is full); each becomes a DiskFull, and the save's temporary directory is removed."""
    model, tokenizer = minigrpo.load_pretrained(policy)
    policy_kib = sum(os.path.getsize(os.path.join(policy, name)) for name in os.listdir(policy)) // 1024
    disk = tiny_disk(64 if overflows == "weights" else policy_kib + 64)  # the weights do not fit, or do
    state = {"step": 1, "blob": torch.zeros(2**18)}  # (262144,) 1 MiB: never fits
    with pytest.raises(DiskFull, match=r"no space left on the device to write .* free there\)"):
        if overflows == "json":
            replace_json(os.path.join(disk, "summary.json"), {"text": "x" * 2**20})
        else:
            save_checkpoint(disk, 1, model, tokenizer, state, keep=3)
    leftovers = [os.path.relpath(os.path.join(d, f), disk) for d, _, names in os.walk(disk) for f in names]
    assert leftovers == [] and os.listdir(disk) in ([], [CHECKPOINTS])
