"""The Nyström direct solve on ill-conditioned problems, its residual check, and what is reported.

Reference: the minimiser of ||K_nM a - y||^2 + alpha a^T K_MM a by a float64 least-squares solve
of the unsquared, whitened system [K_nM F; sqrt(alpha) I] beta = [y; 0], a = F beta
(K_MM = U diag(s) U^T, F = U diag(s)^-1/2 over the eigenvalues above rounding); objectives are
evaluated in extended precision.
"""

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

from kernelflow.estimators.kernel_ridge import KernelRidge
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.kernels import Gaussian
from kernelflow.operators import Options
from kernelflow.solvers import nystrom as nys


def _data(n, seed=0):
    # the side-by-side benchmark's function: X ~ N(0, I_9), two fixed directions
    rng = np.random.RandomState(seed)
    Q, _ = np.linalg.qr(np.random.RandomState(12345).randn(9, 2))
    X = rng.randn(n, 9)
    u = X @ Q
    f = np.sin(2 * u[:, 0]) + 0.5 * np.tanh(2 * u[:, 1]) + 0.25 * u[:, 0] * u[:, 1]
    return X, f + 0.1 * rng.randn(n)


def _objective(K, K_mm, yc, alpha, a):
    KL, aL = K.astype(np.longdouble), a.astype(np.longdouble)
    r = KL @ aL - yc
    return float(r @ r + alpha * aL @ (K_mm.astype(np.longdouble) @ aL))


def _reference(K, K_mm, yc, alpha):
    s, U = np.linalg.eigh(K_mm)
    keep = s > s[-1] * np.finfo(np.float64).eps * len(s)
    F = U[:, keep] / np.sqrt(s[keep])
    A = np.vstack([K @ F, np.sqrt(alpha) * np.eye(F.shape[1])])
    beta = np.linalg.lstsq(A, np.concatenate([yc, np.zeros(F.shape[1])]), rcond=None)[0]
    return F @ beta


def _gap(model, X, y, sigma, alpha):
    """Objective of the fitted coefficients over the reference's, minus 1."""
    C = model.centers_.numpy()
    k = Gaussian(sigma)
    K = k(torch.from_numpy(X), torch.from_numpy(C)).numpy()
    K_mm = k(torch.from_numpy(C)).numpy()
    yc = y - float(model.intercept_)
    ref = _objective(K, K_mm, yc, alpha, _reference(K, K_mm, yc, alpha))
    return _objective(K, K_mm, yc, alpha, model.dual_coef_.numpy()) / ref - 1.0


# (n, M, sigma, lambda on Falkon's scale): the former direct solve (Gram of K_nM, whitened
# afterwards) was 5 %, 54 % and 140 % above the minimum here, with no warning
ILL_CONDITIONED = [(3000, 300, 10.0, 1e-10), (3000, 300, 10.0, 1e-8), (3000, 300, 20.0, 1e-8)]


@pytest.mark.parametrize("n, M, sigma, lam", ILL_CONDITIONED)
def test_default_fit_reaches_the_minimum_on_ill_conditioned_problems(n, M, sigma, lam):
    X, y = _data(n)
    alpha = n * lam
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback needed: the whitened Gram is chosen
        m = NystromKernelRidge(n_components=M, alpha=alpha, sigma=sigma,
                               random_state=0).fit(X, y)
    assert m.solver_ == "direct" and m.solver_history_ == [("direct", 1)]
    assert abs(_gap(m, X, y, sigma, alpha)) <= 1e-2


def test_float32_input_on_an_ill_conditioned_problem_reaches_the_minimum():
    # float32 kernel values would leave out the directions of K_MM below their rounding (the
    # former 1.5 % at n = 2e4, M = 500): ill-conditioned direct solves use float64 values
    n, M, sigma, lam = ILL_CONDITIONED[1]
    X, y = _data(n)
    X32, y32 = X.astype(np.float32), y.astype(np.float32)
    m = NystromKernelRidge(n_components=M, alpha=n * lam, sigma=sigma,
                           random_state=0).fit(X32, y32)
    assert m.compute_dtype_ == "float32" and m.solver_history_ == [("direct", 1)]
    assert abs(_gap(m, X32.astype(np.float64), y32.astype(np.float64), sigma, n * lam)) <= 1e-2


