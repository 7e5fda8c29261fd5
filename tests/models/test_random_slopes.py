"""Random slopes, lme4 syntax: ``(1 + x | g)`` with a q x q covariance under an inverse-Wishart
prior, next to random intercepts and the penalty.

* VB: the fixed point of the package's structured algebra (largest term eliminated by a block
  Schur complement, the others dense) equals one pass of a plain dense transcription
  (:func:`oracle.vb_iteration_random_effects`), for the slope term eliminated and for it dense;
  the ELBO never decreases.
* Gibbs: against an independent random-walk Metropolis on the marginal pseudo-posterior, with
  the covariance integrated out analytically (matrix-t: ``|Psi + sum_l b_l b_l'|^{-(nu + m)/2}``).
* Prediction and draws: the closed-form score moments of a VB fit equal Monte Carlo moments of
  its stored draws; save/load round trip.
* Recovery (``-m slow``): data drawn from the normalised hinge likelihood with known random
  slopes; Gibbs 95% intervals cover the fixed effects and the slope variance.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import special

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.exceptions import ConvergenceWarning, DiagnosticWarning, InputError
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.linear import LinearSVMModel
from vbsvm.models.linear_algebra import CoefficientPosterior, WorkingGram

from support.frames import slope_frame
from support.oracle import vb_iteration_random_effects
from support.statistics import ess, gibbs_fit, ks_2samp_ess, mean_z, rwm


SETTINGS = dict(penalty="auto", sigma2_beta=1e8, A_u=0.01, B_u=0.01, re_df=None, re_scale=None)


def _converged(formula, df):
    design = build_design(formula, df)
    model = LinearSVMModel.from_design(design, SETTINGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = coordinate_ascent(model, tol=1e-15, max_iter=20000)
    return model, res


@pytest.mark.parametrize("formula,slope_sparse", [
    ("y ~ x + z + (1 + x | g) + (1 | h)", True),     # 12 levels x 2: eliminated block; h dense
    ("y ~ x + z + (1 + x | h) + (1 | g)", False),    # 3 levels x 2: dense IW block; g eliminated
])
def test_vb_fixed_point_equals_dense_oracle(formula, slope_sparse):
    df = slope_frame(12, 10, seed=1)
    model, res = _converged(formula, df)
    q = res.q
    cov = model.covariance_components[0]
    assert (cov.index.min() >= model.qd) == slope_sparse
    C = model.dense_design()
    tau = model.prior_precision(np.full(len(model.variance_components), np.nan))
    tau[~model._diagonal_prior] = np.nan
    ig_groups = [c.index for c in model.variance_components]
    Aq = model.A + np.array([c.size for c in model.variance_components]) / 2
    mu, Sigma, chi, Bq, iw = vb_iteration_random_effects(
        C, model.y, tau, ig_groups, [cov.index], q["chi"] ** -0.5, Aq / q["variances"].b,
        [q["covariances"][0].mean_inv()], A=model.A, B=model.B, iw_df=[cov.df], iw_scale=[cov.scale])
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    assert rel(q["theta_mean"], mu) < 1e-6
    assert rel(q["theta_var"], np.diag(Sigma)) < 1e-6
    assert rel(q["chi"], chi) < 1e-6
    assert rel(q["variances"].b, Bq) < 1e-6
    assert iw[0][0] == q["covariances"][0].df
    assert rel(q["covariances"][0].scale, iw[0][1]) < 1e-6
    # the block covariances of the eliminated term are the dense inverse's blocks
    blocks = q["theta"].block_cov(cov.index)
    np.testing.assert_allclose(blocks, np.array([Sigma[np.ix_(r, r)] for r in cov.index]), rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("formula", ["y ~ x + z + (1 + x | g) + (1 | h)", "y ~ x + (1 + x | h) + (0 + z | g)"])
@pytest.mark.parametrize("accelerate", [False, True])
def test_elbo_never_decreases_with_slopes(formula, accelerate):
    df = slope_frame(12, 10, seed=2)
    model = LinearSVMModel.from_design(build_design(formula, df), SETTINGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = coordinate_ascent(model, tol=1e-12, max_iter=400, accelerate=accelerate)
    d = np.diff(res.elbo)
    assert np.all(d >= -1e-9 * np.abs(res.elbo[1:])), d.min()


def _inverse_wishart_draws(scale, df, rng):
    """One ``IW(scale, df)`` draw for each matrix of ``scale`` (..., q, q), written here apart from
    the package: the inverse of a Wishart(scale^-1, df) draw by the Bartlett decomposition."""
    q = scale.shape[-1]
    L = np.linalg.cholesky(np.linalg.inv(scale))
    A = np.zeros(scale.shape)
    diag, low = np.arange(q), np.tril_indices(q, -1)
    A[..., diag, diag] = np.sqrt(rng.chisquare(df - diag, size=scale.shape[:-2] + (q,)))
    A[..., low[0], low[1]] = rng.standard_normal(scale.shape[:-2] + (low[0].size,))
    LA = L @ A
    return np.linalg.inv(LA @ LA.swapaxes(-1, -2))


@pytest.mark.skipif(np.finfo(np.longdouble).eps > 1e-18, reason="the reference needs extended precision")
def test_schur_complement_stays_accurate_with_a_huge_augmentation_weight():
    """One row with w = 4e7 (a Gibbs draw next to the margin) in a level whose covariance has a
    weak direction: cond(D_l) ~ 1e7. The Schur complement of the eliminated levels against one
    computed in extended precision (2 x 2 inverses in closed form): with half solves
    (``L_l^{-1} G_l``) it is within 1e-3 (here 2e-5); with the explicit ``D_l^{-1}`` it is 0.06 off,
    its smallest eigenvalue 0.72."""
    df = slope_frame(40, 3, seed=1)
    model = LinearSVMModel.from_design(build_design("y ~ x + z + (1 + x | g)", df), dict(SETTINGS, penalty=None))
    w = np.ones(model.n)
    w[0] = 4e7
    r = model.y * (1 + w)
    Lam = np.linalg.inv(np.array([[50.0, 20.0], [20.0, 9.0]]))
    tau = model.prior_precision(np.zeros(0))
    post = CoefficientPosterior(model, w, tau, r, blocks=model.prior_blocks([Lam]))
    g = WorkingGram(model, w, r)
    A = g.A.astype(np.longdouble)
    A[np.diag_indices(model.qd)] += tau[: model.qd]
    D = (g.D + Lam).astype(np.longdouble)
    det = D[:, 0, 0] * D[:, 1, 1] - D[:, 0, 1] * D[:, 1, 0]
    adjugate = np.stack([np.stack([D[:, 1, 1], -D[:, 0, 1]], -1), np.stack([-D[:, 1, 0], D[:, 0, 0]], -1)], 1)
    Dinv = adjugate / det[:, None, None]
    G = g.G.astype(np.longdouble)
    S_ref = (A - np.einsum("lkd,lkj,lje->de", G, Dinv, G)).astype(float)
    assert max(np.linalg.cond(d) for d in g.D + Lam) > 1e6
    np.testing.assert_allclose(post.L @ post.L.T, S_ref, atol=1e-3)
    assert np.linalg.eigvalsh(S_ref).min() > 0.5


@pytest.mark.usefixtures("one_blas_thread")
@pytest.mark.parametrize("seed,scale,penalty", [pytest.param(5, 1, 0.25, id="fast"),
                                                pytest.param(9, 1, "auto", id="fast-auto"),
                                                pytest.param(51, 3, 0.25, id="slow", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_gibbs_against_rwm_with_covariance_integrated_out(seed, scale, penalty):
    """y ~ x + (1 + x | g), 6 groups x 8 rows; Sigma ~ IW(nu, Psi) integrated out in the target:
    prod_l N(b_l; 0, Sigma) IW(Sigma) -> |Psi + S|^{-(nu + m)/2}. A fixed penalty, or
    ``penalty="auto"`` with ``sigma2_u ~ IG(1, 1)`` integrated out likewise:
    N(beta_x; 0, sigma2_u) IG(sigma2_u) -> (1 + beta_x^2 / 2)^{-3/2}. The sweep's moves along the
    common scale of everything (:meth:`LinearSVMModel._rescale_everything`) and the shift between
    the levels and the fixed effects (:meth:`LinearSVMModel._shift_slope_locations`) run in both."""
    df = slope_frame(6, 8, seed=seed, sd=(0.8, 0.6))
    nu, Psi = 4.0, np.array([[1.0, 0.2], [0.2, 0.5]])
    inferred = penalty == "auto"
    fit = gibbs_fit("y ~ x + (1 + x | g)", df, scale=scale, seed=seed, tune=500, thin=1, penalty=penalty,
                    re_df=nu, re_scale=Psi, **(dict(A_u=1.0, B_u=1.0) if inferred else {}))
    lay = fit.layout
    levels = [str(v) for v in lay.groups["g"][0]]
    assert levels == [f"g{k:03d}" for k in range(6)]
    th = fit.posterior["theta_draws"]
    S = fit.posterior["cov_draws"].reshape(th.shape[:2] + (2, 2))
    gib = np.concatenate([th, S[..., [0, 1, 1], [0, 0, 1]]], -1)
    g = np.repeat(np.arange(6), 8)
    X = np.c_[np.ones(len(df)), df["x"].to_numpy()]
    y = np.where(df["y"].to_numpy() == 1, 1.0, -1.0)

    def logp(t):
        beta, b = t[:, :2], t[:, 2:].reshape(-1, 6, 2)
        f = X @ beta.T + np.einsum("ij,kij->ik", X, b[:, g, :])
        Sc = Psi + np.einsum("klj,kli->kji", b, b)
        slope_prior = -1.5 * np.log1p(0.5 * beta[:, 1] ** 2) if inferred else -2 * penalty * beta[:, 1] ** 2
        return (-2 * np.maximum(0, 1 - y[:, None] * f).sum(0) - beta[:, 0] ** 2 / 2e8
                + slope_prior - 0.5 * (nu + 6) * np.linalg.slogdet(Sc)[1])

    rng = np.random.default_rng(seed)
    K, d = 16, 2 + 12
    draws, _ = rwm(logp, 0.1 * rng.normal(size=(K, d)), 30000 * scale, rng, thin=10)
    b = draws[..., 2:].reshape(draws.shape[:2] + (6, 2))
    Sc = Psi + np.einsum("cdlj,cdli->cdji", b, b)
    S_rw = _inverse_wishart_draws(Sc, nu + 6, rng)  # one IW draw per RWM draw, from its full conditional
    ind = np.concatenate([draws, S_rw[..., [0, 1, 1], [0, 0, 1]]], -1)
    labels = ["b0", "x"] + [f"b_{k}_{j}" for k in range(6) for j in ("1", "x")] + ["S00", "S10", "S11"]
    bad = []
    for j, lab in enumerate(labels):
        z, p = mean_z(gib[..., j], ind[..., j]), ks_2samp_ess(gib[..., j], ind[..., j])
        if not (z < 4.0 and p > 1e-3):
            bad.append((lab, round(z, 2), p))
    assert min(ess(gib[..., j]) for j in range(len(labels))) > 100
    assert not bad, bad


@pytest.mark.slow
def test_gibbs_check_detects_a_wrong_slope_level_move(monkeypatch):
    """Power: the marginal move of the levels with a covariance 4x too small is rejected."""
    from vbsvm.models import linear

    original = linear.LinearSVMModel._redraw_slope_levels
    monkeypatch.setattr(linear.LinearSVMModel, "_redraw_slope_levels",
                        lambda self, theta, f, covs, rng: original(self, theta, f, [S / 4 for S in covs], rng))
    with pytest.raises(AssertionError):
        test_gibbs_against_rwm_with_covariance_integrated_out(5, 1, 0.25)


@pytest.mark.parametrize("broken", ["scale_jacobian", "shift_covariance"])
@pytest.mark.slow
def test_gibbs_check_detects_a_wrong_scale_or_shift_move(monkeypatch, broken):
    """Power: the comparison rejects the move along the common scale without the Jacobian of the
    covariance's three entries (``logp(t) - 3 t``), and the shift of the slope levels drawn with
    a covariance 4x too small."""
    from vbsvm.models import linear

    if broken == "scale_jacobian":
        original = linear.LinearSVMModel._scale_orbit

        def orbit(self, theta, f, sigma2, covariances):
            logp, move = original(self, theta, f, sigma2, covariances)
            return (lambda t: logp(t) - 3.0 * t), move

        monkeypatch.setattr(linear.LinearSVMModel, "_scale_orbit", orbit)
    else:
        original = linear.LinearSVMModel._shift_slope_locations
        monkeypatch.setattr(linear.LinearSVMModel, "_shift_slope_locations",
                            lambda self, theta, s2, covs, rng: original(self, theta, s2, [S / 4 for S in covs], rng))
    with pytest.raises(AssertionError):
        test_gibbs_against_rwm_with_covariance_integrated_out(5, 1, 0.25)


def test_slope_shift_maps_match_the_fixed_effects_and_keep_the_scores():
    """``X M = Z`` for a slope term whose columns have fixed effects (standardized design: the
    map carries the centring into the intercept); None without a fixed effect of the slope's
    predictor; the shift leaves every score unchanged and moves the fixed effects."""
    df = slope_frame(8, 6, seed=3)
    design = build_design("y ~ x + z + (1 + x | g)", df)
    model = LinearSVMModel.from_design(design, SETTINGS)
    (M,), Z = model._slope_maps, model._slope_terms[0][2]
    np.testing.assert_allclose(model.Cd[:, : model.p] @ M, Z, atol=1e-12)
    missing = LinearSVMModel.from_design(build_design("y ~ z + (1 + x | g)", df), SETTINGS)
    assert missing._slope_maps == [None]
    rng = np.random.default_rng(0)
    theta = rng.normal(size=model.q)
    Sigma = [np.array([[1.0, 0.3], [0.3, 0.5]])]
    shifted = model._shift_slope_locations(theta, np.ones(len(model.variance_components)), Sigma, rng)
    np.testing.assert_allclose(model.predictor(shifted), model.predictor(theta), atol=1e-10)
    assert np.abs(shifted[: model.p] - theta[: model.p]).max() > 1e-3


@pytest.mark.slow
def test_gibbs_check_detects_a_wrong_covariance_update(monkeypatch):
    """Power: a sampler whose IW step ignores the prior scale is rejected by the same comparison."""
    from vbsvm.models import linear

    original = linear.LinearSVMModel.covariance_posteriors

    def broken(self, scatters):
        return [vbsvm.distributions.InverseWishart(S + 1e-3 * np.eye(len(S)), c.df + 3 * len(c.index))
                for c, S in zip(self.covariance_components, scatters)]

    monkeypatch.setattr(linear.LinearSVMModel, "covariance_posteriors", broken)
    with pytest.raises(AssertionError):
        test_gibbs_against_rwm_with_covariance_integrated_out(5, 1, 0.25)
    monkeypatch.setattr(linear.LinearSVMModel, "covariance_posteriors", original)


@pytest.mark.usefixtures("one_blas_thread")
@pytest.mark.parametrize("seed,scale", [pytest.param(7, 1, id="fast"),
                                        pytest.param(71, 3, id="slow", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_laplace_zero_gibbs_with_slopes_against_rwm(seed, scale):
    """``y ~ x + (1 + x | g)`` with ``LaplaceZero(rho)`` on ``x``, 6 groups x 8 rows, against a
    random-walk Metropolis on the marginal pseudo-posterior with the indicator summed out and the
    covariance integrated out: ``log p(b0, v, log s, b) = log[rho L(v) + (1 - rho) L(0)]
    + log Laplace(v; s) + log IG(s^2; A, B) + log 2 s^2 - (nu + 6)/2 log|Psi + S_b|``, ``L(u)`` the
    hinge pseudo-likelihood with ``x``'s effect ``u``. Each kept RWM draw gets its indicator from
    the exact conditional and a covariance from its IW conditional. Exercises the Laplace-zero
    sweep's moves of the slope levels (:meth:`LaplaceZeroModel.random_effect_moves`)."""
    df = slope_frame(6, 8, seed=seed, sd=(0.8, 0.6), beta=(0.3, 0.5, 0.0))
    nu, Psi, rho, A, B = 4.0, np.array([[1.0, 0.2], [0.2, 0.5]]), 0.4, 2.0, 1.0
    fit = gibbs_fit("y ~ x + (1 + x | g)", df, scale=scale, seed=seed, tune=500, thin=1,
                    prior=vbsvm.LaplaceZero(rho=rho), A_u=A, B_u=B, re_df=nu, re_scale=Psi)
    th = fit.posterior["theta_draws"]  # effective coefficients: x's is gamma * v
    S = fit.posterior["cov_draws"].reshape(th.shape[:2] + (2, 2))
    gib = np.concatenate([th, fit.posterior["gamma_draws"].astype(float), S[..., [0, 1, 1], [0, 0, 1]]], -1)
    g = np.repeat(np.arange(6), 8)
    x = df["x"].to_numpy()
    X = np.c_[np.ones(len(df)), x]
    y = np.where(df["y"].to_numpy() == 1, 1.0, -1.0)

    def loglik(t, gamma):
        b = t[:, 3:].reshape(-1, 6, 2)
        f = t[:, 0] + x[:, None] * (gamma * t[:, 1]) + np.einsum("ij,kij->ik", X, b[:, g, :])
        return -2 * np.maximum(0, 1 - y[:, None] * f).sum(0)

    def log_odds(t):  # log P(gamma = 1 | rest) - log P(gamma = 0 | rest)
        return np.log(rho / (1 - rho)) + loglik(t, 1.0) - loglik(t, 0.0)

    def logp(t):
        ls, b = t[:, 2], t[:, 3:].reshape(-1, 6, 2)
        s = np.exp(ls)
        Sc = Psi + np.einsum("klj,kli->kji", b, b)
        return (np.logaddexp(np.log(rho) + loglik(t, 1.0), np.log1p(-rho) + loglik(t, 0.0))
                - t[:, 0] ** 2 / 2e8 - np.abs(t[:, 1]) / s - ls - 2 * A * ls - B / s ** 2
                - 0.5 * (nu + 6) * np.linalg.slogdet(Sc)[1])

    rng = np.random.default_rng(seed)
    K, d = 16, 3 + 12
    draws, _ = rwm(logp, 0.1 * rng.normal(size=(K, d)), int(30000 * scale), rng, thin=10)
    flat = draws.reshape(-1, d)
    gamma = (rng.random(flat.shape[0]) < special.expit(log_odds(flat))).astype(float).reshape(draws.shape[:2])
    b = draws[..., 3:].reshape(draws.shape[:2] + (6, 2))
    S_rw = _inverse_wishart_draws(Psi + np.einsum("cdlj,cdli->cdji", b, b), nu + 6, rng)
    ind = np.concatenate([draws[..., :1], (gamma * draws[..., 1])[..., None], draws[..., 3:], gamma[..., None],
                          S_rw[..., [0, 1, 1], [0, 0, 1]]], -1)
    labels = (["b0", "x"] + [f"b_{k}_{j}" for k in range(6) for j in ("1", "x")]
              + ["gamma_x", "S00", "S10", "S11"])
    bad = []
    for j, lab in enumerate(labels):
        z, p = mean_z(gib[..., j], ind[..., j]), ks_2samp_ess(gib[..., j], ind[..., j])
        if not (z < 4.0 and p > 1e-3):
            bad.append((lab, round(z, 2), p))
    assert 0.1 < gamma.mean() < 0.9  # the indicator is uncertain: the check covers both models
    assert min(ess(gib[..., j]) for j in range(len(labels))) > 100
    assert not bad, bad


