"""Kernel M-estimators by IRLS and kernel quantile regression by MM (Allerbo, §6.2, Table 2).

These are the robust comparators of the journal version, implemented exactly as its experiments
ran them (digest §2.10). Every method starts at alpha = 0 and predicts f = K alpha.

* Huber (KMR-H): r = y - K alpha, k = c * std(r) (c = 1.345 by default), w_i = min(1, k/|r_i|),
  W = diag(w), then alpha <- W (W K W + lambda I)^{-1} W y.
* Tukey bisquare (KMR-T): the same update with w_i = max(0, 1 - (r_i / k)^2), c = 4.685.
  Since W enters on both sides the update minimises sum_i w_i^2 (y_i - f_i)^2 + lambda a^T K a
  over alpha in range(W): the effective weights are w_i^2.
* Quantile (KQR-Z, Zheng 2022), check loss rho_tau(r) = (|r| + (2 tau - 1) r) / 2:
  U = diag(1 / (4 (eps + |r_i|))), v = (y / (eps + |r|) + 2 tau - 1) / 2,
  alpha <- (2 U K + lambda I)^{-1} v; each step minimises the quadratic majoriser of
  sum_i rho_tau(y_i - f_i) + (lambda / 2) alpha^T K alpha at the current residuals.

All stop when ||alpha_new - alpha||_2 < tol (1e-5) or after ``max_iter`` (100) iterations.

The functions are batch-agnostic: K has shape (..., n, n), y (..., n), and ``alpha``, ``c``
broadcast over the batch, so a whole cross-validation grid (bandwidths x folds x penalties x
tuning constants) is one call. ``mask`` (..., n) marks the rows that take part: a zero weight
on a row removes it exactly (its coefficient is 0 and it does not enter the solve), which is
how folds are expressed without reshaping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .losses import RESIDUAL_LOSSES

__all__ = [
    "MEstimateResult",
    "huber_weights",
    "tukey_weights",
    "kernel_huber_irls",
    "kernel_tukey_irls",
    "kernel_quantile_mm",
    "check_loss",
]

HUBER_C = 1.345
TUKEY_C = 4.685


@dataclass
class MEstimateResult:
    """Coefficients ``coef`` (..., n), iterations run ``n_iter`` and per-problem ``converged``."""

    coef: torch.Tensor
    n_iter: int
    converged: torch.Tensor
    weights: torch.Tensor


def huber_weights(r: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """IRLS weights of the Huber loss, w = min(1, k / |r|) (w = 1 where r = 0).

    Examples
    --------
    >>> import torch
    >>> huber_weights(torch.tensor([0.5, -4.0, 0.0]), torch.tensor(2.0)).tolist()
    [1.0, 0.5, 1.0]
    """
    return RESIDUAL_LOSSES["huber"].irls_weight(r, k)


def tukey_weights(r: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """IRLS weights of the Tukey bisquare as used in the paper, w = max(0, 1 - (r / k)^2).

    Examples
    --------
    >>> import torch
    >>> tukey_weights(torch.tensor([0.0, 1.0, 3.0]), torch.tensor(2.0)).tolist()
    [1.0, 0.75, 0.0]
    """
    return (1.0 - (r / k) ** 2).clamp_min(0.0)


def check_loss(r: torch.Tensor, quantile: float) -> torch.Tensor:
    """Check (pinball) loss rho_tau(r) = (|r| + (2 tau - 1) r) / 2, elementwise.

    Examples
    --------
    >>> import torch
    >>> check_loss(torch.tensor([-1.0, 2.0]), 0.25).tolist()
    [0.75, 0.5]
    """
    return 0.5 * (r.abs() + (2.0 * quantile - 1.0) * r)


def _prepare(K, y, alpha, mask):
    if K.ndim < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"K must have shape (..., n, n), got {tuple(K.shape)}.")
    n = K.shape[-1]
    if y.shape[-1] != n:
        raise ValueError(f"y must have last dimension {n}, got shape {tuple(y.shape)}.")
    batch = torch.broadcast_shapes(K.shape[:-2], y.shape[:-1])
    lam = torch.as_tensor(alpha, dtype=K.dtype, device=K.device)
    if (lam <= 0).any() or not torch.isfinite(lam).all():
        raise ValueError("alpha (the ridge penalty lambda) must be positive and finite.")
    batch = torch.broadcast_shapes(batch, lam.shape)
    m = torch.ones(n, dtype=K.dtype, device=K.device) if mask is None else mask.to(K.dtype)
    batch = torch.broadcast_shapes(batch, m.shape[:-1])
    y = (y * m).expand(*batch, n)
    return K, y, lam.expand(batch), m.expand(*batch, n), batch, n


def _masked_std(r: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    cnt = m.sum(-1).clamp_min(1.0)
    mean = (r * m).sum(-1) / cnt
    return (((r - mean.unsqueeze(-1)) * m) ** 2).sum(-1).div(cnt).sqrt()


def _irls(K, y, alpha, c, mask, max_iter, tol, weight_fn):
    K, y, lam, m, batch, n = _prepare(K, y, alpha, mask)
    c = torch.as_tensor(c, dtype=K.dtype, device=K.device)
    if (c <= 0).any():
        raise ValueError("The tuning constant c must be positive.")
    c = c.expand(torch.broadcast_shapes(batch, c.shape))
    batch = c.shape
    y = y.expand(*batch, n)
    lam, m = lam.expand(batch), m.expand(*batch, n)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)

    def update(coef):
        r = (y - (K @ coef.unsqueeze(-1))[..., 0]) * m
        k = (c * _masked_std(r, m)).clamp_min(torch.finfo(K.dtype).tiny).unsqueeze(-1)
        w_new = weight_fn(r, k) * m
        A = w_new.unsqueeze(-1) * K * w_new.unsqueeze(-2) + lam[..., None, None] * eye
        return w_new * torch.linalg.solve(A, (w_new * y).unsqueeze(-1))[..., 0], w_new

    return _fixed_point(update, K, batch, n, m.clone(), max_iter, tol)


def _fixed_point(update, K, batch, n, w0, max_iter, tol) -> MEstimateResult:
    """The batched iteration coef <- update(coef) from 0, ``update`` returning the new
    coefficients and weights; a problem whose step norm falls below ``tol`` keeps its
    coefficients and weights from then on, and the loop ends when all have converged."""
    coef = torch.zeros(*batch, n, dtype=K.dtype, device=K.device)
    w = w0
    done = torch.zeros(batch, dtype=torch.bool, device=K.device)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        new, w_new = update(coef)
        step = (new - coef).norm(dim=-1)
        keep = done.unsqueeze(-1)
        coef = torch.where(keep, coef, new)
        w = torch.where(keep, w, w_new)
        done = done | (step < tol)
        if bool(done.all()):
            break
    return MEstimateResult(coef, it, done, w)


def kernel_huber_irls(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,  # penalty lambda, broadcasts over the batch
    *,
    c=HUBER_C,
    mask: torch.Tensor | None = None,  # shape: (..., n)
    max_iter: int = 100,
    tol: float = 1e-5,
) -> MEstimateResult:
    """Kernel Huber M-estimator by IRLS (KMR-H): alpha <- W (W K W + lambda I)^{-1} W y.

    k = c * std(r) is recomputed from the current residuals every iteration (std(y) in the first
    one) and w_i = min(1, k / |r_i|). Cost O(n^3) per iteration and problem.

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> res = kernel_huber_irls(K, torch.tensor([1.0, -1.0], dtype=torch.float64), 0.1)
    >>> res.coef.numpy().round(4), bool(res.converged)
    (array([ 1.6667, -1.6667]), True)
    """
    return _irls(K, y, alpha, c, mask, max_iter, tol, huber_weights)


def kernel_tukey_irls(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,
    *,
    c=TUKEY_C,
    mask: torch.Tensor | None = None,
    max_iter: int = 100,
    tol: float = 1e-5,
) -> MEstimateResult:
    """Kernel Tukey-bisquare M-estimator by IRLS (KMR-T), w_i = max(0, 1 - (r_i / k)^2).

    Same update and cost as :func:`kernel_huber_irls`; residuals beyond k = c * std(r) get
    weight 0 and coefficient 0.

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(3, dtype=torch.float64)
    >>> y = torch.tensor([1.0, 1.2, 9.0], dtype=torch.float64)
    >>> res = kernel_tukey_irls(K, y, 0.1, c=1.0)
    >>> res.coef.numpy().round(3)
    array([0.909, 1.091, 0.   ])
    """
    return _irls(K, y, alpha, c, mask, max_iter, tol, tukey_weights)


def kernel_quantile_mm(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,
    *,
    quantile=0.5,
    eps: float = 1e-5,
    mask: torch.Tensor | None = None,
    max_iter: int = 100,
    tol: float = 1e-5,
) -> MEstimateResult:
    """Kernel quantile regression by majorise-minimise (KQR-Z / KQR-A of the paper).

    Minimises sum_i rho_tau(y_i - (K alpha)_i) + (lambda / 2) alpha^T K alpha with the update
    alpha <- (2 U K + lambda I)^{-1} v, U = diag(1/(4(eps + |r|))), v = (y/(eps + |r|) + 2 tau
    - 1)/2. ``quantile`` broadcasts over the batch. Cost O(n^3) per iteration and problem.

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(3, dtype=torch.float64)
    >>> res = kernel_quantile_mm(K, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1.0)
    >>> res.coef.numpy().round(3)
    array([0.5, 0.5, 0.5])
    """
    K, y, lam, m, batch, n = _prepare(K, y, alpha, mask)
    tau = torch.as_tensor(quantile, dtype=K.dtype, device=K.device)
    if ((tau <= 0) | (tau >= 1)).any():
        raise ValueError("quantile must lie in (0, 1).")
    batch = torch.broadcast_shapes(batch, tau.shape)
    y, lam, m = y.expand(*batch, n), lam.expand(batch), m.expand(*batch, n)
    tau = tau.expand(batch).unsqueeze(-1)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)

    def update(coef):
        r = y - (K @ coef.unsqueeze(-1))[..., 0]
        d = eps + r.abs()
        u_new = m / (4.0 * d)
        v = 0.5 * (y / d + 2.0 * tau - 1.0) * m
        A = 2.0 * u_new.unsqueeze(-1) * K + lam[..., None, None] * eye
        # excluded rows: exactly 0
        return torch.linalg.solve(A, v.unsqueeze(-1))[..., 0] * m, u_new

    return _fixed_point(update, K, batch, n, m.clone(), max_iter, tol)
