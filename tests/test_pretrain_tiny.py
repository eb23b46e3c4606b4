"""examples/pretrain_tiny.py's --output through the command (issue 58, item 1, as merge_lora.py's): the
output is replaced whole, so it is refused in one line, before any work and with every file of the case's
directory byte for byte as it was, when it is a directory that is not a checkpoint ("." in a run, a folder
of runs, a checkpoint with notes beside it, even with --overwrite), a checkpoint without --overwrite, "",
or a place that cannot be written (/proc, /sys). A file and a path under one: test_bad_input.py. That
--overwrite replaces a checkpoint whole: test_example_tools.py's one-step run.

Every case runs in its own copy of one layout, forked from the warm examples_server.
"""

import os
import shutil

import pytest
from helpers import ROOT, tree

EMBEDDED = os.path.join(ROOT, "models", "minigrpo-tiny-arith")  # a checkpoint of this script's
# flags that keep a run short, so that a refusal that failed would cost seconds, not the default minute
SHORT = ["--max_steps", "1", "--eval_every", "1", "--batch_size", "4", "--eval_count", "8"]
# (case, arguments, working directory within the case's, what the one line on stderr says)
REFUSED = [
    (
        "output_is_dot_in_a_run",
        ["--output", "."],
        "run",
        "--output . holds metrics.jsonl, which no Hugging Face checkpoint holds: name a new or empty "
        "directory",
    ),
    (
        "output_holds_runs",
        ["--output", "runs"],
        "",
        "--output runs holds a, which no Hugging Face checkpoint",
    ),
    (
        "output_holds_checkpoints_with_overwrite",
        ["--output", ".", "--overwrite"],
        "",
        "--output . holds notes.txt, which no Hugging Face checkpoint holds",
    ),
    (
        "output_a_checkpoint_without_overwrite",
        ["--output", "tiny"],
        "",
        "--output tiny holds a checkpoint already: --overwrite replaces it whole",
    ),
    (
        "output_a_checkpoint_and_notes_with_overwrite",
        ["--output", "tiny-and-notes", "--overwrite"],
        "",
        "--output tiny-and-notes holds notes.txt, which no Hugging Face checkpoint holds",
    ),
    ("output_empty", ["--output", ""], "", "--output is empty: name a directory, such as runs/tiny"),
    (
        "output_in_proc",
        ["--output", "/proc/minigrpo-tiny"],
        "",
        "--output /proc/minigrpo-tiny cannot be written: writing a file in /proc fails",
    ),
    (
        "output_in_sys",
        ["--output", "/sys/minigrpo-tiny/a"],
        "",
        "--output /sys/minigrpo-tiny/a cannot be written: writing a file in /sys fails",
    ),
]


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> str:
    """What every case copies: a run (metrics.jsonl, notes.txt), a folder of runs, a checkpoint of this
    script's (the embedded default, with its pretrain.json) and a copy with notes beside it, notes.txt."""
    root = tmp_path_factory.mktemp("pretrain_layout")
    (root / "run").mkdir()
    (root / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (root / "run" / "notes.txt").write_text("the first run\n")
    (root / "runs" / "a").mkdir(parents=True)
    (root / "runs" / "a" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.4}\n')
    shutil.copytree(EMBEDDED, root / "tiny")
    shutil.copytree(EMBEDDED, root / "tiny-and-notes")
    (root / "tiny-and-notes" / "notes.txt").write_text("made on a Tuesday\n")
    (root / "notes.txt").write_text("runs to compare\n")
    return str(root)


@pytest.fixture(scope="module")
def refusals(layout, examples_server, tmp_path_factory):
    """Every case run in its own copy of the layout: name -> (exit status, stdout, stderr, its directory,
    its tree before the run); and the embedded default's tree before them ("" was read as its path)."""
    root = tmp_path_factory.mktemp("pretrain_refusals")
    embedded = tree(EMBEDDED)
    results = {}
    for name, argv, cwd, _ in REFUSED:
        directory = str(root / name)
        shutil.copytree(layout, directory, copy_function=os.link)  # nothing is written in place
        before = tree(directory)
        status = examples_server.run(
            "pretrain_tiny.py", [*SHORT, *argv], str(root), name, cwd=os.path.join(directory, cwd)
        )
        stdout = (root / f"{name}.out").read_text()
        results[name] = (status, stdout, (root / f"{name}.err").read_text(), directory, before)
    return results, embedded


@pytest.mark.parametrize("case, argv, cwd, message", REFUSED, ids=[row[0] for row in REFUSED])
def test_a_refused_output_is_one_line_before_any_work_and_leaves_every_file_as_it_was(
    refusals, case, argv, cwd, message
):
    results, embedded = refusals
    status, stdout, stderr, directory, before = results[case]
    lines = stderr.strip().splitlines()
    assert status == 1 and len(lines) == 1 and lines[0].startswith("pretrain_tiny.py: "), stderr[-3000:]
    assert message in lines[0]
    assert stdout == ""  # no model built, nothing trained
    assert tree(directory) == before  # byte for byte, nothing added, nothing removed
    assert tree(EMBEDDED) == embedded
    assert not os.path.exists("/proc/minigrpo-tiny") and not os.path.exists("/sys/minigrpo-tiny")
