"""Iterative paths: Allerbo digest properties T3, T7, T8, T9, T10 (corrected), T11, fast updates."""

import math

import numpy as np
import pytest
import torch

from kernelflow.kernels import Gaussian, Laplace, Linear
from kernelflow.operators import KernelOperator, Options
from kernelflow.solvers.direct import gradient_flow_spectral, spectrum
from kernelflow.solvers.early_stopping import (
    EarlyStopping,
    early_stopped_path,
    validation_mse,
)
from kernelflow.solvers.paths import (
    DivergenceError,
    check_gradient_learning_rate,
    coordinate_descent_path,
    coordinate_direction,
    coordinate_monotone_step,
    coordinate_step,
    gradient_descent_path,
    gradient_learning_rate,
    gradient_step,
    largest_eigenvalue,
    momentum_step,
    sign_gradient_path,
    sign_monotone_step,
    sign_step,
    spectral_filter,
)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _problem(n=30, d=2, seed=0, sigma=1.0, kernel=Gaussian):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(X.sum(1)) + 0.2 * torch.randn(n, generator=g, dtype=F64)
    return X, kernel(sigma)(X), y


# ---- T3: discrete closed form, flow limit, momentum limit ----
@pytest.mark.parametrize("method", ["iterative", "spectral"])
def test_gd_discrete_closed_form(method):
    X, K, y = _problem(n=25, sigma=0.7)
    K = K + 0.05 * torch.eye(25, dtype=F64)  # well conditioned: K^-1 is accurate
    eta = 0.8 / largest_eigenvalue(K)
    k = 37
    res = gradient_descent_path(K, y, learning_rate=eta, max_iter=k, method=method)
    I = torch.eye(25, dtype=F64)
    closed = (I - torch.linalg.matrix_power(I - eta * K, k)) @ torch.linalg.solve(K, y)
    torch.testing.assert_close(res.alpha, closed, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(res.residual, y - K @ res.alpha, rtol=1e-9, atol=1e-10)
    assert res.n_iter == k


def test_gd_flow_limit_first_order_in_eta():
    X, K, y = _problem(n=20)
    s, U = spectrum(K)
    t = 2.0
    flow = gradient_flow_spectral(s, U, y, [t])[0]
    errs = []
    for eta in (0.02, 0.01):
        res = gradient_descent_path(K, y, learning_rate=eta, max_iter=round(t / eta))
        errs.append(float(torch.linalg.vector_norm(K @ res.alpha - K @ flow)))
    # Euler discretisation: the in-sample error halves with the step.
    assert errs[1] < 0.05 * float(torch.linalg.vector_norm(y))
    assert 1.6 < errs[0] / errs[1] < 2.4


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_limit_is_flow_at_rescaled_time(nesterov):
    X, K, y = _problem(n=20)
    gamma, eta, k = 0.5, 1e-3, 3000
    s, U = spectrum(K)
    flow = gradient_flow_spectral(s, U, y, [k * eta], momentum=gamma)[0]
    for method in ("spectral", "iterative"):
        res = gradient_descent_path(K, y, learning_rate=eta, max_iter=k, momentum=gamma,
                                    nesterov=nesterov, method=method)
        rel = torch.linalg.vector_norm(K @ (res.alpha - flow)) / torch.linalg.vector_norm(y)
        assert rel < 1e-3


def test_momentum_spectral_equals_iterative_and_out_of_sample_flow():
    X, K, y = _problem(n=20)
    Xe = torch.rand(5, 2, dtype=F64)
    Ke = Gaussian(1.0)(Xe, X)
    a = gradient_descent_path(K, y, learning_rate=0.03, max_iter=200, momentum=0.7,
                              nesterov=True, method="spectral", K_eval=Ke)
    b = gradient_descent_path(K, y, learning_rate=0.03, max_iter=200, momentum=0.7,
                              nesterov=True, method="iterative", K_eval=Ke)
    torch.testing.assert_close(a.alpha, b.alpha, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(a.eval_predictions, Ke @ a.alpha, rtol=1e-9, atol=1e-10)


def test_spectral_filter_limits():
    s = torch.tensor([0.0, 1e-12, 0.5, 1.5], dtype=F64)
    phi = spectral_filter(s, 0.1, torch.tensor([0, 1, 30]))
    assert torch.all(phi[0] == 0)
    torch.testing.assert_close(phi[1], torch.full((4,), 0.1, dtype=F64))
    exact = (1 - (1 - 0.1 * s[2:]) ** 30) / s[2:]
    torch.testing.assert_close(phi[2, 2:], exact)
    torch.testing.assert_close(phi[2, :2], torch.full((2,), 3.0, dtype=F64))


# ---- T7 / T8: diagonal and identity kernels ----
def test_t7_sign_descent_diagonal_kernel_is_clipped_solution():
    g = torch.Generator().manual_seed(1)
    k = torch.rand(6, generator=g, dtype=F64) + 0.5
    y = torch.randn(6, generator=g, dtype=F64) * 2
    eta, steps = 1e-3, 800
    res = sign_gradient_path(torch.diag(k), y, learning_rate=eta, max_iter=steps)
    t = steps * eta
    expected = torch.sign(y / k) * torch.minimum(torch.full_like(y, t), (y / k).abs())
    assert float((res.alpha - expected).abs().max()) <= eta * (1 + 1e-9)


def test_t8_coordinate_descent_identity_kernel_is_soft_thresholding():
    y = torch.tensor([2.0, -1.5, 0.7, 0.2, -0.05], dtype=F64)
    eta, steps = 1e-3, 2000
    res = coordinate_descent_path(torch.eye(5, dtype=F64), y, learning_rate=eta, max_iter=steps)
    # Lasso path for an orthogonal design: alpha = soft(y, c) with ||alpha||_1 = t.
    t = float(res.alpha.abs().sum())
    assert abs(t - steps * eta) < 1e-9
    lo, hi = 0.0, float(y.abs().max())
    for _ in range(100):
        c = 0.5 * (lo + hi)
        lo, hi = (c, hi) if float((y.abs() - c).clamp_min(0).sum()) > t else (lo, c)
    soft = torch.sign(y) * (y.abs() - c).clamp_min(0)
    assert float((res.alpha - soft).abs().max()) <= 2 * eta
    assert torch.equal(res.alpha == 0, soft == 0)


def test_t8_gradient_descent_identity_kernel_matches_ridge():
    y = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    eta, k = 1e-3, 1500
    res = gradient_descent_path(torch.eye(3, dtype=F64), y, learning_rate=eta, max_iter=k,
                                method="iterative")
    t = k * eta
    ridge = y / (1 + 1 / (math.exp(t) - 1))  # KRR with lambda = 1 / (e^t - 1)
    torch.testing.assert_close(res.alpha, ridge, rtol=2e-3, atol=1e-6)


# ---- T9: feature-space equivalence with a linear kernel ----
@pytest.mark.parametrize("which", ["gd", "sign", "cd"])
def test_t9_linear_kernel_equals_feature_space_descent(which):
    g = torch.Generator().manual_seed(2)
    X = torch.randn(15, 4, generator=g, dtype=F64)
    y = torch.randn(15, generator=g, dtype=F64)
    K = Linear()(X)
    eta, steps = 0.01, 60
    beta = torch.zeros(4, dtype=F64)
    fitted = [X @ beta]
    for _ in range(steps):
        r = y - X @ beta
        d = {"gd": r, "sign": torch.sign(r), "cd": coordinate_direction(r)}[which]
        beta = beta + eta * X.T @ d
        fitted.append(X @ beta)
    fn = {"gd": gradient_descent_path, "sign": sign_gradient_path,
          "cd": coordinate_descent_path}[which]
    kw = {"method": "iterative"} if which == "gd" else {}
    res = fn(K, y, learning_rate=eta, max_iter=steps, record_path=True, **kw)
    assert res.path.shape == (steps + 1, 15)
    for k in range(steps + 1):
        torch.testing.assert_close(K @ res.path[k], fitted[k], rtol=1e-9, atol=1e-10)


# ---- T10 (corrected step-size conditions) ----
def test_t10_gradient_step_bound_keeps_residual_monotone():
    for seed in range(5):
        X, K, y = _problem(n=20, seed=seed, sigma=0.5 + seed)
        eta = 1.999 / largest_eigenvalue(K)
        res = gradient_descent_path(K, y, learning_rate=eta, max_iter=200, method="iterative",
                                    record_path=True)
        norms = torch.linalg.vector_norm(y[None] - res.path @ K, dim=1)
        assert bool((norms[1:] <= norms[:-1] * (1 + 1e-12) + 1e-13).all())


def test_t10_sign_descent_corrected_bound_and_paper_counterexample():
    for seed in range(6):
        X, K, y = _problem(n=15, seed=seed, sigma=1.0 + seed)
        alpha = torch.zeros_like(y)
        for _ in range(30):
            r = y - K @ alpha
            Ks = K @ torch.sign(r)
            eta = float(sign_monotone_step(r, Ks))
            if not math.isfinite(eta) or eta == 0:
                break
            new = sign_step(alpha, r, eta)
            assert float((y - K @ new).abs().sum()) <= float(r.abs().sum()) * (1 + 1e-12)
            alpha = new
    # The paper's bound eta <= min_i |r_i| is not sufficient: ||r||_1 grows here.
    K = 0.1 * torch.eye(5, dtype=F64) + 0.9
    y = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.9], dtype=F64)
    r1 = y - K @ sign_step(torch.zeros(5, dtype=F64), y, float(y.abs().min()))
    assert float(r1.abs().sum()) > float(y.abs().sum())


