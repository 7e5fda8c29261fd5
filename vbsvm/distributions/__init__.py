r"""Probability distributions used by the Bayesian SVM models.

The Polson & Scott (2011) data augmentation writes the SVM pseudo-likelihood
as a location-scale mixture of Gaussians whose mixing variables follow
generalized inverse Gaussian (GIG) and inverse Gaussian laws.  The
mean-field variational Bayes (VB) updates and the Gibbs samplers of the
package need moments, entropies, log densities and random draws of these
distributions and of a few conjugate companions.  They are collected here.

Parametrisations
----------------
``GIG(gamma, psi, chi)``
    Generalized inverse Gaussian on :math:`x > 0`,

    .. math::

        p(x) = \frac{x^{\gamma - 1}
               \exp\{-(\psi x + \chi / x) / 2\}}{Z(\gamma, \psi, \chi)},
        \qquad
        Z = 2 (\chi / \psi)^{\gamma / 2} K_\gamma(\sqrt{\psi \chi}),

    with :math:`\psi > 0`, :math:`\chi > 0` and :math:`K_\nu` the modified
    Bessel function of the second kind.  In scipy's terms this is
    ``scipy.stats.geninvgauss(p=gamma, b=sqrt(psi * chi),
    scale=sqrt(chi / psi))``.  If :math:`x \sim GIG(\gamma, \psi, \chi)`
    then :math:`1/x \sim GIG(-\gamma, \chi, \psi)`.
``InverseGaussian(mean, shape)``
    :math:`p(x) = \sqrt{\lambda / (2\pi x^3)}
    \exp\{-\lambda (x - \mu)^2 / (2 \mu^2 x)\}` with mean :math:`\mu` and
    shape :math:`\lambda`; equal to ``GIG(-1/2, lambda / mu**2, lambda)`` and
    to ``scipy.stats.invgauss(mu=mean / shape, scale=shape)``.
``InverseGamma(shape, scale)``
    :math:`p(x) = b^a / \Gamma(a)\, x^{-a-1} e^{-b/x}` with shape :math:`a`
    and scale :math:`b`; ``scipy.stats.invgamma(a=shape, scale=scale)``.
``Gaussian(precision, shift)``
    A single :math:`d`-variate normal in natural (information) form, with
    precision matrix :math:`P = \Sigma^{-1}` and shift :math:`h = P \mu`.
``InverseWishart(scale, df)``
    :math:`p(S) \propto |S|^{-(\nu + d + 1)/2}
    \exp\{-\operatorname{tr}(\Psi S^{-1}) / 2\}` with scale matrix
    :math:`\Psi` and degrees of freedom :math:`\nu > d - 1`;
    ``scipy.stats.invwishart(df=nu, scale=Psi)``. Its entropy (the ELBO's
    random-effect covariance term) is computed here, not by
    ``scipy.stats.invwishart.entropy``: scipy's value (1.18) differs from
    :math:`-E[\log p(S)]` of scipy's own ``logpdf`` for :math:`d \ge 2`
    (by :math:`1.5 \log 2` at :math:`d = 2`; ours agrees with the Monte
    Carlo value, ``tests/test_distributions.py``).
``Bernoulli(p)``
    :math:`P(x = 1) = p`; ``Bernoulli.from_logit(l)`` sets
    :math:`p = 1 / (1 + e^{-l})`, keeping :math:`\log p` and
    :math:`\log(1-p)` accurate for extreme logits.
``sample_truncated_normal(mean, sd, low, high, rng)``
    Draws of :math:`N(\mu, s^2)` restricted to :math:`[l, h]`, by inversion in log space
    (accurate far in the tails); ``sample_truncated_std_normal`` is its core, for callers that
    already hold the interval's log normal CDFs.

Conventions
-----------
* Scalar distributions (GIG, InverseGaussian, InverseGamma, Bernoulli) are
  vectorized: their parameters are broadcast against each other once, at
  construction, and stored as read-only float64 copies.  Every moment method
  returns an array of that broadcast shape (a numpy scalar when the shape is
  ``()``).
* Every sampler takes a :class:`numpy.random.Generator` ``rng`` and
  ``size=None``.  ``size`` is an *extra leading* shape: the draws have shape
  ``size + batch_shape`` (``size + (d,)`` for :class:`Gaussian`,
  ``size + (d, d)`` for :class:`InverseWishart`).  For a fixed seed the draws
  are reproducible.
* Positive draws are finite and within ``[1e-300, 1e300]`` (see below).
* Modified Bessel functions are always evaluated on the log scale as
  ``log(scipy.special.kve(nu, z)) - z``, never with ``kv``.
* Closed forms are used wherever they exist.  In particular for
  :math:`\gamma = \pm 1/2` (the case the SVM augmentation uses, with
  :math:`\chi` possibly close to zero) all of :meth:`GIG.mean`,
  :meth:`GIG.mean_inv`, :meth:`GIG.mean_log`, :meth:`GIG.log_normalizer`,
  :meth:`GIG.entropy` and :meth:`GIG.sample` avoid Bessel functions
  altogether and raise no floating point warning, even under
  ``numpy.errstate(all="raise")``, for :math:`\psi = 1` and
  :math:`\chi \in [10^{-300}, 10^{300}]`.

Draws over the whole parameter range
------------------------------------
Every sampler returns finite positive draws for all valid parameters (shapes from ``1e-3`` to
``1e3``, scales from ``1e-300`` to ``1e300``): the floating point formula is kept wherever it is
exact, so draws are bit for bit those of the plain formula there, and the log scale is used
where it under- or overflows. Positive draws are clipped to
:data:`~vbsvm.distributions.common.DRAW_RANGE` ``= [1e-300, 1e300]`` (the reason is in
:mod:`vbsvm.distributions.common`); ``sample_log`` methods and ``sample_log_*`` functions give
exact logarithms. Modules: :mod:`~vbsvm.distributions.gamma` (gamma, inverse gamma, truncated
inverse gamma), :mod:`~vbsvm.distributions.gig` (GIG, inverse Gaussian),
:mod:`~vbsvm.distributions.gaussian` (Gaussian, truncated normal),
:mod:`~vbsvm.distributions.wishart`, :mod:`~vbsvm.distributions.bernoulli`,
:mod:`~vbsvm.distributions.bessel` (Bessel and exponential-integral helpers).

Notes
-----
Inverse Gaussian draws use the Michael, Schucany & Haas (1976) transformation
method, the same algorithm as :meth:`numpy.random.Generator.wald`, rewritten
without catastrophic cancellation.  numpy's ``wald(mean, scale)`` returns
``0`` (hence ``1 / wald = inf``) once ``mean / scale`` exceeds about
``1e16``; for ``GIG(1/2, 1, chi)`` this happens for ``chi < 1e-32``.  The
rewritten form is exact in that regime (where GIG(1/2, 1, chi) tends to a
chi-square law with one degree of freedom).  The stream of random numbers
consumed is one standard normal and one uniform per draw (all normals first,
then all uniforms), so draws are not bit-identical to ``rng.wald``.
"""

