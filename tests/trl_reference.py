"""TRL 1.16's own GRPOTrainer._compute_loss, run on given tensors, for minigrpo's equality tests; and
GKDTrainer.generalized_jsd_loss, the divergence of TRL's on-policy distillation (`generalized_jsd_loss`).

Test-only: nothing under minigrpo/ imports this file. Tests take it through the `trl_reference` fixture
(conftest.py), which skips them when TRL 1.16.0 is not the installed trl.

Where the code comes from: the installed trl's trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss and
the helpers it calls: get_off_policy_mask, get_gamma_weights, get_high_entropy_mask) and trl/trainer/utils.py
(nanmin, nanmax), compiled from those files under their own names and line numbers (reference_source.py),
without importing trl (grpo_trainer.py's imports take 15 s on two cores). The defaults are GRPOConfig's,
read from trl/trainer/grpo_config.py. `self` is a stand-in with exactly what _compute_loss reads: `args`
(GRPOConfig's fields), the attributes GRPOTrainer.__init__ derives from them (set here as __init__ sets
them), a one-process accelerator, a model in train mode, and _get_per_token_logps_and_entropies handing back
the tensors given, where TRL runs the model. Left out: vLLM (use_vllm False, so no importance-sampling
correction from the sampler) and MoE router losses (aux_loss_enabled False).

What TRL computes that a comparison must match (a test names those minigrpo does not share):
- mask = completion_mask (times tool_mask when given); old_per_token_logps None is per_token_logps.detach().
- Policy term by loss_type: grpo and sapo average each sequence over its tokens (mask.sum(-1).clamp(min=1)),
  then the sequences, and divide by current_gradient_accumulation_steps; bnpo divides the masked sum by
  mask.sum().clamp(min=1), dr_grpo by B * max_completion_length (GRPOConfig's max_completion_length, not
  T), each then by the accumulation steps; dapo, cispo and vespo divide the masked sum by
  num_items_in_batch / num_processes * current_gradient_accumulation_steps / steps_per_generation, where
  num_items_in_batch counts the tokens of the whole generation batch (default here: this micro-batch's).
- grpo's clip: -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A), with r first capped at delta when delta is
  set (two-sided clip). sapo: -sigmoid(tau (r - 1)) * 4 / tau * A, tau = sapo_temperature_pos where A > 0,
  sapo_temperature_neg elsewhere (A = 0 too); no clamp of the log ratio. cispo: -sg(min(r, epsilon_high)) * A
  * log pi, capped above only, at epsilon_high itself (not 1 + epsilon_high).
- beta > 0 adds beta * (exp(ref - logp) - (ref - logp) - 1) per token, times r when use_bias_correction_kl.
- Entropy bonus, present when entropy_coef != 0 or use_adaptive_entropy: a plain token mean of the entropies
  over the micro-batch's mask (times the top_entropy_quantile mask when < 1), sum / mask.sum().clamp(min=1),
  divided by current_gradient_accumulation_steps and never by the loss type's normaliser; loss = policy
  term - coef * bonus. Its gradient flows through the entropies given.
- Static control: coef = entropy_coef. Adaptive control (use_adaptive_entropy): the coefficient applied in
  every micro-batch of a step is the one from the end of the previous optimizer step, and only when the
  previous step's entropy was <= entropy_target, else 0; the first step applies none (the last entropy
  starts at inf). At the step's last micro-batch (accelerator.sync_gradients) the step's entropy is the
  token-weighted mean over all its micro-batches, sum(H * mask) / sum(mask) (not the mean of the
  micro-batch means); if it is <= entropy_target (equal included) the coefficient becomes
  min(coef + entropy_coef_delta, entropy_coef_max), else max(coef - entropy_coef_delta, entropy_coef_min).
  The coefficient starts at entropy_coef. GRPOConfig's defaults: entropy_coef 0.0, entropy_target 0.2,
  entropy_coef_delta 0.005, entropy_coef_min 0.0, entropy_coef_max 1.0; sapo_temperature_pos 1.0, _neg 1.05.
"""

import functools
import importlib.metadata
import importlib.util
import math
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from reference_source import compile_functions, field_defaults

TRL_VERSION = "1.16.0"
TRAINER_METHODS = ["_compute_loss", "get_off_policy_mask", "get_gamma_weights", "get_high_entropy_mask"]


class TrlUnavailable(Exception):
    """trl is not installed, or another version than the one these comparisons are with: the tests skip."""


