"""Stage 2 of the loop, verify: the limits of every sandbox run, and what one test did there.

In: the settings a user gives (`SandboxConfig`, checked once, before any work). Out: `CaseResult`, one per
test, as `run_cases` returns it. Standard library only; it knows limits and results, not processes.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_MEMORY_BYTES = 64 << 20  # below this the Python interpreter itself cannot run
# as root, uids first_uid .. first_uid + 1023: at most this many sandboxes at once per machine
SANDBOX_UIDS = 1024


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
