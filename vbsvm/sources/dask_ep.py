r"""Parallel EP's row operations on the blocks of a Dask frame: site vectors kept with the rows,
named and combined on the client, every pass one task per block.

The engine (:mod:`vbsvm.inference.ep_sites`) and the variance integration on top of it read the
rows only through a :class:`~vbsvm.inference.ep_sites.SiteRows`; :class:`DaskSiteRows` is the one
of a Dask frame, handed to them as ``model.ep_rows`` of :class:`DaskEPModel`.

Site vectors. A site vector (the precisions or the shifts of the n hinge sites) is a
:class:`DaskVector`: an *expression* — a vector kept in the blocks under a name, the default
sites (``START_PRECISION`` times 1 and ``2 y``), or ``c * v``, ``v + w``, ``v - w`` of such —
evaluated row by row inside the block tasks with the floating-point operations of the in-memory arrays. So damping
(``(1 - d) x + d F(x)``), SQUAREM's proposal and the warm starts scaled along the grid of
variances cost nothing until a pass reads them; ``v @ w`` is a reduction over the blocks. Each
pass keeps the new sites ``F(x)`` in the blocks under new names and also the sites ``x`` it read
when they were a combination, whose expression then becomes that name: expressions never grow
beyond a combination of a few named vectors. The client holds a name (:class:`_Name`) as long as a
vector refers to it; when the last reference goes (an EP run's sites released, a SQUAREM step
done) the name is sent with the next pass, and every block forgets the vector. The blocks keep
the vectors in memory, or in raw files next to their spilled design, written and read by row
chunks (:class:`~vbsvm.sources.dask_blocks._Block`): a task's memory is its chunk's, not its block's.

Passes. A pass is one task per block (on the worker that holds it), whose O(q^2) results
are summed on the client in the order of the blocks (a function of the partitions and the workers
only: a refit gives identical numbers). Kinds: the EP sweep (the scores under the broadcast
Gaussian ``[L^{-1}; mu']``, cavities, tilted moments, new sites, their statistics ``C' W C`` and
``C' r``, the scalars of ``log Z_EP``, the largest site change and leverage, and whether the new
sites are finite and non-negative), the statistics of a site vector, dot products of site vectors
(SQUAREM's norms, the scaling of warm starts), the check of a SQUAREM proposal, and the sums of the
marginal corrections (:func:`vbsvm.inference.ep.log_site_corrections`). A task walks its block
by row chunks (:func:`~vbsvm.models.linear_algebra.row_blocks`) through scratch arrays allocated
once (:class:`_Scratch`).
"""

from __future__ import annotations

import itertools
import numbers
import weakref

import numpy as np

from vbsvm.inference.ep_sites import (
    START_PRECISION,
    SiteStatistics,
    cavity,
    site_terms,
    tilted_moments,
)
from vbsvm.models.linear_algebra import row_blocks
from vbsvm.sources.dask_frames import import_dask

__all__ = ["DaskEPModel", "DaskSiteRows", "DaskVector", "ScoreGaussian"]

#: rows of a site vector read at a time by the passes that read no design (dot products, checks)
VECTOR_CHUNK = 1 << 16


# ============================================================================ expressions
class _Name:
    """The name of a vector kept in the blocks, on the client: when it is no longer referred to,
    the blocks are told to forget the vector (see the module docstring)."""

    __slots__ = ("__weakref__", "key")

    def __init__(self, key):
        self.key = key


class DaskVector:
    """A site vector of the rows of a Dask frame: an expression evaluated inside the block tasks
    (see the module docstring). Supports ``c * v``, ``v + w``, ``v - w`` (lazy) and ``v @ w``
    (a pass)."""

    __array_ufunc__ = None  # numpy scalars defer to __rmul__

    def __init__(self, rows, expr):
        self.rows, self.expr = rows, expr
        #: whether the vector is finite (and non-negative, for precisions), when a pass found out
        self.ok = None

    def __rmul__(self, c):
        if not isinstance(c, numbers.Real):
            return NotImplemented
        return DaskVector(self.rows, ("mul", float(c), self.expr))

    __mul__ = __rmul__

    def __add__(self, other):
        return DaskVector(self.rows, ("add", self.expr, other.expr))

    def __sub__(self, other):
        return DaskVector(self.rows, ("sub", self.expr, other.expr))

    def __matmul__(self, other):
        return self.rows.dots([(self.expr, other.expr)])[0]


