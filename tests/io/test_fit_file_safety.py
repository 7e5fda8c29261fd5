"""Saved fits never run code and never leave a file behind them broken or open (issue #15).

* A corpus of crafted fit files (code in the formula, a pickle in the GP design, wrong types in
  every attribute, damaged and foreign files, extra and nested groups): each is refused with
  ``FitFileError``, writes nothing, and can be reopened for writing right after the failed load.
* Good files of every fit type load back and predict the same.
* ``save`` is atomic: an error or a ``kill -9`` during a save over a good file leaves it loadable.
* The whitelist of :mod:`vbsvm.formula.safety` accepts the formula grammar and refuses code.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import vbsvm
from vbsvm.exceptions import FitFileError, FormulaError, InputError, InputTypeError
from vbsvm.formula.safety import MAX_FORMULA_LENGTH, check_formula

ROOT = Path(__file__).resolve().parents[2]


def frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.uniform(1, 2, n), "s": rng.choice(["a", "b"], n),
                       "g": rng.choice(list("pqr"), n)})
    df["y"] = (df["x"] + rng.normal(size=n) > 0).astype(int)
    return df


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    """A saved VB fit (random intercept, categorical, transform), a Gibbs fit and a GP fit."""
    root = tmp_path_factory.mktemp("good")
    df = frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = {
            "vb": vbsvm.svm("y ~ x + np.log(z) + C(s) + (1 | g)", df, seed=1),
            "gibbs": vbsvm.svm("y ~ x + z", df, method="gibbs", draws=30, tune=10, chains=2, seed=1,
                               progress=False),
            "gp": vbsvm.gpsvm("y ~ x + z", df, n_inducing=6, seed=1),
        }
    paths = {}
    for name, fit in fits.items():
        paths[name] = root / f"{name}.nc"
        fit.save(paths[name])
    return fits, paths, df


# ----------------------------------------------------------------------------- crafting
def open_tree(path):
    with open(path, "rb") as f:
        import io

        tree = xr.open_datatree(io.BytesIO(f.read()), engine="h5netcdf")
    tree.load()
    return tree


def with_settings(**changes):
    def craft(tree):
        settings = json.loads(tree.attrs["settings"])
        settings.update(changes)
        tree.attrs["settings"] = json.dumps(settings)
    return craft


def with_attr(name, value):
    def craft(tree):
        tree.attrs[name] = value
    return craft


def with_design(edit):
    def craft(tree):
        design = json.loads(tree.attrs["design"])
        edit(design)
        tree.attrs["design"] = json.dumps(design)
    return craft


def with_group(path, dataset):
    def craft(tree):
        tree[path] = xr.DataTree(dataset)
    return craft


def with_var(group, name, transform):
    def craft(tree):
        ds = tree[group].to_dataset()
        ds[name] = transform(ds[name])
        tree[group] = xr.DataTree(ds)
    return craft


def without_group(name):
    def craft(tree):
        del tree[name]
    return craft


def malicious_pickle(sentinel):
    """Pickle bytes that create ``sentinel`` when unpickled (built by hand: nothing runs here)."""
    return b"cbuiltins\nopen\n(V" + str(sentinel).encode() + b"\nVw\ntR."


def spec_formula(rhs):
    def edit(design):
        design["spec"] = {"formulaic": {"formula": rhs, "ensure_full_rank": True,
                                        "transform_state": {"map": []}, "encoder_state": []}}
    return edit


S = "{S}"  # replaced by the sentinel path of each test
FORMULA_ATTACKS = {
    "np.savetxt": f"y ~ x + I(np.savetxt('{S}', x) or x)",
    "dunder import": f"y ~ x + __import__('os').system('touch {S}')",
    "dunder chain": "y ~ x + I(x.__class__.__mro__[-1].__subclasses__())",
    "np.load pickle": f"y ~ x + I(np.load('{S}.npy', allow_pickle=True))",
    "pd.read_pickle": f"y ~ x + pd.read_pickle('{S}.pkl')",
    "np attribute chain": f"y ~ x + I(np.lib.npyio.savetxt('{S}', x))",
    "getattr": f"y ~ x + getattr(np, 'savetxt')('{S}', x)",
    "series method": f"y ~ x + I(x.to_csv('{S}') or x)",
    "lambda": f"y ~ x + I((lambda: open('{S}', 'w'))())",
    "comprehension": f"y ~ x + I([open('{S}', 'w') for _ in x])",
    "python block": f"y ~ x + {{open('{S}', 'w') and x}}",
    "eval": f"y ~ x + I(eval(\"open('{S}', 'w')\"))",
    "f-string": f"y ~ x + I(f\"{{open('{S}', 'w')}}\")",
    "in random-effect bar": f"y ~ x + (np.savetxt('{S}', x) | g)",
    "ufunc out": "y ~ x + np.exp(x, out=x)",
    "endless power": "y ~ x + I(9 ** 9 ** 9 ** 9)",
    "oversized formula": "y ~ x" + " + x" * MAX_FORMULA_LENGTH,
    "formula not text": 12345,
}

CORPUS = {f"formula: {k}": ("vb", with_settings(formula=v)) for k, v in FORMULA_ATTACKS.items()}
CORPUS.update({
    "GP design formula": ("gp", with_design(lambda d: d.update(formula=FORMULA_ATTACKS["np.savetxt"]))),
    "GP model formula": ("gp", with_design(spec_formula(f"1 + x + I(np.savetxt('{S}', x) or x)"))),
    "GP meta formula": ("gp", lambda t: t.attrs.update(vbsvm_gp_meta=json.dumps(
        dict(json.loads(t.attrs["vbsvm_gp_meta"]), formula=FORMULA_ATTACKS["lambda"])))),
    "GP design is an old-style pickle": ("gp", with_attr("design", "{P}")),
    "GP design array of objects": ("gp", with_design(lambda d: d.update(center={"array": ["a"], "dtype": "|O"}))),
    "GP design unknown tag": ("gp", with_design(lambda d: d.update(negative_level={"class": "os.system"}))),
    "settings not JSON": ("vb", with_attr("settings", "{{{")),
    "settings a JSON list": ("vb", with_attr("settings", "[1, 2]")),
    "settings deeply nested": ("vb", with_attr("settings", "[" * 100_000 + "]" * 100_000)),
    "settings oversized": ("vb", with_settings(padding="x" * 10_000_001)),
    "standardize not bool": ("vb", with_settings(standardize="yes")),
    "missing unknown": ("vb", with_settings(missing=5)),
    "draws negative": ("vb", with_settings(draws=-3)),
    "method mismatch": ("vb", with_settings(method="gibbs")),
    "method attribute a number": ("vb", with_attr("method", 5)),
    "layout a string": ("vb", with_attr("layout", '"x"')),
    "layout names not text": ("vb", lambda t: t.attrs.update(layout=json.dumps(
        dict(json.loads(t.attrs["layout"]), fixed=[1, 2, 3, 4])))),
    "info a list": ("vb", with_attr("info", "[1]")),
    "unknown fit type": ("vb", with_attr("vbsvm_fit_type", "pickle")),
    "fit type a number": ("vb", with_attr("vbsvm_fit_type", 1)),
    "GP meta wrong types": ("gp", lambda t: t.attrs.update(vbsvm_gp_meta=json.dumps(
        dict(json.loads(t.attrs["vbsvm_gp_meta"]), n_features="2")))),
    "data column dtype": ("vb", lambda t: t["constant_data"]["x"].attrs.update(dtype="V8")),
    "categories not JSON": ("vb", lambda t: t["constant_data"]["s"].attrs.update(dtype="category",
                                                                                 categories="{]")),
    "posterior of strings": ("vb", with_var("vbsvm", "theta_mean", lambda v: v.astype(str))),
    "posterior wrong length": ("vb", with_var("vbsvm", "theta_mean", lambda v: v[:2].rename(
        {"theta_mean_dim0": "short"}))),
    "stored data rebuild other columns": ("vb", with_var("constant_data", "s", lambda v: v.copy(data=np.full(v.shape, "a", dtype=object)))),
    "stored responses differ": ("vb", with_var("observed_data", "y", lambda v: -v)),
    "extra group": ("vb", with_group("evil", xr.Dataset({"a": ("i", [1.0])}))),
    "nested group": ("vb", with_group("posterior/evil", xr.Dataset({"a": ("i", [1.0])}))),
    "missing group": ("vb", without_group("constant_data")),
    "GP extra group": ("gp", with_group("payload", xr.Dataset({"a": ("i", [1.0])}))),
})


def write_crafted(good, craft, path, sentinel):
    tree = open_tree(good)
    text = str(sentinel)

    def fill(value):
        return value.replace(S, text).replace("{P}", base64.b64encode(malicious_pickle(sentinel)).decode())

    craft(tree)
    for name, value in list(tree.attrs.items()):
        if isinstance(value, str):
            tree.attrs[name] = fill(value)
    tree.to_netcdf(path, engine="h5netcdf")


def assert_refused_without_trace(path, directory, sentinel):
    before = sorted(os.listdir(directory))
    with pytest.raises(FitFileError) as info:
        vbsvm.load(path)
    assert str(path) in str(info.value)
    assert not Path(sentinel).exists()
    assert sorted(os.listdir(directory)) == before
    with h5py.File(path, "a"):  # not held open by the failed load
        pass
    with open(path, "r+b"):
        pass


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_crafted_file_is_refused_without_side_effects(case, good_files, tmp_path):
    _, paths, _ = good_files
    kind, craft = CORPUS[case]
    sentinel = tmp_path / "PWNED"
    path = tmp_path / "crafted.nc"
    write_crafted(paths[kind], craft, path, sentinel)
    # the payloads that would read a pickle find one
    Path(str(sentinel) + ".npy").write_bytes(malicious_pickle(sentinel))
    Path(str(sentinel) + ".pkl").write_bytes(malicious_pickle(sentinel))
    assert_refused_without_trace(path, tmp_path, sentinel)


DAMAGED = {
    "empty": lambda good: b"",
    "text": lambda good: b"y,x\n1,2\n",
    "signature only": lambda good: good[:8],
    "truncated to a half": lambda good: good[: len(good) // 2],
    "truncated by one byte": lambda good: good[:-1],
    "garbage after the signature": lambda good: good[:8] + bytes(range(256)) * 40,
    "flipped bytes in the middle": lambda good: good[:2000] + bytes(b ^ 0xFF for b in good[2000:4000]) + good[4000:],
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_file_is_refused(case, good_files, tmp_path):
    _, paths, _ = good_files
    path = tmp_path / "damaged.nc"
    path.write_bytes(DAMAGED[case](paths["vb"].read_bytes()))
    with pytest.raises(FitFileError, match="damaged.nc"):
        vbsvm.load(path)
    with open(path, "r+b"):
        pass


def test_foreign_netcdf_and_paths_are_refused(tmp_path):
    path = tmp_path / "foreign.nc"
    xr.Dataset({"a": ("i", np.arange(3.0))}).to_netcdf(path, engine="h5netcdf")
    with pytest.raises(FitFileError, match="not a vbsvm fit"):
        vbsvm.load(path)
    with h5py.File(path, "a"):
        pass
    with pytest.raises(FitFileError, match="no such file"):
        vbsvm.load(tmp_path / "missing.nc")
    with pytest.raises(FitFileError, match="directory"):
        vbsvm.load(tmp_path)
    with pytest.raises(InputTypeError, match="path must be a file name"):
        vbsvm.load(3)


def test_corpus_is_large_enough():
    assert len(CORPUS) + len(DAMAGED) + 1 >= 30


# ----------------------------------------------------------------------------- good files
def test_good_files_load_and_predict_the_same(good_files):
    fits, paths, df = good_files
    for name, fit in fits.items():
        back = vbsvm.load(paths[name])
        assert type(back) is type(fit)
        if name == "gp":
            X = np.random.default_rng(3).normal(size=(5, 2))
            np.testing.assert_allclose(back.predict(X, kind="score"), fit.predict(X, kind="score"))
        else:
            pd.testing.assert_frame_equal(back.coef, fit.coef)
            np.testing.assert_array_equal(back.predict(df), fit.predict(df))


def test_gp_design_round_trip_is_json_and_predicts_the_same(tmp_path):
    df = frame(80, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.gpsvm("y ~ x + np.log(z) + poly(x, 2)", df, n_inducing=6, seed=2)
    fit.save(tmp_path / "gp.nc")
    tree = open_tree(tmp_path / "gp.nc")
    assert json.loads(tree.attrs["design"])["spec"]["formulaic"]["formula"].startswith("1 + x")
    back = vbsvm.load(tmp_path / "gp.nc")
    np.testing.assert_allclose(back.predict(df, kind="prob"), fit.predict(df, kind="prob"))


def test_save_refuses_a_formula_load_would_refuse(tmp_path):
    df = frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x + np.cumsum(z)", df, seed=1)  # formulaic evaluates it, load would not
    with pytest.raises(FormulaError, match="np.cumsum"):
        fit.save(tmp_path / "cumsum.nc")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("column", [pd.Categorical([1, 2, 3] * 20), pd.Series([0, "a", 1.5] * 20, dtype=object),
                                    pd.Series(list(range(60)), dtype=object)], ids=["int categories", "mixed",
                                                                                    "object ints"])
def test_save_refuses_columns_that_would_not_load_back(column, tmp_path):
    df = frame()
    df["c"] = column
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x + c", df, seed=1)
    with pytest.raises(InputError, match="column 'c'.*astype\\(str\\)"):
        fit.save(tmp_path / "c.nc")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- atomic save
def test_failed_save_keeps_the_old_file_and_leaves_no_temporary(good_files, tmp_path, monkeypatch):
    fits, paths, _ = good_files
    path = tmp_path / "fit.nc"
    path.write_bytes(paths["vb"].read_bytes())

    def fail(self, target, **kwargs):
        Path(target).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(xr.DataTree, "to_netcdf", fail)
    with pytest.raises(KeyboardInterrupt):
        fits["gibbs"].save(path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["fit.nc"]
    assert vbsvm.load(path).method == "vb"


def test_save_errors_name_the_path(good_files, tmp_path):
    fits, _, _ = good_files
    with pytest.raises(InputError, match="does not exist"):
        fits["vb"].save(tmp_path / "no" / "such" / "dir" / "fit.nc")
    with pytest.raises(InputTypeError):
        fits["vb"].save(None)


KILLER = """
import sys, warnings
import vbsvm
warnings.simplefilter("ignore")
fit = vbsvm.load(sys.argv[1])
print("saving", flush=True)
while True:
    fit.save(sys.argv[2])
