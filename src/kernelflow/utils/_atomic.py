"""All-or-nothing fits: a fit that does not return leaves the estimator exactly as it was.

:class:`AtomicFitMixin` wraps, in every subclass, the methods that change the fitted state
(``fit``, ``partial_fit``, ``learn_one``, ``progressive_predict``). Each wrapped call

- records the instance ``__dict__`` before running;
- for a *fresh* fit (``fit`` without ``warm_start``) removes the previous fitted state first, so
  the fit builds every fitted attribute anew and cannot mutate the old ones in place: the state
  left at the end is exactly the new model, with no attribute surviving from the previous fit;
- for a *continuing* call (``partial_fit``, ``learn_one``, a ``warm_start`` fit) deep-copies the
  fitted state before the call, because these update arrays and tensors in place;
- on any :class:`BaseException` (``KeyboardInterrupt``, an exception raised by a callback, a
  ``DivergenceError``, a ``MemoryError``) puts the recorded ``__dict__`` back and re-raises;
  an allocator's own failure (torch's "can't allocate memory", CUDA out of memory, NumPy's
  "Unable to allocate") is re-raised as a ``MemoryError`` with advice (smaller sizes, float32,
  ``Options(memory_budget=...)``).

A new estimator deriving from one of the base classes gets this without writing anything.
Calls nested on the same instance (``fit`` calling ``super().fit`` or ``partial_fit``) are
protected once, by the outermost call.

A scikit-learn meta-estimator is not covered by the mixin: ``Pipeline.fit`` refits its steps one
after the other, in place, so an interrupted refit leaves new early steps (a scaler fitted on the
new data) in front of the old final step, which then predicts from inputs it was not fitted on.
:func:`all_or_nothing` gives any estimator tree, a loaded model included, the same guarantee.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from typing import Any

import numpy as np
import torch

from ._params import param_names

__all__ = ["AtomicFitMixin", "all_or_nothing", "atomic_fit", "finite_output",
           "fitted_state_keys"]

#: Methods wrapped in every subclass (when the subclass defines them).
ATOMIC_METHODS = ("fit", "partial_fit", "learn_one", "progressive_predict")

#: Prefixes of the private attributes that scikit-learn itself sets on an estimator.
_SKLEARN_PRIVATE = ("_sklearn", "_skl_", "_metadata_request", "_parent_callback", "_callback")

_active = threading.local()


def _active_ids() -> set:
    ids = getattr(_active, "ids", None)
    if ids is None:
        ids = _active.ids = set()
    return ids


def fitted_state_keys(est) -> list:
    """Names in ``est.__dict__`` that are fitted state rather than parameters or configuration.

    Constructor parameters and scikit-learn's own configuration and callback bookkeeping
    (``_sklearn_output_config``, ``_metadata_request``, ``_skl_callbacks``,
    ``_parent_callback_ctx``...) are not fitted state.
    """
    params = param_names(type(est))
    return [k for k in est.__dict__ if k not in params and not k.startswith(_SKLEARN_PRIVATE)]


def _is_fresh(est, name: str) -> bool:
    """Whether the call rebuilds the model from nothing (the old state is then set aside)."""
    if name != "fit":
        return False
    fresh = getattr(type(est), "_atomic_fit_is_fresh", None)
    if fresh is not None:
        return bool(fresh(est))
    return not bool(getattr(est, "warm_start", False))


_ATOMS = (type(None), bool, int, float, complex, str, bytes, range, type, frozenset,
          type(len), type(lambda: None))
_MISSING = object()


#: ``object.__getstate__`` (Python 3.11 and later; None before, when classes inherit none)
_DEFAULT_GETSTATE = getattr(object, "__getstate__", None)


def _plain(t) -> bool:
    """Objects copied field by field: plain ``__dict__`` classes with default pickling."""
    return (getattr(t, "__deepcopy__", None) is None and "__slots__" not in t.__dict__
            and t.__reduce_ex__ is object.__reduce_ex__ and t.__reduce__ is object.__reduce__
            and getattr(t, "__getstate__", _DEFAULT_GETSTATE) is _DEFAULT_GETSTATE
            and getattr(t, "__setstate__", None) is None)


def state_copy(obj, memo: dict):
    """Deep copy of fitted state, faster than :func:`copy.deepcopy` on plain objects.

    Arrays are copied with their memory order, tensors through ``copy.deepcopy`` (which keeps
    views of one storage together), objects with an ``__atomic_copy__(memo)`` method by it
    (e.g. growing buffers that copy their used part only), containers and plain objects field by
    field; anything else goes to ``copy.deepcopy``. Same ``memo`` protocol as ``copy.deepcopy``.
    """
    r = memo.get(id(obj), _MISSING)
    if r is not _MISSING:
        return r
    t: Any = type(obj)  # any class: the plain ones are rebuilt with their own __new__
    if t in _ATOMS:
        return obj
    if t is np.ndarray:
        r = obj.copy(order="K")
    elif t is list:
        r = []
        memo[id(obj)] = r
        r.extend(state_copy(v, memo) for v in obj)
    elif t is dict:
        r = {}
        memo[id(obj)] = r
        for k, v in obj.items():
            r[k] = state_copy(v, memo)
    elif t is tuple:
        r = tuple(state_copy(v, memo) for v in obj)
    elif t is np.random.RandomState:
        r = np.random.RandomState()
        r.set_state(obj.get_state(legacy=False))
    elif t is np.random.Generator:
        bg = type(obj.bit_generator)()
        bg.state = obj.bit_generator.state
        r = np.random.Generator(bg)
    elif hasattr(t, "__atomic_copy__"):
        r = obj.__atomic_copy__(memo)
    elif hasattr(obj, "__dict__") and _plain(t) and not isinstance(obj, torch.Tensor):
        r = t.__new__(t)
        memo[id(obj)] = r
        r.__dict__.update({k: state_copy(v, memo) for k, v in obj.__dict__.items()})
    else:
        r = copy.deepcopy(obj, memo)
    memo[id(obj)] = r
    memo.setdefault(id(memo), []).append(obj)  # keep the original alive, as deepcopy does
    return r


def _snapshot(est, deep: bool) -> dict:
    saved = dict(est.__dict__)
    if not deep:
        return saved
    # parameters are never mutated by a fit and may hold objects that cannot be copied
    # (callbacks, open resources): keep them by identity
    params = param_names(type(est))
    memo = {id(v): v for k, v in saved.items() if k in params}
    # fitted attributes a class declares as replaced, never mutated in place, once created
    # (feature maps, frequencies, key lists): kept by identity, so that a continuing call such
    # as ``learn_one`` copies only the state it really updates
    shared = getattr(type(est), "_atomic_shared", ())
    for k in fitted_state_keys(est):
        if k in shared:
            continue
        saved[k] = state_copy(saved[k], memo)
    return saved


def _restore(est, saved: dict) -> None:
    # a second interrupt during the restore must not leave a mix: redo it until it completes
    while True:
        try:
            d = est.__dict__
            d.clear()
            d.update(saved)
            return
        except BaseException:  # noqa: BLE001 - retry whatever interrupted the restore
            continue


def _nested_estimators(value, out: list) -> None:
    """Estimators held by a parameter value (``steps``, ``transformer_list``, ``estimator``)."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _nested_estimators(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _nested_estimators(v, out)
    elif hasattr(value, "get_params") and hasattr(value, "__dict__") and not isinstance(
            value, type):
        out.append(value)


