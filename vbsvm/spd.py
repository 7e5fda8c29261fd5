"""Small symmetric positive definite matrices: inverse by Cholesky, and the log-Cholesky
coordinates that make a covariance matrix an unconstrained vector (the mean-field state of a
random-effect covariance; the integration coordinates of the calibrated EP fit)."""

from __future__ import annotations

import numpy as np

__all__ = ["spd_inverse", "pack_spd", "unpack_spd"]


def spd_inverse(S) -> np.ndarray:
    """Inverse of a small SPD matrix through its Cholesky factor."""
    Linv = np.linalg.solve(np.linalg.cholesky(S), np.eye(len(S)))
    return Linv.T @ Linv


def pack_spd(M) -> np.ndarray:
    """An SPD matrix as an unconstrained vector: log-diagonal and lower triangle of its Cholesky
    factor (every real vector is a valid matrix, so SQUAREM may extrapolate it)."""
    L = np.linalg.cholesky(M)
    return np.concatenate([np.log(np.diag(L)), L[np.tril_indices(len(M), -1)]])


def unpack_spd(v, q) -> np.ndarray:
    """Inverse of :func:`pack_spd`, vectorized over leading axes: ``v`` (..., q(q+1)/2) gives
    matrices (..., q, q)."""
    v = np.asarray(v, dtype=float)
    L = np.zeros(v.shape[:-1] + (q, q))
    i = np.arange(q)
    L[..., i, i] = np.exp(v[..., :q])
    rows, cols = np.tril_indices(q, -1)
    L[..., rows, cols] = v[..., q:]
    return L @ np.swapaxes(L, -1, -2)
