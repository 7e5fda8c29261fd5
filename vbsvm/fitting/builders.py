"""From a design to a fitted model: build the model the formula, ``prior`` and ``missing`` name,
run it through the one dispatch (:func:`vbsvm.inference.dispatch.fit`) and wrap the posterior
arrays in its result class.

======================================  =====================================  ===========================
model                                   built from                             result
======================================  =====================================  ===========================
linear SVM (penalty, random effects)    :class:`~vbsvm.models.linear.LinearSVMModel`     :class:`~vbsvm.results.fit.Fit`
Laplace-zero selection                  :class:`~vbsvm.models.selection.LaplaceZeroModel` :class:`~vbsvm.results.selection.SelectionFit`
missing predictors imputed              :class:`~vbsvm.models.missing.CutImputedSVMModel` :class:`~vbsvm.results.imputed.ImputedFit`
                                        (or the paper's joint model)
Laplace-zero + imputation               both                                   :class:`~vbsvm.results.selection.ImputedSelectionFit`
======================================  =====================================  ===========================

Random effects (intercepts and slopes) are blocks of every model. Each builder says how its
posterior is read out of each engine's result (a :class:`~vbsvm.inference.dispatch.Readout`:
draws, the VB q or the mode, mapped to the original predictor scale), and which engine a
method uses where the model has its own (the Laplace-zero ELBO grid over ``rho``, the
imputation model's pooled completions).
"""

from __future__ import annotations

import warnings

import numpy as np

from vbsvm.exceptions import ConvergenceWarning, InputError
from vbsvm.inference import dispatch, pooled
from vbsvm.inference.dispatch import Readout
from vbsvm.inference.ep import fit_calibrated
from vbsvm.inference.ep_selection import fit_calibrated_selection
from vbsvm.inference.failures import fit_call, numerical_failures
from vbsvm.inference.threads import limit_blas
from vbsvm.models.linear import (
    LinearSVMModel,
    covariance_arrays,
    fixed_effect_precision,
    meanfield_posterior,
    random_effect_terms,
)
from vbsvm.models.missing import (
    CUT_SVM_SWEEPS,
    CutImputedSVMModel,
    ImputedSVMModel,
    hyperparameters,
    imputation_spec,
)
from vbsvm.models.selection import LaplaceZeroModel, selection_setup
from vbsvm.results.diagnostics import summary_monitor
from vbsvm.results.fit import Fit, ThetaLayout
from vbsvm.results.imputed import ImputedFit
from vbsvm.results.selection import ImputedSelectionFit, SelectionFit
from vbsvm.settings import FitSettings

__all__ = ["fit_design", "fit_linear", "fit_laplace_zero", "fit_imputed", "random_effects_label"]


def fit_design(design, settings, prior=None):
    """Fit the model of ``design`` (:func:`vbsvm.svm` after checking its arguments).

    Parameters
    ----------
    design : vbsvm.formula.design.Design
    settings : vbsvm.settings.FitSettings or mapping
        The settings of :func:`vbsvm.svm` (:func:`~vbsvm.fitting.svm.fit_settings`); a mapping is
        checked into :class:`~vbsvm.settings.FitSettings` (:meth:`~vbsvm.settings.FitSettings.from_mapping`),
        as by every builder below.
    prior : vbsvm.LaplaceZero, optional

    Returns
    -------
    vbsvm.results.fit.Fit
        Or the subclass of the model (see the module docstring); its ``settings`` are ``settings``,
        with the prior's description (Laplace-zero) and the shape a Gibbs run kept when it was
        interrupted.
    """
    settings = FitSettings.from_mapping(settings)
    with fit_call(settings, prior):  # a numerical failure's advice is worded for this call
        if settings.missing == "impute":
            with numerical_failures("the imputation model"):
                fit = fit_imputed(design, settings, prior)
        elif prior is not None:
            fit = fit_laplace_zero(design, settings, prior)
        else:
            fit = fit_linear(design, settings)
    if fit.method == "gibbs":
        fit._warn_diagnostics()
    return fit


def random_effects_label(design) -> str:
    """`` with random intercepts`` / `` with random effects`` / ``""``, for the model's name."""
    if not design.groups:
        return ""
    return " with random intercepts" if all(g.is_intercept for g in design.groups) else " with random effects"


