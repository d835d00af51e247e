"""Names of the estimators, for the command line, model files and plugins.

Each entry maps a short, stable name (``"kernel_ridge"``) to a lazy import path
(``"kernelflow.estimators.kernel_ridge:KernelRidge"``), so looking a name up imports only the
module that defines it. Model files record the name beside the class path, which lets a file
survive a class moving to another module.

Third-party estimators join with :func:`register` or, when installed as a package, through the
``kernelflow.estimators`` entry-point group (``name = "package.module:Class"``).

Examples
--------
>>> from kernelflow.registry import get_estimator_class, name_of
>>> cls = get_estimator_class("sklearn_kernel_ridge")
>>> cls.__name__
'KernelRidge'
>>> name_of(cls())
'sklearn_kernel_ridge'
"""

from __future__ import annotations

import importlib
import logging
from difflib import get_close_matches

logger = logging.getLogger(__name__)

__all__ = [
    "ESTIMATORS",
    "register",
    "get_estimator_class",
    "make_estimator",
    "available_estimators",
    "name_of",
    "class_path",
    "discover",
]

_E = "kernelflow.estimators."
_O = "kernelflow.online."

#: name -> "module:Class". Names are lower-case with underscores; lookups also accept the
#: class name (``"KernelRidge"``) and hyphens.
ESTIMATORS: dict[str, str] = {
    # exact and spectral
    "kernel_ridge": _E + "kernel_ridge:KernelRidge",
    "kernel_ridge_cv": _E + "kernel_ridge_cv:KernelRidgeCV",
    "kernel_ridge_classifier": _E + "kernel_ridge_classifier:KernelRidgeClassifier",
    "gradient_flow": _E + "gradient_flow:KernelGradientFlow",
    # early-stopped paths (Allerbo): ridge-like, robust, sparse
    "gradient_descent": _E + "gradient_descent:KernelGradientDescent",
    "sign_gradient": _E + "sign_gradient:KernelSignGradient",
    "coordinate_descent": _E + "coordinate_descent:KernelCoordinateDescent",
    "gradient_descent_cv": _E + "path_cv:KernelGradientDescentCV",
    "sign_gradient_cv": _E + "path_cv:KernelSignGradientCV",
    "coordinate_descent_cv": _E + "path_cv:KernelCoordinateDescentCV",
    # explicit penalties and robust losses
    "penalized": _E + "penalized:PenalizedKernelRegressor",
    "penalized_cv": _E + "penalized_cv:PenalizedKernelRegressorCV",
    "huber": _E + "huber:KernelHuberRegressor",
    "tukey": _E + "tukey:KernelTukeyRegressor",
    "quantile": _E + "quantile:KernelQuantileRegressor",
    # Nystrom
    "nystrom_ridge": _E + "nystrom_ridge:NystromKernelRidge",
    "nystrom_robust": _E + "nystrom_robust:NystromRobustRegressor",
    "nystrom_ridge_classifier": _E + "kernel_ridge_classifier:NystromKernelRidgeClassifier",
    "nystrom_logistic": _E + "nystrom_logistic:NystromKernelLogisticRegression",
    "nystroem": _E + "nystroem:Nystroem",
    # doubly stochastic
    "doubly_stochastic": _E + "doubly_stochastic_regressor:DoublyStochasticRegressor",
    "doubly_stochastic_classifier": _E
    + "doubly_stochastic_classifier:DoublyStochasticClassifier",
    "doubly_stochastic_novelty": _E + "doubly_stochastic_novelty:DoublyStochasticNoveltyDetector",
    # online
    "kawv": _O + "kawv:KernelAWV",
    "pkawv_nystrom": _O + "pkawv_nystrom:PKAWVNystrom",
    "pkawv_taylor": _O + "pkawv_taylor:PKAWVTaylor",
    "fogd": _O + "fogd:FOGD",
    "pros_n_kons": _O + "prosnkons:ProsNKONS",
    # scikit-learn baselines, useful on the command line and in comparisons
    "sklearn_kernel_ridge": "sklearn.kernel_ridge:KernelRidge",
    "sklearn_huber": "sklearn.linear_model:HuberRegressor",
    "sklearn_ridge": "sklearn.linear_model:Ridge",
}

#: packages scanned by :func:`discover` for public estimators that have no entry yet
DISCOVERY_PACKAGES = ("kernelflow.estimators", "kernelflow.online")

_ENTRY_POINTS_LOADED = False


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="kernelflow.estimators"):
            ESTIMATORS.setdefault(_normalise(ep.name), ep.value)
    except Exception as exc:  # a broken plugin must not break the library
        logger.warning("could not read kernelflow.estimators entry points: %s", exc)


