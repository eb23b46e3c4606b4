"""Stage 2 of the loop, verify: strings in (a completion, its test cases), a float reward out.

Runs untrusted, model-generated Python in a sandbox and returns the fraction of tests it passes. It knows
strings and processes, not tensors or the tokenizer; standard library only (POSIX; Linux for namespaces).

The sandbox is `sandbox/supervisor.py`, a supervisor that forks one process per test (`confine.py`: it
confines itself, then runs the program and the test) and clears up after each (`cleanup.py`); the
sandbox folder's door (sandbox/__init__.py) says how a run is confined, seccomp.py's which system calls
are refused. The limits are `SandboxConfig` (sandbox/sandbox_config.py); the program and the test cases
are read and judged in code_cases.py.
As root, what holds: no network and no host socket (socket() refused; no datagram socketpair or addressed
send); no keyring of the trainer's; SysV IPC, host name, network and mounts of the sandbox's own, the IPC
per test; no new namespaces, ptrace, io_uring, memfd_create or memfd_secret; a uid of its own, taken only
when no process runs as it, whose supervisor dies with the trainer; a tmpfs of at most scratch_bytes and
scratch_inodes, noexec, as its directory, /tmp, /var/tmp, /dev/shm and /run/lock; rlimits on CPU, memory,
file size, processes and open files, and a wall-clock timeout. What it does not prevent, in short: a
program can read world-readable files (the dataset's answers, if they are on disk and world-readable) and
see the host's /proc (other processes' command lines) and /sys; an assert test trusts the objects the
program returns (an `__eq__` that always returns True passes `assert f(x) == y`); a stdin/stdout test with
a fixed input is passed by a program that prints the expected output; CPU and memory are limited per
process, not per sandbox (no cgroup). Without root there is no uid change; a user namespace gives the same
namespaces and tmpfs, every other mount read-only and a PID namespace with its own /proc (sandbox/);
where the OS refuses it, nothing runs unless SandboxConfig.unisolated says so. Every sandbox waits for the
admission rule (Admission: CPUs and a memory budget). For hostile workloads (a public endpoint, a model
trained to attack its grader) run the trainer's code rewards in a throw-away VM or container with no
credentials and no data it must not see, keep test data out of world-readable paths, and prefer
stdin/stdout tests with hidden inputs over asserts.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import asdict

from .code_cases import check_tests, extract_code, judge
from .sandbox import CLEANUP_SECONDS, SANDBOX_UIDS, CaseResult, SandboxConfig, remove_tree, supervisor

STARTUP_SECONDS = 10.0  # the trainer's backstop allows the supervisor this long to start, on top of the tests
# one lock file per uid in use, root's: a fixed path, machine-wide whatever TMPDIR says
# (/run is cleared at boot)
UID_LOCKS = "/run/minigrpo-sandbox-uids"
DIRECTORY_PREFIX = "minigrpo-sandbox-"  # each run's working directory, in the temporary directory
UNISOLATED = (
    "the code sandbox runs without namespaces here (the OS refused even a user namespace): tests can read "
    "the trainer's environment and memory through /proc, write its files and the shared /tmp, and use the "
    "host's SysV IPC"
)


# ---------------------------------------------------------------- the public entry points


def run_cases(code: str, tests: list, config: SandboxConfig | None = None) -> list[CaseResult]:
    """Run `code` against each test in the sandbox, once the admission rule lets it start; one CaseResult
    per test, in order."""
    config = config or SandboxConfig()
    cases = check_tests(tests, config)
    with (
        ADMISSION.admitted(config),
        _sandbox_uid(config) as (uid, lock),
        _sandbox_directory(uid) as directory,
    ):
        reports = _supervise(code, cases, config, uid, lock, directory)
    return [judge(case, report) for case, report in zip(cases, reports)]


def run_tests(code: str, tests: list, config: SandboxConfig | None = None) -> list[bool]:
    """Whether `code` passes each test."""
    return [result.passed for result in run_cases(code, tests, config)]


def code_reward(completion: str, tests: list, config: SandboxConfig | None = None) -> float:
    """Fraction of `tests` passed by the last Python block of `completion`; 0.0 without one."""
    config = config or SandboxConfig()
    check_tests(tests, config)  # a bad spec raises even when there is no code to run
    code = extract_code(completion) if isinstance(completion, str) else None
    if code is None:
        return 0.0
    passed = run_tests(code, tests, config)
    return sum(passed) / len(passed)


def code_rewards(
    completions: list[str], tests: list[list], config: SandboxConfig | None = None, workers: int | None = None
) -> list[float]:
    """code_reward for each completion against its own tests, `workers` sandboxes at a time."""
    from concurrent.futures import ThreadPoolExecutor  # each thread only waits on its sandbox process

    if len(completions) != len(tests):
        raise ValueError(
            f"got {len(completions)} completions but {len(tests)} test lists; each completion needs its own"
        )
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None (one per CPU), got {workers!r}")
    config = config or SandboxConfig()
    for test_list in tests:
        check_tests(test_list, config)
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        return list(pool.map(lambda c, t: code_reward(c, t, config), completions, tests))


# ---------------------------------------------------------------- trainer side: admit, start, wait, judge
class Admission:
    """The one rule for every sandbox of this process (a tool's python call or a code reward): at most one
    per CPU at once, and at most memory_budget_bytes reserved by those running (config.reserved_bytes
    each); the others wait their turn. One always runs, whatever it reserves. `peak_running` and
    `peak_reserved_bytes` say how far it went."""

    def __init__(self):
        self.condition = threading.Condition()
        self.running = 0
        self.reserved = 0
        self.peak_running = 0
        self.peak_reserved_bytes = 0

    @contextmanager
    def admitted(self, config: SandboxConfig):
        need = config.reserved_bytes
        budget = config.memory_budget_bytes or default_memory_budget()
        with self.condition:
            self.condition.wait_for(lambda: self.running == 0 or self._room(need, budget))
            self.running += 1
            self.reserved += need
            self.peak_running = max(self.peak_running, self.running)
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved)
        try:
            yield
        finally:
            with self.condition:
                self.running -= 1
                self.reserved -= need
                self.condition.notify_all()

    def _room(self, need: int, budget: int) -> bool:
        return self.running < (os.cpu_count() or 1) and self.reserved + need <= budget


def default_memory_budget() -> int:
    """Half of this machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


ADMISSION = Admission()  # the process's one admission rule


def sandbox_stats() -> dict[str, float]:
    """The logger's sandbox stats, once any sandbox has run in this process: the most that ran at once,
    and the most memory they reserved together (GiB), against the admission rule's budget."""
    if ADMISSION.peak_running == 0:
        return {}
    return {
        "sandbox/peak_running": float(ADMISSION.peak_running),
        "sandbox/peak_reserved_gib": ADMISSION.peak_reserved_bytes / 2**30,
    }


@contextmanager
def _sandbox_uid(config: SandboxConfig):
    """(uid, lock): a uid no other sandbox on this machine is using and the descriptor of its lock; (None,
    None) when not root (no uid change then).

    Held by an exclusive flock on UID_LOCKS/<uid>: across threads and processes (two trainers, the ranks of a
    torchrun job), because the supervisor's kill(-1) as its uid kills whatever else runs as that uid. The
    supervisor inherits the lock, so it stays taken until the supervisor too has exited; the kernel drops it
    when both are gone. A uid that some process still runs as (a test that outlived a killed trainer) is
    skipped, locked or not."""
    if os.geteuid() != 0:
        yield None, None
        return
    locks = _uid_lock_directory()
    running = _uids_with_processes()
    for uid in range(config.first_uid, config.first_uid + SANDBOX_UIDS):
        if uid in running:
            continue
        lock = os.open(
            os.path.join(locks, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue
        try:
            yield uid, lock
        finally:
            os.close(lock)  # releases the flock, once the supervisor's copy is closed too
        return
    raise RuntimeError(
        f"all {SANDBOX_UIDS} sandbox uids from first_uid={config.first_uid} are in use on this machine"
    )


def _uid_lock_directory() -> str:
    """UID_LOCKS, made if need be; refused unless it is root's own directory, closed to everyone else."""
    try:
        os.mkdir(UID_LOCKS, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise RuntimeError(
            f"cannot make the sandbox uid lock directory {UID_LOCKS}: {error.strerror}"
        ) from None
    info = os.lstat(UID_LOCKS)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise RuntimeError(
            f"{UID_LOCKS} must be a directory owned by root with mode 0700; remove it and retry"
        )
    return UID_LOCKS


def _uids_with_processes() -> set[int]:
    """Every uid (real, effective, saved or filesystem) that a process, zombies included, runs as now."""
    uids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as status:
                uid_line = next(line for line in status if line.startswith("Uid:"))
        except (OSError, StopIteration):  # exited meanwhile
            continue
        uids.update(int(uid) for uid in uid_line.split()[1:])
    return uids


@contextmanager
def _sandbox_directory(uid: int | None):
    if uid is not None:
        _remove_left_directories(uid)
    directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)  # mode 0700
    try:
        if uid is not None:
            os.chown(directory, uid, uid)
        yield directory
    finally:
        remove_tree(directory)  # however deep, closed or linked the tree a test left


def _remove_left_directories(uid: int) -> None:
    """Delete the sandbox directories of this uid that a killed trainer left in the temporary directory
    (SIGKILL, the OOM killer: its _sandbox_directory never reached its clean-up). We hold the uid's lock and
    no process runs as it, so none of them belongs to a running sandbox."""
    for entry in os.scandir(tempfile.gettempdir()):
        try:
            left = (
                entry.name.startswith(DIRECTORY_PREFIX)
                and entry.is_dir(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_uid == uid
            )
        except OSError:  # removed meanwhile
            continue
        if left:
            remove_tree(entry.path)


def _supervise(
    code: str, cases: list[dict], config: SandboxConfig, uid: int | None, lock: int | None, directory: str
) -> list[dict]:
    """Run the supervisor on this job, handing it the uid's lock; its per-case reports (failures if it ran
    past the backstop)."""
    # the expected output stays here
    inputs = [{k: v for k, v in case.items() if k != "output"} for case in cases]
    job = {"program": code, "cases": inputs, "uid": uid, "trainer_pid": os.getpid(), **asdict(config)}
    # nothing of os.environ
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    process = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(supervisor.__file__)],
        cwd=directory,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=() if lock is None else (lock,),
    )
    backstop = STARTUP_SECONDS + len(cases) * (config.timeout + CLEANUP_SECONDS)
    try:
        out, err = process.communicate(json.dumps(job).encode(), timeout=backstop)
    except subprocess.TimeoutExpired:  # only under extreme load: the supervisor enforces the timeouts itself
        _stop(process)
        killed = {"proof": False, "timed_out": True, "exit_code": -signal.SIGKILL, "stdout_overflow": False}
        return [{**killed, "stdout": "", "stderr": "the sandbox ran past its backstop and was killed"}] * len(
            cases
        )
    finally:
        if process.poll() is None:  # interrupted (Ctrl-C): take the sandbox down with us
            _stop(process)
    try:
        result = json.loads(out)
    except ValueError:
        result = {"error": f"exit code {process.returncode}: {err[-2000:].decode(errors='replace')}"}
    if "error" in result:
        raise RuntimeError(f"the code sandbox could not run: {result['error']}")
    if not result["isolated"]:  # shown once: Python's default filter reports a warning once per place
        warnings.warn(f"{UNISOLATED}; sockets are still refused", RuntimeWarning, stacklevel=2)
    return result["reports"]


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM: the supervisor kills and reaps its running test, then exits; SIGKILL if it has not within a
    second."""
    process.terminate()
    try:
        process.communicate(timeout=CLEANUP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
