"""Progress bars for long loops (public entry point).

``progress`` wraps an iterable in a tqdm bar when a user can see it (``verbose >= 1`` and a
terminal on standard error, tqdm installed) and in a silent stand-in otherwise, so the same loop
runs in both cases. Estimators with a ``verbose`` parameter use it.

Examples
--------
>>> from kernelflow.utils.progress import progress
>>> total = 0
>>> with progress(range(3), desc="epochs", verbose=0) as bar:
...     for i in bar:
...         total += i
...         bar.set_postfix(loss=0.5)
>>> total
3
"""

from __future__ import annotations

from ._progress import SilentProgress, progress

__all__ = ["progress", "SilentProgress"]
