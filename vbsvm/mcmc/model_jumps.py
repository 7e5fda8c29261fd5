r"""Proposals of the Laplace-zero sampler's model jumps, fitted during tuning.

A model jump (:meth:`vbsvm.models.selection.LaplaceZeroModel.model_jumps`) proposes to leave the
current model for another one of a short list, with every coordinate that the model's terms
touch drawn afresh from that model's own proposal: the always-included fixed effects, the
coefficients of its terms and :math:`\eta = \log\sigma_u^2`. This module builds the list and
the proposals from the chain's own tuning sweeps:

* over the last three quarters of tuning (``tune // 4`` on) the chain records, after each
  sweep, its indicators and those coordinates (:meth:`ModelJumpTuner.record`);
* at the last tuning sweep (and again once every chain has tuned, from all chains' rows:
  :meth:`ModelJumpTuner.pool`, called through the engine's ``gibbs_pool``) the models visited at
  least ``min_visits`` times are ranked by their visits and the first ``max_models`` are kept;
  each gets a multivariate t proposal (``df`` degrees of freedom) centred at the mean of its
  recorded coordinates, with their covariance times ``inflate**2`` as scale matrix. The
  covariance is shrunk toward its diagonal when a model has fewer than twice as many visits as
  coordinates (:func:`~vbsvm.mcmc.block_tuner.shrunk_moments`), so that it has full rank.

The defaults were chosen on breast_cancer with ``LaplaceZero(rho=0.01)`` at 4 x 2000 after 1000
(seeds 1-8; max R-hat over the indicators with a posterior mean in (0.01, 0.99)): requiring
``d + 1`` visits for ``d`` coordinates instead of 5 listed about 16 models per chain and 35
pooled and left two seeds at 1.052 and 1.059; with 5 visits 1.015-1.037 and 1.054 (seed 6);
12 jumps per sweep instead of 6 gave 1.012-1.060 and 1.133 (seed 2). Over seeds 1-20, 15 were at
most 1.05 after 1000 tuning sweeps: a group of models that no chain visited in tuning has no
listed model to leave by (seed 9: 1.386; see the README). A Laplace-zero fit therefore tunes
for 2000 sweeps by default (:func:`vbsvm.fitting.svm.default_tune`): 19 of the 20 seeds meet the bar,
and all of seeds 21-40, run after that choice.

Nothing changes after tuning, so the kept draws come from one fixed kernel; a chain with fewer
than two such models makes no jumps. The state entries are arrays (``jump_*``), so that the
engine's checkpoints and extensions carry them.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import gammaln

from vbsvm.mcmc.block_tuner import shrunk_moments

__all__ = ["ModelJumpTuner"]


class ModelJumpTuner:
    """Collect the tuning sweeps of a chain and fit its model-jump proposals.

    Parameters
    ----------
    m : int
        Number of selectable terms.
    n_fixed : int
        Number of always-included fixed effects that a jump moves.
    max_models : int
        Most models kept in the list.
    df, inflate : float
        Degrees of freedom of the t proposals and the factor on their scale.
    min_visits : int
        Fewest tuning visits a model needs.
    """

    def __init__(self, m, n_fixed, *, max_models=100, df=5.0, inflate=1.3, min_visits=5):
        self.m, self.n_fixed = int(m), int(n_fixed)
        self.max_models, self.df, self.inflate, self.min_visits = int(max_models), float(df), float(inflate), int(min_visits)
        self.width = self.n_fixed + self.m + 1  # largest proposal: every term in

    def initial_state(self) -> dict:
        """No recorded sweeps and an empty list (no jumps)."""
        return {"jump_rows": np.zeros((0, self.m + self.width)), "jump_models": np.zeros((0, self.m)),
                "jump_mean": np.zeros((0, self.width)),
                "jump_chol": np.zeros((0, self.width, self.width))}

    @staticmethod
    def carry(state) -> dict:
        """The ``jump_*`` entries of a state (what a sweep passes on)."""
        return {k: v for k, v in state.items() if k.startswith("jump_")}

    def coordinates(self, fixed, v, gamma, eta) -> np.ndarray:
        """The vector a jump draws for the model ``gamma``: the fixed effects, the coefficients
        of the terms in it and ``eta``."""
        return np.concatenate([fixed, v[gamma == 1.0], [eta]])

    def record(self, state, it, tune, gamma, fixed, v, eta) -> dict:
        """After tuning sweep ``it`` of ``tune``: store the sweep's row from ``tune // 4`` on,
        and fit the list at the last sweep."""
        start = tune // 4
        if it < start:
            return state
        state = dict(state)
        if it == start:
            state["jump_rows"] = np.zeros((tune - start, self.m + self.width))
        state["jump_rows"][it - start] = np.concatenate([gamma, fixed, v, [eta]])
        if it == tune - 1:
            state.update(self.fit(state["jump_rows"]))
        return state

    def pool(self, states) -> list:
        """The chains' last tuning states with one list fitted from all their recorded rows
        (the rows dropped): a chain that spent its tuning in one group of models can then jump
        to another that only the other chains visited."""
        rows = [s["jump_rows"] for s in states if s is not None and s["jump_rows"].shape[0]]
        if not rows:
            return states
        fitted = self.fit(np.concatenate(rows))
        fitted["jump_rows"] = np.zeros((0, self.m + self.width))
        return [None if s is None else {**s, **fitted} for s in states]

    def fit(self, rows) -> dict:
        """The list of models and their t proposals from the recorded rows (see the module
        docstring)."""
        gammas = rows[:, : self.m]
        models, inverse, counts = np.unique(gammas, axis=0, return_inverse=True, return_counts=True)
        inverse = np.ravel(inverse)
        kept, means, chols = [], [], []
        for j in np.argsort(-counts, kind="stable"):
            if len(kept) == self.max_models:
                break
            gamma = models[j]
            # the row layout is (gamma, fixed, v, eta): pick the columns coordinates() would
            columns = np.concatenate([np.arange(self.m, self.m + self.n_fixed),
                                      self.m + self.n_fixed + np.flatnonzero(gamma == 1.0), [rows.shape[1] - 1]])
            Z = np.ascontiguousarray(rows[inverse == j][:, columns])  # C order: the rounding of Z.T @ Z depends on it
            n, d = Z.shape
            if n < self.min_visits:
                continue
            mean, cov = shrunk_moments(float(n), Z.sum(axis=0), Z.T @ Z)
            try:
                chol = np.linalg.cholesky(cov) * self.inflate
            except np.linalg.LinAlgError:
                continue
            kept.append(gamma)
            means.append(np.pad(mean, (0, self.width - d)))
            chols.append(np.pad(chol, ((0, self.width - d), (0, self.width - d))))
        if len(kept) < 2:  # no list; the recorded rows stay for :meth:`pool`
            return {k: v for k, v in self.initial_state().items() if k != "jump_rows"}
        return {"jump_models": np.array(kept), "jump_mean": np.array(means), "jump_chol": np.array(chols)}

    def _dim(self, gamma) -> int:
        return self.n_fixed + int(gamma.sum()) + 1

    def sample(self, state, k, rng) -> np.ndarray:
        """A draw of model ``k``'s proposal."""
        d = self._dim(state["jump_models"][k])
        z = rng.standard_normal(d) / math.sqrt(rng.chisquare(self.df) / self.df)
        return state["jump_mean"][k, :d] + state["jump_chol"][k, :d, :d] @ z

    def log_density(self, state, k, x) -> float:
        """Log density of model ``k``'s proposal at ``x``."""
        d, nu = x.size, self.df
        L = state["jump_chol"][k, :d, :d]
        r = solve_triangular(L, x - state["jump_mean"][k, :d], lower=True)
        return float(gammaln((nu + d) / 2.0) - gammaln(nu / 2.0) - 0.5 * d * math.log(nu * math.pi)
                     - np.log(np.diag(L)).sum() - 0.5 * (nu + d) * math.log1p(r @ r / nu))
