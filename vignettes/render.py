"""Render the vignettes: execute each one as a notebook and write it as Markdown with its figures.

Each vignette ``vignettes/<name>.py`` is a jupytext percent script. Rendering converts it to a
notebook (jupytext), executes it in a fresh Python kernel (nbclient) and exports the executed
notebook to Markdown (nbconvert): ``vignettes/rendered/<name>.md`` with the figures of its cells
in ``vignettes/rendered/<name>_files/``. The files the vignette itself writes (its ``figures/``
and ``results/``) go to a temporary directory, so rendering never overwrites them.

Usage, from the repository root (needs ``pip install ".[docs]"``)::

    python vignettes/render.py                  # every vignette, committed settings
    python vignettes/render.py toenail spam_selection
    python vignettes/render.py --quick          # quick mode, into vignettes/rendered_quick/

The options a vignette receives are passed by the environment variable ``VBSVM_VIGNETTE_ARGS``
(see ``vignettes/_vignette.py``). Where the full run of a vignette takes more than a few minutes,
the committed render uses the intermediate options in ``RENDER_ARGS``, and the rendered document
says so at its top.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# In reading order: the getting-started vignette first.
VIGNETTES = ("getting_started", "toenail", "spam_selection", "acath_missing", "gp_raetsch", "gp_autotune")

# Options of the committed renders where the full run (each vignette's defaults) takes more than
# about 5 minutes on a shared 2-core machine, and what the full run would be.
RENDER_ARGS = {
    "toenail": ("--splits 20", "the paper's 100 splits"),
    "spam_selection": ("--draws 1500 --tune 1000", "Gibbs 4 chains x (5000 + 5000)"),
    "acath_missing": ("--splits 10 --gibbs-draws 300 --gibbs-tune 200",
                      "the paper's 100 splits with Gibbs 1 chain x (2000 + 2000)"),
    "gp_raetsch": ("--sets breast_cancer,diabetis,flare_solar,german,heart",
                   "all 7 data sets of Table 1, with splice and waveform"),
    "gp_autotune": ("--grid 8", "a grid of 16 lengthscales"),
}

MISSING_TOOLS = ('rendering the vignettes needs jupytext, nbclient, nbconvert and ipykernel; install them '
                 'with  pip install ".[docs]"  (from the repository root)')


def _tools():
    """Import the rendering tools, or exit with the command that installs them."""
    try:
        import ipykernel  # noqa: F401  (the kernel nbclient starts)
        import jupytext
        from nbclient import NotebookClient
        from nbconvert import MarkdownExporter
    except ImportError as exc:
        raise SystemExit(f"render.py: {MISSING_TOOLS} ({exc})") from None
    return jupytext, NotebookClient, MarkdownExporter


def render(name, out, quick=False, timeout=3600):
    """Execute vignette ``name`` and write ``out/<name>.md`` and its figures ``out/<name>_files/``.

    Parameters
    ----------
    name : str
        A vignette, e.g. ``"toenail"`` (the script ``vignettes/toenail.py``).
    out : pathlib.Path
        Output directory.
    quick : bool
        Run the vignette in its quick mode (``--quick``) instead of the committed settings.
    timeout : int
        Seconds allowed per cell.

    Returns
    -------
    float
        Seconds taken.
    """
    jupytext, NotebookClient, MarkdownExporter = _tools()
    options, full = ("--quick", "the defaults") if quick else RENDER_ARGS.get(name, ("", ""))
    nb = jupytext.read(HERE / f"{name}.py")
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["VBSVM_VIGNETTE_ARGS"] = f"{options} --out-dir {shlex.quote(scratch)}".strip()
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(HERE)}})
        client.execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:  # progress bars and warnings go to stderr; the document keeps stdout
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]

    files = f"{name}_files"
    body, resources = MarkdownExporter().from_notebook_node(
        nb, resources={"output_files_dir": files, "unique_key": name})
    shutil.rmtree(out / files, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in resources.get("outputs", {}).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    header = (f"*Rendered from [`vignettes/{name}.py`](../{name}.py) by `python vignettes/render.py"
              f"{' --quick' if quick else ''} {name}` on {stamp} in {seconds:.0f} s (a 2-core machine shared with "
              "other jobs). Every number below comes from that run.*\n\n")
    if options:
        header += (f"> **Settings of this render:** `{options}`, not the full run ({full}): run "
                   f"`python vignettes/{name}.py` for that.\n\n")
    (out / f"{name}.md").write_text(header + body.lstrip())
    return seconds


def main(argv=None):
    """Command line: ``python vignettes/render.py [--quick] [--out DIR] [names...]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="name",
                    help=f"vignettes to render (default all: {', '.join(VIGNETTES)})")
    ap.add_argument("--quick", action="store_true", help="quick mode of each vignette")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default vignettes/rendered, or vignettes/rendered_quick with --quick)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(VIGNETTES))
    if unknown:
        ap.error(f"unknown vignette(s) {', '.join(unknown)}; choose from {', '.join(VIGNETTES)}")
    _tools()
    out = args.out or HERE / ("rendered_quick" if args.quick else "rendered")
    for name in args.names or VIGNETTES:
        print(f"rendering {name} ...", file=sys.stderr, flush=True)
        seconds = render(name, out, quick=args.quick)
        print(f"  wrote {out / (name + '.md')} in {seconds:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