class _Accelerator:
    """accelerate's Accelerator on one process, as _compute_loss uses it: every collective is the identity."""

    num_processes = 1  # sync_gradients is set before each micro-batch

    def gather(self, tensor):
        return tensor

    def reduce(self, tensor, reduction):
        return tensor

    def pad_across_processes(self, tensor, dim, pad_index):
        return tensor


class _StandIn:
    """The `self` of GRPOTrainer._compute_loss; load() adds TRL's methods to a subclass of it."""

    def __init__(self, config_defaults, gradient_accumulation_steps, **settings):
        unknown = [key for key in settings if key not in config_defaults]
        if unknown:
            raise TypeError(f"TRL {TRL_VERSION}'s GRPOConfig has no field {', '.join(unknown)}")
        args = types.SimpleNamespace(**{**config_defaults, **settings})
        if args.steps_per_generation is None:  # GRPOConfig.__post_init__
            args.steps_per_generation = gradient_accumulation_steps
        self.args = args
        # as GRPOTrainer.__init__ derives them from args
        self.loss_type = args.loss_type
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.importance_sampling_level = args.importance_sampling_level
        self.beta = args.beta
        self.max_completion_length = args.max_completion_length
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        # left out: the sampler's importance-sampling correction (so its flag is never read)
        self.use_vllm = False
        self.aux_loss_enabled = False  # left out: MoE router losses
        self.entropy_coef = args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self._last_world_entropy = float("inf")
        self._entropy_window_stats = None
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        # what transformers' Trainer and accelerate provide
        self.model = types.SimpleNamespace(training=True)
        self.accelerator = _Accelerator()
        self.current_gradient_accumulation_steps = gradient_accumulation_steps
        self._given = None  # (per_token_logps, entropies) of the micro-batch being computed

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **_):
        per_token_logps, entropies = self._given
        return per_token_logps, entropies, None  # no MoE aux loss

    def micro_batch_loss(
        self,
        per_token_logps,
        old_per_token_logps,
        advantages,
        completion_mask,
        entropies,
        sync_gradients=True,
        ref_per_token_logps=None,
        num_items_in_batch=None,
        tool_mask=None,
    ):
        """TRL's loss of one micro-batch and the metrics it logged: (B, T) tensors, advantages (B,) or (B, T).

        sync_gradients: whether this is its optimizer step's last micro-batch (the adaptive update runs then).
        num_items_in_batch: dapo/cispo/vespo's token count of the generation batch (default: this one's).
        """
        batch_size, length = completion_mask.shape
        inputs = {  # ids only for their shapes: the stand-in's forward hands back the tensors given
            "prompt_ids": torch.zeros((batch_size, 0), dtype=torch.long),
            "prompt_mask": torch.zeros((batch_size, 0), dtype=torch.long),
            "completion_ids": torch.zeros((batch_size, length), dtype=torch.long),
            "completion_mask": completion_mask,
            "advantages": advantages,
            "old_per_token_logps": old_per_token_logps,
            "num_items_in_batch": completion_mask.sum() if num_items_in_batch is None else num_items_in_batch,
            "ref_per_token_logps": ref_per_token_logps,  # read when beta != 0
        }
        if tool_mask is not None:
            inputs["tool_mask"] = tool_mask
        self._given = (per_token_logps, entropies)
        self.accelerator.sync_gradients = sync_gradients
        self._metrics["train"].clear()
        loss = self._compute_loss(None, inputs)
        return loss, {key: values[-1] for key, values in self._metrics["train"].items()}


def _trl_folder():
    spec = importlib.util.find_spec("trl")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise TrlUnavailable("trl is not installed")
    installed = importlib.metadata.version("trl")
    if installed != TRL_VERSION:
        raise TrlUnavailable(f"trl {installed} is installed")
    return Path(spec.submodule_search_locations[0])


@functools.cache
def load():
    """TRL's code, compiled once per process: the stand-in trainer class and GRPOConfig's defaults."""
    folder = _trl_folder()
    utils_file = folder / "trainer" / "utils.py"
    helpers = compile_functions(
        utils_file.read_text(), str(utils_file), ["nanmin", "nanmax"], {"torch": torch}
    )
    trainer_file = folder / "trainer" / "grpo_trainer.py"
    namespace = {"torch": torch, "math": math, **helpers}
    methods = compile_functions(
        trainer_file.read_text(), str(trainer_file), TRAINER_METHODS, namespace, class_name="GRPOTrainer"
    )
    config_file = folder / "trainer" / "grpo_config.py"
    _, config_defaults = field_defaults(config_file.read_text(), "GRPOConfig")
    return types.SimpleNamespace(
        trainer_class=type("GRPOTrainerStandIn", (_StandIn,), methods),
        config_defaults=config_defaults,
    )


