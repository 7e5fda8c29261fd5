r"""Expectation propagation for the linear Bayesian SVM, integrated over its variance components.

The calibrated fast approximation (``method="vb"``). Two layers:

**EP at fixed variances.** With prior :math:`\theta \sim N(0, \mathrm{diag}(\tau)^{-1})` and the hinge
pseudo-likelihood :math:`t_i(f_i) = \exp\{-2 (1 - y_i f_i)_+\}` of the score :math:`f_i = c_i^T\theta`,
every site is approximated by an unnormalized Gaussian in :math:`f_i`,
:math:`\tilde t_i(f) = \exp(-\tilde\tau_i f^2/2 + \tilde\nu_i f)`, so that

.. math::

    q(\theta) = N(P^{-1} C^T\tilde\nu, P^{-1}), \qquad P = C^T \mathrm{diag}(\tilde\tau) C + \mathrm{diag}(\tau),

exactly the structure of the Gibbs/VB full conditional with :math:`w = \tilde\tau` and
:math:`r = \tilde\nu`: :class:`~vbsvm.models.linear.CoefficientPosterior` (Schur elimination of the
largest random-intercept factor, one Cholesky of the dense block per sweep, cost
:math:`O(n q_d^2 + q_d^3 + m q_d)`), built from the sites' statistics, which are linear in the
sites (:mod:`vbsvm.inference.ep_sites`: one read of the design per sweep, by blocks of rows).
Parallel EP (all sites at once, damped):
from the marginal :math:`N(f_i; m_i, v_i)` of q form the cavity :math:`v_{-i} = (1/v_i - \tilde\tau_i)^{-1}`,
:math:`m_{-i} = v_{-i}(m_i/v_i - \tilde\nu_i)`; match the moments of the tilted distribution
:math:`N(f; m_{-i}, v_{-i})\, t_i(f)`; and move the site to the ratio of the new marginal to the
cavity. The tilted normalizer is closed form (:func:`tilted_moments`): with :math:`\mu = y m_{-i}`,
:math:`s = \sqrt{v_{-i}}`, :math:`a = (\mu - 1)/s`, :math:`b = (1 - \mu - 2 v_{-i})/s`,
:math:`c = 2\mu + 2 v_{-i} - 2`,

.. math::

    Z_i = \Phi(a) + e^{c}\Phi(b), \qquad
    \frac{\partial \log Z_i}{\partial m} = 2 y \pi_i, \qquad
    \frac{\partial^2 \log Z_i}{\partial m^2} = 4\pi_i(1 - \pi_i) - \frac{2\phi(a)}{s Z_i},

where :math:`\pi_i = e^c\Phi(b)/Z_i` (the identity :math:`e^c\phi(b) = \phi(a)` gives the derivatives).
The site update is :math:`\tilde\tau_i = -h/(1 + h v_{-i})`,
:math:`\tilde\nu_i = (g - m_{-i} h)/(1 + h v_{-i})` with :math:`g, h` these two derivatives. The hinge
pseudo-likelihood is log-concave in :math:`f`, so :math:`h \le 0` and every site precision is
non-negative; the cavity precision :math:`1/v_i - \tilde\tau_i` is then positive because
:math:`v_i = c_i^T P^{-1} c_i < 1/\tilde\tau_i`.

The EP approximation of the marginal pseudo-likelihood :math:`Z(\sigma^2) = \int p(\theta \mid \sigma^2)
\prod_i t_i(c_i^T\theta)\, d\theta` is

.. math::

    \log Z_{EP} = \tfrac12 \sum_j \log\tau_j - \tfrac12\log|P| + \tfrac12 \tilde\nu^T m
        + \sum_i \Big[\log Z_i + \tfrac12 \log\frac{v_{-i}}{v_i} - \tfrac12\Big(\frac{m_i^2}{v_i}
        - \frac{m_{-i}^2}{v_{-i}}\Big)\Big],

and at an EP fixed point its derivative in :math:`\eta_k = \log\sigma^2_k` is that of the Gaussian
with the sites held fixed, :math:`-m_k/2 + \tau_k(\lVert\mu_k\rVert^2 + \mathrm{tr}\,\Sigma_{kk})/2`.

**Integration over the variances (INLA-style).** With :math:`\eta = \log\sigma^2` (each
:math:`\sigma^2_k \sim IG(A, B)`), :math:`\log \tilde p(\eta \mid y) = \log Z_{EP}(\eta) + \log p(\eta)`,
:math:`\log p(\eta) = A\log B - \log\Gamma(A) - A\eta - B e^{-\eta}`. The mode is found by
quasi-Newton steps from EP's exact gradients, and a regular grid in the standardized
coordinates :math:`z = \Lambda^{1/2} V^T(\eta - \eta^*)` (step ``dz``) is explored outward from the
mode until the log density falls by more than ``drop``. The posterior is the mixture over grid
points with weights :math:`\propto \tilde p(\eta_g \mid y)` (a regular grid: the Jacobian is
constant): theta is a Gaussian mixture, each variance a discrete distribution on the grid (drawn
with a uniform jitter within its cell). Without inferred variances it is the single EP Gaussian.
The EP runs are made few and cheap (:mod:`vbsvm.inference.ep_variance_grid`, the default of
:func:`integrate_variances`): the mode search starts its curvature from the density with the
sites held fixed, a point is evaluated with the frozen sites of its nearest EP run where that is
predicted accurate (with many rows and few coefficients: every point but two; with a few hundred,
the points far enough in the tails that their errors times their weight are), EP runs start
from the neighbour's sites (scaled along the grid) and stop when their moments settle, looser in
the tails; with one variance the grid is walked outward from a few Newton steps, its step
growing where the density is flat (nearly separable data: the penalty's log variance spread over
10 units) and bounded by how far the coefficients' EP means move between points.

**Random slopes.** A term with q > 1 columns has the prior :math:`b_l \sim N_q(0, \Sigma)` on each
level, :math:`\Sigma \sim IW(\nu, \Psi)`: EP runs with the block prior (a q x q precision block per
level, ``blocks``), and :math:`\eta` gains the log-Cholesky coordinates :math:`v` of :math:`\Sigma`
(:math:`\Sigma = LL^T`, :math:`L_{ii} = e^{v_i}`), whose prior is the IW density times the Jacobian
(:func:`log_cholesky_prior`) and whose gradient at an EP fixed point is again that of the
Gaussian with the sites held fixed (:meth:`_Evidence.gradient`). With three or more coordinates
the grid costs hundreds of EP runs, and the integration uses the central composite design of
R-INLA (:func:`ccd_rule`, 15-27 points) when the log density is close to Gaussian along its
principal axes (otherwise the grid, see :func:`integrate_variances`).

**Marginal corrections.** EP's Gaussian misses the skewness and heavy tails of coefficients set by
a few rows (spam's ``address``: EP sd 0.52x Gibbs). :func:`corrected_marginals` applies the
factorized correction (Cseke & Heskes 2011) to every reported fixed effect and
:func:`local_intercept_marginals` to the intercepts of the eliminated factor, at the heaviest grid
point; :func:`fit_calibrated` carries them to the mixture as a shift and a scale per coordinate.
A correction sums the rows' tilted normalizers on a grid of points of its coefficient; a row whose
margin moves little over them is summed as its Taylor polynomial (:data:`CORRECTION_TAYLOR`).

Measured against the package's Gibbs sampler (``benchmarks/calibrated_vb.py``) with the lattice of
EP runs at the site rule: fixed effects within 0.1 Gibbs sd (toenail 0.16) and sd ratios 0.88-1.03
on toenail, heart, diabetis, german, spam and the Section 4.2 simulations; sigma2 within 1%
(penalty) and -12% (toenail random intercepts). With random slopes (toenail,
``(1 + time | patient_id)``, CCD) the fixed effects are within 0.29 Gibbs sd, their sds 0.88-0.97 of
Gibbs' and the two variances 0.87x and 0.90x. The adaptive integration moved no fixed effect's mean
by more than 0.016 EP sd nor its sd by more than 2% on these problems (bounds against Gibbs: within
0.18 sd on toenail, 0.035 on the penalty problems, spam 0.091).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings

import numpy as np
from scipy.special import erfcx, gammaln

from vbsvm.distributions import InverseWishart
from vbsvm.exceptions import ConvergenceWarning
from vbsvm.inference.ep_sites import (ANNEAL_FACTOR, STALL_SWEEPS, EPResult, expectation_propagation,  # noqa: F401 (re-exported)
                                      tilted_log_normalizer, tilted_moments)
from vbsvm.inference.ep_variance_grid import PointEvaluator, cell_edges, find_mode, walk_1d
from vbsvm.inference.progress import progress_bar
from vbsvm.inference.threads import limit_blas
from vbsvm.spd import pack_spd, spd_inverse, unpack_spd

__all__ = [
    "EPResult",
    "GridPosterior",
    "ccd_rule",
    "corrected_marginals",
    "expectation_propagation",
    "fit_calibrated",
    "integrate_variances",
    "inverse_gamma_match",
    "local_intercept_marginals",
    "log_cholesky_prior",
    "log_prior_eta",
    "log_site_corrections",
    "log_site_ratios",
    "sample_grid",
    "score_covariances",
    "site_correction_terms",
    "tilted_log_normalizer",
    "tilted_moments",
]

# --------------------------------------------------------------------------- variances
def log_prior_eta(eta, A, B):
    """Log density of ``eta = log sigma2`` when ``sigma2 ~ IG(A, B)`` (Jacobian included)."""
    eta = np.asarray(eta, dtype=float)
    return A * np.log(B) - gammaln(A) - A * eta - B * np.exp(-eta)


def log_cholesky_prior(iw, v) -> float:
    r"""Log density of the log-Cholesky coordinates ``v`` (:func:`~vbsvm.spd.pack_spd`) of ``Sigma ~ iw``:
    the IW density of :math:`\Sigma = LL^T` times the Jacobian
    :math:`|\partial\,\mathrm{vech}\Sigma / \partial\,\mathrm{vech} L| = 2^q \prod_i L_{ii}^{q-i+1}` and
    :math:`\partial L_{ii}/\partial v_i = L_{ii}`: :math:`\log J = q\log 2 + \sum_{i=1}^q (q - i + 2) v_i`.
    ``-inf`` where a diagonal ``v_i`` exceeds 300 (``Sigma`` would overflow)."""
    q = iw.dim
    v = np.asarray(v, dtype=float)
    if np.max(v[:q]) > 300.0:
        return -np.inf
    return float(iw.logpdf(unpack_spd(v, q)) + q * np.log(2.0) + np.sum((q + 1.0 - np.arange(q)) * v[:q]))


def covariances_of(coordinates, dims) -> list:
    """The matrices (..., q, q) of consecutive log-Cholesky coordinates (..., sum q(q+1)/2), one
    per dimension ``q`` in ``dims``."""
    out, at = [], 0
    for q in dims:
        k = q * (q + 1) // 2
        out.append(unpack_spd(coordinates[..., at:at + k], q))
        at += k
    return out


LOCAL_Z = np.linspace(-7.5, 7.5, 31)


def local_intercept_marginals(fit, model, z=LOCAL_Z):
    r"""Corrected mean and variance of every intercept of the Schur-eliminated factor.

    The factorized correction of :func:`corrected_marginals` applied to :math:`u_l` with only the
    sites of its own rows (the rows whose score contains :math:`u_l`; the others reach it only
    through the fixed effects): :math:`\tilde p(u_l) \propto q(u_l)\prod_{i: g(i) = l}\int
    q(f_i \mid u_l)\, t_i/\tilde t_i\, df_i`, with :math:`k_i = \mathrm{Cov}(f_i, u_l) =
    c_{d,i}^T\Sigma_{d,l} + \Sigma_{ll}`. One pass over the rows, :math:`O(n\lvert z\rvert)`.

    Returns
    -------
    mean, var : ndarray (m,)
    """
    qd, codes = model.qd, model.codes
    post = fit.post
    mf, vf = post.linear_predictor()
    dvar = fit.diag_cov[qd:]
    mu = fit.mean[qd:]
    k = np.einsum("ij,ji->i", model.Cd, post.cov_dense_sparse()[:, codes]) + dvar[codes]
    s = dvar[codes]
    b = np.maximum(vf - k * k / s, 0.0)[:, None]
    a = mf[:, None] + (k / np.sqrt(s))[:, None] * z[None, :]
    tp, tn = fit.site_prec[:, None], fit.site_shift[:, None]
    one = 1.0 - tp * b
    log_k = -0.5 * np.log(one) + 0.5 * (a * a * tp - 2 * a * tn + tn * tn * b) / one
    with np.errstate(all="ignore"):
        log_z = tilted_log_normalizer(model.y[:, None], (a - b * tn) / one, np.maximum(b / one, 1e-300))
    lp = model.Zt @ (log_k + log_z) - 0.5 * z * z  # sum over each level's rows
    w = np.exp(lp - lp.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    zm = w @ z
    return mu + np.sqrt(dvar) * zm, dvar * np.maximum(w @ (z * z) - zm * zm, 0.0)


class _Evidence:
    r"""``log p~(eta | y)`` and its gradient, EP warm-started from the last sites evaluated.

    ``eta`` holds ``log sigma2_k`` of every variance component, then the log-Cholesky coordinates
    ``v`` of every covariance component (:func:`~vbsvm.spd.unpack_spd`:
    :math:`\Sigma = LL^T`, :math:`L_{ii} = e^{v_i}`, the strict lower triangle as is). Their prior
    is the ``IW(nu, Psi)`` density times the Jacobian of :math:`v \mapsto \mathrm{vech}\,\Sigma`,
    :math:`\log J = q\log 2 + \sum_{i=1}^q (q - i + 2) v_i` (:func:`log_cholesky_prior`).
    """

    def __init__(self, model, ep_options, correct=False):
        self.model = model
        self.options = ep_options
        self.bar = None  # the progress bar of integrate_variances, advanced once per EP run
        # the component of the Schur-eliminated factor, whose gradient gets corrected moments
        self.local = None
        if correct and model.m_sparse:
            for k, c in enumerate(model.variance_components):
                if c.index[0] >= model.qd:
                    self.local = k
        self.sites = None
        self.sizes = np.array([c.size for c in model.variance_components], dtype=float)
        #: (levels, IW prior) of each covariance component, in the order of their coordinates
        self.covariances = [(c.index.shape[0], InverseWishart(c.scale, c.df)) for c in model.covariance_components]
        self.cache = {}
        self.n_ep = 0
        self.n_sweeps = 0
        self.unconverged = 0
        self.annealed = 0
        self.failed = 0

    @property
    def n_variances(self) -> int:
        """Length of ``eta``: one per variance component, ``q(q+1)/2`` per covariance component."""
        return len(self.sizes) + sum(iw.dim * (iw.dim + 1) // 2 for _, iw in self.covariances)

    def covariances_at(self, eta) -> list:
        """The covariance matrix of every covariance component at ``eta``."""
        return covariances_of(eta[len(self.sizes):], [iw.dim for _, iw in self.covariances])

    def _cov_coordinates(self, eta):
        """The log-Cholesky coordinates of each covariance component within ``eta``."""
        at = len(self.sizes)
        for _, iw in self.covariances:
            k = iw.dim * (iw.dim + 1) // 2
            yield eta[at:at + k]
            at += k

    def _scatters(self, res):
        """``sum_l E_q[b_l b_l^T]`` of every covariance component under the EP Gaussian."""
        return [res.mean[c.index].T @ res.mean[c.index] + res.post.block_cov(c.index).sum(0)
                for c in self.model.covariance_components]

    def prior(self, eta):
        """Prior sites at ``eta`` (none: every coordinate has its Gaussian prior)."""
        return None

    def log_prior(self, eta) -> float:
        """``log p(eta)``: the inverse-gamma priors of the log variances and the IW priors of the
        covariances' log-Cholesky coordinates (Jacobians included)."""
        K = len(self.sizes)
        m = self.model
        return float(np.sum(log_prior_eta(eta[:K], m.A, m.B))) + sum(
            log_cholesky_prior(iw, v) for (_, iw), v in zip(self.covariances, self._cov_coordinates(eta)))

    def em_start(self, eta, res):
        """The EM update of ``eta`` from the EP Gaussian at ``eta``: ``sigma2_k = (sq_k + 2B)/(m_k + 2A)``
        and, for a covariance, the mode ``(S + Psi)/(m + nu + q + 1)`` of its IW conditional given
        the expected scatter ``S``."""
        m = self.model
        sq = m.second_moments(res.mean, res.diag_cov)
        new = [np.log((sq + 2 * m.B) / (self.sizes + 2 * m.A))]
        for (levels, iw), S in zip(self.covariances, self._scatters(res)):
            new.append(pack_spd((S + iw.scale) / (levels + iw.df + iw.dim + 1.0)))
        return np.concatenate(new)

    def gradient(self, eta, res):
        r"""Gradient of ``log Z_EP + log p(eta)`` at an EP fixed point: that of the Gaussian with
        the sites held fixed, ``-m_k/2 + e^{-eta_k} sq_k/2``, plus the prior's. For a covariance
        the same argument gives :math:`\partial/\partial\Sigma = G = \tfrac12\Sigma^{-1}(S + \Psi -
        (m + \nu + q + 1)\Sigma)\Sigma^{-1}` (Gaussian levels and IW prior), carried to ``v`` by
        :math:`\partial/\partial L = 2GL` (lower triangle) and :math:`\partial L_{ii}/\partial v_i = L_{ii}`,
        plus the Jacobian's :math:`q - i + 2` on the diagonal coordinates."""
        m = self.model
        K = len(self.sizes)
        sq = m.second_moments(res.mean, res.diag_cov)
        grad = [-self.sizes / 2.0 + np.exp(-eta[:K]) * sq / 2.0 - m.A + m.B * np.exp(-eta[:K])]
        for (levels, iw), S, Sigma in zip(self.covariances, self._scatters(res), self.covariances_at(eta)):
            q = iw.dim
            Sinv = spd_inverse(Sigma)
            G = 0.5 * Sinv @ (S + iw.scale - (levels + iw.df + q + 1.0) * Sigma) @ Sinv
            L = np.linalg.cholesky(Sigma)
            dL = (G + G.T) @ L  # 2 G L, G symmetrized
            grad.append(np.concatenate([np.diag(dL) * np.diag(L) + (q + 1.0 - np.arange(q)),
                                        dL[np.tril_indices(q, -1)]]))
        return np.concatenate(grad)

    @staticmethod
    def key(eta) -> tuple:
        """The cache key of ``eta``."""
        return tuple(np.round(np.asarray(eta, dtype=float), 12))

    def forget_all_but(self, eta):
        """Drop every cached EP result but the one at ``eta``: after the mode search, its other
        points are never revisited, and each holds ``2 n`` site values."""
        key = self.key(eta)
        self.cache = {key: self.cache[key]} if key in self.cache else {}

    def run(self, eta, sites=None, tol=None, max_sweeps=None, damping=None):
        """``(log p~(eta | y), gradient, EPResult)`` at ``eta`` (cached), EP started from ``sites``
        (default: the last run's) at tolerance ``tol`` (default: the options'; the moment
        tolerance where the options have one)."""
        eta = np.asarray(eta, dtype=float)
        key = self.key(eta)
        if key in self.cache:
            return self.cache[key]
        K = len(self.sizes)
        tau = self.model.prior_precision(np.exp(-eta[:K]))
        covs = self.covariances_at(eta)
        blocks = self.model.prior_blocks([spd_inverse(S) for S in covs])
        try:
            criterion = "moment_tol" if self.options.get("moment_tol") is not None else "tol"
            options = self.options if tol is None else {**self.options, criterion: tol}
            if max_sweeps is not None:
                options = {**options, "max_sweeps": min(max_sweeps, options["max_sweeps"])}
            if damping is not None:
                options = {**options, "damping": damping}
            res = expectation_propagation(self.model, tau, blocks=blocks,
                                          sites=sites if sites is not None else self.sites,
                                          prior=self.prior(eta), **options)
            ok = np.isfinite(res.log_z) and np.all(np.isfinite(res.mean)) and np.all(np.isfinite(res.diag_cov))
            # with the moment rule: a run that stopped with its moments still moving by more
            # than UNSETTLED sds per sweep has no usable Gaussian (parallel EP oscillating, as
            # nearly separable data at variances beyond e^18 make it); an infinite change is one
            # that could not be formed (e.g. more columns than rows), and the site rule decided
            ok = ok and not (np.isfinite(res.moment_change) and res.moment_change > UNSETTLED)
        except FloatingPointError:
            ok = False
        if not ok:  # no usable Gaussian at these variances: zero posterior weight
            self.failed += 1
            out = (-np.inf, np.full(self.n_variances, np.nan), None)
            self.cache[key] = out
            return out
        self.sites = res.sites
        self.n_ep += 1
        if self.bar is not None:
            self.bar.update()
        self.n_sweeps += res.n_sweeps
        self.unconverged += not res.converged
        self.annealed += res.annealed
        m = self.model
        lp = res.log_z + self.log_prior(eta)
        grad = self.gradient(eta, res)
        res.grad_correction = np.zeros_like(grad)
        if self.local is not None:
            c_mean, c_var = local_intercept_marginals(res, m)
            k = self.local
            sq = m.second_moments(res.mean, res.diag_cov)
            res.grad_correction[k] = np.exp(-eta[k]) * (np.sum(c_mean ** 2 + c_var) - sq[k]) / 2.0
        out = (lp, grad, res)
        self.cache[key] = out
        return out


