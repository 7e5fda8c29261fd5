"""The simulation acceptance check of ``missing="impute"``, for VB and Gibbs.

MCAR-delete 30% of one correlated predictor (x1) from complete simulated data
(:func:`vbsvm.datasets.simulate_mcar`, n = 400). Criteria for the conditional model (the
default), both engines: the imputed means correlate with the deleted values at least as well
as the regression of x1 on (x2, x3); the coefficients are closer to the full-data fit than
complete-case; the x1 coefficient's ratio to the full-data value is within 0.9-1.1 on average;
VB (``meanfield``) vs Gibbs: imputed means correlate > 0.95 and coefficient means within 0.5
Gibbs sd. The conditional model's calibrated ``method="vb"`` (EP fits pooled over
completions) is compared with its Gibbs fit too: coefficient means in Gibbs sd and sd ratios.

For each replicate we fit, by mean-field VB and by Gibbs,

* ``full``: the complete data;
* ``conditional``: ``missing="impute"`` with the cut model given (x_obs, y) (the default);
* ``joint``: ``missing="impute", imputation="joint"``, the paper's model (Algorithm 4 /
  Appendix C), reported for its measured distortion (x1's coefficient inflated);
* ``cc``: the complete cases;
* ``conditional-expected`` (VB only): the cut model's single mean-field q with expectations
  over q(D_mis) (``vb_completions=0``), instead of the default pool over 20 completions;

and measure the correlation of the imputed means with the deleted values and the Euclidean
distance of the coefficient means to the ``full`` fit of the same engine. For comparison:

* regression imputation of x1 on (x2, x3) — the baseline — and on (x2, x3, y);
* ``mi-outcome``: Rubin's multiple imputation from the normal linear regression of x1 on
  (x2, x3, y) (proper draws, M imputations), each completed data set fitted by VB and the
  coefficient means averaged (the conditional model's target, computed independently).

Prints a table and writes ``benchmarks/results/imputation_simulation.{json,md}``.

``--interaction`` runs the study of an imputed predictor in an interaction instead
(:func:`interaction_replicate`): ``y ~ x * z + w`` with a true x:z effect, 30% of x deleted MCAR;
fits ``full``, ``conditional`` (VB and Gibbs) and ``cc``, and Rubin's MI from the normal linear
regression of x on (z, w, y) (``mi-outcome``: what the conditional model's shared Sigma implies),
on (z, w, y, y z) (``mi-outcome-yz``) and on (z, w) within each class (``mi-class``: what a
class-specific Sigma_y would imply); writes
``benchmarks/results/imputation_simulation_interaction.{json,md}``.

Run:  PYTHONPATH=. python benchmarks/imputation_simulation.py [--reps 20 --imputations 20] [--interaction]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.linalg import solve_triangular

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vbsvm  # noqa: E402
from vbsvm.exceptions import DiagnosticWarning
from vbsvm.inference import pooled as pooled_module

DEFAULT_COMPLETIONS = pooled_module.VB_COMPLETIONS

FORMULA = "y ~ x1 + x2 + x3"
KINDS = ("conditional", "joint")


def regression_fit(A, x):
    """Least squares of x on A: coefficients, residual variance and the Cholesky factor of A'A."""
    coef, *_ = np.linalg.lstsq(A, x, rcond=None)
    resid = x - A @ coef
    s2 = float(resid @ resid) / (len(x) - A.shape[1])
    return coef, s2, np.linalg.cholesky(A.T @ A)


def proper_imputations(A_obs, x_obs, A_mis, m, rng):
    """m proper draws of the missing x from the Bayesian normal linear regression of x on A
    (flat prior): sigma^2 ~ scaled inverse chi^2, coef ~ N(coef_hat, sigma^2 (A'A)^-1), x ~ N(A coef, sigma^2)."""
    coef, s2, L = regression_fit(A_obs, x_obs)
    dof = len(x_obs) - A_obs.shape[1]
    out = np.empty((m, A_mis.shape[0]))
    for k in range(m):  # m imputations, each vectorized over the rows
        sigma2 = dof * s2 / rng.chisquare(dof)
        # (A'A)^-1 = L^-T L^-1, so L^-T z has covariance (A'A)^-1.
        b = coef + np.sqrt(sigma2) * solve_triangular(L.T, rng.standard_normal(len(coef)), lower=False)
        out[k] = A_mis @ b + np.sqrt(sigma2) * rng.standard_normal(A_mis.shape[0])
    return out


