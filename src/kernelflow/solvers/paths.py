"""Early-stopped kernel regression paths from alpha = 0: gradient, sign and coordinate descent.

All three minimise the kernel least-squares objective in its dual form (Allerbo, Eq. 5b with
lambda = 0), ``1/2 ||y - K alpha||^2_{K^-1} = 1/2 alpha^T K alpha - y^T alpha + const``, whose
gradient is ``K alpha - y = -r``. Starting from alpha_0 = 0 and stopping after k steps of size eta
(training time t = k eta) regularises like a penalty of strength 1/t:

* gradient descent (KGD, Eq. 8): ``alpha += eta r``; ridge-like;
* sign gradient descent (KSGD, Eq. 24): ``alpha += eta sign(r)``, sign(0) = 0; an l-infinity
  regulariser in alpha, least absolute deviations in feature space: robust;
* coordinate descent (KCD, forward stagewise): ``alpha_m += eta sign(r_m)`` for every m attaining
  ``max |r|``; an l1 regulariser in alpha: sparse.

The single-step functions (:func:`gradient_step`, :func:`momentum_step`, :func:`sign_step`,
:func:`coordinate_step`) act on the last dimension, so a batch ``(B, n)`` of independent problems
(folds x bandwidths) advances in one call. The path functions keep the residual up to date at the
cost of each method's actual change: one kernel column per coordinate step (O(n)), the rows of K
whose residual sign flipped per sign step, and for gradient descent every iterate from one
eigendecomposition, ``alpha_k = U diag((1 - (1 - eta s)^k) / s) U^T y``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..linalg import power_iteration, symmetric_eigh
from ..operators import KernelOperator, memory_budget
from ..utils._progress import progress
from . import _native

__all__ = [
    "DivergenceError",
    "PathResult",
    "gradient_step",
    "momentum_step",
    "sign_step",
    "coordinate_direction",
    "coordinate_step",
    "largest_eigenvalue",
    "gradient_learning_rate",
    "sign_learning_rate",
    "coordinate_learning_rate",
    "check_gradient_learning_rate",
    "sign_monotone_step",
    "coordinate_monotone_step",
    "spectral_filter",
    "gradient_descent_path",
    "sign_gradient_path",
    "coordinate_descent_path",
]

logger = logging.getLogger(__name__)

#: Largest n for which gradient descent uses the eigendecomposition when ``method="auto"``.
SPECTRAL_MAX_N = 2000
#: Largest n for which the top eigenvalue is computed exactly rather than by power iteration.
EXACT_EIGENVALUE_MAX_N = 2000

Callback = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None"], "bool | None"]


from ..utils._finite import DivergenceError  # noqa: E402 - a ValueError and FloatingPointError


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


# ---- single steps (batch-agnostic: the last dimension indexes training points) ----
def gradient_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel gradient-descent step ``alpha + eta r`` (Eq. 8), r = y - K alpha.

    Works on any batch shape ``(..., n)``; ``eta`` is a float or broadcasts (e.g. shape (B, 1)).

    Examples
    --------
    >>> import torch
    >>> gradient_step(torch.zeros(3), torch.tensor([1.0, -2.0, 0.0]), 0.5).tolist()
    [0.5, -1.0, 0.0]
    """
    return alpha + eta * residual


def momentum_step(alpha: torch.Tensor, alpha_prev: torch.Tensor, residual: torch.Tensor, eta,
                  momentum) -> torch.Tensor:
    """Heavy-ball / Nesterov step ``alpha + gamma (alpha - alpha_prev) + eta r`` (Remark 4.2).

    For heavy ball, ``residual`` is ``y - K alpha``; for Nesterov it is taken at the look-ahead
    point ``alpha + gamma (alpha - alpha_prev)``. Shapes ``(..., n)``.

    Examples
    --------
    >>> import torch
    >>> momentum_step(torch.ones(2), torch.zeros(2), torch.ones(2), 0.25, 0.5).tolist()
    [1.75, 1.75]
    """
    return alpha + momentum * (alpha - alpha_prev) + eta * residual


