"""One graded submission into the class folder: its scores in the gradebook, its feedback page, its ledger line."""
from __future__ import annotations

import json
import time
from pathlib import Path

from coursekit import conventions as C
from coursekit.nbgrader_course import gradebook

from .. import feedback
from ..chapters import ChapterInfo, known
from .gradebook import store_scores
from .ledger import Ledger
from .release import release


def ensure_gradebook(folder: Path, chapters: list[ChapterInfo]):
    """A gradebook at folder/gradebook.db that knows every chapter (generate_assignment)."""
    from nbgrader.api import MissingEntry
    missing = []
    with gradebook(folder) as gb:
        for info in chapters:
            try:
                gb.find_assignment(info.name)
            except MissingEntry:
                missing.append(info)
    if missing:
        release(folder, missing)


def record(folder: Path, task_student: str, chapter: str, sha: str, status: str, data,
           submitted: Path | None = None) -> dict:
    """Write one submission's result into the gradebook, its feedback page, and the ledger.

    submitted: the submitted notebook, whose edition the page of an ungradable one is told in.
    """
    infos = known()
    info = infos.get(chapter)
    entry = {"student": task_student, "chapter": chapter, "sha256": sha, "status": status,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if status == "ok":
        entry.update(score=data["score"], max_score=data["max_score"], reason="",
                     exercises={k: {"score": v["score"], "max_score": v["max_score"],
                                    "feedback": v["feedback"]} for k, v in data["exercises"].items()},
                     tests={t["test_id"]: t["score"] for t in data["tests"]}, repairs=data.get("repairs", []))
    else:
        points = info.tests if info else {}
        entry.update(score=0.0, max_score=sum(points.values()), reason=str(data).splitlines()[0][:300],
                     exercises={}, tests={t: 0.0 for t in points}, repairs=[])
    if status == "ok" and data.get("feedback_page"):
        page = data["feedback_page"]
    else:
        page = feedback.unavailable_page(task_student, chapter, entry["max_score"], entry["reason"],
                                         _language(submitted))
    feedback.write_page(folder / "feedback", Path(task_student) / chapter / f"{chapter}.html", page)
    store(folder, entry)
    return entry


def store(folder: Path, entry: dict):
    """Scores into the nbgrader gradebook (replacing an earlier grading), then the ledger."""
    if entry["chapter"] in known():
        store_scores(folder, entry["chapter"], entry["student"], entry["tests"], replace=True)
    Ledger(folder).append(entry)


def _language(notebook: Path | None) -> str:
    """The edition a submitted file says it belongs to (English when it cannot be read)."""
    try:
        return C.language_of(json.loads(notebook.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError, TypeError):
        return C.SOURCE_LANGUAGE
