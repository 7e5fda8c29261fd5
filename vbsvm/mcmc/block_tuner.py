r"""Tuning of the fixed-effect block move of the linear Gibbs sampler: an independence proposal or
HMC, fitted to the block's moments during tuning, or neither.

Two moves use the block's covariance estimated from its tuning draws. The block independence
Metropolis-Hastings move (:mod:`vbsvm.mcmc.independence`) evaluates its proposals in one
matrix product, so where the block's posterior is close to Gaussian it gives a near-independent
draw per sweep for one pass over the design. Where it is not (its acceptance rate falls below
``min_accept`` as the block grows or the hinge bends the posterior: breast_cancer's 31
coefficients, the Section 4.2 simulation with 50) Hamiltonian Monte Carlo with the covariance as
metric (:mod:`vbsvm.mcmc.hmc`) still moves the block as a whole, at one pass per leapfrog
step; and where neither is accepted the block keeps its slice moves along principal axes.

**Schedule** (``tune`` sweeps; all of it during tuning, so the kept draws come from one fixed
kernel). Moments are collected over ``[tune/16, 3 tune/4)``; a fit from fewer than twice as many
draws as coordinates shrinks their covariance toward its diagonal (:meth:`BlockTuner.moments`), of
full rank even from fewer draws than coordinates. At ``tune/4`` (``tune/8`` for a block of more
than :data:`EARLY_FIT_DIM` coordinates, :meth:`BlockTuner.first_fit`) a first fit is tried while
the collection goes on: the independence move every sweep (until :data:`GIVE_UP` proposals if it
accepts fewer than half of ``min_accept``) and, once it has had :data:`EVIDENCE` proposals and its
acceptance rate is below ``min_accept``, HMC with the step adapted by dual averaging. While
either's acceptance so far reaches ``min_accept`` it replaces the slice moves (a poor move never
leaves the block without them). At ``3 tune/4`` both are refitted from all the moments and tried
again over the last quarter (the dual averaging restarted from the initial step
:math:`d^{-1/4}`, not from the step adapted to the first fit's poorer metric; see
:meth:`BlockTuner.adapt`). At the last tuning sweep the
independence move is kept if its acceptance rate over that trial reached ``min_accept``; otherwise
HMC, with the averaged step, if its mean acceptance probability did; otherwise neither.

**Trajectory surrogate.** A caller whose HMC trajectories may follow one of several surrogate
log densities (the linear sampler's smoothed hinges, :data:`vbsvm.models.hinge.SMOOTHING_WIDTHS`,
ordered from closest to the target to smoothest) passes, with each collected sweep, each
surrogate's mismatch ``log target - log surrogate`` at the sweep's state. At each fit the tuner
picks the smoothest whose mismatch has sd at most :data:`SURROGATE_SD` over the draws collected
(:meth:`BlockTuner.surrogate`; -1 for none, the exact gradient): the mismatch enters the
acceptance of every transition, so one whose sd across the posterior is small costs little of
it, while a smoother trajectory takes a larger step.

The state lives in the sampler's state dict (numeric arrays only, so checkpoints carry it), under
keys prefixed ``blk_`` (phase and moments), ``imh_`` and ``hmc_`` (each move's trial).
"""

from __future__ import annotations

import math

import numpy as np

from vbsvm.mcmc.hmc import STEP_JITTER, dual_average
from vbsvm.mcmc.independence import StudentTProposal

__all__ = ["BlockTuner", "shrunk_moments"]

#: proposals of the independence move after which its acceptance rate decides whether HMC runs
EVIDENCE = 40
#: proposals after which an independence move accepting fewer than ``min_accept / 2`` of them
#: stops for the rest of its trial (it cannot be kept, and it costs a pass over the design per
#: sweep: about 5% of the defaults' wall time on the Section 4.2 simulation with d = 50)
GIVE_UP = 200
#: blocks with more coordinates than this are first fitted at ``tune/8`` instead of ``tune/4``
EARLY_FIT_DIM = 20
#: largest sd, over the collected draws, of the mismatch of a trajectory surrogate it may use
#: (0.16 for the width picked on the Section 4.2 simulation with d = 50; its mismatch at the next
#: wider width, 0.46, already cost ESS per second; module docstring)
SURROGATE_SD = 0.2


