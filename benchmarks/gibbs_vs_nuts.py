"""vbsvm's Gibbs sampler against NumPyro NUTS on the same pseudo-posterior.

Two tables.

**Gibbs vs NUTS** (``benchmarks/results/gibbs_vs_nuts.{json,md}``): minimum bulk ESS per second of
wall time over the summary parameters (fixed effects ``beta[...]`` and variance components
``sigma2_*``) for

* ``toenail``: ``y ~ time * terbinafine + (1 | patient_id)``, ``penalty=None``; NUTS with non-centred
  random intercepts (``toenail``) and with centred ones (``toenail_centred``): with non-centred
  intercepts 2 of 4 NUTS chains stay at ``sigma2_patient_id ~ 1e-3``, about 1000 nats of potential
  energy above the others (the JSON keeps each chain's variance mean), so that row measures a failure,
  and the centred row is the fair comparison;
* ``heart``, ``diabetis`` (Raetsch benchmarks), ``breast_cancer`` (scikit-learn's 569 x 30) and
  ``spam`` (``type ~ .``): ``penalty="auto"``;
* ``sim500x50``: the Section 4.2 simulation ``simulate_luts(500, 50, seed=1)``, ``penalty="auto"``.

The NUTS target is the *marginal* pseudo-posterior, with no data augmentation::

    log p(theta, sigma2 | y) = -2 sum_i max(0, 1 - y_i f_i) + log prior,   f = X beta + sum_g u_g[code_i]

on the standardized design the package builds (:func:`vbsvm.formula.design.build_design`), with the package's
priors: unpenalized columns (the intercept; every column with ``penalty=None``) ``N(0, sigma2_beta = 1e8)``;
with ``penalty="auto"`` the other columns ``N(0, sigma2_u)``, ``sigma2_u ~ IG(0.01, 0.01)``; each
``(1 | g)`` term ``u_l ~ N(0, sigma2_g)``, ``sigma2_g ~ IG(0.01, 0.01)``. As a careful NUTS user would
write it: penalized coefficients and (except ``toenail_centred``) random intercepts non-centred (``beta_j = sqrt(sigma2_u) z_j``,
``z_j ~ N(0, 1)``), variances sampled on the log scale with the log-Jacobian added (NumPyro's
default transform for a positive site), double precision (``jax_enable_x64``), NumPyro's default
NUTS (diagonal mass matrix adapted in warm-up, target acceptance 0.8, maximum tree depth 10),
chains run one after the other in one process (``chain_method="sequential"``), like vbsvm's chains
with ``n_jobs=1``.

vbsvm's Gibbs runs through the public API (``vbsvm.svm(..., method="gibbs", progress=False)``) and
its diagnostics come from ``fit.diagnostics()``. Both are compared on the **original predictor
scale**: the NUTS draws of the standardized coefficients are mapped with
``design.to_original()`` (as the package maps its own draws) and summarized with the same
``arviz_stats`` functions (rank-normalized R-hat, bulk ESS, MCSE of the mean). Wall time is the
whole call a user waits for: ``vbsvm.svm`` (design, checks, sampling, diagnostics) for Gibbs, and
``MCMC.run`` (tracing, JIT compilation, warm-up and sampling) for NUTS. The two samplers run back to
back in the same process; the load average is recorded with each row (the machine is shared).

As a correctness check every row also reports ``max |z|``, ``z = (mean_Gibbs - mean_NUTS) /
sqrt(MCSE_Gibbs^2 + MCSE_NUTS^2)`` over the summary parameters; the heart check is printed in full.

**Gibbs at its defaults** (``benchmarks/results/gibbs_defaults.{json,md}``): 4 x 1000 draws after 1000,
max R-hat, min bulk ESS, the worst parameter and wall seconds, on the reference problems:
toenail ``penalty=None``; breast_cancer ``penalty="auto"``; ``simulate_luts(500, 50)``
and ``(500, 100)``; ``simulate_luts(100000, 20)``; toenail ``(1 | patient_id)`` with
``prior=vbsvm.LaplaceZero(rho=0.1)``; and, beyond them, toenail with
``(1 + time | patient_id)``, alone and with ``LaplaceZero(rho=0.1)``.

Usage::

    python benchmarks/gibbs_vs_nuts.py                 # both tables, full settings
    python benchmarks/gibbs_vs_nuts.py --quick         # smoke run, *_quick.{json,md}
    python benchmarks/gibbs_vs_nuts.py --only spam --table nuts --nuts-draws spam=1000
    python benchmarks/gibbs_vs_nuts.py --table nuts --repeats 3   # each pair 3 times, interleaved
    python benchmarks/gibbs_vs_nuts.py --list

With ``--only`` the named rows replace their old rows in the existing result files, so one data set
can be rerun after a sampler change. NumPyro (with JAX) is a benchmark-only dependency (the
``benchmark`` extra); the package never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import vbsvm  # noqa: E402
from vbsvm.formula.design import build_design

RESULTS = HERE / "results"
TOENAIL = "y ~ time * terbinafine + (1 | patient_id)"


# --------------------------------------------------------------------------- problems


def _breast_cancer() -> pd.DataFrame:
    """scikit-learn's breast cancer data (569 x 30), columns renamed to identifiers, label ``y``."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    return frame.rename(columns={"target": "y"})


