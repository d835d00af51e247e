"""Single steps, automatic step sizes and stability bounds of the path rules.

The single-step functions act on the last dimension, so a batch ``(B, n)`` of independent
problems (folds x bandwidths) advances in one call. The top eigenvalue s_max(K), which bounds
every stable gradient step, is computed by :func:`largest_eigenvalue` and nowhere else. The
rule objects of :mod:`.rules` are built on these functions.
"""

from __future__ import annotations

import math

import torch

from ...linalg import power_iteration
from ._common import EXACT_EIGENVALUE_MAX_N, DivergenceError
from ._operator import batch_matmul, fits, path_operator

__all__ = [
    "gradient_step", "momentum_step", "sign_step", "coordinate_direction", "coordinate_moves",
    "coordinate_step", "largest_eigenvalue", "weighted_largest_eigenvalue",
    "gradient_learning_rate", "check_gradient_learning_rate", "sign_learning_rate",
    "coordinate_learning_rate", "sign_monotone_step", "coordinate_monotone_step",
]


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


def coordinate_moves(R: torch.Tensor, tol: float = 0.0, y_max=None):
    """The coordinates a coordinate-descent step moves in a batch of residuals ``R`` (B, n).

    Every m attaining max |r| of its row moves (ties move together): returns ``(mask, idx)``
    with ``mask`` (B, n) marking them per row and ``idx`` their union, or None when the path
    has ended (a zero residual, or max |r| <= ``tol * y_max`` in every row when ``tol > 0``).

    Examples
    --------
    >>> mask, idx = coordinate_moves(torch.tensor([[0.5, -2.0, 2.0]]))
    >>> mask.tolist(), idx.tolist()
    ([[False, True, True]], [1, 2])
    """
    A = R.abs()
    top = A.amax(dim=-1, keepdim=True)
    if tol > 0 and bool((top[:, 0] <= tol * y_max).all()):
        return None
    mask = (A == top) & (top > 0)
    idx = torch.nonzero(mask.any(dim=0)).reshape(-1)
    if idx.numel() == 0:
        return None
    return mask, idx


def coordinate_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel coordinate-descent step ``alpha + eta I_inf(r)`` (forward stagewise).

    Examples
    --------
    >>> import torch
    >>> coordinate_step(torch.zeros(3), torch.tensor([0.5, -2.0, 1.0]), 0.25).tolist()
    [0.0, -0.25, 0.0]
    """
    return alpha + eta * coordinate_direction(residual)



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
    Km = path_operator(K)
    n = Km.shape[0]
    if n == 0:
        return 0.0
    if n <= EXACT_EIGENVALUE_MAX_N and fits(Km):
        D = Km.to_dense()
        return float(torch.linalg.eigvalsh(0.5 * (D + D.T).to(torch.float64))[-1].clamp_min(0))
    est = power_iteration(lambda v: batch_matmul(Km, v[None].to(Km.dtype))[0].to(torch.float64), n,
                          device=Km.device, n_iter=n_iter)
    trace = float(Km.diagonal().sum())
    return min(1.05 * est, trace) if trace > 0 else 1.05 * est


def weighted_largest_eigenvalue(K, w: torch.Tensor) -> float:
    """s_max(W^1/2 K W^1/2) for positive weights w: exact when dense and small, else power
    iteration (+5 %); the matrix of the repeated-row problem.

    Examples
    --------
    >>> import torch
    >>> round(weighted_largest_eigenvalue(torch.eye(2, dtype=torch.float64),
    ...                                   torch.tensor([1.0, 3.0], dtype=torch.float64)), 6)
    3.0
    """
    return _scaled_largest_eigenvalue(K, w.sqrt())


def _scaled_largest_eigenvalue(K, sq: torch.Tensor) -> float:
    """s_max(diag(sq) K diag(sq)); see :func:`weighted_largest_eigenvalue`."""
    if isinstance(K, torch.Tensor) and K.shape[0] <= EXACT_EIGENVALUE_MAX_N:
        return largest_eigenvalue(sq[:, None] * K * sq[None, :])
    Km = path_operator(K)
    est = power_iteration(lambda v: (sq * batch_matmul(Km, (sq * v.to(sq.dtype))[None])[0])
                          .to(torch.float64), K.shape[0], device=sq.device)
    return 1.05 * est


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
                       s_max: float | None = None,
                       sample_weight: torch.Tensor | None = None) -> float:
    """Default sign-descent step ``resolution * rms(y) / s_max(K)``.

    One step changes the fitted values by ``eta ||K sign(r)||_2 <= eta s_max sqrt(n)``, i.e. by at
    most ``resolution ||y||_2``. Sign descent cannot diverge (|alpha_i| <= k eta), so this only sets
    the resolution of the path; the paper's fixed 0.01 remains available. With positive
    ``sample_weight`` w it is the step of the repeated-row problem: the weighted root mean square
    of y over s_max(W^1/2 K W^1/2) (:func:`weighted_largest_eigenvalue`).

    Examples
    --------
    >>> import torch
    >>> round(sign_learning_rate(torch.eye(4, dtype=torch.float64), torch.ones(4)), 4)
    0.01
    """
    if sample_weight is not None:
        w = sample_weight.reshape(-1)
        Y = y.reshape(y.shape[0], -1).to(w.dtype)
        rms = float(((w[:, None] * Y.square()).sum() / (w.sum() * Y.shape[1])).sqrt())
        s = weighted_largest_eigenvalue(K, w) if s_max is None else float(s_max)
        return resolution * (rms if rms > 0 else 1.0) / (s if s > 0 else 1.0)
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
    d = float(path_operator(K).diagonal().abs().max()) if K.shape[0] else 1.0
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
