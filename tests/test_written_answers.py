"""Written answers graded by hand: one or two per chapter, from its "Check your understanding".

Each is nbgrader's manually graded answer (a markdown cell with ``solution``, ``grade`` and its
points), written in the chapter source as ``# %% [written NAME points=N]``: its one solution
region holds a model answer and a point-by-point rubric, which only the instructor notebook
shows; the learner sees nbgrader's prompt. The grader leaves them out of the automatic score
without counting them as lost (``by_hand`` in the JSON), and nbgrader's gradebook asks a person
for each one answered (``needs_manual_grade``).
"""
from __future__ import annotations

import re

import nbformat
import pytest

from support import ROOT, grade_notebooks, submission

from coursekit import conventions as C
from coursekit.source import chapters

CHAPTERS = {chapter.name: chapter for chapter in chapters()}
EDITIONS = C.EDITIONS
PROMPT = {"en": "graded by hand ({points:g} points)", "zh_CN": "由教师人工评分（{points:g} 分）"}
MYST = re.compile(r":::|```\{|\{[a-z:-]+\}`|\{glue|\{dropdown")
META = {"grade": True, "solution": True, "locked": False, "task": False, "schema_version": 3}
ANSWER = ("The key bias adds the same amount to every score of a query's row, and the softmax does not "
          "change when a constant is added to a row, so nothing depends on it.")


def _notebook(path):
    return nbformat.read(path, as_version=4)


def _written(nb) -> list[tuple[int, nbformat.NotebookNode]]:
    return [(i, c) for i, c in enumerate(nb.cells) if C.is_written_cell(c)]


def _rubric_lines(cell) -> list[str]:
    """The model answer's and rubric's lines that say something (long enough to be found only there)."""
    return [line.strip() for line in C.strip_solution_markers(cell.source).splitlines() if len(line.strip()) > 25]


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("name", CHAPTERS)
def test_one_or_two_written_answers_with_nbgrader_metadata(name, language):
    source = CHAPTERS[name].of_kind("written")
    expected = {cell.name: cell.points for cell in source}
    assert 1 <= len(expected) <= 2, f"{name}: {len(expected)} written answers"
    for path in (C.instructor_notebook(name, language), C.learner_notebook(name, language)):
        found = _written(_notebook(path))
        assert {C.grade_id(c): C.points(c) for _, c in found} == expected, path
        for _, cell in found:
            meta = cell.metadata["nbgrader"]
            assert cell.cell_type == "markdown" and meta["points"] > 0, path
            assert {k: meta[k] for k in META} == META, (path, meta)
            assert C.grade_id(cell).startswith("written_"), path
            assert C.is_answer_cell(cell) and not C.is_exercise_cell(cell) and not C.is_test_cell(cell)
    learner = _notebook(C.learner_notebook(name, language))
    assert all("checksum" in c.metadata["nbgrader"] for _, c in _written(learner))  # nbgrader's "unanswered"


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("name", CHAPTERS)
def test_rubric_only_in_the_instructor_notebook(name, language):
    instructor = _notebook(C.instructor_notebook(name, language))
    learner_text = C.learner_notebook(name, language).read_text()
    shipped = [ROOT / "solutions" / f"{CHAPTERS[name].module}.py", ROOT / "solutions" / f"{CHAPTERS[name].module}_hidden.py",
               *sorted((ROOT / "locales").rglob("*.po"))]   # the catalogs are public too
    learner = _notebook(C.learner_notebook(name, language))
    for _, cell in _written(instructor):
        points = C.points(cell)
        lines = [line.strip() for line in cell.source.splitlines()]
        assert lines[0] == C.SOLUTION_BEGIN and lines[-1] == C.SOLUTION_END
        assert "**Model answer.**" in cell.source and f"**Rubric ({points:g} points).**" in cell.source
        awarded = [float(m) for m in re.findall(r"^- (\d+(?:\.\d+)?) points?:", cell.source, re.M)]
        assert sum(awarded) == points, f"{C.grade_id(cell)}: the rubric's points {awarded} for {points:g}"
        for line in _rubric_lines(cell):
            assert line not in learner_text, f"{C.grade_id(cell)}'s rubric in the learner notebook: {line}"
            for path in shipped:
                assert line not in path.read_text(), f"{C.grade_id(cell)}'s rubric in {path.relative_to(ROOT)}"
    for index, cell in _written(learner):
        assert cell.source == "YOUR ANSWER HERE"
        prompt = learner.cells[index - 1]  # the question, in a cell of its own: plain Markdown
        assert prompt.cell_type == "markdown" and re.match(r"^\d\. ", prompt.source), prompt.source
        assert not MYST.search(prompt.source), f"MyST syntax in the prompt of {C.grade_id(cell)}: {prompt.source}"
        assert PROMPT[language].format(points=C.points(cell)) in prompt.source


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_grader_knows_them_apart_from_the_exercises(name):
    from autograder.chapters import ChapterInfo
    info = ChapterInfo(name)
    assert info.written == {c.name: c.points for c in CHAPTERS[name].of_kind("written")}
    assert info.exercises == CHAPTERS[name].exercises  # no written answer among them
    assert not set(info.written) & set(info.tests)


