"""From a model formula and a data frame to the matrices the models use.

The formula follows R/patsy conventions, read by :mod:`formulaic`::

    y ~ x1 + np.log(x2) + C(sex) + x1:x2 + (1 | patient_id) + (1 | centre)
    y ~ .                     # every column except the response and grouping columns
    y ~ x1 + x2 - 1           # no intercept

* The **response** must have exactly two distinct values. 0/1 and False/True map to
  -1/+1; -1/+1 stay as they are; for strings or categoricals the second level (the
  categorical order, else sorted order) is +1.
* ``(1 | g)`` terms are **random intercepts**: any number of them, each with its own
  variance. ``(x | g)`` (random slopes) is not supported and raises a clear error.
* The fixed-effect predictors are **standardized** (centered and scaled by the sample sd,
  ``ddof=1`` as R's ``scale()``) when ``standardize=True``; without an intercept they are
  only scaled, so the model is unchanged. Results are reported on the original scale via
  :meth:`Design.to_original`.
* Missing values: ``missing="drop"`` removes incomplete rows (R's ``na.omit``) and records
  how many; ``"raise"`` raises naming the columns; ``"impute"`` keeps the rows, leaving NaN in
  the affected design columns (the imputation model fills them). The missing mask is taken
  from the raw columns, because formulaic codes a missing categorical value as a level.
"""

from __future__ import annotations

import difflib
import keyword
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import formulaic
from formulaic.errors import FactorEvaluationError, FormulaicError

from .exceptions import DiagnosticWarning, FormulaError, InputError, InputTypeError

__all__ = ["Design", "GroupingFactor", "build_design", "MISSING_ACTIONS", "design_to_text", "design_from_text"]

MISSING_ACTIONS = ("drop", "raise", "impute")

_RANDOM_TERM = re.compile(r"\(\s*([^()|]*?)\s*\|\s*([^()|]+?)\s*\)")


@dataclass
class GroupingFactor:
    """A ``(1 | name)`` random-intercept term.

    Attributes
    ----------
    name : str
        The grouping column.
    levels : numpy.ndarray
        The distinct levels seen in the training data, sorted.
    codes : numpy.ndarray of int
        Level index of each training row.
    """

    name: str
    levels: np.ndarray
    codes: np.ndarray

    @property
    def n_levels(self) -> int:
        return len(self.levels)

    def encode(self, values) -> np.ndarray:
        """Codes of ``values`` in the training levels; -1 for unseen levels."""
        return np.asarray(pd.Index(self.levels).get_indexer(np.asarray(values, dtype=object)), dtype=np.int64)


