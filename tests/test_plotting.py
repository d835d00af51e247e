"""Plots render headless to non-empty PNG files; the Nyström error has its defining properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

import kernelflow.plotting as plotting  # noqa: E402
from kernelflow.kernels import Gaussian, Laplace  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png(fig, tmp_path, name):
    path = plotting.save_figure(fig, tmp_path / f"{name}.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    return path


def test_regularization_path_png(tmp_path):
    t = np.geomspace(0.01, 100, 30)
    coefs = np.exp(-1.0 / t)[:, None] * np.linspace(-1, 1, 100)[None, :]
    fig = plotting.plot_regularization_path(t, coefs, best=1.0, max_lines=20)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 20 + 1  # 20 chosen columns + the marker of the selected time
    _png(fig, tmp_path, "path")
    with pytest.raises(ValueError, match="rows"):
        plotting.plot_regularization_path(t[:5], coefs)


FITTED_PATHS = [
    ("sign_gradient", {"sigma": 0.5, "random_state": 0, "max_iter": 300, "n_iter_no_change": 30},
     "stopping time t"),
    ("kernel_ridge_cv", {"sigmas": [0.3, 1.0]}, "penalty lambda"),
    ("penalized_cv", {"cv": 2, "sigmas": [1.0], "alphas": [0.01, 0.1, 1.0], "max_iter": 50},
     "penalty lambda"),
    ("sign_gradient_cv", {"cv": 2, "sigmas": [0.3, 1.0], "max_iter": 200}, "bandwidth sigma"),
    ("nystrom_ridge", {"n_components": 20, "early_stopping": True, "random_state": 0},
     "iteration"),
]


@pytest.mark.parametrize("name, params, xlabel", FITTED_PATHS, ids=[p[0] for p in FITTED_PATHS])
def test_estimator_path_of_fitted_estimators(name, params, xlabel, tmp_path):
    import warnings

    from kernelflow.registry import get_estimator_class

    try:
        cls = get_estimator_class(name)
    except ImportError:
        pytest.skip(f"{name} not available")
    rng = np.random.RandomState(0)
    X = rng.uniform(-2, 2, size=(60, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = cls(**params).fit(X, y)
    fig = plotting.plot_estimator_path(est)
    assert fig.axes[0].get_xlabel() == xlabel
    assert len(fig.axes[0].lines) >= 1
    _png(fig, tmp_path, name)


def test_estimator_path_without_record():
    with pytest.raises(ValueError, match="no recorded path"):
        plotting.plot_estimator_path(object())


def test_fit_1d_png(tmp_path):
    from kernelflow.estimators import KernelRidge

    rng = np.random.RandomState(0)
    X = rng.uniform(0, 6, size=(80, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(80)
    out = np.zeros(80, bool)
    out[:5] = True
    y[out] += 20.0
    model = KernelRidge(alpha=0.1, sigma=0.8).fit(X, y)
    fig = plotting.plot_fit_1d(X, y, {"KRR": model, "truth": np.sin}, outliers=out,
                               X_test=X[:10], y_test=y[:10])
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["KRR", "truth"]
    # the y-range follows the clean data, not the outliers at +20
    assert ax.get_ylim()[1] < 5
    _png(fig, tmp_path, "fit1d")
    with pytest.raises(ValueError, match="one input feature"):
        plotting.plot_fit_1d(np.zeros((3, 2)), np.zeros(3), model)


def test_online_losses_png(tmp_path):
    losses = {"fogd": np.ones(50), "kawv": 1.0 / np.arange(1, 51)}
    fig = plotting.plot_online_losses(losses, cumulative="average", log_x=True)
    avg = fig.axes[0].lines[1].get_ydata()
    np.testing.assert_allclose(avg, np.cumsum(losses["kawv"]) / np.arange(1, 51))
    _png(fig, tmp_path, "online")
    cum = plotting.plot_online_losses(losses, cumulative="sum").axes[0].lines[0].get_ydata()
    np.testing.assert_allclose(cum, np.arange(1, 51))
    with pytest.raises(ValueError, match="cumulative"):
        plotting.plot_online_losses(losses, cumulative="max")


def test_online_losses_from_progressive_validation(tmp_path):
    online = pytest.importorskip("kernelflow.online")
    if not hasattr(online, "progressive_validation"):
        pytest.skip("progressive validation not available")
    from kernelflow.online import KernelAWV, progressive_validation

    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, size=(120, 2))
    y = np.sin(3 * X[:, 0])
    res = progressive_validation(KernelAWV(sigma=0.5), [(X, y)])
    fig = plotting.plot_online_losses({"kawv": res}, cumulative="sum", x="time")
    line = fig.axes[0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), np.cumsum(res.losses))
    np.testing.assert_allclose(line.get_xdata(), res.elapsed)
    assert fig.axes[0].get_xlabel() == "elapsed time (s)"
    _png(fig, tmp_path, "online_time")
    with pytest.raises(ValueError, match="elapsed"):
        plotting.plot_online_losses({"raw": [1.0, 2.0]}, x="time")


def test_predictions_and_comparison_png(tmp_path):
    _png(plotting.plot_predictions([0.0, 1.0, 2.0], {"a": [0.1, 1.2, 1.9]}), tmp_path, "pred")
    fig = plotting.plot_comparison(["a", "b", "c"], [0.9, 0.5, float("nan")], [0.1, 2.0, 1.0])
    _png(fig, tmp_path, "compare")


def _dense_nystrom_error(X, kernel, C):
    K = kernel(X, X)
    K_nm = kernel(X, C)
    K_mm = kernel(C, C)
    return K - K_nm @ torch.linalg.pinv(K_mm, hermitian=True) @ K_nm.T


@pytest.mark.parametrize("kernel", [Gaussian(0.7), Laplace(1.0)])
def test_nystrom_error_matches_dense_formula(kernel):
    rng = np.random.RandomState(1)
    X = torch.tensor(rng.rand(60, 3))
    C = X[:15]
    E = _dense_nystrom_error(X, kernel, C)
    K = kernel(X, X)
    trace = plotting.nystrom_approximation_error(X, kernel, C, norm="trace", relative=False)
    assert trace == pytest.approx(float(torch.trace(E)), rel=1e-8, abs=1e-10)
    fro = plotting.nystrom_approximation_error(X, kernel, C, norm="frobenius")
    assert fro == pytest.approx(float(torch.linalg.norm(E) / torch.linalg.norm(K)), rel=1e-6)
    spec = plotting.nystrom_approximation_error(X, kernel, C, norm="spectral", relative=False)
    assert spec == pytest.approx(float(torch.linalg.eigvalsh(E).max()), rel=1e-6)
    # all points as centres: exact; nested centre sets: error cannot increase
    assert plotting.nystrom_approximation_error(X, kernel, X) == pytest.approx(0.0, abs=1e-9)
    errs = [plotting.nystrom_approximation_error(X, kernel, X[:m]) for m in (5, 10, 20, 40)]
    assert all(a >= b - 1e-12 for a, b in zip(errs, errs[1:]))


def test_nystrom_error_curve_png(tmp_path):
    rng = np.random.RandomState(0)
    X = rng.randn(120, 2)
    ms = [5, 10, 20, 40]

    def first_rows(X, m, rs):
        return X[:m]

    def random_rows(X, m, rs):
        return X[np.random.RandomState(rs).choice(len(X), m, replace=False)]

    curve = plotting.nystrom_error_curve(X, Gaussian(1.0), ms,
                                         selectors={"first": first_rows, "random": random_rows})
    assert set(curve) == {"first", "random"}
    assert np.all(np.diff(curve["first"]) <= 1e-12)  # nested sets
    fig = plotting.plot_nystrom_error(ms, curve)
    _png(fig, tmp_path, "nystrom")
    with pytest.raises(ValueError, match="centre counts"):
        plotting.plot_nystrom_error(ms, {"bad": [1.0, 2.0]})


def test_nystrom_error_curve_with_library_selector():
    try:
        from kernelflow.landmarks import resolve_centers  # noqa: F401
    except ImportError:
        pytest.skip("landmark selection not available")
    X = np.random.RandomState(0).randn(80, 2)
    curve = plotting.nystrom_error_curve(X, Gaussian(1.0), [10, 40], selectors=("uniform",))
    assert curve["uniform"][1] < curve["uniform"][0]


# ---------------------------------------------------------------------------------------------
# one style: colours per method, error bars, values where they belong, marked selections
# ---------------------------------------------------------------------------------------------
def test_method_colours_are_the_same_in_every_plot():
    names = ["sign-gradient descent (kernelflow)", "exact KRR, LOO-tuned (kernelflow)",
             "Nystroem + HuberRegressor (scikit-learn)"]
    assert len({plotting.method_color(n) for n in names}) == 3
    assert plotting.method_color("sign_gradient") == plotting.method_color(names[0])
    assert plotting.method_color("an unknown method") == plotting.method_color(
        "An Unknown Method")
    from matplotlib.colors import to_hex

    y = np.arange(5.0)
    pred = plotting.plot_predictions(y, {n: y + 0.1 for n in names}).axes[0]
    bars = plotting.plot_comparison([n.replace(" (", "\n(") for n in names],
                                    [1.0, 3.0, 1.2]).axes[0]
    scatter = [to_hex(c.get_facecolor()[0]) for c in pred.collections]
    bar = [to_hex(p.get_facecolor()) for p in bars.patches]
    assert scatter == bar == [plotting.method_color(n) for n in names]


def test_comparison_prints_scores_with_error_bars_not_times():
    fig = plotting.plot_comparison(["a", "b"], [8.65, 21.98], [1.9, 3.0], errors=[0.5, 1.0],
                                   score_label="RMSE (MPa)")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["8.65 ± 0.5", "21.98 ± 1"]  # the score, not the fit time
    assert ax.get_xlabel() == "RMSE (MPa)"
    ticks = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    assert ticks["a\n(fit 1.9 s)"] > ticks["b\n(fit 3.0 s)"]  # the first model on top
    err = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(err) == 1
    assert plotting.plot_comparison(["a", "b"], [1e-4, 1.0]).axes[0].get_xscale() == "log"
    with pytest.raises(ValueError, match="errors"):
        plotting.plot_comparison(["a", "b"], [1.0, 2.0], errors=[0.1])


def test_path_plot_marks_the_selected_time_on_a_log_axis():
    class Fitted:
        validation_losses_ = np.r_[1.0, 0.5, np.full(200, 0.4)]  # a long flat region
        learning_rate_ = 0.01
        t_ = 0.5
        sigma_ = 1.5

    ax = plotting.plot_estimator_path(Fitted()).axes[0]
    assert ax.get_xscale() == "log" and "sigma = 1.5" in ax.get_title()
    marker = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(marker) == 1
    assert marker[0].get_xdata()[0] == pytest.approx(0.5)
    assert marker[0].get_ydata()[0] == pytest.approx(0.4)
    assert "selected: 0.5" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_demo_figure_shows_rmse_per_method(tmp_path):
    from kernelflow.demo import demo_figure

    rows = [{"method": "sign-gradient descent (kernelflow)", "rmse": 8.6, "fit_s": 1.9},
            {"method": "exact KRR, LOO-tuned (kernelflow)", "rmse": 22.0, "fit_s": 3.0}]
    y = np.linspace(10, 80, 30)
    fig = demo_figure(y, {r["method"]: y + 1 for r in rows}, rows, unit="MPa")
    left, right = fig.axes
    assert "RMSE (MPa)" in right.get_xlabel() and "(MPa)" in left.get_xlabel()
    assert [t.get_text() for t in right.texts] == ["8.60", "22.00"]
    _png(fig, tmp_path, "demo")


# ---------------------------------------------------------------------------------------------
# labels name the criterion; landmark curves have distinct colours and show their spread
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params, ylabel", [
    ("sign_gradient", {"validation_loss": "huber"}, "validation Huber loss (MPa²)"),
    ("sign_gradient", {"validation_loss": "absolute"}, "validation mean absolute error (MPa)"),
    ("gradient_descent", {"validation_loss": "squared"}, "validation MSE (MPa²)"),
    ("huber_gradient_descent", {}, "validation Huber loss (MPa²)"),
    ("kernel_ridge_cv", {"sigmas": [0.3, 1.0]}, "leave-one-out MSE (MPa²)"),
    ("kernel_ridge_cv", {"sigmas": [0.3, 1.0], "cv": 3}, "cross-validated MSE (MPa²)"),
    ("sign_gradient_cv", {"cv": 2, "sigmas": [0.5, 1.0], "max_iter": 200},
     "cross-validated Huber loss (MPa²)"),
    ("nystrom_robust", {"n_components": 20, "loss": "absolute", "early_stopping": True,
                        "random_state": 0}, "validation mean absolute error (MPa)"),
])
def test_path_plots_name_the_criterion_the_estimator_used(name, params, ylabel):
    import warnings

    from kernelflow.registry import get_estimator_class

    cls = get_estimator_class(name)
    rng = np.random.RandomState(0)
    X = rng.uniform(-2, 2, size=(60, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = cls(**{"random_state": 0, **params} if "random_state" in cls().get_params()
                  else params).fit(X, y)
    ax = plotting.plot_estimator_path(est, unit="MPa").axes[0]
    assert ax.get_ylabel() == ylabel


def test_landmark_curves_have_distinct_colours_and_spread(tmp_path):
    from matplotlib.colors import to_hex

    rng = np.random.RandomState(0)
    ms = [5, 10, 20]
    selectors = {f"sel{i}": (lambda X, m, rs, i=i: X[np.random.RandomState(rs + 100 * i)
                                                     .choice(len(X), m, replace=False)])
                 for i in range(10)}
    X = rng.randn(80, 2)
    curves = plotting.nystrom_error_curve(X, Gaussian(1.0), ms, selectors=selectors,
                                          n_trials=4, random_state=3)
    assert all(c.shape == (4, 3) for c in curves.values())
    # trial t uses seed random_state + t: the first trial is the single-trial curve
    single = plotting.nystrom_error_curve(X, Gaussian(1.0), ms, selectors=selectors,
                                          random_state=3)
    np.testing.assert_allclose(curves["sel0"][0], single["sel0"])
    ax = plotting.plot_nystrom_error(ms, curves).axes[0]
    colours = [to_hex(line.get_color()) for line in ax.lines]
    assert len(set(colours)) == 10  # ten selectors, ten colours (tab10)
    assert len(ax.collections) == 10  # one band per selector
    for line, band, (name, c) in zip(ax.lines, ax.collections, curves.items()):
        np.testing.assert_allclose(line.get_ydata(), c.mean(axis=0))
        verts = band.get_paths()[0].vertices
        sd = c.std(axis=0, ddof=1)
        assert verts[:, 1].max() == pytest.approx((c.mean(axis=0) + sd).max())
        assert line.get_label() == f"{name} (mean ± sd, 4 trials)"
    _png(ax.figure, tmp_path, "landmarks")
    with pytest.raises(ValueError, match="n_trials"):
        plotting.nystrom_error_curve(X, Gaussian(1.0), ms, n_trials=0)
