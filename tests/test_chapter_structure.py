"""Every chapter has the parts of ../shared/CHAPTER_GUIDE.md, read from its source in course/.

The opening (goals, prerequisites, time, an exercise table whose points match the test
cells), at least one schematic diagram (a ``draw_*`` function, the course's convention),
"Check your understanding" with 3 to 5 answered questions, challenges, a summary and
references with real citations. Later edits cannot drop a part unnoticed.
"""
from __future__ import annotations

import re

import pytest

from coursegen import chapters
from coursekit.conventions import exercise_of

CHAPTERS = {chapter.name: chapter for chapter in chapters()}


def markdown(chapter) -> list[str]:
    return [cell.source for cell in chapter.cells if cell.kind == "markdown"]


def section(chapter, title: str) -> str:
    """The markdown from the heading ``## title`` up to the next ``## `` heading."""
    text = "\n\n".join(markdown(chapter))
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{chapter.name}: no '## {title}' section"
    return match.group(1)


def exercise_table(opening: str) -> dict[str, int]:
    """Exercise name -> points, from the opening's table `| exercise | ... | difficulty | points |`."""
    lines = opening.splitlines()
    header = next((i for i, line in enumerate(lines)
                   if re.match(r"\|\s*exercise\s*\|.*\|\s*difficulty\s*\|\s*points\s*\|", line)), None)
    assert header is not None, "no exercise table with difficulty and points"
    rows = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.match(r"`([A-Za-z_]\w*)", cells[0])
        assert name and "★" in cells[-2], f"malformed exercise row: {line}"
        rows[name.group(1)] = int(cells[-1])
    return rows


@pytest.mark.parametrize("name", CHAPTERS)
def test_opening_has_goals_prerequisites_time_and_the_exercise_table(name):
    chapter = CHAPTERS[name]
    opening = markdown(chapter)[0]
    for part in ("**Learning goals.**", "**Prerequisites.**", "**Time.**"):
        assert part in opening, f"{name}: the opening has no {part}"
    points: dict[str, int] = {}
    for cell in chapter.of_kind("test"):
        exercise = exercise_of(cell.name, chapter.exercises)
        points[exercise] = points.get(exercise, 0) + int(cell.points)
    assert exercise_table(opening) == points, f"{name}: the table's points differ from the test cells'"


@pytest.mark.parametrize("name", CHAPTERS)
def test_at_least_one_schematic_diagram(name):
    given = "\n".join(cell.source for cell in CHAPTERS[name].cells if cell.kind in ("code", "export"))
    drawn = re.findall(r"^def (draw_\w+)\(", given, re.M)
    assert drawn, f"{name}: no schematic diagram (a given `def draw_...` function)"
    assert any(re.search(rf"^\s*{f}\(", given, re.M) for f in drawn), f"{name}: {drawn} never called"


@pytest.mark.parametrize("name", CHAPTERS)
def test_questions_with_answers_in_dropdowns(name):
    """Each question is answered in a dropdown, or is a written answer graded by hand (its model
    answer in the instructor notebook only): one or two of them per chapter."""
    questions = section(CHAPTERS[name], "Check your understanding")
    answers = len(re.findall(r"^\s*(:::|```)\{dropdown\} Answer", questions, re.M))
    written = len(CHAPTERS[name].of_kind("written"))
    assert 1 <= written <= 2, f"{name}: {written} written answers (1 or 2 expected)"
    assert 3 <= answers + written <= 5, f"{name}: {answers + written} answered questions (3 to 5 expected)"
    assert answers + written == len(re.findall(r"^\d+\. ", questions, re.M)), f"{name}: a question without an answer"


@pytest.mark.parametrize("name", CHAPTERS)
def test_challenges_summary_and_references(name):
    chapter = CHAPTERS[name]
    assert re.search(r"^\s*(-|\d+\.) ", section(chapter, "Challenges"), re.M), f"{name}: no challenge"
    assert section(chapter, "Summary").strip(), f"{name}: empty summary"
    references = section(chapter, "References")
    entries = re.split(r"^- ", references, flags=re.M)[1:]
    assert len(entries) >= 3, f"{name}: {len(entries)} references"
    cited = [e for e in entries if re.search(r"\((19|20)\d\d\)", e) and re.search(r"<https?://", e)]
    assert len(cited) >= 3, f"{name}: fewer than 3 references with a year and a link"
    headings = re.findall(r"^## (.*)$", "\n\n".join(markdown(chapter)), re.M)
    assert headings[-1].startswith("References"), f"{name}: references are not the last section"


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_mention_of_the_source_material(name):
    text = "\n".join(markdown(CHAPTERS[name]))
    assert not re.search(r"seed (article|text|post)s?", text, re.I), f"{name}: mentions the seed articles"