@dataclasses.dataclass(frozen=True)
class Problem:
    """One model on one data set.

    Attributes
    ----------
    name : str
        Row name in the tables and for ``--only``.
    formula : str
    load : callable
        Returns the data frame.
    penalty : "auto", float or None
        As in :func:`vbsvm.svm` (a float: Gibbs only; the NUTS model has no fixed penalty).
    prior : callable or None
        Returns the ``prior=`` argument of :func:`vbsvm.svm` (Gibbs only; no NUTS counterpart).
    nuts_centred : bool
        NUTS with centred random intercepts (default non-centred; see :func:`nuts_model`).
    """

    name: str
    formula: str
    load: Callable[[], pd.DataFrame]
    penalty: object = "auto"
    prior: Callable | None = None
    nuts_centred: bool = False


def _sim(n, d, seed=1):
    return Problem(f"sim{n}x{d}", "y ~ .", lambda: vbsvm.datasets.simulate_luts(n, d, seed=seed))


TOENAIL_NONE = Problem("toenail", TOENAIL, lambda: vbsvm.datasets.load("toenail"), penalty=None)
BREAST_CANCER = Problem("breast_cancer", "y ~ .", _breast_cancer)

#: Rows of the Gibbs-vs-NUTS table.
NUTS_PROBLEMS = [
    TOENAIL_NONE,
    # non-centred random intercepts leave 2 of 4 NUTS chains at sigma2 ~ 1e-3, about 1000 nats
    # below the others; the centred model (informative groups: 6.5 visits per patient) mixes
    Problem("toenail_centred", TOENAIL, lambda: vbsvm.datasets.load("toenail"), penalty=None, nuts_centred=True),
    Problem("heart", "y ~ .", lambda: vbsvm.datasets.load("raetsch/heart")),
    Problem("diabetis", "y ~ .", lambda: vbsvm.datasets.load("raetsch/diabetis")),
    BREAST_CANCER,
    Problem("spam", "type ~ .", lambda: vbsvm.datasets.load("spam")),
    _sim(500, 50),
]

#: Rows of the Gibbs-at-defaults table (the reference problems and harder variants).
DEFAULT_PROBLEMS = [
    TOENAIL_NONE,
    BREAST_CANCER,
    _sim(500, 50),
    _sim(500, 100),
    # the same data with a fixed penalty (alpha = 1, C = 0.5): they are separable, so under
    # IG(0.01, 0.01) the penalty's posterior keeps the prior's tail (sigma2_u draws ~1e3 against 0.6
    # with d = 50) and the coefficients' means do not exist; with a fixed penalty the posterior is
    # log-concave (a measured option for the d = 100 row)
    dataclasses.replace(_sim(500, 100), name="sim500x100_penalty1", penalty=1.0),
    _sim(100_000, 20),
    Problem("toenail_laplace_zero", TOENAIL, lambda: vbsvm.datasets.load("toenail"),
            prior=lambda: vbsvm.LaplaceZero(rho=0.1)),
    # random slopes, the sampler's hardest linear model
    Problem("toenail_slopes", "y ~ time * terbinafine + (1 + time | patient_id)", lambda: vbsvm.datasets.load("toenail"),
            penalty=None),
    Problem("toenail_laplace_zero_slopes", "y ~ time * terbinafine + (1 + time | patient_id)",
            lambda: vbsvm.datasets.load("toenail"), prior=lambda: vbsvm.LaplaceZero(rho=0.1)),
]

QUICK_NUTS = ("heart", "toenail")
QUICK_DEFAULTS = ("toenail", "sim500x50")


# --------------------------------------------------------------------------- diagnostics


def is_summary_parameter(name: str) -> bool:
    """Fixed effects and variance components: the rows the acceptance criteria are about."""
    return name.startswith("beta[") or name.startswith("sigma2")


