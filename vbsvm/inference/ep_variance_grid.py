r"""Fewer and cheaper EP runs for the integration over the variance parameters.

**Frozen sites.** At an EP fixed point with sites :math:`(\tilde\tau, \tilde\nu)` at :math:`\eta_0`,

.. math::

    \log Z_{EP}(\eta_0) = \tfrac12\log|T_{\eta_0}| - \tfrac12\log|P_{\eta_0}| + \tfrac12 h^T P_{\eta_0}^{-1} h
        + \sum_i \log C_i,

:math:`P_\eta = C^T\mathrm{diag}(\tilde\tau)C + T_\eta`, :math:`h = C^T\tilde\nu`, with :math:`C_i` the
sites' normalizers. Holding the sites (and :math:`C_i`) fixed and moving :math:`\eta` gives the
*frozen-site* density (:class:`FrozenSites`): the evidence of the Gaussian pseudo-data of the
sites, computed from their statistics (:class:`~vbsvm.inference.ep_sites.SiteStatistics`) in
:math:`O(q^3)` without reading the data. It agrees with :math:`\log Z_{EP} + \log p(\eta)` in value
and gradient at :math:`\eta_0` (the gradient of log Z_EP at a fixed point is that of the Gaussian
with the sites held fixed) and differs at second order, by the sites' response to :math:`\eta`.
How large that response is, is measured: every EP run of the grid is compared with the frozen
density of its nearest EP run (:class:`PointEvaluator`), and a point is evaluated with frozen sites
where the errors so extrapolated are small (with 10^5-10^6 rows and 20 coefficients: every point
but the first EP runs'; with a few hundred rows, or random intercepts of a few rows each, only
the points far enough in the tails that their errors, times their weight, are as small).

**Mode.** Quasi-Newton on :math:`\log\tilde p(\eta\mid y)` from EP's exact gradients, the curvature
started from the frozen-site density's (central differences of its gradient, no EP runs) and
updated by the secants of the EP gradients (BFGS), which learn the true curvature where the
sites' response makes the frozen one too stiff (nearly separable data, whose density in the
penalty's log variance is almost flat). It stops when the predicted gain
:math:`\tfrac12 g^T H^{-1} g` is below ``gain_tol`` or the next step is below ``sd_tol`` posterior
sds; far from the mode the EP runs use a looser tolerance.

**One variance: an adaptive grid.** From the mode outward on both sides (:func:`walk_1d`), with
the step of the regular grid (``dz`` sds of the mode's curvature), growing by :data:`STEP_GROWTH`
per point where the density is high and flat (nearly separable data: the penalty's log variance
spread over 10 units, the mode search stopped after a few steps and the grid climbing the rest),
and shortened where a coefficient's EP mean would move by more than :data:`THETA_STEP` EP sds;
each side stops where the log density has fallen ``drop`` below the best seen, or where EP fails
or ends unconverged while the density still rises (at variances near e^18 it does not settle on
such data). The weights are the density times the
cell widths, the trapezoid rule in the coordinate in which the points are regular (exact to 4e-4
posterior sds on the exact posterior of a variance given one site).

**The EP runs** start from the sites of the nearest run, scaled along the grid by the rates at
which the two nearest runs' precisions and shifts scale with eta (nearly separable data at large
variances are scale invariant: the sites' precisions go as e^{-eta}); they stop when their
moments settle (``expectation_propagation(moment_tol=...)``), ten and a hundred times more loosely
where the log density is predicted 3 and 5 below the best (:func:`point_tolerance`); with tiny
leverages (many rows) undamped.
"""

from __future__ import annotations

import numpy as np

from vbsvm.inference.ep_sites import EPResult, Sites, SiteStatistics

__all__ = ["FrozenSites", "PointEvaluator", "point_tolerance", "find_mode", "walk_1d", "cell_edges",
           "THETA_STEP", "GAIN_TOL", "FROZEN_THETA_ERROR", "FROZEN_LP_ERROR"]

#: Largest move of a coefficient's EP mean between neighbouring points of the 1-D grid, in EP sds.
THETA_STEP = 4.0

