"""Centred Taylor features: translation invariance of the Gaussian kernel, PKAWVTaylor(center)."""

import numpy as np
import pytest

from kernelflow.features.taylor import taylor_features, taylor_kernel
from kernelflow.online import PKAWVTaylor


def _gauss(A, B, sigma):
    return np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / (2 * sigma**2))


def test_centred_kernel_is_the_kernel_of_shifted_inputs():
    rng = np.random.RandomState(0)
    X1, X2, c = rng.randn(5, 3), rng.randn(4, 3), rng.randn(3)
    np.testing.assert_allclose(taylor_kernel(X1, X2, M=4, center=c),
                               taylor_kernel(X1 - c, X2 - c, M=4), rtol=1e-14)
    np.testing.assert_allclose(taylor_features(X1, M=3, center=c),
                               taylor_features(X1 - c, M=3), rtol=1e-14)
    # at a high degree both expansions are the (translation-invariant) Gaussian kernel
    K = _gauss(X1, X2, 1.5)
    np.testing.assert_allclose(taylor_kernel(X1, X2, sigma=1.5, M=40, center=c), K, atol=1e-12)
    np.testing.assert_allclose(taylor_kernel(X1, X2, sigma=1.5, M=40), K, atol=1e-12)


def test_centring_reproduces_the_kernel_better_off_centre():
    rng = np.random.RandomState(1)
    X = rng.uniform(1.0, 2.0, size=(50, 3))  # far from the origin
    K = _gauss(X, X, 1.0)
    for M in (2, 3, 4):
        raw = taylor_features(X, M=M)
        cen = taylor_features(X, M=M, center=X.mean(0))
        err_raw = np.abs(raw @ raw.T - K).max()
        err_cen = np.abs(cen @ cen.T - K).max()
        assert err_cen < 0.1 * err_raw, (M, err_cen, err_raw)


def test_center_validation():
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="length 2"):
        taylor_features(X, center=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        taylor_kernel(X, X, center=[np.nan, 0.0])
    y = np.zeros(3)
    with pytest.raises(ValueError, match="length 2"):
        PKAWVTaylor(center=[1.0]).fit(X, y)
    with pytest.raises(ValueError):
        PKAWVTaylor(center="middle").fit(X, y)


def test_pkawv_center_equals_shifted_stream():
    rng = np.random.RandomState(2)
    X = rng.uniform(0.5, 1.5, size=(300, 3))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.randn(300)
    c = X[:100].mean(0)
    ref = PKAWVTaylor(sigma=1.0, degree=3).progressive_predict(X - c, y)
    explicit = PKAWVTaylor(sigma=1.0, degree=3, center=c)
    np.testing.assert_allclose(explicit.progressive_predict(X, y), ref, rtol=1e-10, atol=1e-12)
    first = PKAWVTaylor(sigma=1.0, degree=3, center="first_batch")
    p1 = first.progressive_predict(X[:100], y[:100])
    p2 = first.progressive_predict(X[100:], y[100:])  # the centre stays the first batch's mean
    np.testing.assert_allclose(first.center_, c)
    np.testing.assert_allclose(np.concatenate([p1, p2]), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(first.predict(X[:7]), explicit.predict(X[:7]), rtol=1e-10)
    # learn_one: the first row is the first batch
    one = PKAWVTaylor(sigma=1.0, degree=2, center="auto")
    one.learn_one({"a": 1.0, "b": 2.0, "c": 3.0}, 0.5)
    np.testing.assert_allclose(one.center_, [1.0, 2.0, 3.0])
    assert PKAWVTaylor(degree=2).fit(X, y).center_ is None


def test_centring_lowers_the_loss_off_centre():
    rng = np.random.RandomState(3)
    X = rng.uniform(0.0, 2.0, size=(600, 4))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.randn(600)
    kw = dict(alpha=1.0, sigma=1.0, degree=2, awv=False)
    raw = PKAWVTaylor(**kw).progressive_predict(X, y)
    cen = PKAWVTaylor(center="first_batch", **kw).progressive_predict(X, y)
    assert ((cen - y) ** 2).sum() < ((raw - y) ** 2).sum()
