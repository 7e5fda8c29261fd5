"""Mean-field VB of the linear SVM (Luts & Ormerod, Algorithms 1-2 and their random-effect form): the sweep, the
updates of q(theta), q(sigma^2) and q(Sigma), and the ELBO."""

from __future__ import annotations

import numpy as np

from vbsvm.distributions import InverseWishart
from vbsvm.models import hinge
from vbsvm.models.linear_algebra import LOG_2PI, WorkingGram
from vbsvm.spd import pack_spd, unpack_spd


class LinearVB:
    """The mean-field VB updates and ELBO of :class:`~vbsvm.models.linear.LinearSVMModel`."""

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
        if gram is None and (blocks or not self.woodbury_applies(tau)):
            gram = WorkingGram(self, w, hinge.working_response(self.y, w))
        if gram is None:  # fewer rows than coefficients: the n x n Woodbury systems
            post = self.coefficient_posterior(w, tau, blocks)
        else:  # the weights' statistics, factorized as EP's sites' (the inverse factor by dtrtri)
            post = self.site_gaussian(tau, gram, blocks)
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
            value += float(np.sum(self.variance_prior.expected_logpdf(qv) + qv.entropy()))
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
