"""Kernel hyperparameters (bandwidths, ARD bandwidths, scales, penalty) learned by gradient.

Differentiable selection criteria of kernel ridge regression, written as functions of dense
float64 kernel matrices so that torch autograd differentiates them with respect to every kernel
parameter held as a tensor, and a bounded L-BFGS driver with restarts.

Conventions: the penalty ``alpha`` is the ridge penalty of :class:`KernelRidge`,
c = (K + alpha I)^{-1} y, and of :class:`NystromKernelRidge`,
(K_nm^T K_nm + alpha K_mm) a = K_nm^T y. In the Gaussian-process reading, y ~ N(0, s^2 (K +
alpha I)): the noise variance is alpha s^2, and the signal variance s^2 is profiled out in closed
form (s^2 = y^T (K + alpha I)^{-1} y / n), so the marginal likelihood depends on the kernel and
``alpha`` only.

Criteria (per sample, summed over targets; Y has shape (n, t) and is already centred):

* ``marginal_likelihood``: (1/n) [ (n/2) sum_t log(y_t^T A^{-1} y_t / n) + (t/2) log det A ]
  + constants, A = K + alpha I (profiled GP negative log marginal likelihood; Rasmussen and
  Williams 2006, eq. 5.8).
* ``loo``: (1/n) sum_i (c_i / (A^{-1})_ii)^2, the exact leave-one-out squared error of KRR.
* ``gcv``: n ||c||^2 / tr(A^{-1})^2, generalised cross-validation (Craven and Wahba 1979).
* ``validation``: mean squared error on held-out rows of the Nyström model fitted on the others.
* ``nystrom_marginal_likelihood``: Titsias' (2009) collapsed bound for the Nyström (DTC)
  approximation Q = K_nm K_mm^{-1} K_mn, with the signal variance profiled out:
  (1/n) [ (n/2) log(q / n) + (1/2) log det(Q + alpha I) + tr(K - Q) / (2 alpha) ],
  q = y^T (Q + alpha I)^{-1} y. It is the ``marginal_likelihood`` when all rows are centres.

Cost per evaluation: O(n^3) for the exact criteria, O(n m^2) for the Nyström ones.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..kernels import Additive, Gaussian, Kernel, Scaled, _DistanceKernel, median_heuristic
from ..utils._progress import progress
from ..utils.holdout import check_sides, holdout_indices

_SIGMA_FACTORS = (1.0, 1 / 3, 3.0, 0.1, 10.0, 1 / 30, 30.0)
_ALPHA_FACTORS = (1.0, 1e-2, 1e2)
#: random restarts draw every parameter within this factor of the best screened start
RESTART_SPAN = 10.0
# the float32 search stops below this penalty (relative to the unit diagonal of a stationary
# kernel): the rounding of a float32 factorisation, about n eps_32 / alpha relative in the
# smallest eigenvalues, then reaches the marginal likelihood's tolerance
_FLOAT32_MIN_ALPHA = 3e-4

__all__ = [
    "CRITERIA",
    "EXACT_CRITERIA",
    "NYSTROM_CRITERIA",
    "HyperparameterResult",
    "krr_negative_log_marginal_likelihood",
    "krr_loo_error",
    "krr_gcv_error",
    "nystrom_validation_error",
    "nystrom_negative_log_marginal_likelihood",
    "learn_hyperparameters",
]

EXACT_CRITERIA = ("marginal_likelihood", "loo", "gcv")
NYSTROM_CRITERIA = ("validation", "nystrom_marginal_likelihood")
CRITERIA = EXACT_CRITERIA + NYSTROM_CRITERIA


def _cholesky(A: torch.Tensor) -> torch.Tensor:
    # jitter escalation for matrices at the edge of positive definiteness (the jitter is a
    # constant, so the criterion stays differentiable in the parameters)
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        return L
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    scale = float(A.diagonal().abs().mean().detach()) or 1.0
    for jitter in (1e-12, 1e-10, 1e-8, 1e-6):
        L, info = torch.linalg.cholesky_ex(A + (jitter * scale) * eye)
        if int(info) == 0:
            return L
    raise ValueError("The kernel matrix plus penalty is not positive definite; raise alpha.")


def _as_2d(Y):
    return Y.reshape(Y.shape[0], -1)


def _shifted(K, alpha):
    if torch.is_grad_enabled() and (K.requires_grad or torch.is_tensor(alpha)
                                    and alpha.requires_grad):
        return K + alpha * torch.eye(K.shape[0], dtype=K.dtype, device=K.device)
    A = K.clone()  # the same values as K + alpha I, without an n x n identity
    A.diagonal().add_(alpha)
    return A


def krr_negative_log_marginal_likelihood(K: torch.Tensor, Y: torch.Tensor, alpha) -> torch.Tensor:
    """Profiled GP negative log marginal likelihood per sample of y ~ N(0, s^2 (K + alpha I)).

    Constants included: with t targets, (1/n) sum_t [ (n/2) log(2 pi e q_t / n) + (1/2) log det
    (K + alpha I) ], q_t = y_t^T (K + alpha I)^{-1} y_t. Cost O(n^3 / 3).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> round(float(krr_negative_log_marginal_likelihood(K, y, 1.0)), 4)
    1.4189
    """
    return _exact(K, Y, alpha, "marginal_likelihood")


def _alpha_tensor(alpha, K):
    if torch.is_tensor(alpha):
        return alpha.to(dtype=K.dtype, device=K.device).reshape(())
    return torch.tensor(float(alpha), dtype=K.dtype, device=K.device)


def _exact_value_and_gradient(K, alpha, Y, kind, need_grad=True):
    """Criterion of A = K + alpha I and its gradient G = df/dA (symmetric), in closed form:
    one Cholesky factorisation and one inverse, about 3x cheaper than differentiating through
    the factorisation."""
    n, t = Y.shape
    L = _cholesky(_shifted(K, alpha))
    if kind == "marginal_likelihood" and not need_grad:  # no inverse needed
        Z = torch.linalg.solve_triangular(L, Y, upper=False)
        q = (Z * Z).sum(0)
        logdet = 2.0 * torch.log(L.diagonal()).sum()
        f = (0.5 * n * torch.log(q / n).sum() + 0.5 * t * logdet) / n + 0.5 * t * (
            1.0 + math.log(2.0 * math.pi))
        return f, K.new_zeros(())
    B = torch.cholesky_inverse(L)  # A^{-1}
    C = B @ Y
    if kind == "marginal_likelihood":
        q = (Y * C).sum(0)
        logdet = 2.0 * torch.log(L.diagonal()).sum()
        f = (0.5 * n * torch.log(q / n).sum() + 0.5 * t * logdet) / n + 0.5 * t * (
            1.0 + math.log(2.0 * math.pi))
        # d log q_t = -c_t^T dA c_t / q_t, d log det A = tr(A^{-1} dA); formed in B's storage
        G = B.mul_(0.5 * t / n).addmm_(C / q, C.T, alpha=-0.5)
        return f, G
    if kind == "loo":
        b = B.diagonal().unsqueeze(1)
        R = C / b  # leave-one-out residuals
        f = (R * R).sum() / n
        U, v = R / b, (R * R / b).sum(1)
        # dc = -B dA c and d B_ii = -(B dA B)_ii
        G = (-2.0 / n) * (B @ U) @ C.T + (2.0 / n) * (B * v) @ B
        return f, 0.5 * (G + G.T)
    T = B.diagonal().sum()  # gcv
    c2 = (C * C).sum()
    f = n * c2 / T**2
    G = (-2.0 * n / T**2) * (B @ C) @ C.T + (2.0 * n * c2 / T**3) * (B @ B)
    return f, 0.5 * (G + G.T)


class _ExactCriterion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, K, alpha, Y, kind, need_grad):
        with torch.no_grad():
            f, G = _exact_value_and_gradient(K.detach(), alpha.detach(), Y.detach(), kind,
                                             need_grad)
        ctx.save_for_backward(G)
        return f

    @staticmethod
    def backward(ctx, grad):
        (G,) = ctx.saved_tensors
        gK = None
        if ctx.needs_input_grad[0]:  # the criterion is usually the loss itself (grad = 1)
            gK = G if bool(grad == 1) else grad * G
        ga = grad * G.diagonal().sum() if ctx.needs_input_grad[1] else None
        return gK, ga, None, None, None


class _GaussianGram(torch.autograd.Function):
    """K = Gaussian(sigma)(X) with the gradient to sigma (a scalar or one per feature) in closed
    form: for M = dF/dK * K, dF/dsigma_j = sum_ik M_ik (x_ij - x_kj)^2 / sigma_j^3, which is
    r^T x_j^2 + c^T x_j^2 - 2 x_j^T M x_j (r, c: row and column sums of M) on centred inputs,
    one GEMM M X instead of autograd through the kernel blocks."""

    @staticmethod
    def forward(ctx, sigma, X):
        with torch.no_grad():
            s = sigma.detach()
            K = Gaussian(s if s.ndim else float(s))(X)
        ctx.save_for_backward(s, X, K)
        return K

    @staticmethod
    def backward(ctx, grad):
        s, X, K = ctx.saved_tensors
        M = grad * K
        Xs = (X - X.mean(0)) / s
        Xs2 = Xs * Xs
        g = (M.sum(1) + M.sum(0)) @ Xs2 - 2.0 * (Xs * (M @ Xs)).sum(0)
        g = g / s
        return (g if s.ndim else g.sum()), None


def _gram(k, X):
    """k(X), through :class:`_GaussianGram` for a Gaussian kernel with a learned bandwidth."""
    if type(k) is Gaussian and torch.is_tensor(k.sigma) and k.sigma.requires_grad:
        return _GaussianGram.apply(k.sigma.to(X.dtype), X)
    return k(X)


def _exact(K, Y, alpha, kind):
    a = _alpha_tensor(alpha, K)
    need = torch.is_grad_enabled() and (K.requires_grad or a.requires_grad)
    return _ExactCriterion.apply(K, a, _as_2d(Y), kind, need)


def krr_loo_error(K: torch.Tensor, Y: torch.Tensor, alpha) -> torch.Tensor:
    """Exact leave-one-out mean squared error of kernel ridge regression (summed over targets).

    The residual of row i left out is c_i / (A^{-1})_ii with A = K + alpha I and c = A^{-1} y.
    Cost O(n^3).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> float(krr_loo_error(K, torch.tensor([1.0, -1.0], dtype=torch.float64), 1.0))
    1.0
    """
    return _exact(K, Y, alpha, "loo")


def krr_gcv_error(K: torch.Tensor, Y: torch.Tensor, alpha) -> torch.Tensor:
    """Generalised cross-validation error n ||c||^2 / tr(A^{-1})^2, A = K + alpha I (summed over
    targets). Cost O(n^3).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> float(krr_gcv_error(K, torch.tensor([1.0, -1.0], dtype=torch.float64), 1.0))
    1.0
    """
    return _exact(K, Y, alpha, "gcv")


def _nystrom_system(Knm, Kmm, alpha):
    return Knm.T @ Knm + alpha * Kmm


def nystrom_validation_error(Knm, Kmm, Kvm, Y, Yval, alpha) -> torch.Tensor:
    """Held-out mean squared error of Nyström KRR (summed over targets).

    Fits a = (K_nm^T K_nm + alpha K_mm)^{-1} K_nm^T y on the training rows and scores
    ||K_vm a - y_val||^2 / n_val. Cost O(n m^2 + m^3).

    Examples
    --------
    >>> import torch
    >>> I = torch.eye(2, dtype=torch.float64)
    >>> y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> float(nystrom_validation_error(I, I, I, y, y, 1.0))
    0.25
    """
    Y, Yval = _as_2d(Y), _as_2d(Yval)
    L = _cholesky(_nystrom_system(Knm, Kmm, alpha))
    a = torch.cholesky_solve(Knm.T @ Y, L)
    R = Kvm @ a - Yval
    return (R * R).sum() / R.shape[0]


def nystrom_negative_log_marginal_likelihood(Knm, Kmm, diag_K, Y, alpha) -> torch.Tensor:
    """Titsias' collapsed bound (Nyström/DTC marginal likelihood) per sample, signal variance
    profiled out; equals :func:`krr_negative_log_marginal_likelihood` when all rows are centres.

    With Q = K_nm K_mm^{-1} K_mn: (1/n) sum_t [ (n/2) log(2 pi e q_t / n) + (1/2) log det(Q +
    alpha I) ] + t tr(K - Q) / (2 alpha n), q_t = y_t^T (Q + alpha I)^{-1} y_t, computed through
    m x m factors (Woodbury). Cost O(n m^2 + m^3).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> a = nystrom_negative_log_marginal_likelihood(K, K, torch.ones(2, dtype=K.dtype), y, 1.0)
    >>> b = krr_negative_log_marginal_likelihood(K, y, 1.0)
    >>> bool(torch.isclose(a, b))
    True
    """
    Y = _as_2d(Y)
    n, t = Y.shape
    m = Kmm.shape[0]
    Lm = _cholesky(Kmm)
    V = torch.linalg.solve_triangular(Lm, Knm.T, upper=False)  # Q = V^T V
    B = V @ V.T + alpha * torch.eye(m, dtype=V.dtype, device=V.device)
    Lb = _cholesky(B)
    VY = torch.linalg.solve_triangular(Lb, V @ Y, upper=False)
    q = ((Y * Y).sum(0) - (VY * VY).sum(0)) / alpha
    logdet = 2.0 * torch.log(Lb.diagonal()).sum() + (n - m) * torch.log(torch.as_tensor(alpha))
    trace = diag_K.sum() - (V * V).sum()
    return (
        (0.5 * n * torch.log(q / n).sum() + 0.5 * t * logdet + t * trace / (2.0 * alpha)) / n
        + 0.5 * t * (1.0 + math.log(2.0 * math.pi))
    )


# ---- parameters of a kernel ------------------------------------------------------------------


def _is_vector(value) -> bool:
    return np.ndim(value.detach().cpu().numpy() if torch.is_tensor(value) else value) > 0


def _values(value):
    v = value.detach().cpu().numpy() if torch.is_tensor(value) else value
    return np.atleast_1d(np.asarray(v, dtype=np.float64)).copy()


def _learnable(kernel: Kernel, d: int, prefix: str = ""):
    """(nested name, initial values, is a vector, kind) of every positive continuous parameter."""
    if isinstance(kernel, _DistanceKernel):
        s = kernel.sigma
        return [(prefix + "sigma", _values(s), _is_vector(s), "sigma")]
    if isinstance(kernel, Scaled):
        out = [(prefix + "scale", _values(kernel.scale), False, "scale")]
        return out + _learnable(kernel.kernel, d, prefix + "kernel__")
    if isinstance(kernel, Additive):
        out = []
        for i, (cols, k) in enumerate(kernel.parts):
            out += _learnable(k, len(list(cols)), f"{prefix}k{i}__")
        return out
    out = []
    for name, child in kernel._children():
        out += _learnable(child, d, f"{prefix}{name}__")
    return out


@dataclass
class HyperparameterResult:
    """Outcome of :func:`learn_hyperparameters`.

    Attributes
    ----------
    kernel : Kernel
        A copy of the kernel with the learned parameters (floats or float64 arrays).
    alpha : float
        Learned (or fixed) penalty.
    criterion : str
    value : float
        Criterion at the returned parameters.
    signal_variance : float or ndarray of shape (t,)
        GP signal variance s^2 per target (a float for one target): the GP prior is s^2 k and
        the noise variance alpha s^2. It is the maximum-likelihood value at the learned kernel
        and penalty, s_t^2 = y_t^T (K + alpha I)^{-1} y_t / n (the Nyström criteria:
        y_t^T (Q + alpha I)^{-1} y_t / n, DTC), for every criterion; for the marginal
        likelihoods it is the profiled, i.e. learned, signal variance.
    n_iter : int
        L-BFGS iterations of the best start.
    values : list of float
        Final criterion of each optimised start.
    """

    kernel: Kernel
    alpha: float
    criterion: str
    value: float
    signal_variance: float = float("nan")
    n_iter: int = 0
    values: list = field(default_factory=list)


def _with(kernel, names, tensors):
    k = copy.deepcopy(kernel)
    k.set_params(**dict(zip(names, tensors, strict=True)))
    return k


def _plain(t: torch.Tensor, vector: bool):
    v = t.detach().cpu().numpy().astype(np.float64)
    return v.copy() if vector else float(v.reshape(-1)[0])


def _check_learning_inputs(X, y, criterion, alpha, sigma_bounds, alpha_bounds, scale_bounds,
                           counts: dict):
    """X and Y as float64 tensors and the three bounds as float pairs, with clear errors."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}.")
    X = torch.as_tensor(X).to(torch.float64)
    Y = _as_2d(torch.as_tensor(y).to(dtype=torch.float64, device=X.device))
    if X.ndim != 2 or X.shape[0] != Y.shape[0] or X.shape[0] < 3:
        raise ValueError(f"X must be 2-D with the rows of y (at least 3), got {tuple(X.shape)}.")
    if not (torch.isfinite(X).all() and torch.isfinite(Y).all()):
        raise ValueError("X and y must be finite.")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}.")
    bounds = (check_bounds("sigma_bounds", sigma_bounds),
              check_bounds("alpha_bounds", alpha_bounds),
              check_bounds("scale_bounds", scale_bounds))
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < (
                0 if name == "n_random_starts" else 1):
            raise ValueError(f"{name} must be an integer >= "
                             f"{0 if name == 'n_random_starts' else 1}, got {v!r}.")
    return X, Y, bounds


