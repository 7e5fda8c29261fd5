"""A corpus of damaged and crafted fit files, generated from a few small real fits.

Every file is refused with ``FitFileError`` or loads bit-identical to the fit it was made from;
none makes the loader read another file (external storage, virtual datasets and external links
point at a FIFO that is watched for readers); the reader process stays under a memory bound and
every load ends within the time limit. The corpus (byte flips, truncations, zeroed and copied
ranges at random offsets, attribute edits, shape and dtype lies, NaN/inf injections, foreign
variable attributes, external/virtual datasets, links, huge declared shapes) is loaded file by
file, recording the outcome, the wall time and the reader process's peak memory.

The default run loads one file of each kind of damage in the test process; the slow run
(``-m slow``) loads the whole corpus of :data:`FULL` files in a subprocess that also reports its
own peak memory, which loading the corpus may raise by at most :data:`LOADER_GROWTH_BOUND`.
"""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from support.frames import mixed_frame
from support.processes import watched_fifo

import vbsvm
import vbsvm.io.fit_file

ROOT = Path(__file__).resolve().parents[1]
#: Files in the full corpus.
FULL = 240
#: Files of each kind of damage in the default run.
QUICK_PER_KIND = 1
#: Time limit of a read in the corpus run (a damaged file that makes libhdf5 loop costs this).
READ_SECONDS = 15.0
#: Bound on the reader process's peak resident memory for these files (bytes).
READER_PEAK_BOUND = 128 << 20
#: Bound on what loading the whole corpus adds to the loading process's peak memory (bytes).
LOADER_GROWTH_BOUND = 256 << 20


def save_bases(directory):
    """Small real fits of each kind, saved in ``directory``; returns ``{name: path}``."""
    df = mixed_frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = {
            "vb": vbsvm.svm("y ~ x + np.log(z) + C(s) + (1 | g)", df, seed=1),
            "gibbs": vbsvm.svm("y ~ x + z + (1 | g)", df, method="gibbs", draws=20, tune=10, chains=2, seed=1,
                               progress=False),
            "sel": vbsvm.svm("y ~ x + z + s", df, prior=vbsvm.LaplaceZero(rho=0.3), seed=1),
            "gp": vbsvm.gpsvm("y ~ x + z", df, n_inducing=5, seed=1),
        }
    paths = {}
    for name, fit in fits.items():
        paths[name] = directory / f"base_{name}.nc"
        fit.save(paths[name])
    return paths


# ============================================================================ the damage
def _datasets(f, read_only=False):
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    if read_only:
        names = [n for n in names if n.split("/")[0] in ("vbsvm", "vbsvm_state", "constant_data", "observed_data")]
    return sorted(names)


def _replace(f, name, **create):
    del f[name]
    f.create_dataset(name, **create)


def flip(data, rng, fifo):
    for _ in range(rng.integers(1, 9)):
        at = _offset(data, rng)
        data[at] ^= int(rng.integers(1, 256))


def zero(data, rng, fifo):
    at, n = _offset(data, rng), int(rng.choice([8, 64, 512]))
    data[at:at + n] = bytes(len(data[at:at + n]))


def fill(data, rng, fifo):
    at, n = _offset(data, rng), int(rng.choice([4, 16, 64]))
    data[at:at + n] = b"\xff" * len(data[at:at + n])


def copy(data, rng, fifo):
    src, dst, n = _offset(data, rng), _offset(data, rng), int(rng.choice([16, 64, 256]))
    chunk = bytes(data[src:src + n])
    data[dst:dst + len(chunk)] = chunk


def truncate(data, rng, fifo):
    del data[int(rng.integers(0, len(data))):]


def _offset(data, rng):
    # half at random, half in the first 16 KiB, where the superblock, headers and heaps are
    return int(rng.integers(0, len(data)) if rng.random() < 0.5 else rng.integers(0, min(len(data), 16 << 10)))


