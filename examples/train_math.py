"""GRPO on math problems with verifiable answers: evaluate, train, evaluate again.

    python examples/train_math.py                      # the embedded tiny model on arithmetic, CPU, minutes
    python examples/train_math.py --model Qwen/Qwen3-0.6B --data math_train.jsonl \\
        --eval_data math500_test.jsonl --template chat --num_generations 8 --learning_rate 1e-5 \\
        --max_completion_length 512 --device cuda

With no arguments it loads models/minigrpo-tiny-arith (made by examples/pretrain_tiny.py), measures greedy
accuracy on held-out problems, runs GRPO, measures again and writes output_dir/summary.json. Besides this
script's own flags, every field of GRPOConfig and TrainConfig is a flag of its name (TRL's names where they
overlap; --help lists each with its comment), with this script's DEFAULTS below; --config takes the same names
from a JSON (or YAML) file, flags on the command line win. --report_to tensorboard|wandb also sends the
metrics there; --trace prints the first step's journey through every stage (and output_dir/trace.html). The
stages live in the library (minigrpo/, a folder per part of the loop; run/trainer.py combines them).

Unchanged under torchrun, data-parallel (DDP), or sharded with --fsdp (FSDP2); rank 0 writes:

    torchrun --nproc_per_node 8 examples/train_math.py --device cuda ...
"""

import argparse
import os
import sys
from dataclasses import dataclass

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, TrainConfig, distributed, files
from minigrpo.flags import OneLineErrors, add_fields, from_args, option_values, read_config_file
from minigrpo.model import read_task, tokenizer_directory
from minigrpo.run import (
    Run,
    Trace,
    build_run,
    evaluate_held_out,
    initial_evaluation,
    plot_curves,
    save_initial_evaluation,
)
from minigrpo.tasks import TEMPLATES, Template, load_problems, sources_of, template, to_task
from minigrpo.tools import declared_tools
from minigrpo.update import NonFiniteWeights

# The embedded default, found from this file: the default run works offline from any directory.
EMBEDDED_MODEL = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith")
)
# This script's defaults where they differ from GRPOConfig's and TrainConfig's: minutes on 2 CPU cores.
DEFAULTS = dict(
    output_dir="runs/train_math",
    max_steps=600,
    batch_size=256,
    micro_batch_size=256,
    micro_batch_tokens=4096,
    max_completion_length=32,
    learning_rate=1e-4,
    warmup_steps=10,
    lr_schedule="cosine",
    save_every=50,
    log_completions_every=50,
)


def main() -> None:
    """The run, top to bottom: build it, evaluate, train, evaluate again, summarize."""
    args = parse_args()
    check_output_dir(args.output_dir)
    built = build(args)  # the task, the trainer and the held-out problems, every setting checked
    initial = evaluate_before(args, built)  # the starting policy's held-out accuracy, kept across --resume
    train(args, built, initial)  # GRPO: sample, verify, advantages, update; metrics and checkpoints
    final = held_out(args, built)  # the same evaluation after
    summarize(args, built, initial, final)  # summary.json, curves.png and the line to compare runs by


@dataclass
class Built:
    """What `build` made of the arguments, for the stages of `main`."""

    grpo: GRPOConfig  # the run's GRPO settings
    prompt: Template  # how each question is put to the model
    rewards: list[RewardSpec]  # the task's rewards; the first is the held-out accuracy's
    eval_problems: list  # the held-out problems
    eval_source: str  # where they come from (--eval_data, else --data)
    synthetic: bool  # --data is a synthetic kind, not a file
    run: Run  # the trainer, and its resume


