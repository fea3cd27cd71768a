"""Turn a parsed chapter into its instructor notebook, reference and hidden modules."""
from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path

import nbformat

from coursekit import conventions as C
from coursekit.conventions import EDITIONS, SOURCE_LANGUAGE
from coursekit.nbgrader_course import generate_assignment

from .catalogs import FEEDBACK, po_path, translations
from .edition_notes import note_for
from .learner_view import plain_notebook
from .translatable import chapter_labels, translate_code, translate_markdown
from .visible_test_errors import marker, with_stop_report

from . import HIDDEN_BEGIN, HIDDEN_END, NOTE, ROOT, Chapter, strip_solution_markers

PYPLOT_IMPORT = re.compile(r"^import matplotlib\.pyplot as plt$", re.M)
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def probe_call(test_id: str) -> str:
    """The hidden block that opens every test cell: the kernel side of the grader."""
    return "\n".join([
        HIDDEN_BEGIN,
        f'__import__("attn_probe").run({test_id!r}, globals())',
        HIDDEN_END,
    ])


def _nbgrader_meta(cell) -> dict | None:
    if cell.kind == "exercise":
        return {"grade": False, "solution": True, "locked": False, "task": False,
                "grade_id": cell.name, "schema_version": 3}
    if cell.kind == "test":
        return {"grade": True, "solution": False, "locked": True, "task": False,
                "grade_id": cell.name, "points": cell.points, "schema_version": 3}
    if cell.kind == "written":  # nbgrader's manually graded answer: generate_assignment leaves its prompt
        return {"grade": True, "solution": True, "locked": False, "task": False,
                "grade_id": cell.name, "points": cell.points, "schema_version": 3}
    return None


