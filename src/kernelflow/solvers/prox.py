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

import torch

__all__ = [
    "PENALTIES",
    "soft_threshold",
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


def project_l1_ball(v: torch.Tensor, radius) -> torch.Tensor:
    """Euclidean projection onto {w : ||w||_1 <= radius} along the last dimension.

    w = sign(v) max(|v| - theta, 0) with theta >= 0 the root of
    phi(theta) = sum_i (|v_i| - theta)_+ - radius (v itself when it lies in the ball). phi is
    convex, piecewise linear and decreasing, so Newton's method started left of the root,
    at theta_0 = (||v||_1 - radius) / n, increases monotonically and stops exactly, after at
    most n steps, once the set {|v_i| > theta} no longer changes (Michelot 1986; Condat 2016):
    theta_{k+1} = (sum_{|v_i| > theta_k} |v_i| - radius) / #{|v_i| > theta_k}. In practice a
    few vectorised passes, O(n) each, with no sort (Duchi et al. 2008 sort in O(n log n)).
    Every problem of a batch stops on its own (finished rows are frozen).

    Examples
    --------
    >>> import torch
    >>> project_l1_ball(torch.tensor([3.0, -1.0, 0.5]), 2.0).tolist()
    [2.0, -0.0, 0.0]
    """
    radius = _c(radius, v)
    a = v.abs()
    n = v.shape[-1]
    total = a.sum(dim=-1, keepdim=True)
    theta = ((total - radius) / n).clamp_min(0.0)
    active = a > theta
    for _ in range(n):
        count = active.sum(dim=-1, keepdim=True)
        theta = ((a * active).sum(dim=-1, keepdim=True) - radius) / count.clamp_min(1)
        theta = theta.clamp_min(0.0)
        now = a > theta
        if torch.equal(now, active):
            break
        active = now
    w = torch.sign(v) * (a - theta).clamp_min(0.0)
    inside = total <= radius
    w = torch.where(inside, v, w)
    return torch.where(radius <= 0, torch.zeros_like(v), w)


def prox_linf(v: torch.Tensor, c) -> torch.Tensor:
    """prox of c ||.||_inf: ``v - Pi_{B1(c)}(v)``; caps every |v_i| at the level c' with
    sum_i (|v_i| - c')_+ = c, and is 0 when ||v||_1 <= c. Cost a few O(n) passes.

    Examples
    --------
    >>> import torch
    >>> prox_linf(torch.tensor([3.0, -1.0, 0.5]), 2.0).tolist()
    [1.0, -1.0, 0.5]
    """
    return v - project_l1_ball(v, c)


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
