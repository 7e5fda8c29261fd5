"""Fit objects: coefficients, predictions, summaries, ArviZ export and exact save/load."""

import warnings

import arviz as az
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats

import vbsvm
from vbsvm.exceptions import DiagnosticWarning, FitFileError, InputError


@pytest.fixture(scope="module")
def grouped():
    df = vbsvm.datasets.simulate_grouped(25, 6, seed=1)
    df["arm"] = np.where(df["treatment"] == 1, "drug", "placebo")
    return df


@pytest.fixture(scope="module")
def fits(grouped):
    formula = "y ~ time * C(arm) + (1 | group)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        return {
            "vb": vbsvm.svm(formula, data=grouped, seed=3, draws=200, chains=2),
            "gibbs": vbsvm.svm(formula, data=grouped, method="gibbs", draws=200, tune=100, chains=2,
                               seed=3, progress=False),
            "map": vbsvm.svm(formula, data=grouped, method="map"),
        }


@pytest.mark.parametrize("method", ["vb", "gibbs", "map"])
def test_coef_table(fits, method):
    coef = fits[method].coef
    expected = ["mean", "sd", "2.5%", "97.5%"]
    assert list(coef.columns) == expected
    assert list(coef.index) == ["Intercept", "time", "C(arm)[T.placebo]", "time:C(arm)[T.placebo]"]
    if method != "map":
        assert (coef["2.5%"] < coef["mean"]).all() and (coef["mean"] < coef["97.5%"]).all()
    assert fits[method].coef_table(level=0.5).columns[-2] == "25%"


@pytest.mark.parametrize("method", ["vb", "gibbs"])
def test_predict_kinds(fits, grouped, method):
    fit = fits[method]
    cls = fit.predict(grouped, kind="class")
    prob = fit.predict(grouped, kind="prob")
    score = fit.predict(grouped, kind="score")
    assert set(cls.unique()) <= {fit.design.negative_level, fit.design.positive_level} == {-1, 1}
    assert ((prob >= 0) & (prob <= 1)).all()
    assert list(score.columns) == ["mean", "sd"]
    np.testing.assert_array_equal(cls.to_numpy() == fit.design.positive_level, score["mean"].to_numpy() > 0)
    # P(f > 0) is above 1/2 exactly when the predictive mean is positive (VB: Gaussian)
    if method == "vb":
        np.testing.assert_array_equal(prob.to_numpy() > 0.5, score["mean"].to_numpy() > 0)
    assert cls.index.equals(grouped.index)


def test_vb_score_matches_its_own_draws(fits, grouped):
    """The closed-form predictive mean/sd of the score equals that of the stored draws from q."""
    fit = fits["vb"]
    big = vbsvm.svm(fit.settings["formula"], data=grouped, seed=5, draws=20000, chains=1)
    tree = big.to_arviz()
    beta = tree["posterior"]["beta"].values.reshape(-1, 4)
    b = tree["posterior"]["b_group"].values.reshape(-1, 25)
    X = big.design.new_X(grouped, standardized=False)
    codes = big.design.groups[0].codes
    f = beta @ X.T + b[:, codes]
    score = big.predict(grouped, kind="score")
    np.testing.assert_allclose(f.mean(0), score["mean"], atol=0.03 * score["sd"].max())
    np.testing.assert_allclose(f.std(0), score["sd"], rtol=0.05)


def test_unseen_group_predicts_at_population_level(fits, grouped):
    """new_levels: 'zero' (lme4 re.form=NA, warns), 'integrate' (default: the group variance is
    added to the score's variance, brms sample_new_levels), 'error'."""
    new = grouped.iloc[:3].copy()
    new["group"] = [1000, 1001, 1002]
    for method in ("vb", "gibbs"):
        fit = fits[method]
        with pytest.warns(DiagnosticWarning, match="not seen"):
            zero = fit.predict(new, kind="score", new_levels="zero")
        X = fit.design.new_X(new, standardized=False)
        np.testing.assert_allclose(zero["mean"], X @ fit.coef["mean"].to_numpy())
        integ = fit.predict(new, kind="score")
        np.testing.assert_allclose(integ["mean"], zero["mean"])
        s2 = fit.varcomp().loc["sigma2_group", "mean"]
        np.testing.assert_allclose(integ["sd"] ** 2, zero["sd"] ** 2 + s2)
        p = fit.predict(new, kind="prob")
        a, b = fit.info["prob_calibration"]
        assert b == 0.0 and 0 < a < 10
        np.testing.assert_allclose(p, stats.norm.cdf(a * integ["mean"] / np.sqrt(1 + (a * integ["sd"]) ** 2)))
        with pytest.raises(InputError, match="new_levels"):
            fit.predict(new, new_levels="error")


