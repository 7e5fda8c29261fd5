"""Batch VB of the GP SVM (``gpsvm(method="vb")``, the full GP): time to convergence.

Batch VB is coordinate ascent of the natural-parameter updates with step 1 (SQUAREM-accelerated,
:func:`vbsvm.inference.vb.coordinate_ascent` on :class:`vbsvm.models.gp.SparseGPSVM`); with
``optimize=True`` each sweep also moves the kernel hyperparameters by two L-BFGS iterations on the
ELBO maximized over q(u) at fixed q(lambda).  We report, next to SVI and Gibbs on the same split:
wall and CPU seconds, sweeps, convergence, final ELBO, test accuracy and the learned
hyperparameters.

* ``breast_cancer``: scikit-learn's ``load_breast_cancer`` (569 x 30), rows shuffled with seed 0,
  the first 398 for training (standardized by the formula layer), the other 171 for testing;
* ``heart``: the Raetsch ``heart`` set (270 x 13), the first 189 rows (70%) for training;
* ``size``: synthetic 5-column data, full-GP batch VB at n = 250, 500, 1000 (fixed
  hyperparameters; learned too up to ``--learn-max``): the cost per sweep grows as n^3, which is why ``method="vb"`` refuses more
  than ``VB_MAX_INDUCING`` inducing points and points to ``"svi"``.

One BLAS thread (threadpoolctl), as in ``raetsch_gp.py``.

Run:  PYTHONPATH=. python benchmarks/gp_batch_vb.py [--parts data,size]
Writes benchmarks/results/gp_batch_vb.json.
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
from vbsvm.fitting.gp import fit_gp, gpsvm

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    from contextlib import nullcontext as threadpool_limits

RUNS = {  # name: gpsvm keyword arguments
    "vb_fixed": dict(method="vb", optimize=False),
    "vb": dict(method="vb"),
    "svi": dict(method="svi"),
    "gibbs": dict(method="gibbs"),
}


def split(name):
    """(train, test, formula) of a data set."""
    if name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        df = load_breast_cancer(as_frame=True).frame
        df.columns = [c.replace(" ", "_") for c in df.columns]
        df = df.sample(frac=1.0, random_state=0).reset_index(drop=True)
        return df.iloc[:398], df.iloc[398:], "target ~ ."
    df = D.load(f"raetsch/{name}")
    k = int(round(0.7 * len(df)))
    return df.iloc[:k], df.iloc[k:], "y ~ ."


def timed(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return out, wall, cpu, sorted({str(x.message)[:120] for x in w})


def run_data(name, seed):
    train, test, formula = split(name)
    response = formula.split("~")[0].strip()
    rows = {}
    for run, kw in RUNS.items():
        fit, wall, cpu, warns = timed(lambda: gpsvm(formula, train, seed=seed, **kw))
        acc = float(np.mean(fit.predict(test).to_numpy() == test[response].to_numpy()))
        rows[run] = dict(seconds=wall, cpu=cpu, converged=bool(fit.converged),
                         n_iter=int(fit.n_iter), n_inducing=int(fit.n_inducing),
                         elbo=float(fit.elbo[-1]) if len(fit.elbo) else None, test_accuracy=acc,
                         hyper={k: float(v) for k, v in fit.hyperparameters["value"].items()},
                         warnings=warns)
        print(f"{name:14s} {run:9s} {wall:7.2f}s (cpu {cpu:7.2f}) iter {fit.n_iter:5d} "
              f"converged {fit.converged!s:5s} acc {acc:.3f} "
              f"elbo {rows[run]['elbo'] if rows[run]['elbo'] is not None else float('nan'):.3f}",
              flush=True)
    return dict(n_train=len(train), n_test=len(test), runs=rows)


def run_size(sizes, learn_max, seed):
    rows = []
    for n in sizes:
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, 5))
        y = np.where(np.sin(1.5 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.3 * rng.standard_normal(n) > 0,
                     1.0, -1.0)
        for optimize in (False, True)[: 2 if n <= learn_max else 1]:
            fit, wall, cpu, _ = timed(lambda: fit_gp(X, y, method="vb", optimize=optimize, seed=seed))
            rows.append(dict(n=n, optimize=optimize, seconds=wall, cpu=cpu, n_iter=int(fit.n_iter),
                             converged=bool(fit.converged), seconds_per_sweep=wall / fit.n_iter))
            print(f"size n={n:5d} optimize={optimize!s:5s} {wall:7.2f}s {fit.n_iter:4d} sweeps "
                  f"({wall / fit.n_iter:.3f} s/sweep) converged {fit.converged}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="data,size")
    ap.add_argument("--sets", default="breast_cancer,heart")
    ap.add_argument("--sizes", default="250,500,1000")
    ap.add_argument("--learn-max", type=int, default=500,
                    help="largest size at which the size part also learns the hyperparameters")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gp_batch_vb.json"))
    a = ap.parse_args(argv)
    out = {"protocol": __doc__.split("Run:")[0].strip(), "results": {}}
    if Path(a.out).exists():
        out["results"] = json.loads(Path(a.out).read_text()).get("results", {})
    with threadpool_limits(1):
        if "data" in a.parts:
            for name in a.sets.split(","):
                out["results"][name] = run_data(name, a.seed)
        if "size" in a.parts:
            out["results"]["size"] = run_size([int(s) for s in a.sizes.split(",")], a.learn_max,
                                               a.seed)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
