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

import json

import numpy as np
import pandas as pd
from scipy.linalg import cho_factor, cho_solve

from vbsvm import validation
from vbsvm.design import design_from_text, design_to_text
from vbsvm.exceptions import InputError
from vbsvm.inference.dispatch import record_run_length
from vbsvm.inference.gibbs import run_chains
from vbsvm.inference.svi import ArrayBatches, FitState, StreamBatches, fit_svi
from vbsvm.inference.threads import limit_blas
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.gp import (InducingGP, Kernel, SparseGPSVM, WhitenedGaussian, kernel_from_dict,
                             make_kernel, predictive_prob, sample_rows, select_inducing)
from vbsvm.results import diagnostics_table, warn_unconverged

__all__ = ["gpsvm", "fit_gp", "fit_batch", "gibbs_sparse", "GPFit"]

_METHODS = ("svi", "vb", "gibbs")

#: largest number of inducing points of batch VB (m = n for the full GP): a sweep costs
#: O(n m^2 + m^3) and holds (n, m) and (m, m) matrices.  Measured (benchmarks/gp_batch_vb.py, size
#: part, 1 BLAS thread on a busy 2-core machine): fixed hyperparameters 16 sweeps, 3 s at
#: n = m = 1000 and 24 s at 2000; learning them (each sweep also evaluates the collapsed ELBO and
#: its gradient ~3 times) 5 s at 250 and 39 s at 500.
VB_MAX_INDUCING = 2000
#: the same limit when batch VB learns the hyperparameters (optimize=True)
VB_MAX_INDUCING_LEARN = 500


