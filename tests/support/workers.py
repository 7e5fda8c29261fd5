"""Gibbs workers whose parent is killed: a launcher process that forks runs of two chains in two
workers (``n_jobs=2``), and the timing of the workers' exit after SIGKILL of such a run. Shared by
``tests/inference/test_workers.py`` and ``benchmarks/worker_exit.py``."""

import contextlib
import os
import signal
import subprocess
import sys
import time

from support.processes import children

#: Imports the engine once (seconds on a busy machine), then for each line ``mechanism draws size
#: go checkpoint`` on stdin forks a process that runs two chains in two workers, and prints its pid.
LAUNCHER = """
import os, signal, sys, time, warnings
import numpy as np
import vbsvm.inference.gibbs as gibbs


class Toy:
    def __init__(self, size, go):
        self.size, self.go = size, go

    def gibbs_initial_state(self, rng):
        return {"theta": np.zeros(self.size)}

    def gibbs_sweep(self, state, rng):
        while self.go != "-" and not os.path.exists(self.go):  # the test says when to run
            time.sleep(0.01)
        time.sleep(0.001)
        return {"theta": rng.random(self.size)}


warnings.filterwarnings("ignore", message=".*use of fork", category=DeprecationWarning)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the killed runs are reaped at once
print("ready", flush=True)
for line in sys.stdin:
    mechanism, draws, size, go, checkpoint = line.split()
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        continue
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # multiprocessing waits for its workers
    if mechanism == "watch":  # the watch thread alone
        gibbs._parent_death_signal = lambda number: None
    elif mechanism == "signal":  # the parent-death signal alone (as when the watch thread cannot start)
        gibbs._start_watch = lambda parent, takes_sigterm: False
    gibbs.run_chains(Toy(int(size), go), draws=int(draws), tune=0, chains=2, seed=0, progress=False, n_jobs=2,
                     checkpoint=None if checkpoint == "-" else checkpoint, checkpoint_every=0.0)
    os._exit(0)
"""


@contextlib.contextmanager
def launcher(env):
    """The launcher process (started with ``env``), ready to take runs; killed with its group at the end."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, and anything a failed test left in its group
        proc.wait()


def stat(pid):
    """``(state, start time)`` of a process, None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], fields[19]


def wait_for(condition, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def waits_in(pid, call):
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return call in f.read()
    except OSError:
        return False


def blocked_writing(pid):
    return waits_in(pid, "pipe_write")


def blocked_reading(pid):
    return waits_in(pid, "pipe_read")


def kill_parent_and_time_workers(launcher, folder, mechanism, *, blocked, checkpoint=None, deadline=15.0):
    """Start a run (files in ``folder``), kill it with SIGKILL, return the seconds its workers took
    to exit; AssertionError if they are still alive ``deadline`` seconds later."""
    go = folder / "go"
    args = [mechanism, 50 if blocked else 10**8, 20_000 if blocked else 2, go if blocked else "-",
            checkpoint or "-"]
    launcher.stdin.write(" ".join(map(str, args)) + "\n")
    launcher.stdin.flush()
    parent = int(launcher.stdout.readline())
    workers = {}
    try:
        assert wait_for(lambda: len(children(parent)) == 2, 60), "the workers did not start"
        workers = {pid: stat(pid)[1] for pid in children(parent)}
        if blocked:  # the parent stops reading; the workers finish and block on the full pipe
            os.kill(parent, signal.SIGSTOP)
            go.touch()
            if blocked_reading(launcher.pid):  # the kernel shows where a process waits
                assert wait_for(lambda: all(blocked_writing(p) for p in workers), 60), "not blocked on the pipe"
            else:  # the kernel hides wchan: give them time to get there (50 sweeps of ~1 ms)
                time.sleep(3)
        else:  # let them sample (and write checkpoints) for a while
            time.sleep(1.0)
        assert all(stat(p) is not None and stat(p)[0] != "Z" for p in workers), "a worker ended early"
        os.kill(parent, signal.SIGKILL)
        killed = time.monotonic()

        def exited():  # gone, a zombie (its new parent has not reaped it yet) or its pid reused
            return all(stat(p) is None or stat(p)[0] == "Z" or stat(p)[1] != start for p, start in workers.items())

        assert wait_for(exited, deadline), f"workers still alive {deadline} s after their parent was killed"
        return time.monotonic() - killed
    finally:
        for pid in [parent, *workers]:  # never leave a process behind, whatever failed
            if stat(pid) is not None and stat(pid)[0] != "Z":
                os.kill(pid, signal.SIGKILL)