@dataclass
class _SearchBox:
    """The search coordinates u: every positive parameter p as log p = lo + (hi - lo) sigmoid(u)
    (a smooth bound in log scale), the kernel's learnable parameters then the penalty."""

    params: list  # _learnable(kernel)
    learn_alpha: bool
    lo: torch.Tensor  # (P,) log lower bounds
    hi: torch.Tensor  # (P,) log upper bounds
    base: np.ndarray  # (P,) log of the given values
    is_sigma: np.ndarray  # (P,) bool, the bandwidth entries
    fixed_alpha: torch.Tensor

    @classmethod
    def build(cls, params, X, alpha, learn_alpha, bounds) -> _SearchBox:
        sigma_bounds, alpha_bounds, scale_bounds = bounds
        ref = median_heuristic(X)
        logs = {"sigma": (math.log(ref * sigma_bounds[0]), math.log(ref * sigma_bounds[1])),
                "scale": tuple(map(math.log, scale_bounds)),
                "alpha": tuple(map(math.log, alpha_bounds))}
        kinds = [p[3] for p in params] + (["alpha"] if learn_alpha else [])
        sizes = [p[1].size for p in params] + ([1] if learn_alpha else [])
        lo = torch.tensor(np.repeat([logs[k][0] for k in kinds], sizes), dtype=torch.float64)
        hi = torch.tensor(np.repeat([logs[k][1] for k in kinds], sizes), dtype=torch.float64)
        base = np.concatenate([np.log(p[1]) for p in params]
                              + ([[math.log(alpha)]] if learn_alpha else []))
        is_sigma = np.repeat([k == "sigma" for k in kinds], sizes)
        return cls(params, learn_alpha, lo, hi, base, is_sigma,
                   torch.tensor(float(alpha), dtype=torch.float64))

    def unpack(self, u):
        """(kernel parameter values, penalty) at ``u``."""
        theta = self.lo + (self.hi - self.lo) * torch.sigmoid(u)
        vals, start = [], 0
        for p in self.params:
            chunk = theta[start:start + p[1].size].exp()
            vals.append(chunk if p[2] else chunk[0])
            start += p[1].size
        a = theta[start].exp() if self.learn_alpha else self.fixed_alpha
        return vals, a


