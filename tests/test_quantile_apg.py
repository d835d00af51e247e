"""Kernel quantile regression by accelerated proximal gradient (fastkqr's method, KQR-T).

check_estimator, hostile inputs and the model-file round trip run in tests/test_common.py
through the registry entry ``quantile_apg``.
"""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from kernelflow.estimators.quantile_apg import KernelQuantileRegressorAPG
from kernelflow.solvers.quantile_apg import (
    kernel_quantile_apg,
    quantile_objective,
    smoothed_check_loss,
)


def _problem(n=30, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, (n, 1))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.standard_cauchy(n)
    K = np.exp(-((X - X.T) ** 2) / (2 * 0.5**2))
    return X, y, K


def _dual_solve(K, y, lam, tau, intercept):
    """The dual QP max_g g.y/n - g'Kg/(2 n^2 lam), tau-1 <= g <= tau (, sum g = 0), by SLSQP.

    Returns (dual value, predictions K g / (n lam) without the intercept)."""
    n = len(y)

    def f(g):
        return -(g @ y / n - g @ K @ g / (2 * n * n * lam))

    def jac(g):
        return -(y / n - K @ g / (n * n * lam))

    cons = [{"type": "eq", "fun": np.sum, "jac": lambda g: np.ones(n)}] if intercept else []
    res = minimize(f, np.zeros(n), jac=jac, bounds=[(tau - 1, tau)] * n, constraints=cons,
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 2000})
    assert res.success
    return -res.fun, K @ res.x / (n * lam)


@pytest.mark.parametrize("lam,tau,intercept", [(1e-2, 0.5, True), (1e-3, 0.25, True),
                                               (1e-1, 0.75, False), (1e-4, 0.9, True)])
def test_matches_direct_convex_solve(lam, tau, intercept):
    _, y, K = _problem()
    res = kernel_quantile_apg(torch.tensor(K), torch.tensor(y), lam, quantile=tau,
                              fit_intercept=intercept)
    dual, f_dual = _dual_solve(K, y, lam, tau, intercept)
    primal = float(res.objective)
    # strong duality: the primal value of our point equals the dual optimum
    assert bool(res.exact)
    assert abs(primal - dual) < 1e-4 * max(1.0, abs(dual))
    assert primal >= dual - 1e-9
    # same fitted function (the intercept is not part of the dual's K g / (n lam))
    assert np.allclose(K @ res.coef.numpy(), f_dual, atol=1e-4)


def test_exact_kkt_conditions():
    _, y, K = _problem(seed=1)
    lam, tau = 3e-3, 0.3
    res = kernel_quantile_apg(torch.tensor(K), torch.tensor(y), lam, quantile=tau)
    n = len(y)
    g = res.coef.numpy() * n * lam  # stationarity in alpha: alpha = g / (n lam)
    r = y - float(res.intercept) - K @ res.coef.numpy()
    assert abs(g.sum()) < 1e-8  # stationarity in the intercept
    assert np.all(g >= tau - 1 - 1e-9) and np.all(g <= tau + 1e-9)
    assert np.allclose(g[r > 1e-7], tau) and np.allclose(g[r < -1e-7], tau - 1)


def test_smoothed_objective_decreases_monotonically():
    _, y, K = _problem(n=40, seed=2)
    res = kernel_quantile_apg(torch.tensor(K), torch.tensor(y), 1e-3, quantile=0.5,
                              delta=0.01, delta_min=0.01, exact=False, history=True,
                              max_iter=3000, tol=0.0)
    h = np.array(res.history)
    assert len(h) == 3001
    assert np.all(np.diff(h) <= 1e-14 * np.abs(h).max())
    assert h[-1] < h[0]


