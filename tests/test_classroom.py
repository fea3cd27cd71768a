"""Grading a whole class: parallel, robust, resumable, shardable, with feedback and export."""
from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from class_runs import CHAPTER, EXPECTED, SHARDED_STUDENTS, cli, cli_together, grades, new_course
from support import ROOT

from coursekit.conventions import with_python_bin_on_path

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build


@pytest.fixture(scope="module")
def graded_class(readme_clone, tmp_path_factory):
    """The sample class as the README's commands graded it (one worker per core), copied: the
    tests here grade it again and change it."""
    folder, results = readme_clone
    tmp = tmp_path_factory.mktemp("class")
    course = tmp / "course-0"
    shutil.copytree(folder / "my-class", course, symlinks=True)
    proc = next(p for c, p in results.items() if " grade-class " in c)
    return tmp, course, proc


def test_every_student_gets_the_honest_score(graded_class):
    _, course, proc = graded_class
    assert grades(course) == EXPECTED
    assert "6 graded, 3 could not be graded" in proc.stdout
    assert "/9" in proc.stderr  # the progress bar


def test_reasons_in_csv_and_feedback(graded_class):
    _, course, _ = graded_class
    with open(course / "class-grades.csv") as f:
        notes = {row["student"]: row["notes"] for row in csv.DictReader(f)}
    assert "empty" in notes["eve"] and "not valid JSON" in notes["finn"] and "format 5" in notes["ivan"]
    with open(course / "class-exercises.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["student"] == "ben"]
    lost = {r["exercise"]: r["feedback"] for r in rows if float(r["score"]) < float(r["max_score"])}
    assert set(lost) == {"scaled_dot_product_attention", "causal_mask"}
    assert "not scaled by 1/sqrt(d_k)" in lost["scaled_dot_product_attention"]
    for student in EXPECTED:
        page = (course / "feedback" / student / CHAPTER / f"{CHAPTER}.html").read_text()
        assert "BEGIN HIDDEN" not in page and "attn_probe" not in page
    ben = (course / "feedback" / "ben" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert "not scaled by 1/sqrt(d_k)" in ben
    assert "empty" in (course / "feedback" / "eve" / CHAPTER / f"{CHAPTER}.html").read_text()


def test_class_grades_equal_grading_alone(graded_class):
    from autograder.grading import grade
    _, course, _ = graded_class
    ledger = {}
    for line in (course / ".grading" / "ledger.jsonl").read_text().splitlines():
        entry = json.loads(line)
        ledger[entry["student"]] = entry
    for student in ("ben", "cleo"):
        alone = grade(course / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb", student=student)
        assert ledger[student]["tests"] == {o.test_id: o.score for o in alone.outcomes}


def test_real_nbgrader_export_reads_the_gradebook(graded_class):
    _, course, _ = graded_class
    ours = (course / "class-grades.csv").read_text()
    # as the README says: `nbgrader export` in the course folder, which writes grades.csv there
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=course,
                          capture_output=True, text=True, env=with_python_bin_on_path())
    assert proc.returncode == 0, proc.stderr
    with open(course / "grades.csv") as f:
        # one row per student and released chapter (the README's class has all of them released)
        exported = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f) if r["assignment"] == CHAPTER}
    assert exported == EXPECTED
    assert (course / "class-grades.csv").read_text() == ours  # nothing of ours was overwritten
    cli("export", "--course", str(course))
    assert (course / "grades.csv").exists() and grades(course) == EXPECTED


