"""Exact Kernel-AWV and online kernel ridge regression (Jézéquel et al. 2019, eq. 3)."""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING

import numpy as np
from sklearn.utils._param_validation import Interval

from ..estimators._base import KERNEL_CONSTRAINTS
from ._base import OnlineRegressorBase, kernel_block, kernel_diag
from ._updates import GrowingCholeskyInverse, logged_write

if TYPE_CHECKING:
    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["KernelAWV", "online_krr_predictions"]


def online_krr_predictions(K: ArrayLike, y: ArrayLike, alpha: float, *,
                           awv: bool = True) -> np.ndarray:
    """All the online predictions of exact KRR / Kernel-AWV from one Cholesky of ``K + λI``.

    With ``K + λI = LLᵀ`` and ``z = L⁻¹y``, the leading block of L is the factor of the first
    t points, so round t's online KRR prediction ``k_{t-1}ᵀ(K_{t-1} + λI)⁻¹Y_{t-1}`` is
    ``Σ_{s<t} L_ts z_s`` and Kernel-AWV's is that times ``λ / L_tt²``
    (``L_tt² = λ + s²_{t-1}(x_t)``).
    The predictions are exactly the sequential ones (each uses only the first t inputs and the
    first t-1 labels); this needs all inputs in advance, and costs O(n³/3) time, O(n²) memory.

    Parameters
    ----------
    K : ndarray or tensor of shape (n, n)
        Kernel matrix of the inputs in round order (overwritten when a float64 tensor).
    y : ndarray of shape (n,)
    alpha : float
        Ridge λ.
    awv : bool, default=True
        Kernel-AWV (True) or plain online KRR (False).

    Returns
    -------
    y_pred : ndarray of shape (n,)

    Examples
    --------
    >>> import numpy as np
    >>> X = np.linspace(-1, 1, 5)[:, None]; y = np.sin(3 * X[:, 0])
    >>> K = np.exp(-0.5 * (X - X.T) ** 2)
    >>> online_krr_predictions(K, y, 1.0, awv=False).round(3)
    array([ 0.   , -0.062, -0.4  , -0.138,  0.389])
    """
    import torch

    Kt = torch.as_tensor(K, dtype=torch.float64)
    Kt.diagonal().add_(float(alpha))
    L, info = torch.linalg.cholesky_ex(Kt, out=(Kt, torch.empty((), dtype=torch.int32)))
    if int(info) != 0:
        raise np.linalg.LinAlgError("K + alpha I is not positive definite")
    yt = torch.as_tensor(np.asarray(y, dtype=np.float64).reshape(-1, 1))
    z = torch.linalg.solve_triangular(L, yt, upper=False)
    diag = L.diagonal().clone()
    pred = (L @ z)[:, 0] - diag * z[:, 0]
    if awv:
        pred = pred * float(alpha) / diag**2
    return pred.numpy()


