"""Beneath every stage: files written whole or not at all, and read back with a clear error.

In: paths and JSON-able data. Out: files replaced by rename (`replaced_whole`, `replace_json`, and
`replace_dir` of a `directory_beside` the target, whose leftovers after a kill the next replacement
deletes: `remove_leftovers`), JSON objects read back (`read_json_object`), a named pipe or a directory
where a file should be refused before it is opened (`regular_file`), a full disk as one `DiskFull` line
naming the path and the space left, and whether a directory takes a new file (`write_probe`, which the
tools run on their outputs before any work; `output_dir_problem`, a run's output directory checked
whole; `output_file_problem`, a tool's output file). It knows the file system, not what the files hold:
run/checkpoint.py, model/ (weights, tokenizer, adapter files), run/metrics.py, run/trace.py and the
tools use it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
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


@contextlib.contextmanager
def directory_beside(target: str):
    """A new, empty directory beside `target` (.NAME.tmp-*) to write its next contents in, then renamed
    over it (replace_dir); removed if the block raises. It is locked while the block runs, so that another
    process's remove_leftovers leaves it alone; a killed process's lock goes with it."""
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=os.path.dirname(target))
    try:
        with _locked(tmp):
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(new: str, target: str) -> None:
    """Move `new` to `target`. An existing target is renamed away first and deleted only once `new`'s files
    and its rename are on disk (fsynced): a power cut at any moment leaves the old directory or the new one
    (the old in .NAME.old-*/previous, if it comes between the two renames), never neither. Moving into a new
    place syncs nothing, as no old copy is at risk and a sync takes far longer than writing a small model;
    a caller that needs the new directory on disk even then syncs it (checkpoint.save_checkpoint does)."""
    if not os.path.exists(target):
        os.rename(new, target)
        return
    fsync_tree(new)
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    with _locked(old):  # remove_leftovers in another process leaves it to this one
        os.rename(target, os.path.join(old, "previous"))
        os.rename(new, target)
        fsync(os.path.dirname(os.path.abspath(target)))  # the rename is on disk before the old goes
        shutil.rmtree(old, ignore_errors=True)


def remove_leftovers(target: str) -> None:
    """Delete what replacing `target` (directory_beside, replace_dir) left beside it when killed midway and
    no process holds: its temporary directories, and its earlier copies while `target` exists. Without
    `target`, an earlier copy is the only one of what it held (a kill came between replace_dir's two
    renames) and stays."""
    parent, name = os.path.split(os.path.abspath(target))
    # tempfile's names: the prefix, then 8 characters of [a-z0-9_]
    leftover = re.compile(rf"\.{re.escape(name)}\.(tmp|old)-[a-z0-9_]{{8}}")
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        match = leftover.fullmatch(entry)
        if not match or os.path.islink(path) or not os.path.isdir(path):
            continue
        if (match.group(1) == "tmp" or os.path.isdir(target)) and not _in_use(path):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _locked(directory: str):
    """`directory` locked (flock) while the block runs; the lock ends with the process, however it ends."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _in_use(directory: str) -> bool:
    """Whether a living process holds `directory` locked (_locked); one this process cannot open (another
    user's, or gone already) counts as in use: it is not this process's to delete."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_probe(path: str) -> str | None:
    """Create `path`, write a file in it and remove both again; what went wrong, or None. os.access is not
    enough: root passes it everywhere, /proc and /sys included, and it knows nothing of a full disk.
    Missing parents are made too, and kept once the probe passes: another run creating its own directory
    beside this one (runs/a and runs/b at once) may be using them. A failed probe leaves nothing it made.
    An existing `path` is only written in: nothing is made."""
    path = os.path.abspath(path)
    missing = []  # the directories to make, outermost first
    existing = path
    while not os.path.exists(existing):
        missing.insert(0, existing)
        existing = os.path.dirname(existing)
    made = []  # those this call made (another run may make one first)
    step = "creating it"
    try:
        for directory in missing:
            step = f"creating {directory}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory)
                made.append(directory)
        step = f"writing a file in {path}"
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        try:
            os.write(fd, b"minigrpo")
            os.fsync(fd)  # some file systems report a full disk only here
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as error:
        remove_empty(made)
        if error.errno == errno.ENOSPC:
            return f"no space left on the device ({shutil.disk_usage(existing).free} bytes free)"
        return f"{step} fails ({error.strerror or error})"
    remove_empty(made[-1:] if made and made[-1] == path else [])
    return None


def output_dir_problem(path: str, probe: bool = True) -> str | None:
    """What stops a run from writing into the directory `path`, in the words that follow its name in a
    one-line error, or None: it must be a directory this process can write, or one it can create, and
    with `probe` take a new file (`write_probe`; under torchrun rank 0 alone writes, so only it probes)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path) and not os.path.isdir(existing):
        return "is a file; it must be a directory (or not exist yet)"
    if not os.path.isdir(existing):
        return f"cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: no write permission in {existing}"
    problem = write_probe(path) if probe else None
    return f"cannot be written: {problem}" if problem else None


def output_file_problem(path: str) -> str | None:
    """What stops a tool from writing the file `path`, in the words that follow its name in a one-line
    error, or None: it must be a file this process can write, or one it can create."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path):
        if os.path.isdir(path):
            return f"is a directory; give a file, such as {os.path.join(path, 'results.jsonl')}"
        if not os.access(path, os.W_OK):
            return "cannot be written: no write permission"
        return None
    if not os.path.isdir(existing):
        return f"cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be created: no write permission in {existing}"
    return None


def remove_empty(directories: list[str]) -> None:
    """Remove these directories, innermost first, where they are (still) empty."""
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


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
