"""A fitted sparse-GP Bayesian SVM (:class:`GPFit`): summary, predictions, draws, LOO, ArviZ and files.

:class:`GPFit` implements the result contract of :class:`~vbsvm.results.contract.FitResult` with
the same signatures as the linear fits. The GP has no coefficients: its ``coef`` / ``params`` are
the kernel hyperparameters (point estimates, so ``bse``, intervals and ``cov_params`` are NaN), its
posterior draws are the inducing values ``u`` and :func:`vbsvm.compare` lines up the latent score
``f`` at common rows.
"""

from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import log_ndtr, ndtr
from statsmodels.iolib.table import SimpleTable

from vbsvm import validation
from vbsvm.exceptions import DiagnosticWarning, FitFileError, InputError
from vbsvm.formula.encoding import design_from_text, design_to_text
from vbsvm.formula.safety import check_formula
from vbsvm.inference.svi import FitState
from vbsvm.io.fit_file import write_atomically
from vbsvm.models.gp import (
    InducingGP,
    Kernel,
    WhitenedGaussian,
    gp_columns,
    inducing_values,
    kernel_from_dict,
    predictive_prob,
)
from vbsvm.results.contract import FitResult, SummaryParts, check_na_action, check_new_levels, fill_rows
from vbsvm.results.diagnostics import diagnostics_table
from vbsvm.results.fit import interval_names
from vbsvm.results.marginal import Marginal
from vbsvm.results.summary import WIDTH
from vbsvm.settings import GPSettings
from vbsvm.sources.dask_frames import DaskDesign, is_dask_frame, lazy_predictions

__all__ = ["GPFit", "bound_log_pseudo_likelihood"]

KINDS = ("class", "prob", "prob_positive", "score")

#: largest ``draws x rows`` of the ``log_likelihood`` group :meth:`GPFit.to_arviz` builds (8 bytes each)
LOG_LIKELIHOOD_MAX_VALUES = 50_000_000


def bound_log_pseudo_likelihood(margin, kt):
    r"""Log pseudo-likelihood of the bound model in the inducing values,
    :math:`\log \tilde L = -(1 - t) - \sqrt{(1 - t)^2 + \tilde k}` with ``margin`` :math:`t = y\kappa u`
    (the GIG integral of the augmented bound over :math:`\lambda`; the hinge
    :math:`-2 (1 - t)_+` when :math:`\tilde k = 0`), computed without cancellation."""
    r = 1.0 - np.asarray(margin, dtype=float)
    root = np.sqrt(r * r + kt)
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = -kt / np.where(r < 0, root - r, 1.0)  # -r - root for r < 0, without cancellation
    return np.where(r < 0, inside, -r - root)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
