"""Costs behind the bad-data checks of :func:`vbsvm.svm`.

1. **Huge factors**: the time to refuse ``C(g)`` with 5000 levels (before any design is built),
   and the fit times of ``y ~ x + C(g)`` against ``y ~ x + (1 | g)`` as the number of levels
   grows (the cost behind :data:`vbsvm.formula.design.MAX_FACTOR_LEVELS`).
2. **Separability LP** (:meth:`vbsvm.formula.design.Design.linearly_separable`, run by ``svm`` for
   ``penalty=None`` and for ``penalty="auto"`` with ``A_u <= 1``): its time on the Section 4.2
   simulation, against the time of the default fit.

Prints a table and writes ``benchmarks/results/bad_data.json``.

Run:  PYTHONPATH=. python benchmarks/bad_data.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vbsvm  # noqa: E402
from vbsvm.formula.design import MAX_FACTOR_LEVELS, build_design
from vbsvm.exceptions import InputError

RESULTS = Path(__file__).resolve().parent / "results" / "bad_data.json"


def factor_data(n, k, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(size=n), "g": rng.integers(0, k, n)})
    df["y"] = (df["x"] + rng.normal(size=n) > 0).astype(int)
    return df


def timed(f):
    start = time.perf_counter()
    out = f()
    return time.perf_counter() - start, out


def refuse_huge_factor(n=10_000, k=5_000):
    df = factor_data(n, k)

    def call():
        try:
            vbsvm.svm("y ~ x + C(g)", df)
        except InputError as exc:
            return str(exc)
        raise AssertionError("not refused")

    seconds, message = timed(call)
    return {"rows": n, "levels": int(df["g"].nunique()), "seconds_to_refuse": seconds, "message": message}


def factor_fits(sizes):
    rows = []
    for n, k in sizes:
        df = factor_data(n, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fixed, _ = timed(lambda: vbsvm.svm("y ~ x + C(g)", df))
            random, _ = timed(lambda: vbsvm.svm("y ~ x + (1 | g)", df))
        rows.append({"rows": n, "levels": k, "C(g) seconds": fixed, "(1 | g) seconds": random})
    return rows


def separability(cases):
    rows = []
    for n, d, seed in cases:
        df = vbsvm.datasets.simulate_luts(n=n, d=d, seed=seed)
        design = build_design("y ~ .", df)
        lp, separable = timed(design.linearly_separable)
        lp0, slopes = timed(lambda: design.linearly_separable(intercept=False)) if separable else (0.0, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_seconds, fit = timed(lambda: vbsvm.svm("y ~ .", df))
        rows.append({"n": n, "d": d, "seed": seed, "separable": separable, "slopes_separate": slopes,
                     "lp_seconds": lp, "lp_without_intercept_seconds": lp0, "default_fit_seconds": fit_seconds,
                     "fit_info_separable": fit.info.get("separable")})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only")
    args = parser.parse_args(argv)
    sizes = [(2000, 100), (2000, 200)] if args.quick else [(2000, 100), (2000, 200), (2000, 400), (4000, 400)]
    cases = [(500, 100, 0), (500, 10, 0)] if args.quick else [(500, 100, 0), (500, 100, 1), (500, 10, 0),
                                                              (5000, 100, 1)]
    out = {"max_factor_levels": MAX_FACTOR_LEVELS, "refuse": refuse_huge_factor(), "factor_fits": factor_fits(sizes),
           "separability": separability(cases)}
    print(f"C(g) with {out['refuse']['levels']} levels on {out['refuse']['rows']} rows: refused in "
          f"{out['refuse']['seconds_to_refuse']:.3f} s")
    print(pd.DataFrame(out["factor_fits"]).round(2).to_string(index=False))
    print(pd.DataFrame(out["separability"]).round(3).to_string(index=False))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
