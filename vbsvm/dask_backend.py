r"""Linear Bayesian SVM by mean-field VB on a Dask DataFrame: one map-reduce over the partitions
per pass, the small q broadcast, the same algebra and the same answer as the in-memory fit.

``vbsvm.svm(formula, data=<dask.dataframe.DataFrame>, method="meanfield")`` lands here (Dask is
an optional extra, ``pip install "vbsvm[dask]"``; it is imported only when a Dask frame is passed).

Design spec. The in-memory design (:func:`vbsvm.design.build_design`) learns from the data the
response levels, the levels of every categorical column and grouping factor, and the
standardization constants. Here the levels come from one Dask pass (distinct values of every
non-numeric column, the response and the grouping columns; minimum and maximum of the numeric
ones). A small prototype frame holding all of them (and the first rows of the data) goes through
the ordinary :func:`~vbsvm.design.build_design`, which fixes formulaic's encoding, the column
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
state (:func:`_task_sweep`), which is the next sweep's first pass whenever the next sweep starts
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
"""

from __future__ import annotations

import contextlib
import copy
import glob
import itertools
import math
import numbers
import os
import pickle
import shutil
import tempfile
import time

import numpy as np
import pandas as pd

from .dask_checks import check_partition, meta_mismatch
from .exceptions import InputError
from .models import hinge
from .models.linear import LinearSVMModel, WorkingGram, fixed_effect_precision, meanfield_posterior, row_blocks

__all__ = ["is_dask_frame", "learn_design", "svm_dask", "DaskDesign", "DaskLinearModel"]

#: distinct values above which a non-numeric column is not treated as a factor (its levels are
#: collected on the client)
MAX_LEVELS = 100_000


def is_dask_frame(data) -> bool:
    """Whether ``data`` is a Dask DataFrame (checked without importing Dask)."""
    module = type(data).__module__ or ""
    return module.split(".")[0] in ("dask", "dask_expr") and hasattr(data, "npartitions") \
        and hasattr(data, "to_delayed") and hasattr(data, "columns")


def _dask():
    try:
        import dask
        import dask.dataframe  # noqa: F401
    except ImportError:  # pragma: no cover - is_dask_frame already saw a Dask object
        raise InputError('fitting a Dask DataFrame needs Dask: pip install "vbsvm[dask]".') from None
    return dask


def _tree_reduce(items, combine, fan_in=8):
    """Delayed sum of ``items`` by a fixed tree (the order of summation does not depend on the
    scheduler, so refits give identical numbers)."""
    dask = _dask()
    items = list(items)
    while len(items) > 1:
        items = [dask.delayed(combine)(*items[i:i + fan_in]) for i in range(0, len(items), fan_in)]
    return items[0]


# ============================================================================ the design spec
class DaskDesign:
    """Marker base; the real class is built by :func:`_design_class` on top of
    :class:`vbsvm.design.Design` (kept out of import time of :mod:`vbsvm.design`)."""


def _design_class():
    from dataclasses import dataclass

    from .design import Design

    @dataclass
    class _DaskDesign(Design, DaskDesign):
        """A :class:`~vbsvm.design.Design` learned from a Dask frame: no rows (``X``, ``y`` empty);
        ``raw`` is a small prototype frame holding every level of the data's categorical and
        grouping columns (what :meth:`new_X` checks new levels against); ``n_rows`` the rows used."""

        n_rows: int = 0

        @property
        def n(self) -> int:
            return self.n_rows

    return _DaskDesign


def _numeric(dtype) -> bool:
    return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


