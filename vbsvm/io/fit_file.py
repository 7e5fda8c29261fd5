"""The fit file: writing it atomically and reading it as data only.

A saved fit is a netCDF-4 (HDF5) file written by :meth:`vbsvm.results.fit.Fit.save` or
:meth:`vbsvm.GPFit.save`. Reading one must be safe whatever the file holds, because fit files are
passed around. So :func:`vbsvm.load`

* reads the whole file into memory and parses it from there (no file handle stays open, whatever
  goes wrong: the file can be overwritten right after a failed load);
* checks the layout before anything is built from it (:func:`read_fit_file`): the HDF5 signature,
  the fit type, the groups (no missing, extra or nested groups), the type, size and JSON
  structure of every root attribute, the settings (types and ranges), the layout, the dtypes of
  the stored data columns and of the posterior arrays; then it uses the fit once
  (:func:`check_loaded`) and checks that the design rebuilt from the stored data matches the
  saved coefficients (:func:`check_rebuilt`);
* never evaluates text from the file as Python: the stored formula is checked against the
  whitelist of :mod:`vbsvm.formula.safety` before formulaic parses it, and a saved design is
  plain JSON data (:mod:`vbsvm.formula.encoding`), never a pickle;
* turns every failure into :class:`~vbsvm.exceptions.FitFileError` naming the file and what is
  wrong with it (:func:`refusing`).

:func:`write_atomically` writes to a temporary file in the target's directory, ``fsync``\\ s it and
renames it over the target with :func:`os.replace`, so an interrupted or killed save leaves the
previous file intact.
"""

from __future__ import annotations

import contextlib
import io
import json
import numbers
import os
import re
import tempfile
import warnings

import numpy as np
import xarray as xr

from vbsvm._version import __version__
from vbsvm.exceptions import FitFileError, InputError, InputTypeError, VbsvmError
from vbsvm.formula.safety import check_formula

__all__ = ["write_atomically", "replace_atomically", "read_fit_file", "refusing", "check_loaded", "check_storable",
           "check_rebuilt", "check_settings", "FIT_TYPES", "MAX_ATTRIBUTE_CHARS"]

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
_COLUMN_DTYPE = re.compile(r"(u?int(8|16|32|64)|float(16|32|64)|bool|str|category)")


# ===================================================================== writing
def write_atomically(tree: xr.DataTree, path) -> None:
    """Write ``tree`` to ``path`` (netCDF via h5netcdf) so that ``path`` is never half written.

    See :func:`replace_atomically`.
    """
    replace_atomically(path, lambda tmp: tree.to_netcdf(tmp, engine="h5netcdf"))


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
def _as_path(path, name):
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
        if isinstance(path, str):
            return path
    raise InputTypeError(f"{name} must be a file name (str or pathlib.Path), got {type(path).__name__}.")


def read_fit_file(path):
    """Read and check a fit file; return ``(fit_type, tree)``.

    The file is read into memory and closed before it is parsed. Nothing in it is evaluated.

    Raises
    ------
    vbsvm.exceptions.FitFileError
        Naming the file and what is wrong: missing, unreadable, not HDF5, truncated or
        corrupted, not a vbsvm fit, of an unknown type, missing/extra/nested groups, an attribute
        of the wrong type or size or not valid JSON, settings of the wrong type or out of range,
        a formula outside the whitelist.
    """
    path = _as_path(path, "path")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FitFileError(f"no such file: {path!r}; check the path.") from None
    except IsADirectoryError:
        raise FitFileError(f"{path!r} is a directory, not a fit file.") from None
    except OSError as exc:
        raise FitFileError(f"cannot read {path!r} ({exc.strerror}).") from None
    if not data.startswith(HDF5_SIGNATURE):
        what = "it is empty" if not data else "it does not start with the HDF5 signature"
        raise FitFileError(f"{path!r} is not a netCDF file written by vbsvm ({what}); vbsvm.load reads the "
                           "files written by fit.save().")
    try:
        tree = xr.open_datatree(io.BytesIO(data), engine="h5netcdf")
        try:
            tree.load()
        finally:
            tree.close()
    except Exception as exc:  # noqa: BLE001 - h5py/netCDF raise many types for damaged files
        raise FitFileError(f"{path!r} cannot be read as netCDF, it is truncated or corrupted "
                           f"({type(exc).__name__}: {_short(exc)}).") from None
    with refusing(path):
        kind = _check_tree(tree)
    return kind, tree


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


