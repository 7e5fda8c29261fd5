"""Linear algebra of Laplace-zero selection: the Gram of the selectable columns and the Gaussian posterior of the
coefficients given the indicators (with or without random slopes).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.linalg.blas import dtrmm
from scipy.linalg.lapack import dtrtri

from vbsvm.models.linear_algebra import CoefficientPosterior

LOG_2PI = math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)


#: Initial q(gamma_k) logit of the VB iterations: start with every term (almost surely) in the
#: model, so that the first q(theta) is the ridge-type fit of the full model.
ETA_INIT = 10.0


#: VB keeps the q(gamma_k) logits in [-ETA_MAX, ETA_MAX], i.e. mu_gamma within 1e-13 of 0 or 1.
#: On spam the unrestricted logits reach +-3e5 (the working weights w_i = chi_i^(-1/2) are huge
#: next to the margin); such values carry no information (expit saturates) but dominated the
#: SQUAREM step length. The restriction is a restriction of the variational family, so each
#: update is still the exact maximizer over it and the ELBO still never decreases.
ETA_MAX = 30.0


class IndicatorDraw(NamedTuple):
    """Result of :meth:`LaplaceZeroModel.collapsed_indicators`: the indicators, the conditional
    logits used, and the mean and variance of each term's coefficient given w and the other
    indicators as if the term were in (its Gaussian conditional with the others integrated out), and
    the regression ``c_k`` (rows; dense coordinates) of the other active coefficients on it:
    ``E[theta_A | theta_k] = const - c_k theta_k``."""

    gamma: np.ndarray
    logits: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    coupling: np.ndarray


class PriorOdds(NamedTuple):
    """The prior inclusion probability ``rho`` as the moves use it: ``log rho``, ``log(1 - rho)``
    and ``logit rho`` (:meth:`LaplaceZeroModel.prior_odds`)."""

    log_rho: float
    log_1mrho: float
    logit_rho: float


def expit_scalar(x: float) -> float:
    """expit of a Python float without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass
class Gram:
    """Data products that depend on the working weights w only (formed once per sweep).

    ``Gdd = Cd^T W Cd``; for the largest grouping factor ``Dw = Z_s^T w`` and ``Gsd = Z_s^T W Cd``;
    ``bd, br``: ``C^T y(1 + w)`` split in dense and sparse parts.
    """

    Gdd: np.ndarray
    bd: np.ndarray
    Dw: np.ndarray
    Gsd: np.ndarray
    br: np.ndarray
    #: the base model's :class:`~vbsvm.models.linear.WorkingGram` (random slopes only)
    working: object = None


def _selection_variance(C2sel, s, sel, second_moment_sel):
    """Variance of the score due to the indicators: ``sum_k c_ik^2 s_k (1 - s_k) Omega_kk``."""
    ss = s[sel]
    return C2sel @ (ss * (1.0 - ss) * second_moment_sel)


def selection_precision(base, gram: Gram, s, tau):
    """``(S, h, D, GD, br)``: the precision ``S`` and shift ``h`` of the dense coordinates of
    :class:`SelectionPosterior` (the random intercepts eliminated: ``D`` their precisions, ``GD``
    the coupling ``D^{-1} G``, ``br`` their shifts), before any factorization."""
    qd = base.qd
    A = gram.Gdd * np.outer(s, s)
    A[np.diag_indices(qd)] += tau[:qd] + np.diag(gram.Gdd) * s * (1.0 - s)
    hd = s * gram.bd
    if base.m_sparse:
        D = gram.Dw + tau[qd:]
        GD = (gram.Gsd * s) / D[:, None]
        br = gram.br
        S = A - (gram.Gsd * s).T @ GD
        h = hd - GD.T @ br
    else:
        D, GD, br = np.zeros(0), np.zeros((0, qd)), np.zeros(0)
        S, h = A, hd
    return S, h, D, GD, br


