r"""The multivariate normal in natural form and draws of truncated normals."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.special as sc

from vbsvm.distributions.base import with_draw_parameters
from vbsvm.distributions.common import LOG_2PI, chol_lower, readonly, scalarize, size_tuple

__all__ = ["FAR_TAIL_SD", "Gaussian", "sample_truncated_normal", "sample_truncated_std_normal"]

#: Distance (in sd) of a truncation interval's nearer end from the mean beyond which
#: :func:`sample_truncated_normal` draws by the exponential tail method instead of by inversion.
FAR_TAIL_SD = 1e6


class Gaussian:
    r"""Multivariate normal in natural (precision) form.

    Parameters
    ----------
    precision : array_like, shape (d, d)
        Symmetric positive definite precision matrix :math:`P`.  It is
        symmetrised as :math:`(P + P^T)/2` and factorised once as
        :math:`P = L L^T` (lower Cholesky).
    shift : array_like, shape (d,)
        Shift (information vector) :math:`h = P\mu`.

    Attributes
    ----------
    precision : numpy.ndarray, shape (d, d)
        Read-only symmetrised precision.
    shift : numpy.ndarray, shape (d,)
        Read-only shift.
    chol : numpy.ndarray, shape (d, d)
        Read-only lower Cholesky factor of the precision.
    dim : int
        Dimension ``d``.

    Raises
    ------
    numpy.linalg.LinAlgError
        If the precision is not positive definite (the caller may add
        jitter and retry).
    ValueError
        On shape mismatch or non-finite entries.
    """

    def __init__(self, precision, shift):
        p = np.array(precision, dtype=np.float64)
        h = np.array(shift, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != p.shape[1]:
            raise ValueError("Gaussian: precision must be a square matrix")
        if h.shape != (p.shape[0],):
            raise ValueError("Gaussian: shift must have shape (d,)")
        p = 0.5 * (p + p.T)
        self.precision = readonly(p)
        self.shift = readonly(h)
        self.dim = p.shape[0]
        self.chol = readonly(chol_lower(p, "Gaussian precision"))
        self._mean = readonly(scipy.linalg.cho_solve((self.chol, True), h))
        self._cov = None

    @classmethod
    def from_moments(cls, mean, cov):
        """Build from mean and covariance.

        Parameters
        ----------
        mean : array_like, shape (d,)
            Mean vector.
        cov : array_like, shape (d, d)
            Symmetric positive definite covariance.

        Returns
        -------
        Gaussian
            With precision ``cov^{-1}`` (via Cholesky) and shift
            ``cov^{-1} mean``.

        Raises
        ------
        numpy.linalg.LinAlgError
            If ``cov`` is not positive definite.
        """
        c = np.array(cov, dtype=np.float64)
        c = 0.5 * (c + c.T)
        lc = chol_lower(c, "Gaussian covariance")
        prec = scipy.linalg.cho_solve((lc, True), np.eye(c.shape[0]))
        prec = 0.5 * (prec + prec.T)
        m = np.asarray(mean, dtype=np.float64)
        return cls(prec, prec @ m)

    def __repr__(self):
        return f"Gaussian(dim={self.dim})"

    def mean(self):
        r"""Mean :math:`\mu = P^{-1} h`.

        Returns
        -------
        numpy.ndarray, shape (d,)
            A copy of the mean.
        """
        return np.array(self._mean)

    def cov(self):
        """Covariance :math:`P^{-1}` (Cholesky solve against the identity).

        Returns
        -------
        numpy.ndarray, shape (d, d)
            A symmetric copy of the covariance.
        """
        if self._cov is None:
            c = scipy.linalg.cho_solve((self.chol, True), np.eye(self.dim))
            self._cov = readonly(0.5 * (c + c.T))
        return np.array(self._cov)

    def diag_cov(self):
        r"""Marginal variances, the diagonal of :math:`P^{-1}`.

        Returns
        -------
        numpy.ndarray, shape (d,)
            Column sums of squares of :math:`L^{-1}` (since
            :math:`P^{-1} = L^{-T} L^{-1}`); the full covariance is not
            formed.
        """
        if self._cov is not None:
            return np.array(np.diagonal(self._cov))
        linv = scipy.linalg.solve_triangular(self.chol, np.eye(self.dim),
                                             lower=True)
        return np.einsum("ij,ij->j", linv, linv)

    def logdet_cov(self):
        r""":math:`\log|\Sigma| = -2 \sum_i \log L_{ii}`.

        Returns
        -------
        float
            Log determinant of the covariance.
        """
        return float(-2.0 * np.sum(np.log(np.diagonal(self.chol))))

    def entropy(self):
        r"""Entropy :math:`\tfrac{d}{2}(1 + \log 2\pi) + \tfrac12\log|\Sigma|`.

        Returns
        -------
        float
            Differential entropy.
        """
        return 0.5 * self.dim * (1.0 + LOG_2PI) + 0.5 * self.logdet_cov()

    def logpdf(self, x):
        """Log density.

        Parameters
        ----------
        x : array_like, shape (..., d)
            Points.

        Returns
        -------
        numpy.ndarray or numpy.float64
            Log density, shape ``x.shape[:-1]``.
        """
        x = np.asarray(x, dtype=np.float64)
        r = x - self._mean
        z = r @ self.chol  # rows are (L^T r)^T
        quad = np.sum(z * z, axis=-1)
        return scalarize(np.asarray(
            -0.5 * (self.dim * LOG_2PI + self.logdet_cov() + quad)))

    @with_draw_parameters
    def sample(self, rng, size=None):
        r"""Random draws :math:`\mu + L^{-T} z`, :math:`z \sim N(0, I)`.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Draws of shape ``size + (d,)``.
        """
        shp = size_tuple(size)
        m = int(np.prod(shp, dtype=np.int64))
        z = rng.standard_normal((self.dim, m))
        x = scipy.linalg.solve_triangular(self.chol, z, lower=True, trans="T")
        return (x.T + self._mean).reshape(shp + (self.dim,))


def sample_truncated_normal(mean, sd, low, high, rng):
    r"""Draws from normals ``N(mean, sd^2)`` truncated to ``[low, high]``, elementwise.

    Inversion in log space: in standard units ``a = (low - mean)/sd``, ``b = (high - mean)/sd``,
    an interval with ``a > 0`` is reflected to ``[-b, -a]`` so that both log CDFs
    (``scipy.special.log_ndtr``) are taken where they are accurate, and
    ``z = Phi^{-1}(Phi(a) + U (Phi(b) - Phi(a)))`` is computed as
    ``ndtri_exp(logaddexp(log Phi(a), log U + log(Phi(b) - Phi(a))))``. Exact (to rounding) for
    intervals anywhere in the tails, e.g. ``[40, 41]`` standard units, where ``Phi`` itself
    rounds to 1. ``low`` may be ``-inf`` and ``high`` ``+inf``; ``low < high`` is required.

    An interval whose nearer end lies more than :data:`FAR_TAIL_SD` ``= 1e6`` sd from the mean is
    drawn instead (there the inversion's error, about ``1e-16`` times the squared distance in
    units of the law's spread, exceeds ``1e-4`` of that spread; in ``mean + sd * z`` the nearer
    end is lost to rounding when it is small against ``mean``; and beyond ``1e154`` sd
    ``log_ndtr`` overflows) as the nearer end plus (inwards)
    ``sd * y``, :math:`y \sim \mathrm{Exp}(d)` truncated to the interval (``d`` the distance in
    sd) and accepted with probability :math:`e^{-y^2/2}` (exact; the acceptance rate exceeds
    ``1 - 1e-8``), computed in the original units so that ``mean``, ``sd`` and the bounds may
    span ``1e-300`` to ``1e300`` (the draw is the nearer end itself where ``sd * y``
    underflows). These draws take their uniforms after all the others.

    Parameters
    ----------
    mean, sd, low, high : array_like
        Broadcast together (``sd > 0``).
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
    """
    mean, sd, low, high = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (mean, sd, low, high)))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        a, b = (low - mean) / sd, (high - mean) / sd
        reflect = a > 0.0
        a, b = np.where(reflect, -b, a), np.where(reflect, -a, b)
        log_a, log_b = sc.log_ndtr(a), sc.log_ndtr(b)
        log_mass = log_b + np.log(-np.expm1(log_a - log_b))
        z = sample_truncated_std_normal(a, b, log_a, log_mass, rng)
        x = mean + sd * np.where(reflect, -z, z)
    far = b < -FAR_TAIL_SD
    if far.any():
        near = np.where(reflect, low, high)[far]
        inward = np.where(reflect, 1.0, -1.0)[far]
        s = sd[far]
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            y = _exponential_tail(-b[far], (high[far] - low[far]) / s, rng)
            x[far] = near + inward * (s * y)
    return x


def _exponential_tail(d, width, rng):
    """Offsets ``y >= 0`` (in sd) beyond the nearer end ``d > 0`` sd from the mean of a standard
    normal restricted to ``[d, d + width]``: ``Exp(d)`` truncated to ``[0, width]`` accepted with
    probability ``exp(-y^2/2)`` (the law of ``z - d`` is proportional to ``exp(-d y - y^2/2)``)."""
    y = np.empty(d.shape)
    todo = np.arange(d.size)
    while todo.size:  # each round accepts all but a fraction below 1e-8
        u, v = rng.random(todo.size), 1.0 - rng.random(todo.size)  # u in [0, 1), v in (0, 1]
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            cand = -np.log1p(-u * -np.expm1(-d[todo] * width[todo])) / d[todo]
        cand = np.where(np.isfinite(cand), cand, 0.0)  # d = inf: the offset is 0 to double precision
        ok = np.log(v) <= -0.5 * cand * cand
        y[todo[ok]] = cand[ok]
        todo = todo[~ok]
    return y


def sample_truncated_std_normal(a, b, log_a, log_mass, rng):
    """Draws of a standard normal restricted to ``[a, b]`` with ``a <= 0`` (an interval with
    ``a > 0`` is reflected by the caller, as :func:`sample_truncated_normal` does), given
    ``log_a = log Phi(a)`` and ``log_mass = log(Phi(b) - Phi(a))``:
    ``ndtri_exp(logaddexp(log_a, log U + log_mass))``, clipped to the interval.

    Parameters
    ----------
    a, b, log_a, log_mass : ndarray
        Of one shape.
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
    """
    with np.errstate(divide="ignore"):
        log_u = np.log(rng.random(a.shape))
    return np.clip(sc.ndtri_exp(np.logaddexp(log_a, log_u + log_mass)), a, b)
