"""Stage 2 of the loop, verify: the sandbox supervisor's waits and reads (`supervisor.py`).

In: process ids, descriptors and files. Out: whether a process exited in time (left unreaped), its
children reaped, and bytes: the job on stdin, the reply on stdout, a test's proof pipe and its output files.
It knows processes and files, not tests or sandboxes. Standard library only: `supervisor.py` loads it by its
path.
"""

from __future__ import annotations

import json
import os
import sys
import time


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait for the process to exit, leaving it unreaped; True if the timeout came first."""
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return True
        time.sleep(delay)
        delay = min(2 * delay, 0.005)
    return False


def reap_children(patience: float) -> None:
    """Reap every child until none is left (as root, all are dying); give up after `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def drain(fd: int) -> bytes:
    """What is in a pipe now (its writers are dead), without blocking."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    os.close(fd)
    return b"".join(chunks)


def read_head(file, size: int) -> bytes:
    file.seek(0)
    return file.read(size)


def read_tail(file, size: int) -> str:
    file.seek(max(0, os.fstat(file.fileno()).st_size - size))
    return file.read().decode(errors="replace")


def reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message))
    sys.stdout.flush()
