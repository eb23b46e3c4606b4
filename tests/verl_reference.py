"""verl 0.9.1's own advantage estimators and policy losses, run from its wheel, for minigrpo's equality tests.

Test-only: nothing under minigrpo/ imports this file. Tests take it through the `verl_reference` fixture
(conftest.py), which skips them when the wheel cannot be had.

Where the code comes from: these files of verl-0.9.1-py3-none-any.whl run as they are, read from the zip
(WHEEL_SHA256 pins the file); verl is not installed and none of its code is copied into this repository.
- verl/trainer/ppo/core_algos.py, whole: the registered estimators and policy losses, agg_loss;
- verl/utils/torch_functional.py, whole: masked_sum, masked_mean, masked_var, masked_whiten;
- verl/utils/groupwise.py and verl/utils/import_utils.py, whole: as_torch_index, group_mean_std, deprecated;
- compute_advantage and apply_kl_penalty of verl/trainer/ppo/ray_trainer.py, those two functions alone (the
  file imports ray): the dispatch that hands each estimator its arguments, and the KL folded into the token
  rewards under algorithm.use_kl_in_reward.

How the wheel is found: $MINIGRPO_VERL_WHEEL if set; else verl-0.9.1-py3-none-any.whl in the per-user cache
($XDG_CACHE_HOME or ~/.cache, then minigrpo/tests/); else `python -m pip download verl==0.9.1 --no-deps
--only-binary=:all:` fetches it into that cache. When neither the cache nor pip has it the tests skip with
a one-line reason saying how to get it; a variable naming no file, or a file that is not 0.9.1's wheel
(another sha256), stops them with an error instead: a wheel asked for by name is never silently skipped.

What is stubbed, and only while those files execute (sys.modules is put back as it was afterwards: no fake
verl, omegaconf, tensordict or transformers stays behind): omegaconf.DictConfig, tensordict.TensorDict and
transformers.PreTrainedTokenizer as empty classes (type annotations only); flash_attn and torch_npu as
absent, so verl takes its path for a machine without them; verl.utils.device as "cpu";
verl.trainer.config.AlgoConfig and verl.workers.config.ActorConfig (with its PolicyLossConfig) as the small
classes below. Their defaults are read from verl's own dataclasses in the wheel (verl/workers/config/actor.py,
verl/trainer/config/algorithm.py: clip_ratio 0.2, clip_ratio_c 3.0, tau_pos 1.0, tau_neg 1.05, ...), and
their get() is verl's BaseConfig.get: the default given to get() applies only to a key the config lacks.

What verl does that a comparison must match (a test names those minigrpo does not share):
- An outcome reward sits on its completion's last valid token (mask.sum(-1) - 1, as verl's reward managers
  write it); every estimator sums the token rewards back. The group of a completion is its uid string.
- grpo: (r - mean) / (std + 1e-6), torch.std unbiased; a group of one gets mean 0 and std 1; verl's
  compute_advantage passes norm_adv_by_std_in_grpo to it directly (False: r - mean).
- rloo: r * G / (G - 1) - mean * G / (G - 1); a group of one keeps r. gpg: B / count_nonzero(r over the
  batch) * (r - group mean). opo: baseline = the group's length-weighted mean reward.
- grpo_passk: only the group's best gets r_max - r_second (/ (std + 1e-6) under norm_adv_by_std_in_grpo,
  read through config.get); a group of one raises ValueError.
- reinforce_plus_plus_baseline: r - group mean, spread over the valid tokens, then masked_whiten over the
  whole batch: (x - mean) * rsqrt(var + 1e-8), var unbiased (Bessel) over valid tokens, then times the mask.
- reinforce_plus_plus: discounted returns (gamma) through valid tokens (a masked token carries the running
  return), then masked_whiten over the batch. The KL enters only through the token rewards (kl_in_reward).
- Policy losses get the mask as bool (verl's ppo_loss does .to(bool)). The log ratio is clamped to
  [-20, 20] in vanilla, dppo_tv, dppo_kl, sapo and cispo, not in clip_cov, kl_cov or geo_mean; gspo clamps
  its sequence log ratio above at 10.
- vanilla: where A < 0 the loss is min(max(-A r, -A clip(r)), -A clip_ratio_c) (dual clip); clip_ratio_c
  must exceed 1 (assert). dppo_tv and dppo_kl: -A * sg(min(r, clip_ratio_c)) * log pi * valid; their
  config.get("clip_ratio_c", 20.0) meets ActorConfig's field (3.0): 20.0 applies only to a config without
  the key (pass clip_ratio_c=ABSENT).
- sapo: seq-mean-token-mean whatever loss_agg_mode says; tau_pos where A > 0, tau_neg elsewhere (A = 0
  too); gate sigmoid(tau (r - 1)) * 4 / tau.
- geo_mean ignores loss_agg_mode: a plain mean over sequences, with +1e-8 in its per-sequence means.
- cispo: -sg(clip(r, 1 - low, 1 + high)) * A * log pi, clipped on both sides.
- clip_cov: the candidates are valid, unclipped tokens with centred cov(A, log pi) in (clip_cov_lb,
  clip_cov_ub); clip_num = max(int(clip_cov_ratio * valid tokens), 1) of them, drawn with torch.randperm,
  lose their loss. kl_cov: the top max(1, int(valid tokens * kl_cov_ratio)) tokens by cov get
  -A r + ppo_kl_coef |log r| (PolicyLossConfig's default ppo_kl_coef is 0.1; the function's 1.0 is for None).
- agg_loss: token-mean divides by mask.sum() (no epsilon) unless global_batch_info gives batch_num_tokens;
  seq-mean-token-mean's per-sequence mean adds 1e-8 and fully masked rows leave the count; masked_mean
  adds 1e-8 to its denominator.

clip_cov is random: torch.randperm draws from torch's default CPU generator. A test makes it deterministic
either by settings under which every candidate is clipped (clip_num >= the candidates: the permutation then
chooses nothing), or by seeding torch (torch.manual_seed) before verl's call and before minigrpo's, with
minigrpo drawing one torch.randperm(number of candidates) on the CPU generator, candidates in row-major
order, as verl does. test_references.py shows both.
"""

