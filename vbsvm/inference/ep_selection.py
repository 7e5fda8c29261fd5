r"""Expectation propagation for the Laplace-zero prior: the calibrated ``method="vb"`` of
``vbsvm.svm(..., prior=LaplaceZero(...))``.

Model (:mod:`vbsvm.models.selection`): each selectable coefficient has the spike-and-slab
Laplace prior :math:`p(u_k \mid \sigma_u) = (1 - \rho)\,\delta_0(u_k) + \rho\, e^{-|u_k|/\sigma_u}/(2\sigma_u)`,
the other coefficients their Gaussian priors, and the rows the hinge pseudo-likelihood.

**Sites.** EP approximates the hinge factors as in :mod:`vbsvm.inference.ep` and, in the same
parallel pass, each prior factor :math:`p(u_k \mid \sigma_u)` by a Gaussian site
:math:`\exp(-\tilde\tau_k u_k^2/2 + \tilde\nu_k u_k)`. With the marginal :math:`N(u_k; \mu_k, \Sigma_{kk})`
of q, the cavity is :math:`v = (1/\Sigma_{kk} - \tilde\tau_k)^{-1}`,
:math:`m = v(\mu_k/\Sigma_{kk} - \tilde\nu_k)`, and the tilted distribution
:math:`N(u; m, v)\, p(u \mid \sigma_u)` has, with :math:`s = \sigma_u`,
:math:`\beta_\pm = \mp m/s + v/(2 s^2) - \log(2s)`, :math:`a_\pm = (\pm m - v/s)/\sqrt v`:

.. math::

    Z_0 = N(0; m, v), \qquad Z_1 = e^{\beta_+}\Phi(a_+) + e^{\beta_-}\Phi(a_-), \qquad
    Z = (1 - \rho) Z_0 + \rho Z_1,

the spike's and the slab's shares. Given inclusion the tilted density is the two-piece mixture of
:math:`N(m - v/s, v)` truncated to :math:`u > 0` (weight :math:`e^{\beta_+}\Phi(a_+)/Z_1`) and
:math:`N(m + v/s, v)` truncated to :math:`u < 0`, whose moments are those of truncated normals;
the inclusion probability is :math:`\pi_k = \rho Z_1/Z` and the tilted moments
:math:`E u = \pi_k E_1 u`, :math:`E u^2 = \pi_k E_1 u^2` (:func:`spike_slab_tilted`).

**Negative site precisions.** The tilted distribution is not log-concave: when both "in" and
"out" are plausible its variance exceeds the cavity's and the moment-matching site has a
negative precision, which can make q improper. The site precision is therefore floored at 0
and its shift set so that q's mean still equals the tilted mean; where the floor binds, q's
variance of :math:`u_k` is the cavity's, smaller than the tilted one. The summaries do not use
q's marginals of :math:`u_k`: they report the tilted spike-and-slab itself (below).

**Fixed points.** Spike-and-slab EP has several fixed points, and parallel EP can oscillate
between terms that stand in for each other. The first run starts from the hinge sites of the
ridge model whose Gaussian prior has the slab's variance (started from the prior, EP pinned
spam's ``your`` and ``make`` at 0: log Z_EP -2041.7 instead of -2026.5); later runs continue
from the last fixed point, which keeps the log density of the variances smooth along the grid.
A run that has not converged after :data:`SELECTION_ANNEAL_AFTER` sweeps shrinks its damping
geometrically (``expectation_propagation(anneal_after=...)``): the sites settle, not at a fixed
point, and a warning gives the posterior weight of such runs (breast_cancer: most of it).

**Evidence and the Laplace scale.** The EP log marginal pseudo-likelihood is that of
:mod:`vbsvm.inference.ep` with the prior-site terms added (coordinates with prior sites have no
Gaussian prior factor, :meth:`vbsvm.inference.ep._Sweep.log_z`). At an EP fixed point its
derivative in :math:`\eta_u = \log\sigma_u^2` is :math:`\sum_k \partial \log Z_k/\partial\eta_u`
with the cavities held fixed (tested to 1e-5; about 1% off where a site's precision is floored,
which only steers the search for the mode); the other variance components keep the Gaussian
formula. :math:`\sigma_u^2` (and the random-intercept variances) are integrated over the grid of
:func:`vbsvm.inference.ep.integrate_variances`.

**Reported posterior.** Per grid point, the inclusion probability and the slab's mean and
variance of each term are the tilted ones at the fixed point; at the heaviest grid point they
are corrected with the exact hinge factors along each coefficient, with the exact prior of the
term and of its most correlated partner (:func:`pair_corrected_inclusion`; of the term alone,
:func:`corrected_inclusion`, where that would cost more than
:data:`PAIR_CORRECT_MAX_EVALUATIONS` row factors), and the change (of the logit and of the
slab's mean and variance) is carried to the other points. Over the grid they are mixed by the
grid weights. The fit stores them in the spike-and-slab form of the mean-field fit: the slab as
a Gaussian with those moments and with the correlations of the EP Gaussian
(:class:`~vbsvm.posterior.representations.SpikeSlabApproximation` reads both the same way).

**Hyperprior on rho.** With ``rho ~ Beta(a, b)`` (``LaplaceZero(rho=Beta(a, b))``, the default)
``logit(rho)`` joins the log variances in the integration (:class:`SpikeSlabHyperEvidence`): each
grid point is an EP fixed point at its ``(sigma_u, rho)``, weighted by the EP evidence there times
the priors of both, so the weights over the values of ``rho`` are the evidence of each times its
Beta density, normalised; the inclusion probabilities and coefficient moments are the mixtures
over the grid, and the inclusion correction of the heaviest point is carried to the others as
before. The mode search moves ``rho`` by the EM step :math:`(a + \sum_k \pi_k)/(a + b + m)` and
Newton steps with the gradient of the evidence, whose ``rho`` part is closed form.

Measured against Gibbs (``benchmarks/spam_selection.py``): see the README, section "VB against
MCMC"; with the hyperprior, ``benchmarks/selection_hyperprior.py``.
"""

from __future__ import annotations

import time
import warnings
from typing import NamedTuple

import numpy as np
from scipy.special import betaln, expit, log_expit, log_ndtr, logit

from vbsvm.exceptions import ConvergenceWarning
from vbsvm.inference.ep import (
    EP_CORRECT_MAX_N,
    _Evidence,
    _moments,
    _sparse_block_moments,
    expectation_propagation,
    integrate_variances,
    inverse_gamma_match,
    log_site_corrections,
    log_site_ratios,
    score_covariances,
)
from vbsvm.inference.threads import limit_blas
from vbsvm.spd import spd_inverse

__all__ = ["SpikeSlabTilted", "spike_slab_tilted", "SpikeSlabSites", "SpikeSlabEvidence", "SpikeSlabHyperEvidence",
           "corrected_inclusion", "pair_corrected_inclusion", "fit_calibrated_selection", "beta_moment_match"]

LOG_2PI = np.log(2.0 * np.pi)

#: Floor of the prior-site precisions (see the module docstring).
MIN_SITE_PRECISION = 0.0

#: EP options of a Laplace-zero fit (measured on spam, rho = 0.01). Site tolerance: 1e-2 gave
#: log Z_EP within 0.005 of 1e-4 and the same inclusion probabilities to 0.01, at half the
#: sweeps. Where terms are correlated and each can stand in for the other (breast_cancer's
#: radius, perimeter and area), parallel EP can oscillate, the terms taking turns in the model;
#: after :data:`SELECTION_ANNEAL_AFTER` sweeps the damping shrinks geometrically so that the
#: sites settle (``info["annealed"]`` counts such runs; a warning names their posterior weight),
#: and :data:`SELECTION_MAX_SWEEPS` caps the rest. Grid: step 1.5 sd, explored while the log
#: density is within 4 of the mode's (the inclusion probabilities change little with sigma_u:
#: 5 grid points on spam; with a drop of 4.5 the next point out, of weight e^-15, switched to
#: another fixed point and cost 250 sweeps, a third of the fit).
SELECTION_TOL = 1e-2
SELECTION_ANNEAL_AFTER = 100
SELECTION_MAX_SWEEPS = 300
SELECTION_DZ = 1.5
SELECTION_DROP = 4.0


class SpikeSlabTilted(NamedTuple):
    """Moments of ``N(u; m, v) p(u)`` for the spike-and-slab Laplace prior ``p``."""

    log_z: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    p_include: np.ndarray
    slab_mean: np.ndarray
    slab_var: np.ndarray


def _truncated_moments(mu, sd):
    """Mean and variance of ``N(mu, sd^2)`` truncated to ``u > 0``: with ``a = mu / sd`` and the
    inverse Mills ratio ``lam = phi(a) / Phi(a)``, ``mu + sd lam`` and ``sd^2 (1 - lam (lam + a))``.
    For ``a < -30`` the asymptotic variance ``sd^2 / a^2 (1 - 6 / a^2)`` avoids the cancellation."""
    a = mu / sd
    lam = np.exp(-0.5 * a * a - 0.5 * LOG_2PI - log_ndtr(a))
    var_ratio = np.where(a > -30.0, 1.0 - lam * (lam + a), (1.0 - 6.0 / (a * a)) / (a * a))
    return mu + sd * lam, sd * sd * np.maximum(var_ratio, 0.0)


def spike_slab_tilted(m, v, log_rho, log_1mrho, scale) -> SpikeSlabTilted:
    r"""Normalizer and moments of ``N(u; m, v) [(1 - rho) delta_0(u) + rho Laplace(u; 0, scale)]``.

    Parameters
    ----------
    m, v : ndarray
        Mean and variance (> 0) of the Gaussian (the cavity).
    log_rho, log_1mrho : float
        ``log rho`` and ``log(1 - rho)``.
    scale : float
        Laplace scale ``sigma_u`` (density ``exp(-|u| / scale) / (2 scale)``).

    Returns
    -------
    SpikeSlabTilted
        ``log_z``; the tilted ``mean`` and ``var``; ``p_include`` (the slab's share); the mean
        and variance of the tilted distribution given inclusion (``slab_mean``, ``slab_var``).
    """
    m, v = np.asarray(m, dtype=float), np.asarray(v, dtype=float)
    sd = np.sqrt(v)
    log_z0 = -0.5 * m * m / v - 0.5 * (LOG_2PI + np.log(v))
    base = 0.5 * v / scale ** 2 - np.log(2.0 * scale)
    log_pos = base - m / scale + log_ndtr((m - v / scale) / sd)
    log_neg = base + m / scale + log_ndtr((-m - v / scale) / sd)
    log_z1 = np.logaddexp(log_pos, log_neg)
    log_z = np.logaddexp(log_1mrho + log_z0, log_rho + log_z1)
    p_in = np.exp(log_rho + log_z1 - log_z)
    w_pos = np.exp(log_pos - log_z1)
    mp, vp = _truncated_moments(m - v / scale, sd)
    mn, vn = _truncated_moments(-m - v / scale, sd)  # of -u, truncated to -u > 0
    slab_mean = w_pos * mp - (1.0 - w_pos) * mn
    slab_m2 = w_pos * (vp + mp * mp) + (1.0 - w_pos) * (vn + mn * mn)
    slab_var = np.maximum(slab_m2 - slab_mean ** 2, 0.0)
    mean = p_in * slab_mean
    var = np.maximum(p_in * slab_m2 - mean * mean, 0.0)
    return SpikeSlabTilted(log_z, mean, var, p_in, slab_mean, slab_var)


class SpikeSlabSites:
    """The Laplace-zero prior factors of the coordinates ``index`` as EP sites (the ``prior`` of
    :func:`vbsvm.inference.ep.expectation_propagation`).

    Parameters
    ----------
    index : ndarray of int
        Dense coordinates of theta under the prior.
    log_rho, log_1mrho : float
    scale : float
        Laplace scale ``sigma_u``.
    """

    def __init__(self, index, log_rho, log_1mrho, scale):
        self.index = np.asarray(index, dtype=np.int64)
        self.log_rho, self.log_1mrho, self.scale = float(log_rho), float(log_1mrho), float(scale)

    def start(self):
        """Initial sites: the Gaussian with the slab's variance ``2 scale^2``, mean 0."""
        k = self.index.size
        return np.full(k, 0.5 / self.scale ** 2), np.zeros(k)

    def tilted(self, m, v, scale=None) -> SpikeSlabTilted:
        return spike_slab_tilted(m, v, self.log_rho, self.log_1mrho, self.scale if scale is None else scale)

    def site(self, m, v, tilted):
        """Site ``(precision, shift)`` that moves q's marginal to the tilted moments: precision
        ``1/var - 1/v`` floored at :data:`MIN_SITE_PRECISION`, shift matching the mean."""
        with np.errstate(divide="ignore"):
            prec = np.maximum(1.0 / tilted.var - 1.0 / v, MIN_SITE_PRECISION)
        return prec, tilted.mean * (1.0 / v + prec) - m / v


class SpikeSlabEvidence(_Evidence):
    """``log p~(eta | y)`` of the Laplace-zero model: ``eta[0] = log sigma_u^2`` sets the Laplace
    scale of the prior sites; the other components are the random-effect variances.

    Parameters
    ----------
    selection : vbsvm.models.selection.LaplaceZeroModel
    options : dict
        Options of :func:`vbsvm.inference.ep.expectation_propagation`.
    """

    #: step in eta of the central difference of the prior sites' log normalizers
    H = 1e-5

    def __init__(self, selection, options):
        super().__init__(selection.base, options)
        self.selection = selection

    def run(self, eta, sites=None):
        """As :meth:`_Evidence.run`; the first EP run starts from the hinge sites of the ridge
        model whose Gaussian prior has the slab's variance, the others from the sites passed
        (a neighbouring grid point's) or the last run's.

        The spike-and-slab EP has several fixed points. Started with the prior sites' updates
        from the first sweep, EP tended to pin terms at 0 whose fit is then taken over by
        correlated terms (spam: log Z_EP -2041.7 instead of -2026.5 at the same sigma_u)."""
        if sites is None and self.sites is None:
            prior = self.prior(eta)
            eta = np.asarray(eta, dtype=float)
            tau = self.model.prior_precision(np.exp(-eta[: len(self.sizes)]))
            tau[prior.index] = prior.start()[0]
            blocks = self.model.prior_blocks([spd_inverse(S) for S in self.covariances_at(eta)])
            try:
                ridge = expectation_propagation(self.model, tau, blocks=blocks, **self.options)
                sites = tuple(np.concatenate(pair) for pair in zip((ridge.site_prec, ridge.site_shift), prior.start()))
            except FloatingPointError:
                sites = None
        return super().run(eta, sites)

    def prior(self, eta):
        s = self.selection
        return SpikeSlabSites(s.sel, s.log_rho, s.log_1mrho, float(np.exp(0.5 * eta[0])))

    def em_start(self, eta, res):
        """As the Gaussian components' EM step, with the Laplace scale set to the included terms'
        mean absolute slab mean (the maximum-likelihood scale of a Laplace sample is its mean
        absolute value; second moments, ``E u^2 = 2 sigma_u^2``, let the few largest coefficients
        decide and walked away from the mode on spam)."""
        new = super().em_start(eta, res)
        t = res.tilted
        scale = np.sum(t.p_include * np.abs(t.slab_mean)) / max(np.sum(t.p_include), 1e-12)
        new[0] = 2.0 * np.log(max(scale, 1e-12))
        return new

    def gradient(self, eta, res):
        grad = super().gradient(eta, res)
        sites = self.prior(eta)
        cm, cv = res.prior_cavity
        up = sites.tilted(cm, cv, scale=float(np.exp(0.5 * (eta[0] + self.H)))).log_z
        down = sites.tilted(cm, cv, scale=float(np.exp(0.5 * (eta[0] - self.H)))).log_z
        m = self.model
        grad[0] = float(np.sum(up - down)) / (2.0 * self.H) - m.A + m.B * np.exp(-eta[0])
        return grad


class SpikeSlabHyperEvidence(SpikeSlabEvidence):
    r"""``log p~(eta | y)`` of the Laplace-zero model with ``rho ~ Beta(a, b)``: ``eta`` gains the
    coordinate ``x = logit(rho)`` right after the log variances (before the log-Cholesky
    coordinates of covariances, so that :class:`~vbsvm.inference.ep.GridPosterior` counts it with
    the log variances and reads the covariances where they were).

    The density adds the prior of ``x``, the Beta density times the Jacobian
    :math:`\rho(1 - \rho)`: :math:`a\log\rho + b\log(1 - \rho) - \log B(a, b)`. At an EP fixed
    point the derivative of :math:`\log Z_{EP}` in ``x`` is that of the prior sites' log
    normalizers with the cavities held fixed (as for :math:`\sigma_u`):
    :math:`\partial \log Z_k/\partial x = \rho(1-\rho)(Z_{1,k} - Z_{0,k})/Z_k = \pi_k - \rho`, so the
    gradient is :math:`a + \sum_k \pi_k - (a + b + m)\rho`, zero at the EM update
    :math:`\rho = (a + \sum_k \pi_k)/(a + b + m)` (:meth:`em_start`).

    Parameters
    ----------
    selection : vbsvm.models.selection.LaplaceZeroModel
        With a hyperprior (``selection.rho_prior = (a, b)``).
    options : dict
        Options of :func:`vbsvm.inference.ep.expectation_propagation`.
    """

    def __init__(self, selection, options):
        super().__init__(selection, options)
        self.a, self.b = selection.rho_prior
        #: position of logit(rho) in eta
        self.r = len(self.sizes)

    @property
    def n_variances(self) -> int:
        return super().n_variances + 1

    def covariances_at(self, eta) -> list:
        return super().covariances_at(np.delete(np.asarray(eta, dtype=float), self.r))

    def _cov_coordinates(self, eta):
        yield from super()._cov_coordinates(np.delete(np.asarray(eta, dtype=float), self.r))

    def log_prior_rho(self, x) -> float:
        """Log density of ``x = logit(rho)`` under ``rho ~ Beta(a, b)``."""
        return float(self.a * log_expit(x) + self.b * log_expit(-x) - betaln(self.a, self.b))

    def run(self, eta, sites=None):
        """As :meth:`SpikeSlabEvidence.run`, with the prior of ``logit(rho)`` in the density."""
        lp, grad, res = super().run(eta, sites)
        return lp + self.log_prior_rho(float(np.asarray(eta)[self.r])), grad, res

    def prior(self, eta):
        x = float(np.asarray(eta)[self.r])
        return SpikeSlabSites(self.selection.sel, log_expit(x), log_expit(-x), float(np.exp(0.5 * eta[0])))

    def em_start(self, eta, res):
        """As :meth:`SpikeSlabEvidence.em_start`, and ``rho = (a + sum_k pi_k) / (a + b + m)``."""
        new = super().em_start(eta, res)
        rho = (self.a + float(np.sum(res.tilted.p_include))) / (self.a + self.b + self.selection.m)
        return np.insert(new, self.r, logit(rho))

    def gradient(self, eta, res):
        grad = super().gradient(eta, res)
        cm, cv = res.prior_cavity
        p_include = self.prior(eta).tilted(cm, cv).p_include
        rho = float(expit(np.asarray(eta)[self.r]))
        return np.insert(grad, self.r, self.a + float(np.sum(p_include)) - (self.a + self.b + self.selection.m) * rho)


