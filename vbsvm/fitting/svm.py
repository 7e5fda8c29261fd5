"""Public entry points: :func:`svm` and :func:`load` (argument checking; the fit itself is
:func:`vbsvm.fitting.builders.fit_design`)."""

from __future__ import annotations

import time
import warnings

import numpy as np

from vbsvm.exceptions import DiagnosticWarning
from vbsvm.fitting.builders import check_re_prior, fit_design
from vbsvm.fitting.dask import svm_dask
from vbsvm.formula.design import build_design, numbers_as_text
from vbsvm.formula.habits import self_powers
from vbsvm.inference import interrupts
from vbsvm.inference.gibbs import bound_run
from vbsvm.inference.run_fingerprint import run_fingerprint
from vbsvm.inference.threads import limit_blas
from vbsvm.io.fit_file import check_loaded, read_fit_file, refusing
from vbsvm.models.linear_algebra import row_blocks
from vbsvm.results.fit import Fit
from vbsvm.results.gp import GPFit
from vbsvm.results.imputed import ImputedFit
from vbsvm.results.prediction import fit_probit_calibration
from vbsvm.results.selection import SelectionFit
from vbsvm.settings import ARGUMENT_RULES, FitSettings, validate
from vbsvm.sources.dask_frames import is_dask_frame

__all__ = ["svm", "load", "fit_settings"]


