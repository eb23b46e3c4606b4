"""Stage 2 of the loop, verify (code): the sandbox supervisor's mounts, and what of the Python interpreter a
sandboxed program still reaches through them.

Standard library only: `sandbox.py` loads this file by its path. It knows paths and mounts, not tests.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
MOUNT_SETATTR = 442  # mount_setattr(2)'s number, the same on x86_64 and aarch64
MOUNT_ATTR_RDONLY = 0x1  # mount_setattr() arguments, from <linux/mount.h> and <fcntl.h>
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
MS_NOSUID = 2  # mount() flags, from <linux/mount.h>
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: bytes | None = None) -> None:
    """mount(2); OSError naming the mount if it fails."""

    def encode(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    if LIBC.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), data) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source or '(none)'} on {target}: {os.strerror(code)}")


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def read_only_mounts(path: str = "/") -> None:
    """Every mount of our namespace at and below `path` read-only, recursively (mounts made after this one
    are writable); their other flags as they were."""
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
    target = path.encode()
    if LIBC.syscall(MOUNT_SETATTR, AT_FDCWD, target, AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)):
        code = ctypes.get_errno()
        raise OSError(code, f"making the mounts at {path} read-only: {os.strerror(code)}")


def interpreter_paths() -> set[str]:
    """Where the interpreter lives, as a program run with it sees it: its prefixes, the directory of
    sys.executable (a virtual environment's bin/, whose python a program starts again), and sys.path."""
    paths = (sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(sys.executable), *sys.path)
    return {os.path.abspath(p) for p in paths if p and os.path.isdir(p)}


def interpreter_under(covered: tuple[str, ...]) -> list[str]:
    """The interpreter's paths that lie in one of the `covered` directories (a virtual environment or a
    clone under /tmp), outermost only: each is shown again, read-only, once the tmpfs covers the rest."""
    inside = sorted(
        path
        for path in interpreter_paths()
        # inside one, never one of them whole (a sys.path entry of /tmp would uncover all of it)
        if any(path.startswith(directory + "/") for directory in covered)
    )
    outermost = []
    for path in inside:
        if not any(path.startswith(kept + "/") for kept in outermost):
            outermost.append(path)
    return outermost


def show_read_only(fd: int, path: str) -> None:
    """The directory opened as `fd` (before the tmpfs covered it) bound again at `path` with the mounts
    beneath it, every one of them read-only and otherwise with the flags it had."""
    os.makedirs(path, exist_ok=True)  # in the scratch tmpfs, root's: the test's uid cannot remove it
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    read_only_mounts(path)
    os.close(fd)


def expose_python(uid: int) -> None:
    """Let the sandbox uid reach the interpreter even where a directory above it is closed to others (pyenv
    under /root, mode 0700): in our mount namespace such a directory becomes a tmpfs holding just the way
    on."""
    paths = {os.path.realpath(p) for p in interpreter_paths()}
    while blocked := _first_blocked_ancestors(paths, uid):
        for ancestor, children in blocked.items():
            # the children, opened before hiding
            keep = {child: os.open(os.path.join(ancestor, child), os.O_PATH) for child in children}
            mount("tmpfs", ancestor, "tmpfs", 0, b"mode=0755")
            for child, fd in keep.items():
                os.mkdir(os.path.join(ancestor, child))
                mount(f"/proc/self/fd/{fd}", os.path.join(ancestor, child), None, MS_BIND)
                os.close(fd)


def _first_blocked_ancestors(paths: set[str], uid: int) -> dict[str, set[str]]:
    """For each path, its highest ancestor that `uid` cannot search (closed to others and not its own: the
    scratch tmpfs over /tmp is the uid's), with the child on the way; grouped."""
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts) - 1):
            ancestor = "/".join(parts[:depth]) or "/"
            status = os.stat(ancestor)
            if status.st_uid != uid and not status.st_mode & stat.S_IXOTH:
                blocked.setdefault(ancestor, set()).add(parts[depth])
                break
    return blocked
