"""Gibbs sampler of the linear SVM against exact computations (quadrature, an independent
Metropolis sampler on the marginal pseudo-posterior), reproducibility and diagnostics."""

import re

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.results import diagnostics as results
from support.statistics import ess, grid_cdf, hinge_sum, ks_1samp_ess, ks_2samp_ess


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(7)
    n = 40
    x = rng.normal(size=n)
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-(0.3 + 1.5 * x))), 1, -1)
    return pd.DataFrame({"y": y, "x": x})


def test_one_coefficient_fixed_penalty_matches_quadrature(small):
    alpha = 0.5
    fit = vbsvm.svm("y ~ x - 1", data=small, method="gibbs", penalty=alpha, standardize=False,
                    draws=3000, tune=300, chains=2, seed=1, progress=False)
    draws = fit.posterior["theta_draws"][..., 0]
    y, x = small["y"].to_numpy(float), small["x"].to_numpy()
    grid = np.linspace(-2, 6, 8001)
    logdens = -2 * hinge_sum(y, np.outer(x, grid)) - 2 * alpha * grid ** 2
    assert ks_1samp_ess(draws, grid_cdf(grid, logdens)) > 1e-3


@pytest.mark.slow
def test_two_coefficients_marginals_match_quadrature(small):
    alpha = 0.25
    fit = vbsvm.svm("y ~ x", data=small, method="gibbs", penalty=alpha, standardize=False,
                    draws=3000, tune=300, chains=2, seed=2, progress=False)
    d = fit.posterior["theta_draws"]
    y, x = small["y"].to_numpy(float), small["x"].to_numpy()
    b0 = np.linspace(-3, 3.5, 651)
    b1 = np.linspace(-1.5, 6, 751)
    B0, B1 = np.meshgrid(b0, b1, indexing="ij")
    F = x[:, None] * B1.ravel()[None, :] + B0.ravel()[None, :]
    logd = (-2 * hinge_sum(y, F) - 2 * alpha * B1.ravel() ** 2 - B0.ravel() ** 2 / 2e8).reshape(B0.shape)
    joint = np.exp(logd - logd.max())
    m0 = np.log(joint.sum(1))
    m1 = np.log(joint.sum(0))
    assert ks_1samp_ess(d[..., 0], grid_cdf(b0, m0)) > 1e-3
    assert ks_1samp_ess(d[..., 1], grid_cdf(b1, m1)) > 1e-3


@pytest.mark.slow
def test_penalty_inference_marginal_matches_quadrature(small):
    """With sigma2 ~ IG(A, B) integrated out, p(beta | y) is proportional to
    exp(-2 sum hinge) (B + beta^2/2)^(-(A + 1/2)) (one penalized coefficient, no intercept)."""
    A, B = 1.0, 1.0
    fit = vbsvm.svm("y ~ x - 1", data=small, method="gibbs", penalty="auto", A_u=A, B_u=B,
                    standardize=False, draws=3000, tune=300, chains=2, seed=3, progress=False)
    draws = fit.posterior["theta_draws"][..., 0]
    y, x = small["y"].to_numpy(float), small["x"].to_numpy()
    grid = np.linspace(-3, 8, 11001)
    logdens = -2 * hinge_sum(y, np.outer(x, grid)) - (A + 0.5) * np.log(B + grid ** 2 / 2)
    assert ks_1samp_ess(draws, grid_cdf(grid, logdens)) > 1e-3
    # and sigma2 | y: mixture over beta of IG(A + 1/2, B + beta^2/2); its mean exists (A + 1/2 > 1)
    s2 = fit.posterior["sigma2_draws"][..., 0]
    dens = np.exp(logdens - logdens.max())
    w = dens / dens.sum()
    exact_mean = np.sum(w * (B + grid ** 2 / 2) / (A + 0.5 - 1))
    assert abs(s2.mean() - exact_mean) < 5 * s2.std() / np.sqrt(ess(s2))


def rwm_random_intercept(y, x, g, m, A, B, sigma2_beta, n_steps, seed):
    """Random-walk Metropolis on (b0, b1, u_1..u_m, log sigma2) of the marginal pseudo-posterior
    exp(-2 sum hinge) N(b; 0, sigma2_beta) N(u; 0, sigma2) IG(sigma2; A, B) — no augmentation."""
    rng = np.random.default_rng(seed)

    def logp(th):
        b0, b1, u, ls = th[0], th[1], th[2:2 + m], th[-1]
        s2 = np.exp(ls)
        f = b0 + b1 * x + u[g]
        return (-2 * np.maximum(0, 1 - y * f).sum() - (b0 ** 2 + b1 ** 2) / (2 * sigma2_beta)
                - 0.5 * m * ls - u @ u / (2 * s2) - A * ls - B / s2)

    th = np.zeros(m + 3)
    lp = logp(th)
    scale = np.full(m + 3, 0.25)
    out = np.empty((n_steps, m + 3))
    acc = 0
    for t in range(n_steps):
        prop = th + scale * rng.standard_normal(m + 3)
        lq = logp(prop)
        if np.log(rng.random()) < lq - lp:
            th, lp = prop, lq
            acc += 1
        out[t] = th
    return out, acc / n_steps


