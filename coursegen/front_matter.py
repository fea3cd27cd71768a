"""The book's pages outside the chapters: the front page, Start here, the glossary, the instructor page.

The instructor page includes the README's section for instructors, so that section is
translated with them; the rest of the README is not published.
"""
from __future__ import annotations

import csv
from pathlib import Path

from coursekit.conventions import LOCALES_DIR, ROOT

from .translatable import is_prose, markdown_blocks, translate_markdown

PAGES = ("intro.md", "start_here.md", "glossary.md", "instructors.md")
README = "README.md"
README_SECTION = ("<!-- instructors-page-start -->", "<!-- instructors-page-end -->")
GLOSSARY = LOCALES_DIR / "glossary.csv"


def _published(name: str) -> str:
    text = (ROOT / name).read_text()
    if name == README:
        start, end = README_SECTION
        text = text.split(start, 1)[1].split(end, 1)[0]
    return text


def front_matter_units() -> list[tuple[str, str]]:
    """(block, "file:line") of every prose block the front matter publishes."""
    found = []
    for name in (*PAGES, README):
        whole = (ROOT / name).read_text()
        for block in markdown_blocks(_published(name)):
            if is_prose(block):
                found.append((block, f"{name}:{whole[:whole.find(block)].count(chr(10)) + 1}"))
    return found


def translated_page(name: str, lookup) -> str:
    """The page NAME with every published prose block looked up (None keeps the English)."""
    text = (ROOT / name).read_text()
    if name != README:
        return translate_markdown(text, lookup) + "\n"
    start, end = README_SECTION
    head, rest = text.split(start, 1)
    section, tail = rest.split(end, 1)
    return head + start + "\n" + translate_markdown(section, lookup) + "\n" + end + tail


def glossary() -> dict[str, tuple[str, list[str]]]:
    """English term -> (the course's Chinese term, variants it does not use)."""
    with GLOSSARY.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    return {en: (zh, [v.strip() for v in avoid.split(";") if v.strip()]) for en, zh, avoid in rows}
