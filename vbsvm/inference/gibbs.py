"""Gibbs sampling engine: chains, tuning (burn-in), thinning, progress, reproducibility, interrupts.

A model supplies

* ``gibbs_initial_state(rng)`` -> dict, and
* ``gibbs_sweep(state, rng)`` -> dict: one scan over its full conditionals. Entries named in
  ``record`` are stored after every kept sweep;
* optionally ``gibbs_adapt(state, it, tune)`` -> dict, called after each tuning sweep ``it`` and
  never after tuning, so that the kept draws come from one fixed kernel (e.g. fitting a
  proposal to the tuning draws);
* optionally ``gibbs_pool(states)`` -> list of states, called once with the last tuning state of
  every chain, before the first kept sweep: what one chain learned in tuning can then serve
  all of them (the Laplace-zero model's list of models to jump between). The kernel is still
  fixed after tuning.

Chain ``c`` draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(chains)[c])``, so the
draws of a chain depend only on ``seed`` and ``c`` (with ``gibbs_pool``, also on the other chains'
tuning): running the chains serially or in parallel (``n_jobs``) gives identical results.
A checkpointed run does not pool (a chain resumes alone).

**Interrupts.** Ctrl-C (:class:`KeyboardInterrupt`) does not throw the work away: as PyMC does in
its sampling loop, the chains stop where they are and :func:`run_chains` returns the draws kept
so far, with an :class:`~vbsvm.exceptions.InterruptWarning`. Chains of unequal length are cut to a
common length, keeping the chains that give the most draws (``k`` chains of ``L`` draws, with
``k * L`` largest). Only if no chain has kept a draw yet is the interrupt passed on. A
checkpointed chain stops at the end of the sweep in progress and saves its position there (a
second Ctrl-C before that stops it at once). A Ctrl-C while the stopped run's draws are collected
and its fit is built (until :func:`vbsvm.svm` returns) is absorbed with a note; the one after
aborts (:mod:`vbsvm.inference.interrupts`).

**Adaptive run length** (``max_draws=``, with a ``monitor``): after the requested ``draws``,
the caller's ``monitor`` gives the diagnostics of the summary parameters (fixed effects and
variance components); while ``max R-hat > RHAT_TARGET`` or ``min bulk ESS < ESS_TARGET`` and the
chains are shorter than ``max_draws``, every chain continues from exactly where it stopped (its
last state and its generator state; the parent keeps both between blocks, worker processes hand
them back) for a block of draws sized from the ESS shortfall (:func:`extension_size`). An
extended chain is therefore one Markov chain with the post-tuning kernel (``gibbs_adapt`` is not
called again): ``draws=1000`` extended to 2000 gives exactly the draws of ``draws=2000`` without
extension, serially or in parallel.

**Checkpoints** (``checkpoint=``): each chain writes its position, state, kept draws and
generator state to ``<checkpoint>.chain<c>.npz`` at sweep boundaries; a rerun with the same
arguments resumes every chain and gives the draws of an uninterrupted run. A file records the
run's arguments, the sampler's state entries and what the caller binds the run to (``run=`` or
:func:`bound_run`: :func:`vbsvm.svm` binds its formula, design columns, a SHA-256 of the design
and response, and its settings, :mod:`vbsvm.inference.run_fingerprint`); a file of another run is refused
with an error naming what differs. A checkpointed run is not extended (``max_draws`` is
ignored): a resumed run could not retrace the block decisions.

**Worker processes** (``n_jobs > 1``) are started with the ``fork`` method on Linux: a forked
worker does not re-import the user's script (``spawn`` and ``forkserver`` re-run a script without
an ``if __name__ == "__main__":`` guard in every worker, which then fails), and it starts in
milliseconds instead of importing numpy, scipy and pandas again in a fresh interpreter.
The workers ignore SIGINT; the parent stops them through an event and collects their partial
chains (each saves its checkpoint first), then joins them (and terminates any that do not finish
within ``STOP_GRACE`` seconds or after an aborting Ctrl-C), so no process is left behind. A worker
also exits when its parent dies, even by ``kill -9`` (:func:`_exit_with_parent`: a thread polling
the parent, and Linux's parent-death signal), within ``PARENT_POLL`` seconds (at once on Linux),
and only between checkpoint writes. Elsewhere (macOS, Windows) ``spawn`` is used; a worker that
dies while re-importing an unguarded script raises :class:`~vbsvm.exceptions.WorkerError` saying
what to do.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import numpy as np

from vbsvm.exceptions import InputError, InterruptWarning, WorkerError
from vbsvm.inference import interrupts
from vbsvm.inference.failures import numerical_failures
from vbsvm.inference.progress import progress_bar
from vbsvm.inference.threads import limit_blas
from vbsvm.io.fit_file import replace_atomically

__all__ = ["GibbsResult", "run_chains", "chain_generators", "Checkpoint", "bound_run", "extension_size", "shortfall",
           "RHAT_TARGET", "ESS_TARGET", "DEFAULT_MAX_DRAWS_FACTOR", "STOP_GRACE", "PARENT_POLL"]

#: seconds a worker gets to return its partial chains after the parent asked it to stop
STOP_GRACE = 30.0
#: convergence targets over the summary parameters: max rank-normalized R-hat, min bulk ESS
RHAT_TARGET = 1.01
ESS_TARGET = 400
#: ``max_draws`` defaults to this many times ``draws`` (1 switches the adaptive run length off)
DEFAULT_MAX_DRAWS_FACTOR = 4
#: no extension when the draws needed exceed this multiple of max_draws (a chain that has not
#: mixed: sim500x100's ESS stayed at 5-6 from 1000 to 4000 draws, which only delayed the warning)
HOPELESS = 2.0


@dataclass
class GibbsResult:
    """Draws of every recorded quantity, each of shape ``(chains, draws, ...)``.

    ``chains`` and ``n_draws`` are what was kept: fewer than asked for if ``interrupted``, more
    than ``requested`` if the run was extended. ``extensions`` lists the extension rounds, each
    ``{"from": draws before, "to": draws asked for, "max_r_hat": ..., "min_ess_bulk": ...}`` (the
    diagnostics that called for it); ``max_draws`` is the cap the run could be extended to
    (``requested`` when extension was off).
    """

    draws: dict
    seconds: float
    chains: int
    n_draws: int
    tune: int
    thin: int
    interrupted: bool = False
    requested: int = 0
    max_draws: int = 0
    extensions: list = field(default_factory=list)


def chain_generators(seed, chains):
    """Independent generators for ``chains`` chains, derived from ``seed`` by SeedSequence."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(chains)]


