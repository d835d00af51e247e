"""Skipping sign descent equals the step-by-step loop.

Between two sign changes of the training residual the compiled sign descent loop skips the
steps it can prove unchanged and scores only the validation rows of those steps (coordinate
descent is run through the same checks: it visits every step either way). These tests run both loops
(``_stepwise=True`` forces one visit per step) on random problems with wide and narrow
bandwidths, ties, exact zeros, float32 and float64, and check the best step, the step count and
the coefficients; and against a direct NumPy loop on generic problems.
"""

import numpy as np
import pytest
import torch

from kernelflow.solvers import _native

pytestmark = pytest.mark.skipif(not _native.available(), reason="compiled extension not built")


def _problems(seed, n, sigmas, *, ties=False, n_folds=4, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10, 10, n)
    y = np.sin(np.pi * x / 2) + 0.1 * rng.standard_cauchy(n)
    if ties:  # repeated inputs, repeated and exactly zero targets
        x = np.round(x)
        y[::5] = 0.0
        y[1::7] = 1.0
        y[2::9] = -1.0
    sig = np.asarray(sigmas, dtype=float)
    K = np.exp(-(x[None, :, None] - x[None, None, :]) ** 2 / (2 * sig[:, None, None] ** 2))
    folds = np.arange(n) % n_folds
    train = np.stack([folds != f for f in range(n_folds)] + [np.ones(n, bool)])
    wval = np.stack([(folds == f) * 1.0 for f in range(n_folds)] + [np.zeros(n)])
    F, G = train.shape[0], sig.size
    kernel_of = np.repeat(np.arange(G), F)
    fold_of = np.tile(np.arange(F), G)
    return (torch.tensor(K, dtype=dtype), torch.tensor(y[None], dtype=dtype),
            torch.tensor(train * 1.0), torch.tensor(wval), kernel_of,
            np.zeros(kernel_of.size, dtype=int), fold_of)


def _both(method, problem, **kw):
    kw = {"eta": 0.01, "max_iter": 3000, "patience": 100, "return_alpha": True,
          "n_threads": 1, **kw}
    jump = _native.run_problems(method, *problem, **kw)
    step = _native.run_problems(method, *problem, **kw, _stepwise=True)
    return jump, step


def _assert_same(jump, step, dtype):
    best, best_it, n_iter, alpha = jump
    np.testing.assert_array_equal(best_it, step[1])
    np.testing.assert_array_equal(n_iter, step[2])
    np.testing.assert_array_equal(best, step[0])
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(alpha, step[3], rtol=0, atol=tol)


SIGMAS = [0.01, 0.1, 0.5, 2.0, 10.0, 300.0]


@pytest.mark.parametrize("method", ["sign", "coordinate"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_skipping_equals_stepwise_float64(method, ties, seed):
    problem = _problems(seed, 60, SIGMAS, ties=ties)
    jump, step = _both(method, problem)
    _assert_same(jump, step, torch.float64)
    assert (jump[2] > 1).all()


@pytest.mark.parametrize("method", ["sign", "coordinate"])
def test_skipping_equals_stepwise_float32(method):
    problem = _problems(3, 50, SIGMAS, ties=True, dtype=torch.float32)
    jump, step = _both(method, problem, max_iter=1500)
    _assert_same(jump, step, torch.float32)


@pytest.mark.parametrize("method", ["sign", "coordinate"])
@pytest.mark.parametrize("eta", [1e-3, 0.05, 1.0])
def test_skipping_equals_stepwise_steps_and_patience(method, eta):
    """Large and small steps, no patience (the whole path), and patience 1."""
    problem = _problems(4, 40, [0.05, 1.0, 50.0], ties=True)
    for patience in (None, 1, 7):
        jump, step = _both(method, problem, eta=eta, max_iter=800, patience=patience)
        _assert_same(jump, step, torch.float64)


def test_exact_zero_residuals_stay_put():
    """Targets that are exactly zero on rows the kernel does not couple keep sign 0: those
    coefficients never move, in both loops."""
    n = 12
    K = torch.eye(n, dtype=torch.float64)[None]
    y = torch.zeros(1, n, dtype=torch.float64)
    y[0, ::2] = torch.linspace(0.05, 1.0, n // 2, dtype=torch.float64)
    train = torch.ones(1, n)
    train[0, -3:] = 0
    wval = 1.0 - train
    problem = (K, y, train, wval.to(torch.float64), [0], [0], [0])
    jump, step = _both("sign", problem, eta=0.01, max_iter=500, patience=None)
    _assert_same(jump, step, torch.float64)
    alpha = jump[3][0]
    assert (alpha[1:-3:2] == 0).all()
    # a row with target a multiple of eta reaches residual 0 and stops moving
    assert abs(float(alpha[0]) - float(y[0, 0])) <= 0.01 + 1e-12


def _direct(K, y, train, val, method, eta, max_iter, patience):
    a = np.zeros_like(y)
    best, best_k, k = np.inf, 0, 0
    for k in range(1, max_iter + 1):
        r = (y - K @ a) * train
        if method == "sign":
            a = a + eta * np.sign(r)
        else:
            top = np.abs(r).max()
            a = a + eta * np.sign(r) * ((np.abs(r) == top) & (r != 0))
        err = float(np.sum((y[val] - K[val] @ a) ** 2))
        if err < best:
            best, best_k = err, k
        if k - best_k >= patience:
            break
    return best_k, k, a


@pytest.mark.parametrize("method", ["sign", "coordinate"])
def test_skipping_matches_direct_loop(method):
    """Generic problems (no ties): same best step, step count and coefficients as a direct
    loop that recomputes the residual from the coefficients every step."""
    K, Y, train, wval, kernel_of, target_of, fold_of = _problems(5, 40, [0.2, 1.5, 20.0])
    best, best_it, n_iter, alpha = _native.run_problems(
        method, K, Y, train, wval, kernel_of, target_of, fold_of, eta=0.01, max_iter=2000,
        patience=50, return_alpha=True, n_threads=1)
    for p in range(len(kernel_of)):
        tr = train[fold_of[p]].numpy()
        val = wval[fold_of[p]].numpy() > 0
        if not val.any():
            continue
        b, k, a = _direct(K[kernel_of[p]].numpy(), Y[0].numpy(), tr, val, method, 0.01, 2000,
                          50)
        assert best_it[p] == b and n_iter[p] == k
        np.testing.assert_allclose(alpha[p].numpy(), a, rtol=0, atol=1e-10)
