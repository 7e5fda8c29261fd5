"""The fitted-model object of the linear Bayesian SVMs: coefficients, summary, predictions,
ArviZ export and saving.

A :class:`Fit` keeps the posterior on the **original scale** of the predictors (the internal
standardization is undone once, when the fit is made), so predictions, summaries and saved files
all use the same numbers:

* ``method="vb"``: the Gaussian q(theta) (mean, dense covariance, the cross-covariance with the
  largest grouping factor and that factor's variances) and the inverse-gamma q of each variance;
* ``method="gibbs"``: the draws, shape ``(chains, draws, ...)``;
* ``method="map"``: the posterior mode.

Probabilities. The SVM pseudo-likelihood is not a model of ``P(y | x)``. ``predict(kind="prob")``
is the class probability of the probit predictive that Wenzel et al. (2017) use for the GP SVM,
``P(y = +1 | x) = E[Phi(f(x))] = Phi(m / sqrt(1 + s^2))`` with m and s the posterior mean and sd
of the score. ``kind="prob_positive"`` keeps the posterior probability that the score is
positive, ``P(f(x) > 0 | data)`` (under VB ``Phi(m / s)``, under Gibbs the fraction of draws):
how sure the posterior is about the side of the boundary, not a class frequency.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats
from scipy.special import log_ndtr

from vbsvm import validation
from vbsvm._version import __version__
from vbsvm.exceptions import DiagnosticWarning, FitFileError, InputError
from vbsvm.formula.design import build_design, check_frame
from vbsvm.formula.encoding import column_name, storable_columns
from vbsvm.inference.gibbs import ESS_TARGET, RHAT_TARGET
from vbsvm.io.fit_file import check_rebuilt, check_settings, check_storable, write_atomically
from vbsvm.posterior import linear_response as lr
from vbsvm.posterior.representations import add_sparse_score, posterior_of
from vbsvm.results.contract import (
    FitResult,
    SummaryParts,
    check_na_action,
    check_new_levels,
    fill_rows,
)
from vbsvm.results.marginal import Marginal
from vbsvm.results.summary import describe, linear_summary_parts, penalty_description
from vbsvm.settings import FitSettings

__all__ = ["Fit", "ThetaLayout"]


@dataclass
class ThetaLayout:
    """Where each coefficient sits in the vector theta = (fixed effects, random intercepts).

    Attributes
    ----------
    fixed : list of str
        Names of the fixed effects (the first ``len(fixed)`` coordinates).
    groups : dict
        Grouping-factor name -> (levels, coordinate indices).
    n_dense : int
        Number of coordinates handled densely (fixed effects and the smaller factors).
    sparse_group : str or None
        The factor eliminated by the Schur complement (its coordinates come last).
    variances : list of str
        Names of the inferred variance components, e.g. ``["sigma2_u", "sigma2_patient_id"]``.
    re_columns : dict
        Random-effect term name -> its column names (``["Intercept", "time"]``); a term's
        coordinates are ordered level by level (``l q + j``). Absent terms: ``["Intercept"]``.
    covariances : list of str
        Names of the terms with a q x q covariance (q > 1 columns), in the model's order.
    """

    fixed: list
    groups: dict
    n_dense: int
    sparse_group: str | None
    variances: list
    re_columns: dict = field(default_factory=dict)
    covariances: list = field(default_factory=list)

    @classmethod
    def from_model(cls, model, design, variances=None) -> "ThetaLayout":
        """The layout of a :class:`~vbsvm.models.linear.LinearSVMModel` built from ``design``."""
        groups = {g.name: (g.levels, model.group_slices[g.name]) for g in design.groups}
        sparse = design.groups[model.sparse_group].name if model.sparse_group is not None else None
        if variances is None:
            variances = [c.name for c in model.variance_components]
        return cls(fixed=list(design.column_names), groups=groups, n_dense=model.qd,
                   sparse_group=sparse, variances=list(variances),
                   re_columns={g.name: list(g.columns) for g in design.groups},
                   covariances=[g.name for g in design.groups if g.q > 1])

    def columns_of(self, name) -> list:
        """Column names of random-effect term ``name``."""
        return self.re_columns.get(name, ["Intercept"])

    @property
    def p(self) -> int:
        return len(self.fixed)

    @property
    def q(self) -> int:
        return self.n_dense + (len(self.groups[self.sparse_group][1]) if self.sparse_group else 0)

    def to_dict(self):
        return {
            "fixed": list(self.fixed),
            "groups": {k: [[_jsonable(x) for x in lv], [int(i) for i in ix]] for k, (lv, ix) in self.groups.items()},
            "n_dense": int(self.n_dense),
            "sparse_group": self.sparse_group,
            "variances": list(self.variances),
            "re_columns": {k: list(v) for k, v in self.re_columns.items()},
            "covariances": list(self.covariances),
        }

    @classmethod
    def from_dict(cls, d):
        groups = {k: (np.array(lv, dtype=object), np.array(ix, dtype=np.int64)) for k, (lv, ix) in d["groups"].items()}
        return cls(d["fixed"], groups, d["n_dense"], d["sparse_group"], d["variances"],
                   d.get("re_columns", {}), d.get("covariances", []))


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return x


def interval_names(level):
    lo = 100 * (1 - level) / 2
    return f"{lo:g}%", f"{100 - lo:g}%"


@dataclass
class Fit(FitResult):
    """A fitted linear Bayesian SVM (see :func:`vbsvm.svm`).

    Use the attributes and methods below (and those of the result contract,
    :class:`~vbsvm.results.contract.FitResult`: ``params``, ``bse``, ``conf_int``, ``cov_params``,
    ``loo``, ``compare``); the constructor is internal.
    """

    design: object
    layout: ThetaLayout
    settings: FitSettings
    method: str
    posterior: dict
    info: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        # the settings are one frozen, checked object (a mapping given here is checked into one)
        self.settings = FitSettings.from_mapping(self.settings)

    # ------------------------------------------------------------------ basics
    @property
    def elbo(self):
        """ELBO after each accepted VB iterate (``None`` for Gibbs and MAP fits)."""
        return self._post.elbo

    @property
    def n_obs(self) -> int:
        return self.design.n

    @property
    def formula(self) -> str:
        """The formula of the fit."""
        return self.design.formula

    def _cached(self, key, make):
        """``make(self)``, computed once per fit (kept in ``_cache``, which a copy made with
        :func:`dataclasses.replace` does not share)."""
        if key not in self._cache:
            self._cache[key] = make(self)
        return self._cache[key]

    @property
    def _post(self):
        """The posterior as an object that does not depend on the method's arrays
        (:func:`vbsvm.posterior.representations.posterior_of`)."""
        return self._cached("posterior_object", posterior_of)

    def _theta_draws(self):
        return self._post.theta_draws()

    def _marginals(self, index, level):
        """mean, sd, lower, upper of coordinates ``index`` of theta."""
        return self._post.theta_marginals(index, level)

    def _table(self, names, index, level):
        mean, sd, lo, hi = self._marginals(np.asarray(index), level)
        lo_name, hi_name = interval_names(level)
        index = names if isinstance(names, pd.Index) else pd.Index(names, name="term")
        return pd.DataFrame({"mean": mean, "sd": sd, lo_name: lo, hi_name: hi}, index=index)

    @property
    def coef(self) -> pd.DataFrame:
        """Fixed effects on the original scale: posterior mean, sd and a central 95% credible
        interval (VB: Gaussian q; Gibbs: equal-tailed posterior quantiles; MAP: the mode only)."""
        return self.coef_table()

    def coef_table(self, level=None) -> pd.DataFrame:
        """:attr:`coef` at another interval ``level``."""
        level = self._level(level)
        return self._table(self.layout.fixed, np.arange(self.layout.p), level)

    def coefficient_covariance(self) -> np.ndarray:
        """Posterior covariance of the fixed effects: the Gaussian q's block under VB, the draws'
        under Gibbs (and a Laplace-zero VB fit, whose q is not Gaussian), NaN for a mode."""
        return self._post.coefficient_covariance(self.layout.p)

    def ranef(self, level=None) -> dict:
        """Random intercepts: one DataFrame per grouping factor (like ``lme4::ranef``)."""
        level = self._level(level)
        out = {}
        for name, (lv, ix) in self.layout.groups.items():
            cols = self.layout.columns_of(name)
            names = list(lv) if len(cols) == 1 else pd.MultiIndex.from_tuples(
                [(v, c) for v in lv for c in cols], names=["level", "coef"])
            out[name] = self._table(names, ix, level)
        return out

    def varcomp(self, level=None) -> pd.DataFrame:
        """Inferred variances (and the penalty ``alpha = 1 / (4 sigma2_u)``) with intervals."""
        level = self._level(level)
        lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
        lo_name, hi_name = interval_names(level)
        rows = self._post.variance_rows(lo_q, hi_q)
        for name, S in self._covariance_draws().items():
            cols = self.layout.columns_of(name)
            for j, c in enumerate(cols):
                d = S[:, j, j]
                rows[f"sigma2_{name}[{c}]"] = self._post.summarize(d, lo_q, hi_q)
            for j, k in zip(*np.tril_indices(len(cols), -1)):
                d = S[:, j, k] / np.sqrt(S[:, j, j] * S[:, k, k])
                rows[f"cor_{name}[{cols[k]},{cols[j]}]"] = self._post.summarize(d, lo_q, hi_q)
        out = pd.DataFrame.from_dict(rows, orient="index", columns=["mean", "sd", lo_name, hi_name])
        out.index.name = "parameter"
        return out

    def _covariance_draws(self) -> dict:
        """Term name -> draws (k, q, q) of its random-effect covariance: Gibbs draws, iid draws from
        the IW q of VB (``chains x draws`` of them, seeded at fit time), or the mode (k = 1)."""
        return self._post.covariance_draws()

    # ------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> pd.DataFrame | None:
        """R-hat (rank-normalized), bulk/tail ESS and MCSE of every parameter (Gibbs only)."""
        if not self._post.sampled:
            return None
        if "diagnostics" not in self._cache:
            self._cache["diagnostics"] = self._compute_diagnostics()
        return self._cache["diagnostics"].copy()

    def _compute_diagnostics(self) -> pd.DataFrame:
        post = self._posterior_dataset()
        if "summary_diagnostics" in self._cache and all(is_summary_variable(v) for v in post.data_vars):
            return self._cache["summary_diagnostics"].copy()  # the fit's warning check made this very table
        return diagnostics_table(post)

    def summary_diagnostics(self) -> pd.DataFrame | None:
        """:meth:`diagnostics` of the summary parameters only: the fixed effects ``beta[...]`` and
        the variance components ``sigma2*`` (not the random-effect levels, imputations or
        indicators). Gibbs runs are extended until these reach R-hat <= 1.01 and bulk ESS >= 400
        (see ``max_draws`` of :func:`vbsvm.svm`), and the fit warns if they do not."""
        if not self._post.sampled:
            return None
        if "summary_diagnostics" not in self._cache:
            post = self._posterior_dataset()
            with np.errstate(invalid="ignore", divide="ignore"):  # a constant (an excluded term): NaN
                self._cache["summary_diagnostics"] = diagnostics_table(
                    post[[v for v in post.data_vars if is_summary_variable(v)]])
        return self._cache["summary_diagnostics"].copy()

    def _warn_diagnostics(self):
        """Warn if the summary parameters miss R-hat <= 1.01 or bulk ESS >= 400 (see
        :func:`warn_unconverged`)."""
        diag = self.summary_diagnostics()
        if diag is not None:
            warn_unconverged(diag, int(self.posterior["theta_draws"].shape[1]), self.info, stacklevel=5,
                             hint=self._separable_hint)

    def _separable_hint(self) -> str:
        """The cause a Gibbs fit with ``penalty="auto"`` misses its targets on separable data (an
        empty string otherwise): the pseudo-likelihood is 1 on a cone of separating coefficients,
        so the posterior of ``sigma2_u`` keeps the tail ``sigma2_u^(-A_u - 1)`` of its prior and
        the coefficients' posterior means do not exist for ``A_u <= 1/2`` (the Section 4.2
        simulation with d = 100: ``sigma2_u`` draws around 1e3-1e4, against 0.6 with d = 50)."""
        s = self.settings
        if s.get("penalty") != "auto" or s.get("prior") is not None or "sigma2_u" not in self.layout.variances:
            return ""
        if not self.design.linearly_separable():
            return ""
        draws = self._draws()[1][..., list(self.layout.variances).index("sigma2_u")]
        return (f" The data are linearly separable, so under penalty='auto' the posterior of sigma2_u keeps the "
                f"tail of its IG({s['A_u']:g}, {s['B_u']:g}) prior (the coefficients' posterior means do not exist "
                f"for A_u <= 1/2); its draws here have median {np.median(draws):.3g} and reach "
                f"{np.max(draws):.3g}. Where they are that large and do not settle, longer chains will not help: "
                "fix the penalty (penalty=<float>) instead.")

    # ------------------------------------------------------------------ prediction
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

    # ------------------------------------------------------------------ summary
    def summary_parts(self, level) -> SummaryParts:
        """The header, coefficient and variance tables, the model's sections
        (:meth:`summary_tables`) and notes of :meth:`summary`."""
        return SummaryParts(*linear_summary_parts(self, level))

    def prior_description(self):
        """``(label, text)`` of the prior line in the summary header."""

        return "Penalty:", penalty_description(self.settings)

    def summary_tables(self, level) -> list:
        """Extra ``(title, DataFrame)`` sections of :meth:`summary` (models with more blocks
        override this)."""
        return list(self.info.get("summary_tables", []))

    def __repr__(self):
        """A short description (model, method, formula, coefficients); :meth:`summary` has the tables."""

        return describe(self, self.coef["mean"], self._description_lines())

    def _description_lines(self) -> list:
        """Lines a model adds to ``repr(fit)`` after the coefficients."""
        return [f"{name}: {len(levels)} groups" for name, (levels, _) in self.layout.groups.items()]

    # ------------------------------------------------------------------ draws and marginals
    @property
    def draw_shape(self) -> tuple:
        """``(chains, draws)`` of the posterior draws (a mode: ``(1, 1)``)."""
        return tuple(int(v) for v in self._post.shape)

    @property
    def sampled(self) -> bool:
        """True for Gibbs fits (a Markov chain's draws)."""
        return bool(self._post.sampled)

    @property
    def point(self) -> bool:
        """True for a posterior mode (``method="map"``)."""
        return bool(self._post.point)

    def with_draw_shape(self, chains, draws) -> "Fit":
        """The fit with ``(chains, draws)`` iid draws from q by default (a new object built from
        the same posterior arrays, sharing no cache); Gibbs and MAP fits return themselves."""
        if self.sampled or self.point:
            return self
        return dataclasses.replace(self, settings={**self.settings, "chains": int(chains), "draws": int(draws)})

    def draws(self, chains=None, draws=None, seed=None) -> xr.Dataset:
        """Posterior draws, the ``posterior`` group of :meth:`to_arviz` (see
        :meth:`vbsvm.results.contract.FitResult.draws`): ``beta`` (dim ``coef``), the variances,
        ``b_<group>``, and what the model adds (``gamma``, ``x_missing``, ...)."""
        fit = self
        if not (self.sampled or self.point) and (chains is not None or draws is not None or seed is not None):
            ch, dr = self.draw_shape
            settings = {**self.settings, "chains": int(ch if chains is None else chains),
                        "draws": int(dr if draws is None else draws)}
            if seed is not None:
                settings["draw_seed"] = int(validation.seed(seed))
            fit = dataclasses.replace(self, settings=settings)
        return fit._posterior_dataset()

    def marginals(self, ranef=False, points=None, draw_shape=None) -> dict:
        """``{name: Marginal}`` of ``beta[term]``, the variances ``sigma2*`` and, with ``ranef``,
        ``b_<group>[level]``: closed form for a Gaussian q (Gaussian coefficients, inverse-gamma
        variances), else from the draws (iid draws from q redrawn in ``draw_shape`` when that has
        more; Gibbs draws; a mode as points). ``points`` are not used (the fit has coefficients)."""
        out = {}
        law = self._post.closed_form()
        lay = self.layout
        if law is not None:
            mean, var = law["theta_mean"], law["theta_var"]
            for j, term in enumerate(lay.fixed):
                out[f"beta[{term}]"] = Marginal.gaussian(mean[j], np.sqrt(var[j]))
            for k, name in enumerate(lay.variances):
                a, b = float(np.atleast_1d(law["var_shape"])[k]), float(np.atleast_1d(law["var_scale"])[k])
                out[name] = Marginal.of_distribution(stats.invgamma(a, scale=b), lower=0.0)
            if ranef:
                for g, (levels, ix) in lay.groups.items():
                    for lv, i in zip(levels, ix):
                        out[f"b_{g}[{lv}]"] = Marginal.gaussian(mean[i], np.sqrt(var[i]))
            return out
        fit = self
        if draw_shape is not None and int(np.prod(draw_shape)) > int(np.prod(self.draw_shape)):
            fit = self.with_draw_shape(*draw_shape)
        post = fit._posterior_dataset()
        for var in post.data_vars:
            if not (var == "beta" or var.startswith("sigma2") or (ranef and var.startswith("b_"))):
                continue
            da = post[var]
            extra = [d for d in da.dims if d not in ("chain", "draw")]
            if len(extra) > 1:
                continue
            lower = 0.0 if var.startswith("sigma2") else None
            flat = da.values.reshape(da.shape[0] * da.shape[1], -1)
            labels = [f"{var}[{c}]" for c in da[extra[0]].values] if extra else [var]
            for k, name in enumerate(labels):
                x = flat[:, k]
                out[name] = Marginal.point(x[0]) if self.point else Marginal.of_draws(x, lower=lower)
        return out

    def linear_response_sd(self) -> dict | None:
        """Linear-response sds (:func:`vbsvm.posterior.linear_response.linear_response`) of a
        mean-field fit with a Gaussian q and complete data; None for other fits.

        Raises
        ------
        vbsvm.exceptions.InputError
            Above ``vbsvm.posterior.linear_response.MAX_N`` rows (the dense n x n solve), or when
            :func:`~vbsvm.posterior.linear_response.linear_response` cannot handle the model.
        """
        if (self._post.closed_form() is None or self.settings.get("missing") == "impute"
                or self.settings.get("approximation") == "calibrated"):
            return None
        if self.n_obs > lr.MAX_N:
            raise InputError(
                f"its dense {self.n_obs} x {self.n_obs} solve is skipped above {lr.MAX_N} rows (in Python, "
                "vbsvm.linear_response(fit, max_n=...) computes it if memory allows).")
        return lr.linear_response(self).sd

    def training_rows(self) -> pd.DataFrame | None:
        """The training data (the columns the formula uses, rows as fitted)."""
        return self.design.raw

    # ------------------------------------------------------------------ ArviZ
    def _draws(self):
        """Draws of theta and the variances (Gibbs draws, iid draws from the VB q, or the mode as
        one draw)."""
        return self._post.draws()

    def _posterior_dataset(self) -> xr.Dataset:
        theta, sig = self._draws()
        lay = self.layout
        data = {"beta": (("chain", "draw", "coef"), theta[..., : lay.p])}
        coords = {"coef": list(lay.fixed)}
        for name, (levels, ix) in lay.groups.items():
            coords[name] = [str(v) for v in levels]
            cols = lay.columns_of(name)
            if len(cols) == 1:
                data[f"b_{name}"] = (("chain", "draw", name), theta[..., ix])
            else:
                coords[f"{name}_coef"] = list(cols)
                data[f"b_{name}"] = (("chain", "draw", name, f"{name}_coef"),
                                     theta[..., ix].reshape(theta.shape[:2] + (len(levels), len(cols))))
        for k, name in enumerate(lay.variances):
            data[name] = (("chain", "draw"), sig[..., k])
        for name, S in self._covariance_draws().items():
            cols = lay.columns_of(name)
            S = S.reshape(theta.shape[:2] + S.shape[1:])
            j, k = np.tril_indices(len(cols), -1)
            sd = np.sqrt(np.diagonal(S, axis1=-2, axis2=-1))
            coords[f"{name}_coef"] = list(cols)
            coords[f"{name}_pair"] = [f"{cols[b]},{cols[a]}" for a, b in zip(j, k)]
            data[f"sigma2_{name}"] = (("chain", "draw", f"{name}_coef"), sd ** 2)
            data[f"cor_{name}"] = (("chain", "draw", f"{name}_pair"), S[..., j, k] / (sd[..., j] * sd[..., k]))
        ds = xr.Dataset(data, coords={"chain": np.arange(theta.shape[0]), "draw": np.arange(theta.shape[1]), **coords})
        return ds

    def to_arviz(self, log_likelihood=True):
        """The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout.

        Groups:

        * ``posterior``: ``beta`` (dim ``coef``), ``sigma2_u``, ``b_<group>``, ``sigma2_<group>``
          (:meth:`draws`); VB fits hold iid draws from q with the same (chain, draw) shape as the
          Gibbs default and q's parameters in the group's attrs;
        * ``sample_stats``: Gibbs: ``log_pseudo_likelihood`` per draw; VB: the ``elbo`` trace;
        * ``log_likelihood`` (with ``log_likelihood=True``; :meth:`save` leaves it out): ``y``
          (chain, draw, obs), per draw and training row the log of the hinge pseudo-likelihood
          normalised over the two labels (Sollich 2002), ``exp(-2 (1 - y f)_+) / (exp(-2 (1 - f)_+)
          + exp(-2 (1 + f)_+))`` (:func:`pointwise_log_likelihood`). ``arviz.loo`` on the tree is
          PSIS-LOO of that normalised model: it takes its weights from this term rather than from
          the pseudo-likelihood the posterior used, and scores the hinge's over-confident class
          probabilities (toenail random intercepts, Gibbs: elpd -605 against -504 from
          :meth:`loo` and -501 by 10-fold cross-validation, ``benchmarks/results/loo.md``). For
          model comparison use :meth:`loo` (weights ``1 / exp(-2 (1 - y f)_+)``, predictive the
          calibrated probit of ``predict(kind="prob")``): ``arviz.compare({"a": fit_a.loo(),
          "b": fit_b.loo()})``;
        * ``observed_data`` (``y`` in {-1, +1}) and ``constant_data`` (the raw columns the
          formula uses); ``vbsvm``: the posterior arrays (what :func:`vbsvm.load` rebuilds from).
        """
        post = self._posterior_dataset()
        post.attrs.update({"method": self.method, "scale": "original predictor scale",
                           "inference_library": "vbsvm"})
        post.attrs.update(self._post.arviz_attrs(self.info))
        tree = {"posterior": post}
        stats_group = self._post.sample_stats()
        if stats_group is not None:
            tree["sample_stats"] = stats_group
        if log_likelihood and not self._post.point:
            tree["log_likelihood"] = xr.Dataset(
                {"y": (("chain", "draw", "obs"), pointwise_log_likelihood(self.design.y, self._train_scores()))},
                attrs={"normalisation": "exp(-2 (1 - y f)_+) / sum over y' in {-1, +1}",
                       "loo": "fit.loo(): weights from the pseudo-likelihood exp(-2 (1 - y f)_+), predictive "
                              "Phi(y (a f + b)) with (a, b) the fit's prob_calibration"})
        tree["observed_data"] = xr.Dataset({"y": (("obs",), self.design.y)})
        tree["constant_data"] = _frame_to_dataset(self.design.raw)
        tree["vbsvm"] = xr.Dataset({k: (tuple(f"{k}_dim{i}" for i in range(np.ndim(v))), np.asarray(v))
                                    for k, v in self.posterior.items()})
        dt = xr.DataTree.from_dict(tree)
        dt.attrs.update({"vbsvm_fit_type": "linear", "vbsvm_version": _version(),
                         "settings": json.dumps(self.settings.to_dict(), default=_jsonable),
                         "layout": json.dumps(self.layout.to_dict()), "method": self.method,
                         "info": json.dumps(self.info, default=_jsonable)})
        return dt

    def _train_scores(self) -> np.ndarray:
        """Scores of the training rows under each draw, ``(chains, draws, n)``."""
        theta = self._draws()[0]
        dense, sc = self._new_rows(self.design.raw, new_levels="zero")
        nd = self.layout.n_dense
        return np.stack([add_sparse_score(t[:, :nd] @ dense.T, t[:, nd:], sc) for t in theta])

    def pointwise_log_terms(self):
        """``(log_pseudo, log_prob)`` per draw and training row (see
        :meth:`vbsvm.results.contract.FitResult.loo`): ``-2 (1 - y f)_+`` and
        ``log Phi(y (a f + b))`` with ``(a, b) = info["prob_calibration"]``."""
        if self.point:
            raise InputError("loo() needs a posterior; a method='map' fit has only the mode. Refit with "
                             "method='vb' or method='gibbs'.")
        if self.training_rows() is None:
            raise InputError("loo() needs the training rows, which this fit does not keep (a fit from a Dask "
                             "DataFrame); refit on a pandas DataFrame.")
        F = self._train_scores()
        y = np.asarray(self.design.y, dtype=float)
        a, b = self.info.get("prob_calibration", (1.0, 0.0))
        return -2.0 * np.maximum(0.0, 1.0 - y * F), log_ndtr(y * (a * F + b))

    def save(self, path):
        """Write the fit to a netCDF file (readable by :func:`vbsvm.load` and ``arviz.from_netcdf``).

        The file is written atomically (:func:`vbsvm.io.fit_file.write_atomically`): an interrupted
        save leaves an existing file at ``path`` as it was. A fit that would not load back the
        same is not written: one whose formula :func:`vbsvm.load` would refuse (see
        :mod:`vbsvm.formula.safety`), or whose data has a column mixing text with other types
        (:func:`vbsvm.io.fit_file.check_storable`).
        """

        check_settings(self.settings.to_dict())
        check_storable(self.design.raw)
        write_atomically(self.to_arviz(log_likelihood=False), path)

    @classmethod
    def from_datatree(cls, dt) -> "Fit":
        """Rebuild a fit from the tree written by :meth:`to_arviz` / :meth:`save`."""

        try:
            settings = json.loads(dt.attrs["settings"])
            layout = ThetaLayout.from_dict(json.loads(dt.attrs["layout"]))
            method = dt.attrs["method"]
            info = json.loads(dt.attrs.get("info", "{}"))
            data = dt["constant_data"].to_dataset()
            for var in data.data_vars.values():  # xarray decodes int8 + attrs dtype='bool' itself
                if var.dtype == bool:
                    var.attrs.setdefault("dtype", "bool")
            raw = _dataset_to_frame(data)
            internal = dt["vbsvm"].to_dataset()
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise FitFileError(f"the file is not a complete vbsvm linear fit ({exc}).") from None
        check_settings(settings)  # the formula is checked before formulaic sees it
        settings = FitSettings.from_mapping(settings)  # frozen, through the same checks as svm()
        design = build_design(settings["formula"], raw, standardize=settings["standardize"],
                              missing=settings["missing"])
        check_rebuilt(design, layout, dt["observed_data"]["y"].values)
        posterior = {k: internal[k].values for k in internal.data_vars}
        return cls(design=design, layout=layout, settings=settings, method=method, posterior=posterior, info=info)


def warn_unconverged(diag, draws, info, stacklevel=2, hint=None):
    """Warn (:class:`~vbsvm.exceptions.DiagnosticWarning`) if the diagnostics ``diag`` (columns
    ``r_hat``, ``ess_bulk``) miss R-hat <= 1.01 or bulk ESS >= 400, naming the worst parameter and
    the draws per chain that would reach the targets; ``draws`` are the draws per chain kept and
    ``info`` the fit's run-length record (``max_draws``, ``draws_extended``). ``hint``, called
    only then, returns text appended to the warning (a likely cause)."""

    bad_r = diag.index[diag["r_hat"] > RHAT_TARGET].tolist()
    bad_e = diag.index[diag["ess_bulk"] < ESS_TARGET].tolist()
    if not (bad_r or bad_e):
        return
    worst = diag["ess_bulk"].idxmin() if bad_e else diag["r_hat"].idxmax()
    ess = max(float(diag.loc[worst, "ess_bulk"]), 1.0)
    rhat = float(diag.loc[worst, "r_hat"])
    # ESS grows about linearly with the draws once the chains have mixed; R-hat - 1 like 1 / ESS
    factor = max(ESS_TARGET / ess, (rhat - 1.0) / (RHAT_TARGET - 1.0))
    needed = int(math.ceil(draws * factor / 100.0) * 100)
    capped = info.get("max_draws")
    extended = (f"the run was extended to max_draws={capped} per chain, too few; " if capped and
                info.get("draws_extended") and draws >= capped else "")
    warnings.warn(
        "Gibbs diagnostics: "
        + (f"R-hat > {RHAT_TARGET} for {bad_r[:5]}{' ...' if len(bad_r) > 5 else ''}; " if bad_r else "")
        + (f"bulk ESS < {ESS_TARGET} for {bad_e[:5]}{' ...' if len(bad_e) > 5 else ''}; " if bad_e else "")
        + extended
        + f"the worst is {worst} (bulk ESS {ess:.0f}, R-hat {rhat:.3f} from {draws} draws per chain): "
        f"about draws={needed} per chain (and tune at least as long) would reach the targets — run "
        "longer chains (or pass a larger max_draws) before trusting intervals." + (hint() if hint else ""),
        DiagnosticWarning,
        stacklevel=stacklevel,
    )


def is_summary_variable(name: str) -> bool:
    """True for the posterior variables the convergence targets are about: ``beta`` (fixed
    effects) and ``sigma2*`` (variance components, including those of random-slope terms)."""
    return name == "beta" or name.startswith("sigma2")


def diagnostics_table(post: xr.Dataset) -> pd.DataFrame:
    """R-hat (rank-normalized), bulk/tail ESS and MCSE of every scalar of a posterior dataset with
    dims ``(chain, draw, ...)``; rows ``var`` or ``var[coord,...]``."""
    from arviz_stats import ess, mcse, rhat

    cols = {}
    for label, value in (("r_hat", rhat(post)), ("ess_bulk", ess(post, method="bulk")),
                         ("ess_tail", ess(post, method="tail")), ("mcse_mean", mcse(post))):
        cols[label] = [x for var in post.data_vars for x in np.ravel(value[var].values).tolist()]
    names = []
    for var in post.data_vars:
        da = post[var]
        extra = [d for d in da.dims if d not in ("chain", "draw")]
        if extra:
            names.extend(f"{var}[{','.join(map(str, c))}]"
                         for c in itertools.product(*(da[d].values for d in extra)))
        else:
            names.append(var)
    return pd.DataFrame(cols, index=pd.Index(names, name="parameter"))


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


def pointwise_log_likelihood(y, F) -> np.ndarray:
    """``log p(y_i | f_i)`` of the hinge likelihood normalised over ``y`` in {-1, +1},
    ``exp(-2 (1 - y f)_+) / (exp(-2 (1 - f)_+) + exp(-2 (1 + f)_+))``, for scores ``F`` (..., n).

    The SVM pseudo-likelihood itself is not normalised in y; this is the normalisation that makes
    each observation's term a probability, so that PSIS-LOO (``arviz.loo``) and model comparison
    (``arviz.compare``) have a proper predictive density to work with.
    """
    own = -2.0 * np.maximum(0.0, 1.0 - y * F)
    return own - np.logaddexp(-2.0 * np.maximum(0.0, 1.0 - F), -2.0 * np.maximum(0.0, 1.0 + F))


def _version():

    return __version__


def _frame_to_dataset(df: pd.DataFrame) -> xr.Dataset:
    data = {}
    for c in df.columns:
        col = df[c]
        if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            data[str(c)] = (("obs",), col.to_numpy(dtype=float), {"dtype": str(col.dtype)})
        elif pd.api.types.is_bool_dtype(col):
            data[str(c)] = (("obs",), col.to_numpy(dtype=np.int8), {"dtype": "bool"})
        else:
            cats = list(col.cat.categories) if isinstance(col.dtype, pd.CategoricalDtype) else None
            values = col.astype(object).where(col.notna(), None).to_numpy()
            attrs = {"dtype": "category" if cats is not None else "str"}
            if cats is not None:
                attrs["categories"] = json.dumps([_jsonable(x) for x in cats])
            data[str(c)] = (("obs",), np.array(["\x00NA" if v is None else str(v) for v in values], dtype=object), attrs)
    index = df.index.to_numpy()
    if not pd.api.types.is_integer_dtype(df.index):
        index = np.asarray(df.index.astype(str), dtype=object)

    return xr.Dataset(storable_columns(data), coords={"obs": index})


def _dataset_to_frame(ds: xr.Dataset) -> pd.DataFrame:

    cols = {}
    for key, da in ds.data_vars.items():
        name = column_name(key, da.attrs)
        kind = da.attrs.get("dtype", "float64")
        v = da.values
        if kind == "bool":
            cols[name] = v.astype(bool)
        elif kind in ("str", "category"):
            s = np.array([None if x == "\x00NA" else x for x in v.astype(str)], dtype=object)
            if kind == "category":
                s = pd.Categorical(s, categories=json.loads(da.attrs["categories"]))
            cols[name] = s
        elif kind.startswith(("int", "uint")):
            cols[name] = v.astype(kind)
        else:
            cols[name] = v.astype(float)
    obs = ds["obs"].values
    return pd.DataFrame(cols, index=pd.Index(obs if obs.dtype.kind in "iu" else obs.astype(str)))
