"""Stage 1 of the loop, rollout: the calculator tool, run in worker processes.

In: an expression a completion wrote. Out: its exact value as text (`calculate`), computed by
calculator_worker.evaluate under its budget in a worker process, or a CalculatorError saying why
there is none, or a TimeoutError. It knows processes and pipes, not tokens, rows or the runner:
registry.py registers it as the "calculator".

Calls run in worker processes (`python -m minigrpo.tools.calculator_worker`, at most PROCESSES, started
when calls need them, reused), never in the trainer's: a call the budget lets through that still
computes too long is stopped by its worker's timer after CPU_LIMIT seconds of that worker's CPU time
(the load on the machine does not count), or, stuck in C code, the worker is killed KILL_AFTER wall
seconds after it took the call; either way the call is answered "timed out" (TimeoutError). These limits
are the one way an answer can depend on more than the call: a call near CPU_LIMIT may finish on one run
and not on another. The budget keeps the calls it allows far below them; some costs lie inside the
parser, out of its reach (the root of a number of thousands of digits). Every worker runs with the same
hash seed, as sympy's work can follow the order of a set. The wait for a free worker is not counted, and
at exit the workers are killed, whatever they are doing."""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading

CPU_LIMIT = 2.0  # seconds of its worker's CPU time a call may take
KILL_AFTER = 10.0  # wall seconds after a worker took a call that it is killed, if the call is not answered
PROCESSES = 4  # workers at most; more calls wait for one, and the wait is not counted against them
STARTUP_LIMIT = 60.0  # seconds a new worker may take to import sympy before that is an error
MEMORY_LIMIT_BYTES = 2 << 30  # a worker's address space: a call that needs more is refused, not swapped


class CalculatorError(ValueError):
    """A call the calculator cannot answer; its message is what the completion is told."""


# --- the trainer's side: workers, and the calls that wait for one ----------------------------------
class _Worker:
    """One worker process (`python -m minigrpo.tools.calculator_worker`) and its pipes."""

    def __init__(self):
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])
        # One hash seed for every worker: sympy's work can follow the order of a set (its assumptions),
        # and with it the cost of a call, which must not depend on the worker that takes it.
        env = dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minigrpo.tools.calculator_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal goes to the trainer, not to its workers
        )

    def wait_ready(self) -> None:
        """Wait until the worker has imported sympy and says so."""
        if self._receive(STARTUP_LIMIT) != "ready":
            self.kill()
            raise RuntimeError(
                f"a calculator worker ({sys.executable} -m minigrpo.tools.calculator_worker) did not start"
            )

    def ask(self, expression: str) -> list | None:
        """The worker's answer to `expression`; None if it has given none KILL_AFTER seconds after."""
        self.process.stdin.write(json.dumps(expression).encode() + b"\n")
        self.process.stdin.flush()
        return self._receive(KILL_AFTER)

    def _receive(self, seconds: float):
        if not select.select([self.process.stdout], [], [], seconds)[0]:
            return None
        line = self.process.stdout.readline()
        return json.loads(line) if line else ["error", "the calculator's worker died"]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # an expression still buffered for a worker that died: nobody will read it
                pass


class _Pool:
    """This process's workers: at most PROCESSES, started when calls need them and reused. A worker that
    has not answered by KILL_AFTER is killed, and so is every worker at exit."""

    def __init__(self):
        self.slots = threading.Semaphore(PROCESSES)  # a call holds one while it holds a worker
        self.lock = threading.Lock()  # guards the three below
        self.idle: list[_Worker] = []
        self.alive: set[_Worker] = set()  # starting, idle or answering a call
        self.closed = False  # at exit: no worker starts any more
        self.pid = os.getpid()  # a forked child must not share these pipes (see _shared_pool)

    def ask(self, expression: str) -> list | None:
        """A worker's answer to `expression` (None: killed at KILL_AFTER); the wait for a free worker,
        and for a new one to start, is not counted."""
        with self.slots:
            worker = self._take()
            answer = None
            try:
                answer = worker.ask(expression)
            finally:
                self._give_back(worker, healthy=answer is not None)
            return answer

    def _take(self) -> _Worker:
        with self.lock:
            if self.closed:
                raise CalculatorError("the calculator has shut down")
            if self.idle:
                return self.idle.pop()
            worker = _Worker()
            self.alive.add(worker)  # from its start, so that close() kills it even before it is ready
        worker.wait_ready()  # outside the lock: the other calls need not wait while it imports sympy
        return worker

    def _give_back(self, worker: _Worker, healthy: bool) -> None:
        with self.lock:
            if healthy and worker in self.alive:  # not killed by close() meanwhile
                self.idle.append(worker)
                return
            self.alive.discard(worker)
        worker.kill()

    def close(self) -> None:
        """Kill every worker, idle or computing; a call waiting on one gets its answer as "died"."""
        with self.lock:
            self.closed = True
            workers = list(self.alive)
            self.alive = set()
            self.idle = []
        for worker in workers:
            worker.process.kill()  # not kill(): a call may be reading its pipes (it closes them itself)
        for worker in workers:
            worker.process.wait()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> _Pool:
    """The process's pool, made on first use (a fresh one in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = _Pool()
        return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None and _pool.pid == os.getpid():
        _pool.close()


def calculate(expression: str) -> str:
    """`evaluate(expression)` in a worker process. Raises CalculatorError for a call it refuses, and
    TimeoutError for one stopped at CPU_LIMIT or KILL_AFTER."""
    answer = _shared_pool().ask(expression) or ["timeout", ""]  # None: killed at KILL_AFTER
    kind, text = answer
    if kind == "timeout":
        raise TimeoutError(f"timed out after {CPU_LIMIT:g} s of computing")
    if kind == "error":
        raise CalculatorError(text)
    return text
