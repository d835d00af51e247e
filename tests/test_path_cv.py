"""Batched path cross-validation: equality with separate runs, the stopping rule, grid CV."""

import math

import numpy as np
import pytest
import torch
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge

from kernelflow.datasets._allerbo import kfold_indices, make_robust_sine
from kernelflow.kernels import Gaussian, Laplace
from kernelflow.operators import Options
from kernelflow.solvers import _native
from kernelflow.solvers.grid_cv import fold_masks, krr_grid_cv, penalized_grid_cv
from kernelflow.solvers.path_cv import early_stopping_path_cv
from kernelflow.solvers.proximal import proximal_gradient

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def data():
    X, y, _, _ = make_robust_sine(36, random_state=3)
    return torch.tensor(X, dtype=DT), torch.tensor(y, dtype=DT), kfold_indices(36, 4,
                                                                                  random_state=0)


def _separate(X, y, kernel, folds, method, eta, max_iter, patience, curves=None):
    """One problem at a time, exactly as the published experiments loop (1-based counts).

    With ``curves`` (a list), each problem's validation MSE at steps 1, 2, ... is appended.
    """
    out = []
    for va in folds:
        tr = np.setdiff1d(np.arange(len(y)), va)
        K, Kv = kernel(X[tr], X[tr]), kernel(X[va], X[tr])
        a = torch.zeros(len(tr), dtype=DT)
        best, best_k, count, k = math.inf, 0, 0, 0
        curve = [math.nan]
        for k in range(1, max_iter + 1):
            r = y[tr] - K @ a
            if method == "sign":
                a = a + eta * torch.sign(r)
            elif method == "gradient":
                a = a + eta * r
            else:
                a = a + eta * torch.sign(r) * (r.abs() == r.abs().max())
            mse = float(((Kv @ a - y[va]) ** 2).mean())
            curve.append(mse)
            if mse < best:
                best, best_k, count = mse, k, 0
            count += 1
            if count > patience:
                break
        out.append((best, best_k, k))
        if curves is not None:
            curves.append(curve)
    return out


@pytest.mark.parametrize("method", ["sign", "coordinate", "gradient"])
def test_batched_equals_separate(data, method):
    X, y, folds = data
    # Gaussian(30) is numerically low rank: it runs through the factored product K = L L^T
    kernels = [Gaussian(0.05), Gaussian(1.0), Laplace(3.0), Gaussian(30.0)]
    res = early_stopping_path_cv(X, y, kernels, folds, method=method, max_iter=400,
                                 n_iter_no_change=30, chunk_size=16, backend="torch")
    for si, kern in enumerate(kernels):
        ref = _separate(X, y, kern, folds, method, 0.01, 400, 30)
        np.testing.assert_allclose(res.fold_mse[si].numpy(), [r[0] for r in ref], rtol=1e-9,
                                   atol=1e-12)
        assert res.best_iter[si].tolist() == [r[1] for r in ref]
        assert res.n_iter[si].tolist() == [r[2] for r in ref]
    np.testing.assert_allclose(res.cv_mse.numpy(), res.fold_mse.mean(1).numpy())
    assert res.best_index == int(torch.argmin(res.cv_mse))


@pytest.mark.skipif(not _native.available(), reason="compiled extension not built")
@pytest.mark.parametrize("method", ["sign", "coordinate"])
def test_native_follows_the_separate_runs(data, method):
    # The compiled loops keep K alpha as a running sum, so on a flat stretch of the validation
    # curve rounding may place the first minimum at another step with the same error; the
    # error, and the curve's value at the step chosen, must agree with the direct loop.
    X, y, folds = data
    kernels = [Gaussian(0.05), Gaussian(1.0), Laplace(3.0), Gaussian(30.0)]
    res = early_stopping_path_cv(X, y, kernels, folds, method=method, max_iter=400,
                                 n_iter_no_change=30, backend="native")
    exact = 0
    for si, kern in enumerate(kernels):
        curves = []
        ref = _separate(X, y, kern, folds, method, 0.01, 400, 30, curves)
        np.testing.assert_allclose(res.fold_mse[si].numpy(), [r[0] for r in ref], rtol=1e-9,
                                   atol=1e-12)
        for f, (best, best_k, _) in enumerate(ref):
            k = int(res.best_iter[si, f])
            assert curves[f][k] == pytest.approx(best, rel=1e-9, abs=1e-12)
            assert int(res.n_iter[si, f]) == min(400, k + 30)
            exact += k == best_k
    assert exact >= 0.75 * len(kernels) * len(folds)


def test_low_rank_factor_is_used_for_wide_bandwidths(data):
    from kernelflow.solvers.path_cv import _factor_groups

    X, _, _ = data
    K = torch.stack([Gaussian(0.05)(X, X), Gaussian(30.0)(X, X)])
    parts = _factor_groups(torch.arange(2), K)
    assert [p[0].tolist() for p in parts] == [[0], [1]]
    L = parts[1][1][0]
    assert L.shape[1] <= 12
    torch.testing.assert_close(L @ L.T, K[1], rtol=0, atol=1e-12)


def test_stopping_time_is_floor_of_mean_best_iteration(data):
    X, y, folds = data
    res = early_stopping_path_cv(X, y, [Gaussian(0.7), Gaussian(2.0)], folds, method="sign",
                                 max_iter=500, n_iter_no_change=40)
    expected = np.floor(res.best_iter.numpy().mean(1)).astype(int)
    assert res.stopping_iter.tolist() == expected.tolist()
    # with a patience of p a problem runs exactly p steps past its best one (or hits max_iter)
    stopped = res.n_iter < 500
    assert torch.equal((res.n_iter - res.best_iter)[stopped],
                       torch.full_like(res.n_iter[stopped], 40))


