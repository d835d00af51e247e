"""Exact kernel ridge regression."""

from __future__ import annotations

from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..linalg import NearSingularKernelWarning
from ..solvers.direct import krr_cholesky, krr_lstsq, krr_spectral, spectrum
from ..solvers.hyperparameters import EXACT_CRITERIA
from ..utils._finite import NotPositiveDefiniteError
from ..utils._validation import check_X_y
from ..utils._warnings import warn_caller
from ._base import PRECOMPUTED_KERNEL_CONSTRAINTS, KernelEstimatorMixin, check_precomputed
from ._hyperparameters import (
    OPTIMIZER_CONSTRAINTS,
    check_optimizer,
    learn_for_estimator,
    set_unit_signal_variance,
)
from ._uncertainty import exact_log_marginal_likelihood, exact_predict

__all__ = ["KernelRidge"]


def _precomputed_solve(K, y, alpha, sample_weight):
    """Cholesky on a user's kernel matrix; least squares (with a warning) when it is not
    positive definite, as scikit-learn's ``KernelRidge`` does."""
    try:
        return krr_cholesky(K.clone(), y, alpha, sample_weight=sample_weight, overwrite_k=True)
    except NotPositiveDefiniteError:
        warn_caller("The precomputed kernel matrix plus the penalty is not positive "
                      "definite; using the least-squares solution instead.",
                      NearSingularKernelWarning)
        return krr_lstsq(K, y, alpha, sample_weight=sample_weight)


