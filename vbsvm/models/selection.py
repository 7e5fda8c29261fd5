r"""Laplace-zero variable selection for the linear Bayesian SVM (Luts & Ormerod 2014, Section 3.2,
Algorithm 3 and Appendix B).

Model. The columns of the fixed-effect design split into the always-included block ``beta``
(intercept and the ``keep`` terms, prior :math:`N(0, \sigma_\beta^2)`) and the :math:`m`
selectable columns :math:`Z`; random intercepts :math:`u_g` (``(1 | g)`` terms) are always
included with their own variances (random slopes: see *Random slopes* below). With :math:`C = [X, Z, Z_{groups}]`,
:math:`\theta = (\beta, v, u_g)`, :math:`\tilde\gamma = (1_p, \gamma, 1)` and
:math:`f = C \mathrm{diag}(\tilde\gamma)\theta` (so the effective coefficient of column k is
:math:`u_k = \gamma_k v_k`):

.. math::

    p(y, a \mid \theta, \gamma) &= \prod_i (2\pi a_i)^{-1/2} \exp\{-(1 + a_i - y_i f_i)^2 / (2 a_i)\}, \\
    \beta_j &\sim N(0, \sigma_\beta^2), \qquad u_{g,l} \sim N(0, \sigma_g^2), \\
    v_k \mid b_k, \sigma_u^2 &\sim N(0, \sigma_u^2 / b_k), \qquad b_k \sim IG(1, 1/2), \qquad
        \gamma_k \sim \mathrm{Bernoulli}(\rho), \\
    \sigma_u^2, \sigma_g^2 &\sim IG(A_u, B_u).

Integrating out :math:`b_k`, :math:`v_k \mid \sigma_u \sim \mathrm{Laplace}(0, \sigma_u)` (density
:math:`e^{-|v|/\sigma_u} / (2\sigma_u)`): :math:`1/b_k \sim \mathrm{Exp}(\text{rate } 1/2)`, so the
variance :math:`\sigma_u^2 / b_k` is exponential with rate :math:`1/(2\sigma_u^2)`, the normal scale
mixture of Andrews & Mallows (1974). Hence :math:`u_k = \gamma_k v_k` has the Laplace-zero prior.

Full conditionals (Appendix B; checked here, no typos found). Write :math:`w_i = 1/a_i`,
:math:`W = \mathrm{diag}(w)`, :math:`r = C^T\{y \odot (1 + w)\}`, :math:`G = C^T W C` and
:math:`\tau` the prior precisions (:math:`1/\sigma_\beta^2`, :math:`b_k/\sigma_u^2`,
:math:`1/\sigma_g^2`):

.. math::

    \theta \mid \text{rest} &\sim N(P^{-1} \tilde T r,\, P^{-1}), \quad
        P = \tilde T G \tilde T + \mathrm{diag}(\tau), \quad \tilde T = \mathrm{diag}(\tilde\gamma), \\
    \mathrm{logit}\, P(\gamma_k = 1 \mid \text{rest}) &= \mathrm{logit}\,\rho - \tfrac12 G_{kk} v_k^2
        + v_k r_k - v_k Z_k^T W f_{-k}, \quad f_{-k} = f - Z_k \gamma_k v_k, \\
    b_k \mid \text{rest} &\sim \mathrm{InverseGaussian}(\sigma_u / |v_k|, 1), \\
    \sigma_u^2 \mid \text{rest} &\sim IG(A_u + m/2,\, B_u + \tfrac12 \textstyle\sum_k b_k v_k^2), \quad
    \sigma_g^2 \mid \text{rest} \sim IG(A_u + m_g/2,\, B_u + \tfrac12 \|u_g\|^2), \\
    w_i \mid \text{rest} &\sim \mathrm{InverseGaussian}(1/|1 - y_i f_i|, 1).

(:math:`b_k` has density :math:`\propto b_k^{-3/2}\exp\{-(v_k^2/\sigma_u^2) b_k/2 - 1/(2b_k)\}`,
i.e. :math:`GIG(-1/2, v_k^2/\sigma_u^2, 1)`, the inverse Gaussian with mean :math:`\sigma_u/|v_k|`
and shape 1.) The Gibbs sampler does not draw :math:`\gamma_k` from this conditional: given
:math:`v_k` it sticks (an excluded term's :math:`v_k` is a draw of its prior, rarely a value that
fits, and the other coefficients hold the fit they had with or without term k). It draws each
:math:`\gamma_k` with every coefficient integrated out given w (Gaussian, so closed form:
:meth:`LaplaceZeroModel.collapsed_indicators`), then theta given the new indicators, a partially
collapsed Gibbs sampler (van Dyk & Park 2008). On toenail with ``LaplaceZero(0.1)`` and random
intercepts (4 x 1000 after 1000) this took the bulk ESS of the ``time:terbinafine`` indicator
from 14 to 62; the random effects then move as in the linear model (partially non-centred variance,
shift, levels; the levels of terms with slopes in whitened coordinates; then the common scale
of every coefficient, the selectable ones included, and every variance and covariance:
:meth:`LaplaceZeroModel.random_effect_moves`), and the coefficients in the model by slice moves
with w integrated out (:meth:`LaplaceZeroModel.coefficient_moves`). Nor does it draw
:math:`\sigma_u^2` from the conditional above, which conditions on the excluded terms'
:math:`(v_k, b_k)`, draws of their prior given :math:`\sigma_u^2`: it draws
:math:`\sigma_u^2` with those pairs integrated out and then the pairs from their prior
(:meth:`LaplaceZeroModel.scale_and_excluded_terms`).

The calibrated ``method="vb"`` is expectation propagation with the spike-and-slab factors as
sites (:mod:`vbsvm.inference.ep_selection`), built on the base linear model; this module holds
the paper's mean-field VB (``method="meanfield"``, Algorithm 3) with
:math:`q(\theta) q(\sigma^2) \prod_i q(a_i) \prod_k q(b_k) q(\gamma_k)`:

.. math::

    q(\theta) &= N(\mu, \Sigma), \quad \Sigma^{-1} = G \odot \Omega_{\tilde\gamma} + \mathrm{diag}(E\tau),
        \quad \mu = \Sigma\, \mathrm{diag}(\mu_{\tilde\gamma})\, r, \\
    q(b_k) &= \mathrm{InverseGaussian}\big((E[\sigma_u^{-2}]\,\Omega_{kk})^{-1/2}, 1\big), \\
    q(\gamma_k) &= \mathrm{Bernoulli}(\mathrm{expit}\,\eta_k), \quad
        \eta_k = \mathrm{logit}\,\rho - \tfrac12 G_{kk}\Omega_{kk} + \mu_k r_k
        - \textstyle\sum_{j \ne k} G_{kj}\, \mu_{\tilde\gamma_j}\, \Omega_{jk}, \\
    q(a_i) &= GIG(1/2, 1, \chi_i), \quad \chi_i = E_q[(1 - y_i f_i)^2], \\
    q(\sigma_u^2) &= IG(A_u + m/2,\, B_u + \tfrac12 \textstyle\sum_k E[b_k]\,\Omega_{kk}),

with :math:`\Omega = \Sigma + \mu\mu^T` and
:math:`\Omega_{\tilde\gamma} = \mu_{\tilde\gamma}\mu_{\tilde\gamma}^T + \mathrm{diag}\{\mu_{\tilde\gamma}(1 - \mu_{\tilde\gamma})\}`.
Line 6 of Algorithm 3 is the expression for :math:`\eta_k` with
:math:`Z_k^T(I + W)y\,\mu_k = \mu_k r_k` and the cross terms
:math:`Z_k^T W(X\Omega_{\beta,k} + Z_{-k}\mathrm{diag}(\mu_{\gamma_{-k}})\Omega_{-k,k}) = \sum_{j\ne k} G_{kj}\mu_{\tilde\gamma_j}\Omega_{jk}`;
we evaluate it from :math:`H = G \odot \Omega` and the running vector :math:`H\mu_{\tilde\gamma}`,
updated by one column of :math:`H` after each :math:`\gamma_k` (:math:`O(q)` per k, no
:math:`O(n)` or :math:`O(n m^2)` work inside the loop). The Gram matrix :math:`G` is formed once per
sweep (:math:`O(n q^2)`), and

* :math:`G \odot \Omega_{\tilde\gamma} = D G D + \mathrm{diag}\{G_{kk}\mu_k(1-\mu_k)\}`,
  :math:`D = \mathrm{diag}(\mu_{\tilde\gamma})`, so :math:`q(\theta)` is the Gaussian of the linear model
  with the scaled design :math:`C D` and an extra ridge — the largest grouping factor is again
  eliminated by a Schur complement;
* :math:`E_q[f_i] = c_i^T(\mu_{\tilde\gamma} \odot \mu)` and
  :math:`\mathrm{Var}_q f_i = (c_i \odot \mu_{\tilde\gamma})^T \Sigma (c_i \odot \mu_{\tilde\gamma})
  + \sum_k c_{ik}^2 \mu_{\gamma_k}(1 - \mu_{\gamma_k})\Omega_{kk}` (line 10 of Algorithm 3).

ELBO (all constants, so that fits with different ``rho`` are comparable). Besides the hinge term
(:mod:`vbsvm.models.hinge`), the Gaussian prior terms of ``beta`` and ``u_g``, the entropy of
:math:`q(\theta)` and the inverse-gamma terms, each selectable k contributes

.. math::

    E\log p(v_k \mid b_k, \sigma_u^2) + E\log p(b_k) + H[q(b_k)]
        = -\log 2 - \tfrac12 E\log\sigma_u^2 - \tfrac12 E[\sigma_u^{-2}]\,\mu_{b_k}\Omega_{kk} - \frac{1}{2\mu_{b_k}}

for :math:`q(b_k) = \mathrm{InverseGaussian}(\mu_{b_k}, 1)`: the :math:`E\log b_k` terms cancel
(:math:`\tfrac12 - 2 + \tfrac32 = 0`), as do the :math:`E[1/b_k]` terms, and the normalizer of
:math:`GIG(-1/2, \psi, 1)` is :math:`\tfrac12\log 2\pi - \sqrt\psi`, whose :math:`\tfrac12\log2\pi`
cancels the Gaussian constant of :math:`v_k`. The Bernoulli terms are
:math:`\mu_{\gamma_k}\log(\rho/\mu_{\gamma_k}) + (1-\mu_{\gamma_k})\log\{(1-\rho)/(1-\mu_{\gamma_k})\}`.
At a fixed point this equals the paper's simplified bound (Section 3.2), whose
``log Gamma(A + m/2)`` is a typo for ``log Gamma(A_u + m/2)``; the simplified bound is *not* the
ELBO between updates (it assumes every factor optimal given the others, but q(b) is updated before
q(sigma_u^2)), so we always evaluate the full expression.

The VB state extrapolated by SQUAREM is ``(log chi, log B_q, log mu_b, eta)``: every real vector is
a valid q, so extrapolation is safe. The logits are kept in ``[-ETA_MAX, ETA_MAX]`` (see there).

Local optima and start. Mean-field VB for a spike-and-slab prior has many local optima. The
iterations start with every term in (``mu_gamma = expit(ETA_INIT)``, so the first q(theta) is the
ridge-type fit of the full model) and the prior scale ``E[1/sigma_u^2] = 1``: on spam this start
reached ELBO -2099.3, a start at the prior (``mu_gamma = rho``) only -3712. Different paths (plain
iterations, other SQUAREM step lengths) can end in different optima of similar ELBO (-2094.1 on
spam, one term fewer); compare fits by their ELBO.

Random slopes. A random-effect term with q > 1 columns (``(1 + x | g)``) keeps its
:math:`b_{k,l} \sim N_q(0, \Sigma_k)`, :math:`\Sigma_k \sim IW(\nu, \Psi)` of
:mod:`vbsvm.models.linear`; its coefficients are always included (:math:`\tilde\gamma = 1` there),
so the full conditionals above hold with :math:`\mathrm{diag}(\tau)` completed by
:math:`\Sigma_k^{-1}` on each level's block, and

.. math::

    \Sigma_k \mid \text{rest} \sim IW\big(\Psi + \textstyle\sum_l b_{k,l} b_{k,l}^T,\; \nu + m_k\big),

the conjugate step of the linear model (VB: :math:`E[\Sigma_k^{-1}] = \nu_q\Psi_q^{-1}` in
:math:`q(\theta)`, :math:`q(\Sigma_k) = IW(\Psi + \sum_l E_q[b_l b_l^T], \nu + m_k)` and its ELBO
terms as in :meth:`~vbsvm.models.linear.LinearSVMModel.covariance_elbo`). :math:`q(\theta)` is then
built by :class:`SlopeSelectionPosterior`: the linear model's block Schur elimination applied to
the scaled design :math:`C\,\mathrm{diag}(\mu_{\tilde\gamma})` with the extra ridge above.

Missing predictors (``missing="impute"``, the conditional model of :mod:`vbsvm.models.missing`).
The imputation block :math:`(D_{mis}, m, \Sigma)` is cut from the hinge, so the target is
:math:`p(D_{mis}, m, \Sigma \mid D_{obs}, y)\, p(\theta, \gamma, b, \sigma^2, a \mid y, D_{obs}, D_{mis})`.
Gibbs: the imputation block's full conditionals (:class:`~vbsvm.models.missing.CutImputedSVMModel`),
:math:`1/a \mid u, D` for the new completion, then :data:`~vbsvm.models.missing.CUT_SVM_SWEEPS`
sweeps of the sampler below given the completed design, its add/delete moves and model jumps
included (their proposals fitted over the tuning sweeps' completions; the cut model's
``gibbs_adapt`` and ``gibbs_pool``).
VB: the imputation q first, then this section's Algorithm 3 on completions drawn from it, pooled
by :func:`~vbsvm.inference.pooled.pooled_vb_cut` (inclusion probabilities, :math:`E[b_k]` and
:math:`\chi` averaged, :math:`q(\theta)` and the variances moment-matched).

Mixing of the Gibbs sampler. Single-site updates of the indicators given their coefficients mix
slowly when predictors are correlated (the paper ran 50k + 50k draws). Each sweep therefore adds
to Appendix B, all exact for the same posterior: the collapsed indicator draw above (every
coefficient integrated out given w); the random effects' marginal moves; swaps of correlated
terms (:meth:`LaplaceZeroModel.swap_moves`); add/delete moves of each term with w integrated
out (:meth:`LaplaceZeroModel.flip_moves`, proposals fitted during tuning); and jumps between whole
models that the chains visited in tuning, with w and b integrated out
(:meth:`LaplaceZeroModel.model_jumps`, :mod:`vbsvm.inference.model_jumps`). Check
``fit.diagnostics()`` (rows ``gamma[term]``).
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import stats
from scipy.linalg.blas import dtrmm
from scipy.linalg.lapack import dtrtri
from scipy.special import expit

from ..distributions import LOG_DRAW_RANGE, Bernoulli, InverseGamma, InverseGaussian
from ..exceptions import InputError, InputTypeError
from . import hinge
from ..spd import spd_inverse
from ..inference.model_jumps import ModelJumpTuner
from ..inference.partial_noncentring import ExponentTuner
from .linear import CoefficientPosterior, LinearSVMModel, WorkingGram

__all__ = ["LaplaceZeroModel", "SelectionPosterior", "selection_setup", "selectable_columns"]

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


def _expit(x: float) -> float:
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


class SelectionPosterior(CoefficientPosterior):
    r"""Gaussian ``N(P^{-1} h, P^{-1})`` of theta given the inclusion weights ``s``.

    ``P = D G D + diag(diag(G) s (1 - s)) + diag(tau)`` and ``h = D C^T y(1 + w)`` with
    ``D = diag(s)`` over the dense coordinates (``s = 1`` except for the selectable columns).
    VB passes ``s = E_q[gamma~]``; Gibbs passes the current 0/1 indicators (then the extra ridge
    vanishes and this is the Appendix B full conditional). The moments, covariance blocks and
    sampler are those of :class:`~vbsvm.models.linear.CoefficientPosterior`.
    """

    def __init__(self, model: "LaplaceZeroModel", gram: Gram, s, tau):
        base = model.base
        self.model = base
        self.s = s
        self.C2sel = model.C2sel
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

    def __init__(self, model: "LaplaceZeroModel", gram: Gram, s, tau, blocks=()):
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


class LaplaceZeroModel:
    """Blocks of the linear Bayesian SVM with the Laplace-zero prior (see module docstring).

    Parameters
    ----------
    X : ndarray (n, p)
        Fixed-effect design (standardized).
    y : ndarray (n,)
        Labels in {-1, +1}.
    groups : list of (codes, n_levels, name) or (codes, n_levels, name, Z)
        Random-effect terms (always included), as in
        :class:`~vbsvm.models.linear.LinearSVMModel`: random intercepts with a variance, terms
        with slopes with an inverse-Wishart covariance.
    select : ndarray of bool (p,)
        Columns of ``X`` under the Laplace-zero prior; the others get ``N(0, sigma2_beta)``.
    rho : float
        Prior inclusion probability, in (0, 1).
    sigma2_beta, A, B : float
        Prior hyperparameters.
    re_df, re_scale : float and (q, q) array, optional
        Inverse-Wishart prior of the random-effect covariances (terms with slopes).
    base : LinearSVMModel, optional
        The linear model of the coefficients (built from the arguments above when omitted; the
        imputation model passes the one whose design it completes).
    intercept : int, optional
        Column of ``X`` holding the intercept (always included): with random intercepts the
        Gibbs sweep then trades a common shift between it and the levels.
    """

    def __init__(self, X, y, groups, select, rho, sigma2_beta=1e8, A=0.01, B=0.01, re_df=None, re_scale=None,
                 base=None, intercept=None):
        select = np.asarray(select, dtype=bool)
        if base is None:
            fixed_precision = np.full(X.shape[1], 1.0 / sigma2_beta)
            fixed_precision[select] = np.nan
            base = LinearSVMModel(X, y, groups, fixed_precision, A=A, B=B, re_df=re_df, re_scale=re_scale,
                                  intercept=intercept)
        self.base = base
        self.n, self.q, self.qd = base.n, base.q, base.qd
        self.y = base.y
        self.A, self.B = float(A), float(B)
        self.sel = np.flatnonzero(select)
        self.m = self.sel.size
        if self.m == 0:
            raise ValueError("no selectable columns")
        self.refresh_design()
        # The variance component "sigma2_u" of the base model governs exactly the selectable
        # coordinates; it is the first variance component (the groups follow).
        self.vcomps = base.variance_components
        assert self.vcomps[0].name == "sigma2_u" and np.array_equal(self.vcomps[0].index, self.sel)
        self.sizes = np.array([c.size for c in self.vcomps], dtype=float)
        self.set_rho(rho)
        self.fixed_index = np.concatenate([c.index for c in base.components if c.kind == "fixed"] or [np.zeros(0, int)]).astype(int)
        self.fixed_tau = base.prior_precision(np.ones(len(self.vcomps)))[self.fixed_index]
        self._jumps = ModelJumpTuner(self.m, self.fixed_index.size)
        self.blas_work = self.base.blas_work  # read by the engines (vbsvm.inference.threads)
        #: random slopes or covariance matrices: the general block algebra (SlopeSelectionPosterior)
        self.slopes = bool(base.covariance_components) or bool(base.m_sparse and np.any(base.Zs != 1.0))
        self.covs = base.covariance_components
        # swap proposals: |correlation| between selectable columns (floored, so that every pair
        # can be proposed) and the sign that maps one coefficient onto the other
        corr = np.corrcoef(base.Cd[:, self.sel], rowvar=False) if self.m > 1 else np.ones((1, 1))
        corr = np.nan_to_num(np.atleast_2d(corr))
        self._swap_weight = np.maximum(np.abs(corr), 0.01)
        np.fill_diagonal(self._swap_weight, 0.0)
        self._swap_sign = np.where(corr < 0, -1.0, 1.0)

    def refresh_design(self):
        """Recompute what the model keeps of the design (``C[:, sel]^2`` and the fixed effects'
        cross-products ``X^T X``, the directions of :meth:`coefficient_moves`) after the base
        model's design changed in place (a completion of imputed cells)."""
        self.C2sel = np.ascontiguousarray(self.base.Cd[:, self.sel] ** 2)
        X = self.base.Cd[:, : self.base.p]
        self._cross_products = X.T @ X

    def set_rho(self, rho):
        """Change the prior inclusion probability (used by the ``rho="auto"`` grid)."""
        rho = float(rho)
        if not 0.0 < rho < 1.0:
            raise ValueError("rho must lie in (0, 1)")
        self.rho = rho
        self.logit_rho = math.log(rho) - math.log1p(-rho)
        self.log_rho = math.log(rho)
        self.log_1mrho = math.log1p(-rho)

    # ------------------------------------------------------------------ shared algebra
    def gram(self, w) -> Gram:
        """``C^T W C`` and ``C^T y(1 + w)`` in the dense/sparse split of the base model.

        ``Cd^T W Cd`` is formed as ``Ws^T Ws`` with ``Ws = W^{1/2} Cd`` (numpy then calls the
        symmetric rank-k update, half the flops of a general product).
        """
        base = self.base
        if self.slopes:
            g = WorkingGram(base, w, hinge.working_response(self.y, w))
            Gsd = g.G.reshape(-1, self.qd) if base.m_sparse else np.zeros((0, self.qd))
            return Gram(g.A, g.bd, np.zeros(0), Gsd, g.br.ravel(), working=g)
        sw = np.sqrt(w)
        Ws = base.Cd * sw[:, None]
        Gdd = Ws.T @ Ws
        r = hinge.working_response(self.y, w)
        bd = base.Cd.T @ r
        if base.m_sparse:
            return Gram(Gdd, bd, base.Zt @ w, np.asarray(base.Zt @ (Ws * sw[:, None])), base.Zt @ r)
        return Gram(Gdd, bd, np.zeros(0), np.zeros((0, self.qd)), np.zeros(0))

    def scaling(self, gamma_sel) -> np.ndarray:
        """Dense vector ``s``: 1 for always-included coordinates, ``gamma_sel`` on the selectable ones."""
        s = np.ones(self.qd)
        s[self.sel] = gamma_sel
        return s

    def prior_precision(self, inv_var, b) -> np.ndarray:
        """Prior precisions tau: ``1/sigma2_beta``, ``b_k / sigma_u^2`` and ``1/sigma_g^2``."""
        tau = self.base.prior_precision(inv_var)
        tau[self.sel] *= b
        return tau

    def effective(self, theta, gamma_sel) -> np.ndarray:
        """Coefficients ``gamma~ * theta`` (what enters the score)."""
        u = np.array(theta, dtype=float, copy=True)
        u[self.sel] *= gamma_sel
        return u

    def posterior(self, gram, s, tau, covariance_precisions=()) -> SelectionPosterior:
        """Gaussian of theta given the inclusion weights ``s``, prior precisions ``tau`` and the
        precision matrices of the random-effect covariances."""
        if self.slopes:
            return SlopeSelectionPosterior(self, gram, s, tau, self.base.prior_blocks(covariance_precisions))
        return SelectionPosterior(self, gram, s, tau)

    def variance_posterior(self, sq, sizes=None) -> InverseGamma:
        """IG factor (VB) or full conditional (Gibbs) of every variance, given the sums of squares
        over ``sizes`` coefficients (default: all of each variance's)."""
        sizes = self.sizes if sizes is None else sizes
        return InverseGamma(self.A + sizes / 2.0, self.B + np.asarray(sq) / 2.0)

    # ------------------------------------------------------------------ VB (Algorithm 3)
    def vb_initial_state(self, eta=ETA_INIT):
        """``(log chi, log B_q, log mu_b, eta, IW scales)``: w = 1, E[1/sigma^2] = 1, E[b] = 1,
        gamma ~ 1, E[Sigma_k^{-1}] = I."""
        return np.concatenate([np.zeros(self.n), np.log(self.A + self.sizes / 2.0), np.zeros(self.m),
                               np.full(self.m, float(eta)), self.base.covariance_initial_state()])

    def unpack(self, state):
        n, nv, m = self.n, len(self.vcomps), self.m
        chi = np.exp(state[:n])
        Bq = np.exp(state[n:n + nv])
        mu_b = np.exp(state[n + nv:n + nv + m])
        eta = state[n + nv + m:n + nv + 2 * m]
        return chi, Bq, mu_b, eta, self.base.unpack_covariances(state[n + nv + 2 * m:])

    def vb_sweep(self, state):
        """One pass of Algorithm 3 from ``state``; returns ``(new_state, q, elbo)``.

        Order as in the paper: q(theta) (lines 2-3); for each k, q(b_k) then q(gamma_k)
        (lines 4-8); q(a) (line 10); q(sigma^2) (line 11). Each update maximizes the ELBO in its
        factor given the others, so the ELBO of successive sweeps never decreases.
        """
        chi, Bq, mu_b, eta, q_cov = self.unpack(state)
        Aq = self.A + self.sizes / 2.0
        w = hinge.expected_inverse(chi)
        gram = self.gram(w)
        s = self.scaling(expit(eta))
        tau = self.prior_precision(Aq / Bq, mu_b)
        post = self.posterior(gram, s, tau, [qc.mean_inv() for qc in q_cov])
        mu = post.mean
        dcov = post.diag_cov()
        sel = self.sel
        e_inv_s2u = Aq[0] / Bq[0]
        # lines 4-8
        Sdd = post.cov_dense()
        Odd = Sdd + np.outer(post.mean_dense, post.mean_dense)
        Okk = np.diag(Odd)[sel].copy()
        mu_b_new = 1.0 / np.sqrt(e_inv_s2u * Okk)
        eta_new = self._gamma_sweep(gram, post, Odd, s)
        s_new = self.scaling(expit(eta_new))
        # line 10
        mf, vf = post.score_moments(s_new, sel, Okk)
        chi_new = hinge.update_chi(self.y, mf, vf)
        # line 11 (and the group variances as in Algorithm 2)
        sq = [float(np.sum(mu_b_new * Okk))]
        sq += [float(np.sum(mu[c.index] ** 2 + dcov[c.index])) for c in self.vcomps[1:]]
        q_var = self.variance_posterior(sq)
        scatters, q_cov = self.base.vb_covariances(post, mu)  # the IW step of Algorithm 2
        q = {"theta": post, "theta_mean": mu, "theta_var": dcov, "Okk": Okk, "mu_b": mu_b_new,
             "eta": eta_new, "gamma": expit(eta_new), "chi": chi_new, "variances": q_var,
             "covariances": q_cov, "scatters": scatters, "mean_f": mf, "var_f": vf}
        parts = [np.log(chi_new), np.log(q_var.b), np.log(mu_b_new), eta_new, self.base.pack_covariances(q_cov)]
        return np.concatenate(parts), q, self.elbo(q)

    def _gamma_sweep(self, gram, post, Odd, s, eta_max=None):
        """Lines 4-8 of Algorithm 3: sequential q(gamma_k) updates, O(q) each.

        ``eta_k = logit(rho) - G_kk Omega_kk / 2 + mu_k r_k - sum_{j != k} G_kj s_j Omega_jk
        - (sparse-factor term)``; the sum is kept in ``t = (G * Omega) s`` and updated by one
        column after each k.
        """
        sel = self.sel
        base = self.base
        H = gram.Gdd * Odd
        t = H @ s
        if base.m_sparse:
            # sum over levels l of the largest factor: G_{l,k} Omega_{l,k} (these are always in)
            Sds = post.cov_dense_sparse()  # (qd, m_s)
            cross = np.einsum("lk,kl->k", gram.Gsd, Sds) + post.mean_dense * (gram.Gsd.T @ post.mean_sparse)
        else:
            cross = np.zeros(self.qd)
        mu_d = post.mean_dense
        const = (self.logit_rho - 0.5 * np.diag(H) + mu_d * gram.bd - cross)[sel].tolist()
        Hkk = np.diag(H)[sel].tolist()
        s = s.copy()
        eta = np.empty(self.m)
        for i, k in enumerate(sel.tolist()):
            e = const[i] - (t[k] - Hkk[i] * s[k])
            e = ETA_MAX if e > ETA_MAX else (-ETA_MAX if e < -ETA_MAX else e)
            new = _expit(e)
            delta = new - s[k]
            if delta != 0.0:
                t += H[:, k] * delta
                s[k] = new
            eta[i] = e
        return eta

    def elbo(self, q) -> float:
        """Full evidence lower bound (all constants) of a complete q (see module docstring)."""
        post = q["theta"]
        mu, dcov = q["theta_mean"], q["theta_var"]
        value = hinge.elbo(self.y, q["mean_f"], q["var_f"], q["chi"])
        qv = q["variances"]
        e_inv, e_log = np.atleast_1d(qv.mean_inv()), np.atleast_1d(qv.mean_log())
        # always-included fixed effects: N(0, 1/tau) with known tau
        fi, ft = self.fixed_index, self.fixed_tau
        value += float(np.sum(-0.5 * LOG_2PI + 0.5 * np.log(ft) - 0.5 * ft * (mu[fi] ** 2 + dcov[fi])))
        # random intercepts: N(0, sigma_g^2)
        for c, ei, el in zip(self.vcomps[1:], e_inv[1:], e_log[1:]):
            value += float(np.sum(-0.5 * LOG_2PI - 0.5 * el - 0.5 * ei * (mu[c.index] ** 2 + dcov[c.index])))
        # selectable: v_k | b_k, sigma_u^2 and b_k, with q(b_k) inverse Gaussian
        mu_b = q["mu_b"]
        value += float(np.sum(-LOG_2 - 0.5 * e_log[0] - 0.5 * e_inv[0] * mu_b * q["Okk"] - 0.5 / mu_b))
        # entropy of q(theta)
        value += 0.5 * self.q * (1.0 + LOG_2PI) + 0.5 * post.logdet_cov()
        # variances
        value += float(np.sum(InverseGamma(self.A, self.B).expected_logpdf(qv) + qv.entropy()))
        # gamma: E log p(gamma) + H[q(gamma)]
        q_gamma = Bernoulli.from_logit(q["eta"])
        g = q_gamma.p
        value += float(np.sum(g * self.log_rho + (1.0 - g) * self.log_1mrho + q_gamma.entropy()))
        return value + self.base.covariance_elbo(q.get("covariances", ()), q.get("scatters", ()))

    # ------------------------------------------------------------------ Gibbs (Appendix B)
    def gibbs_initial_state(self, rng):
        return {"w": np.ones(self.n), "gamma": np.ones(self.m), "b": np.ones(self.m),
                "sigma2": np.ones(len(self.vcomps)), "Lam": [np.eye(c.index.shape[1]) for c in self.covs],
                "flip_on": np.array(0.0), "flip_n": np.array(0.0), "flip_sum": np.zeros(self.m),
                "flip_sq": np.zeros(self.m), "flip_loc": np.zeros(self.m), "flip_scale": np.ones(self.m),
                "flip_cmean": np.zeros(self.m), "flip_cvar": np.ones(self.m),
                "flip_coupling": np.zeros((self.m, self.qd)), "flip_csum": np.zeros((self.m, self.qd)),
                "flip_shift": np.zeros((self.m, self.qd)), **self._jumps.initial_state(),
                **(self.base._exponents.initial_state() if self.base._levels else {})}

    def collapsed_indicators(self, gram, gamma_sel, tau, covariance_precisions=(), rng=None):
        r"""Draw the indicators one at a time with every coefficient integrated out given w.

        Given w the working likelihood is Gaussian in theta, so for an active set ``A`` of dense
        coordinates (the always-included ones and the selected terms; the random effects are
        eliminated by the Schur complement, which does not depend on gamma)

        .. math::

            p(\gamma \mid w, b, \sigma^2) \propto \rho^{|\gamma|}(1 - \rho)^{m - |\gamma|}
                \prod_{k \in A} \tau_k^{1/2}\, |R_{AA}|^{-1/2} \exp(\tfrac12 h_A^T R_{AA}^{-1} h_A),

        with ``R`` and ``h`` the reduced precision and vector of the full model (every term in;
        :class:`SelectionPosterior` with ``s = 1``). Adding k to ``A`` multiplies it by
        ``sqrt(tau_k / s_k) exp(c_k^2 / (2 s_k))``, ``s_k = R_kk - R_kA R_AA^{-1} R_Ak``,
        ``c_k = h_k - R_kA R_AA^{-1} h_A``, or from ``R_AA^{-1}`` when k is in ``A``
        (``s_k = 1 / [R_AA^{-1}]_kk``); ``R_AA^{-1}`` is inverted once per sweep and then kept by
        rank-one block updates when an indicator flips (``O(q_d^2)`` per k).
        Unlike a draw of ``gamma_k`` given the coefficients, the other coefficients do not hold
        the fit they had with or without term k, so correlated terms can enter and leave.
        theta must be drawn given the new indicators right after (partially collapsed Gibbs).

        Returns
        -------
        IndicatorDraw
            ``gamma``; ``logits``, the conditional logits used (with ``rng=None`` nothing is drawn:
            the logits of every k given the current others); ``mean``, ``var``, the conditional
            moments of each term's coefficient as if included and ``coupling``, the regression of
            the other active coefficients on it (what :meth:`gibbs_adapt` fits the add/delete
            proposals of :meth:`flip_moves` to).
        """
        qd = self.qd
        full = self.posterior(gram, np.ones(qd), tau, covariance_precisions)
        R = full.L @ full.L.T
        h = R @ full.mean_dense
        gam = np.asarray(gamma_sel, dtype=float).copy()
        active = np.ones(qd, dtype=bool)
        active[self.sel] = gam == 1.0
        # M: R_AA^{-1} embedded in q_d x q_d (zero outside A), kept by rank-one block updates
        M = np.zeros((qd, qd))
        A = np.flatnonzero(active)
        if A.size:
            M[np.ix_(A, A)] = spd_inverse(R[np.ix_(A, A)])
        Mh = M @ h
        thresholds = None
        if rng is not None:
            u = rng.random(self.m)
            thresholds = np.log(u) - np.log1p(-u)
        logits, cmean, cvar = np.empty(self.m), np.empty(self.m), np.empty(self.m)
        coupling = np.zeros((self.m, qd))
        for i, k in enumerate(self.sel.tolist()):
            if active[k]:  # the Schur complement of k in R_AA is 1 / [R_AA^{-1}]_kk
                s_k = 1.0 / M[k, k]
                c_k = Mh[k] * s_k
                coupling[i] = -M[:, k] * s_k  # R_{A-k}^{-1} R_{A-k,k} from the block inverse
                coupling[i, k] = 0.0
            else:
                u = M @ R[:, k]
                s_k = R[k, k] - R[:, k] @ u
                c_k = h[k] - u @ h
                coupling[i] = u
            logits[i] = self.logit_rho + 0.5 * (math.log(tau[k]) - math.log(s_k)) + 0.5 * c_k * c_k / s_k
            cmean[i], cvar[i] = c_k / s_k, 1.0 / s_k
            if thresholds is None:
                continue
            new = logits[i] > thresholds[i]
            if new and not active[k]:  # add k: block inverse with the new row and column
                M += np.outer(u, u) / s_k
                M[k, :] = M[:, k] = -u / s_k
                M[k, k] = 1.0 / s_k
            elif active[k] and not new:  # remove k
                M -= np.outer(M[:, k], M[k, :]) / M[k, k]
                M[k, :] = M[:, k] = 0.0
            else:
                continue
            active[k] = new
            gam[i] = float(new)
            Mh = M @ h
        return IndicatorDraw(gam, logits, cmean, cvar, coupling)

    def random_effect_moves(self, theta, gamma, sigma2, covariance_precisions, rng, exponents=None):
        """The linear model's marginal moves of the random effects (augmentation weights
        integrated out; :meth:`~vbsvm.models.linear.LinearSVMModel.marginal_moves`): each
        random-intercept variance non-centred (partially, with ``exponents[k]`` where given), the
        intercept-versus-levels shift and the levels,
        :attr:`~vbsvm.models.linear.LinearSVMModel.level_rounds` times; then the levels of the
        terms with slopes given their covariances (the inverses of ``covariance_precisions``;
        :meth:`~vbsvm.models.linear.LinearSVMModel._redraw_slope_levels`). Up to there they
        touch the intercept, the levels and their variances only, never a selectable coefficient,
        so the Laplace-zero part of the posterior plays no role in them. Last, the
        common scale of every coefficient (the selectable terms' ``v``, included or not), variance
        (``sigma_u^2`` too) and covariance
        (:meth:`~vbsvm.models.linear.LinearSVMModel._rescale_everything`): given its mixing
        variable ``b_k`` a term's prior is ``N(v_k; 0, sigma_u^2 / b_k)``, invariant along the
        orbit up to the Jacobian like any variance-governed coefficient, and the indicators and
        b stay put. Without random effects only the score is computed. Returns
        ``(theta, f, sigma2)``; the variances are drawn again (conjugate, centred) later in the
        sweep, which interweaves the two parameterizations as in the linear model. w must be
        drawn afresh after them."""
        base = self.base
        u = self.effective(theta, gamma)
        f = base.predictor(u)
        if not base.random_effects:
            return theta, f, sigma2
        sigma2 = np.array(sigma2, dtype=float, copy=True)
        for _ in range(base.level_rounds if base._shiftable else 0):
            for k, _index in base._shiftable:
                u, f, sigma2 = base._rescale_variance(k, u, f, sigma2, rng, (exponents or {}).get(k))
            u = base._shift_location(u, sigma2, rng)
            u, f = base._redraw_levels(u, base.predictor(u), sigma2, rng)
        covariances = [spd_inverse(P) for P in covariance_precisions]
        if covariances:
            u, f = base._redraw_slope_levels(u, f, covariances, rng)
        theta = np.array(theta, dtype=float, copy=True)
        keep = np.ones(self.q, dtype=bool)
        keep[self.sel] = False
        theta[keep] = u[keep]
        theta, f, sigma2 = base._rescale_everything(theta, f, sigma2, covariances, rng)
        return theta, f, sigma2

    def coefficient_moves(self, theta, gamma, b, sigma2, f, rng):
        """Marginal (augmentation weights integrated out) slice moves of the coefficients in the
        model (the always-included fixed effects and the selected terms) given the indicators,
        the mixing variables b and the variances, whose prior on them is Gaussian with
        precisions :meth:`prior_precision` (the linear model's
        :meth:`~vbsvm.models.linear.LinearSVMModel._redraw_fixed_effects`), along the principal
        axes of the active columns' cross-products ``X_A^T X_A`` (which depend on the design and
        the indicators only, not on w). The excluded terms' coefficients do not enter the
        scores; their full conditional is the prior, drawn with theta | w. Without this move the
        coefficients in the model change only by their draw given w, which pins them to the fit
        w holds. Toenail with ``LaplaceZero(0.1)`` and ``(1 | patient_id)``, 4 x 1000 after 1000,
        seeds 1 and 4: min bulk ESS 114 and 121 without the move (``beta[time:terbinafine]``;
        max R-hat 1.057, 1.044), 138 and 123 with it along the coordinate axes (1.022, 1.037),
        164 and 183 along the principal axes (1.032, 1.018).
        Returns ``(theta, f)``; w must be drawn afresh after it."""
        base = self.base
        active = np.ones(base.p, dtype=bool)
        active[self.sel] = gamma == 1.0
        index = np.flatnonzero(active)
        if index.size == 0:
            return theta, f
        # principal axes of the active columns' cross-products (what makes their coefficients
        # correlated: a main effect and its interaction), each scaled by 1 / sqrt(eigenvalue)
        evals, evecs = np.linalg.eigh(self._cross_products[np.ix_(index, index)])
        directions = np.zeros((base.p, index.size))
        directions[index] = evecs / np.sqrt(np.maximum(evals, 1e-12 * max(evals.max(), 1e-300)))
        tau = self.prior_precision(1.0 / np.asarray(sigma2), b)[: base.p]
        u, f = base._redraw_fixed_effects(self.effective(theta, gamma), f, sigma2, rng, directions, tau=tau)
        theta = np.array(theta, dtype=float, copy=True)
        theta[index] = u[index]
        return theta, f

    def swap_moves(self, theta, gamma, b, f, rng):
        """Metropolis-Hastings swaps of a term in the model with one out of it, on the marginal
        pseudo-posterior (augmentation weights integrated out); ``m`` proposals.

        A proposal picks an included term j uniformly and an excluded k with probability
        proportional to ``|corr(x_j, x_k)|`` (floored at 0.01), and exchanges the pairs
        ``(gamma, v, b)`` of j and k, with ``v`` multiplied by ``s = sign corr(x_j, x_k)``: the new
        effective coefficient of k is ``s v_j``. The exchange is an involution that leaves the
        prior invariant (the ``(v_k, b_k)`` are iid, symmetric in sign, the ``gamma_k`` iid), so the
        acceptance ratio is the pseudo-likelihood ratio times the proposal ratio
        ``sum_{l out} w_jl / sum_{l out'} w_kl``. Single-site indicator updates cannot make this move
        in one step when two predictors are correlated (dropping one first costs fit). Returns the
        new ``(theta, gamma, b, f)``; w must be drawn afresh after it.
        """
        if self.m < 2:
            return theta, gamma, b, f
        theta, gamma, b = theta.copy(), gamma.copy(), b.copy()
        W, X = self._swap_weight, self.base.Cd
        hinge_sum = float(np.maximum(0.0, 1.0 - self.y * f).sum())
        for _ in range(self.m):
            inc, out = np.flatnonzero(gamma == 1.0), np.flatnonzero(gamma == 0.0)
            if inc.size == 0 or out.size == 0:
                break
            j = inc[rng.integers(inc.size)]
            wj = W[j, out]
            k = out[min(np.searchsorted(np.cumsum(wj), rng.random() * wj.sum()), out.size - 1)]
            s = self._swap_sign[j, k]
            jj, kk = self.sel[j], self.sel[k]
            f_new = f + (s * X[:, kk] - X[:, jj]) * theta[jj]
            new_sum = float(np.maximum(0.0, 1.0 - self.y * f_new).sum())
            out_rev = np.where(out == k, j, out)
            log_ratio = -2.0 * (new_sum - hinge_sum) + math.log(wj.sum()) - math.log(W[k, out_rev].sum())
            if math.log(rng.random()) < log_ratio:
                theta[jj], theta[kk] = s * theta[kk], s * theta[jj]
                gamma[j], gamma[k] = gamma[k], gamma[j]
                b[j], b[k] = b[k], b[j]
                f, hinge_sum = f_new, new_sum
        return theta, gamma, b, f

    def scale_and_excluded_terms(self, theta, gamma, sigma2_u, rng):
        """The mixing variables b of the included terms from ``b_k | v_k, sigma_u``
        (:meth:`mixing_conditional`), then ``sigma_u^2`` jointly with the excluded terms'
        ``(v_k, b_k)``, and the other variances given their coefficients (conjugate). An
        excluded term's pair enters nothing but its prior, so integrating it out leaves
        ``sigma_u^2 | rest ~ IG(A + m_in/2, B + sum_{k in} b_k v_k^2 / 2)`` over the ``m_in``
        included terms; the excluded pairs are then drawn from their prior given the new
        ``sigma_u`` (``1/b_k ~ Exp(rate 1/2)``, ``v_k | b_k ~ N(0, sigma_u^2 / b_k)``). Drawn given
        every pair instead, ``sigma_u^2`` is held by the excluded terms' prior draws, which were
        themselves drawn given it. Returns ``(theta, b, sigma2)``."""
        theta = np.array(theta, dtype=float, copy=True)
        included = gamma == 1.0
        v = theta[self.sel]
        b = np.empty(self.m)
        b[included] = self.mixing_conditional(v[included], sigma2_u).sample(rng)
        sq = np.array([float(np.sum(b[included] * v[included] ** 2))]
                      + [float(np.sum(theta[c.index] ** 2)) for c in self.vcomps[1:]])
        sizes = self.sizes.copy()
        sizes[0] = included.sum()
        sigma2 = np.atleast_1d(self.variance_posterior(sq, sizes).sample(rng))
        out = np.flatnonzero(~included)
        b[out] = 0.5 / rng.standard_exponential(out.size)
        theta[self.sel[out]] = np.sqrt(sigma2[0] / b[out]) * rng.standard_normal(out.size)
        return theta, b, sigma2

    def mixing_conditional(self, v, sigma2_u) -> InverseGaussian:
        """Full conditional of the Laplace mixing variables, ``b_k | v_k, sigma_u ~
        InverseGaussian(sigma_u / |v_k|, 1)`` (prior ``b_k ~ IG(1, 1/2)``, ``v_k | b_k ~
        N(0, sigma_u^2 / b_k)``; see the module docstring)."""
        return InverseGaussian(math.sqrt(sigma2_u) / np.maximum(np.abs(v), 1e-300), 1.0)

    #: the add/delete proposals are fitted over the first half of tuning, if it has this many sweeps
    FLIP_MIN_SWEEPS = 25
    #: degrees of freedom and scale inflation of the t proposal of an added term's coefficient
    FLIP_DF, FLIP_INFLATE = 5.0, 1.5

    def gibbs_adapt(self, state, it, tune):
        """Called by the engine after each tuning sweep (never after tuning): over the first half
        of tuning, collect the moments of each coefficient's conditional as if included (from
        :meth:`collapsed_indicators`), then fix the add/delete proposals of :meth:`flip_moves`
        (a t with their mixture's mean and an inflated sd) and switch the move on; and fit the
        exponents of the random-intercept variances' partially non-centred move as the linear
        model does (:meth:`~vbsvm.models.linear.LinearSVMModel.gibbs_adapt`)."""
        state = self.base.adapt_level_exponents(state, it, tune)
        theta = state["theta"]
        state = self._jumps.record(state, it, tune, state["gamma"], theta[self.fixed_index], theta[self.sel],
                                   math.log(state["sigma2"][0]))
        half = tune // 2
        if it >= half or half < self.FLIP_MIN_SWEEPS or "flip_n" not in state:
            return state
        state = dict(state)
        state["flip_n"] = state["flip_n"] + 1.0
        state["flip_sum"] = state["flip_sum"] + state["flip_cmean"]
        state["flip_sq"] = state["flip_sq"] + state["flip_cmean"] ** 2 + state["flip_cvar"]
        state["flip_csum"] = state["flip_csum"] + state["flip_coupling"]
        if it == half - 1:
            n = float(state["flip_n"])
            loc = state["flip_sum"] / n
            shift = state["flip_csum"] / n
            shift[:, self.base.p:] = 0.0  # only fixed effects and selectable terms are shifted
            state.update(flip_loc=loc, flip_on=np.array(1.0), flip_shift=shift,
                         flip_scale=self.FLIP_INFLATE * np.sqrt(np.maximum(state["flip_sq"] / n - loc ** 2, 1e-12)))
        return state

    def gibbs_pool(self, states):
        """Called by the engine once every chain has tuned: one list of models to jump between
        (:meth:`model_jumps`) for all chains, fitted from all their tuning sweeps
        (:meth:`~vbsvm.inference.model_jumps.ModelJumpTuner.pool`)."""
        return self._jumps.pool(states)

    def flip_moves(self, theta, gamma, b, sigma2, f, flips, rng):
        r"""Metropolis-Hastings add/delete of every selectable term on the marginal
        pseudo-posterior (augmentation weights integrated out); ``m`` proposals in random order.

        An excluded term k proposes ``gamma_k = 1`` with ``v_k`` from a t proposal ``q_k`` and
        shifts the other active fixed effects and terms by ``-c_k v_k``, where ``c_k`` is their
        average regression on k (so that, e.g., a main effect gives up what its interaction
        takes over); an included term proposes ``gamma_k = 0``, shifts them back by ``+c_k v_k``
        and draws ``v_k`` from its prior ``N(0, sigma_u^2 / b_k)`` (its full conditional when
        out). ``q_k`` and ``c_k`` are fitted during tuning (:meth:`gibbs_adapt`) and fixed
        afterwards, so that the move uses no w; ``c_k`` is used on the coordinates active
        besides k, which the move does not change. Adding and deleting are each other's reverse,
        the shift has unit Jacobian, and the ratio for deleting is

        .. math::

            \frac{L(f')}{L(f)}\,\frac{p(\theta'_A)}{p(\theta_A)}\,\frac{1 - \rho}{\rho}\,
            \frac{q_k(v_k)}{N(v_k; 0, \sigma_u^2 / b_k)}, \qquad L(f) = e^{-2\sum_i (1 - y_i f_i)_+}

        with ``p(theta_A)`` the Gaussian prior of the shifted coefficients (the prior density of
        the new ``v_k`` cancels with its proposal; adding is the inverse). Given w the collapsed
        indicator draw (:meth:`collapsed_indicators`) already integrates the coefficients out,
        but w itself holds the fit with or without the term; this move does not condition on w.
        Returns ``(theta, gamma, f)``; w must be drawn afresh after it.
        """
        theta, gamma = theta.copy(), gamma.copy()
        X, y, sel, p = self.base.Cd, self.y, self.sel, self.base.p
        loc, scale, shift = flips["flip_loc"], flips["flip_scale"], flips["flip_shift"]
        tau = self.prior_precision(1.0 / np.asarray(sigma2), b)[:p]
        prior_sd = np.sqrt(sigma2[0] / b)
        v_in = loc + scale * rng.standard_t(self.FLIP_DF, self.m)  # used where gamma_k = 0
        v_out = prior_sd * rng.standard_normal(self.m)  # used where gamma_k = 1
        log_u = np.log(rng.random(self.m))
        v = np.where(gamma == 1.0, theta[sel], v_in)  # the coefficient of the included state
        # the deletion's ratio besides L and the shifted coefficients' prior (adding: its inverse)
        log_delete = self.flip_proposal_log_ratio(v, loc, scale, prior_sd) + self.log_1mrho - self.log_rho
        active = np.ones(p, dtype=bool)
        hinge_sum = float(np.maximum(0.0, 1.0 - y * f).sum())
        for i in rng.permutation(self.m).tolist():
            k = sel[i]
            active[sel] = gamma == 1.0
            active[k] = False
            c = np.where(active, shift[i, :p], 0.0)
            sign = 1.0 if gamma[i] == 1.0 else -1.0  # +1: delete, -1: add
            old = theta[:p]
            delta = sign * v[i] * c  # deleting adds c v_k back, adding takes c v_k off
            new = old + delta
            f_new = f + X[:, :p] @ delta - sign * X[:, k] * v[i]
            new_sum = float(np.maximum(0.0, 1.0 - y * f_new).sum())
            log_prior = -0.5 * float(np.sum(tau * (new * new - old * old)))
            if log_u[i] < -2.0 * (new_sum - hinge_sum) + log_prior + sign * log_delete[i]:
                theta[:p] = new
                theta[k] = v_out[i] if sign > 0 else v_in[i]
                gamma[i], f, hinge_sum = 1.0 - gamma[i], f_new, new_sum
        return theta, gamma, f

    def flip_proposal_log_ratio(self, v, loc, scale, prior_sd):
        """``log q_k(v) - log N(v; 0, prior_sd)``: the t proposal of an added coefficient against
        its prior (see :meth:`flip_moves`)."""
        return stats.t.logpdf(v, self.FLIP_DF, loc=loc, scale=scale) - stats.norm.logpdf(v, scale=prior_sd)

    #: model jumps proposed per sweep (:meth:`model_jumps`)
    JUMPS_PER_SWEEP = 6

    def model_jumps(self, theta, gamma, sigma2, f, jumps, rng):
        r"""Metropolis-Hastings jumps between the models of the chain's list
        (:class:`~vbsvm.inference.model_jumps.ModelJumpTuner`); ``JUMPS_PER_SWEEP`` proposals.

        The single-term moves (collapsed indicators, swaps, add/delete) leave a model one term
        at a time. Where two groups of terms describe the data about equally well (e.g.
        breast_cancer's mean and worst measurements of the same nuclei), each group with its own
        scale ``sigma_u``, the path between them passes through models far less probable than
        either, and a chain stays in one group for hundreds of sweeps. A jump moves the whole
        model at once: from a model ``M`` of the list it proposes another one ``M'`` of the list
        uniformly and draws ``x' = (beta_fixed, v_{A'}, eta)`` (the always-included fixed
        effects, the coefficients of the terms in ``M'``, ``eta = log sigma_u^2``) from ``M'``'s
        t proposal ``q_{M'}``. The target is the pseudo-posterior with the augmentation
        weights, the mixing variables b (so each term's prior is the Laplace density
        :math:`e^{-|v|/\sigma_u}/(2\sigma_u)`) and the excluded terms' ``(v, b)`` integrated
        out:

        .. math::

            \pi(x, M) \propto e^{-2\sum_i (1 - y_i f_i)_+}\, N(\beta_{fixed}; 0, \tau^{-1})
            \prod_{k \in A} \frac{e^{-|v_k|/\sigma_u}}{2\sigma_u}\,
            \rho^{|A|}(1 - \rho)^{m - |A|}\, e^{-A_u\eta - B_u e^{-\eta}},

        (the last factor is the ``IG(A_u, B_u)`` prior of ``sigma_u^2`` in ``eta``, Jacobian
        included), and the acceptance ratio is
        :math:`\pi(x', M')\, q_M(x) / \{\pi(x, M)\, q_{M'}(x')\}`: the choice of ``M'`` is
        symmetric, and a state outside the list proposes nothing (its reverse move could not be
        proposed). The caller must then draw what was integrated out from its conditional
        before anything else uses it: w given the scores, b given the coefficients and
        ``sigma_u`` (then ``sigma_u^2`` and the excluded pairs, as always:
        :meth:`scale_and_excluded_terms`). The random effects and other variances are not
        moved. Returns ``(theta, gamma, sigma2, f)``.

        breast_cancer with ``LaplaceZero(rho=0.01)``, 4 x 2000 after 1000: max R-hat over the
        indicators with a posterior mean in (0.01, 0.99) 1.34 without the jumps (seed 1); see
        the README for the measurements with them.
        """
        tuner, models = self._jumps, jumps["jump_models"]
        n_models = models.shape[0]
        theta, sigma2 = theta.copy(), np.array(sigma2, dtype=float, copy=True)
        X, fixed, sel, nf = self.base.Cd, self.fixed_index, self.sel, self.fixed_index.size
        for _ in range(self.JUMPS_PER_SWEEP):
            match = np.flatnonzero((models == gamma).all(axis=1))
            if match.size == 0:
                break
            k = int(match[0])
            k_new = int(rng.integers(n_models - 1))
            k_new += k_new >= k
            gamma_new = models[k_new]
            x = tuner.coordinates(theta[fixed], theta[sel], gamma, math.log(sigma2[0]))
            x_new = tuner.sample(jumps, k_new, rng)
            old_cols, new_cols = sel[gamma == 1.0], sel[gamma_new == 1.0]
            f_new = (f + X[:, fixed] @ (x_new[:nf] - x[:nf]) + X[:, new_cols] @ x_new[nf:-1]
                     - X[:, old_cols] @ x[nf:-1])
            log_ratio = (self._jump_log_target(x_new, f_new) - self._jump_log_target(x, f)
                         + tuner.log_density(jumps, k, x) - tuner.log_density(jumps, k_new, x_new))
            if math.log(rng.random()) < log_ratio:
                theta[fixed], theta[new_cols] = x_new[:nf], x_new[nf:-1]
                gamma, f, sigma2[0] = gamma_new.copy(), f_new, math.exp(x_new[-1])
        return theta, gamma, sigma2, f

    def _jump_log_target(self, x, f) -> float:
        """``log pi(x, M)`` of :meth:`model_jumps` (up to a constant), ``x = (beta_fixed, v_A,
        eta)`` and ``f`` the scores."""
        nf = self.fixed_index.size
        beta, v, eta = x[:nf], x[nf:-1], x[-1]
        if not LOG_DRAW_RANGE[0] <= eta <= LOG_DRAW_RANGE[1]:
            # sigma_u^2 outside the range its draws take (vbsvm.distributions.DRAW_RANGE): rejected,
            # and exp(-eta) would overflow
            return -math.inf
        k = v.size
        return float(-2.0 * np.maximum(0.0, 1.0 - self.y * f).sum() - 0.5 * np.sum(self.fixed_tau * beta * beta)
                     - k * (LOG_2 + 0.5 * eta) - np.abs(v).sum() * math.exp(-0.5 * eta)
                     + k * self.log_rho + (self.m - k) * self.log_1mrho - self.A * eta - self.B * math.exp(-eta))

    def gibbs_sweep(self, state, rng):
        """gamma_k | w, rest one at a time with theta integrated out (:meth:`collapsed_indicators`);
        theta | gamma, w, rest; the random effects' marginal moves
        (:meth:`random_effect_moves`); swaps of correlated terms (marginal, see
        :meth:`swap_moves`); add/delete of each term (marginal, after tuning's first half, see
        :meth:`flip_moves`); jumps between listed models (after tuning, see :meth:`model_jumps`);
        w | f; the included terms' b | v, sigma_u; then sigma_u^2 with the excluded terms'
        (v, b) and the other variances (:meth:`scale_and_excluded_terms`)."""
        gram = self.gram(state["w"])
        tau = self.prior_precision(1.0 / state["sigma2"], state["b"])
        Lam = state.get("Lam", ())
        draw = self.collapsed_indicators(gram, state["gamma"], tau, Lam, rng)
        gamma = draw.gamma
        theta = self.posterior(gram, self.scaling(gamma), tau, Lam).sample(rng)
        theta, f, sigma2 = self.random_effect_moves(theta, gamma, state["sigma2"], Lam, rng,
                                                    self.base._level_exponents(state))
        theta, f = self.coefficient_moves(theta, gamma, state["b"], sigma2, f, rng)
        theta, gamma, b, f = self.swap_moves(theta, gamma, np.asarray(state["b"], dtype=float), f, rng)
        flips = {k: v for k, v in state.items() if k.startswith("flip_")}
        if flips and flips["flip_on"]:
            theta, gamma, f = self.flip_moves(theta, gamma, b, sigma2, f, flips, rng)
        jumps = ModelJumpTuner.carry(state)
        if jumps and jumps["jump_models"].shape[0]:
            theta, gamma, sigma2, f = self.model_jumps(theta, gamma, sigma2, f, jumps, rng)
        u = self.effective(theta, gamma)
        w = hinge.sample_inverse(self.y, f, rng)
        theta, b, sigma2 = self.scale_and_excluded_terms(theta, gamma, sigma2[0], rng)
        # Sigma_k | b ~ IW(scale + sum_l b_l b_l^T, df + m) (the conjugate step of the linear model)
        Sigmas = [qc.sample(rng) for qc in self.base.covariance_posteriors(self.base.scatter_matrices(theta))]
        if flips:
            flips.update(flip_cmean=draw.mean, flip_cvar=draw.var, flip_coupling=draw.coupling)
        return {"w": w, "gamma": gamma, "b": b, "sigma2": sigma2, "theta": theta, "u": u,
                "Lam": [spd_inverse(S) for S in Sigmas],
                "cov": np.concatenate([S.ravel() for S in Sigmas]) if Sigmas else np.zeros(0),
                "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum(), **flips, **jumps,
                **ExponentTuner.carry(state)}


