"""Checkpoints of path fits: the state of the running phase, written every interval and resumed.

A path fit (:func:`~kernelflow.solvers.early_stopping.fit_path`) on a matrix-free kernel runs
up to two long loops: the validation run (phase ``"validation"``) and the refit on all rows
(``"refit"``; ``"path"`` without early stopping). A checkpoint holds the phase it was written
in, the step size, the loop's state (the ``state`` dict of
:func:`~kernelflow.solvers.paths.driver.rule_path` and of the single paths: iterate, previous
iterate, running products, step count), the rule's last adaptive threshold and, per phase,
the validation monitor with the best iterate so far or the validation run's outcome. A re-run
given it continues the phase from that step, so it ends with the model of an uninterrupted fit
(the paths are deterministic). Cost of a write: one copy of the loop's tensors, O(n t + m t).

Examples
--------
>>> import os, tempfile
>>> import torch
>>> from kernelflow.solvers.paths.driver import rule_path
>>> from kernelflow.solvers.paths.rules import SignRule
>>> from kernelflow.utils.checkpoint import Checkpoint
>>> K, y = torch.eye(2, dtype=torch.float64), torch.tensor([1.0, -0.5], dtype=torch.float64)
>>> file = os.path.join(tempfile.mkdtemp(), "path.ckpt")
>>> ck = PathCheckpoint(Checkpoint(file, interval=0, fingerprint={}), SignRule())
>>> ck.learning_rate = 0.1
>>> _ = rule_path(SignRule(), K, y, learning_rate=0.1, max_iter=3, **ck.run_kwargs("path"))
>>> again = PathCheckpoint(Checkpoint(file, fingerprint={}), SignRule())
>>> again.phase, again.loop("path")["k"], again.loop("path")["alpha"].tolist()
('path', 3, [[0.30000000000000004, -0.30000000000000004]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...utils.checkpoint import Checkpoint, monitor_state, restore_monitor
from .rules import PathRule

__all__ = ["PathCheckpoint"]


class PathCheckpoint:
    """The checkpoint of one path fit: what it held at the start, and the writer of each phase.

    Parameters
    ----------
    checkpoint : Checkpoint
        The file (its fingerprint names the problem; a foreign one is refused on loading).
    rule : PathRule
        The fit's rule; its ``last_epsilon`` (the Huber rule's threshold) is saved and restored.
    device : torch.device, optional
        Where the stored tensors are loaded.
    """

    def __init__(self, checkpoint: Checkpoint, rule: PathRule, device=None) -> None:
        self.checkpoint, self.rule = checkpoint, rule
        self.saved: dict[str, Any] = checkpoint.load(device) or {}
        self.phase: str | None = self.saved.get("phase")
        #: The step of the fit (stored; set by the fit before the first write).
        self.learning_rate: float | None = self.saved.get("learning_rate")
        if "last_epsilon" in self.saved and hasattr(rule, "last_epsilon"):
            rule.last_epsilon = self.saved["last_epsilon"]

    def loop(self, phase: str) -> dict:
        """The loop state of ``phase``: the stored one when the file was written in that phase,
        else an empty dict (a fresh start)."""
        return dict(self.saved["loop"]) if self.phase == phase else {}

    def restore_validation(self, monitor, best: dict) -> None:
        """Put the stored validation monitor and best iterate back (phase ``"validation"``)."""
        if self.phase != "validation":
            return
        restore_monitor(monitor, self.saved["monitor"])
        if self.saved["best_alpha"] is not None:
            best["alpha"] = self.saved["best_alpha"]

    def validation_result(self) -> dict | None:
        """The validation run's outcome stored by the refit, or None (the run is still to do)."""
        return self.saved["validation"] if self.phase == "refit" else None

    def run_kwargs(self, phase: str, extra: Callable[[], dict] | None = None, *,
                   last: int | None = None) -> dict:
        """``state`` and ``callback`` arguments of a path run of ``phase``: the (resumed) loop
        state, and a callback that writes it with ``extra()`` every interval, except before
        the first step and at step ``last`` (the end of the run: it never resumes)."""
        loop = self.loop(phase)

        def save(*_: Any) -> None:
            if "k" not in loop or (last is not None and loop["k"] >= last):
                return
            self.checkpoint.maybe_save(lambda: {
                "phase": phase, "learning_rate": self.learning_rate, "loop": dict(loop),
                "last_epsilon": getattr(self.rule, "last_epsilon", None),
                **({} if extra is None else extra())})

        return {"state": loop, "callback": save}

    @staticmethod
    def monitor_extra(monitor, best: dict) -> Callable[[], dict]:
        """The validation phase's part of a write: the monitor and the best iterate."""
        return lambda: {"monitor": monitor_state(monitor), "best_alpha": best.get("alpha")}
