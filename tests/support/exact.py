"""Exact-posterior checks shared by the Gibbs tests: quadrature marginals of small models against
the draws (one-sample KS with effective sample sizes, threshold ``P_MIN``)."""

import numpy as np
import pandas as pd
from scipy import special, stats
from scipy.special import gammaln

from support.statistics import gibbs_fit, grid_cdf, hinge_sum, ks_1samp_ess, mixture_cdf

#: smallest p-value a correct sampler passes at
P_MIN = 1e-3


def gibbs(formula, df, *, scale, seed, **kw):
    """Gibbs fit through the public API (draws scaled by ``scale``)."""
    return gibbs_fit(formula, df, scale=scale, seed=seed, **{"tune": 300, "thin": 1, **kw})


def data(seed, n=30, p=1, intercept=0.3, beta=1.5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    eta = intercept + X @ np.full(p, beta / np.sqrt(p))
    y = np.where(rng.random(n) < special.expit(eta), 1, -1)
    df = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(p)])
    df.insert(0, "y", y)
    return df


def report(name, pvals):
    print(f"[exact] {name}: " + ", ".join(f"{k} p={v:.3g}" for k, v in pvals.items()))


def ig_mixture_cdf(shape, B, r2, weights, bins=400):
    """CDF of sigma2 | y = sum over grid points of w * IG(shape, B + r2 / 2), with the grid
    points binned by r2 (quantile bins of the posterior weight) to keep the mixture small."""
    w = weights / weights.sum()
    order = np.argsort(r2)
    cw = np.cumsum(w[order])
    idx = np.empty(r2.size, dtype=int)
    idx[order] = np.minimum((cw * bins).astype(int), bins - 1)
    wb = np.bincount(idx, weights=w, minlength=bins)
    rb = np.bincount(idx, weights=w * r2, minlength=bins) / np.maximum(wb, 1e-300)
    keep = wb > 0
    comp = lambda s: stats.invgamma.cdf(s[:, None], shape, scale=B + rb[keep][None, :] / 2)
    return mixture_cdf(comp, wb[keep])


# ------------------------------------------------------------------------------- linear


def intercept_and_penalized_coefficient_penalty_inferred(seed, scale):
    """Vague N(0, 1e8) intercept (never penalized) + one penalized slope, sigma2_u integrated."""
    df = data(seed, n=30, intercept=0.8)
    A, B = 1.0, 1.0
    fit = gibbs("y ~ x1", df, scale=scale, seed=seed, penalty="auto", A_u=A, B_u=B)
    th = fit.posterior["theta_draws"]
    y, x = df["y"].to_numpy(float), df["x1"].to_numpy()
    b0 = np.linspace(-4, 5, 451)
    b1 = np.linspace(-4, 9, 651)
    G0, G1 = np.meshgrid(b0, b1, indexing="ij")
    F = np.outer(x, G1.ravel()) + G0.ravel()
    logd = (-2 * hinge_sum(y, F) - G0.ravel() ** 2 / 2e8
            - (A + 0.5) * np.log(B + G1.ravel() ** 2 / 2)).reshape(G0.shape)
    joint = np.exp(logd - logd.max())
    pv = {"intercept": ks_1samp_ess(th[..., 0], grid_cdf(b0, np.log(joint.sum(1)))),
          "slope": ks_1samp_ess(th[..., 1], grid_cdf(b1, np.log(joint.sum(0))))}
    report("intercept + penalized slope", pv)
    assert min(pv.values()) > P_MIN, pv


def random_intercept_two_groups(seed, scale):
    """y ~ 1 + (1 | g) with two levels: (b0, u1, u2) on a 3-d grid, sigma2_g integrated out:
    p ~ exp(-2 [H1(b0 + u1) + H2(b0 + u2)]) N(b0; 0, 1e8) (B + (u1^2 + u2^2)/2)^-(A+1)."""
    rng = np.random.default_rng(seed)
    g = np.repeat([0, 1], [12, 10])
    y = np.where(rng.random(g.size) < np.where(g == 0, 0.7, 0.35), 1, -1)
    df = pd.DataFrame({"y": y, "g": np.array(["a", "b"])[g]})
    A, B = 2.0, 1.0
    fit = gibbs("y ~ 1 + (1 | g)", df, scale=scale, seed=seed, penalty=None, A_u=A, B_u=B)
    th = fit.posterior["theta_draws"]  # (b0, u_a, u_b)
    s2 = fit.posterior["sigma2_draws"][..., 0]
    b0 = np.linspace(-9, 9, 181)
    u = np.linspace(-9, 9, 181)
    S = b0[:, None] + u[None, :]
    H = [hinge_sum(y[g == k], S.ravel()[None, :] * np.ones((np.sum(g == k), 1))).reshape(S.shape)
         for k in (0, 1)]
    r2 = u[:, None] ** 2 + u[None, :] ** 2
    logd = (-2 * H[0][:, :, None] - 2 * H[1][:, None, :] - b0[:, None, None] ** 2 / 2e8
            - (A + 1) * np.log(B + r2[None] / 2))
    joint = np.exp(logd - logd.max())
    pv = {"b0": ks_1samp_ess(th[..., 0], grid_cdf(b0, np.log(joint.sum((1, 2))))),
          "u_a": ks_1samp_ess(th[..., 1], grid_cdf(u, np.log(joint.sum((0, 2))))),
          "u_b": ks_1samp_ess(th[..., 2], grid_cdf(u, np.log(joint.sum((0, 1)))))}
    pv["sigma2_g"] = ks_1samp_ess(s2, ig_mixture_cdf(A + 1, B, r2.ravel(), joint.sum(0).ravel()))
    report("random intercept, 2 groups", pv)
    assert min(pv.values()) > P_MIN, pv


def laplace_zero_marginal_prior(u, A, B):
    """p(u | gamma = 1) = int Laplace(u; 0, sqrt(s2)) IG(s2; A, B) ds2 by quadrature on log s2."""
    ls = np.linspace(-12, 12, 4001)
    s2 = np.exp(ls)
    sig = np.sqrt(s2)
    ig = np.exp(A * np.log(B) - gammaln(A) - (A + 1) * ls - B / s2) * s2  # density in log s2
    dens = np.exp(-np.abs(u)[:, None] / sig[None, :]) / (2 * sig[None, :]) * ig[None, :]
    return np.trapezoid(dens, ls, axis=1)
