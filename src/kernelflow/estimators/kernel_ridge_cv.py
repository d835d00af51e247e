"""Kernel ridge regression with penalty and bandwidth chosen by leave-one-out, GCV or k-fold."""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions

from ..distributed.auto import DISTRIBUTED_CONSTRAINT, collective_errors, data_parallel
from ..distributed.cv import check_replicated, my_share, reduce_scores
from ..kernels import make_kernel
from ..solvers.direct import gcv_mse_spectral, krr_spectral, loo_mse_spectral, spectrum
from ..solvers.grid_cv import krr_grid_cv
from ..utils._progress import progress
from ..utils._validation import check_X_y
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin

if TYPE_CHECKING:
    from sklearn.model_selection import BaseCrossValidator, BaseShuffleSplit
    from typing_extensions import Self

    from ..kernels import Kernel
    from ..operators import Options
    from ..typing import ArrayLike, Output

__all__ = ["KernelRidgeCV"]

_DEFAULT_ALPHAS = tuple(np.logspace(-6, 1, 30))


class KernelRidgeCV(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Kernel ridge regression with the penalty and bandwidth chosen by leave-one-out.

    For each bandwidth in ``sigmas`` one eigendecomposition K = U diag(s) U^T gives the exact
    leave-one-out error of every penalty at once: e_i = (y_i - f_i) / (1 - H_ii),
    H = U diag(s / (s + lambda)) U^T (Allerbo App. B), or the GCV score. The pair with the
    smallest mean error (averaged over targets) is refitted.

    With ``fit_intercept=True`` the leave-one-out errors are those of the centred problem with
    the training mean held fixed (an O(1/n) approximation of refitting the mean as well).

    Cost: O(n_sigmas (n^3 + n_alphas n^2)).

    Parameters
    ----------
    alphas : array-like of shape (n_alphas,), default=np.logspace(-6, 1, 30)
        Candidate penalties (> 0).
    sigmas : array-like of shape (n_sigmas,), default=None
        Candidate bandwidths. None: the median heuristic times np.logspace(-1, 1, 9) for
        distance kernels, or the kernel as given.
    criterion : {"loo", "gcv"}, default="loo"
        Used when ``cv`` is None.
    cv : None, int, cross-validation splitter or iterable, default=None
        None: exact leave-one-out or GCV (``criterion``). Otherwise k-fold cross-validation as
        in scikit-learn's ``check_cv`` (an int k gives ``KFold(k)`` without shuffling): for
        each bandwidth the training kernels of all folds are decomposed in one batched
        eigendecomposition, which scores every penalty at once
        (:func:`kernelflow.solvers.grid_cv.krr_grid_cv`); the score of a grid point is the
        mean over folds of the validation mean squared error. Cost
        O(n_sigmas n_folds (n^3 + n_alphas n^2)).
    kernel, gamma, degree, coef0, fit_intercept, options
        As in :class:`KernelRidge`; ``kernel`` may be a name or a Kernel object whose
        ``sigma`` is replaced by each candidate.
    distributed : {"auto", "on", "off"} or bool, default="auto"
        Inside an initialised torch.distributed group of several processes ("auto", True or
        "on"), every process passes the whole training set and scores a share of the
        bandwidths (round robin; one all-reduce of the error table); all select and fit the
        same model. False or "off": each process scores every bandwidth.
    verbose : int, default=0
        > 0 shows progress over the bandwidths (k-fold: over the (bandwidth, fold) fits), in
        a terminal or a notebook (:func:`kernelflow.utils.progress.progress`).

    Attributes
    ----------
    alpha_ : float
    sigma_ : float or None
    cv_results_ : dict with "sigmas", "alphas" and "mean_error" of shape (n_sigmas, n_alphas)
    best_score_ : float
        The smallest mean leave-one-out (or GCV) squared error.
    dual_coef_, intercept_, X_fit_, kernel_, n_features_in_, feature_names_in_
        As in :class:`KernelRidge`.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators import KernelRidgeCV
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(80, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(80)
    >>> model = KernelRidgeCV().fit(X, y)
    >>> round(model.score(X, y), 2)
    0.98
    """

    _parameter_constraints: dict = {
        "alphas": ["array-like"],
        "sigmas": ["array-like", None],
        "criterion": [StrOptions({"loo", "gcv"})],
        "cv": [None, Interval(Integral, 2, None, closed="left"), HasMethods(["split"]),
               "array-like"],
        "distributed": DISTRIBUTED_CONSTRAINT,
        "verbose": ["verbose"],
        **{k: v for k, v in KERNEL_CONSTRAINTS.items() if k != "sigma"},
    }

    def __init__(self, alphas: ArrayLike = _DEFAULT_ALPHAS, *, sigmas: ArrayLike | None = None,
                 criterion: Literal["loo", "gcv"] = "loo",
                 cv: int | BaseCrossValidator | BaseShuffleSplit
                 | Iterable[tuple[ArrayLike, ArrayLike]] | None = None,
                 kernel: str | Kernel = "rbf", gamma: float | None = None, degree: int = 3,
                 coef0: float = 1.0, fit_intercept: bool = True, options: Options | None = None,
                 distributed: bool | Literal["auto", "on", "off"] = "auto",
                 verbose: int = 0) -> None:
        self.alphas = alphas
        self.sigmas = sigmas
        self.criterion = criterion
        self.cv = cv
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.options = options
        self.distributed = distributed
        self.verbose = verbose

    def _candidate_kernels(self, X):
        base = make_kernel(self.kernel, gamma=self.gamma, degree=self.degree, coef0=self.coef0,
                           X=X)
        if not hasattr(base, "sigma"):
            if self.sigmas is not None:
                raise ValueError(f"sigmas given, but the {type(base).__name__} kernel has none.")
            return [base], [None]
        if np.ndim(self.sigmas) > 1 or (self.sigmas is None and np.ndim(base.sigma) > 0):
            raise ValueError("KernelRidgeCV searches scalar bandwidths; per-feature (ARD) "
                             "bandwidths are learned by KernelRidge(learn_hyperparameters=...).")
        if self.sigmas is None:
            center = base.sigma  # the kernel's own, gamma's, or the median heuristic on X
            sigmas = center * np.logspace(-1, 1, 9)
        else:
            sigmas = np.asarray(self.sigmas, dtype=np.float64).reshape(-1)
            if sigmas.size == 0 or not np.all(np.isfinite(sigmas)) or np.any(sigmas <= 0):
                raise ValueError("sigmas must be a non-empty array of positive finite numbers.")
        kernels = [type(base)(**{**base.get_params(), "sigma": float(s)}) for s in sigmas]
        return kernels, [float(s) for s in sigmas]

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> Self:
        """Select the penalty and bandwidth, then fit.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        Xt, yt, sw, _ = check_X_y(self, X, y, sample_weight=sample_weight)
        alphas = np.asarray(self.alphas, dtype=np.float64).reshape(-1)
        if alphas.size == 0 or not np.all(np.isfinite(alphas)) or np.any(alphas <= 0):
            raise ValueError("alphas must be a non-empty array of positive finite numbers.")
        if Xt.shape[0] < 2:
            raise ValueError(
                "KernelRidgeCV needs at least 2 samples for leave-one-out, got n_samples = 1."
            )
        yc, intercept = self._center_targets(yt, sw)
        if self.cv is not None:
            return self._fit_kfold(Xt, yt, yc, sw, intercept, alphas)
        score_fn = loo_mse_spectral if self.criterion == "loo" else gcv_mse_spectral
        kernels, sigmas = self._candidate_kernels(Xt if sw is None else Xt[sw > 0])
        parallel = data_parallel(self.distributed)
        if parallel:  # every process scores a share of the bandwidths
            with collective_errors(f"{type(self).__name__}.fit"):
                check_replicated(type(self).__name__, Xt, yt, sw)
        errors = np.zeros((len(kernels), alphas.size))
        # (mean error, bandwidth index, penalty index, spectrum of that kernel)
        best: tuple[float, int | None, int | None, tuple[torch.Tensor, torch.Tensor] | None]
        best = (np.inf, None, None, None)
        self.X_fit_ = Xt
        share = my_share(len(kernels)) if parallel else range(len(kernels))
        for i in progress(share, desc=f"{type(self).__name__} ({self.criterion})",
                          verbose=self.verbose, unit="bandwidth"):
            self.kernel_ = kernels[i]
            s, U = spectrum(self._operator(Xt).to_dense(), sw)
            err = score_fn(s, U, yc, alphas, sample_weight=sw).mean(1)
            errors[i] = err.cpu().numpy()
            j = int(np.argmin(errors[i]))
            if errors[i, j] < best[0]:
                best = (errors[i, j], i, j, (s, U))
        if parallel:
            with collective_errors(f"{type(self).__name__}.fit"):
                errors = reduce_scores(errors)
            held = best
            best = (np.inf, None, None, None)
            for i in range(len(kernels)):  # the single-process choice, from the whole table
                j = int(np.argmin(errors[i]))
                if errors[i, j] < best[0]:
                    best = (errors[i, j], i, j, held[3] if held[1] == i else None)
            if best[1] is not None and best[3] is None:  # chosen elsewhere: factor it here
                self.kernel_ = kernels[best[1]]
                best = (*best[:3], spectrum(self._operator(Xt).to_dense(), sw))
        _, i_best, j_best, factors = best
        i, j = cast(int, i_best), cast(int, j_best)
        s, U = cast("tuple[torch.Tensor, torch.Tensor]", factors)
        self.kernel_ = kernels[i]
        self.sigma_ = sigmas[i]
        self.alpha_ = float(alphas[j])
        self.best_score_ = float(errors[i, j])
        self.cv_results_ = {"sigmas": np.array(sigmas, dtype=object), "alphas": alphas,
                            "mean_error": errors}
        self.intercept_ = intercept
        self.dual_coef_ = krr_spectral(s, U, yc, [self.alpha_], sample_weight=sw)[0]
        return self

    def _fit_kfold(self, X, y, yc, sw, intercept, alphas):
        n = X.shape[0]
        splitter = check_cv(self.cv)
        idx = np.zeros((n, 1))
        folds = [np.asarray(te) for _, te in splitter.split(idx, np.zeros(n))]
        kernels, sigmas = self._candidate_kernels(X if sw is None else X[sw > 0])
        # with an intercept every fold centres its targets by its own training mean
        res = krr_grid_cv(X, y if self.fit_intercept else yc, kernels, alphas, folds,
                          sample_weight=sw, fit_intercept=self.fit_intercept,
                          verbose=self.verbose)
        errors = res.cv_mse.detach().cpu().numpy()
        i, j = res.best_index
        self.X_fit_ = X
        self.kernel_ = kernels[i]
        self.sigma_ = sigmas[i]
        self.alpha_ = float(alphas[j])
        self.best_score_ = float(errors[i, j])
        self.cv_results_ = {"sigmas": np.array(sigmas, dtype=object), "alphas": alphas,
                            "mean_error": errors,
                            "fold_error": res.fold_mse.detach().cpu().numpy()}
        self.intercept_ = intercept
        s, U = spectrum(self._operator(X).to_dense(), sw)
        self.dual_coef_ = krr_spectral(s, U, yc, [self.alpha_], sample_weight=sw)[0]
        return self

    def predict(self, X: ArrayLike) -> Output:
        """Predict with the selected penalty and bandwidth.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        return self._kernel_predict(X)

