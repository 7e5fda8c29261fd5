"""The partially non-centred variance move of the linear Gibbs sampler
(:mod:`vbsvm.mcmc.partial_noncentring`, ``LinearSVMModel._variance_orbit``): its density along
the orbit against the model's joint pseudo-posterior, the tuner's schedule and estimate, and the
exact-posterior check with fixed exponents, with a broken variant (no Jacobian) that it rejects."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from support import exact
from vbsvm.mcmc.partial_noncentring import ExponentTuner
from vbsvm.models.linear import LinearSVMModel


def _model_and_state(seed=0, n=60, m=7):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    codes = rng.integers(0, m, size=n)
    codes[:m] = np.arange(m)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    model = LinearSVMModel(X, y, [(codes, m, "g")], np.array([1e-4, np.nan, np.nan]), A=0.5, B=0.3, intercept=0)
    theta = rng.normal(size=model.q)
    sigma2 = np.array([0.7, 1.9])
    return model, theta, sigma2, rng


def _log_joint_in_log_variances(model, theta, sigma2):
    """The marginal pseudo-posterior in (theta, log sigma2): the model's joint plus the Jacobian."""
    return model.log_posterior(theta, sigma2) + float(np.sum(np.log(sigma2)))


@pytest.mark.parametrize("k", [0, 1], ids=["penalty-non-centred", "levels-partial"])
def test_orbit_density_is_the_joint_along_the_orbit(k):
    """``logp(t) - logp(0)`` equals the joint's change from x to g_t x plus the log Jacobian
    ``t sum_j c_j / 2``, and ``move(t)`` is g_t x with its scores; for the penalty's variance
    (exponents 1, coefficients sharing rows) and for the levels with exponents in (0, 1)."""
    model, theta, sigma2, rng = _model_and_state()
    index = model.variance_components[k].index
    exponents = None if k == 0 else rng.uniform(0.05, 1.0, index.size)
    c = np.ones(index.size) if exponents is None else exponents
    assert (k in model._levels) == (k == 1)
    f = model.predictor(theta)
    logp, move = model._variance_orbit(k, theta, f, sigma2, exponents)
    base = _log_joint_in_log_variances(model, theta, sigma2)
    for t in (-0.8, 0.25, 1.3):
        th, f_t, s2 = move(t)
        expected = theta.copy()
        expected[index] *= np.exp(0.5 * c * t)
        np.testing.assert_allclose(th, expected, rtol=1e-12)
        np.testing.assert_allclose(f_t, model.predictor(th), atol=1e-12)
        assert s2[k] == pytest.approx(sigma2[k] * math.exp(t), rel=1e-12)
        assert s2[1 - k] == sigma2[1 - k]
        joint_change = _log_joint_in_log_variances(model, th, s2) - base
        assert logp(t) - logp(0.0) == pytest.approx(joint_change + 0.5 * t * c.sum(), abs=1e-9)
    assert logp(60.0) == -math.inf  # outside the variances' support


def test_tuner_schedule_and_estimate():
    """Exponents stay 1 until tune/2; then ``min(1, 2 var(u_l) / mean sigma2)`` over the draws of
    ``[tune/16, tune/2)``, per term; no fit with a short tuning phase."""
    tuner = ExponentTuner([3, 2])
    rng = np.random.default_rng(1)
    tune = 320
    sds = np.array([0.1, 0.5, 3.0, 0.3, 1.0])
    state = tuner.initial_state()
    levels, variances = [], []
    for it in range(tune):
        u = rng.normal(size=5) * sds
        s2 = np.array([2.0, 0.5]) * rng.uniform(0.8, 1.2, 2)
        state = tuner.adapt(state, u, s2, it, tune)
        if tune // 16 <= it < tune // 2:
            levels.append(u)
            variances.append(s2)
        if it < tune // 2 - 1:
            assert np.all(state["pnc_exponent"] == 1.0)
    levels, variances = np.array(levels), np.array(variances)
    assert float(state["pnc_count"]) == len(levels) == 140
    expected = np.clip(2 * levels.var(axis=0) / np.repeat(variances.mean(axis=0), [3, 2]), 0.0, 1.0)
    np.testing.assert_allclose(state["pnc_exponent"], expected, rtol=1e-10)
    assert 0.0 < expected[0] < 0.05 and expected[2] == 1.0  # pinned-down level vs spread-out one
    first, second = tuner.exponents(state)
    np.testing.assert_array_equal(np.concatenate([first, second]), state["pnc_exponent"])
    assert tuner.exponents({}) is None
    short = ExponentTuner([3, 2]).initial_state()
    for it in range(50):
        short = ExponentTuner([3, 2]).adapt(short, rng.normal(size=5), np.ones(2), it, 50)
    assert np.all(short["pnc_exponent"] == 1.0) and float(short["pnc_count"]) == 0.0


