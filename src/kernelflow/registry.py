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
    "huber_gradient_descent": _E + "huber_path:KernelHuberGradientDescent",
    "huber_gradient_descent_cv": _E + "huber_path:KernelHuberGradientDescentCV",
    # explicit penalties and robust losses
    "penalized": _E + "penalized:PenalizedKernelRegressor",
    "penalized_cv": _E + "penalized_cv:PenalizedKernelRegressorCV",
    "huber": _E + "huber:KernelHuberRegressor",
    "tukey": _E + "tukey:KernelTukeyRegressor",
    "quantile": _E + "quantile:KernelQuantileRegressor",
    "quantile_apg": _E + "quantile_apg:KernelQuantileRegressorAPG",
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


# ---------------------------------------------------------------------------------------------
# classes a model file may name
# ---------------------------------------------------------------------------------------------
#: kernelflow modules and packages whose classes a model file may name: the estimators, kernels,
#: ``Options``, selectors, online learners and the helper objects and dataclasses they hold. Every
#: class *defined* in one of these modules (or in a module of one of these packages) is found
#: automatically; modules that read or write files, start processes or talk to a network are
#: deliberately absent (command line, datasets, data sources, distributed launcher, plotting).
MODEL_CLASS_MODULES = (
    "kernelflow.kernels",
    "kernelflow.operators",
    "kernelflow.linalg",
    "kernelflow.estimators",
    "kernelflow.online",
    "kernelflow.solvers",
    "kernelflow.landmarks",
    "kernelflow.features",
)

#: scikit-learn packages whose public estimators (their ``__all__``) a model file may name, so
#: that pipelines of scaling, imputation and feature steps around a kernelflow model load; the
#: packages of the scikit-learn entries of :data:`ESTIMATORS` are added to these.
SKLEARN_MODEL_PACKAGES = (
    "sklearn.pipeline",
    "sklearn.compose",
    "sklearn.preprocessing",
    "sklearn.impute",
    "sklearn.feature_selection",
    "sklearn.kernel_approximation",
    "sklearn.decomposition",
    "sklearn.linear_model",
    "sklearn.kernel_ridge",
    "sklearn.svm",
    "sklearn.dummy",
)

#: public estimators of those packages that a model file may *not* name: what they do after
#: loading cannot be bounded by checking the file. Dictionary learning, sparse coding, sparse PCA
#: and LDA run iterative solvers (and, with ``n_jobs``, worker processes) at ``transform``; NMF
#: runs its solver at ``transform``; ``PolynomialCountSketch`` and ``PolynomialFeatures``
#: allocate output widths read from fitted integers; ``OneHotEncoder`` (and ``KBinsDiscretizer``,
#: which holds one) and ``MultiLabelBinarizer`` build sparse matrices whose column indices come
#: from fitted state and which SciPy densifies without checking them; ``SplineTransformer`` holds
#: SciPy splines the format cannot store; ``IterativeImputer`` and ``TargetEncoder`` hold fitted
#: sub-models or folds outside the format. Registering one of them explicitly
#: (:func:`register`) admits it again.
SKLEARN_REFUSED = frozenset({
    "DictionaryLearning", "MiniBatchDictionaryLearning", "SparseCoder", "SparsePCA",
    "MiniBatchSparsePCA", "LatentDirichletAllocation", "NMF", "MiniBatchNMF",
    "PolynomialCountSketch", "PolynomialFeatures", "OneHotEncoder", "KBinsDiscretizer",
    "MultiLabelBinarizer", "SplineTransformer", "IterativeImputer", "TargetEncoder",
})

#: kinds of model-file classes, as the node types of the format name them
CLASS_KINDS = ("estimator", "object", "dataclass", "state_object")

_MODEL_CLASSES: dict[str, tuple[type, str]] = {}
_MODEL_CLASSES_KEY: tuple | None = None
_SKLEARN_SCANNED: set[str] = set()


def _class_kind(cls: type) -> str | None:
    import dataclasses

    from sklearn.base import BaseEstimator

    if issubclass(cls, BaseException):
        return None
    # the same order of tests as the saver (kernelflow.io._Writer.encode)
    if issubclass(cls, BaseEstimator):
        return "estimator"
    if callable(getattr(cls, "get_params", None)):
        return "object"
    if dataclasses.is_dataclass(cls) and all(f.init for f in dataclasses.fields(cls)):
        return "dataclass"
    return "state_object"


