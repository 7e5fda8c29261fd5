r"""Linear Bayesian SVM on a Dask DataFrame — the default calibrated EP (``method="vb"``) and
mean-field VB (``method="meanfield"``): one map-reduce over the partitions per pass, the small q
broadcast, the same algebra and the same answer as the in-memory fit.

``vbsvm.svm(formula, data=<dask.dataframe.DataFrame>)`` lands here (Dask is an optional extra,
``pip install "vbsvm[dask]"``; it is imported only when a Dask frame is passed). The design and
the blocks are shared by both methods; the sections *Sweeps* to *Passes over the blocks* are the
mean-field fit's, *Calibrated EP* the default's.

Design spec. The in-memory design (:func:`vbsvm.formula.design.build_design`) learns from the data the
response levels, the levels of every categorical column and grouping factor, and the
standardization constants. Here the levels come from one Dask pass (distinct values of every
non-numeric column, the response and the grouping columns; minimum and maximum of the numeric
ones). A small prototype frame holding all of them (and the first rows of the data) goes through
the ordinary :func:`~vbsvm.formula.design.build_design`, which fixes formulaic's encoding, the column
names and the random-effect levels exactly as the full data would. The centring and scaling
constants (mean and sd with ``ddof=1`` of each design column over the complete rows) are a second
pass: per partition the count, mean, sum of squared deviations and largest absolute value,
combined by Chan's parallel formulas (no cancellation). Each partition's design is then
``Design.new_X`` / ``Design.new_random_effects`` of its rows, i.e. the in-memory design's rows
(formulaic runs on chunks of ``CHUNK_ROWS`` rows, so a worker's transient memory does not grow
with the partitions' size).

Blocks. The design of each partition is built once, in one pass over the source (one task a
partition, so a worker holds one raw partition at a time), into its
:class:`~vbsvm.models.linear.LinearSVMModel` (design in the column-major layout the Gram uses,
labels, level codes). Consecutive partitions are coalesced into blocks (:class:`_Block`) of up to
``BLOCK_BYTES`` of design, about one block per worker, each built and kept on its worker (and so a
function of the partitions and the number of workers only: refits give identical numbers), with a
small memory of per-row arrays: a pass over the data is about one task per worker, because Dask's
cost is per task (~10 ms of a
worker's CPU and ~20 ms of the client's and scheduler's a pass, whatever the rows). Dask keeps the
blocks on the workers and every later pass maps its tasks over them, so formulaic and the source
(e.g. Parquet) are never touched again. A task walks its block partition by partition, and the
dense products by row chunks through scratch arrays allocated once per task (:class:`_Rows`): its
working memory does not grow with the block. Two kinds:

* in memory (:class:`_Resident`, ``persist=True``), when the designs fit the workers' memory;
* spilled (:class:`_Spilled`, ``persist=False``, out of core): each partition's model is pickled
  once with its large arrays written out of band as raw files in a directory the fit owns
  (created under Dask's ``temporary-directory`` config, default the system's temporary
  directory, and removed when the fit ends, also on error), and each pass unpickles it over
  read-only memory maps of those files (:class:`_SpilledPart`): no copy, no parsing, pages from
  the page cache or the disk, released when the task moves to the next partition, so a worker
  maps one partition at a time whatever n. The directory must be readable by every worker (one
  machine, or a shared filesystem).

``persist="auto"`` (default) keeps the blocks in memory when the designs take less than half the
workers' total memory limit (1 GB without a distributed client), and spills them otherwise.

Sweeps. Mean-field VB (:meth:`vbsvm.models.linear.LinearSVMModel.vb_sweep`) needs from the rows
only sums: with ``w_i = E[1/a_i] = chi_i^{-1/2}`` and ``r_i = y_i (1 + w_i)``, the
:class:`~vbsvm.models.linear.WorkingGram` ``A = C_d' W C_d``, ``b_d = C_d' r`` and, for the
random-effect term eliminated by the Schur complement, the per-level blocks ``D_l``, ``G_l``,
``b_l``; and, for the ELBO, the sum over rows of the hinge terms. Both are sums over partitions
(a tree reduction on the cluster). Everything else — ``q(theta)``, ``q(sigma^2)``, ``q(Sigma)``,
the prior terms of the ELBO — is computed on the client by the model's own
:meth:`~vbsvm.models.linear.LinearSVMModel.vb_update` and
:meth:`~vbsvm.models.linear.LinearSVMModel.elbo_prior` from the reduced statistics, so the algebra
exists once.

No per-row state on the client. The in-memory engine carries ``log chi`` (one number per row) in
its state vector, and SQUAREM (:mod:`vbsvm.inference.vb`) extrapolates it. But ``chi_i`` after a
sweep is a function of that sweep's ``q(theta)`` and row i only, ``chi_i = (1 - y_i m_i)^2 + v_i``
with ``m_i, v_i`` the mean and variance of ``c_i' theta``. So the per-row part of a state is kept
as an expression — a sweep's posterior (with a token naming it), or SQUAREM's
``x - 2 s r + s^2 v`` of such — and evaluated row by row inside each partition task, with the same
floating-point operations as the in-memory arrays. The ELBO pass of a sweep computes ``m_i, v_i``
of the new q anyway; it leaves ``log chi`` in the block under the posterior's token, and the block
keeps the last ``CHI_KEPT`` used (8 bytes a row each; in files when spilled), so SQUAREM's norms
and proposals read them instead of recomputing the variances (a block that misses one, e.g. a
copy on another worker, recomputes it from the posterior). The engine
(:func:`vbsvm.inference.vb.coordinate_ascent`) runs unchanged on these states; the norms of
SQUAREM's step length are a reduction (``vb_state_norms``), usually computed ahead. The client
holds q.

Why the result is the in-memory fit: every sweep computes the same sums (only their order of
summation differs, ~1e-16 relative), the same per-row values and the same client-side updates, so
the iterates, the accepted SQUAREM steps and the stopping sweep are the same; the tests check
coefficients and sds to 1e-8 (relative) with 1, 2 and 7 partitions on a LocalCluster.

Passes over the blocks. A sweep needs two: the statistics given the state (one ``C' W C``), then
the ELBO of the new q (one product for the variances of the scores), which gives ``log chi`` of
the state the sweep leaves. The second pass therefore also computes the working Gram of that
state (:func:`task_sweep`), which is the next sweep's first pass whenever the next sweep starts
there — always, except for SQUAREM's extrapolated proposals, whose step length is known only
after the norms. And the pass that ends the second sweep of a SQUAREM step (its states
``x0, x1, x2`` outputs of consecutive sweeps, all in the blocks' memories) also sums the squared
norms of ``r = x1 - x0`` and ``v = x2 - x1 - r`` that the engine asks for next. A step is thus
four passes for three sweeps, a step without extrapolation two for two (~1.2 passes a sweep;
without this ~2.4). What is computed ahead is found by the expressions' names; anything not
found (e.g. a Gram computed ahead but dropped) is a pass of its own. Before them, three passes
over the source: the levels, the standardization constants, the blocks; after them, the probit
scale of ``kind="prob"`` (the scores under the final q, kept in the blocks while a
one-dimensional search sums their log likelihood).

Calibrated EP. The default fit is :func:`vbsvm.inference.ep.fit_calibrated` itself, run on a
:class:`~vbsvm.sources.dask_ep.DaskEPModel`: the skeleton model's row-free algebra (priors, the
Gaussian of the sites' statistics) plus ``ep_rows``, the
:class:`~vbsvm.sources.dask_ep.DaskSiteRows` of the blocks, through which parallel EP
(:mod:`vbsvm.inference.ep_sites`) does everything that reads rows. The per-row state of EP is its
site vectors (precisions and shifts, two per set of sites); they live in the blocks as named
vectors (in memory, or in files beside a spilled design) and are combined on the client as
expressions — damping, SQUAREM's proposal, the warm starts scaled along the variance grid are
linear combinations, evaluated row by row inside the next pass — and never gathered. A pass
is one task per block, pinned to the worker holding it: an EP sweep (scores under the broadcast
Gaussian, cavities, tilted moments, new sites, their statistics, the scalars of ``log Z_EP``,
the largest change and leverage), the statistics of a site vector, dot products of site vectors
(SQUAREM's norms, the warm starts' scales), the check of a proposal, and, for ``n <=
EP_CORRECT_MAX_N``, the sums of the marginal corrections at the heaviest grid point. Everything
else — the integration over the variances, the mixture's moments, the iid draws — runs on the
client unchanged from the O(q^2) statistics; the probit scale of ``kind="prob"`` sums over the
blocks the log likelihood of the scores under the fit's Gaussian q(theta), as for the mean field.
The sums and the per-row values are the in-memory engine's, so the EP runs, sweeps and grid are
the same (the tests check coefficients, sds, the variance, the probit scale and predictions to
1e-6 with 1, 2 and 7 partitions; about 1e-13 in practice). Fixed effects only: a random-effect
term is refused with a message naming ``method="meanfield"``.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import time

import numpy as np

from vbsvm.exceptions import InputError
from vbsvm.fitting.builders import check_re_prior, random_effects_label
from vbsvm.inference.dispatch import APPROXIMATIONS
from vbsvm.inference.ep import fit_calibrated
from vbsvm.inference.failures import numerical_failures
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.linear import (
    LinearSVMModel,
    fixed_effect_precision,
    meanfield_posterior,
)
from vbsvm.results.dask import DaskFit
from vbsvm.results.fit import ThetaLayout
from vbsvm.results.prediction import calibration_scale
from vbsvm.sources.dask_blocks import (
    BLOCK_BYTES,
    DaskState,
    Gram,
    coalesce_partitions,
    expression_key,
    memory_budget,
    sum_floats,
    sum_gram,
    sum_norms,
    sum_sweeps,
    task_gram,
    task_nll,
    task_norms,
    task_part,
    task_sweep,
)
from vbsvm.sources.dask_ep import DaskEPModel, ScoreGaussian
from vbsvm.sources.dask_frames import (
    DesignSpec,
    import_dask,
    is_dask_frame,
    learn_design,
    tree_reduce,
)

__all__ = ["is_dask_frame", "learn_design", "svm_dask", "DaskLinearModel"]


class DaskLinearModel:
    """The VB interface of :class:`~vbsvm.models.linear.LinearSVMModel` (``vb_initial_state``,
    ``vb_sweep``, ``vb_state_norms``) over the partitions of a Dask frame.

    A sweep is one pass when the working Gram of its state was computed ahead (the pass that
    ends a sweep also computes the Gram of the state it leaves, in case the next sweep starts
    there: it does unless SQUAREM extrapolates), else two; SQUAREM's norms are computed ahead in
    the pass that ends the second sweep of a step, when the step's states are the outputs of
    consecutive sweeps (see the module docstring).

    Parameters
    ----------
    blocks : list
        The persisted :class:`_Block` (Dask delayed objects or futures).
    design : Design
        From :func:`learn_design`.
    settings : vbsvm.settings.FitSettings
        The checked settings of :func:`vbsvm.svm` (the priors).
    """

    #: the Grams, SQUAREM norms and origins computed ahead that are kept (newest first)
    KEPT_AHEAD = 4

    def __init__(self, blocks, design, settings):
        self.blocks = blocks
        self.skeleton = skeleton_model(design, settings)
        self.n = design.n
        self.blas_work = 0.0  # the client's products are q-sized
        self.passes = 0
        self._tokens = itertools.count()  # names the sweep posteriors in the blocks' memories
        self._grams = {}  # key of a state's rows -> its working Gram, computed ahead
        self._norms = {}  # keys of SQUAREM's (r, v) -> their norms, computed ahead
        self._origin = {}  # token of a sweep posterior -> the rows of the state the sweep started from

    def _reduce(self, task, combine, *args):
        dask = import_dask()
        shared = [dask.delayed(a, pure=False) for a in args]
        out = dask.compute(tree_reduce([dask.delayed(task)(b, *shared) for b in self.blocks], combine))[0]
        self.passes += 1
        return out

    @classmethod
    def _keep(cls, store, key, value):
        store[key] = value
        for old in list(store)[:-cls.KEPT_AHEAD]:
            del store[old]

    def vb_initial_state(self) -> DaskState:
        return DaskState(self.skeleton.vb_initial_state(), ("zero",))

    def vb_sweep(self, state: DaskState):
        """One sweep of :meth:`LinearSVMModel.vb_sweep`: the working Gram given the state (computed
        ahead, or a pass), the update of q on the client, a pass for the hinge terms of the ELBO
        that also leaves each block's ``log chi`` of the new q in its memory and computes its
        working Gram (and, after the second sweep of a SQUAREM step, the step's norms)."""
        _, Bq, q_cov = self.skeleton._unpack_state(state.glob)
        gram = self._grams.pop(expression_key(state.rows), None)
        if gram is None:
            gram = self._reduce(task_gram, sum_gram, state.rows)
        q = self.skeleton.vb_update(Bq, q_cov, gram=Gram(*gram))
        token = next(self._tokens)
        rows = ("post", q["theta"], token)
        differences = self._differences(state.rows, rows)
        hinge_terms, gram, norms = self._reduce(task_sweep, sum_sweeps, q["theta"], token, differences)
        self._keep(self._grams, expression_key(rows), gram)
        self._keep(self._origin, token, state.rows)
        if differences is not None:
            self._keep(self._norms, tuple(map(expression_key, differences)), norms)
        value = self.skeleton.elbo_prior(q, hinge_terms)
        return DaskState(self.skeleton.vb_global_state(q), rows), q, value

    def _differences(self, start, end):
        """SQUAREM's ``(r, v) = (x1 - x0, x2 - x1 - r)`` if this sweep goes from ``x1 = start`` to
        ``x2 = end`` and ``x1`` is the output of a sweep from a sweep's output ``x0``; else None."""
        if start[0] != "post" or start[2] not in self._origin:
            return None
        x0 = self._origin[start[2]]
        if x0[0] != "post":
            return None
        r = ("sub", start, x0)
        return r, ("sub", ("sub", end, start), r)

    def vb_state_norms(self, r: DaskState, v: DaskState):
        """``(||r||, ||v||, v finite)`` of SQUAREM's differences: computed ahead, or one pass."""
        got = self._norms.pop((expression_key(r.rows), expression_key(v.rows)), None)
        rr, vv, finite = got if got is not None else self._reduce(task_norms, sum_norms, r.rows, v.rows)
        rr += float(r.glob @ r.glob)
        vv += float(v.glob @ v.glob)
        return math.sqrt(rr), math.sqrt(vv), finite and bool(np.all(np.isfinite(v.glob)))


#: per-row site vectors (8 bytes a row each) the blocks of an EP fit hold at most, about: the
#: sites of SQUAREM's step, of the passes it reads and of the grid points that warm-start others
EP_VECTORS = 18


def skeleton_model(design, settings) -> LinearSVMModel:
    """The model without rows: it owns the layout, the priors and the row-free algebra."""
    d, s = design, settings
    groups = [(np.zeros(0, np.int64), g.n_levels, g.name, np.zeros((0, g.q))) for g in d.groups]
    return LinearSVMModel(
        np.zeros((0, d.p)), np.zeros(0), groups, fixed_effect_precision(d, s["penalty"], s["sigma2_beta"]),
        A=s["A_u"], B=s["B_u"], re_df=s.get("re_df"), re_scale=s.get("re_scale"),
        intercept=d.column_names.index("Intercept") if d.has_intercept else None)


# ============================================================================ fit and predict
def _calibrated(settings) -> bool:
    return settings["method"] == "vb" and settings.get("approximation") == "calibrated"


def _refuse(settings, prior):
    method = settings["method"]
    if prior is not None:
        raise InputError("prior=LaplaceZero(...) is not available for a Dask DataFrame yet; fit it on a pandas "
                         "frame (or a sample), or drop prior= for the Gaussian penalty.")
    if method == "gibbs":
        s = settings
        passes = s["chains"] * (s["tune"] + s["draws"] * s["thin"])
        raise InputError(
            f"method='gibbs' is not available for a Dask DataFrame: every Gibbs sweep is a full pass over the "
            f"data, and this run needs chains x (tune + draws x thin) = {s['chains']} x ({s['tune']} + "
            f"{s['draws']} x {s['thin']}) = {passes} passes (a useful run needs thousands). Use "
            "method='meanfield' (tens of passes), or run Gibbs on a pandas sample of the data.")
    if method == "map":
        raise InputError("method='map' is not available for a Dask DataFrame yet; use method='meanfield'.")


def _fit_settings_dask(settings, persist):
    if persist not in ("auto", True, False):
        raise InputError(f"persist must be 'auto', True or False; got {persist!r}.")
    return persist


def svm_dask(formula, data, settings, *, prior=None, persist="auto"):
    """:func:`vbsvm.svm` for a Dask DataFrame (calibrated EP or mean-field VB); see the module docstring.

    Parameters
    ----------
    formula : str
    data : dask.dataframe.DataFrame
    settings : vbsvm.settings.FitSettings
        The checked settings of :func:`vbsvm.svm`.
    prior : None
        LaplaceZero is refused.
    persist : {"auto", True, False}
        Keep each partition's design in the workers' memory between passes (True), or spill it
        once to files that every pass memory-maps (False: out of core, worker memory flat in n;
        the files go under Dask's ``temporary-directory`` config and are removed at the end), or
        decide from the design's size and the workers' memory limits ("auto": in memory if it
        takes less than half of it; without a distributed client, if below 1 GB).

    Returns
    -------
    DaskFit
    """

    dask = import_dask()
    start = time.perf_counter()
    _refuse(settings, prior)
    persist = _fit_settings_dask(settings, persist)
    design = learn_design(formula, data, standardize=settings["standardize"], missing=settings["missing"])
    _check_groups(design, settings)
    spec = DesignSpec(design, settings)
    sources = data[list(design.raw.columns)].to_delayed()
    width = design.p + sum(g.n_levels * g.q for g in design.groups) + 4
    if persist == "auto":  # with EP, the site vectors it keeps with the rows (at most ~18 at a time)
        persist = 8.0 * design.n * (width + EP_VECTORS * _calibrated(settings)) < memory_budget()
    root = None if persist else tempfile.mkdtemp(prefix="vbsvm-dask-", dir=dask.config.get("temporary-directory", None))
    group = max(1, int(BLOCK_BYTES // (8.0 * width * max(design.n / len(sources), 1.0))))
    try:
        parts = [dask.delayed(task_part)(s, spec, root and os.path.join(root, f"part{k}"))
                 for k, s in enumerate(sources)]
        blocks = coalesce_partitions(parts, group, root)
        setup = time.perf_counter() - start
        info = {"model": "Bayesian linear SVM" + random_effects_label(design), "data": "dask",
                "partitions": int(data.npartitions), "blocks": len(blocks), "persisted": bool(persist),
                "seconds_setup": setup}
        if _calibrated(settings):
            fit = _fit_ep(blocks, design, settings, info)
        else:
            fit = _fit_meanfield(blocks, design, settings, info)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return fit


def _fit_meanfield(blocks, design, settings, info) -> DaskFit:
    """Mean-field VB over the blocks (:class:`DaskLinearModel`) and the probit scale."""
    model = DaskLinearModel(blocks, design, settings)
    layout = ThetaLayout.from_model(model.skeleton, design)
    M = design.to_original(model.skeleton.qd)
    info["approximation"] = APPROXIMATIONS["meanfield"]
    with numerical_failures("variational Bayes"):
        res = coordinate_ascent(model, tol=settings["tol"], max_iter=settings["max_iter"],
                                accelerate=settings["accelerate"])
    posterior = meanfield_posterior(res.q, res.elbo, M, model.skeleton)
    info.update(converged=res.converged, n_sweeps=res.n_sweeps, seconds=res.seconds, passes=model.passes,
                **res.info)
    fit = DaskFit(design=design, layout=layout, settings=settings, method="vb", posterior=posterior, info=info)
    fit.info["prob_calibration"] = list(_probit_calibration(res.q["theta"], blocks))
    return fit


def _fit_ep(blocks, design, settings, info) -> DaskFit:
    """The calibrated EP fit (:func:`vbsvm.inference.ep.fit_calibrated`) over the blocks
    (:class:`~vbsvm.sources.dask_ep.DaskEPModel`) and the probit scale of its scores."""
    skeleton = skeleton_model(design, settings)
    model = DaskEPModel(skeleton, design.n, blocks, spilled=not info["persisted"])
    layout = ThetaLayout.from_model(skeleton, design)
    M = design.to_original(skeleton.qd)
    with numerical_failures("expectation propagation"):
        posterior = fit_calibrated(model, settings, M)
    rows = model.ep_rows
    info.update(posterior.pop("info"), approximation=APPROXIMATIONS["calibrated"], converged=True,
                passes=rows.passes, vector_passes=rows.vector_passes)
    fit = DaskFit(design=design, layout=layout, settings=settings, method="vb", posterior=posterior, info=info)
    # the scores of the fit's Gaussian q(theta) on the fitted scale: theta_original = M theta
    qd = skeleton.qd
    mean = np.linalg.solve(M, posterior["theta_mean"][:qd])
    cov = np.linalg.solve(M, np.linalg.solve(M, posterior["theta_cov_dense"]).T).T
    fit.info["prob_calibration"] = list(_probit_calibration(ScoreGaussian(mean, cov), blocks))
    return fit


def _check_groups(design, settings):
    check_re_prior(design, settings, None)
    if design.groups and _calibrated(settings):
        terms = ", ".join(f"({g.lhs} | {':'.join(g.factor)})" for g in design.groups)
        raise InputError(f"method='vb' (the calibrated EP approximation, the default) on a Dask DataFrame covers "
                         f"fixed effects only for now, and the formula has the random-effect term(s) {terms}; pass "
                         "method='meanfield' (mean-field VB with random effects, map-reduced over the partitions), "
                         "or fit a pandas frame.")


def _probit_calibration(post, blocks):
    """:func:`vbsvm.results.prediction.fit_probit_calibration` over the partitions: the scores of the
    training rows under the final ``q(theta)`` are computed at the first evaluation and kept in
    the blocks (16 bytes a row, in memory or in the spill files) while the one-dimensional search
    sums the log likelihood over them."""

    dask = import_dask()
    shared = dask.delayed(post, pure=False)

    def nll(log_a):
        a = math.exp(log_a)
        return dask.compute(tree_reduce([dask.delayed(task_nll)(b, shared, a) for b in blocks], sum_floats))[0]

    return calibration_scale(nll)
