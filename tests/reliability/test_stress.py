"""Numerical stress: every fit finishes without inf/nan, the VB ELBO never decreases, and the user
is warned where they should know something.

Each case is named (``CASES``) and run through the public API by VB and by a short Gibbs run (and
MAP where available). For every fit: finite coefficient means and sds (sds may be NaN only for
MAP), finite predictions (``kind="score"`` and ``"prob"``), finite draws; for VB the ELBO trace of
accepted iterates is non-decreasing (relative tolerance 1e-10) and either converged or a
ConvergenceWarning was issued. ``WARN_CASES`` lists the cases where a DiagnosticWarning must
name the problem (separable data, non-identified columns, n < p, a one-level grouping factor,
one observation per level).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import special

import vbsvm
from vbsvm.exceptions import ConvergenceWarning, DiagnosticWarning
from support.statistics import mean_z

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def _logistic_y(rng, eta):
    return np.where(rng.random(eta.size) < special.expit(eta), 1, 0)


def _base(n=80, seed=0):
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    return rng, pd.DataFrame({"y": _logistic_y(rng, 0.3 + x1 - 0.7 * x2), "x1": x1, "x2": x2})


# ------------------------------------------------------------------------------- the cases
def case_separable():
    rng, df = _base()
    df["y"] = (df["x1"] + 0.5 * df["x2"] > 0).astype(int)
    return "y ~ x1 + x2", df, {}


def case_separable_vague_prior():
    formula, df, kw = case_separable()
    return formula, df, {"penalty": None}


def case_separable_wide_margin_duplicated_rows():
    """chi -> 0: duplicated points sitting on a wide margin."""
    rng, df = _base(40)
    df["y"] = (df["x1"] > 0).astype(int)
    df["x1"] = df["x1"] + 3 * np.where(df["y"] == 1, 1, -1)
    return "y ~ x1 + x2", pd.concat([df, df, df.iloc[:5]], ignore_index=True), {}


def case_tiny_scale():
    rng, df = _base()
    df["x1"] *= 1e-8
    return "y ~ x1 + x2", df, {}


def case_huge_scale():
    rng, df = _base()
    df["x1"] *= 1e8
    df["x2"] *= 1e-8
    return "y ~ x1 + x2", df, {}


def case_huge_scale_unstandardized():
    formula, df, _ = case_huge_scale()
    return formula, df, {"standardize": False}


def case_tiny_scale_unstandardized():
    formula, df, _ = case_tiny_scale()
    return formula, df, {"standardize": False}


def case_duplicated_column():
    rng, df = _base()
    df["x1_copy"] = df["x1"]
    return "y ~ x1 + x1_copy + x2", df, {}


def case_collinear_with_intercept():
    rng, df = _base()
    df["x3"] = 2 * df["x1"] + 1
    return "y ~ x1 + x2 + x3", df, {}


def case_exact_linear_combination():
    rng, df = _base()
    df["x3"] = df["x1"] - 0.5 * df["x2"]
    return "y ~ x1 + x2 + x3", df, {}


def case_n_less_than_p(n=25, p=100):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, p))
    df = pd.DataFrame(X, columns=[f"v{j}" for j in range(p)])
    df["y"] = _logistic_y(rng, X[:, 0] - X[:, 1])
    return "y ~ .", df, {"max_iter": 300, "tol": 1e-6}


def case_single_group():
    rng, df = _base()
    df["g"] = "only"
    return "y ~ x1 + x2 + (1 | g)", df, {}


def case_groups_of_size_one():
    rng, df = _base()
    df["id"] = np.arange(len(df))
    return "y ~ x1 + x2 + (1 | id)", df, {}


def case_imbalanced_one_percent():
    rng = np.random.default_rng(7)
    n = 600
    X = rng.normal(size=(n, 3))
    y = np.zeros(n, dtype=int)
    y[rng.choice(n, 6, replace=False)] = 1
    df = pd.DataFrame(X, columns=["a", "b", "c"]).assign(y=y)
    return "y ~ a + b + c", df, {}


def case_imbalanced_random_intercept():
    formula, df, kw = case_imbalanced_one_percent()
    df["g"] = np.arange(len(df)) % 12
    return "y ~ a + b + c + (1 | g)", df, kw


def _selection(rho):
    def case():
        from vbsvm.models.priors import LaplaceZero

        rng = np.random.default_rng(9)
        X = rng.normal(size=(70, 6))
        df = pd.DataFrame(X, columns=list("abcdef"))
        df["y"] = _logistic_y(rng, 1.5 * X[:, 0] - X[:, 1])
        return "y ~ .", df, {"prior": LaplaceZero(rho=rho)}
    case.__name__ = f"case_laplace_zero_rho_{rho:g}"
    return case


def case_impute_heavy_missing():
    rng, df = _base(60)
    df.loc[rng.random(60) < 0.6, "x1"] = np.nan
    df.loc[rng.random(60) < 0.2, "x2"] = np.nan
    return "y ~ x1 + x2", df, {"missing": "impute"}


def case_impute_huge_scale():
    rng, df = _base(60)
    df["x1"] *= 1e8
    df.loc[rng.random(60) < 0.2, "x1"] = np.nan
    return "y ~ x1 + x2", df, {"missing": "impute"}


CASES = {f.__name__[5:]: f for f in [
    case_separable, case_separable_vague_prior, case_separable_wide_margin_duplicated_rows,
    case_tiny_scale, case_huge_scale, case_huge_scale_unstandardized, case_tiny_scale_unstandardized,
    case_duplicated_column, case_collinear_with_intercept, case_exact_linear_combination,
    case_n_less_than_p, case_single_group, case_groups_of_size_one, case_imbalanced_one_percent,
    case_imbalanced_random_intercept, _selection(1e-6), _selection(1 - 1e-6),
    case_impute_heavy_missing, case_impute_huge_scale]}

NO_MAP = {n for n in CASES if n.startswith(("laplace_zero", "impute"))}  # MAP is refused there


def _fit(name, method, **extra):
    formula, df, kw = CASES[name]()
    kw = {**kw, **extra}
    if method == "gibbs":
        kw.update(draws=100, tune=50, chains=2, seed=1, progress=False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fit = vbsvm.svm(formula, data=df, method=method, **kw)
    return fit, df, rec


def _check_finite(fit, df):
    coef = fit.coef
    assert np.isfinite(coef["mean"]).all(), coef
    if fit.method != "map":
        assert np.isfinite(coef["sd"]).all() and (coef["sd"] >= 0).all(), coef
        assert np.isfinite(fit.predict(df, kind="prob")).all()
    sc = fit.predict(df, kind="score")
    assert np.isfinite(sc["mean"]).all()
    for k, v in fit.posterior.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and k.endswith("draws"):
            assert np.isfinite(v).all(), k


def _check_elbo(fit, rec):
    e = np.asarray(fit.elbo)
    assert e.size >= 1 and np.isfinite(e).all()
    d = np.diff(e)
    assert np.all(d >= -1e-10 * np.abs(e[1:])), (d.min(), np.argmin(d))
    if not fit.info.get("converged", True):
        assert any(issubclass(r.category, ConvergenceWarning) for r in rec)


@pytest.mark.parametrize("name", list(CASES))
def test_stress_vb(name):
    fit, df, rec = _fit(name, "vb")
    _check_finite(fit, df)
    _check_elbo(fit, rec)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow
def test_stress_gibbs(name):
    fit, df, rec = _fit(name, "gibbs")
    _check_finite(fit, df)


@pytest.mark.parametrize("name", [n for n in CASES if n not in NO_MAP])
def test_stress_map(name):
    fit, df, rec = _fit(name, "map")
    _check_finite(fit, df)


# ------------------------------------------------------------------------------- warnings
# Separability is checked (a linear program) only with penalty=None, where it makes the
# coefficients as large as the vague prior allows; with a penalty it is merely informative.
WARN_CASES = {
    "separable_vague_prior": "separab",
    "duplicated_column": "x1_copy",
    "collinear_with_intercept": "x3",
    "exact_linear_combination": "x3",
    "n_less_than_p": "identif|collinear|rank|separab",
    "single_group": "g",
    "groups_of_size_one": "id",
}


@pytest.mark.parametrize("name", WARN_CASES)
def test_stress_user_is_warned(name):
    fit, df, rec = _fit(name, "vb")
    diag = [str(r.message) for r in rec if issubclass(r.category, DiagnosticWarning)]
    import re

    assert any(re.search(WARN_CASES[name], m) for m in diag), diag


@pytest.mark.parametrize("name", ["tiny_scale", "huge_scale", "imbalanced_one_percent", "groups_of_size_one"])
def test_stress_no_spurious_separability_warning(name):
    """The warning must not fire on ordinary data (the rescaled and imbalanced sets are not
    separable)."""
    fit, df, rec = _fit(name, "vb")
    assert not any("separab" in str(r.message) for r in rec)


# ------------------------------------------------------------------------------- scale equivariance
@pytest.mark.parametrize("method", ["vb", "gibbs", "map"])
@pytest.mark.slow
def test_rescaling_a_predictor_rescales_its_coefficient(method):
    """With standardize=True a fit is equivariant to predictor units from 1e-8 to 1e8: the
    coefficient of s * x is the coefficient of x divided by s. VB and MAP to 1e-6 relative;
    Gibbs within Monte Carlo error (the standardized columns differ in the last bits, and the
    inverse-Gaussian sampler's branch makes chains from the same seed diverge)."""
    rng, df = _base()
    kw = dict(method=method, seed=3, draws=300, tune=50, chains=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        ref = vbsvm.svm("y ~ x1 + x2", data=df, **kw)
        for s in (1e-8, 1e8):
            d2 = df.assign(x1=df["x1"] * s, x2=df["x2"] / s)
            fit = vbsvm.svm("y ~ x1 + x2", data=d2, **kw)
            if method == "gibbs":
                a = ref.posterior["theta_draws"]
                b = fit.posterior["theta_draws"] * [1, s, 1 / s]
                assert max(mean_z(a[..., j], b[..., j]) for j in range(3)) < 4
            else:
                got = fit.coef["mean"].to_numpy() * [1, s, 1 / s]
                np.testing.assert_allclose(got, ref.coef["mean"].to_numpy(), rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------- GP
@pytest.mark.parametrize("case", ["separable", "huge_scale", "imbalanced_one_percent", "duplicated_column"])
@pytest.mark.slow
def test_stress_gp_batch_vb(case):
    from vbsvm.fitting.gp import gpsvm

    formula, df, kw = CASES[case]()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fit = gpsvm(formula, df, method="vb", n_inducing=20, seed=1, max_iter=200)
    e = np.asarray(fit.elbo)
    assert np.isfinite(e).all()
    assert np.all(np.diff(e) >= -1e-8 * np.abs(e[1:])), np.diff(e).min()
    p = fit.predict(df, kind="prob")
    assert np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()


# ------------------------------------------------------------------------------- n < p at scale
@pytest.mark.slow
def test_stress_n100_p2000_vb_and_gibbs_finish():
    """n = 100, p = 2000: VB converges and a short Gibbs run finishes, with finite output."""
    formula, df, _ = case_n_less_than_p(n=100, p=2000)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fit = vbsvm.svm(formula, data=df)
    _check_finite(fit, df)
    _check_elbo(fit, rec)
    print(f"[stress] n=100, p=2000 VB: {time.perf_counter() - t0:.1f} s, {fit.info['n_sweeps']} sweeps")
    g = vbsvm.svm(formula, data=df, method="gibbs", draws=50, tune=20, chains=1, progress=False)
    assert np.isfinite(g.posterior["theta_draws"]).all()


@pytest.mark.slow
def test_stress_n100_p2000_vb_is_fast():
    formula, df, _ = case_n_less_than_p(n=100, p=2000)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vbsvm.svm(formula, data=df, max_iter=100)
    assert time.perf_counter() - t0 < 30.0
