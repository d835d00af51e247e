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
    """Shape, dtype and finiteness checks of a tensor input; returns a detached real tensor.

    ``requires_grad`` tensors are detached; bool and integer tensors become float64, float16
    and bfloat16 become float32 (kernels are not computed in half precision); complex and
    other dtypes raise ``TypeError`` naming the dtype.
    """
    T = T.detach()
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
    if T.dtype in (torch.float16, torch.bfloat16):
        T = T.to(torch.float32)
    elif not T.is_floating_point():
        T = T.to(torch.float64)
    if not torch.isfinite(T).all():
        raise ValueError(f"Input {name} contains NaN or infinity.")
    return T


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def _check_array_dtype(name: str, A) -> None:
    """Refuse complex arrays (ValueError) and string arrays (TypeError), naming the dtype."""
    dtypes = getattr(A, "dtypes", None)
    if dtypes is not None and not isinstance(A, np.ndarray):  # pandas DataFrame or Series
        kinds = [np.dtype(d).kind if isinstance(d, np.dtype) else "O"
                 for d in (list(dtypes) if hasattr(dtypes, "__iter__") else [dtypes])]
        if any(k == "c" for k in kinds):
            raise ValueError(f"Complex data not supported: {name} has a complex column.")
        return
    dt = getattr(A, "dtype", None)
    if dt is None:
        if isinstance(A, str | bytes):
            raise TypeError(f"{name} must be array-like, got {type(A).__name__}.")
        return
    dt = np.dtype(dt) if not isinstance(dt, np.dtype) else dt
    if dt.kind == "c":  # a ValueError with scikit-learn's wording (its estimator checks)
        raise ValueError(f"Complex data not supported: {name} has dtype {dt}.")
    if dt.kind in "SUV":
        raise TypeError(f"{name} must be numeric, got dtype {dt}.")


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
              y_numeric=True, keep_float32=False):
    """Validate training data; returns ``(X, y, sample_weight, kind)`` with torch tensors.

    ``kind`` is ``"torch"`` when X is a torch tensor, else ``"numpy"``. X and y are float64
    unless X was a float32 tensor, or, with ``keep_float32``, a float32 array (NumPy or an
    all-float32 pandas frame: the estimators whose dtype follows the input's precision).
    ``sample_weight`` is None or a tensor of shape (n,) of non-negative weights.
    """
    if isinstance(X, torch.Tensor):
        Xt = _torch_checks("X", X, ndim=(2,))
        if y is None:
            raise ValueError("y cannot be None.")
        if not isinstance(y, torch.Tensor):
            _check_array_dtype("y", y)
            y_np = np.asarray(y)
            if y_np.dtype.kind not in "biuf":
                raise TypeError(f"y must be numeric, got dtype {y_np.dtype}.")
        yt = y if isinstance(y, torch.Tensor) else torch.as_tensor(y_np)
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
        _check_array_dtype("X", X)
        if isinstance(y, torch.Tensor):
            y = _torch_checks("y", y, ndim=(1, 2)).cpu().numpy()
        else:
            _check_array_dtype("y", y)
        kind = output_kind(X)
        np_dtype = np.float32 if keep_float32 and kind.dtype == np.float32 else np.float64
        Xn, yn = validate_data(
            estimator, X, y, reset=reset, multi_output=multi_output, y_numeric=y_numeric,
            dtype=np_dtype,
        )
        if np_dtype is np.float32 and y_numeric:
            with np.errstate(invalid="ignore"):
                big = np.abs(np.asarray(yn, dtype=np.float64)) > np.finfo(np.float32).max
            if bool(np.any(big)):
                raise ValueError("y holds values beyond the float32 range of X; pass float64 "
                                 "X (or dtype='float64') to fit them.")
        Xt = torch.from_numpy(np.array(Xn, dtype=np_dtype, order="C", copy=True))
        yt = torch.from_numpy(np.array(yn, dtype=np_dtype, order="C", copy=True))
        if y_numeric and not bool(torch.isfinite(yt).all()):  # object arrays skip sklearn's check
            raise ValueError("Input y contains NaN or infinity.")
    check_magnitude("X", Xt, axis_count=4 * Xt.shape[1])
    check_magnitude("y", yt, axis_count=yt.shape[0])
    sw = None
    if sample_weight is not None:
        if isinstance(sample_weight, torch.Tensor):
            sw_np = _torch_checks("sample_weight", sample_weight, ndim=(1,)).cpu().numpy()
        else:
            _check_array_dtype("sample_weight", sample_weight)
            sw_np = sample_weight
        sw_np = _check_sample_weight(sw_np, np.empty(Xt.shape[0]), dtype=np.float64,
                                     ensure_non_negative=True)
        sw = torch.as_tensor(sw_np, dtype=Xt.dtype, device=Xt.device)
    return Xt, yt, sw, kind


def check_X(estimator, X, *, reset=False):
    """Validate prediction inputs; returns ``(X, kind)``."""
    if isinstance(X, torch.Tensor):
        Xt = _torch_checks("X", X, ndim=(2,))
        if Xt.dtype not in (torch.float32, torch.float64):
            Xt = Xt.to(torch.float64)
        _set_n_features(estimator, Xt.shape[1], reset)
        check_magnitude("X", Xt, axis_count=4 * Xt.shape[1])
        return Xt, output_kind(X)
    _check_array_dtype("X", X)
    Xn = validate_data(estimator, X, reset=reset, dtype=np.float64)
    Xt = torch.from_numpy(np.array(Xn, dtype=np.float64, order="C", copy=True))
    check_magnitude("X", Xt, axis_count=4 * Xt.shape[1])
    return Xt, output_kind(X)


def as_tensor(A, *, dtype=None, device=None) -> torch.Tensor:
    """Array-like -> tensor (no copy when possible; tensors are detached)."""
    if isinstance(A, torch.Tensor):
        return A.detach().to(dtype=dtype or A.dtype, device=device or A.device)
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
        if X.dtype in (torch.float32, torch.float64):
            dtype = X.dtype
        elif X.dtype in (torch.float16, torch.bfloat16):  # computed in float32
            dtype = torch.float32
        else:
            dtype = torch.float64
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
