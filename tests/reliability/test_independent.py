"""(b) Gibbs samplers against independent samplers of the marginal pseudo-posterior.

The augmented Gibbs samplers of the package are compared, in moderate dimension, with samplers
written here directly on the *marginal* pseudo-posterior ``exp(-2 sum hinge) x prior`` — no
augmentation variables, variances integrated out analytically where conjugate:

* a vectorized random-walk Metropolis (many chains at once; proposal covariance adapted during
  burn-in only) for the linear SVM with p = 10 and the penalty inferred, for random intercepts
  with two grouping factors (one dense, one eliminated by the Schur complement) and three
  variance components, for the Laplace-zero prior (Metropolis moves on the continuous part and
  exact conditional flips of the indicators, Laplace slab density used directly) and for the
  imputation model (missing cells, mu and Sigma in a log-Cholesky parameterization, with the
  Jacobian);
* elliptical slice sampling for the sparse-GP bound model.

Criteria for every scalar compared: means within 4 Monte Carlo standard errors (MCSE from the
effective sample sizes of both samplers) and a two-sample KS test with effective sample sizes,
``p > 1e-3``. The normal suite runs one seed; ``-m slow`` runs three more seeds with longer runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import special

from support.statistics import elliptical_slice, ess, gibbs_fit, ks_2samp_ess, mean_z, rwm

pytestmark = pytest.mark.usefixtures("one_blas_thread")

P_MIN = 1e-3
Z_MAX = 4.0
SEEDS = [pytest.param(3, 1, id="fast")] + [
    pytest.param(s, 3, id=f"slow-seed{s}", marks=pytest.mark.slow) for s in (31, 32, 33)]


def _gibbs(formula, df, *, scale, seed, **kw):
    """Gibbs fit through the public API (draws scaled by ``scale``)."""
    return gibbs_fit(formula, df, scale=scale, seed=seed, **{"tune": 400, "thin": 1, **kw})


def _compare(name, gibbs, indep, labels):
    """gibbs: (chains, draws, k); indep: (chains', draws', k). Returns the worst z and p."""
    rows = []
    for j, lab in enumerate(labels):
        z = mean_z(gibbs[..., j], indep[..., j])
        p = ks_2samp_ess(gibbs[..., j], indep[..., j])
        rows.append((lab, z, p))
    e_g = min(ess(gibbs[..., j]) for j in range(len(labels)))
    e_i = min(ess(indep[..., j]) for j in range(len(labels)))
    print(f"[independent] {name} (min ESS Gibbs {e_g:.0f}, independent {e_i:.0f}): "
          + "; ".join(f"{lab}: z={z:.2f} p={p:.3g}" for lab, z, p in rows))
    bad = [(lab, round(z, 2), p) for lab, z, p in rows if not (z < Z_MAX and p > P_MIN)]
    assert not bad, bad
    return max(r[1] for r in rows), min(r[2] for r in rows)


def _ig_draws(rng, shape, scale):
    return scale / rng.gamma(shape, size=np.shape(scale))


# ------------------------------------------------------------------------------- p = 10, penalty
@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_linear_p10_penalty_inferred_against_rwm(seed, scale):
    rng = np.random.default_rng(seed)
    n, p = 80, 10
    X = rng.normal(size=(n, p))
    beta = np.r_[1.0, -0.8, 0.5, np.zeros(p - 3)]
    y = np.where(rng.random(n) < special.expit(0.3 + X @ beta), 1.0, -1.0)
    cols = [f"x{j}" for j in range(p)]
    df = pd.DataFrame(X, columns=cols).assign(y=y)
    A, B = 0.01, 0.01  # the paper's defaults
    fit = _gibbs("y ~ " + " + ".join(cols), df, scale=scale, seed=seed, penalty="auto")
    th = fit.posterior["theta_draws"]
    s2 = fit.posterior["sigma2_draws"]

    def logp(t):
        f = t[:, :1].T + X @ t[:, 1:].T
        return (-2 * np.maximum(0, 1 - y[:, None] * f).sum(0) - t[:, 0] ** 2 / 2e8
                - (A + p / 2) * np.log(B + 0.5 * (t[:, 1:] ** 2).sum(1)))

    K = 16
    draws, acc = rwm(logp, 0.1 * rng.normal(size=(K, p + 1)), 15000 * scale, rng, thin=10)
    s2_rw = _ig_draws(rng, A + p / 2, B + 0.5 * (draws[..., 1:] ** 2).sum(-1))
    assert 0.1 < acc < 0.5, acc
    _compare("p=10 penalty inferred", np.concatenate([th, s2], -1),
             np.concatenate([draws, s2_rw[..., None]], -1), ["(Intercept)"] + cols + ["sigma2_u"])


@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_linear_n_less_than_p_against_rwm(seed, scale):
    """n = 10 rows, p = 24 columns with a fixed penalty and a vague intercept: the regime where the
    data alone do not identify the coefficients (and where an n x n / Woodbury implementation of
    the coefficient block would be used)."""
    rng = np.random.default_rng(seed + 1000)
    n, p, alpha = 10, 24, 0.5
    X = rng.normal(size=(n, p))
    y = np.where(rng.random(n) < special.expit(X[:, 0] - X[:, 1]), 1.0, -1.0)
    cols = [f"x{j}" for j in range(p)]
    df = pd.DataFrame(X, columns=cols).assign(y=y)
    fit = _gibbs("y ~ " + " + ".join(cols), df, scale=scale, seed=seed, penalty=alpha)
    th = fit.posterior["theta_draws"]

    def logp(t):
        f = t[:, :1].T + X @ t[:, 1:].T
        return -2 * np.maximum(0, 1 - y[:, None] * f).sum(0) - t[:, 0] ** 2 / 2e8 - 2 * alpha * (t[:, 1:] ** 2).sum(1)

    draws, acc = rwm(logp, 0.1 * rng.normal(size=(16, p + 1)), 15000 * scale, rng, thin=10)
    pick = [0, 1, 2, 3, p]  # intercept, two active and one inactive column, the last column
    _compare("n=10 < p=24, fixed penalty", th[..., pick], draws[..., pick],
             ["(Intercept)", "x0", "x1", "x2", f"x{p - 1}"])


# ------------------------------------------------------------------------------- two factors
@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_two_random_intercepts_and_penalty_against_rwm(seed, scale):
    """y ~ x1 + x2 + (1 | g) + (1 | h): g (8 levels) is the Schur-eliminated factor, h (3 levels)
    is dense; sigma2_u, sigma2_g, sigma2_h ~ IG(A, B) are integrated out in the target."""
    rng = np.random.default_rng(seed)
    G, Hn, reps = 8, 3, 3
    g = np.repeat(np.arange(G), Hn * reps)
    h = np.tile(np.repeat(np.arange(Hn), reps), G)
    n = g.size
    X = rng.normal(size=(n, 2))
    ug, uh = rng.normal(0, 1.0, G), rng.normal(0, 0.7, Hn)
    y = np.where(rng.random(n) < special.expit(X @ [1.0, -0.5] + ug[g] + uh[h]), 1.0, -1.0)
    df = pd.DataFrame({"y": y, "x1": X[:, 0], "x2": X[:, 1], "g": [f"g{k}" for k in g],
                       "h": [f"h{k}" for k in h]})
    A, B = 1.0, 1.0
    fit = _gibbs("y ~ x1 + x2 + (1 | g) + (1 | h)", df, scale=scale, seed=seed, penalty="auto",
                 A_u=A, B_u=B)
    lay = fit.layout
    order = np.r_[0, 1, 2, lay.groups["g"][1], lay.groups["h"][1]]
    th = fit.posterior["theta_draws"][..., order]
    vnames = lay.variances
    s2 = fit.posterior["sigma2_draws"][..., [vnames.index(v) for v in ("sigma2_u", "sigma2_g", "sigma2_h")]]
    gl = [str(v) for v in lay.groups["g"][0]]
    hl = [str(v) for v in lay.groups["h"][0]]
    assert gl == [f"g{k}" for k in range(G)] and hl == [f"h{k}" for k in range(Hn)]

    def logp(t):
        b0, b, u_g, u_h = t[:, 0], t[:, 1:3], t[:, 3:3 + G], t[:, 3 + G:]
        f = b0[None, :] + X @ b.T + u_g[:, g].T + u_h[:, h].T
        return (-2 * np.maximum(0, 1 - y[:, None] * f).sum(0) - b0 ** 2 / 2e8
                - (A + 1.0) * np.log(B + 0.5 * (b ** 2).sum(1))
                - (A + G / 2) * np.log(B + 0.5 * (u_g ** 2).sum(1))
                - (A + Hn / 2) * np.log(B + 0.5 * (u_h ** 2).sum(1)))

    K = 16
    d = 3 + G + Hn
    draws, acc = rwm(logp, 0.1 * rng.normal(size=(K, d)), 25000 * scale, rng, thin=10)
    s2_rw = np.stack([_ig_draws(rng, A + 1.0, B + 0.5 * (draws[..., 1:3] ** 2).sum(-1)),
                      _ig_draws(rng, A + G / 2, B + 0.5 * (draws[..., 3:3 + G] ** 2).sum(-1)),
                      _ig_draws(rng, A + Hn / 2, B + 0.5 * (draws[..., 3 + G:] ** 2).sum(-1))], -1)
    labels = ["b0", "x1", "x2"] + [f"u_g{k}" for k in range(G)] + [f"u_h{k}" for k in range(Hn)]
    _compare("two random intercepts + penalty", np.concatenate([th, s2], -1),
             np.concatenate([draws, s2_rw], -1), labels + ["sigma2_u", "sigma2_g", "sigma2_h"])


# ------------------------------------------------------------------------------- Laplace-zero
@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_laplace_zero_against_metropolis_with_indicator_flips(seed, scale):
    """Target p(b0, v, gamma, sigma_u | y) ~ exp(-2 sum hinge(b0 + X (gamma * v))) N(b0; 0, 1e8)
    prod_k Laplace(v_k; sigma_u) Bern(gamma_k; rho) IG(sigma_u^2; A, B): Metropolis on
    (b0, v, log sigma_u), exact conditional draws of each gamma_k (two likelihood evaluations)."""
    from vbsvm.models.priors import LaplaceZero

    rng = np.random.default_rng(seed)
    n, m = 50, 4
    X = rng.normal(size=(n, m))
    y = np.where(rng.random(n) < special.expit(0.2 + X @ [1.2, 0.0, 0.4, 0.0]), 1.0, -1.0)
    cols = [f"z{k}" for k in range(m)]
    df = pd.DataFrame(X, columns=cols).assign(y=y)
    A, B, rho = 2.0, 1.0, 0.3
    fit = _gibbs("y ~ " + " + ".join(cols), df, scale=scale, seed=seed, prior=LaplaceZero(rho=rho),
                 A_u=A, B_u=B)
    th = fit.posterior["theta_draws"]
    gam = fit.posterior["gamma_draws"].astype(float)
    s2 = fit.posterior["sigma2_draws"][..., 0]

    K = 16
    state = {"gamma": np.ones((K, m))}

    def loglik(t, gm):
        f = t[:, :1].T + X @ (gm * t[:, 1:1 + m]).T
        return -2 * np.maximum(0, 1 - y[:, None] * f).sum(0)

    def logprior(t):
        ls = t[:, -1]
        s = np.exp(ls)
        lap = (-np.abs(t[:, 1:1 + m]) / s[:, None]).sum(1) - m * np.log(2 * s)
        # sigma_u^2 = s^2 ~ IG(A, B), density in log s: (s^2)^(-A-1) e^{-B/s^2} * 2 s^2
        return -t[:, 0] ** 2 / 2e8 + lap - 2 * A * ls - B / s ** 2

    def logp(t):
        return loglik(t, state["gamma"]) + logprior(t)

    # wrap rwm: after every Metropolis step, refresh each gamma_k from its exact conditional
    x = np.c_[0.1 * rng.normal(size=(K, 1 + m)), np.zeros(K)]
    kept_t, kept_g = [], []
    n_steps, n_adapt, thin = 10000 * scale, 3000, 5
    chol = 0.1 * np.eye(m + 2)
    hist = []
    lp = logp(x)
    for it in range(n_steps):
        prop = x + rng.standard_normal(x.shape) @ chol.T
        lq = logp(prop)
        take = np.log(rng.random(K)) < lq - lp
        x[take] = prop[take]
        for k in range(m):
            g1, g0 = state["gamma"].copy(), state["gamma"].copy()
            g1[:, k], g0[:, k] = 1.0, 0.0
            l1 = loglik(x, g1) + np.log(rho)
            l0 = loglik(x, g0) + np.log1p(-rho)
            state["gamma"][:, k] = (rng.random(K) < special.expit(l1 - l0)).astype(float)
        lp = logp(x)
        if it < n_adapt:
            hist.append(x.copy())
            if (it + 1) % 250 == 0:
                hh = np.concatenate(hist[-1000:])
                chol = np.linalg.cholesky(2.38 ** 2 / (m + 2) * np.cov(hh.T) + 1e-10 * np.eye(m + 2))
        elif (it - n_adapt) % thin == thin - 1:
            kept_t.append(x.copy())
            kept_g.append(state["gamma"].copy())
    T = np.stack(kept_t, 1)
    Gm = np.stack(kept_g, 1)
    u_rw = np.concatenate([T[..., :1], Gm * T[..., 1:1 + m]], -1)
    s2_rw = np.exp(2 * T[..., -1])
    # inclusion probabilities
    zs = []
    for k in range(m):
        a, b = gam[..., k], Gm[..., k]
        se = np.hypot(a.std() / np.sqrt(max(2, min(ess(a), a.size))), b.std() / np.sqrt(max(2, min(ess(b), b.size))))
        zs.append(abs(a.mean() - b.mean()) / max(se, 1e-12))
    print(f"[independent] Laplace-zero P(gamma=1): gibbs {gam.mean((0, 1)).round(3)}, "
          f"independent {Gm.mean((0, 1)).round(3)}, z {np.round(zs, 2)}")
    assert max(zs) < Z_MAX, zs
    _compare("Laplace-zero (u = gamma v)", np.concatenate([th, s2[..., None]], -1),
             np.concatenate([u_rw, s2_rw[..., None]], -1), ["b0"] + cols + ["sigma2_u"])


# ------------------------------------------------------------------------------- missing data
@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_missing_data_against_rwm(seed, scale):
    """Two predictors with missing cells, intercept, fixed penalty; imputation model with the
    paper's defaults (sigma2_mu = 1e8, Psi = 0.01 I, nu = 3). Independent target over
    (beta, missing cells, mu, log-Cholesky(Sigma)) with the Jacobian of the parameterization."""
    rng = np.random.default_rng(seed)
    n = 40
    Sig = np.array([[1.0, 0.6], [0.6, 1.0]])
    D = rng.multivariate_normal([0.5, -0.3], Sig, size=n)
    y = np.where(rng.random(n) < special.expit(0.2 + D @ [1.0, -0.7]), 1.0, -1.0)
    miss = np.zeros((n, 2), dtype=bool)
    miss[[1, 4, 9, 15], 0] = True
    miss[[2, 7, 20], 1] = True
    miss[30, :] = True
    Dn = np.where(miss, np.nan, D)
    df = pd.DataFrame({"y": y, "a": Dn[:, 0], "b": Dn[:, 1]})
    alpha = 0.5
    fit = _gibbs("y ~ a + b", df, scale=scale, seed=seed, penalty=alpha, missing="impute", imputation="joint",
                 draws=700 * scale, tune=200)
    post = fit.posterior
    cells = np.argwhere(miss)  # row-major, as the model orders them
    gd = np.concatenate([post["theta_draws"], post["x_missing_draws"], post["mu_draws"],
                         post["Sigma_draws"][..., [0, 1, 1], [0, 0, 1]]], -1)
    nc = len(cells)
    Psi, nu, s2mu = 0.01 * np.eye(2), 3.0, 1e8

    def unpack(t):
        beta, c, mu = t[:, :3], t[:, 3:3 + nc], t[:, 3 + nc:5 + nc]
        l11, l21, l22 = np.exp(t[:, 5 + nc]), t[:, 6 + nc], np.exp(t[:, 7 + nc])
        return beta, c, mu, l11, l21, l22

    def logp(t):
        beta, c, mu, l11, l21, l22 = unpack(t)
        K = t.shape[0]
        Dk = np.repeat(np.where(miss, 0.0, D)[None], K, 0)
        Dk[:, cells[:, 0], cells[:, 1]] = c
        f = beta[:, :1] + np.einsum("knj,kj->kn", Dk, beta[:, 1:])
        lp = -2 * np.maximum(0, 1 - y[None] * f).sum(1) - beta[:, 0] ** 2 / 2e8 - 2 * alpha * (beta[:, 1:] ** 2).sum(1)
        # d_i ~ N(mu, Sigma), Sigma = L L^T
        r = Dk - mu[:, None, :]
        z1 = r[..., 0] / l11[:, None]
        z2 = (r[..., 1] - l21[:, None] * z1) / l22[:, None]
        lp += -0.5 * (z1 ** 2 + z2 ** 2).sum(1) - n * (np.log(l11) + np.log(l22))
        lp += -(mu ** 2).sum(1) / (2 * s2mu)
        # IW(Psi, nu): |S|^{-(nu+3)/2} exp(-tr(Psi S^-1)/2); S^-1 = L^-T L^-1
        logdet = 2 * (np.log(l11) + np.log(l22))
        i11, i22, i21 = 1 / l11, 1 / l22, -l21 / (l11 * l22)
        tr = Psi[0, 0] * (i11 ** 2 + i21 ** 2) + Psi[1, 1] * i22 ** 2 + 2 * Psi[0, 1] * i21 * i22
        lp += -(nu + 3) / 2 * logdet - tr / 2
        # Jacobian of (log l11, l21, log l22) -> S: |dS/dL| = 4 l11^2 l22, times l11 l22 (logs)
        lp += 3 * np.log(l11) + 2 * np.log(l22)
        return lp

    K = 16
    d = 8 + nc
    x0 = np.c_[0.1 * rng.normal(size=(K, 3)), 0.1 * rng.normal(size=(K, nc)), 0.1 * rng.normal(size=(K, 2)),
               np.zeros((K, 1)), 0.1 * rng.normal(size=(K, 1)), np.zeros((K, 1))]
    draws, acc = rwm(logp, x0, 16000 * scale, rng, thin=8)
    beta, c, mu, l11, l21, l22 = unpack(draws.reshape(-1, d))
    S = np.stack([l11 ** 2, l11 * l21, l21 ** 2 + l22 ** 2], -1)
    rw = np.concatenate([beta, c, mu, S], -1).reshape(K, -1, 3 + nc + 5)
    labels = (["b0", "a", "b"] + [f"x[{i},{'ab'[j]}]" for i, j in cells] + ["mu_a", "mu_b"]
              + ["Sigma_aa", "Sigma_ab", "Sigma_bb"])
    _compare("missing data", gd, rw, labels)


# ------------------------------------------------------------------------------- sparse GP
@pytest.mark.parametrize("seed,scale", SEEDS)
@pytest.mark.slow
def test_sparse_gp_gibbs_against_elliptical_slice(seed, scale):
    """m = 6 inducing points, n = 40: the bound model in whitened coordinates,
    N(v; 0, I) prod_i exp{-(1 - y_i a_i v) - sqrt((1 - y_i a_i v)^2 + kt_i)}, sampled by
    elliptical slice sampling; compared on v and on f at three test inputs."""
    from vbsvm.fitting.gp import gibbs_sparse
    from vbsvm.models.gp import RBF, Constant, InducingGP, select_inducing

    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(40, 1))
    y = np.where(np.sin(2 * X[:, 0]) + 0.4 * rng.normal(size=40) > 0, 1.0, -1.0)
    blocks = InducingGP(RBF(0.8, 1.5) + Constant(0.5), select_inducing(X, 6, rng=1), jitter=1e-6)
    v, _ = gibbs_sparse(blocks, X, y, draws=2000 * scale, tune=300, chains=2, thin=2, seed=seed)
    A, kt = blocks.project(X)

    def loglik(V):
        a = 1 - y[None, :] * (V @ A.T)
        return -(a + np.sqrt(a ** 2 + kt[None, :])).sum(1)

    K = 16
    es = elliptical_slice(loglik, np.eye(blocks.m), np.zeros((K, blocks.m)), 2500 * scale, rng, thin=2)[:, 250:]
    At, _ = blocks.project(np.array([[-1.5], [0.1], [1.7]]))
    g = np.concatenate([v, v @ At.T], -1)
    e = np.concatenate([es, es @ At.T], -1)
    _compare("sparse GP", g, e, [f"v{k}" for k in range(blocks.m)] + ["f(-1.5)", "f(0.1)", "f(1.7)"])


@pytest.mark.slow
def test_independent_comparison_detects_a_wrong_penalty():
    """Power check: the same RWM target with the penalty variance integrated out is rejected
    when the Gibbs run uses a fixed penalty instead (the kind of discrepancy a dropped
    variance update would produce)."""
    rng = np.random.default_rng(3)
    n, p = 60, 3
    X = rng.normal(size=(n, p))
    y = np.where(rng.random(n) < special.expit(X @ [1.5, -1.0, 0.5]), 1.0, -1.0)
    df = pd.DataFrame(X, columns=["a", "b", "c"]).assign(y=y)
    fit = _gibbs("y ~ a + b + c - 1", df, scale=1, seed=3, penalty=2.0)
    A, B = 0.01, 0.01

    def logp(t):
        f = X @ t.T
        return -2 * np.maximum(0, 1 - y[:, None] * f).sum(0) - (A + p / 2) * np.log(B + 0.5 * (t ** 2).sum(1))

    draws, _ = rwm(logp, 0.1 * rng.normal(size=(16, p)), 8000, rng, thin=10)
    th = fit.posterior["theta_draws"]
    worst = max(mean_z(th[..., j], draws[..., j]) for j in range(p))
    assert worst > Z_MAX
