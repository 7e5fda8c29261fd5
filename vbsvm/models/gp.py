r"""Sparse-Gaussian-process Bayesian SVM: kernels, inducing points, model blocks.

The model (Wenzel, Galy-Fajou, Deutsch & Kloft 2017, Sections 3-4)
=====================================================================

Data :math:`(x_i, y_i)`, :math:`y_i \in \{-1, +1\}`, :math:`i = 1..n`.  A latent function
:math:`f \sim \mathrm{GP}(0, k)` carries the SVM score; the hinge pseudo-likelihood

.. math::  L(y_i \mid f_i) = \exp\{-2 \max(0, 1 - y_i f_i)\}
           = \int_0^\infty (2\pi\lambda_i)^{-1/2}
             \exp\Big\{-\frac{(1 + \lambda_i - y_i f_i)^2}{2\lambda_i}\Big\} d\lambda_i

is augmented with :math:`\lambda_i > 0` (Polson & Scott 2011; flat improper prior on
:math:`\lambda_i`).  With :math:`m` inducing values :math:`u = f(Z)` at locations
:math:`Z \in \mathbb{R}^{m \times d}`:

.. math::
    u \sim N(0, K_{mm}), \qquad f_i \mid u \sim N(\kappa_i u, \tilde k_i), \qquad
    \kappa = K_{nm} K_{mm}^{-1}, \quad \tilde k_i = k(x_i, x_i) - \kappa_i K_{mi}.

Following the paper (eq. 7, Hensman et al. 2013) :math:`f` is removed by Jensen's inequality,
:math:`\log p(y, \lambda \mid u) \ge E_{p(f|u)} \log p(y, \lambda \mid f)`.  The resulting
*bound model* has joint density (up to the constant :math:`-\tfrac n2 \log 2\pi`)

.. math::
    \log \tilde p(y, \lambda, u) = \log N(u \mid 0, K_{mm})
      - \tfrac12 \sum_i \Big[\log \lambda_i
      + \frac{\tilde k_i + (1 + \lambda_i - y_i \kappa_i u)^2}{\lambda_i}\Big]

and full conditionals in exponential families (used by VB *and* by the Gibbs sampler here):

.. math::
    \lambda_i \mid u &\sim \mathrm{GIG}\big(\tfrac12,\ 1,\ (1 - y_i\kappa_i u)^2 + \tilde k_i\big), \\
    u \mid \lambda &\sim N\big(\Sigma\, \kappa^\top Y (1 + \lambda^{-1}),\ \Sigma\big), \quad
    \Sigma^{-1} = K_{mm}^{-1} + \kappa^\top \Lambda^{-1} \kappa .

With :math:`Z = X` (``m = n``) :math:`\tilde k = 0`, :math:`\kappa = I` and this is exactly the full-GP
model of Section 4.1 (eq. 5).

Variational family and optimal factors
--------------------------------------
:math:`q(u) = N(\mu, \zeta)`, :math:`q(\lambda_i) = \mathrm{GIG}(\tfrac12, 1, \alpha_i)`.  Then
:math:`E_q[\lambda_i^{-1}] = \alpha_i^{-1/2}` and the coordinate-ascent (optimal) updates are

.. math::
    \alpha_i &= c_i := (1 - y_i \kappa_i \mu)^2 + \kappa_i \zeta \kappa_i^\top + \tilde k_i, \\
    \zeta^{-1} &= K_{mm}^{-1} + \kappa^\top A^{-1/2} \kappa, \qquad
    \zeta^{-1}\mu = \kappa^\top Y (1 + \alpha^{-1/2}) .

The ELBO *with all constants* (our derivation; the paper's eq. (8) is stated only up to constants
and writes :math:`B_{1/4}` where :math:`K_{1/2}` is meant) is

.. math::
    \mathcal L = \sum_i \Big[y_i \kappa_i \mu - 1 - \tfrac12\big(\sqrt{\alpha_i}
                 + c_i/\sqrt{\alpha_i}\big)\Big] - \mathrm{KL}\big(N(\mu,\zeta)\,\|\,N(0,K_{mm})\big),

which at the optimal :math:`\alpha_i = c_i` is :math:`\sum_i [y_i\kappa_i\mu - 1 - \sqrt{c_i}]
- \mathrm{KL}`.  Derivation: :math:`E[\log p(y_i,\lambda_i|f_i)] + H[q(\lambda_i)]` with
:math:`\log 2K_{1/2}(\sqrt\alpha) = \log 2 + \tfrac12\log(\pi/2) - \tfrac14\log\alpha - \sqrt\alpha`;
all :math:`\log\pi`, :math:`\log 2` and :math:`E\log\lambda` terms cancel.  Sanity check:
:math:`E[-2\max(0,a)] = -E|a| - E a \ge -\sqrt{E a^2} - E a`, i.e. the bound is below the log
pseudo-likelihood, as it must be.

Numerics
--------
Everything is computed in the *whitened* parameterization :math:`u = L v`,
:math:`L L^\top = K_{mm} + \epsilon I` (jitter :math:`\epsilon`, increased tenfold and retried if the
Cholesky factorization fails).  With :math:`A = K_{nm} L^{-\top}` we have :math:`\kappa_i u = A_i v`,
the prior is :math:`v \sim N(0, I)` and the optimal precision of :math:`q(v)` is
:math:`I + A^\top A^{-1/2}_{\alpha} A`, whose eigenvalues are all :math:`\ge 1`: a convex combination of such
matrices (a natural-gradient step with :math:`0 < \rho \le 1`) is always positive definite and well
conditioned.  Natural gradients are invariant to this linear reparameterization, so the algorithm
is Algorithm 1 of the paper, only better conditioned.  :math:`\alpha_i` is clipped to
:math:`\ge 10^{-12}` (so :math:`E[1/\lambda_i] \le 10^6`) to survive points that sit exactly on the
margin with no posterior variance (separable or duplicated data).

Bias
----
The GP has mean zero; an intercept enters as a :class:`Constant` kernel term (a random intercept
:math:`b \sim N(0, \sigma_b^2)` shared by all points), whose variance can be learned with the other
hyperparameters.  :func:`make_kernel` adds it when ``bias=True``.

Predictions (Section 4.4)
-------------------------
:math:`q(f_*) = N(m_*, s_*^2)` with :math:`m_* = A_* E_q v`,
:math:`s_*^2 = \tilde k_* + A_* \mathrm{Cov}_q(v) A_*^\top`.  The paper's eq. (13) writes
:math:`\Phi(m_*/(s_*^2 + 1))`; integrating the probit link over the Gaussian gives
:math:`\int \Phi(f) N(f|m_*, s_*^2) df = \Phi(m_*/\sqrt{1 + s_*^2})`, which is what we use
(eq. 13's denominator is a typo: it is not scale-consistent, e.g. it maps :math:`s_*^2 = 3` and
:math:`m_* = 2` to :math:`\Phi(0.5)` instead of :math:`\Phi(1)`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import xarray as xr
from scipy import linalg as sla
from scipy.linalg.lapack import dtrtri as _dtrtri
from scipy.special import ndtr

from vbsvm.distributions import sample_gig_half
from vbsvm.exceptions import InputError

ALPHA_MIN = 1e-12  # clip of the GIG parameter chi = alpha (E[1/lambda] <= 1e6)

__all__ = [
    "Kernel", "RBF", "Matern32", "Matern52", "Linear", "Constant", "Sum",
    "make_kernel", "kernel_from_dict", "select_inducing", "robust_cholesky",
    "InducingGP", "WhitenedGaussian", "SparseGPSVM", "predictive_prob",
]


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
class Kernel:
    """Base class of covariance functions.

    Hyperparameters are held on the log scale in :attr:`theta` (a flat float array) so that
    gradient steps keep them positive.  Every kernel provides its matrix, its diagonal and
    vector-Jacobian products: given a matrix ``G`` of the same shape as ``K(X1, X2)``,
    :meth:`grad_theta` returns :math:`\\partial \\sum_{ij} G_{ij} K_{ij} / \\partial \\theta` and
    :meth:`grad_X2` returns :math:`\\partial \\sum_{ij} G_{ij} K_{ij} / \\partial X_2`.
    """

    name = "kernel"

    # -- parameters ------------------------------------------------------------------------
    @property
    def theta(self) -> np.ndarray:
        return self._theta.copy()

    @theta.setter
    def theta(self, value) -> None:
        value = np.asarray(value, dtype=float).reshape(-1)
        if value.shape != self._theta.shape:
            raise InputError(f"theta must have {self._theta.size} entries, got {value.size}")
        self._theta = value.copy()

    @property
    def n_params(self) -> int:
        return self._theta.size

    def param_names(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def params(self) -> dict:
        """Hyperparameters on their natural scale, ``{name: value}``."""
        return dict(zip(self.param_names(), np.exp(self._theta)))

    def __add__(self, other: "Kernel") -> "Sum":
        return Sum(self, other)

    def __repr__(self) -> str:
        inside = ", ".join(f"{k}={v:.4g}" for k, v in self.params().items())
        return f"{type(self).__name__}({inside})"

    # -- to be provided -------------------------------------------------------------------
    def __call__(self, X1, X2=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def diag(self, X):  # pragma: no cover - abstract
        raise NotImplementedError

    def grad_theta(self, X1, X2, G):  # pragma: no cover - abstract
        raise NotImplementedError

    def grad_theta_diag(self, X, g):  # pragma: no cover - abstract
        raise NotImplementedError

    def grad_X2(self, X1, X2, G):  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


class _Stationary(Kernel):
    r"""Stationary kernel :math:`\sigma^2 g(r^2)`, :math:`r^2 = \sum_d (x_d - x'_d)^2/\ell_d^2`.

    Parameters
    ----------
    lengthscale : float or array of float
        One value (isotropic) or one per input dimension (ARD).
    variance : float
        Kernel variance :math:`\sigma^2` (the inverse of the SVM cost, roughly).
    """

    def __init__(self, lengthscale=1.0, variance=1.0):
        ls = np.atleast_1d(np.asarray(lengthscale, dtype=float))
        if np.any(~np.isfinite(ls)) or np.any(ls <= 0):
            raise InputError(f"lengthscale must be positive and finite, got {lengthscale!r}")
        if not (np.isfinite(variance) and variance > 0):
            raise InputError(f"variance must be positive and finite, got {variance!r}")
        self.ard = ls.size > 1
        self._theta = np.concatenate([[math.log(variance)], np.log(ls)])
        self.feature_names = None

    @property
    def variance(self) -> float:
        return float(np.exp(self._theta[0]))

    @property
    def lengthscale(self) -> np.ndarray:
        return np.exp(self._theta[1:])

    def param_names(self):
        if not self.ard:
            return [f"{self.name}.variance", f"{self.name}.lengthscale"]
        fn = self.feature_names or [f"x{j + 1}" for j in range(self._theta.size - 1)]
        return [f"{self.name}.variance"] + [f"{self.name}.lengthscale[{f}]" for f in fn]

    def _scaled(self, X):
        return np.asarray(X, dtype=float) / self.lengthscale

    def _r2(self, X1, X2):
        A, B = self._scaled(X1), self._scaled(X2)
        r2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * (A @ B.T)
        np.maximum(r2, 0.0, out=r2)
        return r2

    # unit-variance profile g and dg/d(r^2)
    def _g(self, r2):  # pragma: no cover - abstract
        raise NotImplementedError

    def _dg(self, r2):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, X1, X2=None):
        X2 = X1 if X2 is None else X2
        return self.variance * self._g(self._r2(X1, X2))

    def diag(self, X):
        return np.full(np.shape(X)[0], self.variance)

    def grad_theta(self, X1, X2, G):
        r2 = self._r2(X1, X2)
        g = self._g(r2)
        out = np.empty(self._theta.size)
        out[0] = self.variance * np.sum(G * g)
        H = G * (self.variance * self._dg(r2))
        if not self.ard:
            out[1] = -2.0 * np.sum(H * r2)
        else:
            A, B = self._scaled(X1), self._scaled(X2)
            # sum_ij H_ij (a_id - b_jd)^2 per dimension d (already scaled by 1/l_d^2)
            s = H.sum(1) @ (A * A) - 2.0 * np.sum(A * (H @ B), axis=0) + H.sum(0) @ (B * B)
            out[1:] = -2.0 * s
        return out

    def grad_theta_diag(self, X, g):
        out = np.zeros(self._theta.size)
        out[0] = self.variance * np.sum(g)
        return out

    def grad_X2(self, X1, X2, G):
        r2 = self._r2(X1, X2)
        H = G * (self.variance * self._dg(r2))
        inv_l2 = 1.0 / self.lengthscale ** 2
        X1 = np.asarray(X1, dtype=float)
        X2 = np.asarray(X2, dtype=float)
        return -2.0 * inv_l2 * (H.T @ X1 - X2 * H.sum(0)[:, None])

    def to_dict(self):
        return {"type": type(self).__name__, "lengthscale": self.lengthscale.tolist(),
                "variance": self.variance, "feature_names": self.feature_names}


class RBF(_Stationary):
    r"""Squared-exponential kernel :math:`\sigma^2 \exp(-r^2/2)`.

    (The paper's footnote 5 writes :math:`\exp(-\|x-x'\|/\theta^2)`; the norm is meant squared,
    and its :math:`\theta` equals our :math:`\sqrt2\,\ell`.)
    """

    name = "rbf"

    def _g(self, r2):
        return np.exp(-0.5 * r2)

    def _dg(self, r2):
        return -0.5 * np.exp(-0.5 * r2)


class Matern32(_Stationary):
    r"""Matérn 3/2 kernel :math:`\sigma^2 (1 + \sqrt3 r) e^{-\sqrt3 r}`."""

    name = "matern32"

    def _g(self, r2):
        r = np.sqrt(r2)
        return (1.0 + math.sqrt(3.0) * r) * np.exp(-math.sqrt(3.0) * r)

    def _dg(self, r2):
        # dg/dr = -3 r e^{-sqrt3 r}; dg/d(r^2) = dg/dr / (2 r)
        return -1.5 * np.exp(-math.sqrt(3.0) * np.sqrt(r2))


class Matern52(_Stationary):
    r"""Matérn 5/2 kernel :math:`\sigma^2 (1 + \sqrt5 r + 5r^2/3) e^{-\sqrt5 r}`."""

    name = "matern52"

    def _g(self, r2):
        r = np.sqrt(r2)
        return (1.0 + math.sqrt(5.0) * r + 5.0 * r2 / 3.0) * np.exp(-math.sqrt(5.0) * r)

    def _dg(self, r2):
        # dg/dr = -(5/3) r (1 + sqrt5 r) e^{-sqrt5 r}
        r = np.sqrt(r2)
        return -(5.0 / 6.0) * (1.0 + math.sqrt(5.0) * r) * np.exp(-math.sqrt(5.0) * r)


class _VarianceOnly(Kernel):
    """A kernel whose only hyperparameter is a variance (stored as its log)."""

    def __init__(self, variance=1.0):
        if not (np.isfinite(variance) and variance > 0):
            raise InputError(f"variance must be positive and finite, got {variance!r}")
        self._theta = np.array([math.log(variance)])

    @property
    def variance(self):
        return float(np.exp(self._theta[0]))

    def param_names(self):
        return [f"{self.name}.variance"]

    def to_dict(self):
        return {"type": type(self).__name__, "variance": self.variance}


class Linear(_VarianceOnly):
    r"""Linear kernel :math:`\sigma^2 x^\top x'` (the linear SVM in dual form)."""

    name = "linear"

    def __call__(self, X1, X2=None):
        X2 = X1 if X2 is None else X2
        return self.variance * (np.asarray(X1, float) @ np.asarray(X2, float).T)

    def diag(self, X):
        X = np.asarray(X, float)
        return self.variance * np.einsum("ij,ij->i", X, X)

    def grad_theta(self, X1, X2, G):
        return np.array([np.sum(G * self(X1, X2))])

    def grad_theta_diag(self, X, g):
        return np.array([np.sum(g * self.diag(X))])

    def grad_X2(self, X1, X2, G):
        return self.variance * (G.T @ np.asarray(X1, float))


