"""Synthetic generators and the real-data protocol of the early-stopped kernel regression papers.

Two papers by Allerbo define the data used here:

* the earlier version ("Solving kernel ridge regression with gradient-based optimization
  methods") uses a *sparse* data set, Eq. (16), ``y = exp(-5 x^2) + N(0, 0.1^2)`` with the first
  training point moved to the peak ``x = 0``, and a *robust* data set, Eq. (17),
  ``y = sin(pi x / 2) + C(0, 0.1)`` (Cauchy noise), both with 100 points ``x ~ U(-10, 10)`` and a
  noiseless 1000-point test grid on ``[-10, 10]``;
* the journal version ("Fast robust kernel regression through sign gradient descent with early
  stopping") repeats them as Eq. (15)/(16) (seeds 47 and 35 in its figures), adds a seven-point
  toy problem with one outlier, and evaluates real data by subsampling 100 rows, standardising X,
  centring y, optionally amplifying outliers ``y_i <- y_i (1 + |eps_i|)`` with Cauchy ``eps_i``,
  and splitting 80/20.

The random streams follow NumPy's legacy ``RandomState`` in the order the published experiments
drew them, so ``random_state=s`` gives the same draws as the papers' replicate ``s``.
"""

from __future__ import annotations

import numpy as np

from ..utils.folds import _check_count, _legacy_rng, kfold_indices

__all__ = [
    "make_sparse_peak",
    "make_robust_sine",
    "make_toy_outlier",
    "subsample_protocol",
    "kfold_indices",
]

_X_MAX = 10.0


def make_sparse_peak(n_samples=100, *, noise=0.1, n_test=1000, random_state=None):
    """Sparse synthetic data: a narrow peak on a flat zero signal (Eq. 16 of the earlier paper).

    ``x ~ U(-10, 10)``, the first point set to ``x = 0`` so that the peak is observed, and
    ``y = exp(-5 x^2) + N(0, noise^2)``. The test set is a noiseless grid of ``n_test`` points.
    Cost O(n_samples + n_test).

    Parameters
    ----------
    n_samples : int, default=100
        Number of training points.
    noise : float, default=0.1
        Standard deviation of the Gaussian noise.
    n_test : int, default=1000
        Number of points of the noiseless test grid on [-10, 10].
    random_state : int, RandomState or None, default=None
        Seed; ``s`` reproduces replicate ``s`` of the paper.

    Returns
    -------
    X_train : ndarray of shape (n_samples, 1)
    y_train : ndarray of shape (n_samples,)
    X_test : ndarray of shape (n_test, 1)
    y_test : ndarray of shape (n_test,)

    Examples
    --------
    >>> X, y, X_te, y_te = make_sparse_peak(random_state=0)
    >>> X.shape, float(X[0, 0]), round(float(y_te.max()), 2)
    ((100, 1), 0.0, 1.0)
    """
    n_samples = _check_count("n_samples", n_samples)
    n_test = _check_count("n_test", n_test)
    rng = _legacy_rng(random_state)
    x = rng.uniform(-_X_MAX, _X_MAX, n_samples).reshape(-1, 1)
    x[0] = 0.0
    y = np.exp(-5.0 * x[:, 0] ** 2) + rng.normal(0.0, noise, (n_samples, 1))[:, 0]
    x_test = np.linspace(-_X_MAX, _X_MAX, n_test).reshape(-1, 1)
    return x, y, x_test, np.exp(-5.0 * x_test[:, 0] ** 2)


def make_robust_sine(n_samples=100, *, scale=0.1, n_test=1000, random_state=None):
    """Heavy-tailed synthetic data: a sine with Cauchy noise (Eq. 17 of the earlier paper).

    ``x ~ U(-10, 10)`` and ``y = sin(pi x / 2) + scale * C(0, 1)``; the test set is a noiseless
    grid of ``n_test`` points. Cost O(n_samples + n_test).

    Parameters
    ----------
    n_samples : int, default=100
        Number of training points.
    scale : float, default=0.1
        Scale of the centred Cauchy noise.
    n_test : int, default=1000
        Number of points of the noiseless test grid on [-10, 10].
    random_state : int, RandomState or None, default=None
        Seed; ``s`` reproduces replicate ``s`` of the paper.

    Returns
    -------
    X_train : ndarray of shape (n_samples, 1)
    y_train : ndarray of shape (n_samples,)
    X_test : ndarray of shape (n_test, 1)
    y_test : ndarray of shape (n_test,)

    Examples
    --------
    >>> X, y, X_te, y_te = make_robust_sine(random_state=0)
    >>> X.shape, y_te.shape, round(float(abs(y_te).max()), 3)
    ((100, 1), (1000,), 1.0)
    """
    n_samples = _check_count("n_samples", n_samples)
    n_test = _check_count("n_test", n_test)
    rng = _legacy_rng(random_state)
    x = rng.uniform(-_X_MAX, _X_MAX, n_samples).reshape(-1, 1)
    y = np.sin(np.pi / 2 * x[:, 0]) + scale * rng.standard_cauchy((n_samples, 1))[:, 0]
    x_test = np.linspace(-_X_MAX, _X_MAX, n_test).reshape(-1, 1)
    return x, y, x_test, np.sin(np.pi / 2 * x_test[:, 0])


