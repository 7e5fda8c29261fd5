"""fit.loo(): PSIS weights of the pseudo-likelihood, a class probability as the predictive.

The measurement on real data (toenail against a logistic GLMM) and the nested-model simulation are
in ``benchmarks/loo.py`` (``benchmarks/results/loo.md``); here: the weights, a small held-out check
and, marked slow, exact leave-one-out by refitting."""

import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats
from scipy.special import expit

import vbsvm
from vbsvm.results.contract import psis_log_weights
from vbsvm.results.gp import bound_log_pseudo_likelihood


# ------------------------------------------------------------------------------ weights
def test_psis_weights_handle_the_hinge_atom():
    """Rows beyond the margin in every draw have equal weights (k = -inf); a few draws inside it
    get their raw ratios (k NaN); more than 4 a Pareto tail of their own; continuous ratios the
    ArviZ weights exactly. Weights are normalised."""
    rng = np.random.default_rng(0)
    S = 2000
    log_pseudo = np.zeros((S, 4))
    log_pseudo[:3, 1] = -rng.exponential(1.0, 3)          # 3 draws inside the margin
    log_pseudo[:50, 2] = -rng.exponential(1.0, 50)        # 50 draws: fewer than the tail of 134
    log_pseudo[:, 3] = -rng.exponential(1.0, S)           # no atom
    log_w, k = psis_log_weights(log_pseudo)
    np.testing.assert_allclose(np.logaddexp.reduce(log_w, axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(log_w[:, 0], -np.log(S))
    assert k[0] == -np.inf and np.isnan(k[1]) and np.isfinite(k[2]) and np.isfinite(k[3])
    raw = -log_pseudo[:, 1] - np.logaddexp.reduce(-log_pseudo[:, 1])
    np.testing.assert_allclose(log_w[:, 1], raw)
    np.testing.assert_allclose(log_w[50:, 2], log_w[50, 2])  # the atom's draws weigh the same
    assert np.all(log_w[:50, 2] >= log_w[50, 2] - 1e-12)
    lw, kk = xr.DataArray(log_pseudo[:, 3], dims="sample").azstats.psislw(r_eff=1.0, dim="sample")
    np.testing.assert_allclose(log_w[:, 3], lw.values, rtol=1e-12)
    assert k[3] == pytest.approx(float(kk))


def test_gp_bound_pseudo_likelihood():
    """The bound model's log pseudo-likelihood: the hinge at k~ = 0, below it otherwise (Jensen),
    and computed without cancellation far beyond the margin."""
    t = np.linspace(-4, 6, 41)
    np.testing.assert_allclose(bound_log_pseudo_likelihood(t, 0.0), -2 * np.maximum(0, 1 - t), atol=1e-12)
    assert np.all(bound_log_pseudo_likelihood(t, 0.3) <= -2 * np.maximum(0, 1 - t))
    far = bound_log_pseudo_likelihood(np.array([1e9]), 1e-3)[0]
    assert far == pytest.approx(-1e-3 / (2 * (1e9 - 1)), rel=1e-9)


# ------------------------------------------------------------------------------ held out
def _probit_data(n, rng):
    X = rng.standard_normal((n, 3))
    y = (rng.random(n) < stats.norm.cdf(1.5 * X[:, 0] + 1.0 * X[:, 1])).astype(int)
    return pd.DataFrame({"y": y, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2]})


def test_loo_ranks_models_as_held_out_data_do_and_estimates_their_log_score():
    rng = np.random.default_rng(7)
    train, test = _probit_data(150, rng), _probit_data(3000, rng)
    loo, held, insample = [], [], []
    for formula in ("y ~ x3", "y ~ x1", "y ~ x1 + x2"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = vbsvm.svm(formula, train, seed=1)
        res = fit.loo()
        p = fit.predict(test, kind="prob").to_numpy()
        loo.append(res)
        held.append(np.mean(np.log(np.where(test["y"] == 1, p, 1 - p))))
        q = fit.predict(train, kind="prob").to_numpy()
        insample.append(np.mean(np.log(np.where(train["y"] == 1, q, 1 - q))))
    elpd = [r.elpd for r in loo]
    assert np.argsort(elpd).tolist() == np.argsort(held).tolist() == [0, 1, 2]
    best = loo[2]
    assert abs(best.elpd / 150 - held[2]) < 2.5 * best.se / 150   # an estimate of the held-out log score
    assert insample[2] > best.elpd / 150                        # in-sample is optimistic, loo is not
    assert loo[0].elpd > 150 * np.log(0.5) - 3 * loo[0].se      # a noise-only model is about a coin


@pytest.mark.slow
def test_loo_matches_exact_leave_one_out_by_refitting():
    """fit.loo() of the calibrated fit against refitting without each row (40 refits): within half
    a standard error, and closer than weights from the predictive or no weights at all."""
    rng = np.random.default_rng(4)
    n = 40
    X = rng.standard_normal((n, 2))
    df = pd.DataFrame({"y": (rng.random(n) < expit(1.5 * X[:, 0] - X[:, 1])).astype(int), "x1": X[:, 0], "x2": X[:, 1]})
    kw = dict(seed=1, penalty=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x1 + x2", df, **kw)
        p = np.array([vbsvm.svm("y ~ x1 + x2", df.drop(index=i), **kw).predict(df.iloc[[i]], kind="prob").iloc[0]
                      for i in range(n)])
    exact = np.log(np.where(df["y"] == 1, p, 1 - p)).sum()
    loo = fit.loo()
    _, log_prob = fit.pointwise_log_terms()
    flat = log_prob.reshape(-1, n)
    log_w, _ = psis_log_weights(flat)
    wrong = np.logaddexp.reduce(log_w + flat, axis=0).sum()
    in_sample = (np.logaddexp.reduce(flat, axis=0) - np.log(flat.shape[0])).sum()
    assert abs(loo.elpd - exact) < 0.5 * loo.se
    assert abs(loo.elpd - exact) < min(abs(wrong - exact), abs(in_sample - exact))
