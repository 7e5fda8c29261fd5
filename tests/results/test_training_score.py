"""The training rows' score moments that fit the probability scale (``Fit.training_score``) are
those of ``predict_score`` on the training frame, for every kind of linear fit: the same numbers
(to rounding where the fixed-effect design's own rows are mapped back to the original scale)."""

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
    block = fit.predict_score(fit.design.raw.iloc[37:74], new_levels="zero")
    for got, want in ((fit.training_score(), expected), (fit.training_score(slice(37, 74)), block)):
        for value, column in zip(got, ("mean", "sd")):
            want_col = want[column].to_numpy()
            scale = np.nanmax(np.abs(want_col)) if np.isfinite(want_col).any() else 1.0
            np.testing.assert_allclose(value, want_col, rtol=1e-12, atol=1e-12 * scale, equal_nan=True,
                                       err_msg=f"{kind} {column}")
