"""Certificates that the rows of a design are, or are not, linearly separable.

With ``a_i = y_i x_i`` the rows of ``A``, the classes are separated when some ``beta`` has
``A beta >= 1``; by Farkas' lemma exactly one of the two holds:

* a separating ``beta``: ``A beta >= 1`` (any ``beta`` with ``A beta > 0``, rescaled);
* a certificate of overlap: ``lambda >= 0`` with ``sum(lambda) > 0`` and ``A' lambda = 0`` (a
  point common to the convex hulls of the two classes).

The minimizer of the squared hinge ``f(beta) = sum_i (1 - a_i' beta)_+^2`` gives one or the other:
``f = 0`` there on separable rows, and otherwise its gradient ``-2 A' lambda`` with
``lambda = (1 - A beta)_+`` vanishes. A finite Newton method (each step the least-squares fit of
the rows inside the margin, with the exact line search of the piecewise quadratic ``f``; Keerthi
and DeCoste 2005, without the ridge) reaches either in a few steps, at the cost of a few
least-squares fits of the design.

:func:`separation_certificate` returns True or False only when the certificate it found holds
beyond rounding and by a wide margin: a separating ``beta`` whose smallest margin stands clear of
the rounding error of every margin and of :data:`TOLERANCE` times the largest score; an overlap
``lambda``, corrected to ``A' lambda = 0`` by the least-norm change, that stays positive. Data at
the edge (separable only with huge coefficients, ill-conditioned designs, a Newton method that
stalls) are left undecided (None), for the linear program of
:meth:`vbsvm.formula.design.Design.linearly_separable` to settle.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["separation_certificate", "TOLERANCE", "MAX_NEWTON_STEPS"]

#: Smallest margin of a separating ``beta``, relative to its largest score, and largest relative
#: residual of an overlap certificate, that :func:`separation_certificate` accepts.
TOLERANCE = 1e-6
#: Newton steps before :func:`separation_certificate` gives up (None).
MAX_NEWTON_STEPS = 50


def separation_certificate(A: np.ndarray) -> bool | None:
    """Whether some ``beta`` gives ``A beta >= 1`` (True) or none does (False), by a certificate
    found with the finite Newton method on the squared hinge; None when no certificate is found
    that holds by a wide margin (see the module docstring).

    Parameters
    ----------
    A : numpy.ndarray, shape (n, p)
        The rows ``y_i x_i``; finite.
    """
    beta = np.zeros(A.shape[1])
    margins = np.zeros(A.shape[0])
    loss = float(A.shape[0])
    for _ in range(MAX_NEWTON_STEPS):
        if margins.min() > 0:
            return True if _separates(A, beta, margins) else None
        slack = 1.0 - margins
        inside = slack > 0
        weights = np.where(inside, slack, 0.0)
        if _overlap(A, weights):
            return False
        step = _least_squares(A[inside], slack[inside])
        change = A @ step
        t = _exact_step(slack, change)
        if not 0 < t < np.inf:
            return None
        beta = beta + t * step
        margins = A @ beta
        new_loss = float(np.sum(np.maximum(1.0 - margins, 0.0) ** 2))
        if not new_loss < loss:
            return None
        loss = new_loss
    return None


def _least_squares(B: np.ndarray, r: np.ndarray) -> np.ndarray:
    """A least-squares solution of ``B x = r``: by the Cholesky factor of ``B'B`` when it is well
    conditioned (the usual case, at half the cost), else by a rank-revealing QR of ``B`` (more
    columns than rows, collinear columns)."""
    if B.shape[0] >= B.shape[1]:
        gram = B.T @ B
        try:
            factor = scipy.linalg.cho_factor(gram, check_finite=False)
        except np.linalg.LinAlgError:
            factor = None
        if factor is not None and np.diag(factor[0]).min() ** 2 > 1e-10 * np.diag(gram).max():
            return scipy.linalg.cho_solve(factor, B.T @ r, check_finite=False)
    return scipy.linalg.lstsq(B, r, lapack_driver="gelsy", check_finite=False)[0]


def _exact_step(slack: np.ndarray, change: np.ndarray) -> float:
    """The smallest minimizer ``t >= 0`` of ``sum_i (slack_i - t change_i)_+^2`` (convex, piecewise
    quadratic): the first zero of its half-derivative ``-h(t)``, ``h(t) = sum_i change_i (slack_i -
    t change_i)_+``, found over the breakpoints ``slack_i / change_i`` in increasing order. ``inf``
    when the sum falls without end along the step."""
    active = (slack > 0) | ((slack == 0) & (change < 0))
    leaves = (change > 0) & (slack > 0)  # leave the sum at their breakpoint
    enters = (change < 0) & (slack < 0)  # enter it at theirs
    events = np.flatnonzero(leaves | enters)
    with np.errstate(divide="ignore", invalid="ignore"):
        times = slack[events] / change[events]
    order = np.argsort(times, kind="stable")
    events, times = events[order], times[order]
    sign = np.where(leaves[events], -1.0, 1.0)
    # h(t) = b_k - t a_k between breakpoints k and k + 1 (k = 0: from t = 0 to the first)
    b = np.concatenate([[np.dot(change[active], slack[active])],
                        sign * change[events] * slack[events]]).cumsum()
    a = np.concatenate([[np.dot(change[active], change[active])], sign * change[events] ** 2]).cumsum()
    if b[0] <= 0:  # the sum does not fall along the step
        return 0.0
    below = np.flatnonzero(b[:-1] - times * a[:-1] <= 0)
    k = below[0] if below.size else len(times)
    if a[k] > 0:
        return float(b[k] / a[k])
    return float(times[k - 1]) if k > 0 and b[k] <= 0 else np.inf


def _separates(A: np.ndarray, beta: np.ndarray, margins: np.ndarray) -> bool:
    """Whether the computed ``margins = A beta`` prove ``beta`` separating: each beyond its own
    rounding error, and the smallest at least :data:`TOLERANCE` times the largest score."""
    size = np.abs(A) @ np.abs(beta)
    rounding = 4.0 * A.shape[1] * np.finfo(float).eps * size
    return bool(np.all(margins > rounding) and margins.min() >= TOLERANCE * size.max())


def _overlap(A: np.ndarray, weights: np.ndarray) -> bool:
    """Whether ``weights`` (>= 0, the slacks of the rows inside the margin) prove the classes
    overlap: ``A' weights`` vanishes to :data:`TOLERANCE` of its scale, and the least-norm change of
    the positive weights that makes it vanish (up to rounding) keeps them all positive."""
    if not weights.any():
        return False
    scale = np.abs(A).T @ weights
    residual = A.T @ weights
    if np.abs(residual).max() > TOLERANCE * scale.max():
        return False
    rows = np.flatnonzero(weights > 0)
    change = scipy.linalg.lstsq(A[rows].T, -residual, lapack_driver="gelsd", check_finite=False)[0]
    corrected = weights[rows] + change
    if not np.all(corrected > 0):
        return False
    left = np.abs(A[rows].T @ corrected).max()
    return bool(left <= 64.0 * len(rows) * np.finfo(float).eps * (np.abs(A[rows]).T @ corrected).max())
