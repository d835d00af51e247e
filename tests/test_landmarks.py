"""Landmark selectors: interface, entry counts, baselines' properties, bad input."""

import itertools
import math

import numpy as np
import pytest
import torch

from kernelflow.kernels import Gaussian, Kernel
from kernelflow.landmarks import (
    KDPP,
    SELECTORS,
    BlockRPCholesky,
    DenseGram,
    GreedySelector,
    KernelGram,
    KMeansCenters,
    PivotedCholesky,
    RecursiveRLS,
    RPCholesky,
    best_rank_k_errors,
    bless,
    greedy_selection,
    kmeans,
    nystroem_errors,
    nystroem_factor,
    pivoted_cholesky,
    recursive_rls,
    resolve_centers,
    ridge_leverage_scores,
    sample_kdpp,
)

D = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _X(n=60, d=2, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=D)


class CountingKernel:
    """Wraps a kernel and counts every kernel entry it evaluates."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.count = 0

    def __call__(self, X1, X2=None):
        X2 = X1 if X2 is None else X2
        self.count += X1.shape[0] * X2.shape[0]
        return self.kernel(X1, X2)

    def diag(self, X):
        self.count += X.shape[0]
        return self.kernel.diag(X)


# interface --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_registered_name_resolves(name):
    X = _X(50)
    sel = resolve_centers(name, X, Gaussian(1.0), 6, random_state=0)
    assert sel.centers.shape == (6, 2)
    if sel.indices is not None:
        assert len(set(sel.indices.tolist())) == 6
        assert torch.equal(sel.centers, X[sel.indices])
    again = resolve_centers(name, X, Gaussian(1.0), 6, random_state=0)
    assert torch.allclose(again.centers, sel.centers)  # seeded


def test_resolve_centers_takes_objects_and_explicit_centres():
    X = _X(30)
    sel = resolve_centers(RPCholesky(), X, Gaussian(1.0), 4, random_state=1)
    assert sel.centers.shape == (4, 2)
    C = np.zeros((3, 2))
    assert resolve_centers(C, X, Gaussian(1.0), None).centers.shape == (3, 2)


# pivoted Cholesky family ------------------------------------------------------------------
@pytest.mark.parametrize("selector", [RPCholesky(), PivotedCholesky(),
                                      BlockRPCholesky(block_size=5)])
def test_cholesky_selectors_touch_exactly_k_plus_one_times_n_entries(selector):
    X = _X(200, 3)
    ker = CountingKernel(Gaussian(1.5))
    k = 20
    sel = selector.select(X, ker, k, random_state=0)
    assert len(sel.indices) == k
    assert ker.count == (k + 1) * 200


def test_partial_cholesky_factor_is_the_nystroem_approximation():
    X = _X(40)
    K = Gaussian(1.0)(X, X)
    F, piv = pivoted_cholesky(DenseGram(K), 8, rule="random",
                              generator=torch.Generator().manual_seed(0))
    C = K[:, piv]
    assert torch.allclose(F @ F.T, C @ torch.linalg.pinv(K[piv][:, piv]) @ C.T, atol=1e-8)
    F2, piv2 = pivoted_cholesky(DenseGram(K), 8, rule="greedy")
    assert int(piv2[0]) == int(torch.argmax(K.diagonal()))
    Fb, pivb = pivoted_cholesky(DenseGram(K), 8, rule="random", block_size=3,
                                generator=torch.Generator().manual_seed(0))
    Cb = K[:, pivb]
    assert torch.allclose(Fb @ Fb.T, Cb @ torch.linalg.pinv(K[pivb][:, pivb]) @ Cb.T,
                          atol=1e-8)


def test_pivoted_cholesky_stops_at_rank():
    F0 = _X(30, 3)
    K = F0 @ F0.T  # rank 3
    F, piv = pivoted_cholesky(DenseGram(K), 10, rule="greedy")
    assert F.shape[1] == 3 and torch.allclose(F @ F.T, K, atol=1e-8)


# greedy (paper baseline) ------------------------------------------------------------------
def test_greedy_first_pick_and_gain_is_exact_error_decrease():
    X = _X(12, 3, seed=4)
    K = Gaussian(1.0)(X, X)
    idx, gains = greedy_selection(K, 4)
    assert int(idx[0]) == int(torch.argmax((K * K).sum(0) / K.diagonal()))
    errs = [float(K.trace())]
    for j in range(1, 5):
        S = idx[:j]
        Kh = K[:, S] @ torch.linalg.pinv(K[S][:, S]) @ K[S]
        errs.append(float((K - Kh).trace()))
    assert np.allclose(-np.diff(errs), gains.numpy(), atol=1e-9)  # criterion = decrease
    assert all(a >= b - 1e-12 for a, b in zip(errs, errs[1:]))  # non-increasing
    idxf, gainsf = greedy_selection(K, 3, criterion="frobenius")
    fro = [float((K * K).sum())]
    for j in range(1, 4):
        S = idxf[:j]
        Kh = K[:, S] @ torch.linalg.pinv(K[S][:, S]) @ K[S]
        fro.append(float(((K - Kh) ** 2).sum()))
    assert np.allclose(-np.diff(fro), gainsf.numpy(), atol=1e-9)


def test_greedy_is_no_better_than_brute_force():
    X = _X(10, 2, seed=5)
    K = Gaussian(0.7)(X, X)

    def err(S):
        S = list(S)
        return float((K - K[:, S] @ torch.linalg.pinv(K[S][:, S]) @ K[S]).trace())

    best = min(err(S) for S in itertools.combinations(range(10), 3))
    idx, _ = greedy_selection(K, 3)
    assert err(idx.tolist()) >= best - 1e-12
    assert err(idx.tolist()) <= 2 * best  # and not far off on a tiny problem


def _greedy_reference(K, k, criterion):
    """Farahat's greedy selection as written: E and E^2 formed anew at every step."""
    E = K.clone()
    floor = 1e-12 * float(E.diagonal().max())
    chosen, gains = [], []
    for _ in range(k):
        c = E.diagonal().clone()
        E2 = E @ E
        f = E2.diagonal()  # ||E[:, i]||^2
        ok = c > floor
        ok[chosen] = False
        if not bool(ok.any()):
            break
        cs = torch.where(ok, c, torch.ones_like(c))
        if criterion == "trace":
            score = f / cs
        else:
            score = 2 * (E @ E2).diagonal() / cs - f * f / (cs * cs)
        score = torch.where(ok, score, torch.full_like(score, -math.inf))
        j = int(torch.argmax(score))
        chosen.append(j)
        gains.append(float(score[j]))
        E = E - torch.outer(E[:, j], E[:, j]) / c[j]
    return chosen, gains