class KernelAWV(OnlineRegressorBase):
    """Exact Kernel-AWV forecaster (and plain online kernel ridge regression).

    At round t, with ``x_t`` seen and ``y_t`` not yet, predict ``ŷ_t = f̂_t(x_t)`` where

        f̂_t = argmin_f Σ_{s<t} (y_s - f(x_s))² + λ||f||² + f(x_t)²      (eq. 3),

    i.e. ``ŷ_t = ŷ_t^KRR · λ / (λ + s²_{t-1}(x_t))`` with ``s²`` the posterior variance; with
    ``awv=False`` the ``f(x_t)²`` term is dropped (online KRR). For any sequence with
    ``|y_t| ≤ B``, the regret against every f in the RKHS is at most
    ``λ||f||² + B² log det(I + K_nn/λ)`` (Prop. 1).

    The inverse Cholesky factor of ``K_tt + λI`` grows by one row per round
    (:class:`~kernelflow.online._updates.GrowingCholeskyInverse`): O(t(t + d)) time and O(t²)
    memory at round t, O(n³) in total. Use it as the exact reference on short streams; for all
    the online predictions of a long stream known in advance, :func:`online_krr_predictions`
    does the same from one Cholesky.

    Parameters
    ----------
    alpha : float, default=1.0
        Ridge λ > 0 (the paper's experiments use 1).
    kernel : str or Kernel, default="rbf"
        Kernel name or object.
    sigma : float, default=1.0
        Bandwidth (the paper scales inputs to [-1, 1]^d and uses σ = 1).
    gamma : float, default=None
        scikit-learn's bandwidth parameter, converted to ``sigma`` (give one of them).
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Constant of the polynomial kernel.
    awv : bool, default=True
        Kernel-AWV (True) or online KRR (False).

    Attributes
    ----------
    kernel_ : Kernel
    X_seen_ : ndarray of shape (capacity, n_features)
        Past inputs (first ``n_rounds_`` rows).
    n_rounds_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    PKAWVTaylor, PKAWVNystrom : the projected, fast versions.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import KernelAWV
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(200, 2)); y = np.sin(3 * X[:, 0])
    >>> model = KernelAWV(alpha=1.0, sigma=0.5)
    >>> y_pred = model.progressive_predict(X, y)
    >>> round(float(np.mean((y_pred[100:] - y[100:]) ** 2)), 3)
    0.016
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "awv": ["boolean"],
        **{k: KERNEL_CONSTRAINTS[k] for k in ("kernel", "sigma", "gamma", "degree", "coef0")},
    }

    _single_thread_rounds = False  # O(t²) gemv per round: threads help

    #: kept by reference by the snapshot of a continuing call (see ``online/_base.py``): the
    #: kernel is only read, and the input history and the rows of the factor (``_chol``, whose
    #: snapshot copies its counters only) are written beyond their used part, through the
    #: call's undo log, or replaced when they grow
    _atomic_shared = ("feature_keys_", "feature_names_in_", "kernel_", "X_seen_")

    def __init__(self, alpha: float = 1.0, *, kernel: str | Kernel = "rbf",
                 sigma: float | ArrayLike | None = 1.0, gamma: float | None = None,
                 degree: int = 3, coef0: float = 1.0,
                 awv: bool = True) -> None:
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.awv = awv

    def _reset(self, d: int) -> None:
        self.kernel_ = self._make_kernel()
        self.X_seen_ = np.zeros((256, d))
        self._chol = GrowingCholeskyInverse()
        self._pending = None

    def _begin(self, x: np.ndarray) -> float:
        t = self._chol.n
        if t >= self.X_seen_.shape[0]:
            grown = np.zeros((2 * t, x.shape[0]))
            grown[:t] = self.X_seen_[:t]
            self.X_seen_ = grown
        lam = float(self.alpha)
        k = kernel_block(self.kernel_, self.X_seen_[:t], x[None])[:, 0] if t else np.zeros(0)
        log = self._undo_log()
        y_krr, delta2 = self._chol.append(k, kernel_diag(self.kernel_, x) + lam, log)
        logged_write(log, self.X_seen_, t, x)
        return y_krr * lam / delta2 if self.awv else y_krr

    def _end(self, y: float) -> None:
        self._chol.set_label(y, self._undo_log())

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        t = self._chol.n
        if t == 0:
            return np.zeros(X.shape[0])
        Kx = kernel_block(self.kernel_, X, self.X_seen_[:t])  # (n, t)
        W = Kx @ self._chol.Linv[:t, :t].T  # rows: (L⁻¹ k(x))ᵀ
        y_krr = W @ self._chol.z[:t]
        if not self.awv:
            return y_krr
        kxx = np.array([kernel_diag(self.kernel_, x) for x in X])
        lam = float(self.alpha)
        return y_krr * lam / (lam + kxx - np.einsum("ij,ij->i", W, W))
