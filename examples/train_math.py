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
import json
import os
import sys

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, TrainConfig, distributed, files
from minigrpo.flags import JSON_OBJECTS, OneLineErrors, add_fields, from_args
from minigrpo.model import read_task, tokenizer_directory
from minigrpo.run import (
    Trace,
    build_run,
    evaluate_held_out,
    initial_evaluation,
    plot_curves,
    save_initial_evaluation,
)
from minigrpo.tasks import TEMPLATES, load_problems, sources_of, template, to_task
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
    """The task a local checkpoint says it was made for (weights.read_task: pretrain_tiny.py writes it and
    every checkpoint of the model carries it), as option values; {} for none."""
    where = f"{os.path.join(model, 'tokenizer_config.json')}: minigrpo_task"
    return option_values(read_task(model), options, where)


def read_config_file(path: str, options: dict[str, argparse.Action]) -> dict:
    """The values of a JSON or YAML file of option names (`options`: name -> its flag's action), each as its
    flag would give it, checked against the flag's type, count and choices (by the action's public attributes,
    not argparse's internals). A ValueError says what is wrong, in one line."""
    load = json.load
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"reading {path} needs PyYAML (pip install pyyaml), or use a JSON file"
            ) from None
        load = yaml.safe_load
    try:
        with open(path, encoding="utf-8") as f:
            values = load(f) or {}
    except Exception as error:  # a missing file, bad JSON or YAML
        raise ValueError(f"cannot read the config file {path}: {read_error(error)}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of option names to values")
    return option_values(values, options, path)


def option_values(values: dict, options: dict[str, argparse.Action], where: str) -> dict:
    """`values` (option name -> value, read from `where`), each as its flag would give it; a ValueError
    names an unknown option or a bad value."""
    unknown = sorted(set(values) - set(options))
    if unknown:
        raise ValueError(f"{where} has unknown options: {', '.join(unknown)}")
    try:
        return {key: file_value(options[key], value) for key, value in values.items()}
    except ValueError as problem:
        raise ValueError(f"{where}: {problem}") from None


