"""The river path (``learn_one``/``predict_one`` on dict rows) is ``fit`` one row at a time.

Same arithmetic, so the same numbers; no scikit-learn validation per row, so no feature-name
warning; and the BLAS thread limit it sets for a round is restored afterwards.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kernelflow.online import FOGD, KernelAWV, PKAWVNystrom, PKAWVTaylor, ProsNKONS, _updates

LEARNERS = [
    lambda: KernelAWV(),
    lambda: PKAWVTaylor(degree=3, awv=False),
    lambda: PKAWVNystrom(random_state=0),
    lambda: FOGD(50, n_rounds=60, random_state=0),
    lambda: ProsNKONS(random_state=0),
]


def _stream(n=60, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)


@pytest.mark.parametrize("make", LEARNERS, ids=lambda m: type(m()).__name__)
def test_learn_one_gives_fit_predictions_without_warnings(make):
    X, y = _stream()
    names = ["a", "b", "c"]
    by_fit = make().progressive_predict(X, y)
    fitted = make().fit(X, y)
    learner = make()
    by_rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (feature names included) fails the test
        for row, target in zip(X, y):
            x = dict(zip(names, row))
            by_rows.append(learner.predict_one(x) if by_rows else 0.0)
            learner.learn_one(x, target)
        after = [learner.predict_one(dict(zip(names, row))) for row in X[:10]]
    np.testing.assert_allclose(after, fitted.predict(X[:10]), rtol=1e-12, atol=1e-12)
    if not isinstance(learner, (PKAWVNystrom, ProsNKONS)):
        # no input enters a dictionary before its own prediction: predict_one(x_t) is the
        # round's forecast
        np.testing.assert_allclose(by_rows[1:], by_fit[1:], rtol=1e-12, atol=1e-12)
    assert learner.n_rounds_ == len(y)


def test_learn_one_restores_the_blas_thread_count():
    X, y = _stream(n=5)
    learner = PKAWVTaylor(degree=2)
    learner.learn_one({"a": 0.1, "b": 0.2, "c": 0.3}, 0.5)
    libs = _updates._BLAS_LIBS.lib_controllers if _updates._BLAS_LIBS else []
    before = [lib.get_num_threads() for lib in libs]
    for row, target in zip(X, y):
        learner.learn_one(dict(zip("abc", row)), target)
        learner.predict_one(dict(zip("abc", row)))
    assert [lib.get_num_threads() for lib in libs] == before


def test_learn_one_refuses_bad_rows_cheaply():
    learner = KernelAWV()
    learner.learn_one({"a": 1.0, "b": 2.0}, 0.0)
    for bad in ({"a": np.nan, "b": 1.0}, {"a": 1.0}, {"a": 1.0, "b": "x"},
                {"a": 1.0, "b": 1.0, "c": 1.0}):
        with pytest.raises(ValueError):
            learner.learn_one(bad, 1.0)
    with pytest.raises(ValueError, match="finite"):
        learner.learn_one({"a": 1.0, "b": 1.0}, np.inf)
    assert learner.n_rounds_ == 1
    # huge but finite values whose squares overflow are refused by name, state unchanged
    with pytest.raises(ValueError, match="magnitude"):
        learner.learn_one({"a": 1e308, "b": 1e308}, 0.0)
    assert learner.n_rounds_ == 1
