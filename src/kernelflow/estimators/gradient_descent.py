"""Kernel gradient descent with early stopping (KGD)."""

from __future__ import annotations

from numbers import Integral, Real

from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..solvers.early_stopping import fit_path
from ..solvers.paths import gradient_descent_path
from ..typing import ArrayLike, Output
from ..utils._validation import check_X_y
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin

__all__ = ["KernelGradientDescent"]

#: Constraints shared by the three path estimators.
PATH_CONSTRAINTS = {
    "learning_rate": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
    "max_iter": [Interval(Integral, 0, None, closed="left")],
    "tol": [Interval(Real, 0, None, closed="left")],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "validation_loss": [StrOptions({"squared", "absolute"})],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
}


class KernelGradientDescent(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
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
    validation_loss : {"squared", "absolute"}, default="squared"
        Loss monitored on the validation rows: weighted mean squared error (the paper's choice
        for every method) or mean absolute error, which gross outliers among the validation
        rows cannot dominate.
    momentum : float, default=0.0
        Momentum factor gamma in [0, 1).
    nesterov : bool, default=False
        Evaluate the gradient at the look-ahead point.
    method : {"auto", "spectral", "iterative"}, default="auto"
        See :func:`kernelflow.solvers.paths.gradient_descent_path`.
    random_state : int, RandomState instance or None, default=None
        Seed of the validation split.
    kernel : str or Kernel, default="rbf"
    sigma, gamma, degree, coef0
        Kernel parameters (see :func:`kernelflow.kernels.make_kernel`); by default the median
        heuristic sets the bandwidth.
    fit_intercept : bool, default=True
        Centre y and add its mean to predictions (the paper's models have none).
    options : Options, default=None
        Engine options (memory budget, device, ...).
    verbose : int, default=0

    Attributes
    ----------
    dual_coef_ : tensor of shape (n_samples,) or (n_samples, n_targets)
    intercept_ : tensor of shape () or (n_targets,)
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel
    n_iter_ : int
        Number of steps of the fitted model.
    learning_rate_ : float
    t_ : float
        Stopping time ``n_iter_ * learning_rate_`` (an inverse penalty).
    validation_losses_ : ndarray of shape (n_evaluated,) or None
        Validation MSE after each step of the validation run (index 0 is alpha = 0).
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
        **KERNEL_CONSTRAINTS,
    }

    def __init__(self, learning_rate="auto", *, max_iter=1000, tol=0.0, early_stopping=True,
                 validation_fraction=0.1, n_iter_no_change=100, validation_loss="squared",
                 momentum=0.0, nesterov=False, method="auto", random_state=None, kernel="rbf",
                 sigma=None, gamma=None, degree=3, coef0=1.0, fit_intercept=True, options=None,
                 verbose=0):
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.validation_loss = validation_loss
        self.momentum = momentum
        self.nesterov = nesterov
        self.method = method
        self.random_state = random_state
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.options = options
        self.verbose = verbose

    def _path_kwargs(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov, "method": self.method}

    _path_function = staticmethod(gradient_descent_path)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None):
        """Fit the model.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights w; the update becomes alpha += eta W (y - K alpha), i.e.
            gradient descent on 1/2 ||W^1/2 y - M beta||^2_{M^-1} with M = W^1/2 K W^1/2 and
            alpha = W^1/2 beta (an integer weight equals repeating the row; rows of weight 0
            are dropped). The validation split and loss are weighted too.

        Returns
        -------
        self : object
        """
        return _fit_path_estimator(self, X, y, sample_weight)

    def predict(self, X: ArrayLike) -> Output:
        """Predict f(x) = k(x, X_fit) dual_coef + intercept.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        return self._kernel_predict(X)


def _drop_zero_weights(X, y, sw):
    """Remove rows of zero weight (they must act as absent rows); check the weights."""
    if sw is None:
        return X, y, None
    if bool((sw < 0).any()):
        raise ValueError("sample_weight must be non-negative.")
    keep = sw > 0
    if not bool(keep.any()):
        raise ValueError("sample_weight must have at least one positive entry.")
    if bool(keep.all()):
        return X, y, sw
    return X[keep], y[keep], sw[keep]


def _fit_path_estimator(est, X, y, sample_weight=None):
    """Shared fit of the path estimators: validate, centre, run :func:`fit_path`, store.

    Rows of zero weight are removed before anything else (so ``X_fit_`` holds the rows with a
    positive weight); the remaining weights scale each row's update (see :func:`~kernelflow.
    solvers.early_stopping.weighted_path`), the intercept is the weighted mean, and the
    validation split and the monitored loss are weighted.
    """
    X, y, sw, _ = check_X_y(est, X, y, sample_weight=sample_weight)
    X, y, sw = _drop_zero_weights(X, y, sw)
    est.kernel_ = est._build_kernel(X)
    yc, est.intercept_ = est._center_targets(y, sw)
    fit = fit_path(
        est._path_function, est.kernel_, X, yc, learning_rate=est.learning_rate,
        max_iter=est.max_iter, early_stopping=est.early_stopping,
        validation_fraction=est.validation_fraction, n_iter_no_change=est.n_iter_no_change,
        tol=est.tol, random_state=est.random_state, options=est._options(),
        verbose=est.verbose, sample_weight=sw, validation_loss=est.validation_loss,
        **est._path_kwargs(),
    )
    est.X_fit_ = X
    est.dual_coef_ = fit.alpha
    est.n_iter_ = int(fit.n_iter)
    est.learning_rate_ = float(fit.learning_rate)
    est.t_ = est.n_iter_ * est.learning_rate_
    es = fit.early_stopping
    est.validation_losses_ = None if es is None else es.validation_losses.numpy()
    return est