#: Mode search: stop when the predicted gain in log density is below this.
GAIN_TOL = 0.01

#: Mode search: the start and a step predicted to gain more than 1 are evaluated at the tolerance
#: of a point this far below the best (:func:`point_tolerance`: 10x looser).
FAR_DROP = 3.0

#: Adaptive grid: growth of the step from one point to the next where the density is flat.
STEP_GROWTH = 1.5

#: Adaptive grid: a step over which the log density fell by less than this fraction of what the
#: mode's curvature predicts is followed by a longer one (the density is about twice as wide there).
FLAT_CURVATURE = 0.25

#: Adaptive grid: steps grow only at points within this of the best log density (in the tails
#: the regular grid keeps the rule's accuracy).
FLAT_REGION = 3.0

#: Adaptive grid: the first step from the mode at most this (in eta), whatever the curvature.
FIRST_STEP_MAX = 1.0

#: Mode search: stop when the next step is shorter than this many posterior sds of eta.
SD_TOL = 0.2


class _Gaussian:
    """The frozen-site Gaussian at one eta, shaped as an EP result for ``_Evidence.gradient``."""

    def __init__(self, post):
        self.post = post
        self.mean = post.mean
        self.diag_cov = post.diag_cov()


class FrozenSites:
    """The density of eta with the sites of the EP fixed point ``res`` at ``eta0`` held fixed.

    Parameters
    ----------
    ev : vbsvm.inference.ep._Evidence
        The evidence (model, priors of eta, gradient).
    eta0 : ndarray (K,)
    res : EPResult
        With ``stats`` and ``site_constant`` (not on the Woodbury path).
    """

    def __init__(self, ev, eta0, res):
        self.ev, self.eta0, self.res = ev, np.asarray(eta0, dtype=float), res
        self.available = (res is not None and res.stats is not None and not ev.covariances
                          and np.isfinite(res.site_constant) and ev.prior(self.eta0) is None)
        if self.available:
            self.tau0 = self._tau(self.eta0)

    def _tau(self, eta):
        return self.ev.model.prior_precision(np.exp(-eta[: len(self.ev.sizes)]))

    def density(self, eta):
        """``(log p~, gradient, gaussian)`` at ``eta`` with the sites frozen."""
        eta = np.asarray(eta, dtype=float)
        ev, res = self.ev, self.res
        model = ev.model
        tau = self._tau(eta)
        post = model.site_gaussian(tau, res.stats)
        log_tau = float(np.sum(np.log(tau, where=tau > 0, out=np.zeros_like(tau))))
        lp = 0.5 * log_tau + 0.5 * post.logdet_cov() + 0.5 * post.fit_term + res.site_constant
        lp += ev.log_prior(eta)
        g = _Gaussian(post)
        return float(lp), ev.gradient(eta, g), g


def point_tolerance(tol, drop_predicted):
    """EP tolerance at a point whose log density is predicted ``drop_predicted`` below the best:
    ``tol`` within 1, then 10x looser per further 2, at most 100x from 5 on (a point's moments
    then err by about 3 tol e^drop / 10^((drop - 1) / 2) times its weight's share of the best:
    at most 3 tol, at drop 1)."""
    if not np.isfinite(drop_predicted):
        return tol
    return tol * 10.0 ** float(np.clip((drop_predicted - 1.0) / 2.0, 0.0, 2.0))


