"""Laplace-zero variable selection (Luts & Ormerod 2014, Section 3.2, Algorithm 3, Appendix B).

VB: a plain transcription of Algorithm 3 (kept below as the oracle) has the same fixed point; the
full ELBO equals the paper's simplified bound there, is stationary in every factor and never
decreases. Gibbs: the gamma conditional equals a difference of the augmented joint density, the
sampler with rho = 1 and fixed b reproduces the ridge-type model of the foundation, and the
inclusion probability of a one-predictor model matches quadrature. Then ranking of a sparse truth,
the user API (prior validation, inclusion table, plot, predictions, ArviZ, save/load).
"""

import math
import types
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats
from scipy.special import expit, gammaln, kve, logit

import vbsvm
from support.exact import laplace_zero_marginal_prior
from vbsvm.formula.design import build_design
from vbsvm.distributions import InverseGamma, InverseGaussian
from vbsvm.exceptions import InputError, InputTypeError
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.linear import LinearSVMModel
from vbsvm.models.selection import LaplaceZeroModel
from vbsvm.models.priors import LaplaceZero
from vbsvm.results.selection import SelectionFit


# ----------------------------------------------------------------------------- oracle
def algorithm3(X, Z, y, rho, sigma2_beta=1e8, A=0.01, B=0.01, iters=20000, tol=1e-14, init=None,
               U=None):
    """Algorithm 3 transcribed line by line, dense, no acceleration, no restriction of eta.

    ``X``: always-included columns (prior N(0, sigma2_beta)); ``Z``: selectable columns.
    ``U`` (extension, not in the paper): random-intercept indicator columns, always included,
    prior N(0, sigma2_g) with sigma2_g ~ IG(A, B); they enter line 6 like X.
    ``init = (mu_q(1/a), mu_q(1/sigma_u^2), mu_q(b), mu_q(gamma)[, mu_q(1/sigma_g^2)])``.
    Returns a dict of the parameters after the last iteration and the trace of the paper's bound.
    """
    n, p0 = X.shape
    m = Z.shape[1]
    mg = 0 if U is None else U.shape[1]
    Xb = X if U is None else np.hstack([X, U])  # the always-included block
    p = Xb.shape[1]
    C = np.hstack([Xb, Z])
    if init is None:
        mu_inv_a, mu_inv_s2, mu_b, mu_g, mu_inv_sg = np.ones(n), 1.0, np.ones(m), np.full(m, expit(10.0)), 1.0
    else:
        mu_inv_a, mu_b, mu_g = (np.array(v, dtype=float) for v in (init[0], init[2], init[3]))
        mu_inv_s2 = float(np.ravel(init[1])[0])
        mu_inv_sg = float(np.ravel(init[4])[0]) if len(init) > 4 else 1.0
    trace = []
    for _ in range(iters):
        # line 2
        mu_gt = np.concatenate([np.ones(p), mu_g])
        Omega_gt = np.diag(mu_gt * (1 - mu_gt)) + np.outer(mu_gt, mu_gt)
        prior = np.concatenate([np.full(p0, 1 / sigma2_beta), np.full(mg, mu_inv_sg), mu_inv_s2 * mu_b])
        Sigma = np.linalg.inv((C.T @ (mu_inv_a[:, None] * C)) * Omega_gt + np.diag(prior))
        # line 3
        mu = Sigma @ (mu_gt * (C.T @ ((1 + mu_inv_a) * y)))
        Omega = Sigma + np.outer(mu, mu)
        # lines 4-8
        for k in range(m):
            j = p + k
            mu_b[k] = (mu_inv_s2 * Omega[j, j]) ** -0.5
            Zk = Z[:, k]
            others = [i for i in range(m) if i != k]
            Zmk = Z[:, others]
            inner = y * mu[j] - Xb @ Omega[:p, j] - Zmk @ (mu_g[others] * Omega[[p + i for i in others], j])
            eta = (logit(rho) - 0.5 * (Zk * mu_inv_a) @ Zk * Omega[j, j] + Zk @ y * mu[j]
                   + (Zk * mu_inv_a) @ inner)
            mu_g[k] = expit(eta)
        # line 9
        mu_gt = np.concatenate([np.ones(p), mu_g])
        Omega_gt = np.diag(mu_gt * (1 - mu_gt)) + np.outer(mu_gt, mu_gt)
        # line 10
        chi = 1 - 2 * y * (C @ (mu_gt * mu)) + np.einsum("ij,jk,ik->i", C, Omega_gt * Omega, C)
        mu_inv_a = chi ** -0.5
        # line 11
        Bq = B + 0.5 * np.sum(mu_b * (np.diag(Sigma)[p:] + mu[p:] ** 2))
        mu_inv_s2 = (A + m / 2) / Bq
        if mg:
            Bg = B + 0.5 * (mu[p0:p] @ mu[p0:p] + np.trace(Sigma[p0:p, p0:p]))
            mu_inv_sg = (A + mg / 2) / Bg
        # the paper's simplified bound (Section 3.2; 'log Gamma(A + m/2)' read as A_u + m/2)
        g = mu_g
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_g = np.where(g > 0, g * np.log(g / rho), 0) + np.where(g < 1, (1 - g) * np.log((1 - g) / (1 - rho)), 0)
        bound = ((n - m) * np.log(2) - n + (p0 + m) / 2 - (n - m) / 2 * np.log(2 * np.pi)
                 + y @ C @ (mu_gt * mu) + 0.25 * np.sum(np.log(chi)) + np.sum(np.log(kve(0.5, np.sqrt(chi))) - np.sqrt(chi))
                 + 0.5 * np.linalg.slogdet(Sigma)[1] - p0 / 2 * np.log(sigma2_beta)
                 - (mu[:p0] @ mu[:p0] + np.trace(Sigma[:p0, :p0])) / (2 * sigma2_beta) - 0.5 * np.sum(1 / mu_b)
                 + A * np.log(B) - gammaln(A) - (A + m / 2) * np.log(Bq) + gammaln(A + m / 2) - np.sum(kl_g))
        trace.append(bound)
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) < tol * abs(trace[-1]):
            break
    return {"mu": mu, "Sigma": Sigma, "mu_b": mu_b, "mu_g": mu_g, "Bq": Bq, "chi": chi,
            "mu_inv_sg": mu_inv_sg, "trace": np.array(trace)}


