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

Draws of a requested (chain, draw) shape come from a new object (:func:`_with_draw_shape`), never
from a shallow copy of the fit, so no cache is shared between a fit and its redrawn version.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from scipy.signal import fftconvolve

from vbsvm.exceptions import DiagnosticWarning, InputError, InputTypeError
from vbsvm.posterior.linear_response import MAX_N as LR_MAX_N
from vbsvm.posterior.linear_response import linear_response
from vbsvm.results.fit import Fit
from vbsvm.settings import FitSettings

__all__ = ["compare", "Comparison", "accuracy", "kde_on_grid"]

PLOT_KINDS = ("forest", "density", "inclusion")


# =============================================================================== accuracy
def _silverman(x) -> float:
    x = np.asarray(x, dtype=float)
    sd = x.std(ddof=1) if x.size > 1 else 0.0
    iqr = np.subtract(*np.percentile(x, [75, 25])) / 1.349 if x.size > 1 else 0.0
    spread = min(sd, iqr) if iqr > 0 else sd
    if not spread > 0:
        spread = max(abs(float(x.mean())), 1.0) * 1e-8 if x.size else 1.0
    return 0.9 * spread * x.size ** (-0.2)


def kde_on_grid(draws, grid, *, bandwidth=None, lower=None) -> np.ndarray:
    """Gaussian kernel density estimate of ``draws`` on an evenly spaced ``grid``.

    Linear binning plus an FFT convolution (exact up to the binning, O(N + G log G)).

    Parameters
    ----------
    draws : array_like
        1-d sample.
    grid : numpy.ndarray
        Evenly spaced evaluation points, covering the data.
    bandwidth : float, optional
        Kernel sd; default Silverman's rule ``0.9 min(sd, IQR/1.349) N^(-1/5)``.
    lower : float, optional
        Known lower bound of the support: the estimate is reflected there (no mass leaks below).

    Returns
    -------
    numpy.ndarray
        Density values at ``grid`` (integrating to ~1 over the grid).
    """
    x = np.asarray(draws, dtype=float).ravel()
    h = _silverman(x) if bandwidth is None else float(bandwidth)
    if lower is not None:
        x = np.concatenate([x, 2.0 * lower - x])
    g0, dx = grid[0], grid[1] - grid[0]
    # extend the grid by 5 bandwidths on both sides so that no kernel mass is cut
    pad = int(np.ceil(5 * h / dx)) + 1
    G = grid.size + 2 * pad
    pos = (x - g0) / dx + pad
    inside = (pos >= 0) & (pos <= G - 1)
    pos = pos[inside]
    left = np.floor(pos).astype(np.int64)
    left = np.minimum(left, G - 2)
    frac = pos - left
    counts = np.bincount(left, weights=1.0 - frac, minlength=G) + np.bincount(left + 1, weights=frac, minlength=G)
    half = int(np.ceil(5 * h / dx))
    kx = np.arange(-half, half + 1) * dx
    kernel = np.exp(-0.5 * (kx / h) ** 2)
    kernel /= kernel.sum() * dx
    dens = fftconvolve(counts, kernel, mode="same")[pad: pad + grid.size]
    n_orig = np.asarray(draws).size
    dens = np.maximum(dens, 0.0) / n_orig
    if lower is not None:
        dens[grid < lower] = 0.0
    return dens


@dataclass
class _Marginal:
    """A one-dimensional marginal: closed form (``dist``), a sample (``draws``), or a point."""

    mean: float
    sd: float
    dist: object = None
    draws: np.ndarray | None = None
    lower: float | None = None

    @property
    def kind(self) -> str:
        return "analytic" if self.dist is not None else "draws" if self.draws is not None else "point"

    def spike(self) -> float:
        if self.draws is None:
            return 0.0
        return float(np.mean(self.draws == 0.0))

    def _continuous(self):
        if self.draws is None:
            return None
        nz = self.draws[self.draws != 0.0]
        return nz if nz.size >= 2 else None

    def support(self):
        """(lo, hi, resolution) of the continuous part, or None if it has none."""
        if self.dist is not None:
            lo, hi = self.dist.ppf(1e-7), self.dist.ppf(1 - 1e-7)
            return float(lo), float(hi), float(self.dist.std()) / 20.0
        nz = self._continuous()
        if nz is None:
            return None
        h = _silverman(nz)
        return float(nz.min() - 5 * h), float(nz.max() + 5 * h), h / 5.0

    def density(self, grid):
        """Continuous part of the density on ``grid`` (integrates to ``1 - spike``)."""
        if self.dist is not None:
            return self.dist.pdf(grid)
        nz = self._continuous()
        if nz is None:
            return np.zeros_like(grid)
        return kde_on_grid(nz, grid, lower=self.lower) * (nz.size / self.draws.size)


