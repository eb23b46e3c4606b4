"""The constraint rewards json, length and sql: the example tasks in examples/data scored right, hostile
completions scored 0.0 fast, bad specs refused with a message that names the problem."""

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from minigrpo.verifier import RewardSpec, compute_rewards, json_rewards, length_rewards
from minigrpo.verifier.constraints import sql as sql_module

DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
FAST = 3.0  # seconds a refusal may take: far above what it needs, for a loaded machine


def load_rows(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def columns_of(rows: list[dict]) -> dict[str, list]:
    return {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}


def score(name: str, completions: list, columns: dict, **options) -> list[float]:
    return compute_rewards(completions, columns, [RewardSpec(name, options=options)]).components[name]


def timed_score(name: str, completion: str, columns: dict, **options) -> tuple[float, float]:
    """One completion's reward and the wall seconds it took."""
    start = time.perf_counter()
    value = score(name, [completion], columns, **options)[0]
    return value, time.perf_counter() - start


def words(n: int) -> str:
    return " ".join(["word"] * n)


# --- json -------------------------------------------------------------------------------------------------

JSON_GOOD = [
    '```json\n{"country": "France", "capital": "Paris"}\n```',
    "Three primes:\n```json\n[2, 3, 5]\n```\nDone.",
    '{"title": "Dune", "year": 1965, "tags": ["science fiction"]}',  # no fence: the whole text
    '```json\n{"answer": "yes"}\n```\nNo, wait:\n```json\n{"answer": "no"}\n```',  # the last block counts
    '```\n{"celsius": null}\n```',  # a bare fence
    '"sunny"',  # no schema: any JSON value
]
JSON_BAD = [
    '```json\n{"country": "France", "capital": "Paris", "population": 68}\n```',  # additionalProperties
    "```json\n[2, 3, 20]\n```",  # exclusiveMaximum
    '{"title": "Dune", "year": "1965", "tags": []}',  # year is a string
    '```json\n{"answer": "maybe"}\n```',  # not in the enum
    '```json\n{"celsius": "warm"}\n```',  # neither number nor null
    "It is sunny today.",  # not JSON
]


def test_json_example_task_scores_good_and_bad_completions():
    rows = load_rows("json_task.jsonl")
    columns = columns_of(rows)
    assert score("json", JSON_GOOD, columns) == [1.0] * len(rows)
    assert score("json", JSON_BAD, columns) == [0.0] * len(rows)


@pytest.mark.parametrize(
    "completion, schema, expected",
    [
        ("2.0", {"type": "integer"}, 1.0),  # JSON Schema: 2.0 is an integer
        ("true", {"type": "integer"}, 0.0),  # a boolean is not a number
        ("1", {"enum": [True]}, 0.0),  # Python says 1 == True, JSON does not
        ("[1, 2.0]", {"const": [1.0, 2]}, 1.0),
        ("NaN", None, 0.0),  # Python's json reads it; it is not JSON
        ("5", {"exclusiveMinimum": 5}, 0.0),
        ('"héllo"', {"maxLength": 5}, 1.0),  # characters, not bytes
        ('{"a": 1}', {"required": ["a", "b"]}, 0.0),
        ("```json\n[1, 2]", None, 0.0),  # cut off inside the fence
        ('{"a": 1}', '{"type": "object", "properties": {"a": {"type": "integer"}}}', 1.0),  # a JSON string
        ("1e400", {"maximum": 10**300}, 0.0),  # Python reads 1e400 as inf: above any finite bound
    ],
)
def test_json_schema_subset(completion, schema, expected):
    assert score("json", [completion], {"schema": [schema]}) == [expected]


def test_json_schema_as_option_applies_to_every_row():
    assert score("json", ["[1]", '"a"'], {}, schema={"type": "array"}) == [1.0, 0.0]


@pytest.mark.parametrize(
    "completion", ["", "```json\n", "\ud800", "[" * 50, '"\\', "{" * 70 + "}" * 70, "\x00"]
)
def test_json_odd_completions_score_zero(completion):
    assert score("json", [completion], {"schema": [{"type": "object"}]}) == [0.0]


def test_json_10mb_document_scores_zero_fast():
    value, seconds = timed_score("json", '{"a": "' + "x" * 10_000_000 + '"}', {})
    assert value == 0.0 and seconds < FAST


def test_json_document_nested_100000_deep_scores_zero_fast():
    value, seconds = timed_score("json", "[" * 100_000 + "]" * 100_000, {"schema": [{"type": "array"}]})
    assert value == 0.0 and seconds < FAST


def test_json_unclosed_string_of_escaped_quotes_scores_zero_fast():
    value, seconds = timed_score("json", '["' + '\\"' * 400_000, {})  # each \" could start a string
    assert value == 0.0 and seconds < FAST


def test_json_document_past_the_work_budget_scores_zero_fast():
    schema = {"type": "array", "items": {"type": "integer"}}
    value, seconds = timed_score("json", "[" + "1, " * 200_000 + "1]", {"schema": [schema]})
    assert value == 0.0 and seconds < FAST


@pytest.mark.parametrize("as_text", [False, True])
def test_json_schema_nested_10000_deep_is_refused_fast(as_text):
    schema = {"type": "object"}
    for _ in range(10_000):
        schema = {"type": "object", "properties": {"a": schema}}
    text = '{"type": "object", "properties": {"a": ' * 10_000 + '{"type": "object"}' + "}}" * 10_000
    start = time.perf_counter()
    with pytest.raises(ValueError, match="deep"):
        score("json", ["{}"], {"schema": [text if as_text else schema]})
    assert time.perf_counter() - start < FAST


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "string", "pattern": "a+"}, "unknown schema keyword 'pattern'"),
        ({"properties": {"a": {"anyOf": []}}}, "unknown schema keyword 'anyOf' in schema.properties.a"),
        ({"type": "text"}, "schema.type must be one of"),
        ({"additionalProperties": {"type": "string"}}, "must be true or false"),
        ({"minItems": -1}, "minItems must be an integer >= 0"),
        ([], "must be a JSON object"),
        ({"type": {"a": [[[]]]}}, "schema.type must be one of .* got a dict"),
        ("{not json", "not JSON"),
    ],
)
def test_json_bad_schema_is_a_value_error_naming_the_problem(schema, message):
    with pytest.raises(ValueError, match=message):
        score("json", ['"x"'], {"schema": [schema]})