def assert_rel(actual, desired, rel=1e-6):
    actual, desired = np.asarray(actual, float), np.asarray(desired, float)
    err = np.linalg.norm(actual - desired) / np.linalg.norm(desired)
    assert err <= rel, f"relative error {err:.2e} > {rel:g}"


def make_model(df, formula="y ~ .", rho=0.5, keep=(), **kw):
    d = build_design(formula, df)
    from vbsvm.models.selection import selectable_columns

    select = selectable_columns(d, keep)
    groups = [(g.codes, g.n_levels, g.name) for g in d.groups]
    return d, LaplaceZeroModel(d.X, d.y, groups, select, rho, **kw)


@pytest.fixture(scope="module")
def small():
    return vbsvm.datasets.simulate_sparse(60, 6, 2, seed=0, effect=0.6)


@pytest.fixture(scope="module")
def small_fit(small):
    d, model = make_model(small, rho=0.5)
    res = coordinate_ascent(model, tol=1e-14, max_iter=20000)
    return d, model, res


# ----------------------------------------------------------------------------- VB
def test_fixed_point_matches_algorithm3(small_fit):
    """One iteration of the transcribed Algorithm 3, started from our converged q, returns it."""
    d, model, res = small_fit
    q = res.q
    assert np.sum((q["gamma"] > 0.05) & (q["gamma"] < 0.95)) >= 3  # a fixed point with non-trivial q(gamma)
    X, Z = d.X[:, ~d.penalized], d.X[:, d.penalized]
    init = (q["chi"] ** -0.5, q["variances"].mean_inv(), q["mu_b"], q["gamma"])
    o = algorithm3(X, Z, d.y, 0.5, init=init, iters=1)
    post = q["theta"]
    order = np.r_[np.flatnonzero(~d.penalized), np.flatnonzero(d.penalized)]
    assert_rel(post.mean[order], o["mu"])
    assert_rel(post.cov_dense()[np.ix_(order, order)], o["Sigma"])
    assert_rel(q["mu_b"], o["mu_b"])
    assert_rel(q["gamma"], o["mu_g"])
    assert_rel(q["chi"], o["chi"])
    assert_rel(q["variances"].b, [o["Bq"]])
    # at the fixed point our full ELBO equals the paper's simplified bound
    assert res.elbo[-1] == pytest.approx(o["trace"][-1], rel=1e-9)


def test_same_fixed_point_as_algorithm3_from_the_same_start(small):
    """Both run to convergence from the same start (plain coordinate ascent, no acceleration)."""
    d, model = make_model(small, rho=0.5)
    res = coordinate_ascent(model, tol=1e-15, max_iter=20000, accelerate=False)
    X, Z = d.X[:, ~d.penalized], d.X[:, d.penalized]
    o = algorithm3(X, Z, d.y, 0.5, tol=1e-15)
    order = np.r_[np.flatnonzero(~d.penalized), np.flatnonzero(d.penalized)]
    assert_rel(res.q["theta"].mean[order], o["mu"])
    assert_rel(res.q["gamma"], o["mu_g"])
    assert_rel(res.q["mu_b"], o["mu_b"])
    assert res.elbo[-1] == pytest.approx(o["trace"][-1], rel=1e-9)


def test_fixed_point_with_keep_and_random_intercepts():
    """Extension: a kept term and a (1 | group) term (always in, own variance) — same fixed point
    as the transcription with the group indicators in the always-included block."""
    df = vbsvm.datasets.simulate_grouped(12, 8, seed=3)
    rng = np.random.default_rng(1)
    df = df.assign(z1=rng.normal(size=len(df)), z2=rng.normal(size=len(df)), z3=rng.normal(size=len(df)))
    formula = "y ~ time + treatment + z1 + z2 + z3 + (1 | group)"
    d, model = make_model(df, formula, rho=0.3, keep=["treatment"])
    res = coordinate_ascent(model, tol=1e-14, max_iter=20000)
    q = res.q
    sel = model.sel
    fixed = np.setdiff1d(np.arange(d.p), sel)
    U = np.eye(d.groups[0].n_levels)[d.groups[0].codes]
    X, Z = d.X[:, fixed], d.X[:, sel]
    inv = q["variances"].mean_inv()
    init = (q["chi"] ** -0.5, inv[0], q["mu_b"], q["gamma"], inv[1])
    o = algorithm3(X, Z, d.y, 0.3, init=init, iters=1, U=U)
    gix = model.base.group_slices["group"]
    order = np.r_[fixed, gix, sel]
    mean = q["theta"].mean
    assert_rel(mean[order], o["mu"])
    var = q["theta"].diag_cov()
    assert_rel(var[order], np.diag(o["Sigma"]))
    assert_rel(q["gamma"], o["mu_g"])
    assert_rel(q["chi"], o["chi"])
    assert_rel(q["variances"].b[0], o["Bq"])


