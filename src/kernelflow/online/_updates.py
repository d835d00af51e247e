"""Rank-one update helpers shared by the online learners.

All state here is small and updated once per round, so it lives in NumPy float64 arrays and is
updated through BLAS level-2 calls (``dsymv``/``dsyr``): a torch call costs microseconds of
overhead, more than the O(r²) arithmetic of one round for r in the hundreds.

Contents
--------
- :class:`RecursiveAWV`: linear Azoury–Warmuth / ridge forecaster on explicit features with
  Sherman–Morrison updates of ``A⁻¹ = (λI + Σ v vᵀ)⁻¹`` (Algorithm 1 of Jézéquel et al. 2019).
- :class:`GrowingCholeskyInverse`: the inverse Cholesky factor of ``K_tt + λI`` grown by one
  row per round (exact online KRR / Kernel-AWV, O(t²) per round).
- :func:`chol_update`, :func:`chol_downdate`, :func:`chol_append`: rank-one Cholesky
  updates/downdates of an upper factor ``RᵀR`` and the bordering used on dictionary insertion.
- :func:`block_inverse_append` and :class:`KORS` (kernel online row sampling).
- :class:`UndoLog`: the old contents of the array regions a continuing call writes in place,
  replayed on failure (what makes ``learn_one`` all-or-nothing without copying the state).
"""

from __future__ import annotations

import contextlib
import math
import weakref

import numpy as np
from scipy.linalg import blas, solve_triangular
from sklearn.utils import check_random_state

from ..utils._finite import DivergenceError

__all__ = [
    "RecursiveAWV",
    "GrowingCholeskyInverse",
    "chol_update",
    "chol_downdate",
    "chol_append",
    "block_inverse_append",
    "KORS",
    "UndoLog",
    "single_thread_blas",
]

_dsymv = blas.dsymv
_dsyr = blas.dsyr
_BLAS_LIBS = None


def single_thread_blas():
    """Context in which the BLAS libraries of NumPy and SciPy run on one thread.

    Per-round products are O(r²) with r in the hundreds: a threaded BLAS spends more time
    synchronising its threads than computing (on a loaded machine, 100x slower). The controller
    is built once (about 1 ms); entering the context then costs tens of microseconds.
    """
    global _BLAS_LIBS
    if _BLAS_LIBS is None:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS_LIBS = ThreadpoolController().select(user_api="blas")
        except Exception:  # pragma: no cover - threadpoolctl ships with scikit-learn
            _BLAS_LIBS = False
    if not _BLAS_LIBS:
        return contextlib.nullcontext()
    return _BLAS_LIBS.limit(limits=1)


class UndoLog:
    """The old contents of every array region written in place during one call.

    A continuing call (``learn_one``, ``partial_fit``) of an online learner must be
    all-or-nothing. Copying the whole state before each round costs O(state) per round (for a
    learner that keeps its history, O(t) at round t: a quadratic stream); instead each learner
    replaces its small arrays by assignment (the snapshot of ``kernelflow.utils._atomic`` keeps
    them by reference) and writes its large buffers (history rows, factor rows) only through
    :meth:`write`, which records the region's old contents first. On failure :meth:`rollback`
    writes them back in reverse order, so the buffers are bit-identical to before the call. The
    log costs the size of what the call writes, never the size of the state.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.zeros(4); log = UndoLog()
    >>> log.write(a, slice(1, 3), [5.0, 6.0]); log.write(a, 2, 7.0); a
    array([0., 5., 7., 0.])
    >>> log.rollback(); a
    array([0., 0., 0., 0.])
    """

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list = []

    def write(self, a: np.ndarray, index, value) -> None:
        """``a[index] = value``, with the old ``a[index]`` recorded first."""
        self.entries.append((a, index, np.array(a[index], copy=True)))
        a[index] = value

    def rollback(self) -> None:
        """Write back every recorded region, newest first; the log is then empty.

        Replaying the whole log is idempotent, so an interruption of the rollback itself is
        handled by replaying it again from the end.
        """
        while True:
            try:
                for a, index, old in reversed(self.entries):
                    a[index] = old
                self.entries.clear()
                return
            except BaseException:  # noqa: BLE001 - a second interrupt: replay from the end
                continue


