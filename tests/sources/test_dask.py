"""Fits from Dask DataFrames (vbsvm.fitting.dask): equal to the in-memory fits, lazily predicted,
and clear refusals for what is not map-reduced."""

import numpy as np
import pandas as pd
import pytest

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from support.frames import relative_error, site_frame

import vbsvm
from vbsvm.exceptions import InputError

N = 2500


@pytest.fixture(scope="module")
def frame():
    return site_frame(N, 7, 15, site_sd=0.8)


CASES = [
    ("y ~ x1 + x2 + x3 + x4 + C(sex)", "auto"),
    ("y ~ x1 + x2 + x3 + x4", 0.5),
    ("y ~ x1 + x2 + C(sex)", None),
    ("y ~ x1 + x2 + x3 + (1 | site)", "auto"),
]


@pytest.mark.parametrize("formula,penalty", CASES)
# one partition, and several of unequal size (7 over 2500 rows; 2 partitions tested nothing that 7 do not)
@pytest.mark.parametrize("npartitions", [1, 7])
@pytest.mark.slow
def test_equals_in_memory_fit(client, frame, formula, penalty, npartitions, monkeypatch):
    from vbsvm.fitting import dask as dask_fit

    monkeypatch.setattr(dask_fit, "BLOCK_BYTES", 1)  # a block per partition
    ref = vbsvm.svm(formula, frame, method="meanfield", penalty=penalty)
    data = dd.from_pandas(frame, npartitions=npartitions)
    fit = vbsvm.svm(formula, data, method="meanfield", penalty=penalty)
    assert fit.info["converged"] and fit.n_obs == N and fit.info["blocks"] == npartitions
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < 1e-8
    assert relative_error(fit.coef["sd"], ref.coef["sd"]) < 1e-8
    for name, table in ref.ranef().items():
        assert relative_error(fit.ranef()[name]["mean"], table["mean"]) < 1e-8
        assert relative_error(fit.ranef()[name]["sd"], table["sd"]) < 1e-8
    if penalty == "auto" or ref.layout.groups:
        vc_ref, vc = ref.varcomp(), fit.varcomp()
        assert relative_error(vc["mean"], vc_ref["mean"]) < 1e-8
    assert fit.info["n_sweeps"] == ref.info["n_sweeps"]
    np.testing.assert_allclose(fit.info["prob_calibration"], ref.info["prob_calibration"], rtol=1e-6)
    assert "Intercept" in fit.summary().as_text()


@pytest.mark.slow
def test_streamed_and_persisted_agree(client, frame):
    data = dd.from_pandas(frame, npartitions=3)
    a = vbsvm.svm("y ~ x1 + x2 + (1 | site)", data, method="meanfield", persist=False)
    b = vbsvm.svm("y ~ x1 + x2 + (1 | site)", data, method="meanfield", persist=True)
    assert not a.info["persisted"] and b.info["persisted"]
    assert relative_error(a.coef["mean"], b.coef["mean"]) < 1e-10


def test_missing_rows_dropped_as_in_memory(client, frame):
    df = frame.copy()
    df.loc[df.index[::37], "x2"] = np.nan
    ref = vbsvm.svm("y ~ x1 + x2", df, method="meanfield")
    fit = vbsvm.svm("y ~ x1 + x2", dd.from_pandas(df, npartitions=4), method="meanfield")
    assert fit.design.n_dropped == ref.design.n_dropped > 0 and fit.n_obs == ref.n_obs
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < 1e-8
    with pytest.raises(InputError, match="missing='drop'"):
        vbsvm.svm("y ~ x1 + x2", dd.from_pandas(df, npartitions=4), method="meanfield", missing="raise")


@pytest.fixture(scope="module")
def predict_fits(client, frame):
    """The same model fitted in memory and from Dask, once for the four kinds of prediction."""
    formula = "y ~ x1 + x2 + C(sex) + (1 | site)"
    return (vbsvm.svm(formula, frame, method="meanfield"),
            vbsvm.svm(formula, dd.from_pandas(frame, npartitions=2), method="meanfield"))


