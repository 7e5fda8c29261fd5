"""The linear fits' draws as xarray and ArviZ objects, and their fit files: the posterior group,
the tree of :meth:`~ArvizMixin.to_arviz`, saving and rebuilding a fit from a saved tree."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import log_ndtr

from vbsvm import validation
from vbsvm._version import __version__
from vbsvm.exceptions import FitFileError, InputError
from vbsvm.formula.design import build_design
from vbsvm.formula.encoding import column_name, storable_columns
from vbsvm.io.fit_file import (
    check_rebuilt,
    check_settings,
    check_storable,
    write_atomically,
)
from vbsvm.posterior.representations import add_sparse_score
from vbsvm.results.layout import ThetaLayout, _jsonable
from vbsvm.settings import FitSettings

__all__ = ["ArvizMixin", "pointwise_log_likelihood"]


class ArvizMixin:
    """Draws, ArviZ export and fit files of a linear fit (:class:`~vbsvm.results.fit.Fit`)."""

    def draws(self, chains=None, draws=None, seed=None) -> xr.Dataset:
        """Posterior draws, the ``posterior`` group of :meth:`to_arviz` (see
        :meth:`vbsvm.results.contract.FitResult.draws`): ``beta`` (dim ``coef``), the variances,
        ``b_<group>``, and what the model adds (``gamma``, ``x_missing``, ...)."""
        fit = self
        if not (self.sampled or self.point) and (chains is not None or draws is not None or seed is not None):
            ch, dr = self.draw_shape
            settings = {**self.settings, "chains": int(ch if chains is None else chains),
                        "draws": int(dr if draws is None else draws)}
            if seed is not None:
                settings["draw_seed"] = int(validation.seed(seed))
            fit = dataclasses.replace(self, settings=settings)
        return fit._posterior_dataset()

    def _draws(self):
        """Draws of theta and the variances (Gibbs draws, iid draws from the VB q, or the mode as
        one draw)."""
        return self._post.draws()

    def _posterior_dataset(self) -> xr.Dataset:
        theta, sig = self._draws()
        lay = self.layout
        data = {"beta": (("chain", "draw", "coef"), theta[..., : lay.p])}
        coords = {"coef": list(lay.fixed)}
        for name, (levels, ix) in lay.groups.items():
            coords[name] = [str(v) for v in levels]
            cols = lay.columns_of(name)
            if len(cols) == 1:
                data[f"b_{name}"] = (("chain", "draw", name), theta[..., ix])
            else:
                coords[f"{name}_coef"] = list(cols)
                data[f"b_{name}"] = (("chain", "draw", name, f"{name}_coef"),
                                     theta[..., ix].reshape(theta.shape[:2] + (len(levels), len(cols))))
        for k, name in enumerate(lay.variances):
            data[name] = (("chain", "draw"), sig[..., k])
        for name, S in self._covariance_draws().items():
            cols = lay.columns_of(name)
            S = S.reshape(theta.shape[:2] + S.shape[1:])
            j, k = np.tril_indices(len(cols), -1)
            sd = np.sqrt(np.diagonal(S, axis1=-2, axis2=-1))
            coords[f"{name}_coef"] = list(cols)
            coords[f"{name}_pair"] = [f"{cols[b]},{cols[a]}" for a, b in zip(j, k)]
            data[f"sigma2_{name}"] = (("chain", "draw", f"{name}_coef"), sd ** 2)
            data[f"cor_{name}"] = (("chain", "draw", f"{name}_pair"), S[..., j, k] / (sd[..., j] * sd[..., k]))
        ds = xr.Dataset(data, coords={"chain": np.arange(theta.shape[0]), "draw": np.arange(theta.shape[1]), **coords})
        return ds

    def to_arviz(self, log_likelihood=True):
        """The fit as an :class:`xarray.DataTree` in ArviZ 1.x layout.

        Groups:

        * ``posterior``: ``beta`` (dim ``coef``), ``sigma2_u``, ``b_<group>``, ``sigma2_<group>``
          (:meth:`draws`); VB fits hold iid draws from q with the same (chain, draw) shape as the
          Gibbs default and q's parameters in the group's attrs;
        * ``sample_stats``: Gibbs: ``log_pseudo_likelihood`` per draw; VB: the ``elbo`` trace;
        * ``log_likelihood`` (with ``log_likelihood=True``; :meth:`save` leaves it out): ``y``
          (chain, draw, obs), per draw and training row the log of the hinge pseudo-likelihood
          normalised over the two labels (Sollich 2002), ``exp(-2 (1 - y f)_+) / (exp(-2 (1 - f)_+)
          + exp(-2 (1 + f)_+))`` (:func:`pointwise_log_likelihood`). ``arviz.loo`` on the tree is
          PSIS-LOO of that normalised model: it takes its weights from this term rather than from
          the pseudo-likelihood the posterior used, and scores the hinge's over-confident class
          probabilities (toenail random intercepts, Gibbs: elpd -605 against -504 from
          :meth:`loo` and -501 by 10-fold cross-validation, ``benchmarks/results/loo.md``). For
          model comparison use :meth:`loo` (weights ``1 / exp(-2 (1 - y f)_+)``, predictive the
          calibrated probit of ``predict(kind="prob")``): ``arviz.compare({"a": fit_a.loo(),
          "b": fit_b.loo()})``;
        * ``observed_data`` (``y`` in {-1, +1}) and ``constant_data`` (the raw columns the
          formula uses); ``vbsvm``: the posterior arrays (what :func:`vbsvm.load` rebuilds from).
        """
        post = self._posterior_dataset()
        post.attrs.update({"method": self.method, "scale": "original predictor scale",
                           "inference_library": "vbsvm"})
        post.attrs.update(self._post.arviz_attrs(self.info))
        tree = {"posterior": post}
        stats_group = self._post.sample_stats()
        if stats_group is not None:
            tree["sample_stats"] = stats_group
        if log_likelihood and not self._post.point:
            tree["log_likelihood"] = xr.Dataset(
                {"y": (("chain", "draw", "obs"), pointwise_log_likelihood(self.design.y, self._train_scores()))},
                attrs={"normalisation": "exp(-2 (1 - y f)_+) / sum over y' in {-1, +1}",
                       "loo": "fit.loo(): weights from the pseudo-likelihood exp(-2 (1 - y f)_+), predictive "
                              "Phi(y (a f + b)) with (a, b) the fit's prob_calibration"})
        tree["observed_data"] = xr.Dataset({"y": (("obs",), self.design.y)})
        tree["constant_data"] = _frame_to_dataset(self.design.raw)
        tree["vbsvm"] = xr.Dataset({k: (tuple(f"{k}_dim{i}" for i in range(np.ndim(v))), np.asarray(v))
                                    for k, v in self.posterior.items()})
        dt = xr.DataTree.from_dict(tree)
        dt.attrs.update({"vbsvm_fit_type": "linear", "vbsvm_version": _version(),
                         "settings": json.dumps(self.settings.to_dict(), default=_jsonable),
                         "layout": json.dumps(self.layout.to_dict()), "method": self.method,
                         "info": json.dumps(self.info, default=_jsonable)})
        return dt

    def _train_scores(self) -> np.ndarray:
        """Scores of the training rows under each draw, ``(chains, draws, n)``."""
        theta = self._draws()[0]
        dense, sc = self._new_rows(self.design.raw, new_levels="zero")
        nd = self.layout.n_dense
        return np.stack([add_sparse_score(t[:, :nd] @ dense.T, t[:, nd:], sc) for t in theta])

    def pointwise_log_terms(self):
        """``(log_pseudo, log_prob)`` per draw and training row (see
        :meth:`vbsvm.results.contract.FitResult.loo`): ``-2 (1 - y f)_+`` and
        ``log Phi(y (a f + b))`` with ``(a, b) = info["prob_calibration"]``."""
        if self.point:
            raise InputError("loo() needs a posterior; a method='map' fit has only the mode. Refit with "
                             "method='vb' or method='gibbs'.")
        if self.training_rows() is None:
            raise InputError("loo() needs the training rows, which this fit does not keep (a fit from a Dask "
                             "DataFrame); refit on a pandas DataFrame.")
        F = self._train_scores()
        y = np.asarray(self.design.y, dtype=float)
        a, b = self.info.get("prob_calibration", (1.0, 0.0))
        return -2.0 * np.maximum(0.0, 1.0 - y * F), log_ndtr(y * (a * F + b))

    def save(self, path):
        """Write the fit to a netCDF file (readable by :func:`vbsvm.load` and ``arviz.from_netcdf``).

        The file is written atomically (:func:`vbsvm.io.fit_file.write_atomically`): an interrupted
        save leaves an existing file at ``path`` as it was. A fit that would not load back the
        same is not written: one whose formula :func:`vbsvm.load` would refuse (see
        :mod:`vbsvm.formula.safety`), or whose data has a column mixing text with other types
        (:func:`vbsvm.io.fit_file.check_storable`).
        """

        check_settings(self.settings.to_dict())
        check_storable(self.design.raw)
        write_atomically(self.to_arviz(log_likelihood=False), path)

    @classmethod
    def from_datatree(cls, dt) -> ArvizMixin:
        """Rebuild a fit from the tree written by :meth:`to_arviz` / :meth:`save`."""

        try:
            settings = json.loads(dt.attrs["settings"])
            layout = ThetaLayout.from_dict(json.loads(dt.attrs["layout"]))
            method = dt.attrs["method"]
            info = json.loads(dt.attrs.get("info", "{}"))
            data = dt["constant_data"].to_dataset()
            for var in data.data_vars.values():  # xarray decodes int8 + attrs dtype='bool' itself
                if var.dtype == bool:
                    var.attrs.setdefault("dtype", "bool")
            raw = _dataset_to_frame(data)
            internal = dt["vbsvm"].to_dataset()
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise FitFileError(f"the file is not a complete vbsvm linear fit ({exc}).") from None
        check_settings(settings)  # the formula is checked before formulaic sees it
        settings = FitSettings.from_mapping(settings)  # frozen, through the same checks as svm()
        design = build_design(settings["formula"], raw, standardize=settings["standardize"],
                              missing=settings["missing"])
        check_rebuilt(design, layout, dt["observed_data"]["y"].values)
        posterior = {k: internal[k].values for k in internal.data_vars}
        return cls(design=design, layout=layout, settings=settings, method=method, posterior=posterior, info=info)


def pointwise_log_likelihood(y, F) -> np.ndarray:
    """``log p(y_i | f_i)`` of the hinge likelihood normalised over ``y`` in {-1, +1},
    ``exp(-2 (1 - y f)_+) / (exp(-2 (1 - f)_+) + exp(-2 (1 + f)_+))``, for scores ``F`` (..., n).

    The SVM pseudo-likelihood itself is not normalised in y; this is the normalisation that makes
    each observation's term a probability, so that PSIS-LOO (``arviz.loo``) and model comparison
    (``arviz.compare``) have a proper predictive density to work with.
    """
    own = -2.0 * np.maximum(0.0, 1.0 - y * F)
    return own - np.logaddexp(-2.0 * np.maximum(0.0, 1.0 - F), -2.0 * np.maximum(0.0, 1.0 + F))


def _version():

    return __version__


def _frame_to_dataset(df: pd.DataFrame) -> xr.Dataset:
    data = {}
    for c in df.columns:
        col = df[c]
        if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            data[str(c)] = (("obs",), col.to_numpy(dtype=float), {"dtype": str(col.dtype)})
        elif pd.api.types.is_bool_dtype(col):
            data[str(c)] = (("obs",), col.to_numpy(dtype=np.int8), {"dtype": "bool"})
        else:
            cats = list(col.cat.categories) if isinstance(col.dtype, pd.CategoricalDtype) else None
            values = col.astype(object).where(col.notna(), None).to_numpy()
            attrs = {"dtype": "category" if cats is not None else "str"}
            if cats is not None:
                attrs["categories"] = json.dumps([_jsonable(x) for x in cats])
            data[str(c)] = (("obs",), np.array(["\x00NA" if v is None else str(v) for v in values], dtype=object), attrs)
    index = df.index.to_numpy()
    if not pd.api.types.is_integer_dtype(df.index):
        index = np.asarray(df.index.astype(str), dtype=object)

    return xr.Dataset(storable_columns(data), coords={"obs": index})


def _dataset_to_frame(ds: xr.Dataset) -> pd.DataFrame:

    cols = {}
    for key, da in ds.data_vars.items():
        name = column_name(key, da.attrs)
        kind = da.attrs.get("dtype", "float64")
        v = da.values
        if kind == "bool":
            cols[name] = v.astype(bool)
        elif kind in ("str", "category"):
            s = np.array([None if x == "\x00NA" else x for x in v.astype(str)], dtype=object)
            if kind == "category":
                s = pd.Categorical(s, categories=json.loads(da.attrs["categories"]))
            cols[name] = s
        elif kind.startswith(("int", "uint")):
            cols[name] = v.astype(kind)
        else:
            cols[name] = v.astype(float)
    obs = ds["obs"].values
    return pd.DataFrame(cols, index=pd.Index(obs if obs.dtype.kind in "iu" else obs.astype(str)))

