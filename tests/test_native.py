"""The compiled sign / coordinate descent loops (kernelflow._paths) against direct tensor loops."""

import math

import numpy as np
import pytest
import torch

from kernelflow.kernels import Gaussian
from kernelflow.solvers import _native
from kernelflow.solvers.path_cv import early_stopping_path_cv
from kernelflow.solvers.paths import coordinate_descent_path, sign_gradient_path

pytestmark = pytest.mark.skipif(not _native.available(), reason="compiled extension not built")
DT = torch.float64


def _problem(seed=0, n=40):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=DT) * 4
    y = torch.sin(X[:, 0]) + 0.3 * torch.randn(n, generator=g, dtype=DT)
    return Gaussian(0.8)(X, X), y


def _direct(K, y, train, val, method, eta, max_iter, patience):
    """r = y - K alpha recomputed every step (no running sums); validation MSE curve."""
    a = torch.zeros_like(y)
    curve, best, best_k, k = [math.nan], math.inf, 0, 0
    for k in range(1, max_iter + 1):
        r = (y - K @ a) * train
        if method == "sign":
            a = a + eta * torch.sign(r)
        else:
            a = a + eta * torch.sign(r) * ((r.abs() == r.abs().max()) & (r != 0))
        mse = float(((K[val] @ a - y[val]) ** 2).mean())
        curve.append(mse)
        if mse < best:
            best, best_k = mse, k
        if k - best_k >= patience:
            break
    return best, best_k, k, curve, a


@pytest.mark.parametrize("method", ["sign", "coordinate"])
def test_problems_follow_the_direct_loop_past_a_resync(method):
    # 1200 steps: the running sums are recomputed from alpha every RESYNC = 256 steps
    K, y = _problem()
    n = y.numel()
    val_sets = [np.arange(f, n, 4) for f in range(4)]
    train = torch.ones(4, n, dtype=DT)
    wval = torch.zeros(4, n, dtype=DT)
    for f, v in enumerate(val_sets):
        train[f, v] = 0
        wval[f, v] = 1.0 / len(v)
    best, best_it, n_iter = _native.run_problems(
        method, K.unsqueeze(0), y.unsqueeze(0), train, wval, [0] * 4, [0] * 4, range(4),
        eta=0.01, max_iter=1200, patience=400)
    for f, v in enumerate(val_sets):
        ref_best, ref_k, ref_n, curve, _ = _direct(K, y, train[f], torch.as_tensor(v), method,
                                                   0.01, 1200, 400)
        assert best[f] == pytest.approx(ref_best, rel=1e-9)
        assert curve[best_it[f]] == pytest.approx(ref_best, rel=1e-9)
        assert n_iter[f] == min(1200, best_it[f] + 400)


def test_threads_do_not_change_the_result():
    K, y = _problem(1)
    n = y.numel()
    Ks = torch.stack([Gaussian(s)(K[:, :1], K[:, :1]) for s in (0.1, 0.5, 2.0)]) + K
    train = (torch.rand(5, n, generator=torch.Generator().manual_seed(2)) > 0.2).to(DT)
    wval = (1 - train) / (1 - train).sum(1, keepdim=True)
    args = ("sign", Ks, y.unsqueeze(0), train, wval, np.repeat(np.arange(3), 5),
            np.zeros(15), np.tile(np.arange(5), 3))
    one = _native.run_problems(*args, eta=0.01, max_iter=700, patience=50, return_alpha=True,
                               n_threads=1)
    three = _native.run_problems(*args, eta=0.01, max_iter=700, patience=50,
                                 return_alpha=True, n_threads=3)
    for a, b in zip(one, three):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_small_work_stays_on_the_calling_thread(monkeypatch):
    # a few small problems: no worker pool is created, and the default gives the same result
    K, y = _problem(3)
    n = y.numel()
    train = torch.ones(3, n, dtype=DT)
    for f in range(3):
        train[f, f::3] = 0
    wval = (1 - train) / (1 - train).sum(1, keepdim=True)
    args = ("coordinate", K[None], y.unsqueeze(0), train, wval, [0, 0, 0], [0, 0, 0],
            [0, 1, 2])
    monkeypatch.setattr(_native, "_POOLS", {})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    default = _native.run_problems(*args, eta=0.01, max_iter=300, patience=30)
    assert _native._POOLS == {}
    pooled = _native.run_problems(*args, eta=0.01, max_iter=300, patience=30, n_threads=2)
    assert list(_native._POOLS) == [2]
    for a, b in zip(default, pooled):
        assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("path, method", [(sign_gradient_path, "sign"),
                                          (coordinate_descent_path, "coordinate")])
def test_single_path_equals_the_direct_loop(path, method):
    K, y = _problem(3)
    n = y.numel()
    res = path(K, y, learning_rate=0.01, max_iter=600)
    *_, a = _direct(K, y, torch.ones(n, dtype=DT), torch.arange(0), method, 0.01, 600, 10**6)
    # the running sums round differently from K @ alpha, but on this problem no residual sits
    # close enough to zero for that to change a sign: the same iterates
    torch.testing.assert_close(res.alpha, a, rtol=0, atol=1e-10)
    torch.testing.assert_close(res.residual, y - K @ res.alpha, rtol=0, atol=1e-12)


