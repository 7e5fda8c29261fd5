r"""Parallel EP for the linear SVM at fixed prior precisions, one pass over the rows per sweep.

The Gaussian of the sites, :math:`q(\theta) = N(P^{-1}h, P^{-1})` with
:math:`P = C^T\mathrm{diag}(\tilde\tau)C + T` and :math:`h = C^T\tilde\nu`, depends on the data only
through the *site statistics* :math:`C^T\mathrm{diag}(\tilde\tau)C` and :math:`C^T\tilde\nu` (with a
Schur-eliminated random-effect term also its blocks :math:`D_l`, :math:`G_l`, :math:`b_l`, see
:class:`~vbsvm.models.linear.WorkingGram`), and these are *linear* in the site parameters. So the
statistics of the damped sites :math:`(1-\delta)x + \delta F(x)`, of a SQUAREM proposal (a linear
combination of three site vectors) or of sites extrapolated along a grid of prior variances are the
same combination of the statistics of its parts, formed in :math:`O(q^2)` without reading the data.
A sweep (:class:`EPPass`) is then a single pass over blocks of rows (the model's ``row_chunks()``):
each block's scores under the current Gaussian, their cavities, the tilted moments, the new sites
:math:`F(x)` and their contribution to the statistics of :math:`F(x)`. Beyond the design it holds a
few n-vectors (the sites, the new sites) and O(block) temporaries: no n x q array is formed.

Models with more coefficients than rows and no eliminated term (the n x n Woodbury systems of
:class:`~vbsvm.models.linear.WoodburyPosterior`) build the Gaussian from the sites themselves.

The engine imports no model: the Gaussian of the statistics is the model's algebra, asked of the
model it is handed (``site_gaussian``, :class:`~vbsvm.models.linear_algebra.SiteGaussian`), as are
its row blocks (``row_chunks``) and whether it takes the Woodbury path (``woodbury_applies``).

Row operations. Everything that reads per-row arrays — the default sites, the statistics of a
site vector, a pass, the SQUAREM norms and the checks of a site vector — goes through a
:class:`SiteRows` (:func:`site_rows`): for a model in memory the arrays and loops below; a model
whose rows live elsewhere (the partitions of a Dask frame, :mod:`vbsvm.sources.dask_ep`) hands its
own as ``model.ep_rows``, whose site vectors are names of vectors kept with the rows, combined
lazily by the same arithmetic (``c * v``, ``v + w``, ``v - w``, ``v @ w``). The rest of the engine,
and the variance integration on top of it, only combines site vectors and their statistics.
"""

from __future__ import annotations

import weakref

import numpy as np
import scipy.sparse as sp
from scipy.special import log_ndtr

__all__ = [
    "ANNEAL_FACTOR",
    "STALL_SWEEPS",
    "START_PRECISION",
    "DataPasses",
    "EPPass",
    "EPResult",
    "SiteStatistics",
    "SiteRows",
    "Sites",
    "cavity",
    "expectation_propagation",
    "site_rows",
    "site_terms",
    "site_statistics",
    "tilted_log_normalizer",
    "tilted_moments",
]

LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


# --------------------------------------------------------------------------- tilted moments
def tilted_moments(y, m, v):
    r"""Normalizer and derivatives of the hinge tilted distribution ``N(f; m, v) exp(-2 (1 - y f)_+)``.

    Parameters
    ----------
    y : ndarray
        Labels in {-1, +1}.
    m, v : ndarray
        Mean and variance (> 0) of the Gaussian (the cavity) in ``f``.

    Returns
    -------
    log_z : ndarray
        ``log Z = log int N(f; m, v) exp(-2 (1 - y f)_+) df``.
    g, h : ndarray
        First and second derivative of ``log Z`` in ``m``. The tilted mean is ``m + v g`` and
        its variance ``v + v^2 h``; ``h <= 0`` (log-concavity).
    """
    a, s, log_t1, log_t2 = _tilted_terms(y, m, v)
    log_z = np.logaddexp(log_t1, log_t2)
    pi2 = np.exp(log_t2 - log_z)
    ratio = np.exp(-0.5 * a * a - LOG_SQRT_2PI - log_z) / s  # phi(a) / (s Z)
    g = 2.0 * y * pi2
    h = np.minimum(4.0 * pi2 * (1.0 - pi2) - 2.0 * ratio, 0.0)
    return log_z, g, h


def _tilted_terms(y, m, v):
    """``a``, ``sqrt(v)`` and the logs of the two parts of the tilted normalizer: the mass beyond
    the margin (likelihood 1) and inside it (likelihood ``exp(-2(1 - y f))``)."""
    v = np.asarray(v, dtype=float)
    s = np.sqrt(v)
    mu = np.asarray(y, dtype=float) * np.asarray(m, dtype=float)
    a = (mu - 1.0) / s
    log_t1 = log_ndtr(a)
    log_t2 = 2.0 * mu + 2.0 * v - 2.0 + log_ndtr((1.0 - mu - 2.0 * v) / s)
    return a, s, log_t1, log_t2


