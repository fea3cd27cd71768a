"""The class's CSV exports, from the ledger and the gradebook."""
from __future__ import annotations

import csv
from pathlib import Path

from coursekit.nbgrader_course import gradebook

from .ledger import Ledger

# Not grades.csv: that is what `nbgrader export` writes into the course folder.
CLASS_GRADES = "class-grades.csv"
CLASS_EXERCISES = "class-exercises.csv"


def export(folder: Path) -> tuple[Path, Path]:
    """class-grades.csv (a row per student, a column per chapter, total) and class-exercises.csv (long)."""
    folder = Path(folder).resolve()
    entries = Ledger(folder).entries()
    chapters = sorted({e["chapter"] for e in entries.values()})
    students = sorted({e["student"] for e in entries.values()})
    totals: dict[tuple[str, str], float] = {}
    with gradebook(folder) as gb:
        for chapter in chapters:
            try:
                subs = gb.assignment_submissions(chapter)
            except Exception:  # noqa: BLE001 - a chapter the gradebook does not know
                subs = []
            for sub in subs:
                totals[(sub.student.id, chapter)] = sub.score
    grades = folder / CLASS_GRADES
    with open(grades, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *chapters, "total", "notes"])
        for student in students:
            row = [totals.get((student, c), 0.0) for c in chapters]
            notes = "; ".join(f"{c}: {entries[f'{student}/{c}']['reason']}" for c in chapters
                              if entries.get(f"{student}/{c}", {}).get("reason"))
            writer.writerow([student, *[f"{s:g}" for s in row], f"{sum(row):g}", notes])
    exercises = folder / CLASS_EXERCISES
    with open(exercises, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "chapter", "exercise", "score", "max_score", "feedback"])
        for key in sorted(entries):
            e = entries[key]
            if e["status"] != "ok":
                writer.writerow([e["student"], e["chapter"], "", 0, f"{e['max_score']:g}", e["reason"]])
                continue
            for name, ex in e["exercises"].items():
                lost = [line for line in ex["feedback"] if not line.endswith(": passed")]
                writer.writerow([e["student"], e["chapter"], name, f"{ex['score']:g}", f"{ex['max_score']:g}",
                                 " | ".join(lost)])
    return grades, exercises
