"""Cross-validation grids spread over processes: each process scores a share of the bandwidths.

The (bandwidth x fold) problems of :mod:`kernelflow.solvers.path_cv` are independent across
bandwidths, so process r takes bandwidths r, r + p, r + 2p, ... (round robin, which balances a
grid ordered by bandwidth), solves all folds of those with the single-process solver, and one
all-reduce of the zero-padded (S, F) tables gives every process the whole result. The scores are
those of the single-process call (the batched solver's results do not depend on which bandwidths
share a batch). Every process holds the (small) training set: these are the exact, n x n solvers.
With fewer bandwidths than processes, some processes idle.
"""

from __future__ import annotations

import math

import torch

from ..solvers.path_cv import (
    GridCVResult,
    PathCVResult,
    early_stopping_path_cv,
    krr_grid_cv,
    penalized_grid_cv,
)
from ._comm import all_reduce_sum, rank, world_size

__all__ = ["my_share", "distributed_path_cv", "distributed_krr_grid_cv",
           "distributed_penalized_grid_cv"]


def my_share(n_items: int) -> list[int]:
    """Indices of the grid points this process handles (round robin over the processes).

    Examples
    --------
    >>> my_share(5)  # one process: everything
    [0, 1, 2, 3, 4]
    """
    return list(range(rank(), int(n_items), world_size()))


def distributed_path_cv(X: torch.Tensor, y: torch.Tensor, kernels, folds, **kwargs
                        ) -> PathCVResult:
    """:func:`~kernelflow.solvers.path_cv.early_stopping_path_cv` with bandwidths spread over
    processes; every process returns the full result (collective).

    Cost per process: the single-process cost times about ceil(S / p) / S, plus one all-reduce
    of 3 S F numbers.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(0, 6, 40, dtype=torch.float64).reshape(-1, 1)
    >>> res = distributed_path_cv(X, torch.sin(X[:, 0]), [Gaussian(0.1), Gaussian(1.0)],
    ...                           [list(range(i, 40, 4)) for i in range(4)], method="gradient",
    ...                           max_iter=2000, n_iter_no_change=50)
    >>> res.best_index
    1
    """
    S, F = len(kernels), len(folds)
    mine = my_share(S)
    fold_mse = torch.zeros(S, F, dtype=torch.float64)
    best_iter = torch.zeros(S, F, dtype=torch.float64)
    n_iter = torch.zeros(S, F, dtype=torch.float64)
    if mine:
        part = early_stopping_path_cv(X, y, [kernels[i] for i in mine], folds, **kwargs)
        fold_mse[mine] = part.fold_mse.to(torch.float64)
        best_iter[mine] = part.best_iter.to(torch.float64)
        n_iter[mine] = part.n_iter.to(torch.float64)
    packed = all_reduce_sum(torch.stack([fold_mse, best_iter, n_iter]))
    fold_mse = packed[0].to(X.dtype)
    best_iter, n_iter = packed[1].round().to(torch.long), packed[2].round().to(torch.long)
    cv_mse = fold_mse.mean(1)
    cv_mse = torch.where(torch.isfinite(cv_mse), cv_mse, torch.full_like(cv_mse, math.inf))
    stopping = best_iter.to(torch.float64).mean(1).floor().to(torch.long).clamp_min(1)
    best_index = int(torch.argmin(cv_mse)) if torch.isfinite(cv_mse).any() else 0
    return PathCVResult(cv_mse, fold_mse, best_iter, n_iter, stopping, best_index)


def distributed_krr_grid_cv(X: torch.Tensor, y: torch.Tensor, kernels, alphas, folds
                            ) -> GridCVResult:
    """:func:`~kernelflow.solvers.path_cv.krr_grid_cv` with bandwidths spread over processes.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(0, 6, 30, dtype=torch.float64).reshape(-1, 1)
    >>> distributed_krr_grid_cv(X, torch.sin(X[:, 0]), [Gaussian(1.0)], [1e-3, 1e3],
    ...                         [list(range(i, 30, 3)) for i in range(3)]).best_index
    (0, 0)
    """
    return _spread_grid(krr_grid_cv, X, y, kernels, alphas, folds)


def distributed_penalized_grid_cv(X: torch.Tensor, y: torch.Tensor, kernels, alphas, folds,
                                  **kwargs) -> GridCVResult:
    """:func:`~kernelflow.solvers.path_cv.penalized_grid_cv` with bandwidths spread over
    processes (collective).

    The batched solver stops when every problem of its batch meets the KKT tolerance ``tol``,
    so with other batch compositions the scores agree with the single-process call to that
    tolerance rather than bit for bit.
    """
    return _spread_grid(penalized_grid_cv, X, y, kernels, alphas, folds, **kwargs)


def _spread_grid(solver, X, y, kernels, alphas, folds, **kwargs) -> GridCVResult:
    S, L = len(kernels), len(alphas)
    mine = my_share(S)
    out = torch.zeros(S, L, dtype=torch.float64)
    if mine:
        out[mine] = solver(X, y, [kernels[i] for i in mine], alphas, folds, **kwargs).cv_mse.to(
            torch.float64)
    out = all_reduce_sum(out).to(X.dtype)
    flat = int(torch.argmin(out))
    return GridCVResult(out, divmod(flat, L))