def test_failed_residual_check_warns_falls_back_and_reports(monkeypatch):
    # force the plain Gram (the former formulation) where it is wrong: the residual check
    # against the rows catches it, warns and solves again from the whitened rows
    monkeypatch.setattr(nys, "_SQUARED_GRAM_MAX", float("inf"))
    n, M, sigma, lam = ILL_CONDITIONED[1]
    X, y = _data(n)
    with pytest.warns(RuntimeWarning, match=r"times what rounding allows.*whitened rows"):
        m = NystromKernelRidge(n_components=M, alpha=n * lam, sigma=sigma,
                               random_state=0).fit(X, y)
    assert m.solver_history_ == [("direct", 1), ("direct", 1)] and m.n_iter_ == 2
    assert abs(_gap(m, X, y, sigma, n * lam)) <= 1e-2


def test_direct_then_cg_history(monkeypatch):
    # a check that never passes: plain Gram, whitened Gram, then float64 CG from its solution
    monkeypatch.setattr(nys, "_CHECK_SLACK", 0.0)
    monkeypatch.setattr(nys, "_CHECK_EXCESS", 0.0)
    monkeypatch.setattr(nys, "_CHECK_MIN", -1.0)
    monkeypatch.setattr(nys, "_SQUARED_GRAM_MAX", float("inf"))
    X, y = _data(600)
    with pytest.warns(RuntimeWarning) as rec:
        m = NystromKernelRidge(n_components=60, alpha=1e-2, sigma=3.0, solver="direct",
                               random_state=0).fit(X, y)
    assert sum("rounding allows" in str(w.message) for w in rec) == 2
    names = [s for s, _ in m.solver_history_]
    assert names == ["direct", "direct", "cg"] and m.solver_ == "cg"
    # CG starts from the (accurate) direct solution: it may stop at once
    assert m.n_iter_ == sum(k for _, k in m.solver_history_) and m.converged_
    ref = NystromKernelRidge(n_components=60, alpha=1e-2, sigma=3.0, solver="direct",
                             random_state=0).fit(X, y)
    np.testing.assert_allclose(m.predict(X), ref.predict(X), rtol=0, atol=1e-3)


def test_cg_then_direct_history(monkeypatch):
    # float32 CG stalls at a tiny penalty; "auto" then solves directly, and reports both
    monkeypatch.setattr(nys, "choose_solver", lambda *a, **k: "cg")
    rng = np.random.RandomState(0)
    X = rng.uniform(-3, 3, size=(1500, 3)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] / 3 + 0.1 * rng.randn(1500)).astype(np.float32)
    kw = dict(n_components=200, alpha=1e-6, sigma=1.5, random_state=0, max_iter=10)
    m = NystromKernelRidge(**kw).fit(X, y)
    assert m.solver_ == "direct" and m.converged_
    assert m.solver_history_ == [("cg", 10), ("direct", 1)] and m.n_iter_ == 11


def test_all_points_as_centres_match_exact_kernel_ridge():
    rng = np.random.RandomState(0)
    X = rng.uniform(-3, 3, size=(500, 3))
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] / 3 + 0.1 * rng.randn(500)
    for alpha in (1e-3, 1.0):
        exact = KernelRidge(alpha=alpha, sigma=1.5).fit(X, y).predict(X)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            m = NystromKernelRidge(n_components=500, alpha=alpha, sigma=1.5,
                                   random_state=0).fit(X, y)
        assert m.centers_.shape[0] == 500 and m.solver_ == "direct"
        assert np.abs(m.predict(X) - exact).max() <= 1e-6 * np.abs(exact).max()


def test_too_many_centres_for_the_budget_says_what_to_do():
    X, y = _data(700)
    opts = Options(memory_budget=1_000_000)  # one 400 x 400 float64 matrix takes 1.28 MB
    with pytest.raises(MemoryError, match=r"400 Nyström centres.*1 MiB.*fewer centres"):
        NystromKernelRidge(n_components=400, sigma=3.0, options=opts, solver="cg",
                           random_state=0).fit(X, y)
    m = NystromKernelRidge(n_components=100, sigma=3.0, options=opts, random_state=0).fit(X, y)
    assert m.centers_.shape[0] == 100
