"""nbgrader end to end on a temporary course: release, grade, feedback, export."""
import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support import ROOT, submission

from coursekit.conventions import with_python_bin_on_path

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build


def nbgrader(course: Path, *args):
    config = course / "nbgrader_config.py"
    if not config.exists():
        config.write_text("c = get_config()\nc.CourseDirectory.course_id = 'attention-from-scratch'\n")
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--log-level=ERROR"], cwd=course,
                          capture_output=True, text=True, env=with_python_bin_on_path(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_release_matches_the_learner_notebook(tmp_path):
    course = tmp_path / "course"
    (course / "source" / "02_self_attention").mkdir(parents=True)
    src = ROOT / "source" / "02_self_attention" / "02_self_attention.ipynb"
    (course / "source" / "02_self_attention" / src.name).write_bytes(src.read_bytes())
    nbgrader(course, "generate_assignment", "02_self_attention")
    from coursegen.learner_view import plain_notebook
    from coursegen.visible_test_errors import with_stop_report
    released = nbformat.read(course / "release" / "02_self_attention" / src.name, as_version=4)
    learner = nbformat.read(ROOT / "chapters" / src.name, as_version=4)
    # nbgrader's release, its MyST made plain for Jupyter (coursegen.learner_view), its setup
    # cell naming a visible test that stops on an error (coursegen.visible_test_errors)
    assert [c.source for c in with_stop_report(plain_notebook(released)).cells] == [c.source for c in learner.cells]


def test_grade_then_feedback_and_export_with_nbgrader(tmp_path):
    from autograder.grading import grade

    path = tmp_path / "02_self_attention.ipynb"
    nb = submission(answers={"causal_mask": "def causal_mask(n):\n    return torch.ones(n, n).bool().triu()\n"})
    nbformat.write(nb, path)
    course = tmp_path / "course"
    report = grade(path, student="ada", keep_course=course)
    assert report.as_json()["score"] == 9.0
    from coursekit.nbgrader_course import gradebook
    with gradebook(course) as gb:  # the judge's scores, written where nbgrader writes its own, once
        graded = gb.find_submission("02_self_attention", "ada")
        assert graded.score == 9.0 and not graded.needs_manual_grade

    nbgrader(course, "generate_feedback", "02_self_attention", "--force")
    html = (course / "feedback" / "ada" / "02_self_attention" / "02_self_attention.html").read_text()
    assert "above the diagonal" in html
    # the chapter's given demo code, not run while grading, is on the page where the notebook had it
    assert "draw_self_attention_diagram" in html and "pad_to" in html
    for secret in ("BEGIN HIDDEN TESTS", "attn_probe", "ones(n, n, dtype=torch.bool).tril()"):
        assert secret not in html

    nbgrader(course, "export", "--to", str(tmp_path / "grades.csv"))
    rows = list(csv.DictReader(open(tmp_path / "grades.csv")))
    # nbgrader's maximum counts the written answer's 2 points (graded by hand; ours leave them out)
    assert [(r["student_id"], float(r["score"]), float(r["max_score"])) for r in rows] == [("ada", 9.0, 12.0)]


def test_a_new_gradebook_is_stamped_with_the_schema_head_alembic_gives(tmp_path):
    """The project reads nbgrader's schema head in process (``nbgrader_course.schema_head``);
    nbgrader's own way, the ``alembic heads`` command, gives the same revision, and a gradebook
    made through the project carries it."""
    import sqlite3

    from nbgrader.dbutil import write_alembic_ini

    from coursekit import nbgrader_course
    ini = tmp_path / "alembic.ini"
    write_alembic_ini(str(ini), f"sqlite:///{tmp_path / 'unused.db'}")
    head = subprocess.run(["alembic", "-c", str(ini), "heads"], capture_output=True, text=True, check=True,
                          env=with_python_bin_on_path(), timeout=120).stdout.split()[0]
    assert head == nbgrader_course.schema_head()
    with nbgrader_course.gradebook(tmp_path):
        pass
    with sqlite3.connect(tmp_path / "gradebook.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
