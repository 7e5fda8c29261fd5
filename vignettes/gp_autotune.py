"""Vignette: automatic tuning of the RBF lengthscale (Wenzel et al. 2017, Section 5.4, Figure 2).

On waveform (n = 5000, d = 21, 10 contiguous folds) we compare

* a grid search: for each lengthscale on a log grid, the 10-fold CV error of ``gpsvm`` with that
  lengthscale fixed (``optimize=False``);
* automatic tuning: ``gpsvm(..., optimize=True, learn=["rbf.lengthscale"])`` — SVI alternating
  10 natural-gradient steps with one Adam step on log(lengthscale) (eq. 12), all other
  hyperparameters held at the same values as in the grid (kernel variance 1, bias variance 1).

Acceptance: the CV error at the learned lengthscale (averaged over folds, each fold learning its
own) is within 0.01 of the best grid error.  Prints a table and saves
``vignettes/figures/gp_autotune.png``.

Run:  PYTHONPATH=. python vignettes/gp_autotune.py [--grid 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vbsvm.datasets as D  # noqa: E402
from vbsvm.gpfit import gpsvm  # noqa: E402

HERE = Path(__file__).parent


def cv(df, **kw):
    n = len(df)
    edges = np.linspace(0, n, 11).astype(int)
    errs, ls, secs = [], [], []
    for k in range(10):
        te = np.arange(edges[k], edges[k + 1])
        tr = np.setdiff1d(np.arange(n), te)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = gpsvm("y ~ .", df.iloc[tr], n_inducing=100, batch_size=100, seed=k, **kw)
        secs.append(time.perf_counter() - t0)
        pred = fit.predict(df.iloc[te]).to_numpy()
        errs.append(np.mean(pred != df["y"].to_numpy()[te]))
        ls.append(float(fit.hyperparameters.loc["rbf.lengthscale", "value"]))
    return float(np.mean(errs)), float(np.mean(ls)), float(np.mean(secs)), ls


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=16)
    a = ap.parse_args(argv)
    try:
        from threadpoolctl import threadpool_limits
        ctx = threadpool_limits(1)
    except ImportError:  # pragma: no cover
        from contextlib import nullcontext
        ctx = nullcontext()
    df = D.load("raetsch/waveform")
    grid = np.geomspace(0.5, 40, a.grid)
    rows = []
    with ctx:
        t0 = time.perf_counter()
        for ell in grid:
            e, _, s, _ = cv(df, optimize=False, lengthscale=float(ell))
            rows.append((float(ell), e, s))
            print(f"lengthscale {ell:7.3f}: CV error {e:.4f}  ({s:.2f} s / fold)", flush=True)
        grid_secs = time.perf_counter() - t0
        start = 2.0
        e_auto, ls_auto, s_auto, ls_folds = cv(df, optimize=True, lengthscale=start,
                                               learn=["rbf.lengthscale"])
    errs = np.array([r[1] for r in rows])
    best = int(np.argmin(errs))
    print()
    print(f"{'':32s} {'lengthscale':>12s} {'CV error':>9s} {'time':>10s}")
    print(f"{'grid search best (' + str(a.grid) + ' values)':32s} {grid[best]:12.3f} {errs[best]:9.4f} "
          f"{grid_secs:9.1f}s")
    print(f"{'autotuned (start 2.0)':32s} {ls_auto:12.3f} {e_auto:9.4f} {s_auto * 10:9.1f}s")
    print(f"learned lengthscale per fold: {np.round(ls_folds, 2).tolist()}")
    gap = e_auto - errs[best]
    print(f"CV error gap (auto - best grid): {gap:+.4f}  -> {'PASS' if gap <= 0.01 else 'FAIL'} (<= 0.01)")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(grid, errs, "o-", ms=3, label="grid search (10-fold CV)")
    ax.plot([ls_auto], [e_auto], "o", color="red", ms=9, mfc="none", mew=2,
            label="autotuned (ELBO)")
    ax.set_xscale("log")
    ax.set_xlabel("RBF lengthscale")
    ax.set_ylabel("CV error")
    ax.set_title("waveform: lengthscale autotuning (cf. Wenzel et al. Fig. 2)")
    ax.legend()
    fig.tight_layout()
    (HERE / "figures").mkdir(exist_ok=True)
    fig.savefig(HERE / "figures" / "gp_autotune.png", dpi=120)
    res = dict(grid=rows, best_lengthscale=float(grid[best]), best_error=float(errs[best]),
               auto_lengthscale=ls_auto, auto_error=e_auto, auto_lengthscale_folds=ls_folds,
               gap=gap, grid_seconds=grid_secs, auto_seconds_per_fold=s_auto)
    out = HERE.parent / "benchmarks" / "results" / "gp_autotune.json"
    out.parent.mkdir(exist_ok=True)
    json.dump(res, open(out, "w"), indent=1)
    return res


if __name__ == "__main__":
    main()
