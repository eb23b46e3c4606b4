"""The code reward: exact fractions of tests passed, stdin/stdout tests, fence extraction, and the sandbox
held against hostile programs (loops, fork bombs, memory, files, environment, network, output, forged
passes)."""

import concurrent.futures
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from minigrpo.verifier import (
    SandboxConfig,
    code_reward,
    code_rewards,
    extract_code,
    run_cases,
    run_tests,
)
from minigrpo.verifier.programs import code as code_module
from minigrpo.verifier.programs.sandbox import supervisor

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(
    not ROOT, reason="not root: the uid drop and the namespaces need root (sandbox case not run)"
)
# hostile cases end at the 0.5 s wall clock
FAST = SandboxConfig(timeout=0.5, cpu_seconds=5, memory_bytes=512 << 20)

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]
SUM_STDIN = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"


def fenced(code, language="python"):
    return f"Here is my solution.\n```{language}\n{code}```\nIt adds the numbers."


FIRST_UID = SandboxConfig().first_uid


def sandbox_processes(first_uid=FIRST_UID, count=64):
    """Pids of live or zombie processes running as a sandbox uid."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as status:
                uid = int(status.read().split("\nUid:")[1].split()[0])
        except (OSError, IndexError):
            continue
        if first_uid <= uid < first_uid + count:
            pids.append(int(pid))
    return pids


# ---------------------------------------------------------------- rewards


def test_correct_partial_and_broken_programs():
    assert code_reward(fenced(ADD), ADD_TESTS) == 1.0
    off_by_one = "def add(a, b):\n    return a + b if a != 1 else 0\n"
    assert run_tests(off_by_one, ADD_TESTS) == [False, True, True]
    assert code_reward(fenced(off_by_one), ADD_TESTS) == 2 / 3
    assert code_reward(fenced("def add(a, b)\n    return a + b\n"), ADD_TESTS) == 0.0  # syntax error
    assert "SyntaxError" in run_cases("def add(a, b)\n", ADD_TESTS[:1])[0].stderr
    assert code_reward("def add(a, b): return a + b", ADD_TESTS) == 0.0  # no code block
    assert code_reward(fenced(ADD, "bash"), ADD_TESTS) == 0.0  # a block, but not Python
    assert code_reward(fenced(ADD, "py"), ADD_TESTS) == code_reward(fenced(ADD, ""), ADD_TESTS) == 1.0


def test_stdin_stdout_tests():
    tests = [
        {"input": "1 2\n", "output": "3"},
        {"input": "2 2", "output": "4  \n\n\n"},  # trailing spaces and blank lines do not count
        {"input": "5 5", "output": "11\n"},
        {"input": "", "output": "0"},
    ]
    assert run_tests(SUM_STDIN, tests) == [True, True, False, True]
    assert code_reward(fenced(SUM_STDIN), tests) == 0.75
    # leading whitespace does count
    assert run_tests("print(' 3')", [{"input": "", "output": "3"}]) == [False]
    crashes_after = "print(3)\nraise ValueError('late')\n"  # the right output, then a crash: not a pass
    result = run_cases(crashes_after, [{"input": "", "output": "3"}])[0]
    assert (result.passed, result.exit_code, result.stdout) == (
        False,
        1,
        "3\n",
    ) and "ValueError: late" in result.stderr
    assert run_tests("import sys\nprint(3)\nsys.exit(0)\n", [{"input": "", "output": "3"}]) == [True]


def test_main_block_runs_for_stdin_tests_only():
    program = ADD + "if __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    assert run_tests(program, [{"input": "4 5", "output": "9"}, "assert add(4, 5) == 9"]) == [True, True]


def test_each_test_starts_from_a_fresh_process_and_an_empty_directory():
    program = "import os\ncalls = []\n"
    tests = [
        "calls.append(1)\nopen('state', 'w').write('x')",
        "assert calls == [] and not os.path.exists('state')",
    ]
    assert run_tests(program, tests) == [True, True]


# ---------------------------------------------------------------- extract_code


def test_extract_code_takes_the_last_python_block():
    two = "Draft:\n```python\nx = 1\n```\nBetter:\n```py\nx = 2\n```\nOutput:\n```text\n2\n```\n"
    assert extract_code(two) == "x = 2\n"
    assert extract_code("```\nbare = True\n```") == "bare = True\n"
    assert extract_code("  ```Python3 title\n  y = 3\n  ```") == "  y = 3\n"  # indented fences, language case
    assert extract_code("no code here") is None
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("inline ```x = 1``` only") is None
    assert extract_code("```python\nx = 1\n```\n```python\nx = 2\n") is None  # cut off inside its last block
    assert extract_code("```python\nfor i in range(3):\n    print(i)") is None
    assert extract_code("```python\n```") == ""
    assert extract_code("````python\nz = 4\n````") == "z = 4\n"


def test_extract_code_is_linear_on_megabyte_inputs():
    inputs = [
        "`" * 3_000_000,
        "\n```" * 250_000,
        " " * 3_000_000 + "```",
        "```python\n" + "x = 1\n" * 500_000 + "```",
    ]
    start = time.process_time()  # CPU time: a busy machine's waits do not count, a quadratic scan would
    results = [extract_code(text) for text in inputs]
    assert time.process_time() - start < 1.0
    assert results[0] is None and results[1] == "" and results[3] == "x = 1\n" * 500_000


# ---------------------------------------------------------------- hostile programs


def test_infinite_loop_is_killed_at_the_timeout_and_the_other_tests_still_count():
    program = ADD + "def spin():\n    while True:\n        pass\n"
    start = time.perf_counter()
    results = run_cases(program, [ADD_TESTS[0], "spin()", ADD_TESTS[1]], FAST)
    assert time.perf_counter() - start < FAST.timeout + 1.5
    assert [r.passed for r in results] == [True, False, True]
    assert results[1].timed_out and results[1].exit_code == -signal.SIGKILL
    assert code_reward(fenced("while True:\n    pass\n"), ["assert True"], FAST) == 0.0


def test_fork_bomb_returns_and_leaves_no_process():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.perf_counter()  # the programs beside the bomb have uids and process limits of their own
    completions, tests = [fenced(bomb), fenced(ADD), fenced(ADD)], [["assert True"], ADD_TESTS, ADD_TESTS]
    assert code_rewards(completions, tests, FAST, workers=3) == [0.0, 1.0, 1.0]
    assert time.perf_counter() - start < FAST.timeout + 2.0
    if ROOT:
        assert sandbox_processes() == []


@as_root
def test_processes_that_leave_the_process_group_are_killed_too():
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    assert run_tests(program, ["pass"], FAST) == [True]
    assert sandbox_processes() == []


def test_huge_allocation_fails_and_the_trainer_is_unaffected():
    config = SandboxConfig(timeout=5, memory_bytes=256 << 20)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_cases("x = bytearray(8 << 30)\n", ["pass"], config)[0]
    assert not result.passed and "MemoryError" in result.stderr
    # within the limit
    assert run_tests("x = bytearray(64 << 20)\n", ["assert len(x) == 64 << 20"], config) == [True]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 20 << 10  # KiB: under 20 MiB


@as_root
def test_cannot_write_outside_its_directory(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    victim.chmod(0o666)
    shared = f"/tmp/minigrpo-test-shared-{os.getpid()}.txt"
    with open(shared, "w") as f:
        f.write("original")
    os.chmod(shared, 0o666)  # world-writable, in the world-writable /tmp
    targets = [
        str(victim),
        str(tmp_path / "new.txt"),
        shared,
        f"/tmp/minigrpo-test-new-{os.getpid()}.txt",
        os.path.abspath(__file__) + ".new",
        "inside.txt",
    ]
    program = (
        "def try_write(path):\n    try:\n        open(path, 'a').write('pwned')\n        return 'ok'\n"
        "    except OSError as error:\n        return type(error).__name__\n"
        f"for path in {targets!r}:\n    print(try_write(path))\n"
    )
    try:
        result = run_cases(program, [{"input": "", "output": ""}])[0]
        # the test's tmp_path is under /tmp, which inside the sandbox is the sandbox directory: not found
        # there, and the /tmp writes "succeed" into the sandbox directory; the repository is not the sandbox
        # uid's (or, for a checkout under /tmp, not there at all)
        printed = result.stdout.split()
        assert printed[:4] + printed[5:] == ["FileNotFoundError"] * 2 + ["ok", "ok", "ok"]
        assert printed[4] in ("PermissionError", "FileNotFoundError")
        assert victim.read_text() == "original" and not (tmp_path / "new.txt").exists()
        assert open(shared).read() == "original" and not os.path.exists(targets[3])
        assert not os.path.exists(targets[4])
    finally:
        os.remove(shared)


def test_cannot_see_the_trainers_environment(monkeypatch):
    monkeypatch.setenv("MINIGRPO_TEST_SECRET", "hunter2")
    program = (
        "import os\nprint(sorted(os.environ))\n"
        f"for pid in (os.getppid(), {os.getpid()}):\n"
        "    try:\n        print('hunter2' in open(f'/proc/{pid}/environ').read())\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
    )
    result = run_cases(program, [{"input": "", "output": ""}])[0]
    lines = result.stdout.splitlines()
    assert lines[0] == "['LANG', 'LC_ALL', 'PATH']" and "hunter2" not in result.stdout
    if ROOT:  # without root the sandbox shares the trainer's uid, and /proc/<trainer>/environ is readable
        assert lines[1:] == ["PermissionError", "PermissionError"]


@as_root
def test_no_network():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    socket.create_connection(("127.0.0.1", port), timeout=1).close()  # reachable from here
    server.accept()[0].close()
    program = (
        "import socket\ndef can_connect(port):\n    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=1).close()\n        return True\n"
        "    except OSError:\n        return False\n"
    )
    try:
        assert code_reward(fenced(program), [f"assert not can_connect({port})"]) == 1.0
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing arrived
    finally:
        server.close()


def test_huge_output_is_bounded():
    config = SandboxConfig(file_size_bytes=1 << 20, max_output_bytes=64 << 10)
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    start = time.perf_counter()
    result = run_cases(flood, [{"input": "", "output": "x"}], config)[0]
    assert time.perf_counter() - start < 3.0
    assert not result.passed and len(result.stdout) == 64 << 10 and "File too large" in result.stderr
    # under the file limit
    result = run_cases("print('y' * 100_000)", [{"input": "", "output": "y"}], config)[0]
    assert not result.passed and result.exit_code == 0 and len(result.stdout) == 64 << 10


def test_exiting_early_is_not_a_pass():
    completions = [
        fenced("import sys\nsys.exit(0)\n" + ADD),
        fenced("import os\nos._exit(0)\n" + ADD),
        fenced("import sys\ndef add(a, b):\n    sys.exit(0)\n"),
        fenced("import os\ndef add(a, b):\n    os._exit(0)\n"),
        fenced("import sys\ndef add(a, b):\n    raise SystemExit\n"),
    ]
    assert code_rewards(completions, [ADD_TESTS] * len(completions), workers=2) == [0.0] * len(completions)


def test_forging_the_pass_signal_is_not_a_pass():
    forgers = [
        "print('PASS')\nprint('ok')\n",
        "import os\nfor fd in range(1, 10):\n    try:\n"
        "        os.write(fd, os.urandom(16).hex().encode() + b'\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
        # the harness bound them first
        "import builtins\nbuiltins.exec = builtins.compile = lambda *a, **k: None\n",
        "import os\nos.write = lambda *a: None\nos._exit = lambda *a: None\n",
    ]
    failing = ["assert add(1, 2) == 4", "assert False"]
    assert [code_reward(fenced(forger + ADD), failing) for forger in forgers] == [0.0] * len(forgers)


def test_sandbox_directory_is_removed():
    program = "import os\nopen('left-behind.txt', 'w').write('x')\nos.mkdir('sub')\nprint(os.getcwd())\n"
    result = run_cases(program, [{"input": "", "output": ""}])[0]
    assert os.path.basename(result.stdout.strip()).startswith("minigrpo-sandbox-")
    assert not os.path.exists(result.stdout.strip())


def test_runs_unprivileged_with_its_limits():
    program = (
        "import os, resource\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
        "names = ('CPU', 'AS', 'FSIZE', 'NPROC', 'NOFILE', 'CORE')\n"
        "print(*(resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in names))\n"
        "print([line for line in open('/proc/self/status') if line.startswith('NoNewPrivs')])\n"
    )
    config = SandboxConfig(cpu_seconds=3, memory_bytes=300 << 20, file_size_bytes=2 << 20, max_processes=7)
    lines = run_cases(program, [{"input": "", "output": ""}], config)[0].stdout.splitlines()
    assert lines[1] == f"(3, 4) ({300 << 20}, {300 << 20}) ({2 << 20}, {2 << 20}) (7, 7) (1024, 1024) (0, 0)"
    assert lines[2] == "['NoNewPrivs:\\t1\\n']"
    if ROOT:
        uid = config.first_uid
        assert lines[0] == f"{uid} {uid} []"


@as_root
def test_concurrent_sandboxes_get_their_own_uids():
    first = SandboxConfig().first_uid
    with code_module._sandbox_uid(SandboxConfig()) as (taken, _):  # as if another sandbox were running
        uid = int(run_cases("import os\nprint(os.getuid())", [{"input": "", "output": ""}])[0].stdout)
    assert (taken, uid) == (first, first + 1)
    assert int(run_cases("import os\nprint(os.getuid())", [{"input": "", "output": ""}])[0].stdout) == first


def test_backstop_stops_a_late_supervisor(monkeypatch):
    monkeypatch.setattr(code_module, "STARTUP_SECONDS", -5.5)  # backstop = -5.5 + 1 test * (5 + 1) s = 0.5 s
    start = time.perf_counter()
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n"
    result = run_cases(program, ["pass"], SandboxConfig(timeout=5))[0]
    assert time.perf_counter() - start < 2.0
    assert (result.passed, result.timed_out) == (False, True) and "backstop" in result.stderr
    if ROOT:
        assert sandbox_processes() == []


# ---------------------------------------------------------------- escape attempts, as a table

SHARED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
PROBE = f"minigrpo-probe-{os.getpid()}"


def sandbox_owned_entries():
    """Entries of the host's shared writable directories owned by a sandbox uid: what a sandbox left."""
    first = SandboxConfig().first_uid
    left = []
    for directory in filter(os.path.isdir, SHARED):
        for entry in os.scandir(directory):
            try:
                if first <= entry.stat(follow_symlinks=False).st_uid < first + code_module.SANDBOX_UIDS:
                    left.append(entry.path)
            except OSError:
                pass
    return left


