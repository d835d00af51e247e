"""Fourier Online Gradient Descent (Lu, Hoi, Wang, Zhao & Liu, JMLR 2016), square loss."""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval

from ._base import OnlineRegressorBase

__all__ = ["FOGD"]


def _gaussian_frequencies(d: int, D: int, sigma: float, seed: int) -> np.ndarray:
    """Frequencies ``W`` (d, D) of ``z(x) = [cos Wᵀx, sin Wᵀx] / sqrt(D)``, ``W ~ N(0, σ⁻²I)``."""
    try:
        from ..features.random import sample_block
        from ..kernels import Gaussian

        block = sample_block(Gaussian(sigma=sigma), d, 2 * D, seed, 0)
        return block.params["W"].detach().cpu().numpy().astype(np.float64)
    except ImportError:  # pragma: no cover - the shared random features are part of the library
        rng = np.random.default_rng(seed)
        return rng.standard_normal((d, D)) / sigma


class FOGD(OnlineRegressorBase):
    """Online gradient descent on random Fourier features of the Gaussian kernel (FOGD).

    ``z(x) = [cos(Wᵀx), sin(Wᵀx)] / sqrt(D)`` with D = ``n_components`` frequencies
    ``W ~ N(0, σ⁻²I)`` (2D coordinates, ``E zᵀz' = k(x, x')``; the D of Lu et al.); predict
    ``ŷ_t = wᵀz(x_t)``, then
    ``w ← w - η · 2(ŷ_t - y_t) z(x_t)`` (gradient of the square loss). The step is
    ``learning_rate`` if given, else ``1/sqrt(n_rounds)`` (the paper's ``η = 1/√n``) if the
    horizon is given, else ``1/sqrt(t)``.

    Cost: O(D d) per round, O(D d) memory.

    Parameters
    ----------
    n_components : int, default=1000
        Number D of random frequencies (each gives a cos and a sin feature).
    sigma : float, default=1.0
        Gaussian bandwidth.
    learning_rate : float, default=None
        Constant step η.
    n_rounds : int, default=None
        Horizon n for ``η = 1/sqrt(n)``.
    random_state : int, default=0
        Seed of the frequencies (regenerable from it).

    Attributes
    ----------
    coef_ : ndarray of shape (2 * n_components,)
    frequencies_ : ndarray of shape (n_features_in_, n_components)
    n_rounds_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    PKAWVTaylor : deterministic features and a second-order update.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import FOGD
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(2000, 2)); y = np.sin(3 * X[:, 0])
    >>> model = FOGD(n_components=100, sigma=0.5, n_rounds=2000, random_state=0)
    >>> y_pred = model.progressive_predict(X, y)
    >>> round(float(np.mean((y_pred[1000:] - y[1000:]) ** 2)), 2)
    0.01
    """

    #: created by the first round, then only read (see ``kernelflow.utils._atomic``); ``coef_``
    #: is replaced by each round, never updated in place, so no round copies the state
    _atomic_shared = ("feature_keys_", "frequencies_", "feature_names_in_", "coef_")

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "sigma": [Interval(Real, 0, None, closed="neither")],
        "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
        "n_rounds": [Interval(Integral, 1, None, closed="left"), None],
        "random_state": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, n_components: int = 1000, *, sigma: float = 1.0,
                 learning_rate: float | None = None, n_rounds: int | None = None,
                 random_state: int = 0) -> None:
        self.n_components = n_components
        self.sigma = sigma
        self.learning_rate = learning_rate
        self.n_rounds = n_rounds
        self.random_state = random_state

    def _reset(self, d: int) -> None:
        D = int(self.n_components)
        self.frequencies_ = _gaussian_frequencies(d, D, float(self.sigma), int(self.random_state))
        self._norm = 1.0 / math.sqrt(D)
        self.coef_ = np.zeros(2 * D)
        self._t = 0
        self._pending: tuple[np.ndarray, float] | None = None

    def _features(self, X: np.ndarray) -> np.ndarray:
        Z = X @ self.frequencies_
        return np.hstack([np.cos(Z), np.sin(Z)]) * self._norm

    def _begin(self, x: np.ndarray) -> float:
        # one row: cos and sin written into one buffer (no hstack, no 2-D temporaries)
        zx = x @ self.frequencies_
        D = zx.shape[0]
        z = np.empty(2 * D)
        np.cos(zx, out=z[:D])
        np.sin(zx, out=z[D:])
        z *= self._norm
        y_hat = float(z @ self.coef_)
        self._pending = (z, y_hat)
        return y_hat

    def _end(self, y: float) -> None:
        assert self._pending is not None  # set by _begin
        z, y_hat = self._pending
        self._pending = None  # nothing left for the next round's state copy
        self._t += 1
        if self.learning_rate is not None:
            eta = float(self.learning_rate)
        elif self.n_rounds is not None:
            eta = 1.0 / math.sqrt(self.n_rounds)
        else:
            eta = 1.0 / math.sqrt(self._t)
        self.coef_ = self.coef_ - (2.0 * eta * (y_hat - y)) * z

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        return self._features(X) @ self.coef_
