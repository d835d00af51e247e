"""Checkable properties of the continuous relaxation (Mathur, Moka, Botev; digest §6)."""

import itertools
import math

import pytest
import torch

from kernelflow.landmarks import (
    DenseGram,
    FeatureGram,
    approximation_factor,
    best_rank_k_errors,
    column_subset_error,
    continuous_column_subset,
    continuous_landmarks,
    frobenius_gradient,
    frobenius_loss,
    nystroem_errors,
    relaxed_nystroem,
    search_lambda,
    stochastic_gradient,
    t_from_w,
    trace_gradient,
    trace_loss,
    w_from_t,
)
from kernelflow.landmarks._relaxation import _L, _Solver

D = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _data(n=6, m=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(m, n, generator=g, dtype=D)
    return X, X.T @ X


def _rbf(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    P = torch.randn(n, 2, generator=g, dtype=D)
    return torch.exp(-torch.cdist(P, P) ** 2 / 2)


def _all_signs(n):
    return torch.tensor(list(itertools.product([-1.0, 1.0], repeat=n)), dtype=D).T


def _nystroem(K, s):
    S = torch.nonzero(s).flatten()
    C = K[:, S]
    return C @ torch.linalg.pinv(K[S][:, S], hermitian=True) @ C.T


# 1, 2, 3, 5: corner agreement, delta invariance, trace-norm identity -------------------------
@pytest.mark.parametrize("delta", [0.1, 1.0, 10.0])
def test_corner_agreement_cssp_with_duplicate_columns(delta):
    X, _ = _data(n=6, m=4)
    X[:, 3] = X[:, 1]  # duplicate column: X_[s] rank deficient, pinv needed
    K = X.T @ X
    s = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], dtype=D)
    err = column_subset_error(X, torch.nonzero(s).flatten())
    lam = 0.7
    f = float(trace_loss(K, s, delta, lam))
    assert f == pytest.approx(err - float((X * X).sum()) + lam * 3, abs=1e-9)
    # trace-norm identity: tr(K - K_s) = ||X - P_s X||_F^2
    assert float(torch.trace(K - _nystroem(K, s))) == pytest.approx(err, abs=1e-9)


@pytest.mark.parametrize("delta", [0.1, 1.0, 10.0])
def test_corner_agreement_nystroem(delta):
    K = _rbf()
    s = torch.tensor([0, 1, 0, 1, 1, 0, 0], dtype=D)
    Kh = _nystroem(K, s)
    assert torch.allclose(relaxed_nystroem(K, s, delta), Kh, atol=1e-9)
    g = float(frobenius_loss(K, s, delta, 0.3))
    assert g == pytest.approx(float(((K - Kh) ** 2).sum()) + 0.9, abs=1e-9)


def test_delta_changes_interior_but_not_corners():
    K = _rbf()
    t = torch.full((7,), 0.4, dtype=D)
    a, b = float(frobenius_loss(K, t, 0.1)), float(frobenius_loss(K, t, 10.0))
    assert abs(a - b) > 1e-3
    s = torch.tensor([1, 0, 0, 1, 0, 1, 0], dtype=D)
    vals = [float(frobenius_loss(K, s, d)) for d in (0.1, 1.0, 10.0)]
    assert max(vals) - min(vals) < 1e-10


# 4: continuity towards a corner ---------------------------------------------------------------
def test_limit_towards_corner_is_order_eps():
    X, K = _data(n=6, m=8)
    s = torch.tensor([1, 0, 1, 0, 0, 1], dtype=D)
    errs = []
    for eps in (1e-3, 1e-5):
        te = torch.where(s > 0, 1 - eps, eps)
        errs.append(abs(float(trace_loss(K, te) - trace_loss(K, s)))
                    + abs(float(frobenius_loss(K, te) - frobenius_loss(K, s))))
    assert errs[1] < 1e-3 and errs[1] < errs[0] / 10


