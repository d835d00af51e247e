"""Progress bars for long loops (public entry point).

``progress`` wraps an iterable in a bar when a user can see it and in a silent stand-in
otherwise, so the same loop runs in every case. At ``verbose >= 1`` the bar is a
``tqdm.auto`` bar on a terminal or in a Jupyter notebook (a widget with ipywidgets), a tqdm bar
on an explicit ``file``, and otherwise (standard error sent to a file or a pipe, or tqdm not
installed) a plain line every few seconds with done/total and one estimate of the time left.
Estimators with a ``verbose`` parameter use it; tqdm comes with the ``progress`` extra
(``pip install kernelflow[progress]``).

A loop bounded by ``max_iter`` opens its bar with ``upper_bound=True`` (its estimate then
reads "at most ... left") and may revise the expected count with ``bar.set_total``, for
example from the rate at which a residual falls (:func:`steps_to_reach`).

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

from ._progress import SilentProgress, TextProgress, progress, steps_to_reach

__all__ = ["progress", "SilentProgress", "TextProgress", "steps_to_reach"]
