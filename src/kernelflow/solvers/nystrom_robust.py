"""Robust and early-stopped gradient methods in a Nyström feature space, streamed over row blocks.

With M centres C and K_MM = L L^T, the Nyström features are phi(x) = K(x, C) L^{-T}, so the
Nyström kernel is phi(x)^T phi(x') = K(x, C) K_MM^{-1} K(C, x'). Writing f(x) = phi(x)^T beta + b,
the methods minimise

    J(beta, b) = (1/W) sum_i w_i rho(y_i - f(x_i)) + (lam / 2) ||beta||^2,   lam = alpha / W,  (1)

by (sub)gradient descent on beta (and b), reading the rows through a
:class:`kernelflow.sources.DataSource` once per iteration. The losses rho are

* ``"absolute"``: rho(r) = |r|, psi(r) = sign(r) (with sign(0) = 0). Gradient descent on the
  absolute loss in feature space is exactly kernel sign-gradient descent
  a_{k+1} = a_k + eta' sign(y - K~ a_k) with the Nyström kernel K~ and beta = Phi^T a (Allerbo,
  Prop. 5.2; eq. 14/24 with lam = 0): least absolute deviations, robust to gross outliers;
* ``"huber"``: rho(r) = r^2/2 for |r| <= delta, delta |r| - delta^2/2 beyond,
  psi = clip(r, -delta, delta);
* ``"squared"``: rho(r) = r^2/2, psi(r) = r; with early stopping this is kernel gradient descent,
  and run to convergence it solves Nyström kernel ridge regression.

Each iteration takes the step beta <- beta - eta * grad J, whose data part is
-(1/W) L^{-1} K_nM^T D psi(r): one streamed pass, O(n M (d + 2t)).

Preconditioning (default): in the coordinates theta of Falkon's preconditioner B (see
:mod:`kernelflow.solvers.nystrom`), a = B theta, the squared-loss Hessian is close to the identity
in the directions whose kernel eigenvalues exceed the preconditioner's lambda (floored at
``precond_lam``), so a unit step converges there in a few passes; without it
(``preconditioned=False``) the iteration is the textbook one above, slow in the directions of
small kernel eigenvalues (which is what early stopping uses as regularisation). Both parametrise
the same Nyström span.

Step sizes: a float ``learning_rate`` is used as is (the paper's constant step). ``"auto"`` starts
at 1 (squared/Huber; the feature-space Hessian is at most max_x k(x, x) = 1 for normalised
kernels) or at half the robust scale of y (absolute loss, where eta is the size of the change of f
per step), and halves the step whenever the objective (1) increases, undoing that step.

The Huber threshold is delta = epsilon * 1.4826 * median |r| (a robust scale of the residuals),
re-estimated after iterations 3, 10 and 30 from a histogram of |r| gathered during the passes
(all-reduced, so every process of a data-parallel run gets the same delta).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..collectives import all_reduce_sum
from ..kernels import Kernel
from ..linalg import cholesky
from ..operators import DenseOperator, KernelOperator, Options
from ..sources import DataSource
from ..utils._finite import DivergenceError
from ..utils._progress import progress, steps_to_reach
from ..utils.checkpoint import Checkpoint, monitor_state, restore_monitor
from ..utils.monitor import EarlyStopping
from .losses import RESIDUAL_LOSSES, get_residual_loss
from .nystrom import (
    NystromPreconditioner,
    _kernel_blocks,
    _nystrom_run,
    _NystromRun,
    _require_targets,
    _stored_block,
    nystrom_preconditioner,
)

__all__ = ["LOSSES", "LossPass", "RobustSolution", "nystrom_loss_pass", "nystrom_robust"]

logger = logging.getLogger(__name__)

LOSSES = tuple(RESIDUAL_LOSSES)
_F64 = torch.float64
# |r| histogram: log-spaced bins from 1e-12 to 1e12 (4.7 % wide): robust scales without sorting.
_EDGES = torch.logspace(-12, 12, 1201, dtype=_F64)
_RESCALE_AT = (3, 10, 30)
_SMOOTH = 10  # steps over which the progress estimate averages the decrease


def _psi_rho(loss: str, r: torch.Tensor, delta: float | None):
    lf = get_residual_loss(loss)
    return lf.psi(r, delta), lf.rho(r, delta)


class LossPass(NamedTuple):
    """Sums from one pass: ``grad`` = K_nM^T D psi(r) (M, t), ``psi_sum`` = sum w psi(r) (t,),
    ``loss_sum`` = sum w rho(r) (t,), ``weight`` = sum w, ``hist`` weights of |r| per bin (t, bins).
    """

    grad: torch.Tensor
    psi_sum: torch.Tensor
    loss_sum: torch.Tensor
    weight: float
    hist: torch.Tensor


def nystrom_loss_pass(
    source: DataSource,
    kernel: Kernel,
    centers: torch.Tensor,  # shape: (M, d)
    coef: torch.Tensor,  # shape: (M, t)
    intercept: torch.Tensor,  # shape: (t,)
    loss: str,
    *,
    delta: float | None = None,
    with_grad: bool = True,
    dtype: torch.dtype = _F64,
    options: Options | None = None,
    block_size: int | None = None,
    cache=None,
) -> LossPass:
    """One streamed pass: residuals r = y - K(X, C) coef - intercept, the loss and its gradient.

    Each block's kernel tile is computed once and used for the prediction and for K^T D psi(r)
    (or taken from ``cache``, see :func:`kernelflow.solvers.nystrom.nystrom_kernel_cache`);
    all sums are all-reduced. Cost O(n M (d + 2t)).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> X = torch.linspace(0, 1, 20, dtype=torch.float64).reshape(-1, 1)
    >>> y = torch.ones(20, dtype=torch.float64)
    >>> out = nystrom_loss_pass(ArraySource(X, y), Gaussian(0.3), X[:4],
    ...                         torch.zeros(4, 1, dtype=torch.float64),
    ...                         torch.zeros(1, dtype=torch.float64), "absolute")
    >>> float(out.loss_sum[0]), float(out.psi_sum[0])
    (20.0, 20.0)
    """
    get_residual_loss(loss)  # a ValueError naming the choices
    C = centers.to(dtype)
    M, t = C.shape[0], coef.shape[1]
    item = torch.empty((), dtype=dtype).element_size()
    tile = max(1, (options or Options()).tile_size(item) // max(M, 1))
    grad = torch.zeros(M, t, dtype=_F64)
    psi_sum = torch.zeros(t, dtype=_F64)
    loss_sum = torch.zeros(t, dtype=_F64)
    hist = torch.zeros(t, len(_EDGES) + 1, dtype=_F64)
    weight = torch.zeros(1, dtype=_F64)
    coef = coef.to(_F64)
    for op, b in _kernel_blocks(source, kernel, C, dtype, options, block_size, cache):
        stored = isinstance(op, DenseOperator)
        step = b.X.shape[0] if stored else tile
        for i0 in range(0, b.X.shape[0], step):
            i1 = min(i0 + step, b.X.shape[0])
            blk = op if stored else _stored_block(op.rows(torch.arange(i0, i1)))
            r = b.y[i0:i1].to(_F64) - blk.matmul(coef) - intercept
            psi, rho = _psi_rho(loss, r, delta)
            w = None if b.sample_weight is None else b.sample_weight[i0:i1].to(_F64)
            if w is not None:
                psi = psi * w.reshape(-1, 1)
                rho = rho * w.reshape(-1, 1)
            if with_grad:
                grad += blk.t_matmul(psi)
            psi_sum += psi.sum(0)
            loss_sum += rho.sum(0)
            weight += (i1 - i0) if w is None else w.sum()
            idx = torch.bucketize(r.abs().T.contiguous(), _EDGES)
            hist.scatter_add_(1, idx, (torch.ones_like(r) if w is None
                                       else w.reshape(-1, 1).expand_as(r)).T.contiguous())
    packed = all_reduce_sum(torch.cat([grad.reshape(-1), psi_sum, loss_sum, weight,
                                       hist.reshape(-1)]))
    o = M * t
    return LossPass(grad=packed[:o].reshape(M, t), psi_sum=packed[o:o + t],
                    loss_sum=packed[o + t:o + 2 * t], weight=float(packed[o + 2 * t]),
                    hist=packed[o + 2 * t + 1:].reshape(t, -1))


def _median_abs(hist: torch.Tensor) -> torch.Tensor:  # (t, bins) -> (t,)
    cum = hist.cumsum(1)
    k = (cum < 0.5 * cum[:, -1:]).sum(1).clamp(1, len(_EDGES) - 1)
    return (_EDGES[k - 1] * _EDGES[k]).sqrt()


class _PlainCoordinates:
    """beta coordinates: a = L^{-T} beta, penalty (lam/2)||beta||^2 (Nyström features)."""

    def __init__(self, L, lam):
        self.L, self.lam = L, lam

    def apply(self, beta):
        return torch.linalg.solve_triangular(self.L.T, beta, upper=True)

    def apply_t(self, g):
        return torch.linalg.solve_triangular(self.L, g, upper=False)

    def inverse(self, a):
        return self.L.T @ a

    def penalty(self, beta):  # (value (t,), gradient (M, t))
        return 0.5 * self.lam * (beta * beta).sum(0), self.lam * beta


class _PreconditionedCoordinates(_PlainCoordinates):
    """theta coordinates of Falkon's preconditioner: a = B theta, a^T K_MM a = ||R^-T theta||^2."""

    def __init__(self, P: NystromPreconditioner, lam):
        self.P, self.lam = P, lam

    def apply(self, theta):
        return self.P.apply(theta)

    def apply_t(self, g):
        return self.P.apply_t(g)

    def inverse(self, a):
        return self.P.inverse(a)

    def penalty(self, theta):
        u = torch.linalg.solve_triangular(self.P.R.T, theta, upper=True)
        return 0.5 * self.lam * (u * u).sum(0), self.lam * torch.linalg.solve_triangular(
            self.P.R, u, upper=False)


