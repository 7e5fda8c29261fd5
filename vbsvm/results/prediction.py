"""Predictions of the linear fits: the score of new rows, class labels and probabilities.

Probabilities. The SVM pseudo-likelihood is not a model of ``P(y | x)``. ``predict(kind="prob")``
is the class probability of the probit predictive that Wenzel et al. (2017) use for the GP SVM,
``P(y = +1 | x) = E[Phi(f(x))] = Phi(m / sqrt(1 + s^2))`` with m and s the posterior mean and sd
of the score. ``kind="prob_positive"`` keeps the posterior probability that the score is
positive, ``P(f(x) > 0 | data)`` (under VB ``Phi(m / s)``, under Gibbs the fraction of draws):
how sure the posterior is about the side of the boundary, not a class frequency.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from vbsvm.exceptions import InputError
from vbsvm.formula.design import check_frame
from vbsvm.results.contract import check_na_action, check_new_levels, fill_rows

__all__ = ["PredictionMixin", "calibration_scale", "fit_probit_calibration", "probit_predictive"]


class PredictionMixin:
    """Prediction of a linear fit (:class:`~vbsvm.results.fit.Fit`) from its posterior's score moments."""

    def _new_rows(self, newdata, allow_missing=False, new_levels="zero"):
        """Dense design rows (fixed effects and the smaller random-effect terms' columns) on the
        original scale, and ``(codes, Z)`` of the eliminated term (codes -1 for unseen levels)."""
        X = self.design.new_X(newdata, standardized=False, allow_missing=allow_missing)
        lay = self.layout
        n = X.shape[0]
        dense = np.zeros((n, lay.n_dense))
        dense[:, : lay.p] = X
        terms = self.design.new_random_effects(newdata, new_levels) if lay.groups else []
        sparse = None
        for g, (c, Z) in zip(self.design.groups, terms):
            levels, ix = lay.groups[g.name]
            if g.name == lay.sparse_group:
                sparse = (c, Z)
            else:
                seen = np.flatnonzero(c >= 0)
                q = Z.shape[1]
                for j in range(q):
                    dense[seen, ix[c[seen] * q + j]] = Z[seen, j]
        return dense, sparse

    def new_level_variance(self, newdata) -> np.ndarray:
        """Variance each row of ``newdata`` gains from the random effects of levels not seen in
        training, averaged over the group's distribution: ``z' E[Sigma_k] z`` summed over terms
        (``E[sigma2_k] z^2`` for a one-column term), 0 for seen levels."""
        extra = np.zeros(len(newdata))
        if not self.layout.groups:
            return extra
        covs = self._covariance_draws()
        vc = self.varcomp()
        for g, (codes, Z) in zip(self.design.groups, self.design.new_random_effects(newdata, "integrate")):
            new = codes < 0
            if not new.any():
                continue
            if g.name in covs:
                S = covs[g.name].mean(axis=0)
                extra[new] += np.einsum("ij,jk,ik->i", Z[new], S, Z[new])
            else:
                extra[new] += vc.loc[f"sigma2_{g.name}", "mean"] * Z[new, 0] ** 2
        return extra

    def predict_score(self, newdata, new_levels="integrate", na_action="pass"):
        """Mean and sd of the score ``f(x)`` for each row of ``newdata`` (DataFrame); rows of a
        level not seen in training, and rows with missing values, are handled as ``new_levels``
        and ``na_action`` say (see :meth:`predict`)."""
        check_new_levels(new_levels)
        newdata, keep = self._rows_to_predict(newdata, na_action)
        rows = newdata.iloc[keep]
        mean, sd = self._score_moments(*self._new_rows(rows, new_levels=new_levels))
        if new_levels == "integrate":
            sd = np.sqrt(np.nan_to_num(sd) ** 2 + self.new_level_variance(rows))
        return fill_rows(pd.DataFrame({"mean": mean, "sd": sd}, index=rows.index), newdata, keep, na_action)

    def training_score(self, rows: slice = slice(None)):
        """Mean and sd of the score of the training rows ``rows`` (a slice of ``design.raw``): the
        numbers of ``predict_score(design.raw.iloc[rows], new_levels="zero")``, without its frame
        (to rounding with fixed effects only, whose rows are the design's, back on their scale).
        Every training row has the values the model needs (rows missing any were dropped, imputed
        or refused when the design was built), so none is set aside.

        Returns
        -------
        mean, sd : numpy.ndarray
        """
        design = self.design
        plain = type(self)._new_rows is PredictionMixin._new_rows  # (an imputing fit has its own rows)
        if plain and not self.layout.groups and self.layout.n_dense == design.p and not design.missing_mask.any():
            # fixed effects only: the design's own rows back on the original scale, without
            # materializing the formula on the frame again
            return self._score_moments(design.X[rows] * design.scale + design.center, None)
        return self._score_moments(*self._new_rows(design.raw.iloc[rows], new_levels="zero"))

    def _rows_to_predict(self, newdata, na_action):
        """``newdata`` (checked) and the positions of its rows the fit can predict: all of them
        but the rows with a missing value the model cannot fill (those raise for
        ``na_action="raise"``)."""

        check_na_action(na_action)
        newdata = check_frame(newdata, "newdata")
        incomplete = self.design.incomplete_rows(newdata, imputable=self.settings.get("missing") == "impute")
        if incomplete.any() and na_action == "raise":
            rows = newdata.iloc[np.flatnonzero(incomplete)]
            cols = [c for c in self.design.raw.columns
                    if c != self.design.response and c in rows.columns and rows[c].isna().any()]
            raise InputError(
                f"newdata has {int(incomplete.sum())} row(s) with missing values in column(s) {cols}; pass "
                "na_action='pass' (NaN predictions for those rows) or na_action='drop', or fill them "
                "(models fitted with missing='impute' fill missing predictors themselves)."
            )
        return newdata, np.flatnonzero(~incomplete)

    def _score_moments(self, dense, sc):
        """Posterior mean and sd of the score of new rows (dense part, eliminated term's
        ``(codes, Z)``); NaN sds for a mode."""
        return self._post.score_moments(dense, sc)

    def _prob_positive(self, newdata, new_levels, mean, sd):
        """``P(f(x) > 0 | data)`` of rows the fit can predict (score moments ``mean``, ``sd``)."""
        return self._post.prob_positive(
            lambda: self._new_rows(newdata, new_levels="zero" if new_levels == "integrate" else new_levels),
            mean, sd)

    def predict(self, newdata=None, kind="class", new_levels="integrate", na_action="pass"):
        """Predict new data.

        Parameters
        ----------
        newdata : pandas.DataFrame, optional
            Rows to predict; default the training data. Grouping columns are used when present.
            Infinite predictor values raise :class:`~vbsvm.exceptions.InputError`.
        kind : {"class", "prob", "prob_positive", "score"}
            ``"class"``: the predicted response label (the original values, e.g. ``"spam"``),
            by the sign of the posterior mean score; ``"prob"``: the class probability
            ``P(y = +1 | x, data) = E[Phi(a f(x) + b)] = Phi((a m + b) / sqrt(1 + a^2 s^2))`` with m
            and s the posterior mean and sd of the score (with a = 1, b = 0 the predictive of
            Wenzel et al. 2017) and ``(a, b) = fit.info["prob_calibration"]`` fitted on the
            training rows (:func:`fit_probit_calibration`; a MAP fit has s = 0); ``"prob_positive"``: ``P(f(x) > 0 | data)``, how sure the
            posterior is of the side of the boundary (not a class frequency); ``"score"``:
            DataFrame with the mean and sd of the score.
        new_levels : {"integrate", "zero", "error"}
            Rows whose grouping level was not seen in training: ``"integrate"`` (default) averages
            over the group's distribution (the score's variance gains ``z' E[Sigma] z``, as brms'
            ``sample_new_levels``; the mean is the population-level one), ``"zero"`` sets their
            random effect to 0 (lme4's ``re.form = NA`` for those rows; warns), ``"error"`` raises.
        na_action : {"pass", "drop", "raise"}
            Rows with a missing value in a column the formula uses (other than missing predictors
            that a ``missing="impute"`` fit integrates over): ``"pass"`` (default, R's
            ``na.pass``) predicts them as NaN, keeping every row in place; ``"drop"`` leaves them
            out of the result (R's ``na.omit``); ``"raise"`` raises
            :class:`~vbsvm.exceptions.InputError`.

        Returns
        -------
        pandas.Series or pandas.DataFrame
            Indexed like ``newdata`` (without the dropped rows for ``na_action="drop"``).
        """
        if kind not in ("class", "prob", "prob_positive", "score"):
            raise InputError(f"kind must be 'class', 'prob', 'prob_positive' or 'score'; got {kind!r}.")
        check_new_levels(new_levels)
        newdata, keep = self._rows_to_predict(self.design.raw if newdata is None else newdata, na_action)
        out = self._predict_rows(newdata.iloc[keep], kind, new_levels)
        return fill_rows(out, newdata, keep, na_action)

    def _predict_rows(self, newdata, kind, new_levels):
        """:meth:`predict` for rows the fit can predict (every value the model needs present)."""
        score = self.predict_score(newdata, new_levels=new_levels)
        if kind == "score":
            return score
        name = f"P({self.design.response}={self.design.positive_level!r})"
        if kind == "class":
            labels = np.where(score["mean"].to_numpy() > 0, 1, 0)
            values = np.array([self.design.negative_level, self.design.positive_level], dtype=object)[labels]
            return pd.Series(values, index=newdata.index, name=self.design.response)
        m, sd = score["mean"].to_numpy(), np.nan_to_num(score["sd"].to_numpy())
        if kind == "prob":
            a, b = self.info.get("prob_calibration", (1.0, 0.0))
            return pd.Series(probit_predictive(m, sd, a, b), index=newdata.index, name=name)
        if self._post.point:
            raise InputError(
                "kind='prob_positive' needs a posterior; a method='map' fit has only the mode. Refit with "
                "method='vb' or method='gibbs', or use kind='prob' or kind='score'."
            )
        prob = self._prob_positive(newdata, new_levels, m, sd)
        return pd.Series(prob, index=newdata.index, name=f"P(score > 0) for {name}")