class KernelRidge(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Exact kernel ridge regression.

    Solves alpha = (K + alpha_pen W^{-1})^{-1} (y - intercept) (Allerbo Eq. 1-2; scikit-learn's
    ``KernelRidge`` convention for the penalty and for sample weights) and predicts
    f(x) = k(x, X) alpha + intercept. The factorisation is a Cholesky decomposition with jitter
    escalation (a ``NearSingularKernelWarning`` is issued if the kernel matrix is numerically
    singular, e.g. with duplicate rows and ``alpha=0``), or an eigendecomposition.

    Cost: O(n^3 / 3) time and O(n^2) memory to fit; O(n m d) to predict m points.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Ridge penalty lambda >= 0.
    kernel : str or Kernel, default="rbf"
        Kernel name (see :data:`kernelflow.kernels.KERNEL_NAMES`) or object, or
        ``"precomputed"``: ``fit`` then takes the training kernel matrix K of shape
        (n_samples, n_samples) as X and ``predict`` the kernel between the test and the
        training points, of shape (n_test, n_samples), as scikit-learn's estimators do.
    sigma : float, array-like of shape (n_features,) or "ard", default=None
        Bandwidth (see :mod:`kernelflow.kernels`), or one per feature; with ``gamma`` also
        None, the median heuristic on the training inputs ("ard": that value per feature).
    gamma : float, default=None
        scikit-learn's bandwidth parameter, converted to ``sigma``.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Constant of the polynomial kernel.
    fit_intercept : bool, default=True
        Centre y (weighted mean) before solving and add the mean back when predicting. The
        papers' models have no intercept; set False to reproduce them or scikit-learn.
    solver : {"auto", "cholesky", "eigen"}, default="auto"
        "auto" is Cholesky.
    options : Options, default=None
        Engine options (memory budget, device, ...).
    learn_hyperparameters : {"marginal_likelihood", "loo", "gcv"} or None, default=None
        Learn the bandwidth(s) and the penalty (``alpha`` and ``sigma`` are the starting
        point) by minimising this criterion with L-BFGS, see
        :func:`kernelflow.hyperparameters.learn_hyperparameters`. Cost O(n^3) per step. The
        Gaussian-process signal variance (learned with ``"marginal_likelihood"``, its
        maximum-likelihood value at the learned kernel and penalty otherwise) and the noise
        variance are then used by ``predict(return_std=True)`` and
        ``log_marginal_likelihood()``.
    n_restarts_optimizer : int, default=0
        Further L-BFGS runs of ``learn_hyperparameters`` from random starts, as in
        scikit-learn's ``GaussianProcessRegressor``: each parameter log-uniform within a
        factor of 10 of the best screened start (clipped to its bounds), seeded by
        ``random_state``; the best run wins.
    sigma_bounds : (float, float), default=(1e-3, 1e3)
        Bounds of the learned bandwidths, relative to the median-heuristic bandwidth of the
        training inputs.
    alpha_bounds : (float, float), default=(1e-6, 1e3)
        Bounds of the learned penalty (the noise variance relative to the signal variance).
    random_state : int, RandomState instance or None, default=None
        Seeds the random restarts (None: a fixed seed).
    verbose : int, default=0
        > 0 shows progress over the evaluations of the ``learn_hyperparameters`` criterion, in
        a terminal or a notebook (:func:`kernelflow.utils.progress.progress`); the plain
        solve has nothing to report.

    Attributes
    ----------
    dual_coef_ : tensor of shape (n_samples,) or (n_samples, n_targets)
    intercept_ : tensor of shape () or (n_targets,)
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel or "precomputed"
        The kernel with its resolved (or learned) bandwidth.
    sigma_, alpha_, hyperparameters_ : float or ndarray, float, HyperparameterResult
        Learned bandwidth(s), penalty and optimisation record (only with
        ``learn_hyperparameters``).
    signal_variance_ : float or ndarray of shape (n_targets,)
        Gaussian-process signal variance s^2: the prior is s^2 k (1 without
        ``learn_hyperparameters``).
    noise_variance_ : float or ndarray of shape (n_targets,)
        Noise variance s^2 ``alpha_`` (``alpha`` without ``learn_hyperparameters``).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelRidgeCV : penalty and bandwidth by exact leave-one-out.
    KernelGradientFlow : the early-stopping counterpart (t = 1 / alpha).

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators import KernelRidge
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(100, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(100)
    >>> model = KernelRidge(alpha=0.1, sigma=1.0).fit(X, y)
    >>> round(model.score(X, y), 2)
    0.98

    With a precomputed kernel matrix:

    >>> from kernelflow.kernels import Gaussian
    >>> import torch
    >>> Xt = torch.from_numpy(X)
    >>> K = Gaussian(1.0)(Xt, Xt).numpy()
    >>> pre = KernelRidge(alpha=0.1, kernel="precomputed").fit(K, y)
    >>> bool(np.allclose(pre.predict(K[:5]), model.predict(X[:5])))
    True
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left"), "array-like"],
        "solver": [StrOptions({"auto", "cholesky", "eigen"})],
        "learn_hyperparameters": [StrOptions(set(EXACT_CRITERIA)), None],
        **OPTIMIZER_CONSTRAINTS,
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        **PRECOMPUTED_KERNEL_CONSTRAINTS,
    }
    _accepts_precomputed = True

    def __init__(self, alpha=1.0, *, kernel="rbf", sigma=None, gamma=None, degree=3, coef0=1.0,
                 fit_intercept=True, solver="auto", options=None, learn_hyperparameters=None,
                 n_restarts_optimizer=0, sigma_bounds=(1e-3, 1e3), alpha_bounds=(1e-6, 1e3),
                 random_state=None, verbose=0):
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.options = options
        self.learn_hyperparameters = learn_hyperparameters
        self.n_restarts_optimizer = n_restarts_optimizer
        self.sigma_bounds = sigma_bounds
        self.alpha_bounds = alpha_bounds
        self.random_state = random_state
        self.verbose = verbose

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        precomputed = self._precomputed()
        if precomputed and self.learn_hyperparameters is not None:
            raise ValueError("learn_hyperparameters needs the kernel function; it is not "
                             "available with kernel='precomputed'.")
        check_optimizer(self)
        X, y, sw, _ = check_X_y(self, X, y, sample_weight=sample_weight)
        if precomputed:
            check_precomputed(self, X, fit=True)
        alpha = np.asarray(self.alpha, dtype=np.float64)
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
            raise ValueError(f"alpha must be non-negative and finite, got {self.alpha!r}.")
        n_targets = 1 if y.ndim == 1 else y.shape[1]
        if alpha.size not in (1, n_targets):
            raise ValueError(f"alpha has {alpha.size} values but y has {n_targets} targets.")
        self.kernel_ = self._build_kernel(X, sw)
        yc, self.intercept_ = self._center_targets(y, sw)
        for name in ("sigma_", "alpha_", "hyperparameters_"):  # a previous fit's
            self.__dict__.pop(name, None)
        if self.learn_hyperparameters is not None:
            # sets sigma_, alpha_, signal_variance_, noise_variance_, hyperparameters_
            self.kernel_, alpha = learn_for_estimator(self, X, yc, sw, alpha, self.kernel_)
            alpha = np.asarray(alpha)
        else:
            set_unit_signal_variance(self, alpha)
        self.X_fit_ = X
        self._fit_sample_weight = sw  # for the predictive variance
        op = self._operator(X)
        if not op.fits_in_memory(copies=2):
            raise MemoryError(
                f"Exact kernel ridge regression with n = {X.shape[0]} needs two dense "
                f"{X.shape[0]} x {X.shape[0]} matrices, above the memory budget; use "
                "NystromKernelRidge instead."
            )
        # the solvers factorise in place: never the user's own matrix
        K = X if precomputed else op.to_dense()
        if self.solver == "eigen" and alpha.size == 1:
            s, U = spectrum(K, sw)
            self.dual_coef_ = krr_spectral(s, U, yc, [float(alpha)], sample_weight=sw)[0]
        elif precomputed:
            self.dual_coef_ = _precomputed_solve(K, yc, torch.as_tensor(alpha), sw)
        else:
            self.dual_coef_ = krr_cholesky(K, yc, torch.as_tensor(alpha), sample_weight=sw,
                                           overwrite_k=True)
        return self

    def predict(self, X, return_std=False, return_cov=False, observation_noise=None):
        """Predict f(x) = k(x, X_fit) dual_coef + intercept, optionally with uncertainty.

        The standard deviation / covariance are those of the Gaussian-process posterior with
        prior ``signal_variance_`` k and noise variance ``noise_variance_`` (see
        :mod:`kernelflow.solvers.variance`; scikit-learn's ``GaussianProcessRegressor``
        convention): without ``learn_hyperparameters`` the latent function's, with noise
        variance ``alpha`` (``GaussianProcessRegressor(alpha=alpha)``); with learned
        hyperparameters that of a new observation, the learned noise included (as with a
        learned ``WhiteKernel``), so that mean +- 1.96 std is a 95 % interval for new targets.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        return_std : bool, default=False
            Also return the posterior standard deviation, shape like ``y_pred``.
        return_cov : bool, default=False
            Also return the posterior covariance, shape (n_samples, n_samples[, n_targets]).
        observation_noise : bool or None, default=None
            Add ``noise_variance_`` to the variance (of new observations) or not (the latent
            function); None: True when the hyperparameters were learned, else False.

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        y_std or y_cov : ndarray or tensor, only when requested
        """
        if (return_std or return_cov) and self._precomputed():
            raise ValueError("return_std and return_cov need the kernel function; they are not "
                             "available with kernel='precomputed'.")
        return exact_predict(self, X, return_std, return_cov, observation_noise)

    def log_marginal_likelihood(self):
        """Log marginal likelihood of the (centred) training targets under the GP reading.

        Prior covariance ``signal_variance_`` (K + ``alpha_`` W^{-1}) (noise variance ``alpha``
        divided by the sample weights without ``learn_hyperparameters``), summed over targets;
        equal to scikit-learn's ``GaussianProcessRegressor.log_marginal_likelihood_value_``.
        With ``learn_hyperparameters="marginal_likelihood"`` it is the maximised evidence,
        -n times the criterion (``hyperparameters_.value``).

        Returns
        -------
        float
        """
        if self._precomputed():
            raise ValueError("log_marginal_likelihood needs the kernel function; it is not "
                             "available with kernel='precomputed'.")
        return exact_log_marginal_likelihood(self)
