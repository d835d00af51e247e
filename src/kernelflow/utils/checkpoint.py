"""Checkpoints of long iterative fits: solver state written atomically, resumed by a re-run.

A checkpoint file is an uncompressed ``.npz`` archive in the layout of the model files
(:mod:`kernelflow.io`): a ``__kernelflow__`` member holding UTF-8 JSON metadata and one plain
numeric array ``a0``, ``a1``, ... per tensor or array of the state, never pickle. The metadata
lists every array with its dtype, shape and SHA-256 digest and carries a SHA-256 digest of
itself, so a truncated, corrupted or edited file is refused with a :class:`CheckpointError`
(a ``ValueError``). Writing goes to a temporary file in the destination directory, flushed and
``fsync``-ed, then ``os.replace``-d over the path: a kill during a write leaves the previous
checkpoint intact (and its temporary file, removed by the next write once the killed process
has ended).

The metadata also holds the *fingerprint* of the problem: the data (:func:`data_fingerprint`),
the estimator parameters that change the result (:func:`params_fingerprint`), the centres or
seeds, and the solver. :meth:`Checkpoint.load` refuses a checkpoint whose fingerprint differs
and names what differs.

Examples
--------
>>> import os, tempfile
>>> import torch
>>> path = os.path.join(tempfile.mkdtemp(), "fit.ckpt")
>>> ck = Checkpoint(path, interval=0, fingerprint={"solver": "demo", "n": 3})
>>> ck.load() is None                              # nothing to resume
True
>>> ck.save({"x": torch.arange(3.0), "k": 2, "losses": [0.5, float("inf")]})
>>> Checkpoint(path, fingerprint={"solver": "demo", "n": 3}).load()["losses"]
[0.5, inf]
>>> try:
...     Checkpoint(path, fingerprint={"solver": "demo", "n": 4}).load()
... except ValueError as exc:
...     print(str(exc).split(": ", 1)[1])
n differs (checkpoint 3, this fit 4). Delete the file to start this fit afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Callable
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._files import write_npz_atomically

__all__ = ["Checkpoint", "CheckpointError", "CHECKPOINT_CONSTRAINTS", "arrays_fingerprint",
           "data_fingerprint", "fit_checkpoint", "monitor_state", "params_fingerprint",
           "restore_monitor", "tensor_digest"]

FORMAT = "kernelflow-checkpoint"
FORMAT_VERSION = 1
_META = "__kernelflow__"
_CHECKSUM = "metadata_sha256"
_TORCH = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
    torch.uint8, torch.bool, torch.int16, torch.int8)}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, truncated, or written for another problem."""


def tensor_digest(value) -> str:
    """SHA-256 of an array's dtype, shape and C-order bytes (a tensor is read on the CPU)."""
    a = value.detach().cpu().contiguous().numpy() if isinstance(value, torch.Tensor) else \
        np.ascontiguousarray(value)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def data_fingerprint(source, *, stride: int = 61) -> dict:
    """Cheap identity of a data source: sizes, dtype and a digest of rows and column sums.

    One pass over ``source`` (anything with ``iter_blocks``, ``n_features``, ``n_outputs``):
    the digest covers the rows at global positions 0, ``stride``, 2 ``stride``, ... (inputs,
    targets and weights, in their stored dtype) and the float64 column sums of the inputs,
    targets and weights. Cost O(n d) additions and O(n d / stride) hashed bytes.
    """
    h = hashlib.sha256()
    n, dtype, sums = 0, None, None
    for b in source.iter_blocks(65536):
        parts = [p for p in (b.X, b.y, b.sample_weight) if p is not None]
        dtype = dtype or str(b.X.dtype).removeprefix("torch.")
        first = (-int(b.start)) % stride
        for p in parts:
            h.update(p[first::stride].detach().cpu().contiguous().numpy().tobytes())
        s = torch.cat([p.reshape(p.shape[0], -1).to(torch.float64).sum(0) for p in parts])
        sums = s if sums is None else sums + s
        n += b.X.shape[0]
    if sums is not None:
        h.update(sums.numpy().tobytes())
    return {"n_samples": n, "n_features": int(source.n_features),
            "n_outputs": int(source.n_outputs), "data_dtype": dtype,
            "sample_weight": bool(getattr(source, "has_weights", False)),
            "data_digest": h.hexdigest()}