def learn_design(formula, data, *, standardize=True, missing="drop"):
    """The design of ``formula`` on the Dask frame ``data``, learned in two passes.

    Parameters
    ----------
    formula : str
    data : dask.dataframe.DataFrame
    standardize : bool
    missing : {"drop", "raise"}

    Returns
    -------
    design : Design
        A :class:`~vbsvm.design.Design` without rows (see the module docstring); ``design.n`` is
        the number of complete rows.
    """
    from .design import build_design, formula_columns

    dask = _dask()
    from .design import MISSING_ACTIONS

    if missing not in MISSING_ACTIONS:
        raise InputError(f"missing must be one of {MISSING_ACTIONS}, got {missing!r}.")
    if missing not in ("drop", "raise"):
        raise InputError(f"missing={missing!r} is not available for a Dask DataFrame: use missing='drop' "
                         "(incomplete rows are removed) or missing='raise'; to impute, fit a pandas frame.")
    if data.npartitions < 1:
        raise InputError("data (a Dask DataFrame) has no partitions; pass a frame with rows.")
    response, _, _, groups, columns = formula_columns(formula, data.columns)
    dtypes = data.dtypes
    level_cols = [c for c in columns if c == response or c in groups or not _numeric(dtypes[c])]
    numeric_cols = [c for c in columns if c not in level_cols]
    # pass 1: the rows, the levels (distinct values per partition, merged by a tree: no shuffle),
    # the numeric ranges
    scans = [dask.delayed(_scan)(p, response, level_cols, numeric_cols, dtypes, i)
             for i, p in enumerate(data.to_delayed())]
    try:
        got = dask.compute(_tree_reduce(scans, _merge_scans))[0]
    except ValueError as exc:  # Dask's own check of a partition against the meta
        raise meta_mismatch(exc) or exc from None
    if int(got["n"]) == 0:
        raise InputError("data has no rows; pass a non-empty Dask DataFrame.")
    if int(got["y_missing"]):
        raise InputError(f"the response {response!r} has {int(got['y_missing'])} missing value(s); vbsvm never "
                         f"imputes the response: drop those rows first (data.dropna(subset=[{response!r}])).")
    levels = {}
    for c in level_cols:
        values = pd.Series(got["levels"][c]).drop_duplicates()
        if len(values) > MAX_LEVELS:
            raise InputError(f"column {c!r} has more than {MAX_LEVELS} distinct values; a Dask fit treats "
                             "non-numeric columns and grouping columns as factors: recode it (or drop it "
                             "from the formula).")
        levels[c] = values.tolist()
    prototype = _prototype(data, levels, got.get("min"), got.get("max"), numeric_cols)
    design = build_design(formula, prototype, standardize=standardize, missing=missing)
    for g in design.groups:
        if len(g.factor) > 1:
            raise InputError(f"the random-effect term ({g.lhs} | {':'.join(g.factor)}) groups by an interaction "
                             "of columns; for a Dask frame build the combined column first "
                             "(data.assign(ab=data.a.astype(str) + ':' + data.b.astype(str))) and use (1 | ab).")
    state = getattr(design.spec, "transform_state", None)
    if state:
        raise InputError(f"the formula {formula!r} uses a transform that learns from the data "
                         f"({', '.join(map(str, state))}, e.g. center(), scale(), bs(), poly()); a Dask fit "
                         "cannot learn it in one pass: compute the column beforehand with Dask.")
    # pass 2: the standardization constants over the complete rows
    used = list(design.raw.columns)
    spec = _DesignSpec(design, None)
    parts = data[used].to_delayed()
    total = dask.compute(_tree_reduce([dask.delayed(_column_moments)(p, spec) for p in parts],
                                      _combine_moments))[0]
    count, mean, m2, top, n_dropped, n_incomplete = total
    if missing == "raise" and n_incomplete:
        raise InputError(f"{n_incomplete} row(s) have missing values in predictor or grouping columns; use "
                         "missing='drop' to remove incomplete rows (or drop them with Dask first).")
    if count == 0:
        raise InputError("no complete rows remain after removing rows with missing values; fill or drop the "
                         "mostly-missing column(s).")
    center = np.zeros(design.p)
    scale = np.ones(design.p)
    for j, name in enumerate(design.column_names):
        if name == "Intercept":
            continue
        sd = math.sqrt(m2[j] / (count - 1)) if count > 1 else 0.0
        if not sd > 0:
            raise InputError(f"design column {name!r} is constant ({mean[j]}); it carries no information and "
                             "is not identified with an intercept: remove it from the formula.")
        if standardize:
            center[j] = mean[j] if design.has_intercept else 0.0
            scale[j] = sd
    fields = {k: getattr(design, k) for k in design.__dataclass_fields__}
    fields.update(center=center, scale=scale, n_dropped=int(n_dropped), n_rows=int(count),
                  y=np.zeros(0), X=np.zeros((0, design.p)), missing_mask=np.zeros((0, design.p), bool),
                  row_labels=pd.RangeIndex(0))
    for g in design.groups:
        g.codes, g.Z = np.zeros(0, np.int64), None
    return _design_class()(**fields)


def _scan(frame, response, level_cols, numeric_cols, meta_dtypes=None, index=None) -> dict:
    """Rows, missing responses, distinct values of ``level_cols``, range of ``numeric_cols``
    (after checking the partition's dtypes against ``meta_dtypes``, the frame's)."""
    if meta_dtypes is not None:
        check_partition(frame, meta_dtypes, [*level_cols, *numeric_cols], index)
    num = frame[numeric_cols]
    return {"n": len(frame), "y_missing": int(frame[response].isna().sum()),
            "levels": {c: frame[c].dropna().drop_duplicates() for c in level_cols},
            "min": num.min(), "max": num.max()}


def _merge_scans(*parts) -> dict:
    return {"n": sum(p["n"] for p in parts), "y_missing": sum(p["y_missing"] for p in parts),
            "levels": {c: pd.concat([p["levels"][c] for p in parts]).drop_duplicates() for c in parts[0]["levels"]},
            "min": pd.concat([p["min"] for p in parts], axis=1).min(axis=1),
            "max": pd.concat([p["max"] for p in parts], axis=1).max(axis=1)}


def _prototype(data, levels, mins, maxs, numeric_cols) -> pd.DataFrame:
    """A small frame with the dtypes of ``data``, every level of its level columns and each
    numeric column's minimum, maximum and midpoint, after the first rows of the data."""
    head = data.partitions[0].head(64).dropna()
    size = max([3] + [len(v) for v in levels.values()])
    cols = {}
    for c in data.columns:
        c = str(c)
        dtype = data.dtypes[c]
        if c in levels:
            values = np.resize(np.array(levels[c] or [np.nan], dtype=object), size)
            if isinstance(dtype, pd.CategoricalDtype):
                known = dtype.categories if getattr(data[c].cat, "known", True) else pd.Index(sorted(levels[c], key=str))
                cols[c] = pd.Categorical(values, categories=known, ordered=dtype.ordered)
            elif pd.api.types.is_bool_dtype(dtype):
                cols[c] = pd.Series(values.astype(bool), dtype=dtype)
            else:
                cols[c] = pd.Series(values, dtype=dtype if _numeric(dtype) else head[c].dtype)
        elif c in numeric_cols:
            lo, hi = float(mins[c]), float(maxs[c])
            cols[c] = pd.Series(np.resize([lo, hi, lo + (hi - lo) / 2.0], size)).astype(dtype, errors="ignore")
        else:
            cols[c] = pd.Series(np.resize(head[c].to_numpy(), size) if len(head) else [None] * size)
    synthetic = pd.DataFrame(cols)
    frame = pd.concat([head.reset_index(drop=True), synthetic], ignore_index=True)
    for c in frame.columns:  # concat may upcast; keep the dtypes of the data
        if frame[c].dtype != data.dtypes[c] and not isinstance(data.dtypes[c], pd.CategoricalDtype):
            try:
                frame[c] = frame[c].astype(data.dtypes[c])
            except (TypeError, ValueError):
                pass
    return frame


#: rows of a partition put through formulaic at a time (a worker's transient memory is then
#: independent of the partitions' size)
CHUNK_ROWS = 32_768


def _chunks(n) -> list:
    return [slice(s, min(s + CHUNK_ROWS, n)) for s in range(0, n, CHUNK_ROWS)]


