"""Stage 2 of the loop, verify (code): the sandbox supervisor, run as `python -I sandbox.py` by `code.py`.

Standard library only and importing nothing of minigrpo (isolated mode puts no package on the path):
it reads one job (program, test inputs, limits) as JSON on stdin and writes one report per test
as JSON on stdout; judging the reports against expected outputs happens in the trainer.

How a run is sandboxed. `run_cases` (code.py) starts `python -I sandbox.py` (this file) in a fresh
temporary directory with a scrubbed environment. The supervisor, still root if the trainer is, becomes a
child subreaper and unshares a network namespace (no network, not even 127.0.0.1) and a mount namespace
in which /tmp, /var/tmp, /dev/shm and /run/lock are the sandbox directory; steps the OS refuses are
skipped. Per test it forks a process that sets the rlimits, drops to an unprivileged uid and runs the
program, then the test; afterwards everything left of the test is killed and reaped, and the directory
emptied. The trainer's own backstop only matters if the supervisor falls far behind (SIGTERM, SIGKILL).

Privileges. As root, each concurrent sandbox gets a uid of its own (`first_uid`, `first_uid + 1`, ...)
rather than the shared `nobody`: RLIMIT_NPROC then counts one sandbox's processes, `kill(-1)` as that uid
removes all it left (also processes that left the group), sandboxes cannot signal or read one another,
and `kill(-1)` cannot hit system daemons that run as nobody. The uid owns only the sandbox directory.
Not root: no uid change and no namespaces; rlimits, timeouts and process-group kills still apply.

What a hostile program can still do. Assert tests trust the objects the program returns (an `add` whose
result compares equal to anything passes `assert add(1, 2) == 3`), and a program that introspects the
harness (frames, gc, sys.settrace, ctypes) can find the nonce that proves a test ran to its end;
stdin/stdout tests are judged in the trainer and have neither weakness. A program can read
world-readable files (a dataset's answers too, if they are world-readable on disk) and /proc entries such
as command lines, write to world-writable places other than the four above, use CPU and memory up to
max_processes times the per-process limits, and fill the disk with many files of up to file_size_bytes
until its timeout. Two trainers on one machine must not share a uid block. Without root it can also read
the trainer's /proc/<pid>/environ, write to the real /tmp, and leave behind processes that called setsid.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
import resource
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
import types
from contextlib import contextmanager

CLEANUP_SECONDS = 1.0  # time per test to kill and reap what the test left
STDERR_TAIL_BYTES = 4096  # stderr kept per test (its end, where the traceback is)
PROOF_FD = 3  # the test process writes the nonce here once the test's statements have run

_LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38


def main() -> None:
    """Read the job from stdin, run each case in a forked process, write the reports to stdout."""
    job = json.loads(_read_all(0))
    signal.signal(signal.SIGTERM, _give_up)  # from the trainer's backstop: clean up the running test, then exit
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered only while waiting for a test
    sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]  # Python 3.10's -I keeps it
    _prctl(PR_SET_DUMPABLE, 0)  # without root, the tests' (same) uid cannot read our memory or file descriptors
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a test become our children, so we reap them (PID 1 may not)
    _isolate(os.getcwd(), expose_python=job["uid"] is not None)
    if job["uid"] is not None:
        if problem := _check_uid(job["uid"]):
            return _reply({"error": problem})
        _kill_all_as(job["uid"])  # whatever an interrupted earlier run left as this uid
    reports = []
    for case in job["cases"]:
        reports.append(_run_case(job, case))
        _empty_directory()  # each test starts from an empty working directory
    _reply({"reports": reports})


def _give_up(signum, frame):
    raise SystemExit(1)  # raised inside _run_case's wait, so its clean-up runs


@contextmanager
def _sigterm_allowed():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _isolate(directory: str, expose_python: bool) -> None:
    """No network, and the shared writable directories replaced by the sandbox's; skipped where not permitted."""
    _unshare(CLONE_NEWNET)  # a new network namespace: only a loopback device, and that one down
    if _unshare(CLONE_NEWNS) and _mount(None, "/", None, MS_REC | MS_PRIVATE):  # private first, or mounts leak out
        for shared in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):  # the usual world-writable directories
            if os.path.isdir(shared):
                _mount(directory, shared, None, MS_BIND)
        if expose_python:
            _expose_python()


