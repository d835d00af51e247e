"""Property-based fuzzing of every public estimator and landmark selector.

Each generated case feeds hostile input (bad shapes and dtypes, NaN/inf, extreme values, empty
data, mismatched lengths, invalid hyperparameters) in NumPy, pandas or torch form and checks the
outcome is one of two things: a ``ValueError``/``TypeError`` (scikit-learn's
``InvalidParameterError`` and ``NotFittedError`` are both), or a result of the documented shape
with only finite values. Any other exception, a non-finite prediction or a case running past its
deadline fails.

Estimators come from :data:`kernelflow.registry.ESTIMATORS` (minus the scikit-learn baselines),
so estimators registered later are fuzzed too. The default profile runs a few hundred cases;
``KERNELFLOW_FUZZ_PROFILE=large`` runs more than 5000 (minutes).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernelflow.kernels import Gaussian, Laplace  # noqa: E402
from kernelflow.landmarks import SELECTORS  # noqa: E402
from kernelflow.registry import ESTIMATORS, get_estimator_class  # noqa: E402

PROFILE = os.environ.get("KERNELFLOW_FUZZ_PROFILE", "default")
if PROFILE not in ("default", "large"):
    raise ValueError(f"KERNELFLOW_FUZZ_PROFILE must be 'default' or 'large', got {PROFILE!r}.")
LARGE = PROFILE == "large"
#: cases per estimator (data, parameters) and per selector
N_DATA, N_PARAMS, N_SELECT = (150, 60, 150) if LARGE else (6, 3, 8)
#: seconds one case may run before it counts as a hang (generous: the machine may be shared)
CASE_DEADLINE = 60.0

SETTINGS = settings(
    max_examples=1,  # replaced per test below
    deadline=None,  # wall time is policed by _deadline (a hang must fail, not just be slow)
    database=None,
    derandomize=not LARGE,  # the default run is reproducible
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

# Small settings so that every estimator fits a dozen rows in a fraction of a second.
FAST_PARAMS: dict[str, dict] = {
    "sign_gradient": {"max_iter": 50},
    "gradient_descent": {"max_iter": 50},
    "coordinate_descent": {"max_iter": 50},
    "gradient_descent_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "sign_gradient_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "coordinate_descent_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "kernel_ridge_cv": {"alphas": [0.1, 1.0], "sigmas": [0.5, 2.0]},
    "penalized": {"max_iter": 100},
    "penalized_cv": {"cv": 2, "sigmas": [1.0], "alphas": [0.1, 1.0], "max_iter": 50},
    "huber": {"max_iter": 20},
    "tukey": {"max_iter": 20},
    "quantile": {"max_iter": 20},
    "nystrom_ridge": {"n_components": 5, "max_iter": 20},
    "nystrom_robust": {"n_components": 5, "max_iter": 20},
    "nystroem": {"n_components": 5},
    "doubly_stochastic": {"max_iter": 2},
    "doubly_stochastic_classifier": {"max_iter": 2},
    "doubly_stochastic_novelty": {"max_iter": 2},
    "fogd": {"n_components": 20},
}

#: parameters that set the amount of work: fuzzed with invalid values only (a valid huge value
#: is a legitimately long run, not a defect)
WORK_PARAMS = {"max_iter", "n_components", "cv", "sigmas", "alphas", "max_blocks", "block_size",
               "batch_size", "n_rounds", "n_iter_no_change", "degree", "max_search",
               "cg_max_iter", "n_mc", "max_n", "n_init", "direct_max"}

NAMES = sorted(n for n in ESTIMATORS if not n.startswith("sklearn_"))
ALLOWED = (ValueError, TypeError)


#: cases executed in this process (printed at the end of the large profile)
CASES = {"run": 0, "refused": 0, "ok": 0}


@pytest.fixture(scope="module", autouse=True)
def _report_case_count():
    yield
    if LARGE:
        import sys

        print(f"\nfuzz cases: {CASES['run']} run, {CASES['refused']} refused with "
              f"ValueError/TypeError, {CASES['ok']} finite results", file=sys.__stderr__)


def _count(outcome: str) -> None:
    CASES["run"] += 1
    CASES[outcome] += 1


class _Hang(BaseException):
    """Raised by the per-case alarm (a BaseException, so no ``except Exception`` swallows it)."""


@contextlib.contextmanager
def _deadline(seconds: float):
    def _ring(signum, frame):
        raise _Hang(f"case still running after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, _ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _instance(name: str):
    est = get_estimator_class(name)()
    valid = est.get_params(deep=False)
    params = {k: v for k, v in FAST_PARAMS.get(name, {}).items() if k in valid}
    if "random_state" in valid:
        params["random_state"] = 0
    return est.set_params(**params)


def _kind(est) -> str:
    try:
        kind = est.__sklearn_tags__().estimator_type
    except Exception:  # noqa: BLE001 - estimators without tags
        kind = getattr(est, "_estimator_type", None)
    if kind is None and hasattr(est, "transform"):
        return "transformer"
    return kind or "regressor"


# ---- generated inputs ---------------------------------------------------------------------
VALUE_MODES = ["normal", "normal", "huge", "tiny", "mixed", "constant", "nan", "inf",
               "duplicates", "large"]
CONTAINERS = ["numpy", "numpy", "pandas", "torch64", "torch32", "float16", "bfloat16", "grad",
              "int", "bool", "complex", "object", "str", "list", "float32"]


def _values(rng: np.random.RandomState, shape, mode: str) -> np.ndarray:
    A = rng.randn(*shape)
    if A.size == 0:
        return A
    if mode == "huge":
        A = A * 1e300
    elif mode == "large":
        A = A * 1e150
    elif mode == "tiny":
        A = A * 1e-300
    elif mode == "mixed":
        A.flat[rng.randint(A.size)] = rng.choice([1e300, -1e300, 1e-300, 1e308])
    elif mode == "constant":
        A = np.full(shape, float(rng.choice([0.0, 1.0, -3.5])))
    elif mode == "nan":
        A.flat[rng.randint(A.size)] = np.nan
    elif mode == "inf":
        A.flat[rng.randint(A.size)] = rng.choice([np.inf, -np.inf])
    elif mode == "duplicates":
        A[:] = A[:1]
    return A


def _wrap(A: np.ndarray, container: str):
    """``A`` in the given container (dtype conversions included)."""
    if container == "pandas":
        if A.ndim == 2:
            return pd.DataFrame(A, columns=[f"f{j}" for j in range(A.shape[1])])
        return pd.Series(A) if A.ndim == 1 else A
    if container == "torch64":
        return torch.tensor(A, dtype=torch.float64)
    if container == "torch32":
        return torch.tensor(A, dtype=torch.float32)
    if container == "float16":
        return torch.tensor(A, dtype=torch.float16)
    if container == "bfloat16":
        return torch.tensor(A, dtype=torch.bfloat16)
    if container == "grad":
        return torch.tensor(A, dtype=torch.float64, requires_grad=True)
    if container == "int":
        with np.errstate(invalid="ignore", over="ignore"):
            return np.nan_to_num(A).clip(-1e6, 1e6).astype(np.int64)
    if container == "bool":
        return A > 0
    if container == "complex":
        return A + 1j
    if container == "object":
        return A.astype(object)
    if container == "str":
        return A.astype(str)
    if container == "list":
        return A.tolist()
    if container == "float32":
        with np.errstate(over="ignore"):
            return A.astype(np.float32)
    return A


@st.composite
def _case(draw):
    return {
        "seed": draw(st.integers(0, 2**31 - 1)),
        "n": draw(st.sampled_from([0, 1, 2, 3, 5, 8, 12])),
        "d": draw(st.sampled_from([0, 1, 2, 3])),
        "x_mode": draw(st.sampled_from(VALUE_MODES)),
        "x_container": draw(st.sampled_from(CONTAINERS)),
        "y_mode": draw(st.sampled_from(["normal", "normal", "huge", "nan", "inf", "constant",
                                        "short", "2d", "1col", "large", "tiny"])),
        "y_container": draw(st.sampled_from(["same", "same", "numpy", "list", "torch64",
                                             "pandas", "str", "complex"])),
        "new": draw(st.sampled_from(["same", "fresh", "fresh", "wrong_d", "1d", "empty", "nan",
                                     "huge", "large"])),
    }


def _materialise(case, kind: str):
    rng = np.random.RandomState(case["seed"] % (2**31))
    n, d = case["n"], case["d"]
    X = _values(rng, (n, d), case["x_mode"])
    ym = case["y_mode"]
    if kind == "classifier":
        y = (rng.rand(n) > 0.5).astype(np.int64)
        if ym in ("nan", "inf"):
            y = y.astype(float)
            if n:
                y[0] = np.nan if ym == "nan" else np.inf
    else:
        y = _values(rng, (n,), ym if ym in VALUE_MODES else "normal")
    if ym == "short":
        y = y[: max(n - 1, 0)] if n else np.zeros(1)
    elif ym == "2d":
        y = np.stack([y, y], axis=1)
    elif ym == "1col":
        y = y.reshape(-1, 1)
    m = 4
    new = case["new"]
    if new == "same":
        X_new = X
    elif new == "wrong_d":
        X_new = rng.randn(m, d + 1)
    elif new == "1d":
        X_new = rng.randn(m)
    elif new == "empty":
        X_new = np.zeros((0, d))
    else:
        X_new = _values(rng, (m, d), {"fresh": "normal"}.get(new, new))
    xc = case["x_container"]
    yc = xc if case["y_container"] == "same" else case["y_container"]
    if kind == "classifier" and yc in ("float16", "bfloat16", "bool"):
        yc = "numpy"
    return _wrap(X, xc), _wrap(y, yc), _wrap(X_new, xc), X_new


def _as_numpy(out) -> np.ndarray:
    if isinstance(out, torch.Tensor):
        return out.detach().cpu().to(torch.float64).numpy()
    if hasattr(out, "to_numpy"):
        return out.to_numpy()
    return np.asarray(out, dtype=np.float64)


def _outputs(est, kind: str, X_new):
    """Every output method of the fitted estimator on ``X_new``: name -> array."""
    methods = {"transformer": ["transform"], "classifier": ["predict", "decision_function"],
               "outlier_detector": ["predict", "decision_function"]}.get(kind, ["predict"])
    out = {}
    for m in methods:
        if hasattr(est, m):
            res = getattr(est, m)(X_new)
            # a classifier predicts class labels (any dtype): compared with classes_ below
            labels = kind == "classifier" and m == "predict"
            out[m] = np.asarray(res.detach().cpu() if isinstance(res, torch.Tensor) else res) \
                if labels else _as_numpy(res)
    return out


def _run(est, kind: str, X, y, X_new, n_new: int, describe: str) -> str:
    """Fit and predict under the deadline; returns the outcome or fails the test."""
    try:
        with _deadline(CASE_DEADLINE), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "outlier_detector":
                est.fit(X)
            else:
                est.fit(X, y)
            outs = _outputs(est, kind, X_new)
    except ALLOWED as exc:
        msg = str(exc)
        assert msg.strip(), f"{describe}: {type(exc).__name__} without a message"
        _count("refused")
        return "refused"
    except _Hang as exc:
        pytest.fail(f"{describe}: {exc}")
    except Exception as exc:  # noqa: BLE001 - any other type is the defect under test
        pytest.fail(f"{describe}: {type(exc).__qualname__} ({type(exc).__module__}): {exc}")
    for method, out in outs.items():
        assert out.shape[:1] == (n_new,), f"{describe}: {method} shape {out.shape}, " \
                                          f"expected ({n_new}, ...)"
        assert out.ndim <= 2, f"{describe}: {method} has shape {out.shape}"
        if kind == "classifier" and method == "predict":
            assert np.isin(out, np.asarray(est.classes_)).all(), f"{describe}: labels {out}"
            continue
        assert np.isfinite(out).all(), f"{describe}: {method} returned non-finite values " \
                                       f"{out.reshape(-1)[:6]}"
    _count("ok")
    return "ok"


# ---- estimators ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@settings(SETTINGS, max_examples=N_DATA)
@given(case=_case())
def test_estimator_hostile_data(name, case):
    est = _instance(name)
    kind = _kind(est)
    X, y, X_new, X_new_np = _materialise(case, kind)
    n_new = X_new_np.shape[0] if X_new_np.ndim else 0
    _run(est, kind, X, y, X_new, n_new, f"{name} on {case}")


HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e300, -1e300, 1e-300, 0.5, 3]
INVALID_WORK = [math.nan, math.inf, -1, 0, 2.5, "many", None]
HOSTILE_OTHER = ["bogus", -1, math.nan, None, 1e300, [1.0, math.nan]]


@st.composite
def _param_case(draw, name):
    est = _instance(name)
    params = sorted(k for k in est.get_params(deep=False)
                    if k not in ("options", "verbose", "random_state", "distributed"))
    key = draw(st.sampled_from(params))
    default = est.get_params(deep=False)[key]
    if key in WORK_PARAMS:
        value = draw(st.sampled_from(INVALID_WORK))
    elif isinstance(default, float | int) and not isinstance(default, bool) or default is None:
        value = draw(st.sampled_from(HOSTILE_NUMBERS + ["bogus"]))
    elif key == "kernel":
        value = draw(st.sampled_from(["bogus", "poly", "laplace", "linear", 3,
                                      Gaussian(1e300), Laplace(1e-300)]))
    else:
        value = draw(st.sampled_from(HOSTILE_OTHER))
    return key, value, draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("name", NAMES)
@settings(SETTINGS, max_examples=N_PARAMS)
@given(data=st.data())
def test_estimator_hostile_parameters(name, data):
    key, value, seed = data.draw(_param_case(name))
    est = _instance(name)
    try:
        est.set_params(**{key: value})
    except ALLOWED:
        _count("refused")
        return
    kind = _kind(est)
    rng = np.random.RandomState(seed % (2**31))
    X = rng.randn(12, 2)
    y = (X[:, 0] > 0).astype(int) if kind == "classifier" else np.sin(X[:, 0])
    _run(est, kind, X, y, X[:5], 5, f"{name} with {key}={value!r}")


# ---- landmark selectors --------------------------------------------------------------------
FAST_SELECTOR = {"continuous": {"max_iter": 20, "max_search": 3, "n_mc": 2},
                 "kmeans": {"n_init": 1, "max_iter": 10}}


@st.composite
def _selector_case(draw, name):
    cls = SELECTORS[name]
    spec = getattr(cls, "_param_spec", {})
    bad_param = None
    if spec and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(spec)))
        pool = INVALID_WORK if key in WORK_PARAMS else HOSTILE_NUMBERS + ["bogus", True]
        bad_param = (key, draw(st.sampled_from(pool)))
    return {
        "case": draw(_case()),
        "k": draw(st.sampled_from([1, 2, 3, 0, -1, 100, 2.5, True, "3", None])),
        "kernel": draw(st.sampled_from(["gauss", "gauss", "laplace", "wide", "narrow", "none",
                                        "string"])),
        "param": bad_param,
    }


def _kernel(which):
    return {"gauss": Gaussian(1.0), "laplace": Laplace(1.0), "wide": Gaussian(1e300),
            "narrow": Gaussian(1e-300), "none": None, "string": "rbf"}[which]


@pytest.mark.parametrize("name", sorted(SELECTORS))
@settings(SETTINGS, max_examples=N_SELECT)
@given(data=st.data())
def test_selector_hostile_input(name, data):
    c = data.draw(_selector_case(name))
    case = c["case"]
    sel = SELECTORS[name]()
    sel.set_params(**FAST_SELECTOR.get(name, {}))
    if c["param"] is not None:
        sel.set_params(**{c["param"][0]: c["param"][1]})
    X, _, _, _ = _materialise(case, "regressor")
    describe = f"{name} with {c}"
    try:
        with _deadline(CASE_DEADLINE), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = sel.select(X, _kernel(c["kernel"]), c["k"], random_state=case["seed"] % 1000)
    except ALLOWED as exc:
        assert str(exc).strip(), f"{describe}: {type(exc).__name__} without a message"
        _count("refused")
        return
    except _Hang as exc:
        pytest.fail(f"{describe}: {exc}")
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"{describe}: {type(exc).__qualname__} ({type(exc).__module__}): {exc}")
    C = out.centers.detach().to(torch.float64)
    n, d = case["n"], case["d"]
    assert C.ndim == 2 and C.shape[1] == d and 1 <= C.shape[0] <= int(c["k"]), describe
    assert bool(torch.isfinite(C).all()), f"{describe}: non-finite centres"
    if out.indices is not None:
        idx = out.indices
        assert idx.numel() == C.shape[0] and bool((idx >= 0).all() & (idx < n).all()), describe
        assert idx.unique().numel() == idx.numel(), f"{describe}: repeated landmarks"
    if out.weights is not None:
        assert bool(torch.isfinite(out.weights.to(torch.float64)).all()), describe
    _count("ok")


# ---- deterministic regressions found by the fuzzer -----------------------------------------
@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_selectors_refuse_complex_and_accept_half_precision(name):
    sel = SELECTORS[name]()
    sel.set_params(**FAST_SELECTOR.get(name, {}))
    X = np.random.RandomState(0).randn(10, 2)
    with pytest.raises(TypeError, match="complex"):
        sel.select(X + 1j, Gaussian(1.0), 3, random_state=0)
    out = sel.select(torch.tensor(X, dtype=torch.float16, requires_grad=True), Gaussian(1.0), 3,
                     random_state=0)
    assert out.centers.dtype == torch.float32 and out.centers.shape[1] == 2
    assert not out.centers.requires_grad


def test_uniform_validates_its_input():
    from kernelflow.landmarks import Uniform

    for bad, err in [(np.full((4, 2), np.nan), ValueError), (np.zeros((0, 2)), ValueError),
                     (np.zeros(4), ValueError), (np.array([["a", "b"]] * 3), TypeError)]:
        with pytest.raises(err):
            Uniform().select(bad, Gaussian(1.0), 2, random_state=0)
    with pytest.raises(ValueError, match="k = 5"):
        Uniform().select(np.zeros((3, 2)), Gaussian(1.0), 5)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0.0])
def test_selector_hyperparameters_refused(value):
    from kernelflow.landmarks import BLESS, ContinuousSelector

    X = np.random.RandomState(0).randn(20, 2)
    for sel, key in [(BLESS(), "q1"), (BLESS(), "q"), (ContinuousSelector(), "delta"),
                     (ContinuousSelector(), "learning_rate"), (ContinuousSelector(), "cg_tol")]:
        sel.set_params(**{key: value})
        with pytest.raises(ValueError, match=key):
            sel.select(X, Gaussian(1.0), 3, random_state=0)


@pytest.mark.parametrize("name", ["kernel_ridge", "huber", "nystrom_ridge"])
def test_requires_grad_and_half_precision_tensors_accepted(name):
    est = _instance(name)
    X = torch.randn(12, 2, dtype=torch.float64, requires_grad=True)
    y = torch.sin(X[:, 0]).detach().requires_grad_(True)
    out = est.fit(X, y).predict(X)
    assert out.shape == (12,) and bool(torch.isfinite(out).all()) and not out.requires_grad
    out = _instance(name).fit(X.detach().to(torch.bfloat16), y.detach()).predict(
        X.detach().to(torch.float16))
    assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())


def test_coef0_must_be_finite():
    from kernelflow.estimators.kernel_ridge import KernelRidge

    X = np.random.RandomState(0).randn(8, 2)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="coef0"):
            KernelRidge(kernel="poly", coef0=bad).fit(X, X[:, 0])
