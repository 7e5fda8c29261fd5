"""The posterior mode of the linear SVM (``method="map"``): conditional-maximization steps and a polish of the mode."""

from __future__ import annotations

import numpy as np

from vbsvm.distributions import InverseWishart
from vbsvm.models import hinge
from vbsvm.spd import spd_inverse


class LinearMAP:
    """MAP steps and the log posterior of :class:`~vbsvm.models.linear.LinearSVMModel`."""

    def map_step(self, theta, sigma2, covs=()):
        """One EM step for the joint posterior mode of (theta, variances, covariances).

        E-step: ``E[1/a_i | theta] = 1/|1 - y_i f_i|``; M-step: theta from the Gaussian full
        conditional's mean, each variance from the mode of its IG full conditional,
        ``(B + ||theta_k||^2/2) / (A + 1 + m_k/2)``, each covariance from the mode of its IW full
        conditional, ``(scale + sum_l b_l b_l^T) / (df + m + q + 1)``.
        """
        f = self.predictor(theta)
        gap = np.maximum(np.abs(1.0 - self.y * f), np.sqrt(hinge.CHI_FLOOR))
        w = 1.0 / gap
        post = self.coefficient_posterior(w, self.prior_precision(1.0 / np.asarray(sigma2)),
                                          self.prior_blocks([spd_inverse(S) for S in covs]))
        theta = post.mean
        if self.variance_components:
            sizes = np.array([c.size for c in self.variance_components], dtype=float)
            sq = np.array([np.sum(theta[c.index] ** 2) for c in self.variance_components])
            sigma2 = (self.B + sq / 2.0) / (self.A + 1.0 + sizes / 2.0)
        covs = [(c.scale + S) / (c.df + c.index.shape[0] + c.index.shape[1] + 1.0)
                for c, S in zip(self.covariance_components, self.scatter_matrices(theta))]
        return theta, sigma2, covs

    def log_posterior(self, theta, sigma2, covs=()) -> float:
        """Log joint pseudo-posterior (up to a constant) of (theta, variances, covariances)."""
        f = self.predictor(theta)
        diag = self._diagonal_prior
        tau = self.prior_precision(1.0 / np.asarray(sigma2))[diag]
        value = -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum() - 0.5 * np.sum(tau * theta[diag] ** 2)
        value += 0.5 * np.sum(np.log(tau))
        for s in np.atleast_1d(sigma2):
            value += -(self.A + 1.0) * np.log(s) - self.B / s
        for c, S in zip(self.covariance_components, covs):
            B = theta[c.index]
            L = np.linalg.cholesky(S)
            Y = np.linalg.solve(L, B.T)
            value += -0.5 * np.sum(Y * Y) - B.shape[0] * np.log(np.diag(L)).sum()
            value += float(InverseWishart(c.scale, c.df).logpdf(S))
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