class Constant(_VarianceOnly):
    r"""Constant kernel :math:`\sigma_b^2`: a random intercept :math:`b \sim N(0, \sigma_b^2)`."""

    name = "bias"

    def __call__(self, X1, X2=None):
        X2 = X1 if X2 is None else X2
        return np.full((np.shape(X1)[0], np.shape(X2)[0]), self.variance)

    def diag(self, X):
        return np.full(np.shape(X)[0], self.variance)

    def grad_theta(self, X1, X2, G):
        return np.array([self.variance * np.sum(G)])

    def grad_theta_diag(self, X, g):
        return np.array([self.variance * np.sum(g)])

    def grad_X2(self, X1, X2, G):
        return np.zeros(np.shape(X2))


class Sum(Kernel):
    """Sum of kernels, ``k1 + k2 + ...`` (the paper's multiple-kernel form, Appendix A.3)."""

    name = "sum"

    def __init__(self, *parts: Kernel):
        flat = []
        for p in parts:
            if not isinstance(p, Kernel):
                raise InputError(f"kernel terms must be Kernel objects, got {type(p).__name__}")
            flat.extend(p.parts if isinstance(p, Sum) else [p])
        self.parts = flat
        self._sizes = [p.n_params for p in flat]

    @property
    def _theta(self):
        return np.concatenate([p._theta for p in self.parts])

    @_theta.setter
    def _theta(self, value):
        i = 0
        for p, s in zip(self.parts, self._sizes):
            p._theta = np.asarray(value[i:i + s], dtype=float).copy()
            i += s

    def param_names(self):
        names, seen = [], {}
        for p in self.parts:
            for nm in p.param_names():
                k = seen.get(nm, 0)
                seen[nm] = k + 1
                names.append(nm if k == 0 else nm.replace(".", f"{k + 1}.", 1))
        return names

    def __repr__(self):
        return " + ".join(repr(p) for p in self.parts)

    def __call__(self, X1, X2=None):
        return sum(p(X1, X2) for p in self.parts)

    def diag(self, X):
        return sum(p.diag(X) for p in self.parts)

    def grad_theta(self, X1, X2, G):
        return np.concatenate([p.grad_theta(X1, X2, G) for p in self.parts])

    def grad_theta_diag(self, X, g):
        return np.concatenate([p.grad_theta_diag(X, g) for p in self.parts])

    def grad_X2(self, X1, X2, G):
        return sum(p.grad_X2(X1, X2, G) for p in self.parts)

    def to_dict(self):
        return {"type": "Sum", "parts": [p.to_dict() for p in self.parts]}