import contextlib
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
from reference_source import compile_functions, field_defaults, register_source

VERL_VERSION = "0.9.1"
WHEEL_NAME = f"verl-{VERL_VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"  # PyPI's file
WHEEL_ENV = "MINIGRPO_VERL_WHEEL"

# the packages stubbed (or kept absent) while verl's files run; names under them that appear meanwhile go too
STUBBED_PACKAGES = ("verl", "omegaconf", "tensordict", "transformers", "flash_attn", "torch_npu")

# a setting given this value is left out of the config, so the default verl's get() call names applies
ABSENT = object()


class WheelUnavailable(Exception):
    """The wheel is neither given, nor cached, nor downloadable here: the tests that need it skip."""


class WrongWheel(Exception):
    """The wheel named is missing or another file: the tests stop rather than skip or use other code."""


# ---------------------------------------------------------------- the configs verl's code reads


class _Config:
    """verl's BaseConfig (verl/base_config.py) as core_algos reads it: attributes, get(key, default)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def get(self, key, default=None):
        return getattr(self, key, default)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__})"


class ActorConfig(_Config):
    """Stands for verl.workers.config.ActorConfig (gspo, sapo and cispo assert isinstance of it)."""


class PolicyLossConfig(_Config):
    """Stands for verl.workers.config.PolicyLossConfig, the actor config's `policy_loss`."""


class AlgoConfig(_Config):
    """Stands for verl.trainer.config.AlgoConfig (the policy losses assert they are not given one)."""


class DataProto:
    """The two fields of verl's DataProto that compute_advantage and apply_kl_penalty use."""

    def __init__(self, batch, non_tensor_batch):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch


class _Batch(dict):
    """A TensorDict's face as those two functions see it: keys, items, get, and batch_size."""

    @property
    def batch_size(self):
        return next(iter(self.values())).shape[:1]