def _wire(expr):
    """``expr`` with its names replaced by their keys (what a task receives)."""
    kind = expr[0]
    if kind == "ref":
        return ("ref", expr[1].key)
    if kind == "mul":
        return ("mul", expr[1], _wire(expr[2]))
    if kind in ("add", "sub"):
        return (kind, _wire(expr[1]), _wire(expr[2]))
    return expr


def _evaluate(expr, block, at, y, cache):
    """The values of a wired expression on the block's rows ``at`` (labels ``y``); ``cache`` keeps
    the vectors a task has read, by key."""
    kind = expr[0]
    if kind == "ref":
        got = cache.get(expr[1])
        if got is None:
            got = cache[expr[1]] = block.vector(expr[1])
        return got[at]
    if kind == "ones":
        return np.ones(at.stop - at.start)
    if kind == "two_y":
        return 2.0 * y
    if kind == "mul":
        return expr[1] * _evaluate(expr[2], block, at, y, cache)
    a, b = _evaluate(expr[1], block, at, y, cache), _evaluate(expr[2], block, at, y, cache)
    return a + b if kind == "add" else a - b


def _chunks(block, width):
    """``(at, part, sub)``: the block's rows by chunks, ``at`` in the block, ``sub`` in ``part``."""
    for rows, part in block.models():
        for sub in row_blocks(part.n, width):
            yield slice(rows.start + sub.start, rows.start + sub.stop), part, sub


# ============================================================================ block tasks
class _Scratch:
    """Scratch arrays of a task over rows of ``qd`` dense columns (the longest row chunk)."""

    def __init__(self, qd):
        step = row_blocks(2 ** 17, qd + 1)[0].stop
        self.V = np.empty((qd + 1, step))
        self.S = np.empty((step, qd), order="F")
        self.mean = np.empty(step)
        self.var = np.empty(step)
        self.ones = np.ones(qd)
        self.AA = np.empty((qd, qd))
        self.A = np.zeros((qd, qd))
        self.bd = np.zeros(qd)

    def scores(self, loadings, C, k):
        """Mean and variance of the scores of the rows ``C`` under ``[L^{-1}; mu']`` (the
        in-memory engine's product)."""
        V = np.matmul(loadings, C.T, out=self.V[:, :k])
        mean = self.mean[:k]
        mean[...] = V[-1]
        var = np.dot(self.ones, np.square(V[:-1], out=V[:-1]), out=self.var[:k])
        return mean, var

    def add(self, C, w, r, k):
        """Add ``C' diag(w) C`` and ``C' r`` of the rows ``C`` to :attr:`A`, :attr:`bd`."""
        scaled = np.multiply(C, np.sqrt(np.maximum(w, 0.0))[:, None], out=self.S[:k])
        self.A += np.matmul(scaled.T, scaled, out=self.AA)
        self.bd += C.T @ r


class _Writers:
    """Writers of the vectors a task keeps (:meth:`~vbsvm.sources.dask_blocks._Block.vector_writer`;
    None for a key None)."""

    def __init__(self, block, keys):
        self.writers = [None if key is None else block.vector_writer(key) for key in keys]

    def write(self, rows, values):
        for w, v in zip(self.writers, values):
            if w is not None:
                w.write(rows, v)

    def close(self, keep=True):
        for w in self.writers:
            if w is not None:
                w.close() if keep else w.abort()


