"""VB of the conditional (cut) imputation model as a mixture over completions.

The engine of ``method="vb"`` and ``"meanfield"`` with ``missing="impute"`` and
``imputation="conditional"``: :func:`pooled_vb_cut` fits the imputation model's q, then the
SVM's posterior approximation to each of ``K`` completions drawn from it (the mean-field q, or
with ``calibrated=True`` the EP fit integrated over the variances of
:func:`vbsvm.inference.ep.fit_calibrated`), and pools them (Rubin's rules).
"""

from __future__ import annotations

import numpy as np

from vbsvm.distributions import InverseGamma, InverseWishart
from vbsvm.inference.ep import fit_calibrated
from vbsvm.inference.ep_selection import fit_calibrated_selection
from vbsvm.inference.progress import progress_bar
from vbsvm.inference.vb import VBResult, coordinate_ascent

__all__ = ["pooled_vb_cut", "PooledGaussian"]

#: Completions pooled by default (``settings["vb_completions"]`` overrides it).
VB_COMPLETIONS = 20


def pooled_vb_cut(model, settings, calibrated=False):
    r"""VB of the cut model as a mixture over completions (the default VB of
    ``imputation="conditional"``).

    The cut posterior of the SVM is by definition a mixture over the imputation posterior,
    :math:`p_{cut}(\theta) = \int p(\theta \mid y, D_{obs}, D_{mis})\, p(D_{mis} \mid D_{obs}, y)\, dD_{mis}`.
    We fit the imputation model's q first (:meth:`~vbsvm.models.missing.CutImputedSVMModel.fit_imputation_vb`), draw
    ``K = settings.get("vb_completions", 20)`` completions :math:`D^{(k)}_{mis} \sim q(D_{mis})`
    (seeded by ``seed``), fit the linear SVM's mean-field q (Algorithm 2) to each completed data
    set, and return the moment-matched Gaussian of the mixture
    :math:`K^{-1}\sum_k q_k(\theta)` (mean: average of the means; covariance: average covariance
    plus the covariance of the means, Rubin's rules), of the variances (an inverse gamma with
    the mixture's mean and variance) and of each random-effect covariance (the inverse Wishart
    with the completions' common degrees of freedom and their average scale, i.e. the mixture's
    mean).

    Why not a single q with expectations over q(D_mis)? That factor (``vb_completions=0``;
    :meth:`~vbsvm.models.missing.CutImputedSVMModel.vb_sweep`) is the optimum of the mean-field KL to the cut target,
    :math:`q(\theta) \propto \exp E_{q(D)} \log p(\theta \mid y, D)`: a *geometric* mean of the
    completed-data posteriors whose augmented quadratic penalises the imputed columns'
    coefficients by :math:`\sum_i w_i \beta_M^T\mathrm{Cov}(d_{i,M})\beta_M` (errors-in-variables
    attenuation): measured 0.9-1.0 Gibbs sd below the cut Gibbs sampler on the simulated test
    data, where the pooled mixture is within 0.1 sd.

    With ``calibrated=True`` (the default ``method="vb"``) each completion is fitted by
    :func:`vbsvm.inference.ep.fit_calibrated` instead, or with the Laplace-zero prior by
    :func:`vbsvm.inference.ep_selection.fit_calibrated_selection`, and its ``log_evidence`` takes
    the place of the ELBO; each random-effect covariance is then pooled as the inverse Wishart
    with the mixture's mean and the diagonal's variance (within plus between completions,
    :func:`_pooled_inverse_wishart`).

    Returns
    -------
    vbsvm.inference.vb.VBResult
        ``q`` holds the pooled ``theta_mean``, ``theta_var``, ``theta_cov_dense``,
        ``theta_cov_ds``, ``variances`` and the imputation q; ``elbo`` (one value) the average of
        the completions' final ELBOs (a Monte Carlo estimate of ``E_q(D_mis)`` of the completed-data
        bound), each in ``info["completion_elbos"]``.
    """
    K = int(settings.get("vb_completions", VB_COMPLETIONS))
    lin, svm = model.linear, model.svm
    selection = svm is not lin
    model.vb_initial_state()  # fits the imputation q
    iq = model.imputation_q
    seed = settings.get("draw_seed", settings.get("seed"))
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
    means, dcovs, vars_, ds, s_mean, s_var, elbos, cov_moments = [], [], [], [], [], [], [], []
    blocks, extra = [], {}
    slope_blocks = lin.m_sparse and lin.q_sparse > 1
    sweeps, converged, seconds, strategies = 0, True, 0.0, set()
    bar = progress_bar(K, "imputation completions", bool(settings.get("progress", False)))
    for _ in range(K):
        model.set_cells(model._draw_blocks(iq["blocks"], iq["cells"], rng))
        if selection:
            svm.refresh_design()
        fitted = (_calibrated_completion if calibrated else _meanfield_completion)(svm, lin, settings)
        means.append(fitted["mean"])
        dcovs.append(fitted["cov_dense"])
        vars_.append(fitted["var"])
        ds.append(fitted["cov_ds"])
        if slope_blocks:
            blocks.append(fitted["ss_blocks"])
        if selection:  # q(gamma) and, for the mean field, q(b) and chi
            for key in ("gamma", "mu_b", "chi"):
                if key in fitted["q"]:
                    extra.setdefault(key, []).append(np.asarray(fitted["q"][key], dtype=float))
        if lin.variance_components:
            s_mean.append(fitted["sigma2_mean"])
            s_var.append(fitted["sigma2_var"])
        cov_moments.append(fitted.get("cov_moments", []) if calibrated
                           else [qc.scale for qc in fitted["q"]["covariances"]])
        elbos.append(fitted["elbo"])
        sweeps += fitted["sweeps"]
        converged &= fitted["converged"]
        seconds += fitted["seconds"]
        strategies.add(fitted.get("strategy"))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    model.set_cells(iq["cells"])
    means = np.array(means)
    mean = means.mean(axis=0)
    dev = means - mean
    bdiv = max(K - 1, 1)
    pooled = {
        "theta_mean": mean,
        "theta_cov_dense": np.mean(dcovs, axis=0) + dev[:, :lin.qd].T @ dev[:, :lin.qd] / bdiv,
        "theta_var": np.mean(vars_, axis=0) + (dev ** 2).sum(axis=0) / bdiv,
        "theta_cov_ds": np.mean(ds, axis=0) + dev[:, :lin.qd].T @ dev[:, lin.qd:] / bdiv,
    }
    if slope_blocks:
        ds_dev = dev[:, lin.qd:].reshape(K, lin.m_sparse, lin.q_sparse)
        pooled["theta_cov_ss_blocks"] = np.mean(blocks, axis=0) + np.einsum("kli,klj->lij", ds_dev, ds_dev) / bdiv
    if selection:  # the Laplace-zero q: inclusion probabilities and q(b), chi averaged over completions
        pooled.update({key: np.mean(v, axis=0) for key, v in extra.items()})
        g = np.clip(pooled["gamma"], 1e-300, 1.0 - 1e-16)
        pooled["eta"] = np.log(g) - np.log1p(-g)
        pooled["theta"] = PooledGaussian(pooled, lin.qd)
    if lin.variance_components:
        m = np.mean(s_mean, axis=0)
        v = np.mean(s_var, axis=0) + np.var(s_mean, axis=0)
        a = m ** 2 / v + 2.0
        pooled["variances"] = InverseGamma(a, m * (a - 1.0))
    else:
        pooled["variances"] = None
    if calibrated:
        pooled["covariances"] = [_pooled_inverse_wishart(moments) for moments in zip(*cov_moments)]
    else:  # every completion's q(Sigma_k) has df = df_k + m_k: the average scale gives the mixture's mean
        pooled["covariances"] = [InverseWishart(np.mean(S, axis=0), c.df + len(c.index))
                                 for c, S in zip(lin.covariance_components, zip(*cov_moments))]
    cm, cc = iq["means"], iq["mean_covs"]
    pooled.update(cells_mean=iq["cells"], blocks=iq["blocks"], Sigma=iq["Sigma"], class_means=cm,
                  class_mean_covs=cc, mu_mean=cm.mean(axis=0), mu_cov=cc.sum(axis=0) / 4.0)
    return VBResult(q=pooled, state=np.zeros(0), elbo=np.array([np.mean(elbos)]), converged=bool(converged),
                    n_sweeps=sweeps, seconds=seconds,
                    info={"vb_completions": K, "completion_elbos": [float(e) for e in elbos],
                          # the integration rule of the calibrated fits, when they all used the same
                          **({"strategy": strategies.pop()} if calibrated and len(strategies) == 1 else {})})