def require():
    """TRL's code, or a skip of the calling test saying why and how to get TRL 1.16.0."""
    try:
        return load()
    except TrlUnavailable as reason:
        pytest.skip(
            f"these comparisons are with TRL {TRL_VERSION}'s code ({reason}): pip install trl=={TRL_VERSION}"
        )


@functools.cache
def generalized_jsd_loss():
    """TRL's GKDTrainer.generalized_jsd_loss (trl/experimental/gkd/gkd_trainer.py), compiled from its file
    without importing trl: the divergence TRL's GKD and DistillationTrainer minimise, beta = 1 its
    reverse KL. (student_logits, teacher_logits, labels, beta, temperature, reduction) -> the loss."""
    gkd_file = _trl_folder() / "experimental" / "gkd" / "gkd_trainer.py"
    namespace = {"torch": torch, "F": torch.nn.functional}
    compiled = compile_functions(
        gkd_file.read_text(), str(gkd_file), ["generalized_jsd_loss"], namespace, class_name="GKDTrainer"
    )
    return compiled["generalized_jsd_loss"].__func__  # defined under @staticmethod


def trainer(gradient_accumulation_steps=1, **settings):
    """A stand-in GRPOTrainer at GRPOConfig's defaults with `settings` (GRPOConfig fields, by name)."""
    trl = load()
    return trl.trainer_class(trl.config_defaults, gradient_accumulation_steps, **settings)


def loss(
    loss_type,
    per_token_logps,
    old_per_token_logps,
    advantages,
    completion_mask,
    entropies,
    ref_per_token_logps=None,
    num_items_in_batch=None,
    tool_mask=None,
    **settings,
):
    """TRL's loss of one micro-batch that is a whole optimizer step: (loss, metrics), the loss with its graph
    to per_token_logps (and to entropies when they carry one). (B, T) tensors, advantages (B,) or (B, T);
    settings: GRPOConfig fields (epsilon, epsilon_high, delta, beta, sapo_temperature_pos, ...)."""
    stand_in = trainer(loss_type=loss_type, **settings)
    return stand_in.micro_batch_loss(
        per_token_logps,
        old_per_token_logps,
        advantages,
        completion_mask,
        entropies,
        ref_per_token_logps=ref_per_token_logps,
        num_items_in_batch=num_items_in_batch,
        tool_mask=tool_mask,
    )


class AdaptiveEntropy:
    """TRL's adaptive entropy coefficient, driven over optimizer steps of several micro-batches each.

    Each step's micro-batches go through one stand-in trainer in turn, sync_gradients True on the last, so
    TRL's controller sees what it sees in training. A micro-batch is a dict of micro_batch_loss's arguments,
    or a function returning one, called when its turn comes: then its tensors can come from parameters the
    optimizer has just stepped. With an optimizer, each micro-batch's loss is backpropagated and the
    optimizer steps (and zeroes its gradients) after the step's last micro-batch.
    """

    def __init__(self, gradient_accumulation_steps, **settings):
        self.trainer = trainer(gradient_accumulation_steps, use_adaptive_entropy=True, **settings)

    @property
    def entropy_coef(self):
        return self.trainer.entropy_coef

    @property
    def last_step_entropy(self):
        return self.trainer._last_world_entropy

    def step(self, micro_batches, optimizer=None):
        """One optimizer step; returns the micro-batches' losses in order."""
        steps = self.trainer.current_gradient_accumulation_steps
        if len(micro_batches) != steps:
            raise ValueError(f"{len(micro_batches)} micro-batches for gradient_accumulation_steps={steps}")
        losses = []
        for index, micro_batch in enumerate(micro_batches):
            tensors = micro_batch() if callable(micro_batch) else micro_batch
            micro_loss, _ = self.trainer.micro_batch_loss(**tensors, sync_gradients=index == steps - 1)
            if optimizer is not None:
                micro_loss.backward()
            losses.append(micro_loss)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
        return losses

    def run(self, steps, optimizer=None):
        """Runs the steps (lists of micro-batches): the coefficient after each, and each one's losses."""
        coefficients, losses = [], []
        for micro_batches in steps:
            losses.append(self.step(micro_batches, optimizer))
            coefficients.append(self.entropy_coef)
        return coefficients, losses
