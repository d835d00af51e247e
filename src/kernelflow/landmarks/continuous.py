"""Continuous landmark selection (Mathur, Moka and Botev, Algorithm 1) and its k search.

The binary selection ``s`` is relaxed to ``t in [0, 1]^n`` (see
:mod:`kernelflow.landmarks._relaxation`), reparametrised as ``t = 1 - exp(-w^2)``
(paper §3.1) and optimised from ``t0 = 1/2`` with stochastic gradients built from
Rademacher vectors and conjugate-gradient solves (Lemmas 3.1 and 3.2). Coordinates with
``t_j < eps`` are set to zero for good (§3.4), which shrinks every solve to the active set.
The result is ``s_j = 1(t*_j > tau)``.

Algorithm 1 returns whatever subset size its ``lam`` gives. To hit a requested ``k``,
:func:`search_lambda` searches ``lam`` (secant steps in ``log lam`` against ``log |s|``,
safeguarded by bisection). When the search budget ends without an exact hit, the
documented fallback (not in the paper) keeps the ``k`` largest ``t*`` of the smallest run
that selected more than ``k``; if no run selected ``k`` or more, the largest run is
completed by greedy pivoted-Cholesky steps on the residual diagonal.

Defaults not given by the paper are those of the COMBSS reference code (Adam with
learning rate 0.1, ``tau = 0.5``, ``eps = 1e-3``); ``delta = 1`` and ``M = 10`` follow
the paper.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ._access import DenseGram, FeatureGram, GramAccess, KernelGram, as_tensor, check_k
from ._base import LandmarkSelector, Param, Selection, _generator, check_points
from ._relaxation import (
    frobenius_gradient,
    rademacher,
    stochastic_gradient,
    t_from_w,
    trace_gradient,
    w_from_t,
)

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..operators import Options
    from ..typing import ArrayLike

logger = logging.getLogger(__name__)

__all__ = [
    "ContinuousResult",
    "ContinuousSelector",
    "continuous_column_subset",
    "continuous_landmarks",
    "search_lambda",
]

# t is kept below 1 - 1e-5 so that L_t keeps a ridge of at least about 2e-5 delta (CG and
# Cholesky stay well posed even when the selected block of K is numerically singular)
_W_MAX = math.sqrt(-math.log(1e-5))


@dataclass
class ContinuousResult:
    """Outcome of one run of Algorithm 1 (or of the k search).

    Attributes
    ----------
    support : tensor of int64
        Selected indices ``{j : t*_j > tau}`` (or the k-targeted set).
    t : tensor of shape (n,)
        Final relaxed weights ``t*``.
    lam : float
        Penalty used.
    n_iter : int
        Optimiser iterations.
    converged : bool
        Whether the termination test on ``max |dt|`` held before ``max_iter``.
    loss_history : list of float
        Unbiased estimate of the unpenalised loss at each iteration.
    path : tensor of shape (n_iter + 1, n) or None
        The ``t`` trajectory when ``record_path=True`` (paper Figure 1).
    n_matvec : int
        Products with ``L_t`` done by conjugate gradients (one per right-hand side).
    n_cg_iter : int
        Conjugate-gradient iterations, summed over the solves (each solve is a batch of
        ``M`` right-hand sides).
    method : str
        ``"threshold"`` (Algorithm 1), ``"top-k"`` or ``"completed"`` (fallbacks).
    probes : list of (float, int)
        The ``(lam, |s|)`` pairs tried by the search.
    """

    support: torch.Tensor
    t: torch.Tensor
    lam: float
    n_iter: int = 0
    converged: bool = False
    loss_history: list[float] = field(default_factory=list)
    path: torch.Tensor | None = None
    n_matvec: int = 0
    n_cg_iter: int = 0
    method: str = "threshold"
    probes: list[tuple[float, int]] = field(default_factory=list)


def _as_gram(K_or_gram: ArrayLike | GramAccess) -> GramAccess:
    if isinstance(K_or_gram, GramAccess):
        return K_or_gram
    return DenseGram(K_or_gram)


def _check_options(loss, gradient, solver, optimizer, delta, t0, threshold,
                   preconditioner) -> None:
    if loss not in ("frobenius", "trace"):
        raise ValueError(f"loss must be 'frobenius' or 'trace', got {loss!r}")
    if gradient not in ("stochastic", "exact"):
        raise ValueError(f"gradient must be 'stochastic' or 'exact', got {gradient!r}")
    if solver not in ("auto", "cg", "cholesky"):
        raise ValueError(f"solver must be 'auto', 'cg' or 'cholesky', got {solver!r}")
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta}")
    if not 0 < t0 < 1:
        raise ValueError(f"t0 must lie in (0, 1), got {t0}")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must lie in [0, 1), got {threshold}")
    if preconditioner not in ("jacobi", "cholesky"):
        raise ValueError(f"preconditioner must be 'jacobi' or 'cholesky', got "
                         f"{preconditioner!r}")


def _starting_weights(n: int, t0: float, active, dtype,
                      dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, active columns): every ``w_j`` at ``t0``, the inactive ones at 0 (absorbing)."""
    w = torch.full((n,), float(w_from_t(t0)), dtype=dtype, device=dev)
    if active is None:
        return w, torch.arange(n, device=dev)
    active = torch.as_tensor(active, dtype=torch.long, device=dev).flatten()
    if active.numel() and not (0 <= int(active.min()) and int(active.max()) < n):
        raise ValueError(f"active indices must lie in [0, {n}), got "
                         f"[{int(active.min())}, {int(active.max())}]")
    keep = torch.zeros(n, dtype=torch.bool, device=dev)
    keep[active] = True
    w[~keep] = 0.0
    return w, torch.nonzero(keep).flatten()


