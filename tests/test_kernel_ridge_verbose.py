"""``KernelRidge(verbose=...)``: progress of the hyperparameter search, same model either way."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kernelflow.estimators import KernelRidge
from kernelflow.utils import _progress


def _sine(n=50, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.randn(n)


def _assert_same_model(quiet, loud, X):
    assert quiet.alpha_ == loud.alpha_ and quiet.sigma_ == loud.sigma_
    assert quiet.signal_variance_ == loud.signal_variance_
    np.testing.assert_array_equal(np.asarray(quiet.dual_coef_), np.asarray(loud.dual_coef_))
    np.testing.assert_array_equal(quiet.predict(X), loud.predict(X))


def test_search_in_a_notebook_draws_a_bar_and_learns_the_same_model(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    # a Jupyter kernel: standard error is a stream that is no terminal
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: False)
    monkeypatch.setattr(_progress, "_in_notebook", lambda: True)
    X, y = _sine()
    kw = dict(alpha=0.1, sigma=1.0, learn_hyperparameters="marginal_likelihood")
    quiet = KernelRidge(**kw).fit(X, y)
    assert capsys.readouterr().err == ""
    loud = KernelRidge(**kw, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "hyperparameters (marginal_likelihood)" in err
    assert re.search(r"\d+/\d+ \[", err) and "eval/s" in err  # count and rate
    _assert_same_model(quiet, loud, X)


def test_search_off_a_terminal_writes_plain_lines(monkeypatch, capsys):
    # standard error sent to a file: one plain line per step here (interval 0), no redrawing
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: False)
    monkeypatch.setattr(_progress, "_in_notebook", lambda: False)
    monkeypatch.setattr(_progress, "TEXT_INTERVAL", 0.0)
    X, y = _sine()
    kw = dict(alpha=0.1, sigma=1.0, learn_hyperparameters="loo")
    quiet = KernelRidge(**kw).fit(X, y)
    loud = KernelRidge(**kw, verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) >= 2 and all(ln.startswith("hyperparameters (loo): ") for ln in lines)
    assert lines[-1].startswith("hyperparameters (loo): done")
    _assert_same_model(quiet, loud, X)


def test_verbose_without_a_search_is_silent(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(_progress, "TEXT_INTERVAL", 0.0)
    X, y = _sine()
    KernelRidge(alpha=0.1, sigma=1.0, verbose=2).fit(X, y)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bad", [-1, "loud", 1.5])
def test_bad_verbose_is_refused(bad):
    X, y = _sine(10)
    with pytest.raises(ValueError, match="verbose"):
        KernelRidge(verbose=bad).fit(X, y)


def test_verbose_is_a_parameter():
    assert KernelRidge().get_params()["verbose"] == 0
    assert KernelRidge(verbose=1).set_params(verbose=0).verbose == 0
