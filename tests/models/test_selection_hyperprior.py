"""The Beta hyperprior of the Laplace-zero inclusion probability (``LaplaceZero(rho=vbsvm.Beta(a, b))``).

Gibbs: the conjugate step ``rho | gamma ~ Beta(a + |gamma|, b + m - |gamma|)`` (the recorded draws
against that conditional given the recorded indicators, and a variant with rho held at its prior
mean failing the same check), every move of the indicators reading the current draw, and (slow) the
whole sampler against the exact posterior of a two-term model (the 4 models enumerated, the
coefficients and sigma_u by quadrature). Mean field: the factor q(rho) keeps the ELBO monotone and
is a stationary point of it. The API: validation, defaults, summary, ArviZ, save/load.
"""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.special import betaln, expit, gammaln, logit

import vbsvm
from support.exact import laplace_zero_marginal_prior
from support.statistics import mcse_mean
from vbsvm.exceptions import InputError, InputTypeError
from vbsvm.formula.design import build_design
from vbsvm.inference.vb import coordinate_ascent
from vbsvm.models.priors import Beta, LaplaceZero
from vbsvm.models.selection import LaplaceZeroModel, selectable_columns
from vbsvm.models.selection_algebra import PriorOdds


def make_model(df, rho, formula="y ~ .", **kw):
    d = build_design(formula, df)
    return d, LaplaceZeroModel(d.X, d.y, [], selectable_columns(d, ()), rho, **kw)


@pytest.fixture(scope="module")
def small():
    return vbsvm.datasets.simulate_sparse(60, 6, 2, seed=0, effect=0.6)


# ----------------------------------------------------------------------------- the API
@pytest.mark.parametrize("a, b, name, error", [(0, 1, "a", InputError), (1, -2, "b", InputError),
                                               (np.inf, 1, "a", InputError), (1, np.nan, "b", InputError),
                                               ("1", 1, "a", InputTypeError), (1, True, "b", InputTypeError)])
def test_beta_arguments_are_validated(a, b, name, error):
    with pytest.raises(error, match=f"{name} must be a positive"):
        Beta(a, b)


def test_laplace_zero_rho_arguments_name_the_fix():
    with pytest.raises(InputError, match=r"rho=vbsvm\.Beta\(a, b\)"):
        LaplaceZero(rho="beta")
    with pytest.raises(InputTypeError, match=r"vbsvm\.Beta\(a, b\)"):
        LaplaceZero(rho=(1, 1))
    with pytest.raises(InputError, match="expected_size"):
        LaplaceZero(rho=Beta(1, 1), expected_size=3)
    with pytest.raises(InputError, match="rho_grid"):
        LaplaceZero(rho=Beta(1, 1), rho_grid=[0.1, 0.2])


def test_beta_is_immutable_and_described():
    prior = Beta(2, 18)
    with pytest.raises(AttributeError):
        prior.a = 3
    assert prior.mean(7) == pytest.approx(0.1) and Beta().shapes(9) == (1.0, 81.0)
    assert repr(Beta()) == "Beta(1, m^2)" and Beta().to_dict() == {"type": "Beta", "a": 1.0, "b": None}
    assert repr(LaplaceZero(rho=prior)) == "LaplaceZero(rho=Beta(2, 18))"
    assert LaplaceZero(rho=prior).to_dict()["rho"] == {"type": "Beta", "a": 2.0, "b": 18.0}
    assert Beta(1, 1) == Beta(1.0, 1.0) and hash(Beta(1, 1)) == hash(Beta(1.0, 1.0)) and Beta(1, 2) != Beta(2, 1)
    assert vbsvm.Beta is Beta


def test_default_is_documented():
    """The default of ``rho`` is the one the docstring and the signature name."""
    default = LaplaceZero().rho
    assert f"default {default!r}" in LaplaceZero.__doc__  # "rho : Beta, float or "auto", default Beta(1, m^2)"
    assert default == Beta() and LaplaceZero().hyperprior


def test_fixed_rho_fits_carry_no_hyperprior(small):
    fit = vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho=0.2), method="meanfield")
    assert fit.rho_prior is None and fit.rho_posterior() is None and fit.rho_draws() is None
    assert "rho" not in fit.to_arviz()["posterior"]


# ----------------------------------------------------------------------------- Gibbs
def test_rho_conditional_is_the_beta_binomial_conjugate_step(small):
    _, model = make_model(small, Beta(2.0, 5.0))
    gamma = np.array([1, 0, 1, 1, 0, 0], dtype=float)
    assert model.rho_conditional(gamma) == (5.0, 8.0)
    rng = np.random.default_rng(0)
    draws = np.array([model.draw_rho(gamma, rng) for _ in range(4000)])
    assert stats.kstest(draws, stats.beta(5.0, 8.0).cdf).pvalue > 1e-3


