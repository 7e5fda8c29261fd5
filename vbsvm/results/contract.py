r"""The result contract: what every fit offers, whatever the model (linear, Laplace-zero, imputed,
sparse GP, Dask) and the method (calibrated VB, mean-field VB, Gibbs, MAP, SVI).

:class:`FitResult` is the abstract base of :class:`~vbsvm.results.fit.Fit` (and its subclasses)
and :class:`~vbsvm.results.gp.GPFit`. A fit implements a few primitives, and everything else —
the statsmodels names, the summary, leave-one-out cross-validation, the comparison of fits — is
written once here, on those primitives, without asking which kind of fit it is:

* the posterior: :meth:`~FitResult.draws` (an :class:`xarray.Dataset` of draws, dims ``(chain,
  draw, ...)``; Gibbs draws, iid draws from a VB q, or the mode as one draw),
  :attr:`~FitResult.draw_shape`, :meth:`~FitResult.with_draw_shape`, :attr:`~FitResult.sampled`
  (the draws are a Markov chain's) and :attr:`~FitResult.point` (a mode: no spread);
* named one-dimensional marginals for :func:`vbsvm.results.compare.compare`
  (:meth:`~FitResult.marginals`: closed form where the fit has it, else its draws), the rows that
  define them for models without coefficients (:meth:`~FitResult.evaluation_points`), inclusion
  probabilities (:meth:`~FitResult.inclusion_probabilities`, Laplace-zero fits) and linear-response
  sds (:meth:`~FitResult.linear_response_sd`, mean-field linear fits);
* the data: :meth:`~FitResult.training_rows`, :attr:`~FitResult.predictor_columns`,
  :meth:`~FitResult.observed_signs`;
* the coefficient table :meth:`~FitResult.coef_table` and the posterior covariance of the
  coefficients :meth:`~FitResult.coefficient_covariance`;
* per draw and training row, the log pseudo-likelihood the posterior used and the log class
  probability (:meth:`~FitResult.pointwise_log_terms`), from which :meth:`~FitResult.loo` works;
* :meth:`~FitResult.predict`, :meth:`~FitResult.to_arviz`, :meth:`~FitResult.save` and the parts of
  the summary (:meth:`~FitResult.summary_parts`), with the same signatures on every fit.

Leave-one-out on a probability scale
------------------------------------
An SVM posterior is :math:`p(\theta \mid y) \propto p(\theta) \prod_i L(y_i \mid \theta)` with a
pseudo-likelihood :math:`L` that is not a distribution over :math:`y` (the hinge,
:math:`\log L = -2 (1 - y f)_+`; for the sparse GP its bound in the inducing values). Leaving
row :math:`i` out removes its factor, so the importance ratio of draw :math:`s` is
:math:`r_{is} = 1 / L(y_i \mid \theta_s)`; what is scored is a class probability
:math:`p(y_i \mid \theta)`, the one :meth:`predict` uses for ``kind="prob"``:

.. math::

    \mathrm{elpd}_{\mathrm{loo}, i} = \log \frac{\sum_s w_{is}\, p(y_i \mid \theta_s)}{\sum_s w_{is}},

with :math:`w_{is}` the Pareto-smoothed ratios (PSIS, Vehtari et al. 2024, :func:`psis_log_weights`)
and their Pareto :math:`\hat k` reported per row.
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import NamedTuple

import arviz
import numpy as np
import pandas as pd
import xarray as xr
from arviz_stats import ess

from vbsvm import validation
from vbsvm.exceptions import InputError
from vbsvm.results.compare import compare as compare_fits
from vbsvm.results.summary import build_summary

__all__ = ["FitResult", "SummaryParts", "psis_log_weights", "fill_rows", "check_new_levels", "check_na_action",
           "NA_ACTIONS", "NEW_LEVELS"]

NA_ACTIONS = ("pass", "drop", "raise")
NEW_LEVELS = ("integrate", "zero", "error")


class SummaryParts(NamedTuple):
    """What :meth:`FitResult.summary` shows: a title, the header's ``label: value`` pairs,
    tables (:class:`statsmodels.iolib.table.SimpleTable`) and notes (paragraphs)."""

    title: str
    header: dict
    tables: list
    notes: list


# =============================================================================== rows
def check_new_levels(new_levels):
    if new_levels not in NEW_LEVELS:
        raise InputError(f"new_levels must be 'integrate', 'zero' or 'error'; got {new_levels!r}.")


def check_na_action(na_action):
    if na_action not in NA_ACTIONS:
        raise InputError(f"na_action must be one of {NA_ACTIONS}; got {na_action!r}.")


def fill_rows(out, newdata, keep, na_action):
    """Predictions ``out`` of the rows ``keep`` (positions) of ``newdata``, with NaN rows put back
    in place for ``na_action="pass"``."""
    if na_action != "pass" or len(keep) == len(newdata):
        return out
    values = out.to_numpy()
    full = np.full((len(newdata),) + values.shape[1:], np.nan, dtype=object if values.dtype == object else float)
    full[keep] = values
    if isinstance(out, pd.DataFrame):
        return pd.DataFrame(full, index=newdata.index, columns=out.columns)
    return pd.Series(full, index=newdata.index, name=out.name)


# =============================================================================== PSIS
def _tail_length(n_draws, r_eff):
    """Draws in the Pareto tail that PSIS fits (ArviZ's rule: ``3 sqrt(S / r_eff)``, or ``S / 5``
    for small ``S r_eff``)."""
    return int(np.floor(3 * math.sqrt(n_draws / r_eff))) if n_draws * r_eff > 225 else int(n_draws // 5)


def psis_log_weights(log_pseudo, r_eff=1.0):
    r"""Pareto-smoothed leave-one-out log weights of draws under a pseudo-likelihood.

    The raw log ratio of draw ``s`` for row ``i`` is ``-log_pseudo[s, i]``; the weights are
    smoothed by :func:`arviz_stats` ``psislw`` (a generalized Pareto fit to the largest ratios)
    and normalised to sum to one over the draws.

    The hinge is flat beyond the margin, so a row that every draw classifies with
    :math:`y f \ge 1` has ratio 1 for all draws, and a row that few draws put inside the margin has
    an atom at its smallest ratio. PSIS's tail (the largest ``M`` ratios) must not reach into that
    atom, so:

    * no draw above the atom: uniform weights, :math:`\hat k = -\infty` (nothing to smooth);
    * fewer than ``M`` draws above it but at least 5: the tail is those draws (PSIS with a shorter
      tail, the same estimator of :math:`\hat k`);
    * 1 to 4 draws above it: the raw ratios, :math:`\hat k` NaN (too few to estimate a tail).

    Parameters
    ----------
    log_pseudo : numpy.ndarray
        ``(draws, rows)``: log pseudo-likelihood of each row under each draw.
    r_eff : float
        Relative efficiency of the draws (ESS / draws; 1 for iid draws).

    Returns
    -------
    log_weights : numpy.ndarray
        ``(draws, rows)``, normalised over the draws.
    pareto_k : numpy.ndarray
        ``(rows,)``.
    """
    log_ratio = -np.asarray(log_pseudo, dtype=float)
    S, n = log_ratio.shape
    tail = _tail_length(S, r_eff)
    above = np.sum(log_ratio > log_ratio.min(axis=0), axis=0)
    log_w = log_ratio - log_ratio.max(axis=0)
    k = np.full(n, np.nan)
    k[above == 0] = -np.inf
    groups = [(above >= tail, r_eff)] + [(above == a, 9.0 * S / (a + 0.5) ** 2)
                                         for a in np.unique(above[(above >= 5) & (above < tail)])]
    for cols, r in groups:  # one PSIS call per tail length (not per row)
        if cols.any():
            da = xr.DataArray(-log_ratio[:, cols], dims=("sample", "obs"))
            lw, kk = da.azstats.psislw(r_eff=float(r), dim="sample")
            log_w[:, cols] = lw.transpose("sample", "obs").values
            k[cols] = kk.values
    log_w -= np.logaddexp.reduce(log_w, axis=0)
    return log_w, k


# =============================================================================== the contract
class FitResult(abc.ABC):
    """The interface every vbsvm fit implements (see the module docstring).

    Attributes every fit has: ``method`` (``"vb"``, ``"gibbs"``, ``"map"``, ``"svi"``),
    ``design`` (the formula's design, None for a GP fitted on arrays), ``settings`` (dict),
    ``formula`` (the formula text, None for arrays) and ``n_obs``.
    """

    # ------------------------------------------------------------------ posterior primitives
    @property
    @abc.abstractmethod
    def draw_shape(self) -> tuple:
        """``(chains, draws)`` of :meth:`draws` by default."""

    @property
    @abc.abstractmethod
    def sampled(self) -> bool:
        """True when the draws are a Markov chain's (R-hat and ESS apply; the draw shape is fixed)."""

    @property
    @abc.abstractmethod
    def point(self) -> bool:
        """True for a posterior mode (no spread: sds, intervals and predictive spreads are NaN)."""

    @abc.abstractmethod
    def draws(self, chains=None, draws=None, seed=None) -> xr.Dataset:
        """Posterior draws as an :class:`xarray.Dataset` with dims ``(chain, draw, ...)``: the
        ``posterior`` group of :meth:`to_arviz`.

        Parameters
        ----------
        chains, draws : int, optional
            Shape of iid draws from a variational q (default :attr:`draw_shape`). A sampler's
            draws (and a mode, one draw) keep their own shape.
        seed : int, optional
            Seed of iid draws from q (default: the fit's own, so that repeated calls agree).

        Returns
        -------
        xarray.Dataset
            The fit itself is not changed.
        """

    @abc.abstractmethod
    def with_draw_shape(self, chains, draws) -> "FitResult":
        """The same fit with ``(chains, draws)`` as its default shape of iid draws from q (a new
        object sharing no cache; this one is not changed). Sampled fits and modes return themselves."""

    @abc.abstractmethod
    def marginals(self, ranef=False, points=None, draw_shape=None) -> dict:
        """Ordered ``{name: Marginal}`` of the parameters :func:`vbsvm.results.compare.compare` lines
        up (:class:`~vbsvm.results.marginal.Marginal`): closed form where the fit has it, else
        from its draws.

        Parameters
        ----------
        ranef : bool
            Also the random effects ``b_<group>[level]``.
        points : tuple, optional
            ``(rows, labels)`` from :meth:`evaluation_points` of the reference fit: models without
            coefficients (the GP) give the marginals of their score ``f`` there.
        draw_shape : tuple, optional
            Fits whose marginals come from iid draws use at least this many (redrawn in that shape
            when it has more draws than their own).
        """

    @abc.abstractmethod
    def training_rows(self) -> pd.DataFrame | None:
        """The training data the fit keeps (None: a fit from arrays, a Dask frame or a file that
        stores no rows)."""

    @abc.abstractmethod
    def coef_table(self, level=None) -> pd.DataFrame:
        """The coefficient table at interval ``level``: columns ``mean``, ``sd`` and the central
        interval's bounds (named by their percentages, e.g. ``2.5%``, ``97.5%``)."""

    @abc.abstractmethod
    def coefficient_covariance(self) -> np.ndarray:
        """Posterior covariance of the coefficients of :meth:`coef_table` as the posterior holds it
        (:meth:`cov_params` rescales it to the table's sds)."""

    @abc.abstractmethod
    def pointwise_log_terms(self):
        """``(log_pseudo, log_prob)``, each ``(chains, draws, n_obs)``: per draw and training row the
        log pseudo-likelihood the posterior used and the log probability of the observed class
        (the class probability of ``predict(kind="prob")``).

        Raises
        ------
        vbsvm.exceptions.InputError
            When the fit has no draws (a mode) or keeps no training rows.
        """

    @abc.abstractmethod
    def predict(self, newdata=None, kind="class", new_levels="integrate", na_action="pass"):
        """Predict ``newdata`` (default the training rows): ``kind`` ``"class"``, ``"prob"``
        (``P(y = +1 | x, data)``), ``"prob_positive"`` (``P(f(x) > 0 | data)``) or ``"score"``."""

    @abc.abstractmethod
    def to_arviz(self, log_likelihood=True) -> xr.DataTree:
        """The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout."""

    @abc.abstractmethod
    def save(self, path):
        """Write the fit to a netCDF file that :func:`vbsvm.load` reads."""

    @abc.abstractmethod
    def summary_parts(self, level) -> SummaryParts:
        """The title, header, tables and notes of :meth:`summary` at interval ``level``."""

    # ------------------------------------------------------------------ optional parts
    def inclusion_probabilities(self) -> dict | None:
        """``{beta[term]: P(term included | data)}`` of a Laplace-zero fit; None for other models."""
        return None

    def linear_response_sd(self) -> dict | None:
        """Linear-response corrected sds of a mean-field fit (:mod:`vbsvm.posterior.linear_response`),
        ``{parameter: sd}``; None where they do not apply.

        Raises
        ------
        vbsvm.exceptions.InputError
            When they apply but cannot be computed (e.g. too many rows for the dense solve).
        """
        return None

    def evaluation_points(self, n_points):
        """Up to ``n_points`` evenly spaced training rows and their labels ``f[<row>]`` (where models
        without coefficients are compared), or None without training rows."""
        raw = self.training_rows()
        if raw is None or len(raw) == 0:
            return None
        idx = np.unique(np.linspace(0, len(raw) - 1, min(n_points, len(raw))).round().astype(int))
        return raw.iloc[idx], [f"f[{lab}]" for lab in raw.index[idx]]

    @property
    def predictor_columns(self) -> list | None:
        """The data columns the fit reads besides the response (None when it has no formula)."""
        design = self.design
        raw = getattr(design, "raw", None)
        if raw is None:
            return None
        return [c for c in raw.columns if c != design.response]

    def observed_signs(self, data) -> np.ndarray | None:
        """The response of ``data`` as +1 (the positive level) / -1, or None if ``data`` lacks it."""
        design = self.design
        if design is None or design.response not in data.columns:
            return None
        return np.where(data[design.response].to_numpy() == design.positive_level, 1, -1)

    def _level(self, level):
        return validation.level(self.settings.get("level", 0.95) if level is None else level)

    # ------------------------------------------------------------------ statsmodels names
    @property
    def coef(self) -> pd.DataFrame:
        """The coefficient table at the fit's level (95% by default): posterior ``mean``, ``sd`` and
        the central credible interval (see :meth:`coef_table`)."""
        return self.coef_table()

    @property
    def params(self) -> pd.Series:
        """Posterior means of the coefficients (a MAP fit: the mode), indexed by term (statsmodels'
        ``params``; ``coef["mean"]``)."""
        return self.coef_table()["mean"].rename(None)

    @property
    def bse(self) -> pd.Series:
        """Posterior sds of the coefficients (statsmodels' ``bse``; ``coef["sd"]``; NaN for a mode
        or a point estimate)."""
        return self.coef_table()["sd"].rename(None)

    def conf_int(self, alpha=0.05) -> pd.DataFrame:
        """Central ``100 (1 - alpha)%`` posterior credible intervals of the coefficients, columns 0
        (lower) and 1 (upper) as statsmodels' ``conf_int`` (the bounds of :meth:`coef_table` at
        ``level = 1 - alpha``: Gaussian q-intervals under VB, equal-tailed quantiles of the draws
        under Gibbs, NaN for a mode)."""
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
            raise InputError(f"alpha must be in (0, 1), e.g. alpha=0.05 for 95% intervals; got {alpha!r}.")
        table = self.coef_table(level=1.0 - float(alpha))
        out = table.iloc[:, [2, 3]].copy()
        out.columns = [0, 1]
        return out

    def cov_params(self) -> pd.DataFrame:
        """Posterior covariance matrix of the coefficients (statsmodels' ``cov_params``), indexed by
        term both ways; its diagonal is ``bse ** 2`` (the correlations are the posterior's: of the
        Gaussian q under VB, of the draws under Gibbs; all NaN for a mode or point estimates)."""
        table = self.coef_table()
        sd = table["sd"].to_numpy(dtype=float)
        C = np.asarray(self.coefficient_covariance(), dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.sqrt(np.diag(C))
            R = C / np.outer(scale, scale)
        R[np.diag_indices_from(R)] = 1.0
        cov = R * np.outer(sd, sd)
        return pd.DataFrame(cov, index=table.index, columns=table.index)

    # ------------------------------------------------------------------ summary
    def summary(self, level=None):
        """statsmodels-style summary (``as_text()``, ``as_html()``, ``as_latex()``) at interval
        ``level`` (default the fit's, 95%)."""
        return build_summary(self.summary_parts(self._level(level)))

    def _repr_html_(self):
        return self.summary().as_html()

    # ------------------------------------------------------------------ comparison
    def compare(self, *others, names=None, reference=None, n_points=30):
        """:func:`vbsvm.results.compare.compare` of this fit with ``others`` (this one first)."""
        return compare_fits(self, *others, names=names, reference=reference, n_points=n_points)

    # ------------------------------------------------------------------ LOO
    def relative_efficiency(self) -> float:
        """ESS / draws of the posterior draws: 1 for iid draws from q; for a sampler the mean over
        every posterior scalar of its ESS (ArviZ's ``method="mean"``), as :func:`arviz.loo` does."""
        post = self.draws()
        n = post.sizes["chain"] * post.sizes["draw"]
        if not self.sampled or post.sizes["chain"] < 2:
            return 1.0
        with np.errstate(invalid="ignore", divide="ignore"):
            e = ess(post, method="mean")
        values = np.concatenate([np.ravel(e[v].values) for v in e.data_vars])
        values = values[np.isfinite(values)]
        return float(np.clip(values.mean() / n, 1e-3, 1.0)) if values.size else 1.0

    def loo(self, pointwise=True):
        r"""Pareto-smoothed importance-sampling leave-one-out cross-validation on a probability scale.

        For each training row, :math:`\mathrm{elpd}_{\mathrm{loo},i} = \log \sum_s w_{is}\,
        p(y_i \mid \theta_s) / \sum_s w_{is}`, with PSIS-smoothed weights
        :math:`w_{is} \propto 1 / L(y_i \mid \theta_s)` of the pseudo-likelihood :math:`L` the
        posterior used (so the weighted draws stand for the posterior fitted without row i) and
        :math:`p(y_i \mid \theta)` the class probability that ``predict(kind="prob")`` averages over
        the posterior:

        * linear fits: :math:`p(y \mid f) = \Phi(y (a f + b))`, the probit with the scale ``a``
          calibrated on the training rows (``fit.info["prob_calibration"]``); its posterior mean is
          ``predict(kind="prob")`` (:math:`\Phi((a m + b)/\sqrt{1 + a^2 s^2})` for a Gaussian score).
          The normalised hinge :math:`e^{-2(1 - yf)_+} / (e^{-2(1 - f)_+} + e^{-2(1 + f)_+})` (Sollich
          2002; the ``log_likelihood`` group of :meth:`to_arviz`) is a proper class probability too,
          but over-confident: the hinge pushes scores to +-1, where it says 0.98 (toenail random
          intercepts, Gibbs: elpd -577 against -504 for the probit, whose 10-fold CV is -501;
          ``benchmarks/results/loo.md``);
        * GP fits: :math:`p(y \mid u) = \Phi(y\, \kappa u / \sqrt{1 + \tilde k})`, the probit
          integrated over :math:`f \mid u`, whose posterior mean is ``predict(kind="prob")``; the
          pseudo-likelihood is the bound model's, :math:`\log L = -(1 - y\kappa u) -
          \sqrt{(1 - y\kappa u)^2 + \tilde k}`.

        VB fits use their iid draws from q as posterior draws. Where q is far from the posterior the
        Pareto :math:`\hat k` says so: with random intercepts the Gaussian q lacks the kink the hinge
        puts into each row's score distribution, and :math:`\hat k > 0.7` flags many rows (prefer a
        Gibbs fit there); a mean-field q that is too narrow gives optimistic values that
        :math:`\hat k` does not flag (``benchmarks/results/loo.md``).

        Parameters
        ----------
        pointwise : bool
            Keep ``elpd_i`` and ``pareto_k`` per row (needed by :func:`arviz.compare`).

        Returns
        -------
        arviz_stats.utils.ELPDDataLOO
            ArviZ's ELPD object (``elpd``, ``se``, ``p``, ``pareto_k``, ...), usable in
            ``arviz.compare({"a": fit_a.loo(), "b": fit_b.loo()})``. Its ``pareto_k`` is
            :math:`-\infty` for rows every draw classifies beyond the margin (all weights equal)
            and NaN where only 1-4 draws differ from the rest (see :func:`psis_log_weights`).

        Raises
        ------
        vbsvm.exceptions.InputError
            For a mode (``method="map"``: no posterior to weight) or a fit that keeps no training
            rows (a Dask frame, a GP fitted on a stream or loaded from a file).
        """
        log_pseudo, log_prob = self.pointwise_log_terms()
        chains, draws, n = log_prob.shape
        r_eff = self.relative_efficiency()
        log_w, k = psis_log_weights(log_pseudo.reshape(chains * draws, n), r_eff)
        obs = pd.RangeIndex(n) if self.training_rows() is None else self.training_rows().index
        obs = np.asarray(obs) if np.asarray(obs).dtype.kind in "iu" else np.asarray(obs.astype(str), dtype=object)
        coords = {"chain": np.arange(chains), "draw": np.arange(draws), "obs": obs}
        tree = xr.DataTree.from_dict({"log_likelihood": xr.Dataset(
            {"y": (("chain", "draw", "obs"), log_prob)}, coords=coords)})
        weights = xr.DataArray(log_w.reshape(chains, draws, n), dims=("chain", "draw", "obs"), coords=coords)
        pareto_k = xr.DataArray(k, dims=("obs",), coords={"obs": obs})
        return arviz.loo(tree, pointwise=pointwise, var_name="y", reff=r_eff, log_weights=weights,
                         pareto_k=pareto_k)
