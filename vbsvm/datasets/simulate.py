"""Simulated classification data with a known truth.

Every generator takes ``seed`` (an int, ``None``, a
:class:`numpy.random.SeedSequence` or a :class:`numpy.random.Generator`,
passed to :func:`numpy.random.default_rng`; a Generator is used as is and
advanced) and returns a :class:`pandas.DataFrame` whose labels ``y`` are
integers in {-1, +1}. The parameters that generated the data are stored in
``df.attrs["truth"]``, a dict with at least ``"intercept"`` (float),
``"coef"`` (1-d :class:`numpy.ndarray`) and ``"names"`` (the column names
that ``coef`` belongs to, a tuple). The dict compares equal by value, so
frames that share a truth can be concatenated with :func:`pandas.concat`
(pandas compares ``attrs`` there, which fails for plain dicts of arrays).

All labels come from a logistic link: ``P(y = +1 | x) = expit(eta)`` with a
linear predictor ``eta``. Nothing here is drawn from a real data set.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vbsvm import validation

__all__ = ["simulate_luts", "simulate_sparse", "simulate_grouped", "simulate_mcar", "Truth"]


class Truth(dict):
    """The ``attrs["truth"]`` dict of a simulated frame.

    A plain :class:`dict` whose ``==`` compares array values with
    :func:`numpy.array_equal`, so that it returns a bool (pandas compares
    ``attrs`` when concatenating frames).
    """

    def __eq__(self, other):
        if not isinstance(other, dict) or self.keys() != other.keys():
            return False
        for key, value in self.items():
            a, b = value, other[key]
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not np.array_equal(np.asarray(a), np.asarray(b)):
                    return False
            elif a != b:
                return False
        return True

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None  # mutable, like dict


def _expit(eta: np.ndarray) -> np.ndarray:
    # Numerically stable logistic function without importing scipy.
    return 0.5 * (1.0 + np.tanh(0.5 * eta))


def _labels(rng: np.random.Generator, eta: np.ndarray) -> np.ndarray:
    """Draw y in {-1, +1} with P(y = +1) = expit(eta)."""
    return np.where(rng.random(eta.shape[0]) < _expit(eta), 1, -1).astype(np.int64)


def _frame(y: np.ndarray, x: np.ndarray, names, truth: Truth) -> pd.DataFrame:
    df = pd.DataFrame(x, columns=list(names))
    df.insert(0, "y", y)
    df.attrs["truth"] = truth
    return df


def simulate_luts(n, d, seed=None, n_test=0):
    """Simulate the logistic data of Luts & Ormerod (2014), Section 4.2.

    The generator::

        beta ~ N(0, 1),  u ~ N(0, I_d)                  (drawn once)
        d_i ~ N(0, I_d),  q_i ~ Bernoulli(expit(beta + d_i' u)),  y_i = 2 q_i - 1

    Parameters
    ----------
    n : int
        Number of (training) rows, >= 1.
    d : int
        Number of predictors, >= 1.
    seed : int, None, numpy.random.SeedSequence or numpy.random.Generator, optional
        Random seed or generator.
    n_test : int, default 0
        If > 0, also draw a test set of `n_test` rows with the same
        ``beta`` and ``u``.

    Returns
    -------
    pandas.DataFrame or tuple of two DataFrames
        Columns ``y`` (int, -1/+1) and ``x1..xd`` (float). With
        ``n_test > 0``, the tuple ``(train, test)``. ``attrs["truth"]`` is
        ``{"intercept": beta, "coef": u, "names": ("x1", ..., "xd")}``.

    Notes
    -----
    Draw order: ``beta``, ``u``, the training rows and labels, then the test
    rows and labels. So for a given seed the training frame is the same
    whatever `n_test` is.

    Examples
    --------
    >>> train, test = simulate_luts(200, 5, seed=1, n_test=1000)
    >>> train.shape, test.shape
    ((200, 6), (1000, 6))
    """
    n = validation.integer(n, "n", 1)
    d = validation.integer(d, "d", 1)
    n_test = validation.integer(n_test, "n_test", 0)
    rng = np.random.default_rng(seed)
    beta = float(rng.standard_normal())
    u = rng.standard_normal(d)
    names = tuple(f"x{j + 1}" for j in range(d))

    def draw(m):
        x = rng.standard_normal((m, d))
        truth = Truth(intercept=beta, coef=u.copy(), names=names)
        return _frame(_labels(rng, beta + x @ u), x, names, truth)

    train = draw(n)
    if n_test == 0:
        return train
    return train, draw(n_test)


def simulate_sparse(n, p, k, seed=None, *, effect=1.0, intercept=0.0, rho=0.0, shuffle=False):
    """Simulate sparse logistic data for variable selection.

    ``x_i`` has ``p`` standard-normal predictors (correlated if `rho` != 0),
    ``k`` of which have nonzero coefficients, and
    ``P(y_i = +1) = expit(intercept + x_i' coef)``.

    Parameters
    ----------
    n : int
        Number of rows, >= 1.
    p : int
        Number of predictors, >= 1.
    k : int
        Number of nonzero coefficients, 0 <= k <= p.
    seed : int, None, numpy.random.SeedSequence or numpy.random.Generator, optional
        Random seed or generator.
    effect : float or array-like of length k, default 1.0
        Effect sizes. A scalar ``a`` gives the nonzero coefficients
        ``+a, -a, +a, -a, ...`` (alternating signs, all of magnitude ``a``, on
        the scale of a unit-variance predictor, i.e. log-odds per standard
        deviation); an array gives them exactly.
    intercept : float, default 0.0
        Intercept of the linear predictor.
    rho : float, default 0.0
        AR(1) correlation of the predictors: ``corr(x_j, x_l) = rho**|j - l|``
        (each predictor still has variance 1). Must satisfy ``|rho| < 1``.
    shuffle : bool, default False
        If False the nonzero coefficients belong to ``x1..xk``; if True their
        positions are drawn at random (and kept in increasing order).

    Returns
    -------
    pandas.DataFrame
        Columns ``y`` (int, -1/+1) and ``x1..xp``. ``attrs["truth"]`` holds
        ``"intercept"``, ``"coef"`` (length p, zeros off the support),
        ``"names"`` and ``"support"`` (tuple of the names with nonzero
        coefficients).

    Examples
    --------
    >>> df = simulate_sparse(500, 20, 3, seed=0)
    >>> df.attrs["truth"]["support"]
    ('x1', 'x2', 'x3')
    """
    n = validation.integer(n, "n", 1)
    p = validation.integer(p, "p", 1)
    k = validation.integer(k, "k", 0)
    if k > p:
        raise ValueError(f"k must be <= p, got k={k} and p={p}")
    rho = float(rho)
    if not -1.0 < rho < 1.0:
        raise ValueError(f"rho must satisfy |rho| < 1, got {rho}")
    effect_arr = np.asarray(effect, dtype=np.float64)
    if effect_arr.ndim == 0:
        values = float(effect_arr) * np.where(np.arange(k) % 2 == 0, 1.0, -1.0)
    elif effect_arr.shape == (k,):
        values = effect_arr.copy()
    else:
        raise ValueError(f"effect must be a scalar or have length k={k}, got shape {effect_arr.shape}")

    rng = np.random.default_rng(seed)
    support = np.sort(rng.choice(p, size=k, replace=False)) if shuffle else np.arange(k)
    coef = np.zeros(p)
    coef[support] = values
    x = rng.standard_normal((n, p))
    if rho != 0.0:
        # AR(1) recursion keeps unit variance: x_j = rho x_{j-1} + sqrt(1 - rho^2) z_j.
        scale = np.sqrt(1.0 - rho * rho)
        for j in range(1, p):
            x[:, j] = rho * x[:, j - 1] + scale * x[:, j]
    y = _labels(rng, intercept + x @ coef)
    names = tuple(f"x{j + 1}" for j in range(p))
    truth = Truth(
        intercept=float(intercept),
        coef=coef,
        names=names,
        support=tuple(names[j] for j in support),
    )
    return _frame(y, x, names, truth)


def simulate_grouped(
    n_groups,
    n_per_group,
    seed=None,
    sd_group=1.0,
    *,
    intercept=0.0,
    beta_time=-0.3,
    beta_treatment=-0.5,
    beta_interaction=-0.2,
    p_treatment=0.5,
):
    """Simulate longitudinal data with a random intercept per group.

    A toenail-like design: each group (e.g. patient) is observed at times
    ``0, 1, ..., n_per_group - 1`` and is assigned to treatment (1) or
    control (0) as a whole. With ``b_g ~ N(0, sd_group**2)``::

        eta_gt = intercept + b_g + beta_time * t + beta_treatment * trt_g
                 + beta_interaction * t * trt_g
        P(y_gt = +1) = expit(eta_gt)

    Parameters
    ----------
    n_groups : int
        Number of groups, >= 1.
    n_per_group : int
        Observations per group, >= 1.
    seed : int, None, numpy.random.SeedSequence or numpy.random.Generator, optional
        Random seed or generator.
    sd_group : float, default 1.0
        Standard deviation of the random intercepts, >= 0.
    intercept, beta_time, beta_treatment, beta_interaction : float
        Fixed effects (defaults 0.0, -0.3, -0.5, -0.2).
    p_treatment : float, default 0.5
        Share of groups treated: ``round(p_treatment * n_groups)`` groups,
        chosen at random, get ``treatment = 1``.

    Returns
    -------
    pandas.DataFrame
        ``n_groups * n_per_group`` rows sorted by group and time, columns
        ``y`` (int, -1/+1), ``group`` (int, 0..n_groups-1), ``time`` (float)
        and ``treatment`` (int, 0/1). ``attrs["truth"]`` holds
        ``"intercept"``, ``"coef"`` (array for ``names`` =
        ``("time", "treatment", "time:treatment")``), ``"sd_group"`` and
        ``"group_effects"`` (the drawn ``b_g``, length n_groups).
        A matching model: ``"y ~ time * treatment + (1 | group)"``.

    Examples
    --------
    >>> df = simulate_grouped(50, 7, seed=0)
    >>> df.shape
    (350, 4)
    """
    n_groups = validation.integer(n_groups, "n_groups", 1)
    n_per_group = validation.integer(n_per_group, "n_per_group", 1)
    sd_group = float(sd_group)
    if not sd_group >= 0.0:
        raise ValueError(f"sd_group must be >= 0, got {sd_group}")
    p_treatment = float(p_treatment)
    if not 0.0 <= p_treatment <= 1.0:
        raise ValueError(f"p_treatment must be in [0, 1], got {p_treatment}")

    rng = np.random.default_rng(seed)
    n_treated = int(round(p_treatment * n_groups))
    treated = rng.permutation(np.arange(n_groups) < n_treated).astype(np.int64)
    b = sd_group * rng.standard_normal(n_groups)

    group = np.repeat(np.arange(n_groups, dtype=np.int64), n_per_group)
    time = np.tile(np.arange(n_per_group, dtype=np.float64), n_groups)
    trt = treated[group]
    coef = np.array([beta_time, beta_treatment, beta_interaction], dtype=np.float64)
    eta = intercept + b[group] + coef[0] * time + coef[1] * trt + coef[2] * time * trt
    y = _labels(rng, eta)
    df = pd.DataFrame({"y": y, "group": group, "time": time, "treatment": trt})
    df.attrs["truth"] = Truth(
        intercept=float(intercept),
        coef=coef,
        names=("time", "treatment", "time:treatment"),
        sd_group=sd_group,
        group_effects=b,
    )
    return df


#: Correlation of the three predictors of :func:`simulate_mcar`.
MCAR_CORRELATION = ((1.0, 0.7, 0.5), (0.7, 1.0, 0.3), (0.5, 0.3, 1.0))


def simulate_mcar(n, seed=None, *, frac=0.3, intercept=0.3, coef=(1.0, -0.8, 0.5)):
    """Simulate complete data and delete part of one correlated predictor completely at random.

    Three standard-normal predictors with correlations ``corr(x1, x2) = 0.7``,
    ``corr(x1, x3) = 0.5``, ``corr(x2, x3) = 0.3`` and
    ``P(y_i = +1) = expit(intercept + x_i' coef)``; each ``x1`` value is then
    deleted with probability `frac`, independently of everything (MCAR). The
    imputation acceptance check of ``missing="impute"`` compares fits on the
    two frames with the complete-case fit and with regression imputation.

    Parameters
    ----------
    n : int
        Number of rows, >= 1.
    seed : int, None, numpy.random.SeedSequence or numpy.random.Generator, optional
        Random seed or generator.
    frac : float, default 0.3
        Probability that an ``x1`` value is deleted, in [0, 1].
    intercept : float, default 0.3
        Intercept of the linear predictor.
    coef : sequence of 3 floats, default (1.0, -0.8, 0.5)
        Coefficients of ``x1, x2, x3``.

    Returns
    -------
    full, incomplete : pandas.DataFrame
        Columns ``y`` (int, -1/+1), ``x1``, ``x2``, ``x3``; ``incomplete`` is a
        copy of ``full`` with the deleted ``x1`` values set to NaN. Both carry
        the same ``attrs["truth"]`` (``"intercept"``, ``"coef"``, ``"names"``).

    Examples
    --------
    >>> full, incomplete = simulate_mcar(400, seed=0)
    >>> int(incomplete["x1"].isna().sum()), int(full["x1"].isna().sum())
    (142, 0)
    """
    n = validation.integer(n, "n", 1)
    frac = float(frac)
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"frac must be in [0, 1], got {frac}")
    coef = np.asarray(coef, dtype=np.float64)
    if coef.shape != (3,):
        raise ValueError(f"coef must have length 3, got shape {coef.shape}")
    rng = np.random.default_rng(seed)
    x = rng.multivariate_normal(np.zeros(3), np.array(MCAR_CORRELATION), size=n)
    y = _labels(rng, intercept + x @ coef)
    names = ("x1", "x2", "x3")
    full = _frame(y, x, names, Truth(intercept=float(intercept), coef=coef, names=names))
    incomplete = full.copy()
    incomplete.loc[rng.random(n) < frac, "x1"] = np.nan
    return full, incomplete
