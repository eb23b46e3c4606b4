"""Hugging Face checkpoints round-trip between minigrpo and transformers; bad ones fail with a named cause."""

import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import torch
from helpers import CONFIGS, TINY, tiny_model, tiny_tokenizer, write_json
from safetensors.torch import load_file, save_file

import minigrpo
from minigrpo import files

ATOL = 1e-4
IDS = torch.randint(0, TINY["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(0))


def hf_random(**overrides):
    """A random transformers Qwen3ForCausalLM (TINY, with `overrides`). transformers is imported where it is
    used, so that collecting the suite (or running other files) does not import it."""
    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(1)
    return Qwen3ForCausalLM(HFConfig(**{**TINY, **overrides})).eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_checkpoint_loads_with_same_logits(tmp_path, name):
    hf = hf_random(**CONFIGS[name])
    hf.save_pretrained(tmp_path)
    model, tokenizer = minigrpo.load_pretrained(str(tmp_path))
    assert tokenizer is None and model.dtype == torch.float32 and not model.training
    with torch.no_grad():
        assert (model(IDS) - hf(IDS).logits).abs().max() <= ATOL


@pytest.mark.parametrize("name", CONFIGS)
def test_our_checkpoint_loads_in_transformers(tmp_path, name):
    model = tiny_model(**CONFIGS[name])
    minigrpo.save_pretrained(model, None, tmp_path / "ckpt")
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert isinstance(hf, Qwen3ForCausalLM)
    with torch.no_grad():
        assert (model(IDS) - hf(IDS).logits).abs().max() <= ATOL


def test_sharded_checkpoints_round_trip(tmp_path):
    hf = hf_random()
    hf.save_pretrained(tmp_path / "theirs", max_shard_size="20KB")
    assert os.path.exists(tmp_path / "theirs" / "model.safetensors.index.json")
    model, _ = minigrpo.load_pretrained(str(tmp_path / "theirs"))
    with torch.no_grad():
        assert (model(IDS) - hf(IDS).logits).abs().max() <= ATOL

    minigrpo.save_pretrained(model, None, tmp_path / "ours", max_shard_bytes=20_000)
    shards = [
        f for f in os.listdir(tmp_path / "ours") if re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f)
    ]
    assert len(shards) > 1
    again, _ = minigrpo.load_pretrained(str(tmp_path / "ours"))
    from transformers import Qwen3ForCausalLM

    reread = Qwen3ForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert torch.equal(again(IDS), model(IDS))
        assert (reread(IDS).logits - model(IDS)).abs().max() <= ATOL


def test_dtype_is_chosen_at_load(tmp_path):
    minigrpo.save_pretrained(tiny_model(), None, tmp_path)
    model, _ = minigrpo.load_pretrained(str(tmp_path), dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"


def test_tokenizer_and_side_files_round_trip(tmp_path):
    tokenizer = tiny_tokenizer(str(tmp_path / "tok"))
    minigrpo.save_pretrained(tiny_model(), tokenizer, tmp_path / "ckpt")
    _, again = minigrpo.load_pretrained(str(tmp_path / "ckpt"))
    text = "What is 12 + 30?"
    assert again.encode(text) == tokenizer.encode(text) and again.decode(again.encode(text)) == text
    assert again.eos_token_ids == tokenizer.eos_token_ids and again.pad_token_id == tokenizer.pad_token_id


def test_save_replaces_an_existing_checkpoint_whole(tmp_path):
    target = tmp_path / "ckpt"
    minigrpo.save_pretrained(tiny_model(seed=0), None, target, max_shard_bytes=20_000)
    # now a single file: no stale shards may remain
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary directories left behind
    loaded, _ = minigrpo.load_pretrained(str(target))
    with torch.no_grad():
        assert torch.equal(loaded(IDS), tiny_model(seed=1)(IDS))


def record_file_operations(monkeypatch) -> list[tuple]:
    """The fsyncs (files.fsync: of a file or a directory), renames and tree deletions from now on, in order,
    each as (what, path[, destination]); each is then done."""
    events = []

    def recorded(what, real):
        def call(*args, **kwargs):
            events.append((what, *map(os.fspath, args)))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(files, "fsync", recorded("fsync", files.fsync))
    monkeypatch.setattr(os, "rename", recorded("rename", os.rename))
    monkeypatch.setattr(shutil, "rmtree", recorded("rmtree", shutil.rmtree))
    return events


def test_a_replaced_checkpoint_is_deleted_only_once_the_new_one_is_on_disk(tmp_path, monkeypatch):
    """A power cut while a save replaces a checkpoint (merge_lora.py --overwrite, pretrain_tiny.py
    --overwrite) loses neither: every file of the new directory, and the directory, is synced before the old
    is renamed away, and their parent (the renames) before the old is deleted. A save into a new place syncs
    nothing: no old copy is at risk."""
    target = tmp_path / "ckpt"
    events = record_file_operations(monkeypatch)
    minigrpo.save_pretrained(tiny_model(seed=0), None, target)
    assert [event for event in events if event[0] == "fsync"] == []
    events.clear()
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    renames = [event for event in events if event[0] == "rename"]
    assert len(renames) == 2 and renames[0][1] == str(target) and renames[1][2] == str(target)
    new, old = renames[1][1], os.path.dirname(renames[0][2])  # .ckpt.tmp-*, .ckpt.old-*
    away, into = events.index(renames[0]), events.index(renames[1])
    synced_before = {event[1] for event in events[:away] if event[0] == "fsync"}
    assert synced_before == {new, os.path.join(new, "config.json"), os.path.join(new, "model.safetensors")}
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]  # all the new files were synced
    deleted = events.index(("rmtree", old))
    assert ("fsync", str(tmp_path)) in events[into + 1 : deleted]
    assert os.listdir(tmp_path) == ["ckpt"]
    loaded, _ = minigrpo.load_pretrained(str(target))
    with torch.no_grad():
        assert torch.equal(loaded(IDS), tiny_model(seed=1)(IDS))


def plant(directory, files: dict[str, bytes]) -> None:
    """`directory` made with these files (relative paths) in it."""
    for name, data in files.items():
        os.makedirs(os.path.dirname(directory / name), exist_ok=True)
        (directory / name).write_bytes(data)


def test_a_save_deletes_what_a_killed_save_into_the_same_place_left(tmp_path):
    """A kill mid-save leaves .NAME.tmp-* (the new files, not yet renamed) or .NAME.old-* (the old copy,
    renamed away): the next save into NAME deletes them. It leaves what a living process holds (a save
    into NAME running meanwhile), another directory's leftovers, and an earlier copy while NAME is missing:
    a kill between the two renames left it the only one."""
    target = tmp_path / "ckpt"
    plant(tmp_path, {".ckpt.old-keep_me0/previous/config.json": b"{}"})
    minigrpo.save_pretrained(tiny_model(seed=0), None, target)
    assert sorted(os.listdir(tmp_path)) == [".ckpt.old-keep_me0", "ckpt"]  # then the only copy
    plant(
        tmp_path,
        {
            ".ckpt.tmp-killed00/model.safetensors": b"half",
            ".ckpt.tmp-running0/config.json": b"{}",
            ".other.tmp-killed00/model.safetensors": b"half",
            "notes.txt": b"mine",
        },
    )
    running = os.open(tmp_path / ".ckpt.tmp-running0", os.O_RDONLY)  # a save into ckpt, in progress
    try:
        fcntl.flock(running, fcntl.LOCK_EX)
        minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    finally:
        os.close(running)
    assert sorted(os.listdir(tmp_path)) == [".ckpt.tmp-running0", ".other.tmp-killed00", "ckpt", "notes.txt"]
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)  # the lock ended with its holder
    assert sorted(os.listdir(tmp_path)) == [".other.tmp-killed00", "ckpt", "notes.txt"]


