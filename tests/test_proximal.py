"""Prox operators and proximal gradient: Allerbo digest T13 (KKT conditions, alpha = 0 thresholds),
T7 penalised form, the lambda convention of the reference code, warm-started penalty paths."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from kernelflow.kernels import Gaussian, Laplace
from kernelflow.solvers.paths import DivergenceError, largest_eigenvalue
from kernelflow.solvers.prox import (
    lambda_max,
    penalty_value,
    project_l1_ball,
    prox,
    prox_l2,
    prox_linf,
    soft_threshold,
)
from kernelflow.solvers.proximal import (
    fista,
    polish_solution,
    proximal_gradient,
    proximal_path,
)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _problem(n=25, seed=0, sigma=0.2, kernel=Gaussian):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, generator=g, dtype=F64) * 3
    y = torch.sin(3 * X[:, 0]) + 0.3 * torch.randn(n, generator=g, dtype=F64)
    return kernel(sigma)(X), y


# ---- prox operators ----
def test_soft_threshold_and_l2_prox_formulas():
    v = torch.tensor([[1.5, -0.2, -3.0, 0.0]], dtype=F64)
    assert soft_threshold(v, 0.5).tolist() == [[1.0, 0.0, -2.5, 0.0]]
    torch.testing.assert_close(prox_l2(v, 1.0), v / 2)
    torch.testing.assert_close(prox("l1", v, torch.tensor([[0.5]], dtype=F64)),
                               soft_threshold(v, 0.5))
    with pytest.raises(ValueError, match="penalty"):
        prox("l3", v, 1.0)


def _generic_prox_linf(v, c):
    # min_w 1/2 ||w - v||^2 + c s  subject to  -s <= w_i <= s  (epigraph form), by SLSQP.
    n = len(v)
    cons = [{"type": "ineq", "fun": lambda z, i=i: z[n] - z[i]} for i in range(n)]
    cons += [{"type": "ineq", "fun": lambda z, i=i: z[n] + z[i]} for i in range(n)]
    z0 = np.r_[v, np.abs(v).max()]
    res = minimize(lambda z: 0.5 * np.sum((z[:n] - v) ** 2) + c * z[n], z0, constraints=cons,
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
    return res.x[:n]


def test_linf_prox_matches_generic_convex_solver_and_moreau():
    rng = np.random.RandomState(0)
    for c in (0.1, 1.0, 3.0, 100.0):
        v = rng.randn(7) * 2
        ours = prox_linf(torch.tensor(v), c).numpy()
        np.testing.assert_allclose(ours, _generic_prox_linf(v, c), atol=1e-6)
        # prox caps |v| at a common level c' with sum (|v| - c')_+ = c, or is 0.
        proj = project_l1_ball(torch.tensor(v), c).numpy()
        np.testing.assert_allclose(ours + proj, v, atol=1e-12)
        if np.abs(v).sum() <= c:
            assert np.all(ours == 0)
        else:
            assert np.abs(proj).sum() == pytest.approx(c)
            level = np.abs(ours).max()
            assert np.clip(np.abs(v) - level, 0, None).sum() == pytest.approx(c)


def test_l1_ball_projection_is_optimal_and_batched():
    rng = np.random.RandomState(1)
    V = torch.tensor(rng.randn(5, 9), dtype=F64)
    radius = torch.tensor([[0.5], [1.0], [2.0], [50.0], [0.0]], dtype=F64)
    P = project_l1_ball(V, radius)
    for b in range(5):
        w = P[b]
        assert float(w.abs().sum()) <= float(radius[b]) + 1e-12
        # Optimality: <v - w, u - w> <= 0 for u on the ball's vertices.
        for i in range(9):
            for sgn in (1.0, -1.0):
                u = torch.zeros(9, dtype=F64)
                u[i] = sgn * float(radius[b])
                assert float((V[b] - w) @ (u - w)) <= 1e-10
        torch.testing.assert_close(w, project_l1_ball(V[b], float(radius[b])))
    torch.testing.assert_close(P[3], V[3])  # inside the ball: unchanged
    assert torch.all(P[4] == 0)


def test_penalty_values_and_thresholds():
    a = torch.tensor([1.0, -3.0, 0.5], dtype=F64)
    assert [float(penalty_value(p, a)) for p in ("l1", "linf", "l2")] == [4.5, 3.0, 5.125]
    assert float(lambda_max("l1", a)) == 3.0 and float(lambda_max("linf", a)) == 4.5
    assert float(lambda_max("l2", a)) == float("inf")


# ---- T13: KKT conditions and alpha = 0 thresholds ----
@pytest.mark.parametrize("kernel,sigma", [(Gaussian, 0.1), (Laplace, 1.0)])
def test_t13_linf_kkt_conditions(kernel, sigma):
    K, y = _problem(kernel=kernel, sigma=sigma)
    for lam in (0.05, 0.5, 0.3 * float(y.abs().sum())):
        res = proximal_gradient(K, y, lam, penalty="linf", tol=1e-10)
        assert res.converged
        a, r = res.alpha, res.residual
        top = a.abs().max()
        assert float(top) > 0
        capped = (top - a.abs()) <= 1e-9 * float(top)
        # Non-extreme points are interpolated, extreme ones have residuals of their own sign
        # (or zero), and ||r||_1 = lambda.
        assert float(r[~capped].abs().amax()) < 1e-7
        assert torch.all(r[capped] * torch.sign(a[capped]) >= -1e-7)
        assert float(r.abs().sum()) == pytest.approx(lam, rel=1e-6)


def test_t13_l1_kkt_conditions():
    K, y = _problem(sigma=0.1)
    for lam in (0.01, 0.1, 0.5):
        res = proximal_gradient(K, y, lam, penalty="l1", tol=1e-10)
        assert res.converged
        a, r = res.alpha, res.residual
        S = a != 0
        torch.testing.assert_close(r[S], lam * torch.sign(a[S]), rtol=0, atol=1e-7)
        assert float(r[~S].abs().amax()) <= lam * (1 + 1e-7)
        assert 0 < int(S.sum()) < len(y)


@pytest.mark.parametrize("penalty,norm", [("linf", 1), ("l1", float("inf"))])
def test_t13_zero_solution_threshold(penalty, norm):
    K, y = _problem(sigma=0.3)
    lam0 = float(torch.linalg.vector_norm(y, ord=norm))
    assert torch.all(proximal_gradient(K, y, lam0, penalty=penalty).alpha == 0)
    assert torch.all(proximal_gradient(K, y, 1.5 * lam0, penalty=penalty).alpha == 0)
    below = proximal_gradient(K, y, 0.95 * lam0, penalty=penalty)
    assert below.converged and float(below.alpha.abs().max()) > 0


def test_t13_unique_solution_from_different_starts():
    K, y = _problem(sigma=0.1)
    a = proximal_gradient(K, y, 0.3, penalty="linf", tol=1e-10).alpha
    b = proximal_gradient(K, y, 0.3, penalty="linf", tol=1e-10, alpha0=5 * torch.ones_like(y))
    torch.testing.assert_close(a, b.alpha, rtol=0, atol=1e-7)


def test_l2_penalty_equals_ridge_and_t7_identity_kernel_clips():
    K, y = _problem(sigma=0.3)
    res = proximal_gradient(K, y, 0.2, penalty="l2")
    torch.testing.assert_close(res.alpha, torch.linalg.solve(K + 0.2 * torch.eye(25, dtype=F64),
                                                             y))
    # K = I: Kl-inf R(lambda) = clip(y, c) with sum_i (|y_i| - c)_+ = lambda.
    v = torch.tensor([3.0, -2.0, 0.5, 1.0], dtype=F64)
    clip = proximal_gradient(torch.eye(4, dtype=F64), v, 2.5, penalty="linf").alpha
    c = 1.0  # (3 - 1) + (2 - 1) = 3 ... solve: (3 - c) + (2 - c) = 2.5 -> c = 1.25
    c = 1.25
    torch.testing.assert_close(clip, v.clamp(-c, c))


def test_polish_without_acceleration_and_fista_beats_ista():
    K, y = _problem(n=12, sigma=0.2)
    fast = proximal_gradient(K, y, 0.05, penalty="linf", max_iter=3000, polish=False,
                             warn=False)
    slow = proximal_gradient(K, y, 0.05, penalty="linf", max_iter=3000, polish=False,
                             accelerated=False, warn=False)
    assert fast.kkt_residual < slow.kkt_residual
    exact = proximal_gradient(K, y, 0.05, penalty="linf", tol=1e-10)
    assert exact.converged
    P = polish_solution("linf", K, y, exact.alpha, 0.05)
    torch.testing.assert_close(P, exact.alpha, rtol=1e-6, atol=1e-8)


def test_reference_code_lambda_convention():
    # The reference code thresholds with its lambda at step 0.01: lam_paper = lam_code / 0.01.
    K, y = _problem(n=10, sigma=0.5, kernel=Laplace)
    lam_code, eta = 0.004, 0.01
    a = torch.zeros_like(y)
    for _ in range(6000):
        a = prox_linf(a - eta * (K @ a - y), lam_code)
    ours = proximal_gradient(K, y, lam_code / eta, penalty="linf", tol=1e-10)
    torch.testing.assert_close(ours.alpha, a, rtol=0, atol=1e-5)


def test_warm_started_path_equals_cold_solves_and_batched_fista():
    K, y = _problem(sigma=0.1)
    lams = [0.02, 1.0, 0.2, 100.0]
    A, its = proximal_path(K, y, lams, penalty="l1", tol=1e-9)
    assert its[3] == 0  # above lambda_max: alpha = 0 at no cost
    for i, lam in enumerate(lams):
        cold = proximal_gradient(K, y, lam, penalty="l1", tol=1e-9).alpha
        torch.testing.assert_close(A[i], cold, rtol=0, atol=1e-6)
    eta = 1.0 / largest_eigenvalue(K)
    Y = y.expand(4, -1).contiguous()
    lam_t = torch.tensor(lams, dtype=F64)
    X, KX, n_iter, ok, kkt = fista(lambda B, rows: B @ K, Y, lam_t, "l1", eta, tol=1e-9,
                                   max_iter=20000)
    assert bool(ok.all())
    torch.testing.assert_close(X, A, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(KX, X @ K)


def test_divergence_and_bad_input():
    K, y = _problem(sigma=0.3)
    s_max = largest_eigenvalue(K)
    with pytest.raises(DivergenceError, match="learning_rate"):
        proximal_gradient(K, y, 0.1, penalty="linf", learning_rate=3.0 / s_max, polish=False)
    with pytest.raises(ValueError, match="lam"):
        proximal_gradient(K, y, -1.0)
    with pytest.raises(ValueError, match="penalty"):
        proximal_gradient(K, y, 1.0, penalty="huber")
    with pytest.raises(ValueError, match="y must have shape"):
        proximal_gradient(K, y[:-1], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        proximal_gradient(K, torch.full_like(y, float("nan")), 1.0)
    with pytest.warns(Warning, match="KKT tolerance"):
        proximal_gradient(K, y, 1e-4, penalty="linf", max_iter=3, polish=False)


@pytest.mark.parametrize("penalty", ["linf", "l1", "l2"])
def test_batched_prox_equals_per_row_prox(penalty):
    rng = np.random.default_rng(7)
    V = torch.tensor(rng.standard_normal((12, 9)) * rng.uniform(0.1, 5, (12, 1)))
    V[3] = 0.0  # an all-zero row
    V[5, :4] = 1.5  # ties in magnitude
    c = torch.tensor(rng.uniform(0.0, 6.0, 12))
    c[0] = 0.0
    batched = prox(penalty, V, c[:, None])
    for b in range(V.shape[0]):
        torch.testing.assert_close(batched[b], prox(penalty, V[b], float(c[b])), rtol=0,
                                   atol=1e-12)
