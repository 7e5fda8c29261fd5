r"""The generalized inverse Gaussian (GIG) and inverse Gaussian laws: moments, entropies, log
densities and draws over the whole parameter range.

``GIG(gamma, psi, chi)`` has density :math:`\propto x^{\gamma-1} \exp\{-(\psi x + \chi/x)/2\}`;
``InverseGaussian(mean, shape)`` is ``GIG(-1/2, shape / mean**2, shape)``. Draws with
:math:`\gamma = \pm 1/2` use the Michael-Schucany-Haas method in a cancellation-free form
(:func:`sample_gig_half` is the Gibbs samplers' hot path), switching to the log scale, with the
same random numbers, only where the floating point form over- or underflows; other
:math:`\gamma` are drawn on the log scale by a rejection sampler of the log-concave density of
:math:`\log x` (:func:`sample_log_gig`).
"""

from __future__ import annotations

import numpy as np

from vbsvm.distributions.base import PositiveLaw, with_draw_parameters
from vbsvm.distributions.bessel import dlog_kv_dnu, exp_e1, log_kve
from vbsvm.distributions.common import (
    LOG_2,
    LOG_2PI,
    clip_log_draws,
    exp_clipped,
    outside_range,
    readonly,
    scalarize,
    size_tuple,
)

__all__ = ["CHI_FLOOR", "GIG", "InverseGaussian", "sample_gig_half", "sample_log_gig"]

#: Lower clip applied to ``chi`` by :func:`sample_gig_half`.
CHI_FLOOR = 1e-300


def _ig_core(omega, rng, shape):
    r"""Shared randomness of the Michael-Schucany-Haas inverse Gaussian draw.

    Parameters
    ----------
    omega : numpy.ndarray
        :math:`\lambda / \mu` (shape over mean) of the inverse Gaussian,
        equivalently :math:`\sqrt{\psi \chi}` of the GIG with
        :math:`\gamma = \pm 1/2`; broadcastable to ``shape``.
    rng : numpy.random.Generator
        Source of randomness; ``shape`` standard normals then ``shape``
        uniforms are drawn.
    shape : tuple of int
        Output shape.

    Returns
    -------
    a2 : numpy.ndarray
        :math:`a^2 = (|n| + \sqrt{n^2 + 4\omega})^2` with :math:`n` standard
        normal.  The smaller root of the MSH quadratic is
        :math:`X_0 = 4 \lambda / a^2`.
    accept : numpy.ndarray of bool
        Whether :math:`X_0` is kept (probability :math:`\mu / (\mu + X_0) =
        a^2 / (a^2 + 4\omega)`); otherwise the draw is :math:`\mu^2 / X_0 =
        \mu a^2 / (4 \omega)`.
    n, u : numpy.ndarray
        The normals and uniforms (for :func:`_ig_log_draws`).
    """
    n = rng.standard_normal(shape)
    u = rng.random(shape)
    w4 = 4.0 * omega
    a = np.abs(n) + np.sqrt(n * n + w4)
    a2 = a * a
    accept = u * (a2 + w4) <= a2
    return a2, accept, n, u