_KERNELS = {"rbf": RBF, "matern32": Matern32, "matern52": Matern52}


def kernel_from_dict(d: dict) -> Kernel:
    """Rebuild a kernel from :meth:`Kernel.to_dict` output."""
    t = d["type"]
    if t == "Sum":
        return Sum(*[kernel_from_dict(p) for p in d["parts"]])
    if t == "Linear":
        return Linear(d["variance"])
    if t == "Constant":
        return Constant(d["variance"])
    cls = {"RBF": RBF, "Matern32": Matern32, "Matern52": Matern52}[t]
    k = cls(np.asarray(d["lengthscale"]) if len(d["lengthscale"]) > 1 else d["lengthscale"][0],
            d["variance"])
    k.feature_names = d.get("feature_names")
    return k


def make_kernel(kernel="rbf", n_features: int = 1, *, lengthscale=None, variance=1.0,
                bias: bool | float = True, feature_names=None) -> Kernel:
    """Build a kernel from a name or pass a :class:`Kernel` through.

    Parameters
    ----------
    kernel : str or Kernel
        ``"rbf"``, ``"ard"`` (RBF with one lengthscale per column), ``"matern32"``,
        ``"matern52"`` (append ``"-ard"`` for per-column lengthscales, e.g. ``"matern52-ard"``),
        ``"linear"``, a ``"+"``-joined combination (``"rbf+linear"``), or a Kernel object.
    n_features : int
        Number of input columns (for ARD and for the default lengthscale).
    lengthscale : float, array or None
        Starting lengthscale; ``None`` uses :math:`\\sqrt{d}` (the typical distance between two
        standardized points is :math:`\\sqrt{2d}`).
    variance : float
        Starting kernel variance.
    bias : bool or float
        Add a :class:`Constant` term (the intercept); a float sets its starting variance.
    feature_names : list of str, optional
        Column names for ARD parameter labels.
    """
    if isinstance(kernel, Kernel):
        k = kernel
    elif isinstance(kernel, str):
        parts = []
        for name in kernel.lower().replace(" ", "").split("+"):
            ard = name == "ard" or name.endswith("-ard")
            base = "rbf" if name == "ard" else name.removesuffix("-ard")
            if base == "linear":
                parts.append(Linear(variance / max(n_features, 1)))
            elif base in _KERNELS:
                ls0 = math.sqrt(max(n_features, 1)) if lengthscale is None else lengthscale
                ls = np.full(n_features, ls0, dtype=float) if ard and np.ndim(ls0) == 0 else ls0
                kk = _KERNELS[base](ls, variance)
                if ard:
                    kk.feature_names = list(feature_names) if feature_names is not None else None
                parts.append(kk)
            elif base in ("bias", "constant"):
                parts.append(Constant(variance))
            else:
                raise InputError(
                    f"kernel={kernel!r} is not known; use 'rbf', 'ard', 'matern32', 'matern52', "
                    "'linear' (optionally '-ard' and '+'-joined) or a vbsvm.models.gp.Kernel")
        k = parts[0] if len(parts) == 1 else Sum(*parts)
    else:
        raise InputError(f"kernel must be a string or a Kernel, got {type(kernel).__name__}")
    has_const = isinstance(k, Constant) or (isinstance(k, Sum) and any(
        isinstance(p, Constant) for p in k.parts))
    if bias is not False and bias is not None and not has_const:
        k = Sum(k, Constant(1.0 if bias is True else float(bias)))
    return k


