"""R formula habits: each works as it does in R, or is refused with a message naming what to write.

One test per habit: ``I(x^2)`` (the square, never Python's exclusive or), ``^`` inside other calls,
``poly(x, 2)`` (R's orthonormal polynomials), ``log(x + 1)``, ``.``, ``- 1``, ``offset(x)``,
``x^2`` outside ``I()``, ``(a + b)^2``, ``a:b``, ``a*b``, and R functions formulaic lacks
(``factor()``, ``as.factor()``, ``sqrt()``, ``ns()``)."""

import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.fitting.svm import warn_about_data
from vbsvm.formula.design import build_design
from vbsvm.exceptions import DiagnosticWarning, FormulaError
from vbsvm.formula.habits import python_power, self_powers
from vbsvm.formula.safety import check_formula


@pytest.fixture(scope="module")
def df():
    rng = np.random.default_rng(5)
    n = 60
    out = pd.DataFrame({"glu": rng.integers(60, 200, n), "a": rng.normal(size=n), "b": rng.normal(size=n),
                        "f": rng.choice(list("pqr"), n), "h": rng.choice(list("uv"), n), "g": rng.integers(0, 5, n)})
    out.loc[0, "glu"] = 86
    out["y"] = (out["a"] + rng.normal(size=n) > 0).astype(int)
    return out


def design(formula, data):
    return build_design(formula, data, standardize=False)


def column(d, name):
    return d.X[:, d.column_names.index(name)]


def test_caret_inside_I_is_the_power_not_exclusive_or(df):
    d = design("y ~ I(glu^2)", df)
    x = column(d, d.column_names[1])
    assert x[0] == 86 ** 2 == 7396 and 86 ^ 2 == 84  # R's meaning, never Python's XOR
    np.testing.assert_array_equal(x, df["glu"].to_numpy(float) ** 2)
    np.testing.assert_array_equal(x, design("y ~ I(glu**2)", df).X[:, 1])
    fit = vbsvm.svm("y ~ a + I(glu^2)", df, method="map", penalty=1.0)  # new data get the same column
    np.testing.assert_array_equal(fit.design.new_X(df.head(3), standardized=False)[:, 2], df["glu"].head(3) ** 2.0)


def test_caret_inside_any_call_or_random_term_is_the_power(df):
    np.testing.assert_allclose(design("y ~ np.log(glu^2)", df).X[:, 1], 2 * np.log(df["glu"]))
    d = design("y ~ a + (1 + I(b^2) | g)", df)
    np.testing.assert_allclose(d.groups[0].Z[:, 1], df["b"] ** 2)
    # backquoted names and strings keep their '^'; a constant power of a constant is refused on load
    assert python_power("y ~ `a^b` + C(f, levels=['x^2']) + I(x^3)") == "y ~ `a^b` + C(f, levels=['x^2']) + I(x**3)"
    with pytest.raises(FormulaError, match=r"constant to a constant power"):
        check_formula("y ~ I(9^9^9)")


def test_poly_is_Rs_orthonormal_polynomial_basis_fixed_at_training(df):
    d = design("y ~ poly(a, 2)", df)
    # R's poly(): the columns of the QR factor of [1, x - mean, (x - mean)^2], signed so that each
    # has a positive leading coefficient (Q diag(sign(R))), without the constant
    x = df["a"].to_numpy() - df["a"].mean()
    q, r = np.linalg.qr(np.vander(x, 3, increasing=True))
    expected = (q * np.sign(np.diag(r)))[:, 1:]
    np.testing.assert_allclose(d.X[:, 1:], expected, atol=1e-10)
    # new rows are evaluated on the training basis (predict.poly), not re-orthogonalized
    np.testing.assert_allclose(d.new_X(df.iloc[:7], standardized=False)[:, 1:], expected[:7], atol=1e-10)


