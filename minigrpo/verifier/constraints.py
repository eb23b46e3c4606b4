"""Stage 2 of the loop, reward: constraints - valid JSON, a length within a band, SQL returning the gold rows.

In: a completion's text and the row's columns (a JSON `schema`; a length band; a SQLite `database` and its
`gold_sql`). Out: one float in [0, 1] per completion; a completion never raises, whatever it holds (hostile
text scores 0.0), and each check is bounded in time. A bad spec (options, schema, database) is a ValueError.
It knows strings and, for sql, a database file it only reads; not tensors (token counts come as a column).

- `json_reward`: the completion's JSON (last ```json or bare ``` block, else the whole text) parses and,
  given a `schema`, fits a JSON-Schema subset (`SCHEMA_KEYWORDS`). The validator is our own, not the
  `jsonschema` package: that adds no dependency, and it bounds depth (`MAX_DEPTH`) and work
  (`MAX_VALIDATION_STEPS`), which jsonschema does not (it recurses without limit).
- `length_reward`: 1.0 for a length in [low, high], falling linearly to 0.0 at `soft` units outside.
  Departure from DAPO's overlong shaping: both sides are shaped, and the value is a reward in [0, 1],
  not a penalty in [-1, 0].
- `sql_rewards`: execution accuracy as in Spider and BIRD, on a database opened read-only, under an
  authorizer, a wall-time limit and a row cap. Departure: rows are compared as a multiset (order ignored,
  duplicates counted) - BIRD compares sets, Spider also permutes columns; a gold ORDER BY is not checked.
  The time limit is checked between SQLite VM steps, so one function call runs to its end: MAX_VALUE_BYTES
  bounds the slowest calls, and a database whose values are longer cannot be read (the gold query fails).
  On Python 3.10 (no Connection.setlimit) SQLite's own limits apply and one call is not bounded.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import sqlite3
import time
from collections import Counter
from contextlib import closing
from urllib.parse import quote

from .bounded import Scores

MAX_TEXT_CHARS = 1_000_000  # a longer JSON text (completion or schema) scores 0 / is refused, unparsed
MAX_DEPTH = 64  # deepest nesting of a document (deeper scores 0) and of a schema (deeper is refused)
MAX_VALIDATION_STEPS = 100_000  # values, keys and names checked per completion; a document needing more: 0
SQL_TIME_LIMIT = 1.0  # wall seconds a completion's query may run; past them it scores 0
GOLD_TIME_LIMIT = 10.0  # wall seconds a gold query may run; past them the spec is bad
PROGRESS_STEPS = 1_000  # SQLite VM instructions between two looks at the clock
MAX_SQL_CHARS = 10_000  # a longer query scores 0 unprepared
MAX_ROWS = 10_000  # rows fetched of a result: a completion's longer result scores 0, a gold one is refused
# the longest string or blob a query may read or build (SQLITE_LIMIT_LENGTH, Python 3.11+): one call of a
# built-in quadratic in its arguments' lengths (trim, LIKE, instr, unhex) then takes at most ~10^8 steps
MAX_VALUE_BYTES = 10_000

FENCE = re.compile(r"^[ \t]*```(.*)$", re.MULTILINE)  # only fence lines are visited: linear in the text


def last_fenced_block(text: str, languages: tuple[str, ...]) -> str | None:
    """The body of the last closed ``` block whose language is one of `languages` ("" is a bare fence)."""
    body_start, language, last = None, "", None
    for fence in FENCE.finditer(text):
        info = fence.group(1).lstrip("`").strip()
        if body_start is None:
            if "`" not in info:  # "```x```" on one line is inline code, not a fence
                body_start, language = fence.end() + 1, (info.split() or [""])[0].lower()
        elif not info:  # a closing fence has no info string
            if language in languages:
                last = text[body_start : fence.start()]
            body_start = None
    return last


def _answer_text(completion, languages: tuple[str, ...]) -> str:
    """The last fenced block in one of `languages`, else the whole completion; stripped."""
    if not isinstance(completion, str):
        return ""
    block = last_fenced_block(completion, languages)
    return (completion if block is None else block).strip()


