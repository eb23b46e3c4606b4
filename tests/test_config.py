"""One source for every setting: each GRPOConfig / TrainConfig field is a flag of examples/train_math.py
named after it, its comment the --help text; a --config file sets the same fields; the checks live in
__post_init__ (the sampling ones in SamplingConfig); report_to sends the metrics to TensorBoard or wandb.
In-process, on the example's own parser: nothing here trains."""

import glob
import importlib.util
import json
import math
import os
from dataclasses import fields

import pytest
from helpers import tiny_model

import minigrpo.config
from minigrpo import GRPOConfig, SamplingConfig, TrainConfig, generate
from minigrpo.flags import CHOICES, field_comments, from_args
from minigrpo.run import MetricsLogger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("train_math", os.path.join(ROOT, "examples", "train_math.py"))
train_math = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_math)  # defines the parser; the run itself is under `if __name__ == "__main__"`
FIELDS = [(cls, field.name) for cls in (GRPOConfig, TrainConfig) for field in fields(cls)]


def configs(argv):
    args = train_math.parse_args(argv)
    return from_args(GRPOConfig, args), from_args(TrainConfig, args)


def other_value(name, default):
    """A valid value of the field that is not its default in train_math."""
    if isinstance(default, bool):
        return not default
    if name == "tools":  # registered names only
        return "calculator,python"
    if name == "chat_template_kwargs":  # a JSON object
        return '{"enable_thinking": false}'
    if name == "lora_target_modules":  # projections' names
        return "q_proj,v_proj"
    if name == "clip_ratio_c":  # dual-clip's cap is above 1
        return 3.0
    if name == "teacher_model":  # a path, which argparse must not read as a flag
        return "models/teacher"
    if name in CHOICES:
        return next(choice for choice in CHOICES[name] if choice != default)
    if isinstance(default, tuple):
        return tuple(value / 2 for value in default)
    if isinstance(default, str):
        return default + "-elsewhere"
    if isinstance(default, int):
        return default + 1
    return default / 2 if default else 0.5  # a float, or None (epsilon_high)


def as_flags(name, value) -> list[str]:
    if isinstance(value, bool):
        return [f"--{name}" if value else f"--no-{name}"]
    return [f"--{name}", *map(str, value if isinstance(value, tuple) else [value])]


DEFAULTS = vars(train_math.parse_args([]))
# Settings that read each other, each group changed together and on its own: the estimator's k, the sapo
# loss's temperatures and the covariance controls' settings are refused where nothing reads them, and the
# all-at-once change below takes loss_type bnpo, the sequence-level ratio and process advantages.
COUPLED = [
    {"advantage_estimator": "passk", "pass_k": 3},
    {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 2.5},
    {"covariance_control": "clip_cov", "clip_cov_ratio": 0.01, "clip_cov_lb": 0.5, "clip_cov_ub": 4.0},
    {"covariance_control": "kl_cov", "kl_cov_ratio": 0.01, "ppo_kl_coef": 0.5},
]
# Every other field but one changed at once: monte_carlo's continuations call no tools (GRPOConfig refuses
# the pair), so the tools are changed on their own.
CHANGED = {
    name: other_value(name, DEFAULTS[name])
    for _, name in FIELDS
    if name != "tools" and not any(name in group for group in COUPLED)
}
TOOLS = other_value("tools", DEFAULTS["tools"])


def test_help_lists_every_field_with_its_comment():
    parser, _ = train_math.build_parser()
    text = "".join(parser.format_help().split())  # argparse wraps the help at the terminal's width
    for cls, name in FIELDS:
        comment = field_comments(cls)[name]
        assert comment, f"{cls.__name__}.{name} has no comment"
        assert f"--{name}" in text and "".join(comment.split()) in text, name
    assert "--steps" in text and "--data" in text  # the old short names stay


