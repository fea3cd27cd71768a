"""Accessibility: axe-core, in headless Chromium, over every page of both editions of the built book.

axe-core (npm, pinned in ``tests/npm_packages.py``) runs its default rules (WCAG 2.x A and AA
and best practices) inside each page once MathJax has typeset it. Each violation is the
course's own or the theme's:

- the course's own: anything inside the page's article (``article.bd-article``: the text,
  figures, tables, code cells and toggles made from the course's pages and notebooks), the
  link to the other edition, and the document's language (``<html lang>``, from the
  edition's Sphinx language). Target: no serious or critical violation; this test keeps it.
- the theme's (pydata-sphinx-theme 0.17 and sphinx-book-theme 1.3, outside the article):
  listed in ``_build/accessibility.tsv``, not failed on. Seen on every page: the search
  buttons and the colour-mode switch are named by ``aria-label`` ("Search", "Color mode")
  while they show other text (label-content-name-mismatch, serious), and the sidebar's
  logo block is outside any landmark (region, moderate). They are the theme's templates,
  fixed there or not at all.
"""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from test_book import EDITIONS, book, edition_root, page_visits, parsed_page, site_pages  # noqa: F401

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "_build" / "accessibility.tsv"
FAILING = ("serious", "critical")


@pytest.fixture(scope="module")
def violations(page_visits) -> list[dict]:
    """axe-core's violations over every page (run during ``test_book.page_visits``), each with
    its page and whether it is the course's own; counted by owner, impact and rule in REPORT."""
    found = [{"page": page, **v} for page, seen in page_visits["pages"].items() for v in seen["violations"]]
    counts = collections.Counter((v["own"], v["impact"], v["rule"]) for v in found)
    lines = ["owner\timpact\trule\tnodes"] + [f"{'course' if own else 'theme'}\t{impact}\t{rule}\t{n}"
                                             for (own, impact, rule), n in sorted(counts.items())]
    REPORT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return found


def test_axe_ran_on_every_page_of_both_editions(book, page_visits):
    pages = list(page_visits["pages"])
    assert pages == site_pages(), "pages of the book axe-core did not visit"
    for language in EDITIONS:
        prefix = "" if language == "en" else f"{language}/"
        assert f"{prefix}intro.html" in pages and f"{prefix}start_here.html" in pages, f"{language}: pages missing"
    chapters = [p for p in pages if "/chapters/" in f"/{p}"]
    assert chapters and len(chapters) % len(EDITIONS) == 0, chapters


def test_no_serious_or_critical_violation_of_the_courses_own(violations):
    own = [v for v in violations if v["own"] and v["impact"] in FAILING]
    assert not own, f"{len(own)} serious or critical violations in the course's own content:\n" + "\n".join(
        f"{v['page']}: {v['impact']} {v['rule']} ({v['help']}): {v['target']}: {v['html']}" for v in own[:30])


def test_every_figure_has_alt_text_in_its_editions_language(book):
    """The figures' alt text names what they show (titles, axes), in the page's language."""
    import re
    for language in EDITIONS:
        root = edition_root(language)
        figures = 0
        for page in sorted((root / "chapters").glob("*.html")):
            for img in parsed_page(page).select("article img"):
                alt = img.get("alt", "")
                assert alt and "_images" not in alt and not alt.endswith(".png"), f"{page.name}: alt={alt!r}"
                if language != "en":
                    assert re.search(r"[\u4e00-\u9fff]", alt), f"{language}/{page.name}: alt text not translated: {alt!r}"
                figures += 1
        assert figures >= len(list((root / "chapters").glob("*.html"))), f"{language}: {figures} figures"


def test_chinese_pages_declare_zh_cn(book):
    for page in sorted(edition_root("zh_CN").rglob("*.html")):
        if "_static" in page.parts:
            continue
        html = parsed_page(page).html
        if html is None:  # index.html: Jupyter Book's one-line redirect to intro.html
            continue
        assert html.get("lang") == "zh-CN", f"{page.relative_to(edition_root('en'))}: <html lang={html.get('lang')!r}>"
