"""Generate ``docs/api.md`` from the docstrings of the public modules.

Usage::

    python docs/gen_api.py            # writes docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date
    python docs/gen_api.py -o FILE    # write elsewhere

Each module in ``MODULES`` contributes its summary and every name in its ``__all__`` (classes
with their public methods, functions, constants), with the signature and the numpydoc
docstring verbatim. The estimator registry adds every registered estimator module, so new
estimators appear without editing this script. Modules that fail to import are listed as
unavailable instead of stopping the run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (section title, module names) in reading order
MODULES: list[tuple[str, list[str]]] = [
    ("Kernels and the kernel engine", ["kernelflow.kernels", "kernelflow.operators",
                                       "kernelflow.linalg"]),
    ("Estimators", []),  # filled from the registry
    ("Landmarks (Nyström centres)", ["kernelflow.landmarks"]),
    ("Feature maps", ["kernelflow.features"]),
    ("Data sets", ["kernelflow.datasets"]),
    ("Model files, registry, plots, progress", ["kernelflow.io", "kernelflow.registry",
                                                 "kernelflow.plotting",
                                                 "kernelflow.utils._progress"]),
    ("Command line", ["kernelflow.cli"]),
]


def _estimator_modules() -> list[str]:
    from kernelflow.registry import ESTIMATORS, available_estimators

    available_estimators()  # also registers estimators found by discovery
    seen = []
    for path in ESTIMATORS.values():
        module = path.partition(":")[0]
        if module.startswith("kernelflow.") and module not in seen:
            seen.append(module)
    return seen


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig.replace("(self, ", "(").replace("(self)", "()")


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "(no docstring)")


def _first_line(obj) -> str:
    return _doc(obj).splitlines()[0] if obj.__doc__ else ""


def _render_object(name: str, obj, module_name: str) -> list[str]:
    out = []
    if inspect.isclass(obj):
        out += [f"### `{name}`", "", "```text", f"class {module_name}.{name}{_signature(obj)}",
                "", _doc(obj), "```", ""]
        methods = []
        for mname, member in inspect.getmembers(obj):
            if mname.startswith("_") or not (inspect.isfunction(member) or
                                             inspect.ismethod(member)):
                continue
            if getattr(member, "__qualname__", "").split(".")[0] != obj.__name__:
                continue  # inherited from a base class
            methods.append((mname, member))
        for mname, member in methods:
            out += [f"#### `{name}.{mname}{_signature(member)}`", "", "```text", _doc(member),
                    "```", ""]
    elif callable(obj):
        out += [f"### `{name}{_signature(obj)}`", "", "```text", _doc(obj), "```", ""]
    else:
        out += [f"### `{name}`", "", f"Constant of type `{type(obj).__name__}`.", ""]
    return out


def render() -> str:
    warnings.simplefilter("ignore")
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.",
        "Every estimator follows the scikit-learn API (`fit`, `predict`, `score`, `get_params`,",
        "`set_params`); online learners add `partial_fit`, `learn_one` and `predict_one`.",
        "",
    ]
    sections = [(t, m if m else _estimator_modules()) for t, m in MODULES]
    lines += ["## Contents", ""]
    for title, _ in sections:
        anchor = title.lower()
        for ch in "(),.":
            anchor = anchor.replace(ch, "")
        lines.append(f"- [{title}](#{anchor.replace(' ', '-')})")
    lines.append("")
    for title, modules in sections:
        lines += [f"## {title}", ""]
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - document what can be imported
                lines += [f"`{module_name}` is not available: {exc}", ""]
                continue
            summary = _first_line(module)
            lines += [f"### Module `{module_name}`", "", summary, ""]
            for name in getattr(module, "__all__", []):
                obj = getattr(module, name, None)
                if obj is None or inspect.ismodule(obj):
                    continue
                defined = getattr(obj, "__module__", module_name) or module_name
                if inspect.isclass(obj) or callable(obj):
                    if not defined.startswith("kernelflow"):
                        continue
                lines += _render_object(name, obj, module_name)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(HERE / "api.md"))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the output file differs from the generated text")
    args = parser.parse_args(argv)
    text = render()
    out = Path(args.output)
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
