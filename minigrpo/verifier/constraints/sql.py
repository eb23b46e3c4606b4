"""Stage 2 of the loop, verify: sql - the completion's query returns the gold query's rows on SQLite.

In: a completion's text (its last ```sql or bare ``` block, else the whole text) and the row's `database` path
and `gold_sql`. Out: `Scores`, 1.0 or 0.0 per completion and which ones ran out of time; a completion never
raises, whatever it holds (hostile text scores 0.0). A bad spec (database, gold query) is a ValueError. It
knows strings and a database file it only reads; not tensors.

Execution accuracy as in Spider and BIRD, on a database opened read-only, under an authorizer, a wall-time
limit and a row cap. Departure: rows are compared as a multiset (order ignored, duplicates counted) - BIRD
compares sets, Spider also permutes columns; a gold ORDER BY is not checked.

Run time is bounded in-process, with one residue: SQLite calls the progress handler, which checks the clock,
only between VM steps, so one long function call is bounded only by MAX_VALUE_BYTES, the longest string or
blob a query may read or build (sqlite3's Connection.setlimit, Python >= 3.11; on 3.10 that cap does not
apply, and one call runs unbounded). printf and format are refused for that reason: a precision of
2**31 ('%.2147483647c') makes one call run for seconds within the cap. A database whose values are longer
than MAX_VALUE_BYTES cannot be read (its gold query fails).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections import Counter
from contextlib import closing
from urllib.parse import quote

from ..scores import Scores
from .constraint_inputs import answer_text, shown

SQL_TIME_LIMIT = 1.0  # wall seconds a completion's query may run; past them it scores 0
GOLD_TIME_LIMIT = 10.0  # wall seconds a gold query may run; past them the spec is bad
PROGRESS_STEPS = 1_000  # SQLite VM instructions between two looks at the clock
MAX_SQL_CHARS = 10_000  # a longer query scores 0 unprepared
MAX_ROWS = 10_000  # rows fetched of a result: a completion's longer result scores 0, a gold one is refused
# the longest string or blob a query may read or build (SQLITE_LIMIT_LENGTH, Python 3.11+): one call of a
# built-in quadratic in its arguments' lengths (trim, LIKE, instr, unhex) then takes at most ~10^8 steps
MAX_VALUE_BYTES = 10_000

_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
_READ_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
# load_extension loads code, fts3_tokenizer can take a pointer, and a printf (format) precision of 2**31 makes
# one call run for seconds that neither the progress handler nor MAX_VALUE_BYTES stops
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
    values = []
    timed_out = []
    for completion, database, gold_sql in zip(completions, databases, gold_sqls):
        path = _database_path(database, database_dir)
        if not isinstance(gold_sql, str):
            raise ValueError(f"sql reward: gold_sql must be a string, got {shown(gold_sql)}")
        gold = _gold_rows(path, gold_sql, os.stat(path).st_mtime_ns)
        try:
            rows = Counter(_run(path, answer_text(completion, ("sql", "")), SQL_TIME_LIMIT))
            values.append(1.0 if rows == gold else 0.0)
            timed_out.append(False)
        except _QueryRefused as refused:
            values.append(0.0)
            timed_out.append(refused.timed_out)
    return Scores(values, timed_out)


def _database_path(database, database_dir: str) -> str:
    if not isinstance(database, (str, os.PathLike)) or not isinstance(database_dir, (str, os.PathLike)):
        raise ValueError(
            f"sql reward: database must be a path, got {shown(database)} in {shown(database_dir)}"
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
            f"sql reward: the gold query {shown(gold_sql)} fails on {path}: {refused.__cause__ or refused}"
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
