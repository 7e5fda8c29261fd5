"""Nonlinear Bayesian SVM with sparse Gaussian processes: :func:`gpsvm` and :class:`GPFit`.

``gpsvm("y ~ .", data=df, kernel="rbf", n_inducing=64, batch_size=100, method="svi")``

The model and its algebra are written out in :mod:`vbsvm.models.gp`
(:class:`~vbsvm.models.gp.SparseGPSVM` supplies the updates, ELBO and full conditionals); the
engines drive it: batch VB by :func:`vbsvm.inference.vb.coordinate_ascent` (:func:`fit_batch`),
Gibbs sampling by :func:`vbsvm.inference.gibbs.run_chains` (:func:`gibbs_sparse`: chains seeded by
``SeedSequence``, ``n_jobs``, tune/thin; R-hat and ESS in the summary), SVI by
:func:`vbsvm.inference.svi.fit_svi`.  This module is the only one that imports both.

Intercept: the formula's intercept column is dropped from X (the GP has no linear part); when
the formula has an intercept (the default) the kernel gets a :class:`~vbsvm.models.gp.Constant`
term ``bias.variance`` (a random intercept b ~ N(0, sigma_b^2) added to f), learned with the other
hyperparameters when ``optimize=True``.  ``y ~ . - 1`` (or ``bias=False``) removes it.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from scipy.linalg import cho_factor, cho_solve

from vbsvm.exceptions import InputError
from vbsvm.formula.design import build_design
from vbsvm.inference.dispatch import record_run_length
from vbsvm.inference.gibbs import run_chains
from vbsvm.inference.svi import ArrayBatches, FitState, StreamBatches, fit_svi
from vbsvm.inference.threads import limit_blas
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.gp import (
    InducingGP,
    SparseGPSVM,
    WhitenedGaussian,
    gp_columns,
    inducing_values,
    make_kernel,
    sample_rows,
    select_inducing,
)
from vbsvm.results.diagnostics import diagnostics_table, warn_unconverged
from vbsvm.results.gp import GPFit
from vbsvm.settings import ARGUMENT_RULES, GP_CONSTRAINTS, GPSettings, validate
from vbsvm.sources.dask_frames import DaskBatches, is_dask_frame, learn_design

__all__ = ["gpsvm", "fit_gp", "fit_batch", "gibbs_sparse", "GPFit"]


_METHODS = ("svi", "vb", "gibbs")


#: largest number of inducing points of batch VB (m = n for the full GP): a sweep costs
#: O(n m^2 + m^3) and holds (n, m) and (m, m) matrices; the limits keep a fit under about a
#: minute (timings in ``benchmarks/results/tuning_constants.md``).
VB_MAX_INDUCING = 2000


#: the same limit when batch VB learns the hyperparameters (optimize=True)
VB_MAX_INDUCING_LEARN = 500


# ---------------------------------------------------------------------------------------------
# Engines on the GP model
# ---------------------------------------------------------------------------------------------
def fit_batch(blocks: InducingGP, X, y, *, max_iter=500, tol=1e-8, optimize=False,
              optimize_inducing=False, hyper_mask=None, hyper_maxiter=2,
              accelerate=True, progress=False) -> FitState:
    """Batch VB of the sparse-GP SVM: :func:`vbsvm.inference.vb.coordinate_ascent` (SQUAREM
    accelerated, ELBO never decreasing) on :class:`vbsvm.models.gp.SparseGPSVM`.

    Parameters
    ----------
    blocks : InducingGP
        Kernel and inducing locations; left at the learned hyperparameters.
    X, y : ndarray
        Standardized predictors (n, d) and labels in {-1, +1}.
    max_iter : int
        Maximum number of sweeps.
    tol : float
        Relative ELBO change between accepted iterates that stops the iterations.
    optimize, optimize_inducing, hyper_mask, hyper_maxiter
        Hyperparameter learning (see :class:`~vbsvm.models.gp.SparseGPSVM`).
    accelerate : bool
        SQUAREM extrapolation (False: plain coordinate ascent).
    progress : bool
        Show a progress bar of the sweeps.

    Returns
    -------
    FitState
    """
    theta0 = blocks.kernel.theta
    model = SparseGPSVM(blocks, X, y, optimize=optimize, optimize_inducing=optimize_inducing,
                        hyper_mask=hyper_mask, hyper_maxiter=hyper_maxiter)
    res = coordinate_ascent(model, tol=tol, max_iter=max_iter, accelerate=accelerate, progress=progress)
    model.vb_finish(res.state)
    return FitState(q=res.q, blocks=blocks, elbo=res.elbo, elbo_iter=np.arange(res.elbo.size),
                    theta_trace=np.vstack([theta0, blocks.kernel.theta]), n_iter=res.n_sweeps,
                    converged=res.converged, seconds=res.seconds, method="vb")


def gibbs_sparse(blocks: InducingGP, X, y, *, draws=1000, tune=500, chains=4, thin=1, seed=None,
                 progress=False, n_jobs=1, max_draws=None):
    """Gibbs sampling of the sparse-GP SVM (bound model) with
    :func:`vbsvm.inference.gibbs.run_chains` on :class:`vbsvm.models.gp.SparseGPSVM`.

    Chain seeds are spawned from ``numpy.random.SeedSequence(seed)``; results do not depend on
    ``n_jobs``. Like the linear fits, the chains are extended (up to ``max_draws`` per chain,
    default ``4 * draws``; ``max_draws=draws`` switches it off) until the inducing values ``u``
    reach R-hat <= 1.01 and bulk ESS >= 400 (see :func:`vbsvm.inference.gibbs.run_chains`).

    Returns
    -------
    v : ndarray (chains, draws, m)
        Whitened inducing values (u = L v).
    result : vbsvm.inference.gibbs.GibbsResult
        Timing and settings of the run.
    """
    model = SparseGPSVM(blocks, X, y)
    res = run_chains(model, draws=draws, tune=tune, chains=chains, thin=thin, seed=seed,
                     record=("v",), progress=progress, n_jobs=n_jobs, max_draws=max_draws,
                     monitor=lambda d: diagnostics_table(inducing_values(d["v"], blocks)))
    return res.draws["v"], res


# ---------------------------------------------------------------------------------------------
# Array-level fit
# ---------------------------------------------------------------------------------------------
def fit_gp(X, y, *, kernel="rbf", n_inducing=None, inducing="kmeans", batch_size=100,
           method="svi", optimize=True, optimize_inducing=False, lengthscale=None, variance=1.0,
           bias=True, max_iter=None, tol=None, step="adaptive", hyper_every=10, hyper_lr=0.1,
           jitter=1e-6, draws=1000, tune=500, chains=4, thin=1, progress=False, seed=None,
           n_obs=None, feature_names=None, monitor_size=2000, learn=None, n_jobs=1, max_draws=None, _design=None,
           _formula=None):
    """Fit the sparse-GP SVM on arrays (or a stream); see :func:`gpsvm` for the arguments.

    ``X`` may be a callable returning a fresh iterator over ``(X_chunk, y_chunk)`` arrays (then
    ``y`` is ignored, ``method`` must be ``"svi"``, and the first chunk supplies the inducing
    points and the ELBO monitor rows).
    """
    if method not in _METHODS:
        raise InputError(f"method={method!r} is not known; use one of {_METHODS}")
    checked = validate(dict(batch_size=batch_size, optimize=optimize, seed=seed, tune=tune, chains=chains,
                            thin=thin, n_jobs=n_jobs, draws=draws, max_draws=max_draws), GP_CONSTRAINTS)
    batch_size, optimize, seed, tune = checked["batch_size"], checked["optimize"], checked["seed"], checked["tune"]
    chains, thin, n_jobs = checked["chains"], checked["thin"], checked["n_jobs"]
    draws, max_draws = checked["draws"], checked["max_draws"]
    validate(checked, ARGUMENT_RULES)
    rng = np.random.default_rng(seed)
    data = _TrainingData(X, y, method, rng, n_obs=n_obs, monitor_size=monitor_size, n_inducing=n_inducing)
    X, y, n, d = data.X, data.y, data.n, data.d
    m, how = _inducing_size(n, method, n_inducing, inducing, optimize)
    k = make_kernel(kernel, d, lengthscale=lengthscale, variance=variance, bias=bias,
                    feature_names=feature_names)
    blocks = InducingGP(k, _inducing_points(data.Xk, m, how, rng), jitter=jitter)
    mask = _learn_mask(k, learn)
    gibbs = None
    with limit_blas(float(blocks.m) ** 3):
        if method == "vb":
            st = fit_batch(blocks, X, y, max_iter=max_iter or 500,
                           tol=tol or (1e-5 if optimize else 1e-8),
                           optimize=optimize, optimize_inducing=optimize_inducing,
                           hyper_mask=mask, progress=progress)
        elif method == "svi":
            src, mon = data.minibatches(batch_size or 100, monitor_size, rng)
            st = fit_svi(blocks, src, n, max_iter=max_iter or 20000, step=step, tol=tol or 1e-3,
                         optimize=optimize, hyper_every=hyper_every, hyper_lr=hyper_lr,
                         optimize_inducing=optimize_inducing, monitor=mon, hyper_mask=mask,
                         progress=progress)
        else:  # gibbs
            st = None
            if optimize:
                # hyperparameters by VB (the sampler conditions on them), then sample
                st = fit_batch(blocks, X, y, max_iter=max_iter or 500, tol=tol or 1e-5,
                               optimize=True, optimize_inducing=optimize_inducing,
                               hyper_mask=mask)
            v, res = gibbs_sparse(blocks, X, y, draws=draws, tune=tune, chains=chains, thin=thin,
                                  seed=rng.integers(2**63), progress=progress, n_jobs=n_jobs,
                                  max_draws=max_draws)
            run = {}
            record_run_length(run, res)
            draws = int(res.n_draws)
            st = _gibbs_state(v, res, blocks, st, n_iter=chains * (tune + draws * thin))
            gibbs = v
            warn_unconverged(diagnostics_table(inducing_values(v, blocks)), draws, run, stacklevel=4)
    return GPFit(state=st, method=method, n_obs=n, n_features=d, design=_design,
                 formula=_formula, gibbs_draws=gibbs, settings=GPSettings(
                     kernel=str(kernel), n_inducing=blocks.m, inducing=str(inducing if isinstance(inducing, str) else "array"),
                     batch_size=batch_size, optimize=optimize, step=str(step), seed=seed,
                     tune=tune, chains=chains, thin=thin, n_jobs=n_jobs, streaming=data.streaming,
                     **({"draws": draws} if gibbs is None else run)))


class _TrainingData:
    """The training rows of :func:`fit_gp`, checked: arrays, a stream (a callable returning an
    iterator over chunks) or a Dask source (``batches`` and ``sample``). ``Xk, yk`` are the rows
    held in memory that choose the inducing points and give the SVI monitor rows (a Dask source's
    sample of at least ``monitor_size`` rows and 20 per inducing point, a stream's first chunk,
    all the arrays)."""

    def __init__(self, X, y, method, rng, n_obs, monitor_size, n_inducing):
        self.dask = hasattr(X, "batches") and hasattr(X, "sample")  # vbsvm.sources.dask_frames.DaskBatches
        self.streaming = callable(X) or self.dask
        if self.dask:
            if method != "svi":
                raise InputError(f"a Dask DataFrame needs method='svi' (minibatches streamed from its partitions); "
                                 f"method={method!r} would hold every row in memory: fit a pandas frame instead.")
            Xk, yk = X.sample(rng, max(monitor_size, 20 * (64 if n_inducing is None else int(n_inducing))))
            n, d = X.n, Xk.shape[1]
        elif self.streaming:
            if method != "svi":
                raise InputError("streamed data (a callable data source) needs method='svi'")
            first = next(iter(X()))
            X0, y0 = np.asarray(first[0], float), np.asarray(first[1], float)
            if n_obs is None:
                n_obs = sum(np.shape(c[1])[0] for c in X())
            n, d = int(n_obs), X0.shape[1]
            Xk, yk = X0, y0
        else:
            X = np.asarray(X, dtype=float)
            y = np.asarray(y, dtype=float)
            _check_arrays(X, y)
            n, d = X.shape
            Xk, yk = X, y
        self.X, self.y, self.n, self.d, self.Xk, self.yk = X, y, n, d, Xk, yk

    def minibatches(self, batch_size, monitor_size, rng):
        """``(source of minibatches, (X, y) of the SVI monitor rows)``."""
        if self.dask:
            return self.X.batches(batch_size, rng), (self.Xk[:monitor_size], self.yk[:monitor_size])
        if self.streaming:
            return (StreamBatches(self.X, self.n, batch_size, rng),
                    (self.Xk[:monitor_size], self.yk[:monitor_size]))
        src = ArrayBatches(self.X, self.y, batch_size, rng)
        idx = np.sort(sample_rows(rng, self.n, monitor_size))
        return src, (self.X[idx], self.y[idx])


def _check_arrays(X, y):
    """Raise an InputError unless ``X`` is ``(n, d)`` and finite and ``y`` is ``(n,)`` in {-1, +1}
    (checked in row blocks, so that no n-sized temporary is allocated)."""
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise InputError(f"X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    for s0 in range(0, X.shape[0], 65536):
        yb = y[s0:s0 + 65536]
        if not np.all((yb == 1.0) | (yb == -1.0)):
            raise InputError("y must be coded -1/+1 (use gpsvm with a formula for other codings)")
        if not np.all(np.isfinite(X[s0:s0 + 65536])):
            raise InputError("X has NaN or infinite values; drop or impute those rows")


def _inducing_size(n, method, n_inducing, inducing, optimize):
    """``(m, inducing)``: the number of inducing points asked for and how they are chosen
    (``"data"``, every row, for batch VB with ``n_inducing=None``); raises when batch VB would
    need more than it handles."""
    if method == "vb" and n_inducing is None:
        inducing_eff = "data"
    else:
        inducing_eff = inducing
    m = validate({"n_inducing": 64 if n_inducing is None else n_inducing}, GP_CONSTRAINTS)["n_inducing"]
    full = isinstance(inducing_eff, str) and inducing_eff == "data"
    limit = VB_MAX_INDUCING_LEARN if optimize else VB_MAX_INDUCING
    m_eff = min(n if full else m, n)
    if (method == "vb" or (method == "gibbs" and optimize)) and m_eff > limit:
        learn = " when it learns the hyperparameters (optimize=True)" if optimize else ""
        other = (f", or optimize=False (fixed hyperparameters, up to {VB_MAX_INDUCING})"
                 if optimize else "")
        raise InputError(
            f"method={method!r} runs batch VB with {m_eff} inducing points"
            f"{' (n_inducing=None: the full GP, every row)' if full else ''}, but batch VB is "
            f"limited to {limit}{learn}: each sweep costs O(n m^2 + m^3). Use method='svi' "
            f"(minibatches; 64 inducing points by default), or n_inducing <= {limit}{other}.")
    return m, inducing_eff


def _inducing_points(Xk, m, inducing, rng):
    """The inducing points ``Z`` (m, d): ``m`` chosen from the rows ``Xk`` by ``inducing``
    (``"kmeans"``, ``"random"``, ``"data"``), or ``inducing`` itself, an array."""
    d = Xk.shape[1]
    if isinstance(inducing, str):
        return select_inducing(Xk, m, inducing, rng=rng)
    Z = np.asarray(inducing, dtype=float)
    if Z.ndim != 2 or Z.shape[1] != d:
        raise InputError(f"inducing must be 'kmeans', 'random' or an (m, {d}) array")
    return Z


def _learn_mask(kernel, learn):
    """The 0/1 mask of the kernel's hyperparameters named in ``learn`` (None: all of them)."""
    if learn is None:
        return None
    names = kernel.param_names()
    unknown = [nm for nm in learn if nm not in names]
    if unknown:
        raise InputError(f"learn={list(learn)!r}: unknown hyperparameter(s) {unknown}; "
                         f"choose from {names}")
    return np.array([1.0 if nm in learn else 0.0 for nm in names])


