"""Nyström kernel ridge regression by preconditioned conjugate gradients (Falkon-class).

With M centres C, the Nyström estimator f(x) = K(x, C) a solves the normal equations

    H a = b,   H = K_nM^T D K_nM + alpha K_MM,   b = K_nM^T D y,                          (1)

with D = diag(sample weights) (identity by default) and ``alpha`` on scikit-learn's scale: with
all training points as centres, (1) reduces to exact kernel ridge regression (K + alpha I) a = y.

Following Falkon (Rudi, Carratino, Rosasco 2017, eq. 6-9; Meanti et al. 2020), (1) is divided by
the total weight W and solved by conjugate gradients on the split-preconditioned system
B^T (H / W) B beta = B^T b / W, a = B beta, with B = T^{-1} A^{-1},

    K_MM = T^T T,   T T^T / M + lam I = A^T A,   lam = alpha / W,                          (2)

so that B B^T = (K_MM^2 / M + lam K_MM)^{-1}: exact when K_nM^T D K_nM / W equals K_MM^2 / M
(uniform centres in expectation; all training points as centres exactly), hence a handful of
iterations. Here T = L^T and A = R^T with L, R the lower Cholesky factors of the two matrices.

Precision: kernel blocks may be float32 (``dtype``) while K_MM, both factors, the CG vectors and
all sums over rows are float64, which removes the accuracy stall that float32 sums cause. CG's
products of float32 kernel values run in float64 (:func:`normal_product`), and K_MM gets the
values' jitter in (1) and in B (:func:`values_jitter`): with float32 products and no jitter the
iterate drifted away from the solution without a warning. The float32 kernel values themselves
still limit accuracy when K_MM is ill-conditioned (nearly collinear features, tiny alpha): use
float64 there.

Streaming: the training rows are read only through a :class:`kernelflow.sources.DataSource`, one
row block at a time; each block's K(X_b, C) is a :class:`kernelflow.operators.KernelOperator`
whose tiles respect the memory budget, so K_nM never exists unless it takes at most half of the
budget (then it is computed once and stored, as Falkon does). Every sum over rows goes through
:func:`kernelflow.collectives.all_reduce_sum`, so a process holding a shard of the rows runs
the same code data-parallel. Cost per iteration O(n M (d + 2t)); setup O(M^3 + n t).

:func:`nystrom_krr` runs in stages: :func:`_nystrom_run` resolves the inputs (the moments of the
rows, unless given, and the stored kernel blocks; :mod:`~kernelflow.solvers.nystrom_eigen_cg` and
:mod:`~kernelflow.solvers.nystrom_robust` start with it too), then either :func:`_solve_direct`
(the Gram pass and dense solve, its residual check and fallbacks; the dense algebra is in
:mod:`kernelflow.solvers._nystrom_direct`) or CG on :func:`_cg_system`, watched by
:class:`_CGMonitor` (stopping rules, progress, validation, checkpoints), ending in
:func:`_cg_solution`.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..collectives import all_reduce_sum
from ..kernels import Kernel
from ..linalg import SolveResult, cholesky, conjugate_gradient, power_iteration
from ..operators import DenseOperator, KernelOperator, Options, memory_budget
from ..sources import DataSource
from ..utils._finite import DivergenceError
from ..utils._progress import progress, steps_to_reach
from ..utils._warnings import SolverConvergenceWarning, warn_caller
from ..utils.checkpoint import Checkpoint, monitor_state, restore_monitor
from ..utils.monitor import EarlyStopping
from ._nystrom_direct import (
    _direct_solve,
    _kmm_eigh,
    _squared_gram_error,
    _Whitening,
    _whitening,
)

__all__ = [
    "NystromPreconditioner",
    "NystromSolution",
    "nystrom_preconditioner",
    "nystrom_kernel_cache",
    "source_moments",
    "nystrom_rhs",
    "nystrom_normal_matvec",
    "normal_product",
    "normal_product_blocks",
    "values_jitter",
    "nystrom_predict",
    "nystrom_validation_mse",
    "nystrom_direct",
    "nystrom_gram",
    "choose_solver",
    "kernel_fits",
    "solver_costs",
    "default_max_rank",
    "centre_matrices_fit",
    "nystrom_krr",
    "block_rows",
]

logger = logging.getLogger(__name__)

_F64 = torch.float64
_F64_SUMS = Options(accumulate_float64=True)  # products in the block dtype, float64 sums


def block_rows(n_features: int, n_centers: int, dtype: torch.dtype,
               options: Options | None = None, block_size: int | None = None) -> int:
    """Rows per source block: ``block_size`` if given, else at most 65536 within 1/16 of budget."""
    if block_size is not None:
        return int(block_size)
    item = torch.empty((), dtype=dtype).element_size()
    per_row = item * (n_features + 4)
    return int(max(256, min(65536, memory_budget(options) // (16 * per_row))))


# ---- preconditioner ----------------------------------------------------------------------------
@dataclass
class NystromPreconditioner:
    """Falkon's preconditioner B = T^{-1} A^{-1} from the lower factors L = T^T and R = A^T (eq. 2).

    Attributes
    ----------
    L : tensor (M, M), float64
        Lower Cholesky factor of K_MM (+ ``jitter`` I).
    R : tensor (M, M), float64
        Lower Cholesky factor of L^T L / M + lam I.
    lam : float
        alpha / W.
    jitter : float
        Diagonal added to K_MM to factorise it (0 when none was needed).
    values_jitter : float
        The part of ``jitter`` that belongs to the system too: (1) is solved with
        K_MM + values_jitter I (:func:`values_jitter`; 0 with float64 kernel values).
    """

    L: torch.Tensor
    R: torch.Tensor
    lam: float
    jitter: float = 0.0
    values_jitter: float = 0.0

    def apply(self, beta: torch.Tensor) -> torch.Tensor:  # (M, t) -> (M, t): B beta
        v = torch.linalg.solve_triangular(self.R.T, beta, upper=True)
        return torch.linalg.solve_triangular(self.L.T, v, upper=True)

    def apply_t(self, u: torch.Tensor) -> torch.Tensor:  # (M, t) -> (M, t): B^T u
        v = torch.linalg.solve_triangular(self.L, u, upper=False)
        return torch.linalg.solve_triangular(self.R, v, upper=False)

    def inverse(self, a: torch.Tensor) -> torch.Tensor:  # (M, t) -> (M, t): B^{-1} a = A T a
        return self.R.T @ (self.L.T @ a)

    def system(self, beta: torch.Tensor, gram_v: torch.Tensor,
               u: torch.Tensor | None = None) -> torch.Tensor:
        """B^T (H / W) B beta from gram_v = K_nM^T D K_nM u / W, u = B beta (one streamed product).

        K_MM + values_jitter I = L L^T - (jitter - values_jitter) I, so the penalty term is
        lam (R^{-T} beta - (jitter - values_jitter) L^{-1} u): ``u`` is needed when the two
        differ.
        """
        shift = self.jitter - self.values_jitter
        if shift:
            if u is None:
                u = self.apply(beta)
            gram_v = gram_v - (self.lam * shift) * u
        v = torch.linalg.solve_triangular(self.L, gram_v, upper=False)
        v = v + self.lam * torch.linalg.solve_triangular(self.R.T, beta, upper=True)
        return torch.linalg.solve_triangular(self.R, v, upper=False)


def _factor(build) -> tuple[torch.Tensor, float]:
    """Lower Cholesky factor of ``build()``, in place (one M x M buffer); jitter if needed."""
    A = build()
    info = torch.empty((), dtype=torch.int32)
    torch.linalg.cholesky_ex(A, out=(A, info))
    if int(info) == 0:
        return A.tril_(), 0.0
    del A
    return cholesky(build(), warn=False)


#: Floor tau on the smallest eigenvalue of the preconditioner's inverse, relative to
#: mean(diag K_MM)^2, by the precision of the kernel products: the jitter j added to K_MM is the
#: smallest with j^2 / M + lam j >= tau mean(diag K_MM)^2 (see :func:`nystrom_preconditioner`).
#: Float32 once had 1e-9; the float64 value halves its CG passes at lam = 1e-6
#: (``docs/performance/nystrom.md``).
PRECONDITIONER_EPS = {torch.float64: 1e-12, torch.float32: 1e-12}


def preconditioner_jitter(lam: float, n_centers: int, scale: float,
                          dtype: torch.dtype = _F64) -> float:
    """Jitter j with j^2 / M + lam j = tau scale^2: bounds ||B||^2 by 1 / (tau scale^2).

    Negligible when lam is not tiny (then the preconditioner stays exact with all points as
    centres); of order sqrt(tau M) scale for tiny lam.

    Examples
    --------
    >>> j = preconditioner_jitter(5e-11, 500, 1.0)
    >>> round(j ** 2 / 500 + 5e-11 * j, 15)
    1e-12
    """
    tau = PRECONDITIONER_EPS.get(dtype, PRECONDITIONER_EPS[torch.float32]) * scale * scale
    M = float(n_centers)
    return 2.0 * tau / (lam + math.sqrt(lam * lam + 4.0 * tau / M))


def _lower_gram(L: torch.Tensor, block: int = 512) -> torch.Tensor:
    """L^T L for a lower-triangular L, skipping its zero upper triangle (about M^3/3 flops)."""
    M = L.shape[0]
    S = torch.zeros(M, M, dtype=L.dtype, device=L.device)
    for r0 in range(0, M, block):
        r1 = min(r0 + block, M)
        Lb = L[r0:r1, :r1]
        S[:r1, :r1].addmm_(Lb.T, Lb)
    return S


def nystrom_preconditioner(kernel: Kernel, centers: torch.Tensor, lam: float, *,
                           options: Options | None = None, jitter: float | None = None,
                           dtype: torch.dtype = _F64,
                           values_dtype: torch.dtype | None = None) -> NystromPreconditioner:
    """Build the preconditioner (2) in float64. Cost O(M^2 d + M^3), memory 3 M^2 floats.

    ``jitter`` (default :func:`preconditioner_jitter`, ``dtype`` the precision of the kernel
    products) is added to K_MM
    before factorising it. It changes only B, not the system (1): with nearly collinear centres
    and a tiny penalty, B built from the exact factor has a norm of order lam^(-1/2), and the
    rounding errors of every product K_nM (B beta) then stall CG far from the solution (test R^2
    0.89 instead of 0.99 with 500 centres, alpha = 1e-6). The jitter bounds ||B||; the directions
    it leaves unpreconditioned are those whose functions are nearly zero on the data.

    ``values_dtype`` float32 (the precision of the system's kernel values) adds
    :func:`values_jitter` to K_MM in the factor and in the system (``values_jitter`` of the
    result), on top of ``jitter``.

    Deterministic in (kernel, centres, lam), so every process of a data-parallel run builds the
    same one.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> C = torch.linspace(0, 1, 5, dtype=torch.float64).reshape(-1, 1)
    >>> P = nystrom_preconditioner(Gaussian(0.5), C, 1e-3, jitter=0.0)
    >>> K = Gaussian(0.5)(C)
    >>> Pinv = K @ K / 5 + 1e-3 * K              # B B^T = Pinv^{-1}
    >>> B = P.apply(torch.eye(5, dtype=torch.float64))
    >>> round(float((B @ B.T @ Pinv - torch.eye(5, dtype=torch.float64)).abs().max()), 6)
    0.0
    """
    if lam <= 0:
        raise ValueError(f"the preconditioner needs lam > 0, got {lam}.")
    C = centers.to(_F64)
    M = C.shape[0]
    extra = {"j": 0.0, "v": 0.0}

    def kmm():
        # K(C, C) as a general block: one M x M buffer (the symmetrised form needs three), and
        # the Cholesky factorisation reads only its lower triangle.
        K = KernelOperator(kernel, C, C, options=options).to_dense()
        d = K.diagonal()
        extra["j"] = (preconditioner_jitter(lam, M, float(d.abs().mean()), dtype)
                      if jitter is None else float(jitter))
        if values_dtype is not None and values_dtype != _F64:
            top = power_iteration(lambda v: K @ v, M, dtype=K.dtype, device=K.device,
                                  n_iter=30, tol=0.0)
            extra["v"] = values_jitter(values_dtype, top)
            extra["j"] += extra["v"]
        d.add_(extra["j"])
        return K

    L, more = _factor(kmm)
    jitter = extra["j"] + more
    if more:  # only B changes, not (1)
        logger.debug("K_MM needed jitter %.3g", jitter)

    def shifted():
        S = _lower_gram(L)
        S /= M
        S.diagonal().add_(lam)
        return S

    R, _ = _factor(shifted)
    return NystromPreconditioner(L=L, R=R, lam=float(lam), jitter=float(jitter),
                                 values_jitter=float(extra["v"]))


#: Jitter added to K_MM with float32 kernel values, in units of eps(dtype) ||K_MM||
#: (:func:`values_jitter`)
VALUES_JITTER = 0.03


def values_jitter(dtype: torch.dtype, top_eigenvalue: float) -> float:
    """Jitter j added to K_MM in the penalty of (1) when the kernel values are ``dtype``
    (float32): ``VALUES_JITTER`` eps(dtype) times K_MM's largest eigenvalue, about the
    precision of those values; 0.0 for float64.

    Float32 values of K_nM carry errors of about eps32 per entry that K_MM's directions of
    eigenvalue below eps32 ||K_MM|| do not have: the penalty lam a^T K_MM a does not restrain
    them, and the exact solution of (1) with float32 values fitted the noise through them
    (5-d data, n = 1000, M = 300, lam = 1e-6: test RMSE 0.84 against 0.446 with float64
    values). Solving with K_MM + j I changes (1) only in those directions; j biases the rest
    (``VALUES_JITTER`` 0.01 / 0.03 / 0.1 / 1 gave test RMSE 0.475 / 0.453 / 0.461 / 0.526 there
    with eigen-CG, and 0.2550 / 0.2556 / 0.2572 / 0.2662 on the 9-d data of the many-centres
    benchmark, n = 1e4, M = s = 4000, direct 0.2545, with 150 / 61 / 58 / 53 passes).

    Examples
    --------
    >>> values_jitter(torch.float64, 100.0), round(values_jitter(torch.float32, 100.0), 9)
    (0.0, 3.58e-07)
    """
    if dtype == _F64:
        return 0.0
    return VALUES_JITTER * float(torch.finfo(dtype).eps) * float(top_eigenvalue)


# ---- streamed passes over the data (the only code that touches the rows) ----------------------
def source_moments(source: DataSource, *, block_size: int | None = None
                   ) -> tuple[float, torch.Tensor, int]:
    """Total weight W, weighted target sum sum_i w_i y_i (t,) and row count, all-reduced."""
    stats = torch.zeros(source.n_outputs + 2, dtype=_F64)
    for b in source.iter_blocks(block_size or 65536, dtype=_F64):
        w = b.sample_weight
        stats[0] += b.X.shape[0] if w is None else w.sum()
        if b.y is not None:
            stats[1:-1] += b.y.sum(0) if w is None else w @ b.y
        stats[-1] += b.X.shape[0]
    stats = all_reduce_sum(stats)
    return float(stats[0]), stats[1:-1], int(stats[-1])


def _blocks(source, dtype, options, rows):
    device = None if options is None else options.device
    return source.iter_blocks(rows, dtype=dtype, device=device)


def _rows_progress(source, desc: str, verbose: int):
    """A bar over the rows of one pass (a shard's own rows), advanced with ``update(rows)``."""
    total = None
    if verbose:  # ``n_samples`` may cost a pass over a chunk stream: only when shown
        total = getattr(source, "n_local", None)
        total = source.n_samples if total is None else total
    return progress(total=total, desc=desc, verbose=verbose, unit="row")


def _stored_block(K: torch.Tensor) -> DenseOperator:  # shape: (rows, M)
    """A stored block K(X_b, C) as a :class:`DenseOperator` with float64 sums.

    Products run in the block's dtype; sums over rows run in chunks of 1024 rows added in
    float64: a float32 sum over a whole block (tens of thousands of rows) loses the digits that a
    small ridge penalty needs (it stalled CG at twice the float64 test error with 2000 centres
    and lambda = 1e-6). The streamed passes tell a stored block (a :class:`DenseOperator`, whose
    rows they slice) from one recomputed tile by tile (a :class:`KernelOperator`).
    """
    return DenseOperator(K, options=_F64_SUMS)


class _PartialCache:
    """The first row blocks of K(X, C) stored, the others recomputed on every pass.

    Iterating yields ``(operator, Block)`` pairs like a full cache: stored blocks first (as
    :func:`_stored_block`), then a :class:`KernelOperator` for every remaining block.
    """

    def __init__(self, stored, source, kernel, C, options, rows, dtype):
        self.stored, self.source, self.kernel = stored, source, kernel
        self.C, self.options, self.rows, self.dtype = C, options, rows, dtype

    def __iter__(self):
        yield from self.stored
        for i, b in enumerate(_blocks(self.source, self.dtype, self.options, self.rows)):
            if i >= len(self.stored):
                yield KernelOperator(self.kernel, b.X, self.C, options=self.options), b


def kernel_fits(source: DataSource, n_centers: int, dtype: torch.dtype = _F64,
                options: Options | None = None, fraction: float = 0.5) -> bool:
    """Whether this process's rows of K(X, C) fit in ``fraction`` of the memory budget (the
    rule by which :func:`nystrom_kernel_cache` stores all of them; the solvers' passes are then
    memory-bound products instead of kernel evaluations)."""
    item = torch.empty((), dtype=dtype).element_size()
    n_rows = getattr(source, "n_local", source.n_samples)
    return n_rows * int(n_centers) * item <= fraction * memory_budget(options)


def nystrom_kernel_cache(source: DataSource, kernel: Kernel, centers: torch.Tensor, *,
                         dtype: torch.dtype = _F64, options: Options | None = None,
                         block_size: int | None = None, fraction: float = 0.5,
                         verbose: int = 0):
    """K(X_b, C) for as many row blocks as fit in ``fraction`` of the budget, stored.

    Returns a list of ``(block operator, Block)`` pairs accepted by the streamed passes (their
    ``cache`` argument) when all blocks fit; when only some do, an iterable that yields the
    stored blocks and then recomputes the others on every pass; None when not one block fits.
    Storing turns each CG iteration from n M kernel evaluations into two memory-bound products,
    as Falkon does when K_nM fits. Cost O(n M d) once, memory at most ``fraction`` of the budget.
    ``verbose`` > 0 shows a bar over the rows stored.
    """
    C = centers.to(dtype)
    M = C.shape[0]
    item = torch.empty((), dtype=dtype).element_size()
    # a shard stores only the rows this process holds
    n_rows = getattr(source, "n_local", source.n_samples)
    rows = block_rows(source.n_features, M, dtype, options, block_size)
    room = fraction * memory_budget(options)
    n_blocks = None if kernel_fits(source, M, dtype, options, fraction) else \
        int(room // (rows * M * item))
    if n_blocks == 0:
        return None
    stored: list[tuple[DenseOperator, Any]] = []
    with _rows_progress(source, "Nystrom kernel", verbose) as bar:
        if n_blocks is not None:
            bar.set_total(min(n_rows, n_blocks * rows))
        for b in _blocks(source, dtype, options, rows):
            if n_blocks is not None and len(stored) >= n_blocks:
                break
            stored.append((_stored_block(KernelOperator(kernel, b.X, C, options=options)
                                       .to_dense()), b))
            bar.update(b.X.shape[0])
    if n_blocks is None:
        return stored
    return _PartialCache(stored, source, kernel, C, options, rows, dtype)


def _kernel_blocks(source, kernel, C, dtype, options, block_size, cache):
    if cache is not None:
        yield from cache
        return
    rows = block_rows(source.n_features, C.shape[0], dtype, options, block_size)
    for b in _blocks(source, dtype, options, rows):
        yield KernelOperator(kernel, b.X, C, options=options), b


def nystrom_rhs(source: DataSource, kernel: Kernel, centers: torch.Tensor, *,
                y_offset: torch.Tensor | None = None, dtype: torch.dtype = _F64,
                options: Options | None = None, block_size: int | None = None,
                cache=None) -> torch.Tensor:
    """b = K_nM^T D (y - y_offset), shape (M, t), float64, all-reduced. Cost O(n M (d + t))."""
    C = centers.to(dtype)
    out = torch.zeros(C.shape[0], source.n_outputs, dtype=_F64)
    for op, b in _kernel_blocks(source, kernel, C, dtype, options, block_size, cache):
        y = b.y.to(_F64)
        if y_offset is not None:
            y = y - y_offset
        if b.sample_weight is not None:
            y = y * b.sample_weight.to(_F64).reshape(-1, 1)
        out += op.t_matmul(y).to(_F64)
    return all_reduce_sum(out)


def nystrom_normal_matvec(source: DataSource, kernel: Kernel, centers: torch.Tensor,
                          V: torch.Tensor, *, dtype: torch.dtype = _F64,
                          options: Options | None = None,
                          block_size: int | None = None, cache=None) -> torch.Tensor:
    """K_nM^T D K_nM V summed over the source's row blocks and all-reduced.

    The per-iteration product of (1). ``V`` (M, t) float64; returns (M, t) float64. Each block's
    kernel tiles are computed once and used for both products, in ``dtype`` with float64
    accumulation. ``cache`` (from :func:`nystrom_kernel_cache`) reuses stored blocks instead.
    Cost O(n M (d + 2t)), memory one block plus the operator's tiles.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(50, 2, dtype=torch.float64, generator=g)
    >>> C, V = X[:7], torch.ones(7, 1, dtype=torch.float64)
    >>> out = nystrom_normal_matvec(ArraySource(X), Gaussian(1.0), C, V, block_size=16)
    >>> K = Gaussian(1.0)(X, C)
    >>> bool(torch.allclose(out, K.T @ (K @ V)))
    True
    """
    C = centers.to(dtype)
    out = torch.zeros(C.shape[0], V.shape[1], dtype=_F64)
    for op, b in _kernel_blocks(source, kernel, C, dtype, options, block_size, cache):
        out += op.kt_k_matmul(V, row_weights=b.sample_weight).to(_F64)
    return all_reduce_sum(out)


def normal_product(run: _NystromRun) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> K_nM^T D K_nM v (float64) over the run's rows: :func:`nystrom_normal_matvec` on its
    blocks. With float32 kernel values the blocks' products run in float64
    (``Options.products_float64``, :class:`_Float64Products`): the float32 products (v rounded
    to float32, sums over M in float32) err by about eps32 |K_nM| |v|, an error that is not a
    fixed matrix and has no sign; where the preconditioned system's values fall below eps32
    times its largest, CG's directions are dominated by components whose curvature is below
    that error, and the iterate drifted (eigen-CG, n = 1e4, M = s = 4000, lam = 1e-6: test
    RMSE 0.36 at pass 19, 1.04 at pass 150, direct 0.2545; Falkon-class CG, 5-d data,
    n = 1000, M = 300: 0.43 at pass 9, 0.94 at pass 150). The kernel values (the costly part of
    a streamed pass) stay float32; the products cost 2 n M t flops more in float64.
    """
    cache = normal_product_blocks(run)
    return lambda v: nystrom_normal_matvec(run.source, run.kernel, run.C, v, dtype=run.dtype,
                                           options=run.options, block_size=run.block_size,
                                           cache=cache)


def normal_product_blocks(run: _NystromRun):
    """The ``cache`` argument of :func:`nystrom_normal_matvec` for the passes of
    :func:`normal_product`: the run's own blocks with float64 values, else
    :class:`_Float64Products`."""
    return run.cache if run.dtype == _F64 else _Float64Products(run)


class _Float64Products:
    """The row blocks of a run (stored or recomputed, as its cache gives them), each operator
    with ``products_float64``; iterable as often as needed (once per pass)."""

    def __init__(self, run: _NystromRun):
        self.run, self.C = run, run.C.to(run.dtype)

    def __iter__(self):
        r = self.run
        for op, blk in _kernel_blocks(r.source, r.kernel, self.C, r.dtype, r.options,
                                      r.block_size, r.cache):
            op = copy.copy(op)  # the same values (stored or recomputed), float64 products
            op.options = op.options.replace(products_float64=True)
            yield op, blk


def nystrom_predict(kernel: Kernel, centers: torch.Tensor, coef: torch.Tensor, X: torch.Tensor,
                    *, dtype: torch.dtype | None = None,
                    options: Options | None = None) -> torch.Tensor:
    """f(X) = K(X, C) coef through the tiled operator; float64 result. Cost O(n M (d + t))."""
    dtype = dtype or X.dtype
    op = KernelOperator(kernel, X.to(dtype), centers.to(dtype), options=options)
    return op.matmul(coef.to(_F64)).to(_F64)


def nystrom_validation_mse(source: DataSource, kernel: Kernel, centers: torch.Tensor,
                           coef: torch.Tensor, *, y_offset: torch.Tensor | None = None,
                           dtype: torch.dtype = _F64, options: Options | None = None,
                           block_size: int | None = None, cache=None) -> float:
    """Weighted mean squared error of K(X, C) coef + y_offset over a source (all-reduced)."""
    C = centers.to(dtype)
    acc = torch.zeros(2, dtype=_F64)
    for op, b in _kernel_blocks(source, kernel, C, dtype, options, block_size, cache):
        f = op.matmul(coef).to(_F64)
        r = b.y.to(_F64) - f - (0.0 if y_offset is None else y_offset)
        sq = (r * r).mean(1)
        w = b.sample_weight
        acc[0] += sq.sum() if w is None else w.to(_F64) @ sq
        acc[1] += b.X.shape[0] if w is None else w.sum()
    acc = all_reduce_sum(acc)
    return float(acc[0] / acc[1].clamp_min(1e-300))


def nystrom_direct(source: DataSource, kernel: Kernel, centers: torch.Tensor, alpha: float, *,
                   y_offset: torch.Tensor | None = None, options: Options | None = None,
                   block_size: int | None = None) -> torch.Tensor:
    """Direct float64 solve of (1): H built column-block by column-block, then a dense solve.

    Reference for tests and small M. Cost O(n M^2 + M^3), memory O(M^2).
    """
    C = centers.to(_F64)
    M = C.shape[0]
    H = torch.zeros(M, M, dtype=_F64)
    rows = block_rows(source.n_features, M, _F64, options, block_size)
    rows = max(1, min(rows, memory_budget(options) // (4 * 8 * M)))
    for b in _blocks(source, _F64, options, rows):
        Kb = KernelOperator(kernel, b.X, C, options=options).to_dense()
        Kw = Kb if b.sample_weight is None else Kb * b.sample_weight.reshape(-1, 1)
        H += Kw.T @ Kb
    H = all_reduce_sum(H)
    H += alpha * KernelOperator(kernel, C, options=options).to_dense()
    b = nystrom_rhs(source, kernel, C, y_offset=y_offset, options=options, block_size=block_size)
    return torch.linalg.lstsq(H, b).solution if alpha == 0 else torch.linalg.solve(H, b)


# ---- the solver --------------------------------------------------------------------------------
#: Default stopping tolerance by precision of the kernel products (see :func:`nystrom_krr`).
DEFAULT_TOL = {torch.float64: 1e-3, torch.float32: 1e-3}
#: The direct solve forms the Gram of the whitened rows (K_nM F)^T (K_nM F) instead of
#: F^T (K_nM^T K_nM) F when :func:`_squared_gram_error` exceeds this. Measured on 9-d Gaussian
#: data: bounds of 4.2 and 5.0 left objective excesses of 2e-16 (n = 20 000, M = 500,
#: sigma = 3, lam = 1e-10) and 6.5e-7 (n = 3000, M = 300, sigma = 10, lam = 1e-6), 16 left
#: 3e-6, 1.6e3 left 62 %.
_SQUARED_GRAM_MAX = 1.0
#: The direct solve is refined by float64 CG when its residual of (3), recomputed from the rows,
#: exceeds ``_CHECK_SLACK`` times its rounding level (:func:`_gradient_residual`) and the bound
#: ||r||^2 / lam on the objective's excess exceeds ``_CHECK_EXCESS`` times the decrease
#: b^T beta. Measured (M = 300-1000, sigma = 1-20, lam = 1e-4 to 1e-12): whitened solves
#: 3-5 times the level, float32 0.02-1.4, the plain Gram 5e2-4e4 times with an excess bound
#: below 1e-11; the plain Gram at sigma = 10, lam = 1e-8 (62 % above the minimum): 1e5 times,
#: excess bound 0.2.
_CHECK_SLACK = 100.0
_CHECK_EXCESS = 1e-8
#: The check pass is skipped when :func:`_squared_gram_error` is below this: the plain Gram is
#: then accurate by the bound itself, which overestimates (a bound of 0.014 left a residual of
#: 2e-7 and an objective excess below 1e-12; a bound of 4 was exact to rounding), and the
#: well-conditioned case keeps its cost
_CHECK_MIN = 0.1
#: CG steps whose energies are summed for the stopping rule's error estimate
_CHANGE_WINDOW = 4
#: CG passes over which the progress estimate measures the rate of decrease
_RATE_WINDOW = 10

#: The cost model of ``solver="auto"``, in units of one memory-bound multiply-add over a stored
#: K_nM entry (a CG pass over a stored K_nM costs 2 n M of them). Measured on a 2-core machine with
#: one thread (``python benchmarks/nystrom_vs_falkon.py --crossover``; n = 20 000, d = 9):
#: a dense product (GEMM) runs ``_GEMM_SPEEDUP`` times faster per flop (14.5 at M = 1000 and 17 at
#: M = 2000 with K_nM stored); recomputing one kernel entry in a streamed pass costs
#: ``_KERNEL_COST[dtype]`` units (streamed passes took 4-6x a stored pass in float64, 2.5x in
#: float32); a default CG run takes about ``_EXPECTED_ITERS`` passes (33-55 measured).
_GEMM_SPEEDUP = 14.0
_EXPECTED_ITERS = 40
_KERNEL_COST = {torch.float64: 8.0, torch.float32: 3.0}
#: Setup costs, in M^3 / g (Falkon's preconditioner: two Cholesky factors and a triangular
#: product) and (M s^2, s^3) / g (the rank-s eigen-preconditioner: K(C, C_s), its thin QR and
#: an s x s eigendecomposition); eigen-CG needs ``_EIGEN_PASS_RATIO`` times PCG's passes.
#: Measured with ``python benchmarks/many_centres.py --n 20000 --M 1000 2000 4000 8000`` (float32
#: rows, K_nM stored, one thread; docs/performance/many_centres.md): PCG setup 0.9-1.3 M^3 / g
#: at M = 4000-8000; eigen-CG setup 6.8 M s^2 / g + 8.4 s^3 / g (s = 1000, 2000); passes to
#: 1 % of the best RMSE 1x-5x PCG's with s = 2000 and up to 12x with s = 1000 (at M = 8000).
#: At n = 2e5 (M = 5000 and 2e4, s = 2000) the setups were 1.6-1.7x these and the passes to
#: 1 % of the best RMSE 3.7-4.4x PCG's (7-11 for PCG), where eigen-CG was 1.39x faster at
#: M = 2e4; to the estimator's own stopping rule (tol 1e-3), which is what the choice is for,
#: PCG took 24 and 12 iterations (M = 5000, 2e4) and eigen-CG did not converge in 100, so the
#: model's choice of PCG there stands and the constants were not refitted. The pass ratio is
#: s = 2000's; the rank 3000 of many rows (:func:`default_max_rank`) needs 0.5-0.65x those
#: passes to 1 % and is priced with the same ratio, which errs towards PCG.
_PCG_SETUP = 1.0
_EIGEN_SETUP = (7.0, 8.0)
_EIGEN_PASS_RATIO = 5.0
#: Largest default rank s of the eigen-CG preconditioner on few rows (and the rank the cost
#: model prices when none is given): setup M s^2 + s^3 flops, 3 M s floats. 2000:
#: with s = 1000 eigen-CG missed 1 % of the best RMSE_f within 150 passes at n = 2e4,
#: M = 2000 and 4000, and within 60 at n = 2e5, M = 2e4 (1.1 % above after 60); s = 2000
#: reached it at every size measured (docs/performance/many_centres.md)
DEFAULT_MAX_RANK = 2000
#: The default rank where passes are dear (:func:`default_max_rank`). Passes to 1 % of the
#: best RMSE_f with s = 2000 and 3000 (float32 rows, one thread): 41 and 22 (n = 2e4,
#: M = 4000), 36 and 23 (n = 2e4, M = 8000), 41 and 25 (n = 2e5, M = 5000), 33 and 19
#: (n = 2e5, M = 2e4), 29 and 14 (n = 2e5, M = 5e4): ``_RANK_PASSES_SAVED`` at least. The
#: larger rank's extra setup took 13.6 s, 17.6 s (n = 2e4, M = 4000, 8000), 23 s and 47 s
#: (n = 2e5, M = 5000, 2e4), against passes of 0.10-0.22 s, 0.81 s (K_nM stored) and 7.1 s
#: (streamed): ``_RANK_SETUP_FACTOR`` times the setup price of :func:`solver_costs` relative
#: to its pass price at n = 2e5 (0.8x at n = 2e4, where the model's constants were fitted).
#: Times to 1 %: s = 3000 1.5x, 1.6x and 1.23x slower where K_nM was stored (n = 2e4;
#: n = 2e5, M = 5000), 1.16-1.19x and 1.53x faster where it was streamed (n = 2e5, M = 2e4 and
#: 5e4) (docs/performance/many_centres.md)
LARGE_ROWS_RANK = 3000
_RANK_PASSES_SAVED = 13.0
_RANK_SETUP_FACTOR = 2.5
#: Up to this many centres ``solver="auto"`` always solves directly: exact, and at most about
#: 0.15 s on one thread whatever n (n = M = 500: direct 0.13 s, CG 0.03 s but only to its
#: tolerance, 5e-5 to 3e-4 from exact kernel ridge with all points as centres; n = M = 1000:
#: direct 1.0 s, CG 0.15 s)
DIRECT_MAX_CENTERS = 500


def default_max_rank(n_rows: int | None, n_centers: int, n_features: int = 0, *,
                     stored: bool = True, dtype: torch.dtype = _F64) -> int:
    """``LARGE_ROWS_RANK`` (3000) where its extra setup over ``DEFAULT_MAX_RANK`` (2000),
    ``_RANK_SETUP_FACTOR`` (7 M (3000^2 - 2000^2) + 8 (3000^3 - 2000^3)) / g in
    :func:`solver_costs`' units, costs less than the 13 passes it saves, n M (2 + k) each
    (``k`` as there: 0 when K_nM is ``stored``), else ``DEFAULT_MAX_RANK`` (also when
    ``n_rows`` is None). ``n_rows`` is one process's rows: the setup is replicated, the passes
    are shared.

    Examples
    --------
    >>> import torch
    >>> f32 = torch.float32
    >>> default_max_rank(20_000, 8000, 9), default_max_rank(200_000, 5000, 9)
    (2000, 2000)
    >>> default_max_rank(200_000, 20_000, 9, stored=False, dtype=f32)
    3000
    """
    if n_rows is None:
        return DEFAULT_MAX_RANK
    a, b = _EIGEN_SETUP
    lo, hi, M = float(DEFAULT_MAX_RANK), float(LARGE_ROWS_RANK), float(max(n_centers, 1))
    extra = _RANK_SETUP_FACTOR * (a * M * (hi ** 2 - lo ** 2) + b * (hi ** 3 - lo ** 3)) \
        / _GEMM_SPEEDUP
    saved = _RANK_PASSES_SAVED * float(n_rows) * M * (2.0 + _entry_cost(n_features, stored,
                                                                          dtype))
    return LARGE_ROWS_RANK if saved >= extra else DEFAULT_MAX_RANK


def _entry_cost(n_features: int, stored: bool, dtype: torch.dtype) -> float:
    """k of :func:`solver_costs`: recomputing one kernel entry in a streamed pass (0 stored)."""
    return 0.0 if stored else n_features / _GEMM_SPEEDUP + _KERNEL_COST.get(dtype, 8.0)


def solver_costs(n: int, n_centers: int, n_features: int, *, stored: bool,
                 dtype: torch.dtype = _F64, rank: int = DEFAULT_MAX_RANK) -> dict[str, float]:
    """Estimated cost of each Nyström solver on ``n`` rows (one process's), in units of one
    memory-bound multiply-add over a stored K_nM entry:

    * ``"direct"``: ``(n M^2 + 6 M^3) / g`` (one Gram product and the dense factorisations at
      GEMM speed ``g``), plus two kernel passes ``2 n M k`` when K_nM is streamed;
    * ``"cg"`` (Falkon's preconditioner): ``M^3 / g + I n M (2 + k)`` for ``I`` passes of two
      products, ``k = 0`` when K_nM is stored;
    * ``"eigen_cg"`` (rank ``s``): ``(7 M s^2 + 8 s^3) / g + 5 I n M (2 + k)``,

    where ``k = n_features / g + _KERNEL_COST[dtype]`` is the cost of recomputing one kernel
    entry. The setups are replicated on every process of a data-parallel fit; the passes are
    shared, so ``n`` is the rows of one process.

    Examples
    --------
    >>> c = solver_costs(20_000, 8000, 9, stored=True)
    >>> sorted(c, key=c.get)
    ['cg', 'eigen_cg', 'direct']
    """
    N, M = float(n), float(n_centers)
    s = float(min(max(int(rank), 1), n_centers))
    k = _entry_cost(n_features, stored, dtype)
    passes = _EXPECTED_ITERS * N * M * (2.0 + k)
    a, b = _EIGEN_SETUP
    return {"direct": (N * M * M + 6.0 * M ** 3) / _GEMM_SPEEDUP + 2.0 * N * M * k,
            "cg": _PCG_SETUP * M ** 3 / _GEMM_SPEEDUP + passes,
            "eigen_cg": (a * M * s * s + b * s ** 3) / _GEMM_SPEEDUP + _EIGEN_PASS_RATIO * passes}


def choose_solver(n: int, n_centers: int, n_features: int, *, stored: bool,
                  dtype: torch.dtype = _F64, rank: int = DEFAULT_MAX_RANK,
                  candidates: tuple[str, ...] = ("direct", "cg")) -> str:
    """The cheapest of ``candidates`` by :func:`solver_costs`; ``"direct"`` up to
    ``DIRECT_MAX_CENTERS`` centres (it costs a fraction of a second and is exact).

    The direct solve is exact; CG stops at the tolerance. :func:`nystrom_krr` chooses between
    ``"direct"`` and ``"cg"``; ``NystromKernelRidge(solver="auto")`` also weighs ``"eigen_cg"``
    (:func:`~kernelflow.solvers.nystrom_eigen_cg.nystrom_eigen_cg`), and runs it whatever the
    costs when the M x M float64 matrices of the other two exceed the memory budget
    (:func:`centre_matrices_fit`, the rule with which they refuse).

    Examples
    --------
    >>> choose_solver(100_000, 200, 9, stored=True), choose_solver(100_000, 5000, 9, stored=True)
    ('direct', 'cg')
    >>> choose_solver(20_000, 1000, 9, stored=False), choose_solver(500, 500, 9, stored=True)
    ('direct', 'direct')
    >>> all3 = ("direct", "cg", "eigen_cg")
    >>> [choose_solver(20_000, M, 9, stored=True, candidates=all3) for M in (4000, 16_000)]
    ['cg', 'eigen_cg']
    """
    if n_centers <= DIRECT_MAX_CENTERS and "direct" in candidates:
        return "direct"
    costs = solver_costs(n, n_centers, n_features, stored=stored, dtype=dtype, rank=rank)
    return min(candidates, key=costs.__getitem__)


def nystrom_gram(source: DataSource, kernel: Kernel, centers: torch.Tensor, *,
                 dtype: torch.dtype = _F64, options: Options | None = None,
                 block_size: int | None = None, cache=None) -> torch.Tensor:
    """K_nM^T D K_nM (M, M), float64, all-reduced: one pass; kernel values in ``dtype``, every
    product in float64 (a float32 Gram loses the small eigenvalues that a small penalty needs).
    Cost O(n M (M + d)), memory O(M^2) plus a block.
    """
    G, _ = _gram_pass(source, kernel, centers, dtype=dtype, options=options,
                      block_size=block_size, cache=cache)
    return G


def _gram_pass(source: DataSource, kernel: Kernel, centers: torch.Tensor, *,
               whiten: torch.Tensor | None = None,  # shape: (M, r)
               y_offset: torch.Tensor | None = None,  # shape: (t,)
               rhs: bool = False, dtype: torch.dtype = _F64, options: Options | None = None,
               block_size: int | None = None, cache=None, verbose: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Phi^T D Phi, K_nM^T D (y - y_offset)) in one pass, Phi = K_nM F (F = ``whiten``, else I).

    Returns the Gram matrix (r, r) and, with ``rhs``, the right-hand side (M, t) (not
    whitened), float64 and all-reduced. Whitening each row chunk before its Gram product
    (one more GEMM, 2 n M r multiply-adds) keeps the rounding of the Gram relative to the
    whitened features instead of amplifying that of K_nM^T K_nM by 1 / s_min(K_MM).
    ``verbose`` > 0 shows a bar over the rows (the pass costs the direct solve most of its time).
    """
    C = centers.to(dtype)
    M = C.shape[0]
    r = M if whiten is None else whiten.shape[1]
    G = torch.zeros(r, r, dtype=_F64)
    b = torch.zeros(M, source.n_outputs, dtype=_F64, device=C.device) if rhs else None
    item = torch.empty((), dtype=dtype).element_size()
    if cache is None:
        rows = block_rows(source.n_features, M, dtype, options, block_size)
        rows = max(1, min(rows, memory_budget(options) // (4 * item * M)))
        blocks = ((_stored_block(KernelOperator(kernel, b.X, C, options=options).to_dense()), b)
                  for b in _blocks(source, dtype, options, rows))
    else:
        blocks = iter(cache)
    F = None if whiten is None else whiten.to(device=C.device, dtype=_F64)
    bar = _rows_progress(source, "Nystrom Gram", verbose)

    def chunks():
        for op, blk in blocks:
            for s in range(0, blk.X.shape[0], 2048):
                e = min(s + 2048, blk.X.shape[0])
                Kc = op.K[s:e] if isinstance(op, DenseOperator) else op.rows(torch.arange(s, e))
                Kc = Kc.to(_F64)
                sw = None
                if blk.sample_weight is not None:  # K^T D K = (D^1/2 K)^T (D^1/2 K); not
                    # in place: Kc may be the stored block itself
                    sw = blk.sample_weight[s:e].to(_F64).clamp_min(0).sqrt().reshape(-1, 1)
                    Kc = Kc * sw
                if b is not None:
                    y = blk.y[s:e].to(device=Kc.device, dtype=_F64)
                    if y_offset is not None:
                        y = y - y_offset.to(device=Kc.device, dtype=_F64)
                    if sw is not None:
                        y = y * sw
                    b.add_((Kc.T @ y).to(b.device))  # (D^1/2 K)^T D^1/2 y
                yield Kc if F is None else Kc @ F
                bar.update(e - s)  # counted once its Gram product is added
        bar.close()

    if C.device.type == "cpu":
        # lower triangle by BLAS syrk (n M^2 multiply-adds, 1.4x faster than the panels below
        # at M = 1000), on as many threads as torch uses
        from scipy.linalg import blas  # noqa: PLC0415
        from threadpoolctl import threadpool_limits  # noqa: PLC0415

        Gf = G.numpy().T  # Fortran order: syrk updates it in place
        with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
            for Kc in chunks():  # Kc^T, Fortran-ordered without a copy: G += Kc^T Kc
                Gf = blas.dsyrk(1.0, Kc.numpy().T, beta=1.0, c=Gf, trans=0, lower=1,
                                overwrite_c=1)
        G = torch.from_numpy(Gf).contiguous()  # its lower triangle holds the result
    else:
        # lower triangle by column panels: G[j0:, j0:j1] += Kc[:, j0:]^T Kc[:, j0:j1]
        # (about (1 + 1/p) / 2 of the full product's multiply-adds for p panels)
        p = max(1, min(8, r // 256))
        edges = [round(i * r / p) for i in range(p + 1)]
        G = G.to(C.device)
        for Kc in chunks():
            for j0, j1 in zip(edges[:-1], edges[1:]):
                G[j0:, j0:j1].addmm_(Kc[:, j0:].T, Kc[:, j0:j1])
    G = all_reduce_sum(G)
    if b is not None:
        b = all_reduce_sum(b)
    return torch.tril(G) + torch.tril(G, -1).T, b


def _gradient_residual(source: DataSource, kernel: Kernel, C: torch.Tensor, coef: torch.Tensor,
                       beta: torch.Tensor, F: torch.Tensor, b: torch.Tensor, lam: float, W: float,
                       *, y_offset, dtype, options, block_size, cache,
                       verbose: int = 0) -> tuple[float, float]:
    """Relative residual of (3) at beta recomputed from the rows, and its rounding level.

    F^T (b - K_nM^T D K_nM a) / W - lam beta over F^T b / W, a = F beta, from one fused pass
    K_nM^T D (K_nM a - (y - y_offset)): this checks the direct solve against the unsquared
    system. The same pass evaluates it at a copy of a perturbed in its last bits (relative
    eps(dtype), alternating signs): the difference is the residual that the rounding of a and
    of the pass itself accounts for.
    """
    Cd = C.to(dtype)
    t = coef.shape[1]
    sign = 1.0 - 2.0 * (torch.arange(coef.shape[0], dtype=_F64, device=coef.device) % 2)
    V = torch.cat([coef, coef * (1.0 + torch.finfo(dtype).eps * sign.reshape(-1, 1))], dim=1)
    g = torch.zeros(C.shape[0], 2 * t, dtype=_F64, device=coef.device)
    with _rows_progress(source, "Nystrom residual check", verbose) as bar:
        for op, blk in _kernel_blocks(source, kernel, Cd, dtype, options, block_size, cache):
            y = blk.y.to(_F64)
            if y_offset is not None:
                y = y - y_offset.to(device=y.device, dtype=_F64)
            g += op.kt_k_matmul(V, W=-torch.cat([y, y], dim=1),
                                row_weights=blk.sample_weight).to(device=g.device, dtype=_F64)
            bar.update(blk.X.shape[0])
    g = F.T @ all_reduce_sum(g)  # F^T K^T D (K a - y) = F^T (K^T D K a - b)
    norm = torch.linalg.vector_norm(F.T @ b, dim=0).clamp_min(1e-300)
    res = torch.linalg.vector_norm(g[:, :t] + (lam * W) * beta, dim=0) / norm
    level = torch.linalg.vector_norm(g[:, :t] - g[:, t:], dim=0) / norm
    return float(res.max()), float(level.max())


@dataclass
class NystromSolution:
    """Result of :func:`nystrom_krr`.

    ``coef`` (M, t) float64 are the coefficients a of f(x) = K(x, C) a; ``residual_norms`` are the
    relative residuals of the (preconditioned) CG system; ``validation_mse`` has one entry per
    iteration (iteration 0 first) when a validation source was given; ``best_iter`` is the
    iteration whose coefficients were kept; ``solver`` is ``"cg"`` or ``"direct"``;
    ``residual`` is the final relative residual and ``stop_reason`` one of ``"residual"``,
    ``"change"``, ``"validation"``, ``"callback"``, ``"max_iter"``, ``"direct"``.
    ``history`` lists ``(solver, iterations)`` for every solver that ran, in order (a float32
    CG run that stalled before the direct solve, a direct solve refined by CG); ``n_iter`` is
    their sum and ``solver`` the last one, whose coefficients are returned.
    """

    coef: torch.Tensor
    n_iter: int
    converged: bool
    residual_norms: list = field(default_factory=list)
    validation_mse: list = field(default_factory=list)
    best_iter: int = 0
    total_weight: float = 0.0
    stopped_early: bool = False
    solver: str = "cg"
    residual: float = 0.0
    stop_reason: str = "residual"
    tolerance: float = 0.0
    history: list = field(default_factory=list)


def centre_matrices_fit(n_centers: int, options: Options | None = None) -> bool:
    """Whether the M x M float64 matrices of ``solver="cg"`` and ``"direct"`` fit the budget.

    The rule is one such matrix, 8 M^2 bytes, within :func:`~kernelflow.operators.memory_budget`
    (both solvers hold K_MM and its factors). Where it fails, those solvers refuse with a
    MemoryError and the estimator's ``solver="auto"`` runs
    :func:`~kernelflow.solvers.nystrom_eigen_cg.nystrom_eigen_cg`, which needs no M x M matrix.

    Examples
    --------
    >>> centre_matrices_fit(1000, Options(memory_budget=8 * 1000**2))
    True
    >>> centre_matrices_fit(1000, Options(memory_budget=8 * 1000**2 - 1))
    False
    """
    return n_centers * n_centers * 8 <= memory_budget(options)


def _check_centre_memory(n_centers: int, options: Options | None) -> None:
    """Refuse, with the sizes and the remedies, a number of centres whose M x M float64
    matrices (K_MM and its factors, which both solvers hold) exceed the memory budget
    (:func:`centre_matrices_fit`)."""
    if centre_matrices_fit(n_centers, options):
        return
    need = n_centers * n_centers * 8
    budget = memory_budget(options)
    mib = 2.0 ** 20
    raise MemoryError(
        f"{n_centers} Nyström centres need M x M float64 matrices of {need / mib:.0f} MiB "
        f"each (K_MM and its factors: about 3 for conjugate gradients, 5 for the direct "
        f"solve), above the memory budget of {budget / mib:.0f} MiB. Use fewer centres "
        f"(n_components <= {int(math.isqrt(budget // 8 // 5))} fits every solver within "
        f"this budget), a larger budget (options=Options(memory_budget=...) or "
        f"memory_fraction), or solver='eigen_cg' (the estimator's solver='auto' picks it "
        f"here), which needs no M x M matrix."
    )


def nystrom_krr(
    source: DataSource,
    kernel: Kernel,
    centers: torch.Tensor,  # shape: (M, d)
    alpha: float,
    *,
    y_offset: torch.Tensor | None = None,  # shape: (t,)
    coef0: torch.Tensor | None = None,  # shape: (M, t)
    max_iter: int = 100,
    tol: float | None = None,
    solver: str = "cg",
    preconditioner: bool | NystromPreconditioner = True,
    validation: DataSource | None = None,
    n_iter_no_change: int = 5,
    dtype: torch.dtype = _F64,
    options: Options | None = None,
    block_size: int | None = None,
    store_kernel: bool | None = None,
    callback=None,
    verbose: int = 0,
    checkpoint: Checkpoint | None = None,
    moments: tuple[float, torch.Tensor, int] | None = None,
) -> NystromSolution:
    """Solve the Nyström normal equations (1) by (preconditioned) conjugate gradients or directly.

    Parameters
    ----------
    source : DataSource
        Training rows with targets (and optional sample weights); read once per iteration.
    kernel : Kernel
    centers : tensor of shape (M, d)
    alpha : float
        Ridge penalty on scikit-learn's scale (> 0 with the preconditioner).
    y_offset : tensor of shape (t,), optional
        Subtracted from the targets (intercept).
    coef0 : tensor of shape (M, t), optional
        Starting coefficients (warm start).
    max_iter : int, default=100
    tol : float, optional
        CG stops when the relative residual of the preconditioned system falls below ``tol``,
        or when the estimated error of the iterate stays below ``tol`` for two consecutive
        iterations: the square root of the energy of the last four steps (sum of ||dx||_A^2,
        Hestenes-Stiefel's lower estimate of ||x* - x||_A^2, computed without a product with A)
        over the energy x^T b of the iterate. Default ``DEFAULT_TOL[dtype]`` (1e-3),
        or ``options.cg_tol`` when set.
    solver : {"cg", "direct", "auto"}, default="cg"
        "direct" accumulates the Gram matrix of the rows in one pass and solves the system
        densely in the eigenbasis of K_MM (exact, also for a rank-deficient K_MM;
        O(n M^2 + M^3); the preconditioner is not used; see :func:`_direct_solve`): the rows
        are whitened before the Gram product when K_MM is ill-conditioned against the penalty,
        and where the plain Gram may be inaccurate the residual is recomputed from the rows,
        with a RuntimeWarning and a fallback (whitened rows, then float64 CG from the direct
        solution) when it is far above rounding. "auto" picks the cheaper by
        :func:`choose_solver`, and when a float32 CG run does not converge in ``max_iter``
        passes it solves directly with float64 kernel values. Validation early stopping and
        ``callback`` need "cg" ("auto" then picks it).
    preconditioner : bool or NystromPreconditioner, default=True
        Falkon's preconditioner (2), a prebuilt one, or False for plain CG on (1).
    validation : DataSource, optional
        Rows on which the mean squared error is measured after every iteration; the best
        coefficients are kept and the run stops after ``n_iter_no_change`` iterations without
        improvement (iterations act as regularisation).
    dtype : torch.dtype, default=float64
        Precision of the kernel tiles (float32 halves memory traffic; factors stay float64).
        With float32, CG multiplies the float32 values in float64 (about 1.2-1.3x the cost
        of a float32 pass) and solves (1) with K_MM + j I, j = :func:`values_jitter`.
    store_kernel : bool or None, default=None
        Keep K(X, C) (training and validation rows) in memory between iterations. None stores
        it when it takes at most half of the memory budget; False always streams.
    callback : callable, optional
        ``callback(k, coef)`` after each iteration; returning True stops.
    checkpoint : Checkpoint, optional
        CG state (iterate, residual, direction, scalars, stopping counters and validation
        monitor) written every ``checkpoint.interval`` seconds; a run given a checkpoint holding
        such a state continues from it and takes the steps the interrupted run would have taken.
        The direct solve (one pass) is not checkpointed.
    verbose : int, default=0
        > 0: progress bars over the passes that take long, each with one estimate of the time
        left: the rows of the direct solve's Gram pass (and of its residual check, of storing
        K_nM); CG's passes with the residual and the change, the expected count revised from
        the rates at which they fall (:func:`_passes_left`). > 1 also logs one line per CG
        pass at INFO level.
    moments : tuple (float, tensor of shape (t,), int), optional
        :func:`source_moments` of ``source`` (total weight, weighted target sum, row count), when
        the caller already has them: the solver then skips that pass over the rows.

    Returns
    -------
    NystromSolution

    Notes
    -----
    Cost: setup O(M^3 + M^2 d) plus two passes; each iteration one pass, O(n M (d + 2t)), plus a
    validation pass when early stopping. Memory O(M^2) for the factors plus one block.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(300, 3, dtype=torch.float64, generator=g)
    >>> y = torch.sin(X.sum(1))
    >>> sol = nystrom_krr(ArraySource(X, y), Gaussian(1.0), X[:30], 3.0, tol=1e-10)
    >>> ref = nystrom_direct(ArraySource(X, y), Gaussian(1.0), X[:30], 3.0)
    >>> sol.converged, bool(torch.allclose(sol.coef, ref, rtol=1e-6))
    (True, True)
    """
    _require_targets(source)
    if solver not in ("cg", "direct", "auto"):
        raise ValueError(f"solver must be 'cg', 'direct' or 'auto', got {solver!r}.")
    _check_centre_memory(centers.shape[0], options)
    run = _nystrom_run(source, kernel, centers, alpha, moments=moments, validation=validation,
                       store_kernel=store_kernel, dtype=dtype, options=options,
                       block_size=block_size, cache_verbose=verbose, y_offset=y_offset,
                       tol=_resolve_tol(tol, dtype, options, 1e-5), max_iter=max_iter,
                       verbose=verbose)
    auto = solver == "auto"
    if auto:
        solver = "cg" if (validation is not None or callback is not None) else choose_solver(
            run.n_rows, run.M, source.n_features, stored=isinstance(run.cache, list), dtype=dtype)
    if solver == "direct":
        return _solve_direct(run, [], None, dtype, run.cache)
    system = _cg_system(run, preconditioner, coef0)
    watch = _CGMonitor(run, system, n_iter_no_change=n_iter_no_change, callback=callback,
                       checkpoint=checkpoint, coef0=coef0)
    with watch.bar:
        res = conjugate_gradient(system.matvec, system.rhs, x0=system.x0, max_iter=max_iter,
                                 tol=run.tol, callback=watch, state=watch.cg_state)
    reason = "residual" if res.converged else watch.state["reason"]
    if res.breakdown:
        reason = "breakdown"
    if (auto and dtype != _F64 and validation is None and callback is None
            and not (res.converged or reason == "change")):
        # float32 products can stall CG where K_MM has eigenvalues below their rounding
        # (a tiny penalty with a smooth kernel): the direct solve accumulates in float64
        # with float64 kernel values (one streamed pass more than a stored float32 K_nM):
        # float32 values leave out the directions that the small penalty needs
        logger.info("Nystrom CG in %s did not converge in %d passes (residual %.2e): "
                    "solving directly in float64", dtype, res.n_iter, res.residual_norms[-1])
        return _solve_direct(run, [("cg", res.n_iter)], None, _F64, None)
    if res.breakdown:
        warn_breakdown("CG", res, res.residual_norms[-1],
                       "use float64 rows (dtype='float64'), a larger alpha or solver='direct'")
    return _cg_solution(run, res, system.to_coef(res.x.reshape(run.M, run.t)),
                        watch.state["best_coef"], watch.monitor, reason,
                        stopped_early=watch.state["early"], solver="cg", log=logger)


# ---- the stages of the solvers -----------------------------------------------------------------
@dataclass
class _NystromRun:
    """The resolved inputs of one Nyström solve, read by its stages: the centres in float64, the
    total weight W (with the weighted target sum and the row count), lam = alpha / W, the stored
    kernel blocks of the training and validation rows (None when streamed), and the settings
    of the solver that runs (``tol`` resolved from the precision)."""

    source: DataSource
    kernel: Kernel
    C: torch.Tensor  # shape: (M, d), float64
    alpha: float
    W: float
    ysum: torch.Tensor  # shape: (t,)
    n_rows: int
    dtype: torch.dtype
    options: Options | None
    block_size: int | None
    validation: DataSource | None = None
    cache: Any = None
    val_cache: Any = None
    y_offset: torch.Tensor | None = None  # shape: (t,)
    tol: float = 0.0
    max_iter: int = 100
    store_kernel: bool | None = None
    verbose: int = 0

    @property
    def lam(self) -> float:
        return float(self.alpha) / self.W

    @property
    def M(self) -> int:
        return int(self.C.shape[0])

    @property
    def t(self) -> int:
        return int(self.source.n_outputs)

    @property
    def moments(self) -> tuple[float, torch.Tensor, int]:
        """What :func:`source_moments` returned (a solver run from this one skips that pass)."""
        return self.W, self.ysum, self.n_rows


def _require_targets(source: DataSource) -> None:
    if source.n_outputs == 0:
        raise ValueError("the training source has no targets.")


def _resolve_tol(tol: float | None, dtype: torch.dtype, options: Options | None,
                 default: float) -> float:
    """``tol``, else ``options.cg_tol``, else ``DEFAULT_TOL[dtype]`` (``default`` for others)."""
    if tol is None:
        cg_tol = (options or Options()).cg_tol
        tol = DEFAULT_TOL.get(dtype, default) if cg_tol is None else float(cg_tol)
    return float(tol)


def _kernel_caches(source: DataSource, validation: DataSource | None, kernel: Kernel,
                   C: torch.Tensor, *, store_kernel: bool | None, dtype: torch.dtype,
                   options: Options | None, block_size: int | None,
                   verbose: int = 0) -> tuple[Any, Any]:
    """The stored K(X, C) of the training rows (all of the budget with ``store_kernel``, else
    half of it) and, when that stored anything, of the validation rows (a quarter of that)."""
    if store_kernel is False:
        return None, None
    frac = 1.0 if store_kernel else 0.5
    cache = nystrom_kernel_cache(source, kernel, C, dtype=dtype, options=options,
                                 block_size=block_size, fraction=frac, verbose=verbose)
    val_cache = None
    if cache is not None and validation is not None:
        val_cache = nystrom_kernel_cache(validation, kernel, C, dtype=dtype, options=options,
                                         block_size=block_size, fraction=frac / 4)
    return cache, val_cache


def _nystrom_run(source: DataSource, kernel: Kernel, centers: torch.Tensor, alpha: float, *,
                 moments: tuple[float, torch.Tensor, int] | None,
                 validation: DataSource | None, store_kernel: bool | None, dtype: torch.dtype,
                 options: Options | None, block_size: int | None, cache_verbose: int = 0,
                 **settings: Any) -> _NystromRun:
    """The first stage of every Nyström solver: the total weight (one pass unless ``moments``
    are given) and the stored kernel blocks; ``settings`` are the solver's own."""
    C = centers.to(_F64)
    W, ysum, n_rows = moments if moments is not None else source_moments(source,
                                                                          block_size=block_size)
    if not W > 0:
        raise ValueError("the total sample weight must be positive.")
    cache, val_cache = _kernel_caches(source, validation, kernel, C, store_kernel=store_kernel,
                                      dtype=dtype, options=options, block_size=block_size,
                                      verbose=cache_verbose)
    return _NystromRun(source=source, kernel=kernel, C=C, alpha=alpha, W=W, ysum=ysum,
                       n_rows=n_rows, dtype=dtype, options=options, block_size=block_size,
                       validation=validation, cache=cache, val_cache=val_cache,
                       store_kernel=store_kernel, **settings)


@dataclass
class _DirectSolve:
    """One direct solve of (3): a = F beta, its residual of (3), the right-hand side F^T b / W
    and the unwhitened K_nM^T D (y - y_offset), with how it was computed."""

    coef: torch.Tensor  # shape: (M, t)
    beta: torch.Tensor  # shape: (r, t)
    residual: float
    rhs: torch.Tensor  # shape: (r, t)
    b_raw: torch.Tensor  # shape: (M, t)
    wh: _Whitening
    whiten: bool
    dt: torch.dtype
    kcache: Any


def _solve_direct(run: _NystromRun, history: list, whiten: bool | None, dt: torch.dtype,
                  kcache: Any) -> NystromSolution:
    """The direct solve of ``solver="direct"`` with its residual check and fallbacks.

    ``whiten`` None chooses the Gram of the whitened rows when :func:`_squared_gram_error`
    exceeds ``_SQUARED_GRAM_MAX`` (then with float64 kernel values). The residual is
    recomputed from the rows unless the plain Gram is accurate by that bound; when it is far
    above rounding, the solve is repeated from the whitened rows, and a whitened solve is
    refined by float64 CG. ``history`` lists the solvers run before this one.
    """
    s_mm, U_mm = _kmm_eigh(run.kernel, run.C, run.options)
    wh = _whitening(s_mm, U_mm, run.lam, _F64 if whiten is None else dt)
    if whiten is None:
        whiten = _squared_gram_error(wh, run.lam) > _SQUARED_GRAM_MAX
        if whiten and dt != _F64:
            # ill-conditioned: float32 kernel values would leave out the directions that
            # the penalty keeps (1.5 % of the objective at sigma = 10, lambda = 1e-8);
            # float64 values cost one streamed kernel pass, the Gram is float64 anyway
            logger.info("Nystrom direct solve: K_MM is ill-conditioned against the "
                        "penalty, kernel values in float64")
            dt, kcache = _F64, None
        elif dt != _F64:
            wh = _whitening(s_mm, U_mm, run.lam, dt)
    del s_mm, U_mm
    d = _direct_pass(run, wh, whiten, dt, kcache)
    history = history + [("direct", 1)]
    delta = _squared_gram_error(wh, run.lam)
    if delta <= _CHECK_MIN and not whiten:  # accurate by the bound: no check pass
        logger.debug("Nystrom direct solve (plain Gram, error bound %.1e): residual %.2e",
                     delta, d.residual)
        return _direct_solution(run, d, history)
    if _direct_check(run, d):
        return _direct_solution(run, d, history)
    if not whiten:
        return _solve_direct(run, history, True, dt, kcache)
    sol = nystrom_krr(run.source, run.kernel, run.C, run.alpha, y_offset=run.y_offset,
                      coef0=d.coef, max_iter=run.max_iter, tol=run.tol, solver="cg",
                      dtype=_F64, options=run.options, block_size=run.block_size,
                      store_kernel=run.store_kernel if dt == _F64 else False,
                      verbose=run.verbose, moments=run.moments)
    sol.history = history + sol.history
    sol.n_iter = sum(k for _, k in sol.history)
    return sol


def _direct_pass(run: _NystromRun, wh: _Whitening, whiten: bool, dt: torch.dtype,
                 kcache: Any) -> _DirectSolve:
    """The Gram pass over the rows and the dense solve of (3) (:func:`_direct_solve`)."""
    G, b_raw = _gram_pass(run.source, run.kernel, run.C, whiten=wh.F if whiten else None,
                          y_offset=run.y_offset, rhs=True, dtype=dt, options=run.options,
                          block_size=run.block_size, cache=kcache, verbose=run.verbose)
    if b_raw is None:  # pragma: no cover - ``rhs=True`` returns it
        raise RuntimeError("the Gram pass returned no right-hand side.")
    G /= run.W
    S = G if whiten else wh.F.T @ G @ wh.F
    del G
    rhs = wh.F.T @ b_raw / run.W
    coef, beta, res_val = _direct_solve(S, rhs, wh.F, run.lam)
    del S
    if not torch.isfinite(coef).all():
        raise DivergenceError("the direct Nyström solve produced non-finite coefficients.")
    return _DirectSolve(coef=coef, beta=beta, residual=res_val, rhs=rhs, b_raw=b_raw, wh=wh,
                        whiten=whiten, dt=dt, kcache=kcache)


def _direct_check(run: _NystromRun, d: _DirectSolve) -> bool:
    """Whether the residual of (3), recomputed from the rows, is within ``_CHECK_SLACK`` times
    its rounding level or bounds the objective's excess below ``_CHECK_EXCESS``; a
    RuntimeWarning naming the remedy when not."""
    check, level = _gradient_residual(run.source, run.kernel, run.C, d.coef, d.beta, d.wh.F,
                                      d.b_raw, run.lam, run.W, y_offset=run.y_offset,
                                      dtype=d.dt, options=run.options,
                                      block_size=run.block_size, cache=d.kcache,
                                      verbose=run.verbose)
    level = max(level, torch.finfo(_F64).eps)
    rhs, lam, wh = d.rhs, run.lam, d.wh
    excess = float(((check * torch.linalg.vector_norm(rhs, dim=0)) ** 2 / (
        lam * (rhs * d.beta).sum(0).clamp_min(1e-300))).max())
    logger.debug("Nystrom direct solve (%s Gram): residual %.2e, %.2g times the rounding "
                 "level %.1e, objective excess below %.1e", "whitened" if d.whiten else
                 "plain", check, check / level, level, excess)
    if check <= _CHECK_SLACK * level or excess <= _CHECK_EXCESS:
        return True
    remedy = ("solving again from the Gram matrix of the whitened rows" if not d.whiten
              else "refining it by float64 conjugate gradients")
    warn_caller(
        f"the direct Nyström solve left a relative residual {check:.1e}, "
        f"{check / level:.2g} times what rounding allows ({level:.1e}; K_MM's "
        f"eigenvalues span {wh.s_min:.1e} to {wh.s_max:.1e}, penalty alpha / W = "
        f"{lam:.1e}): {remedy}. A larger alpha or fewer centres make the problem "
        f"better conditioned.",
        RuntimeWarning
    )
    return False


def _direct_solution(run: _NystromRun, d: _DirectSolve, history: list) -> NystromSolution:
    return NystromSolution(coef=d.coef, n_iter=sum(k for _, k in history), converged=True,
                           residual_norms=[1.0, d.residual], total_weight=run.W,
                           solver="direct", residual=d.residual, stop_reason="direct",
                           tolerance=run.tol, history=history)


@dataclass
class _CGSystem:
    """What CG solves: ``matvec`` and ``rhs`` of the (preconditioned) system, its start ``x0``
    and ``to_coef``, the map from its unknowns to the coefficients a."""

    matvec: Callable[[torch.Tensor], torch.Tensor]
    rhs: torch.Tensor  # shape: (M, t)
    x0: torch.Tensor | None  # shape: (M, t)
    to_coef: Callable[[torch.Tensor], torch.Tensor]


def _cg_system(run: _NystromRun, preconditioner: bool | NystromPreconditioner,
               coef0: torch.Tensor | None) -> _CGSystem:
    """(1) divided by W, split-preconditioned with B (2) unless ``preconditioner`` is False:
    one pass for b, one streamed product K_nM^T D K_nM per matvec."""
    M, t, lam = run.M, run.t, run.lam
    b = nystrom_rhs(run.source, run.kernel, run.C, y_offset=run.y_offset, dtype=run.dtype,
                    options=run.options, block_size=run.block_size, cache=run.cache) / run.W
    if preconditioner is True:  # K_MM + values_jitter I in (1) with float32 values
        P = nystrom_preconditioner(run.kernel, run.C, lam, options=run.options, dtype=run.dtype,
                                   values_dtype=run.dtype)
    elif preconditioner is False or preconditioner is None:
        P = None
    else:
        P = preconditioner

    normal = normal_product(run)

    def gram(v):
        return normal(v) / run.W

    start = None if coef0 is None else coef0.to(_F64).reshape(M, t)
    if P is not None:
        return _preconditioned_system(P, gram, b, start)
    K_MM = KernelOperator(run.kernel, run.C, options=run.options).to_dense()

    def matvec(a):
        return gram(a) + lam * (K_MM @ a)

    return _CGSystem(matvec=matvec, rhs=b, x0=start, to_coef=lambda a: a)


def _preconditioned_system(P: NystromPreconditioner, gram, b: torch.Tensor,
                           start: torch.Tensor | None) -> _CGSystem:
    """B^T (H / W) B beta = B^T b / W, a = B beta (``gram``: v -> K_nM^T D K_nM v / W)."""
    def matvec(beta):
        u = P.apply(beta)
        return P.system(beta, gram(u), u)

    return _CGSystem(matvec=matvec, rhs=P.apply_t(b),
                     x0=None if start is None else P.inverse(start), to_coef=P.apply)


class _ValidationScore:
    """Validation early stopping of a CG run: ``score`` measures the mean squared error on the
    validation rows, feeds ``monitor`` and keeps the best coefficients in
    ``state["best_coef"]``."""

    run: _NystromRun
    monitor: EarlyStopping
    state: dict[str, Any]

    def score(self, k: int, coef: torch.Tensor) -> bool:
        """Validation MSE of ``coef`` after pass ``k``; True when the monitor stops."""
        run = self.run
        if run.validation is None:  # no validation rows: nothing to stop on
            return False
        mse = nystrom_validation_mse(run.validation, run.kernel, run.C, coef,
                                     y_offset=run.y_offset, dtype=run.dtype,
                                     options=run.options, block_size=run.block_size,
                                     cache=run.val_cache)
        stop = self.monitor.update(k, mse)
        if self.monitor.best_iteration == k:
            self.state["best_coef"] = coef.clone()
        return stop


class _CGMonitor(_ValidationScore):
    """The callback of a Nyström CG run, called after every pass: the change rule
    (:func:`cg_energy_change`), the progress bar, validation early stopping (the best
    coefficients kept), the user's callback and the checkpoint. ``state`` holds the counters
    that a checkpoint stores and the stopping reason; ``cg_state`` CG's own vectors."""

    def __init__(self, run: _NystromRun, system: _CGSystem, *, n_iter_no_change: int,
                 callback, checkpoint: Checkpoint | None, coef0: torch.Tensor | None):
        self.run, self.system, self.callback, self.checkpoint = run, system, callback, checkpoint
        x0, rhs = system.x0, system.rhs
        self.state: dict[str, Any] = {
            "best_coef": None, "early": False, "prev": x0, "small": 0, "reason": "max_iter",
            "t0": time.perf_counter(), "res": [1.0], "steps": deque(maxlen=_CHANGE_WINDOW),
            "res_min": [], "change_min": [], "revised": False,
            "R_prev": rhs if x0 is None else rhs - system.matvec(x0)}
        self.monitor = EarlyStopping(n_iter_no_change=n_iter_no_change)
        self.cg_state: dict[str, Any] = {}
        saved = checkpoint.load(rhs.device) if checkpoint is not None else None
        if saved is not None:
            _restore_cg(saved, self.cg_state, self.state, self.monitor)
        if run.validation is not None and saved is None:
            self.score(0, torch.zeros(run.M, run.t, dtype=_F64) if coef0 is None
                       else coef0.to(_F64).reshape(run.M, run.t))
        # the bar counts this run's passes (a resumed run starts at the checkpoint's pass)
        self.bar = progress(total=run.max_iter - int(self.cg_state.get("k", 0)),
                            desc="Nystrom CG", verbose=run.verbose, unit="pass",
                            upper_bound=True)
        self.r_norm = torch.linalg.vector_norm(rhs, dim=0).clamp_min(1e-300)

    def __call__(self, k: int, X: torch.Tensor, R: torch.Tensor) -> bool:
        state, run = self.state, self.run
        res = float((torch.linalg.vector_norm(R, dim=0) / self.r_norm).max())
        state["res"].append(res)
        change = cg_energy_change(state, X, R, self.system.rhs, run.tol)
        self._report(k, res, change)
        stop = False
        if state["small"] >= 2:
            state["reason"] = "change"
            stop = True
        if run.validation is not None or self.callback is not None:
            coef = self.system.to_coef(X)
            if run.validation is not None and self.score(k, coef):
                state["early"] = True
                state["reason"] = "validation"
                stop = True
            if self.callback is not None and self.callback(k, coef):
                state["reason"] = "callback"
                stop = True
        if self.checkpoint is not None and not stop and res > run.tol:
            # a finished run never resumes
            self.checkpoint.maybe_save(
                lambda: _cg_checkpoint(self.cg_state, state, self.monitor))
        return stop

    def _report(self, k: int, res: float, change: float) -> None:
        """Advance the bar; with ``verbose``, one estimate of the passes left, shown by the bar
        and (``verbose`` > 1) a log line."""
        state, verbose, max_iter = self.state, self.run.verbose, self.run.max_iter
        if not verbose:
            self.bar.update()
            return
        state["res_min"].append(min([res] + state["res_min"][-1:]))
        state["change_min"].append(min([change] + state["change_min"][-1:]))
        left = _passes_left(state["res_min"], state["change_min"], self.run.tol, max_iter - k)
        done = len(state["change_min"])  # passes of this run, this one included
        # max_iter stays a bound until a rate is measured and gives fewer passes
        if state["revised"] or (done >= _RATE_WINDOW // 2 and left < max_iter - k):
            state["revised"] = True
            self.bar.set_total(done + left)
        self.bar.set_postfix(residual=f"{res:.2e}", change=f"{change:.1e}", refresh=False)
        self.bar.update()
        if verbose > 1:
            per_pass = (time.perf_counter() - state["t0"]) / done
            logger.info("Nystrom CG pass %d/%d: residual %.3e, change %.2e, ~%.0f s left",
                        k, max_iter, res, change, per_pass * left)


def _cg_solution(run: _NystromRun, res: SolveResult, coef: torch.Tensor,
                 best_coef: torch.Tensor | None, monitor: EarlyStopping, reason: str, *,
                 stopped_early: bool, solver: str, log: logging.Logger) -> NystromSolution:
    """The result of a CG run (``solver`` "cg" or "eigen_cg"): ``coef`` from its last iterate,
    or the best on the validation rows."""
    best_iter = res.n_iter
    if run.validation is not None and best_coef is not None:
        coef, best_iter = best_coef, monitor.best_iteration
    name = "CG" if solver == "cg" else "eigen-CG"
    if not torch.isfinite(coef).all():
        raise DivergenceError(f"Nyström {name} produced non-finite coefficients.")
    log.debug("Nystrom %s: %d iterations, residual %.3g, stopped by %s", name, res.n_iter,
              res.residual_norms[-1], reason)
    return NystromSolution(coef=coef, n_iter=res.n_iter,
                           converged=res.converged or reason == "change",
                           residual_norms=res.residual_norms, validation_mse=monitor.losses,
                           best_iter=best_iter, total_weight=run.W, stopped_early=stopped_early,
                           solver=solver, residual=float(res.residual_norms[-1]),
                           stop_reason=reason, tolerance=run.tol,
                           history=[(solver, res.n_iter)])


def warn_breakdown(name: str, res: SolveResult, kept: float, remedy: str) -> None:
    """The one warning of a Nyström CG run that broke down (``res.breakdown``, or a residual
    grown tenfold): ``kept`` is the relative residual of the coefficients returned."""
    warn_caller(f"Nystrom {name} broke down after {res.n_iter} passes: rounding in the "
                f"products made the system indefinite (relative residual "
                f"{res.residual_norms[-1]:.3g}); the coefficients returned, not converged, have "
                f"relative residual {kept:.3g}. To fix it, {remedy}.",
                SolverConvergenceWarning)


def cg_energy_change(state: dict, X: torch.Tensor, R: torch.Tensor, rhs: torch.Tensor,
                     tol: float) -> float:
    """Estimated relative error of a CG iterate in the energy norm, for the stopping rule.

    The energy of a step is ||dx||_A^2 = dx^T (r_prev - r) (A dx = r_prev - r: no product with
    A); the sum over the last ``state["steps"]`` (a bounded deque) estimates ||x* - x||_A^2 from
    below (Hestenes-Stiefel) and is compared with the energy x^T b of the iterate. Updates
    ``state``'s ``prev``, ``R_prev`` and ``small`` (consecutive passes at or below ``tol``).
    """
    dx = X if state["prev"] is None else X - state["prev"]
    steps = state["steps"]
    steps.append((dx * (state["R_prev"] - R)).sum(0).clamp_min(0))
    energy = (X * rhs).sum(0).abs().clamp_min(1e-300)
    change = float((torch.stack(tuple(steps)).sum(0) / energy).sqrt().max())
    state["prev"], state["R_prev"] = X.clone(), R.clone()
    state["small"] = state["small"] + 1 if change <= tol else 0
    return change


def _passes_left(res_min: list, change_min: list, tol: float, cap: int) -> int:
    """CG passes until a stopping rule of :func:`nystrom_krr` holds, at the recent geometric
    rates (:func:`steps_to_reach`, over ``_RATE_WINDOW`` passes) of the running minima of the
    relative residual and of the change; the change must stay below ``tol`` for two passes.

    The residual of preconditioned CG oscillates: from its raw rate over five passes, the
    expected count moved by a median 3-35 % of the run from one pass to the next and up to
    4.9x (5 runs of 33-207 passes, n = 4000-6000, M = 300-1000); from the running minima over
    ten passes, by 1-4 % and at most 1.33x, 0-25 % from the final count (raw rate: 3-29 %).
    """
    by_res = steps_to_reach(res_min, tol, cap=cap, window=_RATE_WINDOW)
    by_change = steps_to_reach(change_min, tol, cap=cap, window=_RATE_WINDOW) + 1
    return min(cap, by_res, by_change)


_CG_RUN_KEYS = ("best_coef", "early", "prev", "small", "reason", "res", "R_prev")


def _cg_checkpoint(cg_state: dict, state: dict, monitor: EarlyStopping) -> dict:
    """What a resumed CG run needs: the CG vectors and scalars, the stopping counters."""
    return {"cg": dict(cg_state), "run": {k: state[k] for k in _CG_RUN_KEYS},
            "steps": list(state["steps"]), "monitor": monitor_state(monitor)}


def _restore_cg(saved: dict, cg_state: dict, state: dict, monitor: EarlyStopping) -> None:
    cg_state.update(saved["cg"])
    state.update({k: saved["run"][k] for k in _CG_RUN_KEYS})
    state["steps"].extend(saved["steps"])
    restore_monitor(monitor, saved["monitor"])
    logger.info("Nystrom CG: resuming from a checkpoint at pass %d", cg_state["k"])