def task_ep_sweep(block, drop, qd, loadings, prec, shift, x_keys, new_keys):
    """One EP pass over the block's rows from the sites ``(prec, shift)`` (wired expressions)
    under the Gaussian whose ``[L^{-1}; mu']`` is ``loadings``: the in-memory
    :meth:`~vbsvm.inference.ep_sites.SiteRows.sweep` on these rows. Keeps the new sites under
    ``new_keys`` and the sites read under ``x_keys`` (None: not kept). Returns ``(A, bd,
    site_sum, quad, change, leverage, ok, new_ok)``."""
    block.drop_vectors(drop)
    kept = _Writers(block, list(new_keys) + list(x_keys))
    work = _Scratch(qd)
    cache = {}
    site_sum, quad, change, leverage, ok, new_ok = 0.0, 0.0, 0.0, 0.0, True, True
    for at, part, sub in _chunks(block, qd + 1):
        y, C = part.y[sub], part.Cd[sub]
        k = y.size
        pb, sb = _evaluate(prec, block, at, y, cache), _evaluate(shift, block, at, y, cache)
        mf, vf = work.scores(loadings, C, k)
        cv, cm = cavity(mf, vf, pb, sb)
        log_zi, g, h = tilted_moments(y, cm, cv)
        if not (np.all(vf > 0) and np.all(np.isfinite(log_zi))):
            ok = False
            break
        den = 1.0 + h * cv
        npb, nsb = -h / den, (g - cm * h) / den
        kept.write(at, (npb, nsb, pb, sb))
        site_sum += site_terms(log_zi, mf, vf, cm, cv)
        quad += float(sb @ mf)
        leverage = max(leverage, float(np.max(pb * vf, initial=0.0)))
        change = max(change, float(np.max(np.abs(npb - pb) / (1.0 + np.abs(pb)), initial=0.0)),
                     float(np.max(np.abs(nsb - sb) / (1.0 + np.abs(sb)), initial=0.0)))
        new_ok = new_ok and bool(np.all(np.isfinite(npb)) and np.all(np.isfinite(nsb)) and np.all(npb >= 0))
        work.add(C, npb, nsb, k)
    kept.close(keep=ok)
    return work.A, work.bd, site_sum, quad, change, leverage, ok, new_ok


def task_statistics(block, drop, qd, prec, shift, x_keys):
    """``(A, bd)`` of the sites ``(prec, shift)`` on the block's rows (kept under ``x_keys``)."""
    block.drop_vectors(drop)
    kept = _Writers(block, x_keys)
    work = _Scratch(qd)
    cache = {}
    for at, part, sub in _chunks(block, qd + 1):
        y, C = part.y[sub], part.Cd[sub]
        pb, sb = _evaluate(prec, block, at, y, cache), _evaluate(shift, block, at, y, cache)
        kept.write(at, (pb, sb))
        work.add(C, pb, sb, y.size)
    kept.close()
    return work.A, work.bd


def _labels(block):
    """``(at, y)`` of the block's rows by chunks of :data:`VECTOR_CHUNK` (no design read)."""
    for rows, part in block.models():
        for s in range(0, part.n, VECTOR_CHUNK):
            sub = slice(s, min(s + VECTOR_CHUNK, part.n))
            yield slice(rows.start + sub.start, rows.start + sub.stop), part.y[sub]


def task_dots(block, drop, pairs):
    """``a @ b`` on the block's rows for each pair of wired expressions."""
    block.drop_vectors(drop)
    out = [0.0] * len(pairs)
    cache = {}
    for at, y in _labels(block):
        for j, (a, b) in enumerate(pairs):
            va = _evaluate(a, block, at, y, cache)
            vb = va if b is a else _evaluate(b, block, at, y, cache)
            out[j] += float(va @ vb)
    return out


def task_check(block, drop, prec, shift):
    """Whether the sites ``(prec, shift)`` are finite with non-negative precisions on the block."""
    block.drop_vectors(drop)
    cache = {}
    for at, y in _labels(block):
        p, s = _evaluate(prec, block, at, y, cache), _evaluate(shift, block, at, y, cache)
        if not (np.all(p >= 0) and np.all(np.isfinite(p)) and np.all(np.isfinite(s))):
            return False
    return True


def task_corrections(block, drop, qd, loadings, SL, mu, svar, X, prec, shift, terms):
    """The block's rows' sum of :func:`vbsvm.inference.ep.log_site_corrections` (``terms`` is
    :func:`~vbsvm.inference.ep.site_correction_terms`)."""
    block.drop_vectors(drop)
    work = _Scratch(qd)
    cache = {}
    out = np.zeros(X.shape)
    for at, part, sub in _chunks(block, qd + 1):
        y, C = part.y[sub], part.Cd[sub]
        tp, tn = _evaluate(prec, block, at, y, cache), _evaluate(shift, block, at, y, cache)
        mf, vf = work.scores(loadings, C, y.size)
        out += terms(C @ SL, mf, vf, y, tp, tn, mu, svar, X)
    return out