class _Arrays:
    """Tensors seen as a data source by :func:`data_fingerprint`."""

    def __init__(self, X, y=None, sample_weight=None):
        self.X, self.y, self.w = X, y, sample_weight
        self.n_features = int(X.shape[1])
        self.n_outputs = 0 if y is None else int(y.reshape(y.shape[0], -1).shape[1])
        self.has_weights = sample_weight is not None

    def iter_blocks(self, size):
        from types import SimpleNamespace

        for i in range(0, self.X.shape[0], size):
            yield SimpleNamespace(
                X=self.X[i:i + size], start=i,
                y=None if self.y is None else self.y[i:i + size],
                sample_weight=None if self.w is None else self.w[i:i + size])


def arrays_fingerprint(X, y=None, sample_weight=None) -> dict:
    """:func:`data_fingerprint` of rows held as tensors."""
    return data_fingerprint(_Arrays(X, y, sample_weight))


def _param_text(value) -> str:
    if hasattr(value, "get_params") and not isinstance(value, type):
        return f"{type(value).__name__}({params_fingerprint(value.get_params(deep=False))})"
    if isinstance(value, torch.Tensor | np.ndarray):
        return "array:" + tensor_digest(value)
    if isinstance(value, np.random.RandomState):
        return "RandomState:" + hashlib.sha256(repr(value.get_state(legacy=False)).encode()
                                               ).hexdigest()
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor | np.ndarray)
                                               for v in value):
        return "[" + ", ".join(_param_text(v) for v in value) + "]"
    text = repr(value)
    if " at 0x" in text and hasattr(value, "__dict__"):  # a default repr names the address
        text = f"{type(value).__qualname__}({_param_text(vars(value))})"
    return text


def params_fingerprint(params: dict, exclude=()) -> dict:
    """The parameters as text (arrays and generators by digest), ``exclude`` left out."""
    return {f"param {k}": _param_text(v) for k, v in sorted(params.items()) if k not in exclude}


def monitor_state(monitor) -> dict:
    """The counters of an :class:`~kernelflow.utils.monitor.EarlyStopping` (None: none)."""
    if monitor is None:
        return {}
    return {"best_iteration": int(monitor.best_iteration), "best_loss": float(monitor.best_loss),
            "losses": [float(v) for v in monitor.losses], "no_change": int(monitor._no_change)}


def restore_monitor(monitor, state: dict) -> None:
    """Put the counters saved by :func:`monitor_state` back into ``monitor``."""
    if monitor is None or not state:
        return
    monitor.best_iteration = int(state["best_iteration"])
    monitor.best_loss = float(state["best_loss"])
    monitor.losses = [float(v) for v in state["losses"]]
    monitor._no_change = int(state["no_change"])


#: Constructor parameters of the estimators that checkpoint (scikit-learn constraints).
CHECKPOINT_CONSTRAINTS = {"checkpoint": [str, os.PathLike, None],
                          "checkpoint_interval": [Real]}

#: Parameters that never change a fit's result (left out of the fingerprint).
_NOT_RESULT = ("verbose", "checkpoint", "checkpoint_interval", "distributed")


