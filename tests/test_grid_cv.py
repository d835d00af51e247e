"""Batched (bandwidth x penalty) grid cross-validation against per-fold direct solves."""

import numpy as np
import pytest
import torch
from _helpers import regression_data
from sklearn.model_selection import KFold

from kernelflow.estimators import KernelRidgeCV
from kernelflow.kernels import Gaussian
from kernelflow.solvers.grid_cv import krr_grid_cv, penalized_grid_cv
from kernelflow.solvers.proximal import proximal_gradient

F64 = torch.float64


def _data(n=50, seed=0):
    X, y = regression_data(n, 2, lambda X: np.sin(X[:, 0]) + 0.5 * X[:, 1], bounds=(-3, 3),
                           seed=seed)
    return X, y + 2.0


def _brute_krr(X, y, sigmas, alphas, folds, intercept, sw=None):
    out = np.zeros((len(sigmas), len(alphas)))
    for si, s in enumerate(sigmas):
        k = Gaussian(s)
        for tr, va in folds:
            w = np.ones(len(tr)) if sw is None else sw[tr]
            mu = np.average(y[tr], weights=w) if intercept else 0.0
            K = k(torch.tensor(X[tr]), torch.tensor(X[tr])).numpy()
            Kv = k(torch.tensor(X[va]), torch.tensor(X[tr])).numpy()
            for li, a in enumerate(alphas):
                # argmin sum_i w_i (y_i - K_i c)^2 + a c^T K c  =>  (W K + a I) c = W y
                c = np.linalg.solve(w[:, None] * K + a * np.eye(len(tr)), w * (y[tr] - mu))
                e = (Kv @ c + mu - y[va]) ** 2
                wv = np.ones(len(va)) if sw is None else sw[va]
                out[si, li] += np.average(e, weights=wv) / len(folds)
    return out


@pytest.mark.parametrize("intercept", [True, False])
def test_kernel_ridge_cv_kfold_equals_brute_force(intercept):
    X, y = _data()
    sigmas, alphas = [0.3, 1.0, 3.0], np.geomspace(1e-4, 1.0, 5)
    model = KernelRidgeCV(alphas=alphas, sigmas=sigmas, cv=10,
                          fit_intercept=intercept).fit(X, y)
    folds = list(KFold(10).split(X))
    ref = _brute_krr(X, y, sigmas, alphas, folds, intercept)
    np.testing.assert_allclose(model.cv_results_["mean_error"], ref, rtol=1e-7, atol=1e-10)
    i, j = np.unravel_index(np.argmin(ref), ref.shape)
    assert (model.sigma_, model.alpha_) == (sigmas[i], alphas[j])
    # the refit is the plain KRR fit at the chosen pair
    Kt = Gaussian(sigmas[i])(torch.tensor(X), torch.tensor(X)).numpy()
    mu = y.mean() if intercept else 0.0
    c = np.linalg.solve(Kt + alphas[j] * np.eye(len(y)), y - mu)
    np.testing.assert_allclose(model.predict(X), Kt @ c + mu, atol=1e-8)


def test_kernel_ridge_cv_splitter_weights_and_unequal_folds():
    X, y = _data(n=43, seed=1)
    sw = np.random.RandomState(2).uniform(0.5, 2.0, size=43)
    splitter = KFold(4, shuffle=True, random_state=0)  # folds of 11, 11, 11, 10 rows
    sigmas, alphas = [0.5, 2.0], [1e-3, 1e-1]
    model = KernelRidgeCV(alphas=alphas, sigmas=sigmas, cv=splitter).fit(X, y, sample_weight=sw)
    ref = _brute_krr(X, y, sigmas, alphas, list(splitter.split(X)), True, sw)
    np.testing.assert_allclose(model.cv_results_["mean_error"], ref, rtol=1e-7, atol=1e-10)


def test_krr_grid_cv_refuses_bad_input():
    X = torch.rand(10, 1, dtype=F64)
    with pytest.raises(ValueError, match="folds"):
        krr_grid_cv(X, X[:, 0], [Gaussian(1.0)], [1.0], [[0, 1]])
    with pytest.raises(ValueError, match="alphas"):
        krr_grid_cv(X, X[:, 0], [Gaussian(1.0)], [-1.0], [[0], [1]])
    with pytest.raises(ValueError, match="alphas"):
        krr_grid_cv(X, X[:, 0], [Gaussian(1.0)], [float("nan")], [[0], [1]])
    with pytest.raises(ValueError, match="no training row"):
        krr_grid_cv(X, X[:, 0], [Gaussian(1.0)], [1.0], [list(range(10)), [1]])


