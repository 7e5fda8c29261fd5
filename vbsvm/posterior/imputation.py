"""The posterior of the imputation block of a ``missing="impute"`` fit, in one interface
whatever the method (the imputation counterpart of :mod:`vbsvm.posterior.representations`).

* :class:`ImputationApproximation` (``method="vb"``): Gaussian q of the missing cells (one block
  per incomplete row), ``q(mu)`` Gaussian, ``q(Sigma)`` inverse Wishart and, for the conditional
  model, Gaussian q of the class means;
* :class:`ImputationDraws` (``method="gibbs"``): the draws of the cells, ``mu``, ``Sigma`` and the
  label effect.

Both give the marginals of the cells, the imputation model's parameters, draws, and the moments
of the score of new rows with missing entries integrated over the imputation model (the algebra
of the patterns and label components is :class:`~vbsvm.results.imputed.ImputedFit`'s).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from vbsvm.distributions import InverseWishart
from vbsvm.posterior.representations import add_sparse_score

__all__ = ["ImputationApproximation", "ImputationDraws", "imputation_posterior_of"]


def _chol_inv(A):
    """Inverse of a symmetric positive definite matrix through its Cholesky factor."""
    Linv = np.linalg.solve(np.linalg.cholesky(A), np.eye(A.shape[0]))
    return Linv.T @ Linv


class ImputationDraws:
    """``method="gibbs"``: draws of the imputation block.

    Parameters
    ----------
    arrays : dict
        The fit's posterior arrays.
    settings : dict
        The fit's settings (draw shape and seeds).
    label_key : str
        The key of the label effect's draws (``gamma_draws``, or ``label_effect_draws`` when
        ``gamma`` are a Laplace-zero fit's indicators).
    cell_rows : ndarray
        The training row of each missing cell.
    """

    def __init__(self, arrays, settings, label_key, cell_rows):
        self.arrays, self.settings, self.label_key, self.cell_rows = arrays, settings, label_key, cell_rows

    def cell_marginals(self, level):
        """``mean, sd, lower, upper`` of each missing cell (equal-tailed quantiles)."""
        lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
        draws = np.asarray(self.arrays["x_missing_draws"])
        d = draws.reshape(draws.shape[0] * draws.shape[1], self.cell_rows.size)
        sd = d.std(axis=0, ddof=1) if d.shape[0] > 1 else np.full(self.cell_rows.size, np.nan)
        return d.mean(axis=0), sd, np.quantile(d, lo_q, axis=0), np.quantile(d, hi_q, axis=0)

    def label_effect(self):
        """Posterior mean and sd of the label effect ``gamma`` (conditional model)."""
        g = np.asarray(self.arrays[self.label_key]).reshape(-1, np.shape(self.arrays[self.label_key])[-1])
        return g.mean(axis=0), g.std(axis=0, ddof=1) if g.shape[0] > 1 else np.full(g.shape[1], np.nan)

    def parameters(self):
        """``((mean, sd) of mu, E[Sigma])``."""
        mu = np.asarray(self.arrays["mu_draws"])
        S = np.asarray(self.arrays["Sigma_draws"])
        mu, S = mu.reshape(mu.shape[0] * mu.shape[1], *mu.shape[2:]), S.reshape(S.shape[0] * S.shape[1], *S.shape[2:])
        sd = mu.std(axis=0, ddof=1) if mu.shape[0] > 1 else np.full(mu.shape[1], np.nan)
        return (mu.mean(axis=0), sd), S.mean(axis=0)

    def draws(self):
        """Draws of ``x_missing`` (chain, draw, cell), ``mu`` (chain, draw, d) and ``Sigma``
        (chain, draw, d, d)."""
        P = self.arrays
        return np.asarray(P["x_missing_draws"]), np.asarray(P["mu_draws"]), np.asarray(P["Sigma_draws"])

    def label_effect_draws(self, shape):
        """Draws of the label effect ``gamma`` (conditional model)."""
        return np.asarray(self.arrays[self.label_key])

    def pooling_text(self, info) -> str:
        """How the cut model's two blocks were fitted (for the summary's notes)."""
        return "Gibbs draws the imputation block from its own posterior, then the SVM given the completed data."

    def arviz_attrs(self) -> dict:
        return {}

    def score_moments(self, fit, dense, rows):
        """Mean and sd of the score of new rows (see :meth:`score_stats`)."""
        return self.score_stats(fit, dense, rows)[:2]

    def prob_positive(self, fit, dense, rows, mean, sd):
        """``P(f > 0)`` of new rows (see :meth:`score_stats`)."""
        return self.score_stats(fit, dense, rows)[2]

    def score_stats(self, fit, dense, rows, chunk=512):
        """Mean, sd and P(f > 0) of the score over the Gibbs draws, rows with missing entries
        integrated over x_M | x_O per draw (a Gaussian mixture over the draws and, for the
        conditional model, over the label). Row r's score is linear in its missing cells with
        the per-draw coefficients ``b_r = S_r theta`` (slopes ``S_r`` of its design entries)."""
        sc, comp = rows
        lay = fit.layout
        draws = fit._theta_draws()
        S = draws.shape[0]
        mu = np.asarray(self.arrays["mu_draws"]).reshape(S, -1)
        d = mu.shape[1]
        Sigma = np.asarray(self.arrays["Sigma_draws"]).reshape(S, d, d)
        gamma = self.arrays.get(self.label_key)
        comps = fit._components(mu, None if gamma is None else np.asarray(gamma).reshape(S, d))
        n = dense.shape[0]
        Fm = np.empty((S, n))  # per-draw conditional mean of the score
        Fv = np.zeros((S, n))  # per-draw conditional variance (0 for complete rows)
        for start in range(0, n, 2048):
            sl = slice(start, start + 2048)
            Fm[:, sl] = draws[:, : lay.n_dense] @ dense[sl].T
        add_sparse_score(Fm, draws[:, lay.n_dense:], sc)
        pos = (Fm > 0).astype(float)  # per-draw P(f > 0); complete rows: the sign of the score
        theta_aff = draws[:, comp.affected]
        for R, M, O in fit._patterns(comp):
            slopes = comp.slopes(R, M)  # (r, m, a)
            SMM = Sigma[:, M][:, :, M]
            if O.size:
                SOO = Sigma[:, O][:, :, O]
                SOM = Sigma[:, O][:, :, M]
                K = np.linalg.solve(SOO, SOM)  # (S, o, m)
                SOOi = np.linalg.inv(SOO)
                V = SMM - np.einsum("som,sok->smk", SOM, K)
            else:
                V = SMM
            for start in range(0, R.size, chunk):
                rr = R[start: start + chunk]
                b = np.einsum("rmk,sk->srm", slopes[start: start + chunk], theta_aff)  # (S, r, m)
                vm = np.einsum("srm,smk,srk->sr", b, V, b)
                fc, logw = [], []
                for lp, mc in comps:
                    cond = np.broadcast_to(mc[:, None, M], (S, rr.size, M.size))
                    lw = np.full((S, rr.size), lp)
                    if O.size:
                        dev = comp.D[np.ix_(rr, O)][None, :, :] - mc[:, None, O]  # (S, r, o)
                        cond = cond + np.einsum("sro,som->srm", dev, K)
                        lw = lw - 0.5 * np.einsum("sro,sop,srp->sr", dev, SOOi, dev)
                    fc.append(Fm[:, rr] + np.einsum("srm,srm->sr", b, cond))
                    logw.append(lw)
                fc = np.array(fc)
                W, Fm[:, rr], between = fit._mixture(np.array(logw), fc)
                Fv[:, rr] = vm + between
                with np.errstate(divide="ignore", invalid="ignore"):
                    comp_pos = np.where(vm > 0, stats.norm.cdf(fc / np.sqrt(vm)), (fc > 0).astype(float))
                pos[:, rr] = np.sum(W * comp_pos, axis=0)
        mean = Fm.mean(axis=0)
        sd = np.sqrt(Fv.mean(axis=0) + (Fm.var(axis=0, ddof=1) if S > 1 else 0.0))
        return mean, sd, pos.mean(axis=0)


class ImputationApproximation(ImputationDraws):
    """``method="vb"``: the imputation block's q (see the module docstring); draws are iid
    from q, seeded at fit time."""

    def cell_marginals(self, level):
        """``mean, sd, lower, upper`` of each missing cell (Gaussian q-interval)."""
        mean = np.asarray(self.arrays["x_missing_mean"], dtype=float)
        sd = np.asarray(self.arrays["x_missing_sd"], dtype=float)
        z = stats.norm.ppf(1 - (1 - level) / 2)
        return mean, sd, mean - z * sd, mean + z * sd

    def label_effect(self):
        m, C = np.asarray(self.arrays["class_means_mean"]), np.asarray(self.arrays["class_means_cov"])
        return 0.5 * (m[1] - m[0]), np.sqrt(np.diag(C[0] + C[1]) / 4.0)

    def parameters(self):
        P = self.arrays
        d = P["mu_mean"].size
        df = float(P["Sigma_df"])
        Sigma = P["Sigma_scale"] / (df - d - 1) if df > d + 1 else P["Sigma_scale"] / df
        return (P["mu_mean"], np.sqrt(np.diag(P["mu_cov"]))), Sigma

    def draws(self):
        P = self.arrays
        chains, draws = self.settings.get("chains", 4), self.settings.get("draws", 1000)
        seed = self.settings.get("draw_seed", self.settings.get("seed"))
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
        rows = self.cell_rows
        n_cells = rows.size
        mean = np.asarray(P["x_missing_mean"], dtype=float)
        x = np.empty((chains, draws, n_cells))
        if n_cells:
            rowcov = np.asarray(P["x_missing_rowcov"], dtype=float)
            n_rows, dmax, _ = rowcov.shape
            sizes = np.bincount(np.unique(rows, return_inverse=True)[1], minlength=n_rows)
            used = np.arange(dmax)[None, :] < sizes[:, None]  # (n_rows, dmax)
            padded = rowcov + np.einsum("ij,jk->ijk", (~used).astype(float), np.eye(dmax))
            L = np.linalg.cholesky(padded)
            z = rng.standard_normal((chains, draws, n_rows, dmax))
            dev = np.einsum("rjk,csrk->csrj", L, z)
            x[:] = mean + dev[:, :, used]
        d = P["mu_mean"].size
        Lmu = np.linalg.cholesky(P["mu_cov"])
        mu = P["mu_mean"] + rng.standard_normal((chains, draws, d)) @ Lmu.T
        Sigma = InverseWishart(P["Sigma_scale"], float(P["Sigma_df"])).sample(rng, size=(chains, draws))
        return x, mu, Sigma

    def label_effect_draws(self, shape):
        """iid draws of ``(m_+1 - m_-1) / 2`` from ``q(m_-1) q(m_+1)``."""
        rng = np.random.default_rng(np.random.SeedSequence(self.settings.get("draw_seed")).spawn(3)[2])
        m, C = np.asarray(self.arrays["class_means_mean"]), np.asarray(self.arrays["class_means_cov"])
        return 0.5 * (m[1] - m[0] + rng.standard_normal((*shape, m.shape[1])) @ np.linalg.cholesky(C[0] + C[1]).T)

    def pooling_text(self, info) -> str:
        kind = "calibrated (EP)" if str(info.get("approximation", "")).startswith("calibrated") else "mean-field"
        return (f"VB pools the {kind} fits of {info.get('vb_completions', 20)} completions drawn from "
                "q(x_missing) (Rubin's rules).")

    def arviz_attrs(self) -> dict:
        return {"q_imputation": ("x_missing: Gaussian per incomplete row (x_missing_mean, x_missing_rowcov); "
                                 "mu ~ N(mu_mean, mu_cov); Sigma ~ IW(Sigma_scale, Sigma_df); see group 'vbsvm'")}

    def score_moments(self, fit, dense, rows):
        mean, var = self.score_mean_var(fit, dense, rows)
        return mean, np.sqrt(np.maximum(var, 0.0))

    def prob_positive(self, fit, dense, rows, mean, sd):
        """``Phi(m / s)`` of the score's moments."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return stats.norm.cdf(mean / sd)

    def score_mean_var(self, fit, dense, rows):
        """Mean and variance of the score of ``fit``'s new rows under q (see
        :meth:`vbsvm.results.imputed.ImputedFit._score_moments`). A design entry
        ``e_off + e_slope x`` of a missing cell is linear in it, so row r's score is
        ``theta^T c_r`` with ``E[c_r | x_O, c] = `` the entries at the conditional mean and
        ``Cov(c_r | x_O) = S_r^T Var(x_M | x_O) S_r`` (slopes ``S_r``), whose part of the score's
        variance is ``E_q[theta^T Cov(c_r) theta] = mu^T Cov(c_r) mu + tr(Sigma_theta Cov(c_r))``."""
        sc, comp = rows
        P = self.arrays
        patterns = fit._patterns(comp)
        if not patterns:
            return fit._post.score_mean_var(dense, sc)
        cm = P.get("class_means_mean")
        comps = fit._components(P["mu_mean"], None if cm is None else 0.5 * (cm[1] - cm[0]))
        if cm is not None:
            comps = [(lp, m) for (lp, _), m in zip(comps, cm)]
        Lam = float(P["Sigma_df"]) * _chol_inv(P["Sigma_scale"])  # E_q[Sigma^{-1}]
        Sig = _chol_inv(Lam)
        aff = comp.affected
        th = P["theta_mean"][aff]
        cov = P["theta_cov_dense"][np.ix_(aff, aff)]
        extra = np.zeros(dense.shape[0])
        filled = [dense.copy() for _ in comps]
        logw = np.array([np.full(dense.shape[0], lp) for lp, _ in comps])
        for R, M, O in patterns:
            V = _chol_inv(Lam[np.ix_(M, M)])  # Var(x_M | x_O)
            K = V @ Lam[np.ix_(M, O)] if O.size else None  # Lam_MM^{-1} Lam_MO
            SOOi = _chol_inv(Sig[np.ix_(O, O)]) if O.size else None
            S = comp.slopes(R, M)  # (r, m, a)
            for k, (_, mu) in enumerate(comps):
                cond = np.broadcast_to(mu[M], (R.size, M.size)).copy()
                if O.size:
                    dev = comp.D[np.ix_(R, O)] - mu[O]
                    cond -= dev @ K.T
                    logw[k, R] -= 0.5 * np.einsum("ro,op,rp->r", dev, SOOi, dev)
                filled[k][np.ix_(R, aff)] += np.einsum("rm,rmk->rk", cond, S)
            T = np.einsum("rak,ab,rbl->rkl", S, V, S)  # Cov(c_r | x_O) on the affected columns
            extra[R] = np.einsum("k,rkl,l->r", th, T, th) + np.einsum("rkl,kl->r", T, cov)
        moments = [fit._post.score_mean_var(f, sc) for f in filled]
        means = np.array([m for m, _ in moments])
        W, mean, between = fit._mixture(logw, means)
        within = np.sum(W * np.array([v for _, v in moments]), axis=0)
        return mean, within + between + extra


def imputation_posterior_of(fit):
    """The imputation block's posterior object of an imputed fit."""
    cls = ImputationDraws if fit._post.sampled else ImputationApproximation
    return cls(fit.posterior, fit.settings, fit._label_effect_key, fit._cells()[0])
