"""The Gibbs sweep of the linear SVM (Appendix A and its random-effect form): the augmentation, the coefficient block,
the variance components and covariances, and the tuning schedule of the moves."""

from __future__ import annotations

import numpy as np

from vbsvm.mcmc.block_tuner import BlockTuner
from vbsvm.mcmc.partial_noncentring import ExponentTuner
from vbsvm.mcmc.slice import slice_sample
from vbsvm.models import hinge
from vbsvm.spd import spd_inverse


class LinearGibbs:
    """The Gibbs sweep of :class:`~vbsvm.models.linear.LinearSVMModel` and its adaptation during tuning."""

    def gibbs_initial_state(self, rng):
        return {"w": np.ones(self.n), "tau": np.ones(len(self.variance_components)),
                "Lam": [np.eye(c.index.shape[1]) for c in self.covariance_components],
                **self._tuner.initial_state(), **(self._exponents.initial_state() if self._levels else {})}

    def gibbs_adapt(self, state, it, tune):
        """Called by the engine after each tuning sweep (never after tuning): fits, tries and
        keeps the fixed effects' independence move (:meth:`_independence_move`), their HMC move
        (:meth:`_hmc_move`) or neither (:class:`~vbsvm.mcmc.block_tuner.BlockTuner`), and
        fits the exponents of the random-intercept variances' partially non-centred move
        (:class:`~vbsvm.mcmc.partial_noncentring.ExponentTuner`). The HMC move's trajectories
        follow the hinge smoothed over the widest of :data:`~vbsvm.models.hinge.SMOOTHING_WIDTHS`
        whose mismatch with the exact one varies little over the collected sweeps."""
        block = np.concatenate([state["theta"][: self.p], np.log(state["sigma2"][self._block_variances])])
        mismatch = None
        if self._tuner.collects(state, it, tune):
            mismatch = hinge.smoothing_mismatch(1.0 - self.y * state["f"], hinge.SMOOTHING_WIDTHS)
        fitted = state.get("blk_chol")
        state = self.adapt_level_exponents(self._tuner.adapt(state, block, it, tune, mismatch), it, tune)
        if state.get("blk_chol") is not fitted:  # the block was (re)fitted: its principal axes
            L = state["blk_chol"][: self.p]
            evals, evecs = np.linalg.eigh(L @ L.T)
            state["blk_directions"] = evecs * np.sqrt(np.maximum(evals, 0.0))
        return state

    def adapt_level_exponents(self, state, it, tune):
        """Feed the random-intercept levels and variances of ``state`` to the exponents' tuner
        (:class:`~vbsvm.mcmc.partial_noncentring.ExponentTuner`) after tuning sweep ``it``."""
        if not self._levels or "theta" not in state:
            return state
        ks = list(self._levels)
        levels = np.concatenate([state["theta"][self.variance_components[k].index] for k in ks])
        return self._exponents.adapt(state, levels, np.asarray(state["sigma2"])[ks], it, tune)

    def _level_exponents(self, state) -> dict:
        """Variance index -> exponents of its levels' partially non-centred move, as fitted so far
        in ``state`` (empty if the state has none: every variance then moves non-centred)."""
        fitted = self._exponents.exponents(state)
        return {} if fitted is None else dict(zip(self._levels, fitted))

    def _redraw_levels(self, theta, f, sigma2, rng):
        """Marginal (w integrated out) update of the levels of every random-intercept term: given
        the rest, level l's intercept has density ``N(u_l; 0, sigma2_k) prod_{i in l}
        exp(-2 (1 - y_i f_i)_+)``, independent across levels, a mixture of truncated normals
        drawn exactly for all levels at once (:func:`~vbsvm.models.hinge.sample_offsets`). Like
        :meth:`_rescale_variance` it must be followed by a fresh ``w | theta``."""
        theta = theta.copy()
        for k, index in self._shiftable:
            layout = self._levels[k]
            u0 = theta[index]
            u = hinge.sample_offsets(1.0 - self.y * (f - u0[layout.codes]), self.y, layout, sigma2[k], rng)
            theta[index] = u
            f = f + (u - u0)[layout.codes]
        return theta, f

    def _redraw_slope_levels(self, theta, f, covariances, rng):
        """Marginal (w integrated out) update of the levels of every random-effect term with q > 1
        columns: given the rest, level l's coefficients have density ``N(b_l; 0, Sigma) prod_{i in l}
        exp(-2 (1 - y_i f_i)_+)``, independent across levels. In the whitened coordinates
        ``a_l = L^{-1} b_l`` (``Sigma = L L'``, so ``a_l ~ N(0, I)`` a priori) each coordinate is
        drawn exactly from its conditional for all levels at once, one coordinate after the other
        (:func:`~vbsvm.models.hinge.sample_offsets`): setting ``a_lj`` to ``u`` moves the margin
        gap of level l's rows to ``gap_i - y_i z_i' L e_j (u - a_lj)``. Like :meth:`_redraw_levels`
        it must be followed by a fresh ``w | theta``: with slopes the augmented step alone mixes
        slowly (toenail ``(1 + time | patient_id)``: max R-hat 1.14-1.22, min bulk ESS 14-21 in
        4 x 5000 draws), because w pins each level's scores."""
        theta = theta.copy()
        for (c, codes, Z, layout), Sigma in zip(self._slope_terms, covariances):
            L = np.linalg.cholesky(Sigma)
            a = np.linalg.solve(L, theta[c.index].T).T  # (m, q)
            for j in range(L.shape[0]):
                zl = Z @ L[:, j]
                yz, a0 = self.y * zl, a[:, j].copy()
                u = hinge.sample_offsets(1.0 - self.y * f + yz * a0[codes], yz, layout, 1.0, rng)
                f = f + (u - a0)[codes] * zl
                a[:, j] = u
            theta[c.index] = a @ L.T
        return theta, f

    def _redraw_fixed_effects(self, theta, f, sigma2, rng, directions=None, tau=None):
        """Marginal (w integrated out) slice moves of the fixed effects along fixed directions:
        along direction ``v`` the step ``t`` (``beta + t v``) has density
        ``prod_j N(beta_j + t v_j; 0, 1/tau_j) prod_i exp(-2 (1 - y_i f_i - t y_i x_i^T v)_+)``,
        slice-sampled in O(n) per evaluation with width 3 (so ``v`` carries the scale). The
        directions are the coordinates (``v = e_j / ||x_j||``) until tuning has fitted the block's
        covariance, then its principal axes scaled by their sds (``directions``, p x p), which
        decorrelates collinear predictors. Neither depends on w, so the move keeps the marginal
        posterior; it must be followed by a fresh ``w | theta``. The current density is carried
        from one direction to the next (the slice sampler does not re-evaluate it), and each
        evaluation works in place in one buffer. ``tau``, the fixed effects' prior precisions,
        defaults to this model's given ``sigma2`` (the Laplace-zero model passes its own)."""
        if tau is None:
            tau = self.prior_precision(1.0 / sigma2)[: self.p]
        X = self.Cd[:, : self.p]
        theta = theta.copy()
        beta = theta[: self.p]
        if directions is None:
            directions = np.diag(self._fixed_width / 3.0)
        rest = 1.0 - self.y * f
        buf = np.empty(self.n)
        hinge_now = float(np.maximum(0.0, rest).sum())
        for start in range(0, self.p, self.DIRECTION_BLOCK):
            block = directions[:, start: start + self.DIRECTION_BLOCK]
            XVt = block.T @ X.T  # the block's score changes in one product (rows contiguous)
            for j, v in enumerate(block.T):
                yxv = self.y * XVt[j]
                a2, a1 = float(tau @ (v * v)), float(tau @ (v * beta))

                def logp(t):
                    np.multiply(yxv, t, out=buf)
                    np.subtract(rest, buf, out=buf)
                    np.maximum(buf, 0.0, out=buf)
                    return -0.5 * t * (a2 * t + 2.0 * a1) - 2.0 * float(buf.sum())

                t = slice_sample(logp, 0.0, rng, width=3.0, logp_x0=-2.0 * hinge_now)[0]
                if t != 0.0:
                    rest -= t * yxv
                    f = f + t * XVt[j]
                    beta += t * v
                    hinge_now = float(np.maximum(0.0, rest).sum())
        return theta, f

    def marginal_moves(self, theta, f, sigma2, rng, directions=None, slice_moves=True, covariances=(),
                       exponents=None):
        """The moves of a sweep on the marginal pseudo-posterior (augmentation weights integrated
        out): each variance with its coefficients (:meth:`_rescale_variance`: non-centred, or
        partially non-centred with ``exponents[k]`` where that dict has variance k's levels'
        exponents), the intercept-versus-levels shift, the levels of the
        random intercepts and, given their ``covariances``, of the terms with slopes
        (:meth:`_redraw_slope_levels`) with their shift against the fixed effects
        (:meth:`_shift_slope_locations`) and the common scale of everything
        (:meth:`_rescale_everything`), and (unless ``slice_moves`` is False) the fixed effects
        along ``directions`` (:meth:`_redraw_fixed_effects`). Returns ``(theta, f, sigma2)``; w
        must be drawn afresh after them."""
        for _ in range(self.level_rounds if self._shiftable else 1):
            for k in range(sigma2.size):
                theta, f, sigma2 = self._rescale_variance(k, theta, f, sigma2, rng, (exponents or {}).get(k))
            if self._shiftable:
                theta = self._shift_location(theta, sigma2, rng)
                theta, f = self._redraw_levels(theta, self.predictor(theta), sigma2, rng)
        if covariances:
            theta, f = self._redraw_slope_levels(theta, f, covariances, rng)
            theta = self._shift_slope_locations(theta, sigma2, covariances, rng)
        if self.random_effects:
            theta, f, sigma2 = self._rescale_everything(theta, f, sigma2, covariances, rng)
        if slice_moves:
            theta, f = self._redraw_fixed_effects(theta, f, sigma2, rng, directions)
        return theta, f, sigma2

    def gibbs_sweep(self, state, rng):
        """One scan: theta | w, prior; each variance | theta (centred, conjugate IG) and again with
        its coefficients (non-centred or partially, :meth:`_rescale_variance`); the levels of the
        random intercepts and of the terms with slopes with w integrated out, and with random
        effects the common scale of everything (:meth:`marginal_moves`); 1/a | theta; each
        covariance | theta.

        The two variance updates interweave the centred and the non-centred parameterization
        (ASIS, Yu & Meng 2011): the centred step mixes when the data pin the coefficients down,
        the non-centred step when they do not (few rows per group, separable directions), where
        ``sigma2 | theta`` alone sticks. The non-centred step targets the marginal pseudo-posterior
        (no w), so the scale of a whole block of coefficients moves free of the augmentation
        weights, whose coupling with theta is what slows the plain sampler; w is then drawn given
        the new theta. Each step keeps the posterior, so the scan does. Once tuning has measured
        how much the data pin each level down, a random-intercept variance's second step is
        partially non-centred instead, one exponent per level
        (:mod:`vbsvm.mcmc.partial_noncentring`): on toenail it took the bulk ESS of
        ``sigma2_patient_id`` from about 900 to about 2400 per 8000 draws at the same cost.

        After tuning, the fixed effects (with ``log sigma2_u``) move by the independence sampler
        if its trial went well (:meth:`_independence_move`, one matrix product per sweep), else
        by HMC if its trial did (:meth:`_hmc_move`), else by slice sampling along the principal
        axes of their tuning draws; during a trial a fitted move replaces the slice moves while
        its acceptance is high enough
        (:meth:`~vbsvm.mcmc.block_tuner.BlockTuner.replaces_slice_moves`). With a fitted
        move kept and no random effects, the augmented steps (theta | w and w | theta, an
        ``O(n p^2)`` Gram and ``n`` inverse-Gaussian draws) are skipped: the scan is then a
        Metropolis-within-Gibbs sampler on the marginal pseudo-posterior, each of its steps
        exact. During a trial that goes well theta | w is skipped likewise; w is then drawn
        (given the current theta) only by a sweep that makes the augmented step again, when the
        trial stops going well, at its start: the same draw as at the end of the sweep before,
        which nothing in between used (on breast_cancer the trial's sweeps cost about 20% less).
        """
        tuner = BlockTuner.carry(state)
        replaces_slice_moves = self._tuner.replaces_slice_moves(tuner)
        skip_augmented = self.q == self.p and replaces_slice_moves
        w = state["w"]
        if skip_augmented:
            theta = state["theta"]
        else:
            if w.size == 0:  # not drawn after the last sweep, which skipped the augmented steps: now, given its theta
                w = hinge.sample_inverse(self.y, state["f"], rng)
            post = self.coefficient_posterior(w, self.prior_precision(state["tau"]),
                                              self.prior_blocks(state.get("Lam", ())))
            theta = post.sample(rng)
        if self.variance_components:
            sigma2 = self._sample_variances(np.array([np.sum(theta[index] ** 2) for index in self._variance_slices]),
                                            rng)
        else:
            sigma2 = np.zeros(0)
        theta, f, sigma2 = self.marginal_moves(theta, self.predictor(theta), sigma2, rng,
                                               directions=tuner.get("blk_directions"),
                                               slice_moves=not replaces_slice_moves,
                                               covariances=[spd_inverse(Lam) for Lam in state["Lam"]]
                                               if self._slope_terms else (),
                                               exponents=self._level_exponents(state) if self._levels else None)
        proposal = self._tuner.imh_proposal(tuner)
        if proposal is not None:
            theta, f, sigma2, accepted = self._independence_move(proposal, theta, f, sigma2, rng)
            tuner = self._tuner.record_imh(tuner, self.imh_steps, accepted)
        if self._tuner.runs_hmc(tuner):
            theta, f, sigma2, accept_prob = self._hmc_move(tuner, theta, f, sigma2, rng)
            tuner = self._tuner.record_hmc(tuner, accept_prob)
        # w | theta, unless the next sweep may skip theta | w too: then it is drawn when needed
        w = np.zeros(0) if skip_augmented else hinge.sample_inverse(self.y, f, rng)
        Sigmas = ([qc.sample(rng) for qc in self.covariance_posteriors(self.scatter_matrices(theta))]
                  if self.covariance_components else [])
        return {"w": w, "tau": 1.0 / sigma2, "Lam": [spd_inverse(S) for S in Sigmas], "theta": theta,
                "sigma2": sigma2, "cov": np.concatenate([S.ravel() for S in Sigmas]) if Sigmas else np.zeros(0),
                "f": f, "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum(), **tuner,
                **(ExponentTuner.carry(state) if self._levels else {})}