def test_every_field_is_reachable_from_the_command_line():
    grpo, train = configs([part for name, value in CHANGED.items() for part in as_flags(name, value)])
    for cls, name in FIELDS:
        if name in CHANGED:
            assert getattr(grpo if cls is GRPOConfig else train, name) == CHANGED[name], name
    # the python tool needs the qwen3 format, CHANGED's
    with_tools = as_flags("tools", TOOLS) + as_flags("tool_format", CHANGED["tool_format"])
    assert configs(with_tools)[0].tools == TOOLS
    for group in COUPLED:
        grpo = configs([part for name, value in group.items() for part in as_flags(name, value)])[0]
        assert {name: getattr(grpo, name) for name in group} == group
    assert configs(["--steps", "7"])[1].max_steps == 7


def test_the_default_run_is_what_it_was():
    grpo, train = configs([])
    assert grpo == GRPOConfig(max_completion_length=32)
    assert train == TrainConfig(
        output_dir="runs/train_math",
        max_steps=600,
        batch_size=256,
        micro_batch_size=256,
        micro_batch_tokens=4096,
        learning_rate=1e-4,
        warmup_steps=10,
        lr_schedule="cosine",
        save_every=50,
        log_completions_every=50,
    )


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_config_file_and_the_same_flags_give_the_same_configs(tmp_path, suffix):
    values = {name: list(v) if isinstance(v, tuple) else v for name, v in CHANGED.items()}
    path = tmp_path / f"run{suffix}"
    path.write_text(
        json.dumps(values) if suffix == ".json" else pytest.importorskip("yaml").safe_dump(values)
    )
    from_flags = configs([part for name, value in CHANGED.items() for part in as_flags(name, value)])
    assert configs(["--config", str(path)]) == from_flags
    grpo, train = configs(["--config", str(path), "--beta", "0.25", "--no-resume"])  # flags win over the file
    assert grpo.beta == 0.25 and not train.resume and train.max_steps == CHANGED["max_steps"]


def test_yaml_text_that_means_a_number_is_that_number(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    # PyYAML reads 1e-5 as text
    path.write_text("learning_rate: 1e-5\nadam_betas: [0.9, 0.95]\nloss_type: dapo\n")
    _, train = configs(["--config", str(path)])
    assert train.learning_rate == 1e-5 and train.adam_betas == (0.9, 0.95)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"epochs": 3, "learning_rate": 1e-5, "lr": 0.1}, "{path} has unknown options: epochs, lr"),
        ({"adam_betas": [0.9]}, "{path}: adam_betas must be a list of 2 values, got [0.9]"),
        ({"adam_betas": [0.9, "x"]}, "{path}: adam_betas must be a number, got [0.9, 'x']"),
        ({"bf16": 1}, "{path}: bf16 must be true or false, got 1"),
        ({"max_steps": 2.5}, "{path}: max_steps must be an integer, got 2.5"),
        (
            {"loss_type": "ppo"},
            "{path}: loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, gmpo, dppo_tv, "
            "dppo_kl, reinforce, got 'ppo'",
        ),
        (
            {"learning_rate": None},
            "{path}: learning_rate must not be null (leave it out for the default), got None",
        ),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_problem(tmp_path, values, message):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(values))
    with pytest.raises(SystemExit) as stop:
        train_math.parse_args(["--config", str(path)])
    assert stop.value.code == "train_math.py: " + message.format(path=path)  # sys.exit prints it as one line


def test_a_models_recorded_task_sits_between_the_defaults_and_a_config_file(tmp_path):
    """models/minigrpo-tiny-calc records its task (tokenizer.read_task): it replaces train_math's defaults
    whether the model is named on the command line or in a config file, and a config file's values and
    the command line's flags beat it."""
    calc = os.path.join(ROOT, "models", "minigrpo-tiny-calc")
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"model": calc}))
    overriding = tmp_path / "overriding.json"
    overriding.write_text(json.dumps({"model": calc, "max_steps": 7}))
    for argv in (["--model", calc], ["--config", str(named)]):
        args = train_math.parse_args(argv)
        assert (args.data, args.tools, args.max_completion_length, args.max_steps) == (
            "calc",
            "calculator",
            64,
            100,
        )
    assert train_math.parse_args(["--config", str(overriding)]).max_steps == 7
    assert train_math.parse_args(["--config", str(named), "--tools", "none"]).tools == "none"


