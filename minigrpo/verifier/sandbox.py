"""Stage 2 of the loop, verify (code): the sandbox supervisor, run as `python -I sandbox.py` by `code.py`.

Standard library only and importing nothing of minigrpo (isolated mode puts no package on the path):
it reads one job (program, test inputs, limits) as JSON on stdin and writes one report per test
as JSON on stdout; judging the reports against expected outputs happens in the trainer. Its siblings
it loads by their paths: `confine.py` (the test's process), `seccomp.py` (the filter that process
installs), `cleanup.py` (`remove_tree`), `process_io.py` (waits and reads) and `mounts.py` (mount calls,
and what of the interpreter a test still reaches).

How a run is sandboxed. `run_cases` (code.py) starts `python -I sandbox.py` (this file) in a fresh
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

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import sys
import tempfile
import types
from contextlib import contextmanager

CLEANUP_SECONDS = 1.0  # time per test to kill and reap what the test left
STDERR_TAIL_BYTES = 4096  # stderr kept per test (its end, where the traceback is)

HOSTNAME = b"sandbox"  # the name a test sees in its UTS namespace, instead of the host's

CLONE_NEWNS = 0x00020000  # unshare() flags, from <linux/sched.h>
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
UNISOLATED_REFUSAL = (
    "the OS refuses the sandbox's namespaces here, so model-written code would run beside the trainer "
    "(its /proc, files and /tmp within reach); SandboxConfig(unisolated=True) runs it anyway"
)
SHARED_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the usual world-writable directories


def _load_sibling(name: str) -> types.ModuleType:
    """`name`.py from this file's directory, loaded by its path. This file runs as `python -I sandbox.py`,
    outside its package: importing minigrpo would pull torch into every sandbox, and the program run here
    later must find sys.path as Python set it. So neither a package import nor a sys.path entry."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_minigrpo_sandbox_{name}", path)  # a private name
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


confine = _load_sibling("confine")  # the forked test process: rlimits, uid, then the program and the test
seccomp = _load_sibling("seccomp")  # the filter the test process installs last
cleanup = _load_sibling("cleanup")  # remove_tree, which code.py also runs on the host
process_io = _load_sibling("process_io")  # waits and reads
mounts = _load_sibling("mounts")  # mount calls, and what of the interpreter stays reachable through them


def main() -> None:
    """Read the job from stdin, run each case in a forked process, write the reports to stdout."""
    job = json.loads(process_io.read_all(0))
    confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGTERM)  # the trainer's death stops us (see _give_up)
    if os.getppid() != job["trainer_pid"]:
        return  # it died before the line above: nobody waits for our reply
    if os.uname().machine not in confine.SYSCALLS:
        return process_io.reply(
            {"error": f"no seccomp filter for {os.uname().machine} (only {', '.join(confine.SYSCALLS)})"}
        )
    # SIGTERM from the trainer's backstop: clean up the running test, then exit
    signal.signal(signal.SIGTERM, _give_up)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered only while waiting for a test
    # this file's directory off sys.path: Python 3.10's -I keeps it
    sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
    # without root, the tests' (same) uid cannot read our memory or file descriptors
    confine.prctl(confine.PR_SET_DUMPABLE, 0)
    # orphans of a test become our children, so we reap them (PID 1 may not)
    confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
    try:
        isolated = _isolate(job)
    except OSError as error:  # fail closed: never run tests in a half-made mount namespace
        return process_io.reply({"error": f"sandbox isolation failed: {error}"})
    job["isolated"] = isolated
    if not isolated and not job["unisolated"]:
        return process_io.reply({"error": UNISOLATED_REFUSAL})
    job["supervisor_pid"] = os.getpid()  # each test checks that we are still its parent
    if job["uid"] is not None:
        if problem := _check_uid(job["uid"]):
            return process_io.reply({"error": problem})
        _kill_all_as(job["uid"])  # whatever an interrupted earlier run left as this uid
    reports = []
    for case in job["cases"]:
        reports.append(_run_case(job, case))
        cleanup.remove_tree(".", keep_top=True)  # each test starts from an empty working directory
    process_io.reply({"reports": reports, "isolated": isolated})


def _give_up(signum, frame):
    raise SystemExit(1)  # raised inside _run_case's wait, so its clean-up runs


