"""Doubly stochastic functional gradients (Dai et al. 2014, Algorithms 1 and 2).

The model is ``f(x) = Σ_j α_jᵀ Φ_j(x) (+ b)`` where ``Φ_j`` is feature block j, regenerated from
``(seed, j)`` by :mod:`kernelflow.features.random`; only the coefficients ``α_j ∈ R^{r×C}`` are
stored. Iteration t draws a mini-batch ``B_t`` (b rows) and a new feature block, and performs
(digest §2.5, the unbiased mini-batch × block form of Algorithm 1):

    α_t = -γ_t (1/Σw) Σ_{i∈B_t} w_i l'(f(x_i), y_i) Φ_t(x_i)      (step 5)
    α_j ← (1 - γ_t ν) α_j   for j < t                                (step 6)

``f`` on the batch is Algorithm 2 with the coefficients before the step. The shrink of step 6 is
a global scale ``S_t = Π (1 - γ_i ν)`` with stored ``α̃_j = α_j / S``, so a step costs no O(t) pass;
a factor of exactly 0 (``θν`` an integer with ``γ_t = θ/t``) wipes the old coefficients and tiny
scales are folded back, as the digest's §8 recommends. With ``precondition=c`` the block step is
``(H + (c·tr(H)/r + ν) I)^{-1}`` times the gradient, ``H = Φ_tᵀ W Φ_t/Σw`` the empirical covariance
of the block (digest §2.6; the ridge is relative to H's mean eigenvalue). Optionally the
averaged iterate ``f̂_t = (1/t) Σ f_i`` is kept as a second coefficient set.

Cost of iteration t: O(b · t r · d) to predict on the batch (all t blocks), O(b r d) for the new
block, O(r² b + r³) with preconditioning; memory O(t r C) for the coefficients (plus an optional
cache of the block parameters, which is not part of the model). Every sum over rows goes through
:func:`kernelflow.collectives.all_reduce_sum`, so data-parallel processes that regenerate
the same blocks from the shared seed take identical steps.
"""

from __future__ import annotations

import logging
import math
from typing import Any, cast

import numpy as np
import torch

from ..collectives import all_reduce_sum
from ..features.random import FeatureBlock, concat_blocks, sample_block
from ..utils._finite import DivergenceError
from ..utils.checkpoint import Checkpoint, monitor_state, restore_monitor
from ..utils.monitor import EarlyStopping
from .losses import Loss, SquaredLoss, get_loss

logger = logging.getLogger(__name__)

__all__ = [
    "StepSchedule",
    "DoublyStochasticModel",
    "iterate_weights",
    "gp_posterior",
    "batch_pass",
    "run_epochs",
]

_WORK_ELEMENTS = 1 << 23  # feature-matrix elements per chunk in prediction (64 MiB in float64)


class StepSchedule:
    """Step sizes ``γ_t`` for t = 1, 2, ...

    - ``"inverse"``: ``γ_t = θ/t`` (the theory's schedule; O(1/t) needs ``θν ∈ (1, 2) ∪ Z₊``);
    - ``"inverse_scaling"``: ``γ_t = γ₀/(1 + γ₁ t)`` (the authors' MNIST code, γ₀ = 1, γ₁ = 1e-4);
    - ``"constant"``: ``γ_t = γ₀``.

    Parameters
    ----------
    kind : {"inverse", "inverse_scaling", "constant"}, default="inverse_scaling"
    eta0 : float, default=1.0
        θ for ``"inverse"``, γ₀ otherwise.
    decay : float, default=1e-3
        γ₁ of ``"inverse_scaling"``.

    Examples
    --------
    >>> StepSchedule("inverse", eta0=2.0)(4), StepSchedule("inverse_scaling", decay=1.0)(1)
    (0.5, 0.5)
    """

    KINDS = ("inverse", "inverse_scaling", "constant")

    def __init__(self, kind="inverse_scaling", *, eta0=1.0, decay=1e-3):
        if kind not in self.KINDS:
            raise ValueError(f"learning_rate must be one of {self.KINDS}, got {kind!r}.")
        if not (eta0 > 0 and math.isfinite(eta0)):
            raise ValueError(f"eta0 must be positive and finite, got {eta0!r}.")
        self.kind, self.eta0, self.decay = kind, float(eta0), float(decay)

    def __call__(self, t: int) -> float:
        if self.kind == "inverse":
            return self.eta0 / t
        if self.kind == "inverse_scaling":
            return self.eta0 / (1.0 + self.decay * t)
        return self.eta0

    def __repr__(self):
        return f"StepSchedule({self.kind!r}, eta0={self.eta0}, decay={self.decay})"


