"""Small problems run on one torch thread; the caller's setting is restored and still seen by the
compiled loops."""

import numpy as np
import pytest
import torch

from kernelflow.estimators.path_cv import KernelSignGradientCV
from kernelflow.estimators.sign_gradient import KernelSignGradient
from kernelflow.solvers import _native
from kernelflow.utils._threads import SMALL_STEP, available_threads, threads_for


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_work_runs_on_one_thread_and_restores(two_threads):
    with threads_for(1000):
        assert torch.get_num_threads() == 1
        assert available_threads() == 2
        with threads_for(10):  # nested: still the caller's count
            assert available_threads() == 2
    assert torch.get_num_threads() == 2 and available_threads() == 2
    with threads_for(SMALL_STEP):  # large work keeps the setting
        assert torch.get_num_threads() == 2


def test_restored_after_an_exception(two_threads):
    with pytest.raises(RuntimeError, match="boom"):
        with threads_for(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2 and available_threads() == 2


@pytest.mark.parametrize("cls, kw", [(KernelSignGradientCV, dict(sigmas=4, cv=3, max_iter=200)),
                                     (KernelSignGradient, dict(sigma=1.0, max_iter=200))])
def test_path_estimators_leave_the_thread_setting_alone(two_threads, monkeypatch, cls, kw):
    seen = []
    real = torch.set_num_threads

    def spy(k):
        seen.append(k)
        real(k)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    rng = np.random.RandomState(0)
    X = rng.uniform(-3, 3, (60, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(60)
    model = cls(random_state=0, **kw).fit(X, y)
    assert torch.get_num_threads() == 2
    assert seen[:1] == [1] and seen[-1] == 2  # one thread while fitting, then back
    # same results as a fit with one thread set by the caller
    torch.set_num_threads(1)
    ref = cls(random_state=0, **kw).fit(X, y)
    np.testing.assert_array_equal(model.predict(X), ref.predict(X))


@pytest.mark.skipif(not _native.available(), reason="compiled loops unavailable")
def test_compiled_loops_keep_the_callers_thread_count(two_threads, monkeypatch):
    used = []
    real = _native._pool

    def pool(threads):
        used.append(threads)
        return real(threads)

    monkeypatch.setattr(_native, "_pool", pool)
    n, P = 40, 64
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g, dtype=torch.float64)
    K = torch.exp(-(x[:, None] - x[None, :]) ** 2 / 0.02)[None]
    Y = torch.sin(6 * x)[None]
    train = torch.ones(1, n, dtype=torch.float64)
    train[0, :8] = 0
    wval = 1.0 - train
    zeros = np.zeros(P, dtype=np.int64)
    with threads_for(1):
        assert torch.get_num_threads() == 1
        _native.run_problems("sign", K, Y, train, wval, zeros, zeros, zeros, eta=1e-4,
                             max_iter=20000, patience=20000)
    assert used == [2]
