"""Multinomial kernel logistic regression on a Nyström subspace by Newton's method.

With centres C (M of them), K = K(X, C) (n x M), K_MM = K(C, C), c classes and one-hot labels
Y, the model F = K A + 1 b^T (A: M x c, b: c) minimises

    J(A, b) = sum_i w_i [log sum_k exp F_ik - F_{i, y_i}] + alpha / 2 tr(A^T K_MM A),       (1)

the softmax (cross-entropy) loss plus the RKHS norm of the c functions. With P = softmax(F):

    grad_A = K^T W (P - Y) + alpha K_MM A,        grad_b = 1^T W (P - Y),
    H [V, v] = (K^T W S + alpha K_MM V,  1^T W S),  S_i = P_i * U_i - P_i (P_i . U_i),
    U = K V + 1 v^T.

The iteration runs in whitened coordinates A = T Theta, T = U s^{-1/2} (K_MM = U diag(s) U^T,
eigenvalues below rounding level dropped: A could grow along them without changing f), where the
penalty is alpha ||Theta||^2. Each Newton step solves H d = -grad by preconditioned conjugate
gradients (:func:`kernelflow.linalg.conjugate_gradient`), inexactly: relative tolerance
min(0.1, sqrt(||grad|| / ||grad_0||)) (Eisenstat and Walker's forcing term), but never tighter
than what brings the gradient to ``tol`` (no over-solving in the last step). One product K d
per Newton step serves every trial of the Armijo backtracking (F(t) = F + t K d).

The preconditioner is Falkon's (Rudi et al. 2017; Meanti et al. 2020 reweight it in the same
way for the logistic loss), block diagonal over classes: with d_k = c / (c - 1)
sum_i w_i P_ik (1 - P_ik) / W the average curvature of class k on vectors summing to zero over
classes, K^T W_k K ~ d_k W / M K_MM^2, whose whitened block d_k W s / M + alpha is diagonal. The
intercept b_k is nearly collinear with the functions of the span (a wide kernel holds the
constants), so it is not left to a separate diagonal: the block is bordered by the intercept's
row (curvature d_k W, coupling d_k W / M G^T 1 with G = K_MM T, the model at the centres) and
inverted through the Schur complement of its diagonal part, O(r c) per application. The output
is projected on vectors summing to zero over classes: softmax does not see a common shift of
the c functions, the gradient and H keep every direction in that subspace, and the average
curvature there is the c / (c - 1) multiple above (on which H's common mode, penalised by alpha
only, would otherwise cost CG iterations).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..linalg import conjugate_gradient

__all__ = ["LogisticSolution", "softmax_objective", "nystrom_logistic_newton", "smoothed_targets",
           "temperature_scaling"]

logger = logging.getLogger(__name__)

_F64 = torch.float64
_EPS = torch.finfo(_F64).eps


@dataclass
class LogisticSolution:
    """Result of :func:`nystrom_logistic_newton`."""

    coef: torch.Tensor  # (M, c)
    intercept: torch.Tensor  # (c,)
    n_iter: int
    converged: bool
    objective: float
    gradient_norms: list = field(default_factory=list)
    cg_iterations: list = field(default_factory=list)


def softmax_objective(F: torch.Tensor, labels: torch.Tensor, w: torch.Tensor | None,
                      A: torch.Tensor, KA_mm: torch.Tensor, alpha: float) -> torch.Tensor:
    """J of (1) from F = K A + b, the label indices, weights and K_MM A."""
    nll = torch.logsumexp(F, 1) - F.gather(1, labels[:, None])[:, 0]
    loss = nll.sum() if w is None else w @ nll
    return loss + 0.5 * alpha * (A * KA_mm).sum()


class _WhitenedProblem:
    """Problem (1) in whitened Nyström coordinates A = T Theta, with its gradient, Hessian
    product and Falkon preconditioner; vectors stack Theta (r x c, row-major) then b (c)."""

    def __init__(self, matmul, t_matmul, K_mm, labels, n_classes, alpha, sample_weight,
                 fit_intercept):
        self.matmul, self.t_matmul = matmul, t_matmul
        self.labels, self.alpha, self.fit_intercept = labels, alpha, fit_intercept
        self.M, self.c = K_mm.shape[0], int(n_classes)
        self.n = n = labels.shape[0]
        K_mm = K_mm.to(_F64)
        self.w = w = None if sample_weight is None else sample_weight.to(_F64)
        self.W = float(n if w is None else w.sum())
        self.Y = torch.zeros(n, self.c, dtype=_F64)
        self.Y[torch.arange(n), labels] = 1.0
        # K_MM = U diag(s) U^T, A = T Theta with T = U s^{-1/2} on the eigenvalues above
        # rounding level, so that tr(A^T K_MM A) = ||Theta||^2 and the directions that K_MM
        # cannot resolve (where A could grow without changing f) are dropped.
        s_mm, U_mm = torch.linalg.eigh(0.5 * (K_mm + K_mm.T))
        keep = s_mm > float(s_mm.max().clamp_min(1e-300)) * max(1e-10, 10 * self.M * _EPS)
        self.T = U_mm[:, keep] / s_mm[keep].sqrt()
        self.g_1 = U_mm[:, keep].sum(0) * s_mm[keep].sqrt()  # (K_MM T)^T 1
        self.lam_mm = s_mm[keep]
        self.r_dim = int(keep.sum())

    def split(self, v):
        VA = v[:self.r_dim * self.c].reshape(self.r_dim, self.c)
        return VA, (v[self.r_dim * self.c:] if self.fit_intercept else None)

    def wcol(self, Z):
        return Z if self.w is None else Z * self.w[:, None]

    def gradient(self, P, Th):
        R = self.wcol(P - self.Y)
        gA = self.T.T @ self.t_matmul(R) + self.alpha * Th
        gb = R.sum(0) if self.fit_intercept else R.new_zeros(0)
        return torch.cat([gA.reshape(-1), gb])

    def objective(self, F, Th) -> float:
        return float(softmax_objective(F, self.labels, self.w, Th, Th, self.alpha))

    def hessian(self, P):
        """v -> H v at the probabilities P, on (len, 1) columns."""

        def hess(v):
            VA, vb = self.split(v[:, 0])
            U = self.matmul(self.T @ VA)
            if vb is not None:
                U = U + vb
            S = self.wcol(P * U - P * (P * U).sum(1, keepdim=True))
            hA = self.T.T @ self.t_matmul(S) + self.alpha * VA
            hb = S.sum(0) if self.fit_intercept else S.new_zeros(0)
            return torch.cat([hA.reshape(-1), hb]).reshape(-1, 1)

        return hess

    def preconditioner(self, P):
        """Falkon's (d W / M K_MM^2 + alpha K_MM)^{-1} in whitened coordinates, diagonal,
        bordered by the intercept row (d W, its coupling d W / M G^T 1): the inverse by the
        Schur complement of the diagonal block, O(r c); output on sum-zero vectors."""
        c, W, M, r_dim = self.c, self.W, self.M, self.r_dim
        # (c,) average curvatures on sum-zero vectors
        d = (self.wcol(P * (1.0 - P)).sum(0) / W * (c / (c - 1))).clamp_min(1e-8)
        diag = d[None, :] * W * (self.lam_mm[:, None] / M) + self.alpha  # (r, c)
        u = d[None, :] * (W / M) * self.g_1[:, None]  # (r, c)
        schur = (d * W - (u * u / diag).sum(0)).clamp_min(_EPS * d * W)  # (c,)

        def apply_aug(R):
            rA = R[:r_dim]
            if not self.fit_intercept:
                return rA / diag
            zb = (R[r_dim] - (u * rA / diag).sum(0)) / schur
            return torch.cat([(rA - u * zb) / diag, zb[None]], 0)

        def precondition(r):
            rA, rb = self.split(r[:, 0])
            R = rA if rb is None else torch.cat([rA, rb[None]], 0)
            Z = apply_aug(R)
            Z = Z - Z.mean(1, keepdim=True)  # stay on vectors summing to zero over classes
            return torch.cat([Z[:r_dim].reshape(-1), Z[r_dim:].reshape(-1)]).reshape(-1, 1)

        return precondition


def _armijo(pb: _WhitenedProblem, Th, F, J: float, dA, dF, slope: float):
    """Backtracking from the full step (halving, at most 40 trials) until J decreases by
    1e-4 t slope; returns (t, Theta, F, J) of the accepted step, or None."""
    t = 1.0
    for _ in range(40):
        Th_new = Th + t * dA
        F_new = F + t * dF
        J_new = pb.objective(F_new, Th_new)
        if J_new <= J + 1e-4 * t * slope:
            return t, Th_new, F_new, J_new
        t *= 0.5
    return None


def nystrom_logistic_newton(
    matmul: Callable[[torch.Tensor], torch.Tensor],  # V (M, c) -> K V (n, c)
    t_matmul: Callable[[torch.Tensor], torch.Tensor],  # U (n, c) -> K^T U (M, c)
    K_mm: torch.Tensor,  # (M, M)
    labels: torch.Tensor,  # (n,) long, in [0, c)
    n_classes: int,
    alpha: float,
    *,
    sample_weight: torch.Tensor | None = None,
    fit_intercept: bool = True,
    max_iter: int = 50,
    tol: float = 1e-6,
    cg_max_iter: int = 200,
) -> LogisticSolution:
    """Minimise (1) by inexact Newton steps with Falkon-preconditioned CG.

    Stops when ||grad|| <= tol * ||grad at A = 0, b = 0|| or when no step decreases J any more
    (the objective is then flat to rounding). Cost: O(M^3) once (eigendecomposition of K_MM),
    then two products with K, O(n M c) each, per Newton step and per CG iteration.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(-2, 2, 40, dtype=torch.float64).reshape(-1, 1)
    >>> labels = (X[:, 0] > 0).long()
    >>> C = X[::4]
    >>> K, Kmm = Gaussian(1.0)(X, C), Gaussian(1.0)(C)
    >>> sol = nystrom_logistic_newton(lambda V: K @ V, lambda U: K.T @ U, Kmm, labels, 2, 0.1,
    ...                               tol=1e-10)
    >>> sol.converged, sol.gradient_norms[-1] < 1e-8
    (True, True)
    """
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be positive and finite, got {alpha!r}.")
    pb = _WhitenedProblem(matmul, t_matmul, K_mm, labels, n_classes, alpha, sample_weight,
                          fit_intercept)
    c = pb.c
    Th = torch.zeros(pb.r_dim, c, dtype=_F64)
    b = torch.zeros(c, dtype=_F64)
    F = torch.zeros(pb.n, c, dtype=_F64)
    J = pb.objective(F, Th)
    P = torch.softmax(F, 1)
    g = pb.gradient(P, Th)
    g0 = float(torch.linalg.vector_norm(g))
    norms, cg_its = [g0], []
    converged = g0 == 0.0
    k = 0
    while not converged and k < max_iter:
        k += 1
        rel = norms[-1] / g0
        forcing = max(min(0.1, rel**0.5), min(0.5, 0.5 * tol / rel), 1e-14)
        res = conjugate_gradient(pb.hessian(P), -g, tol=forcing, max_iter=cg_max_iter,
                                 preconditioner=pb.preconditioner(P))
        cg_its.append(res.n_iter)
        step = res.x[:, 0] if res.x.ndim == 2 else res.x
        slope = float(g @ step)
        if not slope < 0:  # not a descent direction (CG broke down): steepest descent
            step, slope = -g, -float(g @ g)
        dA, db = pb.split(step)
        dF = matmul(pb.T @ dA)  # one product for every trial step
        if db is not None:
            dF = dF + db
        accepted = _armijo(pb, Th, F, J, dA, dF, slope)
        if accepted is None:  # J is flat to rounding around the iterate
            break
        t, Th, F, J = accepted
        if db is not None:
            b = b + t * db
        P = torch.softmax(F, 1)
        g = pb.gradient(P, Th)
        norms.append(float(torch.linalg.vector_norm(g)))
        logger.debug("Newton %d: J = %.10g, |grad| = %.3g, %d CG iterations, step %.3g",
                     k, J, norms[-1], res.n_iter, t)
        converged = norms[-1] <= tol * g0
    converged = converged or norms[-1] <= max(tol, 1e-8) * g0
    return LogisticSolution(coef=pb.T @ Th, intercept=b, n_iter=k, converged=bool(converged),
                            objective=J, gradient_norms=norms, cg_iterations=cg_its)


def smoothed_targets(labels: torch.Tensor, n_classes: int,
                     sample_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Platt's regularised targets, (n, c): (N_y + 1) / (N_y + 2) on the row's class y, the
    rest 1 / (N_y + 2) shared equally by the other classes (N_y: the (weighted) count of class y).

    For two classes these are Platt's (1999) t+ = (N+ + 1) / (N+ + 2), t- = 1 / (N- + 2);
    they keep a calibration map finite on separable scores.
    """
    n, c = labels.shape[0], int(n_classes)
    w = torch.ones(n, dtype=_F64) if sample_weight is None else sample_weight.to(_F64)
    counts = torch.zeros(c, dtype=_F64).index_add_(0, labels, w)
    N = counts[labels]  # (n,)
    Q = (1.0 / (N + 2.0) / (c - 1))[:, None].expand(n, c).clone()
    Q[torch.arange(n), labels] = (N + 1.0) / (N + 2.0)
    return Q


