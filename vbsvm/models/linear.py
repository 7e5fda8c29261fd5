r"""Linear Bayesian SVM with penalty inference and random intercepts.

Model (Luts & Ormerod 2014, Sections 2.3 and 3.1). With the fixed-effect design
:math:`X` (n x p, standardized), random-intercept indicators :math:`Z = [Z_1, \dots, Z_G]` and
:math:`C = [X, Z]`, :math:`\theta = (\beta, u)`, :math:`f = C\theta`:

.. math::

    p(y, a \mid \theta) &= \prod_i (2\pi a_i)^{-1/2} \exp\{-(1 + a_i - y_i f_i)^2 / (2 a_i)\}, \\
    \beta_j &\sim N(0, \sigma_\beta^2) \quad \text{(intercept; every fixed effect when penalty=None)}, \\
    \beta_j &\sim N(0, \sigma_u^2), \quad \sigma_u^2 = 1/(4\alpha) \quad \text{(non-intercept fixed effects)}, \\
    u_{g,l} &\sim N(0, \sigma_g^2) \quad \text{(level l of grouping factor g)}, \\
    \sigma_u^2, \sigma_g^2 &\sim IG(A_u, B_u) \quad \text{(each variance that is inferred)} .

Marginally over :math:`a`, :math:`p(y \mid \theta) \propto \exp\{-2 \sum_i (1 - y_i f_i)_+\}` and, with a
fixed penalty, :math:`-\log p(\theta \mid y) = 2 [\sum_i (1 - y_i f_i)_+ + \alpha \|\beta\|^2] + c`: the
posterior mode is the classical SVM with cost :math:`C = 1/(2\alpha)`.

Full conditionals (Appendix A) — written once here and used by both engines; VB plugs in
expectations, Gibbs plugs in draws:

.. math::

    \theta \mid \text{rest} &\sim N(P^{-1} C^T\{y \odot (1 + w)\},\, P^{-1}),
        \quad P = C^T \mathrm{diag}(w) C + \mathrm{diag}(\tau), \quad w_i = 1/a_i, \\
    \sigma_k^2 \mid \text{rest} &\sim IG(A_u + m_k/2,\, B_u + \|\theta_k\|^2 / 2), \\
    1/a_i \mid \text{rest} &\sim \mathrm{InverseGaussian}(1/|1 - y_i f_i|, 1),

where :math:`\tau_j` is the prior precision of coordinate j and :math:`\theta_k` the :math:`m_k`
coordinates governed by variance :math:`\sigma_k^2`. Mean-field VB (Algorithm 2) uses
:math:`q(\theta) q(\sigma^2) \prod q(a_i)` with the same formulas, :math:`w_i = \chi_i^{-1/2}`,
:math:`\tau_j = E_q[1/\sigma_k^2] = (A_u + m_k/2)/B_{q,k}` and
:math:`B_{q,k} = B_u + (\|\mu_k\|^2 + \mathrm{tr}\,\Sigma_{kk})/2`.

Structure. The grouping factor with the most levels is kept out of the dense algebra: its block of
:math:`P` is diagonal, so it is eliminated by a Schur complement and never formed. Every other
column (fixed effects and the indicators of the smaller factors) is dense. With :math:`q_d` dense
columns and :math:`m` levels of the largest factor, one iteration costs
:math:`O(n q_d^2 + q_d^3 + m q_d)` time and :math:`O(q_d^2 + m q_d)` memory beyond the data — so
thousands of patients cost no more than a few extra fixed effects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..distributions import InverseGamma
from . import hinge

__all__ = ["PriorComponent", "LinearSVMModel", "CoefficientPosterior", "fixed_effect_precision"]

LOG_2PI = np.log(2.0 * np.pi)


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


@dataclass
class PriorComponent:
    """A group of coefficients sharing one prior precision.

    ``kind="fixed"``: known precision ``precision``. ``kind="variance"``: variance with an
    ``IG(A, B)`` prior, inferred. ``index`` are the coordinates of theta it governs.
    """

    name: str
    kind: str
    index: np.ndarray
    precision: float = 1.0
    A: float = 0.01
    B: float = 0.01

    @property
    def size(self) -> int:
        return len(self.index)


class CoefficientPosterior:
    r"""Gaussian ``N(P^{-1} b, P^{-1})`` for theta with the structure of :class:`LinearSVMModel`.

    ``P = C^T diag(w) C + diag(tau)``, ``b = C^T r``. The block of the sparse grouping factor
    is eliminated: with ``P = [[A, G^T], [G, diag(D)]]``, the Schur complement
    ``S = A - G^T diag(1/D) G`` is factorized (Cholesky) and everything else is diagonal.
    """

    def __init__(self, model: "LinearSVMModel", w, tau, r, extra_precision=None):
        Cd = model.Cd
        self.model = model
        qd = model.qd
        sw = np.sqrt(w)
        Ws = Cd * sw[:, None]
        A = Ws.T @ Ws  # numpy recognizes X^T X and calls the symmetric rank-k update (half the flops)
        if extra_precision is not None:  # e.g. E_q[C^T W C] - C~^T W C~ of imputed entries
            A += extra_precision
        A[np.diag_indices(qd)] += tau[:qd]
        bd = Cd.T @ r
        if model.m_sparse:
            D = model.Zt @ w + tau[qd:]
            G = model.Zt @ (Ws * sw[:, None])  # (m, qd)
            br = model.Zt @ r
            GD = G / D[:, None]
            S = A - G.T @ GD
            h = bd - GD.T @ br
        else:
            D = np.zeros(0)
            GD = np.zeros((0, qd))
            br = np.zeros(0)
            S, h = A, bd
        self.L = np.linalg.cholesky(S)
        # Inverse of the triangular factor, O(qd^3) once per update, with numpy's LAPACK: every
        # product with the n rows is then one numpy matrix multiply, and the hot loop never
        # alternates between numpy's and scipy's OpenBLAS (their threads fight over the cores).
        self.Linv = np.linalg.solve(self.L, np.eye(qd))
        self.D, self.GD, self.br = D, GD, br
        self.mean_dense = self.Linv.T @ (self.Linv @ h)
        if model.m_sparse:
            self.mean_sparse = br / D - GD @ self.mean_dense
        else:
            self.mean_sparse = np.zeros(0)

    # ---------------------------------------------------------------- moments
    @property
    def mean(self) -> np.ndarray:
        return np.concatenate([self.mean_dense, self.mean_sparse])

    def cov_dense(self) -> np.ndarray:
        """Covariance of the dense coordinates, ``S^{-1} = L^{-T} L^{-1}``."""
        return self.Linv.T @ self.Linv

    def diag_cov(self) -> np.ndarray:
        """Marginal variances of all coordinates of theta."""
        dense = np.einsum("ij,ij->j", self.Linv, self.Linv)
        if self.model.m_sparse:
            E = self.GD @ self.Linv.T  # rows: L^{-1} (G_l / D_l)
            sparse = 1.0 / self.D + np.einsum("ij,ij->i", E, E)
        else:
            sparse = np.zeros(0)
        return np.concatenate([dense, sparse])

    def cov_dense_sparse(self) -> np.ndarray:
        """Cross-covariance ``Cov(theta_dense, theta_sparse) = -S^{-1} G^T diag(1/D)``, (qd, m)."""
        return -(self.cov_dense() @ self.GD.T)

    def logdet_cov(self) -> float:
        return float(-2.0 * np.log(np.diag(self.L)).sum() - np.log(self.D).sum())

    def linear_predictor(self):
        """Mean and variance of ``f_i = c_i^T theta`` under this Gaussian, for every row."""
        m = self.model
        mean = m.Cd @ self.mean_dense
        if m.m_sparse:
            mean = mean + self.mean_sparse[m.codes]
            V = (m.Cd - self.GD[m.codes]) @ self.Linv.T
            var = np.einsum("ij,ij->i", V, V) + 1.0 / self.D[m.codes]
        else:
            V = m.Cd @ self.Linv.T
            var = np.einsum("ij,ij->i", V, V)
        return mean, var

    def sample(self, rng) -> np.ndarray:
        """One draw of theta (dense part from ``N(S^{-1}h, S^{-1})``, sparse part given it)."""
        zd = rng.standard_normal(self.model.qd)
        dense = self.mean_dense + self.Linv.T @ zd
        if self.model.m_sparse:
            zr = rng.standard_normal(self.D.size)
            sparse = self.br / self.D - self.GD @ dense + zr / np.sqrt(self.D)
        else:
            sparse = np.zeros(0)
        return np.concatenate([dense, sparse])

    def predictor(self, theta) -> np.ndarray:
        """``C @ theta`` for a vector theta."""
        return self.model.predictor(theta)


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
        k = int(np.sum(tau[: model.qd] < WoodburyPosterior.VAGUE))
        return not model.m_sparse and 2 * model.n < model.qd - k and k <= model.n

    def __init__(self, model: "LinearSVMModel", w, tau, r):
        from scipy.linalg import cho_factor, cho_solve, solve_triangular

        self.model = model
        C = model.Cd
        n, qd = C.shape
        tau = tau[:qd]
        self.ia = np.flatnonzero(tau < self.VAGUE)
        self.ib = np.flatnonzero(tau >= self.VAGUE)
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
        self.D, self.GD, self.br = np.zeros(0), np.zeros((0, qd)), np.zeros(0)
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


class LinearSVMModel:
    """The blocks of the linear Bayesian SVM (coefficients, variances, augmentation).

    Parameters
    ----------
    X : ndarray (n, p)
        Fixed-effect design.
    y : ndarray (n,)
        Labels in {-1, +1}.
    groups : list of (codes, n_levels, name)
        Random-intercept factors; ``codes`` are level indices per row.
    fixed_precision : ndarray (p,)
        Prior precision of each fixed effect that has a known prior; NaN marks the
        coefficients under the inferred penalty variance ``sigma2_u``.
    A, B : float
        ``IG(A, B)`` prior of every inferred variance.
    """

    def __init__(self, X, y, groups, fixed_precision, A=0.01, B=0.01):
        n, p = X.shape
        self.n, self.p = n, p
        self.y = np.asarray(y, dtype=float)
        self.A, self.B = float(A), float(B)
        groups = list(groups)
        # The factor with most levels is eliminated by the Schur complement; others go dense.
        order = sorted(range(len(groups)), key=lambda k: -groups[k][1])
        self.sparse_group = order[0] if groups else None
        dense_blocks = [np.asarray(X, dtype=float)]
        self.coord_names = []
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
            codes, m, name = groups[k]
            dense_blocks.append(np.eye(m)[codes])
            self.group_slices[name] = np.arange(offset, offset + m)
            offset += m
        self.qd = offset
        self.Cd = np.asfortranarray(np.hstack(dense_blocks))
        if self.sparse_group is not None:
            codes, m, name = groups[self.sparse_group]
            self.codes = np.asarray(codes, dtype=np.int64)
            self.m_sparse = m
            self.Zt = sp.csr_matrix((np.ones(n), (self.codes, np.arange(n))), shape=(m, n))
            self.group_slices[name] = np.arange(offset, offset + m)
            offset += m
        else:
            self.codes = None
            self.m_sparse = 0
            self.Zt = None
        self.q = offset
        for codes, m, name in groups:
            self.components.append(
                PriorComponent(f"sigma2_{name}", "variance", self.group_slices[name], A=A, B=B)
            )
        self.variance_components = [c for c in self.components if c.kind == "variance"]
        #: flops of the largest product of a sweep (C^T W C), read by the engines' BLAS limit
        self.blas_work = float(n) * self.qd ** 2

    @classmethod
    def from_design(cls, design, settings) -> "LinearSVMModel":
        """The model :func:`vbsvm.svm` builds from a :class:`~vbsvm.design.Design` and its settings."""
        groups = [(g.codes, g.n_levels, g.name) for g in design.groups]
        precision = fixed_effect_precision(design, settings["penalty"], settings["sigma2_beta"])
        return cls(design.X, design.y, groups, precision, A=settings["A_u"], B=settings["B_u"])

    # ------------------------------------------------------------------ algebra
    def predictor(self, theta) -> np.ndarray:
        f = self.Cd @ theta[: self.qd]
        if self.m_sparse:
            f = f + theta[self.qd :][self.codes]
        return f

    def prior_precision(self, variance_precisions) -> np.ndarray:
        """Vector tau of prior precisions, given one precision per variance component."""
        tau = np.empty(self.q)
        it = iter(variance_precisions)
        for c in self.components:
            tau[c.index] = c.precision if c.kind == "fixed" else next(it)
        return tau

    def coefficient_posterior(self, w, tau) -> CoefficientPosterior:
        """Full conditional (Gibbs) or optimal q (VB) of theta given w and tau (through n x n
        Woodbury systems when there are fewer rows than coefficients and no factor to eliminate)."""
        if WoodburyPosterior.applicable(self, tau):
            return WoodburyPosterior(self, w, tau, hinge.working_response(self.y, w))
        return CoefficientPosterior(self, w, tau, hinge.working_response(self.y, w))

    def second_moments(self, mean, diag_cov) -> np.ndarray:
        """``||mu_k||^2 + tr(Sigma_kk)`` for every variance component."""
        return np.array([np.sum(mean[c.index] ** 2 + diag_cov[c.index]) for c in self.variance_components])

    def variance_posterior(self, sq) -> InverseGamma:
        """IG factor (VB) or full conditional (Gibbs) of every variance, given sum of squares ``sq``."""
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        return InverseGamma(self.A + sizes / 2.0, self.B + np.asarray(sq) / 2.0)

    # ------------------------------------------------------------------ VB
    def vb_initial_state(self):
        """State vector of coordinate ascent: ``(log chi, log B_q)``; starts at w = 1, E[tau] = 1."""
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        return np.concatenate([np.zeros(self.n), np.log(self.A + sizes / 2.0)])

    def vb_sweep(self, state):
        """One pass of Algorithm 2 from ``state``; returns ``(new_state, q, elbo)``."""
        chi = np.exp(state[: self.n])
        Bq = np.exp(state[self.n :])
        sizes = np.array([c.size for c in self.variance_components], dtype=float)
        Aq = self.A + sizes / 2.0
        w = hinge.expected_inverse(chi)
        post = self.coefficient_posterior(w, self.prior_precision(Aq / Bq))
        mean = post.mean
        dcov = post.diag_cov()
        mf, vf = post.linear_predictor()
        chi_new = hinge.update_chi(self.y, mf, vf)
        q_var = self.variance_posterior(self.second_moments(mean, dcov))
        q = {"theta": post, "theta_mean": mean, "theta_var": dcov, "chi": chi_new,
             "variances": q_var, "mean_f": mf, "var_f": vf}
        new_state = np.concatenate([np.log(chi_new), np.log(q_var.b)])
        return new_state, q, self.elbo(q)

    def elbo(self, q) -> float:
        """Full evidence lower bound (all constants) of a complete q."""
        mean, dcov = q["theta_mean"], q["theta_var"]
        value = hinge.elbo(self.y, q["mean_f"], q["var_f"], q["chi"])
        qv = q["variances"]
        e_tau = self.prior_precision(np.atleast_1d(qv.mean_inv()))
        # E[log tau_j]: log of the known precision, or E_q[log 1/sigma2_k] (geometric mean of tau)
        e_log_tau = np.log(self.prior_precision(np.exp(-np.atleast_1d(qv.mean_log()))))
        value += float(np.sum(-0.5 * LOG_2PI + 0.5 * e_log_tau - 0.5 * e_tau * (mean ** 2 + dcov)))
        value += 0.5 * self.q * (1.0 + LOG_2PI) + 0.5 * q["theta"].logdet_cov()
        if self.variance_components:
            prior = InverseGamma(self.A, self.B)
            value += float(np.sum(prior.expected_logpdf(qv) + qv.entropy()))
        return value

    # ------------------------------------------------------------------ Gibbs
    def gibbs_initial_state(self, rng):
        return {"w": np.ones(self.n), "tau": np.ones(len(self.variance_components))}

    def gibbs_sweep(self, state, rng):
        """Draw theta | w, tau; then 1/a | theta; then every variance | theta."""
        post = self.coefficient_posterior(state["w"], self.prior_precision(state["tau"]))
        theta = post.sample(rng)
        f = self.predictor(theta)
        w = hinge.sample_inverse(self.y, f, rng)
        if self.variance_components:
            sq = np.array([np.sum(theta[c.index] ** 2) for c in self.variance_components])
            sigma2 = self.variance_posterior(sq).sample(rng)
        else:
            sigma2 = np.zeros(0)
        return {"w": w, "tau": 1.0 / sigma2, "theta": theta, "sigma2": sigma2, "f": f,
                "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum()}

    # ------------------------------------------------------------------ MAP
    def map_step(self, theta, sigma2):
        """One EM step for the joint posterior mode of (theta, variances).

        E-step: ``E[1/a_i | theta] = 1/|1 - y_i f_i|``; M-step: theta from the Gaussian full
        conditional's mean, each variance from the mode of its IG full conditional with the
        expected sufficient statistics, ``(B + ||theta_k||^2/2) / (A + 1 + m_k/2)``.
        """
        f = self.predictor(theta)
        gap = np.maximum(np.abs(1.0 - self.y * f), np.sqrt(hinge.CHI_FLOOR))
        w = 1.0 / gap
        post = self.coefficient_posterior(w, self.prior_precision(1.0 / sigma2))
        theta = post.mean
        if self.variance_components:
            sizes = np.array([c.size for c in self.variance_components], dtype=float)
            sq = np.array([np.sum(theta[c.index] ** 2) for c in self.variance_components])
            sigma2 = (self.B + sq / 2.0) / (self.A + 1.0 + sizes / 2.0)
        return theta, sigma2

    def log_posterior(self, theta, sigma2) -> float:
        """Log joint pseudo-posterior (up to a constant) of (theta, variances)."""
        f = self.predictor(theta)
        tau = self.prior_precision(1.0 / np.asarray(sigma2))
        value = -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum() - 0.5 * np.sum(tau * theta ** 2)
        value += 0.5 * np.sum(np.log(tau))
        for s in np.atleast_1d(sigma2):
            value += -(self.A + 1.0) * np.log(s) - self.B / s
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
        return np.hstack([self.Cd, np.eye(self.m_sparse)[self.codes]])