def beta_moment_match(mean, sd):
    """Shapes ``(a, b)`` of the Beta distribution with this mean and sd (the sd capped below the
    largest a Beta of that mean can have, ``sqrt(mean (1 - mean))``)."""
    var = min(float(sd) ** 2, 0.999 * mean * (1.0 - mean))
    total = mean * (1.0 - mean) / max(var, 1e-300) - 1.0
    return mean * total, (1.0 - mean) * total


#: Points (cavity sds around the cavity mean) at which the corrected slab is evaluated.
CORRECTION_Z = np.linspace(-10.0, 10.0, 41)


def corrected_inclusion(fit, model, prior, z=CORRECTION_Z):
    r"""Inclusion probabilities and slab moments with the factorized correction of the hinge sites.

    EP's cavity of a term is Gaussian; where a few rows set the coefficient (a rare word on spam)
    the hinge likelihood along it is far from Gaussian and the cavity's density at 0 decides the
    inclusion badly. As :func:`vbsvm.inference.ep.corrected_marginals`, the exact marginal of
    :math:`u_k` is approximated by the cavity times the exact prior times the expected ratio of
    every hinge factor to its site given :math:`u_k`,
    :math:`\tilde p(u) \propto N(u; m, v)\, p(u \mid \sigma_u) \prod_i \epsilon_i(u)`
    (:func:`vbsvm.inference.ep.log_site_corrections`): the spike's mass is
    :math:`(1-\rho) N(0; m, v) \prod_i \epsilon_i(0)`, the slab's the integral of the rest over
    ``z`` (rectangle rule). On spam (rho = 0.01) this took the share of terms within 0.2 of Gibbs'
    inclusion probability from 0.89 to 0.93.

    Parameters
    ----------
    fit : vbsvm.inference.ep.EPResult
        An EP fixed point with prior sites (``tilted``, ``prior_cavity``).
    model : vbsvm.models.linear.LinearSVMModel
    prior : SpikeSlabSites
        The prior sites of ``fit``.
    z : ndarray
        Evaluation points in cavity sds.

    Returns
    -------
    p_include, slab_mean, slab_var : ndarray
    """
    cm, cv = fit.prior_cavity
    sd = np.sqrt(cv)
    X = np.concatenate([cm[:, None] + sd[:, None] * z[None, :], np.zeros((cm.size, 1))], axis=1)
    L = np.zeros((cm.size, model.qd))
    L[np.arange(cm.size), prior.index] = 1.0
    log_eps = log_site_corrections(fit, model, L, X)
    log_cavity = -0.5 * (X - cm[:, None]) ** 2 / cv[:, None]  # N(x; m, v) up to its normalizer
    slab = log_cavity[:, :-1] + log_eps[:, :-1] - np.abs(X[:, :-1]) / prior.scale - np.log(2.0 * prior.scale)
    top = slab.max(axis=1)
    w = np.exp(slab - top[:, None])
    log_slab = prior.log_rho + top + np.log(w.sum(axis=1) * sd * (z[1] - z[0]))
    log_spike = prior.log_1mrho + log_cavity[:, -1] + log_eps[:, -1]
    w /= w.sum(axis=1, keepdims=True)
    x = X[:, :-1]
    mean = np.einsum("kg,kg->k", w, x)
    var = np.maximum(np.einsum("kg,kg->k", w, (x - mean[:, None]) ** 2), 0.0)
    return expit(log_slab - log_spike), mean, var


#: Points (cavity sds) along each axis of the pairwise correction's grids. On breast_cancer, 15 on
#: [-8, 8] gave the inclusion probabilities of 61 on [-10, 10] to 0.002 and the slab means to
#: 0.025 slab sd, in about a tenth of the time (11 points: 0.002 and 0.13 sd, in half the time of 15).
PAIR_Z = np.linspace(-8.0, 8.0, 15)

#: Largest ``n * m * |PAIR_Z|^2`` (rows x selectable terms x points of a pair's plane: about the
#: row factors it evaluates) for which the fit runs :func:`pair_corrected_inclusion`; beyond it
#: the single-term :func:`corrected_inclusion`. breast_cancer (569 x 30): 3.8e6; spam (4601 x 57):
#: 5.9e7, about ten times breast_cancer's time, where the pairwise correction agreed with Gibbs on
#: the same 91% of the terms as the single-term one.
PAIR_CORRECT_MAX_EVALUATIONS = 2.0e7


