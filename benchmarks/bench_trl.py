"""The default job under TRL's GRPOTrainer and under minigrpo: held-out accuracy at equal steps,
over several seeds, and seconds per step, per stage.

    pip install -e '.[bench]'                       # transformers, trl (and their datasets, accelerate)
    python benchmarks/bench_trl.py                  # 30 steps each, seed 0
    python benchmarks/bench_trl.py --steps 600 --seeds 0,1,2 --eval_at 50,100,200,600
    python benchmarks/bench_trl.py --steps 600 --stop_after 200 --seeds 0,1,2 --eval_at 50,100  # first third
    python benchmarks/bench_trl.py --smoke          # 2 steps of 2 prompts each (the suite runs this)

Both train models/minigrpo-tiny-arith on the same generated arithmetic problems with the same
settings as python examples/train_math.py: G = 8 completions of 32 prompts per step, at most 32
new tokens, learning rate 1e-4 with 10 warm-up steps then cosine over --steps, AdamW betas
(0.9, 0.99), beta 0 (no reference model), loss_type grpo, epsilon 0.2, plain-text prompts
(minigrpo's "tiny" template), and minigrpo's accuracy reward as TRL's reward function. TRL runs
without gradient checkpointing (its default is on; minigrpo's is off), in fp32 on the CPU, with
transformers' generate as its sampler (no vLLM here). minigrpo runs with its own defaults for
how it computes (shared prompt, token budget). Stages: sample (TRL: _generate), verify
(TRL: _calculate_rewards), update (the rest of the step: log-probs, loss, backward, AdamW).

Each seed sets minigrpo's TrainConfig.seed and TRL's GRPOConfig.seed: both the data order and
the sampling follow it. After each step in --eval_at (and after the last) the live policy's
greedy accuracy on the same 200 held-out problems is measured with minigrpo's evaluate; for TRL
its weights are copied into a minigrpo Qwen3 first. The evaluation keeps the torch and Python
RNG states, so it does not change the training. The learning rate is cosine over --steps, so
accuracy at step 200 of a 600-step run is not that of a 200-step run (whose rate has decayed).
"""

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line  # noqa: E402

import minigrpo  # noqa: E402
from minigrpo import GRPOConfig, RewardSpec, TrainConfig  # noqa: E402
from minigrpo.model import hf_name  # noqa: E402
from minigrpo.run import (
    build_run,  # noqa: E402
    evaluate,  # noqa: E402
)
from minigrpo.tasks import load_problems, template, to_task  # noqa: E402
from minigrpo.verifier import compute_rewards  # noqa: E402

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith")
STAGES = ("sample", "verify", "update", "step")
TRAINERS = ("minigrpo", "trl")


def job(args):
    """The problems and the settings both trainers share."""
    prompts_per_step = 2 if args.smoke else 32
    return dict(
        train=load_problems("arithmetic", "train", count=5000, seed=0),
        held_out=load_problems("arithmetic", "test", count=20 if args.smoke else 200, seed=0),
        prompt=template("tiny"),
        G=8,
        batch=8 * prompts_per_step,
        max_new_tokens=32,
        lr=1e-4,
        warmup=10,
    )


def run_minigrpo(args, shared, seed: int, output_dir: str):
    """(seconds per stage per step, {step: held-out accuracy}) of one minigrpo run."""
    tokenizer = minigrpo.Tokenizer.from_directory(MODEL)
    task = to_task(shared["train"], shared["prompt"], [RewardSpec("accuracy")], tokenizer)
    grpo = GRPOConfig(num_generations=shared["G"], max_completion_length=shared["max_new_tokens"])
    config = TrainConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        batch_size=shared["batch"],
        micro_batch_size=shared["batch"],
        micro_batch_tokens=4096,
        learning_rate=shared["lr"],
        warmup_steps=shared["warmup"],
        lr_schedule="cosine",
        progress_bar=False,
        log_completions_every=0,
        save_every=0,
        seed=seed,
    )
    trainer = build_run(MODEL, task, grpo, config).trainer
    per_step = {stage: [] for stage in STAGES}
    accuracy = {}
    for step in range(1, args.stop_after + 1):
        stats, _ = trainer.train_step()
        for stage in STAGES:
            per_step[stage].append(stats[f"time/{stage}"])
        if step in args.eval_points:
            accuracy[step] = held_out_accuracy(trainer.model, tokenizer, shared)
            progress("minigrpo", seed, step, accuracy[step], per_step)
            trainer.model.train()  # as the update left it (the next sample sets eval itself)
    return per_step, accuracy