def find_mode(evaluate, K, eta0, *, gain_tol=GAIN_TOL, sd_tol=SD_TOL, max_iter=40, max_step=3.0):
    """Mode of ``log p~(eta | y)`` by quasi-Newton (see the module docstring).

    Parameters
    ----------
    evaluate : PointEvaluator
    K : int
    eta0 : ndarray (K,)
        Start.
    gain_tol : float
        Stop when the predicted gain ``g' H^{-1} g / 2`` of the next step is below this.
    sd_tol : float
        Or when the next step is shorter than this many posterior sds of eta (``H``'s): where
        the density is very wide (nearly separable data: sds of 5-10 in the penalty's log
        variance) the grid around the mode finds the top anyway.
    max_step : float
        Largest step in any coordinate of eta.

    Returns
    -------
    eta, lp, grad, res, H, iterations
        The mode, its values, and minus the Hessian estimate there.
    """
    eta = np.asarray(eta0, dtype=float)
    # the start is rarely the mode: its EP run at the looser tolerance of a far point
    lp, grad, res = evaluate(eta, FAR_DROP)
    if res is None:
        raise FloatingPointError("EP failed at the starting variances; the model may be degenerate.")
    start = res
    H = _frozen_hessian(FrozenSites(evaluate.ev, eta, res), eta, K)
    it = 0
    for it in range(1, max_iter + 1):
        step = _newton_step(H, grad, max_step)
        gain = float(step @ grad) - 0.5 * float(step @ H @ step)
        if gain < gain_tol or float(step @ H @ step) < sd_tol ** 2:
            break
        # far from the mode (a predicted gain above 1) a looser EP tolerance: the direction is
        # clear and the log density, stationary in the sites, is accurate anyway
        loose = FAR_DROP if gain > 1.0 else np.nan
        for _ in range(12):
            new = evaluate(eta + step, loose)
            # an unconverged run (EP at the edge of what it can do, e.g. nearly separable data
            # at variances near e^18) is no place for the mode: shorter steps
            if new[2] is not None and new[2].converged and new[0] >= lp - 1e-10:
                break
            step = step / 2.0
        else:
            break  # no ascent along the step: keep eta
        # a full step at the cap that went uphill: let the next one be twice as long
        max_step = 2.0 * max_step if np.max(np.abs(step)) >= max_step * (1 - 1e-9) else max_step
        yv = grad - new[1]  # minus the change of the gradient
        eta = eta + step
        lp, grad, res = new
        sy = float(step @ yv)
        Hs = H @ step
        if sy > 1e-12:  # BFGS update of minus the Hessian with the EP secant
            H = H - np.outer(Hs, Hs) / float(step @ Hs) + np.outer(yv, yv) / sy
        else:  # flat or convex along the step: its curvature there down to a small floor
            ss = float(step @ step)
            curv = float(step @ Hs) / ss
            H = H + (1e-3 - 1.0) * curv * np.outer(step, step) / ss
    if res is start:  # the mode is the start after all: its run to the full tolerance
        lp, grad, res = evaluate.refine(eta)
    return eta, lp, grad, res, H, it


def _newton_step(H, grad, max_step):
    try:
        np.linalg.cholesky(H)
        step = np.linalg.solve(H, grad)
    except np.linalg.LinAlgError:
        step = grad / max(1.0, float(np.max(np.abs(grad))))
    top = float(np.max(np.abs(step))) if step.size else 0.0
    return step * min(1.0, max_step / top) if top > 0 else step


def _frozen_hessian(frozen, eta, K, h=0.05):
    """Minus the Hessian of the frozen-site density at ``eta`` by central differences of its
    gradient (2K evaluations without reading the data), or the identity when not available."""
    if not frozen.available:
        return np.eye(K)
    H = np.empty((K, K))
    for k in range(K):
        e = np.zeros(K)
        e[k] = h
        H[:, k] = (frozen.density(eta + e)[1] - frozen.density(eta - e)[1]) / (2 * h)
    H = -(H + H.T) / 2.0
    w, V = np.linalg.eigh(H)
    return (V * np.maximum(w, 1e-3 * max(float(np.max(np.abs(w))), 1e-6))) @ V.T


