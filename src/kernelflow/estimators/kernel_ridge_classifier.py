"""Kernel ridge classifiers: one-vs-rest least squares on {-1, 1} targets (exact and Nyström),
with probabilities by temperature scaling of cross-validated scores."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d

from ..utils._atomic import AtomicFitMixin
from ..utils._validation import check_X, check_X_y, to_output
from ._base import (
    KERNEL_CONSTRAINTS,
    PRECOMPUTED,
    PRECOMPUTED_KERNEL_CONSTRAINTS,
    check_precomputed,
)
from ._calibration import (
    content_folds,
    cross_validated_scores,
    fit_inverse_temperature,
    scores_to_proba,
)
from .kernel_ridge import KernelRidge
from .nystrom_ridge import NYSTROM_CONSTRAINTS, NystromKernelRidge

__all__ = ["KernelRidgeClassifier", "NystromKernelRidgeClassifier", "encode_labels"]


def encode_labels(estimator, X, y, sample_weight):
    """Validate (X, labels); returns (X tensor, label indices (n,), sample weight, classes).

    Labels may be numbers or strings (NumPy, pandas or a torch tensor); ``classes_`` is the
    sorted array of distinct labels, as in scikit-learn. At least two classes are required.
    """
    if y is None:
        raise ValueError(f"{type(estimator).__name__} requires y to be passed, but the target y "
                         "is None.")
    labels = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    labels = column_or_1d(labels, warn=True)
    check_classification_targets(labels)
    classes, idx = np.unique(labels, return_inverse=True)
    Xt, _, sw, _ = check_X_y(estimator, X, idx.astype(np.float64), sample_weight=sample_weight,
                             multi_output=False)
    if classes.shape[0] < 2:
        raise ValueError(
            f"{type(estimator).__name__} needs samples of at least 2 classes in the data, got "
            f"only one class: {classes[0]!r}."
        )
    return Xt, torch.as_tensor(idx, dtype=torch.long, device=Xt.device), sw, classes


CALIBRATION_CONSTRAINTS: dict = {
    "calibration_cv": [Interval(Integral, 2, None, closed="left"), None],
}


class _RidgeClassifierBase(AtomicFitMixin, ClassifierMixin, BaseEstimator):
    """Fits the regressor of ``_regressor()`` to {-1, 1} class indicators (one column per class,
    a single column for two classes) and predicts the class of the largest decision value;
    ``calibration_cv`` folds of the same fit give the scores that calibrate ``predict_proba``."""

    def _regressor(self):
        raise NotImplementedError

    def _fold_regressor(self):
        """The regressor of the calibration folds (the fitted kernel, the fitted centres)."""
        raise NotImplementedError

    def _precomputed(self) -> bool:
        return False

    def _check_kernel_input(self, X, fit: bool) -> None:
        """Shape checks of a precomputed kernel matrix (none for feature inputs)."""

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit one least-squares regression per class on {-1, 1} targets, then (unless
        ``calibration_cv=None``) the inverse temperature of ``predict_proba`` on the scores of
        ``calibration_cv`` cross-validation folds.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        Xt, idx, sw, self.classes_ = encode_labels(self, X, y, sample_weight)
        self._check_kernel_input(Xt, fit=True)
        n_classes = self.classes_.shape[0]
        Y = -torch.ones(Xt.shape[0], n_classes, dtype=Xt.dtype, device=Xt.device)
        Y[torch.arange(Xt.shape[0]), idx] = 1.0
        if n_classes == 2:
            Y = Y[:, 1]
        self.regressor_ = self._regressor().fit(Xt, Y, sample_weight=sw)
        if hasattr(self.regressor_, "n_iter_"):
            self.n_iter_ = self.regressor_.n_iter_
        if self.calibration_cv is not None:
            self.inverse_temperature_ = self._calibrate(Xt, Y, idx, sw)
        return self

    def _calibrate(self, Xt, Y, idx, sw) -> float:
        def fold_scores(train, test):
            tr = torch.as_tensor(train, device=Xt.device)
            te = torch.as_tensor(test, device=Xt.device)
            X_tr, X_te = Xt[tr], Xt[te]
            if self._precomputed():
                X_tr, X_te = X_tr[:, tr], X_te[:, tr]
            reg = self._fold_regressor().fit(X_tr, Y[tr],
                                             sample_weight=None if sw is None else sw[tr])
            return reg.predict(X_te)

        fold = content_folds(Xt, idx, sw, self.calibration_cv, self.random_state)
        if fold is None:  # a class seen once: no out-of-fold score, calibrate on the fit's own
            F = self.regressor_.predict(Xt)
        else:
            F = cross_validated_scores(fold_scores, fold)
        return fit_inverse_temperature(F, idx, sw)

    def decision_function(self, X):
        """Least-squares scores: shape (n_samples,) for two classes (positive means
        ``classes_[1]``), else (n_samples, n_classes).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray or tensor
        """
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        return to_output(self.regressor_.predict(Xt), kind)

    def predict(self, X):
        """Class of the largest score.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        check_is_fitted(self)
        Xt, _ = check_X(self, X, reset=False)
        scores = self.regressor_.predict(Xt)
        pick = (scores > 0).long() if scores.ndim == 1 else scores.argmax(1)
        return self.classes_[pick.cpu().numpy()]

    def _has_proba(self):
        return self.calibration_cv is not None

    def _proba(self, X, log):
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        F = self.regressor_.predict(Xt)
        return to_output(scores_to_proba(F, self.inverse_temperature_, log=log).to(F.dtype),
                         kind)

    @available_if(_has_proba)
    def predict_proba(self, X):
        """Class probabilities softmax(beta * scores) (two classes: scores (-f, f)), beta the
        fitted ``inverse_temperature_``; the arg-max is :meth:`predict`'s class.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        return self._proba(X, log=False)

    @available_if(_has_proba)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba` (computed as a log-softmax).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        log_proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        return self._proba(X, log=True)


_SHARED = ("kernel", "sigma", "gamma", "degree", "coef0", "fit_intercept", "options")


class KernelRidgeClassifier(_RidgeClassifierBase):
    """Kernel ridge classifier: exact least squares on {-1, 1} class indicators.

    One :class:`~kernelflow.estimators.KernelRidge` fit with one target column per class (one
    column for two classes, as scikit-learn's ``RidgeClassifier``), all columns sharing one
    Cholesky factorisation; the predicted class has the largest score. The scores estimate
    2 P(class | x) - 1 but are not probabilities: ``predict_proba`` is softmax(beta * scores)
    (two classes: of (-f, f)), with the inverse temperature beta fitted to the scores of a
    stratified ``calibration_cv``-fold cross-validation of the same model, folds decided by
    row content as the package's holdout rule, so that an integer weight acts as repeating the
    row (temperature
    scaling, as scikit-learn's ``CalibratedClassifierCV(method="temperature",
    ensemble=False)``, to Platt's regularised targets). Its arg-max is always :meth:`predict`'s
    class.

    Cost: O(n^3 / 3 + n^2 c) to fit with c classes, about ``calibration_cv`` times
    O(((k - 1) n / k)^3 / 3) more for the folds; O(n m d) to predict m points.

    Parameters
    ----------
    alpha : float, default=1.0
        Ridge penalty (scikit-learn's ``KernelRidge`` scale).
    kernel : str or Kernel, default="rbf"
        Or ``"precomputed"``: X is then the kernel matrix, (n_samples, n_samples) to fit and
        (n_test, n_samples) to predict.
    sigma, gamma : float, default=None
        Bandwidth (median heuristic when both are None).
    degree : int, default=3
    coef0 : float, default=1.0
    fit_intercept : bool, default=True
        Centre the indicators by their (weighted) means.
    solver : {"auto", "cholesky", "eigen"}, default="auto"
    options : Options, default=None
    calibration_cv : int or None, default=5
        Folds of the cross-validation that calibrates ``predict_proba`` (lowered to the number
        of distinct rows of the smallest class; with a class seen once the fit's own scores are
        used). None:
        no calibration and no ``predict_proba``, the fit costs one factorisation.
    random_state : int, RandomState instance or None, default=None
        Seeds the hash that deals the rows to the calibration folds.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    regressor_ : KernelRidge
        The fitted regression on the indicators.
    inverse_temperature_ : float
        beta of ``predict_proba`` (not set with ``calibration_cv=None``).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    Examples
    --------
    >>> from sklearn.datasets import make_moons
    >>> from kernelflow.estimators import KernelRidgeClassifier
    >>> X, y = make_moons(200, noise=0.1, random_state=0)
    >>> clf = KernelRidgeClassifier(alpha=0.1, sigma=0.5, random_state=0).fit(X, y)
    >>> round(clf.score(X, y), 2)
    0.99
    >>> clf.predict_proba(X[:2]).round(3)
    array([[0.994, 0.006],
           [0.008, 0.992]])
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"auto", "cholesky", "eigen"})],
        **PRECOMPUTED_KERNEL_CONSTRAINTS,
        **CALIBRATION_CONSTRAINTS,
        "random_state": ["random_state"],
    }

    def __init__(self, alpha=1.0, *, kernel="rbf", sigma=None, gamma=None, degree=3, coef0=1.0,
                 fit_intercept=True, solver="auto", options=None, calibration_cv=5,
                 random_state=None):
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.options = options
        self.calibration_cv = calibration_cv
        self.random_state = random_state

    def _regressor(self):
        return KernelRidge(alpha=self.alpha, solver=self.solver,
                           **{k: getattr(self, k) for k in _SHARED})

    def _fold_regressor(self):
        return clone(self.regressor_).set_params(kernel=self.regressor_.kernel_, sigma=None,
                                                 gamma=None)

    def _precomputed(self) -> bool:
        return isinstance(self.kernel, str) and self.kernel == PRECOMPUTED

    def _check_kernel_input(self, X, fit: bool) -> None:
        if self._precomputed():
            check_precomputed(self, X, fit=fit)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = self._precomputed()
        return tags


