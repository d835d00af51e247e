"""One input wrapper for every estimator.

NumPy and pandas inputs go through scikit-learn's ``validate_data`` (which also records
``n_features_in_`` and ``feature_names_in_``); torch tensors get the same checks on their own
device. Either way the estimator receives torch tensors, and results go back in the input's kind.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np
import torch
from sklearn.utils.validation import _check_sample_weight, validate_data

from ._finite import check_magnitude

__all__ = ["check_X_y", "check_X", "to_output", "output_kind", "OutputKind", "check_positive",
           "as_tensor"]


def _torch_checks(name: str, T: torch.Tensor, *, ndim: tuple[int, ...]) -> torch.Tensor:
    if T.is_complex() or not (T.is_floating_point() or T.dtype in _INT_DTYPES):
        raise TypeError(f"{name} must be a real numeric tensor, got dtype {T.dtype}.")
    if T.ndim not in ndim:
        raise ValueError(
            f"Expected {name} with {' or '.join(map(str, ndim))} dimension(s), got shape "
            f"{tuple(T.shape)}."
        )
    if T.shape[0] == 0:
        raise ValueError(f"Found array with 0 sample(s) (shape={tuple(T.shape)}) in {name}.")
    if T.ndim == 2 and T.shape[1] == 0:
        raise ValueError(f"Found array with 0 feature(s) (shape={tuple(T.shape)}) in {name}.")
    if not T.is_floating_point():
        T = T.to(torch.float64)
    if not torch.isfinite(T).all():
        raise ValueError(f"Input {name} contains NaN or infinity.")
    return T


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def _set_n_features(estimator, n_features: int, reset: bool):
    if reset:
        estimator.n_features_in_ = n_features
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    elif hasattr(estimator, "n_features_in_") and estimator.n_features_in_ != n_features:
        raise ValueError(
            f"X has {n_features} features, but {type(estimator).__name__} is expecting "
            f"{estimator.n_features_in_} features as input."
        )


def check_X_y(estimator, X, y, *, reset=True, multi_output=True, sample_weight=None,
              y_numeric=True):
    """Validate training data; returns ``(X, y, sample_weight, kind)`` with torch tensors.

    ``kind`` is ``"torch"`` when X is a torch tensor, else ``"numpy"``. X and y are float64
    unless X was a float32 tensor. ``sample_weight`` is None or a tensor of shape (n,) of
    non-negative weights.
    """
    if isinstance(X, torch.Tensor):
        Xt = _torch_checks("X", X, ndim=(2,))
        yt = y if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y))
        if yt is None:
            raise ValueError("y cannot be None.")
        yt = _torch_checks("y", yt.to(Xt.device), ndim=(1, 2) if multi_output else (1,))
        if yt.shape[0] != Xt.shape[0]:
            raise ValueError(
                f"Found input variables with inconsistent numbers of samples: "
                f"[{Xt.shape[0]}, {yt.shape[0]}]"
            )
        dtype = Xt.dtype if Xt.dtype in (torch.float32, torch.float64) else torch.float64
        Xt, yt = Xt.to(dtype), yt.to(dtype)
        _set_n_features(estimator, Xt.shape[1], reset)
        kind = output_kind(X)
    else:
        Xn, yn = validate_data(
            estimator, X, y, reset=reset, multi_output=multi_output, y_numeric=y_numeric,
            dtype=np.float64,
        )
        Xt = torch.from_numpy(np.array(Xn, dtype=np.float64, order="C", copy=True))
        yt = torch.from_numpy(np.array(yn, dtype=np.float64, order="C", copy=True))
        kind = output_kind(X)
    sw = None
    if sample_weight is not None:
        sw_np = sample_weight.detach().cpu().numpy() if isinstance(
            sample_weight, torch.Tensor) else sample_weight
        sw_np = _check_sample_weight(sw_np, np.empty(Xt.shape[0]), dtype=np.float64,
                                     ensure_non_negative=True)
        sw = torch.as_tensor(sw_np, dtype=Xt.dtype, device=Xt.device)
    check_magnitude("X", Xt)
    check_magnitude("y", yt, axis_count=yt.shape[0])
    return Xt, yt, sw, kind


def check_X(estimator, X, *, reset=False):
    """Validate prediction inputs; returns ``(X, kind)``."""
    if isinstance(X, torch.Tensor):
        Xt = _torch_checks("X", X, ndim=(2,))
        if Xt.dtype not in (torch.float32, torch.float64):
            Xt = Xt.to(torch.float64)
        _set_n_features(estimator, Xt.shape[1], reset)
        check_magnitude("X", Xt)
        return Xt, output_kind(X)
    Xn = validate_data(estimator, X, reset=reset, dtype=np.float64)
    check_magnitude("X", Xn)
    Xt = torch.from_numpy(np.array(Xn, dtype=np.float64, order="C", copy=True))
    return Xt, output_kind(X)


def as_tensor(A, *, dtype=None, device=None) -> torch.Tensor:
    """Array-like -> tensor (no copy when possible)."""
    if isinstance(A, torch.Tensor):
        return A.to(dtype=dtype or A.dtype, device=device or A.device)
    return torch.as_tensor(np.asarray(A), dtype=dtype, device=device)


class OutputKind(str):
    """The kind of an input (``"numpy"`` or ``"torch"``) with the dtype and device results take.

    A ``str`` so that ``kind == "torch"`` keeps working; built by :func:`output_kind`.
    """

    dtype: object
    device: object

    def __new__(cls, kind: str, dtype: object = None, device: object = None) -> OutputKind:
        obj = super().__new__(cls, kind)
        obj.dtype = dtype
        obj.device = device
        return obj


def output_kind(X: object) -> OutputKind:
    """The output rule for input ``X`` (see :func:`to_output`)."""
    if isinstance(X, torch.Tensor):
        dtype = X.dtype if X.dtype in (torch.float32, torch.float64) else torch.float64
        return OutputKind("torch", dtype, X.device)
    np_dtype: Any = getattr(X, "dtype", None)
    dtypes = getattr(X, "dtypes", None)  # pandas DataFrame: one dtype per column
    if dtypes is not None and not isinstance(dtypes, np.dtype):
        try:
            np_dtype = np.float32 if len(dtypes) and all(
                np.dtype(t) == np.float32 for t in dtypes) else np.float64
        except TypeError:  # extension dtypes
            np_dtype = np.float64
    try:
        f32 = np_dtype is not None and np.dtype(np_dtype) == np.float32
    except TypeError:
        f32 = False
    return OutputKind("numpy", np.float32 if f32 else np.float64)


def to_output(T: torch.Tensor, kind: str):
    """Tensor -> the caller's kind, following the one output rule of the package.

    * torch tensor in -> torch tensor out, on the input's device, in its dtype (float32 or
      float64; integer tensors give float64);
    * NumPy array, pandas object or list in -> NumPy array out (as scikit-learn does), float32
      when the input is float32 (a float32 array or a DataFrame whose columns are all float32),
      else float64.

    ``kind`` is ``"numpy"``/``"torch"`` or the :class:`OutputKind` of the input, which carries
    the dtype and device; a plain string keeps the tensor's dtype.
    """
    dtype = getattr(kind, "dtype", None)
    if kind == "torch":
        device = getattr(kind, "device", None)
        if dtype is not None and T.is_floating_point():
            T = T.to(dtype=dtype)
        return T.to(device) if device is not None else T
    out = T.detach().cpu().numpy()
    if dtype is not None and out.dtype.kind == "f":
        out = out.astype(dtype, copy=False)
    return out


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """Return ``float(value)`` or raise ``ValueError`` if it is not a positive finite number."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {bound} finite number, got {value!r}.")
    return float(value)
