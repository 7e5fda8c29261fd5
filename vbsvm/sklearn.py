"""scikit-learn estimator: :class:`BayesianSVC` wraps :func:`vbsvm.svm` and :func:`vbsvm.gpsvm`.

>>> from vbsvm.sklearn import BayesianSVC
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> model = make_pipeline(StandardScaler(), BayesianSVC(seed=1))  # doctest: +SKIP
>>> model.fit(X, y).predict_proba(X_new)  # doctest: +SKIP

scikit-learn is not a dependency of vbsvm: ``import vbsvm`` never imports this module, and
importing it without scikit-learn raises an :class:`ImportError` that says what to install.

The estimator turns the arrays it is given into a DataFrame (the frame's own column names
when they are plain identifiers, else ``x0 .. x{p-1}``), codes the labels 0/1 with 1 =
``classes_[1]`` and fits ``"<response> ~ ."``; the vbsvm fit is kept as ``fit_`` for its
summary, coefficients and ArviZ export.
"""

from __future__ import annotations

import keyword

import numpy as np
import pandas as pd

try:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as err:  # pragma: no cover - exercised by a test that hides scikit-learn
    raise ImportError(
        "vbsvm.sklearn needs scikit-learn 1.6 or later, which vbsvm does not install: "
        "pip install scikit-learn (or pip install --upgrade scikit-learn)"
    ) from err

from vbsvm.exceptions import InputError, InputTypeError
from vbsvm.fitting.gp import gpsvm
from vbsvm.fitting.svm import svm

__all__ = ["BayesianSVC"]

#: the keyword arguments BayesianSVC sets itself (not accepted in ``options``)
_OWN = ("formula", "data", "method", "penalty", "kernel", "n_inducing", "draws", "tune", "chains",
        "seed", "progress")


