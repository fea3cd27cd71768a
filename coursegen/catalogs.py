"""The translation catalogs: gettext ``.po`` files in sphinx-intl's layout, read and written by Babel.

``locales/<lang>/LC_MESSAGES/`` holds

* ``chapters/NN_name.po``: one per chapter (its markdown, figure text, printed text,
  visible tests' messages, stubs' docstrings and comments; see ``translatable``);
* ``front_matter.po``: the front page, the glossary and the instructor page;
* ``feedback.po``: the grader's feedback messages (extracted by ``feedback_texts``, told by
  ``autograder.messages``).

``python -m coursegen.catalogs update`` merges new English text into the catalogs the way
``msgmerge`` does (new entries empty, changed ones fuzzy); ``check`` lists every entry
that is missing, untranslated, fuzzy or whose markup (math, code, fields, links,
directives) differs from the English; ``todo`` and ``fill`` are the translator's loop.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import re
import sys
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from coursekit.conventions import LOCALES_DIR, ROOT, TRANSLATIONS

from . import headings
from .translatable import FIELD_LITERAL

PROJECT = "Attention from Scratch"
FRONT_MATTER = "front_matter"
FEEDBACK = "feedback"


@dataclasses.dataclass(frozen=True)
class Unit:
    text: str
    where: str  # "path:line"
    kind: str   # markdown, string, docstring, comment, message


def po_path(domain: str, language: str) -> Path:
    return LOCALES_DIR / language / "LC_MESSAGES" / f"{domain}.po"


def domains() -> list[str]:
    from coursekit.conventions import chapter_names
    return [f"chapters/{name}" for name in chapter_names()] + [FRONT_MATTER, FEEDBACK]


def extracted(domain: str) -> list[Unit]:
    """The English units of a domain, in reading order, each once."""
    if domain.startswith("chapters/"):
        from . import parse_chapter
        from .translatable import chapter_labels, units
        from coursekit.conventions import COURSE_DIR
        name = domain.split("/", 1)[1]
        chapter = parse_chapter(COURSE_DIR / f"{name}.py")
        labels = chapter_labels(chapter.cells)
        found = [Unit(text, f"course/{name}.py:{cell.line}", kind) for cell in chapter.cells
                 if cell.kind != "hidden" for text, kind in units(cell.kind, cell.source, labels)]
    elif domain == FRONT_MATTER:
        from .front_matter import front_matter_units
        found = [Unit(text, where, "markdown") for text, where in front_matter_units()]
    elif domain == FEEDBACK:
        from .feedback_texts import feedback_units
        found = [Unit(text, where, "message") for text, where in feedback_units()]
    else:
        raise KeyError(domain)
    seen, unique = set(), []
    for unit in found:
        if unit.text not in seen:
            seen.add(unit.text)
            unique.append(unit)
    return unique


def template(domain: str) -> Catalog:
    catalog = Catalog(project=PROJECT, fuzzy=False)
    for unit in extracted(domain):
        path, _, line = unit.where.rpartition(":")
        catalog.add(unit.text, locations=[(path, int(line))], auto_comments=[unit.kind])
    return catalog


def read(domain: str, language: str) -> Catalog:
    path = po_path(domain, language)
    if not path.exists():
        return Catalog(locale=language, project=PROJECT, fuzzy=False)
    with path.open("rb") as f:
        return read_po(f, locale=language)


def write(catalog: Catalog, domain: str, language: str) -> None:
    path = po_path(domain, language)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, ignore_obsolete=True, omit_header=False, sort_output=False)


def update(domain: str, language: str) -> Catalog:
    catalog = read(domain, language)
    catalog.update(template(domain), no_fuzzy_matching=False)
    for message in catalog:  # the standard headings come from one table
        if message.id and message.string:
            message.string = headings.standard(message.id, message.string, language)
    catalog.fuzzy = False
    catalog.revision_date = catalog.creation_date = catalog.creation_date.replace(year=2026, month=1, day=1,
                                                                                  hour=0, minute=0, second=0)
    write(catalog, domain, language)
    return catalog


@functools.lru_cache(maxsize=None)
def translations(domain: str, language: str) -> dict[str, str]:
    """msgid -> msgstr of the finished entries (neither empty nor fuzzy)."""
    return {m.id: m.string for m in read(domain, language) if m.id and m.string and not m.fuzzy}


# ------------------------------------------------------------------ checks

_INLINE = [re.compile(p, re.S) for p in (  # math and code may wrap across lines: compared without layout
    r"\$\$.*?\$\$", r"(?<![\\$])\$[^$]+?\$", r"`[^`]+`", r"\{[a-z][\w:-]*\}", r"\]\(([^)]*)\)",
    r"https?://[^\s)>]+")]
_LINES = re.compile(r"^\s*(?:[`~:]{3,}\{?[\w-]*\}?|:[\w-]+:|\([\w:-]+\)=)", re.M)
_FIELD = re.compile(r"(?<!\{)\{[^{}]*\}(?!\})")
_CODE = re.compile(r"`[^`\n]+`")
_TEXT_IN_MATH = re.compile(r"\\text\{[^{}]*\}")


def markup(text: str, kind: str) -> collections.Counter:
    """What a translation must keep as written: math, code, roles, link targets and directive
    lines in markdown; ``{fields}``, escapes and code in strings; code in comments."""
    if kind in ("string", "message"):
        # a field's shown literals are text, and a field that only shows one may pad it to another width
        fields = [re.sub(r"^\{''(?::[<>^]?\d*s?)?\}$", "{''}", FIELD_LITERAL.sub("''", f)) for f in _FIELD.findall(text)]
        return collections.Counter(fields + re.findall(r"\\.", text) + _CODE.findall(text))
    if kind in ("comment", "docstring"):
        return collections.Counter(_CODE.findall(text))
    found = collections.Counter(m.group(0).strip() for m in _LINES.finditer(text))
    prose = re.sub(r"^\s*[`~:]{3,}.*$", "", text, flags=re.M)  # fence lines are counted above
    prose = _TEXT_IN_MATH.sub(r"\\text{}", prose)  # a formula's \text{...} words are text, said in the edition's language
    for pattern in _INLINE:
        found.update(" ".join(m.split()) for m in pattern.findall(prose))
    return found


def problems(domain: str, language: str) -> list[str]:
    """Every entry that is missing, untranslated, fuzzy or breaks the English markup."""
    catalog = read(domain, language)
    path = po_path(domain, language)
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for unit in extracted(domain):
        message = catalog.get(unit.text)
        short = unit.text.replace("\n", " ")[:70]
        if message is None:
            found.append(f"{rel}: missing ({unit.where}): {short!r} (run `python -m coursegen.catalogs update`)")
        elif not message.string:
            found.append(f"{rel}: untranslated ({unit.where}): {short!r}")
        elif message.fuzzy:
            found.append(f"{rel}: fuzzy, the English changed ({unit.where}): {short!r}")
        elif unit.kind == "markdown" and headings.problems(unit.text, message.string, language):
            found.append(f"{rel}: heading ({unit.where}): {headings.problems(unit.text, message.string, language)}"
                         " (run `python -m coursegen.catalogs update`)")
        else:
            want, got = markup(unit.text, unit.kind), markup(message.string, unit.kind)
            if want != got:
                lost = list((want - got).elements())[:3]
                extra = list((got - want).elements())[:3]
                found.append(f"{rel}: markup differs ({unit.where}): {short!r}: lost {lost}, added {extra}")
    return found


def entry_counts(language: str) -> dict[str, int]:
    return {domain: sum(1 for m in read(domain, language) if m.id) for domain in domains()}


# ------------------------------------------------------------------ the translator's loop

def todo(domain: str, language: str, limit: int) -> str:
    """Entries still to do, numbered, for ``fill``."""
    catalog, out = read(domain, language), []
    for number, message in enumerate(m for m in catalog if m.id):
        if not message.string or message.fuzzy or _broken(message, domain):
            out.append(f"=== {number} [{', '.join(message.auto_comments)}]\n{message.id}")
            if message.string:
                out.append(f"--- current (fuzzy or markup differs)\n{message.string}")
        if len(out) >= limit:
            break
    return "\n".join(out)


def _broken(message, domain) -> bool:
    kind = (message.auto_comments or ["markdown"])[0]
    return markup(message.id, kind) != markup(message.string, kind)


def fill(domain: str, language: str, path: Path) -> int:
    """Set translations from a file of ``=== N`` headers, each followed by its text."""
    catalog = read(domain, language)
    messages = [m for m in catalog if m.id]
    parts = re.split(r"^=== (\d+)[^\n]*\n", Path(path).read_text(), flags=re.M)
    done = 0
    for number, text in zip(parts[1::2], parts[2::2]):
        message = messages[int(number)]
        message.string = text.rstrip("\n")
        message.flags.discard("fuzzy")
        done += 1
    write(catalog, domain, language)
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursegen.catalogs", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["update", "check", "todo", "fill", "count"])
    parser.add_argument("domain", nargs="?", help="e.g. chapters/02_self_attention, front_matter, feedback")
    parser.add_argument("file", nargs="?", type=Path, help="fill: the translations")
    parser.add_argument("--language", default=TRANSLATIONS[0])
    parser.add_argument("--limit", type=int, default=30)
    args = parser.parse_args(argv)
    selected = [args.domain] if args.domain else domains()
    if args.command == "update":
        for domain in selected:
            catalog = update(domain, args.language)
            print(f"{po_path(domain, args.language).relative_to(ROOT)}: {sum(1 for m in catalog if m.id)} entries")
    elif args.command == "check":
        found = [p for domain in selected for p in problems(domain, args.language)]
        print("\n".join(found) or "every entry is translated")
        return 1 if found else 0
    elif args.command == "todo":
        print(todo(args.domain, args.language, args.limit) or "nothing left to do")
    elif args.command == "fill":
        print(f"filled {fill(args.domain, args.language, args.file)} entries")
    elif args.command == "count":
        for domain, count in entry_counts(args.language).items():
            print(f"{domain}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