class _Evaluations:
    """The criterion at search coordinates, each evaluation counted on the progress bar;
    ``objective`` is the float64 criterion, ``search`` the one screened and searched first."""

    def __init__(self, kernel, box: _SearchBox, objective, search, bar):
        self.kernel, self.box, self.bar = kernel, box, bar
        self.names = [p[0] for p in box.params]
        self.objective, self.search = objective, search

    def value_at(self, u, fn):
        vals, a = self.box.unpack(u)
        self.bar.update()
        return fn(_with(self.kernel, self.names, vals), a)

    def safe_value(self, u, fn) -> float:
        """The criterion as a float; inf where it fails or is not finite."""
        with torch.no_grad():
            try:
                f = float(self.value_at(u, fn))
            except (ValueError, torch.linalg.LinAlgError):
                return math.inf
        return f if math.isfinite(f) else math.inf


def _screened_starts(ev: _Evaluations, n_starts) -> list[tuple[float, int, torch.Tensor]]:
    """Screen the starts by their criterion (one evaluation each), coordinate-wise: the penalty
    factors at the given bandwidths, then the bandwidth factors at the best penalty. Returns
    (criterion, order, u) sorted, best first."""
    box = ev.box
    starts: list[tuple[float, int, torch.Tensor]] = []

    def screen(fs, fa):
        theta = box.base + np.where(box.is_sigma, math.log(fs), 0.0)
        if box.learn_alpha:
            theta[-1] += math.log(fa)
        frac = (torch.tensor(theta) - box.lo) / (box.hi - box.lo)
        u = torch.logit(frac.clamp(1e-6, 1 - 1e-6))
        fn = ev.search if float(box.unpack(u)[1]) >= _FLOAT32_MIN_ALPHA else ev.objective
        starts.append((ev.safe_value(u, fn), len(starts), u))
        return starts[-1][0]

    alpha_values = [screen(1.0, fa) for fa in (_ALPHA_FACTORS if box.learn_alpha else (1.0,))]
    fa_best = (_ALPHA_FACTORS if box.learn_alpha else (1.0,))[int(np.argmin(alpha_values))]
    for fs in _SIGMA_FACTORS[1:max(1, int(n_starts))]:
        screen(fs, fa_best)
    starts.sort(key=lambda t: (t[0], t[1]))
    return starts


