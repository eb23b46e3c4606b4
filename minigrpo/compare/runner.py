"""The comparison's second stage: the runs. In: a `Plan` (variants x seeds on one budget) and an output
directory. Out: each run trained by `python examples/train_math.py --output_dir OUT/<variant>/seed-<s>` in
a process of its own, then checked by `examples/eval_math.py` on a fresh seed's problems (and the start
model once); the plan in OUT/comparison.json; every process started, a line of OUT/processes.jsonl; a
failed run's exit and last error line in its failed.json. Nothing runs twice: a run with summary.json is
finished, one with a checkpoint resumes (the trainer's bit-exact resume), a check with check.json is done.
It knows commands, folders and exit codes, not what a run learns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..files import read_json_object, replace_json
from .variants import Variant

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)
TRAIN = os.path.join(EXAMPLES, "train_math.py")
CHECK = os.path.join(EXAMPLES, "eval_math.py")
MANIFEST = "comparison.json"
PROCESSES = "processes.jsonl"
STARTED = ("checkpoints", "initial_eval.json", "metrics.jsonl")  # what a run leaves once it has started


@dataclass(frozen=True)
class Budget:
    steps: int  # GRPO steps of every run
    eval_every: int  # held-out accuracy every this many steps: the curves' points
    eval_count: int  # held-out problems (train_math.py's own, seed 0)
    check_count: int  # eval_math.py's problems of a seed no run trains or evaluates on, greedy
    check_seed: int = 7  # that seed (train_math.py's held-out problems are seed 0's)

    def __post_init__(self):
        for name in ("steps", "eval_every", "eval_count", "check_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"the budget's {name} must be a positive integer, got {getattr(self, name)}")

    def flags(self) -> list[str]:
        """The train_math.py flags that give every run this budget."""
        return [
            "--steps",
            str(self.steps),
            "--eval_every",
            str(self.eval_every),
            "--eval_count",
            str(self.eval_count),
        ]


@dataclass(frozen=True)
class Plan:
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...]
    budget: Budget
    common: tuple[
        str, ...
    ] = ()  # flags every run gets before its variant's (--model models/minigrpo-tiny-countdown, ...)

    def record(self) -> dict:
        """The plan as OUT/comparison.json keeps it: a second comparison into OUT must have the same."""
        return {
            "variants": {variant.name: list(variant.flags) for variant in self.variants},
            "seeds": list(self.seeds),
            "budget": dataclasses.asdict(self.budget),
            "common": list(self.common),
        }

    def runs(self) -> list[tuple[Variant, int]]:
        return [(variant, seed) for variant in self.variants for seed in self.seeds]


def run_dir(out: str, variant: str, seed: int) -> str:
    return os.path.join(out, variant, f"seed-{seed}")


def claim(out: str, plan: Plan) -> None:
    """OUT becomes this plan's: a new or empty directory gets its manifest; one holding the same plan is
    resumed; one holding another comparison, or other files, is a ValueError in one line."""
    path = os.path.join(out, MANIFEST)
    if os.path.exists(path):
        held = read_json_object(path, "a comparison's plan")
        if held != plan.record():
            differs = [key for key in plan.record() if held.get(key) != plan.record()[key]]
            raise ValueError(
                f"{out} holds another comparison (its plan differs in: {', '.join(differs)}); choose "
                "another --output, or rerun with its plan to resume it"
            )
        return
    if os.path.isdir(out) and os.listdir(out):
        raise ValueError(f"{out} is not empty and holds no comparison ({MANIFEST}); choose another --output")
    os.makedirs(out, exist_ok=True)
    replace_json(path, plan.record())


def run_processes(command: list[str], env: dict, stdout: str, stderr: str) -> int:
    """A process of its own, started where this one was (a relative --model means the same there), its
    output appended to the two files; its exit status."""
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        return subprocess.run(command, env=env, stdout=out, stderr=err).returncode


class Comparison:
    """Runs a plan into `out` with `jobs` processes at once, each with `threads` torch threads; `launch`
    starts one command and waits for it (run_processes; the tests hand in one of their own)."""

    def __init__(
        self,
        plan: Plan,
        out: str,
        jobs: int = 2,
        threads: int = 1,
        launch: Callable[[list[str], dict, str, str], int] = run_processes,
        note: Callable[[str], None] = print,
    ):
        self.plan = plan
        self.out = out
        self.jobs = jobs
        self.threads = threads
        self.launch = launch
        self.note = note
        self.lock = threading.Lock()  # processes.jsonl is appended to by every worker
        self.start_lock = threading.Lock()  # the start model is checked by the first worker that needs it

    def run(self) -> None:
        """Every run of the plan that is not finished, then its check, and the start model's check once the
        first run that started from it has finished."""
        claim(self.out, self.plan)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            for future in [pool.submit(self.one_run, variant, seed) for variant, seed in self.plan.runs()]:
                future.result()

    def one_run(self, variant: Variant, seed: int) -> None:
        folder = run_dir(self.out, variant.name, seed)
        if not os.path.exists(os.path.join(folder, "summary.json")):
            self.train(variant, seed, folder)
        if os.path.exists(os.path.join(folder, "summary.json")):
            summary = read_json_object(os.path.join(folder, "summary.json"), "a run's summary")
            self.check_start(summary["args"])
            final = os.path.join(folder, "checkpoints", f"step-{summary['steps']:06d}")
            self.check(final, summary["args"], folder, f"{variant.name}/seed-{seed}")

    def train(self, variant: Variant, seed: int, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        command = [sys.executable, TRAIN, "--output_dir", folder, "--seed", str(seed)]
        command += [*self.plan.budget.flags(), *self.plan.common, *variant.flags, "--no-progress_bar"]
        if any(os.path.exists(os.path.join(folder, name)) for name in STARTED):
            command.append("--resume")  # from its last checkpoint, bit for bit (none: from the start)
        code, error = self.start("train", f"{variant.name}/seed-{seed}", command, folder)
        failed = os.path.join(folder, "failed.json")
        if code != 0:
            replace_json(failed, {"exit": code, "error": error})
            self.note(f"{variant.name} seed {seed} failed (exit {code}): {error}")
        elif os.path.exists(failed):
            os.remove(failed)

    def check_start(self, args: dict) -> None:
        """The start model's check, once per start (model, task and length): the check's baseline."""
        key = hashlib.sha256(json.dumps(check_settings(args), sort_keys=True).encode()).hexdigest()[:12]
        with self.start_lock:  # two workers finishing together check it once
            folder = os.path.join(self.out, "start", key)
            if not os.path.exists(os.path.join(folder, "check.json")):
                self.check(args["model"], args, folder, f"start/{key}")

    def check(self, model: str, args: dict, folder: str, name: str) -> None:
        """eval_math.py greedy on check_count problems of check_seed; its accuracy in folder/check.json."""
        done = os.path.join(folder, "check.json")
        if os.path.exists(done):
            return
        os.makedirs(folder, exist_ok=True)
        rows = os.path.join(folder, "check.jsonl")
        budget = self.plan.budget
        command = [sys.executable, CHECK, "--model", model, "--count", str(budget.check_count)]
        command += ["--seed", str(budget.check_seed), "--num_samples", "1", "--output", rows]
        for flag, value in check_settings(args).items():
            if value is not None and flag != "model":
                command += [f"--{flag}", str(value)]
        code, error = self.start("check", name, command, folder)
        if code != 0:
            self.note(f"check of {name} failed (exit {code}): {error}")
            return
        with open(rows, encoding="utf-8") as f:
            correct = [json.loads(line)["correct"][0] for line in f if line.strip()]
        accuracy = sum(correct) / len(correct)
        replace_json(done, {"accuracy": accuracy, "problems": len(correct), "settings": check_settings(args)})

    def start(self, kind: str, name: str, command: list[str], folder: str) -> tuple[int, str]:
        """One process, logged in processes.jsonl: its exit status and the last line it wrote to stderr."""
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}  # torch's threads, read as it starts
        stderr = os.path.join(folder, f"{kind}.err")
        written = os.path.getsize(stderr) if os.path.exists(stderr) else 0
        began = time.time()
        code = self.launch(command, env, os.path.join(folder, f"{kind}.out"), stderr)
        error = last_line(stderr, written)
        record = {
            "kind": kind,
            "run": name,
            "command": command,
            "exit": code,
            "seconds": round(time.time() - began, 1),
        }
        with self.lock:
            self.append(record)
        return code, error

    def append(self, record: dict) -> None:
        with open(os.path.join(self.out, PROCESSES), "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def check_settings(args: dict) -> dict:
    """The eval_math.py flags of a check, from train_math.py's arguments (summary.json's): the same model,
    task and completion length as the run's."""
    return {
        "model": args["model"],
        "data": args["data"],
        "difficulty": args["difficulty"],
        "template": args["template"],
        "max_new_tokens": args["max_completion_length"],
    }


def last_line(path: str, offset: int) -> str:
    """The last non-empty line written to `path` after `offset` bytes ("" for none)."""
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def processes(out: str) -> list[dict]:
    """The processes a comparison into `out` started, in order (OUT/processes.jsonl)."""
    path = os.path.join(out, PROCESSES)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