def flatten(ds: xr.Dataset, values: xr.Dataset | None = None) -> pd.Series:
    """One value per scalar parameter, named as ``Fit.diagnostics()`` names its rows.

    Parameters
    ----------
    ds : xarray.Dataset
        Posterior draws, dims ``(chain, draw[, one more])``; gives the names.
    values : xarray.Dataset, optional
        Per-parameter statistics with the variables of ``ds`` (default: the posterior means).
    """
    values = ds.mean(("chain", "draw")) if values is None else values
    names, flat = [], []
    for var in ds.data_vars:
        extra = [d for d in ds[var].dims if d not in ("chain", "draw")]
        labels = [ds[var][d].values for d in extra]  # e.g. levels x coefficients of a slope term
        names.extend(f"{var}[{','.join(map(str, k))}]" if extra else var for k in itertools.product(*labels))
        flat.extend(np.ravel(values[var].transpose(*extra).values).tolist())
    return pd.Series(flat, index=pd.Index(names, name="parameter"), dtype=float)


def diagnostics(ds: xr.Dataset) -> pd.DataFrame:
    """Mean, R-hat, bulk ESS and MCSE of the mean of every parameter, with :mod:`arviz_stats`
    (the functions ``Fit.diagnostics()`` uses)."""
    from arviz_stats import ess, mcse, rhat

    return pd.DataFrame({"mean": flatten(ds), "r_hat": flatten(ds, rhat(ds)),
                         "ess_bulk": flatten(ds, ess(ds, method="bulk")), "mcse_mean": flatten(ds, mcse(ds))})


def worst(table: pd.DataFrame, seconds: float) -> dict:
    """Max R-hat, min bulk ESS (and which parameter) and min-ESS per second over the summary rows."""
    rows = table.loc[[i for i in table.index if is_summary_parameter(i)]]
    return {"max_rhat": float(rows["r_hat"].max()), "max_rhat_parameter": str(rows["r_hat"].idxmax()),
            "min_ess_bulk": float(rows["ess_bulk"].min()), "min_ess_parameter": str(rows["ess_bulk"].idxmin()),
            "seconds": float(seconds), "min_ess_per_second": float(rows["ess_bulk"].min() / seconds)}


def load_average() -> float:
    """One-minute load average (the machine is shared; see ``uptime``)."""
    return float(os.getloadavg()[0])


# --------------------------------------------------------------------------- samplers


def run_gibbs(problem: Problem, df: pd.DataFrame, *, chains: int, draws: int, tune: int, seed: int,
              max_draws: int | None = None):
    """vbsvm Gibbs through the public API (``max_draws``: as :func:`vbsvm.svm`; None is its default,
    the adaptive run length up to ``4 * draws``).

    Returns
    -------
    fit : vbsvm.results.fit.Fit
    table : pandas.DataFrame
        ``fit.diagnostics()`` (r_hat, ess_bulk, mcse_mean) with the posterior means added.
    seconds : float
        Wall time of the ``vbsvm.svm`` call.
    """
    kwargs = {} if problem.prior is None else {"prior": problem.prior()}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # diagnostic and separability warnings: the table reports them
        fit = vbsvm.svm(problem.formula, df, method="gibbs", penalty=problem.penalty, chains=chains, draws=draws,
                        tune=tune, seed=seed, progress=False, max_draws=max_draws, **kwargs)
        table = fit.diagnostics()
    seconds = time.perf_counter() - start
    table["mean"] = flatten(fit.to_arviz()["posterior"].to_dataset()).reindex(table.index)
    return fit, table, seconds


