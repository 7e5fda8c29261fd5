"""The posterior a linear fit holds, in one interface whatever the method that made it.

A fit stores its posterior as arrays on the original predictor scale (``fit.posterior``; what
:meth:`~vbsvm.results.fit.Fit.save` writes). The classes here read those arrays and give what the
result classes need — marginals of the coefficients and variances, draws of any shape, the
moments of the score of new rows — so that the result classes do not branch on the method:

* :class:`GaussianApproximation` (``method="vb"``): the Gaussian q(theta) (mean, dense
  covariance, the cross-covariance with the eliminated random-effect term and that term's
  per-level blocks), inverse-gamma q of each variance, inverse-Wishart q of each covariance; a
  calibrated (EP) fit also stores iid draws of its mixture over the variance grid;
* :class:`PosteriorDraws` (``method="gibbs"``): the draws, shape ``(chains, draws, ...)``;
* :class:`PosteriorMode` (``method="map"``): the mode, without spread;
* :class:`SpikeSlabApproximation` and :class:`SelectionDraws`: the same for the Laplace-zero
  model, whose selectable coefficients are ``u_k = gamma_k v_k`` (q: a spike-and-slab mixture).

Which class a fit uses is :func:`posterior_of`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats

from vbsvm.distributions import Bernoulli, InverseWishart

__all__ = ["GaussianApproximation", "PosteriorDraws", "PosteriorMode", "SpikeSlabApproximation",
           "SelectionDraws", "posterior_of", "add_sparse_score"]


def add_sparse_score(F, theta_sparse, sc, rows=slice(None)):
    """Add the eliminated random-effect term's part of the score to ``F`` (k, r) in place.

    ``theta_sparse`` (k, m q) are k values of that term's coefficients (level-major), ``sc`` the
    ``(codes, Z)`` of the new rows (code -1: unseen level, no contribution) and ``rows`` the rows
    of ``sc`` that ``F``'s columns are.
    """
    if sc is None:
        return F
    codes, Z = sc[0][rows], sc[1][rows]
    q = Z.shape[1]
    seen = np.flatnonzero(codes >= 0)
    for j in range(q):
        F[:, seen] += theta_sparse[:, codes[seen] * q + j] * Z[seen, j]
    return F


def _scores_of_draws(draws, dense, sc, n_dense, chunk_values=4e6):
    """Yield ``(rows, F)``: the scores ``F`` (k, r) of the draws of theta ``draws`` (k, q) for
    blocks of the new rows (at most ``chunk_values`` scores at a time, ~32 MB)."""
    n = dense.shape[0]
    chunk = max(1, int(chunk_values // draws.shape[0]))
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        yield sl, add_sparse_score(draws[:, :n_dense] @ dense[sl].T, draws[:, n_dense:], sc, sl)


class _Posterior:
    """What every representation gives (see the module docstring)."""

    #: the draws are a Markov chain's (R-hat and ESS apply)
    sampled = False
    #: a point (no spread: sds and intervals are NaN)
    point = False
    #: short name of the method, for titles
    label = ""

    def __init__(self, arrays, layout, settings):
        self.arrays, self.layout, self.settings = arrays, layout, settings

    @property
    def shape(self):
        """``(chains, draws)`` of the draws this posterior gives."""
        return int(self.settings.get("chains", 4)), int(self.settings.get("draws", 1000))

    @property
    def elbo(self):
        """The ELBO trace of a VB fit (None otherwise)."""
        return None

    def theta_draws(self) -> np.ndarray:
        """Draws of theta, flattened over chains: (k, q)."""
        return self.draws()[0].reshape(-1, self.layout.q)

    def variance_rows(self, lo_q, hi_q) -> dict:
        """``{name: (mean, sd, lower, upper)}`` of each variance (and of the penalty ``alpha =
        1 / (4 sigma2_u)`` after ``sigma2_u``), from the draws of :meth:`draws`."""
        rows = {}
        if not self.layout.variances:
            return rows
        sig = self.draws()[1]
        sig = sig.reshape(-1, sig.shape[-1])
        for k, name in enumerate(self.layout.variances):
            rows[name] = self.summarize(sig[:, k], lo_q, hi_q)
            if name == "sigma2_u":
                rows["alpha"] = self.summarize(1.0 / (4.0 * sig[:, k]), lo_q, hi_q)
        return rows

    def summarize(self, d, lo_q, hi_q):
        """``(mean, sd, lower, upper)`` of the draws ``d`` of a scalar (quantiles ``lo_q``, ``hi_q``)."""
        return (d.mean(), d.std(ddof=1), np.quantile(d, lo_q), np.quantile(d, hi_q))

    def covariance_draws(self) -> dict:
        """Term name -> draws (k, q, q) of its random-effect covariance."""
        out, at = {}, 0
        P = self.arrays
        for name in self.layout.covariances:
            q = len(self.layout.columns_of(name))
            out[name] = P["cov_draws"].reshape(-1, P["cov_draws"].shape[-1])[:, at:at + q * q].reshape(-1, q, q)
            at += q * q
        return out

    def score_moments(self, dense, sc):
        """Posterior mean and sd of the score of new rows: dense part ``dense`` (n, n_dense) and
        the eliminated term's ``(codes, Z)`` ``sc``."""
        mean, sd = np.empty(dense.shape[0]), np.empty(dense.shape[0])
        for sl, F in _scores_of_draws(self.theta_draws(), dense, sc, self.layout.n_dense):
            mean[sl], sd[sl] = F.mean(0), F.std(0, ddof=1)
        return mean, sd

    def prob_positive(self, rows, mean, sd):
        """``P(f(x) > 0 | data)`` of new rows: the fraction of draws with a positive score.
        ``rows()`` gives the rows' ``(dense, sc)`` with unseen levels at zero; ``mean``/``sd``
        are the score moments (used by closed forms)."""
        dense, sc = rows()
        prob = np.empty(dense.shape[0])
        for sl, F in _scores_of_draws(self.theta_draws(), dense, sc, self.layout.n_dense):
            prob[sl] = (F > 0).mean(0)
        return prob

    def sample_stats(self):
        """The ``sample_stats`` group of the ArviZ tree (None: none)."""
        return None

    def closed_form(self):
        """The Gaussian q of theta and the inverse-gamma q of each variance as arrays
        (``theta_mean``, ``theta_var``, ``var_shape``, ``var_scale``), or None when the posterior
        is not of that form (draws, a mode, a spike-and-slab q)."""
        return None

    def coefficient_covariance(self, p) -> np.ndarray:
        """Posterior covariance (p, p) of the first ``p`` coordinates of theta (the fixed
        effects): the covariance of the draws."""
        d = self.theta_draws()[:, :p]
        return np.atleast_2d(np.cov(d, rowvar=False))

    def arviz_attrs(self, info) -> dict:
        """Attributes of the ArviZ posterior group that say what the draws are."""
        return {}


