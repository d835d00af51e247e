"""Model files: value kinds, nested estimators, continued streams, refusal of tampered files.

The bit-identical round trip of every registered estimator is in ``test_common.py``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile

import numpy as np
import pytest
import torch
from _helpers import declared_estimators, import_path, public_estimators, regression_data
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from kernelflow.io import (
    FORMAT_VERSION,
    META_KEY,
    ModelFileError,
    default_state,
    load_model,
    read_metadata,
    save_model,
)
from kernelflow.kernels import Gaussian, Matern
from kernelflow.registry import available_estimators, name_of

# Small settings so that every estimator fits in well under a second.
FAST_PARAMS: dict[str, dict] = {
    "sign_gradient": {"max_iter": 50},
    "gradient_descent": {"max_iter": 50},
    "coordinate_descent": {"max_iter": 50},
    "gradient_descent_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "sign_gradient_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "coordinate_descent_cv": {"cv": 2, "sigmas": [1.0], "max_iter": 50, "n_iter_no_change": 5},
    "penalized": {"max_iter": 100},
    "penalized_cv": {"cv": 2, "sigmas": [1.0], "alphas": [0.1, 1.0], "max_iter": 50},
    "huber": {"max_iter": 20},
    "tukey": {"max_iter": 20},
    "quantile": {"max_iter": 20},
    "doubly_stochastic": {"max_iter": 2},
    "doubly_stochastic_classifier": {"max_iter": 2},
    "doubly_stochastic_novelty": {"max_iter": 2},
    "sklearn_huber": {"max_iter": 200},
}


def _kind(est) -> str:
    try:
        tags = est.__sklearn_tags__()
        kind = tags.estimator_type
    except Exception:  # noqa: BLE001
        kind = getattr(est, "_estimator_type", None)
    if kind is None and hasattr(est, "transform"):
        return "transformer"
    return kind or "regressor"


def _instance(name, cls):
    est = cls()
    valid = est.get_params(deep=False)
    params = {k: v for k, v in FAST_PARAMS.get(name, {}).items() if k in valid}
    if "random_state" in valid:
        params["random_state"] = 0
    return est.set_params(**params)


def _fit_and_outputs(est, X, y, X_new):
    kind = _kind(est)
    if kind == "classifier":
        est.fit(X, (y > np.median(y)).astype(int))
    elif kind == "outlier_detector":
        est.fit(X)
    else:
        est.fit(X, y)
    return _outputs(est, X_new)


def _outputs(est, X_new):
    out = []
    for method in ("predict", "transform", "decision_function", "predict_proba"):
        if hasattr(est, method):
            try:
                out.append(np.asarray(getattr(est, method)(X_new)))
            except (AttributeError, NotImplementedError):
                continue
    assert out, f"{type(est).__name__} has no prediction method"
    return out


def _data(seed=0, n=40, d=3):
    rng = np.random.RandomState(seed)
    X, y = regression_data(n, d, lambda X: np.sin(3 * X[:, 0]) + X[:, 1] ** 2, seed=rng)
    return X, y, rng.uniform(-1, 1, size=(7, d))


_REGISTERED = sorted(available_estimators())


def test_every_public_estimator_class_is_registered():
    # model files record the name the registry's source gives each exported estimator (a name
    # derived by discovery would change with the class name)
    found, errors = public_estimators()
    assert not errors, f"public modules that do not import: {errors}"
    declared: dict[type, str] = {}
    for name, path in declared_estimators().items():
        declared.setdefault(import_path(path), name)  # name_of gives the first entry too
    assert len(found) >= 30
    for cls in found:
        assert cls in declared, f"{cls.__module__}.{cls.__qualname__} is not registered"
        assert name_of(cls) == declared[cls]


def test_torch_inputs_give_identical_torch_outputs(tmp_path):
    from kernelflow.estimators import KernelRidge

    X, y, X_new = _data()
    est = KernelRidge(alpha=0.1).fit(torch.tensor(X), torch.tensor(y))
    loaded = load_model(save_model(est, tmp_path / "m.npz"))
    assert isinstance(loaded.dual_coef_, torch.Tensor)
    assert loaded.dual_coef_.dtype == est.dual_coef_.dtype
    a, b = est.predict(torch.tensor(X_new)), loaded.predict(torch.tensor(X_new))
    assert isinstance(b, torch.Tensor) and torch.equal(a, b)


def test_pipeline_with_nested_fitted_estimators(tmp_path):
    from kernelflow.estimators import KernelRidge

    X, y, X_new = _data()
    pipe = make_pipeline(StandardScaler(), KernelRidge(alpha=0.05, kernel=Matern(0.7, 2.5)))
    pipe.fit(X, y)
    loaded = load_model(save_model(pipe, tmp_path / "pipe.npz"))
    np.testing.assert_array_equal(pipe.predict(X_new), loaded.predict(X_new))
    assert loaded[-1].kernel == Matern(0.7, 2.5)
    assert isinstance(loaded[-1].kernel_, type(pipe[-1].kernel_))


class _Zoo(RegressorMixin, BaseEstimator):
    """Holds one value of every supported kind in its fitted state."""

    def __init__(self, random_state=None, kernel=None):
        self.random_state = random_state
        self.kernel = kernel

    def fit(self, X, y):
        self.values_ = {
            "bf16": torch.arange(5, dtype=torch.bfloat16) / 3,
            "f32": torch.randn(3, 2, generator=torch.Generator().manual_seed(0)),
            "transposed": torch.arange(6.0).reshape(2, 3).T,
            "int": torch.arange(4),
            "bool": torch.tensor([True, False]),
            "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
            "np_scalar": np.float32(1.5),
            "np_int": np.int64(7),
            "nan": float("nan"),
            "inf": -float("inf"),
            "tuple": (1, "a", None),
            "set": {3, 1},
            "names": np.array(["a", "b"], dtype=object),
            "mixed": np.array([None, 0.5], dtype=object),
            "dtype": torch.float32,
            "device": torch.device("cpu"),
            "np_dtype": np.dtype("float32"),
            "nested": [{"k": torch.ones(2)}, [np.zeros(1)]],
            7: "int key",
        }
        self.generator_ = torch.Generator().manual_seed(3)
        self.coef_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.coef_)


def test_every_supported_value_kind_round_trips(tmp_path):
    rs = np.random.RandomState(5)
    rs.rand(3)
    est = _Zoo(random_state=rs, kernel=Gaussian(0.5)).fit(np.zeros((3, 1)), [1.0, 2.0, 3.0])
    with pytest.raises(ModelFileError, match="only kernelflow and scikit-learn"):
        load_model(save_model(est, tmp_path / "zoo.npz"))
    loaded = load_model(tmp_path / "zoo.npz", trusted=[_Zoo])
    a, b = est.values_, loaded.values_
    assert b["bf16"].dtype == torch.bfloat16 and torch.equal(a["bf16"], b["bf16"])
    for key in ("f32", "int", "bool"):
        assert b[key].dtype == a[key].dtype and torch.equal(a[key], b[key])
    assert b["fortran"].flags.f_contiguous and np.array_equal(a["fortran"], b["fortran"])
    assert b["transposed"].stride() == a["transposed"].stride() == (1, 3)
    assert torch.equal(a["transposed"], b["transposed"])
    assert type(b["np_scalar"]) is np.float32 and b["np_scalar"] == 1.5
    assert type(b["np_int"]) is np.int64
    assert np.isnan(b["nan"]) and b["inf"] == -np.inf
    assert b["tuple"] == (1, "a", None) and b["set"] == {1, 3}
    assert b["names"].dtype == object and list(b["names"]) == ["a", "b"]
    assert b["mixed"][0] is None and b["mixed"][1] == 0.5
    assert b["dtype"] is torch.float32 and b["device"] == torch.device("cpu")
    assert b["np_dtype"] == np.dtype("float32")
    assert torch.equal(b["nested"][0]["k"], torch.ones(2)) and b[7] == "int key"
    assert torch.equal(torch.rand(3, generator=loaded.generator_),
                       torch.rand(3, generator=est.generator_))
    # the RandomState parameter continues the same stream
    assert np.array_equal(loaded.random_state.rand(4), rs.rand(4))
    assert loaded.kernel == Gaussian(0.5)


class _Hooked(RegressorMixin, BaseEstimator):
    def fit(self, X, y):
        self.table_ = lambda x: 2 * x  # not storable: the hooks below replace it
        self.scale_ = 2.0
        return self

    def predict(self, X):
        return self.table_(np.asarray(X)[:, 0])

    def _get_state(self):
        state = default_state(self)
        del state["table_"]
        return state

    def _set_state(self, state):
        for k, v in state.items():
            setattr(self, k, v)
        self.table_ = lambda x: self.scale_ * x


def test_state_hooks_and_unsupported_values(tmp_path):
    est = _Hooked().fit([[1.0]], [2.0])
    loaded = load_model(save_model(est, tmp_path / "hooked.npz"), trusted=[_Hooked])
    np.testing.assert_array_equal(loaded.predict([[3.0]]), [6.0])

    bare = _Hooked().fit([[1.0]], [2.0])
    bare.__class__ = type("_Bare", (RegressorMixin, BaseEstimator), {})
    with pytest.raises(TypeError, match="_get_state"):
        save_model(bare, tmp_path / "bad.npz")
    assert not (tmp_path / "bad.npz").exists()  # nothing half-written


# ---------------------------------------------------------------------------------------------
# tampered and corrupt files
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    from kernelflow.estimators import KernelRidge

    X, y, _ = _data()
    return save_model(KernelRidge(alpha=0.1).fit(X, y), tmp_path / "model.npz")


def _rewrite(path, edit_meta=None, edit_arrays=None):
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(arrays.pop(META_KEY).tobytes())
    if edit_meta:
        edit_meta(meta)
    if edit_arrays:
        edit_arrays(arrays)
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **{META_KEY: blob}, **arrays)
    return path


def _first_tensor_key(meta):
    return sorted(k for k, v in meta["arrays"].items() if len(v["shape"]) >= 1)[0]


def test_unknown_version_is_refused(saved):
    _rewrite(saved, lambda m: m.update(format_version=FORMAT_VERSION + 98))
    with pytest.raises(ModelFileError, match="unsupported model-file format version 99"):
        load_model(saved)


def test_wrong_shape_in_metadata_is_refused(saved):
    def edit(meta):
        key = _first_tensor_key(meta)
        meta["arrays"][key]["shape"] = [s + 1 for s in meta["arrays"][key]["shape"]]

    _rewrite(saved, edit)
    with pytest.raises(ModelFileError, match="shape"):
        load_model(saved)


def test_swapped_array_and_checksum_are_refused(saved):
    meta = read_metadata(saved)
    key = _first_tensor_key(meta)

    def flip(arrays):
        arrays[key] = arrays[key].copy()
        arrays[key].reshape(-1)[0] += 1.0

    _rewrite(saved, edit_arrays=flip)
    with pytest.raises(ModelFileError, match="checksum"):
        load_model(saved)


def test_extra_or_missing_arrays_are_refused(saved):
    _rewrite(saved, edit_arrays=lambda a: a.update(intruder=np.zeros(3)))
    with pytest.raises(ModelFileError, match="unlisted"):
        load_model(saved)


def test_foreign_class_is_refused_without_import(saved):
    def edit(meta):
        meta["estimator"]["class"] = "os:system"
        meta["estimator"]["name"] = None

    _rewrite(saved, edit)
    with pytest.raises(ModelFileError, match="only kernelflow and scikit-learn"):
        load_model(saved)


def test_pickled_object_arrays_are_never_unpickled(saved, tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('executed')",))

    evil = tmp_path / "evil.npz"
    with open(evil, "wb") as fh:
        np.savez(fh, **{META_KEY: np.frombuffer(b"{}", np.uint8)},
                 a0=np.array([Boom()], dtype=object))
    with pytest.raises(ModelFileError):
        load_model(evil)


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04broken"])
def test_garbage_files_are_refused(tmp_path, content):
    p = tmp_path / "garbage.npz"
    p.write_bytes(content)
    with pytest.raises(ModelFileError):
        load_model(p)


def test_truncated_file_is_refused(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError):
        load_model(saved)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope.npz")


def test_metadata_is_plain_json_with_checksums(saved):
    with zipfile.ZipFile(saved) as z:
        names = set(z.namelist())
    assert f"{META_KEY}.npy" in names
    meta = read_metadata(saved)
    assert meta["format"] == "kernelflow-model"
    with np.load(saved, allow_pickle=False) as f:
        for key, info in meta["arrays"].items():
            assert hashlib.sha256(f[key].tobytes()).hexdigest() == info["sha256"]


def test_registry_names_and_clone_of_loaded_model(saved):
    loaded = load_model(saved)
    assert name_of(loaded) == "kernel_ridge"
    assert clone(loaded).get_params() == loaded.get_params()


_CONTINUABLE = [
    n for n in _REGISTERED
    if hasattr(available_estimators()[n], "partial_fit") and not n.startswith("sklearn")
]


@pytest.mark.parametrize("name", _CONTINUABLE)
def test_loaded_learner_continues_its_stream_identically(name, tmp_path):
    cls = available_estimators()[name]
    X, y, X_new = _data()
    est = _instance(name, cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit_and_outputs(est, X[:30], y[:30], X_new)
        loaded = load_model(save_model(est, tmp_path / "m.npz"))
        kind = _kind(est)
        y_more = (y[30:] > np.median(y)).astype(int) if kind == "classifier" else y[30:]
        for model in (est, loaded):
            if kind == "outlier_detector":
                model.partial_fit(X[30:])
            else:
                model.partial_fit(X[30:], y_more)
    for a, b in zip(_outputs(est, X_new), _outputs(loaded, X_new), strict=True):
        np.testing.assert_array_equal(a, b)


def test_saved_file_mode_follows_the_umask_like_other_files(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = save_model(_fit_ridge(), tmp_path / "m.npz")
        other = tmp_path / "other.txt"
        other.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(other.stat().st_mode) == 0o644


@pytest.mark.parametrize("length", [200, 230, 250, 255])
def test_long_legal_file_names_save_and_load(tmp_path, length):
    name = "m" * (length - 4) + ".npz"
    assert len(name.encode()) == length
    model = _fit_ridge()
    path = save_model(model, tmp_path / name)
    assert path.name == name and [p.name for p in tmp_path.iterdir()] == [name]
    X_new = _data()[2]
    np.testing.assert_array_equal(load_model(path).predict(X_new), model.predict(X_new))


def test_long_non_ascii_file_name(tmp_path):
    name = "é" * 120 + ".npz"  # 244 bytes in UTF-8: the temporary name is cut on a character
    path = save_model(_fit_ridge(), tmp_path / name)
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == [name]


def _fit_ridge():
    from kernelflow.estimators import KernelRidge

    X, y, _ = _data()
    return KernelRidge(alpha=0.1).fit(X, y)


def test_interrupted_refit_of_a_loaded_pipeline_is_all_or_nothing(tmp_path):
    from kernelflow.estimators import KernelRidge
    from kernelflow.io import all_or_nothing

    X, y, X_new = _data()
    pipe = make_pipeline(StandardScaler(), KernelRidge(alpha=0.1)).fit(X, y)
    path = save_model(pipe, tmp_path / "pipe.npz")
    expected = pipe.predict(X_new)
    X2, y_nan = 10 * X + 5, np.full(len(y), np.nan)

    # scikit-learn refits the scaler in place before the model refuses the new target: without
    # protection the old model is left behind new scaling and predicts something else
    bare = load_model(path)
    with pytest.raises(ValueError):
        bare.fit(X2, y_nan)
    assert not np.allclose(bare.predict(X_new), expected)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for exc, target in ((ValueError, y_nan), (KeyboardInterrupt, y)):
        loaded = load_model(path)
        if exc is KeyboardInterrupt:
            loaded[-1].fit = interrupt  # the last step is interrupted mid-refit
        with pytest.raises(exc), all_or_nothing(loaded):
            loaded.fit(X2, target)
        np.testing.assert_array_equal(loaded.predict(X_new), expected)
        np.testing.assert_array_equal(loaded[0].mean_, pipe[0].mean_)
    # a refit that completes is kept
    with all_or_nothing(loaded):
        loaded.set_params(kernelridge__alpha=0.1)
        loaded.steps[-1][1].__dict__.pop("fit")
        loaded.fit(X2, y)
    np.testing.assert_allclose(loaded.predict(10 * X_new + 5), pipe.predict(X_new), rtol=1e-6)


def test_library_defaults_load_on_a_machine_with_little_memory(tmp_path, monkeypatch):
    # the defaults are limits (a 256 MiB block cache, 30 000-row factorisations), not
    # allocations: a model saved with them loads where the memory budget is only 64 MiB
    from kernelflow import _trust
    from kernelflow.estimators import DoublyStochasticRegressor, KernelRidge
    from kernelflow.operators import Options

    X, y, X_new = _data()
    models = [KernelRidge(alpha=0.1, options=Options()).fit(X, y),
              DoublyStochasticRegressor(max_iter=2, random_state=0).fit(X, y)]
    paths = [save_model(m, tmp_path / f"m{i}.npz") for i, m in enumerate(models)]
    monkeypatch.setattr(_trust, "_memory_cap", lambda: 2**26)
    for model, path in zip(models, paths):
        np.testing.assert_array_equal(load_model(path).predict(X_new), model.predict(X_new))


def test_checkpoint_path_is_not_stored_and_the_model_loads(tmp_path):
    """A checkpoint names a file on the fitting machine: the model file stores None."""
    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge

    rng = np.random.RandomState(0)
    X, y = rng.randn(300, 2), rng.randn(300)
    ckpt = tmp_path / "fit.ckpt"
    model = NystromKernelRidge(n_components=40, solver="cg", checkpoint=str(ckpt),
                               random_state=0).fit(X, y)
    path = save_model(model, tmp_path / "m.npz")
    loaded = load_model(path)
    assert loaded.get_params()["checkpoint"] is None
    assert model.get_params()["checkpoint"] == str(ckpt)  # the saved estimator is unchanged
    assert np.array_equal(loaded.predict(X[:9]), model.predict(X[:9]))
