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

:func:`split_holdout` applies the rule to any :class:`~kernelflow.sources.DataSource` (rows in
memory, a stream, one process's shard of a data set) and is what every early-stopped fit calls.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..collectives import all_reduce_sum
from ..sources import ArraySource, Block, DataSource, SubsetSource

__all__ = ["check_sides", "row_content_hash", "holdout_weights", "holdout_indices",
           "holdout_stream_mask", "resolve_seed", "HoldoutSplit", "split_holdout"]


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


class _StreamSide(SubsetSource):
    """The rows of a stream on one side of :func:`holdout_stream_mask`; blocks keep their global
    ``start``."""

    def __init__(self, source: DataSource, fraction: float, seed: int, validation: bool):
        super().__init__(source, keep=None)
        self.fraction, self.seed, self.validation = fraction, seed, validation

    def _mask(self, block: Block) -> np.ndarray:
        m = holdout_stream_mask(block.X, self.fraction, self.seed)
        return m if self.validation else ~m


class HoldoutSplit(NamedTuple):
    """The two sides of a source under the holdout rule (:func:`split_holdout`).

    ``train`` and ``validation`` are sources over the rows of each side (blocks keep their
    global ``start``); ``validation_indices`` are the sorted global positions of the held-out
    rows and ``train_indices`` those of the training rows (None when not computed: a stream
    split without ``global_positions``). Rows of weight 0 in memory are on neither side.
    """

    train: DataSource
    validation: DataSource
    train_indices: np.ndarray | None
    validation_indices: np.ndarray


def _position_sides(source: DataSource, val_idx: np.ndarray, train_idx: np.ndarray
                    ) -> HoldoutSplit:
    in_val = np.zeros(source.n_samples, dtype=bool)  # by global position
    in_val[val_idx] = True
    return HoldoutSplit(SubsetSource(source, lambda s, b: ~in_val[s:s + b]),
                        SubsetSource(source, lambda s, b: in_val[s:s + b]),
                        np.asarray(train_idx, dtype=np.int64),
                        np.asarray(val_idx, dtype=np.int64))


def _stream_sides(source: DataSource, fraction: float, seed: int,
                  global_positions: bool) -> HoldoutSplit:
    held = [b.start + np.flatnonzero(holdout_stream_mask(b.X, fraction, seed))
            for b in source._raw_blocks(1 << 16)]
    val_idx = np.sort(np.concatenate(held)).astype(np.int64) if held else \
        np.zeros(0, dtype=np.int64)
    train_idx = None
    if global_positions:  # every process's held-out rows (one all-reduce of an (n,) mask)
        mask = torch.zeros(source.n_samples, dtype=torch.float64)
        mask[torch.from_numpy(val_idx)] = 1.0
        in_val = all_reduce_sum(mask).numpy() > 0.5
        val_idx, train_idx = np.flatnonzero(in_val), np.flatnonzero(~in_val)
    return HoldoutSplit(_StreamSide(source, fraction, seed, validation=False),
                        _StreamSide(source, fraction, seed, validation=True),
                        train_idx, val_idx)


def split_holdout(source: DataSource, validation_fraction: float, seed: int, *,
                  rows: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                  global_positions: bool = False) -> HoldoutSplit:
    """Split any source into a training and a validation side by the one holdout rule.

    Rows held in memory are split by :func:`holdout_indices` (exactly
    ``ceil(validation_fraction * n)`` of n distinct unweighted rows): an
    :class:`~kernelflow.sources.ArraySource`, or any source (a process's shard included) whose
    global rows are given as ``rows = (X, sample_weight)`` in position order. A stream is split
    block by block by :func:`holdout_stream_mask` (the same hash order, so the two nest). The
    global positions of a stream's held-out rows are those this process reads, or with
    ``global_positions`` those of all processes. Collective: the side sizes are summed over the
    processes (identity without a process group), and an empty side raises ``ValueError`` on
    every process. Cost O(n d) (one pass for a stream).

    Parameters
    ----------
    source : DataSource
        Rows by global position (``Block.start``).
    validation_fraction : float in (0, 1)
    seed : int
        :func:`resolve_seed` of the estimator's ``random_state``, drawn once per fit.
    rows : (tensor of shape (n, d), tensor of shape (n,) or None), optional
        All n rows of the data set and their weights, in global order (gathered from the
        processes holding them); ignored unless ``n == source.n_samples``.
    global_positions : bool, default=False
        For a stream: all processes' positions, and ``train_indices`` too.

    Returns
    -------
    HoldoutSplit

    Examples
    --------
    >>> X = torch.arange(20, dtype=torch.float64)[:, None]
    >>> split = split_holdout(ArraySource(X, X[:, 0]), 0.1, seed=0)
    >>> split.train.n_samples, split.validation.n_samples, len(split.validation_indices)
    (18, 2, 2)
    """
    fraction = float(validation_fraction)
    if isinstance(source, ArraySource):
        train_idx, val_idx = holdout_indices(source.X, fraction, seed, y=source.y,
                                             sample_weight=source.sample_weight)
        split = _position_sides(source, val_idx, train_idx)
    elif rows is not None and rows[0].shape[0] == source.n_samples:
        train_idx, val_idx = holdout_indices(rows[0], fraction, seed, sample_weight=rows[1])
        split = _position_sides(source, val_idx, train_idx)
    else:
        split = _stream_sides(source, fraction, seed, global_positions)
    # sides of a shard count this process's rows
    counts = all_reduce_sum(torch.tensor([split.train.n_samples, split.validation.n_samples],
                                         dtype=torch.float64))
    check_sides(int(counts[0]), int(counts[1]), validation_fraction)
    return split


def check_sides(n_train: int, n_validation: int, validation_fraction: float) -> None:
    """The one error for a holdout split with an empty side (``ValueError``).

    Examples
    --------
    >>> check_sides(9, 1, 0.1)
    >>> check_sides(0, 1, 0.9)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: early stopping with validation_fraction=0.9 leaves an empty training or ...
    """
    if min(n_train, n_validation) == 0:
        raise ValueError(
            f"early stopping with validation_fraction={validation_fraction} leaves an empty "
            f"training or validation set ({n_train} training and {n_validation} "
            f"validation rows of {n_train + n_validation} samples)."
        )
