"""How fast Gibbs worker processes exit after their parent is killed with SIGKILL (Linux).

A launcher imports the engine once and forks, for each case, a process that runs two chains in
two workers (``n_jobs=2``); the benchmark kills that process with SIGKILL and times until both
workers have exited (no process, or a zombie), polling /proc every 5 ms. Cases: each exit
mechanism alone (``watch``: the thread polling ``os.getppid()`` every ``PARENT_POLL`` s;
``signal``: Linux's parent-death signal) and both (as the package runs), while the workers
sample and while they are blocked writing their draws to the pipe the stopped parent no longer
reads; with a checkpoint written every sweep, it also counts temporary files left behind.

Prints a table and writes ``benchmarks/results/worker_exit.json``.

Run:  PYTHONPATH=. python benchmarks/worker_exit.py [--repeats 10]

The launcher and the kill are the tests' (``tests/support/workers.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helper that kills a run and times its workers

from support.workers import kill_parent_and_time_workers
from support.workers import launcher as start_launcher


def one_case(launcher, folder, mechanism, blocked, checkpoint):
    """Seconds from SIGKILL of the parent to both workers gone (inf if not within 30 s);
    temporary files left."""
    try:
        seconds = kill_parent_and_time_workers(launcher, folder, mechanism, blocked=blocked,
                                               checkpoint=folder / "ck" if checkpoint else None, deadline=30.0)
    except AssertionError:
        seconds = float("inf")
    return seconds, sum(p.name.endswith(".tmp") for p in folder.iterdir())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cases = [("both", False, False), ("both", False, True), ("both", True, False), ("watch", False, False),
             ("watch", True, False), ("signal", False, False), ("signal", True, False)]
    rows = []
    with start_launcher(env) as launcher:
        for mechanism, blocked, checkpoint in cases:
            times, left = [], 0
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as folder:
                    seconds, tmp = one_case(launcher, Path(folder), mechanism, blocked, checkpoint)
                times.append(seconds)
                left += tmp
            rows.append({"mechanism": mechanism, "workers": "blocked on pipe" if blocked else "sampling",
                         "checkpoint every sweep": checkpoint, "repeats": args.repeats,
                         "median_s": statistics.median(times), "max_s": max(times), "temporary_files_left": left})
    print(f"{'mechanism':9s} {'workers':16s} {'ckpt':5s} {'median s':>9s} {'max s':>7s} {'tmp left':>8s}")
    for r in rows:
        print(f"{r['mechanism']:9s} {r['workers']:16s} {r['checkpoint every sweep']!s:5s} {r['median_s']:9.3f} "
              f"{r['max_s']:7.3f} {r['temporary_files_left']:8d}")
    load = os.getloadavg()
    out = Path(__file__).resolve().parent / "results" / "worker_exit.json"
    out.write_text(json.dumps({"cases": rows, "poll_interval_s": 0.005, "load_average": load,
                               "cpus": os.cpu_count()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
