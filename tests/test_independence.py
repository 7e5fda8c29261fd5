"""The block independence Metropolis-Hastings move of the Gibbs samplers (issue #17).

The proposal's density and draws against scipy's multivariate t; the Metropolis-Hastings steps
against a known target; the tuner's phases; and, through the public API, the linear sampler with
the move kept against the exact posterior by quadrature, with a broken variant (no proposal
density in the acceptance ratio) that the same check rejects.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vbsvm.inference import independence
from vbsvm.inference.independence import ProposalTuner, StudentTProposal, independence_steps
from vbsvm.models import linear
import test_reliability_exact as exact
from test_reliability_exact import P_MIN


def _proposal(d=3, df=6.0, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    cov = A @ A.T + d * np.eye(d)
    return StudentTProposal.from_moments(rng.normal(size=d), cov, df), cov


def test_t_proposal_density_matches_scipy():
    prop, cov = _proposal()
    x = np.random.default_rng(1).normal(size=(3, 7)) * 3
    ref = stats.multivariate_t(loc=prop.mean, shape=cov, df=prop.df).logpdf(x.T)
    np.testing.assert_allclose(prop.log_density(x), ref, rtol=1e-10)
    np.testing.assert_allclose(prop.log_density(x[:, 0]), ref[0], rtol=1e-10)


def test_t_proposal_draws_have_the_t_distribution():
    prop, cov = _proposal(d=2, df=5.0)
    draws = prop.sample(40000, np.random.default_rng(2))
    # each margin is a scaled t_5
    for j in range(2):
        z = (draws[j] - prop.mean[j]) / np.sqrt(cov[j, j])
        assert stats.kstest(z, stats.t(df=5.0).cdf).pvalue > P_MIN
    # the covariance of a t with df > 2 is df / (df - 2) times the scale matrix
    np.testing.assert_allclose(np.cov(draws), cov * 5.0 / 3.0, atol=0.08 * np.max(np.diag(cov)) * 5.0 / 3.0)


def test_independence_steps_leave_the_target_invariant():
    """A chain of independence steps with a t proposal on a skewed 1-d target (Gamma(3) on the
    log scale) matches the target."""
    rng = np.random.default_rng(3)
    target = stats.loggamma(3.0)
    prop = StudentTProposal(np.array([0.5]), np.array([[1.2]]), 4.0)
    x, chain = np.array([0.0]), []
    for _ in range(6000):
        cand = prop.sample(4, rng)
        k, _ = independence_steps(target.logpdf(x[0]), target.logpdf(cand[0]), float(prop.log_density(x)),
                                  prop.log_density(cand), rng)
        if k >= 0:
            x = cand[:, k]
        chain.append(x[0])
    chain = np.array(chain[500:])
    assert stats.kstest(chain[::3], target.cdf).pvalue > P_MIN
    assert abs(chain.mean() - target.mean()) < 0.05


def test_independence_steps_count_and_order():
    rng = np.random.default_rng(0)
    # proposals far better than the current state are all accepted; the last one is where the chain ends
    k, accepted = independence_steps(-50.0, np.zeros(5), 0.0, np.zeros(5), rng)
    assert (k, accepted) == (4, 5)
    k, accepted = independence_steps(0.0, np.full(5, -np.inf), 0.0, np.zeros(5), rng)
    assert (k, accepted) == (-1, 0)


def test_tuner_phases():
    tuner = ProposalTuner(2, df=5.0, min_accept=0.2)
    rng = np.random.default_rng(0)
    state, tune = tuner.initial_state(), 200
    fits = []
    for it in range(tune):
        # moments from sweep 25 on; a first proposal after sweep 74, tried while collecting; a refit after 149
        assert ProposalTuner.phase(state) == (ProposalTuner.COLLECTING if it < 75 else ProposalTuner.TRYING)
        if ProposalTuner.phase(state) == ProposalTuner.TRYING:
            state["imh_tries"] = state["imh_tries"] + 1
            state["imh_accepts"] = state["imh_accepts"] + 0.5
        before = state.get("imh_chol")
        state = tuner.adapt(state, rng.normal(size=2), it, tune)
        if state.get("imh_chol") is not before:
            fits.append(it)
            assert float(state["imh_tries"]) == 0.0  # each fit starts its own trial
    assert fits == [74, 149]
    assert float(state["imh_count"]) == 125.0
    assert ProposalTuner.phase(state) == ProposalTuner.KEPT
    np.testing.assert_allclose(state["imh_chol"] @ state["imh_chol"].T, np.eye(2), atol=0.3)
    # too short a tuning phase: no proposal; a poor acceptance: dropped
    assert ProposalTuner.phase(tuner.adapt(tuner.initial_state(), np.zeros(2), 0, 50)) == ProposalTuner.DROPPED
    state = tuner.initial_state()
    for it in range(tune):
        if ProposalTuner.phase(state) == ProposalTuner.TRYING:
            state["imh_tries"] = state["imh_tries"] + 10
        state = tuner.adapt(state, rng.normal(size=2), it, tune)
    assert ProposalTuner.phase(state) == ProposalTuner.DROPPED
    assert ProposalTuner.proposal(state, 5.0) is None


def test_trial_replaces_the_slice_moves_only_while_it_goes_well():
    tuner = ProposalTuner(2, df=5.0, min_accept=0.2)
    state = tuner.initial_state()
    assert not tuner.replaces_slice_moves(state)  # collecting
    state.update(imh_phase=np.array(ProposalTuner.TRYING), imh_tries=np.array(0.0), imh_accepts=np.array(0.0))
    assert not tuner.replaces_slice_moves(state)  # no evidence yet
    state.update(imh_tries=np.array(80.0), imh_accepts=np.array(16.0))
    assert tuner.replaces_slice_moves(state)
    state.update(imh_accepts=np.array(15.0))
    assert not tuner.replaces_slice_moves(state)
    assert tuner.replaces_slice_moves({**state, "imh_phase": np.array(ProposalTuner.KEPT)})
    assert not tuner.replaces_slice_moves({**state, "imh_phase": np.array(ProposalTuner.DROPPED)})
    assert not tuner.replaces_slice_moves({"w": np.ones(3)})  # a sampler state without the tuner's keys


@pytest.fixture
def phases(monkeypatch):
    """The tuner's phase of every chain at the end of tuning."""
    seen = []
    adapt = ProposalTuner.adapt

    def spy(self, state, block, it, tune):
        out = adapt(self, state, block, it, tune)
        if it == tune - 1:
            seen.append(ProposalTuner.phase(out))
        return out

    monkeypatch.setattr(ProposalTuner, "adapt", spy)
    return seen


