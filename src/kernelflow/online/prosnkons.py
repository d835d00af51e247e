"""Pros-N-KONS (Calandriello, Lazaric & Valko, NeurIPS 2017), square loss."""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from ..estimators._base import KERNEL_CONSTRAINTS
from ._base import OnlineRegressorBase, kernel_block, kernel_diag
from ._updates import KORS
from .pkawv_nystrom import _inv_sqrt_psd

if TYPE_CHECKING:
    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["ProsNKONS"]


class ProsNKONS(OnlineRegressorBase):
    """Kernel Online Newton Step in a Nyström embedding that restarts at every new centre.

    A KORS dictionary I (ridge μ, accuracy ε, budget β, seeded) defines the embedding
    ``φ̃(x) = K_II^{-1/2} k_I(x)``. Within an epoch (between two dictionary changes) KONS runs
    on ``φ̃``: predict ``ŷ_t = clip(wᵀφ̃(x_t), -C, C)`` (the projection on ``|wᵀφ̃(x_t)| ≤ C``),
    then with ``g_t = 2(ŷ_t - y_t) φ̃(x_t)``

        A_t = A_{t-1} + (η/2) g_t g_tᵀ,   w ← w - A_t⁻¹ g_t,    A_0 = αI,

    (Sherman–Morrison on ``A⁻¹``). A new dictionary point restarts the learner (``w = 0``,
    ``A = αI``) in the new embedding, which is why its regret carries a factor |I_n| (eq. 8).
    The paper leaves (α, η, C) unspecified; the defaults here are α = 1, η = 1, C = 1 (targets
    scaled to [-1, 1]).

    Cost: O(m²) per round, O(m³ + md) per dictionary change.

    Parameters
    ----------
    alpha : float, default=1.0
        Regulariser α of A.
    kernel : str or Kernel, default="rbf"
    sigma : float, default=1.0
    gamma : float, default=None
    degree : int, default=3
    coef0 : float, default=1.0
    mu : float, default=1.0
        KORS ridge.
    eps : float, default=0.5
        KORS accuracy.
    beta : float, default=1.0
        KORS budget.
    kors_weights : {"inverse", "sqrt"}, default="inverse"
    eta : float, default=1.0
        Curvature η of the second-order update.
    C : float, default=1.0
        Bound on ``|f(x_t)|`` (projection).
    random_state : int, RandomState or None, default=None

    Attributes
    ----------
    kernel_ : Kernel
    dictionary_ : ndarray of shape (m, n_features_in_)
    n_restarts_ : int
    n_rounds_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    PKAWVNystrom : same dictionary, no restarts, AWV update.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import ProsNKONS
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(500, 2)); y = np.sin(3 * X[:, 0])
    >>> model = ProsNKONS(sigma=0.5, random_state=0)
    >>> y_pred = model.progressive_predict(X, y)
    >>> model.n_restarts_, round(float(np.mean((y_pred[250:] - y[250:]) ** 2)), 3)
    (55, 0.184)
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        **{k: KERNEL_CONSTRAINTS[k] for k in ("kernel", "sigma", "gamma", "degree", "coef0")},
        "mu": [Interval(Real, 0, None, closed="neither")],
        "eps": [Interval(Real, 0, None, closed="left")],
        "beta": [Interval(Real, 0, None, closed="neither")],
        "kors_weights": [StrOptions({"inverse", "sqrt"})],
        "eta": [Interval(Real, 0, None, closed="neither")],
        "C": [Interval(Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
    }

    _embed: np.ndarray

    #: kept by reference by the snapshot of a continuing call (see ``online/_base.py``): each is
    #: replaced by assignment, never written in place (the KORS sampler copies in O(1))
    _atomic_shared = ("feature_keys_", "feature_names_in_", "kernel_", "dictionary_", "_embed",
                      "_A_inv", "_w", "_pending")

    def __init__(self, alpha: float = 1.0, *, kernel: str | Kernel = "rbf",
                 sigma: float | ArrayLike | None = 1.0, gamma: float | None = None,
                 degree: int = 3, coef0: float = 1.0,
                 mu: float = 1.0, eps: float = 0.5, beta: float = 1.0,
                 kors_weights: str = "inverse", eta: float = 1.0, C: float = 1.0,
                 random_state: int | np.random.RandomState | None = None) -> None:
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.mu = mu
        self.eps = eps
        self.beta = beta
        self.kors_weights = kors_weights
        self.eta = eta
        self.C = C
        self.random_state = random_state

    def _reset(self, d: int) -> None:
        self.kernel_ = self._make_kernel()
        self._kors = KORS(self.mu, self.eps, self.beta, self.kors_weights,
                          check_random_state(self.random_state))
        self.dictionary_ = np.zeros((0, d))
        self.n_restarts_ = 0
        self._restart(0)
        self._pending: tuple[np.ndarray, float] | None = None

    def _restart(self, m: int) -> None:
        self._embed = np.zeros((0, 0)) if m == 0 else self._embed
        self._A_inv = np.eye(m) / float(self.alpha)
        self._w = np.zeros(m)

    def _embedding(self, X: np.ndarray) -> np.ndarray:
        return kernel_block(self.kernel_, X, self.dictionary_) @ self._embed.T

    def _begin(self, x: np.ndarray) -> float:
        b = kernel_block(self.kernel_, self.dictionary_, x[None])[:, 0]
        if self._kors.step(b, kernel_diag(self.kernel_, x)):
            self.dictionary_ = np.vstack([self.dictionary_, x])
            K_II = kernel_block(self.kernel_, self.dictionary_, self.dictionary_)
            self._embed = _inv_sqrt_psd(K_II)
            self._restart(self.dictionary_.shape[0])
            self.n_restarts_ += 1
            b = np.append(b, kernel_diag(self.kernel_, x))
        v = self._embed @ b
        raw = float(v @ self._w)
        c = float(self.C)
        if abs(raw) > c:
            # generalised projection of w onto {|wᵀv| ≤ C} in the A-norm: w -= (excess) A⁻¹v/vᵀA⁻¹v
            u = self._A_inv @ v
            self._w = self._w - (raw - np.sign(raw) * c) / float(v @ u) * u
            raw = float(np.sign(raw) * c)
        self._pending = (v, raw)
        return raw

    def _end(self, y: float) -> None:
        assert self._pending is not None  # set by _begin
        v, y_hat = self._pending
        g = 2.0 * (y_hat - y) * v
        if g.size:
            # A += (η/2) g gᵀ by Sherman–Morrison on sqrt(η/2) g, then the Newton step w -= A⁻¹ g
            s = np.sqrt(0.5 * float(self.eta)) * g
            u = self._A_inv @ s
            A_inv = self._A_inv - np.outer(u, u) / (1.0 + float(s @ u))
            self._A_inv, self._w = A_inv, self._w - A_inv @ g

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        if self.dictionary_.shape[0] == 0:
            return np.zeros(X.shape[0])
        return np.clip(self._embedding(X) @ self._w, -float(self.C), float(self.C))
