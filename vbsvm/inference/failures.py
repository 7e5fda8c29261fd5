"""Numerical failures inside the engines, reported as vbsvm errors that say what to change."""

from contextlib import contextmanager

import numpy as np

from vbsvm.exceptions import NumericalError, VbsvmError

__all__ = ["numerical_failures"]


@contextmanager
def numerical_failures(engine):
    """Turn a :class:`numpy.linalg.LinAlgError`, :class:`FloatingPointError` or (non-vbsvm)
    :class:`ValueError` raised by a model update (e.g. a variance parameter that came out NaN)
    into :class:`~vbsvm.exceptions.NumericalError` (``engine`` names the algorithm)."""
    try:
        yield
    except VbsvmError:
        raise
    except (np.linalg.LinAlgError, FloatingPointError, ValueError) as exc:
        raise NumericalError(
            f"{engine}: a model update failed numerically ({type(exc).__name__}: {exc}). The design is "
            "probably badly scaled or nearly collinear: keep standardize=True, rescale or remove columns "
            "with extreme values, or use a penalty (penalty='auto' or a number).") from None
