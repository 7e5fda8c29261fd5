"""The fitted Laplace-zero selection model: inclusion probabilities, plots, predictions, ArviZ.

A :class:`SelectionFit` is a :class:`~vbsvm.results.fit.Fit` whose coefficients are the **effective**
coefficients :math:`u_k = \\gamma_k v_k` (zero when a term is out of the model), on the original
predictor scale. So ``coef``, ``predict``, ``summary`` and ``to_arviz`` speak about the same
quantity, and

* ``method="vb"``: ``coef`` means and sds are the exact moments of :math:`u_k` under q, where
  :math:`q(u_k) = (1 - \\mu_{\\gamma_k})\\,\\delta_0 + \\mu_{\\gamma_k} N(\\mu_{v_k}, \\sigma^2_{v_k})`;
  its intervals are the exact quantiles of that mixture (an interval may contain, or be, 0).
  The score of a new row uses the paper's rule :math:`c^T(\\mu_{q(\\beta, v)} \\odot \\mu_{q(\\tilde\\gamma)})`;
  ``kind="prob"`` is the fraction of iid draws from q with a positive score.
* ``method="gibbs"``: the draws of :math:`u = \\gamma v` (one vector per kept sweep), so the score is
  the posterior mean of :math:`c^T(\\tilde\\gamma \\odot \\theta)`.

The inclusion table (:meth:`SelectionFit.inclusion`) and the ``gamma`` variable of
:meth:`SelectionFit.to_arviz` (dims ``chain, draw, coef_selectable``, for VB iid draws from q)
carry the selection itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from scipy import stats

from vbsvm.exceptions import InputError
from vbsvm.results.fit import Fit, interval_names
from vbsvm.results.imputed import ImputedFit
from vbsvm.results.plots import plot_inclusion
from vbsvm.results.summary import beside_or_below

__all__ = ["SelectionFit"]


class SelectionFit(Fit):
    """A linear Bayesian SVM with the Laplace-zero prior (see :func:`vbsvm.svm` with ``prior=``).

    Use :meth:`inclusion`, :meth:`plot_inclusion`, :attr:`rho`, :meth:`rho_posterior`,
    :attr:`rho_curve` besides the methods of :class:`~vbsvm.results.fit.Fit`.
    """

    # ------------------------------------------------------------------ selection basics
    @property
    def sel_index(self) -> np.ndarray:
        """Coordinates of theta (= design columns) under the Laplace-zero prior."""
        return np.asarray(self.posterior["sel_index"], dtype=np.int64)

    @property
    def selectable(self) -> list:
        """Names of the selectable terms (design columns), in design order."""
        return [self.layout.fixed[j] for j in self.sel_index]

    @property
    def rho(self) -> float:
        """The prior inclusion probability used (the chosen one for ``rho="auto"``); under a
        ``Beta(a, b)`` hyperprior its posterior mean (NaN where the fit keeps no posterior of
        rho: ``missing="impute"``)."""
        return float(self.info["rho"])

    @property
    def rho_prior(self):
        """``(a, b)`` of the Beta hyperprior of rho, or None for a fixed rho."""
        shapes = self.info.get("rho_prior")
        return None if shapes is None else tuple(float(x) for x in shapes)

    def rho_draws(self):
        """Draws of rho under its hyperprior, shape ``(chains, draws)``: Gibbs' draws, or for VB iid
        draws from ``q(rho) = Beta(q_rho)`` (the mean field's factor; for the calibrated fit the
        Beta with the grid posterior's mean and sd). None for a fixed rho."""
        P = self.posterior
        if "rho_draws" in P:
            return np.asarray(P["rho_draws"], dtype=float)
        if "q_rho" not in P:
            return None
        seed = self.settings.get("draw_seed", self.settings.get("seed"))
        rng = np.random.default_rng(None if seed is None else [int(seed), 2])  # a stream of its own
        a, b = np.asarray(P["q_rho"], dtype=float)
        return rng.beta(a, b, size=self._post.shape)

    def rho_posterior(self, level=None) -> pd.DataFrame | None:
        """Posterior of rho under its hyperprior: one row ``rho`` with ``mean``, ``sd`` and an
        equal-tailed interval (Gibbs: of the draws; VB: of ``q(rho)``, see :meth:`rho_draws`).
        None for a fixed rho."""
        P = self.posterior
        if "rho_draws" not in P and "q_rho" not in P:
            return None
        level = self._level(level)
        lo_name, hi_name = interval_names(level)
        probs = [(1 - level) / 2, 1 - (1 - level) / 2]
        if "rho_draws" in P:
            d = np.asarray(P["rho_draws"], dtype=float).ravel()
            mean, sd, (lo, hi) = d.mean(), d.std(ddof=1), np.quantile(d, probs)
        else:
            q = stats.beta(*np.asarray(P["q_rho"], dtype=float))
            mean, sd, (lo, hi) = q.mean(), q.std(), q.ppf(probs)
        return pd.DataFrame({"mean": [mean], "sd": [sd], lo_name: [lo], hi_name: [hi]},
                            index=pd.Index(["rho"], name="parameter"))

    @property
    def rho_curve(self) -> pd.DataFrame | None:
        """``rho="auto"``: the ELBO of the mean-field VB fit for each ``rho`` on the grid (else ``None``).

        Columns ``rho``, ``expected_size`` (``rho * m``), ``elbo`` and ``chosen``.
        """
        if "rho_grid" not in self.info:
            return None
        grid = np.asarray(self.info["rho_grid"], dtype=float)
        elbo = np.asarray(self.info["rho_elbo"], dtype=float)
        return pd.DataFrame({"rho": grid, "expected_size": grid * len(self.sel_index), "elbo": elbo,
                             "chosen": np.isclose(grid, self.rho)})

    def _scale_sel(self) -> np.ndarray:
        """Standardization scale of the selectable columns (v on the original scale is v / scale)."""
        return np.asarray(self.design.scale, dtype=float)[self.sel_index]

    def gamma_draws(self) -> np.ndarray:
        """Draws of the inclusion indicators, shape ``(chains, draws, m)`` (VB: iid from q)."""
        return self._post.gamma_draws()

    # ------------------------------------------------------------------ inclusion table
    def inclusion(self) -> pd.DataFrame:
        """Posterior inclusion of each selectable term, sorted by ``p_include`` (decreasing).

        Returns
        -------
        pandas.DataFrame
            Indexed by term, columns

            * ``p_include``: :math:`P(\\gamma_k = 1 \\mid y)`;
            * ``p_positive``: :math:`P(u_k > 0 \\mid y)` (:math:`u_k = \\gamma_k v_k`);
            * ``p_positive_if_included``: :math:`P(u_k > 0 \\mid \\gamma_k = 1, y)`, the sign
              of the association when the term is in (the paper's :math:`P(v_k > 0 \\mid y)`
              under VB's factorization; it shades :meth:`plot_inclusion`); NaN if never included;
            * ``mean``, ``sd``: of :math:`u_k` on the original predictor scale;
            * ``mean_if_included``, ``sd_if_included``: of :math:`u_k` given :math:`\\gamma_k = 1`;
            * ``median_model``: ``p_include > 0.5`` (the median probability model of
              Barbieri & Berger 2004).
        """
        names = self.selectable
        p_in, p_pos, ppos_in, mean, sd, m_in, s_in = self._post.inclusion_moments(self.sel_index, self._scale_sel())
        table = pd.DataFrame({
            "p_include": p_in, "p_positive": p_pos, "p_positive_if_included": ppos_in,
            "mean": mean, "sd": sd, "mean_if_included": m_in, "sd_if_included": s_in,
        }, index=pd.Index(names, name="term"))
        table = table.sort_values("p_include", ascending=False, kind="stable")
        table["median_model"] = table["p_include"] > 0.5
        return table

    def inclusion_probabilities(self) -> dict:
        """``{beta[term]: p_include}`` of the selectable terms (what :func:`vbsvm.results.compare.compare`
        puts side by side)."""
        return {f"beta[{t}]": float(v) for t, v in self.inclusion()["p_include"].items()}

    @property
    def selected(self) -> list:
        """Terms of the median probability model (``p_include > 0.5``), by decreasing ``p_include``."""
        t = self.inclusion()
        return t.index[t["median_model"]].tolist()

    def plot_inclusion(self, ax=None, **kwargs):
        """Bar chart of the inclusion probabilities (as Luts & Ormerod's Figure 3).

        Bars are ``p_include`` sorted decreasingly, shaded by ``p_positive_if_included``
        (dark: positive association with the ``+1`` level; white: negative). Keyword arguments go
        to :func:`vbsvm.results.plots.plot_inclusion`.

        Returns
        -------
        matplotlib.figure.Figure
        """

        kwargs.setdefault("title", f"Inclusion probabilities ({self._post.label}, {self._rho_text('g')})")
        return plot_inclusion(self.inclusion(), ax=ax, positive_label=str(self.design.positive_level), **kwargs)

    # ------------------------------------------------------------------ marginals
    def varcomp(self, level=None) -> pd.DataFrame:
        """Inferred variances: ``sigma2_u`` is the squared scale of the Laplace slab
        (``v_k | sigma_u ~ Laplace(0, sigma_u)``), then one variance per ``(1 | g)`` term."""
        out = super().varcomp(level)
        return out.drop(index="alpha", errors="ignore")

    # ------------------------------------------------------------------ ArviZ
    def _posterior_dataset(self) -> xr.Dataset:
        ds = super()._posterior_dataset()
        gamma = self.gamma_draws()
        ds["gamma"] = xr.DataArray(gamma, dims=("chain", "draw", "coef_selectable"),
                                   coords={"coef_selectable": self.selectable})
        rho = self.rho_draws()
        if rho is not None:
            ds["rho"] = xr.DataArray(rho, dims=("chain", "draw"))
        return ds

    def to_arviz(self, log_likelihood=True):
        """The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout.

        As :meth:`vbsvm.results.fit.Fit.to_arviz`; ``beta`` holds the effective coefficients
        ``u = gamma * v`` and the posterior group also has ``gamma`` (dims ``chain, draw,
        coef_selectable``; VB: iid draws from q). The root attribute ``vbsvm_fit_type`` is
        ``"selection"``.
        """
        dt = super().to_arviz(log_likelihood=log_likelihood)
        dt.attrs["vbsvm_fit_type"] = "selection"
        post = dt["posterior"]
        post.attrs["prior"] = "Laplace-zero: u_k = gamma_k v_k, v_k ~ Laplace(0, sigma_u), gamma_k ~ Bernoulli(rho)"
        post.attrs["rho"] = self.rho
        if self.rho_prior is not None:
            post.attrs["rho_prior"] = "rho ~ Beta({:g}, {:g}); attribute rho: its posterior mean".format(*self.rho_prior)
        return dt

    def _description_lines(self) -> list:
        """``repr(fit)``: the prior and the median probability model."""
        chosen = ", ".join(self.selected) or "none"
        return super()._description_lines() + [
            f"Laplace-zero prior, {self._rho_text()}: {len(self.selected)} of {len(self.sel_index)} terms "
            f"selected (p_include > 0.5): {chosen}"]

    def _rho_text(self, fmt=".4g") -> str:
        """``rho = 0.01``, or ``rho ~ Beta(1, 1), posterior mean 0.21``."""
        if self.rho_prior is None:
            return f"rho = {self.rho:{fmt}}"
        text = "rho ~ Beta({:g}, {:g})".format(*self.rho_prior)
        return text + (f", posterior mean {self.rho:.3g}" if np.isfinite(self.rho) else " (integrated)")

    # ------------------------------------------------------------------ summary
    def prior_description(self):
        """The summary header's prior line: the Laplace-zero prior instead of the penalty."""
        return "Prior:", self._prior_text()

    def summary_tables(self, level) -> list:
        """Extra summary sections: the inclusion table and, for ``rho="auto"``, the ELBO curve.

        For a Gibbs fit the inclusion table shows each indicator's R-hat and bulk ESS (NaN R-hat
        and blank ESS: an indicator that never changed), in a table of their own when the
        joined one would be wider than the summary (long term names), as for the coefficients."""
        tables = list(super().summary_tables(level))
        inc = self.inclusion()[["p_include", "p_positive", "mean_if_included", "sd_if_included", "median_model"]]
        title = f"Inclusion ({len(self.selected)} of {len(inc)} terms in the median probability model, p_include > 0.5)"
        if self.method != "gibbs":
            tables.append((title, inc))
        else:
            diag = self.diagnostics().reindex([f"gamma[{t}]" for t in inc.index])
            moved = np.isfinite(diag["r_hat"].to_numpy())  # ArviZ gives a constant chain the ESS of its length
            diag = pd.DataFrame({"r_hat": diag["r_hat"].to_numpy(),
                                 "ess_bulk": [int(round(v)) if ok and np.isfinite(v) else ""
                                              for ok, v in zip(moved, diag["ess_bulk"])]},
                                index=inc.index)
            tables += beside_or_below(inc, diag, title, "Sampler diagnostics of the inclusion indicators")
        if self.rho_curve is not None:
            tables.append(("rho chosen by the ELBO of the mean-field VB fit on the grid", self.rho_curve.set_index("rho")))
        rho = self.rho_posterior(level)
        if rho is not None:
            tables.append(("Prior inclusion probability, rho ~ Beta({:g}, {:g})".format(*self.rho_prior), rho))
        return tables

    def diagnostics(self):
        """As :meth:`vbsvm.results.fit.Fit.diagnostics`, including ``gamma[term]`` rows (R-hat is NaN
        for an indicator that never changed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return super().diagnostics()

    def _prior_text(self) -> str:
        s = self.settings
        m = len(self.sel_index)
        size = f"expected size {self.rho * m:.3g} of {m}" if np.isfinite(self.rho) else f"{m} terms"
        return f"Laplace-zero, {self._rho_text()} ({size}); sigma2_u ~ IG({s['A_u']:g}, {s['B_u']:g})"


class ImputedSelectionFit(SelectionFit, ImputedFit):
    """A Laplace-zero fit with ``missing="impute"`` (conditional imputation): the inclusion
    table and selection summaries of :class:`SelectionFit` with the imputations, the imputation
    model and the predictions for incomplete rows of :class:`~vbsvm.results.imputed.ImputedFit`.
    The label effect of the imputation model is ``label_effect`` in :meth:`to_arviz` (``gamma``
    are the inclusion indicators). Saving to a file is not supported yet."""

    _label_effect_key = "label_effect_draws"

    def _predict_rows(self, newdata, kind, new_levels):
        """:meth:`vbsvm.results.fit.Fit.predict` with incomplete rows integrated over the imputation
        model (:meth:`vbsvm.results.imputed.ImputedFit._score_moments`); VB scores use the
        moment-matched Gaussian of the effective coefficients."""
        return ImputedFit._predict_rows(self, newdata, kind, new_levels)

    def save(self, path):
        """Not supported yet for this combination: raises :class:`~vbsvm.exceptions.InputError`."""
        raise InputError("saving a LaplaceZero fit with missing='impute' is not supported yet; keep the fit in "
                         "memory (or pickle it), or save the tables you need (fit.coef, fit.inclusion()).")