# ---------------------------------------------------------------------------------------------
# Engines on the GP model
# ---------------------------------------------------------------------------------------------
def fit_batch(blocks: InducingGP, X, y, *, max_iter=500, tol=1e-8, optimize=False,
              optimize_inducing=False, hyper_mask=None, hyper_maxiter=2,
              accelerate=True) -> FitState:
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

    Returns
    -------
    FitState
    """
    theta0 = blocks.kernel.theta
    model = SparseGPSVM(blocks, X, y, optimize=optimize, optimize_inducing=optimize_inducing,
                        hyper_mask=hyper_mask, hyper_maxiter=hyper_maxiter)
    res = coordinate_ascent(model, tol=tol, max_iter=max_iter, accelerate=accelerate)
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
    draws = validation.integer(draws, "draws")
    chains = validation.integer(chains, "chains")
    thin = validation.integer(thin, "thin")
    n_jobs = validation.integer(n_jobs, "n_jobs")
    if max_draws is not None and validation.integer(max_draws, "max_draws") < draws:
        raise InputError(f"max_draws must be at least draws = {draws} (max_draws=draws switches the extension "
                         f"of Gibbs runs off); got {max_draws}.")
    tune = validation.integer(tune, "tune", minimum=0)
    rng = np.random.default_rng(seed)
    dask_source = hasattr(X, "batches") and hasattr(X, "sample")  # vbsvm.dask_backend.DaskBatches
    streaming = callable(X) or dask_source
    if dask_source:
        if method != "svi":
            raise InputError(f"a Dask DataFrame needs method='svi' (minibatches streamed from its partitions); "
                             f"method={method!r} would hold every row in memory: fit a pandas frame instead.")
        Xk, yk = X.sample(rng, max(monitor_size, 20 * (64 if n_inducing is None else int(n_inducing))))
        n, d = X.n, Xk.shape[1]
    elif streaming:
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
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise InputError(f"X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
        # validated in row blocks so that no n-sized temporary is allocated
        for s0 in range(0, X.shape[0], 65536):
            yb = y[s0:s0 + 65536]
            if not np.all((yb == 1.0) | (yb == -1.0)):
                raise InputError("y must be coded -1/+1 (use gpsvm with a formula for other codings)")
            if not np.all(np.isfinite(X[s0:s0 + 65536])):
                raise InputError("X has NaN or infinite values; drop or impute those rows")
        n, d = X.shape
        Xk, yk = X, y
    if batch_size is not None:
        batch_size = validation.integer(batch_size, "batch_size")
    if method == "vb" and n_inducing is None:
        inducing_eff = "data"
    else:
        inducing_eff = inducing
    m = validation.integer(64 if n_inducing is None else n_inducing, "n_inducing")
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
    k = make_kernel(kernel, d, lengthscale=lengthscale, variance=variance, bias=bias,
                    feature_names=feature_names)
    if isinstance(inducing_eff, str):
        Z = select_inducing(Xk, m, inducing_eff, rng=rng)
    else:
        Z = np.asarray(inducing_eff, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != d:
            raise InputError(f"inducing must be 'kmeans', 'random' or an (m, {d}) array")
    blocks = InducingGP(k, Z, jitter=jitter)
    mask = None
    if learn is not None:
        names = k.param_names()
        unknown = [nm for nm in learn if nm not in names]
        if unknown:
            raise InputError(f"learn={list(learn)!r}: unknown hyperparameter(s) {unknown}; "
                             f"choose from {names}")
        mask = np.array([1.0 if nm in learn else 0.0 for nm in names])
    gibbs = None
    with limit_blas(float(blocks.m) ** 3):
        if method == "vb":
            st = fit_batch(blocks, X, y, max_iter=max_iter or 500,
                           tol=tol or (1e-5 if optimize else 1e-8),
                           optimize=optimize, optimize_inducing=optimize_inducing,
                           hyper_mask=mask)
        elif method == "svi":
            if dask_source:
                src = X.batches(batch_size or 100, rng)
                mon = (Xk[:monitor_size], yk[:monitor_size])
            elif streaming:
                src = StreamBatches(X, n, batch_size or 100, rng)
                mon = (Xk[:monitor_size], yk[:monitor_size])
            else:
                src = ArrayBatches(X, y, batch_size or 100, rng)
                idx = np.sort(sample_rows(rng, n, monitor_size))
                mon = (X[idx], y[idx])
            st = fit_svi(blocks, src, n, max_iter=max_iter or 20000, step=step, tol=tol or 1e-3,
                         optimize=optimize, hyper_every=hyper_every, hyper_lr=hyper_lr,
                         optimize_inducing=optimize_inducing, monitor=mon, hyper_mask=mask)
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
            st = FitState(q=_gaussian_of_draws(v), blocks=blocks,
                          elbo=st.elbo if st else np.zeros(0),
                          elbo_iter=st.elbo_iter if st else np.zeros(0, int),
                          theta_trace=st.theta_trace if st else blocks.kernel.theta[None],
                          n_iter=chains * (tune + draws * thin), converged=True,
                          seconds=res.seconds + (st.seconds if st else 0.0), method="gibbs")
            gibbs = v
            warn_unconverged(diagnostics_table(inducing_values(v, blocks)), draws, run, stacklevel=4)
    return GPFit(state=st, method=method, n_obs=n, n_features=d, design=_design,
                 formula=_formula, gibbs_draws=gibbs, settings=dict(
                     kernel=str(kernel), n_inducing=blocks.m, inducing=str(inducing if isinstance(inducing, str) else "array"),
                     batch_size=batch_size, optimize=optimize, step=str(step), seed=seed,
                     tune=tune, chains=chains, thin=thin, n_jobs=n_jobs, streaming=streaming,
                     **({"draws": draws} if gibbs is None else run)))


def inducing_values(v, blocks):
    """Dataset with the inducing values ``u = L v`` (chain, draw, inducing) of whitened draws
    ``v`` (chain, draw, m): what the GP's Gibbs diagnostics are about."""
    import xarray as xr

    U = v @ blocks.L.T
    return xr.Dataset({"u": (("chain", "draw", "inducing"), U)},
                      coords={"chain": np.arange(U.shape[0]), "draw": np.arange(U.shape[1]),
                              "inducing": np.arange(blocks.m)})


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
        :class:`vbsvm.dask_backend.DaskBatches`).
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
    draws, tune, chains, thin, progress : Gibbs settings (chains seeded from ``seed`` by
        ``numpy.random.SeedSequence``; ``tune`` sweeps discarded; every ``thin``-th kept;
        ``progress=True``, as in :func:`vbsvm.svm`, shows a tqdm bar, which only the samplers draw).
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
    from vbsvm.design import build_design

    from vbsvm.dask_backend import is_dask_frame

    if is_dask_frame(data):
        from vbsvm.dask_backend import DaskBatches, learn_design

        design = learn_design(formula, data, standardize=standardize, missing=missing)
        cols, keep = _gp_columns(design)
        X, y = DaskBatches(data, design, keep), None
    elif callable(data):
        first = next(iter(data()))
        design = build_design(formula, first, standardize=standardize, missing=missing)
        cols, keep = _gp_columns(design)

        def factory():
            for chunk in data():
                Xc = design.new_X(chunk)[:, keep]
                yc = _code_y(chunk[design.response], design)
                yield Xc, yc

        X, y = factory, None
    else:
        design = build_design(formula, data, standardize=standardize, missing=missing)
        cols, keep = _gp_columns(design)
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
    return fit


