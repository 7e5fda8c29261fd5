"""What every vignette shares: its arguments, where it writes, how it shows a table.

A vignette is a jupytext percent script (``# %%`` code cells, ``# %% [markdown]`` prose). It runs
in two ways:

* as a script, ``python vignettes/<name>.py [--quick] [options]``: the options come from the
  command line;
* as a notebook, executed by ``vignettes/render.py``: the kernel's own command line means nothing
  to the vignette, so the options come from the environment variable ``VBSVM_VIGNETTE_ARGS``
  (e.g. ``VBSVM_VIGNETTE_ARGS="--quick"``); unset, the vignette runs with its defaults.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

ARGS_VARIABLE = "VBSVM_VIGNETTE_ARGS"
HERE = Path(__file__).resolve().parent


def in_notebook() -> bool:
    """Is the vignette executed by a Jupyter kernel (rather than run as a script)?

    Returns
    -------
    bool
    """
    return "ipykernel" in sys.modules


def parse_args(parser):
    """Parse the vignette's options from the command line or, in a notebook, ``VBSVM_VIGNETTE_ARGS``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The vignette's parser.

    Returns
    -------
    argparse.Namespace
    """
    argv = shlex.split(os.environ.get(ARGS_VARIABLE, "")) if in_notebook() else sys.argv[1:]
    return parser.parse_args(argv)


def add_common_arguments(parser, quick_help):
    """Add ``--quick`` and ``--out-dir`` (default ``vignettes/``) to a vignette's parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The vignette's parser.
    quick_help : str
        What quick mode runs (shown by ``--help``).
    """
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out-dir", type=Path, default=HERE,
                        help="where figures/ and results/ are written (default vignettes/)")


def output_dirs(out_dir):
    """Create and return ``out_dir/figures`` and ``out_dir/results``.

    Parameters
    ----------
    out_dir : pathlib.Path

    Returns
    -------
    tuple of pathlib.Path
        The figures and results directories.
    """
    figures, results = Path(out_dir) / "figures", Path(out_dir) / "results"
    figures.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    return figures, results


def show_markdown(text):
    """Show Markdown text: rendered in a notebook, printed as it is by a script.

    Parameters
    ----------
    text : str
    """
    if in_notebook():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)


def show_figure(fig, path, dpi=120):
    """Save a matplotlib figure to ``path``; in a notebook also show the saved PNG (it then
    enters the rendered document, whichever way the figure was made).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : pathlib.Path
    dpi : int
    """
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    if in_notebook():
        from IPython.display import Image, display

        display(Image(filename=str(path)))


def markdown_table(df, digits=4, index=True):
    """A pandas DataFrame as a GitHub Markdown table (no extra dependency).

    Parameters
    ----------
    df : pandas.DataFrame
    digits : int
        Significant digits of floats.
    index : bool
        Include the index as the first column.

    Returns
    -------
    str
    """
    import numpy as np

    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if not np.isfinite(v) else f"{v:.{digits}g}"
        return str(v)

    cols = ([df.index.name or ""] if index else []) + [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        cells = ([str(idx)] if index else []) + [cell(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ber(y_true, y_pred) -> float:
    """Balanced error rate: the mean of the error rates of the two classes.

    Parameters
    ----------
    y_true, y_pred : array_like
        Observed and predicted classes.

    Returns
    -------
    float
    """
    import numpy as np

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float(np.mean([np.mean(y_pred[y_true == c] != c) for c in np.unique(y_true)]))
