"""The verifier's worker process: `python -m minigrpo.verifier.worker`, driven by `bounded`.

Reads jobs from stdin and writes results to stdout, one length-prefixed pickle frame each:
("match", pred, gold) -> bool, ("reward", response, gold) -> float. It imports sympy, never
torch, caps its own memory, and ignores Ctrl-C (its parent owns it and kills it when a job runs
past its deadline).
"""

from __future__ import annotations

import importlib
import pickle
import resource
import signal
import struct
import sys

MEMORY_LIMIT_BYTES = 4 << 30  # a check that needs more fails (as not equal) instead of swapping

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


def run_job(job):
    from .equivalence import answers_match
    from .extract import extract_answer

    op, first, gold = job
    try:
        if op == "match":
            return answers_match(first, gold)
        answer = extract_answer(first)
        return 1.0 if answer is not None and answers_match(answer, gold) else 0.0
    except (Exception, RecursionError, MemoryError):  # fail closed: not shown equal
        return False if op == "match" else 0.0


def serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ValueError, OSError):
        pass  # a lower hard limit is already in place
    importlib.import_module("minigrpo.verifier.equivalence")  # import sympy before saying ready

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, "ready")
    while (job := read_frame(stdin)) is not None:
        write_frame(stdout, run_job(job))


if __name__ == "__main__":
    serve()
