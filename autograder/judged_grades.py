"""The judge's verdicts as nbgrader preprocessors: judged once, written once, where nbgrader writes grades.

nbgrader scores a test cell by whether it raised. Our test cells only hand probes to the
kernel; the verdict is the judge's, made in the grader's process from what the kernel
returned. In ``autograde``'s preprocessor list:

* ``JudgeCells`` (right after the execute step) judges every test cell of the run once;
* ``SaveJudgedGrades`` (in place of ``SaveAutoGrades``) writes those scores into the
  gradebook, with the comments and ``needs_manual_grade`` as nbgrader sets them.
"""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor, SaveAutoGrades


class Judgement:
    """One grading run's verdicts (``judge.outcome.TestOutcome``), made after its notebook ran."""

    def __init__(self, session, static: dict[str, str], kernel):
        self.session, self.static, self.kernel = session, static, kernel
        self.outcomes = None

    def make(self):
        from .judge import cells
        self.outcomes = cells.judge(self.session, self.static, stopped=self.kernel.limit_reason)

    def scores(self) -> dict[str, float]:
        if self.outcomes is None:
            raise RuntimeError("the grades were to be saved before the cells were judged")
        return {o.test_id: o.score for o in self.outcomes}


def _bound(cls, judgement: Judgement) -> type:
    # A subclass per run: traitlets would deep-copy a config value.
    return type(cls.__name__, (cls,), {"judgement": judgement})


class JudgeCells(NbGraderPreprocessor):
    """Judge every test cell from the kernel's results (the notebook is not changed)."""

    judgement: Judgement | None = None
    for_run = classmethod(_bound)

    def preprocess(self, nb, resources):
        self.judgement.make()
        return nb, resources


class SaveJudgedGrades(SaveAutoGrades):
    """nbgrader's SaveAutoGrades, with the judge's score for each test cell it judged."""

    judgement: Judgement | None = None
    for_run = classmethod(_bound)

    def _add_score(self, cell, resources):
        scores = self.judgement.scores()
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        if grade_id not in scores:
            return super()._add_score(cell, resources)
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        grade.auto_score = scores[grade_id]
        grade.needs_manual_grade = grade.manual_score is not None  # as nbgrader: a grader's score stands
        self.gradebook.db.commit()