def run_trl(args, shared, seed: int, output_dir: str):
    """(seconds per stage per step, {step: held-out accuracy}) of one TRL run."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    rows = [{"prompt": shared["prompt"].render(p.question), "answer": p.answer} for p in shared["train"]]

    def accuracy(completions, answer, **_):  # minigrpo's verifier as TRL's reward function
        return compute_rewards(list(completions), {"answer": list(answer)}, [RewardSpec("accuracy")]).total

    config = trl.GRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=shared["batch"],
        num_generations=shared["G"],
        max_completion_length=shared["max_new_tokens"],
        learning_rate=shared["lr"],
        warmup_steps=shared["warmup"],
        lr_scheduler_type="cosine",
        adam_beta2=0.99,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        temperature=1.0,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
    )
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(MODEL, padding_side="left")
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=accuracy,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    timer = StageTimer()
    trainer._generate = timer.timed("sample", trainer._generate)
    trainer._calculate_rewards = timer.timed("verify", trainer._calculate_rewards)
    judge = TRLJudge(args, shared, seed)
    trainer.add_callback(trl_callback(timer, judge, args.stop_after))
    trainer.remove_callback(PrinterCallback)  # its per-step dict of logs would bury the table
    trainer.train()
    return timer.per_step, judge.accuracy


class StageTimer:
    """Seconds per stage of each TRL step: sample and verify by wrapping TRL's methods, update the rest."""

    def __init__(self):
        self.per_step = {stage: [] for stage in STAGES}
        self.current = {}

    def timed(self, name, method):
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    def begin(self):
        self.current = {"started": time.perf_counter()}

    def end(self):
        step = time.perf_counter() - self.current["started"]
        sample = self.current.get("sample", 0.0)
        verify = self.current.get("verify", 0.0)
        for stage, seconds in zip(STAGES, (sample, verify, step - sample - verify, step)):
            self.per_step[stage].append(seconds)


class TRLJudge:
    """Held-out accuracy of TRL's live model, its weights copied into a minigrpo Qwen3 of the same config."""

    def __init__(self, args, shared, seed: int):
        self.shared = shared
        self.seed = seed
        self.eval_points = args.eval_points
        self.policy, self.tokenizer = minigrpo.load_pretrained(MODEL)
        self.accuracy = {}

    def after_step(self, step: int, model, per_step: dict) -> None:
        if step not in self.eval_points:
            return
        theirs = model.state_dict()
        with torch.no_grad():
            for name, param in self.policy.state_dict().items():
                param.copy_(theirs[hf_name(name)])
        self.accuracy[step] = held_out_accuracy(self.policy, self.tokenizer, self.shared)
        progress("trl", self.seed, step, self.accuracy[step], per_step)