def test_t10_coordinate_descent_corrected_bound_is_sharp_and_paper_counterexample():
    for seed in range(6):
        X, K, y = _problem(n=15, seed=seed, sigma=0.5 + seed)
        alpha = torch.zeros_like(y)
        for _ in range(30):
            r = y - K @ alpha
            m = int(r.abs().argmax())
            eta = float(coordinate_monotone_step(r, K[:, m], m))
            new = alpha.clone()
            new[m] += eta * torch.sign(r[m])
            assert float((y - K @ new).abs().max()) <= float(r.abs().max()) * (1 + 1e-12)
            worse = alpha.clone()
            worse[m] += 1.05 * eta * torch.sign(r[m])  # the condition is also necessary
            assert float((y - K @ worse).abs().max()) > float(r.abs().max())
            alpha = new
    K = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=F64)
    y = torch.tensor([1.0, -0.95], dtype=F64)
    r1 = y - K @ coordinate_step(torch.zeros(2, dtype=F64), y, float(y.abs().min()))
    assert float(r1.abs().max()) > float(y.abs().max())


# ---- T11 invariants ----
def test_t11_sign_descent_invariants():
    X, K, y = _problem(n=30, kernel=Laplace)
    eta = 0.01
    res = sign_gradient_path(K, y, learning_rate=eta, max_iter=300, record_path=True)
    P = res.path
    assert torch.all(P[0] == 0)
    steps = (P[1:] - P[:-1]).abs()
    assert torch.all((steps < 1e-12) | ((steps - eta).abs() < 1e-12))
    k = torch.arange(P.shape[0], dtype=F64)
    assert torch.all(P.abs().amax(dim=1) <= k * eta + 1e-12)


