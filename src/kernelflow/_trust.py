"""What a model file may restore: the rules :func:`kernelflow.io.load_model` applies to values.

The registry (:func:`kernelflow.registry.model_classes`) says *which* classes a file may name.
This module says *what* a file may put into them, so that a loaded model is safe to call:

* **attribute names** -- a file sets only identifiers that are not dunder names, not
  constructor parameters and not anything the class already defines (a method, a property, a
  class attribute): a file can never shadow ``predict``, ``fit`` or ``_impl``. Estimator state
  is limited to names ending in ``_``, starting with ``_`` or set by the constructor itself;
* **side effects** -- no ``memory`` (a joblib cache directory, i.e. files written and unpickled at
  ``fit``), no ``n_jobs``/thread or worker counts other than ``None`` or ``1`` (no processes or
  thread pools), no path-like value (a string under a name such as ``path``, ``dir``, ``file``);
  the format itself cannot express a function, a class or a module;
* **ranges** -- every parameter is checked against the class's own ``_parameter_constraints``
  (scikit-learn's ``_validate_params``), kernels against their ``validate``, engine ``Options``
  against bounds of this machine (memory budget, tile sizes), size-like integers against the
  memory budget, composite kernels against a number of parts;
* **fitted state** -- classes whose prediction runs compiled code on the fitted state without
  checking it (scikit-learn's libsvm estimators) are admitted only when every array has its
  exact dtype, layout and shape and every index lies in range.

Every refusal is a :class:`ModelFileError`. The rules are deliberately generic where they can be
(one rule per kind of danger, for every class) and specific where they must be (libsvm).
"""

from __future__ import annotations

import math
import re
from typing import Any, NoReturn

import numpy as np

from .utils._params import param_names

__all__ = ["ModelFileError", "MAX_KERNEL_PARTS", "check_attributes", "check_estimator",
           "check_object", "check_dataclass", "check_state_object", "kernel_parts"]


class ModelFileError(ValueError):
    """A model file is missing, corrupt, tampered with, of an unsupported version, or asks for
    something the trust model does not allow (see ``docs/model_format.md``)."""


ModelFileError.__module__ = "kernelflow.io"

#: Most kernels one composite kernel (a ``Sum``/``Product``/``Scaled``/``Additive`` tree) may
#: hold; each part costs one pass over the kernel block at every prediction.
MAX_KERNEL_PARTS = 64

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
#: names whose value starts processes or thread pools: only None or 1 may be restored
_WORKER_NAMES = re.compile(r"^_?(n_jobs|n_threads|num_threads|n_workers|num_workers|workers|"
                           r"n_processes|processes)_?$")
#: names whose value is a place in the file system: never a string
_PATH_NAMES = re.compile(r"(^|_)(path|paths|dir|dirs|directory|file|filename|folder|location|"
                         r"checkpoint|cachedir)s?($|_)")
#: size-like integers in bytes, and in elements (each at least 8 bytes when allocated)
_BYTE_NAMES = re.compile(r"^_?(\w*_bytes|memory_budget)_?$")
_ELEMENT_NAMES = re.compile(r"^_?(n_components|block_size|batch_size|tile_elements|max_blocks|"
                            r"n_blocks|cholesky_max_size|max_size|cache_rows)_?$")
_DEVICE = re.compile(r"^(cpu|cuda|mps)(:\d{1,3})?$")


def _fail(where: str, message: str) -> NoReturn:
    raise ModelFileError(f"{where}: {message}")


def _int(value: Any) -> int | None:
    """``value`` as an int when it is a Python or NumPy integer (not a bool), else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        return float(value)
    return None


def _memory_cap() -> int:
    from kernelflow.operators import memory_budget

    try:
        return int(memory_budget())
    except Exception:  # noqa: BLE001 - an unreadable budget must not block loading small files
        return 4 * 2**30


#: Size limits a file may restore are this machine's budget, but never below this floor: the
#: library's own defaults (a 256 MiB block cache, 30 000-row factorisations) are limits, not
#: allocations, and must load on a small machine too.
_LIMIT_FLOOR = 2**30


def _limit() -> int:
    return max(_memory_cap(), _LIMIT_FLOOR)


# ---------------------------------------------------------------------------------------------
# names and values, for every class
# ---------------------------------------------------------------------------------------------
def _slots(cls: type) -> set:
    out: set = set()
    for klass in cls.__mro__:
        slots = getattr(klass, "__slots__", ())
        out.update((slots,) if isinstance(slots, str) else slots)
    return out


def check_name(cls: type, name: Any, where: str, *, slots: set | None = None) -> None:
    """An attribute a file sets on an instance of ``cls``: a plain identifier that shadows
    nothing the class defines (methods, properties, class attributes)."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        _fail(where, f"attribute name {str(name)[:60]!r} is not a plain identifier")
    if name.startswith("__"):
        _fail(where, f"attribute name {name!r} is a special (dunder) name")
    if hasattr(cls, name) and name not in (slots or ()):
        _fail(where, f"attribute {name!r} would shadow {cls.__name__}.{name}, which the class "
                     "defines (a method, property or class attribute)")


