"""Stage 2 of the loop, reward: math checks that always come back within a deadline.

In: (answer, gold) or (response, gold) pairs. Out: a bool or a 0/1 reward per pair, each within
`TIME_LIMIT` seconds of wall time whatever the input, never an exception. The checks run in
worker processes (`worker.py`, plain subprocesses that import sympy but never torch) that are
killed and replaced when one runs past its deadline: the answer is then "not equal". This is the
backstop; `parse` already refuses oversized work from estimates, so kills are rare.

Why processes and not `signal.alarm`: an alarm works only on the main thread, and it cannot
interrupt C code such as big-integer arithmetic, which is exactly where a hostile answer hangs.

Starting the workers (once per process, about half a second for importing sympy) is not counted
against a check's deadline; a spare worker is kept warm so that a kill costs the next check nothing.
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import tempfile
import threading
import time

from .worker import read_frame, write_frame

TIME_LIMIT = 1.0  # seconds of wall time a single check may take, end to end
WORK_LIMIT = 0.8  # seconds a worker may spend on one check before it is killed
STARTUP_LIMIT = 60.0  # seconds a new worker may take to import sympy before that is an error


class VerifierError(RuntimeError):
    """The worker processes could not be started (not a property of any answer)."""


class _Worker:
    """One worker subprocess and its pipes."""

    def __init__(self):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
        self.stderr = tempfile.TemporaryFile()  # read only to explain a worker that failed to start
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minigrpo.verifier.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal goes to the trainer, not to the workers
        )
        self.ready = False
        self.deadline = None  # when the job it holds must be done; None when idle

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not _readable(self.process.stdout, STARTUP_LIMIT) or read_frame(self.process.stdout) != "ready":
            self.kill()
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
            raise VerifierError(f"a verifier worker ({sys.executable} -m minigrpo.verifier.worker) did not start: {tail}")
        self.ready = True

    def send(self, job, time_limit: float) -> None:
        write_frame(self.process.stdin, job)
        self.deadline = time.monotonic() + time_limit

    def receive(self):
        self.deadline = None
        return read_frame(self.process.stdout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            try:
                stream.close()
            except OSError:  # a frame still buffered for a worker that died: nobody will read it
                pass


def _readable(stream, timeout: float) -> bool:
    return bool(select.select([stream], [], [], max(timeout, 0.0))[0])


class WorkerPool:
    """`size` workers plus one warm spare; `run` spreads jobs over them, each with its own deadline."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        self.workers = [_Worker() for _ in range(size)]
        self.spare = _Worker()
        self.lock = threading.Lock()

    def run(self, jobs: list, failed, time_limit: float = WORK_LIMIT) -> list:
        """The result of each job, in order; `failed` for a job that ran out of time or crashed."""
        with self.lock:
            results = [failed] * len(jobs)
            pending = list(range(len(jobs)))[::-1]
            busy, sends = {}, [0] * len(jobs)  # worker -> index of the job it holds; send attempts per job
            try:
                while pending or busy:
                    for slot in range(len(self.workers)):
                        if self.workers[slot] not in busy and pending:
                            index = pending.pop()
                            sends[index] += 1
                            if self._send(slot, jobs[index], time_limit):
                                busy[self.workers[slot]] = index
                            elif sends[index] < 2:
                                pending.append(index)  # once more, on the replacement
                    self._collect(busy, results)
            except BaseException:  # interrupted: no answer may arrive late into the next call
                for worker in list(busy):
                    self._replace(worker)
                raise
            return results

    def _send(self, slot: int, job, time_limit) -> bool:
        """Hand `job` to the worker in `slot`; False (and the worker replaced) if it has died."""
        worker = self.workers[slot]
        try:
            worker.wait_ready()  # a spare that replaced a killed worker may still be importing
            worker.send(job, time_limit)
            return True
        except VerifierError:
            self.workers[slot], self.spare = self.spare, _Worker()  # never leave a dead worker in place
            raise
        except OSError:  # BrokenPipeError: it died while idle
            self._replace(worker)
            return False

    def _collect(self, busy: dict, results: list) -> None:
        """Wait until some busy worker answers or passes its deadline; record what happened."""
        if not busy:
            return
        first_deadline = min(w.deadline for w in busy)
        ready = select.select([w.process.stdout for w in busy], [], [], max(first_deadline - time.monotonic(), 0.0))[0]
        for worker in list(busy):
            if worker.process.stdout in ready:
                result = worker.receive()
                index = busy.pop(worker)
                if result is None:  # the worker died (a crash in C code, the memory cap)
                    self._replace(worker)
                else:
                    results[index] = result
            elif time.monotonic() >= worker.deadline:
                busy.pop(worker)
                self._replace(worker)

    def _replace(self, worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = self.spare
        self.spare = _Worker()

    def close(self) -> None:
        for worker in self.workers + [self.spare]:
            worker.kill()
        self.workers = []


_pools: dict[int, WorkerPool] = {}
_pools_lock = threading.Lock()


def worker_pool(size: int) -> WorkerPool:
    """The process-wide pool with `size` workers, started on first use and stopped at exit."""
    with _pools_lock:
        if size not in _pools:
            _pools[size] = WorkerPool(size)
        return _pools[size]


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close()
    _pools.clear()


def default_workers() -> int:
    """One worker per CPU, at most 8: each holds sympy (~55 MB), and checks take milliseconds."""
    return max(1, min(os.cpu_count() or 1, 8))


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether two extracted answers are equal (see `equivalence`); False on time-out or bad input."""
    if not (isinstance(pred, str) and isinstance(gold, str)):
        return False
    return bool(worker_pool(1).run([("match", pred, gold)], failed=False)[0])


def math_reward(response: str, gold: str) -> float:
    """1.0 when the final answer of `response` equals `gold`, else 0.0 (no answer, time-out, bad input)."""
    return math_rewards([response], [gold], workers=1)[0]


def math_rewards(responses: list[str], golds: list[str], workers: int | None = None) -> list[float]:
    """`math_reward` for many pairs at once, spread over `workers` processes (default: one per CPU, up to 8)."""
    if len(responses) != len(golds):
        raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
    jobs = [
        ("reward", r, g) if isinstance(r, str) and isinstance(g, str) else ("reward", "", "")
        for r, g in zip(responses, golds)
    ]
    if not jobs:
        return []
    pool = worker_pool(workers or default_workers())
    return [float(x) for x in pool.run(jobs, failed=0.0)]
