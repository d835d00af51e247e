"""Proximal operators of the penalties of kernel l1 / l-infinity / ridge regression.

All functions act on the last dimension, so a batch ``(..., n)`` of problems is handled in one
call; thresholds broadcast (a float or a tensor of shape (..., 1)). With penalty lambda P(alpha)
and step eta, the proximal-gradient update uses the threshold c = eta * lambda:

* l1, P = ||alpha||_1: soft thresholding, ``sign(v) max(|v| - c, 0)``;
* l-infinity, P = ||alpha||_inf: ``v - Pi_{B1(c)}(v)`` (Moreau decomposition; the dual norm ball is
  the l1 ball, projected onto by a sort-free Newton iteration, a few O(n) passes);
* l2, P = 1/2 ||alpha||_2^2: ``v / (1 + c)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _native

__all__ = [
    "PENALTIES",
    "soft_threshold",
    "l1_ball_threshold",
    "project_l1_ball",
    "prox_linf",
    "prox_l2",
    "prox",
    "penalty_value",
    "lambda_max",
]

#: Penalty names accepted by :func:`prox`.
PENALTIES = ("l1", "linf", "l2")


def _c(c, v):
    return c if isinstance(c, torch.Tensor) else torch.tensor(float(c), dtype=v.dtype,
                                                                device=v.device)


def soft_threshold(v: torch.Tensor, c) -> torch.Tensor:
    """prox of c ||.||_1: ``sign(v) max(|v| - c, 0)``. Cost O(n).

    Examples
    --------
    >>> import torch
    >>> soft_threshold(torch.tensor([1.5, -0.25, -2.0]), 0.5).tolist()
    [1.0, -0.0, -1.5]
    """
    return torch.sign(v) * (v.abs() - _c(c, v)).clamp_min(0.0)


def l1_ball_threshold(a: torch.Tensor, radius, theta0=None) -> torch.Tensor:
    """The level theta >= 0 with sum_i (a_i - theta)_+ = radius, for a >= 0 (last dimension).

    phi(theta) = sum_i (a_i - theta)_+ - radius is convex, piecewise linear and decreasing, and
    the Newton step theta <- (sum_{a_i > theta} a_i - radius) / #{a_i > theta} lands at or left
    of the root from either side; from the left it increases monotonically and stops exactly,
    after at most n steps, once the set {a_i > theta} no longer changes (Michelot 1986;
    Condat 2016). ``theta0`` (any value, e.g. the previous iterate's level in a proximal
    method) warm-starts it, which usually leaves one or two vectorised O(n) passes; the cold
    start is (sum a - radius) / n, left of the root. Rows with sum a <= radius get 0.
    No sort is needed (Duchi et al. 2008 sort in O(n log n)).

    Examples
    --------
    >>> import torch
    >>> float(l1_ball_threshold(torch.tensor([3.0, 1.0, 0.5]), 2.0))
    1.0
    """
    return _l1_level(a, _c(radius, a), theta0)[0]


def _l1_level(a, radius, theta0):
    # From the cold start on CPU the elementwise work of each Newton step runs on NumPy views
    # (far cheaper per call than tensor operations on the small batches of a proximal method)
    # while the row sums stay tensor sums, so the iterates are those of the tensor code.
    if (a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64)
            and not a.requires_grad and theta0 is None
            and a.ndim >= 1 and a.shape[-1] > 0):
        rad = torch.as_tensor(radius, dtype=a.dtype, device=a.device)
        if not rad.requires_grad:
            return _l1_level_host(a, rad)
    return _l1_level_tensor(a, radius, theta0)


def _l1_level_host(a, radius):
    """:func:`_l1_level` from the cold start for CPU tensors (same steps, same rounding)."""
    n = a.shape[-1]
    lead = a.shape[:-1]
    a2 = a.reshape(-1, n)
    B = a2.shape[0]
    r2 = radius.expand(*lead, 1).reshape(B, 1) if radius.ndim else radius.expand(B, 1)
    total = a2.sum(dim=-1, keepdim=True)
    A = np.ascontiguousarray(a2.numpy())
    R = r2.numpy()
    ftype = A.dtype.type
    zero = ftype(0.0)
    with np.errstate(all="ignore"):  # tensors do not warn on overflow or 0 / 0 either
        cold = np.maximum((total.numpy() - R) / ftype(n), zero)
        theta = cold.copy()
        sub, rr, cc, th = A, R, cold, theta
        rows = None  # None: every row is still iterating
        last = None
        for _ in range(n + 2):
            d = np.subtract(sub, th)
            np.maximum(d, zero, out=d)
            count = np.add.reduce(d != zero, axis=-1, dtype=np.int64).reshape(-1, 1)
            phi = torch.from_numpy(d).sum(dim=-1, keepdim=True).numpy() - rr  # tensor rounding
            new = np.where(count > 0, th + phi / np.maximum(count, 1, dtype=A.dtype), cc)
            np.maximum(new, zero, out=new)
            if rows is None:
                theta = new
            else:
                theta[rows] = new
            if last is not None:
                going = (count != last).reshape(-1)
                if not np.logical_or.reduce(going):
                    break
                keep = going.nonzero()[0]
                rows = keep if rows is None else rows[keep]
                count = count[keep]
                sub, rr, cc, th = A[rows], R[rows], cold[rows], theta[rows]
            else:
                th = theta
            last = count
    inside = total <= r2
    theta_t = torch.from_numpy(theta).masked_fill_(inside, 0.0)
    return theta_t.reshape(*lead, 1), inside.reshape(*lead, 1)


def _l1_level_tensor(a, radius, theta0):
    # Newton on phi in the form theta + phi(theta) / #{a > theta}, three passes over a per step.
    # The active sets are nested along the iteration, so an unchanged count means an unchanged
    # set, i.e. the last step was exact; rows that are done leave the working set, so the few
    # rows that need many steps cost little.
    n = a.shape[-1]
    lead = a.shape[:-1]
    a2 = a.reshape(-1, n)
    B = a2.shape[0]
    radius = torch.as_tensor(radius, dtype=a.dtype, device=a.device)
    r2 = radius.expand(*lead, 1).reshape(B, 1) if radius.ndim else radius.expand(B, 1)
    total = a2.sum(dim=-1, keepdim=True)
    cold = ((total - r2) / n).clamp_min(0.0)
    if theta0 is None:
        theta = cold.clone()
    else:
        t0 = torch.as_tensor(theta0, dtype=a.dtype, device=a.device)
        theta = (t0.expand(*lead, 1).reshape(B, 1) if t0.ndim else t0.expand(B, 1)).clone()
    rows = None  # None: every row is still iterating
    last = None
    for _ in range(n + 2):
        sub = a2 if rows is None else a2.index_select(0, rows)
        th = theta if rows is None else theta.index_select(0, rows)
        rr = r2 if rows is None else r2.index_select(0, rows)
        cc = cold if rows is None else cold.index_select(0, rows)
        d = (sub - th).clamp_min_(0.0)
        count = torch.count_nonzero(d, dim=-1).unsqueeze(-1)
        phi = d.sum(dim=-1, keepdim=True) - rr
        new = torch.where(count > 0, th + phi / count.clamp_min(1), cc).clamp_min_(0.0)
        if rows is None:
            theta = new
        else:
            theta.index_copy_(0, rows, new)
        if last is not None:
            going = (count != last).reshape(-1)
            if not bool(going.any()):
                break
            keep = torch.nonzero(going).reshape(-1)
            rows = keep if rows is None else rows.index_select(0, keep)
            count = count.index_select(0, keep)
        last = count
    inside = total <= r2
    theta = theta.masked_fill_(inside, 0.0)
    return theta.reshape(*lead, 1), inside.reshape(*lead, 1)


def project_l1_ball(v: torch.Tensor, radius) -> torch.Tensor:
    """Euclidean projection onto {w : ||w||_1 <= radius} along the last dimension.

    w = sign(v) max(|v| - theta, 0) with theta from :func:`l1_ball_threshold` (v itself when it
    lies in the ball). A few vectorised O(n) passes; every problem of a batch has its own
    radius (broadcast as (..., 1)).

    Examples
    --------
    >>> import torch
    >>> project_l1_ball(torch.tensor([3.0, -1.0, 0.5]), 2.0).tolist()
    [2.0, -0.0, 0.0]
    """
    radius = _c(radius, v)
    a = v.abs()
    theta = l1_ball_threshold(a, radius)
    w = torch.sign(v) * (a - theta).clamp_min(0.0)
    inside = a.sum(dim=-1, keepdim=True) <= radius
    w = torch.where(inside, v, w)
    return torch.where(radius <= 0, torch.zeros_like(v), w)


def prox_linf(v: torch.Tensor, c, *, theta0=None, return_level: bool = False):
    """prox of c ||.||_inf: ``v - Pi_{B1(c)}(v)`` = ``clip(v, -theta, theta)``, with the cap
    theta from :func:`l1_ball_threshold` (sum_i (|v_i| - theta)_+ = c), and 0 when
    ||v||_1 <= c. ``theta0`` warm-starts the cap (e.g. the previous iteration's, obtained with
    ``return_level=True``, which returns ``(prox, theta)``). Cost a few O(n) passes.

    Examples
    --------
    >>> import torch
    >>> prox_linf(torch.tensor([3.0, -1.0, 0.5]), 2.0).tolist()
    [1.0, -1.0, 0.5]
    """
    c = _c(c, v)
    if (theta0 is None and not return_level and v.device.type == "cpu"
            and v.dtype in (torch.float32, torch.float64) and v.ndim >= 1 and v.shape[-1] > 0
            and not (v.requires_grad or c.requires_grad) and c.device.type == "cpu"):
        # compiled row by row (the same Newton iteration; sums in double): the proximal
        # methods call this on thousands of short rows per step
        n = v.shape[-1]
        rows = v.reshape(-1, n)
        out = _native.prox_linf_rows(rows, c.to(v.dtype).expand(*v.shape[:-1], 1).reshape(-1))
        if out is not None:
            return out.reshape(v.shape)
    theta, inside = _l1_level(v.abs(), c, theta0)
    out = torch.clamp(v, min=-theta, max=theta)
    if bool(inside.any()):
        out = torch.where(inside, torch.zeros_like(v), out)
    if bool((c <= 0).any()):
        out = torch.where(c <= 0, v, out)
    return (out, theta) if return_level else out


def prox_l2(v: torch.Tensor, c) -> torch.Tensor:
    """prox of (c / 2) ||.||_2^2: ``v / (1 + c)``. Cost O(n).

    Examples
    --------
    >>> import torch
    >>> prox_l2(torch.tensor([2.0, -4.0]), 1.0).tolist()
    [1.0, -2.0]
    """
    return v / (1.0 + _c(c, v))


_PROX = {"l1": soft_threshold, "linf": prox_linf, "l2": prox_l2}


def prox(penalty: str, v: torch.Tensor, c) -> torch.Tensor:
    """Dispatch to the proximal operator of ``penalty`` in {"l1", "linf", "l2"}.

    Examples
    --------
    >>> import torch
    >>> prox("l1", torch.tensor([2.0, 0.5]), 1.0).tolist()
    [1.0, 0.0]
    """
    try:
        return _PROX[penalty](v, c)
    except KeyError:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.") from None


def penalty_value(penalty: str, alpha: torch.Tensor) -> torch.Tensor:
    """P(alpha) along the last dimension: ||.||_1, ||.||_inf or 1/2 ||.||_2^2.

    Examples
    --------
    >>> import torch
    >>> [float(penalty_value(p, torch.tensor([1.0, -2.0]))) for p in ("l1", "linf", "l2")]
    [3.0, 2.0, 2.5]
    """
    if penalty == "l1":
        return alpha.abs().sum(dim=-1)
    if penalty == "linf":
        return alpha.abs().amax(dim=-1)
    if penalty == "l2":
        return 0.5 * alpha.pow(2).sum(dim=-1)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")


def lambda_max(penalty: str, y: torch.Tensor) -> torch.Tensor:
    """Smallest lambda with solution alpha = 0: the dual norm of the gradient -y at 0.

    ||y||_inf for l1, ||y||_1 for l-infinity, +inf for l2 (never exactly 0). Last dimension.

    Examples
    --------
    >>> import torch
    >>> [float(lambda_max(p, torch.tensor([1.0, -2.0]))) for p in ("l1", "linf")]
    [2.0, 3.0]
    """
    if penalty == "l1":
        return y.abs().amax(dim=-1)
    if penalty == "linf":
        return y.abs().sum(dim=-1)
    if penalty == "l2":
        return torch.full(y.shape[:-1], math.inf, dtype=y.dtype, device=y.device)
    raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")
