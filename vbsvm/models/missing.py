r"""Missing predictor values imputed inside the model.

Two imputation models (``vbsvm.svm(..., missing="impute", imputation=...)``):

* ``"conditional"`` (default; :class:`CutImputedSVMModel`, full conditionals and the two
  engines in its docstring): :math:`d_i \mid y_i \sim N(m_{y_i}, \Sigma)`, the missing predictors
  modelled given the observed ones and the label, cut from the SVM (Plummer 2015): the hinge
  does not feed back into the imputations. Gibbs draws the imputation block from its own
  posterior, then the SVM given the completed data; VB fits the imputation q first and pools
  the SVM's mean-field fits of completions drawn from it (:func:`vbsvm.inference.pooled.pooled_vb_cut`).
* ``"joint"``: the paper's model (Luts & Ormerod 2014, Section 3.3, Algorithm 4 and Appendix C),
  :class:`ImputedSVMModel`, described below. Its hinge pseudo-likelihood is not normalised in
  y, so an incomplete row gains by moving its imputation to its label's side, which inflates the
  imputed column's coefficient (``benchmarks/imputation_simulation.py``); kept for the
  reproduction of the paper's Figure 4.

**Random effects.** The SVM block is the linear model of :mod:`vbsvm.models.linear` given the
completed design, random intercepts and slopes included: in the conditional model the imputation
block does not involve them (``groups`` enter only the coefficient block ``C = [X, Z]``), so
Gibbs adds the linear model's conjugate step
:math:`\Sigma_k \mid \text{rest} \sim IW(\Psi + \sum_l b_{k,l}b_{k,l}^T, \nu + m_k)` after
:math:`\theta \mid \text{rest}` (with :math:`\Sigma_k^{-1}` on each level's block of its
precision), and VB the factor :math:`q(\Sigma_k) = IW(\Psi + \sum_l E_q[b_lb_l^T], \nu + m_k)` and
its ELBO terms; the pooled VB averages the completions' :math:`q(\Sigma_k)` scales (common degrees
of freedom). The slope columns must be observed (they are not imputation variables), and the
joint model supports random intercepts only (its :math:`r_i` would involve the slopes).

**Laplace-zero selection** (``prior=LaplaceZero(...)``, conditional model only). The SVM block
given the completed design is :class:`~vbsvm.models.selection.LaplaceZeroModel` on the same
linear model (:attr:`CutImputedSVMModel.svm`): Gibbs runs its Appendix B sweep after the
imputation block; the pooled VB fits Algorithm 3 to each completion and averages the inclusion
probabilities :math:`\mu_{\gamma_k}`, :math:`E[b_k]` and :math:`\chi_i`, with :math:`q(\theta)` and the
variances pooled as above (an approximation of the mixture of spike-and-slab q's: each
coefficient's slab is moment-matched over completions, not weighted by its inclusion).

The paper's joint model
-----------------------

Let :math:`X` (n x p) be the standardized fixed-effect design, :math:`D` (n x d) its
non-intercept columns (the *imputation columns*; every non-intercept column, observed or not,
so that a missing entry borrows strength from the observed ones) and
:math:`C = [X, Z]` with the random-intercept indicators :math:`Z` of ``(1 | g)`` terms,
:math:`\theta = (\beta, b)`, :math:`f_i = c_i^T \theta`. Entries of :math:`D` may be missing
(:math:`\mathcal M_i` the missing coordinates of row i, :math:`\mathcal O_i` the observed ones):

.. math::

    p(y_i, a_i \mid \theta, d_i) &= (2\pi a_i)^{-1/2} \exp\{-(1 + a_i - y_i f_i)^2 / (2 a_i)\}, \\
    d_i \mid \mu, \Sigma &\overset{ind.}{\sim} N(\mu, \Sigma), \quad
    \mu \sim N(0, \sigma_\mu^2 I_d), \quad \Sigma \sim IW(\Psi, \nu),

with the coefficient priors of :mod:`vbsvm.models.linear` (intercept :math:`N(0, \sigma_\beta^2)`,
penalized coefficients :math:`N(0, \sigma_u^2)` with :math:`\sigma_u^2 \sim IG(A_u, B_u)` or a fixed
penalty, random intercepts :math:`N(0, \sigma_g^2)`). Missingness is assumed MCAR (ignorable).
Paper defaults: :math:`\sigma_\mu^2 = 10^8`, :math:`\Psi = 0.01 I`, :math:`\nu = 3`, all on the
standardized scale of the design columns.

**Transformed predictors.** The imputation model acts on the *design columns*: a predictor that
enters as ``np.log(choleste)`` is imputed as ``np.log(choleste)``, i.e. on the transformed scale
where the Gaussian model is placed, and :attr:`ImputedFit.imputed` reports values on that scale.
Categorical predictors with missing values are refused by :func:`vbsvm.formula.design.build_design`.

**Interactions** (the conditional model only). A numeric predictor that enters several design
columns, or a column together with other predictors (``x * z``, ``x:z + x``, ``x:C(g)``), is one
imputation variable: the predictor itself, standardized by its observed mean and sd
(:class:`ImputationSpec`); :math:`D` then holds these predictors and the other non-intercept
columns. Every design column that involves such a predictor must be *linear* in it: the entry of
row i is

.. math::

    c_{ij} = a_{ij} + s_{ij}\, d_{ik},

with :math:`a_{ij}, s_{ij}` functions of the row's observed predictors and of the fixed
standardization constants (for ``x:z``: :math:`s_{ij} = s_x z_i / \sigma_{x:z}`, :math:`s_x` the sd of the
observed x and :math:`\sigma_{x:z}` the design's scale of the column), obtained by evaluating the
formula at two values of the predictor (:meth:`ImputationSpec.completion`). The completed design
of a completion is therefore the design evaluated on the completed data. Every standardization
constant is computed once from the observed entries (the design's from each column's observed
entries, the predictor's from its observed values) and never from imputations. With
:math:`S_i` (:math:`m_i \times p`) the slopes of row i (:math:`[S_i]_{aj} = s_{ij}` if column j depends on
the a-th missing cell of the row, 0 otherwise; for main effects :math:`S_i` selects the columns)
and :math:`q(d_{i,\mathcal M_i}) = N(\tilde d_{i,\mathcal M_i}, V_i)`:

.. math::

    E_q[c_i] = a_i + S_i^T \tilde d_{i,\mathcal M_i}, \qquad
    \mathrm{Cov}_q(c_i) = S_i^T V_i S_i, \qquad
    E_q[c_i c_i^T] = E_q[c_i] E_q[c_i]^T + S_i^T V_i S_i,

i.e. :math:`\mathrm{Cov}_q(c_{ij}, c_{ij'}) = s_{ij} s_{ij'} \mathrm{Cov}_q(d_{ik}, d_{ik'})`: two columns that
involve the same missing cell covary as its variance times the product of their observed
multipliers (``x`` and ``x:z``: :math:`V_{i,xx}\, s_x^2 z_i / (\sigma_x \sigma_{x:z})`). These
moments enter the VB of :class:`CutImputedSVMModel` (:math:`C^TWC \to \tilde C^TW\tilde C +
\sum_i w_i \mathrm{Cov}_q(c_i)`, and :math:`\chi_i`); Gibbs and the pooled VB just complete the
design. A column that is not linear in a predictor with missing values (``x + I(x**2)``,
``np.log(x):z``, ``poly(x, 2)``), or that multiplies two predictors missing in the same row
(``x:w``), is refused with an :class:`~vbsvm.exceptions.InputError` naming it; a predictor that
enters one column of itself alone keeps any transformation (imputed on that column's scale).
The joint model refuses interactions: its hinge feedback would act through the row-specific
coefficients :math:`S_i\theta`, which the paper's model does not cover.

*Caution* (``benchmarks/imputation_simulation.py --interaction``,
``benchmarks/results/imputation_simulation_interaction.md``): the conditional model shares
:math:`\Sigma` between the classes, so the regression of x on z is the same in both; an x:z effect
on y makes it differ, and the imputations, lacking that y:z term, attenuate the x:z coefficient:
0.78x the full-data fit (VB and Gibbs alike) with 30% of x MCAR-missing, as independent multiple
imputation from the same regression (0.78x), while complete cases are unbiased under MCAR (0.99x)
and closer to the full-data fit. Imputing from the regression within each class (what a
class-specific :math:`\Sigma_y` would do) gives 0.89x: less attenuation, still farther than complete
cases (the true x | z, y is not Gaussian). Use complete cases or a substantive-model-compatible
imputation when the interaction coefficient is the target.

Full conditionals (Appendix C), written once and used by both engines. With
:math:`w_i = 1/a_i`, :math:`\Lambda = \Sigma^{-1}` and :math:`r_i = f_i - \beta_D^T d_i` (the part of
the score that does not involve :math:`d_i`):

.. math::

    \theta \mid \text{rest} &\sim N(P^{-1} C^T\{y \odot (1 + w)\}, P^{-1}),
        \quad P = C^T \mathrm{diag}(w) C + \mathrm{diag}(\tau), \\
    1/a_i \mid \text{rest} &\sim \mathrm{InverseGaussian}(1/|1 - y_i f_i|, 1), \\
    d_{i,\mathcal M_i} \mid \text{rest} &\sim N(\Sigma_i h_i, \Sigma_i), \quad
        \Sigma_i^{-1} = [\Lambda + w_i \beta_D \beta_D^T]_{\mathcal M_i \mathcal M_i}, \\
    h_i &= [\Lambda\mu + y_i (1 + w_i) \beta_D - w_i r_i \beta_D
        - (\Lambda + w_i \beta_D\beta_D^T)_{\cdot,\mathcal O_i} d_{i,\mathcal O_i}]_{\mathcal M_i}, \\
    \mu \mid \text{rest} &\sim N\big((n\Lambda + \sigma_\mu^{-2} I)^{-1} \Lambda \textstyle\sum_i d_i,\;
        (n\Lambda + \sigma_\mu^{-2} I)^{-1}\big), \\
    \Sigma \mid \text{rest} &\sim IW\big(\Psi + \textstyle\sum_i (d_i - \mu)(d_i - \mu)^T, \nu + n\big),

and the inverse-gamma conditionals of the variances as in the linear model.

Mean-field VB (Algorithm 4) uses
:math:`q(\theta) q(\sigma^2) \prod_i q(a_i) \prod_{i \in \mathcal M} q(d_{i,\mathcal M_i}) q(\mu) q(\Sigma)`;
each optimal factor has the form above with the other blocks replaced by expectations:
:math:`w_i = \chi_i^{-1/2}`, :math:`\Lambda = E[\Sigma^{-1}] = (\nu + n)\Psi_q^{-1}`,
:math:`\beta_D\beta_D^T \to \Omega_{DD} = E[\beta_D\beta_D^T]`,
:math:`r_i\beta_D \to E[r_i \beta_D]` (which involves :math:`\mathrm{Cov}(\beta_D, \theta_{\text{rest}})`),
:math:`C^T W C \to \tilde C^T W \tilde C + \sum_i w_i \Sigma_{q(c_i)}`,
:math:`\chi_i = (1 - y_i \tilde c_i^T \mu_\theta)^2 + \tilde c_i^T \Sigma_\theta \tilde c_i
+ \mathrm{tr}(\Omega_{DD}\Sigma_{q(d_i)})`, :math:`q(\Sigma) = IW(\Psi_q, \nu + n)` with
:math:`\Psi_q = \Psi + n\Sigma_{q(\mu)} + \sum_i \{(\tilde d_i - \mu_{q(\mu)})(\tilde d_i - \mu_{q(\mu)})^T
+ \Sigma_{q(d_i)}\}`.

Typos in the paper (derived here and checked by the tests):

* Algorithm 4, line 3: :math:`\mu_{q(\beta,u)} = \Sigma_{q(\beta,u)} \tilde C^{T} (I + W) y` (the
  transpose is missing).
* Appendix C, :math:`\Sigma \mid` rest: the scale is
  :math:`\Psi + D^TD - n\bar d\mu^T - n\mu\bar d^T + n\mu\mu^T` (the paper's
  :math:`-2n\bar d\mu^T` is not symmetric); :math:`I_p` in the covariances of
  :math:`(\beta, u)` and :math:`\mu` should be :math:`I_d`.
* Algorithm 4 writes :math:`\mu_{q(\alpha^{-1})}` for :math:`\mu_{q(a^{-1})}`.
* With the defaults :math:`\nu = 3` and :math:`d = 4` (the acath model) the IW prior is improper
  (:math:`\nu \le d - 1`) and :math:`\log\Gamma_d(\nu/2)` in the paper's bound is infinite. The
  posterior stays proper (:math:`\nu + n > d - 1`); we use the unnormalized prior kernel and leave
  its normalizing constant out of the ELBO in that case (``ImputedSVMModel.prior_proper`` tells).

Structure and cost. Rows that share a missingness pattern :math:`\mathcal M` are processed together:
the precisions :math:`A + w_i B` (:math:`A = \Lambda_{\mathcal M\mathcal M}`,
:math:`B = (\Omega_{DD})_{\mathcal M\mathcal M}` or :math:`\beta_{\mathcal M}\beta_{\mathcal M}^T`) are
diagonalized once per pattern, :math:`A = LL^T`, :math:`L^{-1}BL^{-T} = U\,\mathrm{diag}(\lambda)U^T`,
so that :math:`(A + w_iB)^{-1} = V\mathrm{diag}\{1/(1 + w_i\lambda)\}V^T` with
:math:`V = L^{-T}U` for every row at once (no Python loop over rows). One sweep costs
:math:`O(n q_d^2 + n d^2 + \sum_{\text{patterns}} (m^3 + n_k m^2))`.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import pandas as pd
from scipy.special import multigammaln

from vbsvm import validation
from vbsvm.distributions import Gaussian, InverseWishart
from vbsvm.exceptions import InputError, InputTypeError
from vbsvm.formula.design import categorical_calls
from vbsvm.models import hinge
from vbsvm.models.linear import LinearSVMModel
from vbsvm.models.linear_algebra import CoefficientPosterior

__all__ = ["ImputedSVMModel", "CutImputedSVMModel", "Pattern", "Completion", "ImputationSpec", "hyperparameters",
           "imputation_columns", "imputation_spec", "DEFAULT_SIGMA2_MU", "DEFAULT_PSI", "DEFAULT_NU"]

LOG_2PI = float(np.log(2.0 * np.pi))
LOG_2 = float(np.log(2.0))

#: Paper defaults of the imputation model (Luts & Ormerod 2014, Section 3.3).
DEFAULT_SIGMA2_MU = 1e8
DEFAULT_PSI = 0.01
DEFAULT_NU = 3.0


# --------------------------------------------------------------------------- small algebra
def _chol_inv(A):
    """Inverse of a symmetric positive definite matrix through its Cholesky factor
    (numpy's LAPACK, like the linear model's hot loop)."""
    Linv = np.linalg.solve(np.linalg.cholesky(A), np.eye(A.shape[0]))
    return Linv.T @ Linv


def _logdet_pd(A) -> float:
    return float(2.0 * np.log(np.diag(np.linalg.cholesky(A))).sum())


def _tril(m):
    return np.tril_indices(m)


def _pack_logchol(A):
    """Lower Cholesky factor of ``A`` with log diagonal, as a vector (safe to extrapolate)."""
    L = np.linalg.cholesky(A)
    L[np.diag_indices_from(L)] = np.log(np.diag(L))
    return L[_tril(A.shape[0])]


def _unpack_logchol(v, m):
    L = np.zeros((m, m))
    L[_tril(m)] = v
    L[np.diag_indices(m)] = np.exp(np.diag(L))
    return L @ L.T


def _pattern_factor(A, B):
    r"""Simultaneous diagonalization of ``A + w B`` for all ``w >= 0``.

    Parameters
    ----------
    A : ndarray (m, m)
        Symmetric positive definite.
    B : ndarray (m, m)
        Symmetric positive semi-definite.

    Returns
    -------
    V : ndarray (m, m)
        With ``(A + w B)^{-1} = V diag(1 / (1 + w lam)) V^T``.
    lam : ndarray (m,)
        Generalized eigenvalues (clipped at 0).
    logdet_A : float
    """
    L = np.linalg.cholesky(A)
    Linv = np.linalg.solve(L, np.eye(A.shape[0]))
    K = Linv @ B @ Linv.T
    lam, U = np.linalg.eigh(0.5 * (K + K.T))
    lam = np.maximum(lam, 0.0)
    V = Linv.T @ U
    return V, lam, float(2.0 * np.log(np.diag(L)).sum())


class Pattern:
    """Rows sharing one missingness pattern.

    Attributes
    ----------
    rows : ndarray of int
        Row indices (into the data).
    pos : ndarray of int
        Positions of these rows among the incomplete rows.
    miss, obs : ndarray of int
        Missing and observed imputation-column indices (0..d-1).
    cells : ndarray (n_k, m) of int
        Position of each missing cell in the row-major list of missing cells.
    slopes : ndarray (n_k, m, a)
        Slopes of the rows' design entries on their missing cells over the affected columns
        (:meth:`Completion.slopes`).
    """

    def __init__(self, rows, pos, miss, obs, cells, slopes):
        self.rows, self.pos, self.miss, self.obs, self.cells = rows, pos, miss, obs, cells
        self.slopes = slopes

    @property
    def m(self) -> int:
        return self.miss.size


class ImputedSVMModel:
    """Blocks of the Bayesian SVM with missing predictors imputed (Algorithm 4, Appendix C).

    Parameters
    ----------
    X : ndarray (n, p)
        Fixed-effect design with NaN in the missing entries (standardized).
    y : ndarray (n,)
        Labels in {-1, +1}.
    groups : list of (codes, n_levels, name) or (codes, n_levels, name, Z)
        Random-effect terms, as in :class:`~vbsvm.models.linear.LinearSVMModel`; terms with
        slopes (``Z`` with q > 1 observed columns) need the conditional model.
    fixed_precision : ndarray (p,)
        As in :class:`~vbsvm.models.linear.LinearSVMModel` (NaN = under the inferred penalty).
    imp_cols : sequence of int
        Columns of ``X`` in the imputation model (the non-intercept columns); ignored when
        ``completion`` is given.
    A, B : float
        ``IG(A, B)`` prior of every inferred variance.
    sigma2_mu : float
        Prior variance of each entry of ``mu``.
    Psi : ndarray (d, d)
        Inverse-Wishart scale.
    nu : float
        Inverse-Wishart degrees of freedom (``nu <= d - 1`` is an improper prior; allowed).
    completion : Completion, optional
        The imputation variables and the design entries of their missing cells (from
        :meth:`ImputationSpec.completion`; interactions need it). Default: every column
        ``imp_cols`` is an imputation variable (:meth:`Completion.direct`).
    re_df, re_scale : float and (q, q) array, optional
        Inverse-Wishart prior of the random-effect covariances (terms with slopes), as in
        :class:`~vbsvm.models.linear.LinearSVMModel`.
    """

    def __init__(self, X, y, groups, fixed_precision, imp_cols, *, A=0.01, B=0.01,
                 sigma2_mu=DEFAULT_SIGMA2_MU, Psi=None, nu=DEFAULT_NU, completion=None, re_df=None, re_scale=None):
        X = np.asarray(X, dtype=float)
        n, p = X.shape
        self.n, self.p = n, p
        self.y = np.asarray(y, dtype=float)
        comp = self.completion = Completion.direct(X, imp_cols) if completion is None else completion
        self.imp_cols = comp.columns
        d = self.d = self.imp_cols.size
        if d == 0:
            raise InputError("missing='impute' needs at least one predictor column besides the intercept.")
        if type(self) is ImputedSVMModel and not comp.is_direct:
            raise InputError("the joint imputation model (imputation='joint') needs every imputation variable to be "
                             "a design column; imputed predictors in interactions need imputation='conditional'.")
        covered = np.zeros((n, p), dtype=bool)
        covered[comp.e_row, comp.e_col] = True
        if (np.isnan(X) & ~covered).any():
            raise InputError("only design entries that depend on a missing imputation variable can be imputed; "
                             f"columns {np.flatnonzero((np.isnan(X) & ~covered).any(axis=0)).tolist()} have other NaN.")
        D = comp.D
        self.mask = comp.mask
        self.D0 = np.where(self.mask, 0.0, D)
        self._D = self.D0.copy()
        self.linear = LinearSVMModel(np.where(np.isnan(X), 0.0, X), y, groups, fixed_precision, A=A, B=B,
                                     re_df=re_df, re_scale=re_scale)
        lin = self.linear
        if lin.covariance_components and type(self) is ImputedSVMModel:
            raise InputError("the joint imputation model (imputation='joint') does not support random slopes "
                             "(1 + x | g); use imputation='conditional' (the default), or random intercepts (1 | g).")
        #: flops of the largest product of a sweep, read by the engines' BLAS thread limit
        self.blas_work = lin.blas_work
        # the dense coordinates of theta that are not imputation columns (intercept, small factors)
        self.other_dense = np.setdiff1d(np.arange(lin.qd), self.imp_cols)
        # missing cells in row-major order
        self.cell_rows, self.cell_cols = comp.cell_rows, comp.cell_cols
        self.n_cells = self.cell_rows.size
        self.mcols = np.flatnonzero(self.mask.any(axis=0))
        self.dm = self.mcols.size
        self.mrows = np.flatnonzero(self.mask.any(axis=1))
        pos = -np.ones((n, d), dtype=np.int64)
        pos[self.cell_rows, self.cell_cols] = np.arange(self.n_cells)
        self.patterns: list[Pattern] = []
        if self.mrows.size:
            uniq, inverse = np.unique(self.mask[self.mrows], axis=0, return_inverse=True)
            inverse = np.asarray(inverse).ravel()
            for k, pat in enumerate(uniq):
                where = np.flatnonzero(inverse == k)
                rows = self.mrows[where]
                miss, obs = np.flatnonzero(pat), np.flatnonzero(~pat)
                self.patterns.append(Pattern(rows, where, miss, obs, pos[np.ix_(rows, miss)], comp.slopes(rows, miss)))
        #: design columns with entries that depend on missing cells (the slopes' last axis)
        self.affected = comp.affected
        # positions of the missing columns inside the (dm x dm) block
        self._mpos = -np.ones(d, dtype=np.int64)
        self._mpos[self.mcols] = np.arange(self.dm)
        # hyperparameters
        self.sigma2_mu = float(sigma2_mu)
        self.Psi = 0.01 * np.eye(d) if Psi is None else np.asarray(Psi, dtype=float)
        self.nu = float(nu)
        self.prior_proper = self.nu > d - 1
        self._logdet_Psi = _logdet_pd(self.Psi)
        # observed-data summaries used for starting values
        with np.errstate(invalid="ignore"):
            self.obs_mean = np.array([D[~self.mask[:, j], j].mean() for j in range(d)])
            self.obs_var = np.array([D[~self.mask[:, j], j].var() if (~self.mask[:, j]).sum() > 1 else 1.0
                                     for j in range(d)])
        self.obs_var = np.where(self.obs_var > 0, self.obs_var, 1.0)
        sizes = np.array([c.size for c in lin.variance_components], dtype=float)
        self._Aq = lin.A + sizes / 2.0
        k = len(lin.variance_components)
        self._slices = {}
        off = 0
        for name, size in (("log_chi", n), ("log_Bq", k), ("cells", self.n_cells),
                           ("S", self.dm * (self.dm + 1) // 2), ("mu", d), ("Psi_q", d * (d + 1) // 2)):
            self._slices[name] = slice(off, off + size)
            off += size
        self.state_size = off

    # ------------------------------------------------------------------ helpers
    def set_cells(self, values):
        """Write values of the missing cells into the imputation variables and the design of the
        coefficient block (every entry that depends on a cell, linear in it)."""
        if self.n_cells:
            self._D[self.cell_rows, self.cell_cols] = values
            self.completion.fill(self.linear.Cd, values)

    def current_D(self) -> np.ndarray:
        """The imputation variables as currently filled in (n x d copy)."""
        return self._D.copy()

    def design_cov(self, pattern, cov) -> np.ndarray:
        r"""Covariances of the completed design rows of a pattern over :attr:`affected`:
        :math:`\mathrm{Cov}(c_i) = S_i^T \mathrm{Cov}(d_{i,\mathcal M}) S_i` (``S_i`` the slopes,
        :meth:`Completion.slopes`), shape ``(n_k, a, a)``.

        Parameters
        ----------
        pattern : Pattern
        cov : ndarray (m, m) or (n_k, m, m)
            Covariance of the missing cells (shared by the pattern's rows, or one per row).
        """
        S = pattern.slopes
        if np.ndim(cov) == 2:
            return np.einsum("iak,ab,ibl->ikl", S, cov, S)
        return np.einsum("iak,iab,ibl->ikl", S, cov, S)

    def _embed(self, pattern, block, size="d"):
        """Place an (m x m) block of a pattern into a (d x d) or (dm x dm) matrix."""
        if size == "d":
            out = np.zeros((self.d, self.d))
            out[np.ix_(pattern.miss, pattern.miss)] = block
        else:
            ix = self._mpos[pattern.miss]
            out = np.zeros((self.dm, self.dm))
            out[np.ix_(ix, ix)] = block
        return out

    def missing_block(self, Lam, Lam_mu, w, beta_D, Omega_DD, r_beta):
        r"""Gaussian factor of every incomplete row's missing entries, pattern by pattern.

        The full conditional (Gibbs: current values) or the optimal q (VB: expectations) of
        :math:`d_{i,\mathcal M_i}`: precision :math:`[\Lambda + w_i\Omega_{DD}]_{\mathcal M\mathcal M}`,
        shift :math:`[\Lambda\mu + y_i(1 + w_i)\beta_D - w_i E(r_i\beta_D)
        - (\Lambda + w_i\Omega_{DD})_{\cdot\mathcal O} d_{i\mathcal O}]_{\mathcal M}`.

        Parameters
        ----------
        Lam : ndarray (d, d)
            ``Sigma^{-1}`` (Gibbs) or ``E[Sigma^{-1}]`` (VB).
        Lam_mu : ndarray (d,) or (n, d)
            ``Sigma^{-1} mu`` or ``E[Sigma^{-1}] E[mu]`` (one row per data row when the mean
            depends on the row, as in the conditional model).
        w : ndarray (n,)
            ``1/a_i`` or ``E[1/a_i]``.
        beta_D : ndarray (d,)
            Coefficients of the imputation columns (or their q-mean).
        Omega_DD : ndarray (d, d)
            ``beta_D beta_D^T`` or ``E[beta_D beta_D^T]``.
        r_beta : ndarray (n_incomplete, d)
            ``r_i beta_D`` or ``E[r_i beta_D]`` for the incomplete rows, ``r_i = f_i - beta_D^T d_i``.

        Returns
        -------
        list of dict
            One per pattern: ``mean`` (n_k, m), ``V`` (m, m), ``lam`` (m,), ``g`` (n_k, m) with
            ``cov_i = V diag(g_i) V^T``, ``logdet`` (n_k,) log-determinants of the covariances.
        """
        out = []
        for pat in self.patterns:
            M, O, R = pat.miss, pat.obs, pat.rows
            V, lam, logdet_A = _pattern_factor(Lam[np.ix_(M, M)], Omega_DD[np.ix_(M, M)])
            wR = w[R]
            base = Lam_mu[R][:, M] if np.ndim(Lam_mu) == 2 else Lam_mu[M]
            h = base + (self.y[R] * (1.0 + wR))[:, None] * beta_D[M] - wR[:, None] * r_beta[pat.pos][:, M]
            if O.size:
                dO = self.D0[np.ix_(R, O)]
                h = h - dO @ Lam[np.ix_(O, M)] - wR[:, None] * (dO @ Omega_DD[np.ix_(O, M)])
            g = 1.0 / (1.0 + wR[:, None] * lam[None, :])
            mean = ((h @ V) * g) @ V.T
            logdet = -logdet_A + np.log(g).sum(axis=1)
            out.append({"mean": mean, "V": V, "lam": lam, "g": g, "logdet": logdet})
        return out

    def mu_conditional(self, D, Lam) -> Gaussian:
        """Full conditional (Gibbs) / optimal q (VB) of ``mu`` given the filled-in ``D`` and
        ``Lam = Sigma^{-1}`` (or ``E[Sigma^{-1}]``)."""
        P = self.n * Lam + np.eye(self.d) / self.sigma2_mu
        return Gaussian(P, Lam @ D.sum(axis=0))

    def Sigma_conditional(self, scatter) -> InverseWishart:
        """``IW(Psi + scatter, nu + n)`` with ``scatter = sum_i E[(d_i - mu)(d_i - mu)^T]``."""
        return InverseWishart(self.Psi + scatter, self.nu + self.n)

    # ------------------------------------------------------------------ VB
    def _unpack(self, state):
        s = self._slices
        chi = np.exp(state[s["log_chi"]])
        Bq = np.exp(state[s["log_Bq"]])
        cells = state[s["cells"]]
        S = _unpack_logchol(state[s["S"]], self.dm) if self.dm else np.zeros((0, 0))
        mu = state[s["mu"]]
        Psi_q = _unpack_logchol(state[s["Psi_q"]], self.d)
        return chi, Bq, cells, S, mu, Psi_q

    def vb_initial_state(self):
        """Start: w = 1, E[1/sigma2] = 1, missing cells at the observed column means with
        the observed variances, q(mu) at the observed means, E[Sigma^{-1}] = diag(1/var)."""
        parts = [np.zeros(self.n), np.log(self._Aq), self.obs_mean[self.cell_cols]]
        if self.dm:
            counts = self.mask.sum(axis=0)[self.mcols]
            parts.append(_pack_logchol(np.diag(counts * self.obs_var[self.mcols])))
        parts.append(self.obs_mean.copy())
        parts.append(_pack_logchol(np.diag((self.nu + self.n) * self.obs_var)))
        return np.concatenate(parts)

    def vb_sweep(self, state):
        """One pass of Algorithm 4 from ``state``; returns ``(new_state, q, elbo)``.

        State: ``log chi``, ``log B_q``, the q-means of the missing cells, ``S = sum_i w_i
        Sigma_q(d_i)`` over the columns with missing values (log-Cholesky), ``mu_q(mu)`` and
        ``Psi_q`` (log-Cholesky): everything the sweep reads, in a form that SQUAREM may
        extrapolate. Order as in Algorithm 4: theta; d_i (with the previous w); chi; mu; Sigma;
        the variances.
        """
        lin = self.linear
        chi, Bq, cells, S, mu_prev, Psi_prev = self._unpack(state)
        w = hinge.expected_inverse(chi)
        tau = lin.prior_precision(self._Aq / Bq)
        self.set_cells(cells)
        extra = np.zeros((lin.qd, lin.qd))
        if self.dm:
            mcd = self.imp_cols[self.mcols]
            extra[np.ix_(mcd, mcd)] = S
        post = CoefficientPosterior(lin, w, tau, hinge.working_response(self.y, w), extra_precision=extra)
        mean = post.mean
        dcov = post.diag_cov()
        covd = post.cov_dense()
        # -- q(d_i, M_i) for every incomplete row (Algorithm 4, lines 5-9)
        Lam_prev = (self.nu + self.n) * _chol_inv(Psi_prev)
        muD = mean[self.imp_cols]
        Omega = covd[np.ix_(self.imp_cols, self.imp_cols)] + np.outer(muD, muD)
        blocks = self.missing_block(Lam_prev, Lam_prev @ mu_prev, w, muD, Omega, self._r_beta_vb(post, mean, covd))
        new_cells = cells.copy()
        for pat, blk in zip(self.patterns, blocks):
            new_cells[pat.cells] = blk["mean"]
        self.set_cells(new_cells)
        # -- chi (line 10): Var(f_i) gains tr(Omega_MM Sigma_q(d_i)) = sum_k g_ik lam_k
        mf, vf = post.linear_predictor()
        for pat, blk in zip(self.patterns, blocks):
            vf[pat.rows] += blk["g"] @ blk["lam"]
        chi_new = hinge.update_chi(self.y, mf, vf)
        w_new = hinge.expected_inverse(chi_new)
        # -- q(mu), q(Sigma) (lines 13-14)
        D = self.current_D()
        sum_cov = np.zeros((self.d, self.d))
        S_new = np.zeros((self.dm, self.dm))
        for pat, blk in zip(self.patterns, blocks):
            V = blk["V"]
            sum_cov += self._embed(pat, (V * blk["g"].sum(axis=0)) @ V.T)
            S_new += self._embed(pat, (V * (w_new[pat.rows] @ blk["g"])) @ V.T, size="m")
        q_mu = self.mu_conditional(D, Lam_prev)
        mu_mean, mu_cov = q_mu.mean(), q_mu.cov()
        resid = D - mu_mean
        scatter = resid.T @ resid + sum_cov + self.n * mu_cov
        q_Sigma = self.Sigma_conditional(scatter)
        # -- variances (line 15)
        q_var = lin.variance_posterior(lin.second_moments(mean, dcov))
        q = {"theta": post, "theta_mean": mean, "theta_var": dcov, "theta_cov_dense": covd,
             "chi": chi_new, "variances": q_var, "mean_f": mf, "var_f": vf,
             "cells_mean": new_cells, "blocks": blocks, "D_mean": D, "sum_cov": sum_cov,
             "mu": q_mu, "mu_mean": mu_mean, "mu_cov": mu_cov, "Sigma": q_Sigma}
        parts = [np.log(chi_new), np.log(q_var.b) if lin.variance_components else np.zeros(0), new_cells]
        if self.dm:
            parts.append(_pack_logchol(S_new))
        parts += [mu_mean, _pack_logchol(q_Sigma.scale)]
        return np.concatenate(parts), q, self.elbo(q)

    def _r_beta_vb(self, post, mean, covd):
        """``E_q[r_i beta_D]`` for the incomplete rows, ``r_i`` the score without the imputation
        columns: ``Cov(beta_D, r_i) + E[r_i] mu_D`` (the paper's ``[Omega]_{-1,1}`` generalized
        to other non-imputed columns and random intercepts)."""
        lin = self.linear
        rows = self.mrows
        if rows.size == 0:
            return np.zeros((0, self.d))
        Cn = lin.Cd[np.ix_(rows, self.other_dense)]
        Er = Cn @ mean[self.other_dense]
        cross = Cn @ covd[np.ix_(self.other_dense, self.imp_cols)]
        if lin.m_sparse:
            codes = lin.codes[rows]
            Er = Er + post.mean_sparse[codes]
            cross = cross + post.cov_dense_sparse()[self.imp_cols][:, codes].T
        return cross + Er[:, None] * mean[self.imp_cols][None, :]

    def elbo(self, q) -> float:
        """Full evidence lower bound ``log p(y, D_obs; q)`` (all constants; see module docstring
        for the improper-prior case) of a complete q."""
        value = self.linear.elbo(q)  # hinge terms, coefficient prior/entropy, variances
        n, d = self.n, self.d
        qS: InverseWishart = q["Sigma"]
        Lam = qS.mean_inv()
        e_logdet = qS.mean_logdet()
        resid = q["D_mean"] - q["mu_mean"]
        scatter = resid.T @ resid + q["sum_cov"] + n * q["mu_cov"]
        # E log N(d_i; mu, Sigma), all rows
        value += -0.5 * n * d * LOG_2PI - 0.5 * n * e_logdet - 0.5 * float(np.sum(Lam * scatter))
        # E log p(mu) + H[q(mu)]
        value += (-0.5 * d * (LOG_2PI + np.log(self.sigma2_mu))
                  - (q["mu_mean"] @ q["mu_mean"] + np.trace(q["mu_cov"])) / (2.0 * self.sigma2_mu)
                  + 0.5 * d * (1.0 + LOG_2PI) + 0.5 * _logdet_pd(q["mu_cov"]))
        # E log p(Sigma) + H[q(Sigma)]
        value += -0.5 * (self.nu + d + 1.0) * e_logdet - 0.5 * float(np.sum(self.Psi * Lam))
        if self.prior_proper:
            value -= 0.5 * self.nu * d * LOG_2 + multigammaln(0.5 * self.nu, d) - 0.5 * self.nu * self._logdet_Psi
        value += qS.entropy()
        # H[q(d_i, M_i)]
        for blk in q["blocks"]:
            m = blk["g"].shape[1]
            value += 0.5 * m * (1.0 + LOG_2PI) * blk["g"].shape[0] + 0.5 * float(blk["logdet"].sum())
        return float(value)

    # ------------------------------------------------------------------ Gibbs
    def gibbs_initial_state(self, rng):
        """Dispersed start: missing cells drawn from N(observed mean, observed variance)."""
        cells = (self.obs_mean[self.cell_cols]
                 + np.sqrt(self.obs_var[self.cell_cols]) * rng.standard_normal(self.n_cells))
        return {"cells": cells, "w": np.ones(self.n), "tau": np.ones(len(self.linear.variance_components)),
                "Lam": [np.eye(c.index.shape[1]) for c in self.linear.covariance_components],
                "mu": self.obs_mean.copy(), "Lam_imp": np.diag(1.0 / self.obs_var)}

    def gibbs_sweep(self, state, rng):
        """theta | rest; 1/a | rest; variances | theta; D_mis | rest; mu | rest; Sigma | rest."""
        lin = self.linear
        self.set_cells(state["cells"])
        scan = lin.gibbs_sweep(state, rng)  # theta | rest, 1/a | rest, variances | theta
        theta, f, w, sigma2 = scan["theta"], scan["f"], scan["w"], scan["sigma2"]
        Lam, mu = state["Lam_imp"], state["mu"]
        cells = self.sample_missing(theta, f, w, mu, Lam, state["cells"], rng)
        self.set_cells(cells)
        D = self.current_D()
        mu = self.mu_conditional(D, Lam).sample(rng)
        resid = D - mu
        Sigma = self.Sigma_conditional(resid.T @ resid).sample(rng)
        Lam = _chol_inv(Sigma)
        f = lin.predictor(theta)
        return {"cells": cells, "w": w, "tau": 1.0 / sigma2, "mu": mu, "Lam_imp": Lam, "Lam": scan["Lam"],
                "theta": theta, "sigma2": sigma2, "x_missing": cells, "Sigma": Sigma,
                "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum()}

    def gibbs_missing_conditional(self, theta, f, w, mu, Lam):
        """The full conditionals of the missing cells (see :meth:`missing_block`), given the
        current theta, the scores ``f = C theta`` computed with the current cells, ``w = 1/a``,
        ``mu`` and ``Lam = Sigma^{-1}``."""
        beta_D = theta[self.imp_cols]
        D = self.current_D()
        rows = self.mrows
        r = f[rows] - D[rows] @ beta_D
        return self.missing_block(Lam, Lam @ mu, w, beta_D, np.outer(beta_D, beta_D), r[:, None] * beta_D[None, :])

    def sample_missing(self, theta, f, w, mu, Lam, cells, rng):
        """One draw of every missing cell from its full conditional (row blocks are independent)."""
        return self._draw_blocks(self.gibbs_missing_conditional(theta, f, w, mu, Lam), cells, rng)

    def _draw_blocks(self, blocks, cells, rng):
        """Draw every missing cell from the Gaussian row blocks of :meth:`missing_block`."""
        new = np.array(cells, copy=True)
        for pat, blk in zip(self.patterns, blocks):
            z = rng.standard_normal(blk["g"].shape)
            new[pat.cells] = blk["mean"] + (np.sqrt(blk["g"]) * z) @ blk["V"].T
        return new


#: Default sweeps of the SVM block per draw of the imputations in the cut Gibbs sampler
#: (:class:`CutImputedSVMModel`; ``settings["cut_svm_sweeps"]``). On acath, with plain
#: augmented inner sweeps (no block move), 10 sweeps left the sds 7-10% below the multiple-imputation
#: reference and 25 within its Monte Carlo error; 20 cost about 3x the naive sampler's time and
#: gave the most effective draws per second. With the tuned block move in the inner sweeps (4 x
#: 1000 after 1000, seeds 1-2), against a reference of 100 completions (about 0.09 sd of Monte
#: Carlo error in its means), 5, 10 and 20 sweeps put the sds at 0.84-0.92, 0.89-0.93 and
#: 0.92-0.95 of the reference (``cad_dur``, which the completions hardly move, 0.99-1.06) and the
#: means within 0.14, 0.13 and 0.04 of its sds; 5 and 10 sweeps took 36% and 59% of the time of
#: 20, and 20 plain sweeps 14% more than 20 with the block move. Hence 20.
CUT_SVM_SWEEPS = 20


class CutImputedSVMModel(ImputedSVMModel):
    r"""The conditional imputation model, cut from the SVM (``imputation="conditional"``).

    Model. With :math:`c_i \in \{0, 1\}` the class of row i (:math:`y_i = -1, +1`),

    .. math::

        d_i \mid y_i, m, \Sigma \overset{ind.}{\sim} N(m_{c_i}, \Sigma), \quad
        m_0, m_1 \overset{iid}{\sim} N(0, \sigma_\mu^2 I_d), \quad \Sigma \sim IW(\Psi, \nu),

    i.e. a Gaussian model of the predictors with the label as a covariate
    (:math:`\mu = (m_0 + m_1)/2`, label effect :math:`\gamma = (m_1 - m_0)/2`); a missing cell is
    imputed from its regression on the row's observed predictors **and its label**. The SVM
    blocks (:math:`\theta`, :math:`a`, variances) are those of the linear model given the
    completed design. The hinge pseudo-likelihood does not feed back into
    :math:`(D_{mis}, m, \Sigma)`: this is a *cut* (Plummer 2015), whose target is

    .. math::

        p_{cut}(\theta, D_{mis}, m, \Sigma) = p(D_{mis}, m, \Sigma \mid D_{obs}, y)\,
            p(\theta \mid y, D_{obs}, D_{mis}).

    Full conditionals of the imputation block (no :math:`\theta`, no :math:`a`):

    .. math::

        d_{i,\mathcal M_i} \mid \text{rest} &\sim N(\Sigma_i h_i, \Sigma_i), \quad
            \Sigma_i^{-1} = \Lambda_{\mathcal M_i\mathcal M_i}, \quad
            h_i = [\Lambda m_{c_i} - \Lambda_{\cdot\mathcal O_i} d_{i,\mathcal O_i}]_{\mathcal M_i}, \\
        m_c \mid \text{rest} &\sim N\big((n_c\Lambda + \sigma_\mu^{-2} I)^{-1}\Lambda
            \textstyle\sum_{i: c_i = c} d_i,\; (n_c\Lambda + \sigma_\mu^{-2} I)^{-1}\big), \\
        \Sigma \mid \text{rest} &\sim IW\big(\Psi + \textstyle\sum_i (d_i - m_{c_i})(d_i - m_{c_i})^T,
            \nu + n\big),

    (:meth:`ImputedSVMModel.missing_block` with :math:`w = 0`, :math:`\beta_D = 0`).

    **Gibbs** (:meth:`gibbs_sweep`): one sweep draws :math:`D_{mis}, m, \Sigma` from the conditionals
    above, then runs :attr:`svm_sweeps` sweeps of the SVM block given that completed design: the
    linear model's own sweep (:meth:`vbsvm.models.linear.LinearSVMModel.gibbs_sweep`) with the
    state it passes on, so the fixed effects' independence or HMC move and the partially
    non-centred variance moves that its tuning fits (:meth:`gibbs_adapt`) are used here too. The
    imputation chain is an exact
    Gibbs sampler of :math:`p(D_{mis}, m, \Sigma \mid D_{obs}, y)`; each SVM sweep is a kernel whose
    stationary law is :math:`p(\theta \mid y, D)` for the current completion (its proposals are
    fixed after tuning and its acceptance ratios use the current design), so the sampler is
    exact as the inner run mixes (Plummer 2015, Section 3, "nested MCMC"). With one inner sweep
    (the "naive" cut sampler) theta lags behind the completions and the spread they add is lost:
    on ``acath`` (1246 of 3504 cholesterol values missing, the completions' spread of the
    coefficients twice their spread given one completion) the naive sampler's sds were 0.72-0.81
    of the multiple-imputation reference (20 completions from the imputation posterior, each fitted
    by Gibbs, draws pooled) and its min bulk ESS 22 in 2 x 1000 draws; with 4, 10 and 25 inner
    sweeps 0.85-0.88, 0.90-0.93 and 1.01-1.09 (the reference carries about 8% Monte Carlo error in
    its sds), ESS 212, 434 and 650 (``cholesterol`` and the intercept; ``cad_dur``, which the
    completions hardly move, 0.90-0.96 throughout); those were plain augmented inner sweeps (for
    the tuned ones see :data:`CUT_SVM_SWEEPS`). Checked against multiple imputation in
    ``tests/test_missing.py``.

    **VB** (:meth:`vb_sweep`): the imputation model's mean-field
    :math:`q(m_0)q(m_1)q(\Sigma)\prod_i q(d_{i,\mathcal M_i})` is fitted first, alone
    (:meth:`fit_imputation_vb`: :math:`q(d_{i\mathcal M}) = N(\cdot, E[\Lambda]_{\mathcal M\mathcal M}^{-1})`,
    :math:`q(m_c)`, :math:`q(\Sigma) = IW(\Psi + E\sum_i (d_i - m_{c_i})(\cdot)^T, \nu + n)`); then the
    SVM's factors are Algorithm 2's with expectations over the fixed :math:`q(D_{mis})`:
    :math:`C^TWC \to \tilde C^TW\tilde C + \sum_i w_i \mathrm{Cov}_q(c_i)`,
    :math:`\chi_i = (1 - y_i\tilde c_i^T\mu_\theta)^2 + \tilde c_i^T\Sigma_\theta\tilde c_i
    + \mathrm{tr}\{(\Sigma_\theta + \mu_\theta\mu_\theta^T)\mathrm{Cov}_q(c_i)\}`, with
    :math:`\mathrm{Cov}_q(c_i) = S_i^T \mathrm{Cov}_q(d_{i\mathcal M}) S_i` (module docstring,
    *Interactions*; :meth:`ImputedSVMModel.design_cov`). The reported ELBO is the
    SVM part's bound given :math:`q(D_{mis})`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cls = (self.y > 0).astype(np.int64)
        self.n_class = np.bincount(self.cls, minlength=2)
        self.state_size = self.linear.vb_initial_state().size
        self.imputation_q = None
        #: the SVM block given the completed design: the linear model, or a model built on it
        #: (:class:`~vbsvm.models.selection.LaplaceZeroModel` with ``base=self.linear``)
        self.svm = self.linear
        #: sweeps of the SVM block per draw of the imputation block (Gibbs; see the class docstring)
        self.svm_sweeps = CUT_SVM_SWEEPS

    # ------------------------------------------------------------------ imputation block
    def class_means_conditional(self, D, Lam) -> list:
        """Full conditionals (Gibbs) / optimal q (VB) of ``m_0`` and ``m_1`` (classes -1, +1)."""
        sums = np.stack([D[self.cls == c].sum(axis=0) for c in (0, 1)])
        return [Gaussian(self.n_class[c] * Lam + np.eye(self.d) / self.sigma2_mu, Lam @ sums[c]) for c in (0, 1)]

    def imputation_blocks(self, Lam, means) -> list:
        """Gaussian blocks of the missing cells given ``Lam = Sigma^{-1}`` and the class means
        ``means`` (2, d): :meth:`missing_block` without the hinge (``w = 0``, ``beta_D = 0``)."""
        d = self.d
        return self.missing_block(Lam, (means @ Lam)[self.cls], np.zeros(self.n), np.zeros(d),
                                  np.zeros((d, d)), np.zeros((self.mrows.size, d)))

    def _scatter(self, D, means, sum_cov=0.0, mean_covs=None):
        resid = D - means[self.cls]
        out = resid.T @ resid + sum_cov
        if mean_covs is not None:
            out = out + self.n_class[0] * mean_covs[0] + self.n_class[1] * mean_covs[1]
        return out

    def fit_imputation_vb(self, tol=1e-10, max_iter=2000) -> dict:
        """Mean-field VB of the imputation model alone (coordinate ascent to a fixed point).

        Returns
        -------
        dict
            ``cells`` (q-means of the missing cells), ``blocks`` (per pattern: ``V``, ``g`` with
            ``Cov = V diag(g) V^T``), ``cov`` (per pattern covariance), ``means`` (2, d) and
            ``mean_covs`` (2, d, d) of ``q(m_c)``, ``Sigma`` (``q(Sigma)``), ``iterations``,
            ``converged``.
        """
        means = np.tile(self.obs_mean, (2, 1))
        Psi_q = np.diag((self.nu + self.n) * self.obs_var)
        self.set_cells(self.obs_mean[self.cell_cols])
        old = None
        converged = False
        for it in range(1, max_iter + 1):
            Lam = (self.nu + self.n) * _chol_inv(Psi_q)
            blocks = self.imputation_blocks(Lam, means)
            cells = np.zeros(self.n_cells)
            sum_cov = np.zeros((self.d, self.d))
            for pat, blk in zip(self.patterns, blocks):
                cells[pat.cells] = blk["mean"]
                sum_cov += self._embed(pat, (blk["V"] * blk["g"].sum(axis=0)) @ blk["V"].T)
            self.set_cells(cells)
            D = self.current_D()
            q_m = self.class_means_conditional(D, Lam)
            means = np.stack([g.mean() for g in q_m])
            mean_covs = np.stack([g.cov() for g in q_m])
            q_S = self.Sigma_conditional(self._scatter(D, means, sum_cov, mean_covs))
            Psi_q = q_S.scale
            new = np.concatenate([cells, means.ravel(), Psi_q.ravel()])
            if old is not None and np.max(np.abs(new - old)) <= tol * (1.0 + np.max(np.abs(new))):
                converged = True
                break
            old = new
        covs = [blk["V"] @ blk["V"].T * 1.0 for blk in blocks]  # g = 1: Cov = Lam_MM^{-1}
        return {"cells": cells, "blocks": blocks, "cov": covs, "means": means, "mean_covs": mean_covs,
                "Sigma": q_S, "iterations": it, "converged": converged}

    # ------------------------------------------------------------------ VB
    def vb_initial_state(self):
        """Fits the imputation q (once), then starts the SVM as the linear model does (w = 1,
        E[1/sigma2] = 1, E[Sigma_k^{-1}] = I)."""
        if self.imputation_q is None:
            self.imputation_q = self.fit_imputation_vb()
        return self.linear.vb_initial_state()

    def vb_sweep(self, state):
        """One pass of the SVM's factors given the fixed ``q(D_mis)``; returns ``(state, q, elbo)``."""
        lin, iq = self.linear, self.imputation_q
        chi, Bq, q_cov = lin._unpack_state(state)
        w = hinge.expected_inverse(chi)
        tau = lin.prior_precision(self._Aq / Bq)
        self.set_cells(iq["cells"])
        aff = self.affected
        covs = [self.design_cov(pat, cov) for pat, cov in zip(self.patterns, iq["cov"])]  # Cov_q(c_i)
        extra = np.zeros((lin.qd, lin.qd))
        if self.dm:
            extra[np.ix_(aff, aff)] = sum(np.einsum("i,ikl->kl", w[pat.rows], T) for pat, T in zip(self.patterns, covs))
        post = CoefficientPosterior(lin, w, tau, hinge.working_response(self.y, w), extra_precision=extra,
                                    blocks=lin.prior_blocks([qc.mean_inv() for qc in q_cov]))
        mean, dcov, covd = post.mean, post.diag_cov(), post.cov_dense()
        Omega = covd[np.ix_(aff, aff)] + np.outer(mean[aff], mean[aff])  # E[theta theta^T] on those columns
        mf, vf = post.linear_predictor()
        for pat, T in zip(self.patterns, covs):
            vf[pat.rows] += np.einsum("ikl,kl->i", T, Omega)
        chi_new = hinge.update_chi(self.y, mf, vf)
        q_var = lin.variance_posterior(lin.second_moments(mean, dcov))
        scatters, q_cov = lin.vb_covariances(post, mean)
        means, mean_covs = iq["means"], iq["mean_covs"]
        q = {"theta": post, "theta_mean": mean, "theta_var": dcov, "theta_cov_dense": covd,
             "chi": chi_new, "variances": q_var, "covariances": q_cov, "scatters": scatters,
             "mean_f": mf, "var_f": vf,
             "cells_mean": iq["cells"], "blocks": iq["blocks"], "Sigma": iq["Sigma"],
             "class_means": means, "class_mean_covs": mean_covs,
             "mu_mean": means.mean(axis=0), "mu_cov": mean_covs.sum(axis=0) / 4.0}
        new_state = np.concatenate([np.log(chi_new), np.log(q_var.b) if lin.variance_components else np.zeros(0),
                                    lin.pack_covariances(q_cov)])
        return new_state, q, lin.elbo(q)

    # ------------------------------------------------------------------ Gibbs
    def gibbs_initial_state(self, rng):
        """Dispersed start of the missing cells (see :class:`ImputedSVMModel`), class means at
        the observed means."""
        state = super().gibbs_initial_state(rng)
        state["means"] = np.tile(self.obs_mean, (2, 1))
        state.pop("mu")
        if self.svm is not self.linear:
            state["svm"] = self.svm.gibbs_initial_state(rng)
        else:  # the linear block's tuners (its block moves, the exponents of its levels)
            state = {**self.linear.gibbs_initial_state(rng), **state}
        return state

    def gibbs_sweep(self, state, rng):
        """D_mis | m, Sigma; m | D; Sigma | D, m (the imputation chain); then :attr:`svm_sweeps`
        sweeps of the SVM block given the completed design, after the scores and ``1/a | theta``
        for the new design."""
        Lam = state["Lam_imp"]
        cells = self._draw_blocks(self.imputation_blocks(Lam, state["means"]), state["cells"], rng)
        self.set_cells(cells)
        D = self.current_D()
        means = np.stack([g.sample(rng) for g in self.class_means_conditional(D, Lam)])
        Sigma = self.Sigma_conditional(self._scatter(D, means)).sample(rng)
        Lam = _chol_inv(Sigma)
        imputation = {"cells": cells, "means": means, "Lam_imp": Lam, "x_missing": cells, "Sigma": Sigma,
                      "mu": means.mean(axis=0), "gamma": 0.5 * (means[1] - means[0])}
        if self.svm is not self.linear:
            return {**imputation, **self._svm_gibbs_step(state["svm"], rng)}
        scan = {k: v for k, v in state.items() if k not in imputation}
        if "theta" in state:  # the scores and 1/a | theta for the new D: keeps (theta, a) | D's law invariant
            scan["f"] = self.linear.predictor(state["theta"])
            scan["w"] = hinge.sample_inverse(self.y, scan["f"], rng)
        for _ in range(self.svm_sweeps):
            scan = self.linear.gibbs_sweep(scan, rng)
        return {**scan, **imputation}

    def _svm_gibbs_step(self, svm_state, rng):
        """One sweep of the SVM block's own sampler (:attr:`svm`, e.g. Appendix B of the
        Laplace-zero model) given the completed design, after ``1/a | u`` for the new design.
        Its state is kept under ``"svm"``; the indicators are recorded as ``"incl"`` (``"gamma"``
        is the label effect of the imputation model)."""
        state = dict(svm_state)
        self.svm.refresh_design()  # its X^T X (the coefficient moves' directions) for the new completion
        if "u" in state:  # 1/a | effective coefficients, new D (as for the linear block)
            state["w"] = hinge.sample_inverse(self.y, self.linear.predictor(state["u"]), rng)
        for _ in range(self.svm_sweeps):
            state = self.svm.gibbs_sweep(state, rng)
        return {"svm": state, "u": state["u"], "incl": state["gamma"], "sigma2": state["sigma2"],
                "cov": state["cov"], "log_pseudo_likelihood": state["log_pseudo_likelihood"]}

    def gibbs_adapt(self, state, it, tune):
        """Called by the engine after each tuning sweep: the SVM block's own tuning
        (Laplace-zero: the add/delete proposals and the recorded models of its jumps, see
        :meth:`vbsvm.models.selection.LaplaceZeroModel.gibbs_adapt`), fed the block's state after
        the sweep's last inner sweep; the linear block's (:meth:`vbsvm.models.linear.LinearSVMModel.gibbs_adapt`:
        the fixed effects' independence or HMC move, the exponents of the partially non-centred
        variance moves), fed the state itself.

        Each inner sweep given the completed design is then the SVM model's own kernel (the
        Laplace-zero model's add/delete moves and jumps, or the linear model's block move)
        with its proposals fixed after tuning (fitted on the completions of the tuning sweeps)
        and every acceptance ratio computed on the current completion, so it keeps
        ``p(theta | y, D)`` (``p(theta, gamma | y, D)``) invariant for each D."""
        if self.svm is self.linear:
            return self.linear.gibbs_adapt(state, it, tune)
        return {**state, "svm": self.svm.gibbs_adapt(state["svm"], it, tune)}

    def gibbs_pool(self, states):
        """Called by the engine once every chain has tuned: the Laplace-zero block's list of
        models to jump between, pooled over all chains
        (:meth:`vbsvm.models.selection.LaplaceZeroModel.gibbs_pool`)."""
        if self.svm is self.linear:
            return states
        pooled = self.svm.gibbs_pool([None if s is None else s["svm"] for s in states])
        return [None if s is None else {**s, "svm": p} for s, p in zip(states, pooled)]


# --------------------------------------------------------------------------- checks and settings
def imputation_columns(design) -> np.ndarray:
    """Columns of ``design.X`` in the imputation model when every imputation variable is a design
    column (no imputed predictor in an interaction): every non-intercept column."""
    return np.flatnonzero(design.penalized)


class Completion:
    r"""The imputation variables of a data set and the design entries their missing cells set.

    Every design entry that depends on a missing cell is linear in it,
    ``c_ij = e_off + e_slope * d_ik`` (see the module docstring, *Interactions*).

    Parameters
    ----------
    D : ndarray (n, d)
        The imputation variables, NaN in the missing cells.
    columns : ndarray (d,) of int
        Design column of each variable (-1: a raw predictor that enters interactions).
    e_cell, e_col : ndarray of int
        For every design entry that depends on a missing cell: the cell (its position in the
        row-major list ``np.nonzero(np.isnan(D))``) and the design column; its row is the cell's.
    e_off, e_slope : ndarray
        The entry is ``e_off + e_slope * d`` for the cell's value ``d``.
    """

    def __init__(self, D, columns, e_cell, e_col, e_off, e_slope):
        self.D = D
        self.columns = np.asarray(columns, dtype=np.int64)
        self.mask = np.isnan(D)
        self.cell_rows, self.cell_cols = np.nonzero(self.mask)
        self.e_cell, self.e_col = np.asarray(e_cell, dtype=np.int64), np.asarray(e_col, dtype=np.int64)
        self.e_off, self.e_slope = np.asarray(e_off, dtype=float), np.asarray(e_slope, dtype=float)
        self.e_row = self.cell_rows[self.e_cell]
        #: design columns with an entry that depends on a missing cell
        self.affected = np.unique(self.e_col)

    @classmethod
    def direct(cls, X, imp_cols):
        """Every imputation variable is the design column ``imp_cols[k]`` (entries ``0 + 1 d``)."""
        imp_cols = np.asarray(imp_cols, dtype=np.int64)
        D = np.asarray(X, dtype=float)[:, imp_cols]
        cols = np.nonzero(np.isnan(D))[1]
        return cls(D, imp_cols, np.arange(cols.size), imp_cols[cols], np.zeros(cols.size), np.ones(cols.size))

    @property
    def is_direct(self) -> bool:
        """True if every imputation variable is a design column (no interactions)."""
        return bool(np.all(self.columns >= 0))

    def fill(self, X, values):
        """Write the design entries of the missing cells at ``values`` (row-major cell order)
        into ``X`` (in place; ``values = 0`` writes the offsets)."""
        values = np.broadcast_to(values, self.cell_rows.shape)
        X[self.e_row, self.e_col] = self.e_off + self.e_slope * values[self.e_cell]

    def slopes(self, rows, miss) -> np.ndarray:
        r"""Slopes of the design entries of ``rows`` (rows sharing the missing variables
        ``miss``) on their missing cells: ``S[r, a, k] = dc_{r, affected[k]} / dd_{r, miss[a]}``,
        shape ``(len(rows), len(miss), len(affected))``, so that
        :math:`\mathrm{Cov}(c_r) = S_r^T \mathrm{Cov}(d_{r,M}) S_r` on the :attr:`affected` columns."""
        columns = self.affected
        rpos = -np.ones(self.D.shape[0], dtype=np.int64)
        rpos[rows] = np.arange(len(rows))
        vpos = -np.ones(self.D.shape[1], dtype=np.int64)
        vpos[miss] = np.arange(len(miss))
        cpos = -np.ones(int(self.e_col.max(initial=-1)) + 1, dtype=np.int64)
        cpos[columns] = np.arange(len(columns))
        sel = np.flatnonzero(rpos[self.e_row] >= 0)
        S = np.zeros((len(rows), len(miss), len(columns)))
        S[rpos[self.e_row[sel]], vpos[self.cell_cols[self.e_cell[sel]]], cpos[self.e_col[sel]]] = self.e_slope[sel]
        return S


def _column_variables(design) -> list:
    """The raw predictors each column of ``design.X`` depends on (list of sets)."""
    spec, raw = design.spec, set(design.raw.columns)
    if not hasattr(spec, "structure"):  # a plain sum of numeric columns
        return [set() if name == "Intercept" else {name} for name in design.column_names]
    by_name = {}
    for s in spec.structure:
        found = {str(v) for v in spec.term_variables[s.term] if v.source == "data"} & raw
        by_name.update({c: found for c in s.columns})
    return [by_name[c] for c in design.column_names]


def _with_value(frame, var, value):
    out = frame.copy()
    out[var] = float(value)
    return out


def _new_X(design, frame, standardized):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return design.new_X(frame, allow_missing=True, standardized=standardized)


class ImputationSpec:
    r"""The variables of the imputation model of a design and how the design depends on them.

    An imputation variable is either a non-intercept design column that involves no
    *interacted* predictor (a predictor with missing values entering one column of any
    transformation is imputed on that column's scale, e.g. ``np.log(chol)``), or an interacted
    raw predictor: a numeric predictor entering several columns or a column with other
    predictors (``x * z``, ``x:C(g)``), every one of them linear in it. Build with
    :func:`imputation_spec`.

    Attributes
    ----------
    names : list of str
        Design column name, or the predictor's name for an interacted predictor.
    columns : ndarray (d,) of int
        Design column of each variable, -1 for an interacted predictor.
    variables : list
        The interacted predictor's name, None for a design column.
    center, scale : ndarray (d,)
        The model's scale of each variable, ``(value - center) / scale``: the design's
        standardization for a column, the observed mean and sd (``ddof=1``) of an interacted
        predictor (0 and 1 with ``standardize=False``). Fixed by the training data.
    linear_columns : dict
        Variable index -> design columns that depend on that interacted predictor.
    nonlinear : dict
        Numeric predictors observed in training that enter a design column nonlinearly and with
        other columns (``x + I(x**2)``): name -> those columns; missing values there cannot be
        imputed at prediction time.
    probe : dict
        Interacted predictor -> (observed mean, sd): the two values at which
        :meth:`completion` evaluates the formula to find each entry's offset and slope.
    """

    def __init__(self, names, columns, variables, center, scale, linear_columns, nonlinear, probe):
        self.names, self.variables = names, variables
        self.columns = np.asarray(columns, dtype=np.int64)
        self.center, self.scale = np.asarray(center, dtype=float), np.asarray(scale, dtype=float)
        self.linear_columns, self.nonlinear, self.probe = linear_columns, nonlinear, probe

    @property
    def d(self) -> int:
        return len(self.names)

    def completion(self, design, frame, X, standardized=True) -> Completion:
        """The imputation variables of ``frame`` and the design entries of its missing cells.

        Parameters
        ----------
        design : vbsvm.formula.design.Design
        frame : pandas.DataFrame
            The training rows (``design.raw``) or new data.
        X : ndarray (n, p)
            ``design.new_X(frame, allow_missing=True, standardized=standardized)``.
        standardized : bool
            The model's scale (True) or the original scale of the design columns and predictors.

        Returns
        -------
        Completion
        """
        for v, cols in self.nonlinear.items():
            if frame[v].isna().any():
                raise InputError(
                    f"predictor {v!r} is missing in {int(frame[v].isna().sum())} row(s) but enters the design "
                    f"nonlinearly through {cols}, so it cannot be imputed; fill {v!r} in those rows or drop them.")
        n, d = len(frame), self.d
        D = np.empty((n, d))
        for k in range(d):
            if self.columns[k] >= 0:
                D[:, k] = X[:, self.columns[k]]
            else:
                vals = frame[self.variables[k]].to_numpy(dtype=float, na_value=np.nan)
                D[:, k] = (vals - self.center[k]) / self.scale[k] if standardized else vals
        mask = np.isnan(D)
        pos = -np.ones((n, d), dtype=np.int64)
        pos[mask] = np.arange(int(mask.sum()))
        parts = []
        for k in range(d):
            rows = np.flatnonzero(mask[:, k])
            if not rows.size:
                continue
            if self.columns[k] >= 0:
                parts.append((pos[rows, k], np.full(rows.size, self.columns[k]), np.zeros(rows.size),
                              np.ones(rows.size)))
                continue
            v, cols = self.variables[k], self.linear_columns[k]
            m, s = self.probe[v]
            sub = frame.iloc[rows]
            X0 = _new_X(design, _with_value(sub, v, m), standardized)[:, cols]
            X1 = _new_X(design, _with_value(sub, v, m + s), standardized)[:, cols]
            bad = ~np.isfinite(X0) | ~np.isfinite(X1)
            if bad.any():
                r, j = np.argwhere(bad)[0]
                name = design.column_names[cols[j]]
                others = [w for w in self.variables if w not in (None, v) and pd.isna(frame[w].iloc[rows[r]])]
                raise InputError(
                    f"design column {name!r} depends on two imputed values, of {v!r} and "
                    f"{others or 'another predictor'}, in {int(bad.any(axis=1).sum())} row(s) (first: "
                    f"{frame.index[rows[r]]!r}); a design column may depend on one imputed value per row (it is "
                    "linear in it, as x:z with z observed; the product of two imputed values is not). Drop those "
                    "rows, fill one of the predictors there, or remove the term.")
            slope = (X1 - X0) / s  # per unit of the raw predictor
            off = X0 - slope * m
            if standardized:  # per unit of (x - center) / scale
                off, slope = off + slope * self.center[k], slope * self.scale[k]
            parts.append((np.repeat(pos[rows, k], len(cols)), np.tile(cols, rows.size), off.ravel(), slope.ravel()))
        e = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0) for i in range(4)]
        return Completion(D, self.columns, e[0], e[1], e[2], e[3])