@contextmanager
def _sigterm_allowed():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _isolate(job: dict) -> bool:
    """Namespaces of our own: no network, no host name, no host SysV IPC, and a mount namespace in which the
    working directory and the shared writable directories are one small tmpfs (see _mount_scratch).
    Without root (no sandbox uid), first a user namespace, which makes the others ours to create; then
    every other mount read-only, so that no test writes the trainer's files, and a PID namespace with its
    own /proc, so that no test sees the trainer's processes (their environment, memory, descriptors).

    False if the OS refuses the namespaces (then nothing is changed); OSError if a mount fails after that."""
    plain_user = job["uid"] is None
    if plain_user and not _enter_user_namespace():
        return False
    if not _unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC):  # all four or none
        return False
    if confine.LIBC.sethostname(HOSTNAME, len(HOSTNAME)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname in the sandbox's UTS namespace failed")
    confine.limit_ipc(job["scratch_bytes"])
    # private first, or our mounts would show outside
    mounts.mount(None, "/", None, mounts.MS_REC | mounts.MS_PRIVATE)
    if plain_user:
        mounts.read_only_mounts()
    _mount_scratch(job)
    # by descriptor: once /tmp is covered, the directory's own path (/tmp/minigrpo-sandbox-...) no
    # longer resolves, nor does an interpreter that lives there
    directory = os.open(".", os.O_PATH | os.O_DIRECTORY)
    interpreter = {
        path: os.open(path, os.O_PATH | os.O_DIRECTORY)
        for path in mounts.interpreter_under(SHARED_DIRECTORIES)
    }
    for shared in SHARED_DIRECTORIES:
        if os.path.isdir(shared):
            # keeps the tmpfs's size and flags
            mounts.mount(f"/proc/self/fd/{directory}", shared, None, mounts.MS_BIND)
    os.close(directory)
    mounts.show_read_only(interpreter, SHARED_DIRECTORIES)
    if job["uid"] is not None:
        mounts.expose_python(job["uid"])
    if plain_user:
        _become_init_of_a_pid_namespace()
    return True


def _enter_user_namespace() -> bool:
    """A user namespace in which our uid and gid are mapped to themselves: the supervisor holds every
    capability inside it (mounts, namespaces), a test process inherits them but the seccomp filter refuses
    the calls that would use them, and nothing outside grants us more than before. False if refused."""
    uid = os.getuid()
    gid = os.getgid()
    if not _unshare(CLONE_NEWUSER):
        return False
    mappings = (
        ("setgroups", "deny"),  # before gid_map: a process without CAP_SETGID may not write it otherwise
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    )
    for name, text in mappings:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


def _become_init_of_a_pid_namespace() -> None:
    """Go on as PID 1 of a new PID namespace, with a /proc of its own: a test sees its own processes and
    ours only. The process that called this waits for that child, passes on the trainer's SIGTERM and
    exits as it does; the child dies with it. When the child exits, the kernel kills every process left
    in the namespace."""
    if not _unshare(CLONE_NEWPID):
        raise OSError(ctypes.get_errno(), "a PID namespace was refused")
    child = os.fork()
    if child:
        signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        exit_code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        os._exit(exit_code & 0xFF)  # as the child exited (killed by signal n: 256 - n)
    confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
    mounts.mount("proc", "/proc", "proc", mounts.MS_NOSUID | mounts.MS_NODEV | mounts.MS_NOEXEC)


def _mount_scratch(job: dict) -> None:
    """A tmpfs on the working directory, owned by the sandbox uid: at most scratch_bytes and scratch_inodes
    (its pages are memory that no rlimit counts), nothing in it executable, set-uid or a device."""
    owner = job["uid"] if job["uid"] is not None else os.getuid()  # without root: ours, mapped to itself
    options = (
        f"size={job['scratch_bytes']},nr_inodes={job['scratch_inodes']},mode=0700,uid={owner},gid={owner}"
    )
    here = os.getcwd()
    mounts.mount(
        "tmpfs", here, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV | mounts.MS_NOEXEC, options.encode()
    )
    os.chdir(here)  # into the tmpfs, which now covers the directory we were in


def _run_case(job: dict, case: dict) -> dict:
    """Fork the test's process, wait for it up to the timeout, kill and reap everything it left; its
    report."""
    nonce = os.urandom(16).hex().encode()  # fresh per test: a proof from one test says nothing about another
    # the test's stdin, stdout and stderr, unnamed: unreachable by path
    files = [tempfile.TemporaryFile() for _ in range(3)]
    stdin, stdout, stderr = files
    stdin.write(case.get("input", "").encode())
    stdin.seek(0)
    proof_read, proof_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        confine.case_process(job, case, nonce, files, proof_write, seccomp.install_filter)  # never returns
    os.close(proof_write)
    try:
        with _sigterm_allowed():
            timed_out = process_io.wait_for_exit(pid, job["timeout"])
    finally:  # on SIGTERM too: nothing of a test outlives the supervisor
        os.kill(pid, signal.SIGKILL)  # no effect if it has exited: it stays a zombie until waitpid
        _kill_leftovers(pid, job["uid"])  # pid is not reaped yet, so its process group id is still the test's
        exit_code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        process_io.reap_children(CLEANUP_SECONDS)
    out = process_io.read_head(stdout, job["max_output_bytes"] + 1)
    report = {
        "proof": nonce in process_io.drain(proof_read),
        "timed_out": timed_out,
        "exit_code": exit_code,
        "stdout": out[: job["max_output_bytes"]].decode(errors="replace"),
        "stdout_overflow": len(out) > job["max_output_bytes"],
        "stderr": process_io.read_tail(stderr, STDERR_TAIL_BYTES),
    }
    for file in files:
        file.close()
    return report


def _check_uid(uid: int) -> str | None:
    """Why tests cannot run as `uid`, or None."""
    pid = os.fork()
    if pid == 0:
        try:
            confine.become(uid)
            readable = os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK)
            os._exit(0 if readable else 2)
        finally:
            os._exit(1)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status == 1:
        return f"cannot switch to uid {uid}; set SandboxConfig.first_uid to uids that can be used here"
    if status == 2:
        installation = os.path.dirname(os.__file__)
        return f"uid {uid} cannot read the Python installation at {installation}; make it readable"
    return None


def _kill_leftovers(pgid: int, uid: int | None) -> None:
    """SIGKILL the test's process group and, as root, every process of its uid (also those that left the
    group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    if uid is not None:
        _kill_all_as(uid)


def _kill_all_as(uid: int) -> None:
    """kill(-1, SIGKILL) from a process running as `uid`: every process of that uid, at once (a fork cannot
    slip by)."""
    pid = os.fork()
    if pid == 0:
        try:
            confine.become(uid)
            try:
                os.kill(-1, signal.SIGKILL)  # Linux spares the caller itself
            except ProcessLookupError:
                pass
            os._exit(0)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------- small helpers


def _unshare(flags: int) -> bool:
    """unshare(2): False if it is refused, or this libc has none."""
    unshare = getattr(confine.LIBC, "unshare", None)
    return unshare is not None and unshare(flags) == 0


if __name__ == "__main__":
    main()
