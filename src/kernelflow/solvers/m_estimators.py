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
A converged problem leaves the batch (``compact=True``, the default): only the unconverged
problems are solved in the next iteration, which gives the same results as updating the whole
batch until its slowest problem converges (``compact=False``) at a fraction of the cost.

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
    """Coefficients ``coef`` (..., n), iterations run ``n_iter`` (the most any problem ran),
    per-problem ``converged`` and final ``weights``, and ``iterations`` (...), the number of
    updates each problem took."""

    coef: torch.Tensor
    n_iter: int
    converged: torch.Tensor
    weights: torch.Tensor
    iterations: torch.Tensor | None = None


# problems solved per call of the update: bounds the (chunk, n, n) work arrays
_CHUNK = 2048


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


def _flat_batch(K, batch, n):
    """Kernels (nk, n, n) and, for each of the prod(batch) problems, the index of its kernel."""
    kb = K.shape[:-2]
    nk = 1
    for d in kb:
        nk *= d
    kidx = torch.arange(nk, device=K.device).reshape(kb).expand(batch).reshape(-1)
    return K.reshape(nk, n, n), kidx


def _irls(K, y, alpha, c, mask, max_iter, tol, weight_fn, compact):
    K, y, lam, m, batch, n = _prepare(K, y, alpha, mask)
    c = torch.as_tensor(c, dtype=K.dtype, device=K.device)
    if (c <= 0).any():
        raise ValueError("The tuning constant c must be positive.")
    c = c.expand(torch.broadcast_shapes(batch, c.shape))
    batch = c.shape
    Kf, kidx = _flat_batch(K, batch, n)
    yf = y.expand(*batch, n).reshape(-1, n)
    lamf, cf = lam.expand(batch).reshape(-1), c.reshape(-1)
    mf = m.expand(*batch, n).reshape(-1, n)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)
    tiny = torch.finfo(K.dtype).tiny

    def update(coef, idx):
        Ki, yi, mi = Kf[kidx[idx]], yf[idx], mf[idx]
        r = (yi - torch.bmm(Ki, coef.unsqueeze(-1))[..., 0]) * mi
        k = (cf[idx] * _masked_std(r, mi)).clamp_min(tiny).unsqueeze(-1)
        w_new = weight_fn(r, k) * mi
        A = w_new.unsqueeze(-1) * Ki * w_new.unsqueeze(-2) + lamf[idx, None, None] * eye
        return w_new * torch.linalg.solve(A, (w_new * yi).unsqueeze(-1))[..., 0], w_new

    return _fixed_point(update, batch, n, mf.clone(), max_iter, tol, compact)


def _fixed_point(update, batch, n, w0, max_iter, tol, compact) -> MEstimateResult:
    """The iteration coef <- update(coef, idx) from 0 over the flattened batch, ``update``
    returning the new coefficients and weights of the problems ``idx``. A problem whose step
    norm falls below ``tol`` keeps its coefficients and weights from then on.

    ``compact=True`` solves only the problems that have not converged (an active index set,
    in chunks of ``_CHUNK``); ``compact=False`` keeps updating every problem until the last one
    converges and discards the converged problems' updates (the same results, at the cost of
    the slowest problem times the batch)."""
    B = w0.shape[0]
    coef = torch.zeros(B, n, dtype=w0.dtype, device=w0.device)
    w = w0
    done = torch.zeros(B, dtype=torch.bool, device=w0.device)
    iters = torch.zeros(B, dtype=torch.long, device=w0.device)
    everyone = torch.arange(B, device=w0.device)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        idx = everyone[~done] if compact else everyone
        for lo in range(0, idx.numel(), _CHUNK):
            sub = idx[lo:lo + _CHUNK]
            new, w_new = update(coef[sub], sub)
            live = ~done[sub]
            step = (new - coef[sub]).norm(dim=-1)
            coef[sub] = torch.where(live.unsqueeze(-1), new, coef[sub])
            w[sub] = torch.where(live.unsqueeze(-1), w_new, w[sub])
            iters[sub] += live.long()
            done[sub] = done[sub] | (live & (step < tol))
        if bool(done.all()):
            break
    shape = tuple(batch)
    return MEstimateResult(coef.reshape(*shape, n), it, done.reshape(shape),
                           w.reshape(*shape, n), iters.reshape(shape))


def kernel_huber_irls(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,  # penalty lambda, broadcasts over the batch
    *,
    c=HUBER_C,
    mask: torch.Tensor | None = None,  # shape: (..., n)
    max_iter: int = 100,
    tol: float = 1e-5,
    compact: bool = True,
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
    return _irls(K, y, alpha, c, mask, max_iter, tol, huber_weights, compact)


def kernel_tukey_irls(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,
    *,
    c=TUKEY_C,
    mask: torch.Tensor | None = None,
    max_iter: int = 100,
    tol: float = 1e-5,
    compact: bool = True,
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
    return _irls(K, y, alpha, c, mask, max_iter, tol, tukey_weights, compact)


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
    compact: bool = True,
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
    Kf, kidx = _flat_batch(K, batch, n)
    yf = y.expand(*batch, n).reshape(-1, n)
    lamf, mf = lam.expand(batch).reshape(-1), m.expand(*batch, n).reshape(-1, n)
    tauf = tau.expand(batch).reshape(-1, 1)
    eye = torch.eye(n, dtype=K.dtype, device=K.device)

    def update(coef, idx):
        Ki, yi, mi = Kf[kidx[idx]], yf[idx], mf[idx]
        r = yi - torch.bmm(Ki, coef.unsqueeze(-1))[..., 0]
        d = eps + r.abs()
        u_new = mi / (4.0 * d)
        v = 0.5 * (yi / d + 2.0 * tauf[idx] - 1.0) * mi
        A = 2.0 * u_new.unsqueeze(-1) * Ki + lamf[idx, None, None] * eye
        # excluded rows: exactly 0
        return torch.linalg.solve(A, v.unsqueeze(-1))[..., 0] * mi, u_new

    return _fixed_point(update, batch, n, mf.clone(), max_iter, tol, compact)
