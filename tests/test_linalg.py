import pytest
import torch

from kernelflow.kernels import Gaussian
from kernelflow.linalg import (
    NearSingularKernelWarning,
    cho_solve,
    cholesky,
    conjugate_gradient,
    power_iteration,
    symmetric_eigh,
)


def _spd(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return Gaussian(1.0)(X) + 1e-3 * torch.eye(n, dtype=torch.float64)


def test_cholesky_solves():
    A = _spd()
    b = torch.randn(60, 2, dtype=torch.float64)
    L, j = cholesky(A)
    assert j == 0.0
    torch.testing.assert_close(A @ cho_solve(L, b), b)


def test_cholesky_jitter_on_singular_matrix():
    X = torch.tensor([[0.0], [0.0], [1.0]], dtype=torch.float64)  # duplicate rows
    K = Gaussian(1.0)(X)
    with pytest.warns(NearSingularKernelWarning):
        L, j = cholesky(K)
    assert j > 0 and torch.isfinite(L).all()


def test_cholesky_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        cholesky(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        cholesky(torch.tensor([[float("nan")]]))
    with pytest.raises(torch.linalg.LinAlgError):
        cholesky(-torch.eye(2, dtype=torch.float64), max_tries=2)


def test_conjugate_gradient_matches_direct_solve_per_column():
    A = _spd()
    B = torch.randn(60, 3, dtype=torch.float64)
    B[:, 2] = 0  # a zero column converges at once and must not produce NaN
    res = conjugate_gradient(lambda V: A @ V, B, tol=1e-12, max_iter=500)
    assert res.converged
    torch.testing.assert_close(res.x, torch.linalg.solve(A, B), rtol=1e-6, atol=1e-8)


def test_preconditioner_reduces_iterations():
    A = _spd(n=120)
    b = torch.randn(120, dtype=torch.float64)
    plain = conjugate_gradient(lambda v: A @ v, b, tol=1e-10, max_iter=2000)
    L, _ = cholesky(A + 1e-2 * torch.eye(120, dtype=torch.float64))
    pre = conjugate_gradient(lambda v: A @ v, b, tol=1e-10, max_iter=2000,
                             preconditioner=lambda r: cho_solve(L, r))
    assert pre.converged and plain.converged
    assert pre.n_iter < plain.n_iter / 3
    torch.testing.assert_close(pre.x, plain.x, rtol=1e-6, atol=1e-6)


def test_callback_can_stop():
    A = _spd()
    b = torch.randn(60, dtype=torch.float64)
    res = conjugate_gradient(lambda v: A @ v, b, callback=lambda k, x, r: k >= 3)
    assert res.n_iter == 3


def test_eigh_and_power_iteration():
    A = _spd()
    s, U = symmetric_eigh(A)
    assert (s >= 0).all() and (s[1:] >= s[:-1]).all()
    torch.testing.assert_close(U @ torch.diag(s) @ U.T, A)
    lam = power_iteration(lambda v: A @ v, 60, n_iter=500, tol=1e-12)
    assert lam == pytest.approx(float(s[-1]), rel=1e-6)


def test_cg_stops_on_non_positive_curvature():
    # A indefinite: the first direction b has b^T A b = 1 - 3 < 0; CG must not step on it
    A = torch.diag(torch.tensor([1.0, -3.0], dtype=torch.float64))
    b = torch.ones(2, dtype=torch.float64)
    seen = []
    res = conjugate_gradient(lambda v: A @ v, b, max_iter=10,
                             callback=lambda k, X, R: seen.append(k))
    assert res.breakdown and not res.converged and res.n_iter == 0 and not seen
    assert torch.equal(res.x, torch.zeros(2, dtype=torch.float64))


def test_cg_breakdown_of_one_column_stops_the_run_after_its_last_good_step():
    # column 0: A is SPD on span(e0, e1), CG converges in two steps; column 1 meets the
    # negative direction e2 only in its second step (its first direction has curvature > 0)
    A = torch.diag(torch.tensor([2.0, 1.0, -1e-3], dtype=torch.float64))
    B = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    res = conjugate_gradient(lambda v: A @ v, B, max_iter=10, tol=1e-12)
    assert res.breakdown and not res.converged and res.n_iter == 1
    assert all(torch.isfinite(res.x).ravel())


def test_cg_on_spd_reports_no_breakdown():
    A = _spd()
    b = torch.randn(60, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    res = conjugate_gradient(lambda v: A @ v, b, tol=1e-10, max_iter=500)
    assert res.converged and not res.breakdown
    torch.testing.assert_close(A @ res.x, b, rtol=0, atol=1e-8)
