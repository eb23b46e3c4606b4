"""Before the loop: the settings of a GRPO run, one dataclass per concern, each checked once, in
__post_init__, before any work. In: values (from code, flags or a --config file). Out: checked
dataclasses. It knows settings, their ranges and the choices each offers, not what the stages do with
them: it imports no stage, and the stages import their choices from here (loss types, advantage types,
sampler corrections, tool formats, where metrics go).

SamplingConfig: how completions are drawn, the sampler's one configuration. GRPOConfig: the rollout and
the objective (TRL's names: num_generations, max_completion_length, beta, epsilon, loss_type,
scale_rewards, num_iterations, ...); it hands the sampler a SamplingConfig. TrainConfig: the optimizer,
the loop, logging and checkpoints. The model's own settings are Qwen3Config (model/qwen3.py). Each field's
default and one-line comment are also its command-line flag (flags.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import asdict, dataclass, fields

# -- the choices the settings offer; the stage named beside each implements them ----------------------
# update/loss.py and policy_losses.py
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "reinforce")
CLIPPED_SURROGATE_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")  # PPO's clipped ratio, aggregated four ways
# update/estimators.py: verl's names, and MaxRL's and the analytic pass@k's
ADVANTAGE_ESTIMATORS = (
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "grpo_passk",
    "passk",
    "maxrl",
)
COVARIANCE_CONTROLS = ("none", "clip_cov", "kl_cov")  # update/policy_losses.py (Cui et al., 2025)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")  # update/loss.py
# update/loss.py: sampler_correction's weights
SAMPLER_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SCALES = ("group", "batch", "none")  # update/advantages.py: what the centred reward is divided by
ADVANTAGE_TYPES = ("outcome", "process", "outcome+process")  # update/advantages.py
PROCESS_REWARDS = ("steps", "monte_carlo")  # step_rewards/
TOOL_FORMATS = ("calc", "qwen3")  # tools/registry.py's FORMATS
DISTILLATION_FORMS = ("token", "full")  # update/distillation.py: how the teacher's log-probs teach
REPORT_TO = ("none", "tensorboard", "wandb")  # run/metrics.py's REPORTERS
SCHEDULES = ("constant", "cosine")  # TrainConfig.learning_rate_at
SAMPLING_DTYPES = ("float32", "bfloat16", "float16")  # the sampling copy's dtype (run/trainer.py)
# model/chat_template.py: the renderer's own arguments (documents: a template variable it sets), which a run
# sets itself, so chat_template_kwargs may not name them
RENDER_ARGUMENTS = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")
# model/lora.py: the projections of a Qwen3 block an adapter can go on (PEFT's names), or all of them
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"


@dataclass
class SamplingConfig:
    """How completions are drawn; checked once, before any work."""

    max_new_tokens: int | list[int] = 256  # completion budget per sample, EOS counted; or one per prompt
    temperature: float = 1.0  # logits are divided by this; 0 means greedy
    top_p: float = 1.0  # nucleus: keep the most likely tokens up to this probability mass, in (0, 1]
    top_k: int = 0  # keep only the k most likely tokens; 0 keeps all
    num_samples: int = 1  # completions per prompt (GRPO's group size G)
    eos_token_ids: tuple[int, ...] = ()  # any of these ends a completion (and is kept in it)
    seed: int | None = None  # the same seed gives the same tokens; None draws one from torch's global RNG
    max_batch_rows: int | None = None  # rows decoding at once (bounds the KV cache); None: every row
    compile: bool | str = "auto"  # decode graphs: "auto" GPU only; True also CPU (slow to build); False eager
    check_every: int | None = None  # decode steps between host syncs; None: 1 on CPU, 8 on GPU
    compact: bool = True  # drop finished rows from the batch once they are half of it

    def __post_init__(self):
        self.eos_token_ids = tuple(int(i) for i in self.eos_token_ids)
        if isinstance(self.max_new_tokens, tuple):
            self.max_new_tokens = list(self.max_new_tokens)
        budgets = self.max_new_tokens if isinstance(self.max_new_tokens, list) else [self.max_new_tokens]
        if not budgets or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in budgets):
            raise ValueError(
                "max_new_tokens must be a positive integer, or a list of them (one per prompt), "
                f"got {self.max_new_tokens!r}"
            )
        # inf would make every token equally likely; nan fails too
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"temperature must be >= 0 and finite (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {self.num_samples!r}")
        if self.max_batch_rows is not None and (
            not isinstance(self.max_batch_rows, int) or self.max_batch_rows < 1
        ):
            raise ValueError(
                "max_batch_rows must be a positive integer (or None for no limit), "
                f"got {self.max_batch_rows!r}"
            )
        if not (isinstance(self.compile, bool) or self.compile == "auto"):
            raise ValueError(
                'compile must be "auto" (graphs on a GPU, eager on CPU), True (graphs) or False (eager), '
                f"got {self.compile!r}"
            )
        if self.check_every is not None and self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")

    def budgets(self, prompts: int) -> list[int]:
        """Each of `prompts` prompts' max_new_tokens."""
        if isinstance(self.max_new_tokens, int):
            return [self.max_new_tokens] * prompts
        return list(self.max_new_tokens)


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
    loss_type: str = "grpo"  # grpo|bnpo|dr_grpo|dapo|cispo|sapo|gmpo|dppo_tv|dppo_kl|reinforce: loss.py
    advantage_estimator: str = "grpo"  # how rewards become advantages (update/estimators.py)
    pass_k: int = 4  # k of advantage_estimator=passk (analytic pass@k advantages), <= num_generations
    clip_ratio_c: float | None = None  # dual-clip: A < 0 loses at most c|A| (verl: 3); dppo's IS cap (20)
    sapo_temperature_pos: float = 1.0  # loss_type=sapo: the gate's temperature for positive advantages
    sapo_temperature_neg: float = 1.05  # loss_type=sapo: the gate's temperature for the others
    entropy_coef: float = 0.0  # entropy bonus: the loss minus this times the mean token entropy
    use_adaptive_entropy: bool = False  # adapt entropy_coef each AdamW step (Skywork-OR1, as TRL)
    entropy_target: float = 0.2  # adaptive: the entropy (nats) below which the bonus acts and grows
    entropy_coef_delta: float = 0.005  # adaptive: the coefficient's change per AdamW step
    entropy_coef_min: float = 0.0  # adaptive: the coefficient's lower bound
    entropy_coef_max: float = 1.0  # adaptive: the coefficient's upper bound
    covariance_control: str = "none"  # none | clip_cov | kl_cov: against entropy collapse (Cui et al.)
    clip_cov_ratio: float = 0.0002  # clip_cov: share of tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # clip_cov: a candidate's covariance is above this
    clip_cov_ub: float = 5.0  # clip_cov: and below this
    kl_cov_ratio: float = 0.0002  # kl_cov: share of tokens given the |log ratio| penalty
    ppo_kl_coef: float = 0.1  # kl_cov: the penalty's weight (verl's default)
    importance_sampling_level: str = "token"  # token | sequence (GSPO: one normalised ratio per completion)
    sampler_correction: str = "none"  # weight tokens by trained-on over sampler probability (update/loss.py)
    sampler_correction_cap: float = 3.0  # C: weights truncated at C, or masked outside [1/C, C]
    scale_rewards: str = "group"  # group | batch | none (Dr. GRPO): what the centred reward is divided by
    advantage_type: str = "outcome"  # outcome | process | outcome+process (DeepSeekMath 4.1.3)
    process_rewards: str = "steps"  # step rewards: steps (arithmetic checker) | monte_carlo (Math-Shepherd)
    process_samples: int = 4  # monte_carlo: continuations sampled per step prefix (its N)
    tools: str = "none"  # tools a completion may call, comma-separated: calculator, python, ...; none: none
    tool_format: str = "calc"  # calc (<calc>2+3</calc> answered <out>5</out>) | qwen3 (<tool_call> JSON)
    max_tool_calls: int = 4  # calls per completion; one more ends it, finish reason tool_limit
    chat_template_kwargs: str = "{}"  # the chat template's keywords, JSON: {"enable_thinking": false}
    num_iterations: int = 1  # mu: passes over each batch of rollouts; 1 is on-policy (ratio exactly 1)
    mask_truncated_completions: bool = False  # completions cut at max_completion_length get no loss (DAPO)
    dynamic_sampling: bool = False  # DAPO: sample more until the batch's groups all have reward variance
    max_sampling_rounds: int = 4  # dynamic sampling gives up after this many sampling calls per step
    drop_zero_variance_groups: bool = False  # leave groups with equal rewards out of the update (no signal)
    overlong_buffer: int = 0  # DAPO's soft overlong penalty over the last this-many tokens; 0 = off
    overlong_penalty: float = 1.0  # reward lost at max_completion_length (linear over the buffer)
    # on-policy distillation (update/distillation.py): a teacher grades each token the policy samples
    teacher_model: str = ""  # the teacher's checkpoint or Hub id, as --model (TRL's name); "": no teacher
    distillation_coef: float = 1.0  # 1: distillation alone, 0: RL alone, between: a weighted sum of the two
    distillation_form: str = "token"  # token: -(log p - log p_teacher) per token | full: reverse KL over V

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
        self._check_estimator()
        self._check_loss_options()
        self._check_entropy_controls()
        _require(
            self.process_rewards in PROCESS_REWARDS,
            f"process_rewards must be one of {', '.join(PROCESS_REWARDS)}, got {self.process_rewards!r}",
        )
        _require(
            isinstance(self.process_samples, int) and self.process_samples >= 1,
            f"process_samples must be a positive integer, got {self.process_samples!r}",
        )
        check_tool_settings(self.tool_format, self.max_tool_calls)
        if isinstance(self.chat_template_kwargs, dict):  # an object, as TRL's configs give it: its JSON text
            self.chat_template_kwargs = _json_text(self.chat_template_kwargs, "chat_template_kwargs")
        self.template_kwargs  # noqa: B018 (parsed here, so that a bad object is refused before any work)
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
        self._check_distillation()

    def _check_distillation(self) -> None:
        """The teacher's settings, each read only with a teacher, and what they combine with."""
        _require(
            isinstance(self.teacher_model, str), f"teacher_model must be text, got {self.teacher_model!r}"
        )
        for name in ("distillation_coef", "distillation_form"):
            _require_read(name, self, bool(self.teacher_model), "a teacher_model")
        _require(
            0 <= self.distillation_coef <= 1,
            "distillation_coef must be in [0, 1] (1: distillation alone, 0: RL alone), got "
            f"{self.distillation_coef}",
        )
        _require(
            self.distillation_form in DISTILLATION_FORMS,
            f"distillation_form must be one of {', '.join(DISTILLATION_FORMS)}, "
            f"got {self.distillation_form!r}",
        )
        distils = bool(self.teacher_model)
        _require(
            not (distils and self.distillation_form == "token" and self.loss_type == "gmpo"),
            "distillation_form='token' gives every token its own advantage, which loss_type='gmpo' (one "
            "advantage per completion) cannot take: use distillation_form='full', or another loss_type",
        )
        _require(
            not (
                distils
                and self.distillation_coef == 1
                and (self.dynamic_sampling or self.drop_zero_variance_groups)
            ),
            "dynamic_sampling and drop_zero_variance_groups leave out groups whose rewards are all equal, "
            "but with distillation_coef=1 the rewards carry no weight and every group has the teacher's "
            "signal: use a distillation_coef below 1, or neither option",
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

    def _check_estimator(self) -> None:
        """The advantage estimator, its k, and what it combines with."""
        estimator = self.advantage_estimator
        _require(
            estimator in ADVANTAGE_ESTIMATORS,
            f"advantage_estimator must be one of {', '.join(ADVANTAGE_ESTIMATORS)}, got {estimator!r}",
        )
        _require(
            isinstance(self.pass_k, int) and not isinstance(self.pass_k, bool) and self.pass_k >= 1,
            f"pass_k must be a positive integer, got {self.pass_k!r}",
        )
        _require_read("pass_k", self, estimator == "passk", "advantage_estimator='passk'")
        _require(
            estimator != "passk" or self.pass_k <= self.num_generations,
            f"pass_k={self.pass_k} is more than num_generations={self.num_generations}: pass@k draws k of a "
            "group's completions",
        )
        _require(
            self.scale_rewards == "group" or estimator in ("grpo", "grpo_passk"),
            f"scale_rewards={self.scale_rewards!r} is read by advantage_estimator 'grpo' and 'grpo_passk' "
            "only; "
            f"{estimator!r} normalises its own way (update/estimators.py)",
        )
        _require(
            not (estimator == "grpo_passk" and self.scale_rewards == "batch"),
            "scale_rewards='batch' cannot be combined with advantage_estimator='grpo_passk': verl's pass@k "
            "divides by its group's std or by nothing (scale_rewards 'group' or 'none')",
        )
        _require(
            self.advantage_type != "process" or estimator == "grpo",
            f"advantage_estimator={estimator!r} is not read by advantage_type='process' (its advantages come "
            "from the step rewards alone): use advantage_type='outcome+process' to add its outcome advantage",
        )
        _require(
            not (estimator == "reinforce_plus_plus" and self.advantage_type != "outcome"),
            "advantage_estimator='reinforce_plus_plus' cannot be combined with advantage_type="
            f"{self.advantage_type!r}: its per-token returns are whitened over the batch, which process "
            "advantages would be added to unwhitened; use 'reinforce_plus_plus_baseline'",
        )
        _require(
            not (estimator == "maxrl" and self.overlong_buffer),
            "advantage_estimator='maxrl' divides by its group's mean reward, which overlong_buffer's "
            "negative "
            "penalties could make zero or negative: use one or the other",
        )

    def _check_loss_options(self) -> None:
        """The options of the policy terms, each where it is read (update/policy_losses.py)."""
        loss = self.loss_type
        _require(
            self.clip_ratio_c is None or self.clip_ratio_c > 1,
            "clip_ratio_c must be > 1 (dual-clip caps a negative advantage's loss at clip_ratio_c * |A|), "
            "got "
            f"{self.clip_ratio_c}",
        )
        capped = CLIPPED_SURROGATE_LOSSES + ("dppo_tv", "dppo_kl")
        _require_read("clip_ratio_c", self, loss in capped, f"loss_type {', '.join(capped)}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            _require(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
            _require_read(name, self, loss == "sapo", "loss_type='sapo'")
        sequence_losses = CLIPPED_SURROGATE_LOSSES + ("cispo", "sapo")
        _require(
            self.importance_sampling_level == "token" or loss in sequence_losses,
            f"importance_sampling_level='sequence' (GSPO) cannot be combined with loss_type={loss!r}: it "
            f"replaces the token ratio of {', '.join(sequence_losses)} (gmpo's ratio is already one per "
            "sequence; dppo and reinforce read log-probs, not a ratio)",
        )
        _require(
            not (loss == "gmpo" and (self.advantage_type != "outcome" or self.kl_in_reward)),
            "loss_type='gmpo' takes one advantage per completion (its ratio is one per completion): it "
            f"cannot be combined with advantage_type={self.advantage_type!r} or REINFORCE++'s per-token "
            "KL returns",
        )
        control = self.covariance_control
        _require(
            control in COVARIANCE_CONTROLS,
            f"covariance_control must be one of {', '.join(COVARIANCE_CONTROLS)}, got {control!r}",
        )
        _require(
            control == "none"
            or (loss in CLIPPED_SURROGATE_LOSSES and self.importance_sampling_level == "token"),
            f"covariance_control={control!r} modifies the token-level clipped surrogate of loss_type "
            f"{', '.join(CLIPPED_SURROGATE_LOSSES)}; it cannot be combined with loss_type={loss!r} and "
            f"importance_sampling_level={self.importance_sampling_level!r}",
        )
        for name in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"):
            _require_read(name, self, control == "clip_cov", "covariance_control='clip_cov'")
        for name in ("kl_cov_ratio", "ppo_kl_coef"):
            _require_read(name, self, control == "kl_cov", "covariance_control='kl_cov'")
        _require(
            0 < self.clip_cov_ratio <= 1 and 0 < self.kl_cov_ratio <= 1,
            f"clip_cov_ratio and kl_cov_ratio are shares of tokens, in (0, 1]; got {self.clip_cov_ratio} and "
            f"{self.kl_cov_ratio}",
        )
        _require(
            self.clip_cov_lb < self.clip_cov_ub,
            f"clip_cov_lb must be below clip_cov_ub, got {self.clip_cov_lb} and {self.clip_cov_ub}",
        )
        _require(self.ppo_kl_coef >= 0, f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")

    def _check_entropy_controls(self) -> None:
        """The entropy bonus and its adaptive coefficient (TRL's names and defaults). The target's upper
        bound, log V, is the trainer's to check: it knows the vocabulary."""
        _require(self.entropy_coef >= 0, f"entropy_coef must be >= 0 (a bonus), got {self.entropy_coef}")
        for name in ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max"):
            _require_read(name, self, self.use_adaptive_entropy, "use_adaptive_entropy")
        _require(
            self.entropy_target > 0,
            f"entropy_target must be in (0, log V) nats, V the vocabulary's size; got {self.entropy_target}",
        )
        _require(
            self.entropy_coef_delta > 0, f"entropy_coef_delta must be > 0, got {self.entropy_coef_delta}"
        )
        _require(
            0 <= self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max
            or not self.use_adaptive_entropy,
            "with use_adaptive_entropy, entropy_coef (its start) must lie in [entropy_coef_min, "
            f"entropy_coef_max] and the bounds be >= 0: got {self.entropy_coef} in [{self.entropy_coef_min}, "
            f"{self.entropy_coef_max}]",
        )

    @property
    def kl_in_reward(self) -> bool:
        """REINFORCE++ with beta > 0 folds the KL into its token rewards instead of the loss (verl's
        use_kl_in_reward), so its advantages need the reference log-probs."""
        return self.advantage_estimator == "reinforce_plus_plus" and self.beta > 0

    @property
    def uses_entropy_bonus(self) -> bool:
        """The loss subtracts an entropy bonus (its coefficient may be 0 for a step while adaptive)."""
        return self.entropy_coef != 0.0 or self.use_adaptive_entropy

    @property
    def template_kwargs(self) -> dict:
        """chat_template_kwargs as the keywords they are: the template's own, not the renderer's."""
        try:
            kwargs = json.loads(self.chat_template_kwargs)
        except (TypeError, ValueError):
            kwargs = None
        _require(
            isinstance(kwargs, dict),
            f"chat_template_kwargs must be a JSON object such as '{{\"enable_thinking\": false}}', "
            f"got {self.chat_template_kwargs!r}",
        )
        clashes = [name for name in RENDER_ARGUMENTS if name in kwargs]
        _require(
            not clashes,
            f"chat_template_kwargs names {', '.join(clashes)}, which the run sets itself (the renderer's "
            f"arguments: {', '.join(RENDER_ARGUMENTS)}); give only the template's keywords, such as "
            "enable_thinking",
        )
        return kwargs

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
    micro_batch_tokens: int = 0  # if > 0: similar-length completions, at most this many padded tokens a batch
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
    fsdp: bool = False  # under torchrun: shard policy (and reference) by FSDP2, not DDP; alone: no effect
    seed: int = 0  # sampling, data order and micro-batch shuffles all derive from this
    save_every: int = 0  # write a checkpoint every this many steps (0: only at the end)
    save_total_limit: int = 2  # checkpoints kept (the oldest are deleted)
    resume: bool = False  # continue from the latest checkpoint in output_dir
    log_completions_every: int = 10  # print a few sampled completions every this many steps (0: never)
    progress_bar: bool = True  # a tqdm bar over steps
    report_to: str = "none"  # also send each step's stats to tensorboard or wandb (offline), in output_dir
    # LoRA (model/lora.py): train low-rank adapters on a frozen base instead of every weight
    lora_rank: int = 0  # r of every adapter; 0 trains every weight (full fine-tuning)
    lora_alpha: float = 32.0  # an adapter adds (lora_alpha / lora_rank) B A x; raise the learning rate ~10x
    lora_dropout: float = 0.0  # dropout on each adapter's input while training
    lora_target_modules: str = ""  # projections given adapters: q_proj,v_proj,... or all-linear; "": all
    use_rslora: bool = False  # scale adapters by lora_alpha / sqrt(lora_rank) (rsLoRA) instead

    def __post_init__(self):
        self.adam_betas = tuple(self.adam_betas)
        _require_finite(self)
        self._check_lora()
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

    def _check_lora(self) -> None:
        _require(
            isinstance(self.lora_rank, int) and not isinstance(self.lora_rank, bool) and self.lora_rank >= 0,
            f"lora_rank must be an integer >= 0 (0: full fine-tuning), got {self.lora_rank!r}",
        )
        _require(self.lora_alpha > 0, f"lora_alpha must be > 0, got {self.lora_alpha}")
        _require(0 <= self.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        for name in ("lora_target_modules", "lora_alpha", "use_rslora"):
            unchanged = getattr(self, name) == _default(TrainConfig, name)
            _require(
                self.lora_rank > 0 or unchanged,
                f"{name}={getattr(self, name)!r} describes new adapters, which need a lora_rank > 0 (0 "
                "trains every weight, or continues the adapters the model was loaded with as they are)",
            )
        self.lora_targets  # noqa: B018 (parsed here, so that a bad name is refused before any work)

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """lora_target_modules as the projections' names, in LORA_TARGETS' order."""
        return parse_lora_targets(self.lora_target_modules)

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
            not (self.fsdp and self.lora_rank and world_size > 1),
            "fsdp cannot be combined with LoRA: the adapters are a small share of the memory, and the "
            "frozen base is what FSDP2 would shard; run LoRA under torchrun without --fsdp (DDP)",
        )
        _require(
            not (self.fsdp and grpo.sampling_dtype is not None),
            "sampling_dtype cannot be combined with fsdp: the sampling copy would hold the whole "
            "weights on every rank, which is what FSDP2 avoids",
        )

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of GRPO step `step` (1, 2, ...): a linear warm-up over warmup_steps, then
        constant or cosine to 0 at max_steps (one value per GRPO step, not per AdamW step)."""
        done = step - 1  # steps before this one
        warmup = self.warmup_steps
        if done < warmup:
            return self.learning_rate * (done + 1) / (warmup + 1)
        if self.lr_schedule == "constant":
            return self.learning_rate
        progress = min((done - warmup) / max(self.max_steps - warmup, 1), 1.0)
        return self.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_read(name: str, config, read: bool, reader: str) -> None:
    """A setting changed from its default where nothing reads it is refused, naming what reads it."""
    _require(
        read or getattr(config, name) == _default(type(config), name),
        f"{name}={getattr(config, name)!r} is read only with {reader}; here it would do nothing",
    )


def _json_text(value: dict, name: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as error:  # an object json cannot write, or one that contains itself
        raise ValueError(f"{name} must be a JSON object, got {value!r:.80} ({error})") from None


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


# -- the checks a stage shares with the settings: one place for each message ---------------------------
def check_objective(
    loss_type,
    epsilon,
    epsilon_high,
    beta,
    importance_sampling_level="token",
    sampler_correction="none",
    sampler_correction_cap=3.0,
) -> None:
    """The objective's settings, checked once here for grpo_loss and GRPOConfig alike."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if not epsilon > 0 or (epsilon_high is not None and not epsilon_high > 0):
        raise ValueError(f"epsilon and epsilon_high must be > 0, got {epsilon} and {epsilon_high}")
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}, "
            f"got {importance_sampling_level!r}"
        )
    if sampler_correction not in SAMPLER_CORRECTIONS:
        raise ValueError(
            f"sampler_correction must be one of {', '.join(SAMPLER_CORRECTIONS)}, got {sampler_correction!r}"
        )
    if not sampler_correction_cap > 1:
        raise ValueError(
            "sampler_correction_cap must be > 1 (weights are kept within [1/cap, cap]), "
            f"got {sampler_correction_cap}"
        )


def check_scale(scale: str) -> None:
    """The one check of scale_rewards, for group_advantages and GRPOConfig alike."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {scale!r}")


def check_advantage_type(advantage_type: str) -> None:
    """The one check of advantage_type, for GRPOConfig and the trainer alike."""
    if advantage_type not in ADVANTAGE_TYPES:
        raise ValueError(
            f"advantage_type must be one of {', '.join(ADVANTAGE_TYPES)}, got {advantage_type!r}"
        )


def parse_lora_targets(names) -> tuple[str, ...]:
    """Target modules (a comma-separated string or a list of PEFT's names, or all-linear; empty is
    all-linear) in LORA_TARGETS' order; an unknown name is refused, named."""
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    names = list(names)
    if not names or names == [ALL_LINEAR]:
        return LORA_TARGETS
    unknown = [name for name in names if name not in LORA_TARGETS]
    if unknown:
        raise ValueError(
            f"LoRA target module {unknown[0]!r} is not a projection of a Qwen3 block: use some of "
            f"{', '.join(LORA_TARGETS)}, or {ALL_LINEAR}"
        )
    return tuple(name for name in LORA_TARGETS if name in names)


def check_report_to(report_to: str) -> None:
    """Before any work: a known destination, whose package is installed."""
    if report_to not in REPORT_TO:
        raise ValueError(f"report_to must be one of {', '.join(REPORT_TO)}, got {report_to!r}")
    if report_to != "none" and importlib.util.find_spec(report_to) is None:
        raise ValueError(
            f"report_to={report_to} needs the {report_to} package: pip install {report_to} "
            f"(or pip install 'minigrpo[{report_to}]')"
        )


def check_tool_settings(tool_format: str, max_tool_calls: int) -> None:
    """The tool format and call limit; which tools exist is check_tools' to say (tools/registry.py)."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
    check_max_tool_calls(max_tool_calls)


def check_max_tool_calls(max_tool_calls: int) -> None:
    if not isinstance(max_tool_calls, int) or isinstance(max_tool_calls, bool) or max_tool_calls < 0:
        raise ValueError(f"max_tool_calls must be an integer >= 0, got {max_tool_calls!r}")