def _nonlinear_columns(design, probe, v, cols, m, s) -> list:
    """Columns of ``cols`` that are not linear in the predictor ``v`` on the ``probe`` rows
    (values ``m``, ``m + s`` and ``m - 0.7 s`` of ``v``)."""
    try:
        X = [_new_X(design, _with_value(probe, v, t), False)[:, cols] for t in (m, m + s, m - 0.7 * s)]
    except InputError:  # infinite values: not linear
        return list(cols)
    ok = np.isfinite(X[0]) & np.isfinite(X[1]) & np.isfinite(X[2])
    with np.errstate(invalid="ignore"):
        ok &= np.abs(X[2] - (X[0] - 0.7 * (X[1] - X[0]))) <= 1e-8 * (1.0 + np.abs(X[0]) + np.abs(X[1]) + np.abs(X[2]))
    return [c for c, good in zip(cols, ok.all(axis=0)) if not good]


def imputation_spec(design) -> ImputationSpec:
    """The imputation variables of a ``missing="impute"`` design (see :class:`ImputationSpec`);
    raises :class:`~vbsvm.exceptions.InputError` if the design cannot be imputed coherently.

    * a predictor with missing values may enter the design through one column of any
      transformation (imputed on that column's scale), or through any number of columns that are
      linear in it (``x * z``, ``x:C(g)``, ``center(x):z``: imputed on its own scale, each column
      an exact linear function of the imputation); a predictor with missing values that enters
      nonlinearly together with other columns (``x + I(x**2)``, ``poly(x, 2)``, ``np.log(x):z``)
      is refused, naming the columns;
    * NaN in a design column where every raw variable is observed comes from the transformation
      (e.g. ``np.log`` of a negative number), not from missing data.
    """

    mask = np.asarray(design.missing_mask, dtype=bool)
    names = list(design.column_names)
    raw = design.raw
    col_vars = _column_variables(design)
    predictors = [c for c in raw.columns if c != design.response and c not in {g.name for g in design.groups}]
    categorical = set(categorical_calls(design.formula))
    numeric = [v for v in predictors if v not in categorical and pd.api.types.is_numeric_dtype(raw[v])
               and not pd.api.types.is_bool_dtype(raw[v])]
    probe_rows = raw.iloc[np.unique(np.linspace(0, len(raw) - 1, min(len(raw), 50)).astype(np.int64))]
    probe_rows = probe_rows.fillna({v: raw[v].mean() for v in numeric if raw[v].isna().any()})
    probe, interacted, nonlinear = {}, {}, {}
    for v in numeric:
        cols = [j for j in range(len(names)) if v in col_vars[j]]
        if not cols or (len(cols) == 1 and col_vars[cols[0]] == {v}):
            continue  # absent, or one column of v alone: imputed on that column's scale
        obs = raw[v].dropna().to_numpy(dtype=float)
        m = float(obs.mean()) if obs.size else 0.0
        s = float(obs.std(ddof=1)) if obs.size > 1 else 1.0
        s = s if np.isfinite(s) and s > 0 else 1.0
        bad = _nonlinear_columns(design, probe_rows, v, cols, m, s)
        if not bad:
            interacted[v] = cols
            probe[v] = (m, s)
        elif raw[v].isna().any():
            raise InputError(
                f"predictor {v!r} has {int(raw[v].isna().sum())} missing value(s) and enters the design through "
                f"{len(cols)} columns {[names[j] for j in cols]}, of which {[names[j] for j in bad]} "
                f"{'is' if len(bad) == 1 else 'are'} not linear in {v!r}. An imputed predictor may enter the formula "
                f"through one term of any transformation (e.g. np.log({v})), or through any number of terms linear "
                f"in it, alone or multiplied by observed predictors ({v}, {v}:z, {v} * C(g)). Remove the term(s) of "
                f"{[names[j] for j in bad]} (or impute {v!r} before fitting, or use missing='drop')."
            )
        else:
            nonlinear[v] = [names[j] for j in bad]
    explained = np.zeros(mask.shape, dtype=bool)
    for v in predictors:
        na = raw[v].isna().to_numpy()
        if na.any():
            explained[np.ix_(na, [j for j in range(len(names)) if v in col_vars[j]])] = True
    unexplained = mask & ~explained
    if unexplained.any():
        bad = [names[j] for j in np.flatnonzero(unexplained.any(axis=0))]
        raise InputError(
            f"design column(s) {bad} are NaN in {int(unexplained.any(axis=1).sum())} row(s) where the data "
            "are observed: the transformation is undefined there (e.g. np.log of a value <= 0). Fix the "
            "transformation (e.g. np.log(x + 1)) or filter those rows; only truly missing values are imputed."
        )
    out = {"names": [], "columns": [], "variables": [], "center": [], "scale": [], "linear_columns": {}}
    for j in np.flatnonzero(design.penalized):
        inter = [v for v in interacted if v in col_vars[j]]
        if not inter:
            for key, value in zip(("names", "columns", "variables", "center", "scale"),
                                  (names[j], j, None, design.center[j], design.scale[j])):
                out[key].append(value)
        for v in inter:
            if v in out["variables"]:
                continue
            out["linear_columns"][len(out["names"])] = np.asarray(interacted[v], dtype=np.int64)
            m, s = probe[v] if design.standardize else (0.0, 1.0)
            for key, value in zip(("names", "columns", "variables", "center", "scale"), (v, -1, v, m, s)):
                out[key].append(value)
    return ImputationSpec(nonlinear=nonlinear, probe=probe, **out)