def _check_tree(tree):
    kind = tree.attrs.get("vbsvm_fit_type")
    if kind is None:
        raise FitFileError("a netCDF file but not a vbsvm fit (no 'vbsvm_fit_type' attribute).")
    if not isinstance(kind, str) or kind not in FIT_TYPES:

        raise FitFileError(f"a vbsvm file of type {_short(repr(kind), 60)}, which vbsvm {__version__} cannot read; "
                           "upgrade vbsvm or refit the model.")
    required, optional, schema = FIT_TYPES[kind]
    groups = set(tree.children)
    if required - groups:
        raise FitFileError(f"the {kind} fit lacks the group(s) {sorted(required - groups)}.")
    if groups - required - optional:
        raise FitFileError(f"the {kind} fit has unexpected group(s) {sorted(groups - required - optional)}.")
    nested = [node.path for node in tree.subtree if node.depth > 1]
    if nested:
        raise FitFileError(f"the {kind} fit has unexpected nested group(s) {nested[:5]}.")
    attrs = {}
    for name, form in schema.items():
        if name not in tree.attrs:
            if name in _OPTIONAL_ATTRS:
                continue
            raise FitFileError(f"the {kind} fit lacks the attribute {name!r}.")
        attrs[name] = _attribute(tree.attrs[name], name, form)
    if kind == "gpsvm":
        _check_gp_meta(attrs["vbsvm_gp_meta"])
    else:
        if attrs["method"] != attrs["settings"].get("method"):
            raise FitFileError(f"the attribute 'method' ({_short(repr(attrs['method']), 40)}) disagrees with the "
                               f"settings ({_short(repr(attrs['settings'].get('method')), 40)}).")
        check_settings(attrs["settings"])
        _check_layout(attrs["layout"])
        _check_columns(tree["constant_data"])
    for group in ("vbsvm", "vbsvm_state"):
        if group in tree.children:
            _check_numeric(tree[group], group)
    return kind


def _attribute(value, name, form):
    if not isinstance(value, str):
        raise FitFileError(f"the attribute {name!r} must be text, found {type(value).__name__}.")
    if len(value) > MAX_ATTRIBUTE_CHARS:
        raise FitFileError(f"the attribute {name!r} has {len(value)} characters (at most {MAX_ATTRIBUTE_CHARS}).")
    if form == "text":
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise FitFileError(f"the attribute {name!r} is not valid JSON ({type(exc).__name__}).") from None
    if not isinstance(parsed, dict):
        raise FitFileError(f"the attribute {name!r} must be a JSON object, found {type(parsed).__name__}.")
    return parsed


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


def _check_layout(layout):
    def names(v):
        return isinstance(v, list) and all(isinstance(s, str) for s in v)

    groups = layout.get("groups")
    columns = layout.get("re_columns", {})
    ok = (names(layout.get("fixed")) and names(layout.get("variances")) and _is_int(layout.get("n_dense"))
          and (layout.get("sparse_group") is None or layout.get("sparse_group") in (groups or {}))
          and isinstance(groups, dict) and isinstance(columns, dict)
          and all(names(c) and c for c in columns.values()) and names(layout.get("covariances", []))
          and all(isinstance(g, list) and len(g) == 2 and isinstance(g[0], list) and isinstance(g[1], list)
                  and len(g[0]) * len(columns.get(k, ["Intercept"])) == len(g[1])
                  and all(_is_int(i) for i in g[1]) for k, g in groups.items()))
    if not ok:
        raise FitFileError("the attribute 'layout' does not describe the coefficients (fixed, groups, n_dense, "
                           "sparse_group, variances).")


def _check_columns(ds):
    for name, var in ds.data_vars.items():
        kind = var.attrs.get("dtype", "float64")
        if not isinstance(kind, str) or not _COLUMN_DTYPE.fullmatch(kind):
            raise FitFileError(f"the stored data column {name!r} has an unknown dtype {_short(repr(kind), 40)}.")
        if var.ndim != 1:
            raise FitFileError(f"the stored data column {name!r} has {var.ndim} dimensions instead of 1.")
        if kind == "category":
            try:
                cats = json.loads(var.attrs.get("categories"))
            except (TypeError, ValueError, RecursionError):
                cats = None
            if not isinstance(cats, list) or not all(isinstance(c, (str, int, float, bool)) for c in cats):
                raise FitFileError(f"the categories of the stored data column {name!r} are not a JSON list of values.")


def _check_numeric(ds, group):
    for name, var in ds.data_vars.items():
        if var.dtype.kind not in "biuf":
            raise FitFileError(f"the variable {name!r} of group {group!r} is not numeric (dtype {var.dtype}).")


def check_loaded(fit):
    """Use a freshly loaded fit once (coefficients, a prediction), so that a file whose arrays do
    not fit together fails in :func:`vbsvm.load` rather than later.

    Call it inside :func:`refusing`: whatever fails here is turned into :class:`FitFileError`.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(fit, "layout"):  # the linear fits
            fit.coef_table()
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
    if meta["formula"] is not None:
        check_formula(meta["formula"], what="the stored formula")