class _DesignSpec:
    """What a partition task needs to build its rows: the design and the model's priors."""

    def __init__(self, design, settings):
        self.design = design
        self.settings = settings

    def rows(self, frame: pd.DataFrame):
        """``(complete rows, rows dropped)`` of a raw partition."""
        incomplete = self.design.incomplete_rows(frame)
        n_bad = int(incomplete.sum())
        return (frame.loc[~incomplete] if n_bad else frame), n_bad

    def model(self, frame: pd.DataFrame):
        """The partition's :class:`LinearSVMModel` (its rows of the in-memory model), or None."""
        d, s = self.design, self.settings
        rows, _ = self.rows(frame)
        if len(rows) == 0:
            return None
        # by chunks of rows, so that formulaic's copies stay small whatever the partition's size;
        # column-major, the layout the model's products use (LinearSVMModel then keeps it as is)
        X = np.empty((len(rows), d.p), order="F")
        effects = []
        for chunk in _chunks(len(rows)):
            X[chunk] = d.new_X(rows.iloc[chunk])
            effects.append(d.new_random_effects(rows.iloc[chunk], new_levels="error"))
        y = np.where(np.asarray(rows[d.response] == d.positive_level, dtype=bool), 1.0, -1.0)
        groups = [(np.concatenate([e[k][0] for e in effects]), g.n_levels, g.name,
                   np.concatenate([e[k][1] for e in effects]))
                  for k, g in enumerate(d.groups)]
        return LinearSVMModel(X, y, groups, fixed_effect_precision(d, s["penalty"], s["sigma2_beta"]),
                              A=s["A_u"], B=s["B_u"], re_df=s.get("re_df"), re_scale=s.get("re_scale"),
                              intercept=d.column_names.index("Intercept") if d.has_intercept else None)


def _column_moments(frame, spec):
    """Count, mean, sum of squared deviations and largest absolute value of each unstandardized
    design column over a partition's complete rows (by chunks, combined by Chan's formulas), and
    its incomplete rows (twice: dropped, and counted for ``missing="raise"``)."""
    rows, n_bad = spec.rows(frame)
    zero = np.zeros(spec.design.p)
    parts = [(0, zero, zero, zero, 0, 0)]
    for chunk in _chunks(len(rows)):
        X = spec.design.new_X(rows.iloc[chunk], standardized=False)
        mean = X.mean(axis=0)
        parts.append((X.shape[0], mean, ((X - mean) ** 2).sum(axis=0), np.abs(X).max(axis=0), 0, 0))
    n, mean, m2, top, _, _ = _combine_moments(*parts)
    return n, mean, m2, top, n_bad, n_bad


def _combine_moments(*parts):
    """Chan, Golub & LeVeque's pairwise update of counts, means and sums of squared deviations."""
    n, mean, m2, top, bad, inc = parts[0]
    mean, m2, top = mean.copy(), m2.copy(), top.copy()
    for nb, mb, m2b, tb, badb, incb in parts[1:]:
        if nb:
            tot = n + nb
            delta = mb - mean
            mean = mean + delta * (nb / tot)
            m2 = m2 + m2b + delta * delta * (n * nb / tot)
            top = np.maximum(top, tb)
            n = tot
        bad, inc = bad + badb, inc + incb
    return n, mean, m2, top, bad, inc


# ============================================================================ partition blocks
#: sweep posteriors whose ``log chi`` a block keeps, the least recently used dropped first: a
#: SQUAREM step reads at most four (its start, its two sweeps, the newest)
CHI_KEPT = 5

#: pickle buffers below this many bytes stay inside a spilled partition's pickle (not in a file)
SMALL_BUFFER = 1 << 16

#: design bytes a block aims at: consecutive partitions are coalesced into blocks of up to this
#: size, about one per worker, so that a pass is about one task per worker (Dask's cost is per task). A task walks
#: its block partition by partition (a spilled partition's pages are mapped only while it is
#: used) and each partition by row chunks through scratch arrays allocated once per task
#: (:class:`_Rows`), so its working memory does not grow with the block.
BLOCK_BYTES = 256 * 2 ** 20


def _task_part(frame, spec, path):
    """The :class:`LinearSVMModel` of a raw partition's complete rows (None without any), kept
    as is (``path`` None) or spilled to files under ``path`` (:class:`_SpilledPart`)."""
    model = spec.model(frame)
    return model if model is None or path is None else _SpilledPart(model, path)


def _task_coalesce(path, *parts):
    """The :class:`_Block` of consecutive partitions ``parts`` (outputs of :func:`_task_part`):
    in memory (``path`` None) or spilled, its memory of per-row arrays under ``path``."""
    parts = [p for p in parts if p is not None]
    return _Resident(parts) if path is None else _Spilled(parts, path)


class _SpilledPart:
    """A partition's model in files under ``path``: pickled once (protocol 5) with its large
    arrays written out of band, one raw file each; :meth:`model` unpickles it over read-only
    memory maps of those files (no copy; the pages come from the page cache or the disk, and are
    released when the model is dropped)."""

    def __init__(self, model, path):
        os.makedirs(path)
        self.n = model.n
        self._files = []

        def out_of_band(buffer):
            raw = buffer.raw()
            if raw.nbytes < SMALL_BUFFER:
                return True  # in the pickle
            name = os.path.join(path, f"{len(self._files)}.bin")
            with open(name, "wb") as fh:
                fh.write(raw)
            self._files.append(name)
            return False

        self._pickle = pickle.dumps(model, protocol=5, buffer_callback=out_of_band)

    def model(self):
        return pickle.loads(self._pickle, buffers=[np.memmap(f, dtype=np.uint8, mode="r") for f in self._files])


