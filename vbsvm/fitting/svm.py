"""Public entry points: :func:`svm` and :func:`load` (argument checking; the fit itself is
:func:`vbsvm.fitting.builders.fit_design`)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from vbsvm import validation
from vbsvm.exceptions import DiagnosticWarning, InputError
from vbsvm.fitting.builders import check_re_prior, fit_design
from vbsvm.fitting.dask import svm_dask
from vbsvm.formula.design import build_design
from vbsvm.inference.threads import limit_blas
from vbsvm.io.fit_file import check_loaded, read_fit_file, refusing
from vbsvm.models.linear_algebra import row_blocks
from vbsvm.results.fit import Fit, fit_probit_calibration
from vbsvm.results.gp import GPFit
from vbsvm.results.imputed import ImputedFit
from vbsvm.results.selection import SelectionFit
from vbsvm.sources.dask_frames import is_dask_frame

__all__ = ["svm", "load"]

METHODS = ("vb", "meanfield", "gibbs", "map")

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
        out of core / on a cluster by ``method="meanfield"``, each sweep a map-reduce over its
        partitions, with the in-memory fit's result (:mod:`vbsvm.fitting.dask`); the other methods,
        ``prior`` and ``missing="impute"`` are refused there with a message.
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
        ``None``: vague ``N(0, sigma2_beta)`` prior on every fixed effect.
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
        refused with an error before the first sweep.
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
    settings = _settings(formula, method=method, penalty=penalty, missing=missing, standardize=standardize,
                         draws=draws, max_draws=max_draws, tune=tune, chains=chains, thin=thin, seed=seed, tol=tol,
                         max_iter=max_iter, accelerate=accelerate, sigma2_beta=sigma2_beta, A_u=A_u,
                         B_u=B_u, level=level, progress=progress, n_jobs=n_jobs, prior=prior)
    if imputation not in ("conditional", "joint"):
        raise InputError(f"imputation must be 'conditional' (default: predictors given the observed ones and the "
                         f"label, cut from the SVM) or 'joint' (the paper's model); got {imputation!r}.")
    settings.update(sigma2_mu=sigma2_mu, nu=nu, imputation=imputation,
                    Psi=Psi if np.ndim(Psi) == 0 else np.asarray(Psi, dtype=float).tolist(),
                    re_df=None if re_df is None else validation.positive_float(re_df, "re_df"),
                    checkpoint=None if checkpoint is None else str(checkpoint),
                    re_scale=None if re_scale is None else np.asarray(re_scale, dtype=float).tolist())
    if _is_dask_frame(data):

        return svm_dask(formula, data, settings, prior=prior, persist=persist)
    design = build_design(formula, data, standardize=standardize, missing=missing)
    check_re_prior(design, settings, prior)
    warn_about_data(design, separability=settings["penalty"] is None)
    fit = fit_design(design, settings, prior)
    # the scale of kind="prob", fitted on the training rows (see fit_probit_calibration); scored by
    # blocks of rows so that the prediction's copies of the design stay small
    step = max(1024, 2 ** 18 // max(design.p, 1))
    score = pd.concat([fit.predict_score(design.raw.iloc[s:s + step], new_levels="zero")
                       for s in range(0, design.n, step)])
    fit.info["prob_calibration"] = list(fit_probit_calibration(score["mean"], score["sd"], design.y))
    return fit


def _is_dask_frame(data) -> bool:

    return is_dask_frame(data)


def _names(cols, k=8):
    return f"{cols[:k]}" + (f" and {len(cols) - k} more" if len(cols) > k else "")


def warn_about_data(design, *, separability=True, max_lp_size=5_000_000):
    """Issue :class:`DiagnosticWarning` for properties of the data the user should know about.

    * **non-identified columns**: the fixed-effect design (complete rows) is rank deficient —
      duplicated or collinear columns, or fewer rows than columns; the likelihood cannot tell
      the named columns' effects apart and the prior decides how they are shared;
    * **separable data** (when ``separability``; :func:`svm` asks for it with ``penalty=None``,
      where it matters and costs an LP, skipped above ``max_lp_size = n * p``): some theta puts
      every point beyond the margin; the hinge pseudo-likelihood is then flat in that direction
      and the size of the coefficients is set by the vague prior;
    * a grouping factor with **a single level** (confounded with the intercept) or with **one
      row per level** (its intercepts can absorb every point).
    """
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
        if separability and design.linearly_separable(max_lp_size):
            warnings.warn(
                "the data are linearly separable by the fixed effects (every point can be put "
                "beyond the margin): the hinge pseudo-likelihood is flat along the separating "
                "direction, so the size of the coefficients is set by the prior (very large "
                "with penalty=None); use penalty='auto' or a fixed penalty, and read the "
                "intervals as prior-driven.", DiagnosticWarning, stacklevel=3)
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


#: Gibbs tuning sweeps for ``tune=None``, and with a Laplace-zero prior (see :func:`default_tune`)
TUNE, LAPLACE_ZERO_TUNE = 1000, 2000


def default_tune(prior, missing) -> int:
    """Tuning sweeps of a Gibbs run with ``tune=None``: ``LAPLACE_ZERO_TUNE`` for a Laplace-zero
    prior, whose list of models to jump between is fitted from the tuning sweeps; ``TUNE``
    otherwise, and with ``missing="impute"``, whose sampler makes
    :data:`~vbsvm.models.missing.CUT_SVM_SWEEPS` sweeps of the Laplace-zero block per tuning
    sweep (each records one row; the jumps' list then comes from 20 times as many sweeps)."""
    return LAPLACE_ZERO_TUNE if prior is not None and missing != "impute" else TUNE


def _settings(formula, *, method, penalty, missing, standardize, draws, tune, chains, thin, seed, tol,
              max_iter, accelerate, sigma2_beta, A_u, B_u, level, progress, n_jobs, max_draws=None, prior=None):
    """Validate the keyword arguments of :func:`svm` (errors name the argument and the fix)."""
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}; got {method!r}.")
    approximation = {"vb": "calibrated", "meanfield": "meanfield"}.get(method)
    method = "vb" if approximation else method
    level = validation.level(level)
    draws = validation.integer(draws, "draws")
    if max_draws is not None and validation.integer(max_draws, "max_draws") < draws:
        raise InputError(f"max_draws must be at least draws = {draws} (max_draws=draws switches the extension "
                         f"of Gibbs runs off); got {max_draws}.")
    return {
        "formula": formula, "method": method, "approximation": approximation,
        "penalty": validation.penalty(penalty), "missing": missing,
        "standardize": bool(standardize), "draws": draws,
        "max_draws": None if max_draws is None else int(max_draws),
        "tune": default_tune(prior, missing) if tune is None else validation.integer(tune, "tune", minimum=0),
        "chains": validation.integer(chains, "chains"),
        "thin": validation.integer(thin, "thin"), "seed": validation.seed(seed),
        # seed of the iid draws a VB fit stores in to_arviz(): fixed at fit time, so that the
        # draws (and a saved file) are reproducible even when seed=None
        "draw_seed": validation.seed(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0]),
        "tol": validation.positive_float(tol, "tol"), "max_iter": validation.integer(max_iter, "max_iter"),
        "sigma2_beta": validation.positive_float(sigma2_beta, "sigma2_beta"), "A_u": validation.positive_float(A_u, "A_u"),
        "B_u": validation.positive_float(B_u, "B_u"), "level": level, "accelerate": bool(accelerate),
        "progress": bool(progress), "n_jobs": validation.integer(n_jobs, "n_jobs"),
    }


def load(path):
    """Load a fit saved with ``fit.save(path)``.

    Loading never runs code from the file: it is read as data (see :mod:`vbsvm.io.fit_file`), the
    stored formula must pass :func:`vbsvm.formula.safety.check_formula` before formulaic parses
    it, and no file handle stays open, whatever the outcome.

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
        If the file is missing, not netCDF, truncated or corrupted, not written by vbsvm, or holds
        anything a fit does not (extra groups, attributes of the wrong type, a formula outside the
        whitelist, inconsistent arrays); the message names the file and the fault.
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
