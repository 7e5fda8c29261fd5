"""Linear-response covariance of the linear VB fit: against its definition (finite differences of
the VB mean under a linear tilt of the log posterior), against Gibbs, and its error handling."""

import warnings

import numpy as np
import pytest

import vbsvm
from vbsvm.exceptions import DiagnosticWarning, InputError
from vbsvm.posterior.linear_response import (LinearResponse, _rebuild_model, _vb_solution, fixed_point_map,
                                             linear_response, lr_covariance, vb_fixed_point)
from vbsvm.models.linear import LinearSVMModel


class TiltedLinearSVMModel(LinearSVMModel):
    """The linear SVM with its log posterior tilted by ``t^T theta`` (standardized coordinates).

    Checks the LR covariance against its definition: a central finite difference of the
    converged VB mean in ``t``. The tilt shifts the linear term of q(theta) by ``t``.
    """

    def __init__(self, base: LinearSVMModel, t):
        self.__dict__.update(base.__dict__)
        self.t = np.asarray(t, dtype=float)

    def coefficient_posterior(self, w, tau, blocks=()):
        post = super().coefficient_posterior(w, tau, blocks)
        td, ts = self.t[: self.qd], self.t[self.qd:]
        h = td - post.GD.T @ ts if self.m_sparse else td
        delta = post.Linv.T @ (post.Linv @ h)
        post.mean_dense = post.mean_dense + delta
        if self.m_sparse:
            post.mean_sparse = post.mean_sparse + ts / post.D - post.GD @ delta
        return post


@pytest.fixture(scope="module")
def sim():
    return vbsvm.datasets.simulate_luts(120, 4, seed=3)


@pytest.fixture(scope="module")
def grouped():
    df = vbsvm.datasets.simulate_grouped(20, 5, seed=1)
    df["site"] = df["group"] % 3
    return df


def finite_difference_check(fit, cols=None, eps=1e-6):
    """Max relative error of each LR column against the central difference of the VB mean."""
    model = _rebuild_model(fit)
    x, post = _vb_solution(fit, model)
    cov, _ = lr_covariance(model, post)
    cols = range(model.q) if cols is None else cols
    errors = []
    for j in cols:
        t = np.zeros(model.q)
        t[j] = eps
        _, plus, ok1 = vb_fixed_point(TiltedLinearSVMModel(model, t), x, tol=1e-15, max_iter=50000)
        _, minus, ok2 = vb_fixed_point(TiltedLinearSVMModel(model, -t), x, tol=1e-15, max_iter=50000)
        assert ok1 and ok2
        fd = (plus.mean - minus.mean) / (2 * eps)
        errors.append(np.max(np.abs(fd - cov[:, j])) / np.max(np.abs(cov[:, j])))
    return max(errors)


@pytest.mark.parametrize("penalty", ["auto", None, 0.5])
def test_lr_equals_finite_difference_of_tilted_vb_mean(sim, penalty):
    fit = vbsvm.svm("y ~ .", data=sim, penalty=penalty, method="meanfield")
    assert finite_difference_check(fit) < 1e-4


def test_lr_finite_difference_with_two_random_intercepts(grouped):
    """Dense (small factor) and Schur-eliminated (large factor) random intercepts, two variances."""
    fit = vbsvm.svm("y ~ time * treatment + (1 | group) + (1 | site)", data=grouped, method="meanfield")
    model = _rebuild_model(fit)
    assert model.m_sparse == 20 and len(model.variance_components) == 3
    assert finite_difference_check(fit, cols=[0, 1, 3, 4, 5, 8, 12, model.q - 1]) < 1e-4


