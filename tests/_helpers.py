"""Plain helpers shared by the test modules (the fixtures built on them are in ``conftest.py``).

- :func:`one_thread`: one intra-op torch thread inside a ``with`` block, restored after;
- :func:`regression_data` and :func:`torch_regression_data`: the synthetic regression problems
  of the test modules, each module naming its own target function, size, range and noise;
- :func:`public_estimators` and :func:`declared_estimators`: the estimator classes the package
  exports, found by walking its public modules, and the registry as written in its source, which
  the common tests compare so that an estimator without a registry entry fails loudly.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator

import numpy as np
import torch
from sklearn.base import BaseEstimator

import kernelflow


# ---- threads -------------------------------------------------------------------------------------
@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for the block, then the previous count again.

    The test problems are small: with several threads on a shared, loaded machine the BLAS and
    LAPACK calls spend far longer waiting for threads than computing (100x for a 100 x 100 eigh).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- data ----------------------------------------------------------------------------------------
def regression_data(n: int, d: int, target: Callable[[np.ndarray], np.ndarray], *,
                    bounds: tuple[float, float] | None = (-1.0, 1.0), noise: float = 0.1,
                    seed: int | np.random.RandomState = 0) -> tuple[np.ndarray, np.ndarray]:
    """``X`` of shape ``(n, d)`` and ``y = target(X) + noise * N(0, 1)``.

    Both are drawn in that order from ``np.random.RandomState(seed)``, or from ``seed`` itself
    when it is a ``RandomState`` (a module that draws more from the same stream passes its own).
    ``X`` is uniform on ``bounds`` in every coordinate, or standard normal when ``bounds`` is
    None.
    """
    rng = seed if isinstance(seed, np.random.RandomState) else np.random.RandomState(seed)
    X = rng.randn(n, d) if bounds is None else rng.uniform(*bounds, size=(n, d))
    return X, target(X) + noise * rng.randn(n)


def torch_regression_data(n: int, d: int, target: Callable[[torch.Tensor], torch.Tensor], *,
                          normal: bool = False, noise: float = 0.1,
                          seed: int | torch.Generator = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 tensor counterpart of :func:`regression_data`.

    ``X`` is uniform on ``[-2, 2)`` in every coordinate (standard normal with ``normal=True``),
    then ``y = target(X) + noise * N(0, 1)``, both drawn from
    ``torch.Generator().manual_seed(seed)``, or from ``seed`` itself when it is a generator.
    """
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    if normal:
        X = torch.randn(n, d, dtype=torch.float64, generator=g)
    else:
        X = torch.rand(n, d, dtype=torch.float64, generator=g) * 4 - 2
    return X, target(X) + noise * torch.randn(n, dtype=torch.float64, generator=g)


def sine_cosine(X: np.ndarray) -> np.ndarray:
    """``sin(x_0) + cos(x_1) / 2``: the target of the distributed tests."""
    return np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1])


# ---- the estimators of the package ---------------------------------------------------------------
#: the package walked
PACKAGE = kernelflow.__name__


def interrupt_cg(monkeypatch, module, after: int | None) -> list[int]:
    """Replace ``module.conjugate_gradient`` by one whose callback raises KeyboardInterrupt after
    iteration ``after`` (None: never); returns the list of iterations seen."""
    orig = module.conjugate_gradient
    seen: list[int] = []

    def wrapped(*args, callback=None, **kw):
        def cb(k, X, R):
            seen.append(k)
            stop = callback(k, X, R)
            if after is not None and k == after:
                raise KeyboardInterrupt
            return stop
        return orig(*args, callback=cb, **kw)

    monkeypatch.setattr(module, "conjugate_gradient", wrapped)
    return seen


def _public_modules() -> Iterator[str]:
    """``kernelflow`` and every module or package below it with no ``_``-prefixed part."""
    yield PACKAGE
    for info in pkgutil.walk_packages(kernelflow.__path__, PACKAGE + "."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            yield info.name


def _exported(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if not n.startswith("_")]


def _is_estimator(obj) -> bool:
    """A class of the library (not one it imports from scikit-learn) deriving from
    ``BaseEstimator``."""
    return (isinstance(obj, type) and issubclass(obj, BaseEstimator)
            and obj.__module__.split(".")[0] == PACKAGE)


def public_estimators() -> tuple[dict[type, list[str]], dict[str, str]]:
    """The estimator classes exported by the public modules of the package.

    Every public module (none of its parts starts with ``_``) is imported; the classes it exports
    (its ``__all__``, or its names without a leading ``_`` when it has none) that are estimators
    (:func:`_is_estimator`) are collected, wherever they are defined. Returns ``{class: [modules
    exporting it]}`` and ``{module: error}`` for the modules that failed to import, so that a
    broken module is reported rather than skipped.
    """
    found: dict[type, list[str]] = {}
    errors: dict[str, str] = {}
    for name in _public_modules():
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        for attr in _exported(module):
            obj = getattr(module, attr, None)
            if _is_estimator(obj):
                found.setdefault(obj, []).append(name)
    return found, errors


def declared_estimators() -> dict[str, str]:
    """``kernelflow.registry.ESTIMATORS`` as written in its source: ``{name: "module:Class"}``.

    The registry module is executed afresh, apart from the imported one, whose dictionary
    :func:`kernelflow.registry.discover` and the plugins' entry points extend at run time (a
    public estimator without an entry would be found there under a derived name).
    """
    spec = importlib.util.find_spec("kernelflow.registry")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return dict(fresh.ESTIMATORS)


def import_path(path: str):
    """The object a ``"module:Qual.Name"`` path names."""
    module, _, qualname = path.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