def fit_checkpoint(estimator, solver: str, data: dict, **parts) -> Checkpoint | None:
    """The :class:`Checkpoint` of ``estimator.fit`` (None when ``estimator.checkpoint`` is None).

    The fingerprint holds ``solver``, the estimator class, ``data`` (from
    :func:`data_fingerprint`), every parameter that changes the result and ``parts`` (centres,
    kernel, starting coefficients...: arrays by digest).
    """
    path = getattr(estimator, "checkpoint", None)
    if path is None:
        return None
    interval = float(estimator.checkpoint_interval)
    if not interval >= 0:
        raise ValueError(f"checkpoint_interval must be >= 0 seconds, got {interval!r}.")
    fp = {"solver": solver, "estimator": type(estimator).__name__, **data}
    fp.update(params_fingerprint(estimator.get_params(deep=False), exclude=_NOT_RESULT))
    fp.update({k: _param_text(v) for k, v in parts.items()})
    hint = ""
    if not isinstance(getattr(estimator, "random_state", 0), int | np.integer):
        hint = (" (random_state is not an integer, so centres, seeds and shuffles are drawn "
                "anew by every fit: set an integer random_state for fits that can resume)")
    return Checkpoint(path, interval=interval, fingerprint=fp, hint=hint)


# ---- state encoding: tensors and arrays as members, the rest as JSON ---------------------------
def _encode(value, arrays: dict) -> Any:  # noqa: C901 - one branch per node type
    def add(a: np.ndarray) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = np.array(a, order="C", copy=True)  # 0-d stays 0-d
        return key

    if isinstance(value, torch.Tensor):
        dt = str(value.dtype).removeprefix("torch.")
        if dt not in _TORCH:
            raise TypeError(f"checkpoint: unsupported tensor dtype {value.dtype}")
        a = value.detach().cpu()
        if a.dtype == torch.bfloat16:
            a = a.view(torch.int16)
        return {"tensor": add(a.numpy()), "dtype": dt}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(f"checkpoint: unsupported array dtype {value.dtype}")
        return {"array": add(value)}
    if isinstance(value, bool | None | str):
        return value
    if isinstance(value, int | np.integer):
        return {"int": str(int(value))}
    if isinstance(value, float | np.floating):  # exact, infinities and NaN included
        return {"float": add(np.array(float(value)))}
    if isinstance(value, list | tuple):
        return {"list": [_encode(v, arrays) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[str(k), _encode(v, arrays)] for k, v in value.items()]}
    raise TypeError(f"checkpoint: cannot store a {type(value).__name__}")


def _decode(node, arrays: dict, device=None) -> Any:  # noqa: C901 - one branch per node type
    if node is None or isinstance(node, bool | str):
        return node
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise CheckpointError("corrupt state node")
    if "tensor" in node:
        dt = _TORCH.get(str(node.get("dtype")))
        if dt is None:
            raise CheckpointError(f"unknown tensor dtype {str(node.get('dtype'))[:20]!r}")
        t = torch.from_numpy(arrays[node["tensor"]].copy())
        t = t.view(torch.bfloat16) if dt == torch.bfloat16 else t.to(dt)
        return t if device is None else t.to(device)
    if "array" in node:
        return arrays[node["array"]].copy()
    if "int" in node:
        return int(node["int"])
    if "float" in node:
        return float(arrays[node["float"]])
    if "list" in node:
        return [_decode(v, arrays, device) for v in node["list"]]
    if "dict" in node:
        return {str(k): _decode(v, arrays, device) for k, v in node["dict"]}
    raise CheckpointError("corrupt state node")


