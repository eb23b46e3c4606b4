"""Settings of a GRPO run, one dataclass per concern, each checked before any work starts.

GRPOConfig: the rollout and the objective (TRL's names: num_generations, max_completion_length,
beta, epsilon, loss_type, scale_rewards, num_iterations, ...). TrainConfig: the optimizer, the
loop, logging and checkpoints. The model's own settings are Qwen3Config (qwen3.py); the
sampler's per-call settings, SamplingConfig (sampler.py), are built from GRPOConfig.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .advantages import SCALES
from .loss import check_objective

SCHEDULES = ("constant", "cosine")


@dataclass
class GRPOConfig:
    """What is sampled and what is optimised."""

    num_generations: int = 8  # G: completions sampled per prompt, the group advantages are relative to
    max_completion_length: int = 256  # new tokens per completion; EOS counts
    temperature: float = 1.0  # sampling temperature, also used in every log-prob pass
    top_p: float = 1.0  # nucleus sampling; 1 keeps every token
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    epsilon: float = 0.2  # clip range below 1 (and above, unless epsilon_high is set)
    epsilon_high: float | None = None  # clip range above 1 (DAPO's clip-higher uses 0.28); None = epsilon (cispo: 4.0)
    beta: float = 0.0  # weight of the k3 KL to the reference model; 0 keeps no reference model
    loss_type: str = "grpo"  # grpo | bnpo | dr_grpo | dapo | cispo (see loss.py)
    importance_sampling_level: str = "token"  # token | sequence (GSPO: one length-normalised ratio per completion)
    sampler_correction: str = "none"  # none | token_truncate | token_mask | sequence_truncate | sequence_mask (see loss.py)
    sampler_correction_cap: float = 3.0  # C of sampler_correction: weights truncated at C, or masked outside [1/C, C]
    scale_rewards: str = "group"  # group | batch | none (Dr. GRPO): what the centred reward is divided by
    num_iterations: int = 1  # mu: passes over each batch of rollouts; 1 is on-policy (ratio exactly 1)
    mask_truncated_completions: bool = False  # completions cut at max_completion_length get no loss (DAPO)
    dynamic_sampling: bool = False  # DAPO: sample more until the batch holds its groups with non-zero variance
    max_sampling_rounds: int = 4  # dynamic sampling gives up after this many sampling calls per step
    drop_zero_variance_groups: bool = False  # leave groups with equal rewards out of the update (no signal)
    overlong_buffer: int = 0  # DAPO's soft overlong penalty: the last this-many tokens before the limit ...
    overlong_penalty: float = 1.0  # ... cost up to this much reward, linearly; 0 tokens = off

    def __post_init__(self):
        if not isinstance(self.num_generations, int) or self.num_generations < 2:
            raise ValueError(f"num_generations must be an integer >= 2 (GRPO compares completions of a prompt), got {self.num_generations!r}")
        if not isinstance(self.max_completion_length, int) or self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be a positive integer, got {self.max_completion_length!r}")
        check_objective(self.loss_type, self.epsilon, self.epsilon_high, self.beta, self.importance_sampling_level,
                        self.sampler_correction, self.sampler_correction_cap)
        if self.scale_rewards not in SCALES:
            raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {self.scale_rewards!r}")
        if not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError(f"num_iterations must be a positive integer, got {self.num_iterations!r}")
        if self.max_sampling_rounds < 1:
            raise ValueError(f"max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}")
        if not 0 <= self.overlong_buffer < self.max_completion_length:
            raise ValueError(f"overlong_buffer must be in [0, max_completion_length), got {self.overlong_buffer}")
        if not self.temperature >= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {self.temperature}, {self.top_p}, {self.top_k}")


@dataclass
class TrainConfig:
    """How the policy is optimised, and where the run writes."""

    output_dir: str = "runs/grpo"  # metrics.jsonl and checkpoints/step-N go here
    max_steps: int = 100  # GRPO steps of the run; the learning-rate schedule spans them
    stop_at_step: int = 0  # end this process after this step, with a checkpoint (time-boxed jobs); 0 = max_steps
    batch_size: int = 64  # completions per step: prompts per step = batch_size / num_generations
    micro_batch_size: int = 8  # completions per forward/backward; gradients accumulate over a step
    micro_batch_tokens: int = 0  # if > 0: micro-batches of similar-length completions, each at most this many padded tokens (and micro_batch_size rows)
    shared_prompt: bool = True  # update: run each prompt once for its G completions (micro-batches then hold whole groups)
    learning_rate: float = 1e-6  # AdamW peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    adam_epsilon: float = 1e-8  # AdamW epsilon, added to the root of the second moment
    warmup_steps: int = 0  # linear warm-up from 0 to learning_rate over this many steps
    lr_schedule: str = "constant"  # after warm-up: constant | cosine (to 0 at max_steps)
    max_grad_norm: float = 1.0  # clip the gradient's global norm; 0 = no clipping
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% more time
    bf16: bool = True  # on GPU, run forward passes under bfloat16 autocast (CPU always fp32)
    fsdp: bool = False  # under torchrun: shard policy (and reference) over the ranks with FSDP2, not DDP copies (1 process: no effect)
    seed: int = 0  # sampling, data order and micro-batch shuffles all derive from this
    save_every: int = 0  # write a checkpoint every this many steps (0: only at the end)
    save_total_limit: int = 2  # checkpoints kept (the oldest are deleted)
    resume: bool = False  # continue from the latest checkpoint in output_dir
    log_completions_every: int = 10  # print a few sampled completions every this many steps (0: never)
    progress_bar: bool = True  # a tqdm bar over steps

    def __post_init__(self):
        self.adam_betas = tuple(self.adam_betas)
        for name in ("max_steps", "batch_size", "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.micro_batch_tokens, int) or self.micro_batch_tokens < 0:
            raise ValueError(f"micro_batch_tokens must be an integer >= 0 (0: micro_batch_size rows), got {self.micro_batch_tokens!r}")
        if not self.adam_epsilon > 0:
            raise ValueError(f"adam_epsilon must be > 0, got {self.adam_epsilon}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(SCHEDULES)}, got {self.lr_schedule!r}")
        if self.warmup_steps < 0 or self.stop_at_step < 0 or self.save_every < 0 or self.save_total_limit < 1 or self.max_grad_norm < 0:
            raise ValueError("warmup_steps, stop_at_step, save_every and max_grad_norm must be >= 0, save_total_limit >= 1")

    def check_against(self, grpo: GRPOConfig, world_size: int = 1) -> None:
        """Invariants across the two configs, and the processes of the run (each takes whole groups)."""
        G = grpo.num_generations
        if self.batch_size % G:
            raise ValueError(
                f"batch_size={self.batch_size} completions do not split into groups of num_generations={G}; "
                f"use a multiple of {G}"
            )
        if (self.batch_size // G) % world_size:
            raise ValueError(
                f"batch_size={self.batch_size} completions are {self.batch_size // G} prompts per step, which do not "
                f"split evenly across {world_size} processes; use a batch_size that is a multiple of {G * world_size}"
            )


def as_dict(*configs) -> dict:
    return {type(c).__name__: asdict(c) for c in configs}