@pytest.mark.slow
def test_laplace_zero_gibbs_check_detects_a_wrong_slope_level_move(monkeypatch):
    """Power: in the Laplace-zero sweep, the levels' move with a covariance 4x too small is rejected
    (at full length |z| reaches 49; a third of the draws suffices)."""
    from vbsvm.models import linear

    original = linear.LinearSVMModel._redraw_slope_levels
    monkeypatch.setattr(linear.LinearSVMModel, "_redraw_slope_levels",
                        lambda self, theta, f, covs, rng: original(self, theta, f, [S / 4 for S in covs], rng))
    with pytest.raises(AssertionError):
        test_laplace_zero_gibbs_with_slopes_against_rwm(7, 1 / 3)


@pytest.mark.slow
def test_laplace_zero_gibbs_check_detects_a_wrong_scale_move(monkeypatch):
    """Power: in the Laplace-zero sweep, the move along the common scale without the Jacobian of
    the covariance's three entries is rejected."""
    from vbsvm.models import linear

    original = linear.LinearSVMModel._scale_orbit

    def orbit(self, theta, f, sigma2, covariances):
        logp, move = original(self, theta, f, sigma2, covariances)
        return (lambda t: logp(t) - 3.0 * t), move

    monkeypatch.setattr(linear.LinearSVMModel, "_scale_orbit", orbit)
    with pytest.raises(AssertionError):
        test_laplace_zero_gibbs_with_slopes_against_rwm(7, 1 / 3)


