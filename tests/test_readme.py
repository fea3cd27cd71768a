"""The README's learner and instructor commands, run as written in a fresh clone.

The ```bash blocks of the README's sections "For learners", "For instructors" and
"Grading a whole class" are taken from the README itself (not retyped here) and run
line by line, from the root of a ``git clone`` of the committed repository, with the
paths they give. The results the README shows (the sample class's table of scores, the
files it names) are then checked, so the README cannot drift from what works. ``make
book`` and ``make test`` are left out: CI runs them. The clone reuses this checkout's
``.venv`` (a symlink), so nothing is installed. The class the README grades is the sample
class: ``test_classroom`` reads the same run (``conftest.readme_clone``).
"""
from __future__ import annotations

import csv
import json
import subprocess

import nbformat
import pytest

from class_runs import code_blocks, readme_commands, readme_sections
from support import ROOT

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build


def shown_class_table() -> list[list[str]]:
    """The sample class's scores as the README shows them (the block after "the result")."""
    section = readme_sections()["Grading a whole class"]
    after = section[section.index("the result"):]
    block = code_blocks(after, "")[0]
    return list(csv.reader(block.splitlines()))


def test_the_readme_has_commands_to_run():
    commands = readme_commands()
    assert any(" grade " in c for c in commands) and any(" grade-class " in c for c in commands)
    assert not any("--course course" in c for c in commands)  # course/ holds chapter sources


def test_learner_notebooks_are_as_described():
    """"a stub for each exercise, and visible tests, and no outputs"."""
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path.name
        assert any("raise NotImplementedError()" in c.source for c in code), path.name


def test_grading_one_submission(readme_clone):
    folder, results = readme_clone
    report = next(p for c, p in results.items() if " grade " in c and "--json" not in c
                  and "--feedback-dir" not in c)
    assert "02_self_attention: 0 / 10 points" in report.stdout  # "scores 0 / 10 until it is solved"
    as_json = next(p for c, p in results.items() if " grade " in c and "--json" in c)
    assert json.loads(as_json.stdout)["score"] == 0
    assert (folder / "feedback" / "ada-02_self_attention.html").is_file()


def test_the_sample_class_scores_as_shown(readme_clone):
    folder, results = readme_clone
    shown = shown_class_table()
    with open(folder / "my-class" / "class-grades.csv") as f:
        got = list(csv.reader(f))
    assert got[0] == shown[0]
    assert len(got) == len(shown)
    for want, row in zip(shown, got):
        for cell, value in zip(want, row, strict=True):
            prefix = cell.split("...")[0] if "..." in cell else None
            assert value.startswith(prefix) if prefix is not None else value == cell, (want, row)
    summary = next(p for c, p in results.items() if " grade-class " in c)
    assert "6 graded, 3 could not be graded" in summary.stdout


def test_files_the_readme_names(readme_clone):
    folder, _ = readme_clone
    course = folder / "my-class"
    for student in ("ada", "eve"):
        assert (course / "feedback" / student / "02_self_attention" / "02_self_attention.html").is_file()
    assert (course / "feedback" / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert (course / "release" / "02_self_attention" / "02_self_attention.ipynb").is_file()
    assert (course / "class-exercises.csv").is_file() and (course / "grades.csv").is_file()
    assert "student_id" in (course / "grades.csv").read_text()  # nbgrader's, beside ours
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "course", "source",
                             "chapters", "solutions"], cwd=folder, capture_output=True, text=True)
    assert status.stdout == ""  # the commands left the project's own folders alone