def test_a_save_in_progress_is_no_leftover_to_a_save_into_the_same_place(tmp_path, monkeypatch):
    """Two saves into one place at once: the one that cleans up leaves the other's temporary directory
    (locked while it is written in) and its old copy (locked while it is renamed away and deleted)."""
    target = tmp_path / "ckpt"
    with files.directory_beside(str(target)) as writing:
        minigrpo.save_pretrained(tiny_model(seed=0), None, target)
        assert os.path.isdir(writing)
    real_rename = os.rename

    def other_save_cleans_up_first(source, destination):
        if os.path.basename(destination) == "previous":  # the old copy's directory, made and still empty
            files.remove_leftovers(str(target))
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", other_save_cleans_up_first)
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_leftover_this_process_cannot_open_is_left(tmp_path, monkeypatch):
    """Another user's temporary directory (here: os.open refused, as root is never refused) is not this
    process's to delete."""
    plant(tmp_path, {".ckpt.tmp-theirs00/config.json": b"{}"})
    real_open = os.open

    def not_ours(path, *args, **kwargs):
        if os.path.basename(path) == ".ckpt.tmp-theirs00":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", not_ours)
    minigrpo.save_pretrained(tiny_model(seed=0), None, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path)) == [".ckpt.tmp-theirs00", "ckpt"]


