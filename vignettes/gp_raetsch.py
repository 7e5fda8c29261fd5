"""Vignette: the nonlinear Bayesian SVM on the Rätsch benchmarks (Wenzel et al. 2017, Table 1).

1. A single fit on ``heart`` with the formula interface: summary, predictions (class, probability,
   score = predictive mean and sd), the ELBO / hyperparameter trace, VB vs Gibbs (also by
   ``vbsvm.compare``: accuracy of q(f) at training rows).
2. The Table-1 comparison: reads ``benchmarks/results/raetsch_gp.json`` (written by
   ``benchmarks/raetsch_gp.py``; run it first, or pass ``--run`` to run it here) and prints our
   ``svi`` (fixed hyperparameters), ``svi_opt`` (learned), ``vb`` and SVC+Platt next to the
   paper's S-BSVM; saves
   ``vignettes/figures/gp_raetsch.png`` (error and Brier with +-1 sd) and
   ``vignettes/figures/gp_heart_trace.png``.

Run:  PYTHONPATH=. python vignettes/gp_raetsch.py [--run]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vbsvm  # noqa: E402
import vbsvm.datasets as D  # noqa: E402
from vbsvm.gpfit import gpsvm  # noqa: E402

HERE = Path(__file__).parent
RESULTS = HERE.parent / "benchmarks" / "results" / "raetsch_gp.json"


def part1():
    import matplotlib
    matplotlib.use("Agg")

    df = D.load("raetsch/heart")
    train, test = df.iloc[27:], df.iloc[:27]  # fold 1 of the contiguous 10-fold protocol
    fit = gpsvm("y ~ .", train, kernel="rbf", n_inducing=50, batch_size=100, method="svi", seed=1)
    print(fit.summary())
    out = fit.predict(test.iloc[:6], kind="score")
    out["prob"] = fit.predict(test.iloc[:6], kind="prob")
    out["class"] = fit.predict(test.iloc[:6])
    out["y"] = test["y"].iloc[:6]
    print("\nPredictions for the first test rows (score = predictive mean and sd of f):")
    print(out.round(3).to_string())
    (HERE / "figures").mkdir(exist_ok=True)
    fit.plot_trace().savefig(HERE / "figures" / "gp_heart_trace.png", dpi=120)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vb = gpsvm("y ~ .", train, method="vb", optimize=False, seed=1)
        gb = gpsvm("y ~ .", train, method="gibbs", n_inducing=len(train), inducing=vb.inducing_points,
                   optimize=False, draws=1000, tune=300, chains=2, seed=1)
    sv, sg = vb.predict(test, kind="score"), gb.predict(test, kind="score")
    dist = np.abs(sv["mean"] - sg["mean"]) / sg["sd"]
    print("\nFull-GP VB vs Gibbs (same kernel, inducing points = training rows), test rows:")
    print(f"  |mean_VB - mean_Gibbs| / sd_Gibbs: median {dist.median():.3f}, 90% {dist.quantile(.9):.3f}, "
          f"max {dist.max():.3f}; sd_VB / sd_Gibbs median {np.median(sv['sd'] / sg['sd']):.2f}")
    pv, pg = vb.predict(test, kind="prob"), gb.predict(test, kind="prob")
    print(f"  max |P_VB - P_Gibbs| = {np.max(np.abs(pv - pg)):.3f}")
    cmp = vbsvm.compare(vb, gb, n_points=20)  # f at 20 training rows, hyperparameters
    acc = cmp.table()["vb_accuracy"].dropna()
    print(f"  vbsvm.compare(vb, gibbs): accuracy of q(f) at {acc.size} training rows: median "
          f"{acc.median():.1f}%, min {acc.min():.1f}%")


def part2():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from raetsch_gp import PAPER, print_table

    res = json.load(open(RESULTS))["results"]
    print()
    print_table(res)
    names = [k for k in PAPER if k in res]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for j, (key, lab) in enumerate([("error", "test error"), ("brier", "Brier score")]):
        ax = axes[j]
        x = np.arange(len(names))
        pe = [PAPER[n]["S-BSVM"][j][0] for n in names]
        ps = [PAPER[n]["S-BSVM"][j][1] for n in names]
        ax.errorbar(x - 0.2, pe, ps, fmt="s", label="paper S-BSVM", color="grey")
        for off, meth, col in [(-0.05, "svi", "C0"), (0.05, "svi_opt", "C3"), (0.15, "vb", "C1"),
                               (0.25, "svc", "C2")]:
            xs = [i + off for i, n in enumerate(names) if meth in res[n]]
            ys = [res[n][meth][key] for n in names if meth in res[n]]
            es = [res[n][meth][key + "_sd"] for n in names if meth in res[n]]
            if xs:
                ax.errorbar(xs, ys, es, fmt="o", label=meth if meth != "svc" else "SVC+Platt", color=col)
        ax.set_xticks(x, names, rotation=30, fontsize=8)
        ax.set_ylabel(lab)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "figures" / "gp_raetsch.png", dpi=120)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="store_true")
    a = ap.parse_args()
    if a.run:
        import raetsch_gp
        raetsch_gp.main([])
    part1()
    if RESULTS.exists():
        part2()
    else:
        print(f"\n{RESULTS} not found: run benchmarks/raetsch_gp.py first (or pass --run).")
