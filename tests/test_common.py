"""Checks every exported estimator passes with its default parameters.

In the spirit of scikit-learn's common tests: one parametrisation per estimator class the package
exports, found by walking its public modules (and each must have its entry in
:data:`kernelflow.registry.ESTIMATORS`), each built with its defaults and checked for

- scikit-learn's ``check_estimator`` (expected failures only where a check cannot apply, each
  with its reason);
- hostile input refused with a ``ValueError``/``TypeError`` that names the problem: NaN, inf,
  values near 1e300, the wrong number of features at predict, empty X, a single row, strings,
  complex numbers, 3-D X, y of the wrong length, invalid parameter values, labels a classifier
  cannot use;
- a save/load round trip through :mod:`kernelflow.io` with bit-identical outputs;
- determinism: two fits with the same ``random_state`` give identical outputs;
- interruption: a ``KeyboardInterrupt`` inside ``fit`` leaves a fitted estimator as it was and a
  fresh one unfitted;
- online learners: ``learn_one``/``predict_one`` on dict rows agree with ``fit``.

A new estimator joins every check by being exported; the registry test fails until it is also
registered.
"""

from __future__ import annotations

import copy
import signal
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import declared_estimators, import_path, public_estimators, regression_data
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import check_estimator
from sklearn.utils.validation import check_is_fitted

import kernelflow
from kernelflow.io import load_model, read_metadata, save_model
from kernelflow.registry import class_path, get_estimator_class

#: every estimator class the package exports, found by walking its public modules -> the modules
#: exporting it; and the public modules that failed to import (the registry test names them)
PUBLIC, IMPORT_ERRORS = public_estimators()
#: the registry as its source writes it (name -> "module:Class"), before discovery adds to it
DECLARED = declared_estimators()
#: exported estimator classes that are neither checked here nor required in the registry
#: ("module:Class" -> why it is not an estimator to check); none today
NOT_CHECKED: dict[str, str] = {}
#: the name prefix under which an exported estimator with no registry entry is checked
UNREGISTERED = "unregistered:"


def _registered_classes() -> dict[type, str]:
    out: dict[type, str] = {}
    for name, path in DECLARED.items():
        try:
            out.setdefault(import_path(path), name)
        except (ImportError, AttributeError):
            continue  # named by test_every_public_estimator_is_registered
    return out


#: class -> its name in the registry's source
REGISTERED = _registered_classes()
#: kernelflow's own estimators by name: the registered name, or ``unregistered:Class`` (the
#: ``sklearn_*`` entries of the registry are scikit-learn's, checked there)
CLASSES = {REGISTERED.get(cls, UNREGISTERED + cls.__qualname__): cls for cls in PUBLIC
           if class_path(cls) not in NOT_CHECKED}
NAMES = sorted(CLASSES)
#: every entry, baselines included: model files must carry them too
ALL_NAMES = sorted(NAMES + [n for n in DECLARED if n.startswith("sklearn_")])

PKG = str(Path(kernelflow.__file__).parent)

# ---- expected failures and slow parametrisations -------------------------------------------------
_MINI_BATCH = "stochastic mini-batches: a weighted row and a repeated row land in different batches"
#: check name -> reason, per estimator name; only checks that cannot apply to the method
EXPECTED_FAILED_CHECKS: dict[str, dict[str, str]] = {
    "kernel_ridge_cv": {
        "check_sample_weight_equivalence_on_dense_data":
            "leave-one-out is not invariant to repeating a row (scikit-learn's RidgeCV lists the "
            "same check)",
    },
    "doubly_stochastic": {"check_sample_weight_equivalence_on_dense_data": _MINI_BATCH},
    "doubly_stochastic_classifier": {"check_sample_weight_equivalence_on_dense_data": _MINI_BATCH},
    "doubly_stochastic_novelty": {"check_sample_weight_equivalence_on_dense_data": _MINI_BATCH},
}

