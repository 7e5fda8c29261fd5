"""statsmodels-style summary tables for vbsvm fits (text, HTML and LaTeX).

:func:`build_summary` returns a :class:`statsmodels.iolib.summary.Summary`, so
``as_text()``, ``as_html()``, ``as_latex()`` and the notebook display work as for statsmodels.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from statsmodels.iolib.summary import Summary
from statsmodels.iolib.table import SimpleTable
from statsmodels.iolib.tableformatting import fmt_2cols, fmt_params

from vbsvm.inference.gibbs import ESS_TARGET, RHAT_TARGET, shortfall

__all__ = ["build_summary", "linear_summary_parts", "linear_header", "describe", "frame_table", "penalty_description",
           "format_number", "wrap_notes", "separation_note", "WIDTH"]

#: widest line of a text summary (statsmodels keeps 78; the tables with R-hat and ESS need more)
WIDTH = 100

#: how a moment that does not exist (an inverse-gamma mean with shape <= 1, sd with shape <= 2) is shown
UNDEFINED = "undefined"

METHOD_NAMES = {
    "vb": "Approximate posterior (fast)",
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
        return f"inferred: sigma2_u ~ IG({settings['A_u']:g}, {settings['B_u']:g})"
    if pen is None:
        return f"none: N(0, {settings['sigma2_beta']:g}) on every fixed effect"
    return f"fixed: alpha = {pen:g} (sigma2_u = {1 / (4 * pen):g})"


def is_calibrated(fit) -> bool:
    """Whether ``fit`` holds the calibrated approximation (EP integrated over the variances), not
    the mean field: what was run (``fit.info``), not what was asked for (``fit.settings``), since
    the models the calibration does not cover fall back to the mean field."""
    return fit.method == "vb" and str(fit.info.get("approximation", "")).startswith("calibrated")


def linear_header(fit) -> dict:
    """The summary header of a linear fit: model, method, data, prior and the run's convergence."""
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
    label, text = fit.prior_description()
    head[label] = text
    head["Standardized:"] = "yes (results on original scale)" if s.get("standardize", True) else "no"
    if fit.method == "vb":
        calibrated = is_calibrated(fit)
        completions = fit.info.get("vb_completions")
        rule = {"ccd": "EP over a CCD of the variances", "grid": "EP over a variance grid"}
        head["Approximation:"] = (rule.get(fit.info.get("strategy"), "EP over the variances") if calibrated
                                  else "mean field")
        if "log_evidence" in fit.posterior:
            head["Log evidence (EP):"] = format_number(float(fit.posterior["log_evidence"]))
            head["Grid points:"] = fit.info.get("grid_points", "?")
        elif completions:  # imputation: fits pooled over completions of the data
            label = "Log evidence (EP, mean):" if calibrated else "ELBO (mean over completions):"
            head[label] = format_number(float(fit.posterior["elbo"][-1]))
            head["Converged:"] = "yes" if fit.info.get("completions_converged", fit.info.get("converged")) else "NO"
            head["Completions (sweeps in all):"] = f"{completions} ({fit.info.get('n_sweeps', '?')})"
        else:
            elbo = fit.posterior["elbo"]
            head["ELBO:"] = format_number(float(elbo[-1]))
            head["Converged:"] = "yes" if fit.info.get("converged") else "NO"
            head["Iterations (sweeps):"] = f"{len(elbo) - 1} ({fit.info.get('n_sweeps', '?')})"
    elif fit.method == "gibbs":
        head["Chains x draws:"] = f"{s['chains']} x {fit.info.get('draws', s['draws'])} (tune {s['tune']}, thin {s['thin']})"
        if fit.info.get("draws_extended"):
            head["Extended:"] = _extension(fit)
        # the parameters the run length and the convergence warning judge (fixed effects and
        # variances), not the random-effect levels, whose own R-hat/ESS are in their table
        diag = fit.summary_diagnostics()
        if diag is None or diag.empty:
            diag = fit.diagnostics()
        head["Max R-hat:"] = format_number(float(diag["r_hat"].max()))
        head["Min bulk ESS:"] = format_number(int(round(diag["ess_bulk"].min())))
    else:
        head["Converged:"] = "yes" if fit.info.get("converged") else "NO"
        head["Iterations:"] = fit.info.get("n_iter", "?")
    if "seconds" in fit.info:
        head["Time (s):"] = format_number(float(fit.info["seconds"]))
    return head