def read_error(error: Exception) -> str:
    """What is wrong with a config file, in one line: where the JSON or YAML parser stopped, and why (PyYAML's
    own message spans several lines, quoting the text with a caret under it)."""
    if isinstance(error, json.JSONDecodeError):
        return f"line {error.lineno}, column {error.colno}: {error.msg}"
    mark = getattr(error, "problem_mark", None)  # PyYAML's MarkedYAMLError
    if mark is None:
        return " ".join(str(error).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    started = getattr(error, "context_mark", None)
    if error.context and started is not None:
        return f"{where} ({error.context} that starts on line {started.line + 1})"
    return f"{where} ({error.context})" if error.context else where


WANTED = {
    str: ("must be text", (str,)),
    int: ("must be an integer", (str, int)),
    float: ("must be a number", (str, int, float)),
}


def file_value(action: argparse.Action, value):
    """A file's value as its flag would give it; a ValueError says what is wrong with it."""
    if isinstance(action, argparse.BooleanOptionalAction):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{action.dest} must be true or false, got {value!r}")
    if action.dest in JSON_OBJECTS and isinstance(value, dict):
        return value  # GRPOConfig takes the object as its JSON text
    if value is None:
        if action.default is None:
            return value
        raise ValueError(f"{action.dest} must not be null (leave it out for the default), got None")
    if action.nargs is None:
        return one_value(action, value, value)
    if not isinstance(value, list) or len(value) != action.nargs:
        raise ValueError(f"{action.dest} must be a list of {action.nargs} values, got {value!r}")
    return [one_value(action, item, value) for item in value]


def one_value(action: argparse.Action, item, value):
    """`item` (of `value`) as the flag's type: text may stand for a number, as YAML reads 1e-5."""
    kind = action.type or str
    wanted, allowed = WANTED[kind]
    try:
        item = kind(item) if isinstance(item, allowed) and not isinstance(item, bool) else None
    except ValueError:
        item = None
    if item is None:
        raise ValueError(f"{action.dest} {wanted}, got {value!r}")
    if action.choices is not None and item not in action.choices:
        raise ValueError(f"{action.dest} must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return item


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
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path) and not os.path.isdir(existing):
        sys.exit(f"train_math.py: --output_dir {path} is a file; it must be a directory (or not exist yet)")
    if not os.path.isdir(existing):
        sys.exit(f"train_math.py: --output_dir {path} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        sys.exit(f"train_math.py: --output_dir {path} cannot be written: no write permission in {existing}")
    problem = files.write_probe(path) if on_rank_0() else None  # under torchrun rank 0 alone writes
    if problem:
        sys.exit(f"train_math.py: --output_dir {path} cannot be written: {problem}")


if __name__ == "__main__":
    args = parse_args()
    check_output_dir(args.output_dir)

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
        trainer = run.trainer
        held_out = [
            prompt.render(p.question, tokenizer, tools, **grpo.template_kwargs) for p in eval_problems
        ]
        sources = sources_of(eval_problems)  # a file's: "data.jsonl, line 7" names a prompt too long
        what = "held-out prompts" if sources else f"held-out prompts ({eval_source})"
        # tokens a prompt may have
        room = trainer.model.config.max_position_embeddings - grpo.max_completion_length
        held_out_ids = tokenizer.encode_all(held_out, what, args.model, room, sources)
        trainer.check_context(held_out_ids, what, sources)
    except (ValueError, minigrpo.CheckpointError, FileNotFoundError) as error:
        sys.exit(f"train_math.py: {error}")

    def held_out() -> dict[str, float]:  # under torchrun each rank evaluates a block of the problems
        settings = dict(max_new_tokens=args.max_completion_length, seed=args.seed)
        tools = dict(tools=grpo.tool_names, tool_format=grpo.tool_format, max_tool_calls=grpo.max_tool_calls)
        # accuracy; the steps' faithfulness where they can be checked; tool calls per completion
        stats = evaluate_held_out(trainer, eval_problems, prompt, rewards[:1], **settings, **tools).stats()
        if grpo.tool_names:  # how much the accuracy owes to the tools
            off = evaluate_held_out(trainer, eval_problems, prompt, rewards[:1], **settings)
            stats["held_out/accuracy_tools_off"] = off.pass_at_1
        return stats

    def every_few_steps(trainer) -> dict:
        if args.eval_every and trainer.step % args.eval_every == 0:
            return held_out()
        return {}

    # Before: held-out greedy accuracy of the starting policy, kept in output_dir across --resume.
    main = trainer.dist.is_main
    if not synthetic and not args.eval_data:
        trainer.dist.print(f"note: evaluating on {args.data} itself; pass --eval_data for held-out problems")
    try:  # what the accuracy is measured on must stay the same from start to end, tools included
        measured_on = {"eval_data": eval_source, "eval_count": len(eval_problems)}
        if grpo.tool_names:
            measured_on.update(
                tools=grpo.tools, tool_format=grpo.tool_format, max_tool_calls=grpo.max_tool_calls
            )
        initial = initial_evaluation(trainer, held_out, measured_on)
    except (ValueError, files.DiskFull) as error:
        sys.exit(f"train_math.py: {error}")
    trainer.dist.print(
        f"held-out greedy accuracy before GRPO: {initial['initial_accuracy']:.3f} "
        f"({len(eval_problems)} problems)"
    )
    if grpo.tool_names:
        trainer.dist.print(f"held-out tool use before GRPO: {tool_use(initial.get('initial_stats', {}))}")

    # GRPO: sample, verify, advantages, update; metrics and checkpoints as it goes.
    trainer.dist.print(f"objective: {trainer.describe_objective()}")
    trace = Trace(html_path=os.path.join(args.output_dir, "trace.html")) if args.trace else None
    try:  # broken weights are never saved; a full disk keeps nothing of the write it stopped
        run.train(
            on_step=every_few_steps,
            observer=trace,
            start_stats=initial.get("initial_stats", {"eval/accuracy": initial["initial_accuracy"]}),
        )
    except (NonFiniteWeights, files.DiskFull) as error:
        sys.exit(f"train_math.py: {error}")

    # After: the same evaluation, and a summary to compare runs by.
    final = held_out()
    final_accuracy = final["eval/accuracy"]
    if not main:
        # torchrun: waits for rank 0's summary below, then exits (see distributed.finish)
        distributed.finish()
    # this process's, and the earlier ones' up to the checkpoint it resumed from
    wall = run.wall_seconds()
    summary = {
        "initial_accuracy": initial["initial_accuracy"],
        "final_accuracy": final_accuracy,
        "gain": final_accuracy - initial["initial_accuracy"],
        "steps": trainer.step,
        "objective": trainer.describe_objective(),
        **held_out_extras(initial.get("initial_stats", {}), final),
        "wall_seconds": round(wall, 1),
        "eval_problems": len(eval_problems),
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