def _to_original(theta, model, M):
    """Draws or a point of theta with the fixed (dense) block mapped to the original scale by ``M``."""
    theta = np.array(theta, dtype=float, copy=True)
    theta[..., : model.qd] = theta[..., : model.qd] @ M.T
    return theta


# --------------------------------------------------------------------------- the linear SVM
def fit_linear(design, settings) -> Fit:
    """The linear SVM: penalty inferred, fixed or none; random intercepts and slopes."""
    settings = FitSettings.from_mapping(settings)
    method = settings.method
    model = LinearSVMModel.from_design(design, settings)
    layout = ThetaLayout.from_model(model, design)
    M = design.to_original(model.qd)
    info = {"model": "Bayesian linear SVM" + random_effects_label(design)}
    covariances = bool(model.covariance_components)

    def from_draws(draws):
        posterior = {"theta_draws": _to_original(draws["theta"], model, M), "sigma2_draws": draws["sigma2"],
                     "log_pseudo_likelihood": draws["log_pseudo_likelihood"]}
        if covariances:
            posterior["cov_draws"] = draws["cov"]
        return posterior

    def from_mode(res):
        posterior = {"theta_mode": _to_original(res.theta, model, M), "sigma2_mode": res.sigma2}
        if res.covs:
            posterior["cov_mode"] = np.concatenate([S.ravel() for S in res.covs])
        return posterior

    readout = Readout(
        record=("theta", "sigma2", "cov", "log_pseudo_likelihood"), from_draws=from_draws,
        from_vb=lambda res: meanfield_posterior(res.q, res.elbo, M, model), from_mode=from_mode,
        calibrated=lambda model: fit_calibrated(model, settings, M),
        monitor=summary_monitor(layout))
    with limit_blas(model.blas_work):  # the small products after the fit too
        posterior, run, settings = dispatch.fit(model, settings, readout)
    info.update(run)
    return Fit(design=design, layout=layout, settings=settings, method=method, posterior=posterior, info=info)


# --------------------------------------------------------------------------- Laplace-zero selection
def fit_laplace_zero(design, settings, prior):
    """The Laplace-zero selection model (``vbsvm.svm(..., prior=LaplaceZero(...))``), with random
    effects if the formula has them.

    Returns
    -------
    vbsvm.results.selection.SelectionFit

    Raises
    ------
    vbsvm.exceptions.InputError, vbsvm.exceptions.InputTypeError
        As :func:`~vbsvm.models.selection.selection_setup`.
    """
    settings = FitSettings.from_mapping(settings)
    method = settings.method
    select, rho = selection_setup(design, settings, prior)
    model = LaplaceZeroModel(design.X, design.y, random_effect_terms(design), select,
                             rho if rho != "auto" else prior.rho_grid[0], sigma2_beta=settings["sigma2_beta"],
                             A=settings["A_u"], B=settings["B_u"], re_df=settings.get("re_df"),
                             re_scale=settings.get("re_scale"),
                             intercept=design.column_names.index("Intercept") if design.has_intercept else None)
    base = model.base
    layout = ThetaLayout.from_model(base, design, variances=[c.name for c in model.vcomps])
    M = design.to_original(base.qd)
    settings = settings.replace(prior=prior.to_dict())
    info = {"model": "Bayesian linear SVM with Laplace-zero selection"
                     + random_effects_label(design).replace(" with", " and", 1),
            "n_selectable": int(select.sum()),
            "summary_notes": ["Selectable terms: the coefficient is u = gamma * v (exactly 0 when the term is "
                              "out); VB intervals of selectable terms are exact quantiles of q's spike-and-slab "
                              "mixture."]}
    vb_engine = None
    if rho == "auto":
        rho, res, curve = _choose_rho(model, prior.rho_grid, settings)
        info.update(rho_grid=[float(r) for r in prior.rho_grid], rho_elbo=[float(e) for e in curve],
                    rho_selection="ELBO of the mean-field VB fit on the grid rho_grid")
        vb_engine = lambda model, settings: res  # noqa: E731 - the grid's fit at the chosen rho
    model.set_rho(rho)
    hyper = model.hyperprior
    if hyper:
        info["rho_prior"] = [float(x) for x in model.rho_prior]
    else:
        info["rho"] = float(rho)
    sel_index = model.sel.astype(np.int64)

    def from_draws(draws):
        posterior = {"theta_draws": _to_original(draws["u"], base, M), "sigma2_draws": draws["sigma2"],
                     "log_pseudo_likelihood": draws["log_pseudo_likelihood"],
                     "gamma_draws": draws["gamma"].astype(np.int8), "sel_index": sel_index}
        if base.covariance_components:
            posterior["cov_draws"] = draws["cov"]
        if hyper:
            posterior["rho_draws"] = np.asarray(draws["rho"], dtype=float)
        return posterior

    readout = Readout(
        record=("u", "gamma", "sigma2", "log_pseudo_likelihood") + (("cov",) if base.covariance_components else ())
        + (("rho",) if hyper else ()),
        from_draws=from_draws, from_vb=lambda res: dict(laplace_zero_arrays(model, res, M), sel_index=sel_index),
        calibrated=lambda model: dict(laplace_zero_calibrated_arrays(model, settings, M), sel_index=sel_index),
        vb_engine=vb_engine,
        monitor=summary_monitor(layout))
    posterior, run, settings = dispatch.fit(model, settings, readout)
    info.update(run)
    if hyper:
        info["rho"] = laplace_zero_rho_mean(posterior)
    return SelectionFit(design=design, layout=layout, settings=settings, method=method, posterior=posterior,
                        info=info)