def shrunk_moments(n, total, outer) -> tuple:
    r"""Mean and covariance of :math:`n` draws of a :math:`d`-vector from their sum and the sum
    of their outer products: the sample covariance :math:`S` shrunk toward its diagonal
    :math:`D`, :math:`(n S + \nu D) / (n + \nu)` with :math:`\nu = d \max(0, 2 - n/d)` (see
    :meth:`BlockTuner.moments` for why and the measurements)."""
    mean = total / n
    cov = (outer - n * np.outer(mean, mean)) / max(n - 1.0, 1.0)
    d = mean.size
    nu = d * max(0.0, 2.0 - n / d)
    if nu > 0.0:
        cov = (n * cov + nu * np.diag(np.diag(cov))) / (n + nu)
    return mean, cov


class BlockTuner:
    """Fits, tries and then keeps the independence move, HMC or neither for one block.

    Parameters
    ----------
    dim : int
        Size of the block.
    df : float
        Degrees of freedom of the independence move's t proposal.
    min_accept : float
        Acceptance rate (independence move) or mean acceptance probability (HMC) over the last
        trial needed to keep a move.
    min_tune : int
        Shortest tuning phase over which the block is fitted.
    surrogates : int
        Number of trajectory surrogates the caller offers HMC (module docstring).
    """

    COLLECTING, TRYING, KEPT_IMH, KEPT_HMC, DROPPED = 0, 1, 2, 3, 4

    def __init__(self, dim, *, df=10.0, min_accept=0.2, min_tune=100, surrogates=0):
        self.dim, self.df, self.min_accept, self.min_tune = dim, float(df), float(min_accept), int(min_tune)
        self.surrogates = int(surrogates)

    def initial_log_step(self) -> float:
        """Log of HMC's first step, :math:`d^{-1/4}` (the optimal step shrinks as that power of the
        dimension once the metric whitens the block)."""
        return -0.25 * math.log(max(self.dim, 1))

    def initial_state(self) -> dict:
        d, k = self.dim, self.surrogates
        log_step = self.initial_log_step()
        return {"blk_phase": np.array(self.COLLECTING), "blk_count": np.array(0.0), "blk_sum": np.zeros(d),
                "blk_outer": np.zeros((d, d)), "blk_mismatch_sum": np.zeros(k), "blk_mismatch_sq": np.zeros(k),
                "hmc_surrogate": np.array(-1), "hmc_log_step": np.array(log_step), **self._new_trial(log_step)}

    @staticmethod
    def _new_trial(log_step) -> dict:
        return {"imh_tries": np.array(0.0), "imh_accepts": np.array(0.0), "hmc_tries": np.array(0.0),
                "hmc_accepts": np.array(0.0), "hmc_mu": np.array(log_step + math.log(10.0)),
                "hmc_h_bar": np.array(0.0), "hmc_log_step_bar": np.array(log_step)}

    @staticmethod
    def carry(state) -> dict:
        """The tuner's entries of ``state`` (to copy into the next sweep's state)."""
        return {k: v for k, v in state.items() if k[:4] in ("blk_", "imh_", "hmc_")}

    @staticmethod
    def phase(state) -> int:
        return int(state["blk_phase"]) if "blk_phase" in state else BlockTuner.DROPPED

    def _rate(self, state, move) -> float | None:
        tries = float(state[f"{move}_tries"])
        return float(state[f"{move}_accepts"]) / tries if tries > 0 else None

    def _goes_well(self, state, move) -> bool:
        rate = self._rate(state, move)
        return rate is not None and rate >= self.min_accept

    def imh_proposal(self, state) -> StudentTProposal | None:
        """The independence move's proposal, if the sweep makes it: once kept, and during a
        trial unless it has had :data:`GIVE_UP` proposals and accepted fewer than half of
        ``min_accept`` of them."""
        phase = self.phase(state)
        if phase not in (self.TRYING, self.KEPT_IMH):
            return None
        gave_up = float(state["imh_tries"]) >= GIVE_UP and self._rate(state, "imh") < 0.5 * self.min_accept
        if phase == self.TRYING and gave_up:
            return None
        return StudentTProposal(state["blk_mean"], state["blk_chol"], self.df)

    def runs_hmc(self, state) -> bool:
        """Whether the sweep makes the HMC transition: once kept, and during a trial when the
        independence move has had :data:`EVIDENCE` proposals and goes badly."""
        phase = self.phase(state)
        if phase == self.KEPT_HMC:
            return True
        return (phase == self.TRYING and float(state["imh_tries"]) >= EVIDENCE
                and not self._goes_well(state, "imh"))

    @staticmethod
    def surrogate(state) -> int:
        """Index of the trajectory surrogate HMC follows (-1: the target's own gradient)."""
        return int(state.get("hmc_surrogate", -1))

    @staticmethod
    def hmc_step(state, rng) -> float:
        """This transition's step size: the adapted one times a jitter drawn from
        :data:`~vbsvm.mcmc.hmc.STEP_JITTER`."""
        return math.exp(float(state["hmc_log_step"])) * rng.uniform(*STEP_JITTER)

    def replaces_slice_moves(self, state) -> bool:
        """Whether the sweep may leave the block to the fitted moves alone: once one is kept, and
        during a trial while one of them goes well."""
        phase = self.phase(state)
        if phase in (self.KEPT_IMH, self.KEPT_HMC):
            return True
        return phase == self.TRYING and (self._goes_well(state, "imh") or self._goes_well(state, "hmc"))

    def record_imh(self, state, tries, accepted) -> dict:
        """Count the independence move's proposals during a trial."""
        if self.phase(state) != self.TRYING:
            return state
        return {**state, "imh_tries": state["imh_tries"] + tries, "imh_accepts": state["imh_accepts"] + accepted}

    def record_hmc(self, state, accept_prob) -> dict:
        """Count an HMC transition during a trial and adapt its step (:func:`~vbsvm.mcmc.hmc.dual_average`)."""
        if self.phase(state) != self.TRYING:
            return state
        t = float(state["hmc_tries"]) + 1.0
        h_bar, log_step, log_step_bar = dual_average(t, float(state["hmc_h_bar"]), float(state["hmc_mu"]),
                                                     float(state["hmc_log_step_bar"]), accept_prob)
        return {**state, "hmc_tries": np.array(t), "hmc_accepts": state["hmc_accepts"] + accept_prob,
                "hmc_h_bar": np.array(h_bar), "hmc_log_step": np.array(log_step),
                "hmc_log_step_bar": np.array(log_step_bar)}

    def _smoothest_surrogate(self, state) -> int:
        """The last surrogate whose mismatch over the collected draws has sd at most
        :data:`SURROGATE_SD`, or -1."""
        n = float(state["blk_count"])
        if not self.surrogates or n < 2:
            return -1
        mean = state["blk_mismatch_sum"] / n
        var = np.maximum(state["blk_mismatch_sq"] / n - mean ** 2, 0.0) * n / (n - 1.0)
        ok = np.flatnonzero(np.sqrt(var) <= SURROGATE_SD)
        return int(ok[-1]) if ok.size else -1

    def first_fit(self, tune) -> int:
        """Sweep count at which the block is first fitted: ``tune/4``, or ``tune/8`` for a block of
        more than :data:`EARLY_FIT_DIM` coordinates. Until then the block moves by slice sampling
        along each coordinate, which costs a pass over the design per coordinate and dominates
        tuning for a large block: on the Section 4.2 simulation with d = 50 the earlier fit cut
        the defaults' wall time by about 10% at the same ESS. A small block gains little,
        and its independence move keeps more of a first proposal fitted from more draws (heart,
        three seeds: min bulk ESS 6334-6578 at ``tune/4``, 5336-6167 at ``tune/8``)."""
        return tune // (8 if self.dim > EARLY_FIT_DIM else 4)

    def moments(self, state) -> tuple:
        r"""Mean and covariance of the collected block values: the sample covariance :math:`S` of
        :math:`n` draws shrunk toward its diagonal :math:`D` as the posterior mean under an
        inverse-Wishart prior centred on :math:`D` with :math:`\nu = d \max(0, 2 - n/d)`
        pseudo-draws (:math:`d` the block's size): :math:`(n S + \nu D) / (n + \nu)`.

        From :math:`n \le d` draws :math:`S` is singular (and nearly so just above): HMC with it
        as metric never moves the block along the missing directions, nor do the draws that the
        refit collects, so the kept metric stays singular. The Section 4.2 simulation with d = 100
        and ``penalty=1`` (101 coordinates, first fit from the 63 draws since tune/16 at the
        defaults) had min bulk ESS 6 and R-hat 1.78 at 4 x 1000 after 1000 with :math:`S` alone,
        2160-2433 and 1.007 with the shrinkage; with d = 60 (63 draws for 61 coordinates) 1358
        against 2531; spam (59 coordinates, 63 draws; 4 x 2000 after 1000) 76 against 97 ESS per
        second. The weight fades to 0 at :math:`n = 2d`: shrinking toward the diagonal inflates
        the small variances of a collinear block, and with :math:`\nu = d` at every fit
        breast_cancer (32 coordinates, 63 draws, then about 690) lost 15% of its ESS per second
        (654-739 against 533-599, seeds 1-2)."""
        return shrunk_moments(float(state["blk_count"]), state["blk_sum"], state["blk_outer"])

    def collects(self, state, it, tune) -> bool:
        """Whether tuning sweep ``it`` is collected (so that a caller computes the surrogates'
        mismatch only then)."""
        return (tune >= self.min_tune and self.phase(state) in (self.COLLECTING, self.TRYING)
                and tune // 16 <= it < (3 * tune) // 4)

    def adapt(self, state, block, it, tune, mismatch=None) -> dict:
        """Update the tuner after tuning sweep ``it`` (of ``tune``) whose block value is ``block``
        (the schedule of the module docstring); ``mismatch``, the trajectory surrogates'
        mismatch at the sweep's state (one per surrogate), is needed on the sweeps it
        :meth:`collects`."""
        state = dict(state)
        phase = self.phase(state)
        if tune < self.min_tune:
            state["blk_phase"] = np.array(self.DROPPED)
            return state
        first_fit, refit = self.first_fit(tune), (3 * tune) // 4
        if self.collects(state, it, tune):
            state["blk_count"] = state["blk_count"] + 1.0
            state["blk_sum"] = state["blk_sum"] + block
            state["blk_outer"] = state["blk_outer"] + np.outer(block, block)
            if self.surrogates:
                state["blk_mismatch_sum"] = state["blk_mismatch_sum"] + mismatch
                state["blk_mismatch_sq"] = state["blk_mismatch_sq"] + np.square(mismatch)
        if phase in (self.COLLECTING, self.TRYING) and it in (first_fit - 1, refit - 1):
            mean, cov = self.moments(state)
            try:
                prop = StudentTProposal.from_moments(mean, cov, self.df)
            except np.linalg.LinAlgError:
                state["blk_phase"] = np.array(self.DROPPED)
                return state
            # each trial's dual averaging starts from the initial step: at the refit, the step the
            # first trial adapted to its poorer metric (fitted from fewer draws) is too short for
            # the new one, and dual averaging shrinks toward 10 times its start (Stan, too,
            # re-initializes the step, by a search, at each metric update). breast_cancer, seeds 1-7 (4 x 2000
            # after 1000): min bulk ESS per second +7% on average (-6% to +33%); toenail and the
            # Section 4.2 simulation with d = 50 within +-6%; blocks that keep the independence
            # move (heart, diabetis) unchanged.
            state.update(blk_phase=np.array(self.TRYING), blk_mean=prop.mean, blk_chol=prop.chol,
                         hmc_surrogate=np.array(self._smoothest_surrogate(state)),
                         **self._new_trial(self.initial_log_step()))
        if phase == self.TRYING and it == tune - 1:
            keep = (self.KEPT_IMH if self._goes_well(state, "imh") else
                    self.KEPT_HMC if self._goes_well(state, "hmc") else self.DROPPED)
            state["blk_phase"] = np.array(keep)
            state["hmc_log_step"] = state["hmc_log_step_bar"]
        return state