@dataclass
class RobustSolution:
    """Result of :func:`nystrom_robust`: ``coef`` (M, t) and ``intercept`` (t,) of
    f(x) = K(x, C) coef + intercept, objective values per iteration, validation losses (iteration
    0 first) and the final step size and Huber threshold."""

    coef: torch.Tensor
    intercept: torch.Tensor
    n_iter: int
    converged: bool
    objective: list = field(default_factory=list)
    validation_loss: list = field(default_factory=list)
    best_iter: int = 0
    learning_rate: float = 0.0
    delta: float | None = None
    stopped_early: bool = False


def nystrom_robust(
    source: DataSource,
    kernel: Kernel,
    centers: torch.Tensor,  # shape: (M, d)
    *,
    loss: str = "absolute",
    alpha: float = 0.0,
    epsilon: float = 1.345,
    delta: float | None = None,
    learning_rate: float | str = "auto",
    max_iter: int = 100,
    tol: float = 1e-6,
    preconditioned: bool = True,
    precond_lam: float = 1e-3,
    fit_intercept: bool = True,
    coef0: torch.Tensor | None = None,  # shape: (M, t)
    intercept0: torch.Tensor | None = None,  # shape: (t,)
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
) -> RobustSolution:
    """Minimise the Nyström objective (1) by streamed (sign-)gradient descent.

    Parameters
    ----------
    source : DataSource
        Training rows with targets; read once per iteration.
    kernel : Kernel
    centers : tensor of shape (M, d)
    loss : {"absolute", "huber", "squared"}, default="absolute"
    alpha : float, default=0.0
        Ridge penalty on scikit-learn's scale (lam = alpha / W); 0 leaves regularisation to early
        stopping.
    epsilon : float, default=1.345
        Huber threshold in robust-scale units (ignored unless ``loss="huber"``).
    delta : float, optional
        Fixed Huber threshold (overrides ``epsilon``).
    learning_rate : float or "auto", default="auto"
        Constant step, or the adaptive rule of the module docstring.
    max_iter : int, default=100
    tol : float, default=1e-6
        Stop when an accepted step lowers the objective by less than ``tol`` times its starting
        value (or, adaptive steps only, when the step falls below ``tol`` times the scale of y).
    preconditioned : bool, default=True
        Descend in the coordinates of Falkon's preconditioner (built with max(lam, precond_lam)).
    precond_lam : float, default=1e-3
        Floor of the preconditioner's lambda. With a tiny lambda and few centres the
        preconditioned Hessian can have eigenvalues far above 1 and unit steps diverge; the
        floor keeps them near 1, and directions below it are left to early stopping.
    fit_intercept : bool, default=True
        Learn an unpenalised intercept b (started at the weighted median of y for robust losses).
    coef0, intercept0 : tensors, optional
        Warm start.
    validation : DataSource, optional
        Rows on which the mean loss is measured after each iteration; the best iterate is kept and
        the run stops after ``n_iter_no_change`` iterations without improvement.
    dtype : torch.dtype, default=float64
        Precision of the kernel tiles.
    store_kernel : bool or None, default=None
        Keep K(X, C) in memory between passes; None does so when it takes at most half of the
        memory budget, False always streams.
    callback : callable, optional
        ``callback(k, coef, intercept)`` after each iteration; returning True stops.
    checkpoint : Checkpoint, optional
        The iterate, intercept, step size, Huber threshold, objective history and validation
        monitor, written every ``checkpoint.interval`` seconds after an iteration; a run given a
        checkpoint holding such a state continues from it and takes the steps the interrupted
        run would have taken (after its two setup passes, which are repeated).
    verbose : int, default=0
        > 0 shows progress over passes (:func:`kernelflow.utils.progress.progress`): at most
        ``max_iter``; with the adaptive step, the passes expected until the decrease falls
        below ``tol`` at its recent rate.
    moments : tuple (float, tensor of shape (t,), int), optional
        :func:`~kernelflow.solvers.nystrom.source_moments` of ``source`` (total weight, weighted
        target sum, row count), when the caller already has them: that pass is then skipped.

    Returns
    -------
    RobustSolution

    Notes
    -----
    Cost O(n M (d + 2t)) per iteration plus O(M^3) setup; memory O(M^2) plus one block.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(400, 1, dtype=torch.float64, generator=g)
    >>> y = torch.sin(6 * X[:, 0])
    >>> y[::20] += 50.0                                   # 5 % gross outliers
    >>> sol = nystrom_robust(ArraySource(X, y), Gaussian(0.2), X[:40], loss="absolute",
    ...                      max_iter=60)
    >>> f = Gaussian(0.2)(X, X[:40]) @ sol.coef[:, 0] + sol.intercept
    >>> bool((f - torch.sin(6 * X[:, 0])).abs().median() < 0.05)
    True
    """
    get_residual_loss(loss)  # a ValueError naming the choices
    _require_targets(source)
    run = _nystrom_run(source, kernel, centers, alpha, moments=moments, validation=validation,
                       store_kernel=store_kernel, dtype=dtype, options=options,
                       block_size=block_size)
    fn = _RobustObjective(run, _coordinates(run, preconditioned, precond_lam), loss,
                          fit_intercept=fit_intercept, epsilon=epsilon, delta=delta)
    M, t = run.M, run.t
    theta = torch.zeros(M, t, dtype=_F64) if coef0 is None else fn.coords.inverse(
        coef0.to(_F64).reshape(M, t))
    b = _initial_intercept(run, loss, fit_intercept, intercept0)
    b0 = b.clone()
    saved = checkpoint.load(theta.device) if checkpoint is not None else None
    it = _start(fn, theta, b, learning_rate=learning_rate, n_iter_no_change=n_iter_no_change)
    if saved is not None:
        it.restore(saved)
    _descend(fn, it, max_iter=max_iter, tol=tol, callback=callback, checkpoint=checkpoint,
             verbose=verbose)
    theta, b = (it.best["theta"], it.best["b"]) if validation is not None else (it.theta, it.b)
    coef = fn.coords.apply(theta)
    if not (torch.isfinite(coef).all() and torch.isfinite(b).all()):
        raise DivergenceError("Nyström gradient descent produced non-finite coefficients.")
    if not fit_intercept:
        b = b0 * 0
    return RobustSolution(coef=coef, intercept=b, n_iter=it.k, converged=it.converged,
                          objective=it.objective, validation_loss=it.vals,
                          best_iter=it.monitor.best_iteration if validation is not None else it.k,
                          learning_rate=it.eta, delta=it.delta, stopped_early=it.early)