def _tasked(task, block, *args):
    return task(block, *args)


# ============================================================================ the row operations
class DaskSiteRows:
    """:class:`~vbsvm.inference.ep_sites.SiteRows` over the blocks of a Dask frame (see the
    module docstring): site vectors are :class:`DaskVector`, each row operation a pass.

    Parameters
    ----------
    blocks : list
        The blocks (futures with a distributed client, else persisted delayed objects).
    qd : int
        Dense columns of the design.
    spilled : bool
        The blocks keep their vectors in files (then a task may run on another worker).
    """

    def __init__(self, blocks, qd, spilled=False):
        from vbsvm.sources.dask_blocks import distributed_client

        self.blocks, self.qd = blocks, qd
        self.client = distributed_client()
        self.where = None
        # each block's task runs where the block is: a block in memory keeps its vectors there (a
        # spilled block's are files that a copy on another worker reads as well)
        self.pinned = not spilled
        if self.client is not None:
            held = self.client.who_has(blocks)
            self.where = [sorted(held[b.key])[:1] for b in blocks]
        self._keys = itertools.count()
        self._dropped = []  # names no longer referred to, sent with the next pass
        #: passes that read the design (sweeps, statistics, corrections) and that read site vectors only
        self.passes = 0
        self.vector_passes = 0

    # ------------------------------------------------------------------ passes
    def _run(self, task, *args, design=True):
        """``task(block, drop, *args)`` on every block, results in the order of the blocks."""
        drop = list(self._dropped)
        del self._dropped[: len(drop)]
        if design:
            self.passes += 1
        else:
            self.vector_passes += 1
        if self.client is not None:
            futures = [self.client.submit(_tasked, task, b, drop, *args, workers=w,
                                          allow_other_workers=not self.pinned, pure=False)
                       for b, w in zip(self.blocks, self.where)]
            return self.client.gather(futures)
        dask = import_dask()
        return list(dask.compute(*[dask.delayed(_tasked, pure=False)(task, b, drop, *args) for b in self.blocks]))

    def _name(self) -> _Name:
        name = _Name(next(self._keys))
        weakref.finalize(name, self._dropped.append, name.key)
        return name

    def _materialize(self, x):
        """Names for the sites ``x`` that are combinations, which the next pass keeps: ``(keys,
        names)``; :meth:`_named` then points their expressions at the kept vectors."""
        names = [self._name() if v.expr[0] in ("mul", "add", "sub") else None for v in (x.prec, x.shift)]
        return [None if nm is None else nm.key for nm in names], names

    @staticmethod
    def _named(x, names):
        for v, nm in zip((x.prec, x.shift), names):
            if nm is not None:
                v.expr = ("ref", nm)

    @staticmethod
    def _sum(parts):
        out = list(parts[0])
        for p in parts[1:]:
            for k, v in enumerate(p):
                out[k] = out[k] + v
        return out

    # ------------------------------------------------------------------ SiteRows
    def default_sites(self):
        return START_PRECISION * DaskVector(self, ("ones",)), START_PRECISION * DaskVector(self, ("two_y",))

    @staticmethod
    def as_vector(v):
        if not isinstance(v, DaskVector):
            raise TypeError("the sites of a Dask frame's rows are DaskVector")
        return v

    def statistics(self, x) -> SiteStatistics:
        keys, names = self._materialize(x)
        A, bd = self._sum(self._run(task_statistics, self.qd, _wire(x.prec.expr), _wire(x.shift.expr), keys))
        self._named(x, names)
        return SiteStatistics(0.5 * (A + A.T), bd, None, None, np.zeros((0, 1)))

    def sweep(self, problem, x, post):
        keys, names = self._materialize(x)
        new = [self._name(), self._name()]
        loadings = np.vstack([post.Linv, post.mean_dense])
        parts = self._run(task_ep_sweep, self.qd, loadings, _wire(x.prec.expr), _wire(x.shift.expr), keys,
                          [nm.key for nm in new])
        leverage = max(p[5] for p in parts)
        if not all(p[6] for p in parts):
            return None, None, None, np.nan, np.nan, np.inf, leverage, False
        self._named(x, names)
        A, bd = self._sum([p[:2] for p in parts])
        stats = SiteStatistics(0.5 * (A + A.T), bd, None, None, np.zeros((0, 1)))
        site_sum, quad = sum(p[2] for p in parts), sum(p[3] for p in parts)
        change = max(p[4] for p in parts)
        prec, shift = DaskVector(self, ("ref", new[0])), DaskVector(self, ("ref", new[1]))
        prec.ok = all(p[7] for p in parts)
        return prec, shift, stats, site_sum, quad, change, leverage, True

    def sites_ok(self, x) -> bool:
        """Whether ``x`` is finite with non-negative precisions: known from the pass that made new
        sites, else one pass over the site vectors."""
        if x.prec.ok is not None:
            return x.prec.ok
        return all(self._run(task_check, _wire(x.prec.expr), _wire(x.shift.expr), design=False))

    def dots(self, pairs) -> list:
        """``a @ b`` for each pair of expressions (one pass)."""
        wired = []
        for a, b in pairs:
            wa = _wire(a)
            wired.append((wa, wa if b is a else _wire(b)))
        return self._sum(self._run(task_dots, wired, design=False))

    def squarem_norms(self, x0, x1, x2):
        pairs = []
        for name in ("prec", "shift"):
            a0, a1, a2 = (getattr(x, name).expr for x in (x0, x1, x2))
            r = ("sub", a1, a0)
            v = ("add", ("sub", a2, ("mul", 2.0, a1)), a0)
            pairs += [(r, r), (v, v)]
        d = self.dots(pairs)
        return d[0] + d[2], d[1] + d[3]

    def site_corrections(self, fit, SL, mu, svar, X, terms):
        """:func:`vbsvm.inference.ep.log_site_corrections`' sum over the rows, block by block."""
        post = fit.post
        loadings = np.vstack([post.Linv, post.mean_dense])
        parts = self._run(task_corrections, self.qd, loadings, SL, mu, svar, X, _wire(fit.site_prec.expr),
                          _wire(fit.site_shift.expr), terms)
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out