def tilted_log_normalizer(y, m, v):
    """``log Z`` of :func:`tilted_moments` alone (half its cost: what the marginal corrections
    evaluate on every row, grid point and coefficient)."""
    _, _, log_t1, log_t2 = _tilted_terms(y, m, v)
    return np.logaddexp(log_t1, log_t2)


# --------------------------------------------------------------------------- site statistics
class DataPasses:
    """Counts the passes over the rows (each reads the design once): the cost unit of a fit at
    large n. ``count`` grows by one per :class:`EPPass` or :func:`site_statistics` call."""

    count = 0


class SiteStatistics:
    """The data part of the Gaussian of a site vector ``(w, r)``: ``A = C_d' W C_d``, ``bd = C_d' r``
    and, for the eliminated term, ``D_l = sum_i w_i z_i z_i'``, ``G_l = sum_i w_i z_i c_i'`` and
    ``b_l = sum_i z_i r_i`` over the rows of each level (the attributes of
    :class:`~vbsvm.models.linear.WorkingGram`, which :class:`~vbsvm.models.linear.CoefficientPosterior`
    reads as its ``gram``). Linear in ``(w, r)``: :meth:`combine`."""

    __slots__ = ("A", "D", "G", "bd", "br")

    def __init__(self, A, bd, D, G, br):
        self.A, self.bd, self.D, self.G, self.br = A, bd, D, G, br

    @classmethod
    def zeros(cls, model) -> SiteStatistics:
        qd = model.qd
        if model.m_sparse:
            m, qs = model.m_sparse, model.q_sparse
            return cls(np.zeros((qd, qd)), np.zeros(qd), np.zeros((m, qs, qs)), np.zeros((m, qs, qd)),
                       np.zeros((m, qs)))
        return cls(np.zeros((qd, qd)), np.zeros(qd), None, None, np.zeros((0, 1)))

    @staticmethod
    def combine(coefs, parts) -> SiteStatistics:
        """``sum_k coefs[k] parts[k]``: the statistics of the same combination of site vectors."""
        def mix(name):
            arrays = [getattr(p, name) for p in parts]
            if arrays[0] is None:
                return None
            out = coefs[0] * arrays[0]
            for c, a in zip(coefs[1:], arrays[1:]):
                if c != 0.0:
                    out += c * a
            return out
        return SiteStatistics(mix("A"), mix("bd"), mix("D"), mix("G"), mix("br"))


class _RowPlan:
    """Row blocks of a model and, with an eliminated term, each block's level-incidence matrices
    ``(m, rows)`` (one per column of the term): built once per model, O(n) memory."""

    def __init__(self, model):
        self.blocks = model.row_chunks()
        self.incidence = []
        if model.m_sparse:
            m = model.m_sparse
            for rows in self.blocks:
                codes = model.codes[rows]
                cols = np.arange(codes.size)
                self.incidence.append([sp.csr_matrix((model.Zs[rows, j], (codes, cols)), shape=(m, codes.size))
                                       for j in range(model.q_sparse)])


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan(model) -> _RowPlan:
    plan = _PLANS.get(model)
    if plan is None or len(plan.blocks) and plan.blocks[-1].stop != model.n:
        plan = _PLANS[model] = _RowPlan(model)
    return plan


class _Accumulator:
    """Adds the rows of a block to site statistics."""

    def __init__(self, model):
        self.model = model
        self.stats = SiteStatistics.zeros(model)

    def add(self, b, rows, w, r):
        model, s = self.model, self.stats
        block = model.Cd[rows]
        scaled = block * np.sqrt(np.maximum(w, 0.0))[:, None]
        s.A += scaled.T @ scaled
        s.bd += block.T @ r
        if model.m_sparse:
            Z = model.Zs[rows]
            WC = block * w[:, None]
            WZ = Z * w[:, None]
            for j, inc in enumerate(_plan(model).incidence[b]):
                s.D[:, j, :] += inc @ WZ
                s.G[:, j, :] += inc @ WC
                s.br[:, j] += inc @ r


def site_statistics(model, w, r) -> SiteStatistics:
    """:class:`SiteStatistics` of the sites ``(w, r)`` (one pass over the rows)."""
    DataPasses.count += 1
    acc = _Accumulator(model)
    for b, rows in enumerate(_plan(model).blocks):
        acc.add(b, rows, w[rows], r[rows])
    s = acc.stats
    s.A = 0.5 * (s.A + s.A.T)
    return s


#: Precision of the hinge sites a cold EP run starts from (their shifts: ``2 y`` times it), the
#: working likelihood of the augmentation at ``w = 1`` tempered to a tenth: at the fixed point most
#: sites (rows beyond the margin) hold almost no precision, and from 1 the first sweeps spent
#: themselves shrinking every site. Cold runs at the variances' starting point (moment rule, 0.01
#: sds), with 1 and with 0.1: 16 and 9 sweeps (Section 4.2, n = 100, d = 10; means of three
#: replicates), 25 and 19 (n = 500, d = 50), 15 and 6 (heart), 34 and 33 (spam), 14 and 11 (toenail).
START_PRECISION = 0.1


