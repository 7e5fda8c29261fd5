"""Errors and warnings raised by vbsvm.

Every error is a subclass of the built-in exception a Python user would expect
(:class:`ValueError` or :class:`TypeError`) and of :class:`VbsvmError`, so callers
can catch either.  Messages name the argument or column at fault and say how to fix it.
"""


class VbsvmError(Exception):
    """Base class of every error raised by vbsvm."""


class InputError(VbsvmError, ValueError):
    """An argument or a data column has a value vbsvm cannot use."""


class InputTypeError(VbsvmError, TypeError):
    """An argument has the wrong type."""


class FormulaError(InputError):
    """The model formula cannot be parsed or refers to unknown columns."""


class FitFileError(InputError):
    """A file given to :func:`vbsvm.load` is not a readable vbsvm fit."""


class NumericalError(VbsvmError, ArithmeticError):
    """An update of the fit failed numerically (e.g. the Cholesky factorization of a badly scaled
    or collinear design); the message says which input to change."""


class WorkerError(VbsvmError, RuntimeError):
    """A worker process (``n_jobs > 1``) died without returning its results."""


class ConvergenceWarning(UserWarning):
    """An iterative algorithm stopped before its convergence criterion was met."""


class InterruptWarning(ConvergenceWarning):
    """An algorithm was stopped by Ctrl-C (KeyboardInterrupt); the result is partial
    (Gibbs: the draws kept so far; VB: the last accepted q, ``converged=False``)."""


class DiagnosticWarning(UserWarning):
    """Something in the data or the fit that the user should know about
    (separable data, R-hat above 1.01, unseen group levels, ...)."""
