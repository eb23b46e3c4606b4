"""Stage 2 of the loop, verify (code): the process of one test, forked by the sandbox supervisor (`sandbox.py`).

It confines itself (process group, rlimits, an unprivileged uid, no new privileges, a seccomp filter that
refuses socket() and io_uring), runs the program and then the test, and exits: its exit status, stdout,
stderr and, for an assert test that ran to its end, the nonce on PROOF_FD are all it says. It knows neither
JSON nor expected outputs nor the trainer. Standard library only: `sandbox.py` loads it by its path.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import os
import resource
import signal
import sys
import traceback
import types

PROOF_FD = 3  # the test process writes the nonce here once the test's statements have run

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 22, 36, 38
SYSCALLS = {  # machine: (its seccomp ABI id, the numbers of socket() and io_uring_setup())
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
}


def case_process(job: dict, case: dict, nonce: bytes, files: list, proof_write: int) -> None:
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
        become(job["uid"])  # last: the steps above need root
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self files as usual; only its own sandbox shares the uid
    prctl(PR_SET_NO_NEW_PRIVS, 1)  # set-uid binaries cannot give root back; also lets us install the filter
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
    if LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(filter_program), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter that forbids sockets")


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


# ---------------------------------------------------------------- also called by the supervisor


def become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # as root this sets the real, effective and saved uid: no way back
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"still running as uid {os.geteuid()}")


def prctl(option: int, value: int) -> None:
    if hasattr(LIBC, "prctl"):
        LIBC.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
