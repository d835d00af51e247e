"""Estimators fitted inside a process group distribute themselves (distributed="auto").

Two Gloo processes each pass their own rows (uneven shards) to the ordinary ``fit``; the models
must equal the single-process fit on the concatenated rows. Cross-validating estimators, given
the whole training set on every process, spread their bandwidth grid and select the same model.
"""


import numpy as np
import pytest
import torch
from _helpers import one_thread, regression_data, sine_cosine
from sklearn.base import clone

from kernelflow.distributed import rank, spawn
from kernelflow.estimators.doubly_stochastic_classifier import DoublyStochasticClassifier
from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
from kernelflow.estimators.kernel_ridge_cv import KernelRidgeCV
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
from kernelflow.estimators.path_cv import KernelGradientDescentCV, KernelSignGradientCV
from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV
from kernelflow.operators import Options

RTOL = 1e-6
N_NYS, CUT_NYS = 300, 111  # process 0 holds rows [0, 111), process 1 the other 189
N_DS, CUT_DS = 100, 37  # 37 and 63 rows


def _data(n, seed=0):
    return regression_data(n, 2, sine_cosine, bounds=(-3, 3), seed=seed)


def _weights(n):
    return 0.5 + np.abs(np.cos(np.arange(n)))


def _fits():
    """(name, estimator, data kind, n, cut): fitted on each process's rows and on all rows."""
    return [
        # median-heuristic bandwidth (sigma=None) from the global rows
        ("nystrom_krr", NystromKernelRidge(20, alpha=1e-2, random_state=0, max_iter=200,
                                           solver="cg", tol=1e-12),
         "plain", N_NYS, CUT_NYS),
        ("nystrom_krr_ard", NystromKernelRidge(20, alpha=1e-2, sigma="ard", random_state=0,
                                               max_iter=200, solver="cg", tol=1e-12),
         "plain", N_NYS, CUT_NYS),
        ("nystrom_krr_weighted_2d", NystromKernelRidge(30, alpha=1e-2, sigma=1.0,
                                                       random_state=0, max_iter=200,
                                                       solver="cg", tol=1e-12),
         "weighted_2d", N_NYS, CUT_NYS),
        # many centres: CG with the eigen-preconditioner (float64, weighted, two targets)
        ("nystrom_eigen_cg", NystromKernelRidge(30, alpha=1e-2, sigma=1.0, random_state=0,
                                                max_iter=300, solver="eigen_cg", tol=1e-12),
         "weighted_2d", N_NYS, CUT_NYS),
        ("nystrom_huber_early", NystromRobustRegressor(30, loss="huber", max_iter=20,
                                                       early_stopping=True, random_state=0),
         "outliers", N_NYS, CUT_NYS),
        ("nystrom_lad", NystromRobustRegressor(30, sigma=1.0, max_iter=15, random_state=0),
         "outliers", N_NYS, CUT_NYS),
        ("ds_regressor", DoublyStochasticRegressor(batch_size=16, block_size=16, max_iter=2,
                                                   early_stopping=True, random_state=0),
         "plain", N_DS, CUT_DS),
        ("ds_regressor_weighted", DoublyStochasticRegressor(sigma=1.0, batch_size="auto",
                                                            block_size=16, max_iter=2,
                                                            random_state=0),
         "weighted", N_DS, CUT_DS),
        # three classes, one of them only on process 1: classes_ is the union
        ("ds_classifier", DoublyStochasticClassifier(loss="log_loss", sigma=1.0, batch_size=16,
                                                     block_size=16, max_iter=2,
                                                     random_state=0),
         "labels", N_DS, CUT_DS),
    ]


#: one byte below one 30 x 30 float64 matrix: "cg" and "direct" refuse, "auto" runs eigen-CG
SHORT_BUDGET = 30 * 30 * 8 - 1


def _auto_beyond_budget(budget):
    return NystromKernelRidge(30, alpha=1e-2, sigma=1.0, random_state=0, max_iter=300,
                              tol=1e-12,
                              options=None if budget is None else Options(memory_budget=budget))


