"""Safe model files: tensors plus JSON metadata in a NumPy ``.npz`` archive, never pickle.

A model file is an uncompressed ``.npz`` (zip) archive holding

* ``__kernelflow__``: the UTF-8 JSON metadata as a ``uint8`` array, and
* ``a0``, ``a1``, ...: one plain numeric array per tensor or array of the model.

The metadata records the format name and version, the library versions, the estimator
(registered name and class path), its constructor parameters and its fitted state as a tree of
typed nodes whose leaves refer to the arrays by key. Every array is listed with its dtype,
shape and SHA-256 digest, and the metadata carries a SHA-256 digest of itself.

Loading executes nothing from the file. Every class the file names is looked up by its exact
``"module:QualName"`` in the registry of classes kernelflow saves
(:func:`kernelflow.registry.model_classes`) or among the caller's ``trusted=`` classes; no
module attribute is ever followed and nothing outside that table is called. Before a byte of an
array is read, the zip directory, the ``.npy`` header and the metadata must agree on its name,
dtype, shape and size, members must be stored uncompressed, and their total must fit in the
file and in the memory budget. Every refusal is a :class:`ModelFileError`. Tensors keep their
dtype and layout exactly, hence predictions after loading are bit-identical. The checksums
detect corruption and edits made without recomputing them; they do not authenticate the file
against someone who rewrites them. A file without the metadata checksum is refused unless
``allow_unsigned=True``.

What a file may *restore* is bounded too (:mod:`kernelflow._trust`): no attribute that shadows
a method or is not the class's own, no ``memory`` cache, no worker processes or threads, no
paths, no callables given to scikit-learn classes, parameters within each class's own
constraints, engine options, sizes and composite kernels within the memory budget and fixed
bounds, scikit-learn's libsvm models only with a consistent fitted state. A model that loads
starts no process, writes no file and executes nothing from the file when it is used. See
``docs/model_format.md`` (the trust model) and ``docs/reliability.md``.

Writing goes to a temporary file ``.<name>.kf-tmp-<host>-<pid>-...`` in the destination
directory (``<name>`` shortened to keep the name legal; mode ``0o666`` less the umask),
flushed and ``fsync``-ed before an atomic ``os.replace`` and an ``fsync`` of the directory. An
exception or ``KeyboardInterrupt`` removes the temporary file; one left by a killed
process is removed by the next save to the same directory once that process has ended.

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
import json
import math
import os
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import _trust
from ._trust import ModelFileError
from .utils._atomic import all_or_nothing
from .utils._files import write_npz_atomically

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ModelFileError",
    "save_model",
    "load_model",
    "read_metadata",
    "default_state",
    "all_or_nothing",
]

FORMAT = "kernelflow-model"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
META_KEY = "__kernelflow__"
CHECKSUM_KEY = "metadata_sha256"
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
                "keys": self._ndarray(np.asarray(keys), where),
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


# Parameters that name a place on the fitting machine (a checkpoint file): a model file never
# carries them, so a loaded model's refit writes nowhere the file chose (stored as None).
_MACHINE_LOCAL_PARAMS = ("checkpoint",)


def _encode_estimator(est, writer: _Writer, where: str) -> dict:
    from kernelflow.registry import name_of

    params = est.get_params(deep=False)
    if type(est).__module__.split(".")[0] == "kernelflow":
        params = {k: (None if k in _MACHINE_LOCAL_PARAMS else v) for k, v in params.items()}
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

    The file is written to a temporary file in the same directory, flushed and ``fsync``-ed,
    then atomically renamed over ``path`` (and the directory ``fsync``-ed), so an exception, a
    ``KeyboardInterrupt`` or a killed process never leaves a half-written model at ``path``;
    temporary files of killed saves are removed by the next save to the directory. Cost: one
    copy of every array (O(model size)).

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
    meta[CHECKSUM_KEY] = _metadata_digest(meta)
    blob = np.frombuffer(json.dumps(meta, allow_nan=False).encode("utf-8"), dtype=np.uint8)
    path = Path(path)
    write_npz_atomically(path, {META_KEY: blob, **writer.arrays})
    return path


def _metadata_digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# decoding: every check happens on declared sizes before anything is allocated or instantiated
# ---------------------------------------------------------------------------------------------
_MEMBER_RE = re.compile(r"^(__kernelflow__|a(?:0|[1-9][0-9]{0,8}))\.npy$")
_ARRAY_DTYPES = {
    f"{order}{code}"
    for code in ("i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
    for order in "<>"
} | {"|b1", "|i1", "|u1"}
_MAX_METADATA_BYTES = 16 * 2**20  # JSON: its Python objects take up to ~20x its size
_MAX_NDIM = 32
_MAX_MEMBERS = 100_000  # the metadata plus one member per array
_READ_CHUNK = 16 * 2**20
_KEY_TYPES = (str, int, float, bool, type(None))
_ALLOWED_FLAGS = 0x08 | 0x800  # data descriptor, UTF-8 names: what zipfile itself writes


def _refuse_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def _memory_cap() -> int:
    """Bytes a model file may hold: the engine's memory budget (see ``kernelflow.operators``)."""
    return _trust._memory_cap()


