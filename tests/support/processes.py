"""Process helpers of the tests that run children: a script in its own process group, the
children of a process, and a FIFO that tells whether any process opened it."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time


def children(pid):
    """The ids of the child processes of ``pid`` (from ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


@contextlib.contextmanager
def session(script, *args, env):
    """Run ``python -c script args`` in a new session (its own process group) with text pipes for
    stdout and stderr; yields the ``Popen``, and kills the group at the end if the script is still
    running."""
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def watched_fifo(path):
    """Create the FIFO ``path``; yields ``opened()``, true once any process has opened it for
    reading (a reader makes a non-blocking open for writing succeed)."""
    os.mkfifo(path)
    seen, stop = threading.Event(), threading.Event()

    def watch():
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: nobody reads it
                time.sleep(0.002)
                continue
            seen.set()
            os.close(fd)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen.is_set
    finally:
        stop.set()
        thread.join()
