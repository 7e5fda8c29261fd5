"""Predictions of a fitted sparse-GP SVM: the latent score, class probabilities and classes
for new rows (in memory or a Dask frame), and the pointwise log terms LOO reads (mixed into
:class:`~vbsvm.results.gp.GPFit`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import log_ndtr, ndtr

from vbsvm.exceptions import InputError
from vbsvm.models.gp import (
    gp_columns,
    predictive_prob,
)
from vbsvm.results.contract import check_na_action, check_new_levels, fill_rows
from vbsvm.sources.dask_frames import DaskDesign, is_dask_frame, lazy_predictions

KINDS = ("class", "prob", "prob_positive", "score")


def bound_log_pseudo_likelihood(margin, kt):
    r"""Log pseudo-likelihood of the bound model in the inducing values,
    :math:`\log \tilde L = -(1 - t) - \sqrt{(1 - t)^2 + \tilde k}` with ``margin`` :math:`t = y\kappa u`
    (the GIG integral of the augmented bound over :math:`\lambda`; the hinge
    :math:`-2 (1 - t)_+` when :math:`\tilde k = 0`), computed without cancellation."""
    r = 1.0 - np.asarray(margin, dtype=float)
    root = np.sqrt(r * r + kt)
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = -kt / np.where(r < 0, root - r, 1.0)  # -r - root for r < 0, without cancellation
    return np.where(r < 0, inside, -r - root)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


class GPPredictionMixin:
    """Predictions of :class:`~vbsvm.results.gp.GPFit` (see the module docstring)."""

    def _X(self, newdata):
        if isinstance(newdata, pd.DataFrame) and self.design is not None:
            Xn = self.design.new_X(newdata)
            _, keep = gp_columns(self.design)
            return np.ascontiguousarray(Xn[:, keep]), newdata.index
        Xn = np.asarray(newdata, dtype=float)
        if Xn.ndim != 2 or Xn.shape[1] != self.n_features:
            raise InputError(f"newdata must be a DataFrame with the formula's columns or an "
                             f"(n, {self.n_features}) array of standardized predictors")
        return Xn, None

    def predict_f(self, newdata):
        """Mean and variance of the latent score f at new rows (Gibbs: over the draws)."""
        X, _ = self._X(newdata)
        if self.gibbs_draws is None:
            return self.blocks.predict_f(X, self.q)
        A, kt = self.blocks.project(X)
        F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
        return F.mean(0), F.var(0) + kt

    def _complete(self, newdata, na_action):
        """Positions of the rows of ``newdata`` without a missing predictor (the others raise for
        ``na_action="raise"``)."""
        if isinstance(newdata, pd.DataFrame):
            if self.design is not None:
                incomplete = self.design.incomplete_rows(newdata)
            else:
                incomplete = newdata.isna().any(axis=1).to_numpy()
        else:
            values = np.asarray(newdata, dtype=float)
            incomplete = np.isnan(values).any(axis=1) if values.ndim == 2 else np.zeros(len(values), bool)
        if incomplete.any() and na_action == "raise":
            raise InputError(f"newdata has {int(incomplete.sum())} row(s) with missing values; pass "
                             "na_action='pass' (NaN predictions for those rows) or na_action='drop', or fill them.")
        return np.flatnonzero(~incomplete)

    def predict(self, newdata=None, kind="class", new_levels="integrate", na_action="pass",
                normalization="probit"):
        """Predict at new data.

        Parameters
        ----------
        newdata : DataFrame or array, optional
            Default: the training data (needs the design).
        kind : {"class", "prob", "prob_positive", "score"}
            ``"class"``: the response level of sign(E f); ``"prob"``: approximate predictive
            probability of the positive level, Phi(m / sqrt(1 + v)) (see
            :func:`vbsvm.models.gp.predictive_prob`; for Gibbs the mean over draws of
            Phi(f / sqrt(1 + k~))); ``"prob_positive"``: ``P(f(x) > 0 | data)`` (VB/SVI: Phi(m /
            sqrt(v)); Gibbs: the mean over draws of Phi(f / sqrt(k~))); ``"score"``: DataFrame
            with the predictive mean and sd of f.
        new_levels : {"integrate", "zero", "error"}
            Accepted for the signature the linear fits share; the GP has no random effects.
        na_action : {"pass", "drop", "raise"}
            Rows with a missing predictor: predicted as NaN (``"pass"``), left out (``"drop"``)
            or an :class:`~vbsvm.exceptions.InputError` (``"raise"``).
        normalization : {"probit", "paper"}
            ``"paper"`` reproduces eq. (13) as printed (Phi(m / (1 + v))).
        """
        check_new_levels(new_levels)
        check_na_action(na_action)
        if kind not in KINDS:
            raise InputError(f"kind={kind!r}; use 'class', 'prob', 'prob_positive' or 'score'")
        if newdata is None:
            if self.design is None or getattr(self.design, "raw", None) is None:
                raise InputError("predict() without newdata needs a formula fit; pass newdata")
            if isinstance(self.design, DaskDesign):
                raise InputError("this fit was made from a Dask DataFrame and keeps no rows: pass newdata "
                                 "(e.g. fit.predict(data), lazily evaluated for a Dask frame).")
            newdata = self.design.raw
        if is_dask_frame(newdata):
            if self.design is None:
                raise InputError("predicting a Dask DataFrame needs a formula fit.")
            return lazy_predictions(newdata, self.design, kind, lambda frame: self.predict(
                frame, kind=kind, new_levels=new_levels, na_action=na_action, normalization=normalization))
        keep = self._complete(newdata, na_action)
        n = len(newdata)
        frame = isinstance(newdata, pd.DataFrame)
        rows = (newdata.iloc[keep] if frame else np.asarray(newdata, dtype=float)[keep]) if len(keep) < n else newdata
        out = self._predict_rows(rows, kind, normalization)
        if len(keep) == n:
            return out
        if isinstance(out, (pd.Series, pd.DataFrame)):
            return fill_rows(out, newdata, keep, na_action)
        if na_action == "drop":
            return out
        full = np.full(n, np.nan)
        full[keep] = out
        return full

    def _predict_rows(self, newdata, kind, normalization):
        """:meth:`predict` of rows without missing predictors."""
        X, index = self._X(newdata)
        mean, var = self.predict_f(X)
        named = self.design is not None and index is not None
        if kind == "score":
            return pd.DataFrame({"mean": mean, "sd": np.sqrt(var)}, index=index)
        if kind == "class":
            lab = np.where(mean >= 0, 1, -1)
            if named:
                vals = np.where(lab > 0, self.design.positive_level, self.design.negative_level)
                return pd.Series(vals, index=index, name=self.design.response)
            return lab
        if kind == "prob":
            if self.gibbs_draws is not None and normalization == "probit":
                A, kt = self.blocks.project(X)
                F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
                p = ndtr(F / np.sqrt(1.0 + kt)).mean(0)
            else:
                p = predictive_prob(mean, var, normalization)
            name = f"P({self.design.response}={self.design.positive_level!r})" if named else None
        else:  # prob_positive
            with np.errstate(divide="ignore", invalid="ignore"):
                if self.gibbs_draws is not None:
                    A, kt = self.blocks.project(X)
                    F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
                    p = ndtr(F / np.sqrt(kt)).mean(0)
                else:
                    p = ndtr(mean / np.sqrt(var))
            name = (f"P(score > 0) for P({self.design.response}={self.design.positive_level!r})"
                    if named else None)
        return pd.Series(p, index=index, name=name) if named else p

    def _training_margins(self):
        """``y_i kappa_i u`` for each draw and training row (chains, draws, n), the residual
        variances ``k~`` (n,) and the labels."""
        rows = self.training_rows()
        if rows is None:
            raise InputError("loo() and the log likelihood need the training rows, which this GP fit does not keep "
                             "(fitted on arrays, a stream or a Dask frame, or loaded from a file): refit with "
                             "vbsvm.gpsvm(formula, data) on a pandas DataFrame.")
        X, _ = self._X(rows)
        A, kt = self.blocks.project(X)
        y = np.asarray(self.design.y, dtype=float)
        return y * (self._v_draws() @ A.T), kt, y

    def pointwise_log_terms(self):
        """``(log_pseudo, log_prob)`` per draw and training row (see
        :meth:`vbsvm.results.contract.FitResult.loo`): the bound model's pseudo-likelihood
        (:func:`bound_log_pseudo_likelihood`) and ``log Phi(y kappa u / sqrt(1 + k~))``."""
        T, kt, _ = self._training_margins()
        return bound_log_pseudo_likelihood(T, kt), log_ndtr(T / np.sqrt(1.0 + kt))