@pytest.fixture
def unix_server():
    """A world-writable UNIX socket on the host, outside every directory the sandbox covers (so under
    /run)."""
    path = f"/run/{PROBE}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    server.setblocking(False)
    yield server, path
    server.close()
    os.remove(path)


def write_everywhere():
    return "".join(f"open('{d}/{PROBE}', 'w').write('x' * 1000)\n" for d in SHARED)


ESCAPES = {  # name: (program, what the host must look like after it)
    "files in the shared writable directories": (
        write_everywhere(),
        lambda: not any(os.path.exists(os.path.join(d, PROBE)) for d in SHARED),
    ),
    "3,000 nested directories": (
        "import os\nfor _ in range(3000):\n    os.mkdir('a')\n    os.chdir('a')\n"
        "open('deep', 'w').write('x')\n",
        lambda: True,
    ),
    "a directory closed to its owner": (
        "import os\nos.makedirs('closed/inner')\nopen('closed/inner/f', 'w').write('x')\n"
        "os.chmod('closed/inner', 0)\n"
        "os.chmod('closed', 0)\n",
        lambda: True,
    ),
    "a symlink to the host's files": (
        f"import os\nos.symlink({os.path.dirname(os.path.abspath(__file__))!r}, 'tests')\n"
        f"os.symlink({os.path.abspath(__file__)!r}, 'this_file')\n",
        lambda: os.path.isfile(__file__),
    ),
    # checked against the server below
    "a connection to a host UNIX socket": (
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/{PROBE}.sock')\n"
        "s.sendall(b'pwned')\n",
        None,
    ),
}


