"""Random features regenerated from (seed, block index) (Dai et al. 2014, Sec. 2 and Table 1).

A random feature map ``Φ(x) ∈ R^r`` satisfies ``E_ω[Φ(x)ᵀΦ(x')] = k(x, x')``. Doubly stochastic
training never stores the frequencies ω: block ``j`` of a model is drawn again, bit for bit, from a
``torch.Generator`` seeded with a hash of ``(seed, j)``. Draws are made on the CPU in float64, in a
fixed order and with fixed shapes, so every call, process and machine (same torch version) gets
the same block; only the final cast goes to the caller's dtype and device.

Feature maps (the corrected forms of the digest's §4.2; ``m = r/2`` frequencies per block):

- Gaussian ``exp(-|Δ|²/(2σ²))``: ``ω ~ N(0, σ⁻² I)``, feature ``[cos ωᵀx, sin ωᵀx]/√m``.
- Laplace ``exp(-|Δ|₂/σ)``: multivariate Cauchy ``ω = z/(σ|g|)``, same feature.
- Matérn(ν) (``√(2ν)|Δ|/σ`` convention): Student-t with 2ν d.o.f., ``ω = z √(2ν/u)/σ``.
- Cauchy ``1/(1+|Δ|²/σ²)``: Gaussian scale mixture ``ω = z √(2e)/σ``.
- Polynomial / Linear (dot-product ``Σ a_n <x,x'>^n``): Random Maclaurin, degree ``N ~ q``,
  Rademacher ``ω_i``, feature ``√(a_N/q_N) Π_{i≤N} ω_iᵀx / √r``.
- ArcCosine order n: ``ω ~ N(0, I)``, feature ``√(2/r) 1[ωᵀx > 0] (ωᵀx)^n``.

with ``z ~ N(0, I_d)``, ``g ~ N(0, 1)``, ``u ~ χ²_{2ν}``, ``e ~ Exp(1)``. Table 1 of the paper
states the Laplace and Cauchy kernels with the l1 distance / as products over coordinates; this
library's kernels use the Euclidean distance, whose spectral measures are the multivariate scale
mixtures above (Laplace = Matérn ν=1/2, i.e. a t-distribution with one degree of freedom). The
arc-cosine feature carries the √2 and has degree n (not n+1) as corrected in the digest.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kernelflow.kernels import (
    Kernel,
    Linear,
    Polynomial,
)

if TYPE_CHECKING:
    from kernelflow.typing import ArrayLike

__all__ = [
    "ArcCosine",
    "FeatureBlock",
    "block_seed",
    "block_generator",
    "sample_block",
    "concat_blocks",
    "random_features",
    "supports_random_features",
]

_TRIG = "trig"
_MACLAURIN = "maclaurin"
_ARCCOS = "arccos"


class ArcCosine(Kernel):
    """Arc-cosine kernel of order n (Cho & Saul 2009), ``k = (1/π)|x|^n |x'|^n J_n(θ)``.

    ``θ`` is the angle between x and x'; ``J_0 = π - θ``, ``J_1 = sin θ + (π - θ) cos θ``,
    ``J_2 = 3 sin θ cos θ + (π - θ)(1 + 2 cos² θ)``. Its random features are
    ``√2 · 1[ωᵀx > 0] (ωᵀx)^n`` with ``ω ~ N(0, I)``. Cost of a block O(n1 n2 d).

    Parameters
    ----------
    order : {0, 1, 2}, default=1

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> ArcCosine(order=0)(X).numpy().round(3)
    array([[1. , 0.5],
           [0.5, 1. ]])
    """

    def __init__(self, order: int = 1) -> None:
        self.order = order

    def validate(self) -> None:
        if self.order not in (0, 1, 2):
            raise ValueError(f"ArcCosine: order must be 0, 1 or 2, got {self.order!r}.")

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        n1 = P1.norm(dim=1, keepdim=True)
        n2 = P2.norm(dim=1, keepdim=True)
        denom = (n1 * n2.T).clamp_min(torch.finfo(P1.dtype).tiny)
        cos = (P1 @ P2.T / denom).clamp_(-1.0, 1.0)
        theta = torch.arccos(cos)
        sin = torch.sin(theta)
        pt = math.pi - theta
        if self.order == 0:
            J = pt
        elif self.order == 1:
            J = sin + pt * cos
        else:
            J = 3.0 * sin * cos + pt * (1.0 + 2.0 * cos * cos)
        return (n1 * n2.T) ** self.order * J / math.pi

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        self.validate()
        return (X * X).sum(1) ** self.order * (3.0 if self.order == 2 else 1.0)


# ---- seeding ----------------------------------------------------------------------------------
def block_seed(seed: int, block_index: int) -> int:
    """63-bit generator seed of block ``block_index`` of the stream ``seed``.

    BLAKE2b of the two integers (little-endian int64 pair): stable across processes and machines,
    unlike Python's salted ``hash``.

    Examples
    --------
    >>> block_seed(0, 1) == block_seed(0, 1) != block_seed(1, 0)
    True
    """
    data = struct.pack("<qq", int(seed), int(block_index))
    h = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return h & 0x7FFF_FFFF_FFFF_FFFF


def block_generator(seed: int, block_index: int) -> torch.Generator:
    """CPU ``torch.Generator`` of block ``block_index`` of stream ``seed`` (:func:`block_seed`)."""
    return torch.Generator(device="cpu").manual_seed(block_seed(seed, block_index))


# ---- blocks ----------------------------------------------------------------------------------
@dataclass
class FeatureBlock:
    """Parameters of one or more concatenated feature blocks (feature axis last).

    Attributes
    ----------
    kind : {"trig", "maclaurin", "arccos"}
    n_features : int
        Output columns ``r`` (per block times number of blocks).
    params : dict of str to Tensor
        ``W`` (d, m) frequencies for all kinds; ``"maclaurin"`` adds ``degree`` (r,), ``scale``
        (r,) and ``W`` of shape (p, d, r); ``"arccos"`` adds ``order`` as a 0-d tensor.
    norm : float
        Per-block normalisation (``1/√m`` or ``1/√r``) so that ``Φᵀ Φ ≈ k``.
    """

    kind: str
    n_features: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    norm: float = 1.0
    n_blocks: int = 1

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> FeatureBlock:
        """Cast float parameters (integer ones keep their dtype)."""
        p = {
            k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
            for k, v in self.params.items()
        }
        return FeatureBlock(self.kind, self.n_features, p, self.norm, self.n_blocks)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.params.values())

    def _params_like(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            k: v.to(device=X.device, dtype=X.dtype if v.is_floating_point() else v.dtype)
            for k, v in self.params.items()
        }

    def _trig_parts(self, X: torch.Tensor,
                    p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        Z = X @ p["W"]  # (n, B*m), block-major frequencies
        return torch.cos(Z), torch.sin(Z)

    def _raw(self, X: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        # non-trig kinds, without the normalisation
        if self.kind == _ARCCOS:
            Z = X @ p["W"]
            n = int(p["order"])
            out = Z.clamp_min(0.0) if n == 1 else (Z > 0).to(X.dtype) * Z**n
            return out.mul_(math.sqrt(2.0))
        if self.kind == _MACLAURIN:
            W = p["W"]  # (P, d, r)
            deg = p["degree"]
            out = p["scale"].expand(X.shape[0], -1).clone()
            for i in range(W.shape[0]):
                f = X @ W[i]
                out *= torch.where(deg > i, f, torch.ones_like(f))
            return out
        raise ValueError(f"Unknown feature kind {self.kind!r}.")

    def _split(self, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (B*r, C) block-major -> cos part, sin part, each (B*m, C)
        B = self.n_blocks
        A = A.reshape(B, 2, -1, A.shape[-1])
        return A[:, 0].reshape(-1, A.shape[-1]), A[:, 1].reshape(-1, A.shape[-1])

    def __call__(self, X: torch.Tensor) -> torch.Tensor:  # (n, d) -> (n, n_features)
        """Evaluate the features on X (parameters are cast to X's dtype and device)."""
        p = self._params_like(X)
        if self.kind == _TRIG:
            c, s = self._trig_parts(X, p)
            B = self.n_blocks
            out = torch.stack([c.view(len(X), B, -1), s.view(len(X), B, -1)], dim=2)
            return out.view(X.shape[0], self.n_features).mul_(self.norm)
        return self._raw(X, p).mul_(self.norm)

    def matmul(self, X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:  # -> (n, C)
        """``Φ(X) @ A`` for A of shape (n_features, C), without forming Φ in block layout."""
        p = self._params_like(X)
        if self.kind == _TRIG:
            c, s = self._trig_parts(X, p)
            Ac, As = self._split(A)
            return torch.addmm(c @ Ac, s, As).mul_(self.norm)
        return (self._raw(X, p) @ A).mul_(self.norm)

    def t_matmul(self, X: torch.Tensor, G: torch.Tensor) -> torch.Tensor:  # -> (n_features, C)
        """``Φ(X)ᵀ @ G`` for G of shape (n, C), in block layout."""
        p = self._params_like(X)
        if self.kind == _TRIG:
            c, s = self._trig_parts(X, p)
            B = self.n_blocks
            C = G.shape[1]
            out = torch.stack([(c.T @ G).view(B, -1, C), (s.T @ G).view(B, -1, C)], dim=1)
            return out.reshape(self.n_features, G.shape[1]).mul_(self.norm)
        return (self._raw(X, p).T @ G).mul_(self.norm)


def supports_random_features(kernel: object) -> bool:
    """Whether :func:`sample_block` has a real feature map for ``kernel``.

    Examples
    --------
    >>> from kernelflow.kernels import Gaussian
    >>> supports_random_features(Gaussian(1.0)), supports_random_features("rbf")
    (True, False)
    """
    return isinstance(kernel, _SUPPORTED) or (isinstance(kernel, Kernel)
                                                and kernel.has_spectral_measure())


#: kernels with a Maclaurin or arc-cosine map (shift-invariant kernels sample their own measure)
_SUPPORTED = (Linear, Polynomial, ArcCosine)


def _maclaurin_weights(kernel: Linear | Polynomial, d: int) -> list[float]:
    # Dot-product kernel as sum_n a_n <x, x'>^n.
    if isinstance(kernel, Linear):
        return [0.0, 1.0]
    p = kernel.degree
    if float(p) != int(p):
        raise ValueError(f"Random Maclaurin features need an integer degree, got {p!r}.")
    p = int(p)
    g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
    c = float(kernel.coef0)
    if c < 0:
        raise ValueError("Random Maclaurin features need coef0 >= 0 (a_n >= 0).")
    return [math.comb(p, n) * g**n * c ** (p - n) for n in range(p + 1)]


def sample_block(kernel: Kernel, n_input: int, n_features: int, seed: int,
                 block_index: int) -> FeatureBlock:
    """Draw block ``block_index`` of stream ``seed``: the parameters of ``n_features`` features.

    The result depends only on ``(kernel, n_input, n_features, seed, block_index)``. Cost
    O(n_features · n_input) random draws (times the degree for Maclaurin features).

    Parameters
    ----------
    kernel : Kernel
        One of Gaussian, Laplace, Matern, Cauchy, Linear, Polynomial, ArcCosine.
    n_input : int
        Input dimension d.
    n_features : int
        Features in the block (even for the stationary kernels: cos/sin pairs).
    seed, block_index : int

    Returns
    -------
    block : FeatureBlock (float64, CPU)

    Examples
    --------
    >>> from kernelflow.kernels import Gaussian
    >>> b = sample_block(Gaussian(1.0), 3, 8, seed=0, block_index=5)
    >>> b.n_features, tuple(b.params["W"].shape)
    (8, (3, 4))
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a Kernel object, got {type(kernel).__name__}.")
    kernel.validate()
    n_features = int(n_features)
    if n_features < 1 or n_input < 1:
        raise ValueError(f"n_features and n_input must be >= 1, got {n_features}, {n_input}.")
    gen = block_generator(seed, block_index)
    f64 = torch.float64
    d = int(n_input)
    if kernel.has_spectral_measure():
        if n_features % 2:
            raise ValueError(
                f"Stationary kernels use cos/sin pairs: n_features must be even, got {n_features}."
            )
        m = n_features // 2
        W = kernel.sample_frequencies(d, m, gen)
        norm = math.sqrt(kernel.spectral_mass()) / math.sqrt(m)
        return FeatureBlock(_TRIG, n_features, {"W": W}, norm)
    if isinstance(kernel, ArcCosine):
        W = torch.randn(d, n_features, generator=gen, dtype=f64)
        order = torch.tensor(int(kernel.order))
        params = {"W": W, "order": order}
        return FeatureBlock(_ARCCOS, n_features, params, 1 / math.sqrt(n_features))
    if isinstance(kernel, Linear | Polynomial):
        a = _maclaurin_weights(kernel, d)
        # Truncated geometric P[N = n] ∝ 2^-(n+1) on the degrees with a_n > 0 (Kar & Karnick's
        # p = 2); scaling by sqrt(a_N / q_N) keeps the estimator unbiased.
        support = [n for n, an in enumerate(a) if an > 0]
        q = torch.tensor([2.0 ** -(n + 1) for n in support], dtype=f64)
        q = q / q.sum()
        pick = torch.multinomial(q, n_features, replacement=True, generator=gen)
        deg = torch.tensor(support, dtype=torch.int64)[pick]
        scale = torch.tensor([math.sqrt(a[n]) for n in support], dtype=f64)[pick] / q[pick].sqrt()
        P = max(1, max(support))
        W = torch.randint(0, 2, (P, d, n_features), generator=gen, dtype=torch.int64)
        W = W.to(f64).mul_(2.0).sub_(1.0)
        params = {"W": W, "degree": deg, "scale": scale}
        return FeatureBlock(_MACLAURIN, n_features, params, 1 / math.sqrt(n_features))
    raise ValueError(
        f"No real random-feature map for {type(kernel).__name__}; supported: Gaussian, Laplace, "
        "Matern, Cauchy, Linear, Polynomial, ArcCosine."
    )


def concat_blocks(blocks: list[FeatureBlock]) -> FeatureBlock:
    """Concatenate blocks of one kind and size so that one call evaluates them all.

    The output columns are block-major: columns ``[j r, (j+1) r)`` are block j's features.
    """
    if not blocks:
        raise ValueError("concat_blocks needs at least one block.")
    b0 = blocks[0]
    if len(blocks) == 1:
        return b0
    params = {
        k: v if v.ndim == 0 else torch.cat([b.params[k] for b in blocks], dim=-1)
        for k, v in b0.params.items()
    }
    n_blocks = sum(b.n_blocks for b in blocks)
    return FeatureBlock(b0.kind, sum(b.n_features for b in blocks), params, b0.norm, n_blocks)


def random_features(kernel: Kernel, X: ArrayLike, seed: int, block_index: int,
                    n_features: int) -> torch.Tensor:
    """Features ``Φ_j(X)`` of block ``j = block_index`` of stream ``seed``: ``Φᵀ Φ ≈ k``.

    ``E[Φ_j(x)ᵀ Φ_j(x')] = k(x, x')`` with error O(1/√n_features). Calling it again with the same
    arguments, in any process, returns the same tensor. Cost O(n · n_features · d).

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
    seed, block_index : int
    n_features : int

    Returns
    -------
    Phi : Tensor of shape (n, n_features), X's dtype and device

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    >>> Phi = random_features(Gaussian(1.0), X, seed=0, block_index=0, n_features=20000)
    >>> round(float(Phi[0] @ Phi[1]), 1), round(float(Gaussian(1.0)(X)[0, 1]), 1)
    (0.6, 0.6)
    """
    X = torch.as_tensor(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {tuple(X.shape)}.")
    if not X.is_floating_point():
        X = X.to(torch.float64)
    return sample_block(kernel, X.shape[1], n_features, seed, block_index)(X)