def sign_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel sign-gradient step ``alpha + eta sign(r)`` with sign(0) = 0 (Eq. 24).

    Examples
    --------
    >>> import torch
    >>> sign_step(torch.zeros(3), torch.tensor([0.3, -2.0, 0.0]), 0.25).tolist()
    [0.25, -0.25, 0.0]
    """
    return alpha + eta * torch.sign(residual)


def coordinate_direction(residual: torch.Tensor) -> torch.Tensor:
    """``I_inf(r)``: sign(r_d) on every coordinate attaining max_d |r_d| (all ties), else 0.

    Operates on the last dimension; a zero residual gives a zero direction.

    Examples
    --------
    >>> import torch
    >>> coordinate_direction(torch.tensor([[0.5, -2.0, 2.0], [1.0, 0.0, -0.5]])).tolist()
    [[0.0, -1.0, 1.0], [1.0, 0.0, -0.0]]
    """
    a = residual.abs()
    top = a.amax(dim=-1, keepdim=True)
    return torch.sign(residual) * (a == top)


def coordinate_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel coordinate-descent step ``alpha + eta I_inf(r)`` (forward stagewise).

    Examples
    --------
    >>> import torch
    >>> coordinate_step(torch.zeros(3), torch.tensor([0.5, -2.0, 1.0]), 0.25).tolist()
    [0.0, -0.25, 0.0]
    """
    return alpha + eta * coordinate_direction(residual)


# ---- matrices: dense tensors and kernel operators behind one interface ----
class _Matrix:
    """Rows/columns/products of a dense K or a :class:`KernelOperator` in batch layout."""

    def __init__(self, K, name: str = "K", cache_columns: bool = False):
        if isinstance(K, torch.Tensor):
            if K.ndim != 2:
                raise ValueError(f"{name} must be a 2-D matrix, found shape {tuple(K.shape)}.")
            self.dense, self.op = K, None
        elif isinstance(K, KernelOperator):
            self.dense, self.op = None, K
        else:
            raise TypeError(f"{name} must be a torch.Tensor or KernelOperator, got "
                            f"{type(K).__name__}.")
        self.shape = tuple(K.shape)
        self.dtype = K.dtype
        self.device = K.device
        self._dense_t = None
        self._cols: dict[int, torch.Tensor] = {}
        self._cap = 0
        if cache_columns and self.op is not None:
            # Coordinate descent revisits the same few coordinates: keep their columns, within
            # half the memory budget.
            budget = memory_budget(self.op.options, self.device) // 2
            self._cap = int(budget // max(1, self.shape[0] * K.X1.element_size()))

    def rmatmul(self, A: torch.Tensor) -> torch.Tensor:  # A: (B, n2) -> (B, n1) = (K A^T)^T
        if self.dense is not None:
            return A @ self.dense.T
        return (self.op @ A.T.contiguous()).T

    def _op_column(self, i: int) -> torch.Tensor:  # (n1,) contiguous, cached
        col = self._cols.get(i)
        if col is None:
            col = self.op.columns([i])[:, 0].contiguous()
            if len(self._cols) < self._cap:
                self._cols[i] = col
        return col

    def columns_t(self, idx: torch.Tensor, symmetric: bool = False) -> torch.Tensor:
        """K[:, idx]^T of shape (len(idx), n1), gathered from contiguous rows."""
        if self.dense is not None:
            if symmetric:
                return self.dense[idx]
            if self._dense_t is None:  # transpose once so that columns are contiguous rows
                self._dense_t = self.dense.T.contiguous()
            return self._dense_t[idx]
        if self._cap == 0:
            return self.op.columns(idx).T
        return torch.stack([self._op_column(i) for i in idx.tolist()])

    def column(self, j: int, symmetric: bool = False) -> torch.Tensor:  # -> (n1,) contiguous
        if self.dense is not None:
            if symmetric:
                return self.dense[j]
            if self._dense_t is None:
                self._dense_t = self.dense.T.contiguous()
            return self._dense_t[j]
        return self._op_column(j) if self._cap else self.op.columns([j])[:, 0]

    def to_dense(self) -> torch.Tensor:
        return self.dense if self.dense is not None else self.op.to_dense()

    def fits(self) -> bool:
        return self.dense is not None or self.op.fits_in_memory(copies=3)

    def diagonal(self) -> torch.Tensor:
        return self.dense.diagonal() if self.dense is not None else self.op.diagonal()


def _prepare(K, y, K_eval):
    Km = _Matrix(K)
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
        Em = _Matrix(K_eval, "K_eval")
        if Em.shape[1] != n:
            raise ValueError(f"K_eval must have {n} columns, found shape {Em.shape}.")
    return Km, Y, Em


def _out(A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # batch layout (t, n) -> like y
    return A.T.reshape(A.shape[1], *y.shape[1:]) if y.ndim == 2 else A[0]


def _native_path(method: str, Km: _Matrix, Y: torch.Tensor, Em, y: torch.Tensor, eta: float,
                 max_iter: int, name: str) -> PathResult | None:
    """The whole path in compiled code (one problem per target), or None where it cannot run.

    Used for a dense symmetric K on the CPU when no callback, recording or tolerance needs the
    iterates: the same update rules, with K alpha kept as a running sum (see
    :mod:`._native`); the residual returned is recomputed as y - K alpha.
    """
    if Km.dense is None or not _native.available(method, Km.dense):
        return None
    B, n = Y.shape
    ones = torch.ones(1, n, dtype=Y.dtype)
    _, _, n_iter, alpha = _native.run_problems(
        method, Km.dense.unsqueeze(0), Y, ones, torch.zeros_like(ones), np.zeros(B),
        np.arange(B), np.zeros(B), eta=eta, max_iter=max_iter, return_alpha=True)
    R = Y - Km.rmatmul(alpha)
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError(f"{name} produced a non-finite residual.")
    E = None if Em is None else Em.rmatmul(alpha)
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=int(n_iter.max(initial=0)),
        learning_rate=eta, path=None, eval_predictions=None if E is None else _out(E, y),
        stopped_by_callback=False,
    )


def _check_eta(eta) -> float:
    eta = float(eta)
    if not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"learning_rate must be a positive finite number, got {eta}.")
    return eta


