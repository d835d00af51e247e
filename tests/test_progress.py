"""Progress reporting: where it shows, the plain-text fallback, one time estimate, estimators."""

from __future__ import annotations

import io
import math
import re
import sys

import numpy as np
import pytest
import torch

from kernelflow.utils import _progress
from kernelflow.utils.progress import SilentProgress, TextProgress, progress, steps_to_reach


@pytest.fixture
def no_tty(monkeypatch):
    """Standard error is no terminal and this is no notebook (pytest's capture)."""
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: False)
    monkeypatch.setattr(_progress, "_in_notebook", lambda: False)


@pytest.fixture
def notebook(monkeypatch):
    """A Jupyter kernel: standard error is a stream that is no terminal."""
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: False)
    monkeypatch.setattr(_progress, "_in_notebook", lambda: True)


@pytest.fixture
def without_tqdm(monkeypatch):
    for name in ("tqdm", "tqdm.auto", "tqdm.std"):
        monkeypatch.setitem(sys.modules, name, None)  # ``import`` raises ImportError


@pytest.fixture
def every_step(monkeypatch):
    """The plain-text report writes a line at every step."""
    monkeypatch.setattr(_progress, "TEXT_INTERVAL", 0.0)


def _segments(text: str) -> list[str]:
    """The successive renderings of a bar (tqdm redraws a line after ``\\r``)."""
    return [s for s in re.split(r"[\r\n]", text) if s.strip()]


# --- where progress shows ---------------------------------------------------------------------
def test_notebook_stream_shows_a_bar_at_verbose_1_and_nothing_at_0(notebook, capsys):
    pytest.importorskip("tqdm")
    with progress(total=10, desc="fit demo", verbose=0) as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""
    with progress(total=10, desc="fit demo", verbose=1, unit="pass") as bar:
        assert not isinstance(bar, SilentProgress)
        bar.update(4)
        bar.refresh()
        bar.update(6)
    err = capsys.readouterr().err
    assert "fit demo" in err and "4/10" in err


def test_notebook_detection_outside_a_kernel_is_false():
    assert _progress._in_notebook() is False  # pytest runs no IPython kernel


@pytest.mark.parametrize("shell_module, expected", [
    ("ipykernel.zmqshell", True),  # Jupyter notebook / lab / VS Code
    ("google.colab._shell", True),
    ("IPython.terminal.interactiveshell", False),  # plain IPython: a terminal
])
def test_notebook_detection_reads_the_running_shell(monkeypatch, shell_module, expected):
    import types

    shell_cls = type("Shell", (), {"__module__": shell_module})
    fake_ipython = types.ModuleType("IPython")
    fake_ipython.get_ipython = lambda: shell_cls()
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert _progress._in_notebook() is expected
    fake_ipython.get_ipython = lambda: None  # ipykernel imported, but no kernel running
    assert _progress._in_notebook() is False


def test_explicit_stream_shows_a_bar_off_a_terminal(no_tty):
    pytest.importorskip("tqdm")
    out = io.StringIO()
    with progress(range(5), desc="rows", verbose=1, file=out) as bar:
        assert list(bar) == [0, 1, 2, 3, 4]
    assert "rows" in out.getvalue() and "/5" in out.getvalue()
    silent = io.StringIO()
    assert isinstance(progress(range(5), verbose=0, file=silent), SilentProgress)
    assert silent.getvalue() == ""


def test_redirected_stderr_gets_plain_lines_not_a_redrawn_bar(no_tty, every_step, capsys):
    with progress(total=4, desc="grid", verbose=1, unit="fit") as bar:
        assert isinstance(bar, TextProgress)
        for _ in range(4):
            bar.update()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[:4] == [ln for ln in lines[:4] if ln.startswith("grid: ")]
    assert [re.search(r"(\d+)/4 fit", ln).group(1) for ln in lines[:4]] == ["1", "2", "3", "4"]
    assert lines[-1].startswith("grid: done, 4 fit in ")