def logged_write(log: UndoLog | None, a: np.ndarray, index, value) -> None:
    """``a[index] = value`` through ``log`` when one is active (a continuing call)."""
    if log is None:
        a[index] = value
    else:
        log.write(a, index, value)


#: one spare A⁻¹ buffer per RecursiveAWV for its per-round snapshots (dropped with the instance)
_SPARE_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the A⁻¹ buffer of the state a RecursiveAWV replaced in :meth:`RecursiveAWV.step`, reused by its
#: next step (dropped with the instance)
_ROUND_SPARES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class RecursiveAWV:
    """Linear AWV / online ridge on features ``v_t ∈ R^r`` with Sherman–Morrison updates.

    State: ``A⁻¹`` with ``A_t = λI + Σ_{s≤t} v_s v_sᵀ`` (upper triangle, Fortran order, updated
    in place by ``dsyr``), ``b_t = Σ_{s≤t} y_s v_s`` and ``w = A⁻¹ b`` for the current A and b.
    One round costs one ``dsymv`` and one ``dsyr``:
    with ``u = A_{t-1}⁻¹ v`` and ``q = vᵀu``,

        KRR prediction  ŷ = vᵀ A_{t-1}⁻¹ b_{t-1} = vᵀw,
        AWV prediction  ŷ = vᵀ A_t⁻¹ b_{t-1} = vᵀw / (1 + q)        (Sherman–Morrison),
        A_t⁻¹ = A_{t-1}⁻¹ - u uᵀ / (1 + q),   w ← w - u (vᵀw) / (1 + q),
        after y_t:  b ← b + y_t v,   w ← w + y_t u / (1 + q).

    ``w`` is recomputed from ``A⁻¹ b`` every ``refresh`` rounds so rounding does not drift.
    """

    def __init__(self, r: int, alpha: float, *, refresh: int = 4096):
        self.r = int(r)
        # one r x r allocation (zeros come from calloc): no eye, quotient and Fortran copies
        self.A_inv = np.zeros((self.r, self.r), order="F")
        np.fill_diagonal(self.A_inv, 1.0 / alpha)
        self.b = np.zeros(self.r)
        self.w = np.zeros(self.r)
        self.refresh = int(refresh)
        self.count = 0
        self._pending: tuple[np.ndarray, np.ndarray, float] | None = None  # (v, u, 1 + q)

    def __atomic_copy__(self, memo):
        # The snapshot taken before each round (kernelflow.utils._atomic) copies A⁻¹ into one
        # spare buffer kept per instance: a snapshot lives only until the round returns, and a
        # fresh r x r allocation every round costs page faults that dominate small rounds.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        spare = _SPARE_BUFFERS.get(self)
        if spare is None or spare.shape != self.A_inv.shape:
            spare = np.empty_like(self.A_inv, order="F")
            _SPARE_BUFFERS[self] = spare
        np.copyto(spare, self.A_inv)
        new.A_inv = spare
        new.b, new.w = self.b.copy(), self.w.copy()
        if self._pending is not None:
            v, u, den = self._pending
            new._pending = (v.copy(), u.copy(), den)
        return new

    def copy(self) -> RecursiveAWV:
        """An independent copy (fresh arrays) of the state."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.A_inv = self.A_inv.copy(order="F")
        new.b, new.w = self.b.copy(), self.w.copy()
        if self._pending is not None:
            v, u, den = self._pending
            new._pending = (v.copy(), u.copy(), den)
        return new

    def step(self, v: np.ndarray, y: float, awv: bool) -> tuple[float, RecursiveAWV]:
        """One whole round (:meth:`begin` then :meth:`end`) into a new state; ``self`` unchanged.

        The arithmetic is that of ``begin``/``end`` (bit for bit). The new ``A⁻¹`` is written
        into a spare buffer: the ``A⁻¹`` of the state this one replaced, free once the caller
        has committed ``self`` (a state that is replaced is never used again). Committing is
        then one attribute assignment, so a round interrupted at any point leaves the owner's
        state untouched, with no copy of the whole state per round.
        """
        if self._pending is not None:
            raise RuntimeError("step() called between begin() and end()")
        A = self.A_inv
        u = _dsymv(1.0, A, v)
        q = float(v @ u)
        if not q >= 0.0:  # NaN or a matrix that lost positive definiteness
            raise DivergenceError(f"A⁻¹ is no longer positive definite (q = {q!r})")
        den = 1.0 + q
        yk = float(v @ self.w)
        spare = _ROUND_SPARES.pop(self, None)  # taken: a second step from self allocates anew
        if spare is None or spare.shape != A.shape or spare is A:
            spare = np.empty_like(A, order="F")
        np.copyto(spare, A)
        A_new = _dsyr(-1.0 / den, u, a=spare, overwrite_a=1)
        w = self.w - u * (yk / den)
        b = self.b + y * v
        w += u * (y / den)
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.A_inv, new.b, new.w, new.count = A_new, b, w, self.count + 1
        if new.count % new.refresh == 0:
            new.w = _dsymv(1.0, A_new, b)
        _ROUND_SPARES[new] = A
        return (yk / den if awv else yk), new

    def begin(self, v: np.ndarray, awv: bool) -> float:
        """Put ``v`` into A and return the prediction (AWV or KRR); label still unknown."""
        u = _dsymv(1.0, self.A_inv, v)
        q = float(v @ u)
        if not q >= 0.0:  # NaN or a matrix that lost positive definiteness
            raise DivergenceError(f"A⁻¹ is no longer positive definite (q = {q!r})")
        den = 1.0 + q
        yk = float(v @ self.w)
        self.A_inv = _dsyr(-1.0 / den, u, a=self.A_inv, overwrite_a=1)
        self.w -= u * (yk / den)
        self._pending = (v, u, den)
        return yk / den if awv else yk

    def end(self, y: float) -> None:
        if self._pending is None:
            raise RuntimeError("end() called without a begin() before it")
        v, u, den = self._pending
        self._pending = None
        self.b += y * v
        self.w += u * (y / den)
        self.count += 1
        if self.count % self.refresh == 0:
            self.w = _dsymv(1.0, self.A_inv, self.b)

    def run_blocked(self, V: np.ndarray, y: np.ndarray, awv: bool, preds=None, clock=None,
                    block: int = 64) -> None:
        """Play the rounds in blocks of ``block`` with level-3 BLAS (same predictions as
        :meth:`begin`/:meth:`end` round by round, up to rounding).

        Within a block with features ``V_B`` (k, r), let ``P = A_0⁻¹V_Bᵀ``, ``G = V_B P`` and
        ``m = V_B w_0``. Round j of the block is Bayesian linear regression with prior
        ``N(w_0, A_0⁻¹)`` on the block's earlier rounds, so with ``LLᵀ = G + I`` and
        ``z = L⁻¹(y_B - m)`` (lower triangular: z_j uses labels up to j only),

            ŷ_j^KRR = m_j + Σ_{i<j} L_ji z_i,   ŷ_j^AWV = ŷ_j^KRR / L_jj²,

        and the state moves to ``A⁻¹ ← A_0⁻¹ - QQᵀ``, ``w ← w_0 + Qz`` with ``Q = P L⁻ᵀ``
        (Woodbury). Cost per round O(r² + rk + k²), all in GEMM/TRSM (a few times faster than
        the per-round level-2 calls for r in the hundreds).
        """
        from scipy.linalg import cholesky, solve_triangular

        A = self.full_inverse()
        w, b = self.w.copy(), self.b.copy()
        for s0 in range(0, V.shape[0], block):
            VB, yB = V[s0 : s0 + block], y[s0 : s0 + block]
            k = VB.shape[0]
            P = A @ VB.T
            G = VB @ P
            G[np.diag_indices(k)] += 1.0
            L = cholesky(G, lower=True, check_finite=False)
            m = VB @ w
            z = solve_triangular(L, yB - m, lower=True, check_finite=False)
            if preds is not None:
                diag = np.diag(L)
                y_krr = m + np.tril(L, -1) @ z  # strictly lower: ŷ_j never touches y_j
                preds[s0 : s0 + k] = y_krr / diag**2 if awv else y_krr
            Q = solve_triangular(L, P.T, lower=True, check_finite=False).T  # P L⁻ᵀ
            A -= Q @ Q.T
            w += Q @ z
            b += VB.T @ yB
            if clock is not None:  # times have block granularity
                for j in range(s0, s0 + k):
                    clock(j)
        self.A_inv = np.asfortranarray(A)
        self.b, self.w = b, w
        self.count += V.shape[0]

    def full_inverse(self) -> np.ndarray:
        """Symmetric ``A⁻¹`` rebuilt from its upper triangle."""
        U = np.triu(self.A_inv)
        return U + np.triu(U, 1).T

    def predict_batch(self, V: np.ndarray, awv: bool) -> np.ndarray:
        """Predictions for rows of ``V`` (n, r) as the next round's, without changing state."""
        yk = V @ self.w
        if not awv:
            return yk
        q = np.einsum("ij,ij->i", V @ self.full_inverse(), V)
        return yk / (1.0 + q)


