"""kernel="precomputed": the estimators take kernel matrices as scikit-learn's do."""

import numpy as np
import pytest
import torch
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators import KernelRidge, KernelRidgeClassifier
from kernelflow.estimators._base import resolve_kernel
from kernelflow.kernels import Gaussian, Laplace, median_heuristic
from kernelflow.linalg import NearSingularKernelWarning


def _data(n=60, m=15, d=3, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(n + m, d))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.randn(n + m)
    return X[:n], y[:n], X[n:]


@pytest.mark.parametrize("solver", ["cholesky", "eigen"])
@pytest.mark.parametrize("weighted", [False, True])
def test_precomputed_equals_kernel_inside(solver, weighted):
    X, y, Xt = _data()
    k = Laplace(1.3)
    sw = np.random.RandomState(1).uniform(0.5, 2.0, size=X.shape[0]) if weighted else None
    inside = KernelRidge(alpha=0.3, kernel=k, solver=solver).fit(X, y, sample_weight=sw)
    K = k(torch.from_numpy(X), torch.from_numpy(X)).numpy()
    K_test = k(torch.from_numpy(Xt), torch.from_numpy(X)).numpy()
    pre = KernelRidge(alpha=0.3, kernel="precomputed", solver=solver).fit(K, y, sample_weight=sw)
    np.testing.assert_allclose(pre.predict(K_test), inside.predict(Xt), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pre.dual_coef_.numpy(), inside.dual_coef_.numpy(), rtol=1e-8,
                               atol=1e-9)
    assert pre.kernel_ == "precomputed" and pre.n_features_in_ == X.shape[0]


def test_precomputed_multi_target_and_torch_input():
    X, y, Xt = _data()
    Y = np.stack([y, -2 * y + 1], axis=1)
    k = Gaussian(0.9)
    K = k(torch.from_numpy(X), torch.from_numpy(X))
    K_before = K.clone()
    pre = KernelRidge(alpha=[0.1, 0.5], kernel="precomputed").fit(K, torch.from_numpy(Y))
    torch.testing.assert_close(K, K_before)  # the user's matrix is not factorised in place
    inside = KernelRidge(alpha=[0.1, 0.5], kernel=k).fit(X, Y)
    K_test = k(torch.from_numpy(Xt), torch.from_numpy(X))
    out = pre.predict(K_test)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), inside.predict(Xt), rtol=1e-9, atol=1e-9)


def test_precomputed_classifier_equals_kernel_inside():
    rng = np.random.RandomState(3)
    X = rng.randn(80, 2)
    labels = np.array(["a", "b", "c"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)]
    k = Gaussian(1.0)
    K = k(torch.from_numpy(X), torch.from_numpy(X)).numpy()
    inside = KernelRidgeClassifier(alpha=0.1, kernel=k).fit(X, labels)
    pre = KernelRidgeClassifier(alpha=0.1, kernel="precomputed").fit(K, labels)
    np.testing.assert_allclose(pre.decision_function(K[:20]), inside.decision_function(X[:20]),
                               rtol=1e-9, atol=1e-9)
    assert (pre.predict(K) == inside.predict(X)).all()


@pytest.mark.parametrize("Est", [KernelRidge, KernelRidgeClassifier])
def test_precomputed_wrong_shapes_refused(Est):
    X, y, _ = _data(n=20)
    y = y > 0
    K = Gaussian(1.0)(torch.from_numpy(X), torch.from_numpy(X)).numpy()
    with pytest.raises(ValueError, match="square training kernel matrix"):
        Est(kernel="precomputed").fit(K[:, :15], y)
    with pytest.raises(ValueError, match="square training kernel matrix"):
        Est(kernel="precomputed").fit(X, y)
    est = Est(kernel="precomputed").fit(K, y)
    with pytest.raises(ValueError, match="20 features"):
        est.predict(K[:, :19])
    with pytest.raises(ValueError, match="NaN|infinity"):
        est.predict(np.full((2, 20), np.nan))


@pytest.mark.parametrize("Est", [KernelRidge, KernelRidgeClassifier])
def test_precomputed_check_estimator_and_pairwise_tag(Est):
    assert get_tags(Est(kernel="precomputed")).input_tags.pairwise
    assert not get_tags(Est()).input_tags.pairwise
    check_estimator(Est(kernel="precomputed"))


def test_precomputed_indefinite_matrix_least_squares_with_warning():
    K = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
    y = np.array([1.0, 2.0, 3.0])
    with pytest.warns(NearSingularKernelWarning, match="least-squares"):
        est = KernelRidge(alpha=0.5, kernel="precomputed", fit_intercept=False).fit(K, y)
    c = est.dual_coef_.numpy()
    np.testing.assert_allclose((K + 0.5 * np.eye(3)) @ c, y, atol=1e-10)


def test_precomputed_refuses_what_needs_the_kernel_function():
    X, y, _ = _data(n=20)
    K = Gaussian(1.0)(torch.from_numpy(X), torch.from_numpy(X)).numpy()
    est = KernelRidge(kernel="precomputed").fit(K, y)
    with pytest.raises(ValueError, match="precomputed"):
        est.predict(K, return_std=True)
    with pytest.raises(ValueError, match="precomputed"):
        est.log_marginal_likelihood()
    with pytest.raises(ValueError, match="precomputed"):
        KernelRidge(kernel="precomputed", learn_hyperparameters="gcv").fit(K, y)
    with pytest.raises(ValueError, match="sigma"):
        KernelRidge(kernel="precomputed", sigma=1.0).fit(K, y)


def test_resolve_kernel_one_place():
    X = torch.randn(40, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert resolve_kernel("rbf", gamma=0.5) == Gaussian(1.0)
    k = Laplace(2.0)
    assert resolve_kernel(k, X=X) is k
    w = torch.ones(40, dtype=torch.float64)
    w[:20] = 0  # rows of zero weight do not count for the median heuristic
    got = resolve_kernel("rbf", X=X, sample_weight=w)
    assert got == Gaussian(median_heuristic(X[20:]))
    with pytest.raises(ValueError, match="not supported"):
        resolve_kernel("precomputed")
    assert resolve_kernel("precomputed", allow_precomputed=True) == "precomputed"
    with pytest.raises(ValueError, match="kernel object"):
        resolve_kernel(k, sigma=1.0)