@pytest.mark.parametrize(
    "schema, message",
    [
        (
            {"minimum": 10**400},
            "schema.minimum must be a finite number within a float's range .*, got an integer of 1329 bits",
        ),
        ('{"maximum": ' + "9" * 400 + "}", "schema.maximum must be a finite number within a float's range"),
        ({"exclusiveMinimum": -(10**5000)}, "schema.exclusiveMinimum must be a finite number within"),
        ({"maxItems": -(10**5000)}, "schema.maxItems must be an integer >= 0, got an integer of 16610 bits"),
        ('{"minimum": ' + "9" * 5000 + "}", "the schema is not JSON .*Exceeds the limit .*digits"),
        (
            '{"description": "' + "x" * 1_000_000 + '"}',
            "the schema is 1,000,019 characters of JSON, more than",
        ),
        ('{"a": [' * 300 + "]}" * 300, "the schema is JSON nested deeper than 256 brackets"),
    ],
    ids=["int-bound", "text-bound", "negative-bound", "huge-count", "text-digits", "long-text", "deep-text"],
)
def test_json_schema_refused_for_what_is_wrong_with_it_in_one_line(schema, message):
    with pytest.raises(ValueError, match=message) as refused:
        score("json", ['"x"'], {"schema": [schema]})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "completion, schema, expected",
    [
        ('{"a": 1, "b": 2}', {"type": "object", "properties": {"a": {"type": "integer"}}}, 1.0),
        ('{"a": 1, "b": 2}', {"properties": {"a": {}}, "additionalProperties": False}, 0.0),
    ],
)
def test_json_additional_properties_are_allowed_unless_refused(completion, schema, expected):
    """additionalProperties is true unless a schema says false, as JSON Schema has it."""
    assert score("json", [completion], {"schema": [schema]}) == [expected]


# --- length -----------------------------------------------------------------------------------------------