def test_a_submission_keeps_its_written_answer_and_tells_answered_from_the_prompt():
    from autograder.submission import repaired
    release = submission(base="stub")
    nb = submission()
    grade_id = next(C.grade_id(c) for _, c in _written(nb))
    assert C.written_answers(repaired(nb, release)[0]) == {grade_id: {"max_score": 2.0, "answered": False}}
    next(c for _, c in _written(nb)).source = ANSWER
    clean, notes = repaired(nb, release)
    assert next(c for _, c in _written(clean)).source == ANSWER and notes == []
    assert C.written_answers(clean) == {grade_id: {"max_score": 2.0, "answered": True}}


def test_the_report_lists_them_pending_not_lost():
    from autograder.judge.outcome import TestOutcome, Verdict
    from autograder.report import Report
    outcomes = [TestOutcome("test_causal_mask", "causal_mask", 2.0, 2.0, []),
                TestOutcome("test_padding_mask", "padding_mask", 1.0, 0.0, [Verdict("wrong")])]
    answered = {"written_key_bias_gradient": {"max_score": 2.0, "answered": True}}
    report = Report("02_self_attention", "ada", outcomes, written=answered)
    data = report.as_json()
    assert (data["score"], data["max_score"]) == (2.0, 3.0)   # the automatic part only
    assert data["by_hand"] == {"max_score": 2.0, "pending": 2.0, "answers": answered}
    assert "written_key_bias_gradient" not in data["exercises"]
    text = report.as_text()
    assert text.startswith("02_self_attention: 2 / 3 points\nautomatic: 2 / 3; by hand: 2 points pending")
    assert "written_key_bias_gradient: to be graded by hand (2 points)" in text
    untouched = Report("02_self_attention", "ada", outcomes, language="zh_CN",
                       written={"written_key_bias_gradient": {"max_score": 2.0, "answered": False}})
    assert untouched.as_json()["by_hand"]["pending"] == 0
    assert "人工评分：0 分待评" in untouched.as_text() and "未作答" in untouched.as_text()
    # without the submission's cells (the in-process tools), the chapter's, taken as answered
    assert Report("02_self_attention", "ada", outcomes).as_json()["by_hand"]["pending"] == 2.0