# 6: exact gradients against finite differences ------------------------------------------------
@pytest.mark.parametrize("which", ["trace", "frobenius"])
def test_exact_gradient_matches_finite_differences(which):
    K = _rbf()
    t = torch.linspace(0.15, 0.85, 7, dtype=D)
    loss, grad = (trace_loss, trace_gradient) if which == "trace" else (
        frobenius_loss, frobenius_gradient)
    g = grad(K, t, 1.3, 0.4)
    h = 1e-6
    fd = torch.stack([(loss(K, t + h * e, 1.3, 0.4) - loss(K, t - h * e, 1.3, 0.4)) / (2 * h)
                      for e in torch.eye(7, dtype=D)])
    assert torch.allclose(g, fd, rtol=1e-6, atol=1e-8)


# 7, 8: unbiasedness by exact enumeration of all sign vectors ----------------------------------
@pytest.mark.parametrize("which", ["trace", "frobenius"])
def test_stochastic_gradient_is_unbiased_by_enumeration(which):
    K = _rbf(n=6)
    t = torch.tensor([0.2, 0.7, 0.5, 0.9, 0.35, 0.6], dtype=D)
    Z = _all_signs(6)
    g_hat, est, _, _ = stochastic_gradient(DenseGram(K), t, Z, loss=which, delta=0.8, lam=0.3,
                                           direct=True)
    exact = (trace_gradient if which == "trace" else frobenius_gradient)(K, t, 0.8, 0.3)
    assert torch.allclose(g_hat, exact, atol=1e-12)
    loss = (trace_loss if which == "trace" else frobenius_loss)(K, t, 0.8, 0.0)
    assert est == pytest.approx(float(loss), abs=1e-12)


def test_factorised_diagonal_estimator_is_unbiased():
    g = torch.Generator().manual_seed(3)
    B, C = torch.randn(5, 5, generator=g, dtype=D), torch.randn(5, 5, generator=g, dtype=D)
    Z = _all_signs(5)
    est = ((B @ Z) * (C @ Z)).mean(1)
    assert torch.allclose(est, (B @ C.T).diagonal(), atol=1e-12)


def test_monte_carlo_gradient_converges():
    K = _rbf(n=12)
    t = torch.full((12,), 0.5, dtype=D)
    exact = frobenius_gradient(K, t)
    g = torch.Generator().manual_seed(0)
    errs = []
    for M in (16, 1024):
        Z = (2 * torch.randint(0, 2, (12, M), generator=g) - 1).to(D)
        est, *_ = stochastic_gradient(DenseGram(K), t, Z, direct=True)
        errs.append(float((est - exact).norm()))
    assert errs[1] < errs[0]


# 9: matrix-free path equals dense path; CSSP from X equals CSSP from K -------------------------
@pytest.mark.parametrize("which", ["trace", "frobenius"])
def test_cg_path_matches_dense_path(which):
    K = _rbf(n=9)
    t = torch.linspace(0.1, 0.9, 9, dtype=D)
    Z = _all_signs(9)[:, ::37]
    a = stochastic_gradient(DenseGram(K), t, Z, loss=which, direct=True)[2]
    b = stochastic_gradient(DenseGram(K), t, Z, loss=which, cg_tol=1e-13, cg_max_iter=500)[2]
    assert torch.allclose(a, b, atol=1e-8)


def test_cssp_from_data_equals_cssp_from_gram():
    X, K = _data(n=6, m=4)
    t = torch.tensor([0.3, 0.6, 0.5, 0.8, 0.2, 0.4], dtype=D)
    Z = _all_signs(6)
    a = stochastic_gradient(FeatureGram(X), t, Z, loss="trace", direct=True)[0]
    b = stochastic_gradient(DenseGram(K), t, Z, loss="trace", direct=True)[0]
    assert torch.allclose(a, b, atol=1e-10)


# 10: L_t is SPD and its matrix-free product is right ------------------------------------------
def test_L_is_spd_and_matvec_matches_dense():
    K = _rbf(n=8)
    t = torch.linspace(0.0, 0.95, 8, dtype=D)
    L = _L(K, t, 0.5)
    lo = float(torch.linalg.eigvalsh(L)[0])
    assert lo >= 0.5 * float((1 - t * t).min()) - 1e-12
    S = _Solver(DenseGram(K), None, t, 0.5, tol=1e-12, max_iter=100)
    V = torch.randn(8, 3, dtype=D, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(S.matvec(V), L @ V, atol=1e-12)
    assert torch.allclose(S.solve(V), torch.linalg.solve(L, V), atol=1e-8)


# 11: Lemma 3.3 (pruning) ----------------------------------------------------------------------
def test_pruning_lemma_and_reduced_gradient():
    K = _rbf(n=7)
    t = torch.tensor([0.4, 0.0, 0.7, 0.0, 0.5, 0.8, 0.3], dtype=D)
    r = torch.randn(7, dtype=D, generator=torch.Generator().manual_seed(1))
    q = torch.linalg.solve(_L(K, t, 1.0), t * r)
    act = torch.nonzero(t).flatten()
    assert torch.all(q[t == 0] == 0)
    q_red = torch.linalg.solve(_L(K[act][:, act], t[act], 1.0), t[act] * r[act])
    assert torch.allclose(q[act], q_red, atol=1e-12)
    # the active-set estimator (full z, reduced solves) is still exactly unbiased
    Z = _all_signs(7)
    for which, grad in (("trace", trace_gradient), ("frobenius", frobenius_gradient)):
        g_act = stochastic_gradient(DenseGram(K), t[act], Z, loss=which, active=act,
                                    direct=True)[0]
        assert torch.allclose(g_act, grad(K, t)[act], atol=1e-12)


# 12: reparametrisation ------------------------------------------------------------------------
def test_reparametrisation():
    assert float(w_from_t(0.5)) == pytest.approx(math.sqrt(math.log(2)))
    assert float(t_from_w(w_from_t(0.5))) == pytest.approx(0.5)
    w = torch.linspace(-3, 3, 61, dtype=D)
    t = t_from_w(w)
    assert float(t.min()) >= 0 and float(t.max()) < 1
    assert torch.all(torch.diff(t_from_w(w[30:])) > 0)  # monotone in w^2
    K = _rbf()
    w0 = torch.tensor([0.3, -0.8, 1.1, 0.0, 0.6, -1.4, 0.9], dtype=D)
    g_t = frobenius_gradient(K, t_from_w(w0), 1.0, 0.2)
    g_w = g_t * 2 * w0 * torch.exp(-w0 * w0)
    h = 1e-6
    fd = torch.stack([
        (frobenius_loss(K, t_from_w(w0 + h * e), 1.0, 0.2)
         - frobenius_loss(K, t_from_w(w0 - h * e), 1.0, 0.2)) / (2 * h)
        for e in torch.eye(7, dtype=D)])
    assert torch.allclose(g_w, fd, atol=1e-7)
    assert float(g_w[3]) == 0.0  # w_j = 0 is absorbing


# 17, 18: reformulation, single-flip identity --------------------------------------------------
def test_per_column_ridge_reformulation():
    K = _rbf()
    t = torch.linspace(0.2, 0.9, 7, dtype=D)
    R = K @ torch.linalg.solve(K + 0.7 * torch.diag(1 / t**2 - 1), K)
    assert torch.allclose(relaxed_nystroem(K, t, 0.7), R, atol=1e-9)


def test_single_flip_identity():
    X, K = _data(n=6, m=5)
    s = torch.tensor([1, 0, 0, 1, 0, 0], dtype=D)
    E = K - _nystroem(K, s)
    lam = 0.5
    for j in (1, 2, 4):
        s2 = s.clone()
        s2[j] = 1
        diff = float(trace_loss(K, s2, 1.0, lam) - trace_loss(K, s, 1.0, lam))
        assert diff == pytest.approx(lam - float(E[:, j] @ E[:, j] / E[j, j]), abs=1e-9)


# 13, 15: approximation factor and behaviour ---------------------------------------------------
def test_approximation_factor_at_least_one_for_random_subsets():
    K = _rbf(n=30, seed=2)
    best = best_rank_k_errors(K, [4])[4]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        S = torch.randperm(30, generator=g)[:4]
        Kh = K[:, S] @ torch.linalg.pinv(K[S][:, S]) @ K[S]
        s, U = torch.linalg.eigh(Kh)
        F = U * s.clamp_min(0).sqrt()
        e = nystroem_errors(K, F)
        assert approximation_factor(e["frobenius_sq"], best["frobenius_sq"]) >= 1 - 1e-9
        assert approximation_factor(e["trace"], best["trace"]) >= 1 - 1e-9
    assert approximation_factor(0.0, 0.0) == 1.0  # rank(K) <= k guard


def test_larger_lambda_selects_fewer_and_ends_near_a_corner():
    g = torch.Generator().manual_seed(0)
    F = torch.randn(25, 6, generator=g, dtype=D) * torch.tensor([4, 3, 2, 1, .5, .25], dtype=D)
    K = F @ F.T
    sizes = []
    for lam in (0.5, 5.0, 50.0):
        res = continuous_landmarks(K, lam, gradient="exact", max_iter=400, random_state=0)
        sizes.append(len(res.support))
        # exact gradient descent ends near a corner: every t_j is 0 or well above tau
        assert bool(((res.t == 0) | (res.t > 0.75)).all())
    assert sizes[0] >= sizes[1] >= sizes[2] and sizes[0] > sizes[2]


def test_continuous_beats_uniform_on_low_rank_matrix():
    from kernelflow.datasets._landmarks import make_low_rank_psd

    K = torch.as_tensor(make_low_rank_psd(60, 6, noise=1e-3, decay=0.6, random_state=0))
    k = 6
    best = best_rank_k_errors(K, [k])[k]["frobenius_sq"]
    res = search_lambda(K, k, random_state=0, max_iter=200)
    assert len(res.support) == k

    def af(S):
        return float(((K - _nystroem(K, torch.zeros(60, dtype=D).index_fill(0, S, 1))) ** 2)
                     .sum()) / best

    g = torch.Generator().manual_seed(1)
    uni = sum(af(torch.randperm(60, generator=g)[:k]) for _ in range(10)) / 10
    assert af(res.support) <= uni


def test_search_hits_k_and_falls_back_to_top_k():
    K = _rbf(n=40, seed=3)
    res = search_lambda(K, 5, random_state=0, max_iter=150)
    assert len(res.support) == 5 and res.method in ("threshold", "top-k")
    # with a single probe far below the right penalty, the top-k fallback is used
    res = search_lambda(K, 5, lam_init=1e-8, max_search=1, random_state=0, max_iter=60)
    assert res.method == "top-k" and len(res.support) == 5
    assert set(res.support.tolist()) == set(torch.topk(res.t, 5).indices.tolist())


def test_column_subset_selection_on_data_matrix():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(30, 3, generator=g, dtype=D) @ torch.randn(3, 15, generator=g, dtype=D)
    res = continuous_column_subset(A, 3, random_state=0, max_iter=200)
    assert len(res.support) == 3
    # rank 3: three independent columns reproduce A exactly
    assert column_subset_error(A, res.support) < 1e-8 * float((A * A).sum())


def test_record_path_and_history():
    K = _rbf(n=10)
    res = continuous_landmarks(K, 0.5, max_iter=20, record_path=True, random_state=0, tol=0)
    assert res.path.shape == (21, 10)
    assert torch.allclose(res.path[0], torch.full((10,), 0.5, dtype=D))
    assert len(res.loss_history) == 20


def test_matrix_free_kernel_path_matches_dense():
    from kernelflow.kernels import Gaussian
    from kernelflow.landmarks import KernelGram

    X = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=D)
    ker = Gaussian(1.0)
    t = torch.linspace(0.1, 0.9, 30, dtype=D)
    act = torch.arange(0, 30, 2)
    Z = (2 * torch.randint(0, 2, (30, 4), generator=torch.Generator().manual_seed(1)) - 1).to(D)
    lazy = KernelGram(ker, X, cache=False)  # every product through KernelOperator
    assert lazy._dense is None
    for which in ("trace", "frobenius"):
        a = stochastic_gradient(lazy, t[act], Z, loss=which, active=act, cg_tol=1e-12,
                                cg_max_iter=200)[0]
        b = stochastic_gradient(DenseGram(ker(X, X)), t[act], Z, loss=which, active=act,
                                direct=True)[0]
        assert torch.allclose(a, b, atol=1e-7)


def test_trim_keeps_a_small_cluster_covered():
    from kernelflow.landmarks.continuous import _top_k, _trim

    # 20 points in a big cluster, 1 far away; the selected set holds 4 big-cluster points and
    # the lone one, with the lone one's t smallest: top-k by t would drop it, the trim keeps it
    P = torch.cat([torch.randn(20, 2, generator=torch.Generator().manual_seed(0), dtype=D),
                   torch.tensor([[30.0, 30.0]], dtype=D)])
    K = torch.exp(-torch.cdist(P, P) ** 2 / 2)
    support = torch.tensor([0, 5, 9, 13, 20])
    t = torch.zeros(21, dtype=D)
    t[support] = torch.tensor([0.99, 0.98, 0.97, 0.96, 0.6], dtype=D)
    assert 20 not in _top_k(DenseGram(K), t, 4).tolist()
    assert 20 in _trim(DenseGram(K), support, 4).tolist()


def test_lambda_extrapolation_with_a_flat_slope_does_not_overflow():
    from kernelflow.landmarks.continuous import _extrapolate

    # sizes barely change over a decade of lambda: the secant's step would be exp(1260)
    probes = [(1.0, 400), (10.0, 399)]
    assert _extrapolate(probes, 100, 1.0, up=True) == 100.0
    assert _extrapolate(probes, 100, 1.0, up=False) == 1.0 / 100.0
    # an ordinary slope is unchanged: sizes halve per doubling of lambda, k is 4x below
    step = _extrapolate([(1.0, 1600), (2.0, 800)], 200, 2.0, up=True) / 2.0
    assert step == pytest.approx(4.0)


