"""What the distribution families share: the batch-shape ``repr``, the log density of a law on
the positive reals and the parameters of the samplers' docstrings."""

from __future__ import annotations

import textwrap

import numpy as np

from vbsvm.distributions.common import readonly, scalarize

__all__ = ["BatchLaw", "PositiveLaw", "with_draw_parameters"]

_DRAW_PARAMETERS = """\
Parameters
----------
rng : numpy.random.Generator
    Source of randomness.
size : None, int or tuple of int, optional
    Extra leading shape."""


def with_draw_parameters(sampler):
    """Put the parameters ``rng`` and ``size`` in place of the line ``{draw_parameters}`` of a
    sampler's docstring.

    Parameters
    ----------
    sampler : callable
        A method ``sampler(rng, size=None)``.

    Returns
    -------
    callable
        ``sampler``, its docstring completed.
    """
    doc = sampler.__doc__
    if doc:  # None under python -OO
        line = next(t for t in doc.splitlines() if t.strip() == "{draw_parameters}")
        sampler.__doc__ = doc.replace(line, textwrap.indent(_DRAW_PARAMETERS, line[:line.index("{")]))
    return sampler


class BatchLaw:
    """A vectorized law whose parameters are broadcast to the batch shape :attr:`shape`."""

    shape: tuple

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape})"


class PositiveLaw(BatchLaw):
    """A vectorized law on the positive reals; a family writes its log density for ``x > 0`` as
    ``_log_density(x)`` and the logarithms of its draws as ``_sample_log(rng, size)``."""

    def _positive_parameters(self, **params):
        """Read-only float64 copies of the named parameters broadcast together, each checked to
        be strictly positive (in the given order); sets :attr:`shape`."""
        arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in params.values()))
        for name, a in zip(params, arrays):
            if not (a > 0).all():
                raise ValueError(f"{type(self).__name__}: {name} must be strictly positive")
        arrays = [readonly(a) for a in arrays]
        self.shape = arrays[0].shape
        return arrays

    @with_draw_parameters
    def sample_log(self, rng, size=None):
        """Logarithms of random draws, exact for every parameter (never clipped); the same
        random numbers as :meth:`sample`.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray
            Shape ``size + self.shape``.
        """
        return self._sample_log(rng, size)

    def logpdf(self, x):
        """Log density.

        Parameters
        ----------
        x : array_like
            Points, broadcast against the parameters.

        Returns
        -------
        numpy.ndarray or numpy.float64
            Log density; ``-inf`` for ``x <= 0``.
        """
        x = np.asarray(x, dtype=np.float64)
        pos = x > 0
        return scalarize(np.where(pos, self._log_density(np.where(pos, x, 1.0)), -np.inf))
