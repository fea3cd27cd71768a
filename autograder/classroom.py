"""Grade a whole class: in parallel, robust, resumable, shardable, with feedback and export.

A class lives in an nbgrader course folder (the sqlite gradebook is the record):

    COURSE/
      source/<chapter>/<chapter>.ipynb         instructor notebooks (from `release`)
      release/<chapter>/<chapter>.ipynb        learner notebooks made by generate_assignment
      submitted/<student>/<chapter>/<chapter>.ipynb
      gradebook.db                             nbgrader gradebook (scores per test cell)
      feedback/<student>/<chapter>/<chapter>.html
      class-grades.csv, class-exercises.csv    exports (grades.csv is left to `nbgrader export`)
      class-report.html/.csv                   the class report (``class_report``)
      class-similarity.html/.csv               similar answer cells (``similarity``)
      .grading/ledger.jsonl                    one line per graded submission (resume, reasons)
      .grading/runs.jsonl                      one line per grade-class run (time, throughput)

Worker processes (``workers``) grade one submission each in a private scratch course
and send back the outcome; only this process writes the gradebook, so nothing is shared
between submissions and an interrupted run leaves every committed grade intact.
"""
from __future__ import annotations

import html
import json
import os
import shutil
import sys
import time
from pathlib import Path

from coursekit.nbgrader_course import gradebook

from . import class_report
from .chapters import ChapterInfo, known
from .collect import in_shard, submissions
from .export import export
from .feedback import install_mathjax
from .folders import class_folder
from .gradebook import store_scores
from .ledger import Ledger, file_hash
from .progress import Progress
from .release import release
from .sandbox import bubblewrap
from .workers import WorkerPool


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


def record(folder: Path, task_student: str, chapter: str, sha: str, status: str, data) -> dict:
    """Write one submission's result into the gradebook, its feedback file, and the ledger."""
    infos = known()
    info = infos.get(chapter)
    entry = {"student": task_student, "chapter": chapter, "sha256": sha, "status": status,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if status == "ok":
        entry.update(score=data["score"], max_score=data["max_score"], reason="",
                     exercises={k: {"score": v["score"], "max_score": v["max_score"],
                                    "feedback": v["feedback"]} for k, v in data["exercises"].items()},
                     tests={t["test_id"]: t["score"] for t in data["tests"]}, repairs=data.get("repairs", []))
    else:
        points = info.tests if info else {}
        entry.update(score=0.0, max_score=sum(points.values()), reason=str(data).splitlines()[0][:300],
                     exercises={}, tests={t: 0.0 for t in points}, repairs=[])
    target = folder / "feedback" / task_student / chapter / f"{chapter}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    install_mathjax(folder / "feedback")  # once per folder: the pages' math, offline
    if status == "ok" and data.get("feedback_html") and Path(data["feedback_html"]).exists():
        shutil.move(data["feedback_html"], target)
    else:
        target.write_text(_reason_page(task_student, chapter, entry))
    _store(folder, entry)
    return entry


def _store(folder: Path, entry: dict):
    """Scores into the nbgrader gradebook (replacing an earlier grading), then the ledger."""
    if entry["chapter"] in known():
        store_scores(folder, entry["chapter"], entry["student"], entry["tests"], replace=True)
    Ledger(folder).append(entry)


def _reason_page(student, chapter, entry) -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Feedback</title></head><body>"
            f"<h1>{html.escape(chapter)}: feedback for {html.escape(student)}</h1>"
            f"<p>Score: {entry['score']:g} / {entry['max_score']:g}</p>"
            f"<p>This submission could not be graded: {html.escape(entry['reason'] or 'no reason recorded')}</p>"
            "</body></html>\n")


def grade_class(course: Path, chapters: list[str] | None = None, workers: int | None = None,
                force: bool = False, shard: tuple[int, int] | None = None, out: Path | None = None,
                deadline: float = 900.0, progress=True, sandboxed: bool = True) -> dict:
    """Grade every submission under COURSE/submitted; results go to OUT (default COURSE)."""
    if sandboxed:
        bubblewrap()  # one line now, rather than the same failure for every submission
    started = time.time()
    course = class_folder(course)
    out = class_folder(out, "--out") if out else course
    out.mkdir(parents=True, exist_ok=True)
    infos = known()
    tasks = [t for t in submissions(course, chapters) if in_shard(t, shard)]
    ensure_gradebook(out, [infos[c] for c in sorted({t.chapter for t in tasks}) if c in infos])
    done_before = {} if force else Ledger(out).entries()
    todo = [t for t in tasks if done_before.get(t.key, {}).get("sha256") != file_hash(t.path)]
    summary = {"total": len(tasks), "skipped": len(tasks) - len(todo), "graded": 0, "failed": 0}
    bar = Progress(len(todo)) if progress and todo else None
    if todo:
        # Submitted code must not read the class's gradebook (it holds the instructor cells)
        # or other students' work.
        pool = WorkerPool(workers or os.cpu_count() or 1, out, deadline, private=(course, out),
                          sandboxed=sandboxed)
        pending = list(todo)
        try:
            while pending or pool.busy():
                for worker in pool.idle():
                    if pending:
                        pool.submit(worker, pending.pop(0))
                for task, status, data in pool.poll():
                    entry = record(out, task.student, task.chapter, file_hash(task.path), status, data)
                    summary["graded" if status == "ok" else "failed"] += 1
                    if bar:
                        bar.step()
                    if status != "ok":
                        print(f"\n{task.key}: {entry['reason']}", file=sys.stderr)
        except KeyboardInterrupt:
            pool.close(kill=True)
            print(f"\ninterrupted: {summary['graded'] + summary['failed']} of {len(todo)} recorded; "
                  "run the same command again to resume", file=sys.stderr)
            raise
        pool.close()
        shutil.rmtree(out / ".incoming", ignore_errors=True)
    export(out)
    class_report.record_run(out, started, summary, workers or os.cpu_count() or 1, shard)
    class_report.write(out, course / "submitted")
    return summary


def merge(target: Path, shards: list[Path], submitted: Path | None = None) -> int:
    """Combine shard results (gradebooks, feedback, ledgers, runs) into TARGET, then its report.

    The report's similarity reads answer cells from SUBMITTED (default TARGET/submitted).
    """
    infos = known()
    target = class_folder(target, "--into")
    submitted = Path(submitted) if submitted else target / "submitted"
    count = 0
    for shard in map(Path.resolve, map(Path, shards)):
        entries = Ledger(shard).entries()
        ensure_gradebook(target, [infos[c] for c in sorted({e["chapter"] for e in entries.values()}) if c in infos])
        scores = _gradebook_scores(shard)
        for entry in entries.values():
            key = (entry["student"], entry["chapter"])
            if key in scores:  # the shard's gradebook is the record of its scores
                entry = {**entry, "tests": scores[key]}
            rel = Path("feedback") / entry["student"] / entry["chapter"] / f"{entry['chapter']}.html"
            if (shard / rel).exists() and (shard / rel).resolve() != (target / rel).resolve():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shard / rel, target / rel)
                install_mathjax(target / "feedback")
            _store(target, entry)
            count += 1
        if shard != target:
            (target / class_report.RUNS).parent.mkdir(parents=True, exist_ok=True)  # a shard may be empty
            with open(target / class_report.RUNS, "a") as f:  # the shards' runs, for the report
                for run in class_report.runs(shard):
                    f.write(json.dumps(run) + "\n")
    export(target)
    class_report.write(target, submitted)
    return count


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