def _gp_columns(design):
    keep = [j for j, c in enumerate(design.column_names) if c != "Intercept"]
    return [design.column_names[j] for j in keep], np.asarray(keep, dtype=int)


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


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
class GPFit:
    """A fitted sparse-GP Bayesian SVM.

    Attributes
    ----------
    method : str
    kernel : vbsvm.models.gp.Kernel
        With the learned hyperparameters.
    inducing_points : ndarray (m, d)
        Inducing locations (standardized predictor scale).
    elbo : ndarray
        ELBO trace (vb: per sweep; svi: monitor ELBO at each check; gibbs: the VB trace used to
        learn hyperparameters, or empty).
    converged : bool
    n_iter : int
    seconds : float
    """

    def __init__(self, state: FitState, method, n_obs, n_features, design=None, formula=None,
                 gibbs_draws=None, settings=None):
        self._state = state
        self.method = method
        self.n_obs = int(n_obs)
        self.n_features = int(n_features)
        self.design = design
        self.formula = formula
        self.gibbs_draws = gibbs_draws
        self.settings = settings or {}

    # -- basic attributes --------------------------------------------------------------------
    @property
    def blocks(self) -> InducingGP:
        return self._state.blocks

    @property
    def kernel(self) -> Kernel:
        return self._state.blocks.kernel

    @property
    def inducing_points(self):
        return self._state.blocks.Z

    @property
    def n_inducing(self):
        return self._state.blocks.m

    @property
    def q(self) -> WhitenedGaussian:
        return self._state.q

    @property
    def elbo(self):
        return self._state.elbo

    @property
    def converged(self):
        return self._state.converged

    @property
    def n_iter(self):
        return self._state.n_iter

    @property
    def seconds(self):
        return self._state.seconds

    @property
    def hyperparameters(self) -> pd.DataFrame:
        """Learned kernel hyperparameters (natural scale) with their starting values."""
        names = self.kernel.param_names()
        tr = self._state.theta_trace
        return pd.DataFrame({"value": np.exp(self.kernel.theta),
                             "start": np.exp(tr[0]) if len(tr) else np.nan}, index=names)

    @property
    def coef(self) -> pd.DataFrame:
        """For the GP model: the hyperparameter table (point estimates; no sd)."""
        h = self.hyperparameters
        return pd.DataFrame({"mean": h["value"], "sd": np.nan, "lower": np.nan, "upper": np.nan})

    @property
    def u_mean(self):
        """Posterior mean of the inducing values u = L v."""
        if self.gibbs_draws is not None:
            return self.blocks.L @ self.gibbs_draws.reshape(-1, self.n_inducing).mean(0)
        return self.blocks.L @ self.q.mean

    # -- draws (pure: the fit is never changed) ----------------------------------------------
    def _shape(self, chains, draws):
        return (int(self.settings.get("chains", 4) if chains is None else chains),
                int(self.settings.get("draws", 1000) if draws is None else draws))

    def draws(self, chains=None, draws=None, seed=0):
        """Draws of the whitened inducing values v (u = L v).

        Parameters
        ----------
        chains, draws : int or None
            Shape of VB/SVI draws (default ``settings["chains"]``, ``settings["draws"]``, i.e.
            4 x 1000); Gibbs fits return their chains and ignore them.
        seed : int
            VB/SVI: the same seed gives the same draws.

        Returns
        -------
        ndarray (chains, draws, m)
            The fit itself is not changed.
        """
        if self.gibbs_draws is not None:
            return self.gibbs_draws
        ch, dr = self._shape(chains, draws)
        return self.q.sample(np.random.default_rng(seed), ch * dr).reshape(ch, dr, -1)

    def f_draws(self, newdata, chains=None, draws=None, seed=0):
        """Draws of the latent score f at rows of ``newdata``.

        ``f = A v + sqrt(k~) e`` (``e`` standard normal: f given u has variance k~), v from
        :meth:`draws`.

        Parameters
        ----------
        newdata : DataFrame or ndarray
            Rows (as for :meth:`predict`).
        chains, draws, seed
            As for :meth:`draws`.

        Returns
        -------
        ndarray (chains, draws, rows)
            The fit itself is not changed.
        """
        X, _ = self._X(newdata)
        A, kt = self.blocks.project(X)
        V = self.draws(chains, draws, seed)
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        return V @ A.T + np.sqrt(kt) * rng.standard_normal(V.shape[:2] + (kt.size,))

    def with_draw_shape(self, chains, draws):
        """The same fit with ``(chains, draws)`` as its default VB draw shape (a new object;
        this one is not changed)."""
        return GPFit(self._state, self.method, self.n_obs, self.n_features, design=self.design,
                     formula=self.formula, gibbs_draws=self.gibbs_draws,
                     settings={**self.settings, "chains": int(chains), "draws": int(draws)})

    def _posterior_dataset(self, V=None):
        """Dataset with ``u`` (chain, draw, inducing) from the draws ``V`` of v (default
        :meth:`draws`)."""
        return inducing_values(self.draws() if V is None else V, self.blocks)

    def diagnostics(self):
        """Gibbs fits: R-hat (rank-normalized), bulk/tail ESS and MCSE of every inducing value
        ``u[j]`` (the sampled parameters; the hyperparameters are fixed while sampling), by the
        code path of the linear Gibbs fits; None for VB/SVI fits."""
        if self.gibbs_draws is None:
            return None
        return diagnostics_table(self._posterior_dataset())

    # -- predictions -------------------------------------------------------------------------
    def _X(self, newdata):
        if isinstance(newdata, pd.DataFrame) and self.design is not None:
            Xn = self.design.new_X(newdata)
            _, keep = _gp_columns(self.design)
            return np.ascontiguousarray(Xn[:, keep]), newdata.index
        Xn = np.asarray(newdata, dtype=float)
        if Xn.ndim != 2 or Xn.shape[1] != self.n_features:
            raise InputError(f"newdata must be a DataFrame with the formula's columns or an "
                             f"(n, {self.n_features}) array of standardized predictors")
        return Xn, None

    def predict_f(self, newdata):
        """Mean and variance of the latent score f at new rows (Gibbs: over the draws)."""
        X, _ = self._X(newdata)
        if self.gibbs_draws is None:
            return self.blocks.predict_f(X, self.q)
        A, kt = self.blocks.project(X)
        F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
        return F.mean(0), F.var(0) + kt

    def predict(self, newdata=None, kind="class", normalization="probit"):
        """Predict at new data.

        Parameters
        ----------
        newdata : DataFrame or array, optional
            Default: the training data (needs the design).
        kind : {"class", "prob", "score"}
            ``"class"``: the response level of sign(E f); ``"prob"``: approximate predictive
            probability of the positive level, Phi(m / sqrt(1 + v)) (see
            :func:`vbsvm.models.gp.predictive_prob`; for Gibbs the mean over draws of
            Phi(f / sqrt(1 + k~))); ``"score"``: DataFrame with the predictive mean and sd of f.
        normalization : {"probit", "paper"}
            ``"paper"`` reproduces eq. (13) as printed (Phi(m / (1 + v))).
        """
        from vbsvm.dask_backend import DaskDesign, is_dask_frame, lazy_predictions

        if newdata is None:
            if self.design is None or getattr(self.design, "raw", None) is None:
                raise InputError("predict() without newdata needs a formula fit; pass newdata")
            if isinstance(self.design, DaskDesign):
                raise InputError("this fit was made from a Dask DataFrame and keeps no rows: pass newdata "
                                 "(e.g. fit.predict(data), lazily evaluated for a Dask frame).")
            newdata = self.design.raw
        if is_dask_frame(newdata):
            if self.design is None or kind not in ("class", "prob", "score"):
                raise InputError("predicting a Dask DataFrame needs a formula fit and kind 'class', 'prob' or "
                                 f"'score'; got kind={kind!r}.")
            return lazy_predictions(newdata, self.design, kind,
                                    lambda frame: self.predict(frame, kind=kind, normalization=normalization))
        X, index = self._X(newdata)
        mean, var = self.predict_f(X)
        if kind == "score":
            return pd.DataFrame({"mean": mean, "sd": np.sqrt(var)}, index=index)
        if kind == "prob":
            if self.gibbs_draws is not None and normalization == "probit":
                from scipy.special import ndtr
                A, kt = self.blocks.project(X)
                F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
                p = ndtr(F / np.sqrt(1.0 + kt)).mean(0)
            else:
                p = predictive_prob(mean, var, normalization)
            if self.design is not None and index is not None:
                return pd.Series(p, index=index,
                                 name=f"P({self.design.response}={self.design.positive_level!r})")
            return p
        if kind == "class":
            lab = np.where(mean >= 0, 1, -1)
            if self.design is not None and index is not None:
                vals = np.where(lab > 0, self.design.positive_level, self.design.negative_level)
                return pd.Series(vals, index=index, name=self.design.response)
            return lab
        raise InputError(f"kind={kind!r}; use 'class', 'prob' or 'score'")

    # -- summary -----------------------------------------------------------------------------
    def summary(self):
        """statsmodels Summary: model information and the kernel hyperparameters."""
        from statsmodels.iolib.summary import Summary
        from statsmodels.iolib.table import SimpleTable

        from .summary import wrap_notes

        s = Summary()
        resp = self.design.response if self.design is not None else "y"
        pos = self.design.positive_level if self.design is not None else "+1"
        el = self.elbo
        left = [("Response:", f"{resp} (+1 = {pos!r})"), ("Method:", self.method),
                ("Kernel:", _kernel_label(self.kernel)),
                ("No. observations:", str(self.n_obs)),
                ("No. inducing points:", str(self.n_inducing))]
        right = [("ELBO:", f"{el[-1]:.4f}" if len(el) else "-"),
                 ("Converged:", str(self.converged)), ("Iterations:", str(self.n_iter)),
                 ("Time [s]:", f"{self.seconds:.3f}"),
                 ("Hyperparameters:", "learned" if self.settings.get("optimize") else "fixed")]
        rows = [[a, b, c, d] for (a, b), (c, d) in zip(left, right)]
        s.tables.append(SimpleTable(rows, title="Bayesian nonlinear SVM (sparse GP)"))
        h = self.hyperparameters
        data = [[f"{v:.4g}", f"{st:.4g}"] for v, st in zip(h["value"], h["start"])]
        s.tables.append(SimpleTable(data, headers=["value", "start"], stubs=list(h.index),
                                    title="Kernel hyperparameters"))
        diag = self.diagnostics()
        if diag is not None:
            st = self.settings
            worst = [f"{diag['r_hat'].max():.3f}", f"{diag['ess_bulk'].min():.0f}",
                     f"{diag['ess_tail'].min():.0f}"]
            s.tables.append(SimpleTable(
                [worst], headers=["max R-hat", "min bulk ESS", "min tail ESS"],
                stubs=[f"u ({self.n_inducing} values)"],
                title=(f"Gibbs diagnostics: {st.get('chains')} chains x {st.get('draws')} draws "
                       f"(tune {st.get('tune')}, thin {st.get('thin')}); fit.diagnostics() per value")))
        if len(el) > 1:
            tail = ", ".join(f"{e:.2f}" for e in el[-5:])
            s.add_extra_txt(wrap_notes([
                f"ELBO trace (last {min(5, len(el))} of {len(el)}): {tail}",
                "Predictive probability: Phi(m / sqrt(1 + v)) (probit integrated over q(f*)).",
                "Intercept: constant kernel term 'bias.variance' (random intercept)."]))
        return s

    def __repr__(self):
        """A short description (method, formula, kernel); :meth:`summary` has the tables."""
        import textwrap

        from .summary import WIDTH

        text = [f"Bayesian nonlinear SVM (sparse GP): {self.method}",
                f"Formula: {self.formula}" if self.formula else f"{self.n_features} features (array input)",
                f"n = {self.n_obs}; {self.n_inducing} inducing points; kernel {_kernel_label(self.kernel)}"]
        lines = [line for t in text for line in textwrap.wrap(t, WIDTH, subsequent_indent="  ")]
        return "\n".join(lines + ["fit.summary() gives the hyperparameters and diagnostics."])

    def _repr_html_(self):
        return self.summary().as_html()

    # -- plots -------------------------------------------------------------------------------
    def plot_trace(self, ax=None):
        """ELBO trace and hyperparameter traces (matplotlib Figure)."""
        import matplotlib.pyplot as plt

        if ax is None:
            fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        else:
            axes = np.atleast_1d(ax)
            fig = axes[0].figure
        st = self._state
        if len(st.elbo):
            axes[0].plot(st.elbo_iter, st.elbo, "-", lw=1)
        axes[0].set_xlabel("iteration")
        axes[0].set_ylabel("ELBO")
        tr = np.exp(st.theta_trace)
        for j, nm in enumerate(self.kernel.param_names()):
            axes[1].plot(tr[:, j], label=nm, lw=1)
        axes[1].set_yscale("log")
        axes[1].set_xlabel("check / iteration")
        axes[1].set_ylabel("hyperparameter")
        if tr.shape[1] <= 8:
            axes[1].legend(fontsize=7)
        fig.tight_layout()
        return fig

    # -- ArviZ / persistence -----------------------------------------------------------------
    def to_arviz(self, draws=None, chains=None, seed=0):
        """xarray.DataTree in ArviZ 1.x layout (VB/SVI draw shape: ``chains`` x ``draws``,
        default from the fit's settings, 4 x 1000).

        ``posterior``: ``u`` (chain, draw, inducing) — Gibbs draws, or iid draws from q(u) for VB
        (q's mean and covariance in the group's attrs via ``vbsvm_state``); ``sample_stats``: the
        Gibbs/VB diagnostics available; ``vbsvm_state``: everything needed to rebuild the fit.
        """
        import xarray as xr

        L = self.blocks.L
        V = self.draws(chains, draws, seed)
        post = self._posterior_dataset(V)
        post.attrs.update({"inference": self.method,
                           "q_u_mean": (L @ self.q.mean).tolist() if self.gibbs_draws is None else [],
                           "note": "u = f(Z) at the inducing locations; VB: iid draws from q(u)"})
        ss = xr.Dataset({"lp_proxy": (("chain", "draw"), -0.5 * np.sum(V ** 2, axis=-1))},
                        coords={"chain": post["chain"].values, "draw": post["draw"].values})
        st = self._state
        state = xr.Dataset({
            "Z": (("inducing", "feature"), self.inducing_points),
            "prec": (("inducing", "inducing2"), self.q.prec),
            "shift": (("inducing",), self.q.shift),
            "theta": (("param",), self.kernel.theta),
            "elbo": (("trace",), np.asarray(st.elbo, float)),
            "elbo_iter": (("trace",), np.asarray(st.elbo_iter, float)),
            "theta_trace": (("check", "param"), np.asarray(st.theta_trace, float)),
        })
        if self.gibbs_draws is not None:
            state["gibbs_v"] = (("chain", "draw", "inducing"), self.gibbs_draws)
        meta = dict(method=self.method, n_obs=self.n_obs, n_features=self.n_features,
                    kernel=self.kernel.to_dict(), jitter=self.blocks.jitter,
                    converged=bool(st.converged), n_iter=int(st.n_iter), seconds=float(st.seconds),
                    formula=self.formula, settings=self.settings)
        attrs = {"vbsvm_fit_type": "gpsvm", "vbsvm_gp_meta": json.dumps(meta, default=str)}
        if self.design is not None:
            d = self.design
            attrs["design"] = design_to_text(d)
        tree = xr.DataTree.from_dict({"posterior": post, "sample_stats": ss, "vbsvm_state": state})
        tree.attrs.update(attrs)
        return tree

    def save(self, path):
        """Write the fit to netCDF (h5netcdf); reload with ``vbsvm.load`` or
        :meth:`GPFit.from_datatree`."""
        from vbsvm.fit_file import write_atomically
        from vbsvm.formula_safety import check_formula

        if self.formula is not None:
            check_formula(self.formula)  # vbsvm.load would refuse the file
        write_atomically(self.to_arviz(draws=1000, chains=4), path)

    @classmethod
    def from_datatree(cls, tree):
        """Rebuild a fit from :meth:`to_arviz` / :meth:`save` output."""
        from vbsvm.exceptions import FitFileError

        try:
            return cls._from_datatree(tree)
        except FitFileError:
            raise
        except Exception as exc:  # KeyError, ValueError, TypeError from an incomplete or foreign file
            raise FitFileError(f"the file is not a complete vbsvm GP fit ({type(exc).__name__}: {exc}).") from None

    @classmethod
    def _from_datatree(cls, tree):
        meta = json.loads(tree.attrs["vbsvm_gp_meta"])
        st = tree["vbsvm_state"].to_dataset()
        kern = kernel_from_dict(meta["kernel"])
        kern.theta = np.asarray(st["theta"].values)
        blocks = InducingGP(kern, np.asarray(st["Z"].values), jitter=meta["jitter"])
        q = WhitenedGaussian(np.asarray(st["prec"].values), np.asarray(st["shift"].values))
        fs = FitState(q=q, blocks=blocks, elbo=np.asarray(st["elbo"].values),
                      elbo_iter=np.asarray(st["elbo_iter"].values),
                      theta_trace=np.asarray(st["theta_trace"].values), n_iter=meta["n_iter"],
                      converged=meta["converged"], seconds=meta["seconds"], method=meta["method"])
        design = None
        if "design" in tree.attrs:
            design = design_from_text(tree.attrs["design"])
        gd = np.asarray(st["gibbs_v"].values) if "gibbs_v" in st else None
        return cls(fs, meta["method"], meta["n_obs"], meta["n_features"], design=design,
                   formula=meta["formula"], gibbs_draws=gd, settings=meta["settings"])


def _kernel_label(k):
    parts = k.parts if hasattr(k, "parts") else [k]
    out = []
    for p in parts:
        nm = type(p).__name__
        if getattr(p, "ard", False):
            nm += "(ARD)"
        out.append(nm)
    return " + ".join(out)