def _answered(chapter: str, answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """CHAPTER's full-marks notebook (the reference) with ANSWERS (grade id -> text) written."""
    nb = submission(chapter=chapter)
    for _, cell in _written(nb):
        if C.grade_id(cell) in (answers or {}):
            cell.source = answers[C.grade_id(cell)]
    return nb


@pytest.mark.pipeline
def test_full_marks_keep_their_automatic_score_and_the_written_points_are_pending(tmp_path):
    notebooks = {
        "answered": _answered("02_self_attention", {"written_key_bias_gradient": ANSWER}),
        "untouched": _answered("02_self_attention"),
        "one_of_two": _answered("03_multi_head_attention", {"written_output_projection": "It mixes the heads."}),
    }
    results = {name: grade_notebooks({name: nb}, tmp_path / name)[name] for name, nb in notebooks.items()}
    for name, result in results.items():
        assert result["score"] == result["max_score"] == 10.0, (name, result)   # as before: the tests' points
        assert not any(g.startswith("written_") for g in result["exercises"]), name
    assert results["answered"]["by_hand"] == {
        "max_score": 2.0, "pending": 2.0,
        "answers": {"written_key_bias_gradient": {"max_score": 2.0, "answered": True}}}
    assert results["untouched"]["by_hand"]["pending"] == 0.0
    assert results["one_of_two"]["by_hand"] == {
        "max_score": 4.0, "pending": 2.0,
        "answers": {"written_output_projection": {"max_score": 2.0, "answered": True},
                    "written_mask_convention": {"max_score": 2.0, "answered": False}}}


@pytest.mark.pipeline
def test_the_gradebook_asks_a_person_for_each_answered_one(tmp_path):
    """After autograde, formgrader's Manual Grading lists the answer (needs_manual_grade); nbgrader's
    total counts its points only once a grader has scored it."""
    from autograder.grading import grade
    from coursekit.nbgrader_course import api, gradebook
    path = tmp_path / "02_self_attention.ipynb"
    nbformat.write(_answered("02_self_attention", {"written_key_bias_gradient": ANSWER}), path)
    course = tmp_path / "course"
    report = grade(path, student="ada", keep_course=course)
    assert report.as_json()["score"] == 10.0 and report.as_json()["by_hand"]["pending"] == 2.0
    with gradebook(course) as gb:
        written = gb.find_grade("written_key_bias_gradient", "02_self_attention", "02_self_attention", "ada")
        assert written.needs_manual_grade and written.auto_score is None and written.manual_score is None
        submitted = gb.find_submission("02_self_attention", "ada")
        assert submitted.needs_manual_grade and submitted.score == 10.0 and submitted.max_score == 12.0
        tests = [g for nb in submitted.notebooks for g in nb.grades if g.name != "written_key_bias_gradient"]
        assert len(tests) == 10 and not any(g.needs_manual_grade for g in tests)
    listed = api(course).get_notebook_submissions("02_self_attention", "02_self_attention")
    assert [(n["student"], n["needs_manual_grade"]) for n in listed] == [("ada", True)]   # formgrader's view
    with gradebook(course) as gb:   # as formgrader saves a grader's score
        written = gb.find_grade("written_key_bias_gradient", "02_self_attention", "02_self_attention", "ada")
        written.manual_score, written.needs_manual_grade = 1.5, False
        gb.db.commit()
    with gradebook(course) as gb:
        submitted = gb.find_submission("02_self_attention", "ada")
        assert submitted.score == 11.5 and not submitted.needs_manual_grade


@pytest.mark.parametrize("language", EDITIONS)
def test_book_pages_show_the_question_and_no_model_answer(language):
    """The book's page of a chapter is its learner notebook with outputs (``coursegen.book.stage``):
    checked here on the notebooks as staged, without executing them (the built book's own leak check,
    ``coursegen.book.leaks``, runs with ``make book``)."""
    from coursegen.book import LEAK, with_tests_collapsed
    for name in CHAPTERS:
        page = with_tests_collapsed(_notebook(C.learner_notebook(name, language)))
        assert not LEAK.search(nbformat.writes(page)), name
        for index, cell in _written(page):
            assert cell.source == "YOUR ANSWER HERE" and PROMPT[language].format(points=C.points(cell)) in \
                page.cells[index - 1].source


def test_the_source_format_refuses_a_written_answer_without_its_region_or_points(tmp_path):
    from coursekit.source import SourceError, parse_chapter
    head = "# %% [markdown]\n# # T\n\n"
    bad = {"no_points": "# %% [written written_x]\n# ### BEGIN SOLUTION\n# **Rubric (1 point).**\n# ### END SOLUTION\n",
           "no_region": "# %% [written written_x points=1]\n# **Rubric (1 point).** - 1 point: x\n",
           "no_rubric": "# %% [written written_x points=1]\n# ### BEGIN SOLUTION\n# x\n# ### END SOLUTION\n",
           "text_outside": "# %% [written written_x points=1]\n# Say:\n# ### BEGIN SOLUTION\n# **Rubric (1 point).**\n"
                           "# ### END SOLUTION\n"}
    for what, text in bad.items():
        path = tmp_path / "99_x.py"
        path.write_text(head + text)
        with pytest.raises(SourceError):
            parse_chapter(path)
