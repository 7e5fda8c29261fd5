"""The settings of a fit: one frozen, typed object, checked by the constraint tables of
:mod:`vbsvm.settings`, recorded in the fit unchanged and stored in fit files as before."""

import dataclasses
import json
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import vbsvm
from vbsvm.exceptions import FitFileError, InputError, InputTypeError
from vbsvm.fitting.builders import fit_design
from vbsvm.fitting.svm import fit_settings
from vbsvm.formula.design import build_design
from vbsvm.inference import dispatch
from vbsvm.inference.gibbs import GibbsResult
from vbsvm.io.fit_file import add_checksum
from vbsvm.settings import (
    FIT_CONSTRAINTS,
    GP_CONSTRAINTS,
    FitSettings,
    FrozenMapping,
    GPSettings,
    Integer,
    validate,
)

FORMULA = "y ~ x + z"

#: the keys of the settings JSON a fit file stores, in order (``prior`` only with a prior)
STORED_KEYS = ["formula", "method", "approximation", "penalty", "missing", "standardize", "draws", "max_draws", "tune",
               "chains", "thin", "seed", "draw_seed", "tol", "max_iter", "sigma2_beta", "A_u", "B_u", "level",
               "accelerate", "progress", "n_jobs", "sigma2_mu", "nu", "imputation", "Psi", "re_df", "checkpoint",
               "re_scale"]


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"x": rng.normal(size=60), "z": rng.normal(size=60)})
    df["y"] = np.where(df.x - 0.5 * df.z + 0.7 * rng.normal(size=60) > 0, "yes", "no")
    return df


