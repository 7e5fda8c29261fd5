"""Ctrl-C keeps the work done so far, and parallel chains leave no process behind.

* Gibbs, serial and ``n_jobs=2``: SIGINT sent to the process group (as Ctrl-C in a terminal) makes
  ``vbsvm.svm`` return a fit with the draws so far and an ``InterruptWarning``; afterwards the
  process has no children.
* A second Ctrl-C while the stopped run's draws are collected and the fit is built is absorbed (a
  note on stderr): the fit is still returned, the checkpoint files hold the chains, no temporary
  file is left; a third aborts.
* VB: the last accepted q is returned with ``converged=False``.
* A worker that fails or dies is reported (its error, or ``WorkerError``) and nothing is left running.
* A script without ``if __name__ == "__main__":`` runs ``n_jobs=2`` once, without re-running itself.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.processes import session
from support.runs import Counter, SlowVB

from vbsvm.exceptions import InterruptWarning, WorkerError
from vbsvm.inference.gibbs import _common_length, run_chains
from vbsvm.inference.vb import coordinate_ascent

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))

CHILDREN = f"""
sys.path.append({str(ROOT / "tests")!r})
from support.processes import children
"""

GIBBS_SCRIPT = """
import json, os, sys, warnings
import numpy as np, pandas as pd
import vbsvm
""" + CHILDREN + """
rng = np.random.default_rng(0)
df = pd.DataFrame({"x": rng.normal(size=300), "z": rng.normal(size=300)})
df["y"] = (df.x + rng.normal(size=300) > 0).astype(int)
print("start", flush=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fit = vbsvm.svm("y ~ x + z", df, method="gibbs", draws=10**7, tune=5, chains=4, seed=1,
                    progress=False, n_jobs=int(sys.argv[1]))
print(json.dumps({"shape": list(fit.posterior["theta_draws"].shape), "children": children(os.getpid()),
                  "coef": fit.coef["mean"].tolist(),
                  "warnings": [type(w.message).__name__ + ": " + str(w.message) for w in caught]}), flush=True)
"""


#: Prepended to each script: Python's own SIGINT handler. A shell that starts a command in the
#: background (``nohup sh -c '...' &``, as a CI runner may) leaves SIGINT ignored, the child
#: inherits that, and Python then keeps it ignored, so the run never sees the interrupt (all three
#: tests here timed out that way); a terminal's Ctrl-C always finds the handler.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def interrupted_run(script, *args, after=1.5):
    """Run ``script``, send SIGINT to its process group ``after`` s after it prints 'start'."""
    with session(DEFAULT_SIGINT + script, *args, env=ENV) as proc:
        assert proc.stdout.readline().strip() == "start"
        time.sleep(after)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.slow
def test_ctrl_c_during_gibbs_returns_the_draws_so_far(n_jobs):
    res = interrupted_run(GIBBS_SCRIPT, n_jobs)
    chains, draws, q = res["shape"]
    assert 1 <= chains <= 4 and 0 < draws < 10**7 and q == 3
    if n_jobs == 2:
        assert chains == 2  # both workers were running their first chain
    assert any(w.startswith("InterruptWarning: Gibbs sampling was interrupted") for w in res["warnings"])
    assert res["children"] == []
    assert np.all(np.isfinite(res["coef"]))


DOUBLE_SCRIPT = """
import json, os, signal, sys, time, warnings
import numpy as np, pandas as pd
import vbsvm
from vbsvm.models.linear import LinearSVMModel
from vbsvm.results.fit import Fit
""" + CHILDREN + """
n_jobs, folder = int(sys.argv[1]), sys.argv[2]
sweep, warn, count = LinearSVMModel.gibbs_sweep, Fit._warn_diagnostics, [0]


def slow_sweep(self, state, rng):  # says when it samples; then sweeps that a stop waits for
    count[0] += 1
    if count[0] == 20:  # one write: the two workers' lines do not interleave
        os.write(1, b"sampling\\n")
    if count[0] > 20:  # in parallel the second Ctrl-C comes while the workers finish their sweep
        time.sleep(0.3 if n_jobs > 1 else 0.05)
    return sweep(self, state, rng)


def slow_diagnostics(self):  # as slow as R-hat and ESS are the first time (importing arviz)
    time.sleep(1.0)
    return warn(self)


LinearSVMModel.gibbs_sweep, Fit._warn_diagnostics = slow_sweep, slow_diagnostics
rng = np.random.default_rng(0)
df = pd.DataFrame({"x": rng.normal(size=300), "z": rng.normal(size=300)})
df["y"] = (df.x + rng.normal(size=300) > 0).astype(int)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fit = vbsvm.svm("y ~ x + z", df, method="gibbs", draws=10**7, tune=5, chains=4, seed=1, progress=False,
                    n_jobs=n_jobs, checkpoint=os.path.join(folder, "ck"))
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the test is about svm(), not about this script's printing
files = {}
for name in sorted(os.listdir(folder)):
    with np.load(os.path.join(folder, name)) as z:
        files[name] = int(z["kept:theta"].shape[0])
print(json.dumps({"shape": list(fit.posterior["theta_draws"].shape), "children": children(os.getpid()), "files": files,
                  "warnings": [type(w.message).__name__ + ": " + str(w.message) for w in caught]}), flush=True)
"""


@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.slow
def test_second_ctrl_c_still_returns_the_fit(n_jobs, tmp_path):
    """Two SIGINTs 0.3 s apart: the second lands while the workers' chains are collected
    (``n_jobs=2``: each finishes its 0.3 s sweep) or while the fit is built (its diagnostics take
    1 s; a serial run stops at the end of its 0.05 s sweep)."""
    with session(DEFAULT_SIGINT + DOUBLE_SCRIPT, n_jobs, tmp_path, env=ENV) as proc:
        assert proc.stdout.readline().strip() == "sampling"
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "vbsvm: stopping: the draws kept so far are being collected" in err
    res = json.loads(out.strip().splitlines()[-1])
    chains, draws, _ = res["shape"]
    assert chains == n_jobs and draws > 0 and res["children"] == []
    assert any(w.startswith("InterruptWarning") and "checkpoint files" in w for w in res["warnings"])
    # the checkpoints hold each running chain up to where it stopped (no temporary file beside them)
    assert sorted(res["files"]) == [f"ck.chain{c}.npz" for c in range(n_jobs)]
    assert min(res["files"].values()) == draws


def test_third_ctrl_c_aborts_and_the_handler_is_restored():
    from vbsvm.inference import interrupts

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.collecting():
                with interrupts.collecting():  # nested scopes: the outermost restores
                    interrupts.absorb()
                    os.kill(os.getpid(), signal.SIGINT)  # absorbed
                    time.sleep(0.05)
                assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
                os.kill(os.getpid(), signal.SIGINT)  # aborts
                time.sleep(1.0)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with interrupts.collecting():
            interrupts.absorb()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored at the end
        interrupts.absorb()  # outside a scope: nothing to restore it, so nothing is changed
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


# ----------------------------------------------------------------------------- VB
VB_SCRIPT = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
from support.runs import SlowVB
from vbsvm.inference.vb import coordinate_ascent
print("start", flush=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = coordinate_ascent(SlowVB(), max_iter=10**9)
print(json.dumps({"converged": res.converged, "interrupted": res.info["interrupted"], "q_elbo": res.q["elbo"],
                  "elbo": res.elbo.tolist(), "state": res.state.tolist(), "q_x": res.q["x"].tolist(),
                  "warnings": [type(w.message).__name__ for w in caught]}))
"""


@pytest.mark.slow
def test_ctrl_c_during_vb_returns_the_last_accepted_q():
    res = interrupted_run(VB_SCRIPT, Path(__file__).parents[1], after=1.0)
    assert res["converged"] is False and res["interrupted"] is True
    assert res["warnings"] == ["InterruptWarning"]
    assert res["q_elbo"] == res["elbo"][-1] and res["state"] == res["q_x"]
    assert len(res["elbo"]) > 10 and np.all(np.diff(res["elbo"]) >= 0)


@pytest.mark.parametrize("error", [ValueError, np.linalg.LinAlgError, FloatingPointError])
def test_numerical_failure_of_a_sweep_is_a_vbsvm_error(error):
    # found by the fuzz suite: a variance update that came out NaN raised a bare ValueError
    from vbsvm.exceptions import NumericalError

    class Fails(SlowVB):
        def vb_sweep(self, x):
            raise error("scale must be strictly positive")

    with pytest.raises(NumericalError, match="variational Bayes: a model update failed numerically"):
        coordinate_ascent(Fails())
    with pytest.raises(NumericalError, match="Gibbs sampling"):
        run_chains(Counter(fail_at=3, error=error), draws=5, tune=0, chains=1, seed=0, progress=False)


def test_vb_interrupt_in_first_sweep_is_passed_on():
    class Fails(SlowVB):
        def vb_sweep(self, x):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        coordinate_ascent(Fails())


# ----------------------------------------------------------------------------- Gibbs engine
def test_serial_interrupt_keeps_finished_chains_and_warns():
    with pytest.warns(InterruptWarning, match="returning 1 chain"):
        res = run_chains(Counter(fail_at=50), draws=100, tune=10, chains=3, seed=0, progress=False)
    assert res.interrupted and res.chains == 1 and res.n_draws == 39
    np.testing.assert_array_equal(res.draws["theta"][0, :, 0], np.arange(11, 50))


def test_interrupt_during_tuning_passes_the_interrupt_on():
    with pytest.raises(KeyboardInterrupt):
        run_chains(Counter(fail_at=5), draws=100, tune=10, chains=2, seed=0, progress=False)


def test_common_length_keeps_the_most_draws():
    def kept(n):
        return {"theta": [np.zeros(1)] * n}

    stacked, k, n = _common_length({0: kept(100), 1: kept(40), 2: kept(35), 3: kept(0)}, ["theta"], True)
    assert (k, n) == (3, 35) and stacked["theta"].shape == (3, 35, 1)
    stacked, k, n = _common_length({0: kept(100), 1: kept(10)}, ["theta"], True)
    assert (k, n) == (1, 100)


def test_parallel_chains_equal_serial_chains():
    kw = dict(draws=20, tune=5, chains=3, seed=7, progress=False)
    serial = run_chains(Counter(), **kw)
    parallel = run_chains(Counter(), n_jobs=2, **kw)
    np.testing.assert_array_equal(serial.draws["theta"], parallel.draws["theta"])
    assert not parallel.interrupted


def test_worker_error_is_raised_and_no_worker_is_left():
    import multiprocessing

    with pytest.raises(RuntimeError, match="sweep failed"):
        run_chains(Counter(fail_at=8, error=RuntimeError), draws=10**6, tune=0, chains=2, seed=0,
                   progress=False, n_jobs=2)
    assert multiprocessing.active_children() == []


def test_dead_worker_raises_worker_error_with_advice():
    import multiprocessing

    with pytest.raises(WorkerError, match="__main__"):
        run_chains(Counter(fail_at=8, error="exit"), draws=100, tune=0, chains=2, seed=0, progress=False,
                   n_jobs=2)
    assert multiprocessing.active_children() == []


UNGUARDED = """
import numpy as np, pandas as pd, warnings
import vbsvm
warnings.simplefilter("ignore")
print("script body", flush=True)
rng = np.random.default_rng(0)
df = pd.DataFrame({"x": rng.normal(size=100)})
df["y"] = (df.x + rng.normal(size=100) > 0).astype(int)
fit = vbsvm.svm("y ~ x", df, method="gibbs", draws=50, max_draws=50, tune=10, chains=2, seed=1, progress=False,
                n_jobs=2)
print("draws", fit.posterior["theta_draws"].shape, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork start method is used on Linux")
@pytest.mark.slow
def test_script_without_main_guard_runs_parallel_chains_once(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(script)], capture_output=True,
                          text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("script body") == 1
    assert "draws (2, 50, 2)" in proc.stdout


def test_warnings_module_state_is_untouched():
    # run_chains silences one DeprecationWarning only while it forks
    with warnings.catch_warnings():
        before = list(warnings.filters)
        run_chains(Counter(), draws=5, tune=0, chains=2, seed=0, progress=False, n_jobs=2)
        assert warnings.filters == before


@pytest.mark.slow
def test_unguarded_script_with_spawn_fails_with_advice(tmp_path):
    # the start method used outside Linux re-imports the script in each worker
    script = tmp_path / "unguarded_spawn.py"
    script.write_text("import vbsvm.inference.gibbs as g\ng._start_method = lambda: 'spawn'\n" + UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "WorkerError" in proc.stderr and "if __name__ ==" in proc.stderr and "n_jobs=1" in proc.stderr


@pytest.mark.slow
def test_spawned_workers_give_the_serial_chains(monkeypatch):
    import vbsvm.inference.gibbs as gibbs

    monkeypatch.setattr(gibbs, "_start_method", lambda: "spawn")
    kw = dict(draws=10, tune=2, chains=2, seed=3, progress=False)
    np.testing.assert_array_equal(run_chains(Counter(), n_jobs=2, **kw).draws["theta"],
                                  run_chains(Counter(), **kw).draws["theta"])


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoint_resume_gives_the_uninterrupted_draws(tmp_path):
    base = tmp_path / "run"
    kw = dict(draws=30, tune=5, chains=3, seed=11, progress=False)
    with pytest.warns(InterruptWarning):
        run_chains(Counter(fail_at=20), checkpoint=base, checkpoint_every=0.0, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.chain0.npz"]  # chains 1, 2 never started
    resumed = run_chains(Counter(), checkpoint=base, n_jobs=2, **kw)
    np.testing.assert_array_equal(resumed.draws["theta"], run_chains(Counter(), **kw).draws["theta"])
    assert list(tmp_path.iterdir()) == []  # removed once the run completed


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test (as in a terminal; a test runner may ignore it)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_serial_ctrl_c_stops_at_a_sweep_boundary_and_saves_it(tmp_path, sigint_raises):
    """Ctrl-C in a serial checkpointed run stops the chain after the sweep in progress and saves
    its position there (not only every ``checkpoint_every`` seconds): the rerun continues from
    there to the uninterrupted draws. A second Ctrl-C during that sweep stops it at once; the
    draws so far are still returned."""
    base = tmp_path / "run"
    kw = dict(draws=30, tune=5, chains=2, seed=11, progress=False)
    whole = run_chains(Counter(), **kw)
    with pytest.warns(InterruptWarning, match="returning 1 chain"):
        cut = run_chains(Counter(sigint_at=20), checkpoint=base, checkpoint_every=1e9, **kw)
    with np.load(tmp_path / "run.chain0.npz") as z:
        assert int(z["position"]) == 20 and z["kept:theta"].shape[0] == cut.n_draws == 15
    np.testing.assert_array_equal(cut.draws["theta"][0], whole.draws["theta"][0, :15])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    np.testing.assert_array_equal(run_chains(Counter(), checkpoint=base, **kw).draws["theta"], whole.draws["theta"])
    # Ctrl-C twice within a sweep: stopped in it, the last periodic checkpoint (none here) stays
    with pytest.warns(InterruptWarning):
        cut = run_chains(Counter(sigint_at=20, sigint_times=2), checkpoint=base, checkpoint_every=1e9, **kw)
    assert cut.n_draws == 14 and list(tmp_path.iterdir()) == []
    # Ctrl-C during the last sweep of a chain: the next chain does not start
    with pytest.warns(InterruptWarning, match="returning 1 chain"):
        cut = run_chains(Counter(sigint_at=35), checkpoint=base, checkpoint_every=1e9, **kw)
    assert cut.n_draws == 30 and sorted(p.name for p in tmp_path.iterdir()) == ["run.chain0.npz"]


def test_checkpoint_of_another_run_is_refused(tmp_path, monkeypatch):
    from vbsvm.exceptions import InputError

    base = tmp_path / "run"
    with pytest.warns(InterruptWarning):
        run_chains(Counter(fail_at=20), checkpoint=base, checkpoint_every=0.0, draws=30, tune=5, chains=1, seed=1,
                   progress=False)
    with pytest.raises(InputError, match="another run"):
        run_chains(Counter(), checkpoint=base, draws=31, tune=5, chains=1, seed=1, progress=False)
    # the same run by a sampler whose state has another entry (another version of the model)
    initial = Counter.gibbs_initial_state
    monkeypatch.setattr(Counter, "gibbs_initial_state", lambda self, rng: {**initial(self, rng), "extra": np.zeros(1)})
    with pytest.raises(InputError, match="another run"):
        run_chains(Counter(), checkpoint=base, draws=30, tune=5, chains=1, seed=1, progress=False)
    monkeypatch.undo()
    (tmp_path / "run.chain0.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot be read"):
        run_chains(Counter(), checkpoint=base, draws=30, tune=5, chains=1, seed=1, progress=False)
    with pytest.raises(InputError, match="needs a seed"):
        run_chains(Counter(), checkpoint=base, draws=30, tune=5, chains=1, seed=None, progress=False)


def test_svm_checkpoint_argument_gives_the_uninterrupted_draws(tmp_path):
    """svm(checkpoint=...) reaches run_chains: same draws as a run without it."""
    import vbsvm

    df = vbsvm.datasets.simulate_grouped(12, 5, seed=1)
    kw = dict(method="gibbs", draws=60, tune=30, chains=2, seed=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = vbsvm.svm("y ~ time + (1 | group)", df, checkpoint=tmp_path / "ck", **kw)
        b = vbsvm.svm("y ~ time + (1 | group)", df, **kw)
    np.testing.assert_array_equal(a.posterior["theta_draws"], b.posterior["theta_draws"])
    assert a.settings["checkpoint"] == str(tmp_path / "ck")


def test_a_state_that_cannot_be_saved_is_refused_before_any_sweep(tmp_path, monkeypatch):
    """A sampler whose state holds a non-array entry (the cut imputation sampler's nested
    Laplace-zero state) is refused when the run starts, naming the entry, not at its first save
    a minute in."""
    from vbsvm.exceptions import InputError

    initial = Counter.gibbs_initial_state
    monkeypatch.setattr(Counter, "gibbs_initial_state", lambda self, rng: {**initial(self, rng), "svm": {"w": 1}})
    sweeps = []
    monkeypatch.setattr(Counter, "gibbs_sweep", lambda self, state, rng: sweeps.append(1) or state)
    with pytest.raises(InputError, match=r"\['state:svm'\].*run without checkpoint="):
        run_chains(Counter(), checkpoint=tmp_path / "run", draws=30, tune=5, chains=1, seed=1, progress=False)
    assert sweeps == [] and not list(tmp_path.iterdir())