def test_smoothing_gap_is_bounded():
    # 0 <= rho - h_delta <= delta max(tau, 1 - tau)^2 / 2, hence so is the gap of the optima
    _, y, K = _problem(seed=3)
    Kt, yt = torch.tensor(K), torch.tensor(y)
    tau, delta = 0.25, 0.05
    exact = kernel_quantile_apg(Kt, yt, 1e-2, quantile=tau)
    smooth = kernel_quantile_apg(Kt, yt, 1e-2, quantile=tau, delta=delta, delta_min=delta,
                                 exact=False, max_iter=20_000, tol=1e-12)
    assert bool(exact.exact) and not bool(smooth.exact)
    fs = float(quantile_objective(Kt, yt, smooth.coef, smooth.intercept, 1e-2, tau, delta))
    assert float(exact.objective) - delta * 0.75**2 / 2 - 1e-9 <= fs <= float(exact.objective)
    assert float(smooth.objective) >= float(exact.objective) - 1e-12
    r = torch.linspace(-3, 3, 101, dtype=torch.float64)
    gap = smoothed_check_loss(r, tau, 0.0) - smoothed_check_loss(r, tau, delta)
    assert float(gap.min()) >= 0 and float(gap.max()) <= delta * 0.75**2 / 2 + 1e-15


def test_batched_equals_one_by_one():
    _, y, K = _problem(n=20, seed=4)
    Kt, yt = torch.tensor(K), torch.tensor(y)
    lam = torch.tensor([1e-3, 1e-2]).reshape(2, 1).double()
    tau = torch.tensor([0.25, 0.5, 0.75]).reshape(1, 3).double()
    res = kernel_quantile_apg(Kt, yt, lam, quantile=tau)
    assert res.coef.shape == (2, 3, 20)
    for i in range(2):
        for j in range(3):
            one = kernel_quantile_apg(Kt, yt, float(lam[i, 0]), quantile=float(tau[0, j]))
            assert torch.allclose(res.coef[i, j], one.coef, atol=1e-7)
            assert abs(float(res.intercept[i, j] - one.intercept)) < 1e-7


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_quantile_coverage(tau):
    rng = np.random.RandomState(5)
    X = rng.uniform(-3, 3, (300, 1))
    y = np.sin(X[:, 0]) + 0.5 * rng.randn(300)
    est = KernelQuantileRegressorAPG(alpha=1e-3, quantile=tau, sigma=1.0).fit(X, y)
    assert est.exact_
    r = y - est.predict(X)
    # with an intercept, at the exact solution: #{y above f} <= n (1 - tau), #{below} <= n tau
    assert np.mean(r > 1e-8) <= 1 - tau + 1e-12 and np.mean(r < -1e-8) <= tau + 1e-12
    assert np.mean(r > 1e-8) >= 1 - tau - 0.05 and np.mean(r < -1e-8) >= tau - 0.05
    Xt = rng.uniform(-3, 3, (3000, 1))
    yt = np.sin(Xt[:, 0]) + 0.5 * rng.randn(3000)
    assert abs(np.mean(yt <= est.predict(Xt)) - tau) < 0.05


def test_estimator_scale_equivariance_and_objective():
    X, y, K = _problem(seed=6)
    a = KernelQuantileRegressorAPG(alpha=1e-2, quantile=0.3, sigma=0.5).fit(X, y)
    # the check loss is 1-homogeneous, the penalty 2-homogeneous: lambda / c for c * y
    b = KernelQuantileRegressorAPG(alpha=1e-2 / 10, quantile=0.3, sigma=0.5).fit(X, 10 * y)
    assert np.allclose(10 * a.predict(X), b.predict(X), atol=1e-6)
    obj = quantile_objective(torch.tensor(K), torch.tensor(y), a.dual_coef_, a.intercept_,
                             1e-2, 0.3)
    assert abs(float(obj) - a.objective_) < 1e-10
    dual, _ = _dual_solve(K, y, 1e-2, 0.3, True)
    assert abs(a.objective_ - dual) < 1e-6


