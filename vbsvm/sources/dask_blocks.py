"""The design of a Dask DataFrame held on the workers by blocks (in memory or spilled to files),
and the map-reduce tasks over them: the working Gram, the sweep statistics, SQUAREM's norms and the
scores of the probit calibration.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import math
import numbers
import os
import pickle

import numpy as np

from vbsvm.models import hinge
from vbsvm.models.linear_algebra import WorkingGram, row_blocks
from vbsvm.sources.dask_frames import import_dask, release_arrow_memory

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


def task_part(frame, spec, path):
    """The :class:`LinearSVMModel` of a raw partition's complete rows (None without any), kept
    as is (``path`` None) or spilled to files under ``path`` (:class:`_SpilledPart`)."""
    release_arrow_memory()
    model = spec.model(frame)
    return model if model is None or path is None else _SpilledPart(model, path)


def _task_coalesce(path, *parts):
    """The :class:`_Block` of consecutive partitions ``parts`` (outputs of :func:`task_part`):
    in memory (``path`` None) or spilled, its memory of per-row arrays under ``path``."""
    parts = [p for p in parts if p is not None]
    return _Resident(parts) if path is None else _Spilled(parts, path)


class _SpilledPart:
    """A partition's model in files under ``path``: pickled once (protocol 5) with its large
    arrays written out of band, one raw file each; :meth:`model` unpickles it over read-only
    memory maps of those files (no copy; the pages come from the page cache or the disk, and are
    released when the model is dropped)."""

    def __init__(self, model, path):
        os.makedirs(path, exist_ok=True)  # exists if Dask recomputes the task (a worker restarted)
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

    # Named per-row vectors kept until the client drops them (EP's site vectors,
    # :mod:`vbsvm.sources.dask_ep`): unlike the memory above, they cannot be recomputed.
    def keep_vector(self, key, values):
        """Keep the block's per-row ``values`` under the name ``key`` (an int)."""
        raise NotImplementedError

    def vector_writer(self, key):
        """A writer of the vector to keep under ``key``, filled by consecutive row chunks
        (``write(rows, values)``, then ``close()``; ``abort()`` keeps nothing)."""
        return _ArrayWriter(self, key)

    def vector(self, key):
        """The per-row vector kept under ``key``."""
        raise NotImplementedError

    def drop_vectors(self, keys):
        """Forget the vectors kept under ``keys`` (absent ones are ignored)."""
        raise NotImplementedError


class _Resident(_Block):
    """A :class:`_Block` in the worker's memory."""

    def __init__(self, parts):
        super().__init__(parts)
        self._values = {}
        self._kept = []  # keys, least recently used first
        self._vectors = {}

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

    def keep_vector(self, key, values):
        self._vectors[key] = values

    def vector(self, key):
        got = self._vectors.get(key)
        if got is None:
            raise RuntimeError("a block of the Dask fit lost the per-row vectors it kept (a worker restarted, or "
                               "the block was copied to another worker); refit, with persist=False if the "
                               "workers run out of memory.")
        return got

    def drop_vectors(self, keys):
        for key in keys:
            self._vectors.pop(key, None)

    def __sizeof__(self):  # what Dask counts as this block's memory
        arrays = ([a for part in self._parts for a in vars(part).values()] + list(self._values.values())
                  + list(self._vectors.values()))
        return 64 + sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


class _Spilled(_Block):
    """A :class:`_Block` of :class:`_SpilledPart` (each model is unpickled over memory maps while
    a task uses it); the remembered arrays are ``.npy`` files under ``path``, read through memory
    maps."""

    def __init__(self, parts, path):
        super().__init__(parts)
        os.makedirs(path, exist_ok=True)  # as in _SpilledPart; kept vectors survive a recomputed block
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

    # Vectors are raw files written and read by row chunks (not memory-mapped: mapped pages
    # would count in the worker's memory while a task walks its block).
    def _vector_file(self, key) -> str:
        return os.path.join(self.path, f"vector_{int(key)}.bin")

    def keep_vector(self, key, values):
        np.ascontiguousarray(values, dtype=float).tofile(self._vector_file(key))

    def vector_writer(self, key):
        return _FileWriter(self._vector_file(key))

    def vector(self, key):
        return _FileVector(self._vector_file(key))

    def drop_vectors(self, keys):
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._vector_file(key))

    def remember(self, key, values):
        np.save(self._file(key), values)
        kept = sorted(glob.glob(os.path.join(self.path, "kept_*.npy")), key=os.path.getmtime)
        for old in kept[:-CHI_KEPT]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(old)


