"""A :class:`~vbsvm.formula.design.Design` without its rows, as plain JSON data.

Fits that do not keep their training rows (GP fits, which may stream their data) still need the
design to turn new data frames into model matrices after :func:`vbsvm.load`: the formula, the
response levels, the standardization, the grouping levels, the dtypes of the raw columns and the
state formulaic learned from the data (categorical levels, the centre/scale of ``center()``, the
knots of ``bs()``, ...). All of it is numbers, strings and lists, so it is stored as JSON and
rebuilt without unpickling or evaluating anything:

* the formula is checked by :func:`vbsvm.formula.safety.check_formula` before formulaic parses it;
* formulaic's ``transform_state`` (nested dicts, possibly with integer keys, numbers, lists,
  numeric arrays) is stored with a small tagged encoding (:func:`to_data` / :func:`from_data`)
  that can only produce those types;
* of formulaic's ``encoder_state`` the factor kind and the categorical levels are stored; the
  contrast matrices are recomputed from the formula and the levels.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from formulaic import ModelSpec
from formulaic.parser.types import Factor

from vbsvm.exceptions import FitFileError
from vbsvm.formula.design import MISSING_ACTIONS, Design, GroupingFactor, PlainSpec, quote_name
from vbsvm.formula.safety import check_formula

__all__ = ["design_to_data", "design_from_data", "design_to_text", "design_from_text", "to_data", "from_data",
           "storable_columns", "column_name", "COLUMN_NAME_ATTR"]

_SCALARS = (str, int, float, bool, type(None))
_RAW_KINDS = ("float64", "int64", "bool", "str", "category")


# ===================================================================== tagged JSON values
def to_data(value):
    """``value`` (dicts, lists, tuples, numbers, strings, numeric arrays) as JSON-able data.

    Dicts become ``{"map": [[key, value], ...]}`` (keys need not be strings), tuples
    ``{"tuple": [...]}``, arrays ``{"array": [...], "dtype": "<f8"}``, numpy scalars Python
    scalars; lists stay lists.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict):
        return {"map": [[to_data(k), to_data(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [to_data(v) for v in value]}
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"array": value.tolist(), "dtype": value.dtype.str}
    raise TypeError(f"cannot store a {type(value).__name__} in a fit file")


def from_data(data):
    """Inverse of :func:`to_data`; anything but its tags raises :class:`FitFileError`."""
    if isinstance(data, _SCALARS):
        return data
    if isinstance(data, list):
        return [from_data(v) for v in data]
    if isinstance(data, dict) and set(data) == {"map"} and isinstance(data["map"], list):
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in data["map"]):
            raise FitFileError("a stored mapping is not a list of [key, value] pairs.")
        return {_hashable(from_data(k)): from_data(v) for k, v in data["map"]}
    if isinstance(data, dict) and set(data) == {"tuple"} and isinstance(data["tuple"], list):
        return tuple(from_data(v) for v in data["tuple"])
    if isinstance(data, dict) and set(data) == {"array", "dtype"} and isinstance(data["dtype"], str):
        try:
            dtype = np.dtype(data["dtype"])
            if dtype.kind not in "biuf":
                raise TypeError(dtype.kind)
            return np.asarray(data["array"], dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise FitFileError(f"a stored array is not numeric ({type(exc).__name__}: {exc}).") from None
    raise FitFileError(f"the saved design holds a value vbsvm does not store: {str(data)[:80]!r}.")


def _hashable(key):
    if isinstance(key, list):
        raise FitFileError("a stored mapping has a list as a key.")
    return key


# ===================================================================== the design
def design_to_data(design) -> dict:
    """The design without its rows, as a JSON-able dict (see the module docstring)."""

    spec = design.spec
    if isinstance(spec, PlainSpec):
        spec_data = {"plain": {"columns": list(spec.columns), "intercept": bool(spec.intercept)}}
    else:
        spec_data = {"formulaic": {
            "formula": _rhs_text(spec.formula),
            "ensure_full_rank": bool(spec.ensure_full_rank),
            "transform_state": to_data(spec.transform_state),
            "encoder_state": [[key, kind.value, to_data({k: v for k, v in state.items() if k != "contrasts"})]
                              for key, (kind, state) in spec.encoder_state.items()],
        }}
    return {
        "formula": design.formula, "response": design.response,
        "negative_level": to_data(design.negative_level), "positive_level": to_data(design.positive_level),
        "column_names": list(design.column_names), "has_intercept": bool(design.has_intercept),
        "center": design.center.tolist(), "scale": design.scale.tolist(),
        "groups": [{"name": g.name, "levels": [to_data(v) for v in g.levels]} for g in design.groups],
        "n_dropped": int(design.n_dropped), "standardize": bool(design.standardize), "missing": design.missing,
        "raw": [_raw_column(design.raw[c]) | {"name": str(c)} for c in design.raw.columns],
        "spec": spec_data,
    }


def _rhs_text(formula):
    """Formula text of formulaic's parsed right-hand side, with names quoted where needed."""

    def factor(f):
        return quote_name(f.expr) if f.eval_method == Factor.EvalMethod.LOOKUP else f.expr

    terms = [":".join(factor(f) for f in term.factors) for term in formula]
    return " + ".join(terms if "1" in terms else ["0"] + terms)


def _raw_column(col):
    if isinstance(col.dtype, pd.CategoricalDtype):
        return {"dtype": "category", "categories": [to_data(v) for v in col.cat.categories]}
    if pd.api.types.is_bool_dtype(col):
        return {"dtype": "bool"}
    if pd.api.types.is_integer_dtype(col):
        return {"dtype": "int64"}
    if pd.api.types.is_numeric_dtype(col):
        return {"dtype": "float64"}
    return {"dtype": "str"}


def design_from_data(data: dict):
    """Inverse of :func:`design_to_data`: checks every field and the formula, evaluates nothing.

    Raises
    ------
    vbsvm.exceptions.FitFileError
        If a field is missing or of the wrong type, or the formula is outside the whitelist.
    """

    try:
        names = _strings(data["column_names"], "column_names")
        p = len(names)
        center = _floats(data["center"], p, "center")
        scale = _floats(data["scale"], p, "scale")
        formula = data["formula"]
        if not isinstance(formula, str) or not isinstance(data["response"], str):
            raise FitFileError("the saved design's formula and response must be text.")
        check_formula(formula, what="the stored formula")
        if data["missing"] not in MISSING_ACTIONS or not all(
                isinstance(data[k], bool) for k in ("has_intercept", "standardize")):
            raise FitFileError("the saved design's missing/has_intercept/standardize fields are invalid.")
        groups = [GroupingFactor(g["name"], np.array(from_data(g["levels"]), dtype=object), np.zeros(0, np.int64))
                  for g in data["groups"]]
        raw = _empty_frame(data["raw"])
        spec = _spec_from_data(data["spec"], PlainSpec)
    except (KeyError, TypeError, AttributeError) as exc:
        raise FitFileError(f"the saved design is incomplete ({type(exc).__name__}: {exc}).") from None
    if not all(isinstance(g.name, str) for g in groups):
        raise FitFileError("the saved design's grouping factors must have text names.")
    return Design(formula=formula, response=data["response"], negative_level=from_data(data["negative_level"]),
                  positive_level=from_data(data["positive_level"]), y=np.zeros(0), X=np.zeros((0, p)),
                  column_names=names, has_intercept=data["has_intercept"], center=center, scale=scale,
                  groups=groups, row_labels=raw.index, n_dropped=int(data["n_dropped"]),
                  missing_mask=np.zeros((0, p), bool), raw=raw, standardize=data["standardize"],
                  missing=data["missing"], spec=spec)


def _strings(values, what):
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise FitFileError(f"the saved design's {what} must be a list of text.")
    return list(values)


def _floats(values, size, what):
    arr = np.asarray(values, dtype=float) if isinstance(values, list) else None
    if arr is None or arr.shape != (size,) or not np.isfinite(arr).all():
        raise FitFileError(f"the saved design's {what} must be {size} finite numbers.")
    return arr


def _empty_frame(columns):
    cols = {}
    for c in columns:
        kind = c["dtype"]
        if kind not in _RAW_KINDS or not isinstance(c["name"], str):
            raise FitFileError(f"the saved design has a raw column of unknown dtype {str(kind)[:40]!r}.")
        if kind == "category":
            cols[c["name"]] = pd.Categorical([], categories=from_data(c["categories"]))
        else:
            cols[c["name"]] = pd.Series([], dtype=object if kind == "str" else kind)
    return pd.DataFrame(cols)


def _spec_from_data(data, plain_spec):
    if set(data) == {"plain"}:
        d = data["plain"]
        if not isinstance(d["intercept"], bool):
            raise FitFileError("the saved design's 'intercept' must be true or false.")
        return plain_spec(_strings(d["columns"], "plain columns"), d["intercept"])
    d = data["formulaic"]
    rhs = d["formula"]
    if not isinstance(rhs, str):
        raise FitFileError("the saved design's model formula must be text.")
    check_formula(f"y ~ {rhs}", what="the stored model formula")
    encoder_state = {}
    for key, kind, state in d["encoder_state"]:
        state = from_data(state)
        if not isinstance(key, str) or not isinstance(state, dict):
            raise FitFileError("the saved design's encoder state is invalid.")
        try:
            encoder_state[key] = (Factor.Kind(kind), state)
        except ValueError:
            raise FitFileError(f"the saved design has an unknown factor kind {str(kind)[:40]!r}.") from None
    transform_state = from_data(d["transform_state"])
    if not isinstance(transform_state, dict) or not isinstance(d["ensure_full_rank"], bool):
        raise FitFileError("the saved design's transform state is invalid.")
    return ModelSpec(formula=rhs, materializer="pandas", ensure_full_rank=d["ensure_full_rank"],
                     na_action="ignore", output="pandas", transform_state=transform_state,
                     encoder_state=encoder_state)


def design_to_text(design) -> str:
    """The design without its training rows (formula, levels, standardization, formulaic's state),
    as JSON text (:func:`design_to_data`).

    Used by fits that do not keep their data (e.g. streamed GP fits) to rebuild
    :meth:`~vbsvm.formula.design.Design.new_X` after :func:`vbsvm.load`.
    """
    return json.dumps(design_to_data(design))


def design_from_text(text: str):
    """Inverse of :func:`design_to_text` (:func:`design_from_data` of a JSON string): plain data,
    the formula checked, nothing evaluated or unpickled."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise FitFileError(f"the saved design is not JSON ({type(exc).__name__}); files from vbsvm versions "
                           "that stored it as a pickle are no longer read (unpickling can run code): refit "
                           "the model and save it again.") from None
    if not isinstance(data, dict):
        raise FitFileError("the saved design is not a JSON object.")
    return design_from_data(data)



# ===================================================================== data column names in a fit file
#: Attribute that holds a data column's own name where the fit file stores it under another one.
COLUMN_NAME_ATTR = "column"


def storable_columns(variables: dict) -> dict:
    """``variables`` (``{column name: (dims, values, attrs)}``) with names a fit file can hold.

    xarray's DataTree refuses variable names with ``/`` (a path separator there); such a column is
    stored under ``/`` -> ``_`` (made unique) and its own name goes into the attribute
    :data:`COLUMN_NAME_ATTR`, which :func:`column_name` reads back. Other names are kept.
    """
    taken = {name for name in variables if "/" not in name}
    out = {}
    for name, (dims, values, attrs) in variables.items():
        if "/" in name:
            key = name.replace("/", "_")
            while key in taken:
                key += "_"
            taken.add(key)
            out[key] = (dims, values, {**attrs, COLUMN_NAME_ATTR: name})
        else:
            out[name] = (dims, values, attrs)
    return out


def column_name(key: str, attrs) -> str:
    """The data column's name of the fit-file variable ``key`` (see :func:`storable_columns`)."""
    name = attrs.get(COLUMN_NAME_ATTR, key)
    if not isinstance(name, str):
        raise FitFileError(f"the stored data column {key!r} has a name attribute that is not text.")
    return name
