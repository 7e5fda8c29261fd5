r"""Compare fits of the same model: variational Bayes against MCMC (or any fits against each other).

:func:`compare` takes two or more fits of one formula on one data set — typically
``method="vb"`` and ``method="gibbs"`` — and returns a :class:`Comparison`:

* :meth:`Comparison.table` — per parameter, the mean and sd under every fit, the difference of
  each fit's mean from the reference's in reference-sd units, the sd ratio, and the
  **accuracy** of each fit's marginal against the reference's,

  .. math::

      \mathrm{accuracy}(q) = 100\,\Big\{1 - \tfrac12 \int |q(\theta) - p(\theta)|\, d\theta\Big\}\ \%,

  the score of the mean-field VB literature (Faes, Ormerod & Wand 2011; Luts & Ormerod 2014):
  100 minus 50 times the L1 distance, i.e. 100 (1 - total variation distance). 100% means
  identical marginals, 0% disjoint ones. VB marginals are used in closed form (Gaussian for the
  coefficients, inverse-gamma for the variances); MCMC marginals by a Gaussian kernel density
  estimate (linear binning on a fine grid, Silverman's bandwidth, reflection at 0 for
  variances). Point masses at exactly 0 (Laplace-zero fits) are compared as such. For VB fits
  of the linear model the linear-response sd (:mod:`vbsvm.posterior.linear_response`) is shown next to
  the mean-field sd. For Laplace-zero fits the inclusion probabilities are put side by side.
* :meth:`Comparison.predictions` — agreement of the class labels and mean / max
  ``|Delta P(f > 0)|`` on the reference fit's training data.
* :meth:`Comparison.plot` — ArviZ forest or density plots with the fits overlaid, or a
  side-by-side inclusion bar chart.

The reference is the first Gibbs fit (else the first fit) unless ``reference=`` says otherwise.

GP fits (:func:`vbsvm.gpsvm`, any method) have no coefficients: their table compares the
predictive distribution of the latent score, ``f[<row>]``, at ``n_points`` rows of the reference
fit's training data (closed-form Gaussian q(f) for VB/SVI, draws for Gibbs) and lists the kernel
hyperparameters both fits have (point estimates, so no accuracy).

Every fit gives what the comparison needs through the result contract
(:class:`vbsvm.results.contract.FitResult`): named marginals (:meth:`marginals`), its draws, its
training rows, inclusion probabilities and linear-response sds where it has them. Draws of a
requested (chain, draw) shape come from a new object (``fit.with_draw_shape``), never from a
shallow copy of the fit, so no cache is shared between a fit and its redrawn version.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr

from vbsvm.exceptions import DiagnosticWarning, InputError, InputTypeError
from vbsvm.results.marginal import Marginal, kde_on_grid

__all__ = ["compare", "Comparison", "accuracy", "kde_on_grid", "Marginal"]

PLOT_KINDS = ("forest", "density", "inclusion")


# =============================================================================== accuracy
def accuracy(q, p, *, lower=None, max_grid=2 ** 16) -> float:
    r"""Accuracy of the marginal ``q`` against the reference ``p``, in percent.

    ``100 * (1 - 0.5 * integral |q - p|)``: 100 for identical densities, 0 for disjoint ones.

    Parameters
    ----------
    q, p : scipy.stats frozen distribution or array_like
        A closed-form density (anything with ``pdf`` and ``ppf``, e.g. ``scipy.stats.norm(0, 1)``)
        or draws (estimated by :func:`kde_on_grid`). Draws that are exactly 0 are treated as a
        point mass at 0 (spike-and-slab posteriors).
    lower : float, optional
        Known lower bound of the support (e.g. 0 for a variance); KDEs are reflected there.
    max_grid : int
        Largest integration grid.

    Returns
    -------
    float
        Accuracy in [0, 100]: 0 if the continuous parts' supports (their 1e-7 and 1 - 1e-7
        quantiles, or the draws' range plus 5 bandwidths) do not overlap; NaN if either marginal is
        a single point or a support bound is not a finite number (e.g. an inverse gamma with a
        scale near the largest float).

    Examples
    --------
    >>> from scipy import stats
    >>> round(accuracy(stats.norm(0, 1), stats.norm(1, 1)), 2)   # 200 * (1 - Phi(1/2))
    61.71
    """
    mq, mp = Marginal.coerce(q, lower), Marginal.coerce(p, lower)
    if mq.kind == "point" or mp.kind == "point":
        return float("nan")
    l1 = abs(mq.spike() - mp.spike())
    sq, sp = mq.support(), mp.support()
    parts = [s for s in (sq, sp) if s is not None]
    if not all(np.isfinite(s[0]) and np.isfinite(s[1]) for s in parts):
        return float("nan")
    if len(parts) == 2 and (sq[1] <= sp[0] or sp[1] <= sq[0]):  # disjoint: no grid can hold both
        l1 += (1.0 - mq.spike()) + (1.0 - mp.spike())
        parts = []
    if parts:
        lo = min(s[0] for s in parts)
        hi = max(s[1] for s in parts)
        if lower is not None:
            lo = max(lo, lower)
        res = min(s[2] for s in parts)
        G = int(min(max_grid, max(2048, np.ceil((hi - lo) / res) + 1)))
        grid = np.linspace(lo, hi, G)
        diff = np.abs(mq.density(grid) - mp.density(grid))
        l1 += float(np.trapezoid(diff, grid))
    return float(np.clip(100.0 * (1.0 - 0.5 * l1), 0.0, 100.0))


# =============================================================================== fits
#: methods of the result contract (:class:`vbsvm.results.contract.FitResult`) that compare calls
CONTRACT = ("marginals", "predict", "draws", "training_rows", "evaluation_points", "inclusion_probabilities",
            "linear_response_sd", "observed_signs")


def _plotted(post, ranef: bool) -> list:
    """Posterior variables a forest or density plot shows: the coefficients and variances (and
    the random effects with ``ranef``)."""
    return [v for v in post.data_vars
            if v == "beta" or v.startswith("sigma2") or (ranef and v.startswith("b_"))]


# =============================================================================== Comparison
class Comparison:
    """Side-by-side view of several fits of the same model (see :func:`compare`).

    Attributes
    ----------
    fits : dict
        ``{name: fit}`` in the order given.
    reference : str
        Name of the reference fit (the "exact" one, usually Gibbs).
    """

    def __init__(self, fits: dict, reference: str, n_points: int = 30):
        self.fits = fits
        self.reference = reference
        self.n_points = n_points
        self._cache = {}

    def __repr__(self):
        return f"<vbsvm.Comparison {list(self.fits)} reference={self.reference!r}>"

    # ---------------------------------------------------------------- table
    def _ref_shape(self):
        """``(chains, draws)`` of the reference fit's draws."""
        return tuple(self.fits[self.reference].draw_shape)

    def _points(self):
        """Rows (and labels) of the reference fit where models without coefficients are compared."""
        if "points" not in self._cache:
            self._cache["points"] = self.fits[self.reference].evaluation_points(self.n_points)
        return self._cache["points"]

    def _marg(self, name, ranef):
        key = ("marg", name, ranef)
        if key not in self._cache:
            self._cache[key] = self.fits[name].marginals(ranef=ranef, points=self._points(),
                                                         draw_shape=self._ref_shape())
        return self._cache[key]

    def _lr(self, name):
        key = ("lr", name)
        if key not in self._cache:
            try:
                self._cache[key] = self.fits[name].linear_response_sd()
            except InputError as exc:
                warnings.warn(f"no linear-response sd for {name!r}: {exc}", DiagnosticWarning, stacklevel=3)
                self._cache[key] = None
        return self._cache[key]

    def table(self, *, ranef: bool = False, lr: bool = True) -> pd.DataFrame:
        """Per-parameter comparison against the reference fit.

        Parameters
        ----------
        ranef : bool
            Include the random intercepts ``b_<group>[level]`` (one row each).
        lr : bool
            Add the linear-response sd of linear VB fits (``<name>_sd_lr``, ``<name>_sd_lr_ratio``).

        Returns
        -------
        pandas.DataFrame
            Index: parameter (``beta[term]``, ``sigma2_*``, ...). Columns, for every fit:
            ``<name>_mean``, ``<name>_sd``; for every fit but the reference:
            ``<name>_diff_sd`` = (mean - reference mean) / reference sd, ``<name>_sd_ratio`` =
            sd / reference sd, ``<name>_accuracy`` (percent, see :func:`accuracy`); for
            Laplace-zero fits ``<name>_p_include``.
        """
        key = ("table", ranef, lr)
        if key in self._cache:
            return self._cache[key].copy()
        margs = {name: self._marg(name, ranef) for name in self.fits}
        ref = self.reference
        params = [p for p in margs[ref] if all(p in m for m in margs.values())]
        if not params:
            raise InputError(
                "the fits share no parameter names; compare fits of the same formula "
                f"(parameters of {ref!r}: {list(margs[ref])[:6]} ...)."
            )
        cols = {}
        for name in self.fits:
            cols[f"{name}_mean"] = [margs[name][p].mean for p in params]
            cols[f"{name}_sd"] = [margs[name][p].sd for p in params]
        ref_mean = np.array(cols[f"{ref}_mean"])
        ref_sd = np.array(cols[f"{ref}_sd"])
        with np.errstate(divide="ignore", invalid="ignore"):
            for name in self.fits:
                if name == ref:
                    continue
                cols[f"{name}_diff_sd"] = (np.array(cols[f"{name}_mean"]) - ref_mean) / ref_sd
                cols[f"{name}_sd_ratio"] = np.array(cols[f"{name}_sd"]) / ref_sd
                if lr:
                    sd = self._lr(name)
                    if sd is not None:
                        v = np.array([sd.get(p, np.nan) for p in params])
                        cols[f"{name}_sd_lr"] = v
                        cols[f"{name}_sd_lr_ratio"] = v / ref_sd
                cols[f"{name}_accuracy"] = [accuracy(margs[name][p], margs[ref][p], lower=margs[ref][p].lower)
                                            for p in params]
        for name, fit in self.fits.items():
            inc = fit.inclusion_probabilities()
            if inc is not None:
                cols[f"{name}_p_include"] = [inc.get(p, np.nan) for p in params]
        out = pd.DataFrame(cols, index=pd.Index(params, name="parameter"))
        self._cache[key] = out
        return out.copy()

    # ---------------------------------------------------------------- predictions
    def predictions(self, data=None) -> pd.DataFrame:
        """Agreement of the predictions of every fit with the reference's.

        Parameters
        ----------
        data : pandas.DataFrame, optional
            Rows to predict; default the reference fit's training data.

        Returns
        -------
        pandas.DataFrame
            One row per fit (the reference too, trivially): ``n``, ``agreement`` (fraction of
            rows with the same predicted class, i.e. the same sign of the posterior mean score),
            ``mean_abs_diff_prob`` and ``max_abs_diff_prob`` (differences of
            ``P(f > 0 | data)``; NaN for MAP fits) and ``accuracy_train`` (fraction of rows whose
            predicted class is the observed one, when ``data`` has the response).
        """
        if data is None and "pred" in self._cache:
            return self._cache["pred"].copy()
        cache = data is None
        ref_fit = self.fits[self.reference]
        if data is None:
            data = ref_fit.training_rows()
            if data is None:
                raise InputError(
                    f"the reference fit {self.reference!r} carries no training data (e.g. a GP fit "
                    "loaded from a file); pass the rows to predict: predictions(data=frame).")
        obs = ref_fit.observed_signs(data)
        for name, fit in self.fits.items():
            absent = [c for c in (fit.predictor_columns or []) if c not in data.columns]
            if absent:
                rows = (f"the reference fit {self.reference!r}'s training rows" if cache
                        else "the rows passed as data")
                raise InputError(
                    f"fit {name!r} uses column(s) {absent} that {rows} lack (the fits have different "
                    "formulas); pass rows with every column the fits use: predictions(data=frame).")
        per_fit = {name: self._score_and_prob(fit, data) for name, fit in self.fits.items()}
        ref_sign, ref_prob = per_fit[self.reference]
        rows = {}
        for name, (sign, prob) in per_fit.items():
            d = np.abs(prob - ref_prob)
            row = {"n": len(sign), "agreement": float(np.mean(sign == ref_sign)),
                   "mean_abs_diff_prob": float(np.mean(d)) if np.isfinite(d).all() else np.nan,
                   "max_abs_diff_prob": float(np.max(d)) if np.isfinite(d).all() else np.nan}
            if obs is not None:
                row["accuracy_train"] = float(np.mean(sign == obs))
            rows[name] = row
        out = pd.DataFrame.from_dict(rows, orient="index")
        out.index.name = "fit"
        if cache:
            self._cache["pred"] = out
        return out.copy()

    @staticmethod
    def _score_and_prob(fit, data):
        """Predicted class as a sign (+1 = positive level) and ``P(f > 0 | data)`` of one fit
        (rows a linear fit cannot predict raise, rather than count as disagreements)."""

        score = fit.predict(data, kind="score", na_action="raise")
        sign = np.where(score["mean"].to_numpy() > 0, 1, -1)
        if fit.point:
            return sign, np.full(len(data), np.nan)
        return sign, np.asarray(fit.predict(data, kind="prob", na_action="raise"), dtype=float)

    # ---------------------------------------------------------------- plots
    def _trees(self):
        """``{name: DataTree}`` (the posterior draws) with the VB draws redrawn in the reference's
        (chain, draw) shape."""
        shape = self._ref_shape()
        trees = {}
        for name, fit in self.fits.items():
            tree = xr.DataTree.from_dict({"posterior": fit.draws(*shape)})
            post = tree["posterior"]
            got = (post.sizes.get("chain"), post.sizes.get("draw"))
            if got != shape:
                warnings.warn(
                    f"fit {name!r} has {got[0]} x {got[1]} (chain x draw) draws but the reference has "
                    f"{shape[0]} x {shape[1]}; ArviZ pads the shorter with NaN in overlaid plots. "
                    "Refit with the same chains= and draws= for a clean overlay.",
                    DiagnosticWarning, stacklevel=3)
            trees[name] = tree
        return trees

    @staticmethod
    def _n_panels(tree, var_names):
        post = tree["posterior"]
        total = 0
        for v in var_names:
            da = post[v]
            extra = [d for d in da.dims if d not in ("chain", "draw")]
            total += int(np.prod([da.sizes[d] for d in extra])) if extra else 1
        return max(total, 1)

    def _var_names(self, ranef):
        return _plotted(self.fits[self.reference].draws(), ranef)

    def plot(self, kind: str = "forest", *, ranef: bool = False, **kwargs):
        """Plot the fits overlaid.

        Parameters
        ----------
        kind : {"forest", "density", "inclusion"}
            ``"forest"``: :func:`arviz_plots.plot_forest` of the coefficients (one x-axis, so the
            variances are left out unless ``var_names=`` asks for them), one colour per fit, 50%
            and 95% equal-tailed intervals;
            ``"density"``: :func:`arviz_plots.plot_dist` of the coefficients and variances (KDEs
            of the draws; VB draws are iid from q, redrawn with the reference's (chain, draw)
            shape so that ArviZ overlays them without NaN padding);
            ``"inclusion"``: bar chart of the inclusion probabilities of Laplace-zero fits.
        ranef : bool
            Also plot the random intercepts (forest / density).
        **kwargs
            Passed to the ArviZ plotting function (forest / density) or to
            :func:`matplotlib.pyplot.subplots` (inclusion).

        Returns
        -------
        arviz_plots.PlotCollection or matplotlib.figure.Figure
            Both have ``savefig(path)``.
        """
        if kind not in PLOT_KINDS:
            raise InputError(f"kind must be one of {PLOT_KINDS}; got {kind!r}.")
        if kind == "inclusion":
            return self._plot_inclusion(**kwargs)
        without = [name for name, f in self.fits.items() if "beta" not in f.draws().data_vars]
        if without:
            raise InputError(
                f"kind={kind!r} plots the coefficients (posterior variable 'beta') and fit(s) {without} have none "
                "(GP fits: use table(), which compares f at common points and the kernel hyperparameters, "
                "or predictions()).")
        import arviz_plots as azp

        trees = self._trees()
        default = self._var_names(ranef)
        if kind == "forest":  # one x-axis: keep the coefficients, variances live on another scale
            default = [v for v in default if not v.startswith("sigma2")]
        var_names = kwargs.pop("var_names", default)
        kwargs.setdefault("backend", "matplotlib")
        if kind == "forest":
            kwargs.setdefault("combined", True)
            kwargs.setdefault("ci_kind", "eti")
            kwargs.setdefault("ci_probs", (0.5, 0.95))
            pc = azp.plot_forest(trees, var_names=var_names, **kwargs)
        else:
            kwargs.setdefault("visuals", {"point_estimate_text": False})
            kwargs.setdefault("ci_kind", "eti")
            kwargs.setdefault("ci_prob", 0.95)
            n_panels = self._n_panels(trees[self.reference], var_names)
            ncol = min(kwargs.get("col_wrap", 4), n_panels)
            nrow = -(-n_panels // ncol)
            kwargs.setdefault("figure_kwargs", {"figsize": (3.6 * ncol, 2.9 * nrow), "layout": "constrained"})
            pc = azp.plot_dist(trees, var_names=var_names, **kwargs)
        try:
            pc.add_legend("model")
        except Exception:  # legend support is experimental in arviz-plots; the plot stands without
            pass
        return pc

    def _plot_inclusion(self, **kwargs):
        import matplotlib.pyplot as plt

        incs = {name: fit.inclusion_probabilities() for name, fit in self.fits.items()}
        incs = {k: v for k, v in incs.items() if v is not None}
        if not incs:
            raise InputError(
                "kind='inclusion' needs Laplace-zero fits (prior=vbsvm.LaplaceZero(...)); "
                "none of the compared fits has inclusion probabilities."
            )
        order_from = self.reference if self.reference in incs else next(iter(incs))
        terms = sorted(incs[order_from], key=lambda t: incs[order_from][t])
        k = len(incs)
        height = 0.8 / k
        kwargs.setdefault("figsize", (7, max(3.0, 0.28 * len(terms) + 1.2)))
        fig, ax = plt.subplots(**kwargs)
        ypos = np.arange(len(terms))
        for i, (name, inc) in enumerate(incs.items()):
            vals = [inc.get(t, np.nan) for t in terms]
            ax.barh(ypos + ((k - 1) / 2 - i) * height, vals, height=height, label=name)
        ax.set_yticks(ypos, [t[5:-1] if t.startswith("beta[") else t for t in terms])
        ax.set_xlim(0, 1)
        ax.set_xlabel("posterior inclusion probability")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.set_title("Inclusion probabilities")
        fig.tight_layout()
        return fig

    # ---------------------------------------------------------------- text
    def to_text(self, *, ranef: bool = False, lr: bool = True, digits: int = 4) -> str:
        """The comparison table, the prediction agreement and notes, as plain text."""
        tab = self.table(ranef=ranef, lr=lr)
        has_rows = self.fits[self.reference].training_rows() is not None
        lines = [f"Comparison of {', '.join(self.fits)} (reference: {self.reference})", ""]
        with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", 500):
            lines.append(tab.to_string(float_format=lambda v: f"{v:.{digits}g}"))
            if not has_rows:
                pred = "(not available: the reference fit carries no training data)"
            else:
                try:
                    pred = self.predictions().to_string(float_format=lambda v: f"{v:.{digits}g}")
                except InputError as exc:  # e.g. fits of different formulas
                    pred = f"(not available: {exc})"
            lines += ["", "Predictions on the reference fit's training data:", pred]
        notes = ["", "diff_sd = (mean - reference mean) / reference sd; sd_ratio = sd / reference sd;",
                 "accuracy = 100 (1 - 0.5 * integral |q - p_ref|) %, reference density by KDE when it is a sample."]
        if any(c.endswith("_sd_lr") for c in tab.columns):
            notes.append("sd_lr: linear-response corrected VB sd (experimental; vbsvm.linear_response).")
        return "\n".join(lines + notes)

    def __str__(self):
        return self.to_text()


def compare(*fits, names=None, reference=None, n_points=30) -> Comparison:
    """Compare fits of the same model, e.g. VB against Gibbs.

    Parameters
    ----------
    *fits : vbsvm fits
        Two or more fits of the same formula on the same data (``vbsvm.svm`` results, or fits
        loaded with :func:`vbsvm.load`).
    names : sequence of str, optional
        Names for the fits; default their methods (``"vb"``, ``"gibbs"``, ``"map"``; repeats
        get ``_2``, ``_3``...).
    reference : str or int, optional
        The fit the others are measured against (name or position); default the first Gibbs
        fit, else the first fit.
    n_points : int
        GP fits (:func:`vbsvm.gpsvm`): the latent score f is compared at this many rows of the
        reference fit's training data (evenly spaced; its inducing locations for array fits),
        next to the kernel hyperparameters.

    Returns
    -------
    Comparison

    Examples
    --------
    >>> toenail = vbsvm.datasets.load("toenail")                                   # doctest: +SKIP
    >>> f = "y ~ time * terbinafine + (1 | patient_id)"                             # doctest: +SKIP
    >>> cmp = vbsvm.compare(vbsvm.svm(f, toenail, penalty=None),
    ...                     vbsvm.svm(f, toenail, penalty=None, method="gibbs"))    # doctest: +SKIP
    >>> cmp.table()[["vb_mean", "gibbs_mean", "vb_accuracy"]]                       # doctest: +SKIP
    >>> cmp.plot("forest").savefig("forest.png")                                    # doctest: +SKIP
    """
    if len(fits) == 1 and isinstance(fits[0], (list, tuple)):
        fits = tuple(fits[0])
    if len(fits) < 2:
        raise InputError(f"compare needs at least two fits, got {len(fits)}; e.g. compare(fit_vb, fit_gibbs).")
    for i, f in enumerate(fits):
        if not all(callable(getattr(f, name, None)) for name in CONTRACT):
            raise InputTypeError(
                f"argument {i + 1} of compare is a {type(f).__name__}, not a vbsvm fit; pass results "
                "of vbsvm.svm(...) or vbsvm.load(...)."
            )
    if names is None:
        names, seen = [], {}
        for f in fits:
            base = str(f.method)
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    else:
        if isinstance(names, str):
            raise InputTypeError("names must be a list of strings, one per fit, e.g. names=['vb', 'gibbs'].")
        names = [str(n) for n in names]
        if len(names) != len(fits):
            raise InputError(f"names has {len(names)} entries but {len(fits)} fits were given; give one name per fit.")
        if len(set(names)) != len(names):
            raise InputError(f"names must be distinct; got {names}.")
    formulas = {f.formula for f in fits}
    if len(formulas) > 1:
        warnings.warn(f"the fits have different formulas {sorted(map(str, formulas))}; only the parameters they "
                      "share are compared.", DiagnosticWarning, stacklevel=2)
    if reference is None:
        idx = next((i for i, f in enumerate(fits) if f.sampled), 0)
    elif isinstance(reference, (int, np.integer)) and not isinstance(reference, bool):
        if not -len(fits) <= reference < len(fits):
            raise InputError(f"reference={reference} is out of range for {len(fits)} fits.")
        idx = int(reference) % len(fits)
    elif reference in names:
        idx = names.index(reference)
    else:
        raise InputError(f"reference must be one of the names {names} or a position; got {reference!r}.")
    if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 1:
        raise InputError(f"n_points must be a positive integer, e.g. n_points=30; got {n_points!r}.")
    return Comparison(dict(zip(names, fits)), names[idx], int(n_points))