def sample_gig_half(chi, rng):
    r"""One draw of ``GIG(1/2, 1, chi)`` per element of ``chi``.

    This is the hot path of the Gibbs samplers: the Polson-Scott augmentation
    variable :math:`\lambda_i` has full conditional
    :math:`GIG(1/2, 1, (1 - y_i f_i)^2)`.

    Parameters
    ----------
    chi : array_like
        Values of :math:`\chi \ge 0`.  They are clipped below at
        :data:`CHI_FLOOR` ``= 1e-300`` so that ``chi == 0`` (an observation
        exactly on the margin) is handled: the draw is then (to double
        precision) from the :math:`\chi \to 0` limit, a chi-square with one
        degree of freedom.  ``nan`` propagates; ``chi`` above ``1e300`` is
        not supported.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    numpy.ndarray
        Float64 draws, same shape as ``chi`` (a 0-d array for scalar
        ``chi``), finite and strictly positive for finite ``chi`` up to
        ``1e300``.

    Notes
    -----
    Mathematically this is ``1 / rng.wald(1 / sqrt(chi), 1)`` (since
    :math:`1/x \sim IG(\text{mean}=1/\sqrt\chi, \text{shape}=1)`), but numpy's
    ``wald`` suffers catastrophic cancellation and returns ``0`` for
    ``chi < 1e-32``.  The Michael-Schucany-Haas algorithm is therefore
    evaluated here in the cancellation-free form

    .. math::

        a = |n| + \sqrt{n^2 + 4\sqrt\chi}, \qquad
        x = \begin{cases} a^2 / 4 & u \le a^2 / (a^2 + 4 \sqrt\chi) \\
                          4 \chi / a^2 & \text{otherwise,}\end{cases}

    with :math:`n \sim N(0, 1)` and :math:`u \sim U(0, 1)`.  No floating point
    warning is raised for ``chi`` in ``[0, 1e300]``.
    """
    chi = np.asarray(chi, dtype=np.float64)
    shape = chi.shape
    chi = np.maximum(chi.reshape(-1), CHI_FLOOR)
    n = rng.standard_normal(chi.shape)
    u = rng.random(chi.shape)
    # same arithmetic as _ig_core with omega = sqrt(chi), done in place
    w4 = np.sqrt(chi)
    w4 *= 4.0
    a2 = n * n
    a2 += w4
    np.sqrt(a2, out=a2)
    a2 += np.abs(n, out=n)
    a2 *= a2
    w4 += a2
    w4 *= u
    accept = w4 <= a2  # u * (a2 + 4 sqrt(chi)) <= a2
    out = np.divide(chi, a2)
    out *= 4.0
    return np.where(accept, 0.25 * a2, out).reshape(shape)


