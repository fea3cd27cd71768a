"""Scores into an nbgrader gradebook: one submission's test cells, replacing any earlier grading."""
from __future__ import annotations

from pathlib import Path

from coursekit.nbgrader_course import gradebook


def store_scores(root: Path, chapter: str, student: str, scores: dict[str, float], replace=False) -> None:
    """Set the auto score of every test cell; with ``replace``, start a fresh submission first."""
    from nbgrader.api import MissingEntry
    with gradebook(root) as gb:
        if replace:
            gb.update_or_create_student(student)
            try:
                gb.remove_submission(chapter, student)
            except MissingEntry:
                pass
            gb.add_submission(chapter, student)
        for test_id, score in scores.items():
            grade = gb.find_grade(test_id, chapter, chapter, student)
            grade.auto_score = score
            grade.manual_score = None
        gb.db.commit()
