"""Convergence diagnostics of the sampled linear fits: R-hat and ESS tables, the monitor that
extends a Gibbs run until its summary parameters converge, and the warning when they do not."""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
import pandas as pd
import xarray as xr

from vbsvm.exceptions import DiagnosticWarning
from vbsvm.inference.gibbs import ESS_TARGET, RHAT_TARGET

__all__ = ["DiagnosticsMixin", "diagnostics_table", "is_summary_variable", "summary_monitor", "warn_unconverged"]


class DiagnosticsMixin:
    """The diagnostics of a linear fit's Gibbs draws (:class:`~vbsvm.results.fit.Fit`)."""

    def diagnostics(self) -> pd.DataFrame | None:
        """R-hat (rank-normalized), bulk/tail ESS and MCSE of every parameter (Gibbs only)."""
        if not self._post.sampled:
            return None
        if "diagnostics" not in self._cache:
            self._cache["diagnostics"] = self._compute_diagnostics()
        return self._cache["diagnostics"].copy()

    def _compute_diagnostics(self) -> pd.DataFrame:
        post = self._posterior_dataset()
        if "summary_diagnostics" in self._cache and all(is_summary_variable(v) for v in post.data_vars):
            return self._cache["summary_diagnostics"].copy()  # the fit's warning check made this very table
        return diagnostics_table(post)

    def summary_diagnostics(self) -> pd.DataFrame | None:
        """:meth:`diagnostics` of the summary parameters only: the fixed effects ``beta[...]`` and
        the variance components ``sigma2*`` (not the random-effect levels, imputations or
        indicators). Gibbs runs are extended until these reach R-hat <= 1.01 and bulk ESS >= 400
        (see ``max_draws`` of :func:`vbsvm.svm`), and the fit warns if they do not."""
        if not self._post.sampled:
            return None
        if "summary_diagnostics" not in self._cache:
            post = self._posterior_dataset()
            with np.errstate(invalid="ignore", divide="ignore"):  # a constant (an excluded term): NaN
                self._cache["summary_diagnostics"] = diagnostics_table(
                    post[[v for v in post.data_vars if is_summary_variable(v)]])
        return self._cache["summary_diagnostics"].copy()

    def _warn_diagnostics(self):
        """Warn if the summary parameters miss R-hat <= 1.01 or bulk ESS >= 400 (see
        :func:`warn_unconverged`)."""
        diag = self.summary_diagnostics()
        if diag is not None:
            warn_unconverged(diag, int(self.posterior["theta_draws"].shape[1]), self.info, stacklevel=5,
                             hint=self._separable_hint)

    def _separable_hint(self) -> str:
        """The cause a Gibbs fit with ``penalty="auto"`` misses its targets on separable data (an
        empty string otherwise): the pseudo-likelihood is 1 on a cone of separating coefficients,
        so the posterior of ``sigma2_u`` keeps the tail ``sigma2_u^(-A_u - 1)`` of its prior and
        the coefficients' posterior means do not exist for ``A_u <= 1/2`` (the Section 4.2
        simulation with d = 100: ``sigma2_u`` draws around 1e3-1e4, against 0.6 with d = 50)."""
        s = self.settings
        if s.get("penalty") != "auto" or s.get("prior") is not None or "sigma2_u" not in self.layout.variances:
            return ""
        if not self.design.linearly_separable():
            return ""
        draws = self._draws()[1][..., list(self.layout.variances).index("sigma2_u")]
        return (f" The data are linearly separable, so under penalty='auto' the posterior of sigma2_u keeps the "
                f"tail of its IG({s['A_u']:g}, {s['B_u']:g}) prior (the coefficients' posterior means do not exist "
                f"for A_u <= 1/2); its draws here have median {np.median(draws):.3g} and reach "
                f"{np.max(draws):.3g}. Where they are that large and do not settle, longer chains will not help: "
                "fix the penalty (penalty=<float>) instead.")


def summary_monitor(layout):
    """The ``monitor`` of a linear model's Gibbs run (:class:`~vbsvm.inference.dispatch.Readout`):
    R-hat and bulk ESS of the summary parameters, from the posterior arrays of the draws so far.

    Parameters
    ----------
    layout : vbsvm.results.fit.ThetaLayout

    Returns
    -------
    callable
        ``monitor(posterior) -> pandas.DataFrame`` with columns ``r_hat`` and ``ess_bulk``, rows
        as :meth:`DiagnosticsMixin.summary_diagnostics` (the same numbers, without a fit object).
    """
    return functools.partial(_summary_draw_diagnostics, layout=layout)


