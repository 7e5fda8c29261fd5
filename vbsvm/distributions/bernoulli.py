r"""The Bernoulli law (vectorized), with accurate log probabilities for extreme logits."""

from __future__ import annotations

import numpy as np
import scipy.special as sc

from vbsvm.distributions.base import BatchLaw, with_draw_parameters
from vbsvm.distributions.common import readonly, scalarize, size_tuple

__all__ = ["Bernoulli"]


class Bernoulli(BatchLaw):
    r"""Bernoulli distribution (vectorized).

    Parameters
    ----------
    p : array_like
        Success probabilities in :math:`[0, 1]`.

    Attributes
    ----------
    p : numpy.ndarray
        Read-only float64 probabilities.
    shape : tuple of int
        Batch shape.

    Raises
    ------
    ValueError
        If some ``p`` lies outside ``[0, 1]`` (or is nan).

    Notes
    -----
    :math:`\log p` and :math:`\log(1 - p)` are stored; with
    :meth:`from_logit` they come from ``scipy.special.log_expit`` and are
    finite for any finite logit.
    """

    def __init__(self, p):
        p = np.array(p, dtype=np.float64)
        if not np.all((p >= 0) & (p <= 1)):
            raise ValueError("Bernoulli: p must lie in [0, 1]")
        with np.errstate(divide="ignore"):
            self._set(p, np.log(p), np.log1p(-p))

    def _set(self, p, log_p, log_1mp):
        """Store probabilities and their logs (read-only copies)."""
        self.p = readonly(p)
        self._log_p = readonly(log_p)
        self._log_1mp = readonly(log_1mp)
        self.shape = self.p.shape

    @classmethod
    def from_logit(cls, logit):
        r"""Build from log odds :math:`l = \log(p / (1 - p))`.

        Parameters
        ----------
        logit : array_like
            Log odds (any finite reals).

        Returns
        -------
        Bernoulli
            With ``p = expit(logit)``, ``log p = log_expit(logit)`` and
            ``log(1 - p) = log_expit(-logit)``.
        """
        l = np.asarray(logit, dtype=np.float64)  # noqa: E741
        obj = cls.__new__(cls)
        obj._set(sc.expit(l), sc.log_expit(l), sc.log_expit(-l))
        return obj

    def mean(self):
        """Expectation :math:`p`.

        Returns
        -------
        numpy.ndarray or numpy.float64
            A copy of ``p``.
        """
        return scalarize(np.array(self.p))

    def entropy(self):
        r"""Entropy :math:`-p\log p - (1-p)\log(1-p)` in nats.

        Returns
        -------
        numpy.ndarray or numpy.float64
            Entropy, ``0`` (not nan) at ``p`` in ``{0, 1}``.
        """
        p = self.p
        q = np.exp(self._log_1mp)  # accurate 1 - p
        t1 = np.where(p > 0, p * np.where(p > 0, self._log_p, 0.0), 0.0)
        t0 = np.where(q > 0, q * np.where(q > 0, self._log_1mp, 0.0), 0.0)
        return scalarize(-(t1 + t0))

    def logpmf(self, x):
        """Log probability mass.

        Parameters
        ----------
        x : array_like
            Outcomes (0/1 or bool), broadcast against ``p``.

        Returns
        -------
        numpy.ndarray or numpy.float64
            ``log p`` where ``x == 1``, ``log(1 - p)`` where ``x == 0``,
            ``-inf`` elsewhere.
        """
        x = np.asarray(x)
        return scalarize(np.where(x == 1, self._log_p,
                                   np.where(x == 0, self._log_1mp, -np.inf)))

    @with_draw_parameters
    def sample(self, rng, size=None):
        """Random draws.

        {draw_parameters}

        Returns
        -------
        numpy.ndarray of bool
            Draws of shape ``size + self.shape``; ``True`` means 1.  (Use
            ``.astype(np.int8)`` or ``.astype(float)`` for arithmetic.)
        """
        full = size_tuple(size) + self.shape
        return rng.random(full) < self.p