class PosteriorDraws(_Posterior):
    """``method="gibbs"``: the sampler's draws."""

    sampled = True
    label = "Gibbs"

    @property
    def shape(self):
        return tuple(self.arrays["theta_draws"].shape[:2])

    def theta_marginals(self, index, level):
        """``mean, sd, lower, upper`` of coordinates ``index`` of theta (equal-tailed quantiles)."""
        lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
        d = self.theta_draws()[:, index]
        return d.mean(0), d.std(0, ddof=1), np.quantile(d, lo_q, axis=0), np.quantile(d, hi_q, axis=0)

    def draws(self):
        """Draws ``(theta (chains, draws, q), sigma2 (chains, draws, k))``."""
        return self.arrays["theta_draws"], self.arrays["sigma2_draws"]

    def sample_stats(self):
        return xr.Dataset({"log_pseudo_likelihood": (("chain", "draw"), self.arrays["log_pseudo_likelihood"])})


class PosteriorMode(_Posterior):
    """``method="map"``: the joint posterior mode (sds and intervals NaN)."""

    point = True
    label = "MAP"

    @property
    def shape(self):
        return 1, 1

    def theta_marginals(self, index, level):
        mode = self.arrays["theta_mode"][index]
        nan = np.full_like(mode, np.nan)
        return mode, nan, nan, nan

    def draws(self):
        """The mode as one draw: ``(theta (1, 1, q), sigma2 (1, 1, k))``."""
        return self.arrays["theta_mode"][None, None], self.arrays["sigma2_mode"][None, None]

    def summarize(self, d, lo_q, hi_q):
        """The mode's value, without spread."""
        return (float(d[0]), np.nan, np.nan, np.nan)

    def covariance_draws(self) -> dict:
        out, at = {}, 0
        for name in self.layout.covariances:
            q = len(self.layout.columns_of(name))
            out[name] = self.arrays["cov_mode"][at:at + q * q].reshape(1, q, q)
            at += q * q
        return out

    def score_moments(self, dense, sc):
        th, nd = self.arrays["theta_mode"], self.layout.n_dense
        mean = add_sparse_score((dense @ th[:nd])[None], th[None, nd:], sc)[0]
        return mean, np.full(mean.shape, np.nan)

    def prob_positive(self, rows, mean, sd):
        raise ValueError("a posterior mode has no P(f > 0)")

    def coefficient_covariance(self, p) -> np.ndarray:
        """A mode has no spread: NaN."""
        return np.full((p, p), np.nan)