class SiteRows:
    """The row operations of parallel EP for a model whose rows are in memory: site vectors are
    ndarrays (the ``n`` hinge sites, then any prior sites).

    A model whose rows live elsewhere supplies an object with the same methods as
    ``model.ep_rows`` (see the module docstring)."""

    def __init__(self, model):
        self.model = model

    def default_sites(self):
        """``(precisions, shifts)`` of the default hinge sites: :data:`START_PRECISION` and
        ``2 y`` times it per row."""
        y = self.model.y
        return START_PRECISION * np.ones(y.size), START_PRECISION * (2.0 * y)

    @staticmethod
    def as_vector(v):
        """A site vector from what a caller passed (a copy as float)."""
        return np.array(v, dtype=float)

    def statistics(self, x) -> SiteStatistics:
        """The statistics of the hinge part of the sites ``x`` (one pass)."""
        n = self.model.n
        return site_statistics(self.model, x.prec[:n], x.shift[:n])

    def sweep(self, problem, x, post):
        """The rows' part of :class:`EPPass` from the sites ``x`` under their Gaussian ``post``:
        ``(new_prec, new_shift, stats, site_sum, quad, change, leverage, ok)`` (``stats`` None on
        the Woodbury path; the rest undefined unless ``ok``)."""
        model = self.model
        n = model.n
        new_prec, new_shift = np.empty(n), np.empty(n)
        acc = None if problem.woodbury else _Accumulator(model)
        whole = post.linear_predictor() if problem.woodbury else None
        site_sum, quad, change, ok, leverage = 0.0, 0.0, 0.0, True, 0.0
        y = model.y
        for b, rows in enumerate(_plan(model).blocks):
            mf, vf = (whole[0][rows], whole[1][rows]) if whole is not None else _block_scores(post, model, b, rows)
            pb, sb = x.prec[rows], x.shift[rows]
            cv, cm = cavity(mf, vf, pb, sb)
            log_zi, g, h = tilted_moments(y[rows], cm, cv)
            if not ((vf > 0).all() and np.isfinite(log_zi).all()):
                ok = False
                break
            den = 1.0 + h * cv
            npb, nsb = -h / den, (g - cm * h) / den
            new_prec[rows], new_shift[rows] = npb, nsb
            site_sum += site_terms(log_zi, mf, vf, cm, cv)
            quad += float(sb @ mf)
            leverage = max(leverage, float((pb * vf).max(initial=0.0)))
            change = max(change, float((np.abs(npb - pb) / (1.0 + np.abs(pb))).max(initial=0.0)),
                         float((np.abs(nsb - sb) / (1.0 + np.abs(sb))).max(initial=0.0)))
            if acc is not None:
                acc.add(b, rows, npb, nsb)
        stats = None
        if ok and acc is not None:
            stats = acc.stats
            stats.A = 0.5 * (stats.A + stats.A.T)
        return new_prec, new_shift, stats, site_sum, quad, change, leverage, ok

    @staticmethod
    def sites_ok(x) -> bool:
        """Whether the site vectors ``x`` are finite with non-negative precisions."""
        return bool(np.isfinite(x.prec).all() and np.isfinite(x.shift).all() and (x.prec >= 0).all())

    @staticmethod
    def squarem_norms(x0, x1, x2):
        """``(|x1 - x0|^2, |x2 - 2 x1 + x0|^2)`` over both parameter vectors."""
        return _sq_dist(x1, x0), _sq_second_difference(x0, x1, x2)


def site_rows(model):
    """The :class:`SiteRows` of ``model``: its own ``ep_rows`` if it has them, else in memory."""
    rows = getattr(model, "ep_rows", None)
    return rows if rows is not None else SiteRows(model)


def _block_scores(post, model, b, rows):
    """Mean and variance of the scores ``f_i`` of the rows ``rows`` under the Gaussian ``post``."""
    block = model.Cd[rows]
    if not model.m_sparse:
        # [L^{-1}; mu'] C_rows': the last row is the mean, the squares of the others sum to the variance
        V = np.vstack([post.Linv, post.mean_dense]) @ block.T
        mean = V[-1].copy()
        var = np.ones(model.qd) @ np.square(V[:-1], out=V[:-1])
        return mean, var
    qs = model.q_sparse
    codes = model.codes[rows]
    Z = model.Zs[rows]
    ms = post.mean_sparse.reshape(-1, qs)[codes]
    mean = block @ post.mean_dense + np.einsum("ij,ij->i", Z, ms)
    R = block.copy()
    for j in range(qs):
        R -= Z[:, j, None] * post.GDb[codes, j, :]
    V = R @ post.Linv.T
    Dz = np.einsum("ijk,ik->ij", post.Dinv[codes], Z)
    return mean, np.einsum("ij,ij->i", V, V) + np.einsum("ij,ij->i", Dz, Z)


