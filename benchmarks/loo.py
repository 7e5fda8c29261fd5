"""Leave-one-out cross-validation of vbsvm fits on a probability scale (``fit.loo()``).

``fit.loo()`` weights each draw by ``1 / L(y_i | theta)`` of the pseudo-likelihood the posterior
used (PSIS-smoothed) and scores the class probability ``p(y_i | theta)`` that
``predict(kind="prob")`` averages over the posterior (the calibrated probit); see
:meth:`vbsvm.results.contract.FitResult.loo`. This benchmark measures two things.

**A. Real data (toenail).** ``y ~ time * terbinafine + (1 | patient_id)`` with ``penalty=None``
(1908 visits of 294 patients), fitted by Gibbs (``--chains`` x ``--draws``, ``--tune``), the
calibrated fast fit (``vb``) and mean-field VB. Per fit:

* ``loo``: ``fit.loo().elpd`` (and its se, p_loo, rows with Pareto k > 0.7, rows with k NaN or -inf);
* ``loo_hinge``: the same weights, the normalised hinge (Sollich 2002) as the predictive;
* ``az_loo_tree``: ``arviz.loo(fit.to_arviz())``, PSIS-LOO of the normalised hinge held in the
  ``log_likelihood`` group (weights from it too);
* ``in_sample``: the log score of ``predict(kind="prob")`` on the training rows.

References, on the same ``--folds`` random folds of the rows (seeded): the K-fold cross-validated log
score of each vbsvm method (refitted per fold, ``predict(kind="prob")`` on the held-out rows), of a
logistic regression ``y ~ time * terbinafine`` (statsmodels ``Logit``; also its in-sample
log-likelihood) and of a logistic random-intercept GLMM (statsmodels ``BinomialBayesMixedGLM``,
``fit_vb``; predictive ``expit(m / sqrt(1 + pi v / 8))`` with m, v the posterior mean and variance
of the linear predictor, a new patient at the prior). Acceptance: the Gibbs fit's ``loo`` within 5%
of the GLMM's cross-validated log score.

**B. Nested models (simulation, held-out split).** ``--reps`` data sets of ``--n-train`` training
and ``--n-test`` test rows, 18 standard normal predictors, ``P(y = 1) = Phi(1.5 x1 + 1.0 x2 + 0.7 x3)``.
Models ``y ~ x1`` within ``y ~ x1 + x2`` within ``y ~ x1 + x2 + x3`` within ``y ~ x1 + ... + x18``,
each fitted by ``vb`` and Gibbs. Per replicate and method: the models' ``loo`` elpd and their mean
held-out log score (``predict(kind="prob")`` on the test rows); the rank agreement (Kendall's tau
of the two orderings, and whether both pick the same best model).

**C. Exact leave-one-out by refitting.** ``--n-exact`` rows, ``y ~ x1 + x2`` with
``P(y = 1) = expit(1.5 x1 - x2)``: ``fit.loo()`` against refitting without each row in turn and
scoring ``predict(kind="prob")`` of the row left out (``vb``; Gibbs too with ``--exact-gibbs``), next
to the same PSIS with weights from the predictive instead of the pseudo-likelihood (``wrong_weights``),
no weights (``in_sample``) and ``arviz.loo(fit.to_arviz())``.

Outputs: ``benchmarks/results/loo.json`` (every number) and ``loo.md`` (the tables). ``--parts``
recomputes some parts only (the others are kept from the JSON file).

Run:  PYTHONPATH=. python benchmarks/loo.py [--quick] [--parts A,B,C] [--exact-gibbs]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import expit

import vbsvm
from vbsvm.results.contract import psis_log_weights

RESULTS = Path(__file__).resolve().parent / "results"
TOENAIL_FORMULA = "y ~ time * terbinafine + (1 | patient_id)"
N_PREDICTORS = 18
NESTED = ["y ~ x1", "y ~ x1 + x2", "y ~ x1 + x2 + x3", "y ~ " + " + ".join(f"x{j + 1}" for j in range(N_PREDICTORS))]
TRUTH = "Phi(1.5 x1 + 1.0 x2 + 0.7 x3)"


CACHE = {"dir": None}


def cached(key, args, compute):
    """``compute()``, kept as JSON under ``--cache`` (keyed by ``key`` and the arguments), so that an
    interrupted run resumes where it stopped."""
    settings = {k: v for k, v in vars(args).items() if k not in ("parts", "cache")}
    digest = hashlib.sha1(json.dumps([key, settings], sort_keys=True).encode()).hexdigest()[:16]
    path = Path(args.cache) / f"{digest}.json"
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return value


def log_score(p, y01):
    """Log probability of the observed class (0/1 labels) under P(y = 1) = p."""
    p = np.clip(np.asarray(p, dtype=float), 1e-15, 1 - 1e-15)
    return np.log(np.where(np.asarray(y01) == 1, p, 1 - p))


def fit_kwargs(method, args):
    if method == "gibbs":
        return dict(method="gibbs", chains=args.chains, draws=args.draws, tune=args.tune, progress=False)
    return dict(method=method)


def loo_row(fit, data, y01):
    """The LOO variants of one fit (see the module docstring)."""
    start = time.perf_counter()
    loo = fit.loo()
    seconds = time.perf_counter() - start
    k = loo.pareto_k.values
    log_pseudo, _ = fit.pointwise_log_terms()
    chains, draws, n = log_pseudo.shape
    log_w, _ = psis_log_weights(log_pseudo.reshape(chains * draws, n), fit.relative_efficiency())
    tree = fit.to_arviz()
    hinge = tree["log_likelihood"]["y"].values.reshape(chains * draws, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz

        az_tree = float(arviz.loo(tree).elpd)
    return {
        "loo": float(loo.elpd), "loo_se": float(loo.se), "p_loo": float(loo.p),
        "k_above_0.7": int(np.sum(k > 0.7)), "k_nan": int(np.sum(np.isnan(k))), "k_minus_inf": int(np.sum(np.isneginf(k))),
        "max_k": float(np.nanmax(k)) if np.isfinite(k).any() else float("nan"),
        "loo_hinge": float(np.logaddexp.reduce(log_w + hinge, axis=0).sum()),
        "az_loo_tree": az_tree,
        "in_sample": float(log_score(fit.predict(data, kind="prob"), y01).sum()),
        "loo_seconds": seconds,
    }


def glmm_prob(train, test):
    """Held-out P(y = 1) of a logistic random-intercept GLMM (statsmodels, variational Bayes)."""
    from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM

    model = BinomialBayesMixedGLM.from_formula("y ~ time * terbinafine", {"p": "0 + C(patient_id)"}, train)
    res = model.fit_vb()
    X = np.column_stack([np.ones(len(test)), test["time"], test["terbinafine"], test["time"] * test["terbinafine"]])
    levels = [int(name.split("[")[1].rstrip("]")) for name in model.vc_names]
    mean = pd.Series(res.vc_mean, index=levels)
    var = pd.Series(res.vc_sd ** 2, index=levels)
    prior_var = float(np.exp(2 * res.vcp_mean[0]))
    m = X @ res.fe_mean + test["patient_id"].map(mean).fillna(0.0).to_numpy()
    v = (X ** 2) @ res.fe_sd ** 2 + test["patient_id"].map(var).fillna(prior_var).to_numpy()
    return expit(m / np.sqrt(1.0 + np.pi * v / 8.0))


def part_a(args):
    import statsmodels.formula.api as smf

    toe = vbsvm.datasets.load("toenail")
    y01 = toe["y"].to_numpy()
    methods = ["gibbs", "vb", "meanfield"]
    rows, seconds = {}, {}
    def full_fit(method):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = vbsvm.svm(TOENAIL_FORMULA, toe, penalty=None, seed=1, **fit_kwargs(method, args))
        return {"seconds": time.perf_counter() - start, **loo_row(fit, toe, y01)}

    for method in methods:
        rows[method] = cached(["toenail", method], args, lambda: full_fit(method))
        seconds[method] = rows[method].pop("seconds")
        print(method, {k: round(v, 2) for k, v in rows[method].items()}, flush=True)
    folds = np.random.default_rng(args.seed).permutation(len(toe)) % args.folds

    def one_fold(k):
        train, test = toe[folds != k], toe[folds == k]
        out = {}
        for method in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = vbsvm.svm(TOENAIL_FORMULA, train, penalty=None, seed=1, **fit_kwargs(method, args))
            out[method] = log_score(fit.predict(test, kind="prob"), test["y"]).tolist()
        logit = smf.logit("y ~ time * terbinafine", train).fit(disp=0)
        out["logit"] = log_score(logit.predict(test), test["y"]).tolist()
        out["glmm"] = log_score(glmm_prob(train, test), test["y"]).tolist()
        return out

    cv = {m: np.zeros(len(toe)) for m in methods + ["logit", "glmm"]}
    for k in range(args.folds):
        scores = cached(["toenail-fold", k], args, lambda: one_fold(k))
        for m, v in scores.items():
            cv[m][folds == k] = v
        print(f"fold {k + 1}/{args.folds}", flush=True)
    logit_in_sample = float(smf.logit("y ~ time * terbinafine", toe).fit(disp=0).llf)
    cv_sum = {m: float(v.sum()) for m, v in cv.items()}
    gap = abs(rows["gibbs"]["loo"] - cv_sum["glmm"]) / abs(cv_sum["glmm"])
    return {"n": len(toe), "coin": float(len(toe) * np.log(0.5)), "fits": rows, "fit_seconds": seconds,
            "cv": cv_sum, "folds": args.folds, "logit_in_sample": logit_in_sample,
            "gibbs_loo_vs_glmm_cv_relative_gap": gap, "acceptance_within_5_percent": bool(gap <= 0.05)}


def simulate(rng, n):
    X = rng.standard_normal((n, N_PREDICTORS))
    p = stats.norm.cdf(1.5 * X[:, 0] + 1.0 * X[:, 1] + 0.7 * X[:, 2])
    df = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(N_PREDICTORS)])
    df.insert(0, "y", (rng.random(n) < p).astype(int))
    return df


def part_b(args):
    reps = [cached(["nested", r], args, lambda: one_replicate(args, r)) for r in range(args.reps)]
    summary = {m: {"mean_kendall_tau": float(np.mean([o[m]["kendall_tau"] for o in reps])),
                   "same_best": int(sum(o[m]["same_best"] for o in reps)),
                   "same_order": int(sum(o[m]["same_order"] for o in reps)), "reps": len(reps)}
               for m in ("vb", "gibbs")}
    return {"models": NESTED, "n_train": args.n_train, "n_test": args.n_test, "replicates": reps, "summary": summary}


def one_replicate(args, r):
    """Part B's numbers of replicate ``r``."""
    rng = np.random.default_rng([args.seed, r])
    train, test = simulate(rng, args.n_train), simulate(rng, args.n_test)
    out = {}
    for method in ("vb", "gibbs"):
        loo, held = [], []
        for formula in NESTED:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = vbsvm.svm(formula, train, seed=r, **fit_kwargs(method, args))
            loo.append(float(fit.loo().elpd))
            held.append(float(log_score(fit.predict(test, kind="prob"), test["y"]).mean()))
        tau = stats.kendalltau(loo, held).statistic
        out[method] = {"loo": loo, "held_out_mean": held, "loo_per_row": [v / args.n_train for v in loo],
                       "kendall_tau": float(tau), "same_best": bool(np.argmax(loo) == np.argmax(held)),
                       "same_order": bool(np.array_equal(np.argsort(loo), np.argsort(held)))}
    print(f"replicate {r + 1}/{args.reps}", {m: (round(v['kendall_tau'], 2), v['same_order']) for m, v in out.items()},
          flush=True)
    return out


