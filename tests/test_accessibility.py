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
import concurrent.futures
import contextlib
import os
import queue
import time
from pathlib import Path

import pytest

from npm_packages import npm_package
from test_book import EDITIONS, DevTools, book, chromium, edition_root, parsed_page, server  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "_build" / "accessibility.tsv"
FAILING = ("serious", "critical")
AXE_SECONDS = 600
OWN = "article.bd-article, .course-edition-link"   # the course's own content on a page

AXE_RUN = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  await new Promise(r => setTimeout(r, 400));     // the theme's tab stops on scrollable blocks (debounced 300 ms)
  const own = el => !!el && (el === document.documentElement || !!el.closest(OWN));
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.flatMap(v => v.nodes.map(n => ({
    rule: v.id, impact: n.impact || v.impact, help: v.help,
    target: n.target.join(" "), html: n.html.slice(0, 160),
    own: own(document.querySelector(n.target[n.target.length - 1])),
  })));
})()
"""


@pytest.fixture(scope="module")
def axe_source() -> str:
    return (npm_package("axe-core") / "axe.min.js").read_text()


def _pages() -> list[str]:
    """Every page of both editions (as URL paths), whatever the chapters are."""
    from coursegen.linkcheck import pages
    html = edition_root("en")
    return [p.relative_to(html).as_posix() for p in pages(html)
            if 'http-equiv="Refresh"' not in p.read_text(encoding="utf-8")[:200]]  # index.html: a redirect


def _axe_on(browser, server: str, page: str, axe_source: str) -> list[dict]:
    """axe-core's violations on one page, each with its page and whether it is the course's own."""
    browser.open(f"{server}/{page}")
    browser.ws.settimeout(AXE_SECONDS)  # a long chapter takes axe-core a minute on a busy machine
    try:
        browser.call("Runtime.evaluate", expression=axe_source + ";0")
        result = browser.call("Runtime.evaluate", expression=AXE_RUN.replace("OWN", repr(OWN)),
                              awaitPromise=True, returnByValue=True)
    finally:
        browser.ws.settimeout(60)
    assert "exceptionDetails" not in result, f"{page}: axe-core failed: {result['exceptionDetails']}"
    return [{"page": page, **v} for v in result["result"]["value"]]


@pytest.fixture(scope="module")
def violations(book, server, chromium, tmp_path_factory, axe_source) -> list[dict]:
    """axe-core over every page, one headless Chromium per core (axe runs on one thread of a page)."""
    pages, started = _pages(), time.perf_counter()
    work, found, seconds = queue.SimpleQueue(), {}, {}
    for page in pages:
        work.put(page)

    def worker(profile: Path) -> None:
        browser = DevTools(chromium, profile)
        try:
            while True:
                try:
                    page = work.get_nowait()
                except queue.Empty:
                    return
                begun = time.perf_counter()
                found[page] = _axe_on(browser, server, page, axe_source)
                seconds[page] = time.perf_counter() - begun
        except BaseException:
            with contextlib.suppress(queue.Empty):  # the other browsers stop after their current page
                while True:
                    work.get_nowait()
            raise
        finally:
            browser.close()

    browsers = min(os.cpu_count() or 1, 4)  # each Chromium holds a few hundred MB
    profiles = [tmp_path_factory.mktemp("chromium") / "profile" for _ in range(browsers)]
    with concurrent.futures.ThreadPoolExecutor(browsers) as pool:
        list(pool.map(worker, profiles))  # raises the first worker's error
    slowest = max(seconds, key=seconds.get)
    print(f"axe-core over {len(pages)} pages in {time.perf_counter() - started:.1f} s with {browsers} "
          f"browsers (slowest: {slowest}, {seconds[slowest]:.1f} s)")
    found = [v for page in pages for v in found[page]]
    counts = collections.Counter((v["own"], v["impact"], v["rule"]) for v in found)
    lines = ["owner\timpact\trule\tnodes"] + [f"{'course' if own else 'theme'}\t{impact}\t{rule}\t{n}"
                                             for (own, impact, rule), n in sorted(counts.items())]
    REPORT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return found


def test_axe_ran_on_every_page_of_both_editions(book, violations):
    pages = _pages()
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