class GPFit(FitResult):
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
    def _X(self, newdata):
        if isinstance(newdata, pd.DataFrame) and self.design is not None:
            Xn = self.design.new_X(newdata)
            _, keep = gp_columns(self.design)
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

    def _complete(self, newdata, na_action):
        """Positions of the rows of ``newdata`` without a missing predictor (the others raise for
        ``na_action="raise"``)."""
        if isinstance(newdata, pd.DataFrame):
            if self.design is not None:
                incomplete = self.design.incomplete_rows(newdata)
            else:
                incomplete = newdata.isna().any(axis=1).to_numpy()
        else:
            values = np.asarray(newdata, dtype=float)
            incomplete = np.isnan(values).any(axis=1) if values.ndim == 2 else np.zeros(len(values), bool)
        if incomplete.any() and na_action == "raise":
            raise InputError(f"newdata has {int(incomplete.sum())} row(s) with missing values; pass "
                             "na_action='pass' (NaN predictions for those rows) or na_action='drop', or fill them.")
        return np.flatnonzero(~incomplete)

    def predict(self, newdata=None, kind="class", new_levels="integrate", na_action="pass",
                normalization="probit"):
        """Predict at new data.

        Parameters
        ----------
        newdata : DataFrame or array, optional
            Default: the training data (needs the design).
        kind : {"class", "prob", "prob_positive", "score"}
            ``"class"``: the response level of sign(E f); ``"prob"``: approximate predictive
            probability of the positive level, Phi(m / sqrt(1 + v)) (see
            :func:`vbsvm.models.gp.predictive_prob`; for Gibbs the mean over draws of
            Phi(f / sqrt(1 + k~))); ``"prob_positive"``: ``P(f(x) > 0 | data)`` (VB/SVI: Phi(m /
            sqrt(v)); Gibbs: the mean over draws of Phi(f / sqrt(k~))); ``"score"``: DataFrame
            with the predictive mean and sd of f.
        new_levels : {"integrate", "zero", "error"}
            Accepted for the signature the linear fits share; the GP has no random effects.
        na_action : {"pass", "drop", "raise"}
            Rows with a missing predictor: predicted as NaN (``"pass"``), left out (``"drop"``)
            or an :class:`~vbsvm.exceptions.InputError` (``"raise"``).
        normalization : {"probit", "paper"}
            ``"paper"`` reproduces eq. (13) as printed (Phi(m / (1 + v))).
        """
        check_new_levels(new_levels)
        check_na_action(na_action)
        if kind not in KINDS:
            raise InputError(f"kind={kind!r}; use 'class', 'prob', 'prob_positive' or 'score'")
        if newdata is None:
            if self.design is None or getattr(self.design, "raw", None) is None:
                raise InputError("predict() without newdata needs a formula fit; pass newdata")
            if isinstance(self.design, DaskDesign):
                raise InputError("this fit was made from a Dask DataFrame and keeps no rows: pass newdata "
                                 "(e.g. fit.predict(data), lazily evaluated for a Dask frame).")
            newdata = self.design.raw
        if is_dask_frame(newdata):
            if self.design is None:
                raise InputError("predicting a Dask DataFrame needs a formula fit.")
            return lazy_predictions(newdata, self.design, kind, lambda frame: self.predict(
                frame, kind=kind, new_levels=new_levels, na_action=na_action, normalization=normalization))
        keep = self._complete(newdata, na_action)
        n = len(newdata)
        frame = isinstance(newdata, pd.DataFrame)
        rows = (newdata.iloc[keep] if frame else np.asarray(newdata, dtype=float)[keep]) if len(keep) < n else newdata
        out = self._predict_rows(rows, kind, normalization)
        if len(keep) == n:
            return out
        if isinstance(out, (pd.Series, pd.DataFrame)):
            return fill_rows(out, newdata, keep, na_action)
        if na_action == "drop":
            return out
        full = np.full(n, np.nan)
        full[keep] = out
        return full

    def _predict_rows(self, newdata, kind, normalization):
        """:meth:`predict` of rows without missing predictors."""
        X, index = self._X(newdata)
        mean, var = self.predict_f(X)
        named = self.design is not None and index is not None
        if kind == "score":
            return pd.DataFrame({"mean": mean, "sd": np.sqrt(var)}, index=index)
        if kind == "class":
            lab = np.where(mean >= 0, 1, -1)
            if named:
                vals = np.where(lab > 0, self.design.positive_level, self.design.negative_level)
                return pd.Series(vals, index=index, name=self.design.response)
            return lab
        if kind == "prob":
            if self.gibbs_draws is not None and normalization == "probit":
                A, kt = self.blocks.project(X)
                F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
                p = ndtr(F / np.sqrt(1.0 + kt)).mean(0)
            else:
                p = predictive_prob(mean, var, normalization)
            name = f"P({self.design.response}={self.design.positive_level!r})" if named else None
        else:  # prob_positive
            with np.errstate(divide="ignore", invalid="ignore"):
                if self.gibbs_draws is not None:
                    A, kt = self.blocks.project(X)
                    F = self.gibbs_draws.reshape(-1, self.n_inducing) @ A.T
                    p = ndtr(F / np.sqrt(kt)).mean(0)
                else:
                    p = ndtr(mean / np.sqrt(var))
            name = (f"P(score > 0) for P({self.design.response}={self.design.positive_level!r})"
                    if named else None)
        return pd.Series(p, index=index, name=name) if named else p

    # -- leave-one-out -------------------------------------------------------------------------
    def _training_margins(self):
        """``y_i kappa_i u`` for each draw and training row (chains, draws, n), the residual
        variances ``k~`` (n,) and the labels."""
        rows = self.training_rows()
        if rows is None:
            raise InputError("loo() and the log likelihood need the training rows, which this GP fit does not keep "
                             "(fitted on arrays, a stream or a Dask frame, or loaded from a file): refit with "
                             "vbsvm.gpsvm(formula, data) on a pandas DataFrame.")
        X, _ = self._X(rows)
        A, kt = self.blocks.project(X)
        y = np.asarray(self.design.y, dtype=float)
        return y * (self._v_draws() @ A.T), kt, y

    def pointwise_log_terms(self):
        """``(log_pseudo, log_prob)`` per draw and training row (see
        :meth:`vbsvm.results.contract.FitResult.loo`): the bound model's pseudo-likelihood
        (:func:`bound_log_pseudo_likelihood`) and ``log Phi(y kappa u / sqrt(1 + k~))``."""
        T, kt, _ = self._training_margins()
        return bound_log_pseudo_likelihood(T, kt), log_ndtr(T / np.sqrt(1.0 + kt))

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
    def to_arviz(self, log_likelihood=True):
        r"""The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout (VB/SVI draws in the shape
        :attr:`draw_shape`; change it with :meth:`with_draw_shape`).

        Groups: ``posterior``: ``u`` (chain, draw, inducing) — Gibbs draws, or iid draws from q(u)
        for VB (q's mean in the group's attrs); ``sample_stats``: ``lp_proxy`` per draw;
        ``vbsvm_state``: everything needed to rebuild the fit; with ``log_likelihood=True`` and
        training rows kept (:meth:`training_rows`), ``log_likelihood`` (``y``: per draw and
        training row the log of the bound model's pseudo-likelihood normalised over the two labels,
        :math:`\tilde L(y) / (\tilde L(+1) + \tilde L(-1))` with :func:`bound_log_pseudo_likelihood`,
        Sollich's normalisation) and ``observed_data``. ``arviz.loo`` on the tree is PSIS-LOO of that
        normalised model (weights from it, not from the pseudo-likelihood the posterior used); for
        model comparison use :meth:`loo` (see :meth:`vbsvm.results.contract.FitResult.loo`). The
        group is left out (with a warning) above ``LOG_LIKELIHOOD_MAX_VALUES`` draws x rows, and by
        :meth:`save`.
        """
        return self._tree(self._v_draws(), log_likelihood)

    def _tree(self, V, log_likelihood):
        L = self.blocks.L
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
                    formula=self.formula, settings=self.settings.to_dict())
        attrs = {"vbsvm_fit_type": "gpsvm", "vbsvm_gp_meta": json.dumps(meta, default=str)}
        if self.design is not None:
            attrs["design"] = design_to_text(self.design)
        groups = {"posterior": post, "sample_stats": ss, "vbsvm_state": state}
        if log_likelihood and self.training_rows() is not None:
            if V.shape[0] * V.shape[1] * self.n_obs > LOG_LIKELIHOOD_MAX_VALUES:
                warnings.warn(f"to_arviz(): no log_likelihood group ({V.shape[0] * V.shape[1]} draws x {self.n_obs} "
                              f"rows is more than {LOG_LIKELIHOOD_MAX_VALUES} values); use fewer draws "
                              "(fit.with_draw_shape(chains, draws)) or fit.loo().", DiagnosticWarning, stacklevel=3)
            else:
                groups.update(self._log_likelihood_groups(post))
        tree = xr.DataTree.from_dict(groups)
        tree.attrs.update(attrs)
        return tree

    def _log_likelihood_groups(self, post):
        """``log_likelihood`` (the normalised bound pseudo-likelihood per draw and row) and
        ``observed_data``."""
        T, kt, y = self._training_margins()
        own = bound_log_pseudo_likelihood(T, kt)
        F = T * y  # kappa u, whatever the label
        both = np.logaddexp(bound_log_pseudo_likelihood(F, kt), bound_log_pseudo_likelihood(-F, kt))
        obs = self.training_rows().index
        obs = np.asarray(obs) if np.asarray(obs).dtype.kind in "iu" else np.asarray(obs.astype(str), dtype=object)
        coords = {"chain": post["chain"].values, "draw": post["draw"].values, "obs": obs}
        return {"log_likelihood": xr.Dataset(
                    {"y": (("chain", "draw", "obs"), own - both)}, coords=coords,
                    attrs={"normalisation": "bound pseudo-likelihood L(y | u) / (L(+1 | u) + L(-1 | u))",
                           "loo": "fit.loo(): weights from L(y | u), predictive Phi(y kappa u / sqrt(1 + k~))"}),
                "observed_data": xr.Dataset({"y": (("obs",), y)}, coords={"obs": obs})}

    def save(self, path):
        """Write the fit to netCDF (h5netcdf; VB/SVI: 4 x 1000 draws of u in the posterior group);
        reload with ``vbsvm.load`` or :meth:`GPFit.from_datatree`. The file keeps the design (to
        predict new rows) but not the training rows."""

        if self.formula is not None:
            check_formula(self.formula)  # vbsvm.load would refuse the file
        write_atomically(self._tree(self._v_draws(4, 1000, 0), log_likelihood=False), path)

    @classmethod
    def from_datatree(cls, tree):
        """Rebuild a fit from :meth:`to_arviz` / :meth:`save` output."""

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