def _summary_draw_diagnostics(posterior, layout) -> pd.DataFrame:
    """R-hat and bulk ESS of ``beta``, the variances and the slope terms' ``sigma2_<term>`` in the
    Gibbs arrays ``posterior`` (``theta_draws``, ``sigma2_draws``, ``cov_draws``)."""
    from arviz_stats import ess, rhat

    theta, sig = posterior["theta_draws"], posterior["sigma2_draws"]
    shape = theta.shape[:2]
    arrays = [np.moveaxis(theta[..., : layout.p], -1, 0)] + [sig[..., k] for k in range(len(layout.variances))]
    names = [f"beta[{c}]" for c in layout.fixed] + list(layout.variances)
    at = 0
    for name in layout.covariances:
        cols = layout.columns_of(name)
        q = len(cols)
        S = posterior["cov_draws"].reshape(-1, posterior["cov_draws"].shape[-1])[:, at:at + q * q]
        at += q * q
        sd = np.sqrt(np.diagonal(S.reshape(shape + (q, q)), axis1=-2, axis2=-1))
        arrays.append(np.moveaxis(sd ** 2, -1, 0))
        names.extend(f"sigma2_{name}[{c}]" for c in cols)
    cols = {"r_hat": [], "ess_bulk": []}
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant (an excluded term): NaN
        for a in arrays:
            cols["r_hat"].extend(np.ravel(rhat(a, chain_axis=-2, draw_axis=-1)).tolist())
            cols["ess_bulk"].extend(np.ravel(ess(a, method="bulk", chain_axis=-2, draw_axis=-1)).tolist())
    return pd.DataFrame(cols, index=pd.Index(names, name="parameter"))


def warn_unconverged(diag, draws, info, stacklevel=2, hint=None):
    """Warn (:class:`~vbsvm.exceptions.DiagnosticWarning`) if the diagnostics ``diag`` (columns
    ``r_hat``, ``ess_bulk``) miss R-hat <= 1.01 or bulk ESS >= 400, naming the worst parameter and
    the draws per chain that would reach the targets; ``draws`` are the draws per chain kept and
    ``info`` the fit's run-length record (``max_draws``, ``draws_extended``). ``hint``, called
    only then, returns text appended to the warning (a likely cause)."""

    bad_r = diag.index[diag["r_hat"] > RHAT_TARGET].tolist()
    bad_e = diag.index[diag["ess_bulk"] < ESS_TARGET].tolist()
    if not (bad_r or bad_e):
        return
    worst = diag["ess_bulk"].idxmin() if bad_e else diag["r_hat"].idxmax()
    ess = max(float(diag.loc[worst, "ess_bulk"]), 1.0)
    rhat = float(diag.loc[worst, "r_hat"])
    # ESS grows about linearly with the draws once the chains have mixed; R-hat - 1 like 1 / ESS
    factor = max(ESS_TARGET / ess, (rhat - 1.0) / (RHAT_TARGET - 1.0))
    needed = int(math.ceil(draws * factor / 100.0) * 100)
    capped = info.get("max_draws")
    extended = (f"the run was extended to max_draws={capped} per chain, too few; " if capped and
                info.get("draws_extended") and draws >= capped else "")
    warnings.warn(
        "Gibbs diagnostics: "
        + (f"R-hat > {RHAT_TARGET} for {bad_r[:5]}{' ...' if len(bad_r) > 5 else ''}; " if bad_r else "")
        + (f"bulk ESS < {ESS_TARGET} for {bad_e[:5]}{' ...' if len(bad_e) > 5 else ''}; " if bad_e else "")
        + extended
        + f"the worst is {worst} (bulk ESS {ess:.0f}, R-hat {rhat:.3f} from {draws} draws per chain): "
        f"about draws={needed} per chain (and tune at least as long) would reach the targets — run "
        "longer chains (or pass a larger max_draws) before trusting intervals." + (hint() if hint else ""),
        DiagnosticWarning,
        stacklevel=stacklevel,
    )


def is_summary_variable(name: str) -> bool:
    """True for the posterior variables the convergence targets are about: ``beta`` (fixed
    effects) and ``sigma2*`` (variance components, including those of random-slope terms)."""
    return name == "beta" or name.startswith("sigma2")


def diagnostics_table(post: xr.Dataset) -> pd.DataFrame:
    """R-hat (rank-normalized), bulk/tail ESS and MCSE of every scalar of a posterior dataset with
    dims ``(chain, draw, ...)``; rows ``var`` or ``var[coord,...]``."""
    from arviz_stats import ess, mcse, rhat

    cols = {}
    for label, value in (("r_hat", rhat(post)), ("ess_bulk", ess(post, method="bulk")),
                         ("ess_tail", ess(post, method="tail")), ("mcse_mean", mcse(post))):
        cols[label] = [x for var in post.data_vars for x in np.ravel(value[var].values).tolist()]
    names = []
    for var in post.data_vars:
        da = post[var]
        extra = [d for d in da.dims if d not in ("chain", "draw")]
        if extra:
            names.extend(f"{var}[{','.join(map(str, c))}]"
                         for c in itertools.product(*(da[d].values for d in extra)))
        else:
            names.append(var)
    return pd.DataFrame(cols, index=pd.Index(names, name="parameter"))
