r"""The inverse Wishart law: moments, entropy, log density and Bartlett draws."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.special as sc

from vbsvm.distributions.base import with_draw_parameters
from vbsvm.distributions.common import (
    DRAW_RANGE,
    LOG_2,
    chol_lower,
    readonly,
    scalarize,
    size_tuple,
)
from vbsvm.distributions.gamma import log_standard_gamma_draws

__all__ = ["InverseWishart"]


class InverseWishart:
    r"""Inverse Wishart distribution on :math:`d \times d` SPD matrices.

    Density :math:`\frac{|\Psi|^{\nu/2}}{2^{\nu d/2}\Gamma_d(\nu/2)}
    |S|^{-(\nu+d+1)/2} \exp\{-\operatorname{tr}(\Psi S^{-1})/2\}`, as
    ``scipy.stats.invwishart(df=nu, scale=Psi)``.

    Parameters
    ----------
    scale : array_like, shape (d, d)
        Symmetric positive definite scale matrix :math:`\Psi`.
    df : float
        Degrees of freedom :math:`\nu > d - 1`.

    Attributes
    ----------
    scale : numpy.ndarray, shape (d, d)
        Read-only symmetrised scale.
    df : float
        Degrees of freedom.
    dim : int
        Dimension ``d``.

    Raises
    ------
    ValueError
        If ``df <= d - 1`` or shapes are wrong.
    numpy.linalg.LinAlgError
        If ``scale`` is not positive definite.
    """

    def __init__(self, scale, df):
        s = np.array(scale, dtype=np.float64)
        if s.ndim != 2 or s.shape[0] != s.shape[1]:
            raise ValueError("InverseWishart: scale must be a square matrix")
        d = s.shape[0]
        df = float(df)
        if not df > d - 1:
            raise ValueError(f"InverseWishart: df must exceed d - 1 = {d - 1}")
        s = 0.5 * (s + s.T)
        self.scale = readonly(s)
        self.df = df
        self.dim = d
        self._chol = readonly(chol_lower(s, "InverseWishart scale"))
        self._logdet_scale = float(2.0 * np.sum(np.log(np.diagonal(self._chol))))
        self._log_z = (0.5 * df * d * LOG_2 + sc.multigammaln(0.5 * df, d)
                       - 0.5 * df * self._logdet_scale)

    def __repr__(self):
        return f"InverseWishart(dim={self.dim}, df={self.df})"

    def mean(self):
        r"""Expectation :math:`\Psi / (\nu - d - 1)`.

        Returns
        -------
        numpy.ndarray, shape (d, d)
            The mean.

        Raises
        ------
        ValueError
            If :math:`\nu \le d + 1` (the mean does not exist).
        """
        if not self.df > self.dim + 1:
            raise ValueError("InverseWishart: mean exists only for df > d + 1")
        return self.scale / (self.df - self.dim - 1.0)

    def mean_inv(self):
        r""":math:`E[S^{-1}] = \nu \Psi^{-1}` (Cholesky solve).

        Returns
        -------
        numpy.ndarray, shape (d, d)
            Expected precision.
        """
        inv = scipy.linalg.cho_solve((self._chol, True), np.eye(self.dim))
        return self.df * 0.5 * (inv + inv.T)

    def mean_logdet(self):
        r""":math:`E[\log|S|] = \log|\Psi| - d\log 2 -
        \sum_{i=1}^d \psi((\nu - i + 1)/2)`.

        Returns
        -------
        float
            Expected log determinant.
        """
        i = np.arange(1, self.dim + 1)
        return float(self._logdet_scale - self.dim * LOG_2
                     - np.sum(sc.digamma(0.5 * (self.df - i + 1.0))))

    def entropy(self):
        r"""Differential entropy :math:`\log Z + \tfrac{\nu+d+1}{2}
        E[\log|S|] + \tfrac{\nu d}{2}`.

        Returns
        -------
        float
            Entropy (with respect to Lebesgue measure on the
            :math:`d(d+1)/2` free entries).
        """
        return float(self._log_z
                     + 0.5 * (self.df + self.dim + 1.0) * self.mean_logdet()
                     + 0.5 * self.df * self.dim)

    def logpdf(self, S):
        """Log density.

        Parameters
        ----------
        S : array_like, shape (..., d, d)
            Symmetric positive definite matrices.

        Returns
        -------
        numpy.ndarray or numpy.float64
            Log density, shape ``S.shape[:-2]``.

        Raises
        ------
        numpy.linalg.LinAlgError
            If some ``S`` is not positive definite.
        """
        S = np.asarray(S, dtype=np.float64)
        lc = np.linalg.cholesky(S)
        logdet = 2.0 * np.sum(np.log(np.diagonal(lc, axis1=-2, axis2=-1)),
                              axis=-1)
        x = np.linalg.solve(lc, np.broadcast_to(self._chol, S.shape))
        tr = np.sum(x * x, axis=(-2, -1))  # tr(Psi S^{-1})
        return scalarize(np.asarray(
            -self._log_z - 0.5 * (self.df + self.dim + 1.0) * logdet - 0.5 * tr))

    def expected_logpdf(self, q):
        r"""Expected log density of this distribution under ``q``.

        Parameters
        ----------
        q : InverseWishart
            Any object with ``mean_inv()`` (a ``(d, d)`` matrix) and
            ``mean_logdet()``.

        Returns
        -------
        float
            :math:`E_q[\log p(S)] = -\log Z_p - \tfrac{\nu+d+1}{2}
            E_q[\log|S|] - \tfrac12 \operatorname{tr}(\Psi E_q[S^{-1}])`.
        """
        return float(-self._log_z
                     - 0.5 * (self.df + self.dim + 1.0) * q.mean_logdet()
                     - 0.5 * np.sum(self.scale * q.mean_inv()))

    @with_draw_parameters
    def sample(self, rng, size=None):
        r"""Random draws by the Bartlett decomposition.

        With :math:`\Psi = C C^T` and :math:`A` lower triangular,
        :math:`A_{ii}^2 \sim \chi^2_{\nu - i + 1}`, :math:`A_{ij} \sim N(0,1)`
        (:math:`i > j`), :math:`S^{-1} = C^{-T} A A^T C^{-1}` is
        Wishart(:math:`\nu, \Psi^{-1}`), so :math:`S = B B^T` with
        :math:`B = C A^{-T}`.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Symmetric draws of shape ``size + (d, d)``.

        Notes
        -----
        The chi-square diagonals are ``2 * rng.standard_gamma((nu - i + 1) / 2)`` (numpy's
        ``chisquare``), those below the smallest double redrawn on the log scale
        (:func:`~vbsvm.distributions.gamma.log_standard_gamma_draws`), and floored at
        :math:`10^{-300} \max(1, \max_i \Psi_{ii})`: a smaller one (possible only for
        :math:`\nu - d + 1` below about ``0.05``) would make an entry of :math:`S` exceed about
        ``1e300``, beyond double precision, or :math:`A` numerically singular; with the floor
        every draw is finite and positive definite.
        """
        shp = size_tuple(size)
        d = self.dim
        g = rng.standard_gamma((self.df - np.arange(d)) / 2.0, size=shp + (d,))
        log_g, tail = log_standard_gamma_draws(g, (self.df - np.arange(d)) / 2.0, rng)
        chi2 = 2.0 * g
        floor = DRAW_RANGE[0] * max(1.0, float(np.max(np.diagonal(self.scale))))
        small = tail | (chi2 < floor)
        if small.any():
            chi2[small] = np.maximum(np.exp(LOG_2 + log_g[small]), floor)
        il = np.tril_indices(d, -1)
        a = np.zeros(shp + (d, d))
        idx = np.arange(d)
        a[..., idx, idx] = np.sqrt(chi2)
        a[..., il[0], il[1]] = rng.standard_normal(shp + (len(il[0]),))
        ainv = np.linalg.inv(a)
        b = self._chol @ np.swapaxes(ainv, -1, -2)
        s = b @ np.swapaxes(b, -1, -2)
        return 0.5 * (s + np.swapaxes(s, -1, -2))