def test_feedback_reads_like_the_book(graded_class):
    _, course, _ = graded_class
    page = (course / "feedback" / "ben" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert "cdnjs" not in page and "../../_static/mathjax/tex-chtml.js" in page  # MathJax offline
    assert (course / "feedback" / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert "output/chtml/fonts/woff-v2" in str(next((course / "feedback" / "_static" / "mathjax").rglob("*.woff")))
    # The submission is a learner notebook: its notes are already plain Markdown (a quoted block
    # under a bold title, coursekit.myst_plain), and no MyST markup reaches the page.
    assert "<blockquote>" in page and "<strong>Which way round is a boolean mask?</strong>" in page
    assert not any(markup in page for markup in ("{note}", "{admonition}", "{dropdown}", "{glue"))
    assert ">Test cell<" not in page and "<code>test_causal_mask</code></a> (Score: 0.0 / 1.0)" in page


def test_rerun_resumes_and_force_regrades(graded_class):
    """A second run grades nothing, a resubmission alone, ``--force`` everything again (on a copy
    of the class cut to three students: a full forced run would only repeat the first)."""
    tmp, course, _ = graded_class
    again = cli("grade-class", "--course", str(course), "--workers", "2")
    assert "0 graded, 0 could not be graded, 9 already graded" in again.stdout
    ada = course / "submitted" / "ada" / CHAPTER / f"{CHAPTER}.ipynb"
    ben = course / "submitted" / "ben" / CHAPTER / f"{CHAPTER}.ipynb"
    shutil.copyfile(ada, ben)  # ben resubmits a corrected notebook
    changed = cli("grade-class", "--course", str(course), "--workers", "2")
    assert "1 graded, 0 could not be graded, 8 already graded" in changed.stdout
    assert grades(course)["ben"] == 10.0
    kept = {"ben", "cleo", "eve"}  # resubmitted, tampering, empty
    few = new_course(tmp, course, students=kept)
    forced = cli("grade-class", "--course", str(few), "--workers", "2", "--chapter", CHAPTER, "--force")
    assert "2 graded, 1 could not be graded, 0 already graded" in forced.stdout
    assert {s: grades(few)[s] for s in kept} == {**{s: EXPECTED[s] for s in kept}, "ben": 10.0}


def _wait_for_ledger_lines(course: Path, count: int, proc, limit=600):
    ledger = course / ".grading" / "ledger.jsonl"
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= count:
            return
        assert proc.poll() is None, "the class run ended before it could be interrupted"
        time.sleep(0.2)
    raise AssertionError("no submission was recorded in time")


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_interrupted_run_resumes_without_regrading(tmp_path, released_class, how):
    """Killed (its worker then stops the grading under way) or interrupted (it kills its workers),
    a class run resumes where it stopped and leaves no kernel's scratch folder behind."""
    from autograder import scratch
    scratch_before = set(scratch.parent().glob("grade-*"))
    course = new_course(tmp_path, released_class, students={"ada", "ben", "dan"})
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade-class", "--course", str(course),
                             "--workers", "1"], cwd=ROOT, env=with_python_bin_on_path(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a background shell may hand SIGINT down ignored; Ctrl-C is the point here
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_ledger_lines(course, 1, proc)
    proc.send_signal(how)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    done = len((course / ".grading" / "ledger.jsonl").read_text().splitlines())
    assert 1 <= done < 3
    resumed = cli("grade-class", "--course", str(course), "--workers", "2")
    assert f"{done} already graded" in resumed.stdout
    assert grades(course) == {s: EXPECTED[s] for s in ("ada", "ben", "dan")}
    left = [p.name for p in set(scratch.parent().glob("grade-*")) - scratch_before if not scratch.owner_running(p)]
    assert not left, left


def test_shards_merge_into_the_same_grades(sharded_class):
    """Two shards graded at once (as on two machines), then merged."""
    _, course, shards, _ = sharded_class
    sizes = [len(grades(s)) for s in shards]
    assert sum(sizes) == len(SHARDED_STUDENTS) and all(sizes)
    assert grades(course) == {s: EXPECTED[s] for s in SHARDED_STUDENTS}
    for student in SHARDED_STUDENTS:
        assert (course / "feedback" / student / CHAPTER / f"{CHAPTER}.html").exists()


def test_relative_paths_from_another_folder(tmp_path):
    """Every class command with relative paths, run outside the repository."""
    env = {**with_python_bin_on_path(), "PYTHONPATH": str(ROOT)}

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "autograder", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=1200, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc
    subprocess.run([sys.executable, str(ROOT / "examples" / "sample_class.py"), "sample"], cwd=tmp_path,
                   check=True, capture_output=True)
    for student in ("cleo", "dan", "gus"):  # gus loops until a cell's time limit: nothing to do with paths
        shutil.rmtree(tmp_path / "sample" / "submitted" / student)
    run("release", "--course", "my-class", CHAPTER, "--to", "handout")
    assert (tmp_path / "handout" / f"{CHAPTER}.ipynb").exists()
    run("collect", "sample/submitted", "--course", "my-class")  # ada, ben
    cli_together(*(["grade-class", "--course", "my-class", "--shard", f"{index}/2", "--out", f"results/shard-{index}",
                    "--workers", "1"] for index in (1, 2)), cwd=tmp_path, env=env)
    run("merge", "results/shard-1", "results/shard-2", "--into", "my-class")
    run("export", "--course", "my-class")
    assert grades(tmp_path / "my-class") == {"ada": 10.0, "ben": EXPECTED["ben"]}
    assert (tmp_path / "my-class" / "feedback" / "ada" / CHAPTER / f"{CHAPTER}.html").exists()
    assert (tmp_path / "my-class" / "feedback" / "_static" / "mathjax" / "tex-chtml.js").exists()


@pytest.mark.parametrize("args, message", [
    (["release", "--course", "course"], "course/ holds the project's own files"),
    (["release", "--course", "course/my-class"], "course/ holds the project's own files"),
    (["release", "--course", "."], "the repository itself"),
    (["release", "--course", "{tmp}/c", "--to", "chapters"], "chapters/ holds the project's own files"),
    (["grade-class", "--course", "{tmp}/c", "--out", "source"], "source/ holds the project's own files"),
    (["merge", "{tmp}", "--into", "solutions"], "solutions/ holds the project's own files"),
    (["release", "--course", "{tmp}/c", "99_nothing"], "unknown chapter(s): 99_nothing"),
    (["collect", "{tmp}/missing", "--course", "{tmp}/c"], "no such folder"),
    (["collect", "{tmp}", "--course", "{tmp}/c"], "no submissions in"),
    (["collect", "{tmp}", "--course", "{tmp}/c", "--chapter", "02_nothing"], "unknown chapter(s): 02_nothing"),
    (["grade-class", "--course", "{tmp}/c"], "no submitted/ folder"),
    (["grade-class", "--course", "{tmp}/c", "--shard", "3/2"], "--shard 3/2: takes I/N"),
    (["grade-class", "--course", "{tmp}/c", "--shard", "two"], "--shard two: takes I/N"),
    (["merge", "{tmp}/missing", "--into", "{tmp}/c"], "no such folder"),
    (["merge", "{tmp}", "--into", "{tmp}/d"], "not a results folder of grade-class"),
    (["export", "--course", "{tmp}/c"], "nothing graded there yet"),
    (["export", "--course", "{tmp}/broken"], "the gradebook cannot be opened"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_class_command_errors_are_one_line(tmp_path, args, message):
    broken = tmp_path / "broken"
    (broken / ".grading").mkdir(parents=True)
    (broken / ".grading" / "ledger.jsonl").write_text(json.dumps(
        {"student": "a", "chapter": CHAPTER, "sha256": "", "status": "failed", "reason": "x", "max_score": 10,
         "exercises": {}, "tests": {}}) + "\n")
    (broken / "gradebook.db").write_text("not a database")
    proc = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert message in lines[0]
    assert not (ROOT / "course" / "my-class").exists() and not (ROOT / "course" / "source").exists()


def test_grading_twice_gives_the_same_result(tmp_path):
    from autograder.grading import grade
    path = ROOT / "chapters" / f"{CHAPTER}.ipynb"
    first, second = grade(path).as_json(), grade(path).as_json()
    assert first == second


def test_a_worker_boots_a_spare_kernel_only_for_a_task_no_other_spare_covers():
    """Class runs boot no kernel nobody uses: each task says whether its worker boots the next one's."""
    import queue

    from autograder.classroom.collect import Task
    from autograder.classroom.workers import WorkerPool

    def spares_given(students: list[str], finishing: list[int]) -> list[tuple[str, bool]]:
        """Two idle workers take STUDENTS in order, then workers finish one by one (FINISHING) and
        take the next: each task given, and whether its worker boots a spare."""
        pool = WorkerPool.__new__(WorkerPool)  # the dispatch rule alone: no worker processes
        pool.workers = {pid: {"task": None, "spare": False, "tasks": queue.SimpleQueue()} for pid in (1, 2)}
        pending = [Task(name, CHAPTER, Path(f"{name}.ipynb")) for name in students]
        given = []
        for finished in [None, *finishing]:
            if finished:
                pool.workers[finished]["task"] = None
            pool.dispatch(pending)
            for w in pool.workers.values():
                while not w["tasks"].empty():
                    student, _, _, spare = w["tasks"].get()
                    given.append((student, spare))
        assert not pending
        return given

    # ada, ben: taken at once, 2 wait, ada's spare covers one, ben's the other; cleo (ada's worker,
    # its spare): 1 waits, ben's spare covers it; dan: none waits
    assert spares_given(["ada", "ben", "cleo", "dan"], [1, 2]) == [
        ("ada", True), ("ben", True), ("cleo", False), ("dan", False)]
    assert spares_given(["ada", "ben", "cleo"], [1]) == [("ada", True), ("ben", False), ("cleo", False)]
    assert spares_given(["ada", "ben"], []) == [("ada", False), ("ben", False)]  # taken at once: no spare
    assert spares_given(["ada"], []) == [("ada", False)]


def test_the_workers_server_preloads_modules_that_exist():
    """The forkserver skips a module it cannot import without a word: a renamed one would only
    make every worker import it again."""
    import importlib.util

    from autograder.classroom.workers import PRELOADED
    assert all(importlib.util.find_spec(name) is not None for name in PRELOADED), PRELOADED
