"""The training rows' score moments that fit the probability scale (``Fit.training_score``) are
exactly those of ``predict_score`` on the training frame, for every kind of linear fit."""

import warnings

import numpy as np
import pytest

import vbsvm


def fits():
    luts = vbsvm.datasets.simulate_luts(120, 8, seed=1)
    grouped = vbsvm.datasets.simulate_grouped(12, 10, seed=2)
    mcar = vbsvm.datasets.simulate_mcar(150, seed=3)[1]
    sparse = vbsvm.datasets.simulate_sparse(100, 6, 2, seed=4)
    cat = luts.assign(g=np.where(luts["x1"] > 0, "a", "b"))
    yield "vb", vbsvm.svm("y ~ .", luts, seed=1)
    yield "meanfield", vbsvm.svm("y ~ .", luts, method="meanfield", seed=1)
    yield "map", vbsvm.svm("y ~ .", luts, method="map", penalty=0.5)
    yield "gibbs", vbsvm.svm("y ~ .", luts, method="gibbs", draws=50, tune=50, chains=2, seed=1, progress=False)
    yield "formulaic terms", vbsvm.svm("y ~ x2 * C(g) + np.log(x3 ** 2)", cat, method="meanfield", seed=1)
    yield "random intercepts", vbsvm.svm("y ~ time * treatment + (1 | group)", grouped, method="meanfield", seed=1)
    yield "random slopes", vbsvm.svm("y ~ time + (1 + time | group)", grouped, seed=1)
    yield "imputed", vbsvm.svm("y ~ .", mcar, missing="impute", method="meanfield", seed=1)
    yield "selection", vbsvm.svm("y ~ .", sparse, prior=vbsvm.LaplaceZero(rho=0.2), method="meanfield", seed=1)


@pytest.mark.parametrize("kind, fit", list(fits()), ids=lambda v: v if isinstance(v, str) else "")
def test_training_score_is_predict_score_on_the_training_frame(kind, fit):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fit.predict_score(fit.design.raw, new_levels="zero")
    mean, sd = fit.training_score()
    assert np.array_equal(mean, expected["mean"].to_numpy(), equal_nan=True), kind
    assert np.array_equal(sd, expected["sd"].to_numpy(), equal_nan=True), kind
    block = fit.predict_score(fit.design.raw.iloc[37:74], new_levels="zero")
    mean, sd = fit.training_score(slice(37, 74))
    assert np.array_equal(mean, block["mean"].to_numpy(), equal_nan=True), kind
    assert np.array_equal(sd, block["sd"].to_numpy(), equal_nan=True), kind
