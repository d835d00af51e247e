"""PKAWV with Nyström projections on a KORS dictionary (Jézéquel et al. 2019, Algorithm 2)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from numbers import Real
from typing import TYPE_CHECKING

import numpy as np
from scipy.linalg import blas, cholesky, solve_triangular
from scipy.linalg.lapack import dtpqrt as _tpqrt
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from ..estimators._base import KERNEL_CONSTRAINTS
from ._base import OnlineRegressorBase, kernel_block, kernel_diag
from ._updates import KORS, RecursiveAWV, chol_append, single_thread_blas

if TYPE_CHECKING:
    import torch

    from ..kernels import Kernel
    from ..typing import ArrayLike
    from ..utils._validation import OutputKind

__all__ = ["PKAWVNystrom"]

_log = logging.getLogger(__name__)
_dtrsv = blas.dtrsv


def _inv_sqrt_psd(K: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
    """``K^{-1/2}`` on the range of K (eigenvalues below ``rtol·max`` dropped)."""
    if K.shape[0] == 0:
        return np.zeros((0, 0))
    s, U = np.linalg.eigh(K)
    keep = s > rtol * max(float(s[-1]), 0.0)
    return (U[:, keep] / np.sqrt(s[keep])) @ U[:, keep].T


class PKAWVNystrom(OnlineRegressorBase):
    """Projected Kernel-AWV on the span of a dictionary of past inputs (Algorithm 2).

    The forecaster of eq. (4) restricted to ``H̃_t = span{φ(x̃) : x̃ ∈ I_t}``. Writing
    ``f = Σ_j α_j k(x̃_j, ·)``, with ``K_t = [k(x_i, x̃_j)]_{i≤t}`` (the row of ``x_t`` included),
    ``Ỹ_t = (y_1..y_{t-1}, 0)`` and ``H_t = K_tᵀK_t + λK_II``,

        α_t = H_t⁻¹ K_tᵀ Ỹ_t,   ŷ_t = Σ_j α_{t,j} k(x̃_j, x_t).

    The dictionary grows by KORS (ridge-leverage-score sampling with ridge μ, accuracy ε and
    budget β, seeded by ``random_state``); x_t may enter before its own prediction. An upper
    factor R with ``RᵀR + PᵀP = H`` is kept, P being the newest (≤ 64) rows of K: each round's row
    joins P (Woodbury, one triangular solve), every 64 rows one LAPACK ``tpqrt`` absorbs P into R
    (the per-round rank-one updates of Algorithm 2, batched), and an insertion borders R
    (Algorithm 2's update plus downdate, or one triangular solve). ``KᵀỸ`` is kept
    incrementally, so a round without insertion costs O(m² + md) amortised and an insertion
    O(t(m + d) + m²) (≤ m of them).
    With every point in the dictionary it is exactly Kernel-AWV. Regret (Theorem 6, λ ≥ μ): with
    probability 1 - δ, ``λ||f||² + B² d_eff(λ) log(e + enκ²/λ) + 2B²(|I_n| + 1) nμ/λ``.

    Memory is O(t(d + m)): inserting a point needs its kernel column over all past inputs.
    ``learn_one`` and ``partial_fit`` are all-or-nothing at the cost of what a round writes
    (its history row, through an undo log), not of the O(t(d + m)) state.
    With ``known_inputs=True`` the dictionary is built by one KORS pass over the first batch's
    inputs, then the learner is PKAWV on the fixed subspace, i.e. linear AWV on
    ``φ̃(x) = K_II^{-1/2} k_I(x)`` (O(m²) per round, no history; Corollary 8).

    Parameters
    ----------
    alpha : float, default=1.0
        Ridge λ > 0.
    kernel : str or Kernel, default="rbf"
    sigma : float, default=1.0
    gamma : float, default=None
        scikit-learn's bandwidth parameter (instead of ``sigma``).
    degree : int, default=3
        Polynomial kernel degree.
    coef0 : float, default=1.0
        Polynomial kernel constant.
    mu : float, default=1.0
        KORS ridge μ (Theorem 6 needs λ ≥ μ; the paper's experiments use μ = λ = 1).
    eps : float, default=0.5
        KORS accuracy ε.
    beta : float, default=1.0
        KORS budget β (theory: ``12 log(n/δ)``; experiments: 1).
    kors_weights : {"inverse", "sqrt"}, default="inverse"
        Weight of a kept point: ``1/p`` (the paper's code) or ``sqrt(1/p)``.
    dictionary : {"kors", "all"}, default="kors"
        ``"all"`` keeps every point (then the learner equals Kernel-AWV).
    known_inputs : bool, default=False
        Build the dictionary from the first batch's inputs before any prediction.
    cholesky_insert : {"border", "updown"}, default="border"
        How R grows on insertion: ``"updown"`` is Algorithm 2's bordering by one rank-one update
        and one downdate (two O(m²) Python-level sweeps); ``"border"`` computes the same factor
        with one triangular solve (LAPACK). Both give ``RᵀR = KᵀK + λK_II``.
    awv : bool, default=True
        AWV (True) or projected KRR (False).
    random_state : int, RandomState or None, default=None
        Seed of the KORS draws.

    Attributes
    ----------
    kernel_ : Kernel
    dictionary_ : ndarray of shape (m, n_features_in_)
        The dictionary points.
    dictionary_indices_ : list of int
        Their rounds (0-based; indices into the first batch with ``known_inputs``).
    n_rounds_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelAWV, PKAWVTaylor, ProsNKONS

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import PKAWVNystrom
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(500, 2)); y = np.sin(3 * X[:, 0])
    >>> model = PKAWVNystrom(alpha=1.0, sigma=0.5, random_state=0)
    >>> y_pred = model.progressive_predict(X, y)
    >>> len(model.dictionary_indices_), round(float(np.mean((y_pred[250:] - y[250:]) ** 2)), 3)
    (55, 0.005)
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        **{k: KERNEL_CONSTRAINTS[k] for k in ("kernel", "sigma", "gamma", "degree", "coef0")},
        "mu": [Interval(Real, 0, None, closed="neither")],
        "eps": [Interval(Real, 0, None, closed="left")],
        "beta": [Interval(Real, 0, None, closed="neither")],
        "kors_weights": [StrOptions({"inverse", "sqrt"})],
        "dictionary": [StrOptions({"kors", "all"})],
        "known_inputs": ["boolean"],
        "cholesky_insert": [StrOptions({"border", "updown"})],
        "awv": ["boolean"],
        "random_state": ["random_state"],
    }

    #: kept by reference by the snapshot of a continuing call (see ``online/_base.py``): every
    #: attribute here is replaced by assignment and never written in place, except the history
    #: buffers ``_X``, ``_Y`` and ``_K``, written through the call's undo log (``_write``) and
    #: only beyond their used part (rows ≥ ``_t``, columns ≥ m). The KORS sampler copies in
    #: O(1), so a round copies nothing of size t or m².
    _atomic_shared = frozenset({"feature_keys_", "feature_names_in_", "kernel_", "dictionary_",
                                "dictionary_indices_", "_X", "_Y", "_K", "_R", "_q", "_zq",
                                "_pend", "_C", "_G", "_fixed", "_embed", "_pending"})

    def __init__(self, alpha: float = 1.0, *, kernel: str | Kernel = "rbf",
                 sigma: float | ArrayLike | None = 1.0, gamma: float | None = None,
                 degree: int = 3, coef0: float = 1.0,
                 mu: float = 1.0, eps: float = 0.5, beta: float = 1.0,
                 kors_weights: str = "inverse", dictionary: str = "kors",
                 known_inputs: bool = False, cholesky_insert: str = "border", awv: bool = True,
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
        self.dictionary = dictionary
        self.known_inputs = known_inputs
        self.cholesky_insert = cholesky_insert
        self.awv = awv
        self.random_state = random_state

    # ---- state --------------------------------------------------------------------------------
    def _reset(self, d: int) -> None:
        self.kernel_ = self._make_kernel()
        self._kors = KORS(self.mu, self.eps, self.beta, self.kors_weights,
                          check_random_state(self.random_state))
        self.dictionary_ = np.zeros((0, d))
        self.dictionary_indices_: list[int] = []
        self._t = 0  # rows of K (past inputs, plus the current one once added)
        self._X = np.zeros((64, d))  # input history
        self._Y = np.zeros(64)  # labels, 0 for the current round
        self._K = np.zeros((64, 8))  # k(x_i, x̃_j)
        self._R = np.zeros((0, 0))  # upper, RᵀR + PᵀP = KᵀK + λ K_II (P: pending rows)
        self._q = np.zeros(0)  # KᵀỸ
        self._zq = np.zeros(0)  # R⁻ᵀq
        self._pend: list[int] = []  # rows of K not yet absorbed in R (replaced, never extended)
        self._C = np.zeros((0, 0))  # R⁻ᵀPᵀ
        self._G = np.zeros((0, 0))  # CᵀC
        self._fixed: RecursiveAWV | None = None  # RecursiveAWV on φ̃ in known-inputs mode
        # this round's (b, R⁻ᵀb or None) between _begin and _end (v for the fixed dictionary)
        self._pending: tuple | None = None
        self._played = 0

    def _start(self, X: ArrayLike, y: ArrayLike,
               reset: bool) -> tuple[np.ndarray, np.ndarray, OutputKind, torch.dtype]:
        Xn, yn, kind, dtype = super()._start(X, y, reset)
        if self.known_inputs and self._fixed is None:
            self._build_fixed_dictionary(Xn)
        return Xn, yn, kind, dtype

    def _build_fixed_dictionary(self, X: np.ndarray) -> None:
        for i, x in enumerate(X):
            b = kernel_block(self.kernel_, self.dictionary_, x[None])[:, 0]
            if self.dictionary == "all" or self._kors.step(b, kernel_diag(self.kernel_, x)):
                self.dictionary_ = np.vstack([self.dictionary_, x])
                self.dictionary_indices_ = [*self.dictionary_indices_, i]
        K_II = kernel_block(self.kernel_, self.dictionary_, self.dictionary_)
        self._embed = _inv_sqrt_psd(K_II)
        self._fixed = RecursiveAWV(self.dictionary_.shape[0], float(self.alpha))

    def _write(self, a: np.ndarray, index, value) -> None:
        """``a[index] = value`` on a history buffer, through the undo log of a continuing call
        (:func:`~kernelflow.online._updates.logged_write`, inlined: one call per write)."""
        log = self.__dict__.get("_undo")
        if log is not None:
            log.entries.append((a, index, np.array(a[index], copy=True)))
        a[index] = value

    def _ensure_rows(self, n: int) -> None:
        if n > self._X.shape[0]:
            cap = max(n, 2 * self._X.shape[0])
            for name in ("_X", "_K"):
                old = getattr(self, name)
                new = np.zeros((cap, old.shape[1]))
                new[: self._t] = old[: self._t]
                setattr(self, name, new)
            Y = np.zeros(cap)
            Y[: self._t] = self._Y[: self._t]
            self._Y = Y

    # ---- factor with pending rows ---------------------------------------------------------
    # H = KᵀK + λK_II = RᵀR + PᵀP, P = the rows K[pend] not yet absorbed in R. C = R⁻ᵀPᵀ,
    # G = CᵀC and zq = R⁻ᵀq are kept along, so a prediction costs one triangular solve plus
    # O(mp + p³) (Woodbury); every _flush_at rows, one tpqrt absorbs P into R in O(m²p).
    _flush_at = 64

    def _flush(self) -> None:
        m, p = self.dictionary_.shape[0], len(self._pend)
        if p and m:
            P = np.asfortranarray(self._K[self._pend, :m])
            R, _, _, info = _tpqrt(0, min(p, m), np.asfortranarray(self._R), P)
            if info != 0:  # pragma: no cover - LAPACK argument error
                raise np.linalg.LinAlgError(f"tpqrt failed (info={info})")
            R = np.triu(R)
            R[np.diag(R) < 0] *= -1.0  # QR leaves the signs free; keep a positive diagonal
            self._R = np.ascontiguousarray(R)
            self._zq = self._rt_solve(self._q)
        self._pend = []
        self._C = np.zeros((m, 0))
        self._G = np.zeros((0, 0))

    def _rt_solve(self, v: np.ndarray) -> np.ndarray:
        """R⁻ᵀ v (v of shape (m,) or (m, k))."""
        if self._R.shape[0] == 0:
            return np.zeros(v.shape)
        if v.ndim == 1 and self._R.flags.c_contiguous:
            # one BLAS call: Rᵀ is the Fortran-ordered view of the C-ordered R (no copy)
            return _dtrsv(self._R.T, v, lower=1)
        return solve_triangular(self._R, v, trans="T", check_finite=False)

    def _add_rows(self, B: np.ndarray) -> np.ndarray | None:
        """Rows B (k, m) of the current rounds enter K as pending rows; returns ``R⁻ᵀBᵀ``."""
        k, m = B.shape
        t = self._t
        if m:
            self._write(self._K, (slice(t, t + k), slice(0, m)), B)
        self._t = t + k
        if m == 0:  # nothing to absorb: the first insertion sees these rows through its column
            return None
        p = len(self._pend)
        G = np.empty((p + k, p + k))
        G[:p, :p] = self._G
        C = np.empty((m, p + k))
        C[:, :p] = self._C
        if k == 1:  # one round (learn_one): vectors and one BLAS triangular solve
            cb = self._rt_solve(B[0])
            g = cb @ self._C
            G[:p, p] = g
            G[p, :p] = g
            G[p, p] = cb @ cb
            C[:, p] = cb
        else:
            CB = self._rt_solve(B.T)
            GPB = self._C.T @ CB
            G[:p, p:] = GPB
            G[p:, :p] = GPB.T
            G[p:, p:] = CB.T @ CB
            C[:, p:] = CB
        self._G, self._C = G, C
        self._pend = [*self._pend, *range(t, t + k)]
        return C[:, p:]

    def _woodbury(self, cb: np.ndarray) -> float:
        """``bᵀH⁻¹q`` from ``cb = R⁻ᵀb``: ``cb·zq - (Cᵀcb)ᵀ(I + G)⁻¹(Cᵀzq)``."""
        if not self._pend:
            return float(cb @ self._zq)
        u = self._C.T @ cb
        v = self._C.T @ self._zq
        Gi = self._G + np.eye(self._G.shape[0])
        return float(cb @ self._zq - u @ np.linalg.solve(Gi, v))

    def _insert(self, x: np.ndarray, b: np.ndarray, kappa: float) -> np.ndarray:
        """x becomes dictionary element m+1: border R, add a column to K, entries to q, C, zq."""
        t, m = self._t, self.dictionary_.shape[0]
        a = kernel_block(self.kernel_, self._X[:t], x[None])[:, 0]  # over the rows of K
        lam = float(self.alpha)
        c = self._K[:t, :m].T @ a + lam * b
        dd = float(a @ a) + lam * kappa
        a_p = a[self._pend]
        if self._pend:  # R holds H - PᵀP: border it with the matching column
            c = c - self._K[self._pend, :m].T @ a_p
            dd -= float(a_p @ a_p)
        try:
            R = chol_append(self._R, c, dd, method=self.cholesky_insert)
        except np.linalg.LinAlgError:
            # x is numerically in the span of the dictionary already: adding it changes nothing
            _log.debug("round %d: dictionary insertion skipped (zero pivot)", self._played)
            return b
        r, delta = R[:m, m], R[m, m]
        self._R = R
        if m + 1 > self._K.shape[1]:
            grown = np.zeros((self._K.shape[0], 2 * self._K.shape[1]))
            grown[:, :m] = self._K[:, :m]
            self._K = grown
        self._write(self._K, (slice(0, t), m), a)
        q_new = float(a @ self._Y[:t])
        self._q = np.append(self._q, q_new)
        self._zq = np.append(self._zq, (q_new - r @ self._zq) / delta)
        if self._pend:
            row = (a_p - r @ self._C) / delta
            self._C = np.vstack([self._C, row])
            self._G = self._G + np.outer(row, row)
        else:
            self._C = np.zeros((m + 1, 0))
        self.dictionary_ = np.vstack([self.dictionary_, x])
        self.dictionary_indices_ = [*self.dictionary_indices_, self._played]
        return np.append(b, kappa)

    # ---- rounds -------------------------------------------------------------------------------
    def _run(self, X: np.ndarray, y: np.ndarray, preds: np.ndarray | None = None,
             clock: Callable[[int], None] | None = None) -> None:
        if self._fixed is not None:
            V = kernel_block(self.kernel_, X, self.dictionary_) @ self._embed.T
            state = self._fixed.copy()  # replaced, never updated in place (_atomic_shared)
            with single_thread_blas():
                state.run_blocked(V, y, self.awv, preds, clock)
            self._fixed = state
            self._played += X.shape[0]
            self.n_rounds_ += X.shape[0]
            return
        # KORS depends on the dictionary only, so the rounds up to the next insertion are known
        # to keep the subspace fixed: play them as one block (_play_block), and the insertion
        # round itself with _begin/_end. Same draws, same predictions as learn_one.
        n, t = X.shape[0], 0
        with single_thread_blas():
            while t < n:
                stop = min(n, t + self._block)
                B = kernel_block(self.kernel_, X[t:stop], self.dictionary_)
                j, decision = t, None
                while j < stop:
                    kappa = kernel_diag(self.kernel_, X[j])
                    if self.dictionary == "all":
                        decision = (True, 1.0)
                    else:
                        decision = self._kors.decide(B[j - t], kappa)
                    if decision[0]:
                        break
                    j += 1
                if j > t:
                    self._play_block(X[t:j], y[t:j], B[: j - t], preds, t, clock)
                if j < stop:
                    y_hat = self._begin(X[j], decision)
                    if preds is not None:
                        preds[j] = y_hat
                    self._end(float(y[j]))
                    if clock is not None:
                        clock(j)
                    j += 1
                t = j
        self.n_rounds_ += n

    _block = 64

    def _play_block(self, X: np.ndarray, y: np.ndarray, B: np.ndarray, preds: np.ndarray | None,
                    offset: int, clock: Callable[[int], None] | None) -> None:
        """Rounds with a fixed dictionary, all at once (the Woodbury form of the rounds).

        The pending rows P (labels y_P) and the block's rows B act as consecutive rounds on top
        of the prior ``RᵀR``, ``q - Pᵀy_P``: with ``C_all = R⁻ᵀ[P; B]ᵀ``, ``G = C_allᵀC_all``,
        ``mean = C_allᵀ R⁻ᵀ(q - Pᵀy_P)``, ``LLᵀ = G + I`` and ``z = L⁻¹(y_all - mean)``, round j's
        prediction is ``mean_j + Σ_{i<j} L_ji z_i`` (KRR) or that over ``L_jj²`` (AWV).
        """
        k, m = B.shape
        self._ensure_rows(self._t + k)
        rows = slice(self._t, self._t + k)
        self._write(self._X, rows, X)
        self._write(self._Y, rows, y)
        if m:
            p = len(self._pend)
            y_p = self._Y[self._pend]
            if preds is not None:
                CB = self._rt_solve(B.T)
                C_all = np.hstack([self._C, CB])
                GPB = self._C.T @ CB
                G = np.block([[self._G, GPB], [GPB.T, CB.T @ CB]])
                G[np.diag_indices(p + k)] += 1.0
                L = cholesky(G, lower=True, check_finite=False)
                mean = C_all.T @ (self._zq - self._C @ y_p)
                z = solve_triangular(L, np.concatenate([y_p, y]) - mean, lower=True,
                                     check_finite=False)
                y_krr = (mean + np.tril(L, -1) @ z)[p:]
                d2 = np.diag(L)[p:] ** 2
                preds[offset : offset + k] = y_krr / d2 if self.awv else y_krr
            self._add_rows(B)
            self._q = self._q + B.T @ y
            self._zq = self._zq + self._C[:, p:] @ y
            if len(self._pend) >= self._flush_at:
                self._flush()
        else:
            self._t += k
            if preds is not None:
                preds[offset : offset + k] = 0.0
        self._played += k
        if clock is not None:
            for j in range(offset, offset + k):
                clock(j)

    def _begin(self, x: np.ndarray, decision: tuple[bool, float] | None = None,
               predict: bool = True) -> float:
        if self._fixed is not None:
            v = self._embed @ kernel_block(self.kernel_, self.dictionary_, x[None])[:, 0]
            self._pending = (v,)
            return float(self._fixed.predict_batch(v[None], self.awv)[0]) if predict else 0.0
        self._ensure_rows(self._t + 1)
        b = kernel_block(self.kernel_, self.dictionary_, x[None])[:, 0]
        kappa = kernel_diag(self.kernel_, x)
        self._write(self._X, self._t, x)
        self._write(self._Y, self._t, 0.0)
        cb = self._add_rows(b[None]) if self.awv else None
        if decision is None:
            decision = (True, 1.0) if self.dictionary == "all" else self._kors.decide(b, kappa)
        keep, p = decision
        if keep:
            m = b.size
            b = self._insert(x, b, kappa)
            if b.size > m:
                cb = None  # R has grown: R⁻ᵀb is solved anew
                if self.dictionary != "all":
                    self._kors.add(b[:m], kappa, p)
        cb = None if cb is None else cb[:, 0]
        y_hat = 0.0
        if b.size and predict:
            if cb is None:
                cb = self._rt_solve(b)
            y_hat = self._woodbury(cb)
        if not self.awv:
            CB = self._add_rows(b[None])
            cb = None if CB is None else CB[:, 0]
        self._pending = (b, cb)
        return y_hat

    def _end(self, y: float) -> None:
        self._played += 1
        assert self._pending is not None  # set by _begin
        if self._fixed is not None:
            (v,) = self._pending
            _, self._fixed = self._fixed.step(v, y, self.awv)
            return
        b, cb = self._pending
        self._Y[self._t - 1] = y  # this round's row: its old value is logged by _begin
        if b.size:
            if cb is None:
                cb = self._rt_solve(b)
            self._q = self._q + y * b
            self._zq = self._zq + y * cb
        if len(self._pend) >= self._flush_at:
            self._flush()

    def _learn_row(self, x: np.ndarray, y: float) -> float:
        # river's learn_one returns nothing: the round's prediction is not needed, only the
        # state's finiteness (what learn_one checks), which the new zq carries
        self._begin(x, predict=False)
        self._end(y)
        if self._fixed is not None:
            return float(self._fixed.w.sum())
        return float(self._zq.sum())

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        if self._fixed is not None:
            V = kernel_block(self.kernel_, X, self.dictionary_) @ self._embed.T
            return self._fixed.predict_batch(V, self.awv)
        m = self.dictionary_.shape[0]
        if m == 0:
            return np.zeros(X.shape[0])
        W = self._rt_solve(kernel_block(self.kernel_, X, self.dictionary_).T)  # R⁻ᵀ k(x), (m, n)
        y_krr = W.T @ self._zq
        quad = np.einsum("ij,ij->j", W, W)
        if self._pend:  # Woodbury with the pending rows
            U = self._C.T @ W
            Gi = self._G + np.eye(self._G.shape[0])
            y_krr = y_krr - U.T @ np.linalg.solve(Gi, self._C.T @ self._zq)
            quad = quad - np.einsum("ij,ij->j", U, np.linalg.solve(Gi, U))
        if not self.awv:
            return y_krr
        return y_krr / (1.0 + quad)

    def learn_one(self, x: dict, y: float) -> None:
        if self.known_inputs and not hasattr(self, "n_rounds_"):
            raise ValueError("known_inputs=True needs the inputs first: call fit or partial_fit")
        super().learn_one(x, y)
