"""The ``kernelflow`` command line: fit, predict, evaluate, compare, demo, list, info.

Every failure the user can cause (missing file, missing or non-numeric column, unknown model or
parameter, corrupt model file) ends with one line on standard error and a non-zero exit code
(2 for usage errors, 1 otherwise); ``--debug`` shows the traceback instead. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import sys
import time
import warnings
from pathlib import Path

__all__ = ["main", "build_parser", "CLIError"]

PROG = "kernelflow"
logger = logging.getLogger(__name__)


class CLIError(Exception):
    """An error reported to the user as one line (no traceback)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise CLIError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def read_table(source: str):
    """Read a CSV/TSV/Parquet file, or a bundled data set written ``dataset:NAME``."""
    import pandas as pd

    if source.startswith("dataset:"):
        from kernelflow.datasets import REAL_DATASETS

        name = source.split(":", 1)[1]
        if name not in REAL_DATASETS:
            raise CLIError(
                f"unknown data set {name!r}; choose from {', '.join(sorted(REAL_DATASETS))}"
            )
        bunch = REAL_DATASETS[name](as_frame=True)
        return bunch.frame, bunch.target_name
    path = Path(source)
    if not path.exists():
        raise CLIError(f"file not found: {source}")
    if path.is_dir():
        raise CLIError(f"{source} is a directory, expected a CSV or Parquet file")
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            df = pd.read_parquet(path)
        elif suffix in (".csv", ".txt", ".tsv", ".gz", ""):
            df = pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
        else:
            raise CLIError(f"unsupported file type {suffix!r} for {source}; use .csv or .parquet")
    except CLIError:
        raise
    except Exception as exc:  # noqa: BLE001 - parser errors vary by engine
        raise CLIError(f"cannot read {source}: {_one_line(exc)}") from None
    if df.shape[0] == 0 or df.shape[1] == 0:
        raise CLIError(f"{source} contains no data")
    return df, None


def split_xy(df, target: str | None, *, features=None, drop=(), source="data"):
    """Select numeric features and the target column with clear errors."""
    if target is None:
        raise CLIError("--target is required for this data")
    if target not in df.columns:
        cols = ", ".join(map(str, list(df.columns)[:12]))
        raise CLIError(f"target column {target!r} not found in {source} (columns: {cols})")
    unknown_drop = [c for c in drop if c not in df.columns]
    if unknown_drop:
        raise CLIError(f"--drop: no column(s) {', '.join(unknown_drop)} in {source}")
    if features:
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise CLIError(f"feature column(s) {', '.join(missing)} not found in {source}")
        X = df[list(features)]
    else:
        X = df.drop(columns=[target, *drop])
    check_numeric(X, source)
    y = df[target]
    if not _is_numeric(y):
        raise CLIError(f"target column {target!r} is not numeric")
    if y.isna().any():
        raise CLIError(f"target column {target!r} has {int(y.isna().sum())} missing values")
    if X.shape[1] == 0:
        raise CLIError(f"{source} has no feature columns besides the target")
    return X.astype("float64"), y.astype("float64").to_numpy()


def _is_numeric(series) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series))


def check_numeric(X, source="data"):
    bad = [str(c) for c in X.columns if not _is_numeric(X[c])]
    if bad:
        shown = ", ".join(bad[:8]) + (" ..." if len(bad) > 8 else "")
        raise CLIError(
            f"non-numeric column(s) in {source}: {shown}; encode them as numbers or leave them "
            "out with --drop"
        )
    nan_cols = [str(c) for c in X.columns if X[c].isna().any()]
    if nan_cols:
        raise CLIError(
            f"missing values in column(s) {', '.join(nan_cols[:8])} of {source}; "
            "kernelflow does not impute: fill or drop them first"
        )