# --- json -------------------------------------------------------------------------------------------------

TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
SCHEMA_KEYWORDS = (
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
    "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
)  # fmt: skip
ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples"}  # never checked
# a string, or an unclosed one up to the end: a match never fails, so no quote restarts a scan (linear time)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_INVALID = object()  # what _parse_json returns for text that is not (bounded) JSON


class _OutOfBudget(Exception):
    pass


class _Budget:
    """Validation steps left for one completion; spending the last raises _OutOfBudget."""

    def __init__(self, steps: int):
        self.steps = steps

    def spend(self, steps: int = 1) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise _OutOfBudget


def json_reward(completion: str, schema: dict | str | None = None) -> float:
    """1.0 where the completion's JSON parses and, given a `schema`, fits it; else 0.0."""
    schema = load_schema(schema)
    document = _parse_json(_answer_text(completion, ("json", "")), MAX_DEPTH)
    if document is _INVALID:
        return 0.0
    try:
        return 1.0 if schema is None or _fits(document, schema, _Budget(MAX_VALIDATION_STEPS)) else 0.0
    except _OutOfBudget:
        return 0.0


def json_rewards(completions: list[str], schema: list | dict | str | None = None) -> list[float]:
    """json_reward per completion; `schema` is one per row (a list, None for none) or one for all rows."""
    schemas = schema if isinstance(schema, list) else [schema] * len(completions)
    return [json_reward(completion, row_schema) for completion, row_schema in zip(completions, schemas)]


def load_schema(schema: dict | str | None) -> dict | None:
    """A schema as a checked dict (parsed first if a JSON string); None stays None. ValueError outside the
    subset."""
    if isinstance(schema, str):
        text = schema
        schema = _parse_json(text, 4 * MAX_DEPTH)  # a schema level takes up to 4 brackets of text
        if schema is _INVALID:
            raise ValueError(
                f"json reward: the schema is not JSON nested at most {MAX_DEPTH} deep: {_shown(text)}"
            )
    if schema is not None:
        check_schema(schema)
    return schema