def _digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != _CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Checkpoint:
    """The checkpoint file of one fit: loaded at the start, written every ``interval`` seconds.

    Parameters
    ----------
    path : str or path-like
        The checkpoint file. Its directory must exist.
    interval : float, default=60
        Least number of seconds between two writes (0: after every iteration or epoch).
    fingerprint : dict
        JSON values identifying the problem (data, parameters, centres, solver); a checkpoint
        whose fingerprint differs is refused.

    Notes
    -----
    Cost of a write: one copy of the state (O(size of the iterate)) plus an ``fsync``.
    """

    def __init__(self, path, *, interval: float = 60.0, fingerprint: dict, hint: str = ""):
        self.hint = hint
        self.path = Path(os.fspath(path))
        self.interval = float(interval)
        self.fingerprint = json.loads(json.dumps(fingerprint, allow_nan=False))
        self.n_saved = 0
        self._last = time.monotonic()
        self.resumed = False

    def load(self, device=None) -> dict | None:
        """The stored state, or None when there is no file; refuses a foreign or corrupt one.

        Tensors come back on ``device`` (default the CPU), with their stored dtype.
        """
        if not self.path.exists():
            return None
        where = str(self.path)
        try:
            with zipfile.ZipFile(self.path) as z:
                names = set(z.namelist())
            with np.load(self.path, allow_pickle=False) as f:
                if f"{_META}.npy" not in names:
                    raise CheckpointError("no metadata")
                meta = json.loads(f[_META].tobytes().decode("utf-8"))
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise CheckpointError("not a kernelflow checkpoint")
                if meta.get("format_version") != FORMAT_VERSION:
                    raise CheckpointError(f"unsupported version {meta.get('format_version')}")
                if meta.get(_CHECKSUM) != _digest(meta):
                    raise CheckpointError("the metadata does not match its checksum")
                arrays = {}
                for key, info in meta["arrays"].items():
                    if f"{key}.npy" not in names:
                        raise CheckpointError(f"array {key} is missing")
                    a = f[key]
                    if (a.dtype.str != info["dtype"] or list(a.shape) != info["shape"]
                            or hashlib.sha256(np.array(a, order="C").tobytes()).hexdigest()
                            != info["sha256"]):
                        raise CheckpointError(f"array {key} does not match its checksum")
                    arrays[key] = a
        except CheckpointError as exc:
            raise CheckpointError(
                f"checkpoint {where} is corrupt ({exc}). Delete the file to start the fit "
                "afresh.") from None
        except Exception as exc:  # noqa: BLE001 - whatever the file provokes is corruption
            raise CheckpointError(
                f"checkpoint {where} is corrupt or truncated ({type(exc).__name__}: "
                f"{str(exc)[:200]}). Delete the file to start the fit afresh.") from None
        self._check_fingerprint(meta.get("fingerprint"))
        try:
            state = _decode(meta["state"], arrays, device)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {where} is corrupt ({exc}). Delete the file to "
                                  "start the fit afresh.") from None
        self.resumed = True
        return state

    def _check_fingerprint(self, stored) -> None:
        if not isinstance(stored, dict):
            raise CheckpointError(f"checkpoint {self.path} has no problem fingerprint. Delete "
                                  "the file to start the fit afresh.")
        keys = sorted(set(stored) | set(self.fingerprint))
        diff = [k for k in keys if stored.get(k) != self.fingerprint.get(k)]
        if diff:
            def short(v):
                s = "absent" if v is None else str(v)
                return s if len(s) <= 40 else s[:37] + "..."
            what = "; ".join(f"{k} differs (checkpoint {short(stored.get(k))}, this fit "
                             f"{short(self.fingerprint.get(k))})" for k in diff[:6])
            raise CheckpointError(
                f"checkpoint {self.path} was written for another problem: {what}. Delete the "
                f"file to start this fit afresh.{self.hint}")

    def save(self, state: dict) -> None:
        """Write ``state`` (tensors, arrays, numbers, strings, lists, dicts) atomically."""
        arrays: dict[str, np.ndarray] = {}
        tree = _encode(state, arrays)
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "fingerprint": self.fingerprint, "state": tree,
                "arrays": {k: {"dtype": a.dtype.str, "shape": list(a.shape),
                               "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
                           for k, a in arrays.items()}}
        meta[_CHECKSUM] = _digest(meta)
        blob = np.frombuffer(json.dumps(meta, allow_nan=False).encode("utf-8"), dtype=np.uint8)
        write_npz_atomically(self.path, {_META: blob, **arrays})
        self.n_saved += 1
        self._last = time.monotonic()

    def maybe_save(self, make_state: Callable[[], dict]) -> bool:
        """Write ``make_state()`` when ``interval`` seconds have passed since the last write."""
        if time.monotonic() - self._last < self.interval:
            return False
        self.save(make_state())
        return True

    def finish(self) -> None:
        """The fit is complete: remove the file (a later fit starts afresh)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
