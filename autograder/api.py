"""The one Python call another system grades with: ``autograder.grade_notebook``.

The command line (``python -m autograder grade``), the Gradescope and PrairieLearn adapters
(``platforms``) and any other host (a JupyterHub service, an LMS plugin) grade through it: the
same sandbox, limits, JSON and feedback as ``grading.grade``, of which it is the stable face.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from .report import Report
from .sandbox import SandboxUnavailable
from .submission import SubmissionError

__all__ = ["grade_notebook", "Report", "SubmissionError", "SandboxUnavailable"]


def grade_notebook(path: str | Path, chapter: str | None = None, *, student: str = "student",
                   feedback: bool = False, sandboxed: bool = True, private: tuple[Path, ...] = ()) -> Report:
    """Grade one submitted notebook as ``python -m autograder grade PATH`` does; return its ``Report``.

    ``Report.as_json()`` is the spec's JSON (what ``grade --json`` prints), ``as_text()`` the text
    report in the notebook's language, ``outcomes`` one ``TestOutcome`` per test cell (its
    ``test_id``, ``points``, ``score`` and named ``problems``).
    chapter: when neither the file name nor the notebook's metadata tell (a notebook of another
    chapter is refused, as by ``--chapter``). feedback: also render the feedback page
    (``Report.feedback_page``, HTML). sandboxed=False: the audit hook alone contains the kernel
    (``--unsandboxed``); PRIVATE: more folders it keeps the kernel from reading.
    Raises SubmissionError for a file that is not a gradable notebook of the course, and
    SandboxUnavailable when ``sandboxed`` and no OS sandbox can run here (each one line, for the
    learner or the instructor)."""
    from .grading import grade
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's SQLAlchemy chatter is not for the caller
        return grade(Path(path), student=student, feedback=feedback, chapter=chapter,
                     sandboxed=sandboxed, private=tuple(Path(p) for p in private))
