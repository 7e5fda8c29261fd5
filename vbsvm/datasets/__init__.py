"""Benchmark data sets and simulators for :mod:`vbsvm`.

Real data
---------
:func:`load` returns a real data set as a :class:`pandas.DataFrame` and
:func:`available` lists the names: ``"toenail"``, ``"spam"``, ``"acath"``,
``"usps"`` and ``"raetsch/<name>"``.

``toenail``, ``spam``, ``acath`` and the Rätsch sets ship with the package
(gzip-compressed CSV files with a ``PROVENANCE.md`` per set: source, license,
checksum, conversion). ``usps`` is not shipped and is read from a data
directory: the ``data_home`` argument or the environment variable
``VBSVM_DATA``, which also override the shipped files. See
:mod:`vbsvm.datasets.loaders` for the rules and the column renames.

Simulated data
--------------
:func:`simulate_luts` (Luts & Ormerod 2014, Section 4.2),
:func:`simulate_sparse` (few nonzero coefficients),
:func:`simulate_grouped` (random intercepts) and :func:`simulate_mcar`
(a correlated predictor deleted completely at random) draw logistic data with labels
in {-1, +1} and store the true parameters in ``df.attrs["truth"]``.

This subpackage imports nothing else from :mod:`vbsvm`; its error classes
live in :mod:`vbsvm.datasets._errors`.
"""

from vbsvm.datasets._errors import DataFormatError, DataNotFoundError, UnknownDatasetError
from vbsvm.datasets.loaders import available, load, snake_case
from vbsvm.datasets.simulate import simulate_grouped, simulate_luts, simulate_mcar, simulate_sparse

__all__ = [
    "load",
    "available",
    "snake_case",
    "simulate_luts",
    "simulate_sparse",
    "simulate_grouped",
    "simulate_mcar",
    "DataNotFoundError",
    "UnknownDatasetError",
    "DataFormatError",
]
