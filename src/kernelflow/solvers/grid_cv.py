"""K-fold cross-validation of explicitly penalised kernel regression on (bandwidth x penalty) grids.

Every (bandwidth, fold) pair is one problem on the fold's training rows. Two solvers:

* :func:`krr_grid_cv` (kernel ridge regression): one eigendecomposition per (bandwidth, fold),
  batched over the folds of one bandwidth when they have equal training sizes, gives every
  penalty at once: alpha(lambda) = U diag(1 / (s + lambda)) U^T y (Allerbo, Eq. 2).
* :func:`penalized_grid_cv` (l1, l_inf, l2 penalties by proximal gradient): all penalties of all
  folds of one bandwidth advance together, so one step is one matrix product
  ``(folds * penalties, n) @ (n, n)`` per bandwidth (a GEMM, not one GEMV per problem), and the
  prox acts on every row at once. ``solver="fista"`` runs FISTA with restart to a KKT tolerance;
  ``solver="published"`` runs the reference implementation's capped ISTA (fixed step, cold
  start, stop when the step moves the coefficients by less than ``1e-5`` in Euclidean norm, or
  after ``max_iter`` steps), for reproduction.

Folds are boolean masks over the n rows: problem (bandwidth, fold) keeps its coefficients on all
n rows with zeros on the validation rows, so the problems of one bandwidth share one n x n kernel.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..utils._progress import progress
from ..utils._threads import threads_for as _threads_for
from . import _native
from .prox import PENALTIES, prox
from .proximal import fista

__all__ = ["GridCVResult", "fold_masks", "krr_grid_cv", "penalized_grid_cv"]

logger = logging.getLogger(__name__)

#: Solvers of :func:`penalized_grid_cv`.
SOLVERS = ("fista", "published")


@dataclass
class GridCVResult:
    """Outcome of a (bandwidth x penalty) grid search over S bandwidths, F folds, L penalties.

    Attributes
    ----------
    cv_mse : tensor of shape (S, L)
        Mean over folds of the validation mean squared error.
    best_index : tuple of int
        ``(bandwidth, penalty)`` index of the smallest ``cv_mse`` (first one in row-major order
        on ties).
    fold_mse : tensor of shape (S, F, L) or None
        Validation MSE of every problem (None where only the means were gathered).
    n_iter : tensor of shape (S, F, L) or None
        Iterations run by each problem (iterative solvers only).
    """

    cv_mse: torch.Tensor
    best_index: tuple[int, int]
    fold_mse: torch.Tensor | None = None
    n_iter: torch.Tensor | None = None


def fold_masks(folds, n: int, device=None) -> torch.Tensor:
    """Boolean validation masks (F, n) from a list of validation index arrays.

    Raises ``ValueError`` when there are fewer than 2 folds, or a fold is empty, leaves no
    training row or indexes outside [0, n).

    Examples
    --------
    >>> fold_masks([[0, 2], [1]], 3).tolist()
    [[True, False, True], [False, True, False]]
    """
    if len(folds) < 2:
        raise ValueError(f"Need at least 2 folds, got {len(folds)}.")
    masks = torch.zeros(len(folds), n, dtype=torch.bool, device=device)
    for f, idx in enumerate(folds):
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long, device=device).reshape(-1)
        if idx.numel() == 0 or idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"Fold {f} must hold validation indices in [0, {n}), got {idx}.")
        masks[f, idx] = True
        if masks[f].all():
            raise ValueError(f"Fold {f} leaves no training row.")
    return masks


def _penalties(alphas, like: torch.Tensor) -> torch.Tensor:
    lam = torch.as_tensor(np.asarray(alphas, dtype=float), dtype=like.dtype, device=like.device)
    if lam.ndim != 1 or lam.numel() == 0 or not bool(torch.isfinite(lam).all()) \
            or bool((lam < 0).any()):
        raise ValueError("alphas must be a non-empty 1-D list of non-negative finite penalties.")
    return lam


def _result(fold_mse: torch.Tensor, n_iter=None) -> GridCVResult:
    cv = fold_mse.mean(1)
    flat = int(torch.argmin(cv))
    return GridCVResult(cv, divmod(flat, cv.shape[1]), fold_mse, n_iter)


def krr_grid_cv(
    X: torch.Tensor,  # shape: (n, p)
    y: torch.Tensor,  # shape: (n,) or (n, t)
    kernels,  # list of S kernels
    alphas,  # L penalties
    folds,
    *,
    sample_weight: torch.Tensor | None = None,
    fit_intercept: bool = False,
    verbose: int = 0,
) -> GridCVResult:
    """K-fold MSE of kernel ridge regression on a (bandwidth x penalty) grid.

    Minimises sum_i w_i (y_i - f(x_i))^2 + lambda ||f||^2_H on each fold's training rows. For
    each bandwidth the folds' training kernels are decomposed together (one batched symmetric
    eigendecomposition when the folds have equal training sizes, one per fold otherwise), and
    every penalty is scored from it at once. A fold's score is the (weighted) mean squared
    validation error, averaged over targets; a grid point's score is the mean over folds.
    Cost O(S F (n^3 + L n^2)).

    Parameters
    ----------
    X : tensor of shape (n, p)
    y : tensor of shape (n,) or (n, t)
    kernels : list of S kernels
    alphas : array-like of shape (L,)
        Non-negative penalties (0: minimum-norm interpolation).
    folds : list of F validation index arrays
    sample_weight : tensor of shape (n,), optional
        Non-negative weights of the squared errors, in training and in validation.
    fit_intercept : bool, default=False
        Centre each fold's targets by their (weighted) training mean and add it back to the
        fold's validation predictions.
    verbose : int, default=0
        > 0 shows progress over the S F (bandwidth, fold) factorisations
        (:func:`kernelflow.utils.progress.progress`).

    Returns
    -------
    GridCVResult

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(0, 6, 30, dtype=torch.float64).reshape(-1, 1)
    >>> res = krr_grid_cv(X, torch.sin(X[:, 0]), [Gaussian(1.0)], [1e-3, 1e3],
    ...                   [list(range(i, 30, 3)) for i in range(3)])
    >>> res.best_index, tuple(res.fold_mse.shape)
    ((0, 0), (1, 3, 2))
    """
    n = X.shape[0]
    Y = y.reshape(n, -1).to(X.dtype)
    val = fold_masks(folds, n, X.device)
    lam = _penalties(alphas, X)
    F = val.shape[0]
    sw = None if sample_weight is None else sample_weight.reshape(-1).to(X.dtype)
    trains = [torch.nonzero(~m).reshape(-1) for m in val]
    vals = [torch.nonzero(m).reshape(-1) for m in val]
    sizes = {int(t.numel()) for t in trains}
    groups = [list(range(F))] if len(sizes) == 1 else [[f] for f in range(F)]
    out = torch.zeros(len(kernels), F, lam.numel(), dtype=X.dtype, device=X.device)
    bar = progress(total=len(kernels) * F, desc=f"KRR grid ({len(kernels)} bandwidths)",
                   verbose=verbose, unit="fit")
    with bar, _threads_for(F * n**3 / 4):
        # cost per bandwidth in units of n^3: one eigendecomposition (~4) and per fold and
        # penalty a (n / F)-sized solve, against F tridiagonal reductions of the training rows
        L, m = lam.numel(), (F - 1) / F
        blocks = 4 + L * (1 / (3 * F * F) + 1 / F) < 2 * F * m**3
        done = (sw is None and not fit_intercept and blocks
                and _krr_scores_blocks(X, Y, kernels, lam, vals, out))
        if done:
            bar.update(len(kernels) * F)
        if not done and not _krr_scores_tridiagonal(X, Y, kernels, lam, groups, trains, vals,
                                                    sw, fit_intercept, out, bar):
            bar.update(-bar.n)  # a route that gave up: the next one starts the count again
            _krr_scores(X, Y, kernels, lam, groups, trains, vals, sw, fit_intercept, out, bar)
    return _result(out)


def _krr_scores_blocks(X, Y, kernels, lam, vals, out) -> bool:
    """Every fold from one eigendecomposition of the whole kernel per bandwidth.

    With H = (K + lambda I)^-1 on all n rows, the validation residuals of the model fitted
    without the rows v are y_v - f_v = (H_vv)^-1 (H y)_v (the block form of the leave-one-out
    identity; exact for kernel ridge without intercept or weights, when the training rows of a
    fold are all the others). So a bandwidth costs one n x n eigendecomposition and, per
    penalty and fold, a |v| x |v| solve, instead of one decomposition per fold. Returns False
    when a penalty is too small for H to be computed safely; the per-fold path then runs (and
    writes every score).
    """
    n, S, L = X.shape[0], len(kernels), lam.numel()
    Ks = torch.stack([kern(X, X) for kern in kernels])  # (S, n, n)
    bound = float(Ks.abs().sum(-1).amax())  # >= every |eigenvalue|
    if not float(lam.min()) > 8 * n * torch.finfo(X.dtype).eps * max(bound, 1.0):
        return False
    s, U = torch.linalg.eigh(Ks)  # (S, n), (S, n, n)
    D = 1.0 / (s.clamp_min(0)[:, None, :] + lam[None, :, None])  # (S, L, n)
    t = Y.shape[1]
    C = D.transpose(1, 2)[..., None] * (U.transpose(1, 2) @ Y)[:, :, None, :]  # (S, n, L, t)
    HY = (U @ C.reshape(S, n, L * t)).reshape(S, n, L, t)  # H y for every penalty
    by_size: dict[int, list[int]] = {}
    for f, v in enumerate(vals):
        by_size.setdefault(int(v.numel()), []).append(f)
    big = max(by_size)
    step = max(1, int(4e6 // max(1, len(vals) * big * (big * n + L * big))))  # bandwidths/chunk
    for group in by_size.values():
        va = torch.stack([vals[f] for f in group])  # (G, v)
        for s0 in range(0, S, step):
            sl = slice(s0, min(S, s0 + step))
            Uv = U[sl][:, va]  # (s, G, v, n)
            # H_vv[l, a, b] = sum_k D[l, k] U[a, k] U[b, k] for every penalty at once: one
            # (L, n) x (n, v^2) product per (bandwidth, fold)
            v = Uv.shape[2]
            P = (Uv[:, :, :, None, :] * Uv[:, :, None, :, :]).reshape(*Uv.shape[:2], v * v, -1)
            Hvv = (D[sl][:, None] @ P.transpose(-1, -2)).reshape(*Uv.shape[:2], L, v, v)
            rhs = HY[sl][:, va].permute(0, 1, 3, 2, 4)  # (s, G, L, v, t)
            chol, info = torch.linalg.cholesky_ex(Hvv)
            if bool((info != 0).any()):
                return False
            r = torch.cholesky_solve(rhs, chol)
            out[sl, group] = r.square().mean(-1).mean(-1)
    return True


def _fold_targets(Y, tr, sw, fit_intercept):
    """Training targets of a batch of folds, ready for the weighted ridge solve.

    ``tr`` (G, m) holds the training rows of G folds. Returns (Ytr, mu, root): the targets
    (G, m, t) less their (weighted) mean ``mu`` (G, 1, t) per fold (zero without an intercept),
    times the square root of the weights, and that square root ``root`` (G, m), None without
    weights (the caller scales its kernel blocks by it).
    """
    Ytr = Y[tr]  # (G, m, t)
    if fit_intercept:
        if sw is None:
            mu = Ytr.mean(1, keepdim=True)
        else:
            wt = sw[tr][:, :, None]
            mu = (wt * Ytr).sum(1, keepdim=True) / wt.sum(1, keepdim=True).clamp_min(1e-300)
        Ytr = Ytr - mu
    else:
        mu = torch.zeros(tr.shape[0], 1, Y.shape[1], dtype=Y.dtype, device=Y.device)
    root = None
    if sw is not None:
        root = sw[tr].sqrt()  # (G, m)
        Ytr = Ytr * root[:, :, None]
    return Ytr, mu, root


def _krr_scores_tridiagonal(X, Y, kernels, lam, groups, trains, vals, sw, fit_intercept, out,
                            bar=None):
    """Every (bandwidth, fold) at once through a tridiagonal reduction K = Q T Q^T.

    The reduction (LAPACK ``sytrd``) costs a fraction of an eigendecomposition with vectors;
    Q^T is then applied to the targets and the validation cross-kernel only, and each penalty
    costs one tridiagonal LDL^T solve of T + lambda I (stable without pivoting, as it is
    positive definite), vectorised over all problems and penalties. Returns False (nothing
    written) off the CPU, for other float types, or when a penalty is too small for
    T + lambda I to be safely positive definite; the eigendecomposition path then runs.
    """
    if X.device.type != "cpu" or X.dtype not in (torch.float32, torch.float64):
        return False
    from scipy.linalg import lapack  # noqa: PLC0415

    sytrd, ormqr = ((lapack.dsytrd, lapack.dormqr) if X.dtype == torch.float64
                    else (lapack.ssytrd, lapack.sormqr))
    eps = torch.finfo(X.dtype).eps
    Ks = torch.stack([kern(X, X) for kern in kernels])  # (S, n, n)
    S, L, t = Ks.shape[0], lam.numel(), Y.shape[1]
    lam_np = lam.numpy()
    for group in groups:
        tr = torch.stack([trains[f] for f in group])  # (G, m)
        va = torch.stack([vals[f] for f in group])  # (G, v)
        G, m = tr.shape
        Ktr = Ks[:, tr[:, :, None], tr[:, None, :]]  # (S, G, m, m)
        W = Ks[:, va[:, :, None], tr[:, None, :]]  # (S, G, v, m)
        Ytr, mu, root = _fold_targets(Y, tr, sw, fit_intercept)
        if root is not None:
            Ktr = root[:, :, None] * Ktr * root[:, None, :]
            W = W * root[:, None, :]
        bound = float(Ktr.abs().sum(-1).amax()) if Ktr.numel() else 0.0  # >= every |eigenvalue|
        if m < 2 or not float(lam.min()) > 8 * m * eps * max(bound, 1.0):
            return False
        P = S * G
        Kp = Ktr.reshape(P, m, m).numpy()
        D = np.empty((P, m), dtype=Kp.dtype)
        E = np.empty((P, m - 1), dtype=Kp.dtype)
        # B = Q^T [y, W^T]; Q = diag(1, Q') with Q' the QR-form reflectors sytrd leaves below
        # the subdiagonal, applied by ormqr
        B = torch.cat([Ytr.expand(S, G, m, t).reshape(P, m, t),
                       W.reshape(P, -1, m).transpose(1, 2)], -1).numpy().copy()  # (P, m, t+v)
        lwork = 64 * B.shape[-1]
        for q in range(P):
            c, D[q], E[q], tau, info = sytrd(Kp[q], lower=1)
            if info != 0:
                return False
            B[q, 1:], _, info = ormqr("L", "T", c[1:, :-1], tau, B[q, 1:], lwork=lwork)
            if info != 0:
                return False
            if bar is not None:
                bar.update()
        B = torch.from_numpy(B)
        z = B[:, :, :t].numpy()  # (P, m, t)
        Gm = B[:, :, t:]  # (P, m, v)
        # LDL^T (Thomas) sweeps over all P problems and L penalties, index m leading
        diag = np.ascontiguousarray((D[:, None, :] + lam_np[None, :, None]).transpose(2, 0, 1))
        off = np.ascontiguousarray(E.T)[:, :, None]  # (m-1, P, 1)
        rhs = np.ascontiguousarray(z.transpose(1, 0, 2))[:, :, None, :]  # (m, P, 1, t)
        cp = np.empty((m - 1, P, L), dtype=Kp.dtype)
        dp = np.empty((m, P, L, t), dtype=Kp.dtype)
        den = diag[0]
        dp[0] = rhs[0] / den[..., None]
        for i in range(1, m):
            cp[i - 1] = off[i - 1] / den
            den = diag[i] - off[i - 1] * cp[i - 1]
            dp[i] = (rhs[i] - off[i - 1][..., None] * dp[i - 1]) / den[..., None]
        for i in range(m - 2, -1, -1):
            dp[i] -= cp[i][..., None] * dp[i + 1]
        x = torch.from_numpy(dp)  # (m, P, L, t)
        pred = torch.einsum("pmv,mplt->plvt", Gm, x).reshape(S, G, L, -1, t)
        err = (pred + mu[None, :, None] - Y[va][None, :, None]).square().mean(-1)  # (S,G,L,v)
        if sw is None:
            out[:, group] = err.mean(-1)
        else:
            w = sw[va][None, :, None, :]
            out[:, group] = (err * w).sum(-1) / w.sum(-1).clamp_min(1e-300)
    return True


def _krr_scores(X, Y, kernels, lam, groups, trains, vals, sw, fit_intercept, out, bar=None):
    for si, kern in enumerate(kernels):
        K = kern(X, X)
        for group in groups:
            tr = torch.stack([trains[f] for f in group])  # (G, m)
            Ktr = K[tr[:, :, None], tr[:, None, :]]  # (G, m, m)
            Ytr, mu, root = _fold_targets(Y, tr, sw, fit_intercept)
            if root is not None:
                Ktr = root[:, :, None] * Ktr * root[:, None, :]
            s, U = torch.linalg.eigh(Ktr)  # (G, m), (G, m, m)
            tiny = s.abs().amax(-1, keepdim=True).clamp_min(1.0) * s.shape[-1] \
                * torch.finfo(s.dtype).eps  # (G, 1)
            denom = s[:, None, :] + lam[None, :, None]  # (G, L, m)
            filt = torch.where(denom > tiny[:, :, None], 1.0 / denom.clamp_min(1e-300),
                               torch.zeros_like(denom))
            UtY = U.transpose(1, 2) @ Ytr  # (G, m, t)
            va = torch.stack([vals[f] for f in group])  # (G, v): equal sizes within a group
            W = K[va[:, :, None], tr[:, None, :]]  # (G, v, m)
            if sw is not None:
                W = W * root[:, None, :]
            WU = W @ U  # (G, v, m)
            pred = WU[:, None] @ (filt[..., None] * UtY[:, None])  # (G, L, v, t)
            err = (pred + mu[:, None] - Y[va][:, None]).square().mean(-1)  # (G, L, v)
            if sw is None:
                out[si, group] = err.mean(-1)
            else:
                w = sw[va][:, None, :]  # (G, 1, v)
                out[si, group] = (err * w).sum(-1) / w.sum(-1).clamp_min(1e-300)
            if bar is not None:
                bar.update(len(group))


class _GridOperator:
    """A batch of masked kernel operators: K_s a_b for rows b = (bandwidth s, fold f, penalty l)
    sharing one kernel per bandwidth.

    Rows live on all n rows with zeros on the fold's validation rows; the product is masked back
    to the training rows. With every row active it is one batched GEMM
    ``(S, F L, n) @ (S, n, n)``; otherwise the active rows are gathered by bandwidth first.

    It stands beside :class:`kernelflow.operators.LinearOperator` rather than under it because
    it is not one matrix: each row of the batch meets its own matrix (its bandwidth's kernel,
    masked by its fold), and which rows are present changes as rows stop (``rows``). The base
    class describes a single ``(n, m)`` matrix with tiled products, transposes and blocks, none
    of which apply to this per-row batch.
    """

    def __init__(self, K_all: torch.Tensor, train: torch.Tensor, L: int):
        self.K_all, self.L = K_all, L
        self.S, self.F = K_all.shape[0], train.shape[0]
        self.per = self.F * L
        self.row_train = train.repeat_interleave(L, 0)  # (F L, n)
        self._key: torch.Tensor | None = None  # the active rows the gathered kernels are for

    def _bmm(self, A: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        if A.device.type == "cpu" and not A.requires_grad:
            # NumPy's BLAS: about 1.4x torch's batched GEMM at these shapes on the CPUs measured
            # (its threads are limited by the caller, see _published_ista)
            return torch.from_numpy(np.matmul(A.numpy(), K.numpy()))
        return torch.bmm(A, K)

    def __call__(self, A: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        n = A.shape[-1]
        if rows.numel() == self.S * self.per:
            P = self._bmm(A.reshape(self.S, self.per, n), self.K_all).mul_(self.row_train)
            return P.reshape(A.shape)
        if self._key is None or self._key.numel() != rows.numel() or \
                not torch.equal(self._key, rows):
            sig = rows // self.per
            uniq, self.inv = torch.unique(sig, return_inverse=True)
            self.K = self.K_all[uniq]
            self.pos = rows % self.per
            self.mask = self.row_train[self.pos]
            self._key = rows.clone()
        Z = torch.zeros(self.K.shape[0], self.per, n, dtype=A.dtype, device=A.device)
        Z[self.inv, self.pos] = A
        return self._bmm(Z, self.K)[self.inv, self.pos].mul_(self.mask)


def _published_ista(matvec, Y, thresh, penalty, eta, m, max_iter):
    """Capped ISTA of the reference implementation, batched over rows; returns (A, n_iter).

    Row b steps alpha <- prox(alpha - eta (K alpha - y), thresh_b) from alpha = 0 and stops after
    the first step that moves it by less than 1e-5 (the first step is compared with the vector
    of ones, as in the reference), or after ``max_iter`` steps.
    """
    B, n = Y.shape
    A = torch.zeros_like(Y)
    n_iter = torch.full((B,), max_iter, dtype=torch.long, device=Y.device)
    # the l-infinity step after the first, compiled (one pass per row instead of a dozen tensor
    # operations over the batch; the same expression, the prox level's rounding aside)
    fused = (penalty == "linf" and Y.device.type == "cpu"
             and Y.dtype in (torch.float32, torch.float64) and _native.has_ista_linf_step())
    with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
        return _published_loop(matvec, A, Y, thresh, penalty, eta, m, max_iter, fused, n_iter)


def _published_loop(matvec, A, Y, thresh, penalty, eta, m, max_iter, fused, n_iter):
    B = Y.shape[0]
    rows = torch.arange(B, device=Y.device)
    Yr, tr, er, mr = Y, thresh, eta, m
    train = matvec.row_train[rows % matvec.per]
    old = train.clone()  # ones on the training rows, zeros on the validation rows
    first = True

    def host(Yr, tr, er):
        # the compiled step's targets, steps and thresholds, as arrays: made again only when
        # rows stop, not at every step
        def flat(t):
            return np.ascontiguousarray(t.to(Y.dtype).reshape(-1).numpy())

        return np.ascontiguousarray(Yr.numpy()), flat(er), flat(er * tr)

    args = host(Yr, tr, er) if fused else None
    for it in range(max_iter):
        Ar = A if rows.numel() == B else A[rows]
        if fused and not first:
            P = matvec(Ar, rows)
            moved = torch.from_numpy(_native.ista_linf_step(
                Ar.numpy(), np.ascontiguousarray(P.numpy()), *args))
            new = Ar  # updated in place
        else:
            G = matvec(Ar, rows) - Yr
            new = prox(penalty, Ar - er * G, er * tr)
        if first:  # the reference compares an (m, 1) with an (m,) array: an (m, m) difference
            moved = (new - old).square().sum(-1).mul(mr).sqrt()
            first = False
        elif not fused:
            moved = (new - Ar).square().sum(-1).sqrt()
        if rows.numel() == B:
            A = new
        else:
            A[rows] = new
        done = moved < 1e-5
        if bool(done.any()):
            n_iter[rows[done]] = it + 1
            keep = ~done
            rows = rows[keep]
            if rows.numel() == 0:
                break
            Yr, tr, er, mr = Yr[keep], tr[keep], er[keep], mr[keep]
            if fused:
                args = host(Yr, tr, er)
    return A, n_iter


def penalized_grid_cv(
    X: torch.Tensor,  # shape: (n, p)
    y: torch.Tensor,  # shape: (n,)
    kernels,  # list of S kernels
    alphas,  # L penalties (paper units)
    folds,
    *,
    penalty: str = "linf",
    solver: str = "fista",
    accelerated: bool = True,
    step_size: float | None = None,
    max_iter: int = 10_000,
    tol: float = 1e-6,
    verbose: int = 0,
) -> GridCVResult:
    """K-fold MSE of penalised kernel regression on a (bandwidth x penalty) grid, batched.

    Solves alpha = argmin 1/2 alpha^T K alpha - y^T alpha + lambda P(alpha) (P = ||.||_1,
    ||.||_inf or 1/2 ||.||_2^2) on every fold's training rows for every (bandwidth, penalty).
    All folds and penalties of one bandwidth advance together: one step costs one product
    ``(F L, n) @ (n, n)`` per bandwidth, and problems leave the batch as they finish.

    Parameters
    ----------
    X : tensor of shape (n, p)
    y : tensor of shape (n,)
    kernels : list of S kernels
    alphas : array-like of shape (L,)
        Penalties lambda in the objective's units (the reference implementation thresholds with
        eta * lambda).
    folds : list of F validation index arrays
    penalty : {"linf", "l1", "l2"}, default="linf"
    solver : {"fista", "published"}, default="fista"
        "fista": FISTA with adaptive restart (``accelerated=False``: ISTA) from zero to the KKT
        tolerance ``tol`` or ``max_iter`` iterations. "published": the reference
        implementation's capped ISTA (see the module docstring), with ``step_size`` 0.01 unless
        given.
    accelerated : bool, default=True
    step_size : float, optional
        None: 1 / s_max(K) of each bandwidth's full kernel for "fista" (an upper bound for every
        fold), 0.01 for "published".
    max_iter : int, default=10000
    tol : float, default=1e-6
    verbose : int, default=0
        Progress over bandwidths.

    Returns
    -------
    GridCVResult

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(0, 6, 30, dtype=torch.float64).reshape(-1, 1)
    >>> res = penalized_grid_cv(X, torch.sin(X[:, 0]), [Gaussian(1.0)], [1e-3, 30.0],
    ...                         [list(range(i, 30, 3)) for i in range(3)])
    >>> res.best_index
    (0, 0)
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")
    if step_size is not None and not (math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"step_size must be a positive finite number, got {step_size!r}.")
    n = X.shape[0]
    y = y.reshape(-1).to(X.dtype)
    if y.shape[0] != n:
        raise ValueError(f"y must have {n} entries, found {y.shape[0]}.")
    val = fold_masks(folds, n, X.device)
    lam = _penalties(alphas, X)
    F, L = val.shape[0], lam.numel()
    train = (~val).to(X.dtype)  # (F, n)
    weights = val.to(X.dtype) / val.sum(1, keepdim=True).to(X.dtype)  # (F, n)
    out = torch.zeros(len(kernels), F, L, dtype=X.dtype, device=X.device)
    iters = torch.zeros(len(kernels), F, L, dtype=torch.long, device=X.device)
    Y = (y * train).repeat_interleave(L, 0)  # (F L, n)
    lam_rows = lam.repeat(F)  # (F L,)
    m_rows = train.sum(1).repeat_interleave(L)  # (F L,) training sizes
    with _threads_for(F * L * n * n):
        _penalized_scores(X, y, kernels, penalty, solver, accelerated, step_size, max_iter, tol,
                          verbose, train, weights, Y, lam_rows, m_rows, out, iters)
    return _result(out, iters)


