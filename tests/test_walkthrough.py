"""docs/walkthrough.md and docs/walkthrough-tools.md cannot go stale: every `path.py:name` they
name is defined in that file (read with ast, not grep), and what they quote from the trace is what
the run they follow prints today.

Their ```trace blocks quote `python examples/train_math.py --trace --stop_at_step 1` (the default
run; for the tools page, models/minigrpo-tiny-calc with --seed 5): each line must be a line of that
output. Their ```trace-page blocks quote the page the same run writes (output_dir/trace.html): each
line must be in the page's text. The step runs in this process: train_math.py's own __main__
(runpy) with --eval_count 1, which changes only the held-out evaluations (the pages quote neither),
and no curves.png.

When the numbers change for a good reason (the numerics, the sampler, the trace's format), print
today's trace and page text, paste the new lines into the page and reread the prose around them:

    python tests/test_walkthrough.py --print [docs/walkthrough-tools.md]
"""

import ast
import contextlib
import html
import io
import os
import re
import runpy
import sys
import tempfile
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_MATH = os.path.join(ROOT, "examples", "train_math.py")
# page -> (the arguments of the run it follows beyond --trace --stop_at_step 1, the `path.py:name`
# references it must have at least)
PAGES = {
    "docs/walkthrough.md": ([], 30),
    "docs/walkthrough-tools.md": (
        ["--model", os.path.join(ROOT, "models", "minigrpo-tiny-calc"), "--seed", "5"],
        8,
    ),
}
REGENERATE = "python tests/test_walkthrough.py --print [PAGE]"
# a reference such as minigrpo/update/loss.py:grpo_loss
REFERENCE = re.compile(r"([\w/.-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
SECONDS = re.compile(r"\| s \d+(\.\d+)?$")  # the step's wall time ends the console line: it varies by machine


def blocks(page: str, kind: str) -> list[str]:
    """The lines of the page's fenced blocks whose info string is `kind`."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    found = re.findall(rf"^```{re.escape(kind)}\n(.*?)^```$", text, re.M | re.S)
    return [line for block in found for line in block.splitlines() if line.strip()]


def defined_names(path: str) -> set[str]:
    """A module's top-level functions, classes and assigned names, and each class's Class.member."""
    names = set()
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        names |= _names(node)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{name}" for member in node.body for name in _names(member)}
    return names


def _names(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    return {t.id for t in targets if isinstance(t, ast.Name)}


def traced_step(output_dir: str, arguments: list[str]) -> tuple[list[str], str]:
    """(the lines train_math.py --trace prints for step 1 of the run with `arguments`, the text of its
    trace.html)."""
    argv = [TRAIN_MATH, "--trace", "--stop_at_step", "1", "--eval_count", "1", "--output_dir", output_dir]
    argv += arguments
    printed = io.StringIO()
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch("minigrpo.run.plot_curves", return_value=False),  # the name train_math.py imports
        contextlib.redirect_stdout(printed),
    ):
        runpy.run_path(TRAIN_MATH, run_name="__main__")
    assert not os.path.exists(os.path.join(output_dir, "curves.png"))
    page = open(os.path.join(output_dir, "trace.html"), encoding="utf-8").read().splitlines()
    return printed.getvalue().splitlines(), "\n".join(
        html.unescape(re.sub(r"<[^>]+>", "", line)) for line in page
    )


@pytest.mark.parametrize("page", list(PAGES))
def test_every_named_function_exists(page):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    references = sorted(set(REFERENCE.findall(text)))
    least = PAGES[page][1]
    assert len(references) >= least, f"only {len(references)} `path.py:name` references found in {page}"
    missing = []
    for path, name in references:
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            missing.append(f"{path}:{name}: no file {path} (name files from the repository root)")
        elif name not in defined_names(full):
            missing.append(f"{path}:{name}: {path} defines no {name}")
    assert not missing, f"{page} names code that is not there (moved, renamed?):\n  " + "\n  ".join(missing)


@pytest.mark.parametrize("page", list(PAGES))
def test_quoted_trace_is_what_trace_prints(tmp_path, page):
    quoted, quoted_page = blocks(page, "trace"), blocks(page, "trace-page")
    assert len(quoted) >= 10 and quoted_page, f"{page} has no ```trace / ```trace-page blocks to check"
    printed, text = traced_step(str(tmp_path / "run"), PAGES[page][0])
    lines = {SECONDS.sub("| s _", line.rstrip()) for line in printed}
    stale = [f"trace:      {q}" for q in quoted if SECONDS.sub("| s _", q.rstrip()) not in lines]
    stale += [f"trace page: {q}" for q in quoted_page if q.strip() not in text]
    assert not stale, (
        f"{page} quotes {len(stale)} line(s) that its run's --trace no longer prints:\n  "
        + "\n  ".join(stale)
        + f"\nIf the change is meant, run `{REGENERATE}`, paste the new lines into {page} and check "
        "that its prose still says what they show."
    )


def test_readme_links_the_walkthroughs():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert all(f"({page})" in readme for page in PAGES)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--print"] or len(sys.argv) > 3 or sys.argv[2:] and sys.argv[2] not in PAGES:
        sys.exit(f"usage: {REGENERATE}   (prints what the page may quote; pytest runs the checks)")
    chosen = sys.argv[2] if len(sys.argv) == 3 else "docs/walkthrough.md"
    with tempfile.TemporaryDirectory() as directory:
        printed, page = traced_step(os.path.join(directory, "run"), PAGES[chosen][0])
    print(
        "\n".join(printed),
        "\n\n--- trace.html as text (each ```trace-page line is part of one) ---\n",
        page,
        sep="",
    )