@dataclass
class Design:
    """Everything a model needs from the formula and the data.

    Attributes
    ----------
    formula : str
        The formula as the user gave it.
    response : str
        Name of the response column.
    negative_level, positive_level
        The response values coded -1 and +1.
    y : numpy.ndarray
        Response coded in {-1, +1}, shape (n,).
    X : numpy.ndarray
        Fixed-effect design, standardized, Fortran-ordered, shape (n, p). Contains NaN
        only when ``missing="impute"``.
    column_names : list of str
        Names of the columns of ``X`` (formulaic's names, e.g. ``C(sex)[T.male]``).
    has_intercept : bool
    center, scale : numpy.ndarray
        Standardization of each column of ``X`` (0 and 1 for the intercept).
    groups : list of GroupingFactor
        The random-intercept terms.
    row_labels : pandas.Index
        Index labels of the rows used.
    n_dropped : int
        Rows removed for missing values (``missing="drop"``).
    missing_mask : numpy.ndarray of bool
        Shape (n, p): which entries of ``X`` are missing (all False unless ``"impute"``).
    raw : pandas.DataFrame
        The raw columns the formula uses, rows as used; kept so that a saved fit can
        rebuild this design exactly.
    """

    formula: str
    response: str
    negative_level: object
    positive_level: object
    y: np.ndarray
    X: np.ndarray
    column_names: list
    has_intercept: bool
    center: np.ndarray
    scale: np.ndarray
    groups: list
    row_labels: pd.Index
    n_dropped: int
    missing_mask: np.ndarray
    raw: pd.DataFrame
    standardize: bool
    missing: str
    spec: object = field(repr=False)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def p(self) -> int:
        return self.X.shape[1]

    @property
    def penalized(self) -> np.ndarray:
        """Boolean mask of the columns of ``X`` that are not the intercept."""
        mask = np.ones(self.p, dtype=bool)
        if self.has_intercept:
            mask[self.column_names.index("Intercept")] = False
        return mask

    def to_original(self, size: int | None = None) -> np.ndarray:
        """Matrix ``T`` with ``beta_original = T @ beta_standardized``.

        With ``x_std = (x - center) / scale`` the linear predictor is unchanged by
        ``beta_j -> beta_j / scale_j`` and ``intercept -> intercept - sum_j beta_j center_j / scale_j``.
        With ``size`` > p, T is padded with the identity (coefficients after the fixed effects,
        e.g. random intercepts, are not rescaled).
        """
        T = np.eye(self.p if size is None else size)
        T[: self.p, : self.p] = np.diag(1.0 / self.scale)
        if self.has_intercept:
            k = self.column_names.index("Intercept")
            T[k, : self.p] -= self.center / self.scale
            T[k, k] = 1.0
        return T

    def new_X(self, newdata, *, allow_missing: bool = False, standardized: bool = True):
        """Fixed-effect design for new data.

        Parameters
        ----------
        newdata : pandas.DataFrame
        allow_missing : bool
            If False, missing predictor values raise; if True, the rows are kept with NaN.
        standardized : bool
            Apply the training standardization (True) or return the original-scale columns.

        Returns
        -------
        X : numpy.ndarray, shape (len(newdata), p)
        """
        newdata = _check_frame(newdata, "newdata")
        needed = sorted(set(self.raw.columns) - {self.response} - {g.name for g in self.groups})
        absent = [c for c in needed if c not in newdata.columns]
        if absent:
            raise InputError(
                f"newdata lacks the column(s) {absent} that the formula {self.formula!r} uses; "
                "pass a frame with the same predictor columns as the training data."
            )
        for c in needed:
            if c in self.raw.columns and not pd.api.types.is_numeric_dtype(self.raw[c]):
                seen = set(pd.unique(self.raw[c].dropna()).tolist())
                unseen = sorted({v for v in pd.unique(newdata[c].dropna()).tolist() if v not in seen}, key=str)
                if unseen:
                    raise InputError(
                        f"newdata column {c!r} has level(s) {unseen[:10]} not seen in the training data "
                        f"(known: {sorted(seen, key=str)[:10]}); map them to a known level or drop those rows."
                    )
        mask = _missing_mask(newdata, needed)
        if mask.any() and not allow_missing:
            bad = [c for c in needed if newdata[c].isna().any()]
            raise InputError(
                f"newdata has missing values in column(s) {bad}; drop or fill those rows "
                "(models fitted with missing='impute' accept them)."
            )
        with warnings.catch_warnings():
            warnings.simplefilter("error", formulaic.errors.DataMismatchWarning)
            try:
                mm = self.spec.get_model_matrix(newdata, na_action="ignore")
            except formulaic.errors.DataMismatchWarning as exc:
                raise InputError(
                    f"newdata has a categorical level not seen in the training data: {exc}. "
                    "Map it to a known level or drop those rows."
                ) from None
            except FormulaicError as exc:
                raise InputError(f"could not build the design for newdata: {exc}") from None
        X = np.asarray(mm, dtype=float).copy()
        if standardized:
            X = (X - self.center) / self.scale
        return np.asfortranarray(X)

    def new_group_codes(self, newdata) -> list:
        """Codes of each grouping factor in ``newdata`` (-1 for unseen levels, with a warning)."""
        codes = []
        for g in self.groups:
            if g.name not in newdata.columns:
                raise InputError(
                    f"newdata lacks the grouping column {g.name!r}; add it, or predict at the "
                    "population level with a fit that has no (1 | group) term."
                )
            c = g.encode(newdata[g.name].to_numpy())
            if (c < 0).any():
                warnings.warn(
                    f"{int((c < 0).sum())} row(s) of newdata have a level of {g.name!r} not seen "
                    "in training; their random intercept is set to 0 (population-level prediction).",
                    DiagnosticWarning,
                    stacklevel=3,
                )
            codes.append(c)
        return codes


# --------------------------------------------------------------------------- parsing


def _check_frame(data, name: str) -> pd.DataFrame:
    if not isinstance(data, pd.DataFrame):
        raise InputTypeError(
            f"{name} must be a pandas DataFrame, got {type(data).__name__}; "
            f"wrap arrays as pandas.DataFrame(array, columns=[...])."
        )
    return data


def _quote(name: str) -> str:
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    return "`" + name.replace("`", "") + "`"