def check_value(name: str, value: Any, where: str) -> None:
    """Side effects and sizes a value may carry under ``name``, whatever the class."""
    if _WORKER_NAMES.match(name):
        if value is not None and _int(value) != 1:
            _fail(where, f"{name}={str(value)[:40]!r}: a model file may not ask for worker "
                         "processes or threads (only None or 1 is restored)")
    elif name == "memory" or name == "_memory":
        if value is not None:
            _fail(where, f"{name}={str(value)[:60]!r}: a model file may not name a cache (files "
                         "written and read back at fit); only memory=None is restored")
    elif _PATH_NAMES.search(name) and _holds_text(value):
        _fail(where, f"{name}={str(value)[:60]!r}: a model file may not name a file or directory")
    elif isinstance(value, dict):
        # keyword dictionaries (kernel_params, fit options) reach functions as arguments
        for key, item in value.items():
            if isinstance(key, str):
                check_value(key, item, f"{where}[{key!r}]")
    elif _int(value) is not None and (_BYTE_NAMES.match(name) or _ELEMENT_NAMES.match(name)):
        cap, number = _limit(), int(value)
        if _BYTE_NAMES.match(name) and number > cap:
            _fail(where, f"{name}={value} bytes is more than the memory budget ({cap} bytes)")
        if _ELEMENT_NAMES.match(name) and number > cap // 8:
            _fail(where, f"{name}={value} is more than the memory budget allows ({cap // 8} "
                         "elements)")


def _holds_callable(value: Any) -> bool:
    if isinstance(value, (list, tuple, set)):
        return any(_holds_callable(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_callable(v) for v in value.values())
    return callable(value) and not isinstance(value, type)


def _holds_text(value: Any) -> bool:
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, (list, tuple, set)):
        return any(_holds_text(v) for v in value)
    return False


def check_attributes(cls: type, attrs: dict, where: str, *, state: bool) -> None:
    """Names and values of the attributes a file sets on ``cls`` (``state``: set one by one with
    ``setattr``; otherwise passed to the constructor, which checks its own names)."""
    slots = _slots(cls)
    allowed_plain = _constructor_attributes(cls) if state else set()
    params = param_names(cls)
    foreign = cls.__module__.startswith("sklearn.")
    for name, value in attrs.items():
        if foreign and _holds_callable(value):
            # a kernel object where a scikit-learn class expects a function (SVC(kernel=...),
            # FunctionTransformer(func=...)) would be called on the caller's data
            _fail(where, f"{name}: a model file may not give {cls.__name__} a callable object")
        if state:
            check_name(cls, name, where, slots=slots)
            if name in params:
                _fail(where, f"state attribute {name!r} is a constructor parameter")
            if (_is_estimator_class(cls) and not name.endswith("_") and not name.startswith("_")
                    and name not in allowed_plain):
                _fail(where, f"state attribute {name!r} is neither fitted state (ending in '_'), "
                             f"private state (starting with '_') nor set by {cls.__name__}()")
        check_value(str(name), value, f"{where}.{name}")


def _is_estimator_class(cls: type) -> bool:
    from sklearn.base import BaseEstimator

    return issubclass(cls, BaseEstimator)


_CONSTRUCTOR_ATTRS: dict = {}


def _constructor_attributes(cls: type) -> frozenset:
    """Plain attributes the class's own constructor sets with its defaults (scikit-learn's
    libsvm classes set ``nu``, ``epsilon``... there); empty when it needs arguments."""
    if cls not in _CONSTRUCTOR_ATTRS:
        try:
            _CONSTRUCTOR_ATTRS[cls] = frozenset(vars(cls()))
        except Exception:  # noqa: BLE001 - a constructor with required arguments
            _CONSTRUCTOR_ATTRS[cls] = frozenset()
    return _CONSTRUCTOR_ATTRS[cls]