def _int(value, what: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFileError(f"{what} must be an integer, got {str(value)[:40]!r}")
    if value < lo or (hi is not None and value > hi):
        raise ModelFileError(f"{what} = {value} is out of range")
    return value


def _declared_entries(fh, size: int) -> int | None:
    """Number of members the zip end record declares, read before ``zipfile`` parses (and
    allocates) the directory; ``None`` when no end record is found (``zipfile`` then refuses)."""
    start = max(0, size - (22 + 65535))
    fh.seek(start)
    tail = fh.read(size - start)
    pos = tail.rfind(b"PK\x05\x06")
    if pos < 0 or pos + 22 > len(tail):
        return None
    count = struct.unpack_from("<H", tail, pos + 10)[0]
    if count == 0xFFFF and pos >= 20 and tail[pos - 20 : pos - 16] == b"PK\x06\x07":
        offset = struct.unpack_from("<Q", tail, pos - 12)[0]  # the zip64 end record
        if offset + 56 <= size:
            fh.seek(offset)
            record = fh.read(56)
            if record[:4] == b"PK\x06\x06":
                count = struct.unpack_from("<Q", record, 32)[0]
    fh.seek(0)
    return count


class _Archive:
    """A model file opened for reading: the zip directory checked, nothing decompressed."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        try:
            self.size = os.fstat(self.fh.fileno()).st_size
            entries = _declared_entries(self.fh, self.size)
            if entries is not None and entries > _MAX_MEMBERS:
                raise ModelFileError(
                    f"the zip directory declares {entries} members (at most {_MAX_MEMBERS})"
                )
            try:
                self.zip = zipfile.ZipFile(self.fh)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
                    NotImplementedError, RuntimeError) as exc:
                raise ModelFileError(f"not a kernelflow model file ({exc})") from None
            self.members = self._check_directory()
        except BaseException:
            self.fh.close()
            raise

    def _check_directory(self) -> dict[str, zipfile.ZipInfo]:
        members: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in self.zip.infolist():
            name = info.filename
            if name[:-4] in members and name.endswith(".npy"):
                raise ModelFileError(f"duplicate member {name!r}")
            if not _MEMBER_RE.match(name):
                raise ModelFileError(
                    f"unlisted member {name[:80]!r}: only __kernelflow__.npy and a<k>.npy arrays "
                    "may appear (no directories, paths or other names)"
                )
            if info.flag_bits & ~_ALLOWED_FLAGS:
                raise ModelFileError(
                    f"member {name!r} uses zip features model files never use "
                    f"(flags {info.flag_bits:#x}: encryption, patches or the like)"
                )
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                raise ModelFileError(
                    f"member {name!r} is stored in {info.compress_size} bytes but declares "
                    f"{info.file_size} bytes"
                )
            if info.compress_type != zipfile.ZIP_STORED:
                raise ModelFileError(
                    f"member {name!r} is compressed ({info.compress_size} bytes declared to "
                    f"inflate to {info.file_size}); model files store arrays uncompressed"
                )
            total += info.file_size
            members[name[:-4]] = info
        if total > self.size:
            raise ModelFileError(
                f"members declare {total} bytes but the file has only {self.size} bytes"
            )
        cap = _memory_cap()
        if total > cap:
            raise ModelFileError(
                f"the arrays need {total} bytes, more than the memory budget of {cap} bytes"
            )
        if META_KEY not in members:
            raise ModelFileError("not a kernelflow model file (no metadata)")
        return members

    def close(self) -> None:
        self.zip.close()
        self.fh.close()

    def read(self, key: str, dtype: str, shape: list | None, max_bytes: int | None = None):
        """Read one member after checking its ``.npy`` header against ``dtype`` and ``shape``.

        ``shape=None`` accepts any 1-D length (the metadata blob). Returns ``(array, digest)``
        where digest is the SHA-256 of the C-order bytes.
        """
        info = self.members[key]
        if max_bytes is not None and info.file_size > max_bytes:
            raise ModelFileError(f"member {key} is {info.file_size} bytes (limit {max_bytes})")
        with self.zip.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                header = np.lib.format.read_array_header_2_0(member)
            else:
                raise ModelFileError(f"member {key}: unsupported .npy version {version}")
            got_shape, fortran, got_dtype = header
            if got_dtype.str != dtype or got_dtype.hasobject:
                raise ModelFileError(f"array {key} is stored as {got_dtype.str}, expected {dtype}")
            if shape is None:
                if len(got_shape) != 1:
                    raise ModelFileError(f"member {key} must be 1-D")
            elif list(got_shape) != list(shape):
                raise ModelFileError(
                    f"array {key} has shape {list(got_shape)} and dtype {got_dtype.str}, but the "
                    f"metadata says {list(shape)} and {dtype}"
                )
            nbytes = math.prod(got_shape) * got_dtype.itemsize
            if member.tell() + nbytes != info.file_size:
                raise ModelFileError(
                    f"array {key} declares {nbytes} bytes of data but its member holds "
                    f"{info.file_size - member.tell()}"
                )
            buf = np.empty(nbytes, dtype=np.uint8)
            pos = 0
            while pos < nbytes:
                chunk = member.read(min(_READ_CHUNK, nbytes - pos))
                if not chunk:
                    raise ModelFileError(f"array {key} is truncated")
                buf[pos : pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                pos += len(chunk)
        arr = buf.view(got_dtype).reshape(got_shape, order="F" if fortran else "C")
        data: Any = buf if (not fortran or arr.flags.c_contiguous) else arr.tobytes(order="C")
        return arr, hashlib.sha256(data).hexdigest()


def _open(path) -> tuple[dict, _Archive]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        archive = _Archive(path)
    except ModelFileError as exc:
        raise ModelFileError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the file ({exc})") from None
    try:
        meta = _read_meta(archive)
    except ModelFileError:
        archive.close()
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the file provokes is a file error
        archive.close()
        raise ModelFileError(
            f"{path}: corrupt metadata ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    except BaseException:
        archive.close()
        raise
    return meta, archive


def _read_meta(archive: _Archive) -> dict:
    path = archive.path
    try:
        raw, _ = archive.read(META_KEY, "|u1", None, max_bytes=_MAX_METADATA_BYTES)
        meta = json.loads(raw.tobytes().decode("utf-8"), parse_constant=_refuse_constant)
    except ModelFileError as exc:
        raise ModelFileError(f"{path}: corrupt metadata ({exc})") from None
    except (ValueError, UnicodeDecodeError, RecursionError, zipfile.BadZipFile, OSError,
            EOFError) as exc:
        raise ModelFileError(f"{path}: corrupt metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelFileError(f"{path}: not a {FORMAT} file (format={str(got)[:40]!r})")
    version = meta.get("format_version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise ModelFileError(
            f"{path}: unsupported model-file format version {str(version)[:20]}; this "
            f"kernelflow reads version(s) {', '.join(map(str, SUPPORTED_VERSIONS))}"
        )
    return meta


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


_CLASS_NODES = {"estimator", "object", "dataclass", "state_object"}


_MAX_CLASS_NODES = 10_000  # estimators, kernels, options... in one file
_MAX_NODES = 2**21  # values of every kind in one file
_MAX_STR_WIDTH = 256  # characters of a fixed-width string dtype beyond its longest value


class _Reader:
    def __init__(self, arrays: dict[str, np.ndarray], device, trusted=()):
        self.arrays = arrays
        self.device = device
        self.class_nodes = 0
        self.nodes = 0
        self.bytes_left = _memory_cap()
        self.trusted = {}
        for c in trusted:
            if not isinstance(c, type):
                raise TypeError(f"trusted= must hold classes, got {c!r}")
            self.trusted[f"{c.__module__}:{c.__qualname__}"] = c

    def cls(self, path, kind: str) -> type:
        """The class named by ``path`` for a node of type ``kind``: registry or trusted only."""
        from kernelflow.registry import lookup_model_class

        if not isinstance(path, str):
            raise ModelFileError(f"malformed class path {str(path)[:80]!r}")
        if path in self.trusted:
            cls = self.trusted[path]
            if kind == "dataclass" and not dataclasses.is_dataclass(cls):
                raise ModelFileError(f"{path} is not a dataclass")
            return cls
        found = lookup_model_class(path)
        if found is None:
            raise ModelFileError(
                f"refusing to load class {path[:120]}: only kernelflow and scikit-learn classes "
                "of the model-file registry are allowed (pass your own classes as trusted=)"
            )
        cls, registered_kind = found
        if registered_kind != kind:
            raise ModelFileError(
                f"{path} is registered as a {registered_kind} node, not as a {kind} node"
            )
        return cls

    def check_classes(self, node: Any, depth: int = 0) -> int:
        """Resolve every class named in the tree before anything is built; count the class
        nodes and the kernels of every composite kernel. Returns the number of kernels in
        ``node`` that belong to no enclosing estimator or other object yet."""
        from kernelflow.kernels import Kernel

        if depth > 200:
            raise ModelFileError("metadata is nested too deeply")
        kernels = 0
        if isinstance(node, dict):
            cls = None
            if node.get("type") in _CLASS_NODES and "class" in node:
                self.class_nodes += 1
                if self.class_nodes > _MAX_CLASS_NODES:
                    raise ModelFileError(
                        f"the file names more than {_MAX_CLASS_NODES} objects"
                    )
                if node["type"] == "estimator":
                    cls = self.estimator_class(node)
                else:
                    cls = self.cls(node["class"], node["type"])
            for value in node.values():
                kernels += self.check_classes(value, depth + 1)
            if cls is not None:
                if issubclass(cls, Kernel):
                    _trust.kernel_parts(kernels + 1, str(node["class"])[:80])
                    return kernels + 1
                return 0  # the kernels of an estimator or selector are separate trees
        elif isinstance(node, list):
            for value in node:
                kernels += self.check_classes(value, depth + 1)
        return kernels

    def _spend(self, nbytes: int, what: str) -> None:
        """Count what decoding allocates; refuse before the memory budget is exceeded."""
        self.bytes_left -= int(nbytes)
        if self.bytes_left < 0:
            raise ModelFileError(f"{what} would take the model past the memory budget")

    def array(self, key) -> np.ndarray:
        if not isinstance(key, str) or key not in self.arrays:
            raise ModelFileError(f"metadata refers to a missing array {str(key)[:40]!r}")
        return self.arrays[key]

    @staticmethod
    def _shape(node) -> tuple:
        shape = node.get("shape")
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
            raise ModelFileError("malformed shape in the metadata")
        return tuple(_int(s, "a dimension") for s in shape)

    def decode(self, node: Any) -> Any:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise ModelFileError(f"the metadata holds more than {_MAX_NODES} values")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or "type" not in node:
            raise ModelFileError(f"malformed metadata node {str(node)[:80]!r}")
        kind = node["type"]
        decoder = _Reader._DECODERS.get(kind) if isinstance(kind, str) else None
        if decoder is None:
            raise ModelFileError(f"unknown metadata node type {str(kind)[:40]!r}")
        return decoder(self, node, kind)

    # One decoder a node type, each ``(self, node, kind) -> value`` (table below).

    def _decode_float(self, node: dict, kind: str) -> float:
        value = float(str(node["value"]))
        if math.isfinite(value):
            raise ModelFileError("malformed float node")
        return value

    def _decode_tensor(self, node: dict, kind: str) -> torch.Tensor:
        arr = self.array(node["key"])
        name = node.get("dtype")
        dtype = _TORCH_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ModelFileError(f"unsupported tensor dtype {str(name)[:40]!r}")
        if not arr.dtype.isnative:
            raise ModelFileError(f"tensor {node['key']} is not stored in native byte order")
        self._spend(arr.nbytes, f"tensor {node['key']}")
        t = torch.from_numpy(arr.copy(order="K"))
        t = t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
        if t.dtype != dtype:
            raise ModelFileError(
                f"tensor {node['key']}: stored as {t.dtype}, metadata says {dtype}"
            )
        return t if self.device is None else t.to(self.device)

    def _decode_ndarray(self, node: dict, kind: str) -> Any:  # also the NumPy scalars
        self._spend(self.array(node["key"]).nbytes, f"array {node['key']}")
        arr = self.array(node["key"]).copy(order="K")
        if kind == "numpy_scalar":
            if arr.ndim != 0:
                raise ModelFileError("a NumPy scalar must be stored as a 0-d array")
            return arr[()]
        return arr

    def _decode_str_array(self, node: dict, kind: str) -> np.ndarray:
        spec = node["dtype"]
        str_dtype: Any
        if spec == "object":
            str_dtype = object
        elif isinstance(spec, str) and re.fullmatch(r"[<>|]?[US][0-9]{1,6}", spec):
            str_dtype = np.dtype(spec)
        else:
            raise ModelFileError(f"unsupported string array dtype {str(spec)[:40]!r}")
        values, shape = node["values"], self._shape(node)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ModelFileError("string array: values must be strings")
        if math.prod(shape) != len(values):
            raise ModelFileError("string array: shape does not match the number of values")
        if str_dtype is not object:
            # a fixed width is allocated for every value: 4 bytes a character for "U"
            longest = max((len(v) for v in values), default=0)
            if not longest <= str_dtype.itemsize // (4 if str_dtype.kind == "U" else 1) <= \
                    max(longest, _MAX_STR_WIDTH):
                raise ModelFileError(
                    f"string array: dtype {spec} does not fit values of at most {longest} "
                    "characters"
                )
        self._spend(len(values) * (8 if str_dtype is object else str_dtype.itemsize)
                    + sum(len(v) for v in values), "a string array")
        return np.array(values, dtype=str_dtype).reshape(shape)

    def _decode_object_array(self, node: dict, kind: str) -> np.ndarray:
        shape = self._shape(node)
        self._spend(8 * len(self._list(node["items"])), "an object array")
        items = [self.decode(v) for v in self._list(node["items"])]
        if math.prod(shape) != len(items):
            raise ModelFileError("object array: shape does not match the number of items")
        out = np.empty(len(items), dtype=object)
        for i, v in enumerate(items):  # element-wise: items may be lists themselves
            out[i] = v
        return out.reshape(shape)

    def _decode_sequence(self, node: dict, kind: str) -> list | tuple | set:
        items = [self.decode(v) for v in self._list(node["items"])]
        return {"list": list, "tuple": tuple, "set": set}[kind](items)

    def _decode_dict(self, node: dict, kind: str) -> dict:
        mapping: dict = {}
        for pair in self._list(node["items"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ModelFileError("dict items must be [key, value] pairs")
            if not isinstance(pair[0], _KEY_TYPES):
                raise ModelFileError("dict keys must be str, int, float, bool or null")
            mapping[pair[0]] = self.decode(pair[1])
        return mapping

    def _decode_torch_dtype(self, node: dict, kind: str) -> torch.dtype:
        if not isinstance(node["value"], str) or node["value"] not in _TORCH_DTYPES:
            raise ModelFileError(f"unknown torch dtype {str(node['value'])[:40]!r}")
        return _TORCH_DTYPES[node["value"]]

    def _decode_torch_device(self, node: dict, kind: str) -> torch.device:
        value = node["value"]
        if not isinstance(value, str) or not re.fullmatch(r"(cpu|cuda|mps|meta)(:\d{1,3})?",
                                                          value):
            raise ModelFileError(f"unknown torch device {str(value)[:40]!r}")
        return torch.device(value)

    def _decode_numpy_dtype(self, node: dict, kind: str) -> np.dtype:
        value = node["value"]
        if not isinstance(value, str) or (value not in _ARRAY_DTYPES
                                          and not re.fullmatch(r"[<>|][US][0-9]{1,3}", value)):
            raise ModelFileError(f"unsupported NumPy dtype {str(value)[:40]!r}")
        return np.dtype(value)

    def _decode_random_state(self, node: dict, kind: str) -> np.random.RandomState:
        keys = self.decode(node["keys"])
        state = self._list(node["state"])
        if (not isinstance(keys, np.ndarray) or keys.dtype != np.uint32
                or keys.shape != (624,) or len(state) != 4 or state[0] != "MT19937"):
            raise ModelFileError("malformed RandomState")
        name, pos, has_gauss, cached = state
        rs = np.random.RandomState()
        rs.set_state((name, keys, _int(pos, "RandomState position", 0, 624),
                      _int(has_gauss, "RandomState flag", 0, 1), float(cached)))
        return rs

    def _decode_estimator(self, node: dict, kind: str) -> Any:
        return self.estimator(node)

    def _construct(self, node: dict, kind: str, key: str,
                   check: Callable[[Any, str], None]) -> Any:
        """An instance of the trusted class ``node["class"]`` called with the checked keyword
        arguments ``node[key]``, then checked by ``check``."""
        cls = self.cls(node["class"], kind)
        kwargs = self._kwargs(node[key])
        _trust.check_attributes(cls, kwargs, cls.__name__, state=False)
        obj = cls(**kwargs)
        check(obj, cls.__name__)
        return obj

    def _decode_object(self, node: dict, kind: str) -> Any:
        return self._construct(node, "object", "params", _trust.check_object)

    def _decode_dataclass(self, node: dict, kind: str) -> Any:
        return self._construct(node, "dataclass", "fields", _trust.check_dataclass)

    def _decode_torch_generator(self, node: dict, kind: str) -> torch.Generator:
        state = self.decode(node["state"])
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise ModelFileError("malformed torch generator state")
        gen = torch.Generator()
        gen.set_state(state.cpu())
        return gen

    def _decode_state_object(self, node: dict, kind: str) -> Any:
        state_cls: Any = self.cls(node["class"], "state_object")
        attrs = self._kwargs(node["state"])
        _trust.check_attributes(state_cls, attrs, state_cls.__name__, state=True)
        obj = state_cls.__new__(state_cls)
        for k, v in attrs.items():
            object.__setattr__(obj, k, v)
        _trust.check_state_object(obj, state_cls.__name__)
        return obj

    #: node type -> decoder; a type not listed is refused
    _DECODERS: dict[str, Callable[[_Reader, dict, str], Any]] = {
        "float": _decode_float,
        "tensor": _decode_tensor,
        "ndarray": _decode_ndarray,
        "numpy_scalar": _decode_ndarray,
        "str_array": _decode_str_array,
        "object_array": _decode_object_array,
        "list": _decode_sequence,
        "tuple": _decode_sequence,
        "set": _decode_sequence,
        "dict": _decode_dict,
        "torch_dtype": _decode_torch_dtype,
        "torch_device": _decode_torch_device,
        "numpy_dtype": _decode_numpy_dtype,
        "random_state": _decode_random_state,
        "estimator": _decode_estimator,
        "object": _decode_object,
        "dataclass": _decode_dataclass,
        "torch_generator": _decode_torch_generator,
        "state_object": _decode_state_object,
    }

    @staticmethod
    def _list(value) -> list:
        if not isinstance(value, list):
            raise ModelFileError("malformed metadata: expected a list")
        return value

    def _kwargs(self, node) -> dict:
        value = self.decode(node)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ModelFileError("malformed metadata: expected a dict with string keys")
        return value

    def estimator_class(self, node: dict) -> type:
        from sklearn.base import BaseEstimator

        try:
            cls = self.cls(node.get("class"), "estimator")
        except ModelFileError:
            name = node.get("name")
            if not isinstance(name, str) or not name:
                raise
            # the class moved since the file was written: its registered name still finds it
            from kernelflow.registry import ESTIMATORS, _normalise, lookup_model_class

            path = ESTIMATORS.get(_normalise(name))
            found = None
            if path is not None:
                from kernelflow.registry import get_estimator_class

                try:
                    moved = get_estimator_class(_normalise(name))
                except (KeyError, ImportError):
                    moved = None
                if isinstance(moved, type):
                    found = lookup_model_class(f"{moved.__module__}:{moved.__qualname__}")
            if found is None or found[1] != "estimator":
                raise
            cls = found[0]
        if not issubclass(cls, BaseEstimator):
            raise ModelFileError(f"{node.get('class')} is not a scikit-learn estimator")
        return cls

    def estimator(self, node: dict):
        cls = self.estimator_class(node)
        params = self._kwargs(node["params"])
        _trust.check_attributes(cls, params, cls.__name__, state=False)
        try:
            est = cls(**params)
        except TypeError as exc:
            raise ModelFileError(f"parameters do not fit {cls.__name__}: {exc}") from None
        state = self._kwargs(node["state"])
        _trust.check_attributes(cls, state, cls.__name__, state=True)
        if hasattr(est, "_set_state"):
            est._set_state(state)
        else:
            for k, v in state.items():
                setattr(est, k, v)
        _trust.check_estimator(est, cls.__name__)
        return est


def _check_array_table(meta: dict, archive: _Archive) -> dict:
    """Check the metadata's array table against the zip directory; nothing is read."""
    listed = meta.get("arrays")
    if not isinstance(listed, dict):
        raise ModelFileError("metadata has no array table")
    present = set(archive.members) - {META_KEY}
    if present != set(listed):
        missing, unknown = sorted(set(listed) - present), sorted(present - set(listed))
        raise ModelFileError(
            f"arrays do not match the metadata (missing {missing[:5]}, unlisted {unknown[:5]})"
        )
    declared = 0
    for key, info in listed.items():
        if not isinstance(info, dict):
            raise ModelFileError(f"array {key}: malformed entry in the array table")
        dtype, shape = info.get("dtype"), info.get("shape")
        if not isinstance(dtype, str) or dtype not in _ARRAY_DTYPES:
            raise ModelFileError(f"array {key}: unsupported dtype {str(dtype)[:40]!r}")
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
            raise ModelFileError(f"array {key}: malformed shape {str(shape)[:40]}")
        dims = [_int(s, f"array {key}: a dimension") for s in shape]
        declared += math.prod(dims) * np.dtype(dtype).itemsize
    if declared > archive.size:
        raise ModelFileError(
            f"the array table declares {declared} bytes but the file has only {archive.size}"
        )
    return listed


def _read_arrays(listed: dict, archive: _Archive) -> dict[str, np.ndarray]:
    arrays = {}
    for key, info in listed.items():
        arr, digest = archive.read(key, info["dtype"], info["shape"])
        if digest != info.get("sha256"):
            raise ModelFileError(f"array {key} does not match its checksum")
        arrays[key] = arr
    return arrays


def load_model(path, *, device=None, trusted=(), allow_unsigned=False):
    """Load an estimator written by :func:`save_model`, executing nothing from the file.

    Every class the file names is looked up, by its exact ``"module:QualName"``, in the
    registry of classes kernelflow saves (:func:`kernelflow.registry.model_classes`) or in
    ``trusted``; nothing else is imported or called. Every array's dtype, shape and size is
    checked against the zip directory, the ``.npy`` header and the metadata before it is read,
    and the total is capped by the file size and the memory budget. Cost: one read of the file
    plus a SHA-256 pass over it (O(model size)); memory: the model's arrays once.

    Parameters
    ----------
    path : str or path-like
        Model file.
    device : str or torch.device, optional
        Move every tensor to this device (default: keep them on the CPU).
    trusted : iterable of classes, default=()
        Classes outside the registry that the file may instantiate (your own estimators or
        kernels); everything else outside it is refused. The rules on what a file may set
        (below) apply to them too.
    allow_unsigned : bool, default=False
        Also read a file whose metadata carries no ``metadata_sha256`` (written before it
        existed, or with it deleted). Such a file is refused by default: without it, a hand
        edit of the metadata goes unnoticed. Every other check still applies.

    Returns
    -------
    estimator : estimator
        The estimator, with the saved parameters and fitted state.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        For every other problem: not a model file, truncated or corrupt, unknown format
        version, members that are compressed, unlisted, duplicated or larger than the file or
        the memory budget, arrays whose dtype, shape or checksum disagree with the metadata,
        metadata edited after writing (its checksum) or without a checksum, classes outside
        the registry, parameters that do not fit the class, and anything the trust model
        refuses: attributes that shadow a method or are not the class's own, ``memory`` caches,
        worker processes or threads, paths, engine options, sizes or composite kernels beyond
        the memory budget and bounds, inconsistent fitted state of scikit-learn's libsvm
        models (see ``docs/model_format.md``).

    Examples
    --------
    >>> import os, tempfile
    >>> from sklearn.linear_model import Ridge
    >>> p = save_model(Ridge(alpha=3.0).fit([[0.0], [1.0]], [0.0, 1.0]),
    ...                os.path.join(tempfile.mkdtemp(), "m.npz"))
    >>> load_model(p).coef_.round(3)
    array([0.143])
    """
    reader = _Reader({}, device, trusted)
    meta, archive = _open(path)
    try:
        if CHECKSUM_KEY not in meta and not allow_unsigned:
            raise ModelFileError(
                f"the metadata carries no {CHECKSUM_KEY}, so edits to it cannot be detected; "
                "load_model(path, allow_unsigned=True) reads it if you trust where it came from"
            )
        node = meta.get("estimator")
        if not isinstance(node, dict):
            raise ModelFileError("metadata has no estimator")
        listed = _check_array_table(meta, archive)
        reader.estimator_class(node)  # the root node carries no "type"
        reader.check_classes(node)
        reader.arrays = _read_arrays(listed, archive)
        if CHECKSUM_KEY in meta and meta[CHECKSUM_KEY] != _metadata_digest(meta):
            raise ModelFileError(
                "the metadata does not match its checksum (edited or corrupted after writing)"
            )
        return reader.estimator(node)
    except ModelFileError as exc:
        raise ModelFileError(f"{path}: {exc}") from None
    except MemoryError:
        raise ModelFileError(f"{path}: not enough memory to load the model") from None
    except Exception as exc:  # noqa: BLE001 - whatever the file provokes is a file error
        raise ModelFileError(
            f"{path}: malformed model file ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    finally:
        archive.close()
