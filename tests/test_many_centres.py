"""Nyström eigen-CG (many centres): agreement with the direct solve, no M x M matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import interrupt_cg, torch_regression_data
from sklearn.exceptions import ConvergenceWarning
from torch.utils._python_dispatch import TorchDispatchMode

import kernelflow.solvers.nystrom as nystrom_module
import kernelflow.solvers.nystrom_eigen_cg as eigen_cg_module
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.io import load_model, save_model
from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator, Options
from kernelflow.solvers.nystrom import choose_solver, nystrom_direct, nystrom_krr
from kernelflow.solvers.nystrom_eigen_cg import (
    default_rank,
    eigen_preconditioner,
    nystrom_eigen_cg,
)
from kernelflow.sources import ArraySource

F64 = torch.float64


def _target(X):
    return torch.sin(2 * X[:, 0]) + 0.5 * torch.tanh(2 * X[:, 1]) + 0.25 * X[:, 0] * X[:, 1]


def _data(n=2000, d=9, seed=0):
    return torch_regression_data(n, d, _target, normal=True, seed=seed)


def _rel(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, tuple | list) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


@pytest.mark.parametrize("rank", [100, 300])
def test_predictions_match_direct_solution(rank):
    X, y = _data()
    kernel, C, alpha = Gaussian(3.0), X[:300], 2.0  # alpha / n = 1e-3
    src = ArraySource(X, y)
    sol = nystrom_eigen_cg(src, kernel, C, alpha, rank=rank, tol=1e-10, max_iter=500)
    ref = nystrom_direct(src, kernel, C, alpha)
    K = kernel(X, C)
    assert sol.converged and sol.solver == "eigen_cg"
    assert _rel(K @ sol.coef, K @ ref) < 1e-6


def test_preconditioner_is_exact_with_all_centres():
    X, _ = _data(200, 3)
    kernel, C = Gaussian(1.5), X[:80]
    P = eigen_preconditioner(kernel, C, 1e-3, 80)
    K = kernel(C)
    assert float((P.V @ torch.diag(P.sigma) @ P.V.T - K).abs().max()) < 1e-8
    assert float((P.V.T @ P.V - torch.eye(P.V.shape[1], dtype=F64)).abs().max()) < 1e-10
    # rank s < M: P^{-1} is 1 / h on the eigenvectors and 1 / c on their complement
    P = eigen_preconditioner(kernel, C, 1e-3, 30, generator=torch.Generator().manual_seed(0))
    assert P.V.shape == (80, 30) and float(P.c) == float(P.h.min())
    assert torch.allclose(P.apply_inverse(P.V) * P.h, P.V, atol=1e-10)
    v = torch.randn(80, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    w = v - P.V @ (P.V.T @ v)
    assert torch.allclose(P.apply_inverse(w) * P.c, w, atol=1e-10)


def test_estimator_matches_direct_and_round_trips(tmp_path):
    X, y = _data(1500)
    Xn, yn = X.numpy(), y.numpy()
    common = dict(n_components=250, alpha=1.5, sigma=3.0, random_state=0)
    ref = NystromKernelRidge(solver="direct", **common).fit(Xn, yn)
    est = NystromKernelRidge(solver="eigen_cg", tol=1e-10, max_iter=300, **common).fit(Xn, yn)
    assert est.solver_ == "eigen_cg" and est.converged_ and 0 < est.n_iter_ <= 300
    assert est.solver_history_ == [("eigen_cg", est.n_iter_)]
    p, p_ref = est.predict(Xn), ref.predict(Xn)
    assert np.linalg.norm(p - p_ref) / np.linalg.norm(p_ref) < 1e-6
    path = save_model(est, tmp_path / "m.kfm")
    np.testing.assert_array_equal(load_model(path).predict(Xn), p)


def test_float32_input_is_close():
    X, y = _data(1500)
    common = dict(n_components=250, alpha=1.5, sigma=3.0, random_state=0)
    ref = NystromKernelRidge(solver="direct", **common).fit(X.numpy(), y.numpy())
    est = NystromKernelRidge(solver="eigen_cg", max_iter=300, tol=1e-6, **common)
    est.fit(X.numpy().astype(np.float32), y.numpy().astype(np.float32))
    assert est.compute_dtype_ == "float32"
    p = est.predict(X.numpy().astype(np.float32))
    p_ref = ref.predict(X.numpy())
    assert p.dtype == np.float32
    assert np.linalg.norm(p - p_ref) / np.linalg.norm(p_ref) < 1e-4


def test_early_stopping_uses_the_monitor():
    X, y = _data(1500)
    est = NystromKernelRidge(200, alpha=1e-3, sigma=3.0, random_state=0, solver="eigen_cg",
                             early_stopping=True, n_iter_no_change=3, max_iter=200)
    est.fit(X.numpy(), y.numpy())
    scores = est.validation_scores_
    assert len(scores) == est.n_iter_ + 1  # iteration 0 first
    assert est.best_iteration_ == int(np.argmin(scores))
    assert est.n_iter_ < 200 and est.n_iter_ - est.best_iteration_ == 3


def test_no_centre_by_centre_matrix_within_a_small_budget():
    # a budget below one M x M float64 matrix: Falkon's preconditioner is refused, eigen-CG
    # runs and no operation returns a tensor of M x M (or M x M / 4) elements
    X, y = _data(800, 5)
    M = 600
    kernel, C, src = Gaussian(2.0), X[:M], ArraySource(X, y)
    opts = Options(memory_budget=M * M * 8 - 1, tile_elements=4096)
    with pytest.raises(MemoryError):
        nystrom_krr(src, kernel, C, 1.2, options=opts)
    s = default_rank(M, opts)
    assert 1 <= s < M // 10
    with _LargestTensor() as probe:
        sol = nystrom_eigen_cg(src, kernel, C, 1.2, options=opts, block_size=64, max_iter=5)
    assert sol.n_iter > 0 and torch.isfinite(sol.coef).all()
    assert probe.largest < M * M // 4, probe.largest
    # the probe sees an M x M matrix where one is built
    with _LargestTensor() as probe:
        nystrom_direct(src, kernel, C, 1.2, block_size=64)
    assert probe.largest >= M * M


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0.0}, "alpha"), ({"alpha": 1.0, "rank": 0}, "rank"),
])
def test_invalid_parameters_refused(kwargs, match):
    X, y = _data(100, 3)
    with pytest.raises(ValueError, match=match):
        nystrom_eigen_cg(ArraySource(X, y), Gaussian(1.0), X[:20], **kwargs)


def test_estimator_refuses_bad_solver():
    X, y = _data(200, 3)
    with pytest.raises(ValueError, match="solver"):
        NystromKernelRidge(20, solver="eigenpro").fit(X.numpy(), y.numpy())
    # eigen-CG checkpoints: tests/test_checkpoint_paths.py


def _spy_ranks(monkeypatch):
    """Lists filled with the rank of every eigen-CG preconditioner built and every rank the
    cost model of ``solver="auto"`` prices."""
    import kernelflow.estimators.nystrom_ridge as mod

    built, priced = [], []
    real_p, real_c = eigen_cg_module.eigen_preconditioner, mod.choose_solver
    monkeypatch.setattr(eigen_cg_module, "eigen_preconditioner",
                        lambda k, C, lam, s, **kw: built.append(s) or real_p(k, C, lam, s, **kw))
    monkeypatch.setattr(mod, "choose_solver",
                        lambda *a, **kw: priced.append(kw["rank"]) or real_c(*a, **kw))
    return built, priced


def test_precond_rank_reaches_the_preconditioner_and_the_cost_model(monkeypatch):
    X, y = _data(800, 5)
    Xn, yn = X.numpy(), y.numpy()
    params = dict(n_components=200, alpha=1.0, sigma=1.0, random_state=0, tol=1e-10,
                  max_iter=300)
    built, priced = _spy_ranks(monkeypatch)
    fits = {r: NystromKernelRidge(solver="eigen_cg", precond_rank=r, **params).fit(Xn, yn)
            for r in (50, 100, 10_000)}
    NystromKernelRidge(solver="auto", precond_rank=30, **params).fit(Xn, yn)
    NystromKernelRidge(solver="auto", **params).fit(Xn, yn)
    assert built == [50, 100, 200]  # capped at M
    assert priced == [30, default_rank(200, None, 800)]
    # a larger rank captures more of K_MM's spectrum: fewer passes to the same solution
    assert fits[10_000].n_iter_ < fits[100].n_iter_ < fits[50].n_iter_
    ref = NystromKernelRidge(solver="direct", **params).fit(Xn, yn).predict(Xn)
    for est in fits.values():
        assert est.converged_
        assert np.linalg.norm(est.predict(Xn) - ref) / np.linalg.norm(ref) < 1e-6


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # short runs
def test_precond_rank_beyond_the_budget_refused_and_the_model_kept():
    X, y = _data(300, 3)
    Xn, yn = X.numpy(), y.numpy()
    est = NystromKernelRidge(100, alpha=1.0, sigma=2.0, random_state=0, solver="eigen_cg")
    coef = est.fit(Xn, yn).dual_coef_.clone()
    small = Options(memory_budget=3 * 8 * 100 * 50)  # rank 50 fits, 51 does not
    with pytest.raises(MemoryError, match=r"rank-51 .*\(at most 50 fits\)"):
        est.set_params(precond_rank=51, options=small).fit(Xn[::-1], yn[::-1])
    assert torch.equal(est.dual_coef_, coef)  # the previous model is kept
    with pytest.raises(MemoryError, match="rank-51"):
        nystrom_eigen_cg(ArraySource(X, y), Gaussian(2.0), X[:100], 1.0, rank=51, options=small)
    assert est.set_params(precond_rank=50, max_iter=3).fit(Xn, yn).n_iter_ == 3


def test_default_rank_grows_with_the_rows_where_its_setup_pays():
    costs, rule = nystrom_module.solver_costs, nystrom_module.default_max_rank
    big, f32 = Options(memory_budget=2 ** 36), torch.float32
    # the measured sizes: s = 2000 was faster with K_nM stored (n = 2e4; n = 2e5, M = 5000),
    # s = 3000 with K_nM streamed (n = 2e5, M = 2e4 and 5e4)
    assert [default_rank(M, big, 20_000, 9, dtype=f32) for M in (1000, 4000, 8000)] == \
        [1000, 2000, 2000]
    assert default_rank(5000, big, 200_000, 9, dtype=f32) == 2000
    assert [default_rank(M, big, 200_000, 9, stored=False, dtype=f32)
            for M in (20_000, 50_000)] == [3000, 3000]
    assert default_rank(50_000, big) == 2000  # rows unknown
    assert default_rank(50_000, Options(memory_budget=2 ** 30), 10 ** 6, 9,
                        stored=False) == 223  # the budget
    # the switch is where the larger rank's extra setup (priced by solver_costs, times the
    # factor measured at n = 2e5) equals the 13 passes it saves (priced as PCG's passes)
    for M in (5000, 20_000, 50_000):
        for stored in (True, False):
            def c(n, rank, M=M, stored=stored):
                return costs(n, M, 9, stored=stored, dtype=f32, rank=rank)
            extra = nystrom_module._RANK_SETUP_FACTOR * (c(0, 3000)["eigen_cg"]
                                                         - c(0, 2000)["eigen_cg"])
            n = next(n for n in range(1000, 10 ** 7, 1000)
                     if rule(n, M, 9, stored=stored, dtype=f32) == 3000)
            per_row_pass = (c(1000, 2000)["cg"] - c(0, 2000)["cg"]) / 40 / 1000
            assert 13 * (n - 1000) * per_row_pass < extra <= 13 * n * per_row_pass


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # short runs
def test_default_rank_follows_each_process_rows(monkeypatch):
    # the rule scaled down (ranks 20 and 40, 0.7 passes saved, setups as priced: 40 from about
    # 540 rows at M = 200, K_nM stored): the solver and the cost model of "auto" use the rows
    # they are given
    monkeypatch.setattr(nystrom_module, "DEFAULT_MAX_RANK", 20)
    monkeypatch.setattr(nystrom_module, "LARGE_ROWS_RANK", 40)
    monkeypatch.setattr(nystrom_module, "_RANK_PASSES_SAVED", 0.7)
    monkeypatch.setattr(nystrom_module, "_RANK_SETUP_FACTOR", 1.0)
    built, priced = _spy_ranks(monkeypatch)
    X, y = _data(800, 4)
    for n in (400, 800):
        for solver in ("eigen_cg", "auto"):
            NystromKernelRidge(200, alpha=1.0, sigma=2.0, random_state=0, max_iter=2,
                               solver=solver).fit(X[:n].numpy(), y[:n].numpy())
    assert built == [20, 40] and priced == [20, 40]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "big"])
def test_precond_rank_refuses_bad_values(bad):
    X, y = _data(100, 3)
    with pytest.raises(ValueError, match="precond_rank"):
        NystromKernelRidge(20, solver="eigen_cg", precond_rank=bad).fit(X.numpy(), y.numpy())


def test_interrupted_fit_leaves_previous_model(monkeypatch):
    X, y = _data(600, 4)
    est = NystromKernelRidge(100, alpha=1.0, sigma=2.0, random_state=0, solver="eigen_cg")
    est.fit(X.numpy(), y.numpy())
    before = est.predict(X.numpy())
    coef = est.dual_coef_.clone()
    # eigen-CG's passes go through the Nyström module's streamed product
    real, calls = nystrom_module.nystrom_normal_matvec, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(nystrom_module, "nystrom_normal_matvec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X.numpy()[::-1] * 1.1, y.numpy()[::-1])
    assert torch.equal(est.dual_coef_, coef)
    np.testing.assert_array_equal(est.predict(X.numpy()), before)


def test_weighted_multi_output_and_warm_start():
    rng = np.random.RandomState(0)
    X = rng.randn(1000, 5)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 1])] + 0.1 * rng.randn(1000, 2)
    w = rng.uniform(0.5, 2.0, 1000)
    common = dict(n_components=150, alpha=1.0, sigma=2.0, random_state=0)
    ref = NystromKernelRidge(solver="direct", **common).fit(X, Y, sample_weight=w)
    est = NystromKernelRidge(solver="eigen_cg", tol=1e-10, max_iter=300, **common)
    est.fit(X, Y, sample_weight=w)
    p, p_ref = est.predict(X), ref.predict(X)
    assert p.shape == (1000, 2)
    assert np.linalg.norm(p - p_ref) / np.linalg.norm(p_ref) < 1e-6
    first = est.n_iter_
    est.set_params(warm_start=True).fit(X, Y, sample_weight=w)  # starts at the solution
    assert est.n_iter_ < first / 4
    assert np.linalg.norm(est.predict(X) - p_ref) / np.linalg.norm(p_ref) < 1e-6


# ---- solver="auto" beyond the memory budget ---------------------------------------------------
#: the budget test's problem: 600 centres of 800 rows, a budget one byte below one M x M
#: float64 matrix (the preconditioner's rank is then M / 12 = 49); sigma = 0.5 so that CG with
#: that rank reaches the direct solution in under 200 passes
M_BUDGET = 600


def _budget_problem(budget=M_BUDGET * M_BUDGET * 8 - 1, **extra):
    X, y = _data(800, 5)
    Xn, yn = X.numpy(), y.numpy()
    params = dict(n_components=M_BUDGET, landmarks=Xn[:M_BUDGET], alpha=1.2, sigma=0.5,
                  random_state=0, **extra)
    return Xn, yn, params, Options(memory_budget=budget)


def test_auto_beyond_the_budget_runs_eigen_cg_to_the_direct_solution():
    Xn, yn, params, small = _budget_problem()
    with pytest.raises(MemoryError, match="eigen_cg"):
        NystromKernelRidge(solver="cg", options=small, **params).fit(Xn, yn)
    ref = NystromKernelRidge(solver="direct", **params).fit(Xn, yn)  # no budget
    est = NystromKernelRidge(solver="auto", tol=1e-10, max_iter=400, options=small, **params)
    est.fit(Xn, yn)
    assert est.solver_ == "eigen_cg" and est.converged_
    assert est.solver_history_ == [("eigen_cg", est.n_iter_)]
    p, p_ref = est.predict(Xn), ref.predict(Xn)
    assert np.linalg.norm(p - p_ref) / np.linalg.norm(p_ref) < 1e-6


def test_variance_beyond_the_budget_refused_before_the_solve(monkeypatch):
    # the posterior needs M x M matrices: refused up front, not after the eigen-CG solve
    import kernelflow.estimators.nystrom_ridge as mod

    Xn, yn, params, small = _budget_problem()

    def never(*a, **k):
        raise AssertionError("the solve ran")

    monkeypatch.setattr(mod, "nystrom_eigen_cg", never)
    for solver in ("auto", "eigen_cg"):
        est = NystromKernelRidge(solver=solver, compute_variance=True, options=small, **params)
        with pytest.raises(MemoryError, match="compute_variance"):
            est.fit(Xn, yn)
        assert not hasattr(est, "dual_coef_")


def test_three_way_choice_follows_the_measured_crossover():
    all3 = ("direct", "cg", "eigen_cg")
    costs = nystrom_module.solver_costs
    # measured at n = 2e4 (float32 rows stored): PCG fastest to M = 8000 (1.02x there), then
    # its M^3 setup dominates; the crossover is the first M where eigen-CG is the cheaper
    picks = [choose_solver(20_000, M, 9, stored=True, candidates=all3)
             for M in (1000, 2000, 4000, 8000, 12_000, 50_000)]
    assert picks == ["cg"] * 4 + ["eigen_cg"] * 2

    def crossover(n, stored):
        return next(M for M in range(1000, 400_000, 1000)
                    if choose_solver(n, M, 9, stored=stored, candidates=all3) == "eigen_cg")

    # more rows per process, or streamed passes, make eigen-CG's extra passes dearer
    assert crossover(20_000, True) < crossover(200_000, True) < crossover(200_000, False)
    # the setup terms: PCG's grows as M^3, eigen-CG's as M s^2
    c1, c2 = costs(0, 4000, 9, stored=True, rank=1000), costs(0, 8000, 9, stored=True, rank=1000)
    assert c2["cg"] == pytest.approx(8 * c1["cg"])
    assert c2["eigen_cg"] < 2 * c1["eigen_cg"]
    assert costs(0, 8000, 9, stored=True, rank=2000)["eigen_cg"] > 3.9 * c2["eigen_cg"]
    # the two-way choice of nystrom_krr never returns eigen-CG
    assert choose_solver(20_000, 50_000, 9, stored=True) == "cg"


def test_auto_runs_eigen_cg_where_it_is_cheaper(monkeypatch):
    # priced as measured, PCG is the cheaper at M = 600; with eigen-CG's setup free and its
    # passes priced as PCG's, eigen-CG is, and "auto" runs it to the direct solution
    import kernelflow.estimators.nystrom_ridge as mod

    X, y = _data(1500)
    Xn, yn = X.numpy(), y.numpy()
    params = dict(n_components=600, alpha=1.5, sigma=3.0, random_state=0, tol=1e-10,
                  max_iter=500)
    ref = NystromKernelRidge(solver="direct", **params).fit(Xn, yn)
    assert NystromKernelRidge(solver="auto", **params).fit(Xn, yn).solver_ == "cg"
    monkeypatch.setattr(nystrom_module, "_EIGEN_PASS_RATIO", 1.0)
    monkeypatch.setattr(nystrom_module, "_EIGEN_SETUP", (0.0, 0.0))
    seen = []
    real = mod.choose_solver
    monkeypatch.setattr(mod, "choose_solver", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    est = NystromKernelRidge(solver="auto", **params).fit(Xn, yn)
    assert est.solver_ == "eigen_cg" and est.converged_
    (n, M, d), kw = seen[0]
    assert (n, M, d) == (1500, 600, 9) and kw["stored"]
    assert kw["rank"] == default_rank(600, None, n)
    assert _rel(torch.as_tensor(est.predict(Xn)), torch.as_tensor(ref.predict(Xn))) < 1e-6


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # short CG runs
def test_auto_within_the_budget_keeps_its_choice():
    # one byte more than above: one M x M matrix fits, "cg" runs and "auto" chooses by cost
    Xn, yn, params, fits = _budget_problem(M_BUDGET * M_BUDGET * 8)
    est = NystromKernelRidge(solver="auto", options=fits, **params).fit(Xn, yn)
    # K_nM is not stored within this budget: the cost model picks the direct solve
    assert est.solver_ == choose_solver(800, M_BUDGET, 5, stored=False) == "direct"
    ref = NystromKernelRidge(solver="direct", options=fits, **params).fit(Xn, yn)
    np.testing.assert_array_equal(est.predict(Xn), ref.predict(Xn))
    # with K_nM stored (the default budget) it picks CG, as before
    assert NystromKernelRidge(solver="auto", **params).fit(Xn, yn).solver_ == "cg"
    assert NystromKernelRidge(solver="cg", max_iter=2, options=fits, **params).fit(
        Xn, yn).solver_ == "cg"
    # with early stopping "auto" is CG
    est = NystromKernelRidge(solver="auto", early_stopping=True, max_iter=3, options=fits,
                             **params).fit(Xn, yn)
    assert est.solver_ == "cg"


def test_auto_beyond_the_budget_early_stopping_and_warm_start():
    Xn, yn, params, small = _budget_problem()
    est = NystromKernelRidge(solver="auto", early_stopping=True, n_iter_no_change=3,
                             max_iter=200, options=small, **{**params, "alpha": 1e-3})
    est.fit(Xn, yn)
    scores = est.validation_scores_
    assert est.solver_ == "eigen_cg" and len(scores) == est.n_iter_ + 1
    assert est.best_iteration_ == int(np.argmin(scores))
    assert est.n_iter_ < 200 and est.n_iter_ - est.best_iteration_ == 3
    # warm start: the refit starts at the previous solution
    est = NystromKernelRidge(solver="auto", tol=1e-10, max_iter=400, options=small, **params)
    est.fit(Xn, yn)
    first, p = est.n_iter_, est.predict(Xn)
    est.set_params(warm_start=True).fit(Xn, yn)
    assert est.solver_ == "eigen_cg" and est.n_iter_ < first / 4
    assert np.linalg.norm(est.predict(Xn) - p) / np.linalg.norm(p) < 1e-8


def test_auto_beyond_the_budget_resumes_from_a_checkpoint(tmp_path, monkeypatch):
    Xn, yn, params, small = _budget_problem()
    kw = dict(solver="auto", tol=1e-10, max_iter=20, options=small, **params)
    with pytest.warns(ConvergenceWarning):
        ref = NystromKernelRidge(**kw).fit(Xn, yn)
    path = tmp_path / "auto.ckpt"
    est = NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **kw)
    interrupt_cg(monkeypatch, eigen_cg_module, 6)
    with pytest.raises(KeyboardInterrupt):
        est.fit(Xn, yn)
    monkeypatch.undo()
    assert path.exists()
    passes = interrupt_cg(monkeypatch, eigen_cg_module, None)
    with pytest.warns(ConvergenceWarning):
        est.fit(Xn, yn)
    assert passes[0] == 7 and est.solver_ == "eigen_cg"  # resumed after pass 6
    assert torch.equal(est.dual_coef_, ref.dual_coef_) and est.n_iter_ == ref.n_iter_
    assert not path.exists()


def test_checkpoint_of_another_route_is_refused(tmp_path, monkeypatch):
    # the default budget comes from free memory: a CG checkpoint of "auto" must not be resumed
    # by the eigen-CG run that "auto" picks when less memory is free
    import kernelflow.estimators.nystrom_ridge as ridge_module
    import kernelflow.solvers.nystrom as nystrom_module

    Xn, yn, params, _ = _budget_problem()
    kw = dict(solver="auto", early_stopping=True, checkpoint=tmp_path / "cg.ckpt",
              checkpoint_interval=0, **params)
    interrupt_cg(monkeypatch, nystrom_module, 3)
    with pytest.raises(KeyboardInterrupt):
        NystromKernelRidge(**kw).fit(Xn, yn)
    monkeypatch.undo()
    monkeypatch.setattr(ridge_module, "centre_matrices_fit", lambda *a, **k: False)
    with pytest.raises(ValueError, match="solver_run differs"):
        NystromKernelRidge(**kw).fit(Xn, yn)


def test_checkpoint_of_another_default_rank_is_refused(tmp_path, monkeypatch):
    # the default rank follows the budget and K_nM's storage: a resumed fit whose default
    # differs would continue CG with another preconditioner
    import kernelflow.estimators.nystrom_ridge as ridge_module

    Xn, yn, params, small = _budget_problem()
    kw = dict(solver="eigen_cg", tol=1e-10, max_iter=20, options=small,
              checkpoint=tmp_path / "e.ckpt", checkpoint_interval=0, **params)
    interrupt_cg(monkeypatch, eigen_cg_module, 4)
    with pytest.raises(KeyboardInterrupt):
        NystromKernelRidge(**kw).fit(Xn, yn)
    monkeypatch.undo()
    real = ridge_module.source_default_rank
    monkeypatch.setattr(ridge_module, "source_default_rank", lambda *a, **k: real(*a, **k) - 1)
    with pytest.raises(ValueError, match="precond_rank_run differs"):
        NystromKernelRidge(**kw).fit(Xn, yn)
    monkeypatch.undo()  # the same default: resumes and completes
    with pytest.warns(ConvergenceWarning):
        NystromKernelRidge(**kw).fit(Xn, yn)
    assert not (tmp_path / "e.ckpt").exists()


@pytest.mark.parametrize("M,p", [(0, 1), (7, 1), (10, 4), (1000, 3), (3, 5), (2048, 2048)])
def test_centre_blocks_tile_the_centres_contiguously_and_evenly(M, p):
    blocks = [eigen_cg_module._center_block(M, p, r) for r in range(p)]
    assert blocks[0][0] == 0 and blocks[-1][1] == M
    assert all(a[1] == b[0] for a, b in zip(blocks[:-1], blocks[1:], strict=True))
    sizes = [stop - start for start, stop in blocks]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1 and sum(sizes) == M


@pytest.mark.parametrize("args", [(10, 0, 0), (10, 2, 2), (10, 2, -1), (-1, 2, 0)])
def test_centre_block_refuses_bad_arguments(args):
    with pytest.raises(ValueError, match="rank < n_procs"):
        eigen_cg_module._center_block(*args)


def test_single_process_computes_the_whole_centre_product(monkeypatch):
    # one process: every K_MM v product evaluates all M x M kernel entries (the tiled product
    # of the full symmetric operator, as before the split)
    seen = []

    class Counting(eigen_cg_module.KernelOperator):
        def _tile(self, i0, i1, j0, j1):
            seen.append((i1 - i0) * (j1 - j0))
            return super()._tile(i0, i1, j0, j1)

        def _matmul(self, V):
            seen.clear()
            out = super()._matmul(V)
            entries.append(sum(seen))
            return out

    entries: list[int] = []
    monkeypatch.setattr(eigen_cg_module, "KernelOperator", Counting)
    X, y = _data(300, 3)
    sol = nystrom_eigen_cg(ArraySource(X, y), Gaussian(1.0), X[:50], 1e-2, rank=20, tol=1e-8,
                           max_iter=50)
    assert entries and set(entries) == {50 * 50}
    assert len(entries) >= sol.n_iter


def _smooth_5d(n, M):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 5, dtype=F64, generator=g)
    f = torch.sin(2 * X[:, 0]) + 0.5 * torch.tanh(2 * X[:, 1])
    y = f + 0.1 * torch.randn(n, dtype=F64, generator=g)
    return X, y, f, Gaussian(3.0), X[:M]


def test_float32_rows_with_rank_m_reach_the_float64_solution():
    # float32 rows, lam = 1e-6, rank s = M on smooth 5-d data: the preconditioner reaches
    # Nystrom eigenvalues of 1e-17 of the largest. With float32 products CG lost positive
    # curvature (test RMSE 0.82 returned with a warning; before that, 169 as "converged"); with
    # float64 products of the float32 values and the values' jitter it converges, quietly,
    # near the float64 direct solution (RMSE on these rows 0.168 against 0.155; 0.453 against
    # 0.446 on new rows)
    import warnings

    X, y, f, kernel, C = _smooth_5d(1000, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = nystrom_eigen_cg(ArraySource(X.float(), y.float()), kernel, C, 1000 * 1e-6,
                               rank=300, dtype=torch.float32, tol=1e-9, max_iter=150)
    ref = nystrom_direct(ArraySource(X, y), kernel, C, 1000 * 1e-6)
    K = kernel(X, C)
    rmse = float(((K @ sol.coef).ravel() - f).pow(2).mean().sqrt())
    rmse_ref = float(((K @ ref).ravel() - f).pow(2).mean().sqrt())
    assert sol.converged and sol.stop_reason == "change"
    assert rmse < 1.15 * rmse_ref


def _float32_run(store, n=600, M=200):
    from kernelflow.solvers.nystrom import _nystrom_run

    X, y, _, kernel, C = _smooth_5d(n, M)
    return _nystrom_run(ArraySource(X.float(), y.float()), kernel, C, n * 1e-6, moments=None,
                        validation=None, store_kernel=store, dtype=torch.float32, options=None,
                        block_size=256, y_offset=None, tol=1e-3, max_iter=10)


@pytest.mark.parametrize("store", [None, False])
def test_float32_system_product_is_a_symmetric_matrix(store):
    # the product CG uses must be a fixed symmetric matrix to float64 rounding, also with
    # float32 kernel values (stored or recomputed): float32 products differed from one by
    # 1e-7 relative, far above the preconditioner's smallest values
    run = _float32_run(store)
    assert (run.cache is not None) == (store is None)
    _, matvec = eigen_cg_module._eigen_cg_system(run)
    g = torch.Generator().manual_seed(1)
    U = torch.randn(200, 3, dtype=F64, generator=g)
    V = torch.randn(200, 3, dtype=F64, generator=g) * torch.logspace(0, 6, 200, dtype=F64
                                                                     ).reshape(-1, 1)
    uav, vau = U.T @ matvec(V), (V.T @ matvec(U)).T
    assert float((uav - vau).abs().max() / uav.abs().max()) < 1e-12
    torch.testing.assert_close(matvec(U + V), matvec(U) + matvec(V), rtol=1e-12, atol=0)


def test_float32_penalty_product_has_no_negative_curvature():
    # K_MM in float32 values is indefinite by about eps32 ||K_MM|| (here -1.3e-7, where the
    # float64 values' smallest eigenvalue is 5.6e-9): the product of the penalty is float64
    run = _float32_run(None, 1000, 300)
    K = eigen_cg_module._kmm_product(run)(torch.eye(300, dtype=F64))
    assert float(torch.linalg.eigvalsh((K + K.T) / 2)[0]) > 0
    K32 = KernelOperator(run.kernel, run.C.float()).to_dense().double()
    assert float(torch.linalg.eigvalsh((K32 + K32.T) / 2)[0]) < 0  # what float32 values give


def test_preconditioner_vectors_are_orthonormal_when_eigenvalues_span_many_orders():
    # the Nystrom eigenvalues of K_MM span 188 to 5.6e-9 here: V = B Z sig^-1/2 alone was
    # orthonormal only to 2e-9, and P^{-1} (which assumes V^T V = I) was not the inverse of P
    _, _, _, kernel, C = _smooth_5d(1000, 300)
    P = eigen_preconditioner(kernel, C, 1e-6, 300)
    k = P.V.shape[1]
    assert float(P.sigma[0] / P.sigma[-1]) > 1e9
    assert float((P.V.T @ P.V - torch.eye(k, dtype=F64)).abs().max()) < 1e-12
    assert bool((P.sigma[:-1] >= P.sigma[1:]).all())
    K = kernel(C)
    assert float((P.V @ torch.diag(P.sigma) @ P.V.T - K).abs().max()) < 1e-8 * float(K.max())


def test_float32_pcg_reaches_the_float64_solution():
    # Falkon-class PCG on the same float32 rows: with float32 products its iterate drifted
    # from test RMSE 0.43 (pass 9) to 0.94 (pass 150) without a warning; with float64
    # products of the float32 values and the values' jitter on K_MM it converges near the
    # float64 direct solution
    import warnings

    X, y, f, kernel, C = _smooth_5d(1000, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = nystrom_krr(ArraySource(X.float(), y.float()), kernel, C, 1000 * 1e-6,
                          solver="cg", dtype=torch.float32, tol=1e-9, max_iter=150)
    ref = nystrom_direct(ArraySource(X, y), kernel, C, 1000 * 1e-6)
    g = torch.Generator().manual_seed(5)
    Xt = torch.randn(2000, 5, dtype=F64, generator=g)
    ft = torch.sin(2 * Xt[:, 0]) + 0.5 * torch.tanh(2 * Xt[:, 1])
    Kt = kernel(Xt, C)
    rmse = float(((Kt @ sol.coef).ravel() - ft).pow(2).mean().sqrt())
    rmse_ref = float(((Kt @ ref).ravel() - ft).pow(2).mean().sqrt())
    assert sol.converged and sol.residual < 1e-8
    assert rmse < 1.15 * rmse_ref


@pytest.mark.parametrize("store", [None, False])
def test_float32_pcg_system_is_a_fixed_symmetric_matrix_with_the_values_jitter(store):
    from kernelflow.solvers.nystrom import (
        _cg_system,
        normal_product,
        nystrom_preconditioner,
        values_jitter,
    )

    run = _float32_run(store)
    g = torch.Generator().manual_seed(1)
    U = torch.randn(200, 3, dtype=F64, generator=g)
    V = torch.randn(200, 3, dtype=F64, generator=g) * torch.logspace(0, 6, 200, dtype=F64
                                                                     ).reshape(-1, 1)
    # PCG's product K_nM^T D K_nM of the float32 values: linear and symmetric to float64
    # rounding (float32 products differed from a fixed matrix by 1e-7 relative)
    gram = normal_product(run)
    torch.testing.assert_close(gram(U + V), gram(U) + gram(V), rtol=1e-12, atol=0)
    uav, vau = U.T @ gram(V), (V.T @ gram(U)).T
    assert float((uav - vau).abs().max() / uav.abs().max()) < 1e-12
    # the system is B^T (1) B with K_MM + j I in (1), j the float32 values' jitter
    P = nystrom_preconditioner(run.kernel, run.C, run.lam, dtype=run.dtype,
                               values_dtype=run.dtype)
    K = run.kernel(run.C)
    top = float(torch.linalg.eigvalsh(K)[-1])
    assert P.values_jitter == pytest.approx(values_jitter(torch.float32, top), rel=1e-6)
    assert P.values_jitter > 0 and P.jitter > P.values_jitter
    assert nystrom_preconditioner(run.kernel, run.C, run.lam).values_jitter == 0.0
    a = P.apply(U)
    H_a = gram(a) / run.W + run.lam * ((K + P.values_jitter * torch.eye(200, dtype=F64)) @ a)
    system = _cg_system(run, P, None)
    assert _rel(system.matvec(U), P.apply_t(H_a)) < 1e-9
