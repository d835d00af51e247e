"""kernel="precomputed": the estimators take kernel matrices as scikit-learn's do."""

import numpy as np
import pytest
import torch
from _helpers import regression_data
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators import KernelRidge, KernelRidgeClassifier
from kernelflow.estimators._base import resolve_kernel
from kernelflow.kernels import Gaussian, Laplace, median_heuristic
from kernelflow.linalg import NearSingularKernelWarning


def _data(n=60, m=15, d=3, seed=0):
    X, y = regression_data(n + m, d, lambda X: np.sin(X[:, 0]) + 0.3 * X[:, 1], bounds=(-2, 2),
                           seed=seed)
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
    # scikit-learn's check_decision_proba_consistency fits raw features, not a kernel matrix,
    # whatever the pairwise tag says (a classifier with predict_proba runs it)
    check_estimator(Est(kernel="precomputed"), expected_failed_checks={
        "check_decision_proba_consistency": "fits raw features on a pairwise estimator"}
        if Est is KernelRidgeClassifier else {})


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


# ---- the path estimators: the same fits from the kernel matrix ----------------------------------
from kernelflow.estimators import (  # noqa: E402
    KernelCoordinateDescent,
    KernelGradientDescent,
    KernelGradientFlow,
    KernelHuberGradientDescent,
    KernelSignGradient,
)
from kernelflow.estimators.huber_path import KernelHuberGradientDescentCV  # noqa: E402
from kernelflow.estimators.path_cv import (  # noqa: E402
    KernelCoordinateDescentCV,
    KernelGradientDescentCV,
    KernelSignGradientCV,
)

# a fixed number of steps: the validation split of early stopping goes by row content, which
# for a kernel matrix is its rows (tested below), not the inputs that made it
_PATH = [
    (KernelGradientDescent, {"max_iter": 200, "early_stopping": False}),
    (KernelSignGradient, {"max_iter": 300, "early_stopping": False}),
    (KernelCoordinateDescent, {"max_iter": 300, "early_stopping": False}),
    (KernelHuberGradientDescent, {"max_iter": 200, "early_stopping": False}),
    (KernelGradientFlow, {"t": 3.0}),
]
_PATH_CV = [
    (KernelGradientDescentCV, {"cv": 3, "max_iter": 200, "random_state": 0}),
    (KernelSignGradientCV, {"cv": 3, "max_iter": 300, "random_state": 0}),
    (KernelCoordinateDescentCV, {"cv": 3, "max_iter": 300, "random_state": 0}),
    (KernelHuberGradientDescentCV, {"cv": 3, "max_iter": 200, "random_state": 0}),
]


def _gram(k, A, B):
    return k(torch.from_numpy(A), torch.from_numpy(B)).numpy()


@pytest.mark.parametrize("Est,params", _PATH, ids=lambda p: getattr(p, "__name__", ""))
def test_path_estimator_precomputed_equals_kernel_inside(Est, params):
    X, y, Xt = _data()
    k = Gaussian(1.1)
    inside = Est(kernel=k, **params).fit(X, y)
    pre = Est(kernel="precomputed", **params).fit(_gram(k, X, X), y)
    np.testing.assert_allclose(pre.predict(_gram(k, Xt, X)), inside.predict(Xt), rtol=1e-8,
                               atol=1e-8)
    assert getattr(pre, "n_iter_", 0) == getattr(inside, "n_iter_", 0)
    assert pre.kernel_ == "precomputed" and pre.n_features_in_ == X.shape[0]


@pytest.mark.parametrize("Est,params", _PATH_CV, ids=lambda p: getattr(p, "__name__", ""))
def test_path_cv_precomputed_equals_one_bandwidth(Est, params):
    # with a kernel matrix only the stopping time is cross-validated: the same as a grid of the
    # one bandwidth that made the matrix
    X, y, Xt = _data()
    k = Gaussian(1.1)
    inside = Est(sigmas=[1.1], **params).fit(X, y)
    pre = Est(kernel="precomputed", **params).fit(_gram(k, X, X), y)
    np.testing.assert_allclose(pre.predict(_gram(k, Xt, X)), inside.predict(Xt), rtol=1e-8,
                               atol=1e-8)
    assert pre.n_iter_ == inside.n_iter_ and pre.sigma_ is None and pre.sigmas_ is None


def test_path_precomputed_early_stopping_splits_by_kernel_rows():
    from kernelflow.utils.holdout import holdout_weights

    X, y, Xt = _data()
    k = Gaussian(1.1)
    K = _gram(k, X, X)
    pre = KernelSignGradient(kernel="precomputed", max_iter=2000, random_state=0).fit(K, y)
    _, w_va = holdout_weights(torch.from_numpy(K), torch.from_numpy(y), None, 0.1, 0)
    np.testing.assert_array_equal(pre.validation_indices_, np.flatnonzero(w_va.numpy() > 0))
    # the same number of steps from the kernel inside gives the same model
    same = KernelSignGradient(kernel=k, max_iter=pre.n_iter_, early_stopping=False).fit(X, y)
    np.testing.assert_allclose(pre.predict(_gram(k, Xt, X)), same.predict(Xt), rtol=1e-8,
                               atol=1e-8)


def test_path_precomputed_zero_weight_rows_drop_rows_and_columns():
    X, y, Xt = _data()
    k = Gaussian(1.1)
    w = np.ones(len(y))
    w[::7] = 0.0
    keep = w > 0
    kept = KernelSignGradient(kernel=k, max_iter=300, early_stopping=False).fit(X[keep],
                                                                               y[keep])
    pre = KernelSignGradient(kernel="precomputed", max_iter=300, early_stopping=False).fit(
        _gram(k, X, X), y, sample_weight=w)
    np.testing.assert_allclose(pre.predict(_gram(k, Xt, X)), kept.predict(Xt), rtol=1e-8,
                               atol=1e-8)
    assert np.all(pre.dual_coef_.numpy()[~keep] == 0)


_ALL_PATH = [e for e, _ in _PATH + _PATH_CV]


@pytest.mark.parametrize("Est", _ALL_PATH)
def test_path_precomputed_wrong_shapes_refused(Est):
    X, y, _ = _data(n=20)
    K = _gram(Gaussian(1.0), X, X)
    kw = {"cv": 3} if "cv" in Est().get_params() else {}
    with pytest.raises(ValueError, match="square training kernel matrix"):
        Est(kernel="precomputed", **kw).fit(K[:, :15], y)
    with pytest.raises(ValueError, match="square training kernel matrix"):
        Est(kernel="precomputed", **kw).fit(X, y)
    est = Est(kernel="precomputed", **kw).fit(K, y)
    with pytest.raises(ValueError, match="20 features"):
        est.predict(K[:, :19])


@pytest.mark.parametrize("Est", _ALL_PATH)
def test_path_precomputed_pairwise_tag_and_check_estimator(Est):
    assert get_tags(Est(kernel="precomputed")).input_tags.pairwise
    assert not get_tags(Est()).input_tags.pairwise
    kw = {"cv": 3, "max_iter": 200} if "cv" in Est().get_params() else {}
    expected = {}
    if Est in (KernelHuberGradientDescent, KernelHuberGradientDescentCV):
        # the check centres a Gram matrix, which makes it indefinite: a gradient path grows
        # along its negative eigenvalues, and the Huber path reports that as DivergenceError
        expected = {"check_positive_only_tag_during_fit": "indefinite kernel matrix diverges"}
    check_estimator(Est(kernel="precomputed", **kw), expected_failed_checks=expected)