def test_summary_formats(fits):
    for fit in fits.values():
        smry = fit.summary()
        text = smry.as_text()
        assert "Intercept" in text and "sigma2_group" in text
        assert "<table" in smry.as_html()
        assert "tabular" in smry.as_latex()
        assert "<table" in fit._repr_html_()
    assert "+1 = 1" in fits["vb"].summary().as_text()


def test_summary_time_is_the_whole_fit(fits):
    """The summary's time is the wall time of the whole svm() call (design, checks, inference,
    calibration); the engine's share is kept apart."""
    for fit in fits.values():
        info = fit.info
        assert 0 < info["inference_seconds"] <= info["seconds"]
        line = next(x for x in fit.summary().as_text().splitlines() if "Time (s):" in x)
        assert line.split("Time (s):")[1].split()[0] == f"{info['seconds']:.4f}"


def test_to_arviz_layout(fits):
    for method, fit in fits.items():
        tree = fit.to_arviz()
        assert isinstance(tree, xr.DataTree)
        post = tree["posterior"]
        assert post["beta"].dims == ("chain", "draw", "coef")
        assert post["b_group"].dims == ("chain", "draw", "group")
        assert "sigma2_group" in post and "sigma2_u" in post
        assert "y" in tree["observed_data"]
        if method != "map":
            assert post["beta"].shape[:2] == (2, 200)
    assert "log_pseudo_likelihood" in fits["gibbs"].to_arviz()["sample_stats"]
    assert "elbo" in fits["vb"].to_arviz()["sample_stats"]
    # VB draws are reproducible (seeded)
    a = fits["vb"].to_arviz()["posterior"]["beta"].values
    np.testing.assert_array_equal(a, fits["vb"].to_arviz()["posterior"]["beta"].values)
    s = az.summary(fits["gibbs"].to_arviz(), var_names=["beta"])
    assert len(s) == 4


@pytest.mark.parametrize("method", ["vb", "gibbs", "map"])
def test_save_load_round_trip(fits, grouped, method, tmp_path):
    fit = fits[method]
    path = tmp_path / f"{method}.nc"
    fit.save(path)
    back = vbsvm.load(path)
    pd.testing.assert_frame_equal(back.coef, fit.coef)
    kinds = ["class", "score"] + ([] if method == "map" else ["prob"])
    for kind in kinds:
        a, b = fit.predict(grouped, kind=kind), back.predict(grouped, kind=kind)
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b)
        else:
            pd.testing.assert_series_equal(a, b)
    ta, tb = fit.to_arviz(), back.to_arviz()
    for var in ta["posterior"].data_vars:
        np.testing.assert_array_equal(ta["posterior"][var].values, tb["posterior"][var].values)
    pd.testing.assert_frame_equal(back.predict(None, kind="score"), fit.predict(None, kind="score"))
    # the file is ArviZ-readable as it is
    tree = az.from_netcdf(path)
    assert "posterior" in tree.children
    if method == "gibbs":
        assert len(az.summary(tree, var_names=["beta"])) == 4


def test_load_rejects_foreign_files(tmp_path):
    with pytest.raises(FitFileError, match="no such file"):
        vbsvm.load(tmp_path / "absent.nc")
    junk = tmp_path / "junk.nc"
    junk.write_bytes(b"not a netcdf file at all")
    with pytest.raises(FitFileError, match="not a netCDF"):
        vbsvm.load(junk)
    other = tmp_path / "other.nc"
    xr.Dataset({"a": ("x", np.arange(3.0))}).to_netcdf(other, engine="h5netcdf")
    with pytest.raises(FitFileError, match="not a vbsvm fit"):
        vbsvm.load(other)


def test_inputs_not_mutated(grouped):
    before = pd.util.hash_pandas_object(grouped).sum()
    fit = vbsvm.svm("y ~ time + (1 | group)", data=grouped)
    fit.predict(grouped, kind="prob")
    assert pd.util.hash_pandas_object(grouped).sum() == before


def test_string_response_predicts_labels():
    df = vbsvm.datasets.simulate_luts(120, 3, seed=2)
    df["label"] = np.where(df.pop("y") > 0, "case", "control")
    fit = vbsvm.svm("label ~ .", data=df)
    assert set(fit.predict(df).unique()) <= {"case", "control"}
    assert fit.design.positive_level == "control"  # sorted: 'case' < 'control'
    acc = (fit.predict(df) == df["label"]).mean()
    assert acc > 0.6