def test_short_loops_stay_quiet_off_a_terminal(no_tty, capsys):
    with progress(range(100), desc="quick", verbose=1) as bar:
        for _ in bar:
            pass
    assert capsys.readouterr().err == ""  # under TEXT_INTERVAL: no line, no closing line


# --- the plain-text fallback without tqdm ------------------------------------------------------
@pytest.mark.parametrize("place", ["terminal", "notebook", "file"])
def test_without_tqdm_a_line_now_and_then(monkeypatch, without_tqdm, every_step, capsys, place):
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: place == "terminal")
    monkeypatch.setattr(_progress, "_in_notebook", lambda: place == "notebook")
    out = io.StringIO() if place == "file" else None
    bar = progress(total=8, desc="epochs", verbose=1, unit="epoch", file=out)
    assert isinstance(bar, TextProgress)
    bar.update(2)
    bar.set_postfix(loss=0.5)
    bar.update(2)
    bar.close()
    text = out.getvalue() if out is not None else capsys.readouterr().err
    lines = text.splitlines()
    assert lines[0].startswith("epochs: 2/8 epoch (25%)")
    assert lines[1].startswith("epochs: 4/8 epoch (50%)") and lines[1].endswith("loss=0.5")
    assert lines[-1].startswith("epochs: done, 4 epoch in ")
    assert isinstance(progress(total=8, verbose=0), SilentProgress)


