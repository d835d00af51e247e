"""K-fold splits shared by the cross-validated estimators and the reproduction protocols."""

from __future__ import annotations

import numpy as np

__all__ = ["kfold_indices"]


def _legacy_rng(random_state) -> np.random.RandomState:
    if isinstance(random_state, np.random.RandomState):
        return random_state
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return np.random.RandomState(random_state)
    raise TypeError(
        f"random_state must be None, an int or a numpy RandomState, got {type(random_state)!r}"
    )


def _check_count(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def kfold_indices(n_samples: int, n_folds: int = 10, *,
                  random_state: int | np.random.RandomState | None = None) -> list[np.ndarray]:
    """Fold index arrays: ``array_split(permutation(n), n_folds)``, each fold sorted.

    The permutation is NumPy's legacy ``RandomState(random_state).permutation``, the stream
    the published experiments of the early-stopped kernel regression papers drew, so the
    same seed gives their folds. The same folds serve every method and every grid point, so
    a comparison is paired. Cost O(n_samples).

    Parameters
    ----------
    n_samples : int
        Number of rows to split.
    n_folds : int, default=10
        Number of folds (2 <= n_folds <= n_samples).
    random_state : int, RandomState or None, default=None
        Seed of the permutation.

    Returns
    -------
    folds : list of ndarray
        Validation indices of each fold.

    Examples
    --------
    >>> [len(f) for f in kfold_indices(23, 5, random_state=0)]
    [5, 5, 5, 4, 4]
    """
    n_samples = _check_count("n_samples", n_samples, 2)
    n_folds = _check_count("n_folds", n_folds, 2)
    if n_folds > n_samples:
        raise ValueError(f"n_folds={n_folds} exceeds n_samples={n_samples}")
    perm = _legacy_rng(random_state).permutation(n_samples)
    return [np.sort(f) for f in np.array_split(perm, n_folds)]