def _xy(kind, n):
    X, y = _data(n)
    w = None
    if kind == "outliers":
        y = y.copy()
        y[::25] += 20.0
    elif kind == "weighted":
        w = _weights(n)
    elif kind == "weighted_2d":
        y, w = np.stack([y, np.cos(X[:, 1])], 1), _weights(n)
    elif kind == "labels":
        y = np.where(X[:, 0] > 1.5, 2, (X[:, 1] > 0).astype(int))
        y[:CUT_DS][y[:CUT_DS] == 2] = 1  # class 2 only among process 1's rows
    return X, y, w


def _fit(est, X, y, w):
    return est.fit(X, y) if w is None else est.fit(X, y, sample_weight=w)


def _summary(model, X):
    coef = model.coef_ if hasattr(model, "coef_") else model.dual_coef_
    pred = model.decision_function(X) if hasattr(model, "decision_function") else \
        model.predict(X)
    out = {"coef": np.asarray(coef, dtype=np.float64),
           "pred": np.asarray(pred, dtype=np.float64)}
    if hasattr(model, "kernel_"):
        out["sigma"] = np.asarray(getattr(model.kernel_, "sigma", np.nan), dtype=np.float64)
    if hasattr(model, "classes_"):
        out["classes"] = np.asarray(model.classes_)
    if hasattr(model, "centers_"):
        out["centers"] = np.asarray(model.centers_)
    return out


def _cv_estimators():
    return {
        "sign_cv": KernelSignGradientCV(sigmas=[0.1, 0.5, 1.0, 3.0], cv=4, learning_rate=0.05,
                                        max_iter=300, n_iter_no_change=30, random_state=0),
        "gd_cv": KernelGradientDescentCV(sigmas=3, cv=3, learning_rate=0.1, max_iter=200,
                                         n_iter_no_change=20, random_state=0),
        "penalized_l1_cv": PenalizedKernelRegressorCV("l1", alphas=[1e-2, 1e-1, 1.0],
                                                      sigmas=[0.3, 1.0, 3.0], cv=3, tol=1e-6,
                                                      max_iter=3000, random_state=0),
        "penalized_l2_cv": PenalizedKernelRegressorCV("l2", alphas=4, sigmas=3, cv=3,
                                                      random_state=0),
        "krr_loo_cv": KernelRidgeCV(alphas=[1e-3, 1e-1, 1.0], sigmas=[0.3, 1.0, 3.0]),
    }


def _cv_summary(model, X):
    out = {"sigma": model.sigma_, "pred": np.asarray(model.predict(X), dtype=np.float64)}
    for name in ("alpha_", "n_iter_"):
        if hasattr(model, name):
            out[name] = getattr(model, name)
    scores = getattr(model, "cv_mse_", None)
    out["scores"] = np.asarray(scores if scores is not None else
                               model.cv_results_["mean_error"], dtype=np.float64)
    return out


#: centres of the instrumented eigen-CG run (odd: the two blocks differ by one row)
M_SPLIT = 31


def _eigen_cg_products(X, y, part=slice(None)):
    """eigen-CG on rows ``part`` with every K_MM v product counted: (rows of K_MM, kernel
    entries evaluated, index of the block's first centre) per product, and the coefficients."""
    import kernelflow.solvers.nystrom_eigen_cg as module
    from kernelflow.kernels import Gaussian
    from kernelflow.sources import ArraySource

    X, y = torch.as_tensor(X), torch.as_tensor(y)
    C, products = X[:M_SPLIT], []

    class Counting(module.KernelOperator):
        def _tile(self, i0, i1, j0, j1):
            self.entries += (i1 - i0) * (j1 - j0)
            return super()._tile(i0, i1, j0, j1)

        def _matmul(self, V):
            self.entries = 0
            out = super()._matmul(V)
            first = int((C.to(self.dtype) == self.X1[0]).all(1).nonzero()[0, 0])
            products.append((self.shape[0], self.entries, first))
            return out

    original, module.KernelOperator = module.KernelOperator, Counting
    try:
        sol = module.nystrom_eigen_cg(ArraySource(X[part], y[part]), Gaussian(1.0), C, 1e-2,
                                      rank=10, tol=1e-12, max_iter=300)
    finally:
        module.KernelOperator = original
    return {"products": products, "coef": sol.coef.numpy(), "n_iter": sol.n_iter}