def _choose_rho(model, grid, settings):
    """Fit VB for every rho on the grid (same start) and keep the one with the largest ELBO."""
    curve, best = [], None
    failed = []
    for r in grid:
        model.set_rho(r)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            res = dispatch.meanfield(model, settings)
        if not res.converged:
            failed.append(r)
        curve.append(res.elbo[-1])
        if best is None or res.elbo[-1] > best[1].elbo[-1]:
            best = (r, res)
    if failed:
        warnings.warn(
            f"rho='auto': VB did not converge for rho in {failed}; their ELBO values are the last "
            "iterate's (increase max_iter or loosen tol).",
            ConvergenceWarning,
            stacklevel=5,
        )
    return best[0], best[1], curve


def laplace_zero_arrays(model, res, M):
    """Arrays stored by a mean-field SelectionFit: q's parameters and the moments of the
    effective coefficients u = gamma~ * theta on the original scale (what the Fit base class reads)."""
    q = res.q
    post = q["theta"]
    qd = model.qd
    Sds = post.cov_dense_sparse() if model.base.m_sparse else np.zeros((qd, 0))
    qv = q["variances"]
    out = _spike_slab_arrays(model, post.mean, post.diag_cov(), post.cov_dense(), Sds, q["gamma"], M)
    out.update(var_shape=np.atleast_1d(qv.a).astype(float), var_scale=np.atleast_1d(qv.b).astype(float),
               elbo=res.elbo, q_eta=q["eta"])
    if "mu_b" in q:  # the mean field's q(b) and chi (not in a pool of calibrated fits)
        out.update(q_b=np.asarray(q["mu_b"], float), q_chi=q["chi"])
    if "rho_shape" in q:  # q(rho) = Beta(a_q, b_q) under a hyperprior
        out["q_rho"] = np.asarray(q["rho_shape"], dtype=float)
    if model.base.m_sparse and model.base.q_sparse > 1:  # the random effects are always in (s = 1)
        out["theta_cov_ss_blocks"] = post.sparse_block_cov()
    if model.covs:
        out.update(covariance_arrays(q["covariances"]))
    return out


def laplace_zero_calibrated_arrays(model, settings, M):
    """Arrays stored by a calibrated SelectionFit (:func:`~vbsvm.inference.ep_selection.fit_calibrated_selection`):
    the spike-and-slab form of :func:`laplace_zero_arrays`, the variance grid and the EP evidence."""
    ep = fit_calibrated_selection(model, settings)
    out = _spike_slab_arrays(model, ep["mean"], ep["var"], ep["cov_dense"], ep["cov_ds"], ep["p_include"], M)
    keep = ("var_shape", "var_scale", "sigma2_mean", "sigma2_sd", "grid_eta", "grid_weights", "grid_log_density",
            "grid_step", "grid_p_include", "log_evidence", "info", "cov_draws", "theta_cov_ss_blocks", "q_rho",
            "rho_mean", "rho_sd")
    out.update({k: ep[k] for k in keep if k in ep}, elbo=np.array([ep["log_evidence"]]))
    return out


