"""Early-stopping monitor: one patience rule for every iterative solver.

A solver reports a validation loss after each iterate; the monitor remembers the best value and
its iteration and says when ``n_iter_no_change`` consecutive iterates have not improved on it by
more than ``tol``. Paths, the Nyström conjugate gradients, robust Nyström and doubly stochastic
epochs all stop by this rule.
"""

from __future__ import annotations

import math

from ._finite import DivergenceError

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """Patience-based monitor of a validation loss.

    Parameters
    ----------
    n_iter_no_change : int, default=100
        Stop after this many consecutive iterations without improvement.
    tol : float, default=0.0
        An iteration improves when ``loss < best_loss - tol``.

    Attributes
    ----------
    best_iteration : int
        Iteration of the lowest loss seen (-1 before the first update).
    best_loss : float
    losses : list of float
        Every loss passed to :meth:`update`, in order.

    Examples
    --------
    >>> stop = EarlyStopping(n_iter_no_change=2)
    >>> [stop.update(k, loss) for k, loss in enumerate([3.0, 1.0, 2.0, 1.5])]
    [False, False, False, True]
    >>> stop.best_iteration, stop.best_loss
    (1, 1.0)
    """

    def __init__(self, n_iter_no_change: int = 100, tol: float = 0.0):
        if int(n_iter_no_change) < 1:
            raise ValueError(f"n_iter_no_change must be >= 1, got {n_iter_no_change}.")
        self.n_iter_no_change = int(n_iter_no_change)
        self.tol = float(tol)
        self.best_iteration = -1
        self.best_loss = math.inf
        self.losses: list[float] = []
        self._no_change = 0

    def update(self, iteration: int, loss: float) -> bool:
        """Record the loss of ``iteration``; return True when the run should stop."""
        loss = float(loss)
        if not math.isfinite(loss):
            raise DivergenceError(f"validation loss at iteration {iteration} is {loss}.")
        self.losses.append(loss)
        if loss < self.best_loss - self.tol:
            self.best_loss, self.best_iteration = loss, int(iteration)
            self._no_change = 0
            return False
        self._no_change += 1
        return self._no_change >= self.n_iter_no_change