def _worker():
    """Runs on each of the 2 processes: plain fit(X_mine, y_mine) calls, nothing else."""
    r = rank()
    out = {}
    for name, est, kind, n, cut in _fits():
        X, y, w = _xy(kind, n)
        part = slice(0, cut) if r == 0 else slice(cut, n)
        model = _fit(est, X[part], y[part], None if w is None else w[part])
        out[name] = _summary(model, X[:40])
    # partial_fit: two chunks, each split 37 / 63 over the processes
    X, y = _data(2 * N_DS)
    est = DoublyStochasticRegressor(sigma=1.0, batch_size=16, block_size=16, random_state=0)
    for c in range(2):
        lo = c * N_DS
        part = slice(lo, lo + CUT_DS) if r == 0 else slice(lo + CUT_DS, lo + N_DS)
        est.partial_fit(X[part], y[part])
    out["partial_fit"] = _summary(est, X[:40])
    # too many values to gather: centres from a global subsample, as on a DataSource
    from kernelflow.distributed import auto

    limit, auto.GATHER_LIMIT = auto.GATHER_LIMIT, 0
    try:
        X, y = _data(N_NYS)
        part = slice(0, CUT_NYS) if r == 0 else slice(CUT_NYS, N_NYS)
        est = NystromKernelRidge(30, alpha=1e-2, random_state=0, max_iter=200, solver="cg",
                                 tol=1e-12)
        out["no_gather_nystrom"] = _summary(est.fit(X[part], y[part]), X[:40])
        X, y = _data(N_DS)
        part = slice(0, CUT_DS) if r == 0 else slice(CUT_DS, N_DS)
        est = DoublyStochasticRegressor(batch_size=16, block_size=16, max_iter=2, random_state=0)
        out["no_gather_ds"] = _summary(est.fit(X[part], y[part]), X[:40])
    finally:
        auto.GATHER_LIMIT = limit
    # "auto" where only process 1's budget is below one M x M float64 matrix: every process
    # runs eigen-CG, with the smaller budget's preconditioner rank
    X, y = _data(N_NYS)
    part = slice(0, CUT_NYS) if r == 0 else slice(CUT_NYS, N_NYS)
    model = _auto_beyond_budget(None if r == 0 else SHORT_BUDGET).fit(X[part], y[part])
    out["auto_beyond_budget"] = {**_summary(model, X[:40]), "solver": model.solver_}
    # a given precond_rank that fits process 0's budget but not process 1's: both refuse it
    # (SHORT_BUDGET holds a rank-9 preconditioner of 30 centres); rank 9 runs on both
    try:
        _auto_beyond_budget(None if r == 0 else SHORT_BUDGET).set_params(
            solver="eigen_cg", precond_rank=10).fit(X[part], y[part])
        out["rank_10"] = "fitted"
    except MemoryError as e:
        out["rank_10"] = str(e)
    model = _auto_beyond_budget(None if r == 0 else SHORT_BUDGET).set_params(
        solver="eigen_cg", precond_rank=9).fit(X[part], y[part])
    out["rank_9"] = _summary(model, X[:40])
    # distributed=False: each process fits its own rows alone, without communicating
    X, y = _data(N_NYS)
    part = slice(0, CUT_NYS) if r == 0 else slice(CUT_NYS, N_NYS)
    local = NystromKernelRidge(20, alpha=1e-2, random_state=0, distributed=False)
    out["local"] = _summary(local.fit(X[part], y[part]), X[:40])
    local_ds = DoublyStochasticRegressor(block_size=16, max_iter=2, random_state=0,
                                         distributed="off")
    out["local_ds"] = _summary(local_ds.fit(X[part], y[part]), X[:40])
    # cross-validation: every process passes the whole training set
    X, y = _data(60, seed=1)
    for name, est in _cv_estimators().items():
        out[name] = _cv_summary(est.fit(X, y), X[:20])
    from kernelflow.distributed.cv import cv_solver
    from kernelflow.solvers.path_cv import early_stopping_path_cv

    solver, folds = cv_solver(KernelSignGradientCV(random_state=None), early_stopping_path_cv,
                              torch.as_tensor(X), torch.as_tensor(y),
                              [np.arange(r, 60, 3)])  # process 0's folds go to every process
    out["dispatch"] = (solver is not early_stopping_path_cv, [f.tolist() for f in folds])
    X, y = _data(N_NYS)
    out["eigen_cg_products"] = _eigen_cg_products(
        X, y, slice(0, CUT_NYS) if r == 0 else slice(CUT_NYS, N_NYS))
    try:  # different training sets: a clear error on every process, no hang
        KernelRidgeCV(alphas=[1.0], sigmas=[1.0]).fit(X[: 30 + r], y[: 30 + r])
        out["cv_mismatch"] = "no error"
    except ValueError as exc:
        out["cv_mismatch"] = str(exc)
    return out


