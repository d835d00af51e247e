"""The one output rule, checked over every registered kernelflow estimator.

* NumPy array, list or pandas DataFrame in -> NumPy array out; float32 when the input is float32
  (an array, or a DataFrame whose columns are all float32), else float64 (integers too);
* torch tensor in -> torch tensor out, on the input's device and in its dtype (float32 or
  float64; integer tensors give float64).

The rule covers real-valued outputs: ``predict`` of regressors, ``decision_function``,
``score_samples`` and ``transform``. A classifier's ``predict`` returns class labels, as in
scikit-learn, and a novelty detector's ``predict`` returns +1/-1 labels.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import is_classifier, is_outlier_detector

from kernelflow.registry import available_estimators
from kernelflow.utils._validation import output_kind, to_output

#: small, fast settings per registry name (defaults are sized for real data)
FAST = {
    "penalized": {"max_iter": 50},
    "penalized_cv": {"alphas": 2, "sigmas": 2, "cv": 2, "max_iter": 50},
    "gradient_descent_cv": {"sigmas": 3, "cv": 2, "max_iter": 200},
    "sign_gradient_cv": {"sigmas": 3, "cv": 2, "max_iter": 200},
    "coordinate_descent_cv": {"sigmas": 3, "cv": 2, "max_iter": 200},
    "coordinate_descent": {"max_iter": 300},
    "gradient_descent": {"max_iter": 300},
    "sign_gradient": {"max_iter": 300},
    "huber": {"max_iter": 20},
    "quantile": {"max_iter": 20},
    "tukey": {"max_iter": 20},
}

ESTIMATORS = sorted(available_estimators(include_sklearn=False).items())

rng = np.random.default_rng(0)
X64 = rng.normal(size=(30, 3))
Y = np.sin(X64[:, 0]) + 0.1 * rng.normal(size=30)


def _inputs():
    return {
        "float64": (X64, np.float64),
        "float32": (X64.astype(np.float32), np.float32),
        "int": ((X64 * 10).astype(np.int64), np.float64),
        "list": (X64.tolist(), np.float64),
        "DataFrame": (pd.DataFrame(X64, columns=["a", "b", "c"]), np.float64),
        "DataFrame32": (pd.DataFrame(X64.astype(np.float32), columns=["a", "b", "c"]),
                        np.float32),
        "tensor32": (torch.tensor(X64, dtype=torch.float32), torch.float32),
        "tensor64": (torch.tensor(X64), torch.float64),
        "tensor_int": (torch.tensor((X64 * 10).astype(np.int64)), torch.float64),
    }


def _make(name, cls):
    params = {k: v for k, v in FAST.get(name, {}).items() if k in cls().get_params()}
    return cls(**params)


def _methods(est):
    names = ["decision_function", "score_samples", "transform"]
    if not (hasattr(est, "classes_") or is_outlier_detector(est)) and hasattr(est, "predict"):
        names.append("predict")
    return [m for m in names if hasattr(est, m)]


@pytest.mark.parametrize("name,cls", ESTIMATORS, ids=[n for n, _ in ESTIMATORS])
def test_output_follows_the_input(name, cls):
    y = (Y > 0).astype(int) if is_classifier(cls()) else Y
    checked = 0
    for label, (X, expected) in _inputs().items():
        est = _make(name, cls)
        yy = torch.as_tensor(y) if isinstance(X, torch.Tensor) else y
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence notes at these tiny budgets
            est.fit(X, yy)
        for method in _methods(est):
            out = getattr(est, method)(X)
            where = f"{name}.{method} on {label} input"
            if isinstance(X, torch.Tensor):
                assert isinstance(out, torch.Tensor), where
                assert out.dtype == expected and out.device == X.device, where
            else:
                assert type(out) is np.ndarray, where
                assert out.dtype == expected, where
            assert out.shape[0] == 30, where
            checked += 1
    assert checked >= len(_inputs())


def test_output_kind_of_each_input_type():
    assert output_kind(np.zeros(2, np.float32)).dtype == np.float32
    assert output_kind(np.zeros(2, np.float16)).dtype == np.float64
    assert output_kind(pd.DataFrame({"a": [1.0], "b": [2]})).dtype == np.float64
    assert output_kind([[1.0]]).dtype == np.float64
    k = output_kind(torch.zeros(2, dtype=torch.int32))
    assert k == "torch" and k.dtype == torch.float64
    out = to_output(torch.ones(2, dtype=torch.float64), output_kind(np.zeros(2, np.float32)))
    assert type(out) is np.ndarray and out.dtype == np.float32
    # a plain kind string keeps the tensor's dtype (callers that predate the rule)
    assert to_output(torch.ones(2, dtype=torch.float32), "numpy").dtype == np.float32
