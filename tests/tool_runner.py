"""Runs examples/*.py on many command lines, each in its own process, paying the imports once.

    python tests/tool_runner.py OUT_DIR < cases.json    # [{"name", "script", "argv"[, "cwd"]}, ...]
    python tests/tool_runner.py OUT_DIR transformers trl < cases.json    # those imported first, too

Importing torch and the library costs 2-3 s per process (transformers and TRL, which the benchmarks
measure against, several more); here it is paid once, then every case is a fork that runs its
script as __main__ with its own argv, working directory (the runner's unless it names one), stdout
(OUT_DIR/name.out) and stderr (OUT_DIR/name.err) and ends as the interpreter would:
sys.exit("message") prints the message and exits 1, an uncaught exception prints its traceback,
and the exit handlers the script registered run. Prints {name: exit status} as JSON.
"""

import atexit
import importlib
import json
import os
import runpy
import sys
import traceback

import tokenizers  # noqa: F401  (what the tools import: pretrain_tiny trains a tokenizer)
import torch._dynamo  # noqa: F401  (the first model a process builds imports it: 0.5 s)

import minigrpo.run  # noqa: F401  (the trainer, evaluation, trace and plots: the folder's door imports them)
from minigrpo import GRPOConfig, TrainConfig
from minigrpo.flags import field_comments

for config_class in (
    GRPOConfig,
    TrainConfig,
):  # train_math.py's flags' help, read from source once, not per fork
    field_comments(config_class)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
PARALLEL = 4  # cases running at once


def run(case: dict, out_dir: str) -> int:
    """In the forked process: the script (a file of examples/, or any path) as `python <script> <argv>`
    runs it; its exit status."""
    for fd, suffix in ((1, "out"), (2, "err")):
        file = os.open(
            os.path.join(out_dir, f"{case['name']}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        os.dup2(file, fd)
        os.close(file)
    atexit._clear()  # the handlers inherited from this runner are not the script's to run
    os.chdir(case.get("cwd") or ".")  # where the command is typed: its relative paths start there
    script = os.path.join(EXAMPLES, case["script"])  # an absolute path stays itself
    sys.argv = [script, *case["argv"]]
    sys.path[0] = os.path.dirname(script)  # the script's directory, as the interpreter puts it
    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as stop:  # as the interpreter ends: sys.exit("message") prints it and exits 1
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()  # as the interpreter does before it exits
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def main(out_dir: str, preload: list[str]) -> None:
    for module in preload:
        importlib.import_module(module)
    running, statuses = {}, {}  # pid -> case name, case name -> exit status

    def wait_for_one():
        pid, status = os.wait()
        statuses[running.pop(pid)] = os.waitstatus_to_exitcode(status)

    for case in json.load(sys.stdin):
        if len(running) == PARALLEL:
            wait_for_one()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(run(case, out_dir))
        running[pid] = case["name"]
    while running:
        wait_for_one()
    json.dump(statuses, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
