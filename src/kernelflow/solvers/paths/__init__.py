"""Early-stopped kernel regression paths from alpha = 0: gradient, sign and coordinate descent.

All three minimise the kernel least-squares objective in its dual form (Allerbo, Eq. 5b with
lambda = 0), ``1/2 ||y - K alpha||^2_{K^-1} = 1/2 alpha^T K alpha - y^T alpha + const``, whose
gradient is ``K alpha - y = -r``. Starting from alpha_0 = 0 and stopping after k steps of size eta
(training time t = k eta) regularises like a penalty of strength 1/t:

* gradient descent (KGD, Eq. 8): ``alpha += eta r``; ridge-like;
* sign gradient descent (KSGD, Eq. 24): ``alpha += eta sign(r)``, sign(0) = 0; an l-infinity
  regulariser in alpha, least absolute deviations in feature space: robust;
* coordinate descent (KCD, forward stagewise): ``alpha_m += eta sign(r_m)`` for every m attaining
  ``max |r|``; an l1 regulariser in alpha: sparse.

The single-step functions (:func:`gradient_step`, :func:`momentum_step`, :func:`sign_step`,
:func:`coordinate_step`) act on the last dimension, so a batch ``(B, n)`` of independent problems
(folds x bandwidths) advances in one call. The path functions keep the residual up to date at the
cost of each method's actual change: one kernel column per coordinate step (O(n)), the rows of K
whose residual sign flipped per sign step, and for gradient descent every iterate from one
eigendecomposition, ``alpha_k = U diag((1 - (1 - eta s)^k) / s) U^T y``.
"""

from __future__ import annotations

from .. import _native
from ._common import (
    EXACT_EIGENVALUE_MAX_N,
    SPECTRAL_MAX_N,
    Callback,
    DivergenceError,
    PathResult,
    _check_eta,
    _out,
    _prepare,
)
from ._operator import batch_matmul, path_operator
from ._steps import (
    check_gradient_learning_rate,
    coordinate_direction,
    coordinate_learning_rate,
    coordinate_monotone_step,
    coordinate_step,
    gradient_learning_rate,
    gradient_step,
    largest_eigenvalue,
    momentum_step,
    sign_learning_rate,
    sign_monotone_step,
    sign_step,
)
from .single import (
    _native_path,
    coordinate_descent_path,
    gradient_descent_path,
    sign_gradient_path,
)
from .spectral import spectral_filter

__all__ = [
    "DivergenceError",
    "PathResult",
    "gradient_step",
    "momentum_step",
    "sign_step",
    "coordinate_direction",
    "coordinate_step",
    "largest_eigenvalue",
    "gradient_learning_rate",
    "sign_learning_rate",
    "coordinate_learning_rate",
    "check_gradient_learning_rate",
    "sign_monotone_step",
    "coordinate_monotone_step",
    "spectral_filter",
    "gradient_descent_path",
    "sign_gradient_path",
    "coordinate_descent_path",
]

_ = (_native, Callback, EXACT_EIGENVALUE_MAX_N, SPECTRAL_MAX_N, _check_eta, _native_path,
     _out, _prepare, batch_matmul, path_operator)  # re-exported for the modules built on the paths