def test_collapsed_indicator_logits_read_the_current_rho(small):
    """The collapsed conditional logits shift by exactly the change of logit(rho)."""
    _, model = make_model(small, Beta(1.0, 1.0))
    gram = model.gram(np.full(model.n, 1.3))
    tau = model.prior_precision(np.ones(len(model.vcomps)), np.full(model.m, 0.7))
    gamma = np.array([1, 0, 1, 0, 0, 1], dtype=float)
    low = model.collapsed_indicators(gram, gamma, tau, odds=model.prior_odds(0.1)).logits
    high = model.collapsed_indicators(gram, gamma, tau, odds=model.prior_odds(0.7)).logits
    np.testing.assert_allclose(high - low, logit(0.7) - logit(0.1), rtol=1e-12)
    with pytest.raises(ValueError, match="hyperprior"):
        model.prior_odds()


def test_model_jump_target_reads_the_current_rho(small):
    _, model = make_model(small, Beta(1.0, 1.0))
    nf = model.fixed_index.size
    x = np.concatenate([np.zeros(nf), [0.4, -0.2], [np.log(0.5)]])  # two terms in the model
    f = np.zeros(model.n)
    diff = model._jump_log_target(x, f, model.prior_odds(0.3)) - model._jump_log_target(x, f, model.prior_odds(0.6))
    assert diff == pytest.approx(2 * (math.log(0.3) - math.log(0.6)) + 4 * (math.log(0.7) - math.log(0.4)))


def test_sweep_passes_the_state_rho_to_every_indicator_move(small, monkeypatch):
    """After tuning (flips and jumps on), each move that uses rho gets the state's value."""
    fit_kw = dict(method="gibbs", draws=5, tune=60, chains=1, seed=3, progress=False, n_jobs=1)
    seen = {"collapsed": [], "flip": [], "jump": []}
    for name, key in (("collapsed_indicators", "collapsed"), ("flip_moves", "flip"), ("model_jumps", "jump")):
        original = getattr(LaplaceZeroModel, name)

        def spy(self, *args, _original=original, _key=key, odds=None, **kw):
            seen[_key].append(odds)
            return _original(self, *args, odds=odds, **kw)

        monkeypatch.setattr(LaplaceZeroModel, name, spy)
    states = []
    sweep = LaplaceZeroModel.gibbs_sweep
    monkeypatch.setattr(LaplaceZeroModel, "gibbs_sweep",
                        lambda self, state, rng: states.append(float(state["rho"])) or sweep(self, state, rng))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho=Beta(1, 1)), **fit_kw)
    assert len(seen["collapsed"]) == len(states) and seen["flip"] and seen["jump"]
    for key in seen:
        for odds in seen[key]:
            assert isinstance(odds, PriorOdds)
    got = [o.logit_rho for o in seen["collapsed"]]
    np.testing.assert_allclose(got, logit(states), rtol=1e-12)
    assert len(set(np.round(states, 12))) > 10  # rho moves


def _rho_given_indicators_pvalue(fit, a, b):
    """KS p-value of the probability integral transforms of the rho draws under Beta(a + |gamma|,
    b + m - |gamma|) of the indicators recorded with them (iid uniform if the step is exact)."""
    g = fit.posterior["gamma_draws"].reshape(-1, fit.posterior["gamma_draws"].shape[-1]).astype(float)
    rho = fit.posterior["rho_draws"].ravel()
    k = g.sum(1)
    u = stats.beta.cdf(rho, a + k, b + g.shape[1] - k)
    return stats.kstest(u, "uniform").pvalue


