"""vbsvm: Bayesian support vector machines for statisticians.

Formula in, fitted model out — fitted by mean-field variational Bayes (fast) or Gibbs sampling
(the exact reference) on the Polson & Scott (2011) data augmentation of the hinge loss.

>>> import vbsvm
>>> fit = vbsvm.svm("y ~ time * terbinafine + (1 | patient_id)", data=vbsvm.datasets.load("toenail"))
>>> fit.summary()  # doctest: +SKIP
"""

__version__ = "0.1.0"

from . import datasets, exceptions
from .api import load, svm

__all__ = ["svm", "load", "datasets", "exceptions", "__version__"]
