"""Numerical failures inside the engines, reported as vbsvm errors that say what to change.

An engine wraps its updates in :func:`numerical_failures`, which turns a floating point or
linear algebra failure into :class:`~vbsvm.exceptions.NumericalError`. The advice of that error
is something the user can do with the call they made (:func:`numerical_advice`): the fitting
code wraps a whole fit in :func:`fit_call`, which knows the call (its settings and prior) and
words the advice for it, e.g. never a penalty for a ``LaplaceZero`` prior, which refuses one.
Without that context (an engine run on its own) the advice is the general one.
"""

import numbers
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from vbsvm.exceptions import NumericalError, VbsvmError

__all__ = ["fit_call", "numerical_advice", "numerical_failures"]

#: ``(settings, prior)`` of the fit being run in this context, or None.
_CALL = ContextVar("vbsvm_fit_call", default=None)

_OTHER_METHOD = {
    "gibbs": "method='vb' (the calibrated approximation, no sampling)",
    "vb": "method='gibbs' (exact sampling)",
    "meanfield": "method='vb' (the calibrated approximation) or method='gibbs'",
    "map": "method='vb'",
}


def _design_advice(settings):
    """The part of the advice about the data (every call can act on it)."""
    scale = ("set standardize=True" if settings is not None and settings.get("standardize") is False
             else "keep standardize=True")
    return (f"The design is probably badly scaled or nearly collinear: {scale}, and rescale or remove columns "
            "with extreme values or near-duplicate columns.")


def _prior_advice(settings, prior):
    """The part of the advice about the prior or penalty, for the call's ``settings`` and ``prior``."""
    if prior is not None and hasattr(prior, "rho"):  # LaplaceZero: the slab replaces the penalty
        rho = getattr(prior, "rho", None)
        if rho == "auto":
            change = "a fixed prior inclusion probability (e.g. LaplaceZero(rho=0.1))"
        elif isinstance(rho, numbers.Real):
            change = (f"another prior inclusion probability than rho={float(rho):g} (e.g. LaplaceZero(rho='auto'), "
                      "or expected_size=k for about k terms)")
        else:
            change = "another expected_size, or LaplaceZero(rho='auto')"
        return f"With prior=LaplaceZero(...), which takes no penalty, try {change}."
    general = "Or use a penalty (penalty='auto' or a number)."
    if settings is None:
        return general
    penalty = settings.get("penalty", "auto")
    if isinstance(penalty, str) and penalty == "auto":
        return "Or fix the penalty (e.g. penalty=1.0)."
    if isinstance(penalty, numbers.Real) and not isinstance(penalty, bool):
        return f"Or use a larger penalty than {float(penalty):g} (e.g. penalty={2.0 * float(penalty):g}), or penalty='auto'."
    return general


def _method_advice(settings):
    """The part of the advice naming another method (and ``missing='drop'`` for an imputed fit)."""
    if settings is None:
        return ""
    method = settings.get("method")
    if method == "vb" and settings.get("approximation") == "meanfield":
        method = "meanfield"
    parts = []
    if method in _OTHER_METHOD:
        parts.append(_OTHER_METHOD[method])
    if settings.get("missing") == "impute":
        parts.append("missing='drop' (complete cases)")
    return " Or try " + " or ".join(parts) + "." if parts else ""


def numerical_advice(settings=None, prior=None) -> str:
    """What the user can change after a numerical failure of a fit made with ``settings`` and ``prior``.

    Parameters
    ----------
    settings : dict, optional
        The checked settings of :func:`vbsvm.svm` (``method``, ``approximation``, ``penalty``,
        ``standardize``, ``missing``); None for the general advice.
    prior : vbsvm.LaplaceZero, optional

    Returns
    -------
    str
        Sentences on the data (always), the penalty (with ``LaplaceZero``, which refuses a
        penalty: its ``rho`` or ``expected_size``) and another method (or ``missing='drop'``).
    """
    return f"{_design_advice(settings)} {_prior_advice(settings, prior)}{_method_advice(settings)}"


def _message(engine, cause, settings=None, prior=None):
    return (f"{engine}: a model update failed numerically ({cause}). "
            f"{numerical_advice(settings, prior)}")


@contextmanager
def fit_call(settings, prior=None):
    """Run a fit of the call ``(settings, prior)``: a :class:`~vbsvm.exceptions.NumericalError`
    raised inside by :func:`numerical_failures` (in this thread or in a worker) gets the advice
    of :func:`numerical_advice` for this call.

    Parameters
    ----------
    settings : dict
        The checked settings of :func:`vbsvm.svm`.
    prior : vbsvm.LaplaceZero, optional
    """
    token = _CALL.set((settings, prior))
    try:
        yield
    except NumericalError as exc:
        failure = getattr(exc, "failure", None)
        if failure is None:
            raise
        err = NumericalError(_message(*failure, settings, prior))
        err.failure = failure
        raise err from None
    finally:
        _CALL.reset(token)


@contextmanager
def numerical_failures(engine):
    """Turn a :class:`numpy.linalg.LinAlgError`, :class:`FloatingPointError` or (non-vbsvm)
    :class:`ValueError` raised by a model update (e.g. a variance parameter that came out NaN)
    into :class:`~vbsvm.exceptions.NumericalError` (``engine`` names the algorithm), with the
    advice for the call being fitted (:func:`fit_call`) or the general advice."""
    try:
        yield
    except VbsvmError:
        raise
    except (np.linalg.LinAlgError, FloatingPointError, ValueError) as exc:
        failure = (engine, f"{type(exc).__name__}: {exc}")
        call = _CALL.get()
        err = NumericalError(_message(*failure, *(call or (None, None))))
        err.failure = failure
        raise err from None
