"""Warnings raised during ``fit`` point at the user's line, not inside the package."""

import warnings

import numpy as np
import pytest

from kernelflow import (
    KernelHuberRegressor,
    KernelQuantileRegressorAPG,
    KernelRidge,
    Nystroem,
    NystromKernelLogisticRegression,
    PenalizedKernelRegressor,
)


def _data(n=60, d=3, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    return X, np.sin(X[:, 0]) + 0.1 * rng.randn(n)


def _fit_and_catch(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()  # the line every warning must name
    assert caught, "no warning raised"
    return caught


CASES = {
    "huber": lambda X, y: KernelHuberRegressor(max_iter=1).fit(X, y),
    "quantile_apg": lambda X, y: KernelQuantileRegressorAPG(max_iter=1, alpha=1e-6).fit(X, y),
    "penalized": lambda X, y: PenalizedKernelRegressor(max_iter=1, alpha=1e-3).fit(X, y),
    "nystroem": lambda X, y: Nystroem(n_components=100).fit(X),
    "logistic": lambda X, y: NystromKernelLogisticRegression(n_components=20, max_iter=1,
                                                             alpha=1e-8).fit(X, y > 0),
    "precomputed": lambda X, y: KernelRidge(kernel="precomputed", alpha=1e-12).fit(
        -np.eye(len(y)), y),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fit_warning_names_the_callers_file(name):
    X, y = _data()
    caught = _fit_and_catch(lambda: CASES[name](X, y))
    files = {w.filename for w in caught}
    assert files == {__file__}, (name, files, [str(w.message) for w in caught])