def test_bad_arguments(grouped):
    for kwargs, match in [({"method": "mcmc"}, "method"), ({"penalty": -1.0}, "penalty"),
                          ({"penalty": 0.0}, "penalty"), ({"penalty": "big"}, "penalty"),
                          ({"draws": 0}, "draws"), ({"chains": 0}, "chains"), ({"tune": -1}, "tune"),
                          ({"thin": 0}, "thin"), ({"level": 1.5}, "level"), ({"missing": "zero"}, "missing"),
                          ({"tol": -1.0}, "tol"), ({"seed": -3}, "seed"), ({"A_u": 0.0}, "A_u")]:
        with pytest.raises((InputError, TypeError), match=match):
            vbsvm.svm("y ~ time", data=grouped, **kwargs)
    fit = vbsvm.svm("y ~ time", data=grouped)
    with pytest.raises(InputError, match="kind"):
        fit.predict(grouped, kind="probability")


def test_log_likelihood_group_makes_loo_and_compare_work(fits, tmp_path):
    """Pointwise log likelihood: the hinge likelihood normalised over y (sums to 1 over y), one
    value per draw and row; az.loo and az.compare run on it; save() leaves it out."""
    from vbsvm.results.arviz_export import pointwise_log_likelihood

    F = np.linspace(-3, 3, 13)
    np.testing.assert_allclose(np.exp(pointwise_log_likelihood(1.0, F)) + np.exp(pointwise_log_likelihood(-1.0, F)), 1.0)
    trees = {m: fits[m].to_arviz() for m in ("vb", "gibbs")}
    ll = trees["gibbs"]["log_likelihood"]["y"]
    assert ll.dims == ("chain", "draw", "obs") and ll.shape[2] == fits["gibbs"].n_obs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(trees["gibbs"])
        table = az.compare(trees)
    assert np.isfinite(loo.elpd) and list(table.index)[0] in trees
    fits["gibbs"].save(tmp_path / "g.nc")
    assert "log_likelihood" not in xr.open_datatree(tmp_path / "g.nc", engine="h5netcdf").children


# ------------------------------------------------------------------ rows with problems
@pytest.mark.parametrize("method", ["vb", "gibbs", "map"])
def test_na_action_pass_drop_raise(fits, grouped, method):
    fit = fits[method]
    new = grouped.head(6).copy()
    new.index = [10, 11, 12, 13, 14, 15]
    new.loc[11, "time"] = np.nan
    new.loc[13, "arm"] = None
    new.loc[14, "group"] = np.nan
    missing = [11, 13, 14]
    complete = new.drop(index=missing)
    kinds = ["class", "prob", "score"] + (["prob_positive"] if method != "map" else [])
    for kind in kinds:
        full = fit.predict(new, kind=kind)  # na_action="pass" is the default, as R's na.pass
        assert full.index.equals(new.index)
        assert full.loc[missing].isna().all(axis=None)
        expected = fit.predict(complete, kind=kind)
        pd.testing.assert_frame_equal(pd.DataFrame(full.loc[complete.index]), pd.DataFrame(expected),
                                      check_dtype=False)
        dropped = fit.predict(new, kind=kind, na_action="drop")
        assert dropped.index.equals(complete.index)
    with pytest.raises(InputError, match=r"3 row\(s\) with missing values in column\(s\) \['time', 'arm', 'group'\]"):
        fit.predict(new, na_action="raise")
    with pytest.raises(InputError, match="na_action"):
        fit.predict(new, na_action="omit")
    score = fit.predict_score(new, na_action="drop")
    assert score.index.equals(complete.index)
    assert new.loc[11, "time"] != new.loc[11, "time"]  # the caller's frame is left as it was


