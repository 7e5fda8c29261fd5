"""vbsvm.compare: the accuracy score on known densities, the comparison table, predictions, plots."""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import vbsvm
from vbsvm.results.compare import Comparison, accuracy, compare, kde_on_grid
from vbsvm.exceptions import DiagnosticWarning, InputError, InputTypeError


def exact_normal_accuracy(delta):
    """100 (1 - TV(N(0,1), N(delta,1))) = 200 (1 - Phi(|delta|/2))."""
    return 200.0 * (1.0 - stats.norm.cdf(abs(delta) / 2.0))


# ------------------------------------------------------------------------------ accuracy score
@pytest.mark.parametrize("delta", [0.0, 0.3, 1.0, 2.5, 8.0])
def test_accuracy_of_two_normals_closed_form(delta):
    got = accuracy(stats.norm(0, 1), stats.norm(delta, 1))
    assert got == pytest.approx(exact_normal_accuracy(delta), abs=1e-3)


def test_accuracy_unequal_scales_closed_form():
    # N(0,1) vs N(0,2): densities cross at +-x0, x0^2 = 8 log 2 / 3; TV = 2 (Phi(x0) - Phi(x0/2))
    x0 = np.sqrt(8 * np.log(2) / 3)
    tv = 2 * (stats.norm.cdf(x0) - stats.norm.cdf(x0 / 2))
    assert accuracy(stats.norm(0, 1), stats.norm(0, 2)) == pytest.approx(100 * (1 - tv), abs=1e-3)


@pytest.mark.parametrize("delta", [0.0, 1.0, 3.0])
def test_accuracy_against_draws_uses_a_kde(delta):
    rng = np.random.default_rng(5)
    draws = rng.normal(delta, 1.0, 40_000)
    got = accuracy(stats.norm(0, 1), draws)
    # KDE smoothing and Monte Carlo error cost about a point near 100%
    assert got == pytest.approx(exact_normal_accuracy(delta), abs=1.5)
    assert accuracy(draws, stats.norm(0, 1)) == pytest.approx(got, abs=1e-6)   # symmetric


def test_accuracy_reflects_at_a_lower_bound():
    rng = np.random.default_rng(2)
    dist = stats.expon(scale=0.5)                # a positive parameter with its mode at the bound
    draws = dist.rvs(40_000, random_state=rng)
    with_reflection = accuracy(dist, draws, lower=0.0)
    assert with_reflection > 97
    assert with_reflection > accuracy(dist, draws) + 1.0   # leaking KDE mass below 0 costs accuracy


def test_accuracy_spike_at_zero():
    rng = np.random.default_rng(3)
    slab = rng.normal(1.0, 0.3, 30_000)
    spiky = np.where(rng.random(30_000) < 0.4, 0.0, slab)
    assert accuracy(spiky, spiky.copy()) > 99
    # 40% point mass against a continuous density: at most 60% overlap
    assert accuracy(spiky, stats.norm(1.0, 0.3)) == pytest.approx(60, abs=1.5)


def test_accuracy_of_marginals_at_extreme_scales():
    """Found by the slow fuzz suite (a VB variance IG(0.6, 1e300) against Gibbs draws in the
    thousands): a support bound that overflows gives NaN, not a crash in the KDE; supports that
    do not overlap give 0 (a grid spanning 1e2 to 1e307 cannot resolve the draws: 49 before)."""
    draws = np.array([4786.0, 10728.4, 10259.8, 697.1, 992.7, 738.3, 23101.6, 12009.7, 11054.8, 2018.4, 235.7, 147.0])
    assert np.isnan(accuracy(stats.invgamma(0.6, scale=1e300), draws, lower=0.0))
    assert accuracy(stats.invgamma(1.0, scale=1e300), draws, lower=0.0) == 0.0
    assert accuracy(stats.norm(0.0, 1.0), stats.norm(1e6, 1.0)) == 0.0
    spiky = np.r_[np.zeros(50), np.linspace(1.0, 2.0, 50)]
    assert accuracy(spiky, np.r_[np.zeros(50), np.linspace(1e6, 2e6, 50)]) == pytest.approx(50.0)