@pytest.mark.parametrize("method", ["vb", "meanfield"])
@pytest.mark.slow
def test_vb_score_moments_match_its_draws_and_survive_save_load(tmp_path, method):
    """Both approximations (the calibrated one: EP over the five variance parameters by CCD, which
    warns that their posterior is skewed on these 30 small groups)."""
    df = slope_frame(30, 8, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = vbsvm.svm("y ~ x + z + (1 + x | g) + (1 | h)", df, seed=4, draws=4000, chains=2, method=method)
    new = df.iloc[::7]
    score = fit.predict_score(new)
    theta, _ = fit._draws()
    dense, sc = fit._new_rows(new)
    lay = fit.layout
    F = theta.reshape(-1, lay.q)[:, : lay.n_dense] @ dense.T
    from vbsvm.posterior.representations import add_sparse_score

    F = add_sparse_score(F, theta.reshape(-1, lay.q)[:, lay.n_dense:], sc)
    np.testing.assert_allclose(F.mean(0), score["mean"], atol=4 * score["sd"].max() / np.sqrt(F.shape[0]))
    np.testing.assert_allclose(F.std(0), score["sd"], rtol=0.08)
    fit.save(tmp_path / "slopes.nc")
    back = vbsvm.load(tmp_path / "slopes.nc")
    pd.testing.assert_frame_equal(back.predict_score(new), score)
    pd.testing.assert_frame_equal(back.varcomp(), fit.varcomp())
    assert list(fit.varcomp().index) == ["sigma2_u", "alpha", "sigma2_h", "sigma2_g[Intercept]", "sigma2_g[x]",
                                         "cor_g[Intercept,x]"]
    tree = fit.to_arviz()
    assert tree["posterior"]["b_g"].dims == ("chain", "draw", "g", "g_coef")
    assert list(tree["posterior"]["cor_g"].coords["g_pair"].values) == ["Intercept,x"]


@pytest.mark.slow
def test_toenail_random_slopes_by_vb_and_gibbs(toenail):
    formula = "y ~ time * terbinafine + (1 + time | patient_id)"
    vb = vbsvm.svm(formula, toenail, penalty=None)
    assert vb.info["converged"] and vb.info["model"].endswith("with random effects")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        gibbs = vbsvm.svm(formula, toenail, penalty=None, method="gibbs", draws=200, tune=100, chains=2,
                          seed=1, progress=False)
    for fit in (vb, gibbs):
        text = fit.summary().as_text()
        assert "cor_patient_id[Intercept,time]" in text and "sigma2_patient_id[time]" in text
        ranef = fit.ranef()["patient_id"]
        assert ranef.index.names == ["level", "coef"] and len(ranef) == 2 * 294
    assert "ess_bulk" in str(gibbs.summary().tables[2])  # R-hat and ESS of the variance components


def test_slopes_refused_with_joint_imputation_and_bad_iw_prior():
    """Slopes combine with LaplaceZero and conditional imputation (tests/test_combinations.py);
    the joint imputation model and a misfitting IW prior are refused."""
    df = slope_frame(8, 6, seed=1)
    df.loc[df.index[:3], "z"] = np.nan
    with pytest.raises(InputError, match="random slopes.*imputation='joint'"):
        vbsvm.svm("y ~ x + z + (1 + x | g)", df, missing="impute", imputation="joint")
    with pytest.raises(InputError, match="re_df"):
        vbsvm.svm("y ~ x + (1 + x | g)", df, re_df=0.5)
    with pytest.raises(InputError, match="re_scale"):
        vbsvm.svm("y ~ x + (1 + x | g)", df, re_scale=np.eye(3))


@pytest.mark.slow
@pytest.mark.usefixtures("one_blas_thread")
def test_gibbs_covers_pseudo_true_random_slope_parameters():
    """150 groups x 20 rows, slope sd 1, correlation 0.5, y from the hinge likelihood normalised
    over y. The hinge pseudo-likelihood is not normalised in y, so it cannot generate data and its
    parameters are not the generating ones (the fit inflates them, e.g. the intercept 0.3 -> 0.8):
    the target of the intervals is the pseudo-true value, estimated by Gibbs on 10x more groups
    from the same process. The 95% intervals of 4 x 1000 draws cover the fixed effects and the
    slope variance."""
    formula = "y ~ x + z + (1 + x | g)"
    kw = dict(penalty=None, method="gibbs", tune=1000, seed=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        fit = vbsvm.svm(formula, slope_frame(150, 20, seed=11, hinge=True), draws=1000, chains=4, **kw)
        ref = vbsvm.svm(formula, slope_frame(1500, 20, seed=12, hinge=True), draws=500, chains=2, **kw)
    coef, vc = fit.coef, fit.varcomp()
    truth = ref.coef["mean"]
    for term in ["Intercept", "x", "z"]:
        assert coef.loc[term, "2.5%"] < truth[term] < coef.loc[term, "97.5%"], (term, coef.loc[term], truth[term])
    s2 = ref.varcomp().loc["sigma2_g[x]", "mean"]
    assert vc.loc["sigma2_g[x]", "2.5%"] < s2 < vc.loc["sigma2_g[x]", "97.5%"], (vc, s2)