@pytest.mark.parametrize("kind", ["class", "prob", "score", "prob_positive"])
def test_predict_is_lazy_and_equal(predict_fits, frame, kind):
    ref, fit = predict_fits
    new = frame.iloc[:700]
    lazy = fit.predict(dd.from_pandas(new, npartitions=3), kind=kind)
    assert isinstance(lazy, (dd.Series, dd.DataFrame))
    got, want = lazy.compute(), ref.predict(new, kind=kind)
    assert got.index.equals(want.index)
    if kind == "class":
        assert (got == want).all()
    else:
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=1e-6, atol=1e-10)
    # a pandas frame gives the pandas result
    pd.testing.assert_series_equal(fit.predict(new, kind="class"), ref.predict(new, kind="class"))


def test_refusals(client, frame):
    data = dd.from_pandas(frame, npartitions=2)
    with pytest.raises(InputError, match=r"passes.*meanfield"):
        vbsvm.svm("y ~ x1", data, method="gibbs", draws=500, tune=500, chains=2)
    with pytest.raises(InputError, match="method='meanfield'"):
        vbsvm.svm("y ~ x1 + (1 | site)", data)  # the default calibrated VB: fixed effects only
    with pytest.raises(InputError, match="method='meanfield'"):
        vbsvm.svm("y ~ x1", data, method="map")
    with pytest.raises(InputError, match="missing='drop'"):
        vbsvm.svm("y ~ x1", data, method="meanfield", missing="impute")
    with pytest.raises(InputError, match="LaplaceZero"):
        vbsvm.svm("y ~ x1", data, method="meanfield", prior=vbsvm.LaplaceZero())
    with pytest.raises(InputError, match="persist"):
        vbsvm.svm("y ~ x1", data, method="meanfield", persist="sometimes")
    with pytest.raises(InputError, match="transform"):
        vbsvm.svm("y ~ center(x1)", data, method="meanfield")
    fit = vbsvm.svm("y ~ x1", data, method="meanfield")
    with pytest.raises(InputError, match="newdata"):
        fit.predict()
    with pytest.raises(InputError, match="Dask"):
        fit.save("never_written.nc")


def _gp_frame(rng, n):
    X = rng.uniform(-2, 2, (n, 2))
    f = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1.2
    return pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1],
                         "y": np.where(f + 0.4 * rng.standard_normal(n) > 0, "a", "b")})


@pytest.mark.slow
def test_gp_svi_from_dask_matches_in_memory(client):
    rng = np.random.default_rng(3)
    train, test = _gp_frame(rng, 8000), _gp_frame(rng, 8000)
    kw = dict(n_inducing=24, seed=5, progress=False, max_iter=4000)
    with pytest.warns(vbsvm.exceptions.ConvergenceWarning):
        ref = vbsvm.gpsvm("y ~ x1 + x2", train, **kw)
    with pytest.warns(vbsvm.exceptions.ConvergenceWarning):
        fit = vbsvm.gpsvm("y ~ x1 + x2", dd.from_pandas(train, npartitions=5), **kw)
    assert fit.n_obs == len(train)
    lazy = fit.predict(dd.from_pandas(test, npartitions=3))
    assert isinstance(lazy, dd.Series)
    err_ref = float(np.mean(ref.predict(test) != test.y))
    err = float(np.mean(lazy.compute() != test.y))
    assert abs(err - err_ref) < 0.005
    # same seed, same stream, same fit
    again = vbsvm.gpsvm("y ~ x1 + x2", dd.from_pandas(train, npartitions=5), **kw)
    np.testing.assert_array_equal(again.predict(test, kind="prob"), fit.predict(test, kind="prob"))
    with pytest.raises(InputError, match="method='svi'"):
        vbsvm.gpsvm("y ~ x1 + x2", dd.from_pandas(train, npartitions=2), method="vb", n_inducing=10)
    with pytest.raises(InputError, match="newdata"):
        fit.predict()


def test_random_slopes_equal_in_memory(client, frame):
    formula = "y ~ x1 + x2 + (1 + x3 | site)"
    ref = vbsvm.svm(formula, frame, method="meanfield")
    fit = vbsvm.svm(formula, dd.from_pandas(frame, npartitions=3), method="meanfield")
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < 1e-8
    assert relative_error(fit.coef["sd"], ref.coef["sd"]) < 1e-8
    assert relative_error(fit.ranef()["site"]["sd"], ref.ranef()["site"]["sd"]) < 1e-8


