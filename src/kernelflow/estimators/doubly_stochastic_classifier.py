"""Kernel classification on streams by doubly stochastic functional gradients."""

from __future__ import annotations

from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d

from ..distributed.auto import data_parallel, fit_scope
from ..distributed.fit import labels_union
from ..solvers.losses import SoftmaxLoss, get_loss
from ..typing import ArrayLike, Output
from ..utils._validation import check_X_y, to_output
from ._calibration import fit_inverse_temperature, scores_to_proba
from .doubly_stochastic import (
    DATA_PARALLEL_CONSTRAINTS,
    DOUBLY_STOCHASTIC_CONSTRAINTS,
    DoublyStochasticDataParallel,
    DoublyStochasticMixin,
)

__all__ = ["DoublyStochasticClassifier"]

#: test-then-train scores kept by ``partial_fit`` to calibrate hinge-loss probabilities
_CALIBRATION_ROWS = 10_000


def _labels_to_numpy(y):
    return y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)


class DoublyStochasticClassifier(DoublyStochasticDataParallel, DoublyStochasticMixin,
                                 ClassifierMixin, BaseEstimator):
    """Kernel SVM / kernel logistic regression by doubly stochastic functional gradients.

    Algorithm 1 of Dai et al. (2014) with the hinge ``max(0, 1 - yu)``, squared hinge
    ``½max(0, 1 - yu)²`` or logistic loss ``log(1 + e^{-yu})`` for two classes (labels mapped to
    ±1, one output), and the multiclass softmax loss ``-u_y + log Σ_c e^{u_c}`` (``"log_loss"``)
    or one-vs-rest hinge losses for more classes (one output per class, one shared feature
    stream). Memory O(t · block_size · n_outputs); iteration t costs
    O(batch_size · t · block_size · d).

    ``predict_proba``: with ``loss="log_loss"`` the model's own sigmoid / softmax; with the
    hinge losses softmax(beta * scores) (two classes: of (-f, f)), the inverse temperature
    beta fitted (temperature scaling to Platt's regularised targets, as
    :class:`~kernelflow.estimators.KernelRidgeClassifier`) on scores the model did not train
    on where there are some: the validation rows with ``early_stopping=True``, and in
    ``partial_fit`` each chunk's scores computed before the model learns it (test then train,
    the latest 10 000 rows); otherwise (``fit`` without early stopping, the first chunk) on
    the training rows' own scores, which can be over-confident. Its arg-max is always
    :meth:`predict`'s class.

    Parameters
    ----------
    loss : {"hinge", "squared_hinge", "log_loss"}, default="hinge"
    alpha : float, default=1e-6
        RKHS regularisation ν.
    kernel, sigma, gamma, degree, coef0 :
        As in :class:`DoublyStochasticRegressor`.
    learning_rate, eta0, decay, batch_size, block_size, max_iter, max_blocks, precondition, \
average, fit_intercept, tol, early_stopping, validation_fraction, n_iter_no_change, shuffle, \
random_state, warm_start, verbose, dtype, distributed, checkpoint, checkpoint_interval :
        As in :class:`DoublyStochasticRegressor`; data-parallel, ``classes_`` is the union of
        the labels of all processes.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Fixed by the first call to ``fit``/``partial_fit`` (or its ``classes`` argument).
    coef_ : tensor of shape (n_features_total_, n_outputs)
    intercept_ : tensor of shape (n_outputs,)
    kernel_, seed_, t_, n_blocks_, n_features_total_, n_iter_, loss_curve_ :
        As in :class:`DoublyStochasticRegressor`.
    inverse_temperature_ : float
        beta of ``predict_proba`` (hinge losses only; not set by a data-parallel fit).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)

    Examples
    --------
    >>> from sklearn.datasets import make_moons
    >>> from kernelflow.estimators.doubly_stochastic_classifier import (
    ...     DoublyStochasticClassifier)
    >>> X, y = make_moons(400, noise=0.1, random_state=0)
    >>> clf = DoublyStochasticClassifier(sigma=0.5, block_size=32, max_iter=5,
    ...                                  random_state=0).fit(X, y)
    >>> round(clf.score(X, y), 1)
    1.0
    """

    _parameter_constraints: dict = {
        "loss": [StrOptions({"hinge", "squared_hinge", "log_loss"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        **DOUBLY_STOCHASTIC_CONSTRAINTS,
        **DATA_PARALLEL_CONSTRAINTS,
    }

    def __init__(self, loss="hinge", *, alpha=1e-6, kernel="rbf", sigma=None, gamma=None,
                 degree=3, coef0=1.0, learning_rate="inverse_scaling", eta0=1.0, decay="auto",
                 batch_size="auto", block_size=128, max_iter=20, max_blocks=None,
                 precondition="auto", average=False, fit_intercept=True, tol=1e-4,
                 early_stopping=False, validation_fraction=0.1, n_iter_no_change=5, shuffle=True,
                 random_state=None, warm_start=False, verbose=0, dtype="float64",
                 distributed="auto", checkpoint=None,
                 checkpoint_interval=60.0):
        self.loss = loss
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.decay = decay
        self.batch_size = batch_size
        self.block_size = block_size
        self.max_iter = max_iter
        self.max_blocks = max_blocks
        self.precondition = precondition
        self.average = average
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.dtype = dtype
        self.distributed = distributed
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    def _multiclass_softmax(self):
        return len(self.classes_) > 2 and self.loss == "log_loss"

    def _loss_object(self):
        return SoftmaxLoss() if self._multiclass_softmax() else get_loss(self.loss)

    def _regularisation(self):
        return self.alpha

    def _set_classes(self, y_np, classes):
        check_classification_targets(y_np)
        cl = np.unique(y_np) if classes is None else np.unique(np.asarray(classes))
        if len(cl) < 2:
            raise ValueError(
                f"The classifier needs samples of at least 2 classes; got {len(cl)} class(es)."
            )
        self.classes_ = cl
        self._n_outputs = 1 if len(cl) == 2 else len(cl)

    def _encode_targets(self, y_np, first):
        unseen = np.setdiff1d(np.unique(y_np), self.classes_)
        if unseen.size:
            raise ValueError(
                f"y contains label(s) {unseen.tolist()} not seen at the first call (classes_ = "
                f"{self.classes_.tolist()}); pass every class with `classes=` on the first "
                "partial_fit call."
            )
        idx = torch.as_tensor(np.searchsorted(self.classes_, y_np))
        dt = torch.float64
        if len(self.classes_) == 2:
            return (2.0 * idx.to(dt) - 1.0).reshape(-1, 1)
        onehot = torch.nn.functional.one_hot(idx, len(self.classes_)).to(dt)
        return onehot if self._multiclass_softmax() else 2.0 * onehot - 1.0

    def _check(self, X, y, sample_weight, reset):
        y_np = _labels_to_numpy(y)
        if y_np.ndim == 2 and y_np.shape[1] == 1:
            y_np = column_or_1d(y_np, warn=True)
        X, _, sw, _ = check_X_y(self, X, np.zeros(len(y_np)) if y_np.ndim == 1 else y_np,
                                 reset=reset, multi_output=False, sample_weight=sample_weight)
        return X, y_np, sw

    def _shard_targets(self, X, y, sw):
        """Validated rows and encoded targets of this process's shard; ``classes_`` is the
        union of all processes' labels (collective)."""
        Xt, y_np, swt = self._check(X, (y[:, 0] if y.shape[1] == 1 else y).numpy(), sw,
                                    reset=True)
        self._set_classes(y_np, labels_union(y_np))
        return Xt, self._encode_targets(y_np, first=True), swt

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None):
        """Fit by ``max_iter`` epochs of shuffled mini-batches (restarts unless ``warm_start``).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        resume = self.warm_start and hasattr(self, "coef_")
        with fit_scope(self, X):
            X, y_np, sw = self._check(X, y, sample_weight, reset=not resume)
            parallel = data_parallel(self.distributed, X)
            if not resume:
                self._set_classes(y_np, labels_union(y_np) if parallel else None)
            if parallel:
                return self._fit_data_parallel(X, y_np, sw)
            self._fit(X, y_np, sw)
            self._calibration_rows = None
            if self.loss != "log_loss":
                self._calibrate_after_fit(X, y_np, sw)
            return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One in-order pass of mini-batches over a chunk of a stream.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            All classes of the stream; only used (and then fixed) at the first call. Without
            it the first chunk's labels are the classes, and later unseen labels raise.
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        first = not hasattr(self, "coef_")
        with fit_scope(self, X):
            X, y_np, sw = self._check(X, y, sample_weight, reset=first)
            parallel = data_parallel(self.distributed, X)
            if first:
                self._set_classes(y_np, labels_union(y_np) if parallel and classes is None
                                  else classes)
            elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
                raise ValueError(
                    f"classes={np.unique(classes).tolist()} differs from the classes of the "
                    f"first call {self.classes_.tolist()}."
                )
            if parallel:
                return self._fit_data_parallel(X, y_np, sw, partial=True)
            if self.loss == "log_loss":
                return self._partial_fit(X, y_np, sw)
            if first:
                self._partial_fit(X, y_np, sw)
                self._calibrate(X, y_np, sw)  # no earlier model: the chunk's own scores
                self._calibration_rows = None
                return self
            F, _ = self._decision(X)  # test, then train
            self._keep_calibration_rows(F, y_np, sw)
            self._partial_fit(X, y_np, sw)
            F, y_c, sw_c = self._calibration_rows
            self.inverse_temperature_ = fit_inverse_temperature(F, y_c, sw_c)
            return self

    def decision_function(self, X: ArrayLike) -> Output:
        """Scores ``f(x)``: shape (n_samples,) for two classes, else (n_samples, n_classes).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray or tensor
        """
        F, kind = self._decision(X)
        return to_output(F[:, 0] if F.shape[1] == 1 else F, kind)

    def predict(self, X: ArrayLike) -> Output:
        """Class labels (sign of the score, or its arg-max).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        F, _ = self._decision(X)
        idx = (F[:, 0] > 0).long() if F.shape[1] == 1 else F.argmax(1)
        return self.classes_[idx.cpu().numpy()]

    def _class_indices(self, y_np):
        return torch.as_tensor(np.searchsorted(self.classes_, y_np), dtype=torch.long)

    def _calibrate_after_fit(self, X, y_np, sw):
        """Calibrate on the validation rows, or on the training rows without them."""
        val = self.validation_indices_
        rows = torch.as_tensor(np.arange(X.shape[0]) if val is None else val)
        self._calibrate(X[rows.to(X.device)], y_np[rows.numpy()],
                        None if sw is None else sw[rows.to(sw.device)])

    def _calibrate(self, X, y_np, sw):
        """Fit ``inverse_temperature_`` to the current model's scores of the rows X."""
        F, _ = self._decision(X)
        self.inverse_temperature_ = fit_inverse_temperature(
            F, self._class_indices(y_np), None if sw is None else sw.detach().cpu())

    def _keep_calibration_rows(self, F, y_np, sw):
        """Append test-then-train scores to the latest ``_CALIBRATION_ROWS`` rows."""
        F = F.detach().cpu().to(torch.float64)
        idx = self._class_indices(y_np)
        w = torch.ones(len(idx), dtype=torch.float64) if sw is None else \
            sw.detach().cpu().to(torch.float64)
        if getattr(self, "_calibration_rows", None) is not None:
            F0, i0, w0 = self._calibration_rows
            F, idx, w = torch.cat([F0, F]), torch.cat([i0, idx]), torch.cat([w0, w])
        self._calibration_rows = (F[-_CALIBRATION_ROWS:], idx[-_CALIBRATION_ROWS:],
                                  w[-_CALIBRATION_ROWS:])

    def predict_proba(self, X: ArrayLike) -> Output:
        """Class probabilities: the logistic / softmax model's own (``loss="log_loss"``), or
        softmax(beta * scores) fitted by temperature scaling (hinge losses).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        return self._proba(X, log=False)

    def predict_log_proba(self, X: ArrayLike) -> Output:
        """Logarithm of :meth:`predict_proba` (computed as a log-sigmoid / log-softmax).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        log_proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        return self._proba(X, log=True)

    def _proba(self, X, log):
        F, kind = self._decision(X)
        if self.loss == "log_loss":
            Z = torch.cat([torch.zeros_like(F), F], 1) if F.shape[1] == 1 else F
            P = torch.log_softmax(Z, 1) if log else torch.softmax(Z, 1)
        else:
            if not hasattr(self, "inverse_temperature_"):
                raise ValueError(
                    f"{type(self).__name__}(loss={self.loss!r}) has no calibrated "
                    "probabilities after a data-parallel fit; fit it in one process, or use "
                    "loss='log_loss'.")
            P = scores_to_proba(F, self.inverse_temperature_, log=log).to(F.dtype)
        return to_output(P, kind)