def test_t11_coordinate_descent_invariants_and_ties():
    X, K, y = _problem(n=30)
    eta = 0.01
    res = coordinate_descent_path(K, y, learning_rate=eta, max_iter=300, record_path=True)
    P = res.path
    k = torch.arange(P.shape[0], dtype=F64)
    assert torch.all(P[0] == 0)
    assert torch.all((P != 0).sum(dim=1) <= k)
    assert torch.all(P.abs().sum(dim=1) <= k * eta + 1e-12)
    assert int((res.alpha != 0).sum()) < 30  # sparse
    # All tied maximal coordinates move together.
    y2 = torch.tensor([1.0, -1.0, 0.5], dtype=F64)
    r2 = coordinate_descent_path(torch.eye(3, dtype=F64), y2, learning_rate=0.1, max_iter=1)
    assert r2.alpha.tolist() == [0.1, -0.1, 0.0]


def test_sign_of_zero_residual_does_not_move():
    y = torch.tensor([0.0, 1.0, -1.0], dtype=F64)
    res = sign_gradient_path(torch.eye(3, dtype=F64), y, learning_rate=0.25, max_iter=10)
    assert res.alpha.tolist() == [0.0, 1.0, -1.0]


# ---- fast updates equal the naive O(n^2) iterations ----
def _naive(step, K, Y, eta, T):
    A = torch.zeros_like(Y)
    for _ in range(T):
        A = step(A, Y - A @ K, eta)
    return A