def test_spilled_fit_equals_in_memory_and_cleans_up(client, frame, tmp_path, monkeypatch):
    """persist=False writes each block's design once under Dask's temporary-directory,
    memory-maps it on every pass, gives the in-memory fit, removes its files, and leaves the
    user's frame as it was."""
    import tempfile

    import dask

    from vbsvm.fitting import dask as dask_fit

    made, original = [], tempfile.mkdtemp

    def mkdtemp(**kw):
        made.append(original(**kw))
        return made[-1]

    monkeypatch.setattr(dask_fit.tempfile, "mkdtemp", mkdtemp)
    df = frame.copy()
    df.loc[df.index[::53], "x3"] = np.nan
    before = df.copy()
    formula = "y ~ x1 + x2 + x3 + C(sex) + (1 + x1 | site)"
    ref = vbsvm.svm(formula, df, method="meanfield")
    monkeypatch.setattr(dask_fit, "BLOCK_BYTES", 400_000)  # two partitions a block
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        fit = vbsvm.svm(formula, dd.from_pandas(df, npartitions=4), method="meanfield", persist=False)
    assert not fit.info["persisted"] and fit.n_obs == ref.n_obs and 2 <= fit.info["blocks"] < 4
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < 1e-8
    assert relative_error(fit.coef["sd"], ref.coef["sd"]) < 1e-8
    assert relative_error(fit.ranef()["site"]["mean"], ref.ranef()["site"]["mean"]) < 1e-8
    assert fit.info["n_sweeps"] == ref.info["n_sweeps"]
    np.testing.assert_allclose(fit.info["prob_calibration"], ref.info["prob_calibration"], rtol=1e-6)
    assert len(made) == 1 and made[0].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the spill directory is gone
    pd.testing.assert_frame_equal(df, before)


def _block_spec(frame, formula):
    from vbsvm.fitting.svm import fit_settings
    from vbsvm.sources import dask_frames

    settings = fit_settings(formula, method="meanfield", draws=1, tune=1, chains=1, max_iter=10, progress=False)
    design = dask_frames.learn_design(formula, dd.from_pandas(frame, npartitions=1))
    return dask_frames.DesignSpec(design, settings)


