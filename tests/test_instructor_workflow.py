"""The instructor's workflow around the grader (issue 46, items 2, 3, 5 and 7): nbgrader's formgrader
sees a class run, a grader's manual scores survive a regrade, late work is timed and penalised, and
every table follows one rule. One small class (four students of the sample class) is graded once
and then regraded as an instructor would; the rules without grading are tested alone."""
from __future__ import annotations

import csv
import datetime
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from class_runs import CHAPTER, cli, new_course
from support import ROOT

from coursekit.conventions import with_python_bin_on_path

STUDENTS = {"ada", "ben", "gus", "eve"}  # full marks, partly wrong (late), endless loop at the end, empty
DUE = datetime.datetime(2026, 3, 1, 22, 0)  # UTC
FAST = {**with_python_bin_on_path(), "ATTN_GRADER_CELL_TIMEOUT": "8"}  # gus's loop: 8 s, not 60


def fast(*args) -> subprocess.CompletedProcess:
    """A class command with cells' time limit at 8 s (``class_runs.cli`` sets its own environment)."""
    proc = subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env=FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _grades(course: Path) -> dict[str, dict[str, str]]:
    with open(course / "class-grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _exercises(course: Path) -> dict[tuple[str, str], dict]:
    with open(course / "class-exercises.csv") as f:
        return {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}


def _stamp(course: Path, student: str, when: datetime.datetime):
    (course / "submitted" / student / CHAPTER / "timestamp.txt").write_text(f"{when:%Y-%m-%d %H:%M:%S.%f} UTC\n")


@pytest.fixture(scope="module")
def late_class(released_class, tmp_path_factory):
    """Four students, due 2026-03-01 22:00 UTC with 2 points off per started day: ada on time, ben
    a day and an hour late (two days started: 4 points off his 5), gus and eve with collect's times."""
    tmp = tmp_path_factory.mktemp("workflow")
    course = new_course(tmp, released_class, students=STUDENTS)
    cli("release", "--course", str(course), CHAPTER, "--due", f"{CHAPTER}=2026-03-01T23:00+01:00", "--late", "2/day")
    _stamp(course, "ada", DUE - datetime.timedelta(hours=3))
    _stamp(course, "ben", DUE + datetime.timedelta(days=1, hours=1))
    _stamp(course, "gus", DUE)  # on time to the second; eve keeps collect's time (late: 0 less its penalty)
    proc = fast("grade-class", "--course", str(course), "--workers", "2")
    return tmp, course, proc


@pytest.mark.pipeline
def test_collect_writes_each_submissions_time(late_class):
    _, course, _ = late_class
    from nbgrader.utils import parse_utc
    for student in ("eve",):  # collected from the sample's file: its time, the last resort
        stamp = course / "submitted" / student / CHAPTER / "timestamp.txt"
        notebook = stamp.parent / f"{CHAPTER}.ipynb"
        mtime = datetime.datetime.fromtimestamp(notebook.stat().st_mtime, datetime.timezone.utc).replace(tzinfo=None)
        assert abs((parse_utc(stamp.read_text().strip()) - mtime).total_seconds()) < 1


@pytest.mark.pipeline
def test_formgrader_sees_every_submission_autograded(late_class):
    """What formgrader's API handlers return (NbGraderAPI.get_submissions, get_notebook_submissions) and
    what they read (Gradebook.submission_dicts, notebook_submission_dicts): autograded, scored, nothing
    flagged for a hand; nbgrader's autograded/ layout with each timestamp.txt."""
    _, course, _ = late_class
    from coursekit.nbgrader_course import api, gradebook
    formgrader = api(course)
    submissions = {s["student"]: s for s in formgrader.get_submissions(CHAPTER)}
    raw = {"ada": 10.0, "ben": 5.0, "gus": 10.0, "eve": 0.0}  # before the late penalty, as nbgrader's score
    assert {s: (v["autograded"], v["score"], v["needs_manual_grade"]) for s, v in submissions.items()} == \
        {s: (True, raw[s], False) for s in STUDENTS}
    notebooks = {n["student"]: n for n in formgrader.get_notebook_submissions(CHAPTER, CHAPTER)}
    assert {s: n["score"] for s, n in notebooks.items()} == {s: raw[s] for s in raw if s != "eve"}  # eve's: none
    assert not any(n["needs_manual_grade"] or n["failed_tests"] is None for n in notebooks.values())
    assert formgrader.get_autograded_students(CHAPTER) == STUDENTS
    with gradebook(course) as gb:
        assert {d["student"]: d["score"] for d in gb.submission_dicts(CHAPTER)} == raw
        assert len(gb.notebook_submission_dicts(CHAPTER, CHAPTER)) == len(STUDENTS)
        flagged = [(sub.student.id, g.name) for sub in gb.assignment_submissions(CHAPTER)
                   for nb in sub.notebooks for g in nb.grades if g.needs_manual_grade]
        graded = [g for sub in gb.assignment_submissions(CHAPTER) for nb in sub.notebooks for g in nb.grades]
        # 10 test cells and the written answer, left as its prompt: nbgrader scores it 0, no hand asked
        assert flagged == [] and len(graded) == 4 * 11 and all(g.auto_score is not None for g in graded)
    for student in STUDENTS:
        folder = course / "autograded" / student / CHAPTER
        assert (folder / "timestamp.txt").read_text() == \
            (course / "submitted" / student / CHAPTER / "timestamp.txt").read_text()
    executed = json.loads((course / "autograded" / "ada" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")  # it ran
    assert not (course / "autograded" / "eve" / CHAPTER / f"{CHAPTER}.ipynb").exists()  # as nbgrader: missing
    # nbgrader's own commands read it: generate_feedback makes ada's page from autograded/
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", CHAPTER, "--student", "ada"],
                          cwd=course, capture_output=True, text=True, env=with_python_bin_on_path())
    assert proc.returncode == 0, proc.stderr
    assert (course / "feedback" / "ada" / CHAPTER / f"{CHAPTER}.html").is_file()


@pytest.mark.pipeline
def test_late_work_is_timed_and_penalised(late_class):
    _, course, _ = late_class
    from coursekit.nbgrader_course import gradebook
    with gradebook(course) as gb:
        assert gb.find_assignment(CHAPTER).duedate == DUE
        ben = gb.find_submission(CHAPTER, "ben")
        assert ben.timestamp == DUE + datetime.timedelta(days=1, hours=1) and ben.total_seconds_late == 90000
        assert ben.notebooks[0].late_submission_penalty == 4.0
        assert gb.find_submission(CHAPTER, "ada").notebooks[0].late_submission_penalty is None
    rows = _grades(course)
    assert {s: rows[s][CHAPTER] for s in STUDENTS} == {"ada": "10", "ben": "1", "gus": "10", "eve": "0"}
    assert "late by 1 d 1 h, penalty 4" in rows["ben"]["notes"]
    from bs4 import BeautifulSoup
    soup = BeautifulSoup((course / "class-report.html").read_text(), "html.parser")
    students = {tr.find_all("td")[0].get_text(): [td.get_text() for td in tr.find_all("td")]
                for tr in soup.find("table", class_="students").tbody.find_all("tr")}
    assert students["ben"][1:3] == ["1", f"{CHAPTER}: 1 d 1 h, -4"] and students["ada"][2] == ""
    ids = course / "ids.csv"
    ids.write_text("student,Student,ID\n" + "".join(f"{s},{s.title()},{i}\n" for i, s in enumerate(sorted(STUDENTS))))
    canvas = cli("export", "--course", str(course), "--format", "canvas", "--students", str(ids)).stdout.strip()
    with open(canvas) as f:
        scores = {r["Student"]: r[CHAPTER] for r in csv.DictReader(f) if r["Student"] != "Points Possible"}
    assert scores["Ben"] == "1" and scores["Ada"] == "10"  # after the penalty


@pytest.mark.pipeline
def test_a_cell_stopped_at_its_time_limit_leaves_a_note(late_class):
    _, course, _ = late_class
    entries = [json.loads(line) for line in (course / ".grading" / "ledger.jsonl").read_text().splitlines()]
    gus = next(e for e in entries if e["student"] == "gus")
    assert gus["score"] == 10 and len(gus["notes"]) == 1 and "interrupted at its time limit (8 s)" in gus["notes"][0]
    assert "while True" in gus["notes"][0]
    assert "interrupted at its time limit" in _grades(course)["gus"]["notes"]
    report = (course / "class-report.html").read_text()
    assert "interrupted at its time limit (8 s)" in report and not any(e["notes"] for e in entries if e["student"] != "gus")


@pytest.mark.pipeline
def test_regrades_keep_manual_scores_and_resume(late_class):
    """A grader's manual score and comment (set as formgrader sets them) reach every table and survive
    an interrupted --force run, its resume, and a rerun after the hidden tests' version changed."""
    tmp, base, _ = late_class
    course = new_course(tmp, base, students={"ada", "ben", "eve"})
    from coursekit.nbgrader_course import gradebook
    with gradebook(course) as gb:  # as formgrader's GradeHandler.put and CommentHandler.put
        grade = gb.find_grade("test_causal_mask", CHAPTER, CHAPTER, "ada")
        grade.manual_score, grade.needs_manual_grade = 0.0, False
        gb.find_comment("causal_mask", CHAPTER, CHAPTER, "ada").manual_comment = "see me"
        gb.db.commit()
    cli("export", "--course", str(course))
    assert _grades(course)["ada"][CHAPTER] == "9"
    assert _exercises(course)[("ada", "causal_mask")]["score"] == "0"  # the same gradebook as class-grades.csv
    assert "scored by hand" in _exercises(course)[("ada", "causal_mask")]["feedback"]

    ledger = course / ".grading" / "ledger.jsonl"
    before = len(ledger.read_text().splitlines())
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade-class", "--course", str(course), "--workers", "1",
                             "--force"], cwd=ROOT, env=FAST, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while len(ledger.read_text().splitlines()) < before + 1:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "what this --force run recorded is kept" in err
    done = len(ledger.read_text().splitlines()) - before
    resumed = fast("grade-class", "--course", str(course), "--workers", "2")
    graded, failed, skipped = map(int, re.search(r"(\d+) graded, (\d+) could not be graded, (\d+) already graded",
                                                 resumed.stdout).groups())
    assert (graded + failed, skipped) == (3 - done, done), resumed.stdout  # only what the forced run recorded
    assert not (course / ".grading" / "forced.json").exists()
    with gradebook(course) as gb:
        grade = gb.find_grade("test_causal_mask", CHAPTER, CHAPTER, "ada")
        assert (grade.manual_score, grade.auto_score, grade.needs_manual_grade) == (0.0, 1.0, True)  # nbgrader's rule
        assert gb.find_comment("causal_mask", CHAPTER, CHAPTER, "ada").manual_comment == "see me"
        assert gb.find_submission(CHAPTER, "ben").notebooks[0].late_submission_penalty == 4.0
    assert _grades(course)["ada"][CHAPTER] == "9" and _exercises(course)[("ada", "causal_mask")]["score"] == "0"
    from bs4 import BeautifulSoup
    soup = BeautifulSoup((course / "class-report.html").read_text(), "html.parser")
    runs = [[td.get_text() for td in tr.find_all("td")] for tr in soup.find("table", class_="runs").tbody.find_all("tr")]
    assert [r[-1] for r in runs][-2:] == ["interrupted", "finished"]

    again = cli("grade-class", "--course", str(course), "--workers", "2")
    assert "0 graded, 0 could not be graded, 3 already graded" in again.stdout
    runs = [json.loads(line) for line in (course / ".grading" / "runs.jsonl").read_text().splitlines()]
    from autograder.classroom.class_report import _rate
    assert _rate(runs[-1]) == "-"  # graded nothing: no rate of 0.0
    # the hidden tests changed since ben was graded: his entry's version is another
    lines = ledger.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    last = max(i for i, e in enumerate(entries) if e["student"] == "ben")
    entries[last]["version"] = "an older grader"
    ledger.write_text("".join(json.dumps(e) + "\n" for e in entries))
    stale = cli("grade-class", "--course", str(course), "--workers", "1")
    assert "1 graded, 0 could not be graded, 2 already graded" in stale.stdout


@pytest.mark.pipeline
def test_blank_is_not_submitted_and_zero_is_scored_zero(late_class):
    """A second chapter only ada hands in (its handout, unsolved: 0 points): ben's cell is blank in
    class-grades.csv, the report and the Canvas file; ada's is 0."""
    tmp, base, _ = late_class
    course = new_course(tmp, base, students={"ada", "ben"})
    other = "01_bahdanau_attention"
    cli("release", "--course", str(course), other)
    (course / "submitted" / "ada" / other).mkdir()
    (course / "submitted" / "ada" / other / f"{other}.ipynb").write_bytes(
        (ROOT / "chapters" / f"{other}.ipynb").read_bytes())
    cli("grade-class", "--course", str(course), "--workers", "1", "--chapter", other)
    rows = _grades(course)
    assert (rows["ada"][other], rows["ben"][other]) == ("0", "")
    assert rows["ben"]["total"] == "1"
    from bs4 import BeautifulSoup
    soup = BeautifulSoup((course / "class-report.html").read_text(), "html.parser")
    head = [th.get_text() for th in soup.find("table", class_="students").thead.find_all("th")]
    students = {tr.find_all("td")[0].get_text(): [td.get_text() for td in tr.find_all("td")]
                for tr in soup.find("table", class_="students").tbody.find_all("tr")}
    assert students["ben"][head.index(other)] == "" and students["ada"][head.index(other)] == "0"
    ids = course / "ids.csv"
    ids.write_text("student,Student,ID\nada,Ada,1\nben,Ben,2\ngus,Gus,3\neve,Eve,4\n")
    canvas = cli("export", "--course", str(course), "--format", "canvas", "--students", str(ids)).stdout.strip()
    with open(canvas) as f:
        scores = {r["Student"]: r[other] for r in csv.DictReader(f) if r["Student"] != "Points Possible"}
    assert (scores["Ada"], scores["Ben"]) == ("0", "")


# ------------------------------------------------------------------ the rules alone, no grading
def test_penalty_per_started_period():
    from autograder.classroom.late import PenaltyPerPeriod
    day = PenaltyPerPeriod(points=2.0, period="day")
    assert [day.late_submission_penalty("s", 10, s) for s in (1, 86400, 86401, 90000)] == [2.0, 2.0, 4.0, 4.0]
    assert day.late_submission_penalty("s", 10, 0) is None
    assert PenaltyPerPeriod(points=0.5, period="hour").late_submission_penalty("s", 10, 3 * 3600 + 1) == 2.0


def test_late_policy_is_nbgraders_configuration(tmp_path):
    from autograder.classroom.gradebook import course_config
    from autograder.classroom.late import set_policy
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'x'\n")
    set_policy(tmp_path, "1/hour")
    set_policy(tmp_path, "zero")  # replaces the earlier policy
    config = course_config(tmp_path)
    assert config.LateSubmissionPlugin.penalty_method == "zero" and "plugin_class" not in config.AssignLatePenalties
    assert config.CourseDirectory.course_id == "x"
    with pytest.raises(ValueError, match="takes none, zero"):
        set_policy(tmp_path, "2/week")


def test_due_dates_take_a_zone_and_default_to_utc():
    from autograder.classroom.late import parse_due
    assert parse_due("c=2026-03-01T23:00+01:00") == ("c", DUE)
    assert parse_due("c=2026-03-01T22:00") == ("c", DUE)
    with pytest.raises(ValueError, match="not a time"):
        parse_due("c=tomorrow-ish")


def test_an_interrupted_cell_is_found_in_the_executed_notebook():
    from autograder.classroom.workers import interrupted_cells
    nb = {"cells": [{"cell_type": "code", "source": "x = 1", "outputs": []},
                    {"cell_type": "code", "source": "while True:\n    pass", "outputs": [
                        {"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}]}]}
    notes = interrupted_cells(json.dumps(nb))
    assert len(notes) == 1 and notes[0].startswith("cell 2 (while True:) was interrupted")
