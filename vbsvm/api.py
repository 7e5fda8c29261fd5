"""Public entry points: :func:`svm` and :func:`load` (argument checking and dispatch)."""

from __future__ import annotations

import numbers
import time
import warnings

import numpy as np

from .design import build_design
from .exceptions import ConvergenceWarning, DiagnosticWarning, InputError, InputTypeError
from .inference.gibbs import run_chains
from .inference.threads import limit_blas
from .inference.vb import coordinate_ascent
from .models.linear import LinearSVMModel
from .results import Fit, ThetaLayout

__all__ = ["svm", "load"]

METHODS = ("vb", "gibbs", "map")


def _positive_int(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputTypeError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value}.")
    return int(value)


def _positive_float(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{name} must be a positive number, got {value!r}.")
    if not (np.isfinite(value) and value > 0):
        raise InputError(f"{name} must be a positive finite number, got {value!r}.")
    return float(value)


def _check_seed(seed):
    if seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0):
        return None if seed is None else int(seed)
    raise InputTypeError(f"seed must be a non-negative integer or None, got {seed!r}.")


def _check_penalty(penalty):
    if penalty is None or (isinstance(penalty, str) and penalty == "auto"):
        return penalty
    if isinstance(penalty, str):
        raise InputError(f"penalty must be 'auto', None or a positive number alpha; got {penalty!r}.")
    return _positive_float(penalty, "penalty")


def svm(formula, data, *, method="vb", penalty="auto", prior=None, missing="drop", standardize=True,
        draws=1000, tune=1000, chains=4, thin=1, seed=None, progress=True, n_jobs=1,
        tol=1e-8, max_iter=1000, accelerate=True, sigma2_beta=1e8, A_u=0.01, B_u=0.01, level=0.95,
        sigma2_mu=1e8, Psi=0.01, nu=3.0):
    """Fit a linear Bayesian support vector machine from a formula.

    Parameters
    ----------
    formula : str
        R-style formula, e.g. ``"y ~ x1 + C(sex) + (1 | patient_id)"`` or ``"y ~ ."``.
    data : pandas.DataFrame
        The data (never modified).
    method : {"vb", "gibbs", "map"}
        Mean-field variational Bayes (Luts & Ormerod Algorithms 1-2), Gibbs sampling
        (Appendix A) or the posterior mode by EM (with a fixed penalty: the classical SVM).
    penalty : "auto", float or None
        ``"auto"``: ``sigma2_u ~ IG(A_u, B_u)`` on the non-intercept fixed effects, so the penalty
        ``alpha = 1/(4 sigma2_u)`` is inferred; a float fixes ``alpha`` (cost ``C = 1/(2 alpha)``);
        ``None``: vague ``N(0, sigma2_beta)`` prior on every fixed effect.
    prior : None
        Reserved for sparse priors (``vbsvm.LaplaceZero``).
    missing : {"drop", "raise", "impute"}
        Rows with missing predictors: dropped (reported in the summary), an error, or imputed.
    standardize : bool
        Standardize the predictors internally (results are reported on the original scale).
    draws, tune, chains, thin : int
        Gibbs: kept draws per chain, discarded initial sweeps, chains, thinning. For VB fits
        ``chains x draws`` is the shape of the iid draws from q stored by ``to_arviz()``.
    seed : int or None
        Seed of every random number used (Gibbs chains, VB draws).
    progress : bool
        Progress bar for Gibbs.
    n_jobs : int
        Processes for Gibbs chains (results do not depend on it).
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

    Returns
    -------
    vbsvm.results.Fit
    """
    settings = _settings(formula, method=method, penalty=penalty, missing=missing, standardize=standardize,
                         draws=draws, tune=tune, chains=chains, thin=thin, seed=seed, tol=tol,
                         max_iter=max_iter, accelerate=accelerate, sigma2_beta=sigma2_beta, A_u=A_u,
                         B_u=B_u, level=level, progress=progress, n_jobs=n_jobs)
    settings.update(sigma2_mu=sigma2_mu, nu=nu,
                    Psi=Psi if np.ndim(Psi) == 0 else np.asarray(Psi, dtype=float).tolist())
    design = build_design(formula, data, standardize=standardize, missing=missing)
    warn_about_data(design, separability=settings["penalty"] is None)
    if prior is not None:
        from .models.selection import fit_laplace_zero
        return fit_laplace_zero(design, settings, prior)
    if missing == "impute":
        from .models.missing import fit_imputed
        return fit_imputed(design, settings)
    return _fit_linear(design, settings)


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
    X = design.X[~np.isnan(design.X).any(axis=1)]
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
            # eigen-decomposition of the p x p Gram (cheaper than an SVD of X): eigenvalues below
            # 1e-11 of the largest (condition number of X above ~3e5) mark dependent columns
            with limit_blas(float(n) * p * p):
                evals, evecs = np.linalg.eigh(X.T @ X)
            null = evecs[:, evals <= evals[-1] * 1e-11].T
            if null.size:
                cols = [names[j] for j in np.flatnonzero(np.abs(null).max(axis=0) > 1e-6)]
                warnings.warn(
                    f"design columns {_names(cols)} are linearly dependent (duplicated or collinear, "
                    f"rank {p - len(null)} < {p}): the data cannot tell their effects apart and the "
                    "prior decides how they are shared; remove the redundant column(s) from the formula.",
                    DiagnosticWarning, stacklevel=3)
        if separability and n * p <= max_lp_size:
            from scipy.optimize import linprog

            res = linprog(np.zeros(p), A_ub=-(design.y[~np.isnan(design.X).any(axis=1), None] * X),
                          b_ub=-np.ones(n), bounds=(None, None), method="highs")
            if res.status == 0:
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