def _asinh_exp(log_t):
    """``arcsinh(exp(log_t))`` without overflow (``log(2 t)`` to double precision for ``t > 1e130``)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.where(log_t > 300.0, log_t + LOG_2, np.arcsinh(np.exp(np.minimum(log_t, 300.0))))


def _ig_log_draws(log_mu, log_omega, n, u):
    r"""Logarithms of the Michael-Schucany-Haas inverse Gaussian draws from the normals ``n`` and
    uniforms ``u`` of :func:`_ig_core`, exact for every mean and shape.

    With :math:`t = |n| / (2\sqrt\omega)` the quadratic's two roots are
    :math:`\mu e^{\mp 2\,\mathrm{asinh}\, t}` and the smaller one is kept with probability
    :math:`1 / (1 + e^{-2\,\mathrm{asinh}\, t})`; everything is a function of :math:`\log \mu` and
    :math:`\log\omega = \log(\lambda / \mu)`, so nothing overflows.

    Parameters
    ----------
    log_mu, log_omega, n, u : numpy.ndarray
        Of one shape.

    Returns
    -------
    numpy.ndarray
        :math:`\log x`.
    """
    with np.errstate(divide="ignore", under="ignore"):
        log_t = np.log(np.abs(n)) - LOG_2 - 0.5 * log_omega
        two_asinh = 2.0 * _asinh_exp(log_t)
        accept = u * (1.0 + np.exp(-two_asinh)) <= 1.0
    return log_mu + np.where(accept, -two_asinh, two_asinh)


def _gig_mode_offset(p, log_b):
    r"""Quantities of the log density of a standardized GIG around its mode.

    For :math:`y \sim GIG(p, b)` (density :math:`\propto y^{p-1} e^{-b(y + 1/y)/2}`) the log
    :math:`t = \log y` has the log-concave density :math:`h(t) = p t - b \cosh t`, with mode
    :math:`m = \mathrm{asinh}(p / b)`, and with :math:`c = \sqrt{b^2 + p^2}`,

    .. math::

        D(s) = h(m + s) - h(m) = p s + c - \tfrac12\{(c + p) e^s + (c - p) e^{-s}\}.

    Returns
    -------
    m, c, log_cp, log_cm : numpy.ndarray
        The mode, ``c`` and the logarithms of ``c + p`` and ``c - p`` (each computed without
        cancellation: ``c - |p| = b^2 / (c + |p|)``).
    """
    b = np.exp(log_b)
    c = np.hypot(b, p)
    log_big = np.log(c + np.abs(p))
    log_small = 2.0 * log_b - log_big
    log_cp = np.where(p >= 0, log_big, log_small)
    log_cm = np.where(p >= 0, log_small, log_big)
    m = np.arcsinh(p * np.exp(-log_b))
    return m, c, log_cp, log_cm


def _gig_d(s, p, c, log_cp, log_cm):
    """``D(s)`` of :func:`_gig_mode_offset` and its derivative (``-inf`` far out, never ``nan``)."""
    with np.errstate(over="ignore"):
        small = np.abs(s) <= 1.0
        ss = np.where(small, s, 0.0)
        sh = np.sinh(ss)
        half = np.sinh(0.5 * ss)
        d_small = -2.0 * c * half * half - p * (sh - ss)
        dd_small = -2.0 * p * half * half - c * sh
        sl = np.where(small, 1.0, s)
        ep, em = np.exp(log_cp + sl), np.exp(log_cm - sl)
        d_large = p * sl + c - 0.5 * (ep + em)
        dd_large = p - 0.5 * (ep - em)
    return np.where(small, d_small, d_large), np.where(small, dd_small, dd_large)


def _gig_right_root(p, c, log_cp, log_cm):
    r"""A point :math:`s > 0` with :math:`D(s) \approx -1` (bisection; any positive point gives a valid
    envelope, its accuracy only sets the acceptance rate)."""
    # a point where D <= -1 brackets the root with s = 0: for p >= 0, D(s) <= -c (cosh s - 1) gives
    # s = acosh(1 + 1/c); for p < 0, D(s) <= p s + c - (c + p) e^s / 2 gives the smaller of
    # (c + 1) / |p| and log(2 (c + 1) / (c + p))
    x = 1.0 / c
    s_pos = np.log1p(x + np.sqrt(x) * np.sqrt(x + 2.0))
    with np.errstate(divide="ignore"):
        s_neg = np.minimum((c + 1.0) / np.abs(p), np.log(2.0 * (c + 1.0)) - log_cp)
    s_hi = np.maximum(np.where(p >= 0, s_pos, s_neg), 1e-300)
    # D(1e-300) > -1 (c is below 1e300 for b up to 1e300): bisect geometrically, the root may be
    # as small as 1e-150
    lo, hi = np.full_like(s_hi, 1e-300), s_hi
    for _ in range(64):  # bisection steps in log s, vectorized over the parameter sets
        mid = np.sqrt(lo) * np.sqrt(hi)
        below = _gig_d(mid, p, c, log_cp, log_cm)[0] < -1.0
        hi = np.where(below, mid, hi)
        lo = np.where(below, lo, mid)
    return hi


def sample_log_gig(p, log_b, rng):
    r"""Logarithms of draws of the standardized GIG (``scipy.stats.geninvgauss(p, b)``), one per
    element, by rejection from a three-piece envelope of the log-concave density of ``log y``.

    The envelope of :math:`D(s)` (:func:`_gig_mode_offset`) is ``0`` between the points
    :math:`s_l < 0 < s_r` where :math:`D = -1` and the tangent lines of :math:`D` at those points
    outside (a table-mountain bound; acceptance rate above one half for every ``p`` and ``b``: 0.55 at
    worst over ``p`` in [-50, 50] and ``b`` in [1e-300, 1e300]).
    All quantities are differences of logs, so ``b`` from ``1e-300`` to ``1e300`` and any ``p``
    are handled (``log y`` up to about :math:`\pm 1400`).

    Parameters
    ----------
    p, log_b : numpy.ndarray
        Index and :math:`\log b`, of one shape.
    rng : numpy.random.Generator
        Three uniforms per element and round.

    Returns
    -------
    numpy.ndarray
        :math:`\log y`.
    """
    with np.errstate(over="ignore", under="ignore", divide="ignore"):  # exp of far tails: 0 or inf by design
        return _sample_log_gig(p, log_b, rng)


def _sample_log_gig(p, log_b, rng):
    """The body of :func:`sample_log_gig`."""
    p, log_b = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(log_b, dtype=np.float64))
    shape = p.shape
    p, log_b = p.ravel(), log_b.ravel()
    # the envelope of each distinct parameter set, then spread to the elements
    distinct, which = np.unique(np.stack([p, log_b]), axis=1, return_inverse=True)
    which = which.ravel()
    pu, lbu = distinct
    m, c, log_cp, log_cm = _gig_mode_offset(pu, lbu)
    s_r = _gig_right_root(pu, c, log_cp, log_cm)
    s_l = -_gig_right_root(-pu, c, log_cm, log_cp)
    d_r, g_r = _gig_d(s_r, pu, c, log_cp, log_cm)
    d_l, g_l = _gig_d(s_l, pu, c, log_cp, log_cm)
    g_r, g_l = np.minimum(g_r, -1e-300), np.maximum(g_l, 1e-300)  # D is strictly concave with D'(0) = 0
    mass_mid = s_r - s_l
    mass_r = np.exp(d_r) / -g_r
    mass_l = np.exp(d_l) / g_l
    total = mass_mid + mass_r + mass_l
    m, c, log_cp, log_cm, s_r, s_l, d_r, g_r, d_l, g_l, mass_mid, mass_r, total = (
        v[which] for v in (m, c, log_cp, log_cm, s_r, s_l, d_r, g_r, d_l, g_l, mass_mid, mass_r, total))
    out = np.empty(p.shape)
    todo = np.arange(p.size)
    for _ in range(1000):  # rejection rounds; each accepts more than half of what is left
        if todo.size == 0:
            break
        k = todo.size
        u, e, v = rng.random(k), 1.0 - rng.random(k), 1.0 - rng.random(k)
        pick = u * total[todo]
        in_mid = pick < mass_mid[todo]
        in_r = ~in_mid & (pick < mass_mid[todo] + mass_r[todo])
        expo = -np.log(e)
        s = np.where(in_mid, s_l[todo] + pick,  # pick is uniform on [0, mass_mid) in the middle
                     np.where(in_r, s_r[todo] + expo / -g_r[todo], s_l[todo] - expo / g_l[todo]))
        log_env = np.where(in_mid, 0.0, np.where(in_r, d_r[todo] + g_r[todo] * (s - s_r[todo]),
                                                  d_l[todo] + g_l[todo] * (s - s_l[todo])))
        d = _gig_d(s, p[todo], c[todo], log_cp[todo], log_cm[todo])[0]
        ok = np.log(v) <= d - log_env
        out[todo[ok]] = m[todo[ok]] + s[ok]
        todo = todo[~ok]
    if todo.size:  # not reached: the acceptance rate is above one half
        out[todo] = m[todo]
    return out.reshape(shape)


class GIG(PositiveLaw):
    r"""Generalized inverse Gaussian distribution (vectorized).

    Density :math:`\propto x^{\gamma-1} \exp\{-(\psi x + \chi / x) / 2\}` on
    :math:`x > 0`.

    Parameters
    ----------
    gamma : array_like
        Index :math:`\gamma` (any real).
    psi : array_like
        Rate-like parameter :math:`\psi > 0`.
    chi : array_like
        Parameter :math:`\chi > 0` of the :math:`1/x` term.

    Attributes
    ----------
    gamma, psi, chi : numpy.ndarray
        Read-only float64 copies of the parameters, broadcast to
        :attr:`shape`.
    shape : tuple of int
        Broadcast batch shape.

    Raises
    ------
    ValueError
        If some ``psi`` or ``chi`` is not strictly positive (or is nan), or
        some ``gamma`` is not finite.

    Notes
    -----
    Elements with ``gamma == 0.5`` or ``gamma == -0.5`` use closed forms (no
    Bessel functions), e.g. for ``gamma = 1/2``:
    :math:`E[x] = \sqrt{\chi/\psi} + 1/\psi`,
    :math:`E[1/x] = \sqrt{\psi/\chi}`,
    :math:`E[\log x] = \tfrac12\log(\chi/\psi) + e^{2\omega} E_1(2\omega)`,
    :math:`\log Z = \tfrac12 \log(2\pi/\psi) - \omega` and
    :math:`H = \tfrac12 \log(2\pi e/\psi) + \tfrac12 E[\log x]`, with
    :math:`\omega = \sqrt{\psi\chi}`.  Other elements use
    ``log(kve(nu, omega)) - omega`` and, for :math:`E[\log x]`, a five-point
    central difference in the order of ``log(kve)``.
    """

    def __init__(self, gamma, psi, chi):
        gamma, psi, chi = np.broadcast_arrays(
            np.asarray(gamma, dtype=np.float64),
            np.asarray(psi, dtype=np.float64),
            np.asarray(chi, dtype=np.float64),
        )
        if not np.all(np.isfinite(gamma)):
            raise ValueError("GIG: gamma must be finite")
        if not np.all(psi > 0):
            raise ValueError("GIG: psi must be strictly positive")
        if not np.all(chi > 0):
            raise ValueError("GIG: chi must be strictly positive")
        self.gamma = readonly(gamma)
        self.psi = readonly(psi)
        self.chi = readonly(chi)
        self.shape = self.gamma.shape
        self._sqrt_psi = np.sqrt(self.psi)
        self._sqrt_chi = np.sqrt(self.chi)
        self._omega = self._sqrt_psi * self._sqrt_chi
        self._half = self.gamma == 0.5
        self._mhalf = self.gamma == -0.5
        self._general = ~(self._half | self._mhalf)
        self._all_half = bool(self._half.all())

    # -- dispatch ---------------------------------------------------------
    def _by_case(self, f_half, f_mhalf, f_general):
        """Evaluate one formula per parameter case and assemble the result.

        Parameters
        ----------
        f_half, f_mhalf, f_general : callable
            Functions of an index (``Ellipsis`` or a boolean mask) returning
            the values for the elements with ``gamma == 0.5``,
            ``gamma == -0.5`` and any other ``gamma``.

        Returns
        -------
        numpy.ndarray or numpy.float64
            Values of broadcast shape.
        """
        if self._all_half:
            return scalarize(np.asarray(f_half(...), dtype=np.float64))
        out = np.empty(self.shape)
        for mask, f in ((self._half, f_half), (self._mhalf, f_mhalf),
                        (self._general, f_general)):
            if mask.any():
                out[mask] = f(mask)
        return scalarize(out)

    # -- moments -----------------------------------------------------------
    def mean(self):
        r"""Expectation :math:`E[x] = \sqrt{\chi/\psi}\,
        K_{\gamma+1}(\omega) / K_\gamma(\omega)`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[x]`; closed form :math:`\sqrt{\chi/\psi} + 1/\psi` for
            :math:`\gamma = 1/2` and :math:`\sqrt{\chi/\psi}` for
            :math:`\gamma = -1/2`.
        """
        sp, sx = self._sqrt_psi, self._sqrt_chi

        def gen(i):
            g, w = self.gamma[i], self._omega[i]
            return sx[i] / sp[i] * np.exp(log_kve(g + 1.0, w) - log_kve(g, w))

        return self._by_case(lambda i: sx[i] / sp[i] + 1.0 / self.psi[i],
                             lambda i: sx[i] / sp[i], gen)

    def mean_inv(self):
        r"""Expectation of the reciprocal, :math:`E[1/x] = \sqrt{\psi/\chi}\,
        K_{\gamma-1}(\omega) / K_\gamma(\omega)`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[1/x]`; closed form :math:`\sqrt{\psi/\chi}` for
            :math:`\gamma = 1/2` and :math:`\sqrt{\psi/\chi} + 1/\chi` for
            :math:`\gamma = -1/2`.
        """
        sp, sx = self._sqrt_psi, self._sqrt_chi

        def gen(i):
            g, w = self.gamma[i], self._omega[i]
            return sp[i] / sx[i] * np.exp(log_kve(g - 1.0, w) - log_kve(g, w))

        return self._by_case(lambda i: sp[i] / sx[i],
                             lambda i: sp[i] / sx[i] + 1.0 / self.chi[i], gen)

    def _half_log_ratio(self, i):
        """``log(sqrt(chi / psi))`` on index ``i``."""
        return 0.5 * (np.log(self.chi[i]) - np.log(self.psi[i]))

    def mean_log(self):
        r"""Expectation of the logarithm, :math:`E[\log x] =
        \tfrac12 \log(\chi/\psi) + \partial_\nu \log K_\nu(\omega)
        |_{\nu=\gamma}`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[\log x]`.  For :math:`\gamma = \pm 1/2` the derivative
            is :math:`\pm e^{2\omega} E_1(2\omega)` (exact); otherwise a
            five-point central difference of ``log(kve)`` in the order.
        """
        w = self._omega

        def gen(i):
            return self._half_log_ratio(i) + dlog_kv_dnu(self.gamma[i], w[i])

        return self._by_case(
            lambda i: self._half_log_ratio(i) + exp_e1(2.0 * w[i]),
            lambda i: self._half_log_ratio(i) - exp_e1(2.0 * w[i]),
            gen)

    def log_normalizer(self):
        r"""Log normalising constant.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`\log \int_0^\infty x^{\gamma-1}
            e^{-(\psi x + \chi/x)/2} dx = \log 2 + \tfrac{\gamma}{2}
            \log(\chi/\psi) + \log K_\gamma(\sqrt{\psi\chi})`; equal to
            :math:`\tfrac12\log(2\pi/\psi) - \omega` for :math:`\gamma = 1/2`
            and :math:`\tfrac12\log(2\pi/\chi) - \omega` for
            :math:`\gamma = -1/2`.
        """
        w = self._omega

        def gen(i):
            g = self.gamma[i]
            return (LOG_2 + g * self._half_log_ratio(i)
                    + log_kve(g, w[i]) - w[i])

        return self._by_case(
            lambda i: 0.5 * (LOG_2PI - np.log(self.psi[i])) - w[i],
            lambda i: 0.5 * (LOG_2PI - np.log(self.chi[i])) - w[i],
            gen)

    def entropy(self):
        r"""Differential entropy.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`H = \log Z - (\gamma - 1) E[\log x] + (\psi E[x] +
            \chi E[1/x]) / 2`; equal to
            :math:`\tfrac12 \log(2\pi e/\psi) + \tfrac12 E[\log x]` for
            :math:`\gamma = 1/2` and :math:`\tfrac12 \log(2\pi e/\chi) +
            \tfrac32 E[\log x]` for :math:`\gamma = -1/2`.
        """
        w = self._omega

        def gen(i):
            g, wi = self.gamma[i], w[i]
            l0 = log_kve(g, wi)
            rp = np.exp(log_kve(g + 1.0, wi) - l0)
            rm = np.exp(log_kve(g - 1.0, wi) - l0)
            hl = self._half_log_ratio(i)
            log_z = LOG_2 + g * hl + l0 - wi
            elog = hl + dlog_kv_dnu(g, wi)
            return log_z - (g - 1.0) * elog + 0.5 * wi * (rp + rm)

        def half(i):
            elog = self._half_log_ratio(i) + exp_e1(2.0 * w[i])
            return 0.5 * (LOG_2PI + 1.0 - np.log(self.psi[i])) + 0.5 * elog

        def mhalf(i):
            elog = self._half_log_ratio(i) - exp_e1(2.0 * w[i])
            return 0.5 * (LOG_2PI + 1.0 - np.log(self.chi[i])) + 1.5 * elog

        return self._by_case(half, mhalf, gen)

    def _log_density(self, x):
        r""":math:`(\gamma-1)\log x - (\psi x + \chi/x)/2 - \log Z` at positive ``x``."""
        return ((self.gamma - 1.0) * np.log(x)
                - 0.5 * (self.psi * x + self.chi / x)
                - self.log_normalizer())

    @with_draw_parameters
    def sample(self, rng, size=None):
        r"""Random draws.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Float64 draws of shape ``size + self.shape``, finite and in
            :data:`~vbsvm.distributions.common.DRAW_RANGE` (a draw beyond it is clipped there;
            :meth:`sample_log` gives the exact logarithms).

        Notes
        -----
        ``gamma = 1/2``: :math:`1/x \sim IG(\text{mean}=\sqrt{\psi/\chi},
        \text{shape}=\psi)`; ``gamma = -1/2``:
        :math:`x \sim IG(\text{mean}=\sqrt{\chi/\psi}, \text{shape}=\chi)`;
        both drawn with the cancellation-free Michael-Schucany-Haas method
        (see :func:`sample_gig_half`), on the log scale (:func:`_ig_log_draws`, same random
        numbers) where the floating point form over- or underflows. Other ``gamma``:
        :math:`\log x = \tfrac12\log(\chi/\psi) + \log y` with :math:`y` the standardized GIG
        drawn on the log scale by :func:`sample_log_gig`, vectorized over all parameters (for
        every ``gamma``, ``psi`` and ``chi``; the random numbers differ from those of
        ``scipy.stats.geninvgauss``, which fails for ``sqrt(psi * chi)`` near ``1e-300``).
        Elements are drawn by case: ``gamma = 1/2`` first, then ``-1/2``, then the others.
        """
        return self._draw(rng, size, log=False)

    def _sample_log(self, rng, size):
        """The logarithms of :meth:`sample`'s draws, exact."""
        return self._draw(rng, size, log=True)

    def _draw(self, rng, size, log):
        """Draws (``log=False``) or their logarithms (``log=True``) of shape ``size + self.shape``."""
        full = size_tuple(size) + self.shape

        def bc(a):
            return np.broadcast_to(a, full)

        psi, chi, sp, sx, w = (bc(v) for v in (self.psi, self.chi, self._sqrt_psi, self._sqrt_chi, self._omega))
        log_ratio = bc(0.5 * (np.log(self.chi) - np.log(self.psi)))  # log sqrt(chi / psi)
        log_omega = bc(0.5 * (np.log(self.psi) + np.log(self.chi)))
        out = np.empty(full)
        for mask, sign in ((bc(self._half), -1.0), (bc(self._mhalf), 1.0)):
            if not mask.any():
                continue
            wi, lr, lw = w[mask], log_ratio[mask], log_omega[mask]
            a2, acc, n, u = _ig_core(wi, rng, wi.shape)

            def log_x(j, lr=lr, lw=lw, n=n, u=u, sign=sign):  # x (gamma = -1/2) or 1/x (1/2) is IG
                return sign * _ig_log_draws(sign * lr[j], lw[j], n[j], u[j])

            if log:
                out[mask] = log_x(...)
                continue
            with np.errstate(all="ignore"):
                if sign < 0:
                    x = np.where(acc, a2 / (4.0 * psi[mask]), 4.0 * wi / a2 * (sx[mask] / sp[mask]))
                else:
                    x = np.where(acc, 4.0 * chi[mask] / a2, a2 / (4.0 * wi) * (sx[mask] / sp[mask]))
            out[mask] = clip_log_draws(x, log_x, outside_range(x))
        gen = bc(self._general)
        if gen.any():
            lx = log_ratio[gen] + sample_log_gig(bc(self.gamma)[gen], log_omega[gen], rng)
            out[gen] = lx if log else exp_clipped(lx)
        return out


# ---------------------------------------------------------------------------
# Inverse Gaussian
# ---------------------------------------------------------------------------
class InverseGaussian(PositiveLaw):
    r"""Inverse Gaussian (Wald) distribution (vectorized).

    Density :math:`\sqrt{\lambda/(2\pi x^3)}
    \exp\{-\lambda (x-\mu)^2 / (2\mu^2 x)\}` on :math:`x > 0`.

    Parameters
    ----------
    mean : array_like
        Mean :math:`\mu > 0`.
    shape : array_like
        Shape :math:`\lambda > 0`.

    Attributes
    ----------
    mu, lam : numpy.ndarray
        Read-only broadcast float64 copies of ``mean`` and ``shape`` (the
        names ``mean``/``shape`` are taken by the method and batch shape).
    shape : tuple of int
        Broadcast batch shape.

    Raises
    ------
    ValueError
        If some ``mean`` or ``shape`` is not strictly positive.

    Notes
    -----
    Equal to ``GIG(-1/2, lambda/mu**2, lambda)`` and to
    ``scipy.stats.invgauss(mu=mean/shape, scale=shape)``.
    """

    def __init__(self, mean, shape):
        self.mu, self.lam = self._positive_parameters(mean=mean, shape=shape)
        with np.errstate(over="ignore", under="ignore"):
            self._omega = self.lam / self.mu

    def mean(self):
        """Expectation :math:`E[x] = \\mu`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            The mean parameter (a copy).
        """
        return scalarize(np.array(self.mu))

    def mean_inv(self):
        r"""Expectation of the reciprocal, :math:`E[1/x] = 1/\mu + 1/\lambda`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[1/x]`.
        """
        return scalarize(1.0 / self.mu + 1.0 / self.lam)

    def mean_log(self):
        r"""Expectation of the logarithm.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`E[\log x] = \log\mu - e^{2\lambda/\mu} E_1(2\lambda/\mu)`.
        """
        return scalarize(np.log(self.mu) - exp_e1(2.0 * self._omega))

    def entropy(self):
        r"""Differential entropy.

        Returns
        -------
        numpy.ndarray or numpy.float64
            :math:`\tfrac12\log(2\pi e/\lambda) + \tfrac32 E[\log x]`.
        """
        return scalarize(0.5 * (LOG_2PI + 1.0 - np.log(self.lam))
                          + 1.5 * np.asarray(self.mean_log()))

    def _log_density(self, x):
        r""":math:`\tfrac12 \log(\lambda / 2\pi x^3) - \lambda (x - \mu)^2 / (2 \mu^2 x)` at positive ``x``."""
        return (0.5 * (np.log(self.lam) - LOG_2PI - 3.0 * np.log(x))
                - self.lam * (x - self.mu) ** 2 / (2.0 * self.mu ** 2 * x))

    @with_draw_parameters
    def sample(self, rng, size=None):
        """Random draws (Michael-Schucany-Haas, cancellation-free).

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Float64 draws of shape ``size + self.shape``.  Same law as
            ``rng.wald(mean, shape)`` but accurate for ``mean/shape`` beyond
            ``1e16``, where numpy's ``wald`` returns ``0``; computed on the log scale
            (:func:`_ig_log_draws`, same random numbers) where the floating point form over- or
            underflows (e.g. ``shape / mean`` beyond ``1e308``), and clipped to
            :data:`~vbsvm.distributions.common.DRAW_RANGE`.
        """
        full = size_tuple(size) + self.shape
        w = np.broadcast_to(self._omega, full)
        lam = np.broadcast_to(self.lam, full)
        mu = np.broadcast_to(self.mu, full)
        with np.errstate(all="ignore"):
            a2, acc, n, u = _ig_core(w, rng, full)
            x = np.where(acc, 4.0 * lam / a2, mu * (a2 / (4.0 * w)))
        return clip_log_draws(x, lambda i: self._log_draws(full, n, u, i), outside_range(x))

    def _log_draws(self, full, n, u, i=...):
        """Exact logarithms of the draws with normals ``n`` and uniforms ``u`` at index ``i``."""
        log_mu = np.broadcast_to(np.log(self.mu), full)[i]
        log_omega = np.broadcast_to(np.log(self.lam) - np.log(self.mu), full)[i]
        return _ig_log_draws(log_mu, log_omega, n[i], u[i])

    def _sample_log(self, rng, size):
        """The logarithms of :meth:`sample`'s draws, exact."""
        full = size_tuple(size) + self.shape
        _, _, n, u = _ig_core(np.broadcast_to(self._omega, full), rng, full)
        return self._log_draws(full, n, u)

    def as_gig(self):
        r"""The same law as a :class:`GIG`.

        Returns
        -------
        GIG
            ``GIG(-1/2, lambda / mu**2, lambda)``.
        """
        return GIG(-0.5, self.lam / self.mu ** 2, self.lam)