def _subsample(X, y, max_rows, seed):
    if max_rows is None or len(X) <= max_rows:
        return X, y
    import numpy as np

    idx = np.sort(np.random.RandomState(seed).choice(len(X), size=max_rows, replace=False))
    logger.info("using %d of %d rows (--max-rows)", max_rows, len(X))
    return X.iloc[idx], y[idx]


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
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


def parse_params(items, models=None) -> dict:
    """Parse ``key=value`` (or ``model:key=value``) pairs into ``{scope: {key: value}}``.

    Unscoped pairs land under the key ``None``.

    Examples
    --------
    >>> parse_params(["alpha=0.1", "sign_gradient:sigma=2"], models={"sign_gradient"})
    {None: {'alpha': 0.1}, 'sign_gradient': {'sigma': 2}}
    """
    out: dict = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"--param expects key=value, got {item!r}")
        key = key.strip()
        scope = None
        if ":" in key:
            scope, key = key.split(":", 1)
            if models is not None and scope not in models:
                raise CLIError(f"--param {item!r}: {scope!r} is not one of the compared models")
        out.setdefault(scope, {})[key] = parse_value(value)
    return out


def build_model(name: str, params: dict, *, scale: bool, verbose: int = 0):
    from kernelflow.registry import get_estimator_class, make_estimator

    try:
        cls = get_estimator_class(name)
    except KeyError as exc:
        raise CLIError(exc.args[0]) from None
    except ImportError as exc:
        raise CLIError(str(exc)) from None
    if verbose and "verbose" in cls().get_params() and "verbose" not in params:
        params = {**params, "verbose": verbose}
    try:
        model = make_estimator(name, **params)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if scale:
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = make_pipeline(StandardScaler(), model)
    return model


def _is_classifier(model) -> bool:
    from sklearn.base import is_classifier

    return is_classifier(model)


def _default_scoring(model):
    if _is_classifier(model):
        return ["accuracy"]
    return ["r2", "neg_root_mean_squared_error", "neg_mean_absolute_error"]


def _score_label(name: str) -> str:
    return {"neg_root_mean_squared_error": "RMSE", "neg_mean_absolute_error": "MAE",
            "neg_mean_squared_error": "MSE", "r2": "R^2"}.get(name, name)


def _score_sign(name: str) -> float:
    return -1.0 if name.startswith("neg_") else 1.0


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def format_table(header, rows) -> str:
    """Plain-text table: first column left-aligned, the others right-aligned.

    Examples
    --------
    >>> print(format_table(["model", "R^2"], [["ridge", "0.91"], ["sign", "0.95"]]))
    model   R^2
    -----  ----
    ridge  0.91
    sign   0.95
    """
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, r in enumerate(cells):
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _one_line(exc) -> str:
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    msg = " ".join(str(msg).split())
    return msg if len(msg) < 600 else msg[:597] + "..."


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
def cmd_list(args) -> int:
    from kernelflow.registry import ESTIMATORS, available_estimators

    ok = available_estimators()
    rows = []
    for name in sorted(ESTIMATORS):
        cls = ok.get(name)
        summary = ""
        if cls is not None and cls.__doc__:
            summary = cls.__doc__.strip().splitlines()[0]
        rows.append([name, "yes" if cls is not None else "no", summary[:70]])
    print(format_table(["model", "available", "description"], rows))
    return 0


def cmd_fit(args) -> int:
    from kernelflow.io import save_model

    df, default_target = read_table(args.data)
    target = args.target or default_target
    X, y = split_xy(df, target, features=_split_list(args.features), drop=_split_list(args.drop),
                    source=args.data)
    X, y = _subsample(X, y, args.max_rows, args.seed)
    params = parse_params(args.param).get(None, {})
    model = build_model(args.model, params, scale=not args.no_scale, verbose=args.verbose)
    start = time.perf_counter()
    model.fit(X, y)
    elapsed = time.perf_counter() - start
    score = model.score(X, y)
    label = "accuracy" if _is_classifier(model) else "R^2"
    extra = {"model": args.model, "target": target, "features": [str(c) for c in X.columns],
             "n_samples": int(len(X)), "source": str(args.data), "fit_seconds": elapsed}
    out = save_model(model, args.output, extra=extra)
    print(f"fitted {args.model} on {len(X)} rows x {X.shape[1]} features in {elapsed:.2f} s; "
          f"training {label} = {score:.4f}; wrote {out}")
    if args.plot:
        _plot_fit(model, X, y, args.plot, title=args.model, ylabel=str(target))
    return 0