def test_exact_posterior_with_the_independence_move_kept(phases):
    """Intercept + penalized slope with the penalty inferred: the block (beta, log sigma2_u) moves
    by the independence sampler after tuning, and the draws match the quadrature marginals."""
    exact.test_intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert phases and all(ph == ProposalTuner.KEPT for ph in phases), phases


def test_exact_posterior_with_principal_axis_slices(phases, monkeypatch):
    """The same check with the independence move dropped at the end of tuning: the fixed effects
    then move by slice sampling along the principal axes of their tuning draws."""
    monkeypatch.setattr(linear.LinearSVMModel, "imh_min_accept", 2.0)
    exact.test_intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert phases and all(ph == ProposalTuner.DROPPED for ph in phases), phases


def test_exact_check_detects_an_independence_move_without_its_proposal_density(phases, monkeypatch):
    """Accepting with ``pi'/pi`` instead of ``(pi' q) / (pi q')`` targets ``pi q``: rejected."""
    steps = independence.independence_steps
    monkeypatch.setattr(linear, "independence_steps",
                        lambda lt, ltp, lq, lqp, rng: steps(lt, ltp, 0.0 * lq, 0.0 * np.asarray(lqp), rng))
    with pytest.raises(AssertionError):
        exact.test_intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert all(ph == ProposalTuner.KEPT for ph in phases), phases