# ---- the stages of the descent ------------------------------------------------------------------
def _coordinates(run: _NystromRun, preconditioned: bool, precond_lam: float
                 ) -> _PlainCoordinates:
    """The coordinates of the descent: Falkon's preconditioner (lambda floored at
    ``precond_lam``) or the Nyström features (K_MM's Cholesky factor)."""
    lam = run.lam
    if preconditioned:
        return _PreconditionedCoordinates(
            nystrom_preconditioner(run.kernel, run.C, max(lam, precond_lam),
                                   options=run.options), lam)
    L, _ = cholesky(KernelOperator(run.kernel, run.C, options=run.options).to_dense(),
                    warn=False)
    return _PlainCoordinates(L, lam)


def _initial_intercept(run: _NystromRun, loss: str, fit_intercept: bool,
                       intercept0: torch.Tensor | None) -> torch.Tensor:  # shape: (t,)
    """``intercept0``, else the weighted mean (squared loss) or median of y, else 0."""
    t = run.t
    if intercept0 is not None:
        return intercept0.to(_F64).reshape(t).clone()
    if fit_intercept and loss == "squared":
        return run.ysum / run.W
    if fit_intercept:  # the |y - 0| histogram is not signed: the median takes its own pass
        return _weighted_median(run.source, t, run.block_size)
    return torch.zeros(t, dtype=_F64)


