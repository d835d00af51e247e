"""The default PenalizedKernelRegressorCV does a bounded amount of work."""

import warnings

import numpy as np
import pytest

import kernelflow.solvers.grid_cv as grid_cv
from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV


def test_default_grid_work_is_bounded(monkeypatch):
    # the default grid: one FISTA run of at most max_iter iterations per bandwidth, all folds
    # and penalties of that bandwidth advancing as one batch (the earlier defaults allowed
    # 30 x 10000 iterations)
    calls = []
    fista = grid_cv.fista

    def counting(*args, **kwargs):
        out = fista(*args, **kwargs)
        calls.append((kwargs["max_iter"], int(out[2].max()), out[0].shape[0]))
        return out

    monkeypatch.setattr(grid_cv, "fista", counting)
    rng = np.random.RandomState(0)
    X = rng.randn(30, 3)
    y = X[:, 0] + 0.1 * rng.randn(30)
    model = PenalizedKernelRegressorCV()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
    assert len(calls) == model.sigmas_.size == 10
    assert all(cap == 100 and its <= cap and batch == 5 * 10 for cap, its, batch in calls)
    assert model.n_iter_ <= 100 and model.cv_mse_.shape == (10, 10)
    assert np.isfinite(model.cv_mse_).all()
    assert model.score(X, y) > 0.8


@pytest.mark.slow
def test_check_estimator_with_defaults():
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(PenalizedKernelRegressorCV())