def _tree_snapshot(est, memo: dict, seen: set, saved: list) -> None:
    if id(est) in seen:
        return
    seen.add(id(est))
    params = param_names(type(est))
    state = dict(est.__dict__)
    for k in fitted_state_keys(est):
        state[k] = state_copy(state[k], memo)
    saved.append((est, state))
    children: list = []
    for k in params:
        value = est.__dict__.get(k)
        if isinstance(value, list):
            saved.append((value, list(value)))  # Pipeline.steps is assigned item by item
            for item in value:
                if isinstance(item, list):
                    saved.append((item, list(item)))
        _nested_estimators(value, children)
    for child in children:
        _tree_snapshot(child, memo, seen, saved)


@contextlib.contextmanager
def all_or_nothing(estimator):
    """Put ``estimator`` and every estimator it holds back as they were if the block raises.

    For meta-estimators that refit their parts in place, one after the other (scikit-learn's
    ``Pipeline``, ``FeatureUnion``, ``TransformedTargetRegressor``): the instance dictionaries
    of the whole tree (found through the constructor parameters) and the lists of steps are
    recorded, the fitted state deep-copied; on any ``BaseException`` (``KeyboardInterrupt``, an
    error in a late step) all of it is put back and the exception re-raised. Cost: one copy of
    the fitted state of the tree.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from kernelflow.estimators import KernelRidge
    >>> rng = np.random.default_rng(0)
    >>> pipe = make_pipeline(StandardScaler(), KernelRidge(alpha=0.1))
    >>> pipe = pipe.fit(rng.normal(size=(20, 2)), rng.normal(size=20))
    >>> before = pipe.predict(np.zeros((1, 2)))
    >>> try:
    ...     with all_or_nothing(pipe):  # the scaler refits, then the model refuses the NaN
    ...         pipe.fit(10 * rng.normal(size=(20, 2)), np.full(20, np.nan))
    ... except ValueError:
    ...     pass
    >>> bool(np.array_equal(pipe.predict(np.zeros((1, 2))), before))
    True
    """
    saved: list = []
    _tree_snapshot(estimator, {}, set(), saved)
    try:
        yield estimator
    except BaseException:
        for obj, content in saved:
            if isinstance(obj, list):
                while True:  # as _restore: a second interrupt must not leave a mix
                    try:
                        obj[:] = content
                        break
                    except BaseException:  # noqa: BLE001
                        continue
            else:
                _restore(obj, content)
        raise