class GridPosterior:
    """Mixture over the points of an integration rule in ``eta`` (log variances, log-Cholesky
    coordinates of covariances) of the EP Gaussians of theta: a regular grid, or a central
    composite design (:func:`ccd_rule`).

    Attributes
    ----------
    eta : ndarray (G, K)
        Grid points (log variances, in the order of ``model.variance_components``, then the
        covariances' coordinates).
    weights : ndarray (G,)
        Normalized mixture weights, ``proportional to exp(log_density + log_rule)``.
    log_rule : ndarray (G,)
        Log weight of each point in the integration rule (a regular grid: its cell volume).
    split_scales : ndarray (K, 2), optional
        CCD only: the scales of the split normal of each standardized axis (negative and
        positive side), from which ``eta`` is drawn (:meth:`sample_eta`).
    cells : tuple of ndarray, optional
        The adaptive grid of one variance only: the lower and upper edges of each point's cell
        (within which ``eta`` is drawn uniformly).
    log_density : ndarray (G,)
        ``log Z_EP + log p(eta)`` at each point (plus the integrated gradient correction with
        ``correct_variance=True``).
    fits : list of EPResult
        The EP Gaussian at each point.
    step : ndarray (K, K)
        Columns: the grid's step vectors in eta (a cell is ``eta_g + step @ u``, ``u`` in
        ``[-1/2, 1/2]^K``).
    mode, hessian : ndarray
        Mode of ``log p~(eta | y)`` and minus its Hessian there.
    cov_dims : list of int
        Dimension of each covariance component: the last ``sum q(q+1)/2`` coordinates of ``eta``
        are their log-Cholesky coordinates, the others log variances.
    """

    def __init__(self, eta, log_density, fits, step, mode, hessian, info, cov_dims=(), log_rule=None,
                 split_scales=None, cells=None):
        self.eta = eta
        self.cells = cells
        self.cov_dims = list(cov_dims)
        self.n_log_variances = eta.shape[1] - sum(q * (q + 1) // 2 for q in self.cov_dims)
        self.log_density = log_density
        if log_rule is None:
            cell = abs(np.linalg.det(step)) if eta.shape[1] else 1.0
            log_rule = np.full(log_density.shape, np.log(cell))
        self.log_rule = log_rule
        self.split_scales = split_scales
        lw = log_density + log_rule
        w = np.exp(lw - lw.max())
        self.weights = w / w.sum()
        self.fits = fits
        self.step = step
        self.mode = mode
        self.hessian = hessian
        self.info = info

    @property
    def log_evidence(self) -> float:
        """``log int Z_EP(eta) p(eta) d eta`` by the grid (the approximate log marginal pseudo-likelihood)."""
        if self.eta.shape[1] == 0:
            return float(self.log_density[0])
        lw = self.log_density + self.log_rule
        top = lw.max()
        return float(top + np.log(np.sum(np.exp(lw - top))))

    def sample_eta(self, which, rng):
        """Draws of ``eta``: on a grid uniformly within the cell of each drawn point ``which``; with
        CCD from the split normal of each standardized axis (independent of ``which``)."""
        K = self.eta.shape[1]
        if self.cells is not None:
            lo, hi = self.cells
            return (lo[which] + rng.random(which.size) * (hi[which] - lo[which]))[:, None]
        if self.split_scales is None:
            return self.eta[which] + rng.uniform(-0.5, 0.5, size=(which.size, K)) @ self.step.T
        z = np.abs(rng.standard_normal((which.size, K)))
        lo, hi = self.split_scales[:, 0], self.split_scales[:, 1]
        positive = rng.random((which.size, K)) < hi / (lo + hi)
        return self.mode + np.where(positive, z * hi, -z * lo) @ self.step.T

    def flat_covariances(self, eta):
        """The covariance components at each row of ``eta`` (draws of :meth:`sample_eta`), each
        flattened, concatenated: (draws, sum q^2)."""
        covs = [S.reshape(len(eta), -1) for S in covariances_of(eta[:, self.n_log_variances:], self.cov_dims)]
        return np.concatenate([np.zeros((len(eta), 0))] + covs, axis=1)

    def sigma2_moments(self):
        """Mean and sd of every variance: the grid rule on the points, or with CCD the moments of
        20,000 draws of :meth:`sample_eta` (fixed seed)."""
        if self.n_log_variances == 0:
            return np.zeros(0), np.zeros(0)
        if self.split_scales is None:
            s2, w = np.exp(self.eta[:, : self.n_log_variances]), self.weights
        else:
            draws = self.sample_eta(np.zeros(20_000, dtype=int), np.random.default_rng(0))
            s2, w = np.exp(draws[:, : self.n_log_variances]), np.full(len(draws), 1.0 / len(draws))
        mean = w @ s2
        var = w @ (s2 * s2) - mean * mean
        return mean, np.sqrt(np.maximum(var, 0.0))


#: Radius of the central composite design in standardized units, ``f0 sqrt(K)`` (R-INLA's ``f0``)
CCD_F0 = 1.1

#: ``strategy="auto"`` keeps CCD when every side scale of the split normal is within this factor
#: of 1 (the Gaussian's): toenail with random slopes 0.79-1.23 (kept), 10 or 20 groups 0.67-2.93
#: (the grid)
CCD_MAX_SKEW = 4.0 / 3.0

#: ``strategy="auto"`` replaces a skewed CCD by the grid up to this many coordinates (beyond, a
#: grid exploring a log density drop of 7 costs over 400 EP runs: 731 at K = 5, dz = 2)
CCD_GRID_MAX_K = 3


def ccd_rule(K, f0=CCD_F0):
    r"""Points and log weights of the central composite design in K standardized dimensions.

    The centre, the 2K axial points and a two-level factorial (full for K <= 4, else the half
    fraction with defining relation :math:`I = z_1 \cdots z_K`, resolution K >= V), all but the
    centre at radius :math:`r = f_0\sqrt K` (Rue, Martino & Chopin 2009, Section 6.5; 15, 25, 27
    points for K = 3, 4, 5). The weights make the rule exact for the standard normal density
    :math:`\phi` and for :math:`\phi(z) zz^T`: with N outer points, the centre gets
    :math:`(1 - f_0^{-2})/\phi(0)` and each outer point :math:`1/(f_0^2 N \phi(r))`.

    Returns
    -------
    Z : ndarray (G, K)
        The points, the centre first.
    log_w : ndarray (G,)
        Log weights of the rule :math:`\int h(z) dz \approx \sum_g w_g h(z_g)`.
    """
    r = f0 * np.sqrt(K)
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=K)))
    if K > 4:
        signs = signs[np.prod(signs, axis=1) > 0]
    outer = np.vstack([r * np.eye(K), -r * np.eye(K), signs * (r / np.sqrt(K))])
    Z = np.vstack([np.zeros(K), outer])
    log_phi0 = -0.5 * K * np.log(2.0 * np.pi)
    log_w = np.full(len(Z), -2.0 * np.log(f0) - np.log(len(outer)) - log_phi0 + 0.5 * r * r)
    log_w[0] = np.log(1.0 - f0 ** -2) - log_phi0
    return Z, log_w

