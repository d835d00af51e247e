"""The Nyström transformer: scikit-learn conventions, exactness, any selector."""

import numpy as np
import pytest
import torch
from sklearn.kernel_approximation import Nystroem as SkNystroem
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators.nystroem import Nystroem
from kernelflow.kernels import Gaussian
from kernelflow.landmarks import SELECTORS, RPCholesky

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.parametrize("landmarks", ["uniform", "rpcholesky"])
def test_check_estimator(landmarks):
    check_estimator(Nystroem(n_components=10, landmarks=landmarks, random_state=0))


def test_all_landmarks_give_exact_map_and_match_sklearn():
    X = np.random.RandomState(0).randn(60, 3)
    K = Gaussian(2.0)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    Z = Nystroem(sigma=2.0, n_components=60).fit_transform(X)
    assert np.allclose(Z @ Z.T, K, atol=1e-8)
    # sklearn's gamma convention: exp(-gamma |x - x'|^2), same uniform-landmark features
    sk = SkNystroem(gamma=0.125, n_components=60, random_state=0).fit_transform(X)
    assert np.allclose(sk @ sk.T, Z @ Z.T, atol=1e-8)


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_any_selector_name(name):
    X = np.random.RandomState(1).randn(80, 2)
    model = Nystroem(sigma=1.0, n_components=8, landmarks=name, random_state=0).fit(X)
    Z = model.transform(X)
    assert Z.shape[0] == 80 and 1 <= Z.shape[1] <= 8
    assert np.isfinite(Z).all()
    # features reproduce the Nyström kernel on the landmarks
    C = model.components_.numpy()
    KnC = Gaussian(1.0)(torch.as_tensor(X), torch.as_tensor(C)).numpy()
    KCC = Gaussian(1.0)(torch.as_tensor(C), torch.as_tensor(C)).numpy()
    assert np.allclose(Z @ Z.T, KnC @ np.linalg.pinv(KCC, rcond=1e-12) @ KnC.T, atol=1e-6)


def test_selector_object_explicit_centres_and_torch_io():
    X = torch.randn(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    m = Nystroem(sigma=1.0, n_components=5, landmarks=RPCholesky(), random_state=0).fit(X)
    out = m.transform(X)
    assert isinstance(out, torch.Tensor) and out.shape == (50, 5)
    assert m.component_indices_.shape == (5,)
    C = X[:4].numpy()
    m2 = Nystroem(sigma=1.0, landmarks=C).fit(X)
    assert m2.component_indices_ is None and torch.allclose(m2.components_, X[:4])
    assert m2.get_feature_names_out().tolist() == [f"nystroem{i}" for i in range(4)]


def test_too_many_components_warns_and_bad_input_raises():
    X = np.random.RandomState(0).randn(10, 2)
    with pytest.warns(UserWarning, match="n_components"):
        m = Nystroem(n_components=20).fit(X)
    assert m.components_.shape[0] == 10
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        Nystroem().fit(X)
    with pytest.raises(ValueError, match="Unknown landmark selector"):
        Nystroem(n_components=3, landmarks="nope").fit(np.ones((5, 2)))