def laplace_zero_rho_mean(posterior) -> float:
    """Posterior mean of rho under its hyperprior: of the Gibbs draws, of the mean field's
    q(rho) = Beta(a_q, b_q), or of the calibrated fit's grid (NaN where the fit holds none: the
    pooled fits of ``missing="impute"``)."""
    if "rho_draws" in posterior:
        return float(np.mean(posterior["rho_draws"]))
    if "rho_mean" in posterior:
        return float(posterior["rho_mean"])
    if "q_rho" in posterior:
        a, b = np.asarray(posterior["q_rho"], dtype=float)
        return float(a / (a + b))
    return float("nan")


def _spike_slab_arrays(model, mu, var, Sdd, Sds, g, M):
    """The spike-and-slab q of the selectable terms (``u_k = gamma_k v_k``, ``gamma_k ~ Bernoulli(g_k)``,
    v Gaussian with mean ``mu``, marginal variances ``var`` and covariances ``Sdd``, ``Sds``;
    standardized scale) and the moments of the effective coefficients on the original scale."""
    qd = model.qd
    s = model.scaling(g)
    # effective coefficients: E[u] = s * mu; Cov(u_d) = (s s^T) * Sigma + diag(s (1 - s) Omega_kk)
    mean_eff = np.array(mu, dtype=float, copy=True)
    mean_eff[:qd] = s * mu[:qd]
    cov_eff = Sdd * np.outer(s, s)
    cov_eff[np.diag_indices(qd)] += s * (1.0 - s) * (var[:qd] + mu[:qd] ** 2)
    cov_ds = s[:, None] * Sds
    mean_o = mean_eff.copy()
    mean_o[:qd] = M @ mean_eff[:qd]
    cov_o = M @ cov_eff @ M.T
    var_o = np.array(var, dtype=float, copy=True)
    var_o[:qd] = np.diag(cov_o)
    return {"theta_mean": mean_o, "theta_var": var_o, "theta_cov_dense": cov_o, "theta_cov_ds": M @ cov_ds,
            "q_mean": mu, "q_var": var, "q_cov_dense": Sdd, "q_cov_ds": Sds, "q_gamma": g}


# --------------------------------------------------------------------------- missing predictors imputed
def _cut_svm_sweeps(settings) -> int:
    """``settings["cut_svm_sweeps"]`` (default :data:`~vbsvm.models.missing.CUT_SVM_SWEEPS`), checked."""
    k = settings.get("cut_svm_sweeps", CUT_SVM_SWEEPS)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"cut_svm_sweeps must be an integer >= 1 (SVM sweeps per draw of the imputations); got {k!r}.")
    return int(k)


