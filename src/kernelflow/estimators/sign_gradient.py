"""Kernel sign gradient descent with early stopping (KSGD): robust kernel regression."""

from __future__ import annotations

from ..solvers.paths.rules import SignRule
from ._paths import PathRegressor

__all__ = ["KernelSignGradient"]


class KernelSignGradient(PathRegressor):
    """Robust kernel regression by sign gradient descent from alpha = 0 with early stopping.

    Iterates alpha_{k+1} = alpha_k + eta sign(y - K alpha_k), sign(0) = 0 (Allerbo, Eq. 24).
    Every coefficient moves by exactly 0 or eta per step, so ||alpha_k||_inf <= k eta: the path
    approximates l-infinity-penalised kernel regression (Kl-inf R, Prop. 5.1), and in feature
    space it is gradient descent on the absolute loss ||y - Phi beta||_1 (Prop. 5.2), which
    makes it robust to outlying responses. With ``early_stopping`` the number of steps is chosen
    on a held-out ``validation_fraction`` of the rows (patience ``n_iter_no_change``), then the
    model is refit on all rows for that many steps.

    Cost: O(n^2) once for K sign(y), then per step O(n) plus O(n) for every residual whose sign
    flipped (the rows of K that change K sign(r)); matrix-free when K exceeds the memory budget.

    Parameters
    ----------
    learning_rate : float or "auto", default="auto"
        Step eta; sign descent cannot diverge, eta only sets the resolution of the path. "auto"
        is 0.01 rms(y) / s_max(K), so one step moves the fitted values by at most 1% of ||y||_2;
        the paper uses 0.01.
    max_iter : int, default=10000
        Maximal number of steps (the stopping time when ``early_stopping=False``).
    tol : float, default=0.0
        With early stopping, the validation MSE must improve by more than ``tol``; without, the
        run stops once ||y - K alpha||_2 <= tol ||y||_2.
    early_stopping : bool, default=True
    validation_fraction : float, default=0.1
        Share of the (weighted) rows held out to choose the stopping time. Whole distinct
        inputs are held out, in a pseudo-random order seeded by ``random_state`` and fixed by
        the rows' values (:func:`~kernelflow.solvers.early_stopping.validation_weights`), so
        copies of a row never straddle the split and integer weights act as repeated rows.
    n_iter_no_change : int, default=100
        Patience of the validation monitor (the paper uses 100).
    validation_loss : {"huber", "absolute", "squared"}, default="huber"
        Loss monitored on the validation rows: Huber's loss (epsilon 1.345 x 1.4826 MAD of
        the validation targets), which gross outliers among the validation rows cannot
        dominate, the mean absolute error, or the mean squared error (the paper's choice; use
        it with ``learning_rate=0.01`` and ``fit_intercept=False`` to reproduce the paper's
        protocol).
    random_state : int, RandomState instance or None, default=None
        Seed of the validation split.
    kernel : str or Kernel, default="rbf"
        A kernel name or object, or "precomputed": ``fit`` then takes the (n, n) training
        kernel matrix and ``predict`` the (n_test, n_train) kernel matrix.
    sigma, gamma, degree, coef0
        Kernel parameters (see :func:`kernelflow.kernels.make_kernel`).
    fit_intercept : bool, default=True
        Centre y (mean) and add it back to predictions.
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
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel or "precomputed"
    n_iter_ : int
    learning_rate_ : float
    t_ : float
        Stopping time ``n_iter_ * learning_rate_``, the l-infinity radius bound of dual_coef_.
    validation_losses_ : ndarray or None
    validation_indices_ : ndarray of int64 or None
        Sorted positions (in the rows passed to ``fit``) of the rows held out to choose the
        stopping time, by the rule of :mod:`kernelflow.utils.holdout`; None without early
        stopping.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    PenalizedKernelRegressor : the explicit l-infinity penalty (penalty="linf").
    KernelGradientDescent : the ridge-like counterpart.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.sign_gradient import KernelSignGradient
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(100, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.standard_cauchy(100)  # heavy-tailed noise
    >>> model = KernelSignGradient(sigma=1.0, random_state=0).fit(X, y)
    >>> bool(np.abs(model.predict(X) - np.sin(X[:, 0])).mean() < 0.1)
    True
    """

    _rule_class = SignRule

    def __init__(self, learning_rate="auto", *, max_iter=10000, tol=0.0, early_stopping=True,
                 validation_fraction=0.1, n_iter_no_change=100, validation_loss="huber",
                 random_state=None, kernel="rbf", sigma=None, gamma=None, degree=3, coef0=1.0,
                 fit_intercept=True, options=None, verbose=0,
                 checkpoint=None, checkpoint_interval=60.0):
        super().__init__(
            learning_rate, max_iter=max_iter, tol=tol, early_stopping=early_stopping,
            validation_fraction=validation_fraction, n_iter_no_change=n_iter_no_change,
            validation_loss=validation_loss, random_state=random_state, kernel=kernel,
            sigma=sigma, gamma=gamma, degree=degree, coef0=coef0, fit_intercept=fit_intercept,
            options=options, verbose=verbose, checkpoint=checkpoint,
            checkpoint_interval=checkpoint_interval)
