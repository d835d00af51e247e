"""Nyström kernel ridge regression for many centres: CG with a low-rank eigen-preconditioner.

Solves the same normal equations as :func:`kernelflow.solvers.nystrom.nystrom_krr`,

    (K_nM^T D K_nM / W + lam K_MM) a = K_nM^T D (y - y_offset) / W,   lam = alpha / W,       (1)

without any M x M matrix. Falkon's preconditioner factorises K_MM and K_MM^2 / M + lam K_MM:
O(M^3) flops and O(M^2) memory. Here the preconditioner is built from s << M centres only
(EigenPro 3, Abedsoltan, Belkin, Pandit 2023; randomised Nyström preconditioning, Frangella,
Tropp, Udell 2023):

1. a uniform subsample S of s centres; the Nyström approximation of K_MM from its columns,
   K_MM ~ K_MS K_SS^-1 K_SM = V diag(sigma) V^T with V (M, k) orthonormal, k <= s (one
   Cholesky factor of K_SS, one triangular solve, one s x s eigendecomposition):
   O(M s^2 + s^3) flops, O(M s) memory;
2. with uniform centres, K_nM^T D K_nM / W ~ K_MM^2 / M (Falkon's assumption), so on the
   span of V the matrix of (1) is about diag(h), h = sigma^2 / M + lam sigma. Below the k-th
   eigenvalue the spectrum is flattened to the smallest kept value c = h_k, as EigenPro does:

       P = V diag(h) V^T + c (I - V V^T),   P^{-1} r = V (V^T r / h) + (r - V V^T r) / c.  (2)

(1) is solved by conjugate gradients preconditioned with (2). Each iteration is one streamed
pass K_nM^T D K_nM v over the rows (kernel values in the input's precision, products and sums
in float64; K_nM is kept in memory only when it takes at most half of the budget, as in
:func:`~kernelflow.solvers.nystrom.nystrom_krr`) plus one tiled product K_MM v (float64 tiles,
O(M^2 d) flops, no stored K_MM). With float32 values, K_MM gets a jitter at their precision in
(1) (:func:`~kernelflow.solvers.nystrom.values_jitter`): rounding there had made CG drift or
break down. Cost per iteration O(n M (d + 2t) + M^2 d + M k t). Data-parallel on p processes,
each passes over its own rows and computes the rows of K_MM v for its block of M / p centres
(one all-reduce of M t values assembles each product): O((n M (d + 2t) + M^2 d) / p + M k t)
per process; only the preconditioner (O(M s) memory, O(M s d + M s^2 + s^3) setup) is
repeated on every process.

Why conjugate gradients and not EigenPro's preconditioned SGD: the SGD step size is bounded by
the flattened top eigenvalue, so the error along the eigenvalue lam s_min(K_MM) contracts by a
factor (1 - lam s_min / c) per epoch and reaching the direct solution to 1e-6 takes a number of
epochs that grows as 1 / lam; CG on the same preconditioned system minimises the error in the
energy norm of (1) (the training prediction error plus the penalty) over the Krylov space, and
with the top of the spectrum flattened its iterations scale with the square root of what is
left. Both use the same preconditioner and the same passes; CG needs no step or batch size.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..collectives import all_reduce_sum, is_distributed, world_size
from ..collectives import rank as process_rank
from ..kernels import Kernel
from ..linalg import cholesky, conjugate_gradient
from ..operators import KernelOperator, Options, memory_budget
from ..sources import DataSource
from ..utils._progress import progress
from ..utils.checkpoint import Checkpoint
from ..utils.monitor import EarlyStopping
from .nystrom import (
    _CHANGE_WINDOW,
    NystromSolution,
    _cg_checkpoint,
    _cg_solution,
    _nystrom_run,
    _NystromRun,
    _require_targets,
    _resolve_tol,
    _restore_cg,
    _ValidationScore,
    cg_energy_change,
    default_max_rank,
    normal_product,
    nystrom_rhs,
    values_jitter,
    warn_breakdown,
)

__all__ = ["EigenPreconditioner", "eigen_preconditioner", "default_rank", "source_default_rank",
           "nystrom_eigen_cg"]

logger = logging.getLogger(__name__)

_F64 = torch.float64


def default_rank(n_centers: int, options: Options | None = None, n_rows: int | None = None,
                 n_features: int = 0, *, stored: bool = True,
                 dtype: torch.dtype = _F64) -> int:
    """Rank s of the preconditioner: min(M, 2000), or min(M, 3000) where the cost model prices
    the larger rank's setup below the passes it saves on ``n_rows`` rows per process
    (:func:`~kernelflow.solvers.nystrom.default_max_rank`: streamed float32 passes over
    9 features from about 1.0e5 rows at M = 2e4, stored ones from about 2.9e5), and 3 M s
    float64 values within a quarter of the budget.

    Examples
    --------
    >>> default_rank(300), default_rank(50_000, Options(memory_budget=2**34))
    (300, 2000)
    >>> default_rank(50_000, Options(memory_budget=2**34), 200_000, 9, stored=False)
    3000
    >>> default_rank(50_000, Options(memory_budget=2**30))
    223
    """
    by_budget = memory_budget(options) // (4 * 3 * 8 * max(int(n_centers), 1))
    cap = default_max_rank(n_rows, n_centers, n_features, stored=stored, dtype=dtype)
    return int(max(1, min(n_centers, cap, by_budget)))


def source_default_rank(source: DataSource, n_centers: int, options: Options | None,
                        dtype: torch.dtype, *, stored: bool) -> int:
    """:func:`default_rank` on this process's rows of ``source`` (its ``n_local`` rows for a
    shard) and features; the processes of a data-parallel run then agree on the smallest."""
    return default_rank(n_centers, options, int(getattr(source, "n_local", source.n_samples)),
                        source.n_features, stored=stored, dtype=dtype)


def _check_rank_fits(rank: int, n_centers: int, options: Options | None) -> None:
    """MemoryError when a rank-``rank`` preconditioner of ``n_centers`` centres (3 M s float64
    values) exceeds the memory budget (the smallest over the processes of a data-parallel run,
    so that all of them refuse together)."""
    need, budget = 3 * 8 * rank * n_centers, memory_budget(options)
    if is_distributed():
        budgets = torch.zeros(world_size(), dtype=torch.float64)
        budgets[process_rank()] = budget
        budget = int(all_reduce_sum(budgets).min())
    if need > budget:
        mib = 2 ** 20
        raise MemoryError(
            f"a rank-{rank} preconditioner of {n_centers} centres needs 3 M s float64 values "
            f"({need / mib:.3g} MiB), above the memory budget of {budget / mib:.3g} MiB. Use a "
            f"smaller rank (at most {budget // (24 * n_centers)} fits) or a larger budget "
            f"(options=Options(memory_budget=...)).")


def _agreed_rank(run: _NystromRun) -> int:
    """:func:`default_rank` on this process's rows (streamed unless all of K_nM is stored), the
    smallest over the processes of a data-parallel run (their rows and budgets may differ;
    they must build the same preconditioner and stop together)."""
    s = source_default_rank(run.source, run.M, run.options, run.dtype,
                            stored=isinstance(run.cache, list))
    if not is_distributed():
        return s
    ranks = torch.zeros(world_size(), dtype=torch.float64)
    ranks[process_rank()] = s
    return int(all_reduce_sum(ranks).min())


@dataclass
class EigenPreconditioner:
    """P of (2): ``V`` (M, k) orthonormal, ``h`` (k,) its eigenvalues on V, ``c`` below.

    ``sigma`` (k,) are the Nyström eigenvalues of K_MM (descending).
    """

    V: torch.Tensor
    h: torch.Tensor
    c: float
    sigma: torch.Tensor

    def apply_inverse(self, R: torch.Tensor) -> torch.Tensor:  # (M, t) -> (M, t): P^{-1} R
        Z = self.V.T @ R
        return self.V @ (Z / self.h.reshape(-1, 1) - Z / self.c) + R / self.c


def eigen_preconditioner(kernel: Kernel, centers: torch.Tensor, lam: float, rank: int, *,
                         options: Options | None = None,
                         generator: torch.Generator | None = None) -> EigenPreconditioner:
    """Build (2) from ``rank`` centres drawn uniformly. Cost O(M s d + M s^2 + s^3), memory
    about 3 M s float64 values; nothing M x M.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> C = torch.linspace(0, 1, 40, dtype=torch.float64).reshape(-1, 1)
    >>> P = eigen_preconditioner(Gaussian(0.5), C, 1e-3, 40)
    >>> K = Gaussian(0.5)(C)
    >>> H = K @ K / 40 + 1e-3 * K                 # (1) when K_nM^T K_nM / n = K_MM^2 / M
    >>> err = P.V @ torch.diag(P.sigma) @ P.V.T - K   # rank s = M: the exact K_MM
    >>> bool(err.abs().max() < 1e-8)
    True
    """
    if lam <= 0:
        raise ValueError(f"the preconditioner needs lam > 0, got {lam}.")
    C = centers.to(_F64)
    M = C.shape[0]
    s = int(min(max(1, rank), M))
    idx = torch.randperm(M, generator=generator)[:s] if s < M else torch.arange(M)
    K_MS = KernelOperator(kernel, C, C[idx], options=options).to_dense().to(_F64)  # (M, s)
    # K_MM ~ B B^T with B = K_MS L^-T, L L^T = K_SS + nu I (the shift nu, of the order of
    # the rounding of K_SS, lets a numerically singular K_SS be factorised).
    # One Cholesky, one triangular solve and one s x s eigendecomposition (an eigh of K_SS,
    # a thin QR and a second eigh took twice as long: M = 4000, s = 1000 and 2000, one
    # thread), then the vectors made orthonormal again (:func:`_orthonormal_eigenpairs`)
    K_SS = K_MS[idx]
    nu = torch.finfo(_F64).eps * s * float(K_SS.diagonal().max())
    L, _ = cholesky(K_SS + nu * torch.eye(s, dtype=_F64), warn=False)
    del K_SS
    B = torch.linalg.solve_triangular(L, K_MS.T, upper=False).T  # (M, s)
    del K_MS, L
    sig, Z = torch.linalg.eigh(B.T @ B)  # K_MM ~ V diag(sig) V^T, V = B Z sig^-1/2
    sig, Z = sig.flip(0), Z.flip(1)
    good = sig > sig[0] * torch.finfo(_F64).eps * M * 10
    sig, Z = sig[good], Z[:, good]
    V, sig = _orthonormal_eigenpairs(B @ (Z / sig.sqrt()), sig)
    del B
    good = sig > sig[0] * torch.finfo(_F64).eps * M * 10
    V, sig = V[:, good], sig[good]
    # trailing Nyström eigenpairs are the least accurate, yet keeping all of them (c = the
    # smallest h) took fewer iterations than EigenPro's q = s / 2 or s / 4 (n = 2000,
    # M = 300, s = 100: 300 passes to 1e-10 against over 400)
    h = sig * sig / M + lam * sig
    return EigenPreconditioner(V=V, h=h, c=float(h[-1]), sigma=sig)


def _orthonormal_eigenpairs(V: torch.Tensor, sig: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The eigenpairs of V diag(sig) V^T (descending) with orthonormal vectors, for a V
    (M, k) that is orthonormal only up to rounding: V = Q R (thin QR), then one k x k eigh of
    R diag(sig) R^T = W diag(sig') W^T gives V' = Q W. Cost O(M k^2).

    V = B Z sig^-1/2 loses orthogonality as sig spans many orders (max |V^T V - I| 2e-9 at
    M = s = 300 on 5-d data, sig from 188 down to 5.6e-9); P^{-1} of (2) assumes V^T V = I,
    and its error ||V^T V - I|| / c is then far above its values 1 / h (float64 eigen-CG
    there, lam = 1e-6: relative residual 8e-2 after 150 passes, 5e-3 with V orthonormal to
    5e-15; the residual of such a system, conditioned near 1 / eps64, stays noisy).
    """
    Q, R = torch.linalg.qr(V)
    sig2, W = torch.linalg.eigh((R * sig) @ R.T)
    sig2, W = sig2.flip(0), W.flip(1)
    return Q @ W, sig2