def _random_runs(ev: _Evaluations, starts, n_random_starts, random_state,
                 order: int) -> list[tuple[float, int, torch.Tensor]]:
    """Log-uniform draws around the best screened start (a factor of RESTART_SPAN either way),
    clipped to the bounds: draws over the whole bounds (six decades of bandwidth) mostly start
    on the flat plateaus of a near-diagonal or near-constant kernel. ``order`` numbers the
    first draw."""
    box = ev.box
    rng = np.random.RandomState(random_state if isinstance(random_state, int) else 0)
    theta0 = box.lo + (box.hi - box.lo) * torch.sigmoid(starts[0][2])
    runs: list[tuple[float, int, torch.Tensor]] = []
    for _ in range(int(n_random_starts)):
        theta = theta0 + torch.as_tensor(rng.uniform(-1.0, 1.0, size=box.lo.numel())
                                         * math.log(RESTART_SPAN))
        frac = ((theta - box.lo) / (box.hi - box.lo)).clamp(1e-6, 1 - 1e-6)
        u = torch.logit(frac)
        runs.append((ev.safe_value(u, ev.objective), order + len(runs), u))
    return runs


def _optimise_starts(ev: _Evaluations, runs, max_iter, tol):
    """L-BFGS from every start with a finite criterion; returns the best (criterion, u,
    iterations) or None, and the final criterion of every run."""
    best = None
    finals = []
    for f0, _, u0 in runs:
        if not math.isfinite(f0):
            continue
        u, f, n_iter = _lbfgs(u0, ev.value_at, ev.search, ev.objective, max_iter, tol,
                              lambda u: ev.box.unpack(u)[1])
        if not math.isfinite(f) or f > f0:
            if ev.search is not ev.objective:  # f0 may be a float32 value: compare in float64
                f0 = ev.safe_value(u0, ev.objective)
            if not math.isfinite(f) or f > f0:
                f, u = f0, u0
        finals.append(f)
        if math.isfinite(f) and (best is None or f < best[0]):
            best = (f, u, n_iter)
    return best, finals