# ============================================================================ the model
class DaskEPModel:
    """The linear SVM as EP and the variance integration see it, its rows in the blocks of a
    Dask frame: the row-free algebra (priors, the Gaussian of the sites' statistics) is the
    skeleton :class:`~vbsvm.models.linear.LinearSVMModel`'s (attributes not found here are its),
    ``n`` the rows, and ``ep_rows`` the :class:`DaskSiteRows` of the blocks.

    Parameters
    ----------
    skeleton : LinearSVMModel
        The model without rows (fixed effects only).
    n : int
    blocks : list
    spilled : bool
        Whether the blocks are spilled to files (:class:`DaskSiteRows`).
    """

    blas_work = 0.0  # the client's products are q-sized

    def __init__(self, skeleton, n, blocks, spilled=False):
        self.skeleton, self.n = skeleton, int(n)
        self.ep_rows = DaskSiteRows(blocks, skeleton.qd, spilled)

    def __getattr__(self, name):
        if name == "skeleton":
            raise AttributeError(name)
        return getattr(self.skeleton, name)

    @staticmethod
    def woodbury_applies(tau) -> bool:
        """Never: the n x n systems are for fewer rows than coefficients."""
        return False


class ScoreGaussian:
    """The scores' moments of the rows of a partition's model under a Gaussian of the fitted
    coefficients (mean ``mean``, covariance ``cov``): what the probit calibration of a Dask fit
    reads (:func:`vbsvm.sources.dask_blocks.task_nll`; ``model`` is set per partition)."""

    def __init__(self, mean, cov):
        self.mean, self.cov, self.model = mean, cov, None

    def linear_predictor(self):
        C = self.model.Cd
        mean, var = np.empty(C.shape[0]), np.empty(C.shape[0])
        for rows in row_blocks(C.shape[0], C.shape[1] + 1):
            block = C[rows]
            mean[rows] = block @ self.mean
            var[rows] = np.einsum("ij,ij->i", block @ self.cov, block)
        return mean, var

    def __copy__(self):
        return ScoreGaussian(self.mean, self.cov)