def nuts_model(X, y, penalized, groups, *, penalty, centred=False, sigma2_beta=1e8, A_u=0.01, B_u=0.01):
    """NumPyro model of the marginal hinge pseudo-posterior on the standardized design.

    Parameters
    ----------
    X : jax.Array, shape (n, p)
        Standardized fixed-effect design.
    y : jax.Array, shape (n,)
        Labels in {-1, +1}.
    penalized : numpy.ndarray of bool, shape (p,)
        Columns under ``N(0, sigma2_u)`` when ``penalty="auto"``.
    groups : list of (str, jax.Array of int, int)
        Name, level code of each row and number of levels of each ``(1 | g)`` term.
    penalty : "auto" or None
    centred : bool
        Random intercepts centred (``u_l ~ N(0, sigma2_g)`` sampled directly) instead of
        non-centred (``u_l = sqrt(sigma2_g) z_l``). Penalized coefficients stay non-centred.
    sigma2_beta, A_u, B_u : float
        Prior hyperparameters (the package's defaults).

    Returns
    -------
    callable
        The NumPyro model (no arguments). Deterministic sites ``beta`` (standardized scale) and
        ``b_<g>``; sample sites ``sigma2_u`` / ``sigma2_<g>`` (log scale inside NUTS).
    """
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    p = X.shape[1]
    pen = np.flatnonzero(penalized) if penalty == "auto" else np.zeros(0, dtype=int)
    vague = np.setdiff1d(np.arange(p), pen)
    if penalty not in ("auto", None):
        raise ValueError(f"the NUTS model supports penalty='auto' or None, got {penalty!r}")

    def model():
        beta = jnp.zeros(p)
        if vague.size:
            b0 = numpyro.sample("beta_vague", dist.Normal(0.0, np.sqrt(sigma2_beta)).expand([vague.size]))
            beta = beta.at[vague].set(b0)
        if pen.size:
            s2 = numpyro.sample("sigma2_u", dist.InverseGamma(A_u, B_u))
            z = numpyro.sample("z_u", dist.Normal(0.0, 1.0).expand([pen.size]))
            beta = beta.at[pen].set(jnp.sqrt(s2) * z)
        numpyro.deterministic("beta", beta)
        f = X @ beta
        for name, codes, n_levels in groups:
            s2 = numpyro.sample(f"sigma2_{name}", dist.InverseGamma(A_u, B_u))
            if centred:
                b = numpyro.sample(f"b_{name}", dist.Normal(0.0, jnp.sqrt(s2)).expand([n_levels]))
            else:
                z = numpyro.sample(f"z_{name}", dist.Normal(0.0, 1.0).expand([n_levels]))
                b = numpyro.deterministic(f"b_{name}", jnp.sqrt(s2) * z)
            f = f + b[codes]
        numpyro.factor("hinge", -2.0 * jnp.sum(jnp.maximum(0.0, 1.0 - y * f)))

    return model


def run_nuts(problem: Problem, design, *, chains: int, draws: int, tune: int, seed: int, centred: bool = False):
    """NumPyro NUTS on the marginal pseudo-posterior; draws mapped to the original scale.

    Parameters
    ----------
    problem : Problem
    design : vbsvm.formula.design.Design
        ``build_design(problem.formula, data)``: the standardized design the package fits.
    chains, draws, tune, seed : int
    centred : bool
        Centred random intercepts (see :func:`nuts_model`).

    Returns
    -------
    table : pandas.DataFrame
        Mean, r_hat, ess_bulk, mcse_mean per parameter, named like ``Fit.diagnostics()``.
    seconds : float
        Wall time of ``MCMC.run`` (compilation, warm-up, sampling).
    extra : dict
        Divergences, mean leapfrog steps per draw, mean tree depth and the wall time of a
        throwaway 1 x (2 after 2) run made first (an estimate of the compilation time).
    """
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC, NUTS

    groups = [(g.name, jnp.asarray(g.codes), g.n_levels) for g in design.groups]
    model = nuts_model(jnp.asarray(design.X), jnp.asarray(design.y, dtype=float), design.penalized, groups,
                       penalty=problem.penalty, centred=centred)
    # a throwaway 1-chain run of 2 + 2 draws first: its wall time (mostly tracing and compilation)
    # is reported, so that the reader can judge how much of the timed run below is compilation
    start = time.perf_counter()
    MCMC(NUTS(model), num_warmup=2, num_samples=2, num_chains=1, progress_bar=False).run(jax.random.PRNGKey(seed + 1))
    compile_seconds = time.perf_counter() - start
    mcmc = MCMC(NUTS(model), num_warmup=tune, num_samples=draws, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), extra_fields=("diverging", "num_steps"))
    samples = jax.device_get(mcmc.get_samples(group_by_chain=True))
    seconds = time.perf_counter() - start
    extra_fields = jax.device_get(mcmc.get_extra_fields(group_by_chain=True))

    beta = np.asarray(samples["beta"]) @ design.to_original().T
    data = {"beta": (("chain", "draw", "coef"), beta)}
    coords = {"coef": list(design.column_names)}
    for g in design.groups:
        data[f"b_{g.name}"] = (("chain", "draw", g.name), np.asarray(samples[f"b_{g.name}"]))
        coords[g.name] = [str(v) for v in g.levels]
    for var in ["sigma2_u"] + [f"sigma2_{g.name}" for g in design.groups]:
        if var in samples:
            data[var] = (("chain", "draw"), np.asarray(samples[var]))
    ds = xr.Dataset(data, coords={"chain": np.arange(chains), "draw": np.arange(draws), **coords})
    steps = np.asarray(extra_fields["num_steps"])
    chain_means = {var: np.asarray(samples[var]).mean(axis=1).tolist() for var in data if var.startswith("sigma2")}
    extra = {"divergences": int(np.asarray(extra_fields["diverging"]).sum()), "compile_run_seconds": compile_seconds,
             "mean_leapfrog_steps": float(steps.mean()),
             "mean_tree_depth": float(np.log2(steps + 1).mean()), "variance_chain_means": chain_means}
    return diagnostics(ds), seconds, extra


