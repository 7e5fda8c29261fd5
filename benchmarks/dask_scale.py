"""Scaling of the Dask fit (``vbsvm.svm(formula, data=<dask DataFrame>, method="meanfield")``).

For each number of rows: a Parquet data set on disk (20 standard-normal-ish predictors, a 0/1
label from a linear score plus noise; one file per ``--part-rows`` rows), then

* the Dask fit streamed from Parquet (``persist=False``) on a ``LocalCluster`` with
  ``--workers`` worker processes of one thread each and a ``--memory-limit`` per worker: wall
  time, sweeps, passes over the data, time per sweep and per pass, the client's peak RSS and the
  largest RSS any worker reached (polled every 0.5 s);
* beside it, where it fits (rows <= ``--inmem-max``), the in-memory fit of the same rows
  (pandas frame read from the same files), each measurement in a fresh process so that its peak
  RSS is its own.

A linear cost model of the time per pass, ``t = a + b n / W``, fitted to the Dask runs, projects
a fit of 1e9 rows on 32 workers. Results: ``benchmarks/results/dask_scale.{json,md}``.

Usage::

    python benchmarks/dask_scale.py --rows 1e6 3e6 --workers 2 --memory-limit 1GB
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
P = 20
FORMULA = "y ~ " + " + ".join(f"x{j:02d}" for j in range(1, P + 1))


def make_parquet(path: Path, rows: int, part_rows: int, seed=0):
    """Write ``rows`` rows as Parquet files of ``part_rows`` rows each (never all in memory)."""
    import pandas as pd

    if (path / "_done").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    beta = np.linspace(-1.0, 1.0, P)
    shift = np.linspace(-3.0, 3.0, P)
    scale = np.linspace(0.5, 4.0, P)
    for k, start in enumerate(range(0, rows, part_rows)):
        m = min(part_rows, rows - start)
        Z = rng.standard_normal((m, P))
        f = 0.3 + Z @ beta / np.sqrt(P) * 3.0 + rng.standard_normal(m)
        frame = pd.DataFrame(Z * scale + shift, columns=[f"x{j:02d}" for j in range(1, P + 1)])
        frame["y"] = (f > 0).astype(np.int8)
        frame.to_parquet(path / f"part-{k:05d}.parquet", index=False)
    (path / "_done").write_text(str(rows))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_inmem(path: Path) -> dict:
    import pandas as pd

    import vbsvm

    t0 = time.perf_counter()
    df = pd.read_parquet(path)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    fit = vbsvm.svm(FORMULA, df, method="meanfield")
    wall = time.perf_counter() - t0
    return {"kind": "inmem", "rows": len(df), "read_seconds": t_read, "wall_seconds": wall,
            "vb_seconds": fit.info["seconds"], "sweeps": fit.info["n_sweeps"],
            "sweep_seconds": fit.info["seconds"] / fit.info["n_sweeps"], "client_peak_mb": peak_rss_mb(),
            "coef": fit.coef["mean"].tolist(), "sd": fit.coef["sd"].tolist()}


def measure_dask(path: Path, workers: int, memory_limit: str, persist: bool) -> dict:
    import dask.dataframe as dd
    import psutil
    from distributed import Client, LocalCluster

    import vbsvm

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory_limit,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        peak = {"worker_mb": 0.0}
        stop = threading.Event()

        def rss():
            return psutil.Process().memory_info().rss / 2 ** 20

        def poll():
            while not stop.is_set():
                try:
                    peak["worker_mb"] = max([peak["worker_mb"], *client.run(rss).values()])
                except Exception:  # noqa: BLE001 - a poll during shutdown
                    pass
                stop.wait(0.5)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        data = dd.read_parquet(str(path))
        t0 = time.perf_counter()
        fit = vbsvm.svm(FORMULA, data, method="meanfield", persist=persist)
        wall = time.perf_counter() - t0
        stop.set()
        thread.join()
        limit = sum(w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    info = fit.info
    return {"kind": "dask persisted" if persist else "dask streamed", "rows": fit.n_obs, "workers": workers, "partitions": info["partitions"],
            "memory_limit_total_mb": limit / 2 ** 20, "data_mb": fit.n_obs * (P * 8 + 1) / 2 ** 20,
            "wall_seconds": wall, "vb_seconds": info["seconds"], "sweeps": info["n_sweeps"],
            "passes": info["passes"], "sweep_seconds": info["seconds"] / info["n_sweeps"],
            "pass_seconds": info["seconds"] / info["passes"], "client_peak_mb": peak_rss_mb(),
            "worker_peak_mb": peak["worker_mb"], "coef": fit.coef["mean"].tolist(), "sd": fit.coef["sd"].tolist()}


def run_child(args_list) -> dict:
    out = subprocess.run([sys.executable, __file__, *args_list], capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"child {args_list} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def cost_model(runs):
    """Least squares ``t_pass = a + b n / W`` over the Dask runs."""
    A = np.array([[1.0, r["rows"] / r["workers"]] for r in runs])
    t = np.array([r["pass_seconds"] for r in runs])
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    return float(a), float(b)


def write_report(results, out_dir: Path, args):
    dask_runs = [r for r in results if r["kind"] == "dask streamed"]
    inmem = {r["rows"]: r for r in results if r["kind"] == "inmem"}
    a, b = cost_model(dask_runs) if len(dask_runs) >= 2 else (float("nan"), float("nan"))
    sweeps = float(np.median([r["sweeps"] for r in dask_runs]))
    passes_per_sweep = float(np.median([r["passes"] / r["sweeps"] for r in dask_runs]))
    n_big, w_big = 1e9, 32
    t_pass_big = a + b * n_big / w_big
    projection = {"rows": n_big, "workers": w_big, "pass_seconds": t_pass_big, "sweeps": sweeps,
                  "passes_per_sweep": passes_per_sweep, "fit_seconds": t_pass_big * passes_per_sweep * sweeps}
    summary = {"formula": FORMULA, "machine_cores": os.cpu_count(), "args": vars(args), "runs": results,
               "cost_model": {"a_seconds": a, "b_seconds_per_row_per_worker": b}, "projection": projection}
    (out_dir / "dask_scale.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = ["# Dask scaling of the linear mean-field VB fit", "",
             f"Formula `{FORMULA}` (20 predictors), Parquet on disk ({args.part_rows:,} rows per file), "
             f"LocalCluster of {args.workers} worker processes x 1 thread, memory limit {args.memory_limit} per "
             f"worker, streamed from Parquet (`persist=False`); machine: {os.cpu_count()} cores shared with other "
             "jobs. In-memory fit: the same rows read into pandas, `vbsvm.svm(..., method='meanfield')`. Each "
             "measurement in its own process (peak RSS = that process's own).", "",
             "| rows | data MB | fit | wall s | sweeps | passes | s / sweep | ns / row / sweep | client peak MB "
             "| worker peak MB | max rel. diff of coef vs in-memory |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ref = inmem.get(r["rows"])
        diff = ""
        if r["kind"].startswith("dask") and ref is not None:
            c, c0 = np.array(r["coef"]), np.array(ref["coef"])
            diff = f"{np.max(np.abs(c - c0) / np.abs(c0)):.1e}"
        lines.append(
            f"| {r['rows']:,} | {r['rows'] * (P * 8 + 1) / 2 ** 20:,.0f} | {r['kind']}"
            f"{' (' + str(r['workers']) + ' workers)' if r['kind'].startswith('dask') else ''} | {r['wall_seconds']:.1f} "
            f"| {r['sweeps']} | {r.get('passes', '')} | {r['sweep_seconds']:.3f} "
            f"| {1e9 * r['sweep_seconds'] / r['rows']:.0f} | {r['client_peak_mb']:.0f} "
            f"| {r.get('worker_peak_mb', float('nan')):.0f} | {diff} |")
    lines += ["", f"Cost model (least squares over the streamed Dask runs): time per pass = {a:.3f} s + {b * 1e9:.1f} ns x "
              "rows / workers. A sweep is "
              f"{passes_per_sweep:.2f} passes on average (two per sweep, plus one per SQUAREM step for its norms); "
              f"the fits took {sweeps:.0f} sweeps (median), which does not grow with n.", "",
              f"Projection to 1e9 rows on 32 workers (same per-worker throughput, i.e. each worker reading its "
              f"partitions at the rate measured here): {t_pass_big:.1f} s per pass, "
              f"{t_pass_big * passes_per_sweep:.1f} s per sweep, about {projection['fit_seconds'] / 60:.0f} min "
              f"for {sweeps:.0f} sweeps."]
    (out_dir / "dask_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", type=float, default=[1e6, 3e6])
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--extra-workers", nargs="*", type=int, default=[],
                    help="also run the smallest size with these worker counts (cost model in W)")
    ap.add_argument("--memory-limit", default="1GB")
    ap.add_argument("--part-rows", type=int, default=250_000)
    ap.add_argument("--inmem-max", type=float, default=3e6)
    ap.add_argument("--data-dir", default="/tmp/vbsvm_dask_scale")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--measure", choices=["inmem", "dask"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--persist", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--persist-max", type=float, default=1e6,
                    help="also fit the sizes up to this with the partitions' designs persisted on the workers")
    args = ap.parse_args()
    if args.measure == "inmem":
        print(json.dumps(measure_inmem(Path(args.path))))
        return
    if args.measure == "dask":
        print(json.dumps(measure_dask(Path(args.path), args.workers, args.memory_limit, args.persist)))
        return
    results = []
    for rows in map(int, args.rows):
        path = Path(args.data_dir) / f"rows_{rows}"
        make_parquet(path, rows, args.part_rows)
        common = ["--path", str(path), "--memory-limit", args.memory_limit]
        todo = [(args.workers, False)] + [(w, False) for w in args.extra_workers if w != args.workers
                                          and rows == min(map(int, args.rows))]
        if rows <= args.persist_max:
            todo.append((args.workers, True))
        for w, persist in todo:
            r = run_child(["--measure", "dask", "--workers", str(w), *common] + (["--persist"] if persist else []))
            print(json.dumps({k: v for k, v in r.items() if k not in ("coef", "sd")}), flush=True)
            results.append(r)
        if rows <= args.inmem_max:
            r = run_child(["--measure", "inmem", *common])
            print(json.dumps({k: v for k, v in r.items() if k not in ("coef", "sd")}), flush=True)
            results.append(r)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_report(results, out, args)  # after every size, so that a long run leaves its results


if __name__ == "__main__":
    main()