def build(args: argparse.Namespace) -> Built:
    """The task (problems, prompt format, rewards), the trainer, and the held-out problems' prompts
    checked against the model's context, before any work; a bad setting is one line."""
    try:
        grpo, config = from_args(GRPOConfig, args), from_args(TrainConfig, args)  # checked before any work
        # Task: problems, the prompt format and the rewards (the default model has no chat format).
        tokenizer = minigrpo.Tokenizer.from_directory(tokenizer_directory(args.model))
        prompt = template(args.template or ("chat" if tokenizer.has_chat_format else "tiny"))
        synthetic = not os.path.exists(args.data) and not args.data.startswith("hf://")
        train_problems = load_problems(
            args.data,
            "train",
            count=args.train_count if synthetic else None,
            seed=args.seed,
            difficulty=args.difficulty,
            note=rank_0_note,
        )
        eval_source = args.eval_data or args.data
        eval_problems = load_problems(
            eval_source,
            "test",
            count=args.eval_count,
            seed=0,  # the same for every run
            difficulty=args.difficulty,
            note=rank_0_note,
        )
        rewards = parse_rewards(args.rewards if args.rewards is not None else default_rewards(args.data))
        # with its own chat template, a chat prompt declares the run's tools to the model
        tools = declared_tools(tokenizer, grpo.tool_names)
        task = to_task(train_problems, prompt, rewards, tokenizer, tools, grpo.template_kwargs)
        run = build_run(args.model, task, grpo, config, device=args.device, dtype=args.dtype)
        held_out_prompts = [
            prompt.render(p.question, tokenizer, tools, **grpo.template_kwargs) for p in eval_problems
        ]
        sources = sources_of(eval_problems)  # a file's: "data.jsonl, line 7" names a prompt too long
        what = "held-out prompts" if sources else f"held-out prompts ({eval_source})"
        # tokens a prompt may have
        room = run.trainer.model.config.max_position_embeddings - grpo.max_completion_length
        held_out_ids = tokenizer.encode_all(held_out_prompts, what, args.model, room, sources)
        run.trainer.check_context(held_out_ids, what, sources)
    except (ValueError, minigrpo.CheckpointError, FileNotFoundError) as error:
        sys.exit(f"train_math.py: {error}")
    return Built(grpo, prompt, rewards, eval_problems, eval_source, synthetic, run)


def held_out(args: argparse.Namespace, built: Built) -> dict[str, float]:
    """The held-out evaluation: greedy accuracy, the steps' faithfulness where they can be checked, and
    with tools the calls per completion and the accuracy with the tools off. Under torchrun each rank
    evaluates a block of the problems."""
    grpo, trainer = built.grpo, built.run.trainer
    settings = dict(max_new_tokens=args.max_completion_length, seed=args.seed)
    tools = dict(tools=grpo.tool_names, tool_format=grpo.tool_format, max_tool_calls=grpo.max_tool_calls)
    problems, prompt, accuracy = built.eval_problems, built.prompt, built.rewards[:1]
    stats = evaluate_held_out(trainer, problems, prompt, accuracy, **settings, **tools).stats()
    if grpo.tool_names:  # how much the accuracy owes to the tools
        off = evaluate_held_out(trainer, problems, prompt, accuracy, **settings)
        stats["held_out/accuracy_tools_off"] = off.pass_at_1
    return stats


def evaluate_before(args: argparse.Namespace, built: Built) -> dict:
    """The starting policy's held-out accuracy, measured once and kept in output_dir across --resume."""
    grpo, trainer = built.grpo, built.run.trainer
    if not built.synthetic and not args.eval_data:
        trainer.dist.print(f"note: evaluating on {args.data} itself; pass --eval_data for held-out problems")
    try:  # what the accuracy is measured on must stay the same from start to end, tools included
        measured_on = {"eval_data": built.eval_source, "eval_count": len(built.eval_problems)}
        if grpo.tool_names:
            measured_on.update(
                tools=grpo.tools, tool_format=grpo.tool_format, max_tool_calls=grpo.max_tool_calls
            )
        initial = initial_evaluation(trainer, lambda: held_out(args, built), measured_on)
    except (ValueError, files.DiskFull) as error:
        sys.exit(f"train_math.py: {error}")
    trainer.dist.print(
        f"held-out greedy accuracy before GRPO: {initial['initial_accuracy']:.3f} "
        f"({len(built.eval_problems)} problems)"
    )
    if grpo.tool_names:
        trainer.dist.print(f"held-out tool use before GRPO: {tool_use(initial.get('initial_stats', {}))}")
    return initial


def train(args: argparse.Namespace, built: Built, initial: dict) -> None:
    """GRPO's steps, held-out accuracy every --eval_every of them; broken weights are never saved, and a
    full disk keeps nothing of the write it stopped."""
    trainer = built.run.trainer
    trainer.dist.print(f"objective: {trainer.describe_objective()}")
    trace = Trace(html_path=os.path.join(args.output_dir, "trace.html")) if args.trace else None

    def every_few_steps(trainer) -> dict:
        if args.eval_every and trainer.step % args.eval_every == 0:
            return held_out(args, built)
        return {}

    try:
        built.run.train(
            on_step=every_few_steps,
            observer=trace,
            start_stats=initial.get("initial_stats", {"eval/accuracy": initial["initial_accuracy"]}),
        )
    except (NonFiniteWeights, files.DiskFull) as error:
        sys.exit(f"train_math.py: {error}")


