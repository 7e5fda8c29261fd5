"""Quick fits shared by several test modules."""

import warnings

import vbsvm
from vbsvm.exceptions import DiagnosticWarning


def map_fit(formula, data, **kw):
    """A MAP fit with ``penalty=1.0``, its diagnostic warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        return vbsvm.svm(formula, data, method="map", penalty=1.0, **kw)
