"""Bad data columns: each gets a vbsvm error (or, where R would accept the data, a
DiagnosticWarning) that names the column and the fix, never a raw error from pandas, formulaic,
xarray or Dask, and never a silently wrong design or prediction."""

import time
import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.fitting.svm import warn_about_data
from vbsvm.formula.design import MAX_FACTOR_LEVELS, MAX_STANDARDIZED, build_design
from vbsvm.exceptions import DiagnosticWarning, FormulaError, InputError, InputTypeError
from support.fits import map_fit


@pytest.fixture(scope="module")
def df():
    rng = np.random.default_rng(11)
    n = 150
    out = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n)})
    out["y"] = (out["x"] + rng.normal(size=n) > 0).astype(int)
    return out


# --------------------------------------------------------------------------- duplicate names
def test_duplicate_column_names_are_named_with_the_fix(df):
    data = df.copy()
    data.columns = ["x", "x", "y"]
    for formula in ("y ~ x", "y ~ ."):
        with pytest.raises(InputError, match=r"2 columns named 'x'.*rename.*duplicated\(\)"):
            vbsvm.svm(formula, data)
    # a duplicated column the formula does not use is no obstacle
    unused = df.assign(w=1.0).rename(columns={"w": "z"})
    assert map_fit("y ~ x", unused).coef.index.tolist() == ["Intercept", "x"]


def test_duplicate_columns_in_newdata_are_named(df):
    fit = map_fit("y ~ x + z", df)
    new = pd.concat([df, df[["x"]]], axis=1)
    with pytest.raises(InputError, match=r"newdata has 2 columns named 'x'"):
        fit.predict(new)


# --------------------------------------------------------------------------- numbers stored as text
def test_a_numeric_column_with_one_stray_string_is_warned_about(df):
    data = df.copy()
    data["x"] = data["x"].astype(object)
    data.loc[3, "x"] = "oops"
    design = build_design("y ~ x + z", data)
    with pytest.warns(DiagnosticWarning, match=r"column 'x' looks numeric: 149 of 150 values parse as numbers, but 1 "
                                               r"does not \(e\.g\. \['oops'\]\).*150 levels.*pd\.to_numeric\(data\['x'\], "
                                               r"errors='coerce'\)"):
        warn_about_data(design, separability=False)
    # the warning reaches the user of svm() too
    with pytest.warns(DiagnosticWarning, match=r"column 'x' looks numeric"):
        vbsvm.svm("y ~ x + z", data.head(40), method="map", penalty=1.0)


