"""Memory and sweep cost of the in-memory linear VB fit.

For each number of rows (20 predictors, a 0/1 label from a linear score plus noise, all float64:
the frame is 21 float64 columns, ``n * 168`` bytes) and each method (``"meanfield"``, the paper's
mean-field VB, and ``"vb"``, the default, EP-based), two fresh processes:

* **memory**: the frame is built, then ``tracemalloc`` is started and
  ``vbsvm.svm("y ~ .", data=frame, method=...)`` runs; its peak traced allocation, also as a
  multiple of the frame's size (``DataFrame.memory_usage(deep=True)``);
* **time**: the same fit without tracing (wall time, sweeps, seconds per sweep: VB seconds over
  sweeps for meanfield, EP seconds over EP sweeps for vb), and one BLAS pass
  ``X.T @ (w[:, None] * X)`` over the n x 21 design (with the intercept, float64, Fortran order,
  one BLAS thread as in the fit; best of five), and their ratio. For vb also the passes over the
  rows of the whole fit (``vbsvm.inference.ep_sites.DataPasses``: each EP sweep reads the design
  once, scoring the rows and forming the new sites' ``X'WX``, and a site-statistics pass once);
  for meanfield each sweep forms one ``X'WX`` (and scores the rows in another read). ``fit /
  pass`` is the fit's seconds in units of the BLAS pass.

The load average (1 minute) is recorded before and after each process: the machine is shared,
and a sweep time measured under load is an upper bound.

``--src`` measures another checkout of vbsvm (e.g. the commit before a change) with the same
script. Results: ``benchmarks/results/inmemory_scale.{json,md}`` (``--label`` names the rows;
rows of other labels already in the JSON file are kept, so that "before" and "after" can be
measured separately and tabulated together).

Usage::

    python benchmarks/inmemory_scale.py --label after
    python benchmarks/inmemory_scale.py --label before --src /tmp/vbsvm-main --note "main before the change"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
P = 20


def make_frame(rows: int, seed=0):
    """The data: 20 shifted and scaled normal predictors and a 0/1 float label."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((rows, P))
    f = 0.3 + Z @ np.linspace(-1.0, 1.0, P) / np.sqrt(P) * 3.0 + rng.standard_normal(rows)
    frame = pd.DataFrame(Z * np.linspace(0.5, 4.0, P) + np.linspace(-3.0, 3.0, P),
                         columns=[f"x{j:02d}" for j in range(1, P + 1)])
    frame["y"] = (f > 0).astype(float)
    return frame


def load() -> float:
    return os.getloadavg()[0]


def measure(rows: int, method: str, kind: str) -> dict:
    """One measurement in this process (``kind`` "memory" or "time")."""
    import tracemalloc
    import warnings

    import vbsvm

    frame = make_frame(rows)
    size = int(frame.memory_usage(deep=True).sum())
    out = {"rows": rows, "method": method, "kind": kind, "frame_bytes": size, "load_before": load()}
    if kind == "memory":
        tracemalloc.start()
    passes = None
    if method == "vb":
        from vbsvm.inference.ep_sites import DataPasses

        passes = DataPasses.count
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ .", data=frame, method=method, progress=False)
    out["wall_seconds"] = time.perf_counter() - t0
    if passes is not None:
        out["data_passes"] = DataPasses.count - passes
    if kind == "memory":
        out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out["peak_ratio"] = out["peak_bytes"] / size
    else:
        info = fit.info
        if method == "meanfield":
            out["sweeps"], out["fit_seconds"] = int(info["n_sweeps"]), float(info.get("inference_seconds", info["seconds"]))
        else:
            out["sweeps"], out["fit_seconds"] = int(info["n_sweeps"]), float(info["seconds_total"])
        out["sweep_seconds"] = out["fit_seconds"] / out["sweeps"]
        out["pass_seconds"] = blas_pass(frame)
        out["sweep_per_pass"] = out["sweep_seconds"] / out["pass_seconds"]
        out["fit_per_pass"] = out["fit_seconds"] / out["pass_seconds"]
        if method == "vb":
            out["ep_runs"], out["grid_points"] = int(info["n_ep"]), int(info["grid_points"])
    out["load_after"] = load()
    return out


def blas_pass(frame, repeats=5) -> float:
    """Seconds of one ``X.T @ (w[:, None] * X)`` over the design with intercept, one BLAS thread."""
    from threadpoolctl import threadpool_limits

    X = np.asfortranarray(np.column_stack([np.ones(len(frame)), frame.drop(columns="y").to_numpy(float)]))
    w = np.random.default_rng(0).uniform(0.1, 2.0, len(frame))
    times = []
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(repeats):
            t0 = time.perf_counter()
            X.T @ (w[:, None] * X)
            times.append(time.perf_counter() - t0)
    return min(times)