class GrowingCholeskyInverse:
    """Inverse Cholesky factor ``L⁻¹`` of ``K_tt + λI`` grown by one row per round.

    With ``l = L⁻¹ k`` (``k = (k(x_s, x_t))_{s<t}``) and ``δ = sqrt(k(x_t,x_t) + λ - lᵀl)``, the
    new row of L is ``(lᵀ, δ)`` and the new row of ``L⁻¹`` is ``(-lᵀL⁻¹/δ, 1/δ)``. Both products
    are gemv on a view of a preallocated buffer (no copy), O(t²) per round. Keeping
    ``z = L⁻¹ Y`` gives the online KRR prediction ``ŷ_t = lᵀ z`` (the first t-1 entries of z are
    the forward solve of the first t-1 labels, since L is lower triangular) and the Kernel-AWV
    prediction ``ŷ_t λ / δ²`` (``δ² = λ + s²_{t-1}(x_t)``, the posterior-variance shrinkage).
    """

    def __init__(self, capacity: int = 256):
        self.n = 0
        self.Linv = np.zeros((capacity, capacity))
        self.z = np.zeros(capacity)

    def __atomic_copy__(self, memo):
        # The snapshot of a continuing call keeps the buffers by reference: a round writes row n
        # of L⁻¹ and z[n] only, beyond the used block, through the call's UndoLog (see
        # ``append``/``set_label``); ``_grow`` replaces the buffers. So the counters are enough.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _grow(self):
        cap = self.Linv.shape[0] * 2
        Linv = np.zeros((cap, cap))
        Linv[: self.n, : self.n] = self.Linv[: self.n, : self.n]
        z = np.zeros(cap)
        z[: self.n] = self.z[: self.n]
        self.Linv, self.z = Linv, z

    def append(self, k: np.ndarray, diag: float,
               log: UndoLog | None = None) -> tuple[float, float]:
        """Add a point with cross-kernel ``k`` (n,), ``diag = k(x,x) + λ``; return (ŷ_KRR, δ²).

        The new row of ``L⁻¹`` is written through ``log`` when given (a continuing call).
        """
        n = self.n
        if n + 1 > self.Linv.shape[0]:
            self._grow()
        Li = self.Linv[:n, :n]
        l = Li @ k
        delta2 = diag - float(l @ l)
        if not delta2 > 0.0:
            raise np.linalg.LinAlgError(
                f"K + λI lost positive definiteness at row {n} (pivot {delta2!r}); increase alpha"
            )
        delta = math.sqrt(delta2)
        row = np.empty(n + 1)
        row[:n] = -(l @ Li) / delta
        row[n] = 1.0 / delta
        logged_write(log, self.Linv, (n, slice(0, n + 1)), row)
        self.n = n + 1
        self._l, self._delta = l, delta
        return float(l @ self.z[:n]), delta2

    def set_label(self, y: float, log: UndoLog | None = None) -> None:
        """Extend ``z = L⁻¹Y`` with the label of the last appended point."""
        n = self.n - 1
        logged_write(log, self.z, n, (y - float(self._l @ self.z[:n])) / self._delta)


