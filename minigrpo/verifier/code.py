"""Stage 2 of the loop, verify (code): strings in (a completion, its test cases), a float reward out.

Runs untrusted, model-generated Python in a sandbox and returns the fraction of tests it passes. It knows
strings and processes, not tensors or the tokenizer; standard library only (POSIX; Linux for namespaces).

The sandbox is `sandbox.py`, a supervisor that forks one process per test (`confine.py`: it confines
itself, then runs the program and the test) and clears up after each (`cleanup.py`); sandbox.py's
docstring says how a run is confined, confine.py's which system calls are refused. As root, what holds:
no network and no host socket (socket() refused; no datagram socketpair or addressed send); no keyring
of the trainer's; SysV IPC, host name, network and mounts of the sandbox's own, the IPC per test; no new
namespaces, ptrace, io_uring, memfd_create or memfd_secret; a uid of its own, taken only when no
process runs as it, whose supervisor dies with the trainer; a tmpfs of at most scratch_bytes and
scratch_inodes, noexec, as its directory, /tmp, /var/tmp, /dev/shm and /run/lock; rlimits on CPU,
memory, file size, processes and open files, and a wall-clock timeout. What it does not prevent, in
short: a program can read world-readable files (the dataset's answers, if they are on disk and
world-readable) and see the host's /proc (other processes' command lines) and /sys; an assert test
trusts the objects the program returns (an `__eq__` that always returns True passes `assert f(x) == y`);
a stdin/stdout test with a fixed input is passed by a program that prints the expected output; CPU and
memory are limited per process, not per sandbox (no cgroup). Without root there is no uid change; a
user namespace gives the same namespaces and tmpfs, every other mount read-only and a PID namespace with
its own /proc (sandbox.py); where the OS refuses it, nothing runs unless SandboxConfig.unisolated says
so. Every sandbox waits for the admission rule (Admission: CPUs and a memory budget). For hostile
workloads (a public endpoint, a model trained to attack its grader) run the trainer's code rewards in a
throw-away VM or container with no credentials and no data it must not see, keep test data out of
world-readable paths, and prefer stdin/stdout tests with hidden inputs over asserts.
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
from dataclasses import asdict, dataclass

from . import sandbox
from .cleanup import remove_tree
from .extract import fenced_block
from .sandbox import CLEANUP_SECONDS

STARTUP_SECONDS = 10.0  # the trainer's backstop allows the supervisor this long to start, on top of the tests
MIN_MEMORY_BYTES = 64 << 20  # below this the Python interpreter itself cannot run
PYTHON_FENCES = ("python", "py", "python3", "")  # info strings of the fenced blocks extract_code takes
SANDBOX_UIDS = (
    1024  # as root, uids first_uid .. first_uid + 1023: at most this many sandboxes at once per machine
)
# one lock file per uid in use, root's: a fixed path, machine-wide whatever TMPDIR says (/run is cleared at
# boot)
UID_LOCKS = "/run/minigrpo-sandbox-uids"
DIRECTORY_PREFIX = "minigrpo-sandbox-"  # each run's working directory, in the temporary directory
UNISOLATED = (
    "the code sandbox runs without namespaces here (the OS refused even a user namespace): tests can read "
    "the trainer's environment and memory through /proc, write its files and the shared /tmp, and use the "
    "host's SysV IPC"
)


@dataclass
class SandboxConfig:
    """Limits for every test run; checked once, before any work."""

    timeout: float = 5.0  # wall-clock seconds per test; then every process of the test is killed
    cpu_seconds: int = 5  # RLIMIT_CPU per process, in CPU seconds
    memory_bytes: int = 2 << 30  # RLIMIT_AS: address space per process
    file_size_bytes: int = 16 << 20  # RLIMIT_FSIZE: largest file a test may write, stdout and stderr included
    max_processes: int = 16  # RLIMIT_NPROC: processes and threads of the sandbox uid (enforced only as root)
    max_open_files: int = 1024  # RLIMIT_NOFILE: file descriptors per process
    scratch_bytes: int = 256 << 20  # as root, the test's tmpfs (its directory, /tmp, /dev/shm) and SysV shm
    scratch_inodes: int = 10_000  # as root, files and directories that tmpfs can hold
    max_output_bytes: int = 1 << 20  # stdout kept per test; a stdin/stdout test whose output is longer fails
    first_uid: int = 2_000_000_000  # as root, sandboxes run as uids (and gids) first_uid, first_uid + 1, ...
    # where the OS refuses the namespaces, run anyway: tests can then read the trainer's environment and
    # memory (/proc), write its files and the shared /tmp, and use the host's SysV IPC; False refuses
    unisolated: bool = False
    # sandboxes running at once, tool calls and code rewards together, reserve at most this much memory
    # (each memory_bytes plus twice scratch_bytes, its tmpfs and shared memory); None: half the machine's
    memory_budget_bytes: int | None = None

    def __post_init__(self):
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not 0 < self.timeout < 1e6
        ):
            raise ValueError(
                f"timeout must be a positive number of seconds (below 1e6), got {self.timeout!r}"
            )
        for name in (
            "cpu_seconds",
            "max_processes",
            "max_open_files",
            "max_output_bytes",
            "file_size_bytes",
            "scratch_bytes",
            "scratch_inodes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.memory_bytes, int) or self.memory_bytes < MIN_MEMORY_BYTES:
            raise ValueError(
                f"memory_bytes must be an integer of at least {MIN_MEMORY_BYTES >> 20} MiB "
                f"(Python itself needs that much), got {self.memory_bytes!r}"
            )
        if self.max_output_bytes > self.file_size_bytes:
            raise ValueError(
                f"max_output_bytes ({self.max_output_bytes}) cannot exceed "
                f"file_size_bytes ({self.file_size_bytes}): "
                "stdout is a file, so it never grows past file_size_bytes"
            )
        if self.scratch_bytes < self.file_size_bytes:
            raise ValueError(
                f"scratch_bytes ({self.scratch_bytes}) cannot be less than "
                f"file_size_bytes ({self.file_size_bytes}): "
                "a test's stdout is a file in that tmpfs"
            )
        if self.max_open_files < 16:
            raise ValueError(
                f"max_open_files must be at least 16 (Python itself opens a few), got {self.max_open_files}"
            )
        if not isinstance(self.first_uid, int) or not 0 < self.first_uid < 2**32 - SANDBOX_UIDS:
            raise ValueError(
                f"first_uid must be a uid other than root's, 1 .. {2**32 - SANDBOX_UIDS - 1}, "
                f"got {self.first_uid!r}"
            )
        if not isinstance(self.unisolated, bool):
            raise ValueError(f"unisolated must be True or False, got {self.unisolated!r}")
        budget = self.memory_budget_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"memory_budget_bytes must be a positive integer or None, got {budget!r}")

    @property
    def reserved_bytes(self) -> int:
        """What one sandbox may hold at once, as the admission rule counts it."""
        return self.memory_bytes + 2 * self.scratch_bytes


@dataclass
class CaseResult:
    """What one test case did in the sandbox."""

    passed: bool
    timed_out: bool  # killed at the wall-clock timeout
    exit_code: int  # of the test's process; negative: killed by that signal
    stdout: str  # at most max_output_bytes of it, decoded as UTF-8 (bad bytes replaced)
    stderr: str  # the last STDERR_TAIL_BYTES of it


# ---------------------------------------------------------------- completions and test specs


def extract_code(completion: str) -> str | None:
    """The body of the last fenced ```python / ```py / bare ``` block; None if there is none.

    A completion that ends inside an open fence was cut off: its final answer is missing, so None."""
    block, cut_off = fenced_block(completion, PYTHON_FENCES)
    return None if cut_off else block


def check_tests(tests, config: SandboxConfig | None = None) -> list[dict]:
    """Validate a test list (a user's mistake, so ValueError) and return it as case dicts."""
    config = config or SandboxConfig()
    if not isinstance(tests, (list, tuple)) or len(tests) == 0:
        raise ValueError(
            f"tests must be a non-empty list of test cases, got {type(tests).__name__} {tests!r:.80}"
        )
    return [_check_test(i, test, config) for i, test in enumerate(tests)]


def _check_test(i: int, test, config: SandboxConfig) -> dict:
    if isinstance(test, str):
        if not test.strip():
            raise ValueError(f"test {i} is an empty string: it would pass for any program")
        try:
            compile(test, f"<test {i}>", "exec")
        except (SyntaxError, ValueError) as error:
            raise ValueError(f"test {i} is not valid Python: {error}") from None
        return {"kind": "assert", "source": test}
    if isinstance(test, dict):
        if set(test) != {"input", "output"} or not all(isinstance(v, str) for v in test.values()):
            raise ValueError(
                f"test {i}: a stdin/stdout test is a dict with exactly the keys 'input' and 'output', "
                f"both str; got {test!r:.80}"
            )
        if len(test["output"].encode()) > config.max_output_bytes:
            raise ValueError(
                f"test {i}: the expected output is longer than max_output_bytes ({config.max_output_bytes})"
            )
        return {"kind": "stdio", "input": test["input"], "output": test["output"]}
    raise ValueError(
        f"test {i} must be a str of Python statements or a dict with 'input' and 'output', "
        f"not {type(test).__name__}"
    )


def _output_lines(text: str) -> list[str]:
    """Output as compared: trailing whitespace of each line and trailing blank lines removed."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


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
    return [_judge(case, report) for case, report in zip(cases, reports)]


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
        self.running, self.reserved = 0, 0
        self.peak_running, self.peak_reserved_bytes = 0, 0

    @contextmanager
    def admitted(self, config: SandboxConfig):
        need, budget = config.reserved_bytes, config.memory_budget_bytes or default_memory_budget()
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
        [sys.executable, "-I", os.path.abspath(sandbox.__file__)],
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


def _judge(case: dict, report: dict) -> CaseResult:
    """Assert tests pass on the proof alone; stdin/stdout tests on a clean exit and the expected output."""
    if case["kind"] == "assert":
        passed = report["proof"]
    else:
        same = not report["stdout_overflow"] and _output_lines(report["stdout"]) == _output_lines(
            case["output"]
        )
        passed = report["exit_code"] == 0 and same
    return CaseResult(passed, report["timed_out"], report["exit_code"], report["stdout"], report["stderr"])