def summarize(args: argparse.Namespace, built: Built, initial: dict, final: dict) -> None:
    """summary.json (the run's before and after, to compare runs by), curves.png, and the last line.
    Under torchrun rank 0 writes; the other ranks wait for it and leave."""
    trainer, grpo = built.run.trainer, built.grpo
    final_accuracy = final["eval/accuracy"]
    if not trainer.dist.is_main:
        # torchrun: waits for rank 0's summary below, then exits (see distributed.finish)
        distributed.finish()
    # this process's, and the earlier ones' up to the checkpoint it resumed from
    wall = built.run.wall_seconds()
    summary = {
        "initial_accuracy": initial["initial_accuracy"],
        "final_accuracy": final_accuracy,
        "gain": final_accuracy - initial["initial_accuracy"],
        "steps": trainer.step,
        "objective": trainer.describe_objective(),
        **held_out_extras(initial.get("initial_stats", {}), final),
        "wall_seconds": round(wall, 1),
        "eval_problems": len(built.eval_problems),
        "model": args.model,
        "data": args.data,
        "seed": args.seed,
        "processes": trainer.dist.world_size,
        "args": vars(args),
    }
    try:
        files.replace_json(os.path.join(args.output_dir, "summary.json"), summary)
        # the run's total, as a record: a later --resume adds on to the checkpoint's (Run.wall_seconds)
        save_initial_evaluation(args.output_dir, {**initial, "wall_seconds_before": wall})
    except files.DiskFull as error:
        sys.exit(f"train_math.py: {error}")
    plotted = plot_curves(
        os.path.join(args.output_dir, "metrics.jsonl"), os.path.join(args.output_dir, "curves.png")
    )
    if grpo.tool_names:  # before and after, as summary.json has them
        print(f"held-out tool use before GRPO: {tool_use(initial.get('initial_stats', {}))}")
        print(f"held-out tool use after GRPO: {tool_use(final)}")
    print(
        f"held-out greedy accuracy: {initial['initial_accuracy']:.3f} -> {final_accuracy:.3f} "
        f"({100 * summary['gain']:+.1f} points) in {trainer.step} steps, {wall / 60:.1f} min; "
        f"{args.output_dir}/summary.json"
        + (", curves.png" if plotted else " (pip install matplotlib for curves.png)")
    )
    distributed.finish()  # torchrun: every rank leaves together; no rank aborts while Python shuts down


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.Action]]:
    """This script's own flags, then one per field of GRPOConfig and TrainConfig (its name; its comment is
    the help); and the flags a --config file may set, by name."""
    parser = OneLineErrors(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--config", help="JSON or YAML file with any of these options (command-line flags override it)"
    )
    add = parser.add_argument
    options = {
        action.dest: action
        for action in [
            add("--model", default=EMBEDDED_MODEL, help="checkpoint directory or Hub repo id"),
            add(
                "--task",
                "--data",
                dest="data",
                default="arithmetic",
                help="synthetic kind, GSM8K/MATH JSONL file or hf://datasets/...",
            ),
            add("--eval_data", help="held-out problems; None: the synthetic kind's test split, or --data"),
            add("--eval_count", type=int, default=200, help="held-out problems to evaluate (greedy)"),
            add(
                "--eval_every",
                type=int,
                default=50,
                help="held-out accuracy every this many steps (0: only before and after)",
            ),
            add("--train_count", type=int, default=5000, help="synthetic training problems to draw"),
            add("--difficulty", type=int, default=1, help="synthetic kinds: 1, 2 or 3"),
            add(
                "--template",
                choices=list(TEMPLATES),
                help="prompt format; None: chat if the tokenizer has one, else tiny",
            ),
            add(
                "--rewards",
                help="name:weight,... e.g. accuracy:1.0,format:0.1; "
                "None: countdown:1.0 for countdown, else accuracy:1.0",
            ),
            add(
                "--trace",
                action=argparse.BooleanOptionalAction,
                default=False,
                help="print the first step's journey through every stage, "
                "and write it as output_dir/trace.html",
            ),
            add("--device", default="cpu", help="cpu, cuda, cuda:1, ..."),
            add(
                "--dtype",
                choices=["float32", "bfloat16", "float16"],
                help="None: float32 on CPU, bfloat16 on GPU",
            ),
        ]
    }
    options.update(add_fields(parser, GRPOConfig))
    options.update(add_fields(parser, TrainConfig, aliases={"max_steps": ["--steps"]}))
    parser.set_defaults(**DEFAULTS)
    return parser, options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's values, over those of --config FILE, over the model's task defaults (see
    model_task), over DEFAULTS. The model is the command line's, else the config file's."""
    parser, options = build_parser()
    args = parser.parse_args(argv)
    try:
        config = read_config_file(args.config, options) if args.config else {}
        parser.set_defaults(**config)
        model = parser.parse_args(argv).model  # the command line's, else the config file's, else the default
        parser.set_defaults(**{**model_task(model, options), **config})  # the file's values beat the task's
    except ValueError as error:
        sys.exit(f"train_math.py: {error}")
    args = parser.parse_args(argv)
    check_counts(args)
    return args


def check_counts(args: argparse.Namespace) -> None:
    """The problem counts, named by their flags (load_problems would name its own parameter, count)."""
    for flag in ("train_count", "eval_count"):
        value = getattr(args, flag)
        if value < 1:
            sys.exit(f"train_math.py: --{flag} must be a positive integer, got {value}")


def model_task(model: str, options: dict[str, argparse.Action]) -> dict:
    """The task a local checkpoint says it was made for (tokenizer.read_task: pretrain_tiny.py writes it and
    every checkpoint of the model carries it), as option values; {} for none."""
    where = f"{os.path.join(model, 'tokenizer_config.json')}: minigrpo_task"
    return option_values(read_task(model), options, where)


def on_rank_0() -> bool:
    """Whether this is the process that writes and prints: the only one, or torchrun's rank 0 (RANK says so
    before the process group exists)."""
    return os.environ.get("RANK", "0") == "0"


def rank_0_note(text: str) -> None:
    if on_rank_0():
        print(text)


def default_rewards(data: str) -> str:
    return "countdown:1.0" if data == "countdown" else "accuracy:1.0"


def parse_rewards(spec: str) -> list[RewardSpec]:
    """--rewards name:weight,... (a weight left out is 1.0) as RewardSpecs; a ValueError names the part at
    fault."""
    rewards = []
    for part in spec.split(","):
        name, _, weight = part.partition(":")
        name, weight = name.strip(), weight.strip()
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(
                f"--rewards {spec!r}: the weight of {name!r} must be a number, got {weight!r} "
                "(write name:weight,..., e.g. accuracy:1.0,format:0.1)"
            ) from None
        if not name:
            raise ValueError(
                f"--rewards {spec!r} has a part with no reward name "
                "(write name:weight,..., e.g. accuracy:1.0)"
            )
        rewards.append(RewardSpec(name, value))  # RewardSpec refuses an unknown name, a weight not finite
    return rewards


HELD_OUT_EXTRAS = ("step_accuracy", "unfaithful_frac", "tool_calls_per_completion", "accuracy_tools_off")


def held_out_extras(initial: dict, final: dict) -> dict:
    """summary.json's held-out stats beyond accuracy, before and after, where measured: the faithfulness
    of arithmetic steps (evaluate.Evaluation.stats), and with tools the calls per completion and the
    accuracy with the tools off."""
    out = {}
    for name in HELD_OUT_EXTRAS:
        key = f"held_out/{name}"
        if key in initial:
            out[f"initial_{name}"] = initial[key]
        if key in final:
            out[f"final_{name}"] = final[key]
    return out


def tool_use(stats: dict) -> str:
    """The console's note on tool use in a held-out evaluation; empty without tools."""
    if "held_out/tool_calls_per_completion" not in stats:
        return ""
    return (
        f"{stats['held_out/tool_calls_per_completion']:.2f} tool calls per completion, "
        f"accuracy {stats['held_out/accuracy_tools_off']:.3f} with the tools off"
    )


def check_output_dir(path: str) -> None:
    """Before any work: --output_dir must be a directory this process can write, or one it can create."""
    if not path:
        sys.exit("train_math.py: --output_dir is empty; give a directory, such as runs/train_math")
    problem = files.output_dir_problem(path, probe=on_rank_0())  # under torchrun rank 0 alone writes
    if problem:
        sys.exit(f"train_math.py: --output_dir {path} {problem}")


if __name__ == "__main__":
    main()
