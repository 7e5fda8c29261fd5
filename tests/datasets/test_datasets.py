"""Tests of vbsvm.datasets: the shipped data files, the loaders and the simulators.

Everything here reads the package's own files (the top-level ``data/`` of a checkout, or
``vbsvm/datasets/data`` of an installed wheel) or files the test writes itself; nothing outside
the repository is needed. ``.ci/run`` runs this file once more against an installed wheel.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vbsvm import datasets
from vbsvm.datasets import (DataFormatError, DataNotFoundError, UnknownDatasetError, available, load,
                            loaders, simulate_grouped, simulate_mcar, simulate_luts, simulate_sparse,
                            snake_case)

ENV = "VBSVM_DATA"
BUNDLED = loaders._bundled_dir()
FOLDERS = ("acath", "raetsch", "spam", "toenail", "usps")

# A row of the "Files" table of a PROVENANCE.md: | `name.csv[.gz]` | rows | columns | `sha256` | ...
_FILE_ROW = re.compile(r"^\| `([\w.]+\.csv(?:\.gz)?)` \| (\d+) \| (\d+) \| `([0-9a-f]{64})` \|", re.M)


def _recorded_files() -> dict[str, tuple[int, int, str]]:
    """``"<folder>/<file>"`` -> (rows, columns, sha256) for every file the PROVENANCE.md files list."""
    recorded = {}
    for folder in FOLDERS:
        text = BUNDLED.joinpath(folder, "PROVENANCE.md").read_text(encoding="utf-8")
        for file, rows, cols, sha in _FILE_ROW.findall(text):
            recorded[f"{folder}/{file}"] = (int(rows), int(cols), sha)
    return recorded


RECORDED = _recorded_files()
SHIPPED = sorted(key for key in RECORDED if key.endswith(".csv.gz"))


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    """Tests see the shipped data unless they set VBSVM_DATA themselves."""
    monkeypatch.delenv(ENV, raising=False)


def _in_bundle(source: str) -> bool:
    return Path(source).is_relative_to(Path(str(BUNDLED)))


def _fake_titanic(directory: Path, value: float) -> Path:
    """A 24 x 4 file in the raetsch/titanic.csv layout, x1 constant = value."""
    path = directory / "raetsch" / "titanic.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame({"x1": value, "x2": 0.0, "x3": 0.0, "y": np.tile([-1, 1], 12)})
    df.to_csv(path, index=False)
    return path


# ---------------------------------------------------------------- shipped files


def test_every_folder_has_its_provenance():
    folders = sorted(p.name for p in BUNDLED.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert folders == list(FOLDERS)
    for folder in FOLDERS:
        text = BUNDLED.joinpath(folder, "PROVENANCE.md").read_text(encoding="utf-8")
        assert re.search(r"^##.*licen", text, re.M | re.I) and "sha256" in text, folder
        listed = [key for key in RECORDED if key.startswith(folder + "/")]
        assert listed, f"{folder}/PROVENANCE.md lists no file"
        if folder == "usps":
            assert "not shipped" in text.lower()
        else:
            assert "gzip -9n" in text, folder


def test_shipped_files_are_exactly_the_recorded_ones():
    present = sorted(
        f"{folder.name}/{f.name}"
        for folder in BUNDLED.iterdir() if folder.is_dir()
        for f in folder.iterdir() if f.name != "PROVENANCE.md"
    )
    assert present == SHIPPED
    assert len(SHIPPED) == 17  # toenail, 2 spam, acath, 13 Rätsch files


@pytest.mark.parametrize("key", SHIPPED)
def test_shipped_file_matches_provenance(key):
    rows, cols, sha = RECORDED[key]
    raw = gzip.decompress(BUNDLED.joinpath(*key.split("/")).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == sha
    lines = raw.decode("utf-8").split("\n")
    assert lines[-1] == "" and "\r" not in raw.decode("utf-8")
    assert len(lines) - 2 == rows and len(lines[0].split(",")) == cols


def test_bundled_dir_resolution(tmp_path):
    package, checkout = tmp_path / "site" / "vbsvm" / "datasets" / "data", tmp_path / "repo"
    # A source checkout (pyproject.toml and data/ beside the package) is used when the package has no data.
    (checkout / "data").mkdir(parents=True)
    assert loaders._bundled_dir(package, checkout) == package  # not a checkout yet: no pyproject.toml
    (checkout / "pyproject.toml").touch()
    assert loaders._bundled_dir(package, checkout) == checkout / "data"
    # An installed package's own data win.
    package.mkdir(parents=True)
    assert loaders._bundled_dir(package, checkout) == package


# ---------------------------------------------------------------- loading the shipped sets

SHAPES = {
    "toenail": (1908, 7),
    "spam": (4601, 58),
    "acath": (3504, 6),
    "usps": (1540, 260),
    "raetsch/banana": (5300, 3),
    "raetsch/breast_cancer": (263, 10),
    "raetsch/diabetis": (768, 9),
    "raetsch/flare_solar": (144, 10),
    "raetsch/german": (1000, 21),
    "raetsch/heart": (270, 14),
    "raetsch/image": (2086, 19),
    "raetsch/splice": (2991, 61),
    "raetsch/thyroid": (215, 6),
    "raetsch/titanic": (24, 4),
    "raetsch/waveform": (5000, 22),
    "raetsch/ringnorm": (7400, 21),
    "raetsch/twonorm": (7400, 21),
    "raetsch/ringnorm_delve_raw": (7400, 21),
    "raetsch/twonorm_delve_raw": (7400, 21),
}

# (-1, +1) counts, as recorded in data/raetsch/PROVENANCE.md.
LABEL_COUNTS = {
    "breast_cancer": (186, 77),
    "diabetis": (500, 268),
    "flare_solar": (50, 94),
    "german": (700, 300),
    "heart": (150, 120),
    "image": (898, 1188),
    "splice": (1647, 1344),
    "thyroid": (150, 65),
    "titanic": (10, 14),
    "waveform": (3353, 1647),
    "banana": (2924, 2376),
}


def test_available_lists_every_name():
    assert available() == sorted(SHAPES)
    assert datasets.available is available


@pytest.mark.parametrize("name", sorted(set(SHAPES) - {"usps"}))
def test_shipped_shapes(name):
    df = load(name)
    assert df.shape == SHAPES[name]
    assert df.attrs["dataset"] == name
    assert _in_bundle(df.attrs["source"]) and df.attrs["source"].endswith(".csv.gz")


def test_toenail():
    df = load("toenail")
    assert list(df.columns) == [
        "patient_id", "outcome", "treatment", "time", "visit", "y", "terbinafine",
    ]
    assert df["patient_id"].nunique() == 294
    assert int(df["y"].sum()) == 408
    assert set(df["outcome"]) == {"none or mild", "moderate or severe"}
    assert (df["y"] == (df["outcome"] == "moderate or severe")).all()
    assert (df["terbinafine"] == (df["treatment"] == "terbinafine")).all()
    assert df["visit"].value_counts().sort_index().tolist() == [294, 288, 283, 272, 263, 244, 264]
    assert df["time"].min() == 0.0 and df["time"].max() == pytest.approx(18.5, abs=0.1)
    assert not df.isna().any().any()


@pytest.mark.parametrize("short", sorted(LABEL_COUNTS))
def test_raetsch_columns_and_labels(short):
    df = load(f"raetsch/{short}")
    d = df.shape[1] - 1
    assert list(df.columns) == [f"x{j + 1}" for j in range(d)] + ["y"]
    counts = df["y"].value_counts()
    assert set(counts.index) == {-1, 1}
    assert (counts[-1], counts[1]) == LABEL_COUNTS[short]


def test_spam():
    df = load("spam")
    assert df.shape == (4601, 58) and df.columns[-1] == "type"
    assert df["type"].value_counts().to_dict() == {"nonspam": 2788, "spam": 1813}
    test = load("spam", split="test")
    train = load("spam", split="train")
    assert len(test) == 1536 and len(train) == 3065
    assert (test["type"] == "spam").sum() == 595
    assert test.index.union(train.index).equals(df.index)
    pd.testing.assert_frame_equal(test, df.loc[test.index], check_like=False)
    for new in ["char_exclamation", "char_dollar", "capital_ave", "capital_long",
                "capital_total", "num3d", "make"]:
        assert new in df.columns
    assert not any(c != c.lower() or "." in c for c in df.columns)
    assert not df.isna().any().any()


def test_acath_missing_values_stay_nan():
    df = load("acath")
    assert list(df.columns) == ["sex", "age", "cad_dur", "choleste", "sigdz", "tvdlm"]
    assert df.isna().sum().to_dict() == {
        "sex": 0, "age": 0, "cad_dur": 0, "choleste": 1246, "sigdz": 0, "tvdlm": 3,
    }
    assert df["sigdz"].value_counts().to_dict() == {1: 2334, 0: 1170}


@pytest.mark.parametrize("short", ["ringnorm", "twonorm"])
def test_delve_conversion_matches_direct_computation(short):
    packed = BUNDLED.joinpath("raetsch", f"{short}_delve_raw.csv.gz").read_bytes()
    raw = np.loadtxt(io.BytesIO(gzip.decompress(packed)), delimiter=",", skiprows=1)
    x, y01 = raw[:, :-1], raw[:, -1]
    expected_x = (x - x.mean(axis=0)) / x.std(axis=0, ddof=1)
    expected_y = np.where(y01 == 0, 1, -1)

    df = load(f"raetsch/{short}")
    assert list(df.columns) == [f"x{j}" for j in range(1, 21)] + ["y"]
    np.testing.assert_allclose(df.drop(columns="y").to_numpy(), expected_x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(df["y"].to_numpy(), expected_y)
    assert df["y"].dtype == np.int64
    np.testing.assert_allclose(df.drop(columns="y").std(ddof=1).to_numpy(), 1.0, atol=1e-12)

    rawdf = load(f"raetsch/{short}_delve_raw")
    assert rawdf.columns[-1] == "y01"
    np.testing.assert_array_equal(rawdf.to_numpy(), raw)


# ---------------------------------------------------------------- usps (not shipped)


def _fake_usps(directory: Path) -> None:
    """Both USPS files in the layout load() expects, the original split gzip-compressed."""
    (directory / "usps").mkdir(parents=True)
    for stem, n_train, suffix in [("usps_3vs5_resampled", 767, ".csv"),
                                  ("usps_3vs5_original_split", 1214, ".csv.gz")]:
        digit = np.tile([3, 5], 770)
        df = pd.DataFrame({"split": np.where(np.arange(1540) < n_train, "train", "test"),
                           "orig_index": np.arange(1, 1541), "digit": digit,
                           "y": np.where(digit == 3, 1, -1)})
        pixels = pd.DataFrame(np.linspace(-1, 1, 1540 * 256).reshape(1540, 256),
                              columns=[f"p{j}" for j in range(1, 257)])
        pd.concat([df, pixels], axis=1).to_csv(directory / "usps" / (stem + suffix), index=False)


@pytest.mark.slow
def test_usps_splits(tmp_path):
    _fake_usps(tmp_path)
    res = load("usps", data_home=tmp_path)
    orig = load("usps", data_home=tmp_path, split="original")
    assert res.attrs["split"] == "resampled" and orig.attrs["split"] == "original"
    assert orig.attrs["source"].endswith("usps_3vs5_original_split.csv.gz")
    assert res["split"].value_counts().to_dict() == {"test": 773, "train": 767}
    assert orig["split"].value_counts().to_dict() == {"train": 1214, "test": 326}
    for df in (res, orig):
        assert list(df.columns[:4]) == ["split", "orig_index", "digit", "y"]
        assert ((df["digit"] == 3) == (df["y"] == 1)).all()
        pix = df.loc[:, "p1":"p256"].to_numpy()
        assert pix.shape[1] == 256 and pix.min() >= -1.0 and pix.max() <= 1.0
    with pytest.raises(ValueError, match="split"):
        load("usps", data_home=tmp_path, split="bogus")
    with pytest.raises(ValueError, match="only to 'usps'"):
        load("toenail", split="original")


@pytest.mark.slow
def test_usps_not_shipped_error_says_where_to_look(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "env_dir"))
    with pytest.raises(DataNotFoundError) as info:
        load("usps")
    msg = str(info.value)
    assert "usps/usps_3vs5_resampled.csv" in msg and "usps/PROVENANCE.md" in msg
    assert str(tmp_path / "env_dir") in msg and str(BUNDLED) in msg
    assert ENV in msg and "data_home" in msg
    assert "shared" not in msg  # no directory outside the installed package
    # The environment variable is used once it holds the files.
    _fake_usps(tmp_path / "env_dir")
    assert load("usps").shape == (1540, 260)


# ---------------------------------------------------------------- directory resolution


def test_env_var_is_used(monkeypatch, tmp_path):
    _fake_titanic(tmp_path, 7.0)
    monkeypatch.setenv(ENV, str(tmp_path))
    df = load("raetsch/titanic")
    assert (df["x1"] == 7.0).all()
    assert Path(df.attrs["source"]) == tmp_path / "raetsch" / "titanic.csv"


def test_data_home_beats_env_var(monkeypatch, tmp_path):
    _fake_titanic(tmp_path / "env", 1.0)
    _fake_titanic(tmp_path / "arg", 2.0)
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert (load("raetsch/titanic", data_home=tmp_path / "arg")["x1"] == 2.0).all()
    assert (load("raetsch/titanic", data_home=str(tmp_path / "arg"))["x1"] == 2.0).all()


def test_env_var_falls_back_to_shipped_files(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "empty"))
    df = load("raetsch/titanic")
    assert _in_bundle(df.attrs["source"])
    assert df["x1"].nunique() > 1


def test_explicit_data_home_is_not_replaced(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        load("raetsch/titanic", data_home=tmp_path / "empty")
    msg = str(info.value)
    assert f"{tmp_path / 'empty'}  (data_home argument; directory does not exist" in msg
    assert "shipped with vbsvm;" not in msg  # the shipped copy was not searched


def test_data_home_reads_gzip_and_overrides_shipped_toenail(tmp_path):
    (tmp_path / "toenail").mkdir()
    src = load("toenail").rename(columns={"patient_id": "patientID"})
    src.loc[0, "time"] = 99.0
    src.to_csv(tmp_path / "toenail" / "toenail.csv.gz", index=False)
    df = load("toenail", data_home=tmp_path)
    assert df.loc[0, "time"] == 99.0 and "patient_id" in df.columns
    # A copy of the shipped tree works as a data directory and gives the same frame.
    (tmp_path / "raetsch").mkdir()
    (tmp_path / "raetsch" / "heart.csv.gz").write_bytes(BUNDLED.joinpath("raetsch", "heart.csv.gz").read_bytes())
    pd.testing.assert_frame_equal(load("raetsch/heart", data_home=tmp_path), load("raetsch/heart"),
                                  check_exact=True)


def test_missing_file_error(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        load("acath", data_home=tmp_path)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    msg = str(err)
    assert "acath/acath.csv" in msg and str(tmp_path) in msg and "no such file" in msg
    assert "load('acath') without data_home" in msg


def test_spam_needs_indicator_file(tmp_path):
    path = tmp_path / "spam" / "spam.csv"
    path.parent.mkdir()
    pd.DataFrame(np.zeros((4601, 58))).to_csv(path, index=False)
    assert load("spam", data_home=tmp_path).shape == (4601, 58)
    with pytest.raises(DataNotFoundError, match="spam_esl_traintest.csv"):
        load("spam", data_home=tmp_path, split="test")


def test_wrong_shape_is_reported(tmp_path):
    path = tmp_path / "raetsch" / "heart.csv"
    path.parent.mkdir()
    pd.DataFrame({"x1": [0.0, 1.0], "y": [-1, 1]}).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match="expected 270 x 14"):
        load("raetsch/heart", data_home=tmp_path)
    assert issubclass(DataFormatError, ValueError)


def test_unknown_name():
    with pytest.raises(UnknownDatasetError) as info:
        load("no_such_data")
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    for name in available():
        assert name in msg
    with pytest.raises(UnknownDatasetError, match="raetsch/banana"):
        load("banana")
    with pytest.raises(TypeError):
        load(3)


def test_name_is_case_insensitive():
    assert load(" Toenail ").shape == (1908, 7)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("patientID", "patient_id"),
        ("cad.dur", "cad_dur"),
        ("charExclamation", "char_exclamation"),
        ("charRoundbracket", "char_roundbracket"),
        ("capitalAve", "capital_ave"),
        ("num3d", "num3d"),
        ("num000", "num000"),
        ("choleste", "choleste"),
        ("orig_index", "orig_index"),
        ("y01", "y01"),
        ("HTMLFile", "html_file"),
        ("a..b", "a_b"),
    ],
)
def test_snake_case(old, new):
    assert snake_case(old) == new


# ---------------------------------------------------------------- simulators


def test_simulate_luts_shape_and_truth():
    df = simulate_luts(50, 4, seed=0)
    assert df.shape == (50, 5)
    assert list(df.columns) == ["y", "x1", "x2", "x3", "x4"]
    assert df["y"].dtype == np.int64 and set(df["y"]) <= {-1, 1}
    truth = df.attrs["truth"]
    assert isinstance(truth["intercept"], float)
    assert truth["coef"].shape == (4,)
    assert truth["names"] == ("x1", "x2", "x3", "x4")


def test_simulate_luts_reproducible():
    a = simulate_luts(100, 3, seed=42)
    b = simulate_luts(100, 3, seed=42)
    c = simulate_luts(100, 3, seed=43)
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs["truth"] == b.attrs["truth"]
    assert not np.allclose(a.to_numpy(), c.to_numpy())
    assert a.attrs["truth"] != c.attrs["truth"]
    # a Generator is accepted and advanced
    rng = np.random.default_rng(5)
    first, second = simulate_luts(20, 2, seed=rng), simulate_luts(20, 2, seed=rng)
    assert not np.allclose(first.to_numpy(), second.to_numpy())
    pd.testing.assert_frame_equal(first, simulate_luts(20, 2, seed=np.random.default_rng(5)))


def test_simulate_luts_test_set_shares_truth():
    train, test = simulate_luts(100, 3, seed=1, n_test=300)
    assert train.shape == (100, 4) and test.shape == (300, 4)
    assert train.attrs["truth"] == test.attrs["truth"]
    # the training set does not depend on n_test
    pd.testing.assert_frame_equal(train, simulate_luts(100, 3, seed=1))
    both = pd.concat([train, test], ignore_index=True)  # attrs comparison must not fail
    assert both.shape == (400, 4)


def test_simulate_luts_label_frequencies():
    df = simulate_luts(40_000, 3, seed=2024)
    truth = df.attrs["truth"]
    eta = truth["intercept"] + df[["x1", "x2", "x3"]].to_numpy() @ truth["coef"]
    prob = 1.0 / (1.0 + np.exp(-eta))
    positive = (df["y"] == 1).to_numpy()
    # overall rate and calibration in probability bins, within ~5 binomial sds
    assert abs(positive.mean() - prob.mean()) < 5 * np.sqrt(0.25 / len(df))
    bins = np.digitize(prob, [0.2, 0.4, 0.6, 0.8])
    for b in range(5):
        sel = bins == b
        if sel.sum() > 500:
            assert abs(positive[sel].mean() - prob[sel].mean()) < 5 * np.sqrt(0.25 / sel.sum())


@pytest.mark.parametrize(
    ("args", "exc"),
    [((0, 3), ValueError), ((10, 0), ValueError), ((10.5, 3), TypeError), ((True, 3), TypeError)],
)
def test_simulate_luts_validates(args, exc):
    with pytest.raises(exc):
        simulate_luts(*args)
    with pytest.raises(ValueError, match="n_test"):
        simulate_luts(10, 2, n_test=-1)


def test_simulate_sparse():
    df = simulate_sparse(300, 10, 3, seed=0, effect=2.0, intercept=0.5)
    assert df.shape == (300, 11)
    truth = df.attrs["truth"]
    np.testing.assert_array_equal(truth["coef"], [2.0, -2.0, 2.0] + [0.0] * 7)
    assert truth["support"] == ("x1", "x2", "x3") and truth["intercept"] == 0.5
    pd.testing.assert_frame_equal(df, simulate_sparse(300, 10, 3, seed=0, effect=2.0, intercept=0.5))
    assert not df.equals(simulate_sparse(300, 10, 3, seed=1, effect=2.0, intercept=0.5))

    shuffled = simulate_sparse(50, 30, 4, seed=3, shuffle=True, effect=[1.0, 2.0, 3.0, 4.0])
    t = shuffled.attrs["truth"]
    nz = np.flatnonzero(t["coef"])
    assert len(nz) == 4 and t["support"] == tuple(f"x{j + 1}" for j in nz)
    np.testing.assert_array_equal(t["coef"][nz], [1.0, 2.0, 3.0, 4.0])

    none = simulate_sparse(10, 5, 0, seed=0)
    assert not none.attrs["truth"]["coef"].any() and none.attrs["truth"]["support"] == ()
    with pytest.raises(ValueError, match="k must be <= p"):
        simulate_sparse(10, 3, 4)
    with pytest.raises(ValueError, match="effect"):
        simulate_sparse(10, 5, 2, effect=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="rho"):
        simulate_sparse(10, 5, 2, rho=1.0)


def test_simulate_sparse_correlation():
    df = simulate_sparse(20_000, 4, 1, seed=0, rho=0.6)
    corr = np.corrcoef(df[["x1", "x2", "x3", "x4"]].to_numpy(), rowvar=False)
    expected = 0.6 ** np.abs(np.subtract.outer(np.arange(4), np.arange(4)))
    np.testing.assert_allclose(corr, expected, atol=0.03)
    np.testing.assert_allclose(df[["x1", "x4"]].std().to_numpy(), 1.0, atol=0.03)


def test_simulate_grouped():
    df = simulate_grouped(40, 6, seed=0, sd_group=2.0)
    assert df.shape == (240, 4)
    assert list(df.columns) == ["y", "group", "time", "treatment"]
    assert set(df["y"]) <= {-1, 1} and df["y"].dtype == np.int64
    assert df["group"].nunique() == 40
    assert (df.groupby("group")["treatment"].nunique() == 1).all()
    assert df.groupby("group")["treatment"].first().sum() == 20
    assert df["time"].tolist()[:6] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    truth = df.attrs["truth"]
    assert truth["names"] == ("time", "treatment", "time:treatment")
    assert truth["group_effects"].shape == (40,) and truth["sd_group"] == 2.0
    pd.testing.assert_frame_equal(df, simulate_grouped(40, 6, seed=0, sd_group=2.0))
    assert not df.equals(simulate_grouped(40, 6, seed=1, sd_group=2.0))
    with pytest.raises(ValueError, match="sd_group"):
        simulate_grouped(5, 2, sd_group=-1.0)


def test_simulate_mcar():
    full, inc = simulate_mcar(20_000, seed=0, frac=0.3)
    assert list(full.columns) == ["y", "x1", "x2", "x3"] and set(full["y"]) <= {-1, 1}
    assert full.notna().all().all() and inc[["y", "x2", "x3"]].notna().all().all()
    miss = inc["x1"].isna()
    assert abs(miss.mean() - 0.3) < 0.01
    pd.testing.assert_frame_equal(inc[~miss], full[~miss])
    # MCAR: the deleted rows look like the kept ones (labels and the other predictors).
    assert abs(full.loc[miss, "y"].mean() - full.loc[~miss, "y"].mean()) < 0.05
    assert abs(full.loc[miss, "x2"].mean() - full.loc[~miss, "x2"].mean()) < 0.05
    corr = np.corrcoef(full[["x1", "x2", "x3"]].to_numpy(), rowvar=False)
    np.testing.assert_allclose(corr[np.triu_indices(3, 1)], [0.7, 0.5, 0.3], atol=0.02)
    assert full.attrs["truth"] == inc.attrs["truth"]
    np.testing.assert_array_equal(full.attrs["truth"]["coef"], [1.0, -0.8, 0.5])
    again = simulate_mcar(20_000, seed=0, frac=0.3)
    pd.testing.assert_frame_equal(inc, again[1])
    for bad, match in [({"frac": 1.5}, "frac"), ({"coef": (1.0, 2.0)}, "coef")]:
        with pytest.raises(ValueError, match=match):
            simulate_mcar(10, **bad)


def test_simulate_grouped_random_intercepts_matter():
    # With a large sd_group the share of positives varies far more between groups.
    flat = simulate_grouped(400, 20, seed=1, sd_group=0.0, beta_time=0.0,
                            beta_treatment=0.0, beta_interaction=0.0)
    spread = simulate_grouped(400, 20, seed=1, sd_group=3.0, beta_time=0.0,
                              beta_treatment=0.0, beta_interaction=0.0)
    rate = lambda d: (d["y"] == 1).groupby(d["group"]).mean().var()  # noqa: E731
    assert rate(spread) > 3 * rate(flat)
    assert not flat.attrs["truth"]["group_effects"].any()