# ---- step sizes ----
def largest_eigenvalue(K, n_iter: int = 50) -> float:
    """Upper estimate of s_max(K): exact (eigvalsh) for dense n <= 2000, else power iteration.

    Power iteration estimates from below; the estimate is inflated by 5% and capped at the trace
    bound s_max <= trace(K). Cost O(n^3) exact, else ``n_iter`` products with K.

    Examples
    --------
    >>> import torch
    >>> round(largest_eigenvalue(torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)), 6)
    3.0
    """
    Km = _Matrix(K)
    n = Km.shape[0]
    if n == 0:
        return 0.0
    if n <= EXACT_EIGENVALUE_MAX_N and Km.fits():
        D = Km.to_dense()
        return float(torch.linalg.eigvalsh(0.5 * (D + D.T).to(torch.float64))[-1].clamp_min(0))
    est = power_iteration(lambda v: Km.rmatmul(v[None].to(Km.dtype))[0].to(torch.float64), n,
                          device=Km.device, n_iter=n_iter)
    trace = float(Km.diagonal().sum())
    return min(1.05 * est, trace) if trace > 0 else 1.05 * est


def gradient_learning_rate(K, s_max: float | None = None) -> float:
    """Safe gradient-descent step ``1 / s_max(K)`` (Prop 5.3: eta <= 2 / s_max keeps ||r||_2
    non-increasing; 1 / s_max also makes every spectral factor 1 - eta s non-negative).

    Examples
    --------
    >>> import torch
    >>> round(gradient_learning_rate(torch.eye(3, dtype=torch.float64) * 4), 4)
    0.25
    """
    s = largest_eigenvalue(K) if s_max is None else float(s_max)
    return 1.0 / s if s > 0 else 1.0


def check_gradient_learning_rate(eta: float, s_max: float, momentum: float = 0.0,
                                 nesterov: bool = False) -> None:
    """Raise :class:`DivergenceError` if gradient descent with step ``eta`` cannot converge.

    Plain GD needs eta s_max < 2; heavy ball eta s_max < 2 (1 + gamma); Nesterov
    eta s_max < (2 + 2 gamma) / (1 + 2 gamma) (stability of the two-term recurrence).

    Examples
    --------
    >>> check_gradient_learning_rate(1.0, 3.0)
    Traceback (most recent call last):
    ...
    kernelflow.solvers.paths.DivergenceError: ...
    """
    g = float(momentum)
    bound = 2.0 * (1 + g) / (1 + 2 * g) if nesterov else 2.0 * (1 + g)
    if eta * s_max > bound * (1 + 1e-9):
        raise DivergenceError(
            f"learning_rate={eta:.4g} diverges for this kernel matrix: learning_rate * s_max(K) = "
            f"{eta * s_max:.4g} exceeds {bound:.4g} (s_max(K) ~ {s_max:.4g}); use "
            f"learning_rate <= {bound / s_max:.4g} or learning_rate='auto'."
        )


