r"""Hamiltonian Monte Carlo with a dense metric fitted during tuning, for one block of a Gibbs scan.

Used by the linear sampler for the fixed effects jointly with the log of the penalty's variance,
on the marginal pseudo-posterior (augmentation weights integrated out), where single-site moves
cost one Python-level pass per coordinate and leave the block's correlations to the chain.

**Transition** (Neal 2011, Section 5.2). In whitened coordinates :math:`x = x_0 + L z` (:math:`LL^T`
the metric's inverse, i.e. the block's covariance estimated in tuning; the caller supplies the
target in z, :func:`whiten`) the momentum is
:math:`p \sim N(0, I)` and the leapfrog integrator takes ``n_steps`` steps of size
:math:`\epsilon` on :math:`H(z, p) = -\log\pi(x_0 + Lz) + \tfrac12 p^Tp`; the end point is
accepted with probability :math:`\min\{1, e^{-\Delta H}\}`. The integrator is reversible and
volume preserving, so each transition leaves :math:`\pi` invariant for any fixed
:math:`(L, \epsilon, n)`; the step is jittered by a factor in :data:`STEP_JITTER` drawn
independently of the state (which keeps this). The hinge makes :math:`\log\pi` piecewise
quadratic: its gradient jumps where a row crosses the margin, which costs acceptance (an energy
error of order :math:`\epsilon` at each crossing) but not exactness.

**Surrogate trajectories.** The gradient that drives the leapfrog steps need not be the target's:
each step is a shear (momentum moved by a function of position, position by a function of
momentum), volume preserving and, with the momentum flipped, reversible for any position-dependent
force. The end point is accepted with the target's own log density, so the transition keeps the
target whatever the force; a force closer to the target's only raises the acceptance. The linear
sampler uses the gradient of a smoothed hinge (:mod:`vbsvm.models.hinge`), which lets it take
about twice the step at the same acceptance.

**Tuning** (:class:`vbsvm.mcmc.block_tuner.BlockTuner`). The metric is the block's
covariance collected during tuning; the step is adapted by dual averaging towards acceptance
:data:`TARGET_ACCEPT` (Hoffman & Gelman 2014, Section 3.2.1, :func:`dual_average`) and fixed at
its average when tuning ends. The trajectory length :math:`n\epsilon` is :data:`TRAJECTORY` in
whitened units, :data:`TRAJECTORY_WITH_VARIANCE` for a block with a log variance
(:func:`trajectory_steps`).
"""

from __future__ import annotations

import math

from scipy.linalg.blas import daxpy

__all__ = ["hmc_transition", "whiten", "trajectory_steps", "kinetic_energy", "dual_average", "TARGET_ACCEPT",
           "TRAJECTORY", "TRAJECTORY_WITH_VARIANCE", "STEP_JITTER"]

#: acceptance probability the step is adapted to (Hoffman & Gelman's choice for plain HMC)
TARGET_ACCEPT = 0.65
#: length of a trajectory in whitened units: n_steps = ceil(TRAJECTORY / step), at most MAX_STEPS.
#: Between a quarter period (pi/2, which maps x to p for a standard normal: an independent draw)
#: and a half (pi, x to -x): the jitter of the step keeps it away from the periodic pi. Chosen by
#: bulk ESS per second (``benchmarks/results/tuning_constants.md``).
TRAJECTORY = 2.5
#: the trajectory length when the block carries the log of a variance (the penalty's sigma2_u),
#: whose coupling with the coefficients' scale the linear metric does not follow: shorter
#: trajectories mix that coupling better (bulk ESS per second in
#: ``benchmarks/results/tuning_constants.md``; a choice made on a few data sets).
TRAJECTORY_WITH_VARIANCE = 2.25
MAX_STEPS = 40
#: the step of each transition is multiplied by a uniform draw from this range
STEP_JITTER = (0.8, 1.2)


