"""Helpers shared by the distribution families: argument normalisation and the range of
positive draws.

Positive draws and double precision
-----------------------------------
The positive samplers (gamma, inverse gamma, GIG, inverse Gaussian, truncated inverse gamma)
compute a draw in the usual floating point form where that form is exact, and on the log scale
where it would underflow or overflow (e.g. a gamma draw of shape ``0.01`` lies below the
smallest double with probability ``6e-4``; ``numpy``'s ``standard_gamma`` then returns ``0``).
A draw is returned as it is when it lies in :data:`DRAW_RANGE` ``= [1e-300, 1e300]`` and as the
nearer end of that range otherwise, so it is never ``0``, ``inf`` or ``nan`` for valid
parameters. Beyond that range the true value is outside double precision or within eight
orders of magnitude of its limits, where its reciprocal or its product with a moderate number
(a variance divided by a mixing weight, a precision times a sum of squares) would overflow or
underflow in the caller. The exact value is available on the log scale (the ``sample_log``
methods and ``sample_log_*`` functions), which never clip.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

__all__ = ["DRAW_RANGE", "LOG_2", "LOG_2PI", "LOG_DRAW_RANGE", "TINY", "chol_lower", "clip_log_draws", "exp_clipped", "outside_range", "readonly",
           "scalarize", "size_tuple"]

#: The range of a positive draw (see the module docstring): exact inside, clipped to the nearer end outside.
DRAW_RANGE = (1e-300, 1e300)
#: Natural logarithms of :data:`DRAW_RANGE`.
LOG_DRAW_RANGE = (math.log(DRAW_RANGE[0]), math.log(DRAW_RANGE[1]))
#: The smallest normal double; below it a double loses precision (subnormal) and then becomes ``0``.
TINY = float(np.finfo(np.float64).tiny)

LOG_2PI = float(np.log(2.0 * np.pi))
LOG_2 = float(np.log(2.0))


def size_tuple(size):
    """Normalise a numpy-style ``size`` argument to a tuple.

    Parameters
    ----------
    size : None, int or sequence of int
        Extra leading shape.

    Returns
    -------
    tuple of int
        ``()`` for ``None``, ``(size,)`` for an integer.
    """
    if size is None:
        return ()
    if np.ndim(size) == 0:
        return (int(size),)
    return tuple(int(s) for s in size)


def readonly(a):
    """Return a read-only float64 copy of ``a``.

    Parameters
    ----------
    a : array_like
        Input values.

    Returns
    -------
    numpy.ndarray
        Contiguous float64 copy with ``writeable`` set to ``False``.
    """
    out = np.array(a, dtype=np.float64, copy=True)
    out.flags.writeable = False
    return out


def scalarize(a):
    """Return a numpy scalar for 0-d arrays and the array otherwise.

    Parameters
    ----------
    a : numpy.ndarray
        Result array.

    Returns
    -------
    numpy.ndarray or numpy.float64
        ``a[()]``.
    """
    return a[()]


def clip_log_draws(x, log_x, redo):
    """Replace the entries ``redo`` of the draws ``x`` by ``exp(log_x)`` clipped to :data:`DRAW_RANGE`.

    Parameters
    ----------
    x : numpy.ndarray
        Draws computed in floating point form (modified in place where ``redo``).
    log_x : callable
        ``log_x(redo)`` returns the logarithms of the draws at the boolean index ``redo``.
    redo : numpy.ndarray of bool
        Where the floating point form is not exact or falls outside :data:`DRAW_RANGE`.

    Returns
    -------
    numpy.ndarray
        ``x``, with the other entries unchanged (bit for bit).
    """
    if redo.any():
        x[redo] = exp_clipped(log_x(redo))
    return x


def exp_clipped(log_x):
    """``exp(log_x)`` clipped to :data:`DRAW_RANGE` (whose ends are returned exactly).

    Parameters
    ----------
    log_x : array_like

    Returns
    -------
    numpy.ndarray
    """
    log_x = np.asarray(log_x, dtype=np.float64)
    return np.where(log_x >= LOG_DRAW_RANGE[1], DRAW_RANGE[1],
                    np.where(log_x <= LOG_DRAW_RANGE[0], DRAW_RANGE[0],
                             np.exp(np.clip(log_x, *LOG_DRAW_RANGE))))


def outside_range(x):
    """Where the draws ``x`` are not finite or lie outside :data:`DRAW_RANGE` (``nan`` counts as outside).

    Parameters
    ----------
    x : numpy.ndarray

    Returns
    -------
    numpy.ndarray of bool
    """
    return ~((x >= DRAW_RANGE[0]) & (x <= DRAW_RANGE[1]))


def chol_lower(m, what):
    """Lower Cholesky factor, raising a clear ``LinAlgError``.

    Parameters
    ----------
    m : numpy.ndarray
        Symmetric matrix.
    what : str
        Name used in the error message.

    Returns
    -------
    numpy.ndarray
        Lower triangular ``L`` with ``L @ L.T == m``.

    Raises
    ------
    numpy.linalg.LinAlgError
        If ``m`` is not (numerically) positive definite.
    """
    try:
        return scipy.linalg.cholesky(m, lower=True, check_finite=True)
    except np.linalg.LinAlgError as exc:
        raise np.linalg.LinAlgError(
            f"{what} is not positive definite (Cholesky failed: {exc}); "
            "consider adding jitter to the diagonal") from exc