@pytest.fixture(scope="module")
def two_process():
    return spawn(_worker, 2, timeout=30, max_seconds=100)


def _close(a, b, rtol=RTOL):
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("name", [f[0] for f in _fits()])
def test_auto_distributed_fit_equals_single_process_on_concatenated_rows(two_process, name):
    est, kind, n = {f[0]: (f[1], f[2], f[3]) for f in _fits()}[name]
    X, y, w = _xy(kind, n)
    with one_thread():
        ref = _summary(_fit(clone(est), X, y, w), X[:40])
    for r in range(2):
        got = two_process[r][name]
        assert got["coef"].shape == ref["coef"].shape
        _close(got["coef"], ref["coef"])
        _close(got["pred"], ref["pred"])
        # the bandwidth (median heuristic when sigma=None) comes from the global rows
        np.testing.assert_allclose(got["sigma"], ref["sigma"], rtol=1e-12)
        if "centers" in ref:
            np.testing.assert_array_equal(got["centers"], ref["centers"])
        if "classes" in ref:
            np.testing.assert_array_equal(got["classes"], [0, 1, 2])
            np.testing.assert_array_equal(got["classes"], ref["classes"])
    np.testing.assert_array_equal(two_process[0][name]["coef"], two_process[1][name]["coef"])


def test_eigen_cg_on_two_processes_equals_single_process(two_process):
    # float64: predictions and coefficients to 1e-8 (both runs stop at tol=1e-12)
    est, kind, n = {f[0]: (f[1], f[2], f[3]) for f in _fits()}["nystrom_eigen_cg"]
    X, y, w = _xy(kind, n)
    with one_thread():
        ref = _fit(clone(est), X, y, w)
    assert ref.solver_ == "eigen_cg"
    p_ref = _summary(ref, X[:40])
    for r in range(2):
        _close(two_process[r]["nystrom_eigen_cg"]["pred"], p_ref["pred"], 1e-8)
        _close(two_process[r]["nystrom_eigen_cg"]["coef"], p_ref["coef"], 1e-8)


def test_eigen_cg_centre_product_is_split_over_the_processes(two_process):
    # each process evaluates only its contiguous block of rows of K_MM (16 and 15 of 31) in
    # every product, and the solution equals the single process's, which evaluates all of K_MM
    from kernelflow.solvers.nystrom_eigen_cg import _center_block

    X, y = _data(N_NYS)
    with one_thread():
        ref = _eigen_cg_products(X, y)
    assert {p[:2] for p in ref["products"]} == {(M_SPLIT, M_SPLIT * M_SPLIT)}
    blocks = [_center_block(M_SPLIT, 2, r) for r in range(2)]
    assert [b1 - b0 for b0, b1 in blocks] == [16, 15]
    for r, (b0, b1) in enumerate(blocks):
        got = two_process[r]["eigen_cg_products"]
        assert len(got["products"]) >= got["n_iter"] > 0
        assert set(got["products"]) == {(b1 - b0, (b1 - b0) * M_SPLIT, b0)}
        _close(got["coef"], ref["coef"], 1e-8)
    np.testing.assert_array_equal(two_process[0]["eigen_cg_products"]["coef"],
                                  two_process[1]["eigen_cg_products"]["coef"])


