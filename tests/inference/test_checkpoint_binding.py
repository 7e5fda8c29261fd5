"""A Gibbs checkpoint resumes only the run that wrote it.

``svm(..., checkpoint=)`` binds its files to the formula, the design columns, a SHA-256 of the
design and response, and the settings that change the chains; a rerun with other data (labels
flipped), the formula's terms swapped, another prior setting or seed is refused with an
``InputError`` naming what differs and leaves the file as it was, and the same call still
resumes to the draws of an uninterrupted run.
"""

import json
import os
import re
import signal
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import vbsvm
from vbsvm.exceptions import InputError, InterruptWarning
from vbsvm.inference.gibbs import run_chains
from vbsvm.models.linear import LinearSVMModel
from vbsvm.inference.run_fingerprint import data_digest, run_fingerprint

GIBBS = dict(method="gibbs", draws=40, tune=10, chains=2, seed=5, progress=False)


@pytest.fixture(scope="module")
def df():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x1": rng.normal(size=80), "x2": rng.normal(size=80), "g": rng.integers(0, 6, size=80)})
    frame["y"] = (frame.x1 + rng.normal(size=80) > 0).astype(int)
    return frame


def quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vbsvm.svm(*args, **kwargs)


def interrupted(monkeypatch, formula, data, at=30, sampler=LinearSVMModel, **kw):
    """Run ``svm`` with Ctrl-C (SIGINT) in the ``at``-th sweep of ``sampler`` (chain 1): the chain
    stops after that sweep and its checkpoint stays."""
    sweep, count = sampler.gibbs_sweep, [0]

    def stopping(self, state, rng):
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs
        return sweep(self, state, rng)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            patch.setattr(sampler, "gibbs_sweep", stopping)
            fit = vbsvm.svm(formula, data, **kw)
    finally:
        signal.signal(signal.SIGINT, before)
    assert any(issubclass(w.category, InterruptWarning) and "checkpoint files" in str(w.message) for w in caught)
    return fit


def test_a_checkpoint_of_other_data_formula_or_settings_is_refused(tmp_path, df, monkeypatch):
    kw = dict(GIBBS, checkpoint=tmp_path / "ck")
    fit = interrupted(monkeypatch, "y ~ x1 + x2 + (1 | g)", df, **kw)
    assert fit.info["interrupted"] and fit.posterior["theta_draws"].shape[:2] == (1, 20)
    file = tmp_path / "ck.chain0.npz"
    saved = file.read_bytes()
    cases = {
        "labels flipped": (("y ~ x1 + x2 + (1 | g)", df.assign(y=1 - df.y)), {}, [r"data \(file: 'sha256:"]),
        "a predictor changed": (("y ~ x1 + x2 + (1 | g)", df.assign(x2=df.x2 * 1.5)), {}, ["data"]),
        "terms swapped": (("y ~ x2 + x1 + (1 | g)", df), {},
                          [r"formula \(file: 'y~x1\+x2\+\(1\|g\)', this run: 'y~x2\+x1\+\(1\|g\)'\)",
                           r"design columns \(file: \['Intercept', 'x1', 'x2'\], "
                           r"this run: \['Intercept', 'x2', 'x1'\]\)"]),
        "other grouping": (("y ~ x1 + x2 + (1 | g)", df.assign(g=df.g % 3)), {}, ["random-effect terms", "data"]),
        "other penalty": (("y ~ x1 + x2 + (1 | g)", df), {"penalty": 1.0},
                          [r"penalty \(file: 'auto', this run: 1.0\)"]),
        "other prior scale": (("y ~ x1 + x2 + (1 | g)", df), {"B_u": 0.5}, [r"B_u \(file: 0.01, this run: 0.5\)"]),
        "other seed": (("y ~ x1 + x2 + (1 | g)", df), {"seed": 6}, ["these differ: seed"]),
        "other draws": (("y ~ x1 + x2 + (1 | g)", df), {"draws": 41}, [r"draws \(file: 40, this run: 41\)"]),
    }
    for case, (args, change, named) in cases.items():
        with pytest.raises(InputError, match="belongs to another run") as err:
            quiet(*args, **dict(kw, **change))
        message = str(err.value)
        for pattern in named:
            assert re.search(pattern, message), (case, message)
        assert "Delete the files" in message and "another checkpoint= path" in message, case
        assert file.read_bytes() == saved, case  # a refused file is left as it was
    # what does not change the chains is not bound: blanks in the formula, n_jobs, progress, level
    resumed = quiet("y~x1+x2+(1|g)", df, **dict(kw, n_jobs=2, level=0.9))
    whole = quiet("y ~ x1 + x2 + (1 | g)", df, **GIBBS)
    np.testing.assert_array_equal(resumed.posterior["theta_draws"], whole.posterior["theta_draws"])
    np.testing.assert_array_equal(resumed.posterior["sigma2_draws"], whole.posterior["sigma2_draws"])
    assert list(tmp_path.iterdir()) == []  # removed once the run completed