def test_text_estimate_is_elapsed_per_step_times_steps_left(monkeypatch):
    clock = iter([0.0, 10.0, 10.0])  # start, the update, the line
    monkeypatch.setattr(_progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = TextProgress(total=5, desc="d", file=out, interval=0.0)
    bar.update(1)  # 10 s per step, 4 steps left: 40 s
    assert out.getvalue().strip() == "d: 1/5 it (20%), 00:10 elapsed, ~00:40 left"


# --- one estimate of the time left -------------------------------------------------------------
def test_text_lines_carry_one_estimate_a_bound_until_set_total(no_tty, every_step, capsys):
    bar = progress(total=1000, desc="CG", verbose=1, unit="pass", upper_bound=True)
    bar.update()
    bar.set_total(40)
    bar.update()
    err = capsys.readouterr().err.splitlines()
    assert all(ln.count("left") == 1 for ln in err)
    assert "1/1000 pass" in err[0] and "at most" in err[0]
    assert "2/40 pass" in err[1] and "at most" not in err[1] and "~" in err[1]


def test_tqdm_bar_has_one_estimate_a_bound_until_set_total(no_tty):
    pytest.importorskip("tqdm")
    out = io.StringIO()
    bar = progress(total=1000, desc="CG", verbose=1, unit="pass", upper_bound=True, file=out)
    bar.update(3)
    bar.refresh()
    bound = _segments(out.getvalue())[-1]
    assert "3/1000" in bound and bound.count("at most") == 1 and "<" not in bound
    bar.set_total(12)
    bar.refresh()
    revised = _segments(out.getvalue())[-1]
    # tqdm's own estimate only, after "<", now of the expected count
    assert "3/12" in revised and "at most" not in revised and revised.count("<") == 1
    bar.close()


def test_set_total_on_every_kind_of_bar(no_tty):
    for bar in (SilentProgress(total=9), TextProgress(total=9, file=io.StringIO())):
        bar.set_total(4)
        assert bar.total == 4 and len(bar) == 4


def test_steps_to_reach_is_the_geometric_extrapolation():
    # rate 0.1 per step from 1e-3: 1e-6 is three steps away
    assert steps_to_reach([1.0, 0.1, 0.01, 0.001], 1e-6, cap=100) == 3
    # rate 0.5 over the last five steps: log(1e-3 / 2^-6) / log(0.5) = 3.97 -> 4
    hist = [0.5 ** k for k in range(7)]
    expected = math.ceil(math.log(1e-3 / hist[-1]) / math.log(0.5))
    assert steps_to_reach(hist, 1e-3, cap=100) == expected == 4
    assert steps_to_reach(hist, 1e-30, cap=50) == 50  # capped by the steps left
    assert steps_to_reach([1.0, 1.0, 1.0], 1e-6, cap=7) == 7  # no decrease: the bound
    assert steps_to_reach([1.0, 2.0, 4.0], 1e-6, cap=7) == 7  # growth: the bound
    assert steps_to_reach([1.0, float("nan"), 0.5], 1e-6, cap=7) == 7
    assert steps_to_reach([1.0, 1e-7], 1e-6, cap=7) == 0  # already there
    assert steps_to_reach([], 1e-6, cap=7) == 7


# --- estimators and solvers with verbose -------------------------------------------------------
def _sine(n=60, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.randn(n)


def test_path_cv_estimator_reports_progress_and_the_same_model(no_tty, every_step, capsys):
    from kernelflow.estimators.path_cv import KernelSignGradientCV

    X, y = _sine()
    kw = dict(sigmas=[0.05, 0.5, 5.0], cv=4, max_iter=400, random_state=0)
    quiet = KernelSignGradientCV(**kw).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = KernelSignGradientCV(**kw, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "path CV (sign, 3 bandwidths)" in err and "/1200 step" in err
    last = [ln for ln in err.splitlines() if ln.startswith("path CV")][-2]
    assert "1200/1200 step" in last  # every bandwidth accounted for, early stops included
    # progress changes how the grid is cut into calls, not the result
    np.testing.assert_array_equal(quiet.cv_mse_, loud.cv_mse_)
    np.testing.assert_array_equal(quiet.best_iter_, loud.best_iter_)
    assert quiet.sigma_ == loud.sigma_ and quiet.n_iter_ == loud.n_iter_


def test_path_cv_tensor_backend_counts_every_group(no_tty, every_step, capsys):
    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.path_cv import early_stopping_path_cv

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, dtype=torch.float64, generator=g) * 6
    y = torch.sin(X[:, 0])
    folds = [list(range(i, 40, 4)) for i in range(4)]
    kernels = [Gaussian(s) for s in (0.1, 0.5, 1.0, 2.0)]
    a = early_stopping_path_cv(X, y, kernels, folds, backend="torch", max_iter=300)
    b = early_stopping_path_cv(X, y, kernels, folds, backend="torch", max_iter=300, verbose=1)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("path CV")]
    counts = [int(re.search(r"(\d+)/1200 step", ln).group(1)) for ln in lines[:-1]]
    assert counts == sorted(counts) and counts[-1] == 1200
    torch.testing.assert_close(a.cv_mse, b.cv_mse)


@pytest.mark.parametrize("cv", [None, 3])
def test_kernel_ridge_cv_verbose_reports_the_grid(no_tty, every_step, capsys, cv):
    from kernelflow.estimators import KernelRidgeCV

    X, y = _sine()
    quiet = KernelRidgeCV(sigmas=[0.3, 1.0], cv=cv).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = KernelRidgeCV(sigmas=[0.3, 1.0], cv=cv, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    expected = "2/2 bandwidth" if cv is None else "6/6 fit"
    assert expected in err
    assert (quiet.sigma_, quiet.alpha_) == (loud.sigma_, loud.alpha_)


def test_cv_estimator_in_a_notebook_draws_a_tqdm_bar(notebook, capsys):
    pytest.importorskip("tqdm")
    from kernelflow.estimators.path_cv import KernelGradientDescentCV

    X, y = _sine()
    KernelGradientDescentCV(sigmas=[0.5, 5.0], cv=3, max_iter=200, random_state=0,
                            verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "path CV (gradient, 2 bandwidths)" in err and "/400" in err


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_penalized_cv_verbose_reports_the_grid(no_tty, every_step, capsys):
    from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV

    X, y = _sine(40)
    PenalizedKernelRegressorCV(sigmas=[0.5, 2.0], alphas=[1e-3, 1e-1], penalty="l1", cv=3,
                               max_iter=50, random_state=0, verbose=1).fit(X, y)
    assert "2/2 bandwidth" in capsys.readouterr().err


def test_robust_nystrom_revises_its_expected_passes(no_tty, every_step, capsys):
    from kernelflow.estimators import NystromRobustRegressor

    X, y = _sine(200)
    NystromRobustRegressor(n_components=20, sigma=0.5, max_iter=300, random_state=0,
                           verbose=1).fit(X, y)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("Nystrom")]
    assert lines and all(ln.count("left") <= 1 for ln in lines)
    totals = {int(re.search(r"/(\d+) it", ln).group(1)) for ln in lines if " left" in ln}
    assert totals and min(totals) < 300  # the bound replaced by an expected count


def test_verbose_0_estimators_are_silent_even_on_a_terminal(monkeypatch, capsys):
    from kernelflow.estimators.path_cv import KernelSignGradientCV

    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(_progress, "TEXT_INTERVAL", 0.0)
    X, y = _sine()
    KernelSignGradientCV(sigmas=[0.5], cv=3, max_iter=100, random_state=0).fit(X, y)
    assert capsys.readouterr().err == ""


def test_doubly_stochastic_counts_the_rows_of_every_batch(no_tty, every_step, capsys):
    from kernelflow.estimators import DoublyStochasticRegressor

    X, y = _sine(200)
    kw = dict(max_iter=3, batch_size=64, random_state=0)
    quiet = DoublyStochasticRegressor(**kw).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = DoublyStochasticRegressor(**kw, verbose=1).fit(X, y)
    lines = capsys.readouterr().err.splitlines()
    counts = [int(re.search(r": (\d+)/600 row", ln).group(1)) for ln in lines[:-1]]
    # batches of 64, 64, 64, 8 rows per epoch of 200 rows
    assert counts == [e * 200 + r for e in range(3) for r in (64, 128, 192, 200)]
    assert lines[-1].startswith("DoublyStochasticRegressor: done, 600 row")
    np.testing.assert_array_equal(quiet.predict(X), loud.predict(X))


def test_hyperparameter_search_counts_its_evaluations(no_tty, every_step, capsys):
    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.hyperparameters import learn_hyperparameters

    X, y = _sine(50)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    kw = dict(criterion="loo", n_starts=2, max_iter=8)
    quiet = learn_hyperparameters(Xt, yt, Gaussian(1.0), **kw)
    assert capsys.readouterr().err == ""
    loud = learn_hyperparameters(Xt, yt, Gaussian(1.0), **kw, verbose=1)
    lines = capsys.readouterr().err.splitlines()
    # 3 penalty starts + 1 bandwidth start screened, one L-BFGS run of at most 10 evaluations
    assert lines and all("/14 eval" in ln and "at most" in ln for ln in lines[:-1])
    assert lines[-1].startswith("hyperparameters (loo): done")
    assert quiet.alpha == loud.alpha and quiet.kernel.sigma == loud.kernel.sigma


# --- Nyström solvers: the Gram pass, its check pass and CG --------------------------------------
@pytest.fixture
def eager_tqdm(monkeypatch):
    """tqdm redraws at every update (by default it waits 0.1 s between two drawings)."""
    make = _progress._tqdm_class

    def eager(auto):
        class Eager(make(auto)):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, mininterval=0, miniters=1, **kwargs)
        return Eager

    monkeypatch.setattr(_progress, "_tqdm_class", eager)


def _cube(n=1000, d=3, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, d))
    return X, np.sin(X.sum(1)) + 0.1 * rng.randn(n)


