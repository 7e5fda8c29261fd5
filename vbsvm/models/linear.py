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

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from vbsvm.distributions import InverseGamma, InverseWishart, sample_inverse_gamma_truncated
from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.hmc import TRAJECTORY, TRAJECTORY_WITH_VARIANCE, hmc_transition, trajectory_steps
from vbsvm.mcmc.independence import independence_steps
from vbsvm.mcmc.partial_noncentring import ExponentTuner
from vbsvm.mcmc.slice import slice_sample
from vbsvm.models import hinge
from vbsvm.spd import pack_spd, spd_inverse, unpack_spd

__all__ = ["PriorComponent", "LinearSVMModel", "CoefficientPosterior", "fixed_effect_precision", "random_effect_terms",
           "covariance_arrays"]

LOG_2PI = np.log(2.0 * np.pi)

#: Support of the variances in the Gibbs sampler (standardized scale): the IG prior truncated to
#: [1e-10, 1e10]. With separable data the pseudo-likelihood is flat along the separating direction
#: and the posterior of a variance under IG(0.01, 0.01) has a tail close to 1/sigma2 that no sampler
#: can explore (nor floating point represent); the truncation keeps every draw finite and changes
#: nothing where the posterior is well determined.
VARIANCE_RANGE = (1e-10, 1e10)
LOG_VARIANCE_RANGE = (math.log(VARIANCE_RANGE[0]), math.log(VARIANCE_RANGE[1]))


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


@dataclass
class PriorComponent:
    """A group of coefficients sharing one prior.

    ``kind="fixed"``: known precision ``precision``. ``kind="variance"``: variance with an
    ``IG(A, B)`` prior, inferred. ``kind="covariance"``: the ``q x q`` covariance of a
    random-effect term with ``q > 1`` columns, ``IW(df, scale)`` prior, inferred; its ``index``
    is an ``(m, q)`` array (row l: the coordinates of level l). ``index`` are the coordinates of
    theta the component governs.
    """

    name: str
    kind: str
    index: np.ndarray
    precision: float = 1.0
    A: float = 0.01
    B: float = 0.01
    df: float = 0.0
    scale: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(np.size(self.index))


