"""vbsvm: Bayesian support vector machines for statisticians.

Formula in, fitted model out — fitted by a fast approximation calibrated against the exact
posterior (``method="vb"``: expectation propagation integrated over the variances; the paper's
mean-field VB is ``method="meanfield"``) or by Gibbs sampling (the exact reference), on the
Polson & Scott (2011) data augmentation of the hinge loss.

>>> import vbsvm
>>> fit = vbsvm.svm("y ~ time * terbinafine + (1 | patient_id)", data=vbsvm.datasets.load("toenail"))
>>> fit.summary()  # doctest: +SKIP
"""

__version__ = "0.1.0"

from . import datasets, exceptions
from .api import load, svm
from .compare import compare
from .gpfit import GPFit, gpsvm
from .linear_response import linear_response
from .priors import LaplaceZero

__all__ = ["svm", "gpsvm", "load", "compare", "linear_response", "LaplaceZero", "GPFit", "datasets", "exceptions", "__version__"]
