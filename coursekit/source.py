"""The chapter-source format: ``course/NN_name.py`` as a list of typed cells.

A chapter source is a percent-format Python file (see ``course/README.md``): each cell
opens with ``# %% [kind name key=value]``. This module reads it (``parse_chapter``) and
checks its rules; ``coursegen`` turns the cells into notebooks and modules, the grader's
tools and the tests read them from here too. Ground floor: imports nothing of the project
but ``coursekit.conventions``.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .conventions import (COURSE_DIR, HIDDEN_BEGIN, SOLUTION_BEGIN, SOLUTION_END, chapter_names, exercise_of,
                          reference_module)

_HEADER = re.compile(r"^# %%(?:\s+\[(?P<body>[^\]]*)\])?\s*$")
KINDS = {"markdown", "code", "export", "exercise", "test", "written", "hidden", "include"}
INCLUDABLE = ("code", "export", "markdown")  # the kinds a cell named with name=NAME may have
INCLUDED_NOTE = "# {title}'s code, unchanged (copied from {chapter} when the course is generated)"


class SourceError(ValueError):
    """A chapter source file breaks the cell format."""


@dataclasses.dataclass
class Cell:
    kind: str
    source: str
    name: str | None = None  # grade_id for exercise and test cells; optional for given cells (see include)
    points: float | None = None
    tags: tuple[str, ...] = ()
    line: int = 0


@dataclasses.dataclass
class Chapter:
    name: str  # e.g. "02_self_attention"
    path: Path
    cells: list[Cell]

    @property
    def module(self) -> str:
        """Reference module name, e.g. ``ch02_self_attention``."""
        return reference_module(self.name).rsplit(".", 1)[1]

    def of_kind(self, kind: str) -> list[Cell]:
        return [c for c in self.cells if c.kind == kind]

    @property
    def exercises(self) -> list[str]:
        return [c.name for c in self.of_kind("exercise")]


def _parse_header(body: str | None, line: int) -> Cell:
    words = (body or "").split()
    kind = "code"
    if words and "=" not in words[0]:
        kind = words.pop(0)
    if kind not in KINDS:
        raise SourceError(f"line {line}: unknown cell kind {kind!r}")
    cell = Cell(kind=kind, source="", line=line)
    if kind in ("exercise", "test", "written", "include"):
        if not words or "=" in words[0]:
            raise SourceError(f"line {line}: a {kind} cell needs a name")
        cell.name = words.pop(0)
    for word in words:
        key, _, value = word.partition("=")
        if key == "name" and kind in INCLUDABLE:
            cell.name = value
        elif key == "points" and kind in ("test", "written"):
            cell.points = float(value)
        elif key == "tags":
            cell.tags = tuple(t for t in value.split(",") if t)
        else:
            raise SourceError(f"line {line}: unknown option {word!r}")
    if kind in ("test", "written") and cell.points is None:
        raise SourceError(f"line {line}: {kind} cell {cell.name} needs points=N")
    return cell


def _finish(cell: Cell, lines: list[str]) -> Cell:
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    if cell.kind in ("markdown", "written"):  # a written answer is markdown too
        body = []
        for text in lines:
            if text.strip() == "#":
                body.append("")
            elif text.startswith("# "):
                body.append(text[2:])
            else:
                raise SourceError(f"line {cell.line}: markdown lines must start with '# '")
        lines = body
    cell.source = "\n".join(lines)
    return cell


def parse_chapter(path: Path) -> Chapter:
    cells: list[Cell] = []
    current: Cell | None = None
    lines: list[str] = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _HEADER.match(text)
        if match:
            if current is not None:
                cells.append(_finish(current, lines))
            current, lines = _parse_header(match.group("body"), number), []
        elif current is None:
            if text.strip():
                raise SourceError(f"{path.name}:{number}: text before the first '# %%' cell")
        else:
            lines.append(text)
    if current is not None:
        cells.append(_finish(current, lines))
    chapter = Chapter(name=path.stem, path=path, cells=[_resolve(cell, path) for cell in cells])
    _validate(chapter)
    return chapter


def _resolve(cell: Cell, path: Path) -> Cell:
    """``# %% [include 01_bahdanau_attention:date_task]``: another chapter's named cell.

    One source for what two chapters show (d2l keeps one library; our notebooks must each
    run on their own, so the cell is copied into the notebook, and drift is checked). The
    copy keeps the named cell's kind: given code stays given code, an export is exported
    again (into this chapter's reference module), markdown stays markdown. Code carries a
    note saying where it comes from; markdown is copied as it is (a comment line there would
    be a heading).
    """
    if cell.kind != "include":
        return cell
    where = f"{path.name}:{cell.line}"
    other, _, name = cell.name.partition(":")
    if cell.source or not name or other not in chapter_names():
        raise SourceError(f"{where}: write an include as '# %% [include NN_chapter:cell_name]', with no body")
    found = [c for c in parse_chapter(COURSE_DIR / f"{other}.py").cells if c.kind in INCLUDABLE and c.name == name]
    if not found:
        raise SourceError(f"{where}: {other} has no cell named {name} (name it with '[{' or '.join(INCLUDABLE)} "
                          f"name={name}]')")
    source = found[0].source
    if found[0].kind != "markdown":
        title = f"Chapter {int(other[:2])}"
        source = INCLUDED_NOTE.format(title=title, chapter=f"course/{other}.py") + "\n" + source
    return dataclasses.replace(cell, kind=found[0].kind, name=None, source=source)


def _validate(chapter: Chapter) -> None:
    seen: set[str] = set()
    for cell in chapter.cells:
        where = f"{chapter.path.name}:{cell.line}"
        if cell.name:
            if cell.name in seen:
                raise SourceError(f"{where}: duplicate cell name {cell.name}")
            seen.add(cell.name)
        if cell.kind == "exercise":
            begins, ends = cell.source.count(SOLUTION_BEGIN), cell.source.count(SOLUTION_END)
            if begins == 0 or begins != ends:   # a class may have one region per method
                raise SourceError(f"{where}: exercise {cell.name} needs solution regions, each begun and ended")
        elif cell.kind == "written":
            lines = [line.strip() for line in cell.source.splitlines()]
            if not lines or lines[0] != SOLUTION_BEGIN or lines[-1] != SOLUTION_END or \
                    lines.count(SOLUTION_BEGIN) != 1 or lines.count(SOLUTION_END) != 1:
                raise SourceError(f"{where}: written answer {cell.name} is one solution region "
                                  "(its model answer and rubric), from its first line to its last")
            if "Rubric" not in cell.source:
                raise SourceError(f"{where}: written answer {cell.name} needs a rubric ('Rubric' and its points)")
        elif SOLUTION_BEGIN in cell.source or HIDDEN_BEGIN in cell.source:
            raise SourceError(f"{where}: markers belong in exercise cells only")
        if cell.kind == "test" and exercise_of(cell.name, chapter.exercises) is None:
            raise SourceError(f"{where}: test {cell.name} does not start with test_<exercise name>")


def chapters() -> list[Chapter]:
    return [parse_chapter(COURSE_DIR / f"{name}.py") for name in chapter_names()]