def _hessian(ev, eta, h=0.05, run=None):
    """Minus the Hessian of ``log p~(eta | y)`` by central differences of the gradient (NaN where
    EP failed), each side warm-started from the sites at ``eta`` (``run(eta, sites)``: how a point
    is evaluated, default ``ev.run``)."""
    run = run or (lambda e, sites: ev.run(e, sites=sites))
    K = eta.size
    H = np.empty((K, K))
    centre = run(eta, None)[2]
    for k in range(K):
        e = np.zeros(K)
        e[k] = h
        sites = centre.sites if centre is not None else None
        H[:, k] = (run(eta + e, sites)[1] - run(eta - e, sites)[1]) / (2 * h)
    return -(H + H.T) / 2.0


def _find_mode(ev, K, max_iter=30, xtol=1e-3, sd_tol=0.05):
    """Mode of ``log p~(eta | y)``: EM-type fixed-point steps, then damped quasi-Newton.

    At an EP fixed point the gradient is ``-m_k/2 + e^{-eta_k} sq_k/2 - A + B e^{-eta_k}``, zero at
    ``sigma2_k = (sq_k + 2B)/(m_k + 2A)`` — the EM update, used for a safe start. Newton steps start
    from the Hessian by central differences of the gradient and update it by BFGS (re-differenced
    when the update would lose positive definiteness); steps are capped at 1 in every coordinate
    and halved until ``log p~`` increases; the iteration stops when the step is below ``xtol``
    or below ``sd_tol`` posterior sds of eta (the curvature's): the grid is centred at the mode
    but weighted by the density itself, so a mode off by 0.05 sd changes no moment, while the EP
    tolerance makes the gradient too noisy for ``xtol`` on nearly separable data (26 Newton
    iterations at n = 500, d = 100).
    Returns the mode, minus the Hessian there (central differences) and the Newton iterations.
    """
    eta = np.zeros(K)
    for _ in range(3):
        res = ev.run(eta)[2]
        if res is None:
            break
        new = ev.em_start(eta, res)
        if np.max(np.abs(new - eta)) < xtol:
            eta = new
            break
        eta = new
    it = 0
    H = None
    lp, grad, res = ev.run(eta)
    if res is None:
        raise FloatingPointError("EP failed at the starting variances; the model may be degenerate.")
    for it in range(1, max_iter + 1):
        if H is None:
            H = _hessian(ev, eta)
        try:
            if not np.all(np.isfinite(H)):
                raise np.linalg.LinAlgError
            np.linalg.cholesky(H)
            step = np.linalg.solve(H, grad)
        except np.linalg.LinAlgError:
            H = None
            step = grad / max(1.0, np.max(np.abs(grad)))
        step *= min(1.0, 1.0 / max(np.max(np.abs(step)), 1e-300))
        for _ in range(10):
            new = ev.run(eta + step, sites=(res.site_prec, res.site_shift))
            if new[0] >= lp - 1e-10:
                break
            step /= 2.0
        else:
            break  # no ascent along the step: keep eta
        eta = eta + step
        yv = grad - new[1]  # minus the change of the gradient
        lp, grad, res = new
        # the step in posterior sds of eta (the grid's units) when the curvature is known
        sd_step = np.abs(step) * np.sqrt(np.maximum(np.diag(H), 0.0)) if H is not None else np.full(K, np.inf)
        if np.max(np.abs(step)) < xtol or np.max(sd_step) < sd_tol:
            break
        if H is not None:
            sy = float(step @ yv)
            Hs = H @ step
            if sy > 1e-12:
                H = H - np.outer(Hs, Hs) / float(step @ Hs) + np.outer(yv, yv) / sy
            else:
                H = None
    return eta, _hessian(ev, eta), it


#: ``integrate_variances(adaptive=True)``: step of the adaptive grid of one variance, in local
#: sds. On the exact posterior of a variance given one site (skewed), the grid's mean of eta was
#: 4e-4 posterior sds off at 1.0, 3e-3 at 1.25 and 0.018 at 1.5.
LINE_DZ = 1.0

#: ``integrate_variances(adaptive=True)``: EP runs whose sites all have a leverage below this go
#: on undamped (``expectation_propagation(undamped_leverage=...)``).
UNDAMPED_LEVERAGE = 0.02

#: ``integrate_variances(adaptive=True)``: most quasi-Newton steps of the mode search with one
#: variance (its adaptive grid goes on uphill where the density is flat).
LINE_NEWTON = 3

#: An EP run under the moment rule that stops unconverged with a moment change above this (in
#: sds per sweep) counts as failed (zero weight), as one without finite moments does.
UNSETTLED = 0.1

#: ``integrate_variances(adaptive=True)``: most sweeps of a warm-started EP run (far out in the
#: tails of nearly separable data, at variances of e^18, EP may not settle; such a point keeps
#: the moments it has and counts as unconverged).
WARM_MAX_SWEEPS = 15

#: ``integrate_variances(adaptive=True)``: the EP runs stop when the moments of the Gaussian
#: move by less than this (means in sds, sds relative) in a sweep, which leaves them within about
#: 3e-3 sds of the fixed point.
MOMENT_TOL = 1e-3


