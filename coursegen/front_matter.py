"""The book's pages outside the chapters: the front page, Start here, the glossary, the instructor page.

The instructor page includes the README's section for instructors, so that section is
translated with them; the rest of the README is not published.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from coursekit.conventions import LOCALES_DIR, ROOT

from .translatable import is_prose, markdown_blocks, translate_markdown

PAGES = ("intro.md", "start_here.md", "glossary.md", "instructors.md")
README = "README.md"
README_SECTION = ("<!-- instructors-page-start -->", "<!-- instructors-page-end -->")
GLOSSARY = LOCALES_DIR / "glossary.csv"
# The course's everyday terms: glossed once in the book, in the first chapter that uses them
# (a reader of Chapter 3 knows 注意力 and 练习); every other term once per chapter.
GLOSSED_ONCE_IN_THE_BOOK = ("attention", "exercise", "gradient")


def _published(name: str) -> str:
    text = (ROOT / name).read_text()
    if name == README:
        start, end = README_SECTION
        text = text.split(start, 1)[1].split(end, 1)[0]
    return text


def front_matter_units() -> list[tuple[str, str]]:
    """(block, "file:line") of every prose block the front matter publishes, and the glossary's column headers."""
    found = []
    for name in (*PAGES, README):
        whole = (ROOT / name).read_text()
        for block in markdown_blocks(_published(name)):
            if is_prose(block):
                found.append((block, f"{name}:{whole[:whole.find(block)].count(chr(10)) + 1}"))
    found += [(header, f"{GLOSSARY.relative_to(ROOT)}:1") for header in _glossary_rows()[0]]
    config = (ROOT / "_config.yml").read_text()
    author = re.search(r"^author: *(.+)$", config, re.M)
    found.append((author.group(1).strip(), f"_config.yml:{config[:author.start()].count(chr(10)) + 1}"))  # every page's footer
    return found


def _glossary_rows() -> list[list[str]]:
    with GLOSSARY.open(newline="") as f:
        return list(csv.reader(f))


def _translated_glossary_table(text: str, lookup) -> str:
    """The glossary page's table with its column headers translated: the rows written into the page
    (csv-table takes its header from the file's first row or from ``:header:``, not both)."""
    header, *rows = _glossary_rows()
    cells = io.StringIO()  # the translated header is the first row (MyST's options cannot hold a quoted list)
    csv.writer(cells, lineterminator="\n").writerows([[lookup(h) or h for h in header], *rows])
    source = f":file: {GLOSSARY.relative_to(ROOT).as_posix()}\n:header-rows: 1\n"
    assert source in text, "glossary.md no longer reads the glossary as the translation expects"
    return re.sub(r"(:widths:[^\n]*\n)", lambda m: m.group(1) + "\n" + cells.getvalue(),
                  text.replace(source, ":header-rows: 1\n"), count=1)


def translated_page(name: str, lookup) -> str:
    """The page NAME with every published prose block looked up (None keeps the English)."""
    text = (ROOT / name).read_text()
    if name == "glossary.md":
        text = _translated_glossary_table(text, lookup)
    if name != README:
        return translate_markdown(text, lookup) + "\n"
    start, end = README_SECTION
    head, rest = text.split(start, 1)
    section, tail = rest.split(end, 1)
    return head + start + "\n" + translate_markdown(section, lookup) + "\n" + end + tail


def glossary() -> dict[str, tuple[str, list[str]]]:
    """English term -> (the course's Chinese term, variants it does not use)."""
    rows = _glossary_rows()[1:]
    return {en: (zh, [v.strip() for v in avoid.split(";") if v.strip()]) for en, zh, avoid in rows}
