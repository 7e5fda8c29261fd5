"""A fitted sparse-GP Bayesian SVM (:class:`GPFit`): summary, predictions, draws, LOO, ArviZ and files.

:class:`GPFit` implements the result contract of :class:`~vbsvm.results.contract.FitResult` with
the same signatures as the linear fits. The GP has no coefficients: its ``coef`` / ``params`` are
the kernel hyperparameters (point estimates, so ``bse``, intervals and ``cov_params`` are NaN), its
posterior draws are the inducing values ``u`` and :func:`vbsvm.compare` lines up the latent score
``f`` at common rows.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import xarray as xr
from statsmodels.iolib.table import SimpleTable

from vbsvm import validation
from vbsvm.inference.svi import FitState
from vbsvm.models.gp import (
    InducingGP,
    Kernel,
    WhitenedGaussian,
    inducing_values,
)
from vbsvm.results.contract import FitResult, SummaryParts
from vbsvm.results.diagnostics import diagnostics_table
from vbsvm.results.fit import interval_names
from vbsvm.results.gp_export import GPExportMixin
from vbsvm.results.gp_prediction import GPPredictionMixin, bound_log_pseudo_likelihood
from vbsvm.results.marginal import Marginal
from vbsvm.results.summary import WIDTH
from vbsvm.settings import GPSettings

__all__ = ["GPFit", "bound_log_pseudo_likelihood"]  # the latter from gp_prediction

class GPFit(GPPredictionMixin, GPExportMixin, FitResult):
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
        self.settings = GPSettings.from_mapping(settings or {})  # frozen, checked

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
        """Wall time of the fit (the whole :func:`vbsvm.gpsvm` call when fitted by it)."""
        return self._state.seconds

    def record_fit_time(self, seconds) -> "GPFit":
        """Record ``seconds``, the wall time of the whole call that built this fit, as its time
        (called by :func:`vbsvm.gpsvm` before it returns the fit); returns the fit."""
        self._state.seconds = float(seconds)
        return self

    @property
    def hyperparameters(self) -> pd.DataFrame:
        """Learned kernel hyperparameters (natural scale) with their starting values."""
        names = self.kernel.param_names()
        tr = self._state.theta_trace
        return pd.DataFrame({"value": np.exp(self.kernel.theta),
                             "start": np.exp(tr[0]) if len(tr) else np.nan}, index=names)

    def coef_table(self, level=None) -> pd.DataFrame:
        """The GP's parameter table: the kernel hyperparameters as ``mean`` (their point estimates,
        maximizing the ELBO or fixed), with ``sd`` and interval NaN (no posterior over them)."""
        lo_name, hi_name = interval_names(self._level(level))
        h = self.hyperparameters
        return pd.DataFrame({"mean": h["value"], "sd": np.nan, lo_name: np.nan, hi_name: np.nan})

    def coefficient_covariance(self) -> np.ndarray:
        """NaN: the hyperparameters are point estimates."""
        k = len(self.kernel.param_names())
        return np.full((k, k), np.nan)

    @property
    def u_mean(self):
        """Posterior mean of the inducing values u = L v."""
        if self.gibbs_draws is not None:
            return self.blocks.L @ self.gibbs_draws.reshape(-1, self.n_inducing).mean(0)
        return self.blocks.L @ self.q.mean

    # -- draws (pure: the fit is never changed) ----------------------------------------------
    @property
    def sampled(self) -> bool:
        """True for Gibbs fits."""
        return self.gibbs_draws is not None

    @property
    def point(self) -> bool:
        """False: every GP fit has a posterior over the inducing values."""
        return False

    @property
    def draw_shape(self) -> tuple:
        """``(chains, draws)``: the Gibbs chains' shape, else ``settings`` (default 4 x 1000)."""
        if self.gibbs_draws is not None:
            return tuple(int(v) for v in self.gibbs_draws.shape[:2])
        return self._shape(None, None)

    def _shape(self, chains, draws):
        return (int(self.settings.get("chains", 4) if chains is None else chains),
                int(self.settings.get("draws", 1000) if draws is None else draws))

    def _v_draws(self, chains=None, draws=None, seed=0):
        """Draws (chains, draws, m) of the whitened inducing values v (u = L v): the Gibbs chains,
        or iid draws from q(v) of the requested shape (seeded)."""
        if self.gibbs_draws is not None:
            return self.gibbs_draws
        ch, dr = self._shape(chains, draws)
        return self.q.sample(np.random.default_rng(seed), ch * dr).reshape(ch, dr, -1)

    def draws(self, chains=None, draws=None, seed=None) -> xr.Dataset:
        """Draws of the inducing values ``u`` (chain, draw, inducing): the Gibbs chains, or iid
        draws from q(u) in the shape ``chains`` x ``draws`` (default :attr:`draw_shape`) with
        ``seed`` (default 0: repeated calls agree). The fit itself is not changed."""
        seed = 0 if seed is None else validation.seed(seed)
        return self._posterior_dataset(self._v_draws(chains, draws, seed))

    def f_draws(self, newdata, chains=None, draws=None, seed=0):
        """Draws of the latent score f at rows of ``newdata``.

        ``f = A v + sqrt(k~) e`` (``e`` standard normal: f given u has variance k~), v as in
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
        V = self._v_draws(chains, draws, seed)
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        return V @ A.T + np.sqrt(kt) * rng.standard_normal(V.shape[:2] + (kt.size,))

    def with_draw_shape(self, chains, draws):
        """The same fit with ``(chains, draws)`` as its default VB draw shape (a new object;
        this one is not changed). A Gibbs fit returns itself."""
        if self.sampled:
            return self
        return GPFit(self._state, self.method, self.n_obs, self.n_features, design=self.design,
                     formula=self.formula, gibbs_draws=self.gibbs_draws,
                     settings={**self.settings, "chains": int(chains), "draws": int(draws)})

    def _posterior_dataset(self, V=None):
        """Dataset with ``u`` (chain, draw, inducing) from the draws ``V`` of v (default
        :meth:`_v_draws`)."""
        return inducing_values(self._v_draws() if V is None else V, self.blocks)

    def diagnostics(self):
        """Gibbs fits: R-hat (rank-normalized), bulk/tail ESS and MCSE of every inducing value
        ``u[j]`` (the sampled parameters; the hyperparameters are fixed while sampling), by the
        code path of the linear Gibbs fits; None for VB/SVI fits."""
        if self.gibbs_draws is None:
            return None
        return diagnostics_table(self._posterior_dataset())

    # -- what compare reads -------------------------------------------------------------------
    def training_rows(self) -> pd.DataFrame | None:
        """The training data when the fit keeps all of it (a formula fit on a pandas frame); None
        for fits on arrays, a stream or a Dask frame, and for fits loaded from a file."""
        raw = getattr(self.design, "raw", None)
        if raw is None or len(raw) == 0 or len(raw) != self.n_obs:
            return None
        return raw

    def evaluation_points(self, n_points):
        """Up to ``n_points`` evenly spaced training rows (labels ``f[<row>]``), or without
        training rows the inducing locations (standardized; labels ``f[z<j>]``)."""
        points = super().evaluation_points(n_points)
        if points is not None:
            return points
        Z = np.asarray(self.inducing_points)
        idx = np.unique(np.linspace(0, len(Z) - 1, min(n_points, len(Z))).round().astype(int))
        return Z[idx], [f"f[z{i}]" for i in idx]

    def marginals(self, ranef=False, points=None, draw_shape=None) -> dict:
        """``{f[row]: marginal of f, hyperparameter: its value}``: the latent score at ``points``
        (default :meth:`evaluation_points` of 30 rows), q(f) in closed form (VB/SVI) or the draws
        of f (Gibbs); the hyperparameters are point estimates. ``ranef`` and ``draw_shape`` do not
        apply."""
        rows, labels = self.evaluation_points(30) if points is None else points
        out = {}
        if self.gibbs_draws is None:
            mean, var = self.predict_f(rows)
            for lab, m_, s_ in zip(labels, mean, np.sqrt(var)):
                out[lab] = Marginal.gaussian(m_, s_)
        else:
            F = self.f_draws(rows).reshape(-1, len(labels))
            for k, lab in enumerate(labels):
                out[lab] = Marginal.of_draws(F[:, k])
        for name, value in self.hyperparameters["value"].items():
            out[name] = Marginal.point(value)
        return out

    # -- predictions -------------------------------------------------------------------------





    # -- leave-one-out -------------------------------------------------------------------------


    # -- summary -----------------------------------------------------------------------------
    def summary_parts(self, level) -> SummaryParts:
        """Model information, the kernel hyperparameters and (Gibbs) the sampler diagnostics."""
        resp = self.design.response if self.design is not None else "y"
        pos = self.design.positive_level if self.design is not None else "+1"
        el = self.elbo
        header = {"Response:": f"{resp} (+1 = {pos!r})", "Method:": self.method,
                  "Kernel:": _kernel_label(self.kernel), "No. observations:": self.n_obs,
                  "No. inducing points:": self.n_inducing,
                  "ELBO:": f"{el[-1]:.4f}" if len(el) else "-", "Converged:": str(self.converged),
                  "Iterations:": str(self.n_iter), "Time [s]:": f"{self.seconds:.3f}",
                  "Hyperparameters:": "learned" if self.settings.get("optimize") else "fixed"}
        h = self.hyperparameters
        data = [[f"{v:.4g}", f"{st:.4g}"] for v, st in zip(h["value"], h["start"])]
        tables = [SimpleTable(data, headers=["value", "start"], stubs=list(h.index), title="Kernel hyperparameters")]
        diag = self.diagnostics()
        if diag is not None:
            st = self.settings
            worst = [f"{diag['r_hat'].max():.3f}", f"{diag['ess_bulk'].min():.0f}",
                     f"{diag['ess_tail'].min():.0f}"]
            tables.append(SimpleTable(
                [worst], headers=["max R-hat", "min bulk ESS", "min tail ESS"],
                stubs=[f"u ({self.n_inducing} values)"],
                title=(f"Gibbs diagnostics: {st.get('chains')} chains x {st.get('draws')} draws "
                       f"(tune {st.get('tune')}, thin {st.get('thin')}); fit.diagnostics() per value")))
        notes = []
        if len(el) > 1:
            tail = ", ".join(f"{e:.2f}" for e in el[-5:])
            notes.append(f"ELBO trace (last {min(5, len(el))} of {len(el)}): {tail}")
        notes += ["Predictive probability: Phi(m / sqrt(1 + v)) (probit integrated over q(f*)).",
                  "Intercept: constant kernel term 'bias.variance' (random intercept)."]
        return SummaryParts("Bayesian nonlinear SVM (sparse GP)", header, tables, notes)

    def __repr__(self):
        """A short description (method, formula, kernel); :meth:`summary` has the tables."""
        text = [f"Bayesian nonlinear SVM (sparse GP): {self.method}",
                f"Formula: {self.formula}" if self.formula else f"{self.n_features} features (array input)",
                f"n = {self.n_obs}; {self.n_inducing} inducing points; kernel {_kernel_label(self.kernel)}"]
        lines = [line for t in text for line in textwrap.wrap(t, WIDTH, subsequent_indent="  ")]
        return "\n".join(lines + ["fit.summary() gives the hyperparameters and diagnostics."])

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







def _kernel_label(k):
    parts = k.parts if hasattr(k, "parts") else [k]
    out = []
    for p in parts:
        nm = type(p).__name__
        if getattr(p, "ard", False):
            nm += "(ARD)"
        out.append(nm)
    return " + ".join(out)