def _rms(Y: torch.Tensor) -> float:
    v = float(Y.pow(2).mean().sqrt()) if Y.numel() else 0.0
    return v if v > 0 else 1.0


def sign_learning_rate(K, y: torch.Tensor, resolution: float = 0.01,
                       s_max: float | None = None) -> float:
    """Default sign-descent step ``resolution * rms(y) / s_max(K)``.

    One step changes the fitted values by ``eta ||K sign(r)||_2 <= eta s_max sqrt(n)``, i.e. by at
    most ``resolution ||y||_2``. Sign descent cannot diverge (|alpha_i| <= k eta), so this only sets
    the resolution of the path; the paper's fixed 0.01 remains available.

    Examples
    --------
    >>> import torch
    >>> round(sign_learning_rate(torch.eye(4, dtype=torch.float64), torch.ones(4)), 4)
    0.01
    """
    # Only sets the resolution, so a rough estimate (10 products when matrix-free) suffices.
    s = largest_eigenvalue(K, n_iter=10) if s_max is None else float(s_max)
    return resolution * _rms(y) / (s if s > 0 else 1.0)


def coordinate_learning_rate(K, y: torch.Tensor, resolution: float = 0.01) -> float:
    """Default coordinate-descent step ``resolution * max|y| / max_i K_ii``.

    A step on coordinate m changes r_m by eta K_mm: about 1% of the largest residual. Cost O(n).

    Examples
    --------
    >>> import torch
    >>> round(coordinate_learning_rate(torch.eye(3, dtype=torch.float64), torch.tensor([1., 2.])),
    ...       4)
    0.02
    """
    d = float(_Matrix(K).diagonal().abs().max()) if K.shape[0] else 1.0
    m = float(y.abs().max()) if y.numel() else 1.0
    return resolution * (m if m > 0 else 1.0) / (d if d > 0 else 1.0)


def sign_monotone_step(residual: torch.Tensor, K_sign: torch.Tensor) -> torch.Tensor:
    """Largest step keeping ||r||_1 non-increasing for sign descent: min_i |r_i| / |(K s)_i|.

    The corrected form of Prop 5.3 (the paper's ``min_i |r_i|`` is not sufficient): no residual
    changes sign, so ||r - eta K s||_1 = ||r||_1 - eta s^T K s. ``K_sign`` is K sign(r); last
    dimension. Returns +inf where K sign(r) = 0.

    Examples
    --------
    >>> import torch
    >>> float(sign_monotone_step(torch.tensor([1.0, -0.5]), torch.tensor([2.0, -2.0])))
    0.25
    """
    ratio = residual.abs() / K_sign.abs()
    ratio = torch.where(K_sign == 0, torch.full_like(ratio, math.inf), ratio)
    return ratio.amin(dim=-1)


def coordinate_monotone_step(residual: torch.Tensor, K_column: torch.Tensor,
                             m: int) -> torch.Tensor:
    """Largest step keeping ||r||_inf non-increasing when coordinate m = argmax |r| moves.

    Corrected Prop 5.3: eta <= min_i (|r_m| + sign(K_im s) r_i) / |K_im| over K_im != 0, with
    s = sign(r_m); this is necessary and sufficient. ``K_column`` is K[:, m]; 1-D inputs.

    Examples
    --------
    >>> import torch
    >>> r = torch.tensor([1.0, -0.95]); col = torch.tensor([1.0, 0.9])
    >>> round(float(coordinate_monotone_step(r, col, 0)), 4)
    0.0556
    """
    s = torch.sign(residual[m])
    a = K_column * s
    bound = (residual[m].abs() + torch.sign(a) * residual) / a.abs()
    bound = torch.where(a == 0, torch.full_like(bound, math.inf), bound)
    return bound.amin()


# ---- gradient descent ----
def spectral_filter(s: torch.Tensor, eta: float, iterations: torch.Tensor) -> torch.Tensor:
    """phi_k(s) = (1 - (1 - eta s)^k) / s, with phi_k(0) = k eta: alpha_k = U phi_k(S) U^T y.

    ``s`` has shape (..., n), ``iterations`` shape (K,); returns (K, ..., n). The discrete
    counterpart of the gradient-flow filter (1 - exp(-t s)) / s (Eq. 10) at t = k eta.

    Examples
    --------
    >>> import torch
    >>> spectral_filter(torch.tensor([0.0, 1.0], dtype=torch.float64), 0.5,
    ...                 torch.tensor([2])).tolist()
    [[1.0, 0.75]]
    """
    k = iterations.to(s.dtype).reshape(-1, *([1] * s.ndim))
    x = eta * s
    base = 1.0 - x
    small = x < 0.5
    # log1p/expm1 keep 1 - (1 - x)^k accurate when eta s is tiny.
    num_small = -torch.expm1(k * torch.log1p(-torch.where(small, x, torch.zeros_like(x))))
    num = torch.where(small, num_small, 1.0 - base.pow(k))
    safe_s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.where(s > 0, num / safe_s, k * eta)


