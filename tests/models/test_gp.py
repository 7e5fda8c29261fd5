"""Tests of the sparse-GP Bayesian SVM (vbsvm.models.gp, vbsvm.inference.svi, vbsvm.fitting.gp)."""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats

from vbsvm.results.gp import GPFit
from vbsvm.fitting.gp import fit_batch, fit_gp, gibbs_sparse, gpsvm
from vbsvm.inference.svi import ArrayBatches, fit_svi
from vbsvm.models.gp import (RBF, Constant, InducingGP, Linear, Matern32, Matern52, Sum, WhitenedGaussian,
                             make_kernel, predictive_prob, select_inducing)

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    from contextlib import nullcontext as threadpool_limits


@pytest.fixture(autouse=True)
def _one_thread():
    with threadpool_limits(1):
        yield


def _toy(n=300, seed=0, noise=0.3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1 + noise * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


KERNELS = ["rbf", "ard", "matern32", "matern52-ard", "rbf+linear", "linear"]


@pytest.mark.parametrize("name", KERNELS)
def test_hyper_gradient_matches_finite_differences(name):
    rng = np.random.default_rng(3)
    n, d, m = 50, 3, 8
    if name == "linear":  # rank(K_mm) <= d + 1: more inducing points would be degenerate
        m = 4
    X = rng.normal(size=(n, d))
    y = np.sign(X[:, 0] + 0.5 * rng.normal(size=n))
    k = make_kernel(name, d)
    b = InducingGP(k, select_inducing(X, m, rng=1), jitter=1e-8)
    q = WhitenedGaussian.prior(m)
    for _ in range(3):  # a non-trivial q
        A, kt = b.project(X)
        a, _ = b.local(A, kt, y, q)
        q = WhitenedGaussian(*b.target(A, y, a))
    mu, zeta = b.u_moments(q)
    g, gZ = b.hyper_grad(X, y, q, scale=1.7, inducing=True)
    th, Z = k.theta, b.Z.copy()
    eps = 1e-5
    fd = np.empty_like(th)
    for j in range(th.size):
        e = np.zeros_like(th)
        e[j] = eps
        k.theta = th + e
        b.refresh()
        up = b.elbo_u(X, y, mu, zeta, 1.7)
        k.theta = th - e
        b.refresh()
        fd[j] = (up - b.elbo_u(X, y, mu, zeta, 1.7)) / (2 * eps)
    k.theta = th
    fdZ = np.empty_like(Z)
    for i in range(m):
        for j in range(d):
            Zp = Z.copy()
            Zp[i, j] += eps
            b.Z = Zp
            b.refresh()
            up = b.elbo_u(X, y, mu, zeta, 1.7)
            Zp[i, j] -= 2 * eps
            b.Z = Zp
            b.refresh()
            fdZ[i, j] = (up - b.elbo_u(X, y, mu, zeta, 1.7)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-5 * (1 + np.abs(fd).max()))
    np.testing.assert_allclose(gZ, fdZ, rtol=1e-4, atol=1e-5 * (1 + np.abs(fdZ).max()))


def test_kernels_are_psd_and_sum_adds():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    for k in [RBF(1.3, 2.0), RBF([1, 2, 3.0]), Matern32(0.7), Matern52(2.0), Linear(0.5), Constant(2.0)]:
        K = k(X)
        assert np.allclose(K, K.T)
        assert np.linalg.eigvalsh(K).min() > -1e-8 * np.abs(K).max()
        np.testing.assert_allclose(np.diag(K), k.diag(X), rtol=1e-12)
    s = RBF(1.0) + Linear(0.3) + Constant(0.5)
    assert isinstance(s, Sum) and len(s.parts) == 3
    np.testing.assert_allclose(s(X), RBF(1.0)(X) + Linear(0.3)(X) + 0.5)


def test_elbo_constants_single_point_quadrature():
    """n = 1 full GP: ELBO <= log of the exact (pseudo-)evidence, computed by quadrature."""
    for var, yv, x in [(1.0, 1.0, 0.0), (4.0, -1.0, 0.3), (0.2, 1.0, 0.0)]:
        k = RBF(1.0, var)
        X = np.array([[x]])
        y = np.array([yv])
        b = InducingGP(k, X, jitter=1e-10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st = fit_batch(b, X, y, max_iter=2000, tol=1e-14)
        sd = np.sqrt(var)
        Z, _ = integrate.quad(lambda f: np.exp(-2 * max(0.0, 1 - yv * f)) * stats.norm.pdf(f, 0, sd),
                              -12 * sd, 12 * sd, points=[yv], limit=200)
        assert st.elbo[-1] <= np.log(Z) + 1e-8
        assert st.elbo[-1] >= np.log(Z) - 0.5  # a tight-ish bound, so the constants are right


@pytest.mark.parametrize("optimize", [False, True])
def test_batch_vb_elbo_non_decreasing(optimize):
    X, y = _toy(120, seed=1)
    b = InducingGP(make_kernel("rbf", 2, lengthscale=0.5, variance=0.5), X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = fit_batch(b, X, y, max_iter=30, tol=1e-12, optimize=optimize)
    d = np.diff(st.elbo)
    assert np.all(d >= -1e-8 * np.abs(st.elbo[1:])), d.min()
    if optimize:  # the hyperparameters moved and the ELBO gained from it
        assert not np.allclose(st.theta_trace[0], st.theta_trace[-1])


@pytest.mark.slow
def test_svi_with_inducing_at_data_converges_to_batch_vb():
    X, y = _toy(300, seed=0)
    Xt = np.random.default_rng(5).normal(size=(400, 2))
    b = InducingGP(make_kernel("rbf", 2, lengthscale=1.0), X)
    st = fit_batch(b, X, y, tol=1e-10, max_iter=2000)
    mv, vv = b.predict_f(Xt, st.q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s2 = fit_svi(b, ArrayBatches(X, y, 100, np.random.default_rng(1)), 300, max_iter=3000,
                     tol=1e-9, monitor=(X, y))
    ms, vs = b.predict_f(Xt, s2.q)
    diff = np.abs(predictive_prob(ms, vs) - predictive_prob(mv, vv))
    assert diff.max() < 0.02, diff.max()
    assert abs(s2.elbo[-1] - st.elbo[-1]) < 1e-3 * abs(st.elbo[-1])


def test_gibbs_and_vb_predictive_means_agree():
    X, y = _toy(150, seed=2)
    Xt = np.random.default_rng(6).normal(size=(300, 2))
    b = InducingGP(make_kernel("rbf", 2, lengthscale=1.0), X)
    st = fit_batch(b, X, y, tol=1e-10, max_iter=2000)
    mv, vv = b.predict_f(Xt, st.q)
    v, _ = gibbs_sparse(b, X, y, draws=1500, tune=300, chains=2, seed=11)
    A, kt = b.project(Xt)
    F = v.reshape(-1, b.m) @ A.T
    dist = np.abs(F.mean(0) - mv) / np.sqrt(F.var(0) + kt)
    assert np.quantile(dist, 0.9) < 0.25, np.quantile(dist, [0.5, 0.9, 1])
    assert dist.max() < 0.35


def test_natural_gradient_step_stays_pd_on_hard_data():
    """Separable data with duplicated rows (margin points get alpha -> 0) and a huge kernel
    variance: every step keeps a PD precision and finite moments."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 2))
    X = np.vstack([X, X, X[:10]])  # exact duplicates
    y = np.where(X[:, 0] > 0, 1.0, -1.0)  # separable
    X[:, 0] += 3 * y  # wide margin
    k = make_kernel("linear+rbf", 2, variance=1e4, lengthscale=0.1)
    Z = np.vstack([X[:30], X[:5]])  # duplicated inducing locations: jitter must handle them
    b = InducingGP(k, Z, jitter=1e-10)
    seen = []

    def check(t, q, blocks):
        np.linalg.cholesky(q.prec)
        seen.append(np.all(np.isfinite(q.mean)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = fit_svi(b, ArrayBatches(X, y, 7, np.random.default_rng(2)), X.shape[0],
                     max_iter=600, step=1.0, check_every=20, callback=check, optimize=True,
                     hyper_every=5, hyper_lr=0.3)
    assert all(seen) and len(seen) > 0
    assert st.skipped < 60
    mean, var = b.predict_f(X, st.q)
    assert np.all(np.isfinite(mean)) and np.all(var >= 0)
    assert np.mean(np.sign(mean) == y) > 0.95


def _frame(n=200, seed=0):
    X, y = _toy(n, seed)
    return pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "cls": np.where(y > 0, "yes", "no")})


def test_gpsvm_reproducible_and_predict_kinds(tmp_path):
    df = _frame()
    f1 = gpsvm("cls ~ a + b", df, n_inducing=20, seed=3, max_iter=400)
    f2 = gpsvm("cls ~ a + b", df, n_inducing=20, seed=3, max_iter=400)
    np.testing.assert_array_equal(f1.predict(df, kind="prob"), f2.predict(df, kind="prob"))
    assert set(f1.predict(df)) <= {"yes", "no"}
    sc = f1.predict(df.iloc[:5], kind="score")
    assert list(sc.columns) == ["mean", "sd"] and (sc["sd"] > 0).all()
    p = f1.predict(df, kind="prob")
    assert ((p > 0) & (p < 1)).all()
    assert np.mean(f1.predict(df) == df["cls"]) > 0.8
    assert "bias.variance" in f1.hyperparameters.index
    text = f1.summary().as_text()
    assert "rbf.lengthscale" in text and "inducing" in text
    tree = f1.with_draw_shape(2, 50).to_arviz()
    assert tree["posterior"]["u"].shape == (2, 50, 20)
    assert tree.attrs["vbsvm_fit_type"] == "gpsvm"
    path = tmp_path / "gp.nc"
    f1.save(path)
    import xarray as xr

    t = xr.open_datatree(path, engine="h5netcdf")
    t.load()
    g = GPFit.from_datatree(t)
    np.testing.assert_allclose(g.predict(df, kind="prob"), p, rtol=1e-10)
    np.testing.assert_allclose(g.elbo, f1.elbo)


def test_no_intercept_removes_bias_term_and_methods_run():
    df = _frame(80, seed=4)
    f = gpsvm("cls ~ a + b - 1", df, method="vb", optimize=False)
    assert not any("bias" in s for s in f.hyperparameters.index)
    g = gpsvm("cls ~ a + b", df, method="gibbs", n_inducing=15, draws=100, tune=50, chains=2,
              optimize=False, seed=1)
    assert g.to_arviz()["posterior"]["u"].shape == (2, 100, 15)
    assert np.mean(g.predict(df) == df["cls"]) > 0.75


def test_streaming_matches_in_memory_scale():
    X, y = _toy(2000, seed=7)

    def chunks():
        for s in range(0, 2000, 500):
            yield X[s:s + 500], y[s:s + 500]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fs = fit_gp(chunks, None, n_inducing=20, seed=0, max_iter=1500, optimize=False,
                    lengthscale=1.0)
        fa = fit_gp(X, y, n_inducing=20, seed=0, max_iter=1500, optimize=False, lengthscale=1.0)
    assert fs.n_obs == 2000
    acc_s = np.mean(fs.predict(X) == y)
    acc_a = np.mean(fa.predict(X) == y)
    assert acc_s > 0.85 and abs(acc_s - acc_a) < 0.03


def test_bad_arguments_raise_clear_errors():
    from vbsvm.exceptions import InputError

    df = _frame(30)
    with pytest.raises(InputError, match="method"):
        gpsvm("cls ~ a", df, method="ep")
    with pytest.raises(InputError, match="kernel"):
        gpsvm("cls ~ a", df, kernel="cosine")
    with pytest.raises(InputError, match="n_inducing"):
        gpsvm("cls ~ a", df, n_inducing=0)


def test_predictive_probability_is_the_gaussian_integral_of_the_probit():
    rng = np.random.default_rng(0)
    for m, v in [(0.7, 0.5), (-1.5, 3.0), (2.0, 0.01)]:
        f = rng.normal(m, np.sqrt(v), 400_000)
        mc = stats.norm.cdf(f).mean()
        assert abs(predictive_prob(np.array([m]), np.array([v]))[0] - mc) < 3e-3
    # the paper's eq. (13) as printed is a different (not scale-consistent) number
    assert abs(predictive_prob(np.array([2.0]), np.array([3.0]), "paper")[0] - stats.norm.cdf(0.5)) < 1e-12


def test_learn_mask_fixes_other_hyperparameters_and_kernels_via_formula():
    df = _frame(150, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = gpsvm("cls ~ a + b", df, n_inducing=15, seed=0, max_iter=600, lengthscale=0.7,
                  learn=["rbf.lengthscale"])
    h = f.hyperparameters
    assert h.loc["rbf.variance", "value"] == pytest.approx(1.0)
    assert h.loc["bias.variance", "value"] == pytest.approx(1.0)
    assert h.loc["rbf.lengthscale", "value"] != pytest.approx(0.7)
    for kern in ["matern32", "matern52", "ard", "rbf+linear"]:
        g = gpsvm("cls ~ a + b", df, kernel=kern, method="vb", optimize=False)
        assert np.mean(g.predict(df) == df["cls"]) > 0.8, kern
    names = gpsvm("cls ~ a + b", df, kernel="ard", method="vb", optimize=False).hyperparameters.index
    assert "rbf.lengthscale[a]" in names and "rbf.lengthscale[b]" in names


def test_formula_streaming_of_dataframe_chunks():
    df = _frame(1200, seed=9)

    def chunks():
        for s in range(0, 1200, 400):
            yield df.iloc[s:s + 400]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = gpsvm("cls ~ a + b", chunks, n_inducing=20, seed=0, max_iter=800, optimize=False,
                  lengthscale=1.0)
    assert f.n_obs == 1200
    assert np.mean(f.predict(df) == df["cls"]) > 0.85


def test_gibbs_runs_through_run_chains_with_n_jobs_and_diagnostics():
    df = _frame(60, seed=5)
    kw = dict(method="gibbs", n_inducing=8, draws=60, tune=20, chains=2, thin=2, optimize=False,
              seed=4)
    one = gpsvm("cls ~ a + b", df, **kw)
    two = gpsvm("cls ~ a + b", df, n_jobs=2, **kw)
    np.testing.assert_array_equal(one.gibbs_draws, two.gibbs_draws)  # seeds per chain, not per job
    assert one.gibbs_draws.shape == (2, 60, 8)
    assert not np.allclose(one.gibbs_draws[0], one.gibbs_draws[1])  # independent chains
    diag = one.diagnostics()
    assert list(diag.index[:2]) == ["u[0]", "u[1]"] and len(diag) == 8
    assert {"r_hat", "ess_bulk", "ess_tail"} <= set(diag.columns) and diag["r_hat"].notna().all()
    text = one.summary().as_text()
    assert "max R-hat" in text and "min bulk ESS" in text and "tune 20, thin 2" in text
    assert gpsvm("cls ~ a + b", df, n_inducing=8, optimize=False).diagnostics() is None
    from vbsvm.exceptions import InputError

    with pytest.raises(InputError, match="n_jobs"):
        gpsvm("cls ~ a + b", df, n_jobs=0, **kw)


def test_batch_vb_refuses_sizes_it_cannot_fit_and_points_to_svi():
    from vbsvm.exceptions import InputError
    from vbsvm.fitting.gp import VB_MAX_INDUCING, VB_MAX_INDUCING_LEARN

    def data(n):
        X = np.linspace(-1, 1, n)[:, None]
        return X, np.where(X[:, 0] > 0, 1.0, -1.0)

    X, y = data(VB_MAX_INDUCING + 1)
    with pytest.raises(InputError, match="method='svi'.*optimize=False"):
        fit_gp(X, y, method="vb")  # the full GP, learning hyperparameters
    with pytest.raises(InputError, match="limited to 2000: .*method='svi'"):
        fit_gp(X, y, method="vb", optimize=False)
    with pytest.raises(InputError, match="runs batch VB with 600 inducing points"):
        fit_gp(X, y, method="gibbs", n_inducing=600)  # its hyperparameters come from batch VB
    fit = fit_gp(X, y, method="vb", n_inducing=10, optimize=False)  # sparse batch VB is fine
    assert fit.n_inducing == 10 and fit.converged
    X, y = data(VB_MAX_INDUCING_LEARN + 1)
    with pytest.raises(InputError, match="n_inducing <= 500"):
        fit_gp(X, y, method="vb")
    assert fit_gp(X, y, method="vb", optimize=False).n_inducing == X.shape[0]


def test_batch_vb_learning_hyperparameters_converges_in_tens_of_sweeps():
    X, y = _toy(150, seed=3)
    b = InducingGP(make_kernel("rbf", 2), X)
    st = fit_batch(b, X, y, optimize=True, tol=1e-5, max_iter=200)
    assert st.converged and st.n_iter < 120, st.n_iter
    assert np.all(np.diff(st.elbo) >= -1e-8 * np.abs(st.elbo[1:]))
    fixed = fit_batch(InducingGP(make_kernel("rbf", 2), X), X, y, tol=1e-8)
    assert fixed.converged and fixed.n_iter < 60, fixed.n_iter
    assert st.elbo[-1] > fixed.elbo[-1]  # learning the hyperparameters paid


def test_engines_import_no_model_and_the_gp_model_no_engine():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "vbsvm"

    def imports(path):
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                out.add(("." * node.level) + (node.module or ""))
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        return out

    for path in (root / "inference").glob("*.py"):
        bad = [m for m in imports(path) if "models" in m or m.startswith(("vbsvm.results", "vbsvm.fitting"))]
        assert not bad, (path.name, bad)
    bad = [m for m in imports(root / "models" / "gp.py")
           if "inference" in m or m.startswith(("vbsvm.results", "vbsvm.fitting"))]
    assert not bad, bad