def _penalized_scores(X, y, kernels, penalty, solver, accelerated, step_size, max_iter, tol,
                      verbose, train, weights, Y, lam_rows, m_rows, out, iters):
    F, L = out.shape[1], out.shape[2]
    n = X.shape[0]
    if solver == "published":
        _published_scores(X, y, kernels, penalty, step_size, max_iter, train, weights, Y,
                          lam_rows, m_rows, out, iters, verbose=verbose)
        return
    # one bandwidth at a time keeps the batch at F L rows of n (memory O(F L n + n^2))
    for si in progress(range(len(kernels)), desc=f"K{penalty}R grid", verbose=verbose,
                       unit="bandwidth"):
        K = kernels[si](X, X)[None]  # (1, n, n)
        matvec = _GridOperator(K, train, L)
        if step_size is None:
            top = float(torch.linalg.eigvalsh(K[0])[-1])
            e = 1.0 / top if top > 0 else 1.0
        else:
            e = float(step_size)
        A, _, its, ok, _ = fista(matvec, Y, lam_rows, penalty, e, max_iter=int(max_iter),
                                 tol=tol, accelerated=accelerated)
        if not bool(ok.all()):
            logger.debug("K%sR grid: %d problems hit max_iter=%d at bandwidth %d",
                         penalty, int((~ok).sum()), max_iter, si)
        pred = A.reshape(F * L, n) @ K[0]  # K alpha on every row
        err = (pred - y).square().reshape(F, L, n)
        out[si] = (err * weights[:, None, :]).sum(-1)
        iters[si] = its.reshape(F, L)