def _settings(formula, *, method, penalty, missing, standardize, draws, tune, chains, thin, seed, tol,
              max_iter, accelerate, sigma2_beta, A_u, B_u, level, progress, n_jobs):
    """Validate the keyword arguments of :func:`svm` (errors name the argument and the fix)."""
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}; got {method!r}.")
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise InputError(f"level must be in (0, 1), e.g. 0.95; got {level!r}.")
    return {
        "formula": formula, "method": method, "penalty": _check_penalty(penalty), "missing": missing,
        "standardize": bool(standardize), "draws": _positive_int(draws, "draws"),
        "tune": _positive_int(tune, "tune", minimum=0), "chains": _positive_int(chains, "chains"),
        "thin": _positive_int(thin, "thin"), "seed": _check_seed(seed),
        # seed of the iid draws a VB fit stores in to_arviz(): fixed at fit time, so that the
        # draws (and a saved file) are reproducible even when seed=None
        "draw_seed": _check_seed(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0]),
        "tol": _positive_float(tol, "tol"), "max_iter": _positive_int(max_iter, "max_iter"),
        "sigma2_beta": _positive_float(sigma2_beta, "sigma2_beta"), "A_u": _positive_float(A_u, "A_u"),
        "B_u": _positive_float(B_u, "B_u"), "level": float(level), "accelerate": bool(accelerate),
        "progress": bool(progress), "n_jobs": _positive_int(n_jobs, "n_jobs"),
    }


def _fit_linear(design, settings) -> Fit:
    """Fit the linear SVM (penalty inference / random intercepts) by the method in ``settings``."""
    method = settings["method"]
    model = LinearSVMModel.from_design(design, settings)
    layout = ThetaLayout.from_model(model, design)
    M = design.to_original(model.qd)
    info = {"model": "Bayesian linear SVM" + (" with random intercepts" if design.groups else "")}
    with limit_blas(model.blas_work):  # the small products after the fit too
        posterior = _posterior_on_original_scale(model, settings, M, info)
    fit = Fit(design=design, layout=layout, settings=settings, method=method, posterior=posterior, info=info)
    if method == "gibbs":
        fit._warn_diagnostics()
    return fit