def hyperparameters(settings, d):
    """``(sigma2_mu, Psi (d x d), nu)`` of the imputation model from ``settings`` (checked), with
    the paper's defaults for those not given."""
    sigma2_mu = settings.get("sigma2_mu", DEFAULT_SIGMA2_MU)
    Psi = settings.get("Psi", DEFAULT_PSI)
    nu = settings.get("nu", DEFAULT_NU)
    sigma2_mu, nu = validation.positive_float(sigma2_mu, "sigma2_mu"), validation.positive_float(nu, "nu")
    if isinstance(Psi, numbers.Real) and not isinstance(Psi, bool):
        if not (np.isfinite(Psi) and Psi > 0):
            raise InputError(f"Psi must be a positive number (Psi * I) or a {d} x {d} SPD matrix, got {Psi!r}.")
        Psi_m = float(Psi) * np.eye(d)
    else:
        try:
            Psi_m = np.asarray(Psi, dtype=float)
        except (TypeError, ValueError):
            raise InputTypeError(f"Psi must be a number or a {d} x {d} matrix, got {Psi!r}.") from None
        if Psi_m.shape != (d, d) or not np.allclose(Psi_m, Psi_m.T):
            raise InputError(
                f"Psi must be a positive number or a symmetric {d} x {d} matrix (one row per imputation "
                f"column), got shape {Psi_m.shape}."
            )
        try:
            np.linalg.cholesky(Psi_m)
        except np.linalg.LinAlgError:
            raise InputError("Psi must be positive definite.") from None
    return float(sigma2_mu), Psi_m, float(nu)
