"""Formula -> design: patsy compatibility, random intercepts, response coding, standardization,
missing values and new data."""

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.exceptions import FormulaError, InputError, InputTypeError

patsy = pytest.importorskip("patsy", reason="patsy is the formula oracle in the 'test' extra")


@pytest.fixture
def frame():
    rng = np.random.default_rng(0)
    n = 60
    return pd.DataFrame({
        "y": rng.integers(0, 2, n),
        "x1": rng.normal(size=n),
        "x2": rng.uniform(1, 5, n),
        "sex": rng.choice(["female", "male"], n),
        "arm": rng.choice(["a", "b", "c"], n),
        "g": rng.integers(0, 6, n),
        "h": rng.choice(["s1", "s2", "s3"], n),
    })


@pytest.mark.parametrize("rhs", [
    "x1 + x2",
    "x1 + C(sex)",
    "x1 * C(arm)",
    "np.log(x2) + I(x1 ** 2)",
    "x1 + x2 + x1:x2",
    "C(arm) + C(sex) - 1",
    "x1 + np.exp(x1 / 3) + C(arm, Treatment('b'))",
])
def test_design_matches_patsy(frame, rhs):
    d = build_design(f"y ~ {rhs}", frame, standardize=False)
    ref = patsy.dmatrix(rhs, frame, return_type="dataframe")
    assert d.X.shape == ref.shape
    # same column space and same values column by column (names differ in spelling only)
    ref_sorted = np.sort(ref.to_numpy(), axis=0)
    ours_sorted = np.sort(d.X, axis=0)
    cols_ref = sorted(map(tuple, ref_sorted.T.round(10)))
    cols_ours = sorted(map(tuple, ours_sorted.T.round(10)))
    assert cols_ref == cols_ours


def test_dot_expands_to_all_other_columns(frame):
    d = build_design("y ~ . + (1 | g)", frame, standardize=False)
    assert "x1" in d.column_names and "x2" in d.column_names
    assert not any(c.startswith("g") for c in d.column_names)  # grouping column excluded
    assert [g.name for g in d.groups] == ["g"]


def test_several_random_intercepts(frame):
    d = build_design("y ~ x1 + (1 | g) + (1|h)", frame)
    assert [g.name for g in d.groups] == ["g", "h"]
    assert d.groups[0].n_levels == frame["g"].nunique()
    np.testing.assert_array_equal(d.groups[1].levels[d.groups[1].codes], frame["h"].to_numpy())


