"""Non-convergence is never silent: every Nyström code path warns and reports it."""

import numpy as np
import pytest
import torch
from _helpers import regression_data
from sklearn.exceptions import ConvergenceWarning

from kernelflow.estimators.nystrom_logistic import NystromKernelLogisticRegression
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.kernels import Gaussian
from kernelflow.operators import Options
from kernelflow.solvers import nystrom as nys
from kernelflow.sources import ArraySource


def _data(n=800, seed=0):
    return regression_data(n, 3, lambda X: np.sin(X[:, 0]) + X[:, 1] * X[:, 2] / 3,
                           bounds=(-3, 3), seed=seed)


@pytest.mark.parametrize("store", [True, None, False])
def test_solver_reports_max_iter_on_every_cache_mode(store):
    # stored, partly stored (a budget for a few row blocks) and streamed K_nM
    X, y = _data()
    Xt, src = torch.as_tensor(X), ArraySource(torch.as_tensor(X), torch.as_tensor(y))
    opts = Options(memory_budget=200_000) if store is None else None
    sol = nys.nystrom_krr(src, Gaussian(1.5), Xt[:100], 1e-6, max_iter=3, store_kernel=store,
                          solver="cg", options=opts, block_size=100)
    assert not sol.converged and sol.stop_reason == "max_iter" and sol.n_iter == 3
    assert sol.residual == pytest.approx(sol.residual_norms[-1]) and sol.residual > sol.tolerance


def test_streamed_estimator_warns_with_residual_and_remedy(monkeypatch):
    seen = []
    real = nys.nystrom_kernel_cache

    def no_room(*args, **kwargs):  # as if K_nM did not fit: every pass recomputes it
        seen.append(True)
        return None

    monkeypatch.setattr(nys, "nystrom_kernel_cache", no_room)
    X, y = _data()
    with pytest.warns(ConvergenceWarning,
                      match=r"relative residual \d\.\d+e[-+]\d+ above tol.*Increase max_iter"):
        m = NystromKernelRidge(n_components=100, alpha=1e-6, sigma=1.5, max_iter=3, solver="cg",
                               random_state=0).fit(X, y)
    assert seen and m.converged_ is False and m.n_iter_ == 3 and m.residual_ > 1e-3
    monkeypatch.setattr(nys, "nystrom_kernel_cache", real)


def test_float32_estimator_warns_when_cut_short():
    X, y = _data()
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        m = NystromKernelRidge(n_components=100, alpha=1e-6, sigma=1.5, max_iter=2, solver="cg",
                               random_state=0).fit(X.astype(np.float32), y.astype(np.float32))
    assert m.converged_ is False


def test_converged_fit_is_quiet_and_says_so():
    import warnings

    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        m = NystromKernelRidge(n_components=100, alpha=1e-3, sigma=1.5, solver="cg",
                               random_state=0).fit(X, y)
    assert m.converged_ is True and m.solver_ == "cg" and m.n_iter_ < m.max_iter


def test_logistic_warns_with_gradient_norm_and_remedy():
    X, y = _data(400)
    labels = (y > 0).astype(int)
    with pytest.warns(ConvergenceWarning, match=r"gradient norm .*Increase max_iter"):
        m = NystromKernelLogisticRegression(n_components=50, alpha=1e-8, max_iter=1,
                                            random_state=0).fit(X, labels)
    assert m.converged_ is False


def _one_breakdown_warning(record):
    # one warning, from the solver, with the remedy; no second ConvergenceWarning
    messages = [str(w.message) for w in record]
    assert len(messages) == 1, messages
    assert "broke down" in messages[0] and "float64 rows" in messages[0]
    assert not issubclass(record[0].category, ConvergenceWarning)


def _fit_recording(solver):
    """The estimator fitted with ``solver`` on :func:`_data`, and its one breakdown warning."""
    import warnings

    X, y = _data()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        m = NystromKernelRidge(n_components=100, alpha=1e-3, sigma=1.5, solver=solver,
                               random_state=0).fit(X, y)
    _one_breakdown_warning(record)
    return m, record


def test_pcg_breakdown_is_reported_once_with_its_remedy(monkeypatch):

    real = nys.nystrom_normal_matvec

    def negated(*args, **kwargs):  # an indefinite system: K_nM^T K_nM with the wrong sign
        return -real(*args, **kwargs)

    monkeypatch.setattr(nys, "nystrom_normal_matvec", negated)
    m, record = _fit_recording("cg")
    assert "solver='direct'" in str(record[0].message)
    assert m.converged_ is False and m.n_iter_ == 0


def test_eigen_cg_breakdown_is_reported_once_and_keeps_the_least_residual(monkeypatch):

    import kernelflow.solvers.nystrom_eigen_cg as ecg

    # a penalty product of the wrong sign, large enough to make the first direction negative
    monkeypatch.setattr(ecg, "_kmm_product", lambda run: (lambda a: -1e9 * a))
    m, record = _fit_recording("eigen_cg")
    assert "smaller rank" in str(record[0].message)
    assert m.converged_ is False and m.n_iter_ == 0
    assert not np.asarray(m.dual_coef_).any()  # the start, the only iterate


def test_auto_float32_falls_back_to_the_direct_solve_on_pcg_breakdown(monkeypatch):
    import warnings

    real = nys.nystrom_normal_matvec

    def negated(*args, **kwargs):  # an indefinite system: PCG breaks down at once
        return -real(*args, **kwargs)

    monkeypatch.setattr(nys, "nystrom_normal_matvec", negated)
    monkeypatch.setattr(nys, "choose_solver", lambda *a, **k: "cg")
    X, y = _data()
    kw = dict(n_components=100, alpha=1e-3, sigma=1.5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = NystromKernelRidge(solver="auto", **kw).fit(X.astype(np.float32),
                                                        y.astype(np.float32))
    assert m.solver_ == "direct" and m.converged_
    assert m.solver_history_ == [("cg", 0), ("direct", 1)]
    monkeypatch.undo()
    ref = NystromKernelRidge(solver="direct", **kw).fit(X, y)
    np.testing.assert_allclose(m.predict(X), ref.predict(X), rtol=0, atol=1e-4)