def test_fixed_point_map_is_the_vb_solution(sim):
    fit = vbsvm.svm("y ~ .", data=sim, method="meanfield")
    model = _rebuild_model(fit)
    x, post = _vb_solution(fit, model)
    x_new, _ = fixed_point_map(model, x)
    assert np.max(np.abs(x_new - x)) < 1e-9
    # and it is the fit's own q, up to the fit's convergence tolerance (relative ELBO change
    # 1e-8 leaves ~1e-4 relative error in the moments; the LR solution is polished further)
    score = fit.predict_score(fit.design.raw)
    mf, vf = post.linear_predictor()
    np.testing.assert_allclose(mf, score["mean"], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(np.sqrt(vf), score["sd"], rtol=1e-3)


def test_lr_result_layout_and_symmetry(grouped):
    fit = vbsvm.svm("y ~ time * treatment + (1 | group)", data=grouped, method="meanfield")
    lr = linear_response(fit)
    assert isinstance(lr, LinearResponse)
    q = fit.layout.q
    assert lr.cov.shape == (q, q)
    np.testing.assert_allclose(lr.cov, lr.cov.T, atol=1e-12)
    assert np.all(np.linalg.eigvalsh(lr.cov) > 0)
    assert lr.names[:4] == ["beta[Intercept]", "beta[time]", "beta[treatment]", "beta[time:treatment]"]
    assert lr.names[4].startswith("b_group[")
    # the mean-field part is the fit's own covariance (original scale; up to the fit's tolerance)
    np.testing.assert_allclose(np.diag(lr.cov_vb), fit.posterior["theta_var"], rtol=1e-4)
    np.testing.assert_allclose(lr.sd_vb.to_numpy()[:4], fit.coef["sd"].to_numpy(), rtol=1e-4)
    tab = lr.table()
    assert list(tab.columns) == ["sd_vb", "sd_lr", "ratio"]
    assert (tab["ratio"] > 1).all()  # here LR widens every marginal


def test_linear_response_is_explicit_and_leaves_the_fit_unchanged(sim, tmp_path):
    """Results never run inference: coef has no LR column, and the explicit call does not write
    into the fit (so save() writes the same file before and after)."""
    fit = vbsvm.svm("y ~ x1 + x2 + x3 + x4", data=sim, seed=2, method="meanfield")
    assert "sd_lr" not in fit.coef.columns
    before = {k: np.array(v, copy=True) for k, v in fit.posterior.items()}
    sd = linear_response(fit).sd.to_numpy()
    assert sd.shape == (fit.layout.q,)
    assert fit.posterior.keys() == before.keys()
    fit.save(tmp_path / "vb.nc")
    back = vbsvm.load(tmp_path / "vb.nc")
    np.testing.assert_allclose(linear_response(back).sd.to_numpy(), sd, rtol=1e-8)


def test_not_applicable_fits(sim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        gibbs = vbsvm.svm("y ~ x1", data=sim, method="gibbs", draws=50, tune=20, chains=1, progress=False)
    with pytest.raises(InputError, match="method='vb'"):
        linear_response(gibbs)
    vb = vbsvm.svm("y ~ x1", data=sim, method="meanfield")
    with pytest.raises(InputError, match="max_n"):
        linear_response(vb, max_n=50)


@pytest.mark.slow
def test_lr_sd_close_to_gibbs_sd_on_luts_simulation():
    """Section 4.2 design: plain VB sds are about half of Gibbs'; LR brings them within 20%."""
    df = vbsvm.datasets.simulate_luts(200, 5, seed=4)
    vb = vbsvm.svm("y ~ .", data=df, method="meanfield")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosticWarning)
        gibbs = vbsvm.svm("y ~ .", data=df, method="gibbs", draws=2000, tune=500, chains=2, seed=1,
                          progress=False)
    ref = gibbs.coef["sd"].to_numpy()
    plain = vb.coef["sd"].to_numpy() / ref
    corrected = linear_response(vb).sd.to_numpy()[: len(ref)] / ref
    assert np.all(plain < 0.7)                               # the known mean-field shrinkage
    assert np.all((corrected > 0.8) & (corrected < 1.2)), corrected
