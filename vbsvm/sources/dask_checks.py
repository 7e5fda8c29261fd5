"""Checks of the partitions of a Dask DataFrame against its metadata, with errors that name the column.

Dask trusts a frame's ``meta`` (the dtypes it announces) and checks each partition against it only
in some constructors (``from_delayed``, ``read_csv``), where a mismatch raises a ``ValueError``
holding a table of the columns. A partition whose column holds text where the meta says numbers
(one stray string in one CSV file) would otherwise surface as an unrelated error deep in a fit.
:func:`check_partition` compares a partition with the meta; :func:`meta_mismatch` turns Dask's own
error into an :class:`~vbsvm.exceptions.InputError` naming the column and the fix.
"""

from __future__ import annotations

import re

import pandas as pd

from vbsvm.exceptions import InputError

__all__ = ["check_partition", "meta_mismatch"]

_ROW = re.compile(r"^\|\s*'?(?P<column>.*?)'?\s*\|\s*(?P<found>[^|]+?)\s*\|\s*(?P<expected>[^|]+?)\s*\|$")


def _kind(dtype) -> str:
    if pd.api.types.is_bool_dtype(dtype):
        return "true/false"
    if pd.api.types.is_numeric_dtype(dtype):
        return "numbers"
    return "text or categories"


def _fix(column) -> str:
    return (f"make the column's dtype the same in every partition, e.g. numbers with stray text: read it as "
            f"text (dtype={{{column!r}: 'object'}} in dd.read_csv) and convert it, data[{column!r}] = "
            f"dd.to_numeric(data[{column!r}], errors='coerce') (the stray values become missing); text: "
            f"data[{column!r}].astype(str)")


def check_partition(frame: pd.DataFrame, meta_dtypes: pd.Series, columns, index=None) -> None:
    """Raise :class:`InputError` if a column of ``frame`` holds another kind of value (numbers,
    true/false, text or categories) than the metadata ``meta_dtypes`` announces.

    Parameters
    ----------
    frame : pandas.DataFrame
        One partition.
    meta_dtypes : pandas.Series
        The Dask frame's dtypes (``data.dtypes``).
    columns : iterable of str
        The columns to check (those the formula uses).
    index : int, optional
        The partition's number, for the message.
    """
    where = "a partition" if index is None else f"partition {index}"
    for c in columns:
        if c not in frame.columns:
            raise InputError(f"{where} of data lacks the column {c!r} that the frame's metadata lists; "
                             "build the Dask frame from partitions with the same columns.")
        found, expected = frame.dtypes[c], meta_dtypes[c]
        if _kind(found) != _kind(expected):
            raise InputError(f"column {c!r} of {where} of data has dtype {found} ({_kind(found)}) where the frame's "
                             f"metadata says {expected} ({_kind(expected)}): {_fix(c)}.")


def meta_mismatch(exc: BaseException) -> InputError | None:
    """The :class:`InputError` for Dask's "Metadata mismatch" / "Mismatched dtypes" ``ValueError``
    ``exc`` (naming the columns of its table), or None for any other error."""
    text = str(exc)
    if not isinstance(exc, ValueError) or not ("Metadata mismatch" in text or "Mismatched dtypes" in text):
        return None
    rows = [m.groupdict() for m in map(_ROW.match, text.splitlines()) if m]
    rows = [r for r in rows if r["column"].strip("'") != "Column"]
    if not rows:
        return InputError(f"a partition of data does not match the frame's metadata ({text.splitlines()[0]}); make "
                          "every partition's columns and dtypes agree with data.dtypes.")
    listed = ", ".join(f"{r['column']!r} ({r['found']} found, {r['expected']} expected)" for r in rows[:5])
    return InputError(f"a partition of data has column dtype(s) that differ from the frame's metadata: {listed}; "
                      f"{_fix(rows[0]['column'])}.")