def test_numbers_held_as_text_are_warned_about_but_not_codes_made_categorical_on_purpose(df):
    data = df.assign(code=(np.arange(len(df)) % 20).astype(str), grade=np.resize(list("ABC"), len(df)))
    data["x"] = data["x"].round(3).astype(str)
    with pytest.warns(DiagnosticWarning, match=r"column 'x' looks numeric: 150 of 150 .*holds them as text"):
        warn_about_data(build_design("y ~ x", data), separability=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        warn_about_data(build_design("y ~ C(code) + grade", data), separability=False)


# --------------------------------------------------------------------------- complex numbers
def test_complex_columns_are_refused_not_cast(df):
    data = df.assign(x=df["x"] + 1j * df["z"])
    with pytest.raises(InputTypeError, match=r"data column\(s\) \['x'\] hold complex numbers.*imaginary.*\.real"):
        vbsvm.svm("y ~ x + z", data)
    fit = map_fit("y ~ x + z", df)
    with pytest.raises(InputTypeError, match=r"newdata column\(s\) \['x'\] hold complex numbers"):
        fit.predict(data)


# --------------------------------------------------------------------------- overflow in prediction
def test_prediction_far_outside_the_training_range_is_refused_not_constant(df):
    fit = map_fit("y ~ x + z", df)
    far = df.assign(x=df["x"] * 1e300)
    with pytest.raises(InputError, match=r"design column 'x' value\(s\).*more than 1e\+100 training sds.*units"):
        fit.predict(far, kind="prob")
    vb = vbsvm.svm("y ~ x + z", df)
    with pytest.raises(InputError, match=r"'x'"):
        vb.predict(far, kind="prob")
    # far, but within the bound: finite and not one constant value
    p = vb.predict(df.assign(x=df["x"] * 1e6), kind="prob")
    assert np.isfinite(p).all() and p.nunique() > 2
    assert MAX_STANDARDIZED ** 2 * 1e8 < np.finfo(float).max  # the bound's squares stay finite


# --------------------------------------------------------------------------- names with regex syntax
@pytest.mark.parametrize("name", ["a\\b", "a\\g<0>b", "a\\1", "x$"])
def test_column_names_with_backslashes_stay_themselves_in_dot(df, name, tmp_path):
    data = df.rename(columns={"z": name})
    fit = map_fit("y ~ .", data)
    assert fit.coef.index.tolist() == ["Intercept", "x", name]
    fit.save(tmp_path / "f.nc")
    assert vbsvm.load(tmp_path / "f.nc").coef.index.tolist() == ["Intercept", "x", name]


def test_a_dot_inside_backquotes_or_strings_is_not_expanded(df):
    data = df.rename(columns={"z": "a . b"})
    assert map_fit("y ~ `a . b`", data).coef.index.tolist() == ["Intercept", "a . b"]


# --------------------------------------------------------------------------- '/' in names: saved
@pytest.mark.parametrize("name", ["a/b", "/", "a/b/c"])
def test_column_names_with_a_slash_save_and_load(df, name, tmp_path):
    data = df.rename(columns={"z": name})
    if name == "a/b/c":
        data["a_b_c"] = np.random.default_rng(0).normal(size=len(data))  # the stored name is taken
    fit = map_fit("y ~ .", data)
    fit.save(tmp_path / "f.nc")
    back = vbsvm.load(tmp_path / "f.nc")
    assert back.coef.index.tolist() == fit.coef.index.tolist()
    np.testing.assert_allclose(back.coef["mean"], fit.coef["mean"])
    np.testing.assert_allclose(back.predict(data, kind="prob"), fit.predict(data, kind="prob"))


# --------------------------------------------------------------------------- Python in the formula
def test_python_code_in_the_formula_is_a_formula_error_naming_it(df):
    with pytest.raises(FormulaError, match=r"__import__\('os'\)\.system.*not an allowed function"):
        vbsvm.svm("y ~ __import__('os').system('echo hi')", df)
    with pytest.raises(FormulaError, match=r"formula"):
        vbsvm.svm("y ~ x + lambda: 1", df)


# --------------------------------------------------------------------------- huge factors
def test_a_factor_with_thousands_of_levels_is_refused_at_once_with_the_random_effect_fix():
    rng = np.random.default_rng(2)
    n, k = 10_000, 5_000
    data = pd.DataFrame({"x": rng.normal(size=n), "g": rng.integers(0, k, n)})
    data["y"] = (data["x"] + rng.normal(size=n) > 0).astype(int)
    levels = data["g"].nunique()
    start = time.perf_counter()
    with pytest.raises(InputError, match=rf"column 'g' .* {levels} levels.*{MAX_FACTOR_LEVELS} levels.*\(1 \| g\)"):
        vbsvm.svm("y ~ x + C(g)", data)
    assert time.perf_counter() - start < 30  # refused before any design is built (a fit would take hours)
    text = data.assign(g=data["g"].astype(str))
    with pytest.raises(InputError, match=r"column 'g'.*pd\.get_dummies"):
        vbsvm.svm("y ~ .", text)
    # the suggested random effect is accepted
    assert build_design("y ~ x + (1 | g)", data).groups[0].n_levels == levels


def test_a_factor_below_the_limit_is_built():
    rng = np.random.default_rng(3)
    data = pd.DataFrame({"x": rng.normal(size=300), "g": rng.integers(0, 50, 300), "y": rng.integers(0, 2, 300)})
    assert build_design("y ~ x + C(g)", data).p == 2 + data["g"].nunique() - 1


# --------------------------------------------------------------------------- Dask partitions
@pytest.mark.parametrize("verify_meta", [True, False])
def test_a_dask_partition_whose_dtype_differs_from_the_meta_is_named(df, verify_meta):
    dask = pytest.importorskip("dask")
    dd = pytest.importorskip("dask.dataframe")
    first, second = df.iloc[:75], df.iloc[75:].copy()
    second["x"] = second["x"].astype(object)
    second.loc[second.index[3], "x"] = "oops"
    data = dd.from_delayed([dask.delayed(first), dask.delayed(second)], meta=first.iloc[:0], verify_meta=verify_meta)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(InputError, match=r"'x'.*float64.*dd\.to_numeric\(data\['x'\], errors='coerce'\)"):
            vbsvm.svm("y ~ x + z", data, method="meanfield")
