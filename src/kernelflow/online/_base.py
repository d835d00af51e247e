"""Shared machinery of the online learners: the round protocol and the two APIs.

Every learner implements four private methods on validated float64 NumPy data:

- ``_reset(d)``: create the state for d features;
- ``_begin(x) -> float``: see ``x_t`` and return ``ŷ_t`` (may update x-dependent state, e.g. AWV
  puts ``x_t`` in its covariance before ``y_t`` is known);
- ``_end(y)``: receive ``y_t`` and finish the round;
- ``_predict_rows(X) -> ndarray``: pure predictions, as the next round's for each row.

``_begin`` never sees ``y_t``: this is the strict protocol "see x_t, predict, then see y_t".
Rows are validated before any state is touched, so a bad row raises and leaves the learner
unchanged.

All-or-nothing without copying the state: the methods that change the state are wrapped by
:class:`~kernelflow.utils._atomic.AtomicFitMixin`, whose snapshot keeps by reference the
attributes a learner lists in ``_atomic_shared``. A learner lists there every attribute that it
replaces by assignment and never writes in place, and every buffer that it writes only through
the call's :class:`~kernelflow.online._updates.UndoLog` (``self._undo_log()``, active during a
continuing ``learn_one``, ``partial_fit`` or ``progressive_predict``). A failed call then
replays the log (the buffers become bit-identical to before) and the wrapper puts the old
references back: the cost per round is what the round writes, not the size of the state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from numbers import Real
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils.validation import check_is_fitted

from ..kernels import Gaussian, Kernel, make_kernel
from ..utils._atomic import AtomicFitMixin
from ..utils._finite import (
    DivergenceError,
    check_bandwidth,
    check_finite_output,
    check_magnitude,
    magnitude_limit,
)
from ..utils._validation import check_X, check_X_y, to_output
from . import _updates
from ._updates import UndoLog, single_thread_blas

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..typing import ArrayLike, Output

__all__ = ["OnlineRegressorBase", "kernel_block"]


def kernel_block(kernel: Kernel, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Dense ``k(A, B)`` as a float64 NumPy array (n_a, n_b).

    The Gaussian kernel is evaluated directly in NumPy (per-round blocks are tiny, so the
    torch dispatch overhead would dominate); other kernels go through :class:`Kernel`.
    """
    if type(kernel) is Gaussian and isinstance(kernel.sigma, float | int):  # else via Kernel
        s2 = float(kernel.sigma) ** 2
        if B.shape[0] == 1:
            diff = A - B[0]
            return np.exp(-0.5 / s2 * np.einsum("ij,ij->i", diff, diff))[:, None]
        na = np.einsum("ij,ij->i", A, A)[:, None]
        nb = np.einsum("ij,ij->i", B, B)[None, :]
        D = np.maximum(na + nb - 2.0 * (A @ B.T), 0.0)
        return np.exp(-0.5 / s2 * D)
    out = kernel(torch.from_numpy(np.ascontiguousarray(A)), torch.from_numpy(
        np.ascontiguousarray(B)))
    return out.detach().cpu().numpy().astype(np.float64, copy=False)


def kernel_diag(kernel: Kernel, x: np.ndarray) -> float:
    """``k(x, x)`` for one row."""
    if type(kernel) is Gaussian:
        return 1.0
    return float(kernel_block(kernel, x[None], x[None])[0, 0])


