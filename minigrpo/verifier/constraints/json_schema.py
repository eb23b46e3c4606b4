"""Stage 2 of the loop, verify: json - the completion's JSON parses and fits a JSON-Schema subset.

In: a completion's text and the row's `schema` (a dict, a JSON string of one, or None: parse only).
Out: 1.0 or 0.0 per completion; a completion never raises, whatever it holds (hostile text scores 0.0), and
its check is bounded in depth and work. A schema outside the subset is a ValueError. It knows strings, not
tensors.

The completion's JSON is its last ```json or bare ``` block, else the whole text; the subset is
`SCHEMA_KEYWORDS`. The validator is our own, not the `jsonschema` package: that adds no dependency, and it
bounds depth (`MAX_DEPTH`) and work (`MAX_VALIDATION_STEPS`), which jsonschema does not (it recurses without
limit).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys

from .constraint_inputs import answer_text, is_integer, is_number, shown

MAX_TEXT_CHARS = 1_000_000  # a longer JSON text (completion or schema) scores 0 / is refused, unparsed
MAX_DEPTH = 64  # deepest nesting of a document (deeper scores 0) and of a schema (deeper is refused)
MAX_SCHEMA_BRACKETS = 4 * MAX_DEPTH  # a schema's JSON text nested deeper is refused: a level takes up to 4
MAX_VALIDATION_STEPS = 100_000  # values, keys and names checked per completion; a document needing more: 0

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
    document = _parse_json(answer_text(completion, ("json", "")), MAX_DEPTH)
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
        schema = _schema_json(schema)
    if schema is not None:
        check_schema(schema)
    return schema


def _schema_json(text: str):
    """A schema's JSON text parsed; a ValueError names why it cannot be: too long, too deep, or not JSON."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"json reward: the schema is {len(text):,} characters of JSON, more than {MAX_TEXT_CHARS:,}"
        )
    if _nesting_depth(text) > MAX_SCHEMA_BRACKETS:  # found before parsing: json.loads recurses per level
        raise ValueError(
            f"json reward: the schema is JSON nested deeper than {MAX_SCHEMA_BRACKETS} brackets: "
            f"{shown(text)}"
        )
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:  # not JSON, NaN or Infinity, or an integer of over 4300 digits
        cause = str(error).splitlines()[0]
        raise ValueError(f"json reward: the schema is not JSON ({cause}): {shown(text)}") from None


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
        is_integer(value) and value >= 0
    ):
        raise ValueError(f"json reward: {where} must be an integer >= 0, got {_shown(value)}")
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and not (
        is_number(value) and _in_float_range(value)
    ):
        raise ValueError(
            f"json reward: {where} must be a finite number within a float's range "
            f"(±{sys.float_info.max:.1e}), got {_shown(value)}"
        )


def _in_float_range(value) -> bool:
    """Whether a number is finite and no larger than a float can be (math.isfinite overflows on such ints)."""
    return abs(value) <= sys.float_info.max if is_integer(value) else math.isfinite(value)


def _shown(value) -> str:
    """shown(value), but a long integer by its size: Python refuses to write one of over 4300 digits."""
    if is_integer(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return shown(value)


def _parse_json(text: str, max_depth: int):
    """The JSON value of a document's `text`, or _INVALID: too long, nested deeper than `max_depth`, or
    not JSON (NaN and Infinity are not JSON). Depth is found before parsing: json.loads recurses per level."""
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
    if is_number(value):
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
        return is_integer(value) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return is_number(value)
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
    return type(a) is type(b) or (is_number(a) and is_number(b))