def _plot_fit(model, X, y, path, *, title, ylabel="y"):
    from kernelflow.plotting import (
        plot_estimator_path,
        plot_fit_1d,
        plot_predictions,
        save_figure,
    )

    final = model[-1] if hasattr(model, "steps") else model
    if X.shape[1] == 1:
        import pandas as pd

        def on_grid(grid):  # keep the column name the model was fitted with
            return model.predict(pd.DataFrame(grid, columns=X.columns))

        fig = plot_fit_1d(X.to_numpy(), y, {title: on_grid}, xlabel=str(X.columns[0]),
                          ylabel=ylabel, title=title)
    else:
        try:
            fig = plot_estimator_path(final)
        except ValueError:
            fig = plot_predictions(y, {title: model.predict(X)}, title=f"{title} (training data)")
    print(f"wrote plot {save_figure(fig, path)}")


def cmd_predict(args) -> int:
    import numpy as np
    import pandas as pd

    from kernelflow.io import load_model, read_metadata

    if not Path(args.model).exists():
        raise CLIError(f"file not found: {args.model}")
    model = load_model(args.model)
    extra = read_metadata(args.model).get("extra", {})
    df, _ = read_table(args.data)
    features = extra.get("features")
    if features:
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise CLIError(f"column(s) {', '.join(missing)} used for training are missing "
                           f"from {args.data}")
        X = df[features]
    else:
        X = df
    check_numeric(X, args.data)
    pred = np.asarray(model.predict(X.astype("float64")))
    cols = ["prediction"] if pred.ndim == 1 else [f"prediction_{i}" for i in range(pred.shape[1])]
    out = pd.DataFrame(pred.reshape(len(X), -1), columns=cols)
    if args.output:
        out.to_csv(args.output, index=False)
        print(f"wrote {len(out)} predictions to {args.output}")
    else:
        out.to_csv(sys.stdout, index=False)
    target = extra.get("target")
    if args.output and target in df.columns and _is_numeric(df[target]):
        if not df[target].isna().any():  # the file has the answers: report the score too
            label = "accuracy" if _is_classifier(model) else "R^2"
            score = model.score(X.astype("float64"), df[target].astype("float64"))
            print(f"{label} on {args.data}: {score:.4f}")
    return 0


def _cross_validate(model, X, y, cv, scoring, seed):
    from sklearn.model_selection import KFold, StratifiedKFold, cross_validate

    if cv < 2:
        raise CLIError(f"--cv must be at least 2, got {cv}")
    if cv > len(X):
        raise CLIError(f"--cv {cv} is larger than the number of rows ({len(X)})")
    splitter = (StratifiedKFold if _is_classifier(model) else KFold)(
        n_splits=cv, shuffle=True, random_state=seed)
    return cross_validate(model, X, y, cv=splitter, scoring=scoring, error_score="raise")


