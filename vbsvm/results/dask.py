"""A fit made from a Dask DataFrame (:class:`DaskFit`): predictions partition by partition, no
training rows kept."""

import copy

from vbsvm.exceptions import InputError
from vbsvm.results.fit import Fit
from vbsvm.sources.dask_frames import is_dask_frame, lazy_predictions


class DaskFit(Fit):
    """A :class:`~vbsvm.results.fit.Fit` from a Dask frame. It keeps no training rows:
    :meth:`predict` needs ``newdata`` (a pandas frame gives pandas results, a Dask frame a
    lazy Dask Series or DataFrame), and the fit cannot be saved or give pointwise log
    likelihoods (both need the rows)."""

    def predict(self, newdata=None, kind="class", new_levels="integrate", na_action="pass"):
        if newdata is None:
            raise InputError("this fit was made from a Dask DataFrame and keeps no rows: pass newdata "
                             "(e.g. fit.predict(data), lazily evaluated for a Dask frame).")
        if is_dask_frame(newdata):
            return predict_dask(self, newdata, kind=kind, new_levels=new_levels, na_action=na_action)
        return super().predict(newdata, kind=kind, new_levels=new_levels, na_action=na_action)

    def predict_score(self, newdata, new_levels="integrate", na_action="pass"):
        if is_dask_frame(newdata):
            return predict_dask(self, newdata, kind="score", new_levels=new_levels, na_action=na_action)
        return super().predict_score(newdata, new_levels=new_levels, na_action=na_action)

    def training_rows(self):
        """None: the fit keeps no rows of the Dask frame."""
        return None

    def to_arviz(self, log_likelihood=True):
        if log_likelihood:
            raise InputError("a fit from a Dask DataFrame keeps no rows, so it has no pointwise log "
                             "likelihood: call to_arviz(log_likelihood=False).")
        raise InputError("to_arviz() of a fit from a Dask DataFrame is not available yet (the tree "
                         "stores the training rows); use fit.coef, fit.varcomp() and fit.posterior.")

    def save(self, path):
        raise InputError("saving a fit made from a Dask DataFrame is not available yet (a saved fit "
                         "rebuilds its design from its training rows, which this fit does not keep).")


def _light_fit(fit):
    """A copy of ``fit`` without its caches (what the partition tasks receive)."""
    out = copy.copy(fit)
    out._cache = {}
    return out


def predict_dask(fit, data, *, kind="class", new_levels="integrate", na_action="pass"):
    """:meth:`vbsvm.results.fit.Fit.predict` of a Dask DataFrame: a lazy Dask Series (a DataFrame for
    ``kind="score"``), one pandas prediction per partition.

    ``na_action="drop"`` drops rows within each partition; the result's divisions are then unknown.
    """
    if kind not in ("class", "prob", "prob_positive", "score"):
        raise InputError(f"kind must be 'class', 'prob', 'prob_positive' or 'score'; got {kind!r}.")
    d = fit.design
    needed = [c for c in d.raw.columns if c != d.response]
    absent = [c for c in needed if c not in data.columns and c in (d.fixed_vars or [])]
    if absent:
        raise InputError(f"newdata lacks the column(s) {absent} that the formula {d.formula!r} uses; pass a frame "
                         "with the same predictor columns as the training data.")
    light = _light_fit(fit)

    def one(frame):
        if kind == "score":
            return Fit.predict_score(light, frame, new_levels=new_levels, na_action=na_action)
        return Fit.predict(light, frame, kind=kind, new_levels=new_levels, na_action=na_action)

    return lazy_predictions(data, d, kind, one)