# ---------------------------------------------------------------- finding the wheel


def cache_dir():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minigrpo" / "tests"


def fetch_command(directory="<cache>"):
    return f"python -m pip download verl=={VERL_VERSION} --no-deps --only-binary=:all: -d {directory}"


def wheel_path():
    """verl 0.9.1's wheel: the one $MINIGRPO_VERL_WHEEL names, else the cached one, else one pip fetches."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        if not Path(given).is_file():
            raise WrongWheel(f"{WHEEL_ENV}={given} is not a file")
        return _checked(Path(given))
    cached = cache_dir() / WHEEL_NAME
    if not cached.is_file():
        _download(cached)
    return _checked(cached)


def _checked(path):
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise WrongWheel(
            f"{path} is not verl {VERL_VERSION}'s wheel: sha256 {digest}, expected {WHEEL_SHA256}"
        )
    return path


def _download(target):
    """pip downloads into a folder beside `target`; the checked wheel then takes its name in one rename."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as folder:
            command = fetch_command(folder).split()
            command[0] = sys.executable
            command += ["--retries", "1", "--timeout", "15", "--disable-pip-version-check", "--quiet"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            fetched = Path(folder) / WHEEL_NAME
            if done.returncode != 0 or not fetched.is_file():
                last_line = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
                raise WheelUnavailable(f"pip download failed: {last_line}")
            os.replace(_checked(fetched), target)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise WheelUnavailable(f"fetching it into {target.parent} failed: {error}") from error


# ---------------------------------------------------------------- running verl's files


@contextlib.contextmanager
def _modules_swapped(modules):
    """sys.modules holds `modules` inside the block (None: that import fails) and its own entries after it."""
    before = set(sys.modules)
    saved = {name: sys.modules[name] for name in modules if name in sys.modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name.split(".")[0] in STUBBED_PACKAGES:
                del sys.modules[name]
        for name in modules:
            if name in saved:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)


def _module(name, **attributes):
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _stub_modules():
    """The stand-ins for verl's heavy imports, by full module name (which is how imports find them)."""
    stubs = {
        "omegaconf": _module("omegaconf", DictConfig=type("DictConfig", (), {})),
        "tensordict": _module("tensordict", TensorDict=type("TensorDict", (), {})),
        "transformers": _module("transformers", PreTrainedTokenizer=type("PreTrainedTokenizer", (), {})),
        "flash_attn": None,
        "torch_npu": None,
        "verl.utils.device": _module(
            "verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu
        ),
        "verl.trainer.config": _module("verl.trainer.config", AlgoConfig=AlgoConfig),
        "verl.workers.config": _module(
            "verl.workers.config", ActorConfig=ActorConfig, PolicyLossConfig=PolicyLossConfig
        ),
    }
    for package in ("verl", "verl.trainer", "verl.trainer.ppo", "verl.utils", "verl.workers"):
        stubs[package] = _module(package)
    return stubs


def _run_file(wheel, sources, path):
    """Runs the wheel's file `path` as the module it is in verl, in sys.modules for the files after it."""
    name = path.removesuffix(".py").replace("/", ".")
    filename = f"{wheel}/{path}"
    register_source(filename, sources[path])
    module = _module(name, __file__=filename)
    sys.modules[name] = module
    exec(compile(sources[path], filename, "exec"), module.__dict__)
    return module


VERL_FILES = (
    "verl/utils/import_utils.py",
    "verl/utils/groupwise.py",
    "verl/utils/torch_functional.py",
    "verl/trainer/ppo/core_algos.py",
    "verl/trainer/ppo/ray_trainer.py",
    "verl/workers/config/actor.py",
    "verl/trainer/config/algorithm.py",
)


@functools.cache
def load():
    """verl's code, run once per process: the modules, the two ray_trainer functions, the configs' fields."""
    wheel = wheel_path()
    with zipfile.ZipFile(wheel) as archive:
        sources = {path: archive.read(path).decode() for path in VERL_FILES}
    modules = _stub_modules()
    with _modules_swapped(modules):  # each file after the ones it imports
        _run_file(wheel, sources, "verl/utils/import_utils.py")
        groupwise = _run_file(wheel, sources, "verl/utils/groupwise.py")
        modules["verl.utils"].as_torch_index = groupwise.as_torch_index
        modules["verl.utils"].group_mean_std = groupwise.group_mean_std
        torch_functional = _run_file(wheel, sources, "verl/utils/torch_functional.py")
        core_algos = _run_file(wheel, sources, "verl/trainer/ppo/core_algos.py")
    namespace = {
        "DataProto": DataProto,
        "AdvantageEstimator": core_algos.AdvantageEstimator,
        "AlgoConfig": AlgoConfig,
        "Optional": Optional,
        "core_algos": core_algos,
        "masked_mean": torch_functional.masked_mean,
        "torch": torch,
    }
    ray_trainer = f"{wheel}/verl/trainer/ppo/ray_trainer.py"
    register_source(ray_trainer, sources["verl/trainer/ppo/ray_trainer.py"])
    trainer_functions = compile_functions(
        sources["verl/trainer/ppo/ray_trainer.py"],
        ray_trainer,
        ["compute_advantage", "apply_kl_penalty"],
        namespace,
    )
    actor_fields, actor_defaults = field_defaults(sources["verl/workers/config/actor.py"], "ActorConfig")
    policy_fields, policy_defaults = field_defaults(
        sources["verl/workers/config/actor.py"], "PolicyLossConfig"
    )
    algo_fields, algo_defaults = field_defaults(sources["verl/trainer/config/algorithm.py"], "AlgoConfig")
    return types.SimpleNamespace(
        core_algos=core_algos,
        torch_functional=torch_functional,
        **trainer_functions,
        actor_fields=actor_fields,
        actor_defaults=actor_defaults,
        policy_loss_fields=policy_fields,
        policy_loss_defaults=policy_defaults,
        algo_fields=algo_fields,
        algo_defaults=algo_defaults,
    )


def require():
    """verl's code, or a skip of the calling test saying why and how to get the wheel."""
    try:
        return load()
    except WheelUnavailable as reason:
        pytest.skip(
            f"verl {VERL_VERSION}'s wheel is not available ({reason}): set {WHEEL_ENV} to it, "
            f"or run `{fetch_command(cache_dir())}`"
        )


# ---------------------------------------------------------------- the functions tests call


def _present(fields):
    return {key: value for key, value in fields.items() if value is not ABSENT}


def actor_config(**settings):
    """verl's actor config at its defaults, with `settings`: ActorConfig and PolicyLossConfig fields."""
    verl = load()
    policy_settings = {key: value for key, value in settings.items() if key in verl.policy_loss_fields}
    actor_settings = {key: value for key, value in settings.items() if key not in verl.policy_loss_fields}
    unknown = [key for key in actor_settings if key not in verl.actor_fields]
    if unknown:
        raise TypeError(
            f"verl {VERL_VERSION}'s ActorConfig and PolicyLossConfig have no field {', '.join(unknown)}"
        )
    policy_loss = PolicyLossConfig(**_present({**verl.policy_loss_defaults, **policy_settings}))
    fields = {**verl.actor_defaults, "policy_loss": policy_loss, "global_batch_info": {}, **actor_settings}
    return ActorConfig(**_present(fields))


def algo_config(**settings):
    """verl's algorithm config at its defaults, with `settings` (AlgoConfig fields, by name)."""
    verl = load()
    unknown = [key for key in settings if key not in verl.algo_fields]
    if unknown:
        raise TypeError(f"verl {VERL_VERSION}'s AlgoConfig has no field {', '.join(unknown)}")
    return AlgoConfig(**_present({**verl.algo_defaults, **settings}))


def token_rewards(rewards, response_mask):
    """(B, T) token rewards: (B,) outcome rewards on each completion's last valid token, as verl's reward
    managers put them (index mask.sum(-1) - 1); (B, T) rewards are token rewards already."""
    if rewards.dim() == 2:
        return rewards
    token_level = torch.zeros(response_mask.shape, dtype=rewards.dtype)  # (B, T)
    last_valid = response_mask.sum(-1).long() - 1  # (B,)
    token_level[torch.arange(len(rewards)), last_valid] = rewards
    return token_level


def uids(group_index):
    """verl's `uid` column: one string per completion, equal within a group, as an object array."""
    return np.array([str(group) for group in torch.as_tensor(group_index).tolist()], dtype=object)


def advantages(name, rewards, response_mask, group_index, reward_baselines=None, **settings):
    """verl's (advantages, returns), each (B, T), from its compute_advantage with adv_estimator `name`.

    rewards: (B,) outcome or (B, T) token rewards (token_rewards); group_index: (B,) the group of each
    completion; reward_baselines: (B,) for remax; settings: AlgoConfig fields (gamma, norm_adv_by_std_in_grpo)
    by name. The mask is a float or int tensor, as verl holds it (reinforce_plus_plus computes 1 - mask).
    """
    verl = load()
    config = algo_config(adv_estimator=name, **settings)
    batch = _Batch(token_level_rewards=token_rewards(rewards, response_mask), response_mask=response_mask)
    if reward_baselines is not None:
        batch["reward_baselines"] = reward_baselines
    data = DataProto(batch, {"uid": uids(group_index)})
    verl.compute_advantage(
        data,
        adv_estimator=name,
        gamma=config.gamma,
        lam=config.lam,
        norm_adv_by_std_in_grpo=config.get("norm_adv_by_std_in_grpo", True),
        config=config,
    )
    return data.batch["advantages"], data.batch["returns"]


def kl_in_reward(token_level_scores, response_mask, old_log_probs, ref_log_prob, kl_coef, kl_penalty=ABSENT):
    """verl's apply_kl_penalty, fixed kl_ctrl: token rewards less kl_coef * kl(old, ref) on valid tokens.

    Returns ((B, T) token rewards, metrics); kl_penalty defaults to AlgoConfig's ("kl": old - ref).
    """
    verl = load()
    kl_penalty = verl.algo_defaults["kl_penalty"] if kl_penalty is ABSENT else kl_penalty
    batch = _Batch(
        token_level_scores=token_rewards(token_level_scores, response_mask),
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        ref_log_prob=ref_log_prob,
    )
    data, metrics = verl.apply_kl_penalty(
        DataProto(batch, {}), kl_ctrl=verl.core_algos.FixedKLController(kl_coef), kl_penalty=kl_penalty
    )
    return data.batch["token_level_rewards"], metrics


def policy_loss(
    name,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode=ABSENT,
    rollout_is_weights=None,
    **settings,
):
    """verl's registered policy loss `name`: (loss, metrics), the loss with its graph to log_prob.

    All tensors (B, T); loss_agg_mode defaults to ActorConfig's ("token-mean"); settings: ActorConfig and
    PolicyLossConfig fields (clip_ratio, clip_ratio_low/high/c, tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb,
    clip_cov_ub, kl_cov_ratio, ppo_kl_coef, global_batch_info={dp_size, batch_num_tokens, global_batch_size,
    loss_scale_factor}, ...), ABSENT to leave one out.
    """
    verl = load()
    if loss_agg_mode is ABSENT:
        loss_agg_mode = verl.actor_defaults["loss_agg_mode"]
    config = actor_config(loss_mode=name, loss_agg_mode=loss_agg_mode, **settings)
    loss_fn = verl.core_algos.get_policy_loss_fn(name)
    return loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask.bool(),  # as verl's ppo_loss hands it over
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )


def agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info):
    """verl's agg_loss: (B, T) losses to a scalar (global_batch_info: dp_size, batch_num_tokens, ...)."""
    return load().core_algos.agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info)


def masked_whiten(values, mask, shift_mean=True):
    """verl's masked_whiten: (values - mean) * rsqrt(var + 1e-8), unbiased, over the mask."""
    return load().torch_functional.masked_whiten(values, mask, shift_mean=shift_mean)