def _run_one(model, rng, state, first, total, tune, thin, record, progress, label, checkpoint=None, stop=None):
    """Sweeps ``first`` to ``total`` of one chain: ``(kept draws, interrupted, state, rng)``."""
    with limit_blas(getattr(model, "blas_work", 0.0)), numerical_failures(f"Gibbs sampling ({label})"):
        return _scan(model, rng, state, first, total, tune, thin, record, progress, label, checkpoint, stop) + (rng,)


def _scan(model, rng, state, first, total, tune, thin, record, progress, label, checkpoint, stop):
    """Sweeps ``first`` to ``total`` of one chain from ``state`` (None: a new chain):
    ``({name: [kept draws]}, interrupted, last state)``; stops early on Ctrl-C or ``stop``.
    ``progress`` is the run's bar (or None), advanced once per sweep.

    Sweep ``it`` is a tuning sweep (followed by ``gibbs_adapt``) if ``it < tune``; after tuning
    every ``thin``-th sweep is kept. With a ``checkpoint``, starts where its file left off and
    saves the chain's position at sweep boundaries (every ``checkpoint.every`` seconds and when
    ``stop`` is seen: a worker's parent sets it, and a serial run's first Ctrl-C, see
    :func:`~vbsvm.inference.interrupts.stop_at_boundary`).
    """
    kept = {name: [] for name in record}
    start = first
    if checkpoint is not None:
        first, state, kept = checkpoint.resume(rng, kept)
    # ``progress`` is the run's bar (None in a worker: it must not touch tqdm's copied lock)
    bar = progress
    if bar is not None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(first - start)  # sweeps a checkpoint had already made
    try:
        if state is None:
            state = model.gibbs_initial_state(rng)
        adapt = getattr(model, "gibbs_adapt", None)
        for it in range(first, total):
            if stop is not None and stop.is_set():
                interrupts.absorb()  # a serial run's next Ctrl-C must not lose what this one keeps
                if checkpoint is not None:
                    checkpoint.save(it, state, kept, rng)
                return kept, True, state
            state = model.gibbs_sweep(state, rng)
            if adapt is not None and it < tune:
                state = adapt(state, it, tune)
            if it >= tune and (it - tune) % thin == thin - 1:
                row = {name: np.array(state[name], copy=True) for name in record}
                for name in record:  # all names or none: the lists stay of equal length
                    kept[name].append(row[name])
            if bar is not None:
                bar.update()
            if checkpoint is not None and checkpoint.due():
                checkpoint.save(it + 1, state, kept, rng)
        if stop is not None and stop.is_set() and total > first:  # asked to stop during the last sweep
            interrupts.absorb()
            if checkpoint is not None:
                checkpoint.save(total, state, kept, rng)
            return kept, True, state
    except KeyboardInterrupt:  # the last checkpoint (if any) stays: it was written at a sweep boundary
        interrupts.absorb()
        return kept, True, state
    return kept, False, state