def learn_hyperparameters(
    X, y, kernel: Kernel, *, criterion="marginal_likelihood", alpha=1e-2, learn_alpha=True,
    centers=None, validation_fraction=0.2, sigma_bounds=(1e-3, 1e3), alpha_bounds=(1e-6, 1e3),
    scale_bounds=(1e-4, 1e4), n_starts=5, n_restarts=1, n_random_starts=0, max_iter=100,
    tol=None, random_state=0, search_dtype="auto", verbose=0,
) -> HyperparameterResult:
    """Learn the kernel's bandwidths (scalar or per feature), scales and the penalty by L-BFGS.

    Every positive parameter p is optimised as log p = lo + (hi - lo) sigmoid(u) (a smooth
    log-scale bound), with torch's L-BFGS and a strong Wolfe line search until the criterion
    changes by less than ``tol``. Starts, screened coordinate-wise by one evaluation of the
    criterion each: the kernel as given (e.g. the median heuristic) with the penalty times 1,
    1e-2 and 1e2, then every bandwidth times 1/3, 3, 1/10, 10, ... (``n_starts`` factors in
    all, the given bandwidths included) with the best of those penalties; the best
    ``n_restarts`` starts are optimised, then ``n_random_starts`` more (scikit-learn's
    ``n_restarts_optimizer``), each parameter drawn log-uniformly within a factor of 10 of the
    best screened start and clipped to its bounds. The best optimised point wins.
    ARD: give the kernel a vector ``sigma`` (one entry per feature; equal entries are fine).

    Parameters
    ----------
    X : tensor of shape (n, d)
    y : tensor of shape (n,) or (n, t)
        Centred targets (the criteria have no intercept).
    kernel : Kernel
        Its distance-kernel bandwidths and :class:`~kernelflow.kernels.Scaled` factors are
        learned; other parameters (``nu``, polynomial degree, ...) stay fixed.
    criterion : {"marginal_likelihood", "loo", "gcv", "validation", \
"nystrom_marginal_likelihood"}
    alpha : float, default=1e-2
        Initial (or, with ``learn_alpha=False``, fixed) penalty.
    learn_alpha : bool, default=True
    centers : tensor of shape (m, d), optional
        Nyström centres (needed by the two Nyström criteria).
    validation_fraction : float, default=0.2
        Held-out share of the rows for ``criterion="validation"``.
    sigma_bounds : (float, float), default=(1e-3, 1e3)
        Bounds on the bandwidths relative to the median heuristic of X.
    alpha_bounds, scale_bounds : (float, float)
        Absolute bounds on the penalty and on scale factors.
    n_starts : int, default=5
        Bandwidth factors screened, the given bandwidths included (at the best of three
        penalties when ``learn_alpha``: ``n_starts + 2`` evaluations).
    n_restarts : int, default=1
        Screened starts that are optimised.
    n_random_starts : int, default=0
        Further L-BFGS runs from random starts (log-uniform within a factor of 10 of the best
        screened start, clipped to the bounds, drawn with ``random_state``).
    max_iter : int, default=100
        L-BFGS iterations per start.
    tol : float, default=None
        Stop when the criterion (per sample) or the parameters change by less. None: 1e-4
        for the marginal likelihoods (per-sample negative log evidence, in nats: a change of
        1e-4 moves neither the test error nor the log predictive density measurably, and
        stopping there halves the criterion evaluations) and 1e-6 for the squared-error
        criteria (whose scale is that of y^2).
    random_state : int, default=0
        Seeds the validation split and the random starts.
    search_dtype : {"auto", "float32", "float64"}, default="auto"
        Precision of the screening and of the first L-BFGS run. With ``"float32"`` the starts
        are screened and L-BFGS runs to ``tol`` on float32 kernel matrices (about half the
        cost of a float64 factorisation on CPUs and far less on GPUs), then L-BFGS continues
        from that point, with its curvature pairs, on the float64 criterion until ``tol`` is
        met there: the result is a float64 optimum, and the returned criterion value is the
        float64 one. The first run turns to float64 for good where the penalty falls below
        3e-4 (there the float32 criterion's rounding reaches the tolerance), and a float32
        evaluation that fails ends it at the best point it evaluated. ``"auto"`` is
        ``"float32"`` for the exact criteria with a shift-invariant kernel (the inputs are
        centred in float64 before the cast, which leaves such a kernel unchanged) and
        ``"float64"`` otherwise.
    verbose : int, default=0
        > 0 shows progress over the evaluations of the criterion
        (:func:`kernelflow.utils.progress.progress`): at most the screening plus
        ``1.25 max_iter`` per L-BFGS run (torch's evaluation limit).

    Returns
    -------
    HyperparameterResult

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(60, 2, generator=g, dtype=torch.float64)
    >>> y = torch.sin(6 * X[:, 0]) + 0.05 * torch.randn(60, generator=g, dtype=torch.float64)
    >>> res = learn_hyperparameters(X, y - y.mean(), Gaussian([1.0, 1.0]))
    >>> bool(res.kernel.sigma[1] > res.kernel.sigma[0])  # the second feature is irrelevant
    True
    """
    X, Y, bounds = _check_learning_inputs(
        X, y, criterion, alpha, sigma_bounds, alpha_bounds, scale_bounds,
        {"n_starts": n_starts, "n_restarts": n_restarts, "n_random_starts": n_random_starts,
         "max_iter": max_iter})
    if tol is None:
        tol = 1e-4 if criterion.endswith("marginal_likelihood") else 1e-6
    kernel.validate()
    params = _learnable(kernel, X.shape[1])
    if not params and not learn_alpha:
        raise ValueError(f"Nothing to learn: {kernel!r} has no bandwidth or scale.")
    if criterion in NYSTROM_CRITERIA:
        if centers is None:
            raise ValueError(f"criterion={criterion!r} needs Nyström centres.")
        centers = torch.as_tensor(centers).to(dtype=torch.float64, device=X.device)
    box = _SearchBox.build(params, X, alpha, learn_alpha, bounds)
    objective = _objective(criterion, X, Y, centers, validation_fraction, random_state)
    search = objective
    if _search_dtype(search_dtype, criterion, kernel,
                     None if learn_alpha else alpha) == torch.float32:
        # shift-invariant kernel: centring in float64 first keeps the float32 distances exact
        Xc = (X - X.mean(0)).to(torch.float32)
        search = _objective(criterion, Xc, Y.to(torch.float32), None, validation_fraction,
                            random_state)

    n_screen = ((len(_ALPHA_FACTORS) if learn_alpha else 1)
                + len(_SIGMA_FACTORS[1:max(1, int(n_starts))]))
    n_runs = min(max(1, int(n_restarts)), n_screen) + int(n_random_starts)
    bar = progress(total=n_screen + int(n_random_starts) + n_runs * (int(max_iter) * 5 // 4),
                   desc=f"hyperparameters ({criterion})", verbose=verbose, unit="eval",
                   upper_bound=True)
    ev = _Evaluations(kernel, box, objective, search, bar)
    starts = _screened_starts(ev, n_starts)
    runs = starts[:max(1, int(n_restarts))]
    if n_random_starts:
        runs += _random_runs(ev, starts, n_random_starts, random_state, len(starts) + len(runs))
    best, finals = _optimise_starts(ev, runs, max_iter, tol)
    bar.close()
    if best is None:
        raise ValueError(f"Every start of the {criterion!r} optimisation failed (non-finite "
                         "criterion); check the data scale or the bounds.")
    f, u, n_iter = best
    with torch.no_grad():
        vals, a = box.unpack(u)
    learned = _with(kernel, ev.names,
                    [_plain(v, p[2]) for v, p in zip(vals, params, strict=True)])
    s2 = _signal_variance(learned, float(a), X, Y, centers if criterion in NYSTROM_CRITERIA
                          else None)
    return HyperparameterResult(learned, float(a), criterion, f, s2, n_iter, finals)


def check_bounds(name: str, bounds) -> tuple[float, float]:
    """(low, high) as floats, 0 < low < high < inf, else a ValueError naming ``name``."""
    try:
        lo_, hi_ = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high) of positive numbers, got "
                         f"{bounds!r}.") from None
    if not (0 < lo_ < hi_ < math.inf):
        raise ValueError(f"{name} must satisfy 0 < low < high < inf, got {bounds!r}.")
    return lo_, hi_