def cmd_evaluate(args) -> int:
    import numpy as np

    df, default_target = read_table(args.data)
    target = args.target or default_target
    X, y = split_xy(df, target, features=_split_list(args.features), drop=_split_list(args.drop),
                    source=args.data)
    X, y = _subsample(X, y, args.max_rows, args.seed)
    params = parse_params(args.param).get(None, {})
    model = build_model(args.model, params, scale=not args.no_scale, verbose=args.verbose)
    scoring = _split_list(args.scoring) or _default_scoring(model)
    res = _cross_validate(model, X, y, args.cv, scoring, args.seed)
    rows = []
    for name in scoring:
        v = _score_sign(name) * np.asarray(res[f"test_{name}"])
        rows.append([_score_label(name), f"{v.mean():.4f}", f"{v.std():.4f}",
                     " ".join(f"{s:.3f}" for s in v)])
    rows.append(["fit time (s)", f"{np.mean(res['fit_time']):.3f}",
                 f"{np.std(res['fit_time']):.3f}", ""])
    print(f"{args.model}: {args.cv}-fold cross-validation on {len(X)} rows x {X.shape[1]} "
          f"features")
    print(format_table(["metric", "mean", "std", "folds"], rows))
    return 0


def cmd_compare(args) -> int:
    import numpy as np

    from kernelflow.registry import get_estimator_class

    names = []
    for item in args.models or []:
        names.extend(_split_list(item))
    if len(names) < 1:
        raise CLIError("give at least one model with --models NAME[,NAME...]")
    for name in names:  # fail fast on typos, before any fitting
        try:
            get_estimator_class(name)
        except KeyError as exc:
            raise CLIError(exc.args[0]) from None
        except ImportError as exc:
            raise CLIError(str(exc)) from None
    df, default_target = read_table(args.data)
    target = args.target or default_target
    X, y = split_xy(df, target, features=_split_list(args.features), drop=_split_list(args.drop),
                    source=args.data)
    X, y = _subsample(X, y, args.max_rows, args.seed)
    scoped = parse_params(args.param, models=set(names))
    scoring = _split_list(args.scoring) or _default_scoring(get_estimator_class(names[0])())
    rows, scores, times = [], [], []
    for name in names:
        cls = get_estimator_class(name)
        valid = set(cls().get_params(deep=False))
        params = {k: v for k, v in scoped.get(None, {}).items() if k in valid}
        params.update(scoped.get(name, {}))
        model = build_model(name, params, scale=not args.no_scale, verbose=args.verbose)
        try:
            res = _cross_validate(model, X, y, args.cv, scoring, args.seed)
        except CLIError:
            raise
        except Exception as exc:  # noqa: BLE001 - one failing model must not hide the others
            rows.append([name, "failed: " + _one_line(exc)[:60]] + [""] * len(scoring))
            scores.append(float("nan"))
            times.append(float("nan"))
            continue
        vals = [_score_sign(s) * np.asarray(res[f"test_{s}"]) for s in scoring]
        fit_t = float(np.mean(res["fit_time"]))
        rows.append([name] + [f"{v.mean():.4f} +- {v.std():.4f}" for v in vals]
                    + [f"{fit_t:.3f}"])
        scores.append(float(vals[0].mean()))
        times.append(fit_t)
    print(f"{args.cv}-fold cross-validation on {len(X)} rows x {X.shape[1]} features "
          f"(target {target})")
    print(format_table(["model"] + [_score_label(s) for s in scoring] + ["fit time (s)"], rows))
    if args.plot:
        from kernelflow.plotting import plot_comparison, save_figure

        fig = plot_comparison(names, scores, times, score_label=_score_label(scoring[0]),
                              title=f"{args.cv}-fold cross-validation")
        print(f"wrote plot {save_figure(fig, args.plot)}")
    return 0


