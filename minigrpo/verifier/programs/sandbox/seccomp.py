"""Stage 2 of the loop, verify: the seccomp filter a test's process installs last (`confine.py`).

In: the numbers of the system calls on this machine (`confine.SYSCALLS`). Out: nothing; after
`install_filter` the process can no longer make the calls below. It knows system calls, not tests or
programs. Standard library only: `supervisor.py` loads it by its path and hands `install_filter` to the test's
process.

The seccomp filter. Refused with EPERM: socket() (no network, and no filesystem UNIX socket such as
/dev/log: those are reachable by path from any namespace), connect() and bind(), an addressed sendto(), a
socketpair() other than an AF_UNIX stream or seqpacket pair (a datagram end could send to any path); the
keyring calls (keyctl, add_key, request_key: keyrings survive setuid); new namespaces (unshare, setns,
clone with a CLONE_NEW* flag); mounts (mount, umount2, pivot_root and the new mount API); ptrace and the
calls that read or take another process's memory or descriptors (process_vm_readv/writev, pidfd_getfd);
io_uring, bpf, perf_event_open, userfaultfd, memfd_secret; personality() except its query. Refused with
ENOSYS, so that callers fall back: clone3 (its flags are behind a pointer seccomp cannot read; glibc then
uses clone) and memfd_create (its memory would count against no limit). sendmsg() stays allowed: on the
stream and seqpacket pairs left to a test, Linux refuses (EISCONN) or ignores an address. Every call made
through another ABI (32-bit or x32) is refused too, since its numbers differ.
"""

from __future__ import annotations

import ctypes
import errno

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_SECCOMP = 22  # a prctl option, from <linux/prctl.h>
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
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
# offsets in seccomp_data
ARCH = 4
NUMBER = 0
AF_UNIX = 1
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
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
    program = []
    labels = {}
    for step in steps:
        if isinstance(step, str):
            labels[step] = len(program)
        else:
            program.append(step)

    def skip(target, here: int) -> int:  # a label becomes the jump's offset past this instruction
        return labels[target] - here - 1 if isinstance(target, str) else target

    return [(code, skip(jt, i), skip(jf, i), k) for i, (code, jt, jf, k) in enumerate(program)]


def install_filter(numbers: dict) -> None:
    """Install the filter, given this machine's ABI id and system call numbers (confine.SYSCALLS's entry)."""
    program = _filter_steps(numbers)
    instructions = (_SockFilter * len(program))(*(_SockFilter(*step) for step in program))
    filter_program = _SockFprog(len(program), instructions)
    # SECCOMP_MODE_FILTER
    if LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(filter_program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")
