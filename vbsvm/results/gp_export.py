"""A fitted sparse-GP SVM as ArviZ data and as a fit file: ``to_arviz``, ``save`` and the loader's
``from_datatree`` (mixed into :class:`~vbsvm.results.gp.GPFit`)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import xarray as xr

from vbsvm.exceptions import DiagnosticWarning, FitFileError
from vbsvm.formula.encoding import design_from_text, design_to_text
from vbsvm.formula.safety import check_formula
from vbsvm.inference.svi import FitState
from vbsvm.io.fit_file import write_atomically
from vbsvm.models.gp import (
    InducingGP,
    WhitenedGaussian,
    kernel_from_dict,
)
from vbsvm.results.gp_prediction import bound_log_pseudo_likelihood

#: largest ``draws x rows`` of the ``log_likelihood`` group :meth:`GPFit.to_arviz` builds (8 bytes each)
LOG_LIKELIHOOD_MAX_VALUES = 50_000_000


class GPExportMixin:
    """ArviZ export and fit files of :class:`~vbsvm.results.gp.GPFit` (see the module docstring)."""

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
