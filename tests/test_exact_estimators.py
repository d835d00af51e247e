import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators import KernelGradientFlow, KernelRidge, KernelRidgeCV
from kernelflow.kernels import Gaussian
from kernelflow.linalg import NearSingularKernelWarning

ESTIMATORS = [KernelRidge(), KernelGradientFlow(), KernelRidgeCV(sigmas=[0.5, 1.0, 2.0])]


# Leave-one-out leaves out one copy of a repeated row, so weighting a row by 2 cannot equal
# repeating it (scikit-learn's own RidgeCV / GridSearchCV are listed as expected failures too).
EXPECTED_FAILURES = {
    "KernelRidgeCV": {
        "check_sample_weight_equivalence_on_dense_data":
            "leave-one-out is not invariant to repeating a row",
    },
}


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_check_estimator(estimator):
    check_estimator(estimator,
                    expected_failed_checks=EXPECTED_FAILURES.get(type(estimator).__name__, {}))


def _data(n=120, d=3, targets=None, seed=0):
    r = np.random.RandomState(seed)
    X = r.randn(n, d)
    y = np.sin(X @ r.randn(d))
    if targets:
        y = np.stack([y * (k + 1) + k for k in range(targets)], 1)
    return X, y + 0.05 * r.randn(*y.shape)


@pytest.mark.parametrize("kernel,params", [
    ("rbf", dict(gamma=0.3)),
    ("linear", {}),
    ("poly", dict(gamma=0.2, degree=3, coef0=1.0)),
    ("poly", dict(gamma=0.5, degree=2, coef0=0.5)),
])
@pytest.mark.parametrize("targets", [None, 3])
def test_predictions_equal_sklearn(kernel, params, targets):
    X, y = _data(targets=targets)
    Xt = np.random.RandomState(1).randn(50, 3)
    ours = KernelRidge(alpha=0.7, kernel=kernel, fit_intercept=False, **params).fit(X, y)
    ref = SkKernelRidge(alpha=0.7, kernel=kernel, **params).fit(X, y)
    p, q = ours.predict(Xt), ref.predict(Xt)
    assert p.shape == q.shape
    np.testing.assert_allclose(p, q, rtol=1e-8, atol=1e-8 * np.abs(q).max())


def test_sample_weight_and_per_target_alpha_equal_sklearn():
    X, y = _data(targets=2)
    w = np.random.RandomState(3).uniform(0.2, 2.0, size=len(X))
    ours = KernelRidge(alpha=[0.1, 2.0], kernel="rbf", gamma=0.2, fit_intercept=False)
    ref = SkKernelRidge(alpha=[0.1, 2.0], kernel="rbf", gamma=0.2)
    np.testing.assert_allclose(ours.fit(X, y, sample_weight=w).predict(X),
                               ref.fit(X, y, sample_weight=w).predict(X), rtol=1e-8, atol=1e-10)


def test_eigen_solver_equals_cholesky():
    X, y = _data()
    a = KernelRidge(alpha=0.3, sigma=1.5, solver="eigen").fit(X, y).predict(X)
    b = KernelRidge(alpha=0.3, sigma=1.5, solver="cholesky").fit(X, y).predict(X)
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_fit_intercept_centres_y():
    X, y = _data()
    m = KernelRidge(alpha=1.0, sigma=1.0).fit(X, y + 100.0)
    assert float(m.intercept_) == pytest.approx(y.mean() + 100.0)
    shifted = y + 100.0 - m.intercept_.item()
    ref = KernelRidge(alpha=1.0, sigma=1.0, fit_intercept=False).fit(X, shifted)
    np.testing.assert_allclose(m.predict(X), ref.predict(X) + m.intercept_.item(), rtol=1e-12)


def test_input_kinds_and_output_kinds():
    X, y = _data()
    m = KernelRidge(alpha=0.5, sigma=1.0).fit(X, y)
    p_np = m.predict(X)
    assert isinstance(p_np, np.ndarray)
    p_pd = KernelRidge(alpha=0.5, sigma=1.0).fit(pd.DataFrame(X, columns=list("abc")),
                                                    pd.Series(y)).predict(
        pd.DataFrame(X, columns=list("abc")))
    np.testing.assert_allclose(p_pd, p_np)
    mt = KernelRidge(alpha=0.5, sigma=1.0).fit(torch.from_numpy(X), torch.from_numpy(y))
    p_t = mt.predict(torch.from_numpy(X))
    assert isinstance(p_t, torch.Tensor)
    np.testing.assert_allclose(p_t.numpy(), p_np, rtol=1e-12)
    m32 = KernelRidge(alpha=0.5, sigma=1.0).fit(torch.from_numpy(X).float(),
                                                torch.from_numpy(y).float())
    p32 = m32.predict(torch.from_numpy(X).float())
    assert p32.dtype == torch.float32
    np.testing.assert_allclose(p32.numpy(), p_np, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("Est", [KernelRidge, KernelGradientFlow, KernelRidgeCV])
def test_bad_input(Est):
    X, y = _data(n=20)
    est = Est()
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(Xn, y)
    Xi = X.copy()
    Xi[1, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        est.fit(Xi, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError, match="0 sample"):
        est.fit(X[:0], y[:0])
    with pytest.raises(ValueError, match="2D array"):
        est.fit(X[:, 0], y)
    with pytest.raises(ValueError, match="NaN"):
        est.fit(torch.from_numpy(Xn), torch.from_numpy(y))
    with pytest.raises(ValueError, match="dimension"):
        est.fit(torch.from_numpy(X[:, 0]), torch.from_numpy(y))
    with pytest.raises(NotFittedError):
        Est().predict(X)
    est.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])