@pytest.mark.parametrize("accelerate", [False, True])
def test_elbo_never_decreases(small, accelerate):
    for rho in (0.05, 0.5):
        d, model = make_model(small, rho=rho)
        res = coordinate_ascent(model, tol=1e-13, max_iter=3000, accelerate=accelerate)
        steps = np.diff(res.elbo)
        assert steps.min() >= -1e-10 * abs(res.elbo[-1]), steps.min()
        assert res.converged


def test_elbo_never_decreases_sweep_by_sweep_on_a_harder_problem():
    df = vbsvm.datasets.simulate_sparse(300, 30, 4, seed=5, rho=0.5)
    d, model = make_model(df, rho=0.05)
    x = model.vb_initial_state()
    values = []
    for _ in range(150):
        x, q, e = model.vb_sweep(x)
        values.append(e)
    steps = np.diff(values)
    assert steps.min() >= -1e-10 * abs(values[-1]), steps.min()


def _elbo_at(model, post, mu_b, eta, chi, Bq):
    """ELBO of the q built from the given factors (theta factor fixed)."""
    Aq = model.A + model.sizes / 2
    g = expit(eta)
    s = model.scaling(g)
    mu = post.mean
    Sdd = post.cov_dense()
    Okk = np.diag(Sdd)[model.sel] + mu[model.sel] ** 2
    mf, vf = post.score_moments(s, model.sel, Okk)
    q = {"theta": post, "theta_mean": mu, "theta_var": post.diag_cov(), "Okk": Okk, "mu_b": mu_b,
         "eta": eta, "chi": chi, "variances": InverseGamma(Aq, Bq), "mean_f": mf, "var_f": vf}
    return model.elbo(q)


def test_updates_are_stationary_points_of_the_elbo(small_fit):
    """Finite differences of our ELBO in each factor's parameter vanish at the fixed point: the
    update formulas (from the paper) and the ELBO (derived independently) agree."""
    d, model, res = small_fit
    q = res.q
    args = dict(post=q["theta"], mu_b=q["mu_b"].copy(), eta=q["eta"].copy(), chi=q["chi"].copy(),
                Bq=np.array(q["variances"].b, dtype=float))
    base = _elbo_at(model, **args)
    assert base == pytest.approx(res.elbo[-1], rel=1e-10)
    h = 1e-5
    for name, idx in [("eta", np.flatnonzero(np.abs(q["eta"]) < 25)), ("mu_b", range(model.m)),
                      ("chi", [0, 7, 33]), ("Bq", [0])]:
        for i in idx:
            vals = []
            for sgn in (+1, -1):
                a = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
                if name == "eta":
                    a[name][i] += sgn * h
                else:
                    a[name][i] *= np.exp(sgn * h)
                vals.append(_elbo_at(model, **a))
            grad = (vals[0] - vals[1]) / (2 * h)
            assert abs(grad) < 1e-5, (name, i, grad)
            assert max(vals) <= base + 1e-9  # a maximum, not a saddle, in each coordinate


def test_b_terms_of_elbo_match_distributions():
    """Closed form of E log p(v|b,s2) + E log p(b) + H[q(b)] (module docstring) against the
    inverse-Gaussian / inverse-gamma implementations of vbsvm.distributions."""
    rng = np.random.default_rng(0)
    mu_b, Okk = rng.uniform(0.2, 5, 6), rng.uniform(0.01, 3, 6)
    qs = InverseGamma(3.5, 2.0)
    e_inv, e_log = qs.mean_inv(), qs.mean_log()
    qb = InverseGaussian(mu_b, 1.0)
    direct = (-0.5 * np.log(2 * np.pi) + 0.5 * qb.mean_log() - 0.5 * e_log - 0.5 * e_inv * mu_b * Okk
              + InverseGamma(1.0, 0.5).expected_logpdf(qb) + qb.entropy())
    closed = -np.log(2) - 0.5 * e_log - 0.5 * e_inv * mu_b * Okk - 0.5 / mu_b
    np.testing.assert_allclose(direct, closed, rtol=1e-9, atol=1e-9)


def test_laplace_mixture_representation():
    """v | b ~ N(0, s^2/b), b ~ IG(1, 1/2) gives v ~ Laplace(0, s) (Section 3.2)."""
    rng = np.random.default_rng(1)
    s = 0.7
    b = InverseGamma(1.0, 0.5).sample(rng, 200000)
    v = rng.standard_normal(b.size) * s / np.sqrt(b)
    assert stats.kstest(v, stats.laplace(scale=s).cdf).pvalue > 1e-3