def _signal_variance(kernel, alpha, X, Y, centers):
    """Maximum-likelihood signal variance per target, y_t^T (K + alpha I)^{-1} y_t / n (with
    ``centers``: Q = K_nm K_mm^{-1} K_mn for K, by Woodbury); a float for one target."""
    n = Y.shape[0]
    with torch.no_grad():
        if centers is None:  # one factorisation, no inverse
            L = _cholesky(_shifted(kernel(X), alpha))
            q = (Y * torch.cholesky_solve(Y, L)).sum(0)
        else:
            Lm = _cholesky(kernel(centers))
            V = torch.linalg.solve_triangular(Lm, kernel(X, centers).T, upper=False)
            B = V @ V.T
            B.diagonal().add_(alpha)
            VY = torch.linalg.solve_triangular(_cholesky(B), V @ Y, upper=False)
            q = ((Y * Y).sum(0) - (VY * VY).sum(0)) / alpha
    s2 = (q / n).cpu().numpy().astype(np.float64)
    return float(s2[0]) if s2.size == 1 else s2


def _search_dtype(search_dtype, criterion, kernel, fixed_alpha):
    """float32 or float64; ``fixed_alpha``: the penalty when it is not learned, else None."""
    if search_dtype not in ("auto", "float32", "float64"):
        raise ValueError("search_dtype must be 'auto', 'float32' or 'float64', got "
                         f"{search_dtype!r}.")
    if (search_dtype == "float64" or criterion not in EXACT_CRITERIA
            or (fixed_alpha is not None and fixed_alpha < _FLOAT32_MIN_ALPHA)):
        return torch.float64
    if not kernel.is_stationary:
        if search_dtype == "float32":
            raise ValueError("search_dtype='float32' needs a shift-invariant kernel (its inputs "
                             f"are centred before the cast); {kernel!r} is not.")
        return torch.float64
    return torch.float32


