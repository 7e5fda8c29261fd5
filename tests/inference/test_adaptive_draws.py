"""Adaptive run length of Gibbs fits: chains continue exactly where they stopped.

* Engine (:func:`vbsvm.inference.gibbs.run_chains` with a ``monitor``): an extended run gives the
  draws of an uninterrupted run of the same length, serially and in worker processes; no extension
  when the targets hold; the cap; Ctrl-C during an extension keeps the draws; thinning.
* Fits (:func:`vbsvm.svm`): ``draws=50`` extended to 150 equals ``draws=150`` with the extension off
  for the linear model with a random intercept (whose kernel is tuned: ``gibbs_adapt``), Laplace-zero
  selection and imputation; ``fit.info``, the summary header and the warning report it.
"""

import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.exceptions import DiagnosticWarning, InputError, InterruptWarning
from vbsvm.inference import gibbs
from vbsvm.inference.gibbs import extension_size, run_chains
from support.runs import Counter


def table(r_hat, ess):
    return pd.DataFrame({"r_hat": [r_hat, 1.0], "ess_bulk": [ess, 5000.0]}, index=["a", "b"])


class Monitor:
    """Returns fixed diagnostics and records the draws per chain it was shown."""

    def __init__(self, r_hat=1.5, ess=1.0):
        self.diag, self.seen = table(r_hat, ess), []

    def __call__(self, draws):
        self.seen.append(draws["theta"].shape[1])
        return self.diag


@pytest.fixture(autouse=True)
def _extend_however_far(monkeypatch):
    """The tests below force extensions with chains far from the targets (ESS 1 from the fixed
    monitor, 50-draw fits), which the engine otherwise does not extend (``HOPELESS``)."""
    monkeypatch.setattr(gibbs, "HOPELESS", np.inf)


# ----------------------------------------------------------------------------- engine
def test_no_extension_when_the_cap_cannot_help(monkeypatch):
    """Chains whose ESS projects to more than HOPELESS x max_draws are not extended (they warn)."""
    monkeypatch.setattr(gibbs, "HOPELESS", 2.0)
    kw = dict(tune=5, chains=2, seed=4, progress=False)
    hopeless = Monitor(r_hat=1.0, ess=40.0)  # needs 20 * 1.1 * 10 = 220 > 2 * 60 draws
    res = run_chains(Counter(), draws=20, max_draws=60, monitor=hopeless, **kw)
    assert (res.n_draws, res.extensions, hopeless.seen) == (20, [], [20])
    near = Monitor(r_hat=1.0, ess=200.0)  # needs 44 <= 120: extended
    res = run_chains(Counter(), draws=20, max_draws=60, monitor=near, **kw)
    assert res.n_draws > 20 and res.extensions


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_extended_chains_equal_one_uninterrupted_run(n_jobs):
    kw = dict(tune=5, chains=3, seed=4, progress=False)
    monitor = Monitor()
    extended = run_chains(Counter(), draws=20, max_draws=60, monitor=monitor, n_jobs=n_jobs, **kw)
    whole = run_chains(Counter(), draws=60, **kw)
    np.testing.assert_array_equal(extended.draws["theta"], whole.draws["theta"])
    assert monitor.seen == [20, 40]  # blocks of at most the requested draws; none after the cap
    assert (extended.n_draws, extended.requested, extended.max_draws) == (60, 20, 60)
    assert [(e["from"], e["to"]) for e in extended.extensions] == [(20, 40), (40, 60)]


def test_thinned_extension_equals_uninterrupted_run():
    kw = dict(tune=3, chains=2, seed=1, thin=3, progress=False)
    extended = run_chains(Counter(), draws=10, max_draws=25, monitor=Monitor(), **kw)
    whole = run_chains(Counter(), draws=25, **kw)
    np.testing.assert_array_equal(extended.draws["theta"], whole.draws["theta"])
    np.testing.assert_array_equal(whole.draws["theta"][0, :, 0], 3 + 3 * np.arange(1, 26))


def test_no_extension_when_the_targets_hold(monkeypatch):
    monkeypatch.setattr(gibbs, "DEFAULT_MAX_DRAWS_FACTOR", 4)
    monitor = Monitor(r_hat=1.001, ess=1000.0)
    res = run_chains(Counter(), draws=20, tune=5, chains=2, seed=0, progress=False, monitor=monitor)
    assert res.n_draws == 20 and res.extensions == [] and monitor.seen == [20]
    assert res.max_draws == 80


