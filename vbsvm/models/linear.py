r"""Linear Bayesian SVM with penalty inference and random effects (intercepts and slopes).

Model (Luts & Ormerod 2014, Sections 2.3 and 3.1, with lme4-style random slopes). With the
fixed-effect design :math:`X` (n x p, standardized), one block of columns :math:`Z_k` per
random-effect term :math:`k` (for ``(1 + x | g)`` and level :math:`l` of g, the columns
:math:`(1, x_i)` on the rows of level l and 0 elsewhere), :math:`C = [X, Z_1, \dots, Z_K]`,
:math:`\theta = (\beta, b)`, :math:`f = C\theta`:

.. math::

    p(y, a \mid \theta) &= \prod_i (2\pi a_i)^{-1/2} \exp\{-(1 + a_i - y_i f_i)^2 / (2 a_i)\}, \\
    \beta_j &\sim N(0, \sigma_\beta^2) \quad \text{(intercept; every fixed effect when penalty=None)}, \\
    \beta_j &\sim N(0, \sigma_u^2), \quad \sigma_u^2 = 1/(4\alpha) \quad \text{(non-intercept fixed effects)}, \\
    b_{k,l} &\sim N(0, \sigma_k^2) \quad \text{(one-column term k, level l)}, \qquad
    b_{k,l} \sim N_q(0, \Sigma_k) \quad \text{(term with q > 1 columns)}, \\
    \sigma_u^2, \sigma_k^2 &\sim IG(A_u, B_u), \qquad \Sigma_k \sim IW(\nu, \Psi)
        \quad (\nu = q + 1,\ \Psi = 2 B_u I \text{ by default}) .

Marginally over :math:`a`, :math:`p(y \mid \theta) \propto \exp\{-2 \sum_i (1 - y_i f_i)_+\}` and, with a
fixed penalty, :math:`-\log p(\theta \mid y) = 2 [\sum_i (1 - y_i f_i)_+ + \alpha \|\beta\|^2] + c`: the
posterior mode is the classical SVM with cost :math:`C = 1/(2\alpha)`.

Full conditionals (Appendix A, and the conjugate IW step for covariances) — written once here and
used by both engines; VB plugs in expectations, Gibbs plugs in draws:

.. math::

    \theta \mid \text{rest} &\sim N(P^{-1} C^T\{y \odot (1 + w)\},\, P^{-1}),
        \quad P = C^T \mathrm{diag}(w) C + T, \quad w_i = 1/a_i, \\
    \sigma_k^2 \mid \text{rest} &\sim IG(A_u + m_k/2,\, B_u + \|\theta_k\|^2 / 2), \qquad
    \Sigma_k \mid \text{rest} \sim IW(\nu + m_k,\, \Psi + \textstyle\sum_l b_{k,l} b_{k,l}^T), \\
    1/a_i \mid \text{rest} &\sim \mathrm{InverseGaussian}(1/|1 - y_i f_i|, 1),

where the prior precision :math:`T` is diagonal (:math:`\tau_j`) on the fixed effects and the
one-column terms and block diagonal (:math:`\Sigma_k^{-1}` on each level) on a term with slopes;
:math:`\theta_k` are the :math:`m_k` coordinates governed by variance :math:`\sigma_k^2`. Mean-field
VB (Algorithm 2) uses :math:`q(\theta) q(\sigma^2) q(\Sigma) \prod q(a_i)` with the same formulas,
:math:`w_i = \chi_i^{-1/2}`, :math:`\tau_j = E_q[1/\sigma_k^2] = (A_u + m_k/2)/B_{q,k}`,
:math:`B_{q,k} = B_u + (\|\mu_k\|^2 + \mathrm{tr}\,\Sigma_{kk})/2`, :math:`E_q[\Sigma_k^{-1}] = \nu_q \Psi_q^{-1}`
and :math:`\Psi_q = \Psi + \sum_l (\mu_l\mu_l^T + \mathrm{Cov}_q(b_l))`.

Structure. The random-effect term with the most coefficients is kept out of the dense algebra: its
block of :math:`P` is block diagonal (one q x q block per level), so it is eliminated by a Schur
complement and never formed. Every other column (fixed effects and the smaller terms) is dense.
With :math:`q_d` dense columns and :math:`m` levels of q coefficients in the largest term, one
iteration costs :math:`O(n q_d^2 + q_d^3 + m q^2 q_d)` time and :math:`O(q_d^2 + m q q_d)` memory
beyond the data — so thousands of patients cost no more than a few extra fixed effects.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from vbsvm.distributions import InverseGamma, InverseWishart, sample_inverse_gamma_truncated
from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.partial_noncentring import ExponentTuner
from vbsvm.models import hinge
from vbsvm.models.linear_algebra import (
    VARIANCE_RANGE,
    CoefficientPosterior,
    PriorComponent,
    SiteGaussian,
    WoodburyPosterior,
    _as_slice,
    _term_columns,
    row_blocks,
)
from vbsvm.models.linear_block_moves import LinearBlockMoves
from vbsvm.models.linear_gibbs import LinearGibbs
from vbsvm.models.linear_map import LinearMAP
from vbsvm.models.linear_marginal_moves import LinearMarginalMoves
from vbsvm.models.linear_vb import LinearVB

__all__ = ["PriorComponent", "LinearSVMModel", "CoefficientPosterior", "fixed_effect_precision", "random_effect_terms",
           "covariance_arrays"]


def fixed_effect_precision(design, penalty, sigma2_beta) -> np.ndarray:
    """Prior precision of each fixed effect: ``1/sigma2_beta`` for the intercept (and for all
    with ``penalty=None``), ``4 alpha`` with a fixed penalty, NaN where ``sigma2_u`` is inferred
    (``penalty="auto"``)."""
    precision = np.full(design.p, 1.0 / sigma2_beta)
    if penalty == "auto":
        precision[design.penalized] = np.nan
    elif penalty is not None:
        precision[design.penalized] = 4.0 * penalty
    return precision


def covariance_arrays(q_covs) -> dict:
    """``cov_df`` and ``cov_scale`` (scales flattened and concatenated) of the IW factors
    ``q(Sigma_k)``, as a VB fit stores them."""
    return {"cov_df": np.array([qc.df for qc in q_covs]),
            "cov_scale": np.concatenate([qc.scale.ravel() for qc in q_covs])}


def meanfield_posterior(q, elbo, M, model) -> dict:
    """The arrays a mean-field VB fit stores from its ``q`` (``q["theta"]`` a
    :class:`CoefficientPosterior`): moments of theta with the dense block mapped by ``M`` (the
    standardized-to-original transformation of the dense coordinates), the IG and IW factors and
    the ELBO trace. ``model`` gives the structure (``qd``, ``m_sparse`` and the components)."""
    post = q["theta"]
    cov_d = M @ post.cov_dense() @ M.T
    mean = post.mean
    mean[: model.qd] = M @ mean[: model.qd]
    var = post.diag_cov()
    var[: model.qd] = np.diag(cov_d)
    posterior = {
        "theta_mean": mean, "theta_var": var, "theta_cov_dense": cov_d,
        "theta_cov_ds": M @ post.cov_dense_sparse() if model.m_sparse else np.zeros((model.qd, 0)),
        "var_shape": np.atleast_1d(q["variances"].a) if model.variance_components else np.zeros(0),
        "var_scale": np.atleast_1d(q["variances"].b) if model.variance_components else np.zeros(0),
        "elbo": elbo,
    }
    if model.m_sparse:
        posterior["theta_cov_ss_blocks"] = post.sparse_block_cov()
    if model.covariance_components:
        posterior.update(covariance_arrays(q["covariances"]))
    return posterior


def random_effect_terms(design) -> list:
    """The random-effect terms of a design as :class:`LinearSVMModel` takes them:
    ``(codes, n_levels, name, Z)`` per term (``Z`` None for a random intercept)."""
    return [(g.codes, g.n_levels, g.name, g.Z) for g in design.groups]


class LinearSVMModel(LinearVB, LinearGibbs, LinearMarginalMoves, LinearBlockMoves, LinearMAP):
    """The blocks of the linear Bayesian SVM (coefficients, variances, augmentation).

    Parameters
    ----------
    X : ndarray (n, p)
        Fixed-effect design.
    y : ndarray (n,)
        Labels in {-1, +1}.
    groups : list of (codes, n_levels, name) or (codes, n_levels, name, Z)
        Random-effect terms; ``codes`` are level indices per row, ``Z`` (n, q) the term's column
        values (None or absent: a random intercept). A term with q > 1 columns gets a q x q
        covariance with an ``IW(re_df, re_scale)`` prior, a term with one column a variance with
        the ``IG(A, B)`` prior.
    fixed_precision : ndarray (p,)
        Prior precision of each fixed effect that has a known prior; NaN marks the
        coefficients under the inferred penalty variance ``sigma2_u``.
    A, B : float
        ``IG(A, B)`` prior of every inferred variance.
    re_df, re_scale : float and (q, q) array, optional
        Inverse-Wishart prior of the random-effect covariances: default ``df = q + 1`` (uniform
        marginal prior on each correlation) and ``scale = 2 B I`` (each variance then has the
        marginal prior ``IG(1, B)``, close to the ``IG(A, B)`` of a single variance).
    """

    def __init__(self, X, y, groups, fixed_precision, A=0.01, B=0.01, re_df=None, re_scale=None, intercept=None):
        n, p = X.shape
        self.n, self.p = n, p
        self.y = np.asarray(y, dtype=float)
        self.A, self.B = float(A), float(B)
        #: the IG(A, B) prior of each variance, built once (the ELBO reads it every sweep)
        self.variance_prior = InverseGamma(self.A, self.B)
        terms = []
        for g in groups:
            codes, m, name = g[:3]
            Z = g[3] if len(g) > 3 and g[3] is not None else np.ones((n, 1))
            terms.append((np.asarray(codes, dtype=np.int64), int(m), name, np.asarray(Z, dtype=float)))
        # The term with most coefficients is eliminated by the Schur complement; others go dense.
        order = sorted(range(len(terms)), key=lambda k: -terms[k][1] * terms[k][3].shape[1])
        self.sparse_group = order[0] if terms else None
        dense_blocks = [np.asarray(X, dtype=float)]
        self.components: list[PriorComponent] = []
        fixed_precision = np.asarray(fixed_precision, dtype=float)
        penalized = np.flatnonzero(np.isnan(fixed_precision))
        for j in np.flatnonzero(~np.isnan(fixed_precision)):
            self.components.append(PriorComponent(f"fixed_{j}", "fixed", np.array([j]), fixed_precision[j]))
        if penalized.size:
            self.components.append(PriorComponent("sigma2_u", "variance", penalized, A=A, B=B))
        offset = p
        self.group_slices = {}
        for k in order[1:]:
            codes, m, name, Z = terms[k]
            q = Z.shape[1]
            dense_blocks.append(_term_columns(codes, m, Z))
            self.group_slices[name] = np.arange(offset, offset + m * q)
            offset += m * q
        self.qd = offset
        # the design itself when it is the only dense block (no copy), else the blocks side by side
        self.Cd = np.asfortranarray(dense_blocks[0] if len(dense_blocks) == 1 else np.hstack(dense_blocks))
        if self.sparse_group is not None:
            codes, m, name, Z = terms[self.sparse_group]
            self.codes = codes
            self.m_sparse, self.q_sparse = m, Z.shape[1]
            self.Zs = np.asfortranarray(Z)
            rows = np.arange(n)
            self.Zt = sp.csr_matrix((np.ones(n), (codes, rows)), shape=(m, n))
            self.Zts = [sp.csr_matrix((Z[:, j], (codes, rows)), shape=(m, n)) for j in range(Z.shape[1])]
            self.group_slices[name] = np.arange(offset, offset + m * Z.shape[1])
            offset += m * Z.shape[1]
        else:
            self.codes = self.Zt = self.Zs = None
            self.m_sparse, self.q_sparse = 0, 1
            self.Zts = []
        self.q = offset
        for codes, m, name, Z in terms:
            q = Z.shape[1]
            if q == 1:
                self.components.append(PriorComponent(f"sigma2_{name}", "variance", self.group_slices[name], A=A, B=B))
            else:
                scale = 2.0 * B * np.eye(q) if re_scale is None else np.asarray(re_scale, dtype=float)
                self.components.append(PriorComponent(
                    f"Sigma_{name}", "covariance", self.group_slices[name].reshape(m, q),
                    df=float(q + 1 if re_df is None else re_df), scale=scale))
        self.variance_components = [c for c in self.components if c.kind == "variance"]
        self.covariance_components = [c for c in self.components if c.kind == "covariance"]
        self.intercept = intercept if intercept is not None and np.isfinite(fixed_precision[intercept]) else None
        self._tau0 = None if self.intercept is None else float(fixed_precision[self.intercept])
        self._prepare_gibbs_moves(terms)
        #: flops of the largest product of a sweep (C^T W C), read by the engines' BLAS limit
        self.blas_work = float(n) * self.qd ** 2

    def _prepare_gibbs_moves(self, terms):
        """The structures of the Gibbs moves, from the design as built: slice widths, the block of the
        independence and HMC moves and its tuner, the random-intercept levels with their partially
        non-centred variances, the slope terms and their shift maps, the coefficients with a known prior."""
        # Gibbs slice widths 3 / ||x_j||, from the design as built (models that fill in missing
        # entries change Cd later); column by column, so that no squared copy of it is formed
        p = self.p
        X = self.Cd[:, :p]
        self._fixed_width = 3.0 / np.maximum([np.sqrt(np.add.reduce(X[:, j] * X[:, j])) for j in range(p)], 1e-12)
        # the block of the independence and HMC moves: the fixed effects and the log of each variance
        # that governs fixed effects only; the precision of the fixed effects with a known prior (0 elsewhere)
        self._block_variances = np.array([k for k, c in enumerate(self.variance_components) if c.index.max() < p],
                                         dtype=int)
        #: the coefficients each of those variances governs (a slice where contiguous, e.g. all
        #: but the intercept: views, not copies, in the HMC gradient) and their number
        self._block_governed = [(_as_slice(self.variance_components[k].index), self.variance_components[k].index.size)
                                for k in self._block_variances]
        #: each variance's coefficients (slices where contiguous) and the shape ``A + m_k/2`` of its
        #: full conditional, for the per-sweep conjugate draw
        self._variance_slices = [_as_slice(c.index) for c in self.variance_components]
        self._variance_shapes = self.A + np.array([c.size for c in self.variance_components], dtype=float) / 2.0
        self._block_fixed_tau = np.zeros(p)
        for c in self.components:
            if c.kind == "fixed" and c.index[0] < p:
                self._block_fixed_tau[c.index] = c.precision
        self._tuner = BlockTuner(p + self._block_variances.size, df=self.imh_df, min_accept=self.block_min_accept,
                                 surrogates=len(hinge.SMOOTHING_WIDTHS))
        #: variance index -> :class:`~vbsvm.models.hinge.GroupLayout` of the levels (``.codes``: the
        #: level of each row), for every random-intercept term: their levels are drawn exactly
        #: (:meth:`_redraw_levels`) and their variances move partially non-centred
        #: (:meth:`_rescale_variance`), with exponents fitted in tuning
        self._levels = {k: hinge.GroupLayout(codes, m) for k, c in enumerate(self.variance_components)
                        for codes, m, name, Z in terms if c.name == f"sigma2_{name}" and np.all(Z == 1.0)}
        self._exponents = ExponentTuner([self.variance_components[k].index.size for k in self._levels])
        # random-intercept terms whose levels can trade a common shift with the fixed intercept (f is
        # unchanged): their variance index and coordinates, for the Gibbs location move
        self._shiftable = [] if self.intercept is None else [(k, self.variance_components[k].index)
                                                             for k in self._levels]
        #: (covariance component, level of each row, the term's columns, their layout) of every term with q > 1
        #: columns, for the Gibbs move of their levels (:meth:`_redraw_slope_levels`)
        self._slope_terms = [(c, codes, np.asarray(Z, dtype=float), hinge.GroupLayout(codes, m))
                             for c in self.covariance_components
                             for codes, m, name, Z in terms if c.name == f"Sigma_{name}"]
        #: X M = Z for each of them, for the shift between their levels and the fixed effects
        self._slope_maps = self._slope_shift_maps()
        fixed = [c for c in self.components if c.kind == "fixed"]
        #: coordinates and prior precisions of the coefficients with a known prior (the scale orbit)
        self._known_prior = ((np.concatenate([np.ravel(c.index) for c in fixed]),
                               np.concatenate([np.full(np.size(c.index), c.precision) for c in fixed]))
                              if fixed else (np.zeros(0, dtype=int), np.zeros(0)))
        #: whether there are random effects (the Gibbs sweep's move along the common scale)
        self.random_effects = bool(self.covariance_components) or any(c.name != "sigma2_u"
                                                                     for c in self.variance_components)
        self._diagonal_prior = np.ones(self.q, dtype=bool)
        for c in self.covariance_components:
            self._diagonal_prior[c.index.ravel()] = False

    @classmethod
    def from_design(cls, design, settings) -> "LinearSVMModel":
        """The model :func:`vbsvm.svm` builds from a :class:`~vbsvm.formula.design.Design` and its settings."""
        groups = random_effect_terms(design)
        precision = fixed_effect_precision(design, settings["penalty"], settings["sigma2_beta"])
        return cls(design.X, design.y, groups, precision, A=settings["A_u"], B=settings["B_u"],
                   re_df=settings.get("re_df"), re_scale=settings.get("re_scale"),
                   intercept=design.column_names.index("Intercept") if design.has_intercept else None)

    # ------------------------------------------------------------------ algebra
    def predictor(self, theta) -> np.ndarray:
        f = self.Cd @ theta[: self.qd]
        if self.m_sparse:
            b = theta[self.qd:].reshape(self.m_sparse, self.q_sparse)[self.codes]
            f = f + np.einsum("ij,ij->i", self.Zs, b)
        return f

    def prior_precision(self, variance_precisions) -> np.ndarray:
        """Vector tau of prior precisions, given one precision per variance component (0 on the
        coordinates of covariance components, whose precision comes from :meth:`prior_blocks`)."""
        tau = np.zeros(self.q)
        it = iter(variance_precisions)
        for c in self.components:
            if c.kind != "covariance":
                tau[c.index] = c.precision if c.kind == "fixed" else next(it)
        return tau

    def vague_prior(self) -> np.ndarray:
        """Coordinates with a known vague prior (precision below ``WoodburyPosterior.VAGUE``, e.g.
        the intercept's ``N(0, 1e8)``); an inferred variance never counts as vague, however large
        its current value, so the Woodbury split does not change with it."""
        mask = np.zeros(self.q, dtype=bool)
        for c in self.components:
            if c.kind == "fixed" and c.precision < WoodburyPosterior.VAGUE:
                mask[c.index] = True
        return mask

    def prior_blocks(self, covariance_precisions) -> list:
        """``(index, Lambda)`` of each covariance component, given its precision matrix."""
        return [(c.index, Lam) for c, Lam in zip(self.covariance_components, covariance_precisions)]

    def coefficient_posterior(self, w, tau, blocks=(), r=None, prior_shift=None) -> CoefficientPosterior:
        """Full conditional (Gibbs) or optimal q (VB) of theta given w and the prior precision
        (through n x n Woodbury systems when there are fewer rows than coefficients and no
        random-effect term): ``N(P^{-1} b, P^{-1})``, ``P = C' diag(w) C + T``,
        ``b = C'r + prior_shift``, with ``r`` the working response ``y (1 + w)`` unless given
        (EP passes its site shifts, and the shifts of its prior sites on the dense coordinates
        as ``prior_shift``)."""
        r = hinge.working_response(self.y, w) if r is None else r
        if not blocks and prior_shift is None and WoodburyPosterior.applicable(self, tau):
            return WoodburyPosterior(self, w, tau, r)
        return CoefficientPosterior(self, w, tau, r, blocks=blocks, prior_shift=prior_shift)

    def woodbury_applies(self, tau) -> bool:
        """Whether :meth:`coefficient_posterior` at prior precisions ``tau`` (no blocks, no prior
        shift) solves the n x n Woodbury systems (:class:`WoodburyPosterior`), which build the
        Gaussian from the row weights themselves rather than from their statistics."""
        return WoodburyPosterior.applicable(self, tau)

    def site_gaussian(self, tau, stats, blocks=(), prior_shift=None, inverse=True) -> SiteGaussian:
        """The Gaussian of EP's sites from their statistics ``stats`` (``A``, ``bd``, ``D``, ``G``,
        ``br``, as in :class:`WorkingGram`), without reading the rows: :class:`SiteGaussian`
        (``inverse=False``: the mean alone)."""
        return SiteGaussian(self, tau, stats, blocks=blocks, prior_shift=prior_shift, inverse=inverse)

    def row_chunks(self) -> list:
        """Slices of the rows by which a pass reads the design (:func:`row_blocks` of the dense
        columns and one more)."""
        return row_blocks(self.n, self.qd + 1)

    def second_moments(self, mean, diag_cov) -> np.ndarray:
        """``||mu_k||^2 + tr(Sigma_kk)`` for every variance component."""
        return np.array([np.sum(mean[c.index] ** 2 + diag_cov[c.index]) for c in self.variance_components])

    def scatter_matrices(self, theta) -> list:
        """``sum_l b_l b_l^T`` of every covariance component at coefficients ``theta``."""
        return [theta[c.index].T @ theta[c.index] for c in self.covariance_components]

    def variance_posterior(self, sq) -> InverseGamma:
        """IG factor (VB) or full conditional (Gibbs) of every variance, given sum of squares ``sq``."""
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        return InverseGamma(self.A + sizes / 2.0, self.B + np.asarray(sq) / 2.0)

    def _sample_variances(self, sq, rng) -> np.ndarray:
        """The Gibbs draw of every variance from :meth:`variance_posterior` given the sums of
        squares ``sq``, restricted to :data:`VARIANCE_RANGE`, without building the
        :class:`~vbsvm.distributions.InverseGamma` (whose checks cost more than the draw, once
        per sweep)."""
        return sample_inverse_gamma_truncated(self._variance_shapes, self.B + np.asarray(sq) / 2.0, VARIANCE_RANGE,
                                              rng)

    def covariance_posteriors(self, scatters) -> list:
        """IW factor (VB) or full conditional (Gibbs) of every covariance, given the (expected)
        scatter matrices ``sum_l b_l b_l^T``."""
        return [InverseWishart(c.scale + S, c.df + len(c.index))
                for c, S in zip(self.covariance_components, scatters)]

    # ------------------------------------------------------------------ VB
    # ------------------------------------------------------------------ Gibbs
    #: directions of :meth:`_redraw_fixed_effects` whose score changes are formed by one product
    #: (an ``n x DIRECTION_BLOCK`` temporary)
    DIRECTION_BLOCK = 16

    #: rounds of (variances, shift, levels) per sweep when there are random intercepts: each
    #: round is a few O(n) passes; on toenail two rounds took min bulk ESS at the defaults from
    #: 407 to 467 and max R-hat from 1.013 to 1.009 (three: no further gain)
    level_rounds = 2

    #: independence proposals of the fixed effects per sweep, once the proposal is fitted: they
    #: cost one (n x p) @ (p x imh_steps) product together
    imh_steps = 8
    #: degrees of freedom of the t proposal (heavier tails than the near-Gaussian target)
    imh_df = 10.0
    #: acceptance rate (independence move) or mean acceptance probability (HMC) over the trial
    #: quarter of tuning for the move to replace the single-site slice moves of the fixed effects
    block_min_accept = 0.2

    # ------------------------------------------------------------------ MAP
    def dense_design(self) -> np.ndarray:
        """``C`` as a dense matrix (columns in theta order). Only for small problems (polishing)."""
        if not self.m_sparse:
            return self.Cd
        return np.hstack([self.Cd, _term_columns(self.codes, self.m_sparse, self.Zs)])
