"""Stage 2 of the loop, verify (code): the process of one test, forked by the sandbox supervisor
(`sandbox.py`).

It confines itself (process group, rlimits, a fresh session keyring and, in the supervisor's namespaces,
a fresh IPC namespace; an unprivileged uid, no new privileges, the seccomp filter below), runs the program
and then the test, and exits: its exit status, stdout, stderr and, for an assert test that ran to its end,
the nonce on PROOF_FD are all it says. It knows neither JSON nor expected outputs nor the trainer.
Standard library only: `sandbox.py` loads it by its path.

The seccomp filter. Refused with EPERM: socket() (no network, and no filesystem UNIX socket such as
/dev/log: those are reachable by path from any namespace), connect() and bind(), an addressed sendto(),
a socketpair() other than an AF_UNIX stream or seqpacket pair (a datagram end could send to any path);
the keyring calls (keyctl, add_key, request_key: keyrings survive setuid); new namespaces (unshare, setns,
clone with a CLONE_NEW* flag); mounts (mount, umount2, pivot_root and the new mount API); ptrace and the
calls that read or take another process's memory or descriptors (process_vm_readv/writev, pidfd_getfd);
io_uring, bpf, perf_event_open, userfaultfd,
memfd_secret; personality() except its query. Refused with ENOSYS, so that callers fall back: clone3
(its flags are behind a pointer seccomp cannot read; glibc then uses clone) and memfd_create (its memory
would count against no limit). sendmsg() stays allowed: on the stream and seqpacket pairs left to a test,
Linux refuses (EISCONN) or ignores an address. Every call made through another ABI (32-bit or x32) is
refused too, since its numbers differ.
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
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWIPC = 0x08000000
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
KEYCTL_JOIN_SESSION_KEYRING = 1
IPC_IDS = 32  # at most this many SysV shared memory segments and message queues per test
SYSCALLS = {  # machine: its seccomp ABI id and the numbers of the calls the filter looks at
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
REFUSED = (  # EPERM, whatever the arguments
    "socket",
    "connect",
    "bind",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "io_uring_setup",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "memfd_secret",
    # mounts: without root the supervisor's user namespace gives a test the capability to mount, which
    # would let it uncover what the supervisor's mounts hide
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
)
ABSENT = ("clone3", "memfd_create")  # ENOSYS, as on a kernel without them


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
    _install_filter()
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
            soft, hard = min(soft, ceiling), min(hard, ceiling)
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


class _SockFilter(ctypes.Structure):  # struct sock_filter: one classic BPF instruction
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# classic BPF, as seccomp runs it: each instruction works on one 32-bit register
LOAD = 0x20  # BPF_LD|BPF_W|BPF_ABS: the register = a word of seccomp_data
AND = 0x54  # BPF_ALU|BPF_AND|BPF_K: the register &= k
JUMP_IF_EQUAL = 0x15  # BPF_JMP|BPF_JEQ|BPF_K
JUMP_IF_ABOVE = 0x35  # BPF_JMP|BPF_JGE|BPF_K: at or above k
JUMP_IF_ANY_BIT = 0x45  # BPF_JMP|BPF_JSET|BPF_K: register & k is not 0
GIVE = 0x06  # BPF_RET|BPF_K: the verdict k
ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
ERRNO = 0x00050000  # SECCOMP_RET_ERRNO, or-ed with the errno the call returns
ARCH, NUMBER = 4, 0  # offsets in seccomp_data
AF_UNIX = 1
SOCK_STREAM, SOCK_SEQPACKET = 1, 5
SOCK_TYPE_MASK = 0xF  # a socket type without SOCK_NONBLOCK and SOCK_CLOEXEC


def _argument(index: int, high: bool = False) -> int:
    """Offset in seccomp_data of the low (or high) 32 bits of argument `index` (little-endian)."""
    return 16 + 8 * index + (4 if high else 0)


def _filter_steps(numbers: dict) -> list[tuple]:
    """The filter as (code, jump if true, jump if false, k); a jump is 0 (the next step) or a label's name,
    and a label is a str in the list, naming the step after it. Jumps only go forward, as BPF's must."""
    steps = [
        (LOAD, 0, 0, ARCH),
        (JUMP_IF_EQUAL, 0, "refuse", numbers["abi"]),
        (LOAD, 0, 0, NUMBER),
        (JUMP_IF_ABOVE, "refuse", 0, 0x40000000),  # x32 numbers have this bit set
        *((JUMP_IF_EQUAL, "refuse", 0, numbers[name]) for name in REFUSED),
        *((JUMP_IF_EQUAL, "absent", 0, numbers[name]) for name in ABSENT),
        *(
            (JUMP_IF_EQUAL, name, 0, numbers[name])
            for name in ("clone", "socketpair", "sendto", "personality")
        ),
        (GIVE, 0, 0, ALLOW),
        "clone",  # no new namespace (threads and fork pass)
        (LOAD, 0, 0, _argument(0)),
        (JUMP_IF_ANY_BIT, "refuse", "allow", NAMESPACE_FLAGS),
        "socketpair",  # AF_UNIX stream or seqpacket only (SOCK_RAW would be a datagram pair)
        (LOAD, 0, 0, _argument(0)),
        (JUMP_IF_EQUAL, 0, "refuse", AF_UNIX),
        (LOAD, 0, 0, _argument(1)),
        (AND, 0, 0, SOCK_TYPE_MASK),
        (JUMP_IF_EQUAL, "allow", 0, SOCK_STREAM),
        (JUMP_IF_EQUAL, "allow", "refuse", SOCK_SEQPACKET),
        "sendto",  # send() is sendto() without an address
        (LOAD, 0, 0, _argument(4)),
        (JUMP_IF_EQUAL, 0, "refuse", 0),
        (LOAD, 0, 0, _argument(4, high=True)),
        (JUMP_IF_EQUAL, "allow", "refuse", 0),
        "personality",  # only the query, personality(0xffffffff)
        (LOAD, 0, 0, _argument(0)),
        (JUMP_IF_EQUAL, "allow", "refuse", 0xFFFFFFFF),
        "refuse",
        (GIVE, 0, 0, ERRNO | errno.EPERM),
        "absent",
        (GIVE, 0, 0, ERRNO | errno.ENOSYS),
        "allow",
        (GIVE, 0, 0, ALLOW),
    ]
    return _resolve_labels(steps)


