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
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = """
import os, signal, sys, time, warnings
import numpy as np
import vbsvm.inference.gibbs as gibbs


class Toy:
    def __init__(self, size, go):
        self.size, self.go = size, go

    def gibbs_initial_state(self, rng):
        return {"theta": np.zeros(self.size)}

    def gibbs_sweep(self, state, rng):
        while self.go != "-" and not os.path.exists(self.go):
            time.sleep(0.01)
        time.sleep(0.001)
        return {"theta": rng.random(self.size)}


warnings.filterwarnings("ignore", message=".*use of fork", category=DeprecationWarning)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
print("ready", flush=True)
for line in sys.stdin:
    mechanism, draws, size, go, checkpoint = line.split()
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        continue
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if mechanism == "watch":
        gibbs._parent_death_signal = lambda number: None
    elif mechanism == "signal":
        gibbs._start_watch = lambda parent, takes_sigterm: False
    gibbs.run_chains(Toy(int(size), go), draws=int(draws), tune=0, chains=2, seed=0, progress=False, n_jobs=2,
                     checkpoint=None if checkpoint == "-" else checkpoint, checkpoint_every=0.0)
    os._exit(0)
"""


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], fields[19]


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _wait(condition, timeout, step=0.005):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def one_case(launcher, folder, mechanism, blocked, checkpoint):
    """Seconds from SIGKILL of the parent to both workers gone; temporary files left."""
    go = folder / "go"
    args = [mechanism, 50 if blocked else 10**8, 20_000 if blocked else 2, go if blocked else "-",
            folder / "ck" if checkpoint else "-"]
    launcher.stdin.write(" ".join(map(str, args)) + "\n")
    launcher.stdin.flush()
    parent = int(launcher.stdout.readline())
    if not _wait(lambda: len(_children(parent)) == 2, 60):
        raise RuntimeError("the workers did not start")
    workers = {pid: _stat(pid)[1] for pid in _children(parent)}
    if blocked:
        os.kill(parent, signal.SIGSTOP)
        go.touch()
        time.sleep(2.0)  # 50 sweeps of ~1 ms, then a 8 MB write into a 64 kB pipe
    else:
        time.sleep(1.0)
    os.kill(parent, signal.SIGKILL)
    killed = time.monotonic()
    exited = _wait(lambda: all(_stat(p) is None or _stat(p)[0] == "Z" or _stat(p)[1] != start
                               for p, start in workers.items()), 30)
    seconds = time.monotonic() - killed
    for pid in workers:
        if _stat(pid) is not None and _stat(pid)[0] != "Z":
            os.kill(pid, signal.SIGKILL)
    return (seconds if exited else float("inf")), sum(p.name.endswith(".tmp") for p in folder.iterdir())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, start_new_session=True, text=True)
    cases = [("both", False, False), ("both", False, True), ("both", True, False), ("watch", False, False),
             ("watch", True, False), ("signal", False, False), ("signal", True, False)]
    rows = []
    try:
        assert launcher.stdout.readline().strip() == "ready"
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
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    print(f"{'mechanism':9s} {'workers':16s} {'ckpt':5s} {'median s':>9s} {'max s':>7s} {'tmp left':>8s}")
    for r in rows:
        print(f"{r['mechanism']:9s} {r['workers']:16s} {str(r['checkpoint every sweep']):5s} {r['median_s']:9.3f} "
              f"{r['max_s']:7.3f} {r['temporary_files_left']:8d}")
    load = os.getloadavg()
    out = Path(__file__).resolve().parent / "results" / "worker_exit.json"
    out.write_text(json.dumps({"cases": rows, "poll_interval_s": 0.005, "load_average": load,
                               "cpus": os.cpu_count()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
