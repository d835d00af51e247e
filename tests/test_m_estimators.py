"""Kernel Huber / Tukey M-estimators (IRLS) and kernel quantile regression (MM)."""

import numpy as np
import pytest
import torch

from kernelflow.kernels import Gaussian
from kernelflow.solvers.m_estimators import (
    check_loss,
    huber_weights,
    kernel_huber_irls,
    kernel_quantile_mm,
    kernel_tukey_irls,
    tukey_weights,
)

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def problem():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(30, 2, dtype=DT, generator=g) * 4
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(30, dtype=DT, generator=g)
    y[3] += 6.0  # an outlier
    return Gaussian(1.0)(X, X), y


def test_huber_with_huge_threshold_is_ridge(problem):
    K, y = problem
    res = kernel_huber_irls(K, y, 0.3, c=1e6)
    ridge = torch.linalg.solve(K + 0.3 * torch.eye(30, dtype=DT), y)
    torch.testing.assert_close(res.coef, ridge, rtol=1e-9, atol=1e-10)
    assert res.n_iter <= 2 and bool(res.converged)


@pytest.mark.parametrize("solver,wfun,c", [(kernel_huber_irls, huber_weights, 1.345),
                                           (kernel_tukey_irls, tukey_weights, 4.685)])
def test_irls_fixed_point_is_the_weighted_solve(problem, solver, wfun, c):
    # at convergence alpha = W (W K W + lambda I)^{-1} W y with W from alpha's own residuals
    K, y = problem
    lam = 0.1
    res = solver(K, y, lam, c=c, tol=1e-12, max_iter=500)
    assert bool(res.converged)
    r = y - K @ res.coef
    w = wfun(r, c * r.std(unbiased=False))
    direct = w * torch.linalg.solve(w[:, None] * K * w[None, :] + lam * torch.eye(30, dtype=DT),
                                    w * y)
    torch.testing.assert_close(res.coef, direct, rtol=1e-7, atol=1e-9)


def test_outlier_is_downweighted(problem):
    K, y = problem
    hub = kernel_huber_irls(K, y, 0.1)
    tuk = kernel_tukey_irls(K, y, 0.1)
    assert hub.weights[3] < 0.5 * hub.weights.median()
    assert tuk.weights[3] == 0 and tuk.coef[3] == 0