def gradient_descent_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, momentum: float = 0.0,
    nesterov: bool = False, method: str = "auto", K_eval=None, callback: Callback | None = None,
    record_path: bool = False, tol: float = 0.0, eigh: tuple | None = None, verbose: int = 0,
) -> PathResult:
    """Kernel gradient descent from alpha_0 = 0: ``alpha_{k+1} = alpha_k + eta (y - K alpha_k)``.

    With ``momentum`` gamma: ``alpha_{k+1} = alpha_k + gamma v_k + eta (y - K(alpha_k +
    [nesterov] gamma v_k))``, v_k = alpha_k - alpha_{k-1} (Remark 4.2; the flow limit is gradient
    flow at time t / (1 - gamma)).

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is 1 / s_max(K) (:func:`gradient_learning_rate`).
    max_iter : int, default=1000
    momentum : float in [0, 1), default=0.0
    nesterov : bool, default=False
    method : {"auto", "spectral", "iterative"}, default="auto"
        "spectral" diagonalises K once (O(n^3)) and then gives every iterate in O(n^2) with no
        error accumulation (momentum runs its recurrence in the eigenbasis at O(n) per step);
        "iterative" costs one product with K per step and works matrix-free. "auto" picks
        spectral when K fits in memory and n <= 2000.
    K_eval : tensor of shape (m, n) or KernelOperator, optional
        Evaluation kernel (e.g. validation rows); ``K_eval @ alpha_k`` is passed to the callback.
    callback : callable, optional
        ``callback(k, alpha_k, r_k, f_eval_k)`` after every iterate, k = 0 (alpha = 0), 1, ...;
        tensors in batch layout (t, n) / (t, m). Returning True stops the run.
    record_path : bool, default=False
        Keep every iterate in ``PathResult.path``.
    tol : float, default=0.0
        Stop once ||r_k||_2 <= tol ||y||_2.
    eigh : tuple (s, U), optional
        A precomputed eigendecomposition of K (``kernelflow.linalg.symmetric_eigh``) for the
        spectral method.
    verbose : int, default=0

    Returns
    -------
    PathResult

    Raises
    ------
    DivergenceError
        If the residual grows (plain GD: above ||y||, which cannot happen for eta <= 2 / s_max),
        or becomes non-finite.

    Notes
    -----
    Closed form of the discrete iteration: alpha_k = (I - (I - eta K)^k) K^-1 y. Cost: spectral
    O(n^3) once plus O(n^2) per visited iterate; iterative one K-product per step.

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> res = gradient_descent_path(K, torch.tensor([1.0, 0.0], dtype=torch.float64),
    ...                             max_iter=200)
    >>> res.alpha.numpy().round(3)  # -> K^-1 y
    array([ 1.333, -0.667])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    if not 0.0 <= float(momentum) < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
    if method not in ("auto", "spectral", "iterative"):
        raise ValueError(f"method must be 'auto', 'spectral' or 'iterative', got {method!r}.")
    n = Km.shape[0]
    if method == "auto":
        method = "spectral" if (eigh is not None or (n <= SPECTRAL_MAX_N and Km.fits())) \
            else "iterative"
    if method == "spectral":
        return _gd_spectral(Km, Y, Em, y, learning_rate, max_iter, float(momentum), nesterov,
                            callback, record_path, tol, eigh)
    eta = gradient_learning_rate(K) if learning_rate == "auto" else _check_eta(learning_rate)
    gamma = float(momentum)
    B = Y.shape[0]
    alpha = torch.zeros_like(Y)
    F = torch.zeros_like(Y)  # K alpha
    F_prev = F.clone()
    alpha_prev = alpha.clone()
    E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    y_norm = torch.linalg.vector_norm(Y, dim=-1)
    limit = (1.0 + 1e-6) * y_norm + 1e-12 if gamma == 0 else 1e4 * y_norm + 1e-12
    path = [alpha.clone()] if record_path else None
    R = Y - F
    stopped = callback is not None and bool(callback(0, alpha, R, E))
    k = 0
    bar = progress(total=max_iter, desc="gradient descent", verbose=verbose)
    while not stopped and k < max_iter:
        if tol > 0 and bool((torch.linalg.vector_norm(R, dim=-1) <= tol * y_norm).all()):
            break
        if gamma == 0:
            delta = eta * R
        else:
            V = alpha - alpha_prev
            look = R - gamma * (F - F_prev) if nesterov else R
            delta = gamma * V + eta * look
        KD = Km.rmatmul(delta)
        alpha_prev, F_prev = alpha, F
        alpha = alpha + delta
        F = F + KD
        if E is not None:
            E = E + Em.rmatmul(delta)
        R = Y - F
        k += 1
        bar.update()
        r_norm = torch.linalg.vector_norm(R, dim=-1)
        if not bool(torch.isfinite(r_norm).all()) or bool((r_norm > limit).any()):
            bar.close()
            raise DivergenceError(
                f"gradient descent diverged at iteration {k} with learning_rate={eta:.4g}: the "
                f"residual norm grew from {float(y_norm.max()):.4g} to "
                f"{float(r_norm.max()):.4g}; use learning_rate <= 2 / s_max(K) or 'auto'."
            )
        if path is not None:
            path.append(alpha.clone())
        if callback is not None and callback(k, alpha, R, E):
            stopped = True
    bar.close()
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack([_out(a, y) for a in path]),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


def _gd_spectral(Km, Y, Em, y, learning_rate, max_iter, gamma, nesterov, callback, record_path,
                 tol, eigh):
    s, U = symmetric_eigh(Km.to_dense()) if eigh is None else eigh
    s_max = float(s[-1]) if s.numel() else 0.0
    eta = (1.0 / s_max if s_max > 0 else 1.0) if learning_rate == "auto" else \
        _check_eta(learning_rate)
    check_gradient_learning_rate(eta, s_max, gamma, nesterov)
    C = Y @ U  # (t, n) coordinates of y in the eigenbasis
    EU = None if Em is None else Em.rmatmul(U.T)  # (n, m): row j = (K_eval u_j)^T
    y_norm = torch.linalg.vector_norm(Y, dim=-1)

    def materialise(coef):  # eigen-coefficients (..., t, n) of alpha -> alpha, residual, eval
        A = coef @ U.T
        R = (C - coef * s) @ U.T
        E = None if EU is None else coef @ EU
        return A, R, E

    if gamma > 0:
        return _gd_spectral_momentum(s, C, materialise, y, eta, gamma, nesterov, max_iter,
                                     callback, record_path, tol, y_norm)
    n_iter = max_iter
    if tol > 0 and max_iter > 0:
        # ||r_k||^2 = sum_i (1 - eta s_i)^(2k) c_i^2: first k below tolerance, in O(n) per k.
        ks = torch.arange(max_iter + 1, dtype=s.dtype)
        damp = (1.0 - eta * s).abs().reshape(1, -1).pow(2 * ks.reshape(-1, 1))  # (k, n)
        norms = (damp @ (C * C).T).sqrt()  # (k, t)
        ok = (norms <= tol * y_norm).all(dim=1)
        if bool(ok.any()):
            n_iter = int(torch.nonzero(ok)[0, 0])
    stopped = False
    path = [] if record_path else None
    if callback is not None or record_path:
        block = max(1, min(256, 2**22 // max(1, C.numel())))
        last = None
        for k0 in range(0, n_iter + 1, block):
            ks = torch.arange(k0, min(k0 + block, n_iter + 1))
            phi = spectral_filter(s, eta, ks)  # (b, n)
            A, R, E = materialise(phi[:, None, :] * C[None])
            for j, k in enumerate(ks.tolist()):
                last = (k, A[j], R[j], None if E is None else E[j])
                if path is not None:
                    path.append(_out(A[j], y))
                if callback is not None and callback(*last):
                    stopped = True
                    break
            if stopped:
                break
        k, A, R, E = last
    else:
        k = n_iter
        phi = spectral_filter(s, eta, torch.tensor([k]))[0]
        A, R, E = materialise(phi * C)
    return PathResult(
        alpha=_out(A, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack(path),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


def _gd_spectral_momentum(s, C, materialise, y, eta, gamma, nesterov, max_iter, callback,
                          record_path, tol, y_norm):
    a = torch.zeros_like(C)
    a_prev = torch.zeros_like(C)
    want = callback is not None or record_path
    path = [] if record_path else None
    stopped = False
    k = 0
    while True:
        if want:
            A, R, E = materialise(a)
            if path is not None:
                path.append(_out(A, y))
            if callback is not None and callback(k, A, R, E):
                stopped = True
                break
        if k >= max_iter:
            break
        r_coef = C - s * a
        if tol > 0 and bool((torch.linalg.vector_norm(r_coef, dim=-1) <= tol * y_norm).all()):
            break
        v = a - a_prev
        look = r_coef - gamma * s * v if nesterov else r_coef
        a_prev, a = a, a + gamma * v + eta * look
        k += 1
        if not bool(torch.isfinite(a).all()):
            raise DivergenceError(f"gradient descent with momentum diverged at iteration {k}.")
    A, R, E = materialise(a)
    return PathResult(
        alpha=_out(A, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack(path),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


# ---- sign gradient descent ----
def sign_gradient_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, K_eval=None,
    callback: Callback | None = None, record_path: bool = False, incremental: bool = True,
    tol: float = 0.0, verbose: int = 0,
) -> PathResult:
    """Kernel sign gradient descent from alpha_0 = 0: ``alpha_{k+1} = alpha_k + eta sign(r_k)``.

    sign(0) = 0, so a coordinate whose residual is exactly zero does not move. Every alpha_i moves
    by exactly 0 or eta per step, so ||alpha_k||_inf <= k eta (Prop 5.1: the path of the
    l-infinity constrained problem with radius t = k eta when K is diagonal).

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is :func:`sign_learning_rate`; the paper uses 0.01.
    max_iter : int, default=1000
    K_eval, callback, record_path, verbose
        As in :func:`gradient_descent_path`.
    incremental : bool, default=True
        Keep q = K sign(r) and update it with the rows of K where a sign flipped (O(n) per flip)
        instead of a full product per step (O(n^2)); a full product is used when more than a
        quarter of the signs flip.
    tol : float, default=0.0
        Stop once ||r_k||_2 <= tol ||y||_2.

    Returns
    -------
    PathResult

    Examples
    --------
    >>> import torch
    >>> res = sign_gradient_path(torch.eye(3, dtype=torch.float64),
    ...                          torch.tensor([0.3, -1.0, 0.0], dtype=torch.float64),
    ...                          learning_rate=0.1, max_iter=5)
    >>> res.alpha.numpy().round(2)  # clip(y, t = 0.5); sign(0) = 0 keeps alpha_3 at 0
    array([ 0.3, -0.5,  0. ])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    eta = sign_learning_rate(K, y) if learning_rate == "auto" else _check_eta(learning_rate)
    if callback is None and not record_path and incremental and tol == 0:
        fast = _native_path("sign", Km, Y, Em, y, eta, max_iter, "sign gradient descent")
        if fast is not None:
            return fast
    n = Km.shape[0]
    B = Y.shape[0]
    alpha = torch.zeros_like(Y)
    R = Y.clone()
    S = torch.sign(R)
    Q = Km.rmatmul(S)  # K sign(r), batch layout
    E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    QE = None if Em is None else Em.rmatmul(S)
    path = [alpha.clone()] if record_path else None
    stopped = callback is not None and bool(callback(0, alpha, R, E))
    y_norm = torch.linalg.vector_norm(Y, dim=-1)
    k = 0
    bar = progress(total=max_iter, desc="sign gradient descent", verbose=verbose)
    while not stopped and k < max_iter:
        if tol > 0 and bool((torch.linalg.vector_norm(R, dim=-1) <= tol * y_norm).all()):
            break
        alpha = alpha.add_(S, alpha=eta) if path is None else alpha + eta * S
        R.sub_(Q, alpha=eta)
        if E is not None:
            E.add_(QE, alpha=eta)
        k += 1
        bar.update()
        S_new = torch.sign(R)
        changed = (S_new != S).any(dim=0) if B > 1 else (S_new[0] != S[0])
        idx = torch.nonzero(changed).reshape(-1)
        if idx.numel():
            if not incremental or idx.numel() * 4 > n:
                Q = Km.rmatmul(S_new)
                if QE is not None:
                    QE = Em.rmatmul(S_new)
            else:
                dS = (S_new - S)[:, idx]  # (B, |D|)
                Q = Q + dS @ Km.columns_t(idx, symmetric=True)
                if QE is not None:
                    QE = QE + dS @ Em.columns_t(idx)
            S = S_new
        if path is not None:
            path.append(alpha.clone())
        if callback is not None and callback(k, alpha, R, E):
            stopped = True
    bar.close()
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError("sign gradient descent produced a non-finite residual.")
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack([_out(a, y) for a in path]),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


