"""What reading a fit file as bounded data costs, on normal files.

:func:`vbsvm.load` parses a fit file in a child process (:mod:`vbsvm.io.fit_file_reader`) with
capped memory and a time limit, and checks every array (:mod:`vbsvm.io.fit_file_schema`) and the
checksum. For small fits of each kind this measures, interleaved and repeated (medians):

* ``in-process``: the unbounded baseline, the file read into memory and parsed by xarray in the
  calling process, then the fit rebuilt (``from_datatree``) and used once (``check_loaded``);
* ``vbsvm.load``: the bounded reader, then the same rebuild and use;
* the reader process alone (its wall time, from start to its last message) and its peak
  resident memory (``VmHWM``), and the load average of the machine while measuring.

Prints a table and writes ``benchmarks/results/fit_file_reader.json``.

Run:  PYTHONPATH=. python benchmarks/fit_file_reader.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

import vbsvm
import vbsvm.io.fit_file as ff

OUT = Path(__file__).resolve().parent / "results" / "fit_file_reader.json"


def frame(n, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.uniform(1, 2, n), "s": rng.choice(["a", "b"], n),
                       "g": rng.choice([f"g{i}" for i in range(20)], n)})
    df["y"] = (df["x"] + rng.normal(size=n) > 0).astype(int)
    return df


def fits():
    df = frame(300)
    return {
        "linear vb, random intercept": lambda: vbsvm.svm("y ~ x + np.log(z) + C(s) + (1 | g)", df, seed=1),
        "linear gibbs": lambda: vbsvm.svm("y ~ x + z + (1 | g)", df, method="gibbs", draws=1000, tune=500,
                                          chains=4, seed=1, progress=False),
        "selection vb": lambda: vbsvm.svm("y ~ x + z + s", df, prior=vbsvm.LaplaceZero(rho=0.3), seed=1),
        "gp vb": lambda: vbsvm.gpsvm("y ~ x + z", df, n_inducing=20, seed=1),
    }


def fit_type(path):
    import h5py

    with h5py.File(path, "r") as f:
        return str(f.attrs["vbsvm_fit_type"])


def rebuild(kind, tree):
    from vbsvm.results.gp import GPFit
    from vbsvm.results.fit import Fit
    from vbsvm.results.selection import SelectionFit

    cls = {"linear": Fit, "selection": SelectionFit, "gpsvm": GPFit}[kind]
    fit = cls.from_datatree(tree)
    ff.check_loaded(fit)
    return fit


def old_way(path, kind):
    """The unbounded baseline: the file read into memory, parsed by xarray in this process."""
    with open(path, "rb") as f:
        tree = xr.open_datatree(io.BytesIO(f.read()), engine="h5netcdf")
    tree.load()
    tree.close()
    return rebuild(kind, tree)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in fits().items():
            path = Path(tmp) / "fit.nc"
            make().save(path)
            kind = fit_type(path)
            old, new, reader, peak, load = [], [], [], [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                old_way(path, kind)
                old.append(time.perf_counter() - start)
                start = time.perf_counter()
                vbsvm.load(path)
                new.append(time.perf_counter() - start)
                reader.append(ff.LAST_READ.seconds)
                peak.append(ff.LAST_READ.reader_peak_rss)
                load.append(os.getloadavg()[0])
            row = {"fit": name, "file_bytes": path.stat().st_size, "in_process_s": statistics.median(old),
                   "bounded_s": statistics.median(new), "overhead_s": statistics.median(new) - statistics.median(old),
                   "reader_process_s": statistics.median(reader), "reader_peak_rss_mb": max(peak) / 2 ** 20,
                   "declared_bound_mb": ff.LAST_READ.declared_bound / 2 ** 20,
                   "memory_bound_mb": ff.LAST_READ.memory_bound / 2 ** 20, "time_limit_s": ff.LAST_READ.time_limit,
                   "load_average": statistics.median(load)}
            rows.append(row)
    table = pd.DataFrame(rows).set_index("fit")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(3).to_string())
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"repeat": args.repeat, "cpu_count": os.cpu_count(), "rows": rows}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