class _Adam:
    """Adam's moments on all n coordinates, updated on the active ones (COMBSS settings);
    ``adam=False`` gives plain gradient steps."""

    beta1, beta2, eps = 0.9, 0.999, 1e-7

    def __init__(self, n: int, dtype, dev, adam: bool):
        self.adam = adam
        self.m = torch.zeros(n, dtype=dtype, device=dev)
        self.v = torch.zeros(n, dtype=dtype, device=dev)

    def step(self, g_w: torch.Tensor, active: torch.Tensor, it: int) -> torch.Tensor:
        if not self.adam:
            return g_w
        beta1, beta2 = self.beta1, self.beta2
        ma = beta1 * self.m[active] + (1 - beta1) * g_w
        va = beta2 * self.v[active] + (1 - beta2) * g_w * g_w
        self.m[active], self.v[active] = ma, va
        return ma / (1 - beta1**it) / (torch.sqrt(va / (1 - beta2**it)) + self.eps)


def continuous_landmarks(
    K: ArrayLike | GramAccess,
    lam: float,
    *,
    loss: str = "frobenius",
    delta: float = 1.0,
    n_mc: int = 10,
    t0: float = 0.5,
    optimizer: str = "adam",
    learning_rate: float = 0.1,
    max_iter: int = 300,
    tol: float = 1e-4,
    n_iter_no_change: int = 10,
    truncation: float = 1e-3,
    threshold: float = 0.5,
    gradient: str = "stochastic",
    solver: str = "auto",
    direct_max: int = 500,
    cg_tol: float = 1e-6,
    cg_max_iter: int | None = 100,
    preconditioner: str = "jacobi",
    precond_rank: int = 200,
    precond_factor: torch.Tensor | None = None,
    active: ArrayLike | None = None,
    record_path: bool = False,
    random_state: int | np.random.RandomState | torch.Generator | None = None,
) -> ContinuousResult:
    """Algorithm 1 of Mathur, Moka and Botev: one run at a fixed penalty ``lam``.

    Minimises ``g_lam(t(w))`` (Frobenius, problem (3)) or ``f_lam(t(w))`` (trace norm /
    column subset selection) over ``w`` with ``t = 1 - exp(-w^2)``, then returns
    ``s_j = 1(t*_j > tau)``.

    Parameters
    ----------
    K : tensor of shape (n, n) or GramAccess
        PSD matrix, or an access object (kernel on points, ``A^T A`` for a data matrix).
    lam : float
        Penalty on ``sum(t)``; larger values select fewer columns.
    loss : {"frobenius", "trace"}, default="frobenius"
    delta : float, default=1.0
        Relaxation constant (does not change the corner values, Lemma 2.6).
    n_mc : int, default=10
        Rademacher vectors per step (``M`` in the paper).
    t0 : float, default=0.5
        Starting value of every ``t_j``.
    optimizer : {"adam", "sgd"}, default="adam"
        Adam (COMBSS practice) or plain gradient steps on ``w`` (the paper's wording).
    learning_rate : float, default=0.1
    max_iter : int, default=300
    tol, n_iter_no_change : float, int
        Stop when ``max |t - t_prev| <= tol`` for ``n_iter_no_change`` iterations in a row.
    truncation : float, default=1e-3
        ``eps`` of §3.4: ``t_j < eps`` is set to 0 and removed from every later solve.
    threshold : float, default=0.5
        ``tau`` of Algorithm 1.
    gradient : {"stochastic", "exact"}, default="stochastic"
        Lemma 3.1/3.2 estimates with CG, or the exact ``O(n^3)`` gradients of Lemmas 2.4/2.8.
    solver : {"auto", "cg", "cholesky"}, default="auto"
        How the systems with ``L_t`` are solved. ``"cg"``: conjugate gradients using only
        products with ``K`` (the paper's matrix-free route). ``"cholesky"``: a dense factor
        of the active block. ``"auto"``: CG while more than ``direct_max`` columns are
        active, Cholesky after (not in the paper; the estimates are the same up to the CG
        tolerance, and small dense factors are cheaper than many CG iterations).
    direct_max : int, default=500
    cg_tol, cg_max_iter : float, int
        Conjugate-gradient settings (each step draws fresh ``z``, so solves start from zero).
    preconditioner : {"jacobi", "cholesky"}, default="jacobi"
        CG preconditioner: the diagonal of ``L_t``, or the low-rank-plus-diagonal
        approximation of ``L_t`` from a rank-``precond_rank`` greedy pivoted Cholesky factor
        of ``K`` (computed once, ``(r + 1) n`` kernel entries; not in the paper). Both give
        the same solutions up to ``cg_tol``; the second needs far fewer iterations on
        kernels with a decaying spectrum.
    precond_rank : int, default=200
    precond_factor : tensor of shape (n, r) or None
        A precomputed factor for ``preconditioner="cholesky"`` (the search shares one between
        its probes).
    active : array-like of int or None
        Start with only these columns active (the others at ``t = 0``, which is absorbing);
        None starts with all ``n``. Used to warm-start the search's probes.
    record_path : bool, default=False
        Keep the ``t`` trajectory.
    random_state : int, Generator or None

    Returns
    -------
    ContinuousResult

    Notes
    -----
    Cost per iteration: ``O(T_mult M l)`` with ``l`` CG iterations and ``T_mult`` one
    product with (the active block of) ``K``; ``O(n^3)`` with ``gradient="exact"``.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import continuous_landmarks
    >>> K = torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0, 0.5, 0.25], dtype=torch.float64))
    >>> res = continuous_landmarks(K, 6.0, max_iter=100, random_state=0)
    >>> res.support.tolist()
    [0, 1, 2]
    """
    gram = _as_gram(K)
    n = gram.n
    _check_options(loss, gradient, solver, optimizer, delta, t0, threshold, preconditioner)
    gen = _generator(random_state)
    dtype = gram.dtype
    dev = gram.check_psd_diagonal().device
    Kd = gram.to_dense() if gradient == "exact" else None

    factor = None
    if preconditioner == "cholesky" and gradient == "stochastic" and solver != "cholesky":
        factor = (precond_factor if precond_factor is not None
                  else cholesky_factor(gram, precond_rank))
    w, active = _starting_weights(n, t0, active, dtype, dev)
    t_full = t_from_w(w)
    opt = _Adam(n, dtype, dev, optimizer == "adam")
    path = [t_full.clone()] if record_path else None
    history: list[float] = []
    n_matvec, calm, converged, it = 0, 0, False, 0
    stats: dict[str, int] = {}
    for it in range(1, max_iter + 1):  # noqa: B007 - n_iter is reported
        if active.numel() == 0:
            converged = True
            break
        wa = w[active]
        ta = t_from_w(wa)
        idx = None if active.numel() == n else active
        if gradient == "exact":
            tt = torch.zeros(n, dtype=dtype, device=dev)
            tt[active] = ta
            fn = frobenius_gradient if loss == "frobenius" else trace_gradient
            g_t = fn(Kd, tt, delta, lam)[active]
        else:
            z = rademacher(n, n_mc, gen, dtype).to(dev)
            g_t, est, _, nmv = stochastic_gradient(
                gram, ta, z, loss=loss, delta=delta, lam=lam, active=idx,
                cg_tol=cg_tol, cg_max_iter=cg_max_iter, factor=factor, stats=stats,
                direct=solver == "cholesky" or (solver == "auto" and active.numel() <= direct_max),
            )
            n_matvec += nmv
            history.append(est)
        step = opt.step(g_t * 2 * wa * (1 - ta), active, it)
        wa = (wa - learning_rate * step).clamp(-_W_MAX, _W_MAX)
        w[active] = wa
        t_new = t_from_w(w)
        dead = t_new[active] < truncation
        if bool(dead.any()):
            w[active[dead]] = 0.0
            t_new[active[dead]] = 0.0
            active = active[~dead]
        change = float((t_new - t_full).abs().max())
        t_full = t_new
        if path is not None:  # record_path
            path.append(t_full.clone())
        calm = calm + 1 if change <= tol else 0
        if calm >= n_iter_no_change:
            converged = True
            break
    support = torch.nonzero(t_full > threshold).flatten()
    return ContinuousResult(
        support=support, t=t_full, lam=float(lam), n_iter=it, converged=converged,
        loss_history=history, path=torch.stack(path) if path is not None else None,
        n_matvec=n_matvec, n_cg_iter=stats.get("cg_iter", 0),
    )


