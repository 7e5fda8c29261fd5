"""What the arrays of a saved fit may be: names, dtypes and shapes before they are read, values after.

:func:`vbsvm.io.fit_file.read_fit_file` calls :func:`check_declared` on the structure of a file
(shapes and dtypes as the datasets declare them, before any data is read) and
:func:`check_values` on the arrays it then reads. Shapes are stated in terms of the fit's own
layout: ``q`` coefficients (``p`` fixed, ``nd`` handled densely, ``ns = q - nd`` in the
eliminated random-effect term with ``L`` levels of ``k`` columns each), ``nv`` variance
components, covariance terms whose ``k x k`` matrices take ``ncov`` entries in all, ``n``
observations; draws have the shape ``(c, d, ...)`` of chains and draws, the same for every
array. Every value is checked: finite numbers, variances and sds non-negative, shape and scale
parameters positive, probabilities in [0, 1], indicators 0 or 1, indices in range.
"""

from __future__ import annotations

import json
import math

import numpy as np

from vbsvm.exceptions import FitFileError

__all__ = [
    "GP_VARIABLES",
    "LINEAR_VARIABLES",
    "check_declared",
    "check_layout",
    "check_values",
    "kernel_parameter_count",
    "layout_symbols",
]

#: Linear, selection and imputed fits (group ``vbsvm``): name -> (shape, value rule). A shape
#: entry is a number or a symbol (see the module docstring; others are bound by their first use).
LINEAR_VARIABLES = {
    "theta_mean": (("q",), "finite"),
    "theta_var": (("q",), "nonnegative"),
    "theta_mean_ep": (("q",), "finite"),
    "theta_var_ep": (("q",), "nonnegative"),
    "theta_mode": (("q",), "finite"),
    "theta_cov_dense": (("nd", "nd"), "covariance"),
    "theta_cov_ds": (("nd", "ns"), "finite"),
    "theta_cov_ss_blocks": (("L", "k", "k"), "covariance"),
    "theta_draws": (("c", "d", "q"), "finite"),
    "sigma2_draws": (("c", "d", "nv"), "nonnegative"),
    "sigma2_mode": (("nv",), "nonnegative"),
    "sigma2_mean": (("nv",), "nonnegative"),
    "sigma2_sd": (("nv",), "nonnegative"),
    "var_shape": (("nv",), "positive"),
    "var_scale": (("nv",), "positive"),
    "cov_draws": (("c", "d", "ncov"), "covariance blocks"),
    "cov_mode": (("ncov",), "covariance blocks"),
    "cov_scale": (("ncov",), "covariance blocks"),
    "cov_df": (("nct",), "positive"),
    "log_pseudo_likelihood": (("c", "d"), "nonpositive"),
    "elbo": (("T",), "finite"),
    "log_evidence": ((), "finite"),
    "grid_eta": (("G", "K"), "finite"),
    "grid_weights": (("G",), "nonnegative"),
    "grid_log_density": (("G",), "finite"),
    "grid_step": (("K", "K"), "finite"),
    "grid_theta_mean": (("G", "q"), "finite"),
    "grid_p_include": (("G", "s"), "probability"),
    "sel_index": (("s",), "selectable index"),
    "q_mean": (("q",), "finite"),
    "q_var": (("q",), "nonnegative"),
    "q_cov_dense": (("nd", "nd"), "covariance"),
    "q_cov_ds": (("nd", "ns"), "finite"),
    "q_gamma": (("s",), "probability"),
    "q_eta": (("s",), "finite"),
    "q_b": (("s",), "finite"),
    "q_chi": (("n",), "finite"),
    "x_missing_mean": (("cells",), "finite"),
    "x_missing_sd": (("cells",), "nonnegative"),
    "x_missing_rowcov": (("R", "D", "D"), "covariance"),
    "x_missing_draws": (("c", "d", "cells"), "finite"),
    "mu_mean": (("e",), "finite"),
    "mu_cov": (("e", "e"), "covariance"),
    "mu_draws": (("c", "d", "e"), "finite"),
    "Sigma_scale": (("e", "e"), "covariance"),
    "Sigma_df": ((), "positive"),
    "Sigma_draws": (("c", "d", "e", "e"), "covariance"),
    "class_means_mean": ((2, "e"), "finite"),
    "class_means_cov": ((2, "e", "e"), "covariance"),
    "label_effect_draws": (("c", "d", "e"), "finite"),
}
#: ``gamma_draws``: the inclusion indicators of a selection fit, the label effect of an imputed one.
_GAMMA_DRAWS = {"selection": (("c", "d", "s"), "indicator"), "imputed": (("c", "d", "e"), "finite")}
#: Integer-valued variables (the rest are floating point).
_INTEGER = {"sel_index"}
_SELECTION_ONLY = {"sel_index", "q_gamma", "q_mean", "q_var", "q_cov_dense", "q_cov_ds", "q_eta", "q_b", "q_chi",
                   "grid_p_include"}
