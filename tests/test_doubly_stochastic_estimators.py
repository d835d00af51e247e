"""Doubly stochastic estimators: scikit-learn conventions, streams, memory, bad input."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators.doubly_stochastic_classifier import DoublyStochasticClassifier
from kernelflow.estimators.doubly_stochastic_novelty import DoublyStochasticNoveltyDetector
from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor

_XFAIL = {
    "check_sample_weight_equivalence_on_dense_data": (
        "stochastic mini-batches: a weighted row and a repeated row land in different batches"
    ),
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("estimator", [
    DoublyStochasticRegressor(block_size=32, random_state=0),
    DoublyStochasticClassifier(block_size=32, random_state=0),
    DoublyStochasticClassifier(loss="log_loss", block_size=32, random_state=0),
    DoublyStochasticNoveltyDetector(block_size=32, random_state=0),
], ids=lambda e: repr(e))
def test_check_estimator(estimator):
    check_estimator(estimator, expected_failed_checks=_XFAIL)


def _regression(n=300, d=3, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.randn(n)
    return X, y


def _state_bytes(est):
    total = 0
    for k, v in vars(est).items():
        if not k.endswith("_") or k.startswith("_"):
            continue
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, np.ndarray):
            total += v.nbytes
    return total


def test_fitted_state_grows_with_features_only():
    # same number of iterations, 10x the rows and 10x the input dimension: same state size
    sizes = []
    for n, d in [(256, 2), (2560, 2), (256, 20)]:
        X, y = _regression(n, d)
        est = DoublyStochasticRegressor(batch_size=n // 8, block_size=12, max_iter=2, tol=None,
                                        random_state=0).fit(X, y)
        assert est.t_ == 16 and est.n_features_total_ == 16 * 12
        sizes.append(_state_bytes(est))
        # nothing of shape (n, .) is kept
        assert all(getattr(v, "shape", (0,))[:1] != (n,) for v in vars(est).values())
    assert sizes[0] == sizes[1] == sizes[2]
    assert sizes[0] == 16 * 12 * 8 + 8  # coefficients + intercept
    est.partial_fit(X[:64], y[:64])  # two more batches: two more blocks
    assert _state_bytes(est) - sizes[2] == 2 * 12 * 8


def test_partial_fit_chunks_equal_one_stream():
    X, y = _regression(256)
    params = dict(batch_size=32, block_size=8, sigma=1.0, random_state=1)
    a = DoublyStochasticRegressor(**params)
    for i in range(0, 256, 64):
        a.partial_fit(X[i:i + 64], y[i:i + 64])
    b = DoublyStochasticRegressor(**params).partial_fit(X, y)
    assert a.t_ == b.t_ == 8
    torch.testing.assert_close(a.coef_, b.coef_)
    np.testing.assert_allclose(a.predict(X), b.predict(X))


def test_pickle_keeps_only_coefficients_and_predicts_the_same():
    X, y = _regression(200)
    est = DoublyStochasticRegressor(block_size=16, max_iter=2, random_state=0).fit(X, y)
    p = est.predict(X)
    blob = pickle.dumps(est)
    assert len(blob) < _state_bytes(est) + 20_000  # no data, no feature parameters
    np.testing.assert_allclose(pickle.loads(blob).predict(X), p, rtol=1e-12)


def test_warm_start_continues_the_stream():
    X, y = _regression(256)
    est = DoublyStochasticRegressor(batch_size=64, block_size=8, max_iter=2, tol=None,
                                    warm_start=True, random_state=0).fit(X, y)
    seed, coef = est.seed_, est.coef_.clone()
    est.fit(X, y)
    assert est.seed_ == seed and est.t_ == 16 and est.n_blocks_ == 16
    cold = DoublyStochasticRegressor(batch_size=64, block_size=8, max_iter=2, tol=None,
                                     random_state=0).fit(X, y)
    torch.testing.assert_close(cold.coef_, coef)


def test_regressor_accuracy_and_io_kinds():
    X, y = _regression(600)
    est = DoublyStochasticRegressor(sigma=1.0, block_size=64, random_state=0).fit(X, y)
    assert est.score(X, y) > 0.95
    Xt = torch.as_tensor(X)
    out = est.predict(Xt)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), est.predict(X))
    Y2 = np.c_[y, -y]
    m2 = DoublyStochasticRegressor(sigma=1.0, random_state=0).fit(X, Y2)
    assert m2.predict(X).shape == (600, 2)


@pytest.mark.parametrize("loss", ["huber", "epsilon_insensitive", "absolute_error"])
def test_robust_losses_fit(loss):
    X, y = _regression(400)
    y = y.copy()
    y[::20] += 20.0  # gross outliers
    est = DoublyStochasticRegressor(loss=loss, sigma=1.0, eta0=0.5, random_state=0).fit(X, y)
    clean = np.ones(400, bool)
    clean[::20] = False
    assert est.score(X[clean], y[clean]) > 0.8


def test_quantile_regression_covers_the_level():
    rng = np.random.RandomState(0)
    X = rng.uniform(-2, 2, size=(6000, 1))
    y = np.sin(X[:, 0]) + rng.randn(6000)
    est = DoublyStochasticRegressor(loss="quantile", quantile=0.8, sigma=1.0, block_size=32,
                                    average=True, random_state=0).fit(X[:1000], y[:1000])
    assert abs(np.mean(y[1000:] <= est.predict(X[1000:])) - 0.8) < 0.03


def test_multiclass_softmax_on_digits():
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    clf = DoublyStochasticClassifier(loss="log_loss", batch_size=128, block_size=256,
                                     max_iter=4, random_state=0)
    clf.fit(X[:1200], y[:1200])
    assert clf.score(X[1200:], y[1200:]) > 0.9
    P = clf.predict_proba(X[1200:1210])
    np.testing.assert_allclose(P.sum(1), 1.0)
    assert clf.coef_.shape[1] == 10


def test_early_stopping_stops():
    X, y = _regression(400)
    est = DoublyStochasticRegressor(early_stopping=True, n_iter_no_change=2, tol=10.0,
                                    max_iter=50, random_state=0).fit(X, y)
    assert est.n_iter_ == 3


def test_wrong_feature_count_in_a_chunk_is_an_error():
    X, y = _regression(64)
    est = DoublyStochasticRegressor(random_state=0).partial_fit(X, y)
    with pytest.raises(ValueError, match="3 features"):
        est.partial_fit(X[:, :2], y)
    with pytest.raises(ValueError, match="features"):
        est.predict(torch.as_tensor(X[:, :2]))


def test_unseen_label_in_a_chunk_is_an_error():
    X, y = _regression(60)
    labels = np.array(["a", "b"])[(y > 0).astype(int)]
    clf = DoublyStochasticClassifier(random_state=0).partial_fit(X, labels)
    with pytest.raises(ValueError, match="not seen at the first call"):
        clf.partial_fit(X[:3], np.array(["a", "c", "b"]))
    clf2 = DoublyStochasticClassifier(random_state=0)
    clf2.partial_fit(X, labels, classes=["a", "b", "c"])
    clf2.partial_fit(X[:3], np.array(["a", "c", "b"]))  # declared up front: fine
    assert list(clf2.classes_) == ["a", "b", "c"]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input(bad):
    X, y = _regression(50)
    X[3, 1] = bad
    with pytest.raises(ValueError, match="NaN|inf"):
        DoublyStochasticRegressor().fit(X, y)
    with pytest.raises(ValueError, match="NaN|inf"):
        DoublyStochasticRegressor().fit(torch.as_tensor(X), torch.as_tensor(y))


@pytest.mark.parametrize("params,match", [
    ({"block_size": 3}, "even"),
    ({"eta0": -1.0}, "eta0"),
    ({"learning_rate": "fast"}, "learning_rate"),
    ({"kernel": "laplacian"}, "kernel"),
    ({"batch_size": 0}, "batch_size"),
    ({"dtype": "float16"}, "dtype"),
])
def test_invalid_parameters(params, match):
    X, y = _regression(50)
    with pytest.raises(ValueError, match=match):
        DoublyStochasticRegressor(**params).fit(X, y)


def test_bad_shapes_and_empty():
    X, y = _regression(50)
    with pytest.raises(ValueError):
        DoublyStochasticRegressor().fit(X[:0], y[:0])
    with pytest.raises(ValueError, match="inconsistent"):
        DoublyStochasticRegressor().fit(X, y[:10])
    with pytest.raises(ValueError):
        DoublyStochasticRegressor().fit(X[:, 0], y)
    with pytest.raises(ValueError, match="at least 2 classes"):
        DoublyStochasticClassifier().fit(X, np.zeros(50))


def test_novelty_detector_flags_far_points():
    rng = np.random.RandomState(0)
    X = rng.randn(600, 2)
    det = DoublyStochasticNoveltyDetector(nu=0.1, sigma=1.0, random_state=0).fit(X)
    assert abs(np.mean(det.predict(X) == -1) - 0.1) < 0.06
    assert (det.predict(rng.randn(50, 2) * 0.3 + 8.0) == -1).all()
    np.testing.assert_allclose(det.decision_function(X), det.score_samples(X) - det.offset_)


def test_validation_rows_follow_the_one_holdout_rule():
    from kernelflow.utils.holdout import holdout_indices

    rng = np.random.RandomState(0)
    X = rng.uniform(-2, 2, (90, 2))
    y = np.sin(X[:, 0])
    est = DoublyStochasticRegressor(early_stopping=True, validation_fraction=0.1, max_iter=3,
                                    block_size=16, random_state=4).fit(X, y)
    _, val = holdout_indices(torch.as_tensor(X), 0.1, random_state=4)
    np.testing.assert_array_equal(est.validation_indices_, val)
    assert len(val) == 9  # ceil(0.1 * 90)
    # the split is by content: permuting the rows permutes the held-out positions
    perm = rng.permutation(90)
    est2 = DoublyStochasticRegressor(early_stopping=True, validation_fraction=0.1, max_iter=1,
                                     block_size=16, random_state=4).fit(X[perm], y[perm])
    np.testing.assert_array_equal(np.sort(perm[est2.validation_indices_]), val)
    assert DoublyStochasticRegressor(max_iter=1, block_size=16).fit(X, y).validation_indices_ \
        is None
