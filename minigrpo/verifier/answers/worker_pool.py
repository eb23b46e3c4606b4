"""Stage 2 of the loop, verify: the worker processes that bound every math check in time.

In: jobs for `math_worker.py`, ("match", answer, gold) or ("reward", response, gold). Out: each job's result,
or `failed` for one that ran past its deadline, got no worker in time or crashed: never an exception about
the answer, each within `TIME_LIMIT` seconds of wall time whatever the input (a batch within its
`batch_budget`), and however many threads check at the same time. It knows processes, pipes and deadlines,
not answers: what a job computes is `math_worker.py`'s, which jobs a check sends is `math_reward.py`'s.

The workers (`math_worker.py`, plain subprocesses that import sympy but never torch) are killed and replaced
when one runs past its deadline: the answer is then "not equal". This is the backstop: `parse` already
refuses oversized work from estimates, and a worker stops a job itself when the job's time is up (a timer,
see `math_worker`), so only a job stuck in C code costs a kill and a restart.

One pool of workers serves every caller in the process. A check takes a free worker from a shared
list, starting another while fewer than MAX_WORKERS are alive, and gives it back when done. Its
deadline counts from the call (a batch's job i, of n in flight, gets i // n + 1 times TIME_LIMIT),
so waiting for a worker is part of it: a check that gets no worker in time fails closed
("not equal"), and a worker that a check gets late has only what is left of the deadline. Under
many concurrent hostile checks this gives up answers to keep the bound, never the other way round.

A batch (`run_batch`, behind `math_rewards`) has one budget for all its rows, `batch_budget`, rather than one
TIME_LIMIT per row, so that a policy writing slow answers cannot make the batch slow. Every row
first gets SHORT_LIMIT of CPU time, which is enough for almost every answer. The rows still unfinished
then share what is left of the budget equally (at most WORK_LIMIT each), and those that do not
finish in their share fail closed and are counted as timed out (`Scores.timed_out`). A benign
answer that SHORT_LIMIT is enough for is never held up by the slow ones: the first pass answers it.

Why processes and not only a timer signal: a signal reaches only the main thread, and it cannot
interrupt C code such as big-integer arithmetic, which is exactly where a hostile answer hangs. The
worker's timer runs in its own main thread and stops Python code; the kill stops the rest.

Starting the first worker (once per process, about half a second for importing sympy) is not
counted against any deadline; a spare starts beside it, and a killed worker's replacement starts
at once, in the background. Callers that will check from many threads at once can start workers
ahead with `shared_pool().reserve(n)` (outside this folder: `start_math_workers`).
"""

from __future__ import annotations

import atexit
import collections
import os
import select
import subprocess
import sys
import tempfile
import threading
import time

from .math_worker import OUT_OF_TIME, read_frame, write_frame

TIME_LIMIT = 1.0  # seconds of wall time a single check may take, end to end, waiting for a worker included
WORK_LIMIT = 0.8  # seconds a worker may spend on one check (a batch's slow rows share what is left)
SHORT_LIMIT = 0.02  # seconds of CPU every row of a batch gets first, above the corpus' p99 (bench_verifier)
KILL_GRACE = 0.1  # seconds past its own timer before a worker is killed (it stops itself unless in C code)
WALL_PER_CPU = 2  # wall seconds a job may take per second of its CPU timer: a busy machine shares the CPU
STARTUP_LIMIT = 60.0  # seconds a new worker may take to import sympy before that is an error
MAX_WORKERS = 16  # workers alive at most in one process; each holds a sympy of its own
POLL_SECONDS = 0.01  # how often a call with checks in flight looks for a free worker for the next one


class VerifierError(RuntimeError):
    """The worker processes could not be started (not a property of any answer)."""


