"""Submissions made from a chapter's learner notebook and its reference: for tests, benchmarks, samples.

Instructor-only: a submission made with ``base="reference"`` contains the reference solution.
"""
from __future__ import annotations

import nbformat

from . import conventions as C
from .source import parse_chapter


def learner_notebook(chapter: str, language: str = C.SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    return nbformat.read(C.learner_notebook(chapter, language), as_version=4)


def reference_answers(chapter: str) -> dict[str, str]:
    """exercise name -> its reference solution, as a learner would type it."""
    source = parse_chapter(C.COURSE_DIR / f"{chapter}.py")
    return {c.name: C.strip_solution_markers(c.source) for c in source.of_kind("exercise")}


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
    first_export = next(i for i, c in enumerate(nb.cells) if C.role(c) == "export")
    for offset, source in enumerate(prepend):
        nb.cells.insert(first_export + 1 + offset, nbformat.v4.new_code_cell(source))
    for source in append:
        nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb
