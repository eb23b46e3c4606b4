"""The comparison's first stage: what runs. In: the default list below, or variants a user names
(`NAME="--flag value ..."` on the command line, or a JSON/YAML file of name -> flags). Out: `Variant`s, a
name and the train_math.py flags it sets, each checked before any run by a checker the caller hands in
(the trainer's own parser and configs). It knows flags as text, not which flags exist or what they do.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # a variant's name is its folder's name


@dataclass(frozen=True)
class Variant:
    name: str  # its folder under the output directory, and its row in the table
    # train_math.py flags it sets on top of the default job ("--loss_type", "dapo", ...)
    flags: tuple[str, ...]

    @property
    def command_text(self) -> str:
        return shlex.join(self.flags) or "(the default job)"


# The default list: the seeds' choices and the field's, each on top of the default job (GRPO, beta 0,
# token-level clip 0.2, one pass per batch). With one pass (num_iterations 1) the ratio is exactly 1: the
# clip, clip-higher and CISPO's cap never act; only the aggregation and the advantages differ there.
DEFAULT_VARIANTS = (
    Variant("grpo", ()),  # DeepSeekMath, arXiv 2402.03300: the baseline every row is compared with
    # Dr. GRPO, arXiv 2503.20783: no 1/|o| (a constant instead) and no std in the advantage
    Variant("dr_grpo", ("--loss_type", "dr_grpo", "--scale_rewards", "none")),
    # DAPO, arXiv 2503.14476, rung by rung: clip-higher (0.28) alone; + token-level loss; + soft overlong
    # shaping (its 4096-token buffer of 20480 scaled to this job's 32 tokens); + dynamic sampling
    Variant("dapo_clip_higher", ("--epsilon_high", "0.28")),
    Variant("dapo_token_loss", ("--epsilon_high", "0.28", "--loss_type", "dapo")),
    Variant(
        "dapo_overlong",
        ("--epsilon_high", "0.28", "--loss_type", "dapo", "--overlong_buffer", "8"),
    ),
    Variant(
        "dapo",
        ("--epsilon_high", "0.28", "--loss_type", "dapo", "--overlong_buffer", "8", "--dynamic_sampling"),
    ),
    # GSPO, Zheng et al. 2025 (arXiv 2507.18071): one length-normalised ratio per completion, its paper's clip
    Variant(
        "gspo",
        ("--importance_sampling_level", "sequence", "--epsilon", "3e-4", "--epsilon_high", "4e-4"),
    ),
    Variant("cispo", ("--loss_type", "cispo")),  # MiniMax-M1, arXiv 2506.13585: capped, detached ratio
    Variant("rloo", ("--advantage_estimator", "rloo")),  # Ahmadian et al., arXiv 2402.14740
    # REINFORCE++ with baseline, Hu 2025 (arXiv 2501.03262): group mean, then batch whitening
    Variant("reinforce_pp_baseline", ("--advantage_estimator", "reinforce_plus_plus_baseline")),
    # LitePPO, "Tricks or Traps" arXiv 2508.08221: group mean, batch std, token-level loss
    Variant("lite_ppo", ("--scale_rewards", "batch", "--loss_type", "dapo")),
    # REINFORCE with group-relative advantages (RGRA), arXiv 2603.18756: -A log p, no ratio, no clip
    Variant("reinforce", ("--loss_type", "reinforce")),
    # pass@k, analytic advantages, Chen et al. arXiv 2508.10751
    Variant("passk", ("--advantage_estimator", "passk", "--pass_k", "4")),
    Variant("grpo_kl", ("--beta", "0.04")),  # GRPO's own KL weight (DeepSeekMath) against the default 0
    # process advantages from the arithmetic checker's step rewards, DeepSeekMath 4.1.3
    Variant("process", ("--advantage_type", "process")),
    # an entropy control: Skywork-OR1's adaptive coefficient, arXiv 2505.22312, TRL's defaults
    Variant("adaptive_entropy", ("--use_adaptive_entropy", "--entropy_target", "0.2")),
)
BASELINE = "grpo"


def baseline_of(variants: list[Variant]) -> str:
    """The row every other is marked against: GRPO where the list has it, else the list's first variant."""
    names = [variant.name for variant in variants]
    return BASELINE if BASELINE in names else names[0]


