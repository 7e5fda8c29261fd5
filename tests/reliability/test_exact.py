"""(a) Exact-posterior checks of every Gibbs sampler.

The SVM pseudo-likelihood ``exp(-2 sum_i (1 - y_i f_i)_+)`` times the prior is a normalisable
density in the parameters, so for one, two or three free coordinates its marginals can be computed
by quadrature (variances integrated out analytically where they are conjugate, Laplace slab by a
one-dimensional integral, the imputation model by a one-dimensional integral over its variance).
The Gibbs draws (augmented samplers from the package) must match those marginals: one-sample KS
tests whose sample size is the effective sample size of the draws, threshold ``p > 1e-3``.

The normal suite runs one fixed seed per model; ``-m slow`` runs five seeds with four times the
draws (the p-values are printed with ``-s``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import special
from scipy.integrate import cumulative_trapezoid

import vbsvm
from vbsvm.exceptions import DiagnosticWarning
from support import exact
from support.exact import P_MIN, data, gibbs, ig_mixture_cdf, report
from support.statistics import ess, grid_cdf, hinge_sum, ks_1samp_ess

pytestmark = pytest.mark.usefixtures("one_blas_thread")

FAST = [pytest.param(11, 1, id="fast")]
SLOW = [pytest.param(s, 4, id=f"slow-seed{s}", marks=pytest.mark.slow) for s in (21, 22, 23, 24, 25)]
SEEDS = FAST + SLOW


@pytest.mark.parametrize("seed,scale", SEEDS)
def test_one_coefficient_fixed_penalty(seed, scale):
    df = data(seed, n=25)
    alpha = 0.7
    fit = gibbs("y ~ x1 - 1", df, scale=scale, seed=seed, penalty=alpha)
    d = fit.posterior["theta_draws"][..., 0]
    y, x = df["y"].to_numpy(float), df["x1"].to_numpy()
    grid = np.linspace(-4, 8, 12001)
    cdf = grid_cdf(grid, -2 * hinge_sum(y, np.outer(x, grid)) - 2 * alpha * grid ** 2)
    p = ks_1samp_ess(d, cdf)
    report("1 coef, fixed penalty", {"beta": p})
    assert p > P_MIN


@pytest.mark.parametrize("seed,scale", SEEDS)
def test_two_penalized_coefficients_penalty_inferred(seed, scale):
    """sigma2_u ~ IG(A, B) integrated out: p(b | y) ~ exp(-2 sum hinge) (B + |b|^2/2)^-(A+1).
    sigma2_u | y is the mixture over the grid of IG(A + 1, B + |b|^2/2)."""
    df = data(seed, n=30, p=2)
    A, B = 1.5, 1.0
    fit = gibbs("y ~ x1 + x2 - 1", df, scale=scale, seed=seed, penalty="auto", A_u=A, B_u=B)
    th = fit.posterior["theta_draws"]
    s2 = fit.posterior["sigma2_draws"][..., 0]
    y, X = df["y"].to_numpy(float), df[["x1", "x2"]].to_numpy()
    g = np.linspace(-6, 9, 601)
    B1, B2 = np.meshgrid(g, g, indexing="ij")
    F = X @ np.vstack([B1.ravel(), B2.ravel()])
    r2 = B1.ravel() ** 2 + B2.ravel() ** 2
    logd = (-2 * hinge_sum(y, F) - (A + 1) * np.log(B + r2 / 2)).reshape(B1.shape)
    joint = np.exp(logd - logd.max())
    pv = {"b1": ks_1samp_ess(th[..., 0], grid_cdf(g, np.log(joint.sum(1)))),
          "b2": ks_1samp_ess(th[..., 1], grid_cdf(g, np.log(joint.sum(0))))}
    pv["sigma2_u"] = ks_1samp_ess(s2, ig_mixture_cdf(A + 1, B, r2, joint.ravel()))
    report("2 penalized coefs, penalty inferred", pv)
    assert min(pv.values()) > P_MIN, pv


@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_intercept_and_penalized_coefficient_penalty_inferred(seed, scale):
    """Vague N(0, 1e8) intercept (never penalized) + one penalized slope, sigma2_u integrated."""
    exact.intercept_and_penalized_coefficient_penalty_inferred(seed, scale)


@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_random_intercept_two_groups_exact(seed, scale):
    """y ~ 1 + (1 | g) with two levels against a 3-d grid, sigma2_g integrated out."""
    exact.random_intercept_two_groups(seed, scale)


# ------------------------------------------------------------------------------- Laplace-zero
def _laplace_slab_logdensity(u, A, B):
    """log of int Laplace(u; 0, sigma) IG(sigma^2; A, B) d sigma^2 (1-d quadrature in log sigma)."""
    ls = np.linspace(-9, 7, 3201)  # log sigma
    s = np.exp(ls)
    # IG density of sigma^2 = s^2, times the Jacobian d sigma^2 / d log sigma = 2 s^2
    log_ig = A * np.log(B) - special.gammaln(A) - (A + 1) * 2 * ls - B / s ** 2 + np.log(2) + 2 * ls
    lap = -np.abs(u)[:, None] / s[None, :] - np.log(2 * s)[None, :]
    return special.logsumexp(lap + log_ig[None, :], axis=1) + np.log(ls[1] - ls[0])


@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_laplace_zero_one_term_with_intercept_exact(seed, scale):
    """u = gamma v with the Laplace-zero prior; the posterior is a mixture of a point mass at 0
    (gamma = 0) and a continuous part. Checks P(gamma = 1 | y) and the marginals of the
    intercept and of u by quadrature."""
    from vbsvm.models.priors import LaplaceZero

    df = data(111, n=30, beta=0.3)  # fixed data with P(gamma = 1 | y) ~ 0.17; the seeds vary the chains
    A, B, rho = 2.0, 1.0, 0.4
    fit = gibbs("y ~ x1", df, scale=scale, seed=seed, prior=LaplaceZero(rho=rho), A_u=A, B_u=B)
    th = fit.posterior["theta_draws"]  # effective coefficients on the original scale
    gam = fit.posterior["gamma_draws"][..., 0].astype(float)
    y, x = df["y"].to_numpy(float), df["x1"].to_numpy()
    b0 = np.linspace(-1.5, 3.0, 901)  # the intercept's sd is ~0.1 given gamma = 0: a fine grid
    u = np.linspace(-6, 6, 961)
    du, db = u[1] - u[0], b0[1] - b0[0]
    G0, G1 = np.meshgrid(b0, u, indexing="ij")
    F = np.outer(x, G1.ravel()) + G0.ravel()
    slab = _laplace_slab_logdensity(u, A, B)
    log1 = (np.log(rho) - 2 * hinge_sum(y, F) - G0.ravel() ** 2 / 2e8).reshape(G0.shape) + slab[None, :]
    log0 = np.log1p(-rho) - 2 * hinge_sum(y, np.ones((x.size, 1)) * b0[None, :]) - b0 ** 2 / 2e8
    m = max(log1.max(), log0.max())
    j1 = np.exp(log1 - m) * du * db  # mass of the continuous part per cell
    j0 = np.exp(log0 - m) * db  # mass of gamma = 0 per intercept cell
    Z = j1.sum() + j0.sum()
    p_incl = j1.sum() / Z
    assert 0.1 < p_incl < 0.9, p_incl  # both components matter
    # inclusion probability: z-score with the ESS of the indicator draws
    n_eff = min(ess(gam), gam.size)
    z_incl = abs(gam.mean() - p_incl) / np.sqrt(p_incl * (1 - p_incl) / n_eff)
    # intercept marginal
    pv = {"intercept": ks_1samp_ess(th[..., 0], grid_cdf(b0, np.log(j1.sum(1) + j0)))}
    # u given gamma = 1 (the non-zero draws) against the normalised continuous part
    cont = cumulative_trapezoid(j1.sum(0) / du, u, initial=0.0)
    u_draws = th[..., 1]
    nz = [row[row != 0] for row in u_draws]
    n_keep = min(len(r) for r in nz)
    pv["u | gamma=1"] = ks_1samp_ess(np.stack([r[:n_keep] for r in nz]), lambda t: np.interp(t, u, cont / cont[-1]))
    assert np.array_equal(u_draws != 0, gam[..., None].squeeze(-1) == 1)  # u = 0 exactly iff gamma = 0
    report("Laplace-zero, 1 term + intercept", {**pv, "P(gamma=1) exact": p_incl,
                                                 "gibbs": gam.mean(), "z": z_incl})
    assert z_incl < 4, (gam.mean(), p_incl)
    assert min(pv.values()) > P_MIN, pv


# ------------------------------------------------------------------------------- missing data
def _log_marginal_imputation(xs_obs, xm_grid, sigma2_mu, psi, nu):
    """log p(x_obs, x_m) under x_i ~ N(mu, s2), mu ~ N(0, sigma2_mu), s2 ~ IW_1(psi, nu) =
    IG(nu/2, psi/2): mu integrated analytically, s2 on a log grid."""
    ls2 = np.linspace(-12, 8, 2001)
    s2 = np.exp(ls2)
    a, b = nu / 2, psi / 2
    log_prior = a * np.log(b) - special.gammaln(a) - (a + 1) * ls2 - b / s2 + ls2  # d s2 = s2 d log s2
    n = xs_obs.size + 1
    out = np.empty(xm_grid.size)
    for i, xm in enumerate(xm_grid):
        x = np.append(xs_obs, xm)
        sx, sxx = x.sum(), (x ** 2).sum()
        denom = s2 + n * sigma2_mu
        quad = (sxx - sigma2_mu * sx ** 2 / denom) / s2
        logdet = (n - 1) * ls2 + np.log(denom)
        ll = -0.5 * (n * np.log(2 * np.pi) + logdet + quad)
        out[i] = special.logsumexp(ll + log_prior) + np.log(ls2[1] - ls2[0])
    return out


@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_missing_one_cell_exact(seed, scale):
    """y ~ x - 1 with a fixed penalty and one missing x, imputation model with the paper's
    defaults (sigma2_mu = 1e8, Psi = 0.01, nu = 3 on the raw scale): the joint of
    (beta, x_missing) on a 2-d grid, the imputation parameters integrated out."""
    from vbsvm.models.missing import ImputedSVMModel
    from vbsvm.inference.gibbs import run_chains

    df = data(seed + 200, n=20)
    y, x = df["y"].to_numpy(float), df["x1"].to_numpy().copy()
    x[3] = np.nan
    alpha = 0.5
    model = ImputedSVMModel(x[:, None], y, [], np.array([4 * alpha]), [0])
    res = run_chains(model, draws=1000 * scale, tune=200, chains=2, thin=2, seed=seed, progress=False,
                     record=("theta", "x_missing"))
    beta_d = res.draws["theta"][..., 0]
    xm_d = res.draws["x_missing"][..., 0]
    obs = np.delete(x, 3)
    yo, ym = np.delete(y, 3), y[3]
    bg = np.linspace(-3, 6, 451)
    xg = np.linspace(-5, 5, 401)
    log_imp = _log_marginal_imputation(obs, xg, 1e8, 0.01, 3.0)
    lik_obs = -2 * hinge_sum(yo, np.outer(obs, bg)) - 2 * alpha * bg ** 2
    lik_m = -2 * np.maximum(0, 1 - ym * np.outer(bg, xg))
    logd = lik_obs[:, None] + lik_m + log_imp[None, :]
    joint = np.exp(logd - logd.max())
    pv = {"beta": ks_1samp_ess(beta_d, grid_cdf(bg, np.log(joint.sum(1)))),
          "x_missing": ks_1samp_ess(xm_d, grid_cdf(xg, np.log(joint.sum(0))))}
    report("missing: 1 cell", pv)
    assert min(pv.values()) > P_MIN, pv


def test_missing_one_cell_public_api_matches_model_level_sampler():
    """The public ``missing="impute"`` Gibbs fit reports the same sampler's draws on the original
    scale (here standardize=False, so they equal the model-level draws for the same seed)."""
    df = data(211, n=20)
    df.loc[3, "x1"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        fit = vbsvm.svm("y ~ x1 - 1", data=df, missing="impute", imputation="joint", method="gibbs", penalty=0.5,
                        standardize=False, draws=200, tune=50, chains=2, seed=5, progress=False)
    from vbsvm.models.missing import ImputedSVMModel
    from vbsvm.inference.gibbs import run_chains

    x = df["x1"].to_numpy()
    model = ImputedSVMModel(x[:, None], df["y"].to_numpy(float), [], np.array([2.0]), [0])
    res = run_chains(model, draws=200, tune=50, chains=2, seed=5, progress=False, record=("theta", "x_missing"))
    np.testing.assert_allclose(fit.posterior["theta_draws"], res.draws["theta"], rtol=1e-12)
    np.testing.assert_allclose(fit.posterior["x_missing_draws"], res.draws["x_missing"], rtol=1e-12)


# ------------------------------------------------------------------------------- GP
@pytest.mark.parametrize("seed,scale", SEEDS)
def test_gp_full_two_points_exact(seed, scale):
    """Full GP (inducing points = the two data points): the sampled bound model has target
    N(v; 0, I) prod_i exp{-(1 - y_i a_i v) - sqrt((1 - y_i a_i v)^2 + kt_i)} in the whitened
    coordinates (kt ~ jitter), i.e. exp(-2 sum hinge(f)) N(f; 0, K). f = A v is checked on a
    2-d grid."""
    from vbsvm.fitting.gp import gibbs_sparse
    from vbsvm.models.gp import RBF, InducingGP

    rng = np.random.default_rng(seed)
    X = np.array([[0.0], [0.8]])
    y = np.array([1.0, -1.0]) if rng.random() < 0.5 else np.array([1.0, 1.0])
    blocks = InducingGP(RBF(1.0, 2.0), X, jitter=1e-8)
    v, _ = gibbs_sparse(blocks, X, y, draws=1500 * scale, tune=200, chains=2, thin=2, seed=seed)
    A, kt = blocks.project(X)
    F = v @ A.T  # (chains, draws, 2)
    g = np.linspace(-6, 6, 601)
    F1, F2 = np.meshgrid(g, g, indexing="ij")
    Fg = np.vstack([F1.ravel(), F2.ravel()])
    V = np.linalg.solve(A, Fg)
    a = 1 - y[:, None] * Fg
    logd = (-0.5 * (V ** 2).sum(0) - (a + np.sqrt(a ** 2 + kt[:, None])).sum(0)).reshape(F1.shape)
    joint = np.exp(logd - logd.max())
    pv = {"f1": ks_1samp_ess(F[..., 0], grid_cdf(g, np.log(joint.sum(1)))),
          "f2": ks_1samp_ess(F[..., 1], grid_cdf(g, np.log(joint.sum(0))))}
    report("GP full, 2 points", pv)
    assert min(pv.values()) > P_MIN, pv


def test_exact_check_detects_a_wrong_sampler():
    """Power check of the KS machinery: the same quadrature target rejects draws from the
    posterior with the penalty off by a factor 2 (what a factor-2 bug in the prior precision
    would produce)."""
    df = data(11, n=25)
    y, x = df["y"].to_numpy(float), df["x1"].to_numpy()
    fit = gibbs("y ~ x1 - 1", df, scale=1, seed=11, penalty=1.4)  # wrong: 2 x 0.7
    grid = np.linspace(-4, 8, 12001)
    cdf = grid_cdf(grid, -2 * hinge_sum(y, np.outer(x, grid)) - 2 * 0.7 * grid ** 2)
    assert ks_1samp_ess(fit.posterior["theta_draws"][..., 0], cdf) < P_MIN


# ---------------------------------------------------------------- power of the checks for each Gibbs move
def _broken(monkeypatch, name, wrapper):
    """Break one move of the linear sampler. The fitted block moves of the fixed effects (which,
    once kept, would correct a broken variance or fixed-effect move) are dropped after tuning;
    their own power checks are in ``test_independence.py`` and ``test_hmc.py``."""
    from vbsvm.models.linear import LinearSVMModel

    monkeypatch.setattr(LinearSVMModel, name, wrapper(getattr(LinearSVMModel, name)))
    monkeypatch.setattr(LinearSVMModel, "block_min_accept", 2.0)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_variance_rescaling(monkeypatch):
    """The non-centred variance move without its Jacobian (``+ v``) is rejected."""
    _broken(monkeypatch, "variance_log_prior", lambda orig: lambda self, s2: orig(self, s2) - np.sum(np.log(s2)))
    with pytest.raises(AssertionError):
        test_intercept_and_penalized_coefficient_penalty_inferred(3, 1)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_level_move(monkeypatch):
    """The marginal move of the random intercepts with a prior 10x too tight is rejected."""
    _broken(monkeypatch, "_redraw_levels", lambda orig: lambda self, th, f, s2, rng: orig(self, th, f, s2 / 10, rng))
    with pytest.raises(AssertionError):
        test_random_intercept_two_groups_exact(3, 1)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_scale_move(monkeypatch):
    """The move along the common scale of the intercept, the levels and their variance with the
    variance's Jacobian of the wrong sign (``- 2t`` on the orbit's log density) is rejected. (The
    Jacobian merely dropped, ``- t``, passes at this length: the conjugate and non-centred
    variance steps of the same sweep pull the draws back; the slopes' check in
    ``test_random_slopes.py``, where this move carries the mixing, rejects a dropped Jacobian.)"""
    def wrong(orig):
        def orbit(self, theta, f, sigma2, covariances):
            logp, move = orig(self, theta, f, sigma2, covariances)
            return (lambda t: logp(t) - 2.0 * sigma2.size * t), move
        return orbit

    _broken(monkeypatch, "_scale_orbit", wrong)
    with pytest.raises(AssertionError):
        test_random_intercept_two_groups_exact(3, 1)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_fixed_effect_move(monkeypatch):
    """The marginal single-site move of the fixed effects with a prior 4x too tight is rejected."""
    _broken(monkeypatch, "_redraw_fixed_effects",
            lambda orig: lambda self, th, f, s2, rng, *a: orig(self, th, f, s2 / 4, rng, *a))
    with pytest.raises(AssertionError):
        test_intercept_and_penalized_coefficient_penalty_inferred(3, 1)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_add_delete_move(monkeypatch):
    """The Laplace-zero add/delete move without its proposal ratio (the t density of the added
    coefficient against its prior) is rejected by the exact Laplace-zero check (model jumps off)."""
    from vbsvm.models.selection import LaplaceZeroModel

    monkeypatch.setattr(LaplaceZeroModel, "flip_proposal_log_ratio", lambda self, v, loc, scale, sd: np.zeros_like(v))
    monkeypatch.setattr(LaplaceZeroModel, "JUMPS_PER_SWEEP", 0)  # the exact model jumps would correct it
    with pytest.raises(AssertionError):
        test_laplace_zero_one_term_with_intercept_exact(11, 1)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_laplace_zero_coefficient_move(monkeypatch):
    """The Laplace-zero model's marginal slice move of the coefficients in the model with their
    prior precision 25x too large is rejected by the exact Laplace-zero check at 4x the draws
    (p of ``u | gamma = 1``: 6e-13; at 1x 2e-4, near the threshold 1e-3, as the draw given w
    also moves the coefficient; the unbroken sampler at 4x: p >= 0.34)."""
    from vbsvm.models.selection import LaplaceZeroModel

    orig = LaplaceZeroModel.coefficient_moves
    monkeypatch.setattr(LaplaceZeroModel, "coefficient_moves",
                        lambda self, th, gam, b, s2, f, rng: orig(self, th, gam, 25 * np.asarray(b), s2, f, rng))
    monkeypatch.setattr(LaplaceZeroModel, "JUMPS_PER_SWEEP", 0)  # the exact model jumps would correct it
    with pytest.raises(AssertionError):
        test_laplace_zero_one_term_with_intercept_exact(11, 4)


@pytest.mark.slow
def test_exact_check_detects_a_wrong_model_jump(monkeypatch):
    """The Laplace-zero model jump without its proposal ratio (``q_M(x) / q_M'(x')``, the t
    densities of the two models' coordinates) is rejected by the exact Laplace-zero check."""
    from vbsvm.mcmc.model_jumps import ModelJumpTuner

    monkeypatch.setattr(ModelJumpTuner, "log_density", lambda self, state, k, x: 0.0)
    with pytest.raises(AssertionError):
        test_laplace_zero_one_term_with_intercept_exact(11, 1)
