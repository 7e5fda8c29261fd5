"""Moves of the linear SVM's Gibbs sweep that leave the marginal pseudo-posterior invariant: rescaling a variance with
its coefficients, the common scale of every coefficient and variance, and shifts between random-effect levels and
their fixed effects."""

from __future__ import annotations

import math

import numpy as np

from vbsvm.distributions import InverseWishart
from vbsvm.mcmc.slice import slice_sample
from vbsvm.models.linear_algebra import LOG_VARIANCE_RANGE
from vbsvm.spd import spd_inverse


class LinearMarginalMoves:
    """Marginal (non-augmented) moves along orbits of :class:`~vbsvm.models.linear.LinearSVMModel`."""

    def variance_log_prior(self, sigma2) -> float:
        """Log density of the ``IG(A, B)`` prior of a variance, summed over ``sigma2``."""
        if isinstance(sigma2, float):  # the slice sampler's scalar calls: no array round trip
            return -(self.A + 1.0) * math.log(sigma2) - self.B / sigma2
        s = np.asarray(sigma2)
        return float(np.sum(-(self.A + 1.0) * np.log(s) - self.B / s))

    def _rescale_variance(self, k, theta, f, sigma2, rng, exponents=None):
        """Update of variance k with its coefficients on the marginal pseudo-posterior (w
        integrated out): ``t`` slice-sampled from :meth:`_variance_orbit`'s density and the state
        moved to the orbit's point at t. It uses no augmentation weights, so the sweep must draw
        w afresh from ``w | theta`` before using it (it does: the step comes right before the w
        draw). Returns the new ``(theta, f, sigma2)``."""
        logp, move = self._variance_orbit(k, theta, f, sigma2, exponents)
        return move(slice_sample(logp, 0.0, rng, width=2.0)[0])

    def _variance_orbit(self, k, theta, f, sigma2, exponents=None):
        """The orbit ``t -> (v + t, theta_j e^{c_j t / 2})`` of variance k (``v = log sigma_k^2``)
        and its coefficients j (:mod:`vbsvm.mcmc.partial_noncentring`): returns
        ``(logp, move)``, the log density of t along it and the map from t to the new
        ``(theta, f, sigma2)``.

        With every exponent ``c_j = 1`` (``exponents`` None; the only choice for a variance whose
        coefficients share rows, e.g. the penalty's) the move is non-centred: ``theta_k = sigma_k
        eta_k`` with eta fixed, the Jacobian ``e^{t m_k / 2}`` cancels the normal prior's
        ``sigma_k^{-m_k}`` and ``f = f_{-k} + e^{t/2} g`` with ``g = C_k theta_k``, so
        ``logp(t) = -2 sum_i (1 - y_i f_i)_+ + log p_IG(e^{v+t}) + (v + t)``. For a
        random-intercept term with per-level ``exponents`` (row i's score moves by
        ``u_{l(i)} (e^{c_{l(i)} t/2} - 1)``) it is the joint density along the orbit,
        ``-2 sum_i (1 - y_i f_i)_+ - sum_l u_l^2 e^{c_l t} / (2 e^{v+t}) - m_k (v + t) / 2
        + log p_IG(e^{v+t}) + (v + t) + t sum_l c_l / 2``, the last term the Jacobian. Each
        evaluation is an O(n) pass.
        """
        c = self.variance_components[k]
        v0 = math.log(sigma2[k])
        low, high = LOG_VARIANCE_RANGE
        if exponents is None:
            part = np.zeros(self.q)
            part[c.index] = theta[c.index]
            g = self.predictor(part)
            yg, yrest = self.y * g, 1.0 - self.y * (f - g)

            def logp(t):
                v = v0 + t
                if not low < v < high:
                    return -math.inf
                return (-2.0 * float(np.maximum(0.0, yrest - math.exp(0.5 * t) * yg).sum())
                        + self.variance_log_prior(math.exp(v)) + v)

            def scales(t):
                return math.exp(0.5 * t), g * (math.exp(0.5 * t) - 1.0)
        else:
            codes = self._levels[k].codes
            u = theta[c.index]
            g = u[codes]
            yg, yrest, row_exponent = self.y * g, 1.0 - self.y * (f - g), exponents[codes]
            u2, half_m, jacobian = u * u, 0.5 * u.size, 0.5 * float(exponents.sum())

            def logp(t):
                v = v0 + t
                if not low < v < high:
                    return -math.inf
                hinge_sum = float(np.maximum(0.0, yrest - np.exp(0.5 * t * row_exponent) * yg).sum())
                prior = -0.5 * float(u2 @ np.exp(t * exponents)) * math.exp(-v) - half_m * v
                return -2.0 * hinge_sum + prior + self.variance_log_prior(math.exp(v)) + v + t * jacobian

            def scales(t):
                scale = np.exp(0.5 * t * exponents)
                return scale, g * (scale[codes] - 1.0)

        def move(t):
            scale, step = scales(t)
            new_theta, new_sigma2 = theta.copy(), sigma2.copy()
            new_theta[c.index] *= scale
            new_sigma2[k] = math.exp(v0 + t)
            return new_theta, f + step, new_sigma2

        return logp, move

    def _shift_slope_locations(self, theta, sigma2, covariances, rng):
        r"""Exact draw of a common shift ``delta`` (q,) between the fixed effects of a slope term's
        columns and its levels: ``beta + M delta``, ``b_l - delta`` leaves every score unchanged
        (``X M = Z``, :meth:`_slope_shift_maps`), so its full conditional is Gaussian from the
        priors alone: precision ``P = m Sigma^{-1} + M' T M`` and mean
        ``P^{-1} (Sigma^{-1} sum_l b_l - M' T beta)``, T the fixed effects' prior precisions. The
        slope-term analogue of :meth:`_shift_location`; on toenail ``(1 + time | patient_id)`` it
        took the bulk ESS of ``time`` at 4 x 1000 from about 375 to about 500."""
        theta = theta.copy()
        T = self.prior_precision(1.0 / sigma2)[: self.p]
        for (c, _, _, _), Sigma, M in zip(self._slope_terms, covariances, self._slope_maps):
            if M is None:
                continue
            b, beta = theta[c.index], theta[: self.p]
            Lam = spd_inverse(Sigma)
            P = b.shape[0] * Lam + M.T @ (T[:, None] * M)
            L = np.linalg.cholesky(P)
            mean = np.linalg.solve(P, Lam @ b.sum(axis=0) - M.T @ (T * beta))
            delta = mean + np.linalg.solve(L.T, rng.standard_normal(P.shape[0]))
            theta[c.index] = b - delta
            theta[: self.p] = beta + M @ delta
        return theta

    def _slope_shift_maps(self) -> list:
        """For each term with slopes, the ``p x q`` matrix M with ``X M = Z`` (X the fixed effects'
        columns, Z the term's), or None where some column of Z has no fixed-effect counterpart
        (e.g. ``(1 + x | g)`` without a fixed effect of x; :meth:`_fixed_effect_column`)."""
        if self.Cd.shape[0] == 0 or self.intercept is None:  # a skeleton without rows (the Dask backend's)
            return [None] * len(self._slope_terms)
        maps = []
        for _, _, Z, _ in self._slope_terms:
            columns = [self._fixed_effect_column(z) for z in Z.T]
            if any(col is None for col in columns):
                maps.append(None)
                continue
            M = np.zeros((self.p, Z.shape[1]))
            for r, (j, slope, offset) in enumerate(columns):
                M[self.intercept, r] = offset
                if j is not None:
                    M[j, r] = slope
            maps.append(M)
        return maps

    def _fixed_effect_column(self, z):
        """``(j, slope, offset)`` with ``z = slope X_j + offset X_intercept`` for the one
        fixed-effect column j that is an exact affine function of ``z`` (the standardized copy of
        the same predictor; ``j`` None for a constant z), or None. Matching single columns (not a
        least-squares fit on all of X) keeps imputed columns out of the map: the slope columns
        are observed, so no filled-in column equals one of them."""
        X = self.Cd[:, : self.p]
        one = X[0, self.intercept]
        if np.ptp(z) == 0.0:
            return None, 0.0, z[0] / one
        for j in range(self.p):
            x = X[:, j]
            if j == self.intercept or np.ptp(x) == 0.0:
                continue
            xc = x - x.mean()
            slope = float(xc @ z) / float(xc @ xc)
            offset = z.mean() - slope * x.mean()
            if np.allclose(offset + slope * x, z, rtol=0.0, atol=1e-9 * max(1.0, np.abs(z).max())):
                return j, slope, offset / one
        return None

    def _rescale_everything(self, theta, f, sigma2, covariances, rng):
        """Update of the common scale of every coefficient, variance and covariance on the marginal
        pseudo-posterior (w integrated out): ``t`` slice-sampled from :meth:`_scale_orbit`'s
        density and the state moved to the orbit's point at t. With random slopes the posterior
        has a ridge along this orbit that the one-variance moves (:meth:`_rescale_variance`) do
        not follow: on toenail ``(1 + time | patient_id)`` with ``penalty=None`` the log variances
        correlate 0.87 with each other and -0.5 to -0.65 with the fixed intercept and time, and
        with this move (and :meth:`_shift_slope_locations`) the min bulk ESS at 4 x 1000 went from
        18-60 to 318-438 and the max R-hat from 1.07-1.18 to 1.007-1.013 (seeds 1, 3, 5, 7; 14%
        more time). Like :meth:`_rescale_variance` it must be followed by a fresh ``w | theta``.
        Returns ``(theta, f, sigma2)``; the covariances move too but are not returned: the sweep
        draws them next from ``Sigma | b``, which no step in between uses."""
        logp, move = self._scale_orbit(theta, f, sigma2, covariances)
        return move(slice_sample(logp, 0.0, rng, width=1.0)[0])

    def _scale_orbit(self, theta, f, sigma2, covariances):
        r"""The orbit ``t -> (theta e^{t/2}, sigma2 e^t, Sigma e^t)`` of every coefficient, variance
        and covariance at once: returns ``(logp, move)``, the log density of t along it and the
        map from t to the new ``(theta, f, sigma2)``.

        The score moves to ``f e^{t/2}``. A coefficient governed by a variance or covariance has a
        normal prior whose density changes by ``e^{-t/2}``, which its Jacobian ``e^{t/2}`` cancels
        (so does a Laplace-zero term's: given its mixing variable its prior is
        ``N(0, sigma_u^2 / b_k)``); a coefficient with a known prior precision :math:`\tau_j` keeps
        its Jacobian. So

        .. math::

            \log p(t) = -2\sum_i (1 - y_i f_i e^{t/2})_+ - \tfrac{e^t}{2}\sum_{j\,\mathrm{known}}
            \tau_j\theta_j^2 + \tfrac{t}{2} n_{\mathrm{known}} + \sum_k [\log p_{IG}(\sigma_k^2 e^t) + t]
            + \sum_c [\log p_{IW}(\Sigma_c e^t) + \tfrac{q_c(q_c + 1)}{2} t],

        the last terms the priors of the variances and covariances with the Jacobians of
        ``sigma2 e^t`` and of the ``q(q+1)/2`` free entries of ``Sigma e^t``. Each evaluation is
        an O(n) pass.
        """
        known, tau_known = self._known_prior
        ss = float(np.sum(tau_known * theta[known] ** 2))
        yf = self.y * f
        priors = [InverseWishart(c.scale, c.df) for c in self.covariance_components]
        log_sigma2 = np.log(sigma2)
        low, high = LOG_VARIANCE_RANGE
        jacobian = 0.5 * known.size + sigma2.size + sum(0.5 * S.shape[0] * (S.shape[0] + 1) for S in covariances)

        def logp(t):
            if sigma2.size and not (low < log_sigma2.min() + t and log_sigma2.max() + t < high):
                return -math.inf
            e = math.exp(t)
            out = -2.0 * float(np.maximum(0.0, 1.0 - math.sqrt(e) * yf).sum()) - 0.5 * ss * e + jacobian * t
            if sigma2.size:
                out += self.variance_log_prior(sigma2 * e)
            return out + sum(prior.logpdf(S * e) for S, prior in zip(covariances, priors))

        def move(t):
            scale = math.exp(0.5 * t)
            return theta * scale, f * scale, sigma2 * scale * scale

        return logp, move

    def _shift_location(self, theta, sigma2, rng):
        """Exact draw of a common shift ``delta`` between the fixed intercept and the levels of each
        random-intercept term: ``beta_0 + delta``, ``u_l - delta`` leaves every score unchanged,
        so its full conditional is Gaussian from the priors alone, precision
        ``tau_0 + m / sigma2_k`` and mean ``(sum_l u_l / sigma2_k - tau_0 beta_0) / precision``.
        Removes the intercept-versus-mean-of-levels ridge of the centred parameterization."""
        tau0 = self._tau0
        theta = theta.copy()
        for k, index in self._shiftable:
            prec = tau0 + index.size / sigma2[k]
            mean = (theta[index].sum() / sigma2[k] - tau0 * theta[self.intercept]) / prec
            delta = mean + rng.standard_normal() / math.sqrt(prec)
            theta[self.intercept] += delta
            theta[index] -= delta
        return theta