def chol_update(R: np.ndarray, x: np.ndarray) -> np.ndarray:
    """In-place rank-one update of an upper factor: ``R'ᵀR' = RᵀR + x xᵀ``, O(m²).

    A zero last diagonal entry (the bordered matrix of :func:`chol_append`) is handled
    explicitly: the rotation there reduces to ``R'_mm = |x_m|``.
    """
    x = np.array(x, dtype=np.float64)
    m = x.shape[0]
    for k in range(m):
        rkk, xk = R[k, k], x[k]
        r = math.hypot(rkk, xk)
        if rkk == 0.0:
            if k != m - 1:
                raise np.linalg.LinAlgError("zero pivot before the last row in chol_update")
            R[k, k] = r
            break
        c, s = r / rkk, xk / rkk
        R[k, k] = r
        if k + 1 < m:
            R[k, k + 1 :] = (R[k, k + 1 :] + s * x[k + 1 :]) / c
            x[k + 1 :] = c * x[k + 1 :] - s * R[k, k + 1 :]
    return R


def chol_downdate(R: np.ndarray, x: np.ndarray) -> np.ndarray:
    """In-place rank-one downdate: ``R'ᵀR' = RᵀR - x xᵀ``; raises if the result is not PD."""
    x = np.array(x, dtype=np.float64)
    m = x.shape[0]
    for k in range(m):
        rkk, xk = R[k, k], x[k]
        r2 = (rkk - xk) * (rkk + xk)
        if not r2 > 0.0:
            raise np.linalg.LinAlgError("Cholesky downdate would lose positive definiteness")
        r = math.sqrt(r2)
        c, s = r / rkk, xk / rkk
        R[k, k] = r
        if k + 1 < m:
            R[k, k + 1 :] = (R[k, k + 1 :] - s * x[k + 1 :]) / c
            x[k + 1 :] = c * x[k + 1 :] - s * R[k, k + 1 :]
    return R


