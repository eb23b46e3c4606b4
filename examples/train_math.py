"""GRPO on math problems with verifiable answers: evaluate, train, evaluate again.

    python examples/train_math.py                      # the embedded tiny model on arithmetic, CPU, minutes
    python examples/train_math.py --model Qwen/Qwen3-0.6B --data math_train.jsonl --eval_data math500_test.jsonl \\
        --template chat --num_generations 8 --learning_rate 1e-5 --max_completion_length 512 --device cuda

With no arguments it loads models/minigrpo-tiny-arith (made by examples/pretrain_tiny.py),
measures greedy accuracy on held-out problems, runs GRPO, measures again and writes
output_dir/summary.json. Flags use TRL's names where they overlap; --config takes the same keys
from a JSON (or YAML) file, flags on the command line win. --trace prints the first step's
journey through every stage. The stages themselves live in the library (minigrpo/trainer.py).

Unchanged under torchrun, data-parallel (DDP), or sharded with --fsdp (FSDP2); rank 0 writes:

    torchrun --nproc_per_node 8 examples/train_math.py --device cuda ...
"""

import argparse
import json
import os
import sys
import time

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, TrainConfig, distributed
from minigrpo.checkpoint import resolve_checkpoint
from minigrpo.loss import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, SAMPLER_CORRECTIONS
from minigrpo.plots import plot_curves
from minigrpo.tasks import load_problems, to_task
from minigrpo.tasks.prompts import TEMPLATES, template
from minigrpo.trace import Trace
from minigrpo.trainer import build_trainer

# The embedded default, found from this file: the default run works offline from any directory.
EMBEDDED_MODEL = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith"))
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
add = parser.add_argument
add("--config", help="JSON or YAML file with any of these options (command-line flags override it)")
add("--model", default=EMBEDDED_MODEL, help="checkpoint directory or Hub repo id (default: the embedded models/minigrpo-tiny-arith)")
add("--task", "--data", dest="data", default="arithmetic", help="synthetic kind, GSM8K/MATH JSONL file or hf://datasets/...")
add("--eval_data", help="held-out problems (default: the synthetic kind's test split, or --data)")
add("--eval_count", type=int, default=200, help="held-out problems to evaluate (greedy)")
add("--train_count", type=int, default=5000, help="synthetic training problems to draw")
add("--difficulty", type=int, default=1, help="synthetic kinds: 1, 2 or 3")
add("--template", choices=list(TEMPLATES), help="prompt format (default: chat if the tokenizer has one, else tiny)")
add("--rewards", help="name:weight,... e.g. accuracy:1.0,format:0.1 (default: countdown:1.0 for countdown, else accuracy:1.0)")
add("--output_dir", default="runs/train_math")
add("--steps", type=int, default=600, help="GRPO steps")
add("--num_generations", type=int, default=8)
add("--batch_size", type=int, default=256, help="completions per step (prompts x num_generations)")
add("--micro_batch_size", type=int, default=256)
add("--micro_batch_tokens", type=int, default=4096, help="token budget per micro-batch, rollouts grouped by length (0: micro_batch_size rows)")
add("--shared_prompt", action=argparse.BooleanOptionalAction, default=True,
    help="run each prompt once for its num_generations completions in the update (--no-shared_prompt: once per completion)")
add("--max_completion_length", type=int, default=32)
add("--learning_rate", type=float, default=1e-4)
add("--warmup_steps", type=int, default=10)
add("--lr_schedule", default="cosine", choices=["constant", "cosine"])
add("--beta", type=float, default=0.0)
add("--epsilon", type=float, default=0.2, help="clip range below 1 (GSPO's paper, at --importance_sampling_level sequence: 3e-4)")
add("--epsilon_high", type=float, help="clip range above 1 (default: --epsilon; DAPO 0.28; GSPO 4e-4; cispo: 4.0, a weight cap of 5)")
add("--loss_type", default="grpo", choices=list(LOSS_TYPES))
add("--importance_sampling_level", default="token", choices=list(IMPORTANCE_SAMPLING_LEVELS),
    help="sequence: GSPO's length-normalised ratio per completion (pair it with --epsilon 3e-4 --epsilon_high 4e-4)")
add("--sampler_correction", default="none", choices=list(SAMPLER_CORRECTIONS),
    help="weight each token by the trained-on policy's probability over the sampler's, truncated or masked (see minigrpo/loss.py)")