@as_root
@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_attempts_are_contained_and_leave_nothing_on_the_host(name, unix_server):
    program, host_is_intact = ESCAPES[name]
    before = sandbox_owned_entries()
    # returns: nothing the program did raises out of the reward
    result = run_cases(program, ["pass"], FAST)[0]
    assert sandbox_owned_entries() == before  # no file, directory or sandbox directory left behind
    if host_is_intact is not None:
        assert host_is_intact(), result.stderr
    else:
        assert not result.passed and "PermissionError" in result.stderr  # socket() itself is refused
        with pytest.raises(BlockingIOError):
            unix_server[0].accept()  # nobody connected
    assert code_reward(fenced(program), ["pass"], FAST) in (0.0, 1.0)


def test_sockets_are_refused_without_root_too():
    program = "import socket\nsocket.socket(socket.AF_INET)\n"
    result = run_cases(program, ["pass"], FAST)[0]
    assert not result.passed and "Operation not permitted" in result.stderr
    pair = "import socket\na, b = socket.socketpair()\na.sendall(b'x')\nassert b.recv(1) == b'x'\n"
    assert run_tests(pair, ["pass"]) == [True]  # socketpair's ends reach only each other


@as_root
def test_a_failed_mount_stops_the_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr(code_module.supervisor, "__file__", sandbox_with_failing_mount(tmp_path))
    with pytest.raises(RuntimeError, match="sandbox isolation failed: .*mount .* on /var/tmp"):
        run_tests(ADD, ADD_TESTS[:1])


def sandbox_with_failing_mount(directory):
    """A copy of supervisor.py whose bind mount over /var/tmp fails, as it did when its source path was
    unreachable."""
    return hooked_supervisor(
        directory,
        'mounts.mount(f"/proc/self/fd/{directory}", shared,',
        'mounts.mount("/nonexistent" if shared == "/var/tmp" else f"/proc/self/fd/{directory}", shared,',
    )


def hooked_supervisor(directory, old: str, new: str) -> str:
    """A copy of supervisor.py in `directory` with `old` (which it must hold) replaced by `new`, beside copies
    of its siblings, which it loads from its own directory; the copy's path."""
    source = open(code_module.supervisor.__file__).read()
    hooked = source.replace(old, new)
    assert hooked != source
    path = directory / "supervisor.py"
    path.write_text(hooked)
    verifier = os.path.dirname(code_module.supervisor.__file__)
    for sibling in ("confine.py", "seccomp.py", "cleanup.py", "process_io.py", "mounts.py"):
        (directory / sibling).write_text(open(os.path.join(verifier, sibling)).read())
    return str(path)


@as_root
def test_two_processes_sandboxes_do_not_kill_each_others_tests(tmp_path):
    """Each supervisor kills every process of its uid after each test: with one uid block per process, as
    before, one trainer's clean-up killed the other's running tests."""
    script = textwrap.dedent("""
        from minigrpo.verifier import run_tests
        slow = "import time\\ndef add(a, b):\\n    time.sleep(0.3)\\n    return a + b\\n"
        print(run_tests(slow, ["assert add(1, 2) == 3"] * 4))
    """)
    runs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    assert [run.communicate(timeout=60)[0].strip() for run in runs] == ["[True, True, True, True]"] * 2


# ---------------------------------------------------------------- what a test could share with the host

LIBC = ctypes.CDLL(None, use_errno=True)
SYSCALL = {"x86_64": dict(add_key=248, keyctl=250), "aarch64": dict(add_key=217, keyctl=219)}.get(
    os.uname().machine
)
SESSION_KEYRING, KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_INVALIDATE = -3, 10, 11, 21
STDIO = [{"input": "", "output": ""}]  # a test that passes whatever the program prints
# program text: raw(number, *args) is a system call; attempt() prints 'ok' or the error's class and errno
ATTEMPT = (
    "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "def raw(*args):\n"
    "    result = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))\n"
    "    if result < 0:\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
    "    return result\n"
    "def attempt(name, call):\n    try:\n        print(name, 'ok', call())\n"
    "    except OSError as error:\n        print(name, type(error).__name__, error.errno)\n"
)


def raw_syscall(number, *args):
    return LIBC.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


@pytest.mark.skipif(SYSCALL is None, reason="add_key's number is known only for x86_64 and aarch64")
def test_the_trainers_session_keyring_is_out_of_reach():
    secret = f"hf_secret_{os.getpid()}".encode()
    description = f"minigrpo-test-token-{os.getpid()}".encode()
    key = raw_syscall(SYSCALL["add_key"], b"user", description, secret, len(secret), SESSION_KEYRING)
    if key < 0:
        pytest.skip(f"add_key failed here: {os.strerror(ctypes.get_errno())} (no keyrings in this kernel?)")
    keyctl = SYSCALL["keyctl"]
    program = ATTEMPT + (
        f"search = lambda: raw({keyctl}, {KEYCTL_SEARCH}, {SESSION_KEYRING}, b'user', {description!r}, 0)\n"
        f"buffer = ctypes.create_string_buffer(256)\n"
        f"def read():\n    size = raw({keyctl}, {KEYCTL_READ}, search(), buffer, 256)\n"
        "    return buffer.raw[:size]\n"
        "attempt('search', search)\nattempt('read', read)\nprint(open('/proc/keys').read())\n"
    )
    try:
        # here it is found
        assert raw_syscall(keyctl, KEYCTL_SEARCH, SESSION_KEYRING, b"user", description, 0) == key
        result = run_cases(program, STDIO)[0]
    finally:
        raw_syscall(keyctl, KEYCTL_INVALIDATE, key)
    assert secret.decode() not in result.stdout and description.decode() not in result.stdout, result.stdout
    assert result.stdout.startswith("search PermissionError 1\nread PermissionError 1\n"), (
        result.stdout + result.stderr
    )


IPC_CREAT, IPC_RMID, SHM_RDONLY = 0o1000, 0, 0o10000
SHM = (
    ATTEMPT
    + (  # peek(key): the first bytes of SysV segment `key`; leave(key): a segment that outlives the test
        "libc.shmat.restype = ctypes.c_void_p\n"
        "def segment(key, size=0, flags=0):\n    shmid = libc.shmget(key, size, flags)\n"
        "    if shmid < 0:\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        "    return shmid\n"
        f"peek = lambda key: ctypes.string_at(libc.shmat(segment(key), None, {SHM_RDONLY}), 5)\n"
        f"def leave(key):\n    address = libc.shmat(segment(key, 4096, {IPC_CREAT} | 0o666), None, 0)\n"
        "    ctypes.memmove(address, b'left!', 5)\n"
    )
)


