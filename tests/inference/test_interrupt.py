"""Ctrl-C keeps the work done so far, and parallel chains leave no process behind (issue #15, #14.6).

* Gibbs, serial and ``n_jobs=2``: SIGINT sent to the process group (as Ctrl-C in a terminal) makes
  ``vbsvm.svm`` return a fit with the draws so far and an ``InterruptWarning``; afterwards the
  process has no children.
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

from vbsvm.exceptions import InterruptWarning, WorkerError
from vbsvm.inference.gibbs import _common_length, run_chains
from vbsvm.inference.vb import coordinate_ascent

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))

CHILDREN = """
def children():
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                found.append(int(entry))
    return found
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
print(json.dumps({"shape": list(fit.posterior["theta_draws"].shape), "children": children(),
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
    proc = subprocess.Popen([sys.executable, "-c", DEFAULT_SIGINT + script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, start_new_session=True, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        time.sleep(after)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_ctrl_c_during_gibbs_returns_the_draws_so_far(n_jobs):
    res = interrupted_run(GIBBS_SCRIPT, n_jobs)
    chains, draws, q = res["shape"]
    assert 1 <= chains <= 4 and 0 < draws < 10**7 and q == 3
    if n_jobs == 2:
        assert chains == 2  # both workers were running their first chain
    assert any(w.startswith("InterruptWarning: Gibbs sampling was interrupted") for w in res["warnings"])
    assert res["children"] == []
    assert np.all(np.isfinite(res["coef"]))


# ----------------------------------------------------------------------------- VB
class SlowVB:
    """ELBO rising by 1 per sweep from -1e6: never converges at tol=1e-8, each sweep ~2 ms."""

    def vb_initial_state(self):
        return np.zeros(1)

    def vb_sweep(self, x):
        time.sleep(0.002)
        new = x + 1.0
        elbo = -1e6 + float(new[0])
        return new, {"elbo": elbo, "x": new.copy()}, elbo


VB_SCRIPT = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
from test_interrupt import SlowVB
from vbsvm.inference.vb import coordinate_ascent
print("start", flush=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = coordinate_ascent(SlowVB(), max_iter=10**9)
print(json.dumps({"converged": res.converged, "interrupted": res.info["interrupted"], "q_elbo": res.q["elbo"],
                  "elbo": res.elbo.tolist(), "state": res.state.tolist(), "q_x": res.q["x"].tolist(),
                  "warnings": [type(w.message).__name__ for w in caught]}))
"""


def test_ctrl_c_during_vb_returns_the_last_accepted_q():
    res = interrupted_run(VB_SCRIPT, Path(__file__).parent, after=1.0)
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
class Counter:
    """Gibbs toy: theta counts sweeps; raises ``error`` at sweep ``fail_at`` (in the chain ``chain``)."""

    def __init__(self, fail_at=None, error=KeyboardInterrupt, chain_value=None):
        self.fail_at, self.error, self.chain_value = fail_at, error, chain_value

    def gibbs_initial_state(self, rng):
        return {"theta": np.zeros(2), "first": rng.random()}

    def gibbs_sweep(self, state, rng):
        n = state["theta"][0] + 1
        if n == self.fail_at and (self.chain_value is None or state["first"] < self.chain_value):
            if self.error == "exit":
                os._exit(3)
            raise self.error("sweep failed") if self.error is not KeyboardInterrupt else KeyboardInterrupt
        return {"theta": np.array([n, rng.random()]), "first": state["first"]}


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


def test_unguarded_script_with_spawn_fails_with_advice(tmp_path):
    # the start method used outside Linux re-imports the script in each worker
    script = tmp_path / "unguarded_spawn.py"
    script.write_text("import vbsvm.inference.gibbs as g\ng._start_method = lambda: 'spawn'\n" + UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "WorkerError" in proc.stderr and "if __name__ ==" in proc.stderr and "n_jobs=1" in proc.stderr


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
