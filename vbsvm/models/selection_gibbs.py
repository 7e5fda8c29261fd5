"""The Gibbs sweep of Laplace-zero selection (Appendix B): collapsed indicator draws, coefficient and swap moves,
the random effects, the scale and excluded terms, and the tuning of the moves."""

from __future__ import annotations

import math

import numpy as np

from vbsvm.distributions import InverseGaussian
from vbsvm.mcmc.model_jumps import ModelJumpTuner
from vbsvm.mcmc.partial_noncentring import ExponentTuner
from vbsvm.models import hinge
from vbsvm.models.selection_algebra import IndicatorDraw, selection_precision
from vbsvm.spd import spd_inverse


class SelectionGibbs:
    """The Gibbs sweep of :class:`~vbsvm.models.selection.LaplaceZeroModel`."""

    def gibbs_initial_state(self, rng):
        """w = 1, every term in, b = 1, unit variances; under a hyperprior rho at its prior mean."""
        start = {} if self.rho_prior is None else {"rho": np.array(self.rho_prior[0] / sum(self.rho_prior))}
        return {**start, "w": np.ones(self.n), "gamma": np.ones(self.m), "b": np.ones(self.m),
                "sigma2": np.ones(len(self.vcomps)), "Lam": [np.eye(c.index.shape[1]) for c in self.covs],
                "flip_on": np.array(0.0), "flip_n": np.array(0.0), "flip_sum": np.zeros(self.m),
                "flip_sq": np.zeros(self.m), "flip_loc": np.zeros(self.m), "flip_scale": np.ones(self.m),
                "flip_cmean": np.zeros(self.m), "flip_cvar": np.ones(self.m),
                "flip_coupling": np.zeros((self.m, self.qd)), "flip_csum": np.zeros((self.m, self.qd)),
                "flip_shift": np.zeros((self.m, self.qd)), **self._jumps.initial_state(),
                **(self.base._exponents.initial_state() if self.base._levels else {})}

    def collapsed_indicators(self, gram, gamma_sel, tau, covariance_precisions=(), rng=None, odds=None):
        r"""Draw the indicators one at a time with every coefficient integrated out given w.

        Given w the working likelihood is Gaussian in theta, so for an active set ``A`` of dense
        coordinates (the always-included ones and the selected terms; the random effects are
        eliminated by the Schur complement, which does not depend on gamma)

        .. math::

            p(\gamma \mid w, b, \sigma^2) \propto \rho^{|\gamma|}(1 - \rho)^{m - |\gamma|}
                \prod_{k \in A} \tau_k^{1/2}\, |R_{AA}|^{-1/2} \exp(\tfrac12 h_A^T R_{AA}^{-1} h_A),

        with ``R`` and ``h`` the reduced precision and vector of the full model (every term in;
        :class:`SelectionPosterior` with ``s = 1``). Adding k to ``A`` multiplies it by
        ``sqrt(tau_k / s_k) exp(c_k^2 / (2 s_k))``, ``s_k = R_kk - R_kA R_AA^{-1} R_Ak``,
        ``c_k = h_k - R_kA R_AA^{-1} h_A``, or from ``R_AA^{-1}`` when k is in ``A``
        (``s_k = 1 / [R_AA^{-1}]_kk``); ``R_AA^{-1}`` is inverted once per sweep and then kept by
        rank-one block updates when an indicator flips (``O(q_d^2)`` per k).
        Unlike a draw of ``gamma_k`` given the coefficients, the other coefficients do not hold
        the fit they had with or without term k, so correlated terms can enter and leave.
        theta must be drawn given the new indicators right after (partially collapsed Gibbs).
        ``odds`` (:class:`~vbsvm.models.selection_algebra.PriorOdds`) is the current ``rho``
        (default: the fixed one).

        Returns
        -------
        IndicatorDraw
            ``gamma``; ``logits``, the conditional logits used (with ``rng=None`` nothing is drawn:
            the logits of every k given the current others); ``mean``, ``var``, the conditional
            moments of each term's coefficient as if included and ``coupling``, the regression of
            the other active coefficients on it (what :meth:`gibbs_adapt` fits the add/delete
            proposals of :meth:`flip_moves` to).
        """
        qd = self.qd
        logit_rho = (self.prior_odds() if odds is None else odds).logit_rho
        try:
            full = self.posterior(gram, np.ones(qd), tau, covariance_precisions)
            R = full.L @ full.L.T
            h = R @ full.mean_dense
        except np.linalg.LinAlgError:
            if self.slopes:
                raise
            # the model with every term in has a precision singular in floating point (more columns
            # than rows, and slab variances so large that their precisions vanish next to the Gram):
            # the conditional logits need only that precision and its shift, not its factor
            R, h = selection_precision(self.base, gram, np.ones(qd), tau)[:2]
        gam = np.asarray(gamma_sel, dtype=float).copy()
        active = np.ones(qd, dtype=bool)
        active[self.sel] = gam == 1.0
        # M: R_AA^{-1} embedded in q_d x q_d (zero outside A), kept by rank-one block updates
        M = np.zeros((qd, qd))
        A = np.flatnonzero(active)
        if A.size:
            M[np.ix_(A, A)] = spd_inverse(R[np.ix_(A, A)])
        Mh = M @ h
        thresholds = None
        if rng is not None:
            u = rng.random(self.m)
            thresholds = np.log(u) - np.log1p(-u)
        logits, cmean, cvar = np.empty(self.m), np.empty(self.m), np.empty(self.m)
        coupling = np.zeros((self.m, qd))
        for i, k in enumerate(self.sel.tolist()):
            if active[k]:  # the Schur complement of k in R_AA is 1 / [R_AA^{-1}]_kk
                s_k = 1.0 / M[k, k]
                c_k = Mh[k] * s_k
                coupling[i] = -M[:, k] * s_k  # R_{A-k}^{-1} R_{A-k,k} from the block inverse
                coupling[i, k] = 0.0
            else:
                u = M @ R[:, k]
                s_k = R[k, k] - R[:, k] @ u
                c_k = h[k] - u @ h
                coupling[i] = u
            logits[i] = logit_rho + 0.5 * (math.log(tau[k]) - math.log(s_k)) + 0.5 * c_k * c_k / s_k
            cmean[i], cvar[i] = c_k / s_k, 1.0 / s_k
            if thresholds is None:
                continue
            new = logits[i] > thresholds[i]
            if new and not active[k]:  # add k: block inverse with the new row and column
                M += np.outer(u, u) / s_k
                M[k, :] = M[:, k] = -u / s_k
                M[k, k] = 1.0 / s_k
            elif active[k] and not new:  # remove k
                M -= np.outer(M[:, k], M[k, :]) / M[k, k]
                M[k, :] = M[:, k] = 0.0
            else:
                continue
            active[k] = new
            gam[i] = float(new)
            Mh = M @ h
        return IndicatorDraw(gam, logits, cmean, cvar, coupling)

    def random_effect_moves(self, theta, gamma, sigma2, covariance_precisions, rng, exponents=None):
        """The linear model's marginal moves of the random effects (augmentation weights
        integrated out; :meth:`~vbsvm.models.linear.LinearSVMModel.marginal_moves`): each
        random-intercept variance non-centred (partially, with ``exponents[k]`` where given), the
        intercept-versus-levels shift and the levels,
        :attr:`~vbsvm.models.linear.LinearSVMModel.level_rounds` times; then the levels of the
        terms with slopes given their covariances (the inverses of ``covariance_precisions``;
        :meth:`~vbsvm.models.linear.LinearSVMModel._redraw_slope_levels`). Up to there they
        touch the intercept, the levels and their variances only, never a selectable coefficient,
        so the Laplace-zero part of the posterior plays no role in them. Last, the
        common scale of every coefficient (the selectable terms' ``v``, included or not), variance
        (``sigma_u^2`` too) and covariance
        (:meth:`~vbsvm.models.linear.LinearSVMModel._rescale_everything`): given its mixing
        variable ``b_k`` a term's prior is ``N(v_k; 0, sigma_u^2 / b_k)``, invariant along the
        orbit up to the Jacobian like any variance-governed coefficient, and the indicators and
        b stay put. Without random effects only the score is computed. Returns
        ``(theta, f, sigma2)``; the variances are drawn again (conjugate, centred) later in the
        sweep, which interweaves the two parameterizations as in the linear model. w must be
        drawn afresh after them."""
        base = self.base
        u = self.effective(theta, gamma)
        f = base.predictor(u)
        if not base.random_effects:
            return theta, f, sigma2
        sigma2 = np.array(sigma2, dtype=float, copy=True)
        for _ in range(base.level_rounds if base._shiftable else 0):
            for k, _index in base._shiftable:
                u, f, sigma2 = base._rescale_variance(k, u, f, sigma2, rng, (exponents or {}).get(k))
            u = base._shift_location(u, sigma2, rng)
            u, f = base._redraw_levels(u, base.predictor(u), sigma2, rng)
        covariances = [spd_inverse(P) for P in covariance_precisions]
        if covariances:
            u, f = base._redraw_slope_levels(u, f, covariances, rng)
        theta = np.array(theta, dtype=float, copy=True)
        keep = np.ones(self.q, dtype=bool)
        keep[self.sel] = False
        theta[keep] = u[keep]
        theta, f, sigma2 = base._rescale_everything(theta, f, sigma2, covariances, rng)
        return theta, f, sigma2

    def coefficient_moves(self, theta, gamma, b, sigma2, f, rng):
        """Marginal (augmentation weights integrated out) slice moves of the coefficients in the
        model (the always-included fixed effects and the selected terms) given the indicators,
        the mixing variables b and the variances, whose prior on them is Gaussian with
        precisions :meth:`prior_precision` (the linear model's
        :meth:`~vbsvm.models.linear.LinearSVMModel._redraw_fixed_effects`), along the principal
        axes of the active columns' cross-products ``X_A^T X_A`` (which depend on the design and
        the indicators only, not on w). The excluded terms' coefficients do not enter the
        scores; their full conditional is the prior, drawn with theta | w. Without this move the
        coefficients in the model change only by their draw given w, which pins them to the fit
        w holds. Toenail with ``LaplaceZero(0.1)`` and ``(1 | patient_id)``, 4 x 1000 after 1000,
        seeds 1 and 4: min bulk ESS 114 and 121 without the move (``beta[time:terbinafine]``;
        max R-hat 1.057, 1.044), 138 and 123 with it along the coordinate axes (1.022, 1.037),
        164 and 183 along the principal axes (1.032, 1.018).
        Returns ``(theta, f)``; w must be drawn afresh after it."""
        base = self.base
        active = np.ones(base.p, dtype=bool)
        active[self.sel] = gamma == 1.0
        index = np.flatnonzero(active)
        if index.size == 0:
            return theta, f
        # principal axes of the active columns' cross-products (what makes their coefficients
        # correlated: a main effect and its interaction), each scaled by 1 / sqrt(eigenvalue)
        evals, evecs = np.linalg.eigh(self._cross_products[np.ix_(index, index)])
        directions = np.zeros((base.p, index.size))
        directions[index] = evecs / np.sqrt(np.maximum(evals, 1e-12 * max(evals.max(), 1e-300)))
        tau = self.prior_precision(1.0 / np.asarray(sigma2), b)[: base.p]
        u, f = base._redraw_fixed_effects(self.effective(theta, gamma), f, sigma2, rng, directions, tau=tau)
        theta = np.array(theta, dtype=float, copy=True)
        theta[index] = u[index]
        return theta, f

    def swap_moves(self, theta, gamma, b, f, rng):
        """Metropolis-Hastings swaps of a term in the model with one out of it, on the marginal
        pseudo-posterior (augmentation weights integrated out); ``m`` proposals.

        A proposal picks an included term j uniformly and an excluded k with probability
        proportional to ``|corr(x_j, x_k)|`` (floored at 0.01), and exchanges the pairs
        ``(gamma, v, b)`` of j and k, with ``v`` multiplied by ``s = sign corr(x_j, x_k)``: the new
        effective coefficient of k is ``s v_j``. The exchange is an involution that leaves the
        prior invariant (the ``(v_k, b_k)`` are iid, symmetric in sign, the ``gamma_k`` iid), so the
        acceptance ratio is the pseudo-likelihood ratio times the proposal ratio
        ``sum_{l out} w_jl / sum_{l out'} w_kl``. Single-site indicator updates cannot make this move
        in one step when two predictors are correlated (dropping one first costs fit). Returns the
        new ``(theta, gamma, b, f)``; w must be drawn afresh after it.
        """
        if self.m < 2:
            return theta, gamma, b, f
        theta, gamma, b = theta.copy(), gamma.copy(), b.copy()
        W, X = self._swap_weight, self.base.Cd
        hinge_sum = float(np.maximum(0.0, 1.0 - self.y * f).sum())
        for _ in range(self.m):
            inc, out = np.flatnonzero(gamma == 1.0), np.flatnonzero(gamma == 0.0)
            if inc.size == 0 or out.size == 0:
                break
            j = inc[rng.integers(inc.size)]
            wj = W[j, out]
            k = out[min(np.searchsorted(np.cumsum(wj), rng.random() * wj.sum()), out.size - 1)]
            s = self._swap_sign[j, k]
            jj, kk = self.sel[j], self.sel[k]
            f_new = f + (s * X[:, kk] - X[:, jj]) * theta[jj]
            new_sum = float(np.maximum(0.0, 1.0 - self.y * f_new).sum())
            out_rev = np.where(out == k, j, out)
            log_ratio = -2.0 * (new_sum - hinge_sum) + math.log(wj.sum()) - math.log(W[k, out_rev].sum())
            if math.log(rng.random()) < log_ratio:
                theta[jj], theta[kk] = s * theta[kk], s * theta[jj]
                gamma[j], gamma[k] = gamma[k], gamma[j]
                b[j], b[k] = b[k], b[j]
                f, hinge_sum = f_new, new_sum
        return theta, gamma, b, f

    def scale_and_excluded_terms(self, theta, gamma, sigma2_u, rng):
        """The mixing variables b of the included terms from ``b_k | v_k, sigma_u``
        (:meth:`mixing_conditional`), then ``sigma_u^2`` jointly with the excluded terms'
        ``(v_k, b_k)``, and the other variances given their coefficients (conjugate). An
        excluded term's pair enters nothing but its prior, so integrating it out leaves
        ``sigma_u^2 | rest ~ IG(A + m_in/2, B + sum_{k in} b_k v_k^2 / 2)`` over the ``m_in``
        included terms; the excluded pairs are then drawn from their prior given the new
        ``sigma_u`` (``1/b_k ~ Exp(rate 1/2)``, ``v_k | b_k ~ N(0, sigma_u^2 / b_k)``). Drawn given
        every pair instead, ``sigma_u^2`` is held by the excluded terms' prior draws, which were
        themselves drawn given it. Returns ``(theta, b, sigma2)``."""
        theta = np.array(theta, dtype=float, copy=True)
        included = gamma == 1.0
        v = theta[self.sel]
        b = np.empty(self.m)
        b[included] = self.mixing_conditional(v[included], sigma2_u).sample(rng)
        sq = np.array([float(np.sum(b[included] * v[included] ** 2))]
                      + [float(np.sum(theta[c.index] ** 2)) for c in self.vcomps[1:]])
        sizes = self.sizes.copy()
        sizes[0] = included.sum()
        sigma2 = np.atleast_1d(self.variance_posterior(sq, sizes).sample(rng))
        out = np.flatnonzero(~included)
        b[out] = 0.5 / rng.standard_exponential(out.size)
        theta[self.sel[out]] = np.sqrt(sigma2[0] / b[out]) * rng.standard_normal(out.size)
        return theta, b, sigma2

    def rho_conditional(self, gamma):
        """Shapes of the full conditional of rho under its hyperprior: ``rho | gamma, rest ~
        Beta(a + |gamma|, b + m - |gamma|)`` (rho enters nothing else: the beta-binomial
        conjugate step)."""
        a, b = self.rho_prior
        k = float(np.sum(gamma))
        return a + k, b + (self.m - k)

    def draw_rho(self, gamma, rng):
        """A draw of :meth:`rho_conditional` (a 0-d array, as the state stores it)."""
        a, b = self.rho_conditional(gamma)
        return np.array(rng.beta(a, b))

    def mixing_conditional(self, v, sigma2_u) -> InverseGaussian:
        """Full conditional of the Laplace mixing variables, ``b_k | v_k, sigma_u ~
        InverseGaussian(sigma_u / |v_k|, 1)`` (prior ``b_k ~ IG(1, 1/2)``, ``v_k | b_k ~
        N(0, sigma_u^2 / b_k)``; see the module docstring)."""
        return InverseGaussian(math.sqrt(sigma2_u) / np.maximum(np.abs(v), 1e-300), 1.0)

    def gibbs_adapt(self, state, it, tune):
        """Called by the engine after each tuning sweep (never after tuning): over the first half
        of tuning, collect the moments of each coefficient's conditional as if included (from
        :meth:`collapsed_indicators`), then fix the add/delete proposals of :meth:`flip_moves`
        (a t with their mixture's mean and an inflated sd) and switch the move on; and fit the
        exponents of the random-intercept variances' partially non-centred move as the linear
        model does (:meth:`~vbsvm.models.linear.LinearSVMModel.gibbs_adapt`)."""
        state = self.base.adapt_level_exponents(state, it, tune)
        theta = state["theta"]
        state = self._jumps.record(state, it, tune, state["gamma"], theta[self.fixed_index], theta[self.sel],
                                   math.log(state["sigma2"][0]))
        half = tune // 2
        if it >= half or half < self.FLIP_MIN_SWEEPS or "flip_n" not in state:
            return state
        state = dict(state)
        state["flip_n"] = state["flip_n"] + 1.0
        state["flip_sum"] = state["flip_sum"] + state["flip_cmean"]
        state["flip_sq"] = state["flip_sq"] + state["flip_cmean"] ** 2 + state["flip_cvar"]
        state["flip_csum"] = state["flip_csum"] + state["flip_coupling"]
        if it == half - 1:
            n = float(state["flip_n"])
            loc = state["flip_sum"] / n
            shift = state["flip_csum"] / n
            shift[:, self.base.p:] = 0.0  # only fixed effects and selectable terms are shifted
            state.update(flip_loc=loc, flip_on=np.array(1.0), flip_shift=shift,
                         flip_scale=self.FLIP_INFLATE * np.sqrt(np.maximum(state["flip_sq"] / n - loc ** 2, 1e-12)))
        return state

    def gibbs_pool(self, states):
        """Called by the engine once every chain has tuned: one list of models to jump between
        (:meth:`model_jumps`) for all chains, fitted from all their tuning sweeps
        (:meth:`~vbsvm.mcmc.model_jumps.ModelJumpTuner.pool`)."""
        return self._jumps.pool(states)

    def gibbs_sweep(self, state, rng):
        """gamma_k | w, rest one at a time with theta integrated out (:meth:`collapsed_indicators`);
        theta | gamma, w, rest; the random effects' marginal moves
        (:meth:`random_effect_moves`); swaps of correlated terms (marginal, see
        :meth:`swap_moves`); add/delete of each term (marginal, after tuning's first half, see
        :meth:`flip_moves`); jumps between listed models (after tuning, see :meth:`model_jumps`);
        w | f; the included terms' b | v, sigma_u; then sigma_u^2 with the excluded terms'
        (v, b) and the other variances (:meth:`scale_and_excluded_terms`); the covariances;
        last, under a hyperprior, ``rho | gamma`` (:meth:`draw_rho`). Every move of the
        indicators is exact for the posterior given the current ``rho`` (the state's ``"rho"``),
        which the conjugate step then updates."""
        gram = self.gram(state["w"])
        tau = self.prior_precision(1.0 / state["sigma2"], state["b"])
        Lam = state.get("Lam", ())
        odds = self.prior_odds(state["rho"] if self.rho_prior is not None else None)
        draw = self.collapsed_indicators(gram, state["gamma"], tau, Lam, rng, odds=odds)
        gamma = draw.gamma
        theta = self.posterior(gram, self.scaling(gamma), tau, Lam).sample(rng)
        theta, f, sigma2 = self.random_effect_moves(theta, gamma, state["sigma2"], Lam, rng,
                                                    self.base._level_exponents(state))
        theta, f = self.coefficient_moves(theta, gamma, state["b"], sigma2, f, rng)
        theta, gamma, b, f = self.swap_moves(theta, gamma, np.asarray(state["b"], dtype=float), f, rng)
        flips = {k: v for k, v in state.items() if k.startswith("flip_")}
        if flips and flips["flip_on"]:
            theta, gamma, f = self.flip_moves(theta, gamma, b, sigma2, f, flips, rng, odds=odds)
        jumps = ModelJumpTuner.carry(state)
        if jumps and jumps["jump_models"].shape[0]:
            theta, gamma, sigma2, f = self.model_jumps(theta, gamma, sigma2, f, jumps, rng, odds=odds)
        u = self.effective(theta, gamma)
        w = hinge.sample_inverse(self.y, f, rng)
        theta, b, sigma2 = self.scale_and_excluded_terms(theta, gamma, sigma2[0], rng)
        # Sigma_k | b ~ IW(scale + sum_l b_l b_l^T, df + m) (the conjugate step of the linear model)
        Sigmas = [qc.sample(rng) for qc in self.base.covariance_posteriors(self.base.scatter_matrices(theta))]
        if flips:
            flips.update(flip_cmean=draw.mean, flip_cvar=draw.var, flip_coupling=draw.coupling)
        hyper = {} if self.rho_prior is None else {"rho": self.draw_rho(gamma, rng)}
        return {**hyper, "w": w, "gamma": gamma, "b": b, "sigma2": sigma2, "theta": theta, "u": u,
                "Lam": [spd_inverse(S) for S in Sigmas],
                "cov": np.concatenate([S.ravel() for S in Sigmas]) if Sigmas else np.zeros(0),
                "log_pseudo_likelihood": -2.0 * np.maximum(0.0, 1.0 - self.y * f).sum(), **flips, **jumps,
                **ExponentTuner.carry(state)}