# ----------------------------------------------------------------------------- Gibbs
def log_joint_y_a(y, a, f):
    """sum_i log p(y_i, a_i | f_i) of the augmentation, written out."""
    return float(np.sum(-0.5 * np.log(2 * np.pi * a) - (1 + a - y * f) ** 2 / (2 * a)))


def _collapsed_case(df, rho, seed, formula="y ~ ."):
    d, model = make_model(df, formula=formula, rho=rho)
    rng = np.random.default_rng(seed)
    gamma = (rng.random(model.m) < 0.5).astype(float)
    a = rng.uniform(0.1, 3.0, model.n)
    b = rng.uniform(0.3, 3.0, model.m)
    tau = model.prior_precision(np.array([1.0 / 0.8] + [1.0 / 1.7] * (len(model.vcomps) - 1)), b)
    return d, model, gamma, a, tau


def _log_marginal_dense(model, a, tau, active):
    """log of int p(y, a | theta) N(theta_A; 0, T_A^-1) d theta_A (theta outside A at 0), written
    out with the dense design of every coordinate (random-effect dummies included): the
    augmented likelihood is Gaussian in f, so the integral is closed form."""
    C = np.hstack([model.base.Cd, np.asarray(model.base.Zt.T.todense())]) if model.base.m_sparse else model.base.Cd
    C = C[:, active]
    w = 1.0 / a
    y = model.y
    P = C.T @ (w[:, None] * C) + np.diag(tau[active])
    r = C.T @ (y * (1.0 + w))
    const = float(np.sum(-0.5 * np.log(2 * np.pi * a) - (1 + a) ** 2 / (2 * a)))
    _, logdet = np.linalg.slogdet(P)
    return const + 0.5 * np.sum(np.log(tau[active])) - 0.5 * logdet + 0.5 * r @ np.linalg.solve(P, r)


@pytest.mark.parametrize("grouped", [False, True])
def test_collapsed_indicator_logits_integrate_every_coefficient_out(small, grouped):
    """logit P(gamma_k = 1 | w, gamma_-k, b, sigma2) equals the log ratio of the augmented
    likelihood integrated over all coefficients (dense Gaussian integral, no Schur complement),
    with and without a random-intercept factor."""
    df = small.assign(g=np.arange(len(small)) % 7) if grouped else small
    formula = "y ~ . - g + (1 | g)" if grouped else "y ~ ."
    d, model, gamma, a, tau = _collapsed_case(df, 0.3, 4, formula)
    assert bool(model.base.m_sparse) == grouped
    gram = model.gram(1 / a)
    logits = model.collapsed_indicators(gram, gamma, tau)[1]
    for i, k in enumerate(model.sel):
        act = np.ones(model.q, dtype=bool)
        act[model.sel] = gamma == 1.0
        act[k] = True
        l1 = _log_marginal_dense(model, a, tau, act)
        act[k] = False
        l0 = _log_marginal_dense(model, a, tau, act)
        assert logits[i] == pytest.approx(np.log(0.3 / 0.7) + l1 - l0, rel=1e-8, abs=1e-8)


def test_collapsed_conditional_moments_are_the_included_terms_gaussian(small):
    """The moments that fit the add/delete proposals: term k's mean and variance given w and the
    other indicators, as if k were in (a dense posterior with s_k = 1)."""
    d, model, gamma0, a, tau = _collapsed_case(small, 0.5, 5)
    gram = model.gram(1 / a)
    draw = model.collapsed_indicators(gram, gamma0, tau)
    for i, k in enumerate(model.sel):
        g = gamma0.copy()
        g[i] = 1.0
        post = model.posterior(gram, model.scaling(g), tau)
        assert draw.mean[i] == pytest.approx(post.mean[k], rel=1e-9, abs=1e-12)
        assert draw.var[i] == pytest.approx(post.diag_cov()[k], rel=1e-9)
        # the regression of the others on k: E[theta_A | theta_k] = const - c theta_k
        S = post.cov_dense()
        c = -S[:, k] / S[k, k]
        c[k] = 0.0
        np.testing.assert_allclose(draw.coupling[i], c, rtol=1e-7, atol=1e-10)


def test_sequential_collapsed_draws_use_the_updated_indicators(small):
    """Each logit is the conditional given the indicators drawn before it (and the old ones after)."""
    d, model, gamma0, a, tau = _collapsed_case(small, 0.5, 5)
    gram = model.gram(1 / a)
    for seed in range(5):
        draw = model.collapsed_indicators(gram, gamma0, tau, rng=np.random.default_rng(seed))
        new, logits = draw.gamma, draw.logits
        for i in range(model.m):
            g = np.concatenate([new[:i], gamma0[i:]])
            direct = model.collapsed_indicators(gram, g, tau)[1]
            assert logits[i] == pytest.approx(direct[i], rel=1e-10, abs=1e-10)


class RidgeReduction(LaplaceZeroModel):
    """The Laplace-zero model with rho = 1 (every gamma_k = 1) and the mixing variables held at
    b_k = 1: its Gibbs sweep is then a sampler of the linear model with penalty="auto" (a test
    device, kept here rather than as switches in the model)."""

    def set_rho(self, rho):
        self.rho, self.logit_rho, self.log_rho, self.log_1mrho = 1.0, math.inf, 0.0, -math.inf

    def mixing_conditional(self, v, sigma2_u):
        return types.SimpleNamespace(sample=lambda rng: np.ones(self.m))