# ---- coordinate descent ----
def coordinate_descent_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, K_eval=None,
    callback: Callback | None = None, record_path: bool = False, tol: float = 0.0,
    verbose: int = 0,
) -> PathResult:
    """Kernel coordinate descent (forward stagewise) from alpha_0 = 0.

    ``alpha_{k+1} = alpha_k + eta I_inf(r_k)``: every coordinate attaining max |r| moves by
    eta sign(r_m); the residual is updated with those kernel columns only, O(n) per step
    (columns of a matrix-free K are computed on demand, O(n d), and cached for revisited
    coordinates within half the memory budget). Without ties ||alpha_k||_0 <= k and
    ||alpha_k||_1 <= k eta.

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is :func:`coordinate_learning_rate`; the paper uses 0.01.
    max_iter : int, default=1000
    tol : float, default=0.0
        Stop once max |r| <= tol max |y|.
    K_eval, callback, record_path, verbose
        As in :func:`gradient_descent_path`.

    Returns
    -------
    PathResult

    Examples
    --------
    >>> import torch
    >>> res = coordinate_descent_path(torch.eye(3, dtype=torch.float64),
    ...                               torch.tensor([0.3, -1.0, 0.05], dtype=torch.float64),
    ...                               learning_rate=0.1, max_iter=9)
    >>> res.alpha.numpy().round(2)  # soft-thresholding of y: sparse
    array([ 0.1, -0.8,  0. ])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    if Km.op is not None:
        Km = _Matrix(K, cache_columns=True)
    if Em is not None and Em.op is not None:
        Em = _Matrix(K_eval, "K_eval", cache_columns=True)
    eta = coordinate_learning_rate(K, y) if learning_rate == "auto" else \
        _check_eta(learning_rate)
    if callback is None and not record_path and tol == 0:
        fast = _native_path("coordinate", Km, Y, Em, y, eta, max_iter, "coordinate descent")
        if fast is not None:
            return fast
    B = Y.shape[0]
    alpha = torch.zeros_like(Y)
    R = Y.clone()
    E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    y_max = Y.abs().amax(dim=-1)
    path = [alpha.clone()] if record_path else None
    stopped = callback is not None and bool(callback(0, alpha, R, E))
    k = 0
    bar = progress(total=max_iter, desc="coordinate descent", verbose=verbose)
    tol_level = float(tol * y_max.max()) if B == 1 else 0.0
    while not stopped and k < max_iter:
        if B == 1:
            # One target: argmax and one kernel column, O(n) with a handful of operations.
            a0 = R[0].abs()
            m = int(torch.argmax(a0))
            top = float(a0[m])
            if top == 0.0 or (tol > 0 and top <= tol_level):
                break
            if int((a0 == top).sum()) == 1:
                step = eta if float(R[0, m]) > 0 else -eta
                alpha[0, m] += step
                R[0].sub_(Km.column(m, symmetric=True), alpha=step)
                if E is not None:
                    E[0].add_(Em.column(m), alpha=step)
                k += 1
                bar.update()
                if path is not None:
                    path.append(alpha.clone())
                if callback is not None and callback(k, alpha, R, E):
                    stopped = True
                continue
        A = R.abs()
        top = A.amax(dim=-1, keepdim=True)
        if tol > 0 and bool((top[:, 0] <= tol * y_max).all()):
            break
        mask = (A == top) & (top > 0)
        idx = torch.nonzero(mask.any(dim=0)).reshape(-1)
        if idx.numel() == 0:  # residual exactly zero: the path has stopped
            break
        delta = eta * torch.sign(R[:, idx]) * mask[:, idx]  # (B, |D|)
        alpha[:, idx] += delta
        R = R - delta @ Km.columns_t(idx, symmetric=True)
        if E is not None:
            E = E + delta @ Em.columns_t(idx)
        k += 1
        bar.update()
        if path is not None:
            path.append(alpha.clone())
        if callback is not None and callback(k, alpha, R, E):
            stopped = True
    bar.close()
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError("coordinate descent produced a non-finite residual.")
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack([_out(a, y) for a in path]),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )
