"""The samplers of :mod:`vbsvm.distributions` over their whole parameter range.

Every sampler is run on a deterministic grid of parameters (shapes ``1e-3`` to ``1e3``, scales
``1e-300`` to ``1e300``, ratios beyond double range) and checked for (i) finite positive draws
inside ``DRAW_RANGE`` and (ii) the right law on the log scale: a Kolmogorov-Smirnov test of the
logarithms of the draws against a reference CDF computed independently of the sampler (scipy,
closed forms, or numerical integration of the log density). Each check is also run on a
deliberately broken variant (the plain floating point formula the samplers replaced, or a wrong
tail law), which must fail it. The heavier grids are marked slow.
"""

import warnings

import numpy as np
import pytest
import scipy.special as sc
import scipy.stats as st

from vbsvm.distributions import (DRAW_RANGE, GIG, InverseGamma, InverseGaussian, InverseWishart,
                                 sample_gamma, sample_inverse_gamma_truncated, sample_log_gig,
                                 sample_log_standard_gamma, sample_standard_gamma, sample_truncated_normal)

KS_P = 1e-3
N = 2000
SHAPES = [1e-3, 1e-2, 0.1, 0.5, 1.0, 3.0, 30.0, 1e3]
SCALES = [1e-300, 1e-100, 1.0, 1e100, 1e300]


def rng(seed=0):
    return np.random.default_rng(seed)


def ks_p(log_draws, cdf):
    """KS p-value of the log draws against the CDF of the log variable (draws must be finite)."""
    log_draws = np.ravel(log_draws)
    assert np.all(np.isfinite(log_draws)), "non-finite log draws"
    return st.kstest(log_draws, cdf).pvalue


def assert_in_range(x):
    x = np.asarray(x)
    assert np.all(np.isfinite(x)) and np.all(x >= DRAW_RANGE[0]) and np.all(x <= DRAW_RANGE[1])


def log_gamma_cdf(a):
    """CDF of log G, G ~ Gamma(a, 1), valid on the whole real line (series below e^-700)."""
    def cdf(t):
        t = np.asarray(t, dtype=float)
        with np.errstate(over="ignore", under="ignore"):
            tiny = t < -700.0
            return np.where(tiny, np.exp(a * np.minimum(t, 0.0) - sc.gammaln(a + 1.0)),
                            sc.gammainc(a, np.exp(np.minimum(t, 700.0))))
    return cdf


def log_inverse_gamma_cdf(a, b):
    """CDF of log X, X = b / G."""
    f = log_gamma_cdf(a)
    return lambda t: 1.0 - f(np.log(b) - np.asarray(t))


def gridded_cdf(log_density, lo, hi, n=40001):
    """CDF of a density on [lo, hi] given by its log (vectorized), by the trapezoid rule."""
    t = np.linspace(lo, hi, n)
    ld = log_density(t)
    w = np.exp(ld - np.max(ld))
    c = np.concatenate([[0.0], np.cumsum(0.5 * (w[1:] + w[:-1]) * np.diff(t))])
    c /= c[-1]
    return lambda x: np.interp(x, t, c)


def window(log_density, center, lo_limit=-np.inf, hi_limit=np.inf, drop=45.0):
    """An interval around ``center`` outside which ``log_density`` is ``drop`` below its value there
    (found by doubling), within the limits."""
    top = log_density(np.array([center]))[0]
    out = []
    for sign, limit in ((-1.0, lo_limit), (1.0, hi_limit)):
        w = 1e-300
        while True:
            x = center + sign * w
            if sign * (x - limit) >= 0 or log_density(np.array([x]))[0] < top - drop or w > 1e4:
                out.append(min(max(x, lo_limit), hi_limit))
                break
            w *= 16.0
    return out


# ---------------------------------------------------------------------------
# gamma and inverse gamma
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("a", SHAPES)
def test_log_gamma_draws_finite_and_correct(a):
    lg = sample_log_standard_gamma(np.full(N, a), rng(1))
    assert ks_p(lg, log_gamma_cdf(a)) > KS_P


@pytest.mark.parametrize("a", SHAPES)
@pytest.mark.parametrize("b", SCALES)
def test_inverse_gamma_draws_over_the_grid(a, b):
    law = InverseGamma(np.full(N, a), b)
    x = law.sample(rng(2))
    assert_in_range(x)
    lx = law.sample_log(rng(2))
    assert ks_p(lx, log_inverse_gamma_cdf(a, b)) > KS_P
    # the draws are the exact ones, clipped to DRAW_RANGE
    expect = np.exp(np.clip(lx, *np.log(DRAW_RANGE)))
    np.testing.assert_allclose(x, expect, rtol=1e-12)


@pytest.mark.parametrize("a", SHAPES)
@pytest.mark.parametrize("scale", [1e-300, 1.0, 1e300])
def test_gamma_draws_over_the_grid(a, scale):
    x = sample_gamma(a, scale, rng(3), size=N)
    assert_in_range(x)
    g = sample_standard_gamma(np.full(N, a), rng(3))
    assert_in_range(g)


def test_inverse_gamma_keeps_numpys_draws_where_they_are_exact():
    a = np.array([0.5, 1.0, 2.5, 40.0])
    b = np.array([0.01, 1.0, 7.0, 1e5])
    x = InverseGamma(a, b).sample(rng(4))
    assert np.array_equal(x, b / rng(4).standard_gamma(a))
    x = InverseGamma(a, b).sample(rng(5), size=50)
    assert np.array_equal(x, b / rng(5).standard_gamma(np.broadcast_to(a, (50, 4)), size=(50, 4)))


def test_inverse_gamma_small_shape_never_inf_under_raise():
    # IG(0.01, 0.01): numpy's gamma draw underflows to 0 about once in 1500
    with np.errstate(all="raise"):
        x = InverseGamma(np.full(20000, 0.01), 0.01).sample(rng(6))
    assert_in_range(x)
    assert np.mean(x == DRAW_RANGE[1]) > 0  # some true draws lie beyond 1e300


def naive_log_inverse_gamma(a, b, r):
    with np.errstate(all="ignore"):
        return np.log(b / r.standard_gamma(np.full(N, a)))


def wrong_tail_log_gamma(a, r):
    """The tail redraw without its 1/a (a wrong conditional law below the smallest double)."""
    g = r.standard_gamma(np.full(N, a))
    with np.errstate(divide="ignore"):
        lg = np.log(g)
    tail = g < np.finfo(float).tiny
    lg[tail] = np.log(np.finfo(float).tiny) + np.log(1.0 - r.random(tail.sum()))
    return lg


def test_gamma_checks_have_power():
    # the plain formula: inf draws for small shapes
    with pytest.raises(AssertionError):
        ks_p(naive_log_inverse_gamma(1e-3, 1.0, rng(7)), log_inverse_gamma_cdf(1e-3, 1.0))
    # a wrong law below the smallest double: finite but rejected by the KS test
    assert ks_p(wrong_tail_log_gamma(1e-3, rng(8)), log_gamma_cdf(1e-3)) < KS_P


# ---------------------------------------------------------------------------
# truncated inverse gamma
# ---------------------------------------------------------------------------
def truncated_log_ig_window(a, b, lo, hi):
    """The law of u = log(b / X) for X ~ IG(a, b) restricted to [lo, hi]: its log density
    a u - e^u written relative to a point u0 of the interval (a (u - u0) - e^u0 expm1(u - u0),
    which keeps its digits), and the interval around u0 that holds all but e^-45 of it."""
    u_lo, u_hi = np.log(b) - np.log(hi), np.log(b) - np.log(lo)
    u0 = float(np.clip(np.log(a), u_lo, u_hi))

    def ld(d):
        with np.errstate(over="ignore", invalid="ignore"):
            v = a * d - np.exp(u0) * np.expm1(d)
        return np.where(np.isnan(v), -np.inf, v)

    lo_w, hi_w = window(ld, 0.0, u_lo - u0, u_hi - u0)
    return u0, ld, lo_w, hi_w


def truncated_log_ig_cdf(a, b, lo, hi):
    """CDF of log X for X ~ IG(a, b) restricted to [lo, hi], by integrating the log density of u."""
    u0, ld, lo_w, hi_w = truncated_log_ig_window(a, b, lo, hi)
    f = gridded_cdf(ld, lo_w, hi_w)
    return lambda t: 1.0 - f(np.log(b) - np.asarray(t) - u0)


TRUNC_CASES = [(a, b, bounds) for a in [1e-3, 0.51, 3.0, 40.0, 1e3] for b in [1e-300, 1e-5, 1.0, 1e5, 1e300]
               for bounds in [(1e-10, 1e10), "around"]]


def bounds_of(b, bounds):
    return (0.5 * b, 2.0 * b) if bounds == "around" else bounds


@pytest.mark.parametrize("a,b,bounds", TRUNC_CASES[::3])
def test_truncated_inverse_gamma(a, b, bounds):
    check_truncated_inverse_gamma(a, b, bounds)


@pytest.mark.slow
@pytest.mark.parametrize("a,b,bounds", [c for i, c in enumerate(TRUNC_CASES) if i % 3])
def test_truncated_inverse_gamma_full_grid(a, b, bounds):
    check_truncated_inverse_gamma(a, b, bounds)


def check_truncated_inverse_gamma(a, b, bounds):
    lo, hi = bounds_of(b, bounds)
    with np.errstate(all="raise"):
        x = sample_inverse_gamma_truncated(np.full(N, a), np.full(N, b), (lo, hi), rng(9))
    assert_in_range(x)
    assert np.all((x >= lo) & (x <= hi))
    if not (lo >= DRAW_RANGE[0] and hi <= DRAW_RANGE[1]):  # the law reaches beyond the representable range
        return
    u0, _, lo_w, hi_w = truncated_log_ig_window(a, b, lo, hi)
    t_lo, t_hi = np.log(b) - (u0 + hi_w), np.log(b) - (u0 + lo_w)
    if t_hi - t_lo < 1e-9 * max(1.0, abs(t_lo)):  # narrower than double precision resolves in log x
        assert np.all((np.log(x) >= t_lo - 1e-12 * abs(t_lo)) & (np.log(x) <= t_hi + 1e-12 * abs(t_hi)))
    else:
        assert ks_p(np.log(x), truncated_log_ig_cdf(a, b, lo, hi)) > KS_P


def test_truncated_inverse_gamma_check_has_power():
    # the former inversion by gammaincc alone: for IG(40, 1) on [0.5, 2] both tail values round
    # to 1 and every draw came out at the upper bound
    a, b, lo, hi = 40.0, 1.0, 0.5, 2.0
    u = sc.gammaincc(a, b / lo) + (sc.gammaincc(a, b / hi) - sc.gammaincc(a, b / lo)) * rng(10).random(N)
    with np.errstate(divide="ignore"):
        x = np.clip(b / sc.gammainccinv(a, u), lo, hi)
    assert ks_p(np.log(x), truncated_log_ig_cdf(a, b, lo, hi)) < KS_P


# ---------------------------------------------------------------------------
# inverse Gaussian and GIG(+-1/2)
# ---------------------------------------------------------------------------
def log_ig_cdf(mu, lam):
    """CDF of log X, X ~ InverseGaussian(mu, lam), from the closed form in log-scaled arguments."""
    lw, lmu = np.log(lam) - np.log(mu), np.log(mu)

    def cdf(t):
        lr = np.asarray(t, dtype=float) - lmu  # log(x / mu)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            p, q = np.exp(0.5 * (lw + lr)), np.exp(0.5 * (lw - lr))  # sqrt(w r), sqrt(w / r)
            first = sc.ndtr(p - q)
            second = np.exp(2.0 * np.exp(lw) + sc.log_ndtr(-(p + q))) if lw < 690.0 else 0.0
        return np.clip(np.nan_to_num(first + second, nan=0.0), 0.0, 1.0)
    return cdf


def check_log_ig(lx, mu, lam):
    """KS test of log IG(mu, lam) draws, or, where the law's relative spread sqrt(mu / lam) is
    below double precision, that the draws are mu (to rounding)."""
    if np.log(lam) - np.log(mu) > 80.0:
        np.testing.assert_allclose(lx, np.log(mu), rtol=0, atol=1e-13 * max(1.0, abs(np.log(mu))))
    else:
        assert ks_p(lx, log_ig_cdf(mu, lam)) > KS_P


IG_GRID = [(mu, lam) for mu in [1e-300, 1.0, 1e300] for lam in [1e-300, 1e-5, 1.0, 1e5, 1e300]]