class OnlineRegressorBase(AtomicFitMixin, RegressorMixin, BaseEstimator):
    """Online regressor with scikit-learn (``partial_fit``) and river (``learn_one``) APIs.

    ``fit(X, y)`` is one pass of the online protocol from a fresh state; ``partial_fit`` continues
    it; ``progressive_predict`` returns the strict-protocol prediction of every round;
    ``predict`` is pure (the prediction each row would get as the next round's input, with no
    dictionary change). ``learn_one``/``predict_one`` take dict rows (river).
    """

    _supervised = True  # read by river's progressive validation
    #: run rounds with a one-thread BLAS (small per-round products); False for O(t²) rounds
    _single_thread_rounds = True

    # ---- to implement -------------------------------------------------------------------------
    def _reset(self, d: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _begin(self, x: np.ndarray) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _end(self, y: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _learn_row(self, x: np.ndarray, y: float) -> float:
        """One whole round for ``learn_one``: ``_begin`` then ``_end`` (a learner may play it
        into new state objects committed by assignment, see ``PKAWVTaylor``). Returns the
        round's prediction, which ``learn_one`` uses only to detect divergence."""
        yhat = self._begin(x)
        self._end(y)
        return yhat

    # ---- helpers ------------------------------------------------------------------------------
    def _undoable(self, active: bool, fn: Callable[[], Any]) -> Any:
        """``fn()`` as a continuing call: in-place writes go through an :class:`UndoLog`, which
        is replayed if ``fn`` fails anywhere (the wrapper of ``AtomicFitMixin`` then puts the
        old references back). The rollback is written inline, with no function call on the
        failure path, so that it runs whatever interrupted the call."""
        if not active:
            return fn()
        d = self.__dict__
        log = UndoLog()
        d["_undo"] = log
        try:
            out = fn()
            del d["_undo"]
            return out
        except BaseException:
            while True:  # a second interrupt during the rollback: replay it from the end
                try:
                    for a, index, old in reversed(log.entries):
                        a[index] = old
                    break
                except BaseException:  # noqa: BLE001, S112 - replaying is idempotent
                    continue
            d.pop("_undo", None)
            raise

    def _undo_log(self) -> UndoLog | None:
        """The undo log of the running continuing call (None in a fresh fit)."""
        return self.__dict__.get("_undo")

    def _make_kernel(self) -> Kernel:
        if isinstance(self.kernel, Kernel):
            kernel = make_kernel(self.kernel)
        else:
            gamma = getattr(self, "gamma", None)
            kernel = make_kernel(self.kernel, sigma=None if gamma is not None else self.sigma,
                                 gamma=gamma, degree=getattr(self, "degree", 3),
                                 coef0=getattr(self, "coef0", 1.0))
        check_bandwidth(kernel)
        return kernel

    def _diverged(self, t: int):
        params = {k: v for k, v in self.get_params().items()
                  if k in ("alpha", "learning_rate", "eta", "sigma", "gamma", "C")}
        raise DivergenceError(
            f"{type(self).__name__} made a non-finite prediction at round {t}: the state "
            f"overflowed with {params} (increase alpha, lower the learning rate, or rescale X "
            "and y). The learner is left as it was before this call."
        )

    def _start(self, X, y, reset: bool):
        Xt, yt, _, kind = check_X_y(self, X, y, reset=reset, multi_output=False)
        Xn = Xt.detach().cpu().numpy().astype(np.float64, copy=False)
        yn = yt.detach().cpu().numpy().astype(np.float64, copy=False).reshape(-1)
        if reset:
            names = getattr(self, "feature_names_in_", None)
            d = Xn.shape[1]
            self.feature_keys_ = list(names) if names is not None else list(range(d))
            self.n_rounds_ = 0
            self._reset(d)
        return Xn, yn, kind, Xt.dtype

    def _run(self, X: np.ndarray, y: np.ndarray, preds: np.ndarray | None = None,
             clock=None) -> None:
        begin, end = self._begin, self._end
        ctx = single_thread_blas() if self._single_thread_rounds else contextlib.nullcontext()
        with ctx:
            for t in range(X.shape[0]):
                yhat = begin(X[t])
                if not math.isfinite(yhat):
                    self._diverged(self.n_rounds_ + t)
                if preds is not None:
                    preds[t] = yhat
                end(float(y[t]))
                if clock is not None:
                    clock(t)
        self.n_rounds_ += X.shape[0]

    # ---- scikit-learn API ---------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Run one pass of the online protocol over (X, y) from a fresh state.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)

        Returns
        -------
        self : object
        """
        Xn, yn, _, _ = self._start(X, y, reset=True)
        self._run(Xn, yn)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Continue the online protocol with the rounds (X, y) (starts fresh if unfitted).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)

        Returns
        -------
        self : object
        """
        fresh = not hasattr(self, "n_rounds_")
        Xn, yn, _, _ = self._start(X, y, reset=fresh)
        self._undoable(not fresh, lambda: self._run(Xn, yn))
        return self

    def progressive_predict(self, X: ArrayLike, y: ArrayLike) -> Output:
        """Run the rounds (X, y) and return the prediction made at each round before its label.

        ``ŷ_t`` depends on ``x_1..x_t`` and ``y_1..y_{t-1}`` only (strict protocol).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,)
        """
        if not hasattr(self, "n_rounds_"):
            self._validate_params()
        fresh = not hasattr(self, "n_rounds_")
        Xn, yn, kind, dtype = self._start(X, y, reset=fresh)
        preds = np.empty(Xn.shape[0])
        def rounds() -> Output:
            self._run(Xn, yn, preds)
            return to_output(torch.from_numpy(preds), kind)

        return self._undoable(not fresh, rounds)

    def predict(self, X: ArrayLike) -> Output:
        """Predictions for X as the next round's input (no state change).

        For the AWV learners this is ``ŷ_KRR(x) / (1 + s²(x)/λ)``, the forecaster's answer if x
        arrived now.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,)
        """
        check_is_fitted(self, "n_rounds_")
        Xt, kind = check_X(self, X, reset=False)
        out = self._predict_rows(Xt.detach().cpu().numpy().astype(np.float64, copy=False))
        check_finite_output(type(self).__name__, out)
        return to_output(torch.from_numpy(out), kind)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = False
        tags.regressor_tags.poor_score = True  # one online pass with a fixed bandwidth
        tags.non_deterministic = False
        return tags

    # ---- river API ----------------------------------------------------------------------------
    # One row per call: the rows are checked by hand (no scikit-learn validation, hence no
    # feature-name warning) and BLAS is held on one thread by direct calls to its controllers
    # (a few microseconds) instead of a threadpoolctl context (tens of microseconds per round).
    # The arithmetic is that of ``fit``: ``_begin``/``_end`` on the same float64 row.
    def _one_round(self, row: np.ndarray, y: float | None) -> float:
        if not self._single_thread_rounds:
            if y is None:
                return float(self._predict_rows(row[None])[0])
            return self._learn_row(row, y)
        if _updates._BLAS_LIBS is None:
            single_thread_blas()  # builds the controller once
        libs: Any = _updates._BLAS_LIBS.lib_controllers if _updates._BLAS_LIBS else ()
        previous = [lib.get_num_threads() for lib in libs]
        for lib, k in zip(libs, previous):
            if k != 1:
                lib.set_num_threads(1)
        try:
            if y is None:
                return float(self._predict_rows(row[None])[0])
            return self._learn_row(row, y)
        finally:
            for lib, k in zip(libs, previous):
                if k != 1:
                    lib.set_num_threads(k)

    def _row_from_dict(self, x, keys=None) -> np.ndarray:
        if not isinstance(x, dict):
            raise TypeError(f"x must be a dict of feature -> value, got {type(x).__name__}")
        keys = self.feature_keys_ if keys is None else keys
        missing = [k for k in keys if k not in x]
        if missing:
            raise ValueError(f"x is missing feature(s) {missing[:5]} (expected keys {keys[:10]})")
        if len(x) != len(keys):
            extra = [k for k in x if k not in set(keys)]
            raise ValueError(f"x has unexpected feature(s) {extra[:5]}; expected {len(keys)} keys")
        try:
            row = np.array([float(x[k]) for k in keys], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"x has a non-numeric value: {exc}") from None
        # fast path: the sum of |x_j| bounds every |x_j| and carries NaN and infinity
        if not sum(map(abs, row.tolist())) <= magnitude_limit(np.float64, row.shape[0]):
            if not np.isfinite(row).all():
                bad = [k for k, v in zip(keys, row) if not math.isfinite(v)]
                raise ValueError(f"x contains NaN or infinity in feature(s) {bad[:5]}")
            check_magnitude("x", row, axis_count=row.shape[0])
        return row

    def learn_one(self, x: dict, y: float) -> None:
        """Play one round: see the dict row ``x``, predict, then learn ``y`` (river API).

        The first call fixes the feature keys and their order. Rows with missing or unexpected
        keys, non-numeric, NaN or infinite values, or a non-finite y raise ``ValueError`` and leave
        the learner unchanged.
        """
        if not isinstance(y, Real) or isinstance(y, bool) or not math.isfinite(float(y)):
            raise ValueError(f"y must be a finite real number, got {y!r}")
        fresh = not hasattr(self, "n_rounds_")
        if fresh:
            if not isinstance(x, dict) or not x:
                raise ValueError("x must be a non-empty dict of feature -> value")
            self._validate_params()
            keys = list(x.keys())
            row = self._row_from_dict(x, keys)
            self.feature_keys_ = keys
            self.n_features_in_ = len(keys)
            if all(isinstance(k, str) for k in keys):
                self.feature_names_in_ = np.asarray(keys, dtype=object)
            self.n_rounds_ = 0
            self._reset(len(keys))
        else:
            row = self._row_from_dict(x)
        def play() -> None:
            if not math.isfinite(self._one_round(row, float(y))):
                self._diverged(self.n_rounds_)
            self.n_rounds_ += 1

        self._undoable(not fresh, play)

    def predict_one(self, x: dict) -> float:
        """Prediction for the dict row ``x`` as the next round's input (0 before any round)."""
        if not hasattr(self, "n_rounds_"):
            return 0.0
        row = self._row_from_dict(x)
        return self._one_round(row, None)