# --------------------------------------------------------------------------- sites and passes
class Sites:
    """Site parameters ``(prec, shift)`` (the n hinge sites, then any prior sites) and the
    :class:`SiteStatistics` of the hinge part (None: not formed, e.g. the Woodbury path)."""

    __slots__ = ("prec", "shift", "stats")

    def __init__(self, prec, shift, stats=None):
        self.prec, self.shift, self.stats = prec, shift, stats

    def __getitem__(self, i):
        """``sites[0]``, ``sites[1]``: the precisions and shifts (as the pair they replace)."""
        return (self.prec, self.shift)[i]

    def __len__(self):
        return 2

    @staticmethod
    def combine(coefs, parts) -> Sites:
        """``sum_k coefs[k] parts[k]``, statistics included (if every part has them)."""
        prec = coefs[0] * parts[0].prec
        shift = coefs[0] * parts[0].shift
        for c, p in zip(coefs[1:], parts[1:]):
            prec += c * p.prec
            shift += c * p.shift
        stats = (SiteStatistics.combine(coefs, [p.stats for p in parts])
                 if all(p.stats is not None for p in parts) else None)
        return Sites(prec, shift, stats)


def cavity(m, v, prec, shift):
    """Variance and mean of the cavities ``N(m, v) / site``."""
    cav_prec = np.maximum(1.0 / v - prec, 1e-12 / v)
    cv = 1.0 / cav_prec
    return cv, cv * (m / v - shift)


def site_terms(log_zi, m, v, cm, cv):
    """``sum_i log C_i`` of sites with tilted normalizers ``log_zi``, marginals ``N(m, v)`` and
    cavities ``N(cm, cv)`` (the sites' part of :meth:`EPPass.log_z`)."""
    return float((log_zi + 0.5 * np.log(cv / v) - 0.5 * (m * m / v - cm * cm / cv)).sum())


class _Problem:
    """What an EP run holds fixed: the model, prior precisions, prior blocks and prior sites."""

    def __init__(self, model, tau, prior=None, blocks=()):
        self.model, self.tau, self.prior, self.blocks = model, np.asarray(tau, dtype=float), prior, blocks
        self.woodbury = not blocks and prior is None and model.woodbury_applies(self.tau)
        self.rows = site_rows(model)

    def with_statistics(self, x: Sites) -> Sites:
        """``x`` with its statistics formed (one pass over the rows) where they are needed."""
        if x.stats is None and not self.woodbury:
            x.stats = self.rows.statistics(x)
        return x

    def gaussian(self, x: Sites):
        """The Gaussian of the sites ``x`` (whose statistics are formed)."""
        model, n, tau = self.model, self.model.n, self.tau
        prior_shift = None
        if self.prior is not None:
            tau = tau.copy()
            tau[self.prior.index] = x.prec[n:]
            prior_shift = np.zeros(model.qd)
            prior_shift[self.prior.index] = x.shift[n:]
        if self.woodbury:
            return model.coefficient_posterior(x.prec[:n], tau, blocks=self.blocks, r=x.shift[:n])
        return model.site_gaussian(tau, x.stats, blocks=self.blocks, prior_shift=prior_shift)