def nystrom_eigen_cg(
    source: DataSource,
    kernel: Kernel,
    centers: torch.Tensor,  # shape: (M, d)
    alpha: float,
    *,
    y_offset: torch.Tensor | None = None,  # shape: (t,)
    coef0: torch.Tensor | None = None,  # shape: (M, t)
    rank: int | None = None,
    max_iter: int = 100,
    tol: float | None = None,
    validation: DataSource | None = None,
    n_iter_no_change: int = 5,
    dtype: torch.dtype = _F64,
    options: Options | None = None,
    block_size: int | None = None,
    store_kernel: bool | None = None,
    callback=None,
    verbose: int = 0,
    random_state: int = 0,
    moments: tuple[float, torch.Tensor, int] | None = None,
    checkpoint: Checkpoint | None = None,
) -> NystromSolution:
    """Solve (1) by conjugate gradients with the rank-s eigen-preconditioner (2).

    Parameters
    ----------
    source, kernel, centers, alpha, y_offset, coef0, max_iter, validation, n_iter_no_change,
    dtype, options, block_size, store_kernel, callback, verbose, moments
        As in :func:`kernelflow.solvers.nystrom.nystrom_krr`.
    checkpoint : Checkpoint, optional
        Where the state of the run (CG's vectors and scalars, the stopping counters, the
        validation monitor and best coefficients) is written every ``checkpoint.interval``
        seconds; a run given a checkpoint holding a state continues from it and ends with the
        result of an uninterrupted run (the preconditioner, seeded by ``random_state``, is
        rebuilt identically). As in :func:`kernelflow.solvers.nystrom.nystrom_krr`.
    rank : int, optional
        Number s of centres the preconditioner is built from (capped at M; default
        :func:`default_rank`; in a data-parallel run the smallest over the processes, whose
        budgets may differ). A given rank whose 3 M s float64 values exceed the memory budget
        is refused with a MemoryError before any pass.
    tol : float, optional
        CG stops when the estimated relative error in the energy norm of (1) (Hestenes-Stiefel:
        the energies of the last four steps over the energy of the iterate) stays below ``tol``
        for two iterations, or the relative residual of (1) falls below ``tol^2``. Default
        ``DEFAULT_TOL[dtype]`` (1e-3), or ``options.cg_tol``.
    random_state : int, default=0
        Seeds the subsample of centres (the same on every process of a data-parallel run).

    Returns
    -------
    NystromSolution
        ``solver`` is ``"eigen_cg"``.

    Notes
    -----
    Setup O(M s d + M s^2 + s^3) flops and O(M s) memory; each iteration
    O(n M (d + 2t) + M^2 d), split over the processes of a data-parallel run. Memory: 3 M s
    floats, a few M x t vectors, one row block (or the stored K_nM when it fits in half of the
    budget); no M x M matrix. Float32 rows: kernel values in float32, products in float64
    (the K_nM products cost about 1.2x (stored) to 1.3x (streamed) per pass of float32 ones), and
    K_MM + j I in (1) with j = 0.03 eps32 ||K_MM||
    (:func:`~kernelflow.solvers.nystrom.values_jitter`).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> from kernelflow.solvers.nystrom import nystrom_direct
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(400, 3, dtype=torch.float64, generator=g)
    >>> y = torch.sin(X.sum(1))
    >>> sol = nystrom_eigen_cg(ArraySource(X, y), Gaussian(1.0), X[:60], 1.0, rank=30,
    ...                        tol=1e-9, max_iter=300)
    >>> ref = nystrom_direct(ArraySource(X, y), Gaussian(1.0), X[:60], 1.0)
    >>> K = Gaussian(1.0)(X, X[:60])
    >>> sol.converged, bool(torch.allclose(K @ sol.coef, K @ ref, rtol=0, atol=1e-6))
    (True, True)
    """
    _require_targets(source)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}.")
    if rank is not None and int(rank) < 1:
        raise ValueError(f"rank must be >= 1, got {rank}.")
    if rank is not None:
        _check_rank_fits(int(min(rank, centers.shape[0])), int(centers.shape[0]), options)
    run = _nystrom_run(source, kernel, centers, alpha, moments=moments, validation=validation,
                       store_kernel=store_kernel, dtype=dtype, options=options,
                       block_size=block_size, y_offset=y_offset,
                       tol=_resolve_tol(tol, dtype, options, 1e-3), max_iter=max_iter,
                       verbose=verbose)
    M, t = run.M, run.t
    s = _agreed_rank(run) if rank is None else int(min(rank, M))
    gen = torch.Generator().manual_seed(int(random_state))
    P = eigen_preconditioner(kernel, run.C, run.lam, s, options=options, generator=gen)
    logger.debug("eigen-CG preconditioner: rank %d of %d, eigenvalues %.3g .. %.3g",
                 P.V.shape[1], M, float(P.sigma[0]), float(P.sigma[-1]))
    jitter = values_jitter(run.dtype, float(P.sigma[0]))  # from the top Nyström eigenvalue
    if jitter:
        P = EigenPreconditioner(V=P.V, h=P.h + run.lam * jitter, c=P.c + run.lam * jitter,
                                sigma=P.sigma)
    b, matvec = _eigen_cg_system(run, jitter)
    x0 = None if coef0 is None else coef0.to(_F64).reshape(M, t)
    watch = _EigenCGMonitor(run, b, matvec, x0, n_iter_no_change=n_iter_no_change,
                            callback=callback, checkpoint=checkpoint)
    with watch.bar:
        res = conjugate_gradient(matvec, b, x0=x0, max_iter=max_iter, tol=run.tol * run.tol,
                                 preconditioner=P.apply_inverse, callback=watch,
                                 state=watch.cg_state)
    reason = "residual" if res.converged else watch.state["reason"]
    coef = res.x.reshape(M, t)
    if res.breakdown or res.residual_norms[-1] > 10 * res.residual_norms[0]:
        # rounding broke CG: it met a direction without positive curvature, or its residual
        # grew tenfold past the start; return the iterate of least residual
        warn_breakdown("eigen-CG", res, watch.state["least"][0],
                       "use float64 rows (dtype='float64'), a larger alpha or a smaller rank")
        coef = watch.state["least"][1].reshape(M, t)
        reason = "breakdown"
    return _cg_solution(run, res, coef, watch.state["best_coef"], watch.monitor,
                        reason, stopped_early=reason == "validation", solver="eigen_cg",
                        log=logger)


