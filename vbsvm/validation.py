"""Checks of the scalar arguments of the public functions.

Every check returns the value converted to a plain Python type, or raises
:class:`~vbsvm.exceptions.InputTypeError` (a :class:`TypeError`) for a value of the wrong type
and :class:`~vbsvm.exceptions.InputError` (a :class:`ValueError`) for one out of range. The
message names the argument and says what it must be, so that the user can fix the call.
"""

from __future__ import annotations

import numbers

import numpy as np

from vbsvm.exceptions import InputError, InputTypeError

__all__ = ["integer", "positive_float", "probability", "level", "seed", "penalty", "choice"]


def integer(value, name: str, minimum: int = 1) -> int:
    """An integer ``>= minimum`` (``bool`` is refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputTypeError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value}.")
    return int(value)


def positive_float(value, name: str) -> float:
    """A finite number ``> 0``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{name} must be a positive number, got {value!r}.")
    if not (np.isfinite(value) and value > 0):
        raise InputError(f"{name} must be a positive finite number, got {value!r}.")
    return float(value)


def probability(value, name: str) -> float:
    """A number strictly between 0 and 1 (a prior inclusion probability)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{name} must be a number in (0, 1) or 'auto', got {value!r}.")
    value = float(value)
    if not (np.isfinite(value) and 0.0 < value < 1.0):
        raise InputError(f"{name} must lie strictly between 0 and 1 (a prior inclusion probability), got {value!r}.")
    return value


def level(value) -> float:
    """An interval level in (0, 1), e.g. 0.95."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise InputError(f"level must be in (0, 1), e.g. 0.95; got {value!r}.")
    return float(value)


def seed(value):
    """``None`` or a non-negative integer (the seed of :func:`numpy.random.default_rng`)."""
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0):
        return None if value is None else int(value)
    raise InputTypeError(f"seed must be a non-negative integer or None, got {value!r}.")


def penalty(value):
    """``"auto"`` (inferred), ``None`` (none) or a positive number alpha."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, str):
        raise InputError(f"penalty must be 'auto', None or a positive number alpha; got {value!r}.")
    return positive_float(value, "penalty")


def choice(value, name: str, options) -> str:
    """One of ``options`` (strings)."""
    if not isinstance(value, str) or value not in options:
        raise InputError(f"{name} must be one of {tuple(options)}; got {value!r}.")
    return value