def _as_marginal(x, lower=None) -> _Marginal:
    if isinstance(x, _Marginal):
        return x
    if hasattr(x, "pdf") and hasattr(x, "ppf"):
        return _Marginal(float(x.mean()), float(x.std()), dist=x, lower=lower)
    arr = np.asarray(x, dtype=float).ravel()
    if arr.size < 2 or not np.all(np.isfinite(arr)):
        raise InputError("draws for the accuracy score must be at least 2 finite numbers.")
    return _Marginal(float(arr.mean()), float(arr.std(ddof=1)), draws=arr, lower=lower)


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
    mq, mp = _as_marginal(q, lower), _as_marginal(p, lower)
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


# =============================================================================== fit marginals
def _is_linear_vb(fit) -> bool:
    """Does the fit carry the closed-form q of the linear model (Gaussian theta, IG variances)?"""
    P = getattr(fit, "posterior", None)
    return (getattr(fit, "method", None) == "vb" and isinstance(P, dict) and "theta_mean" in P
            and "theta_var" in P and hasattr(fit, "layout")
            and (getattr(fit, "settings", {}) or {}).get("prior") is None)


def _with_draw_shape(fit, shape):
    """``fit`` with its iid draws from q in the shape ``(chains, draws)``.

    Only fits whose draws come from a variational q (``method`` ``"vb"`` or ``"svi"``) are
    redrawn; sampler draws stay as they are.  The result is a new object that shares no cache
    with ``fit`` (``fit`` itself is never changed): the fit's own ``with_draw_shape(chains,
    draws)`` when it has one, else a fresh dataclass instance built from the fit's saved
    posterior with the new shape in its settings.
    """
    if shape is None or getattr(fit, "method", None) not in ("vb", "svi"):
        return fit
    chains, draws = int(shape[0]), int(shape[1])
    if hasattr(fit, "with_draw_shape"):
        return fit.with_draw_shape(chains, draws)
    if dataclasses.is_dataclass(fit) and isinstance(getattr(fit, "settings", None), FitSettings):
        return dataclasses.replace(fit, settings=dataclasses.replace(fit.settings, chains=chains, draws=draws))
    return fit


def _posterior(fit, shape=None):
    """The ``posterior`` group of ``fit.to_arviz()``; VB draws redrawn with ``shape`` if given."""
    return _with_draw_shape(fit, shape).to_arviz()["posterior"].to_dataset()


def _is_gp(fit) -> bool:
    """A sparse-GP fit (:class:`vbsvm.GPFit`): compared by f at common points and its kernel
    hyperparameters."""
    return hasattr(fit, "predict_f") and hasattr(fit, "hyperparameters")


def _training_rows(fit):
    """The fit's training data as a DataFrame, or None when it does not carry it (array fits,
    GP fits loaded from a file)."""
    raw = getattr(getattr(fit, "design", None), "raw", None)
    return raw if raw is not None and len(raw) > 0 else None


def _gp_points(fit, n_points):
    """Up to ``n_points`` rows of ``fit``'s training data, evenly spaced (its inducing
    locations, standardized, when it carries no data), and their labels ``f[<row>]``."""
    raw = _training_rows(fit)
    rows = raw if raw is not None else np.asarray(fit.inducing_points)
    idx = np.unique(np.linspace(0, len(rows) - 1, min(n_points, len(rows))).round().astype(int))
    if raw is not None:
        return raw.iloc[idx], [f"f[{lab}]" for lab in raw.index[idx]]
    return rows[idx], [f"f[z{i}]" for i in idx]


