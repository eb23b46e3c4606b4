"""Stage 2 of the loop, verify: the sandbox supervisor, run as `python -I supervisor.py` by
`programs/code.py`.

Standard library only and importing nothing of minigrpo (isolated mode puts no package on the path):
it reads one job (program, test inputs, limits) as JSON on stdin and writes one report per test
as JSON on stdout; judging the reports against expected outputs happens in the trainer. Its siblings
it loads by their paths: `confine.py` (the test's process), `seccomp.py` (the filter that process
installs), `cleanup.py` (`remove_tree`), `process_io.py` (waits and reads) and `mounts.py` (mount calls,
and what of the interpreter a test still reaches). How a run is confined, the privileges it runs with
and what a hostile program can still do: this folder's door, `__init__.py`.
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
    """`name`.py from this file's directory, loaded by its path. This file runs as `python -I supervisor.py`,
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