@pytest.mark.parametrize("penalty", ["linf", "l1", "l2"])
def test_penalized_grid_cv_equals_per_problem_solves(penalty):
    # well-conditioned problems, so the converged minimisers are unique and comparable
    rng = np.random.RandomState(3)
    n = 24
    X = torch.tensor(rng.uniform(-3, 3, size=(n, 1)))
    y = torch.sin(X[:, 0]) + 0.3 * torch.tensor(rng.standard_cauchy(n)).clamp(-5, 5)
    sigmas, lams = [0.1, 0.2], [0.3, 1.0, 3.0]
    folds = [list(range(i, n, 3)) for i in range(3)]
    res = penalized_grid_cv(X, y, [Gaussian(s) for s in sigmas], lams, folds, penalty=penalty,
                            tol=1e-10, max_iter=20000)
    for si, s in enumerate(sigmas):
        k = Gaussian(s)
        for f, va in enumerate(folds):
            tr = [i for i in range(n) if i not in va]
            for li, lam in enumerate(lams):
                c = proximal_gradient(k(X[tr], X[tr]), y[tr], lam, penalty=penalty,
                                      tol=1e-10).alpha
                mse = float(((k(X[va], X[tr]) @ c - y[va]) ** 2).mean())
                assert abs(float(res.fold_mse[si, f, li]) - mse) < 1e-6 * (1 + mse)


def _reference_ista(K, y, thresh, penalty, eta, t_max):
    """The reference implementation's loop, written out for one problem in NumPy."""
    a = np.zeros((len(y), 1))
    old = np.ones(len(y))
    y = y.reshape(-1, 1)
    for ii in range(t_max):
        steps = ii + 1
        v = a - eta * (K @ a - y)
        if penalty == "l1":
            a = np.sign(v) * np.maximum(np.abs(v) - thresh, 0)
        elif penalty == "l2":
            a = v / (1 + thresh)
        else:
            u = np.abs(v[:, 0])
            if u.sum() <= thresh:
                a = np.zeros_like(v)
            else:
                srt = np.sort(u)[::-1]
                css = np.cumsum(srt)
                rho = np.nonzero(srt * np.arange(1, len(u) + 1) > css - thresh)[0][-1]
                theta = (css[rho] - thresh) / (rho + 1)
                a = v - (np.sign(v[:, 0]) * np.clip(u - theta, 0, None)).reshape(-1, 1)
        if np.linalg.norm(a - old) < 1e-5:
            break
        old = a.copy()
    return a[:, 0], steps


@pytest.mark.parametrize("penalty", ["linf", "l1"])
def test_published_solver_matches_reference_loop(penalty):
    rng = np.random.RandomState(4)
    n = 20
    X = torch.tensor(rng.uniform(-3, 3, size=(n, 1)))
    y = torch.sin(X[:, 0]) + 0.1 * torch.tensor(rng.standard_cauchy(n)).clamp(-5, 5)
    folds = [list(range(i, n, 4)) for i in range(4)]
    lbdas = [1e-3, 1e-1, 1.0]  # the reference's thresholds
    res = penalized_grid_cv(X, y, [Gaussian(1.0)], [t / 0.01 for t in lbdas], folds,
                            penalty=penalty, solver="published", max_iter=300)
    k = Gaussian(1.0)
    for f, va in enumerate(folds):
        tr = [i for i in range(n) if i not in va]
        K = k(X[tr], X[tr]).numpy()
        for li, t in enumerate(lbdas):
            a, steps = _reference_ista(K, y[tr].numpy(), t, penalty, 0.01, 300)
            mse = np.mean((k(X[va], X[tr]).numpy() @ a - y[va].numpy()) ** 2)
            assert abs(float(res.fold_mse[0, f, li]) - mse) < 1e-10
            assert int(res.n_iter[0, f, li]) == steps