#: draws of each completion's covariance mixture from which its moments are pooled
COVARIANCE_DRAWS = 2000


def _pooled_inverse_wishart(moments):
    r"""The inverse Wishart moment-matched to a mixture over completions of one covariance's
    posteriors, each given by ``(mean, variances of the diagonal)``: the mixture's mean, and the
    degrees of freedom of :math:`\mathrm{Var}(\Sigma_{ii}) = 2 E[\Sigma_{ii}]^2/(\nu - q - 3)` averaged over
    the diagonal."""
    means = np.array([m for m, _ in moments])
    mean = means.mean(axis=0)
    var = np.mean([v for _, v in moments], axis=0) + np.var(np.diagonal(means, axis1=1, axis2=2), axis=0)
    q = mean.shape[0]
    d = np.diag(mean)
    df = q + 3.0 + float(np.mean(2.0 * d * d / np.maximum(var, 1e-300)))
    return InverseWishart(mean * (df - q - 1.0), df)


def _draw_moments(cov_draws, dims) -> list:
    """``(mean, variances of the diagonal)`` of each covariance from draws (..., sum q^2)."""
    C = cov_draws.reshape(-1, cov_draws.shape[-1])
    out, at = [], 0
    for q in dims:
        S = C[:, at:at + q * q].reshape(-1, q, q)
        out.append((S.mean(axis=0), np.diagonal(S, axis1=1, axis2=2).var(axis=0)))
        at += q * q
    return out