def test_multi_output_paths_are_independent_problems():
    K, y = _problem(4)
    Y = torch.stack([y, -2 * y, torch.ones_like(y)], 1)
    res = sign_gradient_path(K, Y, learning_rate=0.01, max_iter=300)
    for j in range(3):
        single = sign_gradient_path(K, Y[:, j].contiguous(), learning_rate=0.01, max_iter=300)
        assert torch.equal(res.alpha[:, j], single.alpha)


def test_coordinate_ties_all_move():
    res = coordinate_descent_path(torch.eye(3, dtype=DT), torch.tensor([1.0, -1.0, 0.5],
                                  dtype=DT), learning_rate=0.25, max_iter=1)
    assert res.alpha.tolist() == [0.25, -0.25, 0.0]


def test_float32_problems_run_in_float32():
    K, y = _problem(5)
    res = sign_gradient_path(K.float(), y.float(), learning_rate=0.01, max_iter=200)
    ref = sign_gradient_path(K, y, learning_rate=0.01, max_iter=200)
    assert res.alpha.dtype == torch.float32
    assert float((res.alpha.double() - ref.alpha).abs().max()) <= 0.02 + 1e-6


def test_bad_indices_are_rejected():
    K, y = _problem()
    n = y.numel()
    with pytest.raises(ValueError, match="kernel index"):
        _native.run_problems("sign", K.unsqueeze(0), y.unsqueeze(0), torch.ones(1, n),
                             torch.zeros(1, n), [1], [0], [0], eta=0.1, max_iter=3)
    with pytest.raises(ValueError, match="method"):
        _native.run_problems("gradient", K.unsqueeze(0), y.unsqueeze(0), torch.ones(1, n),
                             torch.zeros(1, n), [0], [0], [0], eta=0.1, max_iter=3)


def test_tensor_fallback_without_the_extension(monkeypatch):
    K, y = _problem()
    X = torch.linspace(0, 4, y.numel(), dtype=DT).reshape(-1, 1)
    folds = [np.arange(f, y.numel(), 4) for f in range(4)]
    fast = early_stopping_path_cv(X, y, [Gaussian(0.5)], folds, max_iter=300)
    monkeypatch.setattr(_native, "available", lambda *a, **k: False)
    slow = early_stopping_path_cv(X, y, [Gaussian(0.5)], folds, max_iter=300)
    torch.testing.assert_close(fast.fold_mse, slow.fold_mse, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="backend='native'"):
        early_stopping_path_cv(X, y, [Gaussian(0.5)], folds, backend="native")
    ref = sign_gradient_path(K, y, learning_rate=0.01, max_iter=50)  # tensor loop now
    assert ref.n_iter == 50 and _native.available() is False


@pytest.mark.parametrize("method", ["sign", "coordinate"])
@pytest.mark.parametrize("loss", ["absolute", "huber"])
def test_robust_validation_losses_in_the_compiled_loops_equal_the_tensor_backend(method, loss):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(90, 1, generator=g, dtype=DT) * 6 - 3
    y = torch.sin(2 * X[:, 0]) + 0.1 * torch.randn(90, generator=g, dtype=DT)
    y[::9] += 4.0  # gross outliers, some of them in every validation fold
    folds = [np.arange(f, 90, 5) for f in range(5)]
    kernels = [Gaussian(s) for s in (0.1, 0.5, 2.0)]
    fast = early_stopping_path_cv(X, y, kernels, folds, method=method, max_iter=600,
                                  validation_loss=loss, backend="native")
    slow = early_stopping_path_cv(X, y, kernels, folds, method=method, max_iter=600,
                                  validation_loss=loss, backend="torch")
    assert torch.equal(fast.best_iter, slow.best_iter)
    torch.testing.assert_close(fast.fold_mse, slow.fold_mse, rtol=1e-9, atol=0)


@pytest.mark.parametrize("sigma", [0.05, 0.3])
def test_oscillating_signs_follow_the_direct_loop(sigma):
    # a narrow bandwidth: once the residuals reach zero most signs reverse at every step, and
    # the per-step change of K sign is updated from the few rows that did not reverse
    g = torch.Generator().manual_seed(4)
    X = torch.rand(40, 2, generator=g, dtype=DT) * 4
    y = torch.sin(X[:, 0]) + 0.3 * torch.randn(40, generator=g, dtype=DT)
    K = Gaussian(sigma)(X, X)
    n, v = 40, torch.arange(0, 40, 5)
    train, wval = torch.ones(1, n, dtype=DT), torch.zeros(1, n, dtype=DT)
    train[0, v], wval[0, v] = 0, 1.0 / len(v)
    best, best_it, n_iter, alpha = _native.run_problems(
        "sign", K.unsqueeze(0), y.unsqueeze(0), train, wval, [0], [0], [0], eta=0.05,
        max_iter=700, patience=700, return_alpha=True)
    ref_best, ref_k, ref_n, curve, a = _direct(K, y, train[0], v, "sign", 0.05, 700, 700)
    assert n_iter[0] == ref_n == 700
    assert best[0] == pytest.approx(ref_best, rel=1e-9)
    assert curve[best_it[0]] == pytest.approx(ref_best, rel=1e-9)
    torch.testing.assert_close(alpha[0], a, rtol=0, atol=1e-9)
