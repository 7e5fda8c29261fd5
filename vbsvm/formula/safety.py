"""The boundary between formula text and Python: which formulas vbsvm will hand to formulaic.

formulaic evaluates each term of a formula as a Python expression (``np.log(x)``, ``I(x**2)``,
``C(sex)``), in a namespace that holds numpy and the transforms. A formula is therefore code. A
formula typed by the user in their own session is theirs to run, but a formula read from a saved
fit (:func:`vbsvm.load`) or handed to the command line by a script may come from anyone, and e.g.
``y ~ I(np.savetxt('file', x) or x)`` would write a file when the design is rebuilt. This module
checks such formulas *before* formulaic sees them.

The check parses the formula into a Python syntax tree (after mapping the formula-only syntax onto
Python operators: the ``~`` splits the sides, ``:`` becomes ``@``, a lone ``.`` and backquoted
names become placeholder names) and accepts only

* names (column names, read from the data) and dotted names such as ``cad.dur`` that are not
  called and whose parts do not start with ``_``; backquoted names `` `my var` ``;
  an allowed function as a value (``C(x, contr.sum)``);
* numbers, short strings, ``True``/``False``/``None``, lists and tuples of these;
* the operators ``+ - * / ** : | % //``, comparisons, ``and``/``or``/``not``, unary ``- + ~``
  (so ``-1``/``+0``, interactions, ``(1 | g)``, ``(1 + x | g)``, ``(1 | a/b)``, ``(1 | a:b)``
  and ``I()`` arithmetic are fine), but no power or shift of two constants (``I(9**9**9)``
  would never finish; ``^`` inside a call is read as the power ``**``, as R and
  :mod:`vbsvm.design` read it, so ``I(9^9^9)`` is refused too);
* calls of the functions in :data:`ALLOWED_FUNCTIONS` only: the formulaic transforms (``C``,
  ``I``, ``Q``, ``center``, ``scale``, ``standardize``, ``poly``, ``bs``, ``cs``, ``cc``,
  ``cr``, ``log``, ``exp``, ...), contrasts (``contr.treatment``, ``Treatment``, ...) and the
  elementwise numpy functions in :data:`NUMPY_FUNCTIONS` (``np.log``, ``np.log1p``,
  ``np.exp``, ``np.sqrt``, ...; positional arguments only, so no ``out=``).

Everything else is refused: attribute access on anything but a whitelisted function name or a
dotted column name, subscripts, lambdas, comprehensions, dict/set displays (formulaic's
``{...}`` Python blocks), f-strings, starred arguments, ``:=``, conditional expressions, names
starting with ``__``, formulas longer than :data:`MAX_FORMULA_LENGTH` characters, and text that
Python and formulaic would read differently (backslash escapes, triple quotes, ``#``).
"""

from __future__ import annotations

import ast
import re

from vbsvm.exceptions import FormulaError, InputTypeError
from vbsvm.formula.habits import NUMPY_FUNCTIONS, python_power

__all__ = ["check_formula", "ALLOWED_FUNCTIONS", "NUMPY_FUNCTIONS", "MAX_FORMULA_LENGTH", "MAX_STRING_LENGTH"]

#: Longest formula accepted (characters); a formula is a few hundred characters at most in practice.
MAX_FORMULA_LENGTH = 20_000
#: Longest string literal inside a formula (a level name in ``C(x, levels=[...])``, ...).
MAX_STRING_LENGTH = 1_000


#: formulaic transforms and contrasts a formula may call (keyword arguments allowed).
TRANSFORMS = frozenset("""
    C I Q center scale standardize poly bs cs cc cr lag log log2 log10 exp exp2 exp10
    Treatment Sum Helmert Diff Poly
    contr.treatment contr.sum contr.helmert contr.diff contr.poly contr.custom contr.sas
""".split())

#: Every callable a formula may name.
ALLOWED_FUNCTIONS = TRANSFORMS | frozenset(f"np.{name}" for name in NUMPY_FUNCTIONS)

# Names formulaic's evaluation namespace binds to modules: not column names, never bare values.
_NAMESPACE_ROOTS = frozenset({"np", "numpy", "contr", "formulaic", "pd", "pandas"})

_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.MatMult, ast.BitOr, ast.BitAnd, ast.BitXor,
           ast.Mod, ast.FloorDiv, ast.LShift, ast.RShift)
