r"""Mean-field VB of Laplace-zero selection (Luts & Ormerod, Algorithm 3): the sweep over the coefficients, the
indicators and the variances, and the ELBO.

Hyperprior on rho (``LaplaceZero(rho=Beta(a, b))``). The mean field gets one more factor,
:math:`q(\rho) = \mathrm{Beta}(a_q, b_q)`, updated right after the indicators:

.. math::

    a_q = a + \textstyle\sum_k \mu_{\gamma_k}, \qquad b_q = b + m - \textstyle\sum_k \mu_{\gamma_k},

and :math:`\mathrm{logit}\,\rho` in the indicator update (line 6 of Algorithm 3) becomes
:math:`E_q\log\rho - E_q\log(1 - \rho) = \psi(a_q) - \psi(b_q)`. The ELBO's Bernoulli terms become
:math:`\mu_{\gamma_k}E\log\rho + (1 - \mu_{\gamma_k})E\log(1-\rho)` plus
:math:`-\mathrm{KL}(q(\rho)\,\|\,\mathrm{Beta}(a, b))`. Each update is still the exact maximizer in
its factor, so the ELBO still never decreases; ``(log a_q, log b_q)`` join the state that SQUAREM
extrapolates (any real values are a valid q). The iterations start at the prior,
``q(rho) = Beta(a, b)``.

Why this and not weights ``exp(ELBO) x p(rho)`` over a grid of fixed rho (as varbvs): the factor
costs one fit, the grid one fit per point, and the ELBO as a function of a fixed rho jumps where
the fit moves to another local optimum (on 19 points evenly spaced in logit(rho) from -6 to 3 it
rose steadily, fell by 2.6 (p = 10) and by 6.6 (p = 50) between neighbouring points, then rose
again), which the weights inherit. Where both were computed they agreed: posterior mean of rho under the default
``Beta(1, m^2)`` 0.054 by q(rho) and 0.054 by the grid (p = 10), 0.0030 and 0.0030 (p = 50), and
the calibrated fit 0.055 and 0.0029 (``benchmarks/results/selection_hyperprior.md``). Under
``Beta(1, 1)`` both favour dense models, as the exact posterior does (see
:mod:`vbsvm.models.priors`).
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln, digamma, expit

from vbsvm.distributions import Bernoulli
from vbsvm.models import hinge
from vbsvm.models.selection_algebra import ETA_INIT, ETA_MAX, LOG_2, LOG_2PI, expit_scalar


class SelectionVB:
    """Algorithm 3 of :class:`~vbsvm.models.selection.LaplaceZeroModel`."""

    def vb_initial_state(self, eta=ETA_INIT):
        """``(log chi, log B_q, log mu_b, eta, IW scales[, log a_q, log b_q])``: w = 1,
        E[1/sigma^2] = 1, E[b] = 1, gamma ~ 1, E[Sigma_k^{-1}] = I (and q(rho) the prior)."""
        parts = [np.zeros(self.n), np.log(self.A + self.sizes / 2.0), np.zeros(self.m),
                 np.full(self.m, float(eta)), self.base.covariance_initial_state()]
        if self.rho_prior is not None:
            parts.append(np.log(np.asarray(self.rho_prior, dtype=float)))
        return np.concatenate(parts)

    def unpack(self, state):
        n, nv, m = self.n, len(self.vcomps), self.m
        chi = np.exp(state[:n])
        Bq = np.exp(state[n:n + nv])
        mu_b = np.exp(state[n + nv:n + nv + m])
        eta = state[n + nv + m:n + nv + 2 * m]
        tail = state[n + nv + 2 * m:] if self.rho_prior is None else state[n + nv + 2 * m:-2]
        return chi, Bq, mu_b, eta, self.base.unpack_covariances(tail)

    def rho_factor(self, state):
        """``(a_q, b_q)`` of q(rho) in a VB state (hyperprior only: the state's last two entries)."""
        return tuple(np.exp(np.asarray(state[-2:], dtype=float)).tolist())

    def vb_sweep(self, state):
        """One pass of Algorithm 3 from ``state``; returns ``(new_state, q, elbo)``.

        Order as in the paper: q(theta) (lines 2-3); for each k, q(b_k) then q(gamma_k)
        (lines 4-8; under a hyperprior then q(rho), see the module docstring); q(a) (line 10);
        q(sigma^2) (line 11). Each update maximizes the ELBO in its factor given the others, so
        the ELBO of successive sweeps never decreases.
        """
        chi, Bq, mu_b, eta, q_cov = self.unpack(state)
        hyper = self.rho_prior is not None
        Aq = self.A + self.sizes / 2.0
        w = hinge.expected_inverse(chi)
        gram = self.gram(w)
        s = self.scaling(expit(eta))
        tau = self.prior_precision(Aq / Bq, mu_b)
        post = self.posterior(gram, s, tau, [qc.mean_inv() for qc in q_cov])
        mu = post.mean
        dcov = post.diag_cov()
        sel = self.sel
        e_inv_s2u = Aq[0] / Bq[0]
        # lines 4-8
        Sdd = post.cov_dense()
        Odd = Sdd + np.outer(post.mean_dense, post.mean_dense)
        Okk = np.diag(Odd)[sel].copy()
        mu_b_new = 1.0 / np.sqrt(e_inv_s2u * Okk)
        if hyper:  # E log rho - E log(1 - rho) under q(rho), then q(rho) given the new q(gamma)
            a_q, b_q = self.rho_factor(state)
            eta_new = self._gamma_sweep(gram, post, Odd, s, prior_logit=float(digamma(a_q) - digamma(b_q)))
            included = float(np.sum(expit(eta_new)))
            rho_shape = (self.rho_prior[0] + included, self.rho_prior[1] + (self.m - included))
        else:
            eta_new = self._gamma_sweep(gram, post, Odd, s)
        s_new = self.scaling(expit(eta_new))
        # line 10
        mf, vf = post.score_moments(s_new, sel, Okk)
        chi_new = hinge.update_chi(self.y, mf, vf)
        # line 11 (and the group variances as in Algorithm 2)
        sq = [float(np.sum(mu_b_new * Okk))]
        sq += [float(np.sum(mu[c.index] ** 2 + dcov[c.index])) for c in self.vcomps[1:]]
        q_var = self.variance_posterior(sq)
        scatters, q_cov = self.base.vb_covariances(post, mu)  # the IW step of Algorithm 2
        q = {"theta": post, "theta_mean": mu, "theta_var": dcov, "Okk": Okk, "mu_b": mu_b_new,
             "eta": eta_new, "gamma": expit(eta_new), "chi": chi_new, "variances": q_var,
             "covariances": q_cov, "scatters": scatters, "mean_f": mf, "var_f": vf}
        parts = [np.log(chi_new), np.log(q_var.b), np.log(mu_b_new), eta_new, self.base.pack_covariances(q_cov)]
        if hyper:
            q["rho_shape"] = rho_shape
            parts.append(np.log(rho_shape))
        return np.concatenate(parts), q, self.elbo(q)

    def _gamma_sweep(self, gram, post, Odd, s, eta_max=None, prior_logit=None):
        """Lines 4-8 of Algorithm 3: sequential q(gamma_k) updates, O(q) each.

        ``eta_k = logit(rho) - G_kk Omega_kk / 2 + mu_k r_k - sum_{j != k} G_kj s_j Omega_jk
        - (sparse-factor term)``; the sum is kept in ``t = (G * Omega) s`` and updated by one
        column after each k. ``prior_logit`` replaces ``logit(rho)`` (under a hyperprior:
        ``E log rho - E log(1 - rho)``).
        """
        logit_rho = self.logit_rho if prior_logit is None else prior_logit
        sel = self.sel
        base = self.base
        H = gram.Gdd * Odd
        t = H @ s
        if base.m_sparse:
            # sum over levels l of the largest factor: G_{l,k} Omega_{l,k} (these are always in)
            Sds = post.cov_dense_sparse()  # (qd, m_s)
            cross = np.einsum("lk,kl->k", gram.Gsd, Sds) + post.mean_dense * (gram.Gsd.T @ post.mean_sparse)
        else:
            cross = np.zeros(self.qd)
        mu_d = post.mean_dense
        const = (logit_rho - 0.5 * np.diag(H) + mu_d * gram.bd - cross)[sel].tolist()
        Hkk = np.diag(H)[sel].tolist()
        s = s.copy()
        eta = np.empty(self.m)
        for i, k in enumerate(sel.tolist()):
            e = const[i] - (t[k] - Hkk[i] * s[k])
            e = ETA_MAX if e > ETA_MAX else (-ETA_MAX if e < -ETA_MAX else e)
            new = expit_scalar(e)
            delta = new - s[k]
            if delta != 0.0:
                t += H[:, k] * delta
                s[k] = new
            eta[i] = e
        return eta

    def elbo(self, q) -> float:
        """Full evidence lower bound (all constants) of a complete q (see module docstring)."""
        post = q["theta"]
        mu, dcov = q["theta_mean"], q["theta_var"]
        value = hinge.elbo(self.y, q["mean_f"], q["var_f"], q["chi"])
        qv = q["variances"]
        e_inv, e_log = np.atleast_1d(qv.mean_inv()), np.atleast_1d(qv.mean_log())
        # always-included fixed effects: N(0, 1/tau) with known tau
        fi, ft = self.fixed_index, self.fixed_tau
        value += float(np.sum(-0.5 * LOG_2PI + 0.5 * np.log(ft) - 0.5 * ft * (mu[fi] ** 2 + dcov[fi])))
        # random intercepts: N(0, sigma_g^2)
        for c, ei, el in zip(self.vcomps[1:], e_inv[1:], e_log[1:]):
            value += float(np.sum(-0.5 * LOG_2PI - 0.5 * el - 0.5 * ei * (mu[c.index] ** 2 + dcov[c.index])))
        # selectable: v_k | b_k, sigma_u^2 and b_k, with q(b_k) inverse Gaussian
        mu_b = q["mu_b"]
        value += float(np.sum(-LOG_2 - 0.5 * e_log[0] - 0.5 * e_inv[0] * mu_b * q["Okk"] - 0.5 / mu_b))
        # entropy of q(theta)
        value += 0.5 * self.q * (1.0 + LOG_2PI) + 0.5 * post.logdet_cov()
        # variances
        value += float(np.sum(self.variance_prior.expected_logpdf(qv) + qv.entropy()))
        # gamma: E log p(gamma) + H[q(gamma)]
        q_gamma = Bernoulli.from_logit(q["eta"])
        g = q_gamma.p
        if "rho_shape" in q:  # E log p(gamma | rho) under q(rho), and -KL(q(rho) || Beta(a, b))
            a_q, b_q = q["rho_shape"]
            a, b = self.rho_prior
            total = digamma(a_q + b_q)
            e_log, e_log1m = digamma(a_q) - total, digamma(b_q) - total
            value += float(np.sum(g * e_log + (1.0 - g) * e_log1m + q_gamma.entropy()))
            value -= float(betaln(a, b) - betaln(a_q, b_q) + (a_q - a) * digamma(a_q) + (b_q - b) * digamma(b_q)
                           + (a + b - a_q - b_q) * total)
        else:
            value += float(np.sum(g * self.log_rho + (1.0 - g) * self.log_1mrho + q_gamma.entropy()))
        return value + self.base.covariance_elbo(q.get("covariances", ()), q.get("scatters", ()))