def trl_callback(timer: StageTimer, judge: TRLJudge, stop_after: int):
    """A TrainerCallback: times each step, then (outside the timing) evaluates at the chosen steps;
    it ends the training after step `stop_after`."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timer.begin()

        def on_step_end(self, args, state, control, **kwargs):
            timer.end()
            judge.after_step(state.global_step, kwargs["model"], timer.per_step)
            control.should_training_stop = state.global_step >= stop_after

    return Steps()


@contextlib.contextmanager
def rng_kept():
    """Whatever runs inside leaves torch's CPU generator and Python's random as they were."""
    state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(state)


def held_out_accuracy(model, tokenizer, shared) -> float:
    """Greedy pass@1 on the held-out problems; the model is left in eval mode."""
    with rng_kept():
        return evaluate(
            model.eval(),
            tokenizer,
            shared["held_out"],
            shared["prompt"],
            max_new_tokens=shared["max_new_tokens"],
        ).pass_at_1


def progress(name: str, seed: int, step: int, accuracy: float, per_step: dict) -> None:
    """One line per evaluation as it happens, so a run cut short still shows what it measured."""
    seconds = statistics.median(per_step["step"])
    print(
        f"  {name} seed {seed} step {step}: held-out accuracy {accuracy:.3f}, median s/step {seconds:.3f}",
        flush=True,
    )


def parse_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps of each run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each trains one run per trainer")
    parser.add_argument(
        "--eval_at",
        default="",
        help="comma-separated steps at which to measure held-out accuracy (the last step always is)",
    )
    parser.add_argument(
        "--stop_after",
        type=int,
        default=None,
        help="train only the first N steps of the "
        "--steps schedule (the learning rate still follows --steps); default: all of them",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="2 steps of 2 prompts: checks that both sides run"
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps = 2
    args.seeds = parse_ints(args.seeds)
    if args.stop_after is None:
        args.stop_after = args.steps
    if not 0 < args.stop_after <= args.steps:
        parser.error(f"--stop_after must be between 1 and --steps ({args.steps}), not {args.stop_after}")
    if not args.seeds:
        parser.error("--seeds needs at least one seed")
    last = args.stop_after
    args.eval_points = sorted({step for step in parse_ints(args.eval_at) if 0 < step <= last} | {last})
    return args


def accuracy_header(args, shared) -> None:
    prompts = shared["batch"] // shared["G"]
    print(
        f"{args.stop_after} of {args.steps} steps of {prompts} prompts x {shared['G']}, cosine over "
        f"{args.steps} steps; greedy accuracy on {len(shared['held_out'])} held-out problems at each step; "
        f"s/step: median over steps {skip(args) + 1}..{args.stop_after}"
    )
    print("| trainer | seed | " + " | ".join(f"acc@{step}" for step in args.eval_points) + " | s/step |")
    print("|---|---:|" + "---:|" * (len(args.eval_points) + 1), flush=True)


def skip(args) -> int:
    """Steps left out of the medians: the first holds one-time set-up (TRL: its dataloader)."""
    return 1 if args.stop_after > 2 else 0


def median_step_seconds(args, per_step: dict) -> float:
    return statistics.median(per_step["step"][skip(args) :])


def accuracy_row(args, name: str, seed, accuracy: dict, seconds: float) -> None:
    cells = " | ".join(f"{accuracy[step]:.3f}" for step in args.eval_points)
    print(f"| {name} | {seed} | {cells} | {seconds:.3f} |", flush=True)


def summary_rows(args, runs: dict) -> None:
    """Per trainer: the mean over seeds and the spread (min-max) at each step; then the means' difference."""
    means = {}
    for name in TRAINERS:
        if not runs[name]:
            continue
        at = {step: [accuracy[step] for _, accuracy in runs[name].values()] for step in args.eval_points}
        means[name] = {step: statistics.mean(values) for step, values in at.items()}
        seconds = statistics.mean(median_step_seconds(args, per_step) for per_step, _ in runs[name].values())
        mean_cells = " | ".join(f"{means[name][step]:.3f}" for step in args.eval_points)
        spread_cells = " | ".join(f"{min(values):.3f}-{max(values):.3f}" for values in at.values())
        print(f"| {name} | mean of {len(runs[name])} | {mean_cells} | {seconds:.3f} |")
        print(f"| {name} | min-max | {spread_cells} | |")
    if len(means) == 2:
        gaps = " | ".join(f"{means['trl'][step] - means['minigrpo'][step]:+.3f}" for step in args.eval_points)
        print(f"| trl - minigrpo | mean | {gaps} | |")


def stage_table(args, runs: dict) -> None:
    """Median seconds per stage over every seed's steps, each trainer; then TRL's over minigrpo's."""
    print(f"\nmedian seconds per step (steps {skip(args) + 1}..{args.stop_after} of every seed), per stage")
    print("| trainer | " + " | ".join(STAGES) + " |")
    print("|---|" + "---:|" * len(STAGES))
    medians = {}
    for name in TRAINERS:
        medians[name] = {}
        for stage in STAGES:
            every_seed = [t for per_step, _ in runs[name].values() for t in per_step[stage][skip(args) :]]
            medians[name][stage] = statistics.median(every_seed)
        print(f"| {name} | " + " | ".join(f"{medians[name][stage]:.3f}" for stage in STAGES) + " |")
    ratio = {stage: medians["trl"][stage] / max(medians["minigrpo"][stage], 1e-9) for stage in STAGES}
    ratios = " | ".join(f"{ratio[stage]:.2f}x" for stage in STAGES)
    print(f"| trl / minigrpo | {ratios} |")


def main():
    args = parse_args()
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("bench_trl.py needs TRL: pip install -e '.[bench]'")
    print(machine_line())
    shared = job(args)
    runs = {name: {} for name in TRAINERS}  # name -> seed -> (seconds per stage per step, {step: accuracy})
    accuracy_header(args, shared)
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            for name, run in zip(TRAINERS, (run_minigrpo, run_trl)):
                per_step, accuracy = run(args, shared, seed, os.path.join(scratch, f"{name}-{seed}"))
                runs[name][seed] = (per_step, accuracy)
                accuracy_row(args, name, seed, accuracy, median_step_seconds(args, per_step))
    summary_rows(args, runs)
    stage_table(args, runs)
    print(machine_line())


if __name__ == "__main__":
    main()