def root_attribute(f, rng, fifo):
    name = str(rng.choice(sorted(f.attrs)))
    how = int(rng.integers(0, 4))
    if how == 0:
        del f.attrs[name]
    elif how == 1:
        f.attrs[name] = ["{", "[1, 2]", "x" * 100, "null"][int(rng.integers(0, 4))]
    elif how == 2:
        f.attrs[name] = rng.normal(size=3)
    else:  # a JSON attribute with one entry changed
        try:
            value = json.loads(f.attrs[name])
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, dict) or not value:
            f.attrs[name] = "linear" if name == "vbsvm_fit_type" else "gibbs"
            return
        key = str(rng.choice(sorted(value)))
        value[key] = [float("nan"), -1, 10 ** 12, "x", None, [], {"a": 1}, 0.5][int(rng.integers(0, 8))]
        f.attrs[name] = json.dumps(value)


def fit_type(f, rng, fifo):
    f.attrs["vbsvm_fit_type"] = str(rng.choice(["linear", "selection", "imputed", "gpsvm"]))


def layout_index(f, rng, fifo):
    if "layout" not in f.attrs:
        return root_attribute(f, rng, fifo)
    layout = json.loads(f.attrs["layout"])
    if layout["groups"]:
        group = min(layout["groups"])
        index = layout["groups"][group][1]
        index[int(rng.integers(0, len(index)))] = int(rng.choice([-1, 0, 100, index[0]]))
    else:
        layout["n_dense"] = int(layout["n_dense"]) + int(rng.choice([-1, 1, 10 ** 9]))
    f.attrs["layout"] = json.dumps(layout)


def inject(f, rng, fifo):
    floats = [n for n in _datasets(f, read_only=True) if f[n].dtype.kind == "f" and f[n].size]
    name = str(rng.choice(floats))
    data = f[name][()]
    flat = data.reshape(-1)
    with np.errstate(over="ignore"):
        flat[int(rng.integers(0, flat.size))] = float(rng.choice([np.nan, np.inf, -np.inf, -1.0, 1e308, 0.0]))
    f[name][...] = data


def shape_lie(f, rng, fifo):
    name = str(rng.choice([n for n in _datasets(f, read_only=True) if f[n].ndim]))
    data = f[name][()]
    axis = int(rng.integers(0, data.ndim))
    data = np.delete(data, 0, axis=axis) if data.shape[axis] > 1 else np.concatenate([data, data], axis=axis)
    _replace(f, name, data=data)


def dtype_lie(f, rng, fifo):
    name = str(rng.choice([n for n in _datasets(f, read_only=True) if f[n].dtype.kind in "iuf"]))
    data = f[name][()]
    kind = int(rng.integers(0, 3))
    new = data.astype(np.int32) if kind == 0 else data.astype(np.float32) if kind == 1 else \
        np.array([str(v) for v in np.ravel(data)], dtype=h5py.string_dtype()).reshape(data.shape)
    _replace(f, name, data=new)


def variable_attribute(f, rng, fifo):
    name = str(rng.choice(_datasets(f, read_only=True)))
    key, value = [("scale_factor", np.nan), ("add_offset", 1.0), ("_FillValue", 0.0), ("units", "days since 2000-01-01"),
                  ("missing_value", 0.0), ("dtype", "int64")][int(rng.integers(0, 6))]
    with contextlib.suppress(KeyError, TypeError, ValueError, OSError):
        del f[name].attrs[key]
    f[name].attrs[key] = value


def extra_variable(f, rng, fifo):
    group = str(rng.choice([g for g in ("vbsvm", "vbsvm_state", "constant_data") if g in f]))
    f.create_dataset(f"{group}/extra_{int(rng.integers(0, 100))}", data=np.array([np.nan, 1.0]))


def remove(f, rng, fifo):
    del f[str(rng.choice(_datasets(f, read_only=True)))]


def external_storage(f, rng, fifo):
    name = str(rng.choice(_datasets(f)))
    _replace(f, name, shape=(8,), dtype="f8", external=[(str(fifo), 0, 64)])