def test_sigma_is_the_paper_bandwidth():
    # fastkqr's precision s corresponds to sigma = 1 / sqrt(2 s) and to gamma = s
    X, y, _ = _problem(seed=7)
    s = 2.0
    a = KernelQuantileRegressorAPG(sigma=1 / np.sqrt(2 * s)).fit(X, y)
    b = KernelQuantileRegressorAPG(gamma=s).fit(X, y)
    assert np.allclose(a.predict(X), b.predict(X), atol=1e-8)


def test_refuses_bad_solver_input():
    K = torch.eye(3, dtype=torch.float64)
    y = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="quantile"):
        kernel_quantile_apg(K, y, 1.0, quantile=1.0)
    with pytest.raises(ValueError, match="alpha"):
        kernel_quantile_apg(K, y, 0.0)
    with pytest.raises(ValueError, match="shape"):
        kernel_quantile_apg(K[:2], y, 1.0)
    with pytest.raises(ValueError, match="delta"):
        kernel_quantile_apg(K, y, 1.0, delta=0.0)
    with pytest.raises(ValueError, match="quantile"):
        KernelQuantileRegressorAPG(quantile=0.0).fit(np.ones((3, 1)), np.ones(3))


def test_compacted_loop_equals_whole_batch_loop():
    _, y, K = _problem(n=24, seed=2)
    Ks = torch.tensor(np.stack([K, K**4])).reshape(2, 1, 1, 24, 24)
    lam = torch.tensor([1e-3, 1e-2, 1e-1], dtype=torch.float64).reshape(1, 3, 1)
    tau = torch.tensor([0.25, 0.5], dtype=torch.float64).reshape(1, 1, 2)
    kw = dict(quantile=tau, tol=1e-6, max_iter=300, delta_min=1e-3)
    a = kernel_quantile_apg(Ks, torch.tensor(y), lam, compact=True, **kw)
    b = kernel_quantile_apg(Ks, torch.tensor(y), lam, compact=False, **kw)
    assert torch.equal(a.exact, b.exact) and torch.equal(a.converged, b.converged)
    assert torch.equal(a.iterations, b.iterations)
    assert (a.coef - b.coef).abs().max() <= 1e-10 * b.coef.abs().max()
    assert (a.intercept - b.intercept).abs().max() < 1e-10
    # the batch mixes problems solved exactly, problems stopped by the tolerance and capped ones
    assert a.exact.any() and (~a.exact).any()
    # each problem of the batch is the problem solved alone
    one = kernel_quantile_apg(Ks[1, 0, 0], torch.tensor(y), 1e-2, quantile=0.5, tol=1e-6,
                              max_iter=300, delta_min=1e-3)
    assert bool(one.exact) == bool(a.exact[1, 1, 1])
    assert int(one.iterations) == int(a.iterations[1, 1, 1])
    assert torch.allclose(one.coef, a.coef[1, 1, 1], rtol=1e-9, atol=1e-9)


def test_diverging_problem_stops_at_once_and_is_refused(monkeypatch):
    # alpha = 1e-300 makes the objective non-finite from the first step on these rows; the
    # stage used to iterate to max_iter (90 000 steps, 35 s) before the coefficients overflowed
    import kernelflow.estimators.quantile_apg as mod
    from kernelflow.utils._finite import DivergenceError

    rng = np.random.RandomState(313489)
    X = rng.randn(12, 2)
    y = np.sin(X[:, 0])
    results = []
    real = mod.kernel_quantile_apg
    monkeypatch.setattr(mod, "kernel_quantile_apg",
                        lambda *a, **k: results.append(real(*a, **k)) or results[-1])
    est = KernelQuantileRegressorAPG(alpha=1e-300)
    with pytest.raises(DivergenceError, match="larger alpha"):
        est.fit(X, y)
    assert not hasattr(est, "dual_coef_")
    res = results[0]
    assert not bool(res.converged) and not np.isfinite(float(res.objective))
    assert res.n_iter < 100
