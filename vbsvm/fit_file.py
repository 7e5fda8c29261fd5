"""The fit file: writing it atomically and reading it as bounded data only.

A saved fit is a netCDF-4 (HDF5) file written by :meth:`vbsvm.results.Fit.save` or
:meth:`vbsvm.GPFit.save`. Reading one must be safe whatever the file holds, because fit files are
passed around. So :func:`vbsvm.load` (:func:`read_fit_file`, whose docstring lists every check
and bound):

* opens only a regular file of bounded size, and parses it in a child process
  (:mod:`vbsvm.fit_file_reader`) with capped memory and a time limit, so that a damaged file
  that makes libhdf5 loop, crash or allocate without bound is refused instead;
* checks every HDF5 object before any data is read (no links, external storage or virtual
  datasets that would read other files, plain types, bounded declared sizes), then the
  attributes and the declared shape of every array against the fit's layout
  (:mod:`vbsvm.fit_file_schema`), then every value read (finite, signs, ranges, indices), then
  the checksum :func:`write_atomically` stored with the fit; after building the fit it uses it
  once (:func:`check_loaded`) and checks that the design rebuilt from the stored data matches
  the saved coefficients (:func:`check_rebuilt`);
* never evaluates text from the file as Python: the stored formula is checked against the
  whitelist of :mod:`vbsvm.formula_safety` before formulaic parses it, and a saved design is
  plain JSON data (:mod:`vbsvm.design_data`), never a pickle;
* turns every failure into :class:`~vbsvm.exceptions.FitFileError` naming the file and what is
  wrong with it (:func:`refusing`); no file handle stays open, whatever the outcome.

:func:`write_atomically` writes to a temporary file in the target's directory, adds the checksum
of its contents (:func:`add_checksum`), ``fsync``\\ s it and renames it over the target with
:func:`os.replace`, so an interrupted or killed save leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr

from . import fit_file_reader, fit_file_schema
from .exceptions import FitFileError, InputError, InputTypeError, VbsvmError
from .fit_file_reader import (
    CHECKSUM_ATTRIBUTE,
    collect,
    content_digest,
    decode_attribute,
    read_exactly,
    read_message,
)
from .formula_safety import check_formula

__all__ = [
    "FIT_TYPES",
    "MAX_ATTRIBUTE_CHARS",
    "MAX_FILE_BYTES",
    "READ_GROUPS",
    "ReadStats",
    "add_checksum",
    "check_loaded",
    "check_rebuilt",
    "check_settings",
    "check_storable",
    "declared_bound",
    "read_fit_file",
    "read_time_limit",
    "refusing",
    "replace_atomically",
    "write_atomically",
]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Longest root attribute accepted (characters); real ones are a few kilobytes.
MAX_ATTRIBUTE_CHARS = 10_000_000

_LINEAR_GROUPS = ({"posterior", "observed_data", "constant_data", "vbsvm"}, {"sample_stats"})
_LINEAR_ATTRS = {"vbsvm_version": "text", "settings": "json", "layout": "json", "method": "text", "info": "json"}
#: fit type -> (required groups, optional groups, root attributes: "text" or "json")
FIT_TYPES = {
    "linear": (*_LINEAR_GROUPS, _LINEAR_ATTRS),
    "selection": (*_LINEAR_GROUPS, _LINEAR_ATTRS),
    "imputed": (*_LINEAR_GROUPS, _LINEAR_ATTRS),
    "gpsvm": ({"posterior", "vbsvm_state"}, {"sample_stats"}, {"vbsvm_gp_meta": "json", "design": "json"}),
}
_OPTIONAL_ATTRS = {"info", "design", "vbsvm_version"}
#: JSON attributes that may hold no NaN or infinite number.
_FINITE_ATTRS = {"settings", "layout", "vbsvm_gp_meta", "design"}
_COLUMN_DTYPE = re.compile(r"(u?int(8|16|32|64)|float(16|32|64)|bool|str|category)")


# ===================================================================== writing
def write_atomically(tree: xr.DataTree, path) -> None:
    """Write ``tree`` to ``path`` (netCDF via h5netcdf) so that ``path`` is never half written.

    A fit's tree (one with a ``vbsvm_fit_type`` attribute) also gets its checksum
    (:func:`add_checksum`). See :func:`replace_atomically`.
    """
    def write(tmp):
        tree.to_netcdf(tmp, engine="h5netcdf")
        if tree.attrs.get("vbsvm_fit_type") in READ_GROUPS:
            add_checksum(tmp)

    replace_atomically(path, write)


def add_checksum(path):
    """Add to the fit file ``path`` (just written) the root attribute ``vbsvm_checksum``: the
    SHA-256 of everything :func:`read_fit_file` reads from it
    (:func:`vbsvm.fit_file_reader.content_digest`), read back as the loader reads it."""
    import h5py

    with h5py.File(path, "r+") as f:
        kind = f.attrs["vbsvm_fit_type"]
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        structure, values = collect(f, READ_GROUPS[kind])
        f.attrs[CHECKSUM_ATTRIBUTE] = "sha256:" + content_digest(structure, READ_GROUPS[kind], values)


def replace_atomically(path, write) -> None:
    """Create or replace the file ``path`` with what ``write(temporary_path)`` writes, atomically.

    ``write`` fills a temporary file in the same directory, which is flushed to disk (``fsync``)
    and then renamed over ``path`` (:func:`os.replace`, atomic on POSIX and Windows); the
    directory entry is synced too. On any error or interrupt the temporary file is removed and an
    existing ``path`` is left as it was (only a killed process can leave the temporary file).

    Raises
    ------
    vbsvm.exceptions.InputTypeError
        If ``path`` is not a string or path.
    vbsvm.exceptions.InputError
        If the directory does not exist or cannot be written.
    """
    path = _as_path(path, "path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"cannot save to {path!r}: the directory {directory!r} does not exist; create it first.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot save to {path!r} ({exc.strerror}); choose a writable directory.") from None
    try:
        os.close(fd)
        os.chmod(tmp, _new_file_mode(path))
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"cannot save to {path!r} ({exc}); choose a writable path.") from None
        raise
    _fsync_directory(directory)


def _new_file_mode(path):
    """The mode ``open(path, 'w')`` would give: the existing file's, else 0o666 minus the umask."""
    with contextlib.suppress(OSError):
        return os.stat(path).st_mode & 0o777
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_directory(directory):
    with contextlib.suppress(OSError):  # not supported everywhere (e.g. Windows): best effort
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_storable(raw):
    """Refuse to save data columns that would not come back the same from the file.

    The ``constant_data`` group stores the values of a text or categorical column as text, so a
    column mixing types (``[0, "a", 1.5]``), an object column of numbers, or categories that are
    not text would load back as other values or levels, and the design rebuilt from them would
    not match the coefficients.

    Raises
    ------
    vbsvm.exceptions.InputError
        Naming the column and how to convert it.
    """
    import pandas as pd

    for name in raw.columns:
        col = raw[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            values, what = list(col.cat.categories), "categories"
        elif pd.api.types.is_object_dtype(col):
            values, what = col.dropna().tolist(), "values"
        else:
            continue
        odd = sorted({type(v).__name__ for v in values if not isinstance(v, str)})
        if odd:
            raise InputError(f"cannot save the fit: column {name!r} has {what} of type(s) {odd} besides text, which "
                             "a fit file stores as text, so they would load back differently; convert the column "
                             f"(df[{name!r}] = df[{name!r}].astype(str), or to a numeric dtype) and refit.")


def check_rebuilt(design, layout, y):
    """Check that a design rebuilt from a file's data matches the coefficients and responses saved with it."""
    if list(design.column_names) != list(layout.fixed):
        raise FitFileError(f"the data stored in the file rebuild the design columns {list(design.column_names)[:8]}, "
                           f"not the saved coefficients {list(layout.fixed)[:8]}.")
    if design.y.shape != np.shape(y) or not np.array_equal(design.y, y):
        raise FitFileError(f"the data stored in the file rebuild {design.n} responses that differ from the "
                           f"{np.size(y)} saved in 'observed_data'.")


# ===================================================================== reading
#: Largest fit file :func:`read_fit_file` opens (bytes).
MAX_FILE_BYTES = 4 << 30
#: Bytes the datasets of a file may declare in all: this allowance plus
#: :data:`DECLARED_PER_FILE_BYTE` times the file's size, at most :data:`MAX_DECLARED_BYTES`.
DECLARED_ALLOWANCE = 64 << 20
#: See :data:`DECLARED_ALLOWANCE` (a fit file stores its arrays uncompressed: what they declare is
#: about what the file holds).
DECLARED_PER_FILE_BYTE = 2
#: Absolute cap of the bytes a file's datasets may declare.
MAX_DECLARED_BYTES = 4 << 30
#: Address space the reader process may add to its start-up size: this allowance plus
#: :data:`READER_MEMORY_PER_DECLARED_BYTE` times the declared-bytes bound.
READER_MEMORY_ALLOWANCE = 256 << 20
#: See :data:`READER_MEMORY_ALLOWANCE`.
READER_MEMORY_PER_DECLARED_BYTE = 3
#: Time limit of a read (seconds): this plus :data:`READ_SECONDS_PER_GIB` per GiB of file.
READ_SECONDS = 60.0
#: See :data:`READ_SECONDS`.
READ_SECONDS_PER_GIB = 120.0
#: Groups read (the rest are ArviZ views a fit rebuilds: checked, not read), by fit type.
READ_GROUPS = {"linear": ("constant_data", "observed_data", "vbsvm"),
               "selection": ("constant_data", "observed_data", "vbsvm"),
               "imputed": ("constant_data", "observed_data", "vbsvm"),
               "gpsvm": ("vbsvm_state",)}
_ALL_READ_GROUPS = sorted({g for groups in READ_GROUPS.values() for g in groups})
#: Root attributes of every fit file besides its type's (see :data:`FIT_TYPES`).
_COMMON_ATTRS = ("vbsvm_fit_type", "vbsvm_version", CHECKSUM_ATTRIBUTE)


@dataclass(frozen=True)
class ReadStats:
    """What the last read by the reader process cost: wall time (s), the process's peak resident
    memory (bytes; None where unknown, e.g. when it was killed), the bounds it ran under, and
    whether it was killed for taking too long."""

    seconds: float
    reader_peak_rss: int | None
    declared_bound: int
    memory_bound: int
    time_limit: float
    timed_out: bool


#: :class:`ReadStats` of the last read that started a reader process (None before the first).
LAST_READ = None


def declared_bound(file_size):
    """Bytes the datasets of a file of ``file_size`` bytes may declare in all (see
    :data:`DECLARED_ALLOWANCE`)."""
    return int(min(MAX_DECLARED_BYTES, DECLARED_ALLOWANCE + DECLARED_PER_FILE_BYTE * file_size))


def read_time_limit(file_size):
    """Seconds a read of a file of ``file_size`` bytes may take (see :data:`READ_SECONDS`)."""
    return READ_SECONDS + READ_SECONDS_PER_GIB * file_size / (1 << 30)


def _as_path(path, name):
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
        if isinstance(path, str):
            return path
    raise InputTypeError(f"{name} must be a file name (str or pathlib.Path), got {type(path).__name__}.")


def read_fit_file(path):
    """Read and check a fit file; return ``(fit_type, tree)``.

    ``tree`` holds the root attributes and the groups a fit is rebuilt from (``constant_data``,
    ``observed_data`` and ``vbsvm``; ``vbsvm_state`` for a GP fit): the ArviZ groups
    (``posterior``, ``sample_stats``) are checked but not read, as the fit rebuilds them.

    What is promised (each failure is a :class:`FitFileError` naming the file, the attribute or
    dataset, and why):

    * only a regular file is opened (``os.stat`` before, ``fstat`` of the opened descriptor
      after: no FIFO, device or directory), of at most :data:`MAX_FILE_BYTES`, starting with the
      HDF5 signature;
    * the HDF5 data is parsed in a child process (:mod:`vbsvm.fit_file_reader`), killed after
      :func:`read_time_limit` seconds (60 s plus 120 s per GiB), whose address space is capped at
      its start-up size plus 256 MiB plus 3 times the declared-bytes bound, that may not write
      files and loads no HDF5 plugin; a hang, crash or exhausted memory there is a refusal;
    * before anything is read, every link and object is checked: no external, soft or
      user-defined links, no external storage, no virtual datasets, only the deflate, shuffle and
      fletcher32 filters, numbers and variable-length text only; the datasets may declare at most
      :func:`declared_bound` bytes in all (64 MiB plus twice the file's size, at most 4 GiB);
    * before anything is read, the attributes are checked (fit type, settings, layout, JSON
      structure, no NaN or infinity in settings and layout) and every array's dtype and shape
      against the fit's layout (:func:`vbsvm.fit_file_schema.check_declared`): each fit type's
      required arrays present, those of other fit types absent;
    * after reading, every value (:func:`vbsvm.fit_file_schema.check_values`): finite numbers,
      non-negative variances, positive shape and scale parameters, probabilities in [0, 1],
      indices in range, responses in {-1, +1}, data columns matching their stored dtype and
      categories; then the SHA-256 checksum saved with the fit must match everything read, so
      a damaged or edited file is refused rather than loaded with other values.

    Nothing in the file is evaluated; the formula is checked against the whitelist of
    :mod:`vbsvm.formula_safety` before formulaic parses it (in the fit's ``from_datatree``).
    """
    path = _as_path(path, "path")
    fd, size = _open_regular(path)
    try:
        start = _read_at(fd, 0, len(HDF5_SIGNATURE))
        if start != HDF5_SIGNATURE:
            what = "it is empty" if not size else "it does not start with the HDF5 signature"
            raise FitFileError(f"{path!r} is not a netCDF file written by vbsvm ({what}); vbsvm.load reads the "
                               "files written by fit.save().")
        with _ReaderProcess(fd, path, size) as reader:
            structure = reader.structure()
            with refusing(path):
                kind, attrs, plan = _check_structure(structure)
            values = reader.read(plan)
    finally:
        os.close(fd)
    with refusing(path):
        _check_contents(kind, attrs, structure, values)
        _check_checksum(kind, structure, values)
        tree = _build_tree(kind, structure, values)
    return kind, tree


def _open_regular(path):
    """Open ``path`` read-only if it is a regular file of at most :data:`MAX_FILE_BYTES`; return
    ``(descriptor, size)``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FitFileError(f"no such file: {path!r}; check the path.") from None
    except OSError as exc:
        raise FitFileError(f"cannot read {path!r} ({exc.strerror}).") from None
    _check_regular(st, path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FitFileError(f"cannot read {path!r} ({exc.strerror}).") from None
    try:
        now = os.fstat(fd)
        _check_regular(now, path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FitFileError(f"{path!r} was replaced while it was being opened; load it again.")
    except BaseException:
        os.close(fd)
        raise
    return fd, now.st_size


def _check_regular(st, path):
    if stat.S_ISDIR(st.st_mode):
        raise FitFileError(f"{path!r} is a directory, not a fit file.")
    if not stat.S_ISREG(st.st_mode):
        what = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a device" if
                stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise FitFileError(f"{path!r} is {what}; vbsvm.load reads regular files written by fit.save().")
    if st.st_size > MAX_FILE_BYTES:
        raise FitFileError(f"{path!r} has {st.st_size:,} bytes, more than a fit file may have "
                           f"({MAX_FILE_BYTES:,}).")


def _read_at(fd, offset, n):
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - platforms without pread
    return os.read(fd, n)


class _ReaderProcess:
    """The child process of :mod:`vbsvm.fit_file_reader` reading one file (see its docstring)."""

    def __init__(self, fd, path, size):
        self.path, self.fd = path, fd
        self.budget = declared_bound(size)
        self.memory = READER_MEMORY_ALLOWANCE + READER_MEMORY_PER_DECLARED_BYTE * self.budget
        self.limit = read_time_limit(size)
        self.timed_out = False
        self.waiting = False  # the reader waits for the list of variables to read
        self.peak = None
        self.started = time.monotonic()
        limits = {"budget": self.budget, "read_groups": _ALL_READ_GROUPS, "memory": self.memory,
                  "cpu_seconds": math.ceil(self.limit) + 1}
        posix = os.name == "posix"
        command = [sys.executable or "python", "-I", "-B", "-S", fit_file_reader.__file__, str(fd) if posix else path,
                   json.dumps(limits), json.dumps(_module_roots())]
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=_reader_environment(),
                                         pass_fds=(fd,) if posix else ())
        except OSError as exc:
            raise FitFileError(f"cannot start the process that reads {path!r} ({exc}); vbsvm.load reads fit files "
                               "in a child process of the Python interpreter (sys.executable).") from None
        self.timer = threading.Timer(self.limit, self._kill_for_time)
        self.timer.daemon = True
        self.timer.start()

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc):
        global LAST_READ
        refused = kind is not None and issubclass(kind, FitFileError)
        if refused and self.waiting and self.proc.poll() is None:  # refused the structure: stop the reader
            with contextlib.suppress(OSError, FitFileError):
                self.proc.stdin.write(b"null\n")
                self.proc.stdin.flush()
                self._message(1 << 16)
        self.timer.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.proc.wait()
        LAST_READ = ReadStats(seconds=time.monotonic() - self.started, reader_peak_rss=self.peak,
                              declared_bound=self.budget, memory_bound=self.memory, time_limit=self.limit,
                              timed_out=self.timed_out)
        return False

    def _kill_for_time(self):
        self.timed_out = True
        with contextlib.suppress(OSError):
            self.proc.kill()

    def _message(self, limit):
        try:
            msg = read_message(self.proc.stdout, limit)
        except (EOFError, ValueError, OSError) as exc:
            self._failed(exc)
        if not isinstance(msg, dict):
            self._failed(ValueError("a message that is not a JSON object"))
        if isinstance(msg.get("peak_rss"), int):
            self.peak = msg["peak_rss"]
        if "error" in msg:
            raise FitFileError(f"{self.path!r}: {msg['error']}")
        return msg

    def _failed(self, exc):
        if self.timed_out:
            raise FitFileError(f"{self.path!r}: reading it took longer than {self.limit:.0f} s, the limit for a "
                               "file of its size; it is corrupted (a damaged HDF5 structure can make libhdf5 loop), "
                               "or the machine is very busy (then load it again).") from None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            raise FitFileError(f"{self.path!r}: the HDF5 library crashed reading it (signal {-code}); it is "
                               "corrupted.") from None
        raise FitFileError(f"{self.path!r} cannot be read: the reader process stopped ({_short(exc)}, exit code "
                           f"{code}); it is corrupted, or reading it needs more memory than the reader's bound "
                           f"({self.memory:,} bytes).") from None

    def structure(self):
        """The reader's structure message (see :func:`vbsvm.fit_file_reader.describe`)."""
        msg = self._message(self.budget + (16 << 20))
        structure = msg.get("structure")
        if not isinstance(structure, dict):
            self._failed(ValueError("no structure"))
        self.waiting = True
        return structure

    def read(self, plan):
        """Ask for the variables ``plan`` (``[(group, name, meta)]``) and return
        ``{(group, name): array}``."""
        self.waiting = False
        try:
            self.proc.stdin.write((json.dumps([[g, v] for g, v, _ in plan]) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            self._failed(exc)
        index = self._message(self.budget + (16 << 20)).get("index")
        if not isinstance(index, list) or len(index) != len(plan):
            self._failed(ValueError("an index that does not list the variables asked for"))
        values, total = {}, 0
        for entry, (group, name, meta) in zip(index, plan):
            if not isinstance(entry, dict) or (entry.get("group"), entry.get("name")) != (group, name) \
                    or entry.get("dtype") != meta["dtype"] or entry.get("shape") != meta["shape"]:
                self._failed(ValueError(f"the variable {name!r} of group {group!r} came back unlike its declaration"))
            shape = tuple(meta["shape"])
            if meta["dtype"] == "str":
                items = entry.get("values")
                if not isinstance(items, list) or len(items) != math.prod(shape) or \
                        not all(isinstance(v, str) for v in items):
                    self._failed(ValueError(f"the text variable {name!r} came back malformed"))
                arr = np.empty(len(items), dtype=object)
                arr[:] = items
                values[(group, name)] = arr.reshape(shape)
                continue
            dtype = np.dtype(meta["dtype"])
            nbytes = math.prod(shape) * dtype.itemsize
            total += nbytes
            if entry.get("nbytes") != nbytes or total > self.budget:
                self._failed(ValueError(f"the variable {name!r} came back with an unexpected size"))
            try:
                buffer = read_exactly(self.proc.stdout, nbytes)
            except (EOFError, OSError) as exc:
                self._failed(exc)
            values[(group, name)] = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        self._message(1 << 16)  # the last: the reader's peak memory
        return values


def _module_roots():
    """Directories the reader process needs on its path: where numpy, h5py and h5netcdf are."""
    import h5netcdf
    import h5py

    roots = []
    for module in (np, h5py, h5netcdf):
        root = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))
        if root not in roots:
            roots.append(root)
    return roots


def _reader_environment():
    """The reader's environment: the caller's without HDF5 settings (drivers, VOL connectors,
    plugin paths), with HDF5 plugins disabled and one BLAS thread."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("HDF5_")}
    env.update(HDF5_PLUGIN_PRELOAD="::", HDF5_USE_FILE_LOCKING="FALSE", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


@contextlib.contextmanager
def refusing(path):
    """Context manager: any error inside becomes :class:`FitFileError` naming ``path``.

    Used around everything :func:`vbsvm.load` builds from a file: whatever a damaged or crafted
    file makes fail (a vbsvm error about its contents, a shape mismatch deep in numpy), the caller
    sees one error type that says which file is at fault.
    """
    try:
        yield
    except FitFileError as exc:
        message = str(exc)
        raise FitFileError(message if repr(path) in message else f"{path!r}: {message}") from None
    except VbsvmError as exc:
        raise FitFileError(f"{path!r} holds a fit vbsvm cannot rebuild: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the boundary of the file format: no foreign error escapes
        raise FitFileError(f"{path!r} is not a consistent vbsvm fit ({type(exc).__name__}: {_short(exc)}).") from None


def _short(exc, limit=300):
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


# ----------------------------------------------------------------- the structure, before reading
def _check_structure(structure):
    """Check what the file declares; return ``(kind, attrs, plan)``: the fit type, its parsed root
    attributes and the variables to read (``[(group, name, meta)]``)."""
    groups = structure.get("groups")
    raw_attrs = structure.get("attrs")
    if not isinstance(groups, dict) or not isinstance(raw_attrs, dict):
        raise FitFileError("the reader returned a malformed structure.")
    root = {}
    for name, encoded in raw_attrs.items():
        try:
            root[name] = decode_attribute(encoded)
        except (ValueError, TypeError):
            raise FitFileError(f"the root attribute {name!r} has an unreadable value.") from None
    kind = root.get("vbsvm_fit_type")
    if kind is None:
        raise FitFileError("a netCDF file but not a vbsvm fit (no 'vbsvm_fit_type' attribute).")
    if not isinstance(kind, str) or kind not in FIT_TYPES:
        from . import __version__

        raise FitFileError(f"a vbsvm file of type {_short(repr(kind), 60)}, which vbsvm {__version__} cannot read; "
                           "upgrade vbsvm or refit the model.")
    if structure.get("root_variables"):
        raise FitFileError(f"the {kind} fit has variables at the root ({structure['root_variables'][:5]}); a fit "
                           "file keeps its arrays in groups.")
    required, optional, schema = FIT_TYPES[kind]
    names = set(groups)
    if required - names:
        raise FitFileError(f"the {kind} fit lacks the group(s) {sorted(required - names)}.")
    if names - required - optional:
        raise FitFileError(f"the {kind} fit has unexpected group(s) {sorted(names - required - optional)}.")
    unknown = set(root) - set(schema) - set(_COMMON_ATTRS)
    if unknown:
        raise FitFileError(f"the {kind} fit has unexpected root attribute(s) {sorted(unknown)[:5]}.")
    attrs = {}
    for name, form in schema.items():
        if name not in root:
            if name in _OPTIONAL_ATTRS:
                continue
            raise FitFileError(f"the {kind} fit lacks the attribute {name!r}.")
        attrs[name] = _attribute(root[name], name, form, finite=name in _FINITE_ATTRS)
    checksum = root.get(CHECKSUM_ATTRIBUTE)
    if not isinstance(checksum, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", checksum):
        raise FitFileError(f"the attribute {CHECKSUM_ATTRIBUTE!r} is missing or malformed: the file was not "
                           "written by fit.save() of this vbsvm (or was edited since); load it with the vbsvm that "
                           "wrote it and save it again.")
    if not isinstance(root.get("vbsvm_version", ""), str):
        raise FitFileError("the attribute 'vbsvm_version' must be text.")
    for group in READ_GROUPS[kind]:
        if group not in groups:
            continue
        if groups[group].get("attrs"):
            raise FitFileError(f"the group {group!r} has unexpected attribute(s) {sorted(groups[group]['attrs'])[:5]}.")
        _check_variable_attributes(group, groups[group]["variables"])
    if kind == "gpsvm":
        meta = attrs["vbsvm_gp_meta"]
        _check_gp_meta(meta)
        n_params = fit_file_schema.kernel_parameter_count(meta["kernel"], meta["n_features"])
        state = groups["vbsvm_state"]["variables"]
        fit_file_schema.check_declared(kind, meta["method"], "vbsvm_state", state,
                                       {"f": meta["n_features"], "P": n_params})
    else:
        if attrs["method"] != attrs["settings"].get("method"):
            raise FitFileError(f"the attribute 'method' ({_short(repr(attrs['method']), 40)}) disagrees with the "
                               f"settings ({_short(repr(attrs['settings'].get('method')), 40)}).")
        check_settings(attrs["settings"])
        fit_file_schema.check_layout(attrs["layout"])
        n = _check_data_groups(groups)
        symbols = fit_file_schema.layout_symbols(attrs["layout"], n)
        fit_file_schema.check_declared(kind, attrs["method"], "vbsvm", groups["vbsvm"]["variables"], symbols,
                                       attrs["layout"], attrs.get("info"))
        _check_info(kind, attrs.get("info", {}))
    plan = [(group, name, meta) for group in READ_GROUPS[kind]
            for name, meta in sorted(groups[group]["variables"].items())]
    return kind, attrs, plan


def _attribute(value, name, form, finite=False):
    if not isinstance(value, str):
        raise FitFileError(f"the attribute {name!r} must be text, found {type(value).__name__}.")
    if len(value) > MAX_ATTRIBUTE_CHARS:
        raise FitFileError(f"the attribute {name!r} has {len(value)} characters (at most {MAX_ATTRIBUTE_CHARS}).")
    if form == "text":
        return value
    try:
        parsed = fit_file_schema.check_json_finite(value, name) if finite else json.loads(value)
    except FitFileError:
        raise
    except (ValueError, RecursionError) as exc:
        raise FitFileError(f"the attribute {name!r} is not valid JSON ({type(exc).__name__}).") from None
    if not isinstance(parsed, dict):
        raise FitFileError(f"the attribute {name!r} must be a JSON object, found {type(parsed).__name__}.")
    return parsed


#: Variable attributes a fit file's read groups may carry, by group.
_VARIABLE_ATTRS = {"constant_data": {"_FillValue", "dtype", "categories"}}


def _check_variable_attributes(group, variables):
    allowed = _VARIABLE_ATTRS.get(group, {"_FillValue"})
    for name, meta in variables.items():
        where = f"the variable {name!r} of group {group!r}"
        extra = set(meta["attrs"]) - allowed
        if extra:
            raise FitFileError(f"{where} has the attribute(s) {sorted(extra)[:5]}, which a fit file's variables do "
                               f"not carry (only {sorted(allowed)}); they would change its values.")
        if "_FillValue" in meta["attrs"]:
            fill = decode_attribute(meta["attrs"]["_FillValue"])
            if meta["dtype"] == "str" or np.dtype(meta["dtype"]).kind != "f" or not isinstance(fill, np.ndarray) \
                    or fill.size != 1 or not np.isnan(fill).all():
                raise FitFileError(f"{where} has a _FillValue other than NaN on floating-point data; a fit file "
                                   "marks nothing as missing that way.")
        for key in ("dtype", "categories"):
            if key in meta["attrs"] and not isinstance(decode_attribute(meta["attrs"][key]), str):
                raise FitFileError(f"{where} has a {key!r} attribute that is not text.")


def _check_data_groups(groups):
    """Check the declared data columns and responses; return the number of observations."""
    obs = groups["observed_data"]["variables"]
    if set(obs) - {"y", "obs"} or "y" not in obs:
        raise FitFileError(f"the group 'observed_data' must hold the responses 'y' only, found {sorted(obs)[:5]}.")
    y = obs["y"]
    if len(y["shape"]) != 1 or y["shape"][0] < 1 or y["dtype"] == "str" or y["dims"] != ["obs"]:
        raise FitFileError(f"the responses 'y' in 'observed_data' must be numbers along 'obs', found shape "
                           f"{tuple(y['shape'])} ({y['dtype']}).")
    n = y["shape"][0]
    for name, meta in list(obs.items()) + list(groups["constant_data"]["variables"].items()):
        if meta["shape"] != [n] or meta["dims"] != ["obs"]:
            raise FitFileError(f"the data variable {name!r} has the shape {tuple(meta['shape'])} along "
                               f"{meta['dims']}, not ({n},) along ['obs'] as the responses.")
    data = groups["constant_data"]["variables"]
    if "obs" not in data:
        raise FitFileError("the group 'constant_data' lacks the row labels 'obs'.")
    for name, meta in data.items():
        if name == "obs":
            continue
        kind = decode_attribute(meta["attrs"]["dtype"]) if "dtype" in meta["attrs"] else "float64"
        if not _COLUMN_DTYPE.fullmatch(kind):
            raise FitFileError(f"the stored data column {name!r} has an unknown dtype {_short(repr(kind), 40)}.")
        stored = "str" if meta["dtype"] == "str" else np.dtype(meta["dtype"]).kind
        expected = "str" if kind in ("str", "category") else "iu" if kind == "bool" else "f"
        if stored not in expected:
            raise FitFileError(f"the stored data column {name!r} of dtype {kind!r} is stored as {meta['dtype']}.")
        if kind == "category":
            try:
                cats = json.loads(decode_attribute(meta["attrs"].get("categories", ["str", ""])))
            except (TypeError, ValueError, RecursionError):
                cats = None
            if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats) or len(set(cats)) != len(cats):
                raise FitFileError(f"the categories of the stored data column {name!r} are not a JSON list of "
                                   "distinct text values.")
    return n


def _check_info(kind, info):
    """Check the entries of the ``info`` attribute that enter computations (when present)."""
    def number(v, lo=-math.inf, hi=math.inf, strict_lo=False):
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > lo if strict_lo else v >= lo) and v <= hi)

    cal = info.get("prob_calibration")
    if cal is not None and not (isinstance(cal, list) and len(cal) == 2 and number(cal[0], 0, strict_lo=True)
                                and number(cal[1])):
        raise FitFileError("the entry 'prob_calibration' of the attribute 'info' must be [a > 0, b], finite.")
    if kind == "selection" and not number(info.get("rho"), 0, 1, strict_lo=True):
        raise FitFileError("the entry 'rho' of the attribute 'info' of a selection fit must be a number in (0, 1].")
    for key in ("rho_grid", "rho_elbo"):
        if key in info and not (isinstance(info[key], list) and all(number(v) for v in info[key])):
            raise FitFileError(f"the entry {key!r} of the attribute 'info' must be a list of finite numbers.")
    if "rho_grid" in info and len(info["rho_grid"]) != len(info.get("rho_elbo", [])):
        raise FitFileError("the entries 'rho_grid' and 'rho_elbo' of the attribute 'info' differ in length.")
    if "seconds" in info and not number(info["seconds"], 0):
        raise FitFileError("the entry 'seconds' of the attribute 'info' must be a finite number >= 0.")
    for key in ("draws", "max_draws"):
        if key in info and not _is_int(info[key], 1):
            raise FitFileError(f"the entry {key!r} of the attribute 'info' must be an integer >= 1.")


# ----------------------------------------------------------------- the values, after reading
def _check_contents(kind, attrs, structure, values):
    groups = structure["groups"]
    if kind == "gpsvm":
        arrays = {name: values[("vbsvm_state", name)] for name in groups["vbsvm_state"]["variables"]}
        fit_file_schema.check_values(kind, "vbsvm_state", arrays)
        return
    layout = attrs["layout"]
    y = values[("observed_data", "y")]
    if y.dtype.kind not in "iuf" or not np.isin(y, (-1, 1)).all():
        raise FitFileError("the responses 'y' in 'observed_data' must all be -1 or +1.")
    for name, meta in groups["constant_data"]["variables"].items():
        _check_column(name, meta, values[("constant_data", name)])
    arrays = {name: values[("vbsvm", name)] for name in groups["vbsvm"]["variables"]}
    symbols = fit_file_schema.layout_symbols(layout, y.shape[0])
    fit_file_schema.check_values(kind, "vbsvm", arrays, symbols, layout)


#: A text column's fixed-width form (rows x longest value, what xarray and pandas make of it) may
#: have at most this many characters plus 16 times the column's own.
TEXT_WIDTH_ALLOWANCE = 16 << 20


def _check_column(name, meta, values):
    if values.dtype.kind == "O":
        lengths = np.fromiter((len(v) for v in values.ravel()), dtype=np.int64, count=values.size)
        width = int(lengths.max(initial=0)) * values.size
        if width > TEXT_WIDTH_ALLOWANCE + 16 * int(lengths.sum()):
            raise FitFileError(f"the stored data column {name!r} has values of very unequal lengths (the longest "
                               f"{int(lengths.max())} characters in {values.size} rows): as fixed-width text it would "
                               f"take {width:,} characters.")
    if name == "obs":
        if values.dtype.kind not in "iuO":
            raise FitFileError("the row labels 'obs' in 'constant_data' must be integers or text.")
        return
    kind = decode_attribute(meta["attrs"]["dtype"]) if "dtype" in meta["attrs"] else "float64"
    where = f"the stored data column {name!r}"
    if kind == "bool" and not np.isin(values, (0, 1)).all():
        raise FitFileError(f"{where} of dtype 'bool' holds values other than 0 and 1.")
    if kind.startswith(("int", "uint")):
        info = np.iinfo(kind)
        ok = np.isfinite(values) & (values == np.round(values)) & (values >= info.min) & (values <= info.max)
        if not ok.all():
            raise FitFileError(f"{where} of dtype {kind!r} holds values that are not integers of that type.")
    if kind == "category":
        cats = set(json.loads(decode_attribute(meta["attrs"]["categories"]))) | {"\x00NA"}
        odd = [v for v in set(values.ravel().tolist()) if v not in cats]
        if odd:
            raise FitFileError(f"{where} holds value(s) {sorted(odd)[:3]} that are not among its categories.")


def _check_checksum(kind, structure, values):
    stored = decode_attribute(structure["attrs"][CHECKSUM_ATTRIBUTE])
    actual = "sha256:" + content_digest(structure, READ_GROUPS[kind], values)
    if actual != stored:
        raise FitFileError(f"its contents do not match the checksum ({CHECKSUM_ATTRIBUTE!r}) written when it was "
                           "saved: it was damaged or edited after fit.save(); use an intact copy or refit.")


def _build_tree(kind, structure, values):
    """The DataTree a fit's ``from_datatree`` reads, decoded as xarray decodes a netCDF file (the
    NaN fill value dropped, ``dtype='bool'`` columns as booleans, native byte order)."""
    groups = {"/": xr.Dataset(attrs={k: decode_attribute(v) for k, v in structure["attrs"].items()})}
    for group in READ_GROUPS[kind]:
        data_vars, coords = {}, {}
        for name, meta in structure["groups"][group]["variables"].items():
            arr = values[(group, name)]
            attrs = {k: decode_attribute(v) for k, v in meta["attrs"].items()}
            attrs.pop("_FillValue", None)
            if not arr.dtype.isnative:
                arr = arr.astype(arr.dtype.newbyteorder("="))
            if attrs.get("dtype") == "bool":
                arr = arr.astype(bool)
                del attrs["dtype"]
            if arr.dtype.kind == "O":  # xarray loads variable-length text as fixed-width (checked above)
                arr = arr.astype(str)
            variable = xr.Variable(tuple(meta["dims"]), arr, attrs)
            (coords if tuple(meta["dims"]) == (name,) else data_vars)[name] = variable
        groups[group] = xr.Dataset(data_vars, coords=coords)
    return xr.DataTree.from_dict(groups)


# ----------------------------------------------------------------- settings
def _is_int(v, minimum=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _is_positive(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v < float("inf")


_SETTINGS = {
    "formula": (lambda v: isinstance(v, str), "a formula string"),
    "method": (lambda v: v in ("vb", "gibbs", "map", "meanfield"), "one of 'vb', 'gibbs', 'map', 'meanfield'"),
    "penalty": (lambda v: v is None or v == "auto" or _is_positive(v), "'auto', null or a positive number"),
    "missing": (lambda v: v in ("drop", "raise", "impute"), "one of 'drop', 'raise', 'impute'"),
    "standardize": (lambda v: isinstance(v, bool), "true or false"),
    "accelerate": (lambda v: isinstance(v, bool), "true or false"),
    "progress": (lambda v: isinstance(v, bool), "true or false"),
    "draws": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "chains": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "thin": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "max_iter": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "n_jobs": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "tune": (lambda v: _is_int(v, 0), "an integer >= 0"),
    "seed": (lambda v: v is None or _is_int(v, 0), "null or an integer >= 0"),
    "draw_seed": (lambda v: v is None or _is_int(v, 0), "null or an integer >= 0"),
    "tol": (_is_positive, "a positive number"),
    "sigma2_beta": (_is_positive, "a positive number"),
    "A_u": (_is_positive, "a positive number"),
    "B_u": (_is_positive, "a positive number"),
    "sigma2_mu": (_is_positive, "a positive number"),
    "nu": (_is_positive, "a positive number"),
    "level": (lambda v: isinstance(v, float) and 0 < v < 1, "a number in (0, 1)"),
}
_REQUIRED_SETTINGS = ("formula", "method", "missing", "standardize")


def check_settings(settings):
    """Check the ``settings`` of a saved linear fit: required keys, types and ranges, the formula.

    Keys this version does not know are left alone (newer files may carry more).
    """
    if not isinstance(settings, dict):
        raise FitFileError(f"the settings must be a JSON object, found {type(settings).__name__}.")
    for key in _REQUIRED_SETTINGS:
        if key not in settings:
            raise FitFileError(f"the settings lack {key!r}.")
    for key, (ok, expected) in _SETTINGS.items():
        if key in settings and not ok(settings[key]):
            raise FitFileError(f"the setting {key!r} must be {expected}, found {_short(repr(settings[key]), 60)}.")
    check_formula(settings["formula"], what="the stored formula")


# ----------------------------------------------------------------- using the fit
def check_loaded(fit):
    """Use a freshly loaded fit once (coefficients, random effects, inclusion and imputation
    tables where the fit has them, a prediction), so that a file whose arrays do not fit together
    fails in :func:`vbsvm.load` rather than later.

    Call it inside :func:`refusing`: whatever fails here is turned into :class:`FitFileError`.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(fit, "layout"):  # the linear fits
            fit.coef_table()
            fit.ranef()
            for table in ("inclusion", "imputed"):
                if hasattr(type(fit), table):
                    value = getattr(fit, table)
                    value() if callable(value) else value
            fit.predict(fit.design.raw.head(3), kind="score")
        else:
            fit.predict(np.zeros((2, fit.n_features)), kind="score")


def _check_gp_meta(meta):
    checks = {"method": lambda v: v in ("vb", "svi", "gibbs"), "n_obs": lambda v: _is_int(v, 1),
              "n_features": lambda v: _is_int(v, 1), "kernel": lambda v: isinstance(v, dict),
              "jitter": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and v >= 0,
              "converged": lambda v: isinstance(v, bool), "n_iter": _is_int,
              "formula": lambda v: v is None or isinstance(v, str),
              "settings": lambda v: v is None or isinstance(v, dict)}
    for key, ok in checks.items():
        if key not in meta or not ok(meta[key]):
            raise FitFileError(f"the GP description 'vbsvm_gp_meta' has a missing or invalid {key!r}.")
    for key in ("draws", "chains", "thin"):
        if meta["settings"] is not None and key in meta["settings"] and not _is_int(meta["settings"][key], 1):
            raise FitFileError(f"the GP settings in 'vbsvm_gp_meta' have an invalid {key!r} (an integer >= 1).")
    if meta["formula"] is not None:
        check_formula(meta["formula"], what="the stored formula")