class _RobustObjective:
    """The objective (1) in the descent's coordinates: its value and gradient from one pass
    over the training rows, the mean loss on the validation rows, the loss's settings."""

    def __init__(self, run: _NystromRun, coords: _PlainCoordinates, loss: str, *,
                 fit_intercept: bool, epsilon: float, delta: float | None):
        self.run, self.coords, self.loss = run, coords, loss
        self.fit_intercept, self.epsilon, self.delta = fit_intercept, epsilon, delta

    def loss_pass(self, source: DataSource, theta: torch.Tensor, b: torch.Tensor, loss: str,
                  delta: float | None, *, cache, with_grad: bool = True) -> LossPass:
        run = self.run
        return nystrom_loss_pass(source, run.kernel, run.C, self.coords.apply(theta), b, loss,
                                 delta=delta, with_grad=with_grad, dtype=run.dtype,
                                 options=run.options, block_size=run.block_size, cache=cache)

    def evaluate(self, theta: torch.Tensor, b: torch.Tensor, delta: float | None):
        """(objective (t,), gradient in theta, gradient in b, the pass's sums)."""
        run = self.run
        p = self.loss_pass(run.source, theta, b, self.loss, delta, cache=run.cache)
        pen, pen_grad = self.coords.penalty(theta)
        obj = p.loss_sum / run.W + pen
        g = -self.coords.apply_t(p.grad / run.W) + pen_grad
        gb = -p.psi_sum / run.W if self.fit_intercept else torch.zeros(run.t, dtype=_F64)
        return obj, g, gb, p

    def val_loss(self, theta: torch.Tensor, b: torch.Tensor, delta: float | None) -> float:
        """Mean loss on the validation rows."""
        run = self.run
        if run.validation is None:
            raise ValueError("no validation rows to measure the loss on.")
        p = self.loss_pass(run.validation, theta, b, self.loss, delta, cache=run.val_cache,
                           with_grad=False)
        return float((p.loss_sum / max(p.weight, 1e-300)).mean())


