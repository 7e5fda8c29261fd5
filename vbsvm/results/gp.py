"""A fitted sparse-GP Bayesian SVM (:class:`GPFit`): summary, predictions, draws, ArviZ and files.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from vbsvm.exceptions import FitFileError, InputError
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
from vbsvm.results.fit import diagnostics_table
from vbsvm.results.summary import WIDTH, wrap_notes
from vbsvm.settings import GPSettings
from vbsvm.sources.dask_frames import DaskDesign, is_dask_frame, lazy_predictions


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
                    formula=self.formula, settings=self.settings.to_dict())
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

        if self.formula is not None:
            check_formula(self.formula)  # vbsvm.load would refuse the file
        write_atomically(self.to_arviz(draws=1000, chains=4), path)

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
