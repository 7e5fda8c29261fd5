"""EM for the joint posterior mode of the linear models (Polson & Scott 2011).

A model supplies ``map_step(theta, sigma2, covs)`` (one EM step: the E step is the weights'
expectation given theta, the M step the coefficients, variances and covariances),
``log_posterior(theta, sigma2[, covs])`` and ``polish_mode(theta)`` (the exact SVM solution at the
current penalty, or None). The iterations stop when the log posterior changes by less than 1e-12
(relative); the mode is then polished to the SVM solution when that does not lower the log
posterior. Non-convergence issues :class:`~vbsvm.exceptions.ConvergenceWarning`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from vbsvm.exceptions import ConvergenceWarning

__all__ = ["ModeResult", "posterior_mode"]


@dataclass
class ModeResult:
    """The posterior mode: coefficients ``theta``, variances ``sigma2``, random-effect
    covariances ``covs`` (one q x q matrix per term with slopes), and how EM went."""

    theta: np.ndarray
    sigma2: np.ndarray
    covs: list
    converged: bool
    n_iter: int
    seconds: float


def posterior_mode(model, *, max_iter=2000) -> ModeResult:
    """EM from theta = 0, unit variances and identity covariances, polished to the SVM solution."""
    start = time.perf_counter()
    theta = np.zeros(model.q)
    sigma2 = np.ones(len(model.variance_components))
    covs = [np.eye(c.index.shape[1]) for c in model.covariance_components]
    value = model.log_posterior(theta, sigma2, covs)
    converged = False
    for it in range(1, max_iter + 1):
        theta, sigma2, covs = model.map_step(theta, sigma2, covs)
        new = model.log_posterior(theta, sigma2, covs)
        if abs(new - value) <= 1e-12 * max(abs(new), 1.0):
            converged = True
            value = new
            break
        value = new
    polished = model.polish_mode(theta)
    if polished is not None and model.log_posterior(polished, sigma2) >= value - 1e-9 * max(abs(value), 1):
        theta = polished
        converged = True
    if not converged:
        warnings.warn(f"EM for the posterior mode did not converge in {max_iter} iterations.",
                      ConvergenceWarning, stacklevel=4)
    return ModeResult(theta, sigma2, covs, converged, it, time.perf_counter() - start)
