"""Is ``predict(kind="prob")`` of the linear Bayesian SVM a calibrated class probability?

Protocol. For every Rätsch set (response ``y``, all other columns as predictors, ``y ~ .``) we draw
``--splits`` random 70/30 train/test splits (split ``k`` permutes the rows with
``numpy.random.default_rng([seed, k])``), fit on the training part and score the test part.

Methods (linear models only; every method sees the same splits):

* ``vb``        : ``vbsvm.svm("y ~ .", method="vb")`` (calibrated EP over the variance grid, the default);
* ``meanfield`` : ``vbsvm.svm(..., method="meanfield")`` (the paper's mean-field VB);
* ``gibbs``     : ``vbsvm.svm(..., method="gibbs", chains=2, draws=1000, tune=500)``; skipped on a set
                  whose first Gibbs fit takes more than ``--gibbs-max`` CPU seconds;
* ``logistic``  : scikit-learn ``LogisticRegression()`` (default C = 1) on standardized predictors;
* ``logistic_cv``: ``LogisticRegressionCV(Cs=10, cv=5, scoring="neg_log_loss")`` on standardized predictors;
* ``svc_platt`` : ``CalibratedClassifierCV(LinearSVC(), method="sigmoid", cv=5)`` on standardized
                  predictors (Platt scaling, fitted on held-out folds).

The vbsvm probabilities are ``predict(kind="prob")``, the probit predictive
``Phi(m / sqrt(1 + s^2))`` with m, s the posterior mean and sd of the test score. Two candidate
fixes are computed from the *same* score moments (m, s), as extra columns. Since this benchmark
was first run, ``kind="prob"`` itself carries the fitted scale of ``vb_scaled`` (``fit.info
["prob_calibration"]``), so the ``vb`` column and ``vb_scaled`` agree up to the optimizer:

* ``<method>_hinge``: the normalised-hinge predictive
  ``E[sigma_h(f)]``, ``sigma_h(f) = exp(-2(1-f)_+) / (exp(-2(1-f)_+) + exp(-2(1+f)_+))``,
  ``f ~ N(m, s^2)``, by Gauss-Hermite quadrature (``--gh-nodes`` nodes);
* ``vb_scaled``: the probit predictive with the score rescaled by one factor ``a`` learned on the
  *training* rows, ``Phi(a m / sqrt(1 + a^2 s^2))`` with ``a`` maximising the training log score
  (a one-parameter, in-sample "temperature"; no cross-validation);
* ``vb_platt``: the same with a shift as well, ``Phi((a m + b) / sqrt(1 + a^2 s^2))``, ``(a, b)``
  maximising the training log score (Platt scaling on the probit scale, in-sample).

Scores on the test part: Brier score ``mean((y01 - p)^2)``, log score (mean log predictive
probability of the true class, probabilities clipped to ``[1e-15, 1 - 1e-15]``), balanced error rate
of ``p >= 1/2`` and the wall / CPU seconds of the fit (one BLAS thread). Per set and method we
report the mean and sd over splits and, pooled over the splits' test predictions, the calibration
intercept and slope: the logistic regression of the outcome on ``logit(p)`` (slope 1 and intercept 0
when calibrated; slope > 1: the probabilities are under-confident, too close to 1/2; slope < 1:
over-confident).

Acceptance: ``|Brier(vb) - Brier(logistic)| <= 0.01`` on every set (split means).

Outputs: ``benchmarks/results/calibration.json`` (all numbers, per split), ``calibration.md`` (the
tables), ``calibration.npz`` (the pooled test predictions of the plotted methods, float32;
``--plot-only`` redraws the figure from it)
and ``vignettes/figures/calibration_reliability.png`` (reliability diagrams, 10 equal-frequency bins,
pooled over splits).

Run:  PYTHONPATH=. python benchmarks/calibration.py [--sets heart,german] [--splits 10] [--plot-only]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import optimize, special

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import vbsvm  # noqa: E402

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    from contextlib import nullcontext as threadpool_limits

SETS = ["banana", "breast_cancer", "diabetis", "flare_solar", "german", "heart", "image", "ringnorm",
        "splice", "thyroid", "titanic", "twonorm", "waveform"]
VBSVM_METHODS = ["vb", "meanfield", "gibbs"]
SKLEARN_METHODS = ["logistic", "logistic_cv", "svc_platt"]
#: columns of the main table, in order (the extra columns of the candidate fixes come after)
MAIN = ["vb", "meanfield", "gibbs", "logistic", "logistic_cv", "svc_platt"]
EXTRA = ["vb_hinge", "vb_scaled", "vb_platt", "meanfield_hinge", "gibbs_hinge"]
PLOT_SETS = ["heart", "german", "diabetis", "image", "ringnorm", "banana"]
PLOT_METHODS = {"vb": ("vbsvm vb (probit)", "C0", "o"), "vb_hinge": ("vbsvm vb, normalised hinge", "C3", "^"),
                "vb_scaled": ("vbsvm vb, probit with trained scale a", "C4", "v"),
                "logistic": ("logistic regression", "C2", "s"), "svc_platt": ("LinearSVC + Platt", "C1", "D")}
EPS = 1e-15


# ----------------------------------------------------------------------------------------- scores
def split_indices(n, n_splits, seed, train_fraction=0.7):
    """Random train/test splits.

    Parameters
    ----------
    n : int
        Number of rows.
    n_splits : int
        Number of splits.
    seed : int
        Split ``k`` permutes the rows with ``numpy.random.default_rng([seed, k])``.
    train_fraction : float
        Share of the rows in the training part (rounded).

    Returns
    -------
    list of (ndarray, ndarray)
        Training and test row positions of each split.
    """
    n_train = int(round(train_fraction * n))
    out = []
    for k in range(n_splits):
        perm = np.random.default_rng([seed, k]).permutation(n)
        out.append((np.sort(perm[:n_train]), np.sort(perm[n_train:])))
    return out


def prob_scores(y01, p):
    """Brier score, log score and balanced error rate of probabilities ``p`` of class 1.

    Parameters
    ----------
    y01 : ndarray of {0, 1}
        Outcomes.
    p : ndarray
        Predicted probabilities of outcome 1.

    Returns
    -------
    dict
        ``brier`` (mean squared error of p), ``log_score`` (mean log probability of the observed
        class, clipped at 1e-15) and ``ber`` (balanced error rate of the rule ``p >= 1/2``; the error
        rate of the one class present if the test part has only one).
    """
    pc = np.clip(p, EPS, 1 - EPS)
    pred = p >= 0.5
    rates = [np.mean(pred[y01 == c] != c) for c in (0, 1) if np.any(y01 == c)]
    return {"brier": float(np.mean((y01 - p) ** 2)),
            "log_score": float(np.mean(np.where(y01 == 1, np.log(pc), np.log1p(-pc)))),
            "ber": float(np.mean(rates))}


def calibration_line(p, y01):
    """Calibration intercept and slope: unpenalised logistic regression of ``y01`` on ``logit(p)``.

    Parameters
    ----------
    p : ndarray
        Predicted probabilities of outcome 1 (clipped to ``[1e-15, 1 - 1e-15]``).
    y01 : ndarray of {0, 1}
        Outcomes.

    Returns
    -------
    tuple of float
        ``(intercept, slope)``; NaNs when the outcomes have one class or the fit does not exist
        (separation).
    """
    if len(np.unique(y01)) < 2:
        return float("nan"), float("nan")
    z = special.logit(np.clip(p, EPS, 1 - EPS))

    def nll(b):
        eta = b[0] + b[1] * z
        return np.sum(np.logaddexp(0, eta) - y01 * eta)

    def grad(b):
        r = special.expit(b[0] + b[1] * z) - y01
        return np.array([r.sum(), r @ z])

    res = optimize.minimize(nll, np.array([0.0, 1.0]), jac=grad, method="BFGS")
    if not res.success and np.linalg.norm(res.jac) > 1e-3 * len(z):
        return float("nan"), float("nan")
    return float(res.x[0]), float(res.x[1])


# ---------------------------------------------------------------------- predictives from (m, s)
def probit_prob(mean, sd, scale=1.0, shift=0.0):
    """Probit predictive ``Phi((a m + b) / sqrt(1 + a^2 s^2))`` of the score ``a f + b``, ``f ~ N(m, s^2)``.

    Parameters
    ----------
    mean, sd : ndarray
        Posterior mean and sd of the score.
    scale, shift : float
        ``a`` and ``b``; ``a = 1, b = 0`` is vbsvm's ``predict(kind="prob")``.

    Returns
    -------
    ndarray
        ``E[Phi(a f + b)]``.
    """
    return special.ndtr((scale * mean + shift) / np.sqrt(1.0 + (scale * sd) ** 2))


def hinge_normalised_prob(mean, sd, n_nodes=64):
    """Normalised-hinge predictive ``E[sigma_h(f)]`` of a score ``f ~ N(m, s^2)`` by Gauss-Hermite.

    ``sigma_h(f) = exp(-2(1-f)_+) / (exp(-2(1-f)_+) + exp(-2(1+f)_+))``: the hinge pseudo-likelihood
    of ``y = +1`` normalised over ``y`` (``1 / (1 + exp(-4f))`` for ``|f| <= 1``).

    Parameters
    ----------
    mean, sd : ndarray
        Posterior mean and sd of the score.
    n_nodes : int
        Gauss-Hermite nodes.

    Returns
    -------
    ndarray
        The predictive probability of class +1.
    """
    x, w = np.polynomial.hermite.hermgauss(n_nodes)
    f = mean[:, None] + np.sqrt(2.0) * sd[:, None] * x[None, :]
    log_pos = -2.0 * np.maximum(0.0, 1.0 - f)
    log_neg = -2.0 * np.maximum(0.0, 1.0 + f)
    return special.expit(log_pos - log_neg) @ w / np.sqrt(np.pi)


def fit_probit_recalibration(mean, sd, y01, shift=False):
    """Scale ``a`` (and shift ``b``) of :func:`probit_prob` maximising the log score on ``(mean, sd, y01)``.

    Parameters
    ----------
    mean, sd : ndarray
        Posterior mean and sd of the training scores.
    y01 : ndarray of {0, 1}
        Training outcomes.
    shift : bool
        Also learn ``b`` (a Platt-type recalibration on the probit scale); otherwise ``b = 0``.

    Returns
    -------
    tuple of float
        ``(a, b)``; ``a`` is searched on the log scale.
    """
    sign = 2.0 * y01 - 1.0

    def nll(x):
        a, b = np.exp(x[0]), (x[1] if shift else 0.0)
        return -np.sum(special.log_ndtr(sign * (a * mean + b) / np.sqrt(1.0 + (a * sd) ** 2)))

    x0 = np.zeros(2 if shift else 1)
    res = optimize.minimize(nll, x0, method="Nelder-Mead", bounds=[(np.log(1e-3), np.log(1e3))] + (
        [(-10.0, 10.0)] if shift else []), options={"xatol": 1e-6, "fatol": 1e-9})
    return float(np.exp(res.x[0])), (float(res.x[1]) if shift else 0.0)


# ------------------------------------------------------------------------------------ the fits
def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def run_vbsvm(train, test, method, seed, gh_nodes):
    """Fit one vbsvm linear model and return its test probabilities (and the candidate fixes).

    Parameters
    ----------
    train, test : pandas.DataFrame
        Training and test rows (response ``y`` in {-1, +1}).
    method : {"vb", "meanfield", "gibbs"}
        vbsvm method; Gibbs runs 2 chains x 1000 draws after 500.
    seed : int
        Seed of the fit.
    gh_nodes : int
        Gauss-Hermite nodes of :func:`hinge_normalised_prob`.

    Returns
    -------
    dict
        ``probs`` (name -> test probabilities of y = +1), ``wall`` and ``cpu`` seconds of the fit,
        for ``vb`` the learned ``scale`` of ``vb_scaled`` and ``(a, b)`` of ``vb_platt``;
        ``warnings`` lists the distinct warnings raised while fitting (e.g. EP non-convergence).
    """
    kw = dict(chains=2, draws=1000, max_draws=1000, tune=500) if method == "gibbs" else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit, wall, cpu = _timed(lambda: vbsvm.svm("y ~ .", train, method=method, seed=seed,
                                                   progress=False, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = fit.predict(test, kind="prob").to_numpy()
        sc = fit.predict(test, kind="score")
    if str(fit.design.positive_level) != "1":
        raise RuntimeError(f"expected the positive class y = 1, got {fit.design.positive_level!r}")
    m, s = sc["mean"].to_numpy(), np.nan_to_num(sc["sd"].to_numpy())
    a_fit = fit.info.get("prob_calibration", (1.0, 0.0))[0]  # the package's scale, fitted on the training rows
    gap = np.max(np.abs(p - probit_prob(m, s, a_fit)))
    if gap > 1e-10:
        raise RuntimeError(f"predict(kind='prob') is not Phi(a m / sqrt(1 + a^2 s^2)) (max gap {gap:.2e})")
    out = {"probs": {method: p, f"{method}_hinge": hinge_normalised_prob(m, s, gh_nodes)},
           "wall": wall, "cpu": cpu,
           "warnings": sorted({f"{w.category.__name__}: {w.message}"[:200] for w in caught
                               if not issubclass(w.category, (DeprecationWarning, FutureWarning))})}
    if method == "vb":
        sc_tr = fit.predict(train, kind="score")
        m_tr, s_tr = sc_tr["mean"].to_numpy(), np.nan_to_num(sc_tr["sd"].to_numpy())
        y_tr = (train["y"].to_numpy() > 0).astype(float)
        a, _ = fit_probit_recalibration(m_tr, s_tr, y_tr)
        out["probs"]["vb_scaled"] = probit_prob(m, s, a)
        a2, b2 = fit_probit_recalibration(m_tr, s_tr, y_tr, shift=True)
        out["probs"]["vb_platt"] = probit_prob(m, s, a2, b2)
        out["scale"], out["platt"] = a, (a2, b2)
    return out


def run_sklearn(Xtr, ytr, Xte, method, seed):
    """Fit one scikit-learn reference on standardized predictors; test probabilities of y = +1.

    Parameters
    ----------
    Xtr, Xte : ndarray
        Training and test predictors (standardized inside the pipeline with the training moments).
    ytr : ndarray of {-1, +1}
        Training outcomes.
    method : {"logistic", "logistic_cv", "svc_platt"}
        See the module docstring.
    seed : int
        ``random_state`` of the estimators that use one.

    Returns
    -------
    dict
        ``probs`` (method -> test probabilities), ``wall`` and ``cpu`` seconds.
    """
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    est = {
        "logistic": lambda: LogisticRegression(max_iter=5000),
        "logistic_cv": lambda: LogisticRegressionCV(Cs=10, cv=5, scoring="neg_log_loss", max_iter=5000),
        "svc_platt": lambda: CalibratedClassifierCV(LinearSVC(random_state=seed, max_iter=20000),
                                                    method="sigmoid", cv=5),
    }[method]()
    pipe = make_pipeline(StandardScaler(), est)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, wall, cpu = _timed(lambda: pipe.fit(Xtr, ytr))
    p = pipe.predict_proba(Xte)[:, list(pipe.classes_).index(1)]
    return {"probs": {method: p}, "wall": wall, "cpu": cpu}


# --------------------------------------------------------------------------------- one data set
def summarize(rows):
    """Means and sds (ddof = 1) over splits of every numeric score in ``rows``."""
    out = {}
    for key in ("brier", "log_score", "ber", "wall", "cpu", "scale", "shift"):
        vals = np.array([r[key] for r in rows if key in r], dtype=float)
        if vals.size:
            out[key] = float(vals.mean())
            out[f"{key}_sd"] = float(vals.std(ddof=1)) if vals.size > 1 else float("nan")
    out["n_splits"] = len(rows)
    return out


def run_set(name, args):
    """All methods on all splits of one Rätsch set.

    Returns
    -------
    tuple
        ``(result, pooled)``: the JSON-ready result of the set and the pooled test predictions
        ``{"y": y01, method: p}`` (the splits concatenated in order; Gibbs over its splits only).
    """
    df = vbsvm.datasets.load(f"raetsch/{name}")
    X, y = df.drop(columns="y").to_numpy(float), df["y"].to_numpy()
    splits = split_indices(len(df), args.splits, args.seed)
    rows = {}        # method -> list of per-split dicts
    pooled = {}      # method -> list of test probability arrays
    pooled_y = {}    # method -> list of test outcome arrays
    res = {"n": int(len(df)), "d": int(X.shape[1]), "n_test": int(len(splits[0][1])), "methods": {}}
    methods = [m for m in args.methods.split(",")]
    for k, (tr, te) in enumerate(splits):
        train, test = df.iloc[tr], df.iloc[te]
        y01 = (y[te] > 0).astype(float)
        for method in methods:
            if method == "gibbs":
                if k >= args.gibbs_splits or res.get("gibbs_skipped"):
                    continue
            if method in VBSVM_METHODS:
                try:
                    out = run_vbsvm(train, test, method, args.seed + k, args.gh_nodes)
                except vbsvm.exceptions.NumericalError as exc:  # e.g. EP converging nowhere: say so, go on
                    res.setdefault("failed_fits", []).append(f"{method}, split {k}: {exc}"[:300])
                    print(f"  {name} {method} split {k}: failed ({str(exc)[:120]})", flush=True)
                    continue
            else:
                out = run_sklearn(X[tr], y[tr], X[te], method, args.seed + k)
            for key, p in out["probs"].items():
                row = {"split": k, **prob_scores(y01, p), "wall": out["wall"], "cpu": out["cpu"]}
                if out.get("warnings"):
                    row["warnings"] = out["warnings"]
                if key == "vb_scaled":
                    row["scale"] = out["scale"]
                if key == "vb_platt":
                    row["scale"], row["shift"] = out["platt"]
                rows.setdefault(key, []).append(row)
                pooled.setdefault(key, []).append(p)
                pooled_y.setdefault(key, []).append(y01)
            if method == "gibbs" and k == 0 and out["cpu"] > args.gibbs_max:
                res["gibbs_skipped"] = (f"first Gibbs fit took {out['cpu']:.1f} CPU s > {args.gibbs_max:g} s; "
                                        "kept that split only")
    for key, rs in rows.items():
        p, yy = np.concatenate(pooled[key]), np.concatenate(pooled_y[key])
        s = summarize(rs)
        s["calib_intercept"], s["calib_slope"] = calibration_line(p, yy)
        s["splits"] = rs
        res["methods"][key] = s
    vb, lr = res["methods"].get("vb"), res["methods"].get("logistic")
    if vb and lr:
        diff = vb["brier"] - lr["brier"]
        res["acceptance"] = {"brier_vb_minus_logistic": diff, "holds": bool(abs(diff) <= 0.01)}
    pool = {}
    for key in pooled:
        pool[key] = np.concatenate(pooled[key])
        pool[f"{key}__y"] = np.concatenate(pooled_y[key])
    return res, pool


# ----------------------------------------------------------------------------------- reporting
def fmt(s, key, digits=3):
    if s is None or key not in s:
        return "-"
    sd = s.get(f"{key}_sd", float("nan"))
    return f"{s[key]:.{digits}f}±{sd:.{digits}f}" if np.isfinite(sd) else f"{s[key]:.{digits}f}"


def tables(results):
    """Markdown tables of the results: Brier, log score, BER, calibration slope, CPU time, acceptance."""
    cols = MAIN + EXTRA
    lines = []

    def block(title, key, digits, columns):
        lines.append(f"\n### {title}\n")
        lines.append("| set | n | " + " | ".join(columns) + " |")
        lines.append("|---|---:|" + "---:|" * len(columns))
        for name, r in results.items():
            cells = []
            for c in columns:
                s = r["methods"].get(c)
                cells.append(fmt(s, key, digits) if key != "calib_slope" else
                             ("-" if s is None else f"{s['calib_intercept']:+.2f} / {s['calib_slope']:.2f}"))
            lines.append(f"| {name} | {r['n']} | " + " | ".join(cells) + " |")

    block("Brier score (mean ± sd over splits; lower is better)", "brier", 3, cols)
    block("Log score (mean log probability of the true class; higher is better)", "log_score", 3, cols)
    block("Balanced error rate of p >= 1/2", "ber", 3, MAIN)
    block("Calibration intercept / slope (pooled test predictions; 0 / 1 = calibrated, "
          "slope > 1 under-confident)", "calib_slope", 2, cols)
    block("Fit time, CPU seconds per split (1 BLAS thread)", "cpu", 3, MAIN)
    lines.append("\n### Acceptance: |Brier(vb) - Brier(logistic)| <= 0.01\n")
    lines.append("| set | Brier vb | Brier logistic | difference | holds | vb_scaled a | vb_platt a / b "
                 "| vb_platt - logistic |")
    lines.append("|---|---:|---:|---:|:---:|---:|---:|---:|")
    for name, r in results.items():
        a = r.get("acceptance")
        if not a:
            continue
        sc = r["methods"].get("vb_scaled", {})
        pl = r["methods"].get("vb_platt", {})
        pl_diff = f"{pl['brier'] - r['methods']['logistic']['brier']:+.4f}" if pl else "-"
        lines.append(f"| {name} | {r['methods']['vb']['brier']:.4f} | {r['methods']['logistic']['brier']:.4f} | "
                     f"{a['brier_vb_minus_logistic']:+.4f} | {'yes' if a['holds'] else '**no**'} | "
                     f"{fmt(sc, 'scale', 2)} | {fmt(pl, 'scale', 2)} / {fmt(pl, 'shift', 2)} | {pl_diff} |")
    return "\n".join(lines)


def reliability(p, y01, n_bins=10):
    """Equal-frequency reliability bins: mean predicted probability, observed frequency, its SE."""
    order = np.argsort(p, kind="stable")
    bins = np.array_split(order, n_bins)
    mp = np.array([p[b].mean() for b in bins])
    fy = np.array([y01[b].mean() for b in bins])
    se = np.sqrt(np.maximum(fy * (1 - fy), 1e-12) / np.array([len(b) for b in bins]))
    return mp, fy, se


def plot_reliability(pool, path, sets, n_splits):
    """Reliability diagrams (10 equal-frequency bins, pooled over ``n_splits`` splits) of a few sets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [s for s in sets if s in pool]
    ncol = 3
    nrow = int(np.ceil(len(sets) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 4.0 * nrow), squeeze=False)
    for ax, name in zip(axes.ravel(), sets):
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
        for key, (label, color, marker) in PLOT_METHODS.items():
            if key not in pool[name]:
                continue
            mp, fy, se = reliability(pool[name][key], pool[name][f"{key}__y"])
            ax.errorbar(mp, fy, yerr=se, color=color, marker=marker, ms=4, lw=1.2, capsize=2, label=label)
        ax.set_title(name)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mean predicted P(y = +1)")
        ax.set_ylabel("observed frequency of y = +1")
        ax.set_aspect("equal")
    for ax in axes.ravel()[len(sets):]:
        ax.axis("off")
    axes[0, 0].legend(loc="upper left", fontsize=8, frameon=False)
    fig.suptitle(f"Reliability, 10 equal-frequency bins, test predictions pooled over {n_splits} random 70/30 splits "
                 "(bars: binomial SE)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def save_pool(pool, path):
    """Save the pooled test predictions of the methods in the figure (float32; outcomes int8)."""
    keep = set(PLOT_METHODS) | {f"{k}__y" for k in PLOT_METHODS}
    np.savez_compressed(path, **{f"{name}/{key}": v.astype(np.int8 if key.endswith("__y") else np.float32)
                                 for name, d in pool.items() for key, v in d.items() if key in keep})


def load_pool(path):
    """Read what :func:`save_pool` wrote: ``{set: {method: p, method__y: y01}}`` as float arrays."""
    pool = {}
    with np.load(path) as z:
        for k in z.files:
            name, key = k.split("/", 1)
            pool.setdefault(name, {})[key] = z[k].astype(float)
    return pool


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--methods", default=",".join(VBSVM_METHODS + SKLEARN_METHODS))
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--gibbs-splits", type=int, default=10, help="Gibbs on the first this many splits only")
    ap.add_argument("--gibbs-max", type=float, default=30.0,
                    help="skip Gibbs on a set whose first fit takes more CPU seconds than this")
    ap.add_argument("--gh-nodes", type=int, default=64)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=str(HERE / "results" / "calibration.json"))
    ap.add_argument("--figure", default=str(ROOT / "vignettes" / "figures" / "calibration_reliability.png"))
    ap.add_argument("--plot-sets", default=",".join(PLOT_SETS))
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the saved predictions")
    a = ap.parse_args(argv)
    out_json = Path(a.out)
    out_md, out_npz = out_json.with_suffix(".md"), out_json.with_suffix(".npz")
    if a.plot_only:
        saved = json.load(open(out_json))["results"]
        n_splits = max(r["methods"]["vb"]["n_splits"] for r in saved.values())
        plot_reliability(load_pool(out_npz), Path(a.figure), a.plot_sets.split(","), n_splits)
        return None
    results, pool = {}, {}
    t_start = time.perf_counter()
    with threadpool_limits(1):
        for name in a.sets.split(","):
            t0 = time.perf_counter()
            results[name], pool[name] = run_set(name, a)
            r = results[name]["methods"]
            acc = results[name].get("acceptance", {})
            print(f"{name:14s} " + "  ".join(f"{m} {r[m]['brier']:.3f}" for m in MAIN + EXTRA if m in r)
                  + (f"  |vb-lr| {abs(acc['brier_vb_minus_logistic']):.4f} {'ok' if acc['holds'] else 'FAIL'}"
                     if acc else "") + f"  ({time.perf_counter() - t0:.0f}s)", flush=True)
    meta = {"protocol": f"{a.splits} random 70/30 splits (rng [seed, k]), seed {a.seed}; formula y ~ .; "
                        "sklearn references on standardized predictors; 1 BLAS thread",
            "gibbs": f"2 chains x 1000 draws after 500, first {a.gibbs_splits} splits, skipped above "
                     f"{a.gibbs_max:g} CPU s",
            "splits": a.splits, "gh_nodes": a.gh_nodes, "seed": a.seed, "total_wall_s": time.perf_counter() - t_start,
            "python": platform.python_version(), "vbsvm": vbsvm.__version__}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    json.dump({"meta": meta, "results": results}, open(out_json, "w"), indent=1)
    md = tables(results)
    skipped = [f"{n}: {r['gibbs_skipped']}" for n, r in results.items() if r.get("gibbs_skipped")]
    header = (f"# Calibration of predict(kind='prob') on the Rätsch sets\n\n{meta['protocol']}. "
              f"Gibbs: {meta['gibbs']}." + (" Gibbs skipped: " + "; ".join(skipped) + "." if skipped else "")
              + "\n\nGenerated by `benchmarks/calibration.py`; figure "
              "`vignettes/figures/calibration_reliability.png`.\n")
    warned = [f"{n} split {row['split']} {m}: {'; '.join(row['warnings'])}"
              for n, r in results.items() for m in VBSVM_METHODS if m in r["methods"]
              for row in r["methods"][m]["splits"] if row.get("warnings")]
    notes = "\n\n### Warnings raised by the vbsvm fits\n\n" + (
        "\n".join(f"* {w}" for w in warned) if warned else "none")
    out_md.write_text(header + md + notes + "\n")
    save_pool(pool, out_npz)
    plot_reliability(pool, Path(a.figure), a.plot_sets.split(","), a.splits)
    print(md)
    return results


if __name__ == "__main__":
    main()
