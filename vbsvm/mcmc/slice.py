"""Univariate slice sampling with stepping out and shrinkage (Neal 2003, Figures 3 and 5).

Used by the Gibbs samplers for low-dimensional conditionals without a closed form, e.g. a
variance with the coefficients it governs integrated out. The move leaves the target density
invariant for any initial width; the width only affects the cost (number of evaluations).
"""

from __future__ import annotations

import math

__all__ = ["slice_sample"]


def slice_sample(logp, x0, rng, *, width=1.0, max_steps=16, max_shrink=64, logp_x0=None):
    """One slice-sampling update of a scalar.

    Parameters
    ----------
    logp : callable
        Log density up to a constant, ``logp(x) -> float`` (``-inf`` outside the support).
    x0 : float
        Current value (must have finite ``logp``).
    rng : numpy.random.Generator
    width : float
        Initial interval width ``w``.
    max_steps : int
        Limit ``m`` of the stepping out (``m`` widths at most; the limit keeps detailed balance).
    max_shrink : int
        Shrinkage steps before giving up and returning ``x0`` (never reached for a proper
        target; a guard against a NaN density).
    logp_x0 : float, optional
        ``logp(x0)`` if the caller knows it (saves one evaluation).

    Returns
    -------
    x : float
        The new value.
    logp_x : float
        ``logp(x)``.
    """
    f0 = logp(x0) if logp_x0 is None else logp_x0
    level = f0 + math.log(rng.random())  # log of the slice height under the density
    left = x0 - width * rng.random()
    right = left + width
    j = int(math.floor(max_steps * rng.random()))
    k = max_steps - 1 - j
    while j > 0 and logp(left) > level:
        left -= width
        j -= 1
    while k > 0 and logp(right) > level:
        right += width
        k -= 1
    for _ in range(max_shrink):
        x = left + (right - left) * rng.random()
        fx = logp(x)
        if fx > level:
            return x, fx
        if x < x0:
            left = x
        else:
            right = x
    return x0, f0
