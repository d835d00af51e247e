"""Taylor features of the Gaussian kernel (Jézéquel, Gaillard & Rudi 2019, eq. 6).

For ``k(x, x') = exp(-||x - x'||² / (2σ²))`` and a multi-index ``k ∈ N₀^d`` the functions

    g_k(x) = exp(-||x||² / (2σ²)) · Π_i (x_i / σ)^{k_i} / sqrt(k_i!)

are orthonormal in the Gaussian RKHS and ``k(x, x') = Σ_k g_k(x) g_k(x')``. Keeping the
``r = C(M + d, d)`` indices of total degree ``|k| ≤ M`` gives an explicit feature map whose inner
products are the Gaussian kernel with ``exp(xᵀx'/σ²)`` truncated at order M:

    φ(x)ᵀφ(x') = exp(-(||x||² + ||x'||²) / (2σ²)) Σ_{j ≤ M} (xᵀx'/σ²)^j / j!

with error at most ``(R/σ)^{2M+2} / (M+1)!`` when ``||x||, ||x'|| ≤ R`` (paper eq. 30).
"""

from __future__ import annotations

import math
from itertools import combinations_with_replacement
from typing import TYPE_CHECKING, overload

import numpy as np
import torch

from kernelflow.kernels import check_bandwidth
from kernelflow.operators import memory_budget
from kernelflow.utils._finite import MemoryBudgetError

if TYPE_CHECKING:
    from kernelflow.typing import ArrayLike, Output

__all__ = [
    "check_taylor_size",
    "n_taylor_features",
    "taylor_multi_indices",
    "taylor_features",
    "taylor_kernel",
    "taylor_truncation_bound",
    "theoretical_taylor_degree",
]


def n_taylor_features(d: int, M: int, *, mode: str = "compact") -> int:
    """Number of Taylor features: ``C(M + d, d)`` (compact) or ``Σ_{k ≤ M} d^k`` (ordered).

    Parameters
    ----------
    d : int
        Input dimension.
    M : int
        Maximal total degree.
    mode : {"compact", "ordered"}, default="compact"
        ``"ordered"`` counts the redundant ordered products of the paper's listing.

    Returns
    -------
    r : int

    Examples
    --------
    >>> n_taylor_features(8, 3), n_taylor_features(8, 3, mode="ordered")
    (165, 585)
    """
    _check_dm(d, M)
    _check_mode(mode)
    if mode == "compact":
        return math.comb(M + d, d)
    return M + 1 if d == 1 else (d ** (M + 1) - 1) // (d - 1)


def _check_dm(d: int, M: int) -> None:
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    if isinstance(M, bool) or not isinstance(M, int | np.integer) or M < 0:
        raise ValueError(f"M must be a non-negative integer, got {M!r}")


def _check_mode(mode: str) -> None:
    if mode not in ("compact", "ordered"):
        raise ValueError(f"mode must be 'compact' or 'ordered', got {mode!r}")


def _capped_count(d: int, M: int, mode: str, cap: int) -> int:
    """:func:`n_taylor_features`, or ``cap + 1`` as soon as it exceeds ``cap``.

    The count is built as a product of increasing partial counts, so the loop stops after
    O(log cap) steps whatever d and M are (``C(M + d, d)`` with M = 10⁸ and d = 200 is a
    1 500-digit number; the sum of ``d^k`` is larger still).
    """
    d, M = int(d), int(M)
    if mode == "ordered":
        if d == 1:
            return min(M + 1, cap + 1)
        total, term = 0, 1
        for _ in range(M + 1):  # total ≥ 2^k after k terms: at most log2(cap) + 2 steps
            total += term
            if total > cap:
                return cap + 1
            term *= d
        return total
    k, top = min(d, M), max(d, M)  # C(M + d, d) = C(top + k, k)
    c = 1
    for i in range(1, k + 1):  # c = C(top + i, i), exact; it at least doubles (i ≤ k ≤ top)
        c = c * (top + i) // i
        if c > cap:
            return cap + 1
    return c