def fit_imputed(design, settings, prior=None):
    """The Bayesian SVM with missing predictors imputed in the model (``missing="impute"``).

    Parameters
    ----------
    design : vbsvm.formula.design.Design
        Built with ``missing="impute"`` (NaN in the missing entries of ``design.X``).
    settings : vbsvm.settings.FitSettings or mapping
        The settings of :func:`vbsvm.svm` (a mapping is checked into
        :class:`~vbsvm.settings.FitSettings`): ``sigma2_mu``, ``Psi`` (number or d x d matrix on
        the standardized scale) and ``nu`` (paper defaults 1e8, 0.01 and 3); the options
        ``vb_completions``, the number of completions VB pools (default
        :data:`vbsvm.inference.pooled.VB_COMPLETIONS`; 0: one q with expectations over the
        imputations), and ``cut_svm_sweeps``, the SVM sweeps per draw of the imputations in the
        conditional model's Gibbs sampler (default :data:`~vbsvm.models.missing.CUT_SVM_SWEEPS`).
    prior : vbsvm.LaplaceZero, optional
        Laplace-zero selection of the fixed effects (conditional imputation only): the SVM block
        given each completed design is :class:`~vbsvm.models.selection.LaplaceZeroModel`; Gibbs
        runs its sweep after the imputation block, VB pools its fits over completions drawn from
        the imputation q (:func:`~vbsvm.inference.pooled.pooled_vb_cut`).

    Returns
    -------
    vbsvm.results.imputed.ImputedFit
        (:class:`vbsvm.results.selection.ImputedSelectionFit` with ``prior``).
    """
    settings = FitSettings.from_mapping(settings)
    method = settings.method
    if method not in ("vb", "gibbs"):
        raise InputError(f"method={method!r} is not available with missing='impute'; use method='vb' or "
                         "method='gibbs' (or missing='drop' for the posterior mode).")
    cut = settings.imputation == "conditional"  # checked by the settings' table
    if prior is not None and not cut:
        raise InputError("prior=LaplaceZero(...) with missing='impute' needs imputation='conditional' (the "
                         "default); the joint model's hinge feedback into the imputations is not covered.")
    completions = settings.get("vb_completions", pooled.VB_COMPLETIONS)
    spec = imputation_spec(design)
    hyper = hyperparameters(settings, spec.d)
    model, settings, selection = _imputation_model(design, settings, prior, spec, hyper)
    lin = model.linear
    layout = ThetaLayout.from_model(lin, design)
    M = design.to_original(lin.qd)
    info = _imputation_info(design, settings, model, spec, hyper, selection)
    if cut and method == "gibbs":
        model.svm_sweeps = _cut_svm_sweeps(settings)
        info["imputation"]["svm_sweeps"] = model.svm_sweeps
    fit_class = _imputed_fit_class(prior)
    read = _ImputedReadout(model, spec, M, selection=prior is not None, cut=cut)
    readout = Readout(
        record=("u" if prior is not None else "theta", "sigma2", "log_pseudo_likelihood", "x_missing", "mu", "Sigma")
        + (("gamma",) if cut else ()) + (("cov",) if lin.covariance_components else ())
        + (("incl",) if prior is not None else ()),
        from_draws=read.from_draws, from_vb=read.from_vb,
        calibrated=(lambda model: _calibrated_imputation(model, settings, read.from_vb)) if cut and completions > 0
        else None,
        not_calibrated="missing='impute' with " + ("the joint model" if not cut else "vb_completions=0"),
        vb_engine=pooled.pooled_vb_cut if cut and completions > 0 else None,
        monitor=summary_monitor(layout))
    posterior, run, settings = dispatch.fit(model, settings, readout)
    info.update(run)
    if method == "vb" and cut:
        info["imputation"].update(vb_iterations=int(model.imputation_q["iterations"]),
                                  vb_converged=bool(model.imputation_q["converged"]))
    fit = fit_class(design=design, layout=layout, settings=settings, method=method, posterior=posterior, info=info)
    fit.info["summary_notes"] = fit._imputation_notes()
    return fit


def _imputation_model(design, settings, prior, spec, hyper):
    """``(model, settings, selection)``: the imputation model of ``design`` (conditional or joint,
    as ``settings.imputation`` says), its SVM block the Laplace-zero model with a ``prior``;
    ``settings`` record the prior, ``selection`` is ``(selectable terms, rho)`` with a prior (else
    None)."""
    cut = settings.imputation == "conditional"
    sigma2_mu, Psi, nu = hyper
    fixed_precision = fixed_effect_precision(design, settings["penalty"], settings["sigma2_beta"])
    selection = None
    if prior is not None:
        if settings.method == "vb" and settings.get("vb_completions", pooled.VB_COMPLETIONS) < 1:
            raise InputError("prior=LaplaceZero(...) with missing='impute' pools VB fits over completions; "
                             "vb_completions must be >= 1.")
        selection = selection_setup(design, settings, prior)  # rho: a number or a Beta hyperprior
        fixed_precision = np.full(design.p, 1.0 / settings["sigma2_beta"])
        fixed_precision[selection[0]] = np.nan
        settings = settings.replace(prior=prior.to_dict())
    groups = random_effect_terms(design)
    if not cut and (spec.columns < 0).any():
        inter = [v for v in spec.variables if v is not None]
        raise InputError(
            f"imputation='joint' does not support predictors in interactions ({inter}): its hinge feeds back into "
            "the imputations through row-specific coefficients, which the paper's model does not cover. Use "
            "imputation='conditional' (the default), or remove the interaction terms of these predictors.")
    completion = spec.completion(design, design.raw, design.X)
    cls = CutImputedSVMModel if cut else ImputedSVMModel
    model = cls(design.X, design.y, groups, fixed_precision, spec.columns, A=settings["A_u"],
                B=settings["B_u"], sigma2_mu=sigma2_mu, Psi=Psi, nu=nu, completion=completion,
                re_df=settings.get("re_df"), re_scale=settings.get("re_scale"))
    if prior is not None:
        model.svm = LaplaceZeroModel(None, design.y, groups, *selection, sigma2_beta=settings["sigma2_beta"],
                                     A=settings["A_u"], B=settings["B_u"], base=model.linear)
    return model, settings, selection


