"""Sparse priors for :func:`vbsvm.svm` (``prior=...``).

:class:`LaplaceZero` is the spike-and-slab prior of Luts & Ormerod (2014, Section 3.2): each
selectable coefficient is exactly zero with probability ``1 - rho`` and otherwise follows a
Laplace (double-exponential) slab whose scale is inferred,

.. math::

    u_k \\mid \\gamma_k, \\sigma_u \\sim \\gamma_k\\,\\mathrm{Laplace}(0, \\sigma_u) + (1 - \\gamma_k)\\,\\delta_0,
    \\qquad \\gamma_k \\sim \\mathrm{Bernoulli}(\\rho), \\qquad \\sigma_u^2 \\sim IG(A_u, B_u).

The prior on model size is the one a user thinks in: ``rho`` directly (the prior inclusion
probability of each term), ``expected_size=k`` (``rho = k / m`` with ``m`` selectable terms), or
``rho="auto"`` (``rho`` chosen on a grid by the evidence lower bound of the mean-field VB fit).
"""

from __future__ import annotations

import numbers

import numpy as np

from vbsvm import validation
from vbsvm.exceptions import InputError, InputTypeError

__all__ = ["LaplaceZero", "DEFAULT_RHO_GRID"]

#: Grid searched by ``LaplaceZero(rho="auto")`` unless ``rho_grid`` is given.
DEFAULT_RHO_GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)

_DEFAULT_RHO = 0.01


class LaplaceZero:
    """Laplace-zero (spike and Laplace slab) prior for variable selection.

    Parameters
    ----------
    rho : float or "auto", default 0.01
        Prior probability that a selectable term is in the model (the paper's ``rho``; 0.01 is
        its spam setting). ``"auto"`` chooses ``rho`` from ``rho_grid`` by the evidence lower
        bound (ELBO) of the mean-field VB fit, which keeps every constant and so is comparable
        across ``rho``; the chosen value and the ELBO curve are reported by the fit
        (``fit.rho``, ``fit.rho_curve``). The fit's method (calibrated VB, Gibbs) is then run at
        the chosen value.
    expected_size : float, optional
        Prior expected number of selected terms ``k``; sets ``rho = k / m`` where ``m`` is the
        number of selectable terms. Give either ``rho`` or ``expected_size``, not both.
    keep : sequence of str, default ()
        Terms never selected out: design-column names (``"age"``, ``"C(sex)[T.male]"``) or
        formula terms (``"C(sex)"`` keeps all its columns). Like the intercept, they get the
        vague ``N(0, sigma2_beta)`` prior of the paper's always-included block ``beta``.
        Random intercepts ``(1 | g)`` are always kept.
    rho_grid : sequence of float, optional
        Grid for ``rho="auto"`` (default :data:`DEFAULT_RHO_GRID`).

    Examples
    --------
    >>> import vbsvm
    >>> prior = vbsvm.LaplaceZero(expected_size=5, keep=["age"])   # doctest: +SKIP
    >>> fit = vbsvm.svm("y ~ .", data=df, prior=prior)             # doctest: +SKIP
    >>> fit.inclusion()                                             # doctest: +SKIP
    """

    def __init__(self, rho=_DEFAULT_RHO, expected_size=None, keep=(), rho_grid=None):
        if expected_size is not None:
            if not (isinstance(rho, numbers.Real) and not isinstance(rho, bool) and rho == _DEFAULT_RHO):
                raise InputError(
                    f"give either rho or expected_size, not both (got rho={rho!r}, "
                    f"expected_size={expected_size!r}); expected_size=k means rho = k / m."
                )
            if isinstance(expected_size, bool) or not isinstance(expected_size, numbers.Real):
                raise InputTypeError(f"expected_size must be a positive number of terms, got {expected_size!r}.")
            if not (np.isfinite(expected_size) and expected_size > 0):
                raise InputError(f"expected_size must be a positive number of terms, got {expected_size!r}.")
            self.rho = None
            self.expected_size = float(expected_size)
        elif isinstance(rho, str):
            if rho != "auto":
                raise InputError(f"rho must be a number in (0, 1) or 'auto', got {rho!r}.")
            self.rho = "auto"
            self.expected_size = None
        else:
            self.rho = validation.probability(rho, "rho")
            self.expected_size = None
        if isinstance(keep, str):
            keep = (keep,)
        try:
            keep = tuple(keep)
        except TypeError:
            raise InputTypeError(f"keep must be a list of term names, got {keep!r}.") from None
        bad = [k for k in keep if not isinstance(k, str)]
        if bad:
            raise InputTypeError(f"keep must be a list of term names (strings), got {bad!r}.")
        self.keep = keep
        if rho_grid is None:
            self.rho_grid = DEFAULT_RHO_GRID
        else:
            if self.rho != "auto":
                raise InputError("rho_grid is only used with rho='auto'; drop rho_grid or set rho='auto'.")
            try:
                grid = [float(r) for r in rho_grid]
            except (TypeError, ValueError):
                raise InputTypeError(f"rho_grid must be a sequence of numbers in (0, 1), got {rho_grid!r}.") from None
            if not grid:
                raise InputError("rho_grid must not be empty.")
            self.rho_grid = tuple(sorted(set(validation.probability(r, "rho_grid") for r in grid)))

    def resolve_rho(self, m):
        """The prior inclusion probability for ``m`` selectable terms (a float, or ``"auto"``).

        Raises
        ------
        vbsvm.exceptions.InputError
            If ``expected_size`` is not below ``m``.
        """
        if self.expected_size is not None:
            if not self.expected_size < m:
                raise InputError(
                    f"expected_size={self.expected_size:g} must be smaller than the number of "
                    f"selectable terms ({m}); use a smaller expected_size."
                )
            return self.expected_size / m
        return self.rho

    def to_dict(self):
        """JSON-able description (stored in a fit's settings)."""
        return {"type": "LaplaceZero", "rho": self.rho, "expected_size": self.expected_size,
                "keep": list(self.keep), "rho_grid": list(self.rho_grid)}

    def __repr__(self):
        if self.expected_size is not None:
            size = f"expected_size={self.expected_size:g}"
        else:
            size = f"rho={self.rho!r}"
        keep = f", keep={list(self.keep)!r}" if self.keep else ""
        return f"LaplaceZero({size}{keep})"
