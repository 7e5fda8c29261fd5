"""Model jumps of the Laplace-zero Gibbs sampler: the proposals (:mod:`vbsvm.mcmc.model_jumps`),
the jump's target (:meth:`LaplaceZeroModel.model_jumps`) and the engine's pooling of the tuning.

The jump's exactness is checked against quadrature in ``test_reliability_exact.py`` (with a
broken variant that the check rejects)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vbsvm.inference.gibbs import run_chains
from vbsvm.mcmc.model_jumps import ModelJumpTuner
from vbsvm.models.selection import LaplaceZeroModel


def _rows(rng, models, counts, n_fixed):
    """Recorded rows ``(gamma, fixed, v, eta)``: ``counts[j]`` visits of ``models[j]``."""
    m = len(models[0])
    rows = []
    for gamma, c in zip(models, counts):
        for _ in range(c):
            rows.append(np.concatenate([gamma, rng.normal(size=n_fixed), rng.normal(1.0, 0.5, size=m),
                                        [rng.normal(2.0, 0.3)]]))
    return np.array(rows)


def test_the_list_keeps_the_models_visited_often_enough_ranked_by_visits():
    rng = np.random.default_rng(1)
    models = [np.array([1.0, 0, 0]), np.array([0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0]), np.array([0, 0, 0.0])]
    # coordinates (1 fixed + terms + eta): 2, 4, 5, 2; the third model's 4 visits are too few (< 5 + 1)
    tuner = ModelJumpTuner(3, 1, max_models=10)
    fit = tuner.fit(_rows(rng, models, [40, 60, 4, 5], 1))
    assert np.array_equal(fit["jump_models"], np.array([models[1], models[0], models[3]]))
    # the proposal of the model with terms 2 and 3: its coordinates (fixed, v_2, v_3, eta), padded
    rows = _rows(np.random.default_rng(1), models, [40, 60, 4, 5], 1)
    Z = rows[(rows[:, :3] == models[1]).all(axis=1)][:, [3, 5, 6, 7]]
    np.testing.assert_allclose(fit["jump_mean"][0, :4], Z.mean(axis=0))
    np.testing.assert_allclose(fit["jump_mean"][0, 4:], 0.0)
    np.testing.assert_allclose(fit["jump_chol"][0, :4, :4] @ fit["jump_chol"][0, :4, :4].T,
                               1.3 ** 2 * np.cov(Z, rowvar=False), rtol=1e-10)
    assert ModelJumpTuner(3, 1, max_models=2).fit(_rows(rng, models, [40, 60, 4, 5], 1))["jump_models"].shape[0] == 2


def test_fewer_than_two_models_make_no_list():
    rng = np.random.default_rng(2)
    fit = ModelJumpTuner(2, 1).fit(_rows(rng, [np.array([1.0, 0]), np.array([0, 1.0])], [50, 3], 1))
    assert fit["jump_models"].shape == (0, 2)


def test_proposal_density_is_the_multivariate_t_and_its_draws_follow_it():
    rng = np.random.default_rng(3)
    tuner = ModelJumpTuner(3, 1, max_models=10)
    models = [np.array([1.0, 1.0, 0]), np.array([0, 0, 1.0])]
    state = tuner.fit(_rows(rng, models, [200, 100], 1))
    k, d = 0, 4
    mean, L = state["jump_mean"][k, :d], state["jump_chol"][k, :d, :d]
    x = rng.normal(size=d)
    ref = stats.multivariate_t(loc=mean, shape=L @ L.T, df=tuner.df).logpdf(x)
    assert tuner.log_density(state, k, x) == pytest.approx(ref, rel=1e-12)
    # squared Mahalanobis distance / d of the draws ~ F(d, df)
    draws = np.array([tuner.sample(state, k, rng) for _ in range(4000)])
    r = np.linalg.solve(L, (draws - mean).T)
    assert stats.kstest((r * r).sum(axis=0) / d, stats.f(d, tuner.df).cdf).pvalue > 1e-3


def test_pooling_fits_one_list_from_every_chain_and_drops_the_rows():
    rng = np.random.default_rng(4)
    tuner = ModelJumpTuner(2, 1)
    a = _rows(rng, [np.array([1.0, 0])], [30], 1)
    b = _rows(rng, [np.array([0, 1.0])], [30], 1)
    states = [{"jump_rows": a, "other": 1}, {"jump_rows": b, "other": 2}]
    assert tuner.fit(a)["jump_models"].shape[0] == 0  # one chain alone: one model, no list
    pooled = tuner.pool(states)
    ref = tuner.fit(np.concatenate([a, b]))
    for s, orig in zip(pooled, states):
        assert s["other"] == orig["other"] and s["jump_rows"].shape[0] == 0
        np.testing.assert_array_equal(s["jump_models"], ref["jump_models"])
        np.testing.assert_array_equal(s["jump_chol"], ref["jump_chol"])
    assert states[0]["jump_rows"] is a  # the engine's states are not changed in place


def test_a_chain_that_tuned_in_one_model_keeps_its_rows_for_pooling():
    """At the last tuning sweep a chain's own fit finds one model (no list); its recorded rows
    must survive that fit, so that :meth:`ModelJumpTuner.pool` fits the list from every chain
    (they were dropped before, and a chain that stayed in one model did not count)."""
    rng = np.random.default_rng(2)
    tuner = ModelJumpTuner(2, 1)
    tune, states = 40, []
    for gamma in (np.array([1.0, 0.0]), np.array([0.0, 1.0])):
        state = tuner.initial_state()
        for it in range(tune):
            state = tuner.record(state, it, tune, gamma, rng.normal(size=1), rng.normal(size=2), rng.normal())
        assert state["jump_models"].shape[0] == 0 and state["jump_rows"].shape[0] == tune - tune // 4
        states.append(state)
    pooled = tuner.pool(states)
    assert pooled[0]["jump_models"].shape[0] == 2 and pooled[0]["jump_rows"].shape[0] == 0


def _selection_model(seed=5, n=60, m=3):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, m))])
    y = np.where(X[:, 1] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return LaplaceZeroModel(X, y, [], np.array([False] + [True] * m), rho=0.3, A=2.0, B=1.0)


def test_jump_target_is_the_marginal_laplace_zero_density():
    """``_jump_log_target`` against the density written out independently (b integrated out:
    Laplace slab; the IG prior of sigma_u^2 in log scale), for terms {1, 3} and for term {2}."""
    model = _selection_model()
    rng = np.random.default_rng(6)
    beta0, v, eta = 0.4, rng.normal(size=2), 0.7
    f = model.base.Cd[:, 0] * beta0 + model.base.Cd[:, [1, 3]] @ v
    s = math.exp(eta / 2)
    ref = (-2 * np.maximum(0, 1 - model.y * f).sum() + stats.norm.logpdf(beta0, scale=math.sqrt(1e8))
           + stats.laplace.logpdf(v, scale=s).sum() + 2 * math.log(0.3) + math.log(0.7)
           + stats.invgamma.logpdf(math.exp(eta), 2.0, scale=1.0) + eta)
    diffs = [model._jump_log_target(np.array([beta0, *v, eta]), f) - ref]
    f2 = model.base.Cd[:, 0] * -0.2 + model.base.Cd[:, 2] * 1.5
    ref2 = (-2 * np.maximum(0, 1 - model.y * f2).sum() + stats.norm.logpdf(-0.2, scale=math.sqrt(1e8))
            + stats.laplace.logpdf(1.5, scale=math.exp(-0.25)) + math.log(0.3) + 2 * math.log(0.7)
            + stats.invgamma.logpdf(math.exp(-0.5), 2.0, scale=1.0) - 0.5)
    diffs.append(model._jump_log_target(np.array([-0.2, 1.5, -0.5]), f2) - ref2)
    assert diffs[0] == pytest.approx(diffs[1], abs=1e-9)  # equal up to one constant


@pytest.mark.slow
def test_chains_jump_after_pooling_and_serial_equals_parallel(monkeypatch):
    model = _selection_model(m=4)
    seen = []
    pool = LaplaceZeroModel.gibbs_pool

    def counting(self, states):
        seen.append(len(states))
        return pool(self, states)

    monkeypatch.setattr(LaplaceZeroModel, "gibbs_pool", counting)  # called in the parent process
    runs = [run_chains(model, draws=150, tune=200, chains=2, seed=7, record=("gamma", "jump_models"),
                       progress=False, n_jobs=n) for n in (1, 2)]
    assert seen == [2, 2]  # called once per run, with every chain's state
    lists = runs[0].draws["jump_models"]
    assert lists.shape[2] >= 2 and np.array_equal(lists[0, 0], lists[1, -1])  # one list for all chains
    np.testing.assert_array_equal(runs[0].draws["gamma"], runs[1].draws["gamma"])


@pytest.mark.parametrize("prior, missing, tune, expected", [
    ("laplace_zero", "drop", None, 2000),  # the list of models is fitted from the tuning sweeps
    ("laplace_zero", "impute", None, 1000),  # each tuning sweep of the cut sampler is 20 inner sweeps
    (None, "drop", None, 1000),
    ("laplace_zero", "drop", 300, 300),  # an explicit tune is kept
])
def test_a_laplace_zero_prior_tunes_longer_by_default(prior, missing, tune, expected):
    from vbsvm import LaplaceZero
    from vbsvm.fitting.svm import fit_settings

    settings = fit_settings("y ~ x", method="gibbs", missing=missing, draws=10, tune=tune, chains=1, seed=1,
                            progress=False, prior=LaplaceZero() if prior else None)
    assert settings.tune == expected
