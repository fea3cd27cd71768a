"""Generated files match their sources; learner notebooks keep the contract."""
import re
import subprocess
import sys

import nbformat
import pytest

from support import ROOT
from coursekit import conventions as C
from contract import check_contract, spec_text
from test_book import book  # noqa: F401 - the built book, for the tests that read its runs

CHAPTERS = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.py"))


def test_generated_files_do_not_drift():
    """``coursegen --check`` on every chapter: half of them in each of two processes at once (one per core)."""
    checks = [subprocess.Popen([sys.executable, "-m", "coursegen", "--check", *CHAPTERS[half::2]], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for half in (0, 1)]
    for check in checks:
        _, stderr = check.communicate()
        assert check.returncode == 0, stderr


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_learner_notebook_contract(chapter):
    nb = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4)
    assert nb.metadata["course"]["chapter"] == chapter
    assert "do not edit" in nb.metadata["course"]["note"]
    text = nbformat.writes(nb)
    for leak in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "attn_probe", "import solutions"):
        assert leak not in text
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            assert "raise NotImplementedError()" in cell.source
        elif meta.get("solution"):  # a written answer, graded by hand: the learner sees nbgrader's prompt
            assert cell.source == "YOUR ANSWER HERE"


def test_shared_contract_checker(tmp_path):
    """The shared checker, with the shared spec and this repository's proposed tables, on every chapter.

    Its one complaint is each written answer (a markdown answer cell graded by hand, no exercise of
    the spec): it counts every nbgrader answer cell as an exercise. Every exercise conforms."""
    code, output, listed = check_contract(ROOT / "chapters", tmp_path)
    written = {(f"{chapter}.ipynb", grade_id) for chapter in CHAPTERS
               for grade_id in C.written_points(nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4))}
    problems = [line for line in output.splitlines() if line.endswith(" is not in the spec")]
    assert {(line.split(":")[0], line.split("'")[1]) for line in problems} == written, output
    assert f"{len(CHAPTERS)} chapter(s) present, {len(written)} problem(s)" in output, output
    listed_names = set(re.findall(r"^### (\d\d_\w+)", spec_text(), re.M))
    missing = sorted(set(CHAPTERS) - listed_names)
    assert not missing, f"the spec lists no table for {missing}: a new chapter proposes its table in docs/spec/<chapter>.md"
    # A table may come before its chapter (the chapter being written): the checker says "not yet" for it.
    for ahead in sorted(listed_names - set(CHAPTERS)):
        assert f"not yet: chapters/{ahead}.ipynb" in output, output
    assert listed == len(listed_names), "a chapter has two tables in the spec"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_with_the_reference(book, chapter):
    """Visible tests pass with the reference and every given cell runs.

    The run is the book's own (``coursegen.book.executed_chapter``, cached by content),
    so a chapter's training runs once per test run, not once here and once for the book.
    """
    from coursegen import parse_chapter
    from coursegen.book import executed_chapter
    nb = executed_chapter(parse_chapter(ROOT / "course" / f"{chapter}.py"))
    errors = [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_learner_stubs_fail_their_visible_tests(chapter):
    """Each visible test fails on the untouched stubs, so no test passes vacuously."""
    nb = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4)
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        role = cell.metadata.get("course", {}).get("role")
        if role == "export" or meta.get("solution"):
            exec(compile(cell.source, "<cell>", "exec"), namespace)
        elif meta.get("grade"):
            with pytest.raises(NotImplementedError):
                exec(compile(cell.source, meta["grade_id"], "exec"), dict(namespace))