def describe(fit, coef: pd.Series, extra=()) -> str:
    """The short description ``print(fit)`` shows: model and method, formula, coefficients
    (``coef``, at most 10 of them) and ``extra`` lines, within :data:`WIDTH` columns."""
    d = fit.design
    what = "posterior mode" if fit.method == "map" else "posterior mean"
    shown = ", ".join(f"{t} {format_number(v)}" for t, v in coef.iloc[:10].items())
    more = f", ... ({len(coef)} in all)" if len(coef) > 10 else ""
    lines = [f"{fit.info.get('model', 'Bayesian linear SVM')}: {METHOD_NAMES.get(fit.method, fit.method)}",
             f"Formula: {d.formula}",
             f"n = {d.n}; +1 = {d.positive_level!r}, -1 = {d.negative_level!r}"]
    lines += textwrap.wrap(f"Coefficients ({what}): {shown}{more}", WIDTH, subsequent_indent="  ")
    lines += [line for text in extra for line in textwrap.wrap(text, WIDTH, subsequent_indent="  ")]
    lines.append("fit.summary() gives intervals and diagnostics.")
    return "\n".join(lines)


def _header_table(head: dict, title: str) -> SimpleTable:
    """``label: value`` pairs in two side-by-side columns, as in statsmodels' model summaries, or
    in one column when two would be wider than :data:`WIDTH`."""
    items = [(k, v if isinstance(v, str) else format_number(v)) for k, v in head.items()]
    half = (len(items) + 1) // 2
    left, right = items[:half], items[half:]
    if len(right) < len(left):
        right.append(("", ""))
    table = SimpleTable([[v] for _, v in left], stubs=[k for k, _ in left], title=title, txt_fmt=fmt_2cols)
    table.extend_right(SimpleTable([[v] for _, v in right], stubs=[k for k, _ in right], txt_fmt=fmt_2cols))
    if table_width(table) <= WIDTH:
        return table
    # one column; a value too long for it continues on the next rows (no label)
    room = WIDTH - 3 - max(len(k) for k, _ in items)
    rows = []
    for k, v in items:
        lines = textwrap.wrap(v, room, break_on_hyphens=False) if len(v) > room else [v]
        rows.extend([(k, lines[0])] + [("", line) for line in lines[1:]])
    return SimpleTable([[v] for _, v in rows], stubs=[k for k, _ in rows], title=title, txt_fmt=fmt_2cols)


def table_width(table: SimpleTable) -> int:
    """Characters of the widest line of ``table`` as text."""
    return max(map(len, table.as_text().splitlines()))


def wrap_notes(notes) -> list:
    """Each note wrapped to :data:`WIDTH` columns (for ``Summary.add_extra_txt``)."""
    return [textwrap.fill(note, WIDTH, break_on_hyphens=False) for note in notes]


def frame_table(df: pd.DataFrame, title: str | None = None) -> SimpleTable:
    """A DataFrame as a statsmodels parameter table (numbers formatted by :func:`format_number`)."""
    data = [[format_number(v) for v in row] for row in df.itertuples(index=False)]
    return SimpleTable(data, headers=[str(c) for c in df.columns], stubs=[str(i) for i in df.index],
                       title=title, txt_fmt=fmt_params)


def beside_or_below(table: pd.DataFrame, diag: pd.DataFrame, title, diag_title) -> list:
    """``[(title, table joined with diag)]`` if that fits the summary's :data:`WIDTH`, else
    ``[(title, table), (diag_title, diag)]`` (long term names: the sampler diagnostics get a
    table of their own)."""
    joined = table.join(diag)
    if table_width(frame_table(joined, title)) <= WIDTH:
        return [(title, joined)]
    return [(title, table), (diag_title, diag)]


def build_summary(parts) -> Summary:
    """A :class:`statsmodels.iolib.summary.Summary` of any fit from its
    :class:`~vbsvm.results.contract.SummaryParts`: the header as ``label: value`` pairs in two
    columns (one when two would be wider than :data:`WIDTH`), the tables, then the notes."""
    smry = Summary()
    smry.tables.append(_header_table(parts.header, parts.title))
    smry.tables.extend(parts.tables)
    if parts.notes:
        smry.add_extra_txt(wrap_notes(parts.notes))
    return smry


