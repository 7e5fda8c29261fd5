"""A Dask DataFrame as a data source: its design learned in two passes (levels, then
standardization constants), lazy predictions partition by partition, and random minibatches for SVI.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd

from vbsvm.exceptions import InputError
from vbsvm.formula.design import MISSING_ACTIONS, Design, build_design, formula_columns
from vbsvm.models.linear import LinearSVMModel, fixed_effect_precision
from vbsvm.sources.dask_checks import check_partition, meta_mismatch

#: distinct values above which a non-numeric column is not treated as a factor (its levels are
#: collected on the client)
MAX_LEVELS = 100_000


def is_dask_frame(data) -> bool:
    """Whether ``data`` is a Dask DataFrame (checked without importing Dask)."""
    module = type(data).__module__ or ""
    return module.split(".")[0] in ("dask", "dask_expr") and hasattr(data, "npartitions") \
        and hasattr(data, "to_delayed") and hasattr(data, "columns")


def import_dask():
    try:
        import dask
        import dask.dataframe
    except ImportError:  # pragma: no cover - is_dask_frame already saw a Dask object
        raise InputError('fitting a Dask DataFrame needs Dask: pip install "vbsvm[dask]".') from None
    return dask


def tree_reduce(items, combine, fan_in=8):
    """Delayed sum of ``items`` by a fixed tree (the order of summation does not depend on the
    scheduler, so refits give identical numbers)."""
    dask = import_dask()
    items = list(items)
    while len(items) > 1:
        items = [dask.delayed(combine)(*items[i:i + fan_in]) for i in range(0, len(items), fan_in)]
    return items[0]


# ============================================================================ the design spec
class DaskDesign:
    """Marker base; the real class is built by :func:`_design_class` on top of
    :class:`vbsvm.formula.design.Design` (kept out of import time of :mod:`vbsvm.formula.design`)."""


def _design_class():
    from dataclasses import dataclass

    @dataclass
    class _DaskDesign(Design, DaskDesign):
        """A :class:`~vbsvm.formula.design.Design` learned from a Dask frame: no rows (``X``, ``y`` empty);
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
        A :class:`~vbsvm.formula.design.Design` without rows (see the module docstring); ``design.n`` is
        the number of complete rows.
    """

    dask = import_dask()

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
        got = dask.compute(tree_reduce(scans, _merge_scans))[0]
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
    spec = DesignSpec(design, None)
    parts = data[used].to_delayed()
    total = dask.compute(tree_reduce([dask.delayed(_column_moments)(p, spec) for p in parts],
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


def release_arrow_memory() -> None:
    """Return to the system what pyarrow's default memory pool keeps of freed buffers (the
    partitions the source read before, e.g. Parquet): the pool (mimalloc, jemalloc) holds them for
    reuse, and a worker's memory limit counts them; on 2 workers of 500 MB the set-up of a 2e7-row
    fit was killed without this. Called at the start of every task that reads a raw partition."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


def _scan(frame, response, level_cols, numeric_cols, meta_dtypes=None, index=None) -> dict:
    """Rows, missing responses, distinct values of ``level_cols``, range of ``numeric_cols``
    (after checking the partition's dtypes against ``meta_dtypes``, the frame's)."""
    release_arrow_memory()
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
        dask = import_dask()
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
        dask = import_dask()
        return [dask.delayed(_task_rows)(self.parts[k], self.design, self.keep, pos)
                for k, pos in counts_by_part.items()]

    def sample(self, rng, size):
        """``size`` rows (with replacement, partition chosen per row ∝ its rows): for the
        inducing points and the ELBO monitor."""
        dask = import_dask()
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
        dask = import_dask()
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


class DesignSpec:
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
    release_arrow_memory()
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