_IMPUTED_ONLY = {"x_missing_mean", "x_missing_sd", "x_missing_rowcov", "mu_mean", "mu_cov", "Sigma_scale",
                 "Sigma_df", "class_means_mean", "class_means_cov", "x_missing_draws", "mu_draws", "Sigma_draws"}
#: Variables whose presence would change what a fit of the type means.
FOREIGN = {
    "linear": _SELECTION_ONLY | _IMPUTED_ONLY | {"gamma_draws", "label_effect_draws"},
    "selection": _IMPUTED_ONLY | {"label_effect_draws"},
    "imputed": _SELECTION_ONLY | {"label_effect_draws"},
}
#: GP fits (group ``vbsvm_state``): ``m`` inducing points, ``f`` features, ``P`` kernel parameters,
#: ``E`` recorded ELBO values (none for a Gibbs fit).
GP_VARIABLES = {
    "Z": (("m", "f"), "finite"),
    "prec": (("m", "m"), "precision"),
    "shift": (("m",), "finite"),
    "theta": (("P",), "finite"),
    "elbo": (("E",), "finite"),
    "elbo_iter": (("E",), "finite"),
    "theta_trace": (("T2", "P"), "finite"),
    "gibbs_v": (("c", "d", "m"), "finite"),
}
#: Symbols that must be at least 1 (the others at least 0).
_AT_LEAST_ONE = {"c", "d", "T", "G", "K", "e", "m", "P", "f", "n"}


# ===================================================================== the layout
def check_layout(layout):
    """Check the ``layout`` attribute of a linear fit: names, the groups' levels and coordinate
    indices (each group's within its range, together every random-effect coordinate once), the
    eliminated group, the variance and covariance terms. Raises :class:`FitFileError`."""
    def names(v):
        return isinstance(v, list) and all(isinstance(s, str) for s in v)

    def bad(why):
        raise FitFileError(f"the attribute 'layout' does not describe the coefficients: {why}.")

    if not isinstance(layout, dict):
        bad("it is not a JSON object")
    fixed, groups = layout.get("fixed"), layout.get("groups")
    columns, nd = layout.get("re_columns", {}), layout.get("n_dense")
    if not names(fixed) or not fixed or len(set(fixed)) != len(fixed):
        bad("'fixed' must be a non-empty list of distinct names")
    if not names(layout.get("variances")) or len(set(layout["variances"])) != len(layout["variances"]):
        bad("'variances' must be a list of distinct names")
    if not isinstance(groups, dict) or not isinstance(columns, dict):
        bad("'groups' and 're_columns' must be JSON objects")
    if not (isinstance(nd, int) and not isinstance(nd, bool) and len(fixed) <= nd):
        bad("'n_dense' must be an integer at least the number of fixed effects")
    sparse = layout.get("sparse_group")
    if sparse is not None and sparse not in groups:
        bad(f"the eliminated group {str(sparse)[:40]!r} is not one of the groups")
    if set(columns) - set(groups) or not all(names(c) and c and len(set(c)) == len(c) for c in columns.values()):
        bad("'re_columns' must give distinct column names of the groups")
    covariances = layout.get("covariances", [])
    if not names(covariances) or any(c not in groups or len(columns.get(c, ["Intercept"])) < 2 for c in covariances):
        bad("'covariances' must name groups with more than one column")
    p, used = len(fixed), []
    for name, entry in groups.items():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                and isinstance(entry[1], list)):
            bad(f"the group {name[:40]!r} must be [levels, indices]")
    q = nd + (len(groups[sparse][1]) if sparse is not None else 0)
    for name, (levels, index) in groups.items():
        if not levels or not all(isinstance(v, (str, int)) or (isinstance(v, float) and math.isfinite(v))
                                 for v in levels):
            bad(f"the levels of group {name[:40]!r} must be a non-empty list of values")
        if len(levels) * len(columns.get(name, ["Intercept"])) != len(index):
            bad(f"the group {name[:40]!r} has {len(index)} indices for {len(levels)} levels")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in index):
            bad(f"the indices of group {name[:40]!r} must be integers")
        lo, hi = (nd, q) if name == sparse else (p, nd)
        if index and (min(index) < lo or max(index) >= hi):
            bad(f"the indices of group {name[:40]!r} must be in [{lo}, {hi}) (it has {min(index)}..{max(index)})")
        used.extend(index)
    if sorted(used) != list(range(p, q)):
        bad(f"the groups' indices must cover the coefficients {p}..{q - 1} once each")


