"""Coordinate-ascent variational Bayes with SQUAREM acceleration and an ELBO safeguard.

A model supplies

* ``vb_initial_state()`` -> 1-d array ``x`` (e.g. log chi and log B_q), and
* ``vb_sweep(x)`` -> ``(x_new, q, elbo)``: one full pass of its coordinate-ascent updates starting
  from the state ``x``, the complete q it produced and that q's ELBO.

Plain coordinate ascent is the fixed-point iteration ``x <- F(x)``; each sweep cannot lower the
ELBO. For this augmentation it needs hundreds of sweeps when the dimension grows, so the engine
uses SQUAREM (Varadhan & Roland 2008, scheme S3): from ``x0``, ``x1 = F(x0)``, ``x2 = F(x1)``,
``r = x1 - x0``, ``v = x2 - x1 - r``, ``s = -||r|| / ||v||`` (capped at -1), proposal
``x' = x0 - 2 s r + s^2 v``, then one stabilising sweep ``F(x')``. The proposal is accepted only
if its ELBO is at least that of ``x2``; otherwise the step length is halved towards -1 and, at
-1, the plain iterate ``x2`` is kept. Every accepted iterate is the output of a full sweep, so
the ELBO trace of accepted iterates never decreases.

Convergence: relative ELBO change between accepted iterates below ``tol``. Non-convergence
after ``max_iter`` sweeps issues :class:`~vbsvm.exceptions.ConvergenceWarning`.

Ctrl-C (:class:`KeyboardInterrupt`) stops the iterations and returns the last accepted iterate
(``converged=False``, ``info["interrupted"] = True``) with an
:class:`~vbsvm.exceptions.InterruptWarning`; only an interrupt during the first sweep, before
any q exists, is passed on.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from vbsvm.exceptions import ConvergenceWarning, InterruptWarning
from vbsvm.inference.failures import numerical_failures
from vbsvm.inference.progress import progress_bar
from vbsvm.inference.threads import limit_blas

__all__ = ["VBResult", "coordinate_ascent"]


@dataclass
class VBResult:
    """Outcome of :func:`coordinate_ascent`.

    Attributes
    ----------
    q : dict
        The final variational factors, as returned by the model's sweep.
    state : ndarray
        The final state vector.
    elbo : ndarray
        ELBO after each accepted iterate (non-decreasing).
    converged : bool
    n_sweeps : int
        Model sweeps evaluated (including rejected extrapolations).
    seconds : float
    """

    q: dict
    state: np.ndarray
    elbo: np.ndarray
    converged: bool
    n_sweeps: int
    seconds: float
    info: dict = field(default_factory=dict)


def coordinate_ascent(model, *, tol=1e-8, max_iter=1000, accelerate=True, state=None, progress=False) -> VBResult:
    """Run coordinate-ascent VB on ``model`` until the relative ELBO change is below ``tol``.

    Parameters
    ----------
    model
        Object with ``vb_initial_state()`` and ``vb_sweep(state)``.
    tol : float
        Relative ELBO change that stops the iterations.
    max_iter : int
        Maximum number of model sweeps (each extrapolation step costs three).
    accelerate : bool
        Use SQUAREM extrapolation (recommended); False gives the plain algorithm.
    state : ndarray, optional
        Starting state; default ``model.vb_initial_state()``.
    progress : bool
        Show a progress bar of the sweeps (out of ``max_iter``; see :mod:`vbsvm.inference.progress`).

    Returns
    -------
    VBResult

    Raises
    ------
    vbsvm.exceptions.NumericalError
        If a (non-extrapolated) sweep fails numerically, e.g. a Cholesky factorization.
    """
    with limit_blas(getattr(model, "blas_work", 0.0)), numerical_failures("variational Bayes"):
        bar = progress_bar(max_iter, "VB sweeps", progress)
        try:
            return _coordinate_ascent(model, tol, max_iter, accelerate, state, bar)
        finally:
            if bar is not None:
                bar.close()


def _extrapolation_norms(model, r, v):
    """``(||r||, ||v||, all of v finite)`` of the SQUAREM differences. A model whose state does not
    live in one array (its per-row part on the partitions of a Dask frame,
    :mod:`vbsvm.fitting.dask`) supplies ``vb_state_norms(r, v)``, which computes all three in
    one pass over the data."""
    hook = getattr(model, "vb_state_norms", None)
    if hook is not None:
        return hook(r, v)
    return np.linalg.norm(r), np.linalg.norm(v), bool(np.all(np.isfinite(v)))


def _coordinate_ascent(model, tol, max_iter, accelerate, state, bar):
    start = time.perf_counter()
    x = model.vb_initial_state() if state is None else np.asarray(state, dtype=float)
    # the last accepted iterate and the length of its ELBO trace: replaced by one assignment, so
    # that Ctrl-C never finds it half updated; only it and the current candidate hold a q
    x, q, value = model.vb_sweep(x)
    trace = [value]
    accepted_iterate = (x, q, 1)
    del q
    sweeps, accepted = 1, 0
    converged = interrupted = False
    try:
        while sweeps < max_iter:
            x = accepted_iterate[0]
            candidate = model.vb_sweep(x)
            sweeps += 1
            x1 = candidate[0]
            if accelerate and sweeps < max_iter:
                candidate = model.vb_sweep(x1)
                sweeps += 1
                r = x1 - x
                v = candidate[0] - x1
                v -= r
                del x1
                nr, nv, finite = _extrapolation_norms(model, r, v)
                if nv > 0 and finite:
                    step = -nr / nv
                    while step < -1.0 and sweeps < max_iter:
                        proposal = x - 2.0 * step * r + step * step * v
                        with np.errstate(all="ignore"):
                            try:
                                trial = model.vb_sweep(proposal)
                            except (np.linalg.LinAlgError, FloatingPointError, ValueError):
                                trial = (None, None, -np.inf)
                        del proposal
                        sweeps += 1
                        if np.isfinite(trial[2]) and trial[2] >= candidate[2]:
                            candidate = trial
                            accepted += 1
                            break
                        del trial  # a rejected q is not kept through the next proposal
                        step = (step - 1.0) / 2.0
                del r, v
            trace.append(candidate[2])
            accepted_iterate = (candidate[0], candidate[1], len(trace))
            if bar is not None:
                bar.update(sweeps - bar.n)
            del x, candidate
            if abs(trace[-1] - trace[-2]) <= tol * max(abs(trace[-1]), 1.0):
                converged = True
                break
    except KeyboardInterrupt:
        interrupted = True
    x, q, n_trace = accepted_iterate
    del trace[n_trace:]
    if interrupted:
        warnings.warn(
            f"variational Bayes was interrupted (KeyboardInterrupt) after {sweeps} sweeps: returning the last "
            "accepted q (converged=False); rerun to convergence before drawing conclusions.",
            InterruptWarning, stacklevel=4)
    elif not converged:
        warnings.warn(
            f"variational Bayes did not converge in {max_iter} sweeps (last relative ELBO change "
            f"{abs(trace[-1] - trace[-2]) / max(abs(trace[-1]), 1.0):.2e} > tol={tol:g}); "
            "increase max_iter or loosen tol.",
            ConvergenceWarning,
            stacklevel=4,
        )
    return VBResult(q=q, state=x, elbo=np.asarray(trace), converged=converged and not interrupted,
                    n_sweeps=sweeps, seconds=time.perf_counter() - start,
                    info={"extrapolations_accepted": accepted, "interrupted": interrupted})