@as_root
def test_sysv_ipc_is_each_tests_own():
    """A test sees neither the host's segments nor an earlier test's; what it leaves dies with it, and no
    segment is larger than scratch_bytes."""
    host_key, left_key = 0x6D670000 + os.getpid() % 0xFFFF, 0x6D680000 + os.getpid() % 0xFFFF
    config = SandboxConfig(scratch_bytes=8 << 20, file_size_bytes=1 << 20, max_output_bytes=1 << 20)
    LIBC.shmat.restype = ctypes.c_void_p
    host_segment = LIBC.shmget(host_key, 4096, IPC_CREAT | 0o644)
    huge = f"lambda: segment(0, {(8 << 20) + 4096}, {IPC_CREAT} | 0o600)"  # IPC_PRIVATE, past scratch_bytes
    tests = [
        f"attempt('host', lambda: peek({host_key}))\nleave({left_key})\nattempt('huge', {huge})",
        f"attempt('earlier', lambda: peek({left_key}))",
    ]
    try:
        ctypes.memmove(LIBC.shmat(host_segment, None, 0), b"host!", 5)
        first, second = run_cases(SHM, tests, config)
        later = run_cases(SHM, tests[1:], config)[0]
    finally:
        LIBC.shmctl(host_segment, IPC_RMID, None)
    assert first.stdout.splitlines() == ["host FileNotFoundError 2", "huge OSError 22"], (
        first.stdout + first.stderr
    )
    assert second.stdout == later.stdout == "earlier FileNotFoundError 2\n", second.stdout + later.stdout
    assert LIBC.shmget(left_key, 0, 0) == -1  # nothing left on the host


@pytest.fixture
def datagram_server(tmp_path):
    """A world-writable UNIX datagram socket on the host where the sandbox sees it: under /run as root (the
    sandbox covers /tmp), else in tmp_path."""
    path = f"/run/{PROBE}.dgram" if ROOT else str(tmp_path / "probe.dgram")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.setblocking(False)
    yield server, path
    server.close()
    os.remove(path)


def test_no_host_unix_socket_is_reachable_through_a_socketpair(datagram_server):
    """socket() is refused, so a socketpair is all a test can have: none of its kinds reaches a host path."""
    server, path = datagram_server
    program = ATTEMPT + (
        "pairs = []  # both ends stay open\n"
        "def end(kind):\n    pairs.append(socket.socketpair(socket.AF_UNIX, kind))\n    return pairs[-1][0]\n"
        f"attempt('datagram pair', lambda: end(socket.SOCK_DGRAM).sendto(b'pwned', {path!r}))\n"
        f"attempt('raw pair', lambda: end(socket.SOCK_RAW).sendto(b'pwned', {path!r}))\n"
        f"attempt('stream sendto', lambda: end(socket.SOCK_STREAM).sendto(b'pwned', {path!r}))\n"
        f"attempt('stream sendmsg', lambda: end(socket.SOCK_STREAM).sendmsg([b'pwned'], [], 0, {path!r}))\n"
        "attempt('seqpacket sendmsg', "
        f"lambda: end(socket.SOCK_SEQPACKET).sendmsg([b'pwned'], [], 0, {path!r}))\n"
        f"attempt('connect', lambda: end(socket.SOCK_STREAM).connect({path!r}))\n"
        "attempt('bind', lambda: end(socket.SOCK_STREAM).bind('\\0minigrpo-probe'))\n"
    )
    result = run_cases(program, STDIO)[0]
    assert result.stdout.splitlines() == [
        "datagram pair PermissionError 1",
        "raw pair PermissionError 1",
        "stream sendto PermissionError 1",
        "stream sendmsg OSError 106",  # EISCONN: Linux refuses an address on a connected stream socket
        # delivered to its own pair: Linux ignores the address on a seqpacket socket
        "seqpacket sendmsg ok 5",
        "connect PermissionError 1",
        "bind PermissionError 1",
    ], result.stdout + result.stderr
    with pytest.raises(BlockingIOError):
        server.recv(16)  # nothing arrived


# ------------------------------------------------------------ uids: locks, stragglers, a trainer that dies

HOLD_A_UID = (
    "import sys\nfrom minigrpo.verifier.programs import code\n"
    "with code._sandbox_uid(code.SandboxConfig()) as (uid, _):\n"
    "    print(uid, flush=True)\n    sys.stdin.read()\n"
)


@as_root
def test_uid_locks_do_not_follow_tmpdir(tmp_path):
    """Two trainers with different TMPDIRs (a per-job TMPDIR, systemd's PrivateTmp) still take different
    uids."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_UID], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = int(holder.stdout.readline())
        with code_module._sandbox_uid(SandboxConfig()) as (ours, _):
            assert ours != theirs
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


@as_root
def test_an_unusable_uid_lock_directory_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(code_module, "UID_LOCKS", str(tmp_path / "missing" / "uids"))
    with pytest.raises(
        RuntimeError, match="cannot make the sandbox uid lock directory .*: No such file or directory"
    ):
        run_tests(ADD, ADD_TESTS[:1])


@as_root
def test_a_uid_that_a_process_still_runs_as_is_not_taken():
    first = SandboxConfig().first_uid
    become_first = (
        f"import os, sys\nos.setgid({first})\nos.setuid({first})\nprint(flush=True)\nsys.stdin.read()"
    )
    straggler = subprocess.Popen(
        [sys.executable, "-c", become_first], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        straggler.stdout.readline()  # it runs as `first` now, holding no lock
        with code_module._sandbox_uid(SandboxConfig()) as (uid, _):
            assert uid == first + 1
    finally:
        straggler.kill()
        straggler.wait()


def process_table():
    """pid: (parent pid, real uid, state letter) of every process."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        table[int(pid)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]), fields["State"].split()[0])
    return table


def wait_for(condition, seconds):
    deadline = time.monotonic() + seconds
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


TRAINER = (  # three tests of a minute each
    "from minigrpo.verifier import SandboxConfig, run_tests\n"
    "run_tests('pass', ['import time\\ntime.sleep(60)'] * 3, SandboxConfig(timeout=60))\n"
)


def sandbox_child(parent):
    """(pid, uid) of a live child of `parent` that runs as a sandbox uid and is still there a moment later
    (the supervisor's brief kill(-1) helpers are not); None if there is none."""
    first = SandboxConfig().first_uid

    def live():
        return {
            (pid, uid)
            for pid, (ppid, uid, state) in process_table().items()
            if ppid == parent and uid >= first and state != "Z"
        }

    seen = live()
    time.sleep(0.1)
    return next(iter(seen & live()), None)


def ours(pid, supervisor_pid):
    """Whether `pid` is still the supervisor or the test this test started (not a process that reused the
    pid)."""
    try:
        command = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False
    if pid == supervisor_pid:
        return b"supervisor.py" in command
    return process_table().get(pid, (0, 0))[1] >= SandboxConfig().first_uid


