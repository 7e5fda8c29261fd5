"""The result contract: the same checks, through the same calls, on every kind of fit (linear
calibrated VB, Gibbs, Laplace-zero, imputed, sparse GP by SVI, batch VB and Gibbs): save/load,
the ArviZ groups, the prediction kinds, draws, comparison with another fit, loo(), and the
statsmodels names (params, bse, conf_int, cov_params, summary)."""

import warnings

import arviz as az
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import vbsvm
from vbsvm.exceptions import InputError
from vbsvm.results.contract import FitResult, psis_log_weights

FITS = ["linear_vb", "gibbs", "laplace_zero", "imputed", "gp_svi", "gp_vb", "gp_gibbs"]
GP = {"gp_svi", "gp_vb", "gp_gibbs"}


def _gp_frame(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1 + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    return pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "cls": y})


@pytest.fixture(scope="module")
def data():
    sim = vbsvm.datasets.simulate_luts(120, 3, seed=1)
    incomplete = sim.copy()
    incomplete.loc[incomplete.index[::10], "x2"] = np.nan
    return {"sim": sim, "incomplete": incomplete, "gp": _gp_frame()}


@pytest.fixture(scope="module")
def fits(data):
    """``{name: (fit, its data, a second fit of the same model to compare with)}``."""
    f = "y ~ x1 + x2 + x3"
    sim, inc, gp = data["sim"], data["incomplete"], data["gp"]
    gkw = dict(n_inducing=8, seed=1, optimize=False, lengthscale=1.0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mf = vbsvm.svm(f, sim, method="meanfield", chains=2, draws=200)
        gp_svi = vbsvm.gpsvm("cls ~ a + b", gp, **gkw)
        out = {
            "linear_vb": (vbsvm.svm(f, sim, chains=2, draws=200, seed=1), sim, mf),
            "gibbs": (vbsvm.svm(f, sim, method="gibbs", chains=2, draws=200, tune=100, seed=1, progress=False),
                      sim, mf),
            "laplace_zero": (vbsvm.svm(f, sim, prior=vbsvm.LaplaceZero(rho=0.3), chains=2, draws=200, seed=1),
                             sim, mf),
            "imputed": (vbsvm.svm(f, inc, missing="impute", chains=2, draws=200, seed=1), inc,
                        vbsvm.svm(f, inc, missing="impute", method="meanfield", chains=2, draws=200)),
            "gp_svi": (gp_svi, gp, vbsvm.gpsvm("cls ~ a + b", gp, method="vb", **gkw)),
            "gp_vb": (vbsvm.gpsvm("cls ~ a + b", gp, method="vb", **gkw), gp, gp_svi),
            "gp_gibbs": (vbsvm.gpsvm("cls ~ a + b", gp, method="gibbs", draws=150, tune=50, chains=2, **gkw),
                         gp, gp_svi),
        }
    return out


def _equal(a, b):
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    else:
        pd.testing.assert_series_equal(a, b)


@pytest.mark.parametrize("name", FITS)
@pytest.mark.slow
def test_every_fit_implements_the_contract(fits, name):
    fit = fits[name][0]
    assert isinstance(fit, FitResult) and not type(fit).__abstractmethods__


@pytest.mark.parametrize("name", FITS)
def test_save_load_round_trip(fits, name, tmp_path):
    fit, df, _ = fits[name]
    path = tmp_path / f"{name}.nc"
    fit.save(path)
    back = vbsvm.load(path)
    assert type(back) is type(fit) and back.method == fit.method
    pd.testing.assert_frame_equal(back.coef, fit.coef)
    for kind in ("class", "prob", "score"):
        _equal(fit.predict(df, kind=kind), back.predict(df, kind=kind))
    xr.testing.assert_equal(back.draws()[list(fit.draws().data_vars)[0]], fit.draws()[list(fit.draws().data_vars)[0]])


@pytest.mark.parametrize("name", FITS)
def test_to_arviz_groups_and_draws(fits, name):
    fit = fits[name][0]
    tree = fit.to_arviz()
    assert {"posterior", "log_likelihood", "observed_data"} <= set(tree.children)
    post = tree["posterior"]
    assert post.sizes["chain"] * post.sizes["draw"] > 1
    assert (post.sizes["chain"], post.sizes["draw"]) == fit.draw_shape
    draws = fit.draws()
    for var in draws.data_vars:  # draws() is the posterior group
        np.testing.assert_array_equal(draws[var].values, post[var].values)
    ll = tree["log_likelihood"]["y"]
    assert ll.dims == ("chain", "draw", "obs") and ll.shape == (*fit.draw_shape, fit.n_obs)
    assert np.all(ll.values <= 0) and np.all(np.isfinite(ll.values))
    assert tree["observed_data"]["y"].shape == (fit.n_obs,)
    assert "log_likelihood" not in fit.to_arviz(log_likelihood=False).children
    # another draw shape: a new object, the fit itself untouched
    other = fit.with_draw_shape(3, 7)
    expected = fit.draw_shape if fit.sampled else (3, 7)
    assert other.draw_shape == expected and fit.draws(3, 7).sizes["draw"] == expected[1]
    assert tree["posterior"].sizes["draw"] == fit.draws().sizes["draw"] == fit.draw_shape[1]


@pytest.mark.parametrize("name", FITS)
def test_predict_kinds(fits, name):
    fit, df, _ = fits[name]
    cls = fit.predict(df, kind="class")
    prob = fit.predict(df, kind="prob")
    pos = fit.predict(df, kind="prob_positive")
    score = fit.predict(df, kind="score")
    response = fit.design.response
    assert cls.index.equals(df.index) and prob.index.equals(df.index) and score.index.equals(df.index)
    assert set(cls.unique()) <= set(df[response].unique())
    assert list(score.columns) == ["mean", "sd"] and (score["sd"] > 0).all()
    for p in (prob, pos):
        assert ((p >= 0) & (p <= 1)).all()
    sign = score["mean"].to_numpy() >= 0
    np.testing.assert_array_equal(cls.to_numpy() == fit.design.positive_level, sign)
    assert np.mean((pos.to_numpy() > 0.5) == sign) > 0.95
    pd.testing.assert_series_equal(fit.predict(kind="prob"), fit.predict(fit.training_rows(), kind="prob"))
    head = df.head(4)
    assert len(fit.predict(head, kind="prob", new_levels="zero", na_action="drop")) == 4
    with pytest.raises(InputError, match="kind"):
        fit.predict(df, kind="probability")
    with pytest.raises(InputError, match="na_action"):
        fit.predict(df, na_action="omit")
    with pytest.raises(InputError, match="new_levels"):
        fit.predict(df, new_levels="new")


@pytest.mark.parametrize("name", FITS)
def test_compare_against_another_fit(fits, name):
    fit, df, other = fits[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cmp = fit.compare(other, names=["this", "other"])
        table = cmp.table(lr=False)
        self_table = vbsvm.compare(fit, fit.with_draw_shape(*fit.draw_shape), names=["a", "b"]).table(lr=False)
    assert list(cmp.fits) == ["this", "other"]
    assert len(table) > 0 and {"this_mean", "other_mean", "this_sd"} <= set(table.columns)
    marg = fit.marginals(points=cmp._points())
    np.testing.assert_allclose(table["this_mean"], [marg[p].mean for p in table.index])
    spread = np.isfinite(self_table["a_sd"]) & (self_table["a_sd"] > 0)
    acc = self_table.loc[spread, [c for c in self_table.columns if c.endswith("_accuracy")][0]]
    assert len(acc) > 0 and (acc > 99.9).all()  # a fit against its own marginals
    pred = cmp.predictions(df)
    assert list(pred.index) == ["this", "other"] and pred.loc["other", "agreement"] > 0.75


@pytest.mark.parametrize("name", FITS)
def test_loo_on_a_probability_scale(fits, name):
    fit, df, other = fits[name]
    loo = fit.loo()
    n = fit.n_obs
    assert loo.kind == "loo" and loo.n_data_points == n and loo.elpd_i.shape == (n,) and loo.pareto_k.shape == (n,)
    assert np.log(0.5) * n < loo.elpd < 0  # better than a coin on these data, a probability at most 1
    np.testing.assert_allclose(loo.elpd, float(loo.elpd_i.sum()))
    # elpd_i = log sum_s w_is p(y_i | theta_s) with PSIS weights of the pseudo-likelihood
    log_pseudo, log_prob = fit.pointwise_log_terms()
    S = log_prob.shape[0] * log_prob.shape[1]
    log_w, k = psis_log_weights(log_pseudo.reshape(S, n), fit.relative_efficiency())
    expected = np.logaddexp.reduce(log_w + log_prob.reshape(S, n), axis=0)
    np.testing.assert_allclose(loo.elpd_i.values, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(np.isnan(loo.pareto_k.values), np.isnan(k))
    # the predictive is the class probability predict(kind="prob") averages over the posterior
    prob = fit.predict(df, kind="prob").to_numpy()
    y = fit.observed_signs(df)
    in_sample = np.log(np.where(y > 0, prob, 1 - prob))
    lppd = np.logaddexp.reduce(log_prob.reshape(S, n), axis=0) - np.log(S)
    assert np.abs(lppd - in_sample).mean() < 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = az.compare({"this": loo, "other": other.loo()})
    assert set(table.index) == {"this", "other"}


@pytest.mark.parametrize("name", FITS)
def test_statsmodels_names(fits, name):
    fit = fits[name][0]
    coef = fit.coef
    pd.testing.assert_series_equal(fit.params, coef["mean"].rename(None))
    pd.testing.assert_series_equal(fit.bse, coef["sd"].rename(None))
    ci = fit.conf_int(alpha=0.1)
    table = fit.coef_table(level=0.9)
    assert list(ci.columns) == [0, 1] and ci.index.equals(coef.index)
    np.testing.assert_array_equal(ci.to_numpy(), table[["5%", "95%"]].to_numpy())
    np.testing.assert_array_equal(fit.conf_int().to_numpy(), coef[["2.5%", "97.5%"]].to_numpy())
    cov = fit.cov_params()
    assert cov.index.equals(coef.index) and cov.columns.equals(coef.index)
    if name in GP:  # hyperparameters: point estimates
        assert np.isnan(cov.to_numpy()).all() and fit.bse.isna().all()
    else:
        np.testing.assert_allclose(np.diag(cov), fit.bse ** 2, rtol=1e-10)
        np.testing.assert_allclose(cov, cov.T)
        assert np.linalg.eigvalsh(cov.to_numpy()).min() > -1e-10 * np.abs(cov.to_numpy()).max()
        assert (ci[0] < fit.params).all() and (fit.params < ci[1]).all()
    for alpha in (0.0, 1.0, "0.05", True):
        with pytest.raises(InputError, match="alpha"):
            fit.conf_int(alpha)
    text = fit.summary().as_text()
    assert all(str(t) in text for t in coef.index)
    assert "90%" in fit.summary(level=0.9).as_text() or name in GP
    assert max(map(len, text.splitlines())) <= 100


def test_gibbs_cov_params_is_the_covariance_of_the_draws(fits):
    fit = fits["gibbs"][0]
    beta = fit.draws()["beta"].values.reshape(-1, len(fit.coef))
    np.testing.assert_allclose(fit.cov_params(), np.cov(beta, rowvar=False), rtol=1e-10)


def test_linear_vb_cov_params_is_the_gaussian_q(fits):
    fit = fits["linear_vb"][0]
    p = len(fit.coef)
    np.testing.assert_allclose(fit.cov_params(), fit.posterior["theta_cov_dense"][:p, :p], rtol=1e-10)


def test_fits_without_rows_or_draws_say_why_loo_is_unavailable(fits, data, tmp_path):
    sim = data["sim"]
    mode = vbsvm.svm("y ~ x1 + x2 + x3", sim, method="map", penalty=0.5)
    with pytest.raises(InputError, match="posterior"):
        mode.loo()
    gp = fits["gp_svi"][0]
    gp.save(tmp_path / "gp.nc")
    loaded = vbsvm.load(tmp_path / "gp.nc")
    assert loaded.training_rows() is None and "log_likelihood" not in loaded.to_arviz().children
    with pytest.raises(InputError, match="training rows"):
        loaded.loo()


def test_dask_fit_shares_the_signatures():
    dd = pytest.importorskip("dask.dataframe")
    sim = vbsvm.datasets.simulate_luts(150, 2, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ x1 + x2", dd.from_pandas(sim, npartitions=2), method="meanfield")
    assert isinstance(fit, FitResult) and fit.training_rows() is None
    assert fit.predict(sim, kind="prob").index.equals(sim.index)
    np.testing.assert_allclose(np.diag(fit.cov_params()), fit.bse ** 2)
    assert fit.draws()["beta"].shape[:2] == fit.draw_shape
    for call in (fit.loo, lambda: fit.to_arviz(), lambda: fit.save("x.nc")):
        with pytest.raises(InputError):
            call()