def test_selection_prior_is_bound(tmp_path, df, monkeypatch):
    kw = dict(GIBBS, tune=20, checkpoint=tmp_path / "ck")
    from vbsvm.models.selection import LaplaceZeroModel

    interrupted(monkeypatch, "y ~ x1 + x2", df, at=50, sampler=LaplaceZeroModel, prior=vbsvm.LaplaceZero(rho=0.5),
                **kw)
    with pytest.raises(InputError, match=r"prior \(file: \{.*'rho': 0.5.*this run: \{.*'rho': 0.3"):
        quiet("y ~ x1 + x2", df, prior=vbsvm.LaplaceZero(rho=0.3), **kw)


def test_fingerprint_binds_the_arrays_and_chain_settings():
    from vbsvm.fitting.svm import fit_settings
    from vbsvm.formula.design import build_design

    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"x": rng.normal(size=30), "z": rng.normal(size=30), "g": rng.integers(0, 4, size=30)})
    frame["y"] = (frame.x > 0).astype(int)

    def fingerprint(data=frame, formula="y ~ x + z + (1 | g)", **change):
        kw = dict(method="gibbs", penalty="auto", missing="drop", standardize=True, draws=10, tune=5, chains=2,
                  thin=1, seed=1, tol=1e-6, max_iter=100, accelerate=True, sigma2_beta=1e8, A_u=0.01, B_u=0.01,
                  level=0.95, progress=False, n_jobs=1)
        kw.update(change)
        settings = fit_settings(formula, **kw).replace(checkpoint="ck")
        return run_fingerprint(build_design(formula, data, standardize=settings["standardize"]), settings)

    base = fingerprint()
    assert base == fingerprint(frame.copy()) and json.loads(json.dumps(base)) == base
    assert base == fingerprint(progress=True, n_jobs=3, level=0.8)  # these do not change the chains
    for data in (frame.assign(y=1 - frame.y), frame.assign(z=frame.z.to_numpy()[::-1]),
                 frame.assign(g=(frame.g + 1) % 4), frame.iloc[1:]):
        assert fingerprint(data)["data"] != base["data"]
    assert fingerprint(standardize=False)["data"] != base["data"]
    assert fingerprint(penalty=2.0)["penalty"] == 2.0
    assert fingerprint(method="vb") is None  # only Gibbs runs are checkpointed
    # the digest reads every array: a changed entry of X changes it
    design = build_design("y ~ x + z", frame)
    before = data_digest(design)
    design.X[3, 1] += 1e-12
    assert data_digest(design) != before


class Counter:
    def gibbs_initial_state(self, rng):
        return {"theta": np.zeros(1)}

    def gibbs_sweep(self, state, rng):
        n = state["theta"][0] + 1
        if n == 20:
            raise KeyboardInterrupt
        return {"theta": np.array([n])}


def test_engine_binds_the_run_it_is_given(tmp_path):
    kw = dict(draws=30, tune=5, chains=1, seed=1, progress=False, checkpoint=tmp_path / "run", checkpoint_every=0.0)
    with pytest.warns(InterruptWarning):
        run_chains(Counter(), run={"data": "sha256:aaaa", "formula": "y~x"}, **kw)
    with pytest.raises(InputError, match=r"these differ: data \(file: 'sha256:aaaa', this run: 'sha256:bbbb'\)\."):
        run_chains(Counter(), run={"data": "sha256:bbbb", "formula": "y~x"}, **kw)
    with pytest.raises(InputError, match=r"data \(file: 'sha256:aaaa', this run: None\); formula"):
        run_chains(Counter(), **kw)
    # a file that records no run (e.g. written by an older version) is not resumed by a bound run
    (tmp_path / "run.chain0.npz").unlink()
    with pytest.warns(InterruptWarning):
        run_chains(Counter(), **kw)
    with pytest.raises(InputError, match=r"formula, design and data \(not recorded in the file\)"):
        run_chains(Counter(), run={"data": "sha256:aaaa"}, **kw)