add("--sampler_correction_cap", type=float, default=3.0, help="C: weights truncated at C, or masked outside [1/C, C]")
add("--scale_rewards", default="group", choices=["group", "batch", "none"])
add("--num_iterations", type=int, default=1)
add("--temperature", type=float, default=1.0)
add("--top_p", type=float, default=1.0)
add("--dynamic_sampling", action="store_true")
add("--mask_truncated_completions", action="store_true")
add("--gradient_checkpointing", action="store_true")
add("--fsdp", action="store_true", help="under torchrun: shard the model over the processes (FSDP2) instead of copying it (DDP)")
add("--eval_every", type=int, default=50, help="held-out accuracy every this many steps (0: only before and after)")
add("--save_every", type=int, default=50)
add("--resume", action="store_true", help="continue from the latest checkpoint in output_dir")
add("--trace", action="store_true", help="print the first step's journey through every stage")
add("--seed", type=int, default=0)
add("--device", default="cpu")
add("--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU, bfloat16 on GPU")


def load_config_file(path: str) -> dict:
    """The options in a JSON or YAML file, checked: known keys, and true/false for the switches."""
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith((".yaml", ".yml")):
                try:
                    import yaml
                except ImportError:
                    sys.exit(f"train_math.py: reading {path} needs PyYAML (pip install pyyaml), or use a JSON file")
                values = yaml.safe_load(f) or {}
            else:
                values = json.load(f)
    except Exception as error:  # a missing file, bad JSON or YAML
        sys.exit(f"train_math.py: cannot read the config file {path}: {error}")
    if not isinstance(values, dict):
        sys.exit(f"train_math.py: {path} must hold a mapping of option names to values")
    actions = {a.dest: a for a in parser._actions}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        sys.exit(f"train_math.py: {path} has unknown options: {', '.join(unknown)}")
    for key, value in values.items():
        problem = value_problem(actions[key], value)
        if problem:
            sys.exit(f"train_math.py: {path}: {key} {problem}, got {value!r}")
    return values


def value_problem(action: argparse.Action, value) -> str | None:
    """What is wrong with a config file's value for an option, by the flag's own type and choices; None if nothing."""
    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        return None if isinstance(value, bool) else "must be true or false"
    if value is None:
        return None if action.default is None else "must not be null (leave it out for the default)"
    kind = action.type or str
    wanted = {str: "must be text", int: "must be an integer", float: "must be a number"}[kind]
    allowed = {str: (str,), int: (str, int), float: (str, int, float)}[kind]  # JSON types that can mean a kind
    if isinstance(value, bool) or not isinstance(value, allowed):
        return wanted
    try:
        value = kind(value)  # "1e-5" from YAML is a string; argparse converts string defaults the same way
    except ValueError:
        return wanted
    if action.choices is not None and value not in action.choices:
        return f"must be one of {', '.join(map(str, action.choices))}"
    return None


def check_output_dir(path: str) -> None:
    """Before any work: --output_dir must be a directory this process can write, or one it can create."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path) and not os.path.isdir(existing):
        sys.exit(f"train_math.py: --output_dir {path} is a file; it must be a directory (or not exist yet)")
    if not os.path.isdir(existing):
        sys.exit(f"train_math.py: --output_dir {path} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        sys.exit(f"train_math.py: --output_dir {path} cannot be written: no write permission in {existing}")


args = parser.parse_args()
if args.config:
    parser.set_defaults(**load_config_file(args.config))
    args = parser.parse_args()
check_output_dir(args.output_dir)

try:
    # Task: problems, the prompt format and the rewards (the default model has no chat format).
    tokenizer = minigrpo.Tokenizer.from_directory(resolve_checkpoint(args.model))
    prompt = template(args.template or ("chat" if tokenizer.has_chat_format else "tiny"))
    synthetic = not os.path.exists(args.data) and not args.data.startswith("hf://")
    train_problems = load_problems(args.data, "train", count=args.train_count if synthetic else None,
                                   seed=args.seed, difficulty=args.difficulty)
    eval_source = args.eval_data or args.data
    eval_problems = load_problems(eval_source, "test", count=args.eval_count, seed=0,  # the same for every run
                                  difficulty=args.difficulty)
    spec = args.rewards or ("countdown:1.0" if args.data == "countdown" else "accuracy:1.0")
    rewards = [RewardSpec(name.strip(), float(weight or 1.0)) for name, _, weight in (i.partition(":") for i in spec.split(","))]
    task = to_task(train_problems, prompt, rewards, tokenizer)
    grpo = GRPOConfig(
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=args.temperature, top_p=args.top_p, epsilon=args.epsilon, epsilon_high=args.epsilon_high,
        beta=args.beta, loss_type=args.loss_type, scale_rewards=args.scale_rewards, num_iterations=args.num_iterations,
        importance_sampling_level=args.importance_sampling_level, sampler_correction=args.sampler_correction,
        sampler_correction_cap=args.sampler_correction_cap,
        dynamic_sampling=args.dynamic_sampling, mask_truncated_completions=args.mask_truncated_completions,
    )
    config = TrainConfig(
        output_dir=args.output_dir, max_steps=args.steps, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, micro_batch_tokens=args.micro_batch_tokens, shared_prompt=args.shared_prompt,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, lr_schedule=args.lr_schedule, seed=args.seed,
        save_every=args.save_every, resume=args.resume, gradient_checkpointing=args.gradient_checkpointing,
        log_completions_every=args.eval_every, fsdp=args.fsdp,
    )
    trainer = build_trainer(args.model, task, grpo, config, device=args.device, dtype=args.dtype)
    held_out_ids = tokenizer.encode_all([prompt.render(p.question, tokenizer) for p in eval_problems], "held-out prompts", args.model)
    trainer.check_context(held_out_ids, f"held-out prompts ({eval_source})")
except (ValueError, minigrpo.CheckpointError, FileNotFoundError) as error:
    sys.exit(f"train_math.py: {error}")


def held_out_accuracy() -> float:  # under torchrun each rank evaluates a block of the problems
    return trainer.evaluate(eval_problems, prompt, rewards[:1], max_new_tokens=args.max_completion_length,
                            seed=args.seed).pass_at_1


def every_few_steps(trainer) -> dict:
    if args.eval_every and trainer.step % args.eval_every == 0:
        return {"eval/accuracy": held_out_accuracy()}
    return {}


def write_json(path: str, data: dict) -> None:
    """All of `data` or the file as it was (a temporary file renamed over it): a kill mid-write must
    not leave an empty initial_eval.json, which --resume reads."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


