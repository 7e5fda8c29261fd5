"""Shared tools of the reliability suite (no tests here).

* one- and two-sample Kolmogorov-Smirnov tests whose sample sizes are the *effective* sample
  sizes of MCMC draws (the iid p-value is anti-conservative for autocorrelated draws);
* Monte Carlo standard errors and a z-score for the difference of two MCMC means;
* quadrature helpers (normalised CDFs on grids);
* independent samplers written without the augmentation: a vectorized random-walk Metropolis
  (many chains at once, covariance adapted during burn-in only) and elliptical slice sampling;
* simulation-based calibration (Talts et al. 2018): ranks with random tie breaking and a
  chi-square uniformity test;
* a hash of arbitrary Python/pandas/numpy inputs (bad-input suite: inputs are never mutated);
* :func:`gibbs_fit`, the public-API Gibbs fit the exact and independent-sampler checks share.
"""

from __future__ import annotations

import hashlib
import pickle
import warnings

import numpy as np
import pandas as pd
from scipy import stats
from scipy.integrate import cumulative_trapezoid

import vbsvm
from vbsvm.exceptions import DiagnosticWarning


# --------------------------------------------------------------------------- MCMC statistics
def ess(draws) -> float:
    """Bulk effective sample size (rank-normalized, arviz-stats) of draws shaped (chains, draws)
    or (draws,)."""
    from arviz_stats.base import array_stats

    x = np.asarray(draws, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if np.ptp(x) == 0:
        return float(x.size)
    return float(array_stats.ess(x, chain_axis=0, draw_axis=1))


def mcse_mean(draws) -> float:
    """Monte Carlo standard error of the mean: sd / sqrt(ESS) (ESS capped at the draw count)."""
    x = np.asarray(draws, dtype=float)
    n_eff = min(ess(x), x.size)
    return float(x.std(ddof=1) / np.sqrt(n_eff))


def mean_z(a, b) -> float:
    """|mean(a) - mean(b)| in units of the combined Monte Carlo standard error."""
    se = np.hypot(mcse_mean(a), mcse_mean(b))
    return float(abs(np.mean(a) - np.mean(b)) / se) if se > 0 else 0.0


def ks_1samp_ess(draws, cdf) -> float:
    """KS p-value of MCMC ``draws`` (chains, draws) against an exact ``cdf``, with n = ESS."""
    x = np.asarray(draws, dtype=float)
    d = stats.kstest(x.ravel(), cdf).statistic
    n_eff = int(max(2, np.floor(min(ess(x), x.size))))
    return float(stats.kstwo.sf(d, n_eff))


def ks_2samp_ess(a, b) -> float:
    """Two-sample KS p-value with both sample sizes replaced by effective sample sizes."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    d = stats.ks_2samp(a.ravel(), b.ravel()).statistic
    na, nb = min(ess(a), a.size), min(ess(b), b.size)
    return float(stats.kstwo.sf(d, int(max(2, np.floor(na * nb / (na + nb))))))


# --------------------------------------------------------------------------- quadrature
def hinge_sum(y, F):
    """sum_i (1 - y_i f_i)_+ for each column of scores ``F`` (n, k)."""
    return np.maximum(0.0, 1.0 - y[:, None] * F).sum(0)


def grid_cdf(grid, logdens):
    """Normalised CDF (linear interpolation) of an unnormalised log density on a fine grid."""
    dens = np.exp(logdens - np.max(logdens))
    cdf = cumulative_trapezoid(dens, grid, initial=0.0)
    cdf = cdf / cdf[-1]
    return lambda x: np.interp(x, grid, cdf)


def discrete_cdf(values, weights):
    """CDF of a weighted point set (for marginals read off a multi-dimensional grid)."""
    order = np.argsort(values)
    v = np.asarray(values)[order]
    w = np.cumsum(np.asarray(weights)[order])
    w = w / w[-1]
    return lambda x: np.interp(x, v, w)


def mixture_cdf(component_cdf, weights):
    """CDF of a finite mixture: ``component_cdf(x)`` returns (len(x), K) values."""
    weights = np.asarray(weights, dtype=float) / np.sum(weights)
    return lambda x: component_cdf(np.atleast_1d(x)) @ weights


# --------------------------------------------------------------------------- independent samplers
def rwm(logp, x0, n_steps, rng, *, adapt=0.3, thin=10, scale=None):
    """Vectorized random-walk Metropolis: ``K = len(x0)`` chains run at once.

    ``logp`` maps an array (K, d) to (K,). During the first ``adapt`` fraction of the steps the
    Gaussian proposal covariance is re-estimated from the pooled recent states every 250 steps
    (``2.38^2 / d`` times the sample covariance); those steps are discarded, so the kept draws
    come from a fixed, symmetric proposal (a valid Metropolis chain). Returns the kept draws
    (K, n_keep, d) and the acceptance rate of the kept phase. No augmentation is involved: the
    target is whatever ``logp`` says.
    """
    x = np.array(x0, dtype=float)
    K, d = x.shape
    lp = logp(x)
    n_adapt = int(adapt * n_steps)
    cov = np.eye(d) * (0.1 if scale is None else scale) ** 2
    chol = np.linalg.cholesky(cov)
    hist = []
    kept = []
    acc = 0
    for t in range(n_steps):
        prop = x + rng.standard_normal((K, d)) @ chol.T
        lq = logp(prop)
        take = np.log(rng.random(K)) < lq - lp
        x[take] = prop[take]
        lp[take] = lq[take]
        if t < n_adapt:
            hist.append(x.copy())
            if (t + 1) % 250 == 0:
                h = np.concatenate(hist[-1000:])
                c = np.cov(h.T).reshape(d, d) + 1e-10 * np.eye(d)
                chol = np.linalg.cholesky(2.38 ** 2 / d * c)
        else:
            acc += take.sum()
            if (t - n_adapt) % thin == thin - 1:
                kept.append(x.copy())
    return np.stack(kept, axis=1), acc / (K * (n_steps - n_adapt))


def elliptical_slice(loglik, prior_chol, x0, n_steps, rng, thin=1):
    """Elliptical slice sampling (Murray, Adams & MacKay 2010) of
    ``N(x; 0, prior_chol prior_chol^T) exp(loglik(x))``, vectorized over chains ``x0`` (K, d).

    ``loglik`` maps (K, d) -> (K,). Returns the kept draws (K, n_keep, d)."""
    x = np.array(x0, dtype=float)
    K, d = x.shape
    ll = loglik(x)
    kept = []
    for t in range(n_steps):
        nu = rng.standard_normal((K, d)) @ prior_chol.T
        logy = ll + np.log(rng.random(K))
        theta = rng.uniform(0, 2 * np.pi, K)
        lo, hi = theta - 2 * np.pi, theta.copy()
        todo = np.ones(K, dtype=bool)
        new = x.copy()
        new_ll = ll.copy()
        for _ in range(200):
            if not todo.any():
                break
            prop = x * np.cos(theta)[:, None] + nu * np.sin(theta)[:, None]
            lp = loglik(prop)
            ok = todo & (lp > logy)
            new[ok] = prop[ok]
            new_ll[ok] = lp[ok]
            todo &= ~ok
            neg = todo & (theta < 0)
            pos = todo & (theta >= 0)
            lo[neg] = theta[neg]
            hi[pos] = theta[pos]
            theta = np.where(todo, rng.uniform(lo, hi), theta)
        assert not todo.any(), "elliptical slice sampler did not terminate"
        x, ll = new, new_ll
        if t % thin == thin - 1:
            kept.append(x.copy())
    return np.stack(kept, axis=1)


# --------------------------------------------------------------------------- SBC
def sbc_rank(truth, draws, rng):
    """Rank of ``truth`` among ``draws`` (L,) in 0..L, ties broken at random (discrete
    quantities such as indicators)."""
    draws = np.asarray(draws)
    below = int(np.sum(draws < truth))
    ties = int(np.sum(draws == truth))
    return below + int(rng.integers(0, ties + 1))


def uniformity_pvalue(ranks, L, bins=None):
    """Chi-square p-value of ranks in 0..L being uniform (bins of equal width over L + 1 values)."""
    ranks = np.asarray(ranks)
    n_val = L + 1
    if bins is None:
        bins = n_val
    assert n_val % bins == 0, "bins must divide L + 1"
    counts = np.bincount(ranks // (n_val // bins), minlength=bins)
    return float(stats.chisquare(counts).pvalue)


# --------------------------------------------------------------------------- hashing inputs
def fingerprint(obj) -> str:
    """Hash of an input object, including pandas values, dtypes, index and attrs."""
    h = hashlib.sha256()

    def feed(o):
        if isinstance(o, pd.DataFrame):
            h.update(b"DF")
            h.update(repr(list(o.columns)).encode())
            h.update(repr([str(t) for t in o.dtypes]).encode())
            h.update(pd.util.hash_pandas_object(o.index, index=False).values.tobytes())
            for c in o.columns:
                col = o[c]
                try:
                    h.update(pd.util.hash_pandas_object(col, index=False).values.tobytes())
                except TypeError:
                    h.update(repr(col.tolist()).encode())
                if isinstance(col.dtype, pd.CategoricalDtype):
                    h.update(repr(list(col.cat.categories)).encode())
            h.update(repr(o.attrs).encode())
        elif isinstance(o, pd.Series):
            feed(o.to_frame())
        elif isinstance(o, np.ndarray):
            h.update(repr((o.dtype.str, o.shape, o.flags.writeable)).encode())
            h.update(np.ascontiguousarray(o).tobytes() if o.dtype != object else repr(o.tolist()).encode())
        elif isinstance(o, dict):
            for k in sorted(o, key=repr):
                feed(k)
                feed(o[k])
        elif isinstance(o, (list, tuple)):
            h.update(type(o).__name__.encode())
            for x in o:
                feed(x)
        else:
            try:
                h.update(pickle.dumps(o))
            except Exception:
                h.update(repr(o).encode())

    feed(obj)
    return h.hexdigest()


# --------------------------------------------------------------------------- Gibbs through the API
def gibbs_fit(formula, df, *, scale, seed, tune, thin, **kw):
    """Gibbs fit through :func:`vbsvm.svm` on the original scale: 2 chains of ``1500 * scale``
    kept draws after ``tune``, thinned by ``thin``; ``kw`` overrides any setting."""
    settings = dict(method="gibbs", standardize=False, draws=int(1500 * scale), tune=tune, chains=2, thin=thin,
                    seed=seed, progress=False)
    settings.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        return vbsvm.svm(formula, data=df, **settings)


def assert_matches_multiple_imputation(gb, complete, formula, *, draws, tune):
    """Check a cut Gibbs fit ``gb`` of incomplete data against multiple imputation: 20 completions
    ``complete(x)`` of the data, ``x`` a draw of ``gb``'s imputation chain, each fitted by the plain
    linear Gibbs sampler (``draws`` and ``tune`` per fit), draws pooled; ``gb``'s means lie within
    0.3 pooled sd and its sds within a factor 0.8 to 1.25 of the pooled ones."""
    x = gb.posterior["x_missing_draws"].reshape(-1, len(gb.imputed))
    rng = np.random.default_rng(0)
    pool = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        for k in rng.choice(x.shape[0], 20, replace=False):
            fit = vbsvm.svm(formula, data=complete(x[k]), method="gibbs", draws=draws, tune=tune, chains=1,
                            seed=int(k), progress=False)
            pool.append(fit._theta_draws())
    pool = np.concatenate(pool)
    mean, sd = pool.mean(0), pool.std(0)
    assert np.all(np.abs(gb.coef["mean"].to_numpy() - mean) < 0.3 * sd)
    assert np.all((gb.coef["sd"].to_numpy() / sd > 0.8) & (gb.coef["sd"].to_numpy() / sd < 1.25))
