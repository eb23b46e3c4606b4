"""docs/walkthrough.md cannot go stale: every `path.py:name` it names is defined in that file (read
with ast, not grep), and what it quotes from the trace is what the default run prints today.

Its ```trace blocks quote `python examples/train_math.py --trace --stop_at_step 1` (seed 0, every
other setting the default run's): each line must be a line of that output. Its ```trace-page blocks
quote the page the same run writes (output_dir/trace.html): each line must be in the page's text.
The step runs in this process: train_math.py's own __main__ (runpy) with --eval_count 1, which
changes only the held-out evaluations (the walkthrough quotes neither), and no curves.png.

When the numbers change for a good reason (the numerics, the sampler, the trace's format), print
today's trace and page text, paste the new lines into docs/walkthrough.md and reread the prose
around them:

    python tests/test_walkthrough.py --print
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WALKTHROUGH = os.path.join(ROOT, "docs", "walkthrough.md")
TRAIN_MATH = os.path.join(ROOT, "examples", "train_math.py")
REGENERATE = "python tests/test_walkthrough.py --print"
REFERENCE = re.compile(r"([\w/.-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")  # minigrpo/loss.py:grpo_loss
SECONDS = re.compile(r"\| s \d+(\.\d+)?$")  # the step's wall time ends the console line: it varies by machine


def blocks(kind: str) -> list[str]:
    """The lines of the walkthrough's fenced blocks whose info string is `kind`."""
    text = open(WALKTHROUGH, encoding="utf-8").read()
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


def default_step(output_dir: str) -> tuple[list[str], str]:
    """(the lines train_math.py --trace prints for the default run's step 1, the text of its trace.html)."""
    argv = [TRAIN_MATH, "--trace", "--stop_at_step", "1", "--eval_count", "1", "--output_dir", output_dir]
    printed = io.StringIO()
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch("minigrpo.plots.plot_curves", return_value=False),
        contextlib.redirect_stdout(printed),
    ):
        runpy.run_path(TRAIN_MATH, run_name="__main__")
    page = open(os.path.join(output_dir, "trace.html"), encoding="utf-8").read().splitlines()
    return printed.getvalue().splitlines(), "\n".join(
        html.unescape(re.sub(r"<[^>]+>", "", line)) for line in page
    )


def test_every_named_function_exists():
    text = open(WALKTHROUGH, encoding="utf-8").read()
    references = sorted(set(REFERENCE.findall(text)))
    assert len(references) >= 30, f"only {len(references)} `path.py:name` references found in {WALKTHROUGH}"
    missing = []
    for path, name in references:
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            missing.append(f"{path}:{name}: no file {path} (name files from the repository root)")
        elif name not in defined_names(full):
            missing.append(f"{path}:{name}: {path} defines no {name}")
    assert not missing, (
        "docs/walkthrough.md names code that is not there (moved, renamed?):\n  " + "\n  ".join(missing)
    )


def test_quoted_trace_is_what_trace_prints(tmp_path):
    quoted, quoted_page = blocks("trace"), blocks("trace-page")
    assert len(quoted) >= 10 and quoted_page, (
        "docs/walkthrough.md has no ```trace / ```trace-page blocks to check"
    )
    printed, page = default_step(str(tmp_path / "run"))
    lines = {SECONDS.sub("| s _", line.rstrip()) for line in printed}
    stale = [f"trace:      {q}" for q in quoted if SECONDS.sub("| s _", q.rstrip()) not in lines]
    stale += [f"trace page: {q}" for q in quoted_page if q.strip() not in page]
    assert not stale, (
        f"docs/walkthrough.md quotes {len(stale)} line(s) that the default run's --trace no longer "
        f"prints:\n  " + "\n  ".join(stale) + f"\nIf the change is meant, run `{REGENERATE}`, paste the "
        "new lines into the walkthrough and check that its prose still says what they show."
    )


def test_readme_links_the_walkthrough():
    assert "(docs/walkthrough.md)" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


if __name__ == "__main__":
    if sys.argv[1:] != ["--print"]:
        sys.exit(f"usage: {REGENERATE}   (prints what docs/walkthrough.md may quote; pytest runs the checks)")
    with tempfile.TemporaryDirectory() as directory:
        printed, page = default_step(os.path.join(directory, "run"))
    print(
        "\n".join(printed),
        "\n\n--- trace.html as text (each ```trace-page line is part of one) ---\n",
        page,
        sep="",
    )