# Before: held-out greedy accuracy of the starting policy (kept across --resume). Rank 0 alone writes.
main = trainer.dist.is_main
if not synthetic and not args.eval_data:
    trainer.dist.print(f"note: evaluating on {args.data} itself; pass --eval_data for held-out problems")
start_file = os.path.join(args.output_dir, "initial_eval.json")
started = time.time()
held_out = {"eval_data": eval_source, "eval_count": len(eval_problems)}  # what the accuracy was measured on
initial = {}
if main and args.resume and os.path.exists(start_file):
    with open(start_file) as f:
        initial = json.load(f)
initial = trainer.dist.broadcast(initial)  # every rank takes the same branch below (it evaluates together)
if initial.get("held_out") != held_out and trainer.step > 0:  # the policy is no longer the starting one
    was = initial.get("held_out")
    measured = f"{was['eval_count']} problems of {was['eval_data']}" if was else "problems not recorded"
    sys.exit(f"train_math.py: this run's accuracy before GRPO was measured on {measured}, not on "
             f"{held_out['eval_count']} of {held_out['eval_data']}: resume with the same --eval_data and "
             "--eval_count (or start a new --output_dir), so that before and after count the same problems")
if initial.get("held_out") != held_out:  # a fresh run
    initial = {"initial_accuracy": held_out_accuracy(), "wall_seconds_before": 0.0, "held_out": held_out}
    if main:
        os.makedirs(args.output_dir, exist_ok=True)
        if trainer.step == 0:  # step 0 of the held-out curve
            with open(os.path.join(args.output_dir, "metrics.jsonl"), "w") as f:
                f.write(json.dumps({"step": 0, "eval/accuracy": initial["initial_accuracy"]}) + "\n")
        write_json(start_file, initial)
trainer.dist.print(f"held-out greedy accuracy before GRPO: {initial['initial_accuracy']:.3f} ({len(eval_problems)} problems)")

# GRPO: sample, verify, advantages, update; metrics and checkpoints as it goes.
trainer.train(on_step=every_few_steps, observer=Trace(html_path=os.path.join(args.output_dir, "trace.html")) if args.trace else None)

# After: the same evaluation, and a summary to compare runs by.
final_accuracy = held_out_accuracy()
if not main:
    distributed.finish()  # torchrun: waits for rank 0's summary below, then exits (see distributed.finish)
wall = initial["wall_seconds_before"] + time.time() - started
summary = {
    "initial_accuracy": initial["initial_accuracy"],
    "final_accuracy": final_accuracy,
    "gain": final_accuracy - initial["initial_accuracy"],
    "steps": trainer.step,
    "wall_seconds": round(wall, 1),
    "eval_problems": len(eval_problems),
    "model": args.model,
    "data": args.data,
    "seed": args.seed,
    "processes": trainer.dist.world_size,
    "args": vars(args),
}
write_json(os.path.join(args.output_dir, "summary.json"), summary)
write_json(start_file, {**initial, "wall_seconds_before": wall})
plotted = plot_curves(os.path.join(args.output_dir, "metrics.jsonl"), os.path.join(args.output_dir, "curves.png"))
print(f"held-out greedy accuracy: {initial['initial_accuracy']:.3f} -> {final_accuracy:.3f} "
      f"({100 * summary['gain']:+.1f} points) in {trainer.step} steps, {wall / 60:.1f} min; "
      f"{args.output_dir}/summary.json" + (", curves.png" if plotted else " (pip install matplotlib for curves.png)"))
distributed.finish()  # torchrun: every rank leaves together; no rank aborts while Python shuts down
