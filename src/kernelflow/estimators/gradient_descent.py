"""Kernel gradient descent with early stopping (KGD)."""

from __future__ import annotations

from numbers import Real

from sklearn.utils._param_validation import Interval, StrOptions

from ..solvers.paths.rules import GradientRule, PathRule
from ._base import PRECOMPUTED_KERNEL_CONSTRAINTS
from ._paths import PATH_CONSTRAINTS, PathRegressor, fit_path_estimator
from ._paths import _drop_zero_weights as _drop

__all__ = ["KernelGradientDescent", "PATH_CONSTRAINTS"]

class KernelGradientDescent(PathRegressor):
    """Kernel regression by gradient descent from alpha = 0, regularised by early stopping.

    Iterates alpha_{k+1} = alpha_k + eta (y - K alpha_k) (Allerbo, Eq. 8), gradient descent on
    1/2 ||y - K alpha||^2_{K^-1}; stopping at time t = k eta acts like kernel ridge regression
    with lambda = 1 / t (Prop. 4.1). Optional heavy-ball or Nesterov momentum gamma (Remark 4.2:
    the flow limit is gradient flow at time t / (1 - gamma)). With ``early_stopping`` the
    number of steps is chosen on a held-out ``validation_fraction`` of the rows (patience
    ``n_iter_no_change``), then the model is refit on all rows for that many steps.

    Cost: with K in memory and n <= 2000, one O(n^3) eigendecomposition gives every iterate in
    O(n^2) (alpha_k = U diag((1 - (1 - eta s)^k) / s) U^T y); otherwise one O(n^2) kernel
    product per step, matrix-free when K exceeds the memory budget.

    Parameters
    ----------
    learning_rate : float or "auto", default="auto"
        Step eta. "auto" is 1 / s_max(K); a float above 2 / s_max(K) (the bound of Prop. 5.3)
        raises ``DivergenceError``. The paper uses 0.01 (safe only for n <= 200 with unit-diagonal
        kernels).
    max_iter : int, default=1000
        Maximal number of steps (the stopping time when ``early_stopping=False``).
    tol : float, default=0.0
        With early stopping, the validation MSE must improve by more than ``tol`` to count as an
        improvement; without, the run stops once ||y - K alpha||_2 <= tol ||y||_2.
    early_stopping : bool, default=True
    validation_fraction : float, default=0.1
        Share of the (weighted) rows held out to choose the stopping time. Whole distinct
        inputs are held out, in a pseudo-random order seeded by ``random_state`` and fixed by
        the rows' values (:func:`~kernelflow.solvers.early_stopping.validation_weights`), so
        copies of a row never straddle the split and integer weights act as repeated rows.
    n_iter_no_change : int, default=100
        Patience of the validation monitor (the paper uses 100).
    validation_loss : {"squared", "absolute", "huber"}, default="squared"
        Loss monitored on the validation rows: weighted mean squared error (the paper's choice
        for every method), mean absolute error or Huber's loss (epsilon 1.345 x 1.4826 MAD of
        the validation targets), which gross outliers among the validation rows cannot
        dominate.
    momentum : float, default=0.0
        Momentum factor gamma in [0, 1).
    nesterov : bool, default=False
        Evaluate the gradient at the look-ahead point.
    method : {"auto", "spectral", "iterative"}, default="auto"
        See :func:`kernelflow.solvers.paths.gradient_descent_path`.
    random_state : int, RandomState instance or None, default=None
        Seed of the validation split.
    kernel : str or Kernel, default="rbf"
        A kernel name or object, or "precomputed": ``fit`` then takes the (n, n) training
        kernel matrix and ``predict`` the (n_test, n_train) kernel matrix.
    sigma, gamma, degree, coef0
        Kernel parameters (see :func:`kernelflow.kernels.make_kernel`); by default the median
        heuristic sets the bandwidth.
    fit_intercept : bool, default=True
        Centre y and add its mean to predictions (the paper's models have none).
    options : Options, default=None
        Engine options (memory budget, device, ...).
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
        Number of steps of the fitted model.
    learning_rate_ : float
    t_ : float
        Stopping time ``n_iter_ * learning_rate_`` (an inverse penalty).
    validation_losses_ : ndarray of shape (n_evaluated,) or None
        Validation MSE after each step of the validation run (index 0 is alpha = 0).
    validation_indices_ : ndarray of int64 or None
        Sorted positions (in the rows passed to ``fit``) of the rows held out to choose the
        stopping time, by the rule of :mod:`kernelflow.utils.holdout`; None without early
        stopping.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelGradientFlow : the continuous-time limit.
    KernelSignGradient : the robust (l-infinity) counterpart.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.gradient_descent import KernelGradientDescent
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(100, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(100)
    >>> model = KernelGradientDescent(sigma=1.0, random_state=0).fit(X, y)
    >>> round(model.score(X, y), 2)
    0.98
    >>> model.n_iter_ > 0  # chosen on the validation rows
    True
    """

    _parameter_constraints: dict = {
        **PATH_CONSTRAINTS,
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "nesterov": ["boolean"],
        "method": [StrOptions({"auto", "spectral", "iterative"})],
        **PRECOMPUTED_KERNEL_CONSTRAINTS,
    }
    _rule_class = GradientRule

    def __init__(self, learning_rate="auto", *, max_iter=1000, tol=0.0, early_stopping=True,
                 validation_fraction=0.1, n_iter_no_change=100, validation_loss="squared",
                 momentum=0.0, nesterov=False, method="auto", random_state=None, kernel="rbf",
                 sigma=None, gamma=None, degree=3, coef0=1.0, fit_intercept=True, options=None,
                 verbose=0, checkpoint=None, checkpoint_interval=60.0):
        super().__init__(
            learning_rate, max_iter=max_iter, tol=tol, early_stopping=early_stopping,
            validation_fraction=validation_fraction, n_iter_no_change=n_iter_no_change,
            validation_loss=validation_loss, random_state=random_state, kernel=kernel,
            sigma=sigma, gamma=gamma, degree=degree, coef0=coef0, fit_intercept=fit_intercept,
            options=options, verbose=verbose, checkpoint=checkpoint,
            checkpoint_interval=checkpoint_interval)
        self.momentum = momentum
        self.nesterov = nesterov
        self.method = method

    def _rule(self, y) -> PathRule:
        return GradientRule(self.momentum, self.nesterov)  # the rule holds the momentum

    def _path_kwargs(self) -> dict:
        return {"method": self.method}


def _fit_path_estimator(est, X, y, sample_weight=None):
    """The shared fit of the path estimators (:func:`._paths.fit_path_estimator`)."""
    return fit_path_estimator(est, X, y, sample_weight)


def _drop_zero_weights(X, y, sw):
    """Remove rows of zero weight and check the weights; returns (X, y, sw)."""
    return _drop(X, y, sw)[:3]
