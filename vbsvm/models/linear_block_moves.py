"""Tuned block moves of the fixed effects in the linear SVM's Gibbs sweep: an independence Metropolis-Hastings proposal
and HMC on the marginal (smoothed-hinge) pseudo-posterior, both exact by their accept step."""

from __future__ import annotations

import math

import numpy as np

from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.hmc import TRAJECTORY, TRAJECTORY_WITH_VARIANCE, hmc_transition, trajectory_steps
from vbsvm.mcmc.independence import independence_steps
from vbsvm.models import hinge
from vbsvm.models.linear_algebra import LOG_VARIANCE_RANGE


class LinearBlockMoves:
    """Independence and HMC block moves of :class:`~vbsvm.models.linear.LinearSVMModel`."""

    def _independence_move(self, proposal, theta, f, sigma2, rng):
        """Block independence Metropolis-Hastings of the fixed effects, jointly with the log of
        each variance that governs fixed effects only, on the marginal pseudo-posterior of
        :meth:`_hmc_move`. :data:`imh_steps` proposals from the t proposal fitted during tuning
        are evaluated in one batch (:mod:`vbsvm.mcmc.independence`). Like the other marginal
        moves it must be followed by a fresh ``w | theta``. Returns ``(theta, f, sigma2, accepted)``."""
        p, own = self.p, self._block_variances
        X = self.Cd[:, :p]
        current = np.concatenate([theta[:p], np.log(sigma2[own])])
        f_rest = f - X @ theta[:p]
        cand = proposal.sample(self.imh_steps, rng)
        F = f_rest[:, None] + X @ cand[:p]
        # the current state in column 0 and the proposals after it: one evaluation of each density
        both = np.column_stack([current, cand])
        target = self._imh_log_target(both, np.column_stack([f, F]))
        log_q = proposal.log_density(both)
        k, accepted = independence_steps(target[0], target[1:], log_q[0], log_q[1:], rng)
        if k < 0:
            return theta, f, sigma2, accepted
        theta, sigma2 = theta.copy(), sigma2.copy()
        theta[:p] = cand[:p, k]
        sigma2[own] = np.exp(cand[p:, k])
        return theta, F[:, k].copy(), sigma2, accepted

    def _imh_log_target(self, x, F):
        """Log target of :meth:`_independence_move` at the columns of ``x`` (fixed effects, then
        the log variances), ``F`` the scores: :meth:`_hmc_target` (at ``chol = I``) for many points at once."""
        p = self.p
        beta, eta = x[:p], x[p:]
        value = -2.0 * np.maximum(0.0, 1.0 - self.y[:, None] * F).sum(axis=0)
        value -= 0.5 * np.sum(self._block_fixed_tau[:, None] * beta * beta, axis=0)
        for r, k in enumerate(self._block_variances):
            idx = self.variance_components[k].index
            value += (-(0.5 * idx.size + self.A) * eta[r]
                      - np.exp(-eta[r]) * (0.5 * np.sum(beta[idx] ** 2, axis=0) + self.B))
        outside = (eta < LOG_VARIANCE_RANGE[0]) | (eta > LOG_VARIANCE_RANGE[1])
        return np.where(outside.any(axis=0), -np.inf, value)

    def _hmc_move(self, tuner, theta, f, sigma2, rng):
        """Hamiltonian Monte Carlo transition of the fixed effects, jointly with the log of each
        variance that governs fixed effects only (the penalty's ``sigma2_u``), on the marginal
        pseudo-posterior given the random effects and their variances:
        ``prod_j N(beta_j; 0, 1/tau_j) prod_k IG(sigma2_k; A, B) sigma2_k prod_i exp(-2 (1 - y_i f_i)_+)``
        in the coordinates ``(beta, log sigma2_k)`` (the factor ``sigma2_k`` is the Jacobian), with
        the metric and step fitted during tuning (:mod:`vbsvm.mcmc.hmc`), whitened by the
        metric (:meth:`_hmc_target`), its trajectories on the hinge smoothed over the width picked
        in tuning (:mod:`vbsvm.models.hinge`; the acceptance uses the exact hinge), of length
        :data:`~vbsvm.mcmc.hmc.TRAJECTORY_WITH_VARIANCE` when the block carries a variance.
        Each leapfrog step costs two O(np) products (scores and gradient). Like the other
        marginal moves it must be followed by a fresh ``w | theta``.
        Returns ``(theta, f, sigma2, accept_prob)``."""
        p, own, chol = self.p, self._block_variances, tuner["blk_chol"]
        X = self.Cd[:, :p]
        f_rest = f - X @ theta[:p]
        x0 = np.concatenate([theta[:p], np.log(sigma2[own])])
        surrogate = BlockTuner.surrogate(tuner)
        target, gradient = self._hmc_target(x0, chol, f_rest,
                                            hinge.SMOOTHING_WIDTHS[surrogate] if surrogate >= 0 else 0.0)
        z = np.zeros(x0.size)
        step = BlockTuner.hmc_step(tuner, rng)
        length = TRAJECTORY_WITH_VARIANCE if own.size else TRAJECTORY
        z, (_, _, scores), accept_prob = hmc_transition(target, z, target(z), step, trajectory_steps(step, length),
                                                        rng, gradient)
        if not z.any():  # rejected
            return theta, f, sigma2, accept_prob
        x = x0 + chol @ z
        theta, sigma2 = theta.copy(), sigma2.copy()
        theta[:p] = x[:p]
        sigma2[own] = np.exp(x[p:])
        return theta, f_rest + scores, sigma2, accept_prob

    def _hmc_target(self, x0, chol, f_rest, width=0.0):
        """Log target of :meth:`_hmc_move` in the coordinates z of ``x = x0 + chol z`` (x: the
        fixed effects, then the log variances; ``f_rest`` the scores of everything else):
        returns ``(target, gradient)``, the map ``z -> (log density, gradient in z, X beta)`` and
        the map ``z -> gradient in z`` (None outside the support) that the steps inside a
        trajectory call. The hinge contributes ``2 X^T (y * 1[y f < 1])`` to the gradient in x
        (with ``width > 0``, the slope ``h_w'`` of the hinge smoothed over that width,
        :mod:`vbsvm.models.hinge`, in place of the indicator; the log
        density stays the exact one), each variance ``-(m_k/2 + A) + e^{-eta_k} (||beta_k||^2/2 +
        B)``; the gradient in z is chol^T times it.

        Written out (buffers reused, no temporaries of size n beyond the products) because it
        is the sampler's innermost loop. The smoothed slope is formed from the scores directly:
        ``2 y h_w'(gap) = y clip(2 gap / w + 1, 0, 2)`` with ``2 gap / w + 1 = (2 (1 - y f_rest) / w
        + 1) - (2 y / w) X beta``, and the exact hinge's passes (its value) are made only where
        the log density is asked for: at n = 569, p = 31 (breast_cancer) about 12.7 us per
        gradient and 14.7 us per evaluation with the log density (16.4 us for both before)."""
        p, y, X, A, B = self.p, self.y, self.Cd[:, : self.p], self.A, self.B
        tau, governed_blocks = self._block_fixed_tau, self._block_governed
        low, high = LOG_VARIANCE_RANGE
        margin_left = 1.0 - y * f_rest
        if width > 0.0:
            shifted, y_scaled, y_factor = 2.0 * margin_left / width + 1.0, (2.0 / width) * y, y
        else:  # the exact hinge's slope 1[gap > 0], times 2 y
            shifted, y_scaled, y_factor = margin_left, y, 2.0 * y
        gap, slope = np.empty(self.n), np.empty(self.n)
        chol_t = np.ascontiguousarray(chol.T)
        x, grad = np.empty(x0.size), np.empty(x0.size)
        grad_beta = grad[:p]

        def evaluate(z, with_value):
            np.dot(chol, z, out=x)
            np.add(x, x0, out=x)
            etas = x[p:].tolist()
            for e in etas:
                if not low < e < high:
                    return -math.inf, None, None
            beta = x[:p]
            scores = X @ beta
            value = 0.0
            if with_value:
                np.multiply(y, scores, out=gap)
                np.subtract(margin_left, gap, out=gap)
                value = -2.0 * float(np.maximum(gap, 0.0, out=gap).sum())
            np.multiply(y_scaled, scores, out=slope)
            np.subtract(shifted, slope, out=slope)
            if width > 0.0:
                np.maximum(slope, 0.0, out=slope)  # ufuncs: np.clip costs twice their time here
                np.minimum(slope, 2.0, out=slope)
            else:
                np.greater(slope, 0.0, out=slope)
            np.multiply(slope, y_factor, out=slope)
            np.dot(slope, X, out=grad_beta)
            tau_beta = tau * beta
            value -= 0.5 * float(tau_beta @ beta)
            np.subtract(grad_beta, tau_beta, out=grad_beta)
            for r, (governed, size) in enumerate(governed_blocks):
                b = beta[governed]
                half_sq = 0.5 * float(b @ b) + B
                precision = math.exp(-etas[r])
                value += -(0.5 * size + A) * etas[r] - precision * half_sq
                grad_beta[governed] -= precision * b
                grad[p + r] = -(0.5 * size + A) + precision * half_sq
            return value, chol_t @ grad, scores

        def target(z):
            return evaluate(z, True)

        def gradient(z):
            return evaluate(z, False)[1]

        return target, gradient
