"""Gibbs worker processes (``n_jobs > 1``) exit when their parent dies.

A script runs chains in two workers; the test kills the script with SIGKILL (no Python cleanup
runs) and checks that both workers are gone (exited: no process or a zombie) within
``DEADLINE`` seconds, while they sample and while they are blocked writing their draws to a pipe
that no one reads. Each mechanism is tested alone (the watch thread polling the parent; Linux's
parent-death signal) and both together, as the package runs them.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from support.workers import kill_parent_and_time_workers
from support.workers import launcher as start_launcher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; kills with SIGKILL")

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
#: seconds the workers get to exit after their parent was killed (they take well under 1 s)
DEADLINE = 15.0


@pytest.fixture(scope="module")
def launcher():
    with start_launcher(ENV) as proc:
        yield proc


@pytest.mark.parametrize("mechanism, blocked", [("both", False), ("watch", True), ("signal", True)])
def test_workers_exit_when_their_parent_is_killed(launcher, tmp_path, mechanism, blocked):
    seconds = kill_parent_and_time_workers(launcher, tmp_path, mechanism, blocked=blocked, deadline=DEADLINE)
    assert seconds < DEADLINE


def test_killed_parent_leaves_readable_checkpoints_and_no_temporary_file(launcher, tmp_path):
    """Workers writing a checkpoint every sweep are killed between writes: each chain's file can
    be read and no temporary file is left in the directory."""
    kill_parent_and_time_workers(launcher, tmp_path, "both", blocked=False, checkpoint=tmp_path / "ck")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ck.chain0.npz", "ck.chain1.npz"], names
    for name in names:
        with np.load(tmp_path / name, allow_pickle=False) as z:
            assert int(z["position"]) > 0 and z["kept:theta"].shape[0] == int(z["position"])
