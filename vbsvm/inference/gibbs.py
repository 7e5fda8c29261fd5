"""Gibbs sampling engine: chains, tuning (burn-in), thinning, progress and reproducibility.

A model supplies

* ``gibbs_initial_state(rng)`` -> dict, and
* ``gibbs_sweep(state, rng)`` -> dict: one scan over its full conditionals. Entries named in
  ``record`` are stored after every kept sweep.

Chain ``c`` draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(chains)[c])``, so the
draws of a chain depend only on ``seed`` and ``c``: running the chains serially or in parallel
(``n_jobs``) gives identical results.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from .threads import limit_blas

__all__ = ["GibbsResult", "run_chains", "chain_generators"]


@dataclass
class GibbsResult:
    """Draws of every recorded quantity, each of shape ``(chains, draws, ...)``."""

    draws: dict
    seconds: float
    chains: int
    n_draws: int
    tune: int
    thin: int


def chain_generators(seed, chains):
    """Independent generators for ``chains`` chains, derived from ``seed`` by SeedSequence."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(chains)]


def _run_one(model, rng, draws, tune, thin, record, progress, label):
    with limit_blas(getattr(model, "blas_work", 0.0)):
        return _scan(model, rng, draws, tune, thin, record, progress, label)


def _scan(model, rng, draws, tune, thin, record, progress, label):
    state = model.gibbs_initial_state(rng)
    kept = {name: [] for name in record}
    total = tune + draws * thin
    bar = tqdm(total=total, desc=label, disable=not progress, leave=False, mininterval=0.5)
    for it in range(total):
        state = model.gibbs_sweep(state, rng)
        if it >= tune and (it - tune) % thin == thin - 1:
            for name in record:
                kept[name].append(np.array(state[name], copy=True))
        bar.update()
    bar.close()
    return {name: np.stack(v) for name, v in kept.items()}


def _run_one_star(args):
    return _run_one(*args)


def run_chains(model, *, draws=1000, tune=1000, chains=4, thin=1, seed=None, record=("theta",),
               progress=True, n_jobs=1) -> GibbsResult:
    """Run ``chains`` Gibbs chains of ``model``.

    Parameters
    ----------
    model
        Object with ``gibbs_initial_state(rng)`` and ``gibbs_sweep(state, rng)``.
    draws : int
        Draws kept per chain (after thinning).
    tune : int
        Initial sweeps discarded per chain.
    chains : int
    thin : int
        Keep every ``thin``-th sweep.
    seed : int or None
        Root seed; chain seeds are derived from it with ``numpy.random.SeedSequence``.
    record : sequence of str
        State entries to store.
    progress : bool
        Show a tqdm progress bar.
    n_jobs : int
        Number of worker processes (1 = serial). Results do not depend on it.
    """
    start = time.perf_counter()
    rngs = chain_generators(seed, chains)
    args = [(model, rngs[c], draws, tune, thin, tuple(record), progress and n_jobs == 1,
             f"chain {c + 1}/{chains}") for c in range(chains)]
    if n_jobs == 1:
        out = [_run_one_star(a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            out = list(pool.map(_run_one_star, args))
    stacked = {name: np.stack([o[name] for o in out]) for name in record}
    return GibbsResult(draws=stacked, seconds=time.perf_counter() - start, chains=chains,
                       n_draws=draws, tune=tune, thin=thin)