class SelectionPosterior(CoefficientPosterior):
    r"""Gaussian ``N(P^{-1} h, P^{-1})`` of theta given the inclusion weights ``s``.

    ``P = D G D + diag(diag(G) s (1 - s)) + diag(tau)`` and ``h = D C^T y(1 + w)`` with
    ``D = diag(s)`` over the dense coordinates (``s = 1`` except for the selectable columns).
    VB passes ``s = E_q[gamma~]``; Gibbs passes the current 0/1 indicators (then the extra ridge
    vanishes and this is the Appendix B full conditional). The moments, covariance blocks and
    sampler are those of :class:`~vbsvm.models.linear.CoefficientPosterior`.
    """

    def __init__(self, model, gram: Gram, s, tau):
        base = model.base
        self.model = base
        self.s = s
        self.C2sel = model.C2sel
        S, h, D, GD, br = selection_precision(base, gram, s, tau)
        self.L = np.linalg.cholesky(S)
        self.Linv, status = dtrtri(self.L, lower=1)
        if status != 0:
            raise np.linalg.LinAlgError("singular Cholesky factor of the coefficient precision")
        self._set_intercept_blocks(D, GD, br)
        self.mean_dense = self.Linv.T @ (self.Linv @ h)
        self.mean_sparse = br / D - GD @ self.mean_dense if base.m_sparse else np.zeros(0)

    def score_moments(self, s, sel, second_moment_sel):
        """Mean and variance of ``f_i = sum_j C_ij gamma~_j theta_j`` under ``q(theta) x Bernoulli(s)``.

        ``second_moment_sel`` is ``Omega_kk`` of the selectable coordinates ``sel``. The quadratic
        forms ``||L^{-1}(c_i * s - GD_l)||^2`` use a triangular multiply (BLAS trmm, half the flops
        of a general product); ``C[:, sel]^2`` is precomputed by the model.
        """
        m = self.model
        X = m.Cd * s  # Fortran order, as Cd
        mean = X @ self.mean_dense
        if m.m_sparse:
            mean = mean + self.mean_sparse[m.codes]
            X -= self.GD[m.codes]
            extra = 1.0 / self.D[m.codes]
        else:
            extra = 0.0
        V = dtrmm(1.0, self.Linv, X, side=1, lower=1, trans_a=1, overwrite_b=1)
        var = np.einsum("ij,ij->i", V, V) + extra
        return mean, var + _selection_variance(self.C2sel, s, sel, second_moment_sel)


class SlopeSelectionPosterior(CoefficientPosterior):
    r""":class:`SelectionPosterior` for random-effect terms with slopes or covariance matrices.

    The same ``P = D G D + diag(diag(G) s (1 - s)) + T`` and ``h = D C^T y(1 + w)``
    (``D = diag(s)`` on the dense coordinates, 1 on the random effects), with ``T`` holding
    ``E[Sigma_k^{-1}]`` (VB) or ``Sigma_k^{-1}`` (Gibbs) on each level's block of a term with a
    covariance; the block Schur elimination of the largest term is that of
    :class:`~vbsvm.models.linear.CoefficientPosterior`, applied to the scaled design ``C D``.
    """

    def __init__(self, model, gram: Gram, s, tau, blocks=()):
        base = model.base
        self.C2sel = model.C2sel
        g = copy.copy(gram.working)
        g.A = gram.Gdd * np.outer(s, s)
        g.A[np.diag_indices(base.qd)] += np.diag(gram.Gdd) * s * (1.0 - s)
        g.bd = s * gram.bd
        if base.m_sparse:
            g.G = g.G * s
        super().__init__(base, None, tau, None, blocks=blocks, gram=g)

    def score_moments(self, s, sel, second_moment_sel):
        """Mean and variance of the score under ``q(theta) x Bernoulli(s)`` (as
        :meth:`SelectionPosterior.score_moments`): the linear predictor of the scaled design
        ``C diag(s)`` plus the indicators' part."""
        base = self.model
        view = copy.copy(base)
        view.Cd = np.asfortranarray(base.Cd * s)
        self.model = view
        try:
            mean, var = self.linear_predictor()
        finally:
            self.model = base
        return mean, var + _selection_variance(self.C2sel, s, sel, second_moment_sel)
