"""PKAWV with Taylor features of the Gaussian kernel (Jézéquel et al. 2019, Algorithm 1)."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral, Real
from typing import TYPE_CHECKING

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from ..features.taylor import _ordered_features, _TaylorMap, check_taylor_size
from ..operators import memory_budget
from ._base import OnlineRegressorBase
from ._updates import RecursiveAWV, single_thread_blas

if TYPE_CHECKING:
    from ..typing import ArrayLike

__all__ = ["PKAWVTaylor"]


class PKAWVTaylor(OnlineRegressorBase):
    """Projected Kernel-AWV on the Taylor features of the Gaussian kernel (Algorithm 1).

    The forecaster of eq. (4) restricted to ``span{g_k : |k| ≤ M}``, whose
    ``r = C(M + d, d)`` functions ``g_k(x) = e^{-||x||²/(2σ²)} Π_i (x_i/σ)^{k_i}/sqrt(k_i!)``
    are orthonormal in the Gaussian RKHS (eq. 6), so it is linear AWV on ``v_t = φ(x_t)``:

        A_t = λI + Σ_{s≤t} v_s v_sᵀ,   b_t = Σ_{s≤t} y_s v_s,   ŷ_t = v_tᵀ A_t⁻¹ b_{t-1},

    with ``A_t⁻¹`` updated by Sherman–Morrison from ``A_{t-1}⁻¹`` (the printed Algorithm 1 has
    ``A_t⁻¹`` on the right-hand side, a typo). ``awv=False`` predicts ``v_tᵀ A_{t-1}⁻¹ b_{t-1}``
    ("projected KRR"). With ``‖x_t‖ ≤ R``, ``|y_t| ≤ B`` and
    ``M = ceil(max(8R²/σ², 2 log(n/min(λ,1))))`` (see
    :func:`~kernelflow.features.taylor.theoretical_taylor_degree`), the regret against every f is
    at most ``λ||f||² + (3/2) B² log det(I + K_nn/λ)`` (Theorem 4); in practice M = 2 to 4.

    Cost: O(r² + r) per round, O(r²) memory independent of the number of rounds; nothing of the
    past inputs is stored. ``learn_one`` does one BLAS ``dsymv`` and one ``dsyr`` per round;
    ``partial_fit`` and ``progressive_predict`` play chunks in blocks of 64 rounds with the
    Woodbury form of the same recursion (level-3 BLAS, identical predictions up to rounding).

    Parameters
    ----------
    alpha : float, default=1.0
        Ridge λ > 0.
    sigma : float, default=1.0
        Gaussian bandwidth σ of ``exp(-||x - x'||² / (2σ²))``.
    degree : int, default=2
        Maximal total degree M of the Taylor features.
    awv : bool, default=True
        AWV (True) or projected KRR (False).
    feature_mode : {"compact", "ordered"}, default="compact"
        ``"ordered"`` uses the paper's redundant ``Σ_k d^k`` ordered products (same predictions,
        higher cost; for reproducing its timings).
    center : None, "first_batch", "auto" or array-like of shape (n_features,), default=None
        Expand the features around this point, i.e. use the features of ``x - center``. The
        Gaussian kernel is translation invariant, so the learner still targets the same
        kernel, while the truncation error (growing with ``||x - center|| / σ``) shrinks for
        off-centre data. ``"first_batch"`` (alias ``"auto"``) is the mean of the rows of the
        first ``fit``/``partial_fit`` call (the first row with ``learn_one``).

    Attributes
    ----------
    n_features_out_ : int
        Number r of Taylor features.
    multi_indices_ : ndarray of shape (r, n_features_in_)
        Exponents of each feature (compact mode).
    center_ : ndarray of shape (n_features_in_,) or None
        The expansion point (None until the first batch with ``"first_batch"``, or without
        centring).
    n_rounds_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelAWV : the exact forecaster it approximates.
    PKAWVNystrom : projection on a data-dependent dictionary, any kernel.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import PKAWVTaylor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(2000, 3)); y = np.sin(3 * X[:, 0])
    >>> model = PKAWVTaylor(alpha=1.0, sigma=1.0, degree=4)
    >>> y_pred = model.progressive_predict(X, y)
    >>> model.n_features_out_, round(float(np.mean((y_pred[1000:] - y[1000:]) ** 2)), 3)
    (35, 0.019)
    """

    #: created by the first round, then only read (see ``kernelflow.utils._atomic``)
    #: ``_awv`` too: every call replaces it by a new state object rather than updating it in
    #: place (``learn_one`` through ``RecursiveAWV.step``, the chunked rounds on a copy), so a
    #: ``learn_one`` round needs no copy of the r x r state to be all-or-nothing
    _atomic_shared = ("feature_keys_", "_map", "multi_indices_", "center_", "feature_names_in_",
                      "_awv")

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "sigma": [Interval(Real, 0, None, closed="neither")],
        "degree": [Interval(Integral, 0, None, closed="left")],
        "awv": ["boolean"],
        "feature_mode": [StrOptions({"compact", "ordered"})],
        "center": [None, StrOptions({"first_batch", "auto"}), "array-like"],
    }

    center_: np.ndarray | None

    def __init__(self, alpha: float = 1.0, *, sigma: float = 1.0, degree: int = 2,
                 awv: bool = True, feature_mode: str = "compact",
                 center: str | ArrayLike | None = None) -> None:
        self.alpha = alpha
        self.sigma = sigma
        self.degree = degree
        self.awv = awv
        self.feature_mode = feature_mode
        self.center = center

    def _shift(self, X: np.ndarray) -> np.ndarray:
        """X - center_; fixes center_ from the first rows seen with "first_batch"."""
        if isinstance(self.center, str) and self.center_ is None:
            self.center_ = X.reshape(-1, X.shape[-1]).mean(0)
        return X if self.center_ is None else X - self.center_

    def _features(self, X: np.ndarray) -> np.ndarray:
        X = self._shift(X)
        if self.feature_mode == "ordered":
            return _ordered_features(X, float(self.sigma), int(self.degree))
        return self._map.batch(X)

    def _check_memory(self, d: int) -> None:
        """Refuse, before allocating, a feature dimension whose r x r state exceeds the budget.

        r is counted in closed form with an early stop (O(log budget) steps), so an absurd
        degree or dimension is refused at once.
        """
        # r x r: A⁻¹, the copy a partial_fit plays into, and the blocked rounds' full inverse,
        # its two triangles and the Woodbury product (7 r² floats at the peak); vectors, plan
        check_taylor_size(d, int(self.degree), mode=self.feature_mode,
                          bytes_per_feature=8 * 8 + 8 * min(d + 1, 64) + 24 * d,
                          bytes_per_feature_squared=7 * 8, budget=memory_budget(),
                          what=f"PKAWVTaylor's r x r state (feature_mode={self.feature_mode!r})")

    def _reset(self, d: int) -> None:
        self._check_memory(d)
        self.center_ = None
        if self.center is not None and not isinstance(self.center, str):
            c = np.asarray(self.center, dtype=np.float64)
            if c.shape != (d,) or not np.all(np.isfinite(c)):
                raise ValueError(f"center must be a finite vector of length {d}, got "
                                 f"shape {c.shape}.")
            self.center_ = c
        self._map = _TaylorMap(d, int(self.degree), float(self.sigma))
        self.multi_indices_ = self._map.indices
        if self.feature_mode == "ordered":
            r = sum(d**k for k in range(int(self.degree) + 1))
        else:
            r = self._map.r
        self.n_features_out_ = r
        self._awv = RecursiveAWV(r, float(self.alpha))

    def _begin(self, x: np.ndarray) -> float:
        # updates _awv in place: not for the all-or-nothing methods (learn_one uses _learn_row)
        x = self._shift(x)
        if self.feature_mode == "ordered":
            v = _ordered_features(x[None], float(self.sigma), int(self.degree))[0]
        else:
            v = self._map.row(x)
        return self._awv.begin(v, self.awv)

    def _end(self, y: float) -> None:
        self._awv.end(y)

    def _run(self, X: np.ndarray, y: np.ndarray, preds: np.ndarray | None = None,
             clock: Callable[[int], None] | None = None) -> None:
        # x_t's features do not depend on the state: compute a chunk's at once, then play the
        # rounds in blocks (RecursiveAWV.run_blocked: the same predictions as _begin/_end, each
        # from the earlier labels only; level-3 BLAS instead of two level-2 calls per round)
        V = self._features(X)
        state = self._awv.copy()  # _awv is replaced, never updated in place (_atomic_shared)
        with single_thread_blas():
            state.run_blocked(V, y, self.awv, preds, clock)
        self._awv = state
        self.n_rounds_ += X.shape[0]

    def _learn_row(self, x: np.ndarray, y: float) -> float:
        # the round is played into a new state object and committed by one assignment: an
        # interruption or a refusal before it leaves the current state untouched
        x = self._shift(x)
        if self.feature_mode == "ordered":
            v = _ordered_features(x[None], float(self.sigma), int(self.degree))[0]
        else:
            v = self._map.row(x)
        yhat, self._awv = self._awv.step(v, y, self.awv)
        return yhat

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        return self._awv.predict_batch(self._features(X), self.awv)

    @property
    def state_size_(self) -> int:
        """Number of floats in the learner's state (r² + 2r, constant in the number of rounds)."""
        s = self._awv
        return int(s.A_inv.size + s.b.size + s.w.size)
