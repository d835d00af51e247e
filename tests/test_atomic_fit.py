"""Interrupted fits leave the estimator exactly as before the call.

For one estimator of every family: fit, record predictions and the whole ``__dict__``, then refit
on different data (different number of features where the call allows it) and interrupt the
refit. The interruption is a genuine SIGINT sent to the process at the k-th call of a kernelflow
function during the refit (counted with ``sys.setprofile``; k at several fractions of the count
of a dry run on a copy, the last one just before the refit would return), so it is
deterministic and lands inside the fit's own code. Afterwards the predictions must be
bit-identical and the ``__dict__`` equal, key by key and value by value; an unfitted estimator
must still be unfitted.
"""

from __future__ import annotations

import copy
import os
import signal
import sys

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

import kernelflow
from kernelflow import estimators as E
from kernelflow import online as O
from kernelflow.solvers.paths import DivergenceError
from kernelflow.utils._atomic import AtomicFitMixin, atomic_fit

PKG = os.path.dirname(kernelflow.__file__)
ATOMIC_FILE = os.path.join(PKG, "utils", "_atomic.py")


# ---- helpers ------------------------------------------------------------------------------------
def state_equal(a, b, depth=0) -> bool:
    """Deep equality of fitted state: tensors and arrays element-wise (NaN equal to NaN)."""
    if depth > 12:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.shape == b.shape and a.dtype == b.dtype
                and bool(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))))
    if isinstance(a, np.ndarray):
        if a.dtype == object:
            return a.shape == b.shape and all(state_equal(u, v, depth + 1)
                                              for u, v in zip(a.ravel(), b.ravel()))
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(state_equal(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(state_equal(u, v, depth + 1) for u, v in zip(a, b))
    if isinstance(a, float) and np.isnan(a):
        return bool(np.isnan(b))
    if isinstance(a, np.random.Generator | np.random.RandomState):
        return state_equal(a.bit_generator.state if hasattr(a, "bit_generator") else
                           a.get_state(), b.bit_generator.state if hasattr(b, "bit_generator")
                           else b.get_state(), depth + 1)
    if isinstance(a, torch.Generator):
        return bool(torch.equal(a.get_state(), b.get_state()))
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return state_equal(vars(a), vars(b), depth + 1)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects without equality: compare by identity
        return a is b


def assert_same_state(before: dict, est) -> None:
    after = est.__dict__
    assert sorted(before) == sorted(after)
    bad = [k for k in before if not state_equal(before[k], after[k])]
    assert not bad, f"attributes changed by the interrupted call: {bad}"


class _Fire(Exception):
    pass


class _Injector:
    """Count calls of kernelflow functions; at the k-th, interrupt (SIGINT or an exception)."""

    def __init__(self, k: int | None, how: str = "sigint"):
        self.k, self.how, self.n = k, how, 0

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(PKG) or f == ATOMIC_FILE:
            return
        self.n += 1
        if self.k is not None and self.n == self.k:
            self.k = None
            if self.how == "sigint":
                signal.raise_signal(signal.SIGINT)  # genuine signal, handled in this thread
            else:
                raise _Fire("injected failure")

    def run(self, fn):
        old = sys.getprofile()
        sys.setprofile(self)
        try:
            return fn()
        finally:
            sys.setprofile(old)


@pytest.fixture(autouse=True)
def _default_sigint():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def data(n, d, seed, classify=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, -1] + 0.1 * rng.normal(size=n)
    return X, (y > 0).astype(int) if classify else y


def outputs(est, X):
    if hasattr(est, "predict"):
        out = est.predict(X)
    else:
        out = est.transform(X)
    if hasattr(est, "decision_function"):
        out = (out, est.decision_function(X))
    return out


# estimator factory, classification?, refit may change n_features?
CASES = {
    # exact
    "KernelRidge": (lambda: E.KernelRidge(alpha=0.1), False, True),
    "KernelGradientFlow": (lambda: E.KernelGradientFlow(), False, True),
    "KernelRidgeCV": (lambda: E.KernelRidgeCV(), False, True),
    # paths and CV
    "KernelGradientDescent": (lambda: E.KernelGradientDescent(max_iter=200), False, True),
    "KernelSignGradient": (lambda: E.KernelSignGradient(max_iter=200), False, True),
    "KernelCoordinateDescent": (lambda: E.KernelCoordinateDescent(max_iter=200), False, True),
    "PenalizedKernelRegressor": (lambda: E.PenalizedKernelRegressor(max_iter=100), False, True),
    "KernelGradientDescentCV": (
        lambda: E.KernelGradientDescentCV(sigmas=3, cv=3, max_iter=100, n_iter_no_change=10,
                                          random_state=0), False, True),
    "PenalizedKernelRegressorCV": (
        lambda: E.PenalizedKernelRegressorCV(alphas=2, sigmas=2, cv=2, max_iter=50,
                                             random_state=0), False, True),
    # Nyström
    "NystromKernelRidge": (lambda: E.NystromKernelRidge(n_components=10, random_state=0),
                           False, True),
    "NystromRobustRegressor": (lambda: E.NystromRobustRegressor(n_components=10, max_iter=20,
                                                                random_state=0), False, True),
    "Nystroem": (lambda: E.Nystroem(n_components=10, random_state=0), False, True),
    # doubly stochastic
    "DoublyStochasticRegressor": (lambda: E.DoublyStochasticRegressor(max_iter=3, random_state=0),
                                  False, True),
    "DoublyStochasticClassifier": (
        lambda: E.DoublyStochasticClassifier(max_iter=3, random_state=0), True, True),
    "DoublyStochasticNoveltyDetector": (
        lambda: E.DoublyStochasticNoveltyDetector(max_iter=3, random_state=0), False, True),
    # online
    "KernelAWV": (lambda: O.KernelAWV(), False, True),
    "PKAWVTaylor": (lambda: O.PKAWVTaylor(), False, True),
    "PKAWVNystrom": (lambda: O.PKAWVNystrom(random_state=0), False, True),
    "FOGD": (lambda: O.FOGD(n_components=50), False, True),
    "ProsNKONS": (lambda: O.ProsNKONS(random_state=0), False, True),
    # M-estimators
    "KernelHuberRegressor": (lambda: E.KernelHuberRegressor(max_iter=10), False, True),
    "KernelTukeyRegressor": (lambda: E.KernelTukeyRegressor(max_iter=10), False, True),
    "KernelQuantileRegressor": (lambda: E.KernelQuantileRegressor(max_iter=10), False, True),
}

FRACTIONS = (0.3, 0.7, 0.97)  # the last one: near the end of the refit, before it returns


def _interrupt_points(est, call):
    """Call counts at FRACTIONS of the (smallest) count of two dry runs of ``call`` on copies.

    Some solvers choose their route at run time, so counts can vary a little between runs.
    """
    counts = []
    for _ in range(2):
        dry = copy.deepcopy(est)
        inj = _Injector(None)
        inj.run(lambda d=dry: call(d))
        counts.append(inj.n)
    n = min(counts)
    assert n > 0
    return sorted({max(1, min(n, int(round(f * n)))) for f in FRACTIONS})


def _check_interrupted(est, call, X_probe, how="sigint"):
    fitted = hasattr(est, "n_features_in_") or hasattr(est, "n_rounds_")
    before_out = outputs(est, X_probe) if fitted else None
    exc = KeyboardInterrupt if how == "sigint" else _Fire
    for k in _interrupt_points(est, call):
        before = copy.deepcopy(est.__dict__)
        for _ in range(6):  # the count was not reached (shorter route): interrupt earlier
            try:
                _Injector(k, how).run(lambda: call(est))
            except exc:
                break
            est.__dict__.clear()
            est.__dict__.update(copy.deepcopy(before))
            k = max(1, int(k * 0.8))
        else:
            pytest.fail("the interruption never landed inside the call")
        assert_same_state(before, est)
        if fitted:
            after_out = outputs(est, X_probe)
            if isinstance(before_out, tuple):
                for u, v in zip(before_out, after_out):
                    np.testing.assert_array_equal(u, v)
            else:
                np.testing.assert_array_equal(before_out, after_out)
        else:
            with pytest.raises(NotFittedError):
                check_is_fitted(est)


# ---- refit interrupted --------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_interrupted_refit_keeps_previous_model(name):
    factory, classify, new_d = CASES[name]
    X, y = data(40, 3, 0, classify)
    est = factory().fit(X, y)
    X2, y2 = data(30, 4 if new_d else 3, 1, classify)
    _check_interrupted(est, lambda e: e.fit(X2, y2), X[:7])


@pytest.mark.parametrize("name", ["KernelRidge", "NystromKernelRidge", "KernelGradientDescent",
                                  "DoublyStochasticRegressor", "KernelAWV",
                                  "KernelHuberRegressor"])
def test_exception_in_refit_keeps_previous_model(name):
    factory, classify, _ = CASES[name]
    X, y = data(40, 3, 0, classify)
    est = factory().fit(X, y)
    X2, y2 = data(30, 5, 1, classify)
    _check_interrupted(est, lambda e: e.fit(X2, y2), X[:7], how="raise")


@pytest.mark.parametrize("name", ["KernelRidge", "KernelCoordinateDescent", "NystromKernelRidge",
                                  "Nystroem", "DoublyStochasticClassifier", "PKAWVNystrom",
                                  "KernelTukeyRegressor"])
def test_interrupted_first_fit_leaves_unfitted(name):
    factory, classify, _ = CASES[name]
    est = factory()
    X, y = data(30, 3, 2, classify)
    _check_interrupted(est, lambda e: e.fit(X, y), X[:5])
    assert set(est.__dict__) == set(factory().__dict__)


# ---- continuing calls: partial_fit, learn_one, warm start ---------------------------------------
@pytest.mark.parametrize("name", ["KernelAWV", "PKAWVTaylor", "PKAWVNystrom", "FOGD", "ProsNKONS",
                                  "DoublyStochasticRegressor", "DoublyStochasticClassifier",
                                  "DoublyStochasticNoveltyDetector"])
def test_interrupted_partial_fit_is_exactly_undone(name):
    factory, classify, _ = CASES[name]
    X, y = data(40, 3, 0, classify)
    est = factory()
    est.partial_fit(X[:20], y[:20])
    rounds = getattr(est, "n_rounds_", None)
    _check_interrupted(est, lambda e: e.partial_fit(X[20:], y[20:]), X[:7])
    assert getattr(est, "n_rounds_", None) == rounds
    # and the learner continues exactly as if nothing had happened
    ref = factory()
    ref.partial_fit(X[:20], y[:20])
    ref.partial_fit(X[20:], y[20:])
    est.partial_fit(X[20:], y[20:])
    np.testing.assert_array_equal(est.predict(X[:7]), ref.predict(X[:7]))


@pytest.mark.filterwarnings("ignore:X does not have valid feature names")
@pytest.mark.parametrize("name", ["KernelAWV", "PKAWVNystrom", "ProsNKONS", "FOGD"])
def test_interrupted_learn_one_is_exactly_undone(name):
    factory, _, _ = CASES[name]
    X, y = data(12, 2, 0)
    est = factory()
    for t in range(11):
        est.learn_one({"a": X[t, 0], "b": X[t, 1]}, float(y[t]))
    row = {"a": X[11, 0], "b": X[11, 1]}
    _check_interrupted(est, lambda e: e.learn_one(row, float(y[11])), X[:5])
    assert est.n_rounds_ == 11


@pytest.mark.parametrize("name", ["NystromKernelRidge", "DoublyStochasticRegressor"])
def test_interrupted_warm_start_refit(name):
    factory, _, _ = CASES[name]
    X, y = data(40, 3, 0)
    est = factory().set_params(warm_start=True).fit(X, y)
    X2, y2 = data(40, 3, 1)
    _check_interrupted(est, lambda e: e.fit(X2, y2), X[:7])


# ---- the failing bits themselves ----------------------------------------------------------------
def test_divergence_in_refit_keeps_previous_model():
    X, y = data(40, 3, 0)
    est = E.KernelGradientDescent(max_iter=100).fit(X, y)
    before, pred = copy.deepcopy(est.__dict__), est.predict(X)
    with pytest.raises(DivergenceError):
        est.set_params(learning_rate=1e6).fit(*data(30, 5, 1))
    assert_same_state({**before, "learning_rate": 1e6}, est)
    np.testing.assert_array_equal(est.predict(X), pred)


def test_successful_refit_leaves_no_stale_attribute():
    X, y = data(40, 3, 0)
    est = E.NystromKernelRidge(n_components=10, random_state=0).fit(X, y)
    est.stale_attribute_ = 1.0
    est.fit(*data(30, 4, 1))
    assert not hasattr(est, "stale_attribute_")
    assert est.n_features_in_ == 4 and est.centers_.shape[1] == 4


def test_mechanism_wraps_new_subclasses_and_nested_calls():
    calls = []

    class Toy(AtomicFitMixin):
        def _get_param_names(self):
            return ["p"]

        def __init__(self, p=1):
            self.p = p

        def fit(self, X, fail=False):
            self.a_ = np.asarray(X, dtype=float)
            self.partial_fit(X)  # nested: protected once, by fit
            calls.append(1)
            if fail:
                raise _Fire
            return self

        def partial_fit(self, X):
            self.b_ = getattr(self, "b_", 0) + 1
            if hasattr(self, "a_"):
                self.a_ += 1.0  # in-place update of a fitted array
            return self

    assert getattr(Toy.fit, "__kernelflow_atomic__", False)
    t = Toy().fit([1.0, 2.0])
    np.testing.assert_array_equal(t.a_, [2.0, 3.0])
    before = copy.deepcopy(t.__dict__)
    with pytest.raises(_Fire):
        t.fit([5.0], fail=True)
    assert_same_state(before, t)
    t.partial_fit([0.0])  # continuing call: the in-place update is undone on failure
    before = copy.deepcopy(t.__dict__)
    arr = t.a_

    def boom(self, X):
        self.a_ += 100.0
        raise _Fire

    boom_wrapped = atomic_fit(boom, "partial_fit")
    with pytest.raises(_Fire):
        boom_wrapped(t, [0.0])
    assert_same_state(before, t)
    assert arr is not t.a_ or np.array_equal(arr, before["a_"])
