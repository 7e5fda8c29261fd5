"""Sparse priors for :func:`vbsvm.svm` (``prior=...``).

:class:`LaplaceZero` is the spike-and-slab prior of Luts & Ormerod (2014, Section 3.2): each
selectable coefficient is exactly zero with probability ``1 - rho`` and otherwise follows a
Laplace (double-exponential) slab whose scale is inferred,

.. math::

    u_k \\mid \\gamma_k, \\sigma_u \\sim \\gamma_k\\,\\mathrm{Laplace}(0, \\sigma_u) + (1 - \\gamma_k)\\,\\delta_0,
    \\qquad \\gamma_k \\sim \\mathrm{Bernoulli}(\\rho), \\qquad \\sigma_u^2 \\sim IG(A_u, B_u).

By default the inclusion probability has a hyperprior, ``rho ~ Beta(1, m^2)`` with ``m`` the
number of selectable terms (:class:`Beta`; ``LaplaceZero()`` is ``LaplaceZero(rho=Beta())``): the
model size is beta-binomial, and the fit infers ``rho``. A fixed ``rho`` (the paper's),
``expected_size=k`` (``rho = k / m``), ``rho="auto"`` (``rho`` chosen on a grid by the evidence
lower bound of the mean-field VB fit) and any ``Beta(a, b)`` remain.

Why ``Beta(1, m^2)``. With a fixed ``rho`` the expected model size is ``rho * m`` whatever the
data (the paper's ``rho = 0.01`` expects 0.09 of 9 terms). A hyperprior lets the data set it, but
the data say little about ``rho`` through the null terms: the Laplace slab's scale ``sigma_u``
is inferred and shrinks to fit small coefficients, so a null term costs almost nothing in the
model (its Bayes factor stays near 1), and the posterior of ``rho`` is pulled towards the
fraction of terms that cost nothing to include. In the simulations of
``benchmarks/selection_hyperprior.py`` (5 true terms among 10, 50 or 200, n = 200; calibrated fits)
the uniform ``Beta(1, 1)`` (Scott & Berger 2010, *Ann. Statist.* 38, 2587-2619; the default of R's
BAS, whose multiplicity correction relies on the null terms' Bayes factors falling with n) put the
posterior mean of rho at 0.6-0.8 and selected half or more of the null terms; ``Beta(1, m)`` (the
empty model has prior probability 1/2 for every m) selected 3-4 times as many null terms as
``rho = 0.01`` from 50 terms on. ``Beta(1, m^2)`` is a complexity prior (Castillo & van der Vaart
2012, *Ann. Statist.* 40, 2069-2101; Castillo, Schmidt-Hieber & van der Vaart 2015: ``Beta(1,
p^u)``, ``u > 1``): the prior odds against each further term grow like ``m^2``, so the
multiplicity correction does not rely on the nulls' Bayes factors. It selected about as few null
terms as ``rho = 0.01`` (fewer among 200), with the same ranking of the terms, and on spam it put
rho at 0.0095 (95% interval 0.0065-0.013) from the data, the value the paper chose by hand.

Inference of rho: Gibbs draws ``rho | gamma ~ Beta(a + |gamma|, b + m - |gamma|)`` in each sweep;
the calibrated ``method="vb"`` integrates ``logit(rho)`` with the variances over a grid weighted by
the EP evidence; ``method="meanfield"`` has a factor ``q(rho)``.
"""

from __future__ import annotations

import numbers

import numpy as np

from vbsvm import validation
from vbsvm.exceptions import InputError, InputTypeError

__all__ = ["LaplaceZero", "Beta", "DEFAULT_RHO_GRID"]

#: Grid searched by ``LaplaceZero(rho="auto")`` unless ``rho_grid`` is given.
DEFAULT_RHO_GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


