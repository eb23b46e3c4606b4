"""Stage 2 of the loop, verify: the math worker process, `python -m minigrpo.verifier.answers.math_worker`,
driven by `worker_pool`.

Reads jobs from stdin and writes results to stdout, one length-prefixed pickle frame each: ("match", pred,
gold, seconds) -> bool, ("reward", response, gold, seconds) -> float, or OUT_OF_TIME once the job has used
`seconds` of CPU time (a timer interrupts it: the worker lives on, with no restart to pay; CPU time, so that
other processes on a busy machine do not count). It imports sympy, never torch, caps its own memory, and
ignores Ctrl-C. Its parent owns it and kills it when a job runs well past its deadline: the timer cannot stop
C code.
"""

from __future__ import annotations

import importlib
import pickle
import resource
import signal
import struct
import sys

MEMORY_LIMIT_BYTES = 4 << 30  # a check that needs more fails (as not equal) instead of swapping
# run once before the worker says it is ready, outside any deadline: sympy's first polynomial, root and
# decimal are slow, and no check's deadline should pay for them
WARM_UP = [("(x+1)^2", "x^2+2x+1"), (r"\frac{\sqrt{2}}{2}", r"\sin(\pi/4)"), ("0.3333333", r"\frac13")]
OUT_OF_TIME = "out of time"  # the answer to a job its timer stopped (compared with ==: it is unpickled)

_HEADER = struct.Struct(">I")


def read_frame(stream):
    """One pickled object from `stream`, or None at end of file."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def write_frame(stream, value) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


class OutOfTime(BaseException):
    """Raised by the job timer. A BaseException, so that no `except Exception` in sympy swallows it."""


def _out_of_time(signum, frame):
    raise OutOfTime


def run_job(job):
    """The job's answer, or OUT_OF_TIME once it has used its seconds of CPU time."""
    op, first, gold, seconds = job
    try:
        signal.setitimer(signal.ITIMER_PROF, seconds)
        try:
            return _check(op, first, gold)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except OutOfTime:  # the timer fires once, wherever in here it lands
        return OUT_OF_TIME


def _check(op: str, first: str, gold: str):
    from ..extract import extract_answer
    from .equivalence import answers_match

    try:
        if op == "match":
            return answers_match(first, gold)
        answer = extract_answer(first)
        return 1.0 if answer is not None and answers_match(answer, gold) else 0.0
    except (Exception, RecursionError, MemoryError):  # fail closed: not shown equal
        return False if op == "match" else 0.0


def serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, _out_of_time)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ValueError, OSError):
        pass  # a lower hard limit is already in place
    # import sympy before saying ready
    equivalence = importlib.import_module("minigrpo.verifier.answers.equivalence")
    for pred, gold in WARM_UP:
        equivalence.answers_match(pred, gold)

    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    write_frame(stdout, "ready")
    while (job := read_frame(stdin)) is not None:
        write_frame(stdout, run_job(job))


if __name__ == "__main__":
    serve()