def walk_1d(evaluate, mode, lp0, grad0, res0, curvature, *, dz=1.0, drop=7.0, max_points=400,
            theta_step=None):
    """The adaptive grid of one log variance (see the module docstring).

    Parameters
    ----------
    evaluate : PointEvaluator
        Called as ``evaluate(eta, predicted_drop, warm)``.
    mode : float
    lp0, grad0, res0
        Values at the mode.
    curvature : float
        Minus the second derivative of the log density at the mode (its estimate).

    Returns
    -------
    list of (eta, lp, grad, res), sorted by eta; bool: whether ``max_points`` cut a tail; int: the
    sides that EP's failure ended before the log density fell by ``drop``.
    """
    theta_step = THETA_STEP if theta_step is None else theta_step
    points = {0: (float(mode), lp0, float(np.ravel(grad0)[0]), res0)}
    best = lp0
    c0 = max(float(curvature), 0.0)
    s0 = min(dz / np.sqrt(max(c0, 1e-6)), FIRST_STEP_MAX)
    truncated, cut = False, 0
    for sign in (1.0, -1.0):
        prev, curvature, s = points[0], c0, s0
        j, retries = 0, 0
        while len(points) < max_points:
            eta = prev[0] + sign * s
            predicted = prev[1] + prev[2] * sign * s - 0.5 * curvature * s * s
            out = evaluate(np.array([eta]), best - predicted)
            if out[2] is None or not np.isfinite(out[0]):  # EP failed: a shorter step, twice
                if retries < 2:
                    retries += 1
                    s *= 0.5
                    continue
                cut += prev[1] > best - drop  # the side ends inside the mass: EP's edge cuts it
                break
            j += 1
            point = (eta, out[0], float(out[1][0]), out[2])
            points[sign * j] = point
            rising = out[0] > best
            best = max(best, out[0])
            if out[0] < best - drop:
                break
            if rising and not out[2].converged:
                # EP's edge while the density still rises (separable data at variances near e^18:
                # each further run costs the most sweeps and ends unconverged or failed)
                cut += 1
                break
            # the next step: as long, or STEP_GROWTH longer where the density is high (within
            # FLAT_REGION of the best) and flat (it fell over this step by less than FLAT_CURVATURE
            # times what the mode's curvature predicts: values, not the gradients, which a loose
            # EP tolerance makes noisy); shorter where a coefficient's EP mean moved by more than
            # theta_step EP sds
            c = -(point[2] - prev[2]) / (point[0] - prev[0])
            d0, d1 = abs(prev[0] - points[0][0]), abs(point[0] - points[0][0])
            fell = prev[1] - point[1]
            flat = fell < FLAT_CURVATURE * 0.5 * c0 * (d1 * d1 - d0 * d0) and point[1] > best - FLAT_REGION
            s_next = STEP_GROWTH * s if flat else s
            move = _theta_move(prev[3], point[3])
            if move > 0:
                s_next = min(s_next, s * theta_step / move)
            curvature = max(c, 0.0)
            prev = point
            s = max(s_next, 0.25 * s0)
        else:
            truncated = True
    ordered = [points[k] for k in sorted(points, key=lambda k: points[k][0])]
    return ordered, truncated, cut


def _theta_move(a, b) -> float:
    """Largest move of a coefficient's mean between two EP Gaussians, in the first one's sds."""
    if a is None or b is None:
        return 0.0
    sd = np.sqrt(np.maximum(a.diag_cov, 1e-300))
    return float(np.max(np.abs(b.mean - a.mean) / sd))


def cell_edges(eta):
    """Edges of the cells of sorted points ``eta`` (G,): the midpoints between neighbours, and at
    the ends the point plus or minus half the distance to its neighbour. Returns ``(lo, hi)``."""
    eta = np.asarray(eta, dtype=float)
    if eta.size == 1:
        return eta - 0.5, eta + 0.5
    mid = 0.5 * (eta[1:] + eta[:-1])
    lo = np.concatenate([[eta[0] - (mid[0] - eta[0])], mid])
    hi = np.concatenate([mid, [eta[-1] + (eta[-1] - mid[-1])]])
    return lo, hi


#: Damping of EP runs started from a neighbouring point's sites (None: the options').
WARM_DAMPING = None

#: Frozen-site points: largest predicted error of a coefficient's mean (in EP sds) and of the
#: log density for which a point is evaluated with the frozen sites of its nearest EP run.
FROZEN_THETA_ERROR = 0.02
FROZEN_LP_ERROR = 0.02

