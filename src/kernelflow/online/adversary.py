"""The greedy adversary of Jézéquel et al. (2019, Sec. 4): a stream built against a learner.

At every round the adversary picks the point of [-1, 1]^d and the label in {-1, +1} that
maximise the regret increment of the learner against the best kernel ridge predictor in
hindsight, by random candidates refined locally (and optionally polished by L-BFGS-B).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import minimize

from ._updates import GrowingCholeskyInverse

if TYPE_CHECKING:
    from ._base import OnlineRegressorBase

__all__ = ["greedy_adversary"]


def greedy_adversary(learner: OnlineRegressorBase, n: int = 80, d: int = 5, *, alpha: float = 1.0,
                     sigma: float = 1.0, n_candidates: int = 512, polish: bool = True,
                     random_state: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Greedy adversarial sequence against ``learner`` (Jézéquel et al. 2019, App. G, Fig. 3).

    Cost per round: O(n_candidates · (learner prediction + t²)) plus the polish.

    The regret is measured against the best regularised function of the Gaussian RKHS,
    ``R_t = Σ_{s≤t} (y_s - ŷ_s)² - min_f [Σ_{s≤t} (y_s - f(x_s))² + λ||f||²]``, whose second term
    is ``λ Yᵀ(K + λI)⁻¹Y``. Appending ``(x, y)`` increases it by
    ``(y - ŷ(x))² - λ (y - m(x))² / (λ + s²(x))`` (m, s² the comparator's posterior mean and
    variance), convex in y, so at each round the adversary takes ``y ∈ {-1, 1}`` and maximises over
    ``x ∈ [-1, 1]^d``: the gain of ``n_candidates`` uniform points is evaluated in one batch,
    refined three times by batches around the 8 best points (radius 0.3, 0.1, 0.03), and the
    winner is polished with scipy's L-BFGS-B; then the round is played.
    The learner's answer at a candidate x is its pure prediction (``predict``), which is the
    round's prediction except when a sampled dictionary changes in that round.

    Parameters
    ----------
    learner : online learner (fresh)
    n, d : int
        Rounds and dimension (the paper: up to 80, d = 5).
    alpha, sigma : float
        λ and the Gaussian bandwidth of the comparator class.
    n_candidates : int, default=512
    polish : bool, default=True
    random_state : int, default=0

    Returns
    -------
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,)
    y_pred : ndarray of shape (n,)
        The learner's strict-protocol predictions.
    regret : ndarray of shape (n,)
        ``R_t`` for t = 1..n.

    Examples
    --------
    >>> from kernelflow.online import KernelAWV, greedy_adversary
    >>> X, y, y_pred, regret = greedy_adversary(KernelAWV(), n=5, d=2, n_candidates=32,
    ...                                         polish=False)
    >>> X.shape, set(y.tolist()) <= {-1.0, 1.0}, bool(regret[-1] > 0)
    ((5, 2), True, True)
    """
    rng = np.random.default_rng(random_state)
    chol = GrowingCholeskyInverse()
    Xs = np.zeros((n, d))
    ys = np.zeros(n)
    preds = np.zeros(n)
    regret = np.zeros(n)
    lam = float(alpha)
    cum_learner = 0.0

    def gain(C: np.ndarray, sign: float, t: int) -> np.ndarray:
        """Regret increment for candidates C (N, d) and label ``sign``."""
        if t:
            D = np.maximum((C * C).sum(1)[:, None] + (Xs[:t] ** 2).sum(1)[None] - 2 * C @ Xs[:t].T,
                           0.0)
            Lk = np.exp(-0.5 / sigma**2 * D) @ chol.Linv[:t, :t].T  # rows (L⁻¹k(x))ᵀ
            m, delta2 = Lk @ chol.z[:t], lam + 1.0 - np.einsum("ij,ij->i", Lk, Lk)
            yhat = learner._predict_rows(C)
        else:
            m, delta2, yhat = np.zeros(len(C)), np.full(len(C), lam + 1.0), np.zeros(len(C))
        return (sign - yhat) ** 2 - lam * (sign - m) ** 2 / delta2

    for t in range(n):
        best: tuple[float, np.ndarray | None, float | None] = (-np.inf, None, None)
        for sign in (-1.0, 1.0):
            C = rng.uniform(-1.0, 1.0, size=(n_candidates, d))
            g = gain(C, sign, t)
            for radius in (0.3, 0.1, 0.03):  # local refinement around the 8 best points
                top = C[np.argsort(g)[-8:]]
                C = np.clip(np.repeat(top, n_candidates // 8, axis=0)
                            + radius * rng.standard_normal((8 * (n_candidates // 8), d)), -1, 1)
                C = np.vstack([top, C])
                g = gain(C, sign, t)
            i = int(np.argmax(g))
            if g[i] > best[0]:
                best = (float(g[i]), C[i].copy(), sign)
        best_gain, x, y = best
        assert x is not None and y is not None  # some candidate has a finite gain
        if polish:
            res = minimize(lambda z, sign=y, t=t: -float(gain(z[None], sign, t)[0]), x,
                           method="L-BFGS-B", bounds=[(-1.0, 1.0)] * d, options={"maxiter": 10})
            if -res.fun > best_gain:
                x = np.asarray(res.x, dtype=np.float64)
        preds[t] = float(learner.progressive_predict(x[None], np.array([y]))[0])
        diff = Xs[:t] - x
        chol.append(np.exp(-0.5 / sigma**2 * np.einsum("ij,ij->i", diff, diff)), 1.0 + lam)
        chol.set_label(y)
        Xs[t], ys[t] = x, y
        cum_learner += (y - preds[t]) ** 2
        regret[t] = cum_learner - lam * float(chol.z[: t + 1] @ chol.z[: t + 1])
    return Xs, ys, preds, regret