from __future__ import annotations

import math  # noqa: F401  (math, np, scipy and sc were importable from the single module)

import numpy as np  # noqa: F401
import scipy.linalg  # noqa: F401
import scipy.special as sc  # noqa: F401
import scipy.stats  # noqa: F401

from vbsvm.distributions import bessel as _bessel
from vbsvm.distributions import common as _common
from vbsvm.distributions.bernoulli import Bernoulli
from vbsvm.distributions.bessel import dlog_kv_dnu, exp_e1, log_kve
from vbsvm.distributions.common import DRAW_RANGE, LOG_DRAW_RANGE
from vbsvm.distributions.gamma import (
                                       InverseGamma,
                                       sample_gamma,
                                       sample_inverse_gamma_truncated,
                                       sample_log_standard_gamma,
                                       sample_standard_gamma,
)
from vbsvm.distributions.gaussian import (
                                       FAR_TAIL_SD,
                                       Gaussian,
                                       sample_truncated_normal,
                                       sample_truncated_std_normal,
)
from vbsvm.distributions.gig import CHI_FLOOR, GIG, InverseGaussian, sample_gig_half, sample_log_gig
from vbsvm.distributions.wishart import InverseWishart

__all__ = [
    "GIG",
    "InverseGaussian",
    "InverseGamma",
    "Gaussian",
    "InverseWishart",
    "Bernoulli",
    "sample_gig_half",
    "sample_inverse_gamma_truncated",
    "sample_truncated_normal",
    "sample_truncated_std_normal",
    "CHI_FLOOR",
    "DRAW_RANGE",
    "LOG_DRAW_RANGE",
    "FAR_TAIL_SD",
    "sample_gamma",
    "sample_standard_gamma",
    "sample_log_standard_gamma",
    "sample_log_gig",
]

# the helper names of the single module this package replaced, still importable from here
_exp_e1, _log_kve, _dlog_kv_dnu = exp_e1, log_kve, dlog_kv_dnu
_size_tuple, _readonly, _scalarize, _chol_lower = (_common.size_tuple, _common.readonly, _common.scalarize,
                                                   _common.chol_lower)
_LOG_2, _LOG_2PI, _DNU_STEP = _common.LOG_2, _common.LOG_2PI, _bessel.DNU_STEP
_E1_SERIES, _E1_SERIES_MAX, _E1_CF_TERMS, _E1_ASYMPTOTIC_MIN = (_bessel._E1_SERIES, _bessel._E1_SERIES_MAX,
                                                                _bessel._E1_CF_TERMS, _bessel._E1_ASYMPTOTIC_MIN)
