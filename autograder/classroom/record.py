"""One graded submission into the class folder: its scores in the gradebook, its feedback page, its ledger line."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from coursekit import conventions as C
from coursekit.nbgrader_course import gradebook

from .. import feedback
from ..chapters import ChapterInfo, known
from .gradebook import store_autograde
from .ledger import Ledger
from .release import release

AUTOGRADED, TIMESTAMP = "autograded", "timestamp.txt"


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


def submitted_timestamp(notebook: Path | None) -> str | None:
    """The submission's time from nbgrader's timestamp.txt beside NOTEBOOK (as nbgrader's autograde
    reads it; ``collect`` writes one), as ISO UTC; None without one or when it is not a time."""
    from nbgrader.utils import parse_utc
    stamp = notebook.parent / TIMESTAMP if notebook is not None else None
    if stamp is None or not stamp.is_file() or stamp.is_symlink():
        return None
    try:
        with open(stamp, encoding="utf-8") as f:
            return parse_utc(f.read(200).strip()).isoformat()
    except (OSError, ValueError, OverflowError, UnicodeDecodeError):
        return None


def record(folder: Path, task_student: str, chapter: str, sha: str, status: str, data,
           submitted: Path | None = None, version: str = "") -> dict:
    """Write one submission's result into the gradebook, its feedback page, autograded/ and the ledger.

    submitted: the submitted notebook, whose edition the page of an ungradable one is told in (and
    whose timestamp.txt is the submission's time). version: the grader's and chapter's (``ledger.version``).
    """
    infos = known()
    info = infos.get(chapter)
    entry = {"student": task_student, "chapter": chapter, "sha256": sha, "status": status,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "version": version,
             "timestamp": submitted_timestamp(submitted)}
    autograded = data.get("autograded") if status == "ok" and isinstance(data, dict) else None
    if status == "ok":
        entry.update(score=data["score"], max_score=data["max_score"], reason="",
                     exercises={k: {"score": v["score"], "max_score": v["max_score"],
                                    "feedback": v["feedback"]} for k, v in data["exercises"].items()},
                     tests={o["test_id"]: o["score"] for o in data["outcomes"]}, outcomes=data["outcomes"],
                     repairs=data.get("repairs", []), notes=(autograded or {}).get("notes", []))
        if autograded:
            entry.update(grades=autograded["grades"], comments=autograded["comments"])
    else:
        points = info.tests if info else {}
        entry.update(score=0.0, max_score=sum(points.values()), reason=str(data).splitlines()[0][:300],
                     exercises={}, tests={t: 0.0 for t in points}, outcomes=[], repairs=[], notes=[])
    write_autograded(folder, task_student, chapter, autograded["notebook"] if autograded else None, submitted)
    if status == "ok" and data.get("feedback_page"):
        page = data["feedback_page"]
    else:
        page = feedback.unavailable_page(task_student, chapter, entry["max_score"], entry["reason"],
                                         _language(submitted))
    feedback.write_page(folder / "feedback", Path(task_student) / chapter / f"{chapter}.html", page)
    store(folder, entry)
    return entry


def store(folder: Path, entry: dict):
    """Scores into the nbgrader gradebook as nbgrader's autograde writes them (a grader's manual
    scores and comments kept), then the ledger."""
    if entry["chapter"] in known():
        from nbgrader.utils import parse_utc
        store_autograde(folder, entry["chapter"], entry["student"], entry.get("grades") or entry["tests"],
                        entry.get("comments"), parse_utc(entry.get("timestamp")), missing=entry["status"] != "ok")
    Ledger(folder).append(entry)


def write_autograded(folder: Path, student: str, chapter: str, notebook: str | None,
                     submitted: Path | None) -> None:
    """nbgrader's autograded/<student>/<chapter>/: the executed notebook (none for a file that could
    not be graded, as for a notebook nbgrader finds missing) and the submission's timestamp.txt."""
    target = Path(folder) / AUTOGRADED / student / chapter
    for part in (Path(folder) / AUTOGRADED, Path(folder) / AUTOGRADED / student, target):
        if part.is_symlink():
            raise ValueError(f"{part} is a symbolic link: autograded/ must be the class folder's own")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in ((f"{chapter}.ipynb", notebook), (TIMESTAMP, _stamp_text(submitted))):
        path = target / name
        if text is None:
            if path.is_file() or path.is_symlink():
                path.unlink()
            continue
        partial = target / f".{name}.partial-{os.getpid()}"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)


def _stamp_text(submitted: Path | None) -> str | None:
    stamp = submitted.parent / TIMESTAMP if submitted is not None else None
    if stamp is None or not stamp.is_file() or stamp.is_symlink():
        return None
    with open(stamp, encoding="utf-8", errors="replace") as f:
        return f.read(200)


def _language(notebook: Path | None) -> str:
    """The edition a submitted file says it belongs to (English when it cannot be read)."""
    try:
        return C.language_of(json.loads(notebook.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError, TypeError):
        return C.SOURCE_LANGUAGE