def layout_symbols(layout, n):
    """The shape symbols a (checked) ``layout`` fixes, for ``n`` observations."""
    groups, columns = layout["groups"], layout.get("re_columns", {})
    sparse = layout.get("sparse_group")
    cov_sizes = [len(columns.get(c, ["Intercept"])) for c in layout.get("covariances", [])]
    nd = layout["n_dense"]
    q = nd + (len(groups[sparse][1]) if sparse is not None else 0)
    return {"p": len(layout["fixed"]), "q": q, "nd": nd, "ns": q - nd, "nv": len(layout["variances"]),
            "ncov": sum(k * k for k in cov_sizes), "nct": len(cov_sizes), "n": n,
            "L": len(groups[sparse][0]) if sparse is not None else 0,
            "k": len(columns.get(sparse, ["Intercept"])) if sparse is not None else 1}


# ===================================================================== before reading
def _spec(kind, name):
    if kind == "gpsvm":
        return GP_VARIABLES.get(name)
    if name == "gamma_draws":
        return _GAMMA_DRAWS.get(kind)
    return LINEAR_VARIABLES.get(name)


def required_variables(kind, method, layout=None, info=None, present=()):
    """Names a fit of ``kind`` made by ``method`` must hold (besides alternatives checked apart)."""
    if kind == "gpsvm":
        return {"Z", "prec", "shift", "theta", "elbo", "elbo_iter", "theta_trace"} | (
            {"gibbs_v"} if method == "gibbs" else set())
    covs = bool(layout.get("covariances"))
    if method == "gibbs":
        need = {"theta_draws", "sigma2_draws", "log_pseudo_likelihood"} | ({"cov_draws"} if covs else set())
    elif method == "map":
        need = {"theta_mode", "sigma2_mode"} | ({"cov_mode"} if covs else set())
    else:
        need = {"theta_mean", "theta_var", "theta_cov_dense", "theta_cov_ds", "var_shape", "var_scale", "elbo"}
        if covs and "cov_draws" not in present:
            need |= {"cov_df", "cov_scale"}
        if "theta_draws" in present:
            need.add("sigma2_draws")
    if kind == "selection":
        need.add("sel_index")
        if method == "gibbs":
            need.add("gamma_draws")
        elif method != "map":
            need |= {"q_gamma", "q_mean", "q_var", "q_cov_dense", "q_cov_ds"}
    elif kind == "imputed":
        imputation = (info or {}).get("imputation")
        conditional = isinstance(imputation, dict) and imputation.get("model") == "conditional"
        if method == "gibbs":
            need |= {"x_missing_draws", "mu_draws", "Sigma_draws"} | ({"gamma_draws"} if conditional else set())
        elif method != "map":
            need |= {"x_missing_mean", "x_missing_sd", "x_missing_rowcov", "mu_mean", "mu_cov", "Sigma_scale",
                     "Sigma_df"} | ({"class_means_mean", "class_means_cov"} if conditional else set())
    return need


