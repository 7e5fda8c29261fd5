"""Sphinx configuration of the vbsvm documentation site.

The site is built from the files that already document the package, the way pkgdown builds an R
package's site from its vignettes and help pages: the user guide (``guide/*.md``), the rendered
vignettes (``rendered/*.md``, with their committed outputs), a few site pages beside this file,
and the docstrings of :mod:`vbsvm`. The sources live under ``vignettes/`` because the repository
keeps a fixed top level (``pyproject.toml``, ``README.md``, ``vbsvm/``, ``tests/``, ``vignettes/``,
``data/``, ``benchmarks/``, ``.ci/run``).

Build, from the repository root (``pip install ".[docs]"`` first)::

    python -m sphinx -W --keep-going -b dirhtml vignettes build/site
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

import vbsvm  # noqa: E402

project = "vbsvm"
author = "the vbsvm authors"
copyright = "the vbsvm authors; GPL-2.0-or-later"
release = vbsvm.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    "vbsvm_site",  # _ext/vbsvm_site.py: benchmark tables from JSON, links to files outside the site
]

root_doc = "index"
templates_path = ["_templates"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = [
    "_build",
    "_ext",
    "_templates",
    "**/__pycache__",
    "guide/index.md",        # the guide's own table of contents for readers of the repository
    "results",               # tables written by the vignettes (shown inside the rendered vignettes)
    "figures/*.md",
    "rendered_quick",        # quick renders (git-ignored)
    "README.md",
]

# --- MyST and myst-nb ------------------------------------------------------------------------
# The vignettes are jupytext scripts that take minutes to hours to run; the site shows their
# committed renders (rendered/*.md, made by `python vignettes/render.py`) and never executes them.
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3          # guide pages link to each other's sections by GitHub slugs

# --- autodoc, autosummary, numpydoc ----------------------------------------------------------
autosummary_generate = True       # stub pages go to api/generated/ (git-ignored)
autosummary_imported_members = False
autodoc_typehints = "none"        # the numpydoc Parameters sections carry the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_attributes_as_param_list = False

# --- HTML --------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"vbsvm {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {page: [] for page in ("index", "get_started", "performance", "changelog", "about")}
html_show_sourcelink = False
html_copy_source = False

# Benchmark results read by the `benchmark-table` directive (_ext/vbsvm_site.py).
vbsvm_benchmark_results = str(ROOT / "benchmarks" / "results")
vbsvm_repository_root = str(ROOT)