def make_toy_outlier(*, noise=0.01, outlier=3.0, n_grid=1001, random_state=0):
    """The seven-point toy problem of the journal version's Figures 1, 2 and 4.

    ``x = [0.1, 0.5, 1.0, 1.5, 2.1, 2.5, 2.9]``, ``y = sin(pi x) + N(0, noise^2)`` and an outlier
    ``y_2 += outlier`` at ``x = 0.5``; predictions are drawn on ``n_grid`` points of [0, 3].

    Parameters
    ----------
    noise : float, default=0.01
        Standard deviation of the Gaussian noise.
    outlier : float, default=3.0
        Shift added to the second observation.
    n_grid : int, default=1001
        Size of the plotting grid.
    random_state : int, RandomState or None, default=0
        Seed of the noise (0 in the paper).

    Returns
    -------
    X : ndarray of shape (7, 1)
    y : ndarray of shape (7,)
    X_grid : ndarray of shape (n_grid, 1)

    Examples
    --------
    >>> X, y, grid = make_toy_outlier()
    >>> X.shape, round(float(y[1]), 1), grid.shape
    ((7, 1), 4.0, (1001, 1))
    """
    rng = _legacy_rng(random_state)
    x = np.array([0.1, 0.5, 1.0, 1.5, 2.1, 2.5, 2.9])
    y = np.sin(np.pi * x) + rng.normal(0.0, noise, x.shape)
    y[1] += outlier
    grid = np.linspace(0.0, 3.0, _check_count("n_grid", n_grid, 2)).reshape(-1, 1)
    return x.reshape(-1, 1), y, grid


def subsample_protocol(
    X, y, *, n_samples=100, train_size=0.8, outliers=False, cauchy_scale=0.1, random_state=None
):
    """One split of the journal version's real-data protocol.

    Shuffle all rows, keep ``n_samples`` of them, standardise each column of X with the mean and
    standard deviation of the kept rows, centre y (no scaling), optionally amplify outliers as
    ``y_i <- y_i (1 + |eps_i|)`` with ``eps_i ~ C(0, cauchy_scale)`` (train and test alike), then
    split the first ``train_size`` fraction off for training. The paper's text states
    ``C(0, 0.01)``; its published tables were produced with ``C(0, 0.1)``, the default here.
    Cost O(n p) for the shuffle.

    Parameters
    ----------
    X : array-like of shape (n, p)
        Features of the full data set.
    y : array-like of shape (n,)
        Responses of the full data set.
    n_samples : int, default=100
        Number of rows kept.
    train_size : float, default=0.8
        Fraction of the kept rows used for training.
    outliers : bool, default=False
        Apply the Cauchy amplification.
    cauchy_scale : float, default=0.1
        Scale of the Cauchy amplification.
    random_state : int, RandomState or None, default=None
        Seed of the split (1, ..., 50 in the paper).

    Returns
    -------
    X_train, X_test : ndarray
    y_train, y_test : ndarray

    Examples
    --------
    >>> rng = np.random.RandomState(0)
    >>> X, y = rng.normal(size=(500, 3)), rng.normal(size=500)
    >>> X_tr, X_te, y_tr, y_te = subsample_protocol(X, y, random_state=1)
    >>> X_tr.shape, X_te.shape, round(float(np.concatenate([y_tr, y_te]).mean()), 12)
    ((80, 3), (20, 3), 0.0)
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be 2-D with as many rows as y; got {X.shape} and {y.shape}")
    n_samples = _check_count("n_samples", n_samples, 2)
    if n_samples > X.shape[0]:
        raise ValueError(f"n_samples={n_samples} exceeds the {X.shape[0]} rows available")
    if not 0.0 < train_size < 1.0:
        raise ValueError(f"train_size must lie in (0, 1), got {train_size!r}")
    rng = _legacy_rng(random_state)
    data = np.column_stack([y, X])
    rng.shuffle(data)
    data = data[:n_samples]
    y_s, X_s = data[:, 0].copy(), data[:, 1:]
    std = X_s.std(0)
    X_s = (X_s - X_s.mean(0)) / np.where(std > 0, std, 1.0)
    y_s -= y_s.mean()
    if outliers:
        y_s *= 1.0 + cauchy_scale * np.abs(rng.standard_cauchy(y_s.shape))
    n_train = int(round(train_size * n_samples))
    return X_s[:n_train], X_s[n_train:], y_s[:n_train], y_s[n_train:]