class NystromKernelRidgeClassifier(_RidgeClassifierBase):
    """Nyström kernel ridge classifier: least squares on {-1, 1} indicators, Falkon solver.

    One :class:`~kernelflow.estimators.NystromKernelRidge` fit with one target column per class
    (one for two classes); every column shares the centres, the preconditioner and each streamed
    kernel block. With all training points as centres it is
    :class:`KernelRidgeClassifier`. ``predict_proba`` as in :class:`KernelRidgeClassifier`:
    temperature scaling of cross-validated scores, the folds reusing the fitted centres and
    kernel.

    Cost: O(M^3 + M^2 d) setup, O(n M (d + 2c)) per conjugate-gradient iteration; the
    calibration folds cost about ``calibration_cv`` times (k - 1) / k as much again.

    Parameters
    ----------
    n_components : int, default=100
    landmarks : str, LandmarkSelector or array-like, default="uniform"
    alpha : float, default=1.0
    kernel, sigma, gamma, degree, coef0, fit_intercept :
        As in :class:`KernelRidgeClassifier`.
    max_iter : int, default=100
    tol : float, default=None
    dtype : {"float32", "float64"} or None, default=None
    block_size : int, default=None
    random_state : int, RandomState instance or None, default=None
        Seeds the centre selection and the calibration folds.
    options : Options, default=None
    calibration_cv : int or None, default=5
        As in :class:`KernelRidgeClassifier`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    regressor_ : NystromKernelRidge
    inverse_temperature_ : float
        beta of ``predict_proba`` (not set with ``calibration_cv=None``).
    n_iter_ : int
        Conjugate-gradient iterations run.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)

    Examples
    --------
    >>> from sklearn.datasets import make_moons
    >>> from kernelflow.estimators import NystromKernelRidgeClassifier
    >>> X, y = make_moons(400, noise=0.1, random_state=0)
    >>> clf = NystromKernelRidgeClassifier(50, alpha=0.1, sigma=0.5, random_state=0).fit(X, y)
    >>> round(clf.score(X, y), 2)
    1.0
    """

    _parameter_constraints: dict = {
        **{k: NYSTROM_CONSTRAINTS[k] for k in (
            "n_components", "landmarks", "max_iter", "dtype", "block_size", "random_state",
            *KERNEL_CONSTRAINTS)},
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "tol": [Interval(Real, 0, None, closed="neither"), None],
        **CALIBRATION_CONSTRAINTS,
    }

    def __init__(self, n_components=100, *, landmarks="uniform", alpha=1.0, kernel="rbf",
                 sigma=None, gamma=None, degree=3, coef0=1.0, fit_intercept=True, max_iter=100,
                 tol=None, dtype=None, block_size=None, random_state=None, options=None,
                 calibration_cv=5):
        self.n_components = n_components
        self.landmarks = landmarks
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.dtype = dtype
        self.block_size = block_size
        self.random_state = random_state
        self.options = options
        self.calibration_cv = calibration_cv

    def _fold_regressor(self):
        C = self.regressor_.centers_
        return clone(self.regressor_).set_params(
            n_components=C.shape[0], landmarks=C, kernel=self.regressor_.kernel_, sigma=None,
            gamma=None)

    def _regressor(self):
        return NystromKernelRidge(
            self.n_components, landmarks=self.landmarks, alpha=self.alpha,
            max_iter=self.max_iter, tol=self.tol, dtype=self.dtype, block_size=self.block_size,
            random_state=self.random_state, distributed="off",
            **{k: getattr(self, k) for k in _SHARED})