class GaussianApproximation(_Posterior):
    """``method="vb"``: Gaussian q(theta), IG q of the variances, IW q of the covariances (a
    calibrated fit's mixture over the variance grid: its moments and stored iid draws)."""

    label = "VB"

    @property
    def elbo(self):
        return self.arrays.get("elbo")

    def theta_marginals(self, index, level):
        """``mean, sd, lower, upper`` of coordinates ``index`` of theta (Gaussian intervals)."""
        mean = self.arrays["theta_mean"][index]
        sd = np.sqrt(self.arrays["theta_var"][index])
        z = stats.norm.ppf(1 - (1 - level) / 2)
        return mean, sd, mean - z * sd, mean + z * sd

    def variance_rows(self, lo_q, hi_q) -> dict:
        """Each variance's inverse-gamma q in closed form (and the gamma q of ``alpha``)."""
        rows = {}
        for k, name in enumerate(self.layout.variances):
            a, b = self.arrays["var_shape"][k], self.arrays["var_scale"][k]
            dist = stats.invgamma(a, scale=b)
            mean = b / (a - 1) if a > 1 else np.inf
            sd = np.sqrt(b * b / ((a - 1) ** 2 * (a - 2))) if a > 2 else np.inf
            rows[name] = (mean, sd, dist.ppf(lo_q), dist.ppf(hi_q))
            if name == "sigma2_u":
                tau = stats.gamma(a, scale=1.0 / b)
                rows["alpha"] = (a / (4 * b), np.sqrt(a) / (4 * b), tau.ppf(lo_q) / 4, tau.ppf(hi_q) / 4)
        return rows

    def covariance_draws(self) -> dict:
        """iid draws (``chains x draws`` of them, seeded at fit time) from each IW q, or the
        mixture draws a calibrated fit stored."""
        P = self.arrays
        if "cov_draws" in P:
            return super().covariance_draws()
        out, at = {}, 0
        for i, name in enumerate(self.layout.covariances):
            q = len(self.layout.columns_of(name))
            rng = np.random.default_rng([self.settings.get("draw_seed") or 0, i])
            out[name] = InverseWishart(P["cov_scale"][at:at + q * q].reshape(q, q), P["cov_df"][i]).sample(
                rng, int(np.prod(self.shape)))
            at += q * q
        return out

    def sparse_blocks(self) -> np.ndarray:
        """Marginal covariance blocks (m, q, q) of the eliminated term."""
        P, nd = self.arrays, self.layout.n_dense
        if "theta_cov_ss_blocks" in P:
            return P["theta_cov_ss_blocks"]
        return P["theta_var"][nd:][:, None, None]

    def score_mean_var(self, dense, sc):
        """Mean and variance of the score under the Gaussian q(theta) (code -1 in ``sc``: unseen
        level, no random effect)."""
        P, nd = self.arrays, self.layout.n_dense
        mean = add_sparse_score((dense @ P["theta_mean"][:nd])[None], P["theta_mean"][None, nd:], sc)[0]
        var = np.einsum("ij,ij->i", dense @ P["theta_cov_dense"], dense)
        if sc is not None:
            codes, Z = sc
            seen = np.flatnonzero(codes >= 0)
            s, z = codes[seen], Z[seen]
            q = Z.shape[1]
            C = P["theta_cov_ds"].reshape(nd, -1, q)  # Cov(dense, level block)
            var[seen] += 2 * np.einsum("ij,jik,ik->i", dense[seen], C[:, s, :], z)
            var[seen] += np.einsum("ij,ijk,ik->i", z, self.sparse_blocks()[s], z)
        return mean, var

    def score_moments(self, dense, sc):
        mean, var = self.score_mean_var(dense, sc)
        return mean, np.sqrt(np.maximum(var, 0.0))

    def closed_form(self):
        P = self.arrays
        return {k: np.asarray(P[k]) for k in ("theta_mean", "theta_var", "var_shape", "var_scale")}

    def coefficient_covariance(self, p) -> np.ndarray:
        """The block of the Gaussian q's covariance (a calibrated fit: of its mixture)."""
        return np.asarray(self.arrays["theta_cov_dense"])[:p, :p]

    def prob_positive(self, rows, mean, sd):
        """``Phi(m / s)`` of the Gaussian score."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return stats.norm.cdf(mean / sd)

    def draws(self):
        """iid draws from q in the fit's ``(chains, draws)`` shape, seeded at fit time."""
        P, lay = self.arrays, self.layout
        chains, draws = self.shape
        if "theta_draws" in P:  # iid draws of a mixture (calibrated VB), stored at fit time
            theta, sig = P["theta_draws"], P["sigma2_draws"]
            if theta.shape[:2] == (chains, draws):
                return theta, sig
            # another shape (e.g. compare's reference shape): resample the stored iid draws
            pick = np.random.default_rng(self.settings.get("draw_seed")).integers(
                0, theta.shape[0] * theta.shape[1], size=(chains, draws))
            return (theta.reshape(-1, theta.shape[-1])[pick], sig.reshape(-1, sig.shape[-1])[pick])
        rng = np.random.default_rng(self.settings.get("draw_seed", self.settings.get("seed")))
        Ld = np.linalg.cholesky(P["theta_cov_dense"] + 1e-300 * np.eye(lay.n_dense))
        z = rng.standard_normal((chains, draws, lay.n_dense))
        dense = P["theta_mean"][: lay.n_dense] + z @ Ld.T
        parts = [dense]
        if lay.sparse_group:
            # theta_sparse | theta_dense is Gaussian with one q x q covariance block per level
            ms = P["theta_mean"][lay.n_dense:]
            K = np.linalg.solve(P["theta_cov_dense"], P["theta_cov_ds"])  # (qd, m q) regression
            blocks = self.sparse_blocks()
            m, q = blocks.shape[:2]
            Cb, Kb = P["theta_cov_ds"].reshape(-1, m, q), K.reshape(-1, m, q)
            cond = blocks - np.einsum("dlj,dlk->ljk", Cb, Kb)
            evals, evecs = np.linalg.eigh(0.5 * (cond + np.swapaxes(cond, 1, 2)))
            root = evecs * np.sqrt(np.maximum(evals, 0.0))[:, None, :]  # cond = root root^T
            zs = rng.standard_normal((chains, draws, m, q))
            noise = np.einsum("ljk,cdlk->cdlj", root, zs).reshape(chains, draws, m * q)
            resid = dense - P["theta_mean"][: lay.n_dense]
            parts.append(ms + resid @ K + noise)
        theta = np.concatenate(parts, axis=-1)
        sig = np.empty((chains, draws, len(lay.variances)))
        for k in range(len(lay.variances)):
            sig[..., k] = stats.invgamma(P["var_shape"][k], scale=P["var_scale"][k]).rvs(
                size=(chains, draws), random_state=rng)
        return theta, sig

    def sample_stats(self):
        return xr.Dataset({"elbo": (("iteration",), self.arrays["elbo"])})

    def arviz_attrs(self, info) -> dict:
        return {
            "q": (info.get("approximation", "variational") + "; theta ~ N(theta_mean, theta_cov), "
                  "sigma2_k ~ IG(var_shape_k, var_scale_k) (EP: a mixture over a variance grid); see group 'vbsvm'"),
            "draws": ("iid draws from the fitted approximation, not a Markov chain: the R-hat and ESS that "
                      "arviz.summary computes from them say nothing about convergence (they are about 1 and the "
                      "number of draws by construction)"),
            "elbo": float(self.arrays["elbo"][-1]),
        }