@as_root
def test_the_supervisor_and_its_test_die_with_the_trainer():
    """A SIGKILLed trainer leaves no supervisor running tests as a uid that is no longer locked; the next
    sandbox of that uid removes the working directory it left."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER])
    supervisor = test = None
    try:
        supervisor = wait_for(
            lambda: next((pid for pid, (ppid, _, _) in process_table().items() if ppid == trainer.pid), None),
            10,
        )
        found = wait_for(lambda: sandbox_child(supervisor), 10)
        assert found is not None, "the test never started"
        test, uid = found
        held = {os.readlink(f"/proc/{supervisor}/fd/{fd}") for fd in os.listdir(f"/proc/{supervisor}/fd")}
        assert f"{code_module.UID_LOCKS}/{uid}" in held  # the uid stays locked while the supervisor runs
        (left,) = [
            entry.path
            for entry in os.scandir(tempfile.gettempdir())
            if entry.name.startswith(code_module.DIRECTORY_PREFIX) and entry.stat().st_uid == uid
        ]
        trainer.kill()
        trainer.wait()

        def running():
            return [pid for pid in (supervisor, test) if process_table().get(pid, (0, 0, "Z"))[2] != "Z"]

        assert wait_for(lambda: not running(), 5), f"still running: {running()}"
        assert os.path.isdir(left)  # the trainer never reached its clean-up
        assert wait_for(lambda: uid not in code_module._uids_with_processes(), 5)  # its zombies reaped
        assert run_tests("pass", ["pass"], SandboxConfig(first_uid=uid)) == [True]
        assert not os.path.exists(left)
    finally:
        trainer.kill()
        for pid in (supervisor, test):
            if pid is not None and ours(pid, supervisor):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------ the system calls a test is refused, and what it keeps

NUMBERS = {  # system calls the programs below make directly, by machine
    "x86_64": dict(unshare=272, clone=56, ptrace=101, memfd_secret=447, personality=135, userfaultfd=323),
    "aarch64": dict(unshare=97, clone=220, ptrace=117, memfd_secret=447, personality=92, userfaultfd=282),
}
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17


def test_no_new_namespaces_ptrace_or_unaccounted_memory():
    program = ATTEMPT + (
        f"call = {NUMBERS!r}[os.uname().machine]\n"
        "def clone_into(flags):\n"
        f"    pid = raw(call['clone'], flags | {SIGCHLD}, 0, 0, 0, 0)\n"
        "    if pid == 0:\n        os._exit(0)  # the child, had it been made\n"
        "    return os.waitpid(pid, 0)[1]\n"
        f"attempt('unshare user', lambda: raw(call['unshare'], {CLONE_NEWUSER}))\n"
        f"attempt('unshare net', lambda: raw(call['unshare'], {CLONE_NEWNET}))\n"
        f"attempt('clone user', lambda: clone_into({CLONE_NEWUSER}))\n"
        "attempt('ptrace traceme', lambda: raw(call['ptrace'], 0, 0, 0, 0))\n"
        "attempt('memfd_secret', lambda: raw(call['memfd_secret'], 0))\n"
        "attempt('memfd_create', lambda: os.memfd_create('held'))\n"
        "attempt('userfaultfd', lambda: raw(call['userfaultfd'], 1))  # UFFD_USER_MODE_ONLY\n"
        "attempt('personality set', lambda: raw(call['personality'], 0x0040000))  # ADDR_NO_RANDOMIZE\n"
        "attempt('personality query', lambda: raw(call['personality'], 0xFFFFFFFF) >= 0)\n"
        "attempt('fork', lambda: clone_into(0))\n"
    )
    result = run_cases(program, STDIO)[0]
    assert result.stdout.splitlines() == [
        "unshare user PermissionError 1",
        "unshare net PermissionError 1",
        "clone user PermissionError 1",
        "ptrace traceme PermissionError 1",
        "memfd_secret PermissionError 1",
        "memfd_create OSError 38",  # ENOSYS, as on a kernel without it
        "userfaultfd PermissionError 1",
        "personality set PermissionError 1",
        "personality query ok True",
        "fork ok 0",  # clone without a namespace flag is fork
    ], result.stdout + result.stderr


ORDINARY = """
import asyncio, multiprocessing, subprocess, sys, threading
results = []
threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(sorted(results))
print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
with multiprocessing.get_context("fork").Pool(2) as pool:
    print(pool.map(abs, [-1, -2, -3]))
async def main():
    await asyncio.sleep(0)
    return "asyncio"
print(asyncio.run(main()))
"""


def test_ordinary_programs_still_run():
    """Threads (clone3 is ENOSYS, so glibc uses clone), subprocesses, a fork pool and asyncio's socketpair."""
    expected = "[0, 1, 2, 3]\n42\n[1, 2, 3]\nasyncio"
    result = run_cases(ORDINARY, [{"input": "", "output": expected}])[0]
    assert result.passed, result.stdout + result.stderr


@as_root
def test_a_host_name_of_its_own_and_nothing_executable_in_its_directories():
    program = ATTEMPT + (
        "import subprocess\nprint(socket.gethostname())\n"
        "attempt('sethostname', lambda: socket.sethostname('host'))\n"
        "for directory in ('.', '/tmp', '/dev/shm'):\n"
        "    open(f'{directory}/run.sh', 'w').write('#!/bin/sh\\necho ran\\n')\n"
        "    os.chmod(f'{directory}/run.sh', 0o755)\n"
        "    attempt(directory, lambda: subprocess.run([f'{directory}/run.sh']).returncode)\n"
    )
    result = run_cases(program, STDIO)[0]
    assert socket.gethostname() != "sandbox"
    # EACCES: noexec
    refused = [
        ". PermissionError 13",
        "/tmp PermissionError 13",
        "/dev/shm PermissionError 13",
    ]
    assert result.stdout.splitlines() == ["sandbox", "sethostname PermissionError 1", *refused], (
        result.stdout + result.stderr
    )


@as_root
def test_its_directories_hold_at_most_scratch_bytes_and_scratch_inodes():
    config = SandboxConfig(
        scratch_bytes=4 << 20, scratch_inodes=200, file_size_bytes=1 << 20, max_output_bytes=1 << 20
    )
    program = (
        "import errno, glob, os\n"
        "def fill(make):\n    count = 0\n    try:\n        while True:\n"
        "            make(count)\n            count += 1\n"
        "    except OSError as error:\n        return count, errno.errorcode[error.errno]\n"
        "files, error = fill(lambda i: open(f'/tmp/big{i}', 'wb').write(b'x' * (1 << 20)))\n"
        "print(files <= 4, error)\n"
        "for name in glob.glob('/tmp/big*'):\n    os.remove(name)\n"
        "files, error = fill(lambda i: open(f'/dev/shm/f{i}', 'w').close())\n"
        "print(files <= 200, error)\n"
    )
    result = run_cases(program, STDIO, config)[0]
    assert result.stdout == "True ENOSPC\nTrue ENOSPC\n", result.stdout + result.stderr


# ---------------------------------------------------------------- batches and mistakes


def test_batch_equals_one_at_a_time():
    times = "def add(a, b):\n    return a * b\n"
    completions = [fenced(ADD), fenced(times), "no code", fenced("def add(:"), fenced(SUM_STDIN)]
    tests = [
        ADD_TESTS,
        ["assert add(2, 2) == 4", "assert add(1, 2) == 3"],
        ADD_TESTS,
        ADD_TESTS,
        [{"input": "1 1", "output": "2"}, {"input": "1 1", "output": "3"}],
    ]
    batch = code_rewards(completions, tests, workers=3)
    assert batch == [code_reward(c, t) for c, t in zip(completions, tests)] == [1.0, 0.5, 0.0, 0.0, 0.5]


@pytest.mark.parametrize(
    "tests, message",
    [
        ([], "non-empty list"),
        ("assert True", "non-empty list"),
        ([42], "test 0 must be a str of Python statements or a dict"),
        (["assert True", ""], "test 1 is an empty string"),
        (["assert (1"], "test 0 is not valid Python"),
        (
            [{"input": "1"}],
            "test 0: a stdin/stdout test is a dict with exactly the keys 'input' and 'output'",
        ),
        ([{"input": 1, "output": "2"}], "both str"),
        ([{"input": "", "output": "x" * 65537}], "longer than max_output_bytes"),
    ],
)
def test_bad_test_specs_raise(tests, message):
    with pytest.raises(ValueError, match=message):
        code_reward("no code needed to fail", tests, SandboxConfig(max_output_bytes=65536))


def test_batch_needs_one_test_list_per_completion_and_workers():
    with pytest.raises(ValueError, match="2 completions but 1 test lists"):
        code_rewards(["a", "b"], [ADD_TESTS])
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        code_rewards(["a"], [ADD_TESTS], workers=0)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(timeout=0), "timeout must be a positive number of seconds"),
        (dict(cpu_seconds=0), "cpu_seconds must be a positive integer"),
        (dict(cpu_seconds=1.5), "cpu_seconds must be a positive integer"),
        (dict(memory_bytes=1 << 20), "memory_bytes must be an integer of at least 64 MiB"),
        (dict(max_processes=0), "max_processes must be a positive integer"),
        (
            dict(max_output_bytes=2 << 20, file_size_bytes=1 << 20),
            r"max_output_bytes \(2097152\) cannot exceed file_size",
        ),
        (dict(first_uid=0), "first_uid must be a uid other than root's"),
        (dict(scratch_bytes=1 << 20), r"scratch_bytes \(1048576\) cannot be less than file_size_bytes"),
        (dict(scratch_inodes=0), "scratch_inodes must be a positive integer"),
        (dict(max_open_files=8), "max_open_files must be at least 16"),
    ],
)
def test_config_invariants(settings, message):
    with pytest.raises(ValueError, match=message):
        SandboxConfig(**settings)


