"""Start of the loop, task: problems read from JSONL files in GSM8K's or MATH's format.

In: a local path, or a file of a Hub dataset written hf://datasets/<owner>/<name>[@revision]/<path>.
Out: `Problem`s whose answer is the gold answer as the verifier compares it, each naming its file
and line (`Problem.source`). A bad row is a ValueError naming the file, its line (1-based, as an
editor counts) and what is wrong; a number that is not finite (JSON's NaN, Infinity, 1e999) is one.
It knows files and rows, not prompts, tokens or the model. `load_problems` picks between these
files and the synthetic generators, and keeps the rows whose gold the verifier can score
(`keep_scorable`: a gold that can never be scored right is skipped, with a note).
The verifier is the one stage to the right this imports: a MATH solution's boxed answer is read
with its own extractor (a gold answer is then found by exactly the rule that finds a model's), and
each gold is checked with its normaliser and parser.
"""

from __future__ import annotations

import json
import math
import os
import re
from urllib.parse import unquote

from ..verifier import extract_answer, top_level_boxes
from . import synthetic
from .problem import Problem

FORMATS = ("auto", "gsm8k", "math")
HUB_PREFIX = "hf://datasets/"
HUB_SYNTAX = "hf://datasets/<owner>/<name>[@revision]/<path/in/repo.jsonl>"
DEFAULT_COUNTS = {"train": 1000, "test": 200}  # synthetic problems per split when no count is given

_GSM8K_ANSWER = re.compile(r"^####[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PLAIN_NUMBER = re.compile(r"-?\d{1,30}(?:\.\d{1,30})?")  # a gold the verifier always parses and matches


def load_problems(
    name_or_path: str,
    split: str = "train",
    count: int | None = None,
    seed: int = 0,
    difficulty: int = 1,
    note=print,
) -> list[Problem]:
    """A synthetic kind's problems of `split`, or the first `count` rows of a JSONL file whose gold answers
    can be scored (split ignored; `note` hears of the rows skipped, see `keep_scorable`)."""
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"count must be a positive integer or None (all rows / the default), got {count!r}")
    if name_or_path in synthetic.KINDS:
        if split not in DEFAULT_COUNTS:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        count = count if count is not None else DEFAULT_COUNTS[split]
        return synthetic.generate(name_or_path, count, split, seed=seed, difficulty=difficulty)
    if not name_or_path.startswith(HUB_PREFIX) and not os.path.exists(name_or_path):
        raise ValueError(
            f"unknown dataset {name_or_path!r}: not a synthetic kind ({', '.join(synthetic.KINDS)}), "
            f"an existing JSONL file or a Hub file {HUB_SYNTAX}"
        )
    return keep_scorable(load_jsonl(name_or_path), name_or_path, count, note)


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
            problem = parse(row)
        except ValueError as e:
            raise ValueError(f"{source}, line {line}: {e}") from None
        problem.source = f"{source}, line {line}"
        problems.append(problem)
    return problems


# --- gold answers the verifier can score -----------------------------------------------------------
def keep_scorable(
    problems: list[Problem], source: str, count: int | None = None, note=print
) -> list[Problem]:
    """The first `count` problems (None: all) whose gold answer can be scored, with a note for each kind
    of gold that needs one. A gold that does not equal itself written in \\boxed{}, as the prompts ask
    answers to be written, can never be scored right (empty once normalised, such as "$$"; unbalanced
    braces): it is skipped. A gold the verifier cannot parse (an integral, "1, 2, \\ldots") but equal to
    itself is kept: only an answer spelled the same way, once normalised, scores right on it. Rows past
    the count-th kept one are not checked; a plain number is not checked either, and any other gold
    costs a normalisation and a parse (well under a millisecond for a gold of a few dozen characters:
    benchmarks/README.md)."""
    kept = []
    skipped = []
    unparsed = []
    for problem in problems:
        if count is not None and len(kept) == count:
            break
        verdict = gold_verdict(problem.answer)
        if verdict == "never right":
            skipped.append(problem)
            continue
        if verdict == "not parsed":
            unparsed.append(problem)
        kept.append(problem)
    checked = len(kept) + len(skipped)
    if skipped:
        note(
            f"note: {source}: skipped {len(skipped)} of {checked} rows "
            "whose gold answer no completion can match "
            f"(empty once normalised, or its braces unbalanced), first {_first(skipped)}"
        )
    if unparsed:
        note(
            f"note: {source}: {len(unparsed)} of {checked} rows "
            "have a gold answer the verifier cannot parse, "
            f"first {_first(unparsed)}; kept, but only an answer written the same way scores right on them"
        )
    if not kept:
        raise ValueError(f"{source}: no row has a gold answer that a completion can match")
    return kept


def gold_verdict(answer: str) -> str:
    """ "parsed", "not parsed" (only an identical answer matches it) or "never right" (nothing matches it)."""
    if _PLAIN_NUMBER.fullmatch(answer):  # every GSM8K gold, most of MATH's: nothing to check
        return "parsed"
    from ..verifier import Unsupported, answers_match, canonical  # sympy: imported only once a gold needs it
    from ..verifier import parse_math as parse

    try:
        boxed = extract_answer("\\boxed{" + answer + "}")
        normalised = canonical(answer)  # its approximations kept: a wrong one makes the gold never right
        if boxed is None or not normalised:  # an empty answer equals nothing
            return "never right"
        # answers_match(x, x): `normalised` non-empty
        if boxed != answer and not answers_match(boxed, answer):
            return "never right"
        parse(normalised)
    except Unsupported:
        return "not parsed"
    except Exception:  # the verifier's worker fails such a gold closed too: no answer is ever right
        return "never right"
    return "parsed"


def _first(problems: list[Problem]) -> str:
    shown = problems[0].answer if len(problems[0].answer) <= 40 else problems[0].answer[:37] + "..."
    return f"{problems[0].source.rpartition(', ')[2]} ({shown!r})"


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
        raise ValueError(
            f"could not fetch {source} from the Hugging Face Hub ({type(e).__name__}: {first_line})"
        ) from None


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
            raise ValueError(
                f"{source}, line {number}: not valid JSON ({e.msg} at column {e.colno})"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{source}, line {number}: not a JSON object (got {type(row).__name__})")
        rows.append((number, row))
    return rows


def detect_format(row: dict, where: str) -> str:
    if "problem" in row:
        return "math"
    if "question" in row and "answer" in row:
        return "gsm8k"
    raise ValueError(
        f"{where}: cannot tell the format from the keys {sorted(row)}; GSM8K rows have 'question' "
        "and 'answer', MATH rows 'problem' and 'answer' or 'solution'"
    )


def parse_gsm8k(row: dict) -> Problem:
    """question, and an answer whose last '#### N' line holds N (thousands commas dropped)."""
    question = _field(row, "question")
    worked = _field(row, "answer")
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
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN and Infinity, or 1e999
        raise ValueError(f"field {key!r} is {value}, not a finite number")
    text = str(value).strip()
    if not text and not allow_empty:
        raise ValueError(f"field {key!r} is empty")
    return text