def check_taylor_size(d: int, M: int, *, mode: str = "compact", bytes_per_feature: int = 8,
                      bytes_per_feature_squared: int = 0, budget: int | None = None,
                      what: str = "Taylor features") -> int:
    """Number of Taylor features r, after checking that ``r`` fits the memory budget.

    The need is ``bytes_per_feature · r + bytes_per_feature_squared · r²`` (e.g. ``8 n`` for
    an n x r feature matrix, ``16`` for an r x r state and its copy). r is counted in
    O(log budget) steps, so an absurd degree (``M = 10**8``) or dimension is refused at once,
    before anything is allocated, with a :class:`~kernelflow.operators.MemoryBudgetError`
    (a ``ValueError`` and a ``MemoryError``) that names the largest degree that fits.

    Parameters
    ----------
    d : int
        Input dimension.
    M : int
        Maximal total degree.
    mode : {"compact", "ordered"}, default="compact"
    bytes_per_feature, bytes_per_feature_squared : int
        Bytes needed per feature and per squared feature.
    budget : int, optional
        Bytes allowed; default :func:`kernelflow.operators.memory_budget`.
    what : str
        What is being built, for the message.

    Returns
    -------
    r : int

    Examples
    --------
    >>> check_taylor_size(8, 3, bytes_per_feature=8 * 1000)
    165
    >>> try:
    ...     check_taylor_size(8, 10**8, budget=2**30)
    ... except MemoryError as exc:
    ...     print(str(exc)[:59])
    Taylor features with d = 8 and degree=100000000 has r above
    """
    _check_dm(d, M)
    _check_mode(mode)
    budget = memory_budget() if budget is None else int(budget)
    a, b = max(int(bytes_per_feature), 1), int(bytes_per_feature_squared)
    # the largest r whose need fits: a r + b r² ≤ budget
    cap = budget // a if b == 0 else (math.isqrt(a * a + 4 * b * max(budget, 0)) - a) // (2 * b)
    r = _capped_count(d, M, mode, cap)
    if r <= cap:
        return r
    lo, hi = 0, int(M)  # degree 0 (r = 1) may not fit either: then no degree fits
    while lo < hi:  # the largest degree that fits: O(log M) capped counts
        mid = (lo + hi + 1) // 2
        if _capped_count(d, mid, mode, cap) <= cap:
            lo = mid
        else:
            hi = mid - 1
    fits = _capped_count(d, lo, mode, cap) <= cap
    formula = "C(M + d, d)" if mode == "compact" else "the sum of d^k for k <= M"
    exact = _capped_count(d, M, mode, 10**15)
    count = f"r = {exact}" if exact <= 10**15 else "r above 10^15"
    advice = (f"Use degree={lo} (r = {_capped_count(d, lo, mode, cap)})" if fits
              else "No degree fits")
    raise MemoryBudgetError(
        f"{what} with d = {d} and degree={M} has {count} features ({formula}), above the "
        f"{cap} that fit the memory budget of {budget / 2**30:.3g} GiB. {advice}, use fewer "
        "input features, or a Nyström or random-feature method for high-dimensional inputs."
    )


def taylor_multi_indices(d: int, M: int) -> np.ndarray:
    """All multi-indices ``k ∈ N₀^d`` with ``|k| ≤ M`` in a fixed order.

    The order is by total degree, then the order of
    ``itertools.combinations_with_replacement(range(d), degree)`` (scikit-learn's
    ``PolynomialFeatures`` order), so feature j means the same monomial on every run.

    Parameters
    ----------
    d : int
        Input dimension.
    M : int
        Maximal total degree.

    Returns
    -------
    K : ndarray of shape (C(M + d, d), d), dtype int64
        Row j holds the exponents of feature j.

    Examples
    --------
    >>> taylor_multi_indices(2, 2).tolist()
    [[0, 0], [1, 0], [0, 1], [2, 0], [1, 1], [0, 2]]
    """
    # the Python rows cost about (64 + 16 d) bytes each before the int64 array is made
    check_taylor_size(d, M, bytes_per_feature=64 + 16 * int(d), what="Taylor multi-indices")
    rows = []
    for degree in range(M + 1):
        for combo in combinations_with_replacement(range(d), degree):
            row = [0] * d
            for i in combo:
                row[i] += 1
            rows.append(row)
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), d)


