"""``python -m coursegen.linkcheck``: every link inside the built book resolves; external links listed.

Offline: a link to the book's own files (relative hrefs and sources, the language switch, the
download buttons, ``#fragment`` anchors) must name a file of ``_build/html`` and, with a
fragment, an element id of that page. Links that leave the book are not fetched; they are
written to ``_build/external-links.tsv`` (each URL with the pages that link to it) for a
person to look over.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup

from coursekit.conventions import ROOT

HTML = ROOT / "_build" / "html"
REPORT = ROOT / "_build" / "external-links.tsv"
# (tag, attribute) pairs that point somewhere
LINKING = (("a", "href"), ("link", "href"), ("img", "src"), ("script", "src"), ("iframe", "src"),
           ("source", "src"), ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data"))
NOT_PAGES = ("_static", "_sources", "_images")  # folders of assets, not pages to read links from


@dataclass
class LinkReport:
    pages: int = 0
    internal: int = 0                               # links into the book, each checked
    anchors: int = 0                                # of them, with a #fragment checked against ids
    broken: list[str] = field(default_factory=list)  # "page: <tag attr=href>: why"
    external: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # url -> pages


def pages(html: Path = HTML) -> list[Path]:
    return sorted(p for p in html.rglob("*.html") if not set(p.relative_to(html).parts) & set(NOT_PAGES))


def _ids_of(soup: BeautifulSoup) -> set[str]:
    return {el["id"] for el in soup.find_all(id=True)} | {el["name"] for el in soup.find_all("a", attrs={"name": True})}


def _ids(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path not in cache:
        cache[path] = _ids_of(BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser"))
    return cache[path]


def check(html: Path = HTML) -> LinkReport:
    report, ids = LinkReport(), {}
    root = html.resolve()
    for page in pages(html):
        report.pages += 1
        name = page.relative_to(html).as_posix()
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        ids[page.resolve()] = _ids_of(soup)
        for tag, attr in LINKING:
            for el in soup.find_all(tag, attrs={attr: True}):
                url = el[attr].strip()
                parts = urlsplit(url)
                if parts.scheme in ("javascript", "data", "blob", "about"):
                    continue
                if parts.scheme or parts.netloc:
                    report.external[url].add(name)
                    continue
                report.internal += 1
                where = f"{name}: <{tag} {attr}={url}>"
                target = (page.parent / unquote(parts.path)).resolve() if parts.path else page.resolve()
                if target.is_dir():
                    target = target / "index.html"
                if not target.is_relative_to(root):
                    report.broken.append(f"{where}: points outside the book")
                    continue
                if not target.is_file():
                    report.broken.append(f"{where}: no file {target.relative_to(root)}")
                    continue
                fragment = unquote(parts.fragment)
                if fragment and target.suffix == ".html":
                    report.anchors += 1
                    if fragment not in _ids(target, ids):
                        report.broken.append(f"{where}: no id {fragment!r} in {target.relative_to(root)}")
    return report


def write_external(report: LinkReport, path: Path = REPORT) -> Path:
    lines = ["url\tpages"] + [f"{url}\t{' '.join(sorted(where))}" for url, where in sorted(report.external.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    report = check()
    written = write_external(report)
    print(f"{report.pages} pages, {report.internal} internal links ({report.anchors} with an anchor), "
          f"{len(report.broken)} broken; {len(report.external)} external URLs listed in "
          f"{written.relative_to(ROOT)} (not fetched)")
    for line in report.broken:
        print(f"broken: {line}", file=sys.stderr)
    return 1 if report.broken else 0


if __name__ == "__main__":
    sys.exit(main())
