"""From a model formula and a data frame to the matrices the models use.

The formula follows R/patsy conventions, read by :mod:`formulaic`::

    y ~ x1 + np.log(x2) + C(sex) + x1:x2 + (1 | patient_id) + (1 | centre)
    y ~ .                     # every column except the response and grouping columns
    y ~ x1 + x2 - 1           # no intercept
    y ~ I(x^2) + (a + b)^2    # ^ inside a call is R's power (see vbsvm.formula.habits)

* The **response** must have exactly two distinct values. 0/1 and False/True map to
  -1/+1; -1/+1 stay as they are; for strings or categoricals the second level (the
  categorical order, else sorted order) is +1.
* Random effects in lme4 syntax, each term becoming one :class:`GroupingFactor` (lme4's
  ``reTrms`` entry: grouping codes, level labels, the term's columns ``Z``):
  ``(1 | g)`` random intercepts; ``(1 + x | g)`` (or ``(x | g)``) correlated intercepts and
  slopes; ``(0 + x | g)`` slopes alone; ``(1 + x || g)`` uncorrelated (one term per column);
  ``(1 | a:b)`` the interaction factor; ``(1 | a/b)`` nesting, i.e. ``(1 | a) + (1 | a:b)``.
  The random-effect columns enter on their original scale (as in lme4).
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

import formulaic
import numpy as np
import pandas as pd
from formulaic.errors import FactorEvaluationError, FormulaicError

from vbsvm.exceptions import DiagnosticWarning, FormulaError, InputError, InputTypeError
from vbsvm.formula.habits import R_FUNCTIONS, call_names, python_power, r_call_problem
from vbsvm.formula.safety import check_formula
from vbsvm.formula.separation import separation_certificate

__all__ = ["Design", "GroupingFactor", "build_design", "MISSING_ACTIONS",
           "MAX_FACTOR_LEVELS", "MAX_FACTOR_BYTES", "MAX_STANDARDIZED", "numbers_as_text"]

MISSING_ACTIONS = ("drop", "raise", "impute")

#: Most levels a categorical fixed-effect predictor (``C(g)`` or a text column) may have. Each level
#: is a column of the design and a fit costs about ``n p^2`` per sweep: on 2000 rows the fit time
#: grows about like the square of the levels (400 levels: ten times the fit of ``(1 | g)``), so
#: thousands of levels take hours; ``(1 | g)`` fits such a factor in seconds
#: (``benchmarks/bad_data.py``).
MAX_FACTOR_LEVELS = 1000
#: Largest block of dummy columns (rows x (levels - 1) x 8 bytes) one categorical predictor may make.
MAX_FACTOR_BYTES = 2 ** 30
#: Largest distance of a new value from the training mean, in training sds, that predictions
#: accept: beyond it the score's variance (a sum of squares of such values) would overflow float64.
MAX_STANDARDIZED = 1e100
#: Rows (at least; 20 per column) of the subset whose LP is tried first by
#: :meth:`Design.linearly_separable`: overlapping classes are found not separable on it.
SEPARATION_SUBSET = 2000
#: Largest block of columns (bytes as float64) that :meth:`PlainSpec.matrix` converts at once.
MATRIX_BLOCK_BYTES = 2 ** 20



@dataclass
class GroupingFactor:
    """A random-effect term ``(lhs | factor)``: lme4's ``reTrms`` entry for one term.

    For each level ``l`` of the grouping factor the term adds the coefficients ``b_l`` (one per
    column of ``lhs``, e.g. ``Intercept`` and ``time`` for ``(1 + time | patient)``) with
    ``b_l ~ N(0, Sigma)``; row ``i`` contributes ``z_i' b_{l(i)}`` to the score, with ``z_i`` the
    row's values of the lhs columns (1 for the intercept). The columns enter on their original
    scale, as in lme4.

    Attributes
    ----------
    name : str
        Label of the term: ``b_<name>`` and ``sigma2_<name>`` in results. The factor's name for a
        term with an intercept (``patient_id``, ``school:class``), ``<factor>_<column>`` for a term
        without one (``(0 + x | g)`` -> ``g_x``).
    levels : numpy.ndarray
        The distinct levels seen in the training data, sorted (``"a:b"`` strings for an
        interaction factor).
    codes : numpy.ndarray of int
        Level index of each training row.
    factor : tuple of str
        The grouping columns (two or more for ``a:b``).
    columns : list of str
        Names of the lhs columns (``["Intercept"]`` for a random intercept).
    lhs : str
        The lhs formula (``"1"``, ``"1 + time"``, ``"0 + x"``).
    Z : numpy.ndarray or None
        Values of the lhs columns in the training rows, shape (n, q); None means all ones.
    spec : object
        formulaic model spec of ``lhs`` (None for ``"1"``), re-applied to new data.
    """

    name: str
    levels: np.ndarray
    codes: np.ndarray
    factor: tuple = ()
    columns: list = field(default_factory=lambda: ["Intercept"])
    lhs: str = "1"
    Z: np.ndarray | None = field(default=None, repr=False)
    spec: object = field(default=None, repr=False)
    #: which columns of ``spec``'s matrix the term uses (``||`` terms split one matrix); None: all
    select: list | None = None

    @property
    def n_levels(self) -> int:
        return len(self.levels)

    @property
    def q(self) -> int:
        """Coefficients per level."""
        return len(self.columns)

    @property
    def is_intercept(self) -> bool:
        return self.columns == ["Intercept"]

    def encode(self, values) -> np.ndarray:
        """Codes of ``values`` in the training levels; -1 for unseen levels."""
        return np.asarray(pd.Index(self.levels).get_indexer(np.asarray(values, dtype=object)), dtype=np.int64)

    def level_keys(self, frame: pd.DataFrame) -> np.ndarray:
        """The level of each row of ``frame`` (``"a:b"`` strings for an interaction factor)."""
        return _level_keys(frame, list(self.factor) or [self.name])

    def values(self, frame: pd.DataFrame) -> np.ndarray:
        """The lhs columns evaluated on ``frame``, shape (len(frame), q)."""
        if self.is_intercept:
            return np.ones((len(frame), 1))
        try:
            Z = np.asarray(self.spec.get_model_matrix(frame, na_action="ignore"), dtype=float)
        except FormulaicError as exc:
            raise InputError(f"could not evaluate the random-effect term ({self.lhs} | "
                             f"{':'.join(self.factor)}) on new data: {_formulaic_text(exc)}") from None
        return Z if self.select is None else Z[:, self.select]


def _level_keys(frame: pd.DataFrame, cols: list) -> np.ndarray:
    """Level of each row of ``frame`` for the grouping columns ``cols`` (``"a:b"`` strings for
    two or more)."""
    if len(cols) == 1:
        return frame[cols[0]].to_numpy()
    return np.array([":".join(map(str, t)) for t in zip(*(frame[c].to_numpy() for c in cols))], dtype=object)

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
        Shape (n, p): which entries of ``X`` are missing (all False unless ``"impute"``; without
        a missing entry a read-only view of one False, not n x p booleans).
    raw : pandas.DataFrame
        The raw columns the formula uses, rows as used; kept so that a saved fit can
        rebuild this design exactly. Under copy-on-write it shares the data's memory until either
        is modified (see :func:`_select_columns`).
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
    #: raw columns the fixed-effect part uses (those ``new_X`` needs)
    fixed_vars: list | None = None

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

    def linearly_separable(self, max_size: int = 5_000_000, *, intercept: bool = True) -> bool | None:
        """Whether the fixed effects separate the complete rows (some ``beta`` puts every row
        beyond the margin, ``y_i x_i^T beta >= 1``: a linear-programming feasibility problem,
        settled by a certificate of either answer (:mod:`vbsvm.formula.separation`) or else solved
        by HiGHS); None when ``n * p`` exceeds ``max_size`` (not checked) or the solver cannot
        decide (numerical difficulties with both of its methods). On such data the
        hinge pseudo-likelihood is 1 on a cone of coefficients, so their size is set by the prior.

        With ``intercept=False`` the intercept is held at 0 (any fixed value gives the same answer:
        the question is whether the slopes alone separate, through the origin of the predictors as
        the design holds them, i.e. their training means when standardized)."""
        rows = np.flatnonzero(~self.missing_mask.any(axis=1))
        cols = np.arange(self.X.shape[1])
        if not intercept and self.has_intercept:
            cols = np.delete(cols, self.column_names.index("Intercept"))
        n, p = len(rows), len(cols)
        if n * p > max_size:
            return None
        if p == 0:
            return False
        # Separable data stay separable on every subset of rows, so overlap on evenly spaced rows
        # proves the whole is not separable at a fraction of the cost (and memory) of the full
        # check, which is made only when the subset is separable or undecided.
        subset = rows[np.linspace(0, n - 1, min(n, max(SEPARATION_SUBSET, 20 * p))).astype(int)]
        if len(subset) < n and self._separable_rows(subset, cols) is False:
            return False
        return self._separable_rows(rows, cols)

    def _separable_rows(self, rows, cols) -> bool | None:
        """Whether some beta gives ``y_i x_i[cols]^T beta >= 1`` on ``rows`` (None: undecided): by
        the certificate of :func:`~vbsvm.formula.separation.separation_certificate` where it finds
        one that holds by a wide margin (the LP's answer, at a fraction of its cost), else by the LP."""
        found = separation_certificate(self.y[rows, None] * self.X[np.ix_(rows, cols)])
        return found if found is not None else self._separating_lp(rows, cols)

    def _separating_lp(self, rows, cols) -> bool | None:
        """Whether some beta gives ``y_i x_i[cols]^T beta >= 1`` on ``rows`` (None: undecided)."""
        from scipy.optimize import linprog

        A, b = -(self.y[rows, None] * self.X[np.ix_(rows, cols)]), -np.ones(len(rows))
        # 0: a separating beta found; 2: infeasible (not separable); anything else (numerical
        # difficulties) is retried by the dual simplex, then left undecided (None)
        for method in ("highs-ipm", "highs-ds"):
            status = linprog(np.zeros(len(cols)), A_ub=A, b_ub=b, bounds=(None, None), method=method).status
            if status in (0, 2):
                return status == 0
        return None

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
        newdata = without_attrs(check_frame(newdata, "newdata"))
        needed = list(self.fixed_vars) if self.fixed_vars is not None else sorted(
            set(self.raw.columns) - {self.response} - {g.name for g in self.groups})
        absent = [c for c in needed if c not in newdata.columns]
        if absent:
            raise InputError(
                f"newdata lacks the column(s) {absent} that the formula {self.formula!r} uses; "
                "pass a frame with the same predictor columns as the training data."
            )
        _check_unique_columns(newdata, needed, "newdata")
        _check_column_types(newdata, needed, "newdata")
        categorical = set(categorical_calls(self.formula))
        numeric = set(_columns_where(self.raw, [c for c in needed if c in self.raw.columns],
                                     pd.api.types.is_numeric_dtype))
        for c in needed:
            if c in self.raw.columns and (c in categorical or c not in numeric):
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
            except formulaic.errors.DataMismatchWarning:
                raise InputError(
                    "newdata has a value of a categorical term of the formula "
                    f"{self.formula!r} not seen in the training data; map it to a known level or drop "
                    "those rows."
                ) from None
            except FormulaicError as exc:
                raise InputError(f"could not build the design for newdata: {_formulaic_text(exc)}") from None
        # one copy of the rows, in Fortran order, then checked and standardized in place (a plain
        # spec's matrix is already a new array of its own; formulaic's frame may share newdata's columns)
        X = np.asarray(mm, dtype=float, order="F") if isinstance(self.spec, PlainSpec) else \
            np.array(mm, dtype=float, order="F")
        del mm
        infinite = [j for j in range(X.shape[1]) if np.isinf(X[:, j]).any()]
        if infinite:
            rows = np.logical_or.reduce([np.isinf(X[:, j]) for j in infinite])
            raise InputError(
                f"newdata gives infinite values in design column(s) {[self.column_names[j] for j in infinite]} "
                f"(in {int(rows.sum())} row(s)); the model has no score there: replace "
                "them (e.g. by NaN, to get NaN predictions for those rows) or drop those rows."
            )
        self._check_extrapolation(X)
        if standardized:
            X -= self.center
            X /= self.scale
        return X

    def _check_extrapolation(self, X):
        """Refuse new values more than :data:`MAX_STANDARDIZED` training sds from the training
        mean (the standardized scale; without standardization the value itself), by blocks of
        columns of at most :data:`MATRIX_BLOCK_BYTES` (no n x p copy): the variance of their
        scores, a sum of squares, would overflow."""
        if not len(X):
            return
        width = max(1, MATRIX_BLOCK_BYTES // (8 * len(X)))
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, X.shape[1], width):
                cols = slice(start, start + width)
                far = np.abs(X[:, cols] - self.center[cols]) > MAX_STANDARDIZED * self.scale[cols]
                if far.any():
                    self._refuse_extrapolation(X, start + int(np.flatnonzero(far.any(axis=0))[0]))

    def _refuse_extrapolation(self, X, j):
        """Raise the InputError of :meth:`_check_extrapolation` for column ``j`` of ``X``."""
        with np.errstate(over="ignore", invalid="ignore"):
            rows = np.flatnonzero(np.abs(X[:, j] - self.center[j]) > MAX_STANDARDIZED * self.scale[j])
        where = (f"training sds ({self.scale[j]:.3g}) from the training mean ({self.center[j]:.3g})"
                 if self.standardize else "in absolute value")
        raise InputError(
            f"newdata gives design column {self.column_names[j]!r} value(s) such as {X[rows[0], j]:.3g} (in "
            f"{rows.size} row(s), the first at position {rows[0]}), more than {MAX_STANDARDIZED:.0e} "
            f"{where}: the variance of the model's score there overflows float64, so its "
            "predictions would be meaningless; check the column's units, or drop those rows "
            "(or set them to NaN).")

    def incomplete_rows(self, newdata: pd.DataFrame, *, imputable: bool = False) -> np.ndarray:
        """Which rows of ``newdata`` miss a value the model needs: in any column the formula uses
        besides the response (grouping columns included). With ``imputable`` (fits with
        ``missing="impute"``) missing values of numeric fixed-effect columns do not count."""
        imputed = set(_columns_where(self.raw, self.fixed_vars or (), pd.api.types.is_numeric_dtype)
                      if imputable else ())
        columns = [c for c in self.raw.columns.tolist() if c != self.response and c in newdata.columns
                   and c not in imputed]
        return _missing_mask(newdata, columns)

    def new_random_effects(self, newdata, new_levels="zero") -> list:
        """``(codes, Z)`` of each random-effect term in ``newdata``: level codes (-1 for levels
        not seen in training) and the term's column values, shape (n, q).

        ``new_levels``: what a level not seen in training means — ``"zero"`` (random effect 0,
        with a warning), ``"integrate"`` (the caller averages over the group's distribution; no
        warning) or ``"error"`` (:class:`~vbsvm.exceptions.InputError`)."""
        out = []
        for g in self.groups:
            absent = [c for c in (list(g.factor) or [g.name]) if c not in newdata.columns]
            if absent:
                raise InputError(
                    f"newdata lacks the grouping column(s) {absent} of the term ({g.lhs} | "
                    f"{':'.join(g.factor) or g.name}); add them, or predict at the population level "
                    "with a fit that has no random effects."
                )
            c = g.encode(g.level_keys(newdata))
            if (c < 0).any() and new_levels == "error":
                unseen = pd.unique(np.asarray(g.level_keys(newdata), dtype=object)[c < 0]).tolist()
                raise InputError(
                    f"newdata has level(s) {unseen[:5]} of {g.name!r} not seen in training; pass "
                    "new_levels='integrate' (average over the group's distribution, like brms' "
                    "sample_new_levels) or new_levels='zero' (lme4's re.form=NA for those rows), or drop them."
                )
            if (c < 0).any() and new_levels == "zero":
                warnings.warn(
                    f"{int((c < 0).sum())} row(s) of newdata have a level of {g.name!r} not seen "
                    "in training; their random effect is set to 0 (population-level prediction).",
                    DiagnosticWarning,
                    stacklevel=3,
                )
            out.append((c, g.values(newdata)))
        return out


# --------------------------------------------------------------------------- parsing


def check_frame(data, name: str) -> pd.DataFrame:
    if not isinstance(data, pd.DataFrame):
        package = (type(data).__module__ or "").split(".")[0]
        got = type(data).__name__ if package in ("", "builtins") else f"{package}.{type(data).__name__}"
        if package in ("polars", "pyarrow", "cudf", "modin") or hasattr(data, "to_pandas"):
            fix = f"convert it with {name}.to_pandas()"
        else:
            fix = "wrap arrays as pandas.DataFrame(array, columns=[...])"
        raise InputTypeError(f"{name} must be a pandas DataFrame, got {got}; {fix}.")
    return data


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _formulaic_text(exc) -> str:
    """formulaic's message on one line, without the copy of the formula it marks with terminal
    colour codes."""
    return " ".join(_ANSI.sub("", str(exc).split("\n\n")[0]).split())


def _spaced_names_hint(text: str, columns) -> str:
    """A hint for column names that need backquotes and appear bare in the formula ``text``."""
    bare = [c for c in map(str, columns) if quote_name(c) != c and c in text and f"`{c}`" not in text]
    return (f" Backquote column names that are not Python names: {', '.join(quote_name(c) for c in bare)}."
            if bare else "")


def quote_name(name: str) -> str:
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    return "`" + name.replace("`", "") + "`"


def _top_level_groups(text: str):
    """Spans ``(start, end)`` of the parenthesised groups of ``text`` at depth 0."""
    spans, depth, start = [], 0, None
    for i, ch in enumerate(text):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
            if depth == 0:
                spans.append((start, i + 1))
    if depth:
        raise FormulaError(f"the formula has unbalanced parentheses in {text!r}; close every '(' "
                           "with a ')'.")
    return spans


def _bar_position(inner: str):
    """Index and width (1 for ``|``, 2 for ``||``) of the top-level bar in ``inner``, or None."""
    depth = 0
    for i, ch in enumerate(inner):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "|" and depth == 0:
            return i, 2 if inner[i + 1: i + 2] == "|" else 1
    return None


def _factor_names(expr: str, term: str) -> list:
    """Grouping factors of a random-effect term: ``g`` -> [(g,)], ``a:b`` -> [(a, b)],
    nesting ``a/b`` -> [(a,), (a, b)] (lme4's ``a/b = a + a:b``)."""
    factors = []
    parts = [p.strip() for p in expr.split("/")]
    prefix = ()
    for part in parts:
        cols = tuple(c.strip().strip("`") for c in part.split(":"))
        if not all(cols) or any(re.search(r"[()+*~|]", c) for c in cols):
            raise FormulaError(
                f"the grouping part of the random-effect term {term!r} must be a column name, "
                "an interaction 'a:b' or a nesting 'a/b'.")
        prefix = prefix + cols
        factors.append(prefix)
    return factors


def _split_formula(formula: str):
    """``(response, fixed part, random terms)``; each random term is ``(lhs, factor, term text)``
    with ``factor`` a tuple of grouping columns, after expanding ``a/b`` and ``||``."""
    if not isinstance(formula, str):
        raise InputTypeError(
            f"formula must be a string such as 'y ~ x1 + x2', got {type(formula).__name__}."
        )
    if formula.count("~") != 1:
        raise FormulaError(
            f"formula {formula!r} must have exactly one '~' with the response on the left, "
            "e.g. 'y ~ x1 + x2'."
        )
    # R's I(x^2) is the square, not Python's exclusive or
    lhs, rhs = (s.strip() for s in python_power(formula).split("~"))
    if not lhs:
        raise FormulaError(f"formula {formula!r} has no response; write it as 'y ~ ...'.")
    lhs = lhs.strip("`")
    terms, spans = [], []
    for a, b in _top_level_groups(rhs):
        inner = rhs[a + 1: b - 1]
        bar = _bar_position(inner)
        if bar is None:
            continue
        at, width = bar
        re_lhs, expr = inner[:at].strip(), inner[at + width:].strip()
        text = f"({re_lhs} {'|' * width} {expr})"
        if not re_lhs or not expr:
            raise FormulaError(f"random-effect term {text!r} needs both sides of the bar, e.g. (1 | g).")
        # lme4's double bar: one uncorrelated term per column
        terms.extend((re_lhs, factor, text, width == 2) for factor in _factor_names(expr, text))
        # remove the term with the '+' that joins it to the rest
        before, after = rhs[:a].rstrip(), rhs[b:].lstrip()
        if before.endswith("+"):
            a = len(before) - 1
        elif after.startswith("+"):
            b = len(rhs) - len(after) + 1
        spans.append((a, b))
    fixed = rhs
    for a, b in reversed(spans):
        fixed = fixed[:a] + " " + fixed[b:]
    fixed = fixed.strip()
    if "|" in fixed:
        raise FormulaError(
            f"could not read the random-effect part of {formula!r}; write random effects as "
            "'(1 | group)', '(1 + x | group)' or '(0 + x | group)'."
        )
    if not fixed:
        fixed = "1"
    return lhs, fixed, terms


_QUOTED = re.compile(r"(`[^`]*`|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_LONE_DOT = re.compile(r"(?<![\w.`])\.(?![\w.`])")


def _expand_dot(fixed: str, columns, response: str, groups) -> str:
    """``fixed`` with each lone ``.`` (outside backquoted names and strings) replaced by the sum of
    the other columns. The names are inserted as plain text, never as a regular-expression
    replacement (a name such as ``a\\b`` or ``a\\g<0>`` stays what it is)."""
    pieces = _QUOTED.split(fixed)  # odd positions: the quoted pieces, kept as they are
    if not any(_LONE_DOT.search(p) for p in pieces[::2]):
        return fixed
    others = [c for c in columns if c != response and c not in groups]
    if not others:
        raise FormulaError("'.' in the formula found no predictor columns besides the response.")
    dot = "(" + " + ".join(quote_name(str(c)) for c in others) + ")"
    return "".join(p if k % 2 else _LONE_DOT.sub(lambda _: dot, p) for k, p in enumerate(pieces))


_NAME = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_PLAIN_SUM = re.compile(rf"^\s*(?:(1|0)\s*\+\s*)?\(?\s*({_NAME}(?:\s*\+\s*{_NAME})*)\s*\)?\s*(-\s*1|\+\s*0)?\s*$")


@dataclass
class PlainSpec:
    """Model spec of a formula that is a plain sum of numeric columns (``y ~ x1 + x2``, ``y ~ .``)."""

    columns: list
    intercept: bool

    @property
    def column_names(self) -> list:
        return (["Intercept"] if self.intercept else []) + list(self.columns)

    def matrix(self, data: pd.DataFrame) -> np.ndarray:
        """The model matrix, Fortran-ordered, filled by blocks of columns of at most
        :data:`MATRIX_BLOCK_BYTES` (no whole-frame copy)."""
        k = int(self.intercept)
        X = np.empty((len(data), k + len(self.columns)), order="F")
        if k:
            X[:, 0] = 1.0
        width = max(1, MATRIX_BLOCK_BYTES // (8 * max(len(data), 1)))
        for j in range(0, len(self.columns), width):
            block = self.columns[j:j + width]
            try:
                X[:, k + j:k + j + len(block)] = _take_columns(data, block).to_numpy(dtype=float, na_value=np.nan)
            except (TypeError, ValueError):
                self._refuse(data, block)
        return X

    def _refuse(self, data: pd.DataFrame, block) -> None:
        """Raise an InputError naming why the first column of ``block`` that is not numeric is not."""
        for c in block:
            try:
                data[c].to_numpy(dtype=float, na_value=np.nan)
            except (TypeError, ValueError) as exc:
                raise InputError(f"predictor columns {self.columns} must be numeric ({exc}).") from None
        raise InputError(f"predictor columns {self.columns} must be numeric.")

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
    if _columns_where(raw, cols, lambda dt: not pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)):
        return None
    return cols, not (lead == "0" or drop is not None)


def categorical_calls(formula: str) -> list:
    """Columns the formula marks as categorical with ``C(column ...)``."""
    return [m.strip("`") for m in re.findall(r"(?<![\w.])C\(\s*(`[^`]+`|[A-Za-z_][\w.]*)", formula)]


def _select_columns(data: pd.DataFrame, columns) -> pd.DataFrame:
    """The ``columns`` of ``data``, in that order, independent of ``data`` from here on.

    With copy-on-write (pandas >= 3, or enabled in pandas 2) the selection shares the data's
    memory until either side is modified, when pandas copies what changes: so the design's model
    matrix is the only n x p copy of the data. Columns in the data's order are taken at once
    (views of its blocks); in another order the frame is made of the column Series, not
    consolidated (``data[columns]`` copies a consolidated block to reorder its columns). Without
    copy-on-write the columns are copied."""
    cow = int(pd.__version__.split(".")[0]) >= 3 or pd.get_option("mode.copy_on_write") is True
    if cow and data.columns.is_unique and not all(np.diff([data.columns.get_loc(c) for c in columns]) > 0):
        return pd.DataFrame({c: data[c] for c in columns}, copy=False)
    return _take_columns(data, columns)


def _take_columns(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """``frame[list(columns)]``, the columns looked up one by one in the frame's own index when
    they are unique (an index built of the names, as ``frame[list]`` does, costs far more)."""
    if not frame.columns.is_unique:
        return frame[list(columns)]
    return frame.take([frame.columns.get_loc(c) for c in columns], axis=1)


def without_attrs(data: pd.DataFrame) -> pd.DataFrame:
    """``data``, or a shallow copy of it without its ``attrs`` if it has any (pandas deep-copies a
    frame's ``attrs`` into every frame or column taken from it); ``data`` itself is untouched and
    the copy shares its columns."""
    return pd.DataFrame(data, copy=False) if data.attrs else data


def _columns_where(frame: pd.DataFrame, columns, test) -> list:
    """The ``columns`` of ``frame`` (each a name it has once) whose dtype passes ``test``, which is
    called once per distinct dtype object (not per column)."""
    dtypes = dict(zip(frame.columns.tolist(), frame.dtypes.tolist()))  # (not an iteration of the index)
    passed = {id(dt): bool(test(dt)) for dt in {id(dt): dt for dt in map(dtypes.get, columns)}.values()}
    return [c for c in columns if passed[id(dtypes[c])]]


def _check_column_types(frame: pd.DataFrame, columns, name: str = "data") -> None:
    """Dates, durations and complex numbers are not predictors as they stand: say which columns
    and how to convert them."""
    bad = _columns_where(frame, columns, lambda dt: pd.api.types.is_datetime64_any_dtype(dt)
                         or pd.api.types.is_timedelta64_dtype(dt) or isinstance(dt, pd.PeriodDtype))
    if bad:
        raise InputTypeError(
            f"column(s) {bad} hold dates or durations, which are not numeric predictors; convert them "
            f"first, e.g. data[{bad[0]!r}] = (data[{bad[0]!r}] - data[{bad[0]!r}].min()).dt.days (days "
            "since the first date), or extract a part such as .dt.year.")
    # complex numbers: numpy's cast to float would drop the imaginary part (with a mere warning)
    bad = _columns_where(frame, columns, pd.api.types.is_complex_dtype)
    if bad:
        raise InputTypeError(
            f"{name} column(s) {bad} hold complex numbers; the model's predictors are real, and casting "
            "would silently drop the imaginary part: pass the parts you mean as real columns, e.g. "
            f"{name}.assign(re={name}[{bad[0]!r}].to_numpy().real, im={name}[{bad[0]!r}].to_numpy().imag) "
            f"(or np.abs for the modulus), and use those in the formula.")


def _check_unique_columns(frame: pd.DataFrame, columns, name: str = "data") -> None:
    """Refuse ``columns`` that name more than one column of ``frame``."""
    if frame.columns.is_unique:
        return
    counts = pd.Series(frame.columns.astype(str)).value_counts()
    dups = [c for c in dict.fromkeys(map(str, columns)) if counts.get(c, 0) > 1]
    if dups:
        raise InputError(
            f"{name} has {int(counts[dups[0]])} columns named {dups[0]!r}"
            + (f" (and duplicates of {dups[1:6]})" if len(dups) > 1 else "")
            + "; the formula cannot tell them apart: rename them (e.g. "
            f"{name}.columns = [...]) or drop the copies ({name}.loc[:, ~{name}.columns.duplicated()]).")


def _check_factor_sizes(raw: pd.DataFrame, columns, formula: str) -> None:
    """Refuse a categorical fixed-effect predictor with more than :data:`MAX_FACTOR_LEVELS` levels,
    or whose dummy columns would take more than :data:`MAX_FACTOR_BYTES`, before formulaic
    builds them: such a design is slow to build and very slow to fit (see
    :data:`MAX_FACTOR_LEVELS`), and a random intercept models the factor at a fraction of the cost."""
    categorical = set(categorical_calls(formula))
    numeric = set(_columns_where(raw, columns, lambda dt: pd.api.types.is_numeric_dtype(dt)
                                 or pd.api.types.is_bool_dtype(dt)))
    for c in columns:
        if c not in categorical and c in numeric:
            continue
        k = int(raw[c].nunique(dropna=True))
        size = len(raw) * max(k - 1, 0) * 8
        if k > MAX_FACTOR_LEVELS or size > MAX_FACTOR_BYTES:
            why = (f"more than the {MAX_FACTOR_LEVELS} levels" if k > MAX_FACTOR_LEVELS
                   else f"more than the {MAX_FACTOR_BYTES / 2 ** 30:g} GiB")
            raise InputError(
                f"column {c!r} enters the fixed effects as a categorical predictor with {k} levels: {k - 1} "
                f"dummy columns, {size / 2 ** 20:.0f} MiB for its {len(raw)} rows ({why} vbsvm allows, "
                f"vbsvm.formula.design.MAX_FACTOR_LEVELS / MAX_FACTOR_BYTES); a fit costs about n p^2 = "
                f"{len(raw) * float(k - 1) ** 2:.1e} multiply-adds per sweep, and many sweeps (hours for thousands "
                f"of levels). Model it as a random effect, (1 | {quote_name(c)}), which pools the levels "
                "and fits in seconds; or merge rare levels; or, to fit every level as a fixed effect anyway, "
                f"add the dummy columns yourself (pd.get_dummies(data[{c!r}], drop_first=True, dtype=float)).")


def numbers_as_text(design: Design, min_levels: int = 10) -> list:
    """The text predictor columns of ``design`` that look numeric: at least half of their values
    parse as numbers and they have more than ``min_levels`` distinct values, so that as factors they
    make a column per value. Columns of numeric codes that the formula makes categorical with
    ``C()`` on purpose (every value a number) are left out.

    Returns
    -------
    list of tuple
        ``(column, values that parse, values, up to 3 that do not, distinct values)`` per column.
    """
    explicit = set(categorical_calls(design.formula))
    out = []
    for c in _columns_where(design.raw, design.fixed_vars or (), lambda dt: not (
            pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)
            or isinstance(dt, pd.CategoricalDtype) or not pd.api.types.is_string_dtype(dt))):
        values = design.raw[c].dropna()
        numbers = pd.to_numeric(values, errors="coerce")
        parsed, total, levels = int(numbers.notna().sum()), len(values), int(values.nunique())
        if total == 0 or 2 * parsed < total or levels <= min_levels or (parsed == total and c in explicit):
            continue
        out.append((c, parsed, total, pd.unique(values[numbers.isna()]).tolist()[:3], levels))
    return out


def _missing_mask(data: pd.DataFrame, columns) -> np.ndarray:
    """Which rows of ``data`` miss a value in any of ``columns``; from the missing values of the
    whole frame when ``columns`` are at least half of it (cheaper than a frame of them)."""
    if not columns:
        return np.zeros(len(data), dtype=bool)
    if data.columns.is_unique and 2 * len(columns) >= data.shape[1]:
        return data.isna().to_numpy()[:, [data.columns.get_loc(c) for c in columns]].any(axis=1)
    return _take_columns(data, columns).isna().to_numpy().any(axis=1)


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


def formula_columns(formula, data_columns):
    """Split ``formula`` and check that its response and grouping columns are in
    ``data_columns``; returns ``(response, fixed-effect formula, random-effect terms, grouping
    columns, columns)``."""
    response, fixed, re_terms = _split_formula(formula)
    columns = [str(c) for c in data_columns]
    groups = list(dict.fromkeys(c for term in re_terms for c in term[1]))
    for name, what in [(response, "response")] + [(g, "grouping column") for g in groups]:
        if name not in columns:
            hint = difflib.get_close_matches(name, columns, n=1)
            raise FormulaError(
                f"{what} {name!r} in the formula is not a column of data"
                + (f"; did you mean {hint[0]!r}?" if hint else f"; the columns are {columns[:20]}.")
            )
    return response, fixed, re_terms, groups, columns


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
    data = without_attrs(check_frame(data, "data"))
    if missing not in MISSING_ACTIONS:
        raise InputError(f"missing must be one of {MISSING_ACTIONS}, got {missing!r}.")
    if len(data) == 0:
        raise InputError("data has no rows; pass a non-empty DataFrame.")
    response, fixed, re_terms, groups, columns = formula_columns(formula, data.columns.tolist())
    _check_r_calls(formula, columns)
    rhs_formula = _expand_dot(fixed, columns, response, groups)
    if not data.columns.is_unique:  # before anything looks a column up by its name
        _check_unique_columns(data, [response, *groups] + sorted(_mentioned_columns(
            " ".join([rhs_formula] + [t[0] for t in re_terms]), columns)))
    plain = _plain_numeric_columns(rhs_formula, data)
    needed_vars, re_vars = _formula_variables(formula, rhs_formula, re_terms, (response, groups, columns), plain)
    fixed_vars = [v for v in needed_vars if v != response and v not in re_vars]
    used = [response] + [v for v in needed_vars if v != response] + groups
    used = list(dict.fromkeys(used))
    raw = _select_columns(data, used)
    _check_column_types(raw, [v for v in needed_vars if v != response])
    _check_factor_sizes(raw, fixed_vars, rhs_formula)
    predictor_cols = [v for v in needed_vars if v != response]
    raw, n_dropped = _drop_missing_rows(raw, data, used, (response, predictor_cols, groups), missing)

    y, neg, pos = _code_response(raw[response], response)
    spec, names, X = _fixed_effect_matrix(raw, plain, rhs_formula, formula)
    has_intercept = "Intercept" in names
    # all False without a missing entry (the usual case): a read-only view of one value, not n x p
    mask = np.isnan(X) if any(np.isnan(X[:, j]).any() for j in range(X.shape[1])) else \
        np.broadcast_to(np.False_, X.shape)
    if missing == "impute":
        _check_imputable(raw, predictor_cols)
    X, center, scale = _standardized(X, names, mask, has_intercept, standardize)

    gfactors = _random_effect_terms(re_terms, raw, missing)
    labels = [g.name for g in gfactors]
    if len(set(labels)) != len(labels):
        raise FormulaError(f"the formula {formula!r} has the random-effect term(s) "
                           f"{sorted({x for x in labels if labels.count(x) > 1})} twice.")

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
        fixed_vars=fixed_vars,
    )


def _formula_variables(formula: str, rhs_formula: str, re_terms, names, plain):
    """The data columns the formula uses, ``(all of them, those of the random effects alone)``, in
    the data's column order (so that a saved fit rebuilds ``'y ~ .'`` identically); ``names`` is
    ``(response, grouping columns, data columns)``. Raises a FormulaError for a name that is
    neither a column nor a function."""
    response, groups, columns = names
    try:
        needed = set(plain[0]) if plain is not None else _required_columns(rhs_formula, columns,
                                                                             {response, *groups})
        re_vars = set().union(*(_required_columns(t[0], columns, {response, *groups})
                                for t in re_terms if t[0] != "1"))
        order = lambda v: (columns.index(v) if v in columns else len(columns), v)  # noqa: E731
        needed_vars = sorted(needed, key=order)
        re_vars = sorted(re_vars - needed, key=order)
    except FormulaicError as exc:
        raise FormulaError(f"cannot parse the formula {formula!r}: {_formulaic_text(exc).rstrip('.')}."
                           + _spaced_names_hint(formula, columns)) from None
    except SyntaxError as exc:  # formulaic parses each term as Python
        raise _python_syntax_error(formula, exc, f"the formula {formula!r}") from None
    needed_vars = needed_vars + re_vars
    _check_known_names(formula, needed_vars, columns)
    return needed_vars, re_vars


def _check_known_names(formula: str, variables, columns) -> None:
    """Raise a FormulaError naming the ``variables`` of ``formula`` that are not ``columns``: a
    call of an unknown function, or a name (with the nearest column)."""
    absent = [v for v in variables if v not in columns]
    called = set(call_names(formula))
    unknown = [v for v in absent if v in called]
    if unknown:
        raise FormulaError(f"the formula {formula!r} calls {unknown[0]}(), which is neither a column nor a "
                           "function a formula can call: " + (r_call_problem(unknown[0], formula) or (
                               "use np.<function>(x) for numpy's elementwise functions, I(...) for "
                               "arithmetic, or the transforms C(), poly(), bs(), cr(), center(), scale(), "
                               "log(), exp()")) + ".")
    if absent:
        hints = {v: difflib.get_close_matches(v, columns, n=1) for v in absent}
        detail = "; ".join(
            f"{v!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for v, h in hints.items()
        )
        shown = "" if all(hints.values()) else f" The columns are {columns[:20]}{' ...' if len(columns) > 20 else ''}."
        raise FormulaError(f"the formula uses name(s) that are not columns of data: {detail}.{shown} "
                           "Use column names (backquote names with spaces: `my var`).")


def _drop_missing_rows(raw: pd.DataFrame, data: pd.DataFrame, used, roles, missing: str):
    """``(raw without the rows that ``missing`` drops, how many)``: rows missing a grouping
    column, and with ``missing="drop"`` rows missing a predictor; ``roles`` is ``(response,
    predictor columns, grouping columns)``. Raises an InputError for a missing response,
    for missing predictors with ``missing="raise"``, for a missing grouping column with
    ``missing="impute"`` and when no row is left."""
    response, predictor_cols, groups = roles
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
    return raw, n_dropped


def _fixed_effect_matrix(raw: pd.DataFrame, plain, rhs_formula: str, formula: str):
    """``(spec, column names, X)`` of the fixed effects, ``X`` unstandardized; raises for an
    infinite entry and for a design without columns."""
    if plain is not None:
        # A sum of numeric columns: the model matrix is the columns themselves (formulaic would
        # give the same matrix, at a cost per column).
        spec = PlainSpec(*plain)
        names = spec.column_names
        X = spec.matrix(raw)
    else:
        spec, names, X = _formulaic_design(rhs_formula, raw, f"the formula {formula!r}")
    cols = [names[j] for j in range(X.shape[1]) if np.isinf(X[:, j]).any()]  # column by column: no n x p mask
    if cols:
        raise InputError(
            f"design column(s) {cols} contain infinite values (e.g. log of 0); transform or "
            "filter the data so that every predictor is finite."
        )
    if X.shape[1] == 0:
        raise FormulaError(
            f"the formula {formula!r} has no fixed effects and no intercept; add a predictor or "
            "keep the intercept (drop '- 1' / '+ 0')."
        )
    return spec, names, X


def _check_imputable(raw: pd.DataFrame, predictor_cols) -> None:
    """Raise an InputError for a categorical predictor with missing values (formulaic codes a
    missing categorical as its own level, so the raw columns are checked)."""
    for v in predictor_cols:
        if raw[v].isna().any() and not pd.api.types.is_numeric_dtype(raw[v]):
            raise InputError(
                f"categorical predictor {v!r} has missing values; imputation of categorical "
                "predictors is not supported: drop those rows or add an explicit 'missing' level."
            )


def _standardized(X: np.ndarray, names, mask: np.ndarray, has_intercept: bool, standardize: bool):
    """``(X, center, scale)``: ``X`` in Fortran order, centred and scaled in place (centres and
    scales ``0`` and ``1`` without ``standardize``, centres ``0`` without an intercept; the
    observed entries of a column give its mean and sd). Raises an InputError for a constant column."""
    X = np.asfortranarray(X)  # in place from here: the design is the one n x p copy of the data
    mean, sd = _column_moments(X, mask)
    center = np.zeros(X.shape[1])
    scale = np.ones(X.shape[1])
    for j, name in enumerate(names):
        if name == "Intercept":
            continue
        if not sd[j] > 0:
            col = X[~mask[:, j], j]
            raise InputError(
                f"design column {name!r} is constant ({col[0] if col.size else 'empty'}); it "
                "carries no information and is not identified with an intercept: remove it "
                "from the formula."
            )
        if standardize:
            center[j] = mean[j] if has_intercept else 0.0
            scale[j] = sd[j]
    X -= center
    X /= scale
    return X, center, scale


def _column_moments(X: np.ndarray, mask: np.ndarray):
    """Mean and sd (``ddof=1``; 0 for fewer than two entries) of the observed entries of each
    column of the Fortran-ordered ``X``, computed on the column divided by its largest absolute
    value, so that the squares of values near 1e300 do not overflow. Without a missing entry the
    columns are taken by blocks of at most :data:`MATRIX_BLOCK_BYTES` (each column's sums the
    same as on its own: numpy reduces along the contiguous axis pairwise, column by column)."""
    n, p = X.shape
    mean, sd = np.zeros(p), np.zeros(p)
    if mask.any() or n < 2:
        for j in range(p):
            col = X[~mask[:, j], j]
            top = np.abs(col).max() if col.size else 0.0
            unit = col / top if top > 0 else col
            mean[j] = top * unit.mean() if col.size else 0.0
            sd[j] = top * unit.std(ddof=1) if col.size > 1 and top > 0 else 0.0
        return mean, sd
    width = max(1, MATRIX_BLOCK_BYTES // (8 * n))
    for j in range(0, p, width):
        block = X[:, j:j + width]
        top = np.abs(block).max(axis=0)
        unit = block / np.where(top > 0, top, 1.0)
        mean[j:j + width] = top * unit.mean(axis=0)
        sd[j:j + width] = np.where(top > 0, top * unit.std(axis=0, ddof=1), 0.0)
    return mean, sd


def _formulaic_design(rhs: str, raw: pd.DataFrame, what: str):
    """``(spec, column names, X)`` of ``rhs`` by formulaic, ``X`` a float64 array in Fortran order
    (formulaic's frame is released before the caller goes on)."""
    mm = _model_matrix(rhs, raw, what)
    return mm.model_spec, [str(c) for c in mm.columns], np.array(mm, dtype=float, order="F")


def _model_matrix(rhs: str, raw: pd.DataFrame, what: str):
    """formulaic's model matrix of ``rhs`` (rows with missing values kept); errors name ``what``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return formulaic.model_matrix(rhs, raw, na_action="ignore")
    except FactorEvaluationError as exc:
        raise FormulaError(f"cannot evaluate a term of {what}: {_formulaic_text(exc)}") from None
    except FormulaicError as exc:
        raise FormulaError(f"cannot parse {what}: {_formulaic_text(exc)}") from None
    except SyntaxError as exc:
        raise _python_syntax_error(f"y ~ {rhs}", exc, what) from None


def _check_r_calls(formula: str, columns) -> None:
    """Refuse calls of R functions formulaic lacks (``offset()``, ``factor()``, ``as.factor()``,
    ...; see :mod:`vbsvm.formula.habits`), naming what to write instead."""
    for name in call_names(formula):
        if name in R_FUNCTIONS and name not in columns:
            raise FormulaError(f"cannot use the formula {formula!r}: {r_call_problem(name, formula)}.")


def _python_syntax_error(formula: str, exc: SyntaxError, what: str) -> FormulaError:
    """A :class:`FormulaError` for a term of ``formula`` that formulaic could not parse as Python
    (``exc``); the whitelist check of :mod:`vbsvm.formula.safety` names the offending part where
    it can. ``what`` names the formula in the message."""

    try:
        check_formula(formula)
    except FormulaError as refusal:  # names the formula and the part at fault
        return refusal
    where = f" at {exc.text.strip()!r}" if exc.text else ""
    return FormulaError(f"cannot parse {what}: a term is not valid Python{where} ({exc.msg}); use column names "
                        "(backquote names that are not Python names: `my var`), numbers, + - * / : ** ^ | and "
                        "functions such as C(), I(), np.log().")


def _mentioned_columns(text: str, columns) -> set:
    """The columns whose names appear in the formula text ``text`` as whole names."""
    text = text.replace("`", " ")
    return {c for c in columns if re.search(rf"(?<![\w.]){re.escape(c)}(?![\w.])", text)}


def _required_columns(rhs: str, columns, exclude) -> set:
    """Columns of the data that the formula part ``rhs`` uses."""
    needed = set(formulaic.Formula(rhs).required_variables)
    # formulaic leaves out names that are also its transforms (a column called `cs`, `bs`, `poly`,
    # `center`, ...): add every column the formula mentions by name.
    needed |= _mentioned_columns(rhs, columns) - set(exclude)
    # formulaic reads `cad.dur` as the attribute of `cad`: drop such stems of dotted columns
    needed -= {v for v in needed if v not in columns and any(c.startswith(v + ".") for c in needed)}
    return needed


def _random_effect_terms(re_terms, raw: pd.DataFrame, missing: str) -> list:
    """One :class:`GroupingFactor` per random-effect term (``||`` split into one per column)."""
    out = []
    for re_lhs, factor, text, split in re_terms:
        spec, cols, Z = None, ["Intercept"], None
        if re_lhs != "1":
            mm = _model_matrix(re_lhs, raw, f"the random-effect term {text!r}")
            spec, cols, Z = mm.model_spec, [str(c) for c in mm.columns], np.array(mm, dtype=float)
            if not cols:
                raise FormulaError(f"the random-effect term {text!r} has no columns; write (1 | g) for "
                                   "a random intercept.")
            if np.isnan(Z).any() or not np.isfinite(Z).all():
                raise InputError(f"the columns of the random-effect term {text!r} have missing or infinite "
                                 "values; random-effect columns cannot be imputed: drop or fill those rows.")
        keys = _level_keys(raw, list(factor))
        levels = np.array(sorted(pd.unique(keys).tolist(), key=lambda v: (str(type(v)), v)), dtype=object)
        codes = GroupingFactor("", levels, np.zeros(0, np.int64)).encode(keys)
        parts = [[j] for j in range(len(cols))] if split else [list(range(len(cols)))]
        for sel in parts:
            names = [cols[j] for j in sel]
            label = ":".join(factor)
            if "Intercept" not in names:
                label = re.sub(r"\W+", "_", f"{label}_{'_'.join(names)}").strip("_")
            Zs = None if Z is None or names == ["Intercept"] and np.all(Z[:, sel] == 1) else Z[:, sel]
            out.append(GroupingFactor(label, levels, codes, tuple(factor), names, re_lhs,
                                      Zs if Zs is None else np.asfortranarray(Zs), spec,
                                      None if len(sel) == len(cols) else sel))
    return out
