"""Progress bars: one bar per fit (over all Gibbs chains' sweeps), only where someone sees it."""

import warnings

import numpy as np
import pytest

import vbsvm
import vbsvm.inference.progress as progress


class RecordingBar:
    """Stands in for tqdm: records what each bar was asked to show."""

    made = []

    def __init__(self, total, desc, **_):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        RecordingBar.made.append(self)

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, *_, **__):
        pass

    def close(self):
        self.closed = True


@pytest.fixture
def bars(monkeypatch):
    RecordingBar.made = []
    monkeypatch.setattr(progress, "tqdm", RecordingBar)
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    return RecordingBar.made


@pytest.fixture(scope="module")
def data():
    return vbsvm.datasets.simulate_luts(n=60, d=2, seed=1)


def fit(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vbsvm.svm(*args, **kw)


def test_gibbs_shows_one_bar_over_every_chain(bars, data):
    fit("y ~ .", data, method="gibbs", chains=3, draws=20, tune=10, seed=1, progress=True)
    (bar,) = bars
    assert bar.desc == "Gibbs" and bar.total == 3 * 30 and bar.n == 90 and bar.closed


def test_no_bar_without_progress_nor_off_a_terminal(bars, data, monkeypatch):
    fit("y ~ .", data, method="gibbs", chains=2, draws=10, tune=5, seed=1, progress=False)
    assert bars == []
    monkeypatch.setattr(progress, "_terminal", lambda: False)
    fit("y ~ .", data, method="gibbs", chains=2, draws=10, tune=5, seed=1, progress=True)
    assert bars == []


def test_workers_draw_no_bar(bars, data):
    fit("y ~ .", data, method="gibbs", chains=2, draws=10, tune=5, seed=1, progress=True, n_jobs=2)
    assert bars == []


def test_gp_batch_vb_and_svi_show_their_steps(bars, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vbsvm.gpsvm("y ~ .", data, method="vb", n_inducing=5, seed=1, progress=True)
        vbsvm.gpsvm("y ~ .", data, method="svi", n_inducing=5, seed=1, progress=True, max_iter=60)
    assert [b.desc for b in bars] == ["VB sweeps", "SVI steps"]
    assert all(b.closed and 0 < b.n <= b.total for b in bars)


def test_imputation_completions_have_a_bar(bars, data):
    holes = data.copy()
    holes.loc[np.arange(0, 60, 7), "x1"] = np.nan
    fit("y ~ .", holes, missing="impute", method="meanfield", seed=1, progress=True)
    assert [b.desc for b in bars].count("imputation completions") == 1


def test_the_calibrated_fit_counts_its_ep_runs(bars, data):
    fit = vbsvm.svm("y ~ .", data, seed=1, progress=True)
    (bar,) = [b for b in bars if b.desc == "EP runs over the variances"]
    assert bar.total is None and bar.closed and bar.n == fit.info["n_ep"]