def _split_formula(formula: str):
    if not isinstance(formula, str):
        raise InputTypeError(
            f"formula must be a string such as 'y ~ x1 + x2', got {type(formula).__name__}."
        )
    if formula.count("~") != 1:
        raise FormulaError(
            f"formula {formula!r} must have exactly one '~' with the response on the left, "
            "e.g. 'y ~ x1 + x2'."
        )
    lhs, rhs = (s.strip() for s in formula.split("~"))
    if not lhs:
        raise FormulaError(f"formula {formula!r} has no response; write it as 'y ~ ...'.")
    lhs = lhs.strip("`")
    groups = []
    for slope, g in _RANDOM_TERM.findall(rhs):
        if slope.strip() != "1":
            raise FormulaError(
                f"random-effect term '({slope} | {g})' is not supported: only random intercepts "
                f"'(1 | {g})' are. Put {slope!r} among the fixed effects instead."
            )
        g = g.strip().strip("`")
        if g in groups:
            raise FormulaError(f"the grouping term (1 | {g}) appears twice in {formula!r}.")
        groups.append(g)
    # remove each '(1 | g)' together with the '+' that joins it to the rest
    fixed = re.sub(r"\s*\+\s*" + _RANDOM_TERM.pattern, "", rhs)
    fixed = re.sub(r"^\s*" + _RANDOM_TERM.pattern + r"\s*(\+\s*)?", "", fixed).strip()
    if "|" in fixed:
        raise FormulaError(
            f"could not read the random-effect part of {formula!r}; write random intercepts "
            "as '(1 | group)'."
        )
    if not fixed:
        fixed = "1"
    return lhs, fixed, groups


def _expand_dot(fixed: str, columns, response: str, groups) -> str:
    if not re.search(r"(^|[\s+*:(~-])\.($|[\s+*:)-])", fixed):
        return fixed
    others = [c for c in columns if c != response and c not in groups]
    if not others:
        raise FormulaError("'.' in the formula found no predictor columns besides the response.")
    dot = "(" + " + ".join(_quote(str(c)) for c in others) + ")"
    return re.sub(r"(?<![\w.`])\.(?![\w.`])", dot, fixed)


_NAME = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_PLAIN_SUM = re.compile(rf"^\s*(?:(1|0)\s*\+\s*)?\(?\s*({_NAME}(?:\s*\+\s*{_NAME})*)\s*\)?\s*(-\s*1|\+\s*0)?\s*$")


@dataclass
class _PlainSpec:
    """Model spec of a formula that is a plain sum of numeric columns (``y ~ x1 + x2``, ``y ~ .``)."""

    columns: list
    intercept: bool

    @property
    def column_names(self) -> list:
        return (["Intercept"] if self.intercept else []) + list(self.columns)

    def matrix(self, data: pd.DataFrame) -> np.ndarray:
        try:
            X = data[self.columns].to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError) as exc:
            raise InputError(f"predictor columns {self.columns} must be numeric ({exc}).") from None
        return np.hstack([np.ones((len(data), 1)), X]) if self.intercept else X.copy()

    def get_model_matrix(self, data, na_action=None):
        return self.matrix(data)


def _plain_numeric_columns(rhs: str, raw: pd.DataFrame):
    """``(columns, intercept)`` if ``rhs`` is a sum of distinct numeric columns, else None."""
    m = _PLAIN_SUM.match(rhs)
    if m is None or rhs.count("(") != rhs.count(")"):
        return None
    lead, body, drop = m.groups()
    cols = [t.strip().strip("`") for t in body.split("+")]
    if len(set(cols)) != len(cols) or any(c not in raw.columns for c in cols):
        return None
    dtypes = raw.dtypes  # (not raw[c]: pandas deep-copies attrs on every column access)
    if any(not pd.api.types.is_numeric_dtype(dtypes[c]) or pd.api.types.is_bool_dtype(dtypes[c]) for c in cols):
        return None
    return cols, not (lead == "0" or drop is not None)


def _missing_mask(data: pd.DataFrame, columns) -> np.ndarray:
    if not columns:
        return np.zeros(len(data), dtype=bool)
    return data[list(columns)].isna().to_numpy().any(axis=1)