def test_no_information_stops_after_patience(data):
    # a tiny bandwidth gives K_val = 0: the validation error never changes after step 1
    X, y, folds = data
    res = early_stopping_path_cv(X, y, [Gaussian(1e-4)], folds, max_iter=1000,
                                 n_iter_no_change=25)
    assert res.best_iter.tolist() == [[1] * len(folds)]
    assert res.n_iter.tolist() == [[26] * len(folds)]
    np.testing.assert_allclose(res.fold_mse[0].numpy(),
                               [float((y[f] ** 2).mean()) for f in folds])


def test_chunk_size_and_memory_groups_do_not_change_result(data):
    X, y, folds = data
    kernels = [Gaussian(s) for s in (0.3, 1.0, 3.0)]
    a = early_stopping_path_cv(X, y, kernels, folds, max_iter=300, n_iter_no_change=20,
                               chunk_size=7)
    small = Options(memory_budget=36 * 36 * 8 + 200 * 4 * 36 * 8)  # one bandwidth at a time
    b = early_stopping_path_cv(X, y, kernels, folds, max_iter=300, n_iter_no_change=20,
                               chunk_size=64, options=small)
    assert torch.equal(a.best_iter, b.best_iter) and torch.equal(a.n_iter, b.n_iter)
    np.testing.assert_allclose(a.fold_mse.numpy(), b.fold_mse.numpy(), rtol=1e-12)


def test_spectral_gradient_equals_iterative(data):
    X, y, folds = data
    kernels = [Gaussian(0.5), Gaussian(2.0), Gaussian(8.0)]
    a = early_stopping_path_cv(X, y, kernels, folds, method="gradient", max_iter=700,
                               n_iter_no_change=50, spectral_gradient=True)
    b = early_stopping_path_cv(X, y, kernels, folds, method="gradient", max_iter=700,
                               n_iter_no_change=50, spectral_gradient=False)
    assert torch.equal(a.best_iter, b.best_iter)
    np.testing.assert_allclose(a.fold_mse.numpy(), b.fold_mse.numpy(), rtol=1e-8)


def test_krr_grid_matches_scikit_learn(data):
    X, y, folds = data
    sigmas, lams = [0.5, 2.0], [1e-3, 0.1, 10.0]
    res = krr_grid_cv(X, y, [Gaussian(s) for s in sigmas], lams, folds)
    Xn, yn = X.numpy(), y.numpy()
    for i, s in enumerate(sigmas):
        for j, lam in enumerate(lams):
            mses = []
            for va in folds:
                tr = np.setdiff1d(np.arange(len(yn)), va)
                m = SkKernelRidge(alpha=lam, kernel="rbf", gamma=1 / (2 * s * s))
                m.fit(Xn[tr], yn[tr])
                mses.append(np.mean((m.predict(Xn[va]) - yn[va]) ** 2))
            assert res.cv_mse[i, j].item() == pytest.approx(np.mean(mses), rel=1e-7)
    assert res.best_index == divmod(int(torch.argmin(res.cv_mse)), len(lams))


@pytest.mark.parametrize("penalty", ["linf", "l1"])
def test_penalized_grid_matches_single_problem_solver(data, penalty):
    X, y, folds = data
    kern, lams = Laplace(0.5), [3.0, 0.3, 0.03]  # well conditioned: converges in few steps
    res = penalized_grid_cv(X, y, [kern], lams, folds, penalty=penalty, tol=1e-9,
                            max_iter=50_000)
    for j, lam in enumerate(lams):
        mses = []
        for va in folds:
            tr = np.setdiff1d(np.arange(len(y)), va)
            sol = proximal_gradient(kern(X[tr], X[tr]), y[tr], lam, penalty=penalty, tol=1e-9,
                                    max_iter=50_000)
            mses.append(float(((kern(X[va], X[tr]) @ sol.alpha - y[va]) ** 2).mean()))
        assert res.cv_mse[0, j].item() == pytest.approx(np.mean(mses), rel=1e-4, abs=1e-8)


def test_penalized_grid_large_penalty_predicts_zero(data):
    # alpha = 0 once lambda >= ||y||_1 (l_inf) -- the digest's threshold (T13)
    X, y, folds = data
    big = float(y.abs().sum()) * 1.01
    res = penalized_grid_cv(X, y, [Gaussian(1.0)], [big], folds, penalty="linf")
    expected = np.mean([float((y[f] ** 2).mean()) for f in folds])
    assert res.cv_mse[0, 0].item() == pytest.approx(expected, rel=1e-10)


def test_bad_input(data):
    X, y, folds = data
    with pytest.raises(ValueError, match="method"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], folds, method="adam")
    with pytest.raises(ValueError, match="step_size"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], folds, step_size=-1.0)
    with pytest.raises(ValueError, match="n_iter_no_change"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], folds, n_iter_no_change=0)
    with pytest.raises(TypeError, match="Kernel"):
        early_stopping_path_cv(X, y, ["rbf"], folds)
    with pytest.raises(ValueError, match="Fold"):
        fold_masks([[0, 1], []], 5)
    with pytest.raises(ValueError, match="Fold"):
        fold_masks([[0, 1], [7]], 5)
    with pytest.raises(ValueError, match="rows"):
        early_stopping_path_cv(X, y[:-1], [Gaussian(1.0)], folds)
    with pytest.raises(MemoryError, match="budget"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], folds, options=Options(memory_budget=100))
    with pytest.raises(ValueError, match="penalty"):
        penalized_grid_cv(X, y, [Gaussian(1.0)], [1.0], folds, penalty="l0")
    with pytest.raises(ValueError, match="alphas"):
        krr_grid_cv(X, y, [Gaussian(1.0)], [-1.0], folds)