def chol_append(R: np.ndarray, c: np.ndarray, dd: float, *, method: str = "updown") -> np.ndarray:
    """Upper factor of ``[[H, c], [cᵀ, dd]]`` from the factor R of H, in O(m²).

    ``"updown"`` (Algorithm 2): with ``g = sqrt(1 + dd)``, ``u = (c/(1+g), g)`` and
    ``v = (c/(1+g), -1)``, ``u uᵀ - v vᵀ = [[0, c], [cᵀ, dd]]``, so one update of the bordered
    ``[[R, 0], [0, 0]]`` by u and one downdate by v give the new factor. ``"border"``: the new
    column ``R⁻ᵀc`` and pivot ``sqrt(dd - |R⁻ᵀc|²)`` directly. If the downdate fails (nearly
    singular H) the bordered solve is used instead.
    """
    m = R.shape[0]
    if m == 0:
        if not dd > 0:
            raise np.linalg.LinAlgError("non-positive first pivot in chol_append")
        return np.array([[math.sqrt(dd)]])
    if method == "updown":
        g = math.sqrt(1.0 + dd)
        head = np.asarray(c, dtype=np.float64) / (1.0 + g)
        Rb = np.zeros((m + 1, m + 1))
        Rb[:m, :m] = R
        chol_update(Rb, np.append(head, g))
        try:
            return chol_downdate(Rb, np.append(head, -1.0))
        except np.linalg.LinAlgError:
            pass
    elif method != "border":
        raise ValueError(f"method must be 'updown' or 'border', got {method!r}")
    col = solve_triangular(R, c, trans="T", lower=False, check_finite=False)
    piv = dd - float(col @ col)
    if not piv > 0.0:
        raise np.linalg.LinAlgError(f"non-positive pivot {piv!r} when appending to the factor")
    out = np.zeros((m + 1, m + 1))
    out[:m, :m] = R
    out[:m, m] = col
    out[m, m] = math.sqrt(piv)
    return out


