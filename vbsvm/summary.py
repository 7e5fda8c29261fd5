"""statsmodels-style summary tables for vbsvm fits (text, HTML and LaTeX).

:func:`build_summary` returns a :class:`statsmodels.iolib.summary2.Summary`, so
``as_text()``, ``as_html()``, ``as_latex()`` and the notebook display work as for statsmodels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from statsmodels.iolib.summary2 import Summary

__all__ = ["build_summary", "penalty_description", "format_number"]

METHOD_NAMES = {
    "vb": "Variational Bayes (mean field)",
    "gibbs": "Gibbs sampling",
    "map": "Posterior mode (EM)",
}


def format_number(x) -> str:
    if x is None:
        return ""
    if isinstance(x, (str, bool, np.bool_)):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3e}"
    return f"{x:.4f}"


def penalty_description(settings) -> str:
    pen = settings.get("penalty", "auto")
    if pen == "auto":
        return f"inferred: sigma2_u ~ IG({settings['A_u']:g}, {settings['B_u']:g}), alpha = 1/(4 sigma2_u)"
    if pen is None:
        return f"none: N(0, {settings['sigma2_beta']:g}) on every fixed effect"
    return f"fixed: alpha = {pen:g} (sigma2_u = {1 / (4 * pen):g})"


def _header(fit) -> dict:
    d = fit.design
    s = fit.settings
    head = {
        "Model:": fit.info.get("model", "Bayesian linear SVM"),
        "Method:": METHOD_NAMES.get(fit.method, fit.method),
        "Response:": f"{d.response} (+1 = {d.positive_level!r}, -1 = {d.negative_level!r})",
        "No. observations:": d.n,
    }
    if d.n_dropped:
        head["Rows dropped (missing):"] = d.n_dropped
    for g in d.groups:
        head[f"Groups ({g.name}):"] = g.n_levels
    head["Penalty:"] = penalty_description(s)
    head["Standardized:"] = "yes (results on original scale)" if s.get("standardize", True) else "no"
    if fit.method == "vb":
        elbo = fit.posterior["elbo"]
        head["ELBO:"] = format_number(float(elbo[-1]))
        head["Converged:"] = "yes" if fit.info.get("converged") else "NO"
        head["Iterations (sweeps):"] = f"{len(elbo) - 1} ({fit.info.get('n_sweeps', '?')})"
    elif fit.method == "gibbs":
        head["Chains x draws:"] = f"{s['chains']} x {s['draws']} (tune {s['tune']}, thin {s['thin']})"
        diag = fit.diagnostics()
        head["Max R-hat:"] = format_number(float(diag["r_hat"].max()))
        head["Min bulk ESS:"] = format_number(float(diag["ess_bulk"].min()))
    else:
        head["Converged:"] = "yes" if fit.info.get("converged") else "NO"
        head["Iterations:"] = fit.info.get("n_iter", "?")
    if "seconds" in fit.info:
        head["Time (s):"] = format_number(float(fit.info["seconds"]))
    return head


def _format_table(df: pd.DataFrame) -> pd.DataFrame:
    return df.map(format_number)


def build_summary(fit, level: float) -> Summary:
    """Summary of a linear :class:`~vbsvm.results.Fit` at interval level ``level``."""
    smry = Summary()
    smry.add_title(f"{fit.info.get('model', 'Bayesian linear SVM')}: {fit.design.formula}")
    head = {k: (v if isinstance(v, str) else format_number(v)) for k, v in _header(fit).items()}
    smry.add_dict(head, ncols=2)
    coef = fit.coef_table(level)
    if fit.method == "gibbs":
        diag = fit.diagnostics()
        rows = [f"beta[{t}]" for t in coef.index]
        coef = coef.join(diag.loc[rows, ["r_hat", "ess_bulk", "ess_tail", "mcse_mean"]].set_axis(coef.index))
    smry.add_df(_format_table(coef), index=True)
    if fit.layout.variances:
        smry.add_text("Variance components and penalty:")
        smry.add_df(_format_table(fit.varcomp(level)), index=True)
    for extra in fit.info.get("summary_blocks", []):
        smry.add_text(extra)
    notes = [
        "Coefficients are on the original predictor scale; the score is f(x) = x'beta (+ random intercepts).",
        f"Intervals: {100 * level:g}% "
        + ("Gaussian q-intervals." if fit.method == "vb" else "equal-tailed posterior quantiles." if fit.method == "gibbs" else "not available for a mode."),
    ]
    if fit.method == "vb":
        notes.append("Mean-field VB sds for this augmentation are typically about half of MCMC's; "
                     "check with vbsvm.compare(fit_vb, fit_gibbs).")
    smry.add_text("\n".join(notes))
    return smry
