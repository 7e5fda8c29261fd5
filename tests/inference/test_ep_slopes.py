"""Calibrated ``method="vb"`` with random slopes: EP under block (covariance) priors and the grid over
the covariance's log-Cholesky coordinates (:mod:`vbsvm.inference.ep`)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import vbsvm
from vbsvm.inference import ep
from vbsvm.models.linear import LinearSVMModel
from vbsvm.spd import spd_inverse, unpack_spd
from test_ep import assert_gradient_matches_differences, dense_ep


def slope_model(n=90, m=7, seed=0, penalty=True):
    """Random intercepts and slopes of x1 in m groups; C the dense design, level-major."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    codes = rng.integers(0, m, n)
    codes[:m] = np.arange(m)
    Z = X[:, :2]
    b = rng.multivariate_normal([0, 0], [[1.0, 0.3], [0.3, 0.5]], size=m)
    f = X @ np.r_[0.2, 1.0, -0.5] + np.einsum("ij,ij->i", Z, b[codes])
    y = np.where(f + rng.logistic(size=n) > 0, 1.0, -1.0)
    prec = np.r_[1e-2, np.full(2, np.nan if penalty else 0.5)]
    model = LinearSVMModel(X, y, [(codes, m, "g", Z)], prec)
    Zfull = np.zeros((n, 2 * m))
    Zfull[np.arange(n), 2 * codes] = Z[:, 0]
    Zfull[np.arange(n), 2 * codes + 1] = Z[:, 1]
    return model, np.hstack([X, Zfull])


def test_ep_with_a_covariance_block_matches_dense_transcription():
    """Fixed point, covariances and log Z_EP with a q x q prior block per level, against
    sequential EP with the full prior precision matrix formed."""
    model, C = slope_model(penalty=False)
    Sigma = np.array([[1.3, -0.4], [-0.4, 0.6]])
    Lam = spd_inverse(Sigma)
    tau = model.prior_precision([])
    blocks = model.prior_blocks([Lam])
    res = ep.expectation_propagation(model, tau, blocks=blocks, tol=1e-11, max_sweeps=3000)
    assert res.converged
    T = np.diag(tau)
    for idx in blocks[0][0]:
        T[np.ix_(idx, idx)] += Lam
    mu, S, log_z, tp, *_ = dense_ep(C, model.y, T)
    np.testing.assert_allclose(res.mean, mu, atol=1e-7)
    np.testing.assert_allclose(res.diag_cov, np.diag(S), rtol=1e-6)
    np.testing.assert_allclose(res.post.sparse_block_cov(),
                               np.array([S[np.ix_(i, i)] for i in blocks[0][0]]), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(res.site_prec, tp, rtol=1e-6, atol=1e-9)
    assert res.log_z == pytest.approx(log_z, abs=1e-7)


@pytest.mark.parametrize("q", [1, 2, 3])
def test_log_cholesky_prior_is_the_inverse_wishart_with_its_jacobian(q):
    """``log_cholesky_prior`` = scipy's IW log density + log |d vech(Sigma) / d v| by finite
    differences; and for q = 1 a density on the line."""
    rng = np.random.default_rng(q)
    Psi = np.eye(q) + 0.2 * np.ones((q, q))
    iw = vbsvm.distributions.InverseWishart(Psi, q + 2.5)
    k = q * (q + 1) // 2
    rows, cols = np.tril_indices(q)
    for _ in range(3):
        v = rng.normal(0, 0.5, k)
        J = np.empty((k, k))
        for j in range(k):
            e = np.zeros(k)
            e[j] = 1e-6
            J[:, j] = (unpack_spd(v + e, q)[rows, cols] - unpack_spd(v - e, q)[rows, cols]) / 2e-6
        expected = stats.invwishart(df=q + 2.5, scale=Psi).logpdf(unpack_spd(v, q)) + np.log(abs(np.linalg.det(J)))
        assert ep.log_cholesky_prior(iw, v) == pytest.approx(expected, rel=1e-7, abs=1e-7)
    if q == 1:
        from scipy import integrate
        total = integrate.quad(lambda x: np.exp(ep.log_cholesky_prior(iw, np.array([x]))), -20, 20)[0]
        assert total == pytest.approx(1.0, abs=1e-8)


def test_gradient_in_log_cholesky_coordinates_is_exact_at_fixed_point():
    """The analytic gradient of ``log Z_EP + log p(eta)`` (a log variance, then the covariance's
    three log-Cholesky coordinates) against central differences of the EP log evidence."""
    assert_gradient_matches_differences(slope_model(seed=2)[0], np.array([0.2, 0.1, -0.3, 0.25]))


def test_em_start_is_the_mode_of_the_covariance_conditional():
    """At an EM fixed point of the covariance coordinates the IW part of the gradient (without
    the Jacobian) vanishes: Sigma = (S + Psi) / (m + nu + q + 1)."""
    model, _ = slope_model(seed=3, penalty=False)
    ev = ep._Evidence(model, {"damping": 0.7, "tol": 1e-10, "max_sweeps": 3000})
    eta = np.zeros(3)
    res = ev.run(eta)[2]
    new = ev.em_start(eta, res)
    (levels, iw), = ev.covariances
    S = ev._scatters(res)[0]
    np.testing.assert_allclose(unpack_spd(new, 2), (S + iw.scale) / (levels + iw.df + 3.0), rtol=1e-10)


def slope_frame(n=240, m=12, seed=5):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, m, n)
    x = rng.normal(size=n)
    b = rng.multivariate_normal([0, 0], [[1.0, 0.4], [0.4, 0.6]], size=m)
    f = 0.3 + 1.2 * x + b[g, 0] + b[g, 1] * x
    return pd.DataFrame({"y": (f + rng.logistic(size=n) > 0).astype(int), "x": x,
                         "z": rng.normal(size=n), "g": [f"g{k}" for k in g]})