def test_length_example_task_scores_inside_and_outside_the_band():
    rows = load_rows("length_task.jsonl")  # bands [20, 40], [10, 20], [0, 5], [30, inf), [50, 80]
    columns = columns_of(rows)
    inside = [words(n) for n in (30, 15, 2, 100, 50)]
    assert score("length", inside, columns, unit="words", soft=10) == [1.0] * 5
    outside = [words(n) for n in (15, 25, 20, 0, 85)]
    assert score("length", outside, columns, unit="words", soft=10) == [0.5, 0.5, 0.0, 0.0, 0.5]


def test_length_options_chars_and_a_ramp_on_both_sides():
    completions = ["x" * n for n in (0, 5, 10, 15, 20, 25, 30, 40)]
    expected = [0.0, 0.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    assert score("length", completions, {}, unit="chars", min=15, max=20, soft=10) == expected


def test_length_in_tokens_reads_the_completion_tokens_column():
    columns = {"completion_tokens": [[1, 2, 3], 8, [4] * 12]}  # token ids, or a count
    assert score("length", ["", "", ""], columns, unit="tokens", min=4, max=8, soft=4) == [0.75, 1.0, 0.0]


def test_length_band_of_one_length():
    assert length_rewards(["a b", "a", "a b c"], "words", low=2, high=2, soft=1) == [1.0, 0.0, 0.0]
    assert score("length", ["a b"], {"min_length": [2], "max_length": [2]}, soft=1) == [1.0]


@pytest.mark.parametrize(
    "options, columns, message",
    [
        ({"min": 50, "max": 20, "soft": 5}, {}, "min 50 > max 20"),
        ({"unit": "lines", "max": 20, "soft": 5}, {}, "unknown unit 'lines'"),
        ({"max": 20, "soft": 0}, {}, "soft must be a number > 0"),
        ({"max": 20}, {}, "soft must be a number > 0"),
        ({"soft": 5}, {}, "give a min, a max or both"),
        ({"max": -1, "soft": 5}, {}, "max must be a number >= 0"),
        ({"soft": 5}, {"min_length": [9], "max_length": [3]}, "min 9 > max 3"),
        ({"unit": "tokens", "max": 20, "soft": 5}, {}, "needs the completion_tokens column"),
    ],
)
def test_length_bad_spec_is_a_value_error_naming_the_problem(options, columns, message):
    with pytest.raises(ValueError, match=message):
        score("length", ["some words"], columns, **options)


# --- sql --------------------------------------------------------------------------------------------------

SQL_GOOD = [
    "```sql\nSELECT COUNT(id) FROM customers WHERE city = 'London';\n```",
    "```sql\nSELECT name FROM products WHERE category = 'home' ORDER BY name DESC\n```",  # order is ignored
    "SELECT name, total FROM customers JOIN (SELECT customer_id, SUM(quantity) AS total FROM orders "
    "GROUP BY customer_id) t ON t.customer_id = customers.id",  # no fence: the whole text
    "```sql\nSELECT name FROM products WHERE price = (SELECT MAX(price) FROM products)\n```",
    "```sql\nSELECT city FROM customers WHERE id IN (SELECT customer_id FROM orders WHERE product_id = 4) "
    "GROUP BY city\n```",
    "```\nSELECT category, SUM(price * quantity) FROM products JOIN orders ON product_id = products.id "
    "GROUP BY category\n```",  # a bare fence
]
SQL_BAD = [
    "```sql\nSELECT count(*) FROM customers\n```",
    "```sql\nSELECT name FROM products\n```",
    "```sql\nSELECT c.name, o.quantity FROM orders o JOIN customers c ON c.id = o.customer_id\n```",
    "```sql\nSELECT name FROM products ORDER BY price LIMIT 1\n```",
    "```sql\nSELECT city FROM customers\n```",  # the right cities, but duplicates count
    "```sql\nSELECT category, SUM(price) FROM products GROUP BY category\n```",
]


@pytest.fixture
def shop(tmp_path) -> Path:
    """A copy of the example database: a test that tries to write to it cannot harm the committed one."""
    copy = tmp_path / "shop.sqlite"
    copy.write_bytes((DATA / "shop.sqlite").read_bytes())
    return copy


def shop_columns(shop: Path, gold_sql: str = "SELECT count(*) FROM customers WHERE city = 'London'") -> dict:
    return {"database": [str(shop)], "gold_sql": [gold_sql]}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sql_example_task_scores_good_and_bad_completions():
    rows = load_rows("sql_task.jsonl")
    columns = columns_of(rows)
    assert score("sql", SQL_GOOD, columns, database_dir=str(DATA)) == [1.0] * len(rows)
    assert score("sql", SQL_BAD, columns, database_dir=str(DATA)) == [0.0] * len(rows)


def test_sql_example_database_is_rebuilt_from_its_script(tmp_path):
    rebuilt = sqlite3.connect(tmp_path / "rebuilt.sqlite")
    rebuilt.executescript((DATA / "shop.sql").read_text(encoding="utf-8"))
    committed = sqlite3.connect(f"file:{DATA / 'shop.sqlite'}?mode=ro", uri=True)
    tables = "SELECT name, sql FROM sqlite_master ORDER BY name"
    assert rebuilt.execute(tables).fetchall() == committed.execute(tables).fetchall()
    for (name,) in committed.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        query = f"SELECT * FROM {name} ORDER BY rowid"
        assert rebuilt.execute(query).fetchall() == committed.execute(query).fetchall(), name
    rebuilt.close()
    committed.close()


def test_sql_gold_result_is_recomputed_when_the_database_changes(shop):
    assert score("sql", ["SELECT 2"], shop_columns(shop)) == [1.0]
    modified = shop.stat().st_mtime_ns
    connection = sqlite3.connect(shop)
    with connection:
        connection.execute("INSERT INTO customers VALUES (6, 'Tony', 'London')")
    connection.close()
    os.utime(shop, ns=(modified, modified + 10**9))  # a new mtime even where the clock is coarse
    assert score("sql", ["SELECT 2"], shop_columns(shop)) == [0.0]
    assert score("sql", ["SELECT 3"], shop_columns(shop)) == [1.0]


def test_sql_cross_join_of_a_billion_rows_scores_zero_within_the_time_limit(tmp_path):
    database = tmp_path / "t.sqlite"
    connection = sqlite3.connect(database)
    with connection:
        connection.execute("CREATE TABLE t (x INTEGER)")
        connection.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    connection.close()
    columns = {"database": [str(database)], "gold_sql": ["SELECT 1000000000"]}
    start = time.perf_counter()
    rewards = compute_rewards(["SELECT count(*) FROM t a, t b, t c"], columns, [RewardSpec("sql")])
    assert rewards.components["sql"] == [0.0] and rewards.timed_out == [True]
    assert time.perf_counter() - start < FAST


def test_sql_attach_scores_zero_and_creates_no_file(shop, tmp_path):
    attached = tmp_path / "x.db"
    value, seconds = timed_score("sql", f"ATTACH DATABASE '{attached}' AS x", shop_columns(shop))
    assert value == 0.0 and seconds < FAST
    assert not attached.exists()


def test_sql_vacuum_into_scores_zero_and_creates_no_file(shop, tmp_path):
    copy = tmp_path / "copy.db"
    assert score("sql", [f"VACUUM INTO '{copy}'"], shop_columns(shop)) == [0.0]
    assert not copy.exists()


def test_sql_load_extension_scores_zero(shop):
    value, seconds = timed_score("sql", "SELECT load_extension('x')", shop_columns(shop))
    assert value == 0.0 and seconds < FAST


def test_sql_multiple_statements_score_zero(shop):
    columns = {"database": [str(shop)] * 2, "gold_sql": ["SELECT 2"] * 2}
    before = digest(shop)
    assert score("sql", ["SELECT 2; SELECT 1", "SELECT 2; DROP TABLE orders"], columns) == [0.0, 0.0]
    assert digest(shop) == before


@pytest.mark.parametrize(
    "write",
    [
        "DELETE FROM orders",
        "INSERT INTO customers VALUES (6, 'Tony', 'London')",
        "DROP TABLE orders",
        "UPDATE products SET price = 0",
        "CREATE TABLE evil (x)",
        "PRAGMA query_only = OFF",
        "PRAGMA writable_schema = ON",
        "VACUUM",
        "WITH c AS (SELECT 1) DELETE FROM orders",
    ],
)
def test_sql_writes_score_zero_and_leave_the_database_unchanged(shop, write):
    before = digest(shop)
    value, seconds = timed_score("sql", write, shop_columns(shop))
    assert value == 0.0 and seconds < FAST
    assert digest(shop) == before
    assert sorted(p.name for p in shop.parent.iterdir()) == ["shop.sqlite"]  # no journal left behind


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "-- only a comment",
        "SELECT",
        "SELECT '\ud800'",
        "SELECT 1\x00",
        "SELECT zeroblob(2000000000)",
        "SELECT hex(zeroblob(6000))",  # longer than MAX_VALUE_BYTES
        "x" * 20_000,
    ],
)
def test_sql_odd_completions_score_zero(shop, completion):
    assert score("sql", [completion], shop_columns(shop, "SELECT 1 WHERE 0")) == [0.0]