def _imputation_info(design, settings, model, spec, hyper, selection):
    """The ``info`` of an imputed fit before the run: the model's name, the imputation model's
    description and, with a Laplace-zero prior (``selection``), the selection's."""
    sigma2_mu, Psi, nu = hyper
    info = {
        "model": "Bayesian linear SVM with imputed missing predictors"
                 + random_effects_label(design).replace(" with", " and", 1),
        "imputation": {
            "model": settings.imputation, "columns": list(spec.names),
            "n_missing": [int(x) for x in model.mask.sum(axis=0)],
            "n_incomplete_rows": int(model.mrows.size), "n_patterns": len(model.patterns),
            "sigma2_mu": sigma2_mu, "Psi": Psi.tolist(), "nu": nu, "prior_proper": bool(model.prior_proper),
        },
    }
    if selection is not None:
        select, rho = selection
        info["model"] = info["model"].replace("SVM with", "SVM with Laplace-zero selection,", 1)
        info.update(n_selectable=int(select.sum()))
        if model.svm.hyperprior:  # integrated by each method; its posterior is not kept by the pooled fits
            info.update(rho_prior=[float(x) for x in model.svm.rho_prior], rho=float("nan"))
        else:
            info["rho"] = float(rho)
    return info


class _ImputedReadout:
    """The posterior arrays of an imputed fit, on the original scale of the predictors, from the
    VB q (:meth:`from_vb`) or the Gibbs draws (:meth:`from_draws`)."""

    def __init__(self, model, spec, M, selection, cut):
        self.model, self.lin, self.M = model, model.linear, M
        self.center, self.scale = spec.center, spec.scale
        self.selection, self.cut = selection, cut

    def from_vb(self, res):
        model, lin, M, center, scale = self.model, self.lin, self.M, self.center, self.scale
        cc = model.cell_cols
        q = res.q
        if "theta_cov_ds" not in q:
            q["theta_cov_ds"] = q["theta"].cov_dense_sparse() if lin.m_sparse else np.zeros((lin.qd, 0))
        cov_d = M @ q["theta_cov_dense"] @ M.T
        mean = _to_original(q["theta_mean"], lin, M)
        var = q["theta_var"].copy()
        var[: lin.qd] = np.diag(cov_d)
        cell_var, rowcov = self._cell_covariances(q["blocks"])
        Sg = np.outer(scale, scale)
        posterior = {
            "theta_mean": mean, "theta_var": var, "theta_cov_dense": cov_d,
            "theta_cov_ds": M @ q["theta_cov_ds"],
            "var_shape": np.atleast_1d(q["variances"].a) if lin.variance_components else np.zeros(0),
            "var_scale": np.atleast_1d(q["variances"].b) if lin.variance_components else np.zeros(0),
            "elbo": res.elbo,
            "x_missing_mean": center[cc] + scale[cc] * q["cells_mean"],
            "x_missing_sd": np.sqrt(cell_var),
            "x_missing_rowcov": rowcov,
            "mu_mean": center + scale * q["mu_mean"],
            "mu_cov": q["mu_cov"] * Sg,
            "Sigma_scale": q["Sigma"].scale * Sg,
            "Sigma_df": np.float64(q["Sigma"].df),
        }
        if lin.covariance_components:
            posterior.update(covariance_arrays(q["covariances"]))
        if lin.m_sparse and lin.q_sparse > 1:  # each level's q x q block of the slope term
            posterior["theta_cov_ss_blocks"] = (q["theta_cov_ss_blocks"] if "theta_cov_ss_blocks" in q
                                                else q["theta"].sparse_block_cov())
        if self.selection:  # the effective coefficients u = gamma~ * theta and the Laplace-zero q
            posterior.update(laplace_zero_arrays(model.svm, res, M), sel_index=model.svm.sel.astype(np.int64))
        if self.cut:
            posterior["class_means_mean"] = center + scale * q["class_means"]
            posterior["class_means_cov"] = q["class_mean_covs"] * Sg
        return posterior

    def _cell_covariances(self, blocks):
        """The missing cells' variances and each incomplete row's covariance block (rows padded
        to the largest pattern), on the original scale, from the q blocks of the patterns."""
        model, scale = self.model, self.scale
        cell_var = np.empty(model.n_cells)
        dmax = max((p.m for p in model.patterns), default=0)
        rowcov = np.zeros((model.mrows.size, dmax, dmax))
        for pat, blk in zip(model.patterns, blocks):
            V, g = blk["V"], blk["g"]
            cov = np.einsum("jk,ik,lk->ijl", V, g, V) * np.outer(scale[pat.miss], scale[pat.miss])
            rowcov[pat.pos, : pat.m, : pat.m] = cov
            cell_var[pat.cells] = np.einsum("ijj->ij", cov)
        return cell_var, rowcov

    def from_draws(self, draws):
        model, lin, M, center, scale = self.model, self.lin, self.M, self.center, self.scale
        cc = model.cell_cols
        posterior = {
            "theta_draws": _to_original(draws["u" if self.selection else "theta"], lin, M),
            "sigma2_draws": draws["sigma2"], "log_pseudo_likelihood": draws["log_pseudo_likelihood"],
            "x_missing_draws": center[cc] + scale[cc] * draws["x_missing"],
            "mu_draws": center + scale * draws["mu"],
            "Sigma_draws": draws["Sigma"] * np.outer(scale, scale),
        }
        if self.cut:
            posterior["gamma_draws"] = scale * draws["gamma"]
        if lin.covariance_components:
            posterior["cov_draws"] = draws["cov"]
        if self.selection:  # "gamma_draws" are the indicators of a selection fit
            posterior.update(label_effect_draws=posterior.pop("gamma_draws"),
                             gamma_draws=draws["incl"].astype(np.int8), sel_index=model.svm.sel.astype(np.int64))
        return posterior