@pytest.fixture
def as_a_plain_user(monkeypatch):
    """The sandbox as a plain user runs it: no sandbox uid (the user namespace path), whoever runs the
    tests. As root the test processes are then root's uid inside a user namespace, without root's
    capabilities outside it: what the namespaces hide is what a plain user's sandbox hides."""

    @contextlib.contextmanager
    def no_uid(config):
        yield None, None

    monkeypatch.setattr(code_module, "_sandbox_uid", no_uid)


def test_as_a_plain_user_the_trainers_processes_and_files_are_out_of_reach(as_a_plain_user):
    """The trainer's /proc entry (its environment, memory, descriptors) is not there, its files cannot be
    written (an output directory outside /tmp, which the sandbox covers), and no mount can uncover them;
    the sandbox's own tmpfs still takes writes."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(__file__))) as directory:
        output = os.path.join(directory, "metrics.jsonl")
        with open(output, "w") as f:
            f.write("step 1\n")
        result = run_cases(hostile_to_the_trainer(output), [{"input": "", "output": ""}])[0]
        with open(output) as f:
            assert f.read() == "step 1\n"
    lines = result.stdout.splitlines()
    # the output file: on a read-only mount (OSError, EROFS), or under /tmp, which the sandbox's tmpfs covers
    assert lines[3] in ("OSError", "FileNotFoundError"), result.stderr
    assert lines[:3] + lines[4:] == ["False True", "FileNotFoundError", "FileNotFoundError", "-1 -1", "ok"]


def hostile_to_the_trainer(output: str) -> str:
    """A program that looks for this process in /proc, reads its environment and memory, appends to
    `output`, tries to unmount /proc or mount another, and writes its own /tmp: one line each."""
    return textwrap.dedent(
        f"""
        import ctypes, os
        processes = [p for p in os.listdir('/proc') if p.isdigit()]
        print(os.path.exists('/proc/{os.getpid()}'), len(processes) <= 3)
        for attempt in (lambda: open('/proc/{os.getpid()}/environ').read(),
                        lambda: open('/proc/{os.getpid()}/mem', 'rb').read(1),
                        lambda: open({output!r}, 'a').write('forged\\n')):
            try:
                attempt()
                print('read or written')
            except OSError as error:
                print(type(error).__name__)
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.umount2(b'/proc', 2), libc.mount(b'proc', b'/mnt', b'proc', 0, None))
        open('/tmp/scratch', 'w').write('ok')
        print(open('/tmp/scratch').read())
        """
    )


def test_as_a_plain_user_the_sandbox_still_has_no_network(as_a_plain_user):
    program = "import socket\ntry:\n    socket.socket()\nexcept OSError as error:\n    print(error.errno)\n"
    result = run_cases(program, [{"input": "", "output": ""}])[0]
    assert result.stdout.strip() == "1" and os.uname().nodename != "sandbox", result.stderr


def sandbox_without_namespaces(directory):
    """A copy of supervisor.py (and its siblings) on which the OS refuses every namespace."""
    return hooked_supervisor(
        directory,
        "def _unshare(flags: int) -> bool:\n",
        "def _unshare(flags: int) -> bool:\n    return False\n",
    )


def test_where_the_os_refuses_the_namespaces_no_code_runs_without_an_opt_in(
    as_a_plain_user, monkeypatch, tmp_path
):
    """A plain user whom the OS refuses even a user namespace: the program does not run, unless opted in."""
    monkeypatch.setattr(code_module.supervisor, "__file__", sandbox_without_namespaces(tmp_path))
    marker = tmp_path / "ran"
    program = f"open({str(marker)!r}, 'w').close()\n"
    with pytest.raises(RuntimeError, match=r"SandboxConfig\(unisolated=True\) runs it anyway"):
        run_cases(program, [{"input": "", "output": ""}])
    assert not marker.exists()
    with pytest.warns(RuntimeWarning, match="read the trainer's environment and memory"):
        (result,) = run_cases(program, [{"input": "", "output": ""}], SandboxConfig(unisolated=True))
    assert result.passed and marker.exists()


def test_sandboxes_wait_for_room_in_the_memory_budget(monkeypatch):
    """Six programs at once, each touching 40 MB, with room for two in the budget: never more than two run
    at once, and every one runs to its end."""
    admission = code_module.Admission()
    monkeypatch.setattr(code_module, "ADMISSION", admission)
    config = SandboxConfig(
        timeout=5.0, memory_bytes=256 << 20, scratch_bytes=16 << 20, file_size_bytes=1 << 20
    )
    config.memory_budget_bytes = 2 * config.reserved_bytes
    program = "block = bytearray(40 << 20)\nprint(len(block))\n"
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(
            pool.map(lambda _: run_cases(program, [{"input": "", "output": "41943040"}], config), range(6))
        )
    assert all(result.passed for (result,) in results)
    assert admission.peak_running == min(2, os.cpu_count()) and admission.running == 0
    assert admission.peak_reserved_bytes <= config.memory_budget_bytes


def test_a_bad_memory_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="memory_budget_bytes must be a positive integer or None"):
        SandboxConfig(memory_budget_bytes=0)
    with pytest.raises(ValueError, match="unisolated must be True or False"):
        SandboxConfig(unisolated="yes")


def test_the_admission_rules_peak_is_reported_once_a_sandbox_has_run(monkeypatch):
    admission = code_module.Admission()
    monkeypatch.setattr(code_module, "ADMISSION", admission)
    assert code_module.sandbox_stats() == {}
    run_cases("print(1)", [{"input": "", "output": "1"}], FAST)
    stats = code_module.sandbox_stats()
    assert stats["sandbox/peak_running"] == 1.0
    assert stats["sandbox/peak_reserved_gib"] == FAST.reserved_bytes / 2**30


UNDER_TMP = """
import os, subprocess, sys
print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
print(sys.prefix.startswith("/tmp/"))
for attempt in (lambda: open(SECRET).read(), lambda: open(os.path.join(sys.prefix, "forged"), "w")):
    try:
        attempt()
        print("reached")
    except OSError as error:
        print(type(error).__name__)
open("/tmp/scratch", "w").write("ok")
print(open("/tmp/scratch").read())
"""

# Run by the interpreter of a virtual environment under /tmp: the sandbox's tmpfs covers /tmp, so the
# interpreter's own directories must be shown again, read-only, and nothing else of /tmp. The program runs
# as the one test of a run, or as each of argv[4] tests; one line per test.
UNDER_TMP_DRIVER = """
import contextlib, json, sys
from minigrpo.verifier.programs import code, run_cases
if sys.argv[1] == "plain":
    code._sandbox_uid = lambda config: contextlib.nullcontext((None, None))
program = "SECRET = " + repr(sys.argv[2]) + "\\n" + sys.argv[3]
tests = int(sys.argv[4]) if len(sys.argv) > 4 else 1
for result in run_cases(program, [{"input": "", "output": ""}] * tests):
    print(json.dumps({"stdout": result.stdout, "stderr": result.stderr}))
