"""Early-stopped and penalised kernel regression estimators (KGD, KSGD, KCD, l1, linf)."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators.coordinate_descent import KernelCoordinateDescent
from kernelflow.estimators.gradient_descent import KernelGradientDescent
from kernelflow.estimators.gradient_flow import KernelGradientFlow
from kernelflow.estimators.kernel_ridge import KernelRidge
from kernelflow.estimators.penalized import PenalizedKernelRegressor
from kernelflow.estimators.sign_gradient import KernelSignGradient
from kernelflow.kernels import Gaussian
from kernelflow.operators import Options
from kernelflow.solvers.paths import (
    DivergenceError,
    coordinate_descent_path,
    gradient_descent_path,
    sign_gradient_path,
)
from kernelflow.solvers.proximal import proximal_gradient

PATH_ESTIMATORS = [KernelGradientDescent, KernelSignGradient, KernelCoordinateDescent]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "estimator",
    [
        KernelGradientDescent(),
        KernelGradientDescent(momentum=0.5, nesterov=True, early_stopping=False, max_iter=50),
        KernelSignGradient(max_iter=3000),
        KernelCoordinateDescent(max_iter=3000),
        PenalizedKernelRegressor(alpha=0.1, max_iter=100),
        PenalizedKernelRegressor(alpha=0.1, penalty="l1", max_iter=100),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_check_estimator(estimator):
    check_estimator(estimator)


def _data(n=80, seed=0, outliers=False):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    f = np.sin(X[:, 0])
    noise = 0.1 * (rng.standard_cauchy(n) if outliers else rng.randn(n))
    return X, f + noise, f


@pytest.mark.parametrize("cls", PATH_ESTIMATORS)
def test_no_early_stopping_is_the_path_after_max_iter(cls):
    X, y, _ = _data()
    model = cls(sigma=1.0, early_stopping=False, max_iter=150, learning_rate=0.01,
                fit_intercept=False).fit(X, y)
    fn = {KernelGradientDescent: gradient_descent_path, KernelSignGradient: sign_gradient_path,
          KernelCoordinateDescent: coordinate_descent_path}[cls]
    K = Gaussian(1.0)(torch.tensor(X))
    ref = fn(K, torch.tensor(y), learning_rate=0.01, max_iter=150)
    torch.testing.assert_close(model.dual_coef_, ref.alpha, rtol=1e-9, atol=1e-11)
    assert model.n_iter_ == 150 and model.t_ == pytest.approx(1.5)
    assert model.validation_losses_ is None
    torch.testing.assert_close(torch.as_tensor(model.predict(X)), K @ ref.alpha,
                               rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("cls", PATH_ESTIMATORS)
def test_early_stopping_refits_for_the_best_iteration(cls):
    X, y, _ = _data(n=100, seed=1)
    model = cls(sigma=1.0, random_state=0, n_iter_no_change=30, max_iter=5000).fit(X, y)
    losses = model.validation_losses_
    assert model.n_iter_ == int(np.argmin(losses))
    assert len(losses) <= model.n_iter_ + 31
    ref = cls(sigma=1.0, early_stopping=False, max_iter=model.n_iter_,
              learning_rate=model.learning_rate_).fit(X, y)
    torch.testing.assert_close(model.dual_coef_, ref.dual_coef_)
    assert model.score(X, y) > 0.8


def test_gradient_descent_flow_limit_matches_gradient_flow_estimator():
    X, y, _ = _data()
    kgd = KernelGradientDescent(sigma=1.0, learning_rate=0.002, max_iter=1000,
                                early_stopping=False).fit(X, y)
    kgf = KernelGradientFlow(t=2.0, sigma=1.0).fit(X, y)
    diff = np.abs(kgd.predict(X) - kgf.predict(X)).max()
    assert diff < 0.01 * np.abs(y).max()


def test_penalized_l2_equals_kernel_ridge():
    X, y, _ = _data()
    pen = PenalizedKernelRegressor(alpha=0.3, penalty="l2", sigma=1.0).fit(X, y)
    krr = KernelRidge(alpha=0.3, sigma=1.0).fit(X, y)
    assert pen.converged_
    np.testing.assert_allclose(pen.predict(X), krr.predict(X), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("penalty", ["linf", "l1"])
def test_penalized_matches_solver_and_reports_support(penalty):
    X, y, _ = _data(n=40)
    # A narrow bandwidth keeps K well conditioned, so the l-infinity problem is well posed.
    model = PenalizedKernelRegressor(alpha=0.2, penalty=penalty, sigma=0.1,
                                     fit_intercept=False).fit(X, y)
    assert model.converged_
    K = Gaussian(0.1)(torch.tensor(X))
    ref = proximal_gradient(K, torch.tensor(y), 0.2, penalty=penalty)
    torch.testing.assert_close(model.dual_coef_, ref.alpha)
    np.testing.assert_array_equal(model.support_, np.flatnonzero(ref.alpha.numpy()))
    big = PenalizedKernelRegressor(alpha=float(np.abs(y).sum() if penalty == "linf"
                                               else np.abs(y).max()),
                                   penalty=penalty, sigma=0.1, fit_intercept=False).fit(X, y)
    assert len(big.support_) == 0 and np.all(big.predict(X) == 0)


def test_sign_descent_is_robust_to_outliers():
    # Allerbo Sec. 6 / Fig. 3: with Cauchy noise, sign descent tracks the truth, GD chases outliers.
    # Both monitor the absolute validation error, so that an outlier among the held-out rows
    # cannot end either run at its first steps (see test_validation_loss.py).
    X, y, f = _data(n=100, seed=47, outliers=True)
    ksgd = KernelSignGradient(sigma=1.0, random_state=0, validation_loss="absolute").fit(X, y)
    kgd = KernelGradientDescent(sigma=1.0, random_state=0, validation_loss="absolute").fit(X, y)
    err_sign = np.median(np.abs(ksgd.predict(X) - f))
    err_gd = np.median(np.abs(kgd.predict(X) - f))
    assert err_sign < 0.5 * err_gd


def test_coordinate_descent_is_sparse_and_matrix_free_matches_dense():
    rng = np.random.RandomState(35)
    X = rng.uniform(-10, 10, size=(600, 1))
    X[0] = 0.0
    y = np.exp(-5 * X[:, 0] ** 2) + 0.1 * rng.randn(600)
    dense = KernelCoordinateDescent(sigma=0.5, random_state=0).fit(X, y)
    tiny = Options(memory_budget=400_000)  # K (2.9 MB) does not fit: columns on demand
    free = KernelCoordinateDescent(sigma=0.5, random_state=0, options=tiny).fit(X, y)
    torch.testing.assert_close(free.dual_coef_, dense.dual_coef_, rtol=0, atol=1e-12)
    assert len(dense.support_) < 60
    np.testing.assert_array_equal(dense.support_, np.flatnonzero(dense.dual_coef_.numpy()))


@pytest.mark.slow
def test_coordinate_descent_matrix_free_n_1e5():
    rng = np.random.RandomState(0)
    X = rng.uniform(-10, 10, size=(100_000, 2))
    y = np.exp(-np.sum(X**2, 1)) + 0.05 * rng.randn(100_000)
    model = KernelCoordinateDescent(sigma=0.5, max_iter=300, n_iter_no_change=50,
                                    random_state=0).fit(X, y)
    assert 0 < len(model.support_) <= 300
    assert np.isfinite(model.predict(X[:100])).all()


@pytest.mark.parametrize("cls", PATH_ESTIMATORS + [PenalizedKernelRegressor])
def test_input_kinds_and_multi_output(cls):
    X, y, _ = _data(n=50)
    Y = np.c_[y, -y]
    kw = {"sigma": 1.0}
    if cls is not PenalizedKernelRegressor:
        kw.update(random_state=0, max_iter=300)
    else:
        kw.update(sigma=0.1, alpha=0.5)
    np_model = cls(**kw).fit(X, Y)
    pred = np_model.predict(X)
    assert isinstance(pred, np.ndarray) and pred.shape == (50, 2)
    np.testing.assert_allclose(pred[:, 1], -pred[:, 0], atol=1e-8)  # targets solved apart
    t_model = cls(**kw).fit(torch.tensor(X), torch.tensor(y))
    tp = t_model.predict(torch.tensor(X))
    assert isinstance(tp, torch.Tensor) and tp.shape == (50,)
    df = pd.DataFrame(X, columns=["a"])
    pd_model = cls(**kw).fit(df, y)
    np.testing.assert_allclose(pd_model.predict(df), np_model.predict(X)[:, 0], atol=1e-8)
    assert list(pd_model.feature_names_in_) == ["a"]


@pytest.mark.parametrize("cls", PATH_ESTIMATORS + [PenalizedKernelRegressor])
def test_bad_input(cls):
    X, y, _ = _data(n=20)
    Xn = X.copy()
    Xn[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        cls().fit(Xn, y)
    with pytest.raises(ValueError, match="inconsistent"):
        cls().fit(X, y[:-1])
    with pytest.raises(ValueError):
        cls(learning_rate=-0.1).fit(X, y)
    with pytest.raises(ValueError):
        cls(max_iter=-1).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        cls(sigma=0.1, max_iter=50).fit(X, y).predict(np.c_[X, X])
    with pytest.raises(ValueError, match="NaN"):
        cls().fit(torch.tensor(X), torch.tensor(np.r_[np.nan, y[1:]]))
    if cls is not PenalizedKernelRegressor:
        with pytest.raises(ValueError):
            cls(validation_fraction=1.5).fit(X, y)
    else:
        with pytest.raises(ValueError):
            cls(penalty="l3").fit(X, y)


def test_divergence_is_reported_not_returned_as_nan():
    X, y, _ = _data(n=60)
    with pytest.raises(DivergenceError, match="learning_rate"):
        KernelGradientDescent(sigma=1.0, learning_rate=5.0).fit(X, y)
    with pytest.raises(DivergenceError):
        KernelGradientDescent(sigma=1.0, learning_rate=0.5, momentum=0.9, nesterov=True,
                              early_stopping=False).fit(X, y)
    with pytest.raises(DivergenceError):
        PenalizedKernelRegressor(alpha=0.1, sigma=1.0, learning_rate=5.0).fit(X, y)
