"""Shared pieces of the path functions: result type, input checks, batch layout."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...utils._finite import DivergenceError
from ._operator import path_operator

__all__ = ["DivergenceError", "PathResult", "Callback", "SPECTRAL_MAX_N",
           "EXACT_EIGENVALUE_MAX_N"]

#: Largest n for which gradient descent uses the eigendecomposition when ``method="auto"``.
SPECTRAL_MAX_N = 2000
#: Largest n for which the top eigenvalue is computed exactly rather than by power iteration.
EXACT_EIGENVALUE_MAX_N = 2000

Callback = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None"], "bool | None"]


@dataclass
class PathResult:
    """Outcome of a path run.

    Attributes
    ----------
    alpha : tensor of shape (n,) or (n, t)
        Coefficients after ``n_iter`` steps.
    residual : tensor like ``alpha``
        ``y - K alpha``.
    n_iter : int
        Number of steps taken (the iterate index of ``alpha``).
    learning_rate : float
        Step size used.
    path : tensor of shape (n_iter + 1, n) or (n_iter + 1, n, t), or None
        Every iterate alpha_0 = 0, ..., alpha_{n_iter} when recorded.
    eval_predictions : tensor of shape (m,) or (m, t), or None
        ``K_eval @ alpha`` when ``K_eval`` was given.
    stopped_by_callback : bool
        Whether the callback ended the run.
    """

    alpha: torch.Tensor
    residual: torch.Tensor
    n_iter: int
    learning_rate: float
    path: torch.Tensor | None = None
    eval_predictions: torch.Tensor | None = None
    stopped_by_callback: bool = False



def _prepare(K, y, K_eval):
    Km = path_operator(K, symmetric=True)  # a training kernel: its columns are its rows
    n = Km.shape[0]
    if Km.shape[0] != Km.shape[1]:
        raise ValueError(f"K must be square, found shape {Km.shape}.")
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}.")
    if y.ndim not in (1, 2) or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, t), found {tuple(y.shape)}.")
    if not torch.isfinite(y).all():
        raise ValueError("y contains NaN or infinity.")
    Y = y.reshape(n, -1).T.to(Km.dtype).contiguous()  # batch layout (t, n)
    Em = None
    if K_eval is not None:
        Em = path_operator(K_eval, "K_eval")
        if Em.shape[1] != n:
            raise ValueError(f"K_eval must have {n} columns, found shape {Em.shape}.")
    return Km, Y, Em


def _sample_weight(sample_weight, n: int, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor | None:
    """Positive finite weights of shape (n,) in ``dtype`` on ``device``, or None."""
    if sample_weight is None:
        return None
    w = sample_weight.to(device=device, dtype=dtype).reshape(-1)
    if w.shape[0] != n or not bool((w > 0).all()) or not bool(torch.isfinite(w).all()):
        raise ValueError("sample_weight must hold one positive finite weight per row of K.")
    return w


def _out(A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # batch layout (t, n) -> like y
    return A.T.reshape(A.shape[1], *y.shape[1:]) if y.ndim == 2 else A[0]


def _after_step(k, alpha, R, E, path, callback, state: dict | None = None, **loop) -> bool:
    """Record step ``k`` of a path loop (the iterate, ``state``, the callback); True: the
    callback stops.

    ``state`` (a dict, or None) is updated before the callback with ``k``, ``alpha``, ``R``,
    ``E`` and the loop's other variables ``loop`` (references, not copies): what a checkpoint
    writes and :func:`_resumed` reads back.
    """
    if path is not None:
        path.append(alpha.clone())
    if state is not None:
        state.update(k=k, alpha=alpha, R=R, E=E, **loop)
    return callback is not None and bool(callback(k, alpha, R, E))


def _resumed(state: dict | None, names: tuple[str, ...]) -> tuple | None:
    """``(k, *variables)`` of a path loop from a ``state`` saved by :func:`_after_step`
    (tensors cloned, in the order of ``names``), or None when there is nothing to resume."""
    if state is None or "k" not in state:
        return None
    values = (state[name] for name in names)
    return (int(state["k"]), *(v.clone() if isinstance(v, torch.Tensor) else v for v in values))


def _path_result(alpha, R, E, y, k, eta, path, stopped) -> PathResult:
    """The :class:`PathResult` of a path loop, in the layout of ``y``."""
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack([_out(a, y) for a in path]),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


def _check_eta(eta) -> float:
    eta = float(eta)
    if not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"learning_rate must be a positive finite number, got {eta}.")
    return eta