def test_gamma_one_and_b_one_full_conditional_is_the_ridge_model(small):
    """With every gamma = 1 and b = 1 the theta full conditional is exactly the foundation's."""
    d = build_design("y ~ .", small)
    sel_model = LaplaceZeroModel(d.X, d.y, [], d.penalized, 0.5)
    prec = np.full(d.p, 1e-8)
    prec[d.penalized] = np.nan
    lin = LinearSVMModel(d.X, d.y, [], prec)
    rng = np.random.default_rng(0)
    w = rng.uniform(0.2, 5, d.n)
    inv_var = np.array([2.5])
    a = lin.coefficient_posterior(w, lin.prior_precision(inv_var))
    b = sel_model.posterior(sel_model.gram(w), np.ones(d.p), sel_model.prior_precision(inv_var, np.ones(sel_model.m)))
    assert_rel(b.mean, a.mean, 1e-12)
    assert_rel(b.cov_dense(), a.cov_dense(), 1e-12)


@pytest.mark.slow
def test_rho_one_fixed_b_sampler_reproduces_ridge_posterior(small):
    d = build_design("y ~ .", small)
    sel_model = RidgeReduction(d.X, d.y, [], d.penalized, 1.0)
    from vbsvm.inference.gibbs import run_chains

    a = run_chains(sel_model, draws=1500, tune=300, chains=2, seed=11, record=("u", "gamma", "sigma2"),
                   progress=False)
    assert np.all(a.draws["gamma"] == 1)
    fit = vbsvm.svm("y ~ .", small, method="gibbs", draws=1500, tune=300, chains=2, seed=12, progress=False)
    lin = fit.posterior["theta_draws"].reshape(-1, d.p)
    M = d.to_original()
    sel = a.draws["u"].reshape(-1, d.p) @ M.T
    from support.statistics import ks_2samp_ess

    for j in range(d.p):
        assert ks_2samp_ess(sel[:, j], lin[:, j]) > 1e-3, j
    s2a = a.draws["sigma2"].ravel()
    s2b = fit.posterior["sigma2_draws"].ravel()
    assert ks_2samp_ess(np.log(s2a), np.log(s2b)) > 1e-3


@pytest.mark.slow
def test_inclusion_probability_matches_quadrature():
    """One selectable predictor plus intercept: P(gamma = 1 | y), P(u > 0 | y) and E[u | y] by
    2-d quadrature of the pseudo-posterior against the Gibbs sampler (within 4 MCSE)."""
    rng = np.random.default_rng(3)
    n = 30
    x = rng.normal(size=n)
    y = np.where(rng.random(n) < expit(0.4 + 0.6 * x), 1, -1)
    df = pd.DataFrame({"y": y, "x": x})
    A = B = 1.0
    b0 = np.linspace(-4, 4, 321)
    u = np.linspace(-4, 4, 641)
    F = b0[:, None, None] + u[None, :, None] * x[None, None, :]
    loglik = -2 * np.maximum(0, 1 - y * F).sum(-1)  # (b0, u)
    pu = laplace_zero_marginal_prior(u, A, B)
    L = np.exp(loglik - loglik.max())
    Z1 = np.trapezoid(np.trapezoid(L * pu[None, :], u, axis=1), b0)
    Z0 = np.trapezoid(L[:, np.argmin(np.abs(u))], b0)  # u = 0 exactly (grid contains 0)
    # choose rho so that the exact inclusion probability is near 1/2 (any rho is a valid test)
    rho = float(np.clip(Z0 / (Z0 + Z1), 0.05, 0.95))
    p_exact = rho * Z1 / (rho * Z1 + (1 - rho) * Z0)
    wpos = np.trapezoid(np.trapezoid((L * pu[None, :])[:, u >= 0], u[u >= 0], axis=1), b0)
    ppos_exact = rho * wpos / (rho * Z1 + (1 - rho) * Z0)
    mean_exact = rho * np.trapezoid(np.trapezoid(L * pu[None, :] * u[None, :], u, axis=1), b0) / (rho * Z1 + (1 - rho) * Z0)
    assert 0.2 < p_exact < 0.8
    fit = vbsvm.svm("y ~ x", df, prior=LaplaceZero(rho=rho), method="gibbs", standardize=False, A_u=A, B_u=B,
                    draws=3000, tune=500, chains=2, seed=3, progress=False)
    from arviz_stats import ess

    g = fit.posterior["gamma_draws"][..., 0].astype(float)
    uu = fit.posterior["theta_draws"][..., 1]
    for draws, exact in [(g, p_exact), ((uu > 0).astype(float), ppos_exact), (uu, mean_exact)]:
        e = float(ess(xr.Dataset({"v": (("chain", "draw"), draws)}), method="mean")["v"])
        mcse = draws.std() / np.sqrt(e)
        print(f"sampled {draws.mean():.4f} exact {exact:.4f} mcse {mcse:.4f} ess {e:.0f}")
        assert abs(draws.mean() - exact) < 4 * mcse + 1e-3, (draws.mean(), exact, mcse)