def test_spilled_block_is_the_resident_block(frame, tmp_path):
    """A spilled block of two partitions unpickles to the same models over read-only memory maps,
    and keeps at most CHI_KEPT remembered arrays on disk."""
    import time

    from vbsvm.sources import dask_blocks

    frame = pd.concat([frame] * 4, ignore_index=True)  # a design above SMALL_BUFFER: written to a file
    spec = _block_spec(frame, "y ~ x1 + x2 + (1 | site)")
    halves = [frame.iloc[:4000], frame.iloc[4000:]]
    resident = dask_blocks._task_coalesce(None, *[dask_blocks.task_part(h, spec, None) for h in halves])
    spilled = dask_blocks._task_coalesce(str(tmp_path / "b"), *[
        dask_blocks.task_part(h, spec, str(tmp_path / f"p{k}")) for k, h in enumerate(halves)])
    assert resident.n == spilled.n == len(frame)
    for (rows_a, a), (rows_b, b) in zip(resident.models(), spilled.models()):
        assert rows_a == rows_b
        for name in ("Cd", "y", "codes", "Zs"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not b.Cd.flags.writeable and b.Cd.flags.f_contiguous
    for key in range(dask_blocks.CHI_KEPT + 3):
        spilled.remember(key, np.full(spilled.n, float(key)))
        time.sleep(0.02)  # the order of use is the files' modification times
    kept = sorted(p.name for p in (tmp_path / "b").glob("kept_*.npy"))
    assert len(kept) == dask_blocks.CHI_KEPT
    assert spilled.recall(0) is None and spilled.recall(dask_blocks.CHI_KEPT + 2)[0] == dask_blocks.CHI_KEPT + 2


@pytest.mark.parametrize("persist", [True, False])
@pytest.mark.slow
def test_coalesced_blocks_equal_in_memory_fit(client, frame, persist):
    """With the default BLOCK_BYTES the partitions make one block per worker (a pass is one task
    per worker), the fit is the in-memory fit, a refit gives identical numbers (the blocks do not
    depend on where the scheduler ran the tasks), and most sweeps take one pass (the Gram of a
    sweep's state and SQUAREM's norms computed ahead)."""
    formula = "y ~ x1 + x2 + x3 + x4 + C(sex)"
    ref = vbsvm.svm(formula, frame, method="meanfield")
    data = dd.from_pandas(frame, npartitions=7)
    fit = vbsvm.svm(formula, data, method="meanfield", persist=persist)
    again = vbsvm.svm(formula, data, method="meanfield", persist=persist)
    np.testing.assert_array_equal(again.coef.to_numpy(), fit.coef.to_numpy())
    assert fit.info["blocks"] == len(client.scheduler_info()["workers"]) < 7
    assert relative_error(fit.coef["mean"], ref.coef["mean"]) < 1e-8
    assert relative_error(fit.coef["sd"], ref.coef["sd"]) < 1e-8
    assert fit.info["n_sweeps"] == ref.info["n_sweeps"]
    assert fit.info["passes"] < 1.5 * fit.info["n_sweeps"]


def test_pass_memory_does_not_grow_with_the_block(frame):
    """A pass's task allocates its scratch arrays and one row vector (the block's new log chi),
    not arrays of the design's size, however many rows its block has."""
    import tracemalloc

    from vbsvm.fitting import dask as dask_fit
    from vbsvm.sources import dask_blocks

    big = pd.concat([frame] * 160, ignore_index=True)  # 400,000 rows
    formula = "y ~ x1 + x2 + x3 + x4 + C(sex)"
    spec = _block_spec(big, formula)
    parts = [dask_blocks.task_part(big.iloc[s:s + 50_000], spec, None) for s in range(0, len(big), 50_000)]
    block = dask_blocks._task_coalesce(None, *parts)
    model = dask_fit.DaskLinearModel([], spec.design, spec.settings)
    glob = model.skeleton.vb_initial_state()
    _, Bq, q_cov = model.skeleton._unpack_state(glob)
    gram = dask_blocks.task_gram(block, ("zero",))
    post = model.skeleton.vb_update(Bq, q_cov, gram=dask_blocks.Gram(*gram))["theta"]
    design_bytes = sum(p.Cd.nbytes for p in parts)
    tracemalloc.start()
    dask_blocks.task_sweep(block, post, 0, None)
    dask_blocks.task_gram(block, ("sub", ("post", post, 0), ("zero",)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    scratch = dask_blocks._Rows(spec.design.p)
    scratch_bytes = scratch.V.nbytes + scratch.S.nbytes + scratch.vec.nbytes
    assert peak < 2 * 8 * block.n + scratch_bytes + 2 ** 19 < design_bytes / 2


def test_partition_tasks_return_arrow_pool_memory_first(monkeypatch):
    """pyarrow's pool keeps freed buffers of earlier partitions (the source's reads) and a worker's
    memory limit counts them: each task that reads a raw partition hands them back first."""
    import types

    from vbsvm.sources import dask_blocks, dask_frames

    calls = []
    pool = types.SimpleNamespace(release_unused=lambda: calls.append(1))
    arrow = types.SimpleNamespace(default_memory_pool=lambda: pool)
    monkeypatch.setattr(dask_frames, "sys", types.SimpleNamespace(modules={"pyarrow": arrow}))
    frame = pd.DataFrame({"y": [1.0, -1.0, 1.0], "x": [0.1, 0.2, 0.3]})
    dask_frames._scan(frame, "y", [], ["x"])
    assert calls == [1]
    spec = types.SimpleNamespace(model=lambda f: None)
    assert dask_blocks.task_part(frame, spec, None) is None
    assert calls == [1, 1]
    monkeypatch.setattr(dask_frames, "sys", types.SimpleNamespace(modules={}))
    dask_frames.release_arrow_memory()  # no pyarrow loaded: nothing to release
    assert calls == [1, 1]
