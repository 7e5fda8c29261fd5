"""Between-model moves of Laplace-zero selection: indicator flips with a proposed coefficient, and model jumps along
tuned directions, each exact by its Metropolis-Hastings ratio."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from vbsvm.distributions import LOG_DRAW_RANGE
from vbsvm.models.selection_algebra import LOG_2


class SelectionJumps:
    """Flip and model-jump moves of :class:`~vbsvm.models.selection.LaplaceZeroModel`."""

    def flip_moves(self, theta, gamma, b, sigma2, f, flips, rng, odds=None):
        r"""Metropolis-Hastings add/delete of every selectable term on the marginal
        pseudo-posterior (augmentation weights integrated out); ``m`` proposals in random order.

        An excluded term k proposes ``gamma_k = 1`` with ``v_k`` from a t proposal ``q_k`` and
        shifts the other active fixed effects and terms by ``-c_k v_k``, where ``c_k`` is their
        average regression on k (so that, e.g., a main effect gives up what its interaction
        takes over); an included term proposes ``gamma_k = 0``, shifts them back by ``+c_k v_k``
        and draws ``v_k`` from its prior ``N(0, sigma_u^2 / b_k)`` (its full conditional when
        out). ``q_k`` and ``c_k`` are fitted during tuning (:meth:`gibbs_adapt`) and fixed
        afterwards, so that the move uses no w; ``c_k`` is used on the coordinates active
        besides k, which the move does not change. Adding and deleting are each other's reverse,
        the shift has unit Jacobian, and the ratio for deleting is

        .. math::

            \frac{L(f')}{L(f)}\,\frac{p(\theta'_A)}{p(\theta_A)}\,\frac{1 - \rho}{\rho}\,
            \frac{q_k(v_k)}{N(v_k; 0, \sigma_u^2 / b_k)}, \qquad L(f) = e^{-2\sum_i (1 - y_i f_i)_+}

        with ``p(theta_A)`` the Gaussian prior of the shifted coefficients (the prior density of
        the new ``v_k`` cancels with its proposal; adding is the inverse). Given w the collapsed
        indicator draw (:meth:`collapsed_indicators`) already integrates the coefficients out,
        but w itself holds the fit with or without the term; this move does not condition on w.
        ``odds`` (:class:`~vbsvm.models.selection_algebra.PriorOdds`) is the current ``rho``
        (default: the fixed one). Returns ``(theta, gamma, f)``; w must be drawn afresh after it.
        """
        odds = self.prior_odds() if odds is None else odds
        theta, gamma = theta.copy(), gamma.copy()
        X, y, sel, p = self.base.Cd, self.y, self.sel, self.base.p
        loc, scale, shift = flips["flip_loc"], flips["flip_scale"], flips["flip_shift"]
        tau = self.prior_precision(1.0 / np.asarray(sigma2), b)[:p]
        prior_sd = np.sqrt(sigma2[0] / b)
        v_in = loc + scale * rng.standard_t(self.FLIP_DF, self.m)  # used where gamma_k = 0
        v_out = prior_sd * rng.standard_normal(self.m)  # used where gamma_k = 1
        log_u = np.log(rng.random(self.m))
        v = np.where(gamma == 1.0, theta[sel], v_in)  # the coefficient of the included state
        # the deletion's ratio besides L and the shifted coefficients' prior (adding: its inverse)
        log_delete = self.flip_proposal_log_ratio(v, loc, scale, prior_sd) + odds.log_1mrho - odds.log_rho
        active = np.ones(p, dtype=bool)
        hinge_sum = float(np.maximum(0.0, 1.0 - y * f).sum())
        for i in rng.permutation(self.m).tolist():
            k = sel[i]
            active[sel] = gamma == 1.0
            active[k] = False
            c = np.where(active, shift[i, :p], 0.0)
            sign = 1.0 if gamma[i] == 1.0 else -1.0  # +1: delete, -1: add
            old = theta[:p]
            delta = sign * v[i] * c  # deleting adds c v_k back, adding takes c v_k off
            new = old + delta
            f_new = f + X[:, :p] @ delta - sign * X[:, k] * v[i]
            new_sum = float(np.maximum(0.0, 1.0 - y * f_new).sum())
            log_prior = -0.5 * float(np.sum(tau * (new * new - old * old)))
            if log_u[i] < -2.0 * (new_sum - hinge_sum) + log_prior + sign * log_delete[i]:
                theta[:p] = new
                theta[k] = v_out[i] if sign > 0 else v_in[i]
                gamma[i], f, hinge_sum = 1.0 - gamma[i], f_new, new_sum
        return theta, gamma, f

    def flip_proposal_log_ratio(self, v, loc, scale, prior_sd):
        """``log q_k(v) - log N(v; 0, prior_sd)``: the t proposal of an added coefficient against
        its prior (see :meth:`flip_moves`)."""
        return stats.t.logpdf(v, self.FLIP_DF, loc=loc, scale=scale) - stats.norm.logpdf(v, scale=prior_sd)

    def model_jumps(self, theta, gamma, sigma2, f, jumps, rng, odds=None):
        r"""Metropolis-Hastings jumps between the models of the chain's list
        (:class:`~vbsvm.mcmc.model_jumps.ModelJumpTuner`); ``JUMPS_PER_SWEEP`` proposals.

        The single-term moves (collapsed indicators, swaps, add/delete) leave a model one term
        at a time. Where two groups of terms describe the data about equally well (e.g.
        breast_cancer's mean and worst measurements of the same nuclei), each group with its own
        scale ``sigma_u``, the path between them passes through models far less probable than
        either, and a chain stays in one group for hundreds of sweeps. A jump moves the whole
        model at once: from a model ``M`` of the list it proposes another one ``M'`` of the list
        uniformly and draws ``x' = (beta_fixed, v_{A'}, eta)`` (the always-included fixed
        effects, the coefficients of the terms in ``M'``, ``eta = log sigma_u^2``) from ``M'``'s
        t proposal ``q_{M'}``. The target is the pseudo-posterior with the augmentation
        weights, the mixing variables b (so each term's prior is the Laplace density
        :math:`e^{-|v|/\sigma_u}/(2\sigma_u)`) and the excluded terms' ``(v, b)`` integrated
        out:

        .. math::

            \pi(x, M) \propto e^{-2\sum_i (1 - y_i f_i)_+}\, N(\beta_{fixed}; 0, \tau^{-1})
            \prod_{k \in A} \frac{e^{-|v_k|/\sigma_u}}{2\sigma_u}\,
            \rho^{|A|}(1 - \rho)^{m - |A|}\, e^{-A_u\eta - B_u e^{-\eta}},

        (the last factor is the ``IG(A_u, B_u)`` prior of ``sigma_u^2`` in ``eta``, Jacobian
        included), and the acceptance ratio is
        :math:`\pi(x', M')\, q_M(x) / \{\pi(x, M)\, q_{M'}(x')\}`: the choice of ``M'`` is
        symmetric, and a state outside the list proposes nothing (its reverse move could not be
        proposed). The caller must then draw what was integrated out from its conditional
        before anything else uses it: w given the scores, b given the coefficients and
        ``sigma_u`` (then ``sigma_u^2`` and the excluded pairs, as always:
        :meth:`scale_and_excluded_terms`). The random effects and other variances are not
        moved. ``odds`` is the current ``rho`` (default: the fixed one), held fixed by the jumps.
        Returns ``(theta, gamma, sigma2, f)``.

        breast_cancer with ``LaplaceZero(rho=0.01)``, 4 x 2000 after 1000: max R-hat over the
        indicators with a posterior mean in (0.01, 0.99) 1.34 without the jumps (seed 1); see
        the README for the measurements with them.
        """
        odds = self.prior_odds() if odds is None else odds
        tuner, models = self._jumps, jumps["jump_models"]
        n_models = models.shape[0]
        theta, sigma2 = theta.copy(), np.array(sigma2, dtype=float, copy=True)
        X, fixed, sel, nf = self.base.Cd, self.fixed_index, self.sel, self.fixed_index.size
        for _ in range(self.JUMPS_PER_SWEEP):
            match = np.flatnonzero((models == gamma).all(axis=1))
            if match.size == 0:
                break
            k = int(match[0])
            k_new = int(rng.integers(n_models - 1))
            k_new += k_new >= k
            gamma_new = models[k_new]
            x = tuner.coordinates(theta[fixed], theta[sel], gamma, math.log(sigma2[0]))
            x_new = tuner.sample(jumps, k_new, rng)
            old_cols, new_cols = sel[gamma == 1.0], sel[gamma_new == 1.0]
            f_new = (f + X[:, fixed] @ (x_new[:nf] - x[:nf]) + X[:, new_cols] @ x_new[nf:-1]
                     - X[:, old_cols] @ x[nf:-1])
            log_ratio = (self._jump_log_target(x_new, f_new, odds) - self._jump_log_target(x, f, odds)
                         + tuner.log_density(jumps, k, x) - tuner.log_density(jumps, k_new, x_new))
            if math.log(rng.random()) < log_ratio:
                theta[fixed], theta[new_cols] = x_new[:nf], x_new[nf:-1]
                gamma, f, sigma2[0] = gamma_new.copy(), f_new, math.exp(x_new[-1])
        return theta, gamma, sigma2, f

    def _jump_log_target(self, x, f, odds=None) -> float:
        """``log pi(x, M)`` of :meth:`model_jumps` (up to a constant), ``x = (beta_fixed, v_A,
        eta)``, ``f`` the scores and ``odds`` the current ``rho`` (default: the fixed one)."""
        odds = self.prior_odds() if odds is None else odds
        nf = self.fixed_index.size
        beta, v, eta = x[:nf], x[nf:-1], x[-1]
        if not LOG_DRAW_RANGE[0] <= eta <= LOG_DRAW_RANGE[1]:
            # sigma_u^2 outside the range its draws take (vbsvm.distributions.DRAW_RANGE): rejected,
            # and exp(-eta) would overflow
            return -math.inf
        k = v.size
        return float(-2.0 * np.maximum(0.0, 1.0 - self.y * f).sum() - 0.5 * np.sum(self.fixed_tau * beta * beta)
                     - k * (LOG_2 + 0.5 * eta) - np.abs(v).sum() * math.exp(-0.5 * eta)
                     + k * odds.log_rho + (self.m - k) * odds.log_1mrho - self.A * eta - self.B * math.exp(-eta))