def _meanfield_completion(svm, lin, settings) -> dict:
    """The mean-field q of one completed data set, in the form :func:`pooled_vb_cut` pools."""
    res = coordinate_ascent(svm, tol=settings["tol"], max_iter=settings["max_iter"], accelerate=settings["accelerate"])
    q = res.q
    out = {"q": q, "mean": q["theta_mean"], "cov_dense": q["theta"].cov_dense(), "var": q["theta_var"],
           "cov_ds": q["theta"].cov_dense_sparse() if lin.m_sparse else np.zeros((lin.qd, 0)),
           "elbo": res.elbo[-1], "sweeps": res.n_sweeps, "converged": res.converged, "seconds": res.seconds}
    if lin.m_sparse and lin.q_sparse > 1:
        out["ss_blocks"] = q["theta"].sparse_block_cov()
    if lin.variance_components:
        a, b = np.atleast_1d(q["variances"].a), np.atleast_1d(q["variances"].b)
        out["sigma2_mean"] = b / (a - 1.0)  # a = A + m/2 > 1 for every component with m >= 2
        out["sigma2_var"] = np.where(a > 2.0, b ** 2 / ((a - 1.0) ** 2 * np.maximum(a - 2.0, 1e-12)), np.inf)
    return out


def _calibrated_completion(svm, lin, settings) -> dict:
    """The calibrated EP fit of one completed data set: :func:`~vbsvm.inference.ep.fit_calibrated`,
    or with the Laplace-zero prior :func:`~vbsvm.inference.ep_selection.fit_calibrated_selection`
    (its slab Gaussian in the place of q(theta), its inclusion probabilities in that of q(gamma))."""
    draws = COVARIANCE_DRAWS if lin.covariance_components else 1  # only the covariances' moments use them
    if svm is lin:
        ep = fit_calibrated(lin, dict(settings, chains=1, draws=draws))
        out = {"mean": ep["theta_mean"], "cov_dense": ep["theta_cov_dense"], "var": ep["theta_var"],
               "cov_ds": ep["theta_cov_ds"], "q": {}}
    else:
        ep = fit_calibrated_selection(svm, dict(settings, chains=1, draws=draws))
        out = {"mean": ep["mean"], "cov_dense": ep["cov_dense"], "var": ep["var"], "cov_ds": ep["cov_ds"],
               "q": {"gamma": ep["p_include"]}}
    if lin.covariance_components:
        out["cov_moments"] = _draw_moments(ep["cov_draws"], [c.index.shape[1] for c in lin.covariance_components])
    if "theta_cov_ss_blocks" in ep:
        out["ss_blocks"] = ep["theta_cov_ss_blocks"]
    info = ep["info"]
    return dict(out, sigma2_mean=ep["sigma2_mean"], sigma2_var=ep["sigma2_sd"] ** 2, elbo=ep["log_evidence"],
                sweeps=info["n_sweeps"], converged=info["unconverged"] == 0, seconds=info["seconds_total"],
                strategy=info.get("strategy"))


class PooledGaussian:
    """The moment-matched Gaussian of :func:`pooled_vb_cut` in the interface of
    :class:`~vbsvm.models.linear.CoefficientPosterior` that the fits read (``mean``,
    ``diag_cov``, ``cov_dense``, ``cov_dense_sparse``, ``sparse_block_cov``)."""

    def __init__(self, pooled, qd):
        self.mean = pooled["theta_mean"]
        self.mean_dense, self.mean_sparse = self.mean[:qd], self.mean[qd:]
        self._p = pooled

    def diag_cov(self):
        return self._p["theta_var"]

    def cov_dense(self):
        return self._p["theta_cov_dense"]

    def cov_dense_sparse(self):
        return self._p["theta_cov_ds"]

    def sparse_block_cov(self):
        return self._p["theta_cov_ss_blocks"]
