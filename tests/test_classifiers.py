"""Kernel ridge classifiers and Nyström kernel logistic regression."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.datasets import load_digits, make_blobs, make_moons
from sklearn.model_selection import train_test_split
from sklearn.svm import SVC

from kernelflow.estimators import (
    KernelRidge,
    KernelRidgeClassifier,
    NystromKernelLogisticRegression,
    NystromKernelRidgeClassifier,
)
from kernelflow.registry import get_estimator_class


def test_registered():
    assert get_estimator_class("kernel_ridge_classifier") is KernelRidgeClassifier
    assert get_estimator_class("nystrom_ridge_classifier") is NystromKernelRidgeClassifier
    assert get_estimator_class("nystrom_logistic") is NystromKernelLogisticRegression


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    gamma = 1.0 / (X.shape[1] * Xtr.var())  # SVC's gamma="scale" on the training set
    svc = SVC(kernel="rbf", gamma="scale").fit(Xtr, ytr).score(Xte, yte)
    return Xtr, Xte, ytr, yte, gamma, svc


@pytest.mark.parametrize("make", [
    lambda g: KernelRidgeClassifier(alpha=1.0, gamma=g),
    lambda g: NystromKernelRidgeClassifier(600, alpha=1.0, gamma=g, random_state=0),
    lambda g: NystromKernelLogisticRegression(600, alpha=0.1, gamma=g, random_state=0),
])
def test_digits_within_one_point_of_svc(digits, make):
    Xtr, Xte, ytr, yte, gamma, svc = digits
    acc = make(gamma).fit(Xtr, ytr).score(Xte, yte)
    assert acc >= svc - 0.01, (acc, svc)


def test_ridge_classifier_is_ridge_on_indicators():
    X, y = make_blobs(90, centers=3, random_state=0)
    clf = KernelRidgeClassifier(alpha=0.3, sigma=2.0).fit(X, y)
    Y = np.where(y[:, None] == np.arange(3)[None], 1.0, -1.0)
    ref = KernelRidge(alpha=0.3, sigma=2.0).fit(X, Y).predict(X)
    np.testing.assert_allclose(clf.decision_function(X), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(X), ref.argmax(1))


@pytest.mark.parametrize("centers", [2, 3])
def test_exact_and_nystrom_all_centres_agree(centers):
    X, y = make_blobs(80, centers=centers, cluster_std=3.0, random_state=1)
    labels = np.array(["ant", "bee", "cat"])[y]
    kw = dict(alpha=0.5, sigma=1.5)
    ex = KernelRidgeClassifier(**kw).fit(X, labels)
    ny = NystromKernelRidgeClassifier(len(X), landmarks=X, tol=1e-13, max_iter=500,
                                      **kw).fit(X, labels)
    np.testing.assert_allclose(ny.decision_function(X), ex.decision_function(X), rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_array_equal(ny.predict(X), ex.predict(X))
    assert ex.decision_function(X).shape == ((80,) if centers == 2 else (80, 3))
    assert set(ex.predict(X)) <= set(labels)
    assert list(ex.classes_) == sorted(set(labels))


def test_no_uncalibrated_probabilities():
    assert not hasattr(KernelRidgeClassifier(), "predict_proba")
    assert not hasattr(NystromKernelRidgeClassifier(), "predict_proba")


def test_sample_weight_equals_repetition():
    X, y = make_moons(60, noise=0.2, random_state=0)
    w = np.random.RandomState(0).randint(1, 3, size=len(y))
    a = KernelRidgeClassifier(alpha=0.2, sigma=0.7).fit(X, y, sample_weight=w)
    b = KernelRidgeClassifier(alpha=0.2, sigma=0.7).fit(np.repeat(X, w, 0), np.repeat(y, w))
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), rtol=1e-8)
    la = NystromKernelLogisticRegression(30, landmarks=X[:30], alpha=0.2, sigma=0.7,
                                         tol=1e-10).fit(X, y, sample_weight=w)
    lb = NystromKernelLogisticRegression(30, landmarks=X[:30], alpha=0.2, sigma=0.7,
                                         tol=1e-10).fit(np.repeat(X, w, 0), np.repeat(y, w))
    np.testing.assert_allclose(la.predict_proba(X), lb.predict_proba(X), atol=1e-7)


def _objective(theta, K, Kmm, y, c, alpha):
    M = K.shape[1]
    A, b = theta[:M * c].reshape(M, c), theta[M * c:]
    F = K @ A + b
    P = np.exp(F - logsumexp(F, axis=1, keepdims=True))
    Y = np.eye(c)[y]
    J = (logsumexp(F, axis=1) - F[np.arange(len(y)), y]).sum() + 0.5 * alpha * (A * (Kmm @ A)).sum()
    gA = K.T @ (P - Y) + alpha * Kmm @ A
    return J, np.concatenate([gA.ravel(), (P - Y).sum(0)])


@pytest.mark.parametrize("centers", [2, 3])
def test_logistic_newton_reaches_the_minimiser(centers):
    X, y = make_blobs(70, centers=centers, cluster_std=2.5, random_state=3)
    alpha, sig = 0.3, 1.5
    clf = NystromKernelLogisticRegression(15, alpha=alpha, sigma=sig, tol=1e-12,
                                          random_state=0).fit(X, y)
    assert clf.converged_ and clf.n_iter_ <= 30
    C = clf.centers_.numpy()

    def k(A, B):
        return np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / (2 * sig**2))

    K, Kmm = k(X, C), k(C, C)
    theta = np.concatenate([clf.dual_coef_.numpy().ravel(), clf.intercept_.numpy()])
    J, g = _objective(theta, K, Kmm, y, centers, alpha)
    assert np.linalg.norm(g) < 1e-7 * max(1.0, len(y))
    np.testing.assert_allclose(J, clf.objective_, rtol=1e-12)
    ref = minimize(_objective, np.zeros_like(theta), args=(K, Kmm, y, centers, alpha),
                   jac=True, method="L-BFGS-B", options=dict(maxiter=20000, gtol=1e-10,
                                                               ftol=1e-15))
    assert J <= ref.fun + 1e-9 * abs(ref.fun)
    F_ref = K @ ref.x[:-centers].reshape(-1, centers) + ref.x[-centers:]
    P_ref = np.exp(F_ref - logsumexp(F_ref, axis=1, keepdims=True))
    np.testing.assert_allclose(clf.predict_proba(X), P_ref, atol=1e-4)


def test_logistic_binary_and_string_labels():
    X, y = make_moons(120, noise=0.15, random_state=0)
    labels = np.where(y == 1, "yes", "no")
    clf = NystromKernelLogisticRegression(40, alpha=0.1, sigma=0.5, random_state=0)
    clf.fit(X, labels)
    P = clf.predict_proba(X)
    assert P.shape == (120, 2) and np.allclose(P.sum(1), 1.0)
    d = clf.decision_function(X)
    assert d.shape == (120,)
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[(d > 0).astype(int)])
    np.testing.assert_allclose(np.log(P), clf.predict_log_proba(X), atol=1e-10)
    assert clf.score(X, labels) > 0.95
    out = clf.predict_proba(torch.as_tensor(X))
    assert isinstance(out, torch.Tensor)
