import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def examples_server():
    """examples/train_math.py run in processes forked from one that paid the imports once (killed_run.Server):
    what a run costs is then its own work, not 3-5 s of importing torch and the library."""
    from killed_run import Server

    server = Server()
    yield server
    server.close()
