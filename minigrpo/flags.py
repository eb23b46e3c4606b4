"""Before the loop: the settings as command-line flags and config-file keys. In: a config dataclass
(config.py). Out: one argparse flag per field, whose help is the field's comment, and the dataclass
built back from parsed flags; the parser every tool uses, whose errors are one line; and the values of
a JSON or YAML config file (`read_config_file`), each checked as its flag would check it. It knows
argparse and the dataclasses' source, not what a setting does.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import io
import json
import sys
import tokenize
import typing
from dataclasses import fields

from .config import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_TYPES,
    COVARIANCE_CONTROLS,
    DISTILLATION_FORMS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    PROCESS_REWARDS,
    REPORT_TO,
    SAMPLER_CORRECTIONS,
    SAMPLING_DTYPES,
    SCALES,
    SCHEDULES,
    TOOL_FORMATS,
)

# fields a flag gives as JSON text, which a config file may also give as the object itself (TRL's configs do)
JSON_OBJECTS = ("chat_template_kwargs",)

# flags' choices
CHOICES = {
    "loss_type": LOSS_TYPES,
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "covariance_control": COVARIANCE_CONTROLS,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
    "scale_rewards": SCALES,
    "advantage_type": ADVANTAGE_TYPES,
    "process_rewards": PROCESS_REWARDS,
    "tool_format": TOOL_FORMATS,
    "sampling_dtype": SAMPLING_DTYPES,
    "sampler_correction": SAMPLER_CORRECTIONS,
    "lr_schedule": SCHEDULES,
    "report_to": REPORT_TO,
    "distillation_form": DISTILLATION_FORMS,
}


class OneLineErrors(argparse.ArgumentParser):
    """argparse, whose errors (a bad choice, a value of the wrong type, an unknown flag, a missing argument)
    are one line naming the tool, as the tools' own errors are, not its usage of up to fifty lines and then
    the error."""

    def error(self, message: str):
        sys.exit(f"{self.prog}: {message}")


def add_fields(
    parser: argparse.ArgumentParser, config_class, aliases: dict | None = None
) -> dict[str, argparse.Action]:
    """One flag per field of `config_class`, in a group of --help named after it: --name (aliases[name]
    too), its help the field's comment, its type the annotation (bool: --name / --no-name; a tuple: that
    many values; X | None: an X, default None), its choices CHOICES'. The flags' actions by field name."""
    hints = typing.get_type_hints(config_class)
    comments = field_comments(config_class)
    group = parser.add_argument_group(config_class.__name__)
    actions = {}
    for field in fields(config_class):
        kind = hints[field.name]
        if type(None) in typing.get_args(kind):  # X | None
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        if kind is bool:
            typed = dict(action=argparse.BooleanOptionalAction)
        elif typing.get_origin(kind) is tuple:
            typed = dict(type=typing.get_args(kind)[0], nargs=len(typing.get_args(kind)))
        else:
            typed = dict(type=kind, choices=CHOICES.get(field.name))
        actions[field.name] = group.add_argument(
            f"--{field.name}",
            *(aliases or {}).get(field.name, ()),
            default=field.default,
            help=comments[field.name].replace("%", "%%"),
            **typed,
        )
    return actions


@functools.cache
def field_comments(config_class) -> dict[str, str]:
    """Each field's trailing comment in the class's source, by name: the help of its flag. Cached: reading
    a class's source parses its whole module, and a process builds its parser more than once (a comparison
    checks every variant's flags with train_math.py's own parser)."""
    comments = {}
    first_name = {}  # first_name: source row -> the first name on it
    for token in tokenize.generate_tokens(io.StringIO(inspect.getsource(config_class)).readline):
        if token.type == tokenize.NAME:
            first_name.setdefault(token.start[0], token.string)
        elif token.type == tokenize.COMMENT and token.start[0] in first_name:
            comments.setdefault(first_name[token.start[0]], token.string.lstrip("#").strip())
    return {field.name: comments.get(field.name, "") for field in fields(config_class)}


def from_args(config_class, args: argparse.Namespace):
    """The dataclass of parsed flags (add_fields'); its __post_init__ checks the values."""
    return config_class(**{field.name: getattr(args, field.name) for field in fields(config_class)})


# -- a config file: the same names as the flags, checked as the flags check them ------------------------
def read_config_file(path: str, options: dict[str, argparse.Action]) -> dict:
    """The values of a JSON or YAML file of option names (`options`: name -> its flag's action), each as its
    flag would give it, checked against the flag's type, count and choices (by the action's public attributes,
    not argparse's internals). A ValueError says what is wrong, in one line."""
    load = json.load
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"reading {path} needs PyYAML (pip install pyyaml), or use a JSON file"
            ) from None
        load = yaml.safe_load
    try:
        with open(path, encoding="utf-8") as f:
            values = load(f) or {}
    except Exception as error:  # a missing file, bad JSON or YAML
        raise ValueError(f"cannot read the config file {path}: {_read_error(error)}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of option names to values")
    return option_values(values, options, path)


def option_values(values: dict, options: dict[str, argparse.Action], where: str) -> dict:
    """`values` (option name -> value, read from `where`), each as its flag would give it; a ValueError
    names an unknown option or a bad value."""
    unknown = sorted(set(values) - set(options))
    if unknown:
        raise ValueError(f"{where} has unknown options: {', '.join(unknown)}")
    try:
        return {key: _file_value(options[key], value) for key, value in values.items()}
    except ValueError as problem:
        raise ValueError(f"{where}: {problem}") from None


def _read_error(error: Exception) -> str:
    """What is wrong with a config file, in one line: where the JSON or YAML parser stopped, and why (PyYAML's
    own message spans several lines, quoting the text with a caret under it)."""
    if isinstance(error, json.JSONDecodeError):
        return f"line {error.lineno}, column {error.colno}: {error.msg}"
    mark = getattr(error, "problem_mark", None)  # PyYAML's MarkedYAMLError
    if mark is None:
        return " ".join(str(error).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    started = getattr(error, "context_mark", None)
    if error.context and started is not None:
        return f"{where} ({error.context} that starts on line {started.line + 1})"
    return f"{where} ({error.context})" if error.context else where


_WANTED = {
    str: ("must be text", (str,)),
    int: ("must be an integer", (str, int)),
    float: ("must be a number", (str, int, float)),
}


def _file_value(action: argparse.Action, value):
    """A file's value as its flag would give it; a ValueError says what is wrong with it."""
    if isinstance(action, argparse.BooleanOptionalAction):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{action.dest} must be true or false, got {value!r}")
    if action.dest in JSON_OBJECTS and isinstance(value, dict):
        return value  # GRPOConfig takes the object as its JSON text
    if value is None:
        if action.default is None:
            return value
        raise ValueError(f"{action.dest} must not be null (leave it out for the default), got None")
    if action.nargs is None:
        return _one_value(action, value, value)
    if not isinstance(value, list) or len(value) != action.nargs:
        raise ValueError(f"{action.dest} must be a list of {action.nargs} values, got {value!r}")
    return [_one_value(action, item, value) for item in value]


def _one_value(action: argparse.Action, item, value):
    """`item` (of `value`) as the flag's type: text may stand for a number, as YAML reads 1e-5."""
    kind = action.type or str
    wanted, allowed = _WANTED[kind]
    try:
        item = kind(item) if isinstance(item, allowed) and not isinstance(item, bool) else None
    except ValueError:
        item = None
    if item is None:
        raise ValueError(f"{action.dest} {wanted}, got {value!r}")
    if action.choices is not None and item not in action.choices:
        raise ValueError(f"{action.dest} must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return item
