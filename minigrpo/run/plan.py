"""Before the loop: what a run trains and against what, decided once when its Trainer is built.

In: the policy as given (its dtype, any adapters it was loaded with), the model the run started from,
the tokenizer, the task's encoded prompts and the configs. Out: a `TrainingPlan`: what trains (every
weight, or LoRA adapters on a frozen base: fresh ones, put on the policy here, or those it was loaded
with, continued), the base the adapters' checkpoints name and its weights' sha256, what the KL
compares against (a frozen copy of the start, or the adapters' base), the teacher of on-policy
distillation and what it adds (update/distillation.py), and the stages a step takes. A policy that
AdamW cannot train (float16), or one built against the run's gradient_checkpointing, is refused here.
The trainer runs the plan, its checkpoints record it and a resume holds a checkpoint against it
(resume.py); it knows what to build, not how a step runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .. import distributed
from ..config import GRPOConfig, TrainConfig
from ..model import Adapters, adapters_of, add_adapters, check_rank, set_dropout, weights_sha256
from ..rollout import check_prompts
from ..step_rewards import step_stats
from ..tools import ToolRunner, tool_stats
from ..update import BaseLogprobs, TokenLogprobs, distillation_for, estimator_for, frozen_copy
from .metrics import reward_stats
from .teacher import load_teacher


@dataclass(frozen=True)
class TrainingPlan:
    """What a run trains, against what, and the stages each step takes; `plan_training` decides it."""

    adapters: Adapters | None  # the LoRA adapters trained (the rest frozen), or None: every weight
    base_path: str  # the base that an adapted policy's checkpoints name (its files, or model_path), or ""
    base_sha256: str | None  # the sha256 of that base's weights; None trained whole or from memory
    reference: torch.nn.Module | None  # a frozen copy of the starting policy, when the KL needs one
    reference_logprobs: TokenLogprobs | None  # the KL's reference log-probs (beta > 0), or None
    teacher: torch.nn.Module | None  # on-policy distillation's frozen teacher (never saved), or None
    teacher_sha256: str | None  # the sha256 of the teacher's weights as loaded; None without a teacher
    distillation: object  # what the teacher adds to stages 3 and 4 (update/distillation.py), or nothing
    tool_runner: Callable  # a fresh ToolRunner per sampling call (its rows' requests), or no tools at all
    sampling_rounds: int  # rounds of stages 1-2 a step may take (dynamic sampling's max_sampling_rounds)
    drops_flat_groups: bool  # drop groups with no signal (dynamic_sampling or drop_zero_variance_groups)
    step_rewards: str  # stage 2's step rewards: "none", "checked" (the checker's) or "monte_carlo"
    outcome_advantages: Callable  # stage 3's advantage per completion (update/estimators.py)
    token_advantages: str  # stage 3's per token: "outcome", "process", "outcome+process", "kl_shaped_returns"
    rollout_stats: tuple[Callable, ...]  # stage 5's stats over the sampled rollouts


def plan_training(
    model,
    tokenizer,
    grpo: GRPOConfig,
    config: TrainConfig,
    *,
    start,
    model_path: str,
    dist: distributed.Dist,
    prompt_ids: list[list[int]],
    sources: list[str] | None,
) -> TrainingPlan:
    """The run's plan for `model` (LoRA adapters put on it when the run trains fresh ones), `start` being
    the model the run started from (the policy itself, or a copy of it loaded apart on a resume) and
    `model_path` where it was loaded from; the teacher, if any, is loaded here and checked against the
    task's prompts (`prompt_ids`, named by `sources` in an error)."""
    _refuse_untrainable(model, config)
    start_adapted = adapters_of(start) is not None  # before this run puts any on
    came_adapted = adapters_of(model) is not None
    loaded_from = model.name_or_path  # the files of the model (of the base, under adapters), or ""
    adapters = _adapters(model, config, dist)
    base_path = loaded_from
    if came_adapted and not loaded_from:  # adapters on a model from memory: checkpoints name model_path
        base_path = model_path
    base_sha256 = weights_sha256(loaded_from) if adapters is not None and loaded_from else None
    reference = None
    reference_logprobs = None
    if grpo.beta > 0:
        reference, reference_logprobs = _reference(model, start, adapters, start_adapted)
    teacher = None
    teacher_sha256 = None
    if grpo.teacher_model:
        teacher, teacher_sha256 = _teacher(grpo, config, model, tokenizer, prompt_ids, sources)
    return TrainingPlan(
        adapters=adapters,
        base_path=base_path,
        base_sha256=base_sha256,
        reference=reference,
        reference_logprobs=reference_logprobs,
        teacher=teacher,
        teacher_sha256=teacher_sha256,
        distillation=distillation_for(grpo, teacher),
        tool_runner=_tool_runner(grpo, tokenizer),
        sampling_rounds=grpo.max_sampling_rounds if grpo.dynamic_sampling else 1,
        drops_flat_groups=grpo.dynamic_sampling or grpo.drop_zero_variance_groups,
        step_rewards=_step_rewards(grpo),
        outcome_advantages=estimator_for(grpo),
        token_advantages="kl_shaped_returns" if grpo.kl_in_reward else grpo.advantage_type,
        rollout_stats=_rollout_stats(grpo),
    )


