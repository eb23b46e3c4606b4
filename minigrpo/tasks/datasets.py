"""Start of the loop, task: problems read from JSONL files in GSM8K's or MATH's format.

In: a local path, or a file of a Hub dataset written hf://datasets/<owner>/<name>[@revision]/<path>.
Out: `Problem`s whose answer is the gold answer as the verifier compares it. A bad row is a
ValueError naming the file, its line and what is wrong. It knows files and rows, not prompts,
tokens or the model. `load_problems` picks between these files and the synthetic generators.
A MATH solution's boxed answer is read with the verifier's own extractor, the one import from a
stage to the right: a gold answer is then found by exactly the rule that finds a model's.
"""

from __future__ import annotations

import json
import os
import re
from urllib.parse import unquote

from . import Problem, synthetic
from ..verifier.extract import extract_answer, top_level_boxes

FORMATS = ("auto", "gsm8k", "math")
HUB_PREFIX = "hf://datasets/"
HUB_SYNTAX = "hf://datasets/<owner>/<name>[@revision]/<path/in/repo.jsonl>"
DEFAULT_COUNTS = {"train": 1000, "test": 200}  # synthetic problems per split when no count is given

_GSM8K_ANSWER = re.compile(r"^####[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def load_problems(name_or_path: str, split: str = "train", count: int | None = None, seed: int = 0,
                  difficulty: int = 1) -> list[Problem]:
    """A synthetic kind's problems of `split`, or the first `count` rows of a JSONL file (split ignored)."""
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"count must be a positive integer or None (all rows / the default), got {count!r}")
    if name_or_path in synthetic.KINDS:
        if split not in DEFAULT_COUNTS:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        count = count if count is not None else DEFAULT_COUNTS[split]
        return synthetic.generate(name_or_path, count, split, seed=seed, difficulty=difficulty)
    if not name_or_path.startswith(HUB_PREFIX) and not os.path.exists(name_or_path):
        raise ValueError(f"unknown dataset {name_or_path!r}: not a synthetic kind ({', '.join(synthetic.KINDS)}), "
                         f"an existing JSONL file or a Hub file {HUB_SYNTAX}")
    problems = load_jsonl(name_or_path)
    return problems if count is None else problems[:count]


def load_jsonl(source: str, fmt: str = "auto") -> list[Problem]:
    """Every row of a GSM8K- or MATH-format JSONL file as a Problem; "auto" decides from the first row."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; known: {', '.join(FORMATS)}")
    rows = read_rows(fetch(source), source)
    if not rows:
        raise ValueError(f"{source} is empty: it has no JSON rows")
    if fmt == "auto":
        first_line, first_row = rows[0]
        fmt = detect_format(first_row, where=f"{source}, line {first_line}")
    parse = PARSERS[fmt]
    problems = []
    for line, row in rows:
        try:
            problems.append(parse(row))
        except ValueError as e:
            raise ValueError(f"{source}, line {line}: {e}") from None
    return problems


# --- where the file is ----------------------------------------------------------------------------
def fetch(source: str) -> str:
    """The local path of `source`: as is, or downloaded from the Hub into its cache."""
    if not source.startswith(HUB_PREFIX):
        if not os.path.isfile(source):
            raise ValueError(f"no such dataset file: {source}")
        return source
    repo_id, filename, revision = parse_hub_path(source)
    from huggingface_hub import hf_hub_download  # imported here: local files never need it

    try:
        return hf_hub_download(repo_id, filename, repo_type="dataset", revision=revision)
    except Exception as e:  # offline, unknown repo or file, gated repo: all end here
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"could not fetch {source} from the Hugging Face Hub ({type(e).__name__}: {first_line})") from None


def parse_hub_path(source: str) -> tuple[str, str, str | None]:
    """(repo_id, filename, revision) of hf://datasets/owner/name[@revision]/path; revision None is main.

    A revision with slashes (refs/pr/1) is written URL-encoded: name@refs%2Fpr%2F1.
    """
    parts = source.removeprefix(HUB_PREFIX).split("/", 2)
    if not source.startswith(HUB_PREFIX) or len(parts) < 3 or not all(parts):
        raise ValueError(f"{source!r} is not a Hub dataset file; write it {HUB_SYNTAX}")
    owner, name, filename = parts
    name, at, revision = name.partition("@")
    if not name or (at and not revision):
        raise ValueError(f"{source!r} has an empty dataset name or revision; write it {HUB_SYNTAX}")
    return f"{owner}/{name}", filename, unquote(revision) if at else None


# --- rows -----------------------------------------------------------------------------------------
def read_rows(path: str, source: str) -> list[tuple[int, dict]]:
    """(1-based line number, object) for each non-blank line; `source` names the file in errors."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{source} is not UTF-8 text: {e}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}, line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{source}, line {number}: not a JSON object (got {type(row).__name__})")
        rows.append((number, row))
    return rows


def detect_format(row: dict, where: str) -> str:
    if "problem" in row:
        return "math"
    if "question" in row and "answer" in row:
        return "gsm8k"
    raise ValueError(f"{where}: cannot tell the format from the keys {sorted(row)}; GSM8K rows have 'question' "
                     "and 'answer', MATH rows 'problem' and 'answer' or 'solution'")


def parse_gsm8k(row: dict) -> Problem:
    """question, and an answer whose last '#### N' line holds N (thousands commas dropped)."""
    question, worked = _field(row, "question"), _field(row, "answer")
    found = _GSM8K_ANSWER.findall(worked)
    if not found:
        raise ValueError("no '#### ' line in 'answer' (GSM8K answers end in '#### <number>')")
    answer = _THOUSANDS_COMMA.sub("", found[-1])
    if not answer:
        raise ValueError("empty answer after '####'")
    return Problem(question, answer, solution=worked)


def parse_math(row: dict) -> Problem:
    """problem, and an 'answer' or else the last \\boxed{} of 'solution'."""
    question = _field(row, "problem")
    solution = _field(row, "solution", allow_empty=True) if "solution" in row else ""
    if "answer" in row:
        answer = _field(row, "answer", allow_empty=True)
    elif "solution" in row:
        if not top_level_boxes(solution):
            raise ValueError("no \\boxed{} answer in 'solution' (and no 'answer' field)")
        answer = extract_answer(solution)
        if answer is None:
            raise ValueError("the last \\boxed{} of 'solution' is empty or unterminated")
    else:
        raise ValueError("missing field 'answer' (or a 'solution' with a \\boxed{} answer)")
    if not answer:
        raise ValueError("empty answer")
    return Problem(question, answer, solution=solution)


PARSERS = {"gsm8k": parse_gsm8k, "math": parse_math}


def _field(row: dict, key: str, allow_empty: bool = False) -> str:
    """row[key] as stripped text (numbers become text); missing, empty or other types are errors."""
    if key not in row:
        raise ValueError(f"missing field {key!r}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"field {key!r} is a {type(value).__name__}, not text")
    text = str(value).strip()
    if not text and not allow_empty:
        raise ValueError(f"field {key!r} is empty")
    return text
