"""Function size check for ``src/``: no function body over 80 lines.

The body is counted from its first statement after the docstring to its last line, comments
and blank lines included. Branches (at most 20 per function) are checked by ruff's PLR0912
(``pyproject.toml``); this script covers length, which ruff does not measure.

Run ``python tools/function_size.py`` (exit status 1 when a function is too long and not in
``ALLOWED`` below, where each exception carries its reason).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 80

#: ``"path::qualified.name": reason`` for functions allowed to be longer.
ALLOWED: dict[str, str] = {}


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of ``node``."""
    body = node.body
    first = body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str) and len(body) > 1):
        first = body[1]
    return int(node.end_lineno or node.lineno) - first.lineno + 1


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function in ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def main(root: str = "src") -> int:
    too_long = []
    seen = set()
    for path in sorted(Path(root).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in functions(tree):
            key = f"{path.as_posix()}::{name}"
            n = body_lines(node)
            if n > MAX_LINES:
                seen.add(key)
                if key not in ALLOWED:
                    too_long.append((n, key, node.lineno))
    for n, key, line in sorted(too_long, reverse=True):
        print(f"{key} (line {line}): {n} lines > {MAX_LINES}")
    stale = sorted(set(ALLOWED) - seen)
    for key in stale:
        print(f"{key}: in ALLOWED but no longer over {MAX_LINES} lines (remove it)")
    if too_long or stale:
        return 1
    print(f"function size: every function in {root}/ has at most {MAX_LINES} lines "
          f"({len(ALLOWED)} allowed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
