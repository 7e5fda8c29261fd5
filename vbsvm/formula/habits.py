"""R formula habits on formulaic: which ones mean what they mean in R, and which are refused.

vbsvm reads formulas with formulaic, whose terms are Python expressions. Most R habits carry over
unchanged (``y ~ .``, ``- 1``, ``a:b``, ``a*b``, ``(a + b)^2``, ``poly(x, 2)``, ``log(x + 1)``);
this module handles those that would not:

* **``^`` inside a function call** (``I(x^2)``, ``np.log(x^2)``): R's arithmetic power, but
  Python's exclusive or (``I(86^2)`` is 84). :func:`python_power` rewrites it as ``**`` before
  formulaic sees the formula, so ``I(x^2)`` is the square, as in R. ``^`` outside calls keeps
  its formula meaning (``(a + b)^2`` = ``a + b + a:b``), as in R.
* **``x^2`` outside ``I()``**: in R and formulaic alike the term ``x`` crossed with itself, i.e.
  ``x``, not its square; :func:`self_powers` finds such terms so that the caller can say so.
* **R functions formulaic does not have** (``offset()``, ``factor()``, ``as.factor()``,
  ``ns()``, ``sqrt()``, ...): :func:`r_call_problem` names the replacement (``C(g)``,
  ``cr(x, df=3)``, ``np.sqrt(x)``) or, for ``offset()``, says that vbsvm has no offsets.

The scanner skips backquoted names and string literals, so a column called `` `a^b` `` or a level
``'x^2'`` is left alone.
"""

from __future__ import annotations

import re

#: Elementwise numpy functions a formula may call as ``np.<name>(...)``: pure, no side effects.
NUMPY_FUNCTIONS = frozenset("""
    abs absolute fabs sign sqrt cbrt square reciprocal exp exp2 expm1 log log2 log10 log1p
    logaddexp logaddexp2 power float_power hypot sin cos tan arcsin arccos arctan arctan2 sinh
    cosh tanh arcsinh arccosh arctanh deg2rad rad2deg floor ceil rint trunc round around clip
    maximum minimum fmax fmin mod fmod remainder heaviside isnan isinf isfinite where
""".split())

__all__ = ["NUMPY_FUNCTIONS", "python_power", "self_powers", "call_names", "r_call_problem", "R_FUNCTIONS"]

#: R functions a formula may name that formulaic does not provide, with what to write instead
#: (None: not available in vbsvm at all; the message says why).
R_FUNCTIONS = {
    "offset": None,
    "factor": "write C({arg}) (a categorical predictor with treatment contrasts, as R's factor())",
    "as.factor": "write C({arg}) (a categorical predictor with treatment contrasts, as R's as.factor())",
    "ordered": "write C({arg}, levels=[...]) with the levels in order (treatment contrasts)",
    "as.numeric": "convert the column in the data frame first, "
                  "df['<column>'] = pd.to_numeric(df['<column>'], errors='coerce')",
    "as.integer": "convert the column in the data frame first, "
                  "df['<column>'] = pd.to_numeric(df['<column>'], errors='coerce')",
    "ns": "write cr({arg}, df=...) (natural cubic regression splines) or bs({arg}, df=...)",
    "relevel": "write C({arg}, contr.treatment('<reference level>'))",
    "strata": None,
}

_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*$")


def _code(formula):
    """``(index, char, in_call)`` for the characters of ``formula`` outside backquoted names and
    string literals; ``in_call``: inside the parentheses of a function call or inside ``{...}``
    (where formulaic evaluates Python)."""
    out, stack, quote, last, i = [], [], None, "", 0
    while i < len(formula):
        ch = formula[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 2
                continue
            if ch == quote:
                quote = None
            i += 1
            continue
        if ch in "`'\"":
            quote, last = ch, "`"
            i += 1
            continue
        if ch in "([{":
            # a call's parentheses (after a name), braces and brackets are Python; so is all inside them
            stack.append(ch != "(" or last.isalnum() or last in "_." or bool(stack and stack[-1]))
        out.append((i, ch, bool(stack and stack[-1])))
        if ch in ")]}" and stack:
            stack.pop()
        if not ch.isspace():
            last = ch
        i += 1
    return out


def python_power(formula: str) -> str:
    """``formula`` with each ``^`` inside a function call (or ``{...}``) written ``**``.

    Inside a call formulaic evaluates Python, where ``^`` is the bitwise exclusive or; R reads it
    as the power there (``I(x^2)``, ``log(x^2)``). ``^`` between terms (``(a + b)^2``) is left to
    formulaic, whose meaning is R's.

    Examples
    --------
    >>> python_power("y ~ I(glu^2) + (a + b)^2")
    'y ~ I(glu**2) + (a + b)^2'
    """
    spots = [i for i, ch, inside in _code(formula) if ch == "^" and inside]
    if not spots:
        return formula
    parts, start = [], 0
    for i in spots:
        parts += [formula[start:i], "**"]
        start = i + 1
    return "".join(parts + [formula[start:]])


def self_powers(formula: str) -> list:
    """The terms ``name^k`` (``k`` an integer >= 2) outside function calls, e.g. ``["x^2"]`` for
    ``y ~ x^2 + z``: in R and formulaic ``x^2`` is ``x`` crossed with itself, which is ``x``."""
    found = []
    for i, ch, inside in _code(formula):
        if ch != "^" or inside:
            continue
        head = formula[:i].rstrip()
        m = re.search(r"(`[^`]+`|[A-Za-z_][\w.]*)$", head)
        power = re.match(r"\s*(\d+)", formula[i + 1:])
        if m and power and int(power.group(1)) >= 2:
            found.append(f"{m.group(1)}^{power.group(1)}")
    return found


def call_names(formula: str) -> list:
    """Names of the functions ``formula`` calls (``["I", "np.log"]``), outside strings and backquotes."""
    text = "".join(ch for _, ch, _ in _code(formula))  # strings and backquoted names left out
    names = []
    for k in (m.start() for m in re.finditer(r"\(", text)):
        m = _CALL.search(text[max(0, k - 80):k])
        if m:
            names.append(m.group(1))
    return names


def r_call_problem(name: str, formula: str) -> str | None:
    """Why the call of ``name`` in ``formula`` is refused and what to write instead, or None when
    ``name`` is not an R function that vbsvm knows to be missing from formulaic."""

    arg = _first_argument(formula, name) or "x"
    if name == "offset":
        return (f"offset({arg}) is not supported: the hinge model has no term with a fixed coefficient of 1; "
                f"enter {arg} as an ordinary predictor (its coefficient is then estimated) or leave it out")
    if name == "strata":
        return "strata() is a survival-model term; use a grouping term (1 | g) or C(g) instead"
    if name in R_FUNCTIONS:
        return f"{name}() is R's, not a formulaic function: " + R_FUNCTIONS[name].format(arg=arg)
    if name in NUMPY_FUNCTIONS:
        return f"{name}() is not a formulaic function: write np.{name}({arg}) (numpy's {name})"
    return None


def _first_argument(formula, name):
    """The text of the first argument of the first call of ``name`` in ``formula`` ('' if none)."""
    m = re.search(rf"(?<![\w.`]){re.escape(name)}\s*\(", formula)
    if m is None:
        return ""
    depth, quote, start = 0, None, m.end()
    for i in range(start, len(formula)):
        ch = formula[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "`'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
        elif ch in ",)" and not depth:
            return formula[start:i].strip()
    return formula[start:].strip()
