"""Synthetic data of Dai et al. (2014), Sec. 7 (Fig. 4 and 5): a radial damped cosine.

``y = cos(0.5π|x|₂) exp(-0.1π|x|₂) + noise · e`` with ``x`` uniform on ``[-5, 5]²`` (the paper
gives the square, not the distribution; uniform is the natural reading) and ``e ~ N(0, 1)``.
The paper uses 2^20 rows, noise 0.1, a Gaussian kernel with σ = 0.1 × the median distance,
ν = 1e-6 and batch = block = 2^10.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

__all__ = ["make_doubly_stochastic_regression", "doubly_stochastic_stream", "radial_target"]


def radial_target(X: np.ndarray) -> np.ndarray:
    """Noise-free target ``cos(0.5π|x|) exp(-0.1π|x|)`` (range about [-0.46, 1]).

    Examples
    --------
    >>> float(radial_target(np.zeros((1, 2)))[0])
    1.0
    """
    r = np.linalg.norm(np.asarray(X, dtype=np.float64), axis=1)
    return np.cos(0.5 * math.pi * r) * np.exp(-0.1 * math.pi * r)


def make_doubly_stochastic_regression(n_samples=1024, *, n_features=2, noise=0.1, low=-5.0,
                                      high=5.0, random_state=None):
    """Rows of the paper's synthetic regression (Fig. 4 setting).

    Cost O(n_samples · n_features).

    Parameters
    ----------
    n_samples : int, default=1024
    n_features : int, default=2
        The paper uses 2; more dimensions keep the radial target.
    noise : float, default=0.1
        Standard deviation of the Gaussian noise.
    low, high : float, default=-5, 5
        The cube the inputs are uniform on.
    random_state : int, RandomState or None

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)

    Examples
    --------
    >>> X, y = make_doubly_stochastic_regression(5, random_state=0)
    >>> X.shape, y.shape
    ((5, 2), (5,))
    """
    rng = np.random.RandomState(random_state) if not isinstance(
        random_state, np.random.RandomState) else random_state
    X = rng.uniform(low, high, size=(int(n_samples), int(n_features)))
    y = radial_target(X) + noise * rng.randn(int(n_samples))
    return X, y


def doubly_stochastic_stream(n_samples=10**6, *, chunk_size=16384, n_features=2, noise=0.1,
                             random_state=0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream of ``n_samples`` rows of the synthetic regression, in chunks.

    Chunk ``i`` is drawn from ``RandomState([random_state, i])``, so the stream is reproducible
    and any chunk can be regenerated alone; memory O(chunk_size · n_features).

    Parameters
    ----------
    n_samples : int, default=10**6
    chunk_size : int, default=16384
    n_features, noise : as in :func:`make_doubly_stochastic_regression`
    random_state : int, default=0

    Yields
    ------
    X : ndarray of shape (chunk, n_features)
    y : ndarray of shape (chunk,)

    Examples
    --------
    >>> sum(len(y) for _, y in doubly_stochastic_stream(1000, chunk_size=300))
    1000
    """
    for i, start in enumerate(range(0, int(n_samples), int(chunk_size))):
        m = min(int(chunk_size), int(n_samples) - start)
        rng = np.random.RandomState([int(random_state), i])
        yield make_doubly_stochastic_regression(m, n_features=n_features, noise=noise,
                                                random_state=rng)