def row_blocks(n, width, budget=2 ** 17):
    """Slices of ``range(n)`` with at most ``budget`` entries of an (n, width) array each (1 MB of
    float64, so that a block and its products stay in the cache): the unit of the row-blocked
    products that keep a sweep's memory O(budget) beyond the design and a few row vectors."""
    step = max(256, budget // max(int(width), 1))
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


def weighted_gram(C, w=None, r=None):
    """``C' diag(w) C`` (``C' C`` without ``w``) and ``C' r`` (None without ``r``), by blocks of
    rows (:func:`row_blocks`): each block is scaled by ``sqrt(w)`` and multiplied by itself (numpy
    recognizes ``B' B`` and calls the symmetric rank-k update), so no weighted copy of ``C`` is
    ever formed whole and every block is read once, from the cache, for both products.

    Parameters
    ----------
    C : numpy.ndarray, shape (n, k)
        Design (Fortran order reads each block's columns contiguously).
    w : numpy.ndarray, shape (n,), optional
        Non-negative row weights.
    r : numpy.ndarray, shape (n,), optional

    Returns
    -------
    A : numpy.ndarray, shape (k, k)
    b : numpy.ndarray, shape (k,), or None
    """
    n, k = C.shape
    A = np.zeros((k, k))
    b = None if r is None else np.zeros(k)
    for rows in row_blocks(n, k):
        block = C[rows]
        scaled = block if w is None else block * np.sqrt(w[rows])[:, None]
        A += scaled.T @ scaled
        if r is not None:
            b += block.T @ r[rows]
    return A, b


def _batched_cholesky_inverse(D):
    """``(L, L^{-1})`` of a stack of SPD blocks ``D`` (m, q, q); closed form for q = 1."""
    if D.shape[1] == 1:
        L = np.sqrt(D)
        return L, 1.0 / L
    L = np.linalg.cholesky(D)
    return L, np.linalg.solve(L, np.broadcast_to(np.eye(D.shape[1]), D.shape))


class WorkingGram:
    """The parts of the coefficient precision and shift that depend on the weights w only:
    ``A = C_d' W C_d`` (plus ``extra_precision``), ``b_d = C_d' r`` and, for the eliminated term,
    the blocks ``D_l = sum_i w_i z_i z_i'``, ``G_l = sum_i w_i z_i c_i'`` and ``b_l = sum_i z_i r_i``
    over its rows. Computed once per w (``O(n q_d^2)``), they serve every prior precision, e.g. the
    evaluations of the collapsed variance density in a Gibbs sweep."""

    def __init__(self, model: "LinearSVMModel", w, r, extra_precision=None):
        Cd = model.Cd
        qd = model.qd
        self.A, self.bd = weighted_gram(Cd, w, r)
        if extra_precision is not None:  # e.g. E_q[C^T W C] - C~^T W C~ of imputed entries
            self.A += extra_precision
        if model.m_sparse:
            m, qs = model.m_sparse, model.q_sparse
            WC = Cd * w[:, None]
            WZ = model.Zs * w[:, None]
            self.D = np.empty((m, qs, qs))
            self.G = np.empty((m, qs, qd))
            self.br = np.empty((m, qs))
            for j, Zt_j in enumerate(model.Zts):
                self.D[:, j, :] = Zt_j @ WZ
                self.G[:, j, :] = Zt_j @ WC
                self.br[:, j] = Zt_j @ r
        else:
            self.br = np.zeros((0, 1))


class CoefficientPosterior:
    r"""Gaussian ``N(P^{-1} b, P^{-1})`` for theta with the structure of :class:`LinearSVMModel`.

    ``P = C^T diag(w) C + T``, ``b = C^T r``, ``T`` the prior precision: ``diag(tau)`` plus, for
    every random-effect term with a covariance matrix, ``E[Sigma^{-1}]`` on each level's block. The
    coordinates of the largest random-effect term (m levels of q coefficients) are eliminated: its
    block of ``P`` is block diagonal, ``D = blockdiag(D_1..D_m)`` with ``D_l`` q x q. With
    ``P = [[A, G^T], [G, D]]`` the Schur complement ``S = A - sum_l G_l^T D_l^{-1} G_l`` is
    factorized (Cholesky) and everything else is a stack of q x q blocks: cost
    ``O(n q_d^2 + q_d^3 + m q^2 q_d)``.
    """

    def __init__(self, model: "LinearSVMModel", w, tau, r, extra_precision=None, blocks=(), gram=None,
                 prior_shift=None):
        self.model = model
        qd = model.qd
        g = WorkingGram(model, w, r, extra_precision) if gram is None else gram
        A = g.A.copy()
        A[np.diag_indices(qd)] += tau[:qd]
        sparse_prior = None
        for index, Lam in blocks:
            if index.min() >= qd:
                sparse_prior = Lam
            else:
                A[index[:, :, None], index[:, None, :]] += Lam
        bd = g.bd if prior_shift is None else g.bd + prior_shift
        if model.m_sparse:
            m, qs = model.m_sparse, model.q_sparse
            D = g.D.copy()
            if sparse_prior is None:
                D[:, np.arange(qs), np.arange(qs)] += tau[qd:].reshape(m, qs)
            else:
                D += sparse_prior
            self.LD, self.LDinv = _batched_cholesky_inverse(D)
            LDinvT = np.swapaxes(self.LDinv, 1, 2)
            Dinv = LDinvT @ self.LDinv
            # S = A - sum_l Y_l' Y_l with Y_l = L_l^{-1} G_l (half solves), not G_l' (D_l^{-1} G_l):
            # the explicit D_l^{-1} loses cond(D_l) digits, L_l^{-1} only its square root, and a row
            # with a huge augmentation weight (w = 4e7, cond(D_l) = 1e10 on toenail with random
            # slopes) made the latter S indefinite
            Y = (self.LDinv @ g.G).reshape(m * qs, qd)
            S = A - Y.T @ Y
            GD = LDinvT @ Y.reshape(m, qs, qd)  # D_l^{-1} G_l, (m, qs, qd)
            self.Dinv_br = (Dinv @ g.br[:, :, None])[:, :, 0]
            h = bd - GD.reshape(m * qs, qd).T @ g.br.ravel()
        else:
            Dinv, GD = np.zeros((0, 1, 1)), np.zeros((0, 1, qd))
            self.LD = self.LDinv = Dinv
            self.Dinv_br = np.zeros((0, 1))
            S, h = A, bd
        self.Dinv, self.GDb = Dinv, GD
        self.L = np.linalg.cholesky(S)
        # Inverse of the triangular factor, O(qd^3) once per update, with numpy's LAPACK: every
        # product with the n rows is then one numpy matrix multiply, and the hot loop never
        # alternates between numpy's and scipy's OpenBLAS (their threads fight over the cores).
        self.Linv = np.linalg.solve(self.L, np.eye(qd))
        self.mean_dense = self.Linv.T @ (self.Linv @ h)
        self.mean_sparse = (self.Dinv_br - GD @ self.mean_dense).ravel()
        #: h' P^{-1} h with h = C' r, the data term of the collapsed density of the prior
        self.fit_term = float(bd @ self.mean_dense + g.br.ravel() @ self.mean_sparse)

    # ------------------------------------------------- random-intercept (q = 1) views
    def _set_intercept_blocks(self, D, GD, br):
        """Set the eliminated block from its random-intercept form: ``D`` (m,), ``GD = G / D``
        (m, q_d), ``br`` (m,) (for posteriors built by other models' algebra)."""
        self.LD = np.sqrt(D)[:, None, None]
        self.LDinv = 1.0 / self.LD
        self.Dinv = self.LDinv ** 2
        self.GDb = GD[:, None, :]
        self.Dinv_br = (br / D)[:, None] if D.size else np.zeros((0, 1))

    @property
    def D(self) -> np.ndarray:
        """Diagonal of the eliminated block of ``P`` (random intercepts only)."""
        return 1.0 / self.Dinv[:, 0, 0]

    @property
    def GD(self) -> np.ndarray:
        """``diag(1/D) G`` as an (m, q_d) array (random intercepts only)."""
        return self.GDb[:, 0, :]

    @property
    def br(self) -> np.ndarray:
        return self.Dinv_br[:, 0] * self.D

    # ---------------------------------------------------------------- moments
    @property
    def mean(self) -> np.ndarray:
        return np.concatenate([self.mean_dense, self.mean_sparse])

    def cov_dense(self) -> np.ndarray:
        """Covariance of the dense coordinates, ``S^{-1} = L^{-T} L^{-1}``."""
        return self.Linv.T @ self.Linv

    def _sparse_loadings(self) -> np.ndarray:
        """``E_l = D_l^{-1} G_l L^{-T}``, stacked (m * q, q_d): Cov(sparse) = D^{-1} + E E^T."""
        return self.GDb.reshape(-1, self.model.qd) @ self.Linv.T

    def diag_cov(self) -> np.ndarray:
        """Marginal variances of all coordinates of theta."""
        dense = np.einsum("ij,ij->j", self.Linv, self.Linv)
        if self.model.m_sparse:
            E = self._sparse_loadings()
            sparse = np.diagonal(self.Dinv, axis1=1, axis2=2).ravel() + np.einsum("ij,ij->i", E, E)
        else:
            sparse = np.zeros(0)
        return np.concatenate([dense, sparse])

    def sparse_block_cov(self) -> np.ndarray:
        """Marginal covariance of each level's block of the eliminated term, (m, q, q)."""
        m, qs = self.Dinv.shape[:2]
        E = self._sparse_loadings().reshape(m, qs, -1)
        return self.Dinv + E @ np.swapaxes(E, 1, 2)

    def block_cov(self, index) -> np.ndarray:
        """Covariance blocks of coordinates ``index`` (m, q): one q x q block per row."""
        qd = self.model.qd
        if index.min() >= qd:
            return self.sparse_block_cov()
        return self.cov_dense()[index[:, :, None], index[:, None, :]]

    def cov_dense_sparse(self) -> np.ndarray:
        """Cross-covariance ``Cov(theta_dense, theta_sparse) = -S^{-1} G^T D^{-1}``, (qd, m q)."""
        return -(self.cov_dense() @ self.GDb.reshape(-1, self.model.qd).T)

    def logdet_cov(self) -> float:
        logdet_D = 2.0 * np.log(np.diagonal(self.LD, axis1=1, axis2=2)).sum()
        return float(-2.0 * np.log(np.diag(self.L)).sum() - logdet_D)

    def linear_predictor(self):
        """Mean and variance of ``f_i = c_i^T theta`` under this Gaussian, for every row."""
        m = self.model
        if not m.m_sparse:
            return self._dense_predictor()
        qs = m.q_sparse
        ms = self.mean_sparse.reshape(-1, qs)[m.codes]
        mean = m.Cd @ self.mean_dense + np.einsum("ij,ij->i", m.Zs, ms)
        # row i's loading on the dense coordinates once its block is eliminated
        R = m.Cd - sum(m.Zs[:, j, None] * self.GDb[m.codes, j, :] for j in range(qs))
        V = R @ self.Linv.T
        Dz = np.einsum("ijk,ik->ij", self.Dinv[m.codes], m.Zs)
        var = np.einsum("ij,ij->i", V, V) + np.einsum("ij,ij->i", Dz, m.Zs)
        return mean, var

    def _dense_predictor(self):
        """Mean and variance of the scores without an eliminated term: one product per block of
        rows, ``[L^{-1}; mu'] C_rows'`` ((q_d + 1) x rows: this shape is ~1.5x faster than
        ``C L^{-T}``), whose last row is the mean and whose other rows' squares sum to the variance
        (squared in place and summed by a product with ones, faster than a strided reduction)."""
        m = self.model
        loadings = np.vstack([self.Linv, self.mean_dense])
        ones = np.ones(m.qd)
        mean, var = np.empty(m.n), np.empty(m.n)
        for rows in row_blocks(m.n, m.qd + 1):
            V = loadings @ m.Cd[rows].T
            mean[rows] = V[-1]
            np.dot(ones, np.square(V[:-1], out=V[:-1]), out=var[rows])
        return mean, var

    def sample(self, rng) -> np.ndarray:
        """One draw of theta (dense part from ``N(S^{-1}h, S^{-1})``, sparse blocks given it)."""
        zd = rng.standard_normal(self.model.qd)
        dense = self.mean_dense + self.Linv.T @ zd
        if self.model.m_sparse:
            zr = rng.standard_normal(self.Dinv_br.shape)
            noise = (np.swapaxes(self.LDinv, 1, 2) @ zr[:, :, None])[:, :, 0]
            sparse = (self.Dinv_br - self.GDb @ dense + noise).ravel()
        else:
            sparse = np.zeros(0)
        return np.concatenate([dense, sparse])

    def predictor(self, theta) -> np.ndarray:
        """``C @ theta`` for a vector theta."""
        return self.model.predictor(theta)

    def sample_many(self, size, rng) -> np.ndarray:
        """``size`` draws of theta, vectorized over draws, shape (size, q)."""
        qd = self.model.qd
        dense = self.mean_dense + rng.standard_normal((size, qd)) @ self.Linv
        if not self.model.m_sparse:
            return dense
        m, qs = self.Dinv_br.shape
        noise = np.einsum("lkj,slk->slj", self.LDinv, rng.standard_normal((size, m, qs)))
        sparse = self.Dinv_br[None] - np.einsum("lkd,sd->slk", self.GDb, dense) + noise
        return np.hstack([dense, sparse.reshape(size, m * qs)])


class WoodburyPosterior(CoefficientPosterior):
    r"""The Gaussian of :class:`CoefficientPosterior` through n x n systems, for models without a
    Schur-eliminated factor and with fewer rows than coefficients (e.g. n = 100, p = 2000).

    The coordinates split into a small block ``a`` with vague priors (the intercept's
    ``N(0, 1e8)``; at most n of them) and the rest ``b``. With ``T_b = diag(tau_b)``,
    ``B = W^{1/2} C_b T_b^{-1}`` and ``K = I + B C_b^T W^{1/2} = L_K L_K^T``, Woodbury's identity gives
    ``P_bb^{-1} = T_b^{-1} - E^T E`` with ``E = L_K^{-1} B``; the ``a`` block is the Schur complement
    ``S_a = P_aa - P_ab G``, ``G = P_bb^{-1} P_ba``, and ``theta_b = P_bb^{-1} h_b - G theta_a + eps``,
    ``eps ~ N(0, P_bb^{-1})`` independent of ``theta_a ~ N(S_a^{-1}(h_a - G^T h_b), S_a^{-1})``.
    (Keeping the vague coordinates out of K keeps K well conditioned: with them inside, a 1e8 prior
    variance costs eight digits.) Draws of eps follow Bhattacharya, Chakraborty & Mallick (2016):
    ``u ~ N(0, T_b^{-1})``, ``d ~ N(0, I_n)``, ``eps = u - E^T L_K^{-1}(W^{1/2} C_b u + d)``.
    Cost ``O(n^2 q + n^3)`` per update instead of ``O(n q^2 + q^3)``; ``cov_dense`` (``O(n q^2)``)
    and :attr:`Linv` (``O(q^3)``) are only formed when asked for.
    """

    VAGUE = 1e-3  # prior precisions below this go to the block a

    @staticmethod
    def applicable(model, tau) -> bool:
        k = int(np.sum(model.vague_prior()[: model.qd]))
        return not model.m_sparse and 2 * model.n < model.qd - k and k <= model.n

    def __init__(self, model: "LinearSVMModel", w, tau, r):
        from scipy.linalg import cho_factor, cho_solve, solve_triangular

        self.model = model
        C = model.Cd
        n, qd = C.shape
        tau = tau[:qd]
        vague = model.vague_prior()[:qd]
        self.ia = np.flatnonzero(vague)
        self.ib = np.flatnonzero(~vague)
        Ca, Cb = C[:, self.ia], C[:, self.ib]
        self.Cb = Cb
        self.tinv = 1.0 / tau[self.ib]
        self.sw = np.sqrt(w)
        Bm = (Cb * self.tinv) * self.sw[:, None]
        K = Bm @ (Cb.T * self.sw[None, :])
        K[np.diag_indices(n)] += 1.0
        self.LK = np.linalg.cholesky(K)
        self._solve = lambda M: solve_triangular(self.LK, M, lower=True, check_finite=False)
        self.E = self._solve(Bm)
        self._pbb_inv = lambda M: self.tinv[:, None] * M - self.E.T @ (self.E @ M) if M.ndim == 2 \
            else self.tinv * M - self.E.T @ (self.E @ M)
        hb = Cb.T @ r
        mb0 = self._pbb_inv(hb)
        WCa = Ca * w[:, None]
        self.G = self._pbb_inv(Cb.T @ WCa)  # (q_b, k)
        Sa = Ca.T @ WCa - WCa.T @ Cb @ self.G
        Sa[np.diag_indices_from(Sa)] += tau[self.ia]
        self.Sa_c = cho_factor(Sa, lower=True)
        self._sa_inv = lambda M: cho_solve(self.Sa_c, M)
        ha = Ca.T @ r
        mean = np.empty(qd)
        ma = self._sa_inv(ha - self.G.T @ hb) if self.ia.size else np.zeros(0)
        mean[self.ia] = ma
        mean[self.ib] = mb0 - self.G @ ma
        self.mean_dense = mean
        self.M = Ca - Cb @ self.G  # score loadings of theta_a given the b block
        self.mean_sparse = np.zeros(0)
        self._set_intercept_blocks(np.zeros(0), np.zeros((0, qd)), np.zeros(0))
        self._Linv = None

    @property
    def Linv(self):
        """Inverse Cholesky factor of the precision (formed on demand, O(q^3))."""
        if self._Linv is None:
            L = np.linalg.cholesky(np.linalg.inv(self.cov_dense()))
            self._Linv = np.linalg.solve(L, np.eye(L.shape[0]))
        return self._Linv

    def cov_dense(self) -> np.ndarray:
        qd = self.model.qd
        Saa = self._sa_inv(np.eye(self.ia.size)) if self.ia.size else np.zeros((0, 0))
        Sbb = -(self.E.T @ self.E)
        Sbb[np.diag_indices_from(Sbb)] += self.tinv
        Sbb += self.G @ Saa @ self.G.T
        S = np.empty((qd, qd))
        S[np.ix_(self.ib, self.ib)] = Sbb
        S[np.ix_(self.ia, self.ia)] = Saa
        Sba = -self.G @ Saa
        S[np.ix_(self.ib, self.ia)] = Sba
        S[np.ix_(self.ia, self.ib)] = Sba.T
        return S

    def diag_cov(self) -> np.ndarray:
        out = np.empty(self.model.qd)
        if self.ia.size:
            La = self.Sa_c[0]
            from scipy.linalg import solve_triangular

            Z = solve_triangular(La, self.G.T, lower=True, check_finite=False)  # L_a^{-1} G^T
            Li = solve_triangular(La, np.eye(self.ia.size), lower=True, check_finite=False)
            out[self.ia] = np.einsum("ij,ij->j", Li, Li)
            extra = np.einsum("ij,ij->j", Z, Z)
        else:
            extra = 0.0
        out[self.ib] = self.tinv - np.einsum("ij,ij->j", self.E, self.E) + extra
        return out

    def cov_dense_sparse(self) -> np.ndarray:
        return np.zeros((self.model.qd, 0))

    def logdet_cov(self) -> float:
        la = 2.0 * np.log(np.diag(self.Sa_c[0])).sum() if self.ia.size else 0.0
        return float(np.log(self.tinv).sum() - 2.0 * np.log(np.diag(self.LK)).sum() - la)

    def linear_predictor(self):
        mean = self.model.Cd @ self.mean_dense
        F = self.E @ self.Cb.T  # column i is E c_{b,i}
        var = np.einsum("ij,ij->i", self.Cb * self.tinv, self.Cb) - np.einsum("ji,ji->i", F, F)
        if self.ia.size:
            var = var + np.einsum("ij,ji->i", self.M, self._sa_inv(self.M.T))
        return mean, np.maximum(var, 0.0)

    def sample_many(self, size, rng) -> np.ndarray:
        return np.array([self.sample(rng) for _ in range(size)])

    def sample(self, rng) -> np.ndarray:
        from scipy.linalg import solve_triangular

        u = np.sqrt(self.tinv) * rng.standard_normal(self.ib.size)
        d = rng.standard_normal(self.Cb.shape[0])
        eps = u - self.E.T @ self._solve(self.sw * (self.Cb @ u) + d)
        out = self.mean_dense.copy()
        if self.ia.size:
            za = solve_triangular(self.Sa_c[0].T, rng.standard_normal(self.ia.size), lower=False,
                                  check_finite=False)  # ~ N(0, S_a^{-1})
            out[self.ia] += za
            out[self.ib] -= self.G @ za
        out[self.ib] += eps
        return out


def _as_slice(index):
    """``index`` (sorted, distinct) as a slice if it is a contiguous run, else unchanged."""
    if index.size and index[-1] - index[0] + 1 == index.size:
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def _term_columns(codes, m, Z) -> np.ndarray:
    """Dense columns of a random-effect term: column ``l q + j`` is ``Z[:, j]`` on the rows of
    level ``l`` and 0 elsewhere."""
    n, q = Z.shape
    E = np.zeros((n, m * q))
    E[np.arange(n)[:, None], codes[:, None] * q + np.arange(q)] = Z
    return E


class LinearSVMModel:
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
        # Gibbs slice widths 3 / ||x_j||, from the design as built (models that fill in missing
        # entries change Cd later); column by column, so that no squared copy of it is formed
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
        #: flops of the largest product of a sweep (C^T W C), read by the engines' BLAS limit
        self.blas_work = float(n) * self.qd ** 2

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
    def vb_covariances(self, post, mean):
        """Expected scatters ``sum_l E_q[b_l b_l^T]`` of every covariance component under the
        coefficient factor ``post`` (mean ``mean``) and their optimal factors
        ``q(Sigma_k) = IW(scale + scatter, df + m_k)``; returns ``(scatters, q_covariances)``."""
        scatters = [mean[c.index].T @ mean[c.index] + post.block_cov(c.index).sum(0)
                    for c in self.covariance_components]
        return scatters, self.covariance_posteriors(scatters)

    def vb_initial_state(self):
        """State vector of coordinate ascent: ``(log chi, log B_q, packed IW scales)``; starts at
        w = 1 and prior precisions E[tau] = 1, E[Sigma^{-1}] = I."""
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        return np.concatenate([np.zeros(self.n), np.log(self.A + sizes / 2.0), self.covariance_initial_state()])

    def covariance_initial_state(self) -> np.ndarray:
        """Packed scales of the starting ``q(Sigma_k) = IW((df + m) I, df + m)`` (E[Sigma^{-1}] = I)."""
        return np.concatenate([np.zeros(0)] + [pack_spd((c.df + len(c.index)) * np.eye(c.index.shape[1]))
                                               for c in self.covariance_components])

    def pack_covariances(self, q_covs) -> np.ndarray:
        """The scales of the ``q(Sigma_k)`` as a state vector (log-Cholesky, safe to extrapolate)."""
        return np.concatenate([np.zeros(0)] + [pack_spd(qc.scale) for qc in q_covs])

    def unpack_covariances(self, packed) -> list:
        """Inverse of :meth:`pack_covariances`: the ``q(Sigma_k)``."""
        covs, at = [], 0
        for c in self.covariance_components:
            q = c.index.shape[1]
            size = q * (q + 1) // 2
            covs.append(InverseWishart(unpack_spd(packed[at:at + size], q), c.df + len(c.index)))
            at += size
        return covs

    def _unpack_state(self, state, rows=True):
        """``(chi, B_q, q(Sigma_k))`` of a state vector; ``chi`` is None unless ``rows``."""
        n, k = self.n, len(self.variance_components)
        chi = np.exp(state[:n]) if rows else None
        return chi, np.exp(state[n:n + k]), self.unpack_covariances(state[n + k:])

    def vb_sweep(self, state):
        """One pass of Algorithm 2 from ``state``; returns ``(new_state, q, elbo)``. Covariance
        components get ``q(Sigma) = IW(scale + sum_l E[b_l b_l^T], df + m)``.

        Besides the blocked products with the design a sweep holds at most four row vectors at a
        time (the weights and the working response, then the score moments, ``chi`` and the new
        state), and the q it returns one: ``chi``, the score moments being recomputed by
        :meth:`elbo` when asked for."""
        _, Bq, q_cov = self._unpack_state(state, rows=False)
        q = self.vb_update(Bq, q_cov, w=hinge.expected_inverse(np.exp(state[: self.n])))
        mf, vf = q["theta"].linear_predictor()
        q["chi"] = hinge.update_chi(self.y, mf, vf)
        glob = self.vb_global_state(q)
        new_state = np.empty(self.n + glob.size)
        np.log(q["chi"], out=new_state[: self.n])
        new_state[self.n:] = glob
        return new_state, q, self.elbo(q, mf, vf)

    def vb_update(self, Bq, q_cov, w=None, gram=None) -> dict:
        """The row-free part of a sweep: ``q(theta)``, ``q(sigma^2)`` and ``q(Sigma)`` from the
        current ``B_q`` and IW factors and either the weights ``w`` (n,) or a precomputed
        :class:`WorkingGram` ``gram`` of them (e.g. summed over the partitions of a data set that
        is not in memory, :mod:`vbsvm.fitting.dask`). Returns q without the per-row entries."""
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        Aq = self.A + sizes / 2.0
        tau = self.prior_precision(Aq / Bq)
        blocks = self.prior_blocks([qc.mean_inv() for qc in q_cov])
        if gram is None:
            post = self.coefficient_posterior(w, tau, blocks)
        else:
            post = CoefficientPosterior(self, None, tau, None, blocks=blocks, gram=gram)
        mean = post.mean
        dcov = post.diag_cov()
        q_var = self.variance_posterior(self.second_moments(mean, dcov))
        scatters, q_cov = self.vb_covariances(post, mean)
        return {"theta": post, "theta_mean": mean, "theta_var": dcov, "variances": q_var,
                "covariances": q_cov, "scatters": scatters}

    def vb_global_state(self, q) -> np.ndarray:
        """The row-free part of the state vector of ``q``: ``(log B_q, packed IW scales)``."""
        return np.concatenate([np.log(np.atleast_1d(q["variances"].b)), self.pack_covariances(q["covariances"])])

    def elbo(self, q, mean_f=None, var_f=None) -> float:
        """Full evidence lower bound (all constants) of a complete q. The mean and variance of the
        scores under ``q(theta)``: ``mean_f`` and ``var_f`` if given, else ``q["mean_f"]`` and
        ``q["var_f"]`` if q has them (e.g. an imputation model's q, whose scores are not those of
        ``q["theta"]`` alone), else those of ``q["theta"]`` (one pass over the rows)."""
        if mean_f is None:
            mean_f, var_f = (q["mean_f"], q["var_f"]) if "mean_f" in q else q["theta"].linear_predictor()
        return self.elbo_prior(q, hinge.elbo(self.y, mean_f, var_f, q["chi"]))

    def elbo_prior(self, q, value=0.0) -> float:
        """``value`` (the hinge terms, :func:`hinge.elbo`, summed over the rows) plus the ELBO's
        terms that involve no row: coefficient prior and entropy, variances and covariances."""
        mean, dcov = q["theta_mean"], q["theta_var"]
        qv = q["variances"]
        diag = self._diagonal_prior
        e_tau = self.prior_precision(np.atleast_1d(qv.mean_inv()))[diag]
        # E[log tau_j]: log of the known precision, or E_q[log 1/sigma2_k] (geometric mean of tau)
        e_log_tau = np.log(self.prior_precision(np.exp(-np.atleast_1d(qv.mean_log())))[diag])
        value += float(np.sum(-0.5 * LOG_2PI + 0.5 * e_log_tau - 0.5 * e_tau * (mean[diag] ** 2 + dcov[diag])))
        value += 0.5 * self.q * (1.0 + LOG_2PI) + 0.5 * q["theta"].logdet_cov()
        if self.variance_components:
            prior = InverseGamma(self.A, self.B)
            value += float(np.sum(prior.expected_logpdf(qv) + qv.entropy()))
        return value + self.covariance_elbo(q.get("covariances", ()), q.get("scatters", ()))

    def covariance_elbo(self, q_covs, scatters) -> float:
        """ELBO terms of the random-effect covariances: ``E log N(b_l; 0, Sigma_k)`` summed over
        the levels (``scatters`` the expected ``sum_l b_l b_l^T``), the IW prior and the entropy
        of each ``q(Sigma_k)``."""
        value = 0.0
        for c, qc, S in zip(self.covariance_components, q_covs, scatters):
            m, k = c.index.shape
            value += -0.5 * m * k * LOG_2PI - 0.5 * m * qc.mean_logdet() - 0.5 * np.sum(qc.mean_inv() * S)
            value += InverseWishart(c.scale, c.df).expected_logpdf(qc) + qc.entropy()
        return float(value)

    # ------------------------------------------------------------------ Gibbs
    def gibbs_initial_state(self, rng):
        return {"w": np.ones(self.n), "tau": np.ones(len(self.variance_components)),
                "Lam": [np.eye(c.index.shape[1]) for c in self.covariance_components],
                **self._tuner.initial_state(), **(self._exponents.initial_state() if self._levels else {})}

    def gibbs_adapt(self, state, it, tune):
        """Called by the engine after each tuning sweep (never after tuning): fits, tries and
        keeps the fixed effects' independence move (:meth:`_independence_move`), their HMC move
        (:meth:`_hmc_move`) or neither (:class:`~vbsvm.mcmc.block_tuner.BlockTuner`), and
        fits the exponents of the random-intercept variances' partially non-centred move
        (:class:`~vbsvm.mcmc.partial_noncentring.ExponentTuner`). The HMC move's trajectories
        follow the hinge smoothed over the widest of :data:`~vbsvm.models.hinge.SMOOTHING_WIDTHS`
        whose mismatch with the exact one varies little over the collected sweeps."""
        block = np.concatenate([state["theta"][: self.p], np.log(state["sigma2"][self._block_variances])])
        mismatch = None
        if self._tuner.collects(state, it, tune):
            mismatch = hinge.smoothing_mismatch(1.0 - self.y * state["f"], hinge.SMOOTHING_WIDTHS)
        fitted = state.get("blk_chol")
        state = self.adapt_level_exponents(self._tuner.adapt(state, block, it, tune, mismatch), it, tune)
        if state.get("blk_chol") is not fitted:  # the block was (re)fitted: its principal axes
            L = state["blk_chol"][: self.p]
            evals, evecs = np.linalg.eigh(L @ L.T)
            state["blk_directions"] = evecs * np.sqrt(np.maximum(evals, 0.0))
        return state

    def adapt_level_exponents(self, state, it, tune):
        """Feed the random-intercept levels and variances of ``state`` to the exponents' tuner
        (:class:`~vbsvm.mcmc.partial_noncentring.ExponentTuner`) after tuning sweep ``it``."""
        if not self._levels or "theta" not in state:
            return state
        ks = list(self._levels)
        levels = np.concatenate([state["theta"][self.variance_components[k].index] for k in ks])
        return self._exponents.adapt(state, levels, np.asarray(state["sigma2"])[ks], it, tune)

    def _level_exponents(self, state) -> dict:
        """Variance index -> exponents of its levels' partially non-centred move, as fitted so far
        in ``state`` (empty if the state has none: every variance then moves non-centred)."""
        fitted = self._exponents.exponents(state)
        return {} if fitted is None else dict(zip(self._levels, fitted))

    def variance_log_prior(self, sigma2) -> float:
        """Log density of the ``IG(A, B)`` prior of a variance, summed over ``sigma2``."""
        if isinstance(sigma2, float):  # the slice sampler's scalar calls: no array round trip
            return -(self.A + 1.0) * math.log(sigma2) - self.B / sigma2
        s = np.asarray(sigma2)
        return float(np.sum(-(self.A + 1.0) * np.log(s) - self.B / s))

    def _rescale_variance(self, k, theta, f, sigma2, rng, exponents=None):
        """Update of variance k with its coefficients on the marginal pseudo-posterior (w
        integrated out): ``t`` slice-sampled from :meth:`_variance_orbit`'s density and the state
        moved to the orbit's point at t. It uses no augmentation weights, so the sweep must draw
        w afresh from ``w | theta`` before using it (it does: the step comes right before the w
        draw). Returns the new ``(theta, f, sigma2)``."""
        logp, move = self._variance_orbit(k, theta, f, sigma2, exponents)
        return move(slice_sample(logp, 0.0, rng, width=2.0)[0])

    def _variance_orbit(self, k, theta, f, sigma2, exponents=None):
        """The orbit ``t -> (v + t, theta_j e^{c_j t / 2})`` of variance k (``v = log sigma_k^2``)
        and its coefficients j (:mod:`vbsvm.mcmc.partial_noncentring`): returns
        ``(logp, move)``, the log density of t along it and the map from t to the new
        ``(theta, f, sigma2)``.

        With every exponent ``c_j = 1`` (``exponents`` None; the only choice for a variance whose
        coefficients share rows, e.g. the penalty's) the move is non-centred: ``theta_k = sigma_k
        eta_k`` with eta fixed, the Jacobian ``e^{t m_k / 2}`` cancels the normal prior's
        ``sigma_k^{-m_k}`` and ``f = f_{-k} + e^{t/2} g`` with ``g = C_k theta_k``, so
        ``logp(t) = -2 sum_i (1 - y_i f_i)_+ + log p_IG(e^{v+t}) + (v + t)``. For a
        random-intercept term with per-level ``exponents`` (row i's score moves by
        ``u_{l(i)} (e^{c_{l(i)} t/2} - 1)``) it is the joint density along the orbit,
        ``-2 sum_i (1 - y_i f_i)_+ - sum_l u_l^2 e^{c_l t} / (2 e^{v+t}) - m_k (v + t) / 2
        + log p_IG(e^{v+t}) + (v + t) + t sum_l c_l / 2``, the last term the Jacobian. Each
        evaluation is an O(n) pass.
        """
        c = self.variance_components[k]
        v0 = math.log(sigma2[k])
        low, high = LOG_VARIANCE_RANGE
        if exponents is None:
            part = np.zeros(self.q)
            part[c.index] = theta[c.index]
            g = self.predictor(part)
            yg, yrest = self.y * g, 1.0 - self.y * (f - g)

            def logp(t):
                v = v0 + t
                if not low < v < high:
                    return -math.inf
                return (-2.0 * float(np.maximum(0.0, yrest - math.exp(0.5 * t) * yg).sum())
                        + self.variance_log_prior(math.exp(v)) + v)

            def scales(t):
                return math.exp(0.5 * t), g * (math.exp(0.5 * t) - 1.0)
        else:
            codes = self._levels[k].codes
            u = theta[c.index]
            g = u[codes]
            yg, yrest, row_exponent = self.y * g, 1.0 - self.y * (f - g), exponents[codes]
            u2, half_m, jacobian = u * u, 0.5 * u.size, 0.5 * float(exponents.sum())

            def logp(t):
                v = v0 + t
                if not low < v < high:
                    return -math.inf
                hinge_sum = float(np.maximum(0.0, yrest - np.exp(0.5 * t * row_exponent) * yg).sum())
                prior = -0.5 * float(u2 @ np.exp(t * exponents)) * math.exp(-v) - half_m * v
                return -2.0 * hinge_sum + prior + self.variance_log_prior(math.exp(v)) + v + t * jacobian

            def scales(t):
                scale = np.exp(0.5 * t * exponents)
                return scale, g * (scale[codes] - 1.0)

        def move(t):
            scale, step = scales(t)
            new_theta, new_sigma2 = theta.copy(), sigma2.copy()
            new_theta[c.index] *= scale
            new_sigma2[k] = math.exp(v0 + t)
            return new_theta, f + step, new_sigma2

        return logp, move

    def _redraw_levels(self, theta, f, sigma2, rng):
        """Marginal (w integrated out) update of the levels of every random-intercept term: given
        the rest, level l's intercept has density ``N(u_l; 0, sigma2_k) prod_{i in l}
        exp(-2 (1 - y_i f_i)_+)``, independent across levels, a mixture of truncated normals
        drawn exactly for all levels at once (:func:`~vbsvm.models.hinge.sample_offsets`). Like
        :meth:`_rescale_variance` it must be followed by a fresh ``w | theta``."""
        theta = theta.copy()
        for k, index in self._shiftable:
            layout = self._levels[k]
            u0 = theta[index]
            u = hinge.sample_offsets(1.0 - self.y * (f - u0[layout.codes]), self.y, layout, sigma2[k], rng)
            theta[index] = u
            f = f + (u - u0)[layout.codes]
        return theta, f

    def _redraw_slope_levels(self, theta, f, covariances, rng):
        """Marginal (w integrated out) update of the levels of every random-effect term with q > 1
        columns: given the rest, level l's coefficients have density ``N(b_l; 0, Sigma) prod_{i in l}
        exp(-2 (1 - y_i f_i)_+)``, independent across levels. In the whitened coordinates
        ``a_l = L^{-1} b_l`` (``Sigma = L L'``, so ``a_l ~ N(0, I)`` a priori) each coordinate is
        drawn exactly from its conditional for all levels at once, one coordinate after the other
        (:func:`~vbsvm.models.hinge.sample_offsets`): setting ``a_lj`` to ``u`` moves the margin
        gap of level l's rows to ``gap_i - y_i z_i' L e_j (u - a_lj)``. Like :meth:`_redraw_levels`
        it must be followed by a fresh ``w | theta``: with slopes the augmented step alone mixes
        slowly (toenail ``(1 + time | patient_id)``: max R-hat 1.14-1.22, min bulk ESS 14-21 in
        4 x 5000 draws), because w pins each level's scores."""
        theta = theta.copy()
        for (c, codes, Z, layout), Sigma in zip(self._slope_terms, covariances):
            L = np.linalg.cholesky(Sigma)
            a = np.linalg.solve(L, theta[c.index].T).T  # (m, q)
            for j in range(L.shape[0]):
                zl = Z @ L[:, j]
                yz, a0 = self.y * zl, a[:, j].copy()
                u = hinge.sample_offsets(1.0 - self.y * f + yz * a0[codes], yz, layout, 1.0, rng)
                f = f + (u - a0)[codes] * zl
                a[:, j] = u
            theta[c.index] = a @ L.T
        return theta, f

    def _shift_slope_locations(self, theta, sigma2, covariances, rng):
        r"""Exact draw of a common shift ``delta`` (q,) between the fixed effects of a slope term's
        columns and its levels: ``beta + M delta``, ``b_l - delta`` leaves every score unchanged
        (``X M = Z``, :meth:`_slope_shift_maps`), so its full conditional is Gaussian from the
        priors alone: precision ``P = m Sigma^{-1} + M' T M`` and mean
        ``P^{-1} (Sigma^{-1} sum_l b_l - M' T beta)``, T the fixed effects' prior precisions. The
        slope-term analogue of :meth:`_shift_location`; on toenail ``(1 + time | patient_id)`` it
        took the bulk ESS of ``time`` at 4 x 1000 from about 375 to about 500."""
        theta = theta.copy()
        T = self.prior_precision(1.0 / sigma2)[: self.p]
        for (c, _, _, _), Sigma, M in zip(self._slope_terms, covariances, self._slope_maps):
            if M is None:
                continue
            b, beta = theta[c.index], theta[: self.p]
            Lam = spd_inverse(Sigma)
            P = b.shape[0] * Lam + M.T @ (T[:, None] * M)
            L = np.linalg.cholesky(P)
            mean = np.linalg.solve(P, Lam @ b.sum(axis=0) - M.T @ (T * beta))
            delta = mean + np.linalg.solve(L.T, rng.standard_normal(P.shape[0]))
            theta[c.index] = b - delta
            theta[: self.p] = beta + M @ delta
        return theta

    def _slope_shift_maps(self) -> list:
        """For each term with slopes, the ``p x q`` matrix M with ``X M = Z`` (X the fixed effects'
        columns, Z the term's), or None where some column of Z has no fixed-effect counterpart
        (e.g. ``(1 + x | g)`` without a fixed effect of x; :meth:`_fixed_effect_column`)."""
        if self.Cd.shape[0] == 0 or self.intercept is None:  # a skeleton without rows (the Dask backend's)
            return [None] * len(self._slope_terms)
        maps = []
        for _, _, Z, _ in self._slope_terms:
            columns = [self._fixed_effect_column(z) for z in Z.T]
            if any(col is None for col in columns):
                maps.append(None)
                continue
            M = np.zeros((self.p, Z.shape[1]))
            for r, (j, slope, offset) in enumerate(columns):
                M[self.intercept, r] = offset
                if j is not None:
                    M[j, r] = slope
            maps.append(M)
        return maps

    def _fixed_effect_column(self, z):
        """``(j, slope, offset)`` with ``z = slope X_j + offset X_intercept`` for the one
        fixed-effect column j that is an exact affine function of ``z`` (the standardized copy of
        the same predictor; ``j`` None for a constant z), or None. Matching single columns (not a
        least-squares fit on all of X) keeps imputed columns out of the map: the slope columns
        are observed, so no filled-in column equals one of them."""
        X = self.Cd[:, : self.p]
        one = X[0, self.intercept]
        if np.ptp(z) == 0.0:
            return None, 0.0, z[0] / one
        for j in range(self.p):
            x = X[:, j]
            if j == self.intercept or np.ptp(x) == 0.0:
                continue
            xc = x - x.mean()
            slope = float(xc @ z) / float(xc @ xc)
            offset = z.mean() - slope * x.mean()
            if np.allclose(offset + slope * x, z, rtol=0.0, atol=1e-9 * max(1.0, np.abs(z).max())):
                return j, slope, offset / one
        return None

    def _rescale_everything(self, theta, f, sigma2, covariances, rng):
        """Update of the common scale of every coefficient, variance and covariance on the marginal
        pseudo-posterior (w integrated out): ``t`` slice-sampled from :meth:`_scale_orbit`'s
        density and the state moved to the orbit's point at t. With random slopes the posterior
        has a ridge along this orbit that the one-variance moves (:meth:`_rescale_variance`) do
        not follow: on toenail ``(1 + time | patient_id)`` with ``penalty=None`` the log variances
        correlate 0.87 with each other and -0.5 to -0.65 with the fixed intercept and time, and
        with this move (and :meth:`_shift_slope_locations`) the min bulk ESS at 4 x 1000 went from
        18-60 to 318-438 and the max R-hat from 1.07-1.18 to 1.007-1.013 (seeds 1, 3, 5, 7; 14%
        more time). Like :meth:`_rescale_variance` it must be followed by a fresh ``w | theta``.
        Returns ``(theta, f, sigma2)``; the covariances move too but are not returned: the sweep
        draws them next from ``Sigma | b``, which no step in between uses."""
        logp, move = self._scale_orbit(theta, f, sigma2, covariances)
        return move(slice_sample(logp, 0.0, rng, width=1.0)[0])

    def _scale_orbit(self, theta, f, sigma2, covariances):
        r"""The orbit ``t -> (theta e^{t/2}, sigma2 e^t, Sigma e^t)`` of every coefficient, variance
        and covariance at once: returns ``(logp, move)``, the log density of t along it and the
        map from t to the new ``(theta, f, sigma2)``.

        The score moves to ``f e^{t/2}``. A coefficient governed by a variance or covariance has a
        normal prior whose density changes by ``e^{-t/2}``, which its Jacobian ``e^{t/2}`` cancels
        (so does a Laplace-zero term's: given its mixing variable its prior is
        ``N(0, sigma_u^2 / b_k)``); a coefficient with a known prior precision :math:`\tau_j` keeps
        its Jacobian. So

        .. math::

            \log p(t) = -2\sum_i (1 - y_i f_i e^{t/2})_+ - \tfrac{e^t}{2}\sum_{j\,\mathrm{known}}
            \tau_j\theta_j^2 + \tfrac{t}{2} n_{\mathrm{known}} + \sum_k [\log p_{IG}(\sigma_k^2 e^t) + t]
            + \sum_c [\log p_{IW}(\Sigma_c e^t) + \tfrac{q_c(q_c + 1)}{2} t],

        the last terms the priors of the variances and covariances with the Jacobians of
        ``sigma2 e^t`` and of the ``q(q+1)/2`` free entries of ``Sigma e^t``. Each evaluation is
        an O(n) pass.
        """
        known, tau_known = self._known_prior
        ss = float(np.sum(tau_known * theta[known] ** 2))
        yf = self.y * f
        priors = [InverseWishart(c.scale, c.df) for c in self.covariance_components]
        log_sigma2 = np.log(sigma2)
        low, high = LOG_VARIANCE_RANGE
        jacobian = 0.5 * known.size + sigma2.size + sum(0.5 * S.shape[0] * (S.shape[0] + 1) for S in covariances)

        def logp(t):
            if sigma2.size and not (low < log_sigma2.min() + t and log_sigma2.max() + t < high):
                return -math.inf
            e = math.exp(t)
            out = -2.0 * float(np.maximum(0.0, 1.0 - math.sqrt(e) * yf).sum()) - 0.5 * ss * e + jacobian * t
            if sigma2.size:
                out += self.variance_log_prior(sigma2 * e)
            return out + sum(prior.logpdf(S * e) for S, prior in zip(covariances, priors))

        def move(t):
            scale = math.exp(0.5 * t)
            return theta * scale, f * scale, sigma2 * scale * scale

        return logp, move

    def _redraw_fixed_effects(self, theta, f, sigma2, rng, directions=None, tau=None):
        """Marginal (w integrated out) slice moves of the fixed effects along fixed directions:
        along direction ``v`` the step ``t`` (``beta + t v``) has density
        ``prod_j N(beta_j + t v_j; 0, 1/tau_j) prod_i exp(-2 (1 - y_i f_i - t y_i x_i^T v)_+)``,
        slice-sampled in O(n) per evaluation with width 3 (so ``v`` carries the scale). The
        directions are the coordinates (``v = e_j / ||x_j||``) until tuning has fitted the block's
        covariance, then its principal axes scaled by their sds (``directions``, p x p), which
        decorrelates collinear predictors. Neither depends on w, so the move keeps the marginal
        posterior; it must be followed by a fresh ``w | theta``. The current density is carried
        from one direction to the next (the slice sampler does not re-evaluate it), and each
        evaluation works in place in one buffer. ``tau``, the fixed effects' prior precisions,
        defaults to this model's given ``sigma2`` (the Laplace-zero model passes its own)."""
        if tau is None:
            tau = self.prior_precision(1.0 / sigma2)[: self.p]
        X = self.Cd[:, : self.p]
        theta = theta.copy()
        beta = theta[: self.p]
        if directions is None:
            directions = np.diag(self._fixed_width / 3.0)
        rest = 1.0 - self.y * f
        buf = np.empty(self.n)
        hinge_now = float(np.maximum(0.0, rest).sum())
        for start in range(0, self.p, self.DIRECTION_BLOCK):
            block = directions[:, start: start + self.DIRECTION_BLOCK]
            XVt = block.T @ X.T  # the block's score changes in one product (rows contiguous)
            for j, v in enumerate(block.T):
                yxv = self.y * XVt[j]
                a2, a1 = float(tau @ (v * v)), float(tau @ (v * beta))

                def logp(t):
                    np.multiply(yxv, t, out=buf)
                    np.subtract(rest, buf, out=buf)
                    np.maximum(buf, 0.0, out=buf)
                    return -0.5 * t * (a2 * t + 2.0 * a1) - 2.0 * float(buf.sum())

                t = slice_sample(logp, 0.0, rng, width=3.0, logp_x0=-2.0 * hinge_now)[0]
                if t != 0.0:
                    rest -= t * yxv
                    f = f + t * XVt[j]
                    beta += t * v
                    hinge_now = float(np.maximum(0.0, rest).sum())
        return theta, f

    #: directions of :meth:`_redraw_fixed_effects` whose score changes are formed by one product
    #: (an ``n x DIRECTION_BLOCK`` temporary)
    DIRECTION_BLOCK = 16

    def _shift_location(self, theta, sigma2, rng):
        """Exact draw of a common shift ``delta`` between the fixed intercept and the levels of each
        random-intercept term: ``beta_0 + delta``, ``u_l - delta`` leaves every score unchanged,
        so its full conditional is Gaussian from the priors alone, precision
        ``tau_0 + m / sigma2_k`` and mean ``(sum_l u_l / sigma2_k - tau_0 beta_0) / precision``.
        Removes the intercept-versus-mean-of-levels ridge of the centred parameterization."""
        tau0 = self._tau0
        theta = theta.copy()
        for k, index in self._shiftable:
            prec = tau0 + index.size / sigma2[k]
            mean = (theta[index].sum() / sigma2[k] - tau0 * theta[self.intercept]) / prec
            delta = mean + rng.standard_normal() / math.sqrt(prec)
            theta[self.intercept] += delta
            theta[index] -= delta
        return theta

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

    def _independence_move(self, proposal, theta, f, sigma2, rng):
        """Block independence Metropolis-Hastings of the fixed effects, jointly with the log of
        each variance that governs fixed effects only, on the marginal pseudo-posterior of
        :meth:`_hmc_move`. :data:`imh_steps` proposals from the t proposal fitted during tuning
        are evaluated in one batch (:mod:`vbsvm.mcmc.independence`). Like the other marginal
        moves it must be followed by a fresh ``w | theta``. Returns ``(theta, f, sigma2, accepted)``."""
        p, own = self.p, self._block_variances
        X = self.Cd[:, :p]
        current = np.concatenate([theta[:p], np.log(sigma2[own])])
        f_rest = f - X @ theta[:p]
        cand = proposal.sample(self.imh_steps, rng)
        F = f_rest[:, None] + X @ cand[:p]
        # the current state in column 0 and the proposals after it: one evaluation of each density
        both = np.column_stack([current, cand])
        target = self._imh_log_target(both, np.column_stack([f, F]))
        log_q = proposal.log_density(both)
        k, accepted = independence_steps(target[0], target[1:], log_q[0], log_q[1:], rng)
        if k < 0:
            return theta, f, sigma2, accepted
        theta, sigma2 = theta.copy(), sigma2.copy()
        theta[:p] = cand[:p, k]
        sigma2[own] = np.exp(cand[p:, k])
        return theta, F[:, k].copy(), sigma2, accepted

    def _imh_log_target(self, x, F):
        """Log target of :meth:`_independence_move` at the columns of ``x`` (fixed effects, then
        the log variances), ``F`` the scores: :meth:`_hmc_target` (at ``chol = I``) for many points at once."""
        p = self.p
        beta, eta = x[:p], x[p:]
        value = -2.0 * np.maximum(0.0, 1.0 - self.y[:, None] * F).sum(axis=0)
        value -= 0.5 * np.sum(self._block_fixed_tau[:, None] * beta * beta, axis=0)
        for r, k in enumerate(self._block_variances):
            idx = self.variance_components[k].index
            value += (-(0.5 * idx.size + self.A) * eta[r]
                      - np.exp(-eta[r]) * (0.5 * np.sum(beta[idx] ** 2, axis=0) + self.B))
        outside = (eta < LOG_VARIANCE_RANGE[0]) | (eta > LOG_VARIANCE_RANGE[1])
        return np.where(outside.any(axis=0), -np.inf, value)

    def _hmc_move(self, tuner, theta, f, sigma2, rng):
        """Hamiltonian Monte Carlo transition of the fixed effects, jointly with the log of each
        variance that governs fixed effects only (the penalty's ``sigma2_u``), on the marginal
        pseudo-posterior given the random effects and their variances:
        ``prod_j N(beta_j; 0, 1/tau_j) prod_k IG(sigma2_k; A, B) sigma2_k prod_i exp(-2 (1 - y_i f_i)_+)``
        in the coordinates ``(beta, log sigma2_k)`` (the factor ``sigma2_k`` is the Jacobian), with
        the metric and step fitted during tuning (:mod:`vbsvm.mcmc.hmc`), whitened by the
        metric (:meth:`_hmc_target`), its trajectories on the hinge smoothed over the width picked
        in tuning (:mod:`vbsvm.models.hinge`; the acceptance uses the exact hinge), of length
        :data:`~vbsvm.mcmc.hmc.TRAJECTORY_WITH_VARIANCE` when the block carries a variance.
        Each leapfrog step costs two O(np) products (scores and gradient). Like the other
        marginal moves it must be followed by a fresh ``w | theta``.
        Returns ``(theta, f, sigma2, accept_prob)``."""
        p, own, chol = self.p, self._block_variances, tuner["blk_chol"]
        X = self.Cd[:, :p]
        f_rest = f - X @ theta[:p]
        x0 = np.concatenate([theta[:p], np.log(sigma2[own])])
        surrogate = BlockTuner.surrogate(tuner)
        target, gradient = self._hmc_target(x0, chol, f_rest,
                                            hinge.SMOOTHING_WIDTHS[surrogate] if surrogate >= 0 else 0.0)
        z = np.zeros(x0.size)
        step = BlockTuner.hmc_step(tuner, rng)
        length = TRAJECTORY_WITH_VARIANCE if own.size else TRAJECTORY
        z, (_, _, scores), accept_prob = hmc_transition(target, z, target(z), step, trajectory_steps(step, length),
                                                        rng, gradient)
        if not z.any():  # rejected
            return theta, f, sigma2, accept_prob
        x = x0 + chol @ z
        theta, sigma2 = theta.copy(), sigma2.copy()
        theta[:p] = x[:p]
        sigma2[own] = np.exp(x[p:])
        return theta, f_rest + scores, sigma2, accept_prob

    def _hmc_target(self, x0, chol, f_rest, width=0.0):
        """Log target of :meth:`_hmc_move` in the coordinates z of ``x = x0 + chol z`` (x: the
        fixed effects, then the log variances; ``f_rest`` the scores of everything else):
        returns ``(target, gradient)``, the map ``z -> (log density, gradient in z, X beta)`` and
        the map ``z -> gradient in z`` (None outside the support) that the steps inside a
        trajectory call. The hinge contributes ``2 X^T (y * 1[y f < 1])`` to the gradient in x
        (with ``width > 0``, the slope ``h_w'`` of the hinge smoothed over that width,
        :mod:`vbsvm.models.hinge`, in place of the indicator; the log
        density stays the exact one), each variance ``-(m_k/2 + A) + e^{-eta_k} (||beta_k||^2/2 +
        B)``; the gradient in z is chol^T times it.

        Written out (buffers reused, no temporaries of size n beyond the products) because it
        is the sampler's innermost loop. The smoothed slope is formed from the scores directly:
        ``2 y h_w'(gap) = y clip(2 gap / w + 1, 0, 2)`` with ``2 gap / w + 1 = (2 (1 - y f_rest) / w
        + 1) - (2 y / w) X beta``, and the exact hinge's passes (its value) are made only where
        the log density is asked for: at n = 569, p = 31 (breast_cancer) about 12.7 us per
        gradient and 14.7 us per evaluation with the log density (16.4 us for both before)."""
        p, y, X, A, B = self.p, self.y, self.Cd[:, : self.p], self.A, self.B
        tau, governed_blocks = self._block_fixed_tau, self._block_governed
        low, high = LOG_VARIANCE_RANGE
        margin_left = 1.0 - y * f_rest
        if width > 0.0:
            shifted, y_scaled, y_factor = 2.0 * margin_left / width + 1.0, (2.0 / width) * y, y
        else:  # the exact hinge's slope 1[gap > 0], times 2 y
            shifted, y_scaled, y_factor = margin_left, y, 2.0 * y
        gap, slope = np.empty(self.n), np.empty(self.n)
        chol_t = np.ascontiguousarray(chol.T)
        x, grad = np.empty(x0.size), np.empty(x0.size)
        grad_beta = grad[:p]

        def evaluate(z, with_value):
            np.dot(chol, z, out=x)
            np.add(x, x0, out=x)
            etas = x[p:].tolist()
            for e in etas:
                if not low < e < high:
                    return -math.inf, None, None
            beta = x[:p]
            scores = X @ beta
            value = 0.0
            if with_value:
                np.multiply(y, scores, out=gap)
                np.subtract(margin_left, gap, out=gap)
                value = -2.0 * float(np.maximum(gap, 0.0, out=gap).sum())
            np.multiply(y_scaled, scores, out=slope)
            np.subtract(shifted, slope, out=slope)
            if width > 0.0:
                np.maximum(slope, 0.0, out=slope)  # ufuncs: np.clip costs twice their time here
                np.minimum(slope, 2.0, out=slope)
            else:
                np.greater(slope, 0.0, out=slope)
            np.multiply(slope, y_factor, out=slope)
            np.dot(slope, X, out=grad_beta)
            tau_beta = tau * beta
            value -= 0.5 * float(tau_beta @ beta)
            np.subtract(grad_beta, tau_beta, out=grad_beta)
            for r, (governed, size) in enumerate(governed_blocks):
                b = beta[governed]
                half_sq = 0.5 * float(b @ b) + B
                precision = math.exp(-etas[r])
                value += -(0.5 * size + A) * etas[r] - precision * half_sq
                grad_beta[governed] -= precision * b
                grad[p + r] = -(0.5 * size + A) + precision * half_sq
            return value, chol_t @ grad, scores

        def target(z):
            return evaluate(z, True)

        def gradient(z):
            return evaluate(z, False)[1]

        return target, gradient

    def marginal_moves(self, theta, f, sigma2, rng, directions=None, slice_moves=True, covariances=(),
                       exponents=None):
        """The moves of a sweep on the marginal pseudo-posterior (augmentation weights integrated
        out): each variance with its coefficients (:meth:`_rescale_variance`: non-centred, or
        partially non-centred with ``exponents[k]`` where that dict has variance k's levels'
        exponents), the intercept-versus-levels shift, the levels of the
        random intercepts and, given their ``covariances``, of the terms with slopes
        (:meth:`_redraw_slope_levels`) with their shift against the fixed effects
        (:meth:`_shift_slope_locations`) and the common scale of everything
        (:meth:`_rescale_everything`), and (unless ``slice_moves`` is False) the fixed effects
        along ``directions`` (:meth:`_redraw_fixed_effects`). Returns ``(theta, f, sigma2)``; w
        must be drawn afresh after them."""
        for _ in range(self.level_rounds if self._shiftable else 1):
            for k in range(sigma2.size):
                theta, f, sigma2 = self._rescale_variance(k, theta, f, sigma2, rng, (exponents or {}).get(k))
            if self._shiftable:
                theta = self._shift_location(theta, sigma2, rng)
                theta, f = self._redraw_levels(theta, self.predictor(theta), sigma2, rng)
        if covariances:
            theta, f = self._redraw_slope_levels(theta, f, covariances, rng)
            theta = self._shift_slope_locations(theta, sigma2, covariances, rng)
        if self.random_effects:
            theta, f, sigma2 = self._rescale_everything(theta, f, sigma2, covariances, rng)
        if slice_moves:
            theta, f = self._redraw_fixed_effects(theta, f, sigma2, rng, directions)
        return theta, f, sigma2

    def gibbs_sweep(self, state, rng):
        """One scan: theta | w, prior; each variance | theta (centred, conjugate IG) and again with
        its coefficients (non-centred or partially, :meth:`_rescale_variance`); the levels of the
        random intercepts and of the terms with slopes with w integrated out, and with random
        effects the common scale of everything (:meth:`marginal_moves`); 1/a | theta; each
        covariance | theta.

        The two variance updates interweave the centred and the non-centred parameterization
        (ASIS, Yu & Meng 2011): the centred step mixes when the data pin the coefficients down,
        the non-centred step when they do not (few rows per group, separable directions), where
        ``sigma2 | theta`` alone sticks. The non-centred step targets the marginal pseudo-posterior
        (no w), so the scale of a whole block of coefficients moves free of the augmentation
        weights, whose coupling with theta is what slows the plain sampler; w is then drawn given
        the new theta. Each step keeps the posterior, so the scan does. Once tuning has measured
        how much the data pin each level down, a random-intercept variance's second step is
        partially non-centred instead, one exponent per level
        (:mod:`vbsvm.mcmc.partial_noncentring`): on toenail it took the bulk ESS of
        ``sigma2_patient_id`` from about 900 to about 2400 per 8000 draws at the same cost.

        After tuning, the fixed effects (with ``log sigma2_u``) move by the independence sampler
        if its trial went well (:meth:`_independence_move`, one matrix product per sweep), else
        by HMC if its trial did (:meth:`_hmc_move`), else by slice sampling along the principal
        axes of their tuning draws; during a trial a fitted move replaces the slice moves while
        its acceptance is high enough
        (:meth:`~vbsvm.mcmc.block_tuner.BlockTuner.replaces_slice_moves`). With a fitted
        move kept and no random effects, the augmented steps (theta | w and w | theta, an
        ``O(n p^2)`` Gram and ``n`` inverse-Gaussian draws) are skipped: the scan is then a
        Metropolis-within-Gibbs sampler on the marginal pseudo-posterior, each of its steps
        exact. During a trial that goes well theta | w is skipped likewise; w is then drawn
        (given the current theta) only by a sweep that makes the augmented step again, when the
        trial stops going well, at its start: the same draw as at the end of the sweep before,
        which nothing in between used (on breast_cancer the trial's sweeps cost about 20% less).
        """
        tuner = BlockTuner.carry(state)
        replaces_slice_moves = self._tuner.replaces_slice_moves(tuner)
        skip_augmented = self.q == self.p and replaces_slice_moves
        w = state["w"]
        if skip_augmented:
            theta = state["theta"]
        else:
            if w.size == 0:  # not drawn after the last sweep, which skipped the augmented steps: now, given its theta
                w = hinge.sample_inverse(self.y, state["f"], rng)
            post = self.coefficient_posterior(w, self.prior_precision(state["tau"]),
                                              self.prior_blocks(state.get("Lam", ())))
            theta = post.sample(rng)
        if self.variance_components:
            sigma2 = self._sample_variances(np.array([np.sum(theta[index] ** 2) for index in self._variance_slices]),
                                            rng)
        else:
            sigma2 = np.zeros(0)
        theta, f, sigma2 = self.marginal_moves(theta, self.predictor(theta), sigma2, rng,
                                               directions=tuner.get("blk_directions"),
                                               slice_moves=not replaces_slice_moves,
                                               covariances=[spd_inverse(Lam) for Lam in state["Lam"]]
                                               if self._slope_terms else (),
                                               exponents=self._level_exponents(state) if self._levels else None)
        proposal = self._tuner.imh_proposal(tuner)
        if proposal is not None:
            theta, f, sigma2, accepted = self._independence_move(proposal, theta, f, sigma2, rng)
            tuner = self._tuner.record_imh(tuner, self.imh_steps, accepted)
        if self._tuner.runs_hmc(tuner):
            theta, f, sigma2, accept_prob = self._hmc_move(tuner, theta, f, sigma2, rng)
            tuner = self._tuner.record_hmc(tuner, accept_prob)
        # w | theta, unless the next sweep may skip theta | w too: then it is drawn when needed
        w = np.zeros(0) if skip_augmented else hinge.sample_inverse(self.y, f, rng)
        Sigmas = ([qc.sample(rng) for qc in self.covariance_posteriors(self.scatter_matrices(theta))]
                  if self.covariance_components else [])
        return {"w": w, "tau": 1.0 / sigma2, "Lam": [spd_inverse(S) for S in Sigmas], "theta": theta,
                "sigma2": sigma2, "cov": np.concatenate([S.ravel() for S in Sigmas]) if Sigmas else np.zeros(0),
                "f": f, "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum(), **tuner,
                **(ExponentTuner.carry(state) if self._levels else {})}

    # ------------------------------------------------------------------ MAP
    def map_step(self, theta, sigma2, covs=()):
        """One EM step for the joint posterior mode of (theta, variances, covariances).

        E-step: ``E[1/a_i | theta] = 1/|1 - y_i f_i|``; M-step: theta from the Gaussian full
        conditional's mean, each variance from the mode of its IG full conditional,
        ``(B + ||theta_k||^2/2) / (A + 1 + m_k/2)``, each covariance from the mode of its IW full
        conditional, ``(scale + sum_l b_l b_l^T) / (df + m + q + 1)``.
        """
        f = self.predictor(theta)
        gap = np.maximum(np.abs(1.0 - self.y * f), np.sqrt(hinge.CHI_FLOOR))
        w = 1.0 / gap
        post = self.coefficient_posterior(w, self.prior_precision(1.0 / np.asarray(sigma2)),
                                          self.prior_blocks([spd_inverse(S) for S in covs]))
        theta = post.mean
        if self.variance_components:
            sizes = np.array([c.size for c in self.variance_components], dtype=float)
            sq = np.array([np.sum(theta[c.index] ** 2) for c in self.variance_components])
            sigma2 = (self.B + sq / 2.0) / (self.A + 1.0 + sizes / 2.0)
        covs = [(c.scale + S) / (c.df + c.index.shape[0] + c.index.shape[1] + 1.0)
                for c, S in zip(self.covariance_components, self.scatter_matrices(theta))]
        return theta, sigma2, covs

    def log_posterior(self, theta, sigma2, covs=()) -> float:
        """Log joint pseudo-posterior (up to a constant) of (theta, variances, covariances)."""
        f = self.predictor(theta)
        diag = self._diagonal_prior
        tau = self.prior_precision(1.0 / np.asarray(sigma2))[diag]
        value = -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum() - 0.5 * np.sum(tau * theta[diag] ** 2)
        value += 0.5 * np.sum(np.log(tau))
        for s in np.atleast_1d(sigma2):
            value += -(self.A + 1.0) * np.log(s) - self.B / s
        for c, S in zip(self.covariance_components, covs):
            B = theta[c.index]
            L = np.linalg.cholesky(S)
            Y = np.linalg.solve(L, B.T)
            value += -0.5 * np.sum(Y * Y) - B.shape[0] * np.log(np.diag(L)).sum()
            value += float(InverseWishart(c.scale, c.df).logpdf(S))
        return float(value)

    def polish_mode(self, theta, tol=1e-6):
        """Exact posterior mode for known prior precisions from the active sets of ``theta``.

        The mode minimizes ``2 sum_i (1 - y_i f_i)_+ + theta^T diag(tau) theta / 2``. With margin
        set M (``y_i f_i = 1``) and violator set V (``y_i f_i < 1``) its KKT conditions are linear:
        ``diag(tau) theta - 2 C_M^T (y_M * lam_M) = 2 C_V^T y_V`` and ``C_M theta = y_M`` with
        ``0 <= lam_M <= 1``. Returns the solution, or None if the sets read off ``theta`` are not
        consistent (then the EM iterate is kept).
        """
        if self.variance_components:
            return None
        tau = self.prior_precision([])
        C = self.dense_design()
        f = C @ theta
        margin = self.y * f
        for tol_k in (tol, 10 * tol, 100 * tol, 1000 * tol):
            M = np.abs(margin - 1.0) <= tol_k
            V = margin < 1.0 - tol_k
            k = int(M.sum())
            K = np.zeros((self.q + k, self.q + k))
            K[: self.q, : self.q] = np.diag(tau)
            K[: self.q, self.q :] = -2.0 * (C[M] * self.y[M, None]).T
            K[self.q :, : self.q] = C[M]
            rhs = np.concatenate([2.0 * C[V].T @ self.y[V], self.y[M]])
            try:
                sol = np.linalg.solve(K, rhs)
            except np.linalg.LinAlgError:
                continue
            th, lam = sol[: self.q], sol[self.q :]
            new_margin = self.y * (C @ th)
            ok = (
                np.all(lam >= -1e-8) and np.all(lam <= 1 + 1e-8)
                and np.all(new_margin[V] <= 1 + 1e-8)
                and np.all(new_margin[~(M | V)] >= 1 - 1e-8)
            )
            if ok:
                return th
        return None

    def dense_design(self) -> np.ndarray:
        """``C`` as a dense matrix (columns in theta order). Only for small problems (polishing)."""
        if not self.m_sparse:
            return self.Cd
        return np.hstack([self.Cd, _term_columns(self.codes, self.m_sparse, self.Zs)])
