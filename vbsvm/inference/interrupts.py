"""Ctrl-C stops a Gibbs run at a sweep boundary, and a second one does not lose its draws.

The first Ctrl-C stops a run (:func:`vbsvm.inference.gibbs.run_chains`), which then collects
the draws kept so far (from its worker processes, if any), and the fit is built from them. A
second Ctrl-C, pressed while that happens, would by default raise :class:`KeyboardInterrupt`
wherever the code was (collecting the chains, computing R-hat for the fit's warnings) and lose
the draws. Within a :func:`collecting` scope (:func:`vbsvm.svm` holds one around the whole fit):

* inside :func:`stop_at_boundary` (a serial run that writes checkpoints), the first Ctrl-C
  only sets the run's stop event, so that the chain stops, and saves its checkpoint, at the
  next sweep boundary, as worker processes do; a second one before that raises
  :class:`KeyboardInterrupt` at once (the draws kept so far are still returned);
* once a run was stopped, the engine calls :func:`absorb`: until the scope ends, the next
  Ctrl-C only prints :data:`NOTE` to stderr and the fit is returned; the one after aborts with
  :class:`KeyboardInterrupt` (the note says so), for a user who will not wait.

Signal handlers belong to the main thread: elsewhere (where Ctrl-C never arrives), and where
SIGINT is ignored (worker processes) or has no Python handler, these functions change nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["collecting", "stop_at_boundary", "absorb", "NOTE"]

#: written to stderr at the first Ctrl-C absorbed
NOTE = ("\nvbsvm: stopping: the draws kept so far are being collected and will be returned with the fit "
        "(press Ctrl-C once more to abort and lose them).\n")

_depth = 0  # open collecting() scopes (main thread)
_previous = None  # the SIGINT handler replaced by _handle, restored when the outermost scope ends
_stop = None  # the event the next Ctrl-C sets (stop_at_boundary), or None
_absorbing = False  # a run was stopped: Ctrl-C are absorbed, then abort
_absorbed = 0


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _take_over() -> bool:
    """Install :func:`_handle` for SIGINT (inside a scope, in the main thread, over a Python
    handler); True if it handles SIGINT now."""
    global _previous
    if not _main_thread() or _depth == 0:
        return False
    if _previous is not None:
        return True
    current = signal.getsignal(signal.SIGINT)
    if not callable(current):  # SIG_IGN, SIG_DFL, or installed outside Python
        return False
    _previous = current
    signal.signal(signal.SIGINT, _handle)
    return True


def _give_back():
    global _previous, _stop, _absorbing
    if _previous is not None:
        previous, _previous = _previous, None
        signal.signal(signal.SIGINT, previous)
    _stop, _absorbing = None, False


@contextlib.contextmanager
def collecting():
    """Scope of a run and of what is built from its draws (see the module docstring); the
    SIGINT handler is restored when the outermost scope ends."""
    global _depth
    if not _main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _give_back()


@contextlib.contextmanager
def stop_at_boundary(event):
    """Within the block, the first Ctrl-C sets ``event`` (the run stops at its next sweep
    boundary) instead of raising :class:`KeyboardInterrupt`; a second raises it."""
    global _stop
    if event is None or not _take_over():
        yield
        return
    outer, _stop = _stop, event
    try:
        yield
    finally:
        if _stop is event:
            _stop = outer


def absorb() -> None:
    """A run was stopped by Ctrl-C: absorb the next Ctrl-C until the :func:`collecting` scope
    ends, abort at the one after."""
    global _absorbing, _absorbed, _stop
    if _absorbing or not _take_over():
        return
    _absorbing, _absorbed, _stop = True, 0, None


def _handle(signum, frame):
    """SIGINT handler of a scope: stop a run, absorb, or raise (see the module docstring)."""
    global _absorbed
    if _absorbing:
        _absorbed += 1
        if _absorbed == 1:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                # os.write, not print: a handler that prints while the main thread writes to
                # stderr (a progress bar) raises "reentrant call"
                os.write(sys.stderr.fileno(), NOTE.encode())
            return
        _give_back()
        raise KeyboardInterrupt
    if _stop is not None:
        if not _stop.is_set():
            _stop.set()
            return
        raise KeyboardInterrupt
    _previous(signum, frame)  # no run to stop: as without the scope