@pytest.mark.parametrize("criterion", ["trace", "frobenius"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_in_place_updates_select_as_the_reference(criterion, seed):
    # the residual, diag(E^2) (trace) and E^2 (frobenius) are updated in place by rank-one
    # steps; the selection must be the one of the straightforward recomputation
    X = _X(150, 3, seed=seed)
    K = Gaussian(1.5)(X, X)
    ref_idx, ref_gains = _greedy_reference(K, 25, criterion)
    idx, gains = greedy_selection(K, 25, criterion=criterion)
    assert idx.tolist() == ref_idx
    assert np.allclose(gains.numpy(), ref_gains, rtol=1e-7, atol=1e-12)
    gram_idx, _ = greedy_selection(KernelGram(Gaussian(1.5), X), 25, criterion=criterion)
    assert gram_idx.tolist() == ref_idx


@pytest.mark.parametrize("criterion", ["trace", "frobenius"])
def test_greedy_in_place_stops_at_the_rank_as_the_reference(criterion):
    A = _X(40, 3, seed=3)
    K = A @ A.T  # rank 3: the residual vanishes after three picks
    ref_idx, ref_gains = _greedy_reference(K, 6, criterion)
    idx, gains = greedy_selection(K, 6, criterion=criterion)
    assert len(ref_idx) == 3 and len(idx) == 3
    # the third pick is a tie (a rank-one residual scores the same on every column)
    assert idx[:2].tolist() == ref_idx[:2]
    assert np.allclose(gains.numpy(), ref_gains, rtol=1e-9)
    S = idx.tolist()
    resid = K - K[:, S] @ torch.linalg.solve(K[S][:, S], K[S])
    assert float(resid.abs().max()) < 1e-9 * float(K.abs().max())
    assert torch.equal(K, A @ A.T)  # the input is left as it was


# k-DPP ------------------------------------------------------------------------------------
def test_kdpp_frequencies_match_determinants():
    g = torch.Generator().manual_seed(0)
    B = torch.randn(5, 5, generator=g, dtype=D)
    L = B @ B.T + 0.5 * torch.eye(5, dtype=D)
    subsets = list(itertools.combinations(range(5), 2))
    p = np.array([float(torch.det(L[list(S)][:, list(S)])) for S in subsets])
    p /= p.sum()
    N = 2000
    counts = dict.fromkeys(subsets, 0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(N):
        counts[tuple(sample_kdpp(L, 2, generator=gen).tolist())] += 1
    obs = np.array([counts[S] for S in subsets])
    chi2 = float(((obs - N * p) ** 2 / (N * p)).sum())
    # 9 degrees of freedom: the 0.999 quantile is 27.9
    assert chi2 < 27.9


def test_kdpp_rejects_k_above_rank():
    F = _X(10, 2)
    with pytest.raises(ValueError, match="rank"):
        sample_kdpp(F @ F.T, 3)


# ridge leverage scores ----------------------------------------------------------------------
def test_recursive_rls_distinct_and_scores_close_to_exact():
    X = _X(400, 2, seed=1)
    gram = KernelGram(Gaussian(1.0), X)
    idx, scores, lam = recursive_rls(gram, 40, generator=torch.Generator().manual_seed(0),
                                     return_scores=True)
    assert len(set(idx.tolist())) == 40
    exact = ridge_leverage_scores(gram.to_dense(), lam)
    ratio = scores / exact
    # the estimates are constant-factor over-estimates (Musco & Musco, Lemma 6)
    assert float(ratio.quantile(0.05)) > 0.5 and float(ratio.quantile(0.95)) < 4.0
    assert float(torch.corrcoef(torch.stack([scores, exact]))[0, 1]) > 0.9


def test_bless_scores_close_to_exact():
    X = _X(400, 2, seed=2)
    gram = KernelGram(Gaussian(1.0), X)
    idx, scores, lam = bless(gram, 40, generator=torch.Generator().manual_seed(0),
                             return_scores=True)
    assert len(set(idx.tolist())) == 40
    exact = ridge_leverage_scores(gram.to_dense(), lam)
    ratio = scores / exact
    assert 0.5 < float(ratio.median()) < 2.0
    assert float(torch.corrcoef(torch.stack([scores, exact]))[0, 1]) > 0.8


# k-means ------------------------------------------------------------------------------------
def test_kmeans_centres_and_approximation_factor():
    from kernelflow.datasets._landmarks import make_unequal_clusters

    X, _, labels = make_unequal_clusters(300, 2, n_clusters=4, random_state=0)
    X = torch.as_tensor(X)
    C, lab, inertia = kmeans(X, 4, generator=torch.Generator().manual_seed(0))
    assert C.shape == (4, 2) and inertia > 0
    sel = KMeansCenters().select(X, Gaussian(1.0), 4, random_state=0)
    assert sel.indices is None and int(sel.weights.sum()) == 300
    # AF >= 1 also holds for centres that are not data points
    K = Gaussian(1.0)(X, X)
    best = best_rank_k_errors(K, [4])[4]
    e = nystroem_errors(K, nystroem_factor(X, Gaussian(1.0), sel.centers))
    assert e["frobenius_sq"] >= best["frobenius_sq"] * (1 - 1e-9)


def test_lazy_frobenius_error_matches_dense():
    X = _X(70)
    ker = Gaussian(1.0)
    F = nystroem_factor(X, ker, X[:7])
    dense = nystroem_errors(Gaussian(1.0)(X, X), F)
    lazy = nystroem_errors(KernelGram(ker, X), F)
    assert lazy["frobenius_sq"] == pytest.approx(dense["frobenius_sq"], rel=1e-8)
    assert lazy["trace"] == pytest.approx(dense["trace"], rel=1e-10)


# bad input ----------------------------------------------------------------------------------
class NegativeKernel(Kernel):
    """Not PSD: minus a Gaussian."""

    def _block(self, P1, P2):
        return -torch.exp(-torch.cdist(P1, P2) ** 2 / 2)

    def diag(self, X):
        return -torch.ones(X.shape[0], dtype=X.dtype)


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_bad_k(name):
    X = _X(20)
    with pytest.raises(ValueError, match="positive"):
        resolve_centers(name, X, Gaussian(1.0), 0)
    with pytest.raises(ValueError, match="k"):
        resolve_centers(name, X, Gaussian(1.0), 21)
    with pytest.raises(TypeError):
        resolve_centers(name, X, Gaussian(1.0), 2.5)


@pytest.mark.parametrize("name", [n for n in sorted(SELECTORS) if n != "uniform"])
def test_nan_input(name):
    X = _X(20)
    X[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        resolve_centers(name, X, Gaussian(1.0), 3, random_state=0)


@pytest.mark.parametrize("name", ["pivoted_cholesky", "rpcholesky", "block_rpcholesky", "rls",
                                  "bless", "greedy", "kdpp", "continuous"])
def test_non_psd_kernel(name):
    with pytest.raises(ValueError, match="positive semi-definite"):
        resolve_centers(name, _X(20), NegativeKernel(), 3, random_state=0)


def test_non_psd_matrix():
    A = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=D)
    for fn in (lambda: greedy_selection(A, 1), lambda: sample_kdpp(A, 1),
               lambda: DenseGram(A)):
        with pytest.raises(ValueError, match="positive semi-definite"):
            fn()
    with pytest.raises(ValueError, match="symmetric"):
        DenseGram(torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=D))


def test_size_limits():
    with pytest.raises(ValueError, match="max_n"):
        GreedySelector(max_n=10).select(_X(20), Gaussian(1.0), 2)
    with pytest.raises(ValueError, match="max_n"):
        KDPP(max_n=10).select(_X(20), Gaussian(1.0), 2)


def test_rls_selector_reports_scores():
    sel = RecursiveRLS().select(_X(100), Gaussian(1.0), 10, random_state=0)
    assert sel.weights.shape == (10,) and bool((sel.weights > 0).all())
    assert math.isfinite(float(sel.weights.sum()))


def test_greedy_pivoted_cholesky_stops_on_a_rank_deficient_kernel():
    """A full-rank request on a numerically rank-deficient kernel ends (it used to loop for
    ever when a pivot's recomputed residual fell below the floor while its tracked one had not)
    and gives a factor that reproduces the kernel."""
    import signal

    from kernelflow.landmarks.cholesky import pivoted_cholesky

    X = torch.as_tensor(np.random.RandomState(1).randn(80, 2))
    K = torch.exp(-0.5 * torch.cdist(X, X) ** 2)

    def _timeout(*_):
        raise TimeoutError("pivoted_cholesky did not stop")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        F, piv = pivoted_cholesky(K, 80, rule="greedy")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert F.shape[1] == piv.numel() <= 80
    assert len(set(piv.tolist())) == piv.numel()
    assert torch.allclose(F @ F.T, K, atol=1e-6)