def test_imputed_fit_still_predicts_rows_with_missing_predictors():
    df = vbsvm.datasets.simulate_luts(80, 2, seed=5)
    df.loc[df.index[:8], "x1"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x1 + x2", df, missing="impute")
    new = df.head(10).copy()
    new.loc[new.index[9], "x2"] = np.nan
    prob = fit.predict(new, kind="prob", na_action="raise")  # the model fills missing predictors
    assert np.isfinite(prob).all() and prob.index.equals(new.index)


def test_infinite_new_predictors_raise_naming_the_column(fits, grouped):
    new = grouped.head(4).copy()
    new.loc[new.index[2], "time"] = -np.inf
    for fit in fits.values():
        with pytest.raises(InputError, match=r"infinite values in design column\(s\) \['time'"):
            fit.predict(new)


# ------------------------------------------------------------------ text output
@pytest.fixture(scope="module")
def text_fits(fits, toenail):
    """Every kind of fit whose summary has its own sections."""
    sim = vbsvm.datasets.simulate_luts(100, 4, seed=2)
    incomplete = sim.copy()
    incomplete.loc[incomplete.index[:10], "x2"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = dict(fits)
        out["slopes"] = vbsvm.svm("y ~ time * terbinafine + (1 + time | patient_id)", toenail,
                                  method="gibbs", draws=50, tune=20, chains=2, seed=1, progress=False)
        out["laplace_zero"] = vbsvm.svm("y ~ .", sim, prior=vbsvm.LaplaceZero(rho=0.2))
        out["impute"] = vbsvm.svm("y ~ .", incomplete, missing="impute")
        out["gp"] = vbsvm.gpsvm("y ~ x1 + x2", sim, n_inducing=8, seed=1)
    return out


def test_text_summaries_and_descriptions_fit_in_100_columns(text_fits):
    for name, fit in text_fits.items():
        for text in (fit.summary().as_text(), repr(fit), str(fit)):
            width = max(map(len, text.splitlines()))
            assert width <= 100, (name, width, text)
        assert "<vbsvm" not in repr(fit)
        assert "\x1b" not in fit.summary().as_text()


def test_print_fit_is_a_short_description(text_fits):
    text = str(text_fits["vb"])
    lines = text.splitlines()
    assert lines[0] == "Bayesian linear SVM with random intercepts: Approximate posterior (fast)"
    assert "Formula: y ~ time * C(arm) + (1 | group)" in lines
    assert any(line.startswith("Coefficients (posterior mean): Intercept ") for line in lines)
    assert "group: 25 groups" in lines and len(lines) <= 8
    assert "Coefficients (posterior mode)" in str(text_fits["map"])
    sel = str(text_fits["laplace_zero"])
    assert "Laplace-zero prior, rho = 0.2" in sel and "terms selected" in sel
    assert "rows incomplete" in str(text_fits["impute"])
    assert str(text_fits["gp"]).startswith("Bayesian nonlinear SVM (sparse GP)")


def test_map_summary_calls_the_mode_a_mode(fits):
    text = fits["map"].summary().as_text()
    header = [line.split() for line in text.splitlines() if line.split()[:1] == ["mode"]]
    assert len(header) == 2  # the coefficients and the variance components
    assert not any("mean" in line.split() for line in text.splitlines())
    assert " nan" not in text


def test_gibbs_variance_components_carry_r_hat_and_ess(fits):
    text = fits["gibbs"].summary().as_text()
    block = text[text.index("Variance components"):]
    assert "r_hat" in block and "ess_bulk" in block
    alpha = next(line for line in block.splitlines() if line.startswith("alpha")).split()
    sigma = next(line for line in block.splitlines() if line.startswith("sigma2_u")).split()
    assert alpha[-2:] == sigma[-2:]  # rank-based diagnostics of a monotone transform


def test_infinite_inverse_gamma_moments_are_shown_as_undefined():
    df = vbsvm.datasets.simulate_luts(60, 1, seed=3)
    fit = vbsvm.svm("y ~ x1", df, method="meanfield")  # sigma2_u's q has shape A_u + 1/2 < 1
    assert np.isinf(fit.varcomp().loc["sigma2_u", "mean"])
    text = fit.summary().as_text()
    row = next(line for line in text.splitlines() if line.startswith("sigma2_u")).split()
    assert row[1:3] == ["undefined", "undefined"]
    assert "mean: shape <= 1, sd: shape <= 2" in " ".join(text.split())
    assert not any(tok in ("inf", "-inf") for tok in text.split())


def test_probit_calibration_recovers_a_known_scale():
    """fit_probit_calibration is the maximum-likelihood scale of the probit predictive."""
    from vbsvm.results.prediction import fit_probit_calibration, probit_predictive

    rng = np.random.default_rng(4)
    m, s = rng.normal(0, 1.5, 20000), rng.uniform(0, 1, 20000)
    y = np.where(rng.random(m.size) < probit_predictive(m, s, 0.6), 1.0, -1.0)
    a, b = fit_probit_calibration(m, s, y)
    assert b == 0.0 and a == pytest.approx(0.6, abs=0.03)


def test_vb_draws_are_labelled_as_iid_not_a_chain(fits):
    """arviz.summary shows R-hat/ESS for any draws; a VB fit's posterior group says they are iid
    draws from the approximation, whose R-hat and ESS mean nothing about convergence."""
    attrs = fits["vb"].to_arviz(log_likelihood=False)["posterior"].attrs
    assert "not a Markov chain" in attrs["draws"]
    assert attrs["q"].startswith(fits["vb"].info["approximation"])
    assert "draws" not in fits["gibbs"].to_arviz(log_likelihood=False)["posterior"].attrs