def cholesky_factor(gram: GramAccess, rank: int) -> torch.Tensor:
    """Rank-``rank`` greedy pivoted Cholesky factor of ``K`` for the CG preconditioner
    (deterministic, so it does not draw from the selection's random stream)."""
    from .cholesky import pivoted_cholesky

    if rank < 1:
        raise ValueError(f"precond_rank must be at least 1, got {rank}")
    F, _ = pivoted_cholesky(gram, min(rank, gram.n), rule="greedy")
    return F


def _initial_lambda(gram: GramAccess, k: int, loss: str, gen: torch.Generator) -> float:
    """Guess ``lam`` as the worth of the k-th column: ``lam_k`` (trace) or ``lam_k^2``.

    The eigenvalues come from a rank-(k+1) randomly pivoted Cholesky factor, so the guess
    costs ``(k + 2) n`` kernel entries.
    """
    from .cholesky import pivoted_cholesky

    r = min(gram.n, k + 1)
    F, _ = pivoted_cholesky(gram, r, rule="random", generator=gen)
    ev = torch.linalg.eigvalsh(F.T @ F).flip(0)
    lam_k = float(ev[min(k, ev.numel()) - 1].clamp_min(1e-12 * float(ev[0])))
    # calibrated on digits and RBF kernels: the k-th eigen-direction is worth a few times
    # its eigenvalue (squared) under the relaxed dynamics started at t = 1/2
    return 8 * lam_k**2 if loss == "frobenius" else 4 * lam_k