def check_declared(kind, method, group, variables, symbols, layout=None, info=None):
    """Check the variables of ``group`` as the file declares them, before any is read.

    ``variables`` maps each name to ``{"shape": [...], "dtype": descriptor}`` (the reader's
    structure message). Required variables must be present, foreign ones absent; each known
    variable must have its dtype and the shape its spec gives in terms of ``symbols`` (which
    this binds further: draws, grid sizes, ...); unknown ones must be numeric. Returns the
    bound symbols.
    """
    names = set(variables)
    missing = required_variables(kind, method, layout, info, names) - names
    if missing:
        raise FitFileError(f"the {kind} fit (method {method!r}) lacks the variable(s) {sorted(missing)} in group "
                           f"{group!r}.")
    foreign = names & FOREIGN.get(kind, set())
    if foreign:
        raise FitFileError(f"the {kind} fit holds the variable(s) {sorted(foreign)} of another kind of fit in "
                           f"group {group!r}; its type attribute and its contents disagree.")
    symbols = dict(symbols)
    for name in sorted(names):
        meta = variables[name]
        where = f"the variable {name!r} of group {group!r}"
        dtype = meta["dtype"]
        if dtype == "str":
            raise FitFileError(f"{where} is text; a fit's posterior arrays are numbers.")
        kind_char = np.dtype(dtype).kind
        spec = _spec(kind, name)
        integer = name in _INTEGER or (spec is not None and spec[1] == "indicator")
        if spec is not None and (kind_char in "iu") != integer:
            raise FitFileError(f"{where} has the dtype {np.dtype(dtype)}, not {'integer' if integer else 'floating'} "
                               "numbers.")
        if spec is None:
            continue
        template, _ = spec
        shape = list(meta["shape"])
        if len(shape) != len(template):
            raise FitFileError(f"{where} has the shape {tuple(shape)}; a fit's has {len(template)} dimension(s) "
                               f"({_template_text(template)}).")
        for size, sym in zip(shape, template):
            if isinstance(sym, int):
                ok = size == sym
            elif sym in symbols:
                ok = size == symbols[sym]
            else:
                ok = size >= (1 if sym in _AT_LEAST_ONE else 0)
                symbols[sym] = size
            if not ok:
                raise FitFileError(f"{where} has the shape {tuple(shape)}, not ({_template_text(template, symbols)}) "
                                   "as the fit's layout and its other arrays give.")
    return symbols


def _template_text(template, symbols=None):
    out = []
    for sym in template:
        if symbols is not None and not isinstance(sym, int) and sym in symbols:
            out.append(f"{sym}={symbols[sym]}")
        else:
            out.append(str(sym))
    return ", ".join(out)


# ===================================================================== after reading
def check_values(kind, group, arrays, symbols=None, layout=None):
    """Check every value of the arrays ``arrays`` (name -> numpy array) of ``group``: the rule of
    each known variable (see the module docstring), finite numbers for the others."""
    for name, arr in arrays.items():
        spec = _spec(kind, name)
        rule = spec[1] if spec is not None else "finite"
        where = f"the variable {name!r} of group {group!r}"
        _check_rule(arr, rule, where, name, symbols or {}, layout)