def test_grpo_config_gives_the_sampler_its_settings_and_they_are_checked_there():
    grpo = GRPOConfig(num_generations=4, max_completion_length=16, temperature=0.7, top_p=0.9, top_k=5)
    assert grpo.sampling_config() == SamplingConfig(
        max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=5, num_samples=4
    )
    model, prompts = tiny_model(), [[1, 2, 3], [4, 5]]
    # per-call settings over it
    given = generate(model, prompts, grpo.sampling_config(), max_new_tokens=6, seed=3)
    assert (
        given.tokens
        == generate(
            model, prompts, max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=5, num_samples=4, seed=3
        ).tokens
    )
    for bad, message in [
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            GRPOConfig(**bad)


def test_report_to_tensorboard_logs_the_metrics_under_their_names(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(start_step, steps):
        logger = MetricsLogger(str(tmp_path), 4, start_step, progress_bar=False, report_to="tensorboard")
        for step in steps:
            logger.log(step, {"reward/mean": step / 4, "clip/low_frac": 0.0, "loss": -step / 8})
        logger.close()

    run(0, [1, 2, 3])
    # resumed from step 1: steps 2 and 3 are logged again, and only their second values stay
    run(1, [2, 3, 4])
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    metrics = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert sorted(events.Tags()["scalars"]) == ["clip/low_frac", "loss", "reward/mean"]
    for name in ("reward/mean", "loss"):
        assert [(e.step, e.value) for e in events.Scalars(name)] == [(m["step"], m[name]) for m in metrics]


def test_report_to_wandb_writes_an_offline_run(tmp_path):
    pytest.importorskip(
        "wandb", reason="wandb is an optional extra (pip install wandb), not in the test extra"
    )
    logger = MetricsLogger(str(tmp_path), 2, 0, progress_bar=False, report_to="wandb")
    logger.log(1, {"reward/mean": 0.5})
    logger.close()
    (run,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert b"reward/mean" in open(run, "rb").read()


def test_a_reporter_whose_package_is_missing_is_refused_before_any_work(monkeypatch):
    monkeypatch.setattr(minigrpo.config.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"report_to=wandb needs the wandb package: pip install wandb"):
        TrainConfig(report_to="wandb")
    with pytest.raises(ValueError, match="report_to must be one of none, tensorboard, wandb, got 'mlflow'"):
        TrainConfig(report_to="mlflow")


FLOAT_FIELDS = [
    (cls, field.name)
    for cls, field in ((c, f) for c in (GRPOConfig, TrainConfig) for f in fields(c))
    if isinstance(field.default, float) or field.name in ("epsilon_high", "adam_betas")
]


@pytest.mark.parametrize("cls, name", FLOAT_FIELDS, ids=[name for _, name in FLOAT_FIELDS])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_setting_must_be_finite(cls, name, bad):
    """inf and nan pass most range checks (inf > 0; nan compares False both ways) and then reach the loss."""
    value = (0.9, bad) if name == "adam_betas" else bad
    with pytest.raises(ValueError, match=f"^{name} must be a finite number, got"):
        cls(**{name: value})


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_the_sampler_refuses_a_temperature_that_is_not_finite(bad):
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        SamplingConfig(temperature=bad)


def test_the_choices_config_declares_are_the_ones_the_stages_implement():
    """config.py names each choice without importing a stage; each stage's table must hold exactly those."""
    import minigrpo.run.metrics as metrics
    from minigrpo import config, tools

    assert tuple(tools.FORMATS) == config.TOOL_FORMATS
    assert ("none", *metrics.REPORTERS) == config.REPORT_TO
