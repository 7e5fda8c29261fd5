"""The API reference of the documentation site (``vignettes/api.rst``) lists every public name.

A cheap check of the reference's source, without building the site (``.ci/run`` builds it): every
name of ``vbsvm.__all__``, of ``vbsvm.datasets.__all__`` and every error and warning class of
``vbsvm.exceptions`` appears in an ``autosummary`` table, an ``automodule`` or a ``py:data``
entry, either under its public name (``vbsvm.svm``) or under the module that defines it
(``vbsvm.results.gp.GPFit``).
"""

import inspect
import re
from pathlib import Path

import pytest

import vbsvm
import vbsvm.datasets
import vbsvm.exceptions

API = Path(__file__).resolve().parents[1] / "vignettes" / "api.rst"
DIRECTIVE = re.compile(r"^\.\. (currentmodule|automodule|py:data|autosummary)::\s*(\S*)")


def documented_names(text: str) -> set[str]:
    """Fully qualified names the reST source ``text`` documents."""
    names, current, in_summary = set(), "", False
    for line in text.splitlines():
        match = DIRECTIVE.match(line)
        if match:
            kind, target = match.groups()
            in_summary = kind == "autosummary"
            if kind == "currentmodule":
                current = target
            elif kind in ("automodule", "py:data"):
                names.add(target)
            continue
        if in_summary:
            entry = line.strip()
            if line and not line.startswith(" "):
                in_summary = False
            elif entry and not entry.startswith(":"):
                entry = entry.lstrip("~")
                names.add(entry if entry.startswith("vbsvm.") else f"{current}.{entry}")
    return names


DOCUMENTED = documented_names(API.read_text())


def _accepted(public: str, obj) -> set[str]:
    names = {public}
    if inspect.ismodule(obj):
        names.add(obj.__name__)
    elif hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
        names.add(f"{obj.__module__}.{obj.__qualname__}")
    return names


def test_the_parser_reads_the_reference():
    assert {"vbsvm.svm", "vbsvm.datasets", "vbsvm.__version__", "vbsvm.results.fit.Fit"} <= DOCUMENTED


@pytest.mark.parametrize("name", vbsvm.__all__)
def test_top_level_name_is_in_the_api_reference(name):
    accepted = _accepted(f"vbsvm.{name}", getattr(vbsvm, name))
    assert accepted & DOCUMENTED, f"vbsvm.{name} is public but not in vignettes/api.rst"


@pytest.mark.parametrize("name", vbsvm.datasets.__all__)
def test_datasets_name_is_in_the_api_reference(name):
    accepted = _accepted(f"vbsvm.datasets.{name}", getattr(vbsvm.datasets, name))
    assert accepted & DOCUMENTED, f"vbsvm.datasets.{name} is public but not in vignettes/api.rst"


@pytest.mark.parametrize("name", sorted(n for n, obj in vars(vbsvm.exceptions).items()
                                        if inspect.isclass(obj) and obj.__module__ == "vbsvm.exceptions"))
def test_exception_is_in_the_api_reference(name):
    assert f"vbsvm.exceptions.{name}" in DOCUMENTED, f"vbsvm.exceptions.{name} is not in vignettes/api.rst"