# ------------------------------------------------------------------------------ Laplace-zero
class SelectionDraws(PosteriorDraws):
    """Gibbs draws of the Laplace-zero model: effective coefficients and indicators."""

    def gamma_draws(self) -> np.ndarray:
        """Draws of the inclusion indicators, shape ``(chains, draws, m)``."""
        return np.asarray(self.arrays["gamma_draws"])

    def inclusion_moments(self, sel, scale):
        """``p_include, p_positive, p_positive_if_included, mean, sd, mean_if_included,
        sd_if_included`` of the selectable terms ``sel`` (NaN where never included)."""
        gam = self.gamma_draws().reshape(-1, len(sel)).astype(bool)
        u = self.theta_draws()[:, sel]
        cnt = gam.sum(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            m_in = np.where(cnt > 0, (u * gam).sum(0) / cnt, np.nan)
            dev = np.where(gam, u - m_in, 0.0)
            s_in = np.where(cnt > 1, np.sqrt((dev ** 2).sum(0) / (cnt - 1)), np.nan)
            ppos_in = np.where(cnt > 0, ((u > 0) & gam).sum(0) / cnt, np.nan)
        return gam.mean(0), (u > 0).mean(0), ppos_in, u.mean(0), u.std(0, ddof=1), m_in, s_in


class SpikeSlabApproximation(GaussianApproximation):
    """The VB q of the Laplace-zero model: ``q(u_k) = (1 - g_k) delta_0 + g_k N(m_k, s_k^2)`` for
    the selectable terms (moments of the effective coefficients in ``theta_mean``/``theta_var``;
    q's own parameters in ``q_*``, standardized scale).

    ``scale`` are the standardization scales of the selectable columns and ``to_original`` the
    map of the dense block to the original scale.
    """

    def __init__(self, arrays, layout, settings, scale, to_original):
        super().__init__(arrays, layout, settings)
        self.sel = np.asarray(arrays["sel_index"], dtype=np.int64)
        self.scale, self.to_original = scale, to_original
        self._draws = None

    def theta_marginals(self, index, level):
        """As :class:`GaussianApproximation`, with the exact quantiles of the spike-and-slab
        mixture for the selectable terms."""
        mean, sd, lo, hi = super().theta_marginals(index, level)
        index = np.asarray(index)
        pos = {int(j): i for i, j in enumerate(self.sel)}
        P = self.arrays
        lo, hi = np.array(lo, dtype=float), np.array(hi, dtype=float)
        for r, j in enumerate(index.tolist()):
            if j in pos:
                i = pos[j]
                g = float(P["q_gamma"][i])
                m = P["q_mean"][j] / self.scale[i]
                s = np.sqrt(P["q_var"][j]) / self.scale[i]
                lo[r], hi[r] = mixture_quantile(g, m, s, [(1 - level) / 2, 1 - (1 - level) / 2])
        return mean, sd, lo, hi

    def inclusion_moments(self, sel, scale):
        """As :meth:`SelectionDraws.inclusion_moments`, in closed form under q."""
        P = self.arrays
        g = np.asarray(P["q_gamma"], dtype=float)
        mv = P["q_mean"][sel] / scale
        sv = np.sqrt(P["q_var"][sel]) / scale
        with np.errstate(divide="ignore", invalid="ignore"):
            ppos_in = stats.norm.cdf(mv / sv)
        mean = g * mv
        sd = np.sqrt(np.maximum(g * (sv ** 2 + mv ** 2) - mean ** 2, 0.0))
        return g, g * ppos_in, ppos_in, mean, sd, mv, sv

    def _vb_draws(self):
        """iid draws from q: effective coefficients (original scale), gamma, variances (cached)."""
        if self._draws is not None:
            return self._draws
        P = self.arrays
        lay = self.layout
        chains, draws = self.shape
        rng = np.random.default_rng(self.settings.get("draw_seed", self.settings.get("seed")))
        qd = lay.n_dense
        Ld = np.linalg.cholesky(P["q_cov_dense"])
        z = rng.standard_normal((chains, draws, qd))
        dense = P["q_mean"][:qd] + z @ Ld.T
        parts = [dense]
        if lay.sparse_group:
            ms = P["q_mean"][qd:]
            Sds = P["q_cov_ds"]
            K = np.linalg.solve(P["q_cov_dense"], Sds)  # regression of sparse on dense coordinates
            zs = rng.standard_normal((chains, draws, ms.size))
            if "theta_cov_ss_blocks" in P:  # random slopes: each level's q x q block given the dense part
                B = np.asarray(P["theta_cov_ss_blocks"])
                m, qs = B.shape[:2]
                cond = B - np.einsum("dli,dlj->lij", Sds.reshape(qd, m, qs), K.reshape(qd, m, qs))
                L = np.linalg.cholesky(cond + 1e-12 * np.eye(qs) * np.trace(cond, axis1=1, axis2=2)[:, None, None])
                noise = np.einsum("lij,cdlj->cdli", L, zs.reshape(chains, draws, m, qs)).reshape(chains, draws, -1)
            else:
                cond_var = P["q_var"][qd:] - np.einsum("ij,ij->j", Sds, K)
                noise = zs * np.sqrt(np.maximum(cond_var, 0.0))
            parts.append(ms + (dense - P["q_mean"][:qd]) @ K + noise)
        theta = np.concatenate(parts, axis=-1)
        gamma = Bernoulli(P["q_gamma"]).sample(rng, (chains, draws)).astype(np.int8)
        theta[..., self.sel] *= gamma
        theta[..., :qd] = theta[..., :qd] @ self.to_original.T
        sig = np.empty((chains, draws, len(lay.variances)))
        for k in range(len(lay.variances)):
            sig[..., k] = stats.invgamma(P["var_shape"][k], scale=P["var_scale"][k]).rvs(
                size=(chains, draws), random_state=rng)
        self._draws = (theta, gamma, sig)
        return self._draws

    def draws(self):
        theta, _, sig = self._vb_draws()
        return theta, sig

    def gamma_draws(self) -> np.ndarray:
        """iid draws of the indicators from q, shape ``(chains, draws, m)``."""
        return self._vb_draws()[1]

    def prob_positive(self, rows, mean, sd):
        """The fraction of iid draws from q with a positive score (the score is a spike-and-slab
        mixture, not Gaussian)."""
        return _Posterior.prob_positive(self, rows, mean, sd)

    def closed_form(self):
        """None: the effective coefficients' q is a spike-and-slab mixture, not Gaussian."""
        return None

    def coefficient_covariance(self, p) -> np.ndarray:
        """The covariance of the iid draws of the effective coefficients from q."""
        return _Posterior.coefficient_covariance(self, p)

    def arviz_attrs(self, info) -> dict:
        out = super().arviz_attrs(info)
        mixing = ("b_k ~ InverseGaussian(q_b_k, 1); " if "q_b" in self.arrays else
                  "(EP over a variance grid: the slab's moments and the inclusion probabilities are the tilted ones, "
                  "mixed over the grid); ")
        out["q"] = ("theta ~ N(q_mean, q_cov) (standardized scale); gamma_k ~ Bernoulli(q_gamma_k); " + mixing
                    + "sigma2_k ~ IG(var_shape_k, var_scale_k); see group 'vbsvm'")
        return out


def mixture_quantile(g, m, s, probs):
    """Quantiles of ``(1 - g) delta_0 + g N(m, s^2)`` (closed form; the atom is a flat step)."""
    out = []
    below = g * stats.norm.cdf(-m / s) if s > 0 else g * float(m < 0)
    for p in probs:
        if p < below:
            out.append(m + s * stats.norm.ppf(p / g))
        elif p <= below + (1.0 - g):
            out.append(0.0)
        else:
            out.append(m + s * stats.norm.ppf((p - (1.0 - g)) / g))
    return out


def posterior_of(fit):
    """The posterior object of a linear fit (by its method and, for Laplace-zero, its prior)."""
    selection = "sel_index" in fit.posterior
    if fit.method == "gibbs":
        return (SelectionDraws if selection else PosteriorDraws)(fit.posterior, fit.layout, fit.settings)
    if fit.method == "map":
        return PosteriorMode(fit.posterior, fit.layout, fit.settings)
    if selection:
        sel = np.asarray(fit.posterior["sel_index"], dtype=np.int64)
        return SpikeSlabApproximation(fit.posterior, fit.layout, fit.settings,
                                      np.asarray(fit.design.scale, dtype=float)[sel],
                                      fit.design.to_original(fit.layout.n_dense))
    return GaussianApproximation(fit.posterior, fit.layout, fit.settings)