def _expose_python() -> None:
    """Let the sandbox uid reach the interpreter even where a directory above it is closed to others (pyenv
    under /root, mode 0700): in our mount namespace such a directory becomes a tmpfs holding just the way on."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if os.path.isdir(p)}
    while blocked := _first_blocked_ancestors(paths):
        for ancestor, children in blocked.items():
            keep = {child: os.open(os.path.join(ancestor, child), os.O_PATH) for child in children}  # before hiding
            covered = _mount("tmpfs", ancestor, "tmpfs", 0, b"mode=0755")
            for child, fd in keep.items():
                if covered:
                    os.mkdir(os.path.join(ancestor, child))
                    _mount(f"/proc/self/fd/{fd}", os.path.join(ancestor, child), None, MS_BIND)
                os.close(fd)
            if not covered:
                return


def _first_blocked_ancestors(paths: set[str]) -> dict[str, set[str]]:
    """For each path, its highest ancestor that others cannot search, with the child on the way; grouped."""
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts) - 1):
            ancestor = "/".join(parts[:depth]) or "/"
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                blocked.setdefault(ancestor, set()).add(parts[depth])
                break
    return blocked


def _run_case(job: dict, case: dict) -> dict:
    """Fork the test's process, wait for it up to the timeout, kill and reap everything it left; its report."""
    nonce = os.urandom(16).hex().encode()  # fresh per test: a proof from one test says nothing about another
    stdin, stdout, stderr = files = [tempfile.TemporaryFile() for _ in range(3)]  # unnamed: unreachable by path
    stdin.write(case.get("input", "").encode())
    stdin.seek(0)
    proof_read, proof_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _case_process(job, case, nonce, files, proof_write)  # never returns
    os.close(proof_write)
    try:
        with _sigterm_allowed():
            timed_out = _wait_for_exit(pid, job["timeout"])
    finally:  # on SIGTERM too: nothing of a test outlives the supervisor
        os.kill(pid, signal.SIGKILL)  # no effect if it has exited: it stays a zombie until waitpid
        _kill_leftovers(pid, job["uid"])  # pid is not reaped yet, so its process group id is still the test's
        exit_code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        _reap_children(CLEANUP_SECONDS)
    out = _read_head(stdout, job["max_output_bytes"] + 1)
    report = {
        "proof": nonce in _drain(proof_read), "timed_out": timed_out, "exit_code": exit_code,
        "stdout": out[: job["max_output_bytes"]].decode(errors="replace"),
        "stdout_overflow": len(out) > job["max_output_bytes"], "stderr": _read_tail(stderr, STDERR_TAIL_BYTES),
    }
    for file in files:
        file.close()
    return report


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait for the process to exit, leaving it unreaped; True if the timeout came first."""
    deadline, delay = time.monotonic() + timeout, 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return True
        time.sleep(delay)
        delay = min(2 * delay, 0.005)
    return False


def _check_uid(uid: int) -> str | None:
    """Why tests cannot run as `uid`, or None."""
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid)
            os._exit(0 if os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK) else 2)
        finally:
            os._exit(1)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status == 1:
        return f"cannot switch to uid {uid}; set SandboxConfig.first_uid to uids that can be used here"
    if status == 2:
        return f"uid {uid} cannot read the Python installation at {os.path.dirname(os.__file__)}; make it readable"
    return None


def _kill_leftovers(pgid: int, uid: int | None) -> None:
    """SIGKILL the test's process group and, as root, every process of its uid (also those that left the group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    if uid is not None:
        _kill_all_as(uid)


def _kill_all_as(uid: int) -> None:
    """kill(-1, SIGKILL) from a process running as `uid`: every process of that uid, at once (a fork cannot slip by)."""
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid)
            try:
                os.kill(-1, signal.SIGKILL)  # Linux spares the caller itself
            except ProcessLookupError:
                pass
            os._exit(0)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


def _reap_children(patience: float) -> None:
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


def _empty_directory() -> None:
    for entry in os.scandir("."):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


# ---------------------------------------------------------------- inside the forked test process


