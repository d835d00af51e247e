"""One holdout rule: which rows an early-stopped estimator validates on.

Every estimator with ``validation_fraction`` holds out rows by the same rule, so the same
``validation_fraction`` and ``random_state`` hold out the same rows everywhere:

- distinct inputs x_i are ordered by a seeded 64-bit hash of their values
  (:func:`row_content_hash`), and whole groups of equal inputs go to validation in that order
  until the held-out weight reaches ``validation_fraction`` of the total
  (:func:`holdout_weights`, :func:`holdout_indices`); for n distinct unweighted rows that is
  ``ceil(validation_fraction * n)`` rows;
- data read as a stream of unknown length keeps a row for validation when its hash, read as a
  number in [0, 1), is below ``validation_fraction`` (:func:`holdout_stream_mask`): the same
  order, so the streamed split nests with the in-memory one, and the held-out count is
  ``validation_fraction * n`` in expectation.

The split depends on neither the row order nor y, copies of a row fall on the same side, and an
integer sample weight acts as repeating the row.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["row_content_hash", "holdout_weights", "holdout_indices", "holdout_stream_mask",
           "resolve_seed", "validation_split"]


def validation_split(n: int, validation_fraction: float,
                     random_state=None) -> tuple[np.ndarray, np.ndarray]:
    """Random split of ``range(n)`` into training and validation indices.

    The validation part has ``ceil(validation_fraction * n)`` rows (at least 1) and the training
    part at least one row. (The estimators use :func:`validation_weights`, which splits by row
    content and respects sample weights.)

    Examples
    --------
    >>> tr, va = validation_split(10, 0.2, random_state=0)
    >>> len(tr), len(va), sorted(np.r_[tr, va].tolist()) == list(range(10))
    (8, 2, True)
    """
    if not 0.0 < float(validation_fraction) < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}.")
    if n < 2:
        raise ValueError(
            f"early stopping needs at least 2 samples to hold out a validation set, got {n} "
            "sample."
        )
    rng = random_state if isinstance(random_state, np.random.RandomState) else \
        np.random.RandomState(random_state)
    n_val = min(n - 1, max(1, math.ceil(validation_fraction * n)))
    perm = rng.permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (a bijection with good avalanche)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def resolve_seed(random_state) -> int:
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2**31 - 1))
    if random_state is None:
        return int(np.random.randint(2**31 - 1))
    return int(random_state)


def row_content_hash(X: torch.Tensor, seed: int) -> np.ndarray:
    """Seeded 64-bit hash of every row of X: equal rows get equal hashes.

    Depends on the row's values and ``seed`` only, not on its position. Cost O(n d).

    Examples
    --------
    >>> h = row_content_hash(torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 1.0]]), seed=0)
    >>> bool(h[0] == h[2]), bool(h[0] != h[1])
    (True, True)
    """
    n = X.shape[0]
    words = (X.reshape(n, -1).to(torch.float64).cpu().numpy() + 0.0).view(np.uint64)
    with np.errstate(over="ignore"):  # + 0.0 above maps -0.0 to 0.0
        h = np.full(n, _mix64(np.uint64(seed) * _GOLDEN + _GOLDEN), dtype=np.uint64)
        for j in range(words.shape[1]):
            h = _mix64((h ^ words[:, j]) + _GOLDEN)
    return h


def holdout_weights(X: torch.Tensor, y: torch.Tensor, sample_weight: torch.Tensor | None,
                       validation_fraction: float, random_state=None):
    """Split the (weighted) rows into a training and a validation part by row content.

    Distinct inputs x_i are put in a pseudo-random order given by a seeded hash of their values
    (:func:`row_content_hash`); all rows sharing an input then go to validation together, in
    that order, until the validation part holds at least ``validation_fraction`` of the total
    weight, and at least one distinct input is left for training. Copies of a row always fall
    on the same side (no row is both trained on and validated on), the split does not depend
    on y (so every target of a multi-output fit shares it), and it depends neither on the row
    order nor on whether a row is repeated or carries an integer weight: fitting with integer
    weights equals fitting on repeated rows. For n distinct unweighted inputs the validation
    part has ``ceil(validation_fraction * n)`` rows, as a random permutation split would. If
    all inputs are equal, rows are grouped by (x_i, y_i) instead. Cost O(n d + n log n).

    Parameters
    ----------
    X : tensor of shape (n, d)
    y : tensor of shape (n,) or (n, t)
    sample_weight : tensor of shape (n,) or None
        Non-negative weights; rows of weight 0 are on neither side.
    validation_fraction : float in (0, 1)
    random_state : int, RandomState or None

    Returns
    -------
    w_train, w_val : tensors of shape (n,)
        Weight of each row in the training part and in the validation part (one of them is 0).

    Examples
    --------
    >>> X = torch.arange(10, dtype=torch.float64)[:, None]
    >>> w_tr, w_va = holdout_weights(X, X[:, 0], None, 0.2, random_state=0)
    >>> int((w_va > 0).sum()), bool(((w_tr > 0) ^ (w_va > 0)).all())
    (2, True)
    """
    if not 0.0 < float(validation_fraction) < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}.")
    n = X.shape[0]
    w = (torch.ones(n, dtype=torch.float64) if sample_weight is None
         else sample_weight.detach().to(device="cpu", dtype=torch.float64))
    w_np = w.numpy()
    pos = w_np > 0
    if int(pos.sum()) < 2:
        raise ValueError(
            "early stopping needs at least 2 samples to hold out a validation set, got "
            f"{int(pos.sum())} sample."
        )
    seed = resolve_seed(random_state)
    groups, inv = np.unique(row_content_hash(X, seed)[pos], return_inverse=True)  # random order
    if groups.size < 2:
        n = X.shape[0]
        Xy = torch.cat([X.reshape(n, -1), y.reshape(n, -1).to(X.dtype)], dim=1)
        groups, inv = np.unique(row_content_hash(Xy, seed)[pos], return_inverse=True)
    if groups.size < 2:
        raise ValueError("early stopping needs at least 2 distinct samples (rows of X and y) to "
                         "hold out a validation set; all samples are identical.")
    gw = np.bincount(inv, weights=w_np[pos], minlength=groups.size)
    target = float(validation_fraction) * float(gw.sum()) * (1.0 - 1e-12)
    n_val = int(np.searchsorted(np.cumsum(gw), target, side="left")) + 1
    n_val = min(max(n_val, 1), groups.size - 1)
    in_val = np.zeros(n, dtype=bool)
    in_val[np.flatnonzero(pos)] = inv < n_val
    val = torch.as_tensor(in_val, device=X.device)
    wd = w.to(device=X.device, dtype=X.dtype)
    zero = torch.zeros_like(wd)
    return torch.where(val, zero, wd), torch.where(val, wd, zero)




def holdout_indices(X: torch.Tensor, validation_fraction: float, random_state=None,
                    y: torch.Tensor | None = None,
                    sample_weight: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the training and the validation rows under the one holdout rule.

    The rows of :func:`holdout_weights` with a positive validation weight, as sorted positions.

    Examples
    --------
    >>> X = torch.arange(20, dtype=torch.float64)[:, None]
    >>> tr, va = holdout_indices(X, 0.1, random_state=0)
    >>> len(tr), len(va), sorted(np.r_[tr, va].tolist()) == list(range(20))
    (18, 2, True)
    """
    yy = torch.zeros(X.shape[0], dtype=X.dtype, device=X.device) if y is None else y
    w_tr, w_va = holdout_weights(X, yy, sample_weight, validation_fraction, random_state)
    return (np.flatnonzero(w_tr.cpu().numpy() > 0), np.flatnonzero(w_va.cpu().numpy() > 0))


def holdout_stream_mask(X_block: torch.Tensor, validation_fraction: float,
                        seed: int) -> np.ndarray:
    """Validation rows of one block of a stream: hash of the row's values below the fraction.

    ``seed`` is :func:`resolve_seed` of the estimator's ``random_state``, drawn once per fit.
    The order is that of :func:`row_content_hash`, so on data held in memory the rows chosen
    here are a subset or superset of those of :func:`holdout_indices`. Cost O(b d).

    Examples
    --------
    >>> X = torch.randn(2000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> m = holdout_stream_mask(X, 0.1, seed=0)
    >>> 150 < int(m.sum()) < 250
    True
    """
    if not 0.0 < float(validation_fraction) < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}.")
    u = row_content_hash(X_block, seed).astype(np.float64) / 2.0**64
    return u < float(validation_fraction)