def _recursion_plan(
    d: int, M: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Parent, variable and scale of each feature: g_k = g_parent · (x_var/σ) · scale.

    Adding one to ``k_i`` multiplies ``g_k`` by ``(x_i/σ)/sqrt(k_i + 1)``, so each feature of
    degree j > 0 is one product away from a feature of degree j - 1 (its parent).
    """
    K = taylor_multi_indices(d, M)
    position = {tuple(row): j for j, row in enumerate(K.tolist())}
    r = len(K)
    parent = np.zeros(r, dtype=np.int64)
    var = np.zeros(r, dtype=np.int64)
    scale = np.ones(r)
    blocks = []
    start = 1
    for degree in range(1, M + 1):
        stop = start + math.comb(degree + d - 1, d - 1)
        for j in range(start, stop):
            row = K[j].copy()
            i = int(np.flatnonzero(row)[-1])  # last non-zero exponent: deterministic parent
            scale[j] = 1.0 / math.sqrt(row[i])
            row[i] -= 1
            parent[j] = position[tuple(row.tolist())]
            var[j] = i
        blocks.append((start, stop))
        start = stop
    return K, parent, var, scale, blocks


class _TaylorMap:
    """Precomputed recursion for fast feature evaluation (one row or a batch), NumPy or torch.

    Cost: O(r) multiplications per row after the O(d) envelope.
    """

    def __init__(self, d: int, M: int, sigma: float) -> None:
        self.d, self.M, self.sigma = int(d), int(M), float(sigma)
        self.indices, self.parent, self.var, self.scale, self.blocks = _recursion_plan(d, M)
        self.r = len(self.indices)

    def row(self, x: np.ndarray) -> np.ndarray:
        """Features of one row ``x`` of shape (d,)."""
        z = x / self.sigma
        out = np.empty(self.r)
        out[0] = math.exp(-0.5 * float(z @ z))
        for a, b in self.blocks:
            out[a:b] = out[self.parent[a:b]] * z[self.var[a:b]] * self.scale[a:b]
        return out

    @overload
    def batch(self, X: np.ndarray) -> np.ndarray: ...

    @overload
    def batch(self, X: torch.Tensor) -> torch.Tensor: ...

    def batch(self, X: Output) -> Output:
        """Features of the rows of ``X`` (n, d): NumPy in, NumPy out; torch in, torch out."""
        if torch.is_tensor(X):
            Z = X / self.sigma
            out = torch.empty((X.shape[0], self.r), dtype=X.dtype, device=X.device)
            out[:, 0] = torch.exp(-0.5 * (Z * Z).sum(1))
            parent = torch.as_tensor(self.parent, device=X.device)
            var = torch.as_tensor(self.var, device=X.device)
            scale = torch.as_tensor(self.scale, dtype=X.dtype, device=X.device)
            for a, b in self.blocks:
                out[:, a:b] = out[:, parent[a:b]] * Z[:, var[a:b]] * scale[a:b]
            return out
        Zn = np.asarray(X, dtype=np.float64) / self.sigma
        outn = np.empty((Zn.shape[0], self.r))
        outn[:, 0] = np.exp(-0.5 * np.einsum("ij,ij->i", Zn, Zn))
        for a, b in self.blocks:
            outn[:, a:b] = outn[:, self.parent[a:b]] * Zn[:, self.var[a:b]] * self.scale[a:b]
        return outn


def _ordered_features(X: np.ndarray, sigma: float, M: int) -> np.ndarray:
    """The paper's listing (H.2): all ``d^k`` ordered products, same Gram matrix, more columns."""
    n = X.shape[0]
    Z = X / sigma
    cols = [np.ones((n, 1))]
    mm = np.ones((n, 1))
    for k in range(1, M + 1):
        mm = (mm[:, :, None] * Z[:, None, :]).reshape(n, -1)
        cols.append(mm / math.sqrt(math.factorial(k)))
    return np.hstack(cols) * np.exp(-0.5 * np.einsum("ij,ij->i", Z, Z))[:, None]


@overload
def _centred(X: np.ndarray, center: ArrayLike | None) -> np.ndarray: ...


@overload
def _centred(X: torch.Tensor, center: ArrayLike | None) -> torch.Tensor: ...


def _centred(X: Output, center: ArrayLike | None) -> Output:
    """``X - center`` after checking ``center`` (None: X unchanged)."""
    if center is None:
        return X
    d = X.shape[1]
    c = np.asarray(center.detach().cpu() if torch.is_tensor(center) else center, dtype=np.float64)
    if c.shape != (d,) or not np.all(np.isfinite(c)):
        raise ValueError(f"center must be a finite vector of length {d}, got shape {c.shape}.")
    if isinstance(X, torch.Tensor):
        return X - torch.as_tensor(c, dtype=X.dtype, device=X.device)
    return X - c


def taylor_features(X: ArrayLike, *, sigma: float | ArrayLike = 1.0, M: int = 2,
                    mode: str = "compact", center: ArrayLike | None = None) -> Output:
    """Taylor features ``φ(x) = (g_k(x))_{|k| ≤ M}`` of the Gaussian kernel (paper eq. 6).

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n_samples, d)
        Inputs. A torch tensor gives a torch tensor of the same dtype and device.
    sigma : float or array-like of shape (d,), default=1.0
        Gaussian bandwidth σ in ``exp(-||x - x'||² / (2σ²))``, or one per feature (ARD: the
        features of X / σ at σ = 1).
    M : int, default=2
        Maximal total degree.
    mode : {"compact", "ordered"}, default="compact"
        ``"compact"``: the ``C(M + d, d)`` orthonormal functions ``g_k`` in the order of
        :func:`taylor_multi_indices`, computed by a degree recursion in O(n r).
        ``"ordered"``: the paper's code, ``Σ_k d^k`` ordered products with the same Gram matrix.
    center : array-like of shape (d,), optional
        Expand around ``center``: the features of ``x - center``. The Gaussian kernel is
        translation invariant, so the features still approximate the same kernel, and the
        truncation error (which grows with ``||x||/σ``) is small for data near ``center``.

    Returns
    -------
    Phi : ndarray or torch.Tensor of shape (n_samples, r)

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.RandomState(0).uniform(-1, 1, size=(3, 2))
    >>> Phi = taylor_features(X, sigma=1.0, M=6)
    >>> Phi.shape
    (3, 28)
    >>> K = np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))
    >>> bool(np.abs(Phi @ Phi.T - K).max() < 1e-3)
    True
    """
    Xa: Output = X if torch.is_tensor(X) else np.asarray(X, dtype=np.float64)
    if Xa.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, d), got shape {tuple(Xa.shape)}")
    # the (n, r) output, the recursion plan and the multi-indices, before building anything
    d = Xa.shape[1]
    check_taylor_size(d, M, mode=mode, bytes_per_feature=8 * Xa.shape[0] + 64 + 24 * d,
                      what="Taylor features")
    Xa = _centred(Xa, center)
    if not isinstance(sigma, int | float | np.floating):
        # per-feature bandwidths: the Gaussian with ARD is the Gaussian of X / sigma at sigma = 1
        sig = check_bandwidth(sigma, Xa.shape[1])
        if isinstance(Xa, torch.Tensor):
            return taylor_features(Xa / torch.as_tensor(sig, dtype=Xa.dtype, device=Xa.device),
                                   sigma=1.0, M=M, mode=mode)
        return taylor_features(Xa / sig, sigma=1.0, M=M, mode=mode)
    if not sigma > 0:
        raise ValueError(f"sigma must be a positive number, got {sigma!r}")
    if mode == "ordered":
        arr = Xa.detach().cpu().double().numpy() if isinstance(Xa, torch.Tensor) else Xa
        out = _ordered_features(arr, float(sigma), M)
        if isinstance(X, torch.Tensor):
            return torch.as_tensor(out, dtype=X.dtype, device=X.device)
        return out
    if mode != "compact":
        raise ValueError(f"mode must be 'compact' or 'ordered', got {mode!r}")
    return _TaylorMap(Xa.shape[1], M, float(sigma)).batch(Xa)