def test_auto_beyond_one_process_budget_runs_eigen_cg_everywhere(two_process):
    X, y = _data(N_NYS)
    with one_thread():
        ref = _auto_beyond_budget(SHORT_BUDGET).fit(X, y)
    assert ref.solver_ == "eigen_cg"
    p_ref = _summary(ref, X[:40])["pred"]
    for r in range(2):
        got = two_process[r]["auto_beyond_budget"]
        assert got["solver"] == "eigen_cg"
        _close(got["pred"], p_ref, 1e-8)
    # a given rank: refused together when one process's budget is short, else as one process
    with one_thread():
        ref = _auto_beyond_budget(SHORT_BUDGET).set_params(solver="eigen_cg", precond_rank=9)
        p_ref = _summary(ref.fit(X, y), X[:40])["pred"]
    for r in range(2):
        assert "rank-10 preconditioner of 30 centres" in two_process[r]["rank_10"]
        _close(two_process[r]["rank_9"]["pred"], p_ref, 1e-8)


def test_auto_distributed_partial_fit_equals_single_process(two_process):
    X, y = _data(2 * N_DS)
    est = DoublyStochasticRegressor(sigma=1.0, batch_size=16, block_size=16, random_state=0)
    with one_thread():
        for c in range(2):
            est.partial_fit(X[c * N_DS:(c + 1) * N_DS], y[c * N_DS:(c + 1) * N_DS])
    ref = _summary(est, X[:40])
    for r in range(2):
        _close(two_process[r]["partial_fit"]["coef"], ref["coef"])
        _close(two_process[r]["partial_fit"]["pred"], ref["pred"])


def test_beyond_the_gather_limit_fits_equal_the_data_source_fit(two_process):
    from kernelflow.distributed.fit import _BANDWIDTH_ROWS
    from kernelflow.kernels import median_heuristic
    from kernelflow.sources import ArraySource

    X, y = _data(N_NYS)
    # alpha = 1e-2: the coefficients themselves (not only the predictions) are determined far
    # below RTOL; at 1e-3 they reach 5e4 for predictions of order 1, and their agreement
    # measured the rounding of the summation order
    with one_thread():
        ref = _summary(NystromKernelRidge(30, alpha=1e-2, random_state=0, max_iter=200,
                                          solver="cg", tol=1e-12).fit(ArraySource(X, y)),
                       X[:40])
    X2, y2 = _data(N_DS)
    # the bandwidth from _BANDWIDTH_ROWS rows drawn by global position (here: all of them)
    assert N_DS <= _BANDWIDTH_ROWS
    sigma = median_heuristic(torch.as_tensor(X2))
    with one_thread():
        ref_ds = _summary(DoublyStochasticRegressor(sigma=sigma, batch_size=16, block_size=16,
                                                    max_iter=2, random_state=0).fit(X2, y2),
                          X2[:40])
    for r in range(2):
        got = two_process[r]["no_gather_nystrom"]
        np.testing.assert_array_equal(got["centers"], ref["centers"])
        _close(got["coef"], ref["coef"])
        _close(got["pred"], ref["pred"])
        _close(two_process[r]["no_gather_ds"]["coef"], ref_ds["coef"])


def test_distributed_off_fits_each_process_alone(two_process):
    X, y = _data(N_NYS)
    for r, part in enumerate((slice(0, CUT_NYS), slice(CUT_NYS, N_NYS))):
        with one_thread():
            ref = _summary(NystromKernelRidge(20, alpha=1e-2, random_state=0).fit(X[part],
                                                                                   y[part]),
                           X[:40])
            ref_ds = _summary(DoublyStochasticRegressor(block_size=16, max_iter=2,
                                                        random_state=0).fit(X[part], y[part]),
                              X[:40])
        _close(two_process[r]["local"]["coef"], ref["coef"], 1e-9)
        _close(two_process[r]["local_ds"]["coef"], ref_ds["coef"], 1e-9)
    # different rows, different models
    assert not np.allclose(two_process[0]["local"]["pred"], two_process[1]["local"]["pred"])


