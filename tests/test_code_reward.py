"""The code reward: exact fractions of tests passed, stdin/stdout tests, fence extraction, and the sandbox held
against hostile programs (loops, fork bombs, memory, files, environment, network, output, forged passes)."""

import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from minigrpo.verifier import code as code_module
from minigrpo.verifier.code import SandboxConfig, code_reward, code_rewards, extract_code, run_cases, run_tests

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="not root: the uid drop and the namespaces need root (sandbox case not run)")
FAST = SandboxConfig(timeout=0.5, cpu_seconds=5, memory_bytes=512 << 20)  # hostile cases end at the 0.5 s wall clock

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]
SUM_STDIN = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"


def fenced(code, language="python"):
    return f"Here is my solution.\n```{language}\n{code}```\nIt adds the numbers."


def sandbox_processes(first_uid=SandboxConfig().first_uid, count=64):
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
    assert run_tests("print(' 3')", [{"input": "", "output": "3"}]) == [False]  # leading whitespace does count
    crashes_after = "print(3)\nraise ValueError('late')\n"  # the right output, then a crash: not a pass
    result = run_cases(crashes_after, [{"input": "", "output": "3"}])[0]
    assert (result.passed, result.exit_code, result.stdout) == (False, 1, "3\n") and "ValueError: late" in result.stderr
    assert run_tests("import sys\nprint(3)\nsys.exit(0)\n", [{"input": "", "output": "3"}]) == [True]


def test_main_block_runs_for_stdin_tests_only():
    program = ADD + "if __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    assert run_tests(program, [{"input": "4 5", "output": "9"}, "assert add(4, 5) == 9"]) == [True, True]


def test_each_test_starts_from_a_fresh_process_and_an_empty_directory():
    program = "import os\ncalls = []\n"
    tests = ["calls.append(1)\nopen('state', 'w').write('x')", "assert calls == [] and not os.path.exists('state')"]
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
    inputs = ["`" * 3_000_000, "\n```" * 250_000, " " * 3_000_000 + "```", "```python\n" + "x = 1\n" * 500_000 + "```"]
    start = time.perf_counter()
    results = [extract_code(text) for text in inputs]
    assert time.perf_counter() - start < 1.0
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
    assert run_tests("x = bytearray(64 << 20)\n", ["assert len(x) == 64 << 20"], config) == [True]  # within the limit
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
    targets = [str(victim), str(tmp_path / "new.txt"), shared, f"/tmp/minigrpo-test-new-{os.getpid()}.txt",
               os.path.abspath(__file__) + ".new", "inside.txt"]
    program = (
        "def try_write(path):\n    try:\n        open(path, 'a').write('pwned')\n        return 'ok'\n"
        "    except OSError as error:\n        return type(error).__name__\n"
        f"for path in {targets!r}:\n    print(try_write(path))\n"
    )
    try:
        result = run_cases(program, [{"input": "", "output": ""}])[0]
        # the test's tmp_path is under /tmp, which inside the sandbox is the sandbox directory: not found there,
        # and the /tmp writes "succeed" into the sandbox directory; the repository is not the sandbox uid's
        # (or, for a checkout under /tmp, not there at all)
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
    result = run_cases("print('y' * 100_000)", [{"input": "", "output": "y"}], config)[0]  # under the file limit
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
        "import os\nfor fd in range(1, 10):\n    try:\n        os.write(fd, os.urandom(16).hex().encode() + b'\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
        "import builtins\nbuiltins.exec = builtins.compile = lambda *a, **k: None\n",  # the harness bound them first
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
        "print(*(resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in ('CPU', 'AS', 'FSIZE', 'NPROC', 'CORE')))\n"
        "print([line for line in open('/proc/self/status') if line.startswith('NoNewPrivs')])\n"
    )
    config = SandboxConfig(cpu_seconds=3, memory_bytes=300 << 20, file_size_bytes=2 << 20, max_processes=7)
    lines = run_cases(program, [{"input": "", "output": ""}], config)[0].stdout.splitlines()
    assert lines[1] == f"(3, 4) ({300 << 20}, {300 << 20}) ({2 << 20}, {2 << 20}) (7, 7) (0, 0)"
    assert lines[2] == "['NoNewPrivs:\\t1\\n']"
    if ROOT:
        uid = config.first_uid
        assert lines[0] == f"{uid} {uid} []"


