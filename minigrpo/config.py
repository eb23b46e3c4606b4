"""Before the loop: the settings of a GRPO run, one dataclass per concern, each checked once, in
__post_init__, before any work. In: values (from code, flags or a --config file). Out: checked
dataclasses, and the flags made from them. It knows settings and their ranges, not what the stages do
with them.

GRPOConfig: the rollout and the objective (TRL's names: num_generations, max_completion_length,
beta, epsilon, loss_type, scale_rewards, num_iterations, ...); it hands the sampler its
SamplingConfig (sampler.py). TrainConfig: the optimizer, the loop, logging and checkpoints. The
model's own settings are Qwen3Config (qwen3.py). Each field's default and one-line comment are
also its command-line flag: `add_fields` makes the flags (examples/train_math.py, whose --config
file takes the same names), `from_args` builds the dataclass back.
"""

from __future__ import annotations

import argparse
import inspect
import io
import math
import tokenize
import typing
from dataclasses import asdict, dataclass, fields

from .advantages import ADVANTAGE_TYPES, SCALES, check_advantage_type, check_scale
from .loss import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, SAMPLER_CORRECTIONS, check_objective
from .metrics import REPORT_TO, check_report_to
from .sampler import SamplingConfig
from .tools import FORMATS, check_tools

SCHEDULES = ("constant", "cosine")
SAMPLING_DTYPES = ("float32", "bfloat16", "float16")
PROCESS_REWARDS = ("steps", "monte_carlo")
# flags' choices
CHOICES = {
    "loss_type": LOSS_TYPES,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
    "scale_rewards": SCALES,
    "advantage_type": ADVANTAGE_TYPES,
    "process_rewards": PROCESS_REWARDS,
    "tool_format": tuple(FORMATS),
    "sampling_dtype": SAMPLING_DTYPES,
    "sampler_correction": SAMPLER_CORRECTIONS,
    "lr_schedule": SCHEDULES,
    "report_to": REPORT_TO,
}


