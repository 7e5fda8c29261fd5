"""Property-based tests (hypothesis) of the distribution module and the design layer.

Distributions, over wide parameter ranges (log-uniform over many decades): every moment and the
entropy is finite; moments and entropy agree with one-dimensional quadrature of the log density
where the quadrature is reliable; draws lie in the support and are finite; the closed-form
``GIG(1/2, 1, chi)`` sampler used by every Gibbs sweep survives ``chi`` from 1e-300 to 1e300.

Design: random formulas (known and unknown names, transforms, interactions, random-intercept
terms, syntax garbage) over random frames (numeric with NaN/inf, integer, boolean, string,
categorical, constant and all-NaN columns; two-level, one-level, three-level or incomplete
responses) either build a valid Design or raise a :class:`vbsvm.exceptions.VbsvmError` — never any
other exception — and never modify the frame.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from scipy import integrate

from vbsvm.formula.design import build_design
from vbsvm.distributions import (GIG, Bernoulli, Gaussian, InverseGamma, InverseGaussian, InverseWishart,
                                 sample_gig_half)
from vbsvm.exceptions import VbsvmError
from support.statistics import fingerprint

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def logu(lo, hi):
    """Log-uniform floats on [10^lo, 10^hi]."""
    return st.floats(lo, hi, allow_nan=False).map(lambda e: float(10.0 ** e))


def _quad_moments(logpdf, lo, hi, n=40001):
    """int p, int x p, int p / x, int p log x and -int p log p over [lo, hi], by Simpson's rule in
    t = log x (p is smooth in t; 20001 nodes give ~1e-9 relative accuracy here)."""
    t = np.linspace(math.log(lo), math.log(hi), n)
    x = np.exp(t)
    lp = np.asarray(logpdf(x), dtype=float)
    w = np.exp(lp) * x  # dx = x dt
    ent = np.where(np.isfinite(lp), -lp, 0.0)
    return np.array([integrate.simpson(w * f, x=t) for f in (1.0, x, 1 / x, t, ent)])


def _gig_range(gamma, psi, chi):
    """An interval holding all but ~e^-40 of GIG(gamma, psi, chi): below chi / 100 the factor
    exp(-chi / 2x) kills the density, above (100 + 10 |gamma|) / psi the factor exp(-psi x / 2)."""
    mode = ((gamma - 1) + math.sqrt((gamma - 1) ** 2 + psi * chi)) / psi
    return min(chi / 100, mode / 10), max((100 + 10 * abs(gamma)) / psi, 10 * mode)


# ------------------------------------------------------------------------------- GIG
@SETTINGS
@given(gamma=st.floats(-3, 3, allow_subnormal=False), psi=logu(-3, 3), chi=logu(-6, 3))
def test_gig_moments_finite_and_match_quadrature(gamma, psi, chi):
    d = GIG(gamma, psi, chi)
    vals = [float(d.mean()), float(d.mean_inv()), float(d.mean_log()), float(d.entropy())]
    assert all(np.isfinite(vals)), vals
    lo, hi = _gig_range(gamma, psi, chi)
    m0, m1, minv, mlog, ent = _quad_moments(d.logpdf, lo, hi)
    assert abs(m0 - 1) < 1e-6
    np.testing.assert_allclose([m1, minv, mlog, ent], vals, rtol=1e-5, atol=1e-6 * (1 + abs(mlog)))


@SETTINGS
@given(gamma=st.floats(-3, 3, allow_subnormal=False), psi=logu(-3, 3), chi=logu(-8, 4), seed=st.integers(0, 2 ** 32 - 1))
def test_gig_draws_positive_finite(gamma, psi, chi, seed):
    x = GIG(gamma, psi, chi).sample(np.random.default_rng(seed), size=50)
    assert x.shape == (50,) and np.all(np.isfinite(x)) and np.all(x > 0)


@SETTINGS
@given(log_chi=st.floats(-300, 300), seed=st.integers(0, 2 ** 32 - 1))
def test_gig_half_sampler_survives_extreme_chi(log_chi, seed):
    chi = np.full(50, 10.0 ** log_chi)
    with np.errstate(all="raise"):
        x = sample_gig_half(chi, np.random.default_rng(seed))
    assert np.all(np.isfinite(x)) and np.all(x > 0)
    d = GIG(0.5, 1.0, float(chi[0]))
    assert all(np.isfinite([float(d.mean()), float(d.mean_inv()), float(d.mean_log()), float(d.entropy())]))


def test_gig_subnormal_order_equals_order_zero():
    a, b = GIG(5e-324, 1.0, 1.0), GIG(0.0, 1.0, 1.0)
    np.testing.assert_allclose([float(a.mean()), float(a.entropy())], [float(b.mean()), float(b.entropy())])


# ------------------------------------------------------------------------------- inverse Gaussian, IG
@SETTINGS
@given(mu=logu(-4, 4), lam=logu(-3, 3))
def test_inverse_gaussian_moments_match_quadrature(mu, lam):
    d = InverseGaussian(mu, lam)
    vals = [float(d.mean()), float(d.mean_inv()), float(d.mean_log()), float(d.entropy())]
    assert all(np.isfinite(vals))
    lo, hi = _gig_range(-0.5, lam / mu ** 2, lam)  # InverseGaussian(mu, lam) = GIG(-1/2, lam/mu^2, lam)
    m0, m1, minv, mlog, ent = _quad_moments(d.logpdf, lo, hi)
    assert abs(m0 - 1) < 1e-6
    np.testing.assert_allclose([m1, minv, mlog, ent], vals, rtol=1e-5, atol=1e-6 * (1 + abs(mlog)))


@SETTINGS
@given(mu=logu(-8, 17), lam=logu(-3, 3), seed=st.integers(0, 2 ** 32 - 1))
def test_inverse_gaussian_draws_positive_finite(mu, lam, seed):
    x = InverseGaussian(mu, lam).sample(np.random.default_rng(seed), size=200)
    assert np.all(np.isfinite(x)) and np.all(x > 0)


@SETTINGS
@given(a=logu(-2, 3), b=logu(-3, 3))
def test_inverse_gamma_moments_and_entropy(a, b):
    from scipy import stats

    d = InverseGamma(a, b)
    mean = float(d.mean())
    assert (np.isinf(mean) and a <= 1) or (np.isfinite(mean) and a > 1)
    vals = [float(d.mean_inv()), float(d.mean_log()), float(d.entropy())]
    assert all(np.isfinite(vals))
    np.testing.assert_allclose(vals[0], a / b, rtol=1e-12)
    ref = stats.invgamma(a, scale=b)
    np.testing.assert_allclose(vals[2], ref.entropy(), rtol=1e-8, atol=1e-8)
    x = d.sample(np.random.default_rng(0), size=100)
    assert np.all(np.isfinite(x)) and np.all(x > 0)


# ------------------------------------------------------------------------------- Gaussian, IW, Bernoulli
@SETTINGS
@given(d=st.integers(1, 6), scale=logu(-4, 4), cond=logu(0, 6), seed=st.integers(0, 2 ** 32 - 1))
def test_gaussian_entropy_and_draws(d, scale, cond, seed):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    P = scale * (Q * np.geomspace(1, cond, d)) @ Q.T
    g = Gaussian(P, rng.normal(size=d))
    ent = float(g.entropy())
    ref = 0.5 * d * (1 + math.log(2 * math.pi)) - 0.5 * np.linalg.slogdet(P)[1]
    np.testing.assert_allclose(ent, ref, rtol=1e-8, atol=1e-8)
    x = g.sample(rng, size=50)
    assert x.shape == (50, d) and np.all(np.isfinite(x))


@SETTINGS
@given(d=st.integers(1, 4), extra=st.floats(1.0, 30), scale=logu(-3, 3), seed=st.integers(0, 2 ** 32 - 1))
def test_inverse_wishart_draws_spd_and_moments_finite(d, extra, scale, seed):
    """df >= d (the imputation posterior has df = nu + n). Closer to d - 1 the law is so heavy
    tailed that draws overflow or lose definiteness in double precision."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    Psi = scale * (A @ A.T + d * np.eye(d))
    iw = InverseWishart(Psi, d - 1 + extra)
    S = iw.sample(rng, size=20)
    assert np.all(np.isfinite(S))
    assert np.all(np.linalg.eigvalsh(S) > 0)
    assert np.all(np.isfinite(iw.mean_inv())) and np.isfinite(iw.mean_logdet()) and np.isfinite(iw.entropy())


