"""One dispatch from ``method`` to an inference engine, for every linear model.

:func:`fit` runs the engine that ``settings["method"]`` names on a model and returns the arrays a
fit stores, read out of the engine's result by the model's :class:`Readout`, what the run
reports (``info``) and the settings of the fit (the settings it was given, which it never
changes, or a new object with the shape an interrupted Gibbs run kept):

* ``"vb"`` with ``approximation="calibrated"`` (the default of :func:`vbsvm.svm`): the readout's
  ``calibrated`` (expectation propagation integrated over the variances,
  :func:`vbsvm.inference.ep.fit_calibrated`), where the model has one; otherwise the mean-field
  fit, with a note that says so;
* ``"vb"`` mean field: ``vb_engine`` (default :func:`vbsvm.inference.vb.coordinate_ascent`;
  the imputation model pools fits over completions, :func:`vbsvm.inference.pooled.pooled_vb`),
  read by ``from_vb``;
* ``"gibbs"``: :func:`vbsvm.inference.gibbs.run_chains`, extended until ``monitor`` (the summary
  diagnostics of a posterior) meets the targets; read by ``from_draws``;
* ``"map"``: EM for the posterior mode (:func:`vbsvm.inference.mode.posterior_mode`), read by
  ``from_mode``.

Models never import engines or result classes: the fitting layer (:mod:`vbsvm.fitting.builders`) builds
a model and its readout, calls :func:`fit` and wraps the arrays in a result class. The sparse-GP
SVM has its own engines (batch VB, SVI, Gibbs) and dispatch in :func:`vbsvm.fitting.gp.fit_gp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vbsvm.exceptions import InputError
from vbsvm.inference.failures import numerical_failures
from vbsvm.inference.gibbs import run_chains
from vbsvm.inference.mode import posterior_mode
from vbsvm.inference.vb import coordinate_ascent

__all__ = ["APPROXIMATIONS", "Readout", "fit", "record_run_length"]

#: what ``fit.info["approximation"]`` says of each variational fit
APPROXIMATIONS = {
    "calibrated": "calibrated: EP integrated over the variance parameters (grid or CCD, INLA-style)",
    "meanfield": "mean-field VB (Luts & Ormerod Algorithms 1-4)",
}


@dataclass
class Readout:
    """How a model's posterior is read out of each engine's result.

    Attributes
    ----------
    record : tuple of str
        Gibbs state entries to keep.
    from_draws : callable
        ``draws (dict of (chains, draws, ...) arrays) -> posterior arrays``.
    from_vb : callable
        ``VBResult -> posterior arrays``.
    from_mode : callable, optional
        ``ModeResult -> posterior arrays``; None: the model has no ``method="map"``.
    calibrated : callable, optional
        ``model -> posterior arrays`` (with an ``"info"`` entry) of the calibrated approximation;
        None: ``method="vb"`` falls back to mean field.
    not_calibrated : str
        What the calibrated approximation does not cover, for the note of the fallback.
    vb_engine : callable, optional
        ``(model, settings) -> VBResult``; default coordinate ascent with the settings' ``tol``,
        ``max_iter`` and ``accelerate``.
    monitor : callable, optional
        ``posterior arrays -> summary diagnostics (DataFrame)``: Gibbs runs are extended until
        these meet the targets (see :func:`vbsvm.inference.gibbs.run_chains`).
    """

    record: tuple
    from_draws: Callable
    from_vb: Callable
    from_mode: Callable | None = None
    calibrated: Callable | None = None
    not_calibrated: str = ""
    vb_engine: Callable | None = None
    monitor: Callable | None = None


def meanfield(model, settings):
    """Coordinate-ascent VB (SQUAREM) with the settings' ``tol``, ``max_iter``, ``accelerate``."""
    return coordinate_ascent(model, tol=settings["tol"], max_iter=settings["max_iter"],
                             accelerate=settings["accelerate"])


def fit(model, settings, readout: Readout):
    """Run the engine of ``settings["method"]`` on ``model``.

    Parameters
    ----------
    model
        A model with the hooks of the engine (``vb_initial_state``/``vb_sweep``,
        ``gibbs_initial_state``/``gibbs_sweep``, ``map_step``/``log_posterior``/``polish_mode``).
    settings : vbsvm.settings.FitSettings
        The checked settings of :func:`vbsvm.svm` (never changed).
    readout : Readout

    Returns
    -------
    posterior : dict
        The arrays the fit stores.
    info : dict
        ``approximation`` (VB), ``converged``, ``n_sweeps``/``n_iter``, ``seconds``, the run
        length of Gibbs (:func:`record_run_length`), ``interrupted``.
    settings : vbsvm.settings.FitSettings
        The settings of the fit: ``settings``, or for a Gibbs run that was interrupted a new
        object with the ``chains`` and ``draws`` that were kept.
    """
    method, info = settings["method"], {}
    if method == "vb":
        if settings.get("approximation") == "calibrated":
            if readout.calibrated is not None:
                with numerical_failures("expectation propagation"):
                    posterior = readout.calibrated(model)
                info.update(posterior.pop("info"), approximation=APPROXIMATIONS["calibrated"], converged=True)
                return posterior, info, settings
            info["approximation_note"] = (f"the calibrated approximation does not cover {readout.not_calibrated} "
                                          "yet: this is the mean-field fit; check it against method='gibbs'")
        info["approximation"] = APPROXIMATIONS["meanfield"]
        res = (readout.vb_engine or meanfield)(model, settings)
        info.update(converged=res.converged, n_sweeps=res.n_sweeps, seconds=res.seconds, **res.info)
        return readout.from_vb(res), info, settings
    if method == "gibbs":
        monitor = None if readout.monitor is None else (lambda draws: readout.monitor(readout.from_draws(draws)))
        res = run_chains(model, draws=settings["draws"], tune=settings["tune"], chains=settings["chains"],
                         thin=settings["thin"], seed=settings["seed"], progress=settings["progress"],
                         n_jobs=settings["n_jobs"], record=readout.record, checkpoint=settings.get("checkpoint"),
                         max_draws=settings.get("max_draws"), monitor=monitor)
        if res.interrupted:  # the fit holds what was kept; say so where the shape is read
            info["interrupted"] = True
            settings = settings.replace(chains=res.chains, draws=res.n_draws)
        record_run_length(info, res)
        info.update(seconds=res.seconds)
        return readout.from_draws(res.draws), info, settings
    if method == "map":
        if readout.from_mode is None:
            raise InputError("method='map' is not available for this model; use method='vb' or method='gibbs'.")
        with numerical_failures("EM for the posterior mode"):
            res = posterior_mode(model, max_iter=max(settings["max_iter"], 2000))
        info.update(converged=res.converged, n_iter=res.n_iter, seconds=res.seconds)
        return readout.from_mode(res), info, settings
    raise InputError(f"method must be 'vb', 'meanfield', 'gibbs' or 'map'; got {method!r}.")


def record_run_length(info, res):
    """Put the run length of a Gibbs result ``res`` into a fit's ``info``: ``draws_requested``,
    ``draws`` (kept per chain), ``max_draws`` (the cap of the extension), ``draws_extended`` and
    ``extension_rounds`` (see :class:`vbsvm.inference.gibbs.GibbsResult`)."""
    info.update(draws_requested=int(res.requested), draws=int(res.n_draws), max_draws=int(res.max_draws),
                draws_extended=bool(res.extensions), extension_rounds=list(res.extensions))