def check_schema(schema, depth: int = 0, where: str = "schema") -> None:
    """Refuse (ValueError) a schema outside the subset or nested deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ValueError(f"json reward: the schema nests deeper than {MAX_DEPTH} levels")
    if not isinstance(schema, dict):
        raise ValueError(f"json reward: {where} must be a JSON object (a dict), got {type(schema).__name__}")
    for keyword, value in schema.items():
        if keyword not in SCHEMA_KEYWORDS and keyword not in ANNOTATIONS:
            raise ValueError(
                f"json reward: unknown schema keyword {keyword!r} in {where}; "
                f"the subset supported: {', '.join(SCHEMA_KEYWORDS)}"
            )
        _check_keyword(keyword, value, depth, f"{where}.{keyword}")


def _check_keyword(keyword: str, value, depth: int, where: str) -> None:
    names = value if isinstance(value, list) else [value]
    if keyword == "type" and not (names and all(isinstance(n, str) and n in TYPES for n in names)):
        raise ValueError(
            f"json reward: {where} must be one of {sorted(TYPES)} or a list of them, got {_shown(value)}"
        )
    if keyword == "properties":
        if not isinstance(value, dict):
            raise ValueError(f"json reward: {where} must map names to schemas, got {type(value).__name__}")
        for name, subschema in value.items():
            check_schema(subschema, depth + 1, f"{where}.{name}")
    if keyword == "items":
        check_schema(value, depth + 1, where)
    if keyword == "required" and not (isinstance(value, list) and all(isinstance(n, str) for n in value)):
        raise ValueError(f"json reward: {where} must be a list of names, got {_shown(value)}")
    if keyword == "additionalProperties" and not isinstance(value, bool):
        raise ValueError(f"json reward: {where} must be true or false in this subset, got {_shown(value)}")
    if keyword == "enum" and not (isinstance(value, list) and value):
        raise ValueError(f"json reward: {where} must be a non-empty list, got {_shown(value)}")
    if keyword in ("minItems", "maxItems", "minLength", "maxLength") and not (
        _is_integer(value) and value >= 0
    ):
        raise ValueError(f"json reward: {where} must be an integer >= 0, got {_shown(value)}")
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and not (
        _is_number(value) and math.isfinite(value)
    ):
        raise ValueError(f"json reward: {where} must be a finite number, got {_shown(value)}")


def _parse_json(text: str, max_depth: int):
    """The JSON value of `text`, or _INVALID: too long, nested deeper than `max_depth`, or not JSON (NaN and
    Infinity are not JSON). Depth is found before parsing: json.loads recurses once per level."""
    if len(text) > MAX_TEXT_CHARS or _nesting_depth(text) > max_depth:
        return _INVALID
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # ValueError: not JSON, or an integer of over 4300 digits
        return _INVALID


def _nesting_depth(text: str) -> int:
    """How deep brackets nest outside strings, counted without recursion: a JSON document's depth."""
    steps = [1 if bracket in "[{" else -1 for bracket in _BRACKET.findall(_JSON_STRING.sub("", text))]
    return max(itertools.accumulate(steps), default=0)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _fits(value, schema: dict, budget: _Budget) -> bool:
    """Whether `value` fits `schema` (checked by check_schema); recursion is as deep as the document."""
    budget.spend()
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        budget.spend(len(names))
        if not any(_has_type(value, name) for name in names):
            return False
    if "enum" in schema and not any(_json_equal(value, option, budget) for option in schema["enum"]):
        return False
    if "const" in schema and not _json_equal(value, schema["const"], budget):
        return False
    if isinstance(value, str):
        return _within(len(value), schema.get("minLength"), schema.get("maxLength"))
    if _is_number(value):
        return _fits_number(value, schema)
    if isinstance(value, list):
        items = schema.get("items")
        in_size = _within(len(value), schema.get("minItems"), schema.get("maxItems"))
        return in_size and (items is None or all(_fits(item, items, budget) for item in value))
    if isinstance(value, dict):
        return _fits_object(value, schema, budget)
    return True


def _fits_object(value: dict, schema: dict, budget: _Budget) -> bool:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    budget.spend(len(required) + len(value))
    if any(name not in value for name in required):
        return False
    if schema.get("additionalProperties", True) is False and any(name not in properties for name in value):
        return False
    return all(_fits(value[name], properties[name], budget) for name in value if name in properties)


def _fits_number(value, schema: dict) -> bool:
    return (
        _within(value, schema.get("minimum"), schema.get("maximum"))
        and ("exclusiveMinimum" not in schema or value > schema["exclusiveMinimum"])
        and ("exclusiveMaximum" not in schema or value < schema["exclusiveMaximum"])
    )


def _within(size, low, high) -> bool:
    return (low is None or size >= low) and (high is None or size <= high)


def _has_type(value, name: str) -> bool:
    if name == "integer":
        return _is_integer(value) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return _is_number(value)
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    return isinstance(value, kinds[name])


def _json_equal(a, b, budget: _Budget) -> bool:
    """JSON equality: 1 == 1.0, but true != 1 (Python says True == 1)."""
    budget.spend()
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y, budget) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        budget.spend(len(a))
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k], budget) for k in a)
    if a != b:
        return False
    return type(a) is type(b) or (_is_number(a) and _is_number(b))


def _shown(value) -> str:
    """A value for an error message: a scalar as written (cut at 80 characters), a container by its type
    (a schema's repr may be huge, or nested too deep for repr)."""
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__}"
    return f"{value!r:.80}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- length -----------------------------------------------------------------------------------------------

UNITS = ("words", "chars", "tokens")


def length_reward(length: float, low: float, high: float, soft: float) -> float:
    """1.0 inside [low, high], falling linearly to 0.0 at low - soft and at high + soft, 0.0 beyond."""
    distance = max(low - length, length - high, 0.0)
    return max(0.0, 1.0 - distance / soft)


