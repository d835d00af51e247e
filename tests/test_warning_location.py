"""Convergence warnings point at the user's line, however many stages lie between."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from kernelflow.estimators import NystromKernelRidge
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor

X = np.random.RandomState(0).randn(300, 3)
y = X[:, 0]


@pytest.mark.parametrize("model", [
    NystromKernelRidge(50, alpha=1e-9, solver="cg", max_iter=2, sigma=0.3),
    NystromRobustRegressor(50, max_iter=10, sigma=0.3),
])
def test_convergence_warning_names_the_callers_file(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    hits = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert hits, "the capped fit should warn"
    assert all(w.filename == __file__ for w in hits), [w.filename for w in hits]
