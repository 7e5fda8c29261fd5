r"""The Polson & Scott (2011) augmentation of the hinge loss, shared by every model.

For a score :math:`f_i` and a label :math:`y_i \in \{-1, +1\}` the SVM pseudo-likelihood
is written as a location-scale mixture of normals,

.. math::

    \exp\{-2 (1 - y_i f_i)_+\} = \int_0^\infty \frac{1}{\sqrt{2\pi a_i}}
        \exp\Big\{-\frac{(1 + a_i - y_i f_i)^2}{2 a_i}\Big\}\, da_i .

Expanding the square, :math:`(1 + a - y f)^2 / (2a) = (1 - y f)^2/(2a) + (1 - y f) + a/2`, so

* the full conditional of the auxiliary variable is
  :math:`a_i \mid f_i \sim \mathrm{GIG}(1/2, 1, (1 - y_i f_i)^2)`, and its reciprocal
  :math:`1/a_i \mid f_i \sim \mathrm{InverseGaussian}(1/|1 - y_i f_i|, 1)` (this is what Gibbs draws);
* the optimal mean-field factor is :math:`q(a_i) = \mathrm{GIG}(1/2, 1, \chi_i)` with
  :math:`\chi_i = E_q[(1 - y_i f_i)^2] = (1 - y_i m_i)^2 + v_i`, where :math:`m_i, v_i` are the mean and
  variance of :math:`f_i` under q, and :math:`E_q[1/a_i] = \chi_i^{-1/2}`;
* given :math:`w_i = E[1/a_i]` (VB) or :math:`w_i = 1/a_i` (Gibbs), the score enters a Gaussian
  "working likelihood" :math:`\exp\{(1 + w_i) y_i f_i - w_i f_i^2 / 2\}`: precision contribution
  :math:`w_i` and shift contribution :math:`y_i (1 + w_i)`.

ELBO contribution. For :math:`q(a_i) = \mathrm{GIG}(1/2, 1, \chi_i)` with arbitrary :math:`\chi_i` and
:math:`T_i = (1 - y_i m_i)^2 + v_i`,

.. math::

    E_q[\log p(y_i, a_i \mid f_i)] + H[q(a_i)] = -(1 - y_i m_i) - \tfrac12\big(T_i / \sqrt{\chi_i} + \sqrt{\chi_i}\big),

using :math:`\log K_{1/2}(z) = \tfrac12 \log(\pi / 2z) - z` (all constants cancel). At the optimum
:math:`\chi_i = T_i` it is :math:`y_i m_i - 1 - \sqrt{\chi_i}`, which equals the paper's
:math:`-1 + \log 2 - \tfrac12\log 2\pi + y_i m_i + \tfrac14 \log\chi_i + \log K_{1/2}(\sqrt{\chi_i})`
(Luts & Ormerod, Algorithms 1-2), and tends to :math:`-2(1 - y_i m_i)_+` as :math:`v_i \to 0`.

Without the augmentation, a scalar that shifts the scores of a group of rows (a random intercept)
has a normal prior times :math:`\exp\{-2 \sum_i (1 - y_i f_i)_+\}` as its conditional: piecewise
Gaussian between the rows' kinks, drawn exactly by :func:`sample_offsets`.

**Smoothed hinge** (for the trajectories of the linear sampler's HMC move only). The leapfrog
integrator's energy error jumps each time a row crosses its kink, which caps HMC's step. Its
trajectories may instead follow the gradient of the hinge smoothed over a width :math:`\delta`
(the hinge convolved with the uniform density on :math:`[-\delta/2, \delta/2]`),

.. math::

    h_\delta(g) = 0 \ (g \le -\delta/2), \qquad (g + \delta/2)^2 / (2\delta) \ (|g| < \delta/2), \qquad
    g \ (g \ge \delta/2),

(slope :math:`h_\delta'(g) = \min\{1, \max\{0, g/\delta + 1/2\}\}`, formed in the HMC target of
:class:`~vbsvm.models.linear.LinearSVMModel`) while the acceptance uses the exact hinge: leapfrog
steps are shears, volume preserving and reversible for any position-dependent force
(:mod:`vbsvm.mcmc.hmc`), so the transition keeps the exact posterior whatever the width; a
wider one only costs acceptance through the mismatch
:math:`-2\sum_i \{(g_i)_+ - h_\delta(g_i)\}` between the two log densities
(:func:`smoothing_mismatch`, which varies only through the rows within :math:`\delta/2` of
their kink). The sampler picks the widest of :data:`SMOOTHING_WIDTHS` whose mismatch varies
little over its tuning draws (:class:`~vbsvm.mcmc.block_tuner.BlockTuner`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr

from vbsvm.distributions import GIG, InverseGaussian, sample_truncated_std_normal

__all__ = ["CHI_FLOOR", "update_chi", "q_weights", "expected_inverse", "elbo", "sample_inverse", "working_response",
           "GroupLayout", "sample_offsets", "SMOOTHING_WIDTHS", "smoothing_mismatch"]

#: chi is clipped below at this value so that E[1/a] = chi^(-1/2) stays finite when a point sits
#: exactly on the margin (1 - y f = 0 and no posterior variance, e.g. in MAP/EM iterations).
CHI_FLOOR = 1e-12


def update_chi(y, mean_f, var_f):
    """Optimal ``chi_i = (1 - y_i m_i)^2 + v_i`` of q(a_i), clipped below at :data:`CHI_FLOOR`
    (evaluated in place: one row vector)."""
    chi = np.asarray(y * mean_f, dtype=float)
    np.subtract(1.0, chi, out=chi)
    np.square(chi, out=chi)
    chi += var_f
    return np.maximum(chi, CHI_FLOOR, out=chi)


def q_weights(chi) -> GIG:
    """The optimal mean-field factor ``q(a_i) = GIG(1/2, 1, chi_i)``."""
    return GIG(0.5, 1.0, chi)


def expected_inverse(chi):
    """``E_q[1/a_i] = chi_i^(-1/2)`` for q(a_i) = GIG(1/2, 1, chi_i) (the closed form of
    :meth:`GIG.mean_inv <vbsvm.distributions.GIG.mean_inv>`, without its per-row parameter arrays).

    Raises
    ------
    ValueError
        If some ``chi`` is not strictly positive (or is NaN), as :class:`~vbsvm.distributions.GIG`.
    """
    chi = np.asarray(chi, dtype=float)
    if not np.all(chi > 0):
        raise ValueError("GIG: chi must be strictly positive")
    return 1.0 / np.sqrt(chi)


def elbo(y, mean_f, var_f, chi, block=2 ** 16):
    """Sum over i of E_q[log p(y_i, a_i | f_i)] + H[q(a_i)] (see module docstring).

    With ``log q(a) = -log a / 2 - (a + chi / a) / 2 - log Z(chi)`` the terms in ``log a`` and ``a``
    cancel against those of ``log p(y, a | f)``, leaving
    ``-log(2 pi) / 2 - (1 - y m) + (chi - T) E_q[1/a] / 2 + log Z(chi)``: no ``E[log a]`` (an
    exponential integral) is needed. With ``E_q[1/a] = chi^(-1/2)`` and
    ``log Z(chi) = log(2 pi) / 2 - sqrt(chi)`` for GIG(1/2, 1, chi) this is
    ``-(1 - y m) - (chi + T) / (2 sqrt(chi))``, summed by blocks of ``block`` rows so that its
    temporaries stay small."""
    args = np.broadcast_arrays(*(np.atleast_1d(np.asarray(a, dtype=float)) for a in (y, mean_f, var_f, chi)))
    n = args[0].shape[0]
    return -float(sum(_negative_elbo_terms(*(a[s:s + block] for a in args)).sum() for s in range(0, n, block)))


def _negative_elbo_terms(y, mean_f, var_f, chi):
    """``(1 - y m) + (chi + T) / (2 sqrt(chi))`` row by row, in place (two temporaries)."""
    gap = y * mean_f
    np.subtract(1.0, gap, out=gap)
    part = np.square(gap)
    part += var_f  # T
    part += chi
    part /= np.sqrt(chi)
    part *= 0.5
    part += gap
    return part


def sample_inverse(y, f, rng):
    """Draw ``w_i = 1/a_i ~ InverseGaussian(1 / |1 - y_i f_i|, 1)`` given the scores ``f``.

    Uses the cancellation-free inverse-Gaussian sampler of :mod:`vbsvm.distributions`
    (``numpy``'s ``wald`` loses all precision once mean/shape exceeds ~1e16, i.e. for points
    within 1e-16 of the margin).
    """
    gap = np.maximum(np.abs(1.0 - y * f), np.sqrt(CHI_FLOOR))
    return InverseGaussian(1.0 / gap, 1.0).sample(rng)


#: widths of the smoothed hinge the HMC move may follow, narrowest first. Section 4.2 simulation
#: with d = 50 (n = 500), seeds 1-3, 4 x 2000 after 1000, min bulk ESS per second with the width
#: fixed: 846 / 990 / 801 exact, 1028 at 0.1, 1124 / 1237 / 1163 at 0.3, 943 / 736 at 0.6 (the
#: mismatch's sd over the posterior draws: 0.16 at 0.3, 0.46 at 0.6, 1.0 at 1.0, where the step
#: collapsed and the min ESS fell to 25); breast_cancer: 394 / 409 exact, 461 / 442 at 0.3, 522
#: at 0.6, 299 at 1.0 (mismatch sd 0.12: wider than 0.6 no longer pays even when it is small)
SMOOTHING_WIDTHS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6)


def smoothing_mismatch(gap, widths) -> np.ndarray:
    """``-2 sum_i {(gap_i)_+ - h_width(gap_i)}`` for each width: the exact log pseudo-likelihood
    minus the smoothed one (module docstring). Only rows within ``width/2`` of their kink
    contribute; they are picked once for the widest width."""
    widths = np.asarray(widths, dtype=float)
    g = gap[np.abs(gap) < 0.5 * widths.max()][:, None]  # (rows near their kink, 1)
    difference = np.maximum(g, 0.0) - (g + 0.5 * widths) ** 2 / (2.0 * widths)
    return -2.0 * np.where(np.abs(g) < 0.5 * widths, difference, 0.0).sum(axis=0)


def working_response(y, w):
    """Shift vector ``y_i (1 + w_i)`` of the Gaussian working likelihood."""
    return y * (1.0 + w)


class GroupLayout:
    """The intervals of :func:`sample_offsets` for fixed groups: group l's ``n_l`` rows cut the
    line into ``n_l + 1`` intervals, laid out group after group (``n + m`` in all). Built once per
    grouping; only the order of the kinks within each group changes from draw to draw.

    Parameters
    ----------
    codes : ndarray of int (n,)
        Group of each row, in ``[0, m)``.
    m : int
    """

    def __init__(self, codes, m):
        self.codes, self.m = np.asarray(codes, dtype=np.int64), int(m)
        #: the codes in the narrowest integer type (numpy's stable sort is a radix sort for them)
        self.sort_codes = self.codes.astype(np.int16 if self.m < 2 ** 15 else np.int64)
        counts = np.bincount(self.codes, minlength=self.m)
        #: first sorted row of each group (and n at the end)
        self.row_start = np.concatenate([[0], np.cumsum(counts)])
        #: first interval of each group
        self.interval_start = np.concatenate([[0], np.cumsum(counts + 1)])[:-1]
        self.interval_end = self.interval_start + counts + 1
        self.group = np.repeat(np.arange(self.m), counts + 1)
        below = np.arange(self.group.size) - self.interval_start[self.group]  # rows of the group below
        #: sorted row just above each interval (its upper kink), and whether it has a lower/upper kink
        self.row = self.row_start[self.group] + below
        self.has_low, self.has_high = below > 0, below < counts[self.group]


def sample_offsets(gap, slope, layout, prior_var, rng):
    r"""Exact draws of one scalar per group from its marginal (augmentation-free) conditional.

    Group l's scalar :math:`u_l` has prior :math:`N(0, \sigma^2)` (``prior_var``) and moves the
    scores of its rows so that row i's margin gap is ``gap_i - slope_i u_l``: for a random
    intercept ``gap_i = 1 - y_i f_{-l,i}`` and ``slope_i = y_i``. The density

    .. math::

        p(u_l \mid \cdot) \propto \exp\Big\{-\frac{u_l^2}{2\sigma^2}
            - 2 \sum_{i \in l} (\mathrm{gap}_i - \mathrm{slope}_i u_l)_+\Big\}

    is a normal times the exponential of a piecewise-linear function whose kinks are the rows'
    ``k_i = gap_i / slope_i``: between consecutive kinks it is
    :math:`\exp\{-u^2/(2\sigma^2) + \beta u + \gamma\}` with :math:`\beta = 2 \sum \mathrm{slope}_i`
    and :math:`\gamma = -2 \sum \mathrm{gap}_i` over the rows in the hinge there (slope > 0 with
    kink above u, slope < 0 with kink below), i.e. a normal :math:`N(\sigma^2\beta, \sigma^2)`
    restricted to the interval, with mass
    :math:`\exp(\sigma^2\beta^2/2 + \gamma)\,[\Phi(b) - \Phi(a)]` (up to a common factor). The
    draw picks an interval by these masses (inversion of each group's cumulative masses) and then
    a truncated normal in it (:func:`~vbsvm.distributions.sample_truncated_std_normal`, from
    the log normal CDFs the masses were computed with): an exact
    Gibbs step, where a slice move is one step of a chain. All groups at once: one sort of the n
    kinks and a few passes over the ``n + m`` intervals (:class:`GroupLayout`). A row with
    ``slope_i = 0`` does not depend on u_l; its kink is put at ``+inf`` (an empty interval).

    Parameters
    ----------
    gap, slope : ndarray (n,)
    layout : GroupLayout
        The groups of the rows.
    prior_var : float
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray (m,)
    """
    kink = np.divide(gap, slope, out=np.full(gap.shape, np.inf), where=slope != 0.0)
    by_kink = np.argsort(kink)
    order = by_kink[np.argsort(layout.sort_codes[by_kink], kind="stable")]  # by group, then kink
    up = slope > 0.0
    # beta = 2 (sum of slope over the up rows above + the down rows below) = 2 (the group's up
    # total + the sum below of -slope (up) or slope (down)); gamma likewise with gap
    up_slope = np.bincount(layout.codes, np.where(up, slope, 0.0), minlength=layout.m)
    up_gap = np.bincount(layout.codes, np.where(up, gap, 0.0), minlength=layout.m)
    beta = 2.0 * _sum_below(np.where(up, -slope, slope)[order], up_slope, layout)
    gamma = -2.0 * _sum_below(np.where(up, -gap, gap)[order], up_gap, layout)
    kinks = np.append(kink[order], np.inf)
    low = np.where(layout.has_low, kinks[layout.row - 1], -np.inf)
    high = np.where(layout.has_high, kinks[layout.row], np.inf)
    sd = math.sqrt(prior_var)
    mean = prior_var * beta
    nonempty = high > low  # tied kinks, and those at +inf of rows with slope 0, leave empty ones
    a = np.where(nonempty, (low - mean) / sd, -1.0)
    b = np.where(nonempty, (high - mean) / sd, 0.0)
    reflect = a > 0.0
    a, b = np.where(reflect, -b, a), np.where(reflect, -a, b)
    log_a, log_b = log_ndtr(a), log_ndtr(b)
    mass = -np.expm1(log_a - log_b)  # (Phi(b) - Phi(a)) / Phi(b)
    log_mass = np.log(mass, out=np.full(mass.shape, -np.inf), where=nonempty & (mass > 0.0))
    log_mass += 0.5 * prior_var * beta * beta + gamma + log_b
    # one interval per group with probability proportional to its mass: inversion of the
    # group's cumulative masses (scaled by the group's largest, so nothing overflows)
    weight = np.exp(log_mass - np.maximum.reduceat(log_mass, layout.interval_start)[layout.group])
    cum = np.cumsum(weight)
    end = cum[layout.interval_end - 1]
    start = end - np.add.reduceat(weight, layout.interval_start)
    chosen = np.searchsorted(cum, start + rng.random(layout.m) * (end - start), side="right")
    # a target rounded up to the group's total must not land on a trailing empty interval
    last = np.maximum.reduceat(np.where(weight > 0.0, np.arange(weight.size), -1), layout.interval_start)
    chosen = np.clip(chosen, layout.interval_start, last)
    log_interval = log_b[chosen] + np.log(mass[chosen])  # log(Phi(b) - Phi(a)): nonempty, mass > 0
    z = sample_truncated_std_normal(a[chosen], b[chosen], log_a[chosen], log_interval, rng)
    return mean[chosen] + sd * np.where(reflect[chosen], -z, z)


def _sum_below(signed, up_total, layout):
    """Per interval of :func:`sample_offsets`: the group's ``up_total`` plus the sum of
    ``signed`` (in sorted row order) over the group's rows below the interval."""
    prefix = np.zeros(signed.size + 1)
    np.cumsum(signed, out=prefix[1:])
    return prefix[layout.row] + (up_total - prefix[layout.row_start[:-1]])[layout.group]