def taylor_kernel(X1: ArrayLike, X2: ArrayLike, *, sigma: float | ArrayLike = 1.0, M: int = 2,
                  center: ArrayLike | None = None) -> np.ndarray:
    """Closed form of the truncated kernel ``φ(x)ᵀφ(x')`` (no features built).

    ``exp(-(||x||² + ||x'||²)/(2σ²)) Σ_{j ≤ M} (xᵀx'/σ²)^j / j!``, of ``x - center`` and
    ``x' - center`` when ``center`` is given (see :func:`taylor_features`). Cost
    O(n1 n2 (d + M)).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.3, -0.2]])
    >>> float(np.round(taylor_kernel(X, X, M=2)[0, 0], 6))
    0.999668
    """
    A = _centred(np.asarray(X1, dtype=np.float64), center)
    _check_dm(max(A.shape[-1], 1), M)
    sig = check_bandwidth(sigma, A.shape[-1])  # a scalar, or per-feature bandwidths (ARD)
    A = A / sig
    B = _centred(np.asarray(X2, dtype=np.float64), center) / sig
    G = A @ B.T
    series = np.zeros_like(G)
    term = np.ones_like(G)
    for j in range(M + 1):
        series += term
        term = term * G / (j + 1)
        if not term.any():  # every later term is zero too (a large M costs nothing more)
            break
    env = np.exp(-0.5 * (A * A).sum(1))[:, None] * np.exp(-0.5 * (B * B).sum(1))[None, :]
    return env * series


