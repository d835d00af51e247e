"""Gaussian-process reading of kernel ridge regression: predictive variance and evidence.

Exact model. Kernel ridge regression with penalty ``alpha`` (scikit-learn's scale, the
objective sum_i w_i (y_i - f(x_i))^2 + alpha ||f||_H^2, coefficients
c = (K + alpha W^{-1})^{-1} y) has the posterior mean of the Gaussian process f ~ GP(0, k)
observed with independent noise of variance alpha / w_i (alpha with unit weights): the penalty
*is* the noise variance, and the kernel's own scale is the signal variance. The posterior of
the latent f at test points x_* is then

    mean = k(x_*, X) c,
    cov  = k(x_*, x_*) - k(x_*, X) (K + alpha W^{-1})^{-1} k(X, x_*),

computed as cov = k_** - V^T V with V = L^{-1} W^{1/2} k(X, x_*) and L the Cholesky factor of
A = W^{1/2} K W^{1/2} + alpha I (rows of zero weight drop out). This is scikit-learn's
``GaussianProcessRegressor`` with ``alpha`` = noise, ``optimizer=None`` and
``normalize_y=False``; the intercept of ``fit_intercept=True`` is treated as a known mean (the
variance does not include its uncertainty). The log marginal likelihood is that of the
(centred) targets under the same model,

    log p(y) = -1/2 y^T (K + alpha W^{-1})^{-1} y - 1/2 log det(K + alpha W^{-1}) - n/2 log 2 pi,

over the rows of positive weight, summed over targets.

Nyström model (DTC, the deterministic training conditional of Seeger et al. 2003; see
Quinonero-Candela & Rasmussen 2005, Sec. 5). With centres C (M of them) and
Q = K_nM K_MM^{-1} K_Mn, the DTC model replaces the prior covariance of the training values by
Q. Its posterior mean is the Nyström KRR solution k(x, C) (K_Mn D K_nM + alpha K_MM)^{-1}
K_Mn D y, and its predictive covariance is

    cov = k_** - k_*M K_MM^{-1} k_M* + alpha k_*M (K_Mn D K_nM + alpha K_MM)^{-1} k_M*,

computed with K_MM = L L^T, G = L^{-1} K_Mn D K_nM L^{-T} and G + alpha I = R R^T as
k_** - ||v||^2 + alpha ||R^{-1} v||^2, v = L^{-1} k_M*. G is accumulated in whitened form,
G = sum_blocks A_b D_b A_b^T with A_b = L^{-1} K_Mb (as GPflow's SGPR does): a sum of Gram
products is positive semi-definite in floating point as well, so G + alpha I factorises at
any penalty, whereas L^{-1} (K_Mn D K_nM) L^{-T} formed after the pass amplifies the rounding
of K_Mn D K_nM by cond(K_MM) and loses definiteness at learned (small) penalties and long
bandwidths. The DTC evidence is
log N(y | 0, Q + alpha D^{-1}), by Woodbury and the determinant lemma

    -1/(2 alpha) (y^T D y - ||R^{-1} L^{-1} K_Mn D y||^2)
    - 1/2 (n log alpha - sum log w + log det(G + alpha I) - M log alpha) - n/2 log 2 pi.

With all training points as centres Q = K and both formulas are the exact ones.

Signal variance. Both posteriors are computed for the prior k (signal variance 1); a model
whose prior is s^2 k with noise s^2 alpha / w_i (the Gaussian-process reading of learned
hyperparameters, :mod:`kernelflow.solvers.hyperparameters`) has the same mean, s^2 times the
(co)variance, and the evidence -q / (2 s^2) - 1/2 (log det + n log s^2 + n log 2 pi) with the
quadratic form q and the log determinant of the unit-scale model (``signal_variance`` of
:meth:`ExactPosterior.log_marginal_likelihood` and :meth:`NystromPosterior.log_evidence`).

FITC (fully independent training conditional, Snelson & Ghahramani 2006; Quinonero-Candela &
Rasmussen 2005, Sec. 6) keeps the exact prior variance at every training point: its prior
covariance is Q + diag(K - Q), so the noise of row i becomes
lambda_i = alpha / w_i + (k_ii - q_ii). Every formula above holds with the weights D replaced by
the effective weights D' = alpha Lambda^{-1}, w'_i = w_i alpha / (alpha + w_i (k_ii - q_ii)),
and the test point's own correction k_** - q_** is the first term of the covariance already;
the evidence is log N(y | 0, Q + diag(K - Q) + alpha D^{-1}). ``method="fitc"`` computes q_ii
= ||L^{-1} k_Mi||^2 in the same pass (K_MM is factorised first). The estimator's mean stays
the Nyström ridge solution (FITC's own mean would reweight the rows by D'); with all training
points as centres K - Q = 0 and DTC, FITC and the exact posterior coincide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..collectives import all_reduce_sum
from ..kernels import Kernel
from ..linalg import cholesky
from ..operators import KernelOperator, Options, memory_budget
from ..sources import DataSource
from ..utils._progress import progress
from .nystrom import block_rows

__all__ = [
    "ExactPosterior",
    "NystromPosterior",
    "exact_posterior",
    "nystrom_posterior",
]

_F64 = torch.float64
_LOG_2PI = math.log(2.0 * math.pi)


def _tri_solve(L, B):
    return torch.linalg.solve_triangular(L, B, upper=False)


def _kernel_diag(kernel: Kernel, X: torch.Tensor) -> torch.Tensor:
    if kernel.is_stationary:
        return kernel.diag(X).to(_F64)
    n, out = X.shape[0], []
    for s in range(0, n, 1024):  # row by row is slow for non-stationary kernels: batch it
        Xb = X[s:s + 1024]
        out.append(torch.stack([kernel(Xb[i:i + 1], Xb[i:i + 1])[0, 0]
                                for i in range(Xb.shape[0])]))
    return torch.cat(out).to(_F64) if out else torch.zeros(0, dtype=_F64)


def _per_target(signal_variance, n_targets: int) -> torch.Tensor:
    """Signal variances as a float64 tensor of shape (n_targets,) (None: ones)."""
    if signal_variance is None:
        return torch.ones(n_targets, dtype=_F64)
    s2 = torch.as_tensor(signal_variance, dtype=_F64).reshape(-1).cpu()
    if s2.numel() == 1:
        s2 = s2.expand(n_targets)
    if s2.numel() != n_targets or not bool(torch.isfinite(s2).all()) or bool((s2 <= 0).any()):
        raise ValueError(f"signal_variance must be positive and finite, one value or one per "
                         f"target ({n_targets}), got {signal_variance!r}.")
    return s2


def _scaled_evidence(quad: torch.Tensor, logdet: float, n: float, s2: torch.Tensor) -> float:
    """sum_t log N(y_t | 0, s2_t A) from q_t = y_t^T A^{-1} y_t and log det A."""
    quad = quad.to(_F64).cpu()
    return float((-0.5 * quad / s2 - 0.5 * (logdet + n * torch.log(s2) + n * _LOG_2PI)).sum())


@dataclass
class ExactPosterior:
    """Cholesky factors of W^{1/2} K W^{1/2} + alpha I, one per distinct penalty.

    Attributes
    ----------
    factors : list of (float, tensor (n, n), tensor of target indices)
        (alpha, lower factor L, the targets using this alpha).
    sqrt_weight : tensor (n,) or None
    n_targets : int
    jitter : float
        Largest diagonal jitter that a factorisation needed (0 when none).
    """

    factors: list
    sqrt_weight: torch.Tensor | None
    n_targets: int
    jitter: float = 0.0

    def covariance(self, K_xs: torch.Tensor, k_ss: torch.Tensor, *, full: bool = False):
        """Posterior (co)variance of the latent function at the test points.

        Parameters
        ----------
        K_xs : tensor (n, m)
            k(X_fit, X_test).
        k_ss : tensor (m,) or (m, m)
            Prior variances (``full=False``) or prior covariance (``full=True``).

        Returns
        -------
        tensor of shape (m, t) (variances) or (m, m, t) (covariances), clipped at 0 on the
        diagonal.
        """
        B = K_xs.to(_F64)
        if self.sqrt_weight is not None:
            B = B * self.sqrt_weight[:, None]
        m = K_xs.shape[1]
        out = torch.empty((m, m, self.n_targets) if full else (m, self.n_targets), dtype=_F64)
        for _, L, cols in self.factors:
            V = _tri_solve(L, B)
            if full:
                C = k_ss.to(_F64) - V.T @ V
                C.diagonal().clamp_(min=0.0)
                out[:, :, cols] = C[:, :, None]
            else:
                out[:, cols] = (k_ss.to(_F64) - (V * V).sum(0)).clamp_min(0.0)[:, None]
        return out

    def log_marginal_likelihood(self, coef: torch.Tensor, signal_variance=None) -> float:
        """Log evidence of the targets from the dual coefficients c = (K + alpha W^{-1})^{-1} y.

        Uses y^T (K + alpha W^{-1})^{-1} y = z^T A z with z = W^{-1/2} c (zero on rows of zero
        weight), so the training targets need not be stored. ``signal_variance`` (a float or
        one per target; None: 1) scales the prior covariance, s^2 (K + alpha W^{-1}).
        """
        s2 = _per_target(signal_variance, self.n_targets)
        C = coef.to(_F64).reshape(coef.shape[0], -1)
        sw = self.sqrt_weight
        if sw is None:
            Z, n_pos, log_w, n_zero = C, C.shape[0], 0.0, 0
        else:
            pos = sw > 0
            Z = torch.where(pos[:, None], C / torch.where(pos, sw, 1.0)[:, None], 0.0)
            n_pos, n_zero = int(pos.sum()), int((~pos).sum())
            log_w = float(2.0 * torch.log(sw[pos]).sum())
        total = 0.0
        for alpha, L, cols in self.factors:
            quad = ((L.T @ Z[:, cols]) ** 2).sum(0)
            logdet = 2.0 * float(torch.log(L.diagonal()).sum()) - n_zero * math.log(alpha) - log_w
            total += _scaled_evidence(quad, logdet, n_pos, s2[cols])
        return total


def exact_posterior(K: torch.Tensor, alpha, *, sample_weight: torch.Tensor | None = None,
                    n_targets: int = 1) -> ExactPosterior:
    """Factorise the exact GP posterior of kernel ridge regression. Cost O(n^3 / 3) per penalty.

    Parameters
    ----------
    K : tensor (n, n)
        Training kernel matrix.
    alpha : float or tensor (t,)
        Ridge penalty = noise variance; must be > 0 (alpha = 0 is interpolation, whose
        posterior needs K itself to be non-singular: it is refused).
    sample_weight : tensor (n,), optional
    n_targets : int

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> post = exact_posterior(K, 1.0)
    >>> post.covariance(K, torch.ones(2, dtype=torch.float64)).numpy().round(4)[:, 0]
    array([0.4667, 0.4667])
    """
    alphas = torch.as_tensor(alpha, dtype=_F64).reshape(-1)
    if not bool(torch.isfinite(alphas).all()) or bool((alphas <= 0).any()):
        raise ValueError(
            f"the predictive variance needs a positive noise variance alpha, got {alpha!r}."
        )
    if alphas.numel() not in (1, n_targets):
        raise ValueError(f"alpha has {alphas.numel()} values but there are {n_targets} targets.")
    if alphas.numel() == 1:
        alphas = alphas.expand(n_targets)
    sw = None if sample_weight is None else sample_weight.to(_F64).sqrt()
    A = K.to(_F64)
    A = A * sw[:, None] * sw[None, :] if sw is not None else A.clone()
    factors, jit = [], 0.0
    for a in torch.unique(alphas):
        cols = (alphas == a).nonzero().reshape(-1)
        S = A.clone()
        S.diagonal().add_(float(a))
        L, j = cholesky(S, overwrite=True)
        factors.append((float(a), L, cols))
        jit = max(jit, j)
    return ExactPosterior(factors=factors, sqrt_weight=sw, n_targets=n_targets, jitter=jit)


@dataclass
class NystromPosterior:
    """DTC or FITC posterior of the Nyström model (see the module docstring).

    Attributes
    ----------
    L : tensor (M, M)
        Lower Cholesky factor of K_MM (+ jitter).
    R : tensor (M, M)
        Lower Cholesky factor of G + alpha I, G = L^{-1} K_Mn D K_nM L^{-T}.
    alpha : float
    log_marginal_likelihood : float
        DTC (or FITC) log evidence of the centred targets (summed over targets), prior k.
    method : str
        "dtc" or "fitc".
    quad : tensor (t,)
        y_t^T (Q + alpha D^{-1})^{-1} y_t per target (FITC: its covariance).
    logdet : float
        log det(Q + alpha D^{-1}) (FITC: its covariance), over the rows of positive weight.
    n : float
        Rows of positive weight.
    """

    L: torch.Tensor
    R: torch.Tensor
    alpha: float
    log_marginal_likelihood: float
    method: str = "dtc"
    quad: torch.Tensor | None = None
    logdet: float = 0.0
    n: float = 0.0

    def log_evidence(self, signal_variance=None) -> float:
        """The log evidence with prior covariance s^2 (Q + alpha D^{-1}) (``signal_variance``
        s^2: a float or one per target; None: 1, ``log_marginal_likelihood``)."""
        if signal_variance is None or self.quad is None:
            return self.log_marginal_likelihood
        s2 = _per_target(signal_variance, self.quad.numel())
        return _scaled_evidence(self.quad, self.logdet, self.n, s2)

    def covariance(self, K_cs: torch.Tensor, k_ss: torch.Tensor, *, full: bool = False):
        """Predictive (co)variance from K_cs = k(C, X_test) (M, m) and prior k_ss."""
        V = _tri_solve(self.L, K_cs.to(_F64))
        U = _tri_solve(self.R, V)
        if full:
            C = k_ss.to(_F64) - V.T @ V + self.alpha * (U.T @ U)
            C.diagonal().clamp_(min=0.0)
            return C
        return (k_ss.to(_F64) - (V * V).sum(0) + self.alpha * (U * U).sum(0)).clamp_min(0.0)


def nystrom_posterior(source: DataSource, kernel: Kernel, centers: torch.Tensor, alpha: float,
                      *, y_offset: torch.Tensor | None = None, options: Options | None = None,
                      block_size: int | None = None, method: str = "dtc",
                      verbose: int = 0) -> NystromPosterior:
    """One float64 pass over the rows for the DTC or FITC posterior and evidence (all-reduced).

    Accumulates K_Mn D K_nM, K_Mn D (y - y_offset), sum_i w_i (y_i - y_offset)^2, the number
    of rows of positive weight and the sum of their log weights, with D the sample weights
    (``method="dtc"``) or FITC's effective weights (``method="fitc"``, see the module
    docstring). Cost O(n M (M + d) + M^3), memory O(M^2) plus one row block. ``verbose >= 1``
    shows a bar over the rows of the pass (one estimate of the time left).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.sources import ArraySource
    >>> X = torch.linspace(0, 1, 6, dtype=torch.float64).reshape(-1, 1)
    >>> post = nystrom_posterior(ArraySource(X, torch.sin(X[:, 0])), Gaussian(0.5), X, 0.1)
    >>> bool(post.covariance(Gaussian(0.5)(X, X), torch.ones(6, dtype=torch.float64)).min() >= 0)
    True
    """
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"the predictive variance needs alpha > 0, got {alpha!r}.")
    if method not in ("dtc", "fitc"):
        raise ValueError(f"method must be 'dtc' or 'fitc', got {method!r}.")
    C = centers.to(_F64)
    L, _ = cholesky(KernelOperator(kernel, C, options=options).to_dense().to(_F64).cpu(),
                    warn=False)
    M, t = C.shape[0], source.n_outputs
    G = torch.zeros(M, M, dtype=_F64)
    b = torch.zeros(M, t, dtype=_F64)
    stats = torch.zeros(t + 2, dtype=_F64)  # y^T D y per target, n positive, sum log w
    rows = block_rows(source.n_features, M, _F64, options, block_size)
    rows = max(1, min(rows, memory_budget(options) // (4 * 8 * max(M, 1))))
    bar = progress(total=source.n_samples if verbose else None, desc="Nystrom variance",
                   verbose=verbose, unit="row")
    for blk in source.iter_blocks(rows, dtype=_F64):
        bar.update(blk.X.shape[0])
        Kb = KernelOperator(kernel, blk.X, C, options=options).to_dense().to(_F64).cpu()
        A = _tri_solve(L, Kb.T)  # whitened block L^{-1} K_Mb, (M, b)
        del Kb
        if blk.y is None:
            raise ValueError("the predictive variance needs the training targets (y).")
        y = blk.y.to(_F64).reshape(blk.X.shape[0], -1).cpu()
        if y_offset is not None:
            y = y - y_offset.to(_F64).reshape(1, -1)
        w = blk.sample_weight
        if method == "fitc":
            # FITC: noise alpha / w_i + (k_ii - q_ii), i.e. weight w_i alpha / (alpha + w_i d_i)
            d = (_kernel_diag(kernel, blk.X.to(_F64)).cpu() - (A * A).sum(0)).clamp_min(0.0)
            w = torch.ones_like(d) if w is None else w.to(_F64).cpu()
            w = torch.where(w > 0, w * alpha / (alpha + w * d), torch.zeros_like(w))
        if w is None:
            Aw, yw = A, y
            stats[-2] += blk.X.shape[0]
        else:
            w = w.to(_F64).cpu()
            Aw, yw = A * w[None, :], y * w[:, None]
            pos = w > 0
            stats[-2] += pos.sum()
            stats[-1] += torch.log(w[pos]).sum()
        G += Aw @ A.T
        b += Aw @ y
        stats[:t] += (yw * y).sum(0)
    bar.close()
    G, b, stats = all_reduce_sum(G), all_reduce_sum(b), all_reduce_sum(stats)
    G = 0.5 * (G + G.T)  # L^{-1} K_Mn D K_nM L^{-T}, positive semi-definite by construction
    G.diagonal().add_(alpha)
    R, _ = cholesky(G, overwrite=True, warn=False)
    bt = _tri_solve(R, b)
    n_pos, log_w = float(stats[-2]), float(stats[-1])
    quad = (stats[:t] - (bt * bt).sum(0)) / alpha
    logdet = ((n_pos - M) * math.log(alpha) - log_w
              + 2.0 * float(torch.log(R.diagonal()).sum()))
    lml = _scaled_evidence(quad, logdet, n_pos, torch.ones(t, dtype=_F64))
    return NystromPosterior(L=L, R=R, alpha=float(alpha), log_marginal_likelihood=lml,
                            method=method, quad=quad, logdet=logdet, n=n_pos)
