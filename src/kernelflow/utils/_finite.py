"""Finite inputs that overflow inside a fit: refused up front with a message naming the input.

Every kernel of the package works with squared distances or inner products of rows, and every
solver with sums of squared residuals. Inputs whose squares overflow the floating-point type
(X or y around 1e300 in float64, 1e20 in float32) would silently give ``inf - inf = NaN`` kernels
and NaN predictions; they are refused here instead, and so are bandwidths whose square or inverse
square is not a normal number.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "check_magnitude", "check_bandwidth", "check_finite_output", "magnitude_limit",
    "DivergenceError", "NotPositiveDefiniteError", "MemoryBudgetError",
]


_FMAX: dict = {}


def magnitude_limit(dtype, count: int) -> float:
    """Largest |value| whose squares, summed ``4 * count`` times, stay finite in ``dtype``."""
    fmax = _FMAX.get(dtype)
    if fmax is None:
        fmax = _FMAX[dtype] = float(torch.finfo(dtype).max) if isinstance(dtype, torch.dtype) \
            else float(np.finfo(dtype).max)
    return math.sqrt(fmax / (4.0 * max(1, int(count))))


def check_magnitude(name: str, T, *, axis_count: int | None = None) -> None:
    """Raise ``ValueError`` if ``T`` holds values whose squares overflow its float type.

    ``axis_count`` is the number of terms summed (features for X, rows for y); by default the
    number of columns of a 2-d ``T`` or of rows of a 1-d ``T``.

    Examples
    --------
    >>> import numpy as np
    >>> check_magnitude("X", np.ones((3, 2)))
    >>> check_magnitude("X", np.full((3, 2), 1e300))
    Traceback (most recent call last):
    ...
    ValueError: X has values up to 1e+300 in magnitude: ...
    """
    if isinstance(T, torch.Tensor):
        if T.numel() == 0 or not T.is_floating_point():
            return
        amax = float(T.detach().abs().max())
        dtype = T.dtype
    else:
        T = np.asarray(T)
        if T.size == 0 or T.dtype.kind != "f":
            return
        amax = float(np.max(np.abs(T)))
        dtype = T.dtype
    if axis_count is None:
        axis_count = T.shape[1] if T.ndim == 2 else T.shape[0]
    limit = magnitude_limit(dtype, axis_count)
    if amax > limit:
        kind = "squared distances and inner products" if name.startswith("X") else \
            "sums of squared residuals"
        raise ValueError(
            f"{name} has values up to {amax:.3g} in magnitude: its {kind} overflow "
            f"{str(dtype).replace('torch.', '')} (limit {limit:.3g} here). Rescale {name} "
            "(e.g. divide by its scale, or use sklearn.preprocessing.StandardScaler)."
        )


def check_bandwidth(kernel) -> None:
    """Raise ``ValueError`` if a kernel's ``sigma``/``gamma`` gives an infinite or zero scale.

    ``sigma`` is squared and inverted by the kernels (``exp(-d² / 2σ²)``); a ``sigma`` whose
    square overflows or whose inverse square overflows (about 1e154 or 1e-154) gives ``0 · inf``
    products, i.e. NaN kernels.
    """
    for attr in ("sigma", "gamma"):
        v = getattr(kernel, attr, None)
        if v is None:
            continue
        try:
            vals = np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v,
                              dtype=np.float64).ravel()
        except (TypeError, ValueError):
            continue
        with np.errstate(over="ignore", divide="ignore"):
            sq, inv = vals * vals, 1.0 / (vals * vals)
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(sq)) and np.all(sq > 0)
                and np.all(np.isfinite(inv))):
            raise ValueError(
                f"{attr}={v!r} is out of range: its square or inverse square is not a finite "
                f"positive float64 (use a {attr} between about 1e-150 and 1e150, in the units "
                "of X)."
            )


def check_finite_output(name: str, T, what: str = "prediction") -> None:
    """Raise ``ValueError`` if a result has NaN or infinite entries (a last safeguard)."""
    if isinstance(T, tuple | list):
        for part in T:
            check_finite_output(name, part, what)
        return
    if isinstance(T, torch.Tensor):
        ok = bool(torch.isfinite(T).all()) if T.is_floating_point() else True
    elif hasattr(T, "tocoo") or not isinstance(T, np.ndarray | float | int):
        return  # sparse matrices, data frames, other containers: not inspected
    else:
        A = np.asarray(T)
        ok = bool(np.all(np.isfinite(A))) if A.dtype.kind in "fc" else True
    if not ok:
        raise ValueError(
            f"{name} produced a non-finite {what}: the model or the input is out of the "
            "floating-point range (rescale X and y, or choose a larger regularisation)."
        )


class DivergenceError(ValueError, FloatingPointError):
    """An iteration diverged or overflowed: the step size is too large for the problem.

    A :class:`ValueError` (the input or a parameter is out of range) and, for compatibility, a
    :class:`FloatingPointError`. Importable as ``kernelflow.solvers.paths.DivergenceError``.
    """


DivergenceError.__module__ = "kernelflow.solvers.paths"


class NotPositiveDefiniteError(ValueError, torch.linalg.LinAlgError):
    """A factorisation or eigensolver failed on a kernel matrix (a ``ValueError``).

    Also a ``torch.linalg.LinAlgError`` so that existing handlers keep catching it.
    """


NotPositiveDefiniteError.__module__ = "kernelflow.linalg"


class MemoryBudgetError(ValueError, MemoryError):
    """A model or an allocation would exceed the memory this process may use.

    Raised before allocating, with advice (a smaller size that fits). Both a ``ValueError`` (a
    parameter is too large for this machine) and a ``MemoryError``.
    """

    __kernelflow_advice__ = True


MemoryBudgetError.__module__ = "kernelflow.operators"
