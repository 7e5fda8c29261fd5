"""The univariate slice sampler of :mod:`vbsvm.mcmc.slice`: distribution and bookkeeping."""

import math

import numpy as np
import pytest
from scipy import stats

from vbsvm.mcmc.slice import slice_sample


def _chain(logp, x0, n, seed, width, known=False):
    rng = np.random.default_rng(seed)
    x, lx, out = x0, logp(x0), np.empty(n)
    for i in range(n):
        x, lx = slice_sample(logp, x, rng, width=width, logp_x0=lx if known else None)
        out[i] = x
    return out


@pytest.mark.parametrize("width", [0.3, 3.0, 30.0])
def test_slice_sample_draws_a_skewed_target(width):
    """A Gamma(3) target, far from the initial width either way: thinned draws pass a KS test
    and the mean and variance match."""
    logp = lambda x: 2.0 * math.log(x) - x if x > 0 else -math.inf  # noqa: E731
    x = _chain(logp, 1.0, 42000, seed=2, width=width)[2000::10]
    assert stats.kstest(x, stats.gamma(3.0).cdf).pvalue > 1e-3
    assert abs(x.mean() - 3.0) < 0.1
    assert abs(x.var() / 3.0 - 1.0) < 0.12


def test_known_current_density_changes_nothing_but_the_count():
    """Passing ``logp_x0`` gives the same chain and saves one evaluation per update."""
    calls = {"n": 0}

    def logp(x):
        calls["n"] += 1
        return -0.5 * x * x - abs(x)

    plain = _chain(logp, 0.5, 300, seed=5, width=2.0)
    n_plain, calls["n"] = calls["n"], 0
    known = _chain(logp, 0.5, 300, seed=5, width=2.0, known=True)
    np.testing.assert_array_equal(plain, known)
    assert n_plain - calls["n"] == 300
