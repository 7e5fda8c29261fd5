"""The tuning of the linear sampler's fixed-effect block: the schedule of fits and
trials, which move runs and replaces the slice moves when, which one is kept, and the exact
posterior when neither is kept (slice moves along the principal axes)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import vbsvm
from vbsvm.mcmc.block_tuner import EARLY_FIT_DIM, EVIDENCE, GIVE_UP, SURROGATE_SD, BlockTuner
from vbsvm.models import linear
from support import exact


def _run(tuner, tune, imh_rate, hmc_prob, seed=0):
    """A tuning phase in which the independence move accepts ``imh_rate`` of its 8 proposals per
    sweep and HMC transitions have acceptance probability ``hmc_prob``; returns the final state,
    the sweeps after which the block was fitted, and the sweeps at which HMC ran."""
    rng = np.random.default_rng(seed)
    state, fits, hmc_sweeps = tuner.initial_state(), [], []
    for it in range(tune):
        if tuner.imh_proposal(state) is not None:
            state = tuner.record_imh(state, 8, 8 * imh_rate)
        if tuner.runs_hmc(state):
            hmc_sweeps.append(it)
            state = tuner.record_hmc(state, hmc_prob)
        before = state.get("blk_chol")
        state = tuner.adapt(state, rng.normal(size=2), it, tune)
        if state.get("blk_chol") is not before:
            fits.append(it)
            assert float(state["imh_tries"]) == float(state["hmc_tries"]) == 0.0  # each fit starts its trials
    return state, fits, hmc_sweeps


def test_schedule_and_the_independence_move_kept_when_it_goes_well():
    tuner = BlockTuner(2, min_accept=0.2)
    state, fits, hmc_sweeps = _run(tuner, 320, imh_rate=0.5, hmc_prob=0.9)
    # moments over [20, 240); fits after sweeps 79 and 239; HMC never needed
    assert fits == [79, 239] and float(state["blk_count"]) == 220.0 and hmc_sweeps == []
    assert BlockTuner.phase(state) == BlockTuner.KEPT_IMH
    assert tuner.imh_proposal(state) is not None and not tuner.runs_hmc(state)
    np.testing.assert_allclose(state["blk_chol"] @ state["blk_chol"].T, np.eye(2), atol=0.3)


def test_hmc_runs_and_is_kept_when_the_independence_move_goes_badly():
    tuner = BlockTuner(2, min_accept=0.2)
    state, fits, hmc_sweeps = _run(tuner, 320, imh_rate=0.05, hmc_prob=0.7)
    # HMC starts in the sweep whose 8 independence proposals bring the trial's to EVIDENCE
    first = [80 + EVIDENCE // 8 - 1, 240 + EVIDENCE // 8 - 1]
    assert hmc_sweeps[0] == first[0] and first[1] in hmc_sweeps and first[1] - 1 not in hmc_sweeps
    assert BlockTuner.phase(state) == BlockTuner.KEPT_HMC
    assert tuner.imh_proposal(state) is None and tuner.runs_hmc(state)
    assert float(state["hmc_log_step"]) == float(state["hmc_log_step_bar"])  # the averaged step is kept


def test_each_trials_dual_averaging_starts_from_the_initial_step():
    """At the refit the step adapted in the first trial (to the first, poorer metric) is not
    carried over: the new trial's dual averaging shrinks toward 10 times the initial step."""
    tuner = BlockTuner(16, min_accept=0.2)
    initial = -0.25 * np.log(16)
    assert tuner.initial_log_step() == initial
    rng, state = np.random.default_rng(0), tuner.initial_state()
    for it in range(320):
        if tuner.imh_proposal(state) is not None:
            state = tuner.record_imh(state, 8, 0.0)  # the independence move fails: HMC runs
        if tuner.runs_hmc(state):
            state = tuner.record_hmc(state, 0.05)  # rejections shrink the step
        state = tuner.adapt(state, rng.normal(size=16), it, 320)
        if it == 238:
            assert float(state["hmc_log_step_bar"]) < initial - 1.0  # the first trial's step
        if it == 239:  # the refit
            assert float(state["hmc_mu"]) == initial + np.log(10.0)
            assert float(state["hmc_log_step_bar"]) == initial and float(state["hmc_tries"]) == 0.0