def search_lambda(
    K: ArrayLike | GramAccess,
    k: int,
    *,
    loss: str = "frobenius",
    lam_init: float | None = None,
    max_search: int = 12,
    k_tol: float = 0.0,
    warm_start: bool = False,
    random_state: int | np.random.RandomState | torch.Generator | None = None,
    **kwargs: Any,
) -> ContinuousResult:
    """Search ``lam`` so that Algorithm 1 selects exactly ``k`` columns.

    Starts at the eigenvalue guess of :func:`_initial_lambda` (or ``lam_init``), moves by
    factors of 4 until ``|s|`` brackets ``k``, then takes secant steps in
    ``(log lam, log |s|)`` kept inside the bracket. Each probe is a full run of
    :func:`continuous_landmarks` (with ``kwargs``) and a fresh random stream.

    ``k_tol > 0`` also accepts a probe with ``k < |s| <= k + ceil(k_tol k)`` and trims it
    to ``k`` columns by greedy pivoted Cholesky restricted to the selected ones
    (``method="trim"``): near the target the selected size is a noisy function of ``lam``,
    and this saves most of the probes.

    ``warm_start=True`` (not in the paper) starts a probe at a larger ``lam`` than a probe
    that selected more than ``k`` columns from that probe's final active set (the columns it
    had not pruned), with ``t = t0`` on them, instead of from all ``n`` columns: a larger
    penalty selects a subset of those in practice, and the first iterations with every column
    active, most of a cold probe's cost, are skipped. With ``preconditioner="cholesky"`` all
    probes share one factor.

    Fallback (not in the paper): if no probe hits ``k`` within ``max_search`` runs, the
    ``k`` largest ``t*`` of the smallest run with ``|s| > k`` are kept
    (``method="top-k"``; ties at the cut, common because ``t`` is clamped just below 1, are
    broken by greedy pivoted Cholesky among the tied columns); if every run selected fewer
    than ``k``, the largest run is completed by greedy pivoted-Cholesky steps
    (``method="completed"``).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import search_lambda
    >>> K = torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0, 0.5, 0.25], dtype=torch.float64))
    >>> res = search_lambda(K, 2, max_iter=100, random_state=0)
    >>> res.support.tolist(), res.method
    ([0, 1], 'threshold')
    """
    gram = _as_gram(K)
    k = check_k(k, gram.n)
    gen = _generator(random_state)
    lam = float(lam_init) if lam_init is not None else _initial_lambda(gram, k, loss, gen)
    # lo: (lam, size) with size > k ; hi: (lam, size) with size < k
    lo: tuple[float, int] | None = None
    hi: tuple[float, int] | None = None
    best_over: ContinuousResult | None = None
    best_under: ContinuousResult | None = None
    probes: list[tuple[float, int]] = []
    if kwargs.get("preconditioner") == "cholesky" and kwargs.get("precond_factor") is None \
            and kwargs.get("solver", "auto") != "cholesky":
        kwargs["precond_factor"] = cholesky_factor(gram, kwargs.get("precond_rank", 200))
    # (lam, final active set) of the probes that selected more than k columns
    supersets: list[tuple[float, torch.Tensor]] = []
    for _ in range(max_search):
        start = None
        if warm_start:
            below = [(lp, act) for lp, act in supersets if lp < lam]
            if below:
                start = max(below, key=lambda p: p[0])[1]
        res = continuous_landmarks(gram, lam, loss=loss, random_state=gen, active=start,
                                   **kwargs)
        size = int(res.support.numel())
        probes.append((lam, size))
        logger.debug("lambda probe %.4g -> %d selected", lam, size)
        if size == k:
            res.probes = probes
            return res
        if k < size <= k + math.ceil(k_tol * k):
            res.support = _trim(gram, res.support, k)
            res.method, res.probes = "trim", probes
            return res
        if size > k:
            supersets.append((lam, torch.nonzero(res.t > 0).flatten()))
            if lo is None or lam > lo[0]:
                lo = (lam, size)
            if best_over is None or size < best_over.support.numel():
                best_over = res
        else:
            if hi is None or lam < hi[0]:
                hi = (lam, size)
            if best_under is None or size > best_under.support.numel():
                best_under = res
        if lo is not None and hi is not None:
            a, b = math.log(lo[0]), math.log(hi[0])
            if hi[1] > 0:
                sa, sb = math.log(lo[1]), math.log(hi[1])
                frac = (sa - math.log(k)) / (sa - sb) if sa != sb else 0.5
            else:
                frac = 0.5
            frac = min(max(frac, 0.15), 0.85)
            lam = math.exp(a + frac * (b - a))
        else:
            lam = _extrapolate(probes, k, lam, up=lo is not None)
    if best_over is not None:
        top = _top_k(gram, best_over.t, k)
        best_over.support, best_over.method, best_over.probes = top, "top-k", probes
        logger.info("lambda search missed k=%d; keeping the top-k of a larger run", k)
        return best_over
    if best_under is None:  # no probe was run
        raise ValueError(f"max_search must be at least 1, got {max_search}.")
    res = best_under
    res.support = _complete(gram, res.support, k)
    res.method, res.probes = "completed", probes
    logger.info("lambda search selected fewer than k=%d; completed greedily", k)
    return res


