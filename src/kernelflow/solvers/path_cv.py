"""Cross-validation over whole regularisation paths, batched over folds and bandwidths.

Early stopping (Allerbo, §6; digest §2.8). Every (bandwidth, fold) pair is one problem: start at
alpha = 0 on the fold's training rows, take steps of size eta,

* ``"gradient"``:   alpha <- alpha + eta r                      (KGD, Eq. 8)
* ``"sign"``:       alpha <- alpha + eta sign(r), sign(0) = 0    (KSGD, Eq. 14)
* ``"coordinate"``: alpha <- alpha + eta I_inf(r)               (KCD, all tied maxima move)

with r = y - K alpha, and after every step record the validation MSE of K_val alpha. A problem
stops after ``n_iter_no_change`` consecutive steps without a strict improvement (or at
``max_iter``); its fold score is its best validation MSE and its best iteration the step count at
that minimum. A bandwidth's score is the mean fold score, and the stopping time is
``int(mean_f best_iteration_f)``, after which the model is refitted on all training rows.

Batching. With folds given as masks over the n training rows, problem (sigma, f) keeps
z = K_sigma alpha_f on *all* n rows (the fold's validation rows included), so the problems of one
bandwidth share one n x n kernel and one step of the whole grid is one batched product
``Z <- Z + eta D K`` with Z, D of shape (bandwidths, folds, n). Validation errors are evaluated
for a chunk of steps at once from the recorded Z, and a bandwidth leaves the batch as soon as all
its folds have stopped. The result equals running every problem on its own (tested).

Compiled loops. On CPU tensors sign and coordinate descent run by default problem by problem in
C (:mod:`._native`, ``backend="native"``): each step costs O(n) plus one kernel row per flipped
sign or moved coefficient, without the fixed per-step cost of tensor operations, which
dominates for the papers' 100-row problems. The running sums round differently from the
batched product, so on a flat stretch of a validation curve the first minimum can fall on a
neighbouring step with the same error (tested against the direct loop).

Explicit penalties. :func:`krr_grid_cv` scores a (bandwidth x penalty) grid of kernel ridge
regression from one eigendecomposition per (bandwidth, fold) (``solvers.direct``);
:func:`penalized_grid_cv` does the same for the l1 / l_inf / l2 penalties by proximal gradient,
all (bandwidth, fold) problems batched, penalties visited from large to small with warm starts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels import Kernel
from ..operators import Options, memory_budget
from ..utils._progress import progress
from ..utils.monitor import BatchedEarlyStopping
from . import _native
from .grid_cv import fold_masks
from .losses import RESIDUAL_LOSSES, get_residual_loss
from .paths import DivergenceError
from .paths.rules import PathRule, RowMask, as_rule, huber_epsilon
from .paths.spectral import ChunkedSpectralFilter

__all__ = [
    "PathCVResult",
    "fold_masks",
    "early_stopping_path_cv",
    "METHODS",
]

logger = logging.getLogger(__name__)

METHODS = ("gradient", "sign", "coordinate")


@dataclass
class PathCVResult:
    """Outcome of :func:`early_stopping_path_cv` for S bandwidths and F folds.

    Attributes
    ----------
    cv_mse : tensor of shape (S,)
        Mean over folds of the best validation MSE (``inf`` where a problem diverged).
    fold_mse : tensor of shape (S, F)
        Best validation MSE of each problem.
    best_iter : tensor of shape (S, F)
        Number of steps taken when the best validation MSE was reached (>= 1).
    n_iter : tensor of shape (S, F)
        Steps run before the problem stopped.
    stopping_iter : tensor of shape (S,)
        ``int(mean_f best_iter)``, the number of steps of the refit.
    best_index : int
        Index of the bandwidth with the smallest ``cv_mse`` (first one on ties).
    step_size : tensor of shape (S,) or None
        Step of each bandwidth (all equal unless ``step_size="auto"``).

    For ``method="gradient"``, bandwidths with eta > 2 / s_max(K) (where gradient descent
    diverges, Prop 5.3) get ``cv_mse = inf``; if all do, :class:`DivergenceError` is raised.
    """

    cv_mse: torch.Tensor
    fold_mse: torch.Tensor
    best_iter: torch.Tensor
    n_iter: torch.Tensor
    stopping_iter: torch.Tensor
    best_index: int
    step_size: torch.Tensor | None = None


def _kernel_stack(kernels, X: torch.Tensor) -> torch.Tensor:
    return torch.stack([k(X, X) for k in kernels])


def _group_size(n_kernels: int, n: int, n_folds: int, chunk: int, dtype, options) -> int:
    # per bandwidth: its n x n kernel plus (chunk + 3) copies of the (F, n) state
    per = (n * n + (chunk + 3) * n_folds * n) * torch.finfo(dtype).bits // 8
    budget = memory_budget(options)
    if per > budget:
        raise MemoryError(
            f"Path cross-validation needs the dense {n} x {n} kernel ({per / 2**20:.1f} MiB per "
            f"bandwidth) but the memory budget is {budget / 2**20:.1f} MiB; use an estimator "
            "with early_stopping=True and a validation fraction instead."
        )
    return max(1, min(n_kernels, budget // per))


VALIDATION_LOSSES = tuple(RESIDUAL_LOSSES)


def _pointwise_loss(diff: torch.Tensor, loss: str, eps) -> torch.Tensor:
    """Squared, absolute or Huber validation error of ``diff``, in place (``eps`` broadcasts)."""
    return get_residual_loss(loss, what="validation_loss").error(diff, eps, inplace=True)


class _SpectralGD:
    """Validation predictions of every gradient-descent iterate of a batch of problems.

    For fold f the training block of K is diag(m_f) K diag(m_f) = U diag(s) U^T (validation
    rows and columns zeroed, so their eigenvalues are 0 and y has no weight there) and
    alpha_k = U phi_k(s) U^T y with the filter phi_k of :mod:`.paths.spectral`, hence
    K_val alpha_k = (K_val U) (phi_k(s) * U^T y); the filter of a chunk of steps comes from
    :class:`~.paths.spectral.ChunkedSpectralFilter`, so a chunk costs one batched product.
    """

    def __init__(self, K, y, train, val_idx, eta, chunk):
        G, n, F = K.shape[0], K.shape[1], train.shape[0]
        Kt = K.unsqueeze(1) * train.reshape(1, F, n, 1) * train.reshape(1, F, 1, n)
        s, U = torch.linalg.eigh(Kt)  # (G, F, n), (G, F, n, n)
        s = s.clamp_min(0.0)
        b = (U * (y * train).reshape(1, F, n, 1)).sum(-2)  # U^T y: (G, F, n)
        rows = K[:, val_idx.reshape(-1), :].reshape(G, F, val_idx.shape[1], n)
        self.W = torch.matmul(rows, U)  # K_val U: (G, F, n_val, n)
        self.filter = ChunkedSpectralFilter(s, b, eta, chunk)
        # directions with s = 0 grow linearly (phi_k = k eta): projected once
        self.v0 = torch.matmul(self.W, (b * self.filter.zero).unsqueeze(-1))[..., 0]
        self.yv = y[val_idx]  # (F, n_val)

    def keep(self, mask):
        self.W, self.v0 = self.W[mask], self.v0[mask]
        self.filter.keep(mask)

    def val_mse(self, c, weights, loss="squared", eps=None):
        coef, t = self.filter.next(c)  # (G, F, n, c), (c,)
        P = torch.matmul(self.W, coef)  # (G, F, n_val, c)
        P += t * self.v0.unsqueeze(-1)
        eps = None if eps is None else eps.reshape(-1, 1, 1)
        err = _pointwise_loss(P - self.yv.unsqueeze(-1), loss, eps).mul_(weights.unsqueeze(-1))
        return err.sum(-2).permute(2, 0, 1)  # (c, G, F)


def _factor_groups(ids, K, rel_tol=None):
    """Split bandwidths into a dense group and a low-rank group K = L L^T.

    For wide bandwidths K is numerically low rank: dropping the smallest eigenvalues whose sum
    is below ``rel_tol * trace(K)`` (rel_tol = 64 eps of the dtype) changes K alpha by less than
    the rounding of the dense product, and a step then costs 2 F n r instead of F n^2.
    """
    n = K.shape[-1]
    eps = torch.finfo(K.dtype).eps
    rel_tol = 64 * eps if rel_tol is None else rel_tol
    s, U = torch.linalg.eigh(K)  # ascending
    s = s.clamp_min(0.0)
    tail = torch.cumsum(s, dim=-1)  # sum of the j + 1 smallest eigenvalues
    drop = (tail <= rel_tol * s.sum(-1, keepdim=True)).sum(-1)
    rank = n - drop
    low = rank <= n // 3
    parts = []
    if bool((~low).any()):
        parts.append((ids[~low], K[~low], None))
    if bool(low.any()):
        r = int(rank[low].max())
        L = U[low][..., n - r:] * s[low][..., n - r:].sqrt().unsqueeze(-2)  # (G, n, r)
        parts.append((ids[low], L.contiguous(), L.transpose(1, 2).contiguous()))
    return parts


def _compact_folds(stop, fid, min_gain=0.75):
    """Per bandwidth, the positions of its unfinished folds first; None if not worth it.

    Returns ``sel`` of shape (G, F') with F' the largest number of unfinished folds of any
    bandwidth, when F' <= ``min_gain`` times the current fold dimension.
    """
    active = stop == 0
    width = int(active.sum(1).max())
    if width == 0 or width > min_gain * stop.shape[1]:
        return None
    order = torch.argsort((~active).to(torch.int8), dim=1, stable=True)
    return order[:, :width]


def _run_group(ids, P1, P2, spectral, y, train, val, weights, weights_val, rule, step_size,
               chunk, max_iter, patience, fold_mse, best_iter, n_iter, bar, loss="squared",
               eps=None):
    """Advance the problems of bandwidths ``ids`` until all stop; write their results.

    Finished problems leave the batch: a bandwidth leaves once all its folds have stopped, and
    within the remaining bandwidths the fold dimension shrinks to the largest number of
    unfinished folds (each bandwidth's unfinished folds first, ``fid`` keeping their fold
    numbers), so long-running folds do not keep finished ones computing.
    """
    G, F, n = ids.numel(), train.shape[0], train.shape[1]
    dt, dev = y.dtype, y.device
    state = _SpectralGD(P1, y, train, val, step_size, chunk) if spectral else None
    A = torch.zeros(G, F, n, dtype=dt, device=dev)
    Z = torch.zeros_like(A)
    H = torch.empty(chunk, G, F, n, dtype=dt, device=dev)
    mon = BatchedEarlyStopping((G, F), patience, nonfinite="worst", device=dev, dtype=dt)
    stop = torch.zeros(G, F, dtype=torch.long, device=dev)  # stopping step, 0 while running
    fid = torch.arange(F, device=dev).expand(G, F)  # fold number of each slot
    train_g, weights_g = train.expand(G, F, n), weights.expand(G, F, n)
    mask = RowMask(train_g)  # the rule may cache what it derives from the training rows

    def record(rows, mask):
        g = ids[rows].unsqueeze(1).expand_as(fid[rows])[mask]
        f = fid[rows][mask]
        fold_mse[g, f] = mon.best_loss[rows][mask]
        best_iter[g, f] = mon.best_iteration[rows][mask].clamp_min(0)
        n_iter[g, f] = stop[rows][mask]

    k = 0
    while k < max_iter and ids.numel() > 0:
        c = min(chunk, max_iter - k)
        if spectral:
            M = state.val_mse(c, weights_val, loss, eps)
        else:
            yt = y * train_g
            for j in range(c):
                # r on training rows (zero on validation rows: they never move)
                R = torch.addcmul(yt, Z, train_g, value=-1.0)
                A = rule.batched_step(A, R, step_size, mask)
                if P2 is None:
                    Z = torch.bmm(A, P1, out=H[j])  # rows K alpha_f (K symmetric)
                else:
                    Z = torch.bmm(torch.bmm(A, P1), P2, out=H[j])  # (alpha L) L^T
            e = None if eps is None else eps[fid].unsqueeze(-1)
            M = (_pointwise_loss(H[:c] - y, loss, e).mul_(weights_g)).sum(-1)  # (c, G, F)
        mon.update_chunk(k + 1, M)
        stop = mon.stop_iteration.clamp_min(0)  # 0 while running
        k += c
        done = (stop > 0).all(1)
        if bar is not None:  # steps of every bandwidth; a finished one skips its remaining
            bar.update(c * ids.numel() + (max_iter - k) * int(done.sum()))
        if done.any():  # drop finished bandwidths from the batch
            every = torch.ones_like(fid, dtype=torch.bool)[done]
            record(torch.nonzero(done).reshape(-1), every)
            keep = ~done
            ids, A, stop = ids[keep], A[keep], stop[keep]
            mon.select(keep)
            fid, train_g, weights_g = fid[keep], train_g[keep], weights_g[keep]
            mask = RowMask(train_g)
            P1 = P1[keep]
            P2 = None if P2 is None else P2[keep]
            H = H[:, keep].contiguous()
            Z = H[c - 1] if not spectral else Z
            if spectral:
                state.keep(keep)
        sel = None if spectral or ids.numel() == 0 else _compact_folds(stop, fid)
        if sel is not None:  # drop finished folds of the remaining bandwidths
            rows = torch.arange(ids.numel(), device=dev)
            record(rows, stop > 0)
            pick = sel.unsqueeze(-1).expand(-1, -1, n)
            A, Z = A.gather(1, pick), Z.gather(1, pick)
            stop = stop.gather(1, sel)
            mon.gather(1, sel)
            fid = fid.gather(1, sel)
            train_g, weights_g = train[fid], weights[fid]
            mask = RowMask(train_g)
            H = torch.empty(chunk, *A.shape, dtype=dt, device=dev)
    if ids.numel() > 0:  # reached max_iter
        stop = torch.where(stop > 0, stop, torch.full_like(stop, k))
        record(torch.arange(ids.numel(), device=dev), torch.ones_like(stop, dtype=torch.bool))
    return k


def early_stopping_path_cv(
    X: torch.Tensor,  # shape: (n, p)
    y: torch.Tensor,  # shape: (n,)
    kernels,  # list of S Kernel objects (the bandwidth grid)
    folds,  # list of F validation index arrays
    *,
    method="sign",
    step_size=0.01,
    max_iter: int = 10_000,
    n_iter_no_change: int = 100,
    validation_loss: str = "squared",
    chunk_size: int = 64,
    spectral_gradient: bool = True,
    low_rank: bool = True,
    backend: str = "auto",
    options: Options | None = None,
    verbose: int = 0,
) -> PathCVResult:
    """Score every (bandwidth, fold) early-stopping path at once; see the module docstring.

    Parameters
    ----------
    X : tensor of shape (n, p)
        Training inputs.
    y : tensor of shape (n,)
        Training targets.
    kernels : list of Kernel
        One kernel per bandwidth of the grid.
    folds : list of array-like of int
        Validation indices of each fold; the other rows train.
    method : {"sign", "gradient", "coordinate"} or PathRule, default="sign"
        Update rule (KSGD, KGD, KCD, or a rule of :mod:`kernelflow.solvers.paths.rules` such
        as :class:`~kernelflow.solvers.paths.rules.HuberRule`).
    step_size : float or "auto", default=0.01
        Step size eta (0.01 is the paper's value). "auto" gives every bandwidth the automatic
        step of the single path on its full kernel matrix (``rule.learning_rate(K, y)``, e.g.
        0.01 rms(y) / s_max(K) for sign descent), returned in ``PathCVResult.step_size``.
    max_iter : int, default=10000
        Largest number of steps of one problem (t_max / eta).
    n_iter_no_change : int, default=100
        Patience: a problem stops after this many steps without improvement.
    validation_loss : {"squared", "absolute", "huber"}, default="squared"
        Loss scored on the validation rows (mean over them): squared error (the paper's),
        absolute error, or Huber's loss with epsilon 1.345 x 1.4826 MAD of the fold's
        validation targets. The compiled loops score squared errors only; other losses run
        on the tensor backend.
    chunk_size : int, default=64
        Steps between two evaluations of the stopping rule (does not change the result).
    low_rank : bool, default=True
        Multiply by a numerically low-rank kernel (wide bandwidths) through its factor
        K = L L^T, dropping eigenvalues whose sum is below 64 eps trace(K): the same iterates
        up to rounding, at 2 F n r instead of F n^2 flops per step.
    spectral_gradient : bool, default=True
        For ``method="gradient"``, obtain every iterate from one eigendecomposition per problem,
        alpha_k = U diag((1 - (1 - eta s)^k) / s) U^T y (exact; no step loop).
    backend : {"auto", "native", "torch"}, default="auto"
        ``"native"`` runs sign and coordinate descent problem by problem in compiled code
        (:mod:`._native`): O(n) per step plus O(n) per flipped sign or moved coefficient, no
        per-step library calls, threads over problems. ``"torch"`` advances all problems as one
        batched tensor computation (any device). ``"auto"`` is native for those two methods on
        CPU tensors when the extension is built. Both follow the same rules; their running
        sums round differently (sign descent updates K sign(r) by the flipped rows), so
        near-ties in the validation error can pick a different best step.
    options : Options, optional
        Memory budget for the stacked kernels.
    verbose : int, default=0
        > 0 shows progress: steps of every bandwidth (all its folds), at most
        ``len(kernels) * max_iter``, a bandwidth that stops early counting its remaining steps
        (see :func:`kernelflow.utils.progress.progress`).

    Returns
    -------
    result : PathCVResult

    Notes
    -----
    Cost per step O(S F n^2) flops for S active bandwidths (one batched GEMM) and O(S F n) for
    the update; memory O(S n^2 + chunk_size S F n).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(40, 1, dtype=torch.float64, generator=g) * 6
    >>> y = torch.sin(X[:, 0])
    >>> folds = [list(range(i, 40, 4)) for i in range(4)]
    >>> res = early_stopping_path_cv(X, y, [Gaussian(0.1), Gaussian(1.0)], folds)
    >>> res.best_index, bool(res.cv_mse[1] < res.cv_mse[0])
    (1, True)
    """
    rule = as_rule(method)
    native = _use_native(rule, backend, X)
    get_residual_loss(validation_loss, what="validation_loss")  # a ValueError naming the choices
    auto_step = _check_arguments(step_size, max_iter, n_iter_no_change, chunk_size)
    eta = 1.0 if auto_step else float(step_size)  # auto: each kernel is scaled by its step
    kernels = list(kernels)
    if not kernels or not all(isinstance(k, Kernel) for k in kernels):
        raise TypeError("kernels must be a non-empty list of Kernel objects.")
    n = X.shape[0]
    y = y.reshape(-1).to(X.dtype)
    if y.shape[0] != n:
        raise ValueError(f"X has {n} rows but y has {y.shape[0]}.")
    spectral = rule.supports("spectral") and spectral_gradient
    if not (native or spectral or rule.supports("batched")):
        raise ValueError(f"path cross-validation runs a rule on its batched, spectral or native "
                         f"backend, and {rule!r} declares none of them (with its options).")
    val = fold_masks(folds, n, X.device)
    train = (~val).to(X.dtype)  # (F, n)
    weights = val.to(X.dtype) / val.sum(1, keepdim=True).to(X.dtype)  # validation mean
    S, F = len(kernels), val.shape[0]
    chunk = int(min(max(chunk_size, 256), max_iter) if spectral else min(chunk_size, max_iter))
    group = _group_size(S, n, F, 0 if native else chunk + (n if spectral else 0), X.dtype,
                        options)
    if native:  # each thread of the compiled loops holds one problem's copy of the kernel
        group = max(1, group - torch.get_num_threads())
    val_idx, weights_val = _validation_rows(val, X.dtype)
    eps = None
    if validation_loss == "huber":  # one threshold per fold, from its validation targets
        eps = torch.tensor([huber_epsilon(y[val[f]]) for f in range(F)], dtype=X.dtype,
                           device=X.device)
    out = _Scores(S, F, eta, X)
    # one unit per step of one bandwidth (all its folds), at most S max_iter
    bar = progress(total=S * int(max_iter), desc=f"path CV ({rule.name}, {S} bandwidths)",
                   verbose=verbose, unit="step", upper_bound=True)
    for g0 in range(0, S, group):
        ids_all = torch.arange(g0, min(S, g0 + group), device=X.device)
        K_all = _kernel_stack([kernels[i] for i in ids_all.tolist()], X)  # (G, n, n)
        K_all = _steps_of_group(rule, K_all, y, ids_all, auto_step, eta, out)
        if native:
            _run_native(rule, K_all, y, train, weights, ids_all, eta, max_iter,
                        n_iter_no_change, validation_loss, eps, out, bar)
            continue
        parts = ([(ids_all, K_all, None)] if spectral or not low_rank
                 else _factor_groups(ids_all, K_all))
        for ids, P1, P2 in parts:
            _run_group(ids, P1, P2, spectral, y, train, val_idx, weights, weights_val, rule,
                       eta, chunk, max_iter, n_iter_no_change, out.fold_mse, out.best_iter,
                       out.n_iter, bar, validation_loss, eps)
    bar.close()
    return out.result(step_size, rule)


def _use_native(rule: PathRule, backend: str, X: torch.Tensor) -> bool:
    """Whether the compiled loops run ``rule`` (declared ``"native"``, available for X)."""
    if backend not in ("auto", "native", "torch"):
        raise ValueError(f"backend must be 'auto', 'native' or 'torch', got {backend!r}.")
    native = (rule.supports("native") and rule.native is not None
              and _native.available(rule.native, X))
    if backend == "native" and not native:
        raise ValueError("backend='native' needs a rule with a compiled loop ('sign' or "
                         "'coordinate'), float32/float64 CPU tensors and the compiled "
                         "extension kernelflow._paths.")
    return native and backend != "torch"


def _check_arguments(step_size, max_iter, n_iter_no_change, chunk_size) -> bool:
    """Check the step and the counts of path CV; True for the automatic step."""
    auto_step = isinstance(step_size, str) and step_size == "auto"
    if not auto_step and not (isinstance(step_size, (int, float, np.floating)) and
                              step_size > 0 and math.isfinite(step_size)):
        raise ValueError(f"step_size must be a positive finite number or 'auto', got "
                         f"{step_size!r}.")
    for name, val in (("max_iter", max_iter), ("n_iter_no_change", n_iter_no_change),
                      ("chunk_size", chunk_size)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}.")
    return auto_step


def _validation_rows(val: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation rows of each fold (F, n_val), padded with weight 0, and their weights."""
    F = val.shape[0]
    n_val = int(val.sum(1).max())
    val_idx = torch.zeros(F, n_val, dtype=torch.long, device=val.device)
    weights_val = torch.zeros(F, n_val, dtype=dtype, device=val.device)
    for f in range(F):
        rows = torch.nonzero(val[f]).reshape(-1)
        val_idx[f, : rows.numel()] = rows
        weights_val[f, : rows.numel()] = 1.0 / rows.numel()
    return val_idx, weights_val


class _Scores:
    """The per-problem results of path CV, filled group by group."""

    def __init__(self, S: int, F: int, eta: float, X: torch.Tensor):
        self.fold_mse = torch.full((S, F), math.inf, dtype=X.dtype, device=X.device)
        self.best_iter = torch.zeros(S, F, dtype=torch.long, device=X.device)
        self.n_iter = torch.zeros(S, F, dtype=torch.long, device=X.device)
        self.unstable = torch.zeros(S, dtype=torch.bool, device=X.device)
        self.steps = torch.full((S,), eta, dtype=torch.float64)
        self.dtype = X.dtype

    def result(self, step_size, rule: PathRule) -> PathCVResult:
        S = self.fold_mse.shape[0]
        cv_mse = self.fold_mse.mean(1)
        cv_mse = torch.where(torch.isfinite(cv_mse) & ~self.unstable, cv_mse,
                             torch.full_like(cv_mse, math.inf))
        if bool(self.unstable.any()):
            logger.warning("%d of %d bandwidths excluded: step_size=%g exceeds the bound of the "
                           "%s rule (2 / s_max(K) for gradient descent), and the path diverges "
                           "there.", int(self.unstable.sum()), S, step_size, rule.name)
        if not bool(torch.isfinite(cv_mse).any()):
            raise DivergenceError(
                f"Every bandwidth diverges with step_size={step_size}: lower it below "
                "2 / s_max(K).")
        stopping = self.best_iter.to(torch.float64).mean(1).floor().to(torch.long).clamp_min(1)
        best_index = int(torch.argmin(cv_mse)) if torch.isfinite(cv_mse).any() else 0
        return PathCVResult(cv_mse, self.fold_mse, self.best_iter, self.n_iter, stopping,
                            best_index, self.steps.to(self.dtype))


def _steps_of_group(rule: PathRule, K_all: torch.Tensor, y: torch.Tensor, ids_all: torch.Tensor,
                    auto_step: bool, eta: float, out: _Scores) -> torch.Tensor:
    """The automatic step of each kernel (folded into it) and the bound of the rule."""
    if auto_step:
        # alpha' = alpha / eta_g on eta_g K_g with step 1 is the path of step eta_g on K_g
        g_steps = [rule.learning_rate(K_all[j], y) for j in range(ids_all.numel())]
        out.steps[ids_all.cpu()] = torch.tensor(g_steps, dtype=torch.float64)
        K_all = K_all * torch.tensor(g_steps, dtype=K_all.dtype, device=K_all.device)[:, None,
                                                                                        None]
    if rule.bounded:
        # steps beyond the rule's bound diverge on the refit (Prop 5.3): they cannot win
        s_max = torch.linalg.eigvalsh(K_all)[:, -1].tolist()
        out.unstable[ids_all] = torch.tensor([eta > rule.max_step(s) for s in s_max],
                                             device=K_all.device)
    return K_all


def _run_native(rule: PathRule, K_all, y, train, weights, ids_all, eta, max_iter, patience,
                validation_loss, eps, out: _Scores, bar) -> None:
    """The problems of a group of bandwidths in the rule's compiled loop."""
    G, (F, n) = ids_all.numel(), train.shape
    assert rule.native is not None  # declared with the "native" backend
    # one compiled call for the group; with a bar, calls of a few bandwidths each
    # (enough problems for every thread) so that it can advance between them
    per_call = G if bar.disable else max(1, -(-4 * torch.get_num_threads() // F))
    for j0 in range(0, G, per_call):
        j1 = min(G, j0 + per_call)
        best, b_it, n_it = _native.run_problems(
            rule.native, K_all[j0:j1], y.reshape(1, n), train, weights,
            np.repeat(np.arange(j1 - j0), F), np.zeros((j1 - j0) * F, dtype=np.int64),
            np.tile(np.arange(F), j1 - j0), eta=eta, max_iter=max_iter,
            patience=patience, validation_loss=validation_loss,
            epsilon=None if eps is None else eps.cpu().numpy())
        sel = ids_all[j0:j1]
        out.fold_mse[sel] = torch.from_numpy(best).reshape(j1 - j0, F).to(out.fold_mse)
        out.best_iter[sel] = torch.from_numpy(b_it).reshape(j1 - j0, F).to(out.best_iter)
        out.n_iter[sel] = torch.from_numpy(n_it).reshape(j1 - j0, F).to(out.n_iter)
        bar.update((j1 - j0) * int(max_iter))
