"""Progress bars of the engines: one bar per fit, with the time left, only on a terminal or in a notebook.

Every engine that can run for more than a couple of seconds (Gibbs over all its chains, SVI, the
completions of an imputation fit) shows its work through :func:`progress_bar`; it draws nothing
when ``progress=False``, when standard error is not a terminal (a log file, a CI job) and in a
forked worker process (whose parent owns the terminal).
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def _terminal() -> bool:
    """Whether a bar would be seen: standard error is a terminal, or this is a notebook kernel."""
    if "ipykernel" in sys.modules:
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(total, description, enabled=True):
    """A tqdm bar of ``total`` steps labelled ``description`` (it shows the rate and the time left),
    or None when ``enabled`` is False or nobody would see it. Callers update it and close it."""
    if not enabled or not _terminal():
        return None
    return tqdm(total=total, desc=description, leave=False, mininterval=0.5)
