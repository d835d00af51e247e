"""Calibration on real data: 95 % intervals of learned ridge models beside scikit-learn's GP.

``predict(return_std=True)`` of a model with learned hyperparameters is the std of a new
observation (learned signal and noise variance); mean +- 1.96 std must cover about 95 % of
held-out targets, as scikit-learn's ``GaussianProcessRegressor`` with a learned ``WhiteKernel``
does on the same split. Subsampled to 200 training rows to stay fast.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_friedman1
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from kernelflow.datasets import load_concrete, load_diabetes
from kernelflow.estimators import KernelRidge, NystromKernelRidge

Z95 = 1.959963984540054


def _data(name):
    if name == "diabetes":
        return load_diabetes(return_X_y=True)
    if name == "concrete":
        return load_concrete(return_X_y=True)
    return make_friedman1(n_samples=1000, n_features=10, noise=1.0, random_state=0)


def _split(X, y, n_train=200, seed=0):
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.random.RandomState(seed).permutation(X.shape[0])
    tr, te = idx[:n_train], idx[n_train:n_train + 800]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def _coverage_nlpd(model, X, y):
    mean, std = model.predict(X, return_std=True)
    nlpd = np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * (y - mean) ** 2 / std**2)
    return float(np.mean(np.abs(y - mean) <= Z95 * std)), float(nlpd)


@pytest.mark.parametrize("name", ["diabetes", "concrete", "friedman1"])
def test_95_percent_intervals_cover_like_scikit_learns_gp(name):
    X, y, Xt, yt = _split(*_data(name))
    exact = KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood").fit(X, y)
    nystrom = NystromKernelRidge(n_components=100, sigma="ard", random_state=0,
                                 compute_variance=True,
                                 learn_hyperparameters="nystrom_marginal_likelihood").fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimiser's bound warnings
        gp = GaussianProcessRegressor(ConstantKernel() * RBF(np.ones(X.shape[1]))
                                      + WhiteKernel(), normalize_y=True).fit(X, y)
    cov_gp, nlpd_gp = _coverage_nlpd(gp, Xt, yt)
    for model in (exact, nystrom):
        cov, nlpd = _coverage_nlpd(model, Xt, yt)
        assert 0.90 <= cov <= 0.98, (type(model).__name__, cov, cov_gp)
        assert abs(cov - cov_gp) <= 0.04, (type(model).__name__, cov, cov_gp)
        # scikit-learn's NLPD within 5 % of the targets' log scale
        assert nlpd <= nlpd_gp + 0.05 * abs(nlpd_gp), (type(model).__name__, nlpd, nlpd_gp)
    # the evidence reported is the maximised one, not that of a unit signal variance
    assert exact.log_marginal_likelihood() == pytest.approx(
        -X.shape[0] * exact.hyperparameters_.value, rel=1e-9)
