"""The exact draw of one scalar per group from its marginal hinge conditional
(:func:`vbsvm.models.hinge.sample_offsets`), which moves the random intercepts and the whitened
coordinates of random slopes in the linear Gibbs sampler: KS against quadrature of the density,
with kinks of both signs, a row that does not depend on the scalar, tied kinks and an empty group."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vbsvm.models.hinge import GroupLayout, sample_offsets


def _quadrature_cdf(gap, slope, prior_var):
    grid = np.linspace(-25.0, 25.0, 200001)
    logd = -0.5 * grid ** 2 / prior_var - 2.0 * np.maximum(0.0, gap[:, None] - slope[:, None] * grid).sum(0)
    d = np.exp(logd - logd.max())
    cdf = np.cumsum(d)
    return lambda x: np.interp(x, grid, cdf / cdf[-1])


@pytest.mark.parametrize("prior_var", [0.3, 11.0])
def test_each_group_matches_its_conditional(prior_var):
    rng = np.random.default_rng(7)
    codes = np.array([0, 0, 0, 1, 1, 3, 3, 3, 3, 3, 3, 3, 4, 4, 0])  # group 2 has no rows
    n, m = codes.size, 5
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    slope = y * np.array([1, 1, 1, 1, 1, 0.5, -2, 0, 1, 3, 1, 1, 1, 1, 1.0])  # a row with slope 0
    gap = 1.0 - y * rng.normal(size=n) * 2.0
    gap[12], slope[12], gap[13], slope[13] = 0.7, 1.0, 0.7, 1.0  # group 4: two tied kinks
    layout = GroupLayout(codes, m)
    draws = np.array([sample_offsets(gap, slope, layout, prior_var, rng) for _ in range(6000)])
    for g in range(m):
        rows = codes == g
        p = stats.kstest(draws[:, g], _quadrature_cdf(gap[rows], slope[rows], prior_var)).pvalue
        assert p > 1e-3, (g, p)


def test_a_wrong_prior_variance_is_detected():
    """Power: draws made with the prior variance doubled fail the same check on a weakly informed group."""
    rng = np.random.default_rng(3)
    codes = np.zeros(3, dtype=int)
    gap, slope = np.array([0.5, 1.0, 0.2]), np.array([1.0, -1.0, 1.0])
    draws = np.array([sample_offsets(gap, slope, GroupLayout(codes, 1), 2.0, rng) for _ in range(6000)])[:, 0]
    assert stats.kstest(draws, _quadrature_cdf(gap, slope, 1.0)).pvalue < 1e-3


def test_rows_in_any_order_and_same_seed_same_draws():
    """The result does not depend on how the rows are ordered (the draw sorts them), and the
    same seed gives the same draws."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 40, 300)
    y = np.where(rng.random(300) < 0.5, 1.0, -1.0)
    gap = 1.0 - y * rng.normal(size=300)
    perm = rng.permutation(300)
    a = sample_offsets(gap, y, GroupLayout(codes, 40), 2.0, np.random.default_rng(5))
    b = sample_offsets(gap[perm], y[perm], GroupLayout(codes[perm], 40), 2.0, np.random.default_rng(5))
    c = sample_offsets(gap, y, GroupLayout(codes, 40), 2.0, np.random.default_rng(5))
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(a, c)


def test_a_target_rounded_up_never_picks_a_trailing_empty_interval():
    """With the uniform at its largest value the inversion's target for the second group rounds
    up to the cumulative total, and the second group's last intervals are empty (its rows with
    slope 0 put their kinks at +inf): the draw must still be finite (it was NaN)."""
    codes = np.r_[np.zeros(5, dtype=int), np.ones(3, dtype=int)]
    gap = np.array([-0.03963146, 0.1921268, 0.03147004, -0.16070081, 0.10847852, 0.5, 1.0, 2.0])
    slope = np.array([-1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 0.0, 0.0])

    class Top:
        def random(self, size=None):
            return np.full(size, np.nextafter(1.0, 0.0))

    u = sample_offsets(gap, slope, GroupLayout(codes, 2), 0.05, Top())
    assert np.all(np.isfinite(u))