@pytest.mark.parametrize("seed", [4])
@pytest.mark.slow
def test_random_intercept_gibbs_agrees_with_independent_metropolis(seed):
    rng = np.random.default_rng(seed)
    m, per = 5, 12
    g = np.repeat(np.arange(m), per)
    x = rng.normal(size=m * per)
    u = rng.normal(0, 1.0, m)
    y = np.where(rng.random(m * per) < 1 / (1 + np.exp(-(x + u[g]))), 1.0, -1.0)
    df = pd.DataFrame({"y": y, "x": x, "g": g})
    A, B = 1.0, 1.0
    fit = vbsvm.svm("y ~ x + (1 | g)", data=df, method="gibbs", penalty=None, A_u=A, B_u=B,
                    standardize=False, draws=2000, tune=500, chains=2, seed=seed, progress=False)
    rw, acc = rwm_random_intercept(y, x, g, m, A, B, 1e8, 120_000, seed)
    rw = rw[20_000::20]
    gb = fit.posterior["theta_draws"].reshape(-1, m + 2)[::5]
    for j in range(m + 2):
        # means within a few Monte Carlo standard errors (ESS-conservative: thinned draws)
        se = np.sqrt(rw[:, j].var() / len(rw) * 4 + gb[:, j].var() / len(gb) * 4)
        assert abs(rw[:, j].mean() - gb[:, j].mean()) < 4 * se, j
        assert ks_2samp_ess(rw[:, j], gb[:, j]) > 1e-3, j
    s2 = fit.posterior["sigma2_draws"].ravel()[::5]
    assert ks_2samp_ess(np.exp(rw[:, -1]), s2) > 1e-3


def test_same_seed_same_draws_serial_or_parallel(small):
    kw = dict(data=small, method="gibbs", draws=50, tune=10, chains=2, seed=9, progress=False)
    a = vbsvm.svm("y ~ x", **kw)
    b = vbsvm.svm("y ~ x", **kw)
    c = vbsvm.svm("y ~ x", n_jobs=2, **kw)
    np.testing.assert_array_equal(a.posterior["theta_draws"], b.posterior["theta_draws"])
    np.testing.assert_array_equal(a.posterior["theta_draws"], c.posterior["theta_draws"])
    d = vbsvm.svm("y ~ x", **{**kw, "seed": 10})
    assert not np.array_equal(a.posterior["theta_draws"], d.posterior["theta_draws"])


def test_short_chains_warn_about_diagnostics(small):
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning, match="ESS"):
        vbsvm.svm("y ~ x", data=small, method="gibbs", draws=30, tune=5, chains=2, seed=1, progress=False)


def test_summary_shows_rhat_and_ess(small):
    fit = vbsvm.svm("y ~ x", data=small, method="gibbs", draws=500, tune=200, chains=4, seed=1, progress=False)
    text = fit.summary().as_text()
    assert "r_hat" in text and "ess_bulk" in text and "Max R-hat" in text
    diag = fit.diagnostics()
    assert {"r_hat", "ess_bulk", "ess_tail", "mcse_mean"} <= set(diag.columns)
    # every parameter is a summary one here: the table the fit's warning check made, by value
    fresh = results.diagnostics_table(fit._posterior_dataset())
    pd.testing.assert_frame_equal(diag, fresh)
    pd.testing.assert_frame_equal(diag, fit.summary_diagnostics())
    diag.iloc[0, 0] = -1.0  # a copy: the cached table is not the caller's
    assert fit.diagnostics().iloc[0, 0] != -1.0 and fit.summary_diagnostics().iloc[0, 0] != -1.0


@pytest.mark.slow
def test_convergence_warning_on_separable_data_with_an_inferred_penalty_names_the_prior_tail():
    """The Section 4.2 simulation with 40 predictors and 100 rows is separable: with
    penalty='auto' short chains miss the targets and the warning adds that sigma2_u keeps its
    prior's tail, with its draws' median and maximum. No such hint with a fixed penalty or on
    data that are not separable."""
    df = vbsvm.datasets.simulate_luts(100, 40, seed=1)
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning,
                      match=r"linearly separable.*IG\(0\.01, 0\.01\).*median \S+ and reach \S+\."):
        fit = vbsvm.svm("y ~ .", df, method="gibbs", draws=100, tune=100, chains=2, seed=1, progress=False,
                        max_draws=100)
    assert fit.design.linearly_separable() and fit._separable_hint().startswith(" The data are linearly separable")
    fixed = vbsvm.svm("y ~ .", df, method="gibbs", penalty=1.0, draws=50, tune=50, chains=2, seed=1, progress=False,
                      max_draws=50)
    assert fixed._separable_hint() == ""
    overlapping = vbsvm.datasets.simulate_luts(200, 2, seed=1)
    fit = vbsvm.svm("y ~ .", overlapping, method="gibbs", draws=50, tune=50, chains=2, seed=1, progress=False,
                    max_draws=50)
    assert not fit.design.linearly_separable() and fit._separable_hint() == ""


def test_convergence_warning_names_the_worst_parameter_and_the_draws_needed():
    df = vbsvm.datasets.simulate_grouped(20, 5, seed=1)
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning, match=r"the worst is \S+ \(bulk ESS \d+.*draws=\d+"):
        fit = vbsvm.svm("y ~ time + (1 | group)", df, method="gibbs", draws=100, tune=50, chains=2, progress=False)
    worst = fit.summary_diagnostics()["ess_bulk"].idxmin()  # fixed effects and variances, not levels
    assert len(fit.diagnostics()) > len(fit.summary_diagnostics())  # diagnostics() has the levels too
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning, match=re.escape(worst)):
        fit._warn_diagnostics()
