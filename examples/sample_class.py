"""Write a small sample class of Chapter 2 submissions for trying the class workflow.

    .venv/bin/python examples/sample_class.py OUT_FOLDER

OUT_FOLDER/submitted/<student>/02_self_attention/02_self_attention.ipynb is the layout
nbgrader's exchange gives; OUT_FOLDER/lms-download/<student>.ipynb is a flat folder as an
LMS gives; OUT_FOLDER/student-ids.csv maps the students to made-up Canvas and Moodle
ids. The submissions are made from the learner notebook and the reference, so
this script (like the reference) is for instructors only.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursegen import parse_chapter, strip_solution_markers  # noqa: E402

CHAPTER = "02_self_attention"

UNSCALED = '''def scaled_dot_product_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1)  # forgot to divide by sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights
'''
UPPER_TRIANGLE = "def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).triu()\n"
HOSTILE = '''import torch, numpy, sys, os
torch.allclose = lambda *a, **k: True          # make every comparison pass
numpy.allclose = lambda *a, **k: True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(sys.executable))))
try:
    from solutions.ch02_self_attention import *  # try to borrow the reference
except Exception as err:
    print("no luck:", err)
'''


def notebook(answers: dict[str, str], extra: tuple[str, ...] = (), drop: tuple[str, ...] = ()):
    nb = nbformat.read(ROOT / "chapters" / f"{CHAPTER}.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in drop]
    for source in extra:
        nb.cells.append(nbformat.v4.new_code_cell(source))
    return nbformat.writes(nb)


def main(out: Path) -> None:
    chapter = parse_chapter(ROOT / "course" / f"{CHAPTER}.py")
    reference = {c.name: strip_solution_markers(c.source) for c in chapter.of_kind("exercise")}
    nbgrader_layout = {
        "ada": notebook(reference),                                            # all correct
        "ben": notebook({**reference, "scaled_dot_product_attention": UNSCALED,
                         "causal_mask": UPPER_TRIANGLE}),                     # two mistakes
        "cleo": notebook({**reference, "padding_mask": "def padding_mask(lengths, max_len:\n    pass\n"},
                         drop=("test_SelfAttention_mask",)),                  # syntax error, a test deleted
        "dan": notebook({}, extra=(HOSTILE,)),                                # stubs plus tampering
        "gus": notebook(reference, extra=("while True:\n    print('still here')",)),  # endless loop at the end
    }
    lms = {
        "hana": notebook(reference),                                          # correct, flat layout
        "eve": "",                                                            # empty file
        "finn": "{ this is not a notebook",                                   # not JSON
        "ivan": json.dumps({"cells": [], "metadata": {}, "nbformat": 5, "nbformat_minor": 0}),  # newer format
    }
    for student, text in nbgrader_layout.items():
        path = out / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (out / "lms-download").mkdir(parents=True, exist_ok=True)
    for student, text in lms.items():
        (out / "lms-download" / f"{student}.ipynb").write_text(text)
    ids = out / "student-ids.csv"  # the class's ids -> an LMS's (Canvas and Moodle columns), made up
    with open(ids, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Email address",
                         "ID number", "First name", "Last name"])
        for number, student in enumerate(sorted({**nbgrader_layout, **lms}), start=1):
            writer.writerow([student, f"{student.title()} Example", 1000 + number, f"S{number:04d}",
                             f"{student}@example.edu", "Section 1", f"{student}@example.edu", f"S{number:04d}",
                             student.title(), "Example"])
    print(f"sample class written to {out}: {len(nbgrader_layout)} in nbgrader layout, {len(lms)} flat")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "sample-class"))
