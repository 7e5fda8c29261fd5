"""The default method="vb" (calibrated EP over the variances) on Dask DataFrames
(vbsvm.sources.dask_ep): equal to the in-memory fit, site vectors kept and forgotten by the blocks,
clear refusals."""

import numpy as np
import pytest

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from support.frames import relative_error, site_frame

import vbsvm
from vbsvm.exceptions import InputError

N = 700
FORMULA = "y ~ x1 + x2 + x3 + x4 + C(sex)"
TOL = 1e-6


@pytest.fixture(scope="module")
def frame():
    return site_frame(N, 11, 9)


def _assert_same_fit(fit, ref, frame):
    assert fit.info["approximation"] == ref.info["approximation"] and fit.n_obs == ref.n_obs
    assert fit.info["n_ep"] == ref.info["n_ep"] and fit.info["n_sweeps"] == ref.info["n_sweeps"]
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < TOL
    assert relative_error(fit.coef["sd"], ref.coef["sd"]) < TOL
    if len(ref.varcomp()):
        assert relative_error(fit.varcomp()["mean"], ref.varcomp()["mean"]) < TOL
    np.testing.assert_allclose(fit.info["prob_calibration"], ref.info["prob_calibration"], rtol=TOL)
    new = frame.iloc[:200]
    for kind in ("prob", "score"):
        got, want = fit.predict(new, kind=kind), ref.predict(new, kind=kind)
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=TOL, atol=1e-10)


def test_default_method_equals_in_memory_fit(client, frame):
    """The default fit of a Dask frame is the in-memory fit (EP runs, sweeps, corrected marginals,
    the variance's grid, the probit scale, predictions)."""
    ref = vbsvm.svm(FORMULA, frame, seed=3)
    fit = vbsvm.svm(FORMULA, dd.from_pandas(frame, npartitions=2), seed=3)
    _assert_same_fit(fit, ref, frame)
    assert fit.info["passes"] >= fit.info["n_sweeps"]
    # the same seed, the same iid draws from the mixture
    np.testing.assert_allclose(fit.posterior["theta_draws"], ref.posterior["theta_draws"], rtol=TOL, atol=1e-9)


@pytest.mark.parametrize("penalty", ["auto", 0.5, None])
@pytest.mark.parametrize("npartitions", [1, 2, 7])
@pytest.mark.slow
def test_equals_in_memory_fit(client, frame, penalty, npartitions, monkeypatch):
    from vbsvm.fitting import dask as dask_fit

    monkeypatch.setattr(dask_fit, "BLOCK_BYTES", 1)  # a block per partition
    ref = vbsvm.svm(FORMULA, frame, penalty=penalty, seed=1)
    fit = vbsvm.svm(FORMULA, dd.from_pandas(frame, npartitions=npartitions), penalty=penalty, seed=1)
    assert fit.info["blocks"] == npartitions
    _assert_same_fit(fit, ref, frame)


@pytest.mark.slow
def test_refit_gives_identical_numbers(client, frame):
    """The blocks and the order of every sum depend on the partitions and the workers only."""
    data = dd.from_pandas(frame, npartitions=7)
    a, b = vbsvm.svm(FORMULA, data, seed=4), vbsvm.svm(FORMULA, data, seed=4)
    np.testing.assert_array_equal(a.coef.to_numpy(), b.coef.to_numpy())
    np.testing.assert_array_equal(a.posterior["theta_draws"], b.posterior["theta_draws"])


@pytest.mark.slow
def test_spilled_fit_equals_in_memory_and_cleans_up(client, frame, tmp_path, monkeypatch):
    """persist=False: the site vectors are files next to the spilled design, removed with it."""
    import dask

    from vbsvm.fitting import dask as dask_fit

    monkeypatch.setattr(dask_fit, "BLOCK_BYTES", 60_000)
    ref = vbsvm.svm(FORMULA, frame, seed=2)
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        fit = vbsvm.svm(FORMULA, dd.from_pandas(frame, npartitions=5), persist=False, seed=2)
    assert not fit.info["persisted"] and fit.info["blocks"] > 1
    _assert_same_fit(fit, ref, frame)
    assert list(tmp_path.iterdir()) == []


def test_blocks_forget_released_site_vectors(client, frame, monkeypatch):
    """Every site vector a block keeps is forgotten once the client no longer refers to it: the
    blocks hold a bounded number of vectors during the fit, not one per pass."""
    from vbsvm.sources import dask_blocks

    live, peak, kept = {}, [0], [0]
    keep, drop = dask_blocks._Resident.keep_vector, dask_blocks._Resident.drop_vectors

    def keep_vector(self, key, values):
        keep(self, key, values)
        live.setdefault(id(self), set()).add(key)
        kept[0] += 1
        peak[0] = max(peak[0], len(live[id(self)]))

    def drop_vectors(self, keys):
        drop(self, keys)
        live.setdefault(id(self), set()).difference_update(keys)

    monkeypatch.setattr(dask_blocks._Resident, "keep_vector", keep_vector)
    monkeypatch.setattr(dask_blocks._Resident, "drop_vectors", drop_vectors)
    fit = vbsvm.svm(FORMULA, dd.from_pandas(frame, npartitions=2), seed=3)
    assert kept[0] > 4 * fit.info["n_ep"] and peak[0] <= 24


def test_refusals(client, frame):
    data = dd.from_pandas(frame, npartitions=2)
    with pytest.raises(InputError, match=r"random-effect term\(s\) \(1 \| site\).*method='meanfield'"):
        vbsvm.svm("y ~ x1 + (1 | site)", data)
    with pytest.raises(InputError, match="LaplaceZero"):
        vbsvm.svm("y ~ x1", data, prior=vbsvm.LaplaceZero())
    with pytest.raises(InputError, match="missing='drop'"):
        vbsvm.svm("y ~ x1", data, missing="impute")
