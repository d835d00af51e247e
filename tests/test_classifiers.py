"""Kernel classifiers: ridge, Nyström logistic, doubly stochastic; calibrated probabilities."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_breast_cancer, load_digits, make_blobs, make_moons
from sklearn.exceptions import NotFittedError
from sklearn.kernel_approximation import Nystroem
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from kernelflow.estimators import (
    DoublyStochasticClassifier,
    KernelRidge,
    KernelRidgeClassifier,
    NystromKernelLogisticRegression,
    NystromKernelRidgeClassifier,
)
from kernelflow.registry import get_estimator_class
from kernelflow.solvers.logistic import smoothed_targets, temperature_scaling


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


def test_no_probabilities_without_calibration():
    assert hasattr(KernelRidgeClassifier(), "predict_proba")
    assert not hasattr(KernelRidgeClassifier(calibration_cv=None), "predict_proba")
    assert not hasattr(NystromKernelRidgeClassifier(calibration_cv=None), "predict_log_proba")
    X, y = make_moons(40, noise=0.2, random_state=0)
    clf = KernelRidgeClassifier(calibration_cv=None, sigma=0.5).fit(X, y)
    assert not hasattr(clf, "inverse_temperature_")


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


def test_logistic_without_intercept_reaches_the_minimiser():
    X, y = make_blobs(60, centers=3, cluster_std=2.5, random_state=4)
    alpha, sig = 0.5, 1.5
    clf = NystromKernelLogisticRegression(12, alpha=alpha, sigma=sig, tol=1e-11,
                                          fit_intercept=False, random_state=0).fit(X, y)
    assert clf.converged_
    np.testing.assert_array_equal(clf.intercept_.numpy(), 0.0)
    C = clf.centers_.numpy()
    K = np.exp(-((X[:, None] - C[None]) ** 2).sum(-1) / (2 * sig**2))
    Kmm = np.exp(-((C[:, None] - C[None]) ** 2).sum(-1) / (2 * sig**2))

    def objective(a):
        J, g = _objective(np.concatenate([a, np.zeros(3)]), K, Kmm, y, 3, alpha)
        return J, g[:-3]

    ref = minimize(objective, np.zeros(12 * 3), jac=True, method="L-BFGS-B",
                   options=dict(maxiter=20000, gtol=1e-10, ftol=1e-15))
    J, g = objective(clf.dual_coef_.numpy().ravel())
    assert J <= ref.fun + 1e-9 * abs(ref.fun)
    # the loss does not see a common shift of the c functions; the penalty keeps none
    assert np.linalg.norm(g) < 1e-6 * len(y)


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


# ---- probabilities -------------------------------------------------------------------------------
#: every classifier, fast settings
PROBA_MODELS = {
    "ridge": lambda: KernelRidgeClassifier(alpha=0.3, sigma=1.5, random_state=0),
    "nystrom_ridge": lambda: NystromKernelRidgeClassifier(40, alpha=0.3, sigma=1.5,
                                                          random_state=0),
    "logistic": lambda: NystromKernelLogisticRegression(40, alpha=0.3, sigma=1.5, random_state=0),
    "ds_hinge": lambda: DoublyStochasticClassifier("hinge", sigma=1.5, block_size=16,
                                                   max_iter=3, random_state=0),
    "ds_squared_hinge": lambda: DoublyStochasticClassifier(
        "squared_hinge", sigma=1.5, block_size=16, max_iter=3, early_stopping=True,
        random_state=0),
    "ds_log_loss": lambda: DoublyStochasticClassifier("log_loss", sigma=1.5, block_size=16,
                                                      max_iter=3, random_state=0),
}


@pytest.mark.parametrize("centers", [2, 3])
@pytest.mark.parametrize("name", sorted(PROBA_MODELS))
def test_predict_proba_is_a_distribution_that_agrees_with_predict(name, centers):
    X, y = make_blobs(120, centers=centers, cluster_std=2.5, random_state=2)
    labels = np.array(["ant", "bee", "cat"])[y]
    clf = PROBA_MODELS[name]().fit(X, labels)
    P = clf.predict_proba(X)
    assert P.shape == (120, centers) and P.dtype == np.float64
    assert np.all(P >= 0) and np.all(P <= 1)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(clf.classes_[P.argmax(1)], clf.predict(X))
    np.testing.assert_allclose(clf.predict_log_proba(X), np.log(P), atol=1e-10)
    assert P.max(1).min() < 0.999  # calibrated, not 0/1 on overlapping blobs
    Pt = clf.predict_proba(torch.as_tensor(X))
    assert isinstance(Pt, torch.Tensor)
    np.testing.assert_allclose(Pt.numpy(), P, atol=1e-12)


@pytest.fixture(scope="module")
def breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    sc = StandardScaler().fit(Xtr)
    Xtr, Xte = sc.transform(Xtr), sc.transform(Xte)
    gamma = 1.0 / X.shape[1]
    svc = CalibratedClassifierCV(SVC(gamma=gamma), cv=5, ensemble=False).fit(Xtr, ytr)
    prior = np.bincount(ytr) / len(ytr)
    return (Xtr, Xte, ytr, yte, gamma, log_loss(yte, svc.predict_proba(Xte)),
            log_loss(yte, np.tile(prior, (len(yte), 1))))


@pytest.mark.parametrize("make", [
    lambda g: KernelRidgeClassifier(alpha=1.0, gamma=g, random_state=0),
    lambda g: NystromKernelRidgeClassifier(200, alpha=1.0, gamma=g, random_state=0),
    lambda g: NystromKernelLogisticRegression(200, alpha=0.2, gamma=g, random_state=0),
], ids=["ridge", "nystrom_ridge", "logistic"])
def test_calibrated_on_breast_cancer(breast_cancer, make):
    """Test log-loss far below the prior's (0.66) and within 0.03 of scikit-learn's calibrated
    SVC (0.11, Platt scaling on 5-fold scores)."""
    Xtr, Xte, ytr, yte, gamma, svc, prior = breast_cancer
    ll = log_loss(yte, make(gamma).fit(Xtr, ytr).predict_proba(Xte))
    assert ll < 0.3 * prior, (ll, prior)
    assert ll < svc + 0.03, (ll, svc)


def test_logistic_equals_sklearn_nystroem_logistic_regression():
    """Same centres, kernel and penalty (alpha = 2 / C for two classes, whose two functions
    share the norm): the same minimiser as Nystroem + LogisticRegression."""
    X, y = make_moons(300, noise=0.3, random_state=0)
    ny = Nystroem(gamma=2.0, n_components=40, random_state=0).fit(X)
    lr = LogisticRegression(C=2.0, tol=1e-10, max_iter=10000).fit(ny.transform(X), y)
    ours = NystromKernelLogisticRegression(40, landmarks=ny.components_, gamma=2.0, alpha=1.0,
                                           tol=1e-10).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), lr.predict_proba(ny.transform(X)),
                               atol=1e-6)


def test_temperature_scaling_recovers_the_temperature():
    g = torch.Generator().manual_seed(1)
    L = torch.randn(20000, 4, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(2.5 * L, 1), 1, generator=g)[:, 0]
    assert abs(temperature_scaling(L, labels) - 2.5) < 0.1
    # separable scores: a finite beta (Platt's targets), not the upper bound
    f = torch.linspace(-1, 1, 200, dtype=torch.float64)
    beta = temperature_scaling(torch.stack([-f, f], 1), (f > 0).long())
    assert 1.0 < beta < 100.0


def test_smoothed_targets_are_platts():
    labels = torch.tensor([0, 0, 0, 1])
    Q = smoothed_targets(labels, 2)
    np.testing.assert_allclose(Q[0].numpy(), [4 / 5, 1 / 5])  # (N- + 1) / (N- + 2)
    np.testing.assert_allclose(Q[3].numpy(), [1 / 3, 2 / 3])  # (N+ + 1) / (N+ + 2)
    np.testing.assert_allclose(Q.sum(1).numpy(), 1.0)


def test_calibration_is_deterministic_and_weights_repeat_rows():
    X, y = make_moons(80, noise=0.3, random_state=0)
    a = KernelRidgeClassifier(sigma=0.5, random_state=3).fit(X, y)
    b = KernelRidgeClassifier(sigma=0.5, random_state=3).fit(X, y)
    assert a.inverse_temperature_ == b.inverse_temperature_
    w = np.random.RandomState(0).randint(0, 3, size=len(y))
    c = KernelRidgeClassifier(sigma=0.5, random_state=3).fit(X, y, sample_weight=w)
    d = KernelRidgeClassifier(sigma=0.5, random_state=3).fit(np.repeat(X, w, 0), np.repeat(y, w))
    np.testing.assert_allclose(c.predict_proba(X), d.predict_proba(X), rtol=1e-8)


def test_partial_fit_calibrates_on_scores_before_learning():
    X, y = make_moons(400, noise=0.3, random_state=0)
    clf = DoublyStochasticClassifier("hinge", sigma=0.5, block_size=16, random_state=0)
    clf.partial_fit(X[:100], y[:100], classes=[0, 1])
    first = clf.inverse_temperature_
    clf.partial_fit(X[100:200], y[100:200])
    F, idx, _ = clf._calibration_rows
    assert len(idx) == 100  # the second chunk, scored before the model learnt it
    assert clf.inverse_temperature_ != first
    P = clf.predict_proba(X[200:])
    assert log_loss(y[200:], P) < 0.85 * np.log(2)  # the prior: log 2


@pytest.mark.parametrize("name", sorted(PROBA_MODELS))
def test_predict_proba_refuses_hostile_input(name):
    X, y = make_moons(60, noise=0.2, random_state=0)
    clf = PROBA_MODELS[name]()
    with pytest.raises(NotFittedError):
        clf.predict_proba(X)
    clf.fit(X, y)
    bad = X[:5].copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.predict_proba(bad)
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        clf.predict_log_proba(bad)
    with pytest.raises(ValueError, match="features"):
        clf.predict_proba(X[:, :1])


def test_calibration_parameters_and_scores_are_checked():
    X, y = make_moons(40, noise=0.2, random_state=0)
    with pytest.raises(ValueError, match="calibration_cv"):
        KernelRidgeClassifier(calibration_cv=1).fit(X, y)
    L = torch.zeros(3, 2, dtype=torch.float64)
    L[1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        temperature_scaling(L, torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="logits of shape"):
        temperature_scaling(torch.zeros(3, 1, dtype=torch.float64), torch.tensor([0, 1, 0]))
