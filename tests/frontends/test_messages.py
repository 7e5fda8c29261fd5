"""Error and warning messages name the argument or column and the fix."""

import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm import cli
from vbsvm.exceptions import DiagnosticWarning, FormulaError, InputError, InputTypeError
from support.fits import map_fit


@pytest.fixture(scope="module")
def df():
    rng = np.random.default_rng(3)
    n = 80
    out = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n), "k": rng.choice([1, 2, 3], n),
                        "a": rng.choice(list("uvw"), n), "b": rng.choice(list("pq"), n)})
    out["y"] = (out["x"] + rng.normal(size=n) > 0).astype(int)
    return out


def test_non_pandas_frame_names_its_type_and_to_pandas():
    class DataFrame:  # stands in for polars.DataFrame (polars is not a dependency)
        def to_pandas(self):
            raise AssertionError("vbsvm must not convert silently")

    DataFrame.__module__ = "polars.dataframe.frame"
    with pytest.raises(InputTypeError, match=r"got polars\.DataFrame; convert it with data\.to_pandas\(\)"):
        vbsvm.svm("y ~ x", DataFrame())
    with pytest.raises(InputTypeError, match=r"got numpy\.ndarray; wrap arrays as pandas\.DataFrame"):
        vbsvm.svm("y ~ x", np.zeros((3, 2)))


def test_name_with_a_space_gets_a_plain_message_with_the_backquote_fix(df):
    data = df.rename(columns={"x": "my x"})
    with pytest.raises(FormulaError) as info:
        vbsvm.svm("y ~ my x", data)
    msg = str(info.value)
    assert "\x1b" not in msg and "\n" not in msg
    assert "`my x`" in msg and "Backquote" in msg
    assert map_fit("y ~ `my x`", data).coef.index.tolist() == ["Intercept", "my x"]


def test_nested_grouping_is_read_as_two_terms(df):
    fit = map_fit("y ~ x + (1 | a/b)", df)
    assert list(fit.layout.groups) == ["a", "a:b"]


def test_unseen_level_of_a_numeric_column_in_C_names_the_column_not_formulaic(df):
    fit = map_fit("y ~ x + C(k)", df)
    new = df.head(3).copy()
    new.loc[new.index[0], "k"] = 7
    with pytest.raises(InputError) as info:
        fit.predict(new)
    msg = str(info.value)
    assert "'k'" in msg and "[7]" in msg and "known: [1, 2, 3]" in msg
    assert "cast to nan" not in msg


def test_date_columns_are_refused_with_a_conversion(df):
    data = df.assign(when=pd.date_range("2020-01-01", periods=len(df)))
    with pytest.raises(InputTypeError, match=r"\['when'\] hold dates.*\.dt\.days"):
        vbsvm.svm("y ~ x + when", data)
    with pytest.raises(InputTypeError, match="when"):
        vbsvm.svm("y ~ .", data)


@pytest.mark.parametrize("factor", [1e200, 1e-200])
def test_huge_or_tiny_units_are_not_called_dependent(df, factor):
    data = df.assign(z=df["z"] * factor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DiagnosticWarning, no overflow RuntimeWarning
        fit = vbsvm.svm("y ~ x + z", data, method="map", penalty=1.0)
    ref = map_fit("y ~ x + z", df)
    np.testing.assert_allclose(fit.coef.loc["z", "mean"] * factor, ref.coef.loc["z", "mean"], rtol=1e-6)
    np.testing.assert_allclose(fit.coef.loc["x", "mean"], ref.coef.loc["x", "mean"], rtol=1e-6)


def test_a_truly_duplicated_column_is_still_found_whatever_its_units(df):
    data = df.assign(z=df["x"] * 1e200)
    with pytest.warns(DiagnosticWarning, match=r"linearly dependent"):
        vbsvm.svm("y ~ x + z", data, method="map", penalty=1.0)


def test_compare_of_different_formulas_names_the_missing_column_not_newdata(df):
    small = map_fit("y ~ x", df[["y", "x"]])
    big = map_fit("y ~ x + z", df)
    with pytest.warns(DiagnosticWarning, match="different formulas"):
        cmp = vbsvm.compare(small, big)
    with pytest.raises(InputError) as info:
        cmp.predictions()
    msg = str(info.value)
    assert "['z']" in msg and "predictions(data=frame)" in msg and "newdata" not in msg
    text = cmp.to_text()
    assert "(not available: fit 'map_2' uses column(s) ['z']" in text
    assert cmp.predictions(data=df).shape[0] == 2


def test_linear_response_limit_does_not_suggest_an_option_the_cli_lacks(df, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("vbsvm.posterior.linear_response"), "MAX_N", 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        mf = vbsvm.svm("y ~ x", df, method="meanfield")
        cmp = vbsvm.compare(map_fit("y ~ x", df), mf)  # the first fit is the reference
    with pytest.warns(DiagnosticWarning) as record:
        table = cmp.table()
    msg = " ".join(str(w.message) for w in record)
    assert "skipped above 10 rows" in msg and "vbsvm.linear_response(fit, max_n=...)" in msg
    assert "Pass a larger max_n" not in msg
    assert not any(c.endswith("_sd_lr") for c in table.columns)


def test_cli_inclusion_plot_of_fits_without_inclusion_fails_before_printing(df, tmp_path, capsys):
    paths = []
    for name, method in (("a.nc", "map"), ("b.nc", "meanfield")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DiagnosticWarning)
            fit = vbsvm.svm("y ~ x", df[["y", "x"]], method=method, penalty=1.0)
        fit.save(tmp_path / name)
        paths.append(str(tmp_path / name))
    code = cli.main(["compare", *paths, "--inclusion", str(tmp_path / "inc.png")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "--inclusion" in err and "--prior laplace-zero" in err
    assert not (tmp_path / "inc.png").exists()