def test_max_draws_equal_to_draws_switches_the_extension_off():
    monitor = Monitor()
    res = run_chains(Counter(), draws=20, tune=5, chains=2, seed=0, progress=False, monitor=monitor, max_draws=20)
    assert res.n_draws == 20 and monitor.seen == []


def test_default_cap_is_four_times_the_draws(monkeypatch):
    monkeypatch.setattr(gibbs, "DEFAULT_MAX_DRAWS_FACTOR", 4)
    res = run_chains(Counter(), draws=10, tune=0, chains=2, seed=0, progress=False, monitor=Monitor())
    assert res.n_draws == 40 and res.max_draws == 40


def test_extension_is_sized_from_the_ess_shortfall():
    assert extension_size(table(1.001, 400.0), 1000, 1000) == 0
    assert extension_size(table(1.001, 200.0), 1000, 1000) == 1000  # x 2.2 wanted, one block at most
    assert extension_size(table(1.001, 380.0), 1000, 1000) == 158  # 1000 * (1.1 * 400 / 380 - 1)
    assert extension_size(table(1.0105, 500.0), 1000, 1000) == 155  # R-hat - 1 like 1 / ESS
    assert extension_size(table(1.001, 399.9), 1000, 1000) == 101  # at least a tenth of the draws
    nan = pd.DataFrame({"r_hat": [np.nan, 1.0], "ess_bulk": [np.nan, 900.0]})
    assert extension_size(nan, 1000, 1000) == 0  # a constant parameter does not count


def test_ctrl_c_during_an_extension_keeps_the_draws_so_far():
    # 5 tuning sweeps, 20 draws (sweeps 6-25), then the extension fails at sweep 30 of chain 1
    with pytest.warns(InterruptWarning, match="of the 3 x 40 asked for"):
        res = run_chains(Counter(fail_at=30), draws=20, tune=5, chains=3, seed=2, progress=False,
                         monitor=Monitor(), max_draws=80)
    assert res.interrupted and (res.chains, res.n_draws) == (3, 20)
    whole = run_chains(Counter(), draws=20, tune=5, chains=3, seed=2, progress=False)
    np.testing.assert_array_equal(res.draws["theta"], whole.draws["theta"])


def test_checkpointed_run_is_not_extended(tmp_path):
    monitor = Monitor()
    res = run_chains(Counter(), draws=20, tune=5, chains=2, seed=0, progress=False, monitor=monitor,
                     max_draws=80, checkpoint=tmp_path / "run")
    assert res.n_draws == 20 and res.max_draws == 20 and monitor.seen == []


# ----------------------------------------------------------------------------- fits
@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n = 120
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n), "g": rng.integers(0, 12, size=n)})
    df["y"] = (df.x + 0.5 * df.z + 0.3 * (df.g % 3) + rng.normal(size=n) > 0).astype(int)
    return df


GIBBS = dict(method="gibbs", tune=40, chains=2, seed=5, progress=False)


def quiet_fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        return vbsvm.svm(*args, **kwargs)


@pytest.mark.parametrize("model", ["random_intercept", "laplace_zero", "impute"])
@pytest.mark.slow
def test_fit_extended_to_150_draws_equals_a_150_draw_run(data, model):
    df, kw = data, dict(GIBBS)
    formula = "y ~ x + z + (1 | g)"
    if model == "laplace_zero":
        kw["prior"] = vbsvm.LaplaceZero(rho=0.5)
    elif model == "impute":
        df = data.copy()
        df.loc[::7, "z"] = np.nan
        kw["missing"] = "impute"
    # 2 chains of 50 draws cannot reach bulk ESS 400: the run is extended to the cap
    extended = quiet_fit(formula, df, draws=50, max_draws=150, **kw)
    whole = quiet_fit(formula, df, draws=150, max_draws=150, **kw)
    for name in ("theta_draws", "sigma2_draws"):
        np.testing.assert_array_equal(extended.posterior[name], whole.posterior[name])
    assert extended.info["draws_requested"] == 50 and extended.info["draws"] == 150
    assert extended.info["draws_extended"] and not whole.info["draws_extended"]
    assert [(r["from"], r["to"]) for r in extended.info["extension_rounds"]] == [(50, 100), (100, 150)]