MANY_ROWS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 20000) SELECT i FROM n"


# a 10 KB string of "0" trimmed of 1,000 characters, "0" last: one call, quadratic in its arguments' lengths
LONG_ONE_CALL = (
    "SELECT length(trim(hex(zeroblob(4999)), (WITH RECURSIVE r(s) AS (SELECT 'a' UNION ALL SELECT s || 'a' "
    "FROM r WHERE length(s) < 1000) SELECT max(s) FROM r) || '0'))"
)


@pytest.mark.parametrize(
    "completion",
    ["SELECT printf('%.*c', 2000000000, 'x')", "SELECT format('%.*c', 2000000000, 'x')", LONG_ONE_CALL],
)
def test_sql_single_slow_function_calls_score_zero_fast(shop, completion):
    value, seconds = timed_score("sql", completion, shop_columns(shop))
    assert value == 0.0 and seconds < FAST


def test_sql_result_past_the_row_cap_scores_zero_fast(shop):
    value, seconds = timed_score("sql", MANY_ROWS, shop_columns(shop, "SELECT 1"))
    assert value == 0.0 and seconds < FAST


@pytest.mark.parametrize(
    "database, gold_sql, message",
    [
        ("missing.sqlite", "SELECT 1", "no database file at .*missing.sqlite"),
        ("notes.txt", "SELECT 1", "file is not a database"),
        ("shop.sqlite", "SELECT * FROM nowhere", "gold query .* fails on .*no such table: nowhere"),
        ("shop.sqlite", "DELETE FROM orders", "gold query .* fails on .*not authorized"),
        ("shop.sqlite", MANY_ROWS, "gold query .* fails on .*more than 10000 rows"),
        ("shop.sqlite", ["SELECT 1"], "gold_sql must be a string, got a list"),
    ],
)
def test_sql_bad_spec_is_a_value_error_naming_the_problem(shop, database, gold_sql, message):
    (shop.parent / "notes.txt").write_text("not a database, just text " * 100)
    columns = {"database": [database], "gold_sql": [gold_sql]}
    with pytest.raises(ValueError, match=message):
        score("sql", ["SELECT 1"], columns, database_dir=str(shop.parent))


