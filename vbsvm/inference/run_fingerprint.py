"""What a fit's Gibbs chains depend on, recorded in its checkpoints (``svm(..., checkpoint=)``).

A checkpoint resumed by another run would splice the chains of two posteriors: rerunning with
the labels flipped or the formula's terms swapped would continue the old chains on the new data
without a word. :func:`run_fingerprint` describes the run — formula, design columns, random-effect
terms, a SHA-256 of the arrays the sampler reads, and every setting that changes the chains — and
:func:`vbsvm.inference.gibbs.run_chains` stores it in each checkpoint and refuses a file whose
description differs, naming the entries.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

__all__ = ["run_fingerprint", "data_digest", "UNBOUND_SETTINGS"]

#: settings that do not change the chains (``n_jobs``: chains are the same serially or in
#: parallel), or that the Gibbs engine records itself (draws, tune, thin, chains, seed)
UNBOUND_SETTINGS = frozenset({"progress", "n_jobs", "checkpoint", "level", "max_draws", "approximation",
                              "draws", "tune", "thin", "chains", "seed", "draw_seed", "formula"})


def run_fingerprint(design, settings, prior=None) -> dict | None:
    """The description of a Gibbs run that its checkpoints are bound to (None without a checkpoint).

    Parameters
    ----------
    design : vbsvm.formula.design.Design
        The design the model is built from.
    settings : dict
        The checked settings of :func:`vbsvm.svm`.
    prior : vbsvm.LaplaceZero, optional

    Returns
    -------
    dict or None
        JSON-able: ``formula`` (blanks removed), ``design columns``, ``random-effect terms``,
        ``data`` (:func:`data_digest` of the design), and each setting that is not in
        :data:`UNBOUND_SETTINGS`, e.g. ``penalty``, ``sigma2_beta``, ``prior``; None unless
        ``settings`` asks for a Gibbs run with a checkpoint.
    """
    if settings.get("checkpoint") is None or settings.get("method") != "gibbs":
        return None
    out = {
        "formula": "".join(str(settings["formula"]).split()),
        "design columns": list(design.column_names),
        "random-effect terms": [f"({g.lhs} | {g.name}): {g.n_levels} levels" for g in design.groups],
        "data": data_digest(design),
        "prior": None if prior is None else prior.to_dict(),
    }
    out.update({k: v for k, v in settings.items() if k not in UNBOUND_SETTINGS})
    return json.loads(json.dumps(out, sort_keys=True, default=_plain))


def data_digest(design) -> str:
    """``"sha256:<hex>"`` over the arrays of ``design`` a model is built from: the response, the
    fixed-effect design (NaN where imputed), its standardization, and each random-effect term's
    level codes, levels and columns. Each array enters with its dtype and shape; the matrices
    column by column (no copy of a Fortran-ordered design)."""
    h = hashlib.sha256()
    arrays = [design.y, design.X, design.center, design.scale]
    for g in design.groups:
        arrays += [g.codes, np.array([str(v) for v in g.levels]), g.Z]
    for a in arrays:
        if a is None:
            h.update(b"none;")
            continue
        a = np.asarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        if a.dtype.kind in "OU":  # level names
            h.update("\x00".join(map(str, a.ravel().tolist())).encode())
        else:
            h.update(np.ascontiguousarray(np.asfortranarray(a).T))
    return "sha256:" + h.hexdigest()


def _plain(value):
    """JSON form of numpy scalars and arrays in settings."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
