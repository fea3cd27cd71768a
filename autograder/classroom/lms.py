"""Grades a learning-management system imports: Canvas's and Moodle's gradebook CSV.

The student ids of the course folder (``submitted/<student>/``) are the ones collect
found; the LMS knows its students by its own ids. The instructor gives the mapping as
a CSV with a ``student`` column (the course folder's id) and the LMS's columns:

* Canvas: ``Student`` (name), ``ID`` (Canvas user id), ``SIS User ID``, ``SIS Login ID``,
  ``Section``; the easiest source is Canvas's own gradebook export with a ``student``
  column added. Canvas's gradebook import matches a row by ID, SIS User ID or SIS Login
  ID, and an assignment column by the id in its header "Name (id)"; a column without an
  id makes a new assignment. The second row is "Points Possible".
* Moodle: ``Email address`` or ``ID number`` (what Moodle's "Import grades: CSV file"
  maps to a user), optionally ``First name`` and ``Last name``; then one column per
  grade item, which the import screen maps to the course's grade items.

Scores come from the gradebook (the record), after the late penalty (what the student gets;
class-grades.csv and the class report show the same); a chapter a student never submitted is
blank (the LMS leaves it alone), one that could not be graded is 0, as in
class-grades.csv. Canvas's "Points Possible" is the chapter's points as nbgrader counts them, the
written answers' included: a written answer adds to a score once a person has graded it.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .class_report import gradebook_scores
from .gradebook import written_of
from .ledger import Ledger

CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDENTITY = ["First name", "Last name", "ID number", "Email address"]
FILES = {"canvas": "canvas-grades.csv", "moodle": "moodle-grades.csv"}


def read_mapping(path: Path, lms: str) -> dict[str, dict[str, str]]:
    """student -> that student's row of the mapping CSV (checked for the LMS's identity columns)."""
    with open(path, newline="", encoding="utf-8-sig") as f:  # spreadsheets write a BOM
        reader = csv.DictReader(f)
        columns = [c.strip() for c in reader.fieldnames or []]
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
    if "student" not in columns:
        raise ValueError(f"--students {path}: no 'student' column (the course folder's student ids); "
                         f"it has: {', '.join(columns) or 'nothing'}")
    needed = {"canvas": ["ID", "SIS User ID", "SIS Login ID"], "moodle": ["Email address", "ID number"]}[lms]
    if not any(c in columns for c in needed):
        raise ValueError(f"--students {path}: {lms} needs one of the columns {', '.join(needed)}")
    mapping = {}
    for row in rows:
        if not row.get("student"):
            continue
        if row["student"] in mapping:
            raise ValueError(f"--students {path}: student {row['student']} appears twice")
        if not any(row.get(c) for c in needed):
            raise ValueError(f"--students {path}: student {row['student']} has none of {', '.join(needed)}")
        mapping[row["student"]] = row
    return mapping


def _grades(folder: Path):
    entries = Ledger(folder).entries()
    chapters = sorted({e["chapter"] for e in entries.values()})
    scores = gradebook_scores(folder, chapters)
    # the assignment's points as nbgrader counts them: the automatic ones and the written ones by hand
    maximum = {c: max(e["max_score"] for e in entries.values() if e["chapter"] == c) + sum(written_of(c).values())
               for c in chapters}
    graded = {(e["student"], e["chapter"]): scores.get(e["chapter"], {}).get(e["student"], 0.0)
              for e in entries.values()}
    return chapters, maximum, graded, sorted({e["student"] for e in entries.values()})


def export_lms(folder: Path, lms: str, students_csv: Path, out: Path | None = None,
               assignment_ids: dict[str, str] | None = None) -> Path:
    """Write FOLDER/canvas-grades.csv or moodle-grades.csv (or OUT); return its path."""
    folder = Path(folder).resolve()
    mapping = read_mapping(students_csv, lms)
    chapters, maximum, graded, students = _grades(folder)
    missing = [s for s in students if s not in mapping]
    if missing:
        raise ValueError(f"--students {students_csv}: no row for {len(missing)} graded student(s): "
                         f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
    assignment_ids = assignment_ids or {}
    unknown = sorted(set(assignment_ids) - set(chapters))
    if unknown:
        raise ValueError(f"--assignment-id: no graded chapter {', '.join(unknown)} (graded: {', '.join(chapters)})")
    out = Path(out) if out else folder / FILES[lms]
    rows = sorted(mapping.items(), key=lambda kv: (kv[1].get("Student") or kv[1].get("Last name") or "", kv[0]))
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if lms == "canvas":
            heads = [f"{c} ({assignment_ids[c]})" if c in assignment_ids else c for c in chapters]
            writer.writerow([*CANVAS_IDENTITY, *heads])
            writer.writerow(["Points Possible", "", "", "", "", *[f"{maximum[c]:g}" for c in chapters]])
            for student, row in rows:
                writer.writerow([row.get(c, "") for c in CANVAS_IDENTITY]
                                + [_cell(graded, student, c) for c in chapters])
        else:
            writer.writerow([*MOODLE_IDENTITY, *chapters])
            for student, row in rows:
                writer.writerow([row.get(c, "") for c in MOODLE_IDENTITY]
                                + [_cell(graded, student, c) for c in chapters])
    return out


def _cell(graded, student, chapter) -> str:
    score = graded.get((student, chapter))
    return "" if score is None else f"{score:g}"