class EPPass:
    """One parallel EP pass from the sites ``x``: their Gaussian, its cavities, the undamped new
    sites ``F(x)`` (``new``, with their statistics) and the scalars of ``log Z_EP`` at ``x``; one
    read of the design by blocks of rows. The first ``n`` sites are the hinge sites; with prior
    sites (e.g. :class:`vbsvm.inference.ep_selection.SpikeSlabSites`) the rest are theirs, which
    replace the prior precisions of their coordinates.

    Raises FloatingPointError (or LinAlgError) if the Gaussian has no finite moments."""

    def __init__(self, problem: _Problem, x: Sites):
        model, prior = problem.model, problem.prior
        n = model.n
        self.problem, self.x = problem, x
        self.prec, self.shift, self.tau, self.blocks, self.prior = x.prec, x.shift, problem.tau, problem.blocks, prior
        self.model_n = n
        self.post = post = problem.gaussian(x)
        DataPasses.count += 1
        new_prec, new_shift, stats, site_sum, quad, change, leverage, ok = problem.rows.sweep(problem, x, post)
        self.scores_ok = ok
        #: largest share ``tau~_i v_i`` of a score's marginal precision held by its own site
        self.max_leverage = min(leverage, 1.0)
        if not ok:
            self.site_sum = np.nan
            self.change = np.inf
            self.new = None
            return
        self.site_sum, self.quad = site_sum, quad
        if prior is not None:
            self.pm, self.pv = post.mean[prior.index], post.diag_cov()[prior.index]
            self.pcv, self.pcm = cavity(self.pm, self.pv, x.prec[n:], x.shift[n:])
            self.tilted = prior.tilted(self.pcm, self.pcv)
            p_prec, p_shift = prior.site(self.pcm, self.pcv, self.tilted)
            change = max(change, float(np.max(np.abs(p_prec - x.prec[n:]) / (1.0 + np.abs(x.prec[n:])), initial=0.0)),
                         float(np.max(np.abs(p_shift - x.shift[n:]) / (1.0 + np.abs(x.shift[n:])), initial=0.0)))
            new_prec, new_shift = np.concatenate([new_prec, p_prec]), np.concatenate([new_shift, p_shift])
        self.new = Sites(new_prec, new_shift, stats)
        self.change = change
        self._moment_change = None
        self._diag_cov = None

    def moment_change(self) -> float:
        """Largest change of a coordinate's mean, in its sds, from the Gaussian of the sites ``x``
        to that of ``F(x)`` (one more Cholesky factorization, no pass over the rows); ``inf``
        where it cannot be formed."""
        if self._moment_change is None:
            self._moment_change = np.inf
            if self.new is not None and self.new.stats is not None and self.prior is None:
                try:
                    new = self.problem.model.site_gaussian(self.tau, self.new.stats, blocks=self.blocks,
                                                          inverse=False)
                    sd = np.sqrt(np.maximum(self.diag_cov(), 1e-300))
                    self._moment_change = float((np.abs(new.mean - self.post.mean) / sd).max())
                except (np.linalg.LinAlgError, FloatingPointError, ValueError):
                    pass
        return self._moment_change

    def diag_cov(self):
        """Marginal variances of the Gaussian of ``x`` (formed once)."""
        if self._diag_cov is None:
            self._diag_cov = self.post.diag_cov()
        return self._diag_cov

    @property
    def new_prec(self):
        return self.new.prec

    @property
    def new_shift(self):
        return self.new.shift

    def damped(self, delta) -> Sites:
        """``(1 - delta) x + delta F(x)``, statistics by the same combination."""
        return Sites.combine((1.0 - delta, delta), (self.x, self.new))

    def finite(self) -> bool:
        if self.new is None:
            return False
        ok = np.isfinite(self.change) and self.scores_ok and self.problem.rows.sites_ok(self.new)
        if self.prior is not None:
            ok = ok and np.all(self.pv > 0) and np.all(np.isfinite(self.tilted.log_z))
        return bool(ok)

    def log_z(self) -> float:
        r"""``log Z_EP`` from the Gaussian built on the current sites and their cavities: the
        Gaussian's normalizer relative to the prior's, plus each site's normalizer
        :math:`\log Z_i + \tfrac12\log(v_{-i}/v_i) - \tfrac12(m_i^2/v_i - m_{-i}^2/v_{-i})`.
        Coordinates with prior sites have no Gaussian prior: their ``log tau`` is replaced by
        ``log 2 pi`` (the Gaussian's normalizer keeps its ``(2 pi)^{1/2}`` there). Coordinates
        under a covariance block (``tau`` 0 there) contribute ``log|Lambda|`` once per level."""
        post, n = self.post, self.model_n
        quad, sites = self.quad, self.site_sum
        if self.prior is not None:
            quad += float(self.shift[n:] @ self.pm)
            sites += site_terms(self.tilted.log_z, self.pm, self.pv, self.pcm, self.pcv)
        return float(0.5 * self.log_det_prior() + 0.5 * post.logdet_cov() + 0.5 * quad + sites)

    def log_det_prior(self) -> float:
        """``log |T|`` of the Gaussian prior factors (see :meth:`log_z`)."""
        log_tau = np.log(self.tau, where=self.tau > 0, out=np.zeros_like(self.tau))
        if self.prior is not None:
            log_tau[self.prior.index] = np.log(2.0 * np.pi)
        return float(np.sum(log_tau)) + sum(index.shape[0] * np.linalg.slogdet(Lam)[1] for index, Lam in self.blocks)


def _try_pass(problem, x):
    """:class:`EPPass` from sites ``x``, or None if its moments or new sites are not finite."""
    try:
        with np.errstate(all="ignore"):
            out = EPPass(problem, problem.with_statistics(x))
    except (np.linalg.LinAlgError, FloatingPointError, ValueError):
        return None
    return out if out.finite() else None


