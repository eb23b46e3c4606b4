"""examples/merge_lora.py through the command (issue 58, item 1). The merged checkpoint computes the
adapted model, also from a base named by --base (the one the adapter names moved) and from a bf16 base,
and --overwrite replaces an earlier merge. Refused in one line, before anything is loaded, with every
file of the case's directory (the inputs) byte for byte as it was and nothing added: an output that is,
holds or lies inside the adapter or its base (by real paths: "." in a run, the base's parent folder, a
symlink), a directory that is not a checkpoint, a checkpoint without --overwrite, an output that cannot
be written (/proc, /sys, under a file, ""), and a missing or refused adapter. A really full disk is one
line too, and leaves nothing.

Every case runs in its own copy of one layout (`layout`), forked from the warm examples_server.
"""

import json
import os
import shutil

import pytest
import torch
from helpers import tiny_policy, tree
from safetensors.torch import load_file

import minigrpo
from minigrpo.model import Adapters, adapter_state, add_adapters

ADAPTER = "run/checkpoints/step-000002"  # a LoRA run's checkpoint, beside the run's metrics.jsonl
SCALE = 2.0  # lora_alpha / r of the adapters below
ADAPTERS = Adapters(rank=2, alpha=4, targets=("q_proj", "v_proj", "down_proj"))
MARKER = {"model_max_length": 4242}  # in the adapters' tokenizer_config.json alone: whose tokenizer was kept

# (case, arguments, working directory within the case's, what the one line on stderr says); {dir}: the
# case's directory, where the adapters' configs name their bases.
REFUSED = [
    (
        "output_holds_the_run",
        [ADAPTER, "run"],
        "",
        f"the output directory run holds the adapter {ADAPTER}, which replacing it would delete",
    ),
    (
        "output_is_dot_in_the_run",
        ["checkpoints/step-000002", "."],
        "run",
        "the output directory . holds the adapter checkpoints/step-000002",
    ),
    (
        "output_holds_the_base",
        [ADAPTER, "models"],
        "",
        "the output directory models holds the base {dir}/models/base",
    ),
    (
        "output_holds_the_base_named_by_base",
        ["elsewhere/adapter", "models", "--base", "models/base"],
        "",
        "the output directory models holds the base models/base",
    ),
    (
        "output_is_the_adapter",
        [ADAPTER, ADAPTER],
        "",
        f"the output directory {ADAPTER} is the adapter {ADAPTER}: write the merged model elsewhere",
    ),
    (
        "output_is_the_base",
        [ADAPTER, "{dir}/models/base"],
        "",
        "the output directory {dir}/models/base is the base {dir}/models/base",
    ),
    (
        "output_inside_the_adapter",
        [ADAPTER, f"{ADAPTER}/merged"],
        "",
        f"the output directory {ADAPTER}/merged lies inside the adapter {ADAPTER}",
    ),
    (
        "output_inside_the_base",
        [ADAPTER, "models/base/merged"],
        "",
        "the output directory models/base/merged lies inside the base {dir}/models/base",
    ),
    (
        "output_a_symlink_to_the_run",
        [ADAPTER, "link-to-run"],
        "",
        f"the output directory link-to-run holds the adapter {ADAPTER}",
    ),
    (
        "output_is_the_adapter_through_a_symlink",
        ["link-to-run/checkpoints/step-000002", ADAPTER],
        "",
        f"the output directory {ADAPTER} is the adapter link-to-run/checkpoints/step-000002",
    ),
    (
        "output_holds_the_run_by_a_dotted_path",
        [ADAPTER, f"{ADAPTER}/../.."],
        "",
        f"the output directory {ADAPTER}/../.. holds the adapter {ADAPTER}",
    ),
    (
        "output_not_a_checkpoint",
        [ADAPTER, "notes"],
        "",
        "the output directory notes holds a.txt, which no Hugging Face checkpoint holds: name a new or empty "
        "directory",
    ),
    (
        "output_a_checkpoint_without_overwrite",
        [ADAPTER, "merged-before"],
        "",
        "the output directory merged-before holds a checkpoint already: --overwrite replaces it whole",
    ),
    (
        "output_a_file",
        [ADAPTER, "run/metrics.jsonl"],
        "",
        "the output directory run/metrics.jsonl is a file; it must be a directory (or not exist yet)",
    ),
    (
        "output_under_a_file",
        [ADAPTER, "run/metrics.jsonl/merged"],
        "",
        "the output directory run/metrics.jsonl/merged cannot be created: {dir}/run/metrics.jsonl is a file",
    ),
    (
        "output_in_proc",
        [ADAPTER, "/proc/minigrpo-merged"],
        "",
        "the output directory /proc/minigrpo-merged cannot be written: writing a file in /proc fails",
    ),
    (
        "output_in_sys",
        [ADAPTER, "/sys/minigrpo-merged/a"],
        "",
        "the output directory /sys/minigrpo-merged/a cannot be written: writing a file in /sys fails",
    ),
    # its base's weights are cut short: the output is refused before the base is read
    (
        "output_checked_before_the_base_is_read",
        ["damaged/adapter", "/proc/minigrpo-merged"],
        "",
        "the output directory /proc/minigrpo-merged cannot be written",
    ),
    ("output_empty", [ADAPTER, ""], "", "the output directory is empty: name one, such as runs/merged"),
    (
        "adapter_missing",
        ["run/checkpoints/step-000009", "merged"],
        "",
        "no such checkpoint directory: run/checkpoints/step-000009",
    ),
    (
        "adapter_is_a_full_model",
        ["models/base", "merged"],
        "",
        "models/base is not a LoRA adapter directory",
    ),
    ("adapter_refused", ["dora", "merged"], "", "dora/adapter_config.json: use_dora = True is not supported"),
    (
        "adapter_names_no_base",
        ["nobase", "merged"],
        "",
        "nobase/adapter_config.json names no base_model_name_or_path",
    ),
    # a Hub id is no path: Qwen/ (a folder of the owner's name) is not taken to hold it, and the id is then
    # looked for in ./Qwen, as load_pretrained does (no download)
    (
        "base_a_hub_id_is_no_path",
        ["hub", "Qwen"],
        "",
        "no such checkpoint directory: Qwen/Qwen3-0.6B",
    ),
    (
        "base_moved",
        ["elsewhere/adapter", "merged"],
        "",
        "no such checkpoint directory: {dir}/models/old-place",
    ),
]
# (case, arguments, the output): merges that run, in the case's directory
MERGED = [
    ("into_a_new_directory", [ADAPTER, "merged"], "merged"),
    ("into_an_empty_directory", [ADAPTER, "empty"], "empty"),
    ("over_a_checkpoint_with_overwrite", [ADAPTER, "merged-before", "--overwrite"], "merged-before"),
    ("with_base", ["elsewhere/adapter", "merged", "--base", "models/base"], "merged"),
    (
        "with_base_from_an_adapter_without_a_tokenizer",
        ["elsewhere/bare", "merged", "--base", "models/base"],
        "merged",
    ),
    ("from_a_bf16_base", ["bf16/adapter", "merged"], "merged"),
    ("from_a_bf16_base_into_bf16", ["bf16/adapter", "merged", "--dtype", "bfloat16"], "merged"),
]