@pytest.mark.parametrize("mu,lam", IG_GRID)
def test_inverse_gaussian_over_the_grid(mu, lam):
    law = InverseGaussian(np.full(N, mu), lam)
    with np.errstate(all="raise"):
        x = law.sample(rng(11))
    assert_in_range(x)
    lx = law.sample_log(rng(11))
    check_log_ig(lx, mu, lam)
    np.testing.assert_allclose(x, np.exp(np.clip(lx, *np.log(DRAW_RANGE))), rtol=1e-9)


@pytest.mark.parametrize("psi,chi", [(1e-300, 1e300), (1e300, 1e-300), (1e-300, 1e-300), (1e300, 1e300), (1.0, 1e-300)])
def test_gig_half_orders_over_the_grid(psi, chi):
    for gamma in (0.5, -0.5):
        law = GIG(np.full(N, gamma), psi, chi)
        x = law.sample(rng(12))
        assert_in_range(x)
        lx = law.sample_log(rng(12))
        if gamma == -0.5:  # IG(mean sqrt(chi/psi), shape chi)
            check_log_ig(lx, np.sqrt(chi) / np.sqrt(psi), chi)
        else:  # 1/x ~ IG(sqrt(psi/chi), psi)
            check_log_ig(-lx, np.sqrt(psi) / np.sqrt(chi), psi)


def test_inverse_gaussian_check_has_power():
    # numpy's wald returns 0 (log -inf) once mean / shape exceeds about 1e16
    with np.errstate(divide="ignore"):
        lx = np.log(rng(13).wald(1e20, 1.0, size=N))
    with pytest.raises(AssertionError):
        ks_p(lx, log_ig_cdf(1e20, 1.0))
    # the right formula with the wrong acceptance (always the smaller root) is rejected
    law = InverseGaussian(np.full(N, 1.0), 1.0)
    lx = law.sample_log(rng(14))
    assert ks_p(np.minimum(lx, -lx), log_ig_cdf(1.0, 1.0)) < KS_P


# ---------------------------------------------------------------------------
# general GIG
# ---------------------------------------------------------------------------
def log_gig_std_cdf(p, b):
    """CDF of log y for the standardized GIG(p, b) by integrating its log density h(t) = p t - b cosh t:
    directly for b <= 1, and relative to the mode m = asinh(p / b) for b > 1, as
    h(m + s) - h(m) = p (s - sinh s) - 2 c sinh^2(s / 2) with c = sqrt(b^2 + p^2) (the law is then
    within a few 1/sqrt(c) of the mode, where this form keeps its digits)."""
    m = np.arcsinh(p / b)
    if b <= 1.0:
        def ld(t):
            with np.errstate(over="ignore"):
                return p * t - np.exp(np.log(b) + np.abs(t) - np.log(2.0)) * (1.0 + np.exp(-2.0 * np.abs(t)))
        lo, hi = window(ld, m)
        return gridded_cdf(ld, lo, hi)
    c = np.hypot(b, p)

    def ld_rel(s):
        with np.errstate(over="ignore", invalid="ignore"):
            v = p * (s - np.sinh(s)) - 2.0 * c * np.sinh(0.5 * s) ** 2
        return np.where(np.isnan(v), -np.inf, v)

    lo, hi = window(ld_rel, 0.0)
    f = gridded_cdf(ld_rel, lo, hi)
    return lambda t: f(np.asarray(t) - m)


GIG_GRID = [(p, b) for p in [-50.0, -1.3, 0.0, 1e-3, 0.7, 2.0, 50.0] for b in [1e-300, 1e-20, 1e-3, 1.0, 1e3, 1e20, 1e300]]


@pytest.mark.parametrize("p,b", GIG_GRID[::4])
def test_general_gig_log_draws(p, b):
    ly = sample_log_gig(np.full(N, p), np.full(N, np.log(b)), rng(15))
    assert ks_p(ly, log_gig_std_cdf(p, b)) > KS_P


@pytest.mark.slow
@pytest.mark.parametrize("p,b", [c for i, c in enumerate(GIG_GRID) if i % 4])
def test_general_gig_log_draws_full_grid(p, b):
    test_general_gig_log_draws(p, b)