def test_batched_grid_equals_separate_runs(problem):
    K, y = problem
    lams = torch.tensor([0.01, 0.1, 1.0], dtype=DT).reshape(3, 1)
    cs = torch.tensor([0.5, 1.0, 2.0], dtype=DT).reshape(1, 3) * 1.345
    res = kernel_huber_irls(K, y, lams, c=cs)
    assert res.coef.shape == (3, 3, 30)
    for i in range(3):
        for j in range(3):
            one = kernel_huber_irls(K, y, float(lams[i, 0]), c=float(cs[0, j]))
            torch.testing.assert_close(res.coef[i, j], one.coef, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("solver", [kernel_huber_irls, kernel_tukey_irls, kernel_quantile_mm])
def test_mask_equals_training_subproblem(problem, solver):
    K, y = problem
    val = torch.zeros(30, dtype=torch.bool)
    val[::4] = True
    tr = torch.nonzero(~val).reshape(-1)
    masked = solver(K, y, 0.2, mask=~val)
    sub = solver(K[tr][:, tr], y[tr], 0.2)
    assert torch.all(masked.coef[val] == 0)
    torch.testing.assert_close(masked.coef[tr], sub.coef, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("tau", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("lam", [0.5, 2.0])
def test_quantile_identity_kernel_closed_form(tau, lam):
    # K = I separates: alpha_i = argmin_a rho_tau(y_i - a) + lam a^2 / 2, which is
    # tau / lam if tau / lam < y_i, (tau - 1) / lam if that exceeds y_i, else y_i
    y = torch.tensor([-3.0, -0.1, 0.05, 0.2, 2.5], dtype=DT)
    res = kernel_quantile_mm(torch.eye(5, dtype=DT), y, lam, quantile=tau, tol=1e-12,
                             max_iter=2000)
    hi, lo = tau / lam, (tau - 1) / lam
    expected = torch.where(y > hi, torch.full_like(y, hi), torch.where(y < lo,
                                                                        torch.full_like(y, lo), y))
    torch.testing.assert_close(res.coef, expected, atol=2e-4, rtol=0)


def test_quantile_mm_decreases_objective(problem):
    K, y = problem
    lam, tau = 0.1, 0.3

    def objective(a):
        return float(check_loss(y - K @ a, tau).sum() + 0.5 * lam * a @ K @ a)

    values = [objective(kernel_quantile_mm(K, y, lam, quantile=tau, max_iter=m,
                                           tol=0.0).coef) for m in (1, 2, 4, 8, 16, 32)]
    assert all(b <= a + 1e-6 for a, b in zip(values, values[1:]))
    assert values[-1] < 0.9 * values[0]


def test_bad_input(problem):
    K, y = problem
    with pytest.raises(ValueError, match="alpha"):
        kernel_huber_irls(K, y, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        kernel_tukey_irls(K, y, float("nan"))
    with pytest.raises(ValueError, match="tuning constant"):
        kernel_huber_irls(K, y, 1.0, c=-1.0)
    with pytest.raises(ValueError, match="quantile"):
        kernel_quantile_mm(K, y, 1.0, quantile=1.0)
    with pytest.raises(ValueError, match="last dimension"):
        kernel_huber_irls(K, y[:-1], 1.0)
    with pytest.raises(ValueError, match="shape"):
        kernel_quantile_mm(K[:, :-1], y, 1.0)
    np.testing.assert_allclose(check_loss(torch.tensor([2.0]), 0.9).numpy(), [1.8])


def _grid_batch(K, y):
    """A small CV-like batch: 2 kernels x 2 fold masks x 3 penalties x 2 constants."""
    K2 = torch.stack([K, K.pow(2.0)]).reshape(2, 1, 1, 1, *K.shape)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(2, K.shape[0], generator=g, dtype=DT) > 0.2).to(DT)
    lam = torch.tensor([1e-4, 1e-2, 1.0], dtype=DT).reshape(1, 1, 3, 1)
    return K2, y, lam, mask.reshape(1, 2, 1, 1, -1)


@pytest.mark.parametrize("solver,const", [(kernel_huber_irls, "c"), (kernel_tukey_irls, "c"),
                                          (kernel_quantile_mm, "quantile")])
def test_compacted_loop_equals_whole_batch_loop(problem, solver, const):
    K, y, lam, mask = _grid_batch(*problem)
    cs = {"c": [0.5, 2.0], "quantile": [0.25, 0.5]}[const]
    kw = {const: torch.tensor(cs, dtype=DT).reshape(1, 1, 1, 2), "mask": mask, "max_iter": 40}
    a = solver(K, y, lam, compact=True, **kw)
    b = solver(K, y, lam, compact=False, **kw)
    scale = b.coef.abs().amax(-1, keepdim=True).clamp_min(1.0)
    assert ((a.coef - b.coef).abs() / scale).max() < 1e-10
    assert torch.equal(a.converged, b.converged)
    assert torch.equal(a.iterations, b.iterations)
    assert a.n_iter == b.n_iter == int(a.iterations.max())


@pytest.mark.parametrize("solver", [kernel_huber_irls, kernel_quantile_mm])
def test_converged_flags_and_iterations_match_single_problems(problem, solver):
    K, y, lam, mask = _grid_batch(*problem)
    res = solver(K, y, lam, mask=mask, max_iter=25)
    # a problem is unconverged exactly when it ran into the cap
    assert torch.equal(~res.converged, res.iterations == 25)
    assert res.converged.any()
    if solver is kernel_quantile_mm:  # MM reaches the cap on part of this batch
        assert (~res.converged).any()
    for idx in [(0, 0, 0, 0), (1, 1, 2, 0), (0, 1, 1, 0)]:
        one = solver(K[idx[0], 0, 0, 0], y, float(lam[0, 0, idx[2], 0]),
                     mask=mask[0, idx[1], 0, 0], max_iter=25)
        assert bool(one.converged) == bool(res.converged[idx])
        assert one.n_iter == int(res.iterations[idx])
        assert torch.allclose(one.coef, res.coef[idx], rtol=1e-9, atol=1e-9)
