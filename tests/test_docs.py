"""Every ```python block in README.md and docs/*.md runs, in order, one namespace per file.

A block preceded by the line ``<!-- docs-test: skip -->`` is not run (for fragments that need
external files or several processes). Blocks run in a temporary working directory.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARK = "<!-- docs-test: skip -->"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)

#: pages written as illustrations of multi-process or file-based set-ups; their blocks are
#: fragments rather than programs (mark single blocks with SKIP_MARK instead where possible)
FRAGMENT_PAGES = {
    "docs/distributed.md": "needs torchrun and data files on disk",
    "docs/landmarks.md": "illustrative fragments with user-supplied X",
    "docs/online.md": "illustrative fragments with user-supplied X and a CSV stream",
}


def _pages():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in pages if p.exists()]


def extract_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every runnable ```python block."""
    blocks = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().splitlines()
        if before and before[-1].strip() == SKIP_MARK:
            continue
        blocks.append((text[: m.start()].count("\n") + 2, textwrap.dedent(m.group(1))))
    return blocks


def test_extract_blocks_honours_the_skip_mark():
    text = "a\n```python\nx = 1\n```\n" + SKIP_MARK + "\n```python\nraise SystemExit\n```\n"
    assert extract_blocks(text) == [(3, "x = 1\n")]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page, tmp_path, monkeypatch):
    rel = str(page.relative_to(ROOT))
    if rel in FRAGMENT_PAGES:
        pytest.skip(FRAGMENT_PAGES[rel])
    blocks = extract_blocks(page.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip("no python blocks")
    import kernelflow.registry as registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setattr(registry, "ESTIMATORS", dict(registry.ESTIMATORS))  # pages may register
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for line, code in blocks:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(code, f"{rel}:{line}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - report which block failed
            pytest.fail(f"{rel}, block at line {line} failed: {type(exc).__name__}: {exc}\n"
                        f"{code}")


def test_api_reference_lists_every_registered_estimator(tmp_path):
    out = tmp_path / "api.md"
    res = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_api.py"), "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    from kernelflow.registry import available_estimators

    for name, cls in available_estimators(include_sklearn=False).items():
        assert f"### `{cls.__name__}`" in text, name
    assert "### `save_model(" in text and "### `progress(" in text
