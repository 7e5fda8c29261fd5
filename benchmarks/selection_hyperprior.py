"""Benchmark: the Beta hyperprior of the Laplace-zero inclusion probability against a fixed rho.

1. Simulated sparse truth (``vbsvm.datasets.simulate_sparse``: n = 200, 5 true terms of effect 1
   among p = 10, 50, 200; independent and Toeplitz(0.5) predictors; 5 replicates per cell, seeds
   100-104): for each prior (``rho=0.01``, the old default; ``Beta(1, 1)``; ``Beta(1, m)``;
   ``Beta(1, m^2)``, the default) and method (calibrated ``vb``, ``meanfield``, ``gibbs``), the AUC
   of the inclusion probabilities for the true support, the false positives (p_include > 0.5 among
   the null terms), the false negatives, the posterior mean of rho, the CPU seconds of a fit, and
   VB against Gibbs (mean absolute difference of the inclusion probabilities). Gibbs runs shorter
   than its defaults (2 chains x 1000 draws after 500 tuning sweeps, one process) and not at
   p = 200 (over a minute a fit there on the shared machine).
2. The mean-field ELBO as a function of a fixed rho (``rho="auto"``'s curve) on one replicate, and
   the mean field's q(rho) on the same data: why the mean field integrates rho by a factor q(rho)
   and not by ELBO weights on a grid.
3. Spam (4601 x 57): CPU and wall seconds (median of 3) of the default ``method="vb"`` fit with
   ``LaplaceZero(rho=0.01)`` (the old default) and with ``LaplaceZero()`` (the new one).

Prints tables and writes ``benchmarks/results/selection_hyperprior.json`` and ``.md``.

Run: ``PYTHONPATH=. python benchmarks/selection_hyperprior.py [--quick] [--parts sim elbo spam]``
(``--quick``: 2 replicates, p = 10 and 50, short chains; a smoke test; ``--reps``, ``--ps``,
``--gibbs-draws``, ``--gibbs-tune`` shorten a full run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread: the machine is shared

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.special import expit
from scipy.stats import beta as beta_dist

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.priors import DEFAULT_RHO_GRID, Beta, LaplaceZero
from vbsvm.models.selection import LaplaceZeroModel, selectable_columns

RESULTS = Path(__file__).resolve().parent / "results"

PRIORS = {
    "rho=0.01": lambda m: LaplaceZero(rho=0.01),
    "Beta(1,1)": lambda m: LaplaceZero(rho=Beta(1, 1)),
    "Beta(1,m)": lambda m: LaplaceZero(rho=Beta(1, m)),
    "Beta(1,m^2) (default)": lambda m: LaplaceZero(),
}


def auc(scores, truth):
    pos, neg = scores[truth], scores[~truth]
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                 / (pos.size * neg.size))


def one_fit(df, prior, method, seed, gibbs):
    kw = dict(gibbs, progress=False, n_jobs=1) if method == "gibbs" else {}
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ .", df, prior=prior, method=method, seed=seed, **kw)
    seconds = time.process_time() - c0
    inc = fit.inclusion()
    truth = inc.index.isin(df.attrs["truth"]["support"])
    p = inc["p_include"]
    return {"auc": auc(p.to_numpy(), truth), "fp": int(((p > 0.5) & ~truth).sum()),
            "fn": int(((p <= 0.5) & truth).sum()), "rho": float(fit.rho), "cpu_seconds": seconds,
            "p_include": {k: float(v) for k, v in p.items()}}


def simulations(args, out):
    reps = args.reps or (2 if args.quick else 5)
    ps = tuple(args.ps) if args.ps else ((10, 50) if args.quick else (10, 50, 200))
    draws = args.gibbs_draws or (300 if args.quick else 1000)
    gibbs = dict(chains=2, draws=draws, tune=args.gibbs_tune or (200 if args.quick else 500), max_draws=draws)
    cells = dict(out.get("simulations", {}).get("cells", {})) if args.resume else {}
    for p in ps:
        for corr in (0.0, 0.5):
            key = f"p={p}, {'independent' if corr == 0 else 'Toeplitz(0.5)'}"
            priors = {name: PRIORS[name] for name in args.priors} if args.priors else PRIORS
            if args.priors:
                key += f", {' and '.join(priors)} only"
            if key in cells:
                continue
            methods = ("vb", "meanfield", "gibbs") if p <= args.gibbs_max_p else ("vb", "meanfield")
            runs = {name: {m: [] for m in methods} for name in priors}
            for r in range(reps):
                df = vbsvm.datasets.simulate_sparse(200, p, 5, seed=100 + r, rho=corr)
                for name, make in priors.items():
                    for method in methods:
                        runs[name][method].append(one_fit(df, make(p), method, r, gibbs))
                    print(f"{key}, replicate {r}, {name}: " + "; ".join(
                        f"{m} AUC {runs[name][m][-1]['auc']:.3f} FP {runs[name][m][-1]['fp']} "
                        f"FN {runs[name][m][-1]['fn']} rho {runs[name][m][-1]['rho']:.3f} "
                        f"{runs[name][m][-1]['cpu_seconds']:.1f} s" for m in methods), flush=True)
            cells[key] = {"p": p, "toeplitz": corr, "runs": runs, "summary": summarize(runs)}
            out["simulations"] = {
                "setting": f"simulate_sparse(200, p, 5, seed=100+r, rho=corr), effect 1, {reps} replicates; Gibbs "
                           f"chains={gibbs['chains']}, draws={gibbs['draws']} (max_draws too: no extension), "
                           f"tune={gibbs['tune']}, n_jobs=1, in the cells whose runs list it; CPU seconds of the process",
                "cells": cells}
            save(args, out)  # after each cell: a long run that stops keeps what it did


def summarize(runs):
    out = {}
    for name, by_method in runs.items():
        out[name] = {}
        for method, rows in by_method.items():
            s = {k: float(np.mean([r[k] for r in rows])) for k in ("auc", "fp", "fn", "rho", "cpu_seconds")}
            if method != "gibbs" and "gibbs" in by_method:
                s["mean_abs_diff_vs_gibbs"] = float(np.mean([
                    np.mean(np.abs(np.array(list(a["p_include"].values()))
                                   - np.array([g["p_include"][k] for k in a["p_include"]])))
                    for a, g in zip(rows, by_method["gibbs"])]))
            out[name][method] = s
    return out


def elbo_curve(args, out):
    """The mean-field ELBO as a function of a fixed rho on one replicate (p = 10 and 50,
    independent): over rho="auto"'s grid and over 19 points evenly spaced in logit(rho) from -6 to
    3; the posterior mean of rho that weights exp(ELBO) times the Beta(1, m^2) density on the fine
    grid would give; and the mean field's q(rho) under each Beta prior, with the calibrated fit's
    posterior mean of rho beside it."""
    out["meanfield_elbo_curve"] = {}
    fine = expit(np.linspace(-6.0, 3.0, 19))
    for p in (10, 50):
        df = vbsvm.datasets.simulate_sparse(200, p, 5, seed=100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            auto = vbsvm.svm("y ~ .", df, prior=LaplaceZero(rho="auto"), method="meanfield", seed=1)
            hyper = {name: vbsvm.svm("y ~ .", df, prior=make(p), method="meanfield", seed=1)
                     for name, make in PRIORS.items() if name != "rho=0.01"}
            calibrated = vbsvm.svm("y ~ .", df, prior=LaplaceZero(), seed=1)
            d = build_design("y ~ .", df)
            model = LaplaceZeroModel(d.X, d.y, [], selectable_columns(d, ()), 0.5, intercept=0)
            curve = []
            for r in fine:
                model.set_rho(float(r))
                curve.append(coordinate_ascent(model, tol=1e-8, max_iter=1000).elbo[-1])
        curve = np.array(curve)
        lw = curve + beta_dist(1, p * p).logpdf(fine) + np.log(fine * (1 - fine))  # in logit(rho)
        w = np.exp(lw - lw.max())
        elbo = auto.rho_curve["elbo"].to_numpy()
        turns = int(np.sum(np.diff(np.sign(np.diff(elbo))) != 0))
        turns_fine = int(np.sum(np.diff(np.sign(np.diff(curve))) != 0))
        out["meanfield_elbo_curve"][f"p={p}"] = {
            "setting": f"simulate_sparse(200, {p}, 5, seed=100), method='meanfield', rho on DEFAULT_RHO_GRID",
            "rho": [float(r) for r in DEFAULT_RHO_GRID], "elbo": [float(e) for e in elbo],
            "direction_changes": turns,
            "fine_rho": fine.tolist(), "fine_elbo": curve.tolist(), "fine_direction_changes": turns_fine,
            "fine_max_step": float(np.max(np.abs(np.diff(curve)))),
            "elbo_weighted_rho_mean_beta_1_m2": float(w @ fine / w.sum()),
            "calibrated_rho_mean_beta_1_m2": float(calibrated.rho),
            "q_rho": {name: {"posterior_mean": float(f.rho), "q_rho": [float(x) for x in f.posterior["q_rho"]],
                             "elbo": float(f.posterior["elbo"][-1]), "n_selected": len(f.selected)}
                      for name, f in hyper.items()}}
        print(f"p={p}: mean-field ELBO over rho:", " ".join(f"{r:g}: {e:.2f}" for r, e in zip(DEFAULT_RHO_GRID, elbo)),
              f"({turns} changes of direction); fine grid: {turns_fine} changes, largest step "
              f"{np.max(np.abs(np.diff(curve))):.2f}; E[rho] by ELBO weights x Beta(1, m^2) "
              f"{w @ fine / w.sum():.4f}, by q(rho) {hyper['Beta(1,m^2) (default)'].rho:.4f}, calibrated "
              f"{calibrated.rho:.4f}", flush=True)


def spam_time(args, out):
    spam = vbsvm.datasets.load("spam")
    rows = {}
    for label, prior in (("LaplaceZero(rho=0.01) (old default)", LaplaceZero(rho=0.01)),
                         ("LaplaceZero() (default: rho ~ Beta(1, m^2))", LaplaceZero())):
        times = []
        for _ in range(1 if args.quick else 3):
            w0, c0 = time.perf_counter(), time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = vbsvm.svm("type ~ .", spam, prior=prior, seed=1)
            times.append((time.perf_counter() - w0, time.process_time() - c0))
        wall, cpu = np.median(np.array(times), axis=0)
        rows[label] = {"wall_seconds_median": float(wall), "cpu_seconds_median": float(cpu),
                       "n_ep": fit.info.get("n_ep"), "n_sweeps": fit.info.get("n_sweeps"),
                       "grid_points": fit.info.get("grid_points"), "n_selected": len(fit.selected),
                       "rho": float(fit.rho)}
        print(f"spam, {label}: {cpu:.1f} s CPU, {wall:.1f} s wall (median), {len(fit.selected)} selected, "
              f"rho {fit.rho:.4f}, {rows[label]['n_ep']} EP runs", flush=True)
    out["spam_default_time"] = rows


def markdown(out) -> str:
    lines = ["# Laplace-zero: Beta hyperprior on rho against a fixed rho", "",
             "Written by `benchmarks/selection_hyperprior.py`.", ""]
    sims = out.get("simulations")
    if sims:
        lines += [f"Simulations: {sims['setting']}.", "",
                  "| cell | prior | method | AUC | FP | FN | E[rho] | CPU s | mean abs diff vs Gibbs |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for key, cell in sims["cells"].items():
            for name, by_method in cell["summary"].items():
                for method, s in by_method.items():
                    diff = s.get("mean_abs_diff_vs_gibbs")
                    lines.append(f"| {key} | {name} | {method} | {s['auc']:.3f} | {s['fp']:.1f} | {s['fn']:.1f} | "
                                 f"{s['rho']:.3f} | {s['cpu_seconds']:.2f} | "
                                 f"{'' if diff is None else f'{diff:.3f}'} |")
        lines.append("")
    for curve in out.get("meanfield_elbo_curve", {}).values():
        lines += [f"Mean-field ELBO over rho ({curve['setting']}): "
                  + ", ".join(f"{r:g}: {e:.2f}" for r, e in zip(curve["rho"], curve["elbo"]))
                  + f" ({curve['direction_changes']} changes of direction; on 19 points evenly spaced in logit(rho) "
                  f"from -6 to 3: {curve['fine_direction_changes']} changes, largest step "
                  f"{curve['fine_max_step']:.2f}). Under Beta(1, m^2): E[rho] weighting exp(ELBO) on that grid "
                  f"{curve['elbo_weighted_rho_mean_beta_1_m2']:.4f}, calibrated fit "
                  f"{curve['calibrated_rho_mean_beta_1_m2']:.4f}. q(rho): "
                  + "; ".join(f"{k}: E[rho] {v['posterior_mean']:.3f}, ELBO {v['elbo']:.2f}, "
                              f"{v['n_selected']} selected" for k, v in curve["q_rho"].items()), ""]
    spam = out.get("spam_default_time")
    if spam:
        lines += ["| spam, method='vb' | CPU s (median) | wall s | EP runs | selected | rho |", "|---|---|---|---|---|---|"]
        for label, r in spam.items():
            lines.append(f"| {label} | {r['cpu_seconds_median']:.1f} | {r['wall_seconds_median']:.1f} | {r['n_ep']} | "
                         f"{r['n_selected']} | {r['rho']:.4f} |")
        lines.append("")
    m = out["machine"]
    lines.append(f"Machine: {m['platform']}, {m['cpus']} CPUs shared with other jobs (load {m['loadavg_at_start'][0]:.1f} "
                 f"at start); CPU seconds are of the process (OPENBLAS_NUM_THREADS={m['OPENBLAS_NUM_THREADS']}).")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", nargs="*", default=["sim", "elbo", "spam"], choices=["sim", "elbo", "spam"])
    ap.add_argument("--resume", action="store_true", help="keep the parts and simulation cells already written")
    ap.add_argument("--reps", type=int, help="replicates per simulation cell (default 5; 2 with --quick)")
    ap.add_argument("--ps", type=int, nargs="*", help="numbers of predictors (default 10 50 200)")
    ap.add_argument("--gibbs-draws", type=int, help="Gibbs draws per chain (default 1000; 300 with --quick)")
    ap.add_argument("--gibbs-tune", type=int, help="Gibbs tuning sweeps (default 500; 200 with --quick)")
    ap.add_argument("--gibbs-max-p", type=int, default=50, help="largest p with Gibbs fits (default 50)")
    ap.add_argument("--priors", nargs="*", help="only these priors (names as in the tables); their cells are "
                                                 "stored apart, named with the priors")
    args = ap.parse_args()
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                       "loadavg_at_start": os.getloadavg(), "vbsvm": vbsvm.__version__}, "quick": args.quick}
    path = RESULTS / ("selection_hyperprior_quick.json" if args.quick else "selection_hyperprior.json")
    if args.resume and path.exists():
        out.update({k: v for k, v in json.loads(path.read_text()).items() if k not in ("machine", "quick")})
    if "elbo" in args.parts and "meanfield_elbo_curve" not in out:
        elbo_curve(args, out)
        save(args, out)
    if "spam" in args.parts and "spam_default_time" not in out:
        spam_time(args, out)
        save(args, out)
    if "sim" in args.parts:
        simulations(args, out)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    path = save(args, out)
    print(markdown(out))
    print(f"wrote {path}")


def save(args, out) -> Path:
    """Write the JSON and the markdown table (parts not rerun are kept from the existing file)."""
    RESULTS.mkdir(exist_ok=True)
    stem = "selection_hyperprior_quick" if args.quick else "selection_hyperprior"
    path = RESULTS / f"{stem}.json"
    if set(args.parts) != {"sim", "elbo", "spam"} and path.exists():  # keep the parts not rerun
        for key, value in json.loads(path.read_text()).items():
            out.setdefault(key, value)
    path.write_text(json.dumps(out, indent=2, default=float))
    (RESULTS / f"{stem}.md").write_text(markdown(out))
    return path


if __name__ == "__main__":
    main()
