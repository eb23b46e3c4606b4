r"""The objectives compared: named variants x seeds of the default job on one budget, then one table and page.

    python examples/compare_objectives.py --quick                  # the default list, seeds 0-2, <= 30 min
    python examples/compare_objectives.py                          # the full budget: 600 steps, unattended
    python examples/compare_objectives.py --only grpo,dr_grpo,dapo,rloo,reinforce --seeds 0,1,2
    # DAPO without and with dynamic sampling on Countdown, as arXiv 2512.07611 ran it:
    python examples/compare_objectives.py --only dapo_overlong,dapo \
        --flags "--model models/minigrpo-tiny-countdown"
    python examples/compare_objectives.py --variant mine="--beta 0.01 --loss_type dapo" --only grpo,mine

Each run is `python examples/train_math.py --output_dir OUT/<variant>/seed-<s> --seed s` with the budget's
flags, --flags, then the variant's own, in a process of its own (--jobs at once, each with --threads torch
threads); then examples/eval_math.py checks its final checkpoint, and the start model once, greedy on
problems of a seed no run sees. Every variant's flags are checked by train_math.py's own parser and configs
before any run. Run again into the same --output with the same plan, it resumes: finished runs are kept,
an interrupted one goes on from its checkpoint, nothing runs twice; another plan there is refused. OUT gets
table.md, results.json, curves.png (with matplotlib) and report.html. The stages are minigrpo/compare/.
"""

import argparse
import os
import shlex
import sys

import train_math  # the trainer's own parser checks every variant's flags

from minigrpo import GRPOConfig, TrainConfig
from minigrpo.compare import (
    DEFAULT_VARIANTS,
    Budget,
    Comparison,
    Plan,
    baseline_of,
    check_variants,
    choose,
    claim,
    parse_variant,
    read_variants_file,
    results,
    write_report,
    write_results,
)
from minigrpo.flags import OneLineErrors, from_args

# The full budget is the default run's; the quick one finishes the default list x 3 seeds within 30
# minutes on 2 cores (benchmarks/README.md has the run). --steps, --eval_every,
# --eval_count and --check_count override either.
FULL = dict(steps=600, eval_every=50, eval_count=200, check_count=500)
QUICK = dict(steps=50, eval_every=10, eval_count=200, check_count=200)


def parse_args() -> argparse.Namespace:
    parser = OneLineErrors(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--output", default="runs/compare_objectives", help="one folder per variant and seed under it")
    add("--only", help="comma-separated variant names (default: the default list, then --variant's)")
    add("--variant", action="append", default=[], help='NAME="--flag value ...": a variant of your own')
    add("--variants", help="JSON or YAML file of variant name -> its flags (text or a list of words)")
    add("--seeds", default="0,1,2", help="comma-separated seeds of every variant")
    add("--flags", default="", help="train_math.py flags of every run, e.g. '--num_iterations 2'")
    add("--quick", action="store_true", help=f"the quick budget {QUICK}, not the full {FULL}")
    for name in FULL:
        add(f"--{name}", type=int, help=f"overrides the budget's {name}")
    add("--jobs", type=int, default=2, help="runs at once, each in a process of its own")
    add("--threads", type=int, help="torch threads per run (default: the CPUs / --jobs, at least 1)")
    add("--list", action="store_true", help="print the default variants and their flags, and stop")
    return parser.parse_args()


def check_flags(argv: list[str]) -> None:
    """train_math.py's own checks of a run's flags: its parser (types, choices, unknown flags), its problem
    counts, and the configs' __post_init__; a ValueError says what train_math.py would."""
    try:
        args = train_math.parse_args(argv)
    except SystemExit as stop:  # the parser's one line, "<prog>: message"
        raise ValueError(str(stop.code).split(": ", 1)[-1]) from None
    from_args(GRPOConfig, args)
    from_args(TrainConfig, args)


def seeds_of(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(seed) for seed in text.split(",") if seed.strip())
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must name one or more different seeds, got {text!r}")
    return seeds


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan the flags describe, every variant checked; a ValueError says what is wrong."""
    budget = {**(QUICK if args.quick else FULL)}
    budget.update({name: getattr(args, name) for name in FULL if getattr(args, name) is not None})
    budget = Budget(**budget)
    extra = [parse_variant(text) for text in args.variant]
    if args.variants:
        extra += read_variants_file(args.variants)
    variants = choose([name for name in (args.only or "").split(",") if name.strip()], extra)
    try:
        common = tuple(shlex.split(args.flags))
    except ValueError as error:
        raise ValueError(f"--flags: {error}") from None
    check_variants(variants, common, lambda flags: check_flags([*budget.flags(), *flags]))
    return Plan(tuple(variants), seeds_of(args.seeds), budget, common)


def main() -> None:
    args = parse_args()
    if args.list:
        for variant in DEFAULT_VARIANTS:
            print(f"{variant.name:22} {variant.command_text}")
        return
    if args.jobs < 1 or (args.threads is not None and args.threads < 1):
        sys.exit("compare_objectives.py: --jobs and --threads must be positive integers")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    out = os.path.abspath(args.output)
    try:
        plan = plan_of(args)
        claim(out, plan)  # before anything runs: OUT is this plan's, new or to resume
        runs = len(plan.runs())
        print(f"{len(plan.variants)} variants x {len(plan.seeds)} seeds = {runs} runs into {out}")
        Comparison(plan, out, jobs=args.jobs, threads=threads).run()
    except (ValueError, OSError) as error:
        sys.exit(f"compare_objectives.py: {error}")
    found = results(out, plan, baseline_of(list(plan.variants)))
    write_results(out, found)
    drawn = write_report(out, found)
    print(open(os.path.join(out, "table.md"), encoding="utf-8").read())
    pictures = "curves.png, " if drawn else "(pip install matplotlib for curves.png) "
    print(f"{out}: table.md, results.json, {pictures}report.html")


if __name__ == "__main__":
    main()
