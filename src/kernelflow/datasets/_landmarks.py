"""Synthetic data for landmark selection: clusters of very unequal size, low-rank PSD matrices.

Uniform landmarks spend their budget in proportion to cluster size, so small clusters get
no landmark at all; selectors that look at the kernel (pivoted Cholesky, leverage scores,
continuous optimisation) cover them. :func:`make_unequal_clusters` builds that situation
with a regression target that varies inside every cluster.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

__all__ = ["make_low_rank_psd", "make_unequal_clusters"]


def make_unequal_clusters(
    n_samples: int = 2000,
    n_features: int = 5,
    *,
    n_clusters: int = 10,
    size_ratio: float = 0.6,
    cluster_std: float = 0.5,
    center_box: float = 10.0,
    noise: float = 0.1,
    random_state=None,
):
    """Gaussian clusters whose sizes decay geometrically, with a smooth regression target.

    Cluster ``j`` gets a share proportional to ``size_ratio**j`` of the points (at least
    one point each), a centre drawn uniformly in ``[-center_box, center_box]^d`` and
    spread ``cluster_std * (0.5 + u_j)`` with ``u_j ~ U(0, 1)``. The target is
    ``y = sin(x . a_j) + b_j + noise * eps`` with a per-cluster direction ``a_j`` and offset
    ``b_j``, so every cluster needs its own landmarks.

    Parameters
    ----------
    n_samples : int, default=2000
    n_features : int, default=5
    n_clusters : int, default=10
    size_ratio : float in (0, 1], default=0.6
        1 gives equal sizes; smaller values make the tail clusters smaller.
    cluster_std : float, default=0.5
    center_box : float, default=10.0
    noise : float, default=0.1
    random_state : int, RandomState instance or None

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_samples,)
        Cluster of each point.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.datasets._landmarks import make_unequal_clusters
    >>> X, y, labels = make_unequal_clusters(500, 2, n_clusters=4, random_state=0)
    >>> X.shape, np.bincount(labels).tolist()
    ((500, 2), [232, 137, 82, 49])
    """
    if n_clusters < 1 or n_samples < n_clusters:
        raise ValueError(
            f"need 1 <= n_clusters <= n_samples, got n_clusters={n_clusters}, "
            f"n_samples={n_samples}"
        )
    if not 0 < size_ratio <= 1:
        raise ValueError(f"size_ratio must lie in (0, 1], got {size_ratio}")
    rng = check_random_state(random_state)
    share = size_ratio ** np.arange(n_clusters)
    sizes = np.maximum(1, np.floor(share / share.sum() * n_samples).astype(int))
    sizes[0] += n_samples - sizes.sum()
    centers = rng.uniform(-center_box, center_box, size=(n_clusters, n_features))
    spreads = cluster_std * (0.5 + rng.uniform(size=n_clusters))
    directions = rng.randn(n_clusters, n_features)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True) * spreads[:, None]
    offsets = rng.randn(n_clusters)
    labels = np.repeat(np.arange(n_clusters), sizes)
    X = centers[labels] + spreads[labels, None] * rng.randn(n_samples, n_features)
    proj = np.einsum("ij,ij->i", X - centers[labels], directions[labels])
    y = np.sin(proj) + offsets[labels] + noise * rng.randn(n_samples)
    perm = rng.permutation(n_samples)
    return X[perm], y[perm], labels[perm]


def make_low_rank_psd(n: int = 100, rank: int = 5, *, noise: float = 1e-3, decay: float = 0.7,
                      random_state=None):
    """``K = U diag(s) U^T + noise I`` with ``s_i = decay**i`` (a clear low-rank PSD matrix).

    Examples
    --------
    >>> from kernelflow.datasets._landmarks import make_low_rank_psd
    >>> K = make_low_rank_psd(20, 3, random_state=0)
    >>> K.shape, bool((K == K.T).all())
    ((20, 20), True)
    """
    rng = check_random_state(random_state)
    U, _ = np.linalg.qr(rng.randn(n, rank))
    s = decay ** np.arange(rank) * n
    K = (U * s) @ U.T + noise * np.eye(n)
    return (K + K.T) / 2