def probit_predictive(m, s, a=1.0, b=0.0) -> np.ndarray:
    """``P(y = +1) = E[Phi(a f + b)] = Phi((a m + b) / sqrt(1 + a^2 s^2))`` for a score
    ``f ~ N(m, s^2)``; ``a = 1, b = 0`` is the predictive of Wenzel et al. (2017)."""
    return stats.norm.cdf((a * np.asarray(m) + b) / np.sqrt(1.0 + (a * np.asarray(s)) ** 2))


def fit_probit_calibration(m, s, y):
    """Maximum-likelihood scale ``a`` of :func:`probit_predictive` (shift ``b = 0``) for labels
    ``y`` in {-1, +1} on the training rows; returns ``(a, 0.0)``.

    The SVM's scores cluster near +-1 whatever the class frequencies (the hinge's population
    minimizer is ``sign(2 p - 1)``), so ``Phi(f)`` alone is over-confident: calibration slopes
    0.58-0.79 on the Raetsch sets, against 0.82-1.04 for logistic regression
    (``benchmarks/results/calibration.md``). A fitted scale brought the Brier score within 0.01
    of logistic regression's on 9 of 13 sets there (a scale and a shift: 10 of 13); the shift is
    left out so that ``P(y = +1) > 1/2`` exactly where the predicted class is +1.
    """
    from scipy.special import log_ndtr

    m, s, y = (np.asarray(v, dtype=float) for v in (m, np.nan_to_num(s), y))

    def nll(log_a):
        a = math.exp(log_a)
        return -float(log_ndtr(y * a * m / np.sqrt(1.0 + (a * s) ** 2)).sum())

    return calibration_scale(nll)


def calibration_scale(nll):
    """``(a, 0.0)`` minimizing ``nll(log a)`` over ``a`` in [1e-3, 1e3] (the search of
    :func:`fit_probit_calibration`, shared with fits whose rows are summed elsewhere, e.g. over the
    partitions of a Dask frame); ``a = 1`` if the search fails."""
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(nll, bounds=(math.log(1e-3), math.log(1e3)), method="bounded")
    return (float(math.exp(res.x)) if res.success and np.isfinite(res.x) else 1.0), 0.0