#: check_estimator parametrisations that are known to fail or to be too slow with the defaults
CHECK_ESTIMATOR_MARKS: dict[str, list] = {
    "gradient_descent_cv": [pytest.mark.slow(
        reason="the default sigma grid and ten folds make check_estimator take over a minute")],
    "huber_gradient_descent_cv": [pytest.mark.slow(
        reason="on check_estimator's 200-row regression data the wide bandwidths keep "
               "improving for all 10000 steps, so a default fit runs 10000 batched path-CV "
               "steps (a product with the 200 x 200 kernels each) and check_estimator takes "
               "minutes")],
}

#: estimators whose fit is not all-or-nothing yet: a refused or interrupted fit leaves
#: ``n_features_in_`` of the new data behind (their base class does not use the atomic-fit guard)
NOT_ATOMIC: set[str] = set()


def _names_not_atomic() -> list:
    mark = pytest.mark.xfail(strict=False, reason="fit is not atomic: n_features_in_ is left "
                             "from the refused or interrupted call")
    return [pytest.param(n, marks=[mark] if n in NOT_ATOMIC else []) for n in NAMES]


# ---- helpers -------------------------------------------------------------------------------------


def _make(name: str, **params) -> BaseEstimator:
    return (CLASSES[name] if name in CLASSES else get_estimator_class(name))(**params)


def _seeded(name: str) -> BaseEstimator:
    est = _make(name)
    if "random_state" in est.get_params(deep=False):
        est.set_params(random_state=0)
    return est


def _kind(est) -> str:
    kind = est.__sklearn_tags__().estimator_type
    if kind is None and hasattr(est, "transform"):
        return "transformer"
    return kind or "regressor"


def _supervised(est) -> bool:
    return _kind(est) in ("regressor", "classifier")


def _data(n=40, d=3, seed=0):
    return regression_data(n, d, lambda X: np.sin(3 * X[:, 0]) + X[:, 1] ** 2, seed=seed)


def _target(est, y):
    return (y > np.median(y)).astype(int) if _kind(est) == "classifier" else y