def _center_block(n_centers: int, n_procs: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of K_MM computed by process ``rank`` of ``n_procs``: contiguous
    blocks whose sizes differ by at most one (the first M mod p are one row longer)."""
    if n_centers < 0 or n_procs < 1 or not 0 <= rank < n_procs:
        raise ValueError(f"need n_centers >= 0 and 0 <= rank < n_procs, got n_centers="
                         f"{n_centers}, n_procs={n_procs}, rank={rank}.")
    size, extra = divmod(n_centers, n_procs)
    start = rank * size + min(rank, extra)
    return start, start + size + (rank < extra)


def _kmm_product(run: _NystromRun) -> Callable[[torch.Tensor], torch.Tensor]:
    """a -> K_MM a (float64) by tiles, nothing stored. In a data-parallel run each process
    computes the rows of its block of centres (:func:`_center_block`) and one all-reduce of
    the zero-padded block assembles the vector (adding zeros is exact: every process holds the
    same vector), so the O(M^2 d) flops per iteration are split, not repeated.

    The tiles are float64 whatever the rows' precision: float32 values of K_MM are indefinite
    by about eps32 ||K_MM||, so lam K_MM v had negative curvature of order lam eps32 ||K_MM||,
    far above the preconditioner's smallest values (down to 1e-16 ||(1)|| with s = M and
    lam = 1e-6), and CG broke down on it (M^2 d flops, small against the n M d of a pass)."""
    C = run.C
    opts = (run.options or Options()).replace(accumulate_float64=True)
    if not is_distributed():
        K_MM = KernelOperator(run.kernel, C, options=opts)
        return lambda a: K_MM.matmul(a).to(_F64)
    r0, r1 = _center_block(run.M, world_size(), process_rank())
    # same columns as K(C, C): the stationary kernels' centring shift (from the columns) and
    # so every entry are those of the full product
    K_block = KernelOperator(run.kernel, C[r0:r1], C, options=opts) if r1 > r0 else None

    def product(a):  # (M, t) float64 -> (M, t)
        out = torch.zeros(run.M, a.shape[1], dtype=_F64)
        if K_block is not None:
            out[r0:r1] = K_block.matmul(a).to(_F64)
        return all_reduce_sum(out)

    return product


def _eigen_cg_system(run: _NystromRun, jitter: float = 0.0
                     ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """b = K_nM^T D (y - y_offset) / W (one pass) and the matrix of (1) as a product: one
    streamed pass and one tiled K_MM product (float64 sums), no stored M x M matrix;
    ``jitter`` j adds lam j a (:func:`~kernelflow.solvers.nystrom.values_jitter`)."""
    K_MM = _kmm_product(run)
    gram = normal_product(run)  # float64 products of float32 values, one call per pass

    b = nystrom_rhs(run.source, run.kernel, run.C, y_offset=run.y_offset, dtype=run.dtype,
                    options=run.options, block_size=run.block_size, cache=run.cache) / run.W
    lam = run.lam

    def matvec(a):  # (M, t) float64 -> (M, t): the matrix of (1) times a
        out = gram(a) / run.W + lam * K_MM(a)
        return out + (lam * jitter) * a if jitter else out

    return b, matvec


class _EigenCGMonitor(_ValidationScore):
    """The callback of an eigen-CG run: the change rule (:func:`cg_energy_change`), the bar,
    validation early stopping (the best coefficients kept), the user's callback and the
    checkpoint (written as a CG checkpoint: ``cg_state`` CG's own vectors, ``state`` the
    counters; ``early`` and ``res`` are kept only for that layout)."""

    def __init__(self, run: _NystromRun, b: torch.Tensor, matvec, x0: torch.Tensor | None, *,
                 n_iter_no_change: int, callback, checkpoint: Checkpoint | None = None):
        self.run, self.b, self.callback, self.checkpoint = run, b, callback, checkpoint
        self.monitor = EarlyStopping(n_iter_no_change=n_iter_no_change)
        self.state: dict[str, Any] = {
            "best_coef": None, "prev": x0, "R_prev": b if x0 is None else b - matvec(x0),
            "small": 0, "reason": "max_iter", "steps": deque(maxlen=_CHANGE_WINDOW),
            "early": False, "res": [],
            "least": (1.0, torch.zeros(run.M, run.t, dtype=_F64))}
        if x0 is not None:  # the start's relative residual, as CG measures it
            start = (torch.linalg.vector_norm(self.state["R_prev"], dim=0)
                     / torch.linalg.vector_norm(b, dim=0).clamp_min(torch.finfo(b.dtype).tiny))
            self.state["least"] = (float(start.max()), x0)
        self.cg_state: dict[str, Any] = {}
        saved = checkpoint.load(b.device) if checkpoint is not None else None
        if saved is not None:
            _restore_cg(saved, self.cg_state, self.state, self.monitor)
        elif run.validation is not None:
            self.score(0, torch.zeros(run.M, run.t, dtype=_F64) if x0 is None else x0)
        self.bar = progress(total=run.max_iter - int(self.cg_state.get("k", 0)),
                            desc="Nystrom eigen-CG", verbose=run.verbose, unit="pass",
                            upper_bound=True)

    def __call__(self, k: int, X: torch.Tensor, R: torch.Tensor) -> bool:
        state = self.state
        res = float(self.cg_state["norms"][-1])
        if res < state["least"][0]:
            state["least"] = (res, X.clone())
        change = cg_energy_change(state, X, R, self.b, self.run.tol)
        self.bar.set_postfix(change=f"{change:.1e}", refresh=False)
        self.bar.update()
        stop = False
        if state["small"] >= 2:
            state["reason"], stop = "change", True
        if self.run.validation is not None and self.score(k, X.clone()):
            state["reason"], stop = "validation", True
        if self.callback is not None and self.callback(k, X.clone()):
            state["reason"], stop = "callback", True
        if (self.checkpoint is not None and not stop
                and self.cg_state["norms"][-1] > self.run.tol * self.run.tol):
            # a finished run never resumes (CG stops at this relative residual)
            self.checkpoint.maybe_save(
                lambda: _cg_checkpoint(self.cg_state, state, self.monitor))
        return stop