def _posterior_on_original_scale(model, settings, M, info):
    """Run the method in ``settings`` and return the posterior on the original predictor scale."""
    method, seed = settings["method"], settings["seed"]
    if method == "vb":
        res = coordinate_ascent(model, tol=settings["tol"], max_iter=settings["max_iter"],
                                accelerate=settings["accelerate"])
        post = res.q["theta"]
        cov_d = M @ post.cov_dense() @ M.T
        mean = post.mean
        mean[: model.qd] = M @ mean[: model.qd]
        var = post.diag_cov()
        var[: model.qd] = np.diag(cov_d)
        posterior = {
            "theta_mean": mean, "theta_var": var, "theta_cov_dense": cov_d,
            "theta_cov_ds": M @ post.cov_dense_sparse() if model.m_sparse else np.zeros((model.qd, 0)),
            "var_shape": np.atleast_1d(res.q["variances"].a) if model.variance_components else np.zeros(0),
            "var_scale": np.atleast_1d(res.q["variances"].b) if model.variance_components else np.zeros(0),
            "elbo": res.elbo,
        }
        info.update(converged=res.converged, n_sweeps=res.n_sweeps, seconds=res.seconds, **res.info)
    elif method == "gibbs":
        res = run_chains(model, draws=settings["draws"], tune=settings["tune"], chains=settings["chains"],
                         thin=settings["thin"], seed=seed, progress=settings["progress"], n_jobs=settings["n_jobs"],
                         record=("theta", "sigma2", "log_pseudo_likelihood"))
        theta = res.draws["theta"].copy()
        theta[..., : model.qd] = theta[..., : model.qd] @ M.T
        posterior = {"theta_draws": theta, "sigma2_draws": res.draws["sigma2"],
                     "log_pseudo_likelihood": res.draws["log_pseudo_likelihood"]}
        info.update(seconds=res.seconds)
    else:
        theta, sigma2, converged, n_iter, seconds = _posterior_mode(model, settings)
        theta = theta.copy()
        theta[: model.qd] = M @ theta[: model.qd]
        posterior = {"theta_mode": theta, "sigma2_mode": sigma2}
        info.update(converged=converged, n_iter=n_iter, seconds=seconds)
    return posterior


def _posterior_mode(model: LinearSVMModel, settings):
    """EM for the joint posterior mode (Polson & Scott 2011), polished to the exact SVM solution."""
    start = time.perf_counter()
    theta = np.zeros(model.q)
    sigma2 = np.ones(len(model.variance_components))
    value = model.log_posterior(theta, sigma2)
    converged = False
    max_iter = max(settings["max_iter"], 2000)
    for it in range(1, max_iter + 1):
        theta, sigma2 = model.map_step(theta, sigma2)
        new = model.log_posterior(theta, sigma2)
        if abs(new - value) <= 1e-12 * max(abs(new), 1.0):
            converged = True
            value = new
            break
        value = new
    polished = model.polish_mode(theta)
    if polished is not None and model.log_posterior(polished, sigma2) >= value - 1e-9 * max(abs(value), 1):
        theta = polished
        converged = True
    if not converged:
        warnings.warn(f"EM for the posterior mode did not converge in {max_iter} iterations.",
                      ConvergenceWarning, stacklevel=3)
    return theta, sigma2, converged, it, time.perf_counter() - start


def load(path):
    """Load a fit saved with ``fit.save(path)``.

    Loading never runs code from the file: it is read as data (see :mod:`vbsvm.fit_file`), the
    stored formula must pass :func:`vbsvm.formula_safety.check_formula` before formulaic parses
    it, and no file handle stays open, whatever the outcome.

    Parameters
    ----------
    path : str or pathlib.Path
        A file written by :meth:`vbsvm.results.Fit.save` or :meth:`vbsvm.GPFit.save`.

    Returns
    -------
    vbsvm.results.Fit or vbsvm.GPFit
        The fit, of the class that saved it.

    Raises
    ------
    vbsvm.exceptions.FitFileError
        If the file is missing, not netCDF, truncated or corrupted, not written by vbsvm, or holds
        anything a fit does not (extra groups, attributes of the wrong type, a formula outside the
        whitelist, inconsistent arrays); the message names the file and the fault.
    """
    from .fit_file import check_loaded, read_fit_file, refusing

    kind, tree = read_fit_file(path)
    with refusing(path):
        if kind == "linear":
            fit = Fit.from_datatree(tree)
        elif kind == "selection":
            from .selection_fit import SelectionFit

            fit = SelectionFit.from_datatree(tree)
        elif kind == "imputed":
            from .imputed_fit import ImputedFit

            fit = ImputedFit.from_datatree(tree)
        else:
            from .gpfit import GPFit

            fit = GPFit.from_datatree(tree)
        check_loaded(fit)
    return fit
