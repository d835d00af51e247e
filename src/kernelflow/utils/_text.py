"""Text for people: parsed ``key=value`` values, plain-text tables, durations.

Shared by the command line, the demo, the distributed runner and the plots.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
import sys
import textwrap

__all__ = ["parse_value", "format_table", "format_seconds"]


def parse_value(text: str):
    """Parse a ``--param`` value: JSON or a Python literal, otherwise the string itself.

    Examples
    --------
    >>> [parse_value(v) for v in ["0.1", "true", "none", "[1, 2]", "rbf", "1e-3"]]
    [0.1, True, None, [1, 2], 'rbf', 0.001]
    """
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text


def format_table(header, rows, *, width: int | None = None) -> str:
    """Plain-text table: numbers right-aligned, text left-aligned.

    When the table is wider than ``width``, the widest column is wrapped at word boundaries; no
    word is cut. By default (``width=None``) tables written to a terminal fit its width (at
    least 100 columns) and tables written elsewhere (files, pipes) are as wide as they need.

    Examples
    --------
    >>> print(format_table(["model", "R^2"], [["ridge", "0.91"], ["sign", "0.95"]]))
    model   R^2
    -----  ----
    ridge  0.91
    sign   0.95
    >>> print(format_table(["name", "description"], [["a", "one two three four"]], width=16))
    name  description
    ----  -----------
    a     one two
          three four
    """
    if width is None:
        width = (max(100, shutil.get_terminal_size((100, 24)).columns) if sys.stdout.isatty()
                 else 10**6)
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    ncol = len(header)
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    wrap_col = None
    if sum(widths) + 2 * (ncol - 1) > width and ncol > 1:
        # wrap the column with the longest text, down to its longest word
        wrap_col = max(range(ncol), key=lambda i: widths[i])
        longest_word = max(len(w) for r in cells for w in (r[wrap_col].split() or [""]))
        room = width - (sum(widths) - widths[wrap_col]) - 2 * (ncol - 1)
        widths[wrap_col] = max(room, longest_word, len(cells[0][wrap_col]))
    numeric = re.compile(r"^([-+]?[\d.]|-$|nan|inf)")
    right = [i > 0 and all(numeric.match(r[i]) or not r[i] for r in cells[1:])
             for i in range(ncol)]
    lines = []
    for k, r in enumerate(cells):
        pieces = [[c] for c in r]
        if wrap_col is not None:
            pieces[wrap_col] = textwrap.wrap(r[wrap_col], widths[wrap_col],
                                             break_long_words=False) or [""]
        for j in range(max(len(p) for p in pieces)):
            row = [p[j] if j < len(p) else "" for p in pieces]
            parts = [row[0].ljust(widths[0])]  # the first column is left-aligned
            for i in range(1, ncol):
                c = row[i]
                parts.append(c.rjust(widths[i]) if right[i] and i != wrap_col
                             else c.ljust(widths[i]))
            lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_seconds(t: float) -> str:
    """A duration for people: ``0.012 s``, ``1.3 s``, ``42 s``, ``8 min 21 s``.

    Examples
    --------
    >>> [format_seconds(v) for v in (0.01234, 1.26, 42.4, 501.45)]
    ['0.012 s', '1.3 s', '42 s', '8 min 21 s']
    """
    t = float(t)
    if not math.isfinite(t):
        return "-"
    if t < 1:
        return f"{t:.2g} s"
    if t < 10:
        return f"{t:.1f} s"
    if t < 60:
        return f"{t:.0f} s"
    return f"{int(t // 60)} min {t % 60:.0f} s"