class _Worker:
    """One worker subprocess and its pipes."""

    def __init__(self):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
        self.stderr = tempfile.TemporaryFile()  # read only to explain a worker that failed to start
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "minigrpo.verifier.answers.math_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal goes to the trainer, not to the workers
            )
        except OSError as error:  # no such interpreter, no processes left
            self.stderr.close()
            command = f"{sys.executable} -m minigrpo.verifier.answers.math_worker"
            raise VerifierError(f"a verifier worker ({command}) did not start: {error}") from None
        self.ready = False
        self.deadline = None  # when the job it holds must be done; None when idle

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not _readable(self.process.stdout, STARTUP_LIMIT) or read_frame(self.process.stdout) != "ready":
            self.process.kill()
            self.process.wait()
            self.stderr.seek(0)  # before kill() closes it (reading a closed file raises ValueError)
            tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
            self.kill()
            raise VerifierError(
                f"a verifier worker ({sys.executable} -m minigrpo.verifier.answers.math_worker) did not "
                f"start: {tail}"
            )
        self.ready = True

    def send(self, job, seconds: float, deadline: float) -> None:
        """Give the worker `job` to stop itself after `seconds` of CPU time; it is killed if it has not
        answered by `deadline`."""
        write_frame(self.process.stdin, (*job, seconds))
        self.deadline = deadline

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
    """Workers shared by every caller: a free list, grown on demand up to `max_workers` alive.

    `run` is safe to call from many threads at once; each call holds the workers of its checks in
    flight and nothing else, so one caller's slow checks never hold up another's."""

    def __init__(self, max_workers: int = MAX_WORKERS):
        if max_workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {max_workers}")
        self.max_workers = max_workers
        self.changed = threading.Condition()  # guards everything below; notified when a worker frees or fails
        self.free: list[_Worker] = []  # ready and idle
        self.alive = 0  # free, busy with a check, or still starting
        self.starting = 0  # started in the background, not yet ready
        self.waiting = 0  # checks waiting for a free worker
        self.every: set[_Worker] = set()  # every live worker, for close()
        self.error: VerifierError | None = None  # why the last start failed; raised to the next waiting check
        self.closed = False
        self.pid = os.getpid()  # a forked child must not share these pipes (see shared_pool)
        first = _Worker()  # the first start is outside any deadline
        first.wait_ready()
        self.free.append(first)
        self.every.add(first)
        self.alive = 1
        with self.changed:
            if max_workers > 1:
                self._start_one()  # the warm spare: a kill or a second caller costs no start

    def run(self, jobs: list, failed, parallel: int = 1, work_limit: float = WORK_LIMIT) -> list:
        """The result of each job, in order; `failed` for one that ran out of time, got no worker or crashed.

        At most `parallel` of the jobs are in flight at once (and no more than the pool's workers),
        and job i is answered within (i // in_flight + 1) * TIME_LIMIT of the call, waiting for a
        worker included: a single check, or a batch no larger than what is in flight, within
        TIME_LIMIT. A worker may spend at most `work_limit` of that on a job."""
        results = self._run(jobs, failed, parallel, work_limit, TIME_LIMIT, until=float("inf"))
        return [failed if result == OUT_OF_TIME else result for result in results]

    def run_batch(self, jobs: list, failed, parallel: int = 1) -> tuple[list, list[bool]]:
        """The result of each job, and whether it ran out of time, within `batch_budget` of the call.

        Every job first gets SHORT_LIMIT of work; those it was not enough for share what is left of
        the budget (`_share`) in a second pass, and those still unfinished are `failed`."""
        in_flight = self._in_flight(parallel)
        end = time.monotonic() + batch_budget(len(jobs), in_flight)
        results = self._run(jobs, failed, parallel, SHORT_LIMIT, TIME_LIMIT, end)
        slow = [i for i, result in enumerate(results) if result == OUT_OF_TIME]
        work = self._share(len(slow), in_flight, end)
        if slow and work > SHORT_LIMIT:  # a share no longer than the first try would only repeat it
            again = self._run([jobs[i] for i in slow], failed, parallel, work, work + KILL_GRACE, end)
            for i, result in zip(slow, again):
                results[i] = result
        timed_out = [result == OUT_OF_TIME for result in results]
        results = [failed if out else result for result, out in zip(results, timed_out)]
        return results, timed_out

    def _in_flight(self, parallel: int) -> int:
        return max(1, min(parallel, self.max_workers))

    @staticmethod
    def _share(slow: int, in_flight: int, end: float) -> float:
        """Seconds of work for each of `slow` jobs, `in_flight` at once, so that all end by `end`."""
        if not slow:
            return 0.0
        rounds = -(-slow // in_flight)  # ceil
        return min(WORK_LIMIT, (end - time.monotonic()) / rounds - KILL_GRACE)

    def _run(self, jobs: list, failed, parallel: int, work_limit: float, slot: float, until: float) -> list:
        """`run`'s loop: job i's deadline is (i // in_flight + 1) * slot from the call, and never past
        `until`. A job keeps OUT_OF_TIME if its worker stopped it, it passed its deadline or it got no
        worker in time; `failed` if its worker died."""
        results = [OUT_OF_TIME] * len(jobs)
        waiting = collections.deque(range(len(jobs)))  # jobs not yet sent
        busy = {}  # worker -> index of the job it holds
        in_flight = self._in_flight(parallel)
        start = time.monotonic()
        # each deadline counts from the call
        deadlines = [min(start + (i // in_flight + 1) * slot, until) for i in range(len(jobs))]
        try:
            while waiting or busy:
                self._dispatch(jobs, waiting, busy, parallel, deadlines, work_limit)
                self._collect(busy, results, failed, poll=bool(waiting) and len(busy) < parallel)
        except BaseException:  # interrupted: no answer may arrive late into the next call
            for worker in busy:
                self._discard(worker)
            raise
        return results

    def _dispatch(self, jobs, waiting, busy, parallel, deadlines, work_limit) -> None:
        """Send waiting jobs to free workers, in order, up to `parallel` in flight. With nothing in
        flight, wait for a worker until the next job's deadline (a job that gets none, or gets one
        too late to do any work, keeps OUT_OF_TIME); otherwise take only workers that are free now."""
        while waiting and len(busy) < parallel:
            deadline = deadlines[waiting[0]]
            worker = self._take(deadline if not busy else 0.0)
            if worker is None:
                if busy:
                    return
                waiting.popleft()  # no worker in time, nothing in flight: fail closed
                continue
            # the worker's own timer: it stops itself before the kill
            seconds = min(work_limit, deadline - time.monotonic() - KILL_GRACE)
            if seconds <= 0:
                self._give_back(worker)
                waiting.popleft()  # no time left to do any work: fail closed
                continue
            kill_at = min(time.monotonic() + WALL_PER_CPU * seconds + KILL_GRACE, deadline)
            try:
                worker.send(jobs[waiting[0]], seconds, kill_at)
            except OSError:  # BrokenPipeError: it died while idle; the job waits for another worker
                self._discard(worker)
                continue
            busy[worker] = waiting.popleft()

    def _collect(self, busy: dict, results: list, failed, poll: bool) -> None:
        """Wait until some busy worker answers or passes its deadline (at most POLL_SECONDS when
        `poll`: jobs wait for a free worker); record what happened and give the workers back."""
        if not busy:
            return
        timeout = max(min(w.deadline for w in busy) - time.monotonic(), 0.0)  # until the first deadline
        if poll:
            timeout = min(timeout, POLL_SECONDS)
        ready = select.select([w.process.stdout for w in busy], [], [], timeout)[0]
        for worker in list(busy):
            if worker.process.stdout in ready:
                result = worker.receive()
                index = busy.pop(worker)
                if result is None:  # the worker died (a crash in C code, the memory cap)
                    results[index] = failed
                    self._discard(worker)
                else:
                    results[index] = result
                    self._give_back(worker)
            elif time.monotonic() >= worker.deadline:
                busy.pop(worker)
                self._discard(worker)

    # -- the free list --------------------------------------------------------------------------
    def _take(self, deadline: float):
        """A ready, idle worker, waiting for one until `deadline` (time.monotonic()); None if none frees
        in time. A worker is started for each waiting check beyond those already starting."""
        with self.changed:
            self.waiting += 1
            try:
                while not self.free:
                    self._raise_start_error()
                    if self.starting < self.waiting and self.alive < self.max_workers:
                        self._start_one()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self.changed.wait(remaining)
                return self.free.pop()
            finally:
                self.waiting -= 1

    def _raise_start_error(self) -> None:
        """Raise why a worker failed to start, once (called with `changed` held): the next check tries
        again."""
        error = self.error
        self.error = None
        if error is not None:
            raise error

    def _give_back(self, worker) -> None:
        with self.changed:
            self.free.append(worker)
            self.changed.notify()

    def _discard(self, worker) -> None:
        """Kill a worker that ran past its deadline or died, and start its replacement."""
        worker.kill()
        with self.changed:
            self.every.discard(worker)
            self.alive -= 1
            if not self.closed:
                self._start_one()

    def _start_one(self) -> None:
        """Start a worker in the background; it joins the free list once it has imported sympy.
        Called with `changed` held."""
        self.alive += 1
        self.starting += 1
        threading.Thread(target=self._bring_up, name="verifier-worker-start", daemon=True).start()

    def _bring_up(self) -> None:
        worker = None
        error = None
        try:
            worker = _Worker()
            worker.wait_ready()
        except VerifierError as failure:
            error = failure
        with self.changed:
            self.starting -= 1
            if error is None and not self.closed:
                self.free.append(worker)
                self.every.add(worker)
                self.error = None
            else:
                self.alive -= 1
                self.error = error
            self.changed.notify_all()
        if worker is not None and (error is not None or self.closed):
            worker.kill()

    def reserve(self, count: int) -> None:
        """Start workers until `count` (at most max_workers) are alive, and wait until they are ready:
        for callers about to check from `count` threads at once. Not counted against any deadline."""
        with self.changed:
            while self.alive < min(count, self.max_workers):
                self._start_one()
            while self.starting and self.error is None:
                self.changed.wait()
            self._raise_start_error()

    def close(self) -> None:
        with self.changed:
            self.closed = True
            workers = list(self.every)
            self.every = set()
            self.free = []
        for worker in workers:
            worker.kill()


def batch_budget(rows: int, in_flight: int) -> float:
    """Seconds a batch of `rows` checks, `in_flight` at once, may take: room for every row's first
    check, were all of them slow, and one TIME_LIMIT for the slow ones. A batch no larger than
    what is in flight has TIME_LIMIT, as a single check has."""
    rounds = -(-rows // in_flight)  # ceil
    return TIME_LIMIT + SHORT_LIMIT * (rounds - 1)


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool, started on first use and stopped at exit (a fresh one after a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = WorkerPool()
        return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None and _pool.pid == os.getpid():
        _pool.close()


def default_workers() -> int:
    """One check in flight per CPU, at most 8: checks take milliseconds, and each worker holds sympy."""
    return max(1, min(os.cpu_count() or 1, 8))
