"""The block independence Metropolis-Hastings move of the Gibbs samplers.

The proposal's density and draws against scipy's multivariate t; the Metropolis-Hastings steps
against a known target; and, through the public API, the linear sampler with the move kept
against the exact posterior by quadrature, with a broken variant (no proposal density in the
acceptance ratio) that the same check rejects. (The tuning that fits it: ``test_block_tuner.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vbsvm.mcmc import independence
from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.independence import StudentTProposal, independence_steps
from vbsvm.models import linear_block_moves
from support import exact
from support.exact import P_MIN


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


def test_exact_posterior_with_the_independence_move_kept(block_phases):
    """Intercept + penalized slope with the penalty inferred: the block (beta, log sigma2_u) moves
    by the independence sampler after tuning, and the draws match the quadrature marginals."""
    exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert block_phases and all(ph == BlockTuner.KEPT_IMH for ph in block_phases), block_phases


@pytest.mark.slow
def test_exact_check_detects_an_independence_move_without_its_proposal_density(block_phases, monkeypatch):
    """Accepting with ``pi'/pi`` instead of ``(pi' q) / (pi q')`` targets ``pi q``: rejected."""
    steps = independence.independence_steps
    monkeypatch.setattr(linear_block_moves, "independence_steps",
                        lambda lt, ltp, lq, lqp, rng: steps(lt, ltp, 0.0 * lq, 0.0 * np.asarray(lqp), rng))
    with pytest.raises(AssertionError):
        exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert all(ph == BlockTuner.KEPT_IMH for ph in block_phases), block_phases