def test_kde_on_grid_integrates_to_one_and_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.gamma(3.0, 1.0, 5000)
    grid = np.linspace(-2, 15, 4001)
    h = 0.3
    dens = kde_on_grid(x, grid, bandwidth=h)
    assert np.trapezoid(dens, grid) == pytest.approx(1.0, abs=1e-3)
    ref = stats.gaussian_kde(x, bw_method=h / x.std(ddof=1))(grid)
    assert np.max(np.abs(dens - ref)) < 2e-3


def test_accuracy_rejects_bad_draws():
    with pytest.raises(InputError, match="draws"):
        accuracy([1.0], stats.norm())
    with pytest.raises(InputError, match="draws"):
        accuracy([1.0, np.nan, 2.0], stats.norm())


# ------------------------------------------------------------------------------ fits
@pytest.fixture(scope="module")
def sim():
    return vbsvm.datasets.simulate_luts(150, 3, seed=11)


@pytest.fixture(scope="module")
def pair(sim):
    vb = vbsvm.svm("y ~ x1 + x2 + x3", data=sim, seed=1, chains=2, draws=300, method="meanfield")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        gibbs = vbsvm.svm("y ~ x1 + x2 + x3", data=sim, method="gibbs", chains=2, draws=1500, tune=300,
                          seed=1, progress=False)
    return vb, gibbs


@pytest.fixture(scope="module")
def cmp(pair):
    return compare(*pair)


@pytest.mark.slow
def test_table_columns_and_values(cmp, pair):
    vb, gibbs = pair
    tab = cmp.table()
    assert cmp.reference == "gibbs" and list(cmp.fits) == ["vb", "gibbs"]
    assert list(tab.index) == ["beta[Intercept]", "beta[x1]", "beta[x2]", "beta[x3]", "sigma2_u"]
    assert list(tab.columns) == ["vb_mean", "vb_sd", "gibbs_mean", "gibbs_sd", "vb_diff_sd", "vb_sd_ratio",
                                 "vb_sd_lr", "vb_sd_lr_ratio", "vb_accuracy"]
    beta = tab.iloc[:4]
    np.testing.assert_allclose(beta["vb_mean"], vb.coef["mean"])
    np.testing.assert_allclose(beta["vb_sd"], vb.coef["sd"])
    np.testing.assert_allclose(beta["gibbs_mean"], gibbs.coef["mean"])
    np.testing.assert_allclose(beta["gibbs_sd"], gibbs.coef["sd"])
    np.testing.assert_allclose(tab.loc["sigma2_u", ["vb_mean", "gibbs_mean"]],
                               [vb.varcomp().loc["sigma2_u", "mean"], gibbs.varcomp().loc["sigma2_u", "mean"]])
    np.testing.assert_allclose(beta["vb_diff_sd"], (vb.coef["mean"] - gibbs.coef["mean"]) / gibbs.coef["sd"])
    np.testing.assert_allclose(beta["vb_sd_ratio"], vb.coef["sd"] / gibbs.coef["sd"])
    assert np.isnan(tab.loc["sigma2_u", "vb_sd_lr"])
    # every parameter gets an accuracy; mean-field VB here: sds ~half, so clearly below 100
    acc = tab["vb_accuracy"]
    assert acc.notna().all() and (acc > 20).all() and (acc[:4] < 90).all()
    # the accuracy column is the accuracy() of the closed-form q against the Gibbs draws
    draws = gibbs.to_arviz()["posterior"]["beta"].sel(coef="x1").values.ravel()
    q = stats.norm(vb.coef.loc["x1", "mean"], vb.coef.loc["x1", "sd"])
    assert tab.loc["beta[x1]", "vb_accuracy"] == pytest.approx(accuracy(q, draws), abs=1e-9)