def fenced(df) -> str:
    return "```\n" + df.round(3).to_string() + "\n```\n"


def one_replicate(seed, imputations, gibbs_kw):
    full, inc = vbsvm.datasets.simulate_mcar(400, seed=seed)
    drop = inc["x1"].isna().to_numpy()
    truth = full.loc[drop, "x1"].to_numpy()
    fits = {}
    for engine, kw in (("vb", {"method": "meanfield"}), ("gibbs", gibbs_kw)):
        fits[engine, "full"] = vbsvm.svm(FORMULA, data=full, **kw)
        for kind in KINDS:
            fits[engine, kind] = vbsvm.svm(FORMULA, data=inc, missing="impute", imputation=kind, **kw)
        fits[engine, "cc"] = vbsvm.svm(FORMULA, data=inc, **kw)
    # the single-q VB of the cut with expectations over q(D_mis) (not the default; see pooled_vb_cut)
    pooled_module.VB_COMPLETIONS = 0
    try:
        fits["vb", "conditional-expected"] = vbsvm.svm(FORMULA, data=inc, missing="impute", method="meanfield")
    finally:
        pooled_module.VB_COMPLETIONS = DEFAULT_COMPLETIONS
    # the default method="vb": calibrated EP fits pooled over the completions
    fits["vb", "conditional-calibrated"] = vbsvm.svm(FORMULA, data=inc, missing="impute")
    coef = {k: f.coef["mean"].to_numpy() for k, f in fits.items()}

    one = np.ones(len(full))
    A = np.column_stack([one, full["x2"], full["x3"], full["y"]])
    row = {"seed": seed, "n_missing": int(drop.sum())}
    for name, cols in (("regression", 3), ("regression_with_y", 4)):
        b, _, _ = regression_fit(A[~drop, :cols], full.loc[~drop, "x1"].to_numpy())
        row[f"corr_{name}"] = float(np.corrcoef(A[drop, :cols] @ b, truth)[0, 1])
    rng = np.random.default_rng(seed)
    draws = proper_imputations(A[~drop], full.loc[~drop, "x1"].to_numpy(), A[drop], imputations, rng)
    mi = []
    for x1 in draws:
        completed = inc.copy()
        completed.loc[drop, "x1"] = x1
        mi.append(vbsvm.svm(FORMULA, data=completed, method="meanfield").coef["mean"].to_numpy())
    coef["vb", "mi-outcome"] = np.mean(mi, axis=0)  # its imputed means are regression_with_y

    for engine in ("vb", "gibbs"):
        for kind in KINDS + (("conditional-expected",) if engine == "vb" else ()):
            row[f"corr_{engine}_{kind}"] = float(np.corrcoef(fits[engine, kind].imputed["mean"], truth)[0, 1])
        for kind in KINDS + ("cc",) + (("mi-outcome", "conditional-expected") if engine == "vb" else ()):
            row[f"dist_{engine}_{kind}"] = float(np.linalg.norm(coef[engine, kind] - coef[engine, "full"]))
            row[f"beta_x1_ratio_{engine}_{kind}"] = float(coef[engine, kind][1] / coef[engine, "full"][1])
    # VB (meanfield) vs Gibbs, conditional model: imputed means and coefficients in Gibbs sd
    for kind in KINDS:
        vb, gb = fits["vb", kind], fits["gibbs", kind]
        row[f"vb_gibbs_corr_imputed_{kind}"] = float(np.corrcoef(vb.imputed["mean"], gb.imputed["mean"])[0, 1])
        row[f"vb_gibbs_max_sd_{kind}"] = float(np.max(np.abs(vb.coef["mean"] - gb.coef["mean"]) / gb.coef["sd"]))
    gb = fits["gibbs", "conditional"]
    for kind in ("conditional", "conditional-expected", "conditional-calibrated"):
        vb = fits["vb", kind]
        row[f"vb_gibbs_max_sd_{kind}"] = float(np.max(np.abs(vb.coef["mean"] - gb.coef["mean"]) / gb.coef["sd"]))
        ratio = (vb.coef["sd"] / gb.coef["sd"]).to_numpy()
        row[f"vb_gibbs_sd_ratio_min_{kind}"] = float(ratio.min())
        row[f"vb_gibbs_sd_ratio_max_{kind}"] = float(ratio.max())
    return row


INTERACTION_FORMULA = "y ~ x * z + w"