def _case_process(job: dict, case: dict, nonce: bytes, files: list, proof_write: int) -> None:
    """Confine this process, then run the program and the test; never returns."""
    exit_now = os._exit  # bound before the program could replace it
    try:
        try:
            _confine(job, files, proof_write)
        except BaseException:
            traceback.print_exc()
            exit_now(125)  # never run the program unconfined
        run = _run_assert_case if case["kind"] == "assert" else _run_script
        run(job["program"], case, nonce)
    finally:
        exit_now(1)


def _confine(job: dict, files: list, proof_write: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.setpgid(0, 0)  # a process group per test, for the kill without root
    for fd, file in enumerate(files):
        os.dup2(file.fileno(), fd)  # stdin, stdout, stderr
    os.dup2(proof_write, PROOF_FD)
    os.closerange(PROOF_FD + 1, os.sysconf("SC_OPEN_MAX"))  # nothing of the supervisor's, e.g. its report pipe
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")  # under memory pressure the kernel kills a test before the trainer
    except OSError:
        pass
    cpu = job["cpu_seconds"]
    limits = {  # (soft, hard)
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU, then SIGKILL a second later
        resource.RLIMIT_AS: (job["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (job["file_size_bytes"],) * 2,
        resource.RLIMIT_NPROC: (job["max_processes"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, (soft, hard) in limits.items():
        ceiling = resource.getrlimit(kind)[1]  # without root a hard limit cannot be raised: stay under it
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))
    if job["uid"] is not None:
        _become(job["uid"])  # last: the steps above need root
        _prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self files as usual; only its own sandbox shares the uid
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # set-uid binaries cannot give root back
    sys.argv = ["solution.py"]


def _become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # as root this sets the real, effective and saved uid: no way back
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"still running as uid {os.geteuid()}")


def _run_assert_case(program: str, case: dict, nonce: bytes) -> None:
    """The program as module "solution", then the test's statements in it; the nonce only if both ran to the end.

    Printing or exiting early forges nothing: the nonce is in no file, argument or environment variable,
    only in this process's memory (this frame and its caller's). A program that reads the harness's frames
    or memory can still find it and write it to PROOF_FD: `sys._getframe(1).f_locals["nonce"]` is enough."""
    run, write, exit_now = exec, os.write, os._exit  # bound before the program could replace the builtins
    namespace = _fresh_module("solution")  # not "__main__": an `if __name__ == "__main__":` block does not run
    try:
        test_code = compile(case["source"], "<test>", "exec")  # compiled before the program can touch `compile`
        run(compile(program, "<program>", "exec"), namespace)
        run(test_code, namespace)
    except BaseException:  # SystemExit included: a test that did not run to its end did not pass
        traceback.print_exc()
        _flush()
        exit_now(1)
    _flush()
    write(PROOF_FD, nonce)
    exit_now(0)


def _run_script(program: str, case: dict, nonce: bytes) -> None:
    """The program as __main__ with the test's input on stdin; exit status 0 unless it raised or exited non-zero."""
    exit_now = os._exit
    try:
        exec(compile(program, "<program>", "exec"), _fresh_module("__main__"))
        status = 0
    except SystemExit as stop:
        status = 0 if stop.code is None or stop.code == 0 else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    _flush()
    exit_now(status)


def _fresh_module(name: str) -> dict:
    module = types.ModuleType(name)
    module.__builtins__ = builtins
    sys.modules[name] = module  # `import __main__` finds the program, not the supervisor
    return module.__dict__


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


# ---------------------------------------------------------------- small helpers


def _unshare(flags: int) -> bool:
    return getattr(_LIBC, "unshare", lambda _: -1)(flags) == 0


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: bytes | None = None) -> bool:
    encode = lambda text: text.encode() if text is not None else None
    return _LIBC.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), data) == 0


def _prctl(option: int, value: int) -> None:
    if hasattr(_LIBC, "prctl"):
        _LIBC.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _drain(fd: int) -> bytes:
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


def _read_head(file, size: int) -> bytes:
    file.seek(0)
    return file.read(size)


def _read_tail(file, size: int) -> str:
    file.seek(max(0, os.fstat(file.fileno()).st_size - size))
    return file.read().decode(errors="replace")


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