class _Block:
    """Consecutive partitions' rows as the sweeps use them — one
    :class:`~vbsvm.models.linear.LinearSVMModel` each (the design's rows in the column-major
    layout of the Gram, the labels, the level codes), built once from the raw partition — and a
    memory of per-row arrays of the whole block by key (the ``log chi`` of the last ``CHI_KEPT``
    sweep posteriors used, the least recently used dropped). Kept on a worker by Dask; the
    subclasses hold the models and arrays in memory or in files. The memory is an optimization
    only: a task that misses it recomputes ``log chi`` from the posterior (e.g. on a worker
    holding a copy of the block).

    Parameters
    ----------
    parts : list
        The partitions' models (:class:`_Resident`) or :class:`_SpilledPart` (:class:`_Spilled`).
    """

    def __init__(self, parts):
        self._parts = parts
        self.offsets = np.cumsum([0] + [p.n for p in parts])
        self.n = int(self.offsets[-1])

    def models(self):
        """``(rows, model)`` of each partition: its slice of the block's rows and its model."""
        for k, part in enumerate(self._parts):
            yield slice(self.offsets[k], self.offsets[k + 1]), self._model(part)


class _Resident(_Block):
    """A :class:`_Block` in the worker's memory."""

    def __init__(self, parts):
        super().__init__(parts)
        self._values = {}
        self._kept = []  # keys, least recently used first

    @staticmethod
    def _model(part):
        return part

    def _touch(self, key) -> list:
        """Mark ``key`` used; returns the keys to drop."""
        if key in self._kept:
            self._kept.remove(key)
        self._kept.append(key)
        dropped, self._kept = self._kept[:-CHI_KEPT], self._kept[-CHI_KEPT:]
        return dropped

    def recall(self, key):
        got = self._values.get(key)
        if got is not None:
            self._touch(key)
        return got

    def remember(self, key, values):
        self._values[key] = values
        for old in self._touch(key):
            del self._values[old]

    def __sizeof__(self):  # what Dask counts as this block's memory
        arrays = [a for part in self._parts for a in vars(part).values()] + list(self._values.values())
        return 64 + sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


class _Spilled(_Block):
    """A :class:`_Block` of :class:`_SpilledPart` (each model is unpickled over memory maps while
    a task uses it); the remembered arrays are ``.npy`` files under ``path``, read through memory
    maps."""

    def __init__(self, parts, path):
        super().__init__(parts)
        os.makedirs(path)
        self.path = path

    @staticmethod
    def _model(part):
        return part.model()

    def _file(self, key) -> str:
        return os.path.join(self.path, f"kept_{key}.npy")

    # The order of use is the files' modification times, not a list: a copy of this handle on
    # another worker (Dask may move a task and its small inputs) then sees the same memory.
    def recall(self, key):
        name = self._file(key)
        try:
            os.utime(name)
        except FileNotFoundError:
            return None
        return np.load(name, mmap_mode="r")

    def remember(self, key, values):
        np.save(self._file(key), values)
        kept = sorted(glob.glob(os.path.join(self.path, "kept_*.npy")), key=os.path.getmtime)
        for old in kept[:-CHI_KEPT]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(old)


# ============================================================================ the model
class _Gram:
    """A :class:`~vbsvm.models.linear.WorkingGram` summed over partitions."""

    def __init__(self, A, bd, D=None, G=None, br=None):
        self.A, self.bd = A, bd
        if D is not None:
            self.D, self.G = D, G
        self.br = br


def _gram_parts(g) -> tuple:
    return (g.A, g.bd, getattr(g, "D", None), getattr(g, "G", None), g.br)


def _sum_tuples(*parts):
    out = list(parts[0])
    for p in parts[1:]:
        for k, v in enumerate(p):
            out[k] = v if out[k] is None else (out[k] if v is None else out[k] + v)
    return tuple(out)


class DaskState:
    """A VB state whose per-row part (``log chi``) is an expression of sweep posteriors,
    evaluated inside the partition tasks (see the module docstring).

    Supports what :func:`vbsvm.inference.vb.coordinate_ascent` does with states: ``+``, ``-`` and
    multiplication by a number; ``glob`` is the row-free part (``log B_q``, packed IW scales).
    """

    __array_ufunc__ = None  # numpy scalars defer to __rmul__

    def __init__(self, glob, rows):
        self.glob = np.asarray(glob, dtype=float)
        self.rows = rows

    def __add__(self, other):
        return DaskState(self.glob + other.glob, ("add", self.rows, other.rows))

    def __sub__(self, other):
        return DaskState(self.glob - other.glob, ("sub", self.rows, other.rows))

    def __rmul__(self, c):
        if not isinstance(c, numbers.Real):
            return NotImplemented
        return DaskState(c * self.glob, ("mul", float(c), self.rows))

    __mul__ = __rmul__


def _key(expr):
    """A hashable name of a state expression (a sweep posterior is named by its token)."""
    if expr[0] == "post":
        return ("post", expr[2])
    if expr[0] == "zero":
        return expr
    if expr[0] == "mul":
        return ("mul", expr[1], _key(expr[2]))
    return (expr[0], _key(expr[1]), _key(expr[2]))


def _log_chi(post, block):
    """``log chi`` of a block's rows after the sweep that produced ``post``."""
    out = np.empty(block.n)
    for rows, part in block.models():
        p = copy.copy(post)
        p.model = part
        mf, vf = p.linear_predictor()
        np.log(hinge.update_chi(part.y, mf, vf), out=out[rows])
    return out


def _evaluate(expr, block, rows, recalled):
    """Per-row values of a state expression on the block's ``rows`` (the in-memory arithmetic);
    the ``log chi`` of each sweep posterior comes from the block's memory when it is still there
    (:meth:`_Block.recall`), else it is recomputed from the posterior for the whole block.
    ``recalled`` (a dict, one per task) keeps what the task has recalled by token, so that a
    task evaluating the expression chunk by chunk recalls each array once."""
    kind = expr[0]
    if kind == "zero":
        return np.zeros(rows.stop - rows.start)
    if kind == "post":
        _, post, token = expr
        got = recalled.get(token)
        if got is None:
            got = block.recall(token)
            if got is None:
                got = _log_chi(post, block)
                block.remember(token, got)
            recalled[token] = got
        return got[rows]
    if kind == "mul":
        return expr[1] * _evaluate(expr[2], block, rows, recalled)
    a, b = _evaluate(expr[1], block, rows, recalled), _evaluate(expr[2], block, rows, recalled)
    return a + b if kind == "add" else a - b