# ---------------------------------------------------------------------------------------------
# Inducing points and linear algebra
# ---------------------------------------------------------------------------------------------
def sample_rows(rng, n: int, k: int) -> np.ndarray:
    """``k`` distinct row indices out of ``n`` in O(k) memory (``Generator.choice`` without
    replacement permutes all ``n`` indices, which would make memory grow with n)."""
    k = min(k, n)
    if 20 * k >= n:
        return rng.choice(n, size=k, replace=False)
    idx = np.unique(rng.integers(0, n, size=int(1.2 * k) + 16))
    while idx.size < k:
        idx = np.unique(np.concatenate([idx, rng.integers(0, n, size=k)]))
    return rng.permutation(idx)[:k]


def select_inducing(X, m: int, method: str = "kmeans", rng=None, max_rows: int | None = None):
    """Choose ``m`` inducing locations.

    Parameters
    ----------
    X : ndarray (n, d)
    m : int
    method : {"kmeans", "random", "data"}
        ``"kmeans"``: k-means with k-means++ seeding (:func:`scipy.cluster.vq.kmeans2`) on at most
        ``max_rows`` randomly chosen rows (default ``max(2000, 20 m)``: scipy's ++ seeding costs
        O(rows * m) per centre); ``"random"``: a random subset of distinct rows;
        ``"data"``: all rows (``m`` is ignored; the full GP).
    rng : numpy.random.Generator or int or None

    Returns
    -------
    Z : ndarray (m', d) with ``m' <= m`` distinct rows (fewer when X has fewer distinct rows).
    """
    from scipy.cluster.vq import kmeans2

    rng = np.random.default_rng(rng)
    X = np.asarray(X, dtype=float)
    n = X.shape[0]
    if method == "data":
        return X.copy()
    if method not in ("kmeans", "random"):
        raise InputError(f"inducing={method!r} is not known; use 'kmeans', 'random' or an array")
    if m >= n:
        Z = np.unique(X, axis=0)
        return Z[:m]
    if method == "random":
        U = np.unique(X[sample_rows(rng, n, 4 * m)], axis=0)
        if U.shape[0] < m:
            U = np.unique(X, axis=0)
        return U[rng.choice(U.shape[0], size=min(m, U.shape[0]), replace=False)]
    max_rows = max(2000, 20 * m) if max_rows is None else max_rows
    sub = X if n <= max_rows else X[np.sort(sample_rows(rng, n, max_rows))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "one of the clusters is empty" is handled below
        Z, _ = kmeans2(sub, m, minit="++", iter=20, seed=rng)
    Z = np.unique(Z[np.all(np.isfinite(Z), axis=1)], axis=0)
    if Z.shape[0] < m:  # empty or merged clusters: top up with distinct data rows
        extra = sub[rng.choice(sub.shape[0], size=min(sub.shape[0], 2 * m), replace=False)]
        Z = np.unique(np.vstack([Z, extra]), axis=0)[:m]
    return Z


def robust_cholesky(M, jitter: float = 1e-8, max_tries: int = 8):
    """Lower Cholesky factor of a symmetric matrix, adding ``jitter * mean(diag)`` to the diagonal
    (tenfold more on each failure).

    Returns
    -------
    L : ndarray
    jitter_used : float (absolute value added to the diagonal)
    """
    M = np.asarray(M, dtype=float)
    scale = float(np.mean(np.diag(M))) if M.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    j = 0.0
    for t in range(max_tries + 1):
        try:
            L = np.linalg.cholesky(M + j * np.eye(M.shape[0]) if j else M)
            if np.all(np.isfinite(L)):
                return L, j
        except np.linalg.LinAlgError:
            pass
        j = jitter * scale * (10.0 ** t)
    raise np.linalg.LinAlgError(
        f"matrix is not positive definite even with jitter {j:.3g}; check for NaN/inf inputs")


def _tri_inv(L):
    """Inverse of a lower-triangular matrix (LAPACK dtrtri)."""
    Li, info = _dtrtri(np.asarray(L, order="F"), lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"triangular inverse failed (info={info})")
    return Li


def _tri_solve(L, B, trans=False):
    return sla.solve_triangular(L, B, lower=True, trans=1 if trans else 0, check_finite=False)


# ---------------------------------------------------------------------------------------------
# The Gaussian block q(v) in natural (precision, shift) form
# ---------------------------------------------------------------------------------------------
class WhitenedGaussian:
    """q(v) = N(P^{-1} h, P^{-1}) for the whitened inducing values v (u = L v).

    Natural parameters: eta_1 = h, eta_2 = -P/2.
    """

    def __init__(self, prec, shift):
        self.prec = np.asarray(prec, dtype=float)
        self.shift = np.asarray(shift, dtype=float)
        self._R = None
        self._Ri = None
        self._mean = None

    @classmethod
    def prior(cls, m):
        return cls(np.eye(m), np.zeros(m))

    @property
    def chol(self):
        if self._R is None:
            self._R, _ = robust_cholesky(0.5 * (self.prec + self.prec.T), 1e-10)
            self._Ri = _tri_inv(self._R)
            if not np.all(np.isfinite(self._Ri)):
                raise np.linalg.LinAlgError("precision of q(v) is numerically singular")
        return self._R

    @property
    def chol_inv(self):
        """R^{-1} for the lower Cholesky factor R of the precision (Cov = R^{-T} R^{-1})."""
        self.chol
        return self._Ri

    @property
    def mean(self):
        if self._mean is None:
            Ri = self.chol_inv
            self._mean = Ri.T @ (Ri @ self.shift)
        return self._mean

    def cov(self):
        Ri = self.chol_inv
        return Ri.T @ Ri

    def quad_diag(self, A):
        """diag(A Cov A^T) for rows of A."""
        T = A @ self.chol_inv.T
        return np.einsum("ij,ij->i", T, T)

    def logdet_cov(self):
        return -2.0 * np.sum(np.log(np.diag(self.chol)))

    def kl_to_std(self):
        """KL(q(v) || N(0, I)) (equal to KL(q(u) || N(0, K_mm)))."""
        m = self.prec.shape[0]
        Ri = self.chol_inv
        tr = np.sum(Ri * Ri)
        mu = self.mean
        return 0.5 * (tr + mu @ mu - m - self.logdet_cov())

    def sample(self, rng, size):
        z = rng.standard_normal((size, self.prec.shape[0]))
        return self.mean + _tri_solve(self.chol, z.T, trans=True).T


# ---------------------------------------------------------------------------------------------
# The model blocks
# ---------------------------------------------------------------------------------------------
class InducingGP:
    """Sparse-GP SVM blocks for a kernel and inducing locations Z.

    Parameters
    ----------
    kernel : Kernel
    Z : ndarray (m, d)
    jitter : float
        Relative jitter for the Cholesky factor of K_mm (increased automatically on failure).
    """

    def __init__(self, kernel: Kernel, Z, jitter: float = 1e-6):
        self.kernel = kernel
        self.Z = np.array(Z, dtype=float)
        self.jitter = jitter
        self.refresh()

    @property
    def m(self):
        return self.Z.shape[0]

    def refresh(self):
        """Recompute K_mm and its Cholesky factor (after a hyperparameter change)."""
        Kmm = self.kernel(self.Z)
        self.L, self.jitter_used = robust_cholesky(Kmm, self.jitter)
        self.Linv = _tri_inv(self.L)
        return self

    def project(self, X):
        """A = K(X, Z) L^{-T} and the residual variances k~ = diag(K_nn - Q_nn) (clipped at 0)."""
        X = np.asarray(X, dtype=float)
        Kxm = self.kernel(X, self.Z)
        A = Kxm @ self.Linv.T
        kt = self.kernel.diag(X) - np.einsum("ij,ij->i", A, A)
        np.maximum(kt, 0.0, out=kt)
        return A, kt

    # -- q(v) from natural parameters -------------------------------------------------------
    @staticmethod
    def gaussian(prec, shift) -> WhitenedGaussian:
        """q(v) = N(prec^{-1} shift, prec^{-1}) from its natural parameters."""
        return WhitenedGaussian(prec, shift)

    def prior_q(self) -> WhitenedGaussian:
        """q(v) equal to the prior N(0, I)."""
        return WhitenedGaussian.prior(self.m)

    # -- VB local step and global target ----------------------------------------------------
    @staticmethod
    def local(A, kt, y, q: WhitenedGaussian):
        """Optimal q(lambda_i) = GIG(1/2, 1, alpha_i): returns (alpha = c_i, fbar = kappa_i mu)."""
        fbar = A @ q.mean
        c = (1.0 - y * fbar) ** 2 + q.quad_diag(A) + kt
        return np.maximum(c, ALPHA_MIN), fbar

    @staticmethod
    def target(A, y, alpha, scale=1.0):
        """Natural parameters of the optimal q(v) given q(lambda) on a (mini)batch scaled by
        ``scale = n / batch``: (precision, shift)."""
        w = 1.0 / np.sqrt(alpha)
        P = scale * (A.T @ (A * w[:, None]))
        P[np.diag_indices_from(P)] += 1.0
        h = scale * (A.T @ (y * (1.0 + w)))
        return P, h

    @staticmethod
    def data_elbo(y, fbar, c, alpha=None):
        """Sum over points of the ELBO data terms (alpha=None: at the optimal alpha = c)."""
        if alpha is None:
            return float(np.sum(y * fbar - 1.0 - np.sqrt(c)))
        sa = np.sqrt(alpha)
        return float(np.sum(y * fbar - 1.0 - 0.5 * (sa + c / sa)))

    def elbo(self, X, y, q: WhitenedGaussian, scale=1.0, alpha=None):
        """ELBO (all constants) of q on data (X, y) scaled by ``scale`` (n / rows given)."""
        A, kt = self.project(X)
        return self.elbo_projected(A, kt, y, q, scale, alpha)

    def elbo_projected(self, A, kt, y, q: WhitenedGaussian, scale=1.0, alpha=None):
        """:meth:`elbo` on projected rows ``(A, kt)`` of :meth:`project`; ``alpha=None``: at the
        optimal q(lambda), else at q(lambda) = GIG(1/2, 1, alpha)."""
        c, fbar = self.local(A, kt, y, q)
        if alpha is not None:  # the unclipped c_i enters the ELBO at a given alpha
            c = (1.0 - y * fbar) ** 2 + q.quad_diag(A) + kt
        return scale * self.data_elbo(y, fbar, c, alpha) - q.kl_to_std()

    # -- u-space moments and re-whitening --------------------------------------------------
    def u_moments(self, q: WhitenedGaussian):
        """(mu, zeta) of q(u) = N(L m_v, L S_v L^T)."""
        mu = self.L @ q.mean
        LS = self.L @ q.cov()
        return mu, LS @ self.L.T

    def rewhiten(self, q: WhitenedGaussian, L_old) -> WhitenedGaussian:
        """Express the same q(u) in the whitened coordinates of the current L."""
        M = _tri_solve(L_old, self.L)  # L_old^{-1} L_new
        P = M.T @ q.prec @ M
        P = 0.5 * (P + P.T)
        m_new = _tri_solve(self.L, L_old @ q.mean)
        return WhitenedGaussian(P, P @ m_new)

    # -- ELBO in u-space and its hyperparameter gradient ------------------------------------
    def elbo_u(self, X, y, mu, zeta, scale=1.0):
        """ELBO at fixed q(u) = N(mu, zeta) (alpha profiled), for gradient checks."""
        Lz = np.linalg.cholesky(zeta)
        Kxm = self.kernel(np.asarray(X, float), self.Z)
        L = self.L
        kappa = _tri_solve(L, _tri_solve(L, Kxm.T), trans=True).T  # K_nm K_mm^{-1}
        fbar = kappa @ mu
        T = kappa @ Lz
        kt = self.kernel.diag(X) - np.einsum("ij,ij->i", kappa, Kxm)
        c = np.maximum((1 - y * fbar) ** 2 + np.einsum("ij,ij->i", T, T) + kt, ALPHA_MIN)
        Li_Lz = _tri_solve(L, Lz)
        Li_mu = _tri_solve(L, mu)
        kl = 0.5 * (np.sum(Li_Lz ** 2) + Li_mu @ Li_mu - len(mu)
                    + 2 * np.sum(np.log(np.diag(L))) - 2 * np.sum(np.log(np.diag(Lz))))
        return scale * float(np.sum(y * fbar - 1.0 - np.sqrt(c))) - kl

    def hyper_grad(self, X, y, q: WhitenedGaussian, scale=1.0, inducing=False, alpha=None,
                   projected=None):
        r"""Gradient of the ELBO w.r.t. log-hyperparameters (and Z if ``inducing``) at fixed
        :math:`q(u) = N(\mu, \zeta)` and either the optimal :math:`\alpha` (``alpha=None``, so
        :math:`\partial/\partial\alpha = 0`) or the given fixed :math:`\alpha`.

        Derived from scratch (the paper's A.3 gives the same structure): with
        :math:`B = K_{mm}^{-1}`, :math:`\kappa = K_{nm}B`, :math:`S = \zeta + \mu\mu^\top`,
        :math:`w = \alpha^{-1/2}`, :math:`v = y \odot (1 + w)`, :math:`P = \kappa^\top W \kappa`,

        .. math::
            \partial\mathcal L/\partial K_{nm} &= s\,[v (B\mu)^\top - W\kappa(SB - I)],\\
            \partial\mathcal L/\partial K_{mm} &= s\,[-\kappa^\top v (B\mu)^\top
                + \tfrac12(PSB + BSP) - \tfrac12 P] + \tfrac12(BSB - B),\\
            \partial\mathcal L/\partial k_{ii} &= -\tfrac{s}{2} w_i,

        then chained through the kernel's vector-Jacobian products.  Computed in the whitened
        frame (:math:`u = Lv`, :math:`A = \kappa L`, :math:`S = L S_v L^\top`,
        :math:`S_v = E_q[vv^\top]`, :math:`P_v = A^\top W A`), where the two matrices are
        :math:`s[v m_v^\top - WA(S_v - I)]L^{-1}` and :math:`L^{-\top}\{s[-A^\top v m_v^\top
        + \tfrac12(P_vS_v + S_vP_v) - \tfrac12P_v] + \tfrac12(S_v - I)\}L^{-1}`: no inverse of
        :math:`K_{mm}` is formed.

        Parameters
        ----------
        X, y : ndarray
            Rows and labels (a minibatch for SVI).
        q : WhitenedGaussian
        scale : float
            ``n / rows`` for a minibatch.
        inducing : bool
            Also return the gradient w.r.t. Z.
        alpha : ndarray or None
            Fixed q(lambda) parameters (None: the optimal ones for q).
        projected : (A, kt) or None
            :meth:`project` of X, if already computed.

        Returns
        -------
        g_theta : ndarray (n_params,)
        g_Z : ndarray (m, d) or None
        """
        X = np.asarray(X, float)
        A, kt = self.project(X) if projected is None else projected
        if alpha is None:
            alpha, _ = self.local(A, kt, y, q)
        w = 1.0 / np.sqrt(alpha)
        v = y * (1.0 + w)
        mv = q.mean
        Ri = q.chol_inv
        Sv_I = Ri.T @ Ri + np.outer(mv, mv)  # S_v - I
        Sv_I[np.diag_indices_from(Sv_I)] -= 1.0
        WA = A * w[:, None]
        Pv = A.T @ WA
        G_nm = (scale * (np.outer(v, mv) - WA @ Sv_I)) @ self.Linv
        PS = Pv @ Sv_I + Pv  # P_v S_v
        M = scale * (-np.outer(A.T @ v, mv) + 0.5 * (PS + PS.T) - 0.5 * Pv) + 0.5 * Sv_I
        G_mm = self.Linv.T @ M @ self.Linv
        g_diag = -0.5 * scale * w
        k = self.kernel
        g = (k.grad_theta(X, self.Z, G_nm) + k.grad_theta(self.Z, self.Z, G_mm)
             + k.grad_theta_diag(X, g_diag))
        gZ = None
        if inducing:
            gZ = k.grad_X2(X, self.Z, G_nm) + k.grad_X2(self.Z, self.Z, G_mm + G_mm.T)
        return g, gZ

    # -- predictions ------------------------------------------------------------------------
    def predict_f(self, X, q: WhitenedGaussian, chunk: int = 50000):
        """Mean and variance of q(f_*) at rows of X (in chunks to bound memory)."""
        X = np.asarray(X, float)
        mean = np.empty(X.shape[0])
        var = np.empty(X.shape[0])
        for s in range(0, X.shape[0], chunk):
            A, kt = self.project(X[s:s + chunk])
            mean[s:s + chunk] = A @ q.mean
            var[s:s + chunk] = kt + q.quad_diag(A)
        return mean, var


def predictive_prob(mean, var, normalization: str = "probit"):
    r"""Approximate predictive probability of class +1 (Section 4.4).

    ``"probit"`` (default): :math:`\Phi(m/\sqrt{1+v})`, the exact Gaussian integral of the probit
    link.  ``"paper"``: the paper's eq. (13) as printed, :math:`\Phi(m/(1+v))`.
    """
    if normalization == "probit":
        return ndtr(mean / np.sqrt(1.0 + var))
    if normalization == "paper":
        return ndtr(mean / (1.0 + var))
    raise InputError(f"normalization={normalization!r}; use 'probit' or 'paper'")


# ---------------------------------------------------------------------------------------------
# The model on a data set: what the engines drive
# ---------------------------------------------------------------------------------------------
class SparseGPSVM:
    r"""The sparse-GP SVM bound to a data set: updates, ELBO and full conditionals for the engines.

    Batch VB (:func:`vbsvm.inference.vb.coordinate_ascent`) calls :meth:`vb_initial_state` and
    :meth:`vb_sweep`; Gibbs sampling (:func:`vbsvm.inference.gibbs.run_chains`) calls
    :meth:`gibbs_initial_state` and :meth:`gibbs_sweep`.  The model never runs an engine.

    VB state: :math:`x = (\log\alpha, \phi)` with :math:`\phi` the kernel's log-hyperparameters
    (and the inducing locations) when they are learned, else :math:`x = \log\alpha`.  A sweep is

    1. *global* step given :math:`\alpha`: with ``optimize``, :math:`\phi` maximizes the
       **collapsed** ELBO :math:`\max_{q(u)} \mathcal L(q(u), \alpha, \phi)` (closed form: the
       optimal :math:`q(v)` of :meth:`InducingGP.target`; by the envelope theorem its gradient is
       :meth:`InducingGP.hyper_grad` at that optimum with :math:`\alpha` held fixed), by a few
       L-BFGS iterations, kept only if the collapsed ELBO went up; then :math:`q(v)` is the
       optimum given :math:`(\alpha, \phi)`;
    2. *local* step: :math:`\alpha_i = c_i` (:meth:`InducingGP.local`).

    Each step maximizes the ELBO over its block, so a sweep never lowers it.  Moving
    :math:`\phi` together with :math:`q(u)` (instead of at fixed :math:`q(u)`, a variational EM)
    removes the strong coupling between :math:`q(u)` and :math:`K_{mm}` that made the
    hyperparameters crawl.

    Gibbs state: ``v`` (whitened inducing values, recorded) and ``lam``; a sweep draws
    :math:`\lambda_i \mid v \sim \mathrm{GIG}(\tfrac12, 1, (1 - y_i a_i v)^2 + \tilde k_i)` and
    :math:`v \mid \lambda \sim N(P^{-1}h, P^{-1})`, :math:`P = I + A^\top\Lambda^{-1}A`,
    :math:`h = A^\top Y(1 + \lambda^{-1})` (the bound model of the module docstring, at the
    current hyperparameters).

    Parameters
    ----------
    blocks : InducingGP
    X : ndarray (n, d)
    y : ndarray (n,) of -1/+1
    optimize : bool
        Learn the kernel hyperparameters in the VB sweep.
    optimize_inducing : bool
        Also learn the inducing locations (with ``optimize``).
    hyper_mask : array of 0/1 or None
        Which log-hyperparameters to learn (the others keep their values).
    hyper_maxiter : int
        L-BFGS iterations per sweep.
    """

    def __init__(self, blocks: InducingGP, X, y, *, optimize=False, optimize_inducing=False,
                 hyper_mask=None, hyper_maxiter=2):
        self.blocks = blocks
        self.X = np.asarray(X, dtype=float)
        self.y = np.asarray(y, dtype=float)
        self.optimize = bool(optimize)
        self.optimize_inducing = bool(optimize and optimize_inducing)
        self.hyper_mask = None if hyper_mask is None else np.asarray(hyper_mask, dtype=float)
        self.hyper_maxiter = int(hyper_maxiter)
        self.A, self.kt = blocks.project(self.X)

    @property
    def n(self) -> int:
        return self.y.size

    @property
    def blas_work(self) -> float:
        """Flops of the largest product of a sweep (``A^T W A``), for the BLAS thread limit."""
        return float(self.n) * self.blocks.m ** 2

    # -- hyperparameters as one vector -----------------------------------------------------
    def hyper(self) -> np.ndarray:
        """Current learned parameters: log-hyperparameters (and inducing locations)."""
        th = self.blocks.kernel.theta
        return np.concatenate([th, self.blocks.Z.ravel()]) if self.optimize_inducing else th

    def set_hyper(self, phi) -> None:
        """Set the learned parameters (log-hyperparameters clipped to [-12, 12]) and re-project."""
        b = self.blocks
        k = b.kernel.n_params
        b.kernel.theta = np.clip(phi[:k], -12.0, 12.0)
        if self.optimize_inducing:
            b.Z = np.asarray(phi[k:], dtype=float).reshape(b.Z.shape)
        b.refresh()
        self.A, self.kt = b.project(self.X)

    # -- VB pieces ---------------------------------------------------------------------------
    def optimal_q(self, alpha) -> WhitenedGaussian:
        """The optimal q(v) given q(lambda) = GIG(1/2, 1, alpha) at the current hyperparameters."""
        return WhitenedGaussian(*self.blocks.target(self.A, self.y, alpha))

    def collapsed_elbo(self, phi, alpha):
        """ELBO maximized over q(u) at fixed alpha, and its gradient in the learned parameters."""
        self.set_hyper(phi)
        q = self.optimal_q(alpha)
        val = self.blocks.elbo_projected(self.A, self.kt, self.y, q, alpha=alpha)
        g, gZ = self.blocks.hyper_grad(self.X, self.y, q, inducing=self.optimize_inducing,
                                       alpha=alpha, projected=(self.A, self.kt))
        if self.hyper_mask is not None:
            g = g * self.hyper_mask
        return val, (np.concatenate([g, gZ.ravel()]) if self.optimize_inducing else g)

    def hyper_step(self, alpha) -> None:
        """A few L-BFGS iterations on :meth:`collapsed_elbo`; kept only if it increased."""
        from scipy.optimize import minimize

        phi0 = self.hyper()
        seen = {}

        def neg(phi):
            key = phi.tobytes()
            if key not in seen:
                try:
                    val, g = self.collapsed_elbo(phi, alpha)
                except (np.linalg.LinAlgError, FloatingPointError, ValueError):
                    val, g = -np.inf, np.zeros_like(phi)
                ok = np.isfinite(val) and np.all(np.isfinite(g))
                seen[key] = (-val, -g) if ok else (np.inf, np.zeros_like(phi))
            return seen[key]

        f0, _ = neg(phi0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = minimize(neg, phi0, jac=True, method="L-BFGS-B",
                           options={"maxiter": self.hyper_maxiter})
        self.set_hyper(res.x if np.isfinite(res.fun) and res.fun < f0 else phi0)

    def vb_initial_state(self) -> np.ndarray:
        """State of q(v) = N(0, I): log of its optimal alpha (and the current hyperparameters)."""
        alpha, _ = self.blocks.local(self.A, self.kt, self.y, self.blocks.prior_q())
        x = np.log(alpha)
        return np.concatenate([x, self.hyper()]) if self.optimize else x

    def vb_sweep(self, x):
        """One sweep from state ``x``: returns ``(x_new, q(v), ELBO)``."""
        n = self.n
        alpha = np.exp(np.clip(x[:n], math.log(ALPHA_MIN), 700.0))
        if self.optimize:
            self.set_hyper(x[n:])
            self.hyper_step(alpha)
        q = self.optimal_q(alpha)
        c, fbar = self.blocks.local(self.A, self.kt, self.y, q)
        value = self.blocks.data_elbo(self.y, fbar, c) - q.kl_to_std()
        x_new = np.log(c)
        return (np.concatenate([x_new, self.hyper()]) if self.optimize else x_new), q, value

    def vb_finish(self, x) -> None:
        """Leave the blocks at the hyperparameters of the accepted state ``x``."""
        if self.optimize:
            self.set_hyper(x[self.n:])

    # -- Gibbs pieces ------------------------------------------------------------------------
    def gibbs_initial_state(self, rng) -> dict:
        """Start every chain at v = 0 (the prior mean)."""
        return {"v": np.zeros(self.blocks.m)}

    def gibbs_sweep(self, state, rng) -> dict:
        """Draw lambda | v, then v | lambda (see the class docstring); returns the new state."""
        A, y = self.A, self.y
        c = np.maximum((1.0 - y * (A @ state["v"])) ** 2 + self.kt, ALPHA_MIN)
        il = 1.0 / sample_gig_half(c, rng)
        P = A.T @ (A * il[:, None])
        P[np.diag_indices_from(P)] += 1.0
        h = A.T @ (y * (1.0 + il))
        R, _ = robust_cholesky(P, 1e-10)
        z = rng.standard_normal(self.blocks.m)
        return {"v": _tri_solve(R, _tri_solve(R, h) + z, trans=True)}


def inducing_values(v, blocks):
    """Dataset with the inducing values ``u = L v`` (chain, draw, inducing) of whitened draws
    ``v`` (chain, draw, m): what the GP's Gibbs diagnostics are about."""
    U = v @ blocks.L.T
    return xr.Dataset({"u": (("chain", "draw", "inducing"), U)},
                      coords={"chain": np.arange(U.shape[0]), "draw": np.arange(U.shape[1]),
                              "inducing": np.arange(blocks.m)})


def gp_columns(design):
    """Names and indices of the design columns the GP uses: all but the intercept (the GP has no
    linear part; the kernel's constant term plays the intercept)."""
    keep = [j for j, c in enumerate(design.column_names) if c != "Intercept"]
    return [design.column_names[j] for j in keep], np.asarray(keep, dtype=int)
