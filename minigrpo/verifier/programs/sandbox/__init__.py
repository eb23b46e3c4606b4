"""Stage 2 of the loop, verify: the Linux sandbox every program of a code reward runs in.

The rule of this folder: standard library only, and nothing of minigrpo. `supervisor.py` runs as
`python -I supervisor.py` (isolated mode puts no package on the path) and loads its siblings by their
paths, neither as a package nor through sys.path: `confine.py` (the process of one test), `seccomp.py`
(the filter that process installs last), `cleanup.py` (`remove_tree`), `process_io.py` (waits and
reads) and `mounts.py` (mount calls, and what of the interpreter a test still reaches). The trainer's
side, programs/code.py, enters through the names below: the supervisor's file and its clean-up time,
`remove_tree`, and `sandbox_config.py`'s limits (`SandboxConfig`) and reports (`CaseResult`).

How a run is sandboxed. `run_cases` (programs/code.py) starts `python -I supervisor.py` in a fresh
temporary directory with a scrubbed environment, handing it the lock of its uid. The supervisor, still
root if the trainer is, asks for SIGTERM when the trainer dies (and exits if it already has), becomes a
child subreaper and unshares four namespaces: network (no network, not even 127.0.0.1; no abstract UNIX
socket of the host), UTS (host name "sandbox"), SysV IPC, and mount, in which a tmpfs of at most
scratch_bytes and scratch_inodes, mounted noexec, nosuid and nodev, covers the working directory and is
also /tmp, /var/tmp, /dev/shm and /run/lock; of what it hides, only the interpreter's own directories
come back, read-only (mounts.py). Not root, it first enters a user namespace, which makes
those its own to create, then makes every other mount read-only and goes on as PID 1 of a PID namespace
with its own /proc. Where the OS refuses the namespaces it runs no test, unless the job says `unisolated`
(code.py then warns once); once it has a mount namespace, a mount that fails ends the run with an error,
so the shared directories are never silently the host's. Per test it forks a process (confine.py) that
joins a fresh session keyring and a fresh IPC namespace (its segments die with the test; shared memory at
most scratch_bytes), sets the rlimits, drops to an unprivileged uid, dies with the supervisor, installs
the seccomp filter (seccomp.py's docstring lists what it refuses), and runs the program, then the test;
afterwards everything left of the test is killed and reaped, and the directory emptied by `remove_tree`
(cleanup.py), which no depth, permission or symlink stops. The trainer's own backstop only matters if the
supervisor falls far behind (SIGTERM, SIGKILL).

Privileges. As root, each concurrent sandbox gets a uid of its own (`first_uid`, `first_uid + 1`, ...,
held by a lock file in /run, so also across processes whatever their TMPDIR: two trainers or every rank
of a torchrun job on one node; the supervisor holds the lock too, and a uid that any process still runs
as is skipped) rather than the shared `nobody`: RLIMIT_NPROC then counts one sandbox's processes,
`kill(-1)` as that uid removes all it left (also processes that left the group), sandboxes cannot
signal or read one another, and `kill(-1)` cannot hit system daemons that run as nobody. The uid owns
only the sandbox's tmpfs; where a directory closed to it lies on the interpreter's way (/root above
pyenv, a venv made in `mktemp -d`), that directory is rebuilt holding only the entries on the way
(mounts.py's docstring says which, and why). Not root: no uid change; the seccomp filter, the
keyring, rlimits, timeouts and process-group kills still apply, and the user, mount and PID namespaces
above stand in for the uid: the trainer's processes are not in the tests' /proc and its files are on
read-only mounts, while RLIMIT_NPROC counts every process of the trainer's uid.

What a hostile program can still do. Assert tests trust the objects the program returns (an `add` whose
result compares equal to anything passes `assert add(1, 2) == 3`), and a program that introspects the
harness (frames, gc, sys.settrace, ctypes) can find the nonce that proves a test ran to its end;
stdin/stdout tests are judged in the trainer and have neither weakness. A program can read
world-readable files (a dataset's answers too, if they are world-readable on disk), the host's /proc
(command lines, CPU and memory figures) and /sys, read the interpreter's directories that mounts.py shows
again (read-only: under /tmp whole, through a directory closed to the uid only the entries on the way),
and write to world-writable places other than the
four above. Memory: max_processes times memory_bytes of address space, plus what no rlimit counts: the
tmpfs (scratch_bytes), SysV shared memory (scratch_bytes), message queues (32 of 16 KiB) and kernel
buffers of pipes and socketpairs (bounded through max_open_files per process; benchmarks/README.md has
the figure), each until the test ends; there is no cgroup. Without root it can also read whatever the
trainer's uid can read on disk. Unisolated (opted in), it can read the trainer's /proc/<pid>/environ
and /proc/<pid>/mem, write to its files, the real /tmp and other writable directories, share the host's
SysV IPC, and leave behind processes that called setsid.
"""

from . import supervisor
from .cleanup import remove_tree
from .sandbox_config import SANDBOX_UIDS, CaseResult, SandboxConfig
from .supervisor import CLEANUP_SECONDS

__all__ = ["CLEANUP_SECONDS", "SANDBOX_UIDS", "CaseResult", "SandboxConfig", "remove_tree", "supervisor"]
