"""The class's nbgrader gradebook, written as nbgrader's own autograde leaves it.

A class run grades each submission in a scratch nbgrader course (``grading``); what that
autograde wrote there (each grade cell's ``auto_score``, each answer cell's ``auto_comment``)
is copied into the class's gradebook by ``store_autograde``, with nbgrader's rules:

* the submission is updated, never removed: a grader's ``manual_score``, ``extra_credit``
  and ``manual_comment`` stay, and a grade with a manual score is flagged
  ``needs_manual_grade`` again, as ``SaveAutoGrades`` flags it (so is one with no auto score);
* the submission's time is ``SubmittedAssignment.timestamp`` (the ``timestamp.txt`` beside the
  submitted notebook, as ``nbgrader autograde`` reads it);
* the late penalty is nbgrader's own ``AssignLatePenalties`` step, with the plugin the class
  folder's ``nbgrader_config.py`` names (``late.py``: ``release --late`` writes it).

A submission that could not be graded is scored as nbgrader's autograde scores a missing
notebook: every grade 0, nothing flagged.
"""
from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path

from coursekit.nbgrader_course import db_url, gradebook


def autograde_rows(root: Path, chapter: str, student: str) -> dict:
    """What autograde wrote for STUDENT's CHAPTER in the gradebook at ROOT: {"grades": {grade id:
    auto score}, "comments": {grade id: auto comment}} (read in the worker, from its scratch course)."""
    con = sqlite3.connect(f"file:{Path(root) / 'gradebook.db'}?mode=ro", uri=True)
    try:
        rows = {}
        for table, column, key in (("grade", "auto_score", "grades"), ("comment", "auto_comment", "comments")):
            rows[key] = dict(con.execute(
                f"SELECT bc.name, t.{column} FROM {table} t JOIN base_cell bc ON bc.id = t.cell_id "
                "JOIN submitted_notebook sn ON sn.id = t.notebook_id "
                "JOIN submitted_assignment sa ON sa.id = sn.assignment_id "
                "JOIN assignment a ON a.id = sa.assignment_id WHERE a.name = ? AND sa.student_id = ?",
                (chapter, student)))
        return rows
    finally:
        con.close()


def store_autograde(root: Path, chapter: str, student: str, grades: dict[str, float | None],
                    comments: dict[str, str | None] | None = None,
                    timestamp: datetime.datetime | None = None, missing: bool = False) -> None:
    """One autograded submission into the gradebook at ROOT, as nbgrader's autograde writes it
    (``SaveAutoGrades``, then ``AssignLatePenalties``): see the module's note. MISSING: a file that
    could not be graded, scored as autograde scores a missing notebook (every grade 0, none flagged)."""
    from nbgrader.api import MissingEntry
    with gradebook(root) as gb:
        gb.update_or_create_student(student)
        submission = gb.update_or_create_submission(chapter, student, timestamp=timestamp)
        if missing:
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    grade.auto_score, grade.needs_manual_grade = 0, False
            grades = {}
        for name, score in grades.items():
            try:
                grade = gb.find_grade(name, chapter, chapter, student)
            except MissingEntry:  # a test the released chapter does not have (a newer chapter's)
                continue
            grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        for name, text in (comments or {}).items():
            try:
                gb.find_comment(name, chapter, chapter, student).auto_comment = text
            except MissingEntry:
                continue
        gb.db.commit()
    assign_late_penalty(root, chapter, student)


def store_scores(root: Path, chapter: str, student: str, scores: dict[str, float], replace=False) -> None:
    """Set the auto score of every test cell (nbgrader's rules, ``store_autograde``); ``replace`` is
    kept for callers of the old signature and changes nothing: a submission is never removed."""
    store_autograde(root, chapter, student, scores)


def course_config(root: Path):
    """The class folder's nbgrader configuration (its ``nbgrader_config.py``, as nbgrader loads it)."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader
    config = Config()
    path = Path(root) / "nbgrader_config.py"
    if path.is_file() and not path.is_symlink():
        config.merge(PyFileConfigLoader(path.name, path=str(path.parent)).load_config())
    return config


def assign_late_penalty(root: Path, chapter: str, student: str) -> None:
    """nbgrader's AssignLatePenalties step on the class gradebook (its plugin from the class's
    configuration): the notebook's ``late_submission_penalty`` from the submission's lateness."""
    import sys

    import nbformat
    from nbgrader.preprocessors import AssignLatePenalties
    folder = str(Path(root).resolve())
    added = folder not in sys.path
    if added:  # nbgrader's documented place for a plugin: late.py in the course folder
        sys.path.insert(0, folder)
    try:
        step = AssignLatePenalties(config=course_config(root))
        step.preprocess(nbformat.v4.new_notebook(), {"nbgrader": {
            "notebook": chapter, "assignment": chapter, "student": student, "db_url": db_url(root)}})
    finally:
        if added:
            sys.path.remove(folder)


GRADES_SQL = """
SELECT a.name, sa.student_id, bc.name, g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade,
       gc.max_score
