"""Absurd parameters and unusual input types are refused early and clearly, or handled.

- bandwidths at which the kernel matrix of X is the identity or cannot be evaluated, on every
  early-stopped path estimator (the eigensolver of the step-size rule used to fail inside torch);
- Python lists, tuples, pandas and torch inputs to every landmark selector and landmark function
  (the functions used to fail with ``AttributeError``);
- Taylor feature maps whose size ``C(M + d, d)`` is astronomically large, refused in closed form
  before anything is built (the count used to be enumerated, for minutes).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import kernelflow.landmarks as L
from kernelflow.estimators import (
    KernelCoordinateDescent,
    KernelGradientDescent,
    KernelHuberGradientDescent,
    KernelSignGradient,
)
from kernelflow.features.taylor import (
    _capped_count,
    check_taylor_size,
    n_taylor_features,
    taylor_features,
    taylor_kernel,
    taylor_multi_indices,
)
from kernelflow.kernels import Gaussian, median_heuristic
from kernelflow.online import PKAWVTaylor
from kernelflow.utils._finite import MemoryBudgetError

PATHS = [KernelSignGradient, KernelGradientDescent, KernelCoordinateDescent,
         KernelHuberGradientDescent]


def _data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


# ---- bandwidths on the path estimators ----------------------------------------------------------
@pytest.mark.parametrize("cls", PATHS)
@pytest.mark.parametrize("params", [{"gamma": 1e300}, {"gamma": 1e30}, {"sigma": 1e-9},
                                    {"kernel": Gaussian(1e-20)}],
                         ids=["gamma=1e300", "gamma=1e30", "sigma=1e-9", "Gaussian(1e-20)"])
def test_unevaluable_bandwidth_is_a_value_error_naming_the_parameter(cls, params):
    X, y = _data()
    name = next(iter(params))
    est = cls(max_iter=20, **params)
    with pytest.raises(ValueError, match=rf"^{name}=.* is out of range for X") as info:
        est.fit(X, y)
    assert not isinstance(info.value, torch.linalg.LinAlgError)
    # the advice is the median heuristic of X
    med = median_heuristic(torch.as_tensor(X))
    hint = f"{0.5 / med**2:.3g}" if name == "gamma" else f"{med:.3g}"
    assert hint in str(info.value)
    assert not hasattr(est, "dual_coef_")


@pytest.mark.parametrize("cls", PATHS)
def test_bandwidth_giving_the_identity_kernel_is_refused(cls):
    # integer points, at least 1 apart: exp(-gamma) underflows for gamma = 1e4 while the
    # diagonal is still computed exactly, so K is the identity and nothing couples the rows
    X = np.arange(30, dtype=np.float64)[:, None]
    y = np.sin(X[:, 0])
    K = Gaussian(sigma=1 / math.sqrt(2e4))(torch.as_tensor(X))
    assert torch.equal(K, torch.eye(30, dtype=K.dtype))  # the premise
    with pytest.raises(ValueError, match="kernel matrix is the identity"):
        cls(gamma=1e4, max_iter=20).fit(X, y)


@pytest.mark.parametrize("cls", PATHS)
def test_large_but_meaningful_bandwidths_still_fit(cls):
    X, y = _data()
    # gamma = 30: k(x_i, x_j) is tiny for most pairs but not all zero, the kernel is exact
    est = cls(gamma=30.0, max_iter=20).fit(X, y)
    np.testing.assert_allclose(est.predict(X[:3]), est.predict(X[:3]))
    assert np.all(np.isfinite(est.predict(X)))


# ---- landmark selectors and functions take array-likes ------------------------------------------
def _forms(A):
    return {"list": A.tolist(), "tuple": tuple(map(tuple, A)), "pandas": pd.DataFrame(A),
            "torch": torch.as_tensor(A), "numpy": A}


SELECTORS = [L.Uniform(), L.PivotedCholesky(), L.RPCholesky(), L.RecursiveRLS(), L.BLESS(),
             L.KDPP(), L.KMeansCenters(), L.GreedySelector(), L.ContinuousSelector(max_iter=5)]


@pytest.mark.parametrize("selector", SELECTORS, ids=lambda s: type(s).__name__)
def test_every_selector_gives_the_same_landmarks_for_every_input_type(selector):
    X, _ = _data(30, 2)
    ref = selector.select(X, Gaussian(1.0), 4, random_state=0)
    for form, Xf in _forms(X).items():
        sel = selector.select(Xf, Gaussian(1.0), 4, random_state=0)
        torch.testing.assert_close(sel.centers, ref.centers, rtol=0, atol=1e-12, msg=form)


def _gram(n=30):
    X, _ = _data(n, 2)
    return np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))


GRAM_FUNCTIONS = {
    "pivoted_cholesky": lambda K: L.pivoted_cholesky(K, 4, rule="greedy")[0],
    "bless": lambda K: L.bless(K, 4, generator=torch.Generator().manual_seed(0)),
    "recursive_rls": lambda K: L.recursive_rls(K, 4, generator=torch.Generator().manual_seed(0)),
    "greedy_selection": lambda K: L.greedy_selection(K, 4)[0],
    "sample_kdpp": lambda K: L.sample_kdpp(K, 4, generator=torch.Generator().manual_seed(0)),
    "ridge_leverage_scores": lambda K: L.ridge_leverage_scores(K, 0.1),
    "frobenius_loss": lambda K: L.frobenius_loss(K, np.full(30, 0.5)),
    "trace_loss": lambda K: L.trace_loss(K, [0.5] * 30),
    "relaxed_nystroem": lambda K: L.relaxed_nystroem(K, pd.Series(np.full(30, 0.5))),
    "best_rank_k_errors": lambda K: torch.tensor(L.best_rank_k_errors(K, [3])[3]["trace"]),
}


@pytest.mark.parametrize("name", list(GRAM_FUNCTIONS))
def test_landmark_functions_take_gram_matrices_of_every_type(name):
    K = _gram()
    fn = GRAM_FUNCTIONS[name]
    ref = fn(torch.as_tensor(K))
    for form, Kf in _forms(K).items():
        torch.testing.assert_close(torch.as_tensor(fn(Kf)).to(ref.dtype), ref, rtol=1e-12,
                                   atol=1e-12, msg=form)


@pytest.mark.parametrize("name", ["pivoted_cholesky", "bless", "recursive_rls",
                                  "ridge_leverage_scores", "frobenius_loss"])
@pytest.mark.parametrize("bad,error,pattern", [
    (np.ones((30, 3)), ValueError, "must be a square"),
    ("abc", TypeError, "must be numeric"),
    ([[1.0, 2.0], [3.0]], TypeError, "must be array-like"),
    (np.full((30, 30), np.nan), ValueError, "contains NaN or infinity"),
])
def test_landmark_functions_refuse_what_is_not_a_gram_matrix(name, bad, error, pattern):
    with pytest.raises(error, match=rf"^(gram|K) {pattern}"):
        GRAM_FUNCTIONS[name](bad)


def test_point_functions_take_lists():
    X, _ = _data(30, 2)
    ref = L.KernelGram(Gaussian(1.0), torch.as_tensor(X)).to_dense()
    torch.testing.assert_close(L.KernelGram(Gaussian(1.0), X.tolist()).to_dense(), ref)
    with pytest.raises(TypeError, match="^X must be numeric"):
        L.KernelGram(Gaussian(1.0), [["a", "b"]])


# ---- Taylor feature sizes ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["compact", "ordered"])
def test_capped_count_is_the_exact_count_below_the_cap(mode):
    for d in (1, 2, 3, 7):
        for M in (0, 1, 2, 5, 9):
            r = n_taylor_features(d, M, mode=mode)
            assert _capped_count(d, M, mode, 10**9) == r
            assert _capped_count(d, M, mode, r) == r
            assert _capped_count(d, M, mode, r - 1) == r  # r - 1 + 1: "above the cap"
    assert n_taylor_features(3, 6, mode="ordered") == sum(3**k for k in range(7))


@pytest.mark.parametrize("d,M", [(3, 10**8), (200, 10**8), (10**6, 10**6), (200, 2)])
def test_absurd_taylor_sizes_are_refused_in_closed_form(d, M):
    budget = 2**30
    with pytest.raises(MemoryBudgetError, match=rf"d = {d} and degree={M}") as info:
        check_taylor_size(d, M, bytes_per_feature=8, bytes_per_feature_squared=56, budget=budget)
    exc = info.value
    assert isinstance(exc, ValueError) and isinstance(exc, MemoryError)
    # the suggested degree fits and the next one does not
    suggested = int(str(exc).split("Use degree=")[1].split(" ")[0])
    need = lambda m: 8 * n_taylor_features(d, m) + 56 * n_taylor_features(d, m) ** 2  # noqa: E731
    assert need(suggested) <= budget < need(suggested + 1)


def test_pkawv_taylor_refuses_a_huge_degree_before_allocating():
    X, y = _data(10, 3)
    for d, X_d in ((3, X), (200, np.random.default_rng(0).normal(size=(10, 200)))):
        est = PKAWVTaylor(degree=10**8)
        with pytest.raises(MemoryBudgetError, match=rf"d = {d} and degree=100000000 has r abov"):
            est.fit(X_d, y)
        assert not hasattr(est, "n_rounds_")
    with pytest.raises(MemoryBudgetError, match="feature_mode='ordered'"):
        PKAWVTaylor(degree=10**8, feature_mode="ordered").fit(X, y)


def test_taylor_feature_functions_refuse_a_huge_degree():
    X, _ = _data(10, 200)
    with pytest.raises(MemoryBudgetError, match="Taylor features with d = 200"):
        taylor_features(X, M=10**8)
    with pytest.raises(MemoryBudgetError, match="Taylor multi-indices"):
        taylor_multi_indices(200, 10**8)
    with pytest.raises(ValueError, match="M must be a non-negative integer"):
        taylor_multi_indices(3, -1)
    # the closed form of the kernel needs no features: a huge degree is the converged series
    X3, _ = _data(10, 3)
    K = np.exp(-0.5 * ((X3[:, None] - X3[None]) ** 2).sum(-1))
    np.testing.assert_allclose(taylor_kernel(X3, X3, M=10**8), K, rtol=1e-12)


@pytest.mark.parametrize("name", ["KernelSignGradientCV", "KernelGradientDescentCV",
                                  "KernelCoordinateDescentCV", "KernelHuberGradientDescentCV"])
def test_path_cv_refuses_an_unevaluable_bandwidth_in_its_grid(name):
    from kernelflow import estimators as E

    X, y = _data()
    cls = getattr(E, name)
    with pytest.raises(ValueError, match=r"^sigmas=1e-20 is out of range for X"):
        cls(sigmas=[1e-20, 1.0], cv=2, max_iter=20).fit(X, y)
    # an identity kernel is only a candidate of the grid (the automatic grid's smallest
    # bandwidths give it on high-dimensional data): accepted
    Xi = np.arange(30, dtype=np.float64)[:, None]
    grid = [1 / math.sqrt(2e4), 3.0]
    est = cls(sigmas=grid, cv=2, max_iter=20).fit(Xi, np.sin(Xi[:, 0]))
    assert est.sigma_ in grid and np.all(np.isfinite(est.predict(Xi)))
