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