@dataclass
class GRPOConfig:
    """What is sampled and what is optimised."""

    num_generations: int = 8  # G: completions sampled per prompt, the group advantages are relative to
    max_completion_length: int = 256  # new tokens per completion; EOS counts
    temperature: float = 1.0  # sampling temperature, also used in every log-prob pass
    top_p: float = 1.0  # nucleus sampling; 1 keeps every token
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    sampling_dtype: str | None = None  # sample with a copy of the policy in this dtype; None: its own
    epsilon: float = 0.2  # clip range below 1 (and above, unless epsilon_high is set); GSPO's paper: 3e-4
    epsilon_high: float | None = None  # clip above 1 (DAPO's clip-higher: 0.28, GSPO: 4e-4); None: epsilon
    beta: float = 0.0  # weight of the k3 KL to the reference model; 0 keeps no reference model
    loss_type: str = "grpo"  # grpo | bnpo | dr_grpo | dapo | cispo (see loss.py)
    importance_sampling_level: str = "token"  # token | sequence (GSPO: one normalised ratio per completion)
    sampler_correction: str = "none"  # weight tokens by trained-on over sampler probability (loss.py)
    sampler_correction_cap: float = 3.0  # C: weights truncated at C, or masked outside [1/C, C]
    scale_rewards: str = "group"  # group | batch | none (Dr. GRPO): what the centred reward is divided by
    advantage_type: str = "outcome"  # outcome | process | outcome+process (DeepSeekMath 4.1.3, advantages.py)
    process_rewards: str = "steps"  # step rewards: steps (arithmetic checker) | monte_carlo (Math-Shepherd)
    process_samples: int = 4  # monte_carlo: continuations sampled per step prefix (its N)
    tools: str = "none"  # tools a completion may call, comma-separated: calculator, python, ...; none: none
    tool_format: str = "calc"  # calc (<calc>2+3</calc> answered <out>5</out>) | qwen3 (<tool_call> JSON)
    max_tool_calls: int = 4  # calls per completion; one more ends it, finish reason tool_limit
    num_iterations: int = 1  # mu: passes over each batch of rollouts; 1 is on-policy (ratio exactly 1)
    mask_truncated_completions: bool = False  # completions cut at max_completion_length get no loss (DAPO)
    dynamic_sampling: bool = False  # DAPO: sample more until the batch's groups all have reward variance
    max_sampling_rounds: int = 4  # dynamic sampling gives up after this many sampling calls per step
    drop_zero_variance_groups: bool = False  # leave groups with equal rewards out of the update (no signal)
    overlong_buffer: int = 0  # DAPO's soft overlong penalty over the last this-many tokens; 0 = off
    overlong_penalty: float = 1.0  # reward lost at max_completion_length (linear over the buffer)

    def __post_init__(self):
        _require_finite(self)
        _require(
            isinstance(self.num_generations, int) and self.num_generations >= 2,
            "num_generations must be an integer >= 2 (GRPO compares completions of a prompt), "
            f"got {self.num_generations!r}",
        )
        _require(
            isinstance(self.max_completion_length, int) and self.max_completion_length >= 1,
            f"max_completion_length must be a positive integer, got {self.max_completion_length!r}",
        )
        self.sampling_config()  # temperature, top_p, top_k: checked where the sampler reads them
        _require(
            self.sampling_dtype is None or self.sampling_dtype in SAMPLING_DTYPES,
            f"sampling_dtype must be one of {', '.join(SAMPLING_DTYPES)} (or None: the policy's own), "
            f"got {self.sampling_dtype!r}",
        )
        check_objective(
            self.loss_type,
            self.epsilon,
            self.epsilon_high,
            self.beta,
            self.importance_sampling_level,
            self.sampler_correction,
            self.sampler_correction_cap,
        )
        check_scale(self.scale_rewards)
        check_advantage_type(self.advantage_type)
        _require(
            self.process_rewards in PROCESS_REWARDS,
            f"process_rewards must be one of {', '.join(PROCESS_REWARDS)}, got {self.process_rewards!r}",
        )
        _require(
            isinstance(self.process_samples, int) and self.process_samples >= 1,
            f"process_samples must be a positive integer, got {self.process_samples!r}",
        )
        check_tools(self.tool_names, self.tool_format, self.max_tool_calls)
        self._check_process_settings()
        _require(
            isinstance(self.num_iterations, int) and self.num_iterations >= 1,
            f"num_iterations must be a positive integer, got {self.num_iterations!r}",
        )
        _require(
            self.max_sampling_rounds >= 1, f"max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}"
        )
        _require(
            0 <= self.overlong_buffer < self.max_completion_length,
            f"overlong_buffer must be in [0, max_completion_length), got {self.overlong_buffer}",
        )

    def _check_process_settings(self) -> None:
        """Process settings that would do nothing, or value steps unlike the rollouts they come from."""
        _require(
            not (self.process_rewards == "monte_carlo" and self.tool_names),
            f"process_rewards='monte_carlo' cannot be combined with tools ({self.tools}): its continuations "
            "are sampled without them, so a step that a tool call follows is valued without the call; use "
            "process_rewards='steps' with tools, or tools='none'",
        )
        _require(
            not (self.process_rewards == "monte_carlo" and self.advantage_type == "outcome"),
            "process_rewards='monte_carlo' values steps for process advantages, which advantage_type="
            "'outcome' never reads (its continuations would be sampled for nothing): use advantage_type="
            "'process' or 'outcome+process'",
        )
        unchanged = self.process_samples == _default(GRPOConfig, "process_samples")
        _require(
            unchanged or self.process_rewards == "monte_carlo",
            f"process_samples={self.process_samples} is read only by process_rewards='monte_carlo' (its "
            f"continuations per step); with process_rewards={self.process_rewards!r} it does nothing",
        )

    @property
    def tool_names(self) -> list[str]:
        """The tools a completion may call ([] for none)."""
        names = [name.strip() for name in self.tools.split(",") if name.strip()]
        return [] if names == ["none"] else names

    def sampling_config(self) -> SamplingConfig:
        """The sampler's settings for this run's rollouts (per call, generate adds eos_token_ids and seed)."""
        return SamplingConfig(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            num_samples=self.num_generations,
        )