def test_log_of_a_sum_is_the_natural_log(df):
    np.testing.assert_allclose(design("y ~ log(glu + 1)", df).X[:, 1], np.log(df["glu"] + 1.0))


def test_dot_is_every_other_column_and_minus_removes_one(df):
    d = design("y ~ . - b", df.drop(columns=["f", "h"]))
    assert d.column_names == ["Intercept", "glu", "a", "g"]
    d = design("y ~ . + (1 | g)", df.drop(columns=["f", "h"]))  # grouping columns are not predictors
    assert d.column_names == ["Intercept", "glu", "a", "b"]


@pytest.mark.parametrize("formula", ["y ~ a - 1", "y ~ a + 0", "y ~ 0 + a", "y ~ -1 + a"])
def test_minus_one_removes_the_intercept(df, formula):
    d = design(formula, df)
    assert d.column_names == ["a"] and not d.has_intercept


def test_offset_is_refused_with_the_reason_and_the_alternative(df):
    with pytest.raises(FormulaError, match=r"offset\(b\) is not supported.*fixed coefficient of 1.*enter b as an "
                                           r"ordinary predictor"):
        vbsvm.svm("y ~ a + offset(b)", df)


def test_caret_outside_I_is_the_term_itself_as_in_R_with_a_warning(df):
    d = design("y ~ a^2 + b", df)
    assert d.column_names == ["Intercept", "a", "b"]  # R: a^2 is a crossed with itself, i.e. a
    np.testing.assert_array_equal(column(d, "a"), df["a"])
    with pytest.warns(DiagnosticWarning, match=r"'a\^2' in the formula is a crossed with itself.*write I\(a\^2\)"):
        warn_about_data(d, separability=False)
    assert self_powers("y ~ (a + b)^2 + I(a^2) + `my x`^3") == ["`my x`^3"]


def test_power_of_a_sum_is_the_main_effects_and_interactions(df):
    d = design("y ~ (a + b)^2", df)
    assert d.column_names == ["Intercept", "a", "b", "a:b"]
    np.testing.assert_allclose(column(d, "a:b"), df["a"] * df["b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        assert self_powers(d.formula) == []


def test_colon_is_the_interaction_alone(df):
    d = design("y ~ a:b", df)
    assert d.column_names == ["Intercept", "a:b"]
    np.testing.assert_allclose(d.X[:, 1], df["a"] * df["b"])
    # two factors: the interaction spans the cell means (R's model.matrix(~ f:h) has the same span)
    d = design("y ~ f:h", df)
    cells = pd.get_dummies(df["f"] + df["h"], dtype=float).to_numpy()
    assert np.linalg.matrix_rank(d.X) == np.linalg.matrix_rank(np.c_[d.X, cells]) == cells.shape[1]


def test_star_is_main_effects_plus_interaction(df):
    assert design("y ~ a*b", df).column_names == ["Intercept", "a", "b", "a:b"]
    # R: model.matrix(~ f * a) has (Intercept), fq, fr, a, fq:a, fr:a
    assert design("y ~ f*a", df).column_names == ["Intercept", "f[T.q]", "f[T.r]", "a", "f[T.q]:a", "f[T.r]:a"]


@pytest.mark.parametrize("formula, fix", [
    ("y ~ a + factor(g)", r"factor\(\) is R's.*write C\(g\)"),
    ("y ~ a + as.factor(g)", r"as\.factor\(\) is R's.*write C\(g\)"),
    ("y ~ sqrt(glu)", r"sqrt\(\).*write np\.sqrt\(glu\)"),
    ("y ~ ns(a, 3)", r"ns\(\) is R's.*cr\(a, df=\.\.\.\)"),
    ("y ~ a + nofunc(b)", r"nofunc\(\), which is neither a column nor a function.*np\.<function>"),
])
def test_R_functions_formulaic_lacks_name_the_replacement(df, formula, fix):
    with pytest.raises(FormulaError, match=fix):
        vbsvm.svm(formula, df)
