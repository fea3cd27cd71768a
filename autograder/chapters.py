"""The chapters the grader knows: their instructor notebook (read once), reference and hidden tests."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from pathlib import Path

from coursekit import conventions as C


@dataclasses.dataclass(frozen=True)
class ChapterInfo:
    name: str
    language: str = C.SOURCE_LANGUAGE  # the edition: same grade ids and hidden tests, text in its language

    @property
    def instructor_notebook(self) -> Path:
        return C.instructor_notebook(self.name, self.language)

    def reference(self):
        return importlib.import_module(C.reference_module(self.name))

    def hidden(self):
        """The chapter's ``HiddenTests``."""
        return importlib.import_module(C.hidden_module(self.name)).hidden

    @property
    def tests(self) -> dict[str, float]:
        """Test cell grade ids, in notebook order, with their points."""
        return _instructor(self.instructor_notebook).tests

    @property
    def exercises(self) -> list[str]:
        return _instructor(self.instructor_notebook).exercises

    @property
    def written(self) -> dict[str, float]:
        """Written answers (markdown answer cells graded by hand), in notebook order, with their points."""
        return _instructor(self.instructor_notebook).written

    @property
    def hidden_lines(self) -> frozenset[str]:
        """Every non-empty line of the hidden parts of test cells (to keep out of feedback)."""
        return _instructor(self.instructor_notebook).hidden_lines

    def exercise_of(self, test_id: str) -> str | None:
        return C.exercise_of(test_id, self.exercises)


@dataclasses.dataclass(frozen=True)
class _Instructor:
    tests: dict
    exercises: list
    hidden_lines: frozenset
    written: dict  # grade id -> points of each written answer, graded by hand


@functools.lru_cache(maxsize=None)
def _read(path: Path, mtime: float) -> _Instructor:
    import nbformat
    nb = nbformat.read(path, as_version=4)
    tests = {C.grade_id(c): C.points(c) for c in nb.cells if C.is_test_cell(c)}
    exercises = [C.grade_id(c) for c in nb.cells if C.is_exercise_cell(c)]
    hidden = frozenset(line.strip() for c in nb.cells for line in C.split_hidden(c.source)[1] if line.strip())
    return _Instructor(tests, exercises, hidden, C.written_points(nb))


def _instructor(path: Path) -> _Instructor:
    return _read(path, path.stat().st_mtime)


def known() -> dict[str, ChapterInfo]:
    """Chapters of the course whose instructor notebook has been generated."""
    return {name: ChapterInfo(name) for name in C.chapter_names() if C.instructor_notebook(name).exists()}
