r"""Block independence Metropolis-Hastings with a multivariate-t proposal fitted during tuning.

Used by the Gibbs samplers for a block of coordinates whose conditional posterior is close to
Gaussian (the fixed effects of a linear SVM with many rows per coefficient), where single-site
moves cost one Python-level pass per coordinate and leave the block's correlations to the chain.

**Move.** The proposal :math:`q(x) = t_\nu(x; \mu, LL^T)` does not depend on the current state, so
:math:`K` proposals :math:`x'_1, \dots, x'_K` are drawn and their log target densities evaluated in
one batch (one matrix product for a linear model); they are then visited in order, each accepted
with probability :math:`\min\{1, \exp(\ell'_k - \ell)\}`, :math:`\ell = \log\pi(x) - \log q(x)`. This
is :math:`K` Metropolis-Hastings steps of the independence sampler (Tierney 1994), each leaving
:math:`\pi` invariant. With heavier tails than the target (``df`` small) the sampler is uniformly
ergodic whenever :math:`\pi / q` is bounded.

**Fitting.** :class:`vbsvm.mcmc.block_tuner.BlockTuner` fits the proposal to the block's
moments during tuning and keeps it if its acceptance rate is high enough; otherwise the block
moves by Hamiltonian Monte Carlo (:mod:`vbsvm.mcmc.hmc`) or slice sampling.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg.lapack import dtrtrs
from scipy.special import gammaln

__all__ = ["StudentTProposal", "independence_steps"]


class StudentTProposal:
    """Multivariate t distribution with ``df`` degrees of freedom, location ``mean`` and scale
    ``chol @ chol.T`` (``chol`` lower triangular)."""

    def __init__(self, mean, chol, df):
        self.mean = np.asarray(mean, dtype=float)
        self.chol = np.asarray(chol, dtype=float)
        self.df = float(df)
        d = self.mean.size
        self._const = (gammaln(0.5 * (self.df + d)) - gammaln(0.5 * self.df) - 0.5 * d * math.log(self.df * math.pi)
                       - float(np.sum(np.log(np.diag(self.chol)))))

    @classmethod
    def from_moments(cls, mean, cov, df, inflate=1.0):
        """The t proposal whose scale matrix is ``inflate * cov`` (its covariance is then
        ``df / (df - 2)`` times that), with a jitter on the diagonal if ``cov`` is singular."""
        cov = inflate * np.asarray(cov, dtype=float)
        jitter = 1e-10 * max(float(np.max(np.diag(cov))), 1e-300)
        for _ in range(8):
            try:
                return cls(mean, np.linalg.cholesky(cov + jitter * np.eye(cov.shape[0])), df)
            except np.linalg.LinAlgError:
                jitter *= 100.0
        raise np.linalg.LinAlgError("the tuning draws of the block have no usable covariance")

    def log_density(self, x) -> np.ndarray:
        """Log density at the columns of ``x`` (d, k) or at one point ``x`` (d,)."""
        # LAPACK's triangular solve directly: scipy's solve_triangular wrapper (argument checks,
        # finiteness scans) cost about 40x the solve itself at this size, once per sweep
        z, info = dtrtrs(self.chol, (np.asarray(x, dtype=float).T - self.mean).T, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"triangular solve failed (LAPACK info {info})")
        maha = np.sum(z * z, axis=0)
        return self._const - 0.5 * (self.df + self.mean.size) * np.log1p(maha / self.df)

    def sample(self, size, rng) -> np.ndarray:
        """``size`` draws as the columns of a (d, size) array."""
        z = rng.standard_normal((self.mean.size, size))
        scale = np.sqrt(self.df / rng.chisquare(self.df, size))
        return self.mean[:, None] + (self.chol @ z) * scale


def independence_steps(log_target_current, log_target_proposed, log_q_current, log_q_proposed, rng):
    """Visit ``K`` independent proposals in order, each accepted by the Metropolis-Hastings rule.

    Parameters
    ----------
    log_target_current, log_q_current : float
        Log target (up to a constant) and log proposal density at the current state.
    log_target_proposed, log_q_proposed : ndarray (K,)
        The same at the proposals.
    rng : numpy.random.Generator

    Returns
    -------
    index : int
        Which proposal the chain ends at, or -1 if it stays at the current state.
    accepted : int
        How many of the K steps were accepted.
    """
    weight = log_target_current - log_q_current
    proposed = np.asarray(log_target_proposed) - np.asarray(log_q_proposed)
    log_u = np.log(rng.random(proposed.size))
    index, accepted = -1, 0
    for k in range(proposed.size):
        if log_u[k] < proposed[k] - weight:
            index, weight, accepted = k, proposed[k], accepted + 1
    return index, accepted