def integrate_variances(model, *, dz=None, drop=7.0, max_points=400, damping=0.5, tol=1e-6,
                        max_sweeps=500, correct_variance=False, evidence=None, mode_sd_tol=0.05,
                        warn_unconverged=True, anneal_after=None, strategy="auto", adaptive=None,
                        moment_tol=MOMENT_TOL, progress=False) -> GridPosterior:
    """Build the grid posterior of :class:`GridPosterior` for ``model``.

    Parameters
    ----------
    model : vbsvm.models.linear.LinearSVMModel
    dz : float, optional
        Grid step in standardized units (default 1.0 for one or two variances). The
        trapezoid rule on a regular grid is exponentially accurate for a smooth density: with one
        variance, step 1.0 instead of 0.5 changed no fixed-effect mean or sd by more than 1e-4
        (relative, toenail, heart, diabetis, german, the Section 4.2 simulations) and sigma2's
        mean by 0.1%, with 8 fewer EP runs. With two (toenail with ``penalty="auto"``; 64 rows
        in 8 groups with the penalty inferred), against step 0.5 with ``drop=8``: step 1.0 moved
        no fixed-effect mean or sd by more than 1e-4 sd, the variances' means by at most 1.2% and
        their sds by 4-13% (the penalty's long right tail; step 0.75: 1.2% and 10%), with 78 and
        103 points instead of 131 and 166. With three or more coordinates (a 2 x 2 covariance)
        the default is 1.5: on toenail with
        ``(1 + time | patient_id)`` it changed no fixed-effect mean or sd by more than 0.002 sd
        against 1.0, with 165 points instead of 435.
    drop : float
        Grid points are kept while ``log p~`` is within ``drop`` of its value at the mode.
    max_points : int
        Upper bound on the number of grid points (EP runs).
    damping, tol, max_sweeps
        Passed to :func:`expectation_propagation`.
    correct_variance : bool
        Correct the density of the variance of the Schur-eliminated random-intercept factor.
        Its gradient is ``-m/2 + e^{-eta} E||u||^2/2 + d log p(eta)`` with the expectation under
        the exact posterior at ``eta``; EP's Gaussian understates ``E||u||^2`` when many groups
        have one-sided (all-equal) labels, which biases ``sigma2`` low (toenail: -12%). With the
        corrected second moments of :func:`local_intercept_marginals` the difference of the two
        gradients is integrated along the lattice edges (trapezoid rule, from the mode outward)
        and added to ``log Z_EP + log p(eta)``. Other components keep the EP density. Off by
        default: on toenail it moves sigma2 from 0.88x to 1.07x the Gibbs mean but the fixed
        effects from 0.15 to 0.45 Gibbs sds off (EP's fixed effects given sigma2 are biased in the
        opposite direction, and the two errors cancel at the EP density).
    evidence : callable, optional
        Builds the density of ``eta`` from ``(model, ep_options)`` (default: the Gaussian priors
        of ``model``'s variance components; the Laplace-zero prior passes its own,
        :class:`vbsvm.inference.ep_selection.SpikeSlabEvidence`).
    mode_sd_tol : float
        The mode search stops when a step is below this many posterior sds of ``eta``.
    anneal_after : int, optional
        Passed to :func:`expectation_propagation`.
    warn_unconverged : bool
        Warn when EP did not converge at some grid point (the caller may judge by the points'
        weights instead: ``fits[g].converged``).
    adaptive : bool, optional
        The cheaper integration of :mod:`vbsvm.inference.ep_variance_grid`: the mode by
        quasi-Newton from EP's gradients (the curvature started from the frozen-site density's),
        points evaluated with frozen sites where predicted accurate, looser EP tolerances where
        the density is predicted far below its best, warm starts extrapolated along the grid, and
        with one variance the adaptive grid of :func:`~vbsvm.inference.ep_variance_grid.walk_1d`
        (``dz`` its step in local sds). Default: on for the Gaussian priors' density without
        ``correct_variance``; off (the lattice from the mode found by EM and Newton steps with
        differenced Hessians, every point by EP at ``tol``) with a custom ``evidence``.
    moment_tol : float
        With ``adaptive``: the EP runs' convergence rule (``expectation_propagation(moment_tol=...)``)
        at points near the best, looser in the tails (:func:`~vbsvm.inference.ep_variance_grid.point_tolerance`).
    strategy : {"auto", "grid", "ccd"}
        The integration rule: the regular grid, or the central composite design of
        :func:`ccd_rule` (2K + 1 + 2^K or 2^(K-1) points, theta a mixture over them, ``eta`` drawn
        from a split normal whose side scales along each principal axis are read off the axial
        points, as R-INLA's ``int.strategy="ccd"``). ``"auto"``: the grid for up to two
        coordinates (or with ``correct_variance``); from three on, where the grid costs hundreds
        of EP runs (toenail with ``(1 + time | patient_id)``: 165 at ``dz=1.5`` with
        ``penalty=None``, 276 at ``dz=2`` with the penalty inferred), CCD if the log density is
        close to Gaussian along every principal axis (each side scale read off the axial
        points within a factor :data:`CCD_MAX_SKEW` of 1), else the grid (up to
        :data:`CCD_GRID_MAX_K` coordinates; beyond, CCD with a warning). CCD is accurate where
        the covariance is well determined and inaccurate where it is not: with 10 groups of 16
        rows (side scales 0.67 and 1.69 on one axis) its fixed-effect means were 0.09 sd and its
        sds up to 14% off the converged grid; with 30 groups of 20 rows 0.01 sd and 1%.
    progress : bool
        Show a counter of the EP runs with their rate (the rule is adaptive: their number is
        not known in advance; see :mod:`vbsvm.inference.progress`).

    Returns
    -------
    GridPosterior
    """
    start = time.perf_counter()
    options = {"damping": damping, "tol": tol, "max_sweeps": max_sweeps, "anneal_after": anneal_after}
    adaptive = (evidence is None and not correct_variance) if adaptive is None else bool(adaptive)
    if adaptive:
        options["moment_tol"] = moment_tol
        options["undamped_leverage"] = UNDAMPED_LEVERAGE
    ev = _Evidence(model, options, correct=correct_variance) if evidence is None else evidence(model, options)
    ev.bar = progress_bar(None, "EP runs over the variances", progress)
    try:
        return _integrate(ev, model, start, dz=dz, drop=drop, max_points=max_points, mode_sd_tol=mode_sd_tol,
                          warn_unconverged=warn_unconverged, strategy=strategy, adaptive=adaptive,
                          moment_tol=moment_tol, correct_variance=correct_variance)
    finally:
        if ev.bar is not None:
            ev.bar.close()


def _integrate(ev, model, start, *, dz, drop, max_points, mode_sd_tol, warn_unconverged, strategy, adaptive,
               moment_tol, correct_variance):
    """The body of :func:`integrate_variances` once its evidence ``ev`` is set up."""
    K = ev.n_variances
    if K == 0:  # the one EP run is the posterior: the site rule at tol
        ev.options.pop("moment_tol", None)
        lp, _, res = ev.run(np.zeros(0))
        if res is None:
            raise FloatingPointError("EP found no finite Gaussian for this model (fixed prior precisions).")
        return GridPosterior(np.zeros((1, 0)), np.array([lp]), [res], np.zeros((0, 0)), np.zeros(0),
                             np.zeros((0, 0)), {"n_ep": 1, "n_sweeps": ev.n_sweeps, "unconverged": ev.unconverged,
                                                 "annealed": ev.annealed, "seconds": time.perf_counter() - start,
                                                 "failed": ev.failed})
    if dz is None:
        dz = (LINE_DZ if K == 1 and adaptive else 1.0) if K <= 2 else 1.5
    if adaptive:
        evaluate = PointEvaluator(ev, moment_tol, max_sweeps=WARM_MAX_SWEEPS if moment_tol >= MOMENT_TOL else None)
        # one variance: a few Newton steps only; the adaptive grid climbs the rest of the way
        # where the density is flat (nearly separable data: sds of 5-10 in eta)
        mode, lp_mode, grad_mode, res_mode, H, n_newton = find_mode(evaluate, K, np.zeros(K),
                                                                    max_iter=LINE_NEWTON if K == 1 else 40)
        # only the mode's sites warm-start what follows, and with one variance and the rows in
        # memory also those of the converged run nearest to it: the walk's first step scales the
        # sites by the rates between the two (:meth:`PointEvaluator.warm_start`) rather than
        # starting from the mode's alone (3-4% fewer passes at n = 500, d = 50; on a Dask frame
        # the sites live in the workers' memory, whose limit the out-of-core fit is sized to)
        keep = [res_mode]
        others = [a for a in evaluate.anchors if a[1] is not res_mode and a[1].converged]
        if K == 1 and others and getattr(model, "ep_rows", None) is None:
            keep.append(min(others, key=lambda a: float(np.linalg.norm(a[0] - mode)))[1])
        for _, res in evaluate.anchors:
            if all(res is not k for k in keep):
                res.release_sites()
        if K == 1 and strategy != "ccd":
            # the curvature of the mode search (the frozen sites' corrected by EP's secants): an
            # error of a factor 2 changes the step by 1.4, within what the rule tolerates
            return _adaptive_line(ev, evaluate, mode, lp_mode, grad_mode, res_mode, H, n_newton, dz=dz, drop=drop,
                                  max_points=max_points, start=start, warn_unconverged=warn_unconverged)
        H = _hessian(ev, mode, run=lambda e, sites: evaluate(e, warm=sites))

        def run(eta, base, drop_predicted):
            return evaluate(eta, drop_predicted, warm=base.sites)
    else:
        mode, H, n_newton = _find_mode(ev, K, sd_tol=mode_sd_tol)
        ev.forget_all_but(mode)
        evaluate = None

        def run(eta, base, drop_predicted):
            return ev.run(eta, sites=base.sites)
    if not np.all(np.isfinite(H)):
        warnings.warn("EP failed next to the mode of the log variances; the grid uses unit curvature.",
                      ConvergenceWarning, stacklevel=3)
        H = np.eye(K)
    evals, evecs = np.linalg.eigh(H)
    if np.any(evals <= 0):
        warnings.warn("the log posterior of the log variances is not concave at its mode; the grid "
                      "uses the absolute curvature.", ConvergenceWarning, stacklevel=3)
        evals = np.maximum(np.abs(evals), 1e-3)
    ccd_scales = None
    if strategy == "ccd" or (strategy == "auto" and K >= 3 and not correct_variance):
        ccd = _ccd_posterior(ev, mode, H, evecs / np.sqrt(evals)[None, :], n_newton, start, warn_unconverged,
                             run=None if evaluate is None else (lambda e, sites: evaluate(e, warm=sites)),
                             adaptive=evaluate is not None)
        ccd_scales = ccd.split_scales
        skewed = not np.all(np.abs(np.log(ccd_scales)) <= np.log(CCD_MAX_SKEW))
        if strategy == "ccd" or not skewed:
            return ccd
        if K > CCD_GRID_MAX_K:
            ccd.info["skewed"] = True
            warnings.warn(
                f"the posterior of the {K} variance parameters is skewed along some principal axis (side scales "
                f"{ccd_scales.min():.2f}-{ccd_scales.max():.2f} of the Gaussian's); with more than "
                f"{CCD_GRID_MAX_K} of them a grid is too costly, so the CCD integration is used and the "
                "variance components' spread may be misstated (their means less so); check with method='gibbs'.",
                ConvergenceWarning, stacklevel=3)
            return ccd
    return _lattice(ev, evaluate, run, mode, H, evals, evecs, n_newton, ccd_scales, dz=dz, drop=drop,
                    max_points=max_points, start=start, warn_unconverged=warn_unconverged)