def _code_response(values: pd.Series, name: str):
    if values.isna().any():
        raise InputError(
            f"the response {name!r} has {int(values.isna().sum())} missing value(s); vbsvm never "
            f"imputes the response: drop those rows first (data.dropna(subset=[{name!r}]))."
        )
    if isinstance(values.dtype, pd.CategoricalDtype):
        levels = [c for c in values.cat.categories if (values == c).any()]
    else:
        levels = sorted(pd.unique(values.to_numpy()).tolist(), key=lambda v: (str(type(v)), v))
    if len(levels) != 2:
        shown = levels[:6]
        raise InputError(
            f"the response {name!r} must have exactly two distinct values, found {len(levels)}: "
            f"{shown}{' ...' if len(levels) > 6 else ''}. Recode it to two classes "
            "(e.g. (df[col] == 'a') for one class against the rest)."
        )
    numeric = all(isinstance(v, (bool, np.bool_, int, float, np.integer, np.floating)) for v in levels)
    if numeric:
        vals = sorted(float(v) for v in levels)
        if vals not in ([0.0, 1.0], [-1.0, 1.0]):
            raise InputError(
                f"the numeric response {name!r} has values {levels}; use 0/1, -1/+1, True/False "
                "or two labels."
            )
        neg, pos = sorted(levels)
    else:
        neg, pos = levels
    y = np.where((values == pos).to_numpy(), 1.0, -1.0)
    return y, neg, pos