@SETTINGS
@given(logit=st.floats(-800, 800), seed=st.integers(0, 2 ** 32 - 1))
def test_bernoulli_from_extreme_logits(logit, seed):
    b = Bernoulli.from_logit(logit)
    p = float(b.mean())
    assert 0.0 <= p <= 1.0 and np.isfinite(float(b.entropy())) and float(b.entropy()) >= 0
    x = b.sample(np.random.default_rng(seed), size=100)
    assert set(np.unique(x)) <= {0, 1}


# ------------------------------------------------------------------------------- design layer
NAMES = ["y", "a", "b", "c", "g", "s", "flag", "my var", "x1"]


@st.composite
def frames(draw):
    n = draw(st.sampled_from([0, 1, 2, 3, 5, 10, 25, 25, 25]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    cols = {}
    kind_y = draw(st.sampled_from(["01", "01", "01", "pm1", "labels", "labels", "bool", "one", "three", "nan",
                                   "float"]))
    ys = {
        "01": rng.integers(0, 2, n), "pm1": rng.choice([-1, 1], n), "labels": rng.choice(["no", "yes"], n),
        "bool": rng.random(n) < 0.5, "one": np.zeros(n, int), "three": rng.integers(0, 3, n),
        "nan": np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 2, n)), "float": rng.normal(size=n),
    }
    cols["y"] = ys[kind_y]
    for name in NAMES[1:]:
        kind = draw(st.sampled_from(["normal", "normal", "normal", "nan", "inf", "int", "bool", "str", "cat",
                                     "const", "allnan", "absent"]))
        if kind == "absent":
            continue
        v = {
            "normal": lambda: rng.normal(size=n) * 10.0 ** rng.integers(-8, 9),
            "nan": lambda: np.where(rng.random(n) < 0.3, np.nan, rng.normal(size=n)),
            "inf": lambda: np.where(rng.random(n) < 0.1, np.inf, rng.normal(size=n)),
            "int": lambda: rng.integers(-3, 4, n),
            "bool": lambda: rng.random(n) < 0.5,
            "str": lambda: rng.choice(["u", "v", "w"], n).astype(object),
            "cat": lambda: pd.Categorical(rng.choice(["p", "q"], n), categories=["p", "q", "r"]),
            "const": lambda: np.full(n, 2.5),
            "allnan": lambda: np.full(n, np.nan),
        }[kind]()
        cols[name] = v
    return pd.DataFrame(cols)