def test_fast_sign_and_coordinate_paths_equal_naive_loops_batched():
    X, K, y = _problem(n=40)
    Y = torch.stack([y, 1 - 2 * y, torch.cos(X[:, 0])], 1)  # (n, 3): three targets
    Xe = torch.rand(6, 2, dtype=F64)
    Ke = Gaussian(1.0)(Xe, X)
    for fn, step in ((sign_gradient_path, sign_step), (coordinate_descent_path, coordinate_step)):
        res = fn(K, Y, learning_rate=0.01, max_iter=250, K_eval=Ke)
        naive = _naive(step, K, Y.T.contiguous(), 0.01, 250).T
        torch.testing.assert_close(res.alpha, naive, rtol=0, atol=1e-12)
        torch.testing.assert_close(res.residual, Y - K @ res.alpha, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(res.eval_predictions, Ke @ res.alpha, rtol=1e-9, atol=1e-10)


def test_batch_agnostic_steps():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(4, 7, generator=g, dtype=F64)
    R = torch.randn(4, 7, generator=g, dtype=F64)
    eta = torch.tensor([[0.1], [0.2], [0.3], [0.4]], dtype=F64)
    for step in (gradient_step, sign_step, coordinate_step):
        batched = step(A, R, eta)
        for b in range(4):
            torch.testing.assert_close(batched[b], step(A[b], R[b], float(eta[b])))
    out = momentum_step(A, A - 1, R, 0.1, 0.5)
    torch.testing.assert_close(out, A + 0.5 + 0.1 * R)


def test_matrix_free_operator_with_small_budget_matches_dense():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(120, 3, generator=g, dtype=F64)
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(120, generator=g, dtype=F64)
    op = KernelOperator(Gaussian(1.0), X, options=Options(memory_budget=60_000))
    assert not op.fits_in_memory()
    K = Gaussian(1.0)(X)
    for fn in (sign_gradient_path, coordinate_descent_path):
        a = fn(op, y, learning_rate=0.005, max_iter=80)
        b = fn(K, y, learning_rate=0.005, max_iter=80)
        torch.testing.assert_close(a.alpha, b.alpha, rtol=0, atol=1e-12)
    a = gradient_descent_path(op, y, max_iter=20)  # "auto" picks the matrix-free iteration
    b = gradient_descent_path(K, y, learning_rate=a.learning_rate, max_iter=20, method="spectral")
    torch.testing.assert_close(a.alpha, b.alpha, rtol=1e-8, atol=1e-9)


# ---- step sizes, divergence, bad input ----
def test_default_gradient_step_is_safe_and_divergence_is_detected():
    X, K, y = _problem(n=30, sigma=2.0)
    s_max = float(torch.linalg.eigvalsh(K)[-1])
    assert gradient_learning_rate(K) * s_max <= 1 + 1e-9
    op = KernelOperator(Gaussian(2.0), X, options=Options(memory_budget=3000))
    est = largest_eigenvalue(op)  # power iteration: an upper estimate within 5%
    assert s_max * (1 - 1e-6) <= est <= 1.06 * s_max
    for method in ("iterative", "spectral"):
        with pytest.raises(DivergenceError, match="learning_rate"):
            gradient_descent_path(K, y, learning_rate=2.5 / s_max, max_iter=500, method=method)
        with pytest.raises(DivergenceError):
            gradient_descent_path(K, y, learning_rate=4.5 / s_max, momentum=0.5, nesterov=True,
                                  max_iter=500, method=method)
    with pytest.raises(DivergenceError):
        check_gradient_learning_rate(2.1, 1.0)
    check_gradient_learning_rate(2.9, 1.0, momentum=0.5)  # heavy ball tolerates 2 (1 + gamma)


def test_tol_stops_when_fitted():
    X, K, y = _problem(n=20, sigma=0.3)
    for method in ("spectral", "iterative"):
        res = gradient_descent_path(K, y, max_iter=10_000, tol=1e-3, method=method)
        assert res.n_iter < 10_000
        assert float(torch.linalg.vector_norm(res.residual)) <= 1e-3 * float(
            torch.linalg.vector_norm(y)) * (1 + 1e-9)


def test_bad_input():
    K = torch.eye(3, dtype=F64)
    y = torch.ones(3, dtype=F64)
    for fn in (gradient_descent_path, sign_gradient_path, coordinate_descent_path):
        with pytest.raises(ValueError, match="y must have shape"):
            fn(K, torch.ones(4, dtype=F64))
        with pytest.raises(ValueError, match="NaN"):
            fn(K, torch.tensor([1.0, math.nan, 0.0], dtype=F64))
        with pytest.raises(ValueError, match="learning_rate"):
            fn(K, y, learning_rate=-1.0)
        with pytest.raises(ValueError, match="square"):
            fn(torch.ones(3, 2, dtype=F64), y)
        with pytest.raises(TypeError):
            fn(np.eye(3), y)
    with pytest.raises(ValueError, match="momentum"):
        gradient_descent_path(K, y, momentum=1.0)
    with pytest.raises(ValueError, match="method"):
        gradient_descent_path(K, y, method="magic")


# ---- early stopping ----
def test_early_stopping_monitor_patience_and_tol():
    stop = EarlyStopping(n_iter_no_change=3, tol=0.1)
    flags = [stop.update(k, v) for k, v in enumerate([5.0, 4.0, 3.95, 3.92, 3.91])]
    assert flags == [False, False, False, False, True]
    assert stop.best_iteration == 1 and stop.best_loss == 4.0
    with pytest.raises(ValueError):
        EarlyStopping(n_iter_no_change=0)
    assert float(validation_mse(torch.zeros(2, 3), torch.ones(2, 3))) == 1.0


@pytest.mark.parametrize("which", ["gd_spectral", "gd_iterative", "sign", "cd"])
def test_early_stopped_path_picks_validation_minimum(which):
    g = torch.Generator().manual_seed(5)
    X = torch.rand(60, 1, generator=g, dtype=F64) * 6 - 3
    y = torch.sin(X[:, 0]) + 0.5 * torch.randn(60, generator=g, dtype=F64)
    tr, va = torch.arange(45), torch.arange(45, 60)
    kern = Gaussian(0.3)
    K, Kv = kern(X[tr]), kern(X[va], X[tr])
    fn, kw = {
        "gd_spectral": (gradient_descent_path, {"method": "spectral", "learning_rate": 0.05}),
        "gd_iterative": (gradient_descent_path, {"method": "iterative", "learning_rate": 0.05}),
        "sign": (sign_gradient_path, {"learning_rate": 0.01}),
        "cd": (coordinate_descent_path, {"learning_rate": 0.01}),
    }[which]
    res = early_stopped_path(fn, K, y[tr], Kv, y[va], n_iter_no_change=50, max_iter=3000, **kw)
    full = fn(K, y[tr], max_iter=res.n_iter, record_path=True, **kw)
    curve = ((full.path @ Kv.T - y[va]) ** 2).mean(dim=1)
    assert res.best_iteration == int(torch.argmin(curve))
    assert res.n_iter == min(3000, res.best_iteration + 50)
    torch.testing.assert_close(res.best_alpha, full.path[res.best_iteration])
    torch.testing.assert_close(res.validation_losses, curve, rtol=1e-9, atol=1e-12)