@dataclass
class _Descent:
    """The state of the descent: what a checkpoint holds (:meth:`snapshot`), the scale of y
    that sizes the adaptive step, and how the run stopped."""

    theta: torch.Tensor
    b: torch.Tensor
    obj: torch.Tensor
    g: torch.Tensor
    gb: torch.Tensor
    eta: float
    delta: float | None
    scale: float
    auto: bool
    monitor: EarlyStopping
    objective: list[float]
    best: dict[str, torch.Tensor]
    vals: list[float] = field(default_factory=list)
    rels: list[float] = field(default_factory=list)  # mean decreases per step (progress)
    k: int = 0
    converged: bool = False
    early: bool = False

    def snapshot(self) -> dict[str, Any]:
        return {"theta": self.theta, "b": self.b, "obj": self.obj, "g": self.g, "gb": self.gb,
                "eta": self.eta, "delta": self.delta, "k": self.k, "objective": self.objective,
                "vals": self.vals, "rels": self.rels, "best": self.best,
                "monitor": monitor_state(self.monitor)}

    def restore(self, saved: dict[str, Any]) -> None:
        self.theta, self.b, self.obj, self.g, self.gb = (
            saved[key] for key in ("theta", "b", "obj", "g", "gb"))
        self.eta, self.delta, self.k = saved["eta"], saved["delta"], saved["k"]
        self.objective, self.vals, self.rels = saved["objective"], saved["vals"], saved["rels"]
        self.best.update(saved["best"])
        restore_monitor(self.monitor, saved["monitor"])