# --------------------------------------------------------------------------- EP at fixed tau
class EPResult:
    """EP fixed point at one set of prior precisions.

    Attributes
    ----------
    post : CoefficientPosterior
        Gaussian q(theta) (mean, covariances, score moments, draws).
    site_prec, site_shift : ndarray (n,)
        Site natural parameters ``tau~_i``, ``nu~_i``.
    stats : SiteStatistics or None
        The sites' statistics (the Gaussian at other prior precisions with these sites, without
        reading the data: :func:`vbsvm.inference.ep_variance_grid.frozen_site_density`).
    site_constant : float
        ``sum_i log C_i``, the sites' normalizers: ``log Z_EP = (log|T| - log|P| + h'P^{-1}h)/2``
        plus this constant (the Gaussian integral of the prior times the unnormalized sites).
    log_z : float
        ``log Z_EP``, the EP approximation of the log marginal pseudo-likelihood.
    mean, diag_cov : ndarray (q,)
        Mean and marginal variances of theta.
    converged : bool
    n_sweeps : int
    grad_correction : ndarray (K,)
        Set by the variance integration: corrected minus EP gradient of ``log p~(eta | y)``.
    annealed : bool
        Set by :func:`expectation_propagation`: the damping was annealed (not a fixed point).
    moment_change : float
        With a moment tolerance: the last sweep's :meth:`EPPass.moment_change` (NaN otherwise).
    max_leverage : float
        Largest ``tau~_i v_i`` (< 1): the share of a score's marginal precision held by its own
        site (a cavity's variance is ``1 / (1 - tau~_i v_i)`` times its marginal's).
    tilted, prior_cavity
        With prior sites only: their tilted moments and ``(mean, variance)`` of their cavities.
    """

    def __init__(self, post, site_prec, site_shift, log_z, converged, n_sweeps, stats=None, site_constant=np.nan):
        self.post = post
        self.site_prec = site_prec
        self.site_shift = site_shift
        self.stats = stats
        self.site_constant = site_constant
        self.log_z = log_z
        self.converged = converged
        self.n_sweeps = n_sweeps
        self.mean = post.mean
        self.diag_cov = post.diag_cov()
        self.annealed = False
        self.max_leverage = 1.0
        self.moment_change = np.nan

    def release_sites(self):
        """Drop the site arrays (2 x n floats): a grid point that will neither warm-start another
        EP run nor be the heaviest point (whose sites the marginal corrections read) keeps only
        its Gaussian, so the grid holds O(q^2) per point beyond the data, not O(n)."""
        self.site_prec = self.site_shift = None

    @property
    def sites(self):
        """:class:`Sites` for a warm start (with their statistics), or None once released."""
        return None if self.site_prec is None else Sites(self.site_prec, self.site_shift, self.stats)


#: ``expectation_propagation(moment_tol=...)`` stops, unconverged, when the moment change has not
#: halved for this many sweeps.
MOMENT_STALL_SWEEPS = 8

#: Damping factor per sweep once ``expectation_propagation`` anneals (see there).
ANNEAL_FACTOR = 0.97

#: Sweeps without halving the largest site change after which ``expectation_propagation`` stops
#: extrapolating (see there).
STALL_SWEEPS = 40

#: Times a SQUAREM proposal with a negative site precision is moved halfway back towards the
#: plain damped sites before the extrapolation is given up for that sweep (Varadhan & Roland's
#: step-length backtracking). Cold runs (sites moving several sds a sweep) otherwise rejected
#: most proposals; with it, 10% fewer passes a ``method="vb"`` fit at n = 500, d = 10 and 50.
SQUAREM_BACKTRACKS = 3


def _as_sites(sites, rows) -> Sites:
    if isinstance(sites, Sites):  # never written to: every step makes new arrays
        return Sites(sites.prec, sites.shift, sites.stats)
    stats = sites[2] if len(sites) > 2 else None
    return Sites(rows.as_vector(sites[0]), rows.as_vector(sites[1]), stats)