def _extrapolate(probes: list[tuple[float, int]], k: int, lam: float, *, up: bool) -> float:
    """Next ``lam`` while ``|s|`` is on one side of ``k``: a log-log secant through the last
    two probes when they differ (sizes behave like a power of ``lam``), else a factor 4;
    the step is kept between a factor 1.5 and 100."""
    step = 4.0
    if len(probes) >= 2:
        (l1, s1), (l2, s2) = probes[-2], probes[-1]
        if s1 > 0 and s2 > 0 and s1 != s2 and l1 != l2:
            slope = (math.log(s2) - math.log(s1)) / (math.log(l2) - math.log(l1))
            if slope < 0:
                # the exponent is clamped first: a nearly flat slope would overflow exp
                step = math.exp(min(abs((math.log(k) - math.log(s2)) / slope),
                                    math.log(100.0)))
    step = min(max(step, 1.5), 100.0)
    return lam * step if up else lam / step


def _trim(gram: GramAccess, support: torch.Tensor, k: int) -> torch.Tensor:
    """``k`` of the selected columns by greedy pivoted Cholesky restricted to them.

    Dropping the columns of smallest ``t*`` can drop the only landmark of a small cluster
    (its ``t`` may still be rising); the residual-diagonal rule keeps coverage."""
    from .cholesky import pivoted_cholesky

    _, idx = pivoted_cholesky(gram, k, rule="greedy", candidates=support)
    if idx.numel() < k:
        rest = [int(j) for j in support if int(j) not in set(idx.tolist())]
        idx = torch.cat([idx, torch.as_tensor(rest[: k - idx.numel()], dtype=torch.long)])
    return idx.sort().values


