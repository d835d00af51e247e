"""Safe model files: tensors plus JSON metadata in a NumPy ``.npz`` archive, never pickle.

A model file is an uncompressed ``.npz`` (zip) archive holding

* ``__kernelflow__``: the UTF-8 JSON metadata as a ``uint8`` array, and
* ``a0``, ``a1``, ...: one plain numeric array per tensor or array of the model.

The metadata records the format name and version, the library versions, the estimator
(registered name and class path), its constructor parameters and its fitted state as a tree of
typed nodes whose leaves refer to the arrays by key. Every array is listed with its dtype,
shape and SHA-256 digest, and :func:`load_model` refuses a file where any of these disagree,
where the format or version is unknown, or where a class lies outside ``kernelflow`` and
``sklearn``. Arrays are read with ``allow_pickle=False`` and objects are rebuilt only through
their constructors, so loading a file cannot run code from the file. Tensors keep their dtype
exactly, hence predictions after loading are bit-identical. See ``docs/model_format.md``.

Which state is saved: every instance attribute that is not a constructor parameter (fitted
attributes ending in ``_`` and private ones). Values may be torch tensors, NumPy arrays and
scalars, Python scalars, strings, lists, tuples, dicts, ``Kernel`` objects and other
kernelflow/scikit-learn parameter objects, nested estimators, ``RandomState`` objects, torch
dtypes/devices/generators, kernelflow dataclasses and kernelflow helper objects (restored
attribute by attribute without calling ``__init__``). An estimator holding anything else defines
``_get_state() -> dict`` and ``_set_state(state)``; :func:`default_state` gives the default dict.

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from sklearn.kernel_ridge import KernelRidge
>>> from kernelflow.io import save_model, load_model
>>> rng = np.random.RandomState(0)
>>> X, y = rng.rand(20, 2), rng.rand(20)
>>> model = KernelRidge(alpha=0.1, kernel="rbf").fit(X, y)
>>> path = os.path.join(tempfile.mkdtemp(), "model.npz")
>>> _ = save_model(model, path)
>>> X_new = rng.rand(5, 2)
>>> bool(np.array_equal(load_model(path).predict(X_new), model.predict(X_new)))
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ModelFileError",
    "save_model",
    "load_model",
    "read_metadata",
    "default_state",
]

FORMAT = "kernelflow-model"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
META_KEY = "__kernelflow__"
_SAFE_MODULE_PREFIXES = ("kernelflow.", "sklearn.")

_TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NUMPY_KINDS = set("biufc")  # bool, int, uint, float, complex: the only dtypes stored


class ModelFileError(ValueError):
    """A model file is missing, corrupt, tampered with, or of an unsupported version."""


# ---------------------------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------------------------
class _Writer:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, arr: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        # keep Fortran order: BLAS results (hence predictions) can depend on memory layout
        self.arrays[key] = arr if arr.flags.f_contiguous else np.ascontiguousarray(arr)
        return key

    def encode(self, value: Any, where: str) -> Any:  # noqa: C901 - one branch per node type
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int) and not isinstance(value, np.integer):
            return int(value)
        if isinstance(value, float):
            v = float(value)
            return v if math.isfinite(v) else {"type": "float", "value": repr(v)}
        if isinstance(value, torch.Tensor):
            return self._tensor(value, where)
        if isinstance(value, np.ndarray):
            return self._ndarray(value, where)
        if isinstance(value, np.generic):
            node = self._ndarray(np.asarray(value), where)
            node["type"] = "numpy_scalar"
            return node
        if isinstance(value, (list, tuple, set, frozenset)):
            kind = {list: "list", tuple: "tuple"}.get(type(value), "list")
            if isinstance(value, (set, frozenset)):
                kind, value = "set", sorted(value, key=repr)
            return {
                "type": kind,
                "items": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)],
            }
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise TypeError(f"{where}: dict keys must be str/int/float, got {type(k)}")
                items.append([k, self.encode(v, f"{where}[{k!r}]")])
            return {"type": "dict", "items": items}
        if isinstance(value, torch.dtype):
            return {"type": "torch_dtype", "value": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"type": "torch_device", "value": str(value)}
        if isinstance(value, np.dtype):
            return {"type": "numpy_dtype", "value": value.str}
        if isinstance(value, np.random.RandomState):
            name, keys, pos, has_gauss, cached = value.get_state()
            return {
                "type": "random_state",
                "keys": self._ndarray(keys, where),
                "state": [name, int(pos), int(has_gauss), float(cached)],
            }
        if _is_estimator(value):
            return {"type": "estimator", **_encode_estimator(value, self, where)}
        if hasattr(value, "get_params") and _safe_module(type(value).__module__):
            params = value.get_params(deep=False) if _takes_deep(value) else value.get_params()
            return {
                "type": "object",
                "class": _class_path(value),
                "params": self.encode(dict(params), f"{where}.params"),
            }
        if (
            dataclasses.is_dataclass(value)
            and _safe_module(type(value).__module__)
            and all(f.init for f in dataclasses.fields(value))
        ):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return {
                "type": "dataclass",
                "class": _class_path(value),
                "fields": self.encode(fields, where),
            }
        if isinstance(value, torch.Generator):
            return {"type": "torch_generator", "state": self._tensor(value.get_state(), where)}
        if type(value).__module__.startswith("kernelflow.") and _has_plain_state(value):
            # helper objects of the library (growing factorisations, schedules, ...): their
            # attributes are saved and restored without calling __init__
            return {
                "type": "state_object",
                "class": _class_path(value),
                "state": self.encode(_object_state(value), f"{where}.state"),
            }
        raise TypeError(
            f"cannot save {where}: values of type {type(value).__module__}."
            f"{type(value).__qualname__} are not supported by the model format; the estimator "
            "can define _get_state()/_set_state() to store it differently"
        )

    def _tensor(self, t: torch.Tensor, where: str) -> dict:
        t = t.detach()
        if t.is_sparse or t.layout != torch.strided:
            t = t.to_dense()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _TORCH_DTYPES:
            raise TypeError(f"cannot save {where}: tensor dtype {t.dtype} is not supported")
        cpu = t.cpu().resolve_conj().resolve_neg()
        if not (cpu.is_contiguous() or cpu.T.is_contiguous()):
            cpu = cpu.contiguous()  # a transposed layout is kept (as Fortran order), others not
        # NumPy has no bfloat16: store the raw 16-bit patterns.
        arr = cpu.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else cpu.numpy()
        return {"type": "tensor", "key": self.add(arr), "dtype": dtype, "device": str(t.device)}

    def _ndarray(self, a: np.ndarray, where: str) -> dict:
        if a.dtype.kind in _NUMPY_KINDS:
            return {"type": "ndarray", "key": self.add(a)}
        if a.dtype.kind in "OUS" and all(isinstance(v, str) for v in a.ravel()):
            # feature_names_in_ and friends: object arrays of strings, kept as JSON
            return {
                "type": "str_array",
                "dtype": "object" if a.dtype.kind == "O" else a.dtype.str,
                "shape": list(a.shape),
                "values": [str(v) for v in a.ravel()],
            }
        if a.dtype.kind == "O":
            return {
                "type": "object_array",
                "shape": list(a.shape),
                "items": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(a.ravel())],
            }
        raise TypeError(f"cannot save {where}: arrays of dtype {a.dtype} are not supported")


def _has_plain_state(obj) -> bool:
    return hasattr(obj, "__dict__") or bool(getattr(type(obj), "__slots__", ()))


def _object_state(obj) -> dict:
    state = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                state[name] = getattr(obj, name)
    return state


def _takes_deep(obj) -> bool:
    try:
        obj.get_params(deep=False)
        return True
    except TypeError:
        return False


def _is_estimator(value) -> bool:
    try:
        from sklearn.base import BaseEstimator
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        return False
    return isinstance(value, BaseEstimator)


def _class_path(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _safe_module(module: str) -> bool:
    return module == "kernelflow" or module.startswith(_SAFE_MODULE_PREFIXES)


def default_state(estimator) -> dict[str, Any]:
    """Instance attributes of ``estimator`` that are not constructor parameters.

    This is what a model file stores when the estimator defines no ``_get_state``; an
    estimator that does can start from it: ``return {**default_state(self), "x": ...}``.

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> sorted(default_state(Ridge().fit([[0.0], [1.0]], [0.0, 1.0])))[:2]
    ['coef_', 'intercept_']
    """
    params = set(estimator.get_params(deep=False))
    return {
        k: v for k, v in vars(estimator).items() if k not in params and not k.startswith("__")
    }


def _encode_estimator(est, writer: _Writer, where: str) -> dict:
    from kernelflow.registry import name_of

    params = est.get_params(deep=False)
    state = est._get_state() if hasattr(est, "_get_state") else default_state(est)
    if not isinstance(state, dict):
        raise TypeError(f"{type(est).__name__}._get_state() must return a dict")
    return {
        "name": name_of(est),
        "class": _class_path(est),
        "params": writer.encode(dict(params), f"{where}.params"),
        "state": writer.encode(dict(state), where),
    }


def save_model(estimator, path, *, extra: dict | None = None) -> Path:
    """Write a fitted (or unfitted) estimator to ``path`` in the kernelflow model format.

    The file is written to a temporary name and renamed, so a crash never leaves a half
    written model behind. Cost: one copy of every array (O(model size)).

    Parameters
    ----------
    estimator : estimator
        A scikit-learn compatible estimator (kernelflow or scikit-learn).
    path : str or path-like
        Destination; the name is used as given (``.npz`` is conventional).
    extra : dict, optional
        JSON-serialisable user metadata stored under ``"extra"`` (e.g. the training data set).

    Returns
    -------
    path : pathlib.Path
        The written file.

    Examples
    --------
    >>> import os, tempfile
    >>> from sklearn.linear_model import Ridge
    >>> p = save_model(Ridge().fit([[0.0], [1.0]], [0.0, 1.0]),
    ...                os.path.join(tempfile.mkdtemp(), "ridge.npz"))
    >>> read_metadata(p)["estimator"]["class"]
    'sklearn.linear_model._ridge:Ridge'
    """
    if not _is_estimator(estimator) and not hasattr(estimator, "get_params"):
        raise TypeError(f"expected an estimator with get_params(), got {type(estimator)}")
    import kernelflow

    writer = _Writer()
    tree = _encode_estimator(estimator, writer, type(estimator).__name__)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": {
            "kernelflow": getattr(kernelflow, "__version__", "unknown"),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "estimator": tree,
        "arrays": {
            key: {
                "dtype": arr.dtype.str,
                "shape": list(arr.shape),
                "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            }
            for key, arr in writer.arrays.items()
        },
        "extra": json.loads(json.dumps(extra)) if extra is not None else {},
    }
    blob = np.frombuffer(json.dumps(meta, allow_nan=False).encode("utf-8"), dtype=np.uint8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".kf-", suffix=".npz", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **{META_KEY: blob}, **writer.arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


# ---------------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------------
def _open(path) -> tuple[dict, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a model file"
        raise ModelFileError(f"{path} is not a kernelflow model file ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ModelFileError(f"{path} is not a kernelflow model file (not an .npz archive)")
    if META_KEY not in archive.files:
        archive.close()
        raise ModelFileError(f"{path} is not a kernelflow model file (no metadata)")
    try:
        raw = archive[META_KEY]
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise ValueError("metadata must be a 1-D uint8 array")
        meta = json.loads(raw.tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, zipfile.BadZipFile, OSError) as exc:
        archive.close()
        raise ModelFileError(f"{path}: corrupt metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        archive.close()
        raise ModelFileError(f"{path}: not a {FORMAT} file (format={meta.get('format')!r})")
    version = meta.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        archive.close()
        raise ModelFileError(
            f"{path}: unsupported model-file format version {version!r}; this kernelflow "
            f"reads version(s) {', '.join(map(str, SUPPORTED_VERSIONS))}"
        )
    return meta, archive


def read_metadata(path) -> dict:
    """Return the JSON metadata of a model file after checking format and version.

    Examples
    --------
    >>> import os, tempfile
    >>> from sklearn.linear_model import Ridge
    >>> p = save_model(Ridge(alpha=3.0), os.path.join(tempfile.mkdtemp(), "m.npz"))
    >>> meta = read_metadata(p)
    >>> meta["format"], meta["format_version"], meta["estimator"]["params"]["items"][0]
    ('kernelflow-model', 1, ['alpha', 3.0])
    """
    meta, archive = _open(path)
    archive.close()
    return meta


class _Reader:
    def __init__(self, arrays: dict[str, np.ndarray], device, trusted=()):
        self.arrays = arrays
        self.device = device
        self.trusted = {f"{c.__module__}:{c.__qualname__}": c for c in trusted}

    def cls(self, path, *, library_only=False) -> type:
        if path in self.trusted:
            return self.trusted[path]
        if library_only and not str(path).startswith("kernelflow."):
            raise ModelFileError(f"refusing to restore {path}: not a kernelflow class")
        return _safe_class(path)

    def array(self, key) -> np.ndarray:
        if not isinstance(key, str) or key not in self.arrays:
            raise ModelFileError(f"metadata refers to a missing array {key!r}")
        return self.arrays[key]

    def decode(self, node: Any) -> Any:  # noqa: C901 - one branch per node type
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or "type" not in node:
            raise ModelFileError(f"malformed metadata node {str(node)[:80]!r}")
        kind = node["type"]
        if kind == "float":
            value = float(node["value"])
            if math.isfinite(value):
                raise ModelFileError("malformed float node")
            return value
        if kind == "tensor":
            arr = self.array(node["key"])
            dtype = _TORCH_DTYPES.get(node.get("dtype"))
            if dtype is None:
                raise ModelFileError(f"unsupported tensor dtype {node.get('dtype')!r}")
            t = torch.from_numpy(arr.copy(order="K"))
            t = t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
            if t.dtype != dtype:
                raise ModelFileError(
                    f"tensor {node['key']}: stored as {t.dtype}, metadata says {dtype}"
                )
            return t if self.device is None else t.to(self.device)
        if kind in ("ndarray", "numpy_scalar"):
            arr = self.array(node["key"]).copy(order="K")
            return arr[()] if kind == "numpy_scalar" else arr
        if kind == "str_array":
            dtype = object if node["dtype"] == "object" else np.dtype(node["dtype"])
            values = node["values"]
            shape = tuple(node["shape"])
            if math.prod(shape) != len(values):
                raise ModelFileError("string array: shape does not match the number of values")
            return np.array(values, dtype=dtype).reshape(shape)
        if kind == "object_array":
            items = [self.decode(v) for v in node["items"]]
            shape = tuple(node["shape"])
            if math.prod(shape) != len(items):
                raise ModelFileError("object array: shape does not match the number of items")
            out = np.empty(len(items), dtype=object)
            for i, v in enumerate(items):  # element-wise: items may be lists themselves
                out[i] = v
            return out.reshape(shape)
        if kind in ("list", "tuple", "set"):
            items = [self.decode(v) for v in node["items"]]
            return {"list": list, "tuple": tuple, "set": set}[kind](items)
        if kind == "dict":
            return {k: self.decode(v) for k, v in node["items"]}
        if kind == "torch_dtype":
            if node["value"] not in _TORCH_DTYPES:
                raise ModelFileError(f"unknown torch dtype {node['value']!r}")
            return _TORCH_DTYPES[node["value"]]
        if kind == "torch_device":
            return torch.device(node["value"])
        if kind == "numpy_dtype":
            return np.dtype(node["value"])
        if kind == "random_state":
            rs = np.random.RandomState()
            name, pos, has_gauss, cached = node["state"]
            rs.set_state((name, self.decode(node["keys"]), pos, has_gauss, cached))
            return rs
        if kind == "estimator":
            return self.estimator(node)
        if kind == "object":
            cls = self.cls(node["class"])
            return cls(**self.decode(node["params"]))
        if kind == "dataclass":
            cls = self.cls(node["class"])
            if not dataclasses.is_dataclass(cls):
                raise ModelFileError(f"{node['class']} is not a dataclass")
            return cls(**self.decode(node["fields"]))
        if kind == "torch_generator":
            gen = torch.Generator()
            gen.set_state(self.decode(node["state"]).cpu())
            return gen
        if kind == "state_object":
            cls = self.cls(node["class"], library_only=True)
            obj = cls.__new__(cls)
            for k, v in self.decode(node["state"]).items():
                object.__setattr__(obj, k, v)
            return obj
        raise ModelFileError(f"unknown metadata node type {kind!r}")

    def estimator(self, node: dict):
        from sklearn.base import BaseEstimator

        cls = None
        try:
            cls = self.cls(node["class"])
        except ModelFileError:
            if not node.get("name"):
                raise
        if cls is None:
            from kernelflow.registry import get_estimator_class

            try:
                cls = get_estimator_class(node["name"])
            except (KeyError, ImportError) as exc:
                raise ModelFileError(f"cannot find the estimator class: {exc}") from None
        if not issubclass(cls, BaseEstimator):
            raise ModelFileError(f"{node['class']} is not a scikit-learn estimator")
        params = self.decode(node["params"])
        try:
            est = cls(**params)
        except TypeError as exc:
            raise ModelFileError(f"parameters do not fit {cls.__name__}: {exc}") from None
        state = self.decode(node["state"])
        if hasattr(est, "_set_state"):
            est._set_state(state)
        else:
            for k, v in state.items():
                setattr(est, k, v)
        return est


def _safe_class(path: Any) -> type:
    if not isinstance(path, str) or ":" not in path:
        raise ModelFileError(f"malformed class path {path!r}")
    module, _, qualname = path.partition(":")
    if not _safe_module(module):
        raise ModelFileError(
            f"refusing to load class {path}: only kernelflow and scikit-learn classes are allowed"
        )
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ModelFileError(f"class {path} is not available: {exc}") from None
    if not isinstance(obj, type):
        raise ModelFileError(f"{path} is not a class")
    return obj


def _read_arrays(meta: dict, archive, path) -> dict[str, np.ndarray]:
    listed = meta.get("arrays")
    if not isinstance(listed, dict):
        raise ModelFileError(f"{path}: metadata has no array table")
    present = set(archive.files) - {META_KEY}
    if present != set(listed):
        missing, unknown = sorted(set(listed) - present), sorted(present - set(listed))
        raise ModelFileError(
            f"{path}: arrays do not match the metadata (missing {missing}, unlisted {unknown})"
        )
    arrays = {}
    for key, info in listed.items():
        arr = archive[key]
        if arr.dtype.kind not in _NUMPY_KINDS:
            raise ModelFileError(f"{path}: array {key} has unsupported dtype {arr.dtype}")
        if list(arr.shape) != list(info.get("shape", [])) or arr.dtype.str != info.get("dtype"):
            raise ModelFileError(
                f"{path}: array {key} has shape {list(arr.shape)} and dtype {arr.dtype.str}, "
                f"but the metadata says {info.get('shape')} and {info.get('dtype')}"
            )
        if hashlib.sha256(arr.tobytes()).hexdigest() != info.get("sha256"):
            raise ModelFileError(f"{path}: array {key} does not match its checksum")
        arrays[key] = arr
    return arrays


def load_model(path, *, device=None, trusted=()):
    """Load an estimator written by :func:`save_model`.

    Cost: one read of the file plus a SHA-256 pass over the arrays (O(model size)).

    Parameters
    ----------
    path : str or path-like
        Model file.
    device : str or torch.device, optional
        Move every tensor to this device (default: keep them on the CPU).
    trusted : iterable of classes, default=()
        Classes outside kernelflow and scikit-learn that the file may instantiate (your own
        estimators or kernels); everything else outside the two libraries is refused.

    Returns
    -------
    estimator : estimator
        The estimator, with the saved parameters and fitted state.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If the file is not a kernelflow model, its format version is unknown, its metadata
        disagrees with the stored arrays (shape, dtype, checksum), or it names a class outside
        kernelflow and scikit-learn.

    Examples
    --------
    >>> import os, tempfile
    >>> from sklearn.linear_model import Ridge
    >>> p = save_model(Ridge(alpha=3.0).fit([[0.0], [1.0]], [0.0, 1.0]),
    ...                os.path.join(tempfile.mkdtemp(), "m.npz"))
    >>> load_model(p).coef_.round(3)
    array([0.143])
    """
    meta, archive = _open(path)
    try:
        arrays = _read_arrays(meta, archive, path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        if isinstance(exc, ModelFileError):
            raise
        raise ModelFileError(f"{path}: corrupt array data ({exc})") from None
    finally:
        archive.close()
    node = meta.get("estimator")
    if not isinstance(node, dict):
        raise ModelFileError(f"{path}: metadata has no estimator")
    try:
        return _Reader(arrays, device, trusted).estimator(node)
    except ModelFileError as exc:
        raise ModelFileError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: malformed metadata ({type(exc).__name__}: {exc})") from None