@pytest.mark.parametrize("case", ["plain", "weighted_intercept_two_targets", "unequal_folds"])
def test_krr_tridiagonal_path_equals_eigendecomposition(case):
    from kernelflow.solvers import grid_cv

    rng = np.random.default_rng(3)
    n, t = (37, 2) if case != "plain" else (40, 1)
    X = torch.tensor(rng.uniform(-5, 5, (n, 1)))
    Y = torch.tensor(rng.standard_normal((n, t)))
    sw = torch.tensor(rng.uniform(0.2, 2.0, n)) if case != "plain" else None
    k = 4 if case != "unequal_folds" else 3
    folds = np.array_split(rng.permutation(n), k) if case != "plain" else \
        [np.arange(i, n, k) for i in range(k)]
    val = grid_cv.fold_masks(folds, n)
    trains = [torch.nonzero(~m).reshape(-1) for m in val]
    vals = [torch.nonzero(m).reshape(-1) for m in val]
    groups = [list(range(k))] if len({int(t_.numel()) for t_ in trains}) == 1 \
        else [[f] for f in range(k)]
    kernels = [Gaussian(float(s)) for s in (0.05, 0.7, 3.0, 50.0)]
    lam = torch.tensor(np.geomspace(1e-5, 10, 7))
    fast = torch.zeros(4, k, 7, dtype=torch.float64)
    ref = torch.zeros_like(fast)
    assert grid_cv._krr_scores_tridiagonal(X, Y, kernels, lam, groups, trains, vals, sw,
                                           case != "plain", fast)
    grid_cv._krr_scores(X, Y, kernels, lam, groups, trains, vals, sw, case != "plain", ref)
    torch.testing.assert_close(fast, ref, rtol=1e-7, atol=1e-10)
    # a zero penalty (minimum-norm interpolation) is left to the eigendecomposition
    zero = torch.zeros_like(fast)
    assert not grid_cv._krr_scores_tridiagonal(X, Y, kernels, torch.tensor([0.0, 1.0]).double(),
                                               groups, trains, vals, sw, False, zero)


@pytest.mark.parametrize("penalty", ["linf", "l1"])
def test_published_grid_all_bandwidths_equal_one_at_a_time(penalty):
    rng = np.random.default_rng(4)
    n = 30
    X = torch.tensor(rng.uniform(-3, 3, (n, 1)))
    y = torch.tensor(np.sin(X[:, 0].numpy()) + 0.1 * rng.standard_normal(n))
    folds = [np.arange(i, n, 3) for i in range(3)]
    kernels = [Gaussian(s) for s in (0.3, 1.0, 4.0)]
    lams = [0.5, 5.0, 50.0]
    together = penalized_grid_cv(X, y, kernels, lams, folds, penalty=penalty,
                                 solver="published", max_iter=300)
    for i, kern in enumerate(kernels):
        alone = penalized_grid_cv(X, y, [kern], lams, folds, penalty=penalty,
                                  solver="published", max_iter=300)
        torch.testing.assert_close(together.fold_mse[i], alone.fold_mse[0], rtol=0, atol=1e-10)
        assert torch.equal(together.n_iter[i], alone.n_iter[0])


@pytest.mark.parametrize("folds_kind", ["equal", "unequal"])
def test_krr_block_formula_equals_per_fold_solves(folds_kind):
    # residuals of the model fitted without block v are (H_vv)^-1 (H y)_v, H = (K + lam I)^-1
    from kernelflow.solvers import grid_cv

    rng = np.random.default_rng(5)
    n, t = (60, 2) if folds_kind == "equal" else (47, 1)
    X = torch.tensor(rng.uniform(-10, 10, (n, 1)))
    Y = torch.tensor(rng.standard_normal((n, t)))
    k = 10 if folds_kind == "equal" else 6
    folds = np.array_split(rng.permutation(n), k)
    val = grid_cv.fold_masks(folds, n)
    trains = [torch.nonzero(~m).reshape(-1) for m in val]
    vals = [torch.nonzero(m).reshape(-1) for m in val]
    groups = [[f] for f in range(k)]
    # from nearly the identity to nearly rank one, penalties down to 1e-6
    kernels = [Gaussian(float(s)) for s in (0.01, 0.7, 3.0, 1000.0)]
    lam = torch.tensor(np.geomspace(1e-6, 10, 9))
    fast = torch.zeros(4, k, 9, dtype=torch.float64)
    ref = torch.zeros_like(fast)
    assert grid_cv._krr_scores_blocks(X, Y, kernels, lam, vals, fast)
    grid_cv._krr_scores(X, Y, kernels, lam, groups, trains, vals, None, False, ref)
    torch.testing.assert_close(fast, ref, rtol=1e-6, atol=1e-10)
    # a zero penalty is left to the per-fold paths
    assert not grid_cv._krr_scores_blocks(X, Y, kernels, torch.tensor([0.0, 1.0]).double(),
                                          vals, torch.zeros_like(fast))
