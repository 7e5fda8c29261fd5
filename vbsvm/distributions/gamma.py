r"""Gamma and inverse gamma draws over the whole parameter range, and the inverse gamma law.

``numpy``'s ``standard_gamma(a)`` draws ``X = U**(1/a)`` (in its rejection step) for shapes
``a < 1``; for ``a = 0.01`` the result lies below the smallest double (``2.2e-308``) with
probability about ``6e-4`` and is returned as ``0`` or a subnormal number, so that
``scale / standard_gamma(a)`` is ``inf``. The functions here keep numpy's draw wherever it is
a normal double (bit for bit) and replace the others by a draw from the exact conditional law
below that bound, on the log scale (:func:`sample_log_standard_gamma`): the law of
:math:`G \sim \mathrm{Gamma}(a, 1)` given :math:`G < t` has density
:math:`\propto x^{a-1} e^{-x}` on :math:`(0, t)`; with :math:`t` the smallest normal double,
:math:`e^{-x}` rounds to ``1`` there, so :math:`\log G = \log t + \log(U) / a` with
:math:`U \sim U(0, 1]` is exact (to a total variation of :math:`t`). The stream of random
numbers is numpy's, plus one uniform per replaced draw, taken after all of numpy's.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special as sc

from vbsvm.distributions.base import PositiveLaw, with_draw_parameters
from vbsvm.distributions.common import (
    DRAW_RANGE,
    TINY,
    clip_log_draws,
    exp_clipped,
    outside_range,
    scalarize,
    size_tuple,
)

__all__ = ["InverseGamma", "gamma_tail_redraws", "log_standard_gamma_draws", "sample_gamma", "sample_inverse_gamma_truncated",
           "sample_log_standard_gamma", "sample_standard_gamma"]

_LOG_TINY = math.log(TINY)
#: Below this tail probability the truncated inverse gamma is drawn by rejection rather than by
#: inverting the regularized incomplete gamma function (scipy's inverses are accurate to about
#: ``1e-13`` down to ``1e-305`` and then return ``0`` or ``inf``).
_FAR_TAIL = 1e-290
#: An interval whose mass lies within this lowest quantile of the gamma law is inverted with
#: ``gammainc``; ``gammaincc`` would lose ``-log10(_LOWER_TAIL)`` digits of its probabilities.
_LOWER_TAIL = 1e-8


def gamma_tail_redraws(g, shape, rng):
    """Where numpy's gamma draws ``g`` are below :data:`TINY`, and the logarithms of their redraws
    from the conditional law there (see the module docstring); no random numbers are used when
    there is none.

    Parameters
    ----------
    g : numpy.ndarray
        Draws of ``rng.standard_gamma``.
    shape : array_like
        Their shapes, broadcastable to ``g``.
    rng : numpy.random.Generator

    Returns
    -------
    tail : numpy.ndarray of bool
        Where ``g`` is replaced.
    log_tail : numpy.ndarray or None
        Of ``g``'s shape, the redrawn logarithms at ``tail`` (``0`` elsewhere); None without a tail.
    """
    tail = g < TINY
    if not tail.any():
        return tail, None
    a = np.broadcast_to(shape, g.shape)[tail]
    log_tail = np.zeros(g.shape)
    log_tail[tail] = _LOG_TINY + np.log(1.0 - rng.random(a.shape)) / a  # U in (0, 1]
    return tail, log_tail


def log_standard_gamma_draws(g, shape, rng):
    """The logarithms of numpy's gamma draws ``g``, with the draws below :data:`TINY` redrawn
    from the conditional law there (:func:`gamma_tail_redraws`).

    Parameters
    ----------
    g, shape, rng
        As for :func:`gamma_tail_redraws`.

    Returns
    -------
    log_g : numpy.ndarray
        Exact logarithms of the draws (finite).
    tail : numpy.ndarray of bool
        Where ``g`` was redrawn (``g`` itself is not changed).
    """
    g = np.asarray(g, dtype=np.float64)
    tail, log_tail = gamma_tail_redraws(g, shape, rng)
    with np.errstate(divide="ignore"):
        log_g = np.log(g)
    if log_tail is not None:
        log_g = np.where(tail, log_tail, log_g)
    return log_g, tail


def _log_gamma_at(g, tail, log_tail, i):
    """The exact logarithms of the gamma draws at the boolean index ``i``."""
    with np.errstate(divide="ignore"):
        log_g = np.log(g[i])
    return log_g if log_tail is None else np.where(tail[i], log_tail[i], log_g)


def sample_log_standard_gamma(shape, rng, size=None):
    r"""Logarithms of :math:`\mathrm{Gamma}(\text{shape}, 1)` draws, exact for every shape.

    Parameters
    ----------
    shape : array_like
        Positive shapes.
    rng : numpy.random.Generator
    size : None, int or tuple of int, optional
        As for :meth:`numpy.random.Generator.standard_gamma`.

    Returns
    -------
    numpy.ndarray
        :math:`\log G`, finite: ``log(rng.standard_gamma(shape, size))`` where numpy's draw is a
        normal double, and a draw of the conditional law below it elsewhere (the module
        docstring), e.g. about ``-36000`` for ``shape = 1e-3``.
    """
    return log_standard_gamma_draws(rng.standard_gamma(shape, size), shape, rng)[0]


def sample_standard_gamma(shape, rng, size=None):
    """``rng.standard_gamma(shape, size)``, never ``0``: draws in :data:`~vbsvm.distributions.common.DRAW_RANGE`
    bit for bit as numpy's, the others (below ``1e-300``) clipped there.

    Parameters
    ----------
    shape, rng, size
        As for :func:`sample_log_standard_gamma`.

    Returns
    -------
    numpy.ndarray
        Draws (a 0-d array for a scalar shape and ``size=None``).
    """
    return sample_gamma(shape, 1.0, rng, size)


def sample_gamma(shape, scale, rng, size=None):
    """Draws of ``Gamma(shape, scale)`` (``scale * rng.standard_gamma(shape, size)``) on the log
    scale where that product leaves :data:`~vbsvm.distributions.common.DRAW_RANGE`, clipped there.

    Parameters
    ----------
    shape, scale : array_like
        Positive, broadcast together (and against ``size``).
    rng : numpy.random.Generator
    size : None, int or tuple of int, optional

    Returns
    -------
    numpy.ndarray
        Finite positive draws.
    """
    g = np.asarray(rng.standard_gamma(shape, size), dtype=np.float64)
    log_g, tail = log_standard_gamma_draws(g, shape, rng)
    scale = np.asarray(scale, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        x = np.array(scale * g, dtype=np.float64)
    log_g, scale = np.broadcast_arrays(log_g, scale)
    log_g, scale = np.broadcast_to(log_g, x.shape), np.broadcast_to(scale, x.shape)
    return clip_log_draws(x, lambda i: np.log(scale[i]) + log_g[i], tail | outside_range(x))


class InverseGamma(PositiveLaw):
    r"""Inverse gamma distribution (vectorized).

    Density :math:`b^a / \Gamma(a)\, x^{-a-1} e^{-b/x}` on :math:`x > 0`.

    Parameters
    ----------
    shape : array_like
        Shape :math:`a > 0`.
    scale : array_like
        Scale :math:`b > 0`.

    Attributes
    ----------
    a, b : numpy.ndarray
        Read-only broadcast float64 copies of ``shape`` and ``scale``.
    shape : tuple of int
        Broadcast batch shape (the shape *parameter* is :attr:`a`).

    Raises
    ------
    ValueError
        If some ``shape`` or ``scale`` is not strictly positive.
    """

    def __init__(self, shape, scale):
        self.a, self.b = self._positive_parameters(shape=shape, scale=scale)

    def mean(self):
        r"""Expectation :math:`E[x] = b / (a - 1)`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            The mean; ``inf`` where :math:`a \le 1`.
        """
        ok = self.a > 1
        return scalarize(np.where(ok, self.b / np.where(ok, self.a - 1.0, 1.0),
                                   np.inf))

    def mean_inv(self):
        """Expectation of the reciprocal, :math:`E[1/x] = a / b`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[1/x]`.
        """
        return scalarize(self.a / self.b)

    def mean_log(self):
        r"""Expectation of the logarithm, :math:`\log b - \psi(a)`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[\log x]`.
        """
        return scalarize(np.log(self.b) - sc.digamma(self.a))

    def entropy(self):
        r"""Differential entropy :math:`a + \log b + \log\Gamma(a) -
        (1 + a)\psi(a)`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            The entropy.
        """
        a = self.a
        return scalarize(a + np.log(self.b) + sc.gammaln(a)
                          - (1.0 + a) * sc.digamma(a))

    def _log_density(self, x):
        r""":math:`a \log b - \log\Gamma(a) - (a + 1) \log x - b / x` at positive ``x``."""
        a, b = self.a, self.b
        return a * np.log(b) - sc.gammaln(a) - (a + 1.0) * np.log(x) - b / x

    def expected_logpdf(self, q):
        r"""Expected log density of this distribution under another one.

        Parameters
        ----------
        q : object
            Any distribution of a positive scalar with methods ``mean_inv()``
            and ``mean_log()`` (e.g. :class:`InverseGamma`, :class:`GIG`,
            :class:`InverseGaussian`); broadcast against this one.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E_q[\log p(x)] = a\log b - \log\Gamma(a) -
            (a+1) E_q[\log x] - b\,E_q[1/x]` (ELBO prior term).
        """
        a, b = self.a, self.b
        return scalarize(np.asarray(a * np.log(b) - sc.gammaln(a)
                                     - (a + 1.0) * np.asarray(q.mean_log())
                                     - b * np.asarray(q.mean_inv())))

    def _log_draws(self, rng, size):
        """``(b, x, gamma)``: ``b`` broadcast to the draws' shape, numpy's floating point draws
        ``x = b / G`` and ``gamma = (G, tail, log_tail)`` (:func:`gamma_tail_redraws`)."""
        if size is None:  # the Gibbs samplers' per-sweep call: the same draws without the broadcasts
            a, b = self.a, self.b
            g = np.asarray(rng.standard_gamma(a), dtype=np.float64)
        else:
            full = size_tuple(size) + self.shape
            a, b = np.broadcast_to(self.a, full), np.broadcast_to(self.b, full)
            g = rng.standard_gamma(a, size=full)
        g = np.asarray(g, dtype=np.float64)
        tail, log_tail = gamma_tail_redraws(g, a, rng)
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            x = np.array(b / g, dtype=np.float64)
        return b, x, (g, tail, log_tail)

    @with_draw_parameters
    def sample(self, rng, size=None):
        """Random draws, ``scale / Gamma(shape, 1)``.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Float64 draws of shape ``size + self.shape`` (a numpy scalar for a scalar law and
            ``size=None``): ``scale / rng.standard_gamma(shape)`` where that quotient is exact and
            within :data:`~vbsvm.distributions.common.DRAW_RANGE`, else ``exp(log scale - log G)``
            (:func:`sample_log_standard_gamma`) clipped to that range: e.g. ``IG(0.01, 0.01)``
            exceeds ``1e300`` with probability about ``1e-3``, and is then ``1e300``, never
            ``inf``. :meth:`sample_log` gives the exact logarithms.
        """
        b, x, gamma = self._log_draws(rng, size)
        x = clip_log_draws(x, lambda i: np.log(b[i]) - _log_gamma_at(*gamma, i), gamma[1] | outside_range(x))
        return scalarize(x) if size is None else x

    def _sample_log(self, rng, size):
        """``log scale - log G``."""
        b, _, gamma = self._log_draws(rng, size)
        return np.log(b) - _log_gamma_at(*gamma, ...)

    def sample_truncated(self, bounds, rng):
        """One draw of each component restricted to ``bounds = (lo, hi)``
        (:func:`sample_inverse_gamma_truncated`).

        Parameters
        ----------
        bounds : tuple of float
        rng : numpy.random.Generator

        Returns
        -------
        numpy.ndarray
            Draws of shape ``self.shape``.
        """
        return sample_inverse_gamma_truncated(self.a, self.b, bounds, rng)


def sample_inverse_gamma_truncated(shape, scale, bounds, rng):
    r"""One draw of ``IG(shape_k, scale_k)`` restricted to ``bounds = (lo, hi)`` for each k.

    A plain draw ``scale / Gamma(shape, 1)`` (:func:`sample_log_standard_gamma`) is kept when it
    falls inside (almost always). The others are drawn from the truncated law of the gamma
    precision :math:`y = \text{scale} / x \sim \mathrm{Gamma}(\text{shape}, 1)` on
    :math:`(\text{scale}/hi, \text{scale}/lo)`: by inversion of the regularized incomplete gamma
    function (the upper one, ``gammaincc``, unless the interval lies within the lowest ``1e-8``
    of the law, where the lower one, ``gammainc``, keeps the digits ``1 - gammaincc`` would lose),
    and, where the interval's tail probability is below ``1e-200`` (where the inverse
    functions lose accuracy and then underflow), by rejection from an exponential envelope
    tangent to the log density at the interval's end nearer the mode (a power law below it
    for shapes below 1). Draws are clipped to the bounds and to
    :data:`~vbsvm.distributions.common.DRAW_RANGE`.

    Takes the parameters as they are (positive float arrays of one shape, unchecked): the Gibbs
    samplers call it every sweep, where :class:`InverseGamma`'s checks and broadcasts cost
    several times the draw.

    Parameters
    ----------
    shape, scale : numpy.ndarray
        Positive, of one shape (at least 1-d).
    bounds : tuple of float
        ``0 <= lo < hi <= inf``.
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
        Draws of that shape.
    """
    lo, hi = bounds
    g = np.asarray(rng.standard_gamma(shape), dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        x = np.atleast_1d(scale / g)
    out = (x <= lo) | (x >= hi)
    fix = np.atleast_1d(g < TINY)
    if fix.any():
        with np.errstate(divide="ignore"):
            log_lo, log_hi = np.log(lo), np.log(hi)
            # a gamma draw below the smallest double is above ``hi`` anyway unless scale / TINY < hi:
            # only then is it redrawn below TINY (:func:`sample_log_standard_gamma`)
            fix &= np.atleast_1d(np.log(scale) - _LOG_TINY < log_hi)
    if fix.any():
        log_g, _ = log_standard_gamma_draws(np.where(fix, 0.0, 1.0), np.broadcast_to(shape, fix.shape), rng)
        log_x = np.broadcast_to(np.log(scale), fix.shape)[fix] - log_g[fix]
        out[fix] = (log_x <= log_lo) | (log_x >= log_hi)
        x[fix] = exp_clipped(log_x)
    if out.any():
        a = np.broadcast_to(shape, x.shape)[out]
        b = np.broadcast_to(scale, x.shape)[out]
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            x[out] = np.clip(b / _truncated_standard_gamma(a, b / hi, b / lo, rng), lo, hi)
    return np.clip(x, *DRAW_RANGE, out=x) if outside_range(x).any() else x


def _truncated_standard_gamma(a, y_lo, y_hi, rng):
    """Draws of ``Gamma(a, 1)`` restricted to ``[y_lo, y_hi]`` (arrays of one shape, ``0 <= y_lo < y_hi <= inf``),
    as :func:`sample_inverse_gamma_truncated` describes (by the upper tail function unless the
    whole interval lies within the lowest ``1e-8`` of the law)."""
    with np.errstate(all="ignore"):
        # below the shape (the lower tail) 1 - gammaincc loses the digits gammainc keeps
        lower = sc.gammainc(a, y_hi) < _LOWER_TAIL
        q_lo, q_hi = sc.gammaincc(a, y_lo), sc.gammaincc(a, y_hi)
        p_lo, p_hi = sc.gammainc(a, y_lo), sc.gammainc(a, y_hi)
    far = np.where(lower, p_hi, q_lo) < _FAR_TAIL
    u = rng.random(int((~far).sum()))
    y = np.empty(a.shape)
    with np.errstate(all="ignore"):
        inv, low = ~far, lower[~far]
        from_q = sc.gammainccinv(a[inv], q_hi[inv] + (q_lo[inv] - q_hi[inv]) * u)
        from_p = sc.gammaincinv(a[inv], p_lo[inv] + (p_hi[inv] - p_lo[inv]) * u)
        y[inv] = np.where(low, np.clip(from_p, y_lo[inv], y_hi[inv]), from_q)
    if far.any():
        y[far] = np.clip(_far_tail_gamma(a[far], y_lo[far], y_hi[far], ~lower[far], rng), y_lo[far], y_hi[far])
    return y


def _far_tail_gamma(a, y_lo, y_hi, upper, rng):
    r"""Rejection draws of ``Gamma(a, 1)`` on ``[y_lo, y_hi]`` where the interval's tail probability
    is negligible. The log density :math:`\ell(y) = (a - 1)\log y - y` is bounded by a line through
    the end nearer the mode: in the upper tail (``upper``) :math:`y = y_{lo} + \delta`,
    :math:`\delta \sim \mathrm{Exp}(\lambda)` truncated to the interval, with
    :math:`\lambda = 1 - (a - 1)/y_{lo}` (the tangent; ``a >= 1``) or :math:`\lambda = 1` (``a < 1``,
    where :math:`\ell` is convex and :math:`(a - 1)\log y \le (a - 1)\log y_{lo}`); in the lower tail
    :math:`y = y_{hi} - \delta`, :math:`\delta \sim \mathrm{Exp}((a - 1)/y_{hi} - 1)` for ``a > 1``,
    and for ``a <= 1`` the power law :math:`\propto y^{a-1}` on the interval (in log space) with
    acceptance :math:`e^{-(y - y_{lo})}`. Acceptance probabilities are close to 1 in these tails."""
    y = np.empty(a.shape)
    todo = np.ones(a.shape, dtype=bool)
    for _ in range(200):  # rejection rounds: each accepts nearly every draw
        if not todo.any():
            break
        ai, lo, hi, up = a[todo], y_lo[todo], y_hi[todo], upper[todo]
        u = 1.0 - rng.random(ai.shape)  # (0, 1]
        v = 1.0 - rng.random(ai.shape)
        with np.errstate(all="ignore"):
            width = hi - lo
            rate_up = np.where(ai >= 1.0, 1.0 - (ai - 1.0) / lo, 1.0)
            rate_dn = (ai - 1.0) / hi - 1.0
            rate = np.where(up, rate_up, rate_dn)
            delta = -np.log1p(u * np.expm1(-rate * width)) / rate  # Exp(rate) truncated to [0, width]
            cand_up = lo + delta
            log_acc_up = np.where(ai >= 1.0, (ai - 1.0) * (np.log1p(delta / lo) - delta / lo),
                                  (ai - 1.0) * np.log1p(delta / lo))
            cand_dn = hi - delta
            log_acc_dn = (ai - 1.0) * (np.log1p(-delta / hi) + delta / hi)
            # a <= 1 in the lower tail: y^a uniform on [lo^a, hi^a], in logs
            r = np.exp(ai * (np.log(lo) - np.log(hi)))
            cand_pow = hi * np.exp(np.log(r + u * (1.0 - r)) / ai)
            log_acc_pow = -(cand_pow - lo)
        power = ~up & (ai <= 1.0)
        cand = np.where(up, cand_up, np.where(power, cand_pow, cand_dn))
        log_acc = np.where(up, log_acc_up, np.where(power, log_acc_pow, log_acc_dn))
        ok = np.log(v) <= log_acc
        idx = np.flatnonzero(todo)
        y[idx[ok]] = cand[ok]
        todo[idx[ok]] = False
    if todo.any():  # not reached for the tails this is used in; the nearer end as a last resort
        y[todo] = np.where(upper[todo], y_lo[todo], y_hi[todo])
    return y