def hmc_transition(logp_grad, z, current, step, n_steps, rng, gradient=None):
    """One HMC transition with a unit metric, in whitened coordinates.

    A dense metric ``(L L^T)^{-1}`` is the unit metric in the coordinates ``z`` of
    ``x = x_0 + L z``: the caller passes the target in those coordinates (:func:`whiten` makes it
    from one in x; the linear model forms its own, with the products fused), so that the
    integrator itself does no matrix products.

    Parameters
    ----------
    logp_grad : callable
        ``z -> (log density, gradient in z, aux)``; ``aux`` is anything the caller wants back for
        the state the chain ends at (the linear model's scores). The log density must be the
        target's; the gradient may be a surrogate's (module docstring).
    z : ndarray (d,)
        Current state (not modified).
    current : tuple
        ``logp_grad(z)`` (passed in so that the caller can carry it between transitions).
    step : float
        Leapfrog step.
    n_steps : int
    rng : numpy.random.Generator
    gradient : callable, optional
        ``z -> gradient in z`` (None outside the support), for the steps inside the trajectory,
        where the log density is not needed; by default ``logp_grad(z)[1]``. The linear model
        passes one that skips the log density's own passes over the design.

    Returns
    -------
    z, (log density, gradient, aux) : the state after the transition and its evaluation
    accept_prob : float
        ``min(1, exp(-Delta H))`` of the proposed end point (0 if it left the support).
    """
    lp0, g, _ = current
    p = rng.standard_normal(z.size)
    h0 = -lp0 + kinetic_energy(p)
    z_new = z.copy()
    # the updates y += a x in place by BLAS axpy: a quarter of numpy's two-ufunc time at the small
    # sizes of a block move, which adds up over the trajectory's steps
    p = daxpy(g, p, a=0.5 * step)
    for _ in range(n_steps - 1):
        z_new = daxpy(p, z_new, a=step)
        g = logp_grad(z_new)[1] if gradient is None else gradient(z_new)
        if g is None:  # outside the support
            return z, current, 0.0
        p = daxpy(g, p, a=step)
    z_new = daxpy(p, z_new, a=step)
    new = logp_grad(z_new)
    if not math.isfinite(new[0]):
        return z, current, 0.0
    p = daxpy(new[1], p, a=0.5 * step)
    h1 = -new[0] + kinetic_energy(p)
    accept_prob = math.exp(min(0.0, h0 - h1)) if math.isfinite(h1) else 0.0
    if rng.random() < accept_prob:
        return z_new, new, accept_prob
    return z, current, accept_prob


def whiten(logp_grad, x0, chol):
    """The target ``x -> (log density, gradient, aux)`` in the coordinates ``z`` of
    ``x = x0 + chol z``: ``z -> (log density, chol^T gradient, aux)``."""
    def whitened(z):
        value, grad, aux = logp_grad(x0 + chol @ z)
        return value, (None if grad is None else chol.T @ grad), aux
    return whitened


def kinetic_energy(p) -> float:
    """``p^T p / 2``: the kinetic energy of a whitened momentum (unit metric)."""
    return 0.5 * float(p @ p)


def trajectory_steps(step, length=None) -> int:
    """Leapfrog steps of a trajectory of ``length`` (default :data:`TRAJECTORY`) at this step size."""
    return int(min(MAX_STEPS, max(1, math.ceil((TRAJECTORY if length is None else length) / step))))


#: dual averaging constants (Hoffman & Gelman 2014, Section 3.2.1)
DA_GAMMA, DA_T0, DA_KAPPA = 0.05, 10.0, 0.75


def dual_average(t, h_bar, mu, log_step_bar, accept_prob):
    """One dual-averaging update of the log step after transition ``t`` (1, 2, ...) of an
    adaptation window with shrinkage point ``mu``: returns ``(h_bar, log_step, log_step_bar)``,
    the running acceptance deficit, the next log step and its weighted average (the step kept
    when the window ends)."""
    eta = 1.0 / (t + DA_T0)
    h_bar = (1.0 - eta) * h_bar + eta * (TARGET_ACCEPT - accept_prob)
    log_step = mu - math.sqrt(t) / DA_GAMMA * h_bar
    weight = t ** -DA_KAPPA
    return h_bar, log_step, weight * log_step + (1.0 - weight) * log_step_bar