def parse_variant(text: str) -> Variant:
    """`NAME="--flag value ..."` (the quotes as a shell leaves them: NAME=--flag value ...) as a Variant; a
    ValueError says what is wrong."""
    name, equals, flags = text.partition("=")
    if not equals:
        raise ValueError(f'--variant {text!r} must be NAME="--flag value ...", e.g. mine="--beta 0.01"')
    return make_variant(name.strip(), flags, f"--variant {text!r}")


def make_variant(name: str, flags, where: str) -> Variant:
    """A Variant from its name and its flags (text, or a list of words); a ValueError names `where`."""
    if not NAME.match(name):
        raise ValueError(f"{where}: the name {name!r} must be letters, digits and _.+- (it names a folder)")
    if isinstance(flags, str):
        try:
            words = shlex.split(flags)
        except ValueError as error:
            raise ValueError(f"{where}: cannot split its flags: {error}") from None
    elif isinstance(flags, list) and all(isinstance(word, str | int | float) for word in flags):
        words = [str(word) for word in flags]
    else:
        raise ValueError(f"{where}: the flags of {name!r} must be text or a list of words, got {flags!r}")
    if words and not words[0].startswith("--"):
        raise ValueError(f"{where}: the flags of {name!r} must start with a --flag, got {words[0]!r}")
    return Variant(name, tuple(words))


def read_variants_file(path: str) -> list[Variant]:
    """The variants of a JSON or YAML file: an object of name -> flags (text or a list of words)."""
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith((".yaml", ".yml")):
                import yaml  # PyYAML, only for a YAML file

                values = yaml.safe_load(f)
            else:
                values = json.load(f)
    except ImportError:
        raise ValueError(f"reading {path} needs PyYAML (pip install pyyaml), or use a JSON file") from None
    except Exception as error:  # a missing file, bad JSON or YAML
        raise ValueError(f"cannot read the variants file {path}: {' '.join(str(error).split())}") from None
    if not isinstance(values, dict) or not values:
        raise ValueError(f"{path} must hold an object of variant names to their flags")
    return [make_variant(str(name), flags, path) for name, flags in values.items()]


def choose(names: list[str], extra: list[Variant]) -> list[Variant]:
    """The variants named (from the default list and `extra`, the user's), in that order; no names: the
    default list, then `extra`. A ValueError names an unknown, repeated or twice-defined variant."""
    known = {variant.name: variant for variant in DEFAULT_VARIANTS}
    for variant in extra:
        if variant.name in known:
            raise ValueError(
                f"variant {variant.name!r} is defined twice (the default list has its own names)"
            )
        known[variant.name] = variant
    if not names:
        return list(known.values())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown variant {', '.join(unknown)}; the known ones: {', '.join(known)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"variant {', '.join(repeated)} is named twice")
    return [known[name] for name in names]


# the flags the plan sets for every run: a variant that set one would not run on the plan's budget and folders
RESERVED = ("--output_dir", "--seed", "--steps", "--max_steps", "--eval_every", "--eval_count", "--resume")
RESERVED += ("--stop_at_step", "--config")


def check_variants(
    variants: list[Variant], common: tuple[str, ...], check: Callable[[list[str]], None]
) -> None:
    """Every variant's flags, after the flags common to all, as train_math.py would take them: `check`
    raises a ValueError on flags the trainer refuses; this names the variant too."""
    for word in common:
        if word.split("=")[0] in RESERVED:
            raise ValueError(f"the flags of every run set {word.split('=')[0]}, which the plan sets itself")
    for variant in variants:
        reserved = [word.split("=")[0] for word in variant.flags if word.split("=")[0] in RESERVED]
        if reserved:
            raise ValueError(f"variant {variant.name} sets {reserved[0]}, which the plan sets for every run")
        try:
            check([*common, *variant.flags])
        except ValueError as error:
            raise ValueError(f"variant {variant.name} ({variant.command_text}): {error}") from None