TERMS = ["a", "b", "c", "s", "flag", "x1", "g", "np.log(a)", "C(s)", "C(g)", "a:b", "a*c", "I(a**2)",
         "(1 | g)", "(1 | s)", "(a | g)", "(1 | zz)", "`my var`", "nope", "np.exp(b)", "center(a)", ".",
         "-1", "0", "+", "a +", "(a", "**", "1", "y"]


@st.composite
def formulas(draw):
    lhs = draw(st.sampled_from(["y"] * 6 + ["a", "nope", "", "`y`"]))
    terms = draw(st.lists(st.sampled_from(TERMS), min_size=0, max_size=4))
    sep = draw(st.sampled_from(["~"] * 6 + ["", "~~"]))
    return f"{lhs} {sep} " + " + ".join(terms)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(df=frames(), formula=formulas(), standardize=st.booleans(),
       missing=st.sampled_from(["drop", "raise", "impute"]))
@pytest.mark.slow
def test_random_formula_on_random_frame_builds_or_raises_vbsvm_error(df, formula, standardize, missing):
    before = fingerprint(df)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = build_design(formula, df, standardize=standardize, missing=missing)
    except VbsvmError as exc:
        event(f"raised {type(exc).__name__}")
    else:
        event("built")
        assert d.X.ndim == 2 and d.X.shape[0] == d.y.shape[0] == len(d.row_labels) > 0
        assert set(np.unique(d.y)) <= {-1.0, 1.0}
        assert d.n + d.n_dropped <= len(df)
        assert len(d.column_names) == d.X.shape[1]
        if missing == "impute":
            assert np.array_equal(np.isnan(d.X), d.missing_mask)
        assert np.all(np.isfinite(d.X[~np.isnan(d.X)]))
        if missing != "impute":
            assert not np.isnan(d.X).any()
        for gf in d.groups:
            assert gf.codes.min() >= 0 and gf.codes.max() < gf.n_levels
    assert fingerprint(df) == before, "build_design modified the frame"