def test_the_sql_authorizer_denies_code_loading_functions_and_pragmas_that_are_not_schema_reads():
    """Defence in depth beside a read-only connection without extensions: load_extension and the other
    denied functions are refused by name, and of the pragmas only the schema-reading ones pass."""
    deny, ok = sqlite3.SQLITE_DENY, sqlite3.SQLITE_OK
    for function in ("load_extension", "LOAD_EXTENSION", "fts3_tokenizer", "printf", "format"):
        assert sql_module._authorize(sqlite3.SQLITE_FUNCTION, None, function, None, None) == deny
    assert sql_module._authorize(sqlite3.SQLITE_FUNCTION, None, "upper", None, None) == ok
    for pragma in ("database_list", "journal_mode", "writable_schema", "query_only"):
        assert sql_module._authorize(sqlite3.SQLITE_PRAGMA, pragma, None, None, None) == deny
    assert sql_module._authorize(sqlite3.SQLITE_PRAGMA, "table_info", "t", None, None) == ok


def test_json_string_lengths_are_held_to_the_schema():
    schema = {"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 3}}}
    completions = ['{"code": "ab"}', '{"code": "abcd"}', '{"code": "a"}', '{"code": "abc"}']
    assert json_rewards(completions, schema) == [1.0, 0.0, 0.0, 1.0]
