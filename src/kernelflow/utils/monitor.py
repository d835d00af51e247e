"""Early-stopping monitor: one patience rule for every iterative solver.

A solver reports a validation loss after each iterate; the monitor remembers the best value and
its iteration and says when ``n_iter_no_change`` consecutive iterates have not improved on it by
more than ``tol``. Paths, the Nyström conjugate gradients, robust Nyström and doubly stochastic
epochs all stop by this rule.
"""

from __future__ import annotations

import math

from ._finite import DivergenceError

__all__ = ["EarlyStopping", "BatchedEarlyStopping"]


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


class BatchedEarlyStopping:
    """:class:`EarlyStopping` for a batch of independent problems, vectorised.

    Each entry of a tensor of shape ``shape`` (for example bandwidths x folds) follows the
    scalar rule: an iteration improves when ``loss < best_loss - tol``, and the problem stops
    at the ``n_iter_no_change``-th consecutive iteration without improvement; a stopped
    problem ignores later losses. :meth:`update_chunk` advances a block of consecutive
    iterations at once (a running minimum over the block when ``tol == 0``), with the same
    result as calling :meth:`update` on each.

    Parameters
    ----------
    shape : tuple of int
        Batch shape of the problems.
    n_iter_no_change : int, default=100
    tol : float, default=0.0
    nonfinite : {"raise", "worst"}, default="raise"
        A non-finite loss raises :class:`DivergenceError` (as :class:`EarlyStopping`), or counts
        as +inf, i.e. never an improvement (a diverging problem keeps its earlier best).
    device, dtype
        Of the loss tensors.

    Attributes
    ----------
    best_loss : tensor of shape ``shape``
        Lowest loss seen (+inf before any).
    best_iteration : int64 tensor of shape ``shape``
        Its iteration (-1 before any).
    stop_iteration : int64 tensor of shape ``shape``
        Iteration at which the problem stopped, -1 while it runs.

    Examples
    --------
    >>> import torch
    >>> mon = BatchedEarlyStopping((2,), n_iter_no_change=2)
    >>> losses = torch.tensor([[3.0, 1.0], [1.0, 2.0], [2.0, 0.5], [1.5, 0.4]],
    ...                       dtype=torch.float64)
    >>> [mon.update(k, row).tolist() for k, row in enumerate(losses)]
    [[False, False], [False, False], [False, False], [True, False]]
    >>> mon.best_iteration.tolist(), mon.best_loss.tolist()
    ([1, 3], [1.0, 0.4])
    """

    def __init__(self, shape, n_iter_no_change: int = 100, tol: float = 0.0,
                 nonfinite: str = "raise", device=None, dtype=None):
        import torch

        if int(n_iter_no_change) < 1:
            raise ValueError(f"n_iter_no_change must be >= 1, got {n_iter_no_change}.")
        if nonfinite not in ("raise", "worst"):
            raise ValueError(f"nonfinite must be 'raise' or 'worst', got {nonfinite!r}.")
        self.n_iter_no_change = int(n_iter_no_change)
        self.tol = float(tol)
        self.nonfinite = nonfinite
        dtype = torch.float64 if dtype is None else dtype
        self.best_loss = torch.full(tuple(shape), math.inf, dtype=dtype, device=device)
        self.best_iteration = torch.full(tuple(shape), -1, dtype=torch.long, device=device)
        self.stop_iteration = torch.full(tuple(shape), -1, dtype=torch.long, device=device)
        self._first: int | None = None  # first iteration ever recorded

    @property
    def stopped(self):
        """Boolean tensor: which problems have stopped."""
        return self.stop_iteration >= 0

    def select(self, index) -> None:
        """Keep the problems ``index`` selects (a mask or indices on the leading dimension)."""
        self.best_loss = self.best_loss[index]
        self.best_iteration = self.best_iteration[index]
        self.stop_iteration = self.stop_iteration[index]

    def gather(self, dim: int, index) -> None:
        """Reorder/subset the problems along ``dim`` like :meth:`torch.Tensor.gather`."""
        self.best_loss = self.best_loss.gather(dim, index)
        self.best_iteration = self.best_iteration.gather(dim, index)
        self.stop_iteration = self.stop_iteration.gather(dim, index)

    def _clean(self, losses):
        import torch

        finite = torch.isfinite(losses)
        if bool(finite.all()):
            return losses
        if self.nonfinite == "raise":
            raise DivergenceError("validation loss is not finite for "
                                  f"{int((~finite).sum())} problem(s).")
        return torch.where(finite, losses, torch.full_like(losses, math.inf))

    def update(self, iteration: int, losses):
        """Record the losses of ``iteration``; return the boolean tensor of stopped problems."""
        return self.update_chunk(iteration, losses.unsqueeze(0))

    def update_chunk(self, first_iteration: int, losses):
        """Record iterations ``first_iteration, ..., first_iteration + c - 1`` at once.

        ``losses`` has shape ``(c, *shape)``; returns the boolean tensor of stopped problems.
        """
        import torch

        losses = self._clean(losses.to(self.best_loss.dtype))
        c = losses.shape[0]
        if c == 0:
            return self.stopped
        dev = losses.device
        its = torch.arange(first_iteration, first_iteration + c, device=dev)
        its = its.reshape(c, *([1] * self.best_loss.ndim))
        if self.tol == 0.0:
            # best before each iteration of the chunk: an exclusive running minimum
            prev = torch.cat([self.best_loss.unsqueeze(0), losses[:-1]]).cummin(0).values
            improve = losses < prev
            run_best = torch.minimum(prev, losses)
        else:
            improve = torch.empty_like(losses, dtype=torch.bool)
            run_best = torch.empty_like(losses)
            best = self.best_loss
            for j in range(c):
                improve[j] = losses[j] < best - self.tol
                best = torch.where(improve[j], losses[j], best)
                run_best[j] = best
        last = torch.where(improve, its, torch.full_like(its, -1)).cummax(0).values
        run_it = torch.maximum(last, self.best_iteration.unsqueeze(0))
        # iterations without improvement since the best (the first ever update counts too)
        if self._first is None:
            self._first = int(first_iteration)
        since = torch.where(run_it >= 0, its - run_it, its - self._first + 1)
        stops = since >= self.n_iter_no_change
        active = ~self.stopped
        any_stop = stops.any(0)
        first = torch.where(any_stop, stops.to(torch.int8).argmax(0),
                            torch.full_like(self.stop_iteration, c - 1))
        pick = first.unsqueeze(0)
        self.best_loss = torch.where(active, run_best.gather(0, pick)[0], self.best_loss)
        self.best_iteration = torch.where(active, run_it.gather(0, pick)[0],
                                          self.best_iteration)
        self.stop_iteration = torch.where(active & any_stop, first + first_iteration,
                                          self.stop_iteration)
        return self.stopped