def test_calibrated_fit_with_random_slopes():
    """``method="vb"`` uses EP on the covariance grid (no mean-field fallback note), reports the
    covariance from the mixture's draws and scores new rows with the slopes' blocks."""
    d = slope_frame()
    fit = vbsvm.svm("y ~ x + z + (1 + x | g)", d, penalty=None, method="vb", seed=2)
    assert fit.info["approximation"].startswith("calibrated")
    assert "approximation_note" not in fit.info
    assert fit.info["grid_points"] > 10
    P = fit.posterior
    assert P["cov_draws"].shape == (4, 1000, 4)
    assert P["theta_cov_ss_blocks"].shape == (12, 2, 2)
    draws = P["cov_draws"].reshape(-1, 2, 2)
    assert np.all(np.linalg.eigvalsh(draws) > 0)
    vc = fit.varcomp()
    assert vc.loc["sigma2_g[x]", "mean"] == pytest.approx(draws[:, 1, 1].mean())
    cor = draws[:, 1, 0] / np.sqrt(draws[:, 0, 0] * draws[:, 1, 1])
    assert vc.loc["cor_g[Intercept,x]", "mean"] == pytest.approx(cor.mean())
    # the score's mean and sd (closed form from the mixture's moments and the level blocks)
    # against the stored iid draws of theta
    score = fit.predict(d.iloc[:30], kind="score")
    theta = P["theta_draws"].reshape(-1, P["theta_draws"].shape[-1])
    dense, sc = fit._new_rows(d.iloc[:30])
    F = theta[:, :3] @ dense.T
    codes, Z = sc
    F += theta[:, 3 + 2 * codes] * Z[:, 0] + theta[:, 4 + 2 * codes] * Z[:, 1]
    np.testing.assert_allclose(score["mean"], F.mean(0), atol=4 * F.std(0).max() / np.sqrt(4000))
    np.testing.assert_allclose(score["sd"], F.std(0), rtol=0.08)


@pytest.mark.parametrize("K,points", [(3, 15), (4, 25), (5, 27), (6, 45)])
def test_ccd_rule_is_exact_for_the_normal_density_and_its_second_moments(K, points):
    Z, log_w = ep.ccd_rule(K)
    assert Z.shape == (points, K) and np.all(Z[0] == 0)
    phi = stats.multivariate_normal(np.zeros(K), np.eye(K)).pdf(Z)
    w = np.exp(log_w)
    assert np.sum(w * phi) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(np.einsum("g,gi,gj->ij", w * phi, Z, Z), np.eye(K), atol=1e-12)
    np.testing.assert_allclose(Z.T @ (w * phi), 0.0, atol=1e-12)


@pytest.mark.parametrize("n,m,near_gaussian", [(600, 30, True), (160, 10, False)])
@pytest.mark.slow
def test_ccd_against_the_grid_and_the_auto_switch(n, m, near_gaussian):
    """Three log-Cholesky coordinates by CCD (15 EP runs) and by the regular grid. With 30 groups
    the log density is near Gaussian: CCD's mixture has fixed-effect means within 0.03 sd and sds
    within 3% of the grid's, and ``strategy="auto"`` keeps it. With 10 groups the slope
    variance's axis is skewed (side scales 0.67 and 1.69): CCD is 0.09 sd off, and "auto" takes
    the grid."""
    model, _ = slope_model(n=n, m=m, seed=4, penalty=False)
    ccd = ep.integrate_variances(model, strategy="ccd", tol=1e-8)
    auto = ep.integrate_variances(model, tol=1e-8)
    grid = auto if not near_gaussian else ep.integrate_variances(model, strategy="grid", dz=1.25, drop=8.0,
                                                                 max_points=1000, tol=1e-8)
    assert ccd.eta.shape == (15, 3)
    M = np.eye(model.qd)
    m_c, v_c = ep._moments(ccd, model, M)[:2]
    m_g, v_g = ep._moments(grid, model, M)[:2]
    sd_g = np.sqrt(v_g[:3])
    off = np.max(np.abs(m_c[:3] - m_g[:3]) / sd_g)
    if near_gaussian:
        assert auto.info["strategy"] == "ccd"
        assert off < 0.03
        np.testing.assert_allclose(np.sqrt(v_c[:3]) / sd_g, 1.0, atol=0.03)
        assert ccd.log_evidence == pytest.approx(grid.log_evidence, abs=0.05)
        # the split normal's draws of eta against the grid's marginals of eta (measured: means
        # 0.13 sd apart, sds within 10%)
        draws = ccd.sample_eta(np.zeros(20000, dtype=int), np.random.default_rng(1))
        grid_mean = grid.weights @ grid.eta
        grid_sd = np.sqrt(grid.weights @ (grid.eta - grid_mean) ** 2)
        assert np.max(np.abs(draws.mean(0) - grid_mean) / grid_sd) < 0.2
        np.testing.assert_allclose(draws.std(0) / grid_sd, 1.0, atol=0.15)
    else:
        assert auto.info["strategy"] == "grid" and "ccd_side_scales" in auto.info
        assert off > 0.05  # what the switch avoids
