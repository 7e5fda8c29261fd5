"""vbsvm: Bayesian support vector machines for statisticians.

Formula in, fitted model out — fitted by a fast approximation calibrated against the exact
posterior (``method="vb"``: expectation propagation integrated over the variances; the paper's
mean-field VB is ``method="meanfield"``) or by Gibbs sampling (the exact reference), on the
Polson & Scott (2011) data augmentation of the hinge loss.

>>> import vbsvm
>>> fit = vbsvm.svm("y ~ time * terbinafine + (1 | patient_id)", data=vbsvm.datasets.load("toenail"))
>>> fit.summary()  # doctest: +SKIP
"""

from vbsvm import datasets, exceptions
from vbsvm._version import __version__
from vbsvm.fitting.gp import gpsvm
from vbsvm.fitting.svm import load, svm
from vbsvm.models.priors import Beta, LaplaceZero
from vbsvm.posterior.linear_response import linear_response
from vbsvm.results.compare import compare
from vbsvm.results.gp import GPFit

__all__ = ["svm", "gpsvm", "load", "compare", "linear_response", "LaplaceZero", "Beta", "GPFit", "datasets", "exceptions", "__version__"]