@pytest.mark.slow
def test_table_without_lr_and_with_ranef():
    df = vbsvm.datasets.simulate_grouped(15, 5, seed=2)
    f = "y ~ time + (1 | group)"
    vb = vbsvm.svm(f, data=df, chains=1, draws=400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        gibbs = vbsvm.svm(f, data=df, method="gibbs", chains=1, draws=400, tune=100, progress=False, seed=2)
    tab = compare(vb, gibbs).table(ranef=True, lr=False)
    assert "vb_sd_lr" not in tab.columns
    assert [p for p in tab.index if p.startswith("b_group[")] == [f"b_group[{g}]" for g in vb.ranef()["group"].index]
    assert {"sigma2_u", "sigma2_group"} <= set(tab.index)
    np.testing.assert_allclose(tab.loc[[f"b_group[{g}]" for g in vb.ranef()["group"].index], "vb_mean"],
                               vb.ranef()["group"]["mean"])


@pytest.mark.slow
def test_predictions_agreement(cmp, pair, sim):
    pred = cmp.predictions()
    assert list(pred.index) == ["vb", "gibbs"]
    assert pred.loc["gibbs", "agreement"] == 1 and pred.loc["gibbs", "mean_abs_diff_prob"] == 0
    vb, gibbs = pair
    same = (vb.predict(sim) == gibbs.predict(sim)).mean()
    assert pred.loc["vb", "agreement"] == pytest.approx(same)
    dprob = np.abs(vb.predict(sim, kind="prob") - gibbs.predict(sim, kind="prob"))
    assert pred.loc["vb", "mean_abs_diff_prob"] == pytest.approx(dprob.mean())
    assert pred.loc["vb", "max_abs_diff_prob"] == pytest.approx(dprob.max())
    assert pred.loc["vb", "accuracy_train"] == pytest.approx((vb.predict(sim) == sim["y"]).mean())
    assert pred.loc["vb", "agreement"] > 0.9


def test_map_fit_in_a_comparison(pair, sim):
    vb, gibbs = pair
    mode = vbsvm.svm("y ~ x1 + x2 + x3", data=sim, method="map", penalty=0.5)
    c = compare(vb, gibbs, mode)
    tab = c.table(lr=False)
    assert np.isnan(tab["map_accuracy"]).all() and np.isnan(tab["map_sd"]).all()
    np.testing.assert_allclose(tab["map_mean"].iloc[:4], mode.coef["mean"])
    assert np.isnan(c.predictions().loc["map", "mean_abs_diff_prob"])


def test_names_and_reference(pair):
    vb, gibbs = pair
    c = compare(gibbs, vb, names=["mcmc", "mfvb"])
    assert c.reference == "mcmc"
    assert "mfvb_accuracy" in c.table(lr=False).columns
    assert compare(vb, gibbs, reference="vb").reference == "vb"
    assert compare(vb, gibbs, reference=1).reference == "gibbs"
    assert list(compare(vb, vb).fits) == ["vb", "vb_2"]
    assert compare([vb, gibbs]).reference == "gibbs"
    with pytest.raises(InputError, match="at least two"):
        compare(vb)
    with pytest.raises(InputError, match="one name per fit"):
        compare(vb, gibbs, names=["a"])
    with pytest.raises(InputError, match="distinct"):
        compare(vb, gibbs, names=["a", "a"])
    with pytest.raises(InputError, match="reference"):
        compare(vb, gibbs, reference="exact")
    with pytest.raises(InputTypeError, match="not a vbsvm fit"):
        compare(vb, vb.coef)


def test_vb_draws_take_the_reference_shape(pair):
    vb, gibbs = pair   # vb stores 2 x 300 draws, gibbs 2 x 1500
    trees = compare(vb, gibbs)._trees()
    assert trees["vb"]["posterior"]["beta"].shape == trees["gibbs"]["posterior"]["beta"].shape == (2, 1500, 4)
    assert vb.to_arviz()["posterior"]["beta"].shape == (2, 300, 4)   # the fit itself is untouched


def test_plots_render_to_png(cmp, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    for kind in ("forest", "density"):
        path = tmp_path / f"{kind}.png"
        cmp.plot(kind).savefig(path)
        assert path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError, match="Laplace-zero"):
        cmp.plot("inclusion")
    with pytest.raises(InputError, match="kind"):
        cmp.plot("violin")


def test_text_output(cmp):
    text = cmp.to_text()
    assert "reference: gibbs" in text and "vb_accuracy" in text and "agreement" in text
    assert str(cmp) == text
    assert isinstance(cmp, Comparison) and "gibbs" in repr(cmp)


def test_comparison_of_saved_fits_is_the_same(pair, tmp_path):
    vb, gibbs = pair
    vb.save(tmp_path / "vb.nc")
    gibbs.save(tmp_path / "gibbs.nc")
    again = compare(vbsvm.load(tmp_path / "vb.nc"), vbsvm.load(tmp_path / "gibbs.nc"))
    pd.testing.assert_frame_equal(again.table(lr=False), compare(vb, gibbs).table(lr=False))
    pd.testing.assert_frame_equal(again.predictions(), compare(vb, gibbs).predictions())


def test_dot_formula_round_trip_predicts_the_same(tmp_path):
    df = vbsvm.datasets.simulate_luts(100, 12, seed=1)
    fit = vbsvm.svm("y ~ .", data=df)
    fit.save(tmp_path / "dot.nc")
    back = vbsvm.load(tmp_path / "dot.nc")
    pd.testing.assert_series_equal(back.predict(df, kind="prob"), fit.predict(df, kind="prob"))


@pytest.mark.slow
def test_laplace_zero_inclusion_side_by_side(sim, tmp_path):
    LaplaceZero = getattr(vbsvm, "LaplaceZero", None)
    if LaplaceZero is None:
        pytest.skip("vbsvm.LaplaceZero is not exported yet")
    f = "y ~ x1 + x2 + x3"
    prior = LaplaceZero(rho=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vb = vbsvm.svm(f, data=sim, prior=prior, chains=2, draws=500)
        gibbs = vbsvm.svm(f, data=sim, prior=prior, method="gibbs", chains=2, draws=500, tune=200,
                          progress=False, seed=1)
    c = compare(vb, gibbs)
    tab = c.table(lr=False)
    for name, fit in (("vb", vb), ("gibbs", gibbs)):
        inc = fit.inclusion()["p_include"]
        np.testing.assert_allclose(tab.loc[[f"beta[{t}]" for t in inc.index], f"{name}_p_include"], inc)
    assert tab["vb_accuracy"].notna().all()
    import matplotlib

    matplotlib.use("Agg")
    c.plot("inclusion").savefig(tmp_path / "inc.png")
    assert (tmp_path / "inc.png").stat().st_size > 5_000


def test_vb_draws_are_fixed_once_fitted_without_seed(sim):
    fit = vbsvm.svm("y ~ x1 + x2", data=sim)
    a = fit.to_arviz()["posterior"]["beta"].values
    np.testing.assert_array_equal(a, fit.to_arviz()["posterior"]["beta"].values)


# ------------------------------------------------------------------------------ draw shapes, GP
def _gp_frame(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1 + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    return pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "cls": y})


def test_draw_shape_requests_are_honoured_for_every_fit_type(sim):
    incomplete = sim.copy()
    incomplete.loc[::9, "x1"] = np.nan
    df = _gp_frame(80)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = {
            "vb": vbsvm.svm("y ~ x1 + x2", data=sim, chains=2, draws=300),
            "laplace_zero": vbsvm.svm("y ~ x1 + x2 + x3", data=sim, prior=vbsvm.LaplaceZero(rho=0.3),
                                      chains=2, draws=300),
            "impute": vbsvm.svm("y ~ x1 + x2", data=incomplete, missing="impute", chains=2, draws=300),
            "gp_svi": vbsvm.gpsvm("cls ~ a + b", df, n_inducing=10, seed=0, optimize=False),
            "gibbs": vbsvm.svm("y ~ x1 + x2", data=sim, method="gibbs", chains=2, draws=50, tune=20,
                               progress=False, seed=1),
        }
    for name, fit in fits.items():
        var = "u" if name.startswith("gp") else "beta"
        own = fit.to_arviz()["posterior"][var].shape[:2]
        for shape in [(3, 41), (2, 17)]:  # a second request must not reuse the first one's draws
            got = fit.draws(*shape)[var].shape[:2]
            assert got == (own if name == "gibbs" else shape), (name, shape, got)
        assert fit.to_arviz()["posterior"][var].shape[:2] == own, name  # the fit is untouched
    sel = fits["laplace_zero"]
    assert sel._post.draws()[0].shape[:2] == (2, 300)  # its own posterior object kept its shape


def test_gp_draws_are_pure_and_of_the_requested_shape():
    df = _gp_frame(80)
    fit = vbsvm.gpsvm("cls ~ a + b", df, n_inducing=10, seed=0, optimize=False)
    a = fit.draws(2, 25, seed=3)["u"]
    assert a.shape == (2, 25, 10)
    np.testing.assert_array_equal(a, fit.draws(2, 25, seed=3)["u"])
    assert fit.draws(1, 7)["u"].shape == (1, 7, 10)
    assert fit.to_arviz()["posterior"]["u"].shape == (4, 1000, 10)
    other = fit.with_draw_shape(3, 5)
    assert other.to_arviz()["posterior"]["u"].shape == (3, 5, 10)
    assert fit.settings["draws"] == 1000 and fit.to_arviz()["posterior"]["u"].shape == (4, 1000, 10)
    F = fit.f_draws(df.iloc[:4], 2, 3000, seed=1)
    mean, var = fit.predict_f(df.iloc[:4])
    np.testing.assert_allclose(F.reshape(-1, 4).mean(0), mean, atol=4 * np.sqrt(var.max() / 6000))
    np.testing.assert_allclose(F.reshape(-1, 4).var(0), var, rtol=0.1)


@pytest.mark.slow
def test_compare_gp_svi_against_gibbs_of_the_same_formula(tmp_path):
    df = _gp_frame(120, seed=3)
    kw = dict(n_inducing=15, seed=2, optimize=False, lengthscale=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svi = vbsvm.gpsvm("cls ~ a + b", df, **kw)
        gibbs = vbsvm.gpsvm("cls ~ a + b", df, method="gibbs", draws=600, tune=200, chains=2, **kw)
    c = vbsvm.compare(svi, gibbs, n_points=12)
    assert c.reference == "gibbs"
    tab = c.table()
    f_rows = [p for p in tab.index if p.startswith("f[")]
    assert len(f_rows) == 12
    assert {"rbf.variance", "rbf.lengthscale", "bias.variance"} <= set(tab.index)
    np.testing.assert_allclose(tab.loc["rbf.lengthscale", ["svi_mean", "gibbs_mean"]], 1.0)
    acc = tab.loc[f_rows, "svi_accuracy"]
    assert acc.notna().all() and acc.median() > 70 and acc.min() > 50, acc.describe()
    assert tab.loc["rbf.variance", "svi_accuracy"] != tab.loc["rbf.variance", "svi_accuracy"]  # NaN: points
    pred = c.predictions()
    assert pred.loc["svi", "agreement"] > 0.9
    with pytest.raises(InputError, match="GP fits"):
        c.plot("forest")
    with pytest.raises(InputError, match="n_points"):
        vbsvm.compare(svi, gibbs, n_points=0)
    # saved GP fits carry no training rows: f is compared at the reference's inducing points
    svi.save(tmp_path / "svi.nc")
    gibbs.save(tmp_path / "gibbs.nc")
    loaded = vbsvm.compare(vbsvm.load(tmp_path / "svi.nc"), vbsvm.load(tmp_path / "gibbs.nc"))
    tab2 = loaded.table()
    assert sum(p.startswith("f[z") for p in tab2.index) == 15
    assert tab2.filter(like="f[z", axis=0)["svi_accuracy"].median() > 70
    assert "carries no training data" in loaded.to_text()
    with pytest.raises(InputError, match="predictions\\(data=frame\\)"):
        loaded.predictions()
    assert loaded.predictions(df)["agreement"].min() > 0.9