def _fit(est, X, y):
    """Fit as the estimator's kind asks (no y for outlier detectors and transformers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _supervised(est):
            return est.fit(X, y)
        return est.fit(X)


def _outputs(est, X) -> list[np.ndarray]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in ("predict", "transform", "decision_function", "predict_proba"):
            if hasattr(est, method):
                try:
                    out.append(np.asarray(getattr(est, method)(X)))
                except (AttributeError, NotImplementedError):
                    continue
    assert out, f"{type(est).__name__} has no prediction method"
    return out


def _assert_same_outputs(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and u.shape == v.shape
        np.testing.assert_array_equal(u, v)  # bit-identical, not approximately equal


# ---- the registry lists every estimator ----------------------------------------------------------
def test_every_public_estimator_is_registered():
    from kernelflow import estimators, online

    assert not IMPORT_ERRORS, f"public modules that do not import: {IMPORT_ERRORS}"
    # the walk finds at least what the estimator packages export
    exported = {getattr(p, n) for p in (estimators, online) for n in p.__all__}
    exported = {c for c in exported if isinstance(c, type) and issubclass(c, BaseEstimator)}
    assert len(exported) >= 30 and exported <= set(PUBLIC)
    missing = [f"{class_path(c)} (exported by {', '.join(m)})" for c, m in PUBLIC.items()
               if c not in REGISTERED and class_path(c) not in NOT_CHECKED]
    assert not missing, f"exported estimators with no entry in registry.ESTIMATORS: {missing}"
    by_name = {name: cls for cls, name in REGISTERED.items()}
    stale = [n for n in DECLARED if not n.startswith("sklearn_") and by_name.get(n) not in PUBLIC]
    assert not stale, f"registry entries that name no exported estimator: {stale}"
    assert all(get_estimator_class(n) is cls for n, cls in CLASSES.items() if n in DECLARED)
    unknown = set(NOT_CHECKED) - {class_path(c) for c in PUBLIC}
    assert not unknown, f"NOT_CHECKED names classes the package does not export: {unknown}"


# ---- scikit-learn's checks -----------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=CHECK_ESTIMATOR_MARKS.get(n, [])) for n in NAMES])
def test_check_estimator(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(_make(name), expected_failed_checks=EXPECTED_FAILED_CHECKS.get(name, {}))


#: smaller settings under which the estimators whose default check_estimator run is slow-marked
#: run scikit-learn's checks in the default suite (the same code paths, a smaller grid)
SMALL_GRID = {"sigmas": 5, "cv": 3, "max_iter": 300}


@pytest.mark.parametrize("name", sorted(CHECK_ESTIMATOR_MARKS))
def test_check_estimator_small_grid(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(_make(name, **SMALL_GRID),
                        expected_failed_checks=EXPECTED_FAILED_CHECKS.get(name, {}))


# ---- hostile input -------------------------------------------------------------------------------
def _with(X, value):
    X = X.copy()
    X[3, 1] = value
    return X


#: case -> (X transform, y transform, supervised only, exception types, message pattern)
BAD_FIT = {
    "X has NaN": (lambda X: _with(X, np.nan), None, False, ValueError, r"X contains NaN"),
    "X has inf": (lambda X: _with(X, np.inf), None, False, ValueError, r"X contains infinity"),
    "X has NaN, torch": (lambda X: torch.as_tensor(_with(X, np.nan)), torch.as_tensor, False,
                         ValueError, r"NaN"),
    "X has -inf": (lambda X: _with(X, -np.inf), None, False, ValueError, r"X contains infinity"),
    "X near 1e300": (lambda X: X * 2e300, None, False, ValueError,
                     r"^X has values up to \S+e\+300 .*overflow.*Rescale X"),
    "empty X": (lambda X: X[:0], lambda y: y[:0], False, ValueError, r"0 sample"),
    "string X": (lambda X: np.full(X.shape, "a"), None, False, (TypeError, ValueError),
                 r"numeric|string|convert"),
    "complex X": (lambda X: X + 1j, None, False, ValueError, r"[Cc]omplex"),
    "3-D X": (lambda X: X[:, :, None], None, False, ValueError, r"dim 3"),
    "1-D X": (lambda X: X[:, 0], None, False, ValueError, r"2D array"),
    "1-D X, torch": (lambda X: torch.as_tensor(X[:, 0]), torch.as_tensor, False, ValueError,
                     r"2D array|dimension"),
    "y has NaN": (None, lambda y: np.where(np.arange(len(y)) == 3, np.nan, y), True, ValueError,
                  r"y contains NaN"),
    "y has NaN, torch": (None, lambda y: torch.as_tensor(np.where(np.arange(len(y)) == 3, np.nan,
                                                                  y)), True, ValueError, r"NaN"),
    "y too short": (None, lambda y: y[:-1], True, ValueError, r"inconsistent numbers of samples"),
    "y too long": (None, lambda y: np.r_[y, y[:1]], True, ValueError,
                   r"inconsistent numbers of samples"),
}


@pytest.mark.parametrize("case", list(BAD_FIT))
@pytest.mark.parametrize("name", NAMES)
def test_hostile_fit_input_is_refused(name, case):
    fx, fy, supervised_only, exc, pattern = BAD_FIT[case]
    est = _make(name)
    if supervised_only and not _supervised(est):
        pytest.skip("y is not used")
    X, y = _data()
    y = _target(est, y)
    X = fx(X) if fx else X
    y = fy(y) if fy else y
    with pytest.raises(exc, match=pattern):
        _fit(est, X, y)


@pytest.mark.parametrize("name", _names_not_atomic())
def test_refused_fit_leaves_the_estimator_unfitted(name):
    est = _make(name)
    X, y = _data()
    y = _target(est, y)
    for fx, fy, supervised_only, exc, _ in BAD_FIT.values():
        if supervised_only and not _supervised(est):
            continue
        with pytest.raises(exc):
            _fit(est, fx(X) if fx else X, fy(y) if fy else y)
        assert est.__dict__.keys() == _make(name).__dict__.keys(), "half-written estimator"


@pytest.mark.parametrize("name", [n for n in NAMES if _kind(_make(n)) == "regressor"])
def test_overflowing_y_is_named(name):
    X, y = _data()
    with pytest.raises(ValueError, match=r"^y has values up to .*overflow"):
        _fit(_make(name), X, y * 1e300)


@pytest.mark.parametrize("name", NAMES)
def test_predict_before_fit_is_refused(name):
    est = _make(name)
    X = _data()[0]
    for method in ("predict", "transform", "decision_function", "predict_proba"):
        if hasattr(est, method):
            with pytest.raises(NotFittedError):
                getattr(est, method)(X)


@pytest.mark.parametrize("name", NAMES)
def test_hostile_predict_input_is_refused(name):
    est = _seeded(name)
    X, y = _data()
    _fit(est, X, _target(est, y))
    before = _outputs(est, X[:5])
    cases = {
        "wrong number of features": (X[:, :2], r"X has 2 features, but \w+ is expecting 3"),
        "NaN": (_with(X, np.nan), r"X contains NaN"),
        "inf": (_with(X, np.inf), r"X contains infinity"),
        "empty": (X[:0], r"0 sample"),
        "complex": (X + 1j, r"[Cc]omplex"),
        "3-D": (X[:, :, None], r"dim 3"),
    }
    method = "predict" if hasattr(est, "predict") else "transform"
    for bad, pattern in cases.values():
        with pytest.raises(ValueError, match=pattern):
            getattr(est, method)(bad)
    with pytest.raises((TypeError, ValueError), match=r"numeric|string|convert"):
        getattr(est, method)(np.full((4, 3), "a"))
    _assert_same_outputs(before, _outputs(est, X[:5]))  # refusals change nothing


@pytest.mark.parametrize("name", NAMES)
def test_one_row_fits_or_is_refused_by_name(name):
    est = _make(name)
    X, y = _data()
    y = _target(est, y)
    try:
        _fit(est, X[:1], y[:1])
    except ValueError as exc:
        assert any(w in str(exc) for w in ("sample", "class")), str(exc)
        return
    for out in _outputs(est, X[:4]):
        assert out.shape[0] == 4 and np.all(np.isfinite(out))


def _invalid_params(est) -> list[str]:
    """Parameters whose constraints do not accept an arbitrary object."""
    constraints = getattr(type(est), "_parameter_constraints", {})
    return [p for p, c in constraints.items()
            if p in est.get_params(deep=False) and c != "no_validation" and object not in c
            and "no_validation" not in c]


@pytest.mark.parametrize("name", NAMES)
def test_invalid_parameters_are_refused_by_name(name):
    X, y = _data()
    est = _make(name)
    params = _invalid_params(est)
    assert params, "an estimator with parameters must declare their constraints"
    for p in params:
        bad = _make(name).set_params(**{p: object()})
        with pytest.raises((TypeError, ValueError), match=f"'{p}' parameter"):
            _fit(bad, X, _target(bad, y))


@pytest.mark.parametrize("name", [n for n in NAMES if _kind(_make(n)) == "classifier"])
def test_classifier_labels_are_checked(name):
    X, y = _data()
    with pytest.raises(ValueError, match="2 classes"):
        _make(name).fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="Unknown label type"):
        _make(name).fit(X, np.linspace(0, 1, len(X)))


# ---- model files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_NAMES)
def test_round_trip_is_bit_identical(name, tmp_path):
    est = _seeded(name)
    X, y = _data()
    _fit(est, X, _target(est, y))
    X_new = _data(7, seed=1)[0]
    expected = _outputs(est, X_new)
    path = save_model(est, tmp_path / f"{name}.npz")
    loaded = load_model(path)
    assert type(loaded) is type(est)
    assert loaded.get_params(deep=False).keys() == est.get_params(deep=False).keys()
    _assert_same_outputs(expected, _outputs(loaded, X_new))
    meta = read_metadata(path)
    assert meta["estimator"]["name"] == name
    # a loaded model saves to the same metadata again (nothing is lost in a second trip)
    again = read_metadata(save_model(loaded, tmp_path / "again.npz"))
    assert again["estimator"] == meta["estimator"]


# ---- determinism ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_same_random_state_same_outputs(name):
    X, y = _data()
    X_new = _data(9, seed=2)[0]
    first = _outputs(_fit(_seeded(name), X, _target(_seeded(name), y)), X_new)
    second = _outputs(_fit(_seeded(name), X, _target(_seeded(name), y)), X_new)
    _assert_same_outputs(first, second)


# ---- interruption --------------------------------------------------------------------------------
class _InterruptAt:
    """Profile hook: count calls of kernelflow functions; at the k-th, send SIGINT."""

    def __init__(self, k: int | None):
        self.k, self.calls = k, 0

    def __call__(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(PKG):
            return
        self.calls += 1
        if self.calls == self.k:
            self.k = None
            signal.raise_signal(signal.SIGINT)  # a genuine Ctrl-C, raised in this thread

    def run(self, fn):
        old = sys.getprofile()
        sys.setprofile(self)
        try:
            return fn()
        finally:
            sys.setprofile(old)


@pytest.fixture
def _sigint_raises():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_midway(est, X, y):
    """Interrupt ``fit`` at about half of the kernelflow calls a complete fit makes."""
    dry = _InterruptAt(None)
    dry.run(lambda: _fit(copy.deepcopy(est), X, y))
    assert dry.calls > 0
    k = max(1, dry.calls // 2)
    state = copy.deepcopy(est.__dict__)
    for _ in range(8):  # a run can take a shorter route than the dry run: interrupt earlier
        try:
            _InterruptAt(k).run(lambda: _fit(est, X, y))
        except KeyboardInterrupt:
            return
        est.__dict__.clear()  # the fit completed before the k-th call: undo it, try earlier
        est.__dict__.update(copy.deepcopy(state))
        k = max(1, k // 2)
    pytest.fail("the interruption never landed inside fit")


@pytest.mark.usefixtures("_sigint_raises")
@pytest.mark.parametrize("name", _names_not_atomic())
def test_interrupted_fit_changes_nothing(name):
    X, y = _data()
    X2, y2 = _data(30, 4, seed=3)
    X_probe = X[:6]

    est = _seeded(name)
    _fit(est, X, _target(est, y))
    before = _outputs(est, X_probe)
    n_features = est.n_features_in_
    _interrupt_midway(est, X2, _target(est, y2))
    assert est.n_features_in_ == n_features
    _assert_same_outputs(before, _outputs(est, X_probe))

    fresh = _seeded(name)
    params = fresh.get_params(deep=False)
    _interrupt_midway(fresh, X2, _target(fresh, y2))
    with pytest.raises(NotFittedError):
        check_is_fitted(fresh)
    assert fresh.get_params(deep=False).keys() == params.keys()


# ---- online learners -----------------------------------------------------------------------------
ONLINE = [n for n in NAMES if hasattr(CLASSES[n], "learn_one")]


def test_online_learners_are_found():
    assert len(ONLINE) >= 5, ONLINE


@pytest.mark.parametrize("name", ONLINE)
def test_learn_one_on_dict_rows_agrees_with_fit(name):
    X, y = _data(30)
    keys = ["a", "b", "c"]
    fitted = _seeded(name).fit(X, y)
    learner = _seeded(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no feature-name or conversion warning per row
        for row, target in zip(X, y):
            learner.learn_one(dict(zip(keys, row)), float(target))
        by_rows = [learner.predict_one(dict(zip(keys, row))) for row in X[:10]]
    assert learner.n_rounds_ == fitted.n_rounds_ == len(y)
    assert list(learner.feature_names_in_) == keys
    np.testing.assert_allclose(by_rows, fitted.predict(X[:10]), rtol=1e-12, atol=1e-12)
