"""Before the loop: the settings as command-line flags and config-file keys. In: a config dataclass
(config.py). Out: one argparse flag per field, whose help is the field's comment, and the dataclass
built back from parsed flags; and the parser every tool uses, whose errors are one line. It knows
argparse and the dataclasses' source, not what a setting does.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import io
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
