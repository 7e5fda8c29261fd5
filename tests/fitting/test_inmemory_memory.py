"""Memory of the in-memory linear fit: the design is the one n x p copy of the data, a
VB sweep adds a few row vectors and blocks of rows, and the blocked products equal the dense ones.

Peaks are measured with ``tracemalloc`` (numpy reports its buffers to it), the frame built before
tracing starts. No timings here: the sweep's speed is measured by ``benchmarks/inmemory_scale.py``.
"""

import tracemalloc

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.linear import LinearSVMModel
from vbsvm.models.linear_algebra import row_blocks, weighted_gram

SETTINGS = {"penalty": "auto", "sigma2_beta": 1e8, "A_u": 0.01, "B_u": 0.01}

#: the design shares the data's columns only under copy-on-write (pandas >= 3, or switched on)
needs_copy_on_write = pytest.mark.skipif(
    not (int(pd.__version__.split(".")[0]) >= 3 or pd.get_option("mode.copy_on_write") is True),
    reason="without copy-on-write the design keeps a copy of the columns it uses")


def traced_peak(fn):
    """``(peak bytes allocated while fn() ran, its result)``, over what was allocated before."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        return tracemalloc.get_traced_memory()[1] - before, out
    finally:
        if started:
            tracemalloc.stop()


@pytest.fixture(scope="module")
def big():
    """200,000 rows, 20 float64 predictors and the label (the Section 4.2 simulation)."""
    return vbsvm.datasets.simulate_luts(200_000, 20, seed=0)


def test_weighted_gram_equals_the_dense_products():
    rng = np.random.default_rng(1)
    n, p = 60_000, 7
    assert len(row_blocks(n, p)) > 2  # several blocks, the last one partial
    C = np.asfortranarray(rng.standard_normal((n, p)))
    w, r = rng.uniform(0.0, 3.0, n), rng.standard_normal(n)
    A, b = weighted_gram(C, w, r)
    dense = C.T @ (w[:, None] * C)
    assert np.abs(A - dense).max() <= 1e-12 * np.abs(dense).max()
    np.testing.assert_allclose(b, C.T @ r, rtol=1e-11, atol=1e-9)
    assert np.array_equal(A, A.T)
    A0, b0 = weighted_gram(np.ascontiguousarray(C))
    assert b0 is None
    assert np.abs(A0 - C.T @ C).max() <= 1e-12 * np.abs(C.T @ C).max()


@pytest.mark.filterwarnings("ignore::vbsvm.exceptions.ConvergenceWarning")
def test_blocked_score_moments_equal_the_dense_ones(big):
    """The score mean and variance of a sweep, computed by blocks of rows, are ``C mu`` and
    ``diag(C Sigma C')``."""
    d = build_design("y ~ .", big.iloc[:40_000])
    model = LinearSVMModel.from_design(d, SETTINGS)
    assert len(row_blocks(model.n, model.qd + 1)) > 2
    res = coordinate_ascent(model, max_iter=6)
    post = res.q["theta"]
    mean, var = post.linear_predictor()
    np.testing.assert_allclose(mean, d.X @ post.mean_dense, rtol=1e-10, atol=1e-12)
    dense_var = np.einsum("ij,jk,ik->i", d.X, post.cov_dense(), d.X)
    np.testing.assert_allclose(var, dense_var, rtol=1e-9)
    # the ELBO from q alone (score moments recomputed) is the one the sweep reported
    assert model.elbo(res.q) == pytest.approx(res.elbo[-1], rel=1e-12)


@needs_copy_on_write
def test_design_is_the_only_copy_and_the_frame_is_untouched(big):
    frame = big.copy()
    reference = frame.copy()
    peak, d = traced_peak(lambda: build_design("y ~ .", frame))
    size = frame.memory_usage(deep=True).sum()
    assert d.X.nbytes <= size  # 21 float64 columns, the intercept in place of y
    assert peak <= 1.35 * size, peak / size  # X, plus the column-by-column checks
    # no missing value: the mask is a view of one False, not n x p booleans
    assert d.missing_mask.shape == d.X.shape and d.missing_mask.strides == (0, 0) and not d.missing_mask.any()
    # the design's raw columns do not change with the user's frame, nor the frame with them
    frame.loc[frame.index[:10], "x1"] = -1e6
    assert d.raw["x1"].iloc[0] == reference["x1"].iloc[0]
    assert np.array_equal(d.X[:, 1], (reference["x1"].to_numpy() - d.center[1]) / d.scale[1])
    pd.testing.assert_frame_equal(big, reference)


@needs_copy_on_write
def test_vb_fit_peak_is_at_most_twice_the_frame(big):
    """Design, model and coordinate ascent (the in-memory mean-field fit) together: the design
    (one frame's worth) plus the row vectors of the SQUAREM iterates, at most another frame."""
    def fit():
        d = build_design("y ~ .", big)
        return coordinate_ascent(LinearSVMModel.from_design(d, SETTINGS))

    peak, res = traced_peak(fit)
    assert res.converged
    assert peak <= 2.0 * big.memory_usage(deep=True).sum(), peak / big.memory_usage(deep=True).sum()


@needs_copy_on_write
@pytest.mark.slow
def test_svm_peak_is_at_most_twice_the_frame(big):
    peak, fit = traced_peak(lambda: vbsvm.svm("y ~ .", data=big, method="meanfield", progress=False))
    assert fit.info["converged"]
    assert peak <= 2.0 * big.memory_usage(deep=True).sum(), peak / big.memory_usage(deep=True).sum()
