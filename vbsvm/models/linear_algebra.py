"""Linear algebra of the linear SVM's coefficient block: the prior components, the working Gram
``C' W C`` by row blocks, and the Gaussian posterior of the coefficients (dense or by Woodbury over the
random-effect levels, or from the statistics of EP's sites).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs, dtrtri

LOG_2PI = np.log(2.0 * np.pi)


#: Support of the variances in the Gibbs sampler (standardized scale): the IG prior truncated to
#: [1e-10, 1e10]. With separable data the pseudo-likelihood is flat along the separating direction
#: and the posterior of a variance under IG(0.01, 0.01) has a tail close to 1/sigma2 that no sampler
#: can explore (nor floating point represent); the truncation keeps every draw finite and changes
#: nothing where the posterior is well determined.
VARIANCE_RANGE = (1e-10, 1e10)


LOG_VARIANCE_RANGE = (math.log(VARIANCE_RANGE[0]), math.log(VARIANCE_RANGE[1]))


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

    def __init__(self, model, w, r, extra_precision=None):
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


def with_prior(model, stats, tau, blocks=(), prior_shift=None):
    """The blocks of the posterior precision and shift: those of the likelihood in ``stats`` (a
    :class:`WorkingGram` or the statistics of EP's sites: ``A``, ``D``, ``bd``) plus the prior's,
    i.e. ``tau`` on the diagonal, the covariance blocks ``blocks`` (``(index, precision)`` pairs)
    and ``prior_shift``. Returns new ``(A, D, bd)`` (``D`` None without the eliminated factor)."""
    qd = model.qd
    A = stats.A.copy()  # C-contiguous: its flat view's stride qd + 1 is the diagonal
    A.ravel()[:: qd + 1] += tau[:qd]
    sparse_prior = None
    for index, Lam in blocks:
        if index.min() >= qd:
            sparse_prior = Lam
        else:
            A[index[:, :, None], index[:, None, :]] += Lam
    bd = stats.bd if prior_shift is None else stats.bd + prior_shift
    D = None
    if model.m_sparse:
        m, qs = model.m_sparse, model.q_sparse
        D = stats.D.copy()
        if sparse_prior is None:
            D[:, np.arange(qs), np.arange(qs)] += tau[qd:].reshape(m, qs)
        else:
            D += sparse_prior
    return A, D, bd


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

    def __init__(self, model, w, tau, r, extra_precision=None, blocks=(), gram=None,
                 prior_shift=None):
        self.model = model
        qd = model.qd
        g = WorkingGram(model, w, r, extra_precision) if gram is None else gram
        A, D, bd = with_prior(model, g, tau, blocks, prior_shift)
        if model.m_sparse:
            self.LD, self.LDinv = _batched_cholesky_inverse(D)
            S, h = self._eliminate(A, bd, g.G, g.br)
        else:
            S, h = self._no_elimination(A, bd)
        self.L = np.linalg.cholesky(S)
        # Inverse of the triangular factor, O(qd^3) once per update, with numpy's LAPACK: every
        # product with the n rows is then one numpy matrix multiply, and the hot loop never
        # alternates between numpy's and scipy's OpenBLAS (their threads fight over the cores).
        self.Linv = np.linalg.solve(self.L, np.eye(qd))
        self.mean_dense = self.Linv.T @ (self.Linv @ h)
        self.mean_sparse = (self.Dinv_br - self.GDb @ self.mean_dense).ravel()
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

    def sample_dense_mapped(self, size, rng, B, offset) -> np.ndarray:
        """``size`` draws of ``offset + theta_dense @ B`` (a model without eliminated random
        effects): the normals of :meth:`sample_many` times the factor mapped by ``B``, one product."""
        return (offset + self.mean_dense @ B) + rng.standard_normal((size, self.model.qd)) @ (self.Linv @ B)

    def _eliminate(self, A, bd, G, br):
        """Eliminate the random effects (factor ``self.LDinv`` of their blocks ``D_l``, coupling ``G``
        (m, qs, qd), shifts ``br``) from the precision ``A`` and shift ``bd``: ``(S, h)`` of the dense
        coordinates; sets ``Dinv``, ``GDb`` (``D_l^{-1} G_l``) and ``Dinv_br``.

        ``S = A - sum_l Y_l' Y_l`` with ``Y_l = L_l^{-1} G_l`` (half solves), not
        ``G_l' (D_l^{-1} G_l)``: the explicit ``D_l^{-1}`` loses cond(D_l) digits, ``L_l^{-1}`` only
        its square root, and a row with a huge augmentation weight (w = 4e7, cond(D_l) = 1e10 on
        toenail with random slopes) made the latter S indefinite."""
        m, qs, qd = self.model.m_sparse, self.model.q_sparse, self.model.qd
        LDinvT = np.swapaxes(self.LDinv, 1, 2)
        Dinv = LDinvT @ self.LDinv
        Y = (self.LDinv @ G).reshape(m * qs, qd)
        S = A - Y.T @ Y
        GD = LDinvT @ Y.reshape(m, qs, qd)  # D_l^{-1} G_l, (m, qs, qd)
        self.Dinv_br = (Dinv @ br[:, :, None])[:, :, 0]
        self.Dinv, self.GDb = Dinv, GD
        return S, bd - GD.reshape(m * qs, qd).T @ br.ravel()

    def _no_elimination(self, A, bd):
        """``(A, bd)`` and empty random-effect blocks, for a model without them."""
        Dinv, GD = np.zeros((0, 1, 1)), np.zeros((0, 1, A.shape[0]))
        self.LD = self.LDinv = Dinv
        self.Dinv_br = np.zeros((0, 1))
        self.Dinv, self.GDb = Dinv, GD
        return A, bd


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

    def __init__(self, model, w, tau, r):
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

    def sample_dense_mapped(self, size, rng, B, offset) -> np.ndarray:
        return offset + self.sample_many(size, rng) @ B

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


class SiteGaussian(CoefficientPosterior):
    """:class:`CoefficientPosterior` built from the statistics of EP's sites
    (:class:`~vbsvm.inference.ep_sites.SiteStatistics`, read for their attributes ``A``, ``bd``,
    ``D``, ``G``, ``br``, those of :class:`WorkingGram`) instead of the rows: the
    same algebra (Schur elimination of the eliminated term, Cholesky of the dense block and the
    inverse of its factor, which the score pass multiplies with the rows), with the triangular
    inverse by LAPACK's ``dtrtri`` (q^3/3 flops) instead of a general solve against the identity
    (4 q^3/3 and a copy; 16 times slower at q = 101), as EP forms one or two per sweep.
    ``inverse=False``: the mean alone (what :meth:`~vbsvm.inference.ep_sites.EPPass.moment_change` reads)."""

    def __init__(self, model, tau, stats, blocks=(), prior_shift=None, inverse=True):
        self.model = model
        A, D, bd = with_prior(model, stats, tau, blocks, prior_shift)
        if model.m_sparse:
            qs = model.q_sparse
            if qs == 1:
                self.LD = np.sqrt(D)
                self.LDinv = 1.0 / self.LD
            else:
                self.LD = np.linalg.cholesky(D)
                self.LDinv = np.linalg.solve(self.LD, np.broadcast_to(np.eye(qs), D.shape))
            S, h = self._eliminate(A, bd, stats.G, stats.br)
        else:
            S, h = self._no_elimination(A, bd)
        L, info = dpotrf(S, lower=1, clean=1)
        if info != 0:
            raise np.linalg.LinAlgError("the precision of the sites' Gaussian is not positive definite")
        self.L = L
        if inverse:
            Linv, info = dtrtri(L, lower=1)
            if info != 0:
                raise np.linalg.LinAlgError("singular Cholesky factor")
            self.Linv = Linv
            self.mean_dense = Linv.T @ (Linv @ h)
        else:  # the mean alone (two triangular solves); no covariance
            self.Linv = None
            self.mean_dense, info = dpotrs(L, h, lower=1)
        if model.m_sparse:
            self.mean_sparse = (self.Dinv_br - self.GDb @ self.mean_dense).ravel()
            self.fit_term = float(bd @ self.mean_dense + stats.br.ravel() @ self.mean_sparse)
        else:
            self.mean_sparse = _EMPTY
            self.fit_term = float(bd @ self.mean_dense)


#: The sparse part of a Gaussian without an eliminated term (shared: nothing writes to it).
_EMPTY = np.zeros(0)
_EMPTY.flags.writeable = False


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