def test_a_leftover_two_saves_delete_at_once_fails_neither(tmp_path, monkeypatch):
    plant(tmp_path, {".ckpt.tmp-killed00/config.json": b"{}"})
    real_in_use = files._in_use

    def deleted_by_the_other_save_too(path):
        free = real_in_use(path)
        shutil.rmtree(path)  # the other save's cleanup, between this one's look and its delete
        return free

    monkeypatch.setattr(files, "_in_use", deleted_by_the_other_save_too)
    minigrpo.save_pretrained(tiny_model(seed=0), None, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_an_error_once_the_new_checkpoint_is_in_place_is_raised_as_itself(tmp_path, monkeypatch):
    """The parent's sync fails after the renames: the error is that failure (not the temporary directory,
    already renamed, missing), the new checkpoint is in place, and the old copy left is the next save's
    to delete."""
    target = tmp_path / "ckpt"
    minigrpo.save_pretrained(tiny_model(seed=0), None, target)
    real_fsync = files.fsync

    def parent_fails(path):
        if path == str(tmp_path):
            raise OSError(errno.EIO, "Input/output error", path)
        real_fsync(path)

    monkeypatch.setattr(files, "fsync", parent_fails)
    with pytest.raises(OSError, match="Input/output error"):
        minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    loaded, _ = minigrpo.load_pretrained(str(target))
    with torch.no_grad():
        assert torch.equal(loaded(IDS), tiny_model(seed=1)(IDS))
    assert len(os.listdir(tmp_path)) == 2  # ckpt and .ckpt.old-*
    monkeypatch.setattr(files, "fsync", real_fsync)
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_an_old_copy_that_cannot_be_deleted_does_not_fail_the_save_that_replaced_it(tmp_path, monkeypatch):
    """A file of the old copy refuses to go (a read-only folder, for a user who is not root): the save has
    replaced the checkpoint, and says nothing; the next save deletes the rest."""
    target = tmp_path / "ckpt"
    minigrpo.save_pretrained(tiny_model(seed=0), None, target)
    real_unlink = os.unlink

    def old_weights_stay(path, *args, **kwargs):
        if path == "model.safetensors" and kwargs.get("dir_fd") is not None:  # rmtree's, inside previous/
            raise PermissionError(13, "Permission denied", path)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", old_weights_stay)
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert len(os.listdir(tmp_path)) == 2  # ckpt and .ckpt.old-*
    monkeypatch.setattr(os, "unlink", real_unlink)
    minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    minigrpo.save_pretrained(tiny_model(seed=0), None, target)
    before = (target / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(minigrpo.model.weights, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        minigrpo.save_pretrained(tiny_model(seed=1), None, target)
    assert (target / "model.safetensors").read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt"]


# --- bad input: a clear CheckpointError naming the problem -------------------------------------------
@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good"
    minigrpo.save_pretrained(tiny_model(), None, path)
    return path


def edit_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def edit_config(path, edit):
    config = json.loads((path / "config.json").read_text())
    edit(config)
    write_json(path / "config.json", config)


def test_error_no_such_directory(tmp_path):
    with pytest.raises(minigrpo.CheckpointError, match="no such checkpoint directory"):
        minigrpo.load_pretrained(str(tmp_path / "missing" / "dir"))


def test_error_directory_without_config(tmp_path):
    with pytest.raises(minigrpo.CheckpointError, match="has no config.json"):
        minigrpo.load_pretrained(str(tmp_path))


def test_error_directory_without_weights(good):
    os.remove(good / "model.safetensors")
    torch.save({}, good / "pytorch_model.bin")
    with pytest.raises(
        minigrpo.CheckpointError, match="no model.safetensors.*pytorch_model.bin.*never pickle"
    ):
        minigrpo.load_pretrained(str(good))


def test_error_wrong_model_type(good):
    edit_config(good, lambda c: c.update(model_type="llama"))
    with pytest.raises(minigrpo.CheckpointError, match="model_type is 'llama'.*only runs 'qwen3'"):
        minigrpo.load_pretrained(str(good))


def test_error_missing_config_key(good):
    edit_config(good, lambda c: c.pop("hidden_size"))
    with pytest.raises(minigrpo.CheckpointError, match="lacks required key.*hidden_size"):
        minigrpo.load_pretrained(str(good))


def test_error_config_not_json(good):
    (good / "config.json").write_text("{not json")
    with pytest.raises(minigrpo.CheckpointError, match="config.json is not valid JSON"):
        minigrpo.load_pretrained(str(good))


def test_error_missing_tensor(good):
    edit_weights(good, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(minigrpo.CheckpointError, match="missing: model.layers.1.mlp.up_proj.weight"):
        minigrpo.load_pretrained(str(good))


def test_error_unexpected_tensor(good):
    edit_weights(good, lambda t: t.update({"model.layers.7.mlp.up_proj.weight": torch.zeros(2)}))
    with pytest.raises(minigrpo.CheckpointError, match="unexpected: model.layers.7.mlp.up_proj.weight"):
        minigrpo.load_pretrained(str(good))


def test_error_wrong_shape_names_the_tensor(good):
    edit_weights(
        good,
        lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(5, TINY["hidden_size"])}),
    )
    with pytest.raises(
        minigrpo.CheckpointError,
        match=r"k_proj.weight .* has shape \(5, 48\), but config.json implies \(32, 48\)",
    ):
        minigrpo.load_pretrained(str(good))


def test_error_wrong_shape_of_an_unfused_tensor(good):
    edit_weights(good, lambda t: t.update({"model.norm.weight": torch.zeros(3)}))
    with pytest.raises(
        minigrpo.CheckpointError,
        match=r"tensor model.norm.weight .* has shape \(3,\), but config.json implies \(48,\)",
    ):
        minigrpo.load_pretrained(str(good))


def test_error_unreachable_hub_id_while_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        minigrpo.CheckpointError, match="could not fetch 'nobody/no-such-model' from the Hugging Face Hub"
    ):
        minigrpo.load_pretrained("nobody/no-such-model")


def test_library_never_imports_transformers():
    root = os.path.join(os.path.dirname(__file__), "..", "minigrpo")
    for dirpath, _, names in os.walk(root):
        for file in names:
            if file.endswith(".py"):
                source = open(os.path.join(dirpath, file)).read()
                assert not re.search(r"^\s*(import|from)\s+transformers\b", source, re.M), file


def test_download_command_reports_an_unreachable_hub_cleanly(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from minigrpo import download

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as stop:
        download.main(["nobody/no-such-model", "--dir", str(tmp_path / "target")])
    assert str(stop.value.code).startswith(
        "python -m minigrpo.download: could not fetch 'nobody/no-such-model'"
    )
    assert not (tmp_path / "target").exists() or not os.listdir(tmp_path / "target")


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000]),
            "truncated",
        ),
        (lambda d: (d / "model.safetensors").write_bytes(b""), "empty"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 100), "garbage"),
    ],
)
def test_error_damaged_safetensors_names_the_file(good, damage, message):
    damage(good)
    with pytest.raises(
        minigrpo.CheckpointError,
        match=re.escape(f"{good}/model.safetensors is not a readable safetensors file"),
    ):
        minigrpo.load_pretrained(str(good))


