"""Saved fits never run code and never leave a file behind them broken or open.

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
import shutil
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
from support.frames import mixed_frame
from support.processes import watched_fifo

import vbsvm
import vbsvm.io.fit_file
from vbsvm.exceptions import FitFileError, FormulaError, InputError, InputTypeError
from vbsvm.formula.safety import MAX_FORMULA_LENGTH, check_formula

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    """A saved VB fit (random intercept, categorical, transform), a Gibbs fit and a GP fit."""
    root = tmp_path_factory.mktemp("good")
    df = mixed_frame()
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
@pytest.mark.slow
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
@pytest.mark.slow
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
    df = mixed_frame(80, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.gpsvm("y ~ x + np.log(z) + poly(x, 2)", df, n_inducing=6, seed=2)
    fit.save(tmp_path / "gp.nc")
    tree = open_tree(tmp_path / "gp.nc")
    assert json.loads(tree.attrs["design"])["spec"]["formulaic"]["formula"].startswith("1 + x")
    back = vbsvm.load(tmp_path / "gp.nc")
    np.testing.assert_allclose(back.predict(df, kind="prob"), fit.predict(df, kind="prob"))


def test_save_refuses_a_formula_load_would_refuse(tmp_path):
    df = mixed_frame()
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
    df = mixed_frame()
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


@pytest.mark.slow
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
    mixed_frame().to_csv(tmp_path / "d.csv", index=False)
    code = cli.main(["fit", f"@{tmp_path / 'formula.txt'}", str(tmp_path / "d.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "np.savetxt" in err and "is refused" in err
    assert not sentinel.exists()
    (tmp_path / "ok.txt").write_text("y ~ x +\n np.log(z)\n")
    assert cli.main(["fit", f"@{tmp_path / 'ok.txt'}", str(tmp_path / "d.csv")]) == 0


@pytest.mark.parametrize("formula", ["y ~ C(b)", "y ~ x + (1 | b)"])
def test_boolean_columns_load_back(formula, tmp_path):
    # found by the fuzz suite: xarray decodes the stored int8 + dtype='bool' column itself
    df = mixed_frame()
    df["b"] = df["x"] > 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm(formula, df, seed=1)
    fit.save(tmp_path / "b.nc")
    back = vbsvm.load(tmp_path / "b.nc")
    assert back.design.column_names == fit.design.column_names
    np.testing.assert_array_equal(back.predict(df), fit.predict(df))


# ----------------------------------------------------------------------------- bounded reads
# Files crafted with h5py from the good ones: every read of another file, unbounded read,
# invalid number and hang is refused with a FitFileError naming what is wrong.
@pytest.fixture(scope="module")
def selection_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("selection") / "sel.nc"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vbsvm.svm("y ~ x + z + s", mixed_frame(), prior=vbsvm.LaplaceZero(rho=0.3), seed=1).save(path)
    return path


def edited(good, path, edit):
    """A copy of ``good`` at ``path`` changed in place by ``edit(h5py.File)``."""
    shutil.copyfile(good, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def refused(path, *needles):
    """Load ``path``; assert a FitFileError naming the file and each of ``needles``."""
    with pytest.raises(FitFileError) as info:
        vbsvm.load(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message
    return message


def replace_dataset(f, name, **create):
    del f[name]
    f.create_dataset(name, **create)


def test_external_storage_is_refused_and_not_read(good_files, tmp_path):
    _, paths, _ = good_files
    fifo = tmp_path / "watched.fifo"
    with watched_fifo(fifo) as opened:
        for target in (fifo, "/etc/passwd"):
            path = edited(paths["vb"], tmp_path / "external.nc", lambda f, target=target: replace_dataset(
                f, "vbsvm/theta_mean", shape=(8,), dtype="f8", external=[(str(target), 0, 64)]))
            refused(path, "vbsvm/theta_mean", "external file")
        time.sleep(0.05)
        assert not opened()


def test_virtual_datasets_and_links_are_refused_and_not_followed(good_files, tmp_path):
    _, paths, _ = good_files

    def virtual(target):
        def edit(f):
            layout = h5py.VirtualLayout(shape=(8,), dtype="f8")
            layout[:] = h5py.VirtualSource(str(target), "x", shape=(8,))
            del f["vbsvm/theta_mean"]
            f.create_virtual_dataset("vbsvm/theta_mean", layout, fillvalue=0.0)
        return edit

    def link(kind, target):
        def edit(f):
            del f["vbsvm/theta_mean"]
            f["vbsvm/theta_mean"] = h5py.ExternalLink(str(target), "/x") if kind == "external" else \
                h5py.SoftLink("/vbsvm/theta_var")
        return edit

    fifo = tmp_path / "watched.fifo"
    with watched_fifo(fifo) as opened:
        refused(edited(paths["vb"], tmp_path / "virtual.nc", virtual(fifo)), "vbsvm/theta_mean", "virtual")
        refused(edited(paths["vb"], tmp_path / "elink.nc", link("external", fifo)), "theta_mean", "external link")
        refused(edited(paths["vb"], tmp_path / "slink.nc", link("soft", None)), "theta_mean", "soft link")
        whole = edited(paths["vb"], tmp_path / "egroup.nc", lambda f: (
            f.__delitem__("observed_data"), f.__setitem__("observed_data", h5py.ExternalLink(str(fifo), "/"))))
        refused(whole, "observed_data", "external link")
        time.sleep(0.05)
        assert not opened()


@pytest.mark.parametrize("name,shape", [("vbsvm/theta_draws", (4, 50_000, 1000)),
                                        ("posterior/sigma2_u", (4, 50_000_000)),
                                        ("constant_data/x", (150_000_000,))])
def test_huge_declared_shapes_are_refused_before_reading(good_files, tmp_path, name, shape):
    _, paths, _ = good_files
    path = edited(paths["vb"], tmp_path / "huge.nc", lambda f: replace_dataset(
        f, name, shape=shape, dtype="f8", compression="gzip", chunks=(1,) * (len(shape) - 1) + (1000,)))
    assert path.stat().st_size < 2 << 20  # the data is a fill value: nothing is stored
    start = time.monotonic()
    refused(path, name, "declare")
    stats = vbsvm.io.fit_file.LAST_READ
    assert stats.reader_peak_rss is not None and stats.reader_peak_rss < 200 << 20
    assert time.monotonic() - start < stats.time_limit


def test_only_regular_files_of_bounded_size_are_opened(tmp_path):
    refused("/dev/zero", "device")
    fifo = tmp_path / "fifo.nc"
    os.mkfifo(fifo)
    start = time.monotonic()
    refused(fifo, "FIFO")
    assert time.monotonic() - start < 5
    sparse = tmp_path / "sparse.nc"
    try:
        with open(sparse, "wb") as f:
            f.truncate(20 << 30)  # 20 GB, no blocks
    except OSError:
        pytest.skip("this file system has no sparse files")
    refused(sparse, "more than a fit file may have")
    link = tmp_path / "link.nc"
    link.symlink_to("/dev/zero")
    refused(link, "device")


def test_cli_compare_refuses_a_fifo(good_files, tmp_path, capsys):
    from vbsvm import cli

    _, paths, _ = good_files
    fifo = tmp_path / "fifo.nc"
    os.mkfifo(fifo)
    assert cli.main(["compare", str(fifo), str(paths["vb"])]) != 0
    assert "FIFO" in capsys.readouterr().err


def _set(name, index, value):
    def edit(f):
        data = f[name][()]
        data[index] = value
        f[name][...] = data
    return edit


def _json_attr(name, change):
    def edit(f):
        value = json.loads(f.attrs[name])
        change(value)
        f.attrs[name] = json.dumps(value)
    return edit


INVALID_NUMBERS = {
    "NaN theta_mean": ("vb", _set("vbsvm/theta_mean", 0, np.nan), ("vbsvm", "'theta_mean'", "non-finite")),
    "NaN draws": ("gibbs", _set("vbsvm/theta_draws", (0, 3, 1), np.nan), ("'theta_draws'", "non-finite")),
    "infinite theta_var": ("vb", _set("vbsvm/theta_var", 2, np.inf), ("'theta_var'", "non-finite")),
    "negative theta_var": ("vb", _set("vbsvm/theta_var", 2, -1.0), ("'theta_var'", "negative")),
    "zero var_scale": ("vb", _set("vbsvm/var_scale", 0, 0.0), ("'var_scale'", "<= 0")),
    "negative sigma2 draws": ("gibbs", _set("vbsvm/sigma2_draws", (1, 2, 0), -0.5), ("'sigma2_draws'", "negative")),
    "scale_factor NaN": ("vb", lambda f: f["vbsvm/theta_mean"].attrs.__setitem__("scale_factor", np.nan),
                         ("'theta_mean'", "scale_factor")),
    "add_offset": ("gp", lambda f: f["vbsvm_state/shift"].attrs.__setitem__("add_offset", 1.0),
                   ("'shift'", "add_offset")),
    "infinite GP shift": ("gp", _set("vbsvm_state/shift", 1, np.inf), ("'shift'", "non-finite")),
    "GP precision not positive": ("gp", _set("vbsvm_state/prec", (0, 0), -1.0), ("'prec'", "diagonal")),
    "group index 100": ("vb", _json_attr("layout", lambda v: v["groups"]["g"][1].__setitem__(0, 100)),
                        ("'layout'", "indices of group 'g'")),
    "linear relabelled selection": ("vb", lambda f: f.attrs.__setitem__("vbsvm_fit_type", "selection"),
                                    ("selection fit", "'sel_index'")),
    "selection relabelled linear": ("sel", lambda f: f.attrs.__setitem__("vbsvm_fit_type", "linear"),
                                    ("linear fit", "another kind of fit", "sel_index")),
    "selectable index out of range": ("sel", _set("vbsvm/sel_index", 0, 40), ("'sel_index'", "outside the 4 fixed")),
    "inclusion probability 1.5": ("sel", _set("vbsvm/q_gamma", 1, 1.5), ("'q_gamma'", "outside [0, 1]")),
    "NaN calibration": ("vb", _json_attr("info", lambda v: v.__setitem__("prob_calibration", [float("nan"), 0.0])),
                        ("'prob_calibration'",)),
    "NaN in settings": ("vb", _json_attr("settings", lambda v: v.__setitem__("tol", float("nan"))),
                        ("'settings'", "non-finite")),
    "response 0": ("vb", _set("observed_data/y", 4, 0.0), ("'y'", "-1 or +1")),
    "integer column 0.5": ("vb", _set("constant_data/y", 0, 0.5), ("'y'", "not integers")),
    "shape lie": ("vb", lambda f: replace_dataset(f, "vbsvm/theta_mean", data=np.zeros(5)), ("'theta_mean'", "(5,)")),
    "dtype lie": ("gibbs", lambda f: replace_dataset(f, "vbsvm/theta_draws", data=np.zeros((2, 30, 3), np.int32)),
                  ("'theta_draws'", "int32")),
    "value edited": ("vb", _set("vbsvm/theta_mean", 0, 0.123), ("checksum", "damaged or edited")),
    "checksum removed": ("vb", lambda f: f.attrs.__delitem__("vbsvm_checksum"), ("'vbsvm_checksum'",)),
}


@pytest.mark.parametrize("case", sorted(INVALID_NUMBERS))
def test_invalid_numbers_and_contents_are_refused(case, good_files, selection_file, tmp_path):
    _, paths, _ = good_files
    kind, edit, needles = INVALID_NUMBERS[case]
    good = selection_file if kind == "sel" else paths[kind]
    refused(edited(good, tmp_path / "crafted.nc", edit), *needles)


def test_a_file_that_hangs_libhdf5_is_refused_within_the_time_limit(good_files, tmp_path, monkeypatch):
    # 64 zero bytes in the global heap of a Gibbs fit make libhdf5 loop, not interruptibly
    _, paths, _ = good_files
    data = bytearray(paths["gibbs"].read_bytes())
    at = data.find(b"GCOL") + 1034
    data[at:at + 64] = bytes(64)
    path = tmp_path / "hangs.nc"
    path.write_bytes(bytes(data))
    monkeypatch.setattr(vbsvm.io.fit_file, "READ_SECONDS", 8.0)
    start = time.monotonic()
    refused(path, "took longer than 8 s")
    assert vbsvm.io.fit_file.LAST_READ.timed_out
    assert time.monotonic() - start < 8.0 + 10
    with open(path, "r+b"):  # nothing holds it
        pass


@pytest.mark.slow
def test_read_tree_is_what_xarray_reads(good_files, selection_file):
    """The groups a fit is rebuilt from are decoded as xarray decodes them: same variables,
    dims, dtypes, attributes and values (so valid files load as before)."""
    import io

    _, paths, _ = good_files
    for path in [*paths.values(), selection_file]:
        kind, tree = vbsvm.io.fit_file.read_fit_file(path)
        ref = xr.open_datatree(io.BytesIO(path.read_bytes()), engine="h5netcdf")
        ref.load()
        assert dict(tree.attrs) == dict(ref.attrs)
        for group in vbsvm.io.fit_file.READ_GROUPS[kind]:
            ours, theirs = tree[group].to_dataset(), ref[group].to_dataset()
            assert set(ours.variables) == set(theirs.variables) and set(ours.coords) == set(theirs.coords)
            for name, var in theirs.variables.items():
                mine = ours[name].variable
                assert (mine.dims, mine.dtype, mine.attrs) == (var.dims, var.dtype, var.attrs), (group, name)
                np.testing.assert_array_equal(mine.values, var.values)
