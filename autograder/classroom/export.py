"""The class's CSV exports: every score from the gradebook, reasons and feedback lines from the ledger.

One rule for every table and export (the class report and the LMS files too): a chapter a student
never submitted is blank; a submission is its score in the gradebook, 0 when it could not be graded.
A score is nbgrader's: each grade's manual score if a grader set one, else its auto score (plus
extra credit), less the notebook's late penalty.
"""
from __future__ import annotations

import csv
from pathlib import Path

from coursekit.conventions import written_in_table

from .gradebook import exercise_of, grade_scores, late_text, lateness, pending_by_hand, written_of
from .ledger import Ledger

# Not grades.csv: that is what `nbgrader export` writes into the course folder.
CLASS_GRADES = "class-grades.csv"
CLASS_EXERCISES = "class-exercises.csv"


def submission_scores(folder: Path, entries: dict | None = None) -> dict[tuple[str, str], float]:
    """(student, chapter) -> score after the late penalty, for every submission the ledger records."""
    from .class_report import gradebook_scores
    entries = Ledger(folder).entries() if entries is None else entries
    chapters = sorted({e["chapter"] for e in entries.values()})
    book = gradebook_scores(folder, chapters)
    return {(e["student"], e["chapter"]): book.get(e["chapter"], {}).get(e["student"], 0.0)
            for e in entries.values()}


def notes(entry: dict, late: dict | None, pending: float = 0.0) -> list[str]:
    """What a person should know of one submission besides its score: why it could not be graded,
    how late it was and its penalty, written answers still to be graded by hand, cells stopped at
    their time limit."""
    out = [entry["reason"]] if entry.get("reason") else []
    if late and late["seconds_late"] > 0:
        out.append(f"late by {late_text(late['seconds_late'])}, penalty {late['penalty']:g}")
    if pending:
        out.append(f"by hand: {pending:g} points pending")
    out += entry.get("notes", [])
    return out


def export(folder: Path) -> tuple[Path, Path]:
    """class-grades.csv (a row per student, a column per chapter, total, notes) and
    class-exercises.csv (a row per student, chapter and exercise)."""
    folder = Path(folder).resolve()
    entries = Ledger(folder).entries()
    chapters = sorted({e["chapter"] for e in entries.values()})
    students = sorted({e["student"] for e in entries.values()})
    totals = submission_scores(folder, entries)
    late = lateness(folder)
    book = grade_scores(folder)
    grades = folder / CLASS_GRADES
    with open(grades, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *chapters, "total", "notes"])
        for student in students:
            row = [totals.get((student, c)) for c in chapters]
            said = "; ".join(f"{c}: {n}" for c in chapters if f"{student}/{c}" in entries
                             for n in notes(entries[f"{student}/{c}"], late.get((c, student)),
                                            pending_by_hand(book.get((c, student), {}), written_of(c))))
            writer.writerow([student, *["" if s is None else f"{s:g}" for s in row],
                             f"{sum(s for s in row if s is not None):g}", said])
    exercises = folder / CLASS_EXERCISES
    with open(exercises, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "chapter", "exercise", "score", "max_score", "feedback"])
        for key in sorted(entries):
            e = entries[key]
            if e["status"] != "ok":
                writer.writerow([e["student"], e["chapter"], "", 0, f"{e['max_score']:g}", e["reason"]])
                continue
            per: dict[str, list] = {}
            written = {}   # written answers, graded by hand: in the table once a person scored them
            for test, grade in book.get((e["chapter"], e["student"]), {}).items():
                if test in written_of(e["chapter"]):
                    written[test] = written_in_table(grade)
                    continue
                row = per.setdefault(exercise_of(e["chapter"], test), [0.0, 0.0, []])
                row[0] += grade["score"]
                row[1] += grade["max_score"]
                if grade["manual"]:
                    row[2].append(f"{test}: scored by hand")
            for name, ex in e["exercises"].items():
                lost = [line for line in ex["feedback"] if not line.endswith(": passed")]
                score, top, by_hand = per.pop(name, [ex["score"], ex["max_score"], []])
                writer.writerow([e["student"], e["chapter"], name, f"{score:g}", f"{top:g}",
                                 " | ".join(by_hand + lost)])
            for name, (score, top, by_hand) in per.items():  # grade cells of no judged exercise
                writer.writerow([e["student"], e["chapter"], name, f"{score:g}", f"{top:g}", " | ".join(by_hand)])
            for name, (score, top, note) in written.items():
                writer.writerow([e["student"], e["chapter"], name, f"{score:g}", f"{top:g}", note])
    return grades, exercises