# preconditioned CG: pivoted-Cholesky preconditioner ------------------------------------------
def _rbf_points(n, d=2, sigma=0.5, seed=0):
    from kernelflow.kernels import Gaussian

    X = torch.rand(n, d, dtype=D, generator=torch.Generator().manual_seed(seed))
    return Gaussian(sigma)(X, X)


def test_low_rank_preconditioner_is_exact_with_a_full_factor():
    from kernelflow.landmarks._relaxation import low_rank_preconditioner

    K = _rbf_points(40, sigma=1.0)
    F = torch.linalg.cholesky(K + 1e-10 * torch.eye(40, dtype=D))
    t = torch.linspace(0.05, 0.95, 40, dtype=D)
    apply = low_rank_preconditioner(F, K.diagonal(), t, 0.3)
    L = _L(K, t, 0.3)
    assert torch.allclose(apply(L), torch.eye(40, dtype=D), atol=1e-6)


@pytest.mark.parametrize("idx", [None, "half"])
def test_cholesky_preconditioned_cg_same_solution_fewer_iterations(idx):
    from kernelflow.landmarks.continuous import cholesky_factor

    n = 200
    K = _rbf_points(n)
    gram = DenseGram(K)
    gen = torch.Generator().manual_seed(3)
    act = None if idx is None else torch.arange(0, n, 2)
    m = n if act is None else act.numel()
    t = 0.05 + 0.9 * torch.rand(m, dtype=D, generator=gen)
    B = torch.randn(m, 4, dtype=D, generator=gen)
    F = cholesky_factor(gram, 40)
    plain = _Solver(gram, act, t, 0.1, tol=1e-10, max_iter=2000)
    pre = _Solver(gram, act, t, 0.1, tol=1e-10, max_iter=2000, factor=F)
    x0, x1 = plain.solve(B), pre.solve(B)
    Kp = K if act is None else K[act][:, act]
    exact = torch.linalg.solve(_L(Kp, t, 0.1), B)
    assert torch.allclose(x0, exact, rtol=1e-6, atol=1e-8)
    assert torch.allclose(x1, exact, rtol=1e-6, atol=1e-8)
    assert pre.n_cg_iter < plain.n_cg_iter / 2


