"""Stage 2 of the loop, verify: `remove_tree`, which deletes the directory tree a test left.

A path in, nothing out, nothing raised for what a test made: no depth, permission or symlink stops it.
Run by the sandbox supervisor (`supervisor.py`, which loads this file by its path) after each test and by
`code.py` on the host for the sandbox directory itself. It knows directories, not tests or processes.
"""

from __future__ import annotations

import errno
import itertools
import os


def remove_tree(path: str, keep_top: bool = False) -> None:
    """Delete `path` and all below it (only what is below, with `keep_top`); never raises for what a test
    made.

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
