"""Every ```python block in README.md and docs/*.md runs, in order, one namespace per file.

A block preceded by the line ``<!-- docs-test: skip -->`` is not run (for fragments that need
external files or several processes). Blocks run in a temporary working directory.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
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


API_PAGES = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def _api_directives() -> list[str]:
    return [m.group(1) for page in sorted(API_PAGES.glob("*.md"))
            for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))]


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):  # longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_api_reference_lists_every_registered_estimator():
    """The mkdocstrings reference documents every registered estimator at its defining path."""
    from kernelflow.registry import available_estimators

    documented = set(_api_directives())
    for name, cls in available_estimators(include_sklearn=False).items():
        assert f"{cls.__module__}.{cls.__name__}" in documented, name
    for path in ("kernelflow.io", "kernelflow.utils.progress", "kernelflow.sources"):
        assert path in documented, path


def test_api_reference_directives_resolve():
    """Every ``::: identifier`` names an importable object (a typo would fail the site build)."""
    directives = _api_directives()
    assert len(directives) > 20
    for path in directives:
        assert _resolve(path) is not None, path


def test_site_navigation_lists_every_page():
    """Every Markdown page under docs/ is in the mkdocs navigation (strict builds need it)."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert rel in config, rel