class _ArrayWriter:
    """:meth:`_Block.vector_writer` of a block in memory: an array, kept when closed."""

    def __init__(self, block, key):
        self.block, self.key, self.values = block, key, np.empty(block.n)

    def write(self, rows, values):
        self.values[rows] = values

    def close(self):
        self.block.keep_vector(self.key, self.values)

    def abort(self):
        self.values = None


class _FileWriter:
    """:meth:`_Block.vector_writer` of a spilled block: the chunks appended to a raw file."""

    def __init__(self, name):
        self.name, self.file, self.at = name, open(name, "wb"), 0  # noqa: SIM115 - closed by close/abort

    def write(self, rows, values):
        if rows.start != self.at:
            raise ValueError("a vector's chunks are written in order")
        np.ascontiguousarray(values, dtype=float).tofile(self.file)
        self.at = rows.stop

    def close(self):
        self.file.close()

    def abort(self):
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.name)


class _FileVector:
    """A spilled block's kept vector, read by row chunks (``vector[rows]``) from its raw file."""

    def __init__(self, name):
        self.file = open(name, "rb")  # noqa: SIM115 - closed with this object

    def __getitem__(self, rows):
        self.file.seek(8 * rows.start)
        return np.fromfile(self.file, dtype=float, count=rows.stop - rows.start)

    def __del__(self):
        self.file.close()


# ============================================================================ the model
class Gram:
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


def expression_key(expr):
    """A hashable name of a state expression (a sweep posterior is named by its token)."""
    if expr[0] == "post":
        return ("post", expr[2])
    if expr[0] == "zero":
        return expr
    if expr[0] == "mul":
        return ("mul", expr[1], expression_key(expr[2]))
    return (expr[0], expression_key(expr[1]), expression_key(expr[2]))


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


def task_gram(block, state):
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
    return sum_gram(*grams)


def task_sweep(block, post, token, differences):
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
    norms = None if differences is None else task_norms(block, *differences, recalled={token: log_chi})
    return value, sum_gram(*grams), norms


def task_norms(block, r, v, recalled=None):
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


def sum_gram(*parts):
    parts = [p for p in parts if p is not None]
    return _sum_tuples(*parts) if parts else None


def sum_norms(*parts):
    return (sum(p[0] for p in parts), sum(p[1] for p in parts), all(p[2] for p in parts))


def sum_sweeps(*parts):
    norms = [p[2] for p in parts]
    return (sum(p[0] for p in parts), sum_gram(*(p[1] for p in parts)),
            None if any(n is None for n in norms) else sum_norms(*norms))


def sum_floats(*parts):
    return float(sum(parts))


def coalesce_partitions(parts, group, root) -> list:
    """The blocks of the partitions' models ``parts`` (delayed :func:`task_part`), built and kept
    on the workers. The blocks are consecutive runs of partitions of equal lengths (within one), as
    many as the smallest multiple of the workers that gives runs of at most ``group`` partitions
    (one block per worker when the data allow); block ``j``'s partitions are built and coalesced into one
    :class:`_Block` on worker ``j`` modulo the workers (a resident model is then not copied;
    Dask may still move a task if that worker is gone or busy). The blocks, and so the order of
    every sum over them, depend on the partitions and the number of workers only, not on where
    the scheduler ran what: a refit gives identical numbers. Spilled (memory under ``root``)
    unless ``root`` is None. Returns futures with a distributed client, else persisted delayed
    objects."""
    dask = import_dask()
    client = distributed_client()
    workers = sorted(worker_info(client)) if client is not None else [None]
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


def task_nll(block, post, a):
    from scipy.special import log_ndtr

    ym, s = _scores(block, post)
    return -float(log_ndtr(a * ym / np.sqrt(1.0 + (a * s) ** 2)).sum())


def distributed_client():
    """The distributed client in use, or None (no distributed, or a local scheduler)."""
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


def worker_info(client) -> dict:
    """The scheduler's information on each worker, by address."""
    try:
        return client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:  # older distributed
        return client.scheduler_info()["workers"]


def memory_budget() -> float:
    """Half the workers' total memory limit (bytes), or 1 GB without a distributed client."""
    client = distributed_client()
    if client is None:
        return 1e9
    total = float(sum(w.get("memory_limit") or 0 for w in worker_info(client).values()))
    return 0.5 * total if total > 0 else 1e9
