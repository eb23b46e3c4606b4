import os
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))
# One thread, here and in every process a test starts: the tests' tensors are too small to gain from a
# second, and a second thread that waits for a busy core stalls every product. The other core is left
# to the work beside the suite (below) and to the processes the tests start.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"

# Hypothesis profiles. "ci", loaded by default, is derandomised (a test's examples follow from the test
# itself) and keeps no database of past failures, so a run decides the same way on every machine: a
# random failure never decides a landing. "explore" draws new examples on every run, 10 times as many
# (tests scale their counts by max_examples / 100): python -m pytest --hypothesis-profile=explore
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def examples_server():
    """examples/train_math.py run in processes forked from one that paid the imports once (killed_run.Server):
    what a run costs is then its own work, not 3-5 s of importing torch and the library."""
    from killed_run import Server

    server = Server()
    yield server
    server.close()


@pytest.fixture(scope="session")
def verl_reference():
    """verl 0.9.1's own estimators and losses (tests/verl_reference.py), run from its wheel; the tests that
    ask for it skip, with how to get the wheel, when it can be neither found nor fetched."""
    import verl_reference

    verl_reference.require()
    return verl_reference


@pytest.fixture(scope="session")
def trl_reference():
    """TRL 1.16's own GRPOTrainer._compute_loss (tests/trl_reference.py); the tests that ask for it skip
    when the installed trl is not 1.16.0."""
    import trl_reference

    trl_reference.require()
    return trl_reference


# ---------------------------------------------------------------- work beside the suite
# A test file whose fixtures are mostly other processes' work (torchrun jobs, the benchmarks' smoke runs,
# inductor compiling) puts that work in a module-level `background_work(tmp_path_factory)`, which runs it
# to the end and returns what its tests check. It starts in a thread as the session starts, while this
# process runs the other files' tests (the files with background work run last), so the two share the
# cores instead of taking turns. It runs niced: it fills the cores the tests leave idle, and never slows
# a test that checks a time limit. Nothing run there may start a sandboxed program (test_code_reward
# checks that no sandbox uid has processes or files left) or draw from torch's random generator in this
# process (the tests running meanwhile seed it): such work goes in a process of its own
# (helpers.in_a_process).
BACKGROUND_NICENESS = 10


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: hasattr(getattr(item, "module", None), "background_work"))  # stable


class Background:
    """The background work of the selected files, each in a daemon thread of its own (an interrupted
    session does not wait for it): result(name) waits for that module's and returns what it returned,
    or raises what it raised."""

    def __init__(self, works: dict, tmp_path_factory):
        self.results = {}  # module name -> ("value", what it returned) or ("error", what it raised)
        self.done = {name: threading.Event() for name in works}
        tmp_path_factory.getbasetemp()  # made here: two threads making it at once would race
        for name, work in works.items():
            threading.Thread(target=self._run, args=(name, work, tmp_path_factory), daemon=True).start()

    def _run(self, name: str, work, tmp_path_factory) -> None:
        # niceness is per thread on Linux, and the processes this thread starts inherit it
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
        try:
            self.results[name] = ("value", work(tmp_path_factory))
        except BaseException as error:  # re-raised in the test that asks for it
            self.results[name] = ("error", error)
        self.done[name].set()

    def result(self, name: str):
        self.done[name].wait()
        kind, value = self.results[name]
        if kind == "error":
            raise value
        return value


@pytest.fixture(scope="session", autouse=True)
def background(request, tmp_path_factory) -> Background:
    works = {}  # in the order the files' tests run
    for item in request.session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "background_work"):
            works.setdefault(module.__name__, module.background_work)
    return Background(works, tmp_path_factory)


# ---------------------------------------------------------------- a disk that fills up
@pytest.fixture
def tiny_disk(tmp_path):
    """mount(kib): a tmpfs of that size (root only), a disk that really fills up; unmounted after the test."""
    mounted = []

    def mount(kib: int) -> str:
        path = tmp_path / f"disk-{len(mounted)}"
        path.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here (root only): {result.stderr.strip() or result.returncode}"
            )
        mounted.append(path)
        return str(path)

    yield mount
    for path in mounted:
        # lazy: an open file cannot keep it mounted
        subprocess.run(["umount", "--lazy", str(path)], check=True)


# ---------------------------------------------------------------- one tiny checkpoint for the session
@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """The tiny policy (helpers.tiny_policy, a 96-token context) that the trainer, objectives and LoRA
    tests load, built once: they read it and write their runs elsewhere; a test that changes a
    checkpoint makes its own."""
    from helpers import tiny_policy

    return tiny_policy(str(tmp_path_factory.mktemp("tiny-checkpoint")), max_position_embeddings=96)
