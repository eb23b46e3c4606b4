"""Stage 2 of the loop, verify (code): the sandbox supervisor, run as `python -I sandbox.py` by `code.py`.

Standard library only and importing nothing of minigrpo (isolated mode puts no package on the path):
it reads one job (program, test inputs, limits) as JSON on stdin and writes one report per test
as JSON on stdout; judging the reports against expected outputs happens in the trainer.

How a run is sandboxed. `run_cases` (code.py) starts `python -I sandbox.py` (this file) in a fresh
temporary directory with a scrubbed environment. The supervisor, still root if the trainer is, becomes a
child subreaper and unshares a network namespace (no network, not even 127.0.0.1) and a mount namespace
in which /tmp, /var/tmp, /dev/shm and /run/lock are the sandbox directory. Where the OS refuses the
namespaces (not root, or a container without CAP_SYS_ADMIN) it runs without them and says so in its
reply (code.py warns once); once it has a mount namespace, a mount that fails ends the run with an error,
so the shared directories are never silently the host's. Per test it forks a process that sets the
rlimits, drops to an unprivileged uid, installs a seccomp filter that refuses socket() (no network and no
filesystem UNIX sockets such as those under /run, namespaces or not) and io_uring, and runs the program,
then the test; afterwards everything left of the test is killed and reaped, and the directory emptied by
`remove_tree`, which no depth, permission or symlink stops. The trainer's own backstop only matters if the
supervisor falls far behind (SIGTERM, SIGKILL).

Privileges. As root, each concurrent sandbox gets a uid of its own (`first_uid`, `first_uid + 1`, ...,
held by a lock file, so also across processes: two trainers or every rank of a torchrun job on one node)
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
until its timeout. Without root it can also read the trainer's /proc/<pid>/environ, write to the real
/tmp and other world-writable directories, and leave behind processes that called setsid.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import itertools
import json
import os
import resource
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
PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 22, 36, 38
SHARED_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the usual world-writable directories
SYSCALLS = {  # machine: (its seccomp ABI id, the numbers of socket() and io_uring_setup())
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
}


def main() -> None:
    """Read the job from stdin, run each case in a forked process, write the reports to stdout."""
    job = json.loads(_read_all(0))
    if os.uname().machine not in SYSCALLS:
        return _reply({"error": f"no seccomp filter for {os.uname().machine} (only {', '.join(SYSCALLS)})"})
    signal.signal(signal.SIGTERM, _give_up)  # from the trainer's backstop: clean up the running test, then exit
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered only while waiting for a test
    sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]  # Python 3.10's -I keeps it
    _prctl(PR_SET_DUMPABLE, 0)  # without root, the tests' (same) uid cannot read our memory or file descriptors
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a test become our children, so we reap them (PID 1 may not)
    try:
        isolated = _isolate(expose_python=job["uid"] is not None)
    except OSError as error:  # fail closed: never run tests in a half-made mount namespace
        return _reply({"error": f"sandbox isolation failed: {error}"})
    if job["uid"] is not None:
        if problem := _check_uid(job["uid"]):
            return _reply({"error": problem})
        _kill_all_as(job["uid"])  # whatever an interrupted earlier run left as this uid
    reports = []
    for case in job["cases"]:
        reports.append(_run_case(job, case))
        remove_tree(".", keep_top=True)  # each test starts from an empty working directory
    _reply({"reports": reports, "isolated": isolated})


def _give_up(signum, frame):
    raise SystemExit(1)  # raised inside _run_case's wait, so its clean-up runs


@contextmanager
def _sigterm_allowed():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _isolate(expose_python: bool) -> bool:
    """No network, and the shared writable directories replaced by the working directory (the sandbox's).

    False if the OS refuses the namespaces (then nothing is changed); OSError if a mount fails after that."""
    if not (_unshare(CLONE_NEWNET) and _unshare(CLONE_NEWNS)):  # a network namespace: only a loopback, down
        return False
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # private first, or our mounts would show outside
    # by descriptor: once /tmp is covered, the directory's own path (/tmp/minigrpo-sandbox-...) no longer resolves
    directory = os.open(".", os.O_PATH | os.O_DIRECTORY)
    for shared in SHARED_DIRECTORIES:
        if os.path.isdir(shared):
            _mount(f"/proc/self/fd/{directory}", shared, None, MS_BIND)
    os.close(directory)
    if expose_python:
        _expose_python()
    return True


def _expose_python() -> None:
    """Let the sandbox uid reach the interpreter even where a directory above it is closed to others (pyenv
    under /root, mode 0700): in our mount namespace such a directory becomes a tmpfs holding just the way on."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if os.path.isdir(p)}
    while blocked := _first_blocked_ancestors(paths):
        for ancestor, children in blocked.items():
            keep = {child: os.open(os.path.join(ancestor, child), os.O_PATH) for child in children}  # before hiding
            _mount("tmpfs", ancestor, "tmpfs", 0, b"mode=0755")
            for child, fd in keep.items():
                os.mkdir(os.path.join(ancestor, child))
                _mount(f"/proc/self/fd/{fd}", os.path.join(ancestor, child), None, MS_BIND)
                os.close(fd)


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


def remove_tree(path: str, keep_top: bool = False) -> None:
    """Delete `path` and all below it (only what is below, with `keep_top`); never raises for what a test made.

    Linear and flat whatever a test built: each directory below the top is emptied one level at a time, its
    subdirectories first renamed up into the top, so neither a recursion nor a path grows with depth
    (`shutil.rmtree` raised RecursionError on 3,000 nested directories and left them behind). Symlinks are
    removed, never followed; a directory a test closed (mode 000) is opened again first. Called only once
    every process of the test is dead, so nothing changes the tree meanwhile."""
    try:
        top = _open_to_empty(path, None)
    except OSError:  # not a directory (or a symlink to one), or already gone
        return _quietly(os.unlink, path)
    spare_names = (f".removing-{n}" for n in itertools.count())  # for subdirectories moved up
    try:
        while entries := {entry.name: entry.is_dir(follow_symlinks=False) for entry in os.scandir(top)}:
            for name, is_directory in entries.items():
                if is_directory:
                    _empty_into(top, name, spare_names)
                    _quietly(os.rmdir, name, dir_fd=top)
                else:
                    _quietly(os.unlink, name, dir_fd=top)
            if set(entries) <= {entry.name for entry in os.scandir(top)}:
                break  # a whole pass removed nothing: what is left cannot be removed by us
    finally:
        os.close(top)
    if not keep_top:
        _quietly(os.rmdir, path)


def _empty_into(top: int, name: str, spare_names) -> None:
    """Delete the files of directory `name` (in `top`) and move its subdirectories up into `top`."""
    try:
        directory = _open_to_empty(name, top)
    except OSError:
        return
    try:
        for entry in list(os.scandir(directory)):
            if entry.is_dir(follow_symlinks=False):
                _move_up(directory, entry.name, top, spare_names)
            else:
                _quietly(os.unlink, entry.name, dir_fd=directory)
    finally:
        os.close(directory)


def _open_to_empty(name: str, parent: int | None) -> int:
    """A descriptor of directory `name`, never through a symlink, with the owner's rights given back."""
    handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    try:
        _quietly(os.chmod, f"/proc/self/fd/{handle}", 0o700)  # this very inode, not whatever the name is now
        return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(handle)


def _move_up(directory: int, name: str, top: int, spare_names) -> None:
    for _ in range(100):  # a test may have used the spare names itself: take the next one
        try:
            return os.rename(name, next(spare_names), src_dir_fd=directory, dst_dir_fd=top)
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                return


def _quietly(function, *args, **kwargs) -> None:
    try:
        function(*args, **kwargs)
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
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # set-uid binaries cannot give root back; also lets us install the filter
    _forbid_sockets()
    sys.argv = ["solution.py"]


class _SockFilter(ctypes.Structure):  # struct sock_filter: one classic BPF instruction
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _forbid_sockets() -> None:
    """A seccomp filter: socket() and io_uring_setup() fail with EPERM, as does every call made through another
    ABI (32-bit or x32), which has other numbers. Filesystem UNIX sockets (under /run, say) are reachable by
    path from any namespace, so a network namespace alone does not stop a connect() to a host service.
    socketpair() stays allowed: its two ends reach only each other (asyncio and multiprocessing use it)."""
    abi, socket_call, io_uring_setup = SYSCALLS[os.uname().machine]
    load, jump_if_equal, jump_if_above, give = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [  # (code, jump if true, jump if false, k): jumps count instructions skipped
        (load, 0, 0, 4),  # seccomp_data.arch
        (jump_if_equal, 0, 5, abi),
        (load, 0, 0, 0),  # seccomp_data.nr
        (jump_if_above, 3, 0, 0x40000000),  # x32 numbers have this bit set
        (jump_if_equal, 2, 0, socket_call),
        (jump_if_equal, 1, 0, io_uring_setup),
        (give, 0, 0, allow),
        (give, 0, 0, refuse),
    ]
    instructions = (_SockFilter * len(program))(*(_SockFilter(*step) for step in program))
    filter_program = _SockFprog(len(program), instructions)
    if _LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(filter_program), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter that forbids sockets")


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


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: bytes | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None
    if _LIBC.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), data) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source or '(none)'} on {target}: {os.strerror(code)}")


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
