"""VB for the linear SVM: fixed point of Algorithms 1-2, ELBO, monotonicity, structure."""

import numpy as np
import pytest

import vbsvm
from vbsvm.formula.design import build_design
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.linear import LinearSVMModel

from support.oracle import algorithm1, algorithm2


def make_model(formula, data, penalty="auto", sigma2_beta=1e8, A=0.01, B=0.01):
    d = build_design(formula, data)
    settings = {"penalty": penalty, "sigma2_beta": sigma2_beta, "A_u": A, "B_u": B}
    return d, LinearSVMModel.from_design(d, settings)


def assert_rel(actual, desired, rel=1e-6):
    """Normwise relative agreement ||a - d|| <= rel * ||d|| (entrywise rtol is meaningless for
    the near-zero off-diagonal entries of a covariance)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    err = np.linalg.norm(actual - desired) / np.linalg.norm(desired)
    assert err <= rel, f"relative error {err:.2e} > {rel:g}"


def dense_C(model):
    return model.dense_design()


@pytest.fixture(scope="module")
def sim():
    return vbsvm.datasets.simulate_luts(200, 5, seed=3)


def test_fixed_point_penalty_inference_simulated(sim):
    d, model = make_model("y ~ .", sim)
    res = coordinate_ascent(model, tol=1e-15, max_iter=5000)
    C = dense_C(model)
    mu, Sigma, Bq, trace = algorithm2(C, d.y, 1, groups=[np.arange(1, C.shape[1])])
    post = res.q["theta"]
    assert_rel(post.mean, mu)
    assert_rel(post.cov_dense(), Sigma)
    assert_rel(res.q["variances"].b, Bq)
    # our full ELBO equals the paper's simplified bound at the fixed point
    assert res.elbo[-1] == pytest.approx(trace[-1], rel=1e-8)


def test_fixed_point_random_intercepts_real_data(toenail):
    """Our converged q is a fixed point of a plain transcription of Algorithm 2: one more
    iteration of the oracle, started from our q, returns the same means and covariances."""
    d, model = make_model("y ~ time * terbinafine + (1 | patient_id)", toenail, penalty=None)
    res = coordinate_ascent(model, tol=1e-15, max_iter=5000)
    C = dense_C(model)
    init = (res.q["chi"] ** -0.5, res.q["variances"].mean_inv())
    mu, Sigma, Bq, trace = algorithm2(C, d.y, 4, groups=[np.arange(4, C.shape[1])], init=init, iters=1)
    post = res.q["theta"]
    assert_rel(post.mean, mu)
    var = post.diag_cov()
    assert_rel(var, np.diag(Sigma))
    assert_rel(post.cov_dense(), Sigma[:4, :4])
    assert_rel(post.cov_dense_sparse(), Sigma[:4, 4:])
    assert res.elbo[-1] == pytest.approx(trace[-1], rel=1e-8)


def test_fixed_point_two_grouping_factors():
    df = vbsvm.datasets.simulate_grouped(40, 6, seed=5)
    df["site"] = df["group"] % 7
    d, model = make_model("y ~ time + treatment + (1 | group) + (1 | site)", df)
    res = coordinate_ascent(model, tol=1e-15, max_iter=5000)
    C = dense_C(model)
    groups = [c.index for c in model.variance_components]
    mu, Sigma, Bq, trace = algorithm2(C, d.y, 1, groups=groups)
    assert_rel(res.q["theta"].mean, mu)
    assert_rel(res.q["theta"].diag_cov(), np.diag(Sigma))
    assert res.elbo[-1] == pytest.approx(trace[-1], rel=1e-8)


def test_fixed_point_algorithm1_fixed_penalty(sim):
    d, model = make_model("y ~ . - 1", sim, penalty=0.3)
    res = coordinate_ascent(model, tol=1e-15, max_iter=5000)
    mu, Sigma, trace = algorithm1(d.X, d.y, 0.3)
    assert_rel(res.q["theta"].mean, mu)
    assert_rel(res.q["theta"].cov_dense(), Sigma)
    assert res.elbo[-1] == pytest.approx(trace[-1], rel=1e-8)


@pytest.mark.parametrize("accelerate", [False, True])
@pytest.mark.parametrize("case", ["fixed", "auto", "vague", "one_group", "two_groups"])
def test_elbo_never_decreases(case, accelerate):
    df = vbsvm.datasets.simulate_grouped(30, 5, seed=11)
    df["site"] = df["group"] % 4
    spec = {
        "fixed": ("y ~ time * treatment", 0.5),
        "auto": ("y ~ time * treatment", "auto"),
        "vague": ("y ~ time * treatment", None),
        "one_group": ("y ~ time * treatment + (1 | group)", None),
        "two_groups": ("y ~ time + treatment + (1 | group) + (1 | site)", "auto"),
    }[case]
    _, model = make_model(spec[0], df, penalty=spec[1])
    res = coordinate_ascent(model, tol=1e-12, max_iter=400, accelerate=accelerate)
    diffs = np.diff(res.elbo)
    assert np.all(diffs >= -1e-9 * np.abs(res.elbo[1:])), diffs.min()
    assert res.converged


def test_each_coordinate_step_is_an_ascent(sim):
    """Every single block update of Algorithm 2 (not just whole sweeps) raises the ELBO."""
    d, model = make_model("y ~ .", sim)
    state = model.vb_initial_state()
    _, q, e = model.vb_sweep(state)
    # Perturb q(sigma2) away from its optimum: the ELBO must be lower.
    from vbsvm.distributions import InverseGamma

    worse = dict(q, variances=InverseGamma(q["variances"].a, q["variances"].b * 3))
    assert model.elbo(worse) < e
    # Perturb chi away from its optimum: lower too.
    worse = dict(q, chi=q["chi"] * 1.5)
    assert model.elbo(worse) < e


def test_acceleration_reaches_same_optimum(sim):
    _, model = make_model("y ~ .", sim)
    a = coordinate_ascent(model, tol=1e-14, max_iter=5000, accelerate=True)
    b = coordinate_ascent(model, tol=1e-14, max_iter=5000, accelerate=False)
    assert_rel(a.q["theta"].mean, b.q["theta"].mean)
    assert a.n_sweeps < b.n_sweeps


def test_nonconvergence_warns_not_raises(sim):
    with pytest.warns(vbsvm.exceptions.ConvergenceWarning, match="did not converge"):
        fit = vbsvm.svm("y ~ .", data=sim, method="meanfield", max_iter=3)
    assert np.isfinite(fit.coef["mean"]).all()


def test_toenail_summary_reports_fixed_effects_and_variance(toenail):
    fit = vbsvm.svm("y ~ time * terbinafine + (1 | patient_id)", data=toenail, penalty=None)
    text = fit.summary().as_text()
    for term in ["Intercept", "time", "terbinafine", "time:terbinafine", "sigma2_patient_id"]:
        assert term in text
    assert "Groups (patient_id)" in text and "294" in text
    assert fit.info["converged"]


def test_original_scale_matches_unstandardized_fit(sim):
    """Standardization is internal: with a fixed prior on nothing but the intercept, the
    coefficients on the original scale do not depend on it."""
    df = sim.copy()
    df["x1"] = df["x1"] * 1000 + 50
    a = vbsvm.svm("y ~ .", data=df, penalty=None, tol=1e-13)
    b = vbsvm.svm("y ~ .", data=df, penalty=None, standardize=False, tol=1e-13, max_iter=20000)
    np.testing.assert_allclose(a.coef["mean"], b.coef["mean"], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(a.coef["sd"], b.coef["sd"], rtol=1e-4)