def _gp_marginals(fit, points, labels) -> dict:
    """``{f[row]: marginal of f, hyperparameter: its value}`` of a GP fit: q(f) in closed form
    (VB/SVI) or the draws of f (Gibbs); hyperparameters are point estimates."""
    out = {}
    if getattr(fit, "gibbs_draws", None) is None:
        mean, var = fit.predict_f(points)
        for lab, m_, v_ in zip(labels, mean, np.sqrt(var)):
            out[lab] = _Marginal(float(m_), float(v_), dist=stats.norm(m_, v_))
    else:
        F = fit.f_draws(points).reshape(-1, len(labels))
        for k, lab in enumerate(labels):
            out[lab] = _Marginal(float(F[:, k].mean()), float(F[:, k].std(ddof=1)), draws=F[:, k])
    for name, value in fit.hyperparameters["value"].items():
        out[name] = _Marginal(float(value), float("nan"))
    return out


def _wanted(var: str, ranef: bool) -> bool:
    if var == "beta" or var.startswith("sigma2"):
        return True
    return ranef and var.startswith("b_")


def _marginals(fit, ranef: bool, shape=None) -> dict:
    """Ordered ``{parameter name: _Marginal}`` of a fit.

    Closed form for linear VB fits; otherwise from the draws of ``fit.to_arviz()`` (a VB fit's
    iid draws from q are redrawn with ``shape`` = (chains, draws) when given).
    """
    out = {}
    if _is_linear_vb(fit):
        P, lay = fit.posterior, fit.layout
        mean, var = np.asarray(P["theta_mean"]), np.asarray(P["theta_var"])
        for j, term in enumerate(lay.fixed):
            out[f"beta[{term}]"] = _Marginal(mean[j], np.sqrt(var[j]), dist=stats.norm(mean[j], np.sqrt(var[j])))
        for k, name in enumerate(lay.variances):
            a, b = float(np.atleast_1d(P["var_shape"])[k]), float(np.atleast_1d(P["var_scale"])[k])
            d = stats.invgamma(a, scale=b)
            out[name] = _Marginal(float(d.mean()), float(d.std()), dist=d, lower=0.0)
        if ranef:
            for g, (levels, ix) in lay.groups.items():
                for lv, i in zip(levels, ix):
                    out[f"b_{g}[{lv}]"] = _Marginal(mean[i], np.sqrt(var[i]), dist=stats.norm(mean[i], np.sqrt(var[i])))
        return out
    post = _posterior(fit, shape)
    point = getattr(fit, "method", None) == "map"
    for var in post.data_vars:
        if not _wanted(var, ranef):
            continue
        da = post[var]
        extra = [d for d in da.dims if d not in ("chain", "draw")]
        lower = 0.0 if var.startswith("sigma2") else None
        if len(extra) > 1:
            continue
        flat = da.values.reshape(da.shape[0] * da.shape[1], -1)
        labels = [f"{var}[{c}]" for c in da[extra[0]].values] if extra else [var]
        for k, name in enumerate(labels):
            x = flat[:, k]
            if point:
                out[name] = _Marginal(float(x[0]), float("nan"))
            else:
                out[name] = _Marginal(float(x.mean()), float(x.std(ddof=1)), draws=x, lower=lower)
    return out