@pytest.mark.parametrize(
    "file, text, message",
    [
        ("config.json", "null", "config.json holds null, not a JSON object"),
        ("config.json", "[1, 2]", r"config.json holds \[1, 2\], not a JSON object"),
        (
            "model.safetensors.index.json",
            '{"weight_map": null}',
            "model.safetensors.index.json has no weight_map",
        ),
        (
            "tokenizer.json",
            "{not json",
            "tokenizer.json is not a tokenizer file the tokenizers library can read",
        ),
        ("tokenizer_config.json", "{not json", "tokenizer_config.json is not valid JSON"),
        ("generation_config.json", "[1]", r"generation_config.json holds \[1\], not a JSON object"),
    ],
)
def test_error_bad_side_file_names_it(tmp_path, file, text, message):
    minigrpo.save_pretrained(
        tiny_model(vocab_size=300), tiny_tokenizer(str(tmp_path / "tokenizer")), tmp_path / "ckpt"
    )
    (tmp_path / "ckpt" / file).write_text(text)
    with pytest.raises(minigrpo.CheckpointError, match=message):
        minigrpo.load_pretrained(str(tmp_path / "ckpt"))


def test_error_unknown_or_absent_device(good):
    from minigrpo.model import parse_device

    with pytest.raises(ValueError, match="unknown device 'bogus'"):
        minigrpo.load_pretrained(str(good), device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="asks for a GPU, but torch sees none"):
            parse_device("cuda")
    assert parse_device("cpu") == torch.device("cpu")


