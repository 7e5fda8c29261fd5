"""Scaling of the sparse-GP SVM (SVI, Algorithm 1): synthetic SUSY-sized problems.

A synthetic 18-column problem (SUSY has 18 features; SUSY itself is not available offline) with a
nonlinear Bayes decision boundary and 10% label noise.  We fit RBF + bias with m = 64 k-means++
inducing points, minibatches of 100 rows and learned hyperparameters, and report training time,
test error / Brier on 100,000 fresh rows and memory:

* ``peak_fit_mb``: peak of memory *allocated during the fit* (tracemalloc, which sees numpy's
  buffers), i.e. beyond the data already in memory — it must not grow with n;
* ``maxrss_mb``: the process's peak resident set size (includes the data and the interpreter).

Runs: n = 1e5 and 1e6 in memory (arrays), and n = 5e6 *streamed*: chunks of 100,000 rows are
generated on the fly, so the 5e6 x 18 data never exist in memory at once (the formula layer can
stream the same way: ``gpsvm(formula, data=callable_returning_DataFrame_chunks)``).

Run:  PYTHONPATH=. python benchmarks/gp_scale.py [--sizes 100000,1000000] [--stream 5000000]
Writes benchmarks/results/gp_scale.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vbsvm.fitting.gp import fit_gp

D = 18


def make_data(n, seed):
    """Synthetic SUSY-like problem: y = sign(f(x)) with 10% labels flipped."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D))
    f = (np.sin(1.5 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.5 * X[:, 3] ** 2 - 0.5
         + 0.3 * X[:, 4:8].sum(1))
    y = np.where(f > 0, 1.0, -1.0)
    flip = rng.random(n) < 0.10
    y[flip] *= -1
    return X, y


def evaluate(fit, Xt, yt):
    p = fit.predict(Xt, kind="prob")
    s = fit.predict(Xt, kind="score")["mean"].to_numpy()
    return float(np.mean(np.where(s >= 0, 1, -1) != yt)), float(np.mean((p - (yt > 0)) ** 2))


def run(n, stream, seed, Xt, yt, args):
    kw = dict(kernel="rbf", n_inducing=64, batch_size=100, method="svi", optimize=True,
              seed=seed, max_iter=args.max_iter)
    if stream:
        chunk = 100_000

        def factory():
            for c in range(n // chunk):
                yield make_data(chunk, 1000 + c)

        X, y = factory, None
        kw["n_obs"] = n
    else:
        X, y = make_data(n, 1)
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_gp(X, y, **kw)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    err, brier = evaluate(fit, Xt, yt)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = dict(n=n, streamed=stream, seconds=secs, cpu_seconds=cpu, n_iter=int(fit.n_iter),
               converged=bool(fit.converged), test_error=err, test_brier=brier,
               peak_fit_mb=peak / 2**20, maxrss_mb=rss,
               data_mb=0.0 if stream else (n * D * 8 + n * 8) / 2**20,
               hyper={k: float(v) for k, v in fit.hyperparameters["value"].items()})
    print(f"n={n:>9,d} {'stream' if stream else 'memory'}: {secs:7.1f} s, {row['n_iter']} steps, "
          f"test error {err:.4f}, Brier {brier:.4f}, peak during fit {row['peak_fit_mb']:.1f} MB, "
          f"data {row['data_mb']:.0f} MB, max RSS {rss:.0f} MB", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--stream", default="5000000")
    ap.add_argument("--max-iter", type=int, default=20000)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gp_scale.json"))
    a = ap.parse_args(argv)
    Xt, yt = make_data(100_000, 999)
    try:
        from threadpoolctl import threadpool_limits
        ctx = threadpool_limits(1)
    except ImportError:  # pragma: no cover
        from contextlib import nullcontext
        ctx = nullcontext()
    rows = []
    with ctx:
        for n in [int(s) for s in a.sizes.split(",") if s]:
            rows.append(run(n, False, 0, Xt, yt, a))
        for n in [int(s) for s in a.stream.split(",") if s]:
            rows.append(run(n, True, 0, Xt, yt, a))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    json.dump({"setup": "RBF+bias, m=64 k-means++, batch 100, optimize=True, 1 BLAS thread",
               "runs": rows}, open(a.out, "w"), indent=1)
    return rows


if __name__ == "__main__":
    main()
