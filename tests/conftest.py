import os
import sys

import pytest
import torch
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))

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