#: Most (bandwidth, fold, penalty) rows of n that the published solver advances in one batch.
PUBLISHED_BATCH_ELEMENTS = 2_000_000


def _published_scores(X, y, kernels, penalty, step_size, max_iter, train, weights, Y, lam_rows,
                      m_rows, out, iters, verbose=0):
    """Capped ISTA on whole blocks of bandwidths at once: one batched GEMM per step."""
    S, F, L = out.shape
    n = X.shape[0]
    per = F * L
    block = max(1, PUBLISHED_BATCH_ELEMENTS // max(per * n, 1))
    eta0 = 0.01 if step_size is None else float(step_size)
    bar = progress(total=S, desc=f"K{penalty}R grid", verbose=verbose, unit="bandwidth")
    for s0 in range(0, S, block):
        ks = list(range(s0, min(S, s0 + block)))
        K_all = torch.stack([kernels[si](X, X) for si in ks])  # (b, n, n)
        b = len(ks)
        matvec = _GridOperator(K_all, train, L)
        eta = torch.full((b * per, 1), eta0, dtype=X.dtype, device=X.device)
        A, its = _published_ista(matvec, Y.repeat(b, 1), lam_rows.repeat(b)[:, None], penalty,
                                 eta, m_rows.repeat(b), int(max_iter))
        pred = torch.bmm(A.reshape(b, per, n), K_all)  # K alpha on every row
        err = (pred - y).square().reshape(b, F, L, n)
        out[s0:s0 + b] = (err * weights[None, :, None, :]).sum(-1)
        iters[s0:s0 + b] = its.reshape(b, F, L)
        bar.update(b)
    bar.close()
