"""The fitted-model object of the linear Bayesian SVMs: coefficients, variance components,
marginals and summary; its diagnostics, predictions and ArviZ export and saving come from
:mod:`~vbsvm.results.diagnostics`, :mod:`~vbsvm.results.prediction` and
:mod:`~vbsvm.results.arviz_export`.

A :class:`Fit` keeps the posterior on the **original scale** of the predictors (the internal
standardization is undone once, when the fit is made), so predictions, summaries and saved files
all use the same numbers:

* ``method="vb"``: the Gaussian q(theta) (mean, dense covariance, the cross-covariance with the
  largest grouping factor and that factor's variances) and the inverse-gamma q of each variance;
* ``method="gibbs"``: the draws, shape ``(chains, draws, ...)``;
* ``method="map"``: the posterior mode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from vbsvm.exceptions import InputError
from vbsvm.posterior import linear_response as lr
from vbsvm.posterior.representations import posterior_of
from vbsvm.results.arviz_export import ArvizMixin
from vbsvm.results.contract import FitResult, SummaryParts
from vbsvm.results.diagnostics import DiagnosticsMixin
from vbsvm.results.layout import ThetaLayout
from vbsvm.results.marginal import Marginal
from vbsvm.results.prediction import PredictionMixin
from vbsvm.results.summary import describe, linear_summary_parts, penalty_description
from vbsvm.settings import FitSettings

__all__ = ["Fit", "ThetaLayout"]


def interval_names(level):
    lo = 100 * (1 - level) / 2
    return f"{lo:g}%", f"{100 - lo:g}%"


@dataclass
class Fit(DiagnosticsMixin, PredictionMixin, ArvizMixin, FitResult):
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
