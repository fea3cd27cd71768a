"""Submissions made from a chapter's learner notebook and its reference: for tests, benchmarks, samples.

Instructor-only: a submission made with ``base="reference"`` contains the reference solution.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import nbformat

from . import conventions as C
from .source import parse_chapter


def learner_notebook(chapter: str, language: str = C.SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    """A new copy of the chapter's learner notebook (read and validated once per version of the file)."""
    path = C.learner_notebook(chapter, language)
    return nbformat.from_dict(json.loads(_read(path, path.stat().st_mtime_ns)))


def reference_answers(chapter: str) -> dict[str, str]:
    """exercise name -> its reference solution, as a learner would type it."""
    path = C.COURSE_DIR / f"{chapter}.py"
    return dict(_answers(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=None)
def _read(path: Path, version: int) -> str:
    """The notebook's JSON, once read and validated."""
    return json.dumps(nbformat.read(path, as_version=4))


@functools.lru_cache(maxsize=None)
def _answers(path: Path, version: int) -> dict[str, str]:
    return {c.name: C.strip_solution_markers(c.source) for c in parse_chapter(path).of_kind("exercise")}


def insert_after_imports(nb: nbformat.NotebookNode, sources) -> None:
    """Code cells (student cells) put right after the notebook's export (imports) cell, in order."""
    first_export = next(i for i, c in enumerate(nb.cells) if C.role(c) == "export")
    nb.cells[first_export + 1:first_export + 1] = [nbformat.v4.new_code_cell(source) for source in sources]


def submission(answers: dict[str, str] | None = None, *, base="reference", prepend=(), append=(),
               chapter="02_self_attention", language=C.SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    """A learner notebook with answer cells replaced.

    base: "reference" fills every answer with the reference, "stub" keeps the stubs;
    answers overrides single exercises; prepend/append add student cells right after
    the export (imports) cell / at the end; language: the edition of the learner notebook.
    """
    nb = learner_notebook(chapter, language)
    filled = reference_answers(chapter) if base == "reference" else {}
    filled.update(answers or {})
    for cell in nb.cells:
        if C.grade_id(cell) in filled:
            cell.source = filled[C.grade_id(cell)]
    insert_after_imports(nb, prepend)
    for source in append:
        nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb
