"""Extreme but finite inputs and parameters: the estimator works (finite output) or refuses
with a ValueError; never NaN predictions, never OverflowError, ZeroDivisionError or a raw
linear-algebra error."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

from kernelflow import estimators as E
from kernelflow import online as O
from kernelflow.linalg import cholesky, symmetric_eigh
from kernelflow.solvers.paths import DivergenceError
from kernelflow.utils._finite import check_bandwidth, check_magnitude, magnitude_limit

SMALL = {
    "KernelGradientDescent": dict(max_iter=50),
    "KernelSignGradient": dict(max_iter=50),
    "KernelCoordinateDescent": dict(max_iter=50),
    "PenalizedKernelRegressor": dict(max_iter=50),
    "KernelGradientDescentCV": dict(sigmas=2, cv=2, max_iter=30, n_iter_no_change=5),
    "KernelSignGradientCV": dict(sigmas=2, cv=2, max_iter=30, n_iter_no_change=5),
    "KernelCoordinateDescentCV": dict(sigmas=2, cv=2, max_iter=30, n_iter_no_change=5),
    "PenalizedKernelRegressorCV": dict(alphas=2, sigmas=2, cv=2, max_iter=30),
    "NystromKernelRidge": dict(n_components=10, random_state=0),
    "NystromRobustRegressor": dict(n_components=10, max_iter=20, random_state=0),
    "Nystroem": dict(n_components=10, random_state=0),
    "DoublyStochasticRegressor": dict(max_iter=2, random_state=0),
    "DoublyStochasticClassifier": dict(max_iter=2, random_state=0),
    "DoublyStochasticNoveltyDetector": dict(max_iter=2, random_state=0),
    "KernelHuberRegressor": dict(max_iter=20),
    "KernelTukeyRegressor": dict(max_iter=20),
    "KernelQuantileRegressor": dict(max_iter=20),
    "PKAWVNystrom": dict(random_state=0),
    "ProsNKONS": dict(random_state=0),
    "FOGD": dict(n_components=50),
}
NAMES = list(E.__all__) + ["KernelAWV", "PKAWVTaylor", "PKAWVNystrom", "FOGD", "ProsNKONS"]


def make(name, **params):
    cls = getattr(E, name, None) or getattr(O, name)
    sig = inspect.signature(cls).parameters
    if any(k not in sig for k in params):
        pytest.skip(f"{name} has no parameter {sorted(set(params) - set(sig))}")
    return cls(**{**SMALL.get(name, {}), **params})


def data(scale_X=1.0, scale_y=1.0, n=30, d=3):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1]
    return X * scale_X, y * scale_y


def outputs(est, X):
    if hasattr(est, "predict"):
        yield np.asarray(est.predict(X), dtype=float)
    if hasattr(est, "decision_function"):
        yield np.asarray(est.decision_function(X), dtype=float)
    if hasattr(est, "transform") and not hasattr(est, "predict"):
        yield np.asarray(est.transform(X), dtype=float)


def works_or_refuses(name, X, y, X_pred=None, **params):
    est = make(name, **params)
    if "Classifier" in name:
        y = (y > np.median(y)).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est.fit(X, y)
            outs = list(outputs(est, X if X_pred is None else X_pred))
        except ValueError as exc:  # includes DivergenceError
            assert str(exc), "a refusal must say what is wrong"
            return "refused"
    for out in outs:
        assert np.all(np.isfinite(out)), f"{name} returned non-finite values"
    return "works"


INPUTS = {
    "X*1e300": (1e300, 1.0),
    "X*1e160": (1e160, 1.0),
    "X*1e100": (1e100, 1.0),
    "X*1e-300": (1e-300, 1.0),
    "y*1e300": (1.0, 1e300),
    "y*1e160": (1.0, 1e160),
    "y*1e-300": (1.0, 1e-300),
}


@pytest.mark.parametrize("case", list(INPUTS))
@pytest.mark.parametrize("name", NAMES)
def test_extreme_inputs_work_or_refuse(name, case):
    sx, sy = INPUTS[case]
    X, y = data(sx, sy)
    works_or_refuses(name, X, y)


PARAMS = {
    "sigma=1e300": {"sigma": 1e300},
    "sigma=1e-300": {"sigma": 1e-300},
    "gamma=1e300": {"gamma": 1e300},
    "alpha=1e300": {"alpha": 1e300},
    "alpha=1e-300": {"alpha": 1e-300},
    "learning_rate=1e300": {"learning_rate": 1e300},
    "eta=1e300": {"eta": 1e300},
    "eta0=1e300": {"eta0": 1e300},
    "epsilon=1e300": {"epsilon": 1e300},
}


def _has(name, param):
    cls = getattr(E, name, None) or getattr(O, name)
    return param in inspect.signature(cls).parameters


@pytest.mark.parametrize("name,case", [(n, c) for n in NAMES for c in PARAMS
                                       if _has(n, next(iter(PARAMS[c])))])
def test_extreme_parameters_work_or_refuse(name, case):
    X, y = data()
    works_or_refuses(name, X, y, **PARAMS[case])


@pytest.mark.parametrize("name", NAMES)
def test_predicting_on_extreme_rows_works_or_refuses(name):
    X, y = data()
    works_or_refuses(name, X, y, X_pred=X * 1e300)


# ---- the previously failing ones fail with a named cause ---------------------------------------
@pytest.mark.parametrize("name", ["KernelAWV", "PKAWVNystrom", "ProsNKONS", "KernelRidge"])
@pytest.mark.parametrize("sigma", [1e300, 1e-300])
def test_out_of_range_sigma_is_named(name, sigma):
    X, y = data()
    with pytest.raises(ValueError, match="sigma=.* is out of range"):
        make(name, sigma=sigma).fit(X, y)


def test_online_overflow_is_a_divergence_error_and_leaves_the_learner():
    X, y = data()
    est = O.FOGD(n_components=50).fit(X, y)
    before = est.predict(X)
    with pytest.raises(DivergenceError, match="non-finite prediction at round"):
        est.set_params(learning_rate=1e300).partial_fit(X, y)
    np.testing.assert_array_equal(est.predict(X), before)


def test_learn_one_refuses_overflowing_row():
    est = O.KernelAWV()
    est.learn_one({"a": 0.1, "b": 0.2}, 1.0)
    with pytest.raises(ValueError, match="^x has values up to"):
        est.learn_one({"a": 1e300, "b": 0.0}, 1.0)
    assert est.n_rounds_ == 1


def test_divergence_error_is_a_value_error():
    assert issubclass(DivergenceError, ValueError)
    assert issubclass(DivergenceError, FloatingPointError)  # kept for existing handlers
    X, y = data()
    with pytest.raises(ValueError, match="learning_rate"):
        E.KernelGradientDescent(learning_rate=1e300).fit(X, y)


def test_linalg_failures_are_value_errors():
    with pytest.raises(ValueError, match="not positive definite"):
        cholesky(-torch.eye(3, dtype=torch.float64), max_tries=2)
    with pytest.raises(torch.linalg.LinAlgError):  # still caught by existing handlers
        cholesky(-torch.eye(3, dtype=torch.float64), max_tries=2)
    with pytest.raises(ValueError, match="NaN or inf"):
        symmetric_eigh(torch.full((2, 2), float("inf"), dtype=torch.float64))


def test_magnitude_limits_are_tight():
    d = 4
    lim = magnitude_limit(np.float64, d)
    X = np.zeros((2, d))
    X[0, 0] = 0.99 * lim
    check_magnitude("X", X)  # 4 d max² stays finite: accepted
    assert np.isfinite(4 * d * X[0, 0] ** 2)
    X[0, 0] = 1.01 * lim
    with pytest.raises(ValueError, match="float64"):
        check_magnitude("X", X)
    Xf = torch.full((2, d), 1e19, dtype=torch.float32)  # squares overflow float32
    with pytest.raises(ValueError, match="float32"):
        check_magnitude("X", Xf)


def test_check_bandwidth():
    from kernelflow import Gaussian

    check_bandwidth(Gaussian(sigma=1e100))
    for s in (1e200, 1e-200):
        with pytest.raises(ValueError, match="sigma"):
            check_bandwidth(Gaussian(sigma=s))