def test_an_independence_move_far_below_its_bar_gives_up_for_the_rest_of_its_trial():
    tuner = BlockTuner(2, min_accept=0.2)
    state = {**tuner.initial_state(), "blk_phase": np.array(BlockTuner.TRYING), "blk_mean": np.zeros(2),
             "blk_chol": np.eye(2)}
    for tries, accepts, runs in [(GIVE_UP - 8, 0.0, True), (GIVE_UP, 0.11 * GIVE_UP, True),
                                 (GIVE_UP, 0.09 * GIVE_UP, False)]:
        state.update(imh_tries=np.array(float(tries)), imh_accepts=np.array(accepts))
        assert (tuner.imh_proposal(state) is not None) == runs, (tries, accepts)
        assert tuner.runs_hmc(state)  # below min_accept: HMC runs either way
    kept = {**state, "blk_phase": np.array(BlockTuner.KEPT_IMH)}
    assert tuner.imh_proposal(kept) is not None  # a kept move never gives up
    # through the schedule: each trial's independence move stops after GIVE_UP proposals
    rng, state, imh_sweeps = np.random.default_rng(0), tuner.initial_state(), []
    for it in range(320):
        if tuner.imh_proposal(state) is not None:
            imh_sweeps.append(it)
            state = tuner.record_imh(state, 8, 0.0)
        state = tuner.adapt(state, rng.normal(size=2), it, 320)
    assert imh_sweeps == list(range(80, 80 + GIVE_UP // 8)) + list(range(240, 240 + GIVE_UP // 8))


def test_a_large_block_is_first_fitted_earlier():
    for dim, first in [(EARLY_FIT_DIM, 1600 // 4), (EARLY_FIT_DIM + 1, 1600 // 8)]:
        tuner, rng = BlockTuner(dim), np.random.default_rng(1)
        state, fitted_at = tuner.initial_state(), None
        for it in range(1600):
            state = tuner.adapt(state, rng.normal(size=dim), it, 1600)
            if fitted_at is None and "blk_chol" in state:
                fitted_at = it
        assert fitted_at == first - 1 and tuner.first_fit(1600) == first


def test_neither_kept_and_too_short_a_tuning():
    tuner = BlockTuner(2, min_accept=0.2)
    state, _, _ = _run(tuner, 320, imh_rate=0.05, hmc_prob=0.1)
    assert BlockTuner.phase(state) == BlockTuner.DROPPED
    assert tuner.imh_proposal(state) is None and not tuner.runs_hmc(state) and not tuner.replaces_slice_moves(state)
    assert BlockTuner.phase(tuner.adapt(tuner.initial_state(), np.zeros(2), 0, 50)) == BlockTuner.DROPPED


def test_a_trial_replaces_the_slice_moves_only_while_it_goes_well():
    tuner = BlockTuner(2, min_accept=0.2)
    state = tuner.initial_state()
    assert not tuner.replaces_slice_moves(state)  # collecting
    state["blk_phase"] = np.array(BlockTuner.TRYING)
    assert not tuner.replaces_slice_moves(state)  # no evidence yet
    state.update(imh_tries=np.array(80.0), imh_accepts=np.array(16.0))
    assert tuner.replaces_slice_moves(state) and not tuner.runs_hmc(state)
    state.update(imh_accepts=np.array(15.0))
    assert not tuner.replaces_slice_moves(state) and tuner.runs_hmc(state)
    state.update(hmc_tries=np.array(10.0), hmc_accepts=np.array(2.5))
    assert tuner.replaces_slice_moves(state)
    for kept in (BlockTuner.KEPT_IMH, BlockTuner.KEPT_HMC):
        assert tuner.replaces_slice_moves({**state, "blk_phase": np.array(kept)})
    assert not tuner.replaces_slice_moves({**state, "blk_phase": np.array(BlockTuner.DROPPED)})
    assert not tuner.replaces_slice_moves({"w": np.ones(3)})  # a sampler state without the tuner's keys


@pytest.mark.slow
def test_exact_posterior_with_principal_axis_slices(block_phases, monkeypatch):
    """With neither move kept at the end of tuning the fixed effects move by slice sampling along
    the principal axes of their tuning draws; the draws match the quadrature marginals."""
    monkeypatch.setattr(linear.LinearSVMModel, "block_min_accept", 2.0)
    exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert block_phases and all(ph == BlockTuner.DROPPED for ph in block_phases), block_phases


def test_the_smoothest_trajectory_surrogate_whose_mismatch_varies_little_is_picked():
    """Mismatches with sds 0.05, 0.15, 0.6 and 3 about arbitrary means: the tuner picks the second
    (the widest with sd <= SURROGATE_SD) at each fit, from the sweeps it collects only; with every
    sd too large, none (-1: the exact gradient)."""
    rng = np.random.default_rng(2)
    for sds, expected in [((0.05, 0.15, 0.6, 3.0), 1), ((0.5, 0.6, 0.7, 3.0), -1)]:
        tuner = BlockTuner(2, surrogates=4)
        state, seen, picks = tuner.initial_state(), 0, []
        assert BlockTuner.surrogate(state) == -1
        for it in range(320):
            mismatch = None
            if tuner.collects(state, it, 320):
                mismatch = np.array([-3.0, -7.0, -12.0, -20.0]) + np.array(sds) * rng.standard_normal(4)
                seen += 1
            before = state.get("blk_chol")
            state = tuner.adapt(state, rng.normal(size=2), it, 320, mismatch)
            if state.get("blk_chol") is not before:
                picks.append(BlockTuner.surrogate(state))
        assert SURROGATE_SD < 0.6 and picks == [expected, expected]
        assert seen == float(state["blk_count"]) == 220.0


def test_w_is_drawn_when_a_sweep_resumes_the_augmented_steps(monkeypatch):
    """A sweep that skips the augmented steps (a trial going well) leaves w undrawn; the next sweep
    that makes them (the trial no longer going well) first draws w given the current scores."""
    rng = np.random.default_rng(0)
    n = 40
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    model = linear.LinearSVMModel(X, y, [], np.r_[0.3, np.nan, np.nan], A=0.5, B=0.7)
    tuner = model._tuner
    trying = {**tuner.initial_state(), "blk_phase": np.array(BlockTuner.TRYING), "blk_mean": np.zeros(4),
              "blk_chol": 0.1 * np.eye(4), "blk_directions": 0.1 * np.eye(3)}
    theta = np.r_[0.1, 0.3, -0.2]
    state = {**model.gibbs_initial_state(rng), **trying, "theta": theta, "f": model.predictor(theta),
             "sigma2": np.array([1.0]), "imh_tries": np.array(80.0), "imh_accepts": np.array(40.0)}
    assert tuner.replaces_slice_moves(state)
    state = model.gibbs_sweep(state, rng)
    assert state["w"].size == 0
    calls = []
    original = linear.hinge.sample_inverse
    monkeypatch.setattr(linear.hinge, "sample_inverse", lambda y, f, rng: calls.append(f.copy()) or original(y, f, rng))
    going_badly = {**state, "imh_accepts": np.array(0.0), "hmc_tries": np.array(0.0)}
    assert not tuner.replaces_slice_moves(going_badly)
    after = model.gibbs_sweep(going_badly, rng)
    np.testing.assert_array_equal(calls[0], state["f"])  # first, given the scores the last sweep ended at
    assert len(calls) == 2 and after["w"].size == n  # and again at the end of this sweep


def test_a_block_fitted_from_fewer_draws_than_coordinates_gets_a_full_rank_metric():
    """A block of 30 coordinates is first fitted after 20 collected draws (tune 320: [20, 40)),
    which here lie in a 5-dimensional subspace. The fitted covariance is the sample covariance
    shrunk toward its diagonal with the weight of 30 (2 - 20/30) = 40 pseudo-draws, so its
    smallest eigenvalue is at least 40/60 of the smallest variance; the sample covariance alone
    is singular. From twice as many draws as coordinates on, the sample covariance is used as
    it is."""
    dim, tune = 30, 320
    tuner, rng = BlockTuner(dim), np.random.default_rng(3)
    basis = rng.normal(size=(dim, 5))
    state, draws = tuner.initial_state(), []
    for it in range(tuner.first_fit(tune)):
        x = basis @ rng.normal(size=5) + 0.5
        if tuner.collects(state, it, tune):
            draws.append(x)
        state = tuner.adapt(state, x, it, tune)
    draws = np.array(draws)
    n, S = len(draws), np.cov(draws.T)
    assert n == 20 and BlockTuner.phase(state) == BlockTuner.TRYING and np.linalg.matrix_rank(S) == 5
    mean, cov = tuner.moments(state)
    np.testing.assert_allclose(mean, draws.mean(axis=0), rtol=1e-12, atol=1e-12)
    nu = dim * (2.0 - n / dim)
    np.testing.assert_allclose(cov, (n * S + nu * np.diag(np.diag(S))) / (n + nu), rtol=1e-9, atol=1e-12)
    metric = state["blk_chol"] @ state["blk_chol"].T
    np.testing.assert_allclose(metric, cov, rtol=1e-8, atol=1e-12)
    assert np.linalg.eigvalsh(metric)[0] >= 0.999 * nu / (n + nu) * np.diag(S).min()
    many = rng.normal(size=(2 * dim, dim))
    full = {"blk_count": np.array(2.0 * dim), "blk_sum": many.sum(axis=0), "blk_outer": many.T @ many}
    np.testing.assert_allclose(tuner.moments(full)[1], np.cov(many.T), rtol=1e-9, atol=1e-12)


def test_gibbs_mixes_when_the_block_outnumbers_the_first_fit_draws():
    """Section 4.2 simulation with 60 predictors and a fixed penalty (a log-concave posterior),
    tune 400: the block (61 coefficients) is first fitted from 25 draws. With the sample
    covariance alone its metric was singular and the kept HMC never moved the block along the
    missing directions (max R-hat 1.83, min bulk ESS 3 for seeds 1 and 2)."""
    df = vbsvm.datasets.simulate_luts(300, 60, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ .", df, method="gibbs", penalty=1.0, chains=2, draws=400, tune=400, seed=1,
                        progress=False, max_draws=400)
    d = fit.summary_diagnostics()
    assert d["r_hat"].max() < 1.1 and d["ess_bulk"].min() > 100, (d["r_hat"].max(), d["ess_bulk"].min())
