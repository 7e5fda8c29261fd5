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

Hyperprior on rho (``LaplaceZero(rho=vbsvm.Beta(a, b))``; the default is ``Beta(1, m^2)``, see
:mod:`vbsvm.models.priors`). Then :math:`\gamma_k \mid \rho \sim \mathrm{Bernoulli}(\rho)` iid and
:math:`\rho \sim \mathrm{Beta}(a, b)`; rho enters nothing but the indicators' prior, so

.. math::

    \rho \mid \text{rest} \sim \mathrm{Beta}(a + |\gamma|,\, b + m - |\gamma|),

the conjugate step that ends each Gibbs sweep (:meth:`LaplaceZeroModel.draw_rho`; the draw is the
state's ``"rho"``, recorded as ``rho_draws``). Every move of the indicators uses the current draw
(:meth:`LaplaceZeroModel.prior_odds`): the collapsed indicator draws (``logit rho``), the add/delete
moves (``(1 - rho) / rho``) and the model jumps (``rho^|A| (1 - rho)^(m - |A|)``), each exact for the
posterior given rho; the swaps keep the model size, so rho cancels from their ratio. The mean field
has a factor ``q(rho)`` (:mod:`vbsvm.models.selection_vb`), the calibrated fit integrates
``logit(rho)`` with the variances (:mod:`vbsvm.inference.ep_selection`).

Mixing of the Gibbs sampler. Single-site updates of the indicators given their coefficients mix
slowly when predictors are correlated (the paper ran 50k + 50k draws). Each sweep therefore adds
to Appendix B, all exact for the same posterior: the collapsed indicator draw above (every
coefficient integrated out given w); the random effects' marginal moves; swaps of correlated
terms (:meth:`LaplaceZeroModel.swap_moves`); add/delete moves of each term with w integrated
out (:meth:`LaplaceZeroModel.flip_moves`, proposals fitted during tuning); and jumps between whole
models that the chains visited in tuning, with w and b integrated out
(:meth:`LaplaceZeroModel.model_jumps`, :mod:`vbsvm.mcmc.model_jumps`). Check
``fit.diagnostics()`` (rows ``gamma[term]``).
"""

from __future__ import annotations

import difflib
import math

import numpy as np

from vbsvm.distributions import InverseGamma
from vbsvm.exceptions import InputError, InputTypeError
from vbsvm.mcmc.model_jumps import ModelJumpTuner
from vbsvm.models import hinge
from vbsvm.models.linear import LinearSVMModel
from vbsvm.models.linear_algebra import WorkingGram
from vbsvm.models.priors import Beta, LaplaceZero
from vbsvm.models.selection_algebra import Gram, PriorOdds, SelectionPosterior, SlopeSelectionPosterior
from vbsvm.models.selection_gibbs import SelectionGibbs
from vbsvm.models.selection_jumps import SelectionJumps
from vbsvm.models.selection_vb import SelectionVB

__all__ = ["LaplaceZeroModel", "selection_setup", "selectable_columns"]



class LaplaceZeroModel(SelectionVB, SelectionGibbs, SelectionJumps):
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
    rho : float or vbsvm.Beta
        Prior inclusion probability, in (0, 1), or its ``Beta(a, b)`` hyperprior (see *Hyperprior
        on rho* in the module docstring).
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

    #: ``(a, b)`` of the Beta hyperprior of rho, or None for a fixed rho (:meth:`set_rho`)
    rho_prior = None

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
        self.variance_prior = base.variance_prior
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
        """Fix the prior inclusion probability (a number in (0, 1); the ``rho="auto"`` grid sets
        each of its values), or give it a hyperprior (a :class:`~vbsvm.models.priors.Beta`).

        With a fixed ``rho`` the attributes ``rho``, ``logit_rho``, ``log_rho``, ``log_1mrho``
        hold it; with a hyperprior ``rho_prior = (a, b)`` and those attributes are NaN: every
        use reads the current value instead (:meth:`prior_odds`).
        """
        if isinstance(rho, Beta):
            self.rho_prior = rho.shapes(self.m)
            self.rho = self.logit_rho = self.log_rho = self.log_1mrho = math.nan
            return
        rho = float(rho)
        if not 0.0 < rho < 1.0:
            raise ValueError("rho must lie in (0, 1)")
        self.rho_prior = None
        self.rho = rho
        self.logit_rho = math.log(rho) - math.log1p(-rho)
        self.log_rho = math.log(rho)
        self.log_1mrho = math.log1p(-rho)

    @property
    def hyperprior(self) -> bool:
        """True when ``rho ~ Beta(a, b)`` is inferred rather than fixed."""
        return self.rho_prior is not None

    def prior_odds(self, rho=None) -> PriorOdds:
        """``(log rho, log(1 - rho), logit rho)`` of the fixed ``rho``, or of the current value
        ``rho`` (a number, e.g. the Gibbs state's draw) under a hyperprior."""
        if rho is None:
            if self.rho_prior is not None:
                raise ValueError("rho has a hyperprior: pass its current value")
            return PriorOdds(self.log_rho, self.log_1mrho, self.logit_rho)
        rho = float(rho)
        log_rho, log_1mrho = math.log(rho), math.log1p(-rho)
        return PriorOdds(log_rho, log_1mrho, log_rho - log_1mrho)

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
    # ------------------------------------------------------------------ Gibbs (Appendix B)
    #: the add/delete proposals are fitted over the first half of tuning, if it has this many sweeps
    FLIP_MIN_SWEEPS = 25
    #: degrees of freedom and scale inflation of the t proposal of an added term's coefficient
    FLIP_DF, FLIP_INFLATE = 5.0, 1.5

    #: model jumps proposed per sweep (:meth:`model_jumps`)
    JUMPS_PER_SWEEP = 6


def selection_setup(design, settings, prior):
    """Check a Laplace-zero fit's arguments; returns the selectable columns and ``rho`` (a number,
    a :class:`~vbsvm.models.priors.Beta` hyperprior, or ``"auto"``).

    Raises
    ------
    vbsvm.exceptions.InputError, vbsvm.exceptions.InputTypeError
        For a prior that is not a :class:`~vbsvm.LaplaceZero`, ``method="map"``, a ``penalty``
        other than the default, unknown ``keep`` terms, nothing left to select, or
        ``rho="auto"`` with ``missing="impute"``.
    """

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
