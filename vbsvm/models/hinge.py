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
"""

from __future__ import annotations

import numpy as np

from ..distributions import GIG, InverseGaussian

__all__ = ["CHI_FLOOR", "update_chi", "q_weights", "expected_inverse", "elbo", "sample_inverse", "working_response"]

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


def working_response(y, w):
    """Shift vector ``y_i (1 + w_i)`` of the Gaussian working likelihood."""
    return y * (1.0 + w)