@as_root
def test_concurrent_sandboxes_get_their_own_uids():
    first = SandboxConfig().first_uid
    with code_module._sandbox_uid(SandboxConfig()) as taken:  # as if another sandbox were running
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
    """A world-writable UNIX socket on the host, outside every directory the sandbox covers (so under /run)."""
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
    "files in the shared writable directories": (write_everywhere(), lambda: not any(
        os.path.exists(os.path.join(d, PROBE)) for d in SHARED)),
    "3,000 nested directories": (
        "import os\nfor _ in range(3000):\n    os.mkdir('a')\n    os.chdir('a')\nopen('deep', 'w').write('x')\n",
        lambda: True),
    "a directory closed to its owner": (
        "import os\nos.makedirs('closed/inner')\nopen('closed/inner/f', 'w').write('x')\nos.chmod('closed/inner', 0)\n"
        "os.chmod('closed', 0)\n", lambda: True),
    "a symlink to the host's files": (
        f"import os\nos.symlink({os.path.dirname(os.path.abspath(__file__))!r}, 'tests')\n"
        f"os.symlink({os.path.abspath(__file__)!r}, 'this_file')\n",
        lambda: os.path.isfile(__file__)),
    "a connection to a host UNIX socket": (
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/{PROBE}.sock')\ns.sendall(b'pwned')\n",
        None),  # checked against the server below
}


@as_root
@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_attempts_are_contained_and_leave_nothing_on_the_host(name, unix_server):
    program, host_is_intact = ESCAPES[name]
    run_tests("pass", ["pass"])  # the uid lock directory exists before the snapshot
    before = sandbox_owned_entries()
    result = run_cases(program, ["pass"], FAST)[0]  # returns: nothing the program did raises out of the reward
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
    monkeypatch.setattr(code_module.sandbox, "__file__", sandbox_with_failing_mount(tmp_path))
    with pytest.raises(RuntimeError, match="sandbox isolation failed: .*mount .* on /var/tmp"):
        run_tests(ADD, ADD_TESTS[:1])


def sandbox_with_failing_mount(directory):
    """A copy of sandbox.py whose bind mount over /var/tmp fails, as it did when its source path was unreachable."""
    source = open(code_module.sandbox.__file__).read()
    hooked = source.replace("_mount(f\"/proc/self/fd/{directory}\", shared,",
                            "_mount(\"/nonexistent\" if shared == \"/var/tmp\" else f\"/proc/self/fd/{directory}\", shared,")
    assert hooked != source
    path = directory / "sandbox.py"
    path.write_text(hooked)
    verifier = os.path.dirname(code_module.sandbox.__file__)
    for sibling in ("confine.py", "cleanup.py"):  # sandbox.py loads them from its own directory
        (directory / sibling).write_text(open(os.path.join(verifier, sibling)).read())
    return str(path)


@as_root
def test_two_processes_sandboxes_do_not_kill_each_others_tests(tmp_path):
    """Each supervisor kills every process of its uid after each test: with one uid block per process, as before,
    one trainer's clean-up killed the other's running tests."""
    script = textwrap.dedent(f"""
        from minigrpo.verifier.code import run_tests
        slow = "import time\\ndef add(a, b):\\n    time.sleep(0.3)\\n    return a + b\\n"
        print(run_tests(slow, ["assert add(1, 2) == 3"] * 4))
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert [run.communicate(timeout=60)[0].strip() for run in runs] == ["[True, True, True, True]"] * 2


# ---------------------------------------------------------------- batches and mistakes


def test_batch_equals_one_at_a_time():
    times = "def add(a, b):\n    return a * b\n"
    completions = [fenced(ADD), fenced(times), "no code", fenced("def add(:"), fenced(SUM_STDIN)]
    tests = [ADD_TESTS, ["assert add(2, 2) == 4", "assert add(1, 2) == 3"], ADD_TESTS, ADD_TESTS,
             [{"input": "1 1", "output": "2"}, {"input": "1 1", "output": "3"}]]
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
        ([{"input": "1"}], "test 0: a stdin/stdout test is a dict with exactly the keys 'input' and 'output'"),
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
        (dict(max_output_bytes=2 << 20, file_size_bytes=1 << 20), r"max_output_bytes \(2097152\) cannot exceed file_size"),
        (dict(first_uid=0), "first_uid must be a uid other than root's"),
    ],
)
def test_config_invariants(settings, message):
    with pytest.raises(ValueError, match=message):
        SandboxConfig(**settings)