FROM grade g
JOIN base_cell bc ON bc.id = g.cell_id
LEFT JOIN grade_cells gc ON gc.id = g.cell_id
JOIN submitted_notebook sn ON sn.id = g.notebook_id
JOIN submitted_assignment sa ON sa.id = sn.assignment_id
JOIN assignment a ON a.id = sa.assignment_id
"""

SUBMISSIONS_SQL = """
SELECT a.name, sa.student_id, sa.timestamp, a.duedate, sa.extension,
       COALESCE(SUM(sn.late_submission_penalty), 0)
FROM submitted_assignment sa
JOIN assignment a ON a.id = sa.assignment_id
LEFT JOIN submitted_notebook sn ON sn.assignment_id = sa.id
GROUP BY sa.id
"""


def _read(root: Path, sql: str) -> list:
    path = Path(root) / "gradebook.db"
    if not path.exists():
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(con.execute(sql))
    except sqlite3.DatabaseError as err:
        raise RuntimeError(f"the gradebook cannot be opened ({err}); is gradebook.db an nbgrader gradebook?") \
            from None
    finally:
        con.close()


def grade_scores(root: Path) -> dict[tuple[str, str], dict[str, dict]]:
    """(chapter, student) -> {grade id: {"score", "max_score", "manual", "needs_manual_grade"}}, each
    score as nbgrader's ``Grade.score`` (the manual score if a grader set one, else the auto score,
    plus extra credit)."""
    out: dict = {}
    for chapter, student, name, auto, manual, extra, flagged, top in _read(root, GRADES_SQL):
        base = manual if manual is not None else auto
        score = (float(base) + float(extra or 0)) if base is not None else 0.0
        out.setdefault((chapter, student), {})[name] = {
            "score": score, "max_score": float(top or 0), "manual": manual is not None,
            "needs_manual_grade": bool(flagged)}
    return out


def _when(value) -> datetime.datetime | None:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None


def lateness(root: Path) -> dict[tuple[str, str], dict]:
    """(chapter, student) -> {"timestamp", "duedate" (naive UTC), "seconds_late", "penalty"}, as
    nbgrader's SubmittedAssignment computes ``total_seconds_late`` (its due date plus any extension)."""
    out = {}
    for chapter, student, stamp, due, extension, penalty in _read(root, SUBMISSIONS_SQL):
        stamp, due = _when(stamp), _when(due)
        if due is not None and _when(extension):  # SQLAlchemy keeps an Interval as a time after 1970-01-01
            due = due + (_when(extension) - datetime.datetime(1970, 1, 1))
        late = max(0.0, (stamp - due).total_seconds()) if stamp and due else 0.0
        out[(chapter, student)] = {"timestamp": stamp, "duedate": due, "seconds_late": late,
                                   "penalty": float(penalty or 0)}
    return out


def exercise_of(chapter: str, test: str) -> str:
    """The exercise a grade cell belongs to (the cell's own id for one of no exercise)."""
    from coursekit.conventions import exercise_of as owner

    from ..chapters import known
    info = known().get(chapter)
    return (owner(test, info.exercises) if info else None) or test


def written_of(chapter: str) -> dict[str, float]:
    """grade id -> points of each written answer of the chapter (graded by hand)."""
    from ..chapters import known
    info = known().get(chapter)
    return info.written if info else {}


def pending_by_hand(grades: dict, written: dict) -> float:
    """Points of the written answers a person has yet to grade (``grades``: one submission's, as
    ``grade_scores``): answered, so nbgrader flags them for a hand, and not scored by one. An answer
    left as its prompt is nbgrader's 0 and waits for nobody."""
    return sum(g["max_score"] for t, g in grades.items()
               if t in written and g["needs_manual_grade"] and not g["manual"])


def late_text(seconds: float) -> str:
    """How late, for a person: '2 d 3 h', '5 h 12 min', '40 min', '12 s'."""
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{secs} s"
