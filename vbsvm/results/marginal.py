"""One-dimensional posterior marginals as every fit gives them to :mod:`vbsvm.results.compare`.

A :class:`Marginal` is a closed-form density (a frozen :mod:`scipy.stats` distribution: the
Gaussian or inverse-gamma q of a VB fit), a sample (Gibbs draws, iid draws from q, possibly with a
point mass at 0 for Laplace-zero coefficients) or a point (a posterior mode, a point estimate of a
hyperparameter). Samples are turned into densities by :func:`kde_on_grid`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.signal import fftconvolve

from vbsvm.exceptions import InputError

__all__ = ["Marginal", "kde_on_grid", "silverman_bandwidth"]


def silverman_bandwidth(x) -> float:
    """Silverman's rule ``0.9 min(sd, IQR/1.349) N^(-1/5)`` (a tiny positive width for a constant sample)."""
    x = np.asarray(x, dtype=float)
    sd = x.std(ddof=1) if x.size > 1 else 0.0
    iqr = np.subtract(*np.percentile(x, [75, 25])) / 1.349 if x.size > 1 else 0.0
    spread = min(sd, iqr) if iqr > 0 else sd
    if not spread > 0:
        spread = max(abs(float(x.mean())), 1.0) * 1e-8 if x.size else 1.0
    return 0.9 * spread * x.size ** (-0.2)


def kde_on_grid(draws, grid, *, bandwidth=None, lower=None) -> np.ndarray:
    """Gaussian kernel density estimate of ``draws`` on an evenly spaced ``grid``.

    Linear binning plus an FFT convolution (exact up to the binning, O(N + G log G)).

    Parameters
    ----------
    draws : array_like
        1-d sample.
    grid : numpy.ndarray
        Evenly spaced evaluation points, covering the data.
    bandwidth : float, optional
        Kernel sd; default Silverman's rule ``0.9 min(sd, IQR/1.349) N^(-1/5)``.
    lower : float, optional
        Known lower bound of the support: the estimate is reflected there (no mass leaks below).

    Returns
    -------
    numpy.ndarray
        Density values at ``grid`` (integrating to ~1 over the grid).
    """
    x = np.asarray(draws, dtype=float).ravel()
    h = silverman_bandwidth(x) if bandwidth is None else float(bandwidth)
    if lower is not None:
        x = np.concatenate([x, 2.0 * lower - x])
    g0, dx = grid[0], grid[1] - grid[0]
    # extend the grid by 5 bandwidths on both sides so that no kernel mass is cut
    pad = int(np.ceil(5 * h / dx)) + 1
    G = grid.size + 2 * pad
    pos = (x - g0) / dx + pad
    inside = (pos >= 0) & (pos <= G - 1)
    pos = pos[inside]
    left = np.floor(pos).astype(np.int64)
    left = np.minimum(left, G - 2)
    frac = pos - left
    counts = np.bincount(left, weights=1.0 - frac, minlength=G) + np.bincount(left + 1, weights=frac, minlength=G)
    half = int(np.ceil(5 * h / dx))
    kx = np.arange(-half, half + 1) * dx
    kernel = np.exp(-0.5 * (kx / h) ** 2)
    kernel /= kernel.sum() * dx
    dens = fftconvolve(counts, kernel, mode="same")[pad: pad + grid.size]
    n_orig = np.asarray(draws).size
    dens = np.maximum(dens, 0.0) / n_orig
    if lower is not None:
        dens[grid < lower] = 0.0
    return dens


@dataclass
class Marginal:
    """A one-dimensional marginal: closed form (``dist``), a sample (``draws``), or a point.

    Build one with :meth:`gaussian`, :meth:`of_distribution`, :meth:`of_draws` or :meth:`point`.

    Attributes
    ----------
    mean, sd : float
        Its mean and sd (sd NaN for a point).
    dist : scipy.stats frozen distribution or None
    draws : numpy.ndarray or None
    lower : float or None
        Known lower bound of the support (0 for a variance): KDEs are reflected there.
    """

    mean: float
    sd: float
    dist: object = None
    draws: np.ndarray | None = None
    lower: float | None = None

    # -------------------------------------------------------------- constructors
    @classmethod
    def gaussian(cls, mean, sd) -> "Marginal":
        """``N(mean, sd^2)`` in closed form."""
        return cls(float(mean), float(sd), dist=stats.norm(mean, sd))

    @classmethod
    def of_distribution(cls, dist, lower=None) -> "Marginal":
        """A frozen :mod:`scipy.stats` distribution (its mean and sd from the distribution)."""
        return cls(float(dist.mean()), float(dist.std()), dist=dist, lower=lower)

    @classmethod
    def of_draws(cls, draws, lower=None) -> "Marginal":
        """A sample (mean and sd with ``ddof=1``)."""
        x = np.asarray(draws, dtype=float).ravel()
        return cls(float(x.mean()), float(x.std(ddof=1)), draws=x, lower=lower)

    @classmethod
    def point(cls, value) -> "Marginal":
        """A point (a mode or a point estimate): no spread, so no accuracy either."""
        return cls(float(value), float("nan"))

    @classmethod
    def coerce(cls, x, lower=None) -> "Marginal":
        """``x`` as a Marginal: a Marginal, a frozen distribution (``pdf`` and ``ppf``) or draws."""
        if isinstance(x, cls):
            return x
        if hasattr(x, "pdf") and hasattr(x, "ppf"):
            return cls.of_distribution(x, lower)
        arr = np.asarray(x, dtype=float).ravel()
        if arr.size < 2 or not np.all(np.isfinite(arr)):
            raise InputError("draws for the accuracy score must be at least 2 finite numbers.")
        return cls.of_draws(arr, lower)

    # -------------------------------------------------------------- densities
    @property
    def kind(self) -> str:
        return "analytic" if self.dist is not None else "draws" if self.draws is not None else "point"

    def spike(self) -> float:
        """Mass at exactly 0 (Laplace-zero coefficients)."""
        if self.draws is None:
            return 0.0
        return float(np.mean(self.draws == 0.0))

    def _continuous(self):
        if self.draws is None:
            return None
        nz = self.draws[self.draws != 0.0]
        return nz if nz.size >= 2 else None

    def support(self):
        """(lo, hi, resolution) of the continuous part, or None if it has none."""
        if self.dist is not None:
            lo, hi = self.dist.ppf(1e-7), self.dist.ppf(1 - 1e-7)
            return float(lo), float(hi), float(self.dist.std()) / 20.0
        nz = self._continuous()
        if nz is None:
            return None
        h = silverman_bandwidth(nz)
        return float(nz.min() - 5 * h), float(nz.max() + 5 * h), h / 5.0

    def density(self, grid):
        """Continuous part of the density on ``grid`` (integrates to ``1 - spike``)."""
        if self.dist is not None:
            return self.dist.pdf(grid)
        nz = self._continuous()
        if nz is None:
            return np.zeros_like(grid)
        return kde_on_grid(nz, grid, lower=self.lower) * (nz.size / self.draws.size)