_ALLOCATOR_MESSAGES = ("can't allocate memory", "cannot allocate memory", "out of memory",
                       "unable to allocate", "defaultcpuallocator")


def _is_raw_allocation_failure(exc: BaseException) -> bool:
    """An allocator's own error (torch, NumPy, CUDA), as opposed to a budget refusal of ours."""
    if getattr(exc, "__kernelflow_advice__", False):
        return False
    text = str(exc).lower()
    if isinstance(exc, MemoryError):
        return "memory budget" not in text and "memory_budget" not in text
    oom = getattr(__import__("torch"), "OutOfMemoryError", ())
    if oom and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and any(m in text for m in _ALLOCATOR_MESSAGES)


def _memory_advice(est, name: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    # CUDA's error names the device ("CUDA out of memory"): report that device's free memory
    on_gpu = "cuda" in first.lower() and torch.cuda.is_available()
    try:
        from ..operators import available_memory

        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
        free = f"{available_memory(device) / 2**30:.2f} GiB"
    except Exception:  # noqa: BLE001 - advice only
        free = "unknown"
    limits = "free GPU memory" if on_gpu else "host, cgroup and RLIMIT_AS limits"
    return (
        f"{type(est).__name__}.{name} ran out of memory ({first}). This process may use about "
        f"{free} now ({limits}). Lower the problem size (fewer rows, "
        "n_components, block_size or degree), use float32 where the estimator offers dtype, or "
        "set options=Options(memory_budget=...) below that figure. The estimator is left as it "
        "was before the call."
    )


def atomic_fit(method, name: str | None = None):
    """Wrap a state-changing method so that it is all-or-nothing (see the module docstring)."""
    if getattr(method, "__kernelflow_atomic__", False):
        return method
    name = name or method.__name__

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        ids = _active_ids()
        key = id(self)
        if key in ids:  # nested call on the same instance: the outer call protects it
            return method(self, *args, **kwargs)
        ids.add(key)
        saved = None
        try:
            fresh = _is_fresh(self, name)
            saved = _snapshot(self, deep=not fresh)
            if fresh:
                for k in fitted_state_keys(self):
                    del self.__dict__[k]
            return method(self, *args, **kwargs)
        except BaseException as exc:
            if saved is not None:
                _restore(self, saved)
            if _is_raw_allocation_failure(exc):
                raise MemoryError(_memory_advice(self, name, exc)) from exc
            raise
        finally:
            ids.discard(key)

    vars(wrapper)["__kernelflow_atomic__"] = True  # a marker the wrapper type does not declare
    return wrapper


#: Methods whose floating-point results are checked for NaN and infinity (a last safeguard: the
#: causes, inputs and parameters out of range, are refused where they enter).
CHECKED_OUTPUTS = ("predict", "decision_function", "score_samples", "transform")


def finite_output(method, name: str | None = None):
    """Wrap a prediction method so that a non-finite float result raises ``ValueError``."""
    if getattr(method, "__kernelflow_finite__", False):
        return method
    from ._finite import check_finite_output

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        check_finite_output(type(self).__name__, out, name or method.__name__)
        return out

    vars(wrapper)["__kernelflow_finite__"] = True  # a marker the wrapper type does not declare
    return wrapper


class AtomicFitMixin:
    """Make ``fit``/``partial_fit``/``learn_one``/``progressive_predict`` all-or-nothing.

    Every class deriving from this mixin has the methods named in :data:`ATOMIC_METHODS` that it
    defines wrapped by :func:`atomic_fit`. A class may define ``_atomic_fit_is_fresh(self)`` to
    say when its ``fit`` starts from nothing (default: unless ``warm_start`` is true). The
    methods named in :data:`CHECKED_OUTPUTS` raise ``ValueError`` rather than return NaN or
    infinity.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators import KernelRidge
    >>> rng = np.random.default_rng(0)
    >>> est = KernelRidge(alpha=0.1).fit(rng.normal(size=(20, 2)), rng.normal(size=20))
    >>> before = est.predict(np.zeros((1, 2)))
    >>> try:
    ...     est.fit(rng.normal(size=(20, 3)), np.full(20, np.nan))
    ... except ValueError:
    ...     pass
    >>> bool(np.array_equal(est.predict(np.zeros((1, 2))), before)), est.n_features_in_
    (True, 2)
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ATOMIC_METHODS:
            method = cls.__dict__.get(name)
            if callable(method):
                setattr(cls, name, atomic_fit(method, name))
        for name in CHECKED_OUTPUTS:
            method = cls.__dict__.get(name)
            if callable(method):
                setattr(cls, name, finite_output(method, name))