# ----------------------------------------------------------------------------- ranking
def _auc(scores, truth):
    pos, neg = scores[truth], scores[~truth]
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size))


def _replicate_aucs(method, reps=20, **kw):
    aucs = []
    for r in range(reps):
        df = vbsvm.datasets.simulate_sparse(500, 50, 5, seed=100 + r)
        with warnings.catch_warnings():  # short Gibbs chains: R-hat/ESS warnings are expected here
            warnings.simplefilter("ignore", vbsvm.exceptions.DiagnosticWarning)
            fit = vbsvm.svm("y ~ .", df, prior=LaplaceZero(expected_size=5), method=method, seed=r,
                            progress=False, **kw)
        inc = fit.inclusion()
        truth = inc.index.isin(df.attrs["truth"]["support"])
        aucs.append(_auc(inc["p_include"].to_numpy(), truth))
    return np.array(aucs)


@pytest.mark.slow
def test_vb_ranks_sparse_truth_first():
    aucs = _replicate_aucs("vb")
    assert aucs.mean() >= 0.95, aucs


@pytest.mark.slow
def test_gibbs_ranks_sparse_truth_first():
    aucs = _replicate_aucs("gibbs", draws=1000, tune=1000, chains=2)
    assert aucs.mean() >= 0.95, aucs


# ----------------------------------------------------------------------------- user API
@pytest.mark.parametrize("kwargs, name", [
    (dict(rho=0.0), "rho"), (dict(rho=1.0), "rho"), (dict(rho="sometimes"), "rho"), (dict(rho=np.nan), "rho"),
    (dict(expected_size=-2), "expected_size"), (dict(rho=0.2, expected_size=3), "expected_size"),
    (dict(rho=0.1, rho_grid=[0.1]), "rho_grid"), (dict(rho="auto", rho_grid=[0.5, 2.0]), "rho_grid"),
])
def test_prior_arguments_are_validated(kwargs, name):
    with pytest.raises(InputError, match=name):
        LaplaceZero(**kwargs)


@pytest.mark.parametrize("kwargs, name", [(dict(rho=True), "rho"), (dict(keep=[1, 2]), "keep"),
                                          (dict(expected_size="3"), "expected_size")])
def test_prior_argument_types_are_validated(kwargs, name):
    with pytest.raises(InputTypeError, match=name):
        LaplaceZero(**kwargs)


def test_fit_arguments_are_validated(small):
    with pytest.raises(InputError, match="keep"):
        vbsvm.svm("y ~ .", small, prior=LaplaceZero(keep=["x11"]))
    with pytest.raises(InputError, match="expected_size"):
        vbsvm.svm("y ~ .", small, prior=LaplaceZero(expected_size=6))
    with pytest.raises(InputError, match="method"):
        vbsvm.svm("y ~ .", small, prior=LaplaceZero(), method="map")
    with pytest.raises(InputError, match="penalty"):
        vbsvm.svm("y ~ .", small, prior=LaplaceZero(), penalty=0.5)
    with pytest.raises(InputTypeError, match="prior"):
        vbsvm.svm("y ~ .", small, prior="laplace")
    with pytest.raises(InputError, match="keep"):
        vbsvm.svm("y ~ x1", small, prior=LaplaceZero(keep="x1"))


@pytest.fixture(scope="module")
def grouped():
    df = vbsvm.datasets.simulate_sparse(200, 8, 3, seed=21)
    df["site"] = np.repeat(np.arange(10), 20)
    return df


@pytest.fixture(scope="module")
def vb_fit(grouped):
    return vbsvm.svm("y ~ . + (1 | site)", grouped, prior=LaplaceZero(rho=0.2, keep=["x8"]), seed=2, chains=2, draws=300)


@pytest.fixture(scope="module")
def gibbs_fit(grouped):
    with warnings.catch_warnings():  # short chains: the indicators' R-hat may or may not warn
        warnings.simplefilter("ignore", vbsvm.exceptions.DiagnosticWarning)
        return vbsvm.svm("y ~ . + (1 | site)", grouped, prior=LaplaceZero(rho=0.2, keep=["x8"]), method="gibbs",
                         draws=400, tune=200, chains=2, seed=2, progress=False)


def test_expected_size_sets_rho(small):
    fit = vbsvm.svm("y ~ .", small, prior=LaplaceZero(expected_size=1.5))
    assert fit.rho == pytest.approx(1.5 / 6)


@pytest.mark.parametrize("which", ["vb_fit", "gibbs_fit"])
@pytest.mark.slow
def test_inclusion_table(which, request):
    fit = request.getfixturevalue(which)
    assert isinstance(fit, SelectionFit)
    inc = fit.inclusion()
    assert list(inc.columns) == ["p_include", "p_positive", "p_positive_if_included", "mean", "sd",
                                 "mean_if_included", "sd_if_included", "median_model"]
    assert sorted(inc.index) == sorted([f"x{j}" for j in range(1, 8)])  # x8 kept, intercept never selectable
    assert np.all(np.diff(inc["p_include"].to_numpy()) <= 0)
    assert inc["median_model"].equals(inc["p_include"] > 0.5)
    assert np.all(inc["p_positive"] <= inc["p_include"] + 1e-12)
    # the true effects (x1..x3: +, -, +) are in, with the right signs
    assert inc.loc[["x1", "x2", "x3"], "p_include"].min() > 0.9
    assert inc.loc["x1", "p_positive_if_included"] > 0.9 and inc.loc["x2", "p_positive_if_included"] < 0.1
    # coef: kept term and selectable terms; the mean of u is the table's mean
    np.testing.assert_allclose(fit.coef.loc[inc.index, "mean"], inc["mean"], rtol=1e-6, atol=1e-12)
    assert "x8" in fit.coef.index and "x8" not in inc.index
    assert fit.selected == inc.index[inc["median_model"]].tolist()