def _lattice(ev, evaluate, run, mode, H, evals, evecs, n_newton, ccd_scales, *, dz, drop, max_points, start,
             warn_unconverged):
    """:class:`GridPosterior` on the regular grid along the principal axes of ``H`` (``evals``,
    ``evecs``) at ``mode``, step ``dz`` in standardized units, explored outward while the
    log density stays within ``drop`` of the best (``run`` evaluates a point from a neighbour's
    sites; ``evaluate`` is the adaptive rule's evaluator, or None)."""
    K = ev.n_variances
    step = evecs * (dz / np.sqrt(evals))[None, :]  # columns: eta step per unit grid index
    # Explore the integer lattice outward from the mode (breadth first), keeping points within
    # drop of the highest (corrected) log density seen. A point's sites are dropped once they can
    # neither warm-start a neighbour (its layer is done, or it is not explored further) nor be the
    # heaviest point's (its value is below the best seen, which only grows): then the grid holds
    # the sites of about two layers, not of every point (at 1e6 rows each point's are 16 MB).
    origin = tuple([0] * K)
    points = {origin: ev.run(mode) if evaluate is None else evaluate(mode)}
    delta = {origin: 0.0}  # integrated gradient correction
    best = points[origin][0]
    frontier = [origin]

    def release_below_best(idx):
        res = points[idx][2]
        if res is not None and points[idx][0] + delta[idx] < best:
            res.release_sites()

    while frontier and len(points) < max_points:
        nxt = []
        for idx in frontier:
            base = points[idx][2]
            if base is None:
                continue
            for k, sgn in itertools.product(range(K), (-1, 1)):
                new = list(idx)
                new[k] += sgn
                new = tuple(new)
                if new in points or len(points) >= max_points:
                    continue
                eta = mode + step @ np.array(new, dtype=float)
                # the drop below the best predicted by the quadratic model at the base point
                d_eta = step[:, k] * sgn
                predicted = points[idx][0] + float(points[idx][1] @ d_eta) - 0.5 * float(d_eta @ H @ d_eta)
                out = run(eta, base, best - predicted)  # sites None (released): the last run's
                points[new] = out
                if out[2] is None:
                    delta[new] = -np.inf
                    continue
                delta[new] = delta[idx] + 0.5 * float((base.grad_correction + out[2].grad_correction)
                                                      @ (sgn * step[:, k]))
                value = out[0] + delta[new]
                best = max(best, value)
                if value > best - drop:
                    nxt.append(new)
                else:
                    release_below_best(new)
        for idx in frontier:
            release_below_best(idx)
        frontier = nxt
    if frontier:
        warnings.warn(f"the variance grid reached max_points={max_points} before the log density fell by "
                      f"{drop}; the tails are truncated.", ConvergenceWarning, stacklevel=3)
    keys = [k for k in points if points[k][2] is not None]
    eta = np.array([mode + step @ np.array(k, dtype=float) for k in keys])
    lp = np.array([points[k][0] + delta[k] for k in keys])
    fits = [points[k][2] for k in keys]
    info = _run_info(ev, n_newton, start, warn_unconverged, "grid",
                     points=None if evaluate is None else [points[k][2] for k in points])
    info["n_frozen"] = 0 if evaluate is None else evaluate.n_frozen
    if ccd_scales is not None:
        info["ccd_side_scales"] = ccd_scales.tolist()  # why CCD was not kept
    return GridPosterior(eta, lp, fits, step, mode, H, info, cov_dims=[iw.dim for _, iw in ev.covariances])


def _adaptive_line(ev, evaluate, mode, lp_mode, grad_mode, res_mode, H, n_newton, *, dz, drop, max_points, start,
                   warn_unconverged):
    """:class:`GridPosterior` of one log variance on the adaptive grid of
    :func:`~vbsvm.inference.ep_variance_grid.walk_1d`: each point weighted by its density times
    the width of its cell (the trapezoid rule in the coordinate in which the points are regular)."""
    curvature = float(H[0, 0])
    points, truncated, cut = walk_1d(evaluate, float(mode[0]), lp_mode, grad_mode, res_mode, curvature, dz=dz,
                                     drop=drop, max_points=max_points)
    if truncated:
        warnings.warn(f"the variance grid reached max_points={max_points} before the log density fell by "
                      f"{drop}; the tails are truncated.", ConvergenceWarning, stacklevel=4)
    keep = [p for p in points if p[3] is not None and np.isfinite(p[1])]
    eta = np.array([[p[0]] for p in keep])
    lp = np.array([p[1] for p in keep])
    fits = [p[3] for p in keep]
    lo, hi = cell_edges(eta[:, 0])
    log_w = lp + np.log(hi - lo)
    heaviest = heaviest_point(fits, log_w)
    # as on the lattice, only the heaviest point keeps its sites (the EP runs of the mode search
    # that warm-started the walk included)
    for res in [res for _, res in evaluate.anchors] + fits:
        if res is not fits[heaviest]:
            res.release_sites()
    info = _run_info(ev, n_newton, start, warn_unconverged, "grid", points=fits + [None] * cut)
    info["adaptive"] = True
    info["n_frozen"] = evaluate.n_frozen
    step = np.array([[dz / np.sqrt(max(curvature, 1e-6))]])
    return GridPosterior(eta, lp, fits, step, mode, H, info, log_rule=np.log(hi - lo), cells=(lo, hi))


def heaviest_point(fits, log_w) -> int:
    """The grid point whose sites the marginal corrections read: the heaviest of the converged EP
    runs that kept their sites (an unconverged run at EP's edge, which separable data can make the
    heaviest, would be run on at the site rule for hundreds of sweeps)."""
    log_w = np.asarray(log_w, dtype=float)
    kept = np.array([f.site_prec is not None for f in fits])
    converged = kept & np.array([bool(f.converged) for f in fits])
    for ok in (converged, kept):
        if ok.any():
            return int(np.argmax(np.where(ok, log_w, -np.inf)))
    return int(np.argmax(log_w))


def _run_info(ev, n_newton, start, warn_unconverged, strategy, points=None):
    """The counts of an integration run (and its warnings about failed or unconverged EP runs).
    ``points``: the EP results of the rule's points (None where EP failed), whose failures and
    unconverged runs the warnings count (default: every run, the mode search's included; the
    adaptive integration passes its points, as its mode search tries and rejects far values)."""
    info = {"n_ep": ev.n_ep, "n_sweeps": ev.n_sweeps, "unconverged": ev.unconverged, "failed": ev.failed,
            "annealed": ev.annealed, "newton_iterations": n_newton, "strategy": strategy,
            "seconds": time.perf_counter() - start}
    failed, unconverged, total = ev.failed, ev.unconverged, ev.n_ep
    if points is not None:
        failed = sum(r is None for r in points)
        unconverged = sum(r is not None and not r.converged for r in points)
        total = len(points)
        info.update(grid_failed=failed, grid_unconverged=unconverged)
    if failed:
        warnings.warn(f"EP had no finite solution at {failed} variance values (extreme variances at which "
                      "the model can put every point beyond the margin, or the prior dominates); they get zero weight.",
                      ConvergenceWarning, stacklevel=4)
    if unconverged and warn_unconverged:
        warnings.warn(f"EP did not converge at {unconverged} of {total} variance values; increase "
                      "max_sweeps or lower damping.", ConvergenceWarning, stacklevel=4)
    return info


def _ccd_posterior(ev, mode, H, axes, n_newton, start, warn_unconverged, run=None, adaptive=False):
    """:class:`GridPosterior` on the central composite design around ``mode``; ``axes`` (K, K):
    columns the principal axes of ``H`` scaled by their sds (``eta = mode + axes @ z``);
    ``run(eta, sites)`` evaluates a point (default ``ev.run``)."""
    run = run or (lambda e, sites: ev.run(e, sites=sites))
    K = mode.size
    Z, log_w = ccd_rule(K)
    centre = run(mode, None)
    sites = centre[2].sites
    runs = [centre] + [run(mode + axes @ z, sites) for z in Z[1:]]
    lp = np.array([out[0] for out in runs])
    # split normal: the side scale that gives the Gaussian drop r^2 / 2 at each axial point
    r = Z[1, 0]
    drop = lp[0] - lp[1:2 * K + 1].reshape(2, K).T  # (K, 2): positive side, negative side
    scales = r / np.sqrt(2.0 * np.maximum(drop, r * r / (2.0 * 9.0)))  # at most 3 sds
    split = scales[:, ::-1]  # (negative, positive)
    keep = np.isfinite(lp)
    log_rule = log_w + np.log(abs(np.linalg.det(axes)))
    heaviest = int(np.argmax(np.where(keep, lp + log_rule, -np.inf)))
    for g, out in enumerate(runs):  # as on the grid, only the heaviest point's sites are read later
        if g != heaviest and out[2] is not None:
            out[2].release_sites()
    info = _run_info(ev, n_newton, start, warn_unconverged, "ccd", points=[out[2] for out in runs] if adaptive else None)
    return GridPosterior(mode + Z[keep] @ axes.T, lp[keep], [runs[g][2] for g in np.flatnonzero(keep)], axes,
                         mode, H, info, cov_dims=[iw.dim for _, iw in ev.covariances], log_rule=log_rule[keep],
                         split_scales=split)



# --------------------------------------------------------------------------- marginal correction
#: Evaluation points of :func:`corrected_marginals` (EP sds around the EP mean). The corrected
#: density is smooth, so the rule on a regular grid converges exponentially: against 61 points on
#: [-9, 9] these 25 changed no corrected mean or sd by more than 1e-8 sd (1e-7 relative for the
#: sds) on heart, toenail and the Section 4.2 simulations n=100/500, d=50, and cut the whole
#: ``method="vb"`` fit's CPU time by 10-35%. (With one coefficient, where q(f_i | x) is a point
#: mass and the density has kinks, the rule is second order: mean 1.5e-4 sd and sd 0.3% off on a test case.)
#: On spam, whose corrected densities have cliffs, they are 0.041 sd off a 91-point rule on [-9, 9]
#: in a mean (1.9% in an sd); spacing 0.8 would be 0.12 sd off.
MARGINAL_Z = np.linspace(-7.2, 7.2, 25)

#: The points of :data:`MARGINAL_Z` within this many EP sds of the mean are evaluated for every
#: combination; beyond them a side grows outward one point at a time while its last point's log
#: density is within :data:`MARGINAL_TAIL_DROP` of the highest (see :func:`corrected_marginals`).
MARGINAL_INNER = 4.8
MARGINAL_TAIL_DROP = 10.0