def expectation_propagation(model, tau, *, blocks=(), sites=None, prior=None, damping=0.5, tol=1e-6,
                            max_sweeps=500, accelerate=True, anneal_after=None, moment_tol=None,
                            undamped_leverage=None):
    r"""Parallel damped EP for theta at fixed prior precisions ``tau``.

    Parameters
    ----------
    model : vbsvm.models.linear.LinearSVMModel
        Supplies the design (``Cd``, ``Zt``/``codes``) and ``y``.
    tau : ndarray (q,)
        Prior precision of every coordinate of theta (0 on the coordinates of ``blocks``).
    blocks : sequence of (index, Lambda)
        Block priors: each row of ``index`` (levels x q) is ``N(0, Lambda^{-1})`` (a random-effect
        term with slopes, :meth:`~vbsvm.models.linear.LinearSVMModel.prior_blocks`).
    sites : Sites or tuple of ndarray, optional
        Starting ``(site_prec, site_shift)`` (warm start; a :class:`Sites` may carry their
        statistics, which saves a pass over the rows); default :data:`START_PRECISION` times
        ``(1, 2 y)``, the Gaussian working likelihood of the augmentation at ``w = 1`` tempered
        (and ``prior.start()`` for the prior sites).
    prior : optional
        Non-Gaussian priors of some coordinates approximated by sites too (an object with
        ``index``, ``start()``, ``tilted(m, v)`` and ``site(m, v, tilted)``, e.g.
        :class:`vbsvm.inference.ep_selection.SpikeSlabSites`); their entries of ``tau`` are
        ignored.
    damping : float
        Step in the natural parameters: ``site <- (1 - damping) site + damping site_new``. It is
        halved (down to 0.05) whenever the largest site change more than doubles after the fifth
        sweep.
    tol : float
        Convergence: largest change of a site parameter, relative to ``1 + |value|``.
    moment_tol : float, optional
        Converged instead when the mean of the Gaussian of the new sites ``F(x)`` differs from
        that of ``x`` by less than this many sds in every coordinate: :meth:`EPPass.moment_change`,
        one more Cholesky factorization per sweep (models with an n x n
        Woodbury path keep ``tol``). The site rule measures the wrong thing where scores are
        very uncertain: nearly separable data at a large prior variance (n = 500, d = 100,
        sigma2 = e^12.5) have site precisions of 1e-6 and score variances of 5e5, and a site
        rule of 1e-4 stopped 0.86 sds from the fixed point, log Z_EP off by 0.07 and its
        gradient by 2.4; where it does work (d = 10) it needed 6 sweeps from a neighbouring grid
        point's sites where the moments were within 2e-4 sds after 3. The moments are then
        within about 3 ``moment_tol`` sds of the fixed point. A warm-started run whose moment
        change has not halved for :data:`MOMENT_STALL_SWEEPS` sweeps stops, unconverged (far out in the
        tails of nearly separable data, at variances of e^18, parallel EP barely moves).
    max_sweeps : int
        Maximum number of passes (each one read of the design, :class:`EPPass`).
    accelerate : bool
        SQUAREM extrapolation (Varadhan & Roland 2008, S3) of the damped map on the site vector:
        from ``x0``, ``x1 = F(x0)``, ``x2 = F(x1)``, step ``s = -|r|/|v|`` (``r = x1 - x0``,
        ``v = x2 - x1 - r``), proposal ``x0 - 2 s r + s^2 v`` (its statistics the same
        combination: no extra pass); one with a negative site precision is moved halfway back
        towards ``x2`` (at most :data:`SQUAREM_BACKTRACKS` times); kept only if its site
        precisions are non-negative and its residual is below that of ``x1`` (otherwise ``x2``).
        When the largest site change has not halved for :data:`STALL_SWEEPS` sweeps, the run is
        stalled: the extrapolation stops and the damping halves (again after each further
        :data:`STALL_SWEEPS` sweeps without a halving; a run that anneals has its own rule). An acath completion at a weak penalty
        stalled so at damping 0.5, the sites alternating around the fixed point: with SQUAREM
        throughout, 780 sweeps to tol 1e-4; without it at damping 0.5, 145; at damping 0.35
        with SQUAREM, 65.
    undamped_leverage : float, optional
        When the first sweep finds every site's leverage ``tau~_i v_i`` (its share of its score's
        marginal precision) below this, the run goes on undamped and without extrapolation:
        each site then barely moves the others' marginals, parallel EP is close to sequential
        and converges in about half the sweeps (9 instead of 23 to 30 at n = 20,000, 21
        coefficients), with 6 n-vectors of state instead of SQUAREM's 14.
    anneal_after : int, optional
        After this many sweeps without convergence, shrink the damping by a factor
        :data:`ANNEAL_FACTOR` every sweep (no extrapolation) and stop when the damped step is below
        ``tol``: the sites then settle where an oscillation (which non-log-concave prior sites can
        have: correlated terms taking turns in the model) has brought them, not at a fixed point;
        the result's ``annealed`` says so.

    Returns
    -------
    EPResult
    """
    problem = _Problem(model, tau, prior, blocks)
    rule = _StoppingRule(tol, moment_tol, watch_moments=sites is not None)
    done = rule.done
    default_pair = _default_sites(problem.rows, prior)
    default = None
    x = Sites(*default_pair) if sites is None else _as_sites(sites, problem.rows)
    delta = float(damping)
    last = np.inf
    converged = annealed = False
    sweeps = 0
    good = None  # the last pass with finite moments
    best, best_at = np.inf, 0  # the last halving of the largest site change, and its sweep
    while sweeps < max_sweeps:
        cur = _try_pass(problem, x)
        sweeps += 1
        if cur is None:  # a step too far (e.g. extreme variances): back off towards the last good sites
            if good is None:
                if default is not None or sites is None:
                    break
                x = default = Sites(*default_pair)
                continue
            delta = max(0.05, 0.5 * delta)
            x = good.damped(delta)
            continue
        good = cur
        if undamped_leverage is not None and sweeps == 1 and cur.max_leverage < undamped_leverage:
            delta, accelerate = 1.0, False
        if done(cur):
            converged = True
            break
        if rule.stalled(cur, sweeps):
            break
        if anneal_after is not None and sweeps > anneal_after:
            annealed = True
            delta *= ANNEAL_FACTOR
            if cur.change * delta < tol:
                converged = True
                break
            x = cur.damped(delta)
            continue
        if cur.change > 2.0 * last and sweeps > 5:  # divergence, not the transient of the first sweeps
            delta = max(0.05, 0.5 * delta)
        last = cur.change
        if cur.change < 0.5 * best:
            best, best_at = cur.change, sweeps
        elif anneal_after is None and sweeps - best_at > STALL_SWEEPS:  # stalled: more damping, no extrapolation
            accelerate, delta, best_at = False, max(0.05, 0.5 * delta), sweeps
        x1 = cur.damped(delta)
        if not accelerate or sweeps + 2 > max_sweeps:
            x = x1
            continue
        s1 = _try_pass(problem, x1)
        sweeps += 1
        if s1 is None:
            delta = max(0.05, 0.5 * delta)
            x = cur.damped(delta)
            continue
        good = s1
        if done(s1):
            converged = True
            break
        x, sp_, tried = _squarem(problem, cur, x1, s1, delta)
        sweeps += tried
        if sp_ is not None:
            good = sp_
            if done(sp_):
                converged = True
                break
            x = sp_.damped(delta)
            last = sp_.change
    if good is None:
        raise FloatingPointError("EP failed: the Gaussian of the sites has no finite moments at these "
                                 "prior precisions.")
    return _result(good, converged, sweeps, annealed, moment_tol, prior)