def simulate_interaction(n, seed, p_missing=0.3):
    """x correlated with z, y from a logistic model with an x:z effect; 30% of x deleted MCAR."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n)
    x = 0.6 * z + 0.8 * rng.normal(size=n) + 1.0
    w = rng.normal(size=n)
    eta = 0.3 + 1.2 * (x - 1) + 0.5 * z - 1.0 * (x - 1) * z + 0.4 * w
    y = (rng.random(n) < 1 / (1 + np.exp(-1.5 * eta))).astype(int)
    full = pd.DataFrame({"x": x, "z": z, "w": w, "y": y})
    inc = full.copy()
    inc.loc[rng.random(n) < p_missing, "x"] = np.nan
    return full, inc


def interaction_replicate(seed, imputations, gibbs_kw, n=400):
    """One replicate of the interaction study (see the module docstring): the x:z coefficient's
    ratio to the full-data fit and the coefficient distance to it, per method."""
    full, inc = simulate_interaction(n, seed)
    drop = inc["x"].isna().to_numpy()
    coef = {}
    for engine, kw in (("vb", {"method": "meanfield"}), ("gibbs", gibbs_kw)):
        coef[engine, "full"] = vbsvm.svm(INTERACTION_FORMULA, data=full, **kw).coef["mean"]
        coef[engine, "conditional"] = vbsvm.svm(INTERACTION_FORMULA, data=inc, missing="impute",
                                                **{"seed": seed, **kw}).coef["mean"]
        coef[engine, "cc"] = vbsvm.svm(INTERACTION_FORMULA, data=inc, **kw).coef["mean"]
    rng = np.random.default_rng(seed)
    y = full["y"].to_numpy(dtype=float)
    A = np.column_stack([np.ones(n), full["z"], full["w"], y, y * full["z"]])
    x_obs = full.loc[~drop, "x"].to_numpy()
    by_class = np.empty((imputations, int(drop.sum())))
    for c in (0.0, 1.0):  # the regression of x on (z, w) within each class: what a class-specific Sigma_y implies
        o, m = ~drop & (y == c), (y[drop] == c)
        by_class[:, m] = proper_imputations(A[o, :3], full.loc[o, "x"].to_numpy(), A[drop][m, :3], imputations, rng)
    for name, cols in (("mi-outcome", 4), ("mi-outcome-yz", 5), ("mi-class", None)):
        draws = by_class if cols is None else proper_imputations(A[~drop, :cols], x_obs, A[drop, :cols], imputations,
                                                                  rng)
        fits = []
        for x in draws:
            completed = inc.copy()
            completed.loc[drop, "x"] = x
            fits.append(vbsvm.svm(INTERACTION_FORMULA, data=completed, method="meanfield").coef["mean"])
        coef["vb", name] = sum(fits) / len(fits)
    row = {"seed": seed, "n_missing": int(drop.sum())}
    for (engine, kind), c in coef.items():
        if kind == "full":
            continue
        b = coef[engine, "full"]
        row[f"xz_ratio_{engine}_{kind}"] = float(c["x:z"] / b["x:z"])
        row[f"dist_{engine}_{kind}"] = float(np.linalg.norm(c.to_numpy() - b.to_numpy()))
    return row


def interaction_main(args, gibbs_kw):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        rows = [interaction_replicate(seed, args.imputations, gibbs_kw) for seed in range(args.reps)]
    table = pd.DataFrame(rows)
    ratio = table.filter(like="xz_ratio_").agg(["mean", "std", "min", "max"]).T
    dist = table.filter(like="dist_").agg(["mean", "std"]).T
    seconds = time.perf_counter() - t0
    text = ["# Imputation simulation: an imputed predictor in an interaction", "",
            f"{args.reps} replicates of `{INTERACTION_FORMULA}` (n = 400, true x:z effect, x correlated with z; 30% "
            f"of x deleted MCAR); Gibbs 2 x ({args.tune} + {args.draws}); MI with {args.imputations} imputations "
            f"fitted by VB; {seconds:.0f} s.", "",
            "`mi-outcome`: proper MI from the regression of x on (z, w, y), the conditional model's form (shared "
            "Sigma: the same slope of x on z in both classes); `mi-outcome-yz`: on (z, w, y, y z); `mi-class`: on "
            "(z, w) within each class (a class-specific Sigma_y).", "",
            "x:z coefficient relative to the full-data fit of the same engine:", "", fenced(ratio),
            "Distance of the coefficient means to the full-data fit:", "", fenced(dist)]
    print("\n".join(text))
    out = Path(args.out + "_interaction")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(text))
    out.with_suffix(".json").write_text(json.dumps({
        "reps": args.reps, "imputations": args.imputations, "formula": INTERACTION_FORMULA,
        "gibbs": {"draws": args.draws, "tune": args.tune, "chains": 2}, "seconds": seconds,
        "summary": {"xz_ratio": ratio.to_dict(), "dist": dist.to_dict()}, "replicates": rows}, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--imputations", type=int, default=20)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--tune", type=int, default=1000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "imputation_simulation"))
    ap.add_argument("--interaction", action="store_true",
                    help="run the study of an imputed predictor in an interaction (y ~ x * z + w) instead")
    args = ap.parse_args(argv)
    gibbs_kw = {"method": "gibbs", "draws": args.draws, "tune": args.tune, "chains": 2, "seed": 1,
                "progress": False, "n_jobs": 1}
    if args.interaction:
        interaction_main(args, gibbs_kw)
        return
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        rows = [one_replicate(seed, args.imputations, gibbs_kw) for seed in range(args.reps)]
    table = pd.DataFrame(rows)
    corr = table.filter(like="corr_").agg(["mean", "std"]).T
    dist = table.filter(like="dist_").agg(["mean", "std"]).T
    ratio = table.filter(like="beta_x1_ratio_").agg(["mean", "std"]).T
    agree = table.filter(like="vb_gibbs_").agg(["mean", "max", "min"]).T
    verdict = {}
    for engine in ("vb", "gibbs"):
        for kind in KINDS:
            verdict[f"{engine} {kind}"] = {
                "imputations_at_least_regression": bool(corr.loc[f"corr_{engine}_{kind}", "mean"]
                                                        >= corr.loc["corr_regression", "mean"]),
                "closer_than_complete_case": bool(dist.loc[f"dist_{engine}_{kind}", "mean"]
                                                  < dist.loc[f"dist_{engine}_cc", "mean"]),
                "x1_ratio_within_0.9_1.1": bool(0.9 <= ratio.loc[f"beta_x1_ratio_{engine}_{kind}", "mean"] <= 1.1),
                "vb_gibbs_imputed_corr_gt_0.95": bool(agree.loc[f"vb_gibbs_corr_imputed_{kind}", "min"] > 0.95),
                "vb_gibbs_coef_within_0.5_sd": bool(agree.loc[f"vb_gibbs_max_sd_{kind}", "max"] < 0.5),
            }
    verdict["mi-outcome (vb)"] = {
        "imputations_at_least_regression": bool(corr.loc["corr_regression_with_y", "mean"]
                                                >= corr.loc["corr_regression", "mean"]),
        "closer_than_complete_case": bool(dist.loc["dist_vb_mi-outcome", "mean"] < dist.loc["dist_vb_cc", "mean"]),
        "x1_ratio_within_0.9_1.1": bool(0.9 <= ratio.loc["beta_x1_ratio_vb_mi-outcome", "mean"] <= 1.1)}
    seconds = time.perf_counter() - t0
    text = ["# Imputation simulation", "",
            f"{args.reps} replicates of `simulate_mcar(400)` (30% of x1 deleted MCAR); Gibbs 2 x "
            f"({args.tune} + {args.draws}); MI with {args.imputations} imputations; {seconds:.0f} s.", "",
            "Correlation of the imputed means with the deleted values (mean, sd over replicates):", "",
            fenced(corr), "Distance of the coefficient means to the full-data fit of the same engine:", "",
            fenced(dist), "Coefficient of x1 relative to the full-data fit:", "", fenced(ratio),
            "VB vs Gibbs: correlation of the imputed means, the largest coefficient distance in Gibbs "
            "posterior sd, and the smallest and largest ratio of the coefficients' sds to Gibbs' (mean / max / "
            "min over replicates; `conditional`: mean field, `conditional-calibrated`: the default method='vb'):",
            "", fenced(agree),
            "Criteria met:", "", fenced(pd.DataFrame(verdict).T)]
    print("\n".join(text))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(text))
    out.with_suffix(".json").write_text(json.dumps({
        "reps": args.reps, "imputations": args.imputations, "gibbs": {"draws": args.draws, "tune": args.tune, "chains": 2},
        "seconds": seconds, "summary": {"corr": corr.to_dict(), "dist": dist.to_dict(), "beta_x1_ratio": ratio.to_dict(),
                    "vb_gibbs": agree.to_dict()},
        "criteria": verdict, "replicates": rows}, indent=1))


if __name__ == "__main__":
    main()