def test_save_refuses_to_replace_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(minigrpo.CheckpointError, match="notes.txt is a file"):
        minigrpo.save_pretrained(tiny_model(), None, tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "keep me"


# --- a named pipe in place of a file: refused in one line, never read (a read waits for a writer) -----
MODEL_FILES = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
]
ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"]


def checkpoint_with_every_file(directory) -> str:
    """A tiny checkpoint with a tokenizer, its side files and a chat template."""
    minigrpo.save_pretrained(tiny_model(vocab_size=300), tiny_tokenizer(str(directory)), directory)
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return str(directory)


def load_with_a_deadline(path: str, fifo: str, seconds: float = 30.0) -> Exception | None:
    """What load_pretrained(path) raises (None if it loads). A load still waiting on the FIFO after
    `seconds` is let go by another process, which opens the pipe's write end and closes it (again for
    each later open) so that every read ends, and the test fails. (A thread with a deadline could not
    do it: safetensors and tokenizers wait in open() holding the GIL.)"""
    releaser = subprocess.Popen(["sh", "-c", 'sleep "$0"; while :; do : > "$1"; done', str(seconds), fifo])
    started = time.monotonic()
    try:
        minigrpo.load_pretrained(path)
        error = None
    except Exception as raised:
        error = raised
    finally:
        waited = time.monotonic() - started
        releaser.kill()
        releaser.wait()
    assert waited < seconds, f"load_pretrained waited on the named pipe {fifo} for {waited:.0f} s"
    return error


@pytest.mark.parametrize("name", MODEL_FILES + ADAPTER_FILES)
def test_a_named_pipe_in_place_of_a_file_is_refused_in_one_line(tmp_path, name):
    path = checkpoint_with_every_file(tmp_path / "base")
    if name in ADAPTER_FILES:
        model, tokenizer = minigrpo.load_pretrained(path)
        minigrpo.model.add_adapters(model, minigrpo.model.Adapters(rank=2, alpha=4, targets=("q_proj",)))
        minigrpo.save_pretrained(model, tokenizer, tmp_path / "adapter")
        path = str(tmp_path / "adapter")
    fifo = os.path.join(path, name)
    if os.path.exists(fifo):
        os.remove(fifo)
    os.mkfifo(fifo)
    error = load_with_a_deadline(path, fifo)
    assert isinstance(error, ValueError), error
    assert str(error) == f"{fifo} is a named pipe (FIFO), not a regular file"
