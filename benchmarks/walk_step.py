"""The house, walked: which files one training step enters and how often it crosses between folders.

    python benchmarks/walk_step.py                                  # one default step of train_math.py
    python benchmarks/walk_step.py --example OTHER/examples/train_math.py -- --steps 1 --batch_size 8

It runs the example as a user would (its own flags after `--`; `--steps 1` unless given) and follows the first
`Trainer.train_step` from its entry to its return, the AdamW step included, in the trainer's process: every
Python call into a file of the example's repository is recorded with the nearest repository function above it
(calls through torch, such as nn.Module.__call__, are seen through). The frames above train_step, from the
example's `main` down, are part of the walk too.

What a reader following the calls meets, so each call site counts once, however often it runs:
- files entered: the repository files whose functions the step runs;
- crossings: the distinct caller -> callee pairs whose rooms differ;
- a room is a folder of the package (run/, rollout/, ...), a module at its top (config.py, distributed.py),
  or the example itself.
The math worker's process (the verifier's pool) is not followed: its work starts where the trainer hands it
the completions, and its files are not counted.

Prints the totals and a table per room (files, crossings into it); --json also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--example",
        default=os.path.join(HERE, "..", "examples", "train_math.py"),
        help="the training script to walk; its repository is the folder above its examples/",
    )
    parser.add_argument("--json", default=None, help="also write the counts to this file")
    args, rest = parser.parse_known_args()
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if not os.path.isfile(args.example):
        parser.error(f"--example: no file {args.example}")
    return args, rest


class Walk:
    """The calls of one step between functions of the repository at `root`."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        self.package = os.path.join(self.root, "minigrpo")
        self.files: set[str] = set()  # repository files whose functions ran
        self.edges: set[tuple] = set()  # (caller file, caller function, callee file, callee function)
        self._relative: dict[str, str | None] = {}  # a code object's filename -> its path in the repository

    def relative(self, filename: str) -> str | None:
        """The file's path inside the repository, or None for one outside it (torch, the standard library)."""
        if filename not in self._relative:
            path = os.path.realpath(filename)  # generated code ("<string>", "<frozen ...>") is not a file
            inside = (
                os.path.isfile(path)
                and path.startswith(self.root + os.sep)
                and not path.startswith(os.path.join(self.root, "benchmarks"))
            )
            self._relative[filename] = os.path.relpath(path, self.root) if inside else None
        return self._relative[filename]

    def caller_of(self, frame):
        """The nearest frame above `frame` that runs a repository function, or None."""
        frame = frame.f_back
        while frame is not None and self.relative(frame.f_code.co_filename) is None:
            frame = frame.f_back
        return frame

    def enter(self, frame) -> None:
        callee = self.relative(frame.f_code.co_filename)
        if callee is None:
            return
        self.files.add(callee)
        above = self.caller_of(frame)
        if above is not None:
            caller = self.relative(above.f_code.co_filename)
            self.edges.add((caller, above.f_code.co_qualname, callee, frame.f_code.co_qualname))

    def profile(self, frame, event, arg):
        if event == "call":
            self.enter(frame)

    def enter_stack(self, frame) -> None:
        """The frames from the example's main down to `frame`, as if each had been called while walking."""
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        for each in reversed(stack):
            self.enter(each)


def room(path: str) -> str:
    """minigrpo/run/trainer.py -> run/; minigrpo/config.py -> config.py; examples/x.py -> examples/x.py."""
    parts = path.split(os.sep)
    if parts[0] == "minigrpo" and len(parts) > 2:
        return parts[1] + "/"
    return parts[-1] if parts[0] == "minigrpo" else path


def counts(walk: Walk) -> dict:
    crossings = [(a, b) for a, _, b, _ in walk.edges if room(a) != room(b)]
    rooms: dict[str, dict] = defaultdict(lambda: {"files": 0, "crossings_in": 0})
    for path in walk.files:
        rooms[room(path)]["files"] += 1
    for _, callee in crossings:
        rooms[room(callee)]["crossings_in"] += 1
    return {
        "files_entered": len(walk.files),
        "crossings": len(crossings),
        "call_sites": len(walk.edges),
        "rooms": dict(sorted(rooms.items(), key=lambda item: (-item[1]["crossings_in"], item[0]))),
        "files": sorted(walk.files),
        "crossing_calls": sorted(
            f"{a}:{f} -> {b}:{g}" for a, f, b, g in walk.edges if room(a) != room(b)
        ),  # caller -> callee, file:function
    }


def walk_first_step(example: str, flags: list[str]) -> Walk:
    """Runs `example` with `flags`, walking its first train_step."""
    from minigrpo.run import Trainer

    walk = Walk(os.path.join(os.path.dirname(os.path.abspath(example)), ".."))
    if not os.path.realpath(sys.modules["minigrpo"].__file__).startswith(walk.package):
        sys.exit(
            f"walk_step.py: minigrpo is imported from {sys.modules['minigrpo'].__file__}, not from "
            f"{walk.package}: put the example's repository first on PYTHONPATH"
        )
    original = Trainer.train_step
    walked = []

    def train_step(self, *args, **kwargs):
        if walked:
            return original(self, *args, **kwargs)
        walked.append(True)
        walk.enter_stack(sys._getframe(1))  # the example's main down to the loop that calls the step
        threading.setprofile(walk.profile)
        sys.setprofile(walk.profile)
        try:
            return original(self, *args, **kwargs)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    Trainer.train_step = train_step
    sys.argv = [example, *flags]
    runpy.run_path(example, run_name="__main__")
    if not walked:
        sys.exit("walk_step.py: the example never called Trainer.train_step")
    return walk


def main() -> None:
    args, flags = parse_args()
    if not any(
        flag in ("--steps", "--max_steps") or flag.startswith(("--steps=", "--max_steps=")) for flag in flags
    ):
        flags = ["--steps", "1", *flags]
    walk = walk_first_step(args.example, flags)
    result = counts(walk)
    print(
        f"\none step of {os.path.relpath(args.example, walk.root)}: {result['files_entered']} files entered, "
        f"{result['crossings']} crossings between rooms, {result['call_sites']} call sites"
    )
    print("\n| room | files entered | crossings into it |")
    print("|---|---|---|")
    for name, row in result["rooms"].items():
        print(f"| {name} | {row['files']} | {row['crossings_in']} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