def _start(fn: _RobustObjective, theta: torch.Tensor, b: torch.Tensor, *,
           learning_rate: float | str, n_iter_no_change: int) -> _Descent:
    """The robust scale of y - b (one pass: the absolute loss's first step and the Huber
    threshold), the first step size, and the objective (and validation loss) at the start."""
    run, loss = fn.run, fn.loss
    p0 = fn.loss_pass(run.source, theta, b, "absolute", None, cache=run.cache, with_grad=False)
    scale = float(1.4826 * _median_abs(p0.hist).max())
    scale = scale if scale > 0 else 1.0
    delta = float(fn.delta) if fn.delta is not None else (
        fn.epsilon * scale if loss == "huber" else None)
    auto = learning_rate == "auto"
    eta = (0.5 * scale if loss == "absolute" else 1.0) if auto else float(learning_rate)
    obj, g, gb, _ = fn.evaluate(theta, b, delta)
    it = _Descent(theta=theta, b=b, obj=obj, g=g, gb=gb, eta=eta, delta=delta, scale=scale,
                  auto=auto, monitor=EarlyStopping(n_iter_no_change=n_iter_no_change),
                  objective=[float(obj.sum())], best={"theta": theta.clone(), "b": b.clone()})
    if run.validation is not None:
        it.vals.append(fn.val_loss(theta, b, delta))
        it.monitor.update(0, it.vals[-1])
    return it