def svm(formula, data, *, method="vb", penalty="auto", prior=None, missing="drop", standardize=True,
        draws=1000, tune=None, chains=4, thin=1, seed=None, progress=True, n_jobs=1, max_draws=None,
        tol=1e-8, max_iter=1000, accelerate=True, sigma2_beta=1e8, A_u=0.01, B_u=0.01, level=0.95,
        sigma2_mu=1e8, Psi=0.01, nu=3.0, re_df=None, re_scale=None, checkpoint=None,
        imputation="conditional", persist="auto"):
    """Fit a linear Bayesian support vector machine from a formula.

    Parameters
    ----------
    formula : str
        R-style formula, e.g. ``"y ~ x1 + C(sex) + (1 | patient_id)"`` or ``"y ~ ."``.
    data : pandas.DataFrame or dask.dataframe.DataFrame
        The data (never modified). A Dask DataFrame (``pip install "vbsvm[dask]"``) is fitted
        out of core / on a cluster by ``method="vb"`` (fixed effects) or ``method="meanfield"``,
        each pass a map-reduce over its partitions, with the in-memory fit's result
        (:mod:`vbsvm.fitting.dask`); the other methods, ``prior``, ``missing="impute"`` and random
        effects with ``method="vb"`` are refused there with a message.
    method : {"vb", "meanfield", "gibbs", "map"}
        ``"vb"``: the calibrated fast approximation — expectation propagation on the hinge
        pseudo-likelihood integrated over a grid of the variance parameters
        (:mod:`vbsvm.inference.ep`), within 0.15 Gibbs sd of the exact posterior on the paper's
        data sets (``benchmarks/results/calibrated_vb.md``); with ``LaplaceZero`` the prior's
        spike-and-slab factors are EP sites too (:mod:`vbsvm.inference.ep_selection`); with
        ``missing="impute"`` the EP fits of completions drawn from the imputation q are pooled
        (:func:`vbsvm.inference.pooled.pooled_vb_cut`); the paper's joint imputation model
        (``imputation="joint"``), which it does not cover, falls back to the mean field, and
        ``fit.info["approximation"]`` says which was used. ``"meanfield"``: the paper's
        mean-field VB (Luts & Ormerod Algorithms 1-4) exactly; its sds are about half the exact
        ones. ``"gibbs"``: Gibbs sampling (Appendices A-C), the exact reference. ``"map"``: the
        posterior mode by EM (with a fixed penalty: the classical SVM).
    penalty : "auto", float or None
        ``"auto"``: ``sigma2_u ~ IG(A_u, B_u)`` on the non-intercept fixed effects, so the penalty
        ``alpha = 1/(4 sigma2_u)`` is inferred; a float fixes ``alpha`` (cost ``C = 1/(2 alpha)``);
        ``None``: vague ``N(0, sigma2_beta)`` prior on every fixed effect. On data that the fixed
        effects separate, ``None`` makes the coefficients as large as ``sigma2_beta`` allows and
        ``"auto"`` with ``A_u <= 1`` leaves them without finite posterior means (see
        :func:`warn_about_data`): ``svm`` checks by a linear program (up to ``n * p`` = 5e6;
        usually settled by a certificate of its answer, :mod:`vbsvm.formula.separation`),
        warns, and records ``fit.info["separable"]`` and a summary note.
    prior : None or vbsvm.LaplaceZero
        ``vbsvm.LaplaceZero(...)``: spike-and-slab Laplace selection of the fixed effects
        (:mod:`vbsvm.models.selection`); combines with random intercepts and random slopes, and
        with ``missing="impute"`` (conditional imputation; ``rho`` not ``"auto"``): Gibbs draws the
        imputations from their own posterior, then the selection sweep; VB pools Laplace-zero
        fits over completions drawn from the imputation q.
    missing : {"drop", "raise", "impute"}
        Rows with missing predictors: dropped (reported in the summary), an error, or imputed.
        ``"impute"`` combines with random intercepts and, with ``imputation="conditional"``, with
        random slopes ``(1 + x | g)`` on observed predictors (a slope on a predictor with missing
        values is refused).
    imputation : {"conditional", "joint"}
        Imputation model of ``missing="impute"`` (see :mod:`vbsvm.models.missing`).
        ``"conditional"`` (default): the incomplete predictors are modelled given the observed
        predictors and the label, ``d_i | y_i ~ N(m_{y_i}, Sigma)``, and the hinge does not feed
        back into the imputations (a cut model). ``"joint"``: the paper's model (Algorithm 4),
        whose unnormalized pseudo-likelihood pulls imputations toward the label's side and
        inflates the imputed columns' coefficients.
    standardize : bool
        Standardize the predictors internally: center them and divide by the sample sd with
        ``ddof=1``, as R's ``scale()`` (results are reported on the original scale). The penalty
        acts on that scale, so ``method="map"`` with a fixed ``penalty=alpha`` is
        ``sklearn.svm.SVC(kernel="linear", C=1/(2 alpha))`` fitted to columns scaled with
        ``ddof=1``, not to the output of ``StandardScaler`` (``ddof=0``); ``standardize=False``
        penalizes the columns as given.
    draws, tune, chains, thin : int
        Gibbs: kept draws per chain, discarded initial sweeps, chains, thinning. For VB fits
        ``chains x draws`` is the shape of the iid draws from q stored by ``to_arviz()``.
        ``tune=None`` (default): 1000 sweeps, or 2000 with ``prior=LaplaceZero(...)``, whose
        model jumps list the models that the chains visit during tuning
        (:mod:`vbsvm.mcmc.model_jumps`): on breast_cancer at 4 x 2000, 15 of 20 seeds reach
        max R-hat <= 1.05 over the indicators after 1000 tuning sweeps, 19 of 20 after 2000, and
        all of 20 held-out seeds (``benchmarks/results/spam_selection.json``). With
        ``missing="impute"`` it stays 1000: each tuning sweep then makes 20 of the Laplace-zero
        block's sweeps (:func:`default_tune`).
    max_draws : int, optional
        Gibbs: adaptive run length. After ``draws``, if the summary parameters (fixed effects and
        variance components, :meth:`~vbsvm.results.fit.Fit.summary_diagnostics`) miss max R-hat <=
        1.01 or min bulk ESS >= 400, every chain continues from exactly where it stopped (same
        state, same random stream, the kernel fixed after tuning: the draws are those of a
        longer run) for more draws, sized from the ESS shortfall, until the targets hold or the
        chains reach ``max_draws`` draws (after thinning); then a
        :class:`~vbsvm.exceptions.DiagnosticWarning` names the worst parameter and the draws it
        needs. Chains that would need more than twice ``max_draws`` (they have not mixed) are
        not extended: they warn at once. Default ``4 * draws``; ``max_draws=draws`` switches the extension off; runs with
        ``checkpoint`` are not extended. ``fit.info`` records ``draws_requested``, ``draws``
        (kept), ``max_draws`` and the ``extension_rounds``.
    seed : int or None
        Seed of every random number used (Gibbs chains, VB draws).
    progress : bool
        Progress bar for Gibbs.
    n_jobs : int
        Processes for Gibbs chains (results do not depend on it). Workers start by ``fork`` on
        Linux, so a script needs no ``if __name__ == "__main__":`` guard there (elsewhere it does,
        and a worker that dies says so). Starting the workers costs a fraction of a second, so it
        pays only for runs of several seconds per chain.
    tol, max_iter, accelerate
        VB convergence: relative ELBO change, sweeps, SQUAREM acceleration. MAP uses ``tol`` on
        the relative change of the log posterior.
    sigma2_beta, A_u, B_u : float
        Prior hyperparameters (paper defaults 1e8, 0.01, 0.01).
    level : float
        Interval level of ``coef`` and ``summary()``.
    sigma2_mu, Psi, nu
        Imputation-model hyperparameters (``missing="impute"``), on the standardized scale:
        ``mu ~ N(0, sigma2_mu I)``, ``Sigma ~ IW(Psi, nu)`` with ``Psi`` a number (times I) or a
        d x d matrix; paper defaults 1e8, 0.01 I, 3.
    checkpoint : str or path, optional
        Gibbs (linear model): each chain saves its position to ``<checkpoint>.chain<c>.npz`` at
        sweep boundaries (about once a minute); rerunning the same call resumes the chains and
        gives the draws of an uninterrupted run (see :func:`vbsvm.inference.gibbs.run_chains`).
        A sampler whose state a file cannot hold (Laplace-zero with ``missing="impute"``) is
        refused with an error before the first sweep. The files record the formula, the design
        columns, a SHA-256 of the design and response and the settings that change the chains: a
        file of another run is refused with an error naming what differs.
    re_df, re_scale : float and q x q array, optional
        Inverse-Wishart prior ``IW(re_df, re_scale)`` of the covariance of each random-effect
        term with q > 1 columns (``(1 + x | g)``); defaults ``q + 1`` (uniform marginal prior of
        each correlation) and ``2 B_u I`` (each variance's marginal prior ``IG(1, B_u)``). In the
        units of the term's columns, which enter unstandardized (as in lme4).
    persist : {"auto", True, False}
        Dask DataFrames only: keep each partition's design in the workers' memory between passes
        (True), spill it once to files that every pass memory-maps (False: memory flat in n, e.g.
        Parquet larger than the workers' memory; under Dask's ``temporary-directory``, removed at
        the end), or keep it in memory when it takes less than half of the workers' memory limit
        ("auto").

    Returns
    -------
    vbsvm.results.fit.Fit
    """
    start = time.perf_counter()
    settings = fit_settings(formula, method=method, penalty=penalty, missing=missing, standardize=standardize,
                            draws=draws, max_draws=max_draws, tune=tune, chains=chains, thin=thin, seed=seed,
                            tol=tol, max_iter=max_iter, accelerate=accelerate, sigma2_beta=sigma2_beta, A_u=A_u,
                            B_u=B_u, level=level, progress=progress, n_jobs=n_jobs, prior=prior,
                            sigma2_mu=sigma2_mu, Psi=Psi, nu=nu, re_df=re_df, re_scale=re_scale,
                            checkpoint=checkpoint, imputation=imputation)
    if _is_dask_frame(data):
        return whole_fit_time(svm_dask(formula, data, settings, prior=prior, persist=persist), start)
    design = build_design(formula, data, standardize=standardize, missing=missing)
    check_re_prior(design, settings, prior)
    found = warn_about_data(design, penalty=settings["penalty"], A_u=settings["A_u"],
                            separability=settings["penalty"] is None or prior is None)
    # checkpoints are bound to this formula, design, data and settings; after a Ctrl-C stopped a
    # Gibbs run, a second one does not lose its draws while the fit is built from them
    with interrupts.collecting(), bound_run(run_fingerprint(design, settings, prior)):
        fit = fit_design(design, settings, prior)
        fit.info.update(found)
        # the scale of kind="prob", fitted on the training rows (see fit_probit_calibration); scored by
        # blocks of rows so that the prediction's copies of the design stay small
        step = max(1024, 2 ** 18 // max(design.p, 1))
        mean, sd = (np.concatenate(parts) for parts in zip(*(fit.training_score(slice(s, s + step))
                                                             for s in range(0, design.n, step))))
        fit.info["prob_calibration"] = list(fit_probit_calibration(mean, sd, design.y))
    return whole_fit_time(fit, start)


def whole_fit_time(fit, start):
    """``fit`` with ``info["seconds"]`` the wall time since ``start`` (the whole call: design,
    checks, inference and calibration) and ``info["inference_seconds"]`` the engine's share."""
    fit.info["inference_seconds"] = float(fit.info.get("seconds", 0.0))
    fit.info["seconds"] = time.perf_counter() - start
    return fit


def _is_dask_frame(data) -> bool:

    return is_dask_frame(data)


def _names(cols, k=8):
    return f"{cols[:k]}" + (f" and {len(cols) - k} more" if len(cols) > k else "")


#: Largest shape A_u of the IG(A_u, B_u) prior on sigma2_u at which separable data leave the
#: coefficients without posterior means (see :func:`warn_about_data`): 1/2 when the slopes alone
#: separate the classes, 1 (as sigma2_beta grows) when the separation needs the intercept.
SEPARATION_SHAPE, SEPARATION_SHAPE_WITH_INTERCEPT = 0.5, 1.0


def warn_about_data(design, *, penalty=None, A_u=None, separability=True, max_lp_size=5_000_000) -> dict:
    """Issue :class:`DiagnosticWarning` for properties of the data the user should know about.

    * **numbers stored as text**: a text column most of whose values parse as numbers (one stray
      string, a thousands separator) becomes a factor with a level per distinct value;
    * **x^2 outside I()**: the term ``x`` crossed with itself, i.e. ``x`` (as in R), not its square;
    * **non-identified columns**: the fixed-effect design (complete rows) is rank deficient —
      duplicated or collinear columns, or fewer rows than columns; the likelihood cannot tell
      the named columns' effects apart and the prior decides how they are shared;
    * **separable data** (when ``separability``): some theta puts every point beyond the margin;
      the hinge pseudo-likelihood is then flat in that direction and the size of the coefficients
      is set by the prior. Checked (a linear program, skipped above ``max_lp_size = n * p``)
      where it decides whether the posterior has means: ``penalty=None`` (the vague prior sets
      the size) and ``penalty="auto"`` with ``A_u <= 1`` (see the derivation in the code);
    * a grouping factor with **a single level** (confounded with the intercept) or with **one
      row per level** (its intercepts can absorb every point).

    Returns
    -------
    dict
        What was found, for ``fit.info``: ``separable`` where it was checked (True/False; None when
        the LP was skipped for size or undecided) and, for separable data under ``penalty="auto"``,
        ``separable_without_intercept`` (whether the slopes alone separate).
    """
    found = {}
    _warn_numbers_as_text(design)
    for term in self_powers(design.formula):
        name = term.rsplit("^", 1)[0]
        warnings.warn(
            f"'{term}' in the formula is {name} crossed with itself, which is {name} (as in R), not its "
            f"square; write I({term}) for the square (or poly({name}, {term.rsplit('^', 1)[1]}) for "
            "orthogonal polynomials).", DiagnosticWarning, stacklevel=3)
    complete = ~design.missing_mask.any(axis=1)
    X = design.X if complete.all() else design.X[complete]
    names = list(design.column_names)
    n, p = X.shape
    if n and p:
        if n < p:
            warnings.warn(
                f"the fixed-effect design has fewer complete rows ({n}) than columns ({p}): the "
                "coefficients are not identified by the data (rank deficient) and the prior/penalty "
                "decides them; keep penalty='auto' (or a fixed penalty) rather than penalty=None.",
                DiagnosticWarning, stacklevel=3)
        else:
            # eigen-decomposition of the p x p Gram (cheaper than an SVD of X) of the columns
            # scaled to a largest absolute value of 1, so that the units of a column do not count:
            # eigenvalues below 1e-11 of the largest (condition number above ~3e5) mark dependent columns
            # (divided, not multiplied by 1/top: a subnormal top has no finite reciprocal)
            top = np.maximum(X.max(axis=0), -X.min(axis=0))
            top = np.where(top > 0, top, 1.0)
            gram = np.zeros((p, p))
            with limit_blas(float(n) * p * p):  # by blocks of rows: no scaled copy of X
                for rows in row_blocks(n, p):
                    block = X[rows] / top
                    gram += block.T @ block
                evals, evecs = np.linalg.eigh(gram)
            null = evecs[:, evals <= evals[-1] * 1e-11].T
            if null.size:
                cols = [names[j] for j in np.flatnonzero(np.abs(null).max(axis=0) > 1e-6)]
                warnings.warn(
                    f"design columns {_names(cols)} are linearly dependent (duplicated or collinear, "
                    f"rank {p - len(null)} < {p}): the data cannot tell their effects apart and the "
                    "prior decides how they are shared; remove the redundant column(s) from the formula.",
                    DiagnosticWarning, stacklevel=3)
        if separability and penalty is None:
            with limit_blas(float(n) * p * p):  # the certificates' least-squares fits
                found["separable"] = design.linearly_separable(max_lp_size)
            if found["separable"]:
                warnings.warn(
                    "the data are linearly separable by the fixed effects (every point can be put "
                    "beyond the margin): the hinge pseudo-likelihood is flat along the separating "
                    "direction, so the size of the coefficients is set by the prior (very large "
                    "with penalty=None); use penalty='auto' or a fixed penalty, and read the "
                    "intervals as prior-driven.", DiagnosticWarning, stacklevel=3)
        elif separability and penalty == "auto" and A_u is not None and A_u <= SEPARATION_SHAPE_WITH_INTERCEPT:
            with limit_blas(float(n) * p * p):
                found.update(_separation_under_inferred_penalty(design, A_u, max_lp_size))
    for g in design.groups:
        counts = np.bincount(g.codes, minlength=g.n_levels)
        if g.n_levels == 1:
            warnings.warn(
                f"grouping factor '{g.name}' has a single level: its random intercept is confounded "
                f"with the intercept and sigma2_{g.name} is determined by its prior; remove "
                f"(1 | {g.name}) from the formula.", DiagnosticWarning, stacklevel=3)
        elif np.all(counts == 1):
            warnings.warn(
                f"every level of grouping factor '{g.name}' has one row: its random intercepts can "
                f"put every point beyond the margin, so sigma2_{g.name} and the coefficients are "
                f"driven by the priors; remove (1 | {g.name}) or use a coarser grouping.",
                DiagnosticWarning, stacklevel=3)
    return found


def _separation_under_inferred_penalty(design, A_u, max_lp_size) -> dict:
    """Check separability for ``penalty="auto"`` and warn where the posterior means of the
    coefficients do not exist (at most two LPs of the size of the design).

    Why the thresholds on A_u. The penalized coefficients beta (p of them, standardized scale)
    have beta | s ~ N(0, s I), s = sigma2_u ~ IG(A, B); integrating s out, their prior density is
    proportional to (B + |beta|^2 / 2)^-(A + p/2), which falls like r^-(2A + p) along a ray of
    length r = |beta|. The hinge pseudo-likelihood exp(-2 sum_i max(0, 1 - y_i (b0 + x_i'beta)))
    is exactly 1 where every margin is >= 1.

    * If the slopes alone separate (y_i x_i'u > 0 for all i, for an open set of directions u),
      then at any fixed intercept b0 the likelihood is 1 on {r u : r > r0(u, b0)}, a cone of
      positive solid angle. In polar coordinates the posterior mass there is proportional to
      int r^(p-1) r^-(2A+p) dr = int r^(-2A-1) dr (finite: the posterior is proper for A > 0),
      and E|beta| gets int r^(-2A) dr, finite iff 2A > 1. So the posterior means of the
      coefficients do not exist iff A_u <= 1/2 (their sds iff A_u <= 1), whatever sigma2_beta.
    * If the separation needs the intercept (b0 = c r grows with r, c != 0), the ray's feasible
      intercepts form an interval of length proportional to r, so with a flat intercept prior the
      mass is int r^(-2A) dr (proper iff A > 1/2) and E|beta| is int r^(1-2A) dr (finite iff
      A > 1). The N(0, sigma2_beta) intercept prior cuts the ray at r ~ sigma_beta / |c|: the
      means are finite but grow without bound with sigma2_beta iff A_u <= 1.

    Gibbs on simulate_luts(500, 100) (slopes separate) with A_u = 0.01: median |beta| 1.3e4 and
    sigma2_u draws up to 2.6e9; with A_u = 2: median |beta| 82.
    """
    separable = design.linearly_separable(max_lp_size)
    found = {"separable": separable}
    if not separable:
        return found
    slopes = design.linearly_separable(max_lp_size, intercept=False) if design.has_intercept else True
    found["separable_without_intercept"] = slopes
    shape = f"IG(A_u={A_u:g}, B_u) prior on sigma2_u"
    if slopes and A_u <= SEPARATION_SHAPE:
        consequence = (f"so the coefficients' posterior has the heavy tail of the {shape}: their posterior means "
                       f"do not exist for A_u <= {SEPARATION_SHAPE:g} (nor their sds for A_u <= 1)")
        fix = f"A_u > {SEPARATION_SHAPE:g} (finite means; A_u > 1 for finite sds, e.g. A_u=2, B_u=1)"
    else:
        consequence = (f"and with the {shape} the coefficients' posterior means exist only through the intercept's "
                       f"N(0, sigma2_beta) prior: they grow without bound with sigma2_beta for A_u <= "
                       f"{SEPARATION_SHAPE_WITH_INTERCEPT:g}")
        fix = f"A_u > {SEPARATION_SHAPE_WITH_INTERCEPT:g} (e.g. A_u=2, B_u=1)"
    warnings.warn(
        "the data are linearly separable by the fixed effects (every point can be put beyond the margin): "
        f"the hinge pseudo-likelihood is flat along the separating directions, {consequence}. Gibbs draws then "
        "wander to very large values and the VB summaries describe the approximation, not such a posterior. "
        f"Fix the penalty (penalty=<float>, e.g. penalty=1.0) or give sigma2_u a lighter tail: {fix}.",
        DiagnosticWarning, stacklevel=4)
    return found


def _warn_numbers_as_text(design):
    """Warn about text predictor columns most of whose values parse as numbers."""

    for c, parsed, total, odd, levels in numbers_as_text(design):
        warnings.warn(
            f"column {c!r} looks numeric: {parsed} of {total} values parse as numbers"
            + (f", but {total - parsed} {'does' if total - parsed == 1 else 'do'} not (e.g. {odd})" if odd
               else ", but the column holds them as text")
            + f", so it enters as a categorical predictor with {levels} levels. If it is a number, "
            f"convert it first: data[{c!r}] = pd.to_numeric(data[{c!r}], errors='coerce') (the other "
            "values become missing), then refit.", DiagnosticWarning, stacklevel=4)


#: Gibbs tuning sweeps for ``tune=None``, and with a Laplace-zero prior (see :func:`default_tune`)
TUNE, LAPLACE_ZERO_TUNE = 1000, 2000


def default_tune(prior, missing) -> int:
    """Tuning sweeps of a Gibbs run with ``tune=None``: ``LAPLACE_ZERO_TUNE`` for a Laplace-zero
    prior, whose list of models to jump between is fitted from the tuning sweeps; ``TUNE``
    otherwise, and with ``missing="impute"``, whose sampler makes
    :data:`~vbsvm.models.missing.CUT_SVM_SWEEPS` sweeps of the Laplace-zero block per tuning
    sweep (each records one row; the jumps' list then comes from 20 times as many sweeps)."""
    return LAPLACE_ZERO_TUNE if prior is not None and missing != "impute" else TUNE


def fit_settings(formula, *, method="vb", penalty="auto", missing="drop", standardize=True, draws=1000, tune=None,
                 chains=4, thin=1, seed=None, progress=True, n_jobs=1, max_draws=None, tol=1e-8, max_iter=1000,
                 accelerate=True, sigma2_beta=1e8, A_u=0.01, B_u=0.01, level=0.95, sigma2_mu=1e8, Psi=0.01,
                 nu=3.0, re_df=None, re_scale=None, checkpoint=None, imputation="conditional",
                 prior=None) -> FitSettings:
    """The settings of a fit from the keyword arguments of :func:`svm` (same names, same defaults),
    checked by :data:`vbsvm.settings.FIT_CONSTRAINTS` and :data:`~vbsvm.settings.ARGUMENT_RULES`
    (errors name the argument and the fix).

    Resolved here: ``method="meanfield"`` is ``method="vb"`` with ``approximation="meanfield"``
    (``"vb"``: ``"calibrated"``); ``tune=None`` is :func:`default_tune`; ``draw_seed``, the seed
    of the iid draws a VB fit stores, is ``seed``, or drawn once when ``seed=None`` (so that the
    draws, and a saved file, are reproducible). ``prior`` only sets the default ``tune``: the
    builder of the Laplace-zero model records its description.

    Returns
    -------
    vbsvm.settings.FitSettings
    """
    approximation = {"vb": "calibrated", "meanfield": "meanfield"}.get(method) if isinstance(method, str) else None
    if seed is None:
        draw_seed = int(np.random.SeedSequence().generate_state(1)[0])
    else:
        draw_seed = seed
    settings = FitSettings(
        formula=formula, method="vb" if approximation else method, approximation=approximation, penalty=penalty,
        missing=missing, standardize=standardize, draws=draws, max_draws=max_draws,
        tune=default_tune(prior, missing) if tune is None else tune, chains=chains, thin=thin, seed=seed,
        draw_seed=draw_seed, tol=tol, max_iter=max_iter, sigma2_beta=sigma2_beta, A_u=A_u, B_u=B_u, level=level,
        accelerate=accelerate, progress=progress, n_jobs=n_jobs, sigma2_mu=sigma2_mu, nu=nu, imputation=imputation,
        Psi=Psi, re_df=re_df, checkpoint=checkpoint, re_scale=re_scale)
    validate({"draws": settings.draws, "max_draws": settings.max_draws}, ARGUMENT_RULES)
    return settings


def load(path):
    """Load a fit saved with ``fit.save(path)``.

    Loading never runs code from the file: it is read as bounded data (only a regular file, parsed
    in a child process with capped memory and a time limit, nothing read from other files, every
    array's shape and values checked, the checksum saved with it verified; see
    :func:`vbsvm.io.fit_file.read_fit_file`), the stored formula must pass
    :func:`vbsvm.formula.safety.check_formula` before formulaic parses it, and no file handle
    stays open, whatever the outcome.

    Parameters
    ----------
    path : str or pathlib.Path
        A file written by :meth:`vbsvm.results.fit.Fit.save` or :meth:`vbsvm.GPFit.save`.

    Returns
    -------
    vbsvm.results.fit.Fit or vbsvm.GPFit
        The fit, of the class that saved it.

    Raises
    ------
    vbsvm.exceptions.FitFileError
        If the file is missing, not a regular file, not netCDF, truncated or corrupted, not
        written by vbsvm, edited since it was saved, or holds anything a fit does not (extra
        groups, attributes of the wrong type, a formula outside the whitelist, inconsistent or
        non-finite arrays, data in other files); the message names the file and the fault.
    """

    kind, tree = read_fit_file(path)
    with refusing(path):
        if kind == "linear":
            fit = Fit.from_datatree(tree)
        elif kind == "selection":

            fit = SelectionFit.from_datatree(tree)
        elif kind == "imputed":

            fit = ImputedFit.from_datatree(tree)
        else:

            fit = GPFit.from_datatree(tree)
        check_loaded(fit)
    return fit