"""


def test_kill_9_during_save_leaves_the_good_file_loadable(good_files, tmp_path):
    _, paths, _ = good_files
    target = tmp_path / "fit.nc"
    target.write_bytes(paths["gibbs"].read_bytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (0.05, 0.13, 0.31, 0.47):
        proc = subprocess.Popen([sys.executable, "-c", KILLER, str(paths["vb"]), str(target)],
                                stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline().strip() == b"saving"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert vbsvm.load(target).method in ("vb", "gibbs")  # the old file or a complete new one


# ----------------------------------------------------------------------------- the whitelist
ACCEPTED = [
    "y ~ x + np.log(z) + C(s) + x:z + (1 | g) + (1 + x | g) + (0 + x | g) + (1 | a/b) + (1 | a:b) - 1",
    "y ~ .", "y ~ . - 1", "y ~ . + 0 + (1 | g)", "y ~ 1 + x",
    "y ~ I(x**2) + poly(x, 2) + bs(z, df=3) + center(x) + scale(x) + np.log1p(x) + np.sqrt(np.exp(x))",
    "y ~ C(s, levels=['a', 'b']) + C(s, contr.treatment('b')) + cad.dur + `my var` + Q('my var')",
    "`y y` ~ x * z + (x + z)**2 + I(x > 0) + I(x ** -1) + I(2 * x)",
    "y ~ x\n  + z", "y ~ C(s, contr.sum) + C(s, Treatment('b'))",
]
REFUSED = [
    "y ~ np", "y ~ np.savetxt", "y ~ x.__dict__", "y ~ x[0]", "y ~ I((z := 1))", "y ~ x if z else x",
    "y ~ np.log(*x)", "y ~ C(x, **{'a': 1})", "y ~ numpy.log(x)", "y ~ I('a' * 1000)", "y ~ I((1,) * 10)",
    "y ~ b'a'", "y ~ I(x @ x)", "y ~ x; import os", "y ~ x ~ z", "y x", "y ~ `x", "y ~ " + "(" * 300 + "x" + ")" * 300,
    "y ~ I('" + "a" * 2000 + "')", "y ~ " + "+".join(["x"] * 4900), "y ~ x # __import__('os')",
    # strings that end elsewhere for formulaic than for Python
    "y ~ I('a" + "\\" + "' + np.savetxt('S', x) + " + "\\" + "'')", "y ~ I(" + "'" * 3 + "a' + np.log(x) + 'b" + "'" * 3 + ")",
]


@pytest.mark.parametrize("formula", ACCEPTED)
def test_whitelist_accepts_the_formula_grammar(formula):
    assert check_formula(formula) == formula


@pytest.mark.parametrize("formula", REFUSED + [v for v in FORMULA_ATTACKS.values() if isinstance(v, str)])
def test_whitelist_refuses_code(formula):
    with pytest.raises(FormulaError):
        check_formula(formula)


def test_cli_checks_a_formula_from_a_file(tmp_path, capsys):
    from vbsvm import cli

    sentinel = tmp_path / "PWNED"
    (tmp_path / "formula.txt").write_text(FORMULA_ATTACKS["np.savetxt"].replace(S, str(sentinel)))
    frame().to_csv(tmp_path / "d.csv", index=False)
    code = cli.main(["fit", f"@{tmp_path / 'formula.txt'}", str(tmp_path / "d.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "np.savetxt" in err and "is refused" in err
    assert not sentinel.exists()
    (tmp_path / "ok.txt").write_text("y ~ x +\n np.log(z)\n")
    assert cli.main(["fit", f"@{tmp_path / 'ok.txt'}", str(tmp_path / "d.csv")]) == 0


@pytest.mark.parametrize("formula", ["y ~ C(b)", "y ~ x + (1 | b)"])
def test_boolean_columns_load_back(formula, tmp_path):
    # found by the fuzz suite: xarray decodes the stored int8 + dtype='bool' column itself
    df = frame()
    df["b"] = df["x"] > 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm(formula, df, seed=1)
    fit.save(tmp_path / "b.nc")
    back = vbsvm.load(tmp_path / "b.nc")
    assert back.design.column_names == fit.design.column_names
    np.testing.assert_array_equal(back.predict(df), fit.predict(df))