class _StoppingRule:
    """When parallel EP stops: the site rule (largest site change below ``tol``) or, with
    ``moment_tol``, the moment rule (the Gaussian's means move by less than ``moment_tol`` sds in
    a sweep; with ``watch_moments``, a run whose moment change has not halved for
    :data:`MOMENT_STALL_SWEEPS` sweeps stops as stalled)."""

    def __init__(self, tol, moment_tol, watch_moments):
        self.tol, self.moment_tol, self.watch_moments = tol, moment_tol, watch_moments
        self.moment_best = [np.inf, 0]

    def done(self, p) -> bool:
        if self.moment_tol is not None:
            mc = p.moment_change()
            if np.isfinite(mc):
                return mc < self.moment_tol
        return p.change < self.tol

    def stalled(self, p, sweeps) -> bool:
        mc = p.moment_change() if self.moment_tol is not None and self.watch_moments else np.nan
        if not np.isfinite(mc):
            return False
        if mc < 0.5 * self.moment_best[0]:
            self.moment_best[:] = [mc, sweeps]
            return False
        return sweeps - self.moment_best[1] >= MOMENT_STALL_SWEEPS


def _default_sites(rows, prior):
    """The starting sites' ``(precisions, shifts)``: :data:`START_PRECISION` and ``2 y`` times it
    per row, then the prior's start."""
    default_pair = rows.default_sites()
    if prior is not None:
        default_pair = tuple(np.concatenate(pair) for pair in zip(default_pair, prior.start()))
    return default_pair


def _squarem(problem, cur, x1, s1, delta):
    """SQUAREM's proposal from the sites ``cur.x``, ``x1`` (the damped sites of the pass ``cur``) and
    the damped sites of the pass ``s1`` from ``x1``: ``(x2, the proposal's pass if it beats s1 else
    None, passes made)``, ``x2`` the sites to go on from when it does not."""
    x2 = s1.damped(delta)
    x0 = cur.x
    nr2, nv2 = problem.rows.squarem_norms(x0, x1, x2)
    if not (nv2 > 0 and np.isfinite(nv2)):
        return x2, None, 0
    s = min(-np.sqrt(nr2 / nv2), -1.0)
    for _ in range(SQUAREM_BACKTRACKS + 1):
        # x0 - 2 s r + s^2 v = (1 + s)^2 x0 - 2 s (1 + s) x1 + s^2 x2
        prop = Sites.combine(((1.0 + s) ** 2, -2.0 * s * (1.0 + s), s * s), (x0, x1, x2))
        if problem.rows.sites_ok(prop):
            break
        s = 0.5 * (s - 1.0)  # halfway back to x2 (s = -1), which is feasible
    else:
        return x2, None, 0
    sp_ = _try_pass(problem, prop)
    return x2, (sp_ if sp_ is not None and sp_.change < s1.change else None), 1


def _result(good, converged, sweeps, annealed, moment_tol, prior) -> EPResult:
    """The :class:`EPResult` of the last pass with finite moments, ``good``."""
    res = EPResult(good.post, good.prec, good.shift, good.log_z(), converged, sweeps, stats=good.x.stats,
                   site_constant=good.site_sum)
    res.max_leverage = good.max_leverage
    res.moment_change = good.moment_change() if moment_tol is not None else np.nan
    res.annealed = annealed
    if prior is not None:  # the prior sites' tilted moments and cavities of the pass read
        res.tilted, res.prior_cavity = good.tilted, (good.pcm, good.pcv)
    return res


def _sq_dist(a: Sites, b: Sites) -> float:
    d1 = a.prec - b.prec
    s = float(d1 @ d1)
    d1 = a.shift - b.shift
    return s + float(d1 @ d1)


def _sq_second_difference(x0: Sites, x1: Sites, x2: Sites) -> float:
    """``|x2 - 2 x1 + x0|^2`` over both parameter vectors."""
    total = 0.0
    for name in ("prec", "shift"):
        v = getattr(x2, name) - 2.0 * getattr(x1, name)
        v += getattr(x0, name)
        total += float(v @ v)
    return total