class _Rows:
    """The row-chunked products of a pass over the partitions of a model without an eliminated
    term (the dense design ``C_d`` only), through scratch arrays allocated once: the chunks are
    :func:`~vbsvm.models.linear.row_blocks` of the design, and no array of a partition's size
    is allocated (Dask's workers return freed memory to the system at once —
    ``MALLOC_TRIM_THRESHOLD_`` — which makes every large temporary a fresh mapping whose pages
    fault in; with these buffers a pass runs as fast on a worker as in a plain process).

    The arithmetic is the in-memory engine's: the scores' moments of
    ``CoefficientPosterior._dense_predictor``, ``chi`` and the ELBO terms of :mod:`hinge`, the
    weights ``chi^{-1/2}`` of ``exp(log chi)`` and the products of
    :func:`~vbsvm.models.linear.weighted_gram`, only summed by chunks.

    Parameters
    ----------
    qd : int
        Columns of the dense design.
    """

    def __init__(self, qd):
        self.qd = qd
        step = row_blocks(2 ** 17, qd + 1)[0].stop  # the longest chunk
        self.V = np.empty((qd + 1, step))
        self.S = np.empty((step, qd), order="F")
        self.vec = np.empty((4, step))
        self.ones = np.ones(qd)
        self.AA = np.empty((qd, qd))
        self.A = np.zeros((qd, qd))
        self.bd = np.zeros(qd)

    def chunks(self, part) -> list:
        """The row chunks of a partition's model (slices of its rows)."""
        return row_blocks(part.n, self.qd + 1)

    def hinge(self, part, rows, loadings, log_chi) -> float:
        """The ELBO's hinge terms of ``rows`` under the posterior whose ``[L^{-1}; mu']`` is
        ``loadings``; writes their ``log chi`` into ``log_chi``."""
        C, y = part.Cd[rows], part.y[rows]
        k = y.size
        V = np.matmul(loadings, C.T, out=self.V[:, :k])
        mean = V[-1]
        var, gap, chi, terms = (v[:k] for v in self.vec)
        np.dot(self.ones, np.square(V[:-1], out=V[:-1]), out=var)
        np.multiply(y, mean, out=gap)
        np.subtract(1.0, gap, out=gap)
        np.square(gap, out=chi)
        chi += var
        np.maximum(chi, hinge.CHI_FLOOR, out=chi)
        np.log(chi, out=log_chi)
        np.square(gap, out=terms)  # (1 - y m) + (chi + T) / (2 sqrt(chi)), T = (1 - y m)^2 + v
        terms += var
        terms += chi
        terms /= np.sqrt(chi, out=chi)
        terms *= 0.5
        terms += gap
        return -float(terms.sum())

    def gram(self, part, rows, log_chi):
        """Add the working Gram ``C' W C`` and ``C' r`` of ``rows`` with ``w = chi^{-1/2}``
        from their ``log chi`` to :attr:`A`, :attr:`bd`."""
        C, y = part.Cd[rows], part.y[rows]
        k = y.size
        w, r = self.vec[0, :k], self.vec[1, :k]
        np.exp(log_chi, out=w)
        if not np.all(w > 0):
            raise ValueError("GIG: chi must be strictly positive")  # as hinge.expected_inverse
        np.sqrt(w, out=w)
        np.divide(1.0, w, out=w)
        np.add(1.0, w, out=r)
        r *= y
        self.bd += C.T @ r
        np.sqrt(w, out=w)
        S = np.multiply(C, w[:, None], out=self.S[:k])
        self.A += np.matmul(S.T, S, out=self.AA)

    def gram_parts(self) -> tuple:
        """The Gram added so far, as :func:`_gram_parts` of a model without an eliminated term."""
        return self.A, self.bd, None, None, np.zeros((0, 1))


def _partition_gram(part, log_chi) -> tuple:
    """The working Gram of a partition with an eliminated term (the model's own algebra)."""
    w = hinge.expected_inverse(np.exp(log_chi))
    return _gram_parts(WorkingGram(part, w, hinge.working_response(part.y, w)))


def _task_gram(block, state):
    """The working Gram of the block's rows given the per-row part ``state`` of a VB state."""
    grams, dense, recalled = [], None, {}
    for rows, part in block.models():
        if part.m_sparse:
            grams.append(_partition_gram(part, _evaluate(state, block, rows, recalled)))
            continue
        dense = dense or _Rows(part.qd)
        for sub in dense.chunks(part):  # the state's arithmetic by chunks too: small temporaries
            at = slice(rows.start + sub.start, rows.start + sub.stop)
            dense.gram(part, sub, _evaluate(state, block, at, recalled))
    if dense is not None:
        grams.append(dense.gram_parts())
    return _sum_gram(*grams)


def _task_sweep(block, post, token, differences):
    """The second pass of a sweep, fused with the first of the next: the hinge terms of the
    ELBO of ``post``; the block's ``log chi`` under ``post`` (kept under ``token``); the working
    Gram of those weights (the next sweep's, if it starts from this sweep's state); and, if
    ``differences`` is SQUAREM's ``(r, v)`` ending at this sweep's state, their norms."""
    log_chi = np.empty(block.n)
    value, grams, dense = 0.0, [], None
    for rows, part in block.models():
        if part.m_sparse:
            p = copy.copy(post)
            p.model = part
            mf, vf = p.linear_predictor()
            chi = hinge.update_chi(part.y, mf, vf)
            np.log(chi, out=log_chi[rows])
            value += hinge.elbo(part.y, mf, vf, chi)
            grams.append(_partition_gram(part, log_chi[rows]))
            continue
        if dense is None:
            dense = _Rows(part.qd)
            loadings = np.vstack([post.Linv, post.mean_dense])
        mine = log_chi[rows]
        for sub in dense.chunks(part):
            value += dense.hinge(part, sub, loadings, mine[sub])
            dense.gram(part, sub, mine[sub])
    if dense is not None:
        grams.append(dense.gram_parts())
    block.remember(token, log_chi)
    norms = None if differences is None else _task_norms(block, *differences, recalled={token: log_chi})
    return value, _sum_gram(*grams), norms


