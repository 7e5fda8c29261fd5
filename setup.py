"""Packaging that ``pyproject.toml`` cannot express: the top-level ``data/`` tree ships in the wheel.

The data sets live once, in the repository's top-level ``data/`` directory, one folder per set.
``package_dir`` maps the package ``vbsvm.datasets.data`` onto that directory, so a wheel holds
the files at ``vbsvm/datasets/data/<set>/`` without a second copy in git; each ``<set>`` folder is
listed as a (namespace) package of its own, as setuptools wants for data in subdirectories. A
``packages.find`` table in ``pyproject.toml`` cannot add such mapped packages (it only finds
directories that exist under ``vbsvm/``), hence this file; every other setting stays in
``pyproject.toml``.
"""

from setuptools import find_namespace_packages, find_packages, setup

DATA = "vbsvm.datasets.data"
data_packages = [DATA] + [f"{DATA}.{folder}" for folder in find_namespace_packages(where="data")]

setup(
    packages=find_packages(include=["vbsvm", "vbsvm.*"]) + data_packages,
    package_dir={DATA: "data"},
    package_data={package: ["*.csv.gz", "PROVENANCE.md"] for package in data_packages},
)