def iterate_weights(steps, nu: float) -> torch.Tensor:
    """Closed-form weights ``a_t^i = -γ_i Π_{j=i+1..t} (1 - γ_j ν)`` of Eq. 7 (shape (t,)).

    ``f_{t+1} = Σ_i a_t^i ζ_i``. With ``γ_j = θ/j`` and ``θν = 1`` every weight is ``-θ/t``.

    Examples
    --------
    >>> iterate_weights([2.0 / j for j in range(1, 5)], nu=0.5).tolist()
    [-0.5, -0.5, -0.5, -0.5]
    """
    g = torch.as_tensor(steps, dtype=torch.float64)
    shrink = 1.0 - g * nu
    # suffix products Π_{j>i} (1 - γ_j ν)
    tail = torch.ones_like(g)
    for i in range(len(g) - 2, -1, -1):
        tail[i] = tail[i + 1] * shrink[i + 1]
    return -g * tail


class DoublyStochasticModel:
    """Coefficients and training state of Algorithms 1 and 2.

    Parameters
    ----------
    kernel : Kernel
        A kernel with random features (:func:`kernelflow.features.random.sample_block`).
    n_input : int
        Input dimension d.
    n_outputs : int
        Columns C of ``f`` (targets, classes, or 1).
    loss : str or Loss, default="squared_error"
    alpha : float, default=1e-6
        Regularisation ν of ``(ν/2)|f|²_H``.
    schedule : StepSchedule, optional
        Default ``StepSchedule()``.
    block_size : int, default=256
        Random features r per block (each iteration adds one block).
    seed : int, default=0
        Stream seed; block j is drawn from ``(seed, j)``.
    max_blocks : int, optional
        After this many blocks, iteration t revisits block ``(t-1) mod max_blocks`` instead of
        drawing a new one (the authors' GPU code); memory is then capped.
    precondition : float, optional
        Relative ridge c of the block preconditioner ``H + (c·tr(H)/r + ν)I``,
        ``H = Φᵀ W Φ/Σw``; None disables it.
    average : bool or int, default=False
        Keep the averaged iterate, from iteration ``average`` on (True means 1).
    fit_intercept : bool, default=False
        Learn an unregularised offset b with the same steps (capped at 1).
    dtype, device : torch dtype and device of the computations.
    cache_bytes : int, default=256 MiB
        Block parameters kept in memory to avoid regenerating them (not part of the model).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(-2, 2, 64, dtype=torch.float64)[:, None]
    >>> Y = torch.sin(2 * X)
    >>> m = DoublyStochasticModel(Gaussian(0.5), 1, 1, block_size=32, seed=0, precondition=0.1)
    >>> for _ in range(20):
    ...     _ = m.step(X, Y)
    >>> err = float(((m.decision_function(X) - Y) ** 2).mean())
    >>> err < 1e-3
    True
    """

    def __init__(self, kernel, n_input, n_outputs, *, loss="squared_error", alpha=1e-6,
                 schedule=None, block_size=256, seed=0, max_blocks=None, precondition=None,
                 average=False, fit_intercept=False, dtype=torch.float64, device="cpu",
                 cache_bytes=256 << 20):
        self.kernel = kernel
        self.n_input = int(n_input)
        self.n_outputs = int(n_outputs)
        self.loss: Loss = get_loss(loss)
        self.alpha = float(alpha)
        self.schedule = schedule or StepSchedule()
        self.block_size = int(block_size)
        self.seed = int(seed)
        self.max_blocks = None if max_blocks is None else int(max_blocks)
        self.precondition = None if precondition is None else float(precondition)
        self.average = int(average) if not isinstance(average, bool) else int(average)
        self.fit_intercept = bool(fit_intercept)
        self.dtype = dtype
        self.device = torch.device(device)
        self.cache_bytes = int(cache_bytes)
        # validate the kernel/feature combination once
        sample_block(kernel, self.n_input, self.block_size, self.seed, 0)
        self.t = 0
        self.n_blocks = 0
        self.scale = 1.0
        self._coef = self._zeros(4)
        self.intercept = torch.zeros(self.n_outputs, dtype=dtype, device=self.device)
        self.offset = 0.0
        self.n_averaged = 0
        self._avg_coef = None
        self._avg_intercept = None
        self._avg_offset = 0.0
        self._cache = None
        self._n_cached = 0
        self._first_loss = None

    # ---- storage ------------------------------------------------------------------------------
    def _zeros(self, n_blocks):
        return torch.zeros(n_blocks, self.block_size, self.n_outputs, dtype=self.dtype,
                           device=self.device)

    def _ensure_capacity(self, n_blocks):
        cap = self._coef.shape[0]
        if n_blocks <= cap:
            return
        new = self._zeros(max(n_blocks, 2 * cap))
        new[:cap] = self._coef
        self._coef = new
        if self._avg_coef is not None:
            avg = self._zeros(new.shape[0])
            avg[:cap] = self._avg_coef
            self._avg_coef = avg

    @property
    def coef(self) -> torch.Tensor:  # (n_blocks * r, C)
        """Actual coefficients ``α`` (the lazy scale applied), block-major."""
        return (self._coef[: self.n_blocks] * self.scale).reshape(-1, self.n_outputs)

    @property
    def averaged_coef(self):
        if self._avg_coef is None:
            return None
        return self._avg_coef[: self.n_blocks].reshape(-1, self.n_outputs).clone()

    def _renormalise(self):
        self._coef[: self.n_blocks] *= self.scale
        self.scale = 1.0

    # ---- features -----------------------------------------------------------------------------
    def block(self, j: int) -> FeatureBlock:
        """Parameters of block j, from the cache or regenerated from ``(seed, j)``."""
        if j < self._n_cached:
            return self._cached_range(j, j + 1)
        fb = sample_block(self.kernel, self.n_input, self.block_size, self.seed, j)
        fb = fb.to(dtype=self.dtype, device=self.device)
        if j == self._n_cached and (j + 1) * fb.nbytes() <= self.cache_bytes:
            self._cache_append(fb)
        return fb

    def _cache_append(self, fb):
        # contiguous buffers (capacity doubling along the feature axis) so that any range of
        # cached blocks is a view, evaluated by one GEMM
        if self._cache is None:
            self._cache = {"kind": fb.kind, "norm": fb.norm, "scalars": {}, "bufs": {},
                           "width": {}}
            for k, v in fb.params.items():
                if v.ndim == 0:
                    self._cache["scalars"][k] = v
                else:
                    self._cache["width"][k] = v.shape[-1]
                    self._cache["bufs"][k] = v.new_empty(*v.shape[:-1], 4 * v.shape[-1])
        c = self._cache
        j = self._n_cached
        for k, buf in c["bufs"].items():
            w = c["width"][k]
            if (j + 1) * w > buf.shape[-1]:
                new = buf.new_empty(*buf.shape[:-1], 2 * buf.shape[-1])
                new[..., : j * w] = buf[..., : j * w]
                c["bufs"][k] = buf = new
            buf[..., j * w : (j + 1) * w] = fb.params[k]
        self._n_cached += 1

    def _cached_range(self, j0, j1):
        c = self._cache
        params = dict(c["scalars"])
        for k, buf in c["bufs"].items():
            w = c["width"][k]
            params[k] = buf[..., j0 * w : j1 * w]
        return FeatureBlock(c["kind"], (j1 - j0) * self.block_size, params, c["norm"], j1 - j0)

    def features(self, X, j):  # (n, d) -> (n, r)
        return self.block(j)(X)

    def _chunks(self, n_rows, stop):
        # groups of consecutive blocks whose feature matrix (n_rows x g r) fits the work budget
        g = max(1, _WORK_ELEMENTS // max(1, n_rows * self.block_size))
        for j0 in range(0, stop, g):
            j1 = min(stop, j0 + g)
            if j1 <= self._n_cached:
                yield j0, j1, self._cached_range(j0, j1)
            else:
                yield j0, j1, concat_blocks([self.block(j) for j in range(j0, j1)])

    def _predict_raw(self, X, coef_blocks, scale, intercept):
        n = X.shape[0]
        out = intercept.expand(n, -1).clone()
        if self.n_blocks == 0:
            return out
        rows = max(1, min(n, _WORK_ELEMENTS // self.block_size))
        for r0 in range(0, n, rows):
            Xr = X[r0 : r0 + rows]
            acc = torch.zeros(Xr.shape[0], self.n_outputs, dtype=self.dtype, device=self.device)
            for j0, j1, fb in self._chunks(Xr.shape[0], self.n_blocks):
                acc += fb.matmul(Xr, coef_blocks[j0:j1].reshape(-1, self.n_outputs))
            out[r0 : r0 + rows] += scale * acc
        return out

    def decision_function(self, X, *, averaged=False):  # (n, d) -> (n, C)
        """Algorithm 2 on every row of X, vectorised over regenerated blocks.

        Each block is regenerated once per chunk of rows. Cost O(n · t r · d).
        """
        X = X.to(dtype=self.dtype, device=self.device)
        if averaged and self._avg_coef is not None:
            return self._predict_raw(X, self._avg_coef, 1.0, self._avg_intercept)
        return self._predict_raw(X, self._coef, self.scale, self.intercept)

    @property
    def current_offset(self):
        return self._avg_offset if (self._avg_coef is not None and self.n_averaged) else self.offset

    # ---- one iteration ------------------------------------------------------------------------
    def step(self, X, Y, sample_weight=None) -> float:
        """One iteration of Algorithm 1 on the mini-batch (X, Y); returns its mean loss.

        ``Y`` has shape (b, C) (one-hot for the softmax loss, ±1 for binary losses, ignored by
        the novelty loss). The mean loss is computed with the coefficients before the step
        (progressive validation).
        """
        X = X.to(dtype=self.dtype, device=self.device)
        Y = Y.to(dtype=self.dtype, device=self.device)
        w = (torch.ones(X.shape[0], dtype=self.dtype, device=self.device) if sample_weight
             is None else sample_weight.to(dtype=self.dtype, device=self.device))
        self.t += 1
        gamma = self.schedule(self.t)
        j = self.n_blocks  # a new block, or the oldest one recycled beyond max_blocks
        if self.max_blocks is not None and self.n_blocks >= self.max_blocks:
            j = (self.t - 1) % self.max_blocks
        r, C = self.block_size, self.n_outputs
        sums = all_reduce_sum(self._batch_sums(X, Y, w, j))
        wsum = float(sums[r * C + C + 1])
        if wsum <= 0:
            self.t -= 1
            return float("nan")
        grad = sums[: r * C].reshape(r, C) / wsum
        gsum = sums[r * C : r * C + C] / wsum
        mean_loss = float(sums[r * C + C]) / wsum
        if self._first_loss is None:
            self._first_loss = max(mean_loss, 1e-8)
        elif not math.isfinite(mean_loss) or mean_loss > 1e10 * self._first_loss:
            # finite but exploding iterates: report instead of returning garbage
            raise DivergenceError(
                f"Doubly stochastic training diverged at iteration {self.t} (batch loss "
                f"{mean_loss:.3g} against {self._first_loss:.3g} at the start); lower eta0."
            )
        pos = r * C + C + 2
        if self.loss.has_offset:
            dtau = float(sums[pos : pos + C].mean()) / wsum
            pos += C
        if self.precondition is not None:
            H = sums[pos : pos + r * r].reshape(r, r) / wsum
            # the ridge is relative to the mean eigenvalue tr(H)/r: scale-free across kernels
            # and block sizes (an absolute ridge below the eigenvalues' sampling error lets the
            # batch fit extrapolate wildly)
            H.diagonal().add_(self.precondition * float(H.diagonal().mean()) + self.alpha)
            grad = torch.cholesky_solve(grad, torch.linalg.cholesky(H))
        factor = 1.0 - gamma * self.alpha
        if factor == 0.0:
            self._coef[: self.n_blocks].zero_()
            self.scale = 1.0
        else:
            self.scale *= factor
        new_block = j == self.n_blocks
        if new_block:
            self._ensure_capacity(self.n_blocks + 1)
            self.n_blocks += 1
        self._coef[j] += (-gamma / self.scale) * grad
        if abs(self.scale) < 1e-8:
            self._renormalise()
        if self.fit_intercept:
            self.intercept -= min(gamma, 1.0) * gsum
        if self.loss.has_offset:
            self.offset -= gamma * (dtau - self.alpha)
        self._update_average()
        return mean_loss

    def _batch_sums(self, X, Y, w, j: int) -> torch.Tensor:
        """Sums over this process's rows of the batch, to be all-reduced: the gradient of block
        ``j`` (r C), of the intercept (C), the loss, the weight, [the offset derivative (C)],
        [Phi^T W Phi (r^2) with the block preconditioner]."""
        r, C = self.block_size, self.n_outputs
        if X.shape[0] == 0:  # a data-parallel process holding no row of this global batch
            self.block(j)
            size = r * C + C + 2 + (C if self.loss.has_offset else 0) + (
                r * r if self.precondition is not None else 0)
            return torch.zeros(size, dtype=self.dtype, device=self.device)
        Y = Y.reshape(X.shape[0], -1)
        F = self.decision_function(X)
        if not torch.isfinite(F).all():
            raise DivergenceError(
                f"Doubly stochastic training diverged at iteration {self.t} (non-finite "
                "predictions); lower eta0 or use a decreasing learning rate."
            )
        target = torch.full_like(F, self.offset) if self.loss.has_offset else Y
        G = self.loss.derivative(F, target) * w[:, None]  # (b, C)
        fb = self.block(j)
        loss_sum = (self.loss.value(F, target) * w).sum()[None]
        parts = [fb.t_matmul(X, G).reshape(-1), G.sum(0), loss_sum, w.sum()[None]]
        if self.loss.has_offset:
            # a loss with an offset (the novelty loss) defines its derivative in the offset
            d_offset = cast(Any, self.loss).offset_derivative(F, target)
            parts.append(d_offset.mul(w[:, None]).sum(0))
        if self.precondition is not None:
            Phi = fb(X)  # (b, r)
            parts.append((Phi.T @ (Phi * w[:, None])).reshape(-1))
        return torch.cat(parts)

    def _update_average(self):
        if not self.average or self.t < self.average:
            return
        if self._avg_coef is None:
            self._avg_coef = self._zeros(self._coef.shape[0])
            self._avg_intercept = torch.zeros_like(self.intercept)
        self.n_averaged += 1
        k = 1.0 / self.n_averaged
        nb = self.n_blocks
        self._avg_coef[:nb].mul_(1 - k).add_(self._coef[:nb], alpha=k * self.scale)
        self._avg_intercept.mul_(1 - k).add_(self.intercept, alpha=k)
        self._avg_offset = (1 - k) * self._avg_offset + k * self.offset

    # ---- state --------------------------------------------------------------------------------
    def state(self) -> dict:
        """Plain-tensor state: coefficients (scale applied), counters, offsets."""
        out = {
            "coef": self.coef.clone(),
            "intercept": self.intercept.clone(),
            "offset": float(self.offset),
            "t": int(self.t),
            "n_blocks": int(self.n_blocks),
            "n_averaged": int(self.n_averaged),
        }
        if self._avg_coef is not None:
            out["averaged_coef"] = self.averaged_coef
            out["averaged_intercept"] = self._avg_intercept.clone()
            out["averaged_offset"] = float(self._avg_offset)
        return out

    def training_state(self) -> dict:
        """The exact training state (unscaled coefficients, lazy scale, counters) from which
        :meth:`load_training_state` continues with the steps this model would take."""
        nb = self.n_blocks
        avg = self._avg_coef
        return {"coef": self._coef[:nb].clone(), "capacity": int(self._coef.shape[0]),
                "scale": float(self.scale), "t": int(self.t), "n_blocks": int(nb),
                "intercept": self.intercept.clone(), "offset": float(self.offset),
                "n_averaged": int(self.n_averaged),
                "avg_coef": None if avg is None else avg[:nb].clone(),
                "avg_intercept": None if avg is None else self._avg_intercept.clone(),
                "avg_offset": float(self._avg_offset), "first_loss": self._first_loss}

    def load_training_state(self, state: dict) -> DoublyStochasticModel:
        """Put back a :meth:`training_state` (e.g. from a checkpoint)."""
        nb = int(state["n_blocks"])
        expected = (nb, self.block_size, self.n_outputs)
        if tuple(state["coef"].shape) != expected:
            raise ValueError(f"training state: coefficients of shape "
                             f"{tuple(state['coef'].shape)}, expected {expected}.")
        self._coef = self._zeros(max(int(state["capacity"]), nb))
        self._coef[:nb] = state["coef"].to(self._coef)
        self.scale, self.t, self.n_blocks = float(state["scale"]), int(state["t"]), nb
        self.intercept = state["intercept"].to(dtype=self.dtype, device=self.device).clone()
        self.offset = float(state["offset"])
        self.n_averaged = int(state["n_averaged"])
        self._avg_coef = self._avg_intercept = None
        if state["avg_coef"] is not None:
            self._avg_coef = self._zeros(self._coef.shape[0])
            self._avg_coef[:nb] = state["avg_coef"].to(self._coef)
            self._avg_intercept = state["avg_intercept"].to(self._coef).clone()
        self._avg_offset = float(state["avg_offset"])
        self._first_loss = state["first_loss"]
        return self

    def load_state(self, state: dict) -> DoublyStochasticModel:
        """Resume from :meth:`state` (e.g. for ``partial_fit`` or ``warm_start``)."""
        nb = int(state["n_blocks"])
        coef = state["coef"].to(dtype=self.dtype, device=self.device)
        if coef.shape != (nb * self.block_size, self.n_outputs):
            raise ValueError(
                f"Coefficient shape {tuple(coef.shape)} does not match {nb} blocks of "
                f"{self.block_size} features and {self.n_outputs} outputs."
            )
        self._coef = self._zeros(max(4, nb))
        self._coef[:nb] = coef.reshape(nb, self.block_size, self.n_outputs)
        self.scale = 1.0
        self.n_blocks, self.t = nb, int(state["t"])
        self.intercept = state["intercept"].to(dtype=self.dtype, device=self.device).clone()
        self.offset = float(state["offset"])
        self.n_averaged = int(state.get("n_averaged", 0))
        if "averaged_coef" in state and self.average:
            self._avg_coef = self._zeros(self._coef.shape[0])
            self._avg_coef[:nb] = state["averaged_coef"].to(self._coef).reshape(
                nb, self.block_size, self.n_outputs)
            self._avg_intercept = state["averaged_intercept"].to(self._coef).clone()
            self._avg_offset = float(state["averaged_offset"])
        return self


def gp_posterior(kernel, X, y, X_star, *, noise_variance, n_iter=200, batch_size=64,
                 block_size=512, seed=0, schedule=None, random_state=0, dtype=torch.float64):
    """Gaussian-process posterior mean and variance at ``X_star`` by doubly stochastic KRR.

    Mean: ``k*ᵀ(K + σ²I)^{-1}y`` is the minimiser of the expectation-form objective (Eq. 1) with
    the ½-square loss and ``ν = σ²/n`` (the digest's correction of the paper's ``ν = 2σ²``).
    Variance: the paper's method 2 (test points known in advance): for each test point fit
    ``f*_i = k(·)ᵀ(K + σ²I)^{-1} k*_i``, i.e. KRR with targets ``k(x_j, x*_i)`` and the same ν,
    then ``var_i = k(x*_i, x*_i) - f*_i(x*_i)``. All m regressions share one feature stream and
    run as one multi-output model. Cost O(T b (t̄ r d + m d)) time for T iterations, memory
    O(T r (m + 1)) coefficients.

    Parameters
    ----------
    kernel : Kernel
    X : Tensor of shape (n, d)
    y : Tensor of shape (n,)
    X_star : Tensor of shape (m, d)
    noise_variance : float
        σ² of the likelihood.
    n_iter, batch_size, block_size, seed : training controls.
    schedule : StepSchedule, optional
    random_state : int
        Seed of the mini-batch sampling.

    Returns
    -------
    mean : Tensor of shape (m,)
    var : Tensor of shape (m,)

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(-1, 1, 32, dtype=torch.float64)[:, None]
    >>> mean, var = gp_posterior(Gaussian(0.5), X, X[:, 0], X[:3], noise_variance=0.1,
    ...                          n_iter=20, block_size=64)
    >>> tuple(mean.shape), bool((var > -0.05).all())
    ((3,), True)
    """
    X = torch.as_tensor(X, dtype=dtype)
    X_star = torch.as_tensor(X_star, dtype=dtype)
    y = torch.as_tensor(y, dtype=dtype).reshape(-1, 1)
    n, m = X.shape[0], X_star.shape[0]
    nu = float(noise_variance) / n
    schedule = schedule or StepSchedule("inverse_scaling", eta0=1.0, decay=0.01)
    model = DoublyStochasticModel(kernel, X.shape[1], 1 + m, loss=SquaredLoss(), alpha=nu,
                                  schedule=schedule, block_size=block_size, seed=seed,
                                  average=True, dtype=dtype)
    gen = torch.Generator().manual_seed(int(random_state))
    for _ in range(n_iter):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        Xb = X[idx]
        Yb = torch.cat([y[idx], kernel(Xb, X_star)], dim=1)
        model.step(Xb, Yb)
    F = model.decision_function(X_star, averaged=True)
    mean = F[:, 0]
    var = kernel.diag(X_star) - F[:, 1:].diagonal()
    return mean, var


# ---- epochs: one loop for local rows and for a process's shard of the rows ----------------------
def batch_pass(model: DoublyStochasticModel, X, Y, sample_weight, order, batch_size: int, *,
               offset: int = 0, bar=None) -> float:
    """One pass of mini-batches of ``batch_size`` rows of the data set in ``order``.

    ``order`` holds global row positions (numpy ints); this process holds rows ``offset`` to
    ``offset + len(X)`` (all rows on one process: ``offset=0``) and contributes those of every
    batch, and :meth:`DoublyStochasticModel.step` all-reduces the batch sums, so processes given
    the same ``order`` take the same steps. ``bar`` (a progress bar) advances by the rows of
    every batch. Returns the mean progressive loss.
    """
    order = np.asarray(order)
    n_local = X.shape[0]
    total, count = 0.0, 0
    for i in range(0, len(order), batch_size):
        g = order[i:i + batch_size]
        keep = (g >= offset) & (g < offset + n_local)
        loc = torch.from_numpy(g[keep] - offset)
        w = None if sample_weight is None else sample_weight[loc]
        total += model.step(X[loc], Y[loc], w) * len(g)
        count += len(g)
        if bar is not None:
            bar.update(len(g))
    return total / max(count, 1)


def run_epochs(model: DoublyStochasticModel, X, Y, sample_weight, train, *, batch_size: int,
               epochs, rng: np.random.RandomState, shuffle: bool = True, tol=None,
               n_iter_no_change: int = 5, validation_loss=None, offset: int = 0,
               on_epoch=None, bar=None, checkpoint: Checkpoint | None = None):
    """Epochs of (shuffled) mini-batches over the rows ``train`` (global positions, numpy).

    ``epochs`` is an iterable of epoch numbers (for example a progress bar over
    ``range(max_iter)``). After each epoch the monitored loss is ``validation_loss()`` when
    given, else the epoch's training loss; with ``tol`` not None an
    :class:`~kernelflow.utils.monitor.EarlyStopping` stops after ``n_iter_no_change`` epochs
    without an improvement by ``tol``. ``on_epoch(training_loss, monitored_loss)`` sees every
    epoch. ``bar`` (a progress bar, :func:`kernelflow.utils.progress.progress`) advances by
    the rows of every batch. ``checkpoint`` (a :class:`~kernelflow.utils.checkpoint.Checkpoint`)
    receives the model's training state, the generator's state, the losses and the monitor
    after an epoch, every ``checkpoint.interval`` seconds; given one holding such a state the
    run skips the epochs it recorded (``on_epoch`` does not see them) and continues with the
    steps the interrupted run would have taken. Returns ``(n_epochs, training_losses,
    monitor)``, the recorded epochs included.

    Examples
    --------
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.linspace(-2, 2, 64, dtype=torch.float64)[:, None]
    >>> model = DoublyStochasticModel(Gaussian(0.5), 1, 1, block_size=32, seed=0, alpha=1e-6)
    >>> n, losses, _ = run_epochs(model, X, torch.sin(X), None, np.arange(64), batch_size=16,
    ...                           epochs=range(5), rng=np.random.RandomState(0))
    >>> n, bool(losses[-1] < losses[0])
    (5, True)
    """
    train = np.asarray(train)
    stop = None if tol is None else EarlyStopping(n_iter_no_change=n_iter_no_change,
                                                  tol=float(tol))
    losses: list[float] = []
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        model.load_training_state(saved["model"])
        rng.set_state(saved["rng"])
        losses = [float(v) for v in saved["losses"]]
        restore_monitor(stop, saved["monitor"])
    skip = len(losses)
    for epoch in epochs:
        if skip:
            skip -= 1
            continue
        order = train[rng.permutation(len(train))] if shuffle else train
        loss = float(batch_pass(model, X, Y, sample_weight, order, batch_size, offset=offset,
                                bar=bar))
        losses.append(loss)
        score = validation_loss() if validation_loss is not None else loss
        if on_epoch is not None:
            on_epoch(loss, score)
        if stop is not None and stop.update(epoch, score):
            break
        if checkpoint is not None:
            checkpoint.maybe_save(lambda: {
                "model": model.training_state(), "rng": rng.get_state(legacy=False),
                "losses": losses, "monitor": monitor_state(stop)})
    return len(losses), losses, stop