def cmd_info(args) -> int:
    from kernelflow.io import read_metadata

    if not Path(args.model).exists():
        raise CLIError(f"file not found: {args.model}")
    meta = read_metadata(args.model)
    est = meta["estimator"]
    print(f"format      : {meta['format']} v{meta['format_version']}")
    print(f"estimator   : {est.get('name') or '-'} ({est['class']})")
    print("written by  : " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    n_bytes = sum(_nbytes(a) for a in meta["arrays"].values())
    print(f"arrays      : {len(meta['arrays'])} ({n_bytes / 1e6:.2f} MB)")
    for key, value in meta.get("extra", {}).items():
        print(f"{key:<12}: {value}")
    return 0


def _nbytes(info) -> int:
    import math

    import numpy as np

    return int(np.dtype(info["dtype"]).itemsize * math.prod(info["shape"]))


def cmd_demo(args) -> int:
    if not 0.0 <= args.outliers < 0.5:
        raise CLIError(f"--outliers must be in [0, 0.5), got {args.outliers}")
    run_demo(dataset=args.dataset, outlier_fraction=args.outliers, seed=args.seed,
             n_train=args.n_train, plot=None if args.no_plot else args.plot,
             verbose=args.verbose)
    return 0


# ---------------------------------------------------------------------------------------------
# demo: robust kernel regression on real data with injected outliers
# ---------------------------------------------------------------------------------------------
def _demo_models(sigma, seed, learning_rate, verbose):
    """(label, estimator) pairs of the demo; the robust method is the first available."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
    from sklearn.linear_model import HuberRegressor
    from sklearn.pipeline import make_pipeline

    from kernelflow.estimators import KernelRidgeCV

    gamma = 1.0 / (2.0 * sigma**2)  # scikit-learn's rbf parameter for the same kernel
    models = []
    try:
        from kernelflow.estimators.sign_gradient import KernelSignGradient

        models.append(("sign-gradient descent (kernelflow)", KernelSignGradient(
            learning_rate=learning_rate, sigma=sigma, fit_intercept=False, random_state=seed,
            verbose=verbose)))
    except ImportError:  # pragma: no cover - depends on the installed modules
        logger.warning("KernelSignGradient is not available; the demo has no robust method")
    models.append(("exact KRR, LOO-tuned (kernelflow)",
                   KernelRidgeCV(sigmas=[sigma], fit_intercept=False)))
    models.append(("KernelRidge, same lambda (scikit-learn)",
                   SkKernelRidge(kernel="rbf", gamma=gamma)))
    models.append(("Nystroem + HuberRegressor (scikit-learn)", make_pipeline(
        Nystroem(gamma=gamma, n_components=150, random_state=seed),
        HuberRegressor(max_iter=300))))
    return models


def run_demo(*, dataset="concrete", outlier_fraction=0.2, seed=0, n_train=None,
             plot="kernelflow-demo.png", verbose=0, test_fraction=0.3):
    """Robust kernel regression on a real data set with injected outliers; prints a table.

    Protocol: a random ``test_fraction`` of the rows is held out *clean*; the features are
    standardised with training statistics; the target is centred at its training median; a
    fraction ``outlier_fraction`` of the training targets is shifted upwards by 4 to 8 training
    standard deviations (gross one-sided errors, e.g. a faulty sensor). All kernel methods use
    the Gaussian kernel with the median-heuristic bandwidth. Returns the result rows.
    """
    import numpy as np
    import torch

    from kernelflow.datasets import REAL_DATASETS
    from kernelflow.kernels import Gaussian, median_heuristic

    if dataset not in REAL_DATASETS:
        raise CLIError(f"unknown data set {dataset!r}; choose from "
                       f"{', '.join(sorted(REAL_DATASETS))}")
    start_all = time.perf_counter()
    X, y = REAL_DATASETS[dataset](return_X_y=True)
    rng = np.random.RandomState(seed)
    perm = rng.permutation(len(X))
    n_test = int(round(test_fraction * len(X)))
    test, train = perm[:n_test], perm[n_test:]
    if n_train is not None:
        if n_train < 20:
            raise CLIError(f"--n-train must be at least 20, got {n_train}")
        train = train[:n_train]
    mean, std = X[train].mean(0), X[train].std(0)
    std[std == 0] = 1.0
    X_tr, X_te = (X[train] - mean) / std, (X[test] - mean) / std
    y_tr, y_te = y[train].copy(), y[test]
    n_out = int(round(outlier_fraction * len(train)))
    outliers = rng.choice(len(train), size=n_out, replace=False)
    y_tr[outliers] += y_tr.std() * rng.uniform(4.0, 8.0, size=n_out)
    centre = float(np.median(y_tr))
    y_tr -= centre

    sigma = median_heuristic(X_tr)
    # a path resolution of 10% (instead of the default 1%) keeps the run to a few seconds
    from kernelflow.solvers.paths import sign_learning_rate

    lr = sign_learning_rate(Gaussian(sigma)(torch.from_numpy(X_tr)), torch.from_numpy(y_tr),
                            resolution=0.1)
    print(f"kernelflow demo: {dataset} ({len(X)} rows, {X.shape[1]} features); "
          f"{len(train)} training rows with {n_out} gross outliers "
          f"({100 * outlier_fraction:.0f}%), {len(test)} clean test rows; "
          f"Gaussian kernel, sigma = {sigma:.3g}")
    rows, preds = [], {}
    alpha = None
    for label, model in _demo_models(sigma, seed, lr, verbose):
        if alpha is not None and "same lambda" in label:
            model.set_params(alpha=alpha)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            model.fit(X_tr, y_tr)
            fit_s = time.perf_counter() - t0
        if hasattr(model, "alpha_"):
            alpha = float(model.alpha_)
        pred = np.asarray(model.predict(X_te), dtype=float) + centre
        err = pred - y_te
        preds[label] = pred
        rows.append({"method": label, "rmse": float(np.sqrt(np.mean(err**2))),
                     "mae": float(np.mean(np.abs(err))),
                     "r2": float(1 - np.sum(err**2) / np.sum((y_te - y_te.mean()) ** 2)),
                     "fit_s": fit_s})
    print(format_table(
        ["method", "clean-test RMSE", "MAE", "R^2", "fit time (s)"],
        [[r["method"], f"{r['rmse']:.3f}", f"{r['mae']:.3f}", f"{r['r2']:.3f}",
          f"{r['fit_s']:.2f}"] for r in rows]))
    robust = next((r for r in rows if r["method"].startswith("sign")), None)
    exact = next(r for r in rows if r["method"].startswith("exact"))
    if robust is not None:
        change = 100.0 * (1.0 - robust["rmse"] / exact["rmse"])
        verdict = "lower" if change > 0 else "HIGHER"
        print(f"sign-gradient descent: clean-test RMSE {abs(change):.0f}% {verdict} than "
              f"exact KRR under {100 * outlier_fraction:.0f}% outliers")
    if plot:
        path = _demo_plot(y_te, preds, rows, plot, dataset)
        print(f"wrote plot {path}")
    print(f"total time {time.perf_counter() - start_all:.1f} s")
    return rows


def _demo_plot(y_true, preds, rows, path, dataset):
    from matplotlib.figure import Figure

    from kernelflow.plotting import plot_comparison, plot_predictions, save_figure

    fig = Figure(figsize=(11.5, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.1, 1.0])
    # the scikit-learn ridge solves the same problem as ours: drawing both would hide one
    shown = {k: v for k, v in preds.items() if "same lambda" not in k}
    plot_predictions(y_true, shown, ax=ax1, title=f"{dataset}: clean test set")
    short = [r["method"].replace(" (", "\n(") for r in rows]
    plot_comparison(short, [r["rmse"] for r in rows], [r["fit_s"] for r in rows],
                    score_label="clean-test RMSE (lower is better)", ax=ax2,
                    title="training targets with gross outliers")
    return save_figure(fig, path)


def _split_list(value):
    if not value:
        return []
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_split_list(v))
        return out
    return [v.strip() for v in str(value).split(",") if v.strip()]


# ---------------------------------------------------------------------------------------------
# parser and entry point
# ---------------------------------------------------------------------------------------------
def _add_data_args(p, *, model=True):
    p.add_argument("data", help="CSV or Parquet file, or dataset:NAME (e.g. dataset:concrete)")
    p.add_argument("--target", "-t", help="name of the target column")
    p.add_argument("--features", help="comma-separated feature columns (default: all others)")
    p.add_argument("--drop", action="append", help="column(s) to leave out (comma-separated)")
    p.add_argument("--max-rows", type=int, help="use a random subset of this many rows")
    p.add_argument("--no-scale", action="store_true",
                   help="do not standardise the features (default: StandardScaler first)")
    p.add_argument("--seed", type=int, default=0, help="seed for subsampling and folds")
    if model:
        p.add_argument("--model", "-m", required=True, help="model name (see 'kernelflow list')")
        p.add_argument("--param", "-p", action="append", metavar="KEY=VALUE",
                       help="estimator parameter, repeatable (e.g. -p alpha=0.1 -p kernel=rbf)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kernelflow`` command."""
    from kernelflow import __version__

    parser = _Parser(prog=PROG, description="Fast, robust and scalable kernel regression.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more output (progress bars on a terminal)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("fit", help="fit a model and write a model file")
    _add_data_args(p)
    p.add_argument("--output", "-o", default="model.npz", help="model file (default model.npz)")
    p.add_argument("--plot", help="write a plot (fitted function, path or predictions)")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", help="predict with a saved model")
    p.add_argument("model", help="model file written by 'kernelflow fit'")
    p.add_argument("data", help="CSV or Parquet file with the training feature columns")
    p.add_argument("--output", "-o", help="CSV file for the predictions (default: stdout)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("evaluate", help="cross-validated scores of one model")
    _add_data_args(p)
    p.add_argument("--cv", type=int, default=5, help="number of folds (default 5)")
    p.add_argument("--scoring", help="comma-separated scikit-learn scorer names")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("compare", help="compare several models on one data set")
    _add_data_args(p, model=False)
    p.add_argument("--models", "-m", action="append", required=True,
                   help="comma-separated model names (repeatable)")
    p.add_argument("--param", "-p", action="append", metavar="[MODEL:]KEY=VALUE",
                   help="parameter for all models that accept it, or for MODEL only")
    p.add_argument("--cv", type=int, default=3, help="number of folds (default 3)")
    p.add_argument("--scoring", help="comma-separated scikit-learn scorer names")
    p.add_argument("--plot", help="write a bar chart of the first score")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="robust kernel regression on real data with outliers")
    p.add_argument("--dataset", default="concrete", help="real data set (default concrete)")
    p.add_argument("--outliers", type=float, default=0.2,
                   help="fraction of training targets replaced by outliers (default 0.2)")
    p.add_argument("--n-train", type=int, default=None, help="number of training rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="kernelflow-demo.png",
                   help="plot file (default kernelflow-demo.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write a plot")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("list", help="list the registered models")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="show the metadata of a model file")
    p.add_argument("model")
    p.set_defaults(func=cmd_info)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"{PROG}: warning: {category.__name__}: {_one_line(message)}", file=sys.stderr)


def main(argv=None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Errors are reported as one line on standard error: exit code 2 for a wrong command line,
    1 for a failed command.

    Examples
    --------
    >>> main(["info", "no-such-model.npz"])
    1
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    previous_showwarning = warnings.showwarning
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format=f"{PROG}: %(message)s")
        if args.command is None:
            parser.print_help()
            return 0
        if not debug:
            warnings.showwarning = _show_warning
        return int(args.func(args) or 0)
    except CLIError as exc:
        if debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2 if "--help" in str(exc) else 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. 'kernelflow predict ... | head'
        return 0
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback
        if debug:
            raise
        from kernelflow.io import ModelFileError

        kind = "" if isinstance(exc, (ModelFileError, ValueError, FileNotFoundError,
                                      KeyError, ImportError, MemoryError)) else (
            f"{type(exc).__name__}: ")
        print(f"{PROG}: error: {kind}{_one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = previous_showwarning


if __name__ == "__main__":
    sys.exit(main())