def taylor_truncation_bound(R: float, sigma: float, M: int) -> float:
    """Bound ``(R/σ)^{2M+2} / (M+1)!`` on ``|k(x, x') - φ(x)ᵀφ(x')|`` for ``||x||, ||x'|| ≤ R``.

    Examples
    --------
    >>> round(taylor_truncation_bound(1.0, 1.0, 3), 6)
    0.041667
    """
    return float((R / sigma) ** (2 * M + 2) / math.factorial(M + 1))


def theoretical_taylor_degree(n: int, *, R: float, sigma: float = 1.0, alpha: float = 1.0) -> int:
    """Degree of Theorem 4: ``M = ceil(max(8 R²/σ², 2 log(n / min(λ, 1))))``.

    With this M the projection error is at most λ/9 and PKAWV-Taylor keeps the regret
    ``λ||f||² + (3/2) B² log det(I + K/λ)``. It is large (M = 64 for d = 8, n = 2.7e5 with data
    in ``[-1, 1]^d``, R = sqrt(d)); in practice M ∈ {2, 3, 4} is used and set directly.

    Parameters
    ----------
    n : int
        Horizon (number of rounds).
    R : float
        Bound on ``||x_t||`` (``sqrt(d)`` for data in ``[-1, 1]^d``).
    sigma : float, default=1.0
        Gaussian bandwidth.
    alpha : float, default=1.0
        Ridge parameter λ.

    Returns
    -------
    M : int

    Examples
    --------
    >>> theoretical_taylor_degree(270_000, R=2.0, sigma=1.0)
    32
    """
    if n < 1 or R < 0 or sigma <= 0 or alpha <= 0:
        raise ValueError("need n >= 1, R >= 0, sigma > 0 and alpha > 0")
    return int(math.ceil(max(8.0 * R**2 / sigma**2, 2.0 * math.log(n / min(alpha, 1.0)))))
