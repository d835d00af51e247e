"""Early-stopped kernel regression on the Huber loss, and its path-CV variant."""

from __future__ import annotations

from numbers import Real

import torch
from sklearn.utils._param_validation import Interval, StrOptions

from ..solvers.paths.rules import HuberRule
from ._base import PRECOMPUTED_KERNEL_CONSTRAINTS
from ._paths import CV_CONSTRAINTS, PATH_CONSTRAINTS, PathCVRegressor, PathRegressor

__all__ = ["KernelHuberGradientDescent", "KernelHuberGradientDescentCV"]

_EPSILON = {"epsilon": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})]}


def _weighted_median(y: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """Column-wise (weighted) lower median of y (n,) or (n, t)."""
    Y = y.reshape(y.shape[0], -1)
    if w is None:
        return Y.quantile(0.5, dim=0).reshape(y.shape[1:])
    order = torch.argsort(Y, dim=0)
    cw = torch.cumsum(w.to(Y.dtype)[order], dim=0)
    pos = torch.searchsorted(cw.T.contiguous(), (0.5 * cw[-1]).reshape(-1, 1)).reshape(-1)
    rows = order.gather(0, pos.clamp_max(Y.shape[0] - 1).reshape(1, -1))[0]
    return Y.gather(0, rows.reshape(1, -1))[0].reshape(y.shape[1:])


def _rule(est, y: torch.Tensor) -> HuberRule:
    """The Huber rule of ``est`` for the targets ``y`` (kept for :func:`_store_epsilon`); the
    ``_rule`` method of both estimators."""
    est._yc = y
    est._huber_rule = HuberRule(None if est.epsilon == "auto" else float(est.epsilon))
    return est._huber_rule


def _store_epsilon(est) -> None:
    eps = est._huber_rule.last_epsilon
    if eps is None:  # no step taken: the threshold at alpha = 0
        eps = est._huber_rule.threshold(est._yc.reshape(est._yc.shape[0], -1).T)
    est.epsilon_ = float(torch.as_tensor(eps).max())
    del est._huber_rule, est._yc


class KernelHuberGradientDescent(PathRegressor):
    """Robust kernel regression by gradient descent on the Huber loss, with early stopping.

    Iterates alpha_{k+1} = alpha_k + eta psi(y - K alpha_k) from alpha = 0, with
    psi(r) = clip(r, -epsilon, epsilon) the derivative of Huber's loss: the functional gradient
    step f <- f + eta K psi(y - f) on sum_i huber(y_i - f(x_i)). Small residuals pull as in
    kernel gradient descent (:class:`KernelGradientDescent`, recovered when epsilon exceeds
    every residual), residuals beyond epsilon with a bounded force, so gross outliers barely
    move the fit. The number of steps is chosen on held-out rows (``validation_fraction``,
    patience ``n_iter_no_change``, Huber validation loss by default) and the model is refit on
    all rows. Cost: one O(n^2) product with K per step.

    Parameters
    ----------
    learning_rate : float or "auto", default="auto"
        Step eta; "auto" is 1 / s_max(K), a float above 2 / s_max(K) raises
        ``DivergenceError``.
    epsilon : float or "auto", default="auto"
        Huber threshold. "auto" re-estimates it at every step as 1.345 x 1.4826 MAD of the
        current residuals (Huber's 95 %-efficiency constant times a robust scale): it starts
        at the scale of the signal and shrinks to the noise level as the path fits.
    max_iter : int, default=1000
    tol : float, default=0.0
        Required improvement of the validation loss (with early stopping), else relative
        training residual at which to stop.
    early_stopping : bool, default=True
    validation_fraction : float, default=0.1
        Share of the rows held out by the project's holdout rule
        (:mod:`kernelflow.utils.holdout`).
    n_iter_no_change : int, default=100
    validation_loss : {"huber", "absolute", "squared"}, default="huber"
        Loss monitored on the validation rows.
    random_state : int, RandomState instance or None, default=None
    kernel : str or Kernel, default="rbf"
        A kernel name or object, or "precomputed": ``fit`` then takes the (n, n) training
        kernel matrix and ``predict`` the (n_test, n_train) kernel matrix.
    sigma, gamma, degree, coef0
        Kernel parameters (see :func:`kernelflow.kernels.make_kernel`).
    fit_intercept : bool, default=True
        Centre y by its (weighted) median and add it back to predictions.
    options : Options, default=None
    verbose : int, default=0
    checkpoint : str or path-like, default=None
        File where the state of a matrix-free fit (the kernel matrix beyond the memory budget
        of ``options``: one kernel product per step) is written every
        ``checkpoint_interval`` seconds: the running loop (iterate, previous iterate, running
        products, step count), the validation monitor and the best iterate so far. A fit
        given a path holding a checkpoint of the same problem (data, parameters, validation
        rows) continues from it and ends with the model of an uninterrupted fit; one of
        another problem is refused. A fit on a stored kernel matrix (seconds) neither reads
        nor writes it. Removed when the fit completes. With early stopping, needs an integer
        ``random_state`` (else the validation rows are drawn anew by every fit).
    checkpoint_interval : float, default=60
        Least number of seconds between two checkpoint writes (0: after every step).

    Attributes
    ----------
    dual_coef_ : tensor of shape (n_samples,) or (n_samples, n_targets)
    intercept_ : tensor of shape () or (n_targets,)
    epsilon_ : float
        Huber threshold of the last step of the refit.
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel or "precomputed"
    n_iter_ : int
    learning_rate_ : float
    t_ : float
    validation_losses_ : ndarray or None
    validation_indices_ : ndarray of int64 or None
        Positions of the held-out rows.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.huber_path import KernelHuberGradientDescent
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(100, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(100)
    >>> y[::10] += 5.0  # gross outliers
    >>> model = KernelHuberGradientDescent(sigma=1.0, random_state=0).fit(X, y)
    >>> bool(np.abs(model.predict(X) - np.sin(X[:, 0])).mean() < 0.15)
    True
    """

    _parameter_constraints: dict = {**PATH_CONSTRAINTS, **_EPSILON,
                                    **PRECOMPUTED_KERNEL_CONSTRAINTS}

    def __init__(self, learning_rate="auto", *, epsilon="auto", max_iter=1000, tol=0.0,
                 early_stopping=True, validation_fraction=0.1, n_iter_no_change=100,
                 validation_loss="huber", random_state=None, kernel="rbf", sigma=None,
                 gamma=None, degree=3, coef0=1.0, fit_intercept=True, options=None, verbose=0,
                 checkpoint=None, checkpoint_interval=60.0):
        super().__init__(
            learning_rate, max_iter=max_iter, tol=tol, early_stopping=early_stopping,
            validation_fraction=validation_fraction, n_iter_no_change=n_iter_no_change,
            validation_loss=validation_loss, random_state=random_state, kernel=kernel,
            sigma=sigma, gamma=gamma, degree=degree, coef0=coef0, fit_intercept=fit_intercept,
            options=options, verbose=verbose, checkpoint=checkpoint,
            checkpoint_interval=checkpoint_interval)
        self.epsilon = epsilon

    _rule = _rule

    def _after_fit(self):
        _store_epsilon(self)

    def _center_targets(self, y, sample_weight):
        if not self.fit_intercept:
            return y, torch.zeros(y.shape[1:], dtype=y.dtype, device=y.device)
        med = _weighted_median(y, sample_weight)
        return y - med, med


class KernelHuberGradientDescentCV(PathCVRegressor):
    """Huber-loss kernel gradient descent with bandwidth and stopping time by path CV.

    Every (bandwidth, fold) problem of a ``cv``-fold split runs
    alpha <- alpha + eta clip(y - K alpha, -epsilon, epsilon) from alpha = 0 (see
    :class:`KernelHuberGradientDescent`) with the automatic step 1 / s_max(K) of its bandwidth,
    scoring ``validation_loss`` on the fold's held-out rows after every step and stopping after
    ``n_iter_no_change`` steps without improvement; all problems advance as one batched
    computation (:func:`kernelflow.solvers.path_cv.early_stopping_path_cv`). The bandwidth with
    the smallest mean best validation loss wins, the stopping time is int(mean over folds of the
    best iteration) and the model is refit on all rows.

    Parameters
    ----------
    sigmas : int or array-like of shape (n_sigmas,), default=30
        Bandwidth grid, or its size (log-spaced median * [1e-2, 1e2]).
    kernel : str or Kernel, default="rbf"
        A kernel name or object, or "precomputed": ``fit`` then takes the (n, n) training
        kernel matrix and ``predict`` the (n_test, n_train) kernel matrix;
        only the stopping time is cross-validated (``sigma_`` is None).
    cv : int or list of array-like, default=10
    learning_rate : float or "auto", default="auto"
        Step; "auto" is 1 / s_max(K) per bandwidth.
    epsilon : float or "auto", default="auto"
        Huber threshold; "auto" is 1.345 x 1.4826 MAD of the current training residuals of
        each problem, re-estimated at every step.
    max_iter : int, default=10000
    n_iter_no_change : int, default=100
    validation_loss : {"huber", "absolute", "squared"}, default="huber"
    fit_intercept : bool, default=True
        Centre y by its median.
    random_state : int, RandomState or None, default=None
        Seed of the fold permutation.
    options : Options, default=None
    verbose : int, default=0
    distributed : {"auto", "on", "off"} or bool, default="auto"
        As in :class:`~kernelflow.estimators.KernelSignGradientCV`.

    Attributes
    ----------
    sigma_ : float
    n_iter_ : int
    learning_rate_ : float
    t_ : float
    epsilon_ : float
    sigmas_ : ndarray of shape (n_sigmas,)
    cv_mse_ : ndarray of shape (n_sigmas,)
        Mean over folds of the best validation loss.
    best_iter_ : ndarray of shape (n_sigmas, n_folds)
    dual_coef_ : tensor of shape (n_samples,)
    intercept_ : tensor of shape ()
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel or "precomputed"
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.huber_path import KernelHuberGradientDescentCV
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(60, 1))
    >>> y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(60)
    >>> model = KernelHuberGradientDescentCV(sigmas=[0.05, 0.5, 5.0], cv=5, max_iter=2000,
    ...     random_state=0).fit(X, y)
    >>> model.sigma_, round(model.score(X, y), 1)
    (0.5, 1.0)
    """

    _parameter_constraints: dict = {**CV_CONSTRAINTS, **_EPSILON, **PRECOMPUTED_KERNEL_CONSTRAINTS}

    def __init__(self, sigmas=30, *, kernel="rbf", cv=10, learning_rate="auto", epsilon="auto",
                 max_iter=10000, n_iter_no_change=100, validation_loss="huber",
                 fit_intercept=True, random_state=None, options=None, verbose=0,
                 distributed="auto"):
        super().__init__(sigmas, kernel=kernel, cv=cv, learning_rate=learning_rate,
                         max_iter=max_iter, n_iter_no_change=n_iter_no_change,
                         validation_loss=validation_loss, fit_intercept=fit_intercept,
                         random_state=random_state, options=options, verbose=verbose,
                         distributed=distributed)
        self.epsilon = epsilon

    _rule = _rule

    def _after_refit(self, path):
        _store_epsilon(self)

    def _location(self, y):
        return torch.quantile(y, 0.5)