def block_inverse_append(A_inv: np.ndarray, c: np.ndarray, dd: float) -> np.ndarray:
    """Inverse of ``[[A, c], [cᵀ, dd]]`` from ``A⁻¹`` by the Schur complement, O(m²)."""
    m = A_inv.shape[0]
    if m == 0:
        return np.array([[1.0 / dd]])
    u = A_inv @ c
    s = dd - float(c @ u)
    if not s > 0.0:
        raise np.linalg.LinAlgError(f"non-positive Schur complement {s!r} in block inverse")
    out = np.empty((m + 1, m + 1))
    out[:m, :m] = A_inv + np.outer(u, u) / s
    out[:m, m] = -u / s
    out[m, :m] = -u / s
    out[m, m] = 1.0 / s
    return out


class KORS:
    """Kernel Online Row Sampling (Calandriello et al. 2017), as used by PKAWV and Pros-N-KONS.

    State: weights ``S_j`` of the dictionary points and ``T = (S K_II S + μI)⁻¹``. For a new
    point with ``b = (k(x̃_j, x))_j`` and ``κ = k(x, x)``, the point gets temporary weight 1 and

        τ̃ = (1 + ε)/μ · (κ - s̄ᵀ (S̄ K̄ S̄ + μI)⁻¹ s̄),   s̄ = (S ⊙ b, κ),

    computed in O(m²) from T by the Schur complement (no temporary matrix). It is kept with
    probability ``p = min(β τ̃, 1)`` and weight ``1/p`` (the paper's code) or ``sqrt(1/p)``.

    The uniform draws come from a counter-based stream: draw i is entry ``i mod 256`` of
    ``default_rng([seed, i // 256]).random(256)``, the seed taken once from ``rng``. The
    sampler's state is then a few numbers and two arrays that are replaced, never written in
    place, so it is copied in O(1) before each round of a continuing call (saving and restoring
    a Mersenne-Twister state costs about 150 µs, more than a round).
    """

    _BLOCK = 256

    def __init__(self, mu: float, eps: float, beta: float, weights: str, rng):
        self.mu, self.eps, self.beta = float(mu), float(eps), float(beta)
        self.weights = weights
        self.seed = int(check_random_state(rng).randint(0, 2**31 - 1))
        self.draws = 0
        self._uniforms: tuple[int, np.ndarray] | None = None  # (block index, its draws)
        self.S = np.zeros(0)
        self.T = np.zeros((0, 0))

    def __atomic_copy__(self, memo):
        # S, T and the block of draws are replaced, never written in place: a shallow copy
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _uniform(self) -> float:
        """The next uniform draw of the stream."""
        i = self.draws
        j = i // self._BLOCK
        block = self._uniforms
        if block is None or block[0] != j:
            block = (j, np.random.default_rng([self.seed, j]).random(self._BLOCK))
            self._uniforms = block
        self.draws = i + 1
        return float(block[1][i - j * self._BLOCK])

    def probability(self, b: np.ndarray, kappa: float) -> float:
        """Inclusion probability ``p = clip(β τ̃, 0, 1)`` of a point (no state change)."""
        s = self.S * b
        u = self.T @ s
        su = float(s @ u)
        schur = kappa + self.mu - su
        quad = su + (su - kappa) ** 2 / schur
        tau = (1.0 + self.eps) / self.mu * (kappa - quad)
        return min(max(self.beta * tau, 0.0), 1.0)

    def decide(self, b: np.ndarray, kappa: float) -> tuple[bool, float]:
        """Draw the inclusion of a point: ``(keep, p)``; only the stream position advances."""
        p = self.probability(b, kappa)
        return bool(p > 0.0 and self._uniform() < p), p

    def add(self, b: np.ndarray, kappa: float, p: float) -> None:
        """Add a kept point (inclusion probability p) to the weighted state, O(m²)."""
        w = 1.0 / p if self.weights == "inverse" else math.sqrt(1.0 / p)
        self.T = block_inverse_append(self.T, w * self.S * b, w * w * kappa + self.mu)
        self.S = np.append(self.S, w)

    def step(self, b: np.ndarray, kappa: float) -> bool:
        """:meth:`decide`, then :meth:`add` if kept."""
        keep, p = self.decide(b, kappa)
        if keep:
            self.add(b, kappa, p)
        return keep