def _check_rule(arr, rule, where, name, symbols, layout):
    if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        bad = np.flatnonzero(~np.isfinite(arr.ravel()))
        raise FitFileError(f"{where} holds {bad.size} non-finite value(s) (NaN or infinite; e.g. at flat index "
                           f"{int(bad[0])}).")
    if arr.dtype.kind not in "biuf":
        raise FitFileError(f"{where} is not numeric.")
    if rule == "finite" or not arr.size:
        return
    if rule == "nonnegative":
        _need(arr >= 0, where, "negative value(s); it holds variances or sds, which are >= 0")
    elif rule == "positive":
        _need(arr > 0, where, "value(s) <= 0; it holds shape or scale parameters, which are > 0")
    elif rule == "nonpositive":
        _need(arr <= 0, where, "value(s) > 0; it holds log pseudo-likelihoods, which are <= 0")
    elif rule == "probability":
        _need((arr >= 0) & (arr <= 1), where, "value(s) outside [0, 1]; it holds probabilities")
    elif rule == "indicator":
        _need((arr == 0) | (arr == 1), where, "value(s) other than 0 and 1; it holds inclusion indicators")
    elif rule == "covariance":
        diag = np.diagonal(arr, axis1=-2, axis2=-1)
        _need(diag >= 0, where, "negative variance(s) on the diagonal of its covariance matrices")
    elif rule == "precision":
        _need(np.diagonal(arr) > 0, where, "diagonal entries <= 0; it is a precision matrix")
    elif rule == "covariance blocks":
        at = 0
        columns = (layout or {}).get("re_columns", {})
        for term in (layout or {}).get("covariances", []):
            k = len(columns.get(term, ["Intercept"]))
            block = arr[..., at:at + k * k].reshape(arr.shape[:-1] + (k, k))
            _need(np.diagonal(block, axis1=-2, axis2=-1) >= 0, where,
                  f"negative variance(s) in the covariance of term {term!r}")
            at += k * k
    elif rule == "selectable index":
        p = symbols.get("p", 0)
        ok = (arr >= 0) & (arr < p)
        _need(ok, where, f"index(es) outside the {p} fixed effects")
        _need(np.diff(arr) > 0, where, "indices that are not increasing (each term once)")
    else:  # pragma: no cover - a rule missing here is a bug in the tables above
        raise AssertionError(rule)


def _need(ok, where, what):
    ok = np.asarray(ok)
    if not ok.all():
        bad = int(np.flatnonzero(~ok.ravel())[0])
        raise FitFileError(f"{where} holds {int((~ok).sum())} {what} (e.g. at flat index {bad}).")


# ===================================================================== GP fits
_KERNELS = {"RBF", "Matern32", "Matern52"}


def kernel_parameter_count(kernel, n_features, depth=0):
    """Number of (log) parameters of the kernel described by ``kernel`` (a dict from
    ``Kernel.to_dict``), after checking its types, lengthscales and variances."""
    if not isinstance(kernel, dict) or depth > 2:
        raise FitFileError("the GP kernel description is not a JSON object (or is nested too deeply).")
    kind = kernel.get("type")
    if kind == "Sum":
        parts = kernel.get("parts")
        if not isinstance(parts, list) or not 1 <= len(parts) <= 16:
            raise FitFileError("the GP kernel 'Sum' must have 1 to 16 parts.")
        return sum(kernel_parameter_count(part, n_features, depth + 1) for part in parts)
    variance = kernel.get("variance")
    if not _positive(variance):
        raise FitFileError(f"the GP kernel {str(kind)[:20]!r} has a variance that is not a positive number.")
    if kind in ("Linear", "Constant"):
        return 1
    if kind not in _KERNELS:
        raise FitFileError(f"the GP kernel type {str(kind)[:20]!r} is unknown.")
    scale = kernel.get("lengthscale")
    if not isinstance(scale, list) or len(scale) not in (1, n_features) or not all(_positive(v) for v in scale):
        raise FitFileError(f"the GP kernel {kind!r} must have 1 or {n_features} positive lengthscales.")
    names = kernel.get("feature_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(s, str) for s in names)):
        raise FitFileError(f"the GP kernel {kind!r} has feature names that are not a list of text.")
    return len(scale) + 1


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def check_json_finite(text, name):
    """Parse the JSON text ``text`` of attribute ``name``, refusing NaN and infinite numbers."""
    def refuse(constant):
        raise FitFileError(f"the attribute {name!r} holds the non-finite number {constant}.")

    return json.loads(text, parse_constant=refuse)