# ---------------------------------------------------------------------------------------------
# built objects: estimators, kernels and other parameter objects, dataclasses
# ---------------------------------------------------------------------------------------------
def check_estimator(est: Any, where: str) -> None:
    """An estimator rebuilt from a file: its parameters within the class's own constraints and
    its fitted state consistent where compiled code reads it unchecked."""
    if getattr(type(est), "_parameter_constraints", None) and hasattr(est, "_validate_params"):
        try:
            est._validate_params()
        except (ValueError, TypeError) as exc:
            _fail(where, f"parameters outside what {type(est).__name__} accepts: "
                         f"{str(exc)[:300]}")
    from sklearn.svm._base import BaseLibSVM

    if isinstance(est, BaseLibSVM):
        _check_libsvm(est, where)


def check_object(obj: Any, where: str) -> None:
    """A parameter object rebuilt from a file (a kernel, a landmark selector)."""
    from kernelflow.kernels import Kernel

    if isinstance(obj, Kernel):
        validate = getattr(obj, "validate", None)
        if callable(validate):
            try:
                validate()
            except (ValueError, TypeError) as exc:
                _fail(where, f"invalid {type(obj).__name__}: {str(exc)[:200]}")


def kernel_parts(node_counts: int, where: str) -> None:
    """Refuse a composite kernel of more than :data:`MAX_KERNEL_PARTS` kernels."""
    if node_counts > MAX_KERNEL_PARTS:
        _fail(where, f"a composite kernel of {node_counts} kernels (at most {MAX_KERNEL_PARTS}: "
                     "each one is evaluated on every kernel block at prediction)")


#: integers of kernelflow helper objects that size an allocation or a loop at prediction, and
#: the stored array whose shape they must match (``"=="``) or not exceed (``"<="``): a forged
#: ``r`` would make ``_TaylorMap.batch`` allocate an n x r matrix, a forged ``n_blocks`` would
#: regenerate blocks of random features that no stored coefficient uses. A rule whose
#: attributes an object lacks is skipped.
_SIZE_RULES: dict[str, tuple[tuple[str, str, int, str], ...]] = {
    "kernelflow.features.taylor:_TaylorMap": (
        ("r", "indices", 0, "=="), ("d", "indices", 1, "=="), ("r", "parent", 0, "=="),
        ("r", "var", 0, "=="), ("r", "scale", 0, "=="),
    ),
    "kernelflow.solvers.doubly_stochastic:DoublyStochasticModel": (
        ("n_blocks", "_coef", 0, "<="), ("block_size", "_coef", 1, "=="),
        ("n_outputs", "_coef", 2, "=="), ("_n_cached", "_coef", 0, "<="),
    ),
    "kernelflow.online._updates:GrowingCholeskyInverse": (
        ("n", "Linv", 0, "<="), ("n", "Linv", 1, "<="), ("n", "z", 0, "<="),
    ),
    "kernelflow.online._updates:RecursiveAWV": (
        ("r", "A_inv", 0, "=="), ("r", "A_inv", 1, "=="), ("r", "b", 0, "=="),
        ("r", "w", 0, "=="),
    ),
}


def check_state_object(obj: Any, where: str) -> None:
    """A helper object restored attribute by attribute: its size-like integers agree with the
    arrays it holds (:data:`_SIZE_RULES`)."""
    cls = type(obj)
    for name, array, axis, op in _SIZE_RULES.get(f"{cls.__module__}:{cls.__qualname__}", ()):
        value, arr = getattr(obj, name, None), getattr(obj, array, None)
        shape = getattr(arr, "shape", None)
        if value is None or shape is None:
            continue
        number = _int(value)
        if number is None or number < 0:
            _fail(where, f"{name} must be a non-negative integer")
        if len(shape) <= axis:
            _fail(where, f"{array} must have at least {axis + 1} dimensions")
        size = int(shape[axis])
        if (op == "==" and number != size) or (op == "<=" and number > size):
            _fail(where, f"{name}={number} does not match {array} (size {size} along axis "
                         f"{axis}): a size the stored arrays do not back")


def check_dataclass(obj: Any, where: str) -> None:
    """A dataclass rebuilt from a file; the engine's ``Options`` within this machine's bounds."""
    from kernelflow.operators import Options

    if isinstance(obj, Options):
        _check_options(obj, where)