def _resolve_labels(steps: list) -> list[tuple]:
    """BPF instructions from steps with labels: each label becomes the number of instructions to skip."""
    program, labels = [], {}
    for step in steps:
        if isinstance(step, str):
            labels[step] = len(program)
        else:
            program.append(step)

    def skip(target, here: int) -> int:  # a label becomes the jump's offset past this instruction
        return labels[target] - here - 1 if isinstance(target, str) else target

    return [(code, skip(jt, i), skip(jf, i), k) for i, (code, jt, jf, k) in enumerate(program)]


def _install_filter() -> None:
    program = _filter_steps(SYSCALLS[os.uname().machine])
    instructions = (_SockFilter * len(program))(*(_SockFilter(*step) for step in program))
    filter_program = _SockFprog(len(program), instructions)
    # SECCOMP_MODE_FILTER
    if LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(filter_program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")


def _run_assert_case(program: str, case: dict, nonce: bytes) -> None:
    """The program as module "solution", then the test's statements in it; the nonce only if both ran to the
    end.

    Printing or exiting early forges nothing: the nonce is in no file, argument or environment variable,
    only in this process's memory (this frame and its caller's). A program that reads the harness's frames
    or memory can still find it and write it to PROOF_FD: `sys._getframe(1).f_locals["nonce"]` is enough."""
    run, write, exit_now = exec, os.write, os._exit  # bound before the program could replace the builtins
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