def test_vb_moments_and_quantiles_of_spike_and_slab(vb_fit):
    """VB: mean/sd of u = gamma v are the mixture moments; intervals are its exact quantiles."""
    inc = vb_fit.inclusion()
    ci = vb_fit.coef_table(0.9)
    P = vb_fit.posterior
    for j, name in zip(vb_fit.sel_index, vb_fit.selectable):
        g = P["q_gamma"][list(vb_fit.sel_index).index(j)]
        sc = vb_fit.design.scale[j]
        m, s = P["q_mean"][j] / sc, np.sqrt(P["q_var"][j]) / sc
        draws_v = np.random.default_rng(0).normal(m, s, 400000) * (np.random.default_rng(1).random(400000) < g)
        assert inc.loc[name, "mean"] == pytest.approx(draws_v.mean(), abs=4 * s / 600 + 1e-12)
        lo, hi = np.quantile(draws_v, [0.05, 0.95])
        assert ci.loc[name, "5%"] == pytest.approx(lo, abs=0.01 * s + 1e-12)
        assert ci.loc[name, "95%"] == pytest.approx(hi, abs=0.01 * s + 1e-12)


def test_vb_prediction_uses_the_papers_rule(vb_fit, grouped):
    P = vb_fit.posterior
    d = vb_fit.design
    s = np.ones(vb_fit.layout.n_dense)
    s[vb_fit.sel_index] = P["q_gamma"]
    qd = vb_fit.layout.n_dense
    score = d.X @ (s[: d.p] * P["q_mean"][: d.p]) + P["q_mean"][qd:][d.groups[0].codes]
    got = vb_fit.predict(grouped, kind="score")["mean"].to_numpy()
    np.testing.assert_allclose(got, score, rtol=1e-8, atol=1e-10)
    cls = vb_fit.predict(grouped)
    assert np.array_equal(np.where(score > 0, 1, -1), cls.to_numpy())
    prob = vb_fit.predict(grouped, kind="prob")
    assert np.corrcoef(prob, score)[0, 1] > 0.8 and prob.between(0, 1).all()


@pytest.mark.slow
def test_gibbs_prediction_is_posterior_mean_of_gamma_v(gibbs_fit, grouped):
    u = gibbs_fit.posterior["theta_draws"].reshape(-1, gibbs_fit.layout.q)
    d = gibbs_fit.design
    raw = d.new_X(grouped, standardized=False)
    qd = gibbs_fit.layout.n_dense
    f = u[:, : d.p] @ raw.T + u[:, qd:][:, d.groups[0].codes]
    got = gibbs_fit.predict(grouped, kind="score")["mean"].to_numpy()
    np.testing.assert_allclose(got, f.mean(0), rtol=1e-8, atol=1e-10)
    # draws are gamma * v: excluded draws are exact zeros
    g = gibbs_fit.posterior["gamma_draws"].reshape(-1, len(gibbs_fit.sel_index))
    assert np.all(u[:, gibbs_fit.sel_index][g == 0] == 0)


@pytest.mark.parametrize("which", ["vb_fit", "gibbs_fit"])
def test_arviz_has_gamma_and_save_load_round_trip(which, request, tmp_path):
    fit = request.getfixturevalue(which)
    dt = fit.to_arviz()
    assert dt.attrs["vbsvm_fit_type"] == "selection"
    gam = dt["posterior"]["gamma"]
    assert gam.dims == ("chain", "draw", "coef_selectable")
    assert list(gam["coef_selectable"].values) == fit.selectable
    assert gam.shape[:2] == dt["posterior"]["beta"].shape[:2]
    np.testing.assert_allclose(gam.mean(("chain", "draw")).values,
                               fit.inclusion().loc[fit.selectable, "p_include"], atol=0.08)
    path = tmp_path / "fit.nc"
    fit.save(path)
    back = SelectionFit.from_datatree(xr.open_datatree(path, engine="h5netcdf").load())
    pd.testing.assert_frame_equal(back.inclusion(), fit.inclusion())
    pd.testing.assert_frame_equal(back.coef, fit.coef)
    assert back.rho == fit.rho
    np.testing.assert_allclose(back.to_arviz()["posterior"]["gamma"].values, gam.values)


def test_vbsvm_load_dispatches_selection_fits(vb_fit, tmp_path):
    vb_fit.save(tmp_path / "f.nc")
    assert isinstance(vbsvm.load(tmp_path / "f.nc"), SelectionFit)