def _calibrated_imputation(model, settings, from_vb):
    """The calibrated fit of the conditional imputation model: EP fits pooled over completions
    (:func:`~vbsvm.inference.pooled.pooled_vb_cut` with ``calibrated=True``), read like the
    mean-field pool; the log evidence averaged over completions stands in the ELBO's place."""
    res = pooled.pooled_vb_cut(model, settings, calibrated=True)
    posterior = from_vb(res)
    posterior["info"] = dict(res.info, n_sweeps=res.n_sweeps, seconds=res.seconds,
                             completions_converged=bool(res.converged))
    return posterior


def _imputed_fit_class(prior):
    """:class:`~vbsvm.results.selection.ImputedSelectionFit` with a Laplace-zero ``prior``, else
    :class:`~vbsvm.results.imputed.ImputedFit`."""
    if prior is None:

        return ImputedFit

    return ImputedSelectionFit


def check_re_prior(design, settings, prior):
    """The IW prior of every random-effect term with slopes must fit its dimension."""
    for g in design.groups:
        if g.q == 1:
            continue
        if settings["re_df"] is not None and not settings["re_df"] > g.q - 1:
            raise InputError(f"re_df must exceed q - 1 = {g.q - 1} for the term ({g.lhs} | {g.name}) with "
                             f"{g.q} columns; got {settings['re_df']}.")
        if settings["re_scale"] is not None:
            S = np.asarray(settings["re_scale"])
            if S.shape != (g.q, g.q) or not np.allclose(S, S.T) or np.any(np.linalg.eigvalsh(S) <= 0):
                raise InputError(f"re_scale must be a symmetric positive definite {g.q} x {g.q} matrix for the "
                                 f"term ({g.lhs} | {g.name}); got shape {S.shape}.")
    if any(g.q > 1 or not g.is_intercept for g in design.groups) and settings["missing"] == "impute" \
            and settings.get("imputation", "conditional") == "joint":
        raise InputError("random slopes are not supported with imputation='joint' (the paper's model); use "
                         "imputation='conditional' (the default), random intercepts (1 | g), or drop the slope term.")