@pytest.mark.parametrize("params", [dict(sigma=0.0), dict(sigma=-1.0), dict(gamma=-2.0),
                                    dict(alpha=-1.0), dict(kernel="nope")])
def test_invalid_parameters(params):
    X, y = _data(n=20)
    with pytest.raises(ValueError):
        KernelRidge(**params).fit(X, y)


def test_invalid_time_and_momentum():
    X, y = _data(n=20)
    for params in (dict(t=0.0), dict(t=-1.0), dict(momentum=1.0)):
        with pytest.raises(ValueError):
            KernelGradientFlow(**params).fit(X, y)
    with pytest.raises(ValueError):
        KernelRidgeCV(alphas=[0.0, 1.0]).fit(X, y)
    with pytest.raises(ValueError):
        KernelRidgeCV(sigmas=[-1.0]).fit(X, y)


def test_duplicate_rows_fit_with_warning():
    X, y = _data(n=30)
    X = np.vstack([X, X[:5]])
    y = np.concatenate([y, y[:5]])
    with pytest.warns(NearSingularKernelWarning):
        m = KernelRidge(alpha=0.0, sigma=1.0).fit(X, y)
    assert np.isfinite(m.predict(X)).all()
    np.testing.assert_allclose(m.predict(X), y, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = KernelGradientFlow(t=1e4, sigma=1.0).fit(X, y)  # the flow needs no inverse
    assert np.isfinite(m.predict(X)).all()


def test_gradient_flow_estimator_close_to_ridge_with_inverse_penalty():
    X, y = _data(n=60)
    for t in (0.5, 5.0, 50.0):
        gf = KernelGradientFlow(t=t, sigma=1.0, fit_intercept=False).fit(X, y).predict(X)
        rr = KernelRidge(alpha=1 / t, sigma=1.0, fit_intercept=False).fit(X, y).predict(X)
        assert ((gf - rr) ** 2).sum() <= 0.0415 * (y**2).sum()


def test_predict_path_matches_individual_fits_and_multi_output():
    X, y = _data(n=50, targets=2)
    m = KernelGradientFlow(t=1.0, sigma=1.0).fit(X, y)
    P = m.predict_path(X[:7], [0.5, 2.0])
    assert P.shape == (7, 2, 2)
    for i, t in enumerate((0.5, 2.0)):
        np.testing.assert_allclose(P[:, i], KernelGradientFlow(t=t, sigma=1.0).fit(X, y)
                                   .predict(X[:7]), rtol=1e-9, atol=1e-12)


def test_ridge_cv_selects_loo_minimiser_by_brute_force():
    X, y = _data(n=40)
    alphas = [1e-3, 1e-1, 10.0]
    sigmas = [0.3, 1.0, 3.0]
    m = KernelRidgeCV(alphas=alphas, sigmas=sigmas, fit_intercept=False).fit(X, y)
    brute = np.empty((3, 3))
    for i, s in enumerate(sigmas):
        for j, a in enumerate(alphas):
            errs = []
            for k in range(40):
                keep = np.arange(40) != k
                f = KernelRidge(alpha=a, kernel=Gaussian(s), fit_intercept=False).fit(
                    X[keep], y[keep])
                errs.append((f.predict(X[k:k + 1])[0] - y[k]) ** 2)
            brute[i, j] = np.mean(errs)
    np.testing.assert_allclose(m.cv_results_["mean_error"], brute, rtol=1e-6)
    i, j = np.unravel_index(np.argmin(brute), brute.shape)
    assert m.sigma_ == sigmas[i] and m.alpha_ == alphas[j]
    ref = KernelRidge(alpha=m.alpha_, kernel=Gaussian(m.sigma_), fit_intercept=False).fit(X, y)
    np.testing.assert_allclose(m.predict(X), ref.predict(X), rtol=1e-8, atol=1e-10)


def test_ridge_cv_gcv_and_multi_output():
    X, y = _data(n=60, targets=2)
    m = KernelRidgeCV(criterion="gcv", sigmas=[0.5, 1.0]).fit(X, y)
    assert m.predict(X).shape == (60, 2)
    assert m.cv_results_["mean_error"].shape == (2, 30)