class Beta:
    """Beta(a, b) hyperprior of the inclusion probability of :class:`LaplaceZero` (``rho=Beta(a, b)``).

    ``rho ~ Beta(a, b)`` and, given ``rho``, each of the ``m`` selectable terms is in the model
    with probability ``rho``: the number of terms in the model is beta-binomial, and the fit
    infers ``rho`` with the rest. Without ``b`` (``Beta()``, the default of :class:`LaplaceZero`),
    ``b = m**2``: the complexity prior ``Beta(1, m^2)`` (see the module docstring), whose prior odds
    against each further term grow like ``m^2``. ``Beta(1, 1)`` is uniform on ``rho`` (every model
    size from 0 to ``m`` equally probable; Scott & Berger 2010).

    Parameters
    ----------
    a : float, default 1
        Positive shape: about the prior count of terms in the model.
    b : float, optional
        Positive shape: about the prior count of terms out of the model. Default ``m**2`` with
        ``m`` the number of selectable terms of the fit.

    Examples
    --------
    >>> import vbsvm
    >>> vbsvm.LaplaceZero(rho=vbsvm.Beta(1, 1))
    LaplaceZero(rho=Beta(1, 1))
    >>> vbsvm.Beta().shapes(9)
    (1.0, 81.0)
    """

    __slots__ = ("_a", "_b")

    def __init__(self, a=1.0, b=None):
        for name, value in (("a", a), ("b", b)):
            if name == "b" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise InputTypeError(f"Beta({name}=...): {name} must be a positive number (a prior count of "
                                     f"terms {'in' if name == 'a' else 'out of'} the model), got {value!r}.")
            if not (np.isfinite(value) and value > 0):
                raise InputError(f"Beta({name}=...): {name} must be a positive finite number, got {value!r}; "
                                 "e.g. Beta(1, 1) is the uniform prior on rho.")
        object.__setattr__(self, "_a", float(a))
        object.__setattr__(self, "_b", None if b is None else float(b))

    def __setattr__(self, name, value):
        raise AttributeError("Beta is immutable; create a new vbsvm.Beta(a, b).")

    def __reduce__(self):
        return Beta, (self._a, self._b)

    def __copy__(self):
        return self  # immutable: a copy is the same value

    def __deepcopy__(self, memo):
        return self

    @property
    def a(self) -> float:
        """Shape ``a`` (prior count of terms in the model)."""
        return self._a

    @property
    def b(self):
        """Shape ``b`` (prior count of terms out of the model); None: ``m**2`` (:meth:`shapes`)."""
        return self._b

    def shapes(self, m) -> tuple:
        """``(a, b)`` for ``m`` selectable terms (``b = m**2`` when not given)."""
        return self._a, float(m) ** 2 if self._b is None else self._b

    def mean(self, m) -> float:
        """Prior mean of ``rho`` for ``m`` selectable terms, ``a / (a + b)``."""
        a, b = self.shapes(m)
        return a / (a + b)

    def to_dict(self):
        """JSON-able description (inside a fit's ``settings["prior"]``; ``b`` null: ``m**2``)."""
        return {"type": "Beta", "a": self._a, "b": self._b}

    def __eq__(self, other):
        if not isinstance(other, Beta):
            return NotImplemented
        return (self._a, self._b) == (other._a, other._b)

    def __hash__(self):
        return hash(("Beta", self._a, self._b))

    def __repr__(self):
        return f"Beta({self._a:g}, {'m^2' if self._b is None else format(self._b, 'g')})"


#: The default hyperprior of ``LaplaceZero(rho=...)``: the complexity prior Beta(1, m^2).
_DEFAULT_RHO = Beta()


class LaplaceZero:
    """Laplace-zero (spike and Laplace slab) prior for variable selection.

    Parameters
    ----------
    rho : Beta, float or "auto", default Beta(1, m^2)
        Prior probability that a selectable term is in the model. A :class:`Beta` puts a
        hyperprior on it and the fit infers it (``fit.rho`` is then its posterior mean,
        ``fit.rho_posterior()`` its summary); the default ``Beta()`` is ``Beta(1, m^2)`` with ``m``
        the number of selectable terms (see the module docstring for why; ``Beta(1, 1)`` is the
        uniform prior). A number fixes it (the paper's ``rho``; 0.01 is its spam setting). ``"auto"`` chooses ``rho`` from ``rho_grid`` by the
        evidence lower bound (ELBO) of the mean-field VB fit, which keeps every constant and so
        is comparable across ``rho``; the chosen value and the ELBO curve are reported by the fit
        (``fit.rho``, ``fit.rho_curve``). The fit's method (calibrated VB, Gibbs) is then run at
        the chosen value.
    expected_size : float, optional
        Prior expected number of selected terms ``k``; fixes ``rho = k / m`` where ``m`` is the
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
    >>> prior = vbsvm.LaplaceZero(keep=["age"])                     # doctest: +SKIP
    >>> prior = vbsvm.LaplaceZero(rho=vbsvm.Beta(1, 1))             # uniform on rho  # doctest: +SKIP
    >>> prior = vbsvm.LaplaceZero(expected_size=5)                  # rho = 5 / m     # doctest: +SKIP
    >>> fit = vbsvm.svm("y ~ .", data=df, prior=prior)             # doctest: +SKIP
    >>> fit.inclusion()                                             # doctest: +SKIP
    """

    def __init__(self, rho=_DEFAULT_RHO, expected_size=None, keep=(), rho_grid=None):
        if expected_size is not None:
            if rho is not _DEFAULT_RHO:
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
        elif isinstance(rho, Beta):
            self.rho = rho
            self.expected_size = None
        elif isinstance(rho, str):
            if rho != "auto":
                hint = (" For a Beta hyperprior give rho=vbsvm.Beta(a, b)." if rho.strip().lower().startswith("beta")
                        else "")
                raise InputError(f"rho must be vbsvm.Beta(a, b), a number in (0, 1) or 'auto', got {rho!r}.{hint}")
            self.rho = "auto"
            self.expected_size = None
        elif isinstance(rho, bool) or not isinstance(rho, numbers.Real):
            raise InputTypeError(f"rho must be vbsvm.Beta(a, b) (a hyperprior), a number in (0, 1) or 'auto', "
                                 f"got {rho!r}.")
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

    @property
    def hyperprior(self) -> bool:
        """True when ``rho`` has a :class:`Beta` hyperprior (inferred by the fit)."""
        return isinstance(self.rho, Beta)

    def resolve_rho(self, m):
        """The prior inclusion probability for ``m`` selectable terms (a float, a :class:`Beta`
        hyperprior, or ``"auto"``).

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
        rho = self.rho.to_dict() if isinstance(self.rho, Beta) else self.rho
        return {"type": "LaplaceZero", "rho": rho, "expected_size": self.expected_size,
                "keep": list(self.keep), "rho_grid": list(self.rho_grid)}

    def __repr__(self):
        if self.expected_size is not None:
            size = f"expected_size={self.expected_size:g}"
        else:
            size = f"rho={self.rho!r}"
        keep = f", keep={list(self.keep)!r}" if self.keep else ""
        return f"LaplaceZero({size}{keep})"