def _descend(fn: _RobustObjective, it: _Descent, *, max_iter: int, tol: float, callback,
             checkpoint: Checkpoint | None, verbose: int) -> None:
    """Gradient steps until ``max_iter`` or a stopping rule (:func:`_stops`); the adaptive step
    halves, and the step is undone, whenever the objective increases."""
    with progress(total=max_iter, desc=f"Nystrom {fn.loss}", verbose=verbose,
                  upper_bound=True) as bar:
        while it.k < max_iter:
            new_theta, new_b = it.theta - it.eta * it.g, it.b - it.eta * it.gb
            new_obj, new_g, new_gb, p = fn.evaluate(new_theta, new_b, it.delta)
            if it.auto and float(new_obj.sum()) > it.objective[-1] and it.eta > 1e-12 * it.scale:
                it.eta *= 0.5  # undo: the objective went up
                continue
            it.k += 1
            bar.update()
            # decrease relative to the starting objective: an exact fit (objective -> 0) stops
            rel = (it.objective[-1] - float(new_obj.sum())) / max(abs(it.objective[0]), 1e-300)
            it.theta, it.b, it.obj, it.g, it.gb = new_theta, new_b, new_obj, new_g, new_gb
            it.objective.append(float(it.obj.sum()))
            if it.auto and not bar.disable and len(it.objective) > _SMOOTH:
                # steps until the decrease per step, averaged over the last _SMOOTH (a single
                # step's is noisy), falls below tol at its recent rate
                it.rels.append(max(it.objective[-1 - _SMOOTH] - it.objective[-1], 0.0)
                               / (_SMOOTH * max(abs(it.objective[0]), 1e-300)))
                bar.set_total(it.k + steps_to_reach(it.rels, tol, cap=max_iter - it.k,
                                                    window=_SMOOTH))
            if not math.isfinite(it.objective[-1]):
                raise DivergenceError("Nyström gradient descent diverged; lower learning_rate.")
            if fn.loss == "huber" and fn.delta is None and it.k in _RESCALE_AT:
                it.delta = float(fn.epsilon * 1.4826 * _median_abs(p.hist).max()) or it.delta
                it.obj, it.g, it.gb, p = fn.evaluate(it.theta, it.b, it.delta)
                it.objective[-1] = float(it.obj.sum())
            if _stops(fn, it, rel, tol, callback):
                break
            if checkpoint is not None:
                checkpoint.maybe_save(it.snapshot)


def _stops(fn: _RobustObjective, it: _Descent, rel: float, tol: float, callback) -> bool:
    """After step ``it.k``: validation early stopping (the best iterate kept), the user's
    callback, and (adaptive steps) a relative decrease below ``tol`` or a vanishing step."""
    if fn.run.validation is not None:
        it.vals.append(fn.val_loss(it.theta, it.b, it.delta))
        stop = it.monitor.update(it.k, it.vals[-1])
        if it.monitor.best_iteration == it.k:
            it.best.update(theta=it.theta.clone(), b=it.b.clone())
        if stop:
            it.early = True
            return True
    if callback is not None and callback(it.k, fn.coords.apply(it.theta), it.b):
        return True
    if it.auto and (0 <= rel < tol or it.eta < tol * it.scale):
        it.converged = True
        return True
    return False


def _weighted_median(source: DataSource, t: int, block_size) -> torch.Tensor:
    """Weighted median of each target column (two histogram passes: sign split of |y|)."""
    pos = torch.zeros(t, len(_EDGES) + 1, dtype=_F64)
    neg = torch.zeros_like(pos)
    for blk in source.iter_blocks(block_size or 65536, dtype=_F64):
        y = blk.y
        if y is None:
            raise ValueError("the training source has no targets.")
        w = torch.ones(y.shape[0], dtype=_F64) if blk.sample_weight is None else blk.sample_weight
        ww = w.reshape(-1, 1).expand_as(y)
        idx = torch.bucketize(y.abs().T.contiguous(), _EDGES)
        pos.scatter_add_(1, idx, (ww * (y >= 0)).T.contiguous())
        neg.scatter_add_(1, idx, (ww * (y < 0)).T.contiguous())
    both = all_reduce_sum(torch.stack([pos, neg]))
    pos, neg = both[0], both[1]
    mids = torch.cat([_EDGES[:1] * 0.5, (_EDGES[:-1] * _EDGES[1:]).sqrt(), _EDGES[-1:] * 2])
    # Values in ascending order: negatives (largest |y| first), then positives.
    vals = torch.cat([-mids.flip(0), mids])
    out = torch.empty(t, dtype=_F64)
    for j in range(t):
        wts = torch.cat([neg[j].flip(0), pos[j]])
        cum = wts.cumsum(0)
        out[j] = vals[int((cum < 0.5 * cum[-1]).sum())]
    return out
