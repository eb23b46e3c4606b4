"""The default job under TRL's GRPOTrainer and under minigrpo: seconds per step, per stage.

    pip install -e '.[bench]'                       # transformers, trl (and their datasets, accelerate)
    python benchmarks/bench_trl.py                  # 30 steps each
    python benchmarks/bench_trl.py --steps 600      # the whole default run (TRL: ~10 minutes)
    python benchmarks/bench_trl.py --smoke          # 2 steps of 2 prompts each (the suite runs this)

Both train models/minigrpo-tiny-arith on the same generated arithmetic problems with the same
settings as python examples/train_math.py: G = 8 completions of 32 prompts per step, at most 32
new tokens, learning rate 1e-4 with 10 warm-up steps then cosine over --steps, AdamW betas
(0.9, 0.99), beta 0 (no reference model), loss_type grpo, epsilon 0.2, plain-text prompts
(minigrpo's "tiny" template), and minigrpo's accuracy reward as TRL's reward function. TRL runs
without gradient checkpointing (its default is on; minigrpo's is off), in fp32 on the CPU, with
transformers' generate as its sampler (no vLLM here). minigrpo runs with its own defaults for
how it computes (shared prompt, token budget). Each side then measures greedy accuracy on the
same 200 held-out problems with minigrpo's evaluate. Stages: sample (TRL: _generate), verify
(TRL: _calculate_rewards), update (the rest of the step: log-probs, loss, backward, AdamW).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line  # noqa: E402

import minigrpo  # noqa: E402
from minigrpo import GRPOConfig, RewardSpec, TrainConfig  # noqa: E402
from minigrpo.evaluate import evaluate  # noqa: E402
from minigrpo.tasks import load_problems, to_task  # noqa: E402
from minigrpo.tasks.prompts import template  # noqa: E402
from minigrpo.trainer import build_trainer  # noqa: E402
from minigrpo.verifier import compute_rewards  # noqa: E402

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith")
STAGES = ("sample", "verify", "update", "step")


def job(args):
    """The problems and the settings both trainers share."""
    prompts_per_step = 2 if args.smoke else 32
    return dict(
        train=load_problems("arithmetic", "train", count=5000, seed=0),
        held_out=load_problems("arithmetic", "test", count=20 if args.smoke else 200, seed=0),
        prompt=template("tiny"), G=8, batch=8 * prompts_per_step, max_new_tokens=32, lr=1e-4, warmup=10,
    )


def run_minigrpo(args, shared, output_dir: str):
    tokenizer = minigrpo.Tokenizer.from_directory(MODEL)
    task = to_task(shared["train"], shared["prompt"], [RewardSpec("accuracy")], tokenizer)
    grpo = GRPOConfig(num_generations=shared["G"], max_completion_length=shared["max_new_tokens"])
    config = TrainConfig(output_dir=output_dir, max_steps=args.steps, batch_size=shared["batch"],
                         micro_batch_size=shared["batch"], micro_batch_tokens=4096, learning_rate=shared["lr"],
                         warmup_steps=shared["warmup"], lr_schedule="cosine", progress_bar=False,
                         log_completions_every=0, save_every=0)
    trainer = build_trainer(MODEL, task, grpo, config)
    per_step = {stage: [] for stage in STAGES}
    for _ in range(args.steps):
        stats, _ = trainer.train_step()
        per_step["sample"].append(stats["time/sample"])
        per_step["verify"].append(stats["time/verify"])
        per_step["update"].append(stats["time/update"])
        per_step["step"].append(stats["time/step"])
    return per_step, held_out_accuracy(trainer.model, tokenizer, shared)


def run_trl(args, shared, output_dir: str):
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    rows = [{"prompt": shared["prompt"].render(p.question), "answer": p.answer} for p in shared["train"]]

    def accuracy(completions, answer, **_):  # minigrpo's verifier as TRL's reward function
        return compute_rewards(list(completions), {"answer": list(answer)}, [RewardSpec("accuracy")]).total

    config = trl.GRPOConfig(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=shared["batch"],
        num_generations=shared["G"], max_completion_length=shared["max_new_tokens"], learning_rate=shared["lr"],
        warmup_steps=shared["warmup"], lr_scheduler_type="cosine", adam_beta2=0.99, beta=0.0, epsilon=0.2,
        loss_type="grpo", temperature=1.0, gradient_checkpointing=False, use_cpu=True, bf16=False,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(MODEL, padding_side="left")
    trainer = trl.GRPOTrainer(model=model, reward_funcs=accuracy, args=config, train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer)
    per_step = {stage: [] for stage in STAGES}
    current = {}

    def timed(name, method):
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                current[name] = current.get(name, 0.0) + time.perf_counter() - started
        return wrapper

    trainer._generate = timed("sample", trainer._generate)
    trainer._calculate_rewards = timed("verify", trainer._calculate_rewards)

    class Steps(TrainerCallback):
        def on_step_begin(self, *_, **__):
            current.clear()
            current["started"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - current["started"]
            per_step["sample"].append(current.get("sample", 0.0))
            per_step["verify"].append(current.get("verify", 0.0))
            per_step["update"].append(step - current.get("sample", 0.0) - current.get("verify", 0.0))
            per_step["step"].append(step)

    trainer.add_callback(Steps())
    trainer.train()
    trainer.save_model(os.path.join(output_dir, "final"))
    tokenizer.save_pretrained(os.path.join(output_dir, "final"))
    policy, ours = minigrpo.load_pretrained(os.path.join(output_dir, "final"))
    return per_step, held_out_accuracy(policy, ours, shared)


def held_out_accuracy(model, tokenizer, shared) -> float:
    return evaluate(model.eval(), tokenizer, shared["held_out"], shared["prompt"],
                    max_new_tokens=shared["max_new_tokens"]).pass_at_1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps of each run")
    parser.add_argument("--smoke", action="store_true", help="2 steps of 2 prompts: checks that both sides run")
    args = parser.parse_args()
    if args.smoke:
        args.steps = 2
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("bench_trl.py needs TRL: pip install -e '.[bench]'")
    print(machine_line())
    shared = job(args)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, run in (("minigrpo", run_minigrpo), ("trl", run_trl)):
            started = time.perf_counter()
            per_step, accuracy = run(args, shared, os.path.join(scratch, name))
            results[name] = (per_step, accuracy, time.perf_counter() - started)
    skip = 1 if args.steps > 2 else 0  # the first step holds one-time set-up (TRL: its dataloader, minigrpo: nothing much)
    print(f"{args.steps} steps of {shared['batch'] // shared['G']} prompts x {shared['G']}; median seconds per step "
          f"(steps {skip + 1}..{args.steps}), held-out greedy accuracy on {len(shared['held_out'])} problems after training")
    print("| trainer | " + " | ".join(STAGES) + " | held-out accuracy | wall s |")
    print("|---|" + "---:|" * (len(STAGES) + 2))
    medians = {}
    for name, (per_step, accuracy, wall) in results.items():
        medians[name] = {s: statistics.median(per_step[s][skip:]) for s in STAGES}
        print(f"| {name} | " + " | ".join(f"{medians[name][s]:.3f}" for s in STAGES) + f" | {accuracy:.3f} | {wall:.0f} |")
    print("| trl / minigrpo | " + " | ".join(f"{medians['trl'][s] / max(medians['minigrpo'][s], 1e-9):.2f}x" for s in STAGES) + " | | |")


if __name__ == "__main__":
    main()