def _task_norms(block, r, v, recalled=None):
    """``(||r||^2, ||v||^2, v finite)`` of the per-row parts of two state expressions
    (``recalled``: arrays by token the caller holds, see :func:`_evaluate`)."""
    rr, vv, finite = 0.0, 0.0, True
    recalled = {} if recalled is None else recalled
    for rows, _ in block.models():
        rv, vv_ = _evaluate(r, block, rows, recalled), _evaluate(v, block, rows, recalled)
        rr += float(rv @ rv)
        vv += float(vv_ @ vv_)
        finite = finite and bool(np.all(np.isfinite(vv_)))
    return rr, vv, finite


def _sum_gram(*parts):
    parts = [p for p in parts if p is not None]
    return _sum_tuples(*parts) if parts else None


def _sum_norms(*parts):
    return (sum(p[0] for p in parts), sum(p[1] for p in parts), all(p[2] for p in parts))


def _sum_sweeps(*parts):
    norms = [p[2] for p in parts]
    return (sum(p[0] for p in parts), _sum_gram(*(p[1] for p in parts)),
            None if any(n is None for n in norms) else _sum_norms(*norms))


def _sum_floats(*parts):
    return float(sum(parts))


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
    settings : dict
        The checked settings of :func:`vbsvm.svm` (the priors).
    """

    #: the Grams, SQUAREM norms and origins computed ahead that are kept (newest first)
    KEPT_AHEAD = 4

    def __init__(self, blocks, design, settings):
        d, s = design, settings
        self.blocks = blocks
        # the model without rows: it owns the layout, the priors and the row-free algebra
        groups = [(np.zeros(0, np.int64), g.n_levels, g.name, np.zeros((0, g.q))) for g in d.groups]
        self.skeleton = LinearSVMModel(
            np.zeros((0, d.p)), np.zeros(0), groups, fixed_effect_precision(d, s["penalty"], s["sigma2_beta"]),
            A=s["A_u"], B=s["B_u"], re_df=s.get("re_df"), re_scale=s.get("re_scale"),
            intercept=d.column_names.index("Intercept") if d.has_intercept else None)
        self.n = d.n
        self.blas_work = 0.0  # the client's products are q-sized
        self.passes = 0
        self._tokens = itertools.count()  # names the sweep posteriors in the blocks' memories
        self._grams = {}  # key of a state's rows -> its working Gram, computed ahead
        self._norms = {}  # keys of SQUAREM's (r, v) -> their norms, computed ahead
        self._origin = {}  # token of a sweep posterior -> the rows of the state the sweep started from

    def _reduce(self, task, combine, *args):
        dask = _dask()
        shared = [dask.delayed(a, pure=False) for a in args]
        out = dask.compute(_tree_reduce([dask.delayed(task)(b, *shared) for b in self.blocks], combine))[0]
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
        gram = self._grams.pop(_key(state.rows), None)
        if gram is None:
            gram = self._reduce(_task_gram, _sum_gram, state.rows)
        q = self.skeleton.vb_update(Bq, q_cov, gram=_Gram(*gram))
        token = next(self._tokens)
        rows = ("post", q["theta"], token)
        differences = self._differences(state.rows, rows)
        hinge_terms, gram, norms = self._reduce(_task_sweep, _sum_sweeps, q["theta"], token, differences)
        self._keep(self._grams, _key(rows), gram)
        self._keep(self._origin, token, state.rows)
        if differences is not None:
            self._keep(self._norms, tuple(map(_key, differences)), norms)
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
        got = self._norms.pop((_key(r.rows), _key(v.rows)), None)
        rr, vv, finite = got if got is not None else self._reduce(_task_norms, _sum_norms, r.rows, v.rows)
        rr += float(r.glob @ r.glob)
        vv += float(v.glob @ v.glob)
        return math.sqrt(rr), math.sqrt(vv), finite and bool(np.all(np.isfinite(v.glob)))


# ============================================================================ fit and predict
def _refuse(settings, prior):
    method, approx = settings["method"], settings.get("approximation")
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
    if method == "vb" and approx == "calibrated":
        raise InputError("method='vb' (the calibrated EP approximation, the default) is not available for a Dask "
                         "DataFrame yet; pass method='meanfield' (mean-field VB, map-reduced over the partitions).")
    if method == "map":
        raise InputError("method='map' is not available for a Dask DataFrame yet; use method='meanfield'.")


def _fit_settings_dask(settings, persist):
    if persist not in ("auto", True, False):
        raise InputError(f"persist must be 'auto', True or False; got {persist!r}.")
    return persist


def svm_dask(formula, data, settings, *, prior=None, persist="auto"):
    """:func:`vbsvm.svm` for a Dask DataFrame (mean-field VB); see the module docstring.

    Parameters
    ----------
    formula : str
    data : dask.dataframe.DataFrame
    settings : dict
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
    from .fitting import random_effects_label
    from .inference.dispatch import APPROXIMATIONS
    from .inference.failures import numerical_failures
    from .inference.vb import coordinate_ascent
    from .results import ThetaLayout

    dask = _dask()
    start = time.perf_counter()
    _refuse(settings, prior)
    persist = _fit_settings_dask(settings, persist)
    design = learn_design(formula, data, standardize=settings["standardize"], missing=settings["missing"])
    _check_groups(design, settings)
    spec = _DesignSpec(design, settings)
    sources = data[list(design.raw.columns)].to_delayed()
    width = design.p + sum(g.n_levels * g.q for g in design.groups) + 4
    if persist == "auto":
        persist = 8.0 * design.n * width < _memory_budget()
    root = None if persist else tempfile.mkdtemp(prefix="vbsvm-dask-", dir=dask.config.get("temporary-directory", None))
    group = max(1, int(BLOCK_BYTES // (8.0 * width * max(design.n / len(sources), 1.0))))
    try:
        parts = [dask.delayed(_task_part)(s, spec, root and os.path.join(root, f"part{k}"))
                 for k, s in enumerate(sources)]
        blocks = _coalesce(parts, group, root)
        setup = time.perf_counter() - start
        model = DaskLinearModel(blocks, design, settings)
        layout = ThetaLayout.from_model(model.skeleton, design)
        M = design.to_original(model.skeleton.qd)
        info = {"model": "Bayesian linear SVM" + random_effects_label(design),
                "approximation": APPROXIMATIONS["meanfield"], "data": "dask",
                "partitions": int(data.npartitions), "blocks": len(blocks), "persisted": bool(persist)}
        with numerical_failures("variational Bayes"):
            res = coordinate_ascent(model, tol=settings["tol"], max_iter=settings["max_iter"],
                                    accelerate=settings["accelerate"])
        posterior = meanfield_posterior(res.q, res.elbo, M, model.skeleton)
        info.update(converged=res.converged, n_sweeps=res.n_sweeps, seconds=res.seconds, passes=model.passes,
                    seconds_setup=setup, **res.info)
        fit = _fit_class()(design=design, layout=layout, settings=settings, method="vb", posterior=posterior,
                           info=info)
        fit.info["prob_calibration"] = list(_probit_calibration(res.q["theta"], blocks))
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return fit


def _coalesce(parts, group, root) -> list:
    """The blocks of the partitions' models ``parts`` (delayed :func:`_task_part`), built and kept
    on the workers. The blocks are consecutive runs of partitions of equal lengths (within one), as
    many as the smallest multiple of the workers that gives runs of at most ``group`` partitions
    (one block per worker when the data allow); block ``j``'s partitions are built and coalesced into one
    :class:`_Block` on worker ``j`` modulo the workers (a resident model is then not copied;
    Dask may still move a task if that worker is gone or busy). The blocks, and so the order of
    every sum over them, depend on the partitions and the number of workers only, not on where
    the scheduler ran what: a refit gives identical numbers. Spilled (memory under ``root``)
    unless ``root`` is None. Returns futures with a distributed client, else persisted delayed
    objects."""
    dask = _dask()
    client = _client()
    workers = sorted(_workers(client)) if client is not None else [None]
    count = len(workers) * math.ceil(len(parts) / (len(workers) * group))
    edges = [k * len(parts) // count for k in range(count + 1)]
    runs = [parts[a:b] for a, b in zip(edges[:-1], edges[1:]) if b > a]
    paths = [root and os.path.join(root, f"block{j}") for j in range(len(runs))]
    if client is None:
        return list(dask.persist(*[dask.delayed(_task_coalesce)(path, *run) for path, run in zip(paths, runs)]))
    from distributed import wait

    blocks = []
    for j, (path, run) in enumerate(zip(paths, runs)):
        where = [workers[j % len(workers)]]
        built = client.compute(run, workers=where, allow_other_workers=True)
        blocks.append(client.submit(_task_coalesce, path, *built, workers=where, allow_other_workers=True,
                                    pure=False))
    wait(blocks)
    return blocks


def _client():
    """The distributed client in use, or None (no distributed, or a local scheduler)."""
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


def _workers(client) -> dict:
    """The scheduler's information on each worker, by address."""
    try:
        return client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:  # older distributed
        return client.scheduler_info()["workers"]


def _check_groups(design, settings):
    from .api import _check_re_prior

    _check_re_prior(design, settings, None)


def _memory_budget() -> float:
    """Half the workers' total memory limit (bytes), or 1 GB without a distributed client."""
    client = _client()
    if client is None:
        return 1e9
    total = float(sum(w.get("memory_limit") or 0 for w in _workers(client).values()))
    return 0.5 * total if total > 0 else 1e9


def _scores(block, post):
    """``(y m, s)`` of the block's rows under ``post`` (for the probit scale), from its memory or
    computed and kept there."""
    got = block.recall("scores")
    if got is None:
        got = np.empty((2, block.n))
        for rows, part in block.models():
            p = copy.copy(post)
            p.model = part
            mf, vf = p.linear_predictor()
            got[:, rows] = part.y * mf, np.sqrt(np.maximum(vf, 0.0))
        block.remember("scores", got)
    return got


def _task_nll(block, post, a):
    from scipy.special import log_ndtr

    ym, s = _scores(block, post)
    return -float(log_ndtr(a * ym / np.sqrt(1.0 + (a * s) ** 2)).sum())


def _probit_calibration(post, blocks):
    """:func:`vbsvm.results.fit_probit_calibration` over the partitions: the scores of the
    training rows under the final ``q(theta)`` are computed at the first evaluation and kept in
    the blocks (16 bytes a row, in memory or in the spill files) while the one-dimensional search
    sums the log likelihood over them."""
    from .results import calibration_scale

    dask = _dask()
    shared = dask.delayed(post, pure=False)

    def nll(log_a):
        a = math.exp(log_a)
        return dask.compute(_tree_reduce([dask.delayed(_task_nll)(b, shared, a) for b in blocks], _sum_floats))[0]

    return calibration_scale(nll)


def _light_fit(fit):
    """A copy of ``fit`` without its caches (what the partition tasks receive)."""
    out = copy.copy(fit)
    out._cache = {}
    return out


_FIT_CLASS = None


def _fit_class():
    """:class:`DaskFit`, built on :class:`vbsvm.results.Fit` at first use."""
    global _FIT_CLASS
    if _FIT_CLASS is None:
        from .results import Fit

        class DaskFit(Fit):
            """A :class:`~vbsvm.results.Fit` from a Dask frame. It keeps no training rows:
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

            def to_arviz(self, log_likelihood=True):
                if log_likelihood:
                    raise InputError("a fit from a Dask DataFrame keeps no rows, so it has no pointwise log "
                                     "likelihood: call to_arviz(log_likelihood=False).")
                raise InputError("to_arviz() of a fit from a Dask DataFrame is not available yet (the tree "
                                 "stores the training rows); use fit.coef, fit.varcomp() and fit.posterior.")

            def save(self, path):
                raise InputError("saving a fit made from a Dask DataFrame is not available yet (a saved fit "
                                 "rebuilds its design from its training rows, which this fit does not keep).")

        _FIT_CLASS = DaskFit
    return _FIT_CLASS


def __getattr__(name):
    if name == "DaskFit":
        return _fit_class()
    raise AttributeError(name)


def predict_dask(fit, data, *, kind="class", new_levels="integrate", na_action="pass"):
    """:meth:`vbsvm.results.Fit.predict` of a Dask DataFrame: a lazy Dask Series (a DataFrame for
    ``kind="score"``), one pandas prediction per partition.

    ``na_action="drop"`` drops rows within each partition; the result's divisions are then unknown.
    """
    from .results import Fit

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


def lazy_predictions(data, design, kind, predict_frame):
    """``data.map_partitions(predict_frame)`` with the metadata of the predictions of ``kind``
    (a Series named like the pandas result; a DataFrame of mean and sd for ``"score"``)."""
    d = design
    if kind == "score":
        meta = pd.DataFrame({"mean": pd.Series([], dtype=float), "sd": pd.Series([], dtype=float)})
    elif kind == "class":
        meta = pd.Series([], dtype=object, name=d.response)
    elif kind == "prob":
        meta = pd.Series([], dtype=float, name=f"P({d.response}={d.positive_level!r})")
    else:
        meta = pd.Series([], dtype=float, name=f"P(score > 0) for P({d.response}={d.positive_level!r})")
    meta.index = data._meta.index
    return data.map_partitions(predict_frame, meta=meta)


# ============================================================================ GP SVI minibatches
def _task_rows(frame, design, keep, positions):
    """Rows ``positions`` (sorted, with repeats) of a partition's complete rows, as
    ``(X[:, keep], y)`` of the design (``frame`` may be a raw partition or a persisted one)."""
    rows = frame.loc[~design.incomplete_rows(frame)]
    rows = rows.iloc[positions]
    X = design.new_X(rows)[:, keep]
    y = np.where(np.asarray(rows[design.response] == design.positive_level, dtype=bool), 1.0, -1.0)
    return np.ascontiguousarray(X), y


def _task_complete_rows(frame, design):
    return int((~design.incomplete_rows(frame)).sum())


class DaskBatches:
    """Minibatches for SVI (:func:`vbsvm.inference.svi.fit_svi`) from the partitions of a Dask
    frame, in memory independent of n.

    Each draw picks a partition at random with probability proportional to its complete rows
    and ``per_load`` minibatches of ``batch_size`` rows uniformly (with replacement) within it;
    one task returns just those rows (the worker reads the partition, e.g. from Parquet), and
    the next group is requested while the current one is consumed. Every minibatch is an
    unbiased sample of the full data sum (row i of partition k has probability
    ``n_k / n * 1 / n_k``). All random numbers come from the fit's generator, so the stream is a
    function of the seed only (not of the cluster).

    Parameters
    ----------
    data : dask.dataframe.DataFrame
    design : Design
        From :func:`learn_design`.
    keep : array of int
        The design columns the GP uses.
    """

    per_load = 50

    def __init__(self, data, design, keep):
        dask = _dask()
        self.design, self.keep = design, np.asarray(keep, dtype=int)
        self.parts = data[list(design.raw.columns)].to_delayed()
        self.sizes = np.asarray(dask.compute(*[dask.delayed(_task_complete_rows)(p, design)
                                               for p in self.parts]), dtype=np.int64)
        self.n = int(self.sizes.sum())
        if self.n == 0:
            raise InputError("data (a Dask DataFrame) has no complete rows for the formula.")
        self.b = None
        self.rng = None
        self.loads = 0

    def _request(self, counts_by_part):
        """Delayed ``(X, y)`` of ``counts_by_part`` ({partition: positions}), one task each."""
        dask = _dask()
        return [dask.delayed(_task_rows)(self.parts[k], self.design, self.keep, pos)
                for k, pos in counts_by_part.items()]

    def sample(self, rng, size):
        """``size`` rows (with replacement, partition chosen per row ∝ its rows): for the
        inducing points and the ELBO monitor."""
        dask = _dask()
        counts = rng.multinomial(int(size), self.sizes / self.n)
        todo = {k: np.sort(rng.integers(0, self.sizes[k], c)) for k, c in enumerate(counts) if c}
        got = dask.compute(*self._request(todo))
        return np.vstack([g[0] for g in got]), np.concatenate([g[1] for g in got])

    def batches(self, batch_size, rng):
        """The minibatch source: an iterable of ``(X, y)``."""
        self.b, self.rng = int(batch_size), rng
        return self

    def _group(self):
        k = int(self.rng.choice(self.sizes.size, p=self.sizes / self.n))
        pos = np.sort(self.rng.integers(0, self.sizes[k], (self.per_load, self.b)), axis=1)
        self.loads += 1
        return self._request({k: pos.ravel()})[0]

    def __iter__(self):
        dask = _dask()
        try:
            from distributed import get_client

            client = get_client()
        except (ImportError, ValueError):
            client = None
        pending = client.compute(self._group()) if client is not None else self._group()
        while True:
            if client is not None:
                X, y = pending.result()
                pending = client.compute(self._group())  # prefetch while these are used
            else:
                X, y = dask.compute(pending)[0]
                pending = self._group()
            for s in range(0, X.shape[0], self.b):
                yield X[s:s + self.b], y[s:s + self.b]
