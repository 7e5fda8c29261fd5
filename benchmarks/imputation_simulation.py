"""The simulation acceptance check of ``missing="impute"``, for VB and Gibbs, with a reference.

Issue: MCAR-delete 30% of one correlated predictor from complete simulated data; the imputed
means should correlate with the deleted truth at least as well as the regression of that column
on the others, and the coefficients should be closer to the full-data fit than the complete-case
coefficients (over replicates). Data: :func:`vbsvm.datasets.simulate_mcar` (n = 400, x1 deleted).

For each replicate we fit, by VB (Algorithm 4) and by Gibbs (Appendix C),

* ``full``: the complete data (``missing`` not needed);
* ``impute``: the incomplete data with ``missing="impute"`` (the paper's joint model);
* ``cc``: the complete cases;

and measure the correlation of the imputed means with the deleted values and the Euclidean
distance of the coefficient means to the ``full`` fit of the same engine. For comparison:

* regression imputation of x1 on (x2, x3) — the issue's yardstick — and on (x2, x3, y)
  (the imputed means of ``mi-outcome``);
* ``mi-outcome``: Rubin's multiple imputation from the normal linear regression of x1 on
  (x2, x3, y) (proper draws, M imputations), each completed data set fitted by VB and the
  coefficient means averaged. This is *not* the paper's model: the imputations use the label
  through a proper conditional density instead of the unnormalized hinge pseudo-likelihood.

Prints a table and writes ``benchmarks/results/imputation_simulation.{json,md}``.

Run:  PYTHONPATH=. python benchmarks/imputation_simulation.py [--reps 20 --imputations 20]
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
from vbsvm.exceptions import DiagnosticWarning  # noqa: E402

FORMULA = "y ~ x1 + x2 + x3"


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
    for engine, kw in (("vb", {}), ("gibbs", gibbs_kw)):
        fits[engine, "full"] = vbsvm.svm(FORMULA, data=full, **kw)
        fits[engine, "impute"] = vbsvm.svm(FORMULA, data=inc, missing="impute", **kw)
        fits[engine, "cc"] = vbsvm.svm(FORMULA, data=inc, **kw)
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
        mi.append(vbsvm.svm(FORMULA, data=completed).coef["mean"].to_numpy())
    coef["vb", "mi-outcome"] = np.mean(mi, axis=0)  # its imputed means are regression_with_y

    for engine in ("vb", "gibbs"):
        row[f"corr_{engine}_impute"] = float(np.corrcoef(fits[engine, "impute"].imputed["mean"], truth)[0, 1])
        for kind in ("impute", "cc") + (("mi-outcome",) if engine == "vb" else ()):
            row[f"dist_{engine}_{kind}"] = float(np.linalg.norm(coef[engine, kind] - coef[engine, "full"]))
            row[f"beta_x1_ratio_{engine}_{kind}"] = float(coef[engine, kind][1] / coef[engine, "full"][1])
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--imputations", type=int, default=20)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--tune", type=int, default=1000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "imputation_simulation"))
    args = ap.parse_args(argv)
    gibbs_kw = {"method": "gibbs", "draws": args.draws, "tune": args.tune, "chains": 2, "seed": 1,
                "progress": False, "n_jobs": 1}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        rows = [one_replicate(seed, args.imputations, gibbs_kw) for seed in range(args.reps)]
    table = pd.DataFrame(rows)
    corr = table.filter(like="corr_").agg(["mean", "std"]).T
    dist = table.filter(like="dist_").agg(["mean", "std"]).T
    ratio = table.filter(like="beta_x1_ratio_").agg(["mean", "std"]).T
    verdict = {
        "vb": {"imputations_at_least_regression": bool(corr.loc["corr_vb_impute", "mean"]
                                                       >= corr.loc["corr_regression", "mean"]),
               "closer_than_complete_case": bool(dist.loc["dist_vb_impute", "mean"] < dist.loc["dist_vb_cc", "mean"])},
        "gibbs": {"imputations_at_least_regression": bool(corr.loc["corr_gibbs_impute", "mean"]
                                                          >= corr.loc["corr_regression", "mean"]),
                  "closer_than_complete_case": bool(dist.loc["dist_gibbs_impute", "mean"]
                                                    < dist.loc["dist_gibbs_cc", "mean"])},
        "mi-outcome (not the paper's model)": {
            "imputations_at_least_regression": bool(corr.loc["corr_regression_with_y", "mean"]
                                                    >= corr.loc["corr_regression", "mean"]),
            "closer_than_complete_case": bool(dist.loc["dist_vb_mi-outcome", "mean"] < dist.loc["dist_vb_cc", "mean"])},
    }
    seconds = time.perf_counter() - t0
    text = ["# Imputation simulation (issue acceptance check)", "",
            f"{args.reps} replicates of `simulate_mcar(400)` (30% of x1 deleted MCAR); Gibbs 2 x "
            f"({args.tune} + {args.draws}); MI with {args.imputations} imputations; {seconds:.0f} s.", "",
            "Correlation of the imputed means with the deleted values (mean, sd over replicates):", "",
            fenced(corr), "Distance of the coefficient means to the full-data fit of the same engine:", "",
            fenced(dist), "Coefficient of x1 relative to the full-data fit:", "", fenced(ratio),
            "Criteria met:", "", fenced(pd.DataFrame(verdict).T)]
    print("\n".join(text))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(text))
    out.with_suffix(".json").write_text(json.dumps({
        "reps": args.reps, "imputations": args.imputations, "gibbs": {"draws": args.draws, "tune": args.tune, "chains": 2},
        "seconds": seconds, "summary": {"corr": corr.to_dict(), "dist": dist.to_dict(), "beta_x1_ratio": ratio.to_dict()},
        "criteria": verdict, "replicates": rows}, indent=1))


if __name__ == "__main__":
    main()