_UNARY = (ast.USub, ast.UAdd, ast.Invert, ast.Not)
_AMBIGUOUS = ("\\", "'" * 3, '"' * 3, "#")
_PLACEHOLDER = "vbsvm_placeholder_"
_DOT = _PLACEHOLDER + "dot"
# formula text is scanned piece by piece: backquoted names, string literals, the rest
_PIECES = re.compile(r"`[^`]*`?|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|[^`'\"]+|.", re.S)
_LONE_DOT = re.compile(r"(?<![\w.])\.(?![\w.])")


def check_formula(formula, *, what="formula"):
    """Refuse a formula that could do more than compute columns from the data.

    Parameters
    ----------
    formula : str
        A model formula, e.g. ``"y ~ x1 + np.log(x2) + C(sex) + (1 | g)"``.
    what : str
        How error messages name the formula (e.g. ``"the formula stored in 'fit.nc'"``).

    Returns
    -------
    str
        ``formula`` unchanged.

    Raises
    ------
    vbsvm.exceptions.FormulaError
        If the formula uses anything outside the whitelist described in :mod:`vbsvm.formula.safety`;
        the message names the offending part.
    vbsvm.exceptions.InputTypeError
        If ``formula`` is not a string.
    """
    if not isinstance(formula, str):
        raise InputTypeError(f"{what} must be a string such as 'y ~ x1 + x2', got {type(formula).__name__}.")
    if len(formula) > MAX_FORMULA_LENGTH:
        raise FormulaError(f"{what} has {len(formula)} characters, more than the {MAX_FORMULA_LENGTH} allowed; "
                           "shorten it (e.g. 'y ~ .' for every column).")
    # Text whose reading differs between Python's tokenizer and formulaic's (escapes and triple
    # quotes move the end of a string, '#' starts a comment only for Python) is refused, so that
    # both read the same terms and a string the check sees is a string for formulaic too.
    odd = [token for token in _AMBIGUOUS if token in formula]
    if odd:
        raise FormulaError(f"{what} {_shorten(formula)} contains {odd[0]!r}, which a formula may not contain; "
                           "remove it (rename columns whose names contain it).")
    # '^' inside a call is R's power, as vbsvm.design reads it (vbsvm.formula_habits): check that reading
    sides, names = _to_python(python_power(formula), what)
    checker = _Checker(formula, what, names)
    for side in sides:
        try:
            tree = ast.parse(side, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise FormulaError(f"cannot parse the {what.removeprefix('the ')} {_shorten(formula)} "
                               f"({getattr(exc, 'msg', None) or type(exc).__name__}); use column names, numbers, "
                               f"the operators + - * / : ** | and the functions {_FUNCTION_LIST}.") from None
        try:
            checker.visit(tree.body)
        except RecursionError:
            raise FormulaError(f"{what} {_shorten(formula)} is nested too deeply (or has too many terms) for "
                               "vbsvm to check; simplify it (e.g. 'y ~ .' for every column).") from None
    return formula


_FUNCTION_LIST = "C(), I(), Q(), center(), scale(), poly(), bs() and elementwise numpy functions such as np.log(), np.sqrt()"


def _shorten(text, limit=120):
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _to_python(formula, what):
    """The two sides of ``lhs ~ rhs`` as Python text, and the backquoted names by placeholder.

    Backquoted names become placeholder names, a lone ``.`` (every column) another placeholder
    and the interaction ``:`` the operator ``@`` (string literals are left as they are).
    """
    sides, names = [[]], {}
    for piece in _PIECES.findall(formula):
        if piece.startswith("`"):
            if len(piece) < 2 or not piece.endswith("`"):
                raise FormulaError(f"{what} {_shorten(formula)} has an unclosed backquote; close the quoted name.")
            key = f"{_PLACEHOLDER}{len(names)}"
            names[key] = piece[1:-1]
            sides[-1].append(f" {key} ")
        elif piece[0] in "'\"":
            sides[-1].append(piece)
        else:
            if "@" in piece:
                raise FormulaError(f"{what} {_shorten(formula)} contains '@', which is not formula syntax; "
                                   "use ':' for interactions.")
            for k, part in enumerate(piece.split("~")):
                if k:
                    sides.append([])
                part = re.sub(r"\s", " ", part)  # a formula read from a file may span lines
                sides[-1].append(_LONE_DOT.sub(f" {_DOT} ", part).replace(":", " @ "))
    if len(sides) != 2:
        raise FormulaError(f"{what} {_shorten(formula)} must have exactly one '~' with the response on the "
                           "left, e.g. 'y ~ x1 + x2'.")
    return ["".join(side).strip() for side in sides], names


class _Checker(ast.NodeVisitor):
    """Walks the syntax tree of a formula and raises on the first node outside the whitelist."""

    def __init__(self, formula, what, names):
        self.formula, self.what, self.names = formula, what, names

    def source(self, node):
        """The formula text of ``node`` (placeholders back to backquoted names and '.')."""
        text = ast.unparse(node).replace(_DOT, ".").replace(" @ ", ":")
        for key, name in self.names.items():
            text = text.replace(key, f"`{name}`")
        return text if len(text) <= 80 else text[:80] + "..."

    def refuse(self, part, why):
        raise FormulaError(f"{self.what} {_shorten(self.formula)} is refused: {part} {why}. A formula may use "
                           f"column names, numbers, formula operators and the functions {_FUNCTION_LIST} "
                           "(see vbsvm.formula.safety).")

    def generic_visit(self, node):
        self.refuse(f"'{self.source(node)}'", f"({type(node).__name__}) is not allowed in a formula")

    # ---------------------------------------------------------------- leaves
    def visit_Name(self, node):
        if node.id.startswith("__"):
            self.refuse(f"the name {node.id!r}", "starts with '__'")
        if node.id in _NAMESPACE_ROOTS:
            self.refuse(f"the name {node.id!r}", "is a module, not a column; call one of its allowed functions")

    def visit_Constant(self, node):
        value = node.value
        if isinstance(value, str) and len(value) > MAX_STRING_LENGTH:
            self.refuse(f"a string of {len(value)} characters", f"is longer than {MAX_STRING_LENGTH}")
        if not (value is None or isinstance(value, (bool, int, float, str))):
            self.refuse(f"the constant {self.source(node)}", "is not a number, string, True, False or None")

    def visit_Attribute(self, node):
        parts = _dotted(node)
        if parts is None:
            self.refuse(f"'{self.source(node)}'", "is an attribute of an expression")
        if parts[0].startswith("__") or any(p.startswith("_") for p in parts[1:]):
            self.refuse(f"'{'.'.join(parts)}'", "reaches a private attribute")
        if parts[0] in _NAMESPACE_ROOTS and ".".join(parts) not in ALLOWED_FUNCTIONS:
            self.refuse(f"'{'.'.join(parts)}'", "names a module attribute as a value; a module may only "
                                                "be named to call one of its allowed functions")

    def visit_List(self, node):
        for elt in node.elts:
            self.visit(elt)

    visit_Tuple = visit_List

    # ---------------------------------------------------------------- operators
    def visit_BinOp(self, node):
        if not isinstance(node.op, _BINARY):
            self.generic_visit(node)
        if any(_is_sequence(side) for side in (node.left, node.right)):
            self.refuse(f"'{self.source(node)}'", "does arithmetic with a string, list or tuple")
        if isinstance(node.op, (ast.Pow, ast.LShift)) and _constant_only(node.left) and _constant_only(node.right):
            self.refuse(f"'{self.source(node)}'", "raises a constant to a constant power (which can take "
                                                  "forever); write the value itself")
        self.visit(node.left)
        self.visit(node.right)

    def visit_UnaryOp(self, node):
        if not isinstance(node.op, _UNARY):
            self.generic_visit(node)
        self.visit(node.operand)

    def visit_BoolOp(self, node):
        for value in node.values:
            self.visit(value)

    def visit_Compare(self, node):
        self.visit(node.left)
        for value in node.comparators:
            self.visit(value)

    # ---------------------------------------------------------------- calls
    def visit_Call(self, node):
        parts = _dotted(node.func)
        name = ".".join(parts) if parts else self.source(node.func)
        if parts is None or name not in ALLOWED_FUNCTIONS:
            self.refuse(f"the call of '{name}'", "is not an allowed function")
        if name.startswith("np.") and node.keywords:
            self.refuse(f"the keyword argument(s) of '{name}'", "are not allowed (numpy functions take "
                                                              "positional arguments here)")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                self.refuse(f"'{self.source(arg)}'", "(a starred argument) is not allowed")
            self.visit(arg)
        for kw in node.keywords:
            if kw.arg is None or kw.arg.startswith("_"):
                self.refuse(f"the keyword argument '{self.source(kw)}' of '{name}'", "is not allowed")
            self.visit(kw.value)


def _dotted(node):
    """``['np', 'log']`` for ``np.log``; None unless ``node`` is a name or a chain of attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def _constant_only(node):
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
               for n in ast.walk(node))


def _is_sequence(node):
    return isinstance(node, (ast.List, ast.Tuple)) or isinstance(node, ast.Constant) and isinstance(node.value, str)