#: how a checkpoint's entries are named when they differ from the run's
_MEANING = {"draws": "draws", "tune": "tune", "thin": "thin", "chains": "chains", "record": "recorded quantities",
            "model": "sampler", "state": "sampler state entries (e.g. another vbsvm version)", "start": "seed"}
#: held while a checkpoint file is written: a worker whose parent died exits only between writes
_WRITING = threading.Lock()


class Checkpoint:
    """The checkpoint file of one chain: its position, state, kept draws and generator state.

    Written atomically to ``<base>.chain<c>.npz`` (numpy arrays, read back with
    ``allow_pickle=False``); ``meta`` (the run's arguments, the chain's starting generator state
    and what the run is bound to: formula, design, data, settings) must match for a file to be
    resumed, so a checkpoint of another run is refused, naming what differs.
    """

    def __init__(self, base, chain, meta, every):
        self.base = os.fspath(base)
        self.path = f"{self.base}.chain{chain}.npz"
        self.meta = json.dumps(meta, sort_keys=True)
        self.every = every
        self.last = time.monotonic()

    def due(self):
        return time.monotonic() - self.last >= self.every

    @staticmethod
    def check(entries):
        """Raise :class:`~vbsvm.exceptions.InputError` naming the entries that are not numeric
        arrays (a checkpoint file holds no pickles), e.g. the nested state of the Laplace-zero
        block in the cut imputation sampler."""
        def numeric(value):
            try:
                return np.asarray(value).dtype.kind in "biufcU"
            except ValueError:  # ragged
                return False

        bad = [k for k, v in entries.items() if not numeric(v)]
        if bad:
            raise InputError(f"the Gibbs state entries {bad} are not numeric arrays, so this model cannot be "
                             "checkpointed; run without checkpoint=.")

    def save(self, position, state, kept, rng):
        """Write the chain after ``position`` sweeps (state, kept draws, generator) atomically
        (a worker process exits only between writes, see :func:`_exit_with_parent`)."""

        arrays = {"meta": np.array(self.meta), "position": np.array(position),
                  "rng": np.array(json.dumps(rng.bit_generator.state))}
        arrays.update({f"state:{k}": np.asarray(v) for k, v in state.items()})
        arrays.update({f"kept:{k}": np.asarray(v) for k, v in kept.items() if v})
        self.check(arrays)

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        with _WRITING:
            replace_atomically(self.path, write)
        self.last = time.monotonic()

    def resume(self, rng, kept):
        """``(position, state, kept)`` from the file, ``rng`` set to its saved state; ``(0, None, kept)``
        without one. A file of another run is refused (:meth:`differences`)."""
        if not os.path.exists(self.path):
            return 0, None, kept
        try:
            with np.load(self.path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(str(arrays.pop("meta")))
            position = int(arrays.pop("position"))
            generator = json.loads(str(arrays.pop("rng")))
        except Exception as exc:  # noqa: BLE001 - zip, numpy and JSON errors of a damaged file
            raise InputError(f"the checkpoint {self.path!r} cannot be read ({type(exc).__name__}: {exc}); "
                             "delete it to start afresh.") from None
        differ = self.differences(meta)
        if differ:
            raise InputError(
                f"the checkpoint {self.path!r} belongs to another run; these differ: {'; '.join(differ)}. "
                f"Delete the files {self.base + '.chain*.npz'!r} to start this run afresh, or pass another "
                "checkpoint= path (or rerun with the checkpoint's arguments and data to resume it).")
        rng.bit_generator.state = generator
        state = {k[len("state:"):]: v for k, v in arrays.items() if k.startswith("state:")}
        for name in kept:
            kept[name] = list(arrays.get(f"kept:{name}", []))
        return position, state, kept

    def differences(self, stored):
        """What differs between the run a file records (``stored`` meta) and this one, each
        ``"what (file: value, this run: value)"``."""
        mine = json.loads(self.meta)
        if not isinstance(stored, dict):
            return ["its meta data (not a record of a vbsvm run)"]
        out = []
        for key in sorted(set(mine) | set(stored)):
            if key == "run" or stored.get(key) == mine.get(key):
                continue
            what = _MEANING.get(key, key)
            # the start is the generator state derived from the seed: too long to show
            out.append(what if key == "start" else f"{what} (file: {_short(stored.get(key))}, "
                                                   f"this run: {_short(mine.get(key))})")
        ran, run = stored.get("run"), mine.get("run") or {}
        if ran is None:
            if run:
                out.append("formula, design and data (not recorded in the file)")
            return out
        out += [f"{key} (file: {_short(ran.get(key))}, this run: {_short(run.get(key))})"
                for key in sorted(set(run) | set(ran)) if ran.get(key) != run.get(key)]
        return out

    def remove(self):
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def _short(value, width=70):
    if isinstance(value, str) and value.startswith("sha256:"):
        return repr(value[:19])  # a digest: its first 12 hex digits tell two apart
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


@contextlib.contextmanager
def _holding(*names):
    """Hold the signals back in this thread (POSIX) while the block runs; delivered after it."""
    numbers = {getattr(signal, name) for name in names if hasattr(signal, name)}
    if not numbers or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


_RUN = contextvars.ContextVar("vbsvm_gibbs_run", default=None)


@contextlib.contextmanager
def bound_run(run):
    """Bind the checkpoints of the Gibbs runs inside the block to ``run``.

    ``run`` is a JSON-able dict of what else the chains depend on (the fit layer's formula,
    design columns, a hash of the data, the model's settings; see
    :func:`vbsvm.inference.run_fingerprint.run_fingerprint`); :func:`run_chains` stores it in every
    checkpoint and refuses to resume a file whose entries differ, naming them. ``None`` binds
    nothing beyond :func:`run_chains`'s own arguments.
    """
    token = _RUN.set(run)
    try:
        yield
    finally:
        _RUN.reset(token)


def run_chains(model, *, draws=1000, tune=1000, chains=4, thin=1, seed=None, record=("theta",),
               progress=True, n_jobs=1, checkpoint=None, checkpoint_every=60.0, max_draws=None,
               monitor=None, run=None) -> GibbsResult:
    """Run ``chains`` Gibbs chains of ``model``, extended until they converge (with a ``monitor``).

    Parameters
    ----------
    model
        Object with ``gibbs_initial_state(rng)`` and ``gibbs_sweep(state, rng)``.
    draws : int
        Draws kept per chain (after thinning) before the convergence check.
    tune : int
        Initial sweeps discarded per chain.
    chains : int
    thin : int
        Keep every ``thin``-th sweep (also in the extension).
    seed : int or None
        Root seed; chain seeds are derived from it with ``numpy.random.SeedSequence``.
    record : sequence of str
        State entries to store.
    progress : bool
        Show one progress bar over all chains' sweeps, with the time left (serial runs on a
        terminal or in a notebook; see :mod:`vbsvm.inference.progress`).
    n_jobs : int
        Number of worker processes (1 = serial). Results do not depend on it. It pays only when
        each chain runs for seconds and the cores are free: starting the workers and copying
        their draws back has a fixed cost, and on cores busy with other work parallel chains gain
        little (``benchmarks/results/tuning_constants.md``, "Parallel chains"). With ``spawn``
        (outside Linux) each worker also imports numpy, scipy and pandas. An extended run starts
        the workers again for each block.

    checkpoint : str or path, optional
        Base name of per-chain checkpoint files ``<checkpoint>.chain<c>.npz``, written (atomically,
        at sweep boundaries) every ``checkpoint_every`` seconds and when the run is stopped. If
        they exist, each chain resumes where its file left off, and the draws are the same as
        those of an uninterrupted run (the file holds the generator state). A file written by a
        run with other arguments or another ``run`` is refused, naming what differs. The files
        are removed when the run completes. A checkpointed run is not extended.
    checkpoint_every : float
        Seconds between checkpoints.
    max_draws : int, optional
        Most draws per chain an extension may reach (default ``DEFAULT_MAX_DRAWS_FACTOR * draws``;
        ``max_draws=draws`` switches the extension off). Used only with a ``monitor``.
    monitor : callable, optional
        ``monitor(draws) -> pandas.DataFrame`` with columns ``r_hat`` and ``ess_bulk``: the
        diagnostics of the parameters that must converge, given the stacked draws
        ``{name: (chains, n, ...)}``. While ``max r_hat > RHAT_TARGET`` or ``min ess_bulk <
        ESS_TARGET`` (NaN rows, e.g. a constant, are ignored) and ``n < max_draws``, every chain
        continues from its last state and generator state for :func:`extension_size` more draws,
        unless the draws needed (:func:`draws_needed`) exceed ``HOPELESS * max_draws``: chains that
        far from mixing gain nothing from the cap but time, and the fit's warning gives the count.
    run : dict, optional
        What else the chains depend on (JSON-able: formula, design, a hash of the data, the
        model's settings), recorded in the checkpoints; default: the run bound by
        :func:`bound_run` (:func:`vbsvm.svm` binds its fit's).

    Returns
    -------
    GibbsResult
        On Ctrl-C, the draws kept so far (see the module docstring), ``interrupted=True`` and an
        :class:`~vbsvm.exceptions.InterruptWarning`.

    Raises
    ------
    KeyboardInterrupt
        If interrupted before any chain kept a draw.
    vbsvm.exceptions.WorkerError
        If a worker process died without returning its chains.
    vbsvm.exceptions.NumericalError
        If a sweep fails numerically (e.g. a Cholesky factorization).
    """
    with interrupts.collecting():  # after a Ctrl-C, a second one does not lose the draws being collected
        return _run_chains(model, draws, tune, chains, thin, seed, record, progress, n_jobs, checkpoint,
                           checkpoint_every, max_draws, monitor, run)


def _run_chains(model, draws, tune, chains, thin, seed, record, progress, n_jobs, checkpoint, checkpoint_every,
                max_draws, monitor, run):
    start = time.perf_counter()
    rngs = chain_generators(seed, chains)
    points = [None] * chains
    if checkpoint is not None:
        if seed is None:
            raise InputError("checkpoint= needs a seed (e.g. seed=1): a resumed chain must continue the "
                             "same random stream.")
        # the names of the sampler's state (from a throwaway initial state): a checkpoint written by
        # a sampler whose state differs (another vbsvm version) is refused, not resumed with keys missing
        initial = model.gibbs_initial_state(np.random.default_rng(0))
        Checkpoint.check({f"state:{k}": v for k, v in initial.items()})  # before any sweep, not at the first save
        meta = {"draws": draws, "tune": tune, "thin": thin, "chains": chains, "record": list(record),
                "model": type(model).__name__, "state": sorted(initial), "run": _RUN.get() if run is None else run}
        points = [Checkpoint(checkpoint, c, dict(meta, start=rngs[c].bit_generator.state), checkpoint_every)
                  for c in range(chains)]
    cap = draws if monitor is None or checkpoint is not None else max(
        draws, DEFAULT_MAX_DRAWS_FACTOR * draws if max_draws is None else max_draws)
    record = tuple(record)
    chain_runs = _Chains(model, rngs, tune, thin, record, progress, n_jobs, points)
    done, target, extensions = 0, draws, []
    interrupted = False
    if hasattr(model, "gibbs_pool") and checkpoint is None and tune > 0:
        interrupted = chain_runs.run(0, 0)  # tuning only
        if not interrupted:
            chain_runs.states = list(model.gibbs_pool(chain_runs.states))
    while not interrupted:
        interrupted = chain_runs.run(done, target)
        if interrupted or target >= cap:
            break
        done = target
        stacked = _common_length(chain_runs.kept, record, False)[0]
        diag = monitor(stacked)
        extra = extension_size(diag, done, draws)
        if extra == 0 or draws_needed(diag, done) > HOPELESS * cap:
            break  # done, or so far short that the cap cannot help: the fit warns with the draws needed
        target = min(cap, done + extra)
        worst_r, worst_e = shortfall(diag)
        extensions.append({"from": done, "to": target, "max_r_hat": worst_r, "min_ess_bulk": worst_e})
    stacked, kept_chains, n_kept = _common_length(chain_runs.kept, record, interrupted)
    if not interrupted and checkpoint is not None:
        for point in points:
            point.remove()
    if interrupted:
        kept_in = "" if checkpoint is None else (
            f" The checkpoint files {os.fspath(checkpoint) + '.chain*.npz'!r} hold the chains' positions: the same "
            "call continues the run.")
        warnings.warn(
            f"Gibbs sampling was interrupted (KeyboardInterrupt): returning {kept_chains} chain(s) x "
            f"{n_kept} draws of the {chains} x {target} asked for. R-hat and ESS from so few draws are "
            f"unreliable; rerun to completion before drawing conclusions.{kept_in}", InterruptWarning, stacklevel=3)
    return GibbsResult(draws=stacked, seconds=time.perf_counter() - start, chains=kept_chains,
                       n_draws=n_kept, tune=tune, thin=thin, interrupted=interrupted, requested=draws,
                       max_draws=cap, extensions=extensions)


def shortfall(diag):
    """``(max R-hat, min bulk ESS)`` of a diagnostics table, ignoring NaN rows (NaN if all are)."""
    r = diag["r_hat"].to_numpy(dtype=float)
    e = diag["ess_bulk"].to_numpy(dtype=float)
    worst_r = float(np.max(r[np.isfinite(r)])) if np.isfinite(r).any() else math.nan
    worst_e = float(np.min(e[np.isfinite(e)])) if np.isfinite(e).any() else math.nan
    return worst_r, worst_e


def extension_size(diag, n, block):
    """Draws per chain to add to chains of ``n`` draws whose diagnostics are ``diag`` (0 if the
    targets hold).

    ESS grows about linearly with the draws once the chains mix, and ``R-hat - 1`` shrinks about
    like ``1 / ESS``, so the chains need about ``n * max(ESS_TARGET / ESS, (R-hat - 1) /
    (RHAT_TARGET - 1))`` draws, plus 10% for the noise of the estimates. A block adds at least a
    tenth and at most ``block`` (the requested draws), so that an estimate from chains that have
    not mixed yet is revised before the run grows far.
    """
    needed = draws_needed(diag, n)
    if needed <= n:
        return 0
    return int(min(block, max(needed - n, math.ceil(block / 10))))


def draws_needed(diag, n):
    """Draws per chain that chains of ``n`` draws with diagnostics ``diag`` need to reach the
    targets (``n`` if they hold), by the linear-growth rule of :func:`extension_size`."""
    worst_r, worst_e = shortfall(diag)
    if not (worst_r > RHAT_TARGET or worst_e < ESS_TARGET):
        return n
    factor = max(ESS_TARGET / max(worst_e, 1.0) if worst_e < ESS_TARGET else 1.0,
                 (worst_r - 1.0) / (RHAT_TARGET - 1.0) if worst_r > RHAT_TARGET else 1.0)
    return math.ceil(n * 1.1 * factor)


class _Chains:
    """The chains of one run between blocks: each chain's kept draws, last state and generator.

    :meth:`run` continues every chain from where it stopped, serially or in forked worker
    processes, which return the chain's new draws, its last state and its generator.
    """

    def __init__(self, model, rngs, tune, thin, record, progress, n_jobs, points):
        self.model, self.rngs, self.tune, self.thin, self.record = model, rngs, tune, thin, record
        self.progress, self.n_jobs, self.points = progress, n_jobs, points
        self.states = [None] * len(rngs)
        self.sweeps = 0  # sweeps every chain has run
        self.kept = {c: {name: [] for name in record} for c in range(len(rngs))}

    def run(self, done, target):
        """Continue every chain from where it stopped (``done`` kept draws) to ``target`` kept
        draws (``target=0``: to the end of tuning); True if interrupted."""
        chains = len(self.rngs)
        first, last = self.sweeps, self.tune + target * self.thin
        # one bar over every chain's sweeps (serial runs; workers draw none)
        bar = progress_bar(chains * (last - first), "Gibbs" + (f" (to {target} draws)" if done else ""),
                           self.progress and self.n_jobs == 1)
        args = [(self.model, self.rngs[c], self.states[c], first, last, self.tune, self.thin, self.record, bar,
                 f"chain {c + 1}/{chains}", self.points[c])
                for c in range(chains)]
        if self.n_jobs == 1:
            out, interrupted = {}, False
            # checkpointed chains stop at a sweep boundary at Ctrl-C, to save their position there
            stop = threading.Event() if any(point is not None for point in self.points) else None
            try:
                with interrupts.stop_at_boundary(stop):
                    for c in range(chains):
                        out[c] = _run_one(*args[c], stop=stop)
                        if out[c][1]:
                            interrupted = True
                            break
            finally:
                if bar is not None:
                    bar.close()
        else:
            out, interrupted = _run_parallel(args, self.n_jobs)
        for c, (kept, _, state, rng) in out.items():
            for name in self.record:
                self.kept[c][name].extend(kept[name])
            self.states[c], self.rngs[c] = state, rng
        self.sweeps = self.tune + target * self.thin
        return interrupted


def _common_length(out, record, interrupted):
    """Stack the chains' draws, cut to the ``k`` longest chains at the ``k``-th length maximizing ``k * L``."""
    lengths = sorted(((len(next(iter(kept.values()), [])), c) for c, kept in out.items()), reverse=True)
    best_k = max(range(1, len(lengths) + 1), key=lambda k: (k * lengths[k - 1][0], k)) if lengths else 0
    n_kept = lengths[best_k - 1][0] if best_k else 0
    if n_kept == 0:
        if interrupted:
            raise KeyboardInterrupt
        raise WorkerError("no chain returned any draws; run with n_jobs=1 to see the error.")
    keep = sorted(c for _, c in lengths[:best_k])
    stacked = {name: np.stack([np.stack(out[c][name][:n_kept]) for c in keep]) for name in record}
    return stacked, best_k, n_kept


# ===================================================================== worker processes
def _start_method():
    return "fork" if sys.platform.startswith("linux") else "spawn"


def _worker(conn, stop, tasks, parent):
    """Body of a worker process: run ``tasks`` (chain index, arguments) and send each result
    (the chain's new draws, whether it was stopped, its last state and its generator); exit
    if the process ``parent`` dies (:func:`_exit_with_parent`)."""
    global _WRITING
    _WRITING = threading.Lock()  # not the parent's, which another of its threads may have held at the fork
    # the parent started this process with SIGINT and SIGTERM blocked (see _ChainProcesses._start)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop (via ``stop``)
    _unblock(signal.SIGINT)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler the user's script installed
    _exit_with_parent(parent)
    try:
        for c, task in tasks:
            try:
                result = _run_one(*task, stop=stop)
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", c, _picklable(exc)))
                return
            conn.send(("chain", c, result))
            if result[1]:
                return
    finally:
        conn.close()


#: seconds between a worker's checks that its parent is alive
PARENT_POLL = 0.25


def _exit_with_parent(parent):
    """Make this worker process exit when the process ``parent`` dies (e.g. ``kill -9``), but
    never while it writes a checkpoint (which would leave a temporary file behind).

    A daemon thread (:func:`_watch_parent`) checks every ``PARENT_POLL`` seconds whether
    ``os.getppid()`` is still ``parent`` (an orphan is adopted by another process; on Windows,
    which keeps the dead parent's id, it waits on the sentinel of
    :func:`multiprocessing.parent_process` instead), then exits with ``os._exit`` once no
    checkpoint is being written. On Linux the kernel also sends SIGTERM at the parent's death
    (``prctl(PR_SET_PDEATHSIG)``): every thread of the worker blocks SIGTERM and the watch thread
    takes it (``sigtimedwait``), so that it, and the parent's ``terminate()``, end the worker at
    once, between writes. If the thread cannot start, SIGTERM keeps its default action, and the
    parent-death signal alone ends the worker. Without these a worker whose parent was killed
    sampled on, then blocked for ever writing its draws to the pipe.
    """
    takes_sigterm = hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")
    if takes_sigterm:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it
    else:
        _unblock(signal.SIGTERM)
    _parent_death_signal(signal.SIGTERM)
    if os.name == "posix" and os.getppid() != parent:  # died before the signal was armed
        os._exit(1)
    if not _start_watch(parent, takes_sigterm) and takes_sigterm:
        _unblock(signal.SIGTERM)


def _start_watch(parent, takes_sigterm):
    """Start the thread of :func:`_watch_parent`; False if it cannot start."""
    try:
        threading.Thread(target=_watch_parent, args=(parent, takes_sigterm), name="vbsvm-parent-watch",
                         daemon=True).start()
    except RuntimeError:  # can't start new thread
        return False
    return True


def _watch_parent(parent, takes_sigterm):
    """Until the process ``parent`` is gone or SIGTERM arrives (``takes_sigterm``), poll; then
    exit (between checkpoint writes)."""
    sentinel = None if takes_sigterm else getattr(multiprocessing.parent_process(), "sentinel", None)
    while True:
        signalled = ready = False
        if takes_sigterm:
            signalled = signal.sigtimedwait({signal.SIGTERM}, PARENT_POLL) is not None
        elif sentinel is not None:
            ready = bool(wait([sentinel], timeout=PARENT_POLL))
        else:
            time.sleep(PARENT_POLL)
        # POSIX: an orphan's parent id changes (the sentinel of a worker started before a sibling
        # stays open while the sibling lives); Windows keeps the dead parent's id
        orphan = os.getppid() != parent if os.name == "posix" else ready
        if signalled or orphan:
            with _WRITING:
                os._exit(1)
        if ready:  # closed while the parent lives: poll the id only (no busy loop)
            sentinel = None


def _parent_death_signal(number):
    """Linux: ask the kernel to send ``number`` to this process when its parent dies (no-op
    elsewhere or if ``prctl`` is unavailable)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _unblock(number):
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})


def _picklable(exc):
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure: send the text instead
        return WorkerError(f"a worker process failed: {type(exc).__name__}: {exc}")


def _run_parallel(args, n_jobs):
    """Run the chains in ``min(n_jobs, chains)`` processes; ``({chain: result of _run_one}, interrupted)``.

    At Ctrl-C the workers are asked to stop (each saves its checkpoint and sends its chain) and
    their chains are collected for up to ``STOP_GRACE`` seconds; a second Ctrl-C meanwhile is
    absorbed (:mod:`vbsvm.inference.interrupts`), a third aborts.
    """
    pool = _ChainProcesses(args, n_jobs)
    try:
        try:
            pool.collect()
            return pool.out, False
        except KeyboardInterrupt:
            interrupts.absorb()
            pool.stop.set()
            pool.collect(timeout=STOP_GRACE)
            return pool.out, True
    finally:
        pool.close()


class _ChainProcesses:
    """Worker processes running chains, the pipes their results come back on, and the results."""

    def __init__(self, args, n_jobs):
        ctx = multiprocessing.get_context(_start_method())
        self.stop = ctx.Event()
        self.out = {}
        self.open = {}  # receive end of a worker's pipe -> (process, its chain indices)
        self.processes = []
        try:
            self._start(ctx, args, n_jobs)
        except BaseException:  # e.g. Ctrl-C while starting: no half-started pool is left behind
            self.close()
            raise

    def _start(self, ctx, args, n_jobs):
        chains = len(args)
        with warnings.catch_warnings():
            # Python 3.12 warns that fork() in a process with threads may deadlock: the only other
            # threads here are BLAS pools (OpenBLAS re-initialises them after fork) and tqdm's
            # monitor, whose lock a worker never takes (no bar in workers).
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            for w in range(min(n_jobs, chains)):
                receive, send = ctx.Pipe(duplex=False)
                mine = list(range(w, chains, n_jobs))
                proc = ctx.Process(target=_worker, args=(send, self.stop, [(c, args[c]) for c in mine], os.getpid()),
                                   daemon=True, name=f"vbsvm-gibbs-{w}")
                self.processes.append(proc)
                # a worker starts with SIGINT and SIGTERM blocked (a forked child inherits this
                # thread's mask): a Ctrl-C cannot raise in it before it ignores SIGINT, and no thread
                # it starts takes SIGTERM from its watch thread (_exit_with_parent)
                with _holding("SIGINT", "SIGTERM"):
                    proc.start()
                send.close()
                self.open[receive] = (proc, mine)

    def collect(self, timeout=None):
        """Receive chains until every worker has closed its pipe or ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.open:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(self.open), timeout=left)
            if not ready:
                return
            for receive in ready:
                try:
                    kind, c, payload = receive.recv()
                except EOFError:
                    self._finished(receive)
                    continue
                if kind == "error":
                    raise payload
                self.out[c] = payload

    def _finished(self, receive):
        proc, mine = self.open.pop(receive)
        receive.close()
        proc.join()
        if proc.exitcode != 0 and not self.stop.is_set() and any(c not in self.out for c in mine):
            raise WorkerError(
                f"Gibbs worker process {proc.name} exited with code {proc.exitcode} before returning "
                "its chains. If your script calls vbsvm with n_jobs > 1 outside an 'if __name__ == "
                f"\"__main__\":' block, put the calls in such a block (worker processes started with "
                f"'{_start_method()}' re-import the script); otherwise use n_jobs=1.")

    def close(self):
        """Join every worker; terminate those still running (after a stop or an error)."""
        for receive in self.open:
            receive.close()
        for proc in self.processes:
            proc.join(timeout=1.0)
            if proc.is_alive():
                proc.terminate()
                proc.join()