def _top_k(gram: GramAccess, t: torch.Tensor, k: int, tie: float = 1e-6) -> torch.Tensor:
    """The ``k`` largest ``t*``; ties at the cut (many ``t*`` sit at the upper clamp) are
    broken by greedy pivoted Cholesky among the tied columns, given the ones above the tie."""
    order = torch.argsort(t, descending=True)
    cut = float(t[order[k - 1]])
    above = order[t[order] > cut + tie]
    tied = order[(t[order] - cut).abs() <= tie]
    if above.numel() + tied.numel() == k or above.numel() >= k:
        return order[:k].sort().values
    from .cholesky import pivoted_cholesky

    _, idx = pivoted_cholesky(gram, k, rule="greedy", initial=above, candidates=tied)
    if idx.numel() < k:  # the tied block is numerically exhausted: fill in t order
        rest = [int(j) for j in tied if int(j) not in set(idx.tolist())]
        idx = torch.cat([idx, torch.as_tensor(rest[: k - idx.numel()], dtype=torch.long)])
    return idx.sort().values


def _complete(gram: GramAccess, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """Add greedy pivoted-Cholesky pivots to ``chosen`` until it has ``k`` indices."""
    from .cholesky import pivoted_cholesky

    F, idx = pivoted_cholesky(gram, k, rule="greedy", initial=chosen)
    return idx.sort().values


def continuous_column_subset(
    A: ArrayLike, k: int, *,
    random_state: int | np.random.RandomState | torch.Generator | None = None, **kwargs: Any,
) -> ContinuousResult:
    """Column subset selection of ``A`` (``m x n``) by the continuous method.

    Minimises the relaxation of ``||A - P_s A||_F^2`` (trace loss on ``K = A^T A``, products
    ``A^T (A v)`` only, ``O(m n)`` each) and searches ``lam`` to select ``k`` columns.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import column_subset_error, continuous_column_subset
    >>> A = torch.tensor([[1.0, 2.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0], [1.0, 2.0, 0.0, 1.0]],
    ...                  dtype=torch.float64)
    >>> res = continuous_column_subset(A, 2, max_iter=100, random_state=0)
    >>> len(res.support), round(column_subset_error(A, res.support), 8)
    (2, 0.0)
    """
    gram = FeatureGram(as_tensor(A, name="A"))
    return search_lambda(gram, k, loss="trace", random_state=random_state, **kwargs)


def gram_for(X: torch.Tensor, kernel: Kernel, *, cache: bool = True,
             options: Options | None = None) -> KernelGram:
    """Kernel access on points ``X`` (stored once when it fits the memory budget)."""
    return KernelGram(kernel, X, cache=cache, options=options)


class ContinuousSelector(LandmarkSelector):
    """Continuous landmark selection (Mathur, Moka and Botev) with a search hitting ``k``.

    Runs :func:`search_lambda` on the kernel matrix of ``X``: Algorithm 1 with stochastic
    gradients (Lemma 3.2 for ``loss="frobenius"``, Lemma 3.1 with the kernel as ``K`` for
    ``loss="trace"``), conjugate-gradient solves through kernel products, pruning of
    ``t_j < truncation`` and the threshold ``tau``; the top-k fallback applies when the
    search misses ``k``.

    Parameters
    ----------
    loss : {"frobenius", "trace"}, default="frobenius"
    delta : float, default=0.1
        Relaxation constant, relative to the mean of ``diag K`` when ``relative_delta``
        (``delta * mean(diag K)`` is passed on). The paper uses ``delta = 1`` in absolute
        terms (``relative_delta=False``) on standardised data; on digits with a unit
        diagonal RBF kernel 0.1 gave a Frobenius factor of 3.0 against 5.0 for 1 at k = 20
        (see ``docs/landmarks.md``). Corner values do not depend on it (Lemma 2.6).
    relative_delta : bool, default=True
        Scale ``delta`` by the mean of ``diag K`` (False: the paper's absolute ``delta``).
    n_mc : int, default=10
    learning_rate : float, default=0.1
    max_iter : int, default=300
    threshold : float, default=0.5
    truncation : float, default=1e-3
    max_search : int, default=12
    k_tol : float, default=0.1
        Relative size tolerance of the search (top-k of a run with slightly more than k).
    lam_init : float or None, default=None
        First penalty tried (e.g. the ``lam`` found for the same data before); None uses the
        eigenvalue guess.
    gradient : {"stochastic", "exact"}, default="stochastic"
    solver : {"auto", "cg", "cholesky"}, default="auto"
    direct_max : int, default=1000
        With ``solver="auto"``, CG while more columns are active, Cholesky after.
    cg_tol : float, default=1e-6
    cg_max_iter : int, default=100
    preconditioner : {"cholesky", "jacobi"}, default="cholesky"
        CG preconditioner (see :func:`continuous_landmarks`); ``"cholesky"`` builds one
        rank-``precond_rank`` pivoted Cholesky factor per selection.
    precond_rank : int, default=200
    warm_start : bool, default=True
        Start the search's probes from the active set of an earlier probe that selected more
        than ``k`` columns (see :func:`search_lambda`); False restarts every probe from all
        columns (Algorithm 1 as written).
    cache : bool, default=True
        Store the kernel matrix once when it fits the memory budget (products are then
        dense GEMMs); otherwise every product goes through the tiled kernel engine.

    Notes
    -----
    Cost: ``O(probes x iterations x M x l x T_mult)`` with ``T_mult`` one product with the
    active kernel block (``O(n n_active)``), against ``O(n k^2)`` for RPCholesky.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import ContinuousSelector
    >>> X = torch.tensor([[0.0], [0.1], [5.0], [5.1], [10.0]], dtype=torch.float64)
    >>> sel = ContinuousSelector(max_iter=100).select(X, Gaussian(1.0), 3, random_state=0)
    >>> sel.indices.tolist()
    [0, 2, 4]
    """

    _param_spec = {
        "loss": Param("option", options=("frobenius", "trace")),
        "delta": Param("real", 0, low_open=True),
        "n_mc": Param("int", 1),
        "learning_rate": Param("real", 0, low_open=True),
        "max_iter": Param("int", 1),
        "threshold": Param("real", 0, 1, high_open=True),
        "truncation": Param("real", 0, 1, high_open=True),
        "max_search": Param("int", 1),
        "k_tol": Param("real", 0),
        "lam_init": Param("real", 0, low_open=True, none=True),
        "gradient": Param("option", options=("stochastic", "exact")),
        "solver": Param("option", options=("auto", "cg", "cholesky")),
        "direct_max": Param("int", 0),
        "cg_tol": Param("real", 0, low_open=True),
        "cg_max_iter": Param("int", 1),
        "relative_delta": Param("bool"),
        "preconditioner": Param("option", options=("cholesky", "jacobi")),
        "precond_rank": Param("int", 1),
        "warm_start": Param("bool"),
        "cache": Param("bool"),
    }

    def __init__(self, *, loss: str = "frobenius", delta: float = 0.1, n_mc: int = 10,
                 learning_rate: float = 0.1, max_iter: int = 300, threshold: float = 0.5,
                 truncation: float = 1e-3, max_search: int = 12, k_tol: float = 0.1,
                 lam_init: float | None = None, gradient: str = "stochastic",
                 solver: str = "auto", direct_max: int = 1000, cg_tol: float = 1e-6,
                 cg_max_iter: int = 100, relative_delta: bool = True,
                 preconditioner: str = "cholesky", precond_rank: int = 200,
                 warm_start: bool = True, cache: bool = True) -> None:
        self.loss = loss
        self.delta = delta
        self.n_mc = n_mc
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.threshold = threshold
        self.truncation = truncation
        self.max_search = max_search
        self.k_tol = k_tol
        self.lam_init = lam_init
        self.gradient = gradient
        self.solver = solver
        self.direct_max = direct_max
        self.cg_tol = cg_tol
        self.cg_max_iter = cg_max_iter
        self.relative_delta = relative_delta
        self.preconditioner = preconditioner
        self.precond_rank = precond_rank
        self.warm_start = warm_start
        self.cache = cache

    def run(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> ContinuousResult:
        """The full search result (t*, probes, fallback used) for ``k`` landmarks."""
        self._check_params()
        X = check_points(X)
        k = check_k(k, X.shape[0])
        gram = gram_for(X, kernel, cache=self.cache)
        delta = self.delta
        if self.relative_delta:
            delta *= float(gram.check_psd_diagonal().mean().clamp_min(1e-300))
        return search_lambda(
            gram, k, loss=self.loss, max_search=self.max_search, k_tol=self.k_tol,
            lam_init=self.lam_init, random_state=_generator(random_state), delta=delta,
            n_mc=self.n_mc, solver=self.solver, direct_max=self.direct_max,
            learning_rate=self.learning_rate, max_iter=self.max_iter,
            threshold=self.threshold, truncation=self.truncation, gradient=self.gradient,
            cg_tol=self.cg_tol, cg_max_iter=self.cg_max_iter, warm_start=self.warm_start,
            preconditioner=self.preconditioner, precond_rank=self.precond_rank,
        )

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        X = as_tensor(X)
        res = self.run(X, kernel, k, random_state=random_state)
        idx = res.support
        return Selection(indices=idx, centers=X[idx], weights=res.t[idx])