def virtual(f, rng, fifo):
    name = str(rng.choice(_datasets(f)))
    layout = h5py.VirtualLayout(shape=(8,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(fifo), "x", shape=(8,))
    del f[name]
    f.create_virtual_dataset(name, layout, fillvalue=0.0)


def link(f, rng, fifo):
    names = _datasets(f) + sorted(f)
    name = str(rng.choice(names))
    del f[name]
    f[name] = h5py.ExternalLink(str(fifo), "/x") if rng.random() < 0.7 else h5py.SoftLink("/" + names[0])


def huge(f, rng, fifo):
    name = str(rng.choice(_datasets(f)))
    ndim = max(f[name].ndim, 1)
    shape = (4,) * (ndim - 1) + (int(rng.choice([10 ** 8, 10 ** 9, 10 ** 11])),)
    chunks = (1,) * (ndim - 1) + (1000,)
    _replace(f, name, shape=shape, dtype="f8", compression="gzip", chunks=chunks)


BYTE_DAMAGE = [flip, zero, fill, copy, truncate]
CRAFTED = [root_attribute, fit_type, layout_index, inject, shape_lie, dtype_lie, variable_attribute, extra_variable,
           remove, external_storage, virtual, link, huge]
KINDS = BYTE_DAMAGE + CRAFTED


def build_corpus(bases, directory, fifo, n, seed=0):
    """Write ``n`` damaged or crafted copies of the files ``bases`` to ``directory``; returns
    ``[(case, path, base name)]``, cycling through :data:`KINDS` and the bases."""
    rng = np.random.default_rng(seed)
    names = sorted(bases)
    cases = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        base = names[(i + i // len(KINDS)) % len(names)]
        path = directory / f"case{i:03d}_{kind.__name__}_{base}.nc"
        if kind in BYTE_DAMAGE:
            data = bytearray(bases[base].read_bytes())
            kind(data, rng, fifo)
            path.write_bytes(bytes(data))
        else:
            shutil.copyfile(bases[base], path)
            with h5py.File(path, "r+") as f:
                kind(f, rng, fifo)
        cases.append((f"{i:03d} {kind.__name__} of {base}", str(path), base))
    return cases


# ============================================================================ loading
def fingerprint(fit):
    """SHA-256 of everything a loaded fit is: class, method, settings, layout, info, posterior
    arrays and data (linear fits); class, attributes and state arrays (GP fits)."""
    h = hashlib.sha256(type(fit).__name__.encode())
    if hasattr(fit, "layout"):
        h.update(json.dumps([fit.method, fit.settings, fit.layout.to_dict(), fit.info], sort_keys=True,
                            default=repr).encode())
        arrays = fit.posterior
        raw = fit.design.raw
        h.update(pd.util.hash_pandas_object(raw, index=True).to_numpy().tobytes())
        h.update(repr([(c, str(t)) for c, t in raw.dtypes.items()]).encode())
    else:
        tree = fit.with_draw_shape(1, 2).to_arviz()
        h.update(json.dumps(dict(tree.attrs), sort_keys=True, default=repr).encode())
        arrays = {k: v.values for k, v in tree["vbsvm_state"].data_vars.items()}
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}{a.dtype.str}{a.shape}".encode() + a.tobytes())
    return h.hexdigest()


def peak_memory():
    """This process's peak resident memory (bytes; Linux ``VmHWM``)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def load_cases(cases, bases, read_seconds=READ_SECONDS, report=None):
    """Load every case (``[(case, path, base)]``) in this process; returns one result per case:
    outcome (``refused``, ``identical`` to its base, ``different``, ``other error``), wall time,
    the reader's peak memory and time limit, whether it timed out."""
    from vbsvm.exceptions import FitFileError

    reference = {name: fingerprint(vbsvm.load(path)) for name, path in bases.items()}
    old, vbsvm.io.fit_file.READ_SECONDS = vbsvm.io.fit_file.READ_SECONDS, read_seconds
    results = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for case, path, base in cases:
                vbsvm.io.fit_file.LAST_READ = None
                start = time.monotonic()
                try:
                    fit = vbsvm.load(path)
                    outcome, detail = ("identical" if fingerprint(fit) == reference[base] else "different"), ""
                except FitFileError as exc:
                    outcome, detail = "refused", str(exc)
                except Exception as exc:  # noqa: BLE001 - recorded as a failure of the test
                    outcome, detail = "other error", f"{type(exc).__name__}: {exc}"
                stats = vbsvm.io.fit_file.LAST_READ
                result = {"case": case, "outcome": outcome, "detail": detail[:300],
                          "seconds": time.monotonic() - start,
                          "reader_peak": stats.reader_peak_rss if stats else None,
                          "time_limit": stats.time_limit if stats else None,
                          "timed_out": bool(stats and stats.timed_out)}
                results.append(result)
                if report:
                    report(result)
    finally:
        vbsvm.io.fit_file.READ_SECONDS = old
    return results


#: The subprocess that loads the full corpus (so that its peak memory is the loader's alone).
RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from test_fit_file_corpus import load_cases, peak_memory
spec = json.load(open(sys.argv[1]))
for name, path in spec["bases"].items():
    __import__("vbsvm").load(path)
print(json.dumps({"baseline_hwm": peak_memory()}), flush=True)
load_cases(spec["cases"], spec["bases"], report=lambda r: print(json.dumps(r), flush=True))
print(json.dumps({"loader_hwm": peak_memory()}), flush=True)
"""


def run_corpus(directory, n, seed=0, subprocess_loader=False):
    """Build a corpus of ``n`` files in ``directory`` and load it (in this process, or in a
    subprocess that also reports its peak memory); returns ``(results, summary)``."""
    bases = {k: str(v) for k, v in save_bases(directory).items()}
    fifo = directory / "target.fifo"
    with watched_fifo(fifo) as opened:
        cases = build_corpus({k: Path(v) for k, v in bases.items()}, directory, fifo, n, seed)
        start = time.monotonic()
        summary = {}
        if subprocess_loader:
            (directory / "cases.json").write_text(json.dumps({"cases": cases, "bases": bases}))
            out = subprocess.run([sys.executable, "-c", RUNNER, str(directory / "cases.json"), str(Path(__file__).parent)],
                                 capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                 check=False)
            assert out.returncode == 0, out.stderr[-3000:]
            lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            results = [line for line in lines if "case" in line]
            summary.update(baseline_hwm=lines[0]["baseline_hwm"], loader_hwm=lines[-1]["loader_hwm"])
        else:
            results = load_cases(cases, bases)
        summary.update(files=len(results), elapsed=time.monotonic() - start)
        time.sleep(0.05)
        summary["read_other_file"] = opened()
    for key in ("refused", "identical", "different", "other error"):
        summary[key] = sum(r["outcome"] == key for r in results)
    peaks = [r["reader_peak"] for r in results if r["reader_peak"]]
    seconds = sorted(r["seconds"] for r in results)
    summary.update(max_reader_peak=max(peaks, default=None), reader_peak_reported=len(peaks),
                   median_seconds=seconds[len(seconds) // 2], max_seconds=seconds[-1],
                   timed_out=[r["case"] for r in results if r["timed_out"]], by_kind={})
    for r in results:
        counts = summary["by_kind"].setdefault(r["case"].split()[1], {})
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return results, summary


def check(results, summary):
    bad = [r for r in results if r["outcome"] not in ("refused", "identical")]
    assert not bad, json.dumps(bad[:5], indent=1)
    assert not summary["read_other_file"], "a file made the loader open the watched FIFO"
    for r in results:
        limit = r["time_limit"] or READ_SECONDS
        assert r["seconds"] < limit + 10, r
        if r["reader_peak"] is not None:
            assert r["reader_peak"] < READER_PEAK_BOUND, r
    if "loader_hwm" in summary:
        assert summary["loader_hwm"] - summary["baseline_hwm"] < LOADER_GROWTH_BOUND, summary
    assert summary["refused"] > 0


def test_corpus_kinds_cover_the_damage():
    assert len(KINDS) == 18 and FULL >= 200


def test_quick_corpus_is_refused_or_identical(tmp_path):
    results, summary = run_corpus(tmp_path, n=len(KINDS) * QUICK_PER_KIND)
    print(json.dumps(summary))
    assert summary["files"] == len(KINDS) * QUICK_PER_KIND
    check(results, summary)


@pytest.mark.slow
def test_full_corpus_is_refused_or_identical(tmp_path):
    results, summary = run_corpus(tmp_path, n=FULL, subprocess_loader=True)
    print(json.dumps(summary))
    assert summary["files"] == FULL
    check(results, summary)