_DISCOVERED = False


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def discover() -> list[str]:
    """Register public estimators of ``DISCOVERY_PACKAGES`` that have no entry yet.

    A class is public when its module (not starting with ``_``) lists it in ``__all__`` and it
    derives from scikit-learn's ``BaseEstimator``; its name is the snake-case class name
    (``DoublyStochasticClassifier`` -> ``doubly_stochastic_classifier``). Modules that fail
    to import are skipped. Returns the names added.

    Examples
    --------
    >>> isinstance(discover(), list)
    True
    """
    import pkgutil

    from sklearn.base import BaseEstimator

    known = set(ESTIMATORS.values())
    added = []
    for pkg_name in DISCOVERY_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except Exception as exc:  # noqa: BLE001
            logger.debug("cannot scan %s: %s", pkg_name, exc)
            continue
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
            if info.name.startswith("_"):
                continue
            module_name = f"{pkg_name}.{info.name}"
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - a broken module must not hide the others
                logger.debug("skipping %s: %s", module_name, exc)
                continue
            for attr in getattr(module, "__all__", ()):
                obj = getattr(module, attr, None)
                if (
                    isinstance(obj, type)
                    and issubclass(obj, BaseEstimator)
                    and obj.__module__ == module_name
                    and not attr.startswith("_")
                    and not attr.endswith("Mixin")
                ):
                    path = f"{module_name}:{attr}"
                    if path in known:
                        continue
                    key = _snake(attr)
                    if key in ESTIMATORS:
                        key = f"{info.name}_{key}"
                    ESTIMATORS[key] = path
                    known.add(path)
                    added.append(key)
    return added


def _discover_once() -> None:
    global _DISCOVERED
    if not _DISCOVERED:
        _DISCOVERED = True
        discover()


def _normalise(name: str) -> str:
    return str(name).strip().replace("-", "_").lower()


def register(name: str, path: str, *, overwrite: bool = False) -> None:
    """Register an estimator under ``name``.

    Parameters
    ----------
    name : str
        Short name (lower-case, underscores).
    path : str
        Lazy import path ``"package.module:ClassName"``.
    overwrite : bool, default=False
        Replace an existing entry instead of raising ``ValueError``.

    Examples
    --------
    >>> register("my_ridge", "sklearn.linear_model:Ridge")
    >>> get_estimator_class("my_ridge").__name__
    'Ridge'
    >>> _ = ESTIMATORS.pop("my_ridge")
    """
    key = _normalise(name)
    if ":" not in path:
        raise ValueError(f"import path must look like 'package.module:Class', got {path!r}.")
    if key in ESTIMATORS and not overwrite and ESTIMATORS[key] != path:
        raise ValueError(f"estimator name {key!r} is already registered ({ESTIMATORS[key]}).")
    ESTIMATORS[key] = path


def _import(path: str):
    module, _, qualname = path.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve_name(name: str) -> str:
    _load_entry_points()
    key = _normalise(name)
    if key in ESTIMATORS:
        return key
    # also accept class names, e.g. "KernelRidge" -> kernel_ridge (first match wins)
    for k, path in ESTIMATORS.items():
        if path.rpartition(":")[2].lower() == key and not k.startswith("sklearn_"):
            return k
    for k, path in ESTIMATORS.items():
        if path.rpartition(":")[2].lower() == key:
            return k
    if not _DISCOVERED:
        _discover_once()
        return _resolve_name(name)
    hint = get_close_matches(key, list(ESTIMATORS), n=3)
    extra = f" Did you mean {', '.join(hint)}?" if hint else ""
    raise KeyError(
        f"unknown model name {name!r}.{extra} Known names: {', '.join(sorted(ESTIMATORS))}."
    )


def get_estimator_class(name: str) -> type:
    """Return the estimator class registered under ``name`` (imports its module).

    Raises ``KeyError`` for an unknown name and ``ImportError`` when the module is missing.

    Examples
    --------
    >>> get_estimator_class("sklearn_ridge").__name__
    'Ridge'
    """
    key = _resolve_name(name)
    try:
        return _import(ESTIMATORS[key])
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"model {key!r} ({ESTIMATORS[key]}) cannot be imported: {exc}") from exc


def make_estimator(name: str, **params):
    """Instantiate the estimator registered under ``name`` with ``params``.

    Examples
    --------
    >>> make_estimator("sklearn_ridge", alpha=2.0)
    Ridge(alpha=2.0)
    """
    cls = get_estimator_class(name)
    valid = set(cls().get_params(deep=False)) if hasattr(cls, "get_params") else set()
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for model {_resolve_name(name)!r}; "
            f"valid parameters: {', '.join(sorted(valid))}."
        )
    return cls(**params)


def available_estimators(*, include_sklearn: bool = True) -> dict[str, type]:
    """Registered estimators whose module imports, as ``{name: class}`` sorted by name.

    Public estimators of the library that have no entry yet are added first (:func:`discover`);
    entries whose module does not import are skipped with a debug log message.

    Examples
    --------
    >>> "sklearn_ridge" in available_estimators()
    True
    """
    _load_entry_points()
    discover()
    out = {}
    for name in sorted(ESTIMATORS):
        if not include_sklearn and ESTIMATORS[name].startswith("sklearn."):
            continue
        try:
            out[name] = _import(ESTIMATORS[name])
        except Exception as exc:  # noqa: BLE001 - a broken module must not hide the others
            logger.debug("skipping estimator %s: %s", name, exc)
    return out


def class_path(obj_or_cls) -> str:
    """``"module:QualName"`` of an object or class.

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> class_path(Ridge)
    'sklearn.linear_model._ridge:Ridge'
    """
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}:{cls.__qualname__}"


def name_of(estimator) -> str | None:
    """Registered name of an estimator (object or class), or ``None`` if it has none."""
    _load_entry_points()
    cls = estimator if isinstance(estimator, type) else type(estimator)
    for name, path in ESTIMATORS.items():
        module, _, qualname = path.partition(":")
        if cls.__qualname__ != qualname:
            continue
        if cls.__module__ == module or cls.__module__.startswith(module + "."):
            return name
        try:
            if _import(path) is cls:
                return name
        except Exception:  # noqa: BLE001
            continue
    return None
