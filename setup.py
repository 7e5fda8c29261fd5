"""Packaging that ``pyproject.toml`` cannot express: the top-level ``data/`` tree ships in the wheel.

The data sets live once, in the repository's top-level ``data/`` directory. ``package_dir`` maps
the package ``vbsvm.datasets.data`` onto that directory, so a wheel holds the files at
``vbsvm/datasets/data/<set>/`` without a second copy in git. A ``packages.find`` table in
``pyproject.toml`` cannot add such a mapped package (it only finds directories that exist under
``vbsvm/``), hence this file; every other setting stays in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["vbsvm", "vbsvm.*"]) + ["vbsvm.datasets.data"],
    package_dir={"vbsvm.datasets.data": "data"},
    package_data={"vbsvm.datasets.data": ["*/*.csv.gz", "*/PROVENANCE.md"]},
)