def instructor_notebook(chapter: Chapter, language: str = SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    src = f"course/{chapter.path.name}"
    if language != SOURCE_LANGUAGE:
        src += f" and {po_path(f'chapters/{chapter.name}', language).relative_to(ROOT)}"
    nb.metadata = {
        "kernelspec": KERNELSPEC,
        "language_info": {"name": "python"},
        "course": {
            "chapter": chapter.name,
            "note": NOTE.format(src=src),
        },
    }
    if language != SOURCE_LANGUAGE:
        nb.metadata["course"]["language"] = language
    for cell in chapter.cells:
        if cell.kind == "hidden":
            continue
        if cell.kind in ("markdown", "written"):
            new = nbformat.v4.new_markdown_cell(cell.source)
        else:
            source = cell.source
            if cell.kind == "test":  # first the hidden part, then the line that names the visible test
                source = "\n".join([probe_call(cell.name), marker(cell.name, _feedback_words(language)), source])
            new = nbformat.v4.new_code_cell(source)
        new.metadata = {}
        meta = _nbgrader_meta(cell)
        if meta:
            new.metadata["nbgrader"] = meta
        if cell.kind in ("code", "export"):
            new.metadata["course"] = {"role": "given" if cell.kind == "code" else "export"}
        if cell.tags:
            new.metadata["tags"] = list(cell.tags)
        new.pop("id", None)
        nb.cells.append(new)
    return _without_cell_ids(nb)


def _feedback_words(language: str):
    """The edition's translations of the feedback catalog (which holds the visible tests' own words)."""
    return None if language == SOURCE_LANGUAGE else translations(FEEDBACK, language).get


def _without_cell_ids(nb):
    """Stable output: nbformat 4.5 random cell ids would make every build differ."""
    nb.nbformat_minor = 4
    for cell in nb.cells:
        cell.pop("id", None)
    return nb


def _module_header(chapter: Chapter, what: str) -> str:
    return f'"""{what} for chapter {chapter.name}.\n\n{NOTE.format(src=f"course/{chapter.path.name}")}.\n"""\n'


def reference_module(chapter: Chapter) -> str:
    exports = [c.source for c in chapter.of_kind("export")]
    parts = [_module_header(chapter, "Reference solution (instructor-only)"), *exports]
    parts += [strip_solution_markers(c.source) for c in chapter.of_kind("exercise")]
    # The given imports, for running one exercise on its own (grader substitution).
    parts.append(f"EXPORTS_SOURCE = {chr(10).join(exports)!r}")
    return "\n\n\n".join(parts) + "\n"


def hidden_module(chapter: Chapter) -> str:
    parts = [_module_header(chapter, "Hidden tests (instructor-only)")]
    parts += [c.source for c in chapter.of_kind("hidden")]
    return "\n\n\n".join(parts) + "\n"


def dumps_notebook(nb) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def learner_notebook(chapter: Chapter, instructor: nbformat.NotebookNode, language: str = SOURCE_LANGUAGE) -> str:
    """nbgrader generate_assignment's release of the instructor notebook, its MyST made plain
    (``learner_view``): learners read it in Jupyter, Colab or VS Code, not in the book. Its setup
    cell makes a visible test that stops on an error say which and why first (``visible_test_errors``)."""
    plain = plain_notebook(released_notebook(chapter, instructor), language)
    return dumps_notebook(with_stop_report(plain, _feedback_words(language)))


def released_notebook(chapter: Chapter, instructor: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run nbgrader generate_assignment on the instructor notebook in a scratch course."""
    with tempfile.TemporaryDirectory(prefix="coursegen-") as tmp:
        notebook = Path(tmp) / f"{chapter.name}.ipynb"
        notebook.write_text(dumps_notebook(instructor))
        released = generate_assignment(Path(tmp) / "course", chapter.name, notebook)
        nb = nbformat.read(released, as_version=4)
    return _without_cell_ids(nb)


def artefacts(chapter: Chapter) -> dict[Path, str]:
    """Every generated file of a chapter, path relative to the repository root -> text."""
    files = {
        Path("solutions") / f"{chapter.module}.py": reference_module(chapter),
        Path("solutions") / f"{chapter.module}_hidden.py": hidden_module(chapter),
    }
    for language in EDITIONS:
        edition = chapter if language == SOURCE_LANGUAGE else translated_chapter(chapter, language)
        instructor = instructor_notebook(edition, language)
        files[C.instructor_notebook(chapter.name, language).relative_to(ROOT)] = dumps_notebook(instructor)
        files[C.learner_notebook(chapter.name, language).relative_to(ROOT)] = learner_notebook(edition, instructor, language)
    return files


def translated_chapter(chapter: Chapter, language: str) -> Chapter:
    """CHAPTER with everything a reader reads looked up in its catalog (code untouched).

    An entry not yet translated keeps its English; ``make test`` lists such entries.
    A note of ``edition_notes`` follows the markdown cell it is anchored to.
    The given cell that imports pyplot also picks a font for the edition's script.
    """
    found = translations(f"chapters/{chapter.name}", language).get
    labels = chapter_labels(chapter.cells)

    notes = note_for(chapter, language)

    def cell_in(index, cell):
        if cell.kind in ("hidden", "written"):  # a written answer's model answer and rubric: instructor-only
            return cell
        if cell.kind == "markdown":
            source = translate_markdown(cell.source, found)
            if index in notes:  # a note only this edition's readers need
                source += "\n\n" + notes[index]
            return dataclasses.replace(cell, source=source)
        source = translate_code(cell.source, cell.kind, found, labels)
        if cell.kind == "code" and PYPLOT_IMPORT.search(source):
            source = source.rstrip("\n") + C.figure_font_setup(language)
        return dataclasses.replace(cell, source=source)
    return dataclasses.replace(chapter, cells=[cell_in(i, c) for i, c in enumerate(chapter.cells)])


def write(files: dict[Path, str]) -> None:
    for rel, text in files.items():
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def drift(files: dict[Path, str]) -> list[str]:
    problems = []
    for rel, text in files.items():
        path = ROOT / rel
        if not path.exists():
            problems.append(f"{rel}: missing (run `make generate`)")
        elif path.read_text() != text:
            problems.append(f"{rel}: differs from its source (run `make generate`, do not edit)")
    return problems


def clean_stale(chapters_seen: list[Chapter]) -> None:
    """Remove generated files of chapters whose source is gone."""
    names = {c.name for c in chapters_seen}
    for language in EDITIONS:
        for nb in C.learner_notebook("x", language).parent.glob("[0-9][0-9]_*.ipynb"):
            if nb.stem not in names:
                nb.unlink()
        for d in C.instructor_notebook("x", language).parent.parent.glob("[0-9][0-9]_*"):
            if d.name not in names:
                shutil.rmtree(d)