def save_adapter(base: str, directory: str, dtype: str | None = None) -> None:
    """ADAPTERS on `base` (loaded in `dtype`), B drawn at random (fresh adapters would compute the base),
    saved as a LoRA run saves them, the tokenizer's config marked with MARKER."""
    model, tokenizer = minigrpo.load_pretrained(base, dtype=dtype)
    add_adapters(model, ADAPTERS, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in adapter_state(model).items():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    minigrpo.save_pretrained(model, tokenizer, directory)
    edit_json(os.path.join(directory, "tokenizer_config.json"), MARKER)


def edit_json(path: str, changes: dict) -> None:
    """The JSON object in `path` with `changes`, in a new file (a hard link's other names keep the old)."""
    with open(path) as f:
        data = json.load(f)
    os.remove(path)
    with open(path, "w") as f:
        json.dump({**data, **changes}, f)


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> str:
    """What every case copies: the base (models/base) and its adapter (ADAPTER, beside run/metrics.jsonl);
    a symlink to run/; a directory of notes; an earlier merge (merged-before, a checkpoint) and an empty
    directory; copies of the adapter naming a base that moved (models/old-place), one without a tokenizer
    (as PEFT writes them); adapters that are DoRA, name no base, or name a Hub id (beside an empty Qwen/);
    a bf16 base with its adapter; an adapter whose base's weights are cut short."""
    root = tmp_path_factory.mktemp("merge_layout")
    base = tiny_policy(str(root / "models" / "base"))
    save_adapter(base, str(root / ADAPTER))
    (root / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (root / "link-to-run").symlink_to("run")
    (root / "notes").mkdir()
    (root / "notes" / "a.txt").write_text("a\n")
    (root / "notes" / "b.txt").write_text("b\n")
    shutil.copytree(base, root / "merged-before")
    (root / "empty").mkdir()
    shutil.copytree(root / ADAPTER, root / "elsewhere" / "adapter")
    (root / "elsewhere" / "bare").mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(root / ADAPTER / name, root / "elsewhere" / "bare" / name)
    for adapter in ("adapter", "bare"):
        moved = {"base_model_name_or_path": str(root / "models" / "old-place")}
        edit_json(str(root / "elsewhere" / adapter / "adapter_config.json"), moved)
    shutil.copytree(root / ADAPTER, root / "dora")
    edit_json(str(root / "dora" / "adapter_config.json"), {"use_dora": True})
    shutil.copytree(root / ADAPTER, root / "nobase")
    edit_json(str(root / "nobase" / "adapter_config.json"), {"base_model_name_or_path": None})
    shutil.copytree(root / ADAPTER, root / "hub")
    edit_json(str(root / "hub" / "adapter_config.json"), {"base_model_name_or_path": "Qwen/Qwen3-0.6B"})
    (root / "Qwen").mkdir()
    model, tokenizer = minigrpo.load_pretrained(base, dtype="bfloat16")
    minigrpo.save_pretrained(model, tokenizer, str(root / "bf16" / "base"))
    save_adapter(str(root / "bf16" / "base"), str(root / "bf16" / "adapter"), dtype="bfloat16")
    shutil.copytree(base, root / "damaged" / "base")
    weights = root / "damaged" / "base" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    shutil.copytree(root / ADAPTER, root / "damaged" / "adapter")
    edit_json(
        str(root / "damaged" / "adapter" / "adapter_config.json"),
        {"base_model_name_or_path": str(root / "damaged" / "base")},
    )
    return str(root)


def copy_layout(layout: str, directory: str) -> str:
    """The layout copied to `directory`, its adapters' configs naming their bases there. Its files are hard
    links to the layout's: a merge never writes a file in place (it writes new files and renames them),
    and edit_json writes a new file."""
    shutil.copytree(layout, directory, symlinks=True, copy_function=os.link)
    for folder, _, names in os.walk(directory):
        if "adapter_config.json" in names:
            path = os.path.join(folder, "adapter_config.json")
            with open(path) as f:
                base = json.load(f)["base_model_name_or_path"] or ""
            if base.startswith(layout):
                edit_json(path, {"base_model_name_or_path": directory + base.removeprefix(layout)})
    return directory


def without(paths: dict, output: str) -> dict:
    """`paths` (tree's) less the output and what is under it."""
    return {
        path: value for path, value in paths.items() if path != output and not path.startswith(output + "/")
    }


@pytest.fixture(scope="module")
def merges(layout, examples_server, tmp_path_factory):
    """Every case run in its own copy of the layout: name -> (exit status, stdout, stderr, its directory,
    its tree before the run)."""
    root = tmp_path_factory.mktemp("merges")
    results = {}
    cases = [(name, argv, cwd) for name, argv, cwd, _ in REFUSED] + [
        (name, argv, "") for name, argv, _ in MERGED
    ]
    for name, argv, cwd in cases:
        directory = copy_layout(layout, str(root / name))
        before = tree(directory)
        argv = [arg.format(dir=directory) for arg in argv]
        status = examples_server.run("merge_lora.py", argv, str(root), name, cwd=os.path.join(directory, cwd))
        stdout = (root / f"{name}.out").read_text()
        results[name] = (status, stdout, (root / f"{name}.err").read_text(), directory, before)
    return results


@pytest.mark.parametrize("case, argv, cwd, message", REFUSED, ids=[row[0] for row in REFUSED])
def test_a_refused_merge_is_one_line_and_leaves_every_file_as_it_was(merges, case, argv, cwd, message):
    status, stdout, stderr, directory, before = merges[case]
    lines = stderr.strip().splitlines()
    assert status == 1 and len(lines) == 1 and lines[0].startswith("merge_lora.py: "), stderr[-3000:]
    assert message.format(dir=directory) in lines[0]
    assert stdout == ""
    assert tree(directory) == before  # the inputs byte for byte, nothing added, nothing removed
    assert not os.path.exists("/proc/minigrpo-merged") and not os.path.exists("/sys/minigrpo-merged")


def adapted_logits(adapter: str, ids: torch.Tensor) -> torch.Tensor:
    model, _ = minigrpo.load_pretrained(adapter)
    return model(ids)


@pytest.mark.parametrize("case, argv, output", MERGED[:5], ids=[row[0] for row in MERGED[:5]])
def test_the_merged_checkpoint_computes_the_adapted_model(merges, case, argv, output):
    status, stdout, stderr, directory, before = merges[case]
    assert status == 0, stderr[-3000:]
    assert stdout == f"merged 2-rank adapters on 2 layers into {output}\n"
    after = tree(directory)
    assert without(after, output) == without(before, output)  # the inputs as they were; no temporary left
    assert sorted(os.listdir(os.path.join(directory, output))) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    merged, tokenizer = minigrpo.load_pretrained(os.path.join(directory, output))
    assert merged.adapters is None and merged.dtype == torch.float32
    ids = torch.randint(0, merged.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    # the adapted model: the same adapter's tensors on the same base
    torch.testing.assert_close(
        merged(ids), adapted_logits(os.path.join(directory, ADAPTER), ids), rtol=0, atol=1e-5
    )
    # the adapter's own tokenizer where it has one (MARKER), else the base's
    marked = tokenizer.tokenizer_config.get("model_max_length") == MARKER["model_max_length"]
    assert marked == (case != "with_base_from_an_adapter_without_a_tokenizer")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_bf16_base_is_merged_in_fp32_and_cast_once(merges, dtype):
    """W (bf16) + s B A summed in fp32, then cast to --dtype (float32 by default); the weights the
    adapters leave alone are the base's, exactly."""
    case = "from_a_bf16_base" if dtype == "float32" else "from_a_bf16_base_into_bf16"
    status, _, stderr, directory, _ = merges[case]
    assert status == 0, stderr[-3000:]
    base = load_file(os.path.join(directory, "bf16", "base", "model.safetensors"))
    adapters = load_file(os.path.join(directory, "bf16", "adapter", "adapter_model.safetensors"))
    merged = load_file(os.path.join(directory, "merged", "model.safetensors"))
    with open(os.path.join(directory, "merged", "config.json")) as f:
        assert json.load(f)["dtype"] == dtype
    assert all(t.dtype == getattr(torch, dtype) for t in merged.values())
    for block in range(2):
        for projection in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            name = f"model.layers.{block}.{projection}"
            expected = base[f"{name}.weight"].float()  # (out, in)
            if projection != "self_attn.k_proj":
                lora = f"base_model.model.{name}"
                expected = expected + SCALE * (
                    adapters[f"{lora}.lora_B.weight"] @ adapters[f"{lora}.lora_A.weight"]
                )
            assert torch.equal(merged[f"{name}.weight"], expected.to(getattr(torch, dtype))), name
    assert torch.equal(merged["model.embed_tokens.weight"].bfloat16(), base["model.embed_tokens.weight"])


def test_a_really_full_disk_during_the_merge_is_one_line_and_leaves_nothing(
    layout, tiny_disk, examples_server, tmp_path
):
    """On a tmpfs too small for the merged weights, safetensors' own error becomes the DiskFull line; the
    disk is empty afterwards and the inputs are as they were."""
    directory = copy_layout(layout, str(tmp_path / "case"))
    before = tree(directory)
    disk = tiny_disk(64)  # KiB; the merged weights are about 300
    output = os.path.join(disk, "merged")
    code = examples_server.run(
        "merge_lora.py", [os.path.join(directory, ADAPTER), output], str(tmp_path), "full"
    )
    lines = (tmp_path / "full.err").read_text().strip().splitlines()
    assert code == 1 and len(lines) == 1, lines[-20:]
    assert lines[0].startswith(f"merge_lora.py: no space left on the device to write {output} (")
    assert os.listdir(disk) == [] and tree(directory) == before


def test_help_says_what_overwrite_replaces(examples_server, tmp_path):
    assert examples_server.run("merge_lora.py", ["--help"], str(tmp_path), "help") == 0
    shown = " ".join((tmp_path / "help.out").read_text().split())
    assert "Merge a LoRA adapter into its base: a full Hugging Face checkpoint whose weights are" in shown
    overwrite = "replace the checkpoint already in output, whole (never a directory holding anything else)"
    assert f"--overwrite {overwrite}" in shown


def test_a_merge_killed_before_its_rename_leaves_a_folder_the_next_merge_deletes(
    layout, examples_server, tmp_path
):
    """kill -9 once the merged files are written, before they are renamed into place: the output does not
    exist and a hidden .merged.tmp-* holds the files. The same merge again deletes it (its space is
    needed), and leaves the case as a merge that was never killed would."""
    directory = copy_layout(layout, str(tmp_path / "case"))
    before = tree(directory)
    kill = "save_pretrained: every file written, not yet renamed into place"
    killed = examples_server.run(
        "merge_lora.py", [ADAPTER, "merged"], str(tmp_path), "killed", kill, directory
    )
    assert killed == -9, (tmp_path / "killed.err").read_text()[-3000:]
    left = sorted(set(os.listdir(directory)) - set(before))
    assert len(left) == 1 and left[0].startswith(".merged.tmp-"), left
    again = examples_server.run("merge_lora.py", [ADAPTER, "merged"], str(tmp_path), "again", cwd=directory)
    assert again == 0, (tmp_path / "again.err").read_text()[-3000:]
    assert without(tree(directory), "merged") == before
    merged, _ = minigrpo.load_pretrained(os.path.join(directory, "merged"))
    assert merged.adapters is None