def test_recorded_rho_is_drawn_given_the_recorded_indicators(small, monkeypatch):
    """rho | gamma of every kept sweep; the variant with rho held at its prior mean fails."""
    kw = dict(prior=LaplaceZero(rho=Beta(2, 3)), method="gibbs", draws=100, tune=30, chains=2, seed=5,
              progress=False, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ .", small, **kw)
        assert _rho_given_indicators_pvalue(fit, 2.0, 3.0) > 1e-3
        monkeypatch.setattr(LaplaceZeroModel, "draw_rho", lambda self, gamma, rng: np.array(0.4))
        broken = vbsvm.svm("y ~ .", small, **kw)
    assert _rho_given_indicators_pvalue(broken, 2.0, 3.0) < 1e-6


def _two_term_exact(df, a, b, A, B, fixed_rho=None):
    """Exact posterior of ``y ~ 0 + x1 + x2`` with both terms selectable: the 4 models' marginal
    pseudo-likelihoods by quadrature over the coefficients with sigma_u integrated out of the
    Laplace slab (the pair's prior depends on |u1| + |u2| only), times the beta-binomial prior
    of the model (or rho^k (1 - rho)^(m - k) with ``fixed_rho``). Returns P(gamma_1), P(gamma_2),
    E[rho | y] (with ``fixed_rho``: NaN)."""
    y = df["y"].to_numpy(float)
    X = df[["x1", "x2"]].to_numpy()
    u = np.linspace(-5.0, 5.0, 801)  # contains 0
    i0 = int(np.argmin(np.abs(u)))
    ls = np.linspace(-12, 12, 4001)
    s2 = np.exp(ls)
    ig = np.exp(A * np.log(B) - gammaln(A) - (A + 1) * ls - B / s2) * s2  # IG(A, B) density in log s2
    S = np.linspace(0.0, 12.0, 4801)
    pair = np.trapezoid(np.exp(-S[:, None] / np.sqrt(s2)) / (4 * s2) * ig, ls, axis=1)
    U1, U2 = np.meshgrid(u, u, indexing="ij")
    F = U1[..., None] * X[:, 0] + U2[..., None] * X[:, 1]
    ll = -2.0 * np.maximum(0.0, 1.0 - y * F).sum(-1)
    L = np.exp(ll - ll.max())
    p1 = laplace_zero_marginal_prior(u, A, B)
    Z = {(0, 0): L[i0, i0], (1, 0): np.trapezoid(L[:, i0] * p1, u), (0, 1): np.trapezoid(L[i0, :] * p1, u),
         (1, 1): np.trapezoid(np.trapezoid(L * np.interp(np.abs(U1) + np.abs(U2), S, pair), u, axis=1), u)}
    m = 2
    if fixed_rho is None:
        prior = {g: math.exp(betaln(a + sum(g), b + m - sum(g)) - betaln(a, b)) for g in Z}
    else:
        prior = {g: fixed_rho ** sum(g) * (1 - fixed_rho) ** (m - sum(g)) for g in Z}
    w = {g: prior[g] * Z[g] for g in Z}
    total = sum(w.values())
    post = {g: v / total for g, v in w.items()}
    rho = sum(v * (a + sum(g)) / (a + b + m) for g, v in post.items()) if fixed_rho is None else math.nan
    return post[(1, 0)] + post[(1, 1)], post[(0, 1)] + post[(1, 1)], rho


@pytest.fixture(scope="module")
def two_terms():
    rng = np.random.default_rng(4)
    n = 30
    x = rng.normal(size=(n, 2))
    y = np.where(rng.random(n) < expit(0.8 * x[:, 0]), 1, -1)
    return pd.DataFrame({"y": y, "x1": x[:, 0], "x2": x[:, 1]})


@pytest.mark.slow
def test_two_term_quadrature_tells_the_variants_apart(two_terms):
    """The quadrature of the slow test below: the beta-binomial answer differs from the answer with
    rho fixed at its prior mean by far more than that test's tolerance."""
    a, b, A, B = 1.0, 1.0, 1.0, 1.0
    exact = np.array(_two_term_exact(two_terms, a, b, A, B)[:2])
    fixed = np.array(_two_term_exact(two_terms, a, b, A, B, fixed_rho=a / (a + b))[:2])
    assert np.max(np.abs(exact - fixed)) > 0.05, (exact, fixed)


@pytest.mark.slow
def test_gibbs_matches_the_exact_posterior_of_two_terms(two_terms, monkeypatch):
    """P(gamma_k = 1 | y) and E[rho | y] of the sampler against quadrature over the enumerated
    models (within 4 MCSE + 0.005); the variant with rho held at its prior mean misses them."""
    a, b, A, B = 1.0, 1.0, 1.0, 1.0
    exact = _two_term_exact(two_terms, a, b, A, B)
    kw = dict(prior=LaplaceZero(rho=Beta(a, b)), method="gibbs", standardize=False, A_u=A, B_u=B, draws=2500,
              tune=500, chains=2, seed=3, progress=False)

    def misses(fit):
        g = fit.posterior["gamma_draws"].astype(float)
        draws = [g[..., 0], g[..., 1]] + ([fit.posterior["rho_draws"]] if "rho_draws" in fit.posterior else [])
        out = []
        for d, want in zip(draws, exact):
            err = abs(float(np.mean(d)) - want)
            print(f"sampled {np.mean(d):.4f} exact {want:.4f} mcse {mcse_mean(d):.4f}")
            out.append(err > 4 * mcse_mean(d) + 0.005)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ 0 + x1 + x2", two_terms, **kw)
        assert not any(misses(fit))
        monkeypatch.setattr(LaplaceZeroModel, "draw_rho", lambda self, gamma, rng: np.array(a / (a + b)))
        broken = vbsvm.svm("y ~ 0 + x1 + x2", two_terms, **kw)
    assert any(misses(broken))


# ----------------------------------------------------------------------------- mean field
def test_meanfield_elbo_never_decreases_with_q_rho():
    df = vbsvm.datasets.simulate_sparse(200, 20, 4, seed=5, rho=0.5)
    _, model = make_model(df, Beta(1.0, 20.0))
    x = model.vb_initial_state()
    values = []
    for _ in range(120):
        x, q, e = model.vb_sweep(x)
        values.append(e)
    steps = np.diff(values)
    assert steps.min() >= -1e-10 * abs(values[-1]), steps.min()
    res = coordinate_ascent(model, tol=1e-12, max_iter=5000)
    assert res.converged and np.diff(res.elbo).min() >= -1e-10 * abs(res.elbo[-1])


def test_q_rho_is_the_optimal_factor_at_the_fixed_point(small):
    """At convergence q(rho) = Beta(a + sum E gamma, b + m - sum E gamma), and moving its shapes
    lowers the ELBO (a maximum in that factor)."""
    a, b = 2.0, 7.0
    _, model = make_model(small, Beta(a, b))
    res = coordinate_ascent(model, tol=1e-14, max_iter=20000)
    q = res.q
    k = float(np.sum(q["gamma"]))
    np.testing.assert_allclose(q["rho_shape"], (a + k, b + model.m - k), rtol=1e-8)
    base = model.elbo(q)
    assert base == pytest.approx(res.elbo[-1], rel=1e-12)
    h = 1e-4
    for i in (0, 1):
        vals = []
        for sgn in (1, -1):
            shape = list(q["rho_shape"])
            shape[i] *= math.exp(sgn * h)
            vals.append(model.elbo(dict(q, rho_shape=tuple(shape))))
        assert abs(vals[0] - vals[1]) / (2 * h) < 1e-6
        assert max(vals) < base


def test_meanfield_logit_is_the_expected_log_odds(small):
    """With q(rho) a point mass in the limit (a, b large, mean r) the update is the fixed-rho one."""
    r = 0.3
    _, fixed = make_model(small, r)
    _, hyper = make_model(small, Beta(r * 1e9, (1 - r) * 1e9))
    res_f = coordinate_ascent(fixed, tol=1e-13, max_iter=20000)
    res_h = coordinate_ascent(hyper, tol=1e-13, max_iter=20000)
    np.testing.assert_allclose(res_h.q["gamma"], res_f.q["gamma"], atol=1e-6)


# ----------------------------------------------------------------------------- fits
@pytest.mark.parametrize("method", ["vb", "meanfield", "gibbs"])
def test_fits_report_rho_in_summary_arviz_and_files(small, method, tmp_path):
    kw = dict(draws=60, tune=40, chains=2, progress=False) if method == "gibbs" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = vbsvm.svm("y ~ .", small, prior=LaplaceZero(rho=Beta(1, 4)), method=method, seed=2, **kw)
    assert fit.rho_prior == (1.0, 4.0)
    table = fit.rho_posterior()
    assert 0 < table.loc["rho", "mean"] < 1 and table.loc["rho", "mean"] == pytest.approx(fit.rho)
    draws = fit.to_arviz()["posterior"]["rho"]
    assert draws.dims == ("chain", "draw")
    assert float(draws.mean()) == pytest.approx(fit.rho, abs=4 * float(draws.std()) / math.sqrt(draws.size) + 0.01)
    text = fit.summary().as_text()
    assert "rho ~ Beta(1, 4)" in text and "posterior mean" in text
    fit.save(tmp_path / "fit.nc")
    back = vbsvm.load(tmp_path / "fit.nc")
    assert back.rho == fit.rho and back.rho_prior == fit.rho_prior
    pd.testing.assert_frame_equal(back.rho_posterior(), table)
    pd.testing.assert_frame_equal(back.inclusion(), fit.inclusion())
    assert back.settings["prior"]["rho"] == {"type": "Beta", "a": 1.0, "b": 4.0}


def test_same_seed_same_result_with_the_hyperprior(small):
    kw = dict(prior=LaplaceZero(rho=Beta(1, 1)), method="gibbs", draws=30, tune=10, chains=2, progress=False, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one, two = vbsvm.svm("y ~ .", small, **kw), vbsvm.svm("y ~ .", small, **kw)
    np.testing.assert_array_equal(one.posterior["rho_draws"], two.posterior["rho_draws"])


def test_beta_copies_and_pickles_as_the_same_value():
    import copy
    import pickle

    for prior in (vbsvm.Beta(), vbsvm.Beta(2, 5)):
        assert copy.copy(prior) == prior and copy.deepcopy(prior) == prior
        assert pickle.loads(pickle.dumps(prior)) == prior
    lz = vbsvm.LaplaceZero(keep=["x1"])
    assert copy.deepcopy(lz).rho == lz.rho
