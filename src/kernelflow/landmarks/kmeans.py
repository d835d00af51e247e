"""k-means landmarks: the centroids themselves (Zhang, Tsang and Kwok 2008).

Lloyd iterations in torch from a k-means++ start (Arthur and Vassilvitskii 2007), best of
``n_init`` restarts by inertia. The landmarks are the ``k`` centroids, which in general are
not data points (``Selection.indices`` is ``None``); ``Selection.weights`` holds the cluster
sizes. Cost ``O(n k d)`` per Lloyd iteration; no kernel entries are read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ._access import as_tensor, check_k
from ._base import LandmarkSelector, Param, Selection, _generator

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

logger = logging.getLogger(__name__)

__all__ = ["KMeansCenters", "kmeans"]


def _sqdist(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    d = (X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]
    return d.clamp_min(0)


def _kmeanspp(X: torch.Tensor, k: int, gen: torch.Generator | None) -> torch.Tensor:
    n = X.shape[0]
    first = int(torch.randint(n, (1,), generator=gen))
    C = [X[first]]
    d = _sqdist(X, X[first : first + 1])[:, 0]
    for _ in range(1, k):
        if float(d.sum()) <= 0:
            i = int(torch.randint(n, (1,), generator=gen))
        else:
            i = int(torch.multinomial(d, 1, generator=gen))
        C.append(X[i])
        d = torch.minimum(d, _sqdist(X, X[i : i + 1])[:, 0])
    return torch.stack(C)


def kmeans(X: ArrayLike, k: int, *, n_init: int = 3, max_iter: int = 100, tol: float = 1e-6,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Lloyd's k-means with k-means++ seeding.

    Returns
    -------
    centers : tensor of shape (k, d)
    labels : tensor of int64, shape (n,)
    inertia : float
        Sum of squared distances to the nearest centre.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import kmeans
    >>> X = torch.tensor([[0.0], [0.1], [10.0], [10.1]], dtype=torch.float64)
    >>> C, labels, _ = kmeans(X, 2, generator=torch.Generator().manual_seed(0))
    >>> sorted(C.flatten().tolist())
    [0.05, 10.05]
    """
    X = as_tensor(X)
    k = check_k(k, X.shape[0])
    best: tuple[torch.Tensor, torch.Tensor, float] | None = None
    for _ in range(n_init):
        C = _kmeanspp(X, k, generator)
        for _ in range(max_iter):
            labels = _sqdist(X, C).argmin(1)
            counts = torch.bincount(labels, minlength=k).to(X.dtype)
            sums = torch.zeros_like(C).index_add_(0, labels, X)
            empty = counts == 0
            newC = torch.where(empty[:, None], C, sums / counts.clamp_min(1)[:, None])
            if bool(empty.any()):
                # re-seed empty clusters at the points farthest from their centre
                far = _sqdist(X, newC).min(1).values.argsort(descending=True)
                newC[empty] = X[far[: int(empty.sum())]]
            shift = float(((newC - C) ** 2).sum())
            C = newC
            if shift <= tol * float((C * C).sum().clamp_min(1e-300)):
                break
        D = _sqdist(X, C)
        labels = D.argmin(1)
        inertia = float(D.min(1).values.sum())
        if best is None or inertia < best[2]:
            best = (C, labels, inertia)
    if best is None:
        raise ValueError(f"n_init must be at least 1, got {n_init}.")
    return best


class KMeansCenters(LandmarkSelector):
    """Landmarks = k-means centroids (not data points).

    Parameters
    ----------
    n_init : int, default=3
    max_iter : int, default=100

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import KMeansCenters
    >>> X = torch.randn(100, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> sel = KMeansCenters().select(X, Gaussian(1.0), 4, random_state=0)
    >>> tuple(sel.centers.shape), sel.indices is None, int(sel.weights.sum())
    ((4, 2), True, 100)
    """

    _param_spec = {"n_init": Param("int", 1), "max_iter": Param("int", 1)}

    def __init__(self, *, n_init: int = 3, max_iter: int = 100) -> None:
        self.n_init = n_init
        self.max_iter = max_iter

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        X = as_tensor(X)
        k = check_k(k, X.shape[0])
        C, labels, _ = kmeans(X, k, n_init=self.n_init, max_iter=self.max_iter,
                              generator=_generator(random_state))
        counts = torch.bincount(labels, minlength=k).to(X.dtype)
        return Selection(indices=None, centers=C, weights=counts)