"""


@pytest.mark.parametrize("user", ["root", "plain"])
def test_a_program_starts_python_when_the_interpreter_lives_under_tmp(user, tmp_path):
    """A clone and its virtual environment under /tmp (tmp_path is there): the program starts
    sys.executable again, cannot write into the environment, and reaches nothing else of /tmp."""
    if user == "root" and not ROOT:
        pytest.skip("the sandbox uid's path needs root; the plain user's path runs below")
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = [str(venv / "bin" / "python"), "-c", UNDER_TMP_DRIVER, user, str(secret), UNDER_TMP]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # the secret is hidden (FileNotFoundError); the environment is read-only (EROFS)
    expected = ["42", "True", "FileNotFoundError", "OSError", "ok"]
    assert result["stdout"].splitlines() == expected, result["stderr"]
    assert not (venv / "forged").exists() and secret.read_text() == "the trainer's"


# Run by an interpreter reached through a link under /tmp (its prefix elsewhere): the link's directory,
# where sys.executable lies, is shown again read-only, as a virtual environment's bin/ is.
THROUGH_A_LINK = """
import os, subprocess, sys
print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
print(sys.prefix.startswith("/tmp/"), sys.executable.startswith("/tmp/"))
here = os.path.dirname(sys.executable)
for attempt in (lambda: open(SECRET).read(), lambda: open(os.path.join(here, "forged"), "w")):
    try:
        attempt()
        print("reached")
    except OSError as error:
        print(type(error).__name__)
"""


@pytest.mark.parametrize("user", ["root", "plain"])
@pytest.mark.parametrize("layout", ["copies", "link"])
def test_a_program_starts_python_from_a_copied_or_linked_interpreter_under_tmp(layout, user, tmp_path):
    """A virtual environment whose python is a copy (the binary itself lies on the mount shown again: it
    keeps the flags it had, and so stays executable), and a link to the interpreter whose prefix lies
    elsewhere (sys.executable's own directory is shown): the program starts sys.executable again and
    cannot write where it lies."""
    if user == "root" and not ROOT:
        pytest.skip("the sandbox uid's path needs root; the plain user's path runs below")
    if layout == "copies":
        venv = tmp_path / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", "--copies", str(venv)],
            check=True,
        )
        python, program = venv / "bin" / "python", UNDER_TMP
        expected = ["42", "True", "FileNotFoundError", "OSError", "ok"]
    else:
        os.makedirs(tmp_path / "bin")
        python, program = tmp_path / "bin" / "python", THROUGH_A_LINK
        os.symlink(os.path.realpath(sys.executable), python)
        expected = ["42", "False True", "FileNotFoundError", "OSError"]
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = [str(python), "-c", UNDER_TMP_DRIVER, user, str(secret), program]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stdout"].splitlines() == expected, result["stderr"]
    assert not (python.parent / "forged").exists() and secret.read_text() == "the trainer's"


@pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="mounting a file system needs root")
@pytest.mark.parametrize("user", ["root", "plain"])
def test_a_mount_inside_the_interpreters_directory_under_tmp_is_shown_too(user, tmp_path):
    """The interpreter's directory under /tmp is shown again with the mounts beneath it (a recursive
    bind), all read-only: a tmpfs mounted in it, in a mount namespace of the test's own, is read inside
    the sandbox and not written."""
    bin_dir = tmp_path / "bin"
    os.makedirs(bin_dir / "sub")
    os.symlink(os.path.realpath(sys.executable), bin_dir / "python")
    program = (
        "import os, sys\nsub = os.path.dirname(sys.executable) + '/sub'\n"
        "print(open(sub + '/marker').read())\n"
        "try:\n    open(sub + '/forged', 'w')\n    print('written')\nexcept OSError as error:\n"
        "    print(type(error).__name__)\n"
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mount_then_run = 'mount -t tmpfs tmpfs "$0/sub" && printf shown >"$0/sub/marker" && exec "$0/python" "$@"'
    driver = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_then_run, str(bin_dir)]
    driver += ["-c", UNDER_TMP_DRIVER, user, str(secret), program]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # the mount beneath is shown, and read-only too (a remount of the top one alone left it writable)
    assert result["stdout"] == "shown\nOSError\n", result["stderr"]
    assert os.listdir(bin_dir / "sub") == []  # the tmpfs was the test's namespace's only


# Run by an interpreter whose prefix is closed to others (mode 0700, as `mktemp -d` makes it): the program
# imports a module that lives only in that environment's site-packages, starts sys.executable again and
# prints the new interpreter's prefix (with that module imported there too), lists the prefix, reads
# SECRET, a file beside bin/ in it, and tries to write there.
OWN_ENVIRONMENT = """
import os, subprocess, sys
import only_in_this_environment
again = "import sys, only_in_this_environment; print(sys.prefix)"
child = subprocess.run([sys.executable, "-c", again], capture_output=True, text=True)
print(sys.prefix)
print(child.stdout.strip() or child.stderr.strip().replace("\\n", " | "))
print(" ".join(sorted(os.listdir(sys.prefix))))
for attempt in (lambda: open(SECRET).read(), lambda: open(os.path.join(sys.prefix, "forged"), "w")):
    try:
        attempt()
        print("reached")
    except OSError as error:
        print(type(error).__name__)