def build_design(formula: str, data, *, standardize: bool = True, missing: str = "drop") -> Design:
    """Build the model matrices from a formula and a data frame.

    Parameters
    ----------
    formula : str
        R-style model formula, e.g. ``"y ~ x1 + C(sex) + (1 | id)"`` or ``"y ~ ."``.
    data : pandas.DataFrame
        The data; it is never modified.
    standardize : bool, default True
        Standardize the fixed-effect columns (see module docstring).
    missing : {"drop", "raise", "impute"}, default "drop"
        What to do with rows that have missing predictor values.

    Returns
    -------
    Design
    """
    data = _check_frame(data, "data")
    if missing not in MISSING_ACTIONS:
        raise InputError(f"missing must be one of {MISSING_ACTIONS}, got {missing!r}.")
    if len(data) == 0:
        raise InputError("data has no rows; pass a non-empty DataFrame.")
    response, fixed, groups = _split_formula(formula)
    columns = [str(c) for c in data.columns]
    for name, what in [(response, "response")] + [(g, "grouping column") for g in groups]:
        if name not in columns:
            hint = difflib.get_close_matches(name, columns, n=1)
            raise FormulaError(
                f"{what} {name!r} in the formula is not a column of data"
                + (f"; did you mean {hint[0]!r}?" if hint else f"; the columns are {columns[:20]}.")
            )
    fixed = _expand_dot(fixed, columns, response, groups)
    rhs_formula = fixed
    plain = _plain_numeric_columns(rhs_formula, data)
    try:
        if plain is not None:
            needed = set(plain[0])
        else:
            needed = set(formulaic.Formula(rhs_formula).required_variables)
            # formulaic leaves out names that are also its transforms (a column called `cs`,
            # `bs`, `poly`, `center`, ...): add every column the formula mentions by name.
            text = rhs_formula.replace("`", " ")
            needed |= {c for c in columns if c != response and c not in groups
                       and re.search(rf"(?<![\w.]){re.escape(c)}(?![\w.])", text)}
        # formulaic reads `cad.dur` as the attribute of `cad`: drop such stems of dotted columns
        needed -= {v for v in needed if v not in columns and any(c.startswith(v + ".") for c in needed)}
        # keep the data's column order, so that a saved fit rebuilds 'y ~ .' identically
        needed_vars = sorted(needed, key=lambda v: (columns.index(v) if v in columns else len(columns), v))
    except FormulaicError as exc:
        raise FormulaError(f"cannot parse the formula {formula!r}: {exc}") from None
    absent = [v for v in needed_vars if v not in columns]
    if absent:
        hints = {v: difflib.get_close_matches(v, columns, n=1) for v in absent}
        detail = "; ".join(
            f"{v!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for v, h in hints.items()
        )
        shown = "" if all(hints.values()) else f" The columns are {columns[:20]}{' ...' if len(columns) > 20 else ''}."
        raise FormulaError(f"the formula uses name(s) that are not columns of data: {detail}.{shown} "
                           "Use column names (backquote names with spaces: `my var`).")
    used = [response] + [v for v in needed_vars if v != response] + groups
    used = list(dict.fromkeys(used))
    raw = data[used].copy()
    raw.attrs = {}  # pandas deep-copies attrs on every column access; formulaic makes many

    # Missing values in predictors / grouping columns.
    predictor_cols = [v for v in needed_vars if v != response]
    pred_missing = _missing_mask(raw, predictor_cols)
    group_missing = _missing_mask(raw, groups)
    if raw[response].isna().any():
        _code_response(raw[response], response)  # raises with the standard message
    n_dropped = 0
    if missing == "raise" and (pred_missing.any() or group_missing.any()):
        bad = {c: int(raw[c].isna().sum()) for c in predictor_cols + groups if raw[c].isna().any()}
        raise InputError(
            f"missing values in predictor column(s) {bad} (counts); use missing='drop' to remove "
            "incomplete rows or missing='impute' to model them."
        )
    drop = group_missing | (pred_missing if missing == "drop" else False)
    if missing == "impute" and group_missing.any():
        raise InputError(
            f"grouping column(s) {[g for g in groups if raw[g].isna().any()]} have missing values; "
            "they cannot be imputed: drop those rows first."
        )
    if drop.any():
        n_dropped = int(drop.sum())
        raw = raw.loc[~drop]
    if len(raw) == 0:
        raise InputError(
            "no complete rows remain after removing rows with missing values (missing values per "
            f"column: { {c: int(data[c].isna().sum()) for c in used if data[c].isna().any()} }); use "
            "missing='impute' to model them, or fill or drop the mostly-missing column(s)."
        )

    y, neg, pos = _code_response(raw[response], response)
    if plain is not None:
        # A sum of numeric columns: the model matrix is the columns themselves (formulaic would
        # give the same matrix, at ~1 ms per column).
        spec = _PlainSpec(*plain)
        names = spec.column_names
        X = spec.matrix(raw)
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                mm = formulaic.model_matrix(rhs_formula, raw, na_action="ignore")
        except FactorEvaluationError as exc:
            raise FormulaError(f"cannot evaluate a term of {formula!r}: {exc}") from None
        except FormulaicError as exc:
            raise FormulaError(f"cannot parse the formula {formula!r}: {exc}") from None
        spec = mm.model_spec
        names = [str(c) for c in mm.columns]
        X = np.array(mm, dtype=float)
    if not np.isfinite(X[~np.isnan(X)]).all():
        cols = [names[j] for j in range(X.shape[1]) if np.isinf(X[:, j]).any()]
        raise InputError(
            f"design column(s) {cols} contain infinite values (e.g. log of 0); transform or "
            "filter the data so that every predictor is finite."
        )
    has_intercept = "Intercept" in names
    if X.shape[1] == 0:
        raise FormulaError(
            f"the formula {formula!r} has no fixed effects and no intercept; add a predictor or "
            "keep the intercept (drop '- 1' / '+ 0')."
        )

    mask = np.isnan(X)
    # formulaic codes a missing categorical as its own level: take the mask from raw columns.
    if missing == "impute":
        for v in predictor_cols:
            if raw[v].isna().any() and not pd.api.types.is_numeric_dtype(raw[v]):
                raise InputError(
                    f"categorical predictor {v!r} has missing values; imputation of categorical "
                    "predictors is not supported: drop those rows or add an explicit 'missing' level."
                )

    center = np.zeros(X.shape[1])
    scale = np.ones(X.shape[1])
    for j, name in enumerate(names):
        if name == "Intercept":
            continue
        col = X[~mask[:, j], j]
        sd = col.std(ddof=1) if col.size > 1 else 0.0
        if not sd > 0:
            raise InputError(
                f"design column {name!r} is constant ({col[0] if col.size else 'empty'}); it "
                "carries no information and is not identified with an intercept: remove it "
                "from the formula."
            )
        if standardize:
            center[j] = col.mean() if has_intercept else 0.0
            scale[j] = sd
    X = np.asfortranarray((X - center) / scale)

    gfactors = []
    for g in groups:
        vals = raw[g].to_numpy()
        levels = np.array(sorted(pd.unique(vals).tolist(), key=lambda v: (str(type(v)), v)), dtype=object)
        factor = GroupingFactor(g, levels, np.zeros(len(raw), dtype=np.int64))
        factor.codes = factor.encode(vals)
        gfactors.append(factor)

    return Design(
        formula=formula,
        response=response,
        negative_level=neg,
        positive_level=pos,
        y=y,
        X=X,
        column_names=names,
        has_intercept=has_intercept,
        center=center,
        scale=scale,
        groups=gfactors,
        row_labels=raw.index,
        n_dropped=n_dropped,
        missing_mask=mask,
        raw=raw,
        standardize=standardize,
        missing=missing,
        spec=spec,
    )


# --------------------------------------------------------------------------- serialization


def design_to_text(design: Design) -> str:
    """The design without its training rows (formula, levels, standardization, formulaic's state),
    as JSON text (see :mod:`vbsvm.design_data`).

    Used by fits that do not keep their data (e.g. streamed GP fits) to rebuild
    :meth:`Design.new_X` after :func:`vbsvm.load`.
    """
    from .design_data import dumps

    return dumps(design)


def design_from_text(text: str) -> Design:
    """Inverse of :func:`design_to_text`: plain data, the formula checked, nothing evaluated or unpickled."""
    from .design_data import loads

    return loads(text)