def length_rewards(
    completions: list[str],
    unit: str = "words",
    low: float | None = None,
    high: float | None = None,
    soft: float | None = None,
    *,
    min_length: list | None = None,
    max_length: list | None = None,
    completion_tokens: list | None = None,
) -> list[float]:
    """length_reward per completion. The band is [low, high] (None: unbounded on that side), or per row
    the `min_length` / `max_length` columns where given (a None entry: the option). For unit "tokens",
    `completion_tokens` holds per completion its token ids or their count."""
    if unit not in UNITS:
        raise ValueError(f"length reward: unknown unit {_shown(unit)}; use one of {', '.join(UNITS)}")
    if not (_is_number(soft) and 0 < soft < math.inf):
        raise ValueError(
            "length reward: soft must be a number > 0 (the ramp's width outside [min, max]), "
            f"got {_shown(soft)}"
        )
    if unit == "tokens" and completion_tokens is None:
        raise ValueError(
            "length reward: unit 'tokens' needs the completion_tokens column, which the trainer supplies"
        )
    lows = _per_row(min_length, low, len(completions))
    highs = _per_row(max_length, high, len(completions))
    tokens = completion_tokens if unit == "tokens" else [None] * len(completions)
    rewards = []
    for completion, row_low, row_high, row_tokens in zip(completions, lows, highs, tokens):
        band_low, band_high = _band(row_low, row_high)
        rewards.append(length_reward(_length(completion, unit, row_tokens), band_low, band_high, soft))
    return rewards


def _per_row(column: list | None, option, rows: int) -> list:
    """The column's value per row, the option where the column is absent or holds None."""
    return [option if value is None else value for value in (column or [None] * rows)]


def _band(low, high) -> tuple[float, float]:
    if low is None and high is None:
        raise ValueError(
            "length reward: give a min, a max or both (options, or min_length / max_length columns)"
        )
    for name, bound in (("min", low), ("max", high)):
        if bound is not None and not (_is_number(bound) and 0 <= bound < math.inf):
            raise ValueError(f"length reward: {name} must be a number >= 0, got {_shown(bound)}")
    low, high = low or 0, math.inf if high is None else high
    if low > high:
        raise ValueError(f"length reward: min {low} > max {high}")
    return low, high


def _length(completion, unit: str, tokens) -> int:
    """The completion's length in `unit`; for tokens, `tokens` is its token ids or their count."""
    if unit == "tokens":
        if not (_is_integer(tokens) or isinstance(tokens, (list, tuple))):
            raise ValueError(
                f"length reward: completion_tokens holds token id lists or counts, got {_shown(tokens)}"
            )
        return tokens if _is_integer(tokens) else len(tokens)
    if not isinstance(completion, str):
        return 0
    return len(completion) if unit == "chars" else len(completion.split())


# --- sql --------------------------------------------------------------------------------------------------

_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
_READ_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
# load_extension loads code, fts3_tokenizer can take a pointer, and a printf precision of 2**31 makes one call
# run for seconds where the progress handler cannot stop it
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "printf", "format"}


class _QueryRefused(Exception):
    """A completion's query failed, ran out of time or returned too many rows: it scores 0."""

    def __init__(self, timed_out: bool = False):
        self.timed_out = timed_out


def sql_reward(completion: str, database: str, gold_sql: str, database_dir: str = ".") -> float:
    """1.0 where the completion's query returns the gold query's rows (as a multiset) on `database`."""
    return sql_rewards([completion], [database], [gold_sql], database_dir)[0]


