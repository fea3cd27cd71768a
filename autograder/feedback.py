"""nbgrader feedback in which test cells show the judge's verdict, never the hidden test source."""
from __future__ import annotations

import html as html_lib
import re
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearHiddenTests

from coursekit import conventions as C


def render(api, course: Path, chapter, student: str, autograded: Path, outcomes, submitted_text: str) -> Path | None:
    """Write the verdicts into the autograded notebook and run generate_feedback; None if unsafe."""
    by_id = {o.test_id: o for o in outcomes}
    nb = nbformat.read(autograded, as_version=4)
    ClearHiddenTests(enforce_metadata=False).preprocess(nb, {})
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outcome = by_id.get(C.grade_id(cell))
        if outcome is None:
            cell.outputs = []  # the submission's own outputs stay in the submission
            continue
        verdict = "passed" if not outcome.problems else "\n".join(f"- {p}" for p in outcome.problems)
        cell.outputs = [nbformat.v4.new_output(
            "stream", name="stdout" if not outcome.problems else "stderr",
            text=f"{outcome.score:g} / {outcome.points:g} points: {verdict}\n")]
    nbformat.write(nb, autograded)
    result = api.generate_feedback(chapter.name, student, force=True)
    page = course / "feedback" / student / chapter.name / f"{chapter.name}.html"
    if not result["success"] or not page.exists():
        return None
    if reveals_hidden_source(page.read_text(errors="replace"), chapter.hidden_lines, submitted_text):
        page.unlink()  # never hand out hidden test source; the scores stand
        return None
    return page


def reveals_hidden_source(text: str, hidden_lines, submitted_text: str) -> bool:
    """Does rendered feedback contain a hidden-test line the submission did not write itself?"""
    plain = html_lib.unescape(re.sub(r"<[^>]+>", "", text))
    return "BEGIN HIDDEN TESTS" in plain or any(
        line in plain and line not in submitted_text for line in hidden_lines)