def test_general_gig_reference_matches_scipy():
    for p, b in [(-1.3, 0.5), (0.0, 2.0), (2.0, 1e-3), (0.7, 30.0)]:
        t = np.linspace(-3, 3, 7) + np.arcsinh(p / b)
        np.testing.assert_allclose(log_gig_std_cdf(p, b)(t), st.geninvgauss(p, b).cdf(np.exp(t)), atol=1e-5)


def test_gig_class_general_draws_in_range_and_scaled():
    law = GIG(np.full(N, 1.3), 1e-300, 1e300)  # scale sqrt(chi / psi) = 1e300, b = 1
    x = law.sample(rng(16))
    assert_in_range(x)
    lx = law.sample_log(rng(16))
    assert ks_p(lx - np.log(1e300), log_gig_std_cdf(1.3, 1.0)) > KS_P


def test_general_gig_check_has_power():
    ly = sample_log_gig(np.full(N, 0.7), np.full(N, np.log(1e-3)), rng(17))
    assert ks_p(ly + 0.05, log_gig_std_cdf(0.7, 1e-3)) > KS_P  # a shift small against the spread passes
    assert ks_p(ly, log_gig_std_cdf(0.9, 1e-3)) < KS_P  # another index fails


# ---------------------------------------------------------------------------
# truncated normal and inverse Wishart
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("d", [0.0, 5.0, 50.0, 1e3, 1e5])
def test_truncated_normal_tails(d):
    low, high = d, d + 1.0
    x = sample_truncated_normal(np.zeros(N), 1.0, low, high, rng(18))
    assert np.all((x >= low) & (x <= high))
    assert st.kstest(x, st.truncnorm(low, high).cdf).pvalue > KS_P


@pytest.mark.parametrize("sd", [1e-300, 1.0, 1e300])
@pytest.mark.parametrize("d", [0.0, 1e8, 1e160, 1e300])
def test_truncated_normal_finite_over_the_grid(sd, d):
    mean = np.full(N, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low = np.minimum(1.0 + d * sd, 1e308)
        x = sample_truncated_normal(mean, sd, low, np.inf, rng(19))
        y = sample_truncated_normal(mean, sd, -np.inf, 2.0 - low, rng(19))
    assert np.all(np.isfinite(x)) and np.all(x >= low)
    assert np.all(np.isfinite(y)) and np.all(y <= 2.0 - low)


def test_truncated_normal_far_tail_law_and_power():
    # N(-1e9, 1) restricted to [0, inf): x * 1e9 is Exp(1) to within 1e-18; inversion in standard
    # units (the sampler's path within 1e6 sd) loses x to the rounding of -1e9 + z
    d = 1e9
    x = sample_truncated_normal(np.full(N, -d), 1.0, 0.0, np.inf, rng(20))
    assert st.kstest(x * d, st.expon.cdf).pvalue > KS_P
    a = np.full(N, -np.inf)
    log_a = sc.log_ndtr(a)
    log_mass = sc.log_ndtr(np.full(N, -d))
    with np.errstate(divide="ignore"):
        z = -np.clip(sc.ndtri_exp(np.logaddexp(log_a, np.log(rng(20).random(N)) + log_mass)), a, -d)
    broken = -d + z
    assert st.kstest(broken * d, st.expon.cdf).pvalue < KS_P


@pytest.mark.parametrize("excess", [1e-3, 0.1, 1.0, 10.0, 1e3])
@pytest.mark.parametrize("s", [1e-300, 1.0, 1e300])
def test_inverse_wishart_over_the_grid(excess, s):
    d = 3
    base = np.array([[1.0, 0.3, 0.1], [0.3, 2.0, -0.4], [0.1, -0.4, 1.5]])
    law = InverseWishart(s * base, d - 1 + excess)
    S = law.sample(rng(21), size=500)
    assert np.all(np.isfinite(S)) and np.all(S == np.swapaxes(S, -1, -2))
    assert np.all(np.diagonal(S, axis1=-2, axis2=-1) > 0)
    if excess >= 1.0:  # below, the draws' condition numbers exceed what double precision resolves
        np.linalg.cholesky(S / s)
    if excess >= 0.1 and (s == 1.0 or excess >= 10.0):
        # S_11 ~ IG((nu - d + 1) / 2, Psi_11 / 2)
        assert ks_p(np.log(S[:, 0, 0]), log_inverse_gamma_cdf(excess / 2.0, s * base[0, 0] / 2.0)) > KS_P
