"""Combine the results folders of sharded grade-class runs into one class folder."""
from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

from coursekit.nbgrader_course import gradebook

from .. import feedback
from ..chapters import known
from . import class_report
from .export import export
from .folders import class_folder, id_problem, shown
from .ledger import Ledger
from .gradebook import autograde_rows
from .record import AUTOGRADED, ensure_gradebook, store, write_autograded


def merge(target: Path, shards: list[Path], submitted: Path | None = None) -> int:
    """Combine shard results (gradebooks, feedback, ledgers, runs) into TARGET, then its report.

    The report's similarity reads answer cells from SUBMITTED (default TARGET/submitted).
    """
    infos = known()
    target = class_folder(target, "--into")
    target.mkdir(parents=True, exist_ok=True)  # a new class folder, as grade-class makes one
    submitted = Path(submitted) if submitted else target / "submitted"
    count = 0
    for shard in map(Path.resolve, map(Path, shards)):
        entries = Ledger(shard).entries()
        ensure_gradebook(target, [infos[c] for c in sorted({e["chapter"] for e in entries.values()}) if c in infos])
        scores = _gradebook_scores(shard)
        for entry in entries.values():
            refused = _refused(entry, infos)
            if refused:  # a shard's ledger is a file like any other: its names touch paths only once checked
                print(f"merge: {shard.name}: entry skipped: {refused}", file=sys.stderr)
                continue
            key = (entry["student"], entry["chapter"])
            if key in scores:  # the shard's gradebook is the record of its scores
                entry = {**entry, "tests": scores[key]}
                rows = autograde_rows(shard, entry["chapter"], entry["student"])
                if rows["grades"]:
                    entry.update(grades=rows["grades"], comments=rows["comments"])
            graded = shard / AUTOGRADED / entry["student"] / entry["chapter"]
            if graded.is_dir() and graded.resolve() != (target / AUTOGRADED / entry["student"] / entry["chapter"]).resolve():
                executed = graded / f"{entry['chapter']}.ipynb"
                write_autograded(target, entry["student"], entry["chapter"],
                                 executed.read_text(encoding="utf-8") if executed.is_file() else None, executed)
            rel = Path("feedback") / entry["student"] / entry["chapter"] / f"{entry['chapter']}.html"
            if (shard / rel).exists() and (shard / rel).resolve() != (target / rel).resolve():
                feedback.write_page(target / "feedback", rel.relative_to("feedback"), (shard / rel).read_text())
            store(target, entry)
            count += 1
        if shard != target:
            (target / class_report.RUNS).parent.mkdir(parents=True, exist_ok=True)  # a shard may be empty
            with open(target / class_report.RUNS, "a") as f:  # the shards' runs, for the report
                for run in class_report.runs(shard):
                    f.write(json.dumps(run) + "\n")
    export(target)
    class_report.write(target, submitted)
    return count


def _refused(entry: dict, infos) -> str | None:
    """Why a ledger entry's student or chapter cannot name a path in the class folder, or None."""
    student, chapter = entry.get("student"), entry.get("chapter")
    if chapter not in infos:
        return f"chapter {shown(str(chapter))} is not one of the course's"
    if not isinstance(student, str) or student != unicodedata.normalize("NFC", student).strip():
        return f"student {shown(str(student))} is not a student id"
    problem = id_problem(student)
    return f"student {shown(student)} cannot be a student id: {problem}" if problem else None


def _gradebook_scores(folder: Path) -> dict:
    scores = {}
    if not (folder / "gradebook.db").exists():
        return scores
    with gradebook(folder) as gb:
        for assignment in gb.assignments:
            for sub in gb.assignment_submissions(assignment.name):
                tests = {}
                for nb in sub.notebooks:
                    for grade in nb.grades:
                        tests[grade.name] = grade.score
                scores[(sub.student.id, assignment.name)] = tests
    return scores