def pair_corrected_inclusion(fit, model, prior, z=PAIR_Z):
    r"""Inclusion probabilities and slab moments with each term's most correlated partner treated
    exactly too.

    :func:`corrected_inclusion` keeps every other term at its Gaussian site. Where terms stand in
    for each other (breast_cancer's radius, perimeter and area; the concavity terms) EP's Gaussian
    has committed to one of them, and the site of the partner that is in the model leaves no room
    for the term corrected. Here term :math:`k` and the term :math:`j` with the largest
    :math:`|\mathrm{corr}_q(u_k, u_j)|` both get their exact spike-and-slab priors, and the hinge
    factors their exact form along :math:`(u_k, u_j)`:

    .. math::

        \tilde p(u_k, u_j) \propto N(u; c, C)\, p(u_k \mid \sigma_u)\, p(u_j \mid \sigma_u)
            \prod_i \int q(f_i \mid u)\, \frac{t_i(f_i)}{\tilde t_i(f_i)}\, df_i,

    with :math:`N(u; c, C)` the pair's cavity (the EP Gaussian of :math:`(u_k, u_j)` without their
    two prior sites) and :math:`q(f_i \mid u)` EP's conditional of the score (the closed form of
    :func:`vbsvm.inference.ep.log_site_ratios`). Its four parts, both terms out, one in, both in,
    are integrated on ``z`` (cavity sds, along the cavity's Cholesky axes in the plane); the
    inclusion probability of :math:`k` is the mass of the two parts with :math:`u_k \ne 0`, and
    the slab's moments are those of :math:`u_k` there (when :math:`k` is :math:`j`'s most
    correlated partner too, the same integral gives :math:`j`'s). With two selectable coefficients and
    nothing else in the model, :math:`q(f_i \mid u)` is a point mass and this is the exact
    posterior at ``sigma_u`` (tested by quadrature). On breast_cancer (rho = 0.01) it took the
    share of terms within 0.2 of Gibbs' inclusion probability from 87% to 90% (the two most
    correlated partners, a 2^3-part integral over up to three dimensions, also gave 90%;
    averaging the pairs of the two or three most correlated partners instead gave 87%).

    Parameters
    ----------
    fit : vbsvm.inference.ep.EPResult
        An EP fixed point with prior sites.
    model : vbsvm.models.linear.LinearSVMModel
    prior : SpikeSlabSites
        The prior sites of ``fit``.
    z : ndarray
        Evaluation points in cavity sds along each axis.

    Returns
    -------
    p_include, slab_mean, slab_var : ndarray
    """
    idx = prior.index
    m, n = idx.size, model.n
    if m < 2:
        return corrected_inclusion(fit, model, prior)
    C = fit.post.cov_dense()
    R = C[np.ix_(idx, idx)]
    sd = np.sqrt(np.diag(R))
    corr = R / np.outer(sd, sd)
    np.fill_diagonal(corr, 0.0)
    partner = np.argmax(np.abs(corr), axis=1)
    L = np.zeros((m, model.qd))
    L[np.arange(m), idx] = 1.0
    K = score_covariances(fit, model, L, C[:, idx])
    mf, vf = fit.post.linear_predictor()
    mu = fit.mean[idx]
    tau, nu = fit.site_prec[n:], fit.site_shift[n:]
    dz = z[1] - z[0]
    G = z.size
    zz = np.stack(np.meshgrid(z, z, indexing="ij"), axis=-1).reshape(-1, 2)
    log_phi1 = -0.5 * z * z - 0.5 * LOG_2PI  # N(0, 1) at the points of an axis
    log_phi2 = -0.5 * np.sum(zz * zz, axis=1) - LOG_2PI

    def log_laplace(u):
        return -np.abs(u) / prior.scale - np.log(2.0 * prior.scale)

    p = np.empty(m)
    slab_mean = np.empty(m)
    slab_var = np.empty(m)
    part = np.repeat(np.arange(4), [1, G, G, G * G])  # of each point: both out, k in, j in, both in
    done = np.zeros(m, dtype=bool)
    single = None
    for k in range(m):
        if done[k]:
            continue
        pair = np.array([k, partner[k]])
        try:  # the pair's cavity; where it is no proper Gaussian the term keeps the single-term correction
            if pair[1] == k:
                raise np.linalg.LinAlgError("no partner")
            S = R[np.ix_(pair, pair)]
            Sinv = np.linalg.inv(S)
            cav_prec = Sinv - np.diag(tau[pair])
            cav_cov = np.linalg.inv(cav_prec)
            c = cav_cov @ (Sinv @ mu[pair] - nu[pair])
            chol = np.linalg.cholesky(cav_cov)
            if not np.all(np.isfinite(c)):
                raise np.linalg.LinAlgError("cavity mean not finite")
        except np.linalg.LinAlgError:
            if single is None:
                single = corrected_inclusion(fit, model, prior)
            p[k], slab_mean[k], slab_var[k] = (x[k] for x in single)
            done[k] = True
            continue
        U, log_w = [np.zeros((1, 2))], []
        log_w.append(2 * prior.log_1mrho - 0.5 * c @ cav_prec @ c - LOG_2PI - np.sum(np.log(np.diag(chol))))
        for axis in (0, 1):
            other = 1 - axis
            cm = c[axis] - cav_cov[axis, other] / cav_cov[other, other] * c[other]
            cs = np.sqrt(cav_cov[axis, axis] - cav_cov[axis, other] ** 2 / cav_cov[other, other])
            u = np.zeros((G, 2))
            u[:, axis] = cm + cs * z
            U.append(u)
            at_zero = -0.5 * c[other] ** 2 / cav_cov[other, other] - 0.5 * (LOG_2PI + np.log(cav_cov[other, other]))
            log_w.append(prior.log_rho + prior.log_1mrho + at_zero + log_phi1 + log_laplace(u[:, axis]) + np.log(dz))
        u = c + zz @ chol.T
        U.append(u)
        log_w.append(2 * prior.log_rho + log_phi2 + log_laplace(u[:, 0]) + log_laplace(u[:, 1]) + 2 * np.log(dz))
        U = np.concatenate(U)
        A = K[:, pair] @ Sinv
        b = np.maximum(vf - np.einsum("ij,ij->i", A, K[:, pair]), 0.0)[:, None]
        a = mf[:, None] + A @ (U - mu[pair]).T
        lw = np.concatenate([np.atleast_1d(x) for x in log_w]) + log_site_ratios(fit, model, a, b).sum(0)
        w = np.exp(lw - lw.max())
        # the same four parts give the partner's inclusion when k is its partner too
        for axis in (0, 1) if partner[pair[1]] == k else (0,):
            t = pair[axis]
            inside = (part == 1 + axis) | (part == 3)
            p[t] = w[inside].sum() / w.sum()
            wt = w[inside] / w[inside].sum()
            ut = U[inside, axis]
            slab_mean[t] = wt @ ut
            slab_var[t] = max(wt @ (ut - slab_mean[t]) ** 2, 0.0)
            done[t] = True
    return p, slab_mean, slab_var