def _iter_model_modules():
    import pkgutil

    for name in MODEL_CLASS_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a broken module must not hide the others
            logger.debug("model classes: cannot import %s: %s", name, exc)
            continue
        yield module
        path = getattr(module, "__path__", None)
        if path is None:
            continue
        for info in pkgutil.walk_packages(path, prefix=name + "."):
            if info.name.rpartition(".")[2].startswith("_native"):
                continue
            try:
                yield importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001
                logger.debug("model classes: cannot import %s: %s", info.name, exc)


def _add_class(table: dict, cls: type) -> None:
    kind = _class_kind(cls)
    if kind is not None:
        table[class_path(cls)] = (cls, kind)


def model_classes() -> dict[str, tuple[type, str]]:
    """Every class a model file may name, as ``{"module:QualName": (class, kind)}``.

    The table is derived, not written by hand: it holds every class defined in the modules of
    :data:`MODEL_CLASS_MODULES` (estimators, kernels, ``Options``, selectors, online learners,
    helper objects and dataclasses), every entry of :data:`ESTIMATORS` (scikit-learn baselines,
    entries added with :func:`register` or by installed plugins) and the public estimators of
    :data:`SKLEARN_MODEL_PACKAGES` (looked up on demand) except :data:`SKLEARN_REFUSED`.
    ``kind`` is how a model file stores
    it: ``"estimator"``, ``"object"`` (rebuilt from ``get_params``), ``"dataclass"`` or
    ``"state_object"`` (attributes restored without ``__init__``). Exception classes are never
    listed. The table is rebuilt when :data:`ESTIMATORS` changes.

    Examples
    --------
    >>> table = model_classes()
    >>> table["kernelflow.kernels:Gaussian"][1]
    'object'
    >>> table["kernelflow.operators:Options"][1]
    'dataclass'
    >>> "os:system" in table
    False
    """
    global _MODEL_CLASSES_KEY
    _load_entry_points()
    _discover_once()
    key = tuple(sorted(ESTIMATORS.items()))
    if _MODEL_CLASSES_KEY == key:
        return _MODEL_CLASSES
    table: dict[str, tuple[type, str]] = {}
    for module in _iter_model_modules():
        for obj in list(vars(module).values()):
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                _add_class(table, obj)
    for name, path in ESTIMATORS.items():
        try:
            cls = _import(path)
        except Exception as exc:  # noqa: BLE001 - a broken entry must not hide the others
            logger.debug("model classes: skipping %s (%s): %s", name, path, exc)
            continue
        if isinstance(cls, type):
            _add_class(table, cls)
    _SKLEARN_SCANNED.clear()  # scikit-learn packages are scanned again on demand
    _MODEL_CLASSES.clear()
    _MODEL_CLASSES.update(table)
    _MODEL_CLASSES_KEY = key
    return _MODEL_CLASSES


def _sklearn_packages() -> list[str]:
    packages = list(SKLEARN_MODEL_PACKAGES)
    for path in ESTIMATORS.values():
        module = path.partition(":")[0]
        if module.startswith("sklearn."):
            package = ".".join(module.split(".")[:2])
            if package not in packages:
                packages.append(package)
    return packages


def _scan_sklearn_package(package: str) -> None:
    """Add the public estimators (``__all__``) of one allowed scikit-learn package."""
    from sklearn.base import BaseEstimator

    if package in _SKLEARN_SCANNED:
        return
    _SKLEARN_SCANNED.add(package)
    try:
        module = importlib.import_module(package)
    except Exception as exc:  # noqa: BLE001
        logger.debug("model classes: cannot import %s: %s", package, exc)
        return
    for attr in getattr(module, "__all__", ()):
        obj = vars(module).get(attr)
        if isinstance(obj, type) and issubclass(obj, BaseEstimator) and attr not in SKLEARN_REFUSED:
            _MODEL_CLASSES.setdefault(class_path(obj), (obj, "estimator"))


def lookup_model_class(path: str) -> tuple[type, str] | None:
    """``(class, kind)`` for the exact class path ``"module:QualName"``, or ``None``.

    Only classes of :func:`model_classes` are ever returned: the path is looked up as a whole
    string, never imported or walked attribute by attribute. For a scikit-learn path, the public
    estimators of its package are added first when that package is one of
    :data:`SKLEARN_MODEL_PACKAGES` (or holds a registered estimator).

    Examples
    --------
    >>> lookup_model_class("sklearn.preprocessing._data:StandardScaler")[0].__name__
    'StandardScaler'
    >>> lookup_model_class("kernelflow.io:np.f2py.subprocess.Popen") is None
    True
    """
    if not isinstance(path, str):
        return None
    table = model_classes()
    if path not in table and path.startswith("sklearn."):
        package = ".".join(path.partition(":")[0].split(".")[:2])
        if package in _sklearn_packages():
            _scan_sklearn_package(package)
    return table.get(path)