def run(rows: int, method: str, kind: str, src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", kind, "--rows", str(rows), "--methods", method]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list) -> str:
    head = ("| label | rows | method | frame | peak (tracemalloc) | peak / frame | sweeps | s / sweep | "
            "BLAS pass (s) | sweep / pass | passes over the rows | fit s | fit / pass | load (mem run) | "
            "load (time run) |")
    lines = [head, "|" + "---|" * 15]
    key = lambda r: (r["label"], r["rows"], r["method"])
    mem = {key(r): r for r in results if r["kind"] == "memory"}
    tim = {key(r): r for r in results if r["kind"] == "time"}
    for k in sorted(set(mem) | set(tim), key=lambda k: (k[0] != "before", k[0], k[1], k[2])):
        m, t = mem.get(k, {}), tim.get(k, {})
        size = (m or t)["frame_bytes"]
        lines.append(
            f"| {k[0]} | {k[1]:.0e} | {k[2]} | {size / 1e6:.0f} MB | "
            + (f"{m['peak_bytes'] / 1e6:.0f} MB | {m['peak_ratio']:.2f} | " if m else "| | ")
            + (f"{t['sweeps']} | {t['sweep_seconds']:.4f} | {t['pass_seconds']:.4f} | {t['sweep_per_pass']:.2f} | "
               if t else "| | | | ")
            + (f"{t.get('data_passes', m.get('data_passes', ''))} | " if (t or m) else "| ")
            + (f"{t['fit_seconds']:.2f} | {t['fit_seconds'] / t['pass_seconds']:.0f} | " if t else "| | ")
            + (f"{m['load_before']:.2f}-{m['load_after']:.2f} | " if m else "| ")
            + (f"{t['load_before']:.2f}-{t['load_after']:.2f} |" if t else "|"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, nargs="+", default=[1e5, 1e6])
    ap.add_argument("--methods", nargs="+", default=["meanfield", "vb"])
    ap.add_argument("--label", default="after")
    ap.add_argument("--note", default="", help="what the label measures (e.g. the commit), kept in the results")
    ap.add_argument("--src", type=Path, default=HERE.parent, help="checkout of vbsvm to measure")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "inmemory_scale")
    ap.add_argument("--measure", choices=["memory", "time"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(int(args.rows[0]), args.methods[0], args.measure)))
        return
    path = args.out.with_suffix(".json")
    kept = [r for r in json.loads(path.read_text())["results"] if r["label"] != args.label] if path.exists() else []
    results = []
    for rows in map(int, args.rows):
        for method in args.methods:
            for kind in ("memory", "time"):
                r = run(rows, method, kind, args.src.resolve())
                r["label"] = args.label
                results.append(r)
                print(json.dumps(r), flush=True)
    commit = subprocess.run(["git", "-C", str(args.src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for r in results:
        r["commit"], r["source"] = commit or None, args.note or str(args.src)
    write(args.out, kept + results)


def write(out: Path, results: list):
    """The results as ``out.json`` and the table as ``out.md``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"results": results, "cpu_count": os.cpu_count()}, indent=1))
    text = table(results)
    sources = {r["label"]: (r.get("source"), r.get("commit")) for r in results}
    labels = "\n".join(f"* **{k}**: {v[0]}" + (f" (commit {v[1]})" if v[1] else "") for k, v in sources.items())
    out.with_suffix(".md").write_text(
        "# In-memory linear fit: peak allocation and sweep cost\n\n"
        "`python benchmarks/inmemory_scale.py`: `vbsvm.svm('y ~ .', data=frame, method=...)` on a frame of 20 "
        "float64 predictors and a float64 0/1 label (21 columns). Peak: `tracemalloc` around the call, the "
        "frame built before. Sweep: VB seconds / sweeps (meanfield) or EP seconds / EP sweeps (vb), in a run "
        "without tracing. BLAS pass: one `X.T @ (w[:, None] * X)` over the n x 21 design, one BLAS thread, "
        "best of five. Passes over the rows: vb only (each EP sweep reads the design once; rows measured "
        "before the counter existed have none). Fit s: the engine's seconds (meanfield: VB iterations; vb: the "
        "whole calibrated fit), fit / pass in BLAS passes. Load: 1-minute load average before-after each run "
        "(2 cores, shared).\n\n"
        + labels + "\n\n" + text + "\n")
    print(text)


if __name__ == "__main__":
    main()
