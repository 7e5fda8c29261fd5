"""Scaling of the Dask fit (``vbsvm.svm(formula, data=<dask DataFrame>, method="meanfield")``).

For each number of rows: a Parquet data set on disk (20 standard-normal-ish predictors, a 0/1
label from a linear score plus noise; one file per ``--part-rows`` rows), then

* the Dask fit on a ``LocalCluster`` with ``--workers`` worker processes of one thread each and a
  ``--memory-limit`` per worker, with each partition's design spilled to disk once and
  memory-mapped on every pass (``persist=False``: the out-of-core mode) and, for rows up to
  ``--persist-max``, kept in the workers' memory (``persist=True``): wall time, the set-up time
  (learning the design, building the blocks), sweeps, passes over the data, time per sweep, the
  client's peak RSS and the largest RSS any worker reached (polled every 0.5 s), the load
  average before and after;
* the reference: one in-memory BLAS pass ``X.T @ (w[:, None] * X)`` over the same rows' design
  (n x 21, one BLAS thread; timed on at most ``--blas-rows`` rows, per row), and, where it fits
  (rows <= ``--inmem-max``), the in-memory fit of the same rows; each measurement in a fresh
  process so that its peak RSS is its own.

The workers' memory limit is enforced by the nanny (``terminate`` at 95% of it); its spill and
pause thresholds act on the process RSS, which includes the ~0.2 GB of imported libraries, and
would pause a worker with a small limit while its data are on disk anyway, so ``--no-pause`` turns
``distributed.worker.memory.target/spill/pause`` off (``terminate`` stays).

A linear cost model of the time per pass, ``t = a + b n / W``, fitted to the spilled runs,
projects a fit of 1e9 rows on 32 workers. Results: ``benchmarks/results/dask_scale.{json,md}``.

``--method vb``: the default method (calibrated EP over the penalty's variance) instead of the
mean-field fit, results in ``benchmarks/results/dask_scale_vb.{json,md}``. The per-row cost is a
worker's CPU time per row and pass that reads the design (EP sweeps, statistics; the CPU of the
passes that read only site vectors is counted in it too), against the in-memory EP pass: the
CPU time of ``EPPass`` on the in-memory model (best of three, default sites) and the in-memory
fit's CPU time per pass (``DataPasses``) and row. pyarrow's default pool (mimalloc) keeps what the
set-up's Parquet reads freed; the package's partition tasks return it to the system, and with a
small memory limit ``ARROW_DEFAULT_MEMORY_POOL=system`` (the workers inherit it) leaves more
headroom.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/dask_scale.py --rows 1e6 3e6 1.5e7 --workers 2 \
        --memory-limit 400MB --no-pause
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
import warnings
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


def load() -> float:
    return os.getloadavg()[0]


def measure_blas(path: Path, max_rows: int) -> dict:
    """Seconds per row of one ``X.T @ (w[:, None] * X)`` over the design (intercept + 20
    columns) of the first ``max_rows`` rows, best of three."""
    import pandas as pd

    files = sorted(path.glob("*.parquet"))
    frames, rows = [], 0
    for f in files:
        frames.append(pd.read_parquet(f))
        rows += len(frames[-1])
        if rows >= max_rows:
            break
    df = pd.concat(frames, ignore_index=True).iloc[:max_rows]
    X = np.asfortranarray(np.column_stack([np.ones(len(df)), df.drop(columns="y").to_numpy(float)]))
    w = np.random.default_rng(0).uniform(0.1, 2.0, len(df))
    times, cpu = [], []
    load0 = load()
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        X.T @ (w[:, None] * X)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"kind": "blas", "rows": len(df), "pass_seconds": min(times), "ns_per_row": 1e9 * min(times) / len(df),
            "cpu_ns_per_row": 1e9 * min(cpu) / len(df), "load": [load0, load()]}


def measure_inmem(path: Path, method="meanfield") -> dict:
    import pandas as pd

    import vbsvm

    load0 = load()
    t0 = time.perf_counter()
    df = pd.read_parquet(path)
    t_read = time.perf_counter() - t0
    if method == "vb":
        return _measure_inmem_ep(df, t_read, load0)
    t0, c0 = time.perf_counter(), time.process_time()
    fit = vbsvm.svm(FORMULA, df, method="meanfield")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"kind": "inmem", "rows": len(df), "read_seconds": t_read, "wall_seconds": wall, "cpu_fraction": cpu / wall,
            "vb_seconds": fit.info["seconds"], "sweeps": fit.info["n_sweeps"],
            "sweep_seconds": fit.info["seconds"] / fit.info["n_sweeps"], "client_peak_mb": peak_rss_mb(),
            "load": [load0, load()], "coef": fit.coef["mean"].tolist(), "sd": fit.coef["sd"].tolist()}


def _measure_inmem_ep(df, t_read, load0) -> dict:
    """The in-memory default fit, and the CPU time of one in-memory EP pass (best of three)."""
    import vbsvm
    from vbsvm.inference import ep_sites
    from vbsvm.models.linear import LinearSVMModel

    passes0 = ep_sites.DataPasses.count
    t0, c0 = time.perf_counter(), time.process_time()
    fit = vbsvm.svm(FORMULA, df, seed=1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    passes = ep_sites.DataPasses.count - passes0
    model = LinearSVMModel.from_design(fit.design, fit.settings)
    problem = ep_sites._Problem(model, model.prior_precision(np.ones(len(model.variance_components))))
    x = problem.with_statistics(ep_sites.Sites(*problem.rows.default_sites()))
    times = []
    for _ in range(3):
        c = time.process_time()
        ep_sites.EPPass(problem, x)
        times.append(time.process_time() - c)
    n = fit.n_obs
    return {"kind": "inmem", "rows": n, "read_seconds": t_read, "wall_seconds": wall, "cpu_fraction": cpu / wall,
            "ep_runs": fit.info["n_ep"], "sweeps": fit.info["n_sweeps"], "passes": passes,
            "fit_cpu_ns_per_row_pass": 1e9 * cpu / (passes * n), "ep_pass_cpu_ns_per_row": 1e9 * min(times) / n,
            "client_peak_mb": peak_rss_mb(), "load": [load0, load()], "coef": fit.coef["mean"].tolist(),
            "sd": fit.coef["sd"].tolist()}


def measure_dask(path: Path, workers: int, memory_limit: str, persist: bool, no_pause: bool, max_sweeps: int,
                 method: str = "meanfield") -> dict:
    import dask
    import dask.dataframe as dd
    import psutil
    from distributed import Client, LocalCluster

    import vbsvm

    config = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False,
              "distributed.worker.memory.pause": False} if no_pause else {}
    with dask.config.set(config), LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                               memory_limit=memory_limit, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        def rss():
            return psutil.Process().memory_info().rss / 2 ** 20

        def cpu():
            t = psutil.Process().cpu_times()
            return t.user + t.system

        peak = {"worker_mb": 0.0, "idle_mb": max(client.run(rss).values())}
        cpu_trace = []  # (time, the workers' CPU seconds, the client's (with the scheduler))
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    peak["worker_mb"] = max([peak["worker_mb"], *client.run(rss).values()])
                    cpu_trace.append((time.perf_counter(), sum(client.run(cpu).values()), cpu()))
                except Exception:  # noqa: BLE001 - a poll during shutdown
                    pass
                stop.wait(0.5)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        data = dd.read_parquet(str(path))
        load0 = load()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", vbsvm.exceptions.ConvergenceWarning)  # with --max-sweeps
            if method == "vb":
                fit = vbsvm.svm(FORMULA, data, persist=persist, seed=1)
            else:
                fit = vbsvm.svm(FORMULA, data, method="meanfield", persist=persist, max_iter=max_sweeps)
        wall = time.perf_counter() - t0
        stop.set()
        thread.join()
        limit = sum(w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    info = fit.info
    if method == "vb":
        return _dask_ep_result(fit, info, cpu_trace, t0, wall, persist, workers, limit, peak, no_pause, load0)
    # CPU seconds of the VB sweeps (the polls nearest the start of the sweeps and the end of the fit)
    trace = np.array(cpu_trace)
    t_vb = t0 + info["seconds_setup"]
    k0 = int(np.argmin(np.abs(trace[:, 0] - t_vb)))
    k1 = int(np.argmin(np.abs(trace[:, 0] - (t_vb + info["seconds"]))))
    vb_cpu_workers, vb_cpu_client = trace[k1, 1] - trace[k0, 1], trace[k1, 2] - trace[k0, 2]
    vb_span = trace[k1, 0] - trace[k0, 0]
    return {"kind": "dask persisted" if persist else "dask spilled", "rows": fit.n_obs, "workers": workers,
            "partitions": info["partitions"], "memory_limit_total_mb": limit / 2 ** 20,
            "data_mb": fit.n_obs * (P * 8 + 1) / 2 ** 20, "wall_seconds": wall, "vb_seconds": info["seconds"],
            "setup_seconds": info["seconds_setup"], "sweeps": info["n_sweeps"], "passes": info["passes"],
            "blocks": info["blocks"],
            "sweep_seconds": info["seconds"] / info["n_sweeps"], "pass_seconds": info["seconds"] / info["passes"],
            "client_peak_mb": peak_rss_mb(), "worker_idle_mb": peak["idle_mb"], "worker_peak_mb": peak["worker_mb"],
            "vb_cpu_seconds_workers": vb_cpu_workers, "vb_cpu_seconds_client": vb_cpu_client, "vb_cpu_span": vb_span,
            "converged": bool(info["converged"]), "no_pause": no_pause, "load": [load0, load()],
            "coef": fit.coef["mean"].tolist(),
            "sd": fit.coef["sd"].tolist()}


def _dask_ep_result(fit, info, cpu_trace, t0, wall, persist, workers, limit, peak, no_pause, load0) -> dict:
    """The measurements of a Dask default (EP) fit: the CPU of the EP part (integration,
    moments, corrections) from the polls nearest its start and end."""
    trace = np.array(cpu_trace)
    t_ep = t0 + info["seconds_setup"]
    k0 = int(np.argmin(np.abs(trace[:, 0] - t_ep)))
    k1 = int(np.argmin(np.abs(trace[:, 0] - (t_ep + info["seconds_total"]))))
    span = trace[k1, 0] - trace[k0, 0]
    scale = info["seconds_total"] / span if span > 0 else float("nan")
    cpu_workers, cpu_client = (trace[k1, 1] - trace[k0, 1]) * scale, (trace[k1, 2] - trace[k0, 2]) * scale
    return {"kind": "dask persisted" if persist else "dask spilled", "rows": fit.n_obs, "workers": workers,
            "partitions": info["partitions"], "memory_limit_total_mb": limit / 2 ** 20,
            "data_mb": fit.n_obs * (P * 8 + 1) / 2 ** 20, "wall_seconds": wall, "ep_seconds": info["seconds_total"],
            "setup_seconds": info["seconds_setup"], "ep_runs": info["n_ep"], "sweeps": info["n_sweeps"],
            "passes": info["passes"], "vector_passes": info["vector_passes"], "blocks": info["blocks"],
            "pass_seconds": info["seconds_total"] / info["passes"],
            "cpu_seconds_workers": cpu_workers, "cpu_seconds_client": cpu_client,
            "worker_cpu_ns_per_row_pass": 1e9 * cpu_workers / (info["passes"] * fit.n_obs),
            "client_peak_mb": peak_rss_mb(), "worker_idle_mb": peak["idle_mb"], "worker_peak_mb": peak["worker_mb"],
            "no_pause": no_pause, "load": [load0, load()], "coef": fit.coef["mean"].tolist(),
            "sd": fit.coef["sd"].tolist()}


def write_report_vb(results, out_dir: Path, args):
    """``dask_scale_vb.{json,md}``: the default method's runs."""
    inmem = {r["rows"]: r for r in results if r["kind"] == "inmem"}
    ep_ns = [r["ep_pass_cpu_ns_per_row"] for r in inmem.values()]
    ref_ns = min(ep_ns) if ep_ns else float("nan")
    summary = {"formula": FORMULA, "method": "vb", "machine_cores": os.cpu_count(), "args": vars(args),
               "runs": results, "inmem_ep_pass_cpu_ns_per_row": ref_ns}
    (out_dir / "dask_scale_vb.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = ["# Dask scaling of the default fit (calibrated EP over the penalty's variance)", "",
             f"Formula `{FORMULA}` (20 predictors, `penalty='auto'`), Parquet on disk ({args.part_rows:,} rows per "
             f"file), LocalCluster of {args.workers} worker processes x 1 thread, memory limit {args.memory_limit} per "
             f"worker ({args.persist_memory_limit} for the persisted fits)"
             f"{', target/spill/pause off, terminate at 95%' if args.no_pause else ''}; one BLAS thread everywhere; "
             f"machine: {os.cpu_count()} cores shared with other jobs (load average before/after each run in the last "
             "column). *spilled*: `persist=False` (designs and site vectors in files, memory-mapped by each pass); "
             "*persisted*: `persist=True`. *passes*: passes that read the design (EP sweeps, statistics of warm "
             "starts, the marginal corrections) / passes that read site vectors only (SQUAREM's norms, proposal "
             "checks, warm-start scaling). *worker CPU ns / row / pass*: the workers' CPU seconds during the EP part "
             "of the fit (polled every 0.5 s; all passes) over design passes x rows. *x in-memory*: divided by the "
             f"CPU time a row of one in-memory `EPPass` ({ref_ns:.0f} ns, best of three, smallest over the sizes). "
             "In-memory fit: the same rows in pandas, `vbsvm.svm(formula, df)`, its CPU time per pass and row "
             "in the same column. Each measurement in its own process.", "",
             "| rows | data MB | workers' limit MB | fit | wall s | set-up s | EP runs | sweeps | passes | blocks "
             "| s / pass | worker CPU ns / row / pass | x in-memory EP pass | client peak MB | worker idle / peak MB "
             "| coef vs in-memory | load |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        ref = inmem.get(r["rows"])
        load_ = f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"
        if r["kind"] == "inmem":
            lines.append(f"| {r['rows']:,} | {r['rows'] * (P * 8 + 1) / 2 ** 20:,.0f} | | in memory | "
                         f"{r['wall_seconds']:.1f} | | {r['ep_runs']} | {r['sweeps']} | {r['passes']} | | "
                         f"{r['wall_seconds'] / r['passes']:.3f} | {r['fit_cpu_ns_per_row_pass']:.0f} (EPPass "
                         f"{r['ep_pass_cpu_ns_per_row']:.0f}) | {r['fit_cpu_ns_per_row_pass'] / ref_ns:.1f} | "
                         f"{r['client_peak_mb']:.0f} | | | {load_} |")
            continue
        diff = ""
        if ref is not None:
            c, c0 = np.array(r["coef"]), np.array(ref["coef"])
            diff = f"{np.max(np.abs(c - c0) / np.abs(c0)):.1e}"
        ns = r["worker_cpu_ns_per_row_pass"]
        lines.append(f"| {r['rows']:,} | {r['data_mb']:,.0f} | {r['memory_limit_total_mb']:,.0f} | {r['kind']} "
                     f"({r['workers']} workers) | {r['wall_seconds']:.1f} | {r['setup_seconds']:.1f} | {r['ep_runs']} "
                     f"| {r['sweeps']} | {r['passes']} / {r['vector_passes']} | {r['blocks']} | {r['pass_seconds']:.3f} "
                     f"| {ns:.0f} | {ns / ref_ns:.1f} | {r['client_peak_mb']:.0f} | {r['worker_idle_mb']:.0f} / "
                     f"{r['worker_peak_mb']:.0f} | {diff} | {load_} |")
    (out_dir / "dask_scale_vb.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_child(args_list) -> dict:
    out = subprocess.run([sys.executable, __file__, *args_list], capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"child {args_list} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def cost_model(runs, key="pass_seconds"):
    """Least squares ``t_pass = a + b n / W`` over the Dask runs (``key``: wall or CPU time)."""
    A = np.array([[1.0, r["rows"] / r["workers"]] for r in runs])
    t = np.array([r[key] for r in runs])
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    return float(a), float(b)


def write_report(results, out_dir: Path, args):
    spilled = [r for r in results if r["kind"] == "dask spilled"]
    for r in spilled:  # the cost model in CPU time, free of the other jobs' load
        r["pass_cpu_seconds"] = r["vb_cpu_seconds_workers"] / r["workers"] * r["vb_seconds"] / r["vb_cpu_span"] / r["passes"]
    inmem = {r["rows"]: r for r in results if r["kind"] == "inmem"}
    blas = [r for r in results if r["kind"] == "blas"]
    blas_ns = min(r["cpu_ns_per_row"] for r in blas) if blas else float("nan")
    a, b = cost_model(spilled) if len(spilled) >= 2 else (float("nan"), float("nan"))
    ac, bc = cost_model(spilled, "pass_cpu_seconds") if len(spilled) >= 2 else (float("nan"), float("nan"))
    sweeps = float(np.median([r["sweeps"] for r in spilled if r.get("converged", True)])) if spilled else float("nan")
    passes_per_sweep = float(np.median([r["passes"] / r["sweeps"] for r in spilled])) if spilled else float("nan")
    n_big, w_big = 1e9, 32
    t_pass_big = a + b * n_big / w_big
    t_cpu_big = ac + bc * n_big / w_big
    projection = {"rows": n_big, "workers": w_big, "pass_seconds": t_pass_big, "sweeps": sweeps,
                  "passes_per_sweep": passes_per_sweep, "fit_seconds": t_pass_big * passes_per_sweep * sweeps,
                  "pass_seconds_dedicated_core": t_cpu_big,
                  "fit_seconds_dedicated_core": t_cpu_big * passes_per_sweep * sweeps}
    summary = {"formula": FORMULA, "machine_cores": os.cpu_count(), "args": vars(args), "runs": results,
               "blas_ns_per_row": blas_ns, "cost_model": {"a_seconds": a, "b_seconds_per_row_per_worker": b, "cpu_a_seconds": ac,
                              "cpu_b_seconds_per_row_per_worker": bc},
               "projection": projection}
    (out_dir / "dask_scale.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = ["# Dask scaling of the linear mean-field VB fit", "",
             f"Formula `{FORMULA}` (20 predictors), Parquet on disk ({args.part_rows:,} rows per file), "
             f"LocalCluster of {args.workers} worker processes x 1 thread, memory limit {args.memory_limit} per "
             f"worker ({args.persist_memory_limit} for the persisted fits)"
             f"{', target/spill/pause off, terminate at 95%' if args.no_pause else ''}; one BLAS thread "
             f"everywhere; machine: {os.cpu_count()} cores shared with other jobs (load average before/after each "
             "run in the last column: the wall times are inflated by it, the CPU times much less). *spilled*: "
             "`persist=False`, each partition's design written to disk once and memory-mapped on every pass; "
             "*persisted*: `persist=True`, kept in the workers' memory; either way consecutive partitions are "
             "coalesced into blocks of up to 256 MB of design, about one per worker, one task each a pass (*blocks*). "
             "In-memory fit: the same rows read into "
             "pandas, `vbsvm.svm(..., method='meanfield')`. BLAS pass: one `X.T @ (w[:, None] * X)` over the "
             f"in-memory design (n x 21), {blas_ns:.1f} ns of CPU a row. *wall ns / row / sweep*: wall time of a "
             "sweep over the rows. *worker CPU ns / row / sweep*: CPU seconds of all workers during the sweeps "
             "(polled every 0.5 s) over sweeps x rows, i.e. the work a row costs a worker in a sweep; *x BLAS* "
             "divides it by the BLAS pass's CPU time a row (the in-memory row: its wall time x its CPU fraction). "
             "*client CPU*: the client process (with the scheduler) per sweep. Set-up: learning the design and "
             "building the blocks (three passes over Parquet). Each measurement in its own process.", "",
             "| rows | data MB | workers' limit MB | fit | wall s | set-up s | sweeps | passes | blocks | s / sweep "
             "| wall ns / row / sweep | worker CPU ns / row / sweep | x BLAS | client CPU s / sweep | client peak MB "
             "| worker idle / peak MB | coef vs in-memory | load |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r["kind"] == "blas":
            continue
        ref = inmem.get(r["rows"])
        diff = ""
        dask_run = r["kind"].startswith("dask")
        if dask_run and ref is not None:
            c, c0 = np.array(r["coef"]), np.array(ref["coef"])
            diff = f"{np.max(np.abs(c - c0) / np.abs(c0)):.1e}"
        ns = 1e9 * r["sweep_seconds"] / r["rows"]
        if dask_run:
            scale = r["vb_seconds"] / r["vb_cpu_span"] / (r["sweeps"] * r["rows"])
            cpu_ns = 1e9 * r["vb_cpu_seconds_workers"] * scale
            client = r["vb_cpu_seconds_client"] * r["vb_seconds"] / r["vb_cpu_span"] / r["sweeps"]
            head = (f"| {r['rows']:,} | {r['data_mb']:,.0f} | {r['memory_limit_total_mb']:,.0f} "
                    f"| {r['kind']} ({r['workers']} workers){'' if r.get('converged', True) else ', stopped'}")
            tail = f"| {client:.3f} | {r['client_peak_mb']:.0f} | {r['worker_idle_mb']:.0f} / {r['worker_peak_mb']:.0f}"
        else:
            cpu_ns = ns * r["cpu_fraction"]
            head = f"| {r['rows']:,} | {r['rows'] * (P * 8 + 1) / 2 ** 20:,.0f} | | {r['kind']}"
            tail = f"| | {r['client_peak_mb']:.0f} | "
        lines.append(
            f"{head} | {r['wall_seconds']:.1f} | {format(r['setup_seconds'], '.1f') if dask_run else ''} | {r['sweeps']} "
            f"| {r.get('passes', '')} | {r.get('blocks', '')} | {r['sweep_seconds']:.3f} | {ns:.0f} | {cpu_ns:.0f} "
            f"| {cpu_ns / blas_ns:.1f} "
            f"{tail} | {diff} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    lines += ["", f"Cost model (least squares over the spilled runs): wall time per pass = {a:.3f} s + "
              f"{b * 1e9:.1f} ns x rows / workers (under the load above); a worker's CPU time per pass = {ac:.3f} s + "
              f"{bc * 1e9:.1f} ns x rows / workers (what a pass takes with a core per worker). A sweep is "
              f"{passes_per_sweep:.2f} passes (the pass that ends a sweep also computes the working Gram of the state "
              "it leaves and, after a SQUAREM step's second sweep, the step's norms; the Gram of an extrapolated "
              "proposal is a pass of its own); the fits took "
              f"{sweeps:.0f} sweeps (median; "
              + ", ".join(f"{r['sweeps']} at {r['rows']:,} rows" for r in spilled if r.get("converged", True))
              + "; each n is its own simulated data set).", "",
              f"Projection to 1e9 rows on 32 workers, each memory-mapping its partitions' spilled designs: with a core "
              f"per worker (CPU-time model) {t_cpu_big:.1f} s per pass, {t_cpu_big * passes_per_sweep:.1f} s per sweep, "
              f"about {projection['fit_seconds_dedicated_core'] / 60:.0f} min for {sweeps:.0f} sweeps; at the wall-time "
              f"rate measured here on the shared cores, {t_pass_big:.1f} s per pass, about "
              f"{projection['fit_seconds'] / 60:.0f} min. Plus the set-up: three passes that read the source and run "
              "formulaic (see the set-up column), and the disk: 176 bytes a row of spilled design (5.5 GB per "
              "worker at 1e9 / 32), read from the page cache if it fits there, else from the disk at its bandwidth."]
    (out_dir / "dask_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", type=float, default=[1e6, 3e6])
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--memory-limit", default="1GB")
    ap.add_argument("--no-pause", action="store_true",
                    help="turn the nanny's target/spill/pause thresholds off (terminate stays)")
    ap.add_argument("--part-rows", type=int, default=250_000)
    ap.add_argument("--inmem-max", type=float, default=3e6)
    ap.add_argument("--blas-rows", type=float, default=3e6)
    ap.add_argument("--persist-max", type=float, default=1e6,
                    help="also fit the sizes up to this with the partitions' designs persisted on the workers")
    ap.add_argument("--persist-memory-limit", default="1GB", help="the memory limit per worker of those fits")
    ap.add_argument("--max-sweeps", type=int, default=1000,
                    help="stop the Dask fits after this many sweeps (time per sweep and memory without convergence)")
    ap.add_argument("--merge", nargs="+", help="write one report from these dask_scale.json files' runs")
    ap.add_argument("--data-dir", default="/tmp/vbsvm_dask_scale")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--method", choices=["meanfield", "vb"], default="meanfield",
                    help="the fit measured: mean-field VB, or the default calibrated EP (report dask_scale_vb)")
    ap.add_argument("--measure", choices=["inmem", "dask", "blas"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--persist", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure == "inmem":
        print(json.dumps(measure_inmem(Path(args.path), args.method)))
        return
    if args.measure == "blas":
        print(json.dumps(measure_blas(Path(args.path), int(args.blas_rows))))
        return
    if args.measure == "dask":
        print(json.dumps(measure_dask(Path(args.path), args.workers, args.memory_limit, args.persist, args.no_pause,
                                      args.max_sweeps, args.method)))
        return
    report = write_report_vb if args.method == "vb" else write_report
    if args.merge:
        results = [r for f in args.merge for r in json.loads(Path(f).read_text())["runs"]]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        report(sorted(results, key=lambda r: r["rows"]), Path(args.out), args)
        return
    results = []
    for rows in map(int, args.rows):
        path = Path(args.data_dir) / f"rows_{rows}_per_{args.part_rows}"
        make_parquet(path, rows, args.part_rows)
        common = ["--path", str(path), "--workers", str(args.workers), "--blas-rows", str(args.blas_rows),
                  "--max-sweeps", str(args.max_sweeps), "--method", args.method] + (["--no-pause"] if args.no_pause else [])
        todo = [] if args.method == "vb" else [["--measure", "blas"]]
        todo.append(["--measure", "dask", "--memory-limit", args.memory_limit])
        if rows <= args.persist_max:
            todo.append(["--measure", "dask", "--persist", "--memory-limit", args.persist_memory_limit])
        if rows <= args.inmem_max:
            todo.append(["--measure", "inmem"])
        for extra in todo:
            r = run_child(extra + common)
            print(json.dumps({k: v for k, v in r.items() if k not in ("coef", "sd")}), flush=True)
            results.append(r)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report(results, out, args)  # after every size, so that a long run leaves its results


if __name__ == "__main__":
    main()