def agreement(gibbs: pd.DataFrame, nuts: pd.DataFrame) -> pd.DataFrame:
    """Per summary parameter: both means, both MCSEs and ``z`` = difference over the joint MCSE."""
    rows = [i for i in gibbs.index if is_summary_parameter(i) and i in nuts.index]
    g, n = gibbs.loc[rows], nuts.loc[rows]
    return pd.DataFrame({"gibbs_mean": g["mean"], "nuts_mean": n["mean"], "gibbs_mcse": g["mcse_mean"],
                         "nuts_mcse": n["mcse_mean"],
                         "z": (g["mean"] - n["mean"]) / np.hypot(g["mcse_mean"], n["mcse_mean"])})


# --------------------------------------------------------------------------- tables


def compare_one(problem: Problem, *, chains, draws, tune, nuts_draws, nuts_tune, seed, repeats=1) -> dict:
    """Gibbs then NUTS on one problem, back to back, ``repeats`` times (seeds ``seed``,
    ``seed + 1``, ...: the two samplers interleaved, so that a change of the machine's load falls
    on both). The row reports the repeat with the median ratio and keeps every repeat's times,
    ESS and ratio under ``repeats``."""
    df = problem.load()
    design = build_design(problem.formula, df)
    runs = []
    for r in range(repeats):
        load_before = load_average()
        _, g_tab, g_sec = run_gibbs(problem, df, chains=chains, draws=draws, tune=tune, seed=seed + r,
                                    max_draws=draws)
        n_tab, n_sec, extra = run_nuts(problem, design, chains=chains, draws=nuts_draws, tune=nuts_tune,
                                        seed=seed + r, centred=problem.nuts_centred)
        gibbs, nuts = worst(g_tab, g_sec), worst(n_tab, n_sec)
        runs.append({"seed": seed + r, "gibbs": gibbs, "nuts": nuts, "extra": extra, "g_tab": g_tab, "n_tab": n_tab,
                     "ratio": gibbs["min_ess_per_second"] / nuts["min_ess_per_second"],
                     "load_average": [load_before, load_average()]})
    median = sorted(runs, key=lambda run: run["ratio"])[(len(runs) - 1) // 2]
    gibbs, nuts, extra, load_before = median["gibbs"], median["nuts"], median["extra"], median["load_average"][0]
    agree = agreement(median["g_tab"], median["n_tab"])
    return {
        "name": problem.name, "formula": problem.formula, "penalty": problem.penalty,
        "nuts_random_intercepts": ("centred" if problem.nuts_centred else "non-centred") if design.groups else None,
        "n": design.n, "p": design.p, "levels": {g.name: g.n_levels for g in design.groups},
        "gibbs": {**gibbs, "chains": chains, "draws": draws, "tune": tune},
        "nuts": {**nuts, **extra, "chains": chains, "draws": nuts_draws, "tune": nuts_tune},
        "ratio": median["ratio"], "seed": median["seed"],
        "repeats": [{"seed": run["seed"], "ratio": run["ratio"], "load_average": run["load_average"],
                     **{f"{k}_{v}": run[k][v] for k in ("gibbs", "nuts")
                        for v in ("seconds", "min_ess_bulk", "min_ess_per_second")}} for run in runs],
        "max_abs_z": float(agree["z"].abs().max()),
        "agreement": agree.reset_index().to_dict(orient="list"),
        "load_average": median["load_average"],
        "measured_at": _now(),
    }


def defaults_one(problem: Problem, *, chains, draws, tune, seed) -> dict:
    """vbsvm Gibbs at the given (default) settings on one problem."""
    df = problem.load()
    load_before = load_average()
    fit, tab, sec = run_gibbs(problem, df, chains=chains, draws=draws, tune=tune, seed=seed)
    summary = worst(tab, sec)
    return {"name": problem.name, "formula": problem.formula, "penalty": problem.penalty,
            "prior": None if problem.prior is None else repr(problem.prior()),
            "n": fit.design.n, "p": fit.design.p, **summary, "chains": chains, "draws": draws,
            "tune": fit.settings["tune"],
            "draws_kept": fit.info["draws"], "max_draws": fit.info["max_draws"],
            "extension_rounds": fit.info["extension_rounds"],
            "pass": summary["max_rhat"] <= 1.01 and summary["min_ess_bulk"] >= 400,
            "load_average": [load_before, load_average()], "measured_at": _now()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def markdown_nuts(rows: list, heading: str) -> str:
    out = [heading, "",
           "| data set | n x p | Gibbs s | Gibbs min ESS (param) | Gibbs ESS/s | NUTS draws | NUTS s | "
           "NUTS min ESS (param) | NUTS ESS/s | Gibbs/NUTS | over repeats | max R-hat G / N | NUTS div. | NUTS steps | "
           "max abs z | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, n = r["gibbs"], r["nuts"]
        out.append(
            f"| {r['name']} | {r['n']} x {r['p']}{''.join(f' + {k} ({v})' for k, v in r['levels'].items())} | "
            f"{g['seconds']:.1f} | {g['min_ess_bulk']:.0f} ({g['min_ess_parameter']}) | {g['min_ess_per_second']:.1f} | "
            f"{n['chains']} x {n['draws']} / {n['tune']} | {n['seconds']:.1f} | "
            f"{n['min_ess_bulk']:.0f} ({n['min_ess_parameter']}) | {n['min_ess_per_second']:.2f} | "
            f"**{r['ratio']:.1f}x** | {_over_repeats(r)} | {g['max_rhat']:.3f} / {n['max_rhat']:.3f} | {n['divergences']} | "
            f"{n['mean_leapfrog_steps']:.0f} | {r['max_abs_z']:.1f} | {r['load_average'][0]:.1f} |")
    return "\n".join(out)


def _over_repeats(row: dict) -> str:
    """``median (min-max), R runs`` of the ratio, or ``1 run``."""
    ratios = [run["ratio"] for run in row.get("repeats", [])]
    if len(ratios) < 2:
        return "1 run"
    return f"{np.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}), {len(ratios)} runs"


def markdown_agreement(row: dict) -> str:
    agree = pd.DataFrame(row["agreement"]).set_index("parameter")
    out = [f"Agreement on {row['name']} (z = (Gibbs mean - NUTS mean) / sqrt(MCSE_G^2 + MCSE_N^2), "
           "original scale):", "", "| parameter | Gibbs mean | NUTS mean | MCSE G | MCSE N | z |", "|---|---|---|---|---|---|"]
    for p, a in agree.iterrows():
        out.append(f"| {p} | {a['gibbs_mean']:.4g} | {a['nuts_mean']:.4g} | {a['gibbs_mcse']:.2g} | "
                   f"{a['nuts_mcse']:.2g} | {a['z']:+.2f} |")
    verdict = "within" if agree["z"].abs().max() <= 4 else "NOT within"
    out += ["", f"max |z| = {agree['z'].abs().max():.2f}: means {verdict} 4 MCSE."]
    return "\n".join(out)


def markdown_defaults(rows: list, heading: str) -> str:
    """The defaults table; rows measured before the adaptive run length (no ``draws_kept``) are
    marked as not rerun."""
    out = [heading, "", "| data set | model | n x p | draws kept per chain | max R-hat (param) | min bulk ESS (param) | "
           "wall s | R-hat <= 1.01 and ESS >= 400 | load | measured |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        model = r["formula"].replace("|", "\\|") + (f", penalty={r['penalty']}" if r["prior"] is None else f", prior={r['prior']}")
        if "draws_kept" in r:
            rounds = len(r.get("extension_rounds", []))
            kept = f"{r['draws_kept']}" + (f" ({rounds} extension round{'s' if rounds > 1 else ''})" if rounds else "")
            kept += f" after {r['tune']}" if r["tune"] != 1000 else ""
        else:
            kept = f"{r['draws']} (not rerun: measured before the adaptive run length)"
        out.append(f"| {r['name']} | `{model}` | {r['n']} x {r['p']} | {kept} | {r['max_rhat']:.4f} ({r['max_rhat_parameter']}) | "
                   f"{r['min_ess_bulk']:.0f} ({r['min_ess_parameter']}) | {r['seconds']:.1f} | "
                   f"{'yes' if r['pass'] else '**no**'} | {r['load_average'][0]:.1f} | {r['measured_at']} |")
    return "\n".join(out)


def nuts_report(rows: list, settings: dict) -> str:
    """Markdown of the Gibbs-vs-NUTS table, its notes and the heart agreement check."""
    text = markdown_nuts(rows, f"## vbsvm Gibbs vs NumPyro NUTS: min bulk ESS per second (Gibbs {settings['chains']} x "
                               f"{settings['draws']} after {settings['tune']}; NUTS as listed)")
    text += ("\n\nESS over fixed effects (original scale) and variance components; wall seconds include NUTS "
             "compilation (`compile_run_seconds` in the JSON: a 1 x (2 after 2) NUTS run made before). `NUTS steps`: "
             "mean leapfrog steps per draw. `max abs z`: largest |Gibbs mean - NUTS mean| / joint MCSE. `load`: "
             "1-minute load average on the 2-core machine when the row started. `over repeats`: with `--repeats R` "
             "each row runs Gibbs and NUTS back to back R times (seeds seed, seed + 1, ...), the row shows the repeat "
             "with the median ratio, and this column the median and range of the ratio.")
    for r in rows:
        for var, means in r["nuts"].get("variance_chain_means", {}).items():
            if max(means) > 10 * min(means):
                text += (f"\n\n{r['name']}: NUTS chains disagree on {var} (chain means "
                         f"{', '.join(f'{m:.3g}' for m in means)}); its NUTS row measures stuck chains.")
        ratios = [run["ratio"] for run in r.get("repeats", [])]
        if len(ratios) > 1 and max(ratios) > 10 * min(ratios):
            text += (f"\n\n{r['name']}: the repeats differ by more than 10x: " + "; ".join(
                f"seed {run['seed']}: {run['ratio']:.1f}x (NUTS min ESS {run['nuts_min_ess_bulk']:.0f} in "
                f"{run['nuts_seconds']:.1f} s, Gibbs {run['gibbs_min_ess_bulk']:.0f} in {run['gibbs_seconds']:.1f} s)"
                for run in r["repeats"]) + ".")
    heart = [r for r in rows if r["name"] == "heart"]
    if heart:
        text += "\n\n" + markdown_agreement(heart[0])
    return text


def defaults_report(rows: list, settings: dict) -> str:
    """Markdown of the Gibbs-at-defaults table and its notes."""
    text = markdown_defaults(rows, f"## vbsvm Gibbs at its defaults ({settings['chains']} x {settings['draws']} after "
                                   f"{settings['tune']}, extended up to max_draws = 4 x draws): fixed effects and "
                                   "variance components")
    return text + (
        "\n\nAt the defaults a Gibbs fit continues every chain from where it stopped (same state, same random stream) "
        "until the fixed effects and variance components reach max R-hat <= 1.01 and min bulk ESS >= 400, or "
        "max_draws = 4 x draws; `draws kept` is the resulting length, and the R-hat/ESS columns are those of the "
        "returned fit. A fit still short at max_draws warns with the worst parameter and the draws it needs. "
        "`wall s`: the whole `vbsvm.svm` call incl. the extension and its diagnostics; `load`: 1-minute load "
        "average on the shared 2-core machine when the row started. Rows measured 2026-11-26 ran with one BLAS "
        "thread (`OPENBLAS_NUM_THREADS=1`).")


def merge(path: Path, rows: list, order: list) -> list:
    """Rows of ``path`` (if any) with those of the same name replaced by ``rows``, in ``order``."""
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    by_name = {r["name"]: r for r in old}
    by_name.update({r["name"]: r for r in rows})
    return [by_name[n] for n in order if n in by_name]


def environment() -> dict:
    import importlib.metadata as md

    versions = {}
    for pkg in ("numpy", "scipy", "arviz-stats", "numpyro", "jax"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "cpu": _cpu_model(), "versions": versions,
            "vbsvm_commit": _git_commit(), "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")}


def _cpu_model():
    """The CPU's model name (Linux), so that rows measured on different machines can be told apart."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git_commit():
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write(stem: str, rows: list, settings: dict, md_text: str):
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"settings": settings, "environment": environment(), "rows": rows},
                                                     indent=1, default=float))
    (RESULTS / f"{stem}.md").write_text(md_text + "\n")
    print(f"wrote {RESULTS / stem}.json and .md", file=sys.stderr)


# --------------------------------------------------------------------------- main


def _parse_caps(items) -> dict:
    caps = {}
    for item in items or ():
        name, _, value = item.partition("=")
        draws, _, tune = value.partition(":")
        caps[name] = (int(draws), int(tune) if tune else None)
    return caps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 2 data sets per table, few draws, *_quick files")
    p.add_argument("--only", action="append", metavar="NAME", help="run only these rows (repeatable)")
    p.add_argument("--table", choices=("nuts", "defaults", "both"), default="both")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--draws", type=int, default=2000, help="draws per chain, Gibbs vs NUTS table (default 2000)")
    p.add_argument("--tune", type=int, default=1000, help="warm-up per chain, Gibbs vs NUTS table (default 1000)")
    p.add_argument("--nuts-draws", action="append", metavar="NAME=DRAWS[:TUNE]",
                   help="fewer NUTS draws for one data set (e.g. spam=1000:500); ESS per second is compared")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1,
                   help="Gibbs vs NUTS table: run each pair this many times, interleaved (seeds seed, seed + 1, ...)")
    p.add_argument("--list", action="store_true", help="list the row names and exit")
    p.add_argument("--report", action="store_true", help="rewrite the .md files from the JSON files and exit")
    args = p.parse_args(argv)
    if args.list:
        print("Gibbs vs NUTS:", ", ".join(q.name for q in NUTS_PROBLEMS))
        print("Gibbs defaults:", ", ".join(q.name for q in DEFAULT_PROBLEMS))
        return
    if args.report:
        suffix = "_quick" if args.quick else ""
        for stem, report in (("gibbs_vs_nuts", nuts_report), ("gibbs_defaults", defaults_report)):
            path = RESULTS / f"{stem}{suffix}.json"
            if path.exists():
                saved = json.loads(path.read_text())
                text = report(saved["rows"], saved["settings"])
                path.with_suffix(".md").write_text(text + "\n")
                print(text)
        return
    suffix = "_quick" if args.quick else ""
    draws, tune = (300, 300) if args.quick else (args.draws, args.tune)
    def_draws, def_tune = (300, 300) if args.quick else (1000, None)  # None: the package's default tuning
    caps = _parse_caps(args.nuts_draws)
    wanted = set(args.only) if args.only else None
    known = {q.name for q in NUTS_PROBLEMS + DEFAULT_PROBLEMS}
    if wanted and not wanted <= known:
        p.error(f"unknown --only {sorted(wanted - known)}; known: {sorted(known)}")

    def selected(problems, quick_names):
        keep = [q for q in problems if (wanted is None or q.name in wanted)]
        return [q for q in keep if q.name in quick_names] if args.quick else keep

    print(f"{_now()}; load average {os.getloadavg()}; {os.cpu_count()} CPUs", flush=True)
    if args.table in ("nuts", "both"):
        import numpyro

        numpyro.enable_x64()
        rows = []
        for q in selected(NUTS_PROBLEMS, QUICK_NUTS):
            nd, nt = caps.get(q.name, (draws, tune))
            print(f"[nuts] {q.name}: Gibbs {args.chains} x {draws} / {tune}, NUTS {args.chains} x {nd} / {nt or tune}",
                  file=sys.stderr, flush=True)
            row = compare_one(q, chains=args.chains, draws=draws, tune=tune, nuts_draws=nd,
                              nuts_tune=tune if nt is None else nt, seed=args.seed, repeats=args.repeats)
            print(f"  Gibbs {row['gibbs']['min_ess_per_second']:.1f} ESS/s, NUTS {row['nuts']['min_ess_per_second']:.2f} "
                  f"ESS/s, ratio {row['ratio']:.1f} ({_over_repeats(row)}), max |z| {row['max_abs_z']:.2f}",
                  file=sys.stderr, flush=True)
            rows.append(row)
        path = RESULTS / f"gibbs_vs_nuts{suffix}.json"
        rows = merge(path, rows, [q.name for q in NUTS_PROBLEMS])
        settings = {"chains": args.chains, "draws": draws, "tune": tune, "seed": args.seed,
                    "scale": "original predictor scale (NUTS draws mapped with design.to_original())",
                    "parameters": "beta[...] and sigma2_*", "nuts": "NumPyro NUTS defaults, x64, sequential chains",
                    "wall": "vbsvm.svm call (Gibbs); MCMC.run incl. compilation (NUTS)"}
        text = nuts_report(rows, settings)
        print(text)
        write(f"gibbs_vs_nuts{suffix}", rows, settings, text)
    if args.table in ("defaults", "both"):
        rows = []
        for q in selected(DEFAULT_PROBLEMS, QUICK_DEFAULTS):
            print(f"[defaults] {q.name}", file=sys.stderr, flush=True)
            rows.append(defaults_one(q, chains=args.chains, draws=def_draws, tune=def_tune, seed=args.seed))
        path = RESULTS / f"gibbs_defaults{suffix}.json"
        rows = merge(path, rows, [q.name for q in DEFAULT_PROBLEMS])
        settings = {"chains": args.chains, "draws": def_draws, "seed": args.seed,
                    "tune": def_tune or "the default (1000; 2000 with a Laplace-zero prior)"}
        text = defaults_report(rows, settings)
        print(text)
        write(f"gibbs_defaults{suffix}", rows, settings, text)


if __name__ == "__main__":
    main()