def test_random_effect_terms_follow_lme4():
    """(x | g) is (1 + x | g); || splits a term; a/b nests; a:b is the interaction factor."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"y": rng.integers(0, 2, 60), "x": rng.normal(size=60),
                       "a": np.repeat(["p", "q", "r"], 20), "b": np.tile([1, 2], 30)})
    d = build_design("y ~ x + (x | a) + (1 | b/a) + (0 + x || b)", df)
    assert [(g.name, g.columns) for g in d.groups] == [
        ("a", ["Intercept", "x"]), ("b", ["Intercept"]), ("b:a", ["Intercept"]), ("b_x", ["x"])]
    np.testing.assert_array_equal(d.groups[0].Z[:, 1], df["x"].to_numpy())
    assert d.groups[2].n_levels == 6 and d.groups[2].levels[0] == "1:p"
    assert d.column_names == ["Intercept", "x"]
    with pytest.raises(FormulaError, match="twice"):
        build_design("y ~ x + (x | a) + (1 | a)", df)


@pytest.mark.parametrize("values,pos", [
    ([0, 1], 1), ([-1, 1], 1), ([False, True], True), (["no", "yes"], "yes"), (["spam", "nonspam"], "spam"),
])
def test_response_coding(values, pos):
    df = pd.DataFrame({"y": np.array(values * 5, dtype=object if isinstance(values[0], str) else None),
                       "x": np.arange(10.0)})
    d = build_design("y ~ x", df)
    assert d.positive_level == pos
    np.testing.assert_array_equal(d.y == 1, df["y"].to_numpy() == pos)


def test_categorical_response_uses_category_order():
    df = pd.DataFrame({"y": pd.Categorical(["b", "a"] * 5, categories=["b", "a"]), "x": np.arange(10.0)})
    assert build_design("y ~ x", df).positive_level == "a"


def test_standardization_and_back_transform(frame):
    d = build_design("y ~ x1 + x2", frame)
    np.testing.assert_allclose(d.X[:, 1:].mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(d.X[:, 1:].std(0, ddof=1), 1)
    raw = build_design("y ~ x1 + x2", frame, standardize=False).X
    beta_std = np.array([0.3, -1.0, 2.0])
    np.testing.assert_allclose(raw @ (d.to_original() @ beta_std), d.X @ beta_std)


def test_missing_drop_raise_impute(frame):
    df = frame.copy()
    df.loc[[1, 5, 7], "x2"] = np.nan
    d = build_design("y ~ x1 + x2", df)
    assert d.n == len(df) - 3 and d.n_dropped == 3
    with pytest.raises(InputError, match="x2"):
        build_design("y ~ x1 + x2", df, missing="raise")
    d = build_design("y ~ x1 + np.log(x2)", df, missing="impute")
    assert d.n == len(df) and d.missing_mask[:, 2].sum() == 3


def test_missing_categorical_is_taken_from_raw_columns(frame):
    df = frame.copy()
    df.loc[[2, 3], "sex"] = None
    d = build_design("y ~ x1 + C(sex)", df)
    assert d.n_dropped == 2
    with pytest.raises(InputError, match="categorical predictor 'sex'"):
        build_design("y ~ x1 + C(sex)", df, missing="impute")


def test_new_data_rebuilds_design_and_flags_unseen(frame):
    d = build_design("y ~ x1 + C(arm) + (1 | g)", frame)
    new = frame.iloc[:5].copy()
    np.testing.assert_allclose(d.new_X(new), d.X[:5])
    new.loc[new.index[0], "g"] = 999
    with pytest.warns(vbsvm.exceptions.DiagnosticWarning, match="not seen"):
        terms = d.new_random_effects(new)
    assert terms[0][0][0] == -1
    np.testing.assert_array_equal(terms[0][1], np.ones((5, 1)))
    bad = frame.iloc[:3].copy()
    bad["arm"] = "zzz"
    with pytest.raises(InputError, match="not seen in the training data"):
        d.new_X(bad)
    with pytest.raises(InputError, match="lacks the column"):
        d.new_X(frame[["x1"]])


def test_caller_frame_not_modified(frame):
    before = pd.util.hash_pandas_object(frame).sum()
    build_design("y ~ . + (1 | g)", frame)
    assert pd.util.hash_pandas_object(frame).sum() == before


@pytest.mark.parametrize("formula,data_fn,exc,match", [
    ("y ~ x1", lambda f: f.assign(y=np.arange(len(f)) % 3), InputError, "exactly two distinct"),
    ("y ~ x1", lambda f: f.assign(y=1), InputError, "exactly two distinct"),
    ("y ~ x1", lambda f: f.assign(y=f["y"].where(f.index > 2)), InputError, "missing value"),
    ("y ~ x1 + xx2", lambda f: f, FormulaError, "did you mean 'x2'"),
    ("yy ~ x1", lambda f: f, FormulaError, "response 'yy'"),
    ("y ~ x1 + (1 | gg)", lambda f: f, FormulaError, "grouping column 'gg'"),
    ("y ~ x1 + ", lambda f: f, FormulaError, "cannot parse"),
    ("y x1", lambda f: f, FormulaError, "exactly one '~'"),
    ("y ~ x1 + const", lambda f: f.assign(const=3.0), InputError, "constant"),
    ("y ~ x1", lambda f: f.iloc[:0], InputError, "no rows"),
    ("y ~ np.log(x1)", lambda f: f.assign(x1=0.0 * f["x1"] + np.r_[0.0, np.ones(len(f) - 1)]), InputError, "infinite"),
    ("y ~ x1", lambda f: f.assign(y=f["y"] * 2.0 + 3), InputError, "0/1"),
])
def test_bad_input(frame, formula, data_fn, exc, match):
    with pytest.raises(exc, match=match):
        build_design(formula, data_fn(frame))


def test_wrong_types():
    with pytest.raises(InputTypeError, match="DataFrame"):
        build_design("y ~ x", np.zeros((3, 2)))
    with pytest.raises(InputTypeError, match="formula must be a string"):
        build_design(3, pd.DataFrame({"y": [0, 1]}))


def test_new_data_with_infinite_values_names_the_design_columns(frame):
    d = build_design("y ~ x1 + np.log(x2) + C(sex)", frame)
    new = frame.head(5).copy()
    new.loc[new.index[1], "x2"] = 0.0  # log(0) = -inf
    new.loc[new.index[3], "x1"] = np.inf
    with pytest.raises(InputError, match=r"\['x1', 'np.log\(x2\)'\] \(in 2 row\(s\)\)"):
        d.new_X(new)
    assert np.isfinite(d.new_X(frame.head(5))).all()


def test_incomplete_rows_of_new_data(frame):
    d = build_design("y ~ x1 + C(sex) + (1 | g)", frame, missing="impute")
    new = frame.head(4).copy()
    new.loc[new.index[0], "x1"] = np.nan    # numeric fixed effect: an imputing model fills it
    new.loc[new.index[1], "sex"] = None     # categorical: never imputed
    new.loc[new.index[2], "g"] = np.nan     # grouping column
    new.loc[new.index[3], "y"] = np.nan     # the response is not needed to predict
    np.testing.assert_array_equal(d.incomplete_rows(new), [True, True, True, False])
    np.testing.assert_array_equal(d.incomplete_rows(new, imputable=True), [False, True, True, False])


def test_linear_separability_of_the_complete_rows():
    """Separable (the label is the sign of x1), not separable (two identical rows with opposite
    labels), the same after dropping the offending row with a missing value under
    missing='impute' (incomplete rows do not count), and None above the size limit."""
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=40), rng.normal(size=40)
    df = pd.DataFrame({"y": np.where(x1 > 0, 1, -1), "x1": x1, "x2": x2})
    assert build_design("y ~ x1 + x2", df).linearly_separable() is True
    clash = pd.concat([df, pd.DataFrame({"y": [1, -1], "x1": [0.5, 0.5], "x2": [0.0, 0.0]})], ignore_index=True)
    assert build_design("y ~ x1 + x2", clash).linearly_separable() is False
    clash.loc[clash.index[-1], "x2"] = np.nan
    assert build_design("y ~ x1 + x2", clash, missing="impute").linearly_separable() is True
    assert build_design("y ~ x1 + x2", df).linearly_separable(max_size=10) is None