def linear_summary_parts(fit, level: float):
    """``(title, header, tables, notes)`` of the summary of a linear
    :class:`~vbsvm.results.fit.Fit` at interval level ``level``.

    Sections: the header, the fixed effects, the variance components (when inferred), then any
    ``(title, DataFrame)`` pairs a model adds in ``fit.info["summary_tables"]`` (or by overriding
    ``fit.summary_tables(level)``), then notes.
    """
    tables = []
    coef = fit.coef_table(level)
    if fit.method == "gibbs":
        diag = fit.diagnostics()
        rows = [f"beta[{t}]" for t in coef.index]
        diag = diag.loc[rows, ["r_hat", "ess_bulk", "ess_tail", "mcse_mean"]].set_axis(coef.index)
        diag[["ess_bulk", "ess_tail"]] = diag[["ess_bulk", "ess_tail"]].round().astype(int)
        tables += [frame_table(df, title)
                   for title, df in beside_or_below(coef, diag, None, "Sampler diagnostics of the coefficients")]
    else:
        tables.append(frame_table(_mode_only(coef) if fit.method == "map" else coef))
    undefined, alpha = False, False
    if fit.layout.variances or fit.layout.covariances:
        vc = fit.varcomp(level)
        if fit.method == "gibbs":  # R-hat and bulk ESS of each component (alpha is sigma2_u's)
            diag = fit.diagnostics()
            if "alpha" in vc.index:  # rank-normalized R-hat and ESS are those of sigma2_u
                diag.loc["alpha"] = diag.loc["sigma2_u"]
            diag = diag.reindex(vc.index)
            vc["r_hat"] = diag["r_hat"].to_numpy()
            vc["ess_bulk"] = [int(round(v)) if np.isfinite(v) else "" for v in diag["ess_bulk"]]
        if fit.method == "map":
            vc = _mode_only(vc)
        undefined = bool(np.isinf(vc[["mean", "sd"]].to_numpy(dtype=float)).any()) if "sd" in vc else False
        if undefined:
            vc = vc.astype(object).mask(vc.isin([np.inf]), UNDEFINED)
        alpha = "alpha" in vc.index
        tables.append(frame_table(vc, "Variance components and penalty"))
    for title, table in fit.summary_tables(level):
        tables.append(frame_table(table, title))
    notes = [
        f"Formula: {fit.design.formula}",
        "Coefficients are on the original predictor scale; the score is f(x) = x'beta (+ random effects z'b).",
        f"Intervals: {100 * level:g}% "
        + ("Gaussian q-intervals." if fit.method == "vb" else "equal-tailed posterior quantiles." if fit.method == "gibbs" else "not available for a mode."),
    ]
    if alpha:
        notes.append("Penalty: alpha = 1/(4 sigma2_u), the weight of the ridge term alpha ||beta||^2 on the "
                     "non-intercept fixed effects.")
    if undefined:
        notes.append(f"{UNDEFINED}: the moment does not exist for that variance's inverse-gamma posterior "
                     "(mean: shape <= 1, sd: shape <= 2); read its interval instead.")
    if fit.method == "vb" and is_calibrated(fit):
        notes.append("Calibrated approximation: expectation propagation integrated over a grid of the "
                     "variances (intervals from the mixture's moments); compare with method='gibbs'.")
    elif fit.method == "vb":
        notes.append("Mean-field VB sds for this augmentation are typically about half of MCMC's; "
                     "check with vbsvm.compare(fit_vb, fit_gibbs).")
    if fit.info.get("separable"):
        notes.append(separation_note(fit))
    if "approximation_note" in fit.info:
        note = fit.info["approximation_note"]
        notes.append(note[:1].upper() + note[1:] + ".")
    notes.extend(fit.info.get("summary_notes", []))
    title = f"{fit.info.get('model', 'Bayesian linear SVM')} results"
    return title, linear_header(fit), tables, notes


def separation_note(fit) -> str:
    """The summary's note on data that the fixed effects separate (``fit.info["separable"]``, set by
    :func:`vbsvm.fitting.svm.warn_about_data`): what it means for the reported coefficients under the
    fit's prior, and the fixes."""
    s = fit.settings
    if s.get("penalty") is None:
        return ("Separable data: the fixed effects put every point beyond the margin, so the coefficients' "
                "size is set by the vague prior (sigma2_beta); use penalty='auto' or a fixed penalty.")
    A = s.get("A_u")
    if fit.info.get("separable_without_intercept"):
        means = f"their posterior means do not exist for A_u <= 1/2 (here A_u = {A:g})"
    else:
        means = f"their posterior means grow without bound with sigma2_beta for A_u <= 1 (here A_u = {A:g})"
    return (f"Separable data: the fixed effects put every point beyond the margin, so under the IG(A_u, B_u) "
            f"prior on sigma2_u the coefficients' posterior is heavy-tailed and {means}; the table describes "
            "the fit, not finite posterior moments. Fix the penalty (penalty=<float>) or raise A_u.")


def _mode_only(table: pd.DataFrame) -> pd.DataFrame:
    """A table of a posterior mode: the value is the ``mode`` (not a mean); no sd or interval."""
    return table[["mean"]].rename(columns={"mean": "mode"})


def _extension(fit) -> str:
    """The Gibbs header's note on an extended run, e.g. ``from 1000 draws to reach R-hat <= 1.01,
    bulk ESS >= 400``."""

    worst_r, worst_e = shortfall(fit.summary_diagnostics())
    met = not (worst_r > RHAT_TARGET or worst_e < ESS_TARGET)
    return (f"from {fit.info['draws_requested']} draws " + ("to reach" if met else "to max_draws, short of")
            + f" R-hat <= {RHAT_TARGET}, bulk ESS >= {ESS_TARGET}")