def selection_setup(design, settings, prior):
    """Check a Laplace-zero fit's arguments; returns the selectable columns and ``rho`` (a number,
    or ``"auto"``).

    Raises
    ------
    vbsvm.exceptions.InputError, vbsvm.exceptions.InputTypeError
        For a prior that is not a :class:`~vbsvm.LaplaceZero`, ``method="map"``, a ``penalty``
        other than the default, unknown ``keep`` terms, nothing left to select, or
        ``rho="auto"`` with ``missing="impute"``.
    """
    from ..priors import LaplaceZero

    if not isinstance(prior, LaplaceZero):
        raise InputTypeError(
            f"prior must be a vbsvm.LaplaceZero(...) (the only sparse prior so far), got {type(prior).__name__}."
        )
    method = settings["method"]
    if method not in ("vb", "gibbs"):
        raise InputError(
            f"method={method!r} is not available with prior=LaplaceZero(...): the posterior mode of a "
            "spike-and-slab prior is degenerate. Use method='vb' or method='gibbs'."
        )
    if settings.get("penalty", "auto") != "auto":
        raise InputError(
            f"penalty={settings['penalty']!r} cannot be combined with prior=LaplaceZero(...): the "
            "Laplace slab (scale inferred) replaces the ridge penalty. Leave penalty at its default."
        )
    select = selectable_columns(design, prior.keep)
    m = int(select.sum())
    if m == 0:
        raise InputError(
            "prior=LaplaceZero(...) has nothing to select: every fixed effect is the intercept or "
            "listed in keep. Remove terms from keep or add predictors to the formula."
        )
    rho = prior.resolve_rho(m)
    if rho == "auto" and settings.get("missing") == "impute":
        raise InputError("LaplaceZero(rho='auto') is not available with missing='impute' (the ELBO grid would "
                         "need pooled fits per rho); give rho a number, e.g. LaplaceZero(rho=0.1), or "
                         "expected_size=k.")
    return select, rho


def selectable_columns(design, keep) -> np.ndarray:
    """Boolean mask of the design columns under the Laplace-zero prior.

    Every non-intercept fixed effect, except the ``keep`` entries (column names, or formula terms
    whose columns are all kept).

    Raises
    ------
    vbsvm.exceptions.InputError
        Naming ``keep`` when an entry is neither a column nor a term of the formula.
    """
    names = list(design.column_names)
    select = np.asarray(design.penalized, dtype=bool).copy()
    terms = {}
    try:
        for term, sl in design.spec.term_slices.items():
            terms[str(term)] = list(range(sl.start, sl.stop))
    except AttributeError:  # pragma: no cover - formulaic always provides term_slices
        pass
    for k in keep:
        key = k.strip("`")
        if key in names:
            select[names.index(key)] = False
        elif key in terms:
            select[terms[key]] = False
        elif key == "Intercept":
            continue
        else:
            options = names + [t for t in terms if t not in names and t != "1"]
            hint = difflib.get_close_matches(key, options, n=1)
            raise InputError(
                f"keep: {k!r} is not a column or term of the formula"
                + (f"; did you mean {hint[0]!r}?" if hint else f"; the columns are {names[:20]}.")
            )
    return select