def _refuse_untrainable(model, config: TrainConfig) -> None:
    """A policy in float16, where AdamW's eps (1e-8) is 0 and a step divides by zero; one built to
    recompute its blocks in backward, or not, against config.gradient_checkpointing (the model is
    built with it, load_pretrained's gradient_checkpointing: the trainer does not switch it)."""
    if model.dtype == torch.float16:
        raise ValueError(
            "the policy's weights are float16, which AdamW cannot train (its eps of 1e-8 "
            "rounds to 0 and the first step turns most weights into NaN or inf); use "
            "bfloat16 or float32"
        )
    if model.gradient_checkpointing != config.gradient_checkpointing:
        raise ValueError(
            f"gradient_checkpointing is {config.gradient_checkpointing}, but the policy was built with "
            f"gradient_checkpointing={model.gradient_checkpointing}: load it with load_pretrained(..., "
            f"gradient_checkpointing={config.gradient_checkpointing}), as build_run does"
        )


def _adapters(model, config: TrainConfig, dist: distributed.Dist) -> Adapters | None:
    """The LoRA adapters this run trains: fresh ones (lora_rank > 0, A drawn from the seed), or those
    the model was loaded with (a PEFT adapter directory, a LoRA run's checkpoint), continued; None
    for full fine-tuning. Chosen once: every stage then sees a model with or without adapters."""
    wanted = None
    if config.lora_rank:
        wanted = Adapters(
            rank=config.lora_rank,
            alpha=config.lora_alpha,
            targets=config.lora_targets,
            dropout=config.lora_dropout,
            rslora=config.use_rslora,
        )
    loaded = adapters_of(model)
    if loaded is not None and wanted is not None and replace(loaded, dropout=wanted.dropout) != wanted:
        raise ValueError(
            f"the model already has LoRA adapters (r={loaded.rank}, alpha={loaded.alpha}, targets "
            f"{','.join(loaded.targets)}), which lora_rank={wanted.rank}, lora_alpha={wanted.alpha}, "
            f"lora_target_modules={','.join(wanted.targets)} do not describe: leave the lora flags out "
            "to continue them, or start from their base"
        )
    if loaded is None and wanted is not None:
        check_rank(model, wanted, "lora_rank")  # the flag named, before any adapter is allocated
        add_adapters(model, wanted, seed=config.seed)
    elif loaded is not None:  # continued: with this run's dropout, not the file's
        set_dropout(model, config.lora_dropout)
    adapters = adapters_of(model)
    if adapters is not None and config.fsdp and dist.world_size > 1:  # loaded: lora_rank 0
        raise ValueError(
            "fsdp cannot be combined with LoRA (the model was loaded with adapters): run it under "
            "torchrun without --fsdp (DDP)"
        )
    return adapters


def _reference(model, start, adapters: Adapters | None, start_adapted: bool):
    """(frozen copy or None, the KL's reference log-probs module): those of `start`, the model the run
    started from. Trained whole, or adapters loaded from a directory at the start: a frozen copy of it
    (adapters and all; TRL keeps those as a second, frozen adapter). Fresh adapters on a base (B = 0:
    the model is its base): the policy with its adapters off, no copy at all."""
    if adapters is not None and not start_adapted:
        return None, BaseLogprobs(model)
    reference = frozen_copy(start)
    return reference, TokenLogprobs(reference)


def _teacher(grpo: GRPOConfig, config: TrainConfig, model, tokenizer, prompt_ids, sources):
    """(teacher, sha256 of its weights), loaded and checked against the policy (run/teacher.py), its
    context checked for the task's prompts. Under torchrun every rank holds the whole teacher, as it
    holds the whole batch after stage 2 (see Updater.teacher_outputs)."""
    teacher, sha256 = load_teacher(grpo, config, model, tokenizer)
    check_prompts(
        prompt_ids,
        grpo.sampling_config(),
        teacher.config.vocab_size,
        teacher.config.max_position_embeddings,
        f"task's prompts for the teacher {grpo.teacher_model}",
        sources,
    )
    return teacher, sha256


def _tool_runner(grpo: GRPOConfig, tokenizer) -> Callable:
    """A fresh ToolRunner per sampling call, or a context that runs no tools. One runner is built now,
    not at the first step: it checks that the tools exist and that the tokenizer has the format's
    markers."""
    if not grpo.tool_names:
        return contextlib.nullcontext
    runner = functools.partial(ToolRunner, tokenizer, grpo.tool_format, grpo.tool_names, grpo.max_tool_calls)
    with runner():
        pass
    return runner


def _step_rewards(grpo: GRPOConfig) -> str:
    """Stage 2's step rewards: none when advantages are per completion alone."""
    if grpo.advantage_type == "outcome":
        return "none"
    return "monte_carlo" if grpo.process_rewards == "monte_carlo" else "checked"


def _rollout_stats(grpo: GRPOConfig) -> tuple[Callable, ...]:
    """Stage 5's stats over the sampled rollouts: the rewards', the steps' and the tool calls' where
    the run has them."""
    stats = [reward_stats]
    if grpo.advantage_type != "outcome":
        stats.append(step_stats)
    if grpo.tool_names:
        stats.append(functools.partial(tool_stats, names=grpo.tool_names))
    return tuple(stats)