def sql_rewards(
    completions: list[str], databases: list[str], gold_sqls: list[str], database_dir: str = "."
) -> Scores:
    """sql_reward per completion, with which ones ran out of time. Relative `databases` paths are resolved
    against `database_dir`."""
    values, timed_out = [], []
    for completion, database, gold_sql in zip(completions, databases, gold_sqls):
        path = _database_path(database, database_dir)
        if not isinstance(gold_sql, str):
            raise ValueError(f"sql reward: gold_sql must be a string, got {_shown(gold_sql)}")
        gold = _gold_rows(path, gold_sql, os.stat(path).st_mtime_ns)
        try:
            rows = Counter(_run(path, _answer_text(completion, ("sql", "")), SQL_TIME_LIMIT))
            values.append(1.0 if rows == gold else 0.0)
            timed_out.append(False)
        except _QueryRefused as refused:
            values.append(0.0)
            timed_out.append(refused.timed_out)
    return Scores(values, timed_out)


def _database_path(database, database_dir: str) -> str:
    if not isinstance(database, (str, os.PathLike)) or not isinstance(database_dir, (str, os.PathLike)):
        raise ValueError(
            f"sql reward: database must be a path, got {_shown(database)} in {_shown(database_dir)}"
        )
    path = os.path.abspath(os.path.join(database_dir, database))
    if not os.path.isfile(path):
        raise ValueError(
            f"sql reward: no database file at {path} (the database column, against {database_dir!r})"
        )
    return path


@functools.lru_cache(maxsize=256)
def _gold_rows(path: str, gold_sql: str, mtime_ns: int) -> Counter:
    """The gold query's rows as a multiset, cached while the database file is unchanged (`mtime_ns`)."""
    try:
        return Counter(_run(path, gold_sql, GOLD_TIME_LIMIT))
    except _QueryRefused as refused:
        raise ValueError(
            f"sql reward: the gold query {_shown(gold_sql)} fails on {path}: {refused.__cause__ or refused}"
            f"{' (out of time)' if refused.timed_out else ''}"
        ) from None


def _run(path: str, sql: str, time_limit: float) -> list[tuple]:
    """The rows of one read-only statement on the database at `path`; _QueryRefused otherwise."""
    if len(sql) > MAX_SQL_CHARS:
        raise _QueryRefused() from RuntimeError(f"longer than {MAX_SQL_CHARS} characters")
    deadline = time.monotonic() + time_limit
    try:
        with closing(sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)) as connection:
            _confine(connection, deadline)
            cursor = connection.execute(sql)  # more than one statement raises
            rows = cursor.fetchmany(MAX_ROWS + 1)
    except (sqlite3.Error, sqlite3.Warning, ValueError, MemoryError) as error:  # ValueError: NUL, surrogates
        raise _QueryRefused(timed_out=time.monotonic() > deadline) from error
    if cursor.description is None:  # an empty query, or only a comment: no result to compare
        raise _QueryRefused() from RuntimeError("not a query")
    if len(rows) > MAX_ROWS:
        raise _QueryRefused() from RuntimeError(f"more than {MAX_ROWS} rows")
    return rows


def _confine(connection: sqlite3.Connection, deadline: float) -> None:
    """Reads only, no attached databases or extensions, no work past `deadline`."""
    connection.execute("PRAGMA query_only = ON")
    connection.execute("SELECT count(*) FROM sqlite_master")  # a file that is not a database fails here
    if hasattr(connection, "setlimit"):  # Python 3.11+
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    connection.set_authorizer(_authorize)
    connection.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)


def _authorize(action: int, arg1, arg2, database, trigger) -> int:
    """SQLite's authorizer: SELECT, reads, functions other than _DENIED_FUNCTIONS and schema-reading
    pragmas; everything else (writes, ATTACH, DETACH, VACUUM, other pragmas) is denied."""
    if action == sqlite3.SQLITE_FUNCTION:  # arg2: the function's name
        allowed = arg2.lower() not in _DENIED_FUNCTIONS
    elif action == sqlite3.SQLITE_PRAGMA:  # arg1: the pragma's name, arg2: its argument
        allowed = arg1.lower() in _READ_PRAGMAS
    else:
        allowed = action in _READ_ACTIONS
    return sqlite3.SQLITE_OK if allowed else sqlite3.SQLITE_DENY