@pytest.mark.parametrize("name", list(_cv_estimators()))
def test_cv_grid_spread_over_processes_selects_the_single_process_model(two_process, name):
    X, y = _data(60, seed=1)
    with one_thread():
        ref = _cv_summary(_cv_estimators()[name].fit(X, y), X[:20])
    for r in range(2):
        got = two_process[r][name]
        assert got["sigma"] == ref["sigma"]
        for key in ("alpha_", "n_iter_"):
            if key in ref:
                assert got[key] == ref[key]
        # batched FISTA stops on the KKT tolerance of its batch: equal to that tolerance
        rtol = 1e-4 if name == "penalized_l1_cv" else 1e-10
        np.testing.assert_allclose(got["scores"], ref["scores"], rtol=rtol)
        _close(got["pred"], ref["pred"], 1e-8)


def test_cv_dispatches_to_the_spread_grid_with_process_0_folds(two_process):
    for r in range(2):
        spread, folds = two_process[r]["dispatch"]
        assert spread and folds == [list(range(0, 60, 3))]


def test_cv_with_different_data_on_the_processes_raises_everywhere(two_process):
    for r in range(2):
        msg = two_process[r]["cv_mismatch"]
        assert "disagree across processes" in msg and "whole training set" in msg


def test_distributed_true_without_a_process_group_raises():
    X, y = _data(50)
    with pytest.raises(ValueError, match="process group"):
        NystromKernelRidge(10, distributed=True).fit(X, y)
    with pytest.raises(ValueError, match="process group"):
        DoublyStochasticRegressor(distributed="on").fit(X, y)
    # "auto" and "off" are the ordinary fit on one process
    a = NystromKernelRidge(10, random_state=0).fit(X, y).predict(X)
    b = NystromKernelRidge(10, random_state=0, distributed="off").fit(X, y).predict(X)
    np.testing.assert_array_equal(a, b)


class _DyingRows:
    """Process 1's rows as a DataSource that kills its process (SIGKILL) at the 3rd pass (the
    solver's: the first reads the dtype, the second the moments of the targets)."""

    @staticmethod
    def make(X, y):
        from kernelflow.sources import ArraySource

        class Dying(ArraySource):
            def _raw_blocks(self, block_size):
                import os
                import signal

                self.passes = getattr(self, "passes", 0) + 1
                if rank() == 1 and self.passes == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield from super()._raw_blocks(block_size)

        return Dying(X, y)


def _auto_fit_and_die():
    X, y = _data(N_NYS)
    part = slice(0, CUT_NYS) if rank() == 0 else slice(CUT_NYS, N_NYS)
    NystromKernelRidge(20, alpha=1e-3, sigma=1.0, random_state=0).fit(
        _DyingRows.make(X[part], y[part]))
    return "finished"


def test_process_killed_during_an_auto_distributed_fit_fails_clearly():
    from kernelflow.distributed import DistributedError

    with pytest.raises(DistributedError) as info:
        spawn(_auto_fit_and_die, 2, timeout=15, grace=5, max_seconds=50)
    msg = str(info.value)
    assert "rank 1 died" in msg and "SIGKILL" in msg
    assert "rank 0 error: DistributedError" in msg
    assert "collective operation failed during NystromKernelRidge.fit" in msg


class _RecordingRegressor(DoublyStochasticRegressor):
    """Records every write of a constructor parameter made after construction."""

    def __setattr__(self, name, value):
        if getattr(self, "_constructed", False) and name in self._get_param_names():
            self.__dict__.setdefault("_param_writes", []).append(name)
        object.__setattr__(self, name, value)


def test_distributed_fit_never_writes_the_parameters():
    # the shared seed and the median-heuristic bandwidth are passed on, not stored in the
    # estimator's parameters (not even for the duration of the fit)
    from kernelflow.distributed import distributed_fit

    rng = np.random.RandomState(0)
    X, y = rng.normal(size=(120, 3)), rng.normal(size=120)
    est = _RecordingRegressor(max_iter=2, block_size=32, random_state=None)
    est._constructed = True
    before = est.get_params()
    distributed_fit(est, X, y)
    assert est.__dict__.get("_param_writes", []) == []
    assert est.get_params() == before
    assert hasattr(est, "coef_")


def test_distributed_fit_refuses_an_estimator_without_a_data_parallel_fit():
    from kernelflow.distributed import distributed_fit

    with pytest.raises(TypeError, match="no data-parallel fit"):
        distributed_fit(KernelRidgeCV(), np.zeros((4, 1)), np.zeros(4))
