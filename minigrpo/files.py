"""Beneath every stage: files written whole or not at all, and read back with a clear error.

In: paths and JSON-able data. Out: files replaced by rename (`replaced_whole`, `replace_json`,
`replace_dir`), JSON objects read back (`read_json_object`), a named pipe or a directory where a file
should be refused before it is opened (`regular_file`), and a full disk as one `DiskFull` line naming
the path and the space left. It knows the file system, not what the files hold: run/checkpoint.py,
model/ (weights, tokenizer, adapter files), run/metrics.py and run/trace.py use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile


class DiskFull(OSError):
    """The disk (or a quota) ran out while writing; the message names the path and the space left."""


@contextlib.contextmanager
def disk_full_named(path: str):
    """Running out of space inside the block (ENOSPC or EDQUOT anywhere in an error's chain: torch and
    safetensors wrap it in errors of their own) becomes one DiskFull line naming `path` and the space
    left on its file system. The block's own cleanup has run by then."""
    try:
        yield
    except Exception as error:
        if isinstance(error, DiskFull) or not _out_of_space(error):  # a DiskFull already names its path
            raise
        raise DiskFull(
            f"no space left on the device to write {path} ({_free_space(path)} free there); "
            "what was being written is not kept, earlier files are as they were"
        ) from None


def _out_of_space(error: BaseException | None) -> bool:
    """Whether `error`, or one it was raised from or during, is a disk or a quota running out."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        # Rust's I/O errors, known by their message
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _free_space(path: str) -> str:
    """The free space on the file system of `path` (or of its nearest existing parent), in words."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if free < 2**20:
        return f"{free} bytes"
    return f"{free / 2**20:.1f} MiB" if free < 2**30 else f"{free / 2**30:.1f} GiB"


# what a path that is not a regular file is, by its stat mode's type test
SPECIAL_FILES = {
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISDIR: "a directory",
    stat.S_ISSOCK: "a socket",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
}


def regular_file(path: str) -> bool:
    """Whether a file is at `path`: True for a regular file (or a link to one), False for nothing there;
    anything else by that name (a named pipe, a directory, a device) is a ValueError naming it, since
    reading a named pipe waits for a writer for ever and the others are not what a reader expects."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, a broken link, a path through a file: as os.path.exists
        return False
    if not stat.S_ISREG(mode):
        kind = next((name for is_kind, name in SPECIAL_FILES.items() if is_kind(mode)), "not a file")
        raise ValueError(f"{path} is {kind}, not a regular file")
    return True


def read_json_object(path: str, holding: str) -> dict:
    """The JSON object in `path`; anything else (bad JSON, null, a list, a named pipe) is a ValueError
    naming the file."""
    regular_file(path)  # a pipe or a directory is refused here; a missing file is open's FileNotFoundError
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        shown = json.dumps(value)
        raise ValueError(
            f"{path} holds {shown if len(shown) <= 40 else shown[:37] + '...'}, "
            f"not a JSON object with {holding}"
        )
    return value


def write_json(path: str, data: dict) -> None:
    """Not atomic, unlike checkpoint.replace_json: a save makes its files atomic by renaming their
    directory."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def replace_json(path: str, data: dict) -> None:
    """`data` as JSON in `path`, replaced whole."""
    with replaced_whole(path) as f:
        json.dump(data, f, indent=1)


@contextlib.contextmanager
def replaced_whole(path: str):
    """A text file to write `path`'s new contents into: path.tmp, fsynced and renamed over `path` once
    the block ends, so that a kill mid-write leaves the old file or the new one, never one cut short.
    An error removes path.tmp (a full disk is then a DiskFull); a kill leaves it, and the next write of
    `path` replaces it."""
    tmp = path + ".tmp"
    with disk_full_named(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


def replace_dir(new: str, target: str) -> None:
    """Move `new` to `target`; an existing target is renamed away first and removed only after."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(old, "previous"))
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: str) -> None:
    for name in os.listdir(directory):
        fsync(os.path.join(directory, name))
    fsync(directory)
