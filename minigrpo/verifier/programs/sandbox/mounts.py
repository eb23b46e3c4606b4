"""Stage 2 of the loop, verify: the sandbox supervisor's mounts, and what of the Python interpreter a
sandboxed program still reaches through them.

Standard library only: `supervisor.py` loads this file by its path. It knows paths and mounts, not tests.

What of the interpreter stays reachable. A program imports what the interpreter can and may start it
again (`subprocess.run([sys.executable, ...])`), which must find the same environment: the same sys.prefix
and site-packages. That needs the interpreter's directories (its prefixes, sys.executable's directory and
sys.path), the file sys.executable is, and a virtual environment's pyvenv.cfg (at sys.prefix), from which
the restarted interpreter learns its prefix; each path as written and as its links resolve. Two things of
the sandbox's would hide them, and each gives back only this much, read-only:
- The scratch tmpfs over /tmp, /var/tmp, /dev/shm and /run/lock (a virtual environment or a clone there,
  also one reached through a link from elsewhere): the outermost of the interpreter's directories there
  are bound again, whole, with every mount beneath them (`interpreter_under`, `show_read_only`), each
  behind a mount point that the clean-up between tests cannot remove; nothing else of those directories
  comes back, but for the name of that mount point, which the working directory (the same tmpfs) lists.
- As root, a directory on the way that the sandbox uid cannot search (closed to others and not its own:
  /root above pyenv, a virtual environment made by `python -m venv "$(mktemp -d)"`, a conda prefix of mode
  0700, a directory holding a link to an environment): it becomes a tmpfs holding only the entries that
  the way to those paths goes through (`expose_python`), a link made again as it was, any other entry
  bound again with the mounts beneath it: .pyenv of /root; bin/, lib/ and pyvenv.cfg of a virtual
  environment; bin/ and lib/ of a conda prefix; the link. The closed directory's other entries (include/,
  a file beside bin/) stay out of reach. An entry carried over keeps its owner and mode, so what the uid
  can read in it is what it could read were the directory above open: the one thing granted is the
  search of the closed directory, for those entries alone. A closed directory further down is rebuilt
  the same way.
Without root nothing is rebuilt: the tests run as the trainer's uid, which searches its own closed
directories, and an interpreter's directory under /tmp comes back whole, as that uid reads it elsewhere.
Not opened: a closed directory that is itself one of sys.path (a site-packages of mode 0700: its modules
stay out of reach), and files closed to others (a umask of 077): the sandbox widens no file's mode. Of a
chain of links, the path as written and the final target are followed, not the links between.
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


# ---------------------------------------------------------------- the interpreter under the scratch tmpfs


def interpreter_paths() -> set[str]:
    """The interpreter's directories, as a program run with it sees them: its prefixes, the directory of
    sys.executable (a virtual environment's bin/, whose python a program starts again) and sys.path; each
    as written and as its links resolve (a virtual environment under /tmp reached through a link from
    elsewhere lies under /tmp, though its path does not say so)."""
    paths = (sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(sys.executable), *sys.path)
    directories = [p for p in paths if os.path.isdir(p)]  # not '', a zip or a missing entry of sys.path
    return {os.path.abspath(p) for p in directories} | {os.path.realpath(p) for p in directories}


def interpreter_under(covered: tuple[str, ...]) -> list[str]:
    """The interpreter's directories that lie in one of the `covered` directories (a virtual environment or
    a clone under /tmp), outermost only: each is shown again, read-only, once the tmpfs covers the rest."""
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


def show_read_only(opened: dict[str, int], covered: tuple[str, ...]) -> None:
    """The interpreter's directories under the `covered` directories (each path with a descriptor opened
    before the tmpfs covered it) bound again with the mounts beneath them, every one of them read-only and
    otherwise with the flags it had. The entry of a covered directory on the way to one (/tmp/work of
    /tmp/work/repo/.venv) is a tmpfs of its own holding just the way to them (or the directory itself,
    bound over it): a mount point, which neither the clean-up between tests (the scratch tmpfs is also the
    working directory) nor a test can remove or move."""
    tops: dict[str, list[str]] = {}
    for path in opened:
        tops.setdefault(_entry_on_the_way(path, covered), []).append(path)
    for top, paths in tops.items():
        os.makedirs(top, exist_ok=True)  # in the scratch tmpfs, which /tmp and /var/tmp share
        mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"mode=0755")
        for path in paths:
            _bind_again(opened[path], path)
        read_only_mounts(top)


def _entry_on_the_way(path: str, covered: tuple[str, ...]) -> str:
    """The entry of the covered directory that `path` lies in: /tmp/work for /tmp/work/repo/.venv."""
    directory = next(d for d in covered if path.startswith(d + "/"))
    return os.path.join(directory, path[len(directory) + 1 :].split("/")[0])


# ---------------------------------------------------------------- as root: directories closed to the uid


def expose_python(uid: int) -> None:
    """Let the sandbox uid reach the interpreter where a directory on its way is closed to others: each
    such directory becomes a read-only tmpfs holding only the entries on the way (the module docstring
    says which), until none is left."""
    needed = _needed_paths()
    while closed := _closed_directories_on_the_way(needed, uid):
        for directory, entries in closed.items():
            _carry_over(directory, entries)


def _needed_paths() -> set[str]:
    """What starting the interpreter again needs: its directories, sys.executable and a virtual
    environment's pyvenv.cfg, each as written and as its links resolve."""
    files = [sys.executable, os.path.join(sys.prefix, "pyvenv.cfg")]
    files = [f for f in files if os.path.isfile(f)]
    return interpreter_paths() | {os.path.abspath(f) for f in files} | {os.path.realpath(f) for f in files}


def _closed_directories_on_the_way(paths: set[str], uid: int) -> dict[str, set[str]]:
    """For each path, the first directory on its way that `uid` cannot search (closed to others and not its
    own: the scratch tmpfs over /tmp is the uid's), its parent included, by its real path, with the entry
    the way goes through there (a link, where the path as written goes through one); grouped by
    directory."""
    closed: dict[str, set[str]] = {}
    for path in paths:
        names = [name for name in path.split("/") if name]
        for depth, name in enumerate(names):
            directory = os.path.realpath("/" + "/".join(names[:depth]))
            status = os.stat(directory)
            if status.st_uid != uid and not status.st_mode & stat.S_IXOTH:
                closed.setdefault(directory, set()).add(name)
                break
    return closed


def _carry_over(directory: str, entries: set[str]) -> None:
    """Cover `directory` with a tmpfs (root's, mode 0755) holding only `entries` of it, each as it was: a
    link made again, any other entry bound again with the mounts beneath it; then all of it read-only."""
    paths = [os.path.join(directory, name) for name in entries]
    links = {path: os.readlink(path) for path in paths if os.path.islink(path)}
    # the others, opened before the tmpfs hides them
    kept = {path: os.open(path, os.O_PATH) for path in paths if path not in links}
    mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"mode=0755")
    for path, target in links.items():
        os.symlink(target, path)
    for path, fd in kept.items():
        _bind_again(fd, path)
    read_only_mounts(directory)


def _bind_again(fd: int, path: str) -> None:
    """What `fd` opens (O_PATH, before a mount hid it) bound at `path` with the mounts beneath it, on a
    mount point made there of its kind: a directory for a directory, an empty file for anything else (a
    mount point, which the test cannot remove)."""
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(path, exist_ok=True)
    else:
        open(path, "x").close()
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    os.close(fd)
