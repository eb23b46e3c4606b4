"""A test-only launcher: examples/train_math.py in a child process that SIGKILLs itself at a chosen point of a
checkpoint save, a prune, a metrics rewrite or the final rewrite of initial_eval.json. The library has no test
hooks: the child patches the call it dies in (os.rename, torch.save, ...) before train_math starts.

Children fork from a server (`Server`, this file run as a script) that has imported torch and
everything train_math needs (tool_runner.py, which also runs the script; pyplot, for the curves a
finished run plots) but run nothing: a process that has run OpenMP cannot fork safely. A run of a tiny
model then takes a fraction of a second, with no interpreter to start and nothing to import.
"""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import helpers  # noqa: F401  (registers the tests' reward, helpers.VOWELS, which the runs name)
import matplotlib
import tool_runner  # imports torch and what the examples need; runs one as __main__ in a forked process
import torch

matplotlib.use("Agg")  # as plot_curves chooses it
import matplotlib.pyplot  # noqa: E402, F401  (a finished train_math.py run plots its curves)

TIME_LIMIT = 120  # seconds a run may take before the server kills it and reports a time-out


def _kill_at(owner, name: str, path: str, call: int = 1, after: bool = False) -> None:
    """Patch owner.name: its call-th call on a path matching the regex `path` SIGKILLs this process,
    before the call runs or, with `after`, once it has returned."""
    real, calls = getattr(owner, name), itertools.count(1)

    def patched(*args, **kwargs):
        hit = re.search(path, _path_of(args)) and next(calls) == call
        if hit and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(*args, **kwargs)
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, patched)


def _path_of(args) -> str:
    """The last path among a call's arguments (a rename's destination, a file object's name)."""
    for arg in reversed(args):
        if isinstance(arg, (str, os.PathLike)):
            return os.fspath(arg)
        if isinstance(getattr(arg, "name", None), str):
            return arg.name
    return ""


# Where a run of 3 steps that saves every step and keeps 2 checkpoints is killed; the call counts
# are those of a fresh run (the metrics rewrite happens only on resume). Step 3's save prunes step 1.
KILL_POINTS = {
    "save 2: weights written, trainer state not": lambda: _kill_at(
        torch, "save", r"/trainer_state\.pt$", call=2
    ),
    "save 2: every file written and fsynced, not yet renamed into place": lambda: _kill_at(
        os, "rename", r"/step-000002$"
    ),
    "save 2: renamed into place, its directory not fsynced": lambda: _kill_at(
        os, "rename", r"/step-000002$", after=True
    ),
    "prune: step 1 renamed to .deleting-": lambda: _kill_at(
        os, "rename", r"/\.deleting-step-000001$", after=True
    ),
    # rmtree's unlinks: bare names relative to its directory's fd (any other unlink of a run names a path)
    "prune: step 1 half deleted": lambda: _kill_at(os, "unlink", r"^[^/]+$", call=3, after=True),
    "resume: trimmed metrics in a temporary file, not renamed over metrics.jsonl": lambda: _kill_at(
        os, "replace", r"/metrics\.jsonl$"
    ),
    "end: initial_eval.json being rewritten": lambda: _kill_at(json, "dump", r"/initial_eval\.json", call=2),
    # save_pretrained (merge_lora.py's write) into a directory named merged
    "save_pretrained: every file written, not yet renamed into place": lambda: _kill_at(
        os, "rename", r"/merged$"
    ),
}


def _wait(pid: int) -> int | None:
    """The child's exit code (-9 for SIGKILL), or None once it has run past TIME_LIMIT (it is killed)."""
    deadline = time.monotonic() + TIME_LIMIT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def serve() -> None:
    """One job a line on stdin (JSON: script, args, kill point, log directory, name, working directory), each
    run in a forked child with its stdout and stderr in log_dir/name.out and .err; one answer a line on
    stdout: its exit code, or "timeout"."""
    for line in sys.stdin:
        script, args, kill_point, log_dir, name, cwd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            if kill_point is not None:
                KILL_POINTS[kill_point]()
            os._exit(tool_runner.run({"name": name, "script": script, "argv": args, "cwd": cwd}, log_dir))
        code = _wait(pid)
        print("timeout" if code is None else code, flush=True)


class Server:
    """The fork server as a test sees it: train_math(args, kill_point, ...) -> exit code (-9: killed)."""

    def __init__(self):
        # a tiny model on a busy machine: a second thread only spins
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
        }
        # runs start where a user would run them
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
        )

    def train_math(self, args: list[str], kill_point: str | None, log_dir: str, name: str) -> int:
        """examples/train_math.py *args, killed at kill_point; its output in log_dir/name.out and .err."""
        return self.run("train_math.py", args, log_dir, name, kill_point)

    def run(
        self,
        script: str,
        args: list[str],
        log_dir: str,
        name: str,
        kill_point: str | None = None,
        cwd: str | None = None,
    ) -> int:
        """`python script *args` (a file of examples/, or a path) as a forked child, typed in `cwd` (None:
        the repository's root): its exit code (-9: killed)."""
        self.process.stdin.write(json.dumps([script, args, kill_point, log_dir, name, cwd]) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer in ("", "timeout"):
            raise RuntimeError(
                f"{script} {' '.join(args)}: {'ran past the time limit' if answer else 'the server died'}"
            )
        return int(answer)

    def close(self) -> None:
        self.process.kill()  # it holds nothing: no need to wait while it tears torch down
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


if __name__ == "__main__":
    serve()
