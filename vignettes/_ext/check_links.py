"""Check the internal links of the built site: every relative link reaches a page and its anchor.

Sphinx's ``linkcheck`` builder checks external links only. A ``-W`` build already fails on a MyST
link to a missing page or section; this check covers what Sphinx does not see (raw HTML in the
rendered vignettes, anchors written by hand) by reading the HTML of a ``dirhtml`` build::

    python vignettes/_ext/check_links.py build/site

It prints each broken link (page, target) and exits with status 1 if there is one.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) and (tag != "link" or key == "href"):
                self.links.append(attrs[key])


def _resolve(page: Path, href: str, root: Path) -> tuple[Path | None, str]:
    parts = urlsplit(href)
    target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root):
        return None, parts.fragment
    return target, unquote(parts.fragment)


def check(root: Path) -> list[tuple[str, str]]:
    """The broken internal links ``(page, href)`` of the HTML pages under ``root`` (theme
    templates under ``_static/`` left out)."""
    root = root.resolve()
    pages = {p: _Page() for p in root.rglob("*.html") if "_static" not in p.relative_to(root).parts}
    for path, parser in pages.items():
        parser.feed(path.read_text(encoding="utf-8"))
    broken = []
    for path, parser in pages.items():
        for href in parser.links:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:", "data:")):
                continue
            target, fragment = _resolve(path, href, root)
            if target is None or not target.exists():
                broken.append((str(path.relative_to(root)), href))
            elif fragment and target in pages and fragment not in pages[target].ids:
                broken.append((str(path.relative_to(root)), href))
    return broken


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    broken = check(root)
    for page, href in broken:
        print(f"{page}: broken internal link {href}")
    print(f"internal links: {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