def _check_options(opts: Any, where: str) -> None:
    cap = _limit()

    def bad(name, why):
        _fail(where, f"Options.{name}={getattr(opts, name)!r} {why}")

    mb = _int(opts.memory_budget)
    if opts.memory_budget is not None and not (mb is not None and 1 <= mb <= cap):
        bad("memory_budget", f"must be None or between 1 and this machine's budget ({cap} bytes)")
    mf = _real(opts.memory_fraction)
    if not (mf is not None and 0 < mf <= 0.95):
        bad("memory_fraction", "must be in (0, 0.95]")
    tb = _int(opts.tile_bytes)
    if not (tb is not None and 64 <= tb <= 2**26):
        bad("tile_bytes", "must be between 64 bytes and 64 MiB")
    te = _int(opts.tile_elements)
    if opts.tile_elements is not None and not (te is not None and 1 <= te <= 2**23):
        bad("tile_elements", "must be None or between 1 and 2**23")
    if not isinstance(opts.accumulate_float64, bool):
        bad("accumulate_float64", "must be a bool")
    dev = opts.device
    if dev is not None and not _DEVICE.match(str(dev)):
        bad("device", "must be None, 'cpu', 'cuda[:k]' or 'mps'")
    n = _int(opts.cholesky_max_size)
    if not (n is not None and 0 <= n <= max(30_000, math.isqrt(cap // 8))):
        bad("cholesky_max_size", f"must be an integer at most 30000 or whose n x n float64 "
                                 f"matrix fits the memory budget ({cap} bytes)")
    tol = _real(opts.cg_tol)
    if opts.cg_tol is not None and not (tol is not None and math.isfinite(tol) and 0 < tol < 1):
        bad("cg_tol", "must be None or in (0, 1)")


# ---------------------------------------------------------------------------------------------
# scikit-learn's libsvm estimators: compiled prediction on unchecked arrays
# ---------------------------------------------------------------------------------------------
def _array(est, name: str, dtype, ndim: int, where: str) -> np.ndarray:
    value: Any = getattr(est, name, None)
    if type(value) is not np.ndarray:
        _fail(where, f"{name} must be a NumPy array, got {type(value).__name__}")
    if value.dtype != np.dtype(dtype) or not value.dtype.isnative:
        _fail(where, f"{name} must be {np.dtype(dtype)} in native byte order, got "
                     f"{value.dtype.str}")
    if value.ndim != ndim or not value.flags.c_contiguous or not value.flags.aligned:
        _fail(where, f"{name} must be a C-contiguous {ndim}-d array, got shape {value.shape}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        _fail(where, f"{name} holds non-finite values")
    return value


def _check_libsvm(est: Any, where: str) -> None:
    """The arrays ``libsvm.predict`` reads through raw pointers, checked as libsvm assumes them.

    A forged ``SVC`` state (an index past the training rows, support counts that do not add
    up, a dual-coefficient matrix of the wrong shape) makes libsvm read and write outside its
    buffers: a crash, or garbage returned as predictions.
    """
    name = type(est).__name__
    where = f"{where} ({name} fitted state)"
    if not hasattr(est, "support_"):
        return  # not fitted: nothing compiled will read the state
    if getattr(est, "_sparse", None) is not False:
        _fail(where, "only models fitted on dense data are restored (_sparse must be False)")
    kernel = est.kernel
    if kernel not in ("linear", "poly", "rbf", "sigmoid", "precomputed"):
        _fail(where, f"kernel {str(kernel)[:40]!r} is not a libsvm kernel")
    support = _array(est, "support_", np.int32, 1, where)
    sv = _array(est, "support_vectors_", np.float64, 2, where)
    n_support = _array(est, "_n_support", np.int32, 1, where)
    dual = _array(est, "_dual_coef_", np.float64, 2, where)
    intercept = _array(est, "_intercept_", np.float64, 1, where)
    prob_a = _array(est, "_probA", np.float64, 1, where)
    prob_b = _array(est, "_probB", np.float64, 1, where)
    n_sv = _check_libsvm_support(est, where, kernel, support, sv)
    regression, n_class = _check_libsvm_classes(est, where, n_support, n_sv)
    _check_libsvm_coefficients(est, where, regression, n_class, n_sv, dual, intercept,
                               prob_a, prob_b)
    gamma = _real(getattr(est, "_gamma", None))
    if not (gamma is not None and math.isfinite(gamma) and gamma >= 0):
        _fail(where, "_gamma must be a finite non-negative number")
    cache = _real(est.cache_size)
    if not (cache is not None and 0 < cache and cache * 2**20 <= _memory_cap()):
        _fail(where, "cache_size exceeds the memory budget")
    _check_libsvm_public(est, where, not regression and n_class == 2, dual, intercept)


def _check_libsvm_support(est: Any, where: str, kernel: Any, support: np.ndarray,
                          sv: np.ndarray) -> int:
    """The training shape, the support vectors and their row indices; returns their number."""
    shape_fit: Any = getattr(est, "shape_fit_", None)
    if (not isinstance(shape_fit, tuple) or len(shape_fit) != 2
            or not all(_int(s) is not None and s >= 0 for s in shape_fit)):
        _fail(where, "shape_fit_ must be a pair of non-negative integers")
    n_rows, n_cols = int(shape_fit[0]), int(shape_fit[1])
    n_sv = len(support)
    if kernel == "precomputed":
        if sv.shape != (0, 0):
            _fail(where, "a precomputed-kernel model holds no support vectors")
        if n_cols != n_rows:
            _fail(where, "a precomputed kernel is square at fit (shape_fit_)")
    elif sv.shape != (n_sv, n_cols):
        _fail(where, f"support_vectors_ has shape {sv.shape}, expected ({n_sv}, {n_cols})")
    if getattr(est, "n_features_in_", None) != n_cols:
        _fail(where, "n_features_in_ does not match shape_fit_")
    if n_sv and (support.min() < 0 or support.max() >= n_rows):
        _fail(where, f"support_ indexes rows outside [0, {n_rows})")
    return n_sv


def _check_libsvm_classes(est: Any, where: str, n_support: np.ndarray,
                          n_sv: int) -> tuple[bool, int]:
    """The support counts per class; returns (regression or one-class model, number of
    classes, 2 for a regression)."""
    regression = est._impl in ("epsilon_svr", "nu_svr", "one_class")
    if regression:
        if n_support.shape != (2,) or not (n_support == n_sv).all():
            _fail(where, "_n_support must be [n_SV, n_SV] for a regression or one-class model")
        return True, 2
    n_class = len(n_support)
    classes = getattr(est, "classes_", None)
    if n_class < 2 or not isinstance(classes, np.ndarray) or classes.shape != (n_class,):
        _fail(where, "_n_support and classes_ must list the same (at least two) classes")
    if (n_support < 0).any() or int(n_support.sum(dtype=np.int64)) != n_sv:
        _fail(where, "_n_support does not add up to the number of support vectors")
    weights = getattr(est, "class_weight_", None)
    if not isinstance(weights, np.ndarray) or weights.shape != (n_class,):
        _fail(where, "class_weight_ must hold one weight per class")
    return False, n_class


def _check_libsvm_coefficients(est: Any, where: str, regression: bool, n_class: int, n_sv: int,
                               dual: np.ndarray, intercept: np.ndarray, prob_a: np.ndarray,
                               prob_b: np.ndarray) -> None:
    """The shapes of the dual coefficients, intercepts and probability calibration."""
    pairs = 1 if regression else n_class * (n_class - 1) // 2
    if dual.shape != (n_class - 1, n_sv):
        _fail(where, f"_dual_coef_ has shape {dual.shape}, expected ({n_class - 1}, {n_sv})")
    if intercept.shape != (pairs,):
        _fail(where, f"_intercept_ has shape {intercept.shape}, expected ({pairs},)")
    if prob_a.shape != prob_b.shape or len(prob_a) not in (0, pairs):
        _fail(where, "_probA and _probB must both be empty or hold one value per class pair")
    if getattr(est, "_effective_probability", False) and len(prob_a) == 0:
        _fail(where, "probability estimates are switched on but _probA is empty")


def _check_libsvm_public(est: Any, where: str, flip: bool, dual: np.ndarray,
                         intercept: np.ndarray) -> None:
    """The public copies scikit-learn derives from the private arrays at fit (sign flipped for
    two classes), and a completed fit."""
    public_dual = getattr(est, "dual_coef_", None)
    public_intercept = getattr(est, "intercept_", None)
    if not (isinstance(public_dual, np.ndarray)
            and np.array_equal(public_dual, -dual if flip else dual)):
        _fail(where, "dual_coef_ does not match _dual_coef_")
    if not (isinstance(public_intercept, np.ndarray)
            and np.array_equal(public_intercept, -intercept if flip else intercept)):
        _fail(where, "intercept_ does not match _intercept_")
    if getattr(est, "fit_status_", 0) != 0:
        _fail(where, "fit_status_ must be 0 (a completed fit)")