def test_stochastic_gradient_same_with_either_preconditioner():
    from kernelflow.landmarks.continuous import cholesky_factor

    n = 100
    K = _rbf_points(n, seed=4)
    gram = DenseGram(K)
    gen = torch.Generator().manual_seed(5)
    t = 0.1 + 0.8 * torch.rand(n, dtype=D, generator=gen)
    Z = (2 * torch.randint(0, 2, (n, 3), generator=gen) - 1).to(D)
    for loss in ("trace", "frobenius"):
        s0, s1 = {}, {}
        g0 = stochastic_gradient(gram, t, Z, loss=loss, delta=0.5, cg_tol=1e-10,
                                 cg_max_iter=1000, stats=s0)[0]
        g1 = stochastic_gradient(gram, t, Z, loss=loss, delta=0.5, cg_tol=1e-10,
                                 cg_max_iter=1000, factor=cholesky_factor(gram, 30),
                                 stats=s1)[0]
        assert torch.allclose(g0, g1, rtol=1e-6, atol=1e-8 * float(g0.abs().max()))
        assert s1["cg_iter"] < s0["cg_iter"]


# warm-started lambda probes -------------------------------------------------------------------
def test_warm_started_probes_select_as_cold_ones():
    # distinct diagonal: the best k columns are the k largest entries, cold or warm
    K = torch.diag(torch.linspace(3.0, 0.1, 30, dtype=D) ** 2)
    for k in (4,):
        kw = dict(loss="trace", delta=1.0, max_iter=100, lam_init=0.05, random_state=0)
        cold = search_lambda(K, k, warm_start=False, **kw)
        warm = search_lambda(K, k, warm_start=True, **kw)
        assert cold.support.tolist() == list(range(k))
        assert warm.support.tolist() == list(range(k))
        # the search did start a probe from a smaller run's active set
        assert any(size > k for _, size in warm.probes[:-1])


def _trace_error(K, idx):
    C = K[:, idx]
    return float(torch.trace(K - C @ torch.linalg.pinv(C[idx], hermitian=True) @ C.T))


def test_warm_started_probes_same_quality_on_a_kernel():
    from kernelflow.kernels import Gaussian
    from kernelflow.landmarks import ContinuousSelector, GreedySelector

    X = torch.rand(60, 2, dtype=D, generator=torch.Generator().manual_seed(7))
    K = Gaussian(0.3)(X, X)
    errs = {}
    for warm in (False, True):
        sel = ContinuousSelector(warm_start=warm, max_iter=60, n_mc=4)
        idx = sel.run(X, Gaussian(0.3), 10, random_state=1).support
        errs[warm] = _trace_error(K, idx)
    g = GreedySelector().select(X, Gaussian(0.3), 10).indices
    eg = _trace_error(K, g)
    assert errs[True] <= 1.25 * errs[False]
    assert errs[True] < 3 * eg


def test_active_start_is_absorbing_and_checked():
    K = torch.diag(torch.linspace(3.0, 0.1, 12, dtype=D))
    res = continuous_landmarks(K, 0.01, loss="trace", active=[4, 5, 6], max_iter=50,
                               random_state=0)
    assert set(torch.nonzero(res.t).flatten().tolist()) <= {4, 5, 6}
    with pytest.raises(ValueError, match="active"):
        continuous_landmarks(K, 0.01, active=[0, 12], max_iter=5)
    with pytest.raises(ValueError, match="preconditioner"):
        continuous_landmarks(K, 0.01, preconditioner="ilu", max_iter=5)


