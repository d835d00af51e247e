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

import hashlib
import math

import numpy as np
import torch
import torch.distributed as dist

from ..collectives import all_reduce_sum, is_distributed, rank, world_size
from ..solvers.grid_cv import GridCVResult, krr_grid_cv, penalized_grid_cv
from ..solvers.path_cv import PathCVResult, early_stopping_path_cv
from ..solvers.paths import DivergenceError
from .auto import collective_errors, data_parallel
from .sharding import check_consistent

__all__ = ["my_share", "distributed_path_cv", "distributed_krr_grid_cv",
           "distributed_penalized_grid_cv", "cv_solver", "check_replicated", "reduce_scores"]


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
    # fold MSE, best and last iteration, and the bandwidth's score (inf where the solver
    # excludes it) in one table: one all-reduce
    table = torch.zeros(4, S, F, dtype=torch.float64)
    if mine:
        try:
            part = early_stopping_path_cv(X, y, [kernels[i] for i in mine], folds, **kwargs)
        except DivergenceError:  # every bandwidth of this share diverges: so might all
            table[0, mine] = math.inf
            table[3, mine] = math.inf
        else:
            table[0, mine] = part.fold_mse.to(torch.float64)
            table[1, mine] = part.best_iter.to(torch.float64)
            table[2, mine] = part.n_iter.to(torch.float64)
            table[3, mine] = part.cv_mse.to(torch.float64)[:, None].expand(-1, F)
    table = all_reduce_sum(table)
    fold_mse = table[0].to(X.dtype)
    best_iter, n_iter = table[1].round().to(torch.long), table[2].round().to(torch.long)
    cv_mse = table[3, :, 0].to(X.dtype)
    cv_mse = torch.where(torch.isfinite(cv_mse), cv_mse, torch.full_like(cv_mse, math.inf))
    if not bool(torch.isfinite(cv_mse).any()):
        raise DivergenceError("Every bandwidth diverges with step_size="
                              f"{kwargs.get('step_size')}: lower it below 2 / s_max(K).")
    stopping = best_iter.to(torch.float64).mean(1).floor().to(torch.long).clamp_min(1)
    best_index = int(torch.argmin(cv_mse))
    return PathCVResult(cv_mse, fold_mse, best_iter, n_iter, stopping, best_index)


def distributed_krr_grid_cv(X: torch.Tensor, y: torch.Tensor, kernels, alphas, folds
                            ) -> GridCVResult:
    """:func:`~kernelflow.solvers.grid_cv.krr_grid_cv` with bandwidths spread over processes.

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
    """:func:`~kernelflow.solvers.grid_cv.penalized_grid_cv` with bandwidths spread over
    processes (collective).

    Every bandwidth is solved on its own (its folds and penalties as one batch), so the scores
    equal those of the single-process call up to the rounding of thread-dependent sums.
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


# ---- dispatch from the cross-validating estimators ---------------------------------------------
def check_replicated(what: str, *tensors) -> None:
    """Raise ``ValueError`` on every process unless all hold the same tensors (collective).

    Compares a 48-bit digest of the bytes (exact, independent of summation order).

    Examples
    --------
    >>> check_replicated("demo", torch.ones(3))  # one process: nothing to compare
    """
    if not is_distributed():
        return
    h = hashlib.blake2b(digest_size=6)
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    check_consistent(f"{what}: the training data (every process must pass the whole training "
                     "set to a cross-validating estimator)",
                     digest=float(int.from_bytes(h.digest(), "little")))


def _broadcast_object(obj):
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


_SPREAD = {"early_stopping_path_cv": distributed_path_cv, "krr_grid_cv": distributed_krr_grid_cv,
           "penalized_grid_cv": distributed_penalized_grid_cv}


def cv_solver(estimator, solver, X, y, folds):
    """``(grid solver, folds)`` for the ``fit`` of a cross-validating estimator.

    Without data-parallelism (no process group, or ``estimator.distributed`` off) this is
    ``(solver, folds)``. Otherwise it checks (collectively) that every process holds the same
    ``X`` and ``y``, takes process 0's folds (so ``random_state=None`` still gives one split) and
    returns the version of ``solver`` that spreads the bandwidths over the processes: every
    process gets the single-process result, so all select and refit the same model.

    Examples
    --------
    >>> from kernelflow.solvers.grid_cv import krr_grid_cv
    >>> from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV
    >>> fn, folds = cv_solver(PenalizedKernelRegressorCV(), krr_grid_cv, None, None, [[0], [1]])
    >>> fn is krr_grid_cv
    True
    """
    if not data_parallel(getattr(estimator, "distributed", "auto")):
        return solver, folds
    what = f"{type(estimator).__name__}.fit"
    spread = _SPREAD[solver.__name__]
    with collective_errors(what):
        check_replicated(type(estimator).__name__, X, y)
        folds = _broadcast_object(folds)

    def run(*args, **kwargs):
        with collective_errors(what):
            return spread(*args, **kwargs)

    return run, folds


def reduce_scores(scores: np.ndarray) -> np.ndarray:
    """Sum score tables filled on disjoint rows by the processes (collective); float64 NumPy.

    Examples
    --------
    >>> reduce_scores(np.ones((2, 3))).shape
    (2, 3)
    """
    return all_reduce_sum(torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float64))
                          ).numpy()
