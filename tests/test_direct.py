"""Closed forms of the exact solvers (Allerbo digest §1-§2.3, properties T2, T3, T4, T5, T14)."""

import math

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

from kernelflow.kernels import Gaussian, Laplace
from kernelflow.linalg import NearSingularKernelWarning, band_reduce
from kernelflow.solvers.direct import (
    flow_filter,
    gcv_mse_spectral,
    gradient_flow_spectral,
    krr_cholesky,
    krr_path,
    krr_spectral,
    loo_mse_spectral,
    spectrum,
)

T4_CONSTANT = 0.041466  # max_x (1/(1+x) - e^{-x})^2, attained at x* = 2.512862
X_STAR = 2.512862


def _problem(n=40, d=2, seed=0, sigma=1.0, kernel=Gaussian):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(X.sum(1)) + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, kernel(sigma)(X), y


def test_krr_cholesky_equals_solve_and_spectral_many_penalties():
    X, K, y = _problem()
    Y = torch.stack([y, y**2], 1)
    lams = [1e-3, 0.1, 1.0, 10.0]
    s, U = spectrum(K)
    C = krr_spectral(s, U, Y, lams)
    for i, lam in enumerate(lams):
        direct = torch.linalg.solve(K + lam * torch.eye(40, dtype=K.dtype), Y)
        torch.testing.assert_close(krr_cholesky(K, Y, lam), direct, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(C[i], direct, rtol=1e-8, atol=1e-9)


def test_per_target_alpha_and_sample_weight():
    X, K, y = _problem()
    Y = torch.stack([y, 2 * y], 1)
    C = krr_cholesky(K, Y, torch.tensor([0.1, 1.0]))
    torch.testing.assert_close(C[:, 0], krr_cholesky(K, y, 0.1))
    torch.testing.assert_close(C[:, 1], krr_cholesky(K, 2 * y, 1.0))
    w = torch.rand(40, dtype=torch.float64) + 0.5
    c = krr_cholesky(K, y, 0.3, sample_weight=w)
    # weighted normal equations: (K + lam W^{-1}) c = y
    torch.testing.assert_close((K + 0.3 * torch.diag(1 / w)) @ c, y, rtol=1e-9, atol=1e-9)
    s, U = spectrum(K, w)
    torch.testing.assert_close(krr_spectral(s, U, y, [0.3], sample_weight=w)[0], c,
                               rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("n,b", [(150, 16), (150, 1), (37, 64), (200, 48)])
def test_band_reduction_is_an_orthogonal_similarity(n, b):
    g = torch.Generator().manual_seed(n + b)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = A + A.T
    form = band_reduce(A, b, block=40)
    # B is banded and Q B Q^T reproduces A; Q is orthogonal
    Q = form.apply_q(torch.eye(n, dtype=A.dtype))
    torch.testing.assert_close(Q.T @ Q, torch.eye(n, dtype=A.dtype), rtol=0, atol=1e-12)
    B = torch.zeros(n, n, dtype=A.dtype)
    band = torch.from_numpy(form.band)
    for i in range(band.shape[0]):
        B += torch.diag(band[i, : n - i], -i) + (torch.diag(band[i, : n - i], i) if i else 0)
    torch.testing.assert_close(Q @ B @ Q.T, A, rtol=0, atol=1e-11 * A.abs().max())
    torch.testing.assert_close(torch.linalg.eigvalsh(B), torch.linalg.eigvalsh(A),
                               rtol=0, atol=1e-11 * A.abs().max())
    assert form.band.shape == (min(b, n - 1) + 1, n)


def test_krr_path_equals_direct_solves_for_every_penalty():
    X, K, y = _problem(n=180, d=3)
    Y = torch.stack([y, y**2], 1)
    lams = np.logspace(-4, 1, 12)
    C = krr_path(K, Y, lams, bandwidth=16)
    assert C.shape == (12, 180, 2)
    for i, lam in enumerate(lams):
        direct = torch.linalg.solve(K + lam * torch.eye(180, dtype=K.dtype), Y)
        torch.testing.assert_close(K @ C[i], K @ direct, rtol=1e-8, atol=1e-9)
    w = torch.rand(180, dtype=torch.float64) + 0.5
    Cw = krr_path(K, y, [0.3], sample_weight=w)
    torch.testing.assert_close(Cw[0], krr_cholesky(K, y, 0.3, sample_weight=w),
                               rtol=1e-9, atol=1e-10)
    # the input matrix is left untouched unless overwrite=True
    torch.testing.assert_close(K, Gaussian(1.0)(X))


def test_krr_path_singular_kernel_and_bad_penalties():
    X, K, y = _problem(n=30)
    Xd = torch.cat([X, X])  # duplicate rows: K is singular
    Kd = Gaussian(1.0)(Xd)
    yd = torch.cat([y, y])
    with pytest.warns(NearSingularKernelWarning):
        C = krr_path(Kd, yd, [0.0, 1.0])
    assert torch.isfinite(C).all()
    torch.testing.assert_close(C[1], krr_cholesky(Kd, yd, 1.0), rtol=1e-9, atol=1e-10)
    with pytest.raises(ValueError, match="penalties"):
        krr_path(K, y, [-1.0])
    with pytest.raises(ValueError, match="NaN"):
        band_reduce(torch.full((3, 3), float("nan"), dtype=torch.float64))


def test_t2_woodbury_form_of_krr():
    X, K, y = _problem(n=25, sigma=0.5)
    lam = 0.37
    eye = torch.eye(25, dtype=K.dtype)
    lhs = torch.linalg.solve(K + lam * eye, y)
    rhs = (eye - torch.linalg.inv(eye + K / lam)) @ torch.linalg.solve(K, y)
    torch.testing.assert_close(lhs, rhs, rtol=1e-7, atol=1e-8)


def test_flow_filter_limit_and_values():
    s = torch.tensor([0.0, 1e-20, 1e-3, 1.0, 50.0], dtype=torch.float64)
    F = flow_filter(s, [0.5, 2.0])
    expected = np.array([[-math.expm1(-t * v) / v if v > 0 else t for v in s.tolist()]
                         for t in (0.5, 2.0)])
    np.testing.assert_allclose(F.numpy(), expected, rtol=1e-12)
    assert torch.isfinite(F).all()


def test_gradient_flow_matches_matrix_exponential_and_ode():
    X, K, y = _problem(n=20)
    s, U = spectrum(K)
    times = [0.5, 3.0, 20.0]
    A = gradient_flow_spectral(s, U, y, times)
    for i, t in enumerate(times):
        flow = (torch.eye(20, dtype=K.dtype) - torch.matrix_exp(-t * K)) @ y
        closed = torch.linalg.solve(K, flow)
        torch.testing.assert_close(K @ A[i], K @ closed, rtol=1e-6, atol=1e-7)
    sol = solve_ivp(lambda t, a: y.numpy() - K.numpy() @ a, (0, 3.0), np.zeros(20),
                    rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(A[1].numpy(), sol.y[:, -1], rtol=1e-5, atol=1e-6)


def test_gradient_flow_equals_limit_of_small_step_gradient_descent():
    X, K, y = _problem(n=30)
    s, U = spectrum(K)
    t = 2.0
    flow = gradient_flow_spectral(s, U, y, [t])[0]
    errors = []
    for eta in (0.02, 0.01, 0.005):
        a = torch.zeros_like(y)
        for _ in range(int(round(t / eta))):
            a = a + eta * (y - K @ a)
        errors.append(float(torch.linalg.vector_norm(K @ (a - flow))))
    # Euler: error O(eta), halving eta roughly halves the error
    assert errors[2] < errors[1] < errors[0]
    assert errors[0] / errors[2] == pytest.approx(4.0, rel=0.2)
    assert errors[2] < 1e-2


def test_gradient_flow_momentum_limit():
    X, K, y = _problem(n=15)
    s, U = spectrum(K)
    gamma, eta, steps = 0.5, 1e-3, 3000
    for nesterov in (False, True):
        a, prev = torch.zeros_like(y), torch.zeros_like(y)
        for _ in range(steps):
            look = a + gamma * (a - prev) if nesterov else a
            new = a + gamma * (a - prev) + eta * (y - K @ look)
            prev, a = a, new
        limit = gradient_flow_spectral(s, U, y, [eta * steps], momentum=gamma)[0]
        assert float(torch.linalg.vector_norm(K @ (a - limit))) < 5e-3 * float(y.norm())


def test_gradient_flow_singular_kernel_is_finite():
    X = torch.tensor([[0.0], [0.0], [1.0]], dtype=torch.float64)  # duplicate rows
    K = Gaussian(1.0)(X)
    y = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    s, U = spectrum(K)
    A = gradient_flow_spectral(s, U, y, [0.0, 1.0, 1e6])
    assert torch.isfinite(A).all()
    torch.testing.assert_close(A[0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(K @ A[2], y, rtol=1e-6, atol=1e-6)  # interpolates at t -> inf


def _t4_ratios(K, y, t):
    s, U = spectrum(K)
    a_gf = gradient_flow_spectral(s, U, y, [t])[0]
    a_rr = krr_spectral(s, U, y, [1.0 / t])[0]
    a_inf = torch.linalg.solve(K, y)
    ra = float(((a_gf - a_rr) ** 2).sum() / (a_inf**2).sum())
    rf = float(((K @ (a_gf - a_rr)) ** 2).sum() / (y**2).sum())
    return ra, rf


@pytest.mark.parametrize("seed", range(5))
def test_t4_bound_random(seed):
    X, K, y = _problem(n=25, seed=seed, sigma=0.4)
    K = K + 1e-6 * torch.eye(25, dtype=K.dtype)
    for t in (0.1, 1.0, 10.0, 100.0):
        ra, rf = _t4_ratios(K, y, t)
        assert ra <= 0.0415 and rf <= 0.0415


def test_t4_bound_is_tight():
    X, K, _ = _problem(n=25, sigma=0.4)
    K = K + 1e-3 * torch.eye(25, dtype=K.dtype)
    s, U = spectrum(K)
    i = 20
    y = U[:, i].clone()
    ra, rf = _t4_ratios(K, y, X_STAR / float(s[i]))
    assert ra == pytest.approx(T4_CONSTANT, rel=1e-4)
    assert rf == pytest.approx(T4_CONSTANT, rel=1e-4)


def test_t5_flow_is_closer_to_the_data():
    X, K, _ = _problem(n=20, sigma=0.7)
    K = K + 1e-4 * torch.eye(20, dtype=K.dtype)
    s, _ = spectrum(K)
    eye = torch.eye(20, dtype=K.dtype)
    for t in (0.3, 3.0):
        gf_resid = torch.linalg.matrix_norm(torch.matrix_exp(-t * K), 2)
        krr_resid = torch.linalg.matrix_norm(torch.linalg.inv(eye + t * K), 2)
        assert float(gf_resid) == pytest.approx(math.exp(-t * float(s[0])), rel=1e-6)
        assert gf_resid <= krr_resid + 1e-12
        krr_fit = torch.linalg.matrix_norm(eye - torch.linalg.inv(eye + t * K), 2)
        gf_fit = torch.linalg.matrix_norm(eye - torch.matrix_exp(-t * K), 2)
        assert float(krr_fit) == pytest.approx(1 - 1 / (1 + t * float(s[-1])), rel=1e-6)
        assert krr_fit <= gf_fit + 1e-12


@pytest.mark.parametrize("kernel", [Gaussian, Laplace])
def test_t14_loo_shortcut_equals_brute_force(kernel):
    X, K, y = _problem(n=30, kernel=kernel, sigma=0.8)
    Y = torch.stack([y, torch.cos(X[:, 0])], 1)
    lams = [1e-2, 0.3, 3.0]
    s, U = spectrum(K)
    loo = loo_mse_spectral(s, U, Y, lams)
    for j, lam in enumerate(lams):
        errs = []
        for i in range(30):
            keep = torch.arange(30) != i
            c = torch.linalg.solve(K[keep][:, keep] + lam * torch.eye(29, dtype=K.dtype), Y[keep])
            errs.append((Y[i] - K[i, keep] @ c) ** 2)
        torch.testing.assert_close(loo[j], torch.stack(errs).mean(0), rtol=1e-7, atol=1e-10)


def test_gcv_formula():
    X, K, y = _problem(n=30)
    s, U = spectrum(K)
    lam = 0.2
    H = K @ torch.linalg.inv(K + lam * torch.eye(30, dtype=K.dtype))
    resid = y - H @ y
    expected = (resid**2).mean() / (1 - torch.trace(H) / 30) ** 2
    torch.testing.assert_close(gcv_mse_spectral(s, U, y, [lam])[0, 0], expected, rtol=1e-8,
                               atol=0)
