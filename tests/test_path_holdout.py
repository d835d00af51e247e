"""One holdout rule: the path estimators hold out the same rows for the same settings."""

import numpy as np
import pytest
import torch
from _helpers import regression_data

from kernelflow.estimators import (
    KernelCoordinateDescent,
    KernelGradientDescent,
    KernelHuberGradientDescent,
    KernelSignGradient,
)
from kernelflow.solvers.hyperparameters import _objective
from kernelflow.utils.holdout import holdout_indices

ESTIMATORS = [KernelGradientDescent, KernelSignGradient, KernelCoordinateDescent,
              KernelHuberGradientDescent]


def _data(n=60, seed=0):
    return regression_data(n, 2, lambda X: np.sin(X[:, 0]), bounds=(-3, 3), seed=seed)


@pytest.mark.parametrize("random_state", [0, 7])
def test_same_rows_held_out_everywhere(random_state):
    X, y = _data()
    _, want = holdout_indices(torch.tensor(X), 0.1, random_state)
    assert want.size == 6  # ceil(0.1 * 60) distinct rows
    for cls in ESTIMATORS:
        est = cls(sigma=1.0, validation_fraction=0.1, random_state=random_state,
                  max_iter=50).fit(X, y)
        assert est.validation_indices_.dtype == np.int64
        np.testing.assert_array_equal(est.validation_indices_, want, err_msg=cls.__name__)


def test_positions_refer_to_the_rows_passed_with_zero_weights_dropped():
    X, y = _data()
    sw = np.ones(60)
    sw[[3, 10, 11]] = 0.0
    keep = np.flatnonzero(sw > 0)
    _, sub = holdout_indices(torch.tensor(X[keep]), 0.1, 0)
    for cls in ESTIMATORS:
        est = cls(sigma=1.0, random_state=0, max_iter=50).fit(X, y, sample_weight=sw)
        np.testing.assert_array_equal(est.validation_indices_, keep[sub])
        assert not np.isin([3, 10, 11], est.validation_indices_).any()


def test_row_order_does_not_change_the_held_out_rows():
    X, y = _data()
    perm = np.random.RandomState(1).permutation(60)
    a = KernelSignGradient(sigma=1.0, random_state=3, max_iter=50).fit(X, y)
    b = KernelSignGradient(sigma=1.0, random_state=3, max_iter=50).fit(X[perm], y[perm])
    np.testing.assert_array_equal(np.sort(perm[b.validation_indices_]), a.validation_indices_)


def test_no_early_stopping_no_indices():
    X, y = _data()
    est = KernelGradientDescent(sigma=1.0, early_stopping=False, max_iter=5).fit(X, y)
    assert est.validation_indices_ is None


def test_hyperparameter_validation_split_is_the_holdout_rule():
    X, y = _data()
    Xt, Yt = torch.tensor(X), torch.tensor(y).reshape(-1, 1)
    tr, va = holdout_indices(Xt, 0.1, 5)
    centers = Xt[:8]
    objective = _objective("validation", Xt, Yt, centers, 0.1, 5)
    # the closure scores the Nystrom model fitted on tr against va: rebuild it by hand
    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.hyperparameters import nystrom_validation_error
    k = Gaussian(1.0)
    mean = Yt[tr].mean(0)
    want = nystrom_validation_error(k(Xt[tr], centers), k(centers), k(Xt[va], centers),
                                    Yt[tr] - mean, Yt[va] - mean, 0.1)
    assert float(objective(k, 0.1)) == pytest.approx(float(want), rel=1e-12)