@dataclass
class TrainConfig:
    """How the policy is optimised, and where the run writes."""

    output_dir: str = "runs/grpo"  # metrics.jsonl, initial_eval.json and checkpoints/step-N go here
    max_steps: int = 100  # GRPO steps of the run; the learning-rate schedule spans them
    stop_at_step: int = 0  # end this process after this step, checkpointed (time-boxed jobs); 0 = max_steps
    batch_size: int = 64  # completions per step: prompts per step = batch_size / num_generations
    micro_batch_size: int = 8  # completions per forward/backward; gradients accumulate over a step
    # micro-batches of similar-length completions, each also at most micro_batch_size rows
    micro_batch_tokens: int = 0  # if > 0: at most this many padded tokens per micro-batch
    shared_prompt: bool = True  # update: each prompt runs once for its G completions (whole groups)
    learning_rate: float = 1e-6  # AdamW peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    adam_epsilon: float = 1e-8  # AdamW epsilon, added to the root of the second moment
    warmup_steps: int = 0  # linear warm-up from 0 to learning_rate over this many steps
    lr_schedule: str = "constant"  # after warm-up: constant | cosine (to 0 at max_steps)
    max_grad_norm: float = 1.0  # clip the gradient's global norm; 0 = no clipping
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, one forward more
    bf16: bool = True  # on GPU, run forward passes under bfloat16 autocast (CPU always fp32)
    # one process: no effect
    fsdp: bool = False  # under torchrun: shard policy (and reference) over the ranks with FSDP2, not DDP
    seed: int = 0  # sampling, data order and micro-batch shuffles all derive from this
    save_every: int = 0  # write a checkpoint every this many steps (0: only at the end)
    save_total_limit: int = 2  # checkpoints kept (the oldest are deleted)
    resume: bool = False  # continue from the latest checkpoint in output_dir
    log_completions_every: int = 10  # print a few sampled completions every this many steps (0: never)
    progress_bar: bool = True  # a tqdm bar over steps
    # under metrics.jsonl's names, written in output_dir
    report_to: str = "none"  # also send each step's stats to tensorboard or wandb (offline)

    def __post_init__(self):
        self.adam_betas = tuple(self.adam_betas)
        _require_finite(self)
        for name in ("max_steps", "batch_size", "micro_batch_size"):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and value >= 1, f"{name} must be a positive integer, got {value!r}"
            )
        _require(
            isinstance(self.micro_batch_tokens, int) and self.micro_batch_tokens >= 0,
            "micro_batch_tokens must be an integer >= 0 (0: micro_batch_size rows), "
            f"got {self.micro_batch_tokens!r}",
        )
        _require(self.adam_epsilon > 0, f"adam_epsilon must be > 0, got {self.adam_epsilon}")
        _require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        _require(
            self.lr_schedule in SCHEDULES,
            f"lr_schedule must be one of {', '.join(SCHEDULES)}, got {self.lr_schedule!r}",
        )
        _require(
            min(self.warmup_steps, self.stop_at_step, self.save_every, self.max_grad_norm) >= 0
            and self.save_total_limit >= 1,
            "warmup_steps, stop_at_step, save_every and max_grad_norm must be >= 0, save_total_limit >= 1",
        )
        check_report_to(self.report_to)

    def check_against(self, grpo: GRPOConfig, world_size: int = 1) -> None:
        """Invariants across the two configs, and the processes of the run (each takes whole groups)."""
        G = grpo.num_generations
        _require(
            self.batch_size % G == 0,
            f"batch_size={self.batch_size} completions do not split into groups of "
            f"num_generations={G}; use a multiple of {G}",
        )
        _require(
            (self.batch_size // G) % world_size == 0,
            f"batch_size={self.batch_size} completions are "
            f"{self.batch_size // G} prompts per step, which do not split evenly "
            f"across {world_size} processes; "
            f"use a batch_size that is a multiple of {G * world_size}",
        )

        _require(
            not (self.fsdp and grpo.sampling_dtype is not None),
            "sampling_dtype cannot be combined with fsdp: the sampling copy would hold the whole "
            "weights on every rank, which is what FSDP2 avoids",
        )

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of GRPO step `step` (1, 2, ...): a linear warm-up over warmup_steps, then
        constant or cosine to 0 at max_steps (one value per GRPO step, not per AdamW step)."""
        done, warmup = step - 1, self.warmup_steps  # steps before this one
        if done < warmup:
            return self.learning_rate * (done + 1) / (warmup + 1)
        if self.lr_schedule == "constant":
            return self.learning_rate
        progress = min((done - warmup) / max(self.max_steps - warmup, 1), 1.0)
        return self.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def changed_settings(saved: dict, current: dict) -> list[str]:
    """What a resumed run changed from its checkpoint's settings (as_dict of both), a note each: allowed
    (a longer run, say) but never silent. Settings of the process rather than of the training are skipped."""
    ignored = {
        "resume",
        "stop_at_step",
        "progress_bar",
        "log_completions_every",
        "save_every",
        "output_dir",
        "report_to",
    }
    notes = []
    for section, values in current.items():
        for key, value in values.items():
            old = saved.get(section, {}).get(key, value)
            if (
                key not in ignored
                and old != value
                and not (isinstance(old, (list, tuple)) and tuple(old) == tuple(value))
            ):
                notes.append(
                    f"note: resuming with {section}.{key} = {value!r}; "
                    f"the checkpoint was trained with {old!r}"
                )
    return notes


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _default(config_class, name: str):
    return next(field.default for field in fields(config_class) if field.name == name)


def _require_finite(config) -> None:
    """Every float setting (a tuple's items too) is a finite number: inf and nan pass most range checks
    (inf > 0; every comparison with nan is False, so min() of a list holding one may ignore it) and
    then turn the loss, the learning rate or the sampling distribution into nan."""
    for field in fields(config):
        value = getattr(config, field.name)
        for item in value if isinstance(value, tuple) else (value,):
            _require(
                not isinstance(item, float) or math.isfinite(item),
                f"{field.name} must be a finite number, got {value!r}",
            )


def as_dict(*configs) -> dict:
    return {type(c).__name__: asdict(c) for c in configs}


# -- the same fields as command-line flags and config-file keys -------------------------------------
def add_fields(
    parser: argparse.ArgumentParser, config_class, aliases: dict | None = None
) -> dict[str, argparse.Action]:
    """One flag per field of `config_class`, in a group of --help named after it: --name (aliases[name]
    too), its help the field's comment, its type the annotation (bool: --name / --no-name; a tuple: that
    many values; X | None: an X, default None), its choices CHOICES'. The flags' actions by field name."""
    hints, comments = typing.get_type_hints(config_class), field_comments(config_class)
    group, actions = parser.add_argument_group(config_class.__name__), {}
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


def field_comments(config_class) -> dict[str, str]:
    """Each field's trailing comment in the class's source, by name: the help of its flag."""
    comments, first_name = {}, {}  # first_name: source row -> the first name on it
    for token in tokenize.generate_tokens(io.StringIO(inspect.getsource(config_class)).readline):
        if token.type == tokenize.NAME:
            first_name.setdefault(token.start[0], token.string)
        elif token.type == tokenize.COMMENT and token.start[0] in first_name:
            comments.setdefault(first_name[token.start[0]], token.string.lstrip("#").strip())
    return {field.name: comments.get(field.name, "") for field in fields(config_class)}


def from_args(config_class, args: argparse.Namespace):
    """The dataclass of parsed flags (add_fields'); its __post_init__ checks the values."""
    return config_class(**{field.name: getattr(args, field.name) for field in fields(config_class)})