def _drawings(err: str, desc: str) -> list[str]:
    return [s for s in _segments(err) if s.startswith(desc)]


@pytest.mark.parametrize("check_pass", [False, True])
def test_nystrom_direct_fit_shows_its_passes_in_a_notebook(notebook, eager_tqdm, capsys,
                                                           monkeypatch, check_pass):
    pytest.importorskip("tqdm")
    from kernelflow.estimators import NystromKernelRidge
    from kernelflow.solvers import nystrom

    if check_pass:  # the residual recomputed from the rows: a second pass over the data
        monkeypatch.setattr(nystrom, "_CHECK_MIN", -1.0)
    X, y = _cube(600)
    kw = dict(n_components=40, sigma=1.0, alpha=1e-3, solver="direct", block_size=100,
              random_state=0)
    quiet = NystromKernelRidge(**kw).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = NystromKernelRidge(**kw, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    passes = ["Nystrom Gram"] + (["Nystrom residual check"] if check_pass else [])
    for desc in passes:
        drawn = _drawings(err, desc)
        assert any("600/600" in s for s in drawn)  # every row counted, in blocks of 100
        assert any(re.search(r"\d+/600 \[\d\d:\d\d<\d\d:\d\d,", s) for s in drawn)
        # one estimate of the time left (tqdm's, after "<"), nothing beside it
        assert all(s.count("<") == 1 and "left" not in s and "eta" not in s for s in drawn)
    assert ("Nystrom residual check" in err) is check_pass
    assert "Nystrom CG" not in err
    np.testing.assert_array_equal(quiet.dual_coef_, loud.dual_coef_)
    np.testing.assert_array_equal(quiet.predict(X), loud.predict(X))


def test_nystrom_cg_fit_shows_one_estimate_revised_from_the_bound(notebook, eager_tqdm, capsys):
    pytest.importorskip("tqdm")
    from kernelflow.estimators import NystromKernelRidge

    X, y = _cube()
    kw = dict(n_components=200, sigma=1.0, alpha=1e-3, solver="cg", max_iter=300,
              random_state=0)
    quiet = NystromKernelRidge(**kw).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = NystromKernelRidge(**kw, verbose=1).fit(X, y)
    drawn = _drawings(capsys.readouterr().err, "Nystrom CG")
    assert drawn and quiet.n_iter_ < 300  # stopped by its tolerance
    # one estimate per drawing: "at most ... left" while max_iter is the total, then tqdm's
    assert all(s.count("<") + s.count("at most") == 1 and "eta" not in s for s in drawn)
    assert "/300 " in drawn[0] and "at most" in drawn[0]
    totals = [int(re.search(r"\d+/(\d+) ", s).group(1)) for s in drawn]
    assert min(totals) < 300  # the bound replaced by the passes expected
    assert all("residual=" in s for s in drawn if re.search(r" [1-9]\d*/", s))
    np.testing.assert_array_equal(quiet.dual_coef_, loud.dual_coef_)
    assert quiet.n_iter_ == loud.n_iter_


def test_nystrom_cg_text_lines_carry_one_estimate(no_tty, every_step, capsys):
    from kernelflow.estimators import NystromKernelRidge

    X, y = _cube()
    NystromKernelRidge(n_components=200, sigma=1.0, alpha=1e-3, solver="cg", max_iter=300,
                       random_state=0, verbose=1).fit(X, y)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("Nystrom CG")]
    passes = lines[:-1]
    assert passes and lines[-1].startswith("Nystrom CG: done, ")
    assert all(ln.count("left") == 1 and "eta" not in ln for ln in passes)
    counts = [int(re.search(r": (\d+)/", ln).group(1)) for ln in passes]
    assert counts == list(range(1, len(passes) + 1))
    # the residual shown on a line is the one of the pass it counts
    assert all("residual=" in ln for ln in passes)


def test_nystrom_variance_pass_shows_its_rows_and_keeps_the_result(monkeypatch, capsys):
    """The variance pass (as costly as the Gram pass) reports its rows; results unchanged."""
    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    from kernelflow.utils import _progress

    monkeypatch.setattr(_progress, "TEXT_INTERVAL", 0.0)
    rng = np.random.RandomState(0)
    X = rng.randn(600, 3)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(600)
    params = dict(n_components=40, compute_variance="dtc", random_state=0)
    quiet = NystromKernelRidge(**params).fit(X, y)
    assert "Nystrom variance" not in capsys.readouterr().err
    loud = NystromKernelRidge(**params, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "Nystrom variance: 600/600 row" in err
    assert np.array_equal(quiet.predict(X[:7], return_std=True)[1],
                          loud.predict(X[:7], return_std=True)[1])
