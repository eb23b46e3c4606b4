"""Hugging Face checkpoints round-trip between minigrpo and transformers; bad ones fail with a named cause."""

import json
import os
import re
import subprocess
import time

import pytest
import torch
from helpers import CONFIGS, TINY, tiny_model, tiny_tokenizer, write_json
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM
from transformers import Qwen3Config as HFConfig

import minigrpo

ATOL = 1e-4
IDS = torch.randint(0, TINY["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(0))


def hf_random(**overrides) -> Qwen3ForCausalLM:
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
    for dirpath, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                source = open(os.path.join(dirpath, file)).read()
                assert not re.search(r"^\s*(import|from)\s+transformers\b", source, re.M), file


def test_download_command_reports_an_unreachable_hub_cleanly(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    from minigrpo import download

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download.main(["nobody/no-such-model", "--dir", str(tmp_path / "target")]) == 1
    assert "error: could not fetch 'nobody/no-such-model'" in capsys.readouterr().err
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