@pytest.mark.slow
def test_plot_inclusion(vb_fit, gibbs_fit):
    from matplotlib.figure import Figure
    from vbsvm.results.plots import plot_elbo, plot_inclusion_comparison

    fig = vb_fit.plot_inclusion()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights, vb_fit.inclusion()["p_include"])
    assert [t.get_text() for t in ax.get_xticklabels()] == vb_fit.inclusion().index.tolist()
    both = plot_inclusion_comparison([vb_fit, gibbs_fit])
    assert isinstance(both, Figure) and len([a for a in both.axes if a.patches]) == 2
    assert isinstance(plot_elbo(vb_fit), Figure)


def test_summary_shows_prior_and_inclusion(vb_fit, gibbs_fit):
    for fit in (vb_fit, gibbs_fit):
        text = fit.summary().as_text()
        assert "p_include" in text and "Laplace-zero" in text and "alpha" not in text and "Prior:" in text


def test_gibbs_inclusion_table_shows_each_indicators_r_hat_and_ess(gibbs_fit, monkeypatch):
    """The inclusion table of a Gibbs fit reports R-hat and bulk ESS per indicator
    (those of ``gamma[term]`` in ``fit.diagnostics()``); with term names too long for one table
    they get a table of their own, and no line is wider than the summary."""
    from vbsvm.results import summary

    (title, table), = [t for t in gibbs_fit.summary_tables(0.95) if t[0].startswith("Inclusion")]
    diag = gibbs_fit.diagnostics()
    assert list(table.columns) == ["p_include", "p_positive", "mean_if_included", "sd_if_included",
                                   "median_model", "r_hat", "ess_bulk"]
    for term, row in table.iterrows():
        r, e = diag.loc[f"gamma[{term}]", ["r_hat", "ess_bulk"]]
        assert (np.isnan(row["r_hat"]) and np.isnan(r)) or row["r_hat"] == pytest.approx(r)
        assert row["ess_bulk"] == ("" if np.isnan(r) or not np.isfinite(e) else int(round(e)))
    monkeypatch.setattr(summary, "WIDTH", 60)  # as if the names were long
    tables = dict(gibbs_fit.summary_tables(0.95))
    split = tables["Sampler diagnostics of the inclusion indicators"]
    pd.testing.assert_frame_equal(split, table[["r_hat", "ess_bulk"]])
    assert "r_hat" not in tables[title].columns
    monkeypatch.undo()
    assert max(len(line) for line in gibbs_fit.summary().as_text().splitlines()) <= 100


def test_same_seed_same_result(grouped):
    kw = dict(prior=LaplaceZero(rho=0.2), method="gibbs", draws=50, tune=20, chains=2, progress=False)
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning):
        a = vbsvm.svm("y ~ .", grouped, seed=5, **kw)
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning):
        b = vbsvm.svm("y ~ .", grouped, seed=5, **kw)
    np.testing.assert_array_equal(a.posterior["theta_draws"], b.posterior["theta_draws"])
    v1 = vbsvm.svm("y ~ .", grouped, prior=LaplaceZero(rho=0.2), seed=1)
    v2 = vbsvm.svm("y ~ .", grouped, prior=LaplaceZero(rho=0.2), seed=1)
    pd.testing.assert_frame_equal(v1.inclusion(), v2.inclusion())
    np.testing.assert_array_equal(v1.to_arviz()["posterior"]["gamma"].values, v2.to_arviz()["posterior"]["gamma"].values)


def test_rho_auto_picks_the_best_elbo_on_the_grid(small):
    grid = [0.05, 0.2, 0.5]
    fit = vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho="auto", rho_grid=grid))
    curve = fit.rho_curve
    assert list(curve["rho"]) == grid
    assert fit.rho == grid[int(np.argmax(curve["elbo"]))]
    assert curve["chosen"].sum() == 1
    one = vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho=0.2), method="meanfield")
    assert curve.loc[curve["rho"] == 0.2, "elbo"].item() == pytest.approx(one.elbo[-1], rel=1e-10)
    assert "rho chosen" in fit.summary().as_text()


def test_nonconvergence_warns(small):
    with pytest.warns(vbsvm.exceptions.ConvergenceWarning):
        fit = vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho=0.2), method="meanfield", max_iter=3)
    assert not fit.info["converged"]


def test_collapsed_logits_with_more_columns_than_rows_and_vanishing_slab_precisions():
    """p > n and slab variances near the top of the draws' range: the model with every term in
    has a precision singular in floating point, yet the logits (which need only its precision
    and shift) are finite and equal the dense integrals where those are computable."""
    rng = np.random.default_rng(3)
    n, p = 20, 40
    X = rng.normal(size=(n, p))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(p)]).assign(y=(X[:, 0] > 0).astype(int))
    d, model = make_model(df, rho=0.1)
    gamma = np.zeros(model.m)
    gamma[:3] = 1.0
    a = rng.uniform(0.1, 3.0, model.n)
    tau = model.prior_precision(np.array([1e-250] * len(model.vcomps)), np.ones(model.m))
    gram = model.gram(1 / a)
    with pytest.raises(np.linalg.LinAlgError):  # the full model's factor, which the logits avoid
        model.posterior(gram, np.ones(model.qd), tau)
    draw = model.collapsed_indicators(gram, gamma, tau, rng=np.random.default_rng(1))
    assert np.all(np.isfinite(draw.logits)) and set(np.unique(draw.gamma)) <= {0.0, 1.0}