def test_a_random_intercept_fit_fits_exponents_and_keeps_them_fixed_after_tuning(monkeypatch):
    """Through the sampler: exponents 1 (the non-centred move) over the first half of tuning;
    after tuning the ones fitted at tune/2, fixed, in [0, 1] and not all 1 on data that pin some
    levels down."""
    seen = []
    original = LinearSVMModel._rescale_variance

    def spy(self, k, theta, f, sigma2, rng, exponents=None):
        seen.append(None if exponents is None else exponents.copy())
        return original(self, k, theta, f, sigma2, rng, exponents)

    monkeypatch.setattr(LinearSVMModel, "_rescale_variance", spy)
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(6), [3, 3, 4, 20, 25, 30])
    y = np.where(rng.random(g.size) < np.array([0.5, 0.5, 0.5, 0.9, 0.1, 0.8])[g], 1, -1)
    df = pd.DataFrame({"y": y, "g": g.astype(str)})
    exact.gibbs("y ~ 1 + (1 | g)", df, scale=0.1, seed=3, penalty=None, chains=1, tune=200)
    per_sweep = LinearSVMModel.level_rounds
    before = seen[: 100 * per_sweep]
    after = seen[200 * per_sweep:]
    assert all(np.all(e == 1.0) for e in before)
    assert all(e is not None for e in after) and len(after) == 150 * per_sweep
    assert all(np.array_equal(e, after[0]) for e in after)
    assert np.all((after[0] >= 0) & (after[0] <= 1)) and after[0].min() < 0.9


def _fixed_exponents(monkeypatch, value):
    monkeypatch.setattr(LinearSVMModel, "_level_exponents",
                        lambda self, state: {k: np.full(self.variance_components[k].index.size, value)
                                             for k in self._levels})


@pytest.mark.parametrize("value", [0.0, 0.4])
@pytest.mark.slow
def test_exact_posterior_with_fixed_exponents(monkeypatch, value):
    """The quadrature check of ``y ~ 1 + (1 | g)`` (two levels) with every exponent fixed (0: the
    move is centred, 0.4: partially non-centred) from the first sweep on."""
    _fixed_exponents(monkeypatch, value)
    exact.random_intercept_two_groups(11, 1)


@pytest.mark.slow
def test_exact_check_detects_a_move_without_its_jacobian(monkeypatch):
    """Broken variant: the orbit's density without ``t sum_l c_l / 2`` (the fitted moves of the
    fixed effects dropped, as for the other power checks) is rejected by the same check."""
    _fixed_exponents(monkeypatch, 1.0)
    original = LinearSVMModel._variance_orbit

    def broken(self, k, theta, f, sigma2, exponents=None):
        logp, move = original(self, k, theta, f, sigma2, exponents)
        if exponents is None:
            return logp, move
        half = 0.5 * float(np.sum(exponents))
        return (lambda t: logp(t) - half * t), move

    monkeypatch.setattr(LinearSVMModel, "_variance_orbit", broken)
    monkeypatch.setattr(LinearSVMModel, "block_min_accept", 2.0)
    with pytest.raises(AssertionError):
        exact.random_intercept_two_groups(3, 1)