def test_parallel_extension_equals_serial(data):
    serial = quiet_fit("y ~ x + z + (1 | g)", data, draws=30, max_draws=70, **GIBBS)
    parallel = quiet_fit("y ~ x + z + (1 | g)", data, draws=30, max_draws=70, n_jobs=2, **GIBBS)
    np.testing.assert_array_equal(serial.posterior["theta_draws"], parallel.posterior["theta_draws"])
    assert serial.posterior["theta_draws"].shape[1] == 70


def test_cap_reached_warns_and_the_summary_says_so(data):
    with pytest.warns(DiagnosticWarning, match=r"extended to max_draws=60 per chain.*the worst is"):
        fit = vbsvm.svm("y ~ x + z", data, draws=30, max_draws=60, **GIBBS)
    text = str(fit.summary())
    assert "2 x 60 (tune 40, thin 1)" in text
    assert "from 30 draws to max_draws, short of R-hat <= 1.01, bulk ESS >= 400" in text
    assert fit.info["max_draws"] == 60 and fit.settings["draws"] == 30


def test_the_warning_checks_fixed_effects_and_variance_components_only(data):
    fit = quiet_fit("y ~ x + z + (1 | g)", data, draws=30, max_draws=30, **GIBBS)
    rows = fit.summary_diagnostics().index
    assert list(rows) == ["beta[Intercept]", "beta[x]", "beta[z]", "sigma2_u", "sigma2_g"]
    assert set(rows) < set(fit.diagnostics().index)


def test_summary_header_of_a_run_that_met_the_targets():
    # a cheap model that mixes fast: 4 chains reach ESS 400 after a short extension
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"x": rng.normal(size=60)})
    df["y"] = (df.x + rng.normal(size=60) > 0).astype(int)
    fit = vbsvm.svm("y ~ x", df, method="gibbs", penalty=1.0, draws=80, max_draws=800, tune=50, seed=1,
                    progress=False)
    assert fit.info["draws_extended"] and fit.info["draws"] < 800
    text = str(fit.summary())
    assert f"4 x {fit.info['draws']} (tune 50, thin 1)" in text
    assert "from 80 draws to reach R-hat <= 1.01, bulk ESS >= 400" in text


def test_max_draws_below_draws_is_refused(data):
    with pytest.raises(InputError, match="max_draws must be at least draws"):
        vbsvm.svm("y ~ x", data, draws=100, max_draws=50, **GIBBS)


def test_extended_fit_saves_and_loads(data, tmp_path):
    fit = quiet_fit("y ~ x + (1 | g)", data, draws=30, max_draws=60, **GIBBS)
    fit.save(tmp_path / "fit.nc")
    back = vbsvm.load(tmp_path / "fit.nc")
    np.testing.assert_array_equal(back.posterior["theta_draws"], fit.posterior["theta_draws"])
    assert back.info["extension_rounds"] == fit.info["extension_rounds"] and back.settings["max_draws"] == 60


def test_gp_gibbs_is_extended_and_equals_the_longer_run():
    """gpsvm(method="gibbs") extends its chains like the linear fits: the inducing values of
    ``draws=40`` extended to 120 are those of a 120-draw run; the fit records the run length and
    warns when the cap is reached short of the targets."""
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"a": rng.normal(size=80), "b": rng.normal(size=80)})
    df["cls"] = np.where(df.a - df.b + 0.5 * rng.normal(size=80) > 0, "yes", "no")
    kw = dict(method="gibbs", n_inducing=8, optimize=False, tune=30, chains=2, seed=3, progress=False)
    with pytest.warns(DiagnosticWarning, match=r"extended to max_draws=120 per chain.*the worst is u\["):
        extended = vbsvm.gpsvm("cls ~ a + b", df, draws=40, max_draws=120, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        whole = vbsvm.gpsvm("cls ~ a + b", df, draws=120, max_draws=120, **kw)
    np.testing.assert_array_equal(extended.gibbs_draws, whole.gibbs_draws)
    assert extended.settings["draws_requested"] == 40 and extended.settings["draws"] == 120
    assert extended.settings["draws_extended"] and not whole.settings["draws_extended"]
    assert "2 chains x 120 draws" in str(extended.summary())
    with pytest.raises(InputError, match="max_draws must be at least draws"):
        vbsvm.gpsvm("cls ~ a + b", df, draws=40, max_draws=20, **kw)