class BayesianSVC(ClassifierMixin, BaseEstimator):
    """Bayesian support vector classifier with the scikit-learn interface.

    Fits :func:`vbsvm.svm` (linear SVM, ``kernel=None``) or :func:`vbsvm.gpsvm` (sparse-GP SVM,
    ``kernel`` given) to ``"y ~ ."`` on the columns of ``X``; two classes only.

    Parameters
    ----------
    method : str, default "vb"
        Inference method. Linear: ``"vb"`` (calibrated EP), ``"meanfield"``, ``"gibbs"``,
        ``"map"``; GP: ``"vb"`` (batch VB; the full GP when ``n_inducing`` is None), ``"svi"``,
        ``"gibbs"``.
    penalty : "auto", float or None, default "auto"
        Linear SVM only: the penalty of :func:`vbsvm.svm` (``"auto"`` infers it; a float fixes
        ``alpha``, i.e. cost ``C = 1/(2 alpha)``; None: vague prior).
    kernel : str, vbsvm.models.gp.Kernel or None, default None
        None: linear SVM. Otherwise the GP kernel of :func:`vbsvm.gpsvm` (``"rbf"``,
        ``"matern52"``, ``"rbf+linear"``, ...).
    n_inducing : int or None, default None
        GP only: number of inducing points (None: the default of :func:`vbsvm.gpsvm`).
    draws, chains : int, default 1000, 4
        Gibbs: kept draws per chain and chains; VB: shape of the stored draws from q.
    tune : int or None, default None
        Gibbs: discarded initial sweeps (None: the default of the wrapped function, 1000 for
        ``svm``, 2000 with a Laplace-zero prior, and 500 for ``gpsvm``).
    seed : int or None, default None
        Seed of every random number of the fit; the same seed gives the same fit.
    progress : bool, default False
        Gibbs progress bar (off by default: cross-validation would print one per fold).
    options : dict or None, default None
        Further keyword arguments of :func:`vbsvm.svm` or :func:`vbsvm.gpsvm` (e.g.
        ``{"max_iter": 500}``, ``{"batch_size": 50, "optimize": False}``); not ``formula``,
        ``data`` or the parameters above.

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
        The class labels, sorted; ``classes_[1]`` is the positive (+1) class of ``fit_``.
    n_features_in_ : int
        Number of columns of ``X`` seen in :meth:`fit`.
    feature_names_in_ : ndarray of str
        Column names of ``X`` (only when ``X`` was a DataFrame with string column names).
    fit_ : vbsvm.results.fit.Fit or vbsvm.GPFit
        The vbsvm fit, on the response coded 0/1 (1 = ``classes_[1]``).

    See Also
    --------
    vbsvm.svm, vbsvm.gpsvm

    Examples
    --------
    >>> from sklearn.model_selection import cross_val_score
    >>> heart = vbsvm.datasets.load("raetsch/heart")  # doctest: +SKIP
    >>> cross_val_score(BayesianSVC(seed=1), heart.drop(columns="y"), heart["y"])  # doctest: +SKIP
    """

    def __init__(self, method="vb", penalty="auto", kernel=None, n_inducing=None, draws=1000,
                 tune=None, chains=4, seed=None, progress=False, options=None):
        self.method = method
        self.penalty = penalty
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.draws = draws
        self.tune = tune
        self.chains = chains
        self.seed = seed
        self.progress = progress
        self.options = options

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def fit(self, X, y):
        """Fit the Bayesian SVM.

        Parameters
        ----------
        X : array-like or pandas.DataFrame of shape (n_samples, n_features)
            Numeric predictors (not modified).
        y : array-like of shape (n_samples,)
            Labels with exactly two distinct values.

        Returns
        -------
        BayesianSVC
            The estimator itself.
        """
        kwargs = self._fit_kwargs()
        X, y = validate_data(self, X, y, dtype="numeric")
        check_classification_targets(y)
        classes = np.unique(y)
        if classes.size != 2:
            raise InputError(
                f"y must have exactly 2 classes, got {classes.size} class(es) {classes.tolist()[:10]}. "
                "Only binary classification is supported: BayesianSVC is a binary classifier (wrap it "
                "in sklearn.multiclass.OneVsRestClassifier for more classes)."
            )
        frame = self._frame(X)
        response = "y"
        while response in frame.columns:
            response += "_"
        frame[response] = (y == classes[1]).astype(int)
        fitter = svm if self.kernel is None else gpsvm
        self.fit_ = fitter(f"{response} ~ .", data=frame, **kwargs)
        self.classes_ = classes
        return self

    def decision_function(self, X):
        """Posterior mean of the score f(x); positive values favour ``classes_[1]``.

        Parameters
        ----------
        X : array-like or pandas.DataFrame of shape (n_samples, n_features)
            Rows to score, with the columns seen in :meth:`fit`.

        Returns
        -------
        scores : ndarray of shape (n_samples,)
            ``fit_.predict(kind="score")["mean"]``.
        """
        return self._predict(X, "score")["mean"].to_numpy()

    def predict_proba(self, X):
        """Class probabilities ``P(y = c | x, data)``, columns in ``classes_`` order.

        The second column is ``fit_.predict(kind="prob")``: the posterior predictive
        probability of ``classes_[1]``, which accounts for the uncertainty of the score.

        Parameters
        ----------
        X : array-like or pandas.DataFrame of shape (n_samples, n_features)
            Rows to predict, with the columns seen in :meth:`fit`.

        Returns
        -------
        proba : ndarray of shape (n_samples, 2)
            Rows sum to 1.
        """
        p = np.asarray(self._predict(X, "prob"), dtype=float)
        return np.column_stack([1.0 - p, p])

    def predict(self, X):
        """Predicted class labels: ``classes_[1]`` where the posterior mean score is positive.

        Parameters
        ----------
        X : array-like or pandas.DataFrame of shape (n_samples, n_features)
            Rows to classify, with the columns seen in :meth:`fit`.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Elements of ``classes_``.
        """
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(int)]

    # ------------------------------------------------------------------ helpers
    def _fit_kwargs(self):
        """Keyword arguments of svm / gpsvm, checked before any work is done."""
        options = {} if self.options is None else self.options
        if not isinstance(options, dict):
            raise InputTypeError(f"options must be a dict of keyword arguments or None, got {options!r}.")
        clash = sorted(set(options) & set(_OWN))
        if clash:
            raise InputError(
                f"options may not set {clash}; pass them as BayesianSVC parameters "
                f"(formula and data are built by fit)."
            )
        kwargs = dict(options, method=self.method, draws=self.draws, chains=self.chains,
                      seed=self.seed, progress=self.progress)
        if self.tune is not None:
            kwargs["tune"] = self.tune
        if self.kernel is None:
            if self.n_inducing is not None:
                raise InputError(
                    f"n_inducing={self.n_inducing!r} applies to the GP SVM only; set kernel (e.g. "
                    "kernel='rbf') or leave n_inducing=None."
                )
            kwargs["penalty"] = self.penalty
        else:
            if not (isinstance(self.penalty, str) and self.penalty == "auto"):
                raise InputError(
                    f"penalty={self.penalty!r} applies to the linear SVM only; with kernel="
                    f"{self.kernel!r} the GP prior regularizes the fit. Leave penalty='auto'."
                )
            kwargs.update(kernel=self.kernel, n_inducing=self.n_inducing)
        return kwargs

    def _columns(self):
        """The frame's own column names when they are plain identifiers, else x0 .. x{p-1}."""
        names = getattr(self, "feature_names_in_", None)
        if names is not None and all(n.isidentifier() and not keyword.iskeyword(n) and n != "Intercept"
                                     for n in names):
            return list(names)
        return [f"x{j}" for j in range(self.n_features_in_)]

    def _frame(self, X):
        return pd.DataFrame(X, columns=self._columns())

    def _predict(self, X, kind):
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, dtype="numeric", reset=False)
        return self.fit_.predict(self._frame(X), kind=kind)
