"""Read a submitted notebook and say in one line why it cannot be graded, if it cannot."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from coursekit import conventions as C

from .chapters import ChapterInfo, known
from .messages import msg

# Two limits (README, "Grade one submission"): the notebook graded, its code cells' outputs left out
# (grading never reads them: a notebook saved with its figures is graded without them), and the
# file as submitted, outputs included, read whole into memory once.
MAX_BYTES = 50 * 1024 * 1024
MAX_FILE_BYTES = 256 * 1024 * 1024


class SubmissionError(Exception):
    """The file is not a gradable notebook of this course (message: one line)."""


def load(path: Path, chapter: str | None = None):
    """Parse a submission; return it (nbformat 4) and its ChapterInfo."""
    import nbformat
    path = Path(path)
    if not path.is_file():
        raise SubmissionError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise SubmissionError(f"{path.name}: the file is empty")
    if size > MAX_FILE_BYTES:
        raise SubmissionError(
            f"{path.name}: the file is {size // 2**20} MiB, over the {MAX_FILE_BYTES // 2**20} MiB limit on a "
            "submitted file; clear its outputs (Edit > Clear Outputs of All Cells), save and submit it again")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SubmissionError(f"{path.name}: not a notebook (not valid JSON: {err})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise SubmissionError(f"{path.name}: JSON but not a notebook (no list of cells)")
    text = json.dumps(_without_outputs(raw))
    if len(text) > MAX_BYTES:
        raise SubmissionError(
            f"{path.name}: its cells are {len(text) // 2**20} MiB without their outputs, over the "
            f"{MAX_BYTES // 2**20} MiB limit (images pasted into markdown cells count)")
    major = raw.get("nbformat")
    if major != 4:
        raise SubmissionError(
            f"{path.name}: notebook format {major!r} is not supported; save it as nbformat 4 "
            "(any current Jupyter does)")
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as err:  # noqa: BLE001 - nbformat raises many kinds
        raise SubmissionError(f"{path.name}: not a valid notebook ({str(err).splitlines()[0][:200]})") from None
    chapters = known()
    name = chapter or _chapter_name(path, nb, chapters)
    if name not in chapters:
        raise SubmissionError(
            f"{path.name}: cannot tell which chapter this is (file name or metadata "
            f"course.chapter should be one of: {', '.join(chapters) or 'none'})")
    own = _metadata_chapter(nb)
    if own in chapters and own != name:  # a notebook of another chapter, handed in (or filed) as this one
        raise SubmissionError(
            f"{path.name}: a notebook of {own} (its metadata course.chapter), not of {name}; "
            f"not graded as {name}")
    return nb, dataclasses.replace(chapters[name], language=C.language_of(nb))


def _without_outputs(raw: dict) -> dict:
    """RAW (a notebook's JSON) with every code cell's outputs and execution count cleared, in place."""
    for cell in raw["cells"]:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return raw


def _metadata_chapter(nb) -> str | None:
    meta = nb.metadata.get("course", {})
    own = meta.get("chapter") if isinstance(meta, dict) else None
    return own if isinstance(own, str) else None


def _chapter_name(path: Path, nb, chapters) -> str | None:
    if path.stem in chapters:
        return path.stem
    return _metadata_chapter(nb)


def repaired(nb, release):
    """The submission in a shape nbgrader always accepts, and what was repaired.

    Course cells (by nbgrader grade_id) get their released metadata and type back; a test
    cell that was deleted, renamed or re-typed is put back from the released notebook
    (nbgrader then restores its hidden part); duplicates of a course cell lose their
    nbgrader metadata (a duplicated test cell is dropped). The chapter's given demo cells
    are not run (exercises never need them): each stays, as a markdown code block, so that
    the feedback page reads as the notebook did ("written out below:" shows what it names).
    The learner's own cells and answers are kept as they are.
    """
    import nbformat
    released = [c for c in release.cells if C.grade_id(c)]
    by_id = {C.grade_id(c): c for c in released}
    notes, seen, cells = [], set(), []
    for cell in nb.cells:
        grade_id = C.grade_id(cell)
        if C.role(cell) == "given" and not grade_id:
            cells.append(_shown_not_run(cell))
            continue
        course_cell = by_id.get(grade_id)
        if course_cell is None or grade_id in seen:
            if course_cell is not None and C.is_test_cell(course_cell):
                notes.append(msg("a duplicate of test cell {grade_id} was ignored", grade_id=grade_id))
                continue
            if "nbgrader" in cell.metadata:
                notes.append(msg("cell metadata {grade_id} is not a cell of this chapter", grade_id=repr(grade_id))
                             if course_cell is None else
                             msg("a duplicate of answer cell {grade_id} is graded as plain code", grade_id=grade_id))
            cell = _copy(cell)
            cell.metadata.pop("nbgrader", None)
            cells.append(cell)
            continue
        seen.add(grade_id)
        fixed = _copy(course_cell)
        if C.is_answer_cell(course_cell):
            fixed.source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        if cell.cell_type != course_cell.cell_type:
            notes.append(msg("cell {grade_id} had its type changed; it was restored", grade_id=grade_id))
        cells.append(fixed)
    for index, course_cell in enumerate(released):
        grade_id = C.grade_id(course_cell)
        if grade_id in seen or not C.is_test_cell(course_cell):
            continue
        notes.append(msg("test cell {grade_id} was missing; it was restored", grade_id=grade_id))
        before = {C.grade_id(c) for c in released[:index]}
        at = max((i + 1 for i, c in enumerate(cells) if C.grade_id(c) in before), default=0)
        cells.insert(at, _copy(course_cell))
        seen.add(grade_id)
    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    out.nbformat_minor = 4
    for cell in cells:
        cell.pop("id", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        out.cells.append(cell)
    return out, notes


def _shown_not_run(cell):
    """A given code cell as a markdown code block: on the page, never run while grading."""
    import nbformat
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", source)), default=0))
    shown = nbformat.v4.new_markdown_cell(f"{fence}python\n{source}\n{fence}")
    shown.metadata["course"] = {"role": "given", "shown": "not run while grading"}
    return shown


def _copy(cell):
    import nbformat
    return nbformat.from_dict(json.loads(json.dumps(cell)))