def part_c(args):
    rng = np.random.default_rng([args.seed, 99])
    n = args.n_exact
    X = rng.standard_normal((n, 2))
    df = pd.DataFrame({"y": (rng.random(n) < expit(1.5 * X[:, 0] - X[:, 1])).astype(int), "x1": X[:, 0], "x2": X[:, 1]})
    out = {}
    for method in ["vb"] + (["gibbs"] if args.exact_gibbs else []):
        out[method] = cached(["exact", method], args, lambda: exact_one(args, df, method))
        print("exact", method, {k: round(v, 2) for k, v in out[method].items()}, flush=True)
    return {"n": n, "fits": out}


def exact_one(args, df, method):
    """Part C's numbers of one method: fit.loo() and the refits."""
    import arviz

    n = len(df)
    kw = dict(seed=1, **fit_kwargs(method, args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x1 + x2", df, **kw)
        exact = np.array([log_score(vbsvm.svm("y ~ x1 + x2", df.drop(index=df.index[i]), **kw)
                                    .predict(df.iloc[[i]], kind="prob"), df["y"].iloc[[i]])[0] for i in range(n)])
        az_tree = float(arviz.loo(fit.to_arviz()).elpd)
    loo = fit.loo()
    _, log_prob = fit.pointwise_log_terms()
    S = log_prob.shape[0] * log_prob.shape[1]
    flat = log_prob.reshape(S, n)
    log_w, _ = psis_log_weights(flat, fit.relative_efficiency())
    return {"loo": float(loo.elpd), "loo_se": float(loo.se), "exact": float(exact.sum()),
            "max_abs_pointwise": float(np.max(np.abs(loo.elpd_i.values - exact))),
            "wrong_weights": float(np.logaddexp.reduce(log_w + flat, axis=0).sum()),
            "in_sample": float((np.logaddexp.reduce(flat, axis=0) - np.log(S)).sum()),
            "az_loo_tree": az_tree, "max_k": float(np.nanmax(loo.pareto_k.values))}


def markdown(res) -> str:
    lines = ["# Leave-one-out cross-validation on a probability scale (`fit.loo()`)", "",
             f"`{res.get('command', 'PYTHONPATH=. python benchmarks/loo.py')}`; "
             f"{res['machine']}; " + ", ".join(f"{k} {v:.0f} s" for k, v in res["seconds"].items()) + "."]
    if "toenail" in res:
        a = res["toenail"]
        lines += ["", f"## A. toenail, `{TOENAIL_FORMULA}`, penalty=None (n = {a['n']}; a coin: {a['coin']:.1f})", "",
                  "| fit | loo (se) | p_loo | k > 0.7 | k NaN / -inf | loo, hinge predictive | az.loo(to_arviz()) | "
                  f"in-sample | {a['folds']}-fold CV |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, r in a["fits"].items():
            lines.append(f"| {m} | {r['loo']:.1f} ({r['loo_se']:.1f}) | {r['p_loo']:.1f} | {r['k_above_0.7']} | "
                         f"{r['k_nan']} / {r['k_minus_inf']} | {r['loo_hinge']:.1f} | {r['az_loo_tree']:.1f} | "
                         f"{r['in_sample']:.1f} | {a['cv'][m]:.1f} |")
        lines += ["", f"References ({a['folds']}-fold CV on the same folds): logistic random-intercept GLMM "
                  f"{a['cv']['glmm']:.1f}; logistic regression without patient effects {a['cv']['logit']:.1f} "
                  f"(in-sample log-likelihood {a['logit_in_sample']:.1f}).", "",
                  f"Acceptance: Gibbs `loo` {a['fits']['gibbs']['loo']:.1f} against the GLMM's CV {a['cv']['glmm']:.1f}: "
                  f"{100 * a['gibbs_loo_vs_glmm_cv_relative_gap']:.1f}% apart "
                  f"({'within' if a['acceptance_within_5_percent'] else 'NOT within'} 5%)."]
    if "nested" in res:
        b = res["nested"]
        lines += ["", f"## B. Nested models, {b['n_train']} training / {b['n_test']} test rows, "
                  f"{b['summary']['vb']['reps']} replicates", "",
                  "Models: " + ", ".join(f"`{m}`" for m in b["models"][:3])
                  + f", all {N_PREDICTORS} predictors (truth: {TRUTH}).", "",
                  "| method | mean Kendall tau (loo vs held-out) | same best model | same order |", "|---|---|---|---|"]
        for m, s_ in b["summary"].items():
            lines.append(f"| {m} | {s_['mean_kendall_tau']:.2f} | {s_['same_best']} / {s_['reps']} | "
                         f"{s_['same_order']} / {s_['reps']} |")
        lines += ["", "Per replicate: loo elpd per row and held-out mean log score of each model.", "",
                  "| rep | method | " + " | ".join(f"loo/n, held-out ({j + 1})" for j in range(len(b["models"]))) + " |",
                  "|---|---|" + "---|" * len(b["models"])]
        for r, rep in enumerate(b["replicates"]):
            for m, o in rep.items():
                cells = " | ".join(f"{lo:.4f}, {h:.4f}" for lo, h in zip(o["loo_per_row"], o["held_out_mean"]))
                lines.append(f"| {r + 1} | {m} | {cells} |")
    if "exact" in res:
        c = res["exact"]
        lines += ["", f"## C. Exact leave-one-out by refitting ({c['n']} rows, `y ~ x1 + x2`)", "",
                  "| fit | exact (refits) | loo (se) | max abs pointwise diff | max k | weights from the predictive | "
                  "no weights (in-sample) | az.loo(to_arviz()) |", "|---|---|---|---|---|---|---|---|"]
        for m, r in c["fits"].items():
            lines.append(f"| {m} | {r['exact']:.2f} | {r['loo']:.2f} ({r['loo_se']:.2f}) | {r['max_abs_pointwise']:.2f} | "
                         f"{r['max_k']:.2f} | {r['wrong_weights']:.2f} | {r['in_sample']:.2f} | {r['az_loo_tree']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer folds, replicates and draws")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--n-train", type=int, default=300)
    parser.add_argument("--n-test", type=int, default=5000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-exact", type=int, default=60)
    parser.add_argument("--exact-gibbs", action="store_true", help="part C also for Gibbs (one Gibbs fit per row)")
    parser.add_argument("--parts", default="A,B,C", help="parts to (re)compute; the others are read from the JSON")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "vbsvm_loo_cache"),
                        help="directory of finished pieces (fits, folds, replicates): a rerun resumes from them")
    args = parser.parse_args()
    if args.quick:
        args.folds, args.reps, args.draws, args.tune, args.n_exact = 5, 2, 400, 300, 30
    RESULTS.mkdir(exist_ok=True)
    name = "loo_quick" if args.quick else "loo"
    path = RESULTS / f"{name}.json"
    res = json.loads(path.read_text()) if path.exists() else {"seconds": {}}
    res["args"] = vars(args)
    res["machine"] = f"{platform.machine()}, Python {platform.python_version()}, vbsvm {vbsvm.__version__}"
    res["machine"] += f", {os.cpu_count()} CPUs shared with other jobs (load {os.getloadavg()[0]:.1f} at start)"
    res["command"] = "PYTHONPATH=. python benchmarks/loo.py " + " ".join(
        a for i, a in enumerate(sys.argv[1:]) if a != "--cache" and (i == 0 or sys.argv[i] != "--cache"))
    for part, key, run in (("A", "toenail", part_a), ("B", "nested", part_b), ("C", "exact", part_c)):
        if part in args.parts.split(","):
            start = time.perf_counter()
            res[key] = run(args)
            res["seconds"][key] = time.perf_counter() - start
            path.write_text(json.dumps(res, indent=1))  # each part is kept as soon as it is done
    text = markdown(res)
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