def _rho_posterior(grid, r) -> dict:
    """Posterior mean and sd of rho from a grid whose coordinate ``r`` is ``logit(rho)`` (the grid
    rule on its points; with CCD the moments of 20,000 draws of its split normal, as the
    variances'), and the Beta with those moments (``q_rho``)."""
    if grid.split_scales is None:
        rho, w = expit(grid.eta[:, r]), grid.weights
    else:
        draws = grid.sample_eta(np.zeros(20_000, dtype=int), np.random.default_rng(0))
        rho, w = expit(draws[:, r]), np.full(len(draws), 1.0 / len(draws))
    mean = float(w @ rho)
    sd = float(np.sqrt(max(w @ (rho * rho) - mean * mean, 0.0)))
    return {"rho_mean": mean, "rho_sd": sd, "q_rho": np.array(beta_moment_match(mean, sd))}


def fit_calibrated_selection(model, settings=None) -> dict:
    """EP for the Laplace-zero model integrated over its variances, in the spike-and-slab form of
    the mean-field fit (standardized scale).

    Parameters
    ----------
    model : vbsvm.models.selection.LaplaceZeroModel
        With random slopes, the covariances' log-Cholesky coordinates join the integration (by
        CCD, see :func:`vbsvm.inference.ep.integrate_variances`).
    settings : dict, optional
        Reads ``ep_dz``, ``ep_drop``, ``ep_damping``, ``ep_tol``, ``ep_correct`` as
        :func:`vbsvm.inference.ep.fit_calibrated`; ``ep_correct_pairs`` (default: within
        :data:`PAIR_CORRECT_MAX_EVALUATIONS`) chooses :func:`pair_corrected_inclusion` over
        :func:`corrected_inclusion`; ``chains``, ``draws``, ``draw_seed`` (or ``seed``) for the
        stored draws of the covariances.

    Returns
    -------
    dict
        ``mean``, ``var`` (q,), ``cov_dense`` (qd, qd), ``cov_ds`` (qd, m_sparse): the slab
        Gaussian (selectable coordinates) and the other coefficients' mixture moments;
        ``p_include`` (number of selectable terms,); ``var_shape``, ``var_scale``,
        ``sigma2_mean``, ``sigma2_sd``; the grid (``grid_eta``, ``grid_weights``,
        ``grid_log_density``, ``grid_step``, ``grid_p_include``); ``log_evidence``; ``info``; with
        random slopes ``cov_draws`` (chains, draws, sum q^2) and ``theta_cov_ss_blocks`` (m, q, q)
        of the eliminated term; under a hyperprior on rho its posterior ``rho_mean``, ``rho_sd``
        and ``q_rho``, the shapes of the Beta with those moments (``grid_eta[:, K]`` is
        ``logit(rho)``, K the number of variances).
    """
    settings = settings or {}
    start = time.perf_counter()
    base = model.base
    hyper = getattr(model, "rho_prior", None) is not None  # rho ~ Beta(a, b): logit(rho) joins the grid
    with limit_blas(getattr(model, "blas_work", 0.0)):
        grid = integrate_variances(base, dz=settings.get("ep_dz", SELECTION_DZ),
                                   drop=settings.get("ep_drop", SELECTION_DROP),
                                   damping=settings.get("ep_damping", 0.5), tol=settings.get("ep_tol", SELECTION_TOL),
                                   max_sweeps=settings.get("ep_max_sweeps", SELECTION_MAX_SWEEPS),
                                   anneal_after=settings.get("ep_anneal_after", SELECTION_ANNEAL_AFTER),
                                   mode_sd_tol=0.25, warn_unconverged=False,
                                   strategy=settings.get("ep_strategy", "auto"),
                                   evidence=lambda _, options: (SpikeSlabEvidence if not hyper
                                                                else SpikeSlabHyperEvidence)(model, options))
    stuck = sum(wk for wk, f in zip(grid.weights, grid.fits) if f.annealed or not f.converged)
    if stuck > 0.05:
        warnings.warn(f"EP for the Laplace-zero prior did not reach a fixed point at variance values carrying "
                      f"{stuck:.0%} of the posterior weight (correlated terms taking turns in the model); its sites were "
                      "frozen by annealed damping. Check the inclusion probabilities with method='gibbs'.",
                      ConvergenceWarning, stacklevel=4)
    mean, var, cov_d, cov_ds, _ = _moments(grid, base, np.eye(base.qd))
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        raise FloatingPointError("EP for the Laplace-zero prior gave non-finite moments; fit this model with "
                                 "method='meanfield' or method='gibbs'")
    w = grid.weights
    p = np.array([f.tilted.p_include for f in grid.fits])  # (G, m)
    sm = np.array([f.tilted.slab_mean for f in grid.fits])
    sv = np.array([f.tilted.slab_var for f in grid.fits])
    correct = settings.get("ep_correct", base.n <= EP_CORRECT_MAX_N)
    pairs = settings.get("ep_correct_pairs", base.n * model.sel.size * PAIR_Z.size ** 2 <= PAIR_CORRECT_MAX_EVALUATIONS)
    correction = "none" if not correct else ("pairwise" if pairs and model.sel.size > 1 else "single-term")
    n_var = len(base.variance_components)  # under a hyperprior eta[:, n_var] is logit(rho)
    if correct:  # at the heaviest grid point; carried to the others as a shift of the logit and of the slab
        g = int(np.argmax(w))
        odds = (log_expit(grid.eta[g, n_var]), log_expit(-grid.eta[g, n_var])) if hyper else (model.log_rho,
                                                                                               model.log_1mrho)
        pc, mc, vc = (pair_corrected_inclusion if correction == "pairwise" else corrected_inclusion)(
            grid.fits[g], base, SpikeSlabSites(model.sel, *odds, float(np.exp(0.5 * grid.eta[g, 0]))))
        with np.errstate(divide="ignore"):
            shift = logit(np.clip(pc, 1e-300, 1 - 1e-16)) - logit(np.clip(p[g], 1e-300, 1 - 1e-16))
        p = expit(logit(np.clip(p, 1e-300, 1 - 1e-16)) + shift)
        sm = sm + (mc - sm[g])
        sv = sv * np.where(sv[g] > 0, vc / np.where(sv[g] > 0, sv[g], 1.0), 1.0)
    p_include = w @ p
    wp = w[:, None] * p + 1e-300 * w[:, None]  # the slab given inclusion, mixed over the grid
    wp /= wp.sum(0)
    slab_mean = np.sum(wp * sm, axis=0)
    slab_var = np.maximum(np.sum(wp * (sv + sm * sm), axis=0) - slab_mean ** 2, 0.0)
    # the slab Gaussian: its moments, with the EP Gaussian's correlations
    sel = model.sel
    ratio = np.ones(base.qd)
    ratio[sel] = np.sqrt(slab_var / np.maximum(var[sel], 1e-300))
    mean[sel] = slab_mean
    cov_d = cov_d * np.outer(ratio, ratio)
    cov_ds = cov_ds * ratio[:, None]
    var[: base.qd] = np.diag(cov_d)
    s2_mean, s2_sd = grid.sigma2_moments()
    extra = {}
    if hyper:  # the grid counts logit(rho) with the log variances: its "variance" is the odds
        s2_mean, s2_sd = s2_mean[:n_var], s2_sd[:n_var]
        extra.update(_rho_posterior(grid, n_var))
    shape, scale = inverse_gamma_match(s2_mean, s2_sd)
    if grid.cov_dims:
        chains, draws = int(settings.get("chains", 4)), int(settings.get("draws", 1000))
        rng = np.random.default_rng(settings.get("draw_seed", settings.get("seed")))
        eta = grid.sample_eta(rng.choice(len(grid.weights), size=chains * draws, p=grid.weights), rng)
        extra["cov_draws"] = grid.flat_covariances(eta).reshape(chains, draws, -1)
    if base.m_sparse and base.q_sparse > 1:
        extra["theta_cov_ss_blocks"] = _sparse_block_moments(grid, base)
    return {**extra,
        "mean": mean, "var": var, "cov_dense": cov_d, "cov_ds": cov_ds, "p_include": p_include,
        "var_shape": shape, "var_scale": scale, "sigma2_mean": s2_mean, "sigma2_sd": s2_sd,
        "grid_eta": grid.eta, "grid_weights": grid.weights, "grid_log_density": grid.log_density,
        "grid_step": grid.step, "grid_p_include": p, "log_evidence": grid.log_evidence,
        "info": {**grid.info, "grid_points": int(grid.eta.shape[0]), "inclusion_correction": correction,
                 "seconds_total": time.perf_counter() - start},
    }
