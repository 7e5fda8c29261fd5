"""Fingerprints (SHA-256 prefixes) of sampler draws and of small Gibbs fits under fixed seeds, to
check that a change keeps the numbers bit for bit.

Covers every sampler of :mod:`vbsvm.distributions` on parameters where the floating point
formulas are exact (inverse gamma with shapes 0.1 to 1e3, truncated inverse gamma, GIG, inverse
Gaussian, GIG(1/2) hot path, inverse Wishart, truncated normal, Gaussian, Bernoulli) and six Gibbs
fits (linear with penalty "auto" and fixed, random intercept, Laplace-zero with rho 0.2 and "auto",
imputation). Run it in two checkouts and compare the JSON files.

Writes ``benchmarks/results/sampler_fingerprints.json`` (or the path given) and prints the count.

Run:  PYTHONPATH=. python benchmarks/sampler_fingerprints.py [out.json]
"""
import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

import vbsvm
from vbsvm import distributions as D
from vbsvm.datasets import simulate_sparse, simulate_grouped, simulate_mcar

def h(a):
    return hashlib.sha256(np.ascontiguousarray(np.asarray(a, dtype=float)).tobytes()).hexdigest()[:16]

out = {}
rng = lambda s=0: np.random.default_rng(s)
shapes = [0.1, 0.3, 0.51, 1.0, 2.5, 40.0, 1e3]
scales = [1e-5, 0.01, 1.0, 7.0, 1e5]
for a in shapes:
    for b in scales:
        ig = D.InverseGamma(np.full(5, a), np.full(5, b))
        out[f"ig_none_{a}_{b}"] = h(ig.sample(rng(1)))
        out[f"ig_size_{a}_{b}"] = h(ig.sample(rng(2), size=(300,)))
        out[f"igscalar_{a}_{b}"] = h(D.InverseGamma(a, b).sample(rng(3), size=1000))
        out[f"igtrunc_{a}_{b}"] = h(D.sample_inverse_gamma_truncated(np.full(7, a), np.full(7, b), (1e-10, 1e10), rng(4)))
        out[f"igtrunc_tight_{a}_{b}"] = h(D.sample_inverse_gamma_truncated(np.full(7, a), np.full(7, b), (0.5 * b, 2 * b), rng(5)))
for g in [0.5, -0.5, 1.3, -2.0, 0.0]:
    for psi, chi in [(1.0, 1.0), (0.3, 4.0), (5.0, 1e-3)]:
        out[f"gig_{g}_{psi}_{chi}"] = h(D.GIG(g, psi, chi).sample(rng(6), size=500))
out["gig_mixed"] = h(D.GIG([0.5, -0.5, 1.5], [1, 2, 3], [1, 0.1, 4]).sample(rng(7), size=100))
for mu, lam in [(1, 1), (0.1, 5), (30, 0.2)]:
    out[f"invgauss_{mu}_{lam}"] = h(D.InverseGaussian(mu, lam).sample(rng(8), size=500))
out["gig_half"] = h(D.sample_gig_half(np.logspace(-300, 300, 601), rng(9)))
for df, d in [(3.0, 2), (2.5, 2), (10.0, 3), (4.2, 3)]:
    m = np.eye(d) + 0.3
    out[f"iw_{df}_{d}"] = h(D.InverseWishart(m, df).sample(rng(10), size=50))
    out[f"iw1_{df}_{d}"] = h(D.InverseWishart(m, df).sample(rng(10)))
out["tn"] = h(D.sample_truncated_normal(np.zeros(50), 1.0, np.linspace(-3, 30, 50), np.linspace(-2, 31, 50), rng(11)))
out["gauss"] = h(D.Gaussian(np.eye(3) * 2 + 0.1, np.ones(3)).sample(rng(12), 40))
out["bern"] = h(D.Bernoulli([0.1, 0.5, 0.9]).sample(rng(13), 40))

warnings.simplefilter("ignore")
fits = {}
sp = simulate_sparse(120, 6, 2, seed=3)
fits["linear"] = lambda: vbsvm.svm("y ~ .", sp, method="gibbs", seed=1, draws=150, tune=100, chains=2, progress=False)
fits["fixedpen"] = lambda: vbsvm.svm("y ~ .", sp, method="gibbs", penalty=0.5, seed=1, draws=150, tune=100, chains=2, progress=False)
gr = simulate_grouped(20, 5, seed=4)
fits["grouped"] = lambda: vbsvm.svm("y ~ time * treatment + (1 | group)", gr, method="gibbs", seed=2, draws=150, tune=100, chains=2, progress=False)
fits["laplace"] = lambda: vbsvm.svm("y ~ .", sp, method="gibbs", prior=vbsvm.LaplaceZero(rho=0.2), seed=1, draws=150, tune=100, chains=2, progress=False)
fits["laplace_auto"] = lambda: vbsvm.svm("y ~ .", sp, method="gibbs", prior=vbsvm.LaplaceZero(rho="auto"), seed=2, draws=150, tune=100, chains=2, progress=False)
mc = simulate_mcar(100, seed=5)[1]
fits["impute"] = lambda: vbsvm.svm("y ~ .", mc, method="gibbs", missing="impute", seed=1, draws=100, tune=100, chains=2, progress=False)
for name, f in fits.items():
    try:
        fit = f()
        theta, sig = fit._draws()
        out["fit_" + name] = h(theta) + "/" + h(sig)
    except Exception as e:
        out["fit_" + name] = "ERR " + type(e).__name__ + ": " + str(e)[:200]
path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "sampler_fingerprints.json"
path.write_text(json.dumps(out, indent=1))
print(len(out), "entries written to", path)