# the paper's setting: trace loss, absolute delta ----------------------------------------------
def test_paper_setting_options_accepted_and_validated():
    from kernelflow.kernels import Linear
    from kernelflow.landmarks import ContinuousSelector

    A = torch.randn(40, 12, dtype=D, generator=torch.Generator().manual_seed(2))
    P = A.T.contiguous()  # one candidate per column of A
    paper = ContinuousSelector(loss="trace", delta=1.0, relative_delta=False, k_tol=0.0,
                               max_iter=100)
    res = paper.run(P, Linear(), 4, random_state=0)
    # relative_delta=False passes delta = 1 itself: the same run as the search at delta = 1
    ref = search_lambda(P @ P.T, 4, loss="trace", delta=1.0, k_tol=0.0, max_iter=100,
                        warm_start=True, preconditioner="cholesky", direct_max=1000,
                        random_state=torch.Generator().manual_seed(0))
    assert res.support.tolist() == ref.support.tolist()
    assert torch.allclose(res.t, ref.t)
    assert res.support.numel() == 4
    for bad in ({"relative_delta": "no"}, {"preconditioner": "ilu"}, {"precond_rank": 0},
                {"warm_start": 1.5}, {"loss": "nuclear"}, {"delta": 0.0}):
        with pytest.raises((ValueError, TypeError)):
            ContinuousSelector(**bad).run(P, Linear(), 4, random_state=0)


# the active block held through the solves -----------------------------------------------------
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("loss", ["trace", "frobenius"])
def test_stored_active_block_gathered_once_same_gradient(loss, direct, monkeypatch):
    from kernelflow.kernels import Gaussian
    from kernelflow.landmarks import KernelGram
    from kernelflow.operators import DenseOperator

    X = torch.rand(120, 2, dtype=D, generator=torch.Generator().manual_seed(11))
    stored = KernelGram(Gaussian(0.4), X, cache=True)
    lazy = KernelGram(Gaussian(0.4), X, cache=False)  # every product from the kernel engine
    assert stored.stored and not lazy.stored
    gen = torch.Generator().manual_seed(12)
    act = torch.arange(0, 120, 3)
    t = 0.1 + 0.8 * torch.rand(act.numel(), dtype=D, generator=gen)
    Z = (2 * torch.randint(0, 2, (120, 4), generator=gen) - 1).to(D)
    gathers = []
    subset = DenseOperator._subset

    def counting(self, rows, cols):
        if rows is not None and cols is not None:
            gathers.append(rows.numel())
        return subset(self, rows, cols)

    monkeypatch.setattr(DenseOperator, "_subset", counting)
    kw = dict(loss=loss, delta=0.1, active=act, cg_tol=1e-12, cg_max_iter=500, direct=direct)
    s1: dict = {}
    g1, est1, _, _ = stochastic_gradient(stored, t, Z, stats=s1, **kw)
    assert gathers == [act.numel()]  # one copy of K[act][:, act] for all solves and products
    assert direct or s1["cg_iter"] > 10
    g0, est0, _, _ = stochastic_gradient(lazy, t, Z, **kw)
    assert torch.allclose(g1, g0, rtol=1e-8, atol=1e-10 * float(g0.abs().max()))
    assert est1 == pytest.approx(est0, rel=1e-9)


def test_cg_selection_same_with_the_block_held_or_gathered_per_product(monkeypatch):
    from kernelflow.kernels import Gaussian
    from kernelflow.landmarks import ContinuousSelector

    X = torch.rand(80, 2, dtype=D, generator=torch.Generator().manual_seed(13))

    def run(cache=True):
        sel = ContinuousSelector(cache=cache, direct_max=0, max_iter=30, n_mc=4)
        return sel.run(X, Gaussian(0.3), 8, random_state=2)

    held = run()
    lazy = run(cache=False)  # products from the kernel engine: equal up to rounding
    assert torch.allclose(held.t, lazy.t, atol=1e-8)
    # a fresh copy of the active block at every product gives exactly the same run
    monkeypatch.setattr(_Solver, "sub_matmul",
                        lambda self, V: self.gram.op.subset(self.idx, self.idx) @ V)
    fresh = run()
    assert torch.equal(held.t, fresh.t)
    assert held.support.tolist() == fresh.support.tolist() and len(held.support) == 8