def _gibbs_state(v, res, blocks, vb, n_iter):
    """The fit state of a Gibbs run: the Gaussian of the draws ``v`` as q, the ELBO and
    hyperparameter traces of the VB fit ``vb`` that learned the hyperparameters (None: none)."""
    return FitState(q=_gaussian_of_draws(v), blocks=blocks,
                    elbo=vb.elbo if vb else np.zeros(0),
                    elbo_iter=vb.elbo_iter if vb else np.zeros(0, int),
                    theta_trace=vb.theta_trace if vb else blocks.kernel.theta[None],
                    n_iter=n_iter, converged=True,
                    seconds=res.seconds + (vb.seconds if vb else 0.0), method="gibbs")


def _gaussian_of_draws(v) -> WhitenedGaussian:
    """Gaussian q(v) with the mean and covariance of Gibbs draws (for to_arviz attrs)."""
    flat = v.reshape(-1, v.shape[-1])
    cov = np.cov(flat.T).reshape(v.shape[-1], v.shape[-1]) + 1e-10 * np.eye(v.shape[-1])
    c = cho_factor(cov, lower=True)
    return WhitenedGaussian(cho_solve(c, np.eye(v.shape[-1])), cho_solve(c, flat.mean(0)))


# ---------------------------------------------------------------------------------------------
# Formula interface
# ---------------------------------------------------------------------------------------------
def gpsvm(formula, data, *, kernel="rbf", n_inducing=None, inducing="kmeans", batch_size=100,
          method="svi", optimize=True, optimize_inducing=False, lengthscale=None, variance=1.0,
          bias=None, max_iter=None, tol=None, step="adaptive", hyper_every=10, hyper_lr=0.1,
          jitter=1e-6, draws=1000, tune=500, chains=4, thin=1, progress=True, seed=None,
          n_obs=None, standardize=True, missing="drop", learn=None, n_jobs=1, max_draws=None):
    """Nonlinear Bayesian SVM with a (sparse) Gaussian process (Wenzel et al. 2017).

    Parameters
    ----------
    formula : str
        ``"y ~ ."`` or ``"y ~ x1 + np.log(x2) + C(g)"``; two-level response (0/1, False/True ->
        -1/+1; for strings the second sorted level is +1).
    data : pandas.DataFrame, dask.dataframe.DataFrame or callable
        The data, or for larger-than-memory data a callable returning a fresh iterator of
        DataFrame chunks (SVI only; the first chunk fixes the standardization, the columns and
        the inducing points; one extra pass counts rows unless ``n_obs`` is given), or a Dask
        DataFrame (SVI only: the design is learned from all rows in two passes, then minibatches
        are drawn from random partitions, random rows, memory independent of n; see
        :class:`vbsvm.sources.dask_frames.DaskBatches`).
    kernel : str or vbsvm.models.gp.Kernel
        ``"rbf"`` (default), ``"ard"`` (RBF with per-column lengthscales), ``"matern32"``,
        ``"matern52"`` (``"-ard"`` suffix for per-column lengthscales), ``"linear"``, sums
        such as ``"rbf+linear"``, or a Kernel object (``RBF(2.0) + Linear()``).
    n_inducing : int or None
        Number of inducing points m (default 64; ``method="vb"`` default: all n data points,
        the full GP of Section 4.1).
    inducing : {"kmeans", "random"} or array
        k-means++ (default), a random subset of rows, or given locations (standardized scale).
    batch_size : int
        SVI minibatch size.
    method : {"svi", "vb", "gibbs"}
        Stochastic VI (Algorithm 1), batch VB, or Gibbs sampling of the inducing-point model.
    optimize : bool
        Learn kernel hyperparameters by maximizing the ELBO (Section 4.3): Adam steps alternating
        with ``hyper_every`` SVI steps, or in every batch-VB sweep two L-BFGS iterations on the
        ELBO maximized over q(u) (for ``"gibbs"``: by batch VB before sampling).
    optimize_inducing : bool
        Also move the inducing locations.
    lengthscale, variance : float
        Starting values (lengthscale default sqrt(number of columns)).
    bias : bool, float or None
        Constant kernel term for the intercept (default: when the formula has an intercept).
    max_iter, tol : int, float
        Iteration cap and relative-ELBO tolerance (defaults: vb 500 sweeps / 1e-8, 1e-5 with
        ``optimize``; svi 20000 / 1e-3).  Batch VB refuses more than ``VB_MAX_INDUCING`` (2000)
        inducing points, or ``VB_MAX_INDUCING_LEARN`` (500) when it learns the hyperparameters
        (the full GP of n rows has n): use ``"svi"``.
    step : {"adaptive", "robbins-monro"} or float
        SVI step size.
    hyper_every, hyper_lr : int, float
        SVI: variational steps per hyperparameter step, Adam rate (log scale).
    jitter : float
        Relative diagonal jitter of K_mm (raised automatically if needed).
    draws, tune, chains, thin : Gibbs settings (chains seeded from ``seed`` by
        ``numpy.random.SeedSequence``; ``tune`` sweeps discarded; every ``thin``-th kept).
    progress : bool
        Show a progress bar with the time left (batch VB sweeps, SVI steps, or one bar over all
        Gibbs chains), on a terminal or in a notebook only.
    n_jobs : int
        Gibbs: worker processes for the chains (results do not depend on it).
    max_draws : int, optional
        Gibbs: the chains are extended from where they stopped until the inducing values reach
        R-hat <= 1.01 and bulk ESS >= 400, up to ``max_draws`` per chain (default ``4 * draws``;
        ``max_draws=draws`` switches this off); the fit warns if they do not.
    seed : int or None
        Same seed, same fit.
    n_obs : int, optional
        Number of rows of a streamed data source.
    learn : list of str, optional
        With ``optimize=True``, learn only these hyperparameters (names as in
        ``fit.hyperparameters``, e.g. ``["rbf.lengthscale"]``); the others stay at their starting
        values.
    standardize, missing : passed to the formula layer.

    Returns
    -------
    GPFit
    """
    start = time.perf_counter()

    if is_dask_frame(data):

        design = learn_design(formula, data, standardize=standardize, missing=missing)
        cols, keep = gp_columns(design)
        X, y = DaskBatches(data, design, keep), None
    elif callable(data):
        first = next(iter(data()))
        design = build_design(formula, first, standardize=standardize, missing=missing)
        cols, keep = gp_columns(design)

        def factory():
            for chunk in data():
                Xc = design.new_X(chunk)[:, keep]
                yc = _code_y(chunk[design.response], design)
                yield Xc, yc

        X, y = factory, None
    else:
        design = build_design(formula, data, standardize=standardize, missing=missing)
        cols, keep = gp_columns(design)
        X, y = np.ascontiguousarray(design.X[:, keep]), design.y
    if bias is None:
        bias = bool(design.has_intercept)
    if len(cols) == 0:
        raise InputError(f"formula {formula!r} has no predictor columns for the GP")
    fit = fit_gp(X, y, kernel=kernel, n_inducing=n_inducing, inducing=inducing,
                 batch_size=batch_size, method=method, optimize=optimize,
                 optimize_inducing=optimize_inducing, lengthscale=lengthscale, variance=variance,
                 bias=bias, max_iter=max_iter, tol=tol, step=step, hyper_every=hyper_every,
                 hyper_lr=hyper_lr, jitter=jitter, draws=draws, tune=tune, chains=chains,
                 thin=thin, progress=progress, seed=seed, n_obs=n_obs, feature_names=cols,
                 learn=learn, n_jobs=n_jobs, max_draws=max_draws, _design=design, _formula=formula)
    return fit.record_fit_time(time.perf_counter() - start)


def _code_y(values, design):
    """Code a response chunk of a streamed fit with the levels fixed by the first chunk."""
    v = pd.Series(values).to_numpy()
    pos = v == design.positive_level
    neg = v == design.negative_level
    if not np.all(pos | neg):
        bad = pd.unique(v[~(pos | neg)])[:3]
        raise InputError(f"response {design.response!r} has value(s) {list(bad)} in a later chunk "
                         f"that are neither {design.negative_level!r} nor {design.positive_level!r}")
    return np.where(pos, 1.0, -1.0)
