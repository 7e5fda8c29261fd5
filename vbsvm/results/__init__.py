"""Fitted models: the result classes (linear, selection, imputed, GP, Dask), their summaries,
plots, and the comparison of fits.

``vbsvm.results.compare(fit_a, fit_b, ...)`` is :func:`vbsvm.results.compare.compare` (the
function; its module stays importable as ``from vbsvm.results.compare import accuracy``).
"""

from vbsvm.results.compare import compare

__all__ = ["compare"]
