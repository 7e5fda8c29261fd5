"""Bad-input suite: every wrong input raises an exception from :mod:`vbsvm.exceptions` whose
message names the argument or column at fault and says how to fix it, and the caller's objects
are never mutated (inputs are hashed before and after the call).

Each case is ``(id, thunk builder)``: the builder returns ``(callable, args, kwargs, exception
class, regex for the name, regex for the fix)``. ``FIX`` is the default fix regex: the message must
contain an instruction (``use``, ``pass``, ``drop``, ``remove``, ``recode``, ``must be``, ...).
"""

from __future__ import annotations

import copy
import os
import pickle
import re
import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.exceptions import FitFileError, FormulaError, InputError, InputTypeError, VbsvmError
from support.statistics import fingerprint

FIX = (r"(?i)\b(use|pass|drop|remove|recode|rename|must|should|give|choose|add|map|fill|filter|"
       r"transform|write|wrap|refit|leave|increase|set|lower|keep|one of|e\.g\.|expected|"
       r"instead|only|needs?|did you mean|the columns are)\b")


def _frame(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return pd.DataFrame({
        "y": np.where(x + rng.normal(size=n) > 0, "yes", "no"),
        "x": x,
        "z": rng.normal(size=n),
        "sex": pd.Categorical(rng.choice(["f", "m"], n)),
        "g": rng.integers(0, 4, n),
    })


DF = _frame()


def svm_case(formula="y ~ x + z", data=None, **kw):
    data = _frame() if data is None else data
    kw.setdefault("progress", False)
    return vbsvm.svm, (formula, data), kw


def _with(col, values, base=None):
    df = _frame() if base is None else base
    df = df.copy()
    df[col] = values
    return df


def _nan_at(col, i=3, value=np.nan):
    df = _frame()
    numeric = pd.api.types.is_numeric_dtype(df[col]) and not isinstance(df[col].dtype, pd.CategoricalDtype)
    df[col] = df[col].astype(float if numeric else object)
    df.loc[i, col] = value
    return df


# ------------------------------------------------------------------------------- svm(): data & formula
CASES = {
    "data_dict": lambda: (*svm_case(data=DF.to_dict("list")), InputTypeError, r"\bdata\b", FIX),
    "data_ndarray": lambda: (*svm_case(data=DF[["x", "z"]].to_numpy()), InputTypeError, r"\bdata\b", FIX),
    "data_none": lambda: (vbsvm.svm, ("y ~ x", None), {}, InputTypeError, r"\bdata\b", FIX),
    "data_series": lambda: (vbsvm.svm, ("y ~ x", DF["x"]), {}, InputTypeError, r"\bdata\b", FIX),
    "formula_int": lambda: (*svm_case(formula=3), InputTypeError, r"formula", FIX),
    "formula_none": lambda: (*svm_case(formula=None), InputTypeError, r"formula", FIX),
    "formula_list": lambda: (*svm_case(formula=["y", "x"]), InputTypeError, r"formula", FIX),
    "formula_no_tilde": lambda: (*svm_case(formula="y x"), FormulaError, r"~", FIX),
    "formula_two_tildes": lambda: (*svm_case(formula="y ~ x ~ z"), FormulaError, r"~", FIX),
    "formula_no_response": lambda: (*svm_case(formula=" ~ x"), FormulaError, r"response", FIX),
    "formula_syntax_error": lambda: (*svm_case(formula="y ~ x +* z"), FormulaError, r"formula", None),
    "formula_unbalanced_paren": lambda: (*svm_case(formula="y ~ (x + z"), FormulaError, r"formula", None),
    "formula_empty_rhs": lambda: (*svm_case(formula="y ~ 0"), FormulaError, r"formula|intercept", FIX),
    "unknown_predictor": lambda: (*svm_case(formula="y ~ x + nope"), FormulaError, r"nope", FIX),
    "unknown_predictor_typo": lambda: (*svm_case(formula="y ~ xx"), FormulaError, r"xx.*did you mean 'x'", None),
    "unknown_response": lambda: (*svm_case(formula="yy ~ x"), FormulaError, r"yy", FIX),
    "unknown_group": lambda: (*svm_case(formula="y ~ x + (1 | nope)"), FormulaError, r"nope", FIX),
    "random_term_one_sided": lambda: (*svm_case(formula="y ~ x + (x | )"), FormulaError, r"\(x \| \)", FIX),
    "duplicated_group_term": lambda: (*svm_case(formula="y ~ x + (1 | g) + (1 | g)"), FormulaError, r"\bg\b", None),
    "unknown_function": lambda: (*svm_case(formula="y ~ nofunc(x)"), FormulaError, r"nofunc", None),
    "empty_frame": lambda: (*svm_case(data=DF.iloc[:0]), InputError, r"\bdata\b|rows", FIX),
    "no_columns_frame": lambda: (*svm_case(data=pd.DataFrame(index=range(5))), FormulaError, r"\by\b", None),
    "nan_in_response": lambda: (*svm_case(data=_nan_at("y")), InputError, r"'y'", FIX),
    "none_in_response": lambda: (*svm_case(data=_nan_at("y", value=None)), InputError, r"'y'", FIX),
    "inf_in_predictor": lambda: (*svm_case(data=_nan_at("x", value=np.inf)), InputError, r"\bx\b", FIX),
    "minus_inf_in_predictor": lambda: (*svm_case(data=_nan_at("z", value=-np.inf)), InputError, r"\bz\b", FIX),
    "log_of_zero": lambda: (*svm_case(formula="y ~ np.log(x0)", data=_with("x0", np.r_[0.0, np.ones(39)])),
                            InputError, r"np\.log\(x0\)", FIX),
    "nan_predictor_missing_raise": lambda: (*svm_case(data=_nan_at("x"), missing="raise"), InputError, r"'x'", FIX),
    "all_rows_incomplete": lambda: (*svm_case(data=_with("x", np.nan)), InputError, r"rows|missing", FIX),
    "three_level_response": lambda: (*svm_case(data=_with("y", np.resize(["a", "b", "c"], 40))), InputError, r"'y'", FIX),
    "one_level_response": lambda: (*svm_case(data=_with("y", "a")), InputError, r"'y'", FIX),
    "numeric_response_0_2": lambda: (*svm_case(data=_with("y", np.resize([0, 2], 40))), InputError, r"'y'", FIX),
    "constant_predictor": lambda: (*svm_case(data=_with("z", 1.0)), InputError, r"'z'", FIX),
    "nan_in_group_impute": lambda: (*svm_case(formula="y ~ x + (1 | g)", data=_nan_at("g"), missing="impute"),
                                    InputError, r"'?g'?", FIX),
    "categorical_nan_impute": lambda: (*svm_case(formula="y ~ x + sex", data=_nan_at("sex", value=None), missing="impute"),
                                       InputError, r"sex", FIX),
    "impute_two_columns_of_one_variable": lambda: (*svm_case(formula="y ~ x + I(x**2)", data=_nan_at("x"), missing="impute"),
                                                   InputError, r"'x'", FIX),
    "complex_predictor": lambda: (*svm_case(data=_with("x", DF["x"] + 1j)), InputTypeError, r"'x'", FIX),
    "formula_python_code": lambda: (*svm_case(formula="y ~ __import__('os').system('echo hi')"), FormulaError,
                                    r"__import__", None),
    "formula_offset": lambda: (*svm_case(formula="y ~ x + offset(z)"), FormulaError, r"offset\(z\)", FIX),
    "formula_R_factor": lambda: (*svm_case(formula="y ~ x + factor(g)"), FormulaError, r"factor", r"C\(g\)"),
    "factor_with_too_many_levels": lambda: (*svm_case(formula="y ~ x + C(g)", data=_with("g", np.arange(1200), _frame(1200))),
                                            InputError, r"'g'", r"\(1 \| g\)"),
    # ----------------------------------------------------------------------- svm(): arguments
    "method_unknown": lambda: (*svm_case(method="ep"), InputError, r"method", FIX),
    "method_none": lambda: (*svm_case(method=None), InputError, r"method", FIX),
    "penalty_negative": lambda: (*svm_case(penalty=-1.0), InputError, r"penalty", FIX),
    "penalty_zero": lambda: (*svm_case(penalty=0), InputError, r"penalty", FIX),
    "penalty_nan": lambda: (*svm_case(penalty=float("nan")), InputError, r"penalty", FIX),
    "penalty_inf": lambda: (*svm_case(penalty=float("inf")), InputError, r"penalty", FIX),
    "penalty_string": lambda: (*svm_case(penalty="big"), InputError, r"penalty", FIX),
    "penalty_bool": lambda: (*svm_case(penalty=True), InputTypeError, r"penalty", FIX),
    "penalty_list": lambda: (*svm_case(penalty=[0.5]), InputTypeError, r"penalty", FIX),
    "draws_zero": lambda: (*svm_case(method="gibbs", draws=0), InputError, r"draws", FIX),
    "draws_negative": lambda: (*svm_case(method="gibbs", draws=-5), InputError, r"draws", FIX),
    "draws_float": lambda: (*svm_case(method="gibbs", draws=10.5), InputTypeError, r"draws", FIX),
    "draws_bool": lambda: (*svm_case(method="gibbs", draws=True), InputTypeError, r"draws", FIX),
    "tune_negative": lambda: (*svm_case(method="gibbs", tune=-1), InputError, r"tune", FIX),
    "chains_zero": lambda: (*svm_case(method="gibbs", chains=0), InputError, r"chains", FIX),
    "chains_negative": lambda: (*svm_case(method="gibbs", chains=-2), InputError, r"chains", FIX),
    "thin_zero": lambda: (*svm_case(method="gibbs", thin=0), InputError, r"thin", FIX),
    "n_jobs_zero": lambda: (*svm_case(method="gibbs", n_jobs=0), InputError, r"n_jobs", FIX),
    "seed_negative": lambda: (*svm_case(seed=-1), InputTypeError, r"seed", FIX),
    "seed_string": lambda: (*svm_case(seed="abc"), InputTypeError, r"seed", FIX),
    "seed_float": lambda: (*svm_case(seed=1.5), InputTypeError, r"seed", FIX),
    "tol_zero": lambda: (*svm_case(tol=0.0), InputError, r"tol", FIX),
    "max_iter_zero": lambda: (*svm_case(max_iter=0), InputError, r"max_iter", FIX),
    "level_above_one": lambda: (*svm_case(level=1.5), InputError, r"level", FIX),
    "level_zero": lambda: (*svm_case(level=0), InputError, r"level", FIX),
    "missing_unknown": lambda: (*svm_case(missing="zap"), InputError, r"missing", FIX),
    "sigma2_beta_negative": lambda: (*svm_case(sigma2_beta=-1.0), InputError, r"sigma2_beta", FIX),
    "A_u_zero": lambda: (*svm_case(A_u=0.0), InputError, r"A_u", FIX),
    "B_u_nan": lambda: (*svm_case(B_u=float("nan")), InputError, r"B_u", FIX),
    "B_u_string": lambda: (*svm_case(B_u="0.01"), InputTypeError, r"B_u", FIX),
    "impute_with_map": lambda: (*svm_case(data=_nan_at("x"), missing="impute", method="map"), InputError, r"map", FIX),
    # ----------------------------------------------------------------------- Laplace-zero prior
    "prior_string": lambda: (*svm_case(prior="lasso"), InputTypeError, r"prior", FIX),
    "rho_zero": lambda: (_laplace, (), {"rho": 0.0}, InputError, r"rho", FIX),
    "rho_one": lambda: (_laplace, (), {"rho": 1.0}, InputError, r"rho", FIX),
    "rho_negative": lambda: (_laplace, (), {"rho": -1e-6}, InputError, r"rho", FIX),
    "rho_above_one": lambda: (_laplace, (), {"rho": 1 + 1e-6}, InputError, r"rho", FIX),
    "rho_nan": lambda: (_laplace, (), {"rho": float("nan")}, InputError, r"rho", FIX),
    "rho_string": lambda: (_laplace, (), {"rho": "high"}, InputError, r"rho", FIX),
    "rho_and_expected_size": lambda: (_laplace, (), {"rho": 0.2, "expected_size": 2}, InputError, r"expected_size", FIX),
    "expected_size_too_large": lambda: (*svm_case(prior=_laplace(expected_size=5)), InputError, r"expected_size", FIX),
    "keep_unknown_term": lambda: (*svm_case(prior=_laplace(keep=["nope"])), InputError, r"nope", FIX),
    "keep_everything": lambda: (*svm_case(prior=_laplace(keep=["x", "z"])), InputError, r"keep", FIX),
    "prior_with_map": lambda: (*svm_case(prior=_laplace(), method="map"), InputError, r"map", FIX),
    "prior_with_fixed_penalty": lambda: (*svm_case(prior=_laplace(), penalty=0.5), InputError, r"penalty", FIX),
    "prior_auto_with_impute": lambda: (*svm_case(data=_nan_at("x"), prior=_laplace(rho="auto"), missing="impute"),
                                       InputError, r"impute", FIX),
    "prior_with_joint_impute": lambda: (*svm_case(data=_nan_at("x"), prior=_laplace(), missing="impute",
                                                  imputation="joint"), InputError, r"imputation", FIX),
}


def _laplace(**kw):
    from vbsvm.models.priors import LaplaceZero

    return LaplaceZero(**kw)


# ------------------------------------------------------------------------------- predict & fit methods
@pytest.fixture(scope="module")
def fitted():
    df = _frame()
    return vbsvm.svm("y ~ x + sex + (1 | g)", data=df), df


def _newdata_unseen_level():
    df = _frame().iloc[:5].copy()
    df["sex"] = pd.Categorical(["f", "m", "x", "f", "m"])
    return df


FIT_CASES = {
    "predict_unseen_level": lambda df: (("predict",), (_newdata_unseen_level(),), {}, InputError, r"'sex'", FIX),
    "predict_missing_column": lambda df: (("predict",), (df.drop(columns="x"),), {}, InputError, r"'x'", FIX),
    "predict_missing_group_column": lambda df: (("predict",), (df.drop(columns="g"),), {}, InputError, r"'g'", FIX),
    "predict_not_a_frame": lambda df: (("predict",), (df.to_numpy(),), {}, InputTypeError, r"newdata", FIX),
    "predict_kind_unknown": lambda df: (("predict",), (df,), {"kind": "logit"}, InputError, r"kind", FIX),
    "predict_nan_predictor": lambda df: (("predict",), (_nan_at("x"),), {"na_action": "raise"}, InputError, r"'x'", FIX),
    "predict_renamed_column": lambda df: (("predict",), (df.rename(columns={"x": "X"}),), {}, InputError, r"'x'", FIX),
    "predict_overflowing_values": lambda df: (("predict",), (df.assign(x=df["x"] * 1e300),), {"kind": "prob"},
                                              InputError, r"'x'", FIX),
    "predict_complex_column": lambda df: (("predict",), (df.assign(x=df["x"] + 1j),), {}, InputTypeError, r"'x'", FIX),
    "coef_level_two": lambda df: (("coef_table",), (), {"level": 2}, InputError, r"level", FIX),
    "summary_level_negative": lambda df: (("summary",), (), {"level": -0.5}, InputError, r"level", FIX),
    "varcomp_level_one": lambda df: (("varcomp",), (), {"level": 1.0}, InputError, r"level", FIX),
}


# ------------------------------------------------------------------------------- load()
def _file_case(kind, tmp_path, fitted_pair):
    path = tmp_path / f"{kind}.nc"
    if kind == "missing_file":
        return str(path), FitFileError, r"missing_file\.nc"
    if kind == "directory":
        return str(tmp_path), FitFileError, str(tmp_path.name)
    if kind == "text_file":
        path.write_text("this is not netCDF\n")
    elif kind == "empty_file":
        path.write_bytes(b"")
    elif kind == "foreign_netcdf":
        import xarray as xr

        xr.Dataset({"a": ("x", np.arange(3.0))}).to_netcdf(path, engine="h5netcdf")
    elif kind == "truncated_fit":
        fitted_pair[0].save(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbled_fit":
        fitted_pair[0].save(path)
        data = bytearray(path.read_bytes())
        rng = np.random.default_rng(0)
        for i in rng.integers(len(data) // 4, len(data), 200):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    elif kind in ("fit_without_settings", "fit_unknown_type", "fit_bad_layout_json", "gp_type_without_meta"):
        import xarray as xr

        fitted_pair[0].save(path)
        dt = xr.open_datatree(path, engine="h5netcdf")
        dt.load()
        dt.close()
        if kind == "fit_without_settings":
            del dt.attrs["settings"]
        elif kind == "fit_unknown_type":
            dt.attrs["vbsvm_fit_type"] = "quantum"
        elif kind == "fit_bad_layout_json":
            dt.attrs["layout"] = "{not json"
        else:
            dt.attrs["vbsvm_fit_type"] = "gpsvm"
        os.remove(path)
        dt.to_netcdf(path, engine="h5netcdf")
    elif kind == "pickle_file":
        with open(path, "wb") as fh:
            pickle.dump({"vbsvm_fit_type": "linear"}, fh)
    if kind == "fit_unknown_type":
        return str(path), FitFileError, r"quantum"
    return str(path), FitFileError, r"\.nc|file"


LOAD_CASES = ["missing_file", "directory", "text_file", "empty_file", "foreign_netcdf", "truncated_fit",
              "garbled_fit", "fit_without_settings", "fit_unknown_type", "fit_bad_layout_json",
              "gp_type_without_meta", "pickle_file"]
# ------------------------------------------------------------------------------- the tests
def _check_raises(fn, args, kwargs, exc, name_re, fix_re):
    before = fingerprint((args, kwargs))
    snapshot = copy.deepcopy((args, kwargs))
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, VbsvmError), type(info.value).__mro__
    msg = str(info.value)
    assert re.search(name_re, msg), f"message does not name the culprit ({name_re!r}): {msg}"
    if fix_re is not None:
        assert re.search(fix_re, msg), f"message does not say how to fix it: {msg}"
    assert fingerprint((args, kwargs)) == before, "an input was mutated"
    for a, b in zip(snapshot[0], args):
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b)
    return msg


@pytest.mark.parametrize("case", CASES)
def test_bad_input_svm(case):
    fn, args, kwargs, exc, name_re, fix_re = CASES[case]()
    msg = _check_raises(fn, args, kwargs, exc, name_re, fix_re)
    print(f"[bad-input] {case}: {exc.__name__}: {msg}")


@pytest.mark.parametrize("case", FIT_CASES)
def test_bad_input_fit_methods(case, fitted):
    fit, df = fitted
    (meth,), args, kwargs, exc, name_re, fix_re = FIT_CASES[case](df)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        msg = _check_raises(getattr(fit, meth), args, kwargs, exc, name_re, fix_re)
    print(f"[bad-input] {case}: {msg}")


@pytest.mark.parametrize("kind", LOAD_CASES)
def test_bad_input_load(kind, tmp_path, fitted):
    path, exc, name_re = _file_case(kind, tmp_path, fitted)
    before = open(path, "rb").read() if os.path.isfile(path) else None
    with pytest.raises(exc) as info:
        vbsvm.load(path)
    assert isinstance(info.value, VbsvmError)
    assert re.search(name_re, str(info.value)), str(info.value)
    if before is not None:
        assert open(path, "rb").read() == before, "load modified the file"
    print(f"[bad-input] load {kind}: {info.value}")


_PWNED = []


def _pwn():  # pragma: no cover - must never run
    _PWNED.append(True)
    return "pwned"


class _Payload:
    def __reduce__(self):
        return (_pwn, ())


def test_load_never_executes_code_from_a_file(tmp_path, fitted):
    """A file is data: loading a crafted one must not run code. The payload pickles a call to a
    function of this module that records that it ran."""
    import base64
    import xarray as xr

    from vbsvm.fitting.gp import gpsvm

    df = fitted[1].assign(yy=lambda d: d["y"])
    fit = gpsvm("y ~ x + z", df, method="vb", n_inducing=10, seed=0, max_iter=30)
    path = tmp_path / "gp.nc"
    fit.save(path)
    dt = xr.open_datatree(path, engine="h5netcdf")
    dt.load()
    dt.close()
    dt.attrs["design"] = base64.b64encode(pickle.dumps(_Payload())).decode("ascii")
    os.remove(path)
    dt.to_netcdf(path, engine="h5netcdf")
    _PWNED.clear()
    try:
        vbsvm.load(str(path))
    except VbsvmError:
        pass
    assert not _PWNED, "vbsvm.load executed code embedded in the file"


def test_bad_input_case_count():
    """At least 50 parametrized bad-input cases."""
    assert len(CASES) + len(FIT_CASES) + len(LOAD_CASES) + len(GP_CASES) >= 50


# ------------------------------------------------------------------------------- gpsvm
GP_CASES = {
    "gp_method_unknown": ({"method": "ep"}, r"method"),
    "gp_kernel_unknown": ({"kernel": "cosine"}, r"kernel"),
    "gp_n_inducing_zero": ({"n_inducing": 0}, r"n_inducing"),
    "gp_batch_size_zero": ({"batch_size": 0}, r"batch_size"),
    "gp_n_inducing_float": ({"n_inducing": 2.5}, r"n_inducing"),
    "gp_draws_zero": ({"method": "gibbs", "draws": 0}, r"draws"),
    "gp_chains_zero": ({"method": "gibbs", "chains": 0}, r"chains"),
    "gp_tune_negative": ({"method": "gibbs", "tune": -1}, r"tune"),
    "gp_thin_zero": ({"method": "gibbs", "thin": 0}, r"thin"),
    "gp_lengthscale_negative": ({"lengthscale": -1.0}, r"lengthscale"),
    "gp_variance_zero": ({"variance": 0.0}, r"variance"),
}
@pytest.mark.parametrize("case", GP_CASES)
def test_bad_input_gpsvm(case):
    from vbsvm.fitting.gp import gpsvm

    kw, name_re = GP_CASES[case]
    df = _frame()
    kwargs = dict(optimize=False, max_iter=20, seed=0, **kw)
    _check_raises(gpsvm, ("y ~ x + z", df), kwargs, VbsvmError, name_re, None)
