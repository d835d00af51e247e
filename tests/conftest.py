import _helpers
import numpy as np
import pytest
import torch


@pytest.fixture
def rng():
    return np.random.RandomState(0)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def pytest_configure(config):
    torch.set_default_dtype(torch.float32)
    # Test problems are small: one intra-op thread avoids OpenMP spin-waiting, which dominates
    # small factorisations whenever the cores are shared with other processes.
    torch.set_num_threads(1)


#: Skips a test without a CUDA device (``tests/test_cuda.py`` runs every family there).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def device(request):
    """The device of a test's tensors: the CPU always, a CUDA device when there is one."""
    return torch.device(request.param)


@pytest.fixture
def one_thread():
    """One intra-op torch thread during each test of a module that asks for it, restored after
    (``pytestmark = pytest.mark.usefixtures("one_thread")``); see :func:`_helpers.one_thread`."""
    with _helpers.one_thread():
        yield


@pytest.fixture(scope="module")
def one_thread_per_module():
    """:func:`one_thread` held once for a whole module, its module-scoped fixtures included."""
    with _helpers.one_thread():
        yield
