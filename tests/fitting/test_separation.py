"""Separable data under penalty="auto": detected (a certificate or an LP, bounded in size), warned about with the
consequence for the posterior means and the fixes, recorded in fit.info and the summary.

Under sigma2_u ~ IG(A_u, B_u) the coefficients' posterior means do not exist when the slopes alone
separate the classes and A_u <= 1/2, and exist only through the intercept's prior when the
separation needs the intercept and A_u <= 1 (derivation in vbsvm.fitting.svm._separation_under_inferred_penalty)."""

import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.fitting.svm import warn_about_data
from vbsvm.formula.design import build_design
from vbsvm.exceptions import DiagnosticWarning


def fit_recording(formula, data, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fit = vbsvm.svm(formula, data, **kw)
    return fit, [str(r.message) for r in rec if issubclass(r.category, DiagnosticWarning)]


def separation(messages):
    return [m for m in messages if "separab" in m]


@pytest.fixture(scope="module")
def luts_separable():
    return vbsvm.datasets.simulate_luts(n=500, d=100, seed=0)


@pytest.fixture(scope="module")
def threshold_data():
    """Separable only with the intercept: y = 1 exactly when x > 0.8, far from the mean of x."""
    x = np.random.default_rng(3).normal(size=100)
    return pd.DataFrame({"x": x, "y": (x > 0.8).astype(int)})


def test_simulate_luts_d100_is_separable_and_said_so(luts_separable):
    fit, messages = fit_recording("y ~ .", luts_separable)
    (msg,) = separation(messages)
    assert "posterior means do not exist for A_u <= 0.5" in msg and "IG(A_u=0.01, B_u)" in msg
    assert "penalty=<float>" in msg and "A_u > 0.5" in msg
    assert fit.info["separable"] is True and fit.info["separable_without_intercept"] is True
    text = fit.summary().as_text()
    assert "Separable data" in text and "do not exist for A_u <= 1/2 (here A_u = 0.01)" in " ".join(text.split())


def test_non_separable_simulation_gets_no_warning():
    data = vbsvm.datasets.simulate_luts(n=500, d=10, seed=0)
    fit, messages = fit_recording("y ~ .", data)
    assert separation(messages) == [] and fit.info["separable"] is False
    assert "Separable" not in fit.summary().as_text()


def test_separation_needing_the_intercept_names_the_intercept_prior(threshold_data):
    fit, messages = fit_recording("y ~ x", threshold_data, method="map")
    (msg,) = separation(messages)
    assert "exist only through the intercept's N(0, sigma2_beta) prior" in msg and "A_u > 1" in msg
    assert fit.info["separable"] is True and fit.info["separable_without_intercept"] is False
    # A_u in (1/2, 1]: the slopes' cone alone would have means, the intercept's direction does not
    _, messages = fit_recording("y ~ x", threshold_data, method="map", A_u=0.75)
    assert len(separation(messages)) == 1


def test_no_check_where_the_means_exist(luts_separable, threshold_data):
    for kw in ({"A_u": 2.0, "B_u": 1.0}, {"penalty": 1.0}):
        fit, messages = fit_recording("y ~ x", threshold_data, method="map", **kw)
        assert separation(messages) == [] and "separable" not in fit.info
    # A_u = 0.75 on data the slopes separate: means exist at the slopes' cone but the
    # intercept's direction still needs A_u > 1, so it is said (as the weaker statement)
    design = build_design("y ~ .", luts_separable)
    with pytest.warns(DiagnosticWarning, match=r"grow without bound with sigma2_beta for A_u <= 1"):
        found = warn_about_data(design, penalty="auto", A_u=0.75)
    assert found == {"separable": True, "separable_without_intercept": True}


def test_the_check_is_skipped_above_the_lp_size(luts_separable):
    design = build_design("y ~ .", luts_separable)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        assert warn_about_data(design, penalty="auto", A_u=0.01, max_lp_size=10) == {"separable": None}


def test_separable_with_the_intercept_held_at_zero(threshold_data):
    d = build_design("y ~ x", threshold_data)
    assert d.linearly_separable() is True and d.linearly_separable(intercept=False) is False
    centred = threshold_data.assign(y=(threshold_data["x"] > threshold_data["x"].mean()).astype(int))
    assert build_design("y ~ x", centred).linearly_separable(intercept=False) is True


def test_a_subset_settles_overlapping_classes_and_the_full_lp_confirms_separation(monkeypatch):
    """Separable rows stay separable on any subset: an infeasible LP on a subset ends the check;
    a feasible one is confirmed (or refuted) by the LP on every row. (The LP alone: the
    certificates that usually spare it are switched off.)"""
    import vbsvm.formula.design as design_module

    monkeypatch.setattr(design_module, "SEPARATION_SUBSET", 200)
    monkeypatch.setattr(design_module, "separation_certificate", lambda A: None)
    calls = []
    solve = design_module.Design._separating_lp
    monkeypatch.setattr(design_module.Design, "_separating_lp",
                        lambda self, rows, cols: calls.append(len(rows)) or solve(self, rows, cols))
    overlapping = build_design("y ~ .", vbsvm.datasets.simulate_luts(n=5000, d=5, seed=1))
    assert overlapping.linearly_separable() is False and calls == [200]
    calls.clear()
    x = np.random.default_rng(4).normal(size=(8000, 2))
    x = x[np.abs(x.sum(1) - 0.3) > 0.1][:5000]  # a gap around the separating line
    separable = build_design("y ~ a + b", pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "y": (x.sum(1) > 0.3) * 1}))
    assert separable.linearly_separable() is True and calls == [200, 5000]
    calls.clear()
    # separable on the subset only: one point on the wrong side, found by the full LP
    flipped = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "y": (x.sum(1) > 0.3) * 1})
    worst = int(np.argmax(x.sum(1)))
    assert worst % 25 != 0  # not one of the 200 evenly spaced rows (every 25th)
    flipped.loc[worst, "y"] = 0
    assert build_design("y ~ a + b", flipped).linearly_separable() is False and calls == [200, 5000]