def _fit(frame, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vbsvm.svm(FORMULA, frame, **kw)


# --------------------------------------------------------------------------- frozen
def test_settings_cannot_be_changed():
    s = fit_settings(FORMULA, seed=1, Psi=[[1.0, 0.2], [0.2, 1.0]]).replace(vb_completions=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.draws = 10
    with pytest.raises(TypeError):
        s["draws"] = 10
    with pytest.raises(TypeError):
        del s["draws"]
    for method in ("update", "setdefault", "pop", "clear"):
        assert not hasattr(s, method)
    with pytest.raises(TypeError):
        s.options["vb_completions"] = 1
    with pytest.raises(TypeError):
        s.options.extra = 1
    with pytest.raises(TypeError):
        s.Psi[0][0] = 5.0  # nested values are tuples
    assert s.Psi == ((1.0, 0.2), (0.2, 1.0)) and s["vb_completions"] == 3


def test_a_change_is_a_new_checked_object():
    s = fit_settings(FORMULA, seed=1)
    t = dataclasses.replace(s, draws=50)
    assert (s.draws, t.draws) == (1000, 50) and s == fit_settings(FORMULA, seed=1)
    u = s.replace(chains=2, cut_svm_sweeps=3)
    assert u.chains == 2 and u.options == {"cut_svm_sweeps": 3} and s.options == {}
    with pytest.raises(InputError, match="chains must be an integer >= 1"):
        dataclasses.replace(s, chains=0)
    with pytest.raises(InputError, match="options may not set the field 'draws'"):
        FitSettings(formula=FORMULA, method="vb", options={"draws": 3})


def test_a_fit_records_the_checked_settings_it_was_given(frame):
    kw = dict(method="meanfield", seed=4, draws=30, chains=2, level=0.9, penalty=0.5)
    fit = _fit(frame, **kw)
    given = fit_settings(FORMULA, **kw)
    assert isinstance(fit.settings, FitSettings) and fit.settings == given
    prior = vbsvm.LaplaceZero(rho=0.3)
    lz = _fit(frame, method="meanfield", seed=4, prior=prior)
    assert lz.settings == fit_settings(FORMULA, method="meanfield", seed=4, prior=prior).replace(
        prior=prior.to_dict())  # the builder records the prior's description
    assert lz.settings["prior"]["rho"] == 0.3 and "prior" not in fit.settings


def test_an_interrupted_gibbs_run_records_the_kept_shape_in_a_new_object(frame, monkeypatch):
    """The dispatch never writes into the settings it is given: the fit of an interrupted run gets
    a new object with the chains and draws kept."""
    real = dispatch.run_chains

    def interrupted(model, **kw):
        res = real(model, **kw)
        return GibbsResult(draws={k: v[:1, :7] for k, v in res.draws.items()}, seconds=res.seconds, chains=1,
                           n_draws=7, tune=res.tune, thin=res.thin, interrupted=True, requested=res.requested,
                           max_draws=res.max_draws)

    monkeypatch.setattr(dispatch, "run_chains", interrupted)
    settings = fit_settings(FORMULA, method="gibbs", draws=20, tune=10, chains=2, seed=1, progress=False)
    before = pickle.dumps(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_design(build_design(FORMULA, frame), settings)
    assert pickle.dumps(settings) == before
    assert (settings.chains, settings.draws) == (2, 20)
    assert (fit.settings.chains, fit.settings.draws) == (1, 7) and fit.info["interrupted"]
    assert fit.settings == settings.replace(chains=1, draws=7)


# --------------------------------------------------------------------------- the constraint table
#: a wrong value of every field, the error and the message (what today's messages say)
BAD = {
    "formula": (3, InputTypeError, r"formula must be a string such as 'y ~ x1 \+ x2', got int"),
    "method": ("ep", InputError, r"method must be one of \('vb', 'meanfield', 'gibbs', 'map'\); got 'ep'"),
    "approximation": ("laplace", InputError, r"approximation must be one of"),
    "level": (1.5, InputError, r"level must be in \(0, 1\), e\.g\. 0\.95; got 1\.5"),
    "draws": (0, InputError, r"draws must be an integer >= 1, got 0"),
    "max_draws": (0, InputError, r"max_draws must be an integer >= 1, got 0"),
    "penalty": (-1.0, InputError, r"penalty must be a positive finite number"),
    "missing": ("zap", InputError, r"missing must be one of \('drop', 'raise', 'impute'\), got 'zap'"),
    "standardize": ("yes", InputTypeError, r"standardize must be True or False"),
    "tune": (-1, InputError, r"tune must be an integer >= 0, got -1"),
    "chains": (0, InputError, r"chains must be an integer >= 1"),
    "thin": (2.0, InputTypeError, r"thin must be an integer >= 1"),
    "seed": (-1, InputTypeError, r"seed must be a non-negative integer or None, got -1"),
    "draw_seed": ("abc", InputTypeError, r"draw_seed must be a non-negative integer or None"),
    "tol": (0.0, InputError, r"tol must be a positive finite number"),
    "max_iter": (0, InputError, r"max_iter must be an integer >= 1"),
    "sigma2_beta": (-1.0, InputError, r"sigma2_beta must be a positive finite number"),
    "A_u": (0.0, InputError, r"A_u must be a positive finite number"),
    "B_u": ("0.01", InputTypeError, r"B_u must be a positive number, got '0\.01'"),
    "accelerate": (None, InputTypeError, r"accelerate must be True or False"),
    "progress": ("no", InputTypeError, r"progress must be True or False"),
    "n_jobs": (0, InputError, r"n_jobs must be an integer >= 1"),
    "imputation": ("em", InputError, r"imputation must be 'conditional' \(default: .*'joint' \(the paper's model\); "
                                     r"got 'em'"),
    "sigma2_mu": (0, InputError, r"sigma2_mu must be a positive finite number"),
    "nu": (float("nan"), InputError, r"nu must be a positive finite number"),
    "Psi": ("abc", InputTypeError, r"Psi must be a number or a matrix of numbers"),
    "re_df": (0, InputError, r"re_df must be a positive finite number"),
    "checkpoint": (12, InputTypeError, r"checkpoint must be a path"),
    "re_scale": ([["a"]], InputTypeError, r"re_scale must be a matrix of numbers"),
    "prior": ("lasso", InputTypeError, r"prior must be a dict with string keys"),
}


def test_every_field_has_constraints_and_a_bad_value_here():
    fields = [f.name for f in dataclasses.fields(FitSettings) if f.name != "options"]
    assert sorted(FIT_CONSTRAINTS) == sorted(fields) == sorted(BAD)
    gp = [f.name for f in dataclasses.fields(GPSettings) if f.name != "options"]
    assert sorted(GP_CONSTRAINTS) == sorted(gp)


@pytest.mark.parametrize("name", list(BAD))
def test_a_wrong_value_of_each_field_raises_the_documented_error(name):
    value, error, match = BAD[name]
    good = FitSettings(formula=FORMULA, method="vb")
    with pytest.raises(error, match=match):
        FitSettings(**{**{"formula": FORMULA, "method": "vb"}, name: value})
    with pytest.raises(error, match=match):
        dataclasses.replace(good, **{name: value})
    with pytest.raises(error, match=match):  # a file's settings, a dict: the same checks
        FitSettings.from_mapping({**good.to_dict(), name: value})


@pytest.mark.parametrize("name", ["method", "level", "draws", "max_draws", "penalty", "tune", "seed", "tol",
                                  "B_u", "imputation", "re_df", "standardize"])
def test_svm_raises_the_same_error_before_reading_the_data(name):
    value, error, match = BAD[name]
    with pytest.raises(error, match=match):
        vbsvm.svm(FORMULA, None, **{name: value})  # the data (None) would fail later


def test_max_draws_below_draws_is_refused_as_an_argument_not_in_a_record(frame):
    with pytest.raises(InputError, match=r"max_draws must be at least draws = 1000 \(max_draws=draws switches"):
        vbsvm.svm(FORMULA, frame, method="gibbs", max_draws=500)
    with pytest.raises(InputError, match=r"max_draws must be at least draws = 1000 \(max_draws=draws switches"):
        fit_settings(FORMULA, max_draws=500)
    # a record's draws are those kept, or the shape of the VB draws (compare redraws in its shape)
    assert fit_settings(FORMULA, max_draws=2000).replace(draws=4000).draws == 4000


def test_the_table_drives_the_checks(monkeypatch):
    assert FitSettings(formula=FORMULA, method="vb", draws=3).draws == 3
    monkeypatch.setitem(FIT_CONSTRAINTS, "draws", (Integer(minimum=5),))
    with pytest.raises(InputError, match="draws must be an integer >= 5"):
        FitSettings(formula=FORMULA, method="vb", draws=3)
    assert validate({"draws": np.int64(7), "other": "kept"}, FIT_CONSTRAINTS) == {"draws": 7, "other": "kept"}
    assert type(validate({"tol": np.float32(0.5)}, FIT_CONSTRAINTS)["tol"]) is float


@pytest.mark.parametrize("kw, error, match", [
    ({"batch_size": 0}, InputError, "batch_size must be an integer >= 1"),
    ({"seed": -2}, InputTypeError, "seed must be a non-negative integer or None"),
    ({"optimize": "yes"}, InputTypeError, "optimize must be True or False"),
    ({"tune": -1}, InputError, "tune must be an integer >= 0"),
    ({"thin": 0}, InputError, "thin must be an integer >= 1"),
    ({"n_inducing": 0}, InputError, "n_inducing must be an integer >= 1"),
    ({"draws": 40, "max_draws": 20}, InputError, "max_draws must be at least draws = 40"),
])
def test_gpsvm_arguments_are_checked_by_the_gp_table(frame, kw, error, match):
    with pytest.raises(error, match=match):
        vbsvm.gpsvm(FORMULA, frame, method="vb", progress=False, **kw)


# --------------------------------------------------------------------------- mapping and files
def test_the_mapping_reads_as_the_dict_did():
    s = fit_settings(FORMULA, seed=2)
    assert list(s) == STORED_KEYS and list(s.to_dict()) == STORED_KEYS
    assert s["method"] == "vb" and s["approximation"] == "calibrated" and s.get("level", 0.5) == 0.95
    assert s.get("prior") is None and "prior" not in s and s.get("vb_completions", 20) == 20
    with pytest.raises(KeyError):
        s["prior"]
    assert FitSettings.from_mapping(dict(s)) == s
    assert pickle.loads(pickle.dumps(s)) == s and hash(s) == hash(pickle.loads(pickle.dumps(s)))
    mf = fit_settings(FORMULA, method="meanfield")
    assert (mf.method, mf.approximation) == ("vb", "meanfield")


def test_a_fit_file_stores_the_same_json_and_loads_the_frozen_settings(frame, tmp_path):
    fit = _fit(frame, method="meanfield", seed=5, Psi=[[1, 0], [0, 1]], checkpoint=tmp_path / "ck")
    path = tmp_path / "fit.nc"
    fit.save(path)
    stored = xr.open_datatree(path, engine="h5netcdf").attrs["settings"]
    assert list(json.loads(stored)) == STORED_KEYS
    assert json.loads(stored) == {**fit.settings.to_dict(), "checkpoint": str(tmp_path / "ck"),
                                  "Psi": [[1.0, 0.0], [0.0, 1.0]]}
    back = vbsvm.load(path)
    assert isinstance(back.settings, FitSettings) and back.settings == fit.settings
    assert back.to_arviz().attrs["settings"] == stored


def _rewrite_settings(src, dst, change):
    """Copy the fit file ``src`` to ``dst`` with its stored settings changed by ``change``."""
    tree = xr.open_datatree(src, engine="h5netcdf")
    tree.load()
    settings = json.loads(tree.attrs["settings"])
    change(settings)
    tree.attrs["settings"] = json.dumps(settings)
    tree.to_netcdf(dst, engine="h5netcdf")
    add_checksum(dst)  # as the vbsvm that wrote such a file would have


@pytest.mark.slow
def test_older_and_newer_files_load(frame, tmp_path):
    fit = _fit(frame, method="meanfield", seed=5)
    fit.save(tmp_path / "fit.nc")
    # an older file without the keys added later: their defaults, which the readers assumed
    _rewrite_settings(tmp_path / "fit.nc", tmp_path / "old.nc",
                      lambda s: [s.pop(k) for k in ("max_draws", "imputation", "checkpoint", "re_df", "re_scale")])
    old = vbsvm.load(tmp_path / "old.nc")
    assert old.settings == fit.settings
    # a newer file with a key this version does not know: kept, and saved back
    _rewrite_settings(tmp_path / "fit.nc", tmp_path / "new.nc", lambda s: s.update(future={"a": [1, 2]}))
    new = vbsvm.load(tmp_path / "new.nc")
    assert new.settings.options == {"future": {"a": (1, 2)}} and new.settings["future"]["a"] == (1, 2)
    new.save(tmp_path / "again.nc")
    assert json.loads(xr.open_datatree(tmp_path / "again.nc", engine="h5netcdf").attrs["settings"])["future"] == \
        {"a": [1, 2]}
    np.testing.assert_array_equal(new.coef["mean"], fit.coef["mean"])


def test_a_file_whose_settings_fail_the_table_is_refused(frame, tmp_path):
    _fit(frame, method="meanfield", seed=5).save(tmp_path / "fit.nc")
    _rewrite_settings(tmp_path / "fit.nc", tmp_path / "bad.nc", lambda s: s.update(approximation="laplace"))
    with pytest.raises(FitFileError, match="approximation must be one of"):
        vbsvm.load(tmp_path / "bad.nc")


def test_gp_settings_are_frozen_and_round_trip(frame, tmp_path):
    fit = vbsvm.gpsvm(FORMULA, frame, method="gibbs", n_inducing=6, draws=20, tune=10, chains=2, seed=1,
                      progress=False, max_draws=20)
    s = fit.settings
    assert isinstance(s, GPSettings) and s["draws_requested"] == 20 and s.extension_rounds == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.chains = 3
    assert fit.with_draw_shape(1, 5) is fit  # a sampled fit keeps its draws
    fit.save(tmp_path / "gp.nc")
    back = vbsvm.load(tmp_path / "gp.nc")
    assert back.settings == s
    meta = json.loads(xr.open_datatree(tmp_path / "gp.nc", engine="h5netcdf").attrs["vbsvm_gp_meta"])
    assert list(meta["settings"]) == ["kernel", "n_inducing", "inducing", "batch_size", "optimize", "step", "seed",
                                      "tune", "chains", "thin", "n_jobs", "streaming", "draws_requested", "draws",
                                      "max_draws", "draws_extended", "extension_rounds"]
    svi = vbsvm.gpsvm(FORMULA, frame, method="vb", n_inducing=6, seed=1, progress=False)
    assert "draws_requested" not in svi.settings and list(svi.settings)[-1] == "draws"
    reshaped = svi.with_draw_shape(1, 5)
    assert reshaped.settings.draws == 5 and svi.settings.draws != 5 and isinstance(reshaped.settings, GPSettings)


def test_frozen_mapping_is_a_read_only_value():
    m = FrozenMapping({"a": [1, {"b": 2}]})
    assert m == {"a": (1, {"b": 2})} and isinstance(m["a"][1], FrozenMapping)
    assert pickle.loads(pickle.dumps(m)) == m and hash(m) == hash(FrozenMapping({"a": (1, {"b": 2})}))
