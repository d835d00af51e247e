"""Nyström estimators: a fit never changes a parameter; the held-out rows follow the one rule."""

import copy

import numpy as np
import pytest
import torch
from _helpers import regression_data

from kernelflow.estimators import Nystroem
from kernelflow.estimators.kernel_ridge_classifier import NystromKernelRidgeClassifier
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.kernels import Gaussian, Laplace
from kernelflow.sources import ChunkSource
from kernelflow.utils.holdout import holdout_indices, holdout_stream_mask


def _frozen(params):
    """A comparable image of get_params(): RandomState by state, kernels by their parameters."""
    out = {}
    for k, v in params.items():
        if isinstance(v, np.random.RandomState):
            st = v.get_state()
            out[k] = ("RandomState", st[0], st[1].tolist(), st[2], st[3], st[4])
        elif hasattr(v, "get_params"):
            out[k] = (type(v).__name__, repr(v.get_params(deep=False)))
        elif isinstance(v, np.ndarray | torch.Tensor):
            out[k] = np.asarray(v).tolist()
        else:
            out[k] = repr(v)
    return out


def _data(n=300, seed=0):
    return regression_data(n, 2, lambda X: np.sin(X[:, 0]), bounds=(-2, 2), seed=seed)


@pytest.mark.parametrize("make", [
    lambda rs: NystromKernelRidge(30, kernel=Gaussian(0.8), random_state=rs),
    lambda rs: NystromKernelRidge(30, kernel="rbf", sigma="ard", random_state=rs,
                                  early_stopping=True, max_iter=20),
    lambda rs: NystromKernelRidge(30, kernel=Laplace(1.0), landmarks="rpcholesky",
                                  random_state=rs, warm_start=True),
    lambda rs: NystromKernelRidgeClassifier(20, kernel=Gaussian(1.0), random_state=rs),
    lambda rs: Nystroem(Gaussian(1.0), n_components=20, random_state=rs),
], ids=["ridge", "ridge-early-stopping", "ridge-warm-start", "classifier", "nystroem"])
@pytest.mark.parametrize("random_state", ["instance", 3])
def test_fit_does_not_change_parameters(make, random_state):
    X, y = _data()
    rs = np.random.RandomState(0) if random_state == "instance" else random_state
    est = make(rs)
    before = _frozen(est.get_params(deep=True))
    kernel_before = copy.deepcopy(est.kernel)
    target = (y > 0) if isinstance(est, NystromKernelRidgeClassifier) else y
    est.fit(X, target)
    est.fit(X, target)  # a second (possibly warm) fit too
    assert _frozen(est.get_params(deep=True)) == before
    if not isinstance(est.kernel, str):
        assert repr(est.kernel) == repr(kernel_before)
    if random_state == "instance":  # the same parameters give the same fit
        first = est.predict(X[:10]) if hasattr(est, "predict") else est.transform(X[:10])
        again = make(rs).fit(X, target)
        second = again.predict(X[:10]) if hasattr(again, "predict") else again.transform(X[:10])
        np.testing.assert_allclose(first, second)


@pytest.mark.parametrize("fraction", [0.1, 0.25])
def test_validation_rows_follow_the_holdout_rule(fraction):
    X, y = _data(n=200)
    sw = np.random.RandomState(1).randint(0, 3, size=200).astype(float)
    est = NystromKernelRidge(30, sigma=1.0, early_stopping=True, validation_fraction=fraction,
                             random_state=7, max_iter=15).fit(X, y, sample_weight=sw)
    _, expected = holdout_indices(torch.from_numpy(X), fraction, 7, y=torch.from_numpy(y),
                                  sample_weight=torch.from_numpy(sw))
    np.testing.assert_array_equal(est.validation_indices_, expected)
    assert est.validation_indices_.dtype == np.int64
    assert np.all(np.diff(est.validation_indices_) > 0)
    assert est.best_iteration_ == int(np.argmin(est.validation_scores_))
    # without early stopping no rows are held out, and a refit drops the attribute
    est.set_params(early_stopping=False).fit(X, y, sample_weight=sw)
    assert not hasattr(est, "validation_indices_")


def test_streamed_validation_rows_follow_the_stream_rule():
    X, y = _data(n=400, seed=2)
    chunks = [(X[i:i + 70], y[i:i + 70]) for i in range(0, 400, 70)]
    est = NystromKernelRidge(30, sigma=1.0, early_stopping=True, validation_fraction=0.2,
                             random_state=5, max_iter=15).fit(ChunkSource(chunks))
    mask = holdout_stream_mask(torch.from_numpy(X), 0.2, 5)
    np.testing.assert_array_equal(est.validation_indices_, np.flatnonzero(mask))
    assert 40 < est.validation_indices_.size < 120
