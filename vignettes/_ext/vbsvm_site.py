"""Sphinx extension of the vbsvm site: benchmark tables read from JSON, links to repository files.

``benchmark-table``
    A directive that builds a table at build time from one JSON file of ``benchmarks/results/``,
    so the performance page always shows the numbers the benchmark scripts last wrote::

        ```{benchmark-table} gibbs_defaults.json
        :rows: rows
        :filter: tune=1000, chains=4; name=toenail

        name = data set
        seconds:.1f = wall s
        pass:yes/no = converged
        ```

    ``:rows:`` is the dotted path of a list of records, or of a mapping (its keys are then the
    column ``@key``). Each line of the content is a column, ``path[:format] = header``: ``path``
    is dotted (``candidates.ep.speedup``), ``format`` a Python format spec (``.2f``) or a template
    with ``{}`` (``{:.0f}x``). ``:filter:`` keeps the records that match one of its alternatives
    (separated by ``;``), each a list of ``path=value`` that must all hold; ``:caption:`` titles
    the table; ``:script:`` names the script of ``benchmarks/`` that writes the file (by default
    the file's stem, ``gibbs_defaults.py``). A missing file, path or key is a build warning (an error under ``-W``).

Links to repository files
    The guide pages link to files outside the site's sources (``../../benchmarks/results/x.md``,
    ``../../tests/...``, ``../../README.md``) so that they read well in the repository. In the
    site, a link to a benchmark result goes to its section of the performance page (label
    ``bench-<stem>``, or the page itself), a link to the README goes to the home page, and a link
    to any other repository file becomes its plain text, since the site does not ship the file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

MISSING = object()


def _lookup(record, path):
    """The value at dotted ``path`` in nested mappings (and lists, by index), or ``MISSING``."""
    value = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _format(value, spec):
    if value is None:
        return "—"
    if spec == "yes/no":
        return "yes" if value else "no"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(_format(v, spec) for v in value)
    if not spec:
        return str(value)
    if "{" in spec:
        return spec.format(value)
    return format(value, spec)


def _selected(record, text):
    """Whether ``record`` matches one alternative of ``text``: ``path=value, path=value; ...``."""
    for line in text.split(";"):
        conditions = [c.partition("=") for c in line.split(",") if c.strip()]
        if all(str(_lookup(record, k.strip())) == v.strip() for k, _, v in conditions):
            return True
    return False


def _parse_columns(text):
    columns = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        path, sep, header = line.partition("=")
        if not sep:
            raise ValueError(f"column line {line.strip()!r} is not 'path[:format] = header'")
        path, _, spec = path.strip().partition(":")
        columns.append((path.strip(), spec.strip(), header.strip()))
    return columns


class BenchmarkTable(SphinxDirective):
    """A table of one benchmark's results, built from its JSON file at build time."""

    required_arguments = 1
    has_content = True
    option_spec = {
        "rows": directives.unchanged_required,
        "filter": directives.unchanged,
        "caption": directives.unchanged,
        "script": directives.unchanged,
    }

    def run(self):
        results = Path(self.config.vbsvm_benchmark_results)
        path = results / self.arguments[0]
        self.env.note_dependency(str(path))
        try:
            data = json.loads(path.read_text())
            columns = _parse_columns("\n".join(self.content))
        except (OSError, ValueError, KeyError) as exc:
            return self._problem(f"benchmark-table {self.arguments[0]}: {exc}")
        records = _lookup(data, self.options["rows"])
        if records is MISSING:
            return self._problem(f"benchmark-table {self.arguments[0]}: no {self.options['rows']!r}")
        if isinstance(records, dict):
            records = [{"@key": key, **value} for key, value in records.items()]
        if "filter" in self.options:
            records = [r for r in records if _selected(r, self.options["filter"])]
        rows = []
        for record in records:
            cells = []
            for col, spec, header in columns:
                value = _lookup(record, col)
                if value is MISSING:
                    return self._problem(f"benchmark-table {self.arguments[0]}: a record has no {col!r} "
                                         f"(column {header!r})")
                try:
                    cells.append(_format(value, spec))
                except (TypeError, ValueError) as exc:
                    return self._problem(f"benchmark-table {self.arguments[0]}, column {header!r}: {exc}")
            rows.append(cells)
        if not rows:
            return self._problem(f"benchmark-table {self.arguments[0]}: no records")
        table = self._table([h for _, _, h in columns], rows)
        source = nodes.paragraph(classes=["benchmark-source"])
        source += nodes.emphasis(text="Generated at build time from ")
        source += nodes.literal(text=f"benchmarks/results/{self.arguments[0]}")
        source += nodes.emphasis(text=f", written by benchmarks/{self._script()}.")
        return [table, source]

    def _script(self):
        script = self.options.get("script") or f"{self.arguments[0].split('.')[0]}.py"
        if not (Path(self.config.vbsvm_benchmark_results).parent / script).is_file():
            logger.warning(f"benchmark-table {self.arguments[0]}: no script benchmarks/{script} "
                           "(name it with :script:)", location=self.get_location())
        return script

    def _problem(self, message):
        logger.warning(message, location=self.get_location())
        return []

    def _table(self, headers, rows):
        table = nodes.table(classes=["benchmark-table"])
        if "caption" in self.options:
            title = nodes.title(text=self.options["caption"])
            table += title
        group = nodes.tgroup(cols=len(headers))
        table += group
        for _ in headers:
            group += nodes.colspec(colwidth=1)
        head = nodes.thead()
        group += head
        head += self._row(headers)
        body = nodes.tbody()
        group += body
        for cells in rows:
            body += self._row(cells)
        return table

    @staticmethod
    def _row(cells):
        row = nodes.row()
        for text in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            row += entry
        return row


LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^()\s]+)\)")
LABEL = re.compile(r"^\((bench-[\w.-]+)\)=\s*$", re.MULTILINE)


def _repository_links(app, docname, source):
    """Rewrite Markdown links to repository files outside the site (see the module docstring)."""
    doc = Path(app.env.doc2path(docname))
    if doc.suffix != ".md":
        return
    srcdir = Path(app.srcdir).resolve()
    root = Path(app.config.vbsvm_repository_root).resolve()
    performance = srcdir / "performance.md"
    labels = set(LABEL.findall(performance.read_text())) if performance.exists() else set()

    def relative(target):
        return Path(os.path.relpath(target, doc.parent)).as_posix()

    def rewrite(match):
        text, href = match.group(1), match.group(2)
        if "://" in href or href.startswith(("#", "mailto:")):
            return match.group(0)
        path, _, anchor = href.partition("#")
        target = (doc.parent / path).resolve()
        if target.is_relative_to(srcdir) or not target.is_relative_to(root):
            return match.group(0)
        rel = target.relative_to(root).as_posix()
        if rel.startswith("benchmarks/results/"):
            label = f"bench-{target.name.split('.')[0]}"
            return f"[{text}]({relative(performance)}{'#' + label if label in labels else ''})"
        if rel == "README.md":
            return f"[{text}]({relative(srcdir / 'index.md')})"
        return text

    source[0] = LINK.sub(rewrite, source[0])


def setup(app):
    app.add_config_value("vbsvm_benchmark_results", "", "env")
    app.add_config_value("vbsvm_repository_root", "", "env")
    app.add_directive("benchmark-table", BenchmarkTable)
    app.connect("source-read", _repository_links)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