def _lbfgs(u0, value_at, search, objective, max_iter, tol, alpha_of):
    """L-BFGS from u0 on ``search`` (float32, or the float64 ``objective`` itself).

    A float32 run switches to the float64 criterion for good where the penalty ``alpha_of(u)``
    falls below ``_FLOAT32_MIN_ALPHA``. When it ends with fewer than three float64 evaluations
    (converged in float32, or failed), L-BFGS goes on in float64 from its best point with the
    curvature pairs of its completed iterations. Returns the best float64 point, its criterion
    (inf when none was evaluated) and the iterations."""
    u = u0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([u], lr=1.0, max_iter=int(max_iter), tolerance_grad=1e-9,
                            tolerance_change=tol, history_size=20,
                            line_search_fn="strong_wolfe")
    best: dict[bool, tuple[float, torch.Tensor]] = {}  # float64?: the best evaluated point
    mode: dict[str, Any] = {"fn": search, "n64": 0}

    def closure():
        opt.zero_grad()
        if mode["fn"] is not objective and float(alpha_of(u.detach())) < _FLOAT32_MIN_ALPHA:
            mode["fn"] = objective
        fn = mode["fn"]
        f = value_at(u, fn)
        if not torch.isfinite(f):
            raise FloatingPointError
        f.backward()
        value, key = float(f.detach()), fn is objective
        mode["n64"] += key
        if key not in best or value <= best[key][0]:
            best[key] = (value, u.detach().clone())
        return f

    def run():
        try:
            opt.step(closure)
        except (FloatingPointError, ValueError, torch.linalg.LinAlgError):
            return False  # a step that leaves the feasible region: the best point is kept
        return True

    ok = run()
    if search is not objective and mode["n64"] < 3 and best:
        state = opt.state[u]
        if ok and "d" in state:
            # the next curvature pair would pair a float32 and a float64 gradient at one
            # point: a zero step leaves it out; the float32 pairs are kept
            state["d"] = torch.zeros_like(state["d"])
        else:  # an interrupted step() keeps none of its pairs
            opt.state.clear()
        with torch.no_grad():  # the best float64 point when there is one
            u.copy_(best.get(True, best.get(False))[1])
        mode["fn"] = objective
        run()
    n_iter = int(opt.state[u].get("n_iter", 0)) if u in opt.state else 0
    if True not in best:
        return u0, math.inf, n_iter
    return best[True][1], best[True][0], n_iter


def _objective(criterion, X, Y, centers, validation_fraction, random_state):
    if criterion == "marginal_likelihood":
        return lambda k, a: krr_negative_log_marginal_likelihood(_gram(k, X), Y, a)
    if criterion == "loo":
        return lambda k, a: krr_loo_error(_gram(k, X), Y, a)
    if criterion == "gcv":
        return lambda k, a: krr_gcv_error(_gram(k, X), Y, a)
    if criterion == "nystrom_marginal_likelihood":
        return lambda k, a: nystrom_negative_log_marginal_likelihood(
            k(X, centers), k(centers), k.diag(X), Y, a)
    # the project's one holdout rule (kernelflow.utils.holdout)
    tr, val = holdout_indices(X, validation_fraction, random_state)
    check_sides(tr.size, val.size, validation_fraction)
    tr, val = torch.as_tensor(tr, device=X.device), torch.as_tensor(val, device=X.device)
    Ytr, Yval = Y[tr], Y[val]
    # the validation targets are centred on the training mean, like the fitted intercept
    mean = Ytr.mean(0)
    return lambda k, a: nystrom_validation_error(
        k(X[tr], centers), k(centers), k(X[val], centers), Ytr - mean, Yval - mean, a)