def temperature_scaling(
    logits: torch.Tensor,  # (n, c)
    labels: torch.Tensor,  # (n,) long, in [0, c)
    *,
    sample_weight: torch.Tensor | None = None,
    bounds: tuple[float, float] = (math.exp(-10.0), math.exp(10.0)),
    tol: float = 1e-10,
    max_iter: int = 100,
) -> float:
    """Inverse temperature beta minimising sum_i w_i [log sum_k exp(beta L_ik) - beta Q_i . L_i].

    Guo et al. (2017)'s temperature scaling (scikit-learn's ``CalibratedClassifierCV(
    method="temperature")``), fitted to Platt's regularised targets Q
    (:func:`smoothed_targets`) rather than the 0/1 labels, so that separable scores give a
    finite beta. The objective is convex in beta with derivative sum_i w_i (P_i - Q_i) . L_i
    (P = softmax(beta L)) and second derivative sum_i w_i Var_{P_i}(L_i): safeguarded Newton
    steps on that derivative inside ``bounds`` (bisection when a step leaves the bracket).
    softmax(beta L) keeps the arg-max of L. Cost O(n c) per step.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> f = torch.randn(2000, generator=g, dtype=torch.float64)
    >>> y = (torch.rand(2000, generator=g, dtype=torch.float64) < torch.sigmoid(6 * f)).long()
    >>> beta = temperature_scaling(torch.stack([-f, f], 1), y)  # true logit 6 f = 2 beta f
    >>> round(beta, 0)
    3.0
    """
    L = logits.to(_F64)
    n, c = L.shape
    if c < 2 or labels.shape[0] != n:
        raise ValueError(f"temperature_scaling needs (n, c >= 2) logits and n labels, got "
                         f"logits of shape {tuple(L.shape)} and {labels.shape[0]} labels.")
    if not bool(torch.isfinite(L).all()):
        raise ValueError("temperature_scaling: the scores contain NaN or infinity.")
    w = torch.ones(n, dtype=_F64) if sample_weight is None else sample_weight.to(_F64)
    Q = smoothed_targets(labels, c, w)
    qL = (Q * L).sum(1)

    def derivatives(beta):
        P = torch.softmax(beta * L, 1)
        mean = (P * L).sum(1)
        g = float(w @ (mean - qL))
        h = float(w @ ((P * L * L).sum(1) - mean * mean))
        return g, h

    lo, hi = bounds
    g_lo, _ = derivatives(lo)
    if g_lo >= 0:  # the scores carry no signal (or the wrong one): the flattest map allowed
        return lo
    g_hi, _ = derivatives(hi)
    if g_hi <= 0:
        return hi
    beta = 1.0 if lo < 1.0 < hi else math.sqrt(lo * hi)
    for _ in range(max_iter):
        g, h = derivatives(beta)
        if g > 0:
            hi = beta
        else:
            lo = beta
        new = beta - g / h if h > 0 else 0.5 * (lo + hi)
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - beta) <= tol * max(beta, 1.0) or hi - lo <= tol * max(beta, 1.0):
            return new
        beta = new
    return beta