"""
PYTHON_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
ONLY_HERE = "only_in_this_environment.py"


def closed_venv(where: str) -> str:
    """`python -m venv "$(mktemp -d)"` in `where`: a virtual environment whose own directory is closed to
    others, with a module in its site-packages alone. Its prefix."""
    prefix = tempfile.mkdtemp(dir=where)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", prefix], check=True)
    open(os.path.join(prefix, "lib", PYTHON_VERSION, "site-packages", ONLY_HERE), "w").close()
    return prefix


def closed_conda_prefix(where: str) -> str:
    """A conda-style prefix closed to others in `where`, made cheaply: bin/ holds a copy of this python's
    binary; lib/ links to what this python's lib/ holds (libpython, for a binary that looks beside itself)
    and lib/pythonX.Y/ to every entry of its standard library, so that the copy finds its prefix there, but
    for a site-packages of its own with a module in it alone. Its prefix."""
    prefix = tempfile.mkdtemp(dir=where)
    os.makedirs(os.path.join(prefix, "bin"))
    shutil.copy2(os.path.realpath(sys.executable), os.path.join(prefix, "bin", PYTHON_VERSION))
    stdlib = os.path.dirname(os.__file__)
    own_stdlib = os.path.join(prefix, "lib", PYTHON_VERSION)
    os.makedirs(os.path.join(own_stdlib, "site-packages"))
    open(os.path.join(own_stdlib, "site-packages", ONLY_HERE), "w").close()
    for name in os.listdir(os.path.dirname(stdlib)):
        if name != PYTHON_VERSION:
            os.symlink(os.path.join(os.path.dirname(stdlib), name), os.path.join(prefix, "lib", name))
    for name in os.listdir(stdlib):
        if name != "site-packages":
            os.symlink(os.path.join(stdlib, name), os.path.join(own_stdlib, name))
    return prefix


@pytest.fixture
def made_here():
    """Directories a test makes outside tmp_path (in /opt, /dev/shm, /var/tmp, beside the tests), removed
    afterwards: add each to the list."""
    made = []
    yield made
    for path in made:
        if os.path.islink(path):
            os.remove(path)
        else:
            shutil.rmtree(path)


# layout: how the environment is made, where, and what a link in a closed directory beside the tests leads
# to, through which the interpreter is reached: nothing (no link), the prefix, or its python
CLOSED_LAYOUTS = {
    "venv-in-tmp": (closed_venv, "/tmp", None),
    "venv-in-dev-shm": (closed_venv, "/dev/shm", None),
    "venv-in-var-tmp": (closed_venv, "/var/tmp", None),
    "venv-in-opt": (closed_venv, "/opt", None),
    "conda-in-opt": (closed_conda_prefix, "/opt", None),
    "conda-in-tmp": (closed_conda_prefix, "/tmp", None),
    "venv-in-tmp-through-a-link": (closed_venv, "/tmp", "prefix"),
    "conda-in-opt-through-a-link-to-its-python": (closed_conda_prefix, "/opt", "python"),
}


@pytest.mark.parametrize("user", ["root", "plain"])
@pytest.mark.parametrize("layout", list(CLOSED_LAYOUTS))
def test_a_program_starts_its_own_environment_again_from_a_closed_prefix(layout, user, made_here):
    """An interpreter whose prefix is closed to others (a venv made in `mktemp -d`, under /tmp, /dev/shm,
    /var/tmp or /opt; a conda-style prefix), also one reached through a link in a closed directory outside
    the shared ones (beside the tests), to the prefix or to its python (which must stay a link there: the
    conda-style python finds its prefix where the link leads): the program and the interpreter it starts
    again are the same environment (the same sys.prefix, its own site-packages importable). As root, the
    closed prefix shows only what the interpreter needs (bin/, lib/, a venv's pyvenv.cfg), read-only: a
    file beside them is not there. As a plain user, the prefix is the trainer's own, shown whole and
    read-only."""
    make, where, link_to = CLOSED_LAYOUTS[layout]
    if user == "root" and not ROOT:
        pytest.skip("the sandbox uid's path needs root; the plain user's path runs below")
    if not os.path.isdir(where) or not os.access(where, os.W_OK):
        pytest.skip(f"{where} is not a directory this user can write")
    if make is closed_conda_prefix and sys.platlibdir != "lib":
        pytest.skip(
            f"the conda-style prefix is made for a python whose platlibdir is lib, not {sys.platlibdir}"
        )
    prefix = make(where)
    made_here.append(prefix)
    secret = os.path.join(prefix, "secret.txt")
    with open(secret, "w") as f:
        f.write("the trainer's")
    listing = " ".join(sorted(os.listdir(prefix)))
    python = os.path.join(prefix, "bin", PYTHON_VERSION)
    if link_to is not None:
        # beside the tests, or in the home directory where the tests themselves lie in a shared one (a
        # clone under /tmp): a link inside the scratch tmpfs is another layout (the closing note of
        # issue 58 says what the sandbox shows there)
        here = os.path.dirname(os.path.abspath(__file__))
        shared = any(here.startswith(d + "/") for d in supervisor.SHARED_DIRECTORIES)
        outside = tempfile.mkdtemp(dir=os.path.expanduser("~") if shared else here)
        made_here.append(outside)
        link = os.path.join(outside, "link")
    if link_to == "prefix":  # the environment's prefix is where the link lies
        os.symlink(prefix, link)
        python = os.path.join(link, "bin", PYTHON_VERSION)
        prefix = link
    elif link_to == "python":  # the python finds its prefix where the link leads
        os.symlink(python, link)
        python = link
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = [python, "-c", UNDER_TMP_DRIVER, user, secret, OWN_ENVIRONMENT]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    if user == "root":  # lib/ and the platform's (lib64/ on some systems), on the way to site-packages
        needed = {"bin", "lib", sys.platlibdir} | ({"pyvenv.cfg"} if make is closed_venv else set())
        listing = " ".join(sorted(needed))
    seen = "FileNotFoundError" if user == "root" else "reached"
    expected = [prefix, prefix, listing, seen, "OSError"]
    assert result["stdout"].splitlines() == expected, result["stderr"]
    assert not os.path.exists(os.path.join(prefix, "forged"))


# Run in each test of a run by the interpreter of a virtual environment deep under /tmp: the program
# imports a module of that environment alone (anew in each test's process) and starts sys.executable again,
# then tries to move aside SECRET, the directory of /tmp that leads to the environment.
IN_EVERY_TEST = """
import errno, os, subprocess, sys
import only_in_this_environment
print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
try:
    os.rename(SECRET, SECRET + "-moved")
    print("moved")
except OSError as error:
    print(errno.errorcode[error.errno])
"""


@pytest.mark.parametrize("user", ["root", "plain"])
def test_the_interpreter_under_tmp_stays_for_every_test_of_a_run(user, tmp_path):
    """The clean-up between tests empties the scratch tmpfs, which is also /tmp: the directories leading to
    an interpreter deep under /tmp (a clone in /tmp/work/repo, its venv in it) are mount points, which it
    cannot remove or move, nor can a test. Every test of the run imports the environment's own module and
    starts sys.executable again."""
    if user == "root" and not ROOT:
        pytest.skip("the sandbox uid's path needs root; the plain user's path runs below")
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "work" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "lib" / PYTHON_VERSION / "site-packages" / ONLY_HERE).write_text("")
    top = "/tmp/" + str(tmp_path).split("/")[2]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = [str(venv / "bin" / "python"), "-c", UNDER_TMP_DRIVER, user, top, IN_EVERY_TEST, "3"]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()[-3:]]
    assert [result["stdout"] for result in results] == ["42\nEBUSY\n"] * 3, results[-1]["stderr"]


# Run by a virtual environment under /tmp whose site-packages adds a directory of the same name under
# /var/tmp (a .pth file): both imported, in the program and in the python it starts again.
TWO_NAMESAKES = """
import subprocess, sys
import only_in_this_environment, only_in_var_tmp
again = "import only_in_this_environment, only_in_var_tmp; print('both')"
print(subprocess.run([sys.executable, "-c", again], capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.parametrize("user", ["root", "plain"])
def test_interpreter_directories_of_one_name_under_tmp_and_var_tmp_are_both_shown(user, made_here):
    """/tmp/<name> and /var/tmp/<name> are one directory of the scratch tmpfs, which is behind both: the
    interpreter's directories under each are shown again all the same."""
    if user == "root" and not ROOT:
        pytest.skip("the sandbox uid's path needs root; the plain user's path runs below")
    if not os.path.isdir("/var/tmp") or not os.access("/var/tmp", os.W_OK):
        pytest.skip("/var/tmp is not a directory this user can write")
    prefix = closed_venv("/tmp")
    made_here.append(prefix)
    namesake = os.path.join("/var/tmp", os.path.basename(prefix))
    os.makedirs(os.path.join(namesake, "extra"))
    made_here.append(namesake)
    open(os.path.join(namesake, "extra", "only_in_var_tmp.py"), "w").close()
    site_packages = os.path.join(prefix, "lib", PYTHON_VERSION, "site-packages")
    with open(os.path.join(site_packages, "namesake.pth"), "w") as f:
        f.write(os.path.join(namesake, "extra") + "\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = [os.path.join(prefix, "bin", "python"), "-c", UNDER_TMP_DRIVER, user, "", TWO_NAMESAKES]
    done = subprocess.run(
        driver, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stdout"] == "both\n", result["stderr"]


def sandbox_with_refused_read_only_mounts(directory):
    """A copy of supervisor.py and its siblings in which mount_setattr(2) is refused (ENOSYS: a number no
    kernel gives a call)."""
    verifier = os.path.dirname(code_module.supervisor.__file__)
    for name in ("supervisor.py", "confine.py", "seccomp.py", "cleanup.py", "process_io.py", "mounts.py"):
        (directory / name).write_text(open(os.path.join(verifier, name)).read())
    source = (directory / "mounts.py").read_text()
    hooked = source.replace("MOUNT_SETATTR = 442", "MOUNT_SETATTR = 1023")
    assert hooked != source
    (directory / "mounts.py").write_text(hooked)
    return str(directory / "supervisor.py")


def test_a_refused_read_only_remount_stops_the_sandbox(as_a_plain_user, monkeypatch, tmp_path):
    """As a plain user every mount is made read-only first: where that is refused, no test runs (the
    trainer's files would be writable), and the error says why."""
    monkeypatch.setattr(code_module.supervisor, "__file__", sandbox_with_refused_read_only_mounts(tmp_path))
    with pytest.raises(RuntimeError, match="sandbox isolation failed: .*making the mounts at / read-only"):
        run_tests(ADD, ADD_TESTS[:1])
