"""Error classes of :mod:`vbsvm.datasets`.

They are defined here so that the subpackage imports nothing else from
:mod:`vbsvm`; the package-wide :mod:`vbsvm.exceptions` may re-export them.
"""

from __future__ import annotations

__all__ = ["DataNotFoundError", "UnknownDatasetError", "DataFormatError"]


class DataNotFoundError(FileNotFoundError):
    """A data file was not found in any of the data directories searched.

    The message names every directory tried and how to point
    :func:`vbsvm.datasets.load` at the data (``data_home=`` or the
    ``VBSVM_DATA`` environment variable).
    """


class UnknownDatasetError(ValueError):
    """The name passed to :func:`vbsvm.datasets.load` is not a known data set.

    The message lists the names that :func:`vbsvm.datasets.available` returns.
    """


class DataFormatError(ValueError):
    """A data file was found but does not have the expected shape or columns."""
