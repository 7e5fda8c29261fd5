"""The HMC move of the linear Gibbs sampler.

The transition against known targets (a skewed one by KS, a Gaussian's acceptance as the step
shrinks); the dual averaging of the step; the gradient of the linear model's marginal target
against finite differences; the smoothed hinge its trajectories may follow against quadrature;
and, through the public API, the linear sampler with the move kept against the exact posterior
by quadrature, with broken variants (the acceptance without the kinetic energy, or on the smoothed
hinge) that the same check rejects. (The tuning that fits it: ``test_block_tuner.py``.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from vbsvm.mcmc import hmc
from vbsvm.mcmc import block_tuner
from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.hmc import hmc_transition, trajectory_steps, whiten
from vbsvm.models import hinge, linear, linear_block_moves
from support import exact
from support.exact import P_MIN


def _skewed(x):
    """log density and gradient of log-Gamma(3) in x[0] times N(x[1]; x[0], 0.5^2)."""
    a, b = x
    lp = 3.0 * a - math.exp(a) - 2.0 * (b - a) ** 2
    return lp, np.array([3.0 - math.exp(a) + 4.0 * (b - a), -4.0 * (b - a)]), None


def test_transition_leaves_a_skewed_target_invariant():
    rng = np.random.default_rng(3)
    chol = np.linalg.cholesky(np.array([[0.35, 0.3], [0.3, 0.55]]))
    x0 = np.array([1.0, 1.0])
    target = whiten(_skewed, x0, chol)
    z, chain, accepted = np.zeros(2), [], []
    cur = target(z)
    for _ in range(8000):
        step = 0.6 * rng.uniform(*hmc.STEP_JITTER)
        z, cur, a = hmc_transition(target, z, cur, step, trajectory_steps(step), rng)
        chain.append(x0 + chol @ z)
        accepted.append(a)
    chain = np.array(chain[500:])
    target = stats.loggamma(3.0)
    assert stats.kstest(chain[::4, 0], target.cdf).pvalue > P_MIN
    assert abs(chain[:, 1].mean() - target.mean()) < 0.05
    assert 0.3 < np.mean(accepted) < 1.0


def test_acceptance_tends_to_one_as_the_step_shrinks_and_outside_the_support_is_rejected():
    rng = np.random.default_rng(0)
    gauss = lambda x: (-0.5 * float(x @ x), -x, None)  # noqa: E731
    x = np.array([0.3, -1.0, 2.0])
    rates = [np.mean([hmc_transition(gauss, x, gauss(x), s, trajectory_steps(s), rng)[2]
                      for _ in range(200)]) for s in (0.8, 0.2, 0.02)]
    assert rates[0] < rates[1] < rates[2] and rates[2] > 0.999, rates
    walled = lambda x: (-math.inf, None, None) if x[0] > 0.5 else gauss(x)  # noqa: E731
    x0 = np.array([0.49, 0.0, 0.0])
    for _ in range(50):
        x1, cur, a = hmc_transition(walled, x0, walled(x0), 0.5, 3, rng)
        assert x1[0] <= 0.5 and (a > 0 or np.array_equal(x1, x0))


def test_dual_averaging_reaches_the_target_acceptance():
    """An adaptation window on a 20-d Gaussian with a metric 3x too wide, started at a step far too
    large: the mean acceptance over its second half is near TARGET_ACCEPT and the averaged step
    sits between the smallest and largest steps tried late."""
    d, rng = 20, np.random.default_rng(1)
    gauss = lambda x: (-0.5 * float(x @ x), -x, None)  # noqa: E731
    chol = 3.0 * np.eye(d)
    log_step = math.log(2.0)
    h_bar, mu, log_step_bar = 0.0, log_step + math.log(10.0), log_step
    target = whiten(gauss, np.zeros(d), chol)
    z, cur, late, steps = np.zeros(d), target(np.zeros(d)), [], []
    for t in range(1, 601):
        step = math.exp(log_step)
        z, cur, a = hmc_transition(target, z, cur, step, trajectory_steps(step), rng)
        h_bar, log_step, log_step_bar = hmc.dual_average(t, h_bar, mu, log_step_bar, a)
        if t > 300:
            late.append(a)
            steps.append(step)
    assert abs(np.mean(late) - hmc.TARGET_ACCEPT) < 0.1, np.mean(late)
    assert min(steps) <= math.exp(log_step_bar) <= max(steps)


def test_marginal_target_gradient_matches_finite_differences():
    """Intercept (fixed precision), two penalized columns (sigma2_u in the block) and a random
    intercept (not in the block: its levels enter through the scores)."""
    rng = np.random.default_rng(4)
    n = 60
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    codes = rng.integers(0, 5, n)
    model = linear.LinearSVMModel(X, y, [(codes, 5, "g")], np.r_[0.3, np.nan, np.nan], A=0.5, B=0.7)
    assert list(model._block_variances) == [0]
    f_rest = rng.normal(size=5)[codes]
    Xf = model.Cd[:, : model.p]
    target, gradient = model._hmc_target(np.zeros(4), np.eye(4), f_rest)  # z = x

    def value(x):
        return target(x)[0]

    x = np.r_[0.2, -0.4, 0.9, math.log(1.3)]
    grad = target(x)[1]
    h = 1e-6
    fd = np.array([(value(x + h * e) - value(x - h * e)) / (2 * h) for e in np.eye(x.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target(x)[2], Xf @ x[:3])
    # in whitened coordinates z (x = x0 + L z) the gradient is L^T times the one in x
    L = np.linalg.cholesky(np.array([[1.0, 0.3, 0, 0], [0.3, 2.0, 0.1, 0], [0, 0.1, 0.5, 0.2], [0, 0, 0.2, 0.8]]))
    x0 = np.r_[0.1, 0.2, -0.3, 0.1]
    z = np.linalg.solve(L, x - x0)
    whitened = model._hmc_target(x0, L, f_rest)[0](z)
    assert whitened[0] == pytest.approx(value(x), abs=1e-9)
    np.testing.assert_allclose(whitened[1], L.T @ grad, rtol=1e-9, atol=1e-12)
    # the value, up to a constant: hinge, the intercept's N(0, 1/0.3), N(0, sigma2_u) on the
    # penalized columns, the IG(A, B) density of sigma2_u times its Jacobian sigma2_u

    def reference(x):
        f, s2 = f_rest + Xf @ x[:3], math.exp(x[3])
        return (-2 * np.maximum(0, 1 - y * f).sum() + stats.norm(0, math.sqrt(1 / 0.3)).logpdf(x[0])
                + stats.norm(0, math.sqrt(s2)).logpdf(x[1:3]).sum() + stats.invgamma(0.5, scale=0.7).logpdf(s2) + x[3])

    other = np.r_[-1.1, 0.3, 0.2, math.log(0.4)]
    assert value(x) - reference(x) == pytest.approx(value(other) - reference(other), abs=1e-9)
    # outside the variance range: -inf, and no gradient
    assert value(np.r_[x[:3], 1e3]) == -math.inf
    assert gradient(np.r_[x[:3], 1e3]) is None
    np.testing.assert_array_equal(gradient(x), grad)  # the trajectories' gradient-only map


def test_the_batched_target_of_the_independence_move_is_the_same_density():
    """``_imh_log_target`` (many points, no gradient) and ``_hmc_target`` state one density
    twice: they agree, also outside the variance range (-inf)."""
    rng = np.random.default_rng(5)
    n = 40
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    model = linear.LinearSVMModel(X, y, [], np.r_[0.3, np.nan, np.nan], A=0.5, B=0.7)
    Xf = model.Cd[:, : model.p]
    pts = rng.normal(size=(4, 5)) * np.array([[1.0], [1.0], [1.0], [2.0]])  # columns (beta, log sigma2_u)
    pts[3, -1] = 1e3
    F = Xf @ pts[:3]
    batched = model._imh_log_target(pts, F)
    target = model._hmc_target(np.zeros(4), np.eye(4), np.zeros(n))[0]
    single = [target(pts[:, k])[0] for k in range(pts.shape[1])]
    np.testing.assert_allclose(batched, single, rtol=1e-12)
    assert batched[-1] == -math.inf


@pytest.fixture
def imh_rejects(monkeypatch):
    """The independence move rejects every proposal (still an exact kernel), so that the tuner
    turns to HMC."""
    monkeypatch.setattr(linear_block_moves, "independence_steps", lambda *args: (-1, 0))


def test_exact_posterior_with_the_hmc_move_kept(block_phases, imh_rejects):
    """Intercept + penalized slope with the penalty inferred: the block (beta, log sigma2_u) moves
    by HMC after tuning, and the draws match the quadrature marginals."""
    exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert block_phases and all(ph == BlockTuner.KEPT_HMC for ph in block_phases), block_phases


@pytest.mark.slow
def test_exact_check_detects_an_hmc_move_without_the_kinetic_energy(block_phases, imh_rejects, monkeypatch):
    """Accepting by the change of the log density alone (no kinetic energy in the Hamiltonian)
    does not keep the posterior: rejected."""
    monkeypatch.setattr(hmc, "kinetic_energy", lambda p: 0.0)
    with pytest.raises(AssertionError):
        exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert all(ph == BlockTuner.KEPT_HMC for ph in block_phases), block_phases


def _smoothed_hinge(g, width):
    """The hinge convolved with Uniform(-width/2, width/2), by quadrature: an independent
    statement of the piecewise ``h_width`` of :mod:`vbsvm.models.hinge`."""
    return integrate.quad(lambda t: max(0.0, g - t) / width, -width / 2, width / 2, points=[g])[0]


def test_smoothing_mismatch_against_quadrature():
    """The mismatch of the smoothed hinge (its slope is checked through the HMC target's gradient,
    by finite differences of this value, in the next test)."""
    gaps = np.r_[np.linspace(-0.49, 0.51, 41), -3.0, 2.0, 0.0]
    widths = (0.05, 0.3, 0.8)
    h = np.array([[_smoothed_hinge(g, w) for w in widths] for g in gaps])
    expected = -2.0 * (np.maximum(gaps, 0.0)[:, None] - h).sum(axis=0)
    np.testing.assert_allclose(hinge.smoothing_mismatch(gaps, widths), expected, rtol=1e-9, atol=1e-12)


def test_smoothed_target_keeps_the_exact_log_density_and_follows_the_smoothed_gradient():
    """With a width the HMC target's value is still the exact log density, and its gradient is
    that of the log density with the smoothed hinge (finite differences)."""
    rng = np.random.default_rng(6)
    n, width = 80, 0.4
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    model = linear.LinearSVMModel(X, y, [], np.r_[0.3, np.nan, np.nan], A=0.5, B=0.7)
    f_rest = np.zeros(n)
    exact_target = model._hmc_target(np.zeros(4), np.eye(4), f_rest)[0]
    smooth_target, smooth_gradient = model._hmc_target(np.zeros(4), np.eye(4), f_rest, width)

    def smoothed_value(x):
        gap = 1.0 - y * (model.Cd[:, :3] @ x[:3])
        return exact_target(x)[0] - hinge.smoothing_mismatch(gap, [width])[0]

    x = np.r_[0.3, -0.6, 0.8, math.log(0.9)]
    assert smooth_target(x)[0] == exact_target(x)[0]
    gap = 1.0 - y * (model.Cd[:, :3] @ x[:3])
    assert np.sum(np.abs(gap) < width / 2) >= 3  # rows inside the smoothing band
    h = 1e-6
    fd = np.array([(smoothed_value(x + h * e) - smoothed_value(x - h * e)) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(smooth_target(x)[1], fd, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(smooth_gradient(x), smooth_target(x)[1])  # the trajectories' gradient-only map
    assert not np.allclose(smooth_target(x)[1], exact_target(x)[1])


@pytest.fixture
def wide_surrogate(monkeypatch):
    """Trajectories on the hinge smoothed over width 1.5 (the only one offered, picked whatever its
    mismatch): far wider than the sampler would pick, so that an acceptance on the wrong density shows."""
    monkeypatch.setattr(hinge, "SMOOTHING_WIDTHS", (1.5,))
    monkeypatch.setattr(block_tuner, "SURROGATE_SD", math.inf)


@pytest.mark.slow
def test_exact_posterior_with_hmc_on_a_smoothed_hinge(block_phases, imh_rejects, wide_surrogate):
    exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert block_phases and all(ph == BlockTuner.KEPT_HMC for ph in block_phases), block_phases
    assert set(block_phases.surrogates) == {0}


@pytest.mark.slow
def test_exact_check_detects_hmc_accepting_on_the_smoothed_hinge(block_phases, imh_rejects, wide_surrogate,
                                                                  monkeypatch):
    """Accepting on the smoothed log density (the trajectory's own) targets the smoothed
    posterior: rejected."""
    smoothed = linear.LinearSVMModel._hmc_target

    def accept_on_the_surrogate(self, x0, chol, f_rest, width=0.0):
        target, gradient = smoothed(self, x0, chol, f_rest, width)

        def broken(z):
            value, grad, scores = target(z)
            if grad is None:
                return value, grad, scores
            gap = 1.0 - self.y * (f_rest + scores)
            return value - hinge.smoothing_mismatch(gap, [width])[0], grad, scores
        return broken, gradient

    monkeypatch.setattr(linear.LinearSVMModel, "_hmc_target", accept_on_the_surrogate)
    with pytest.raises(AssertionError):
        exact.intercept_and_penalized_coefficient_penalty_inferred(11, 1)
    assert all(ph == BlockTuner.KEPT_HMC for ph in block_phases), block_phases
    assert set(block_phases.surrogates) == {0}