#: Frozen-site points in the tails: a point predicted ``drop`` below the best weighs about
#: ``e^-drop`` of the best, so its errors move the mixture by about that share of them; it is
#: frozen where both predicted errors are below this times ``e^drop`` (where that exceeds
#: :data:`FROZEN_THETA_ERROR` and :data:`FROZEN_LP_ERROR`: from ``drop = 5.3`` on, where the two
#: rules meet). Section 4.2 simulations, n = 100-500, d = 10: 3-16% fewer passes over the rows,
#: n = 500, d = 50: 7-8% (the points at the ends of the walk, 1-3 sweeps each, frozen); no
#: coefficient's mean moved by more than 1e-4 sd, nor the penalty's log variance. At 1e-3 the
#: saving was 3 passes more and the moves up to 7e-4 sd (on one site, the log variance's
#: mean 1.6e-3 sd off the exact posterior's, 4e-4 at 0 and 1e-4).
FROZEN_TAIL_SHARE = 1e-4


class PointEvaluator:
    """``log p~(eta | y)``, its gradient and the Gaussian at a point of the variance grid: by EP
    (warm-started, at the tolerance :func:`point_tolerance` gives), or with the frozen sites of
    the nearest EP run (the anchor) where that is predicted accurate.

    The prediction: every EP run is also compared with the frozen-site density of its nearest
    anchor at distance ``r`` (in eta), which gives the error of the frozen sites there: in the
    means (largest difference over coordinates, in EP sds, first order in ``r``) and in the log
    density (second order). Their largest ratios to ``r`` and ``r^2`` over all comparisons,
    ``kappa``, predict the error at distance ``r`` from an anchor; a point is frozen when both
    predictions are below :data:`FROZEN_THETA_ERROR` and :data:`FROZEN_LP_ERROR` (the error in
    the moments: the largest over coordinates of the mean's difference in sds and the sd's
    relative difference), or, for a point predicted ``drop`` below the best, below
    :data:`FROZEN_TAIL_SHARE` ``e^drop`` (its errors times its weight's share of the best's).
    Before the first comparison every point runs EP.

    Parameters
    ----------
    ev : vbsvm.inference.ep._Evidence
    tol : float
        EP tolerance at points near the best (see :func:`point_tolerance`).
    frozen : bool
        Allow frozen-site points.
    """

    def __init__(self, ev, tol, frozen=True, max_sweeps=None):
        self.ev, self.tol, self.frozen, self.max_sweeps = ev, float(tol), frozen, max_sweeps
        self.anchors = []
        self.kappa = None
        self.n_frozen = 0
        self.edges = []

    def _beyond_edge(self, eta) -> bool:
        """One variance: whether ``eta`` lies at or beyond a point where EP failed, seen from the
        nearest converged EP run (EP's edge: nearly separable data at variances near e^18, where
        each run costs its most sweeps and gives no usable fit)."""
        if eta.size != 1 or not self.edges:
            return False
        good = [a[0][0] for a in self.anchors if a[1].converged]
        if not good:
            return False
        base = min(good, key=lambda e: abs(e - eta[0]))
        lo, hi = min(base, eta[0]), max(base, eta[0])
        return any(lo < e <= hi or hi <= e < lo or (e == eta[0]) for e in self.edges if e != base)

    def _nearest(self, eta):
        if not self.anchors:
            return None, np.inf
        d = [float(np.linalg.norm(eta - a[0])) for a in self.anchors]
        k = int(np.argmin(d))
        return self.anchors[k], d[k]

    def refine(self, eta):
        """The point ``eta`` evaluated again by EP at the full tolerance, from its own sites."""
        key = self.ev.key(eta)
        old = self.ev.cache.pop(key, None)
        sites = old[2].sites if old is not None and old[2] is not None else None
        self.anchors = [a for a in self.anchors if self.ev.key(a[0]) != key]
        return self(eta, warm=sites)

    def warm_start(self, eta):
        """The sites of the nearest EP run that has kept them, for a run at ``eta``; with one
        variance and a second such run, scaled by the rates at which the two runs' precisions and shifts
        scale with eta (least squares, ``prec_b ~ e^{a d} prec_a``): nearly separable data at
        large variances are scale invariant (the sites' precisions go as ``e^{-eta}``, their
        shifts as ``e^{-eta/2}``), and from the scaled sites the moments were within 1e-3 sds of
        the fixed point after one sweep where the unscaled ones needed 6-10. Scaling both parts
        scales their statistics (no pass over the rows)."""
        kept = [a for a in self.anchors if a[1].sites is not None]
        if not kept:
            return None
        anchor = min(kept, key=lambda a: float(np.linalg.norm(eta - a[0])))
        sites = anchor[1].sites
        if eta.size != 1:
            return sites
        others = [a for a in kept if a[0][0] != anchor[0][0]]
        if not others:
            return sites
        other = min(others, key=lambda a: abs(a[0][0] - anchor[0][0]))
        d = float(anchor[0][0] - other[0][0])
        r = float(eta[0] - anchor[0][0])
        factors = []
        for name in ("prec", "shift"):
            a, b = getattr(other[1].sites, name), getattr(sites, name)
            ratio = float(a @ b) / max(float(a @ a), 1e-300)
            if not ratio > 0:
                return sites
            factors.append(float(np.exp(np.clip(np.log(ratio) / d * r, -5.0, 5.0))))
        st = sites.stats
        scaled = None if st is None else SiteStatistics(factors[0] * st.A, factors[1] * st.bd,
                                                        None if st.D is None else factors[0] * st.D,
                                                        None if st.G is None else factors[0] * st.G, factors[1] * st.br)
        return Sites(factors[0] * sites.prec, factors[1] * sites.shift, scaled)

    def frozen_sites(self, anchor) -> FrozenSites:
        return FrozenSites(self.ev, anchor[0], anchor[1])

    def __call__(self, eta, predicted_drop=np.nan, warm=None):
        eta = np.asarray(eta, dtype=float)
        anchor, r = self._nearest(eta)
        fz = self.frozen_sites(anchor) if anchor is not None else None
        tail = FROZEN_TAIL_SHARE * np.exp(min(predicted_drop, 700.0)) if np.isfinite(predicted_drop) else 0.0
        if (self.frozen and fz is not None and fz.available and self.kappa is not None
                and self.kappa[0] * r <= max(FROZEN_THETA_ERROR, tail)
                and self.kappa[1] * r * r <= max(FROZEN_LP_ERROR, tail)):
            key = self.ev.key(eta)
            if key in self.ev.cache:
                return self.ev.cache[key]
            lp, grad, g = fz.density(eta)
            a = anchor[1]
            res = EPResult(g.post, a.site_prec, a.site_shift, lp - self.ev.log_prior(eta), True, 0, stats=a.stats,
                           site_constant=a.site_constant)
            res.frozen = True
            res.max_leverage = a.max_leverage
            res.grad_correction = np.zeros_like(grad)
            self.n_frozen += 1
            out = (lp, grad, res)
            self.ev.cache[key] = out
            return out
        if self._beyond_edge(eta):
            return -np.inf, np.full(eta.size, np.nan), None
        if warm is None:
            warm = self.warm_start(eta)
        out = self.ev.run(eta, sites=warm, tol=point_tolerance(self.tol, predicted_drop),
                          max_sweeps=self.max_sweeps if anchor is not None else None,
                          damping=WARM_DAMPING if warm is not None else None)
        res = out[2]
        if eta.size == 1 and res is None:
            self.edges.append(float(eta[0]))
        if res is None or getattr(res, "frozen", False):
            return out
        if fz is not None and fz.available and r > 0 and np.isfinite(out[0]):
            lp_f, _, g = fz.density(eta)
            sd = np.sqrt(np.maximum(res.diag_cov, 1e-300))
            e_theta = float(max(np.max(np.abs(g.mean - res.mean) / sd),
                                np.max(np.abs(np.sqrt(np.maximum(g.diag_cov, 0.0)) / sd - 1.0))))
            e_lp = abs(lp_f - out[0])
            new = (e_theta / r, e_lp / (r * r))
            self.kappa = new if self.kappa is None else (max(self.kappa[0], new[0]), max(self.kappa[1], new[1]))
        if res.stats is not None:
            self.anchors.append((eta, res))
        return out