def _inclusion(fit):
    """``{beta[term]: p_include}`` for fits with inclusion probabilities, else None."""
    if not hasattr(fit, "inclusion"):
        return None
    try:
        inc = fit.inclusion()
    except Exception:  # a fit type whose inclusion() is not available for this model
        return None
    return {f"beta[{t}]": float(v) for t, v in inc["p_include"].items()}


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
        if "shape" not in self._cache:
            post = _posterior(self.fits[self.reference])
            self._cache["shape"] = (post.sizes.get("chain", 1), post.sizes.get("draw", 1))
        return self._cache["shape"]

    def _marg(self, name, ranef):
        key = ("marg", name, ranef)
        if key not in self._cache:
            fit = self.fits[name]
            if _is_gp(fit):
                if "points" not in self._cache:
                    self._cache["points"] = _gp_points(self.fits[self.reference], self.n_points)
                self._cache[key] = _gp_marginals(fit, *self._cache["points"])
                return self._cache[key]
            shape = None
            if getattr(fit, "method", None) == "vb" and not _is_linear_vb(fit):
                ref = self._ref_shape()
                own = (fit.settings.get("chains", 1), fit.settings.get("draws", 1)) if hasattr(fit, "settings") else ref
                shape = ref if ref[0] * ref[1] > own[0] * own[1] else None
            self._cache[key] = _marginals(fit, ranef, shape)
        return self._cache[key]

    def _lr(self, name):
        key = ("lr", name)
        if key not in self._cache:

            fit = self.fits[name]
            eligible = (_is_linear_vb(fit) and fit.settings.get("missing") != "impute"
                        and fit.settings.get("approximation") != "calibrated")
            if eligible and fit.n_obs > LR_MAX_N:
                warnings.warn(
                    f"no linear-response sd for {name!r}: its dense {fit.n_obs} x {fit.n_obs} solve is "
                    f"skipped above {LR_MAX_N} rows (in Python, vbsvm.posterior.linear_response(fit, max_n=...) "
                    "computes it if memory allows).", DiagnosticWarning, stacklevel=3)
                eligible = False
            try:
                self._cache[key] = linear_response(fit).sd if eligible else None
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
            inc = _inclusion(fit)
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
            data = _training_rows(ref_fit)
            if data is None:
                raise InputError(
                    f"the reference fit {self.reference!r} carries no training data (e.g. a GP fit "
                    "loaded from a file); pass the rows to predict: predictions(data=frame).")
        design = getattr(ref_fit, "design", None)
        response = getattr(design, "response", None)
        obs = None
        if response is not None and response in data.columns:
            obs = np.where(data[response].to_numpy() == design.positive_level, 1, -1)
        for name, fit in self.fits.items():
            fit_design = getattr(fit, "design", None)
            raw = getattr(fit_design, "raw", None)
            absent = [] if raw is None else [c for c in raw.columns
                                             if c != fit_design.response and c not in data.columns]
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

        kw = {"na_action": "raise"} if isinstance(fit, Fit) else {}
        score = fit.predict(data, kind="score", **kw)
        sign = np.where(score["mean"].to_numpy() > 0, 1, -1)
        if getattr(fit, "method", None) == "map":
            return sign, np.full(len(data), np.nan)
        return sign, fit.predict(data, kind="prob", **kw).to_numpy()

    # ---------------------------------------------------------------- plots
    def _trees(self):
        """``{name: DataTree}`` with the VB draws redrawn in the reference's (chain, draw) shape."""
        ref_post = _posterior(self.fits[self.reference])
        shape = (ref_post.sizes["chain"], ref_post.sizes["draw"])
        trees = {}
        for name, fit in self.fits.items():
            tree = _with_draw_shape(fit, shape).to_arviz()
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
        post = _posterior(self.fits[self.reference])
        names = [v for v in post.data_vars if _wanted(v, ranef)]
        return names

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
        if any(_is_gp(f) for f in self.fits.values()):
            raise InputError(
                f"kind={kind!r} plots the coefficients of linear fits and GP fits have none; use "
                "table() (f at common points and the kernel hyperparameters) or predictions().")
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

        incs = {name: _inclusion(fit) for name, fit in self.fits.items()}
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
        has_rows = _training_rows(self.fits[self.reference]) is not None
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
            notes.append("sd_lr: linear-response corrected VB sd (experimental; vbsvm.posterior.linear_response).")
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
    >>> cmp = vbsvm.results.compare(vbsvm.svm(f, toenail, penalty=None),
    ...                     vbsvm.svm(f, toenail, penalty=None, method="gibbs"))    # doctest: +SKIP
    >>> cmp.table()[["vb_mean", "gibbs_mean", "vb_accuracy"]]                       # doctest: +SKIP
    >>> cmp.plot("forest").savefig("forest.png")                                    # doctest: +SKIP
    """
    if len(fits) == 1 and isinstance(fits[0], (list, tuple)):
        fits = tuple(fits[0])
    if len(fits) < 2:
        raise InputError(f"compare needs at least two fits, got {len(fits)}; e.g. compare(fit_vb, fit_gibbs).")
    for i, f in enumerate(fits):
        if not (hasattr(f, "to_arviz") and hasattr(f, "predict")):
            raise InputTypeError(
                f"argument {i + 1} of compare is a {type(f).__name__}, not a vbsvm fit; pass results "
                "of vbsvm.svm(...) or vbsvm.load(...)."
            )
    if names is None:
        names, seen = [], {}
        for f in fits:
            base = str(getattr(f, "method", "fit"))
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
    formulas = {getattr(getattr(f, "design", None), "formula", None) for f in fits}
    if len(formulas) > 1:
        warnings.warn(f"the fits have different formulas {sorted(map(str, formulas))}; only the parameters they "
                      "share are compared.", DiagnosticWarning, stacklevel=2)
    if reference is None:
        idx = next((i for i, f in enumerate(fits) if getattr(f, "method", None) == "gibbs"), 0)
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
