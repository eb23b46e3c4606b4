"""Stage 2 of the loop, verify: the process of one test, forked by the sandbox supervisor
(`supervisor.py`).

It confines itself (process group, rlimits, a fresh session keyring and, in the supervisor's namespaces,
a fresh IPC namespace; an unprivileged uid, no new privileges, and last the seccomp filter of `seccomp.py`,
which the supervisor hands it), runs the program and then the test, and exits: its exit status, stdout,
stderr and, for an assert test that ran to its end, the nonce on PROOF_FD are all it says. It knows neither
JSON nor expected outputs nor the trainer. Standard library only: `supervisor.py` loads it by its path.
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
PR_SET_PDEATHSIG = 1  # prctl options, from <linux/prctl.h>
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWIPC = 0x08000000
KEYCTL_JOIN_SESSION_KEYRING = 1
IPC_IDS = 32  # at most this many SysV shared memory segments and message queues per test
SYSCALLS = {  # machine: its seccomp ABI id and the numbers of the calls the filter (and the keyring) use
    "x86_64": dict(
        abi=0xC000003E,
        socket=41,
        connect=42,
        sendto=44,
        bind=49,
        socketpair=53,
        clone=56,
        ptrace=101,
        personality=135,
        pivot_root=155,
        mount=165,
        umount2=166,
        add_key=248,
        request_key=249,
        keyctl=250,
        unshare=272,
        perf_event_open=298,
        setns=308,
        process_vm_readv=310,
        process_vm_writev=311,
        memfd_create=319,
        bpf=321,
        userfaultfd=323,
        io_uring_setup=425,
        open_tree=428,
        move_mount=429,
        fsopen=430,
        fsconfig=431,
        fsmount=432,
        fspick=433,
        clone3=435,
        pidfd_getfd=438,
        mount_setattr=442,
        memfd_secret=447,
    ),
    "aarch64": dict(
        abi=0xC00000B7,
        socket=198,
        connect=203,
        sendto=206,
        bind=200,
        socketpair=199,
        clone=220,
        ptrace=117,
        personality=92,
        umount2=39,
        mount=40,
        pivot_root=41,
        add_key=217,
        request_key=218,
        keyctl=219,
        unshare=97,
        perf_event_open=241,
        setns=268,
        process_vm_readv=270,
        process_vm_writev=271,
        memfd_create=279,
        bpf=280,
        userfaultfd=282,
        io_uring_setup=425,
        open_tree=428,
        move_mount=429,
        fsopen=430,
        fsconfig=431,
        fsmount=432,
        fspick=433,
        clone3=435,
        pidfd_getfd=438,
        mount_setattr=442,
        memfd_secret=447,
    ),
}


def case_process(job: dict, case: dict, nonce: bytes, files: list, proof_write: int, install_filter) -> None:
    """Confine this process, `install_filter` (seccomp.py's) last, then run the program and the test; never
    returns."""
    exit_now = os._exit  # bound before the program could replace it
    try:
        try:
            _confine(job, files, proof_write, install_filter)
        except BaseException:
            traceback.print_exc()
            exit_now(125)  # never run the program unconfined
        run = _run_assert_case if case["kind"] == "assert" else _run_script
        run(job["program"], case, nonce)
    finally:
        exit_now(1)


def _confine(job: dict, files: list, proof_write: int, install_filter) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.setpgid(0, 0)  # a process group per test, for the kill without root
    for fd, file in enumerate(files):
        os.dup2(file.fileno(), fd)  # stdin, stdout, stderr
    os.dup2(proof_write, PROOF_FD)
    # nothing of the supervisor's, e.g. its report pipe
    os.closerange(PROOF_FD + 1, os.sysconf("SC_OPEN_MAX"))
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")  # under memory pressure the kernel kills a test before the trainer
    except OSError:
        pass
    _join_fresh_keyring()
    if job["isolated"]:
        _enter_fresh_ipc_namespace(job["scratch_bytes"])
    _set_limits(job)
    if job["uid"] is not None:
        become(job["uid"])  # last: the steps above need root
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self files as usual; only its own sandbox shares the uid
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after become(), which clears it: die with the supervisor
    if os.getppid() != job["supervisor_pid"]:
        raise OSError("the supervisor exited before the test started")
    prctl(PR_SET_NO_NEW_PRIVS, 1)  # set-uid binaries cannot give root back; also lets us install the filter
    install_filter(SYSCALLS[os.uname().machine])
    sys.argv = ["solution.py"]


def _set_limits(job: dict) -> None:
    cpu = job["cpu_seconds"]
    limits = {  # (soft, hard)
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU, then SIGKILL a second later
        resource.RLIMIT_AS: (job["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (job["file_size_bytes"],) * 2,
        resource.RLIMIT_NPROC: (job["max_processes"],) * 2,
        resource.RLIMIT_NOFILE: (job["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, (soft, hard) in limits.items():
        ceiling = resource.getrlimit(kind)[1]  # without root a hard limit cannot be raised: stay under it
        if ceiling != resource.RLIM_INFINITY:
            soft = min(soft, ceiling)
            hard = min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))


def _join_fresh_keyring() -> None:
    """A new, empty session keyring: the trainer's keys (tokens, say) are not this process's to reach."""
    keyctl = SYSCALLS[os.uname().machine]["keyctl"]
    if LIBC.syscall(ctypes.c_long(keyctl), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0:
        code = ctypes.get_errno()
        if code != errno.ENOSYS:  # ENOSYS: a kernel without keyrings, so nothing to hide
            raise OSError(code, f"could not join a fresh session keyring: {os.strerror(code)}")


def _enter_fresh_ipc_namespace(scratch_bytes: int) -> None:
    """SysV IPC of this test alone: its shared memory and message queues die with its last process."""
    if LIBC.unshare(CLONE_NEWIPC) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"could not make an IPC namespace: {os.strerror(code)}")
    limit_ipc(scratch_bytes)


def limit_ipc(scratch_bytes: int) -> None:
    """At most scratch_bytes of SysV shared memory (it counts against no rlimit once detached) and IPC_IDS
    segments and message queues in the calling process's IPC namespace. The supervisor calls it first for
    its own namespace, so that a read-only /proc/sys stops the run with an error, not every test."""
    pages = scratch_bytes // os.sysconf("SC_PAGE_SIZE")
    settings = {"shmmax": scratch_bytes, "shmall": pages, "shmmni": IPC_IDS, "msgmni": IPC_IDS}
    for name, value in settings.items():  # these files are the calling process's IPC namespace's
        with open(f"/proc/sys/kernel/{name}", "w") as setting:
            setting.write(str(value))


def _run_assert_case(program: str, case: dict, nonce: bytes) -> None:
    """The program as module "solution", then the test's statements in it; the nonce only if both ran to the
    end.

    Printing or exiting early forges nothing: the nonce is in no file, argument or environment variable,
    only in this process's memory (this frame and its caller's). A program that reads the harness's frames
    or memory can still find it and write it to PROOF_FD: `sys._getframe(1).f_locals["nonce"]` is enough."""
    # bound before the program could replace the builtins
    run = exec
    write = os.write
    exit_now = os._exit
    # not "__main__": an `if __name__ == "__main__":` block does not run
    namespace = _fresh_module("solution")
    try:
        # compiled before the program can touch `compile`
        test_code = compile(case["source"], "<test>", "exec")
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
    """The program as __main__ with the test's input on stdin; exit status 0 unless it raised or exited
    non-zero."""
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