def corrected_marginals(fit, model, L, z=None):
    r"""Mean and sd of the linear combinations ``L @ theta_dense`` with the factorized EP correction.

    The first-order correction of the EP marginal (Cseke & Heskes 2011; Opper, Paquet & Winther
    2013) multiplies the EP Gaussian of :math:`x = l^T\theta` by the expected ratio of every exact
    site to its Gaussian site under the EP conditional of its score,

    .. math::

        \tilde p(x) \propto q(x) \prod_i \int q(f_i \mid x)\, \frac{t_i(f_i)}{\tilde t_i(f_i)}\, df_i,
        \qquad q(f_i \mid x) = N\Big(m_i + \frac{k_i}{s}(x - \mu),\; v_i - \frac{k_i^2}{s}\Big),

    with :math:`\mu = l^T E\theta`, :math:`s = l^T\Sigma l`, :math:`k_i = c_i^T \Sigma l`. Each factor
    is closed form: the Gaussian times the inverse site is :math:`N(f; a', b')` up to
    :math:`\log K = -\tfrac12\log(1 - \tilde\tau b) + \tfrac12[a^2\tilde\tau - 2a\tilde\nu +
    \tilde\nu^2 b]/(1 - \tilde\tau b)` with :math:`b' = b/(1 - \tilde\tau b)`,
    :math:`a' = (a - b\tilde\nu)/(1 - \tilde\tau b)` (positive: :math:`b \le v_i < 1/\tilde\tau`), and
    the remaining integral is the tilted normalizer of :func:`tilted_moments`. The corrected density
    is evaluated on ``z`` (EP standard units) and its mean and sd returned. Cost
    :math:`O(n q_d \lvert z\rvert)` after one :math:`O(n q_d^2)` product; it captures the skewness
    and heavier tails EP's Gaussian misses when a coefficient is set by a few points.

    Parameters
    ----------
    fit : EPResult
    model : vbsvm.models.linear.LinearSVMModel
    L : ndarray (k, qd)
        Rows: the combinations of the dense coordinates (e.g. ``design.to_original(qd)``).
    z : ndarray, optional
        Evaluation points in EP sds around the EP mean (default :data:`MARGINAL_Z`).

    Returns
    -------
    mean, sd : ndarray (k,)

    Notes
    -----
    With the default points, those beyond :data:`MARGINAL_INNER` EP sds are evaluated only as far
    as the density reaches: a side grows outward one point at a time while its last point's log
    density is within :data:`MARGINAL_TAIL_DROP` nats of the highest so far (where the correction
    adds no heavy tail, 17 of the 25 points). Against all 25 points this moved no corrected mean or
    sd by more than 2.2e-5 sd (8e-5 relative for the sds) on spam, heart, toenail and six Section
    4.2 simulations (17-18.7 points), for about 20% fewer instructions in the corrections. Where
    the rows are kept elsewhere (a Dask frame's blocks) a combination's points are one pass over
    them: all 25 are evaluated there and the same rule picks the points that count, so both give
    the same moments.
    """
    tail = z is None
    z = MARGINAL_Z if z is None else np.asarray(z, dtype=float)
    mu = L @ fit.mean[: model.qd]
    # diag(L S L^T) by BLAS: a 3-operand einsum runs O(k q^2) in C loops (slow at large q)
    svar = np.sum((L @ fit.post.cov_dense()) * L, axis=1)
    sd = np.sqrt(np.maximum(svar, 0.0))
    X = mu[:, None] + sd[:, None] * z[None, :]
    if not tail:
        c = log_site_corrections(fit, model, L, X)
    elif getattr(model, "ep_rows", None) is not None:  # all points in one pass over the rows
        c = _tail_points(log_site_corrections(fit, model, L, X), z)
    else:
        c = log_site_corrections(fit, model, L, X, tail_z=z)
    lp = -0.5 * z * z + c
    w = np.exp(lp - lp.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    zm = w @ z
    zs = np.sqrt(np.maximum(np.einsum("kg,kg->k", w, (z[None, :] - zm[:, None]) ** 2), 0.0))
    flat = ~(svar > 0)
    return np.where(flat, mu, mu + sd * zm), np.where(flat, 0.0, sd * zs)


def score_covariances(fit, model, L, SL=None):
    """``Cov_q(f_i, l_k^T theta_dense)`` for every row i and combination k, an array (n, k)
    (``SL``: ``Cov_q(theta_dense) @ L.T`` if the caller has it)."""
    post = fit.post
    Kmat = model.Cd @ (post.cov_dense() @ L.T if SL is None else SL)
    if model.m_sparse:  # + z_i' Cov(b_{g(i)}, x): the level's block of the eliminated term
        R = (post.cov_dense_sparse().T @ L.T).reshape(model.m_sparse, model.q_sparse, -1)
        Kmat += np.einsum("ij,ijk->ik", model.Zs, R[model.codes])
    return Kmat


def log_site_ratios(fit, model, a, b):
    r"""``log E[t_i(f) / \tilde t_i(f)]`` for ``f ~ N(a, b)`` (``a`` (n, G); ``b`` (n, 1), at most the
    EP variance of ``f_i``): the closed form of :func:`corrected_marginals`, per row and point."""
    n = model.n
    tp, tn = fit.site_prec[:n, None], fit.site_shift[:n, None]
    one = 1.0 - tp * b
    log_k = -0.5 * np.log(one) + 0.5 * (a * a * tp - 2 * a * tn + tn ** 2 * b) / one
    with np.errstate(all="ignore"):
        log_z = tilted_log_normalizer(model.y[:, None], (a - b * tn) / one, np.maximum(b / one, 1e-300))
    return log_k + log_z


def log_site_corrections(fit, model, L, X, tail_z=None):
    r"""``log prod_i E_{q(f_i | x)}[t_i(f_i) / \tilde t_i(f_i)]`` (the factorized correction of
    :func:`corrected_marginals`) for each combination ``x = l_k^T theta_dense`` at the points
    ``X[k]``, an array (k, G); 0 where the combination has no variance under q.

    :func:`log_site_ratios` with its terms arranged for the points of one combination: the mean
    ``a`` of ``q(f_i | x)`` is affine in ``x`` and its variance ``b`` does not depend on it, so
    every per-row factor is formed once and each point costs two ``erfcx``, a ``log`` and a few
    fused products. ``tail_z`` (G,): the points in EP sds, to evaluate only those the tail rule of
    :func:`corrected_marginals` keeps (``-inf`` at the others; rows held in memory only)."""
    SL = fit.post.cov_dense() @ L.T  # (qd, k)
    mu = L @ fit.mean[: model.qd]
    svar = np.einsum("kj,jk->k", L, SL)
    rows = getattr(model, "ep_rows", None)
    if rows is not None:  # rows kept elsewhere (e.g. a Dask frame's blocks): the same sums, block by block
        return rows.site_corrections(fit, SL, mu, svar, X, site_correction_terms)
    Kmat = score_covariances(fit, model, L, SL)  # k_i for every row and combination
    mf, vf = fit.post.linear_predictor()
    n = model.n
    return site_correction_terms(Kmat, mf, vf, model.y, fit.site_prec[:n], fit.site_shift[:n], mu, svar, X,
                                 tail_z=tail_z)


def _tail_points(c, z, evaluate=None):
    """The corrections ``c`` (k, G) at the points the tail rule of :func:`corrected_marginals` keeps
    and ``-inf`` at the others: the points within :data:`MARGINAL_INNER` of the mean and, per side,
    the outer ones up to the first whose log density ``c - z^2/2`` is :data:`MARGINAL_TAIL_DROP`
    below the highest so far. With ``evaluate``, ``c`` is filled as the rule goes:
    ``evaluate(combinations, columns)`` returns the corrections at ``columns`` (an integer array
    (len(combinations), g), a row of columns per combination)."""
    k, G = c.shape
    inner = np.flatnonzero(np.abs(z) <= MARGINAL_INNER + 1e-12)
    rows = np.arange(k)
    if evaluate is not None:
        c[:, inner] = evaluate(rows, np.broadcast_to(inner, (k, inner.size)))
    out = np.full((k, G), -np.inf)
    out[:, inner] = c[:, inner]
    lp = out - 0.5 * z * z
    ends = np.array([np.full(k, inner[0]), np.full(k, inner[-1])])  # (side, combination)
    step = np.array([-1, 1])[:, None]
    while True:
        nxt = ends + step
        grow = (nxt >= 0) & (nxt < G) & (lp[rows, ends] - lp.max(axis=1) > -MARGINAL_TAIL_DROP)
        side, ks = np.nonzero(grow)
        if not ks.size:
            return out
        cols = nxt[side, ks]
        if evaluate is not None:  # both sides of every growing combination in one call
            c[ks, cols] = evaluate(ks, cols[:, None])[:, 0]
        out[ks, cols] = c[ks, cols]
        lp[ks, cols] = out[ks, cols] - 0.5 * z[cols] ** 2
        ends[side, ks] = cols


#: Elements of a block of (combinations, rows, points) of :func:`site_correction_terms`; the pairs
#: summed as polynomials (:data:`CORRECTION_TAYLOR`, about half) leave arrays of about 512 KB for
#: those evaluated point by point, which stay in a core's cache (n = 500, q = 51: 14% faster than
#: at half the block and as fast as at twice; without the polynomials 1 << 16 was twice as fast as
#: blocks of 2 MB).
CORRECTION_BLOCK = 1 << 17

#: :func:`site_correction_terms` evaluates the tilted normalizer at standardized margins ``u``
#: clipped to ``[-c - 2 s, c]`` with ``c`` this value (``erfcx`` overflows beyond ``c / sqrt(2)``)
#: and continues it by its asymptotes there (0 above, linear in ``u`` below), exact to double precision.
CORRECTION_CLIP = 37.0

#: Blocks of at most this many (combination, row) pairs evaluate all points and then select those
#: :func:`_tail_points` keeps: the rule's rounds cost more than the points they skip (4.4 ms
#: against 3.6 ms for all 25 points, 11 combinations of 100 rows).
CORRECTION_SMALL = 2000
ROOT_HALF = np.sqrt(0.5)

#: :func:`site_correction_terms` sums a (combination, row) pair's ``log Z`` as its Taylor
#: polynomial of degree :data:`CORRECTION_TAYLOR_ORDER` where its margin ``u`` moves over the
#: points by at most this: the remainder is then at most ``max |d^7 log Z / du^7| 1.75^7 / 7!``
#: at the outermost point, below 9e-3 (the seventh derivative is below 0.88 in absolute value at
#: every ``u`` and scale ``s``: a grid of step 1e-3 over +-37, s from 0.01 to 100), and falls as
#: the seventh power of the distance from the mean. Against the sums point by point, the
#: corrected means and sds moved by at most 1.3e-5 sd on spam, heart, toenail and five Section
#: 4.2 simulations, less than the rule's own error against a 91-point one (2e-5 sd on the smooth
#: ones, 0.041 on spam); n = 500, d = 50: 58% of the pairs, the corrections 30% cheaper. (Degree
#: 4 within 1.0: 41% of the pairs, up to 1.8e-5 sd; degree 6 within 2.0: 7e-5 sd on spam.)
CORRECTION_TAYLOR = 1.75
CORRECTION_TAYLOR_ORDER = 6

#: ... and where the margin's scale ``s`` is at most this: the derivatives of ``log Z`` are
#: differences of terms of size ``(2 s)^k`` (:func:`_taylor_terms`), whose rounding, ``1e-16 (2 s
#: 1.75)^6 / 6!``, is below 3e-10 at 10 but 3e-4 at 100 (nearly separable data at variances near
#: e^15, where the scores' sds reach 1e3, then got corrections that moved test errors by 0.02).
CORRECTION_TAYLOR_SCALE = 10.0


def site_correction_terms(Kmat, mf, vf, y, tp, tn, mu, svar, X, tail_z=None):
    r"""The rows' sum of :func:`log_site_corrections` for rows with score covariances ``Kmat``
    (rows, k), EP score moments ``mf``, ``vf``, labels ``y`` and sites ``tp``, ``tn``, given each
    combination's EP mean ``mu`` and variance ``svar``; an array (k, G). Vectorized over
    combinations, rows and points, by blocks of combinations of at most :data:`CORRECTION_BLOCK`
    elements.

    Per row, ``log K`` is a quadratic in ``dx = x - mu``, so its sum over the rows is formed from
    three per-row coefficients. The tilted normalizer of ``N(m, s^2)`` with the hinge site,
    :math:`Z = \Phi(u) + e^{2m + 2s^2 - 2}\Phi(-u - 2s)` with :math:`u = (m - 1)/s`, is written
    with the scaled complementary error function: since :math:`e^{2m + 2s^2 - 2}\phi(-u - 2s) = \phi(u)`,

    .. math::

        \log Z = -\tfrac12 u^2 + \log\tfrac12
            + \log\big[\operatorname{erfcx}(-u/\sqrt2) + \operatorname{erfcx}((u + 2s)/\sqrt2)\big],

    two ``erfcx`` and one ``log`` per row and point instead of two ``log_ndtr`` and a ``logaddexp``
    (the same values to about 1e-14 relative; a third of the time). Beyond the clip
    :data:`CORRECTION_CLIP` the value continues by the asymptotes: 0 for large ``u``
    (:math:`\Phi(u) = 1`), and :math:`2s u + 2s^2`, linear in ``u``, for ``u + 2s`` very negative.
    ``u`` is affine in ``dx``: a (combination, row) pair whose ``u`` moves little over the points
    (:data:`CORRECTION_TAYLOR`) is summed as the Taylor polynomial of its ``log Z`` in
    ``dx`` (:func:`_taylor_terms`: two ``erfcx`` a pair rather than two a point), the others point
    by point. With ``tail_z`` (the points in EP sds), only the points :func:`_tail_points` keeps
    are evaluated, from the same per-row factors, and the others are ``-inf``.
    """
    out = np.zeros(X.shape)
    live = np.flatnonzero(svar > 0)  # combinations without variance under q keep 0
    n, G = Kmat.shape[0], X.shape[1]
    step = max(1, CORRECTION_BLOCK // max(n * G, 1))
    for start in range(0, live.size, step):
        ks = live[start:start + step]
        kappa = (Kmat[:, ks] / svar[ks]).T  # (k, n): a = mf + kappa (x - mu)
        b = np.maximum(vf - Kmat[:, ks].T * kappa, 0.0)
        one = 1.0 - tp * b
        dx = X[ks] - mu[ks, None]  # (k, G)
        # the block's sums over the rows in powers of dx (but the pairs evaluated point by point):
        # log K = -log(one)/2 + (a^2 tp - 2 a tn + tn^2 b) / (2 one), a quadratic in dx per row
        c2 = 0.5 * tp / one
        poly = np.zeros((CORRECTION_TAYLOR_ORDER + 1, ks.size))
        poly[0] = (-0.5 * np.log(one) + (mf * mf * c2 - mf * tn / one + 0.5 * tn * tn * b / one)).sum(1)
        poly[0] += n * np.log(0.5)
        poly[1] = (2.0 * mf * c2 * kappa - tn * kappa / one).sum(1)
        poly[2] = (c2 * kappa * kappa).sum(1)
        # the tilted normalizer of N(ap, bp), ap = (a - b tn) / one, bp = b / one, at u = (y ap - 1) / s
        s = np.sqrt(np.maximum(b / one, 1e-300))
        with np.errstate(all="ignore"):
            u0 = (y * (mf - b * tn) / one - 1.0) / s
            du = y * kappa / (one * s)
            reach = np.abs(du) * np.abs(dx).max(axis=1)[:, None]  # u's largest move over the points
            smooth = ((reach <= CORRECTION_TAYLOR) & (s <= CORRECTION_TAYLOR_SCALE) & (u0 + reach <= CORRECTION_CLIP)
                      & (u0 - reach >= -CORRECTION_CLIP - 2.0 * s))
        kt, it = np.nonzero(smooth)
        if kt.size:
            terms = _taylor_terms(u0[kt, it], s[kt, it], du[kt, it])
            for p in range(len(poly)):
                poly[p] += np.bincount(kt, weights=terms[p], minlength=ks.size)
        kd, idd = np.nonzero(~smooth)  # the pairs evaluated point by point, by combination
        bounds = np.searchsorted(kd, np.arange(ks.size + 1))
        u0d, dud, s2d = u0[kd, idd], du[kd, idd], 2.0 * s[kd, idd]

        def at(j, cols=None, poly=poly, dx=dx, bounds=bounds, u0d=u0d, dud=dud, s2d=s2d, k=ks.size):
            jj = np.arange(k)[j]
            d = dx[jj] if cols is None else np.take_along_axis(dx[jj], cols, axis=1)
            c = poly[:, jj, None]
            total = c[-1]
            for p in range(len(c) - 2, -1, -1):  # Horner
                total = c[p] + d * total
            count = bounds[jj + 1] - bounds[jj]
            m = int(count.sum())
            if m == 0:
                return total
            ends = np.cumsum(count)
            pairs = np.arange(m) + np.repeat(bounds[jj] - (ends - count), count)
            with np.errstate(all="ignore"):
                u = u0d[pairs, None] + dud[pairs, None] * d[np.repeat(np.arange(jj.size), count)]
                # within [-c, c] (s >= 0) nothing is clipped: the clip and the asymptote skipped
                inside = u.min() >= -CORRECTION_CLIP and u.max() <= CORRECTION_CLIP
                if not inside:
                    lo = (-CORRECTION_CLIP - s2d[pairs])[:, None]
                uc = u if inside else np.clip(u, lo, CORRECTION_CLIP)
                e = erfcx(uc * -ROOT_HALF)
                e += erfcx((uc + s2d[pairs, None]) * ROOT_HALF)
                log_z = np.log(e)
                log_z -= 0.5 * uc * uc
                if not inside:
                    log_z += s2d[pairs, None] * np.minimum(u - lo, 0.0)
            csum = np.concatenate([np.zeros((1, log_z.shape[1])), np.cumsum(log_z, axis=0)])
            return total + (csum[ends] - csum[ends - count])

        if tail_z is None:
            out[ks] = at(slice(None))
        elif ks.size * n <= CORRECTION_SMALL:  # all points at once: cheaper than the rule's rounds
            out[ks] = _tail_points(at(slice(None)), tail_z)
        else:
            out[ks] = _tail_points(np.full((ks.size, G), np.nan), tail_z, at)
    return out


def _taylor_terms(u0, s, du, order=None):
    r"""The Taylor coefficients (order + 1, m) in ``dx`` of ``log Z(u0 + du dx) - log(1/2)`` (the
    tilted normalizer of :func:`site_correction_terms` at the margin ``u0`` with scale ``s``), up to
    ``dx^order`` (default :data:`CORRECTION_TAYLOR_ORDER`). With
    :math:`T = e^{2su + 2s^2}\Phi(-u - 2s)`, :math:`Z = \Phi(u) + T` and :math:`T' = 2sT - \phi(u)`:
    :math:`Z^{(k)} = 2s T^{(k-1)}`, :math:`T^{(m)} = (2s)^m T - \sum_{j<m} (2s)^{m-1-j}\phi^{(j)}`,
    :math:`\phi^{(j)} = (-1)^j \mathrm{He}_j(u)\phi`. Their ratios to ``Z`` come from the two
    ``erfcx`` (:math:`T/Z = e_2/(e_1 + e_2)`, :math:`\phi/Z = \sqrt{2/\pi}/(e_1 + e_2)`), and the
    derivatives of ``log Z`` (the cumulants ``kappa_k``) from the moments ``a_k = Z^{(k)}/Z`` by
    :math:`\kappa_k = a_k - \sum_{m<k}\binom{k-1}{m-1}\kappa_m a_{k-m}`."""
    order = CORRECTION_TAYLOR_ORDER if order is None else order
    e2 = erfcx((u0 + 2.0 * s) * ROOT_HALF)
    total = erfcx(u0 * -ROOT_HALF) + e2
    phi = np.sqrt(2.0 / np.pi) / total
    two_s = 2.0 * s
    he = [np.ones_like(u0), u0]  # Hermite polynomials He_j(u0)
    t = [e2 / total]  # T^(m) / Z
    for m in range(1, order):
        t.append(two_s * t[-1] - (-1) ** (m - 1) * he[m - 1] * phi)
        he.append(u0 * he[m] - m * he[m - 1])
    a = [None] + [two_s * t[k - 1] for k in range(1, order + 1)]
    kappa = [None]
    for k in range(1, order + 1):
        kappa.append(a[k] - sum(math.comb(k - 1, m - 1) * kappa[m] * a[k - m] for m in range(1, k)))
    return np.array([np.log(total) - 0.5 * u0 * u0]
                    + [kappa[k] * du ** k / math.factorial(k) for k in range(1, order + 1)])


# --------------------------------------------------------------------------- entry point
def _moments(grid, model, M):
    """Mixture moments of theta on the scale ``theta_dense -> M theta_dense``. The second moments
    are mixed on the fitted scale and mapped by ``M`` once (the map is linear), not per grid point:
    at q = 2001 and 67 grid points the per-point products took over 60% of the fit's time."""
    qd = model.qd
    w = grid.weights
    raw = np.array([f.mean for f in grid.fits])  # (G, q), fitted scale
    means = raw.copy()
    means[:, :qd] = raw[:, :qd] @ M.T
    mean = w @ means
    second_d = np.zeros((qd, qd))
    second_ds = np.zeros((qd, model.q - qd))
    var = np.zeros(model.q)
    for wk, f, mu in zip(w, grid.fits, raw):
        if wk < 1e-12:
            continue
        second_d += wk * (f.post.cov_dense() + np.outer(mu[:qd], mu[:qd]))
        if model.m_sparse:
            second_ds += wk * (f.post.cov_dense_sparse() + np.outer(mu[:qd], mu[qd:]))
        var[qd:] += wk * (f.diag_cov[qd:] + mu[qd:] ** 2)
    cov_d = M @ second_d @ M.T - np.outer(mean[:qd], mean[:qd])
    cov_ds = M @ second_ds - np.outer(mean[:qd], mean[qd:])
    var[qd:] -= mean[qd:] ** 2
    var[:qd] = np.diag(cov_d)
    return mean, var, cov_d, cov_ds, means


#: Rows above which the marginal corrections are skipped by default: they cost O(n q_d |z|) time
#: and, at n = 1e6 and q_d = 21 with 61 evaluation points, dominated the fit's time; with that many
#: sites per coefficient the EP Gaussian needs no skewness correction (not measured here).
EP_CORRECT_MAX_N = 50_000

#: Site tolerance of a fit's EP runs where the site rule applies: fixed variances, the heaviest grid
#: point read by the marginal corrections (:func:`_settled`), the lattice without ``adaptive``; 1e-4
#: gives the moments of 1e-6 to about three digits on the paper's data sets (the grid's runs use
#: the moment rule, ``integrate_variances(moment_tol=...)``).
EP_TOL = 1e-4

#: Damping of the EP runs of a fit.
EP_DAMPING = 0.5


def fit_calibrated(model, settings=None, M=None) -> dict:
    r"""EP integrated over the variance components: the posterior dict of a ``method="vb"`` fit.

    Parameters
    ----------
    model : vbsvm.models.linear.LinearSVMModel
    settings : dict, optional
        :func:`vbsvm.svm` settings; reads ``draws``, ``chains``, ``draw_seed`` (or ``seed``) for the
        stored iid draws, and optional ``ep_dz``, ``ep_drop``, ``ep_damping``, ``ep_tol``.
    M : ndarray (qd, qd), optional
        Map of the dense coordinates to the reported scale (``design.to_original(model.qd)``);
        identity by default.

    Returns
    -------
    dict
        ``theta_mean`` (q,), ``theta_var`` (q,), ``theta_cov_dense`` (qd, qd), ``theta_cov_ds``
        (qd, m): moments of the mixture q(theta) (dense part mapped by M), with the dense
        coordinates' means and sds corrected (:func:`corrected_marginals` at the heaviest grid
        point, applied as a shift and scale) and those of the eliminated factor's intercepts too
        (:func:`local_intercept_marginals`); ``settings["ep_correct"] = False`` turns both off;
        ``theta_mean_ep``, ``theta_var_ep`` (q,): the uncorrected EP mixture moments;
        ``var_shape``, ``var_scale`` (K,): inverse-gamma moment-matched to each variance's grid
        marginal (for code that wants a closed form); ``sigma2_mean``, ``sigma2_sd`` (K,);
        ``grid_eta`` (G, K), ``grid_weights`` (G,), ``grid_log_density`` (G,), ``grid_step`` (K, K),
        ``grid_theta_mean`` (G, q): the mixture; ``theta_draws`` (chains, draws, q) and
        ``sigma2_draws`` (chains, draws, K): iid joint draws from the mixture; ``log_evidence``:
        EP log marginal pseudo-likelihood integrated over the grid; ``elbo``: 1-element array
        holding ``log_evidence`` (for code that expects an ELBO trace); ``info``: counts (EP runs
        ``n_ep``, their sweeps ``n_sweeps``, grid points evaluated with frozen sites ``n_frozen``,
        unconverged and failed runs) and time (``seconds``: the integration, ``seconds_total``).
    """
    settings = settings or {}
    start = time.perf_counter()
    M = np.eye(model.qd) if M is None else np.asarray(M, dtype=float)
    with limit_blas(getattr(model, "blas_work", 0.0)):
        correct = settings.get("ep_correct", model.n <= EP_CORRECT_MAX_N)
        grid = integrate_variances(model, dz=settings.get("ep_dz"), drop=settings.get("ep_drop", 7.0),
                                   damping=settings.get("ep_damping", EP_DAMPING), tol=settings.get("ep_tol", EP_TOL),
                                   correct_variance=settings.get("ep_correct_variance", False),
                                   strategy=settings.get("ep_strategy", "auto"),
                                   progress=bool(settings.get("progress", False)))
        mean, var, cov_d, cov_ds, means = _moments(grid, model, M)
        if grid.info["unconverged"] == grid.info["n_ep"] or not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
            raise FloatingPointError(
                "EP converged at none of the variance values of its grid (or gave non-finite moments); "
                "fit this model with method='meanfield' or method='gibbs'")
        ep_mean, ep_var = mean.copy(), var.copy()
        s2_mean, s2_sd = grid.sigma2_moments()
        chains, draws = int(settings.get("chains", 4)), int(settings.get("draws", 1000))
        seed = settings.get("draw_seed", settings.get("seed"))
        qd = model.qd
        ratio, u_ratio = np.ones(qd), None
        base = mean.copy()  # the mixture's mean before the corrections, which the draws scale around
        if correct:
            # corrected marginals at the grid's heaviest point, carried to the mixture as a shift
            # and a scale of each dense coordinate (correlations and the random intercepts kept)
            heaviest = heaviest_point(grid.fits, np.log(grid.weights))
            top = _settled(model, grid, heaviest, settings.get("ep_tol", EP_TOL), settings.get("ep_damping", EP_DAMPING))
            c_mean, c_sd = corrected_marginals(top, model, M)
            e_mean = M @ top.mean[: model.qd]
            e_sd = np.sqrt(np.sum((M @ top.post.cov_dense()) * M, axis=1))
            shift = c_mean - e_mean
            ratio = np.where(e_sd > 0, c_sd / np.where(e_sd > 0, e_sd, 1.0), 1.0)
            mean[:qd] += shift
            cov_d = cov_d * np.outer(ratio, ratio)
            cov_ds = cov_ds * ratio[:, None]
            var[:qd] = np.diag(cov_d)
            if model.m_sparse and model.q_sparse == 1:  # intercepts of the eliminated factor: local correction
                u_mean, u_var = local_intercept_marginals(top, model)
                e_var = top.diag_cov[qd:]
                u_shift = u_mean - top.mean[qd:]
                u_ratio = np.sqrt(np.where(e_var > 0, u_var / np.where(e_var > 0, e_var, 1.0), 1.0))
                mean[qd:] += u_shift
                var[qd:] *= u_ratio ** 2
                cov_ds = cov_ds * u_ratio[None, :]
        # draws of the corrected mixture: each coordinate's draws of the EP mixture, shifted and
        # scaled about its mean as the moments above
        theta_draws, sigma2_draws, cov_draws = sample_grid(grid, model, M, chains * draws,
                                                           np.random.default_rng(seed),
                                                           scale=ratio, center=base[:qd], to=mean[:qd])
        if u_ratio is not None:
            theta_draws[:, qd:] = mean[qd:] + (theta_draws[:, qd:] - base[qd:]) * u_ratio
    shape, scale = inverse_gamma_match(s2_mean, s2_sd)
    K = grid.n_log_variances
    extra = {}
    if grid.cov_dims:
        extra["cov_draws"] = cov_draws.reshape(chains, draws, -1)
    if model.m_sparse and model.q_sparse > 1:
        extra["theta_cov_ss_blocks"] = _sparse_block_moments(grid, model)
    return {**extra,
        "theta_mean": mean, "theta_var": var, "theta_cov_dense": cov_d, "theta_cov_ds": cov_ds,
        "theta_mean_ep": ep_mean, "theta_var_ep": ep_var,
        "var_shape": shape, "var_scale": scale, "sigma2_mean": s2_mean, "sigma2_sd": s2_sd,
        "grid_eta": grid.eta, "grid_weights": grid.weights, "grid_log_density": grid.log_density,
        "grid_step": grid.step, "grid_theta_mean": means,
        "theta_draws": theta_draws.reshape(chains, draws, model.q),
        "sigma2_draws": sigma2_draws.reshape(chains, draws, K),
        "log_evidence": grid.log_evidence, "elbo": np.array([grid.log_evidence]),
        "info": {**grid.info, "grid_points": int(grid.eta.shape[0]), "seconds_total": time.perf_counter() - start},
    }


def _settled(model, grid, g, tol, damping):
    """The EP fit at grid point ``g`` with its sites converged (what the marginal corrections
    read: the ratios of the exact sites to the Gaussian ones): the fit itself where the grid ran
    EP to the site rule or converged to the moment rule's :data:`MOMENT_TOL` (the tolerance of the
    points near the best, whose moments are within about 3e-3 sds of the fixed point; running on
    to the site rule ``tol`` moved no corrected mean by more than 0.001 sd on Section 4.2
    simulations, for 3-4 more passes over the rows), else (a frozen or loosely converged point)
    run on from its own sites to the site rule ``tol``."""
    fit = grid.fits[g]
    frozen = getattr(fit, "frozen", False)
    change = getattr(fit, "moment_change", np.nan)
    if fit.sites is None or not frozen and (not np.isfinite(change) or fit.converged and change < MOMENT_TOL):
        return fit
    eta = grid.eta[g]
    K = grid.n_log_variances
    ev = _Evidence(model, {})
    tau = model.prior_precision(np.exp(-eta[:K]))
    blocks = model.prior_blocks([spd_inverse(S) for S in ev.covariances_at(eta)])
    try:
        out = expectation_propagation(model, tau, blocks=blocks, sites=fit.sites, tol=tol, damping=damping)
    except FloatingPointError:
        return fit
    return out if np.all(np.isfinite(out.mean)) and np.all(np.isfinite(out.diag_cov)) else fit


def _sparse_block_moments(grid, model):
    """Mixture covariance (m, q, q) of each level's block of the eliminated random-effect term."""
    m, q = model.m_sparse, model.q_sparse
    second = np.zeros((m, q, q))
    first = np.zeros((m, q))
    for wk, f in zip(grid.weights, grid.fits):
        mu = f.mean[model.qd:].reshape(m, q)
        second += wk * (f.post.sparse_block_cov() + mu[:, :, None] * mu[:, None, :])
        first += wk * mu
    return second - first[:, :, None] * first[:, None, :]


def inverse_gamma_match(mean, sd):
    """Shape and scale of the inverse gamma with this mean and sd (shape ``inf`` where sd is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        shape = np.where(sd > 0, 2.0 + (mean / sd) ** 2, np.inf)
    return shape, mean * (shape - 1.0)


def sample_grid(grid, model, M, size, rng, scale=None, center=None, to=None):
    """``size`` iid joint draws of (theta, sigma2, covariances) from the grid mixture.

    A grid point is drawn by its weight, theta from its EP Gaussian (dense part mapped by ``M``)
    and ``eta`` by :meth:`GridPosterior.sample_eta`: ``sigma2 = exp(eta)`` of the log variances and each
    covariance from its log-Cholesky coordinates, flattened and concatenated (size, sum q^2).
    With ``scale``, ``center`` and ``to`` (qd,), the mapped dense draws ``t`` are returned as
    ``to + (t - center) * scale``; without eliminated random effects the map and this affine
    change are folded into each point's factor, one product a draw.
    """
    G = grid.eta.shape[0]
    qd = model.qd
    which = rng.choice(G, size=size, p=grid.weights)
    theta = np.empty((size, model.q))
    fold = scale is not None and not model.m_sparse
    B = M.T * scale if fold else None  # M' diag(scale)
    for g in np.unique(which):
        rows = np.flatnonzero(which == g)
        post = grid.fits[g].post
        if fold:
            theta[rows] = post.sample_dense_mapped(rows.size, rng, B, to - center * scale)
        else:
            theta[rows] = _sample_gaussian(post, rows.size, rng)
    if not fold:
        theta[:, :qd] = theta[:, :qd] @ M.T
        if scale is not None:
            theta[:, :qd] = to + (theta[:, :qd] - center) * scale
    eta = grid.sample_eta(which, rng)
    return theta, np.exp(eta[:, :grid.n_log_variances]), grid.flat_covariances(eta)


def _sample_gaussian(post, size, rng):
    """``size`` draws of theta from one EP Gaussian, vectorized over draws."""
    return post.sample_many(size, rng)